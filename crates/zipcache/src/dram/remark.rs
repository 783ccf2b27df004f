//! The DRAM tier's marks in the crash journal's shadow table (`restart/shadow.rs`): a
//! write marks its key if the SSD tier may hold it (`Marking`); and marking every dirty
//! object's key again, so that a table which overflowed (`INCOMPLETE`) can be trusted
//! once more (`Shadow::finish_heal`).
//!
//! Thread: the housekeeper's (`cache/background.rs`). The walk goes through the key space
//! in order, one leaf at a time, locked shared, so no write or eviction of the leaf runs
//! while its keys are marked. A key never leaves its place in the key space: whatever
//! leaf holds it later (a split, a share), the walk either passed it — and marked it
//! under the lock — or reaches it still. The heal began before the walk (`begin_heal`),
//! so every write after the walk passed a key marks it itself (`append_locked`), or
//! finds no room, which `Shadow::finish_heal` then sees.

use std::sync::Arc;

use super::DramTier;
use crate::restart::shadow::{MayBeOnFlash, Shadow};

/// Where the DRAM tier marks its writes: `table`, for the keys `flash` may hold. A key
/// the SSD tier certainly does not hold (new keys, most of a fill) has no flash version a
/// crash could bring back, so its writes cost no mark, and the table holds only the keys
/// whose older versions are on flash.
pub(super) struct Marking {
    pub(super) table: Arc<Shadow>,
    pub(super) flash: Arc<dyn MayBeOnFlash>,
}

impl Marking {
    /// Marks `key` if flash may hold it; false only if it needed a mark and found no room.
    pub(super) fn mark(&self, key: &[u8]) -> bool {
        !self.flash.may_be_on_flash(key) || self.table.mark(key)
    }
}

