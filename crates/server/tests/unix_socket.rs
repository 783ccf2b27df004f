//! memcached's protocols on a unix-domain socket (`--unix-socket`, memcached's `-s`):
//! text, meta and binary over it, the same admission, limits and timeouts as TCP, what
//! `stats` reports, and the socket file's life.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{Client, TestServer, require_python_modules, run_tool};
use zipcache::{Config, ZipCache};
use zipcache_server::fuzzing::memcached_binary_request;
use zipcache_server::{ServerOptions, start};

/// A socket path of this test alone, nothing there yet.
fn socket_path(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("zc-unix-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// `TestServer`'s options (both TCP ports) with the unix socket at `path`.
fn options(path: &Path) -> ServerOptions {
    ServerOptions {
        unix_socket: Some(path.to_path_buf()),
        ..TestServer::options()
    }
}

fn engine() -> Arc<ZipCache> {
    let config = Config {
        dram_capacity: 32 << 20,
        ..Config::default()
    };
    Arc::new(ZipCache::open(config).expect("engine"))
}

/// One binary response: its header fields and body.
struct Response {
    opcode: u8,
    status: u16,
    opaque: u32,
    extras: Vec<u8>,
    value: Vec<u8>,
}

fn binary_response(stream: &mut UnixStream) -> Response {
    let mut header = [0u8; 24];
    stream.read_exact(&mut header).expect("response header");
    assert_eq!(header[0], 0x81, "response magic");
    let key_len = u16::from_be_bytes([header[2], header[3]]) as usize;
    let extras_len = header[4] as usize;
    let body_len = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
    let mut body = vec![0u8; body_len];
    stream.read_exact(&mut body).expect("response body");
    Response {
        opcode: header[1],
        status: u16::from_be_bytes([header[6], header[7]]),
        opaque: u32::from_be_bytes(header[12..16].try_into().unwrap()),
        extras: body[..extras_len].to_vec(),
        value: body[extras_len + key_len..].to_vec(),
    }
}

#[test]
fn text_meta_and_binary_are_served_on_the_unix_socket_beside_tcp() {
    let path = socket_path("protocols");
    let server = TestServer::with_options(options(&path));
    let mode = std::fs::symlink_metadata(&path).expect("socket file");
    assert!(mode.file_type().is_socket());
    assert_eq!(mode.permissions().mode() & 0o777, 0o700, "memcached's -a");

    let mut text = Client::unix(&path);
    assert_eq!(text.ask("set k 0 0 5\r\nhello\r\n", 1), ["STORED"]);
    assert_eq!(text.ask("get k\r\n", 3), ["VALUE k 0 5", "hello", "END"]);
    assert_eq!(text.ask("ms m 2 T0\r\nhi\r\n", 1), ["HD"]);
    assert_eq!(text.ask("mg m v f\r\n", 2), ["VA 2 f0", "hi"]);
    // One engine behind both: TCP sees what the unix client stored.
    let mut tcp = Client::connect(server.memcached);
    assert_eq!(tcp.ask("get k\r\n", 3), ["VALUE k 0 5", "hello", "END"]);

    let mut binary = UnixStream::connect(&path).expect("connect");
    binary
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let flags_and_exptime = [0, 0, 0, 42, 0, 0, 0, 0];
    let set = memcached_binary_request(0x01, &flags_and_exptime, b"b", b"bin", 7, 0);
    binary.write_all(&set).unwrap();
    let stored = binary_response(&mut binary);
    assert_eq!((stored.opcode, stored.status, stored.opaque), (0x01, 0, 7));
    binary
        .write_all(&memcached_binary_request(0x00, &[], b"b", &[], 8, 0))
        .unwrap();
    let got = binary_response(&mut binary);
    assert_eq!((got.opcode, got.status, got.opaque), (0x00, 0, 8));
    assert_eq!(
        (got.extras, got.value),
        (vec![0, 0, 0, 42], b"bin".to_vec())
    );
    assert_eq!(text.ask("get b\r\n", 3), ["VALUE b 42 3", "bin", "END"]);
}

#[test]
fn stats_describe_the_socket_and_its_clients_as_memcached_does() {
    let path = socket_path("stats");
    let server = TestServer::with_options(ServerOptions {
        unix_socket_mode: 0o755,
        ..options(&path)
    });
    let mut watcher = Client::unix(&path);
    assert_eq!(watcher.ask("watch connevents\r\n", 1), ["OK"]);
    let mut client = Client::unix(&path);
    let settings = client.stats(" settings");
    assert_eq!(settings["domain_socket"], path.display().to_string());
    assert_eq!(settings["umask"], "755");
    let conns = client.stats(" conns");
    let unix_clients = conns.iter().filter(|(_, v)| *v == "?:<AF 0>").count();
    let listen = format!("unix:{}", path.display());
    let on_socket = conns.values().filter(|v| **v == listen).count();
    assert_eq!((unix_clients, on_socket), (2, 2), "{conns:?}");
    let line = watcher.line();
    assert!(
        line.contains(" type=conn_new rip=unix rport=0 transport=local cfd="),
        "{line}"
    );
    drop(client);
    let line = watcher.line();
    assert!(
        line.contains(" type=conn_close rip=unix rport=0 transport=local reason=normal cfd="),
        "{line}"
    );

    let mut tcp = Client::connect(server.memcached);
    let conns = tcp.stats(" conns");
    let tcp_peer = format!("tcp:{}", tcp.local_addr());
    assert!(conns.values().any(|v| *v == tcp_peer), "{conns:?}");

    let without = TestServer::start();
    let settings = Client::connect(without.memcached).stats(" settings");
    assert_eq!(
        (
            settings["domain_socket"].as_str(),
            settings["umask"].as_str()
        ),
        ("NULL", "700")
    );
}

#[test]
fn the_connection_limit_counts_unix_and_tcp_clients_together() {
    let path = socket_path("limit");
    let server = TestServer::with_options(ServerOptions {
        max_connections: 2,
        ..options(&path)
    });
    let mut unix = Client::unix(&path);
    assert_eq!(unix.ask("version\r\n", 1).len(), 1, "admitted");
    let mut tcp = Client::connect(server.memcached);
    assert_eq!(tcp.ask("version\r\n", 1).len(), 1, "admitted");
    let mut over = Client::unix(&path);
    assert_eq!(over.line(), "ERROR Too many open connections");
    assert!(over.closed());
    let mut over_tcp = Client::connect(server.memcached);
    assert_eq!(over_tcp.line(), "ERROR Too many open connections");
    let stats = unix.stats("");
    assert_eq!(stats["rejected_connections"], "2");
    assert_eq!(stats["curr_connections"], "2");
    drop(tcp);
    // The freed place goes to the next client, whichever way it comes (once the server
    // has seen the TCP client leave; until then a client is refused and closed, so its
    // write may fail).
    let admitted = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        let mut next = UnixStream::connect(&path).expect("connect");
        next.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let _ = next.write_all(b"version\r\n");
        let mut reply = [0u8; 7];
        next.read_exact(&mut reply).is_ok() && reply == *b"VERSION"
    });
    assert!(admitted, "a unix client takes the place a TCP client left");
}

