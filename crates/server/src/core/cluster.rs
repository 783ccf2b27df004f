//! Redis Cluster as this node serves it (`--cluster-mode`): which of the 16,384 hash
//! slots a key belongs to, the node's id, and the address it tells clients to reach it
//! at. Protocol-neutral: RESP's `CLUSTER` commands and its redirections read it.
//!
//! `emulated`: one node owns every slot, so cluster-aware clients (redis-py
//! `RedisCluster`, `redis-cli -c`, Jedis, lettuce, ioredis `Cluster`, go-redis) that an
//! application built for a managed Redis Cluster can use ZipCache as it is. Multi-key
//! commands still refuse keys of different slots (`-CROSSSLOT`), as every Redis Cluster
//! node does, so that an application that passes here passes on a real fleet.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use crc::{CRC_16_XMODEM, Crc};

use super::keyspace::Generations;

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

const CRC16: Crc<u16> = Crc::<u16>::new(&CRC_16_XMODEM);

/// Redis's `keyHashSlot`: CRC16/XMODEM of the key, or of its hash tag — what lies between
/// the first `{` and the first `}` after it, if that is not empty — modulo 16,384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let tag = &key[open + 1..];
            let close = tag.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &tag[..close])
        })
        .unwrap_or(key);
    CRC16.checksum(hashed) % SLOTS
}

/// How the RESP port takes part in a Redis Cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMode {
    /// A plain Redis server: `CLUSTER` answers that cluster support is disabled.
    #[default]
    Off,
    /// One node owning all 16,384 slots.
    Emulated,
}

/// What `--cluster-announce-ip` and `--cluster-announce-port` set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Announce {
    pub ip: Option<IpAddr>,
    pub port: Option<u16>,
}

/// This node of a cluster.
#[derive(Debug)]
pub struct Cluster {
    pub mode: ClusterMode,
    /// 40 hex digits, as Redis names its nodes.
    pub id: String,
    announce: Announce,
    generations: Arc<Generations>,
}

/// The file in the data directory that keeps a cluster node's id across restarts.
const NODE_ID_FILE: &str = "cluster-node-id";

impl Cluster {
    /// This node; in a cluster mode its id is the one kept in `data_dir` (made and kept
    /// there on the first start), as a Redis node keeps its id in `nodes.conf`: clients
    /// and controllers know a node by it.
    pub fn new(mode: ClusterMode, announce: Announce, data_dir: Option<&Path>) -> Cluster {
        let id = match data_dir.filter(|_| mode != ClusterMode::Off) {
            Some(dir) => kept_node_id(dir).unwrap_or_else(|e| {
                let id = new_node_id();
                eprintln!(
                    "zipcache: cannot keep the cluster node id in {}: {e}; this run's id is {id}",
                    dir.display()
                );
                id
            }),
            None => new_node_id(),
        };
        Cluster {
            mode,
            id,
            announce,
            generations: Arc::default(),
        }
    }

    /// Each slot's generation, which the keyspace stores keys under.
    pub fn generations(&self) -> Arc<Generations> {
        self.generations.clone()
    }

    pub fn enabled(&self) -> bool {
        self.mode != ClusterMode::Off
    }

    /// The address a client is told to reach this node at: the announced one where set,
    /// else the address and port the client's own connection reached (`local`), else
    /// (a unix-socket client) the listening address and `resp_port`.
    pub fn address(&self, local: Option<SocketAddr>, listen: IpAddr, resp_port: u16) -> SocketAddr {
        let reached = local.unwrap_or(SocketAddr::new(listen, resp_port));
        SocketAddr::new(
            self.announce.ip.unwrap_or(reached.ip()),
            self.announce.port.unwrap_or(reached.port()),
        )
    }
}

