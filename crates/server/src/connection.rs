//! The connection loop shared by both protocols and by plain TCP and TLS: read, execute
//! every complete request in the buffer (pipelining), append their replies to one buffer,
//! write it once it passes the output budget or the requests run out. A request whose
//! reply would pass the budget stops and resumes once what is buffered is written.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use zipcache::Item;

use crate::buffer_budget::ConnectionBuffers;
use crate::prefetch::{self, Prefetch, ReadAhead};
use crate::server::Shared;
use crate::stats::Counters;
use crate::watch::Watcher;

/// A byte stream a connection is served over.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send {
    /// Resolves once a read can make progress, before any read buffer is allocated, so an
    /// idle connection holds none.
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
}

impl Transport for TcpStream {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        TcpStream::readable(self)
    }
}

/// rustls may hold decrypted bytes the socket no longer signals, so a TLS connection
/// goes straight to its read (and its idle cost is rustls's own buffers anyway).
impl Transport for TlsStream<TcpStream> {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        std::future::ready(Ok(()))
    }
}

/// What one protocol session does with the front of its read buffer.
pub enum Step {
    /// No complete request at the front: read more.
    NeedMore,
    /// A request spanning this many bytes was executed (its reply, if any, appended).
    Consumed(usize),
    /// The request at the front has done part of its work (appended part of its reply)
    /// and has more: step again, once what is buffered is written if it passed the
    /// output budget. The session remembers where the request stopped (a dump's last
    /// key, a multi-key read's next key); the request stays at the front of the input
    /// until its last part is out.
    Partial,
    /// Write what is buffered, then close (quit, or a protocol error the peer would not
    /// recover from either).
    Close,
    /// The request at the front, this many bytes long, reads the SSD: nothing was
    /// executed in this step; await the reads in flight (`prefetch`), then step again.
    Await(usize),
}

pub trait Session {
    fn step(&mut self, input: &[u8], out: &mut Vec<u8>) -> Step;

    /// If the request at the front is complete and `ahead` walks past it (starting its
    /// GETs if it only reads: `ReadAhead::pass`), returns its length without executing
    /// it; else `None`.
    fn read_ahead(&mut self, input: &[u8], ahead: &mut ReadAhead) -> Option<usize>;

    /// Once a request made this connection a log watcher (memcached's `watch`), the
    /// watcher: the connection then only streams its lines.
    fn take_watcher(&mut self) -> Option<Watcher> {
        None
    }

    /// Appends the error reply for a request larger than `max_request_size`, after
    /// which the connection is closed.
    fn too_large(&mut self, out: &mut Vec<u8>);
}

/// Requests after one that waits for the SSD walked past to start their reads with it, so
/// that a pipeline's GETs have their reads in flight together rather than one after
/// another.
const READ_AHEAD: usize = 64;

/// Replies are written out once they pass this size even mid-pipeline or mid-request: a
/// request appends no more past it (`Step::Partial`), so a connection holds at most this
/// plus one item's reply, however many keys its requests name.
pub const OUTPUT_BUDGET: usize = 256 * 1024;
const READ_CHUNK: usize = 16 * 1024;

/// How a `process` call ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Processed {
    /// Everything complete was executed; read more.
    NeedMore,
    /// The reply buffer is full: write it, then call again.
    Flush,
    Close,
    /// Reads are in flight for the request at the front (`Step::Await`).
    Await,
}

/// Whether a request may append more to `out` before it is written (the values it
/// references count: `prefetch::append_value`).
pub fn within_budget(out: &[u8]) -> bool {
    out.len() + prefetch::value_bytes() < OUTPUT_BUDGET
}

/// The reply `out` as the slices to write in order: its bytes with the `values` it
/// references (`Prefetch::take_values`) in place.
pub fn reply_parts<'a>(out: &'a [u8], values: &'a [(usize, Arc<Item>)]) -> Vec<&'a [u8]> {
    let mut parts = Vec::with_capacity(2 * values.len() + 1);
    let mut from = 0;
    for (at, item) in values {
        parts.push(&out[from..*at]);
        parts.push(&item.value[..]);
        from = *at;
    }
    parts.push(&out[from..]);
    parts
}

