//! Both protocols over the transport's connection loop, in process: replies within the
//! output budget however many keys a request names, reads in flight, and what a read
//! ahead may answer.

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream as StdTcpStream};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::watch;

use zipcache::{Config, GetOptions, ZipCache};
use zipcache_device::HeldDevice;

use crate::core::ServerOptions;
use crate::fuzzing::{memcached_session, new_hybrid_engine, options, resp_request};
use crate::memcache::MemcacheSession;
use crate::resp::RespSession;
use crate::server::Parts;
use crate::transport::connection::{Processed, Session, Step, process, serve};
use crate::transport::output::{OUTPUT_BUDGET, Output};
use crate::transport::prefetch::{Prefetch, ReadAhead};

pub(crate) fn dram_engine() -> Arc<ZipCache> {
    let config = Config {
        dram_capacity: 64 << 20,
        ..Config::default()
    };
    Arc::new(ZipCache::open(config).unwrap())
}

/// A memcached session over `cache`, outside a listening server.
pub(crate) fn memcache_session(cache: Arc<ZipCache>, options: &ServerOptions) -> MemcacheSession {
    MemcacheSession::new(Parts::detached(cache, options).memcached)
}

/// A RESP session over `cache`, outside a listening server.
pub(crate) fn resp_session(cache: Arc<ZipCache>, options: &ServerOptions) -> RespSession {
    RespSession::new(Parts::detached(cache, options).resp, None)
}

/// Runs `input` (read whole) through `session` as `serve` does, and returns every byte
/// it wrote and the largest reply handed to one write.
pub(crate) fn serve_in_process<S: Session>(mut session: S, input: &[u8]) -> (Vec<u8>, usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (mut written, mut largest) = (Vec::new(), 0);
    let (mut out, mut reads) = (Output::default(), Prefetch::default());
    let mut pos = 0;
    loop {
        let (consumed, processed) = process(&mut session, &input[pos..], &mut out, &mut reads);
        pos += consumed;
        largest = largest.max(out.reply_len());
        written.extend(out.parts().concat());
        out.clear();
        match processed {
            Processed::Flush => {}
            Processed::Await => runtime.block_on(reads.settle()),
            Processed::NeedMore | Processed::Close | Processed::HangUp => {
                return (written, largest);
            }
        }
    }
}

const BIG: usize = 1 << 20;

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
    let session = memcache_session(cache.clone(), &options());
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
    let session = resp_session(cache.clone(), &options());
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
    let session = resp_session(cache.clone(), &options);
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
    // One server's connections, one after another: a cursor is the server's.
    let server = Parts::detached(cache.clone(), &options()).resp;
    let request = |args: &[&[u8]]| {
        let session = RespSession::new(server.clone(), None);
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
    let session = resp_session(cache, &options);
    let (reply, _) = serve_in_process(session, &resp_request(&[b"KEYS", b"*"]));
    assert_eq!(
        String::from_utf8_lossy(&reply),
        format!("-ERR KEYS reply would pass {OUTPUT_BUDGET} bytes; use SCAN\r\n")
    );
}

/// Two pipelined GETs of keys on the SSD: the first one's reply is written while the
/// second one's read is still in flight, not held back until it completes.
#[test]
fn a_reply_goes_out_once_its_own_reads_are_in() {
    let device = Arc::new(HeldDevice::new(1 << 14, true));
    device.hold(false);
    let config = Config {
        dram_capacity: 256 << 10,
        // Keep every object: the flusher waits rather than dropping any.
        flush_wait_ms: 60_000,
        ..Config::default()
    };
    let cache = Arc::new(ZipCache::open_on(config, Some(device.clone())).unwrap());
    let key = |i: usize| format!("key:{i:08}");
    // Hex of a hash: about as compressible as real values, so most keys leave DRAM.
    let value = |i: usize| {
        let hash = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        format!(
            "{hash:016x}{:016x}{:016x}",
            hash.rotate_left(17),
            hash.rotate_left(41)
        )
    };
    for i in 0..20_000 {
        cache
            .put(key(i).as_bytes(), value(i).as_bytes(), None)
            .unwrap();
    }
    cache.settle().unwrap();
    let on_ssd: Vec<usize> = (0..20_000)
        .filter(|&i| {
            let mut get = cache.get_item_async(key(i).as_bytes(), GetOptions::default());
            get.take_ready().is_none()
        })
        .take(2)
        .collect();
    assert_eq!(on_ssd.len(), 2, "the flusher moved keys to the SSD");
    device.hold(true);

    let mut session = memcache_session(cache, &ServerOptions::default());
    let input = format!("get {}\r\nget {}\r\n", key(on_ssd[0]), key(on_ssd[1]));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut prefetch = Prefetch::default();
    let mut out = Output::default();
    let mut step = |prefetch: &mut Prefetch, out: &mut Output, from: usize| {
        process(&mut session, &input.as_bytes()[from..], out, prefetch)
    };

    let (consumed, processed) = step(&mut prefetch, &mut out, 0);
    assert_eq!((consumed, processed), (0, Processed::Await));
    assert_eq!(
        device.in_flight(),
        2,
        "the second GET's read started with the first's"
    );
    device.complete_oldest();
    let settled = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), prefetch.settle()).await });
    assert!(settled.is_ok(), "settling waits for the oldest read only");
    let (more, processed) = step(&mut prefetch, &mut out, consumed);
    assert_eq!(processed, Processed::Await);
    let reply = |i: usize| format!("VALUE {} 0 48\r\n{}\r\nEND\r\n", key(i), value(i));
    assert_eq!(String::from_utf8_lossy(&out[..]), reply(on_ssd[0]));

    device.complete_oldest();
    runtime.block_on(prefetch.settle());
    let (last, processed) = step(&mut prefetch, &mut out, consumed + more);
    assert_eq!(processed, Processed::NeedMore);
    assert_eq!(consumed + more + last, input.len());
    assert_eq!(
        String::from_utf8_lossy(&out[..]),
        reply(on_ssd[0]) + &reply(on_ssd[1])
    );
}

