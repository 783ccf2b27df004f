//! The adversarial suite (issue 20, "Measure and test"): each test starts a real
//! `zipcache serve` process on 127.0.0.1 (ports picked by the server, a temporary data
//! directory, an SSD tier), mounts one attack against it and checks three things:
//!
//! * the server's RSS (`/proc/PID/status` VmRSS, sampled every 10 ms during the attack)
//!   stays within the attack's stated bound above the baseline measured just before it,
//!   and under 256 MiB overall;
//! * a well-behaved client on the same server (memcached and RESP connections, values
//!   derived from their keys) gets only correct answers meanwhile, each within 1 s or,
//!   on a machine busy enough that its requests were slow before the attack, within a
//!   multiple of its slowest request then;
//! * SIGTERM still stops the server cleanly (exit 0, the index files written) and the next
//!   start is warm (every key stored before the attack reads back).
//!
//! The controls (same harness, no amplification) show that the bounds leave room for
//! honest traffic. One server is under attack at a time ([`Attacked`]): the tests of this
//! file run in parallel threads, and attacks beside each other would measure each
//! other's load (a well-behaved SET took 5.5 s on a busy machine that way).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use zipcache::stats::rss_bytes;
use zipcache_bench::hostile::{resp_command, value_of};

mod common;
use common::{Server, test_dir};

const MIB: u64 = 1 << 20;
/// The ceiling for the whole server, whatever the attack.
const OVERALL_RSS: u64 = 256 * MIB;
/// Where the sampler kills a server that an attack has run away with, so one failing test
/// cannot take the shared machine's memory (its report then says so).
const RUNAWAY_RSS: u64 = 2048 * MIB;
/// The bound for one connection's output: the largest item + 1 MiB.
const PER_CONNECTION: u64 = 2 * MIB;
/// What RSS moves by without any attack: the well-behaved client's traffic, the 1 MiB
/// value decoded once and its reply, the allocator keeping freed pages for a while
/// (mimalloc purges after a delay) and the background merges. The controls measure it
/// (`control_*` tests pass within `PER_CONNECTION + SLACK`).
const SLACK: u64 = 6 * MIB;
/// Every request of the well-behaved client must be answered within this (generous: the
/// machine is shared and noisy; the p99 target is 100 ms)...
const REQUEST_LATENCY: Duration = Duration::from_secs(1);
/// ... or within this many times its slowest request before the attack, where that is
/// longer: on a machine busy with other work every request is slower, attack or not.
const LATENCY_OVER_BASELINE: u32 = 20;
/// Keys stored before every attack and read back after the restart.
const WARM_KEYS: usize = 200;
const WARM_VALUE: usize = 300;
/// The DRAM budget of the servers under attack (the issue's).
const DRAM: &str = "64MiB";

fn warm_key(i: usize) -> String {
    format!("warm:{i:05}")
}

// ---------------------------------------------------------------------------------------
// The server process and its RSS.

/// Taken by every test for its whole run, so that one server is under attack at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A server for one test, which holds [`ONE_AT_A_TIME`] until it ends.
struct Attacked {
    server: Server,
    _alone: MutexGuard<'static, ()>,
}

impl Deref for Attacked {
    type Target = Server;

    fn deref(&self) -> &Server {
        &self.server
    }
}

/// `zipcache serve` on free loopback ports with a fresh data dir `name`, `dram` of
/// DRAM and an SSD tier.
fn start(name: &str, dram: &str) -> Attacked {
    start_with(name, dram, &[])
}

/// As [`start`], with `extra` flags.
fn start_with(name: &str, dram: &str, extra: &[&str]) -> Attacked {
    // A test that failed leaves the lock poisoned; the next one still runs alone.
    let alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = test_dir("adversarial", name);
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1",
        "--memcached-port",
        "0",
        "--resp-port",
        "0",
        "--dram",
        dram,
        "--ssd-size",
        "512MiB",
        // Emulated device compression costs zlib CPU the 2-core CI machine lacks and
        // changes nothing an attack reaches.
        "--device-compression",
        "none",
        "--threads",
        "2",
        // The engine's background dictionary training (zstd's FASTCOVER trainer, in C,
        // on glibc's malloc) peaks ~12 MiB above the baseline whenever the well-behaved
        // client's writes fill its reservoir (`strace -k -e mmap`: 4 MiB + 2 MiB + 4 MiB
        // tables per training), whatever any client does: measured apart, it would
        // stand in for what an attack costs.
        "--set",
        "dictionaries=false",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    Attacked {
        server: Server::spawn(dir, args),
        _alone: alone,
    }
}

