//! Slot space and SSD-tier eviction: super-leaves take whole slots of `m` blocks; when
//! slots or the device's physical space run short, cold super-leaves leave (CLOCK over
//! super-leaves, referenced by SSD hits), are trimmed, and hand their key range to their
//! left neighbour.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{SlState, SsdTier, SuperLeaf};
use crate::btree::Fence;

/// Start evicting super-leaves when physical use passes this share of the device.
const PHYSICAL_HIGH: f64 = 0.90;
/// ... and stop when it is back under this one.
const PHYSICAL_LOW: f64 = 0.85;

pub(super) struct Writer {
    pub(super) free_slots: Vec<u32>,
    pub(super) next_slot: u32,
    /// Low fence of the super-leaf the CLOCK hand points at.
    pub(super) hand: Fence,
    /// Descriptor log records of this turn, appended at its end (`journal.rs`).
    pub(super) log: Vec<u8>,
}

impl SsdTier {
    /// A free slot, if any is left (see `reserve`).
    pub(super) fn allocate(&self, w: &mut Writer) -> Option<u32> {
        if let Some(slot) = w.free_slots.pop() {
            return Some(slot);
        }
        (w.next_slot < self.max_slots).then(|| {
            w.next_slot += 1;
            w.next_slot - 1
        })
    }

    /// Evicts cold super-leaves until `n` slots are free. Called with no super-leaf
    /// locked: the victim could be the very super-leaf about to be written.
    pub(super) fn reserve(&self, w: &mut Writer, n: usize) {
        let free = |w: &Writer| w.free_slots.len() + (self.max_slots - w.next_slot) as usize;
        let mut attempts = self.tree.leaf_count() + 1;
        while free(w) < n && attempts > 0 && self.evict_one(w) {
            attempts -= 1;
        }
    }

    /// Frees physical space when the emulated SSD passes its high watermark.
    pub(super) fn relieve_physical(&self, w: &mut Writer) {
        let stats = self.device.stats();
        if stats.physical_capacity == 0 {
            return;
        }
        let high = (stats.physical_capacity as f64 * PHYSICAL_HIGH) as u64;
        let low = (stats.physical_capacity as f64 * PHYSICAL_LOW) as u64;
        if stats.physical_used <= high {
            return;
        }
        let mut used = stats.physical_used;
        let mut attempts = self.tree.leaf_count() * 2;
        while used > low && attempts > 0 {
            self.evict_one(w);
            // The emulator accounts trims at once (only writes are compressed later).
            used = self.device.stats().physical_used;
            attempts -= 1;
        }
    }

    /// Evicts one super-leaf chosen by CLOCK: trims its blocks and frees its slot.
    ///
    /// The eviction reaches the descriptor log before the writer goes on: the freed slot
    /// and the range the left neighbour takes over are written next (a split's new
    /// super-leaf, merges of the widened range). Were those blocks written while the
    /// log still named the evicted super-leaf, a crash would bring it back, reading
    /// another super-leaf's blocks as its own (both born of a split, the same slot and
    /// generation 0), or the neighbour would come back narrower, its blocks holding keys
    /// of the range it had taken over — versions a later eviction could widen it over
    /// again and serve, though newer ones were written since.
    pub(super) fn evict_one(&self, w: &mut Writer) -> bool {
        let budget = 2 * self.tree.leaf_count() + 2;
        for _ in 0..budget {
            let (low, leaf) = self.tree.clock_step(&mut w.hand);
            if leaf.referenced.swap(false, Ordering::Relaxed) {
                continue;
            }
            if self.evict_superleaf_for_room(w, &low, &leaf) {
                // may do I/O: a write(2) to tmpfs
                self.publish(w);
                return true;
            }
        }
        false
    }

    /// `evict_superleaf`, counted as an eviction: its objects are forgotten to make room
    /// (by CLOCK, or because the DRAM tier dropped the range's newest versions unwritten).
    pub(super) fn evict_superleaf_for_room(
        &self,
        w: &mut Writer,
        low: &Fence,
        leaf: &Arc<SuperLeaf>,
    ) -> bool {
        let Some(objects) = self.evict_superleaf(w, low, leaf) else {
            return false;
        };
        self.counters
            .evicted_superleaves
            .fetch_add(1, Ordering::Relaxed);
        self.counters
            .evicted_objects
            .fetch_add(objects, Ordering::Relaxed);
        true
    }

