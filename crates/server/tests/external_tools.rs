//! Real memcached and Redis tools against an in-process server.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{TestServer, require_tool, run_tool};

#[test]
fn memccapable_ascii_suite_passes_in_full() {
    let tool = require_tool("memccapable", "libmemcached-tools");
    let server = TestServer::start();
    let port = server.memcached.port().to_string();
    let run = run_tool(
        Command::new(tool).args(["-h", "127.0.0.1", "-p", &port, "-a"]),
        Duration::from_secs(60),
    );
    assert!(run.ok, "memccapable failed:\n{run}");
    let passed = run.stdout.lines().filter(|l| l.contains("[pass]")).count();
    assert_eq!(passed, 27, "expected 27 ascii tests to pass:\n{run}");
    assert!(run.stdout.contains("All tests passed"), "{run}");
}

#[test]
fn memcaslap_runs_without_errors() {
    let tool = require_tool("memcaslap", "libmemcached-tools");
    let server = TestServer::start();
    let target = server.memcached.to_string();
    let run = run_tool(
        Command::new(tool).args(["-s", &target, "-T", "2", "-c", "16", "-t", "3s", "-X", "64"]),
        Duration::from_secs(30),
    );
    assert!(run.ok, "memcaslap failed:\n{run}");
    // An error may be reported on either stream; the figures are read from stdout.
    let lower = run.to_string().to_lowercase();
    assert!(!lower.contains("error") && !lower.contains("fail"), "{run}");
    let gets: u64 = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("cmd_get: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(gets > 0, "memcaslap did no gets:\n{run}");
    assert!(run.stdout.contains("get_misses: 0"), "{run}");
}

#[test]
fn redis_benchmark_set_get_pipelined_completes() {
    let tool = require_tool("redis-benchmark", "redis-tools");
    let server = TestServer::start();
    let port = server.resp.port().to_string();
    let run = run_tool(
        Command::new(tool).args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "set,get",
            "-n",
            "20000",
            "-P",
            "16",
            "-q",
        ]),
        Duration::from_secs(60),
    );
    assert!(run.ok, "redis-benchmark failed:\n{run}");
    for test in ["SET:", "GET:"] {
        assert!(
            run.stdout
                .lines()
                .any(|l| l.contains(test) && l.contains("requests per second")),
            "{test} missing:\n{run}"
        );
    }
    // An error may be reported on either stream.
    let both = run.to_string();
    assert!(
        !both.contains("ERR") && !both.to_lowercase().contains("error"),
        "{run}"
    );
}

#[test]
fn redis_cli_inline_and_scan_work() {
    let tool = require_tool("redis-cli", "redis-tools");
    let server = TestServer::start();
    let port = server.resp.port().to_string();
    let cli = |args: &[&str]| {
        let run = run_tool(
            Command::new(&tool)
                .args(["-h", "127.0.0.1", "-p", &port])
                .args(args),
            Duration::from_secs(10),
        );
        assert!(run.ok, "redis-cli {args:?}: {run}");
        run.stdout
    };
    assert_eq!(cli(&["SET", "user:1", "a"]).trim(), "OK");
    cli(&["SET", "user:2", "b"]);
    cli(&["SET", "other", "c"]);
    let scanned = cli(&["--scan", "--pattern", "user:*"]);
    let mut keys: Vec<&str> = scanned.lines().collect();
    keys.sort();
    assert_eq!(keys, ["user:1", "user:2"]);
    assert!(cli(&["INFO", "zipcache"]).contains("compression_ratio_dram:"));
    // The later additions, as redis-cli prints them.
    assert_eq!(cli(&["KEYS", "user:*"]), "user:1\nuser:2\n");
    assert_eq!(cli(&["GETEX", "user:1", "EX", "100"]).trim(), "a");
    assert_eq!(cli(&["TTL", "user:1"]).trim(), "100");
    assert_eq!(cli(&["INCRBYFLOAT", "price", "2.5"]).trim(), "2.5");
    assert_eq!(cli(&["INCRBYFLOAT", "price", "0.1"]).trim(), "2.6");
    assert_eq!(cli(&["MSETNX", "user:3", "c", "other", "x"]).trim(), "0");
    assert_eq!(cli(&["EXPIREAT", "other", "4102444800"]).trim(), "1");
    assert_eq!(cli(&["EXPIRETIME", "other"]).trim(), "4102444800");
    assert_eq!(cli(&["SETRANGE", "other", "1", "ab"]).trim(), "3");
    assert_eq!(cli(&["GETRANGE", "other", "0", "-1"]).trim(), "cab");
    assert_eq!(cli(&["CLIENT", "SETNAME", "cli"]).trim(), "OK");
    assert!(
        cli(&["GETEX", "user:1", "EX", "0"]).contains("invalid expire time in 'getex' command")
    );
}
