//! What a server whose clients must log in does against clients that do not: one that
//! never logs in is closed `auth_timeout` after it connected, whatever it sent; a wrong
//! password's reply is delayed, longer each time, and the fifth closes the connection,
//! over memcached's text handshake, binary SASL PLAIN and RESP AUTH alike, counted in
//! `auth_errors` (RESP INFO: `acl_access_denied_auth`), without slowing anyone else. And
//! the metrics port: TLS when the data ports speak it, a scrape credential of its own, and
//! a deadline on each scrape that slow clients cannot stretch.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::certificates::{Certificates, tls_stream};
use common::{Client, TestServer, free_port, scrape, scrape_over};
use zipcache_server::fuzzing::memcached_binary_request;
use zipcache_server::{Credentials, Password, ServerOptions, TlsFiles};

const PASSWORD: &str = "wonderland";
/// The delays of failed logins 1 to 5 (100 ms doubling): what a guesser waits at least.
const FIVE_DELAYS: Duration = Duration::from_millis(100 + 200 + 400 + 800 + 1600);

/// A server with the one user `alice`, one serving thread (so that a delayed connection
/// and the others share it), the auth timeout `auth_timeout`.
fn server(auth_timeout: Duration) -> TestServer {
    let users = Credentials::parse(format!("alice:{PASSWORD}\n").as_bytes()).unwrap();
    TestServer::with_options(ServerOptions {
        users: Some(Arc::new(users)),
        threads: 1,
        auth_timeout: Some(auth_timeout),
        ..TestServer::options()
    })
}

/// memcached's ascii handshake: `set <key> 0 0 <len>` with `user password` as the value.
fn text_login(password: &str) -> String {
    let token = format!("alice {password}");
    format!("set auth 0 0 {}\r\n{token}\r\n", token.len())
}

fn resp(words: &[&str]) -> String {
    let mut request = format!("*{}\r\n", words.len());
    for word in words {
        request.push_str(&format!("${}\r\n{word}\r\n", word.len()));
    }
    request
}

/// A client that has logged in over memcached's text protocol.
fn logged_in(server: &TestServer) -> Client {
    let mut client = Client::connect(server.memcached);
    assert_eq!(client.ask(&text_login(PASSWORD), 1), ["STORED"]);
    client
}

/// Whether the server closes `client` within `limit`, and how long that took.
fn closes_within(client: &mut Client, limit: Duration) -> (bool, Duration) {
    let started = Instant::now();
    let closed = client.closed();
    (closed && started.elapsed() < limit, started.elapsed())
}

#[test]
fn a_client_that_never_logs_in_is_closed_after_auth_timeout_whatever_it_sent() {
    let server = server(Duration::from_secs(1));
    // Refused requests: each is a complete request, which disarms the first-request
    // timeout, so only the auth timeout can close these.
    let mut memcached = Client::connect(server.memcached);
    assert_eq!(
        memcached.ask("get x\r\n", 1),
        ["CLIENT_ERROR unauthenticated"]
    );
    let mut redis = Client::connect(server.resp);
    assert!(redis.ask(&resp(&["GET", "x"]), 1)[0].starts_with("-NOAUTH"));
    // A client that logged in is not bound by it.
    let mut member = logged_in(&server);
    for client in [&mut memcached, &mut redis] {
        let (closed, after) = closes_within(client, Duration::from_secs(8));
        assert!(closed, "still open {after:?} after a refused request");
    }
    assert_eq!(member.ask("get x\r\n", 1), ["END"], "a member stays");
    let stats = member.stats("");
    assert_eq!(stats["auth_timeout_kicks"], "2");
    assert_eq!(stats["first_request_kicks"], "0");
}

/// Sends five wrong passwords with `attempt`, each answered by `refused`, then expects
/// the connection closed; returns how long the five took.
fn five_wrong_passwords(
    stream: &mut TcpStream,
    attempt: &[u8],
    mut refused: impl FnMut(&mut TcpStream),
) -> Duration {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    for _ in 0..5 {
        stream.write_all(attempt).unwrap();
        refused(stream);
    }
    let took = started.elapsed();
    let mut rest = Vec::new();
    let closed = stream.read_to_end(&mut rest);
    assert!(
        matches!(closed, Ok(0)),
        "open after five wrong passwords: {closed:?} {rest:?}"
    );
    took
}

