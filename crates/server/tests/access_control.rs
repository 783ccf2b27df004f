//! Operator controls: ascii authentication against an auth file on the memcached port
//! (memcached `-Y`, here `--auth-file`; the same users guard RESP) and a refused flush
//! (memcached `-F`, here `--disable-flush-all`: `flush_all`, and RESP
//! `FLUSHALL`/`FLUSHDB`), both through the server and through `serve`'s settings.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{Client, TestServer, free_port, require_python_modules, run_tool};
use zipcache_server::{Credentials, ServeArgs, ServerOptions, Settings};

fn server_with(options: ServerOptions) -> TestServer {
    TestServer::with_options(ServerOptions {
        memcached_port: Some(free_port()),
        resp_port: Some(free_port()),
        ..options
    })
}

#[test]
fn nothing_but_authentication_before_a_client_authenticates() {
    let users = Credentials::parse(b"foo:bar\nbaaaz:quux\n").unwrap();
    let server = server_with(ServerOptions {
        users: Some(Arc::new(users)),
        ..ServerOptions::default()
    });
    let mut c = Client::connect(server.memcached);
    assert_eq!(
        c.ask("set foo 0 0 2\r\nhi\r\n", 1),
        ["CLIENT_ERROR bad authentication token format"]
    );
    assert_eq!(c.ask("get foo\r\n", 1), ["CLIENT_ERROR unauthenticated"]);
    assert_eq!(c.ask("version\r\n", 1), ["CLIENT_ERROR unauthenticated"]);
    assert_eq!(
        c.ask("set foo 0 0 7\r\nfoo bab\r\n", 1),
        ["CLIENT_ERROR authentication failure"]
    );
    assert_eq!(
        c.ask("set foo 0 0 2147483646\r\n", 1),
        ["CLIENT_ERROR auth token too long"]
    );
    assert_eq!(c.ask("set foo 0 0 7\r\nfoo bar\r\n", 1), ["STORED"]);
    // Authenticated: the connection is an ordinary one now.
    assert_eq!(c.ask("set toast 0 0 2\r\nhi\r\n", 1), ["STORED"]);
    assert_eq!(c.ask("get toast\r\n", 3), ["VALUE toast 0 2", "hi", "END"]);
    assert_eq!(
        server.cache.get(b"foo").unwrap(),
        None,
        "the auth set stores nothing"
    );

    // Each connection authenticates on its own, as any user of the file.
    let mut second = Client::connect(server.memcached);
    assert_eq!(
        second.ask("get toast\r\n", 1),
        ["CLIENT_ERROR unauthenticated"]
    );
    assert_eq!(second.ask("set x 0 0 10\r\nbaaaz quux\r\n", 1), ["STORED"]);
    assert_eq!(second.ask("get toast\r\n", 3)[1], "hi");

    // The same users guard the RESP port (one access policy: tests/one_policy.rs).
    let mut resp = Client::connect(server.resp);
    assert_eq!(
        resp.ask("PING\r\n", 1),
        ["-NOAUTH Authentication required."]
    );
    assert_eq!(resp.ask("AUTH baaaz quux\r\n", 1), ["+OK"]);
    assert_eq!(resp.ask("PING\r\n", 1), ["+PONG"]);
}

#[test]
fn junk_before_authentication_closes_the_connection() {
    let server = server_with(ServerOptions {
        users: Some(Arc::new(Credentials::parse(b"a:b").unwrap())),
        ..ServerOptions::default()
    });
    let mut c = Client::connect(server.memcached);
    c.send(b"ab\r\n");
    assert!(c.closed());
}

#[test]
fn flush_all_can_be_refused() {
    let server = server_with(ServerOptions {
        flush_all_enabled: false,
        ..ServerOptions::default()
    });
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("set foo 0 0 7\r\nfooval2\r\n", 1), ["STORED"]);
    assert_eq!(
        c.ask("flush_all\r\n", 1),
        ["CLIENT_ERROR flush_all not allowed"]
    );
    assert_eq!(
        c.ask("flush_all 10\r\n", 1),
        ["CLIENT_ERROR flush_all not allowed"]
    );
    assert_eq!(c.ask("get foo\r\n", 3)[1], "fooval2");
}

/// redis-py against a server with `--disable-flush-all`: both flushes raise its
/// `NoPermissionError` with Redis's ACL text, and nothing is flushed.
const REDIS_PY_FLUSH_REFUSED: &str = r#"
import sys
import redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), socket_timeout=10)
assert r.set("k", "v")
for flush, name in ((r.flushall, "flushall"), (r.flushdb, "flushdb")):
    for asynchronous in (False, True):
        try:
            flush(asynchronous=asynchronous)
            raise SystemExit(name + " was not refused")
        except redis.exceptions.NoPermissionError as e:
            assert str(e) == "this user has no permissions to run the '%s' command" % name, e
assert r.get("k") == b"v"
assert r.dbsize() == 1
print("ok")
"#;

#[test]
fn resp_flushes_can_be_refused_too() {
    require_python_modules(&[("redis", "redis")]);
    let server = server_with(ServerOptions {
        flush_all_enabled: false,
        ..ServerOptions::default()
    });
    let run = run_tool(
        Command::new("python3").args([
            "-c",
            REDIS_PY_FLUSH_REFUSED,
            &server.resp.port().to_string(),
        ]),
        Duration::from_secs(60),
    );
    assert!(run.ok && run.stdout.contains("ok"), "redis-py:\n{run}");
}

#[test]
fn flush_all_with_a_unix_time_flushes_when_that_time_comes() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    let now_s = server.cache.now_ms() / 1000;
    assert_eq!(c.ask(&format!("flush_all {}\r\n", now_s + 2), 1), ["OK"]);
    assert_eq!(c.ask("set foo 0 0 4\r\n1234\r\n", 1), ["STORED"]);
    assert_eq!(c.ask("get foo\r\n", 3)[1], "1234");
    std::thread::sleep(std::time::Duration::from_millis(3500));
    assert_eq!(c.ask("get foo\r\n", 1), ["END"]);
    assert_eq!(c.ask("set foo 0 0 5\r\n12345\r\n", 1), ["STORED"]);
    assert_eq!(c.ask("flush_all 86400\r\n", 1), ["OK"]);
    assert_eq!(c.ask("get foo\r\n", 3)[1], "12345", "a day away");
}

#[test]
fn serve_flags_reach_the_server_options() {
    let dir = std::env::temp_dir().join(format!("zipcache-access-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let users = dir.join("users");
    std::fs::write(&users, "ada:lovelace\n").unwrap();
    let settings = Settings::resolve(ServeArgs {
        disable_flush_all: true,
        auth_file: Some(users),
        ..ServeArgs::default()
    })
    .unwrap();
    let options = settings.server_options(1 << 20);
    assert!(!options.flush_all_enabled);
    assert!(options.users.unwrap().check(b"ada", b"lovelace"));
    let missing = ServeArgs {
        auth_file: Some(dir.join("nope")),
        ..ServeArgs::default()
    };
    assert!(Settings::resolve(missing).unwrap_err().contains("nope"));
    std::fs::remove_dir_all(dir).unwrap();
}
