//! Starting and stopping the servers (memcached, memcached + extstore, redis, and
//! `zipcache serve` itself) on 127.0.0.1 with the bench's budgets. A peer is stopped by its PID when dropped, which also
//! happens on error and after Ctrl-C (the load loops stop, then everything unwinds).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a freshly started server gets to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server gets to exit after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A server process the bench started.
pub struct Peer {
    child: Child,
    pub addr: SocketAddr,
}

impl Peer {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: `pid` is our own child, not yet reaped (we hold its `Child`), so the PID
        // cannot have been reused for another process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nobody listens on right now (the kernel picks it).
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("free port: {e}"))?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

/// How to get `program`, for the error that says it is missing.
fn how_to_install(program: &str) -> &'static str {
    match program {
        "redis-server" => "apt-get install -y redis-server",
        "memcached" => "apt-get install -y memcached",
        _ => "cargo build --release -p zipcache-cli",
    }
}

fn start(program: &str, args: &[String], addr: SocketAddr, log: &Path) -> Result<Peer, String> {
    let log_file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
        .stderr(log_file)
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!("{program} is not installed: {}", how_to_install(program))
            }
            _ => format!("starting {program}: {e}"),
        })?;
    let mut peer = Peer { child, addr };
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(peer);
        }
        if let Ok(Some(status)) = peer.child.try_wait() {
            let output = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("{program} exited ({status}): {}", output.trim()));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{program} did not listen on {addr} within {START_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The file memcached's extstore keeps in `dir`.
pub fn extstore_file(dir: &Path) -> std::path::PathBuf {
    dir.join("extstore.dat")
}

/// memcached with `-m` = the DRAM budget; with `ssd`, extstore on a file of that size in
/// `dir`, tuned so small items reach flash (PEERS.md).
pub fn memcached(dram: u64, ssd: Option<u64>, dir: &Path, threads: usize) -> Result<Peer, String> {
    let port = free_port()?;
    let mut args: Vec<String> = vec![
        "-l".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string(),
        "-U".into(),
        "0".into(),
        "-m".into(),
        dram.div_ceil(1 << 20).to_string(),
        "-t".into(),
        threads.max(1).to_string(),
        "-c".into(),
        "4096".into(),
    ];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        args.extend(["-u".into(), "root".into()]);
    }
    if let Some(size) = ssd {
        let file = extstore_file(dir);
        args.extend([
            "-o".into(),
            format!(
                "ext_path={}:{}m,ext_item_size=64,slab_automove=2",
                file.display(),
                size.div_ceil(1 << 20)
            ),
        ]);
    }
    start(
        "memcached",
        &args,
        ([127, 0, 0, 1], port).into(),
        &dir.join("memcached.log"),
    )
}

/// redis with `maxmemory` = the DRAM budget, LRU over all keys, no persistence.
pub fn redis(dram: u64, dir: &Path) -> Result<Peer, String> {
    let port = free_port()?;
    let args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--maxmemory",
        &dram.to_string(),
        "--maxmemory-policy",
        "allkeys-lru",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    start(
        "redis-server",
        &args,
        ([127, 0, 0, 1], port).into(),
        &dir.join("redis.log"),
    )
}

/// `zipcache serve` (this executable's) with the budget, speaking memcached only: `dram`,
/// with `ssd` an SSD file of that size in `dir`, engine `settings`, `threads` I/O threads.
pub fn zipcache_serve(
    dram: u64,
    ssd: Option<u64>,
    settings: &[(String, String)],
    dir: &Path,
    threads: usize,
) -> Result<Peer, String> {
    zipcache_server(dram, ssd, settings, dir, threads, Serve::Memcached)
}

/// `zipcache serve` (this executable's) with the budget, speaking RESP only.
pub fn zipcache_resp(
    dram: u64,
    ssd: Option<u64>,
    settings: &[(String, String)],
    dir: &Path,
    threads: usize,
) -> Result<Peer, String> {
    zipcache_server(dram, ssd, settings, dir, threads, Serve::Resp)
}

/// How `zipcache_server` serves: memcached only, RESP only, or RESP only as a node of a
/// Redis Cluster whose topology is pushed to it (`--cluster-mode on`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serve {
    Memcached,
    Resp,
    ClusterNode,
}

/// `zipcache serve` (this executable's) with the budget: a node of a Redis Cluster
/// (`--cluster-mode on`, RESP only), its topology still to be pushed.
pub fn zipcache_cluster_node(
    dram: u64,
    ssd: Option<u64>,
    settings: &[(String, String)],
    dir: &Path,
    threads: usize,
) -> Result<Peer, String> {
    zipcache_server(dram, ssd, settings, dir, threads, Serve::ClusterNode)
}

fn zipcache_server(
    dram: u64,
    ssd: Option<u64>,
    settings: &[(String, String)],
    dir: &Path,
    threads: usize,
    serve: Serve,
) -> Result<Peer, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
    let port = free_port()?;
    let port_text = port.to_string();
    let (memcached_port, resp_port) = match serve {
        Serve::Memcached => (port_text.as_str(), "off"),
        Serve::Resp | Serve::ClusterNode => ("off", port_text.as_str()),
    };
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--listen".into(),
        "127.0.0.1".into(),
        "--memcached-port".into(),
        memcached_port.into(),
        "--resp-port".into(),
        resp_port.into(),
        "--dram".into(),
        dram.to_string(),
        "--data-dir".into(),
        dir.join("zipcache-data").display().to_string(),
        "--threads".into(),
        threads.max(1).to_string(),
    ];
    match ssd {
        Some(size) => args.extend(["--ssd-size".into(), size.to_string()]),
        None => args.extend(["--ssd".into(), "none".into()]),
    }
    for (name, value) in settings {
        args.extend(["--set".into(), format!("{name}={value}")]);
    }
    if serve == Serve::ClusterNode {
        args.extend(["--cluster-mode".into(), "on".into()]);
    }
    start(
        &exe.display().to_string(),
        &args,
        ([127, 0, 0, 1], port).into(),
        &dir.join("zipcache-serve.log"),
    )
}
