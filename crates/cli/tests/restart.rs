//! `zipcache serve` stopped by SIGTERM and started again, as an operator's service
//! manager does it: the flash tier is served again after the restart, whatever was
//! holding the engine when the signal came.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{Server, test_dir};

/// The reproduction of the report: 4 MiB of DRAM over 256 MiB of SSD, 200,000 keys.
const KEYS: usize = 200_000;

fn args() -> Vec<String> {
    [
        "--memcached-port",
        "0",
        "--resp-port",
        "0",
        "--dram",
        "4MiB",
        "--ssd-size",
        "256MiB",
        "--threads",
        "2",
        // Writers wait for the flusher rather than drop: the test counts every key.
        "--set",
        "flush_wait_ms=60000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn value(i: usize) -> String {
    format!("value-{i:08}-{}", "v".repeat(i % 40))
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let writer = TcpStream::connect(addr).expect("connect");
        writer
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        Conn { reader, writer }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("send");
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("reply");
        line.trim_end().to_string()
    }
}

fn fill(conn: &mut Conn) {
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let mut batch = String::new();
        for &i in chunk {
            let v = value(i);
            batch.push_str(&format!("set key:{i} 0 0 {}\r\n{v}\r\n", v.len()));
        }
        conn.send(batch.as_bytes());
        for &i in chunk {
            assert_eq!(conn.line(), "STORED", "key:{i}");
        }
    }
}

/// How many of the keys the server serves; a key served with a wrong value fails.
fn served(conn: &mut Conn) -> usize {
    let mut served = 0;
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let request: String = chunk.iter().map(|i| format!("mg key:{i} v\r\n")).collect();
        conn.send(request.as_bytes());
        for &i in chunk {
            let header = conn.line();
            if header == "EN" {
                continue;
            }
            let v = value(i);
            assert_eq!(header, format!("VA {}", v.len()), "key:{i}");
            assert_eq!(conn.line(), v, "key:{i}");
            served += 1;
        }
    }
    served
}

/// A crawl that sleeps a second per thousand objects, a `watch`, and a `get` whose reply
/// the client never reads are under way at SIGTERM: the server still stops cleanly (exit
/// 0) and the next start serves every key.
#[test]
fn sigterm_during_a_crawl_keeps_the_flash_tier() {
    let dir = test_dir("restart", "crawl");
    let mut server = Server::spawn(dir.clone(), args());
    let mut conn = Conn::open(server.memcached);
    fill(&mut conn);

    conn.send(b"lru_crawler sleep 1000000\r\nlru_crawler crawl all\r\n");
    assert_eq!(conn.line(), "OK");
    assert_eq!(conn.line(), "OK");
    let mut watcher = Conn::open(server.memcached);
    watcher.send(b"watch mutations\r\n");
    assert_eq!(watcher.line(), "OK");
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
