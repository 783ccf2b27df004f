//! `curr_items` (memcached `stats`) and `objects_resident` count objects still in write
//! buffers, as operators expect right after a `set`.

mod common;

use common::{Client, TestServer};

fn curr_items(client: &mut Client) -> u64 {
    client.send(b"stats\r\n");
    loop {
        let line = client.line();
        assert_ne!(line, "END", "no curr_items in stats");
        if let Some(n) = line.strip_prefix("STAT curr_items ") {
            let n = n.parse().expect("a number");
            while client.line() != "END" {}
            return n;
        }
    }
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