/// SIGTERM stops the server with exit 0 and the warm-restart index files; the next
/// start uses them (they are deleted when an open loads them) and serves every key
/// stored before the attack. Removes its directory.
fn stop_cleanly_and_restart_warm(mut server: Server) {
    let status = server.stop();
    assert!(
        status.success(),
        "the server did not exit cleanly on SIGTERM ({status}): {}",
        server.log()
    );
    let index = server.data().join("ssd.bin.index");
    assert!(
        index.exists(),
        "no {} after a clean stop: the next start would be cold",
        index.display()
    );
    let mut again = Server::spawn(server.dir.clone(), server.args.clone());
    assert!(
        !again.data().join("ssd.bin.index").exists(),
        "the restart did not load the index files"
    );
    let mut conn = Conn::open(again.memcached).expect("connect after restart");
    for i in 0..WARM_KEYS {
        let key = warm_key(i);
        let got = conn.mc_get(&key).expect("get after restart");
        assert_eq!(
            got.as_deref(),
            Some(&value_of(key.as_bytes(), WARM_VALUE)[..]),
            "{key} after the restart: the start was not warm"
        );
    }
    drop(conn);
    let status = again.stop();
    assert!(status.success(), "second stop: {status}: {}", again.log());
}

/// The server's RSS sampled every 10 ms on a thread, until `finish`.
struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: JoinHandle<bool>,
}

impl RssSampler {
    fn start(server: &Server) -> RssSampler {
        let pid = server.pid();
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(server.rss()));
        let (stop_flag, peak_seen) = (stop.clone(), peak.clone());
        let thread = thread::spawn(move || {
            while !stop_flag.load(Ordering::Relaxed) {
                let Some(rss) = rss_bytes(pid) else {
                    return false;
                };
                peak_seen.fetch_max(rss, Ordering::Relaxed);
                if rss > RUNAWAY_RSS {
                    // SAFETY: as `Server::signal`: our unreaped child.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                    return true;
                }
                thread::sleep(Duration::from_millis(10));
            }
            false
        });
        RssSampler { stop, peak, thread }
    }

    /// The peak RSS, and whether the sampler had to kill the server.
    fn finish(self) -> (u64, bool) {
        self.stop.store(true, Ordering::Relaxed);
        let killed = self.thread.join().expect("sampler");
        (self.peak.load(Ordering::Relaxed), killed)
    }
}

// ---------------------------------------------------------------------------------------
// Talking to the server.

/// One client connection; every read has a timeout, so a stalled server fails a test
/// rather than hanging it.
struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        stream.set_write_timeout(Some(Duration::from_secs(20)))?;
        Ok(Conn {
            reader: BufReader::with_capacity(256 << 10, stream),
        })
    }

    fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.reader.get_mut().write_all(bytes)
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut line = Vec::new();
        if self.reader.read_until(b'\n', &mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(String::from_utf8_lossy(&line)
            .trim_end_matches(['\r', '\n'])
            .to_string())
    }

    fn exact(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0; n];
        self.reader.read_exact(&mut buf)?;
        Ok(buf)
    }

    /// A payload of `len` bytes and its CRLF.
    fn payload(&mut self, len: usize) -> std::io::Result<Vec<u8>> {
        let mut data = self.exact(len + 2)?;
        data.truncate(len);
        Ok(data)
    }

    fn mc_set(&mut self, key: &str, value: &[u8]) -> std::io::Result<String> {
        let mut request = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
        self.send(&request)?;
        self.line()
    }

    /// The value of one `VALUE` block whose line was just read, checked for `key`.
    fn mc_value(&mut self, line: &str, key: &str) -> std::io::Result<Vec<u8>> {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields[..] {
            ["VALUE", k, _, len] if k == key => match len.parse() {
                Ok(len) => self.payload(len),
                Err(_) => Err(invalid(format!("bad length in {line:?}"))),
            },
            _ => Err(invalid(format!("expected VALUE {key}, got {line:?}"))),
        }
    }

    fn mc_get(&mut self, key: &str) -> std::io::Result<Option<Vec<u8>>> {
        self.send(format!("get {key}\r\n").as_bytes())?;
        let line = self.line()?;
        if line == "END" {
            return Ok(None);
        }
        let value = self.mc_value(&line, key)?;
        match self.line()?.as_str() {
            "END" => Ok(Some(value)),
            other => Err(invalid(format!("expected END, got {other:?}"))),
        }
    }

    fn resp(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        self.send(&resp_command(args))
    }

    /// A bulk reply (`None` for a nil).
    fn resp_bulk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let line = self.line()?;
        match line.strip_prefix('$').map(str::parse::<i64>) {
            Some(Ok(-1)) => Ok(None),
            Some(Ok(len)) if len >= 0 => Ok(Some(self.payload(len as usize)?)),
            _ => Err(invalid(format!("expected a bulk reply, got {line:?}"))),
        }
    }

    /// The element count of an array reply.
    fn resp_array(&mut self) -> std::io::Result<usize> {
        let line = self.line()?;
        line.strip_prefix('*')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| invalid(format!("expected an array, got {line:?}")))
    }
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

