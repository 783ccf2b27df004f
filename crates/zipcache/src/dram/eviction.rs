//! Page-based eviction of DRAM leaves (paper §3.3): CLOCK over leaves, clean objects
//! first, then a group of neighbours inside the span of the SSD super-leaves the victim
//! maps to, handed to the tier below in one batch.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use parking_lot::RwLockWriteGuard;

use super::leaf::{
    DramLeaf, HOT, LOST, LeafState, RAW_BLOBS, RAW_PAGE, REFERENCED, RETIRED, UNKNOWN,
};
use super::merge::{Shed, Shedding};
use super::slots::View;
use super::{DramTier, LeafId};
use crate::btree::Fence;
use crate::eviction::{EvictedObject, EvictionSink};
use crate::record::{Meta, Payload, Record};

/// Most leaves one eviction takes (see `evict_group`): bounds how long their readers
/// wait and how much a hot neighbour can be pulled out with a cold victim.
pub(super) const MAX_EVICTION_GROUP: usize = 8;

/// Why leaves leave DRAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Departure {
    /// Evicted to make room: hot neighbours are spared, and the leaves count as evicted.
    ForRoom,
    /// `flush_all` or a clean shutdown: every leaf goes, and none is an eviction.
    Everything,
}

impl DramTier {
    /// Evicts one group of leaves around a victim chosen by CLOCK. Returns false if
    /// nothing could be evicted. With a sink, may do I/O (the SSD tier's merge).
    pub fn evict_one(&self, sink: Option<&dyn EvictionSink>, now_ms: u64) -> bool {
        // One group eviction at a time: two collapses over overlapping runs of leaves
        // would each hold leaves the other waits for.
        let evicting = self.evicting.lock();
        self.free_retired(&evicting);
        self.clock_victim(|low, id, leaf| {
            if self.drop_clean(leaf, now_ms) {
                return true;
            }
            // With a tier below, what leaves must be written: the group's one batch does it.
            if sink.is_none() && self.shed_cold(leaf, now_ms) {
                return true;
            }
            let high = self.tree.next_leaf(low).map(|(next, _)| next);
            let span = match sink {
                Some(sink) => sink.span(low, high.as_deref()),
                None => (low.clone(), high),
            };
            self.evict_group(low, id, span, Departure::ForRoom, sink, now_ms)
        })
    }

    /// Overload (the flusher is behind and DRAM is full): frees one CLOCK victim without
    /// writing anything. Its clean objects go as in `evict_one`; otherwise its objects are
    /// dropped (counted in `write_drops`) and their keys kept as tombstones
    /// (`drop_unwritten`). Never does I/O nor waits for it.
    pub fn drop_one(&self, now_ms: u64) -> bool {
        self.clock_victim(|_, _, leaf| {
            self.drop_clean(leaf, now_ms) || self.drop_unwritten(leaf, now_ms)
        })
    }

    /// Moves the CLOCK hand until `take` takes a victim: referenced leaves are spared
    /// once, hot ones for two sweeps; then, with nothing else left to take, the budget
    /// wins over the hot sub-tier. The hand's lock is not held while `take` runs, which
    /// may do I/O: a foreground `drop_one` (which locks one leaf at a time, as a merge
    /// does) must not wait behind the flusher's.
    fn clock_victim(&self, mut take: impl FnMut(&Fence, LeafId, &DramLeaf) -> bool) -> bool {
        let leaves = self.tree.leaf_count();
        for step in 0..3 * leaves + 2 {
            let spare_hot = step < 2 * leaves + 1;
            let (low, id) = self.tree.clock_step(&mut self.hand.lock());
            let view = self.view();
            let Some(leaf) = view.get(id.0) else { continue };
            if leaf.set(REFERENCED, false) || (spare_hot && leaf.hot()) {
                continue;
            }
            if take(&low, id, leaf) {
                return true;
            }
        }
        false
    }

