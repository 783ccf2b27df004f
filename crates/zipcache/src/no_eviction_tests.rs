//! `evictions = false` (memcached `-M`, Redis `noeviction`): a full cache refuses writes
//! and forgets nothing.

use crate::{Config, Error, Update, ZipCache};

const MIB: u64 = 1 << 20;

fn key(i: u32) -> Vec<u8> {
    format!("{i:012}").into_bytes()
}

/// Incompressible: the budget fills after a known order of objects.
fn value(i: u32) -> Vec<u8> {
    (0..50u32)
        .flat_map(|j| (i.wrapping_mul(2_654_435_761) ^ j.wrapping_mul(40_503)).to_le_bytes())
        .collect()
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
        .expect("a 1 MiB cache fills before a million 200-byte values")
}

#[test]
fn a_full_cache_refuses_writes_and_forgets_nothing() {
    let cache = refusing(MIB);
    let stored = fill_until_refused(&cache);
    assert!(stored > 1_000, "{stored} stored");
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
    let device = std::sync::Arc::new(zipcache_device::MemDevice::new(1024));
    let config = Config {
        evictions: false,
        ..Config::default()
    };
    let opened = ZipCache::open_on(config, Some(device));
    assert!(matches!(opened, Err(Error::Config(_))));
}
