//! The protocol-neutral core of the server: the engine handle, the options, the counters
//! and the access policy — what every protocol and the transport read, and what imports
//! nothing of theirs.

pub mod access;
pub mod auth;
pub mod cluster;
pub mod cursors;
pub mod hashes;
pub mod keyspace;
mod options;
pub mod slot;
pub mod stats;
mod sweep;
pub mod topology;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;
use zipcache::ZipCache;

pub use options::{
    AUTH_TIMEOUT, DEFAULT_UNIX_SOCKET_MODE, FIRST_REQUEST_TIMEOUT, REQUEST_LINE_MAX, Runtime,
    ServerOptions, TlsFiles,
};

use access::AccessPolicy;
use stats::Counters;

/// Facts about the running server that `stats settings`, INFO and CONFIG GET report.
#[derive(Clone, Debug)]
pub struct ServerInfo {
    pub listen: IpAddr,
    pub memcached_port: u16,
    pub resp_port: u16,
    /// The unix-domain socket memcached's protocols are served on, and its mode.
    pub unix_socket: Option<PathBuf>,
    pub unix_socket_mode: u32,
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
            unix_socket: None,
            unix_socket_mode: DEFAULT_UNIX_SOCKET_MODE,
            threads: 1,
            max_connections: 1,
        }
    }
}

/// What every connection of every protocol and thread shares.
pub struct Core {
    /// The engine as clients' keys reach it; `keys.engine()` for what names no key.
    pub keys: keyspace::Keyspace,
    /// The same keys as the memcached ports see them: a hash is absent.
    pub strings: keyspace::Keyspace,
    /// The RESP port's hashes: their ids and locks.
    pub hashes: hashes::Hashes,
    /// Where each SCAN and HSCAN cursor handed out stands.
    pub cursors: cursors::Cursors,
    pub counters: Counters,
    pub info: ServerInfo,
    pub max_value: usize,
    /// Who may use the server, on the data ports.
    pub access: AccessPolicy,
    /// Who may scrape `/metrics`: only the users of `--metrics-auth-file`.
    pub metrics_access: AccessPolicy,
    pub started: Instant,
    /// False answers memcached's `flush_all` and RESP's `FLUSHALL` with a refusal.
    pub flush_all_enabled: bool,
    pub shutdown_enabled: bool,
    /// A client's `shutdown`: whoever runs the server (`run`) waits on it as on a signal.
    pub shutdown_requested: Arc<Notify>,
    /// This node of a Redis Cluster (`--cluster-mode`).
    pub cluster: cluster::Cluster,
}

impl Core {
    pub fn new(cache: Arc<ZipCache>, info: ServerInfo, options: &ServerOptions) -> Core {
        let cluster = cluster::Cluster::new(
            options,
            std::net::SocketAddr::new(info.listen, info.resp_port),
            &cache,
        );
        let keys = keyspace::Keyspace::new(cache, cluster.generations());
        cluster.start_sweeping(&keys);
        Core {
            strings: keys.strings_only(),
            cursors: cursors::Cursors::new(keys.engine().run_epoch()),
            keys,
            hashes: hashes::Hashes::default(),
            counters: Counters::default(),
            info,
            max_value: options.max_value_size,
            access: AccessPolicy::new(options.requirepass.clone(), options.users.clone()),
            metrics_access: AccessPolicy::new(None, options.metrics_users.clone()),
            started: Instant::now(),
            flush_all_enabled: options.flush_all_enabled,
            shutdown_enabled: options.shutdown_enabled,
            shutdown_requested: Arc::new(Notify::new()),
            cluster,
        }
    }
}
