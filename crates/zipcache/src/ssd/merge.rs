//! Evicted objects into super-leaves: `absorb` merges each DRAM leaf's objects into the
//! super-leaves covering them (read-modify-write of the touched sub-pages only), and a
//! merge that would push a sub-page past `T` splits the super-leaf instead.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::leaf_page::Geometry;
use super::reclaim::Writer;
use super::{Contents, Object, SlState, SsdTier, SuperLeaf};
use crate::btree::{Fence, KeyRange, cut_into_leaves, split_fences};
use crate::eviction::{EvictedObject, EvictionSink};
use crate::format::block::PAYLOAD;
use crate::format::packing::RAW_MAX;
use crate::record::{Meta, Payload, Record};

/// Free slots kept before merging into a super-leaf: a DRAM leaf's objects rarely split
/// one super-leaf more than two ways.
const SLOTS_PER_MERGE: usize = 4;

impl SsdTier {
    /// Merges one group of evicted objects (all inside `leaf`'s range) into `leaf`.
    pub(super) fn merge_into(
        &self,
        w: &mut Writer,
        st: &mut SlState,
        batch: &[&EvictedObject],
        now_ms: u64,
    ) {
        let mut by_subpage: BTreeMap<usize, Vec<&EvictedObject>> = BTreeMap::new();
        for o in batch {
            by_subpage
                .entry(self.geometry.subpage_of(&o.key))
                .or_default()
                .push(o);
        }
        let mut touched: BTreeMap<usize, Contents> = BTreeMap::new();
        let mut overflow = false;
        let mut appending = true;
        let subpages: Vec<usize> = by_subpage.keys().copied().collect();
        let read = self.contents_of(st, &subpages);
        for ((&s, objs), read) in by_subpage.iter().zip(read) {
            // An unreadable block may hold versions that the batch's tombstones and new
            // versions must hide: it is replaced (by what the batch brings) whatever happens.
            let (mut contents, unreadable) = match read {
                Some(contents) => (contents, false),
                None => (Contents::new(), true),
            };
            let before = contents.len();
            let first_new = objs.iter().map(|o| o.key.as_slice()).min();
            appending &= contents
                .keys()
                .next_back()
                .is_none_or(|last| first_new.is_none_or(|f| f > last.as_slice()));
            let mut changed = unreadable;
            for o in objs {
                match &o.value {
                    // Too big for any sub-page: it cannot be kept, and no older copy may stay.
                    Some(v) if record_len(&o.key, v, &o.meta) > PAYLOAD => {
                        changed |= contents.remove(&o.key).is_some()
                    }
                    Some(v) => {
                        contents.insert(
                            o.key.clone(),
                            (
                                v.clone(),
                                Meta {
                                    clean: false,
                                    ..o.meta
                                },
                            ),
                        );
                        changed = true;
                    }
                    None => changed |= contents.remove(&o.key).is_some(),
                }
            }
            contents.retain(|_, (_, meta)| !meta.expired(now_ms));
            changed |= contents.len() != before;
            if !changed {
                continue;
            }
            if contents.len() > 1 && self.overfills(&contents) {
                overflow = true;
            }
            touched.insert(s, contents);
        }
        if touched.is_empty() {
            return;
        }
        if overflow {
            self.counters
                .split_v_obj
                .fetch_add(evicted_bytes(batch), Ordering::Relaxed);
            self.split(w, st, touched, appending, now_ms);
            return;
        }
        if st.slot.is_none() {
            match self.allocate(w) {
                Some(slot) => {
                    st.slot = Some(slot);
                    st.generation = st.generation.wrapping_add(1);
                    self.counters.occupied.fetch_add(1, Ordering::Relaxed);
                }
                // No room even after evicting: these objects are forgotten (a miss later).
                None => {
                    let objects = touched.values().map(|c| c.len() as u64).sum();
                    self.counters
                        .evicted_objects
                        .fetch_add(objects, Ordering::Relaxed);
                    return;
                }
            }
        }
        let pages: Vec<(usize, &Contents)> = touched.iter().map(|(&s, c)| (s, c)).collect();
        let written = self.write_subpages(st, &pages);
        self.counters
            .merge_blocks
            .fetch_add(written, Ordering::Relaxed);
        st.version += 1;
        self.log_upsert(w, st);
    }