/// Stores `count` keys `prefix{i:07}` with values of `len` bytes (`value_of`), pipelined
/// with `noreply` in batches, each batch confirmed by `mn`.
fn fill(server: &Server, prefix: &str, count: usize, len: usize) {
    let mut conn = Conn::open(server.memcached).expect("connect to fill");
    for batch in (0..count).collect::<Vec<_>>().chunks(2000) {
        let mut request = Vec::new();
        for &i in batch {
            let key = format!("{prefix}{i:07}");
            request.extend_from_slice(format!("set {key} 0 0 {len} noreply\r\n").as_bytes());
            request.extend_from_slice(&value_of(key.as_bytes(), len));
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"mn\r\n");
        conn.send(&request).expect("fill");
        assert_eq!(conn.line().expect("fill"), "MN", "filling {prefix}");
    }
}

/// The keys read back after the restart.
fn store_warm_keys(server: &Server) {
    let mut conn = Conn::open(server.memcached).expect("connect");
    for i in 0..WARM_KEYS {
        let key = warm_key(i);
        let reply = conn
            .mc_set(&key, &value_of(key.as_bytes(), WARM_VALUE))
            .expect("set");
        assert_eq!(reply, "STORED", "{key}");
    }
}

// ---------------------------------------------------------------------------------------
// The well-behaved client.

#[derive(Default)]
struct Behaviour {
    requests: u64,
    /// Every correct answer: when its request started, what it was, and how long it took.
    answered: Vec<(Instant, String, Duration)>,
    failures: Vec<String>,
}

impl Behaviour {
    /// The slowest answer to a request started before `at`.
    fn slowest_before(&self, at: Instant) -> Duration {
        self.answered
            .iter()
            .filter(|(started, ..)| *started < at)
            .map(|(.., took)| *took)
            .max()
            .unwrap_or_default()
    }

    /// The slowest answer to a request started from `at` on.
    fn slowest_from(&self, at: Instant) -> Duration {
        self.answered
            .iter()
            .filter(|(started, ..)| *started >= at)
            .map(|(.., took)| *took)
            .max()
            .unwrap_or_default()
    }

    /// The answers to requests started from `at` on that took longer than `limit`.
    fn slower_from(&self, at: Instant, limit: Duration) -> Vec<String> {
        self.answered
            .iter()
            .filter(|(started, _, took)| *started >= at && *took > limit)
            .map(|(_, what, took)| format!("{what} took {took:?}"))
            .collect()
    }
}

/// Connections of a well-behaved client: two memcached, two RESP (so that, with the
/// server's two threads, some share a thread with the attacker), each doing a SET of a
/// fresh key and a GET of it, and a GET of a warm key, one request at a time.
struct WellBehaved {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Behaviour>>,
}

impl WellBehaved {
    fn start(server: &Server) -> WellBehaved {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [
            (server.memcached, false),
            (server.memcached, false),
            (server.resp, true),
            (server.resp, true),
        ]
        .into_iter()
        .enumerate()
        .map(|(id, (addr, resp))| {
            let stop = stop.clone();
            thread::spawn(move || behave(id, addr, resp, &stop))
        })
        .collect();
        WellBehaved { stop, threads }
    }

    fn finish(self) -> Behaviour {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Behaviour::default();
        for thread in self.threads {
            let one = thread.join().expect("well-behaved client");
            all.requests += one.requests;
            all.answered.extend(one.answered);
            all.failures.extend(one.failures);
        }
        all
    }
}

