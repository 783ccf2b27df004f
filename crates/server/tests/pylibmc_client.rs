//! pylibmc (libmemcached, `binary=True`) against an in-process server
//! (tests/py/pylibmc_client.py): open, and with a SASL login through Cyrus SASL, which
//! picks CRAM-MD5 from the mechanisms the server lists.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, py_script, run_tool};
use zipcache_server::{Credentials, Password, ServerOptions};

/// Whether python3 can import pylibmc; says why the test is skipped otherwise.
fn pylibmc_installed() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import pylibmc"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIPPED: python module pylibmc missing (apt-get install libmemcached-dev, then \
             pip install --no-binary pylibmc pylibmc; scripts/test.sh does)"
        );
    }
    ok
}

fn pylibmc(server: &TestServer, credentials: &[&str]) {
    let run = run_tool(
        Command::new("python3")
            .arg(py_script("pylibmc_client.py"))
            .arg(server.memcached.port().to_string())
            .args(credentials),
        Duration::from_secs(120),
    );
    assert!(
        run.ok && run.stdout.contains("ok"),
        "pylibmc_client.py failed:\n{run}"
    );
}

#[test]
fn pylibmc_binary_round_trips() {
    if pylibmc_installed() {
        pylibmc(&TestServer::start(), &[]);
    }
}

#[test]
fn pylibmc_logs_in_with_sasl() {
    if !pylibmc_installed() {
        return;
    }
    // Each user source on a fresh server (the script's checks assume an empty cache).
    let secured = || {
        let users = Credentials::parse(b"alice@realm:wonderland\n").expect("users");
        TestServer::with_options(ServerOptions {
            requirepass: Password::new("hunter2"),
            users: Some(Arc::new(users)),
            ..TestServer::options()
        })
    };
    pylibmc(&secured(), &["alice@realm", "wonderland", "wrong"]);
    pylibmc(&secured(), &["default", "hunter2", "wonderland"]);
}
