//! A collection's object (`PutOptions::collection`: record kind bit 6, BT_LO's
//! `TAG_COLLECTION`): the mark is kept with the object wherever it goes — write buffer,
//! page, medium blob, BT_LO, the SSD tier and back, a warm restart after a clean close or
//! a crash — and every read reports it; a touch keeps it, a put sets or clears it.

use std::ops::RangeFull;
use std::path::{Path, PathBuf};

use super::model::block_on;
use crate::config::DeviceCompression;
use crate::{Config, GetOptions, Item, ItemInfo, PutOptions, SsdConfig, Update, ZipCache};

fn header() -> PutOptions {
    PutOptions {
        collection: true,
        ..PutOptions::default()
    }
}

fn all() -> RangeFull {
    ..
}

/// `key`'s mark as every read reports it, after checking they agree (`None`: absent).
/// The asynchronous GET reads first: an object only the SSD tier holds is read there
/// (and promoted). The GETs peek, so the object's access state is left alone.
fn mark(cache: &ZipCache, key: &[u8]) -> Option<bool> {
    let peek = GetOptions { peek: true };
    let async_item = block_on(cache.get_item_async(key, peek)).unwrap();
    let item = cache.get_item(key, peek).unwrap();
    let mark = item.as_ref().map(|item| item.collection);
    assert_eq!(
        async_item.map(|i| i.collection),
        mark,
        "async GET of {key:?}"
    );
    let info = cache.info(key).unwrap();
    assert_eq!(info.map(|i| i.collection), mark, "info of {key:?}");
    let (seen, _) = cache
        .update(key, |item| (Update::Keep, item.map(|i| i.collection)))
        .unwrap();
    assert_eq!(seen, mark, "update's view of {key:?}");
    let (seen, _) = cache
        .update_meta(key, |info| (Update::Keep, info.map(|i| i.collection)))
        .unwrap();
    assert_eq!(seen, mark, "update_meta's view of {key:?}");
    let (seen, _) = cache
        .update_read_before(key, item.clone(), |item| {
            (Update::Keep, item.map(|i| i.collection))
        })
        .unwrap();
    assert_eq!(seen, mark, "update_read_before's view of {key:?}");
    let scanned = cache.scan(key..=key, 1).unwrap();
    assert_eq!(scanned.first().map(|(_, i)| i.collection), mark, "scan");
    let bytes = cache.scan_bytes(key..=key, 1, 1).unwrap();
    assert_eq!(bytes.first().map(|(_, i)| i.collection), mark, "scan_bytes");
    let keys = cache.scan_keys(key..=key, 1).unwrap();
    assert_eq!(keys.first().map(|(_, i)| i.collection), mark, "scan_keys");
    mark
}

