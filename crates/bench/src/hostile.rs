//! `zipcache bench hostile`: the long form of the adversarial suite (issue 20). It starts
//! `zipcache serve` (64 MiB DRAM + a 1 GiB SSD file by default), runs well-behaved clients
//! (look-aside GET/SET, half memcached, half RESP, every value derived from its key and
//! checked) beside hostile ones (amplified multi-gets, a 200,000-key `MGET`, slowloris
//! partial requests, oversized declared lengths, connection churn, large-value readers
//! that never read their replies), samples the server's RSS once a second, and writes
//! `rss.csv`, `rss.png` and `summary.json`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use plotters::chart::SeriesLabelPosition;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::plot::{Chart, Series, line_chart};
use crate::procfs::rss_bytes;

#[derive(clap::Args, Debug, Clone)]
pub struct HostileArgs {
    /// Well-behaved client connections (each one request at a time).
    #[arg(long, default_value_t = 1000)]
    pub clients: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 600.0)]
    pub duration: f64,
    /// Pause of a well-behaved client between two requests, in ms.
    #[arg(long, default_value_t = 10)]
    pub think_ms: u64,
    /// Keys of the well-behaved clients (ids 0..N-1).
    #[arg(long, default_value_t = 100_000)]
    pub keys: usize,
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Hostile connections of each kind (slowloris: 50 × this).
    #[arg(long, default_value_t = 2)]
    pub hostile: usize,
    /// How many times an amplified multi-get names the 1 MiB key.
    #[arg(long, default_value_t = 1500)]
    pub amplify: usize,
    /// Keys of the hostile `MGET`.
    #[arg(long, default_value_t = 200_000)]
    pub mget_keys: usize,
    /// 1 MiB values `big0`… that each large-value reader asks for in one `get`.
    #[arg(long, default_value_t = 64)]
    pub large_values: usize,
    /// Connections of each large-value reader (each `get big0 … bigN` never read).
    #[arg(long, default_value_t = 50)]
    pub large_readers: usize,
    /// The server's `--dram`.
    #[arg(long, default_value = "64MiB")]
    pub dram: String,
    /// The server's `--ssd-size`.
    #[arg(long, default_value = "1GiB")]
    pub ssd_size: String,
    /// The zipcache binary to start (default: this one).
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// Where rss.csv, rss.png, summary.json and the server's data and logs go.
    #[arg(long, default_value = "hostile-run")]
    pub out: PathBuf,
}

/// The value of `key` (lowercase letters from a generator seeded by the key): any reply
/// can be checked against it, and LZ4 gains little on it.
pub fn value_of(key: &[u8], len: usize) -> Vec<u8> {
    let mut state = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            b'a' + (state % 26) as u8
        })
        .collect()
}

/// A RESP multi-bulk request.
pub fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// What the run measured.
#[derive(Serialize, Debug, Default)]
pub struct Summary {
    pub clients: usize,
    pub seconds: f64,
    pub ops: u64,
    pub errors: u64,
    pub wrong_values: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub peak_rss_bytes: u64,
    /// Whether the server answered to the end (its process never disappeared).
    pub server_alive: bool,
    /// The server's exit after SIGTERM: "exit status: 0" when clean.
    pub stop: String,
    pub hostile_requests: u64,
}

/// How long a SIGTERM may take to stop the server: a clean close writes 64 MiB of DRAM
/// to the SSD in seconds.
const STOP_LIMIT: Duration = Duration::from_secs(60);

/// `zipcache serve` started for the run, killed by PID if the run fails before `stop`.
struct ServerProcess {
    child: Child,
    memcached: String,
    resp: String,
    reaped: bool,
}

