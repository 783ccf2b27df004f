//! `flush_all` is a barrier: nothing stored before it is served by a GET that starts
//! after it returns, however many GETs race it (memcached semantics).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use zipcache::{Config, ZipCache};
use zipcache_device::{BlockDevice, MemDevice};

const KEYS: u32 = 12_000;

fn key(i: u32) -> Vec<u8> {
    format!("{i:016}").into_bytes()
}

/// Most keys live on the SSD; two threads GET them (promoting SSD hits into DRAM) while
/// the main thread flushes. After the flush returns, every key must be gone.
#[test]
fn nothing_stored_before_flush_all_is_served_after_it() {
    for round in 0..8 {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 14));
        let config = Config {
            dram_capacity: 256 << 10,
            superleaf_size: 16 << 10,
            ..Config::default()
        };
        let cache = Arc::new(ZipCache::open_on(config, Some(device)).unwrap());
        for i in 0..KEYS {
            cache.put(&key(i), &[b'v'; 64], None).unwrap();
        }
        let flushed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let served_after = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (cache, flushed, stop, served_after) = (
                    cache.clone(),
                    flushed.clone(),
                    stop.clone(),
                    served_after.clone(),
                );
                std::thread::spawn(move || {
                    let mut i = t * KEYS / 2;
                    while !stop.load(Ordering::Acquire) {
                        let after = flushed.load(Ordering::Acquire);
                        let got = cache.get(&key(i % KEYS)).unwrap();
                        if after && got.is_some() {
                            served_after.fetch_add(1, Ordering::Relaxed);
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.flush_all().unwrap();
        flushed.store(true, Ordering::Release);
        std::thread::sleep(std::time::Duration::from_millis(20));
        stop.store(true, Ordering::Release);
        for r in readers {
            r.join().unwrap();
        }
        let left = (0..KEYS)
            .filter(|&i| cache.get(&key(i)).unwrap().is_some())
            .count();
        assert_eq!(
            (served_after.load(Ordering::Relaxed), left),
            (0, 0),
            "round {round}: keys stored before flush_all were served after it"
        );
    }
}

/// The background thread merges queued write buffers while a flush empties DRAM; a merge
/// that splits a leaf publishes the new leaf while the flush walks the tree, and that
/// leaf must be emptied too (found by the power-loss model test: a flushed key came back
/// after a clean restart).
#[test]
fn leaves_split_by_a_racing_merge_are_flushed_too() {
    for round in 0..5000 {
        let config = Config {
            dram_capacity: 64 << 20,
            write_buffer: 4096,
            ..Config::default()
        };
        let cache = ZipCache::open(config).unwrap();
        let keys = 36 + round % 7;
        for i in 0..keys {
            cache.put(&key(i), &[b'v'; 100], None).unwrap();
        }
        // Flush while the background thread wakes up for the queued merge.
        let until =
            std::time::Instant::now() + std::time::Duration::from_micros(u64::from(round % 120));
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        cache.flush_all().unwrap();
        let left: Vec<u32> = (0..keys)
            .filter(|&i| cache.get(&key(i)).unwrap().is_some())
            .collect();
        assert!(
            left.is_empty(),
            "round {round}: {left:?} survived flush_all"
        );
    }
}
