//! The DRAM budget: changed while running (`ZipCache::set_dram_capacity`, memcached's
//! `cache_memlimit`), and full with `evictions = false` (memcached `-M`, Redis
//! `noeviction`: writes are refused, nothing is forgotten).

use std::sync::Arc;
use std::time::{Duration, Instant};

use zipcache_device::{BlockDevice, MemDevice};

use crate::{Config, Error, Stats, Update, ZipCache};

const MIB: u64 = 1 << 20;

fn key(i: u32) -> Vec<u8> {
    format!("{i:012}").into_bytes()
}

/// Incompressible enough that the budget holds a known order of objects.
fn value(i: u32) -> Vec<u8> {
    (0..200u32)
        .flat_map(|j| (i.wrapping_mul(2_654_435_761) ^ j.wrapping_mul(40_503)).to_le_bytes())
        .collect()
}

fn fill(cache: &ZipCache, keys: std::ops::Range<u32>) {
    for i in keys {
        cache.put(&key(i), &value(i), None).unwrap();
    }
}

/// Waits (at most 10 s) until `done` holds for the engine's stats, and returns them.
fn wait_for(cache: &ZipCache, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = cache.stats();
        if done(&stats) || Instant::now() > deadline {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn dram_only(dram_capacity: u64) -> ZipCache {
    ZipCache::open(Config {
        dram_capacity,
        ..Config::default()
    })
    .unwrap()
}

#[test]
fn lowering_the_capacity_evicts_down_to_it_and_raising_it_lets_the_cache_grow() {
    let cache = dram_only(8 * MIB);
    fill(&cache, 0..20_000);
    let full = cache.stats();
    assert!(full.dram_used > 6 * MIB, "{full:?}");

    cache.set_dram_capacity(2 * MIB).unwrap();
    let lowered = cache.stats();
    assert_eq!(lowered.dram_capacity, 2 * MIB);
    assert!(lowered.dram_used <= 2 * MIB, "{lowered:?}");
    assert!(
        lowered.dropped_objects > full.dropped_objects,
        "{lowered:?}"
    );
    // What is left is what was stored.
    for i in 0..20_000 {
        if let Some(found) = cache.get(&key(i)).unwrap() {
            assert_eq!(found, value(i));
        }
    }
    fill(&cache, 20_000..30_000);
    assert!(cache.stats().dram_used <= 2 * MIB);

    cache.set_dram_capacity(8 * MIB).unwrap();
    let raised = cache.stats();
    fill(&cache, 30_000..35_000);
    let grown = cache.stats();
    assert_eq!(grown.dram_capacity, 8 * MIB);
    assert!(grown.dram_used > 4 * MIB, "{grown:?}");
    assert!(grown.dram_used <= 8 * MIB, "{grown:?}");
    // 5 000 objects (about 4 MiB) fit in the room raised: none was forgotten for them.
    assert_eq!(grown.dropped_objects, raised.dropped_objects, "{grown:?}");
}

/// A budget past what the engine can count in (its budget arithmetic is signed) is
/// refused and changes nothing: it once wrapped negative and emptied the cache.
#[test]
fn a_capacity_beyond_any_machine_is_refused() {
    let cache = dram_only(8 * MIB);
    fill(&cache, 0..1_000);
    let before = cache.stats();
    for bytes in [u64::MAX, 1 << 63, (1 << 50) + 1] {
        assert!(
            matches!(cache.set_dram_capacity(bytes), Err(Error::Config(_))),
            "{bytes}"
        );
    }
    let after = cache.stats();
    assert_eq!(after.dram_capacity, 8 * MIB);
    assert_eq!(after.dropped_objects, before.dropped_objects, "{after:?}");
    assert_eq!(cache.get(&key(0)).unwrap(), Some(value(0)));
    cache.set_dram_capacity(1 << 50).unwrap();
    assert!(
        Config {
            dram_capacity: (1 << 50) + 1,
            ..Config::default()
        }
        .validate()
        .is_err()
    );
}

#[test]
fn with_an_ssd_tier_the_excess_moves_down_and_stays_readable() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 16));
    let config = Config {
        dram_capacity: 8 * MIB,
        ..Config::default()
    };
    let cache = ZipCache::open_on(config, Some(device)).unwrap();
    // About 5 MiB: within the budget, so nothing has moved down yet.
    fill(&cache, 0..6_000);
    let full = cache.stats();
    assert!(
        full.dram_used > 4 * MIB && full.ssd_objects == 0,
        "{full:?}"
    );
    cache.set_dram_capacity(2 * MIB).unwrap();
    let lowered = wait_for(&cache, |s| s.dram_used <= 2 * MIB);
    assert!(lowered.dram_used <= 2 * MIB, "{lowered:?}");
    assert!(lowered.ssd_objects > 0, "{lowered:?}");
    assert_eq!(
        lowered.dropped_objects, 0,
        "moved to the SSD, not forgotten"
    );
    for i in (0..6_000).step_by(97) {
        assert_eq!(cache.get(&key(i)).unwrap(), Some(value(i)), "key {i}");
    }
}

