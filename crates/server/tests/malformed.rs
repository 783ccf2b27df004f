//! Every error path of both protocols: the reply memcached 1.6 / Redis 7 give, and the
//! connection (or, for unrecoverable framing errors, at least the server) survives.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Client, TestServer};
use zipcache_server::ServerOptions;

/// Sends `request`, expects `replies`, then proves the connection still works.
fn memcached_survives(client: &mut Client, request: &str, replies: &[&str]) {
    let got = client.ask(request, replies.len());
    assert_eq!(got, replies, "request {request:?}");
    assert!(
        client.ask("version\r\n", 1)[0].starts_with("VERSION"),
        "after {request:?}"
    );
}

#[test]
fn memcached_errors_match_memcached_and_keep_the_connection() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    let long_key = "k".repeat(251);
    let cases: &[(&str, &[&str])] = &[
        ("bogus\r\n", &["ERROR"]),
        ("\r\n", &["CLIENT_ERROR bad command line format"]),
        (" \n", &["CLIENT_ERROR bad command line format"]),
        ("get\r\n", &["ERROR"]),
        ("set k 0 0\r\n", &["CLIENT_ERROR bad command line format"]),
        (
            "set k x 0 1\r\nx\r\n",
            &["CLIENT_ERROR bad command line format"],
        ),
        (
            "set k 0 0 -1\r\n",
            &["CLIENT_ERROR bad command line format"],
        ),
        (
            "set k 0 0 1\r\nabc\r\n",
            &[
                "CLIENT_ERROR bad data chunk",
                "CLIENT_ERROR bad command line format",
            ],
        ),
        (
            "incr k x\r\n",
            &["CLIENT_ERROR invalid numeric delta argument"],
        ),
        (
            "set t 0 0 1\r\nx\r\nincr t 1\r\n",
            &[
                "STORED",
                "CLIENT_ERROR cannot increment or decrement non-numeric value",
            ],
        ),
        ("delete a b c d e\r\n", &["ERROR"]),
        (
            "delete a 1\r\n",
            &["CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"],
        ),
        ("touch k x\r\n", &["CLIENT_ERROR invalid exptime argument"]),
        (
            "flush_all soon\r\n",
            &["CLIENT_ERROR invalid exptime argument"],
        ),
        ("stats nonsense\r\n", &["ERROR"]),
        (
            "cas k 0 0 1 x\r\n1\r\n",
            &["CLIENT_ERROR bad command line format"],
        ),
        ("verbosity\r\n", &["ERROR"]),
        ("mg\r\n", &["CLIENT_ERROR bad command line format"]),
        ("me\r\n", &["CLIENT_ERROR bad command line format"]),
        ("mg k zz\r\n", &["CLIENT_ERROR invalid flag"]),
        ("mg k v v\r\n", &["CLIENT_ERROR duplicate flag"]),
        (
            "mg k v T\r\n",
            &["CLIENT_ERROR bad token in command line format"],
        ),
        (
            "mg k O123456789012345678901234567890123\r\n",
            &["CLIENT_ERROR opaque token too long"],
        ),
        ("ms k S2\r\n", &["CLIENT_ERROR bad command line format"]),
        ("ms\r\n", &["CLIENT_ERROR bad command line format"]),
        (
            "ms k 2 MX\r\nab\r\n",
            &["CLIENT_ERROR invalid mode for ms M token"],
        ),
        ("ma k MX\r\n", &["CLIENT_ERROR invalid mode for ma M token"]),
    ];
    for (request, replies) in cases {
        memcached_survives(&mut c, request, replies);
    }
    let too_long_key = format!("set {long_key} 0 0 1\r\nx\r\n");
    memcached_survives(
        &mut c,
        &too_long_key,
        &["CLIENT_ERROR bad command line format"],
    );
    memcached_survives(
        &mut c,
        &format!("get {long_key}\r\n"),
        &["CLIENT_ERROR bad command line format"],
    );
    memcached_survives(
        &mut c,
        &format!("mg {long_key} v\r\n"),
        &["CLIENT_ERROR bad command line format"],
    );
}

#[test]
fn memcached_oversized_values_are_swallowed_and_drop_the_old_value() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("set big 0 0 1\r\nx\r\n", 1), ["STORED"]);
    let size = (1 << 20) + 1;
    c.send(format!("set big 0 0 {size}\r\n").as_bytes());
    c.send(&vec![b'z'; size]);
    c.send(b"\r\n");
    assert_eq!(c.line(), "SERVER_ERROR object too large for cache");
    // The data block was skipped, not parsed as commands; the old value is gone.
    assert_eq!(c.ask("get big\r\n", 1), ["END"]);
    let mut noreply = Client::connect(server.memcached);
    noreply.send(format!("add big 0 0 {size} noreply\r\n").as_bytes());
    noreply.send(&vec![b'z'; size]);
    noreply.send(b"\r\n");
    assert_eq!(noreply.ask("mn\r\n", 1), ["MN"]);
}

