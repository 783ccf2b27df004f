//! `zipcache serve`: memcached text/meta and RESP2/3 servers over the engine.
//!
//! Layout, in layers (each imports only those above it in this list):
//! * `core`: the protocol-neutral core — engine handle, options, counters, access policy;
//! * `transport`: listeners, threads and admission, TLS, the connection loop with its
//!   buffers and their budgets, and the SSD reads a connection has in flight; it serves
//!   any `transport::Protocol`;
//! * the protocols, each a `Protocol`: `memcache` (text, meta, binary; after memcached's
//!   `proto_text.c` apart from its connection state machine) and `resp` (frames parsed
//!   into typed commands, after mini-redis); `metrics_http` answers Prometheus;
//! * `server` assembles them over one engine; `settings` turns flags into options.

mod core;
mod memcache;
mod metrics_http;
mod resp;
mod server;
#[cfg(test)]
mod serving_tests;
mod settings;
mod transport;

use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use zipcache::ZipCache;

pub use crate::core::access::Credentials;
pub use crate::core::auth::Password;
pub use crate::core::cluster::{Announce, ClusterMode};
pub use crate::core::slot::key_slot;
pub use crate::core::{Runtime, ServerOptions, TlsFiles};
pub use server::{ServerHandle, start};
pub use settings::{Port, ServeArgs, Settings};
pub use transport::Bound;

/// Whole protocol sessions over an in-memory byte stream, for the fuzz targets and the
/// property tests: whatever the bytes, a session must answer or close, never panic.
pub mod fuzzing {
    use std::sync::{Arc, OnceLock};

    use zipcache::{Config, ZipCache};

    use crate::core::ServerOptions;
    use crate::core::auth::Password;
    use crate::memcache::MemcacheSession;
    use crate::resp::RespSession;
    use crate::server::Parts;
    use crate::transport::connection::{Processed, Session, process};
    use crate::transport::output::Output;
    use crate::transport::prefetch::Prefetch;

    const MAX_VALUE: usize = 1 << 20;

    /// One engine (16 MiB of DRAM) for every input of a fuzzing process.
    pub fn engine() -> Arc<ZipCache> {
        static ENGINE: OnceLock<Arc<ZipCache>> = OnceLock::new();
        ENGINE
            .get_or_init(|| {
                let config = Config {
                    dram_capacity: 16 << 20,
                    ..Config::default()
                };
                Arc::new(ZipCache::open(config).expect("a 16 MiB engine"))
            })
            .clone()
    }

    /// Keys the seeds of the fuzz targets and property tests read and write.
    const SEED_KEYS: [&str; 8] = ["k", "k2", "k3", "foo", "a", "b", "aA", "hi"];

    /// A fresh engine with an SSD tier (a 64 MiB in-memory device) that holds most keys:
    /// the seed keys are written first, then 20,000 more (ordered after them) in 256 KiB
    /// of DRAM,
    /// so that GETs of them go in flight and the requests pipelined behind are read ahead
    /// (`prefetch`). Writers wait for the flusher rather than drop objects: two such
    /// engines given the same requests answer alike.
    pub fn new_hybrid_engine() -> Arc<ZipCache> {
        let config = Config {
            dram_capacity: 256 << 10,
            flush_wait_ms: 60_000,
            ..Config::default()
        };
        let device = Arc::new(zipcache_device::MemDevice::new(1 << 14));
        let cache = ZipCache::open_on(config, Some(device)).expect("a hybrid engine");
        for key in SEED_KEYS {
            cache.put(key.as_bytes(), b"12", None).expect("a seed key");
        }
        for i in 0..20_000u64 {
            let filler = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let value = format!("{filler:016x}{:016x}", filler.rotate_left(29));
            cache
                .put(format!("~filler:{i:08}").as_bytes(), value.as_bytes(), None)
                .expect("a filler key");
        }
        cache.settle().expect("settled");
        Arc::new(cache)
    }

    /// One [`new_hybrid_engine`] for every input of a fuzzing process.
    pub fn hybrid_engine() -> Arc<ZipCache> {
        static ENGINE: OnceLock<Arc<ZipCache>> = OnceLock::new();
        ENGINE.get_or_init(new_hybrid_engine).clone()
    }

    /// The server options of the sessions here: 1 MiB values, `KEYS` limited to 1000.
    pub fn options() -> ServerOptions {
        ServerOptions {
            max_value_size: MAX_VALUE,
            keys_limit: 1000,
            ..ServerOptions::default()
        }
    }