#[test]
fn idle_and_oversized_unix_clients_are_closed_as_tcp_ones_are() {
    let path = socket_path("limits");
    let server = TestServer::with_options(ServerOptions {
        idle_timeout: Some(Duration::from_secs(1)),
        max_request_size: Some(64 << 10),
        ..options(&path)
    });
    let mut idle = Client::unix(&path);
    assert!(idle.closed(), "an idle unix client is closed");
    let mut big = Client::unix(&path);
    big.send(b"set big 0 0 200000\r\n");
    big.send(&vec![b'x'; 100 << 10]);
    assert_eq!(big.line(), "SERVER_ERROR request exceeds max-request-size");
    let stats = Client::connect(server.memcached).stats("");
    assert!(
        stats["idle_kicks"].parse::<u64>().unwrap() >= 1,
        "{stats:?}"
    );
    assert_eq!(stats["request_size_kicks"], "1");
}

#[test]
fn a_unix_socket_alone_serves_memcached_and_its_file_goes_at_shutdown() {
    let path = socket_path("alone");
    // A socket file a killed server left: nothing listens on it.
    drop(UnixListener::bind(&path).expect("stale socket"));
    let options = ServerOptions {
        memcached_port: None,
        unix_socket: Some(path.clone()),
        ..TestServer::options()
    };
    let handle = start(engine(), options.clone()).expect("the stale file is replaced");
    assert_eq!(handle.memcached_addr, None);
    assert!(
        handle
            .listening()
            .ends_with(&format!(" metrics=off unix={}", path.display())),
        "{}",
        handle.listening()
    );
    let mut client = Client::unix(&path);
    assert_eq!(client.ask("set k 0 0 1\r\nv\r\n", 1), ["STORED"]);

    // A second server on the same path is refused while this one listens.
    let second = ServerOptions {
        resp_port: Some(common::free_port()),
        ..options.clone()
    };
    let refused = start(engine(), second).err().expect("a live owner");
    let message = refused.to_string();
    assert!(
        message.contains(&*path.to_string_lossy()) && message.contains("listening"),
        "{message}"
    );
    assert_eq!(client.ask("get k\r\n", 3), ["VALUE k 0 1", "v", "END"]);

    handle.shutdown();
    assert!(client.closed());
    assert!(!path.exists(), "the socket file is removed on a clean stop");
}

/// Real clients name a unix socket by its path: pymemcache (text) and pylibmc
/// (libmemcached, binary protocol) round-trip over it.
#[test]
fn pymemcache_and_pylibmc_speak_over_the_socket() {
    require_python_modules(&[("pymemcache", "pymemcache"), ("pylibmc", "pylibmc")]);
    let path = socket_path("clients");
    let _server = TestServer::with_options(options(&path));
    let script = r#"
import sys
from pymemcache.client.base import Client
import pylibmc
path = sys.argv[1]
text = Client(path, connect_timeout=5, timeout=10)
assert text.set("k", b"from text") is True
assert text.get("k") == b"from text"
binary = pylibmc.Client([path], binary=True)
assert binary.get("k") == b"from text"
assert binary.set("b", b"from binary")
assert binary.set("n", "41")
assert binary.incr("n", 1) == 42
assert text.get("b") == b"from binary"
assert text.get("n") == b"42"
print("ok")
"#;
    let run = run_tool(
        Command::new("python3").args(["-c", script, &path.display().to_string()]),
        Duration::from_secs(60),
    );
    assert!(
        run.ok && run.stdout.contains("ok"),
        "clients over the socket:\n{run}"
    );
}
