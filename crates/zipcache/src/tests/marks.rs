//! What the crash journal's shadow table holds (`restart/shadow.rs`): the keys whose
//! older versions are on flash while DRAM holds their newest state — not every key DRAM
//! holds dirty. A fill of new keys has nothing on flash to hide, so it costs the table
//! (and the writes) no marks but a presence filter's false positives; overwrites of keys
//! the SSD holds are marked until their leaves are written down.

use std::path::PathBuf;

use crate::config::DeviceCompression;
use crate::dram::Lookup;
use crate::restart::shadow::MayBeOnFlash;
use crate::{Config, SsdConfig, ZipCache};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("marks:{i:08}").into_bytes()
}

/// 64 incompressible bytes.
fn value(i: u32, version: u32) -> Vec<u8> {
    let mut x = u64::from(i) << 32 | u64::from(version) | 1;
    (0..8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

#[test]
fn only_writes_that_make_a_flash_version_older_are_marked() {
    let dir = TempDir(std::env::temp_dir().join(format!("zipcache-marks-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let config = Config {
        dram_capacity: 512 << 10,
        ssd: Some(SsdConfig {
            path: dir.0.join("ssd.bin"),
            size: 64 << 20,
            direct_io: false,
            device_compression: DeviceCompression::Host,
            logical_to_physical: 4.0,
        }),
        // The filters are what tells a new key from one flash holds (`ssd/presence.rs`);
        // without them only an empty sub-page does.
        ssd_presence_filters: true,
        crash_journal: Some(dir.0.clone()),
        flush_wait_ms: 60_000,
        ..Config::default()
    };
    let cache = ZipCache::open(config).unwrap();
    let keys = 40_000;
    for i in 0..keys {
        cache.put(&key(i), &value(i, 0), None).unwrap();
    }
    let filled = cache.stats();
    assert!(filled.crash_journal_on);
    assert!(
        filled.ssd_objects > keys as u64 / 2,
        "most of the fill went to flash: {}",
        filled.ssd_objects
    );
    let dirty = filled.dram_objects - filled.dram_clean_objects;
    assert!(dirty > 1_000, "DRAM holds {dirty} new keys");
    // Only a presence filter's false positives (a few %) are marked.
    assert!(
        filled.crash_journal_keys * 10 < dirty,
        "{} keys marked of {dirty} dirty in DRAM",
        filled.crash_journal_keys
    );
    assert_eq!(filled.crash_journal_overflows, 0);

    // Overwrites of keys only flash holds: each is marked, as it is written.
    let inner = &cache.inner;
    let presence = inner.ssd.as_ref().unwrap().presence();
    let shadow = inner.shadow.as_ref().unwrap();
    let on_flash: Vec<u32> = (0..keys)
        .filter(|&i| {
            presence.may_be_on_flash(&key(i))
                && inner.dram.get(&key(i), cache.now_ms(), true) == Lookup::Absent
        })
        .take(500)
        .collect();
    assert_eq!(on_flash.len(), 500);
    let marked = on_flash
        .iter()
        .filter(|&&i| {
            cache.put(&key(i), &value(i, 1), None).unwrap();
            shadow.contains(&key(i))
        })
        .count();
    assert!(marked >= 475, "{marked} of 500 overwrites marked");
    cache.crash();
}