/// GETs of one key read together answer from the hit the first one took, `mg` too;
/// a change of the key drops it, so the GET after the change reads the new value.
#[test]
fn a_held_hit_answers_repeats_until_its_key_changes() {
    let cache = new_hybrid_engine();
    let old = vec![b'o'; 100 << 10];
    cache.put(b"big", &old, None).unwrap();
    let input = b"get big\r\nmg big v\r\nget big big\r\nset big 0 0 3\r\nnew\r\nget big\r\n";
    let before = cache.stats().gets;
    let out = memcached_session(cache.clone(), input, input.len());
    let value = |v: &[u8]| {
        [
            format!("VALUE big 0 {}\r\n", v.len()).as_bytes(),
            v,
            b"\r\n",
        ]
        .concat()
    };
    let expected = [
        value(&old),
        b"END\r\n".to_vec(),
        format!("VA {}\r\n", old.len()).into_bytes(),
        old.clone(),
        b"\r\n".to_vec(),
        value(&old),
        value(&old),
        b"END\r\nSTORED\r\n".to_vec(),
        value(b"new"),
        b"END\r\n".to_vec(),
    ]
    .concat();
    assert!(
        out == expected,
        "{}",
        String::from_utf8_lossy(&out[out.len() - 40..])
    );
    assert_eq!(
        cache.stats().gets - before,
        2,
        "big read once before the set, once after"
    );
}

/// An `mg` that fails on a bad token after its read started, then an oversized `set`
/// that deletes the key: a `get` read with them must not answer the deleted value.
#[test]
fn a_deleted_value_is_never_answered() {
    let cache = new_hybrid_engine();
    cache.put(b"gone", b"old", None).unwrap();
    let too_large = 2 << 20;
    let mut input = b"mg gone v Cx\r\n".to_vec();
    input.extend_from_slice(format!("set gone 0 0 {too_large}\r\n").as_bytes());
    input.extend(std::iter::repeat_n(b'x', too_large));
    input.extend_from_slice(b"\r\nget gone\r\n");
    let out = memcached_session(cache, &input, input.len());
    assert_eq!(
        String::from_utf8_lossy(&out),
        "CLIENT_ERROR bad token in command line format\r\n\
         SERVER_ERROR object too large for cache\r\nEND\r\n"
    );
}

/// A session answering each line with `ok`, calling `probe` as it executes one.
struct Lines<F: FnMut()> {
    probe: F,
}

impl<F: FnMut()> Session for Lines<F> {
    type Takeover = std::convert::Infallible;

    fn step(&mut self, input: &[u8], out: &mut Output, _: &mut Prefetch) -> Step {
        match input.iter().position(|&b| b == b'\n') {
            None => Step::NeedMore,
            Some(end) => {
                (self.probe)();
                out.extend_from_slice(b"ok\n");
                Step::Consumed(end + 1)
            }
        }
    }

    fn read_ahead(&mut self, _: &[u8], _: &mut ReadAhead<'_>) -> Option<usize> {
        None
    }

    fn take_over(&mut self) -> Option<Self::Takeover> {
        None
    }

    fn too_large(&mut self, _: &mut Output) {}
}

/// Two connections of one thread, both with requests waiting: neither reply is written
/// before both connections' requests ran (`after_neighbours`), so the client is woken
/// once for the round, not once per connection.
#[test]
fn replies_of_a_round_go_out_after_all_its_requests_ran() {
    let transport = Parts::detached(dram_engine(), &options()).transport;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let connect = || {
        let client = StdTcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (client, listener.accept().unwrap().0)
    };
    let ((a_client, a_server), (b_client, b_server)) = (connect(), connect());
    for (client, server) in [(&a_client, &a_server), (&b_client, &b_server)] {
        (&*client).write_all(b"one\ntwo\n").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        client.set_nonblocking(true).unwrap();
        server.set_nonblocking(true).unwrap();
    }
    let early_reply = Cell::new(false);
    // A connection's request finds the other connection's reply already sent.
    let replied = |client: &StdTcpStream| client.peek(&mut [0u8]).is_ok_and(|n| n > 0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_stop, stopped) = watch::channel(false);
    let two_here = AtomicUsize::new(2);
    runtime.block_on(async {
        let a = TcpStream::from_std(a_server).unwrap();
        let b = TcpStream::from_std(b_server).unwrap();
        let probe_a = || early_reply.set(early_reply.get() | replied(&b_client));
        let probe_b = || early_reply.set(early_reply.get() | replied(&a_client));
        tokio::join!(
            serve(
                a,
                Lines { probe: probe_a },
                &transport,
                stopped.clone(),
                &two_here
            ),
            serve(
                b,
                Lines { probe: probe_b },
                &transport,
                stopped.clone(),
                &two_here
            ),
        );
    });
    assert!(
        !early_reply.get(),
        "a reply was written before the other connection's requests ran"
    );
    for mut client in [a_client, b_client] {
        client.set_nonblocking(false).unwrap();
        let mut replies = String::new();
        client.read_to_string(&mut replies).unwrap();
        assert_eq!(replies, "ok\nok\n");
    }
}
