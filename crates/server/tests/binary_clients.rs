//! Binary-protocol clients against an in-process server: memjs (node; binary only), open
//! and with SASL PLAIN against `--requirepass` and `--auth-file` users; and what binary
//! clients rely on from memcached's connection handling, over a raw socket.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, run_tool};
use zipcache_server::{Credentials, Password, ServerOptions};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/memjs_client.js")
}

fn memjs(server: &TestServer, credentials: &[&str]) {
    let node = run_tool(
        Command::new("node")
            .env("NODE_PATH", common::node_modules("memjs"))
            .arg(script())
            .arg(server.memcached.port().to_string())
            .args(credentials),
        Duration::from_secs(120),
    );
    assert!(
        node.ok && node.stdout.contains("ok"),
        "memjs_client.js failed:\n{node}"
    );
}

#[test]
fn memjs_round_trips() {
    let server = TestServer::start();
    memjs(&server, &[]);
}

/// A server whose clients must log in: `alice` of the user file, or `default` with the
/// password.
fn secured() -> TestServer {
    let users = Credentials::parse(b"alice:wonderland\n").expect("users");
    TestServer::with_options(ServerOptions {
        requirepass: Password::new("hunter2"),
        users: Some(Arc::new(users)),
        ..TestServer::options()
    })
}

#[test]
fn memjs_logs_in_with_sasl_plain() {
    // Both sources of users, each login on a fresh server (the script's writes assume
    // an empty cache).
    memjs(&secured(), &["alice", "wonderland", "wrong"]);
    memjs(&secured(), &["default", "hunter2", "wonderland"]);
}

/// A binary GET of `key` (a request header and the key).
fn binary_get(key: &[u8]) -> Vec<u8> {
    let mut packet = vec![0x80, 0x00];
    packet.extend_from_slice(&(key.len() as u16).to_be_bytes());
    packet.extend_from_slice(&[0; 4]);
    packet.extend_from_slice(&(key.len() as u32).to_be_bytes());
    packet.extend_from_slice(&[0; 12]);
    packet.extend_from_slice(key);
    packet
}

#[test]
fn an_unauthenticated_binary_request_is_refused_then_hung_up() {
    // As memcached: memcached's own binary-sasl.t opens a new connection only once the
    // old one is gone, and counts on the refusal to make it go.
    let server = secured();
    let mut client = TcpStream::connect(server.memcached).expect("connect");
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    client.write_all(&binary_get(b"k")).expect("send");
    let mut reply = [0u8; 24 + 13];
    client.read_exact(&mut reply).expect("the refusal");
    assert_eq!((reply[0], &reply[6..8]), (0x81, &[0x00, 0x20][..]));
    assert_eq!(&reply[24..], b"Auth failure.");
    let mut rest = Vec::new();
    match client.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "nothing after the refusal: {rest:?}"),
        Err(e) => assert!(
            !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "the connection was left open after the refusal"
        ),
    }
}