    /// Feeds `input` to a memcached session `chunk` bytes at a time, as reads would
    /// arrive, and returns everything it replied.
    pub fn memcached_session(cache: Arc<ZipCache>, input: &[u8], chunk: usize) -> Vec<u8> {
        memcached_session_with(cache, &options(), input, chunk)
    }

    /// As `memcached_session`, with server options (an auth file, `flush_all` disabled).
    pub fn memcached_session_with(
        cache: Arc<ZipCache>,
        options: &ServerOptions,
        input: &[u8],
        chunk: usize,
    ) -> Vec<u8> {
        let memcached = Parts::detached(cache, options).memcached;
        drive(MemcacheSession::new(memcached), input, chunk)
    }

    /// As `memcached_session`, for RESP; with `requirepass`, clients must AUTH first.
    pub fn resp_session(
        cache: Arc<ZipCache>,
        input: &[u8],
        chunk: usize,
        requirepass: Option<&str>,
    ) -> Vec<u8> {
        let options = ServerOptions {
            requirepass: requirepass.and_then(Password::new),
            ..options()
        };
        resp_session_with(cache, &options, input, chunk)
    }

    /// As `resp_session`, with server options (`flush_all` disabled, a password).
    pub fn resp_session_with(
        cache: Arc<ZipCache>,
        options: &ServerOptions,
        input: &[u8],
        chunk: usize,
    ) -> Vec<u8> {
        drive(
            RespSession::new(Parts::detached(cache, options).resp, None),
            input,
            chunk,
        )
    }

    /// The one user of the authenticating framing checks.
    const USER: &[u8] = b"foo:bar";

    /// Frames `input` request by request as a memcached connection would — plain, and as
    /// an unauthenticated one whose only request is an authentication block — and checks
    /// what framing must hold whatever the bytes (see `check_span`). Panics on a
    /// violation: for the fuzz targets and the property tests.
    pub fn check_memcached_framing(input: &[u8]) {
        use crate::memcache::auth::{Attempt, attempt};
        use crate::memcache::parse::{Parsed, parse};

        /// A request: its span, the data bytes skipped after it, and the request.
        fn framed(bytes: &[u8]) -> Option<(usize, usize, Parsed<'_>)> {
            match parse(bytes, MAX_VALUE) {
                parsed @ Parsed::Request { len, .. } => Some((len, 0, parsed)),
                parsed @ Parsed::Swallow { len, swallow, .. } => Some((len, swallow, parsed)),
                Parsed::Incomplete | Parsed::Close => None,
            }
        }
        let mut rest = input;
        while let Some((len, swallow, _)) = framed(rest) {
            check_span(rest, len, framed);
            rest = rest.get(len.saturating_add(swallow)..).unwrap_or_default();
        }

        let credentials = crate::core::access::Credentials::parse(USER).expect("credentials");
        let access = crate::core::access::AccessPolicy::new(None, Some(Arc::new(credentials)));
        let answered = |bytes: &[u8]| match attempt(bytes, &access) {
            answer @ Attempt::Answered { len, .. } => Some((len, answer)),
            Attempt::NeedMore | Attempt::Close => None,
        };
        let mut rest = input;
        while let Some((len, _)) = answered(rest) {
            check_span(rest, len, answered);
            rest = &rest[len..];
        }
    }

    /// Frames `input` request by request as a binary memcached connection would, with
    /// `check_span`'s checks; a refused request's skipped value is stepped over as the
    /// session skips it. Panics on a violation.
    pub fn check_memcached_binary_framing(input: &[u8]) {
        use crate::memcache::binary::parse::{Framed, Header, Parsed, parse};

        /// A request: its span, the bytes skipped after it, and the request.
        fn framed(bytes: &[u8]) -> Option<(usize, usize, Parsed<'_>)> {
            let Framed::Header(header) = Header::parse(bytes) else {
                return None;
            };
            match parse(&header, bytes, MAX_VALUE) {
                parsed @ (Parsed::Request { len, swallow, .. }
                | Parsed::Refused { len, swallow, .. }) => Some((len, swallow, parsed)),
                Parsed::Incomplete => None,
            }
        }
        let mut rest = input;
        while let Some((len, swallow, parsed)) = framed(rest) {
            check_span(rest, len, framed);
            if matches!(parsed, Parsed::Refused { close: true, .. }) {
                return;
            }
            rest = rest.get(len.saturating_add(swallow)..).unwrap_or_default();
        }
    }

