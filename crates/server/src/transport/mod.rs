//! The transport layer: listeners, threads and connection admission, TLS, each
//! connection's read → execute → write loop with its buffers and their budgets, and the
//! SSD reads a connection has in flight. It serves whatever [`Protocol`] a port is given
//! and imports none.
//!
//! `Runtime::PerCore` (the default): one OS thread per core, each with its own tokio
//! `current_thread` runtime; a request is parsed, executed and answered on the thread that
//! serves its connection — no cross-thread wake-ups, which cost 35–90 µs on the VMs we run
//! on. One listener per port (thread 0 accepts, memcached's dispatcher) hands each new
//! connection to the thread serving the fewest: a handful of client connections hashed
//! over `SO_REUSEPORT` listeners was often served 3:1 by two threads, and a reuse-port
//! group lets a second server join the port unnoticed. `Runtime::Shared` (one
//! work-stealing runtime) exists to measure the choice against (docs/SERVER.md).

pub mod buffer_budget;
pub mod connection;
pub mod output;
pub mod prefetch;
mod ring;
pub mod tls;
pub mod unix;

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Protocol as IpProtocol, Socket, Type};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};

use crate::core::stats::Counters;
use crate::core::{Core, Runtime, ServerOptions};
use buffer_budget::BufferBudget;
use connection::Session;
use tls::Tls;
use unix::SocketFile;

/// Connections the kernel queues per listener before they are accepted.
pub const LISTEN_BACKLOG: i32 = 1024;
/// How long shutdown waits for open connections to finish their current requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a TLS client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the transport holds for every connection of every port: the limits it enforces,
/// the budget for all connections' buffers, TLS.
pub struct Transport {
    pub core: Arc<Core>,
    /// Both protocol ports speak TLS.
    pub tls: Option<Tls>,
    /// Most bytes one connection may buffer of one request.
    pub max_request_size: usize,
    /// What every connection's buffers hold, against `max_clients_memory`.
    pub buffers: Arc<BufferBudget>,
    pub idle_timeout: Option<Duration>,
    pub write_timeout: Option<Duration>,
    pub first_request_timeout: Option<Duration>,
    /// `None` when no login is required (`ServerOptions::auth_timeout`).
    pub auth_timeout: Option<Duration>,
    /// True until shutdown begins (memcached's `accepting_conns`).
    pub accepting: AtomicBool,
}

impl Transport {
    pub fn new(core: Arc<Core>, tls: Option<Tls>, options: &ServerOptions) -> Transport {
        let dram_capacity = core.cache.config().dram_capacity;
        let auth_timeout = options.auth_timeout.filter(|_| core.access.required());
        Transport {
            core,
            tls,
            max_request_size: options.max_request_size(),
            buffers: BufferBudget::new(options.max_clients_memory(dram_capacity)),
            idle_timeout: options.idle_timeout,
            write_timeout: options.write_timeout,
            first_request_timeout: options.first_request_timeout,
            auth_timeout,
            accepting: AtomicBool::new(true),
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
}

/// Who a connection comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Tcp(SocketAddr),
    /// A client of the unix-domain socket: it has no address.
    Unix,
}

/// A protocol served on a port: a session for each connection it admits.
pub trait Protocol: Send + Sync + 'static {
    type Session: Session + Send + 'static;

    /// The session of a connection accepted from `peer`.
    fn open(self: Arc<Self>, peer: Peer) -> Self::Session;

    /// What a client over the connection limit is told before it is dropped.
    fn over_limit(&self) -> &'static [u8];
}

type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A client's connection, as a listener accepts it (`Accepted`) and as it is handed to
/// the runtime thread that serves it (`Handed`).
pub enum Client<Tcp, Unix> {
    Tcp(Tcp, SocketAddr),
    Unix(Unix),
}

pub type Accepted = Client<TcpStream, UnixStream>;
type Handed = Client<std::net::TcpStream, StdUnixStream>;