fn behave(id: usize, addr: SocketAddr, resp: bool, stop: &AtomicBool) -> Behaviour {
    let mut seen = Behaviour::default();
    let mut conn = match Conn::open(addr) {
        Ok(conn) => conn,
        Err(e) => {
            seen.failures.push(format!("client {id}: connect: {e}"));
            return seen;
        }
    };
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let fresh = format!("good:{id}:{n}");
        let fresh_value = value_of(fresh.as_bytes(), 100 + n % 400);
        let warm = warm_key(n % WARM_KEYS);
        let warm_value = value_of(warm.as_bytes(), WARM_VALUE);
        let steps: [(&str, Option<&[u8]>); 3] = [
            ("set", None),
            ("get fresh", Some(&fresh_value)),
            ("get warm", Some(&warm_value)),
        ];
        for (what, expected) in steps {
            let key = if what == "get warm" { &warm } else { &fresh };
            let started = Instant::now();
            let outcome = match (what, resp) {
                ("set", false) => conn.mc_set(&fresh, &fresh_value).map(|r| r == "STORED"),
                ("set", true) => conn
                    .resp(&[b"SET", fresh.as_bytes(), &fresh_value])
                    .and_then(|()| conn.line())
                    .map(|r| r == "+OK"),
                (_, false) => conn.mc_get(key).map(|v| v.as_deref() == expected),
                (_, true) => conn
                    .resp(&[b"GET", key.as_bytes()])
                    .and_then(|()| conn.resp_bulk())
                    .map(|v| v.as_deref() == expected),
            };
            let took = started.elapsed();
            seen.requests += 1;
            match outcome {
                Ok(true) => {
                    let request = format!("client {id}: {what} {fresh}");
                    seen.answered.push((started, request, took));
                }
                Ok(false) => seen
                    .failures
                    .push(format!("client {id}: {what} {fresh}: WRONG answer")),
                Err(e) => {
                    seen.failures
                        .push(format!("client {id}: {what} {fresh}: {e} after {took:?}"));
                    return seen;
                }
            }
        }
        n += 1;
        thread::sleep(Duration::from_millis(2));
    }
    seen
}

// ---------------------------------------------------------------------------------------
// The harness: baseline, attack, verdict.

/// What an attack may cost, and why.
struct Bound {
    /// Most the server's RSS may grow above the baseline during the attack.
    above_baseline: u64,
    why: &'static str,
}

/// Runs `attack` against `server` while sampling its RSS and running the well-behaved
/// client, then checks the bound, the client's answers and (after) a clean stop and a
/// warm restart. The attack returns an error for a wrong reply it saw or a reply that
/// never came (never for being disconnected: a server may close an abusive connection).
fn under_attack(
    attacked: Attacked,
    bound: Bound,
    attack: impl FnOnce(&Server) -> Result<(), String>,
) {
    let server = &attacked.server;
    store_warm_keys(server);
    let good = WellBehaved::start(server);
    // The baseline includes the well-behaved client's own traffic and whatever the fill
    // left to merge.
    thread::sleep(Duration::from_millis(500));
    let baseline = server.rss();
    let sampler = RssSampler::start(server);
    let started = Instant::now();
    let attack_result = attack(server);
    let attack_time = started.elapsed();
    // The well-behaved client runs a little past the attack: a stall it caused shows.
    thread::sleep(Duration::from_millis(300));
    let mut behaviour = good.finish();
    let (peak, killed) = sampler.finish();
    let slowest_before = behaviour.slowest_before(started);
    let latency = REQUEST_LATENCY.max(slowest_before * LATENCY_OVER_BASELINE);
    behaviour
        .failures
        .extend(behaviour.slower_from(started, latency));
    eprintln!(
        "baseline RSS {:.1} MiB, peak {:.1} MiB (+{:.1} MiB; bound +{:.1} MiB: {}); attack {attack_time:?}; \
         well-behaved: {} requests, slowest {:?} before the attack (latency bound {latency:?}), \
         slowest {:?} during it, {} failures",
        baseline as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        peak.saturating_sub(baseline) as f64 / MIB as f64,
        bound.above_baseline as f64 / MIB as f64,
        bound.why,
        behaviour.requests,
        slowest_before,
        behaviour.slowest_from(started),
        behaviour.failures.len(),
    );
    assert!(
        !killed,
        "the server's RSS passed {} MiB and the test killed it (baseline {} MiB)",
        RUNAWAY_RSS / MIB,
        baseline / MIB
    );
    if let Err(e) = attack_result {
        panic!("the attacker's request failed: {e}");
    }
    assert!(
        behaviour.failures.is_empty(),
        "the well-behaved client failed {} times, first: {:?}",
        behaviour.failures.len(),
        &behaviour.failures[..behaviour.failures.len().min(5)]
    );
    assert!(
        behaviour.requests > 0,
        "the well-behaved client sent nothing"
    );
    assert!(
        peak <= baseline + bound.above_baseline,
        "RSS grew by {:.1} MiB (baseline {:.1} MiB, peak {:.1} MiB), more than the bound of {:.1} MiB ({})",
        (peak - baseline) as f64 / MIB as f64,
        baseline as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        bound.above_baseline as f64 / MIB as f64,
        bound.why
    );
    assert!(
        peak <= OVERALL_RSS,
        "RSS reached {:.1} MiB, over the overall {} MiB",
        peak as f64 / MIB as f64,
        OVERALL_RSS / MIB
    );
    stop_cleanly_and_restart_warm(attacked.server);
}

