//! A start that fails — a port already in use, a typo in a TLS path — keeps the flash
//! tier: `run` binds its ports and loads its TLS files before it opens the engine, so the
//! next correct start is as warm as the last clean stop left it. Its own test binary,
//! because `run` installs signal handlers for the process.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Client, free_port, hash_hex, wait_for_port};
use zipcache_server::{ServeArgs, run};

/// 20,000 values of ~80 bytes through a 1 MiB DRAM budget: many are on the SSD
/// tier when the server stops (the rest go there at its clean close).
const KEYS: usize = 20_000;

fn value(i: usize) -> String {
    hash_hex(
        (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        String::new(),
        64 + i % 32,
    )
}

fn args(data_dir: &Path, mc_port: u16) -> ServeArgs {
    ServeArgs {
        memcached_port: Some(mc_port.into()),
        resp_port: Some(free_port().into()),
        dram: Some("1MiB".into()),
        ssd_size: Some("64MiB".into()),
        data_dir: Some(data_dir.to_path_buf()),
        threads: Some(2),
        enable_shutdown: true,
        // Writers wait for the flusher rather than drop: the test counts every key.
        set: vec!["flush_wait_ms=60000".into()],
        ..ServeArgs::default()
    }
}

fn serve(args: ServeArgs, port: u16) -> (std::thread::JoinHandle<Result<(), String>>, Client) {
    let server = std::thread::spawn(move || run(args));
    wait_for_port(port, Duration::from_secs(30));
    (server, Client::connect(([127, 0, 0, 1], port).into()))
}

fn stop(server: std::thread::JoinHandle<Result<(), String>>, mut client: Client) {
    client.send(b"shutdown\r\n");
    assert!(client.closed());
    assert_eq!(server.join().expect("run returned"), Ok(()));
}

#[test]
fn failed_starts_between_two_clean_ones_keep_the_flash_tier() {
    let data_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("zipcache-warm-start-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let mc_port = free_port();

    let (server, mut client) = serve(args(&data_dir, mc_port), mc_port);
    fill(&mut client);
    let on_ssd: usize = client.stats(" items")["items:1:number_ssd"]
        .parse()
        .unwrap();
    assert!(
        on_ssd > KEYS / 4,
        "only {on_ssd} of {KEYS} keys reached the SSD tier"
    );
    stop(server, client);

    // The port is taken by someone else.
    let squatter = std::net::TcpListener::bind(("127.0.0.1", mc_port)).expect("squat");
    let error = run(args(&data_dir, mc_port)).expect_err("the port is in use");
    assert!(error.contains("cannot serve"), "{error}");
    drop(squatter);

    // A typo in a TLS path.
    let typo = ServeArgs {
        tls_cert: Some(data_dir.join("no-such-cert.pem")),
        tls_key: Some(data_dir.join("no-such-key.pem")),
        ..args(&data_dir, mc_port)
    };
    let error = run(typo).expect_err("no such certificate");
    assert!(error.contains("TLS"), "{error}");

    let (server, mut client) = serve(args(&data_dir, mc_port), mc_port);
    let missing = missing_keys(&mut client);
    assert!(
        missing.is_empty(),
        "a warm start keeps every key; {} of {KEYS} are gone (first: key:{})",
        missing.len(),
        missing[0]
    );
    stop(server, client);
    let _ = std::fs::remove_dir_all(data_dir);
}

/// Sends `request` on a new connection to `port` and leaves it open, unread.
fn hold(port: u16, request: &str) -> Client {
    let mut client = Client::connect(([127, 0, 0, 1], port).into());
    client.send(request.as_bytes());
    client
}

/// Fills `KEYS` keys through `client`, a batch of 500 at a time.
fn fill(client: &mut Client) {
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(500) {
        let mut batch = String::new();
        for &i in chunk {
            let v = value(i);
            batch.push_str(&format!("set key:{i} 0 0 {}\r\n{v}\r\n", v.len()));
        }
        client.send(batch.as_bytes());
        for &i in chunk {
            assert_eq!(client.line(), "STORED", "key:{i}");
        }
    }
}

/// The keys of `0..KEYS` a server no longer serves; a key served with another value
/// fails the test.
fn missing_keys(client: &mut Client) -> Vec<usize> {
    let mut missing = Vec::new();
    for i in 0..KEYS {
        client.send(format!("get key:{i}\r\n").as_bytes());
        let header = client.line();
        if header == "END" {
            missing.push(i);
            continue;
        }
        let v = value(i);
        assert_eq!(header, format!("VALUE key:{i} 0 {}", v.len()));
        assert_eq!(client.line(), v, "key:{i}");
        assert_eq!(client.line(), "END");
    }
    missing
}

/// Whatever holds the engine when a stop is asked for — a crawl that sleeps between its
/// steps, a `watch`, a cachedump whose client reads nothing, a metrics scrape that never
/// finishes its request, RESP and memcached clients mid-request — the stop closes the
/// engine cleanly within a bounded time, and the next start serves every key.
#[test]
fn holders_of_the_engine_at_a_stop_do_not_cost_the_flash_tier() {
    let data_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("zipcache-holders-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let (mc_port, resp_port, metrics_port) = (free_port(), free_port(), free_port());
    let serve_args = || ServeArgs {
        resp_port: Some(resp_port.into()),
        metrics_port: Some(metrics_port),
        ..args(&data_dir, mc_port)
    };
    let (server, mut client) = serve(serve_args(), mc_port);
    fill(&mut client);

    let _held = [
        hold(
            mc_port,
            "lru_crawler sleep 1000000\r\nlru_crawler crawl all\r\n",
        ),
        hold(mc_port, "watch mutations evictions\r\n"),
        hold(mc_port, "stats cachedump 1 0\r\n"),
        hold(metrics_port, "GET /metr"),
        hold(resp_port, "*2\r\n$3\r\nGET\r\n$5\r\nkey:1"),
        hold(mc_port, "get key:1 key:2"),
    ];
    // Each request above was read and is being served.
    std::thread::sleep(Duration::from_millis(500));
    // Its first thousand checks done, the crawl sleeps a second per thousand.
    assert_eq!(client.stats("")["lru_crawler_running"], "1");
    let stopping = std::time::Instant::now();
    stop(server, client);
    assert!(
        stopping.elapsed() < Duration::from_secs(30),
        "the stop took {:?}",
        stopping.elapsed()
    );

    let (server, mut client) = serve(serve_args(), mc_port);
    let missing = missing_keys(&mut client);
    assert!(
        missing.is_empty(),
        "a stop with holders of the engine keeps every key; {} of {KEYS} are gone",
        missing.len()
    );
    stop(server, client);
    let _ = std::fs::remove_dir_all(data_dir);
}

/// A `flush_all <delay>` acknowledged before a stop, its delay not yet run out: what was
/// stored before it never comes back after the restart (the flush fires at the stop).
#[test]
fn a_delayed_flush_pending_at_a_stop_is_not_undone_by_the_restart() {
    let data_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("zipcache-pending-flush-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let mc_port = free_port();
    let (server, mut client) = serve(args(&data_dir, mc_port), mc_port);
    fill(&mut client);
    assert_eq!(client.ask("flush_all 1000\r\n", 1), ["OK"]);
    stop(server, client);

    let (server, mut client) = serve(args(&data_dir, mc_port), mc_port);
    let missing = missing_keys(&mut client);
    assert_eq!(
        missing.len(),
        KEYS,
        "keys stored before an acknowledged flush_all came back"
    );
    stop(server, client);
    let _ = std::fs::remove_dir_all(data_dir);
}