/// A header, and a string with the very same bytes, DRAM only: tiny (in a page) and
/// medium (a blob of its own), before and after their leaf merges.
#[test]
fn every_read_reports_a_collections_header_and_a_touch_keeps_it() {
    let cache = ZipCache::open_on(Config::default(), None).unwrap();
    let medium = vec![7u8; 600];
    for (key, value) in [
        (&b"hash"[..], &b"\x01header"[..]),
        (b"medium-hash", &medium),
    ] {
        cache.put_with(key, value, header()).unwrap();
    }
    cache.put(b"string", b"\x01header", None).unwrap();
    cache.put(b"medium-string", &medium, None).unwrap();
    for merged in [false, true] {
        if merged {
            cache.settle().unwrap();
        }
        for (key, want) in [
            (&b"hash"[..], true),
            (b"medium-hash", true),
            (b"string", false),
            (b"medium-string", false),
        ] {
            assert_eq!(mark(&cache, key), Some(want), "{key:?}, merged {merged}");
        }
    }
    let listed: Vec<(Vec<u8>, bool)> = cache
        .scan_keys::<&[u8]>(all(), 10)
        .unwrap()
        .into_iter()
        .map(|(k, info)| (k, info.collection))
        .collect();
    let want = [
        (&b"hash"[..], true),
        (b"medium-hash", true),
        (b"medium-string", false),
        (b"string", false),
    ]
    .map(|(k, c)| (k.to_vec(), c));
    assert_eq!(listed, want);

    // A touch (SetMeta) keeps the object's type, whatever its options say; the new flags
    // and expiry are kept.
    let expires = cache.now_ms() + 3_600_000;
    let touch = |collection| PutOptions {
        flags: 9,
        expires_at_ms: Some(expires),
        collection,
        ..PutOptions::default()
    };
    for key in [&b"hash"[..], b"medium-hash"] {
        cache
            .update(key, |_| (Update::SetMeta(touch(false)), ()))
            .unwrap();
    }
    for key in [&b"string"[..], b"medium-string"] {
        cache
            .update_meta(key, |_| (Update::SetMeta(touch(true)), ()))
            .unwrap();
    }
    for merged in [false, true] {
        if merged {
            cache.settle().unwrap();
        }
        for (key, want) in [
            (&b"hash"[..], true),
            (b"medium-hash", true),
            (b"string", false),
            (b"medium-string", false),
        ] {
            assert_eq!(mark(&cache, key), Some(want), "{key:?} touched");
            let info = cache.info(key).unwrap().unwrap();
            assert_eq!((info.flags, info.expires_at_ms), (9, Some(expires)));
        }
    }

    // A put sets the type: a header put as a string is one, and the other way round.
    let put = |collection| Update::Put {
        value: b"\x01header".to_vec(),
        options: PutOptions {
            collection,
            ..PutOptions::default()
        },
    };
    cache.update(b"hash", |_| (put(false), ())).unwrap();
    cache.update(b"string", |_| (put(true), ())).unwrap();
    assert_eq!(mark(&cache, b"hash"), Some(false));
    assert_eq!(mark(&cache, b"string"), Some(true));
    cache.put(b"medium-hash", &medium, None).unwrap();
    assert_eq!(mark(&cache, b"medium-hash"), Some(false));
    cache.settle().unwrap();
    assert_eq!(mark(&cache, b"hash"), Some(false));
    assert_eq!(mark(&cache, b"string"), Some(true));
    assert_eq!(mark(&cache, b"medium-hash"), Some(false));
}

/// A directory for one test's files, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("zc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn hybrid(dir: &Path, mode: DeviceCompression) -> ZipCache {
    let config = Config {
        // Small enough that a fill evicts to the SSD; with super-leaves of the default
        // 64 KiB, BT_SSD's index stays well under an eighth of it, so the engine never
        // gives up super-leaves (and objects with them) to make room in DRAM.
        dram_capacity: 256 << 10,
        ssd: Some(SsdConfig {
            path: dir.join("ssd.bin"),
            size: 64 << 20,
            direct_io: false,
            device_compression: mode,
            logical_to_physical: 4.0,
        }),
        // Writers wait for the flusher rather than drop: every object is kept.
        flush_wait_ms: 60_000,
        ..Config::default()
    };
    ZipCache::open(config).unwrap()
}

const OBJECTS: u32 = 10_000;

fn key(i: u32) -> Vec<u8> {
    format!("{i:016}").into_bytes()
}

/// Every third object is a header; every fifth is medium (a blob in DRAM), every
/// 61st large (in BT_LO).
fn is_header(i: u32) -> bool {
    i.is_multiple_of(3)
}

fn value(i: u32) -> Vec<u8> {
    let len = if i.is_multiple_of(61) {
        3_000
    } else if i.is_multiple_of(5) {
        400
    } else {
        40
    };
    let mut v = format!("value {i} ").into_bytes();
    v.resize(len, b'.');
    v
}

/// Every object read back whole, and some with their mark as `mark` checks it (an
/// asynchronous GET first); promotes the ones only the SSD tier held.
fn check_all(cache: &ZipCache, phase: &str) {
    for i in 0..OBJECTS {
        if i.is_multiple_of(37) {
            assert_eq!(
                mark(cache, &key(i)),
                Some(is_header(i)),
                "{phase}: object {i}"
            );
        }
        let item = cache.get_item(&key(i), GetOptions { peek: true }).unwrap();
        assert_eq!(
            item.map(|i| i.value),
            Some(value(i)),
            "{phase}: object {i}: {}",
            cache.explain(&key(i))
        );
    }
    let listed = cache.scan_keys::<&[u8]>(all(), OBJECTS as usize).unwrap();
    let want: Vec<(Vec<u8>, bool)> = (0..OBJECTS).map(|i| (key(i), is_header(i))).collect();
    let got: Vec<(Vec<u8>, bool)> = listed.into_iter().map(|(k, i)| (k, i.collection)).collect();
    if got != want {
        let missing = want.iter().filter(|w| !got.contains(w)).count();
        panic!(
            "{phase}: scan_keys listed {} of {} objects, {missing} missing or wrong; {:?}",
            got.len(),
            want.len(),
            cache.stats()
        );
    }
    let scanned = cache.scan::<&[u8]>(all(), OBJECTS as usize).unwrap();
    let got: Vec<(Vec<u8>, bool)> = scanned
        .into_iter()
        .map(|(k, i)| (k, i.collection))
        .collect();
    assert!(got == want, "{phase}: scan");
}

