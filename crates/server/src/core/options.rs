//! What the server is told to serve and how: the options every layer reads.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::access::Credentials;
use super::auth::Password;
use super::cluster::{Announce, ClusterMode};

/// How long a new connection may take to send its first complete request.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a new connection may take to log in, when the access policy requires it.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Room a request may take beyond the largest value: memcached's longest retrieval line
/// (a `get` of many keys).
pub const REQUEST_LINE_MAX: usize = 256 * 1024;
/// memcached's `-a` default: only the server's own user may connect to the unix socket.
pub const DEFAULT_UNIX_SOCKET_MODE: u32 = 0o700;
/// The least `max_clients_memory` defaults to, and the share of the DRAM budget it
/// defaults to above that.
const MIN_CLIENTS_MEMORY: usize = 64 << 20;
const CLIENTS_MEMORY_DRAM_SHARE: u64 = 8;

/// The PEM files TLS is configured from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate this CA signed.
    pub ca: Option<PathBuf>,
}

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
    /// memcached's `-s`: its protocols are served on this unix-domain socket too.
    pub unix_socket: Option<PathBuf>,
    /// The socket file's permission bits (memcached's `-a`).
    pub unix_socket_mode: u32,
    pub threads: usize,
    pub max_connections: usize,
    /// The engine's value size limit (memcached rejects larger values before reading them).
    pub max_value_size: usize,
    pub runtime: Runtime,
    /// The `default` user's password: clients of every port must log in first (see
    /// [`AccessPolicy`]).
    pub requirepass: Option<Password>,
    /// Every TCP port speaks TLS: both protocol ports and the metrics port.
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
    /// Connections that have not logged in this long after they opened are closed,
    /// whatever they sent, and counted in `auth_timeout_kicks`; only while the access
    /// policy requires a login. `None` = never.
    pub auth_timeout: Option<Duration>,
    /// The only users who may scrape `/metrics` (`--metrics-auth-file`); without them,
    /// no one may when the data ports require a login.
    pub metrics_users: Option<Arc<Credentials>>,
    /// How the RESP port takes part in a Redis Cluster (`core/cluster.rs`).
    pub cluster_mode: ClusterMode,
    /// With `on`: the topology file read at start and on SIGHUP (`--cluster-config`).
    pub cluster_config: Option<PathBuf>,
    /// The address `CLUSTER SLOTS` and the others name for this node, where set.
    pub cluster_announce: Announce,
    /// Where the server keeps what it persists of its own (a cluster node's id); `None`
    /// keeps nothing.
    pub data_dir: Option<PathBuf>,
}

impl ServerOptions {
    pub fn max_request_size(&self) -> usize {
        self.max_request_size
            .unwrap_or(self.max_value_size + REQUEST_LINE_MAX)
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
            unix_socket: None,
            unix_socket_mode: DEFAULT_UNIX_SOCKET_MODE,
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
            auth_timeout: Some(AUTH_TIMEOUT),
            metrics_users: None,
            cluster_mode: ClusterMode::Off,
            cluster_config: None,
            cluster_announce: Announce::default(),
            data_dir: None,
        }
    }
}
