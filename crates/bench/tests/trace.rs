//! `--trace`: small traces generated here, replayed against the in-process engine and a
//! memcached the bench starts, checked through the JSON the bench writes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use zipcache_bench::{BenchArgs, run};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn bench(scratch: &Scratch, args: &[&str]) -> Result<Vec<serde_json::Value>, String> {
    let json = scratch.path("out.json");
    let argv = ["bench", "--json", json.to_str().unwrap()]
        .into_iter()
        .chain(args.iter().copied());
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    run(cli.bench)?;
    let text = std::fs::read_to_string(&json).unwrap();
    std::fs::remove_file(&json).unwrap();
    Ok(serde_json::from_str(&text).unwrap())
}

/// A directory of one test's files, removed when the test ends (tests run in parallel,
/// each in its own).
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let name = format!("zc-trace-test-{}-{test}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn require_memcached() {
    let found = Command::new("memcached").arg("--version").output().is_ok();
    assert!(
        found,
        "memcached is not installed: apt-get install -y memcached"
    );
}

/// A cache2k-style trace: big-endian i32 keys, xz-compressed.
fn write_xz_u32(path: &Path, keys: &[i32]) {
    let bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_be_bytes()).collect();
    let mut encoder = liblzma::write::XzEncoder::new(std::fs::File::create(path).unwrap(), 6);
    encoder.write_all(&bytes).unwrap();
    encoder.finish().unwrap();
}

fn check_clean(result: &serde_json::Value) -> &str {
    let target = result["target"].as_str().unwrap();
    assert_eq!(result["wrong_values"], 0, "{target} returned wrong values");
    assert_eq!(result["errors"], 0, "{target}: {}", result["first_error"]);
    target
}

#[test]
fn a_trace_over_a_small_key_set_hits_and_one_of_new_keys_misses() {
    let scratch = Scratch::new("small");
    require_memcached();
    // 4000 requests over 200 keys (negative ones too, as in cache2k), then 1000 new keys.
    let mut keys: Vec<i32> = (0..4000).map(|i| (i * 7919 % 200) - 100).collect();
    keys.extend(1_000_000..1_001_000);
    let path = scratch.path("small.trace.xz");
    write_xz_u32(&path, &keys);
    let results = bench(
        &scratch,
        &[
            "--target",
            "zipcache,memcached",
            "--trace",
            path.to_str().unwrap(),
            "--trace-format",
            "caffeine-u32",
            "--dram",
            "16MiB",
            "--ssd",
            "none",
            "--backend-latency-us",
            "0",
            "--value-size",
            "100",
        ],
    )
    .unwrap();
    assert_eq!(results.len(), 2);
    for result in &results {
        let target = check_clean(result);
        assert_eq!(result["ops"], 5000, "{target}: the whole trace replayed");
        assert_eq!(result["gets"], 5000, "{target}");
        assert_eq!(result["trace"]["requests"], 5000);
        assert_eq!(result["trace"]["unique_keys"], 1200);
        assert_eq!(result["trace"]["format"], "caffeine-u32");
        // 1200 compulsory misses of 5000; concurrent clients may miss a key twice while its
        // fill is on its way.
        let hit_ratio = result["hit_ratio"].as_f64().unwrap();
        assert!(
            (0.70..=0.76).contains(&hit_ratio),
            "{target}: hit ratio {hit_ratio}"
        );
        // Each key missed is filled, except those whose fill was still waiting for the
        // backend when the trace ended (at most one per client: 2 threads x 64).
        let resident = result["objects_resident"].as_u64().unwrap();
        assert!(
            (1200 - 128..=1200).contains(&resident),
            "{target}: {resident}"
        );
    }

    // --trace-limit and --warmup-ops: the first 1000 requests warm, 2000 are measured.
    let results = bench(
        &scratch,
        &[
            "--target",
            "zipcache",
            "--trace",
            path.to_str().unwrap(),
            "--trace-format",
            "caffeine-u32",
            "--trace-limit",
            "3000",
            "--warmup-ops",
            "1000",
            "--dram",
            "16MiB",
            "--ssd",
            "none",
            "--backend-latency-us",
            "0",
            "--threads",
            "1",
        ],
    )
    .unwrap();
    let result = &results[0];
    check_clean(result);
    assert_eq!(result["ops"], 2000);
    assert_eq!(result["trace"]["requests"], 3000);
    // Every key was seen in the warm-up: one client, in order, so every GET hits.
    assert_eq!(result["hit_ratio"].as_f64().unwrap(), 1.0);
}

