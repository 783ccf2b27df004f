//! memcached's log streams (`watch`), `stats detail` and `stats conns` over a real
//! server.

mod common;

use std::time::{Duration, Instant};

use common::{Client, TestServer};
use zipcache::Config;

/// The value of stat `name` in `stats SECTION` (`""`: plain `stats`).
fn stat(client: &mut Client, section: &str, name: &str) -> Option<String> {
    let request = format!("stats {section}");
    client.send(format!("{}\r\n", request.trim_end()).as_bytes());
    let prefix = format!("STAT {name} ");
    let lines = client.until_end();
    lines
        .iter()
        .find_map(|line| line.strip_prefix(&prefix).map(str::to_string))
}

fn log_watchers(client: &mut Client) -> u64 {
    stat(client, "", "log_watchers").unwrap().parse().unwrap()
}

/// This connection's id: the newest connection `stats conns` lists (memcached's
/// `cfd`), as memcached's watcher_connid.t finds it.
fn own_id(client: &mut Client) -> String {
    client.send(b"stats conns\r\n");
    let lines = client.until_end();
    let last = lines.last().expect("this connection is listed");
    let name = last.strip_prefix("STAT ").unwrap();
    name.split(':').next().unwrap().to_string()
}

fn watcher(server: &TestServer, streams: &str) -> Client {
    let mut watcher = Client::connect(server.memcached);
    assert_eq!(watcher.ask(&format!("watch {streams}\r\n"), 1), ["OK"]);
    watcher
}

/// A log line with its `ts=` and `gid=` checked and dropped.
fn event(watcher: &mut Client) -> String {
    let line = watcher.line();
    let mut fields = line.splitn(3, ' ');
    let ts = fields.next().unwrap().strip_prefix("ts=").unwrap();
    let (secs, micros) = ts.split_once('.').unwrap();
    assert!(secs.parse::<u64>().unwrap() > 1_600_000_000 && micros.len() == 6);
    assert!(fields.next().unwrap().starts_with("gid="), "{line}");
    fields.next().unwrap().to_string()
}