    /// A binary memcached request packet.
    pub fn memcached_binary_request(
        opcode: u8,
        extras: &[u8],
        key: &[u8],
        value: &[u8],
        opaque: u32,
        cas: u64,
    ) -> Vec<u8> {
        crate::memcache::binary::parse::request(opcode, extras, key, value, opaque, cas)
    }

    /// Frames `input` request by request as a RESP connection would (see `check_span`),
    /// and types each request as a client `authenticated` or not would have it typed on a
    /// server with `flush_all` enabled or not: any outcome but a panic. Panics on a
    /// violation.
    pub fn check_resp_framing(
        cache: &Arc<ZipCache>,
        input: &[u8],
        authenticated: bool,
        flush_all_enabled: bool,
    ) {
        use std::borrow::Cow;

        use crate::core::keyspace::Keyspace;
        use crate::resp::cmd::{Command, refused};

        let cache = &Keyspace::new(cache.clone(), Arc::default());
        let emulated = crate::core::cluster::Cluster::new(
            &crate::core::ServerOptions {
                cluster_mode: crate::core::cluster::ClusterMode::Emulated,
                ..Default::default()
            },
            "127.0.0.1:6379".parse().unwrap(),
            cache.engine(),
        );
        use crate::resp::parse::{Parsed, parse};

        // A request: its span and its arguments.
        let framed = |bytes| -> Option<(usize, Vec<Cow<'_, [u8]>>)> {
            match parse(bytes, authenticated, usize::MAX) {
                Parsed::Command { args, len } => Some((len, args)),
                Parsed::Incomplete | Parsed::Error(_) | Parsed::TooLarge => None,
            }
        };
        let mut rest = input;
        while let Some((len, args)) = framed(rest) {
            check_span(rest, len, framed);
            let argv: Vec<&[u8]> = args.iter().map(|a| a.as_ref()).collect();
            if !argv.is_empty() {
                for cluster in [None, Some(&emulated)] {
                    let refused = refused(flush_all_enabled);
                    let _ = Command::parse(&argv, authenticated, refused, cluster, cache);
                }
            }
            rest = &rest[len..];
        }
    }

    /// What framing must hold for a request `frame(input)` says spans `len` bytes: at
    /// least one byte, no more than there are; its own bytes frame to the same request
    /// (nothing beyond the span was read); and no shorter input cut at a line or block
    /// boundary frames to a request (a request is never answered before it is whole).
    fn check_span<'a, T: PartialEq + std::fmt::Debug>(
        input: &'a [u8],
        len: usize,
        frame: impl Fn(&'a [u8]) -> Option<T>,
    ) {
        assert!(
            (1..=input.len()).contains(&len),
            "a request spans {len} of {} bytes",
            input.len()
        );
        assert_eq!(
            frame(&input[..len]),
            frame(input),
            "a request read beyond its {len} bytes"
        );
        let boundaries = input[..len]
            .iter()
            .enumerate()
            .filter(|(_, b)| matches!(b, b'\r' | b'\n'))
            .flat_map(|(at, _)| [at, at + 1]);
        for cut in boundaries
            .chain([0, len / 2, len - 1])
            .filter(|&cut| cut < len)
        {
            assert_eq!(
                frame(&input[..cut]),
                None,
                "the first {cut} bytes of a {len}-byte request framed a request"
            );
        }
    }

    /// Every RESP command name, for generating requests.
    pub fn resp_command_names() -> Vec<&'static str> {
        crate::resp::command_names().collect()
    }

    /// `args` as one RESP multi-bulk request.
    pub fn resp_request(args: &[&[u8]]) -> Vec<u8> {
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg);
            request.extend_from_slice(b"\r\n");
        }
        request
    }

    fn drive<S: Session>(mut session: S, input: &[u8], chunk: usize) -> Vec<u8> {
        // Delayed `flush_all` spawns a timer task, so sessions run inside a runtime.
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        else {
            return Vec::new();
        };
        runtime.block_on(async move {
            let mut buffered = Vec::new();
            let (mut written, mut out) = (Vec::new(), Output::default());
            let mut reads = Prefetch::default();
            'pieces: for piece in input.chunks(chunk.max(1)) {
                buffered.extend_from_slice(piece);
                loop {
                    let (consumed, processed) =
                        process(&mut session, &buffered, &mut out, &mut reads);
                    buffered.drain(..consumed);
                    // Written as the connection writes it, so the next step has room.
                    written.extend(out.parts().concat());
                    out.clear();
                    match processed {
                        Processed::Flush => continue,
                        Processed::Await => reads.settle().await,
                        Processed::NeedMore => break,
                        Processed::Close | Processed::HangUp => break 'pieces,
                    }
                }
            }
            written
        })
    }
}