    /// Drops a leaf's objects without handing them to the lower tier: see `drop_one`.
    /// Clean ones simply go (the SSD holds the same version; counted in `clean_dropped`).
    /// Every other key stays as a tombstone — its key and two bytes, most of the leaf
    /// freed — so that it misses instead of reaching an older copy below, while the rest
    /// of the leaf's range is still answered there; when the flusher evicts the leaf, the
    /// tombstones delete just those keys below. A leaf already down to tombstones (some
    /// still in its write buffer) or with a damaged page is emptied and marked lost
    /// instead: its keys miss, and the SSD tier forgets its whole range when the flusher
    /// evicts it. `write_drops` counts the values forgotten, never tombstones; for a
    /// damaged page, the objects its summary says it held. False if there is nothing to
    /// drop: a retired leaf, or one whose tombstones are all merged into its page.
    fn drop_unwritten(&self, leaf: &DramLeaf, now_ms: u64) -> bool {
        let mut st = leaf.state.write();
        if leaf.has(RETIRED) {
            return false;
        }
        let objects = if leaf.lost() {
            Vec::new()
        } else {
            self.export(leaf, &st, now_ms)
        };
        // Lost before, or the export just found the page damaged (and marked it lost):
        // which keys the page held is unknown, so none may reach a copy below.
        let damaged = leaf.lost();
        let values = objects.iter().filter(|o| o.value.is_some()).count() as u64;
        let keep: Vec<&EvictedObject> = objects.iter().filter(|o| !o.meta.clean).collect();
        let lose_range = damaged || values == 0;
        let buffered = st.buffer().map_or(0, |b| b.records().count() as u64);
        if lose_range && st.summary().objects + buffered == 0 {
            return false;
        }
        let (dropped, clean) = if damaged {
            (self.live_objects(leaf, &st, now_ms), 0)
        } else {
            let dirty = keep.iter().filter(|o| o.value.is_some()).count() as u64;
            (dirty, values - dirty)
        };
        self.counters
            .write_drops
            .fetch_add(dropped, Ordering::Relaxed);
        self.counters
            .clean_dropped
            .fetch_add(clean, Ordering::Relaxed);
        // Its versions are forgotten with it: none may be handed out again.
        self.raise_cas_floor(self.leaf_cas_top(&st));
        self.charged(leaf, &mut st, |st| {
            *st = LeafState::default();
            if lose_range {
                return;
            }
            let extras = st.extras.get_or_insert_default();
            extras.buffered.store(UNKNOWN, Ordering::Relaxed);
            for object in &keep {
                let tombstone = Record {
                    key: &object.key,
                    payload: Payload::Tombstone,
                    meta: Meta::default(),
                };
                // No limit: the tombstones stay until the flusher takes the leaf.
                extras.buffer.append(&tombstone, usize::MAX);
            }
            st.tidy();
        });
        leaf.set(RAW_PAGE, false);
        leaf.set(LOST, lose_range);
        true
    }

    /// Clean first: a cold leaf that holds clean objects (unchanged copies of SSD-tier
    /// objects) gives up just those, but for the most read (`ReadFrequency::keep`).
    /// Dropping them writes nothing and loses no hit (a later GET finds them on the SSD);
    /// its dirty objects stay and gather company, so that when the leaf does leave, its
    /// super-leaves are rewritten for more new objects. False if nothing clean went.
    fn drop_clean(&self, leaf: &DramLeaf, now_ms: u64) -> bool {
        let mut st = leaf.state.write();
        let buffered = st
            .buffer()
            .map_or(0, |b| b.records().filter(|r| r.meta.clean).count());
        if leaf.has(RETIRED) || st.summary().clean as usize + buffered == 0 {
            return false;
        }
        let Shedding { shed, kept } = self.merge_locked(leaf, &mut st, now_ms, Shed::Clean);
        self.counters
            .clean_dropped
            .fetch_add(shed, Ordering::Relaxed);
        self.counters
            .retained_objects
            .fetch_add(kept, Ordering::Relaxed);
        shed > 0
    }

    /// Without a tier below, a cold leaf keeps its most read objects: it is rebuilt with
    /// them alone (`ReadFrequency::keep`: at most 7/8 of its bytes, so every call frees
    /// some) and the rest are dropped, where CLOCK over whole leaves would drop them all.
    /// False if nothing is read often enough to stay: the leaf, emptied, is left for
    /// `evict_group` to take out of the tree.
    fn shed_cold(&self, leaf: &DramLeaf, now_ms: u64) -> bool {
        let mut st = leaf.state.write();
        if leaf.has(RETIRED) || leaf.lost() {
            return false;
        }
        let Shedding { shed, kept } = self.merge_locked(leaf, &mut st, now_ms, Shed::Cold);
        for counter in [
            &self.counters.evicted_objects,
            &self.counters.dropped_objects,
        ] {
            counter.fetch_add(shed, Ordering::Relaxed);
        }
        self.counters
            .retained_objects
            .fetch_add(kept, Ordering::Relaxed);
        kept > 0
    }

