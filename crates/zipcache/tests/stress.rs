//! Concurrency stress: several threads writing, reading, deleting and scanning while
//! leaves split, merge in the background and get evicted. Every value names the key it
//! was written for, so any value served for the wrong key, or torn, is caught.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use std::sync::Arc;

use zipcache::config::Promotion;
use zipcache::{Config, ZipCache};
use zipcache_device::{BlockDevice, CompressingDevice, EmulatorOptions, MemDevice};

fn value_for(key: &[u8], writer: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len.max(24));
    v.extend_from_slice(&xxhash(key).to_le_bytes());
    v.extend_from_slice(&writer.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend(records(seq, len.saturating_sub(24)));
    v
}

/// `len` bytes of JSON records numbered from `seq`: text of one schema, which trained
/// dictionaries compress.
fn records(seq: u64, len: usize) -> Vec<u8> {
    const CITIES: [&str; 4] = ["Oslo", "Lima", "Perth", "Accra"];
    let mut text = String::with_capacity(len + 96);
    let mut n = seq;
    while text.len() < len {
        text += &format!(
            r#"{{"id":{n},"name":"user{}","city":"{}","active":{}}},"#,
            n % 997,
            CITIES[n as usize % 4],
            n.is_multiple_of(2)
        );
        n += 7;
    }
    text.truncate(len);
    text.into_bytes()
}

fn xxhash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

fn check(key: &[u8], value: &[u8]) -> (u64, u64) {
    assert!(value.len() >= 24, "torn value for {key:?}");
    assert_eq!(
        &value[..8],
        &xxhash(key).to_le_bytes(),
        "value of another key served for {key:?}"
    );
    let writer = u64::from_le_bytes(value[8..16].try_into().unwrap());
    let seq = u64::from_le_bytes(value[16..24].try_into().unwrap());
    assert!(
        value[24..] == records(seq, value.len() - 24),
        "corrupt value for {key:?}"
    );
    (writer, seq)
}

/// The SSD tier of a hybrid run: `blocks` 4 KiB blocks behind the emulated compressing
/// SSD, and which SSD hits go back into DRAM.
struct Ssd {
    blocks: u64,
    promotion: Promotion,
}

/// Dictionaries of 2 KiB trained on 16 values (0: as the budget chooses, none at the
/// small budgets here): several are trained, swapped in and retired while the threads
/// run.
fn stress(
    dram: u64,
    threads: u64,
    run_for: Duration,
    ssd: Option<Ssd>,
    small_dictionaries: bool,
) -> zipcache::Stats {
    let config = Config {
        dram_capacity: dram,
        bypass_r: 1.0,
        superleaf_size: 16 << 10,
        promotion: ssd.as_ref().map_or(Promotion::EveryHit, |s| s.promotion),
        dictionary_size: if small_dictionaries { 2 << 10 } else { 0 },
        dictionary_samples: if small_dictionaries { 16 } else { 0 },
        ..Config::default()
    };
    let device = ssd.map(|s| {
        let device = CompressingDevice::new(MemDevice::new(s.blocks), EmulatorOptions::default());
        Arc::new(device.unwrap()) as Arc<dyn BlockDevice>
    });
    let cache = ZipCache::open_on(config, device).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..threads {
            let cache = &cache;
            let stop = &stop;
            s.spawn(move || {
                let mut rng = t.wrapping_mul(0x9e3779b97f4a7c15) | 1;
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                // Own keys: only this thread writes them, so it knows the newest sequence.
                let mut last_seq = vec![0u64; 2000];
                let mut seq = 0;
                while !stop.load(Ordering::Relaxed) {
                    let r = next();
                    let own = (r >> 8) % 2000;
                    let own_key = format!("{t:02}-own-{own:08}");
                    let shared_key = format!("shared-{:08}", (r >> 20) % 3000);
                    match r % 10 {
                        0..=3 => {
                            seq += 1;
                            let len = [8usize, 40, 100, 300, 3000][(r >> 40) as usize % 5];
                            cache
                                .put(
                                    own_key.as_bytes(),
                                    &value_for(own_key.as_bytes(), t, seq, len),
                                    None,
                                )
                                .unwrap();
                            last_seq[own as usize] = seq;
                        }
                        4 => {
                            cache.delete(own_key.as_bytes()).unwrap();
                            last_seq[own as usize] = 0;
                        }
                        5..=7 => {
                            if let Some(v) = cache.get(own_key.as_bytes()).unwrap() {
                                let (writer, got) = check(own_key.as_bytes(), &v);
                                assert_eq!(writer, t);
                                assert_eq!(
                                    got, last_seq[own as usize],
                                    "stale or deleted value for {own_key}"
                                );
                            }
                        }
                        8 => {
                            seq += 1;
                            cache
                                .put(
                                    shared_key.as_bytes(),
                                    &value_for(shared_key.as_bytes(), t, seq, 60),
                                    None,
                                )
                                .unwrap();
                            if let Some(v) = cache.get(shared_key.as_bytes()).unwrap() {
                                check(shared_key.as_bytes(), &v);
                            }
                        }
                        _ => {
                            let start = format!("{t:02}-own-{own:08}");
                            let got = cache
                                .scan(start.as_bytes()..format!("{t:02}-own-99").as_bytes(), 20)
                                .unwrap();
                            for (k, item) in &got {
                                let (writer, seq_got) = check(k, &item.value);
                                assert_eq!(writer, t);
                                let idx: usize =
                                    std::str::from_utf8(&k[7..]).unwrap().parse().unwrap();
                                assert_eq!(seq_got, last_seq[idx], "scan served a stale value");
                            }
                        }
                    }
                }
            });
        }
        std::thread::sleep(run_for);
        stop.store(true, Ordering::Relaxed);
    });
    let stats = cache.stats();
    assert!(
        stats.dram_used <= stats.dram_capacity + (64 << 10),
        "{stats:?}"
    );
    stats
}

