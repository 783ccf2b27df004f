//! `run` — what `zipcache serve` executes — end to end: flags, serving, and a clean
//! shutdown on SIGTERM. Its own test binary, because the signal goes to this process.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Client, free_port, wait_for_port};
use zipcache_server::{ServeArgs, run};

#[test]
fn sigterm_stops_serve_cleanly() {
    let data_dir = std::env::temp_dir().join(format!("zipcache-serve-{}", std::process::id()));
    let (mc_port, resp_port) = (free_port(), free_port());
    let args = ServeArgs {
        memcached_port: Some(mc_port.into()),
        resp_port: Some(resp_port.into()),
        dram: Some("32MiB".into()),
        ssd: Some("none".into()),
        data_dir: Some(data_dir.clone()),
        threads: Some(2),
        ..ServeArgs::default()
    };
    let server = std::thread::spawn(move || run(args));
    wait_for_port(mc_port, Duration::from_secs(10));
    wait_for_port(resp_port, Duration::from_secs(10));
    let mut client = Client::connect(([127, 0, 0, 1], mc_port).into());
    assert_eq!(client.ask("set k 0 0 1\r\nv\r\n", 1), ["STORED"]);
    let mut resp = Client::connect(([127, 0, 0, 1], resp_port).into());
    assert_eq!(resp.ask("GET k\r\n", 2), ["$1", "v"]);

    let pid = std::process::id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let result = server.join().expect("run returned");
    assert_eq!(result, Ok(()));
    assert!(client.closed(), "connections are closed at shutdown");
    assert!(data_dir.is_dir(), "the data directory was created");
    let _ = std::fs::remove_dir_all(data_dir);
}

#[test]
fn bad_settings_are_reported_not_panicked() {
    let args = ServeArgs {
        set: vec!["no_such_setting=1".into()],
        ..ServeArgs::default()
    };
    let error = run(args).expect_err("unknown setting");
    assert!(error.contains("no_such_setting"), "{error}");
}

#[test]
fn a_second_engine_on_the_same_data_dir_is_refused_naming_the_holder() {
    let data_dir = std::env::temp_dir().join(format!("zipcache-locked-{}", std::process::id()));
    std::fs::create_dir_all(&data_dir).unwrap();
    let holder = zipcache::ZipCache::open(zipcache::Config {
        dram_capacity: 4 << 20,
        ssd: Some(zipcache::SsdConfig {
            path: data_dir.join("ssd.bin"),
            size: 16 << 20,
            direct_io: false,
            device_compression: zipcache::config::DeviceCompression::Emulate,
            logical_to_physical: 4.0,
        }),
        ..zipcache::Config::default()
    })
    .unwrap();
    let args = ServeArgs {
        memcached_port: Some(free_port().into()),
        resp_port: Some(free_port().into()),
        dram: Some("4MiB".into()),
        ssd_size: Some("16MiB".into()),
        data_dir: Some(data_dir.clone()),
        ..ServeArgs::default()
    };
    let error = run(args).expect_err("the data dir is taken");
    let pid = std::process::id().to_string();
    assert!(
        error.contains("locked") && error.contains(&pid),
        "names the lock and its holder: {error}"
    );
    holder.close().unwrap();
    let _ = std::fs::remove_dir_all(data_dir);
}