    /// Evicts `leaf` together with its neighbours inside `span`, the key range of the SSD
    /// super-leaves `leaf` maps to ([`EvictionSink::span`]), so that one read-modify-write
    /// of each super-leaf takes the objects of all of them: a super-leaf covers the key
    /// range of several DRAM leaves, and rewriting it once per DRAM leaf multiplies the
    /// bytes written to the SSD. Evicted for room, hot (bypassed) neighbours stay. The
    /// group's range joins the leaf left of it; the first leaf of the tree is emptied in
    /// place instead.
    fn evict_group(
        &self,
        low: &Fence,
        leaf: LeafId,
        (span_low, span_high): (Fence, Option<Fence>),
        why: Departure,
        sink: Option<&dyn EvictionSink>,
        now_ms: u64,
    ) -> bool {
        let spare_hot = why == Departure::ForRoom;
        let hot = |id: &LeafId| {
            let view = self.view();
            view.get(id.0).is_some_and(DramLeaf::hot)
        };
        let mut run = VecDeque::from([(low.clone(), leaf)]);
        while run.len() < MAX_EVICTION_GROUP && run[0].0.as_ref() > span_low.as_ref() {
            match self.tree.prev_leaf(&run[0].0) {
                Some(prev) if !(spare_hot && hot(&prev.1)) => run.push_front(prev),
                _ => break,
            }
        }
        while run.len() < MAX_EVICTION_GROUP {
            let last = &run[run.len() - 1].0;
            match self.tree.next_leaf(last) {
                Some(next)
                    if !(spare_hot && hot(&next.1))
                        && span_high.as_ref().is_none_or(|h| next.0 < *h) =>
                {
                    run.push_back(next)
                }
                _ => break,
            }
        }
        let keeps_range = match run[0].0.is_empty() {
            true => 0,
            false => match self.tree.prev_leaf(&run[0].0) {
                Some(prev) => {
                    run.push_front(prev);
                    1
                }
                None => return false,
            },
        };
        let run: Vec<_> = run.into();
        // Ids the tree named before this view was taken are all in it.
        let view = self.view();
        let Some(locks) = run
            .iter()
            .map(|(_, id)| view.get(id.0).map(|l| &l.state))
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        let leaf = |id: &LeafId| {
            view.get(id.0)
                .expect("every leaf of the run is in the view")
        };
        let removed = self.tree.collapse(&run, &locks, |states| {
            let high = self
                .tree
                .next_leaf(&run[run.len() - 1].0)
                .map(|(next, _)| next);
            let victims = &run[keeps_range..];
            if why == Departure::ForRoom {
                for ((_, id), st) in victims.iter().zip(&states[keeps_range..]) {
                    self.count_eviction(leaf(id), st, sink.is_none(), now_ms);
                }
            }
            self.hand_over(
                &view,
                victims,
                high,
                &mut states[keeps_range..],
                sink,
                now_ms,
            );
            for (_, id) in &run[1..] {
                leaf(id).set(RETIRED, true);
            }
        });
        let Some(delta) = removed else { return false };
        self.memory.change_index(delta);
        for (_, id) in &run[1..] {
            if leaf(id).set(HOT, false) {
                self.counters.hot_leaves.fetch_sub(1, Ordering::Relaxed);
            }
            if leaf(id).set(RAW_BLOBS, false) {
                self.counters
                    .hot_blob_leaves
                    .fetch_sub(1, Ordering::Relaxed);
            }
            self.memory.change_index(self.leaves.free(id.0));
        }
        true
    }

