//! CAS values stay usable across re-dating reads: `gats` and `mg T` rewrite the item,
//! so they must report the CAS a following `cas` / `ms C` has to match.

mod common;

use common::{Client, TestServer};

#[test]
fn touching_returns_the_cas_that_a_later_cas_write_must_match() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("set k 0 0 1\r\nv\r\n", 1), ["STORED"]);
    let header = c.ask("gats 100 k\r\n", 3)[0].clone();
    let cas = header.rsplit(' ').next().expect("cas").to_string();
    assert_eq!(c.ask(&format!("cas k 0 0 1 {cas}\r\nw\r\n"), 1), ["STORED"]);
    let hit = c.ask("mg k c t T50\r\n", 1)[0].clone();
    assert!(hit.ends_with(" t50"), "{hit}");
    let cas = hit
        .split(' ')
        .find_map(|f| f.strip_prefix('c'))
        .expect("cas flag");
    assert_eq!(c.ask(&format!("ms k 1 C{cas}\r\nx\r\n"), 1), ["HD"]);
}