impl ServerProcess {
    fn start(args: &HostileArgs, dir: &Path) -> Result<ServerProcess, String> {
        let bin = match &args.server_bin {
            Some(bin) => bin.clone(),
            None => std::env::current_exe().map_err(|e| format!("this executable: {e}"))?,
        };
        let file =
            |name: &str| std::fs::File::create(dir.join(name)).map_err(|e| format!("{name}: {e}"));
        let max_connections = (args.clients + 200 * args.hostile.max(1) + 1024).to_string();
        let child = Command::new(&bin)
            .arg("serve")
            .args(["--listen", "127.0.0.1", "--memcached-port", "0"])
            .args(["--resp-port", "0", "--max-connections", &max_connections])
            .args(["--dram", &args.dram, "--ssd-size", &args.ssd_size])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .stdin(Stdio::null())
            .stdout(file("server.out")?)
            .stderr(file("server.err")?)
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let mut server = ServerProcess {
            child,
            memcached: String::new(),
            resp: String::new(),
            reaped: false,
        };
        let started = Instant::now();
        loop {
            let banner = std::fs::read_to_string(dir.join("server.out")).unwrap_or_default();
            if let Some(line) = banner.lines().find(|l| l.starts_with("listening ")) {
                let addr = |name: &str| {
                    line.split(' ')
                        .find_map(|f| f.strip_prefix(name))
                        .map(str::to_string)
                        .ok_or_else(|| format!("no {name} in {line:?}"))
                };
                server.memcached = addr("memcached=")?;
                server.resp = addr("resp=")?;
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                server.reaped = true;
                let err = std::fs::read_to_string(dir.join("server.err")).unwrap_or_default();
                return Err(format!("the server exited ({status}): {err}"));
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err("the server did not listen within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, signal: libc::c_int) {
        if !self.reaped {
            // SAFETY: our own child, not yet reaped, so the PID names no other process.
            unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        }
    }

    /// SIGTERM, then up to `STOP_LIMIT` for the clean close (it writes DRAM to the SSD);
    /// a server still running then is killed (`Drop`) and reported.
    fn stop(&mut self) -> String {
        self.signal(libc::SIGTERM);
        let started = Instant::now();
        while started.elapsed() < STOP_LIMIT {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.reaped = true;
                return status.to_string();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        format!("still running {STOP_LIMIT:?} after SIGTERM (killed)")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// The counters every task adds to.
#[derive(Default)]
struct Tally {
    ops: AtomicU64,
    errors: AtomicU64,
    wrong: AtomicU64,
    hostile: AtomicU64,
}

/// Runs `zipcache bench hostile`.
pub fn run(args: &HostileArgs) -> Result<(), String> {
    let summary = hostile(args)?;
    println!(
        "hostile run: {} clients for {:.0} s: {} ops, {} errors, {} wrong values, p50 {} µs, \
         p99 {} µs, max {} µs; peak RSS {:.1} MiB; server alive {}; stop: {}; {} hostile requests",
        summary.clients,
        summary.seconds,
        summary.ops,
        summary.errors,
        summary.wrong_values,
        summary.p50_us,
        summary.p99_us,
        summary.max_us,
        summary.peak_rss_bytes as f64 / (1 << 20) as f64,
        summary.server_alive,
        summary.stop,
        summary.hostile_requests
    );
    if summary.wrong_values > 0 || !summary.server_alive {
        return Err(format!(
            "{} wrong values, server alive: {}",
            summary.wrong_values, summary.server_alive
        ));
    }
    Ok(())
}

/// The run itself: start, fill, load, sample, stop, report.
pub fn hostile(args: &HostileArgs) -> Result<Summary, String> {
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let _ = std::fs::remove_dir_all(args.out.join("data"));
    let mut server = ServerProcess::start(args, &args.out)?;
    let pid = server.child.id();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (latency, samples) = runtime.block_on(async {
        fill(&server.memcached, args).await?;
        let mut hostile = Vec::new();
        for _ in 0..args.hostile {
            for attack in ATTACKS {
                let (args, tally, stop) = (args.clone(), tally.clone(), stop.clone());
                let addrs = (server.memcached.clone(), server.resp.clone());
                hostile.push(tokio::spawn(async move {
                    attack(addrs, args, tally, stop).await
                }));
            }
        }
        let clients: Vec<_> = (0..args.clients)
            .map(|id| {
                let addr = if id % 2 == 0 {
                    &server.memcached
                } else {
                    &server.resp
                };
                let client = Client {
                    id,
                    addr: addr.clone(),
                    resp: id % 2 == 1,
                    keys: args.keys,
                    value_size: args.value_size,
                    think: Duration::from_millis(args.think_ms),
                };
                let (tally, stop) = (tally.clone(), stop.clone());
                tokio::spawn(async move { client.run(&tally, &stop).await })
            })
            .collect();
        let samples = sample_rss(pid, Duration::from_secs_f64(args.duration)).await;
        stop.store(true, Ordering::Relaxed);
        // Every client ends within a request's timeout and a think time of `stop`.
        let deadline = tokio::time::Instant::now() + 2 * REQUEST_TIMEOUT;
        let mut latency = Histogram::<u64>::new(3).expect("histogram");
        for client in clients {
            if let Ok(Ok(h)) = tokio::time::timeout_at(deadline, client).await {
                latency.add(h).expect("same bounds");
            }
        }
        for task in hostile {
            task.abort();
        }
        Ok::<_, String>((latency, samples))
    })?;
    runtime.shutdown_timeout(Duration::from_secs(5));
    let alive = samples.last().is_some_and(|s| s.1.is_some());
    let stopped = server.stop();
    write_rss(&args.out, &samples)?;
    let summary = Summary {
        clients: args.clients,
        seconds: args.duration,
        ops: tally.ops.load(Ordering::Relaxed),
        errors: tally.errors.load(Ordering::Relaxed),
        wrong_values: tally.wrong.load(Ordering::Relaxed),
        p50_us: latency.value_at_quantile(0.5),
        p99_us: latency.value_at_quantile(0.99),
        max_us: latency.max(),
        peak_rss_bytes: samples.iter().filter_map(|s| s.1).max().unwrap_or(0),
        server_alive: alive,
        stop: stopped,
        hostile_requests: tally.hostile.load(Ordering::Relaxed),
    };
    let json = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("summary.json"), json).map_err(|e| format!("summary: {e}"))?;
    Ok(summary)
}

/// Stores every well-behaved key, the 1 MiB value `big` and the large-value readers'
/// 1 MiB values, pipelined.
async fn fill(addr: &str, args: &HostileArgs) -> Result<(), String> {
    let err = |e: std::io::Error| format!("fill: {e}");
    let mut conn = BufReader::new(TcpStream::connect(addr).await.map_err(err)?);
    let mut request = Vec::new();
    for key in std::iter::once("big".to_string()).chain((0..args.large_values).map(large_key)) {
        let big = value_of(key.as_bytes(), 1 << 20);
        request.extend_from_slice(format!("set {key} 0 0 {} noreply\r\n", big.len()).as_bytes());
        request.extend_from_slice(&big);
        request.extend_from_slice(b"\r\n");
    }
    for batch in (0..args.keys).collect::<Vec<_>>().chunks(2000) {
        for &i in batch {
            let key = key_name(i);
            let head = format!("set {key} 0 0 {} noreply\r\n", args.value_size);
            request.extend_from_slice(head.as_bytes());
            request.extend_from_slice(&value_of(key.as_bytes(), args.value_size));
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"mn\r\n");
        conn.get_mut().write_all(&request).await.map_err(err)?;
        request.clear();
        let mut line = String::new();
        while !line.starts_with("MN") {
            line.clear();
            if conn.read_line(&mut line).await.map_err(err)? == 0 {
                return Err("fill: the server closed the connection".into());
            }
        }
    }
    Ok(())
}

fn key_name(i: usize) -> String {
    format!("k:{i:08}")
}

fn large_key(i: usize) -> String {
    format!("big{i}")
}

/// (seconds since start, RSS) once a second for `duration`; `None` once the process is
/// gone.
async fn sample_rss(pid: u32, duration: Duration) -> Vec<(f64, Option<u64>)> {
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while started.elapsed() <= duration {
        tick.tick().await;
        let rss = rss_bytes(pid);
        samples.push((started.elapsed().as_secs_f64(), rss));
        if rss.is_none() {
            break;
        }
    }
    samples
}

fn write_rss(out: &Path, samples: &[(f64, Option<u64>)]) -> Result<(), String> {
    let mut csv = String::from("seconds,rss_bytes\n");
    for (t, rss) in samples {
        let rss = rss.map_or(String::new(), |r| r.to_string());
        csv.push_str(&format!("{t:.1},{rss}\n"));
    }
    std::fs::write(out.join("rss.csv"), csv).map_err(|e| format!("rss.csv: {e}"))?;
    let series = [Series {
        label: "zipcache serve RSS".into(),
        points: samples
            .iter()
            .filter_map(|(t, rss)| rss.map(|r| (*t, r as f64 / (1 << 20) as f64)))
            .collect(),
    }];
    line_chart(
        &out.join("rss.png"),
        &Chart {
            title: "RSS under the hostile run",
            x_label: "seconds",
            y_label: "RSS (MiB)",
            series: &series,
            markers: false,
            legend_at: SeriesLabelPosition::UpperLeft,
        },
    )
}

// ---------------------------------------------------------------------------------------
// Well-behaved clients.

/// How long a well-behaved request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

struct Client {
    id: usize,
    addr: String,
    resp: bool,
    keys: usize,
    value_size: usize,
    think: Duration,
}

type Conn = BufReader<TcpStream>;

enum Outcome {
    Right,
    Wrong,
}

impl Client {
    /// Look-aside until `stop`: GET a key; a miss is filled by a SET. Returns the
    /// latencies in µs.
    async fn run(self, tally: &Tally, stop: &AtomicBool) -> Histogram<u64> {
        let mut latency = Histogram::<u64>::new(3).expect("histogram");
        let mut conn: Option<Conn> = None;
        let mut state = (self.id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        while !stop.load(Ordering::Relaxed) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let key = key_name(state as usize % self.keys);
            let started = Instant::now();
            let outcome = match conn.as_mut() {
                Some(c) => timeout(REQUEST_TIMEOUT, self.look_aside(c, &key)).await,
                // A server too busy to accept leaves a connect waiting for SYN retries.
                None => match timeout(REQUEST_TIMEOUT, TcpStream::connect(&self.addr)).await {
                    Ok(Ok(stream)) => {
                        let _ = stream.set_nodelay(true);
                        conn = Some(BufReader::new(stream));
                        continue;
                    }
                    Ok(Err(e)) => Ok(Err(e)),
                    Err(elapsed) => Err(elapsed),
                },
            };
            let _ = latency.record(started.elapsed().as_micros() as u64);
            match outcome {
                Ok(Ok(Outcome::Right)) => {
                    tally.ops.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Ok(Outcome::Wrong)) => {
                    tally.wrong.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    tally.errors.fetch_add(1, Ordering::Relaxed);
                    conn = None;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            tokio::time::sleep(self.think).await;
        }
        latency
    }

    async fn look_aside(&self, conn: &mut Conn, key: &str) -> std::io::Result<Outcome> {
        let expected = value_of(key.as_bytes(), self.value_size);
        let got = if self.resp {
            conn.get_mut()
                .write_all(&resp_command(&[b"GET", key.as_bytes()]))
                .await?;
            let line = read_line(conn).await?;
            match line.strip_prefix('$').and_then(|n| n.parse::<i64>().ok()) {
                Some(-1) => None,
                Some(len) if len >= 0 => Some(payload(conn, len as usize).await?),
                _ => return Err(bad(&line)),
            }
        } else {
            conn.get_mut()
                .write_all(format!("get {key}\r\n").as_bytes())
                .await?;
            let line = read_line(conn).await?;
            if line == "END" {
                None
            } else {
                let len = line
                    .strip_prefix(&format!("VALUE {key} "))
                    .and_then(|rest| rest.split(' ').nth(1))
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| bad(&line))?;
                let value = payload(conn, len).await?;
                let end = read_line(conn).await?;
                if end != "END" {
                    return Err(bad(&end));
                }
                Some(value)
            }
        };
        match got {
            Some(value) if value == expected => Ok(Outcome::Right),
            Some(_) => Ok(Outcome::Wrong),
            // A cache may forget: fill the miss as a look-aside client does.
            None => {
                let stored = if self.resp {
                    let set = resp_command(&[b"SET", key.as_bytes(), &expected]);
                    conn.get_mut().write_all(&set).await?;
                    read_line(conn).await? == "+OK"
                } else {
                    let mut set = format!("set {key} 0 0 {}\r\n", expected.len()).into_bytes();
                    set.extend_from_slice(&expected);
                    set.extend_from_slice(b"\r\n");
                    conn.get_mut().write_all(&set).await?;
                    read_line(conn).await? == "STORED"
                };
                if stored {
                    Ok(Outcome::Right)
                } else {
                    Err(bad("a refused SET"))
                }
            }
        }
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("unexpected {what:?}"),
    )
}

async fn read_line(conn: &mut Conn) -> std::io::Result<String> {
    let mut line = String::new();
    if conn.read_line(&mut line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    line.truncate(line.trim_end_matches(['\r', '\n']).len());
    Ok(line)
}

async fn payload(conn: &mut Conn, len: usize) -> std::io::Result<Vec<u8>> {
    let mut data = vec![0; len + 2];
    conn.read_exact(&mut data).await?;
    data.truncate(len);
    Ok(data)
}

// ---------------------------------------------------------------------------------------
// Hostile clients: each loops until `stop`, reconnecting whenever it is disconnected.

type Addrs = (String, String);
type Attack = fn(
    Addrs,
    HostileArgs,
    Arc<Tally>,
    Arc<AtomicBool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

const ATTACKS: [Attack; 6] = [
    |a, args, t, s| Box::pin(amplified(a, args, t, s)),
    |a, args, t, s| Box::pin(huge_mget(a, args, t, s)),
    |a, args, t, s| Box::pin(slowloris(a, args, t, s)),
    |a, args, t, s| Box::pin(oversized(a, args, t, s)),
    |a, args, t, s| Box::pin(churn(a, args, t, s)),
    |a, args, t, s| Box::pin(large_readers(a, args, t, s)),
];

/// Sends `request` on a new connection and reads what comes back until the server is
/// quiet for 2 s or closes.
async fn send_and_drain(addr: &str, request: &[u8]) {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        tokio::time::sleep(Duration::from_millis(100)).await;
        return;
    };
    if stream.write_all(request).await.is_err() {
        return;
    }
    let mut sink = vec![0; 1 << 16];
    while let Ok(Ok(n)) = timeout(Duration::from_secs(2), stream.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
}

/// memcached `get big ×N` and RESP `MGET big ×N`, in turn.
async fn amplified((mc, resp): Addrs, args: HostileArgs, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let get = format!("get{}\r\n", " big".repeat(args.amplify)).into_bytes();
    let mut mget: Vec<&[u8]> = vec![b"MGET"];
    mget.extend(std::iter::repeat_n(&b"big"[..], args.amplify));
    let mget = resp_command(&mget);
    while !stop.load(Ordering::Relaxed) {
        send_and_drain(&mc, &get).await;
        send_and_drain(&resp, &mget).await;
        tally.hostile.fetch_add(2, Ordering::Relaxed);
    }
}

/// RESP `MGET` of `--mget-keys` well-behaved keys.
async fn huge_mget((_, resp): Addrs, args: HostileArgs, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let keys: Vec<String> = (0..args.mget_keys)
        .map(|i| key_name(i % args.keys))
        .collect();
    let mut mget: Vec<&[u8]> = vec![b"MGET"];
    mget.extend(keys.iter().map(|k| k.as_bytes()));
    let mget = resp_command(&mget);
    drop(keys);
    while !stop.load(Ordering::Relaxed) {
        send_and_drain(&resp, &mget).await;
        tally.hostile.fetch_add(1, Ordering::Relaxed);
    }
}

/// 50 connections (each protocol in turn) that send the start of a request and then a
/// byte a second; reopened when closed.
async fn slowloris((mc, resp): Addrs, _: HostileArgs, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let mut conns: Vec<Option<TcpStream>> = (0..50).map(|_| None).collect();
    while !stop.load(Ordering::Relaxed) {
        for (i, slot) in conns.iter_mut().enumerate() {
            let ok = match slot {
                Some(stream) => stream.write_all(b"x").await.is_ok(),
                None => {
                    let (addr, start): (&str, &[u8]) = if i % 2 == 0 {
                        (&mc, b"set slow 0 0 100000\r\n")
                    } else {
                        (&resp, b"*3\r\n$3\r\nSET\r\n$4\r\nslow\r\n$100000\r\n")
                    };
                    match TcpStream::connect(addr).await {
                        Ok(mut stream) => {
                            let ok = stream.write_all(start).await.is_ok();
                            *slot = Some(stream);
                            tally.hostile.fetch_add(1, Ordering::Relaxed);
                            ok
                        }
                        Err(_) => false,
                    }
                }
            };
            if !ok {
                *slot = None;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Declared lengths over every limit, with 32 MiB of the data sent after them.
async fn oversized((mc, resp): Addrs, _: HostileArgs, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let filler = vec![b'x'; 1 << 20];
    while !stop.load(Ordering::Relaxed) {
        for (addr, head) in [
            (&mc, &b"set huge 0 0 2000000000\r\n"[..]),
            (
                &resp,
                &b"*3\r\n$3\r\nSET\r\n$4\r\nhuge\r\n$2000000000\r\n"[..],
            ),
            (
                &resp,
                &b"*3\r\n$3\r\nSET\r\n$4\r\nhuge\r\n$16000000\r\n"[..],
            ),
        ] {
            let Ok(mut stream) = TcpStream::connect(addr.as_str()).await else {
                continue;
            };
            let mut sent = stream.write_all(head).await.is_ok();
            for _ in 0..32 {
                sent = sent
                    && timeout(Duration::from_secs(2), stream.write_all(&filler))
                        .await
                        .is_ok_and(|r| r.is_ok());
            }
            tally.hostile.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Connect, one request, close, as fast as the server accepts.
async fn churn((mc, _): Addrs, _: HostileArgs, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(mut stream) = TcpStream::connect(mc.as_str()).await {
            let _ = stream.write_all(b"get k:00000001\r\n").await;
        }
        tally.hostile.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `--large-readers` connections each sending `get big0 … bigN` (every large value once)
/// and reading nothing: every value is a BT_LO extent the server reads into a buffer of
/// its own. Held 5 s, then all closed and opened again.
async fn large_readers(
    (mc, _): Addrs,
    args: HostileArgs,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let keys: Vec<String> = (0..args.large_values).map(large_key).collect();
    let request = format!("get {}\r\n", keys.join(" ")).into_bytes();
    while !stop.load(Ordering::Relaxed) {
        let mut held = Vec::with_capacity(args.large_readers);
        for _ in 0..args.large_readers {
            if let Ok(Ok(mut stream)) =
                timeout(Duration::from_secs(2), TcpStream::connect(&mc)).await
                && timeout(Duration::from_secs(2), stream.write_all(&request))
                    .await
                    .is_ok_and(|sent| sent.is_ok())
            {
                held.push(stream);
                tally.hostile.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(held);
    }
}