    /// Gives the objects of locked, consecutive leaves (`run`, the last one's range
    /// ending at `high`) to `sink` in one batch and empties the leaves.
    fn hand_over(
        &self,
        view: &View<DramLeaf>,
        run: &[(Fence, LeafId)],
        high: Option<Fence>,
        victims: &mut [RwLockWriteGuard<'_, LeafState>],
        sink: Option<&dyn EvictionSink>,
        now_ms: u64,
    ) {
        let leaf = |i: usize| view.get(run[i].1.0).expect("locked by the caller");
        if let Some(sink) = sink.filter(|_| !run.is_empty()) {
            for i in (0..run.len()).filter(|&i| leaf(i).lost()) {
                let high_i = run
                    .get(i + 1)
                    .map(|(f, _)| f.clone())
                    .or_else(|| high.clone());
                sink.forget(&run[i].0, high_i.as_deref());
            }
            let objects = victims
                .iter()
                .enumerate()
                .flat_map(|(i, st)| self.export(leaf(i), st, now_ms))
                .collect();
            sink.absorb(&run[0].0, high.as_deref(), objects);
        }
        for (i, st) in victims.iter_mut().enumerate() {
            self.raise_cas_floor(self.leaf_cas_top(st));
            let leaf = leaf(i);
            self.charged(leaf, st, |st| *st = LeafState::default());
            leaf.set(RAW_PAGE, false);
            leaf.set(LOST, false);
        }
    }

    /// Counts a locked leaf evicted for room; with nothing below to take its objects,
    /// they are dropped from the cache: the page's and the buffer's.
    fn count_eviction(&self, leaf: &DramLeaf, st: &LeafState, dropped: bool, now_ms: u64) {
        let objects = st.summary().objects;
        self.counters.evicted_leaves.fetch_add(1, Ordering::Relaxed);
        self.counters
            .evicted_objects
            .fetch_add(objects, Ordering::Relaxed);
        if dropped {
            self.counters
                .dropped_objects
                .fetch_add(self.live_objects(leaf, st, now_ms), Ordering::Relaxed);
            if let Some(listener) = self.eviction_listener() {
                for object in self.export(leaf, st, now_ms) {
                    if let Some(value) = &object.value {
                        let expires = object.meta.expires_at_ms;
                        listener.evicted(&object.key, value.len(), expires, now_ms);
                    }
                }
            }
        }
    }

    /// A locked leaf's live objects, as `tally` counts them: its page's summary and how
    /// its buffer changes that.
    fn live_objects(&self, leaf: &DramLeaf, st: &LeafState, now_ms: u64) -> u64 {
        let buffered =
            st.extras
                .as_ref()
                .map_or(0, |extras| match extras.buffered.load(Ordering::Relaxed) {
                    UNKNOWN => self.buffered_delta(leaf, st, &extras.buffer, now_ms),
                    known => known,
                });
        (st.summary().objects as i64 + i64::from(buffered)).max(0) as u64
    }

    /// A leaf's newest objects in key order, tombstones included.
    fn export(&self, leaf: &DramLeaf, st: &LeafState, now_ms: u64) -> Vec<EvictedObject> {
        self.entries(leaf, st, now_ms, None)
            .into_iter()
            .map(|(key, v)| match v {
                Some((value, meta)) => EvictedObject {
                    key,
                    value: Some(value),
                    meta,
                },
                None => EvictedObject {
                    key,
                    value: None,
                    meta: Meta::default(),
                },
            })
            .collect()
    }

    /// Empties the tier: every leaf's objects go to `sink` (a clean shutdown writes them
    /// to the SSD tier) or are dropped (memcached `flush_all`).
    pub fn evict_all(&self, sink: Option<&dyn EvictionSink>, now_ms: u64) {
        loop {
            let evicting = self.evicting.lock();
            self.free_retired(&evicting);
            let (low, first) = self.tree.find(&[]);
            let everything = (low.clone(), None);
            // Counted after the group left, not before: a merge that was splitting one of
            // its leaves (it holds that leaf's lock, which the group waits for) publishes
            // the new leaf before it lets go, and that leaf must go too.
            if self.evict_group(&low, first, everything, Departure::Everything, sink, now_ms)
                && self.tree.leaf_count() == 1
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::super::test_support::*;
    use super::*;
    use crate::dram::block::Block;
    use crate::dram::{DramSettings, Lookup};

    /// Clears a leaf's CLOCK bit, as a sweep of the hand would.
    fn unreference(dram: &DramTier, id: LeafId) {
        dram.view().get(id.0).unwrap().set(REFERENCED, false);
    }

    #[test]
    fn one_eviction_takes_every_leaf_of_the_sinks_span_in_one_batch() {
        let dram = tier();
        for i in 0..3000 {
            dram.put_with(&key(i), Some(&[7; 60]), Meta::default(), None, 0, |_| ());
        }
        let leaves = dram.leaf_count();
        assert!(leaves > 20, "{leaves} leaves");
        // The span covers keys [1000, 1600): the leaves inside it leave together.
        let sink = RecordingSink {
            span: (
                Fence::from(&key(1000)[..]),
                Some(Fence::from(&key(1600)[..])),
            ),
            batches: Mutex::default(),
        };
        let (low, victim) = dram.tree.find(&key(1300));
        unreference(&dram, victim);
        *dram.hand.lock() = low;
        assert!(dram.evict_one(Some(&sink), 0));
        let batches = sink.batches.lock();
        assert_eq!(batches.len(), 1, "one batch for the whole group");
        let keys: Vec<&[u8]> = batches[0].iter().map(|o| o.key.as_slice()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "in key order");
        assert!(keys.contains(&key(1300).as_slice()));
        let evicted = leaves - dram.leaf_count();
        assert!(
            (2..=MAX_EVICTION_GROUP as u64).contains(&evicted),
            "{evicted} leaves evicted"
        );
        // What left is gone from DRAM, everything else is still there.
        for i in 0..3000 {
            let gone = keys.contains(&key(i).as_slice());
            let found = matches!(dram.get(&key(i), 0, false), Lookup::Found(..));
            assert_eq!(found, !gone, "key {i}");
        }
        // The leaves outside the span are untouched: every evicted key is inside it,
        // apart from the straddling leaves at its two ends.
        let inside = |k: &[u8]| (&key(900)[..]..&key(1700)[..]).contains(&k);
        assert!(keys.iter().all(|k| inside(k)));
    }

    #[test]
    fn hot_neighbours_are_spared() {
        let dram = tier();
        for i in 0..3000 {
            dram.put_with(&key(i), Some(&[7; 60]), Meta::default(), None, 0, |_| ());
        }
        let sink = RecordingSink {
            span: (Fence::from(&[][..]), None),
            batches: Mutex::default(),
        };
        let (low, victim) = dram.tree.find(&key(1300));
        let (right_first, right) = dram.tree.next_leaf(&low).unwrap();
        dram.set_heat(
            dram.view().get(right.0).unwrap(),
            super::super::hot::Heat::Hot,
        );
        unreference(&dram, victim);
        *dram.hand.lock() = low;
        assert!(dram.evict_one(Some(&sink), 0));
        assert!(!dram.view().get(right.0).unwrap().has(RETIRED));
        assert!(dram.tree.routes_to(&right_first, &right));
        assert!(
            sink.batches.lock()[0]
                .iter()
                .all(|o| o.key.as_slice() < right_first.as_ref())
        );
    }

    /// A tier holding objects 0..10 of 40 bytes, the even ones clean (copies of SSD
    /// objects, as promotion leaves them), the odd ones dirty.
    fn half_clean() -> DramTier {
        let dram = tier();
        let clean = Meta {
            clean: true,
            ..Meta::default()
        };
        for i in 0..10 {
            let meta = if i % 2 == 0 { clean } else { Meta::default() };
            dram.put_with(&key(i), Some(&[i as u8; 40]), meta, None, 0, |_| ());
        }
        dram
    }

    #[test]
    fn clean_objects_leave_first_and_without_a_write() {
        let dram = half_clean();
        let sink = RecordingSink {
            span: (Fence::from(&[][..]), None),
            batches: Mutex::default(),
        };
        assert!(dram.evict_one(Some(&sink), 0));
        assert!(
            sink.batches.lock().is_empty(),
            "dropping clean objects writes nothing"
        );
        assert_eq!(dram.counters.clean_dropped.load(Ordering::Relaxed), 5);
        for i in 0..10 {
            let found = matches!(dram.get(&key(i), 0, false), Lookup::Found(..));
            assert_eq!(found, i % 2 == 1, "key {i}");
        }
        // Nothing clean is left: the next eviction hands the dirty objects over.
        unreference(&dram, dram.tree.find(&[]).1);
        assert!(dram.evict_one(Some(&sink), 0));
        let batches = sink.batches.lock();
        let keys: Vec<Vec<u8>> = batches[0].iter().map(|o| o.key.clone()).collect();
        assert_eq!(
            keys,
            (0..10).filter(|i| i % 2 == 1).map(key).collect::<Vec<_>>()
        );
    }

    /// A tier with nothing below it: eviction drops what leaves.
    fn dram_only(write_buffer: usize) -> DramTier {
        let (dram, _) = tier_with(DramSettings {
            keep_tombstones: false,
            ..settings(write_buffer)
        });
        dram
    }

    /// Keys 0..40 in one leaf, key i with CAS version `1 << 40 | i`.
    /// Objects `keys`, each a 40-byte value of its own number.
    fn put_40_byte_values(dram: &DramTier, keys: std::ops::Range<u32>) {
        for i in keys {
            dram.put_with(
                &key(i),
                Some(&[i as u8; 40]),
                Meta::default(),
                None,
                0,
                |_| (),
            );
        }
    }

    fn one_leaf_of_40(dram: &DramTier) {
        for i in 0..40 {
            let meta = Meta {
                cas: 1 << 40 | u64::from(i),
                ..Meta::default()
            };
            dram.put_with(&key(i), Some(&[i as u8; 40]), meta, None, 0, |_| ());
        }
        dram.merge_all(0);
        assert_eq!(dram.leaf_count(), 1);
    }

    fn found(dram: &DramTier, i: u32) -> Option<Vec<u8>> {
        match dram.get(&key(i), 0, false) {
            Lookup::Found(value, _, _) => Some(value),
            _ => None,
        }
    }

    /// Objects evicted, dropped and retained, leaves evicted, and objects left.
    fn eviction_counts(dram: &DramTier) -> (u64, u64, u64, u64, i64) {
        let c = &dram.counters;
        (
            c.evicted_objects.load(Ordering::Relaxed),
            c.dropped_objects.load(Ordering::Relaxed),
            c.retained_objects.load(Ordering::Relaxed),
            c.evicted_leaves.load(Ordering::Relaxed),
            dram.tally(0).objects,
        )
    }

    #[test]
    fn a_hot_object_stays_when_its_cold_leaf_is_evicted() {
        let dram = dram_only(0);
        one_leaf_of_40(&dram);
        for _ in 0..3 {
            assert!(found(&dram, 7).is_some());
        }
        unreference(&dram, dram.tree.find(&[]).1);
        assert!(dram.evict_one(None, 0));
        // evicted, dropped, retained objects; evicted leaves; objects left
        assert_eq!(eviction_counts(&dram), (39, 39, 1, 0, 1));
        // Read after the eviction (which the sketch counts, so last).
        for i in 0..40 {
            assert_eq!(found(&dram, i).is_some(), i == 7, "key {i}");
        }
        // The dropped versions are never handed out again.
        assert!(dram.cas_floor.load(Ordering::Relaxed) > 1 << 40 | 39);
    }

    #[test]
    fn a_leaf_of_nothing_hot_goes_whole() {
        let dram = dram_only(0);
        one_leaf_of_40(&dram);
        assert!(found(&dram, 7).is_some(), "read once: not hot");
        unreference(&dram, dram.tree.find(&[]).1);
        assert!(dram.evict_one(None, 0));
        assert_eq!(eviction_counts(&dram), (40, 40, 0, 1, 0));
    }

    /// Collects what an eviction listener is told, listening while `on`.
    #[derive(Default)]
    struct Evictions {
        on: std::sync::atomic::AtomicBool,
        keys: Mutex<Vec<(Vec<u8>, usize)>>,
    }

    impl crate::EvictionListener for Evictions {
        fn listening(&self) -> bool {
            self.on.load(Ordering::Relaxed)
        }
        fn evicted(&self, key: &[u8], value_len: usize, _: Option<u64>, _: u64) {
            self.keys.lock().push((key.to_vec(), value_len));
        }
    }

    fn listened(dram: &DramTier, on: bool) -> std::sync::Arc<Evictions> {
        let evictions = std::sync::Arc::new(Evictions::default());
        evictions.on.store(on, Ordering::Relaxed);
        *dram.eviction_listener.write() = Some(evictions.clone());
        evictions
    }

    /// The listener hears of exactly the values that left, whether a cold leaf sheds
    /// some or goes whole, and of nothing while it does not listen.
    #[test]
    fn the_eviction_listener_hears_of_each_value_dropped() {
        for (hot_key, expected) in [(Some(7), 39), (None, 40)] {
            let dram = dram_only(0);
            let evictions = listened(&dram, true);
            one_leaf_of_40(&dram);
            let reads = if hot_key.is_some() { 3 } else { 1 };
            for _ in 0..reads {
                assert!(found(&dram, 7).is_some());
            }
            unreference(&dram, dram.tree.find(&[]).1);
            assert!(dram.evict_one(None, 0));
            let heard = evictions.keys.lock().clone();
            assert_eq!(heard.len(), expected);
            for i in 0..40 {
                let reported = heard.contains(&(key(i), 40));
                assert_eq!(reported, found(&dram, i).is_none(), "key {i}");
            }
        }
        let dram = dram_only(0);
        let evictions = listened(&dram, false);
        one_leaf_of_40(&dram);
        unreference(&dram, dram.tree.find(&[]).1);
        assert!(dram.evict_one(None, 0));
        assert!(evictions.keys.lock().is_empty());
    }

    /// However hot, every eviction frees something: a leaf keeps at most 7/8 of its
    /// bytes, so a handful of evictions empties it.
    #[test]
    fn eviction_makes_progress_when_every_object_is_hot() {
        let dram = dram_only(0);
        one_leaf_of_40(&dram);
        for _ in 0..5 {
            for i in 0..40 {
                assert!(found(&dram, i).is_some());
            }
        }
        let mut evictions = 0;
        while dram.tally(0).objects > 0 {
            let before = dram.tally(0).objects;
            assert!(dram.evict_one(None, 0));
            evictions += 1;
            let after = dram.tally(0).objects;
            assert!(after < before, "eviction {evictions} kept all {before}");
            assert!(evictions <= 40);
        }
        assert!(dram.counters.retained_objects.load(Ordering::Relaxed) > 0);
        assert_eq!(dram.counters.dropped_objects.load(Ordering::Relaxed), 40);
    }

    /// What a leaf keeps is the key's newest version, and later writes win over it.
    #[test]
    fn a_retained_object_is_never_stale() {
        let dram = dram_only(1024);
        one_leaf_of_40(&dram);
        for _ in 0..3 {
            assert!(found(&dram, 7).is_some());
        }
        // Overwritten in the write buffer, not merged yet, when its leaf is evicted.
        dram.put_with(&key(7), Some(b"new"), Meta::default(), None, 0, |_| ());
        let first = dram.tree.find(&[]).1;
        unreference(&dram, first);
        assert!(dram.evict_one(None, 0));
        assert_eq!(found(&dram, 7).as_deref(), Some(&b"new"[..]));
        // Overwritten after it was retained, then retained again among new neighbours
        // (alone it would go: no leaf keeps all its bytes).
        dram.put_with(&key(7), Some(b"newer"), Meta::default(), None, 0, |_| ());
        for i in 100..110 {
            dram.put_with(&key(i), Some(&[1; 40]), Meta::default(), None, 0, |_| ());
        }
        unreference(&dram, first);
        assert!(dram.evict_one(None, 0));
        assert_eq!(dram.counters.retained_objects.load(Ordering::Relaxed), 2);
        assert_eq!(found(&dram, 7).as_deref(), Some(&b"newer"[..]));
        // Deleted after it was retained: gone, before and after the next eviction.
        dram.delete(&key(7), 0, |_| ());
        assert_eq!(found(&dram, 7), None);
        unreference(&dram, first);
        dram.evict_one(None, 0);
        assert_eq!(found(&dram, 7), None);
        assert_eq!(dram.tally(0).objects, 0);
    }

    /// With an SSD tier below, a clean copy read often stays in DRAM while the cold clean
    /// ones go first; dirty objects stay to be written with their group.
    #[test]
    fn hot_clean_copies_stay_when_the_clean_go() {
        let dram = half_clean();
        for _ in 0..3 {
            assert!(found(&dram, 4).is_some());
        }
        let sink = RecordingSink {
            span: (Fence::from(&[][..]), None),
            batches: Mutex::default(),
        };
        unreference(&dram, dram.tree.find(&[]).1);
        assert!(dram.evict_one(Some(&sink), 0));
        assert!(sink.batches.lock().is_empty(), "nothing written");
        assert_eq!(dram.counters.clean_dropped.load(Ordering::Relaxed), 4);
        assert_eq!(dram.counters.retained_objects.load(Ordering::Relaxed), 1);
        for i in 0..10 {
            let stays = i % 2 == 1 || i == 4;
            assert_eq!(found(&dram, i).is_some(), stays, "key {i}");
        }
    }

    /// Overload: `drop_one` until it has nothing left to take, with no thread beside it
    /// (no merger, no flusher). Only the values forgotten unwritten are write drops: the
    /// clean ones go as clean drops, and tombstones — the deleted keys, then the keys the
    /// first pass kept, when a leaf down to tombstones is emptied — are no objects.
    #[test]
    fn dropping_unwritten_counts_the_values_it_forgets_not_tombstones() {
        let (dram, _) = tier_with(settings(256));
        let clean = Meta {
            clean: true,
            ..Meta::default()
        };
        // Keys 3k+1 clean, 3k+2 dirty, 3k deleted (some tombstones merged, some buffered).
        for i in 0..3000 {
            let meta = if i % 3 == 1 { clean } else { Meta::default() };
            dram.put_with(&key(i), Some(&[7; 60]), meta, None, 0, |_| ());
        }
        for i in (0..3000).step_by(3) {
            dram.delete(&key(i), 0, |_| ());
        }
        let leaves = dram.leaf_count();
        assert!(leaves > 20, "{leaves} leaves");
        let mut taken = 0;
        while dram.drop_one(0) {
            taken += 1;
            assert!(
                taken <= 10 * leaves,
                "drop_one still taking after {taken} calls"
            );
        }
        assert!(taken >= leaves, "{taken} drops of {leaves} leaves");
        let counters = &dram.counters;
        assert_eq!(counters.write_drops.load(Ordering::Relaxed), 1000);
        assert_eq!(counters.clean_dropped.load(Ordering::Relaxed), 1000);
        for i in 0..3000 {
            let found = dram.get(&key(i), 0, false);
            match i % 3 {
                1 => assert!(!matches!(found, Lookup::Found(..)), "key {i}"),
                _ => assert_eq!(found, Lookup::Deleted, "key {i}"),
            }
        }
    }

    /// A clean object that is still there when its leaf is dropped unwritten (written
    /// back between `drop_clean` and `drop_unwritten`) is a clean drop, not a write drop.
    #[test]
    fn clean_objects_dropped_unwritten_count_as_clean_drops() {
        let dram = half_clean();
        let view = dram.view();
        let leaf = view.get(dram.tree.find(&[]).1.0).unwrap();
        assert!(dram.drop_unwritten(leaf, 0));
        assert_eq!(dram.counters.write_drops.load(Ordering::Relaxed), 5);
        assert_eq!(dram.counters.clean_dropped.load(Ordering::Relaxed), 5);
    }

    /// A page found damaged when its leaf is dropped unwritten: its objects count as its
    /// summary says, with the buffered ones, and the leaf stays lost — its write buffer
    /// holding values must not turn it into a leaf of tombstones whose other keys reach
    /// older copies below.
    #[test]
    fn a_damaged_page_dropped_unwritten_counts_its_objects_and_stays_lost() {
        let (dram, _) = tier_with(settings(256));
        put_40_byte_values(&dram, 0..30);
        dram.merge_all(0);
        assert_eq!(dram.leaf_count(), 1);
        // Three more in the write buffer, then the page's body (not its summary) damaged.
        put_40_byte_values(&dram, 30..33);
        dram.write_leaf(&key(0), |_, _, st| {
            let page = st.page.as_mut().unwrap();
            let mut damaged = page.to_vec();
            let half = damaged.len() / 2;
            damaged[half..].fill(0xff);
            *page = Block::new(&damaged);
        });
        let view = dram.view();
        let leaf = view.get(dram.tree.find(&[]).1.0).unwrap();
        assert_eq!(leaf.state.read().summary().objects, 30);
        assert!(dram.drop_one(0));
        assert_eq!(dram.counters.corrupt_pages.load(Ordering::Relaxed), 1);
        assert_eq!(dram.counters.write_drops.load(Ordering::Relaxed), 33);
        assert!(leaf.lost());
        for i in 0..33 {
            assert_eq!(dram.get(&key(i), 0, false), Lookup::Deleted, "key {i}");
        }
        assert!(!dram.drop_one(0), "nothing left to drop");
    }
}