fn line(stream: &mut TcpStream) -> String {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    line
}

#[test]
fn five_wrong_passwords_are_delayed_then_closed_on_every_protocol_and_counted() {
    let server = server(Duration::from_secs(30));
    let text = {
        let addr = server.memcached;
        std::thread::spawn(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            five_wrong_passwords(&mut stream, text_login("guess").as_bytes(), |s| {
                assert_eq!(line(s), "CLIENT_ERROR authentication failure\r\n");
            })
        })
    };
    let sasl = {
        let addr = server.memcached;
        std::thread::spawn(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            let plain = memcached_binary_request(0x21, &[], b"PLAIN", b"\0alice\0guess", 0, 0);
            five_wrong_passwords(&mut stream, &plain, |s| {
                let mut reply = [0u8; 24 + 13];
                s.read_exact(&mut reply).unwrap();
                assert_eq!(&reply[6..8], &[0x00, 0x20], "Auth failure");
            })
        })
    };
    let redis = {
        let addr = server.resp;
        std::thread::spawn(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            five_wrong_passwords(
                &mut stream,
                resp(&["AUTH", "alice", "guess"]).as_bytes(),
                |s| {
                    assert!(line(s).starts_with("-WRONGPASS"));
                },
            )
        })
    };
    for (name, guesser) in [("text", text), ("SASL PLAIN", sasl), ("RESP AUTH", redis)] {
        let took = guesser.join().unwrap();
        assert!(took >= FIVE_DELAYS, "{name}: five guesses in {took:?}");
    }
    let mut member = logged_in(&server);
    let stats = member.stats("");
    assert_eq!(stats["auth_errors"], "15");
    assert_eq!(stats["auth_cmds"], "16", "15 refused and this login");
    let mut redis = TcpStream::connect(server.resp).unwrap();
    redis
        .write_all((resp(&["AUTH", "alice", PASSWORD]) + &resp(&["INFO", "stats"])).as_bytes())
        .unwrap();
    let mut reader = BufReader::new(redis);
    let mut info = String::new();
    while !info.contains("acl_access_denied_auth:") || !info.ends_with('\n') {
        assert!(reader.read_line(&mut info).unwrap() > 0, "{info}");
    }
    assert!(info.contains("acl_access_denied_auth:15\r\n"), "{info}");
}

#[test]
fn a_guesser_slows_no_one_else_and_a_right_password_logs_in_at_once() {
    let server = server(Duration::from_secs(30));
    let mut guesser = TcpStream::connect(server.memcached).unwrap();
    guesser
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    for _ in 0..4 {
        guesser.write_all(text_login("guess").as_bytes()).unwrap();
        assert_eq!(
            line(&mut guesser),
            "CLIENT_ERROR authentication failure\r\n"
        );
    }
    // The fifth failure's reply waits 1.6 s on the one serving thread; meanwhile a new
    // connection logs in and is served, and so is one that logged in before.
    let mut member = logged_in(&server);
    guesser.write_all(text_login("guess").as_bytes()).unwrap();
    let fifth = std::thread::spawn(move || {
        let reply = line(&mut guesser);
        (reply, Instant::now())
    });
    let mut newcomer = Client::connect(server.memcached);
    assert_eq!(newcomer.ask(&text_login(PASSWORD), 1), ["STORED"]);
    assert_eq!(newcomer.ask("set k 0 0 1\r\nv\r\n", 1), ["STORED"]);
    assert_eq!(member.ask("get k\r\n", 3), ["VALUE k 0 1", "v", "END"]);
    let served = Instant::now();
    let (reply, answered) = fifth.join().unwrap();
    assert_eq!(reply, "CLIENT_ERROR authentication failure\r\n");
    assert!(
        served < answered,
        "the others waited for the guesser's delay"
    );
    // A failed login then the right one, on one connection: the delay, then a login.
    let mut client = Client::connect(server.memcached);
    assert_eq!(
        client.ask(&(text_login("guess") + &text_login(PASSWORD)), 2),
        ["CLIENT_ERROR authentication failure", "STORED"]
    );
    assert_eq!(client.ask("get k\r\n", 3)[1], "v");
}

