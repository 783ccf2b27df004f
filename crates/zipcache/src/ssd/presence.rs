//! Presence filters: one 128-bit Bloom filter per sub-page, kept in DRAM with the
//! super-leaf descriptor, so that a GET of a key its sub-page does not hold reads no block.
//!
//! Without them every GET that misses DRAM read the key's 4 KiB sub-page whenever that
//! sub-page held anything: in the look-aside run of issue 11 (1:16), about 200 k of the
//! 520 k blocks GETs read held no copy of their key. Three bits per key of 128 give ~3 %
//! false positives at 16 objects per sub-page (the 64-byte-value case) and ~13 % at 30.
//!
//! A filter is rebuilt from the sub-page's keys whenever the sub-page is written (the
//! writer holds them all then); an empty sub-page has the empty filter. Filters are not
//! saved across a restart: a loaded descriptor starts with [`UNKNOWN`], which answers
//! "maybe" for every key, until its sub-page is written again. A filter can only skip a
//! read of a block that does not hold the key, so it can cost a read, never an answer.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::leaf_page::Geometry;
use super::{SsdTier, SuperLeaf};
use crate::btree::{BTree, Shared};
use crate::restart::shadow::MayBeOnFlash;

/// Not part of the on-SSD format: filters live in DRAM only and are rebuilt, never loaded.
const SEED: u64 = 0x5a1b_cace_0000_0b10;

/// Bits each key sets.
const BITS_PER_KEY: u32 = 3;

/// The filter that knows nothing: every key may be there.
pub(super) const UNKNOWN: u128 = u128::MAX;

/// A super-leaf's filters, one per sub-page, behind a thin pointer: a descriptor without
/// them (the setting off) stays as small as it was before there were any.
pub(super) type Filters = Box<Box<[u128]>>;

/// The bits `key` sets (double hashing over one 64-bit hash).
fn bits_of(key: &[u8]) -> u128 {
    let hash = xxh3_64_with_seed(key, SEED);
    let (first, step) = (hash as u32, (hash >> 32) as u32 | 1);
    (0..BITS_PER_KEY).fold(0, |bits, i| {
        bits | 1u128 << (first.wrapping_add(i.wrapping_mul(step)) % 128)
    })
}

/// The filter of a sub-page holding `keys`.
pub(super) fn filter_of<'k>(keys: impl IntoIterator<Item = &'k [u8]>) -> u128 {
    keys.into_iter()
        .fold(0, |filter, key| filter | bits_of(key))
}

/// False only if a sub-page with this filter certainly does not hold `key`.
pub(super) fn may_hold(filter: u128, key: &[u8]) -> bool {
    let bits = bits_of(key);
    filter & bits == bits
}

/// Which keys the tier may hold, asked without I/O: the super-leaf index and its
/// filters. The DRAM tier asks it before it marks a write in the crash journal
/// (`restart/shadow.rs`): a key the tier certainly does not hold has no flash version for
/// the write to make older. It asks under the key's DRAM leaf lock, and only an eviction
/// of that leaf, under the same lock, writes the key to the tier — so the answer holds
/// until the lock is released. Once written, the key's filter says "maybe" for good.
pub(crate) struct FlashPresence {
    tree: Arc<BTree<Arc<SuperLeaf>>>,
    geometry: Geometry,
}

impl SsdTier {
    /// The tier's answer to which keys it may hold, for the DRAM tier's marks.
    pub(crate) fn presence(&self) -> FlashPresence {
        FlashPresence {
            tree: self.tree.clone(),
            geometry: self.geometry,
        }
    }
}

