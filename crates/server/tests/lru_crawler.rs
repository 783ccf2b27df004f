//! memcached's `lru_crawler` commands and `stats cachedump` against a real server:
//! metadump and mgdump of a known set (expired and deleted items absent, keys
//! URI-encoded or base64), a dump during writes, a stalled dump that other clients do
//! not wait for, crawls reclaiming expired items, and the error replies.

mod common;

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use common::{Client, TestServer};
use zipcache::Config;
use zipcache_server::ServerOptions;

/// The lines of a dump after its `OK`, up to (not including) `last`.
fn dump(client: &mut Client, request: &str, last: &str) -> Vec<String> {
    assert_eq!(client.ask(request, 1), ["OK"], "{request}");
    let mut lines = Vec::new();
    loop {
        let line = client.line();
        if line == last {
            return lines;
        }
        lines.push(line);
    }
}

fn metadump(client: &mut Client) -> Vec<String> {
    dump(client, "lru_crawler metadump all\r\n", "END")
}

fn set(client: &mut Client, key: &str, flags: u32, exptime: i64, value: &str) {
    let request = format!("set {key} {flags} {exptime} {}\r\n{value}\r\n", value.len());
    assert_eq!(client.ask(&request, 1), ["STORED"], "{key}");
}

/// `name`'s value in the `stats` section `section` ("" for the general one).
fn stat(client: &mut Client, section: &str, name: &str) -> Option<String> {
    client.send(format!("stats {section}\r\n").as_bytes());
    let prefix = format!("STAT {name} ");
    let mut found = None;
    loop {
        let line = client.line();
        if line == "END" {
            return found;
        }
        if let Some(value) = line.strip_prefix(&prefix) {
            found = Some(value.to_string());
        }
    }
}

/// Stores `z` under each key, in one burst of `noreply` sets.
fn load(client: &mut Client, keys: impl Iterator<Item = String>) {
    let bulk: String = keys
        .map(|key| format!("set {key} 0 0 1 noreply\r\nz\r\n"))
        .collect();
    client.send(bulk.as_bytes());
    assert!(client.ask("version\r\n", 1)[0].starts_with("VERSION"));
}

/// Sends each request and checks its one-line reply.
fn replies(client: &mut Client, exchanges: &[(&str, &str)]) {
    for (request, reply) in exchanges {
        assert_eq!(
            client.ask(&format!("{request}\r\n"), 1),
            [*reply],
            "{request}"
        );
    }
}

fn assert_stat(client: &mut Client, section: &str, name: &str, want: &str) {
    assert_eq!(stat(client, section, name).as_deref(), Some(want), "{name}");
}

/// Waits until no crawl or dump runs (at most 10 s).
fn idle(client: &mut Client) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(client, "", "lru_crawler_running").as_deref() != Some("0") {
        assert!(Instant::now() < deadline, "the crawler stayed busy");
        thread::sleep(Duration::from_millis(20));
    }
}

