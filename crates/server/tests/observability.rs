//! Engine metrics and connection counters through `stats`, INFO and `/metrics`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use common::{Client, TestServer};
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
    let mut stats = Vec::new();
    loop {
        let line = mc.line();
        if line == "END" {
            break;
        }
        stats.push(line);
    }
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