/// Runs `zipcache serve`; the error is the message printed to the operator.
pub fn run(args: ServeArgs) -> Result<(), String> {
    let settings = Settings::resolve(args)?;
    let config = settings.engine_config()?;
    println!("{}", settings.describe(&config));
    if let Some(warning) = settings.exposure_warning() {
        eprintln!("{warning}");
    }
    std::fs::create_dir_all(&settings.data_dir)
        .map_err(|e| format!("cannot create {}: {e}", settings.data_dir.display()))?;
    // Every connection is a descriptor; ask for enough, as memcached does.
    let wanted = settings.max_connections as u64 + 256;
    match rlimit::increase_nofile_limit(wanted) {
        Ok(got) if got < wanted => {
            eprintln!(
                "zipcache: warning: open-file limit is {got}, below max-connections + 256 = {wanted}"
            )
        }
        _ => {}
    }

    let signals = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    // Handlers are installed before serving so a signal never hits the default action.
    let (mut terminate, mut interrupt, mut hangup) = {
        let _guard = signals.enter();
        let term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
        let hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
        (term, int, hup)
    };

    // Ports, TLS and auth files first: a start that fails on them leaves the flash tier
    // as the last clean stop left it, since no engine was opened.
    let bound = Bound::new(settings.server_options(config.max_value_size))
        .map_err(|e| format!("cannot serve: {e}"))?;
    let cache =
        Arc::new(ZipCache::open(config).map_err(|e| format!("cannot open the cache: {e}"))?);
    if let Some(report) = core::stats::recovery_report(&cache.stats()) {
        println!("{report}");
    }
    let handle = match server::serve(bound, cache.clone()) {
        // The server holds the engine now; shutdown hands it back to be closed.
        Ok(handle) => {
            drop(cache);
            handle
        }
        Err(e) => {
            let closed = close(cache)
                .err()
                .map_or(String::new(), |e| format!("; {e}"));
            return Err(format!("cannot serve: {e}{closed}"));
        }
    };
    println!("{}", handle.listening());

    let requested = handle.shutdown_requests();
    let cause = signals.block_on(async {
        loop {
            tokio::select! {
                _ = terminate.recv() => break "SIGTERM",
                _ = interrupt.recv() => break "SIGINT",
                _ = requested.notified() => break "a client's shutdown command",
                // As memcached: the auth file and the TLS certificates are read again.
                _ = hangup.recv() => {
                    let said = handle.reload_files();
                    if said.is_empty() {
                        println!("SIGHUP: nothing to reload (no --auth-file, no TLS)");
                    }
                    for said in said {
                        println!("SIGHUP: {said}");
                    }
                }
            }
        }
    });
    println!(
        "shutting down on {cause}: finishing in-flight requests (signal again to exit at once)"
    );
    let (done, finished) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = done.send(close(handle.shutdown()));
    });
    signals.block_on(async {
        tokio::select! {
            _ = terminate.recv() => std::process::exit(1),
            _ = interrupt.recv() => std::process::exit(1),
            closed = finished => closed.unwrap_or_else(|_| Err("shutdown thread failed".into())),
        }
    })?;
    println!("stopped cleanly");
    Ok(())
}

/// How long a clean close waits for the last holders of the engine to let it go.
const HOLDERS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Closes the engine cleanly (its warm state kept for the next start), once nothing else
/// holds it: the server's holders end with its shutdown; a thread still finishing an
/// engine call gets [`HOLDERS_WAIT`] to return.
fn close(mut cache: Arc<ZipCache>) -> Result<(), String> {
    let waiting = std::time::Instant::now();
    loop {
        match Arc::try_unwrap(cache) {
            Ok(cache) => return cache.close().map_err(|e| format!("closing the cache: {e}")),
            Err(held) if waiting.elapsed() < HOLDERS_WAIT => {
                cache = held;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(_) => {
                return Err(format!(
                    "the cache is still in use {HOLDERS_WAIT:?} after the stop; not closed cleanly"
                ));
            }
        }
    }
}