fn cas_of(client: &mut Client, key: &str) -> u64 {
    let reply = client.ask(&format!("gets {key}\r\n"), 3);
    reply[0].rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn metadump_lists_each_live_item_once_in_memcached_format() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    set(&mut client, "plain", 7, 0, "abc");
    set(&mut client, "dies", 0, 1, "x");
    set(&mut client, "deleted", 0, 0, "x");
    assert_eq!(client.ask("delete deleted\r\n", 1), ["DELETED"]);
    set(&mut client, "odd/key%with:chars\u{e9}", 0, 0, "12345");
    let before = server.cache.now_ms() / 1000;
    set(&mut client, "later", 3, 1000, "v");
    let cas_plain = cas_of(&mut client, "plain");
    let cas_odd = cas_of(&mut client, "odd/key%with:chars\u{e9}");
    let cas_later = cas_of(&mut client, "later");
    thread::sleep(Duration::from_millis(1100));

    let lines = metadump(&mut client);
    assert_eq!(lines.len(), 3, "{lines:?}");
    // Key order; without track_access, la= and fetch= are left out (unknown).
    assert!(lines[0].starts_with("key=later exp="), "{lines:?}");
    let exp: u64 = lines[0]["key=later exp=".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((before + 1000..=before + 1002).contains(&exp), "{exp}");
    assert_eq!(
        lines[0],
        format!("key=later exp={exp} cas={cas_later} cls=1 size=6 flags=3 ")
    );
    assert_eq!(
        lines[1],
        format!("key=odd%2Fkey%25with%3Achars%C3%A9 exp=-1 cas={cas_odd} cls=1 size=25 flags=0 ")
    );
    assert_eq!(
        lines[2],
        format!("key=plain exp=-1 cas={cas_plain} cls=1 size=8 flags=7 ")
    );
    // `hash` and a class list naming class 1 walk the same items.
    assert_eq!(
        dump(&mut client, "lru_crawler metadump hash\r\n", "END"),
        lines
    );
    assert_eq!(
        dump(&mut client, "lru_crawler metadump 3,1\r\n", "END"),
        lines
    );
    // Every other class is empty.
    assert!(dump(&mut client, "lru_crawler metadump 2\r\n", "END").is_empty());
}

#[test]
fn metadump_lines_end_in_a_bare_newline_as_memcached_sends_them() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    set(&mut client, "k", 0, 0, "v");
    let raw = client.ask("lru_crawler metadump all\r\n", 3).join("|");
    let cas = cas_of(&mut client, "k");
    assert_eq!(
        raw,
        format!("OK|key=k exp=-1 cas={cas} cls=1 size=2 flags=0 |END")
    );
    // `Client::line` strips either ending: read the bytes themselves.
    client.send(b"lru_crawler metadump all\r\n");
    let expected = format!("OK\r\nkey=k exp=-1 cas={cas} cls=1 size=2 flags=0 \nEND\r\n");
    assert_eq!(client.bytes(expected.len()), expected.as_bytes());
}

#[test]
fn with_track_access_metadump_reports_last_access_and_fetch_without_touching() {
    let config = Config {
        dram_capacity: 64 << 20,
        track_access: true,
        ..Config::default()
    };
    let server = TestServer::on_engine(config, TestServer::options());
    let mut client = Client::connect(server.memcached);
    set(&mut client, "a", 0, 0, "1");
    set(&mut client, "b", 0, 0, "2");
    let written = server.cache.now_ms() / 1000;
    assert_eq!(client.ask("get b\r\n", 3)[1], "2");
    for _ in 0..2 {
        let lines = metadump(&mut client);
        assert_eq!(lines.len(), 2);
        for (line, key, fetch) in [(&lines[0], "a", "no"), (&lines[1], "b", "yes")] {
            let la: u64 = line
                .split(' ')
                .find_map(|f| f.strip_prefix("la="))
                .expect("la=")
                .parse()
                .unwrap();
            assert!(la.abs_diff(written) <= 1, "{line}");
            assert!(line.starts_with(&format!("key={key} exp=-1 la={la} cas=")));
            assert!(line.contains(&format!(" fetch={fetch} cls=1 ")), "{line}");
        }
    }
}

#[test]
fn mgdump_lists_keys_as_meta_gets_binary_ones_in_base64() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    set(&mut client, "text:key", 0, 0, "v");
    set(&mut client, "gone", 0, 0, "v");
    assert_eq!(client.ask("delete gone\r\n", 1), ["DELETED"]);
    // A key with a space and a NUL, stored through meta's base64 `b` flag.
    assert_eq!(client.ask("ms YSBiAA== 1 b\r\nv\r\n", 1), ["HD"]);
    let lines = dump(&mut client, "lru_crawler mgdump all\r\n", "EN");
    assert_eq!(lines, ["mg YSBiAA== b", "mg text:key"]);
    // Each line is a request the server answers.
    assert_eq!(client.ask("mg YSBiAA== b v\r\n", 2), ["VA 1", "v"]);
}