/// The id kept in `dir`, or a new one written there (to a temporary file, synced, then
/// renamed, so a crash or a power cut never leaves half an id). A file that does not
/// hold 40 hex digits is an error, not replaced: an operator's copy of another node's
/// directory must not be silently renamed.
fn kept_node_id(dir: &Path) -> std::io::Result<String> {
    let path = dir.join(NODE_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            if id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(id.to_ascii_lowercase())
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} does not hold a node id (40 hex digits)", path.display()),
                ))
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            let id = new_node_id();
            let temporary = dir.join(format!("{NODE_ID_FILE}.new"));
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(format!("{id}\n").as_bytes())?;
            // On disk before the name: a power cut must not leave an empty id file, which
            // every later start would refuse.
            file.sync_all()?;
            std::fs::rename(&temporary, &path)?;
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// A fresh node id: 160 random bits in hex, as `redis-server` makes them.
fn new_node_id() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 20];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        // No system randomness: the id still has to differ between nodes of one host.
        let seed = std::process::id() as u128
            ^ std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos());
        bytes[..16].copy_from_slice(&seed.to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots `redis-server` 7.0 answered to `CLUSTER KEYSLOT` (`CRATES.md`), hash tags
    /// included: the first `{…}` counts only if it is not empty.
    #[test]
    fn slots_are_those_redis_computes() {
        for (key, slot) in [
            (&b"foo"[..], 12182),
            (b"{user1}.x", 8106),
            (b"user1", 8106),
            (b"123456789", 12739),
            (b"", 0),
            (b"{}foo", 9500),
            (b"foo{}{bar}", 8363),
            (b"foo{{bar}}zap", 4015),
            (b"{bar", 4015),
            (b"foo{bar}{zap}", 5061),
            (b"bar", 5061),
        ] {
            assert_eq!(key_slot(key), slot, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn node_ids_are_forty_hex_digits_and_differ() {
        let (a, b) = (new_node_id(), new_node_id());
        assert_eq!(a.len(), 40);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn the_announced_address_wins_over_the_one_reached() {
        let reached: SocketAddr = "10.0.0.7:7000".parse().unwrap();
        let listen = IpAddr::from([0, 0, 0, 0]);
        let plain = Cluster::new(ClusterMode::Emulated, Announce::default(), None);
        assert_eq!(plain.address(Some(reached), listen, 6379), reached);
        assert_eq!(
            plain.address(None, IpAddr::from([127, 0, 0, 1]), 6379),
            "127.0.0.1:6379".parse().unwrap()
        );
        let announced = Cluster::new(
            ClusterMode::Emulated,
            Announce {
                ip: Some(IpAddr::from([192, 0, 2, 1])),
                port: Some(30001),
            },
            None,
        );
        assert_eq!(
            announced.address(Some(reached), listen, 6379),
            "192.0.2.1:30001".parse().unwrap()
        );
    }

    /// A node keeps its id across restarts in its data directory; another directory is
    /// another node; a damaged file is reported, not replaced; off, nothing is written.
    #[test]
    fn a_node_keeps_its_id_in_its_data_directory() {
        let base = std::env::temp_dir().join(format!("zipcache-node-id-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let node = |dir: &str| {
            Cluster::new(
                ClusterMode::Emulated,
                Announce::default(),
                Some(&base.join(dir)),
            )
            .id
        };
        let first = node("a");
        assert_eq!(node("a"), first, "the same directory, the same node");
        assert_ne!(node("b"), first);
        std::fs::create_dir_all(base.join("c")).unwrap();
        std::fs::write(base.join("c").join(NODE_ID_FILE), "not an id").unwrap();
        assert!(kept_node_id(&base.join("c")).is_err());
        assert_eq!(
            std::fs::read_to_string(base.join("c").join(NODE_ID_FILE)).unwrap(),
            "not an id",
            "left as it was"
        );
        Cluster::new(ClusterMode::Off, Announce::default(), Some(&base.join("d")));
        assert!(!base.join("d").exists(), "off: nothing kept");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