/// One connection's output, whatever the request names.
fn one_connection() -> Bound {
    Bound {
        above_baseline: PER_CONNECTION + SLACK,
        why: "one connection: largest item + 1 MiB, plus measurement slack",
    }
}

/// What reading and sending one 1 MiB value costs, however often a request names it:
/// the issue asks ≤ +2 MiB. A repeated key is read once and its hit held, and the value
/// is written from that item, not copied into the reply; the one read itself holds an
/// aligned read buffer and the decoded value (1 MiB each) for a moment, and the first
/// large GET pages in code. Measured (2 cores, `--nocapture`): the control's single gets
/// +2.1 MiB, `get big` ×1,500 +2.1 to +2.4 MiB, `MGET big` ×1,500 +2.2 to +2.3 MiB; the
/// 1.5 MiB above them is the well-behaved client's noise.
fn one_big_value() -> Bound {
    Bound {
        above_baseline: 4 * MIB,
        why: "one read of the 1 MiB value, held once and written from the item",
    }
}

/// `n` connections' output or input.
fn connections(n: u64, why: &'static str) -> Bound {
    Bound {
        above_baseline: n * PER_CONNECTION + SLACK,
        why,
    }
}

/// A disconnect is the server's right against an abusive client; anything else that is
/// not the expected reply is a wrong answer.
fn tolerate_disconnect(result: std::io::Result<()>) -> Result<(), String> {
    match result {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            ) =>
        {
            Ok(())
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err("no reply within the client's 20 s read timeout".into())
        }
        Err(e) => Err(e.to_string()),
    }
}

const BIG: &str = "big";

fn store_big(server: &Server) -> Vec<u8> {
    let big = value_of(BIG.as_bytes(), MIB as usize);
    let mut conn = Conn::open(server.memcached).expect("connect");
    assert_eq!(conn.mc_set(BIG, &big).expect("set big"), "STORED");
    big
}

/// memcached `get big big …` naming the 1 MiB value `times` times in one line; reads the
/// whole reply and checks every value.
fn memcached_multi_get(server: &Server, big: &[u8], times: usize) -> Result<(), String> {
    let mut conn = Conn::open(server.memcached).map_err(|e| e.to_string())?;
    let request = format!("get{}\r\n", format!(" {BIG}").repeat(times));
    tolerate_disconnect((|| {
        conn.send(request.as_bytes())?;
        for _ in 0..times {
            let line = conn.line()?;
            if conn.mc_value(&line, BIG)? != big {
                return Err(invalid("a WRONG value for big".into()));
            }
        }
        match conn.line()?.as_str() {
            "END" => Ok(()),
            other => Err(invalid(format!("expected END, got {other:?}"))),
        }
    })())
}

/// RESP `MGET big big …`, the reply read whole and every value checked.
fn resp_multi_get(server: &Server, big: &[u8], times: usize) -> Result<(), String> {
    let mut conn = Conn::open(server.resp).map_err(|e| e.to_string())?;
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(std::iter::repeat_n(BIG.as_bytes(), times));
    tolerate_disconnect((|| {
        conn.resp(&args)?;
        if conn.resp_array()? != times {
            return Err(invalid("MGET answered another count".into()));
        }
        for _ in 0..times {
            if conn.resp_bulk()?.as_deref() != Some(big) {
                return Err(invalid("a WRONG value for big".into()));
            }
        }
        Ok(())
    })())
}

// ---------------------------------------------------------------------------------------
// Controls: the same harness and bounds without amplification (they pass today).

#[test]
fn control_one_get_of_a_big_value() {
    let server = start("control-get", DRAM);
    let big = store_big(&server);
    under_attack(server, one_big_value(), |server| {
        (0..3).try_for_each(|_| memcached_multi_get(server, &big, 1))?;
        resp_multi_get(server, &big, 1)
    });
}

// ---------------------------------------------------------------------------------------
// Attacks.

#[test]
fn amplified_memcached_get_of_one_big_key() {
    let server = start("amplified-get", DRAM);
    let big = store_big(&server);
    under_attack(server, one_big_value(), |server| {
        memcached_multi_get(server, &big, 1500)
    });
}

#[test]
fn amplified_resp_mget_of_one_big_key() {
    let server = start("amplified-mget", DRAM);
    let big = store_big(&server);
    under_attack(server, one_big_value(), |server| {
        resp_multi_get(server, &big, 1500)
    });
}

/// Keys long enough that one `SCAN … COUNT 100000` names 10+ MiB of them.
const LISTED_KEYS: usize = 100_000;
fn listed_prefix() -> String {
    format!("listed:{}:", "k".repeat(100))
}