#[test]
fn a_metadump_during_writes_sees_every_item_that_was_there_throughout() {
    let server = TestServer::start();
    let mut loader = Client::connect(server.memcached);
    load(&mut loader, (0..20_000).map(|i| format!("stay{i:05}")));

    let addr = server.memcached;
    let writer = thread::spawn(move || {
        let mut client = Client::connect(addr);
        for i in 0..5_000 {
            set(&mut client, &format!("churn{i:05}"), 0, 0, "w");
            if i % 2 == 0 {
                assert_eq!(
                    client.ask(&format!("delete churn{i:05}\r\n"), 1),
                    ["DELETED"]
                );
            }
        }
    });
    let mut client = Client::connect(server.memcached);
    let lines = metadump(&mut client);
    writer.join().unwrap();

    let keys: Vec<&str> = lines
        .iter()
        .map(|l| l.strip_prefix("key=").unwrap().split(' ').next().unwrap())
        .collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "in key order, once each"
    );
    let stayed: BTreeSet<&str> = keys
        .iter()
        .copied()
        .filter(|k| k.starts_with("stay"))
        .collect();
    assert_eq!(stayed.len(), 20_000);
    assert!(
        keys.iter()
            .all(|k| k.starts_with("stay") || k.starts_with("churn"))
    );
}

#[test]
fn a_stalled_dump_keeps_the_crawler_busy_but_not_the_server() {
    // One thread: the stalled dump's connection and the others share it.
    let server = TestServer::with_options(ServerOptions {
        threads: 1,
        ..TestServer::options()
    });
    let mut loader = Client::connect(server.memcached);
    let padding = "x".repeat(190);
    load(&mut loader, (0..60_000).map(|i| format!("{i:06}{padding}")));

    // 14 MB of dump the client never reads: more than the socket buffers hold.
    let mut stalled = Client::connect(server.memcached);
    stalled.send(b"lru_crawler metadump all\r\n");
    thread::sleep(Duration::from_millis(200));

    let mut other = Client::connect(server.memcached);
    let started = Instant::now();
    set(&mut other, "still", 0, 0, "served");
    assert_eq!(other.ask("get still\r\n", 3)[1], "served");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_stat(&mut other, "", "lru_crawler_running", "1");
    let busy = "BUSY currently processing crawler request";
    replies(
        &mut other,
        &[
            ("lru_crawler metadump all", busy),
            ("lru_crawler crawl all", busy),
        ],
    );

    // The stalled client goes away: the crawler is free again.
    drop(stalled);
    idle(&mut other);
    assert_eq!(
        dump(&mut other, "lru_crawler mgdump all\r\n", "EN").len(),
        60_001
    );
}

#[test]
fn a_crawl_reclaims_expired_items() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    for i in 0..10 {
        set(&mut client, &format!("short{i}"), 0, 1, "x");
        set(&mut client, &format!("long{i}"), 0, 3600, "x");
    }
    set(&mut client, "forever", 0, 0, "x");
    assert_stat(&mut client, "slabs", "1:used_chunks", "21");
    thread::sleep(Duration::from_millis(1100));
    // Expired, but still held until something reclaims them.
    assert_stat(&mut client, "slabs", "1:used_chunks", "21");

    // A crawl of other classes only reclaims nothing.
    assert_eq!(client.ask("lru_crawler crawl 2,3\r\n", 1), ["OK"]);
    idle(&mut client);
    assert_stat(&mut client, "slabs", "1:used_chunks", "21");

    assert_eq!(client.ask("lru_crawler crawl 1\r\n", 1), ["OK"]);
    idle(&mut client);
    assert_stat(&mut client, "slabs", "1:used_chunks", "11");
    assert_stat(&mut client, "items", "items:1:crawler_reclaimed", "10");
    assert_stat(&mut client, "items", "items:1:crawler_items_checked", "21");
    assert_stat(&mut client, "", "lru_crawler_starts", "2");
    assert_eq!(metadump(&mut client).len(), 11);
}

#[test]
fn tocrawl_and_sleep_are_settings() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    assert_stat(&mut client, "settings", "lru_crawler_sleep", "100");
    assert_eq!(client.ask("lru_crawler sleep 0\r\n", 1), ["OK"]);
    assert_eq!(client.ask("lru_crawler tocrawl 5\r\n", 1), ["OK"]);
    assert_stat(&mut client, "settings", "lru_crawler_sleep", "0");
    assert_stat(&mut client, "settings", "lru_crawler_tocrawl", "5");
    for i in 0..2_000 {
        set(&mut client, &format!("k{i:04}"), 0, 0, "x");
    }
    // tocrawl bounds a crawl, by the leaf: it stops at the first leaf past 5 objects.
    assert_eq!(client.ask("lru_crawler crawl all\r\n", 1), ["OK"]);
    idle(&mut client);
    let checked: u64 = stat(&mut client, "items", "items:1:crawler_items_checked")
        .unwrap()
        .parse()
        .unwrap();
    assert!((5..2_000).contains(&checked), "{checked}");
}

