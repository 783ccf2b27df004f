//! memcached's log streams (`watch fetchers mutations ...`): a connection that sends
//! `watch` becomes a watcher, and from then on receives one line per event of the
//! streams it chose, in memcached's format (`ts=… gid=… type=item_get key=…`).
//!
//! The request path pays one relaxed atomic load per event site while nobody watches
//! (`Logger::wants`). With watchers, an event is built once (its key copied) and handed,
//! unformatted, to each interested watcher's bounded queue; the watcher's own task
//! formats and writes it. A watcher that reads too slowly never slows the request path:
//! once its queue is full, events are dropped for it and counted, and it is told
//! `skipped=N` when there is room again, as memcached does.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, watch};

use crate::core::keyspace;
use crate::transport::Peer;
use crate::transport::connection::{Stream, Takeover};

/// Events queued for one watcher before further ones are skipped: with memcached's
/// longest keys (250 bytes, 750 URI-encoded) about 1 MiB of lines per watcher.
pub const WATCHER_QUEUE_EVENTS: usize = 1024;
/// Watchers at once (memcached's limit too).
pub const MAX_WATCHERS: usize = 20;
/// Events one write of a watcher's task takes from its queue.
const WRITE_BATCH: usize = 256;

/// The streams one can watch, as bits of a mask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streams(u32);

impl Streams {
    pub const FETCHERS: Streams = Streams(1);
    pub const MUTATIONS: Streams = Streams(1 << 1);
    pub const EVICTIONS: Streams = Streams(1 << 2);
    pub const CONNEVENTS: Streams = Streams(1 << 3);
    pub const DELETIONS: Streams = Streams(1 << 4);

    /// The streams `watch ARGS` names (no names: fetchers, memcached's default); `None`
    /// for a name we do not know or do not produce (memcached's `sysevents`, `rawcmds`
    /// and the proxy's streams).
    pub fn parse(names: &[&[u8]]) -> Option<Streams> {
        if names.is_empty() {
            return Some(Streams::FETCHERS);
        }
        names.iter().try_fold(Streams(0), |all, name| {
            let one = match *name {
                b"fetchers" => Streams::FETCHERS,
                b"mutations" => Streams::MUTATIONS,
                b"evictions" => Streams::EVICTIONS,
                b"connevents" => Streams::CONNEVENTS,
                b"deletions" => Streams::DELETIONS,
                _ => return None,
            };
            Some(Streams(all.0 | one.0))
        })
    }

    fn overlaps(self, other: Streams) -> bool {
        self.0 & other.0 != 0
    }
}

/// Outcome of a storage command, in memcached's `status=` words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreStatus {
    Stored,
    NotStored,
    Exists,
    NotFound,
}

impl StoreStatus {
    fn word(self) -> &'static str {
        match self {
            StoreStatus::Stored => "stored",
            StoreStatus::NotStored => "not_stored",
            StoreStatus::Exists => "exists",
            StoreStatus::NotFound => "not_found",
        }
    }
}

/// Why a connection closed (memcached's `reason=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The client quit or hung up.
    Normal,
    /// We hung up on a protocol error.
    Error,
}

/// What happened, with what the line needs; formatted only by the watchers' tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    ItemGet {
        key: Box<[u8]>,
        /// The value's length, if the key was found.
        found: Option<usize>,
        conn: u64,
    },
    ItemStore {
        key: Box<[u8]>,
        status: StoreStatus,
        command: &'static str,
        /// Seconds left to live; 0 = never expires (memcached's convention).
        ttl: u64,
        size: usize,
        conn: u64,
    },
    Deleted {
        key: Box<[u8]>,
        command: &'static str,
        size: usize,
    },
    Eviction {
        key: Box<[u8]>,
        /// Seconds it had left; -1 = no expiry.
        ttl: i64,
        size: usize,
    },
    ConnNew {
        peer: Peer,
        conn: u64,
    },
    ConnClose {
        peer: Peer,
        reason: CloseReason,
        conn: u64,
    },
}

