//! The open memcached connections: their ids (memcached's `cfd=` in log lines, the
//! `N:` of `stats conns`) and peers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::transport::Peer;

/// What a unix-socket client's `addr` reads: memcached's text for a peer without an
/// address (`get_conn_text` given family 0).
const UNIX_CLIENT_ADDR: &str = "?:<AF 0>";

#[derive(Default)]
pub struct Connections {
    next_id: AtomicU64,
    /// Open connections by id, so `stats conns` lists them oldest first.
    open: Mutex<BTreeMap<u64, Peer>>,
}

impl Connections {
    /// A fresh id; with a peer, the connection is listed until `close`.
    pub fn open(&self, peer: Option<Peer>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(peer) = peer {
            self.table().insert(id, peer);
        }
        id
    }

    pub fn close(&self, id: u64) {
        self.table().remove(&id);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Peer>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `stats conns`: each open connection's peer and the address it reached — the TCP
    /// port `listen`, or the unix socket `unix_socket` — by id, as memcached words them.
    /// memcached's `state` and `secs_since_last_cmd` are left out: we do not track them.
    pub fn stats(&self, listen: SocketAddr, unix_socket: Option<&Path>) -> Vec<(String, String)> {
        let unix_listen = unix_socket.map_or(String::new(), |path| path.display().to_string());
        self.table()
            .iter()
            .flat_map(|(id, peer)| {
                let (addr, listen_addr) = match peer {
                    Peer::Tcp(peer) => (format!("tcp:{peer}"), format!("tcp:{listen}")),
                    Peer::Unix => (UNIX_CLIENT_ADDR.to_string(), format!("unix:{unix_listen}")),
                };
                [
                    (format!("{id}:addr"), addr),
                    (format!("{id}:listen_addr"), listen_addr),
                ]
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_connections_are_listed_by_id_until_closed() {
        let conns = Connections::default();
        let peer = Peer::Tcp("127.0.0.1:5000".parse().unwrap());
        let listen: SocketAddr = "127.0.0.1:11211".parse().unwrap();
        let a = conns.open(Some(peer));
        let detached = conns.open(None);
        let b = conns.open(Some(peer));
        assert!(a < detached && detached < b);
        let names: Vec<String> = conns
            .stats(listen, None)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            names,
            [
                format!("{a}:addr"),
                format!("{a}:listen_addr"),
                format!("{b}:addr"),
                format!("{b}:listen_addr")
            ]
        );
        assert_eq!(conns.stats(listen, None)[0].1, "tcp:127.0.0.1:5000");
        conns.close(a);
        assert_eq!(conns.stats(listen, None).len(), 2);
    }

    #[test]
    fn a_unix_socket_client_is_listed_as_memcached_lists_it() {
        let conns = Connections::default();
        let listen: SocketAddr = "127.0.0.1:11211".parse().unwrap();
        let id = conns.open(Some(Peer::Unix));
        let socket = Path::new("/run/zipcache/mc.sock");
        assert_eq!(
            conns.stats(listen, Some(socket)),
            [
                (format!("{id}:addr"), "?:<AF 0>".to_string()),
                (
                    format!("{id}:listen_addr"),
                    "unix:/run/zipcache/mc.sock".to_string()
                )
            ]
        );
    }
}
