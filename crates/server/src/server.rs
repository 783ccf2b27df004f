//! Listeners, threads and connection admission.
//!
//! `Runtime::PerCore` (the default): one OS thread per core, each with its own tokio
//! `current_thread` runtime; a request is parsed, executed and answered on the thread that
//! serves its connection — no cross-thread wake-ups, which cost 35–90 µs on the VMs we run
//! on. One listener per port (thread 0 accepts, memcached's dispatcher) hands each new
//! connection to the thread serving the fewest: a handful of client connections hashed
//! over `SO_REUSEPORT` listeners was often served 3:1 by two threads, and a reuse-port
//! group lets a second server join the port unnoticed. `Runtime::Shared` (one
//! work-stealing runtime) exists to measure the choice against (docs/SERVER.md).

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::AbortHandle;
use zipcache::ZipCache;

use crate::auth::Password;
use crate::buffer_budget::BufferBudget;
use crate::connection::{self, Transport};
use crate::memcache::annotations::Annotations;
use crate::memcache::conns::Connections;
use crate::memcache::prefix_stats::PrefixStats;
use crate::memcache::{Crawler, Credentials, MemcacheSession};
use crate::metrics_http;
use crate::resp::RespSession;
use crate::stats::Counters;
use crate::tls::{Tls, TlsFiles};
use crate::watch::Logger;

/// Connections the kernel queues per listener before they are accepted.
pub const LISTEN_BACKLOG: i32 = 1024;
/// How long shutdown waits for open connections to finish their current requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a TLS client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new connection may take to send its first complete request.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The least `max_clients_memory` defaults to, and the share of the DRAM budget it
/// defaults to above that.
const MIN_CLIENTS_MEMORY: usize = 64 << 20;
const CLIENTS_MEMORY_DRAM_SHARE: u64 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    /// A current_thread runtime per thread, each serving the connections handed to it.
    PerCore,
    /// One multi-threaded work-stealing runtime sharing one listener per port.
    Shared,
}

/// What `start` serves and how.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub listen: IpAddr,
    /// `None` disables that protocol; port 0 picks a free port.
    pub memcached_port: Option<u16>,
    pub resp_port: Option<u16>,
    pub metrics_port: Option<u16>,
    pub threads: usize,
    pub max_connections: usize,
    /// The engine's value size limit (memcached rejects larger values before reading them).
    pub max_value_size: usize,
    pub runtime: Runtime,
    /// RESP clients must `AUTH` with this first.
    pub requirepass: Option<Password>,
    /// Both protocol ports speak TLS (the metrics port stays plain HTTP).
    pub tls: Option<TlsFiles>,
    /// Most keys one `KEYS` examines.
    pub keys_limit: usize,
    /// False answers memcached's `flush_all` with `CLIENT_ERROR flush_all not allowed`
    /// (memcached `-F`) and RESP `FLUSHALL`/`FLUSHDB` with Redis's ACL `-NOPERM` error.
    pub flush_all_enabled: bool,
    /// Users a memcached connection must authenticate as before anything else
    /// (memcached `-Y`); `None` = open.
    pub memcached_auth: Option<Arc<Credentials>>,
    /// memcached's LRU crawler starts enabled (`lru_crawler enable|disable` switch it).
    pub lru_crawler: bool,
    /// Connections that send nothing for this long are closed and counted in
    /// `idle_kicks` (memcached `-o idle_timeout`); `None` = never.
    pub idle_timeout: Option<Duration>,
    /// memcached's `shutdown` command stops the server (memcached `-A`); otherwise it
    /// answers `SERVER_ERROR: shutdown not enabled`.
    pub shutdown_enabled: bool,
    /// Most bytes one connection may buffer of one request; `None` = the value size
    /// limit plus memcached's longest request line.
    pub max_request_size: Option<usize>,
    /// Most bytes all connections' buffers may hold together before the biggest is
    /// closed; `None` = an eighth of the DRAM budget, at least 64 MiB.
    pub max_clients_memory: Option<usize>,
    /// Connections that have not completed a request this long after they opened are
    /// closed and counted in `first_request_kicks`; `None` = never.
    pub first_request_timeout: Option<Duration>,
}

impl ServerOptions {
    pub fn max_request_size(&self) -> usize {
        self.max_request_size
            .unwrap_or(self.max_value_size + crate::memcache::parse::RETRIEVAL_LINE_MAX)
    }