impl Event {
    fn stream(&self) -> Streams {
        match self {
            Event::ItemGet { .. } => Streams::FETCHERS,
            Event::ItemStore { .. } => Streams::MUTATIONS,
            Event::Deleted { .. } => Streams::DELETIONS,
            Event::Eviction { .. } => Streams::EVICTIONS,
            Event::ConnNew { .. } | Event::ConnClose { .. } => Streams::CONNEVENTS,
        }
    }
}

/// An event as logged: when, and its place in the server's sequence (`gid`).
#[derive(Debug)]
pub struct Logged {
    micros: u64,
    gid: u64,
    event: Event,
}

impl Logged {
    /// The event's line, in memcached's format (`clsid=1`: we have one size class,
    /// as `stats items` reports).
    fn format(&self, out: &mut Vec<u8>) {
        let mut line = format!(
            "ts={}.{:06} gid={} ",
            self.micros / 1_000_000,
            self.micros % 1_000_000,
            self.gid
        );
        // Writing to a String cannot fail.
        let _ = match &self.event {
            Event::ItemGet { key, found, conn } => write!(
                line,
                "type=item_get key={} status={} clsid=1 cfd={conn} size={}",
                uri_encode(key),
                if found.is_some() {
                    "found"
                } else {
                    "not_found"
                },
                found.unwrap_or(0)
            ),
            Event::ItemStore {
                key,
                status,
                command,
                ttl,
                size,
                conn,
            } => write!(
                line,
                "type=item_store key={} status={} cmd={command} ttl={ttl} clsid=1 cfd={conn} size={size}",
                uri_encode(key),
                status.word()
            ),
            Event::Deleted { key, command, size } => write!(
                line,
                "type=deleted key={} cmd={command} clsid=1 size={size}",
                uri_encode(key)
            ),
            Event::Eviction { key, ttl, size } => write!(
                line,
                "type=eviction key={} ttl={ttl} clsid=1 size={size}",
                uri_encode(key)
            ),
            Event::ConnNew { peer, conn } => {
                write!(line, "type=conn_new {} cfd={conn}", endpoint(peer))
            }
            Event::ConnClose { peer, reason, conn } => write!(
                line,
                "type=conn_close {} reason={} cfd={conn}",
                endpoint(peer),
                match reason {
                    CloseReason::Normal => "normal",
                    CloseReason::Error => "error",
                }
            ),
        };
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
}

/// memcached's key encoding in log lines: everything but ASCII letters, digits and
/// `-._~` as `%XX`, so a key never breaks the `name=value` format.
/// A connection event's `rip= rport= transport=`: memcached's for a unix-socket client,
/// which has no address, is `rip=unix rport=0 transport=local`.
fn endpoint(peer: &Peer) -> String {
    match peer {
        Peer::Tcp(addr) => format!("rip={} rport={} transport=tcp", addr.ip(), addr.port()),
        Peer::Unix => "rip=unix rport=0 transport=local".to_string(),
    }
}

pub fn uri_encode(key: &[u8]) -> String {
    let mut text = String::with_capacity(key.len());
    for &b in key {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            text.push(b as char);
        } else {
            let _ = write!(text, "%{b:02X}");
        }
    }
    text
}

/// One item of a watcher's queue.
#[derive(Debug)]
enum Queued {
    Line(Arc<Logged>),
    /// This many events were dropped here because the queue was full.
    Skipped(u64),
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Queued>,
    /// Events dropped since the last `Skipped` was queued.
    skipped: u64,
}

