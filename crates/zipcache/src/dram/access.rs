//! Per-object access state (setting `track_access`): for each object of a leaf, whether
//! a GET read it since it was written and when it was last read — memcached's fetched
//! bit and last access time, which its meta `h` and `l` flags report.
//!
//! A leaf keeps them in its boxed extras, as a table from a 64-bit key fingerprint to a
//! 32-bit stamp (12 bytes an object): pages stay as they are, and a GET updates a stamp
//! atomically under the leaf's shared lock. Which fingerprints the table holds changes
//! only under the exclusive lock: a write sets its key's stamp, a delete removes it, and
//! a merge keeps the stamps of the objects each resulting leaf holds (expired, deleted
//! and dropped objects lose theirs; a split hands them to the leaf that owns the key).
//! An object leaving DRAM takes its stamp with it.
//!
//! Two keys of one leaf with the same fingerprint would share a stamp; at 64 bits, with
//! a few dozen objects a leaf, that takes some 10^16 leaves.

use std::sync::atomic::{AtomicU32, Ordering};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::AccessState;
use crate::memory::alloc_size;

/// Independent of the sub-page hashes and the promotion filter.
const SEED: u64 = 0x6163_6365_7373_0064;

/// The stamp's fetched bit; the other 31 count whole seconds since the engine opened
/// (68 years).
const FETCHED: u32 = 1 << 31;

pub(super) fn fingerprint(key: &[u8]) -> u64 {
    xxh3_64_with_seed(key, SEED)
}

/// Access times as stamps: seconds since `origin_ms`, the engine clock at open.
#[derive(Clone, Copy, Debug)]
pub(super) struct AccessClock {
    pub(super) origin_ms: u64,
}

impl AccessClock {
    fn stamp(self, state: AccessState) -> u32 {
        let seconds = state.last_access_ms.saturating_sub(self.origin_ms) / 1000;
        let seconds = seconds.min(u64::from(!FETCHED)) as u32;
        if state.fetched {
            seconds | FETCHED
        } else {
            seconds
        }
    }

    fn state(self, stamp: u32) -> AccessState {
        AccessState {
            fetched: stamp & FETCHED != 0,
            last_access_ms: self.origin_ms + u64::from(stamp & !FETCHED) * 1000,
        }
    }
}

struct Entry {
    /// The key's fingerprint as two halves: the entry stays 12 bytes.
    fingerprint: [u32; 2],
    stamp: AtomicU32,
}

fn halves(fingerprint: u64) -> [u32; 2] {
    [(fingerprint >> 32) as u32, fingerprint as u32]
}

/// One leaf's stamps, in no particular order (a leaf holds a few dozen objects).
#[derive(Default)]
pub(super) struct AccessTable {
    entries: Vec<Entry>,
}

impl AccessTable {
    fn find(&self, fingerprint: u64) -> Option<&Entry> {
        let halves = halves(fingerprint);
        self.entries.iter().find(|e| e.fingerprint == halves)
    }

    /// The state of the object with `fingerprint`, if the table has it; unless `peek`,
    /// the object is marked fetched and accessed at `now_ms`, atomically with the read.
    pub(super) fn read(
        &self,
        clock: AccessClock,
        fingerprint: u64,
        now_ms: u64,
        peek: bool,
    ) -> Option<AccessState> {
        let stamp = &self.find(fingerprint)?.stamp;
        let before = if peek {
            stamp.load(Ordering::Relaxed)
        } else {
            let fetched_now = AccessState {
                fetched: true,
                last_access_ms: now_ms,
            };
            stamp.swap(clock.stamp(fetched_now), Ordering::Relaxed)
        };
        Some(clock.state(before))
    }

    /// Sets the state of the object with `fingerprint` (a write; the leaf is exclusive).
    pub(super) fn set(&mut self, clock: AccessClock, fingerprint: u64, state: AccessState) {
        let stamp = clock.stamp(state);
        match self.find(fingerprint) {
            Some(entry) => entry.stamp.store(stamp, Ordering::Relaxed),
            None => self.entries.push(Entry {
                fingerprint: halves(fingerprint),
                stamp: AtomicU32::new(stamp),
            }),
        }
    }

