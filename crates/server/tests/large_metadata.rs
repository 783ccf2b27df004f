//! Commands that change or ask only an item's metadata (touch, gat, EXISTS, STRLEN, add of
//! an existing key) on a large object: its value stays where it is in the large-object
//! log, so they neither write flash nor push other large objects out of the log.

mod common;

use std::path::PathBuf;

use common::{Client, TestServer, hash_hex};
use zipcache::config::DeviceCompression;
use zipcache::{Config, SsdConfig};

/// A value of about 1 MiB (under the default 1 MiB item limit with its key).
const VALUE_LEN: usize = (1 << 20) - 1024;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// 8 MiB of DRAM over a 1 GiB SSD file: the large-object log holds 128 MiB.
fn server(name: &str) -> (TestServer, TempDir) {
    let dir = std::env::temp_dir().join(format!("zipcache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = Config {
        dram_capacity: 8 << 20,
        ssd: Some(SsdConfig {
            path: dir.join("ssd.bin"),
            size: 1 << 30,
            direct_io: false,
            device_compression: DeviceCompression::Host,
            logical_to_physical: 4.0,
        }),
        ..Config::default()
    };
    (
        TestServer::on_engine(config, TestServer::options()),
        TempDir(dir),
    )
}

/// Random hex: what no compression shrinks much.
fn value(i: u64) -> String {
    hash_hex(
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        String::new(),
        VALUE_LEN,
    )
}

fn set(client: &mut Client, key: &str, value: &str) {
    let request = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    assert_eq!(client.ask(&request, 1), ["STORED"], "{key}");
}

fn expect_value(client: &mut Client, key: &str, value: &str) {
    client.send(format!("get {key}\r\n").as_bytes());
    assert_eq!(
        client.line(),
        format!("VALUE {key} 0 {}", value.len()),
        "{key}"
    );
    assert!(client.line() == value, "{key}: another value");
    assert_eq!(client.line(), "END");
}

/// `touch`es of `key`, pipelined, every reply `TOUCHED`.
fn touch(client: &mut Client, key: &str, times: usize) {
    for chunk in (0..times).collect::<Vec<_>>().chunks(500) {
        client.send(format!("touch {key} 0\r\n").repeat(chunk.len()).as_bytes());
        for _ in chunk {
            assert_eq!(client.line(), "TOUCHED");
        }
    }
}

/// The measurement of the finding: nine random 1 MiB values, then 2,000 `touch big 0`
/// (26 KB of input). Each touch used to write the whole value into the log again, which
/// wrapped the log over the eight others. Now they are all still served, none dropped,
/// and 10,000 touches more write less than 1 MiB to the device.
#[test]
fn touching_a_large_object_writes_no_value_and_drops_no_other() {
    let (server, _dir) = server("large-touch");
    let mut client = Client::connect(server.memcached);
    let big = value(100);
    set(&mut client, "big", &big);
    let others: Vec<String> = (0..8).map(value).collect();
    for (i, other) in others.iter().enumerate() {
        set(&mut client, &format!("other{i}"), other);
    }
    assert_eq!(server.cache.stats().large_objects, 9);

    touch(&mut client, "big", 2_000);
    let stats = server.cache.stats();
    assert_eq!(stats.large_dropped, 0, "{stats:?}");
    for (i, other) in others.iter().enumerate() {
        expect_value(&mut client, &format!("other{i}"), other);
    }
    expect_value(&mut client, "big", &big);

    server.cache.settle().unwrap();
    let before = server.cache.stats().v_host;
    touch(&mut client, "big", 10_000);
    server.cache.settle().unwrap();
    let written = server.cache.stats().v_host - before;
    eprintln!("10,000 touches of a 1 MiB large object wrote {written} bytes to the device");
    assert!(written <= 1 << 20, "10,000 touches wrote {written} bytes");

    // gat re-dates and answers with the value, once read: still no rewrite.
    client.send(b"gat 0 big\r\n");
    assert_eq!(client.line(), format!("VALUE big 0 {}", big.len()));
    assert!(client.line() == big);
    assert_eq!(client.line(), "END");
    // add of an existing key, and RESP's length and existence checks, read no extent.
    let request = format!("add other0 0 0 {}\r\n{big}\r\n", big.len());
    assert_eq!(client.ask(&request, 1), ["NOT_STORED"]);
    let mut resp = Client::connect(server.resp);
    let asked = resp.ask(
        "STRLEN big\r\nEXISTS big other1 nothing\r\nTYPE other2\r\n",
        3,
    );
    assert_eq!(
        asked,
        [format!(":{}", big.len()), ":2".into(), "+string".into()]
    );
    server.cache.settle().unwrap();
    let stats = server.cache.stats();
    assert_eq!(stats.v_host - before, written, "{stats:?}");
    assert_eq!(stats.large_dropped, 0, "{stats:?}");
    server.stop();
}

/// A touch's new expiry holds for a large object: `touch big 1` and it is gone in
/// two seconds; `touch` keeps its CAS, as memcached's does.
#[test]
fn a_touched_large_object_expires_when_told_and_keeps_its_cas() {
    let (server, _dir) = server("large-expiry");
    let mut client = Client::connect(server.memcached);
    let big = value(7);
    set(&mut client, "big", &big);
    client.send(b"gets big\r\n");
    let header = client.line();
    assert!(client.line() == big);
    assert_eq!(client.line(), "END");
    assert_eq!(client.ask("touch big 1\r\n", 1), ["TOUCHED"]);
    client.send(b"gats 1 big\r\n");
    assert_eq!(client.line(), header, "gats keeps the CAS");
    assert!(client.line() == big);
    assert_eq!(client.line(), "END");
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    assert_eq!(client.ask("get big\r\n", 1), ["END"]);
    assert_eq!(client.ask("touch big 0\r\n", 1), ["NOT_FOUND"]);
    server.stop();
}

/// A memcached append or prepend of a large value reads the current value ahead of it,
/// in flight off the serving thread, and does not read it again on the thread; a read of
/// the same key pipelined right behind it sees the new value, never the one read for the
/// rewrite. A RESP APPEND (whose strings carry no version to check a read-ahead against)
/// reads it as it runs; the GET behind it sees the new value too.
#[test]
fn appends_to_a_large_value_read_it_in_flight_and_reads_behind_see_the_result() {
    let (server, _dir) = server("large-append");
    let mut client = Client::connect(server.memcached);
    let mut resp = Client::connect(server.resp);
    let mut want = value(7)[..VALUE_LEN - 64].to_string();
    set(&mut client, "big", &want);
    let in_flight = server.cache.stats().ssd_async_reads;

    client.send(b"append big 0 0 3\r\nabc\r\nget big\r\n");
    assert_eq!(client.line(), "STORED");
    want.push_str("abc");
    assert_eq!(client.line(), format!("VALUE big 0 {}", want.len()));
    assert!(
        client.line() == want,
        "the get behind the append saw another value"
    );
    assert_eq!(client.line(), "END");

    client.send(b"ms big 3 MP\r\nxyz\r\nmg big v\r\n");
    assert_eq!(client.line(), "HD");
    want.insert_str(0, "xyz");
    assert_eq!(client.line(), format!("VA {}", want.len()));
    assert!(
        client.line() == want,
        "the mg behind the prepend saw another value"
    );

    resp.send(b"*3\r\n$6\r\nAPPEND\r\n$3\r\nbig\r\n$2\r\n!!\r\n*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n");
    want.push_str("!!");
    assert_eq!(resp.line(), format!(":{}", want.len()));
    assert_eq!(resp.line(), format!("${}", want.len()));
    assert!(
        resp.line() == want,
        "the GET behind the APPEND saw another value"
    );

    // Each memcached rewrite's read and each read behind a rewrite went in flight: five.
    assert_eq!(server.cache.stats().ssd_async_reads - in_flight, 5);
    expect_value(&mut client, "big", &want);
}
