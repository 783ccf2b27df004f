//! `zipcache serve` flags, the TOML config file that may carry the same settings, and
//! their resolution into engine and server settings (CLI over file over defaults).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use clap::ValueEnum;

use crate::core::TlsFiles;
use crate::core::access::Credentials;
use crate::core::auth::Password;
use crate::core::cluster::{Announce, ClusterMode};
use crate::core::{
    AUTH_TIMEOUT, DEFAULT_UNIX_SOCKET_MODE, FIRST_REQUEST_TIMEOUT, Runtime, ServerOptions,
};

/// Arguments of `zipcache serve` (SPEC §8). The `--config` file is the same struct:
/// every flag may be given there under its own name; the command line wins.
#[derive(clap::Args, serde::Deserialize, Debug, Default)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long)]
    pub listen: Option<IpAddr>,
    /// memcached text/meta protocol port; 0 picks a free one, `off` serves no memcached
    /// [default: 11211].
    #[arg(long, value_name = "PORT|off")]
    pub memcached_port: Option<Port>,
    /// Redis RESP2 port; 0 picks a free one, `off` serves no RESP [default: 6379].
    #[arg(long, value_name = "PORT|off")]
    pub resp_port: Option<Port>,
    /// Serve the memcached protocols on this unix-domain socket (memcached's -s); the
    /// memcached TCP port is then off unless --memcached-port is given.
    #[arg(long, value_name = "PATH")]
    pub unix_socket: Option<PathBuf>,
    /// Permission bits of the unix socket's file, in octal (memcached's -a) [default: 0700].
    #[arg(long, value_name = "OCTAL", requires = "unix_socket")]
    pub unix_socket_mode: Option<String>,
    /// DRAM budget of the cache, e.g. 512MiB [default: 1GiB].
    #[arg(long)]
    pub dram: Option<String>,
    /// Where the SSD file and warm-restart state live [default: ./zipcache-data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Logical size of the SSD tier file [default: 8GiB].
    #[arg(long, conflicts_with = "ssd")]
    pub ssd_size: Option<String>,
    /// `none` runs DRAM-only.
    #[arg(long, value_parser = ["none"])]
    pub ssd: Option<String>,
    /// Per-4 KiB compression of the SSD: host (the host packs blocks, for ordinary drives)
    /// | hardware (a transparent-compression drive) | none | emulate (benchmarking only:
    /// physical figures emulated) [default: host].
    #[arg(long, value_parser = ["host", "hardware", "none", "emulate"])]
    pub device_compression: Option<String>,
    /// TOML file with any of these settings (kebab-case keys, `set = ["NAME=VALUE"]`).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Engine setting NAME=VALUE (repeatable), e.g. --set bypass_r=0.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    #[serde(default)]
    pub set: Vec<String>,
    /// Most simultaneous client connections [default: 4096].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// I/O threads [default: number of cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Serve Prometheus text at http://LISTEN:PORT/metrics (https with --tls-cert)
    /// [default: off].
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// The only users who may scrape /metrics: `user:password` lines (HTTP Basic; the user
    /// `default`'s password also as a Bearer token); read again on SIGHUP. Without it, no
    /// one may scrape while --requirepass or --auth-file is set.
    #[arg(long, value_name = "FILE")]
    pub metrics_auth_file: Option<PathBuf>,
    /// per-core (thread per core, connections handed to the least busy) or shared (one
    /// work-stealing runtime).
    #[arg(long, value_enum)]
    pub runtime: Option<Runtime>,
    /// RESP clients must AUTH with this password (user `default`) [default: none].
    #[arg(long)]
    pub requirepass: Option<String>,
    /// memcached ascii authentication: a file of `user:password` lines (memcached's `-Y`);
    /// read again on SIGHUP.
    #[arg(long)]
    pub auth_file: Option<PathBuf>,
    /// PEM certificate chain: every TCP port (metrics too) then speaks TLS only (needs --tls-key);
    /// the TLS files are read again on SIGHUP and memcached's `refresh_certs`.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates: clients must present a certificate one of them signed.
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Most keys one RESP `KEYS` examines before it refuses (use SCAN) [default: 100000].
    #[arg(long)]
    pub keys_limit: Option<usize>,
    /// Refuse memcached's `flush_all` (`CLIENT_ERROR flush_all not allowed`, as memcached -F)
    /// and RESP `FLUSHALL`/`FLUSHDB` (`-NOPERM …`, as a Redis ACL without them).
    #[arg(long)]
    #[serde(default)]
    pub disable_flush_all: bool,
    /// Start with memcached's LRU crawler disabled (as memcached -o no_lru_crawler);
    /// `lru_crawler enable` turns it on.
    #[arg(long)]
    #[serde(default)]
    pub disable_lru_crawler: bool,
    /// Close connections idle for this many seconds, counted in `idle_kicks` (memcached
    /// `-o idle_timeout`) [default: 0 = never].
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<u64>,
    /// Close a connection whose replies the client has not read for this many seconds
    /// (it stopped reading), counted in `write_timeouts` [default: 30; 0 = never].
    #[arg(long, value_name = "SECS")]
    pub write_timeout: Option<u64>,
    /// Let memcached clients stop the server with `shutdown` (memcached `-A`).
    #[arg(long)]
    #[serde(default)]
    pub enable_shutdown: bool,
    /// Largest request a connection may send, e.g. 2MiB; larger ones get an error and
    /// the connection is closed [default: max_value_size + 256KiB].
    #[arg(long, value_name = "SIZE")]
    pub max_request_size: Option<String>,
    /// Most memory all connections' buffers may hold together; past it the connection
    /// holding the most is closed (Redis's maxmemory-clients) [default: max(64MiB, dram/8)].
    #[arg(long, value_name = "SIZE")]
    pub max_clients_memory: Option<String>,
    /// Close connections that have not completed a request this many seconds after
    /// opening, counted in `first_request_kicks` [default: 30; 0 = never].
    #[arg(long, value_name = "SECS")]
    pub first_request_timeout: Option<u64>,
    /// With --requirepass or --auth-file: close connections that have not logged in this
    /// many seconds after opening, whatever they sent, counted in `auth_timeout_kicks`
    /// [default: 10; 0 = never].
    #[arg(long, value_name = "SECS")]
    pub auth_timeout: Option<u64>,
    /// Redis Cluster on the RESP port: `emulated` (one node owning all 16384 slots, for
    /// cluster-aware clients) or `on` (a node of a fleet whose topology is pushed with
    /// CLUSTERX SETNODES or read from --cluster-config) [default: off].
    #[arg(long, value_enum)]
    pub cluster_mode: Option<ClusterMode>,
    /// With `--cluster-mode on`: a file of the fleet's topology — a `version N` line,
    /// then one CLUSTERX SETNODES line per node — read at start and on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub cluster_config: Option<PathBuf>,
    /// The IP address CLUSTER SLOTS/SHARDS/NODES name for this node [default: the one
    /// the client reached].
    #[arg(long, value_name = "IP")]
    pub cluster_announce_ip: Option<IpAddr>,
    /// The port CLUSTER SLOTS/SHARDS/NODES name for this node [default: the one the
    /// client reached].
    #[arg(long, value_name = "PORT")]
    pub cluster_announce_port: Option<u16>,
}

