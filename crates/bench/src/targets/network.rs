//! Network targets: memcached text protocol (memcached, memcached + extstore, `zipcache
//! serve`) and RESP (redis). Each bench thread opens several connections and pipelines a
//! batch over them, like memtier_benchmark, so one client thread keeps a server busy.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Budget, Client, Holdings, Reply, Request, Snapshot, Target};
use crate::pagecache::PageCacheDropper;
use crate::peers::{self, Peer};
use crate::procfs;

/// Longest a server may take to answer before the run fails rather than hangs.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A whole RESP reply ([`Conn::call`]).
#[derive(Debug, PartialEq)]
pub(crate) enum Value {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Value>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Memcached,
    Resp,
}

pub(crate) struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

pub(super) fn io_err(e: std::io::Error) -> String {
    format!("connection: {e}")
}

impl Conn {
    pub(crate) fn open(addr: SocketAddr) -> Result<Conn, String> {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(io_err)?;
        stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io_err)?;
        let writer = BufWriter::with_capacity(64 << 10, stream.try_clone().map_err(io_err)?);
        Ok(Conn {
            reader: BufReader::with_capacity(64 << 10, stream),
            writer,
        })
    }

    pub(super) fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).map_err(io_err)?;
        if n == 0 {
            return Err("server closed the connection".into());
        }
        line.truncate(line.trim_end_matches(['\r', '\n']).len());
        Ok(line)
    }

    /// `len` bytes of payload followed by CRLF.
    fn payload(&mut self, len: usize) -> Result<Vec<u8>, String> {
        let mut data = vec![0; len + 2];
        self.reader.read_exact(&mut data).map_err(io_err)?;
        data.truncate(len);
        Ok(data)
    }

    /// A RESP command and its whole reply, arrays included (CLUSTER SLOTS, CLUSTERX).
    pub(crate) fn call(&mut self, args: &[&[u8]]) -> Result<Value, String> {
        resp_command(&mut self.writer, args).map_err(io_err)?;
        self.writer.flush().map_err(io_err)?;
        self.value()
    }

    /// Buffers a RESP command, unsent until [`flush`](Self::flush) (a pipeline).
    pub(crate) fn command(&mut self, args: &[&[u8]]) -> Result<(), String> {
        resp_command(&mut self.writer, args).map_err(io_err)
    }

    /// The next whole RESP reply.
    pub(crate) fn value(&mut self) -> Result<Value, String> {
        let line = self.line()?;
        let (kind, rest) = line.split_at_checked(1).ok_or("an empty reply line")?;
        let number = || {
            rest.parse::<i64>()
                .map_err(|_| format!("bad reply {line:?}"))
        };
        Ok(match kind {
            "+" => Value::Simple(rest.into()),
            "-" => Value::Error(rest.into()),
            ":" => Value::Integer(number()?),
            "$" => match number()? {
                n if n < 0 => Value::Bulk(None),
                n => Value::Bulk(Some(self.payload(n as usize)?)),
            },
            "*" => {
                let n = number()?.max(0);
                Value::Array((0..n).map(|_| self.value()).collect::<Result<_, _>>()?)
            }
            _ => return Err(format!("unexpected reply {line:?}")),
        })
    }

    /// Sends what `send` buffered.
    pub(crate) fn flush(&mut self) -> Result<(), String> {
        self.writer.flush().map_err(io_err)
    }

    /// Writes `request`; false if the protocol has no such command (nothing is sent).
    pub(super) fn send(&mut self, protocol: Protocol, request: &Request) -> Result<bool, String> {
        encode(&mut self.writer, protocol, request).map_err(io_err)
    }

    pub(super) fn receive(
        &mut self,
        protocol: Protocol,
        request: &Request,
    ) -> Result<Reply, String> {
        match protocol {
            Protocol::Memcached => self.receive_memcached(request),
            Protocol::Resp => self.receive_resp(request),
        }
    }

    fn receive_memcached(&mut self, request: &Request) -> Result<Reply, String> {
        let line = self.line()?;
        Ok(match (request, line.as_str()) {
            (Request::Get(_), "END") => Reply::Value(None),
            (Request::Get(_), _) if line.starts_with("VALUE ") => {
                let len: usize = line
                    .split(' ')
                    .nth(3)
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("bad VALUE line {line:?}"))?;
                let data = self.payload(len)?;
                let end = self.line()?;
                if end != "END" {
                    return Err(format!("expected END, got {end:?}"));
                }
                Reply::Value(Some(data))
            }
            (Request::Put(..), "STORED") => Reply::Stored,
            (Request::Delete(_), "DELETED") => Reply::Deleted(true),
            (Request::Delete(_), "NOT_FOUND") => Reply::Deleted(false),
            _ => Reply::Error(line),
        })
    }

    fn receive_resp(&mut self, request: &Request) -> Result<Reply, String> {
        let line = self.line()?;
        Ok(match (request, line.as_bytes().first()) {
            (_, Some(b'-')) => Reply::Error(line),
            (Request::Get(_), Some(b'$')) => match line[1..].parse::<i64>() {
                Ok(len) if len < 0 => Reply::Value(None),
                Ok(len) => Reply::Value(Some(self.payload(len as usize)?)),
                Err(_) => return Err(format!("bad bulk header {line:?}")),
            },
            (Request::Put(..), Some(b'+')) => Reply::Stored,
            (Request::Delete(_), Some(b':')) => Reply::Deleted(line[1..].trim() != "0"),
            _ => return Err(format!("unexpected reply {line:?}")),
        })
    }

    /// `stats` (memcached) or `INFO` + `DBSIZE` (redis) as name → value.
    pub(super) fn stats(&mut self, protocol: Protocol) -> Result<HashMap<String, String>, String> {
        let mut stats = HashMap::new();
        match protocol {
            Protocol::Memcached => {
                self.writer.write_all(b"stats\r\n").map_err(io_err)?;
                self.writer.flush().map_err(io_err)?;
                loop {
                    let line = self.line()?;
                    if line == "END" {
                        break;
                    }
                    let mut parts = line.splitn(3, ' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some("STAT"), Some(name), Some(value)) => {
                            stats.insert(name.to_string(), value.to_string());
                        }
                        _ => return Err(format!("unexpected stats line {line:?}")),
                    }
                }
            }
            Protocol::Resp => {
                resp_command(&mut self.writer, &[b"INFO"]).map_err(io_err)?;
                resp_command(&mut self.writer, &[b"DBSIZE"]).map_err(io_err)?;
                self.writer.flush().map_err(io_err)?;
                let header = self.line()?;
                let len: usize = header
                    .strip_prefix('$')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("bad INFO reply {header:?}"))?;
                let info = String::from_utf8_lossy(&self.payload(len)?).into_owned();
                for line in info.lines() {
                    if let Some((name, value)) = line.split_once(':') {
                        stats.insert(name.to_string(), value.trim().to_string());
                    }
                }
                let dbsize = self.line()?;
                stats.insert("dbsize".into(), dbsize.trim_start_matches(':').to_string());
            }
        }
        Ok(stats)
    }
}

