//! memcached's `shutdown` command through `run` (what `zipcache serve` executes). Its own
//! test binary: `serve_command`'s SIGTERM goes to its whole process, and would stop the
//! servers here too.

mod common;

use std::time::Duration;

use common::{Client, free_port, wait_for_port};
use zipcache_server::{ServeArgs, run};

/// `shutdown` (with `--enable-shutdown`) stops `serve` as SIGTERM does: the engine is
/// closed cleanly, so a server started again on the same data directory restarts warm.
#[test]
fn the_shutdown_command_stops_serve_cleanly() {
    let data_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("zipcache-shutdown-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let serve = |data_dir: &std::path::Path| {
        let mc_port = free_port();
        let args = ServeArgs {
            memcached_port: Some(mc_port.into()),
            resp_port: Some(free_port().into()),
            dram: Some("8MiB".into()),
            ssd_size: Some("64MiB".into()),
            data_dir: Some(data_dir.to_path_buf()),
            threads: Some(2),
            enable_shutdown: true,
            ..ServeArgs::default()
        };
        let server = std::thread::spawn(move || run(args));
        wait_for_port(mc_port, Duration::from_secs(10));
        (server, Client::connect(([127, 0, 0, 1], mc_port).into()))
    };

    let (server, mut client) = serve(&data_dir);
    assert_eq!(client.ask("set k 0 0 5\r\nwarm!\r\n", 1), ["STORED"]);
    assert_eq!(
        client.ask("shutdown later\r\n", 1),
        ["CLIENT_ERROR invalid shutdown mode"]
    );
    let mut other = Client::connect(client.peer());
    // Served before the shutdown: a connection still in the kernel's accept queue when
    // the listener closes gets a reset instead, and could not show a clean close.
    assert_eq!(other.ask("mn\r\n", 1), ["MN"]);
    client.send(b"shutdown\r\n");
    assert!(client.closed(), "the asking connection is closed");
    assert_eq!(server.join().expect("run returned"), Ok(()));
    assert!(other.closed(), "every connection is closed at shutdown");

    let (server, mut client) = serve(&data_dir);
    assert_eq!(
        client.ask("get k\r\n", 3),
        ["VALUE k 0 5", "warm!", "END"],
        "the engine was closed cleanly: a warm restart"
    );
    client.send(b"shutdown graceful\r\n");
    assert_eq!(server.join().expect("run returned"), Ok(()));
    let _ = std::fs::remove_dir_all(data_dir);
}