/// A watcher's side of the logger: the streams it wants and its queue.
struct Subscriber {
    streams: Streams,
    queue: Mutex<Queue>,
    wake: Notify,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Subscriber {
    /// Queues `logged`, or counts it skipped if the queue is full. Before the first
    /// event that fits after a skip goes the `skipped=N` notice, so the watcher sees
    /// where its lines are missing.
    fn offer(&self, logged: &Arc<Logged>, counters: &LogCounters) {
        let mut queue = locked(&self.queue);
        let room = WATCHER_QUEUE_EVENTS - queue.items.len();
        let needed = if queue.skipped > 0 { 2 } else { 1 };
        if room < needed {
            queue.skipped += 1;
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if queue.skipped > 0 {
            let skipped = std::mem::take(&mut queue.skipped);
            queue.items.push_back(Queued::Skipped(skipped));
        }
        queue.items.push_back(Queued::Line(logged.clone()));
        drop(queue);
        self.wake.notify_one();
    }

    /// Formats up to `WRITE_BATCH` queued items into `out`; how many it took.
    fn drain_into(&self, out: &mut Vec<u8>) -> usize {
        let batch: Vec<Queued> = {
            let mut queue = locked(&self.queue);
            let n = queue.items.len().min(WRITE_BATCH);
            queue.items.drain(..n).collect()
        };
        for item in &batch {
            match item {
                Queued::Line(logged) => logged.format(out),
                Queued::Skipped(n) => {
                    let _ = writeln!(out, "skipped={n}");
                }
            }
        }
        batch.len()
    }
}

#[derive(Default)]
struct LogCounters {
    skipped: AtomicU64,
    sent: AtomicU64,
}

/// The server's log streams: who watches what.
#[derive(Default)]
pub struct Logger {
    /// The union of every watcher's streams: the request path's only check.
    active: AtomicU32,
    /// Read-locked by every event, written only when a watcher comes or goes.
    subscribers: RwLock<Vec<Arc<Subscriber>>>,
    next_gid: AtomicU64,
    counters: LogCounters,
}

/// Why `Logger::subscribe` refused.
#[derive(Debug, PartialEq, Eq)]
pub struct TooManyWatchers;

impl Logger {
    /// Whether anyone watches `streams`; the event sites check this before building an
    /// event.
    pub fn wants(&self, streams: Streams) -> bool {
        Streams(self.active.load(Ordering::Relaxed)).overlaps(streams)
    }

    /// Hands `event` to every watcher of its stream.
    pub fn log(&self, event: Event) {
        let stream = event.stream();
        if !self.wants(stream) {
            return;
        }
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let logged = Arc::new(Logged {
            micros,
            gid: self.next_gid.fetch_add(1, Ordering::Relaxed) + 1,
            event,
        });
        for subscriber in self.subscribers().iter() {
            if subscriber.streams.overlaps(stream) {
                subscriber.offer(&logged, &self.counters);
            }
        }
    }

    /// Registers a watcher of `streams`; it stays registered until the `Watcher` drops.
    pub fn subscribe(self: &Arc<Self>, streams: Streams) -> Result<Watcher, TooManyWatchers> {
        let subscriber = Arc::new(Subscriber {
            streams,
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
        });
        let mut subscribers = self.subscribers_mut();
        if subscribers.len() >= MAX_WATCHERS {
            return Err(TooManyWatchers);
        }
        subscribers.push(subscriber.clone());
        self.active.fetch_or(streams.0, Ordering::Relaxed);
        Ok(Watcher {
            logger: self.clone(),
            subscriber,
        })
    }

    fn subscribers(&self) -> RwLockReadGuard<'_, Vec<Arc<Subscriber>>> {
        self.subscribers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn subscribers_mut(&self) -> RwLockWriteGuard<'_, Vec<Arc<Subscriber>>> {
        self.subscribers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn unsubscribe(&self, gone: &Arc<Subscriber>) {
        let mut subscribers = self.subscribers_mut();
        subscribers.retain(|s| !Arc::ptr_eq(s, gone));
        let active = subscribers.iter().fold(0, |all, s| all | s.streams.0);
        self.active.store(active, Ordering::Relaxed);
    }

    /// memcached's logger stats: `log_watchers`, `log_watcher_skipped`, `log_watcher_sent`.
    pub fn stats(&self) -> [(&'static str, u64); 3] {
        [
            ("log_watchers", self.subscribers().len() as u64),
            (
                "log_watcher_skipped",
                self.counters.skipped.load(Ordering::Relaxed),
            ),
            (
                "log_watcher_sent",
                self.counters.sent.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// The engine reports the values it evicts for room here (`watch evictions`).
impl zipcache::EvictionListener for Logger {
    fn listening(&self) -> bool {
        self.wants(Streams::EVICTIONS)
    }

    fn evicted(&self, key: &[u8], value_len: usize, expires_at_ms: Option<u64>, now_ms: u64) {
        // A large hash's field objects are no memcached client's keys.
        if keyspace::is_element(key) {
            return;
        }
        let ttl = expires_at_ms.map_or(-1, |at| at.saturating_sub(now_ms).div_ceil(1000) as i64);
        // The client's key: the engine evicts keys as stored (`core/keyspace.rs`).
        let key = keyspace::parse(key).map_or(key, |(_, key)| key);
        self.log(Event::Eviction {
            key: key.into(),
            ttl,
            size: value_len,
        });
    }
}

/// A registered watcher; dropping it unregisters it.
pub struct Watcher {
    logger: Arc<Logger>,
    subscriber: Arc<Subscriber>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.logger.unsubscribe(&self.subscriber);
    }
}

impl Watcher {
    /// Writes the watcher's lines to `stream` as they come, until the client hangs up,
    /// a write fails, or the server shuts down. What the client sends is discarded, as
    /// memcached does: a watcher connection stays a watcher.
    pub async fn stream<T: Stream>(self, mut stream: T, mut shutdown: watch::Receiver<bool>) {
        let mut sink = vec![0u8; 1024];
        let mut out = Vec::new();
        loop {
            out.clear();
            let taken = self.subscriber.drain_into(&mut out);
            if taken > 0 {
                if stream.write_all(&out).await.is_err() || stream.flush().await.is_err() {
                    return;
                }
                self.logger
                    .counters
                    .sent
                    .fetch_add(taken as u64, Ordering::Relaxed);
                continue;
            }
            tokio::select! {
                _ = self.subscriber.wake.notified() => {}
                read = stream.read(&mut sink) => {
                    if matches!(read, Ok(0) | Err(_)) {
                        return;
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// A `watch` connection streams log lines and nothing else.
impl Takeover for Watcher {
    fn run<S: Stream>(
        self,
        stream: S,
        shutdown: watch::Receiver<bool>,
    ) -> impl Future<Output = ()> + Send {
        self.stream(stream, shutdown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(key: &[u8]) -> Event {
        Event::ItemGet {
            key: key.into(),
            found: Some(3),
            conn: 7,
        }
    }

    fn lines(watcher: &Watcher) -> Vec<String> {
        let mut out = Vec::new();
        while watcher.subscriber.drain_into(&mut out) > 0 {}
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn stream_names_parse_like_memcached() {
        assert_eq!(Streams::parse(&[]), Some(Streams::FETCHERS));
        let both = Streams::parse(&[b"fetchers", b"mutations"]).unwrap();
        assert!(both.overlaps(Streams::FETCHERS) && both.overlaps(Streams::MUTATIONS));
        assert!(!both.overlaps(Streams::DELETIONS));
        assert_eq!(Streams::parse(&[b"fetchers", b"nonsense"]), None);
        assert_eq!(Streams::parse(&[b"rawcmds"]), None);
    }

    #[test]
    fn keys_are_uri_encoded() {
        assert_eq!(uri_encode(b"a-b.c_d~9"), "a-b.c_d~9");
        assert_eq!(uri_encode(b"a b#:\xff"), "a%20b%23%3A%FF");
    }

    #[test]
    fn nothing_is_built_without_a_watcher_and_only_wanted_streams_arrive() {
        let logger = Arc::new(Logger::default());
        assert!(!logger.wants(Streams::FETCHERS));
        let watcher = logger.subscribe(Streams::MUTATIONS).unwrap();
        assert!(logger.wants(Streams::MUTATIONS) && !logger.wants(Streams::FETCHERS));
        logger.log(get(b"k"));
        assert!(lines(&watcher).is_empty());
        drop(watcher);
        assert!(!logger.wants(Streams::MUTATIONS));
        assert_eq!(logger.stats()[0], ("log_watchers", 0));
    }

    #[test]
    fn lines_follow_memcached_formats() {
        let logger = Arc::new(Logger::default());
        let watcher = logger
            .subscribe(
                Streams::parse(&[
                    b"fetchers",
                    b"mutations",
                    b"deletions",
                    b"connevents",
                    b"evictions",
                ])
                .unwrap(),
            )
            .unwrap();
        let peer = Peer::Tcp("127.0.0.1:4000".parse().unwrap());
        logger.log(get(b"a b"));
        logger.log(Event::ItemStore {
            key: b"k".as_slice().into(),
            status: StoreStatus::Stored,
            command: "set",
            ttl: 0,
            size: 4,
            conn: 7,
        });
        logger.log(Event::Deleted {
            key: b"k".as_slice().into(),
            command: "md",
            size: 4,
        });
        logger.log(Event::Eviction {
            key: b"e".as_slice().into(),
            ttl: -1,
            size: 10,
        });
        logger.log(Event::ConnNew { peer, conn: 9 });
        logger.log(Event::ConnClose {
            peer,
            reason: CloseReason::Error,
            conn: 9,
        });
        logger.log(Event::ConnNew {
            peer: Peer::Unix,
            conn: 10,
        });
        logger.log(Event::ConnClose {
            peer: Peer::Unix,
            reason: CloseReason::Normal,
            conn: 10,
        });
        let lines = lines(&watcher);
        let bodies: Vec<&str> = lines
            .iter()
            .map(|l| {
                let (head, body) = l.split_at(l.find(" type=").unwrap());
                let (ts, gid) = head.split_once(' ').unwrap();
                let (secs, micros) = ts.strip_prefix("ts=").unwrap().split_once('.').unwrap();
                assert!(secs.parse::<u64>().unwrap() > 1_600_000_000 && micros.len() == 6);
                assert!(gid.starts_with("gid="));
                &body[1..]
            })
            .collect();
        assert_eq!(
            bodies,
            [
                "type=item_get key=a%20b status=found clsid=1 cfd=7 size=3",
                "type=item_store key=k status=stored cmd=set ttl=0 clsid=1 cfd=7 size=4",
                "type=deleted key=k cmd=md clsid=1 size=4",
                "type=eviction key=e ttl=-1 clsid=1 size=10",
                "type=conn_new rip=127.0.0.1 rport=4000 transport=tcp cfd=9",
                "type=conn_close rip=127.0.0.1 rport=4000 transport=tcp reason=error cfd=9",
                "type=conn_new rip=unix rport=0 transport=local cfd=10",
                "type=conn_close rip=unix rport=0 transport=local reason=normal cfd=10",
            ]
        );
    }

    #[test]
    fn a_full_queue_skips_and_says_so_when_there_is_room() {
        let logger = Arc::new(Logger::default());
        let watcher = logger.subscribe(Streams::FETCHERS).unwrap();
        for _ in 0..WATCHER_QUEUE_EVENTS + 5 {
            logger.log(get(b"k"));
        }
        // Room for the notice and one more line.
        let mut out = Vec::new();
        watcher.subscriber.drain_into(&mut out);
        logger.log(get(b"after"));
        let lines = lines(&watcher);
        let n = lines.len();
        assert_eq!(lines[n - 2], "skipped=5");
        assert!(lines[n - 1].contains("key=after"));
        assert_eq!(logger.stats()[1], ("log_watcher_skipped", 5));
    }

    #[test]
    fn watchers_are_limited() {
        let logger = Arc::new(Logger::default());
        let watchers: Vec<Watcher> = (0..MAX_WATCHERS)
            .map(|_| logger.subscribe(Streams::FETCHERS).unwrap())
            .collect();
        assert!(logger.subscribe(Streams::FETCHERS).is_err());
        drop(watchers);
        assert!(logger.subscribe(Streams::FETCHERS).is_ok());
    }
}
