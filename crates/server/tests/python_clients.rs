//! pymemcache and redis-py against an in-process server (tests/py/clients.py).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{TestServer, py_script, require_python_modules, run_tool};

#[test]
fn pymemcache_and_redis_py_round_trip() {
    require_python_modules(&[("pymemcache", "pymemcache"), ("redis", "redis")]);
    let server = TestServer::start();
    let run = run_tool(
        Command::new("python3").arg(py_script("clients.py")).args([
            server.memcached.port().to_string(),
            server.resp.port().to_string(),
        ]),
        Duration::from_secs(120),
    );
    assert!(
        run.ok && run.stdout.contains("ok"),
        "clients.py failed:\n{run}"
    );
}
