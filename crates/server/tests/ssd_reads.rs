//! GETs that must read the SSD tier go in flight on the runtime thread's io_uring while
//! the thread serves on: pipelined and mixed with DRAM hits and writes, on both protocols,
//! every reply comes in request order with the right value.

mod common;

use std::path::PathBuf;

use common::{Client, TestServer, hash_hex};
use zipcache::config::DeviceCompression;
use zipcache::{Config, SsdConfig};

const KEYS: usize = 20_000;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn server_with_ssd(name: &str) -> (TestServer, TempDir) {
    let dir = std::env::temp_dir().join(format!("zipcache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = Config {
        dram_capacity: 512 << 10,
        ssd: Some(SsdConfig {
            path: dir.join("ssd.bin"),
            size: 128 << 20,
            direct_io: true,
            device_compression: DeviceCompression::Emulate,
            logical_to_physical: 4.0,
        }),
        // Keep every object: the test checks values, not what overload forgets.
        flush_wait_ms: 60_000,
        ..Config::default()
    };
    (
        TestServer::on_engine(config, TestServer::options()),
        TempDir(dir),
    )
}

fn key(i: usize) -> String {
    format!("key:{i:08}")
}

/// Hex of a hash of `i`: about as compressible as real values, so most keys leave DRAM.
fn value(i: usize, version: u32) -> String {
    let seed = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(version);
    hash_hex(seed, format!("v{version}-"), 60 + i % 30)
}

fn fill(client: &mut Client) {
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(500) {
        let mut batch = String::new();
        for &i in chunk {
            let v = value(i, 1);
            batch.push_str(&format!("set {} 0 0 {}\r\n{v}\r\n", key(i), v.len()));
        }
        client.send(batch.as_bytes());
        for _ in chunk {
            assert_eq!(client.line(), "STORED");
        }
    }
}

/// Expects `VALUE key 0 len` + data for each present key, then `END`.
fn expect_values(client: &mut Client, want: &[(String, Option<String>)]) {
    for (k, v) in want {
        if let Some(v) = v {
            assert_eq!(client.line(), format!("VALUE {k} 0 {}", v.len()));
            assert_eq!(client.line(), *v, "{k}");
        }
    }
    assert_eq!(client.line(), "END");
}

#[test]
fn pipelined_gets_from_the_ssd_answer_in_order() {
    let (server, _dir, mut client) = filled_server("ssd-reads");
    let stats = server.cache.stats();
    assert!(stats.ssd_objects > KEYS as u64 / 2, "{stats:?}");

    // One pipeline: single and multi-key GETs (most answered by the SSD), overwrites and
    // deletes of keys read before and after, and DRAM hits in between.
    let mut pipeline = String::new();
    let mut replies: Vec<Vec<(String, Option<String>)>> = Vec::new();
    let mut current: Vec<Option<String>> = (0..KEYS).map(|i| Some(value(i, 1))).collect();
    for step in 0..600 {
        let i = (step * 7919) % KEYS;
        match step % 6 {
            0..=2 => {
                pipeline.push_str(&format!("get {}\r\n", key(i)));
                replies.push(vec![(key(i), current[i].clone())]);
            }
            3 => {
                let ks: Vec<usize> = (0..4).map(|j| (i + j * 4099) % KEYS).collect();
                let names: Vec<String> = ks.iter().map(|&k| key(k)).collect();
                pipeline.push_str(&format!("get {}\r\n", names.join(" ")));
                replies.push(ks.iter().map(|&k| (key(k), current[k].clone())).collect());
            }
            4 => {
                let v = value(i, 2);
                pipeline.push_str(&format!("set {} 0 0 {}\r\n{v}\r\n", key(i), v.len()));
                current[i] = Some(v);
                replies.push(Vec::new());
            }
            _ => {
                pipeline.push_str(&format!("delete {}\r\n", key(i)));
                current[i] = None;
                replies.push(Vec::new());
            }
        }
    }
    client.send(pipeline.as_bytes());
    for (step, want) in replies.iter().enumerate() {
        match step % 6 {
            4 => assert_eq!(client.line(), "STORED"),
            5 => {
                let line = client.line();
                assert!(line == "DELETED" || line == "NOT_FOUND", "{line}");
            }
            _ => expect_values(&mut client, want),
        }
    }
    let stats = server.cache.stats();
    assert!(stats.ssd_hits > 100, "{stats:?}");
    // Were SSD reads made on the runtime threads, none would count here. How many go in
    // flight rather than being answered by a promoted copy depends on timing: a loaded
    // machine gave exactly 100 (a bound of > 100 failed there).
    assert!(
        stats.ssd_async_reads > 20,
        "SSD reads went in flight, not on the runtime thread: {stats:?}"
    );
    assert_eq!(stats.ssd_reads_in_flight, 0);
    assert!(
        stats.ssd_device_reads >= stats.ssd_async_reads && stats.ssd_device_writes > 0,
        "the device counts every read and the flusher's writes: {stats:?}"
    );
    server.cache.settle().expect("settle");
    assert_eq!(
        server.cache.stats().ssd_io_in_flight,
        0,
        "all I/O completed"
    );

    // A pipelined GET behind a write of the same key sees the write, although the GETs
    // before the write had their reads started together.
    let (a, b) = (KEYS - 1, KEYS - 2);
    let new = value(b, 3);
    client.send(
        format!(
            "get {}\r\nget {}\r\nset {} 0 0 {}\r\n{new}\r\nget {}\r\nmg {} v\r\n",
            key(a),
            key(b),
            key(b),
            new.len(),
            key(b),
            key(b)
        )
        .as_bytes(),
    );
    expect_values(&mut client, &[(key(a), current[a].clone())]);
    expect_values(&mut client, &[(key(b), current[b].clone())]);
    assert_eq!(client.line(), "STORED");
    expect_values(&mut client, &[(key(b), Some(new.clone()))]);
    assert_eq!(client.line(), format!("VA {}", new.len()));
    assert_eq!(client.line(), new);
    current[b] = Some(new);

    // The reads pipelined behind writes of other keys start with the first one's (a
    // look-aside client sends the SETs that fill its misses between its GETs); a read of
    // a key written or deleted before it in the pipeline still sees that change.
    let [a, b, c, d, e] = [KEYS - 3, KEYS - 4, KEYS - 5, KEYS - 6, KEYS - 7];
    let new = value(b, 4);
    client.send(
        format!(
            "get {}\r\nset {} 0 0 {}\r\n{new}\r\nget {}\r\ndelete {}\r\nget {} {}\r\nmn\r\nget {}\r\n",
            key(a),
            key(b),
            new.len(),
            key(b),
            key(c),
            key(c),
            key(d),
            key(e)
        )
        .as_bytes(),
    );
    expect_values(&mut client, &[(key(a), current[a].clone())]);
    assert_eq!(client.line(), "STORED");
    expect_values(&mut client, &[(key(b), Some(new.clone()))]);
    let line = client.line();
    assert!(line == "DELETED" || line == "NOT_FOUND", "{line}");
    expect_values(&mut client, &[(key(c), None), (key(d), current[d].clone())]);
    assert_eq!(client.line(), "MN");
    expect_values(&mut client, &[(key(e), current[e].clone())]);
    current[b] = Some(new);
    current[c] = None;

    // RESP: GET and MGET of keys on the SSD.
    let mut resp = Client::connect(server.resp);
    let ks: Vec<usize> = (0..8).map(|j| (j * 2477 + 13) % KEYS).collect();
    let mut request = format!("*{}\r\n$4\r\nMGET\r\n", ks.len() + 1);
    for &k in &ks {
        request.push_str(&format!("${}\r\n{}\r\n", key(k).len(), key(k)));
    }
    resp.send(request.as_bytes());
    assert_eq!(resp.line(), format!("*{}", ks.len()));
    for &k in &ks {
        match &current[k] {
            Some(v) => {
                assert_eq!(resp.line(), format!("${}", v.len()));
                assert_eq!(resp.line(), *v);
            }
            None => assert_eq!(resp.line(), "$-1"),
        }
    }
}

/// A server over an SSD tier holding every key at version 1 (most of them on the SSD
/// only), and the memcached client that filled it.
fn filled_server(name: &str) -> (TestServer, TempDir, Client) {
    let (server, dir) = server_with_ssd(name);
    let mut client = Client::connect(server.memcached);
    fill(&mut client);
    server.cache.settle().unwrap();
    (server, dir, client)
}

/// A seeded xorshift: each call returns a number below its argument.
fn below(seed: u64) -> impl FnMut(usize) -> usize {
    let mut state = seed;
    move |n| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    }
}

