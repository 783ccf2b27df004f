//! SCAN: leaf by leaf through BT_DRAM, BT_LO and BT_SSD, merged newest first. Three
//! views of one walk: objects with values (`scan`), the same within a byte budget
//! (`scan_bytes`), and keys with metadata only (`scan_keys`), which reads no large
//! object's value. A step holds one leaf of each tree; a large object's value is read
//! only when it is handed out.

use std::ops::{Bound, ControlFlow, RangeBounds};

use super::ZipCache;
use super::get::item_of;
use crate::dram::{LeafScan, ScanEntry};
use crate::large_objects::LargeEntry;
use crate::record::Meta;
use crate::ssd::Freshness;
use crate::{AccessState, Item, ItemInfo, Result};

/// One version a scan step found: a value (from DRAM or the SSD tier), or a large object
/// whose value is still on the device.
enum Found {
    Value(Vec<u8>, Meta),
    Large(LargeEntry),
}

impl ZipCache {
    /// Live objects with keys in `range`, in key order, at most `limit` of them. A scan
    /// peeks: it marks nothing read, and reports the access state DRAM keeps of its
    /// objects (setting `track_access`; `None` for the others).
    pub fn scan<K: AsRef<[u8]>>(
        &self,
        range: impl RangeBounds<K>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Item)>> {
        self.scan_bytes(range, limit, usize::MAX)
    }