fn encode(w: &mut impl Write, protocol: Protocol, request: &Request) -> std::io::Result<bool> {
    match (protocol, request) {
        (Protocol::Memcached, Request::Get(key)) => {
            w.write_all(b"get ")?;
            w.write_all(key)?;
            w.write_all(b"\r\n")?;
        }
        (Protocol::Memcached, Request::Put(key, value)) => {
            w.write_all(b"set ")?;
            w.write_all(key)?;
            write!(w, " 0 0 {}\r\n", value.len())?;
            w.write_all(value)?;
            w.write_all(b"\r\n")?;
        }
        (Protocol::Memcached, Request::Delete(key)) => {
            w.write_all(b"delete ")?;
            w.write_all(key)?;
            w.write_all(b"\r\n")?;
        }
        (Protocol::Resp, Request::Get(key)) => resp_command(w, &[b"GET", key])?,
        (Protocol::Resp, Request::Put(key, value)) => resp_command(w, &[b"SET", key, value])?,
        (Protocol::Resp, Request::Delete(key)) => resp_command(w, &[b"DEL", key])?,
        (_, Request::Scan(..)) => return Ok(false),
    }
    Ok(true)
}

pub(super) fn resp_command(w: &mut impl Write, args: &[&[u8]]) -> std::io::Result<()> {
    write!(w, "*{}\r\n", args.len())?;
    for arg in args {
        write!(w, "${}\r\n", arg.len())?;
        w.write_all(arg)?;
        w.write_all(b"\r\n")?;
    }
    Ok(())
}

/// Sends each connection its requests (indexes into `requests`, in order) pipelined,
/// flushes them all, then reads each connection's replies back in the same order: every
/// request's reply with the time from `start` until it was known (`Unsupported`, at once,
/// for one its protocol has no command for).
pub(super) fn pipelined(
    mut lanes: Vec<(&mut Conn, Vec<usize>)>,
    protocol: Protocol,
    requests: &[Request],
    start: Instant,
) -> Result<Vec<Option<(Reply, Duration)>>, String> {
    let mut sent = vec![false; requests.len()];
    for (conn, lane) in &mut lanes {
        for &i in lane.iter() {
            sent[i] = conn.send(protocol, &requests[i])?;
        }
        conn.flush()?;
    }
    let mut answers: Vec<Option<(Reply, Duration)>> = vec![None; requests.len()];
    for (conn, lane) in &mut lanes {
        for &i in lane.iter() {
            answers[i] = Some(if sent[i] {
                (conn.receive(protocol, &requests[i])?, start.elapsed())
            } else {
                (Reply::Unsupported, Duration::ZERO)
            });
        }
    }
    Ok(answers)
}

