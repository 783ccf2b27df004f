//! One access policy for the data ports: `--requirepass` (the `default` user's password)
//! and `--auth-file` (memcached's user file) each protect the memcached port and the RESP
//! port alike, and a user logs in the same on both; the metrics endpoint accepts none of
//! them.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Client, TestServer, free_port};
use zipcache_server::{Password, ServeArgs, ServerOptions, Settings};

const USERS: &str = "alice:wonder land\nbob:builder\n";

/// A server whose options come from `serve`'s flags (with an auth file of [`USERS`] when
/// `users` is set), on fresh ports, metrics included.
fn server(requirepass: Option<&str>, users: bool) -> TestServer {
    let file = std::env::temp_dir().join(format!(
        "zipcache-one-policy-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::write(&file, USERS).unwrap();
    let settings = Settings::resolve(ServeArgs {
        requirepass: requirepass.map(str::to_string),
        auth_file: users.then(|| file.clone()),
        ssd: Some("none".into()),
        ..ServeArgs::default()
    })
    .unwrap();
    std::fs::remove_file(file).unwrap();
    let flags = settings.server_options(1 << 20);
    TestServer::with_options(ServerOptions {
        metrics_port: Some(free_port()),
        requirepass: flags.requirepass,
        ..ServerOptions {
            users: flags.users,
            ..TestServer::options()
        }
    })
}

/// memcached's ascii handshake as `user` with `password`: its one reply line.
fn memcached_login(client: &mut Client, user: &str, password: &str) -> String {
    let token = format!("{user} {password}");
    client.ask(&format!("set auth 0 0 {}\r\n{token}\r\n", token.len()), 1)[0].clone()
}

fn resp(words: &[&str]) -> String {
    let mut request = format!("*{}\r\n", words.len());
    for word in words {
        request.push_str(&format!("${}\r\n{word}\r\n", word.len()));
    }
    request
}

#[test]
fn requirepass_alone_protects_the_memcached_port() {
    let server = server(Some("s3cret"), false);
    let mut c = Client::connect(server.memcached);
    assert_eq!(
        c.ask("set k 0 0 5\r\nhello\r\n", 1),
        ["CLIENT_ERROR bad authentication token format"]
    );
    assert_eq!(c.ask("get k\r\n", 1), ["CLIENT_ERROR unauthenticated"]);
    assert_eq!(server.cache.get(b"k").unwrap(), None, "nothing was stored");
    assert_eq!(
        memcached_login(&mut c, "alice", "s3cret"),
        "CLIENT_ERROR authentication failure",
        "the password is the default user's"
    );
    assert_eq!(
        memcached_login(&mut c, "default", "s3creT"),
        "CLIENT_ERROR authentication failure"
    );
    assert_eq!(memcached_login(&mut c, "default", "s3cret"), "STORED");
    assert_eq!(c.ask("set k 0 0 5\r\nhello\r\n", 1), ["STORED"]);
    assert_eq!(c.ask("get k\r\n", 3), ["VALUE k 0 5", "hello", "END"]);
}

#[test]
fn an_auth_file_alone_protects_the_resp_port() {
    let server = server(None, true);
    let mut c = Client::connect(server.resp);
    assert_eq!(
        c.ask(&resp(&["SET", "k", "v"]), 1),
        ["-NOAUTH Authentication required."]
    );
    assert_eq!(
        c.ask(&resp(&["GET", "k"]), 1),
        ["-NOAUTH Authentication required."]
    );
    assert_eq!(server.cache.get(b"k").unwrap(), None, "nothing was stored");
    let wrongpass = "-WRONGPASS invalid username-password pair or user is disabled.";
    assert_eq!(
        c.ask(&resp(&["AUTH", "builder"]), 1),
        [wrongpass],
        "no default user without requirepass"
    );
    assert_eq!(c.ask(&resp(&["AUTH", "bob", "builder"]), 1), ["+OK"]);
    assert_eq!(c.ask(&resp(&["SET", "k", "v"]), 1), ["+OK"]);
    assert_eq!(c.ask(&resp(&["GET", "k"]), 2), ["$1", "v"]);

    let mut hello = Client::connect(server.resp);
    let reply = hello.ask(&resp(&["HELLO", "3", "AUTH", "alice", "wonder land"]), 1);
    assert!(reply[0].starts_with('%'), "{reply:?}");
}

#[test]
fn the_same_users_log_in_on_both_protocols() {
    let server = server(Some("s3cret"), true);
    for (user, password) in [("alice", "wonder land"), ("default", "s3cret")] {
        let mut mc = Client::connect(server.memcached);
        assert_eq!(memcached_login(&mut mc, user, password), "STORED", "{user}");
        let mut r = Client::connect(server.resp);
        assert_eq!(
            r.ask(&resp(&["AUTH", user, password]), 1),
            ["+OK"],
            "{user}"
        );
    }
    let mut r = Client::connect(server.resp);
    assert_eq!(r.ask(&resp(&["AUTH", "s3cret"]), 1), ["+OK"]);
    let mut mc = Client::connect(server.memcached);
    assert_eq!(
        memcached_login(&mut mc, "bob", "s3cret"),
        "CLIENT_ERROR authentication failure"
    );
}

/// `GET /metrics` with these extra header lines: the status line and the body.
fn scrape(server: &TestServer, headers: &str) -> (String, String) {
    common::scrape(server, headers).expect("a scrape")
}

/// The data ports' users do not scrape: a scraper's credential is its own
/// (`--metrics-auth-file`, `auth_guard.rs`), and without one no one scrapes while the data
/// ports require a login.
#[test]
fn metrics_refuse_the_data_ports_users() {
    let server = server(Some("s3cret"), true);
    // alice:wonder land, then the `default` user's password as a token.
    let alice = "Authorization: Basic YWxpY2U6d29uZGVyIGxhbmQ=\r\n";
    for headers in ["", alice, "authorization: Bearer s3cret\r\n"] {
        let (status, body) = scrape(&server, headers);
        assert_eq!(status, "HTTP/1.0 401 Unauthorized", "{headers}");
        assert!(body.contains("--metrics-auth-file"), "{body}");
    }

    let open = TestServer::with_options(ServerOptions {
        metrics_port: Some(free_port()),
        requirepass: Password::new(""),
        ..TestServer::options()
    });
    assert_eq!(
        scrape(&open, "").0,
        "HTTP/1.0 200 OK",
        "no policy, no login"
    );
}

#[test]
fn the_metrics_port_serves_a_few_scrapes_at_once_and_closes_the_rest() {
    let server = TestServer::with_options(ServerOptions {
        metrics_port: Some(free_port()),
        ..TestServer::options()
    });
    let addr = server.handle().metrics_addr.expect("metrics port");
    // The endpoint's limit is 8: these hold every slot until they hang up.
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut refused = TcpStream::connect(addr).unwrap();
    refused
        .set_read_timeout(Some(Duration::from_secs(4)))
        .unwrap();
    let _ = refused.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut reply = Vec::new();
    let read = refused.read_to_end(&mut reply);
    assert!(
        read.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset)
            || reply.is_empty(),
        "closed unanswered, not kept waiting: {read:?} {reply:?}"
    );
    drop(idle);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while common::scrape(&server, "").map_or(true, |(status, _)| status != "HTTP/1.0 200 OK") {
        assert!(std::time::Instant::now() < deadline, "the slots came back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_protocol_can_be_off() {
    let handle = zipcache_server::start(
        std::sync::Arc::new(zipcache::ZipCache::open(zipcache::Config::default()).unwrap()),
        ServerOptions {
            memcached_port: None,
            ..TestServer::options()
        },
    )
    .unwrap();
    assert_eq!(handle.memcached_addr, None);
    let resp_addr = handle.resp_addr.expect("RESP is on");
    assert_eq!(
        handle.listening(),
        format!("listening memcached=off resp={resp_addr} metrics=off")
    );
    let mut c = Client::connect(resp_addr);
    assert_eq!(c.ask(&resp(&["PING"]), 1), ["+PONG"]);
    drop(c);
    handle.shutdown();
}
