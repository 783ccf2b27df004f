//! memcached's LRU crawler (`lru_crawler ...`) and `stats cachedump`.
//!
//! The engine has no slab classes: every item is in class 1, so a class list naming 1
//! (or `all`, or `hash`) covers the whole cache and any other valid class (2 to 63) is
//! empty. A metadump, mgdump or cachedump walks the engine's index in key order
//! (`ZipCache::scan_keys`: keys and metadata, no values), a batch at a time, and stops
//! appending once the connection's output passes its budget, to go on once that is
//! written: a big cache is never buffered whole, and between batches the connection's
//! thread serves its other clients. The scan reads without touching: no access is
//! recorded, expired and deleted objects are not seen. A crawl drops the expired objects DRAM
//! still holds (`ZipCache::reclaim_expired`) on a thread of its own. As memcached's
//! single crawler thread, one crawl or dump runs at a time (`BUSY` for the others).

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use zipcache::{ItemInfo, Reclaimed, ZipCache};

use crate::core::keyspace::Keyspace;

use super::engine_error;
use super::line;
use super::{BAD_FORMAT, base64_encode};
use crate::transport::output::Output;

/// The class every item is in.
pub const CLASS: u32 = 1;
/// memcached's class ids are below `MAX_NUMBER_OF_SLAB_CLASSES` (64).
const CLASS_LIMIT: u32 = 64;
/// Keys one batch of a dump scans.
const BATCH: usize = 512;
/// memcached caps a cachedump reply at 2 MB (`END` included).
const CACHEDUMP_MAX: usize = 2 << 20;
/// A crawl sleeps `lru_crawler sleep` microseconds after each this many objects, as
/// memcached's crawler does.
const CHECKS_PER_SLEEP: u64 = 1000;
/// memcached's default `lru_crawler sleep`, and its largest.
const DEFAULT_SLEEP_US: u32 = 100;
const SLEEP_MAX_US: u32 = 1_000_000;

const DISABLED: &str = "CLIENT_ERROR lru crawler disabled";
const BUSY: &str = "BUSY currently processing crawler request";
const BAD_CLASS: &str = "BADCLASS invalid class id";
const NOT_STARTED: &str = "NOTSTARTED no items to crawl";
const UNKNOWN_ERROR: &str = "ERROR an unknown error happened";

/// The classes a crawl or dump names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Classes {
    All,
    /// memcached walks its hash table instead of its LRUs; we have one walk either way.
    Hash,
    Listed(Vec<u32>),
    /// A class id that is not a number in 1..64.
    Bad,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpKind {
    /// `key=... exp=... ...` lines, then `END`.
    Meta,
    /// `mg <key>` lines, then `EN`.
    Mg,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Crawl(Classes),
    Dump(DumpKind, Classes),
    Enable,
    Disable,
    Sleep(u32),
    ToCrawl(u32),
    CacheDump { class: u32, limit: u32 },
}

fn number(token: &[u8]) -> Option<u32> {
    std::str::from_utf8(token).ok()?.parse().ok()
}

fn classes(token: &[u8]) -> Classes {
    match token {
        b"all" => Classes::All,
        b"hash" => Classes::Hash,
        list => {
            let ids: Option<Vec<u32>> = list
                .split(|&b| b == b',')
                .filter(|id| !id.is_empty())
                .map(|id| number(id).filter(|id| (1..CLASS_LIMIT).contains(id)))
                .collect();
            ids.map_or(Classes::Bad, Classes::Listed)
        }
    }
}

/// `lru_crawler <subcommand> [argument]`, or memcached's reply to a bad one.
pub fn parse(tokens: &[&[u8]]) -> Result<Command, &'static str> {
    let command = match (tokens.get(1).copied(), tokens.len()) {
        (Some(b"crawl"), 3) => Command::Crawl(classes(tokens[2])),
        (Some(b"metadump"), 3) => Command::Dump(DumpKind::Meta, classes(tokens[2])),
        (Some(b"mgdump"), 3) => Command::Dump(DumpKind::Mg, classes(tokens[2])),
        (Some(b"tocrawl"), 3) => match number(tokens[2]) {
            Some(n) => Command::ToCrawl(n),
            None => return Err(BAD_FORMAT),
        },
        (Some(b"sleep"), 3) => match number(tokens[2]) {
            Some(us) if us <= SLEEP_MAX_US => Command::Sleep(us),
            Some(_) => return Err("CLIENT_ERROR sleep must be one second or less"),
            None => return Err(BAD_FORMAT),
        },
        (Some(b"enable"), 2) => Command::Enable,
        (Some(b"disable"), 2) => Command::Disable,
        _ => return Err("ERROR"),
    };
    Ok(command)
}