#[test]
fn memcached_endless_line_closes_only_that_connection() {
    let server = TestServer::start();
    let mut bystander = Client::connect(server.memcached);
    bystander.send(b"set a 0 0 1\r\n");
    let mut bad = Client::connect(server.memcached);
    bad.send(&vec![b'x'; 10_000]);
    assert!(
        bad.closed(),
        "a line with no end closes the connection, as memcached does"
    );
    bystander.send(b"1\r\n");
    assert_eq!(bystander.line(), "STORED");
    assert_eq!(
        Client::connect(server.memcached).ask("get a\r\n", 2)[1],
        "1"
    );
}

fn resp(args: &[&str]) -> String {
    let mut s = format!("*{}\r\n", args.len());
    for a in args {
        s.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s
}

#[test]
fn resp_command_errors_match_redis_and_keep_the_connection() {
    let server = TestServer::start();
    let mut c = Client::connect(server.resp);
    let cases: &[(&[&str], &str)] = &[
        (
            &["NOPE", "a", "b"],
            "-ERR unknown command 'NOPE', with args beginning with: 'a' 'b' ",
        ),
        (&["GET"], "-ERR wrong number of arguments for 'get' command"),
        (
            &["SET", "k"],
            "-ERR wrong number of arguments for 'set' command",
        ),
        (
            &["MSET", "a", "1", "b"],
            "-ERR wrong number of arguments for 'mset' command",
        ),
        (&["SET", "k", "v", "BOGUS"], "-ERR syntax error"),
        (&["SET", "k", "v", "NX", "XX"], "-ERR syntax error"),
        (
            &["SET", "k", "v", "EX", "ten"],
            "-ERR value is not an integer or out of range",
        ),
        (
            &["SET", "k", "v", "EX", "0"],
            "-ERR invalid expire time in 'set' command",
        ),
        (&["SET", "k", "text"], "+OK"),
        (
            &["INCR", "k"],
            "-ERR value is not an integer or out of range",
        ),
        (
            &["INCRBY", "n", "1.5"],
            "-ERR value is not an integer or out of range",
        ),
        (&["SET", "max", "9223372036854775807"], "+OK"),
        (
            &["INCR", "max"],
            "-ERR increment or decrement would overflow",
        ),
        (
            &["EXPIRE", "k", "soon"],
            "-ERR value is not an integer or out of range",
        ),
        (&["SCAN", "not-a-number"], "-ERR invalid cursor"),
        (&["SCAN", "12345"], "-ERR invalid cursor"),
        (&["HSCAN", "h", "-1"], "-ERR invalid cursor"),
        (&["SCAN", "0", "COUNT", "0"], "-ERR syntax error"),
        (&["SCAN", "0", "BOGUS", "1"], "-ERR syntax error"),
        (
            &["ZCRANGE", "a", "b", "LIMIT", "x"],
            "-ERR value is not an integer or out of range",
        ),
        (&["SELECT", "3"], "-ERR DB index is out of range"),
        (
            &["CONFIG", "NOPE"],
            "-ERR unknown subcommand 'NOPE'. Try CONFIG HELP.",
        ),
        (&["HELLO", "4"], "-NOPROTO unsupported protocol version"),
    ];
    let big = "v".repeat((1 << 20) + 1);
    let long_key = "k".repeat(251);
    let engine_limits: &[(&[&str], &str)] = &[
        (
            &["SET", "k", &big],
            "-ERR value of 1048577 bytes exceeds the limit of 1048576 bytes",
        ),
        (
            &["SET", &long_key, "v"],
            "-ERR key of 251 bytes exceeds the limit of 250 bytes",
        ),
        // Redis's text for its 512 MiB limit, at the engine's 1 MiB, before allocating.
        (
            &["SETRANGE", "k", "1048576", "x"],
            "-ERR string exceeds maximum allowed size (proto-max-bulk-len)",
        ),
    ];
    for (args, reply) in cases.iter().chain(engine_limits) {
        assert_eq!(c.ask(&resp(args), 1), [*reply], "{args:?}");
        assert_eq!(c.ask("PING\r\n", 1), ["+PONG"], "after {args:?}");
    }
}

#[test]
fn resp_framing_errors_reply_then_close_like_redis() {
    let server = TestServer::start();
    let cases: &[(&[u8], &str)] = &[
        (b"*x\r\n", "-ERR Protocol error: invalid multibulk length"),
        (b"*1\r\n$-3\r\n", "-ERR Protocol error: invalid bulk length"),
        (
            b"*1\r\n$999999999\r\n",
            "-ERR Protocol error: invalid bulk length",
        ),
        (
            b"*1\r\n:4\r\n",
            "-ERR Protocol error: expected '$', got ':'",
        ),
        (
            b"GET \"k\r\n",
            "-ERR Protocol error: unbalanced quotes in request",
        ),
    ];
    let mut bystander = Client::connect(server.resp);
    for (bytes, reply) in cases {
        let mut c = Client::connect(server.resp);
        c.send(bytes);
        assert_eq!(c.line(), *reply, "{:?}", String::from_utf8_lossy(bytes));
        assert!(c.closed(), "{:?} closes", String::from_utf8_lossy(bytes));
        assert_eq!(bystander.ask("PING\r\n", 1), ["+PONG"]);
    }
    let mut endless = Client::connect(server.resp);
    endless.send(&vec![b'a'; 70_000]);
    assert_eq!(
        endless.line(),
        "-ERR Protocol error: too big inline request"
    );
    assert!(endless.closed());
}

#[test]
fn keys_refuses_to_examine_more_than_its_limit() {
    let server = TestServer::with_options(ServerOptions {
        keys_limit: 5,
        ..TestServer::options()
    });
    let mut c = Client::connect(server.resp);
    for key in ["a1", "a2", "b1", "b2", "b3", "b4"] {
        assert_eq!(c.ask(&resp(&["SET", key, "v"]), 1), ["+OK"]);
    }
    // Only keys with the pattern's literal prefix are examined.
    assert_eq!(
        c.ask(&resp(&["KEYS", "a*"]), 5),
        ["*2", "$2", "a1", "$2", "a2"]
    );
    assert_eq!(
        c.ask(&resp(&["KEYS", "*1"]), 1),
        ["-ERR KEYS would examine more than 5 keys (keys-limit); use SCAN"]
    );
    assert_eq!(c.ask("PING\r\n", 1), ["+PONG"]);
}

/// A malformed storage line whose length is readable skips its data block, as memcached
/// does: the block (here a command that would empty the cache) is never executed.
#[test]
fn memcached_malformed_storage_lines_swallow_their_data_block() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("set sentinel 0 0 1\r\nx\r\n", 1), ["STORED"]);
    let long_key = "k".repeat(251);
    let lines = [
        "cas foo 0 0 9 \r\n".to_string(),
        "cas foo 0 0 9 x\r\n".into(),
        "set foo x 0 9\r\n".into(),
        "add foo 0 x 9\r\n".into(),
        "replace foo -1 0 9\r\n".into(),
        "append foo 0 0x10 9\r\n".into(),
        "prepend foo 4294967296 0 9\r\n".into(),
        format!("set {long_key} 0 0 9\r\n"),
    ];
    for line in &lines {
        c.send(line.as_bytes());
        c.send(b"flush_all\r\n");
        assert_eq!(c.line(), "CLIENT_ERROR bad command line format", "{line:?}");
        assert_eq!(c.ask("mn\r\n", 1), ["MN"], "after {line:?}");
    }
    // noreply silences the error, not the skipping.
    c.send(b"set foo x 0 9 noreply\r\nflush_all\r\n");
    assert_eq!(
        c.ask("get sentinel\r\n", 3),
        ["VALUE sentinel 0 1", "x", "END"]
    );
}