#[test]
fn twitter_trace_sets_are_stored_with_their_sizes_and_then_hit() {
    let scratch = Scratch::new("twitter");
    require_memcached();
    let mut text = String::new();
    // 100 keys set with 500-byte values, then 2000 GETs of them, then 900 GETs of keys never
    // set (misses), plus an incr the bench does not replay.
    for i in 0..100 {
        text += &format!("{i},app:user:{i},12,500,3,set,3600\n");
    }
    for i in 0..2000 {
        text += &format!("{},app:user:{},12,500,3,get,0\n", 100 + i, i % 100);
    }
    text += "2100,app:count,9,0,3,incr,0\n";
    for i in 0..900 {
        text += &format!("{},app:cold:{i},12,0,3,get,0\n", 2101 + i);
    }
    let path = scratch.path("twitter.csv");
    std::fs::write(&path, text).unwrap();
    let results = bench(
        &scratch,
        &[
            "--target",
            "zipcache,memcached",
            "--trace",
            path.to_str().unwrap(),
            "--trace-format",
            "twitter",
            "--dram",
            "16MiB",
            "--ssd",
            "none",
            "--backend-latency-us",
            "0",
            "--value-size",
            "8",
        ],
    )
    .unwrap();
    for result in &results {
        let target = check_clean(result);
        assert_eq!(result["ops"], 3000, "{target}");
        assert_eq!(result["gets"], 2900, "{target}");
        assert_eq!(result["trace"]["sets"], 100);
        assert_eq!(result["trace"]["skipped"], 1);
        let hit_ratio = result["hit_ratio"].as_f64().unwrap();
        assert!(
            (0.62..=2000.0 / 2900.0 + 1e-9).contains(&hit_ratio),
            "{target}: hit ratio {hit_ratio}"
        );
    }
    // memcached's `bytes` counts the 500-byte values the trace gave the hot keys (the cold
    // ones, which it gives no size, take --value-size 8): ~80 B per item if every value
    // were 8 bytes, ~130 kB with the hot ones at 500.
    let bytes = results[1]["dram_bytes_used"].as_u64().unwrap();
    assert!(bytes > 105_000, "memcached holds {bytes} bytes");
}

#[test]
fn bad_traces_and_flags_are_errors_not_panics() {
    let scratch = Scratch::new("bad");
    let path = scratch.path("bad.csv");
    std::fs::write(&path, "1,GET,0,1,4\n2,FETCH,0,1,4\n").unwrap();
    let err = bench(
        &scratch,
        &[
            "--trace",
            path.to_str().unwrap(),
            "--trace-format",
            "cachelib-kvcache",
        ],
    )
    .unwrap_err();
    assert!(err.contains("line 2: unknown op \"FETCH\""), "{err}");
    std::fs::write(&path, "1,GET,0,1,4\n").unwrap();
    let err = bench(
        &scratch,
        &[
            "--trace",
            path.to_str().unwrap(),
            "--trace-format",
            "cachelib-kvcache",
            "--mode",
            "fill",
        ],
    )
    .unwrap_err();
    assert!(err.contains("--mode fill does not apply"), "{err}");
    let err = bench(&scratch, &["--trace", path.to_str().unwrap()]).unwrap_err();
    assert!(err.contains("--trace-format"), "{err}");
    let err = bench(
        &scratch,
        &[
            "--trace",
            "/nonexistent/trace.xz",
            "--trace-format",
            "caffeine-u32",
        ],
    )
    .unwrap_err();
    assert!(err.contains("/nonexistent/trace.xz"), "{err}");
}