#[test]
fn errors_are_memcacheds() {
    let server = TestServer::with_options(ServerOptions {
        lru_crawler: false,
        ..TestServer::options()
    });
    let mut client = Client::connect(server.memcached);
    assert_stat(&mut client, "settings", "lru_crawler", "no");
    let disabled = "CLIENT_ERROR lru crawler disabled";
    replies(
        &mut client,
        &[
            ("lru_crawler crawl 1", disabled),
            ("lru_crawler metadump all", disabled),
            ("lru_crawler mgdump all", disabled),
            ("lru_crawler enable", "OK"),
        ],
    );
    assert_stat(&mut client, "settings", "lru_crawler", "yes");
    let bad_class = "BADCLASS invalid class id";
    replies(
        &mut client,
        &[
            ("lru_crawler crawl 0", bad_class),
            ("lru_crawler metadump 1,64", bad_class),
            ("lru_crawler mgdump x", bad_class),
            ("lru_crawler crawl ,", "NOTSTARTED no items to crawl"),
            ("lru_crawler crawl hash", "ERROR an unknown error happened"),
            (
                "lru_crawler sleep 2000000",
                "CLIENT_ERROR sleep must be one second or less",
            ),
            (
                "lru_crawler tocrawl x",
                "CLIENT_ERROR bad command line format",
            ),
            ("lru_crawler", "ERROR"),
            ("lru_crawler crawl", "ERROR"),
            ("lru_crawler metadump all extra", "ERROR"),
            ("lru_crawler start", "ERROR"),
        ],
    );
    // A dump must come first in its batch of requests: earlier replies are unsent.
    assert_eq!(
        client.ask("mg foo v\r\nlru_crawler metadump all\r\n", 2),
        ["EN", "ERROR cannot pipeline other commands before metadump"]
    );
    assert_eq!(
        client.ask("mn\r\nlru_crawler mgdump all\r\n", 2),
        ["MN", "ERROR cannot pipeline other commands before mgdump"]
    );
    // Requests after a dump are answered after it.
    set(&mut client, "k", 0, 0, "v");
    assert_eq!(
        client.ask("lru_crawler mgdump all\r\nmn\r\n", 4),
        ["OK", "mg k", "EN", "MN"]
    );
    assert_eq!(client.ask("lru_crawler disable\r\n", 1), ["OK"]);
    assert_stat(&mut client, "settings", "lru_crawler", "no");
}

#[test]
fn cachedump_lists_items_with_value_size_and_expiry() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    set(&mut client, "b", 0, 0, "12345");
    let now = server.cache.now_ms() / 1000;
    set(&mut client, "a", 0, 100, "xy");
    assert_eq!(client.ask("ms AAE= 1 b\r\nv\r\n", 1), ["HD"]);
    let lines = client.ask("stats cachedump 1 0\r\n", 3);
    let exp: u64 = lines[0]
        .strip_prefix("ITEM a [2 b; ")
        .and_then(|rest| rest.strip_suffix(" s]"))
        .expect("ITEM a")
        .parse()
        .unwrap();
    assert!((now + 100..=now + 101).contains(&exp), "{exp}");
    // The binary key is left out, as memcached leaves out the keys it stored binary.
    assert_eq!(lines[1..], ["ITEM b [5 b; 0 s]", "END"]);
    assert_eq!(
        client.ask("stats cachedump 1 1\r\n", 2),
        [lines[0].as_str(), "END"]
    );
    replies(
        &mut client,
        &[
            ("stats cachedump 2 0", "END"),
            ("stats cachedump 64 0", "CLIENT_ERROR Illegal slab id"),
            ("stats cachedump 1", "CLIENT_ERROR bad command line"),
        ],
    );
}
