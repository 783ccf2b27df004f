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
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::AbortHandle;
use zipcache::ZipCache;

use crate::access::{AccessPolicy, Credentials};
use crate::auth::Password;
use crate::buffer_budget::BufferBudget;
use crate::connection::{self, Transport};
use crate::memcache::annotations::Annotations;
use crate::memcache::conns::Connections;
use crate::memcache::prefix_stats::PrefixStats;
use crate::memcache::{Crawler, MemcacheSession};
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
    /// The `default` user's password: clients of every port must log in first (see
    /// [`AccessPolicy`]).
    pub requirepass: Option<Password>,
    /// Both protocol ports speak TLS (the metrics port stays plain HTTP).
    pub tls: Option<TlsFiles>,
    /// Most keys one `KEYS` examines.
    pub keys_limit: usize,
    /// False answers memcached's `flush_all` with `CLIENT_ERROR flush_all not allowed`
    /// (memcached `-F`) and RESP `FLUSHALL`/`FLUSHDB` with Redis's ACL `-NOPERM` error.
    pub flush_all_enabled: bool,
    /// Users (memcached `-Y`'s file) clients of every port must log in as first, beside
    /// `default` with `requirepass`; with neither, the server is open.
    pub users: Option<Arc<Credentials>>,
    /// memcached's LRU crawler starts enabled (`lru_crawler enable|disable` switch it).
    pub lru_crawler: bool,
    /// Connections that send nothing for this long are closed and counted in
    /// `idle_kicks` (memcached `-o idle_timeout`); `None` = never.
    pub idle_timeout: Option<Duration>,
    /// A connection whose replies wait this long for the client to read them is closed
    /// and counted in `write_timeouts`; `None` = never.
    pub write_timeout: Option<Duration>,
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
            users: None,
            lru_crawler: true,
            idle_timeout: None,
            write_timeout: Some(Duration::from_secs(30)),
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
    /// Who may use the server, on every port.
    pub access: AccessPolicy,
    pub keys_limit: usize,
    pub started: Instant,
    pub flush_all_enabled: bool,
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
    pub write_timeout: Option<Duration>,
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
            access: AccessPolicy::new(options.requirepass.clone(), options.users.clone()),
            keys_limit: options.keys_limit,
            started: Instant::now(),
            flush_all_enabled: options.flush_all_enabled,
            tls: None,
            annotations: Annotations::default(),
            crawler: Crawler::new(options.lru_crawler),
            logger: Arc::default(),
            prefix_stats: PrefixStats::default(),
            conns: Connections::default(),
            idle_timeout: options.idle_timeout,
            write_timeout: options.write_timeout,
            shutdown_enabled: options.shutdown_enabled,
            shutdown_requested: Arc::new(Notify::new()),
            accepting: AtomicBool::new(true),
            max_request_size: options.max_request_size(),
            buffers: BufferBudget::new(options.max_clients_memory(cache_dram_capacity)),
            first_request_timeout: options.first_request_timeout,
            pending_flush: Mutex::new(None),
        }
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
        let mut said: Vec<String> = self.access.reload_users().into_iter().collect();
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

    /// The line `run` prints once serving, which scripts and tests parse:
    /// `listening memcached=ADDR resp=ADDR metrics=ADDR`, `off` for a port that is off.
    pub fn listening(&self) -> String {
        let addr = |a: Option<SocketAddr>| a.map_or("off".to_string(), |a| a.to_string());
        format!(
            "listening memcached={} resp={} metrics={}",
            addr(self.memcached_addr),
            addr(self.resp_addr),
            addr(self.metrics_addr)
        )
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

/// Binds the ports and serves `cache` on them: [`Bound::new`], then [`Bound::serve`].
pub fn start(cache: Arc<ZipCache>, options: ServerOptions) -> io::Result<ServerHandle> {
    Bound::new(options)?.serve(cache)
}

/// A server with its ports bound, its TLS files loaded and its runtimes built, that
/// serves no engine yet: whatever can make a start fail happens here, before an engine
/// is opened, so that such a failure never costs the engine its warm state (`run`).
pub struct Bound {
    options: ServerOptions,
    tls: Option<Tls>,
    listeners: Vec<(Service, StdListener)>,
    runtimes: Vec<tokio::runtime::Runtime>,
    memcached_addr: Option<SocketAddr>,
    resp_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
}

impl Bound {
    pub fn new(options: ServerOptions) -> io::Result<Bound> {
        let tls = match &options.tls {
            Some(files) => {
                Some(Tls::load(files.clone()).map_err(|e| io::Error::other(format!("TLS: {e}")))?)
            }
            None => None,
        };
        let listener = |port: Option<u16>| -> io::Result<Option<StdListener>> {
            port.map(|port| bind(SocketAddr::new(options.listen, port)))
                .transpose()
        };
        let listeners: Vec<(Service, StdListener)> = [
            (Service::Memcached, listener(options.memcached_port)?),
            (Service::Resp, listener(options.resp_port)?),
            (Service::Metrics, listener(options.metrics_port)?),
        ]
        .into_iter()
        .filter_map(|(service, listener)| Some((service, listener?)))
        .collect();
        let addr_of = |wanted: Service| {
            let (_, listener) = listeners.iter().find(|(service, _)| *service == wanted)?;
            listener.local_addr().ok()
        };
        let threads = options.threads.max(1);
        let runtimes = match options.runtime {
            Runtime::PerCore => (0..threads)
                .map(|_| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                })
                .collect::<io::Result<_>>()?,
            Runtime::Shared => vec![
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads)
                    .enable_all()
                    .build()?,
            ],
        };
        Ok(Bound {
            memcached_addr: addr_of(Service::Memcached),
            resp_addr: addr_of(Service::Resp),
            metrics_addr: addr_of(Service::Metrics),
            options,
            tls,
            listeners,
            runtimes,
        })
    }

    /// Serves `cache` on the bound ports. On an error no thread of the server is left
    /// and the server holds no reference to `cache`: its owner can close it cleanly.
    pub fn serve(self, cache: Arc<ZipCache>) -> io::Result<ServerHandle> {
        let Bound {
            options,
            tls,
            listeners,
            runtimes,
            memcached_addr,
            resp_addr,
            metrics_addr,
        } = self;
        let info = ServerInfo {
            listen: options.listen,
            memcached_port: memcached_addr.map_or(0, |a| a.port()),
            resp_port: resp_addr.map_or(0, |a| a.port()),
            threads: options.threads.max(1),
            max_connections: options.max_connections,
        };
        let shared = Arc::new(Shared {
            tls,
            ..Shared::new(cache, info, &options)
        });
        let (stop, stopped) = watch::channel(false);
        let (inboxes, receivers): (Vec<_>, Vec<_>) =
            runtimes.iter().map(|_| mpsc::unbounded_channel()).unzip();
        let serving_counts = runtimes.iter().map(|_| AtomicUsize::new(0)).collect();
        let runtimes_shared = Arc::new(Runtimes {
            inboxes,
            serving: serving_counts,
        });
        // Thread 0 accepts on every port and hands connections out.
        let mut listeners = Some(listeners);
        // Tasks of a work-stealing runtime move between threads, and a ring's reads
        // complete only on the thread that submitted them: there, reads stay synchronous.
        let own_ring = options.runtime == Runtime::PerCore;
        let mut handles = Vec::new();
        for (i, (runtime, inbox)) in runtimes.into_iter().zip(receivers).enumerate() {
            let serving = Serving {
                shared: shared.clone(),
                stopped: stopped.clone(),
                runtimes: runtimes_shared.clone(),
            };
            let listeners = listeners.take().unwrap_or_default();
            let spawned = std::thread::Builder::new()
                .name(format!("zipcache-io-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        if own_ring && let Some(eventfd) = install_ssd_ring(watch_eventfd) {
                            tokio::spawn(reap_ssd_reads(eventfd));
                        }
                        serve_thread(i, listeners, inbox, serving).await
                    })
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    let _ = stop.send(true);
                    for handle in handles {
                        let _ = handle.join();
                    }
                    return Err(e);
                }
            }
        }
        shared.cache.set_eviction_listener(shared.logger.clone());
        Ok(ServerHandle {
            memcached_addr,
            resp_addr,
            metrics_addr,
            shared,
            runtimes: runtimes_shared,
            stop,
            threads: handles,
        })
    }
}