/// `prom:scrape-pw`, and `default:scrape-token` for Bearer: the metrics port's own users.
const SCRAPERS: &str = "prom:scrape-pw\ndefault:scrape-token\n";
/// prom:scrape-pw
const PROM: &str = "Authorization: Basic cHJvbTpzY3JhcGUtcHc=\r\n";

/// A server whose data ports take `default` with `s3cret`, with a metrics port whose
/// users are [`SCRAPERS`], over TLS with `tls`.
fn metrics_server(tls: Option<TlsFiles>) -> TestServer {
    TestServer::with_options(ServerOptions {
        requirepass: Password::new("s3cret"),
        metrics_port: Some(free_port()),
        metrics_users: Some(Arc::new(Credentials::parse(SCRAPERS.as_bytes()).unwrap())),
        tls,
        ..TestServer::options()
    })
}

#[test]
fn only_the_metrics_users_scrape_and_the_data_password_is_refused() {
    let server = metrics_server(None);
    let (status, body) = scrape(&server, PROM).unwrap();
    assert_eq!(status, "HTTP/1.0 200 OK");
    assert!(body.contains("\nzipcache_auth_errors 0\n"), "{body}");
    let token = "Authorization: Bearer scrape-token\r\n";
    assert_eq!(scrape(&server, token).unwrap().0, "HTTP/1.0 200 OK");
    for refused in [
        "",
        // The data ports' password, as a token and as Basic default:s3cret.
        "Authorization: Bearer s3cret\r\n",
        "Authorization: Basic ZGVmYXVsdDpzM2NyZXQ=\r\n",
        // prom:scrape-p
        "Authorization: Basic cHJvbTpzY3JhcGUtcA==\r\n",
        "Authorization: Basic !!!\r\n",
    ] {
        let (status, body) = scrape(&server, refused).unwrap();
        assert_eq!(status, "HTTP/1.0 401 Unauthorized", "{refused}");
        assert!(!body.contains("zipcache_"), "{body}");
    }
    // And the metrics credential opens no data port.
    let mut client = Client::connect(server.resp);
    assert!(client.ask(&resp(&["AUTH", "prom", "scrape-pw"]), 1)[0].starts_with("-WRONGPASS"));
}

#[test]
fn with_tls_the_metrics_port_speaks_tls_only() {
    let certificates = Certificates::generate("metrics");
    let server = metrics_server(Some(certificates.server_files(false)));
    let port = server.handle().metrics_addr.expect("metrics port").port();
    let tls = tls_stream(port, &certificates.path("ca.pem"));
    let (status, body) = scrape_over(tls, PROM).expect("a scrape over TLS");
    assert_eq!(status, "HTTP/1.0 200 OK");
    assert!(body.contains("zipcache_curr_connections"), "{body}");
    // Plain HTTP gets no HTTP reply: the server reads it as a TLS handshake.
    let plain = scrape(&server, PROM);
    assert!(
        plain
            .as_ref()
            .map_or(true, |(status, _)| !status.starts_with("HTTP/")),
        "{plain:?}"
    );
}

#[test]
fn slow_clients_cannot_hold_the_scrape_slots_past_the_deadline() {
    let server = metrics_server(None);
    let addr = server.handle().metrics_addr.expect("metrics port");
    let started = Instant::now();
    // Eight clients, the endpoint's limit, each sending its request a byte a second:
    // they take every slot, and would hold it for minutes.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dribblers: Vec<_> = (0..8)
        .map(|_| {
            let mut stream = TcpStream::connect(addr).unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                for byte in b"GET /metrics HTTP/1.0\r\nX-Slow: ".iter().cycle() {
                    if stop.load(std::sync::atomic::Ordering::Relaxed)
                        || stream.write_all(&[*byte]).is_err()
                    {
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // A ninth scraper, retrying as Prometheus would, gets through once the deadline
    // (5 s) has closed the dribblers, with a generous margin.
    let limit = Duration::from_secs(5 + 5);
    let scraped = loop {
        if scrape(&server, PROM).is_ok_and(|(status, _)| status == "HTTP/1.0 200 OK") {
            break started.elapsed();
        }
        assert!(started.elapsed() < limit, "no scrape within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        scraped >= Duration::from_secs(4),
        "the slots were taken: {scraped:?}"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for dribbler in dribblers {
        dribbler.join().unwrap();
    }
}