    /// Redis leaves `maxmemory-clients` off; an eighth of the DRAM budget bounds what
    /// connections can add to the cache's own memory, and the floor lets a small cache
    /// still hold about 50 requests of the largest size at once.
    pub fn max_clients_memory(&self, dram_capacity: u64) -> usize {
        self.max_clients_memory.unwrap_or_else(|| {
            let share = dram_capacity / CLIENTS_MEMORY_DRAM_SHARE;
            usize::try_from(share)
                .unwrap_or(usize::MAX)
                .max(MIN_CLIENTS_MEMORY)
        })
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            listen: IpAddr::from([127, 0, 0, 1]),
            memcached_port: Some(0),
            resp_port: Some(0),
            metrics_port: None,
            threads: 1,
            max_connections: 4096,
            max_value_size: zipcache::Config::default().max_value_size,
            runtime: Runtime::PerCore,
            requirepass: None,
            tls: None,
            keys_limit: 100_000,
            flush_all_enabled: true,
            memcached_auth: None,
            lru_crawler: true,
            idle_timeout: None,
            shutdown_enabled: false,
            max_request_size: None,
            max_clients_memory: None,
            first_request_timeout: Some(FIRST_REQUEST_TIMEOUT),
        }
    }
}

/// Facts about the running server that `stats settings`, INFO and CONFIG GET report.
#[derive(Clone, Debug)]
pub struct ServerInfo {
    pub listen: IpAddr,
    pub memcached_port: u16,
    pub resp_port: u16,
    pub threads: usize,
    pub max_connections: usize,
}

impl ServerInfo {
    /// A session outside a listening server (fuzzing, property tests).
    pub fn detached() -> ServerInfo {
        ServerInfo {
            listen: IpAddr::from([127, 0, 0, 1]),
            memcached_port: 0,
            resp_port: 0,
            threads: 1,
            max_connections: 1,
        }
    }
}

/// State every connection of every thread shares.
pub struct Shared {
    pub cache: Arc<ZipCache>,
    pub counters: Counters,
    pub info: ServerInfo,
    pub max_value: usize,
    pub requirepass: Option<Password>,
    pub keys_limit: usize,
    pub started: Instant,
    pub flush_all_enabled: bool,
    /// The users memcached connections authenticate against ([`Shared::memcached_users`]);
    /// replaced when the auth file is reloaded.
    pub memcached_auth: Option<ArcSwap<Credentials>>,
    /// Both protocol ports speak TLS; set by `start`.
    pub tls: Option<Tls>,
    pub annotations: Annotations,
    pub crawler: Arc<Crawler>,
    /// memcached's log streams (`watch`).
    pub logger: Arc<Logger>,
    /// `stats detail`.
    pub prefix_stats: PrefixStats,
    /// Open memcached connections (`stats conns`).
    pub conns: Connections,
    pub idle_timeout: Option<Duration>,
    pub shutdown_enabled: bool,
    /// A client's `shutdown`: whoever runs the server (`run`) waits on it as on a signal.
    pub shutdown_requested: Arc<Notify>,
    /// True until shutdown begins (memcached's `accepting_conns`).
    pub accepting: AtomicBool,
    pub max_request_size: usize,
    /// What every connection's buffers hold, against `max_clients_memory`.
    pub buffers: Arc<BufferBudget>,
    pub first_request_timeout: Option<Duration>,
    /// memcached's `flush_all <delay>` waiting to fire: one, replaced by the next.
    pub pending_flush: Mutex<Option<AbortHandle>>,
}

impl Shared {
    pub fn new(cache: Arc<ZipCache>, info: ServerInfo, options: &ServerOptions) -> Shared {
        let cache_dram_capacity = cache.config().dram_capacity;
        Shared {
            cache,
            counters: Counters::default(),
            info,
            max_value: options.max_value_size,
            requirepass: options.requirepass.clone(),
            keys_limit: options.keys_limit,
            started: Instant::now(),
            flush_all_enabled: options.flush_all_enabled,
            memcached_auth: options.memcached_auth.clone().map(ArcSwap::new),
            tls: None,
            annotations: Annotations::default(),
            crawler: Crawler::new(options.lru_crawler),
            logger: Arc::default(),
            prefix_stats: PrefixStats::default(),
            conns: Connections::default(),
            idle_timeout: options.idle_timeout,
            shutdown_enabled: options.shutdown_enabled,
            shutdown_requested: Arc::new(Notify::new()),
            accepting: AtomicBool::new(true),
            max_request_size: options.max_request_size(),
            buffers: BufferBudget::new(options.max_clients_memory(cache_dram_capacity)),
            first_request_timeout: options.first_request_timeout,
            pending_flush: Mutex::new(None),
        }
    }

    /// The users a memcached connection authenticates against now (`None`: open).
    pub fn memcached_users(&self) -> Option<Arc<Credentials>> {
        self.memcached_auth.as_ref().map(ArcSwap::load_full)
    }

