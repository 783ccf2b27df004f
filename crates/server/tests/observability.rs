//! Engine metrics and connection counters through `stats`, INFO and `/metrics`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use common::{Client, TestServer};
use zipcache::config::DeviceCompression;
use zipcache::{Config, SsdConfig, ZipCache};
use zipcache_server::ServerOptions;

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let server = TestServer::with_options(ServerOptions {
        metrics_port: Some(0),
        ..ServerOptions::default()
    });
    let addr = server.handle().metrics_addr.expect("metrics port");
    let mut client = Client::connect(server.memcached);
    client.ask("set k 0 0 1\r\nv\r\n", 1);
    let response = http_get(addr, "/metrics");
    assert!(response.starts_with("HTTP/1.0 200 OK"), "{response}");
    for metric in [
        "zipcache_hit_ratio ",
        "zipcache_compression_ratio_dram ",
        "zipcache_V_host ",
        "zipcache_curr_connections 1",
    ] {
        assert!(response.contains(metric), "{metric} missing:\n{response}");
    }
    assert!(http_get(addr, "/").starts_with("HTTP/1.0 404"));
}

#[test]
fn stats_and_info_carry_engine_metrics_and_counters() {
    let server = TestServer::start();
    let mut mc = Client::connect(server.memcached);
    mc.ask("set k 0 0 1\r\nv\r\nget k\r\nget nope\r\n", 5);
    mc.send(b"stats\r\n");
    let stats = mc.until_end();
    for stat in [
        "STAT get_hits 1",
        "STAT get_misses 1",
        "STAT curr_connections 1",
        "STAT cmd_set 1",
        "STAT evictions 0",
        "STAT auth_cmds 0",
    ] {
        assert!(stats.iter().any(|s| s == stat), "{stat} missing: {stats:?}");
    }
    for name in [
        "hit_ratio",
        "compression_ratio_dram",
        "dram_used",
        "objects_resident",
        "V_NAND",
    ] {
        assert!(
            stats
                .iter()
                .any(|s| s.starts_with(&format!("STAT {name} "))),
            "{name} missing"
        );
    }
    let settings = mc.ask("stats settings\r\n", 2);
    assert_eq!(settings[0], "STAT maxconns 4096");

    let mut rs = Client::connect(server.resp);
    rs.send(b"INFO\r\n");
    let header = rs.line();
    let len: usize = header[1..].parse().expect("bulk length");
    let info = String::from_utf8(rs.bytes(len)).expect("utf-8");
    for field in [
        "# Zipcache",
        "compression_ratio_dram:",
        "connected_clients:2",
        "keyspace_hits:1",
    ] {
        assert!(info.contains(field), "{field} missing:\n{info}");
    }
}

/// memcached's `stats` line `STAT name value` and RESP INFO's `name:value`.
fn stat(mc: &mut Client, name: &str) -> u64 {
    mc.send(b"stats\r\n");
    let prefix = format!("STAT {name} ");
    let mut found = None;
    loop {
        let line = mc.line();
        if line == "END" {
            return found.unwrap_or_else(|| panic!("no {name} in stats"));
        }
        if let Some(value) = line.strip_prefix(&prefix) {
            found = Some(value.parse().expect("a number"));
        }
    }
}

fn info_field(resp: &mut Client, name: &str) -> u64 {
    resp.send(b"INFO\r\n");
    let len: usize = resp.line()[1..].parse().expect("bulk length");
    let info = String::from_utf8(resp.bytes(len + 2)).expect("utf-8");
    let prefix = format!("{name}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in INFO"))
        .trim()
        .parse()
        .expect("a number")
}

/// 20 000 sets of 64 bytes that compress poorly, pipelined.
fn fill(mc: &mut Client) {
    let value = |n: u64| -> String {
        (0..4)
            .map(|j| format!("{:016x}", (n * 4 + j).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect()
    };
    for batch in 0..20 {
        let sets: String = (0..1000)
            .map(|i| {
                format!(
                    "set key{batch}.{i} 0 0 64\r\n{}\r\n",
                    value(batch * 1000 + i)
                )
            })
            .collect();
        let replies = mc.ask(&sets, 1000);
        assert!(replies.iter().all(|r| r == "STORED"));
    }
}

fn server_over(config: Config) -> TestServer {
    TestServer::on(Arc::new(ZipCache::open(config).expect("engine")))
}

/// `evictions` (memcached) and `evicted_keys` (INFO) count the objects the cache forgot
/// to make room: not those moved from DRAM to the SSD tier, not a flush.
#[test]
fn evictions_count_what_the_cache_forgot() {
    let dir = std::env::temp_dir().join(format!("zipcache-evictions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hybrid = server_over(Config {
        dram_capacity: 512 << 10,
        ssd: Some(SsdConfig {
            path: dir.join("ssd.bin"),
            size: 256 << 20,
            direct_io: false,
            device_compression: DeviceCompression::None,
            logical_to_physical: 1.0,
        }),
        // Writers wait for the flusher instead of dropping objects unwritten (which
        // would be evictions: see the DRAM-only half).
        flush_wait_ms: 60_000,
        ..Config::default()
    });
    let mut mc = Client::connect(hybrid.memcached);
    let mut resp = Client::connect(hybrid.resp);
    fill(&mut mc);
    let engine = hybrid.cache.stats();
    assert!(engine.evicted_objects > 10_000, "{engine:?}");
    assert_eq!(
        stat(&mut mc, "evictions"),
        0,
        "every object is still cached"
    );
    assert_eq!(info_field(&mut resp, "evicted_keys"), 0);
    assert_eq!(mc.ask("get key0.0\r\n", 3)[1].len(), 64);
    assert_eq!(hybrid.cache.stats().ssd_write_drops, 0);
    drop(hybrid);
    std::fs::remove_dir_all(&dir).unwrap();

    let dram_only = server_over(Config {
        dram_capacity: 512 << 10,
        ..Config::default()
    });
    let mut mc = Client::connect(dram_only.memcached);
    fill(&mut mc);
    let missing = (0..20)
        .flat_map(|b| (0..1000).map(move |i| format!("key{b}.{i}")))
        .filter(|key| {
            let hit = mc.ask(&format!("get {key}\r\n"), 1)[0] != "END";
            if hit {
                mc.ask("", 2); // the value and END
            }
            !hit
        })
        .count() as u64;
    // Read after: background eviction may still have been going on.
    let evictions = stat(&mut mc, "evictions");
    assert!(missing > 0 && missing <= evictions, "{missing} {evictions}");
    drop(dram_only);

    // Where nothing is evicted for room (256 MiB), a flush adds nothing either.
    let roomy = TestServer::start();
    let mut mc = Client::connect(roomy.memcached);
    fill(&mut mc);
    assert_eq!(mc.ask("flush_all\r\n", 1), ["OK"]);
    assert_eq!(stat(&mut mc, "evictions"), 0, "a flush is no eviction");
}
