//! Short runs against a real memcached (started and stopped by the bench) and the
//! in-process zipcache engine, checked through the JSON the bench writes.

use std::process::Command;

use clap::Parser;
use zipcache_bench::report::REQUIRED_FIELDS;
use zipcache_bench::{BenchArgs, run};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn bench(args: &[&str]) -> Vec<serde_json::Value> {
    let json = std::env::temp_dir().join(format!(
        "zc-bench-test-{}-{}.json",
        std::process::id(),
        args.join("").len()
    ));
    let argv = ["bench", "--json", json.to_str().unwrap()]
        .into_iter()
        .chain(args.iter().copied());
    let cli = Cli::try_parse_from(argv).expect("flags parse");
    run(cli.bench).expect("bench run");
    let text = std::fs::read_to_string(&json).unwrap();
    std::fs::remove_file(&json).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Fails (rather than skips) when a peer is missing, naming the Debian package to install.
fn require(program: &str, package: &str) {
    let found = Command::new(program).arg("--version").output().is_ok();
    assert!(
        found,
        "{program} is not installed: apt-get install -y {package} (Debian package `{package}`)"
    );
}

fn check_schema(result: &serde_json::Value) {
    let object = result.as_object().expect("each result is an object");
    for field in REQUIRED_FIELDS {
        assert!(
            object.contains_key(*field),
            "missing field {field}: {result}"
        );
    }
    let latency = &result["get_latency_us"];
    for p in ["p50", "p90", "p99", "p999"] {
        assert!(latency.get(p).is_some(), "get_latency_us.{p} missing");
    }
    assert!(result["workload"]["keys"].is_u64() || result["workload"]["keys"].is_null());
}

#[test]
fn lookaside_against_memcached_redis_and_zipcache() {
    require("memcached", "memcached");
    require("redis-server", "redis-server");
    let results = bench(&[
        "--target",
        "memcached,redis,zipcache",
        "--keys",
        "20000",
        "--dram",
        "16MiB",
        "--ssd",
        "none",
        "--ops",
        "60000",
        "--warmup-ops",
        "40000",
        "--locality",
        "strong",
        "--put-ratio",
        "0.05",
        "--delete-ratio",
        "0.01",
        "--backend-latency-us",
        "50",
    ]);
    assert_eq!(results.len(), 3);
    for result in &results {
        check_schema(result);
        let target = result["target"].as_str().unwrap();
        assert_eq!(result["wrong_values"], 0, "{target} returned wrong values");
        assert_eq!(result["errors"], 0, "{target}: {}", result["first_error"]);
        let hit_ratio = result["hit_ratio"].as_f64().unwrap();
        assert!(hit_ratio > 0.5, "{target}: hit ratio {hit_ratio}");
        assert!(result["throughput_ops"].as_f64().unwrap() > 0.0);
        assert!(result["get_latency_us"]["p50"].as_f64().unwrap() > 0.0);
    }
    assert!(
        results[0]["rss_bytes"].as_u64().unwrap() > 0,
        "memcached RSS"
    );
}

#[test]
fn fill_reports_resident_objects() {
    require("memcached", "memcached");
    let results = bench(&[
        "--target",
        "memcached,zipcache,segcache",
        "--mode",
        "fill",
        "--keys",
        "30000",
        "--dram",
        "64MiB",
        "--ssd",
        "none",
        "--eta",
        "0.5",
        "--read-back",
    ]);
    for result in &results {
        check_schema(result);
        let target = result["target"].as_str().unwrap();
        assert_eq!(result["errors"], 0, "{target}: {}", result["first_error"]);
        // Every key read back, found and verified; the same bytes stored everywhere.
        let read_back = &result["read_back"];
        assert_eq!(read_back["gets"], 30000, "{target}: {read_back}");
        assert_eq!(read_back["found"], 30000, "{target}: {read_back}");
        assert_eq!(result["wrong_values"], 0, "{target}");
        assert_eq!(result["put_bytes"], results[0]["put_bytes"], "{target}");
        assert!(result["put_bytes"].as_u64().unwrap() > 30000 * 16);
        assert!(
            result["flash_bytes_per_put_byte"].is_null(),
            "{target}: no flash"
        );
        // The server's CPU is known for memcached, which the bench started: per SET of
        // the fill and per GET of the read-back (in 10 ms ticks, which a fast machine
        // may not reach in 30,000 requests: known, not necessarily above 0).
        for figure in ["server_cpu_us_per_set", "server_cpu_us_per_get"] {
            let known = result[figure].as_f64().is_some_and(|us| us >= 0.0);
            assert_eq!(known, target == "memcached", "{target}: {figure}");
        }
        // Everything fits: every key is resident. The engine's `objects_resident` is kept
        // by concurrent writers and may trail by a few under a 2-thread fill (every key is
        // still found by GET), so zipcache's count gets 0.1% slack.
        let resident = result["objects_resident"].as_u64().unwrap();
        let slack = if target == "zipcache" { 30 } else { 0 };
        assert!(
            (30000 - slack..=30000).contains(&resident),
            "{target}: {resident} resident"
        );
    }
}

#[test]
fn real_dataset_values_verify() {
    let results = bench(&[
        "--target",
        "zipcache",
        "--keys",
        "2000",
        "--dram",
        "8MiB",
        "--ssd",
        "none",
        "--ops",
        "5000",
        "--values",
        "airports",
        "--value-size",
        "200",
        "--backend-latency-us",
        "0",
    ]);
    assert_eq!(results[0]["wrong_values"], 0);
    assert!(results[0]["hits"].as_u64().unwrap() > 0);
}

/// JSON documents of many schemas (botocore's, which `scripts/test.sh` installs) through
/// both tiers: more than 8 MiB of DRAM holds, so some go to flash, each read back and
/// compared byte for byte.
#[test]
fn mixed_json_documents_round_trip_through_dram_and_flash() {
    // A directory of its own: the tests of this binary share one process, and so the
    // bench's default directory, which another test's in-process engine may be using.
    let dir = std::env::temp_dir().join(format!("zc-bench-mixed-{}", std::process::id()));
    let results = bench(&[
        "--data-dir",
        dir.to_str().unwrap(),
        "--target",
        "zipcache",
        "--mode",
        "fill",
        "--keys",
        "60000",
        "--dram",
        "8MiB",
        "--ssd-size",
        "64MiB",
        "--values",
        "json-mixed",
        "--read-back",
    ]);
    let result = &results[0];
    check_schema(result);
    assert_eq!(result["errors"], 0, "{}", result["first_error"]);
    assert_eq!(result["wrong_values"], 0);
    let read_back = &result["read_back"];
    assert_eq!(read_back["wrong_values"], 0, "{read_back}");
    assert!(
        read_back["found"].as_u64().unwrap() > 40_000,
        "most documents kept: {read_back}"
    );
    assert!(
        result["ssd_objects"].as_u64().unwrap() > 0,
        "some on flash: {result}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn open_loop_reports_server_cpu_and_runs_memcached_ext_with_and_without_page_cache() {
    require("memcached", "memcached");
    require("redis-server", "redis-server");
    let results = bench(&[
        "--target",
        "memcached,redis,memcached-ext",
        "--drop-peer-page-cache",
        "--rate",
        "20000",
        "--keys",
        "20000",
        "--dram",
        "16MiB",
        "--ssd-size",
        "64MiB",
        "--ops",
        "20000",
        "--warmup-ops",
        "20000",
        "--backend-latency-us",
        "50",
    ]);
    let targets: Vec<&str> = results
        .iter()
        .map(|r| r["target"].as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        [
            "memcached",
            "redis",
            "memcached-ext",
            "memcached-ext-nocache"
        ]
    );
    for result in &results {
        check_schema(result);
        let target = result["target"].as_str().unwrap();
        assert_eq!(result["wrong_values"], 0, "{target} returned wrong values");
        assert_eq!(result["errors"], 0, "{target}: {}", result["first_error"]);
        assert_eq!(result["ops"], 20000, "{target}: every arrival was sent");
        assert_eq!(result["workload"]["rate"], 20000.0);
        assert!(result["get_latency_us"]["p99"].as_f64().unwrap() > 0.0);
        // 20,000 requests in small batches cost a server tens of clock ticks (10 ms).
        let cpu = result["server_cpu_s_per_mop"].as_f64().unwrap();
        assert!(cpu > 0.0, "{target}: server CPU {cpu}");
    }
}

#[test]
fn a_page_cache_dropped_run_is_only_beside_the_cached_one() {
    let cli = Cli::try_parse_from(["bench", "--target", "memcached-ext-nocache"]).unwrap();
    let err = run(cli.bench).unwrap_err();
    assert!(err.contains("--drop-peer-page-cache"), "{err}");
}

#[test]
fn rate_is_refused_where_it_does_not_apply() {
    for (args, expected) in [
        (&["--rate", "0"][..], "--rate must be a positive"),
        (&["--rate", "1000", "--mode", "fill"][..], "--mode fill"),
    ] {
        let argv = ["bench", "--target", "zipcache"]
            .into_iter()
            .chain(args.iter().copied());
        let err = run(Cli::try_parse_from(argv).unwrap().bench).unwrap_err();
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}
