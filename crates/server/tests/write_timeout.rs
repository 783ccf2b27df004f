//! A client that sends a pipeline of GETs of a big value and never reads the replies:
//! meanwhile the server holds no more than its output budget for it and serves another
//! client; after the write timeout it closes the connection, counted in
//! `write_timeouts`. (One test in this binary: it measures the process's memory.)

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Client, TestServer};
use zipcache_server::ServerOptions;

const BIG: usize = 1 << 20;
const GETS: usize = 1500;

/// This process's resident memory (the server runs in it).
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .expect("a VmRSS line");
    kib * 1024
}

fn write_timeouts(client: &mut Client) -> u64 {
    client.stats("")["write_timeouts"].parse().unwrap()
}

#[test]
fn a_client_that_stops_reading_is_closed_after_the_write_timeout() {
    let timeout = Duration::from_secs(2);
    let server = TestServer::with_options(ServerOptions {
        write_timeout: Some(timeout),
        ..TestServer::options()
    });
    let mut other = Client::connect(server.memcached);
    other.send(format!("set big 0 0 {BIG}\r\n").as_bytes());
    other.send(&vec![b'v'; BIG]);
    assert_eq!(other.ask("\r\n", 1), ["STORED"]);
    assert_eq!(other.ask("set small 0 0 2\r\nhi\r\n", 1), ["STORED"]);
    assert_eq!(write_timeouts(&mut other), 0);
    let baseline = rss_bytes();

    // 1,500 MiB of replies asked for, none read.
    let mut stalled = TcpStream::connect(server.memcached).unwrap();
    stalled
        .write_all("get big\r\n".repeat(GETS).as_bytes())
        .unwrap();
    let stalled_at = Instant::now();
    let mut grown = 0;
    while stalled_at.elapsed() < timeout / 2 {
        assert_eq!(
            other.ask("get small\r\n", 3),
            ["VALUE small 0 2", "hi", "END"]
        );
        grown = grown.max(rss_bytes().saturating_sub(baseline));
        std::thread::sleep(Duration::from_millis(20));
    }
    // The budget (256 KiB) and one item, with room for allocator slack: nothing near the
    // 1.5 GB the pipeline's replies come to.
    assert!(grown < 64 << 20, "resident memory grew {grown} bytes");

    let deadline = Instant::now() + Duration::from_secs(60);
    while write_timeouts(&mut other) == 0 {
        assert!(Instant::now() < deadline, "never timed out");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(stalled_at.elapsed() >= timeout, "closed before its timeout");
    assert_eq!(write_timeouts(&mut other), 1);
    // What the kernel had taken, then the end: far fewer than all the replies.
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut received = Vec::new();
    let ended = stalled.read_to_end(&mut received);
    let waited = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    assert!(
        !ended.as_ref().is_err_and(waited),
        "the connection was not closed: {ended:?}"
    );
    assert!(received.len() < GETS * BIG, "{} bytes", received.len());
    assert_eq!(
        other.ask("get small\r\n", 3),
        ["VALUE small 0 2", "hi", "END"]
    );
}