/// Random pipelines over a few hundred keys, most of them on the SSD: GETs (single and
/// multi-key), `mg`, SETs, DELETEs and `mn` in any order, each pipeline sent at once, so
/// that reads start ahead past writes of other keys. Every reply must be what running the
/// requests one by one gives: nothing is forgotten here (no SSD eviction, no drops).
#[test]
fn random_pipelines_answer_as_if_run_one_by_one() {
    let (server, _dir, mut client) = filled_server("ssd-random-pipelines");
    let keys: Vec<usize> = (0..300).map(|i| (i * 6007 + 11) % KEYS).collect();
    let mut current: Vec<Option<String>> = (0..KEYS).map(|i| Some(value(i, 1))).collect();
    let mut next = below(0x9E37_79B9_7F4A_7C15);
    for round in 0..30 {
        enum Reply {
            Values(Vec<(String, Option<String>)>),
            Meta(Option<String>),
            Line(&'static str),
            Deleted(bool),
        }
        let mut pipeline = String::new();
        let mut replies = Vec::new();
        for _ in 0..80 {
            let k = keys[next(keys.len())];
            match next(10) {
                0..=3 => {
                    pipeline.push_str(&format!("get {}\r\n", key(k)));
                    replies.push(Reply::Values(vec![(key(k), current[k].clone())]));
                }
                4 => {
                    let ks = [k, keys[next(keys.len())]];
                    pipeline.push_str(&format!("get {} {}\r\n", key(ks[0]), key(ks[1])));
                    let want = ks.iter().map(|&k| (key(k), current[k].clone())).collect();
                    replies.push(Reply::Values(want));
                }
                5 => {
                    pipeline.push_str(&format!("mg {} v\r\n", key(k)));
                    replies.push(Reply::Meta(current[k].clone()));
                }
                6 | 7 => {
                    let v = value(k, 2 + round);
                    pipeline.push_str(&format!("set {} 0 0 {}\r\n{v}\r\n", key(k), v.len()));
                    current[k] = Some(v);
                    replies.push(Reply::Line("STORED"));
                }
                8 => {
                    pipeline.push_str(&format!("delete {}\r\n", key(k)));
                    replies.push(Reply::Deleted(current[k].take().is_some()));
                }
                _ => {
                    pipeline.push_str("mn\r\n");
                    replies.push(Reply::Line("MN"));
                }
            }
        }
        client.send(pipeline.as_bytes());
        for reply in &replies {
            match reply {
                Reply::Values(want) => expect_values(&mut client, want),
                Reply::Meta(Some(v)) => {
                    assert_eq!(client.line(), format!("VA {}", v.len()));
                    assert_eq!(client.line(), *v);
                }
                Reply::Meta(None) => assert_eq!(client.line(), "EN"),
                Reply::Line(line) => assert_eq!(client.line(), *line),
                Reply::Deleted(true) => assert_eq!(client.line(), "DELETED"),
                Reply::Deleted(false) => assert_eq!(client.line(), "NOT_FOUND"),
            }
        }
    }
    let stats = server.cache.stats();
    assert!(
        stats.ssd_hits > 100 && stats.ssd_async_reads > 100,
        "{stats:?}"
    );
    assert_eq!(stats.ssd_write_drops + stats.ssd_evicted_superleaves, 0);
}

/// RESP bulk string of `s`.
fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

/// The same over RESP: GET, MGET, SET, DEL and MSET in random pipelines.
#[test]
fn random_resp_pipelines_answer_as_if_run_one_by_one() {
    let (server, _dir, _filler) = filled_server("ssd-random-resp");
    let mut resp = Client::connect(server.resp);
    let keys: Vec<usize> = (0..300).map(|i| (i * 7919 + 5) % KEYS).collect();
    let mut current: Vec<Option<String>> = (0..KEYS).map(|i| Some(value(i, 1))).collect();
    let mut next = below(0x2545_F491_4F6C_DD1D);
    let expect_bulk = |resp: &mut Client, want: &Option<String>| match want {
        Some(v) => {
            assert_eq!(resp.line(), format!("${}", v.len()));
            assert_eq!(resp.line(), *v);
        }
        None => assert_eq!(resp.line(), "$-1"),
    };
    for round in 0..30 {
        enum Reply {
            Bulks(Vec<Option<String>>, bool),
            Line(String),
        }
        let mut pipeline = String::new();
        let mut replies = Vec::new();
        for _ in 0..80 {
            let k = keys[next(keys.len())];
            let j = keys[next(keys.len())];
            match next(8) {
                0..=2 => {
                    pipeline.push_str(&format!("*2\r\n$3\r\nGET\r\n{}", bulk(&key(k))));
                    replies.push(Reply::Bulks(vec![current[k].clone()], false));
                }
                3 => {
                    pipeline.push_str(&format!(
                        "*3\r\n$4\r\nMGET\r\n{}{}",
                        bulk(&key(k)),
                        bulk(&key(j))
                    ));
                    replies.push(Reply::Bulks(
                        vec![current[k].clone(), current[j].clone()],
                        true,
                    ));
                }
                4 => {
                    let v = value(k, 2 + round);
                    pipeline.push_str(&format!("*3\r\n$3\r\nSET\r\n{}{}", bulk(&key(k)), bulk(&v)));
                    current[k] = Some(v);
                    replies.push(Reply::Line("+OK".into()));
                }
                5 => {
                    let (v, w) = (value(k, 40 + round), value(j, 80 + round));
                    pipeline.push_str(&format!(
                        "*5\r\n$4\r\nMSET\r\n{}{}{}{}",
                        bulk(&key(k)),
                        bulk(&v),
                        bulk(&key(j)),
                        bulk(&w)
                    ));
                    current[k] = Some(v);
                    current[j] = Some(w);
                    replies.push(Reply::Line("+OK".into()));
                }
                _ => {
                    pipeline.push_str(&format!("*2\r\n$3\r\nDEL\r\n{}", bulk(&key(k))));
                    let gone = current[k].take().is_some();
                    replies.push(Reply::Line(format!(":{}", u8::from(gone))));
                }
            }
        }
        resp.send(pipeline.as_bytes());
        for reply in &replies {
            match reply {
                Reply::Bulks(want, array) => {
                    if *array {
                        assert_eq!(resp.line(), format!("*{}", want.len()));
                    }
                    for want in want {
                        expect_bulk(&mut resp, want);
                    }
                }
                Reply::Line(line) => assert_eq!(resp.line(), *line),
            }
        }
    }
    let stats = server.cache.stats();
    assert!(
        stats.ssd_hits > 100 && stats.ssd_async_reads > 100,
        "{stats:?}"
    );
    assert_eq!(stats.ssd_write_drops + stats.ssd_evicted_superleaves, 0);
}

/// The value of `field` in a RESP INFO reply read from `resp`.
fn info_field(resp: &mut Client, field: &str) -> u64 {
    resp.send(b"*1\r\n$4\r\nINFO\r\n");
    let len: usize = resp.line()[1..].parse().unwrap();
    let text = String::from_utf8(resp.bytes(len + 2)).unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{field}:")));
    line.unwrap()[field.len() + 1..].parse().unwrap()
}

/// A request counts once in `total_commands_processed`, however many steps it takes:
/// RESP GETs that wait for the SSD, and memcached gets that do, count one each.
#[test]
fn a_request_waiting_on_the_ssd_counts_once() {
    let (server, _dir, mut client) = filled_server("ssd-counted-once");
    let mut resp = Client::connect(server.resp);
    let keys: Vec<usize> = (0..200).map(|i| (i * 7919 + 5) % KEYS).collect();
    let waited_before = server.cache.stats().ssd_async_reads;
    let before = info_field(&mut resp, "total_commands_processed");
    for &k in &keys {
        resp.send(format!("*2\r\n$3\r\nGET\r\n{}", bulk(&key(k))).as_bytes());
        let v = value(k, 1);
        assert_eq!(resp.line(), format!("${}", v.len()));
        assert_eq!(resp.line(), v);
    }
    for &k in &keys {
        client.send(format!("get {}\r\n", key(k)).as_bytes());
        expect_values(&mut client, &[(key(k), Some(value(k, 1)))]);
    }
    let after = info_field(&mut resp, "total_commands_processed");
    assert!(
        server.cache.stats().ssd_async_reads > waited_before + 100,
        "most of these GETs read the SSD"
    );
    // Both INFOs count: the one before was counted once it ran.
    assert_eq!(after - before, 2 * keys.len() as u64 + 1);
}
