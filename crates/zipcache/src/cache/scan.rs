//! SCAN: leaf by leaf through BT_DRAM, BT_LO and BT_SSD, merged newest first.

use std::ops::{Bound, RangeBounds};

use super::ZipCache;
use super::get::item_of;
use crate::dram::{LeafScan, ScanEntry};
use crate::ssd::Freshness;
use crate::{Item, Result};

impl ZipCache {
    /// Live objects with keys in `range`, in key order, at most `limit` of them. A scan
    /// peeks: it marks nothing read, and reports the access state DRAM keeps of its
    /// objects (setting `track_access`; `None` for the others).
    pub fn scan<K: AsRef<[u8]>>(
        &self,
        range: impl RangeBounds<K>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Item)>> {
        let inner = &self.inner;
        inner.ops.scans.incr();
        let now = inner.now();
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
        let mut out = Vec::new();
        // The SSD super-leaf and BT_LO leaf last read, kept while DRAM leaves walk
        // through their ranges. The super-leaf is read again if it was written since:
        // an eviction may have moved a newer version from a DRAM leaf read after it.
        let mut ssd_chunk: Option<(Chunk, Freshness)> = None;
        let mut lo_chunk: Option<Chunk> = None;
        while out.len() < limit {
            let LeafScan {
                entries: dram_entries,
                next: dram_next,
                lost: dram_lost,
                access,
            } = inner.dram.scan_leaf(&cursor, end, now);
            let (entries, next) = match &inner.ssd {
                None => (dram_entries, dram_next),
                Some(ssd) => {
                    let stale = |chunk: Option<&Chunk>| {
                        chunk.is_none_or(|(_, high)| {
                            high.as_ref()
                                .is_some_and(|h| cursor.as_slice() >= h.as_ref())
                        })
                    };
                    let ssd_stale = ssd_chunk.as_ref().is_none_or(|(chunk, proof)| {
                        stale(Some(chunk)) || !ssd.still_current(proof)
                    });
                    if ssd_stale {
                        let (entries, high, proof) = ssd.scan_leaf(&cursor, end, now);
                        ssd_chunk = Some(((entries, high), proof));
                    }
                    let large = inner.large.as_ref().filter(|lo| !lo.is_empty());
                    if let Some(lo) = large.filter(|_| stale(lo_chunk.as_ref())) {
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
                        .cloned()
                        .collect();
                    // A large version is newer than any SSD copy (writing it deleted them) ...
                    let mut large_keys = std::collections::BTreeSet::new();
                    for (k, v) in lo_part
                        .into_iter()
                        .flat_map(|(e, _)| e.iter())
                        .filter(|(k, _)| below(k))
                    {
                        large_keys.insert(k.clone());
                        merged.insert(k.clone(), v.clone());
                    }
                    // ... and DRAM holds the newest of all, except that its tombstone for a
                    // large object's key only hides the small versions below it.
                    for (k, v) in dram_entries.into_iter().filter(|(k, _)| below(k)) {
                        if v.is_some() || !large_keys.contains(&k) {
                            merged.insert(k, v);
                        }
                    }
                    (merged.into_iter().collect(), next)
                }
            };
            for (key, version) in entries {
                if let Some((value, meta)) = version {
                    // Only DRAM's version of a key can be in `access`: DRAM's wins.
                    let item = Item {
                        access: access.get(&key).copied(),
                        ..item_of(value, &meta)
                    };
                    out.push((key, item));
                    if out.len() == limit {
                        break;
                    }
                }
            }
            let Some(next) = next else { break };
            let past_end = match end {
                Bound::Included(e) => next.as_ref() > e,
                Bound::Excluded(e) => next.as_ref() >= e,
                Bound::Unbounded => false,
            };
            if past_end {
                break;
            }
            cursor = next.to_vec();
        }
        Ok(out)
    }
}

/// A scan step's entries from one leaf of a lower tree, and where that leaf ends.
type Chunk = (Vec<ScanEntry>, Option<crate::btree::Fence>);
