//! The ports bound before the engine opens: TCP listeners, the unix-domain socket, the
//! metrics port, and the runtimes that will serve them ([`Bound`]); what a runtime
//! thread accepts on ([`Accept`]).

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use socket2::{Domain, Protocol as IpProtocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream, UnixListener};

use super::client::{Accepted, Client};
use super::tls::Tls;
use super::unix::{self, SocketFile};
use super::{Direct, Sessions};
use crate::core::{Runtime, ServerOptions};

/// Connections the kernel queues per listener before they are accepted.
pub const LISTEN_BACKLOG: i32 = 1024;

/// The protocol listeners of the server, named by what the options bind them for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Port {
    Memcached,
    /// memcached's protocols on the unix-domain socket.
    MemcachedUnix,
    Resp,
}

/// A listening socket: a TCP port, or a unix-domain socket with its file, which is
/// removed when the listener goes (its runtime stopped, or a start failed).
pub(super) enum Listening<Tcp, Unix> {
    Tcp(Tcp),
    Unix(Unix, SocketFile),
}

pub(super) type BoundSocket = Listening<StdListener, StdUnixListener>;
pub(super) type Accepting = Listening<TcpListener, UnixListener>;

impl BoundSocket {
    fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Listening::Tcp(listener) => listener.local_addr().ok(),
            Listening::Unix(..) => None,
        }
    }

    /// Registered with the reactor of the thread that accepts on it.
    pub(super) fn into_tokio(self) -> io::Result<Accepting> {
        Ok(match self {
            Listening::Tcp(listener) => Listening::Tcp(TcpListener::from_std(listener)?),
            Listening::Unix(listener, file) => {
                Listening::Unix(UnixListener::from_std(listener)?, file)
            }
        })
    }
}

/// A listener a runtime thread accepts on.
pub(super) trait Accept: Send + 'static {
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
pub(super) struct Listeners {
    pub(super) sessions: Vec<(Arc<dyn Sessions>, BoundSocket)>,
    pub(super) metrics: Option<(Direct, StdListener)>,
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

/// The server's ports bound, its TLS files loaded and its runtimes built, serving
/// nothing yet: whatever can make a start fail happens here, before an engine is opened,
/// so that such a failure never costs the engine its warm state (`run`).
pub struct Bound {
    pub(super) options: ServerOptions,
    pub(super) tls: Option<Tls>,
    pub(super) listeners: Vec<(Port, BoundSocket)>,
    pub(super) metrics: Option<StdListener>,
    pub(super) runtimes: Vec<tokio::runtime::Runtime>,
    pub memcached_addr: Option<SocketAddr>,
    pub resp_addr: Option<SocketAddr>,
    pub metrics_addr: Option<SocketAddr>,
    /// The unix-domain socket memcached's protocols are served on.
    pub unix_socket: Option<PathBuf>,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two servers never share a port unnoticed: the second bind is refused.
    #[test]
    fn a_port_another_listener_holds_is_refused() {
        let first = bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let taken = first.local_addr().unwrap();
        let second = bind(taken).expect_err("the port is taken");
        assert_eq!(second.kind(), io::ErrorKind::AddrInUse);
        drop(first);
        // Free again once its holder is gone (SO_REUSEADDR: no TIME_WAIT wait).
        bind(taken).expect("free again");
    }

    /// Ports set to `off` bind nothing; the others report their address, and the
    /// runtimes are one per thread (`PerCore`) or one shared.
    #[test]
    fn bound_ports_and_runtimes_follow_the_options() {
        let options = ServerOptions {
            listen: [127, 0, 0, 1].into(),
            memcached_port: Some(0),
            resp_port: None,
            metrics_port: Some(0),
            threads: 3,
            ..ServerOptions::default()
        };
        let bound = Bound::new(options.clone()).unwrap();
        assert!(bound.memcached_addr.is_some_and(|a| a.port() != 0));
        assert_eq!(bound.resp_addr, None);
        assert!(bound.metrics_addr.is_some());
        assert_eq!(bound.listeners.len(), 1);
        assert_eq!(bound.runtimes.len(), 3);
        let shared = ServerOptions {
            runtime: Runtime::Shared,
            ..options
        };
        assert_eq!(Bound::new(shared).unwrap().runtimes.len(), 1);
    }
}
