//! Shared by the `zipcache` binary's tests: a `zipcache serve` process on ports it
//! picks, stopped by its PID; a memcached text-protocol connection to it; the fill of
//! keys the restart and crash tests load it with.
#![allow(dead_code)] // each test binary uses its own subset

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use zipcache::stats::rss_bytes;

/// Longest a clean stop may take (it writes the DRAM tier down to the SSD file).
pub const STOP_LIMIT: Duration = Duration::from_secs(60);

/// A fresh directory under the system temp dir for one test's files.
pub fn test_dir(suite: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zipcache-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test dir");
    dir
}

/// `zipcache serve` started with `args` and `--data-dir DIR/data`, its output in
/// `DIR/stdout.txt` and `DIR/stderr.txt`; the addresses are read from its banner.
pub struct Server {
    child: Child,
    pub dir: PathBuf,
    pub memcached: SocketAddr,
    pub resp: SocketAddr,
    pub args: Vec<String>,
    /// Set once the process is reaped: its PID may then name another process.
    exited: bool,
}

impl Server {
    pub fn spawn(dir: PathBuf, args: Vec<String>) -> Server {
        let out = dir.join("stdout.txt");
        let err = dir.join("stderr.txt");
        let child = Command::new(env!("CARGO_BIN_EXE_zipcache"))
            .arg("serve")
            .args(&args)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .spawn()
            .expect("start zipcache serve");
        let mut server = Server {
            child,
            dir,
            memcached: ([127, 0, 0, 1], 0).into(),
            resp: ([127, 0, 0, 1], 0).into(),
            args,
            exited: false,
        };
        let started = Instant::now();
        loop {
            let banner = std::fs::read_to_string(&out).unwrap_or_default();
            if let Some(line) = banner.lines().find(|l| l.starts_with("listening ")) {
                let addr = |name: &str| -> SocketAddr {
                    line.split(' ')
                        .find_map(|field| field.strip_prefix(name))
                        .and_then(|a| a.parse().ok())
                        .unwrap_or_else(|| panic!("no {name} address in {line:?}"))
                };
                server.memcached = addr("memcached=");
                server.resp = addr("resp=");
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "zipcache serve exited ({status}) before listening: {}",
                    server.log()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "zipcache serve did not listen within 30 s: {}",
                server.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn log(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        format!("{}{}", read("stdout.txt"), read("stderr.txt"))
    }

    pub fn rss(&self) -> u64 {
        rss_bytes(self.pid()).unwrap_or(0)
    }

    pub fn signal(&self, signal: libc::c_int) {
        if self.exited {
            return;
        }
        // SAFETY: the PID is our own child, not yet reaped (`exited` is set when it is),
        // so it cannot name another process.
        unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
    }

    /// SIGKILL, as the OOM killer sends it; the exit status.
    pub fn kill(&mut self) -> ExitStatus {
        self.signal(libc::SIGKILL);
        let status = self.child.wait().expect("wait");
        self.exited = true;
        status
    }

    /// SIGTERM; the exit status, or a failure if the server is still running after
    /// `STOP_LIMIT` (then it is killed).
    pub fn stop(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                self.exited = true;
                return status;
            }
            if started.elapsed() > STOP_LIMIT {
                self.signal(libc::SIGKILL);
                let _ = self.child.wait();
                self.exited = true;
                panic!(
                    "SIGTERM did not stop the server within {STOP_LIMIT:?}: {}",
                    self.log()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    /// A server still running (a test that failed midway) is killed by PID; the
    /// directory is removed (a restarted server is dropped before the one it replaced).
    fn drop(&mut self) {
        if !self.exited {
            self.signal(libc::SIGKILL);
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The reproduction of the report: 4 MiB of DRAM over 256 MiB of SSD
/// (`small_dram_args`), 200,000 keys (`fill`).
pub const KEYS: usize = 200_000;

/// `zipcache serve` flags for the `KEYS` fill: ports picked, 4 MiB of DRAM over 256 MiB
/// of SSD, two threads.
pub fn small_dram_args() -> Vec<String> {
    [
        "--memcached-port",
        "0",
        "--resp-port",
        "0",
        "--dram",
        "4MiB",
        "--ssd-size",
        "256MiB",
        "--threads",
        "2",
        // Writers wait for the flusher rather than drop: the tests count every key.
        "--set",
        "flush_wait_ms=60000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The value `fill` stores at `key:{i}`.
pub fn value(i: usize) -> String {
    format!("value-{i:08}-{}", "v".repeat(i % 40))
}

/// A memcached text-protocol connection; replies wait up to 60 s.
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let writer = TcpStream::connect(addr).expect("connect");
        writer
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        Conn { reader, writer }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.try_send(bytes).expect("send");
    }

    pub fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.writer.write_all(bytes)
    }

    /// The next reply line, without its line end.
    pub fn reply(&mut self) -> String {
        self.try_reply().expect("reply")
    }

    /// The next reply line, or an error once the server has closed the connection.
    pub fn try_reply(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(line.trim_end().to_string())
    }

    /// The engine's figures from memcached's `stats`.
    pub fn stats(&mut self) -> HashMap<String, String> {
        self.send(b"stats\r\n");
        let mut stats = HashMap::new();
        loop {
            let line = self.reply();
            if line == "END" {
                return stats;
            }
            let mut fields = line.splitn(3, ' ').skip(1);
            if let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                stats.insert(name.to_string(), value.to_string());
            }
        }
    }
}

/// Stores `key:0` to `key:{KEYS - 1}`, each with its `value`, in pipelined batches.
pub fn fill(conn: &mut Conn) {
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let mut batch = String::new();
        for &i in chunk {
            let v = value(i);
            batch.push_str(&format!("set key:{i} 0 0 {}\r\n{v}\r\n", v.len()));
        }
        conn.send(batch.as_bytes());
        for &i in chunk {
            assert_eq!(conn.reply(), "STORED", "key:{i}");
        }
    }
}

/// How many of the `fill` keys the server serves; a key served with a wrong value fails.
pub fn served(conn: &mut Conn) -> usize {
    let mut served = 0;
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let request: String = chunk.iter().map(|i| format!("mg key:{i} v\r\n")).collect();
        conn.send(request.as_bytes());
        for &i in chunk {
            let header = conn.reply();
            if header == "EN" {
                continue;
            }
            let v = value(i);
            assert_eq!(header, format!("VA {}", v.len()), "key:{i}");
            assert_eq!(conn.reply(), v, "key:{i}");
            served += 1;
        }
    }
    served
}
