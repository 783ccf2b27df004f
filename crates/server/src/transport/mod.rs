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

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Protocol as IpProtocol, Socket, Type};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::core::stats::Counters;
use crate::core::{Core, Runtime, ServerOptions};
use buffer_budget::BufferBudget;
use connection::Session;
use tls::Tls;

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
    /// True until shutdown begins (memcached's `accepting_conns`).
    pub accepting: AtomicBool,
}

impl Transport {
    pub fn new(core: Arc<Core>, tls: Option<Tls>, options: &ServerOptions) -> Transport {
        let dram_capacity = core.cache.config().dram_capacity;
        Transport {
            core,
            tls,
            max_request_size: options.max_request_size(),
            buffers: BufferBudget::new(options.max_clients_memory(dram_capacity)),
            idle_timeout: options.idle_timeout,
            write_timeout: options.write_timeout,
            first_request_timeout: options.first_request_timeout,
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

/// A protocol served on a port: a session for each connection it admits.
pub trait Protocol: Send + Sync + 'static {
    type Session: Session + Send + 'static;

    /// The session of a connection accepted from `peer`.
    fn open(self: Arc<Self>, peer: SocketAddr) -> Self::Session;

    /// What a client over the connection limit is told before it is dropped.
    fn over_limit(&self) -> &'static [u8];
}

type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A [`Protocol`] with its session type out of sight, so that one accept loop and one
/// handoff serve every protocol.
pub trait Sessions: Send + Sync {
    /// Serves `stream`, accepted from `peer`, to its end, after its TLS handshake if the
    /// port speaks TLS.
    fn serve(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        transport: Arc<Transport>,
        stopped: watch::Receiver<bool>,
    ) -> Serving;

    fn over_limit(&self) -> &'static [u8];
}

impl<P: Protocol> Sessions for P {
    fn serve(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        transport: Arc<Transport>,
        stopped: watch::Receiver<bool>,
    ) -> Serving {
        Box::pin(async move {
            // The session opens once the connection is one (after its TLS handshake):
            // `stats conns` and memcached's connection events list no failed handshake.
            match &transport.tls {
                None => {
                    let session = self.open(peer);
                    connection::serve(stream, session, &transport, stopped).await;
                }
                Some(tls) => {
                    let handshake = tls.acceptor().accept(stream);
                    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake);
                    if let Ok(Ok(stream)) = handshake.await {
                        let session = self.open(peer);
                        connection::serve(stream, session, &transport, stopped).await;
                    }
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

/// The ports of the server, named by what the options bind them for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Port {
    Memcached,
    Resp,
    Metrics,
}

/// A port's listener with what it serves.
enum Listener {
    Sessions(Arc<dyn Sessions>),
    Direct(Direct),
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
    stream: std::net::TcpStream,
    peer: SocketAddr,
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

/// The server's ports bound, its TLS files loaded and its runtimes built, serving
/// nothing yet: whatever can make a start fail happens here, before an engine is opened,
/// so that such a failure never costs the engine its warm state (`run`).
pub struct Bound {
    options: ServerOptions,
    tls: Option<Tls>,
    listeners: Vec<(Port, StdListener)>,
    runtimes: Vec<tokio::runtime::Runtime>,
    pub memcached_addr: Option<SocketAddr>,
    pub resp_addr: Option<SocketAddr>,
    pub metrics_addr: Option<SocketAddr>,
}

/// The threads serving the ports: stop them with [`Running::stop`].
pub struct Running {
    pub runtimes: Arc<Runtimes>,
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, lets every connection finish the requests it has read, and waits
    /// for the threads (at most a few seconds for stuck clients).
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
        let listener = |port: Option<u16>| -> io::Result<Option<StdListener>> {
            port.map(|port| bind(SocketAddr::new(options.listen, port)))
                .transpose()
        };
        let listeners: Vec<(Port, StdListener)> = [
            (Port::Memcached, listener(options.memcached_port)?),
            (Port::Resp, listener(options.resp_port)?),
            (Port::Metrics, listener(options.metrics_port)?),
        ]
        .into_iter()
        .filter_map(|(port, listener)| Some((port, listener?)))
        .collect();
        let addr_of = |wanted: Port| {
            let (_, listener) = listeners.iter().find(|(port, _)| *port == wanted)?;
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
            memcached_addr: addr_of(Port::Memcached),
            resp_addr: addr_of(Port::Resp),
            metrics_addr: addr_of(Port::Metrics),
            options,
            tls,
            listeners,
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
            runtimes,
            ..
        } = self;
        let listeners: Vec<(Listener, StdListener)> = listeners
            .into_iter()
            .map(|(port, listener)| {
                let serves = match port {
                    Port::Memcached => Listener::Sessions(services.memcached.clone()),
                    Port::Resp => Listener::Sessions(services.resp.clone()),
                    Port::Metrics => Listener::Direct(services.metrics.clone()),
                };
                (serves, listener)
            })
            .collect();
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
    listeners: Vec<(Listener, StdListener)>,
    mut inbox: mpsc::UnboundedReceiver<Handoff>,
    thread: Thread,
) {
    // Each connection holds a sender; when all are dropped, `recv` returns None.
    let (alive, mut drained) = mpsc::channel::<()>(1);
    for (serves, listener) in listeners {
        let Ok(listener) = TcpListener::from_std(listener) else {
            continue;
        };
        tokio::spawn(accept_loop(serves, listener, thread.clone()));
    }
    let mut stopped = thread.stopped.clone();
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
        let Thread {
            transport,
            stopped,
            runtimes,
        } = thread.clone();
        let alive = alive.clone();
        tokio::spawn(async move {
            if let Ok(stream) = TcpStream::from_std(stream) {
                protocol
                    .serve(stream, peer, transport.clone(), stopped)
                    .await;
            }
            transport
                .core
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
async fn accept_loop(serves: Listener, listener: TcpListener, thread: Thread) {
    let Thread {
        transport,
        mut stopped,
        runtimes,
    } = thread;
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
        let protocol = match &serves {
            Listener::Direct(answer) => {
                answer(stream);
                continue;
            }
            Listener::Sessions(protocol) => protocol,
        };
        let counters = &transport.core.counters;
        let open = counters.curr_connections.fetch_add(1, Ordering::Relaxed);
        if open >= transport.core.info.max_connections as u64 {
            counters.curr_connections.fetch_sub(1, Ordering::Relaxed);
            Counters::bump(&counters.rejected_connections);
            reject(stream, protocol.over_limit(), transport.tls.is_some());
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
                protocol: protocol.clone(),
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

/// Tells a client over the connection limit why it is dropped, in its own protocol,
/// without waiting on it. A TLS client is closed without a word: plain text would not
/// reach it.
fn reject(stream: TcpStream, message: &[u8], tls: bool) {
    if !tls {
        let _ = stream.try_write(message);
    }
    tokio::spawn(async move {
        let mut stream = stream;
        let _ = stream.shutdown().await;
    });
}