/// A bench thread's connections; a batch is spread over them round-robin and pipelined.
struct NetClient {
    protocol: Protocol,
    conns: Vec<Conn>,
    pipeline: usize,
}

impl Client for NetClient {
    fn execute(
        &mut self,
        requests: &[Request],
        replies: &mut Vec<(Reply, Duration)>,
    ) -> Result<(), String> {
        let start = Instant::now();
        let n = self.conns.len();
        let lanes = self
            .conns
            .iter_mut()
            .enumerate()
            .map(|(c, conn)| (conn, (c..requests.len()).step_by(n).collect()))
            .collect();
        let answers = pipelined(lanes, self.protocol, requests, start)?;
        replies.extend(answers.into_iter().flatten());
        Ok(())
    }

    fn batch_size(&self) -> usize {
        self.conns.len() * self.pipeline
    }
}

/// A server reached over TCP, either started by the bench or already running.
pub struct NetTarget {
    name: String,
    addr: SocketAddr,
    protocol: Protocol,
    /// Kept for its PID (RSS, CPU, bytes written); dropping it stops the server.
    peer: Option<Peer>,
    control: Mutex<Conn>,
    connections: usize,
    pipeline: usize,
    dram_only: bool,
    /// `--server-pid`: the PID of a server the bench did not start.
    server_pid: Option<u32>,
    /// memcached-ext-nocache: keeps the extstore file out of the page cache.
    dropper: Option<PageCacheDropper>,
}

/// memcached-ext whose extstore file the bench keeps out of the page cache
/// (`--drop-peer-page-cache`), so its flash reads reach the device as ZipCache's do.
pub const NOCACHE: &str = "memcached-ext-nocache";

impl NetTarget {
    /// Starts `memcached`, `memcached-ext`, `redis` or `zipcache-serve` with the budget.
    pub fn spawn(name: &str, budget: &Budget) -> Result<NetTarget, String> {
        let dir = &budget.data_dir;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let server_threads = budget.threads.clamp(1, 4);
        let (peer, protocol, dram_only) = match name {
            "memcached" => (
                peers::memcached(budget.dram, None, dir, server_threads)?,
                Protocol::Memcached,
                true,
            ),
            "memcached-ext" | NOCACHE => {
                let ssd = budget
                    .ssd
                    .ok_or("memcached-ext needs an SSD budget (--ssd-size), not --ssd none")?;
                (
                    peers::memcached(budget.dram, Some(ssd), dir, server_threads)?,
                    Protocol::Memcached,
                    false,
                )
            }
            "zipcache-serve" => (
                peers::zipcache_serve(
                    budget.dram,
                    budget.ssd,
                    &budget.settings,
                    dir,
                    server_threads,
                )?,
                Protocol::Memcached,
                budget.ssd.is_none(),
            ),
            _ => (peers::redis(budget.dram, dir)?, Protocol::Resp, true),
        };
        let addr = peer.addr;
        let mut target = Self::new(name, addr, protocol, Some(peer), budget, dram_only)?;
        if name == NOCACHE {
            target.dropper = Some(PageCacheDropper::start(peers::extstore_file(dir)));
        }
        Ok(target)
    }

    /// A server already running at `addr` (`HOST:PORT`).
    pub fn remote(
        name: &str,
        addr: &str,
        protocol: Protocol,
        budget: &Budget,
    ) -> Result<NetTarget, String> {
        let addr = addr
            .to_socket_addrs()
            .map_err(|e| format!("{name}: {e}"))?
            .next()
            .ok_or_else(|| format!("{name}: no address"))?;
        let mut target = Self::new(name, addr, protocol, None, budget, false)?;
        target.server_pid = budget.server_pid;
        Ok(target)
    }

    fn new(
        name: &str,
        addr: SocketAddr,
        protocol: Protocol,
        peer: Option<Peer>,
        budget: &Budget,
        dram_only: bool,
    ) -> Result<NetTarget, String> {
        Ok(NetTarget {
            name: name.into(),
            addr,
            protocol,
            control: Mutex::new(Conn::open(addr)?),
            peer,
            connections: budget.connections.max(1),
            pipeline: budget.pipeline.max(1),
            dram_only,
            server_pid: None,
            dropper: None,
        })
    }

