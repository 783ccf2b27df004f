//! Binary-protocol clients against an in-process server: memjs (node; binary only), open
//! and with SASL PLAIN against `--requirepass` and `--auth-file` users.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, require_tool, run_tool};
use zipcache_server::{Credentials, Password, ServerOptions};

/// Where `npm install -g memjs` (the test script) put memjs, checked to be there.
fn node_path() -> String {
    require_tool("node", "nodejs");
    require_tool("npm", "npm");
    let (ok, root) = run_tool(
        Command::new("npm").args(["root", "-g"]),
        Duration::from_secs(60),
    );
    assert!(ok, "npm root -g failed: {root}");
    let root = root.trim().to_string();
    assert!(
        Path::new(&root).join("memjs").is_dir(),
        "memjs is not installed: npm install -g memjs (the project's test script does)"
    );
    root
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/memjs_client.js")
}

fn memjs(server: &TestServer, credentials: &[&str]) {
    let (ok, output) = run_tool(
        Command::new("node")
            .env("NODE_PATH", node_path())
            .arg(script())
            .arg(server.memcached.port().to_string())
            .args(credentials),
        Duration::from_secs(120),
    );
    assert!(
        ok && output.contains("ok"),
        "memjs_client.js failed:\n{output}"
    );
}

#[test]
fn memjs_round_trips() {
    let server = TestServer::start();
    memjs(&server, &[]);
}

#[test]
fn memjs_logs_in_with_sasl_plain() {
    // Both sources of users, each login on a fresh server (the script's writes assume
    // an empty cache).
    let secured = || {
        let users = Credentials::parse(b"alice:wonderland\n").expect("users");
        TestServer::with_options(ServerOptions {
            requirepass: Password::new("hunter2"),
            users: Some(Arc::new(users)),
            ..TestServer::options()
        })
    };
    memjs(&secured(), &["alice", "wonderland", "wrong"]);
    memjs(&secured(), &["default", "hunter2", "wonderland"]);
}