    /// memcached's `refresh_certs`: the TLS files read again (`Ok(false)`: no TLS). On
    /// an error the certificates loaded before stay in use.
    pub fn refresh_certs(&self) -> Result<bool, String> {
        match &self.tls {
            None => Ok(false),
            Some(tls) => tls.reload().map(|()| true),
        }
    }

    /// SIGHUP, as memcached: the auth file and the TLS files read again. One line per
    /// file set, saying how it went; one that fails to load leaves what was loaded before.
    pub fn reload_files(&self) -> Vec<String> {
        let mut said = Vec::new();
        if let Some(auth) = &self.memcached_auth
            && let Some(reloaded) = auth.load().reloaded()
        {
            said.push(match reloaded {
                Ok(users) => {
                    auth.store(Arc::new(users));
                    "auth file reloaded".to_string()
                }
                Err(e) => format!("auth file not reloaded, the old users stay: {e}"),
            });
        }
        match self.refresh_certs() {
            Ok(false) => {}
            Ok(true) => said.push("TLS certificates reloaded".into()),
            Err(e) => said.push(format!(
                "TLS certificates not reloaded, the old ones stay: {e}"
            )),
        }
        said
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Service {
    Memcached,
    Resp,
    Metrics,
}

/// A running server: its bound addresses, and `shutdown` to stop it.
pub struct ServerHandle {
    pub memcached_addr: Option<SocketAddr>,
    pub resp_addr: Option<SocketAddr>,
    pub metrics_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    runtimes: Arc<Runtimes>,
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    /// Stops accepting, lets every connection finish the requests it has read, waits for
    /// the threads (at most a few seconds for stuck clients) and returns the engine.
    pub fn shutdown(self) -> Arc<ZipCache> {
        self.shared.accepting.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
        for thread in self.threads {
            let _ = thread.join();
        }
        self.shared.cache.clone()
    }

    /// Notified when a client asks the server to stop (memcached's `shutdown`, with
    /// `shutdown_enabled`); stopping is the owner's job: `shutdown`.
    pub fn shutdown_requests(&self) -> Arc<Notify> {
        self.shared.shutdown_requested.clone()
    }

    /// Reads the auth file and the TLS files again (SIGHUP): [`Shared::reload_files`].
    pub fn reload_files(&self) -> Vec<String> {
        self.shared.reload_files()
    }

    /// Open client connections each runtime serves (one entry with `Runtime::Shared`).
    pub fn connections_per_runtime(&self) -> Vec<usize> {
        let serving = &self.runtimes.serving;
        serving.iter().map(|n| n.load(Ordering::Relaxed)).collect()
    }

    pub fn connections(&self) -> u64 {
        self.shared
            .counters
            .curr_connections
            .load(Ordering::Relaxed)
    }
}

/// Binds a listener; a port another process listens on is refused (`EADDRINUSE`), as
/// memcached refuses it.
fn bind(addr: SocketAddr) -> io::Result<StdListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// A connection accepted on one runtime thread for another to serve.
struct Handoff {
    protocol: Service,
    stream: std::net::TcpStream,
    peer: SocketAddr,
}

/// The runtimes serving connections: where to hand a new one, and how many each serves.
struct Runtimes {
    inboxes: Vec<mpsc::UnboundedSender<Handoff>>,
    serving: Vec<AtomicUsize>,
}

impl Runtimes {
    /// The runtime serving the fewest connections (the first of those tied).
    fn least_busy(&self) -> usize {
        (0..self.serving.len())
            .min_by_key(|&i| self.serving[i].load(Ordering::Relaxed))
            .unwrap_or(0)
    }
}

pub fn start(cache: Arc<ZipCache>, options: ServerOptions) -> io::Result<ServerHandle> {
    let tls = match &options.tls {
        Some(files) => {
            Some(Tls::load(files.clone()).map_err(|e| io::Error::other(format!("TLS: {e}")))?)
        }
        None => None,
    };
    let threads = options.threads.max(1);
    let runtime_count = match options.runtime {
        Runtime::PerCore => threads,
        Runtime::Shared => 1,
    };
    let listener = |port: Option<u16>| -> io::Result<Option<StdListener>> {
        port.map(|port| bind(SocketAddr::new(options.listen, port)))
            .transpose()
    };
    let memcached = listener(options.memcached_port)?;
    let resp = listener(options.resp_port)?;
    let metrics = listener(options.metrics_port)?;
    let addr_of = |listener: &Option<StdListener>| listener.as_ref()?.local_addr().ok();
    let memcached_addr = addr_of(&memcached);
    let resp_addr = addr_of(&resp);
    let metrics_addr = addr_of(&metrics);
    let info = ServerInfo {
        listen: options.listen,
        memcached_port: memcached_addr.map_or(0, |a| a.port()),
        resp_port: resp_addr.map_or(0, |a| a.port()),
        threads,
        max_connections: options.max_connections,
    };
    let shared = Arc::new(Shared {
        tls,
        ..Shared::new(cache, info, &options)
    });
    shared.cache.set_eviction_listener(shared.logger.clone());
    let (stop, stopped) = watch::channel(false);

    // Thread 0 accepts on every port and hands connections out.
    let listeners: Vec<(Service, StdListener)> = [
        (Service::Memcached, memcached),
        (Service::Resp, resp),
        (Service::Metrics, metrics),
    ]
    .into_iter()
    .filter_map(|(service, listener)| Some((service, listener?)))
    .collect();
    let (inboxes, mut receivers): (Vec<_>, Vec<_>) = (0..runtime_count)
        .map(|_| mpsc::unbounded_channel())
        .unzip();
    let runtimes = Arc::new(Runtimes {
        inboxes,
        serving: (0..runtime_count).map(|_| AtomicUsize::new(0)).collect(),
    });
    let mut listeners = Some(listeners);

    let mut handles = Vec::new();
    for (i, inbox) in receivers.drain(..).enumerate() {
        let runtime = match options.runtime {
            Runtime::PerCore => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            Runtime::Shared => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()?,
        };
        let serving = Serving {
            shared: shared.clone(),
            stopped: stopped.clone(),
            runtimes: runtimes.clone(),
        };
        let listeners = listeners.take().unwrap_or_default();
        // Tasks of a work-stealing runtime move between threads, and a ring's reads
        // complete only on the thread that submitted them: there, reads stay synchronous.
        let own_ring = options.runtime == Runtime::PerCore;
        let handle = std::thread::Builder::new()
            .name(format!("zipcache-io-{i}"))
            .spawn(move || {
                runtime.block_on(async move {
                    if own_ring {
                        tokio::spawn(reap_ssd_reads());
                    }
                    serve_thread(i, listeners, inbox, serving).await
                })
            })?;
        handles.push(handle);
    }
    Ok(ServerHandle {
        memcached_addr,
        resp_addr,
        metrics_addr,
        shared,
        runtimes,
        stop,
        threads: handles,
    })
}

/// Reads in flight per runtime thread; more wait for a slot as synchronous reads.
const SSD_READS_IN_FLIGHT: u32 = 256;

/// Gives this runtime thread its own io_uring for the engine's SSD reads and completes
/// them as the kernel does, on this thread: a connection awaiting a GET's read costs no
/// cross-thread wake-up (35–90 µs on our VMs), and the thread serves its other
/// connections meanwhile. Where io_uring is unavailable, reads stay synchronous.
async fn reap_ssd_reads() {
    let eventfd = match zipcache_device::install_thread_ring_owned(SSD_READS_IN_FLIGHT) {
        Ok(eventfd) => eventfd,
        Err(e) => {
            eprintln!(
                "zipcache: warning: io_uring unavailable ({e}): SSD reads block their thread"
            );
            return;
        }
    };
    // SAFETY: `register_with_interest` requires the fd to stay open and the same while the
    // AsyncFd owns it; it owns the `OwnedFd` (a duplicate of the ring's eventfd), which
    // closes only when the AsyncFd is dropped.
    let registered = unsafe { AsyncFd::register_with_interest(eventfd, Interest::READABLE) };
    let Ok(eventfd) = registered else {
        eprintln!(
            "zipcache: warning: cannot watch the io_uring eventfd: SSD reads block their thread"
        );
        return;
    };
    loop {
        let Ok(mut ready) = eventfd.readable().await else {
            return;
        };
        // Cleared before reaping: a completion posted meanwhile makes it readable again.
        ready.clear_ready();
        zipcache_device::reap_thread_ring();
    }
}

/// What a runtime thread needs to accept and serve connections.
#[derive(Clone)]
struct Serving {
    shared: Arc<Shared>,
    stopped: watch::Receiver<bool>,
    runtimes: Arc<Runtimes>,
}

/// Runtime thread `me`: accepts on `listeners` (thread 0 has them all) and serves the
/// connections handed to it through `inbox` until shutdown, then waits for them.
async fn serve_thread(
    me: usize,
    listeners: Vec<(Service, StdListener)>,
    mut inbox: mpsc::UnboundedReceiver<Handoff>,
    serving: Serving,
) {
    // Each connection holds a sender; when all are dropped, `recv` returns None.
    let (alive, mut drained) = mpsc::channel::<()>(1);
    for (protocol, listener) in listeners {
        let Ok(listener) = TcpListener::from_std(listener) else {
            continue;
        };
        tokio::spawn(accept_loop(protocol, listener, serving.clone()));
    }
    let mut stopped = serving.stopped.clone();
    loop {
        let handoff = tokio::select! {
            handoff = inbox.recv() => handoff,
            _ = stopped.wait_for(|stop| *stop) => break,
        };
        let Some(Handoff {
            protocol,
            stream,
            peer,
        }) = handoff
        else {
            break;
        };
        let serving = serving.clone();
        let alive = alive.clone();
        tokio::spawn(async move {
            if let Ok(stream) = TcpStream::from_std(stream) {
                serve_connection(protocol, stream, peer, &serving).await;
            }
            let Serving {
                shared, runtimes, ..
            } = &serving;
            shared
                .counters
                .curr_connections
                .fetch_sub(1, Ordering::Relaxed);
            runtimes.serving[me].fetch_sub(1, Ordering::Relaxed);
            drop(alive);
        });
    }
    drop(alive);
    let _ = stopped.wait_for(|stop| *stop).await;
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drained.recv()).await;
}

/// Accepts until shutdown; admits a connection (or tells it it is over the limit) and
/// hands it to the runtime serving the fewest.
async fn accept_loop(protocol: Service, listener: TcpListener, serving: Serving) {
    let Serving {
        shared,
        mut stopped,
        runtimes,
    } = serving;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|stop| *stop) => return,
        };
        let Ok((stream, peer)) = accepted else {
            // Out of file descriptors and the like: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if protocol == Service::Metrics {
            tokio::spawn(metrics_http::respond(stream, shared.clone()));
            continue;
        }
        let counters = &shared.counters;
        let open = counters.curr_connections.fetch_add(1, Ordering::Relaxed);
        if open >= shared.info.max_connections as u64 {
            counters.curr_connections.fetch_sub(1, Ordering::Relaxed);
            Counters::bump(&counters.rejected_connections);
            reject(stream, protocol, shared.tls.is_some());
            continue;
        }
        Counters::bump(&counters.total_connections);
        // Latency over batching: replies go out as soon as a read's requests are done.
        let _ = stream.set_nodelay(true);
        let target = runtimes.least_busy();
        // Counted before the handoff: the connection may end before `send` returns.
        runtimes.serving[target].fetch_add(1, Ordering::Relaxed);
        let handed = stream.into_std().ok().and_then(|stream| {
            let handoff = Handoff {
                protocol,
                stream,
                peer,
            };
            runtimes.inboxes[target].send(handoff).ok()
        });
        if handed.is_none() {
            // The runtime is gone (shutting down): the connection closes unserved.
            runtimes.serving[target].fetch_sub(1, Ordering::Relaxed);
            counters.curr_connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Serves one admitted connection, after its TLS handshake if the port speaks TLS.
async fn serve_connection(
    protocol: Service,
    stream: TcpStream,
    peer: SocketAddr,
    serving: &Serving,
) {
    let Serving {
        shared, stopped, ..
    } = serving;
    match &shared.tls {
        None => serve(stream, peer, protocol, shared, stopped.clone()).await,
        Some(tls) => {
            let acceptor = tls.acceptor();
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
            if let Ok(Ok(stream)) = handshake.await {
                serve(stream, peer, protocol, shared, stopped.clone()).await;
            }
        }
    }
}

/// Serves one accepted connection in its protocol, over TCP or TLS.
async fn serve<T: Transport>(
    stream: T,
    peer: SocketAddr,
    protocol: Service,
    shared: &Arc<Shared>,
    stopped: watch::Receiver<bool>,
) {
    match protocol {
        Service::Memcached => {
            let session = MemcacheSession::accepted(shared.clone(), Some(peer));
            connection::serve(stream, session, shared, stopped).await
        }
        _ => connection::serve(stream, RespSession::new(shared.clone()), shared, stopped).await,
    }
}

/// Tells a client over the connection limit why it is dropped, in its own protocol
/// (memcached's and Redis's wording), without waiting on it. A TLS client is closed
/// without a word: plain text would not reach it.
fn reject(stream: TcpStream, protocol: Service, tls: bool) {
    let message: &[u8] = match protocol {
        Service::Memcached => b"ERROR Too many open connections\r\n",
        _ => b"-ERR max number of clients reached\r\n",
    };
    if !tls {
        let _ = stream.try_write(message);
    }
    tokio::spawn(async move {
        let mut stream = stream;
        let _ = stream.shutdown().await;
    });
}