#[test]
fn threads_never_see_wrong_values_under_eviction() {
    let stats = stress(256 << 10, 4, Duration::from_secs(4), None, false);
    assert!(
        stats.evicted_leaves > 0,
        "the test must exercise eviction: {stats:?}"
    );
    assert!(stats.leaf_splits > 0);
}

/// The same with dictionaries trained, swapped and retired while the threads write,
/// read and scan, DRAM-only and over an SSD tier.
#[test]
fn threads_never_see_wrong_values_with_dictionaries() {
    let stats = stress(1 << 20, 4, Duration::from_secs(3), None, true);
    assert!(stats.dictionaries_swapped > 1, "{stats:?}");
    assert!(stats.evicted_objects > 0, "{stats:?}");
    let ssd = Ssd {
        blocks: 2048,
        promotion: Promotion::EveryHit,
    };
    let stats = stress(512 << 10, 4, Duration::from_secs(3), Some(ssd), true);
    assert!(stats.dictionaries_swapped > 1, "{stats:?}");
    assert!(stats.evicted_leaves > 0, "{stats:?}");
}

/// The same with an SSD tier under a DRAM budget far below the data: group evictions,
/// clean-first drops, promotions of SSD hits (both policies) and SSD-side evictions of a
/// small device all race the readers, which must still never see a stale value.
#[test]
fn threads_never_see_wrong_values_with_the_ssd_tier() {
    for promotion in [Promotion::EveryHit, Promotion::SecondHit] {
        let ssd = Ssd {
            blocks: 2048,
            promotion,
        };
        let stats = stress(256 << 10, 4, Duration::from_secs(3), Some(ssd), false);
        assert!(stats.evicted_leaves > 100, "{stats:?}");
        assert!(stats.ssd_hits > 0 && stats.ssd_objects > 0, "{stats:?}");
        assert!(stats.large_objects + stats.large_dropped > 0, "{stats:?}");
    }
}

#[test]
fn threads_agree_without_eviction() {
    let stats = stress(256 << 20, 3, Duration::from_secs(2), None, false);
    assert_eq!(stats.evicted_leaves, 0);
}

/// Sustained PUTs far beyond the budget: the account never passes it for long, and the
/// objects kept are a sizeable share of what fits.
#[test]
fn memory_budget_holds_under_sustained_puts() {
    let dram = 4 << 20;
    let cache = ZipCache::open(Config {
        dram_capacity: dram,
        ..Config::default()
    })
    .unwrap();
    let started = Instant::now();
    let mut rng = 0x2545f4914f6cdd1du64;
    for batch in 0..60u64 {
        for i in 0..10_000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let key = format!("{:016}", rng % 5_000_000);
            let len = [16usize, 64, 64, 200, 1500][(rng >> 50) as usize % 5];
            cache
                .put(
                    key.as_bytes(),
                    &value_for(key.as_bytes(), batch, i, len),
                    None,
                )
                .unwrap();
        }
        let s = cache.stats();
        assert!(
            s.dram_used <= dram,
            "batch {batch}: {} > {dram}: {s:?}",
            s.dram_used
        );
    }
    let s = cache.stats();
    assert!(
        s.dram_used > dram * 8 / 10,
        "the budget is used, not wasted: {s:?}"
    );
    assert!(s.evicted_leaves > 1000);
    eprintln!("600k puts in {:?}: {s:?}", started.elapsed());
}