impl Accepted {
    /// Out of the accepting thread's reactor, to be registered with another.
    fn into_std(self) -> io::Result<Handed> {
        Ok(match self {
            Client::Tcp(stream, peer) => Client::Tcp(stream.into_std()?, peer),
            Client::Unix(stream) => Client::Unix(stream.into_std()?),
        })
    }

    /// Tells a client over the connection limit why it is dropped, in its own protocol,
    /// without waiting on it. A TLS client is closed without a word: plain text would
    /// not reach it (a unix socket never speaks TLS).
    fn reject(self, message: &[u8], tls: bool) {
        match self {
            Client::Tcp(stream, _) => {
                if !tls {
                    let _ = stream.try_write(message);
                }
                close(stream);
            }
            Client::Unix(stream) => {
                let _ = stream.try_write(message);
                close(stream);
            }
        }
    }
}

/// Closes `stream` on a task of its own: nothing waits for the client.
fn close<S: AsyncWrite + Unpin + Send + 'static>(mut stream: S) {
    tokio::spawn(async move {
        let _ = stream.shutdown().await;
    });
}

impl Handed {
    /// Registered with the reactor of the runtime thread that serves it.
    fn into_tokio(self) -> io::Result<Accepted> {
        Ok(match self {
            Client::Tcp(stream, peer) => Client::Tcp(TcpStream::from_std(stream)?, peer),
            Client::Unix(stream) => Client::Unix(UnixStream::from_std(stream)?),
        })
    }
}

/// A [`Protocol`] with its session type out of sight, so that one accept loop and one
/// handoff serve every protocol.
pub trait Sessions: Send + Sync {
    /// Serves `client` to its end, after its TLS handshake if the port speaks TLS.
    fn serve(
        self: Arc<Self>,
        client: Accepted,
        transport: Arc<Transport>,
        stopped: watch::Receiver<bool>,
        here: ThreadConnections,
    ) -> Serving;

    fn over_limit(&self) -> &'static [u8];
}

impl<P: Protocol> Sessions for P {
    fn serve(
        self: Arc<Self>,
        client: Accepted,
        transport: Arc<Transport>,
        stopped: watch::Receiver<bool>,
        here: ThreadConnections,
    ) -> Serving {
        Box::pin(async move {
            let here = here.count();
            // The session opens once the connection is one (after its TLS handshake):
            // `stats conns` and memcached's connection events list no failed handshake.
            match (client, &transport.tls) {
                (Client::Tcp(stream, peer), None) => {
                    let session = self.open(Peer::Tcp(peer));
                    connection::serve(stream, session, &transport, stopped, here).await;
                }
                (Client::Tcp(stream, peer), Some(tls)) => {
                    let handshake = tls.acceptor().accept(stream);
                    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake);
                    if let Ok(Ok(stream)) = handshake.await {
                        let session = self.open(Peer::Tcp(peer));
                        connection::serve(stream, session, &transport, stopped, here).await;
                    }
                }
                // The socket file's mode says who may connect, and nothing leaves the
                // host: no TLS there, as memcached and Redis serve theirs.
                (Client::Unix(stream), _) => {
                    let session = self.open(Peer::Unix);
                    connection::serve(stream, session, &transport, stopped, here).await;
                }
            }
        })
    }

    fn over_limit(&self) -> &'static [u8] {
        Protocol::over_limit(self)
    }
}

/// A port answered on the accepting thread, under its own admission (the metrics
/// endpoint), outside the connection limit.
pub type Direct = Arc<dyn Fn(TcpStream) + Send + Sync>;

/// What each bound port serves.
pub struct Services {
    pub memcached: Arc<dyn Sessions>,
    pub resp: Arc<dyn Sessions>,
    pub metrics: Direct,
}

/// The protocol listeners of the server, named by what the options bind them for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Port {
    Memcached,
    /// memcached's protocols on the unix-domain socket.
    MemcachedUnix,
    Resp,
}

/// A listening socket: a TCP port, or a unix-domain socket with its file, which is
/// removed when the listener goes (its runtime stopped, or a start failed).
enum Listening<Tcp, Unix> {
    Tcp(Tcp),
    Unix(Unix, SocketFile),
}

