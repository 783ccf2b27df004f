//! Shared by the integration tests: an in-process server on ephemeral loopback ports,
//! external tools found or failed loudly, and child processes stopped by PID.
#![allow(dead_code)] // each test binary uses its own subset

pub mod certificates;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zipcache::{Config, ZipCache};
use zipcache_server::{ServerHandle, ServerOptions, start};

pub struct TestServer {
    handle: Option<ServerHandle>,
    /// The engine behind the server, to check what landed where.
    pub cache: Arc<ZipCache>,
    pub memcached: SocketAddr,
    pub resp: SocketAddr,
}

impl TestServer {
    /// Ports come from `free_port`, not `bind(0)`: a kernel-chosen port could be one
    /// that `free_port` just handed to an external server of a parallel test, which would
    /// then fail to bind while `wait_for_port` mistook us for it.
    pub fn start() -> TestServer {
        TestServer::with_options(TestServer::options())
    }

    /// What `start` uses: two threads, both protocols on fresh ports.
    pub fn options() -> ServerOptions {
        ServerOptions {
            threads: 2,
            memcached_port: Some(free_port()),
            resp_port: Some(free_port()),
            ..ServerOptions::default()
        }
    }

    pub fn with_options(options: ServerOptions) -> TestServer {
        let config = Config {
            dram_capacity: 256 << 20,
            ..Config::default()
        };
        TestServer::on_engine(config, options)
    }

    /// A server over an engine of this configuration (an SSD tier, a small DRAM).
    pub fn on_engine(config: Config, options: ServerOptions) -> TestServer {
        let cache = Arc::new(ZipCache::open(config).expect("open the engine"));
        TestServer::serving(cache, options)
    }

    /// `start`'s server over an engine the test configured.
    pub fn on(cache: Arc<ZipCache>) -> TestServer {
        TestServer::serving(cache, TestServer::options())
    }

    /// A server of these options over an engine the test configured.
    pub fn on_with(cache: Arc<ZipCache>, options: ServerOptions) -> TestServer {
        TestServer::serving(cache, options)
    }

    fn serving(cache: Arc<ZipCache>, options: ServerOptions) -> TestServer {
        let handle = start(cache.clone(), options).expect("start the server");
        TestServer {
            cache,
            memcached: handle.memcached_addr.expect("memcached port"),
            resp: handle.resp_addr.expect("resp port"),
            handle: Some(handle),
        }
    }

    pub fn handle(&self) -> &ServerHandle {
        self.handle.as_ref().expect("running")
    }

    pub fn stop(mut self) {
        self.handle.take().expect("running").shutdown();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.shutdown();
        }
    }
}

/// The path of an external tool, or a failure naming the package that provides it.
pub fn require_tool(name: &str, package: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("`{name}` is not installed: install the {package} package (the project's test script does)")
    })
}

/// A child process killed by its PID when dropped.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a tool run to completion printed, and whether it succeeded.
pub struct ToolRun {
    pub ok: bool,
    /// What is parsed: tools print warnings (npm about an unknown `.npmrc` key, redis-cli
    /// about `-a`) on stderr, and those must not leak into their answer.
    pub stdout: String,
    /// For error messages, and for what a tool reports only there (a refused login).
    pub stderr: String,
}

impl std::fmt::Display for ToolRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }
}

/// Runs a tool to completion with a time limit.
pub fn run_tool(command: &mut Command, limit: Duration) -> ToolRun {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tool");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    match status {
        Some(status) => ToolRun {
            ok: status.success(),
            stdout,
            stderr,
        },
        None => ToolRun {
            ok: false,
            stdout,
            stderr: format!("timed out after {limit:?}\n{stderr}"),
        },
    }
}