/// Executes requests from the front of `input` until it runs out of complete requests,
/// `out` passes `OUTPUT_BUDGET`, or the session closes; returns the bytes consumed.
/// Every request that ends, however, ends through `prefetch::request_done`.
///
/// The SSD reads its requests start reach the kernel together when it returns, before
/// anything awaits them.
pub fn process<S: Session>(session: &mut S, input: &[u8], out: &mut Vec<u8>) -> (usize, Processed) {
    let _submit_reads_at_return = zipcache_device::batch_thread_ring_submissions();
    let mut pos = 0;
    while pos < input.len() {
        match session.step(&input[pos..], out) {
            Step::NeedMore => break,
            Step::Consumed(n) => {
                prefetch::request_done(n);
                pos += n;
            }
            Step::Partial => {}
            Step::Close => {
                prefetch::request_done(0);
                return (pos, Processed::Close);
            }
            Step::Await(front) => {
                // The front request started its own reads; the walk starts behind it.
                prefetch::walk_once(|| {
                    let (mut ahead, mut walk) = (pos + front, ReadAhead::default());
                    for _ in 0..READ_AHEAD {
                        match session.read_ahead(&input[ahead..], &mut walk) {
                            Some(len) => ahead += len,
                            None => break,
                        }
                    }
                    ahead - pos
                });
                return (pos, Processed::Await);
            }
        }
        if !within_budget(out) {
            return (pos, Processed::Flush);
        }
    }
    (pos, Processed::NeedMore)
}

/// How long a closing connection keeps discarding what the client still sends.
const LINGER: Duration = Duration::from_secs(1);

/// Closes after the last reply without losing it: closing a socket with unread input
/// sends a reset, which can destroy the reply (say, a protocol error) before the client
/// reads it. So: send FIN, then discard input until the client closes or `LINGER` passes.
async fn linger<T: Transport>(mut stream: T) {
    let _ = stream.shutdown().await;
    // On the heap: an array here would make every connection's future 4 KiB larger.
    let mut sink = vec![0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// `future`'s output, or `None` if `deadline` passes first.
async fn until<F: Future>(deadline: Option<Instant>, future: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, future).await.ok(),
        None => Some(future.await),
    }
}

/// The read buffer, its capacity charged to the connection's share of the budget for
/// all connections' buffers.
struct Input<'a> {
    bytes: Vec<u8>,
    buffers: &'a ConnectionBuffers,
    charged: usize,
}

impl Input<'_> {
    fn charge_capacity(&mut self) {
        let capacity = self.bytes.capacity();
        self.buffers.recharge(self.charged, capacity);
        self.charged = capacity;
    }

    /// Room for one more read. Growth doubles, so a request trickling in costs linear
    /// copying, but never past `limit` plus one read.
    fn reserve_read(&mut self, limit: usize) {
        let wanted = self.bytes.len() + READ_CHUNK;
        if self.bytes.capacity() < wanted {
            let capacity = (self.bytes.capacity() * 2).clamp(wanted, limit.max(wanted));
            self.bytes.reserve_exact(capacity - self.bytes.len());
            self.charge_capacity();
        }
    }

    /// Drops the `n` bytes at the front; an emptied buffer is freed.
    fn consume(&mut self, n: usize) {
        self.bytes.drain(..n);
        if self.bytes.is_empty() {
            self.bytes = Vec::new();
            self.charge_capacity();
        }
    }
}

/// Why a connection waiting for its next bytes was closed.
#[derive(Clone, Copy)]
enum Kick {
    /// Nothing for `idle_timeout` (memcached's `idle_kicks`).
    Idle,
    /// No complete request within `first_request_timeout` of opening (slowloris).
    FirstRequest,
}

/// When the wait for a connection's next bytes ends, and why.
fn read_deadline(shared: &Shared, opened: Instant, completed: bool) -> Option<(Instant, Kick)> {
    let idle = shared
        .idle_timeout
        .map(|timeout| (Instant::now() + timeout, Kick::Idle));
    let first = shared
        .first_request_timeout
        .filter(|_| !completed)
        .map(|timeout| (opened + timeout, Kick::FirstRequest));
    idle.into_iter().chain(first).min_by_key(|(at, _)| *at)
}