#[test]
fn a_capacity_below_the_minimum_is_refused() {
    let cache = dram_only(8 * MIB);
    assert!(matches!(
        cache.set_dram_capacity(1024),
        Err(Error::Config(_))
    ));
    assert_eq!(cache.stats().dram_capacity, 8 * MIB);
}

fn refusing(dram_capacity: u64) -> ZipCache {
    ZipCache::open(Config {
        dram_capacity,
        evictions: false,
        ..Config::default()
    })
    .unwrap()
}

/// Puts keys from 0 until one is refused; returns how many were stored.
fn fill_until_refused(cache: &ZipCache) -> u32 {
    (0..1_000_000)
        .find(|&i| match cache.put(&key(i), &value(i), None) {
            Ok(()) => false,
            Err(Error::OutOfMemory) => true,
            Err(other) => panic!("put {i}: {other}"),
        })
        .expect("a 1 MiB cache fills before a million 800-byte values")
}

#[test]
fn a_full_cache_refuses_writes_and_forgets_nothing() {
    let cache = refusing(MIB);
    let stored = fill_until_refused(&cache);
    assert!(stored > 500, "{stored} stored");
    // Refused again, through a read-modify-write too, and counted.
    assert!(matches!(
        cache.put(&key(stored), &value(stored), None),
        Err(Error::OutOfMemory)
    ));
    let update = cache.update(&key(0), |_| {
        let put = Update::Put {
            value: b"x".to_vec(),
            options: Default::default(),
        };
        (put, ())
    });
    assert!(matches!(update, Err(Error::OutOfMemory)), "{update:?}");
    let stats = cache.stats();
    assert_eq!(stats.refused_writes, 3);
    assert_eq!(stats.dropped_objects, 0);
    for i in 0..stored {
        assert_eq!(cache.get(&key(i)).unwrap(), Some(value(i)), "key {i}");
    }
}

#[test]
fn deletes_make_room_again() {
    let cache = refusing(MIB);
    let stored = fill_until_refused(&cache);
    for i in 0..stored / 2 {
        assert!(cache.delete(&key(i)).unwrap());
    }
    // Deleted objects leave the pages when their leaves merge.
    cache.settle().unwrap();
    cache.put(&key(stored), &value(stored), None).unwrap();
    assert_eq!(cache.get(&key(stored)).unwrap(), Some(value(stored)));
}

#[test]
fn an_ssd_tier_is_refused_with_evictions_off() {
    let device = Arc::new(MemDevice::new(1024));
    let config = Config {
        evictions: false,
        ..Config::default()
    };
    let opened = ZipCache::open_on(config, Some(device));
    assert!(matches!(opened, Err(Error::Config(_))));
}