/// `stats cachedump <class> <limit>`, or memcached's reply to a bad one.
pub fn parse_cachedump(tokens: &[&[u8]]) -> Result<Command, &'static str> {
    if tokens.len() < 4 {
        return Err("CLIENT_ERROR bad command line");
    }
    match (number(tokens[2]), number(tokens[3])) {
        (Some(class), Some(_)) if class >= CLASS_LIMIT => Err("CLIENT_ERROR Illegal slab id"),
        (Some(class), Some(limit)) => Ok(Command::CacheDump { class, limit }),
        _ => Err(BAD_FORMAT),
    }
}

/// The crawler's settings and counters, server-wide.
pub struct Crawler {
    enabled: AtomicBool,
    sleep_us: AtomicU32,
    /// Most objects a crawl checks; 0 = all.
    tocrawl: AtomicU32,
    /// A crawl or dump is running (`lru_crawler_running`).
    busy: AtomicBool,
    starts: AtomicU64,
    checked: AtomicU64,
    reclaimed: AtomicU64,
    /// The server is stopping: a crawl ends at its next step, none starts. Its condvar
    /// wakes a crawl out of its `lru_crawler sleep`.
    stopping: (Mutex<bool>, Condvar),
    /// The crawl thread, a holder of the engine, joined at the stop (`Crawler::stop`).
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The right to run the one crawl or dump; dropping it (the dump's connection closed,
/// say) lets the next one start.
pub struct Claim(Arc<Crawler>);

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

impl Crawler {
    pub fn new(enabled: bool) -> Arc<Crawler> {
        Arc::new(Crawler {
            enabled: AtomicBool::new(enabled),
            sleep_us: AtomicU32::new(DEFAULT_SLEEP_US),
            tocrawl: AtomicU32::new(0),
            busy: AtomicBool::new(false),
            starts: AtomicU64::new(0),
            checked: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            stopping: (Mutex::new(false), Condvar::new()),
            thread: Mutex::new(None),
        })
    }

    fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn stopping(&self) -> bool {
        *self.stopping.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps `pause` unless the server stops first; whether it is stopping.
    fn pause(&self, pause: Duration) -> bool {
        let (stopping, woken) = &self.stopping;
        let stopping = stopping.lock().unwrap_or_else(|p| p.into_inner());
        let (stopping, _) = woken
            .wait_timeout_while(stopping, pause, |stopping| !*stopping)
            .unwrap_or_else(|p| p.into_inner());
        *stopping
    }

    /// The server stops (its serving threads have ended): a crawl under way ends at its
    /// next step, even mid-sleep, and its thread is joined, so that it no longer holds
    /// the engine that the stop closes.
    pub fn stop(&self) {
        *self.stopping.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.stopping.1.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    fn claim(self: &Arc<Self>) -> Option<Claim> {
        if self.stopping() {
            return None;
        }
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        self.starts.fetch_add(1, Ordering::Relaxed);
        Some(Claim(self.clone()))
    }

    /// Its lines of `stats`.
    pub fn general_stats(&self) -> [(&'static str, u64); 2] {
        [
            (
                "lru_crawler_running",
                u64::from(self.busy.load(Ordering::Acquire)),
            ),
            ("lru_crawler_starts", self.starts.load(Ordering::Relaxed)),
        ]
    }

    /// Its lines of `stats settings`.
    pub fn settings_stats(&self) -> [(&'static str, String); 3] {
        [
            (
                "lru_crawler",
                if self.enabled() { "yes" } else { "no" }.to_string(),
            ),
            (
                "lru_crawler_sleep",
                self.sleep_us.load(Ordering::Relaxed).to_string(),
            ),
            (
                "lru_crawler_tocrawl",
                self.tocrawl.load(Ordering::Relaxed).to_string(),
            ),
        ]
    }

    /// Its lines of `stats items` (class 1: every item).
    pub fn items_stats(&self) -> [(&'static str, u64); 2] {
        [
            (
                "items:1:crawler_reclaimed",
                self.reclaimed.load(Ordering::Relaxed),
            ),
            (
                "items:1:crawler_items_checked",
                self.checked.load(Ordering::Relaxed),
            ),
        ]
    }

    /// One crawl: drops expired DRAM objects, pausing as `lru_crawler sleep` asks, until
    /// done, `tocrawl` objects were checked, or the crawler is disabled.
    fn reclaim(&self, cache: &ZipCache) -> Reclaimed {
        let pause = Duration::from_micros(self.sleep_us.load(Ordering::Relaxed).into());
        let limit = u64::from(self.tocrawl.load(Ordering::Relaxed));
        let mut paused_at = 0;
        let done = cache.reclaim_expired(|so_far| {
            if !pause.is_zero() && so_far.checked >= paused_at + CHECKS_PER_SLEEP {
                if self.pause(pause) {
                    return false;
                }
                paused_at = so_far.checked;
            }
            self.enabled() && !self.stopping() && (limit == 0 || so_far.checked < limit)
        });
        self.checked.fetch_add(done.checked, Ordering::Relaxed);
        self.reclaimed.fetch_add(done.reclaimed, Ordering::Relaxed);
        done
    }
}

/// Whether the listed classes include ours; `Err` is the reply when they are unusable.
fn covers(classes: &Classes) -> Result<bool, &'static str> {
    match classes {
        Classes::All | Classes::Hash => Ok(true),
        Classes::Listed(ids) if ids.is_empty() => Err(NOT_STARTED),
        Classes::Listed(ids) => Ok(ids.contains(&CLASS)),
        Classes::Bad => Err(BAD_CLASS),
    }
}

/// Runs a crawler command; a dump that started is returned, to be streamed with
/// [`Dump::fill`] (a metadump's or mgdump's `OK` line is already in `out`).
pub fn execute(
    cache: &Arc<ZipCache>,
    crawler: &Arc<Crawler>,
    command: Command,
    out: &mut Vec<u8>,
) -> Option<Dump> {
    let reply = match command {
        Command::Enable | Command::Disable => {
            crawler
                .enabled
                .store(command == Command::Enable, Ordering::Relaxed);
            "OK"
        }
        Command::Sleep(us) => {
            crawler.sleep_us.store(us, Ordering::Relaxed);
            "OK"
        }
        Command::ToCrawl(n) => {
            crawler.tocrawl.store(n, Ordering::Relaxed);
            "OK"
        }
        Command::Crawl(classes) => crawl(cache, crawler, &classes),
        Command::Dump(kind, classes) => match start_dump(crawler, kind, &classes, out) {
            Ok(dump) => return Some(dump),
            Err(reply) => reply,
        },
        Command::CacheDump { class, limit } => return cachedump(class, limit, out),
    };
    line(out, reply);
    None
}

fn crawl(cache: &Arc<ZipCache>, crawler: &Arc<Crawler>, classes: &Classes) -> &'static str {
    if !crawler.enabled() {
        return DISABLED;
    }
    // memcached walks its hash table only to dump.
    if *classes == Classes::Hash {
        return UNKNOWN_ERROR;
    }
    let ours = match covers(classes) {
        Ok(ours) => ours,
        Err(reply) => return reply,
    };
    let Some(claim) = crawler.claim() else {
        return BUSY;
    };
    if !ours {
        // Only empty classes: crawled at once.
        return "OK";
    }
    let cache = cache.clone();
    // The thread of the crawl before this one has ended (the claim was free): joined.
    let mut thread = crawler.thread.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ended) = thread.take() {
        let _ = ended.join();
    }
    let spawned = std::thread::Builder::new()
        .name("lru-crawler".into())
        .spawn(move || {
            claim.0.reclaim(&cache);
            drop(claim);
        });
    match spawned {
        Ok(spawned) => {
            *thread = Some(spawned);
            "OK"
        }
        Err(_) => UNKNOWN_ERROR,
    }
}

fn start_dump(
    crawler: &Arc<Crawler>,
    kind: DumpKind,
    classes: &Classes,
    out: &mut Vec<u8>,
) -> Result<Dump, &'static str> {
    if !crawler.enabled() {
        return Err(DISABLED);
    }
    // The dump's lines must not mix with earlier replies still unsent (memcached hands
    // the connection to its crawler thread and refuses the same way).
    if !out.is_empty() {
        return Err(match kind {
            DumpKind::Meta => "ERROR cannot pipeline other commands before metadump",
            DumpKind::Mg => "ERROR cannot pipeline other commands before mgdump",
        });
    }
    let ours = covers(classes)?;
    let claim = crawler.claim().ok_or(BUSY)?;
    line(out, "OK");
    Ok(Dump {
        lines: Lines::Dump(kind),
        after: None,
        done: !ours,
        _claim: Some(claim),
    })
}

/// A metadump, mgdump or cachedump in progress on a connection.
pub struct Dump {
    lines: Lines,
    /// The last key sent: the next line is for the first key after it.
    after: Option<Vec<u8>>,
    /// Every line was sent (or none is in the classes asked for).
    done: bool,
    /// A metadump's or mgdump's right to run; a cachedump runs beside the crawler, as in
    /// memcached.
    _claim: Option<Claim>,
}

/// What a dump's lines are.
enum Lines {
    Dump(DumpKind),
    /// `stats cachedump`: its limit (0 = none), the items shown and the bytes sent.
    CacheDump {
        limit: u32,
        shown: u32,
        bytes: usize,
    },
}

impl Lines {
    /// Appends `key`'s line; false when the dump ends before it (a cachedump's limit).
    fn append(&mut self, key: &[u8], info: &ItemInfo, out: &mut Vec<u8>) -> bool {
        match self {
            Lines::Dump(DumpKind::Meta) => metadump_line(key, info, out),
            Lines::Dump(DumpKind::Mg) => mgdump_line(key, out),
            Lines::CacheDump {
                limit,
                shown,
                bytes,
            } => {
                if *limit != 0 && shown == limit {
                    return false;
                }
                if !text_key(key) {
                    return true;
                }
                let entry = format!(" [{} b; {} s]\r\n", info.value_len, expiry_seconds(info, 0));
                let len = "ITEM ".len() + key.len() + entry.len();
                if *bytes + len + "END\r\n".len() > CACHEDUMP_MAX {
                    return false;
                }
                out.extend_from_slice(b"ITEM ");
                out.extend_from_slice(key);
                out.extend_from_slice(entry.as_bytes());
                *shown += 1;
                *bytes += len;
            }
        }
        true
    }

    fn closing(&self) -> &'static str {
        match self {
            Lines::Dump(DumpKind::Meta) | Lines::CacheDump { .. } => "END",
            Lines::Dump(DumpKind::Mg) => "EN",
        }
    }
}

impl Dump {
    /// Appends lines until `out` passes the output budget or the dump ends, then the
    /// closing line; true once that is appended.
    pub fn fill(&mut self, cache: &Keyspace, out: &mut Output) -> bool {
        while !self.done {
            if !out.within_budget() {
                return false;
            }
            let batch = match scan_after(cache, self.after.as_deref()) {
                Ok(batch) => batch,
                Err(e) => {
                    line(out, &engine_error(&e));
                    return true;
                }
            };
            let last = batch.len() < BATCH;
            let mut stopped = false;
            for (stored, info) in batch {
                if !out.within_budget() {
                    // The next fill starts at this key.
                    stopped = true;
                    break;
                }
                // Left-overs of a slot that moved, and hashes, are not dumped
                // (`core/keyspace.rs`).
                if let Some(key) = cache.listed(&stored, &info)
                    && !self.lines.append(key, &info, out)
                {
                    self.done = true;
                    break;
                }
                self.after = Some(stored);
            }
            self.done |= last && !stopped;
        }
        line(out, self.lines.closing());
        true
    }
}

/// The next `BATCH` live stored keys after `after` (from the start if `None`); fewer
/// only at the end.
fn scan_after(
    cache: &Keyspace,
    after: Option<&[u8]>,
) -> zipcache::Result<Vec<(Vec<u8>, ItemInfo)>> {
    let start = after.map_or(Bound::Unbounded, Bound::Excluded);
    cache
        .engine()
        .scan_keys::<&[u8]>((start, Bound::Unbounded), BATCH)
}

/// An absolute expiry in Unix seconds, or `never`.
fn expiry_seconds(item: &ItemInfo, never: i64) -> i64 {
    item.expires_at_ms.map_or(never, |t| (t / 1000) as i64)
}

/// memcached's URI encoding of keys: alphanumerics and `-._~` stay, the rest is `%XX`.
fn uri_encode(key: &[u8], out: &mut Vec<u8>) {
    for &b in key {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
}

/// memcached's line, byte for byte (a space, then `\n` alone). `la` and `fetch` are
/// left out where the engine does not know them (setting `track_access` off, or an
/// object on the SSD tier), as `me` does: a made-up value would be a wrong answer.
/// `size` is key plus value bytes (memcached adds its item header).
fn metadump_line(key: &[u8], item: &ItemInfo, out: &mut Vec<u8>) {
    out.extend_from_slice(b"key=");
    uri_encode(key, out);
    let exp = expiry_seconds(item, -1);
    let (la, fetch) = match item.access {
        Some(access) => (
            format!(" la={}", access.last_access_ms / 1000),
            format!(" fetch={}", if access.fetched { "yes" } else { "no" }),
        ),
        None => (String::new(), String::new()),
    };
    let rest = format!(
        " exp={exp}{la} cas={}{fetch} cls={CLASS} size={} flags={} \n",
        item.cas,
        key.len() + item.value_len,
        item.flags
    );
    out.extend_from_slice(rest.as_bytes());
}

/// A key that can be sent as a text-protocol token as it is; memcached dumps the keys it
/// stored as binary (meta `b`) in base64, and leaves them out of a cachedump.
fn text_key(key: &[u8]) -> bool {
    key.iter().all(|&b| b > b' ' && b != 0x7f)
}

fn mgdump_line(key: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"mg ");
    if text_key(key) {
        out.extend_from_slice(key);
    } else {
        out.extend_from_slice(&base64_encode(key));
        out.extend_from_slice(b" b");
    }
    out.extend_from_slice(b"\r\n");
}

/// `ITEM <key> [<value bytes> b; <expiry, Unix seconds, 0 = never> s]` lines for up to
/// `limit` items (0 = as many as fit memcached's 2 MB), then `END`, streamed as a dump.
/// memcached lists an LRU from its most recent end; ours come in key order.
fn cachedump(class: u32, limit: u32, out: &mut Vec<u8>) -> Option<Dump> {
    if class != CLASS {
        line(out, "END");
        return None;
    }
    Some(Dump {
        lines: Lines::CacheDump {
            limit,
            shown: 0,
            bytes: 0,
        },
        after: None,
        done: false,
        _claim: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{new_hybrid_engine, options};
    use crate::serving_tests::{dram_engine, memcache_session, serve_in_process};
    use crate::transport::output::OUTPUT_BUDGET;

    /// A memcached session's whole reply to `input`, and the largest write it made.
    fn session_reply(cache: &Arc<ZipCache>, input: &str) -> (String, usize) {
        let session = memcache_session(cache.clone(), &options());
        let (reply, largest) = serve_in_process(session, input.as_bytes());
        (String::from_utf8(reply).unwrap(), largest)
    }

    /// metadump, mgdump and cachedump over 20,000 small objects and 24 of 256 KiB: every
    /// key once with its size, written in pieces within the output budget (a cachedump
    /// used to be built whole: 800 KB here), and a request pipelined behind a cachedump
    /// answered after its `END`.
    #[test]
    fn dumps_stream_within_the_output_budget() {
        let cache = new_hybrid_engine();
        let big = vec![b'v'; 256 << 10];
        for i in 0..24 {
            cache
                .put(format!("big:{i:02}").as_bytes(), &big, None)
                .unwrap();
        }
        // The fillers, the 8 seed keys and the big ones.
        let live = 20_000 + 8 + 24;
        let (reply, largest) = session_reply(&cache, "lru_crawler metadump all\r\n");
        assert!(largest <= OUTPUT_BUDGET + 1024, "{largest} bytes buffered");
        assert!(reply.starts_with("OK\r\n") && reply.ends_with("END\r\n"));
        let lines: Vec<&str> = reply.lines().filter(|l| l.starts_with("key=")).collect();
        assert_eq!(lines.len(), live);
        let big_lines = lines.iter().filter(|l| l.contains(" size=262150 "));
        assert_eq!(big_lines.count(), 24, "big:NN plus 256 KiB");

        let (reply, largest) = session_reply(&cache, "lru_crawler mgdump all\r\n");
        assert!(largest <= OUTPUT_BUDGET + 1024, "{largest} bytes buffered");
        assert!(reply.ends_with("EN\r\n"));
        let keys: std::collections::BTreeSet<&str> = reply
            .lines()
            .filter_map(|l| l.strip_prefix("mg "))
            .collect();
        assert_eq!(keys.len(), live, "each key once");

        let (reply, largest) = session_reply(&cache, "stats cachedump 1 0\r\nversion\r\n");
        assert!(largest <= OUTPUT_BUDGET + 1024, "{largest} bytes buffered");
        let lines: Vec<&str> = reply.lines().collect();
        assert_eq!(lines.len(), live + 2);
        assert!(lines.contains(&"ITEM big:00 [262144 b; 0 s]"));
        assert_eq!(lines[live], "END");
        assert!(
            lines[live + 1].starts_with("VERSION "),
            "{}",
            lines[live + 1]
        );
        assert_eq!(
            session_reply(&cache, "stats cachedump 1 2\r\n").0,
            format!("{}\r\n{}\r\nEND\r\n", lines[0], lines[1])
        );
    }

    /// A cachedump stops at memcached's 2 MB, `END` included, however it is written.
    #[test]
    fn a_cachedump_stops_at_two_megabytes() {
        let cache = dram_engine();
        for i in 0..60_000 {
            cache
                .put(format!("{i:040}").as_bytes(), b"v", None)
                .unwrap();
        }
        let (reply, _) = session_reply(&cache, "stats cachedump 1 0\r\n");
        let line = format!("ITEM {:040} [1 b; 0 s]\r\n", 0).len();
        assert!(reply.len() <= CACHEDUMP_MAX, "{}", reply.len());
        assert!(reply.len() + line > CACHEDUMP_MAX, "{}", reply.len());
        assert!(reply.ends_with("]\r\nEND\r\n"));
        assert_eq!(
            reply.lines().count(),
            (reply.len() - "END\r\n".len()) / line + 1
        );
    }

    fn command(line: &str) -> Result<Command, &'static str> {
        let tokens: Vec<&'static [u8]> = line
            .to_string()
            .leak()
            .split(' ')
            .map(str::as_bytes)
            .collect();
        if tokens[0] == b"stats" {
            parse_cachedump(&tokens)
        } else {
            parse(&tokens)
        }
    }

    #[test]
    fn subcommands_parse_with_memcached_replies_for_bad_ones() {
        let crawler = Ok;
        assert_eq!(
            command("lru_crawler crawl 1,2"),
            crawler(Command::Crawl(Classes::Listed(vec![1, 2])))
        );
        assert_eq!(
            command("lru_crawler metadump all"),
            crawler(Command::Dump(DumpKind::Meta, Classes::All))
        );
        assert_eq!(
            command("lru_crawler mgdump hash"),
            crawler(Command::Dump(DumpKind::Mg, Classes::Hash))
        );
        for bad in ["0", "64", "x", "1,x", "-1"] {
            assert_eq!(
                command(&format!("lru_crawler crawl {bad}")),
                crawler(Command::Crawl(Classes::Bad)),
                "{bad}"
            );
        }
        assert_eq!(command("lru_crawler sleep 50"), crawler(Command::Sleep(50)));
        assert_eq!(
            command("lru_crawler sleep 1000001"),
            Err("CLIENT_ERROR sleep must be one second or less")
        );
        assert_eq!(command("lru_crawler sleep x"), Err(BAD_FORMAT));
        assert_eq!(
            command("lru_crawler tocrawl 9"),
            crawler(Command::ToCrawl(9))
        );
        assert_eq!(command("lru_crawler tocrawl -1"), Err(BAD_FORMAT));
        assert_eq!(command("lru_crawler enable"), crawler(Command::Enable));
        assert_eq!(command("lru_crawler disable"), crawler(Command::Disable));
        for unknown in [
            "lru_crawler",
            "lru_crawler enable now",
            "lru_crawler crawl",
            "lru_crawler frobnicate 1",
        ] {
            assert_eq!(command(unknown), Err("ERROR"), "{unknown}");
        }
        assert_eq!(
            command("stats cachedump 1 10"),
            crawler(Command::CacheDump {
                class: 1,
                limit: 10
            })
        );
        assert_eq!(
            command("stats cachedump 1"),
            Err("CLIENT_ERROR bad command line")
        );
        assert_eq!(
            command("stats cachedump 64 0"),
            Err("CLIENT_ERROR Illegal slab id")
        );
        assert_eq!(command("stats cachedump x 0"), Err(BAD_FORMAT));
    }

    #[test]
    fn keys_are_uri_encoded_as_memcached_does() {
        let mut out = Vec::new();
        uri_encode(b"a-b_c.d~e f/%\x00\xff", &mut out);
        assert_eq!(out, b"a-b_c.d~e%20f%2F%25%00%FF");
    }

    #[test]
    fn binary_keys_dump_in_base64() {
        let mut out = Vec::new();
        mgdump_line(b"plain:key", &mut out);
        mgdump_line(b"two words", &mut out);
        mgdump_line(b"\x00\x01", &mut out);
        assert_eq!(out, b"mg plain:key\r\nmg dHdvIHdvcmRz b\r\nmg AAE= b\r\n");
    }
}
