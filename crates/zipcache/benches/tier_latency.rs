//! GET latency by the tier that answers: DRAM-tier hits against SSD-tier hits, on a real
//! file opened with O_DIRECT behind the emulated compressing SSD (issue 3: "GET latency
//! p50 / p99 for DRAM-tier and SSD-tier hits").
//!
//! `cargo bench -p zipcache --bench tier_latency` (`-- --keys N` to change the size,
//! `-- --device-compression MODE` for another mode than `emulate`, `-- --gets N` for another
//! number of GETs than half the keys: each GET reads `stats()` twice, which walks DRAM).
//! One thread, so each GET is classified exactly by which hit counter moved.

use std::time::Instant;

use zipcache::config::DeviceCompression;
use zipcache::{Config, SsdConfig, ZipCache};

const VALUE: usize = 64;

fn value(id: u64) -> Vec<u8> {
    // η = 0.5: 32 bytes that do not compress, 32 zeros.
    let mut v = vec![0u8; VALUE];
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in &mut v[..VALUE / 2] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    v
}

fn percentiles(name: &str, mut ns: Vec<u64>) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    println!(
        "{name:<14} {:>8} {:>9.2} {:>9.2} {:>9.2}",
        ns.len(),
        at(0.5),
        at(0.99),
        at(0.999)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let keys: u64 = args
        .iter()
        .position(|a| a == "--keys")
        .and_then(|i| args.get(i + 1))
        .map_or(1_000_000, |n| n.parse().expect("--keys N"));
    let gets: u64 = args
        .iter()
        .position(|a| a == "--gets")
        .and_then(|i| args.get(i + 1))
        .map_or(keys / 2, |n| n.parse().expect("--gets N"));
    let mode = args
        .iter()
        .position(|a| a == "--device-compression")
        .and_then(|i| args.get(i + 1))
        .map_or("emulate", String::as_str);
    let dir = std::env::temp_dir().join(format!("zipcache-tier-latency-{}", std::process::id()));
    let mut config = Config {
        dram_capacity: 16 << 20,
        ssd: Some(SsdConfig {
            path: dir.join("ssd"),
            size: 1 << 30,
            direct_io: true,
            device_compression: DeviceCompression::Emulate,
            logical_to_physical: 4.0,
        }),
        ..Config::default()
    };
    config
        .set("device_compression", mode)
        .expect("--device-compression host|none|emulate|hardware");
    let cache = ZipCache::open(config).expect("open");
    let key = |id: u64| format!("{:016}", id.wrapping_mul(2_654_435_761) % keys);
    for id in 0..keys {
        cache
            .put(key(id).as_bytes(), &value(id), None)
            .expect("put");
    }
    cache.settle().expect("settle");
    let (mut dram, mut ssd, mut miss) = (Vec::new(), Vec::new(), 0u64);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..gets {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = key(x % keys);
        let before = cache.stats();
        let start = Instant::now();
        let found = cache.get(k.as_bytes()).expect("get");
        let ns = start.elapsed().as_nanos() as u64;
        let after = cache.stats();
        match found {
            _ if after.dram_hits > before.dram_hits => dram.push(ns),
            _ if after.ssd_hits > before.ssd_hits => ssd.push(ns),
            _ => miss += 1,
        }
    }
    println!(
        "{keys} keys of 16 + {VALUE} B, 16 MiB DRAM, 1 GiB O_DIRECT file, device_compression \
         {mode}; {miss} misses"
    );
    println!(
        "{:<14} {:>8} {:>9} {:>9} {:>9}",
        "GET answered", "count", "p50 µs", "p99 µs", "p99.9 µs"
    );
    percentiles("DRAM tier", dram);
    percentiles("SSD tier", ssd);
    cache.close().expect("close");
    let _ = std::fs::remove_dir_all(&dir);
}