/// A protocol's port: a number (0 picks a free one) or `off` (`"off"` in the config file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "PortText")]
pub enum Port {
    Off,
    On(u16),
}

impl Port {
    /// The port to listen on; `None` when off.
    pub fn number(self) -> Option<u16> {
        match self {
            Port::Off => None,
            Port::On(port) => Some(port),
        }
    }
}

impl From<u16> for Port {
    fn from(port: u16) -> Port {
        Port::On(port)
    }
}

impl FromStr for Port {
    type Err = String;

    fn from_str(text: &str) -> Result<Port, String> {
        if text.eq_ignore_ascii_case("off") {
            return Ok(Port::Off);
        }
        text.parse()
            .map(Port::On)
            .map_err(|_| format!("{text:?} is neither a port number (0-65535) nor \"off\""))
    }
}

/// A port as the config file may write it: a number or a word.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum PortText {
    Number(u16),
    Word(String),
}

impl TryFrom<PortText> for Port {
    type Error = String;

    fn try_from(text: PortText) -> Result<Port, String> {
        match text {
            PortText::Number(port) => Ok(Port::On(port)),
            PortText::Word(word) => word.parse(),
        }
    }
}

/// Every setting with its effective value.
#[derive(Debug)]
pub struct Settings {
    pub listen: IpAddr,
    /// `None`: off.
    pub memcached_port: Option<u16>,
    pub resp_port: Option<u16>,
    /// memcached's protocols on this unix-domain socket, its file with these permissions.
    pub unix_socket: Option<PathBuf>,
    pub unix_socket_mode: u32,
    pub dram: u64,
    pub data_dir: PathBuf,
    /// `None` = DRAM-only.
    pub ssd_size: Option<u64>,
    pub device_compression: String,
    pub set: Vec<(String, String)>,
    pub max_connections: usize,
    pub threads: usize,
    pub metrics_port: Option<u16>,
    pub metrics_auth_file: Option<PathBuf>,
    /// The users of `metrics_auth_file`, read at start-up (and again on SIGHUP).
    pub metrics_users: Option<Arc<Credentials>>,
    pub runtime: Runtime,
    pub requirepass: Option<Password>,
    pub auth_file: Option<PathBuf>,
    pub tls: Option<TlsFiles>,
    pub keys_limit: usize,
    pub flush_all_enabled: bool,
    pub lru_crawler: bool,
    /// The users of `auth_file`, read at start-up (and again on SIGHUP, by the server).
    pub users: Option<Arc<Credentials>>,
    /// Seconds; 0 = never.
    pub idle_timeout: u64,
    /// Seconds; 0 = never.
    pub write_timeout: u64,
    pub shutdown_enabled: bool,
    /// Bytes; `None` = the server's default (`ServerOptions::max_request_size`).
    pub max_request_size: Option<u64>,
    /// Bytes; `None` = the server's default (`ServerOptions::max_clients_memory`).
    pub max_clients_memory: Option<u64>,
    /// Seconds; 0 = never.
    pub first_request_timeout: u64,
    /// Seconds; 0 = never.
    pub auth_timeout: u64,
    pub cluster_mode: ClusterMode,
    pub cluster_config: Option<PathBuf>,
    pub cluster_announce: Announce,
}

/// The users of a `user:password` file named by the flag `name`, if one is.
fn load_users(name: &str, path: Option<&Path>) -> Result<Option<Arc<Credentials>>, String> {
    path.map(|path| Credentials::load(path).map(Arc::new))
        .transpose()
        .map_err(|e| format!("--{name} {e}"))
}