#[test]
fn scan_with_count_100000() {
    let server = start("scan", DRAM);
    fill(&server, &listed_prefix(), LISTED_KEYS, 100);
    under_attack(server, one_connection(), |server| {
        let mut conn = Conn::open(server.resp).map_err(|e| e.to_string())?;
        tolerate_disconnect((|| {
            conn.resp(&[b"SCAN", b"0", b"COUNT", b"100000"])?;
            if conn.resp_array()? != 2 {
                return Err(invalid("SCAN: not cursor + keys".into()));
            }
            conn.resp_bulk()?;
            let keys = conn.resp_array()?;
            for _ in 0..keys {
                let key = conn.resp_bulk()?.unwrap_or_default();
                let stored = [&b"listed:"[..], b"good:", b"warm:"];
                if !stored.iter().any(|prefix| key.starts_with(prefix)) {
                    return Err(invalid(format!(
                        "SCAN named a key never stored: {:?}",
                        String::from_utf8_lossy(&key)
                    )));
                }
            }
            Ok(())
        })())
    });
}

#[test]
fn zcrange_with_limit_100000() {
    // 100,000 pairs of ~510 bytes: a 51 MB reply, kept within the DRAM tier so the fill
    // is quick.
    const LEN: usize = 400;
    let server = start("zcrange", DRAM);
    let prefix = listed_prefix();
    fill(&server, &prefix, LISTED_KEYS, LEN);
    under_attack(server, one_connection(), |server| {
        let mut conn = Conn::open(server.resp).map_err(|e| e.to_string())?;
        let end = format!("{prefix}~");
        tolerate_disconnect((|| {
            conn.resp(&[
                b"ZCRANGE",
                prefix.as_bytes(),
                end.as_bytes(),
                b"LIMIT",
                b"100000",
            ])?;
            // A cache may forget keys: at most the limit, each with its own value.
            let items = conn.resp_array()?;
            if items % 2 != 0 || items > 2 * LISTED_KEYS {
                return Err(invalid(format!("ZCRANGE answered {items} items")));
            }
            for _ in 0..items / 2 {
                let key = conn.resp_bulk()?.unwrap_or_default();
                let value = conn.resp_bulk()?.unwrap_or_default();
                if !key.starts_with(prefix.as_bytes()) || value != value_of(&key, LEN) {
                    return Err(invalid(format!(
                        "a WRONG pair for {}",
                        String::from_utf8_lossy(&key)
                    )));
                }
            }
            Ok(())
        })())
    });
}

#[test]
fn mget_of_200000_keys_on_the_ssd_tier() {
    const KEYS: usize = 200_000;
    const LEN: usize = 100;
    // 8 MiB of DRAM: most of the 22 MB of keys and values live on the SSD tier. The
    // 3.6 MB request passes the default `--max-request-size` (item size + 256 KiB), which
    // would refuse it (`oversized_declared_lengths` tests refusals): allowed here, so that
    // the read-ahead and the reply's budget are what is tested.
    let server = start_with("mget-200k", "8MiB", &["--max-request-size", "8MiB"]);
    fill(&server, "ssd:", KEYS, LEN);
    // Its output is one connection's; its input is the attacker's own request, which the
    // server holds once received and parses whole before MGET streams: the 3.6 MB
    // request (a 4 MiB buffer) and, for a moment, its 200,001 arguments framed
    // (24-byte `Cow`s, then 16-byte slices: 8 MB). Measured: +15 to +17 MiB, at the
    // first step, back to +1 MiB once the reply streams.
    let bound = Bound {
        above_baseline: PER_CONNECTION + SLACK + 16 * MIB,
        why: "one connection's output, and its 3.6 MB request held and framed whole",
    };
    under_attack(server, bound, |server| {
        let mut conn = Conn::open(server.resp).map_err(|e| e.to_string())?;
        let keys: Vec<String> = (0..KEYS).map(|i| format!("ssd:{i:07}")).collect();
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(keys.iter().map(|k| k.as_bytes()));
        tolerate_disconnect((|| {
            conn.resp(&args)?;
            if conn.resp_array()? != KEYS {
                return Err(invalid("MGET answered another count".into()));
            }
            for key in &keys {
                // A cache may forget (nil); it must never answer another value.
                if let Some(value) = conn.resp_bulk()?
                    && value != value_of(key.as_bytes(), LEN)
                {
                    return Err(invalid(format!("a WRONG value for {key}")));
                }
            }
            Ok(())
        })())
    });
}

/// Connections that each send the start of a request and then a byte at a time.
const SLOW_CONNECTIONS: usize = 400;