impl DramTier {
    /// Marks the key of every object not known to be on flash as it is (a value written
    /// here, a tombstone, an expired value) that the SSD tier may hold, leaf by leaf in
    /// key order; false as soon as
    /// one finds no room in the table, or a leaf lost its page. True without a table.
    pub(crate) fn remark_dirty(&self, now_ms: u64) -> bool {
        let Some(marking) = &self.marking else {
            return true;
        };
        let mut cursor = Vec::new();
        loop {
            let (marked, next) = self.read_leaf(&cursor, |leaf, st| {
                // A leaf whose page was damaged no longer knows its keys: no heal until
                // its eviction has dropped the flash versions of its range (`forget`).
                let marked = !leaf.lost()
                    && self
                        .entries(leaf, st, now_ms, None)
                        .iter()
                        .filter(|(_, version)| version.as_ref().is_none_or(|(_, meta)| !meta.clean))
                        .all(|(key, _)| marking.mark(key));
                // The leaf's high fence cannot move while it is locked.
                (marked, self.tree.next_leaf(&cursor).map(|(next, _)| next))
            });
            match (marked, next) {
                (false, _) => return false,
                (true, Some(next)) => cursor = next.to_vec(),
                (true, None) => return true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::leaf::LOST;
    use super::super::test_support::{EveryKey, key, settings, tier_with};
    use super::MayBeOnFlash;
    use crate::record::Meta;
    use crate::restart::shadow::{HEALING, INCOMPLETE, Shadow};

    /// Values written here and tombstones are dirty; a third of the values are clean
    /// copies (promotions), and every seventh key is deleted after.
    fn fill(dram: &super::DramTier) {
        let clean = Meta {
            clean: true,
            ..Meta::default()
        };
        for i in 0..300u32 {
            let meta = if i % 3 == 0 { clean } else { Meta::default() };
            dram.put_with(&key(i), Some(b"value"), meta, None, 0, |_| ());
        }
        for i in (0..300u32).step_by(7) {
            dram.put_with(&key(i), None, Meta::default(), None, 0, |_| ());
        }
    }

    /// A put that changes BT_LO too (`alongside`: a large version logged, or one
    /// dropped) finds its key marked already (a DELETE marks in its own `alongside`,
    /// after it has asked the SSD whether the key was there, `ZipCache::delete`): a kill between BT_LO's log record and the
    /// mark would leave the key's older small version on flash unhidden, served once
    /// the large version expires or leaves BT_LO. A clean copy marks nothing.
    #[test]
    fn a_write_marks_its_key_before_bt_lo_hears_of_it() {
        let (dram, _) = tier_with(settings(256));
        let shadow = Arc::new(Shadow::in_memory(64, &[]));
        let dram = dram.with_shadow(shadow.clone(), Arc::new(EveryKey));
        let large_put = dram.put_with(&key(1), None, Meta::default(), None, 0, |_| {
            shadow.contains(&key(1))
        });
        let small_put = dram.put_with(&key(2), Some(b"v"), Meta::default(), None, 0, |_| {
            shadow.contains(&key(2))
        });
        assert_eq!((large_put, small_put), (true, true));
        let clean = Meta {
            clean: true,
            ..Meta::default()
        };
        dram.put_with(&key(4), Some(b"v"), clean, None, 0, |_| ());
        assert!(!shadow.contains(&key(4)), "a promotion hides nothing");
    }

    /// Flash holding the even keys only.
    struct EvenKeys;

    impl MayBeOnFlash for EvenKeys {
        fn may_be_on_flash(&self, k: &[u8]) -> bool {
            (0..300u32).step_by(2).any(|i| key(i) == k)
        }
    }

    /// A write of a key the SSD tier certainly does not hold has no older flash version
    /// to hide: it is not marked, not by the write nor by the walk that marks again;
    /// every write of a key it may hold is.
    #[test]
    fn only_keys_flash_may_hold_are_marked() {
        let (dram, _) = tier_with(settings(256));
        let shadow = Arc::new(Shadow::in_memory(1 << 8, &[]));
        let dram = dram.with_shadow(shadow.clone(), Arc::new(EvenKeys));
        fill(&dram);
        let marked = |i: u32| shadow.contains(&key(i));
        let dirty = |i: u32| !i.is_multiple_of(3) || i.is_multiple_of(7);
        for i in 0..300u32 {
            assert_eq!(marked(i), i % 2 == 0 && dirty(i), "key {i}");
        }
        shadow.reset();
        assert!(dram.remark_dirty(0));
        for i in 0..300u32 {
            assert_eq!(marked(i), i % 2 == 0 && dirty(i), "key {i}, marked again");
        }
    }

    /// A table too small for a fill overflows, and marking again cannot heal it; nor
    /// can a heal clear a mark's failure it did not see.
    #[test]
    fn a_table_without_room_stays_incomplete() {
        let (dram, _) = tier_with(settings(256));
        let shadow = Arc::new(Shadow::in_memory(4, &[]));
        let dram = dram.with_shadow(shadow.clone(), Arc::new(EveryKey));
        fill(&dram);
        assert!(shadow.overflowed(), "200 dirty keys in 32 slots overflow");
        let watching = shadow.begin_heal().unwrap();
        assert!(
            !dram.remark_dirty(0),
            "the table still has no room for them"
        );
        assert_ne!(
            shadow.flags(),
            watching,
            "the walk's marks found no room either"
        );
        assert!(!shadow.finish_heal(watching, false));
        assert_eq!(shadow.flags() & (INCOMPLETE | HEALING), INCOMPLETE);
    }

    /// Emptied (as the evictions that write keys down empty it) and marked again, the
    /// table names every dirty key and none of the clean copies, and heals.
    #[test]
    fn marking_again_names_every_dirty_key_and_heals_the_table() {
        let (dram, _) = tier_with(settings(256));
        let shadow = Arc::new(Shadow::in_memory(1 << 8, &[]));
        let dram = dram.with_shadow(shadow.clone(), Arc::new(EveryKey));
        fill(&dram);
        for i in 0..300u32 {
            shadow.clear(&key(i));
        }
        shadow.set_flag(INCOMPLETE, true);
        assert!(!dram.remark_dirty(0), "no heal watches: nothing is marked");
        assert!((0..300u32).all(|i| !shadow.contains(&key(i))));
        let watching = shadow.begin_heal().unwrap();
        assert!(dram.remark_dirty(0));
        for i in 0..300u32 {
            let dirty = i % 3 != 0 || i % 7 == 0;
            assert_eq!(shadow.contains(&key(i)), dirty, "key {i}");
        }
        assert!(shadow.finish_heal(watching, true));
        assert!(!shadow.overflowed());
        assert_eq!(shadow.flags() & HEALING, 0);
        assert_eq!(shadow.heals(), 1);
    }

    /// While the table is incomplete and no heal watches, writes leave it as it is; from
    /// the start of a heal they mark again, so that a write the walk already passed is
    /// in the table when the heal ends.
    #[test]
    fn writes_mark_again_once_a_heal_begins() {
        let (dram, _) = tier_with(settings(256));
        let shadow = Arc::new(Shadow::in_memory(1 << 8, &[]));
        let dram = dram.with_shadow(shadow.clone(), Arc::new(EveryKey));
        shadow.set_flag(INCOMPLETE, true);
        let put = |i: u32| dram.put_with(&key(i), Some(b"v"), Meta::default(), None, 0, |_| ());
        put(1);
        assert!(!shadow.contains(&key(1)));
        let watching = shadow.begin_heal().unwrap();
        assert!(shadow.begin_heal().is_none(), "one heal at a time");
        assert!(dram.remark_dirty(0));
        put(2);
        assert!(shadow.contains(&key(1)) && shadow.contains(&key(2)));
        assert!(shadow.finish_heal(watching, true));
        put(3);
        assert!(shadow.contains(&key(3)), "a whole table takes every mark");
    }

    /// A medium value promoted as a clean copy, then ended by an expire (a write of the
    /// same value with a past expiry): the expired version is dirty, and its key is
    /// marked again — in the write buffer and after the merge into the page.
    #[test]
    fn an_expired_medium_value_over_its_clean_copy_is_marked_again() {
        let (dram, _) = tier_with(settings(4096));
        let shadow = Arc::new(Shadow::in_memory(1 << 8, &[]));
        let dram = dram.with_shadow(shadow.clone(), Arc::new(EveryKey));
        let value = vec![b'm'; 600];
        let clean = Meta {
            clean: true,
            ..Meta::default()
        };
        let expired = Meta {
            expires_at_ms: Some(500),
            ..Meta::default()
        };
        for merged in [false, true] {
            dram.put_with(&key(1), Some(&value), clean, None, 0, |_| ());
            dram.put_with(&key(1), Some(&value), expired, None, 1_000, |_| ());
            if merged {
                dram.merge_all(1_000);
            }
            shadow.clear(&key(1));
            assert!(dram.remark_dirty(1_000));
            assert!(shadow.contains(&key(1)), "merged: {merged}");
        }
    }

    /// A leaf that lost its page cannot say which keys DRAM held newer than flash: the
    /// table does not heal while it is there.
    #[test]
    fn a_leaf_that_lost_its_page_keeps_the_table_incomplete() {
        let (dram, _) = tier_with(settings(256));
        let shadow = Arc::new(Shadow::in_memory(1 << 8, &[]));
        let dram = dram.with_shadow(shadow.clone(), Arc::new(EveryKey));
        fill(&dram);
        dram.write_leaf(&key(0), |_, leaf, _| {
            leaf.set(LOST, true);
        });
        shadow.set_flag(INCOMPLETE, true);
        assert!(!dram.remark_dirty(0));
    }
}