/// Reads in flight per runtime thread; more wait for a slot as synchronous reads.
const SSD_READS_IN_FLIGHT: u32 = 256;

/// Gives this runtime thread its own io_uring for the engine's SSD reads, watched by this
/// thread's reactor through `watch` (tokio's registration of the ring's eventfd): a
/// connection awaiting a GET's read costs no cross-thread wake-up (35–90 µs on our VMs),
/// and the thread serves its other connections meanwhile. Installing and watching are one
/// step: when either fails, the thread has no ring and its reads stay synchronous, for a
/// ring nobody watches would leave its reads in flight forever.
fn install_ssd_ring(
    watch: impl FnOnce(OwnedFd) -> io::Result<AsyncFd<OwnedFd>>,
) -> Option<AsyncFd<OwnedFd>> {
    let eventfd = match zipcache_device::install_thread_ring_owned(SSD_READS_IN_FLIGHT) {
        Ok(eventfd) => eventfd,
        Err(e) => {
            eprintln!(
                "zipcache: warning: io_uring unavailable ({e}): SSD reads block their thread"
            );
            return None;
        }
    };
    match watch(eventfd) {
        Ok(watched) => Some(watched),
        Err(e) => {
            zipcache_device::uninstall_thread_ring();
            eprintln!(
                "zipcache: warning: cannot watch the io_uring eventfd ({e}): SSD reads block their thread"
            );
            None
        }
    }
}

