//! `curr_items` (memcached `stats`) and `objects_resident` count objects still in write
//! buffers, as operators expect right after a `set`; `rss_bytes` reports the process's
//! resident memory beside the DRAM budget.

mod common;

use common::{Client, TestServer};

fn stat(client: &mut Client, name: &str) -> u64 {
    client.send(b"stats\r\n");
    let prefix = format!("STAT {name} ");
    loop {
        let line = client.line();
        assert_ne!(line, "END", "no {name} in stats");
        if let Some(n) = line.strip_prefix(&prefix) {
            let n = n.parse().expect("a number");
            while client.line() != "END" {}
            return n;
        }
    }
}

fn curr_items(client: &mut Client) -> u64 {
    stat(client, "curr_items")
}

#[test]
fn rss_bytes_is_the_process_resident_memory() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    let rss = stat(&mut client, "rss_bytes");
    assert!(rss > 1 << 20 && rss < 64 << 30, "{rss}");
}

#[test]
fn two_sets_on_a_fresh_server_are_two_items() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    assert_eq!(curr_items(&mut client), 0);
    assert_eq!(client.ask("set a 0 0 1\r\n1\r\n", 1), ["STORED"]);
    assert_eq!(client.ask("set b 0 0 1\r\n2\r\n", 1), ["STORED"]);
    assert_eq!(curr_items(&mut client), 2);
    assert_eq!(client.ask("set a 0 0 1\r\n3\r\n", 1), ["STORED"]);
    assert_eq!(client.ask("delete b\r\n", 1), ["DELETED"]);
    assert_eq!(curr_items(&mut client), 1);
}