    /// As [`scan`](Self::scan), and it stops once the keys and values it returns reach
    /// `max_bytes`: the object that reaches it is the last (so it returns at most
    /// `max_bytes` plus one object, and at least one object if the range holds any and
    /// `max_bytes` is not 0). Large objects past the stop are never read.
    pub fn scan_bytes<K: AsRef<[u8]>>(
        &self,
        range: impl RangeBounds<K>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(Vec<u8>, Item)>> {
        let (mut out, mut bytes) = (Vec::new(), 0);
        if limit == 0 || max_bytes == 0 {
            return Ok(out);
        }
        let now = self.inner.now();
        self.walk(range, now, |key, found, access| {
            let (value, meta) = match found {
                Found::Value(value, meta) => (value, meta),
                // may do I/O: reads the large object's extent. Gone since its leaf was
                // read (dropped, overwritten by a small value, unreadable): not live.
                Found::Large(_) => match self.inner.large.as_ref().and_then(|lo| lo.get(&key, now))
                {
                    Some(found) => found,
                    None => return ControlFlow::Continue(()),
                },
            };
            bytes += key.len() + value.len();
            out.push((
                key,
                Item {
                    access,
                    ..item_of(value, &meta)
                },
            ));
            if out.len() == limit || bytes >= max_bytes {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        Ok(out)
    }

    /// The keys of live objects in `range`, in key order, at most `limit` of them, with
    /// what `scan` reports of each but the value (its length instead). No value is
    /// copied out and no large object is read: a listing of large objects costs their
    /// index entries only (so an extent that turns out unreadable is listed, and a GET
    /// of it misses).
    pub fn scan_keys<K: AsRef<[u8]>>(
        &self,
        range: impl RangeBounds<K>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, ItemInfo)>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.walk(range, self.inner.now(), |key, found, access| {
            let (value_len, meta) = match found {
                Found::Value(value, meta) => (value.len(), meta),
                Found::Large(large) => (large.value_len, large.meta),
            };
            let info = ItemInfo {
                value_len,
                flags: meta.flags,
                cas: meta.cas,
                expires_at_ms: meta.expires_at_ms,
                access,
                collection: meta.collection,
            };
            out.push((key, info));
            if out.len() == limit {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        Ok(out)
    }

    /// Hands every live object with a key in `range` to `visit` in key order, with the
    /// access state DRAM keeps of it, until `visit` breaks or the range ends.
    fn walk<K: AsRef<[u8]>>(
        &self,
        range: impl RangeBounds<K>,
        now: u64,
        mut visit: impl FnMut(Vec<u8>, Found, Option<AccessState>) -> ControlFlow<()>,
    ) {
        let inner = &self.inner;
        inner.ops.scans.incr();
        let end: Bound<&[u8]> = match range.end_bound() {
            Bound::Included(k) => Bound::Included(k.as_ref()),
            Bound::Excluded(k) => Bound::Excluded(k.as_ref()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut cursor: Vec<u8> = match range.start_bound() {
            Bound::Included(k) => k.as_ref().to_vec(),
            // The smallest key after `k`.
            Bound::Excluded(k) => [k.as_ref(), &[0]].concat(),
            Bound::Unbounded => Vec::new(),
        };
        // The SSD super-leaf and BT_LO leaf last read, kept while DRAM leaves walk
        // through their ranges. The super-leaf is read again if it was written since:
        // an eviction may have moved a newer version from a DRAM leaf read after it.
        let mut ssd_chunk: Option<(Chunk<ScanEntry>, Freshness)> = None;
        let mut lo_chunk: Option<Chunk<(Vec<u8>, LargeEntry)>> = None;
        loop {
            let LeafScan {
                entries: dram_entries,
                next: dram_next,
                lost: dram_lost,
                access,
            } = inner.dram.scan_leaf(&cursor, end, now);
            let dram_found = dram_entries
                .into_iter()
                .map(|(k, v)| (k, v.map(|(value, meta)| Found::Value(value, meta))));
            let (entries, next): (Vec<(Vec<u8>, Option<Found>)>, _) = match &inner.ssd {
                None => (dram_found.collect(), dram_next),
                Some(ssd) => {
                    // Whether a leaf ending at `high` ends at or before the cursor.
                    let behind = |high: &Option<crate::btree::Fence>| {
                        high.as_ref()
                            .is_some_and(|h| cursor.as_slice() >= h.as_ref())
                    };
                    let ssd_stale = ssd_chunk
                        .as_ref()
                        .is_none_or(|((_, high), proof)| behind(high) || !ssd.still_current(proof));
                    if ssd_stale {
                        let (entries, high, proof) = ssd.scan_leaf(&cursor, end, now);
                        ssd_chunk = Some(((entries, high), proof));
                    }
                    let large = inner.large.as_ref().filter(|lo| !lo.is_empty());
                    if let Some(lo) =
                        large.filter(|_| lo_chunk.as_ref().is_none_or(|(_, high)| behind(high)))
                    {
                        lo_chunk = Some(lo.scan_leaf(&cursor, end, now));
                    }
                    let ((ssd_entries, ssd_next), _) = ssd_chunk.as_ref().expect("just filled");
                    let lo_part = large.and(lo_chunk.as_ref());
                    // This step covers keys below whichever leaf ends first.
                    let mut next = dram_next.clone();
                    for other in [
                        Some(ssd_next.clone()),
                        lo_part.map(|(_, high)| high.clone()),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        next = match (next, other) {
                            (Some(a), Some(b)) => Some(if a <= b { a } else { b }),
                            (a, b) => a.or(b),
                        };
                    }
                    let below = |k: &[u8]| {
                        next.as_ref().is_none_or(|n| k < n.as_ref()) && k >= cursor.as_slice()
                    };
                    // A DRAM leaf that lost its page may have hidden any of these.
                    let mut merged: std::collections::BTreeMap<Vec<u8>, _> = ssd_entries
                        .iter()
                        .filter(|(k, _)| below(k) && !dram_lost)
                        .map(|(k, v)| {
                            let found = v.clone().map(|(value, meta)| Found::Value(value, meta));
                            (k.clone(), found)
                        })
                        .collect();
                    // A large version is newer than any SSD copy (writing it deleted them) ...
                    let mut large_keys = std::collections::BTreeSet::new();
                    for (k, entry) in lo_part
                        .into_iter()
                        .flat_map(|(e, _)| e.iter())
                        .filter(|(k, _)| below(k))
                    {
                        large_keys.insert(k.clone());
                        merged.insert(k.clone(), Some(Found::Large(*entry)));
                    }
                    // ... and DRAM holds the newest of all, except that its tombstone for a
                    // large object's key only hides the small versions below it.
                    for (k, v) in dram_found.filter(|(k, _)| below(k)) {
                        if v.is_some() || !large_keys.contains(&k) {
                            merged.insert(k, v);
                        }
                    }
                    (merged.into_iter().collect(), next)
                }
            };
            for (key, version) in entries {
                if let Some(found) = version {
                    // Only DRAM's version of a key can be in `access`: DRAM's wins.
                    let state = access.get(&key).copied();
                    if visit(key, found, state).is_break() {
                        return;
                    }
                }
            }
            let Some(next) = next else { return };
            let past_end = match end {
                Bound::Included(e) => next.as_ref() > e,
                Bound::Excluded(e) => next.as_ref() >= e,
                Bound::Unbounded => false,
            };
            if past_end {
                return;
            }
            cursor = next.to_vec();
        }
    }
}

/// A scan step's entries from one leaf of a lower tree, and where that leaf ends.
type Chunk<E> = (Vec<E>, Option<crate::btree::Fence>);

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use zipcache_device::{BlockDevice, MemDevice};

    use crate::{Config, ItemInfo, PutOptions, ZipCache};

    const LARGE: usize = 16 << 10;

    /// A hybrid engine holding `key:00`…`key:39`: the even ones large (BT_LO), the odd
    /// ones small, every fifth one with flags, a CAS and an expiry far off; plus a
    /// deleted large key and an expired small one.
    fn engine() -> ZipCache {
        let config = Config {
            dram_capacity: 8 << 20,
            ..Config::default()
        };
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 14));
        let cache = ZipCache::open_on(config, Some(device)).unwrap();
        for i in 0..40u8 {
            let len = if i.is_multiple_of(2) { LARGE } else { 100 };
            let options = PutOptions {
                flags: u32::from(i),
                assign_cas: i.is_multiple_of(5),
                expires_at_ms: (i.is_multiple_of(5)).then(|| cache.now_ms() + 3_600_000),
                ..PutOptions::default()
            };
            cache
                .put_with(format!("key:{i:02}").as_bytes(), &vec![i; len], options)
                .unwrap();
        }
        cache.put(b"key:20a", &[1; LARGE], None).unwrap();
        cache.delete(b"key:20a").unwrap();
        cache
            .put(b"key:21a", b"brief", Some(Duration::from_millis(1)))
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        cache
    }

    fn large_reads(cache: &ZipCache) -> u64 {
        let lo = cache.inner.large.as_ref().expect("a hybrid engine");
        lo.counters.gets.load(Ordering::Relaxed)
    }

    fn all() -> std::ops::RangeFull {
        ..
    }

    /// A listing reads no large value, and reports what a scan with values reports of
    /// each object but the value.
    #[test]
    fn scan_keys_lists_without_reading_values() {
        let cache = engine();
        let before = large_reads(&cache);
        let listed = cache.scan_keys::<&[u8]>(all(), 1000).unwrap();
        assert_eq!(large_reads(&cache), before, "no large object was read");
        let scanned = cache.scan::<&[u8]>(all(), 1000).unwrap();
        assert_eq!(
            scanned.len(),
            40,
            "deleted and expired objects are not listed"
        );
        let described: Vec<_> = scanned
            .iter()
            .map(|(key, item)| {
                let info = ItemInfo {
                    value_len: item.value.len(),
                    flags: item.flags,
                    cas: item.cas,
                    expires_at_ms: item.expires_at_ms,
                    access: item.access,
                    collection: item.collection,
                };
                (key.clone(), info)
            })
            .collect();
        assert_eq!(listed, described);
        for (i, (key, item)) in scanned.iter().enumerate() {
            assert_eq!(key, format!("key:{i:02}").as_bytes());
            let len = if i.is_multiple_of(2) { LARGE } else { 100 };
            assert_eq!(item.value, vec![i as u8; len]);
            assert_eq!(item.flags, i as u32);
            assert_eq!(item.cas != 0, i.is_multiple_of(5));
        }
        let some = cache
            .scan_keys(b"key:05".as_slice()..b"key:09".as_slice(), 2)
            .unwrap();
        let keys: Vec<_> = some.iter().map(|(key, _)| key.as_slice()).collect();
        assert_eq!(keys, [b"key:05", b"key:06"]);
        assert!(cache.scan_keys::<&[u8]>(all(), 0).unwrap().is_empty());
    }

    /// A scan reads the large objects it returns and no other, however many the leaf
    /// it walks holds.
    #[test]
    fn a_scan_reads_only_the_large_objects_it_returns() {
        let cache = engine();
        let before = large_reads(&cache);
        let got = cache.scan::<&[u8]>(all(), 3).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(large_reads(&cache) - before, 2, "key:00 and key:02");
    }

    /// A byte-bounded scan stops at the object that reaches its budget, and reads no
    /// large object past it.
    #[test]
    fn scan_bytes_stops_at_the_object_that_reaches_the_budget() {
        let cache = engine();
        let object = |i: usize| "key:00".len() + if i.is_multiple_of(2) { LARGE } else { 100 };
        for max_bytes in [1, LARGE, LARGE + 6, 2 * LARGE, 5 * LARGE, usize::MAX] {
            let before = large_reads(&cache);
            let got = cache.scan_bytes::<&[u8]>(all(), 1000, max_bytes).unwrap();
            let mut want = 0;
            let mut bytes = 0;
            while want < 40 && bytes < max_bytes {
                bytes += object(want);
                want += 1;
            }
            assert_eq!(got.len(), want, "{max_bytes} bytes");
            let large = got
                .iter()
                .filter(|(_, item)| item.value.len() == LARGE)
                .count();
            assert_eq!(
                large_reads(&cache) - before,
                large as u64,
                "{max_bytes} bytes"
            );
            assert_eq!(
                got,
                cache.scan::<&[u8]>(all(), want).unwrap(),
                "the same objects as an unbounded scan"
            );
        }
        assert!(
            cache
                .scan_bytes::<&[u8]>(all(), 1000, 0)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            cache
                .scan_bytes::<&[u8]>(all(), 2, usize::MAX)
                .unwrap()
                .len(),
            2
        );
    }
}
