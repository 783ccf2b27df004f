//! CAS values stay usable across re-dating reads: `touch`, `gat`/`gats` and `mg T` change
//! only the expiry, so the CAS a client read before still matches, as with memcached.

mod common;

use common::{Client, TestServer};

fn gets_cas(c: &mut Client, key: &str) -> String {
    let header = c.ask(&format!("gets {key}\r\n"), 3)[0].clone();
    header.rsplit(' ').next().expect("cas").to_string()
}

#[test]
fn touching_keeps_the_cas_that_a_later_cas_write_must_match() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("set k 0 0 1\r\nv\r\n", 1), ["STORED"]);
    let cas = gets_cas(&mut c, "k");
    let header = c.ask("gats 100 k\r\n", 3)[0].clone();
    assert_eq!(header, format!("VALUE k 0 1 {cas}"));
    assert_eq!(c.ask("touch k 200\r\n", 1), ["TOUCHED"]);
    assert_eq!(c.ask("gat 300 k\r\n", 3)[0], "VALUE k 0 1");
    assert_eq!(gets_cas(&mut c, "k"), cas);
    assert_eq!(c.ask(&format!("cas k 0 0 1 {cas}\r\nw\r\n"), 1), ["STORED"]);
    let cas = gets_cas(&mut c, "k");
    let hit = c.ask("mg k c t T50\r\n", 1)[0].clone();
    assert_eq!(hit, format!("HD c{cas} t50"));
    assert_eq!(c.ask(&format!("ms k 1 C{cas}\r\nx\r\n"), 1), ["HD"]);
}