#[test]
fn fetches_and_stores_stream_with_the_connection_id() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    let id = own_id(&mut client);
    let mut watcher = watcher(&server, "fetchers mutations");
    assert_eq!(client.ask("set foo 0 100 5\r\nhello\r\n", 1), ["STORED"]);
    assert_eq!(
        event(&mut watcher),
        format!("type=item_get key=foo status=not_found clsid=1 cfd={id} size=0")
    );
    assert_eq!(
        event(&mut watcher),
        format!("type=item_store key=foo status=stored cmd=set ttl=100 clsid=1 cfd={id} size=5")
    );
    assert_eq!(client.ask("add foo 0 0 1\r\nx\r\n", 1), ["NOT_STORED"]);
    assert_eq!(
        event(&mut watcher),
        format!("type=item_get key=foo status=found clsid=1 cfd={id} size=5")
    );
    assert_eq!(
        event(&mut watcher),
        format!("type=item_store key=foo status=not_stored cmd=add ttl=0 clsid=1 cfd={id} size=1")
    );
    let mut other = Client::connect(server.memcached);
    let other_id = own_id(&mut other);
    assert_ne!(id, other_id);
    assert_eq!(other.ask("get foo a:b\r\n", 3)[2], "END");
    assert_eq!(
        event(&mut watcher),
        format!("type=item_get key=foo status=found clsid=1 cfd={other_id} size=5")
    );
    // Keys are URI-encoded, as memcached logs them.
    assert_eq!(
        event(&mut watcher),
        format!("type=item_get key=a%3Ab status=not_found clsid=1 cfd={other_id} size=0")
    );
    assert_eq!(log_watchers(&mut client), 1);
    drop(watcher);
    let deadline = Instant::now() + Duration::from_secs(5);
    while log_watchers(&mut client) != 0 {
        assert!(
            Instant::now() < deadline,
            "the closed watcher stays registered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn deletions_stream_only_what_was_removed() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    let mut watcher = watcher(&server, "deletions");
    assert_eq!(client.ask("set k 0 0 4\r\nabcd\r\n", 1), ["STORED"]);
    assert_eq!(client.ask("delete missing\r\n", 1), ["NOT_FOUND"]);
    assert_eq!(client.ask("md missing\r\n", 1), ["NF"]);
    assert_eq!(client.ask("delete k\r\n", 1), ["DELETED"]);
    assert_eq!(
        event(&mut watcher),
        "type=deleted key=k cmd=delete clsid=1 size=4"
    );
    assert_eq!(client.ask("set k 0 0 2\r\nab\r\n", 1), ["STORED"]);
    // Marking stale is no deletion.
    assert_eq!(client.ask("md k I\r\n", 1), ["HD"]);
    assert_eq!(client.ask("md k\r\n", 1), ["HD"]);
    assert_eq!(
        event(&mut watcher),
        "type=deleted key=k cmd=md clsid=1 size=2"
    );
}

#[test]
fn connection_events_say_why_a_connection_closed() {
    let server = TestServer::start();
    let mut watcher = watcher(&server, "connevents");
    let mut client = Client::connect(server.memcached);
    let local = client_port(&client);
    assert_eq!(client.ask("quit\r\n", 0).len(), 0);
    assert!(client.closed());
    let opened = event(&mut watcher);
    assert!(
        opened.starts_with(&format!(
            "type=conn_new rip=127.0.0.1 rport={local} transport=tcp cfd="
        )),
        "{opened}"
    );
    let id = opened.rsplit('=').next().unwrap();
    assert_eq!(
        event(&mut watcher),
        format!("type=conn_close rip=127.0.0.1 rport={local} transport=tcp reason=normal cfd={id}")
    );
    let mut client = Client::connect(server.memcached);
    client.send(b"GET / HTTP/1.1\r\n");
    assert!(client.closed());
    assert!(event(&mut watcher).starts_with("type=conn_new "));
    let closed = event(&mut watcher);
    assert!(closed.contains(" reason=error "), "{closed}");
}

fn client_port(client: &Client) -> u16 {
    client.local_addr().port()
}

#[test]
fn evictions_stream_the_keys_dropped_for_room() {
    let config = Config {
        dram_capacity: 2 << 20,
        ..Config::default()
    };
    let server = TestServer::on_engine(config, TestServer::options());
    let mut watcher = watcher(&server, "evictions");
    let mut client = Client::connect(server.memcached);
    // Values that do not compress, so that 8 MiB overflow 2 MiB.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..2000 {
        let value: String = (0..4000)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from(b'a' + (seed % 26) as u8)
            })
            .collect();
        let set = format!("set key{i} 0 0 {}\r\n{value}\r\n", value.len());
        assert_eq!(client.ask(&set, 1), ["STORED"]);
    }
    let evicted = event(&mut watcher);
    let key = evicted
        .strip_prefix("type=eviction key=")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{evicted}"));
    assert!(evicted.ends_with(" ttl=-1 clsid=1 size=4000"), "{evicted}");
    assert_eq!(client.ask(&format!("get {key}\r\n"), 1), ["END"], "{key}");
}

#[test]
fn unknown_streams_and_pipelined_watches_are_refused() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    assert_eq!(client.ask("watch fetchers nonsense\r\n", 1), ["ERROR"]);
    assert_eq!(
        client.ask("version\r\nwatch\r\n", 2)[1],
        "ERROR cannot pipeline other commands before watch"
    );
    // Still an ordinary connection.
    assert_eq!(client.ask("set a 0 0 1\r\n1\r\n", 1), ["STORED"]);
    assert_eq!(log_watchers(&mut client), 0);
}

#[test]
fn a_watcher_stays_a_watcher() {
    let server = TestServer::start();
    let mut watcher = watcher(&server, "fetchers");
    // Commands from a watcher are not run: this get is logged only when another sends it.
    watcher.send(b"set x 0 0 1\r\n1\r\nget x\r\n");
    let mut client = Client::connect(server.memcached);
    assert_eq!(client.ask("get x\r\n", 1), ["END"]);
    let line = event(&mut watcher);
    assert!(
        line.starts_with("type=item_get key=x status=not_found"),
        "{line}"
    );
}