/// Registers the ring's eventfd with this thread's tokio reactor.
fn watch_eventfd(eventfd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `register_with_interest` requires the fd to stay open and the same while the
    // AsyncFd owns it; it owns the `OwnedFd` (a duplicate of the ring's eventfd), which
    // closes only when the AsyncFd is dropped.
    let registered = unsafe { AsyncFd::register_with_interest(eventfd, Interest::READABLE) };
    registered.map_err(|refused| refused.into_parts().1)
}

/// Completes this thread's SSD reads as the kernel does, on this thread. Should watching
/// the eventfd fail, the ring is uninstalled (its reads complete first): reads then stay
/// synchronous rather than wait for a reaper that is gone.
async fn reap_ssd_reads(eventfd: AsyncFd<OwnedFd>) {
    while let Ok(mut ready) = eventfd.readable().await {
        // Cleared before reaping: a completion posted meanwhile makes it readable again.
        ready.clear_ready();
        zipcache_device::reap_thread_ring();
    }
    zipcache_device::uninstall_thread_ring();
    eprintln!("zipcache: warning: the io_uring eventfd failed: SSD reads block their thread");
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
    let metrics = metrics_http::Endpoint::default();
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
            metrics.admit(stream, shared.clone());
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

#[cfg(test)]
mod tests {
    use zipcache_device::{AlignedBuf, BLOCK_BYTES, BlockDevice, FileDevice};

    use super::*;

    /// Runs `body` with a 16-block file device of bytes `7` on a fresh thread (its own ring
    /// state) inside a current-thread runtime, as a per-core runtime thread runs.
    fn on_a_runtime_thread(name: &str, body: impl AsyncFnOnce(&FileDevice) + Send + 'static) {
        let path = std::env::temp_dir().join(format!("zipcache-{name}-{}", std::process::id()));
        let device = FileDevice::open(&path, 16 * BLOCK_BYTES).expect("device");
        let mut blocks = AlignedBuf::zeroed(16);
        blocks.fill(7);
        device.write(0, &blocks).expect("fill");
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(body(&device));
        })
        .join()
        .expect("the runtime thread");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_ring_whose_eventfd_cannot_be_watched_is_uninstalled() {
        on_a_runtime_thread("unwatched-ring", async |device| {
            let injected = |_| Err(io::Error::other("injected: no reactor"));
            assert!(install_ssd_ring(injected).is_none());
            let read = device.read_async(3, AlignedBuf::zeroed(1));
            assert!(
                !read.is_in_flight(),
                "a read went to a ring that nobody reaps"
            );
            let (result, buf) = tokio::time::timeout(Duration::from_secs(10), read)
                .await
                .expect("the read completes");
            result.expect("read");
            assert!(buf.iter().all(|&b| b == 7));
        });
    }

    #[test]
    fn a_watched_ring_completes_reads_through_the_reaper() {
        on_a_runtime_thread("watched-ring", async |device| {
            let Some(eventfd) = install_ssd_ring(watch_eventfd) else {
                panic!("io_uring is available on the machines we test on");
            };
            let reaper = tokio::spawn(reap_ssd_reads(eventfd));
            let read = device.read_async(5, AlignedBuf::zeroed(1));
            assert!(read.is_in_flight());
            let (result, buf) = tokio::time::timeout(Duration::from_secs(10), read)
                .await
                .expect("the reaper completes the read");
            result.expect("read");
            assert!(buf.iter().all(|&b| b == 7));
            reaper.abort();
            zipcache_device::uninstall_thread_ring();
        });
    }
}