/// Buffers are allocated per read, not per connection: an idle connection holds no
/// buffer at all, so thousands of open connections do not eat into the memory the cache
/// is accounted for (32 KiB each would be 32 MiB per 1000 connections). What a
/// connection buffers is charged to `shared.buffers`, which closes the biggest
/// connection when all of them hold too much (`buffer_budget_kicks`).
///
/// A connection that sends nothing for `shared.idle_timeout` is closed (`idle_kicks`),
/// as is one that has not completed a request `shared.first_request_timeout` after it
/// opened (`first_request_kicks`), and one whose request grows past
/// `shared.max_request_size` (`request_size_kicks`, after the session's error reply).
pub async fn serve<T: Transport, S: Session>(
    mut stream: T,
    mut session: S,
    shared: &Shared,
    mut shutdown: watch::Receiver<bool>,
) {
    let counters = &shared.counters;
    let buffers = shared.buffers.register();
    // Holds only an incomplete request between reads.
    let mut input = Input {
        bytes: Vec::new(),
        buffers: &buffers,
        charged: 0,
    };
    let mut prefetch = Prefetch::default();
    let opened = Instant::now();
    let mut completed = false;
    loop {
        let deadline = read_deadline(shared, opened, completed);
        let read = async {
            stream.readable().await?;
            input.reserve_read(shared.max_request_size);
            stream.read_buf(&mut input.bytes).await
        };
        let read = tokio::select! {
            read = until(deadline.map(|(at, _)| at), read) => read,
            () = buffers.closed() => None,
            // In-flight requests finished synchronously before we got here.
            _ = shutdown.changed() => return,
        };
        if buffers.is_closed() {
            Counters::bump(&counters.buffer_budget_kicks);
            return;
        }
        match read {
            None => {
                Counters::bump(match deadline {
                    Some((_, Kick::FirstRequest)) => &counters.first_request_kicks,
                    _ => &counters.idle_kicks,
                });
                return;
            }
            Some(Ok(0) | Err(_)) => return,
            Some(Ok(n)) => Counters::add(&counters.bytes_read, n),
        }
        let input_bytes = &input.bytes;
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let (consumed, processed) = prefetch::within(&mut prefetch, || {
                process(&mut session, &input_bytes[pos..], &mut out)
            });
            pos += consumed;
            // Large values are written from the items the reply references, not copied.
            let values = prefetch.take_values();
            if !out.is_empty() {
                let value_bytes: usize = values.iter().map(|(_, item)| item.value.len()).sum();
                // Replies waiting for a slow reader count against the budget for all
                // connections' buffers, as the input does.
                let charged = out.capacity() + value_bytes;
                buffers.charge(charged);
                // TLS writes sit in rustls until flushed; for TCP the flush is free.
                let write = async {
                    for part in reply_parts(&out, &values) {
                        stream.write_all(part).await?;
                    }
                    stream.flush().await
                };
                let deadline = shared.write_timeout.map(|limit| Instant::now() + limit);
                let written = tokio::select! {
                    written = until(deadline, write) => written,
                    () = buffers.closed() => Some(Err(io::ErrorKind::OutOfMemory.into())),
                };
                buffers.release(charged);
                match written {
                    Some(Ok(())) => {}
                    Some(Err(_)) if buffers.is_closed() => {
                        Counters::bump(&counters.buffer_budget_kicks);
                        return;
                    }
                    Some(Err(_)) => return,
                    None => {
                        // The client stopped reading: its replies would wait forever.
                        Counters::bump(&counters.write_timeouts);
                        return;
                    }
                }
                Counters::add(&counters.bytes_written, out.len() + value_bytes);
                out.clear();
            }
            if let Some(watcher) = session.take_watcher() {
                return watcher.stream(stream, shutdown).await;
            }
            if processed == Processed::NeedMore {
                // Every complete request ran: nothing prefetched is owed to anyone.
                prefetch.clear();
            }
            match processed {
                Processed::Flush => continue,
                // Replies so far are written; this connection's thread serves others
                // until the oldest of its reads completes.
                Processed::Await => prefetch.settle().await,
                Processed::NeedMore => break,
                Processed::Close => {
                    linger(stream).await;
                    return;
                }
            }
        }
        completed |= pos > 0;
        input.consume(pos);
        if input.bytes.len() > shared.max_request_size {
            Counters::bump(&counters.request_size_kicks);
            let mut out = Vec::new();
            session.too_large(&mut out);
            if stream.write_all(&out).await.is_ok() && stream.flush().await.is_ok() {
                linger(stream).await;
            }
            return;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use zipcache::{Config, ZipCache};

    use super::*;
    use crate::fuzzing::{new_hybrid_engine, options, resp_request};
    use crate::memcache::MemcacheSession;
    use crate::prefetch;
    use crate::resp::RespSession;
    use crate::server::{ServerInfo, ServerOptions, Shared};

    const BIG: usize = 1 << 20;

    pub(crate) fn dram_engine() -> Arc<ZipCache> {
        let config = Config {
            dram_capacity: 64 << 20,
            ..Config::default()
        };
        Arc::new(ZipCache::open(config).unwrap())
    }

    pub(crate) fn shared(cache: Arc<ZipCache>) -> Arc<Shared> {
        Arc::new(Shared::new(cache, ServerInfo::detached(), &options()))
    }

    /// Runs `input` (read whole) through `session` as `serve` does, and returns every byte
    /// it wrote and the largest buffer handed to one write.
    pub(crate) fn serve_in_process<S: Session>(mut session: S, input: &[u8]) -> (Vec<u8>, usize) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (mut written, mut largest) = (Vec::new(), 0);
        let mut prefetch = Prefetch::default();
        let mut pos = 0;
        loop {
            let mut out = Vec::new();
            let (consumed, processed) = prefetch::within(&mut prefetch, || {
                process(&mut session, &input[pos..], &mut out)
            });
            pos += consumed;
            let values = prefetch.take_values();
            let value_bytes: usize = values.iter().map(|(_, item)| item.value.len()).sum();
            largest = largest.max(out.len() + value_bytes);
            written.extend(reply_parts(&out, &values).concat());
            match processed {
                Processed::Flush => {}
                Processed::Await => runtime.block_on(prefetch.settle()),
                Processed::NeedMore | Processed::Close => return (written, largest),
            }
        }
    }

    /// GETs the engine ran for `run`.
    fn engine_gets(cache: &ZipCache, run: impl FnOnce()) -> u64 {
        let before = cache.stats().gets;
        run();
        cache.stats().gets - before
    }

    fn memcached_get_of_one_big_key(cache: Arc<ZipCache>) {
        let value = vec![b'v'; BIG];
        cache.put(b"big", &value, None).unwrap();
        let times = 1500;
        let input = format!("get{}\r\n", " big".repeat(times));
        let session = MemcacheSession::new(shared(cache.clone()));
        let (mut written, mut largest) = (Vec::new(), 0);
        let gets = engine_gets(&cache, || {
            (written, largest) = serve_in_process(session, input.as_bytes());
        });
        if cache.has_ssd_tier() {
            assert_eq!(gets, 1, "big is read once, its hit held for the rest");
        }
        let mut expected = Vec::new();
        for _ in 0..times {
            expected.extend_from_slice(format!("VALUE big 0 {BIG}\r\n").as_bytes());
            expected.extend_from_slice(&value);
            expected.extend_from_slice(b"\r\n");
        }
        expected.extend_from_slice(b"END\r\n");
        assert!(written == expected, "the reply, byte for byte");
        let item_reply = BIG + "VALUE big 0 1048576\r\n\r\n".len();
        assert!(
            largest <= OUTPUT_BUDGET + item_reply,
            "{largest} bytes buffered"
        );
    }

    /// `get big big …` naming a 1 MiB key 1,500 times: the connection never buffers
    /// more than the budget and one item, and the reply is exactly right.
    #[test]
    fn a_get_naming_a_big_key_many_times_stays_within_the_budget() {
        memcached_get_of_one_big_key(dram_engine());
        memcached_get_of_one_big_key(new_hybrid_engine());
    }

    fn resp_mget_of_one_big_key(cache: Arc<ZipCache>) {
        let value = vec![b'v'; BIG];
        cache.put(b"big", &value, None).unwrap();
        let times = 1500;
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(std::iter::repeat_n(&b"big"[..], times));
        args.push(b"missing");
        let mut input = resp_request(&args);
        // An inline MGET and a request behind it, too.
        input.extend_from_slice(b"MGET missing big\r\nPING\r\n");
        let session = RespSession::new(shared(cache.clone()));
        let (mut written, mut largest) = (Vec::new(), 0);
        let gets = engine_gets(&cache, || {
            (written, largest) = serve_in_process(session, &input);
        });
        if cache.has_ssd_tier() {
            // The first MGET reads big once (its hit is held for the rest) and `missing`;
            // the second reads both again: a held hit answers only a run of its key at
            // the front of what a step admits, and `missing` comes first.
            assert_eq!(gets, 4);
        }
        let bulk = [format!("${BIG}\r\n").into_bytes(), value, b"\r\n".to_vec()].concat();
        let mut expected = format!("*{}\r\n", times + 1).into_bytes();
        for _ in 0..times {
            expected.extend_from_slice(&bulk);
        }
        expected.extend_from_slice(b"$-1\r\n*2\r\n$-1\r\n");
        expected.extend_from_slice(&bulk);
        expected.extend_from_slice(b"+PONG\r\n");
        assert!(written == expected, "the reply, byte for byte");
        assert!(
            largest <= OUTPUT_BUDGET + bulk.len(),
            "{largest} bytes buffered"
        );
    }

    #[test]
    fn an_mget_naming_a_big_key_many_times_stays_within_the_budget() {
        resp_mget_of_one_big_key(dram_engine());
        resp_mget_of_one_big_key(new_hybrid_engine());
    }

    /// One MGET of 200,000 keys, most on the SSD: every answer right, in bounded
    /// buffers, and in time linear in the keys (a generous bound: the quadratic walk of
    /// old took ~10^10 comparisons).
    #[test]
    fn an_mget_of_200_000_keys_answers_in_linear_time() {
        let cache = new_hybrid_engine();
        // The engine's fillers are `~filler:{i:08}` for i below 20,000; the rest miss.
        let keys: Vec<String> = (0..200_000u64)
            .map(|i| format!("~filler:{:08}", (i * 7) % 40_000))
            .collect();
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(keys.iter().map(|key| key.as_bytes()));
        let input = resp_request(&args);
        // 4.6 MB of request: past the default `max_request_size`, which would refuse it.
        let options = ServerOptions {
            max_request_size: Some(input.len()),
            ..options()
        };
        let shared = Arc::new(Shared::new(cache.clone(), ServerInfo::detached(), &options));
        let session = RespSession::new(shared);
        let started = Instant::now();
        let (written, largest) = serve_in_process(session, &input);
        let took = started.elapsed();
        let mut expected = format!("*{}\r\n", keys.len()).into_bytes();
        for key in &keys {
            match cache.get(key.as_bytes()).unwrap() {
                Some(value) => {
                    expected.extend_from_slice(format!("${}\r\n", value.len()).as_bytes());
                    expected.extend_from_slice(&value);
                    expected.extend_from_slice(b"\r\n");
                }
                None => expected.extend_from_slice(b"$-1\r\n"),
            }
        }
        assert!(written == expected, "every value right");
        assert!(largest <= OUTPUT_BUDGET + 1024, "{largest} bytes buffered");
        assert!(took < Duration::from_secs(60), "took {took:?}");
    }

    /// SCAN COUNT 100000 and ZCRANGE LIMIT 100000 over 20,000 keys answer in replies
    /// within the budget, with a cursor where SCAN stopped; walked on, the scan lists
    /// every key once; KEYS whose reply would pass the budget names SCAN instead.
    #[test]
    fn scans_stay_within_the_budget() {
        let cache = new_hybrid_engine();
        let request = |args: &[&[u8]]| {
            let session = RespSession::new(shared(cache.clone()));
            serve_in_process(session, &resp_request(args))
        };
        let (mut cursor, mut listed) = (b"0".to_vec(), 0);
        loop {
            let (reply, largest) = request(&[b"SCAN", &cursor, b"COUNT", b"100000"]);
            assert!(largest <= OUTPUT_BUDGET + 1024, "{largest} bytes buffered");
            let text = String::from_utf8_lossy(&reply).into_owned();
            let lines: Vec<&str> = text.split("\r\n").collect();
            cursor = lines[2].as_bytes().to_vec();
            listed += lines[3][1..].parse::<usize>().unwrap();
            if cursor == b"0" {
                break;
            }
        }
        assert_eq!(
            listed,
            20_000 + 8,
            "the fillers and the seed keys, once each"
        );
        let (reply, largest) = request(&[b"ZCRANGE", b"-", b"+", b"LIMIT", b"100000"]);
        assert!(largest <= OUTPUT_BUDGET + 1024, "{largest} bytes buffered");
        assert!(
            reply.starts_with(b"*"),
            "{}",
            String::from_utf8_lossy(&reply[..16])
        );
        let options = ServerOptions {
            keys_limit: 100_000,
            ..options()
        };
        let session = RespSession::new(Arc::new(Shared::new(
            cache,
            ServerInfo::detached(),
            &options,
        )));
        let (reply, _) = serve_in_process(session, &resp_request(&[b"KEYS", b"*"]));
        assert_eq!(
            String::from_utf8_lossy(&reply),
            format!("-ERR KEYS reply would pass {OUTPUT_BUDGET} bytes; use SCAN\r\n")
        );
    }
}