    /// The server's PID: the peer the bench started, or what `--server-pid` named.
    pub fn pid(&self) -> Option<u32> {
        self.peer.as_ref().map(Peer::pid).or(self.server_pid)
    }
}

fn stat<T: std::str::FromStr>(stats: &HashMap<String, String>, name: &str) -> Option<T> {
    stats.get(name)?.parse().ok()
}

/// A §4 ratio as `zipcache serve` prints it; it prints what it cannot say as text.
fn ratio_stat(stats: &HashMap<String, String>, name: &str) -> Option<f64> {
    stat::<f64>(stats, name).filter(|v| v.is_finite())
}

/// What a server's `stats` (memcached) or `INFO` + `DBSIZE` (RESP) says, as a snapshot.
/// RSS comes from /proc when the server's PID is known (`pid`), else from what the server
/// reports of itself.
pub(super) fn snapshot_of(
    protocol: Protocol,
    stats: &HashMap<String, String>,
    pid: Option<u32>,
) -> Snapshot {
    let mut snap = Snapshot {
        server_cpu_seconds: pid.and_then(procfs::cpu_seconds),
        held: Holdings {
            rss_bytes: pid.and_then(procfs::rss_bytes),
            ..Holdings::default()
        },
        ..Snapshot::default()
    };
    match protocol {
        Protocol::Resp => {
            snap.dram_hits = stat(stats, "keyspace_hits");
            snap.ssd_hits = Some(0);
            snap.held.dram_bytes_used = stat(stats, "used_memory");
            snap.objects_resident = stat(stats, "dbsize");
            snap.held.rss_bytes = snap.held.rss_bytes.or(stat(stats, "used_memory_rss"));
        }
        // `zipcache serve` prints the engine's §4 names in `stats`.
        Protocol::Memcached if stats.contains_key("dram_hits") => {
            snap.dram_hits = stat(stats, "dram_hits");
            snap.ssd_hits = stat(stats, "ssd_hits");
            snap.held.dram_bytes_used = stat(stats, "dram_used");
            snap.objects_resident = stat(stats, "objects_resident");
            snap.held.rss_bytes = snap.held.rss_bytes.or(stat(stats, "rss_bytes"));
            snap.held.compression_ratio_dram = ratio_stat(stats, "compression_ratio_dram");
            snap.held.wa_host = ratio_stat(stats, "wa_host");
            snap.held.wr_nand = ratio_stat(stats, "wr_nand");
            snap.held.wa = ratio_stat(stats, "wa");
            snap.held.zeta = ratio_stat(stats, "zeta");
            snap.held.ssd_objects = stat(stats, "ssd_objects");
            snap.held.ssd_index_bytes = stat(stats, "ssd_index_bytes");
            snap.held.ssd_reads_per_ssd_get = ratio_stat(stats, "ssd_reads_per_ssd_get");
            snap.held.ssd_flash_bytes = stat(stats, "ssd_flash_bytes");
            snap.host_bytes_written = stat(stats, "V_host");
        }
        Protocol::Memcached => {
            let hits: Option<u64> = stat(stats, "get_hits");
            let flash: u64 = stat(stats, "get_extstore").unwrap_or(0);
            snap.dram_hits = hits.map(|h| h.saturating_sub(flash));
            snap.ssd_hits = Some(flash);
            snap.held.dram_bytes_used = stat(stats, "bytes");
            snap.objects_resident = stat(stats, "curr_items");
            if stats.contains_key("extstore_bytes_written") {
                snap.held.ssd_objects = stat(stats, "extstore_objects_used");
                snap.held.ssd_flash_bytes = stat(stats, "extstore_bytes_used");
                snap.host_bytes_written = pid
                    .and_then(procfs::wchar)
                    .or(stat(stats, "extstore_bytes_written"));
            }
        }
    }
    snap
}

