//! SIGHUP reloads what memcached reloads on it: the auth file (and the TLS certificates,
//! whose reload `access.rs` checks through `refresh_certs`). Its own test binary, because
//! the signals go to this process.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Client, free_port, wait_for_port};
use zipcache_server::{ServeArgs, run};

fn signal(name: &str) {
    let pid = std::process::id().to_string();
    let status = Command::new("kill")
        .args([name, &pid])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// memcached's ascii authentication: a `set` whose data is `user password`.
fn authenticate(port: u16, user: &str, password: &str) -> (Client, String) {
    let mut client = Client::connect(([127, 0, 0, 1], port).into());
    let token = format!("{user} {password}");
    let reply = client.ask(&format!("set a 0 0 {}\r\n{token}\r\n", token.len()), 1);
    (client, reply[0].clone())
}

/// What authenticating as `user` gets once the reload has happened (it runs on the
/// signal thread, so the test waits for it).
fn eventually(port: u16, user: &str, password: &str, wanted: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, reply) = authenticate(port, user, password);
        if reply == wanted || Instant::now() > deadline {
            assert_eq!(reply, wanted, "{user}");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_reloads_the_auth_file_and_keeps_it_if_the_new_one_is_bad() {
    let dir = std::env::temp_dir().join(format!("zipcache-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let auth_file = dir.join("users");
    std::fs::write(&auth_file, "alice:one\n").unwrap();
    let (mc_port, resp_port) = (free_port(), free_port());
    let args = ServeArgs {
        memcached_port: Some(mc_port.into()),
        resp_port: Some(resp_port.into()),
        dram: Some("16MiB".into()),
        ssd: Some("none".into()),
        data_dir: Some(dir.join("data")),
        threads: Some(1),
        auth_file: Some(auth_file.clone()),
        ..ServeArgs::default()
    };
    let server = std::thread::spawn(move || run(args));
    wait_for_port(mc_port, Duration::from_secs(10));
    let (mut alice, reply) = authenticate(mc_port, "alice", "one");
    assert_eq!(reply, "STORED");

    std::fs::write(&auth_file, "bob:two\n").unwrap();
    signal("-HUP");
    eventually(mc_port, "bob", "two", "STORED");
    eventually(
        mc_port,
        "alice",
        "one",
        "CLIENT_ERROR authentication failure",
    );
    assert_eq!(
        alice.ask("get a\r\n", 1),
        ["END"],
        "a connection authenticated before the reload stays so"
    );

    std::fs::write(&auth_file, "no colon on this line\n").unwrap();
    signal("-HUP");
    // The reload has failed once a new attempt is answered after it; bob still gets in.
    std::thread::sleep(Duration::from_millis(200));
    eventually(mc_port, "bob", "two", "STORED");

    signal("-TERM");
    assert_eq!(server.join().expect("run returned"), Ok(()));
    let _ = std::fs::remove_dir_all(dir);
}