fn evict_all(cache: &ZipCache) {
    let inner = &cache.inner;
    inner
        .dram
        .evict_all(Some(inner.ssd.as_ref().unwrap()), cache.now_ms());
}

/// Headers evicted to the SSD tier (written by the flusher as DRAM fills, and then all
/// of them), read back there and promoted, evicted again as clean copies, and after a
/// clean close and a warm restart, and after a crash the journal recovers from: the mark
/// is kept throughout. So is a touch of an object only the SSD tier holds.
#[test]
fn the_mark_survives_the_ssd_tier_and_restarts() {
    for mode in [DeviceCompression::Host, DeviceCompression::Emulate] {
        let dir = TempDir::new(&format!("collection-{mode:?}"));
        let cache = hybrid(&dir.0, mode);
        for i in 0..OBJECTS {
            let options = PutOptions {
                collection: is_header(i),
                ..PutOptions::default()
            };
            cache.put_with(&key(i), &value(i), options).unwrap();
        }
        assert!(
            cache.stats().ssd_objects > 500,
            "filling DRAM evicted to the SSD: {:?}",
            cache.stats()
        );
        evict_all(&cache);
        assert_eq!(cache.stats().dram_objects, 0);
        check_all(&cache, &format!("first {mode:?}"));
        assert!(cache.stats().ssd_promotions > 0);
        // Promoted copies are clean: evicted again, they are not rewritten, and the SSD's
        // copies answer.
        evict_all(&cache);
        check_all(&cache, &format!("again {mode:?}"));

        // A touch of a header only the SSD tier holds keeps its mark; so does a touch of
        // a string that asks for one.
        evict_all(&cache);
        let touch = |collection| {
            Update::SetMeta(PutOptions {
                flags: 5,
                collection,
                ..PutOptions::default()
            })
        };
        cache.update(&key(0), |_| (touch(false), ())).unwrap();
        cache.update_meta(&key(1), |_| (touch(true), ())).unwrap();
        for i in [0, 1] {
            assert_eq!(mark(&cache, &key(i)), Some(is_header(i)));
            assert_eq!(cache.info(&key(i)).unwrap().unwrap().flags, 5);
        }
        cache.close().unwrap();

        let cache = hybrid(&dir.0, mode);
        assert!(cache.warm_started());
        check_all(&cache, &format!("warm {mode:?}"));
        evict_all(&cache);
        check_all(&cache, &format!("warm-evicted {mode:?}"));
        assert_eq!(cache.stats().checksum_failures, 0);

        // A crash with every object on flash: the crash journal brings BT_SSD back, and
        // what it serves carries its mark (a key the journal cannot vouch for is a miss).
        evict_all(&cache);
        cache.crash();
        let cache = hybrid(&dir.0, mode);
        assert_eq!(cache.stats().recovery_kind, "crash");
        let listed = cache.scan_keys::<&[u8]>(all(), OBJECTS as usize).unwrap();
        assert!(listed.len() > OBJECTS as usize / 2, "{} kept", listed.len());
        for (k, info) in listed {
            let i: u32 = std::str::from_utf8(&k).unwrap().parse().unwrap();
            assert_eq!(info.collection, is_header(i), "object {i} after the crash");
            if i.is_multiple_of(37) {
                assert_eq!(mark(&cache, &k), Some(is_header(i)), "object {i}");
            }
        }
        cache.close().unwrap();
    }
}

