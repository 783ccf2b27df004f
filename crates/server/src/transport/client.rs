//! A client's connection between the listener that accepts it and the runtime thread
//! that serves it: handed from one reactor to another, or refused over the limit.

use std::io;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream as StdUnixStream;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

/// A client's connection, as a listener accepts it (`Accepted`) and as it is handed to
/// the runtime thread that serves it (`Handed`).
pub enum Client<Tcp, Unix> {
    Tcp(Tcp, SocketAddr),
    Unix(Unix),
}

pub type Accepted = Client<TcpStream, UnixStream>;
pub(super) type Handed = Client<std::net::TcpStream, StdUnixStream>;

impl Accepted {
    /// Out of the accepting thread's reactor, to be registered with another.
    pub(super) fn into_std(self) -> io::Result<Handed> {
        Ok(match self {
            Client::Tcp(stream, peer) => Client::Tcp(stream.into_std()?, peer),
            Client::Unix(stream) => Client::Unix(stream.into_std()?),
        })
    }

    /// Tells a client over the connection limit why it is dropped, in its own protocol,
    /// without waiting on it. A TLS client is closed without a word: plain text would
    /// not reach it (a unix socket never speaks TLS).
    pub(super) fn reject(self, message: &[u8], tls: bool) {
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
    pub(super) fn into_tokio(self) -> io::Result<Accepted> {
        Ok(match self {
            Client::Tcp(stream, peer) => Client::Tcp(TcpStream::from_std(stream)?, peer),
            Client::Unix(stream) => Client::Unix(UnixStream::from_std(stream)?),
        })
    }
}