/// A watcher that does not read loses lines (and is told how many) instead of holding
/// up the clients or the other watchers.
#[test]
fn a_slow_watcher_skips_lines_and_blocks_no_one() {
    let server = TestServer::start();
    let mut stalled = watcher(&server, "fetchers");
    let mut reader = watcher(&server, "fetchers");
    let mut client = Client::connect(server.memcached);
    let long_key = "k".repeat(200);
    let started = Instant::now();
    let gets = 60_000;
    let batch: String = (0..100).map(|_| format!("get {long_key}\r\n")).collect();
    for _ in 0..gets / 100 {
        client.send(batch.as_bytes());
        for _ in 0..100 {
            assert_eq!(client.line(), "END");
        }
        // The reading watcher keeps up.
        for _ in 0..100 {
            assert!(event(&mut reader).starts_with("type=item_get key=kkk"));
        }
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    let skipped: u64 = stat(&mut client, "", "log_watcher_skipped")
        .unwrap()
        .parse()
        .unwrap();
    assert!(skipped > 0);
    // The stalled watcher reads what it was sent, then the notice with the next event.
    let mut seen = 0;
    let notice = loop {
        if seen % 100 == 0 {
            assert_eq!(client.ask("get after\r\n", 1), ["END"]);
        }
        let line = stalled.line();
        if line.starts_with("skipped=") {
            break line;
        }
        seen += 1;
        assert!(seen < gets, "no skipped notice");
    };
    let n: u64 = notice.strip_prefix("skipped=").unwrap().parse().unwrap();
    assert!(n > 0, "{notice}");
    assert!(event(&mut stalled).starts_with("type=item_get "));
}

#[test]
fn stats_detail_counts_per_prefix_while_on() {
    let server = TestServer::start();
    let mut client = Client::connect(server.memcached);
    assert_eq!(client.ask("stats detail dump\r\n", 1), ["END"]);
    assert_eq!(client.ask("stats detail on\r\n", 1), ["OK"]);
    assert_eq!(client.ask("set a:1 0 0 1\r\n1\r\n", 1), ["STORED"]);
    assert_eq!(client.ask("set nodelimiter 0 0 1\r\n1\r\n", 1), ["STORED"]);
    assert_eq!(client.ask("get a:1 a:2 b:1\r\n", 3)[2], "END");
    assert_eq!(client.ask("mg a:1 v\r\n", 2), ["VA 1", "1"]);
    assert_eq!(client.ask("delete b:1\r\n", 1), ["NOT_FOUND"]);
    assert_eq!(
        client.ask("stats detail dump\r\n", 3),
        [
            "PREFIX a get 3 hit 2 set 1 del 0",
            "PREFIX b get 1 hit 0 set 0 del 1",
            "END"
        ]
    );
    assert_eq!(client.ask("stats detail off\r\n", 1), ["OK"]);
    assert_eq!(client.ask("get a:1\r\n", 3)[2], "END");
    assert_eq!(
        client.ask("stats detail dump\r\n", 1),
        ["PREFIX a get 3 hit 2 set 1 del 0"]
    );
    assert_eq!(
        client.ask("", 2),
        ["PREFIX b get 1 hit 0 set 0 del 1", "END"]
    );
    assert_eq!(
        client.ask("stats detail\r\n", 1),
        ["CLIENT_ERROR usage: stats detail on|off|dump"]
    );
    assert_eq!(client.ask("stats reset\r\n", 1), ["RESET"]);
    assert_eq!(client.ask("stats detail dump\r\n", 1), ["END"]);
}

#[test]
fn stats_conns_lists_open_connections_oldest_first() {
    let server = TestServer::start();
    let mut first = Client::connect(server.memcached);
    let first_id = own_id(&mut first);
    let mut second = Client::connect(server.memcached);
    let second_id = own_id(&mut second);
    assert!(first_id.parse::<u64>().unwrap() < second_id.parse::<u64>().unwrap());
    let addr = stat(&mut second, "conns", &format!("{second_id}:addr")).unwrap();
    assert_eq!(addr, format!("tcp:127.0.0.1:{}", client_port(&second)));
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(5);
    while own_id(&mut first) != first_id {
        assert!(
            Instant::now() < deadline,
            "a closed connection stays listed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