impl MayBeOnFlash for FlashPresence {
    fn may_be_on_flash(&self, key: &[u8]) -> bool {
        let subpage = self.geometry.subpage_of(key);
        self.tree.with_arc_leaf_locked::<Shared, _>(key, |_, st| {
            st.slot.is_some() && st.counts[subpage] > 0 && !st.rules_out(subpage, key)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Vec<u8> {
        format!("key:{i:012}").into_bytes()
    }

    #[test]
    fn every_key_of_a_sub_page_may_be_there() {
        for n in [1, 4, 16, 30, 100] {
            let keys: Vec<Vec<u8>> = (0..n).map(|i| key(i * 7919)).collect();
            let filter = filter_of(keys.iter().map(Vec::as_slice));
            assert!(keys.iter().all(|k| may_hold(filter, k)), "{n} keys");
        }
    }

    #[test]
    fn the_empty_filter_holds_nothing_and_unknown_holds_everything() {
        for i in 0..1000 {
            assert!(!may_hold(0, &key(i)));
            assert!(may_hold(UNKNOWN, &key(i)));
        }
        assert!(may_hold(UNKNOWN, b""));
    }

    #[test]
    fn false_positives_are_rare_at_the_usual_fill() {
        // 16 keys (64-byte values at the default fill threshold): ~3 % expected.
        let keys: Vec<Vec<u8>> = (0..16).map(key).collect();
        let filter = filter_of(keys.iter().map(Vec::as_slice));
        let others = 100_000;
        let false_positives = (1_000_000..1_000_000 + others)
            .filter(|&i| may_hold(filter, &key(i)))
            .count();
        assert!(
            false_positives < others as usize / 15,
            "{false_positives} of {others}"
        );
    }
}

#[cfg(test)]
mod tier_tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use zipcache_device::{BlockDevice, MemDevice};

    use super::super::SsdSettings;
    use super::super::test_support::{absorb, key, settings, tier_on};
    use crate::restart::shadow::MayBeOnFlash;

    /// Objects 0, 2, ..., 1198 in a tier with or without filters; the device reads that
    /// GETs of the odd keys (none held) cost, and the tier's DRAM index.
    fn absent_key_reads(presence_filters: bool) -> (u64, u64) {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 64));
        let settings = SsdSettings {
            presence_filters,
            ..settings(64)
        };
        let ssd = tier_on(device.clone(), settings);
        for batch in (0..600).map(|i| i * 2).collect::<Vec<u32>>().chunks(40) {
            absorb(&ssd, batch.iter().copied());
        }
        let before = device.stats().reads;
        assert!((0..600).all(|i| ssd.get(&key(i * 2 + 1), 0).is_none()));
        (device.stats().reads - before, ssd.index_bytes())
    }

    #[test]
    fn filters_are_a_setting_that_trades_index_bytes_for_reads() {
        let (reads_with, index_with) = absent_key_reads(true);
        let (reads_without, index_without) = absent_key_reads(false);
        assert!(
            reads_with < reads_without / 5,
            "{reads_with} vs {reads_without}"
        );
        assert!(
            reads_without > 500,
            "nearly every absent key's sub-page held something"
        );
        assert!(
            index_without < index_with,
            "{index_without} vs {index_with}"
        );
    }

    #[test]
    fn a_get_of_a_key_the_ssd_does_not_hold_rarely_reads() {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 64));
        let ssd = tier_on(device.clone(), settings(64));
        let held: Vec<u32> = (0..600).map(|i| i * 2).collect();
        for batch in held.chunks(40) {
            absorb(&ssd, batch.iter().copied());
        }
        // Every object held is found (a filter never hides one)...
        let reads = |d: &Arc<dyn BlockDevice>| d.stats().reads;
        let before = reads(&device);
        let found = held
            .iter()
            .filter(|&&i| ssd.get(&key(i), 0).is_some())
            .count();
        assert_eq!(found, held.len());
        assert_eq!(reads(&device) - before, held.len() as u64);
        // ...and of the GETs of keys in the same ranges that it does not hold, few read.
        let before = reads(&device);
        let absent: Vec<u32> = (0..600).map(|i| i * 2 + 1).collect();
        assert!(absent.iter().all(|&i| ssd.get(&key(i), 0).is_none()));
        let wasted = reads(&device) - before;
        let filtered = ssd.counters.filtered_gets.load(Ordering::Relaxed);
        assert_eq!(wasted + filtered, absent.len() as u64);
        assert!(
            wasted < absent.len() as u64 / 5,
            "{wasted} reads for absent keys"
        );
    }

    /// What the DRAM tier's marks ask: an empty tier holds nothing; once written, every
    /// key held may be there (with filters or without), and with filters most keys of
    /// the same ranges that it does not hold are ruled out.
    #[test]
    fn flash_presence_answers_maybe_for_every_key_held() {
        for presence_filters in [true, false] {
            let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 64));
            let settings = SsdSettings {
                presence_filters,
                ..settings(64)
            };
            let ssd = tier_on(device, settings);
            let presence = ssd.presence();
            assert!((0..1200).all(|i| !presence.may_be_on_flash(&key(i))));
            let held: Vec<u32> = (0..600).map(|i| i * 2).collect();
            for batch in held.chunks(40) {
                absorb(&ssd, batch.iter().copied());
            }
            assert!(held.iter().all(|&i| presence.may_be_on_flash(&key(i))));
            let maybe = (0..600)
                .filter(|i| presence.may_be_on_flash(&key(i * 2 + 1)))
                .count();
            if presence_filters {
                assert!(maybe < 120, "{maybe} of 600 absent keys");
            } else {
                assert!(maybe > 500, "{maybe} of 600 absent keys");
            }
        }
    }
}
