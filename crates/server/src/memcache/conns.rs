//! The open memcached connections: their ids (memcached's `cfd=` in log lines, the
//! `N:` of `stats conns`) and peers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

#[derive(Default)]
pub struct Connections {
    next_id: AtomicU64,
    /// Open connections by id, so `stats conns` lists them oldest first.
    open: Mutex<BTreeMap<u64, SocketAddr>>,
}

impl Connections {
    /// A fresh id; with a peer, the connection is listed until `close`.
    pub fn open(&self, peer: Option<SocketAddr>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(peer) = peer {
            self.table().insert(id, peer);
        }
        id
    }

    pub fn close(&self, id: u64) {
        self.table().remove(&id);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, SocketAddr>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `stats conns`: each open connection's peer and the address it reached, by id.
    /// memcached's `state` and `secs_since_last_cmd` are left out: we do not track them.
    pub fn stats(&self, listen: SocketAddr) -> Vec<(String, String)> {
        self.table()
            .iter()
            .flat_map(|(id, peer)| {
                [
                    (format!("{id}:addr"), format!("tcp:{peer}")),
                    (format!("{id}:listen_addr"), format!("tcp:{listen}")),
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
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let listen: SocketAddr = "127.0.0.1:11211".parse().unwrap();
        let a = conns.open(Some(peer));
        let detached = conns.open(None);
        let b = conns.open(Some(peer));
        assert!(a < detached && detached < b);
        let names: Vec<String> = conns.stats(listen).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            names,
            [
                format!("{a}:addr"),
                format!("{a}:listen_addr"),
                format!("{b}:addr"),
                format!("{b}:listen_addr")
            ]
        );
        assert_eq!(conns.stats(listen)[0].1, "tcp:127.0.0.1:5000");
        conns.close(a);
        assert_eq!(conns.stats(listen).len(), 2);
    }
}