#[test]
fn memcached_refuses_impossible_lengths_without_waiting_for_data() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    // The last one's data never comes: the reply must not wait for it.
    for line in [
        "set issue70 0 0 4294967295\r\n",
        "set issue70 0 0 -1\r\n",
        "ms issue70 2147483647\r\n",
        "set issue70 0 0 2147483647\r\nscoobyscoobydoo",
    ] {
        c.send(line.as_bytes());
        assert_eq!(c.line(), "CLIENT_ERROR bad command line format", "{line:?}");
    }
}

#[test]
fn memcached_delete_takes_a_zero_hold_time_and_noreply_silences_its_errors() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("set k 0 0 1\r\nx\r\n", 1), ["STORED"]);
    assert_eq!(c.ask("delete k 0\r\n", 1), ["DELETED"]);
    assert_eq!(
        c.ask("delete k 1\r\n", 1),
        ["CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"]
    );
    // memcached's issue 3: no reply at all, so the next reply is the add's.
    c.send(b"delete k 10 noreply\r\nincr k x noreply\r\n");
    assert_eq!(c.ask("add k 0 0 1\r\nx\r\n", 1), ["STORED"]);
}

#[test]
fn memcached_hangs_up_on_http() {
    let server = TestServer::start();
    for request in [
        "GET / HTTP/1.0\r\n",
        "PUT /asdf/asd/fasdfasdf/sadf HTTP/1.1\r\n",
        "DELETE HTTP/1.1\r\n",
    ] {
        let mut stream = TcpStream::connect(server.memcached).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut reply = Vec::new();
        stream
            .read_to_end(&mut reply)
            .expect("closed, not timed out");
        assert!(reply.is_empty(), "{request:?} got {reply:?}");
    }
}
