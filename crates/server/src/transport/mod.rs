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

mod client;
mod listen;
mod threads;

pub mod buffer_budget;
pub mod connection;
pub mod output;
pub mod prefetch;
mod ring;
pub mod tls;
pub mod unix;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::core::{Core, ServerOptions};
use buffer_budget::BufferBudget;
use connection::Session;
use tls::Tls;

pub use client::{Accepted, Client};
pub use listen::{Bound, LISTEN_BACKLOG};
pub use threads::{Running, ThreadConnections};

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
        let dram_capacity = core.keys.engine().config().dram_capacity;
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

    /// The session of a connection accepted from `peer`, which reached this server at
    /// `local` (`None` over the unix socket).
    fn open(self: Arc<Self>, peer: Peer, local: Option<SocketAddr>) -> Self::Session;

    /// What a client over the connection limit is told before it is dropped.
    fn over_limit(&self) -> &'static [u8];
}

type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

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
                    let session = self.open(Peer::Tcp(peer), stream.local_addr().ok());
                    connection::serve(stream, session, &transport, stopped, here).await;
                }
                (Client::Tcp(stream, peer), Some(tls)) => {
                    let local = stream.local_addr().ok();
                    let handshake = tls.acceptor().accept(stream);
                    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake);
                    if let Ok(Ok(stream)) = handshake.await {
                        let session = self.open(Peer::Tcp(peer), local);
                        connection::serve(stream, session, &transport, stopped, here).await;
                    }
                }
                // The socket file's mode says who may connect, and nothing leaves the
                // host: no TLS there, as memcached and Redis serve theirs.
                (Client::Unix(stream), _) => {
                    let session = self.open(Peer::Unix, None);
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