/// A header past `medium_max` is a large object, in BT_LO with an SSD tier (a medium
/// blob without one), and keeps its mark: every read reports it, a touch keeps it, a
/// put sets or clears it, and a clean close and warm restart keep it, as the crash
/// journal does after a crash.
#[test]
fn a_large_header_keeps_its_mark() {
    let dir = TempDir::new("collection-large");
    for ssd in [true, false] {
        let open = || match ssd {
            true => hybrid(&dir.0, DeviceCompression::Host),
            false => ZipCache::open_on(Config::default(), None).unwrap(),
        };
        let cache = open();
        let k = b"big-hash";
        let values = [cache.config().medium_max - k.len() + 1, 64 << 10].map(|len| vec![1; len]);
        for value in &values {
            cache.put_with(k, value, header()).unwrap();
            assert_eq!(mark(&cache, k), Some(true), "{} bytes", value.len());
            assert_eq!(cache.get(k).unwrap().as_ref(), Some(value));
        }
        assert_eq!(cache.stats().large_objects, u64::from(ssd));
        let touch = |collection| {
            Update::SetMeta(PutOptions {
                flags: 8,
                collection,
                ..PutOptions::default()
            })
        };
        cache.update_meta(k, |_| (touch(false), ())).unwrap();
        assert_eq!(mark(&cache, k), Some(true), "a touch keeps the type");
        assert_eq!(cache.info(k).unwrap().unwrap().flags, 8);
        let put = |collection| Update::Put {
            value: vec![2; 64 << 10],
            options: PutOptions {
                collection,
                ..PutOptions::default()
            },
        };
        cache.update(k, |_| (put(false), ())).unwrap();
        assert_eq!(mark(&cache, k), Some(false));
        cache.update(k, |_| (put(true), ())).unwrap();
        assert_eq!(mark(&cache, k), Some(true));
        if !ssd {
            continue;
        }
        cache.close().unwrap();
        let cache = open();
        assert!(cache.warm_started());
        assert_eq!(mark(&cache, k), Some(true), "after a warm restart");
        cache
            .put_with(b"big-string", &values[1], PutOptions::default())
            .unwrap();
        cache.crash();
        let cache = open();
        assert_eq!(cache.stats().recovery_kind, "crash");
        assert_eq!(mark(&cache, k), Some(true), "after a crash");
        assert_eq!(mark(&cache, b"big-string"), Some(false), "after a crash");
        cache.close().unwrap();
    }
}

/// A large string is never reported a header: not after a touch that asks for the mark,
/// nor when the item an `update_read_before` hands in claims it.
#[test]
fn a_large_string_never_takes_the_mark() {
    let dir = TempDir::new("collection-large-touch");
    let cache = hybrid(&dir.0, DeviceCompression::Host);
    let k = b"big";
    let big = vec![4u8; 64 << 10];
    let versioned = PutOptions {
        assign_cas: true,
        ..PutOptions::default()
    };
    cache.put_with(k, &big, versioned).unwrap();
    assert_eq!(cache.stats().large_objects, 1);
    // The touch takes a version the engine assigns, which names it alone: the
    // `update_read_before` below finds the item it hands in current and uses it, rather
    // than reading the extent.
    cache
        .update_meta(k, |_| {
            let options = PutOptions {
                flags: 3,
                assign_cas: true,
                collection: true,
                ..PutOptions::default()
            };
            (Update::SetMeta(options), ())
        })
        .unwrap();
    assert_eq!(mark(&cache, k), Some(false));
    assert_eq!(cache.info(k).unwrap().unwrap().flags, 3);
    let read = cache.get_item(k, GetOptions::default()).unwrap().unwrap();
    let reads = cache.stats().ssd_device_reads;
    let claimed = Item {
        collection: true,
        ..read
    };
    let (seen, _) = cache
        .update_read_before(k, Some(claimed), |item| {
            (Update::Keep, item.map(|i| (i.collection, i.value.len())))
        })
        .unwrap();
    assert_eq!(seen, Some((false, big.len())));
    assert_eq!(
        cache.stats().ssd_device_reads,
        reads,
        "the item handed in was used"
    );
    let listed: Vec<ItemInfo> = cache
        .scan_keys::<&[u8]>(all(), 1)
        .unwrap()
        .into_iter()
        .map(|(_, i)| i)
        .collect();
    assert!(!listed[0].collection);
    cache.close().unwrap();
}
