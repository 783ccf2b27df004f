//! What one connection may make the server hold, and for how long: a request over
//! `max_request_size` is refused and its connection closed; the connections' buffers
//! together stay within `max_clients_memory` (the biggest is closed first); a request
//! trickled in pieces costs linear work; a connection that never completes a request is
//! closed after `first_request_timeout`. Also memcached's `flush_all <delay>`: one
//! pending flush, replaced by the next.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{Client, TestServer};
use zipcache_server::ServerOptions;

fn stat(server: &TestServer, name: &str) -> u64 {
    let stats = Client::connect(server.memcached).stats("");
    stats
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in stats"))
        .parse()
        .expect("a number")
}

use zipcache_server::fuzzing::resp_request as resp_command;

/// Polls `done` until it holds or `limit` passes; false if it never held.
fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// What the server sends until it closes the connection (`None`: it did not close
/// within 10 s).
fn until_closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(received),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            // A reset after the reply still closes it.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(received),
            Err(_) => return None,
        }
    }
}

/// Sends what it can of `bytes` (the server may close mid-way).
fn send_all(stream: &mut TcpStream, bytes: &[u8]) {
    let _ = stream.write_all(bytes);
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

#[test]
fn a_request_over_the_limit_is_refused_and_closed_others_are_served() {
    let server = TestServer::with_options(ServerOptions {
        max_request_size: Some(64 << 10),
        ..TestServer::options()
    });
    let mut bystander = Client::connect(server.memcached);
    assert_eq!(bystander.ask("set k 0 0 2\r\nhi\r\n", 1), ["STORED"]);

    // RESP: refused on the bulk's length line, before its bytes arrive.
    let mut resp = connect(server.resp);
    send_all(
        &mut resp,
        &resp_command(&[b"SET", b"big", &[b'v'; 100 << 10]]),
    );
    let reply = until_closed(&mut resp).expect("closed");
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "-ERR Protocol error: request exceeds max-request-size\r\n"
    );

    // memcached: a value within the item size but over the request limit.
    let mut mc = connect(server.memcached);
    let mut set = b"set big 0 0 100000\r\n".to_vec();
    set.extend(vec![b'v'; 100_000]);
    send_all(&mut mc, &set);
    let reply = until_closed(&mut mc).expect("closed");
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "SERVER_ERROR request exceeds max-request-size\r\n"
    );

    assert_eq!(bystander.ask("get k\r\n", 3), ["VALUE k 0 2", "hi", "END"]);
    assert_eq!(stat(&server, "request_size_kicks"), 2);
    assert_eq!(
        Client::connect(server.memcached).stats(" settings")["max_request_size"],
        "65536"
    );
}

/// A connection refused for a request over the limit lets go of what it buffered before
/// its reply goes out, not after the second it lingers for the client to close: other
/// connections' large reads wait for room while the connections hold the budget and its
/// overdraft, and a crowd of lingering connections would hold it for that second.
#[test]
fn a_refused_request_is_freed_before_the_connection_lingers() {
    let server = TestServer::with_options(ServerOptions {
        max_request_size: Some(256 << 10),
        ..TestServer::options()
    });
    let mut mc = connect(server.memcached);
    let mut set = b"set big 0 0 1000000\r\n".to_vec();
    set.extend(vec![b'v'; 400 << 10]);
    send_all(&mut mc, &set);
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        mc.read_exact(&mut byte).expect("the refusal");
        line.push(byte[0]);
    }
    assert_eq!(line, b"SERVER_ERROR request exceeds max-request-size\r\n");
    // The refused connection is still open, lingering; the stats connection holds one
    // read's buffer.
    let buffered = stat(&server, "conn_buffer_bytes");
    assert!(
        buffered < 64 << 10,
        "{buffered} bytes buffered after the refusal"
    );
    drop(mc);
}

/// Requests up to the default limit (the item size + 256 KiB) are served: a value of
/// the largest size, and memcached's too-large value still swallowed, connection kept.
#[test]
fn the_default_limit_takes_the_largest_item() {
    let server = TestServer::start();
    let value = vec![b'x'; 1 << 20];
    let mut resp = connect(server.resp);
    send_all(&mut resp, &resp_command(&[b"SET", b"k", &value]));
    let mut reply = [0u8; 5];
    resp.read_exact(&mut reply).expect("reply");
    assert_eq!(&reply, b"+OK\r\n");

    let mut mc = Client::connect(server.memcached);
    let mut set = b"set huge 0 0 2000000\r\n".to_vec();
    set.extend(vec![b'v'; 2_000_000]);
    set.extend_from_slice(b"\r\n");
    mc.send(&set);
    assert_eq!(mc.line(), "SERVER_ERROR object too large for cache");
    assert_eq!(mc.ask("get k\r\n", 1), [format!("VALUE k 0 {}", 1 << 20)]);
    assert_eq!(stat(&server, "request_size_kicks"), 0);
}

