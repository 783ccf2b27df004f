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