#[test]
fn slowloris_partial_requests() {
    let server = start("slowloris", DRAM);
    let bound = Bound {
        above_baseline: 32 * MIB,
        why: "400 connections with a partial request each: ~80 KiB a connection",
    };
    under_attack(server, bound, |server| {
        let mut slow: Vec<TcpStream> = (0..SLOW_CONNECTIONS)
            .filter_map(|i| {
                let addr = if i % 2 == 0 {
                    server.memcached
                } else {
                    server.resp
                };
                let mut stream = TcpStream::connect(addr).ok()?;
                let start: &[u8] = if i % 2 == 0 {
                    b"set slow 0 0 100000\r\n"
                } else {
                    b"*3\r\n$3\r\nSET\r\n$4\r\nslow\r\n$100000\r\n"
                };
                stream.write_all(start).ok()?;
                Some(stream)
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(4);
        while Instant::now() < deadline {
            for stream in &mut slow {
                let _ = stream.write_all(&[b'x'; 16]);
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    });
}

/// Declared lengths far over any limit, then 40 MiB of the data, never completed.
const HUGE_CONNECTIONS: usize = 6;
const HUGE_SENT: usize = 40;

/// Sends `head` and `HUGE_SENT` MiB of filler on a connection (framed by `frame`, which
/// may insert headers), then half-closes it and checks that what came back stored
/// nothing.
fn send_huge(addr: SocketAddr, head: Vec<u8>, frame: fn(usize) -> Vec<u8>) -> Result<(), String> {
    let mut conn = Conn::open(addr).map_err(|e| e.to_string())?;
    let sent = (|| {
        conn.send(&head)?;
        for mib in 0..HUGE_SENT {
            conn.send(&frame(mib))?;
        }
        Ok(())
    })();
    tolerate_disconnect(sent)?;
    let _ = conn.stream().shutdown(Shutdown::Write);
    let mut answer = String::new();
    let _ = conn.reader.read_to_string(&mut answer);
    if answer.contains("STORED") || answer.contains("+OK") {
        return Err(format!("an oversized request answered {answer:?}"));
    }
    Ok(())
}

#[test]
fn oversized_declared_lengths() {
    let server = start("oversized", DRAM);
    let bound = connections(
        2 * HUGE_CONNECTIONS as u64,
        "12 connections declaring values over the item limit: refused, not buffered",
    );
    under_attack(server, bound, |server| {
        // RESP: a declared bulk past every limit is refused before any of it is read.
        let mut conn = Conn::open(server.resp).map_err(|e| e.to_string())?;
        conn.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2000000000\r\n")
            .map_err(|e| e.to_string())?;
        let reply = conn.line().map_err(|e| e.to_string())?;
        if !reply.starts_with('-') {
            return Err(format!("$2000000000 answered {reply:?}"));
        }
        let mut senders: Vec<JoinHandle<Result<(), String>>> = Vec::new();
        for i in 0..HUGE_CONNECTIONS {
            // memcached: a 2 GB value declared.
            let addr = server.memcached;
            let head = format!("set huge{i} 0 0 2000000000\r\n").into_bytes();
            senders.push(thread::spawn(move || {
                send_huge(addr, head, |_| vec![b'x'; MIB as usize])
            }));
            // RESP: an MSET of 10 MB values (each under the 16 MiB bulk limit, all over
            // the 1 MiB item limit), never completed.
            let addr = server.resp;
            let head = b"*9\r\n$4\r\nMSET\r\n".to_vec();
            senders.push(thread::spawn(move || {
                send_huge(addr, head, |mib| {
                    let mut chunk = Vec::new();
                    if mib % 10 == 0 {
                        chunk.extend_from_slice(b"$5\r\nhugeR\r\n$10485760\r\n");
                    }
                    chunk.resize(chunk.len() + MIB as usize, b'x');
                    if mib % 10 == 9 {
                        chunk.extend_from_slice(b"\r\n");
                    }
                    chunk
                })
            }));
        }
        for sender in senders {
            sender.join().expect("sender")?;
        }
        let mut check = Conn::open(server.memcached).map_err(|e| e.to_string())?;
        let keys = (0..HUGE_CONNECTIONS).map(|i| format!("huge{i}"));
        for key in keys.chain(["hugeR".to_string()]) {
            if check.mc_get(&key).map_err(|e| e.to_string())?.is_some() {
                return Err(format!("{key} is stored"));
            }
        }
        Ok(())
    });
}

#[test]
fn pipeline_that_is_never_read() {
    let server = start("never-read", DRAM);
    store_big(&server);
    // Held past the attack: SIGTERM must stop a server with connections that do not read.
    let mut stuck: Vec<TcpStream> = Vec::new();
    let bound = connections(2, "two connections' output: largest item + 1 MiB each");
    under_attack(server, bound, |server| {
        for (addr, request) in [
            (server.memcached, b"get big\r\n".to_vec()),
            (server.resp, resp_command(&[b"GET", BIG.as_bytes()])),
        ] {
            let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
            stream
                .set_write_timeout(Some(Duration::from_secs(2)))
                .map_err(|e| e.to_string())?;
            // 20,000 GETs of the 1 MiB value (20 GB of replies), never read: the sends
            // stop when the socket buffers fill.
            let pipeline = request.repeat(20_000);
            let _ = stream.write_all(&pipeline);
            stuck.push(stream);
        }
        thread::sleep(Duration::from_secs(2));
        Ok(())
    });
    drop(stuck);
}

/// The budget for all connections' buffers the large-value readers run against.
const CLIENTS_MEMORY: u64 = 64 * MIB;
/// 1 MiB values, each stored as a large object (BT_LO: one extent on the SSD).
const LARGE_VALUES: usize = 64;
/// Connections each asking for every large value once and reading nothing.
const LARGE_READERS: usize = 100;
/// Readers that read their whole reply at the end, whichever the server kept.
const READERS_CHECKED: usize = 4;

fn large_key(i: usize) -> String {
    format!("big{i}")
}

/// Every read of a large value allocates its whole extent, and a connection reads ahead
/// the GETs it has been sent: 100 connections each sending `get big0 … big63` (64 MiB of
/// values) without reading held 4.8 GB against a 128 MiB `max_clients_memory` before the
/// reads in flight and their answers were charged to it. The bound was the issue's, what
/// the connections' buffers may hold and 64 MiB besides, until a CI run passed it
/// (+131.8 MiB; +105 to +121 here): the connections the budget closed dropped their
/// reads in flight, whose buffers lived on uncharged until the device completed them,
/// and a crowd of connections each started one read past a spent budget. With both
/// charged until freed (`prefetch::abandon`) and the reads past the budget held to an
/// eighth of it (`ConnectionBuffers::room`), it measured +78 to +83 MiB, so the bound is
/// now 32 MiB besides.
#[test]
fn connections_reading_large_values_ahead_without_reading_replies() {
    let server = start_with(
        "large-readers",
        DRAM,
        &["--max-clients-memory", &CLIENTS_MEMORY.to_string()],
    );
    let mut conn = Conn::open(server.memcached).expect("connect");
    let values: Vec<Vec<u8>> = (0..LARGE_VALUES)
        .map(|i| {
            let key = large_key(i);
            let value = value_of(key.as_bytes(), MIB as usize);
            assert_eq!(conn.mc_set(&key, &value).expect("set"), "STORED");
            value
        })
        .collect();
    drop(conn);
    let bound = Bound {
        above_baseline: CLIENTS_MEMORY + 32 * MIB,
        why: "max_clients_memory + 32 MiB: reads in flight and their answers charged to it \
              until freed",
    };
    under_attack(server, bound, |server| {
        let keys: Vec<String> = (0..LARGE_VALUES).map(large_key).collect();
        let request = format!("get {}\r\n", keys.join(" "));
        let before = server.rss();
        let mut readers: Vec<Conn> = (0..LARGE_READERS)
            .filter_map(|_| {
                let mut conn = Conn::open(server.memcached).ok()?;
                conn.send(request.as_bytes()).ok()?;
                Some(conn)
            })
            .collect();
        if readers.len() < LARGE_READERS {
            return Err(format!("only {} readers connected", readers.len()));
        }
        // The server reads ahead for all of them meanwhile.
        thread::sleep(Duration::from_secs(3));
        // What a reader the server kept is answered must be right, in order; a cache may
        // forget a value (BT_LO drops the oldest extents when its log is full).
        for mut conn in readers.drain(..READERS_CHECKED) {
            tolerate_disconnect((|| {
                let mut expected = keys.iter().zip(&values);
                loop {
                    let line = conn.line()?;
                    if line == "END" {
                        return Ok(());
                    }
                    let named = line.split(' ').nth(1).unwrap_or_default();
                    let Some((key, value)) = expected.find(|(key, _)| *key == named) else {
                        return Err(invalid(format!("{line:?} out of order")));
                    };
                    if conn.mc_value(&line, key)? != *value {
                        return Err(invalid(format!("a WRONG value for {key}")));
                    }
                }
            })())?;
        }
        drop(readers);
        // Once they are gone, what they held is freed: RSS comes back near where it was.
        let settled = Instant::now() + Duration::from_secs(20);
        while server.rss() > before + 16 * MIB {
            if Instant::now() > settled {
                return Err(format!(
                    "RSS {} MiB 20 s after the readers left, {} MiB before them",
                    server.rss() / MIB,
                    before / MIB
                ));
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    });
}