type BoundSocket = Listening<StdListener, StdUnixListener>;
type Accepting = Listening<TcpListener, UnixListener>;

impl BoundSocket {
    fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Listening::Tcp(listener) => listener.local_addr().ok(),
            Listening::Unix(..) => None,
        }
    }

    /// Registered with the reactor of the thread that accepts on it.
    fn into_tokio(self) -> io::Result<Accepting> {
        Ok(match self {
            Listening::Tcp(listener) => Listening::Tcp(TcpListener::from_std(listener)?),
            Listening::Unix(listener, file) => {
                Listening::Unix(UnixListener::from_std(listener)?, file)
            }
        })
    }
}

/// A listener a runtime thread accepts on.
trait Accept: Send + 'static {
    type Client: Send;

    fn accept(&self) -> impl Future<Output = io::Result<Self::Client>> + Send;
}

impl Accept for TcpListener {
    type Client = TcpStream;

    async fn accept(&self) -> io::Result<TcpStream> {
        Ok(TcpListener::accept(self).await?.0)
    }
}

impl Accept for Accepting {
    type Client = Accepted;

    async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listening::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                Ok(Client::Tcp(stream, peer))
            }
            Listening::Unix(listener, _) => Ok(Client::Unix(listener.accept().await?.0)),
        }
    }
}

/// What thread 0 accepts on: the protocols' listeners and the metrics port.
#[derive(Default)]
struct Listeners {
    sessions: Vec<(Arc<dyn Sessions>, BoundSocket)>,
    metrics: Option<(Direct, StdListener)>,
}

