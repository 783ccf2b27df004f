//! `--cluster-mode emulated`: cluster-aware clients read the slot map from one node that
//! owns every slot and route every key to it — redis-py's `RedisCluster`
//! (tests/py/cluster_clients.py) and `redis-cli -c`, with its `--cluster check`. Reply
//! shapes are compared with a real Redis Cluster node in `differential.rs`.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{TestServer, py_script, require_python_modules, require_tool, run_tool};
use zipcache_server::{ClusterMode, ServerOptions};

fn emulated() -> TestServer {
    TestServer::with_options(ServerOptions {
        cluster_mode: ClusterMode::Emulated,
        ..TestServer::options()
    })
}

#[test]
fn redis_py_cluster_client_routes_every_key() {
    require_python_modules(&[("redis", "redis")]);
    let server = emulated();
    let run = run_tool(
        Command::new("python3")
            .arg(py_script("cluster_clients.py"))
            .arg(server.resp.port().to_string()),
        Duration::from_secs(120),
    );
    assert!(
        run.ok && run.stdout.contains("ok"),
        "cluster_clients.py failed:\n{run}"
    );
}

#[test]
fn redis_cli_follows_the_cluster_and_finds_every_slot_covered() {
    let tool = require_tool("redis-cli", "redis-tools");
    let server = emulated();
    let port = server.resp.port().to_string();
    let cli = |args: &[&str]| {
        let run = run_tool(
            Command::new(&tool)
                .args(["-c", "-h", "127.0.0.1", "-p", &port])
                .args(args),
            Duration::from_secs(30),
        );
        assert!(run.ok, "redis-cli {args:?}: {run}");
        run.stdout
    };
    for i in 0..50 {
        assert_eq!(
            cli(&["set", &format!("k{i}"), &format!("v{i}")]).trim(),
            "OK"
        );
    }
    for i in 0..50 {
        assert_eq!(cli(&["get", &format!("k{i}")]).trim(), format!("v{i}"));
    }
    let check = cli(&["--cluster", "check", &format!("127.0.0.1:{port}")]);
    assert!(check.contains("All 16384 slots covered"), "{check}");
    let info = cli(&["--cluster", "info", &format!("127.0.0.1:{port}")]);
    assert!(info.contains("50 keys | 16384 slots"), "{info}");
}

/// Without `--cluster-mode`, the cluster commands answer as a plain Redis does, and a
/// cluster client cannot mistake the server for a cluster.
#[test]
fn a_plain_server_says_cluster_support_is_disabled() {
    let tool = require_tool("redis-cli", "redis-tools");
    let server = TestServer::start();
    let run = run_tool(
        Command::new(&tool).args(["-p", &server.resp.port().to_string(), "cluster", "slots"]),
        Duration::from_secs(30),
    );
    assert!(run.stdout.contains("cluster support disabled"), "{run}");
}

/// A node restarted on its data directory is the same node: `CLUSTER MYID` answers the
/// id kept there.
#[test]
fn a_restarted_node_keeps_its_id() {
    let dir = std::env::temp_dir().join(format!("zipcache-cluster-id-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let myid = || {
        let server = TestServer::with_options(ServerOptions {
            cluster_mode: ClusterMode::Emulated,
            data_dir: Some(dir.clone()),
            ..TestServer::options()
        });
        let mut client = common::Client::connect(server.resp);
        client.send(b"CLUSTER MYID\r\n");
        let _length = client.line();
        let id = client.line();
        server.stop();
        id
    };
    let first = myid();
    assert_eq!(first.len(), 40, "{first:?}");
    assert_eq!(myid(), first);
    std::fs::remove_dir_all(&dir).unwrap();
}