/// A loopback port that was free a moment ago (for tools that cannot take port 0),
/// never the same one twice in this test binary: tests run in parallel, and the kernel
/// may hand a just-released port to the next `bind(0)`.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// Waits until something accepts connections on `port`.
pub fn wait_for_port(port: u16, limit: Duration) {
    // While nothing listens on an ephemeral-range port, a connect can pick that very
    // port as its source and connect to itself (TCP simultaneous open): not a server.
    let listening = || {
        TcpStream::connect(("127.0.0.1", port))
            .is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
    };
    let started = Instant::now();
    while !listening() {
        assert!(
            started.elapsed() < limit,
            "nothing listens on port {port} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A line-oriented test client, over TCP or a unix-domain socket.
pub struct Client<S = TcpStream> {
    reader: BufReader<S>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Client {
            reader: BufReader::new(stream),
        }
    }

    /// The client's own address (a server's `rip`/`rport` for it).
    pub fn local_addr(&self) -> SocketAddr {
        self.reader.get_ref().local_addr().expect("local address")
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.reader.get_ref().peer_addr().expect("peer address")
    }
}

impl Client<UnixStream> {
    pub fn unix(path: &Path) -> Client<UnixStream> {
        let stream = UnixStream::connect(path).expect("connect to the unix socket");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Client {
            reader: BufReader::new(stream),
        }
    }
}

impl<S: Read + Write> Client<S> {
    pub fn send(&mut self, bytes: &[u8]) {
        self.reader.get_mut().write_all(bytes).expect("send");
    }

    /// One reply line, without its line ending.
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("read");
        line.trim_end_matches(['\r', '\n']).to_string()
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        self.reader.read_exact(&mut buf).expect("read");
        buf
    }

    /// Sends `request` and returns the next `lines` reply lines.
    pub fn ask(&mut self, request: &str, lines: usize) -> Vec<String> {
        self.send(request.as_bytes());
        (0..lines).map(|_| self.line()).collect()
    }

    /// Reply lines up to (without) the `END` that closes a listing such as `stats`.
    pub fn until_end(&mut self) -> Vec<String> {
        std::iter::from_fn(|| Some(self.line()))
            .take_while(|line| line != "END")
            .collect()
    }

    /// `stats [section]` as a map of name to value.
    pub fn stats(&mut self, section: &str) -> std::collections::HashMap<String, String> {
        self.send(format!("stats{section}\r\n").as_bytes());
        self.until_end()
            .into_iter()
            .map(|line| {
                let mut fields = line.splitn(3, ' ');
                match (fields.next(), fields.next(), fields.next()) {
                    (Some("STAT"), Some(name), Some(value)) => {
                        (name.to_string(), value.to_string())
                    }
                    _ => panic!("not a stats line: {line:?}"),
                }
            })
            .collect()
    }

    /// True once the server has closed the connection (reads EOF).
    pub fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        self.reader.read_to_end(&mut rest).is_ok()
    }
}

pub fn py_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

/// Checks the python modules the client tests import, naming the pip package if missing.
pub fn require_python_modules(modules: &[(&str, &str)]) {
    require_tool("python3", "python3");
    for (module, package) in modules {
        let ok = Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "python module `{module}` is missing: pip install {package}"
        );
    }
}

/// `hex` extended to at least `len` characters with the hex of an xorshift stream seeded
/// by `state`: values about as compressible as real ones, so most keys leave DRAM.
pub fn hash_hex(mut state: u64, mut hex: String, len: usize) -> String {
    while hex.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        hex.push_str(&format!(
            "{:016x}",
            state.wrapping_mul(0x2545_F491_4F6C_DD1D)
        ));
    }
    hex
}

/// `GET /metrics` over `stream` with these extra header lines: the status line and the
/// body.
pub fn scrape_over<S: Read + Write>(
    mut stream: S,
    headers: &str,
) -> std::io::Result<(String, String)> {
    write!(stream, "GET /metrics HTTP/1.0\r\n{headers}\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, body.to_string()))
}

/// `GET /metrics` over plain HTTP to `server`'s metrics port.
pub fn scrape(server: &TestServer, headers: &str) -> std::io::Result<(String, String)> {
    let addr = server.handle().metrics_addr.expect("metrics port");
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    scrape_over(stream, headers)
}

/// Where `npm install -g MODULE` (the test script) put node modules, checked to hold
/// `module`: the `NODE_PATH` of a node client.
pub fn node_modules(module: &str) -> String {
    require_tool("node", "nodejs");
    require_tool("npm", "npm");
    let npm = run_tool(
        Command::new("npm").args(["root", "-g"]),
        Duration::from_secs(60),
    );
    assert!(npm.ok, "npm root -g failed: {npm}");
    let root = npm.stdout.trim().to_string();
    assert!(
        Path::new(&root).join(module).is_dir(),
        "{module} is not installed in {root} (`npm root -g`): npm install -g {module} (the project's test script does)"
    );
    root
}