fn read_file(path: &Path) -> Result<ServeArgs, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn size(name: &str, text: &str) -> Result<u64, String> {
    zipcache::parse_size(text).map_err(|e| format!("--{name}: {e}"))
}

impl Settings {
    pub fn resolve(args: ServeArgs) -> Result<Settings, String> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => ServeArgs::default(),
        };
        let runtime = args.runtime.or(file.runtime).unwrap_or(Runtime::PerCore);
        let cluster_mode = args.cluster_mode.or(file.cluster_mode).unwrap_or_default();
        let cluster_config = args.cluster_config.or(file.cluster_config);
        if cluster_config.is_some() && cluster_mode != ClusterMode::On {
            return Err("--cluster-config needs --cluster-mode on".into());
        }
        // A size on the command line overrides `ssd = "none"` in the file and vice versa.
        let ssd_none = match (&args.ssd, &args.ssd_size) {
            (Some(_), _) => true,
            (None, Some(_)) => false,
            (None, None) => match file.ssd.as_deref() {
                None => false,
                Some("none") => true,
                Some(other) => return Err(format!("ssd must be \"none\", not {other:?}")),
            },
        };
        let ssd_size = if ssd_none {
            None
        } else {
            Some(size(
                "ssd-size",
                args.ssd_size.or(file.ssd_size).as_deref().unwrap_or("8GiB"),
            )?)
        };
        let mut set = Vec::new();
        for pair in file.set.iter().chain(&args.set) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("--set {pair:?}: expected NAME=VALUE"))?;
            set.push((name.trim().to_string(), value.trim().to_string()));
        }
        let tls = match (
            args.tls_cert.or(file.tls_cert),
            args.tls_key.or(file.tls_key),
            args.tls_ca.or(file.tls_ca),
        ) {
            (None, None, None) => None,
            (Some(cert), Some(key), ca) => Some(TlsFiles { cert, key, ca }),
            _ => return Err("tls-key and tls-ca need tls-cert; tls-cert needs tls-key".into()),
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let unix_socket = args.unix_socket.or(file.unix_socket);
        if unix_socket
            .as_ref()
            .is_some_and(|path| path.as_os_str().is_empty())
        {
            return Err("unix-socket: an empty path".into());
        }
        let unix_socket_mode = match (
            &unix_socket,
            args.unix_socket_mode.or(file.unix_socket_mode),
        ) {
            (_, None) => DEFAULT_UNIX_SOCKET_MODE,
            (Some(_), Some(mode)) => octal_mode(&mode)?,
            (None, Some(_)) => return Err("unix-socket-mode needs unix-socket".into()),
        };
        // As memcached's `-s`, a unix socket takes the place of the memcached port,
        // unless that is asked for as well.
        let default_memcached_port = unix_socket.is_none().then_some(11211);
        let memcached_port = args
            .memcached_port
            .or(file.memcached_port)
            .map_or(default_memcached_port, Port::number);
        let resp_port = args
            .resp_port
            .or(file.resp_port)
            .map_or(Some(6379), Port::number);
        if memcached_port.is_none() && resp_port.is_none() && unix_socket.is_none() {
            return Err("memcached-port and resp-port are both off: turn one on".into());
        }
        let max_request_size = args.max_request_size.or(file.max_request_size);
        let max_clients_memory = args.max_clients_memory.or(file.max_clients_memory);
        let auth_file = args.auth_file.or(file.auth_file);
        let users = load_users("auth-file", auth_file.as_deref())?;
        let metrics_auth_file = args.metrics_auth_file.or(file.metrics_auth_file);
        let metrics_users = load_users("metrics-auth-file", metrics_auth_file.as_deref())?;
        Ok(Settings {
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or(IpAddr::from([127, 0, 0, 1])),
            memcached_port,
            resp_port,
            unix_socket,
            unix_socket_mode,
            dram: size("dram", args.dram.or(file.dram).as_deref().unwrap_or("1GiB"))?,
            data_dir: args
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(|| "zipcache-data".into()),
            ssd_size,
            device_compression: args
                .device_compression
                .or(file.device_compression)
                .unwrap_or_else(|| "host".into()),
            set,
            max_connections: args
                .max_connections
                .or(file.max_connections)
                .unwrap_or(4096)
                .max(1),
            threads: args.threads.or(file.threads).unwrap_or(cores).max(1),
            metrics_port: args.metrics_port.or(file.metrics_port),
            metrics_auth_file,
            metrics_users,
            runtime,
            requirepass: args
                .requirepass
                .or(file.requirepass)
                .as_deref()
                .and_then(Password::new),
            auth_file,
            tls,
            keys_limit: args.keys_limit.or(file.keys_limit).unwrap_or(100_000),
            flush_all_enabled: !(args.disable_flush_all || file.disable_flush_all),
            lru_crawler: !(args.disable_lru_crawler || file.disable_lru_crawler),
            users,
            idle_timeout: args.idle_timeout.or(file.idle_timeout).unwrap_or(0),
            write_timeout: args.write_timeout.or(file.write_timeout).unwrap_or(30),
            shutdown_enabled: args.enable_shutdown || file.enable_shutdown,
            max_request_size: max_request_size
                .map(|text| size("max-request-size", &text))
                .transpose()?,
            max_clients_memory: max_clients_memory
                .map(|text| size("max-clients-memory", &text))
                .transpose()?,
            first_request_timeout: args
                .first_request_timeout
                .or(file.first_request_timeout)
                .unwrap_or(FIRST_REQUEST_TIMEOUT.as_secs()),
            auth_timeout: args
                .auth_timeout
                .or(file.auth_timeout)
                .unwrap_or(AUTH_TIMEOUT.as_secs()),
            cluster_mode,
            cluster_config,
            cluster_announce: Announce {
                ip: args.cluster_announce_ip.or(file.cluster_announce_ip),
                port: args.cluster_announce_port.or(file.cluster_announce_port),
            },
        })
    }

    /// A loud warning when a port off the loopback interface lets anyone in: with no
    /// access policy (neither `requirepass` nor `auth-file`) and no `tls-ca` requiring
    /// client certificates (on every port), every port that is on — but the metrics port
    /// when `metrics-auth-file` names its scrapers.
    pub fn exposure_warning(&self) -> Option<String> {
        let certificates = self.tls.as_ref().is_some_and(|t| t.ca.is_some());
        if self.listen.is_loopback()
            || self.requirepass.is_some()
            || self.auth_file.is_some()
            || certificates
        {
            return None;
        }
        let metrics = self
            .metrics_port
            .filter(|_| self.metrics_auth_file.is_none());
        let protocols = [("memcached", self.memcached_port), ("RESP", self.resp_port)];
        let open: Vec<String> = protocols
            .into_iter()
            .chain([("metrics", metrics)])
            .filter_map(|(name, port)| Some(format!("{name} port {}", port?)))
            .collect();
        if open.is_empty() {
            return None;
        }
        let rule = "*".repeat(78);
        Some(format!(
            "{rule}\nWARNING: listening on {} without authentication on the {}.\nAnyone who can reach this address can read, overwrite and flush the cache.\nSet --requirepass or --auth-file (either protects every port), or --tls-ca to require\nclient certificates on the protocol ports.\n{rule}",
            self.listen,
            open.join(" and the ")
        ))
    }

    /// The engine configuration these settings describe.
    pub fn engine_config(&self) -> Result<zipcache::Config, String> {
        let mut config = zipcache::Config {
            dram_capacity: self.dram,
            ssd: self.ssd_size.map(|size| zipcache::SsdConfig {
                path: self.data_dir.join("ssd.bin"),
                size,
                direct_io: true,
                device_compression: zipcache::config::DeviceCompression::Emulate,
                logical_to_physical: 4.0,
            }),
            ..zipcache::Config::default()
        };
        if config.ssd.is_some() {
            config
                .set("device_compression", &self.device_compression)
                .map_err(|e| e.to_string())?;
        }
        for (name, value) in &self.set {
            config
                .set(name, value)
                .map_err(|e| format!("--set {name}={value}: {e}"))?;
        }
        if !self.set.iter().any(|(name, _)| name == "rss_limit") {
            config.rss_limit = default_rss_limit(config.dram_capacity);
        }
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    pub fn server_options(&self, max_value_size: usize) -> ServerOptions {
        ServerOptions {
            requirepass: self.requirepass.clone(),
            tls: self.tls.clone(),
            keys_limit: self.keys_limit,
            listen: self.listen,
            memcached_port: self.memcached_port,
            resp_port: self.resp_port,
            metrics_port: self.metrics_port,
            unix_socket: self.unix_socket.clone(),
            unix_socket_mode: self.unix_socket_mode,
            threads: self.threads,
            max_connections: self.max_connections,
            max_value_size,
            runtime: self.runtime,
            flush_all_enabled: self.flush_all_enabled,
            lru_crawler: self.lru_crawler,
            users: self.users.clone(),
            metrics_users: self.metrics_users.clone(),
            idle_timeout: seconds(self.idle_timeout),
            write_timeout: seconds(self.write_timeout),
            shutdown_enabled: self.shutdown_enabled,
            max_request_size: self.max_request_size.map(saturating_usize),
            max_clients_memory: self.max_clients_memory.map(saturating_usize),
            first_request_timeout: seconds(self.first_request_timeout),
            auth_timeout: seconds(self.auth_timeout),
            cluster_mode: self.cluster_mode,
            cluster_config: self.cluster_config.clone(),
            cluster_announce: self.cluster_announce,
            data_dir: Some(self.data_dir.clone()),
        }
    }

    /// The start-up banner: every effective setting, defaults included.
    pub fn describe(&self, config: &zipcache::Config) -> String {
        let ssd = match (self.ssd_size, &config.ssd) {
            (Some(size), Some(ssd)) => format!(
                "{} ({size} bytes logical, device-compression {:?}{}, direct-io {}, logical:physical {})",
                ssd.path.display(),
                ssd.device_compression,
                match ssd.device_compression {
                    zipcache::config::DeviceCompression::Emulate =>
                        " (benchmarking: physical figures are emulated)",
                    _ => "",
                },
                ssd.direct_io,
                ssd.logical_to_physical
            ),
            _ => "none (DRAM only)".into(),
        };
        let metrics = self.metrics_port.map_or("off".to_string(), |p| {
            let scheme = if self.tls.is_some() { "https" } else { "http" };
            let scrapers = match (
                &self.metrics_auth_file,
                self.requirepass.is_some() || self.auth_file.is_some(),
            ) {
                (Some(path), _) => format!("users of {}", path.display()),
                (None, true) => {
                    "no one (the data ports require a login: set metrics-auth-file)".into()
                }
                (None, false) => "anyone".into(),
            };
            format!(
                "{scheme}://{}:{p}/metrics, scraped by {scrapers}",
                self.listen
            )
        });
        let tls = self.tls.as_ref().map_or("off".to_string(), |tls| {
            let clients = tls.ca.as_ref().map_or("not verified".to_string(), |ca| {
                format!("certificates required, CA {}", ca.display())
            });
            format!(
                "cert {} key {} (clients: {clients})",
                tls.cert.display(),
                tls.key.display()
            )
        });
        let set_or_off = |on: bool| if on { "set" } else { "off" };
        let port = |port: Option<u16>| port.map_or("off".to_string(), |p| p.to_string());
        let options = self.server_options(config.max_value_size);
        let crash_journal = match (&config.ssd, &config.crash_journal) {
            (None, _) => "off (DRAM only)".to_string(),
            (Some(_), None) => "off: a crash restarts cold".to_string(),
            (Some(_), Some(dir)) => format!(
                "{} (shadow table {} bytes of the dram budget): a crash restarts warm",
                dir.display(),
                config.crash_journal_table_bytes()
            ),
        };
        let unix_socket = self.unix_socket.as_ref().map_or("off".to_string(), |path| {
            format!("{} (mode {:04o})", path.display(), self.unix_socket_mode)
        });
        let mut cluster = match (self.cluster_mode, self.cluster_announce) {
            (ClusterMode::Off, _) => "off".to_string(),
            (mode, Announce { ip, port }) => format!(
                "{mode:?}, announcing {} port {}",
                ip.map_or("the address reached".into(), |ip| ip.to_string()),
                port.map_or("reached".into(), |p| p.to_string())
            )
            .to_lowercase(),
        };
        if let Some(path) = &self.cluster_config {
            cluster.push_str(&format!(", topology from {}", path.display()));
        }
        format!(
            "zipcache serve settings:\n  listen           {}\n  memcached-port   {}\n  resp-port        {}\n  unix-socket      {unix_socket}\n  dram             {} bytes\n  data-dir         {}\n  ssd              {ssd}\n  crash journal    {crash_journal}\n  max-connections  {}\n  threads          {} ({} runtime)\n  metrics          {metrics}\n  tls              {tls}\n  requirepass      {}\n  auth-file        {}\n  auth-timeout     {}\n  keys-limit       {}\n  flush_all        {}\n  lru_crawler      {}\n  idle-timeout     {}\n  write-timeout    {}\n  input limits     max-request-size {} bytes, max-clients-memory {} bytes, first-request-timeout {}\n  shutdown command {}\n  cluster-mode     {cluster}\n  engine: leaf_size={} subpages={} superleaf_size={} fill_threshold={} write_buffer={} bypass_r={} bypass_max_fraction={} tiny_max={} medium_max={} max_key_size={} max_value_size={} background_threads={} promotion={:?} rss_limit={} track_access={} evictions={}",
            self.listen,
            port(self.memcached_port),
            port(self.resp_port),
            self.dram,
            self.data_dir.display(),
            self.max_connections,
            self.threads,
            self.runtime
                .to_possible_value()
                .map_or_else(String::new, |v| v.get_name().to_string()),
            set_or_off(self.requirepass.is_some()),
            self.auth_file
                .as_ref()
                .map_or("off".to_string(), |p| p.display().to_string()),
            seconds_or_off(self.auth_timeout),
            self.keys_limit,
            if self.flush_all_enabled {
                "enabled"
            } else {
                "disabled"
            },
            if self.lru_crawler {
                "enabled"
            } else {
                "disabled"
            },
            seconds_or_off(self.idle_timeout),
            seconds_or_off(self.write_timeout),
            options.max_request_size(),
            options.max_clients_memory(config.dram_capacity),
            seconds_or_off(self.first_request_timeout),
            if self.shutdown_enabled {
                "enabled"
            } else {
                "disabled"
            },
            config.leaf_size,
            config.subpages,
            config.superleaf_size,
            config.fill_threshold,
            config.write_buffer,
            config.bypass_r,
            config.bypass_max_fraction,
            config.tiny_max,
            config.medium_max,
            config.max_key_size,
            config.max_value_size,
            config.background_threads,
            config.promotion,
            config.rss_limit,
            config.track_access,
            config.evictions,
        )
    }
}

