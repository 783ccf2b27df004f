//! Restart: a clean `close()` keeps the SSD tier (warm restart) with the newest version
//! of every key; a crash (no `close()`) starts cold, so nothing deleted or overwritten
//! before it can come back.

use std::path::PathBuf;

use zipcache::config::DeviceCompression;
use zipcache::{Config, SsdConfig, ZipCache};

/// Every test runs with blocks packed by the host and with raw blocks.
const MODES: [DeviceCompression; 2] = [DeviceCompression::Host, DeviceCompression::Emulate];

/// A directory for one test's files, and the mode its cache runs in.
struct TempDir(PathBuf, DeviceCompression);

impl TempDir {
    fn new(name: &str, mode: DeviceCompression) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("zipcache-{name}-{mode:?}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir, mode)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config(dir: &TempDir) -> Config {
    Config {
        dram_capacity: 256 << 10,
        superleaf_size: 16 << 10,
        ssd: Some(SsdConfig {
            path: dir.0.join("ssd.bin"),
            size: 64 << 20,
            direct_io: true,
            device_compression: dir.1,
            logical_to_physical: 4.0,
        }),
        // Writers wait for the flusher rather than drop: a clean close must keep all.
        flush_wait_ms: 60_000,
        ..Config::default()
    }
}

/// `config` with trained dictionaries: in `Host` mode blocks are packed with block
/// dictionaries, persisted beside the SSD file; the budget has room for their prepared
/// forms besides the objects.
fn with_dictionaries(dir: &TempDir) -> Config {
    Config {
        dram_capacity: 1 << 20,
        dictionary_size: 4 << 10,
        dictionary_samples: 64,
        ssd_dictionaries: true,
        ..config(dir)
    }
}

/// The block dictionary files beside the SSD file.
fn dictionary_files(dir: &TempDir) -> Vec<PathBuf> {
    (1..=4)
        .map(|slot| dir.0.join(format!("ssd.bin.dict-{slot}")))
        .filter(|f| f.exists())
        .collect()
}

fn key(i: u32) -> Vec<u8> {
    format!("{i:016}").into_bytes()
}

fn value(i: u32, version: u32) -> Vec<u8> {
    let mut v = format!("value-{i}-v{version}-").into_bytes();
    v.resize(64, b'.');
    v
}

/// Writes 20k keys (most end up on the SSD), then deletes every 7th and overwrites every
/// 5th: the newest versions of many of those sit only in DRAM.
fn populate(cache: &ZipCache) {
    for i in 0..20_000 {
        cache.put(&key(i), &value(i, 1), None).unwrap();
    }
    for i in (0..20_000).step_by(7) {
        cache.delete(&key(i)).unwrap();
    }
    for i in (0..20_000).step_by(5) {
        cache.put(&key(i), &value(i, 2), None).unwrap();
    }
}

fn expected(i: u32) -> Option<Vec<u8>> {
    if i.is_multiple_of(5) {
        Some(value(i, 2))
    } else if i.is_multiple_of(7) {
        None
    } else {
        Some(value(i, 1))
    }
}

/// Every GET is a miss or the newest value; returns the hits.
fn check_never_stale(cache: &ZipCache) -> usize {
    let mut hits = 0;
    for i in 0..20_000 {
        let got = cache.get(&key(i)).unwrap();
        if got.is_some() {
            assert_eq!(got, expected(i), "key {i} served a stale or deleted value");
            hits += 1;
        }
    }
    hits
}

#[test]
fn clean_close_restarts_warm_with_newest_versions() {
    for mode in MODES {
        let dir = TempDir::new("warm", mode);
        let cache = ZipCache::open(config(&dir)).unwrap();
        assert!(!cache.warm_started());
        populate(&cache);
        assert!(cache.stats().ssd_objects > 5_000, "{:?}", cache.stats());
        cache.close().unwrap();

        let cache = ZipCache::open(config(&dir)).unwrap();
        assert!(cache.warm_started());
        let live = (0..20_000).filter(|&i| expected(i).is_some()).count();
        let hits = check_never_stale(&cache);
        assert_eq!(
            hits,
            live,
            "a clean close keeps every object: {:?}",
            cache.stats()
        );
        assert_eq!(cache.stats().checksum_failures, 0);
        cache.close().unwrap();
    }
}

#[test]
fn crash_restarts_cold_and_never_stale() {
    for mode in MODES {
        let dir = TempDir::new("crash", mode);
        let cache = ZipCache::open(config(&dir)).unwrap();
        populate(&cache);
        drop(cache); // no close(): as good as a crash for what reaches the disk
        let cache = ZipCache::open(config(&dir)).unwrap();
        assert!(!cache.warm_started());
        assert_eq!(
            check_never_stale(&cache),
            0,
            "a cold start forgets everything"
        );

        // A warm start followed by a crash must not reuse the old index either.
        populate(&cache);
        cache.close().unwrap();
        let cache = ZipCache::open(config(&dir)).unwrap();
        assert!(cache.warm_started());
        for i in (0..20_000).step_by(3) {
            cache
                .put(&key(i), b"overwritten after the warm start", None)
                .unwrap();
        }
        drop(cache);
        let cache = ZipCache::open(config(&dir)).unwrap();
        assert!(
            !cache.warm_started(),
            "the index was consumed by the previous open"
        );
        assert_eq!(check_never_stale(&cache), 0);
    }
}

fn large(i: u32, version: u32) -> Vec<u8> {
    let mut v = value(i, version);
    v.resize(5000 + i as usize % 3000, b'L');
    v
}

/// Large objects (BT_LO extents) survive a clean close too, and the versions that
/// replaced or deleted them before the close still win after it; a crash forgets them.
#[test]
fn large_objects_restart_warm_and_never_stale() {
    for mode in MODES {
        let dir = TempDir::new("large", mode);
        let cache = ZipCache::open(config(&dir)).unwrap();
        for i in 0..300 {
            cache.put(&key(i), &large(i, 1), None).unwrap();
        }
        for i in (0..300).step_by(3) {
            cache.put(&key(i), &value(i, 2), None).unwrap(); // small replaces large
        }
        for i in (1..300).step_by(5) {
            cache.delete(&key(i)).unwrap();
        }
        let expected = |i: u32| match i {
            _ if i % 5 == 1 => None,
            _ if i.is_multiple_of(3) => Some(value(i, 2)),
            _ => Some(large(i, 1)),
        };
        assert!(cache.stats().large_objects > 100, "{:?}", cache.stats());
        cache.close().unwrap();

        let cache = ZipCache::open(config(&dir)).unwrap();
        assert!(cache.warm_started());
        for i in 0..300 {
            assert_eq!(cache.get(&key(i)).unwrap(), expected(i), "key {i}");
        }
        assert_eq!(cache.stats().checksum_failures, 0);
        // New large objects after the warm start go on from the restored log head.
        for i in 300..400 {
            cache.put(&key(i), &large(i, 1), None).unwrap();
        }
        for i in 0..400 {
            let want = if i < 300 {
                expected(i)
            } else {
                Some(large(i, 1))
            };
            assert_eq!(cache.get(&key(i)).unwrap(), want, "key {i}");
        }
        drop(cache); // crash

        let cache = ZipCache::open(config(&dir)).unwrap();
        assert!(!cache.warm_started());
        assert_eq!(cache.stats().large_objects, 0);
        assert!((0..400).all(|i| cache.get(&key(i)).unwrap().is_none()));
    }
}

#[test]
fn damaged_index_means_cold_start() {
    for mode in MODES {
        let dir = TempDir::new("damaged", mode);
        let cache = ZipCache::open(config(&dir)).unwrap();
        populate(&cache);
        cache.close().unwrap();
        let index = dir.0.join("ssd.bin.index");
        let mut bytes = std::fs::read(&index).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 1;
        std::fs::write(&index, bytes).unwrap();
        let cache = ZipCache::open(config(&dir)).unwrap();
        assert!(!cache.warm_started());
        assert_eq!(check_never_stale(&cache), 0);
    }
}

/// Blocks packed with a block dictionary whose file is damaged, or gone, read as misses
/// after a warm restart: no panic, no wrong bytes; the others still hit.
#[test]
fn a_damaged_or_missing_block_dictionary_means_misses_never_wrong_bytes() {
    let dir = TempDir::new("dictionary", DeviceCompression::Host);
    let cache = ZipCache::open(with_dictionaries(&dir)).unwrap();
    populate(&cache);
    cache.settle().unwrap();
    cache.close().unwrap();
    let files = dictionary_files(&dir);
    assert!(!files.is_empty(), "a block dictionary was trained and kept");
    let live = (0..20_000).filter(|&i| expected(i).is_some()).count();

    let cache = ZipCache::open(with_dictionaries(&dir)).unwrap();
    assert!(cache.warm_started());
    assert_eq!(check_never_stale(&cache), live, "{:?}", cache.stats());
    assert_eq!(cache.stats().checksum_failures, 0);
    cache.close().unwrap();

    // One byte of each dictionary flipped: the files fail their seals, none is loaded.
    for file in dictionary_files(&dir) {
        let mut bytes = std::fs::read(&file).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 1;
        std::fs::write(&file, bytes).unwrap();
    }
    let cache = ZipCache::open(with_dictionaries(&dir)).unwrap();
    assert!(cache.warm_started());
    let hits = check_never_stale(&cache);
    let s = cache.stats();
    assert!(hits < live && s.checksum_failures > 0, "{hits} hits: {s:?}");
    cache.close().unwrap();

    // Written again, then every dictionary file gone.
    let cache = ZipCache::open(with_dictionaries(&dir)).unwrap();
    populate(&cache);
    cache.settle().unwrap();
    cache.close().unwrap();
    assert!(!dictionary_files(&dir).is_empty());
    for file in dictionary_files(&dir) {
        std::fs::remove_file(file).unwrap();
    }
    let cache = ZipCache::open(with_dictionaries(&dir)).unwrap();
    assert!(cache.warm_started());
    let hits = check_never_stale(&cache);
    let s = cache.stats();
    assert!(hits < live && s.checksum_failures > 0, "{hits} hits: {s:?}");
}

/// Blocks packed with block dictionaries are read after a warm restart whose settings
/// train none (`ssd_dictionaries` or `dictionaries` off, or a budget below the one that
/// trains them): every dictionary a block names is loaded for reading. New blocks are
/// packed with LZ4 alone, and the files stay while blocks name them, for the next start.
#[test]
fn a_restart_that_trains_no_dictionary_still_reads_the_blocks_packed_with_one() {
    let live = (0..20_000).filter(|&i| expected(i).is_some()).count();
    type TurnOff = fn(&mut Config);
    let untrained: [(&str, TurnOff); 3] = [
        ("ssd_dictionaries=false", |c| c.ssd_dictionaries = false),
        ("dictionaries=false", |c| c.dictionaries = false),
        ("a budget below 8 MiB", |c| {
            (c.dictionary_samples, c.dictionary_size) = (0, 0);
        }),
    ];
    for (setting, turn_off) in untrained {
        let dir = TempDir::new("dictionary-off", DeviceCompression::Host);
        let cache = ZipCache::open(with_dictionaries(&dir)).unwrap();
        populate(&cache);
        cache.settle().unwrap();
        cache.close().unwrap();
        assert!(!dictionary_files(&dir).is_empty(), "{setting}");

        let mut off = with_dictionaries(&dir);
        turn_off(&mut off);
        for round in 0..2 {
            let cache = ZipCache::open(off.clone()).unwrap();
            assert!(cache.warm_started(), "{setting}");
            let hits = check_never_stale(&cache);
            let s = cache.stats();
            assert_eq!(hits, live, "{setting}, start {round}: {s:?}");
            assert_eq!(s.checksum_failures, 0, "{setting}");
            cache.close().unwrap();
        }
    }
}
