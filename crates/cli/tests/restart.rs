//! `zipcache serve` stopped by SIGTERM and started again, as an operator's service
//! manager does it: the flash tier is served again after the restart, whatever was
//! holding the engine when the signal came.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use common::{Conn, KEYS, Server, fill, served, small_dram_args, test_dir};

/// A crawl that sleeps a second per thousand objects, a `watch`, and a `get` whose reply
/// the client never reads are under way at SIGTERM: the server still stops cleanly (exit
/// 0) and the next start serves every key.
#[test]
fn sigterm_during_a_crawl_keeps_the_flash_tier() {
    let dir = test_dir("restart", "crawl");
    let mut server = Server::spawn(dir.clone(), small_dram_args());
    let mut conn = Conn::open(server.memcached);
    fill(&mut conn);

    conn.send(b"lru_crawler sleep 1000000\r\nlru_crawler crawl all\r\n");
    assert_eq!(conn.reply(), "OK");
    assert_eq!(conn.reply(), "OK");
    let mut watcher = Conn::open(server.memcached);
    watcher.send(b"watch mutations\r\n");
    assert_eq!(watcher.reply(), "OK");
    let mut unread = TcpStream::connect(server.memcached).unwrap();
    let keys: String = (0..2000).map(|i| format!(" key:{i}")).collect();
    unread
        .write_all(format!("get{keys}\r\n").as_bytes())
        .unwrap();
    let status = server.stop();
    assert!(status.success(), "{status}: {}", server.log());
    assert!(server.log().contains("stopped cleanly"), "{}", server.log());
    let mut rest = Vec::new();
    let _ = unread.read_to_end(&mut rest);

    let mut restarted = Server::spawn(dir.clone(), server.args.clone());
    let mut conn = Conn::open(restarted.memcached);
    assert_eq!(served(&mut conn), KEYS, "{}", restarted.log());
    assert!(restarted.stop().success());
}