/// A file mode written in octal, as memcached's `-a` takes it (`700`, `0770`).
fn octal_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|mode| mode & !0o777 == 0)
        .ok_or_else(|| {
            format!("unix-socket-mode {text:?}: not permission bits in octal (0 to 0777)")
        })
}

/// A timeout of `secs` seconds; 0 = none.
fn seconds(secs: u64) -> Option<std::time::Duration> {
    (secs > 0).then(|| std::time::Duration::from_secs(secs))
}

fn seconds_or_off(secs: u64) -> String {
    if secs == 0 {
        "off".to_string()
    } else {
        format!("{secs} s")
    }
}

fn saturating_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// The server's RSS target (issue 10): 5% over the DRAM budget for what the allocator
/// holds beyond the engine's count, plus 24 MiB for the process itself (binary, threads,
/// connection buffers). `--set rss_limit=0` turns the governor off.
pub fn default_rss_limit(dram_capacity: u64) -> u64 {
    dram_capacity + dram_capacity / 20 + (24 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_limits_default_from_the_item_size_and_the_dram_budget() {
        let s = Settings::resolve(ServeArgs::default()).unwrap();
        assert_eq!(s.first_request_timeout, 30);
        let options = s.server_options(1 << 20);
        assert_eq!(options.max_request_size(), (1 << 20) + (256 << 10));
        assert_eq!(options.max_clients_memory(1 << 30), 128 << 20);
        assert_eq!(options.max_clients_memory(64 << 20), 64 << 20);
        assert_eq!(
            options.first_request_timeout,
            Some(std::time::Duration::from_secs(30))
        );

        let s = Settings::resolve(ServeArgs {
            max_request_size: Some("2MiB".into()),
            max_clients_memory: Some("1GiB".into()),
            first_request_timeout: Some(0),
            ..ServeArgs::default()
        })
        .unwrap();
        let options = s.server_options(1 << 20);
        assert_eq!(options.max_request_size(), 2 << 20);
        assert_eq!(options.max_clients_memory(64 << 20), 1 << 30);
        assert_eq!(options.first_request_timeout, None);
        let bad = ServeArgs {
            max_clients_memory: Some("lots".into()),
            ..ServeArgs::default()
        };
        assert!(
            Settings::resolve(bad)
                .unwrap_err()
                .contains("--max-clients-memory")
        );
    }

    #[test]
    fn defaults_follow_the_spec() {
        let s = Settings::resolve(ServeArgs::default()).unwrap();
        assert_eq!((s.memcached_port, s.resp_port), (Some(11211), Some(6379)));
        assert_eq!(s.dram, 1 << 30);
        assert_eq!(s.ssd_size, Some(8 << 30));
        assert_eq!(s.data_dir, PathBuf::from("zipcache-data"));
        assert!(s.lru_crawler, "memcached 1.6 starts its LRU crawler");
        let config = s.engine_config().unwrap();
        let ssd = config.ssd.unwrap();
        assert_eq!(ssd.path, PathBuf::from("zipcache-data/ssd.bin"));
        assert!(ssd.direct_io);
    }

    #[test]
    fn rss_limit_follows_the_dram_budget_unless_set() {
        let args = |set: &[&str]| ServeArgs {
            dram: Some("64MiB".into()),
            set: set.iter().map(|s| s.to_string()).collect(),
            ..ServeArgs::default()
        };
        let config = |set: &[&str]| {
            Settings::resolve(args(set))
                .unwrap()
                .engine_config()
                .unwrap()
        };
        // 1.05 × 64 MiB + 24 MiB = 91.2 MiB.
        assert_eq!(config(&[]).rss_limit, 95_630_131);
        assert_eq!(config(&["rss_limit=0"]).rss_limit, 0);
        assert_eq!(config(&["rss_limit=100MiB"]).rss_limit, 100 << 20);
        assert_eq!(
            config(&["dram=32MiB"]).rss_limit,
            default_rss_limit(32 << 20)
        );
    }

    #[test]
    fn command_line_overrides_the_file() {
        let dir = std::env::temp_dir().join(format!("zipcache-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.toml");
        let users = dir.join("users");
        std::fs::write(&users, "ada:lovelace\n").unwrap();
        std::fs::write(
            &file,
            format!(
                "dram = \"64MiB\"\nresp-port = 7000\nssd = \"none\"\nset = [\"bypass_r=0\"]\nruntime = \"shared\"\nthreads = 3\ndisable-flush-all = true\ndisable-lru-crawler = true\nauth-file = {:?}\n",
                users.display().to_string()
            ),
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(file),
            resp_port: Some(Port::On(7001)),
            set: vec!["write_buffer=128".into(), "track_access=true".into()],
            ..ServeArgs::default()
        };
        let s = Settings::resolve(args).unwrap();
        assert_eq!(
            (s.dram, s.resp_port, s.ssd_size),
            (64 << 20, Some(7001), None)
        );
        assert_eq!((s.runtime, s.threads), (Runtime::Shared, 3));
        assert!(!s.flush_all_enabled);
        assert!(!s.lru_crawler && !s.server_options(1).lru_crawler);
        assert!(s.users.as_ref().unwrap().check(b"ada", b"lovelace"));
        let config = s.engine_config().unwrap();
        assert_eq!((config.bypass_r, config.write_buffer), (0.0, 128));
        assert!(config.track_access);
        assert!(s.describe(&config).contains("track_access=true"));
        assert!(s.describe(&config).contains("lru_crawler      disabled"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// `idle-timeout` and `write-timeout` from the file, the command line over it, in
    /// the server's options and the banner.
    #[test]
    fn timeouts_come_from_flags_or_the_file() {
        let dir =
            std::env::temp_dir().join(format!("zipcache-settings-timeouts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(
            &file,
            "ssd = \"none\"\nidle-timeout = 5\nwrite-timeout = 7\nauth-timeout = 4\n",
        )
        .unwrap();
        let resolve = |args: ServeArgs| {
            let s = Settings::resolve(args).unwrap();
            let banner = s.describe(&s.engine_config().unwrap());
            (s.server_options(1), banner)
        };
        let secs = |n| Some(std::time::Duration::from_secs(n));
        let (options, banner) = resolve(ServeArgs {
            config: Some(file.clone()),
            ..ServeArgs::default()
        });
        assert_eq!(
            (options.idle_timeout, options.write_timeout),
            (secs(5), secs(7))
        );
        assert!(banner.contains("\n  idle-timeout     5 s\n"), "{banner}");
        assert!(banner.contains("\n  write-timeout    7 s\n"), "{banner}");
        assert_eq!(options.auth_timeout, secs(4));
        assert!(banner.contains("\n  auth-timeout     4 s\n"), "{banner}");
        let (options, banner) = resolve(ServeArgs {
            config: Some(file),
            write_timeout: Some(0),
            auth_timeout: Some(0),
            ..ServeArgs::default()
        });
        assert_eq!((options.write_timeout, options.auth_timeout), (None, None));
        assert!(banner.contains("\n  write-timeout    off\n"), "{banner}");
        let (options, banner) = resolve(ServeArgs {
            ssd: Some("none".into()),
            ..ServeArgs::default()
        });
        assert_eq!(
            (options.idle_timeout, options.write_timeout),
            (None, secs(30))
        );
        assert!(banner.contains("\n  idle-timeout     off\n"), "{banner}");
        assert!(banner.contains("\n  write-timeout    30 s\n"), "{banner}");
        assert_eq!(options.auth_timeout, secs(10));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn access_settings_come_from_flags_or_the_file() {
        let dir =
            std::env::temp_dir().join(format!("zipcache-settings-acl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(
            &file,
            "requirepass = \"from-file\"\ntls-cert = \"c.pem\"\ntls-key = \"k.pem\"\nkeys-limit = 7\n",
        )
        .unwrap();
        let s = Settings::resolve(ServeArgs {
            config: Some(file),
            ..ServeArgs::default()
        })
        .unwrap();
        assert_eq!(s.requirepass, Password::new("from-file"));
        assert_eq!(s.keys_limit, 7);
        let tls = s.tls.as_ref().unwrap();
        assert_eq!(
            (tls.cert.as_path(), tls.ca.as_ref()),
            (Path::new("c.pem"), None)
        );
        assert!(
            !s.describe(&s.engine_config().unwrap())
                .contains("from-file")
        );
        let half = ServeArgs {
            tls_key: Some("k.pem".into()),
            ..ServeArgs::default()
        };
        assert!(Settings::resolve(half).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn leaving_loopback_without_authentication_warns() {
        let exposed = |args: ServeArgs| Settings::resolve(args).unwrap().exposure_warning();
        assert_eq!(exposed(ServeArgs::default()), None);
        let anywhere = || ServeArgs {
            listen: Some(IpAddr::from([0, 0, 0, 0])),
            metrics_port: Some(9150),
            ..ServeArgs::default()
        };
        let warning = exposed(anywhere()).unwrap();
        assert!(warning.contains("WARNING") && warning.contains("--requirepass"));
        assert!(warning.contains("--auth-file"), "{warning}");
        for port in [
            "memcached port 11211",
            "RESP port 6379",
            "metrics port 9150",
        ] {
            assert!(warning.contains(port), "{port}: {warning}");
        }
        // Either source of users protects every port.
        assert_eq!(
            exposed(ServeArgs {
                requirepass: Some("pw".into()),
                ..anywhere()
            }),
            None
        );
        let users = std::env::temp_dir().join(format!("zc-users-{}", std::process::id()));
        std::fs::write(&users, "alice:secret\n").unwrap();
        let file_only = ServeArgs {
            auth_file: Some(users.clone()),
            ..anywhere()
        };
        assert_eq!(exposed(file_only), None);
        // The metrics port's own users protect it, not the data ports.
        let metrics_only = Settings::resolve(ServeArgs {
            metrics_auth_file: Some(users.clone()),
            ..anywhere()
        })
        .unwrap();
        assert!(
            metrics_only
                .metrics_users
                .as_ref()
                .unwrap()
                .check(b"alice", b"secret")
        );
        let banner = metrics_only.describe(&metrics_only.engine_config().unwrap());
        assert!(banner.contains("/metrics, scraped by users of"), "{banner}");
        let warning = metrics_only.exposure_warning().unwrap();
        assert!(warning.contains("RESP port") && !warning.contains("metrics"));
        std::fs::remove_file(users).unwrap();
        // Client certificates are required on every port, metrics included.
        let client_certificates = ServeArgs {
            tls_cert: Some("c".into()),
            tls_key: Some("k".into()),
            tls_ca: Some("ca".into()),
            ..anywhere()
        };
        assert_eq!(exposed(client_certificates), None);
        // A data login without metrics users: no one scrapes, and the banner says so.
        let s = Settings::resolve(ServeArgs {
            requirepass: Some("pw".into()),
            ..anywhere()
        })
        .unwrap();
        let banner = s.describe(&s.engine_config().unwrap());
        assert!(banner.contains("scraped by no one"), "{banner}");
        let missing = ServeArgs {
            metrics_auth_file: Some("/nonexistent/metrics-users".into()),
            ..anywhere()
        };
        let error = Settings::resolve(missing).unwrap_err();
        assert!(
            error.starts_with("--metrics-auth-file /nonexistent"),
            "{error}"
        );
        let off = ServeArgs {
            resp_port: Some(Port::Off),
            metrics_port: None,
            ..anywhere()
        };
        let warning = exposed(off).unwrap();
        assert!(warning.contains("memcached port 11211"), "{warning}");
        assert!(!warning.contains("RESP") && !warning.contains("metrics"));
    }

    #[test]
    fn a_protocol_port_can_be_off_but_not_both() {
        assert_eq!("off".parse(), Ok(Port::Off));
        assert_eq!("OFF".parse(), Ok(Port::Off));
        assert_eq!("0".parse(), Ok(Port::On(0)));
        assert_eq!("11211".parse(), Ok(Port::On(11211)));
        assert!("70000".parse::<Port>().is_err() && "no".parse::<Port>().is_err());
        let dir =
            std::env::temp_dir().join(format!("zipcache-settings-off-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(&file, "memcached-port = \"off\"\nresp-port = 7000\n").unwrap();
        let s = Settings::resolve(ServeArgs {
            config: Some(file.clone()),
            ..ServeArgs::default()
        })
        .unwrap();
        assert_eq!((s.memcached_port, s.resp_port), (None, Some(7000)));
        let options = s.server_options(1);
        assert_eq!(
            (options.memcached_port, options.resp_port),
            (None, Some(7000))
        );
        assert!(
            s.describe(&s.engine_config().unwrap())
                .contains("memcached-port   off")
        );
        let both_off = Settings::resolve(ServeArgs {
            config: Some(file.clone()),
            resp_port: Some(Port::Off),
            ..ServeArgs::default()
        })
        .unwrap_err();
        assert!(both_off.contains("both off"), "{both_off}");
        std::fs::write(&file, "memcached-port = \"of\"\n").unwrap();
        let typo = Settings::resolve(ServeArgs {
            config: Some(file),
            ..ServeArgs::default()
        })
        .unwrap_err();
        assert!(typo.contains("\"of\""), "{typo}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_unix_socket_takes_the_memcached_port_unless_both_are_asked_for() {
        let args = |memcached_port: Option<Port>, mode: Option<&str>| ServeArgs {
            unix_socket: Some("/tmp/zc.sock".into()),
            unix_socket_mode: mode.map(str::to_string),
            memcached_port,
            ..ServeArgs::default()
        };
        let s = Settings::resolve(args(None, None)).unwrap();
        assert_eq!((s.memcached_port, s.resp_port), (None, Some(6379)));
        let options = s.server_options(1);
        assert_eq!(options.unix_socket, Some(PathBuf::from("/tmp/zc.sock")));
        assert_eq!(options.unix_socket_mode, 0o700, "memcached's -a default");
        let banner = s.describe(&s.engine_config().unwrap());
        assert!(banner.contains("\n  memcached-port   off\n"), "{banner}");
        assert!(
            banner.contains("\n  unix-socket      /tmp/zc.sock (mode 0700)\n"),
            "{banner}"
        );
        let s = Settings::resolve(args(Some(Port::On(11311)), Some("0770"))).unwrap();
        assert_eq!((s.memcached_port, s.unix_socket_mode), (Some(11311), 0o770));
        let s = Settings::resolve(args(Some(Port::Off), Some("755"))).unwrap();
        assert_eq!((s.memcached_port, s.unix_socket_mode), (None, 0o755));
        let alone = ServeArgs {
            resp_port: Some(Port::Off),
            ..args(None, None)
        };
        assert!(
            Settings::resolve(alone).is_ok(),
            "the unix socket alone serves"
        );
        for bad in ["0800", "1777", "rw", ""] {
            let error = Settings::resolve(args(None, Some(bad))).unwrap_err();
            assert!(error.contains("unix-socket-mode"), "{bad}: {error}");
        }
        let no_socket = ServeArgs {
            unix_socket: None,
            ..args(None, Some("0700"))
        };
        let error = Settings::resolve(no_socket).unwrap_err();
        assert!(error.contains("needs unix-socket"), "{error}");
        let empty = ServeArgs {
            unix_socket: Some(PathBuf::new()),
            ..args(None, None)
        };
        let error = Settings::resolve(empty).unwrap_err();
        assert!(error.contains("empty path"), "{error}");
        let s = Settings::resolve(ServeArgs::default()).unwrap();
        assert_eq!(s.server_options(1).unix_socket, None);
        let banner = s.describe(&s.engine_config().unwrap());
        assert!(banner.contains("\n  unix-socket      off\n"), "{banner}");
    }

    #[test]
    fn unknown_file_keys_and_settings_are_errors() {
        let dir =
            std::env::temp_dir().join(format!("zipcache-settings-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(&file, "no-such-flag = 1\n").unwrap();
        let args = ServeArgs {
            config: Some(file),
            ..ServeArgs::default()
        };
        assert!(Settings::resolve(args).is_err());
        let args = ServeArgs {
            set: vec!["nonsense=1".into()],
            ..ServeArgs::default()
        };
        assert!(Settings::resolve(args).unwrap().engine_config().is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The banner says where the crash journal lives and what its table costs, or that
    /// a crash restarts cold.
    #[test]
    fn the_banner_names_the_crash_journal() {
        let banner = |ssd: &str, set: &[&str]| {
            let (ssd_size, ssd) = match ssd {
                "none" => (None, Some("none".to_string())),
                size => (Some(size.to_string()), None),
            };
            let s = Settings::resolve(ServeArgs {
                dram: Some("64MiB".into()),
                ssd_size,
                ssd,
                set: set.iter().map(|v| v.to_string()).collect(),
                ..ServeArgs::default()
            })
            .unwrap();
            s.describe(&s.engine_config().unwrap())
        };
        let on = banner("1GiB", &[]);
        // 64 MiB / 16 of table, and its 64-byte header.
        assert!(
            on.contains(
                "\n  crash journal    /dev/shm (shadow table 4194368 bytes of the dram budget): a crash restarts warm\n"
            ),
            "{on}"
        );
        let off = banner("1GiB", &["crash_journal=off"]);
        assert!(
            off.contains("\n  crash journal    off: a crash restarts cold\n"),
            "{off}"
        );
        let dram_only = banner("none", &[]);
        assert!(
            dram_only.contains("\n  crash journal    off (DRAM only)\n"),
            "{dram_only}"
        );
    }
}