/// Three connections hold partial requests; a fourth pushes the total past the budget:
/// the biggest (the first) is closed, the others finish their requests, a new client is
/// served, and what is buffered comes back down.
#[test]
fn over_the_budget_the_biggest_connection_is_closed_first() {
    let server = TestServer::with_options(ServerOptions {
        max_request_size: Some(2 << 20),
        max_clients_memory: Some(3 << 20),
        ..TestServer::options()
    });
    let value = |len: usize| vec![b'v'; len];
    let buffered = || stat(&server, "conn_buffer_bytes");

    let big_request = resp_command(&[b"SET", b"big", &value(1_800_000)]);
    let mut big = connect(server.resp);
    send_all(&mut big, &big_request[..1_500_000]);
    assert!(eventually(Duration::from_secs(10), || buffered() >= 1_500_000));

    let mut others = Vec::new();
    for (i, len) in [100_000usize, 300_000, 700_000].into_iter().enumerate() {
        let key = format!("k{i}");
        let request = resp_command(&[b"SET", key.as_bytes(), &value(len)]);
        let mut stream = connect(server.resp);
        send_all(&mut stream, &request[..request.len() - 10]);
        others.push((stream, request));
    }
    assert_eq!(
        until_closed(&mut big),
        Some(Vec::new()),
        "the biggest closed"
    );
    assert!(eventually(Duration::from_secs(10), || {
        stat(&server, "buffer_budget_kicks") == 1
    }));

    for (stream, request) in &mut others {
        send_all(stream, &request[request.len() - 10..]);
        let mut reply = [0u8; 5];
        stream.read_exact(&mut reply).expect("reply");
        assert_eq!(&reply, b"+OK\r\n");
    }
    let mut newcomer = Client::connect(server.resp);
    assert_eq!(newcomer.ask("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n", 1), ["$-1"]);
    assert_eq!(stat(&server, "buffer_budget_kicks"), 1);
    assert!(eventually(Duration::from_secs(10), || buffered() < 1 << 20));
    let mut info = Client::connect(server.resp);
    info.send(b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n");
    let header = info.line();
    let len: usize = header[1..].parse().expect("bulk length");
    let text = String::from_utf8(info.bytes(len)).expect("text");
    assert!(text.contains("evicted_clients:1\r\n"), "{text}");
}

/// Whole requests trickled in small pieces: a large bulk string and an MSET of many
/// keys. Framing each from its start on every read made the MSET cost quadratic work;
/// the bound is generous (the machine is shared), the correctness check is exact.
#[test]
fn trickled_requests_are_served_in_linear_time() {
    let server = TestServer::start();
    let value: Vec<u8> = (0..1u32 << 20).map(|i| b'a' + (i % 26) as u8).collect();
    let keys: Vec<Vec<u8>> = (0..15_000)
        .map(|i| format!("key:{i}").into_bytes())
        .collect();
    let mut mset: Vec<&[u8]> = vec![b"MSET"];
    for key in &keys {
        mset.push(key);
        mset.push(b"1");
    }
    let started = Instant::now();
    for (request, piece) in [
        (resp_command(&[b"SET", b"big", &value]), 1024),
        (resp_command(&mset), 64),
    ] {
        let mut stream = connect(server.resp);
        for chunk in request.chunks(piece) {
            send_all(&mut stream, chunk);
        }
        let mut reply = [0u8; 5];
        stream.read_exact(&mut reply).expect("reply");
        assert_eq!(&reply, b"+OK\r\n");
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    let mut mc = Client::connect(server.memcached);
    assert_eq!(mc.ask("get key:14999\r\n", 2), ["VALUE key:14999 0 1", "1"]);
    mc.line();
    mc.send(b"get big\r\n");
    assert_eq!(mc.line(), format!("VALUE big 0 {}", value.len()));
    assert_eq!(mc.bytes(value.len()), value);
}

/// Slowloris: a connection that trickles a request and one that sends nothing are both
/// closed once the first-request timeout passes; one that completed a request stays.
#[test]
fn connections_that_never_complete_a_request_are_closed() {
    let server = TestServer::with_options(ServerOptions {
        first_request_timeout: Some(Duration::from_secs(1)),
        ..TestServer::options()
    });
    let mut served = Client::connect(server.resp);
    assert_eq!(served.ask("PING\r\n", 1), ["+PONG"]);
    let mut silent = connect(server.memcached);
    let mut trickler = connect(server.resp);
    send_all(&mut trickler, b"*1\r\n$1000\r\n");
    // A byte every 100 ms for 4 s: never idle, never complete.
    for _ in 0..40 {
        if trickler.write_all(b"x").is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(until_closed(&mut trickler).is_some(), "the trickler stays");
    assert!(until_closed(&mut silent).is_some(), "the silent one stays");
    assert_eq!(stat(&server, "first_request_kicks"), 2);
    assert_eq!(served.ask("PING\r\n", 1), ["+PONG"]);
    assert_eq!(stat(&server, "idle_kicks"), 0);
}

/// memcached keeps one pending flush: `flush_all 1` then `flush_all 3` flushes at 3 s,
/// not at 1 s; `flush_all 1` then `flush_all` (now) leaves nothing pending.
#[test]
fn a_later_flush_all_replaces_the_pending_one() {
    let server = TestServer::start();
    let mut mc = Client::connect(server.memcached);
    assert_eq!(mc.ask("set k 0 0 1\r\na\r\n", 1), ["STORED"]);
    assert_eq!(mc.ask("flush_all 1\r\nflush_all 3\r\n", 2), ["OK", "OK"]);
    std::thread::sleep(Duration::from_millis(1800));
    assert_eq!(mc.ask("get k\r\n", 3), ["VALUE k 0 1", "a", "END"]);
    assert!(eventually(Duration::from_secs(10), || {
        mc.send(b"get k\r\n");
        mc.until_end().is_empty()
    }));

    assert_eq!(mc.ask("flush_all 1\r\nflush_all\r\n", 2), ["OK", "OK"]);
    assert_eq!(mc.ask("set k 0 0 1\r\nb\r\n", 1), ["STORED"]);
    std::thread::sleep(Duration::from_millis(1800));
    assert_eq!(mc.ask("get k\r\n", 3), ["VALUE k 0 1", "b", "END"]);
}

/// A client that asks for a big value again and again and never reads: its reply waits
/// in the server, charged to the budget, while the kernel's buffers are full. Past the
/// budget it is the biggest and is closed while its write waits (long before its write
/// timeout), and the clients whose requests pushed the total over are served.
#[test]
fn a_connection_whose_replies_wait_for_its_reader_is_closed_by_the_budget() {
    let server = TestServer::with_options(ServerOptions {
        max_request_size: Some(2 << 20),
        max_clients_memory: Some(2 << 20),
        write_timeout: Some(Duration::from_secs(600)),
        ..TestServer::options()
    });
    let mut setter = Client::connect(server.resp);
    setter.send(&resp_command(&[b"SET", b"big", &vec![b'v'; 1_000_000]]));
    assert_eq!(setter.line(), "+OK");

    let mut stalled = connect(server.resp);
    // 64 MB of replies: more than any loopback socket buffers take, so one waits here.
    send_all(&mut stalled, &resp_command(&[b"GET", b"big"]).repeat(64));
    // Its reply is charged while it waits for the reader.
    assert!(eventually(Duration::from_secs(10), || {
        stat(&server, "conn_buffer_bytes") >= 1_000_000
    }));
    // Three requests of 400 kB, each smaller than the waiting reply, pass the budget.
    let mut late = Vec::new();
    for i in 0..3 {
        let key = format!("late{i}");
        let request = resp_command(&[b"SET", key.as_bytes(), &vec![b'w'; 400_000]]);
        let mut stream = connect(server.resp);
        send_all(&mut stream, &request[..request.len() - 10]);
        late.push((stream, request));
    }
    assert!(
        eventually(Duration::from_secs(10), || {
            stat(&server, "buffer_budget_kicks") == 1
        }),
        "the waiting reply was not closed by the budget"
    );
    assert!(
        until_closed(&mut stalled).is_some(),
        "the stalled reader stays open"
    );
    for (stream, request) in &mut late {
        send_all(stream, &request[request.len() - 10..]);
        let mut reply = [0u8; 5];
        stream.read_exact(&mut reply).expect("reply");
        assert_eq!(&reply, b"+OK\r\n");
    }
}