impl Target for NetTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn client(&self) -> Result<Box<dyn Client>, String> {
        let conns = (0..self.connections)
            .map(|_| Conn::open(self.addr))
            .collect::<Result<_, _>>()?;
        Ok(Box::new(NetClient {
            protocol: self.protocol,
            conns,
            pipeline: self.pipeline,
        }))
    }

    fn snapshot(&self) -> Result<Snapshot, String> {
        let stats = self
            .control
            .lock()
            .map_err(|_| "control connection poisoned")?
            .stats(self.protocol)?;
        Ok(snapshot_of(self.protocol, &stats, self.pid()))
    }

    fn dram_only(&self) -> bool {
        self.dram_only
    }

    fn cache_pid(&self) -> Option<u32> {
        self.pid()
    }

    fn close(self: Box<Self>) -> Result<(), String> {
        // Dropping `peer` stops the server by its PID.
        self.dropper.map_or(Ok(()), PageCacheDropper::stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    /// A server that answers one connection's `stats` requests with `reply`.
    fn fake_server(reply: &'static str) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut writer = stream;
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                if line == "stats\r\n" {
                    writer.write_all(reply.as_bytes()).unwrap();
                }
                line.clear();
            }
        });
        addr
    }

    fn budget(server_pid: Option<u32>) -> Budget {
        Budget {
            dram: 64 << 20,
            ssd: None,
            data_dir: std::env::temp_dir(),
            mean_object: 80,
            settings: Vec::new(),
            threads: 1,
            connections: 1,
            pipeline: 1,
            in_process_gets: crate::targets::InProcessGets::default(),
            server_pid,
        }
    }

    const ZIPCACHE_STATS: &str = "STAT pid 1\r\nSTAT curr_items 7\r\nSTAT dram_hits 5\r\n\
        STAT ssd_hits 0\r\nSTAT dram_used 4096\r\nSTAT objects_resident 7\r\n\
        STAT rss_bytes 95420416\r\nSTAT compression_ratio_dram 1.87\r\nSTAT wa NaN\r\nEND\r\n";

    #[test]
    fn zipcache_stats_give_rss_and_the_engine_figures() {
        let addr = fake_server(ZIPCACHE_STATS).to_string();
        let target =
            NetTarget::remote("zipcache://x", &addr, Protocol::Memcached, &budget(None)).unwrap();
        let snap = target.snapshot().unwrap();
        assert_eq!(snap.held.rss_bytes, Some(95_420_416));
        assert_eq!(snap.held.dram_bytes_used, Some(4096));
        assert_eq!(snap.objects_resident, Some(7));
        assert_eq!(snap.dram_hits, Some(5));
        assert_eq!(snap.held.compression_ratio_dram, Some(1.87));
        // What the server cannot say (printed as text) is absent, not a number.
        assert_eq!(snap.held.wa, None);
        assert_eq!(snap.server_cpu_seconds, None);
    }

    #[test]
    fn a_server_pid_gives_rss_from_proc() {
        let addr = fake_server(ZIPCACHE_STATS).to_string();
        let pid = std::process::id();
        let target = NetTarget::remote(
            "zipcache://x",
            &addr,
            Protocol::Memcached,
            &budget(Some(pid)),
        )
        .unwrap();
        let snap = target.snapshot().unwrap();
        let rss = snap.held.rss_bytes.unwrap();
        assert_ne!(rss, 95_420_416, "/proc/PID, not the stat");
        assert!(rss > 0);
        assert!(snap.server_cpu_seconds.is_some());
    }

    #[test]
    fn memcached_says_no_rss_unless_its_pid_is_known() {
        let reply =
            "STAT pid 1\r\nSTAT curr_items 3\r\nSTAT get_hits 9\r\nSTAT bytes 300\r\nEND\r\n";
        let addr = fake_server(reply).to_string();
        let target =
            NetTarget::remote("memcached://x", &addr, Protocol::Memcached, &budget(None)).unwrap();
        let snap = target.snapshot().unwrap();
        assert_eq!(snap.held.rss_bytes, None);
        assert_eq!(snap.objects_resident, Some(3));
        assert_eq!(snap.dram_hits, Some(9));
        // Given its PID, the bench reads memcached's RSS from /proc.
        let stats: HashMap<String, String> = [("curr_items".into(), "3".into())].into();
        let snap = snapshot_of(Protocol::Memcached, &stats, Some(std::process::id()));
        assert!(snap.held.rss_bytes.is_some_and(|rss| rss > 0));
        assert_eq!(snap.objects_resident, Some(3));
    }

    #[test]
    fn extstore_stats_give_its_objects_and_the_bytes_its_file_holds() {
        let stats: HashMap<String, String> = [
            ("get_hits", "10"),
            ("get_extstore", "4"),
            ("extstore_bytes_written", "9000"),
            ("extstore_objects_used", "70"),
            ("extstore_bytes_used", "6300"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        let snap = snapshot_of(Protocol::Memcached, &stats, None);
        assert_eq!(snap.ssd_hits, Some(4));
        assert_eq!(snap.dram_hits, Some(6));
        assert_eq!(snap.held.ssd_objects, Some(70));
        assert_eq!(snap.held.ssd_flash_bytes, Some(6300));
        assert_eq!(snap.host_bytes_written, Some(9000));
    }
}
