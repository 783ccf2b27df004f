//! Many clients at once, the connection limit, and graceful shutdown.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Client, TestServer};
use zipcache_server::{Runtime, ServerOptions};

const CONNECTIONS: usize = 1000;

#[test]
fn a_thousand_concurrent_connections_all_succeed() {
    // Each connection is two descriptors in this process (client and server side).
    let wanted = (CONNECTIONS as u64) * 2 + 256;
    let got = rlimit::increase_nofile_limit(wanted).expect("raise RLIMIT_NOFILE");
    assert!(
        got >= wanted,
        "RLIMIT_NOFILE is {got}; this test needs {wanted}"
    );
    let server = TestServer::start();
    let streams: Vec<(bool, TcpStream)> = (0..CONNECTIONS)
        .map(|i| {
            let memcached = i % 2 == 0;
            let addr = if memcached {
                server.memcached
            } else {
                server.resp
            };
            let stream = TcpStream::connect(addr).expect("connect");
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            (memcached, stream)
        })
        .collect();
    // All connections are open at once; 8 threads drive them.
    let chunks: Vec<Vec<(usize, (bool, TcpStream))>> = {
        let mut chunks: Vec<Vec<_>> = (0..8).map(|_| Vec::new()).collect();
        for (i, s) in streams.into_iter().enumerate() {
            chunks[i % 8].push((i, s));
        }
        chunks
    };
    let workers: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            std::thread::spawn(move || {
                for (i, (memcached, mut stream)) in chunk {
                    let value = format!("value-{i:06}");
                    let (request, expected) = if memcached {
                        (
                            format!("set c{i} 0 0 {}\r\n{value}\r\nget c{i}\r\n", value.len()),
                            format!(
                                "STORED\r\nVALUE c{i} 0 {}\r\n{value}\r\nEND\r\n",
                                value.len()
                            ),
                        )
                    } else {
                        (
                            format!("SET c{i} {value}\r\nGET c{i}\r\n"),
                            format!("+OK\r\n${}\r\n{value}\r\n", value.len()),
                        )
                    };
                    stream.write_all(request.as_bytes()).expect("send");
                    let mut reply = vec![0; expected.len()];
                    stream.read_exact(&mut reply).expect("reply");
                    assert_eq!(String::from_utf8_lossy(&reply), expected, "connection {i}");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("no failed request");
    }
    let mut fresh = Client::connect(server.memcached);
    assert_eq!(fresh.ask("get c0\r\n", 3)[1], "value-000000");
}

#[test]
fn connections_over_the_limit_are_refused_politely() {
    let server = TestServer::with_options(ServerOptions {
        threads: 2,
        max_connections: 4,
        ..ServerOptions::default()
    });
    let mut open: Vec<Client> = (0..4).map(|_| Client::connect(server.memcached)).collect();
    for client in &mut open {
        assert!(client.ask("version\r\n", 1)[0].starts_with("VERSION"));
    }
    let mut refused = Client::connect(server.memcached);
    assert_eq!(refused.line(), "ERROR Too many open connections");
    assert!(refused.closed());
    let mut refused = Client::connect(server.resp);
    assert_eq!(refused.line(), "-ERR max number of clients reached");
    drop(open.pop());
    // The slot frees once the server has seen the close. Refused attempts may see a
    // reset instead of the refusal line, so they are retried without panicking.
    let started = Instant::now();
    let admitted = |addr| -> std::io::Result<bool> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"version\r\n")?;
        let mut reply = [0u8; 7];
        stream.read_exact(&mut reply)?;
        Ok(&reply == b"VERSION")
    };
    while !admitted(server.memcached).unwrap_or(false) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "slot never freed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn shutdown_answers_what_was_sent_then_stops_listening() {
    let server = TestServer::start();
    let addr = server.memcached;
    let mut client = Client::connect(addr);
    client.send(b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\nget a b\r\n");
    // One reply proves the server read the batch; the rest must come despite shutdown.
    assert_eq!(client.line(), "STORED");
    let cache = server.cache.clone();
    server.stop();
    let rest: Vec<String> = (0..6).map(|_| client.line()).collect();
    assert_eq!(
        rest,
        ["STORED", "VALUE a 0 1", "1", "VALUE b 0 1", "2", "END"]
    );
    assert!(client.closed(), "connection closed after shutdown");
    assert!(
        TcpStream::connect(addr).is_err(),
        "still accepting after shutdown"
    );
    assert_eq!(cache.get(b"b").unwrap(), Some(b"2".to_vec()));
    assert_eq!(
        std::sync::Arc::strong_count(&cache),
        1,
        "server released the engine"
    );
}

/// Connections waiting for their next request are closed by shutdown at once, not after
/// the drain timeout (5 s) that lets busy ones finish.
#[test]
fn shutdown_closes_idle_connections_at_once() {
    let server = TestServer::start();
    let mut idle = [
        Client::connect(server.memcached),
        Client::connect(server.resp),
    ];
    assert_eq!(
        idle[0].ask("version\r\n", 1)[0].split(' ').next(),
        Some("VERSION")
    );
    assert_eq!(idle[1].ask("PING\r\n", 1), ["+PONG"]);
    let began = Instant::now();
    server.stop();
    let took = began.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    for client in &mut idle {
        assert!(client.closed(), "an idle connection stayed open");
    }
}

#[test]
fn the_shared_runtime_serves_both_protocols() {
    let server = TestServer::with_options(ServerOptions {
        threads: 2,
        runtime: Runtime::Shared,
        ..ServerOptions::default()
    });
    let mut mc = Client::connect(server.memcached);
    assert_eq!(
        mc.ask("set k 0 0 1\r\nv\r\nget k\r\n", 4),
        ["STORED", "VALUE k 0 1", "v", "END"]
    );
    let mut rs = Client::connect(server.resp);
    assert_eq!(rs.ask("GET k\r\n", 2), ["$1", "v"]);
}

/// Eight clients on a two-thread server are served four per thread (thread 0 accepts and
/// hands each to the least busy), whichever ports they use; closed ones free their place.
#[test]
fn connections_are_spread_evenly_over_the_threads() {
    let server = TestServer::start();
    let mut clients: Vec<Client> = (0..8)
        .map(|i| match i % 3 {
            0 => Client::connect(server.resp),
            _ => Client::connect(server.memcached),
        })
        .collect();
    // A reply means the connection was handed over and is being served.
    for client in &mut clients {
        client.send(b"version\r\n");
        assert!(!client.line().is_empty());
    }
    assert_eq!(server.handle().connections_per_runtime(), vec![4, 4]);
    clients.truncate(5);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server
        .handle()
        .connections_per_runtime()
        .iter()
        .sum::<usize>()
        > 5
    {
        assert!(
            Instant::now() < deadline,
            "closed connections still counted"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for _ in 0..3 {
        let mut client = Client::connect(server.memcached);
        client.send(b"version\r\n");
        assert!(!client.line().is_empty());
        clients.push(client);
    }
    assert_eq!(server.handle().connections_per_runtime(), vec![4, 4]);
}

/// A port this server listens on cannot be taken by a second one (memcached refuses it
/// too): two servers sharing a port would each see a part of the clients.
#[test]
fn a_second_server_cannot_share_the_port() {
    let server = TestServer::start();
    let options = ServerOptions {
        memcached_port: Some(server.memcached.port()),
        resp_port: None,
        ..TestServer::options()
    };
    let error = zipcache_server::start(
        std::sync::Arc::new(zipcache::ZipCache::open(Default::default()).unwrap()),
        options,
    )
    .err()
    .expect("the port is taken");
    assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse, "{error}");
}