    /// Rebuilds an over-full super-leaf as two or more, each within `T`.
    /// `appending`: every new key sorts after every key the super-leaf held.
    fn split(
        &self,
        w: &mut Writer,
        st: &mut SlState,
        touched: BTreeMap<usize, Contents>,
        appending: bool,
        now_ms: u64,
    ) {
        self.counters.splits.fetch_add(1, Ordering::Relaxed);
        let mut all = Contents::new();
        for c in touched.values() {
            all.extend(c.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let untouched: Vec<usize> = (0..self.settings.subpages)
            .filter(|s| !touched.contains_key(s))
            .collect();
        // Unreadable: its objects are forgotten; the rewrite under a new generation leaves
        // no block of the old layout readable.
        for mut contents in self.contents_of(st, &untouched).into_iter().flatten() {
            all.append(&mut contents);
        }
        all.retain(|_, (_, meta)| !meta.expired(now_ms));
        let objs: Vec<Object> = all.into_iter().collect();
        let chunks = self.partition(&objs, appending);
        let old_high = st.range.high.take();
        let fences = split_fences(&objs, &chunks, |o| o.0.as_slice());
        // The first chunk stays in this super-leaf, rewritten whole under a new generation
        // so that no block of the old layout can be mistaken for the new one.
        st.generation = st.generation.wrapping_add(1);
        st.range.high = fences.first().cloned().or_else(|| old_high.clone());
        self.rewrite(w, st, &objs[chunks[0].0..chunks[0].1]);
        st.version += 1;
        self.log_upsert(w, st);
        let new_leaves = chunks.iter().enumerate().skip(1).map(|(i, &(start, end))| {
            let mut nst = self.settings.empty_state(KeyRange::new(
                fences[i - 1].clone(),
                fences.get(i).cloned().or_else(|| old_high.clone()),
            ));
            self.rewrite(w, &mut nst, &objs[start..end]);
            self.log_upsert(w, &nst);
            (nst.range.low.clone(), SuperLeaf::new(nst))
        });
        // may do I/O: each new super-leaf is written (`rewrite`) just before it is published
        let delta = self.tree.split_and_publish(new_leaves);
        let added = chunks.len() as i64 - 1;
        self.counters
            .superleaves
            .fetch_add(added, Ordering::Relaxed);
        self.memory
            .change_index(delta + added * self.settings.descriptor_bytes() as i64);
    }

    /// Writes `objs` as the whole content of a super-leaf, allocating a slot if needed.
    fn rewrite(&self, w: &mut Writer, st: &mut SlState, objs: &[Object]) {
        let per_subpage = self.by_subpage(objs);
        if st.slot.is_none() && !objs.is_empty() {
            match self.allocate(w) {
                Some(slot) => {
                    st.slot = Some(slot);
                    self.counters.occupied.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    self.counters
                        .evicted_objects
                        .fetch_add(objs.len() as u64, Ordering::Relaxed);
                    return;
                }
            }
        }
        let pages: Vec<(usize, &Contents)> = per_subpage
            .iter()
            .enumerate()
            .filter(|(s, contents)| !contents.is_empty() || st.counts[*s] != 0)
            .collect();
        let written = self.write_subpages(st, &pages);
        self.counters
            .split_blocks
            .fetch_add(written, Ordering::Relaxed);
    }

    /// `objs` sorted into the sub-pages they hash to.
    fn by_subpage(&self, objs: &[Object]) -> Vec<Contents> {
        let mut per_subpage: Vec<Contents> = vec![Contents::new(); self.settings.subpages];
        for (k, v) in objs {
            per_subpage[self.geometry.subpage_of(k)].insert(k.clone(), v.clone());
        }
        per_subpage
    }

    /// Cuts sorted objects into runs whose sub-pages all stay within `T`: in halves, so
    /// that both sides have room for the inserts to come, or, when keys arrive in
    /// ascending order, as full as each run gets, since no insert will come back to it.
    fn partition(&self, objs: &[Object], appending: bool) -> Vec<(usize, usize)> {
        // Each object's sub-page and length, worked out once: the cuts test many runs of
        // the same objects (testing every prefix of a run hashed a whole super-leaf's
        // keys once per object — most of the flusher's time during a fill). Lengths are
        // scaled by how much packing shrinks these objects, so that `T` bounds what
        // blocks will store.
        let scale = self.packing_scale(objs);
        let geometry = Geometry {
            fill_limit: self.fill_limit * PER_UNIT,
            ..self.geometry
        };
        let placed: Vec<(usize, usize)> = objs
            .iter()
            .map(|(k, (v, meta))| (geometry.subpage_of(k), record_len(k, v, meta) * scale))
            .collect();
        let fits =
            |start: usize, end: usize| geometry.fitting_prefix(&placed[start..end]) == end - start;
        let cut = |start: usize, end: usize| {
            if !appending {
                return (start + end) / 2;
            }
            // The longest run from `start` that fits; at least one object.
            start + geometry.fitting_prefix(&placed[start..end]).max(1)
        };
        cut_into_leaves(objs.len(), fits, cut)
    }

    /// Whether a sub-page's records take more than `T` of its block in this tier's mode
    /// (may compress).
    fn overfills(&self, contents: &Contents) -> bool {
        payload_len(contents) > self.fill_limit
            && (!self.settings.host_compression
                || self
                    .stored(contents)
                    .is_none_or(|stored| stored.len() > self.fill_limit))
    }

    /// Stored bytes per raw record byte of `objs`, in [`PER_UNIT`]ths: what packing their
    /// sub-pages shrinks them to (may compress), never so little that a sub-page within
    /// `T` would hold more raw bytes than a packed block can say.
    fn packing_scale(&self, objs: &[Object]) -> usize {
        if !self.settings.host_compression {
            return PER_UNIT;
        }
        let per_subpage = self.by_subpage(objs);
        let raw: usize = per_subpage.iter().map(payload_len).sum();
        let stored: usize = per_subpage
            .iter()
            .filter(|contents| !contents.is_empty())
            .map(|contents| {
                self.stored(contents)
                    .map_or_else(|| payload_len(contents), |s| s.len())
            })
            .sum();
        let floor = (self.fill_limit * PER_UNIT).div_ceil(RAW_MAX);
        (stored * PER_UNIT)
            .div_ceil(raw.max(1))
            .clamp(floor, PER_UNIT)
    }
}

/// The unit of [`SsdTier::packing_scale`].
const PER_UNIT: usize = 1024;

fn record_len(key: &[u8], value: &[u8], meta: &Meta) -> usize {
    Record {
        key,
        payload: Payload::Inline(value),
        meta: *meta,
    }
    .encoded_len()
}

/// What `objects` count in `V_obj`: key and value bytes of each new version.
fn evicted_bytes(objects: &[&EvictedObject]) -> u64 {
    objects
        .iter()
        .filter_map(|o| o.value.as_ref().map(|v| (o.key.len() + v.len()) as u64))
        .sum()
}

fn payload_len(contents: &Contents) -> usize {
    contents
        .iter()
        .map(|(k, (v, meta))| record_len(k, v, meta))
        .sum()
}

impl EvictionSink for SsdTier {
    fn absorb(&self, _low: &[u8], _high: Option<&[u8]>, objects: Vec<EvictedObject>) -> bool {
        let now_ms = self.clock.now_ms();
        let mut w = self.writer.lock();
        self.relieve_physical(&mut w);
        // Clean objects are already on the SSD as they are: nothing to write.
        let dirty: Vec<&EvictedObject> = objects.iter().filter(|o| !o.meta.clean).collect();
        if self.settings.host_compression {
            // may do I/O: a dictionary newly trained is written to its file first
            self.dictionaries.take_in(&dirty);
        }
        self.counters
            .v_obj
            .fetch_add(evicted_bytes(&dirty), Ordering::Relaxed);
        let mut i = 0;
        while i < dirty.len() {
            // Enough for this group to split a few ways; if a split still runs out, the
            // objects it cannot place are forgotten (a miss, never a wrong value).
            self.reserve(&mut w, SLOTS_PER_MERGE);
            let (_, leaf) = self.tree.find(&dirty[i].key);
            let mut st = leaf.state.write();
            let end = i + dirty[i..].partition_point(|o| {
                st.range
                    .high
                    .as_ref()
                    .is_none_or(|h| o.key.as_slice() < h.as_ref())
            });
            self.merge_into(&mut w, &mut st, &dirty[i..end.max(i + 1)], now_ms);
            i = end.max(i + 1);
        }
        // may do I/O: the descriptor log appended (tmpfs), before any key leaves the
        // shadow table
        self.publish(&mut w);
        self.written_down(&dirty);
        true
    }

    /// Evicts every super-leaf that overlaps `[low, high)`: more than asked, but DRAM
    /// leaves lost this way are rare (a damaged page, or one dropped under overload when
    /// it held nothing but tombstones) and a whole super-leaf is what this tier knows how
    /// to drop. Its objects count as evictions.
    fn forget(&self, low: &[u8], high: Option<&[u8]>) {
        let mut w = self.writer.lock();
        let mut doomed = vec![self.tree.find(low)];
        while let Some(next) = self.tree.next_leaf(&doomed[doomed.len() - 1].0) {
            if high.is_some_and(|h| next.0.as_ref() >= h) {
                break;
            }
            doomed.push(next);
        }
        for (leaf_low, leaf) in doomed {
            self.evict_superleaf_for_room(&mut w, &leaf_low, &leaf);
        }
        self.publish(&mut w);
    }

    /// From the low fence of the super-leaf holding `low` to the high fence of the one
    /// holding the keys just below `high`. Read from the tree without locks: a hint that
    /// a concurrent split or eviction may make slightly stale, which costs only a write.
    fn span(&self, low: &Fence, high: Option<&[u8]>) -> (Fence, Option<Fence>) {
        let (span_low, _) = self.tree.find(low);
        // `None` (no bound) when that super-leaf is the last one.
        let span_high = high.and_then(|h| {
            let (last, _) = self.tree.prev_leaf(h)?;
            self.tree.next_leaf(&last).map(|(next, _)| next)
        });
        (span_low, span_high)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use zipcache_device::{BlockDevice, MemDevice};

    use super::super::SsdSettings;
    use super::super::test_support::{absorb, key, settings, tier_on};

    /// With host packing, `T` bounds packed bytes: the same compressible objects take far
    /// fewer super-leaves, and every one of them reads back.
    #[test]
    fn packed_superleaves_hold_more_objects_and_read_back() {
        let superleaves = |host_compression: bool| {
            let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 256));
            let settings = SsdSettings {
                host_compression,
                ..settings(256)
            };
            let ssd = tier_on(device, settings);
            for batch in (0..3000).collect::<Vec<u32>>().chunks(100) {
                absorb(&ssd, batch.iter().copied());
            }
            for i in 0..3000 {
                let hit = ssd.get(&key(i), 0).map(|hit| hit.value);
                assert_eq!(
                    hit,
                    Some(vec![i as u8; 100]),
                    "key {i}, host {host_compression}"
                );
            }
            let packing_ns = ssd.counters.compress_ns.load(Ordering::Relaxed);
            assert_eq!(packing_ns > 0, host_compression);
            assert_eq!(ssd.counters.checksum_failures.load(Ordering::Relaxed), 0);
            ssd.counters.occupied.load(Ordering::Relaxed)
        };
        let (raw, packed) = (superleaves(false), superleaves(true));
        assert!(packed * 3 <= raw, "{packed} packed super-leaves, {raw} raw");
    }

    /// Every block the tier writes is counted as a merge's or a split's, so the two
    /// counts account for all the bytes written, and the evicted bytes are split the same way.
    #[test]
    fn blocks_written_are_counted_by_merges_and_splits() {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 256));
        let ssd = tier_on(device.clone(), settings(256));
        // First batches split (a half-filled 4-block super-leaf holds ~70 of these
        // objects); the one-object batches after them only merge.
        for batch in (0..2000).collect::<Vec<u32>>().chunks(200) {
            absorb(&ssd, batch.iter().copied());
        }
        let c = &ssd.counters;
        let splits_only = c.merge_blocks.load(Ordering::Relaxed);
        for i in (0..2000).step_by(97) {
            absorb(&ssd, [i]);
        }
        let (merges, splits) = (
            c.merge_blocks.load(Ordering::Relaxed),
            c.split_blocks.load(Ordering::Relaxed),
        );
        assert!(splits > 0, "the first batches split");
        assert!(
            merges > splits_only,
            "single objects merge: {merges} blocks"
        );
        assert_eq!(
            (merges + splits) * 4096,
            device.stats().host_bytes_written,
            "{merges} merge blocks, {splits} split blocks"
        );
        let object = (8 + 100) as u64;
        assert_eq!(c.v_obj.load(Ordering::Relaxed), (2000 + 21) * object);
        let split_bytes = c.split_v_obj.load(Ordering::Relaxed);
        assert!(split_bytes >= 200 * object && split_bytes <= 2000 * object);
    }
}