/// Binds a listener; a port another process listens on is refused (`EADDRINUSE`), as
/// memcached refuses it.
fn bind(addr: SocketAddr) -> io::Result<StdListener> {
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM,
        Some(IpProtocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// A connection accepted on one runtime thread for another to serve.
struct Handoff {
    protocol: Arc<dyn Sessions>,
    client: Handed,
}

/// The runtimes serving connections: where to hand a new one, and how many each serves.
pub struct Runtimes {
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

    /// Open client connections each runtime serves (one entry with `Runtime::Shared`).
    pub fn connections(&self) -> Vec<usize> {
        let serving = &self.serving;
        serving.iter().map(|n| n.load(Ordering::Relaxed)).collect()
    }
}

/// One runtime thread's entry in [`Runtimes`]: how many connections it serves.
#[derive(Clone)]
pub struct ThreadConnections {
    runtimes: Arc<Runtimes>,
    thread: usize,
}

impl ThreadConnections {
    fn count(&self) -> &AtomicUsize {
        &self.runtimes.serving[self.thread]
    }
}

/// The server's ports bound, its TLS files loaded and its runtimes built, serving
/// nothing yet: whatever can make a start fail happens here, before an engine is opened,
/// so that such a failure never costs the engine its warm state (`run`).
pub struct Bound {
    options: ServerOptions,
    tls: Option<Tls>,
    listeners: Vec<(Port, BoundSocket)>,
    metrics: Option<StdListener>,
    runtimes: Vec<tokio::runtime::Runtime>,
    pub memcached_addr: Option<SocketAddr>,
    pub resp_addr: Option<SocketAddr>,
    pub metrics_addr: Option<SocketAddr>,
    /// The unix-domain socket memcached's protocols are served on.
    pub unix_socket: Option<PathBuf>,
}

/// The threads serving the ports: stop them with [`Running::stop`].
pub struct Running {
    pub runtimes: Arc<Runtimes>,
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting (a unix socket's file is removed then), lets every connection
    /// finish the requests it has read, and waits for the threads (at most a few seconds
    /// for stuck clients).
    pub fn stop(self) {
        let _ = self.stop.send(true);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

impl Bound {
    pub fn new(options: ServerOptions) -> io::Result<Bound> {
        let tls = match &options.tls {
            Some(files) => {
                Some(Tls::load(files.clone()).map_err(|e| io::Error::other(format!("TLS: {e}")))?)
            }
            None => None,
        };
        let tcp = |port: Option<u16>| -> io::Result<Option<StdListener>> {
            port.map(|port| bind(SocketAddr::new(options.listen, port)))
                .transpose()
        };
        let unix = |path: &PathBuf| -> io::Result<BoundSocket> {
            let (listener, file) = unix::bind(path, options.unix_socket_mode)?;
            Ok(Listening::Unix(listener, file))
        };
        let listeners: Vec<(Port, BoundSocket)> = [
            (
                Port::Memcached,
                tcp(options.memcached_port)?.map(Listening::Tcp),
            ),
            (
                Port::MemcachedUnix,
                options.unix_socket.as_ref().map(unix).transpose()?,
            ),
            (Port::Resp, tcp(options.resp_port)?.map(Listening::Tcp)),
        ]
        .into_iter()
        .filter_map(|(port, listener)| Some((port, listener?)))
        .collect();
        let metrics = tcp(options.metrics_port)?;
        let addr_of = |wanted: Port| {
            let (_, listener) = listeners.iter().find(|(port, _)| *port == wanted)?;
            listener.local_addr()
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
            memcached_addr: addr_of(Port::Memcached),
            resp_addr: addr_of(Port::Resp),
            metrics_addr: metrics.as_ref().and_then(|l| l.local_addr().ok()),
            unix_socket: options.unix_socket.clone(),
            options,
            tls,
            listeners,
            metrics,
            runtimes,
        })
    }

    pub fn options(&self) -> &ServerOptions {
        &self.options
    }

    /// The TLS the ports speak, for the [`Transport`] that serves them.
    pub fn take_tls(&mut self) -> Option<Tls> {
        self.tls.take()
    }

    /// Serves `services` on the bound ports. On an error no thread of the server is left
    /// and none holds a reference to `transport`.
    pub fn serve(self, transport: Arc<Transport>, services: Services) -> io::Result<Running> {
        let Bound {
            options,
            listeners,
            metrics,
            runtimes,
            ..
        } = self;
        let sessions = listeners
            .into_iter()
            .map(|(port, listener)| {
                let protocol = match port {
                    Port::Memcached | Port::MemcachedUnix => services.memcached.clone(),
                    Port::Resp => services.resp.clone(),
                };
                (protocol, listener)
            })
            .collect();
        let metrics = metrics.map(|listener| (services.metrics.clone(), listener));
        let (stop, stopped) = watch::channel(false);
        let (inboxes, receivers): (Vec<_>, Vec<_>) =
            runtimes.iter().map(|_| mpsc::unbounded_channel()).unzip();
        let serving_counts = runtimes.iter().map(|_| AtomicUsize::new(0)).collect();
        let runtimes_shared = Arc::new(Runtimes {
            inboxes,
            serving: serving_counts,
        });
        // Thread 0 accepts on every port and hands connections out.
        let mut listeners = Some(Listeners { sessions, metrics });
        // Tasks of a work-stealing runtime move between threads, and a ring's reads
        // complete only on the thread that submitted them: there, reads stay synchronous.
        let own_ring = options.runtime == Runtime::PerCore;
        let mut handles = Vec::new();
        for (i, (runtime, inbox)) in runtimes.into_iter().zip(receivers).enumerate() {
            let thread = Thread {
                transport: transport.clone(),
                stopped: stopped.clone(),
                runtimes: runtimes_shared.clone(),
            };
            let listeners = listeners.take().unwrap_or_default();
            let spawned = std::thread::Builder::new()
                .name(format!("zipcache-io-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        if own_ring
                            && let Some(eventfd) = ring::install_ssd_ring(ring::watch_eventfd)
                        {
                            tokio::spawn(ring::reap_ssd_reads(eventfd));
                        }
                        serve_thread(i, listeners, inbox, thread).await
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
        Ok(Running {
            runtimes: runtimes_shared,
            stop,
            threads: handles,
        })
    }
}

/// What a runtime thread needs to accept and serve connections.
#[derive(Clone)]
struct Thread {
    transport: Arc<Transport>,
    stopped: watch::Receiver<bool>,
    runtimes: Arc<Runtimes>,
}

/// Runtime thread `me`: accepts on `listeners` (thread 0 has them all) and serves the
/// connections handed to it through `inbox` until shutdown, then waits for them.
async fn serve_thread(
    me: usize,
    listeners: Listeners,
    mut inbox: mpsc::UnboundedReceiver<Handoff>,
    thread: Thread,
) {
    // Each connection holds a sender; when all are dropped, `recv` returns None.
    let (alive, mut drained) = mpsc::channel::<()>(1);
    for (protocol, listener) in listeners.sessions {
        let Ok(listener) = listener.into_tokio() else {
            continue;
        };
        let (stopped, thread) = (thread.stopped.clone(), thread.clone());
        let admit = move |client| admit(&protocol, client, &thread);
        tokio::spawn(accept_until_stopped(listener, stopped, admit));
    }
    if let Some((answer, listener)) = listeners.metrics
        && let Ok(listener) = TcpListener::from_std(listener)
    {
        let answer = move |stream| answer(stream);
        tokio::spawn(accept_until_stopped(
            listener,
            thread.stopped.clone(),
            answer,
        ));
    }
    let mut stopped = thread.stopped.clone();
    loop {
        let handoff = tokio::select! {
            handoff = inbox.recv() => handoff,
            _ = stopped.wait_for(|stop| *stop) => break,
        };
        let Some(Handoff { protocol, client }) = handoff else {
            break;
        };
        let Thread {
            transport,
            stopped,
            runtimes,
        } = thread.clone();
        let alive = alive.clone();
        let here = ThreadConnections {
            runtimes,
            thread: me,
        };
        tokio::spawn(async move {
            if let Ok(client) = client.into_tokio() {
                let serving = protocol.serve(client, transport.clone(), stopped, here.clone());
                serving.await;
            }
            transport
                .core
                .counters
                .curr_connections
                .fetch_sub(1, Ordering::Relaxed);
            here.count().fetch_sub(1, Ordering::Relaxed);
            drop(alive);
        });
    }
    drop(alive);
    let _ = stopped.wait_for(|stop| *stop).await;
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drained.recv()).await;
}

/// Accepts on `listener` until shutdown (then drops it), each client to `admit`.
async fn accept_until_stopped<L: Accept>(
    listener: L,
    mut stopped: watch::Receiver<bool>,
    admit: impl Fn(L::Client) + Send,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|stop| *stop) => return,
        };
        match accepted {
            Ok(client) => admit(client),
            // Out of file descriptors and the like: back off instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Admits a client of `protocol` — TCP and unix-socket clients alike, under the one
/// connection limit — or tells it it is over the limit, and hands it to the runtime
/// serving the fewest.
fn admit(protocol: &Arc<dyn Sessions>, client: Accepted, thread: &Thread) {
    let Thread {
        transport,
        runtimes,
        ..
    } = thread;
    let counters = &transport.core.counters;
    let open = counters.curr_connections.fetch_add(1, Ordering::Relaxed);
    if open >= transport.core.info.max_connections as u64 {
        counters.curr_connections.fetch_sub(1, Ordering::Relaxed);
        Counters::bump(&counters.rejected_connections);
        client.reject(protocol.over_limit(), transport.tls.is_some());
        return;
    }
    Counters::bump(&counters.total_connections);
    if let Client::Tcp(stream, _) = &client {
        // Latency over batching: replies go out as soon as a read's requests are done.
        let _ = stream.set_nodelay(true);
    }
    let target = runtimes.least_busy();
    // Counted before the handoff: the connection may end before `send` returns.
    runtimes.serving[target].fetch_add(1, Ordering::Relaxed);
    let handed = client.into_std().ok().and_then(|client| {
        let handoff = Handoff {
            protocol: protocol.clone(),
            client,
        };
        runtimes.inboxes[target].send(handoff).ok()
    });
    if handed.is_none() {
        // The runtime is gone (shutting down): the connection closes unserved.
        runtimes.serving[target].fetch_sub(1, Ordering::Relaxed);
        counters.curr_connections.fetch_sub(1, Ordering::Relaxed);
    }
}