    /// Trims a super-leaf and frees its slot; the objects it held, or `None` if it could
    /// not go.
    pub(super) fn evict_superleaf(
        &self,
        w: &mut Writer,
        low: &Fence,
        leaf: &Arc<SuperLeaf>,
    ) -> Option<u64> {
        let mut released = 0;
        let mut release = |st: &mut SlState, w: &mut Writer| {
            if let Some(slot) = st.slot.take() {
                let _ = self
                    .device
                    .trim(self.lba(slot, 0), self.settings.subpages as u64);
                w.free_slots.push(slot);
                self.counters.occupied.fetch_sub(1, Ordering::Relaxed);
            }
            let objects: i64 = st.counts.iter().map(|&c| i64::from(c)).sum();
            self.counters.objects.fetch_sub(objects, Ordering::Relaxed);
            released = objects.max(0) as u64;
            st.counts.iter_mut().for_each(|c| *c = 0);
            for dictionary in st.dictionaries.iter_mut() {
                // may do I/O: a dictionary no block names any more loses its file
                self.dictionaries.count(std::mem::take(dictionary), 0);
            }
            if let Some(filters) = &mut st.filters {
                filters.fill(0);
            }
            st.version += 1;
        };
        if low.is_empty() {
            let mut st = leaf.state.write();
            st.slot?;
            release(&mut st, w);
            self.log_upsert(w, &st);
            return Some(released);
        }
        let delta = self
            .tree
            .retire(low, leaf, |l| &l.state, |st| release(st, w))?;
        self.log_remove(w, low);
        self.counters.superleaves.fetch_sub(1, Ordering::Relaxed);
        self.memory
            .change_index(delta - self.settings.descriptor_bytes() as i64);
        Some(released)
    }

    /// Evicts the coldest super-leaf (CLOCK), shrinking the DRAM index by its descriptor;
    /// false if none can go.
    pub fn give_up_one(&self) -> bool {
        let mut w = self.writer.lock();
        let evicted = self.tree.leaf_count() > 1 && self.evict_one(&mut w);
        self.publish(&mut w);
        evicted
    }

    /// Forgets every object (memcached `flush_all`).
    pub fn clear(&self) {
        let mut w = self.writer.lock();
        while self.tree.leaf_count() > 1 {
            let Some((low, leaf)) = self.tree.next_leaf(&[]) else {
                break;
            };
            if self.evict_superleaf(&mut w, &low, &leaf).is_none() {
                break;
            }
        }
        let (low, first) = self.tree.find(&[]);
        self.evict_superleaf(&mut w, &low, &first);
        self.publish(&mut w);
    }
}

#[cfg(test)]
mod tests {
    use zipcache_device::{BlockDevice, MemDevice};

    use super::super::test_support::*;
    use super::*;

    /// The slots of the super-leaves that hold one and the free list are exactly the
    /// slots handed out so far, each once; the occupied count matches.
    fn check_slots(ssd: &SsdTier) {
        let w = ssd.writer.lock();
        let mut held = Vec::new();
        ssd.tree
            .for_each_leaf(|_, leaf| held.extend(leaf.state.read().slot));
        assert_eq!(
            held.len() as i64,
            ssd.counters.occupied.load(Ordering::Relaxed)
        );
        let mut all: Vec<u32> = held.iter().chain(&w.free_slots).copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..w.next_slot).collect::<Vec<_>>(),
            "held {held:?}, free {:?}",
            w.free_slots
        );
        assert!(w.next_slot <= ssd.max_slots);
    }

    #[test]
    fn every_slot_handed_out_is_held_once_or_free() {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 8));
        let ssd = tier_on(device, settings(8));
        for round in 0..40u32 {
            absorb(&ssd, (0..30).map(|i| (i * 40 + round) * 7919 % 100_000));
            check_slots(&ssd);
        }
        assert!(ssd.tree.leaf_count() > 1, "super-leaves split");
        assert!(
            ssd.counters.evicted_superleaves.load(Ordering::Relaxed) > 0,
            "slots ran short"
        );
        assert!(ssd.give_up_one());
        check_slots(&ssd);
        ssd.clear();
        check_slots(&ssd);
        assert_eq!(ssd.tree.leaf_count(), 1);
        assert_eq!(ssd.counters.occupied.load(Ordering::Relaxed), 0);
        assert_eq!(ssd.counters.objects.load(Ordering::Relaxed), 0);
        let w = ssd.writer.lock();
        assert_eq!(
            w.free_slots.len(),
            w.next_slot as usize,
            "every slot is free"
        );
    }
}