    pub(super) fn remove(&mut self, fingerprint: u64) {
        let halves = halves(fingerprint);
        if let Some(at) = self.entries.iter().position(|e| e.fingerprint == halves) {
            self.entries.swap_remove(at);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The stamps of `keys` (one leaf's objects after a merge), in a table of their own;
    /// `None` if it would be empty.
    pub(super) fn carried<'k>(
        &self,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> Option<Box<AccessTable>> {
        let mut entries: Vec<Entry> = keys
            .filter_map(|key| self.find(fingerprint(key)))
            .map(|e| Entry {
                fingerprint: e.fingerprint,
                stamp: AtomicU32::new(e.stamp.load(Ordering::Relaxed)),
            })
            .collect();
        entries.shrink_to_fit();
        (!entries.is_empty()).then(|| Box::new(AccessTable { entries }))
    }

    /// DRAM the table takes, its box included.
    pub(super) fn charge(&self) -> usize {
        alloc_size(size_of::<AccessTable>())
            + alloc_size(self.entries.capacity() * size_of::<Entry>())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{DramSettings, DramTier, Lookup};
    use super::*;
    use crate::record::Meta;

    const CLOCK: AccessClock = AccessClock {
        origin_ms: 1_700_000_000_000,
    };

    fn state(fetched: bool, last_access_ms: u64) -> AccessState {
        AccessState {
            fetched,
            last_access_ms,
        }
    }

    #[test]
    fn entries_take_12_bytes_and_stamps_keep_whole_seconds() {
        assert_eq!(size_of::<Entry>(), 12);
        let at = CLOCK.origin_ms + 5_999;
        let kept = CLOCK.state(CLOCK.stamp(state(true, at)));
        assert_eq!(kept, state(true, CLOCK.origin_ms + 5_000));
        assert_eq!(
            CLOCK.state(CLOCK.stamp(kept)),
            kept,
            "a kept state round-trips"
        );
        // A clock that went back before the origin reads as the origin.
        let early = CLOCK.stamp(state(false, 1));
        assert_eq!(CLOCK.state(early), state(false, CLOCK.origin_ms));
    }

    #[test]
    fn a_read_reports_the_state_before_it_and_a_peek_changes_nothing() {
        let mut table = AccessTable::default();
        let (a, b) = (fingerprint(b"a"), fingerprint(b"b"));
        let t0 = CLOCK.origin_ms + 10_000;
        table.set(CLOCK, a, state(false, t0));
        assert_eq!(table.read(CLOCK, b, t0, false), None);
        assert_eq!(
            table.read(CLOCK, a, t0 + 3_000, true),
            Some(state(false, t0))
        );
        assert_eq!(
            table.read(CLOCK, a, t0 + 3_000, false),
            Some(state(false, t0))
        );
        assert_eq!(
            table.read(CLOCK, a, t0 + 4_000, false),
            Some(state(true, t0 + 3_000))
        );
        table.set(CLOCK, a, state(false, t0 + 5_000));
        assert_eq!(table.entries.len(), 1, "a rewrite replaces the stamp");
        assert_eq!(
            table.read(CLOCK, a, 0, true),
            Some(state(false, t0 + 5_000))
        );
        table.set(CLOCK, b, state(true, t0));
        let carried = table.carried([&b"b"[..], b"c"].into_iter()).unwrap();
        assert_eq!(carried.read(CLOCK, b, 0, true), Some(state(true, t0)));
        assert_eq!(carried.read(CLOCK, a, 0, true), None);
        assert!(table.carried([&b"c"[..]].into_iter()).is_none());
        table.remove(a);
        table.remove(b);
        assert!(table.is_empty());
    }

    fn tracking(write_buffer: usize) -> DramTier {
        tier_with(DramSettings {
            track_access: true,
            ..settings(write_buffer)
        })
        .0
    }

    fn access(dram: &DramTier, key: &[u8], now_ms: u64, peek: bool) -> Option<AccessState> {
        match dram.get(key, now_ms, peek) {
            Lookup::Found(_, _, access) => access,
            other => panic!("{other:?}"),
        }
    }

    fn put(dram: &DramTier, key: &[u8], now_ms: u64) {
        dram.put_with(key, Some(&[7; 60]), Meta::default(), None, now_ms, |_| ());
    }

    #[test]
    fn a_hit_reports_the_state_before_it_and_a_write_starts_afresh() {
        let dram = tracking(256);
        put(&dram, b"k", 1_500);
        assert_eq!(access(&dram, b"k", 4_000, false), Some(state(false, 1_000)));
        assert_eq!(access(&dram, b"k", 6_000, true), Some(state(true, 4_000)));
        assert_eq!(access(&dram, b"k", 7_000, false), Some(state(true, 4_000)));
        assert_eq!(access(&dram, b"k", 8_000, true), Some(state(true, 7_000)));
        put(&dram, b"k", 9_000);
        assert_eq!(access(&dram, b"k", 9_000, false), Some(state(false, 9_000)));
        // A write that names the state it starts with (a touch) keeps it.
        let touched = state(true, 3_000);
        dram.put_with(
            b"k",
            Some(b"w"),
            Meta::default(),
            Some(touched),
            9_500,
            |_| (),
        );
        assert_eq!(access(&dram, b"k", 10_000, true), Some(touched));
        dram.delete(b"k", 10_000, |_| ());
        assert_eq!(dram.get(b"k", 10_000, false), Lookup::Deleted);
        put(&dram, b"k", 12_000);
        assert_eq!(
            access(&dram, b"k", 12_000, false),
            Some(state(false, 12_000))
        );
        // The merged page keeps what the buffer's writes set.
        dram.merge_all(12_000);
        assert_eq!(access(&dram, b"k", 13_000, true), Some(state(true, 12_000)));
    }

    #[test]
    fn without_tracking_no_state_is_kept() {
        let dram = tier_with(settings(256)).0;
        put(&dram, b"k", 1_000);
        assert_eq!(access(&dram, b"k", 2_000, false), None);
        dram.merge_all(2_000);
        assert_eq!(access(&dram, b"k", 3_000, false), None);
        let view = dram.view();
        let leaf = view.get(dram.leaves()[0].0).unwrap();
        assert!(
            leaf.state.read().extras.is_none(),
            "nothing kept beside the page"
        );
    }

    /// Merges that split leaves hand each object's state to the leaf that now holds it;
    /// an expired object's state goes with it.
    #[test]
    fn states_follow_their_keys_through_splits() {
        let dram = tracking(128);
        let keys = 3_000;
        for i in 0..keys {
            put(&dram, &key(i), 1_000);
        }
        for i in (0..keys).step_by(3) {
            access(&dram, &key(i), 5_000, false);
        }
        let expiring = Meta {
            expires_at_ms: Some(6_000),
            ..Meta::default()
        };
        dram.put_with(&key(1), Some(b"e"), expiring, None, 5_000, |_| ());
        dram.merge_all(7_000);
        assert!(dram.leaf_count() > 20, "{} leaves", dram.leaf_count());
        assert!(dram.counters.splits.load(Ordering::Relaxed) > 20);
        for i in (0..keys).filter(|&i| i != 1) {
            let want = if i % 3 == 0 {
                state(true, 5_000)
            } else {
                state(false, 1_000)
            };
            assert_eq!(access(&dram, &key(i), 8_000, true), Some(want), "key {i}");
        }
        let view = dram.view();
        let stamps: usize = dram
            .leaves()
            .iter()
            .filter_map(|id| {
                let st = view.get(id.0).unwrap().state.read();
                st.access_table().map(|t| t.entries.len())
            })
            .sum();
        assert_eq!(stamps, keys as usize - 1, "the expired key's state is gone");
    }
}
