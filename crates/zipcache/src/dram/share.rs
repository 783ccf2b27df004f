//! Sharing before splitting (B*-tree style): a leaf whose objects no longer fit its page
//! takes in its right neighbour's objects and cuts both sets into equal pages, two or
//! three, instead of splitting alone at the median.
//!
//! Keys arrive in random order in a cache, and a leaf split at the median leaves two
//! half-full pages that fill at the same pace: leaves then average about 60 % of a page
//! (29 objects where 48 fit, in the fill of `RESULTS.md`), and each object pays 1/29 of
//! its leaf's fixed ~110 bytes (descriptor, tree entry, page header and allocation).
//! A share leaves both (or all three) 60–90 % full; after a fill leaves hold 33 objects.
//!
//! Only with a neighbour that can be locked at once ([`RwLock::try_write`]: never
//! waiting keeps the lock order of the leaf protocol whatever the tree did meanwhile),
//! and not a lost, hot or access-tracking one (their state does not move between
//! leaves); otherwise the leaf splits alone. Sequential inserts do not share: they cut
//! before the new keys (`merge::sequential_cut`), which already leaves full pages.

use std::sync::Arc;

use parking_lot::{MutexGuard, RwLockWriteGuard};

use super::block::Block;
use super::leaf::{DramLeaf, Extras, LeafState, RETIRED};
use super::merge::Obj;
use super::slots::View;
use super::write_buffer::WriteBuffer;
use super::{DramTier, LeafId};
use crate::btree::Fence;
use crate::dictionary::Dictionary;
use crate::record::CasBase;

/// How full the pages of a share are cut at most: headroom for a few more writes before
/// the next overflow (each share rewrites two pages).
const SHARE_FILL_PERCENT: usize = 90;

/// The right neighbour of a leaf that is merging, locked exclusive.
pub(super) struct Neighbour<'v> {
    low: Fence,
    id: LeafId,
    leaf: &'v DramLeaf,
    st: RwLockWriteGuard<'v, LeafState>,
}

/// What a neighbour gave up, for the merge to gather its objects from: its page's body
/// decoded, its write buffer and its blobs.
pub(super) struct Given {
    pub(super) cas_base: CasBase,
    pub(super) body: Option<Vec<u8>>,
    pub(super) buffer: WriteBuffer,
    pub(super) blobs: thin_vec::ThinVec<Option<Block>>,
    pub(super) dictionary: Option<Arc<Dictionary>>,
}

impl DramTier {
    /// The right neighbour of `leaf` — locked exclusive by the caller, and owning `key` —
    /// locked, if it is free right now and can share.
    pub(super) fn lock_right_neighbour<'v>(
        &self,
        view: &'v View<DramLeaf>,
        leaf: &DramLeaf,
        key: &[u8],
    ) -> Option<Neighbour<'v>> {
        let (low, id) = self.tree.find(key);
        if !std::ptr::eq(view.get(id.0)?, leaf) {
            return None;
        }
        let (right_low, right_id) = self.tree.next_leaf(&low)?;
        let right = view.get(right_id.0)?;
        let st = right.state.try_write()?;
        // Both locked, the pair can no longer change: check the tree still has it.
        let still = self.tree.next_leaf(&low);
        if still.is_none_or(|(l, i)| l != right_low || i != right_id)
            || right.has(RETIRED)
            || right.lost()
            || right.hot()
            || right.raw_page()
            || st.access_table().is_some()
        {
            return None;
        }
        Some(Neighbour {
            low: right_low,
            id: right_id,
            leaf: right,
            st,
        })
    }

    /// Empties the locked neighbour (charged). `None`, and nothing taken, if its page is
    /// damaged (then it is marked lost, and stays).
    pub(super) fn take_neighbour(&self, n: &mut Neighbour<'_>) -> Option<Given> {
        let (cas_base, body) =
            match self.decode(n.leaf, n.st.page.as_deref(), n.st.page_dictionary()) {
                Some((base, body)) => (base, Some(body.into_owned())),
                None if n.st.page.is_some() => return None,
                None => (CasBase::default(), None),
            };
        let extras = self.charged(n.leaf, &mut n.st, |st| {
            st.page = None;
            st.extras.take()
        });
        let Extras {
            buffer,
            blobs,
            dictionary,
            ..
        } = *extras.unwrap_or_default();
        Some(Given {
            cas_base,
            body,
            buffer,
            blobs,
            dictionary,
        })
    }

    /// Takes the emptied neighbour out of the tree (its range joins the merging leaf's,
    /// still locked). Its slot is freed under `evicting`: now unless an eviction runs,
    /// else by that eviction or the background thread.
    pub(super) fn retire_neighbour(&self, n: Neighbour<'_>) {
        self.memory.change_index(self.tree.remove(&n.low));
        n.leaf.set(RETIRED, true);
        drop(n.st);
        self.retired.lock().push(n.id);
        self.free_retired_leaves();
    }

    /// Frees the slots of the leaves shares retired; the caller holds `evicting`.
    pub(super) fn free_retired(&self, _evicting: &MutexGuard<'_, ()>) {
        for id in std::mem::take(&mut *self.retired.lock()) {
            self.memory.change_index(self.leaves.free(id.0));
        }
    }

    /// [`Self::free_retired`] unless an eviction runs (it frees them itself): never waits.
    pub fn free_retired_leaves(&self) {
        if let Some(evicting) = self.evicting.try_lock() {
            self.free_retired(&evicting);
        }
    }

    /// Cuts sorted objects into the fewest pages filled at most `SHARE_FILL_PERCENT`, of
    /// about equal size; any that does not fit after all (CAS deltas differ per page) is
    /// cut again as a merge would.
    pub(super) fn share(&self, objs: &[Obj]) -> Vec<(usize, usize)> {
        let base = CasBase::of_versions(objs.iter().map(|o| o.record(0).meta.cas));
        let sizes: Vec<usize> = objs
            .iter()
            .map(|o| o.record(0).encoded_len_in(base))
            .collect();
        let total: usize = sizes.iter().sum();
        let target = (self.layout.capacity * SHARE_FILL_PERCENT / 100).max(1);
        let pages = total.div_ceil(target).max(1);
        let mut chunks = Vec::with_capacity(pages + 1);
        let (mut start, mut filled) = (0, 0);
        for (i, size) in sizes.iter().enumerate() {
            filled += size;
            // The end of page `chunks.len()` is where the running size passes its share.
            if filled * pages >= total * (chunks.len() + 1) && i + 1 < objs.len() {
                chunks.push((start, i + 1));
                start = i + 1;
            }
        }
        chunks.push((start, objs.len()));
        chunks
            .into_iter()
            .flat_map(|(start, end)| {
                self.partition(&objs[start..end])
                    .into_iter()
                    .map(move |(s, e)| (start + s, start + e))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Lookup;
    use super::super::test_support::*;
    use super::*;
    use crate::record::{Meta, Payload, Record};

    /// Keys `0..n` in a scrambled order: multiplication by an odd constant is a bijection
    /// modulo a power of two.
    fn scrambled(n: u32) -> impl Iterator<Item = u32> {
        let span = n.next_power_of_two();
        (0..span)
            .map(move |i| i.wrapping_mul(2_654_435_761) & (span - 1))
            .filter(move |&k| k < n)
    }

    fn value(k: u32) -> Vec<u8> {
        let mut v = vec![0u8; 60];
        v[..4].copy_from_slice(&k.to_le_bytes());
        v
    }

    /// Keys `0..n`, each written once with `value(k)`, all still there.
    fn assert_every_key_reads_back(dram: &DramTier, n: u32) {
        for k in 0..n {
            assert_eq!(
                dram.get(&key(k), 0, true),
                Lookup::Found(value(k), Meta::default(), None),
                "key {k}"
            );
        }
    }

    /// Objects per leaf over the objects a full page takes, after every buffer merged.
    fn fill_of(dram: &DramTier, per_page: usize) -> f64 {
        dram.merge_all(0);
        let view = dram.view();
        let objects: u64 = dram
            .leaves()
            .iter()
            .map(|id| view.get(id.0).unwrap().state.read().summary().objects)
            .sum();
        objects as f64 / dram.leaf_count() as f64 / per_page as f64
    }

    /// Inserted in random order, leaves split at the median average ~60 % of a page;
    /// sharing with the neighbour keeps them fuller, and every key reads back.
    #[test]
    fn random_inserts_leave_leaves_fuller_than_median_splits() {
        let (dram, _) = tier_with(settings(256));
        let n = 20_000;
        for k in scrambled(n) {
            dram.put_with(&key(k), Some(&value(k)), Meta::default(), None, 0, |_| ());
        }
        let record = Record {
            key: &key(0),
            payload: Payload::Inline(&value(0)),
            meta: Meta::default(),
        };
        let per_page = dram.layout.capacity / record.encoded_len();
        let fill = fill_of(&dram, per_page);
        assert!(fill > 0.72, "leaves {:.0} % full", fill * 100.0);
        assert_every_key_reads_back(&dram, n);
    }

    /// A neighbour someone holds is not waited for: the leaf splits alone (waiting could
    /// deadlock against a pass that locks leaves in another order).
    #[test]
    fn a_busy_neighbour_is_not_waited_for() {
        let (dram, _) = tier_with(settings(0));
        let n = 2_000;
        for k in scrambled(n) {
            dram.put_with(&key(k), Some(&value(k)), Meta::default(), None, 0, |_| ());
        }
        let ids = dram.leaves();
        assert!(ids.len() > 4, "{} leaves", ids.len());
        let view = dram.view();
        // Every leaf but the first read-locked here: no merge can share with any of them.
        let held: Vec<_> = ids[1..]
            .iter()
            .map(|id| view.get(id.0).unwrap().state.read())
            .collect();
        let leaves = dram.leaf_count();
        let first_key_of_second = {
            let mut k = 0;
            while dram.tree.routes_to(&key(k), &ids[0]) {
                k += 1;
            }
            k
        };
        let splits = dram
            .counters
            .splits
            .load(std::sync::atomic::Ordering::Relaxed);
        // Keys below the second leaf's first go to the first leaf, until it splits.
        let extra = (0..first_key_of_second)
            .map(|k| format!("{k:08}x").into_bytes())
            .take_while(|_| dram.leaf_count() == leaves)
            .inspect(|k| {
                dram.put_with(k, Some(&[5; 60]), Meta::default(), None, 0, |_| ());
            })
            .count();
        drop(held);
        assert!(
            dram.counters
                .splits
                .load(std::sync::atomic::Ordering::Relaxed)
                > splits,
            "{extra} more keys did not split the first leaf"
        );
        assert_every_key_reads_back(&dram, n);
    }

    /// Shares retire leaves while evictions walk and lock runs of them: neither may
    /// deadlock the other (a slot freed and handed out again while an eviction walked the
    /// tree could sit twice in its run, or be locked by it while a split takes it), and
    /// a key never reads another's value.
    #[test]
    fn shares_and_evictions_run_together() {
        let dram = std::sync::Arc::new(tier_with(settings(256)).0);
        let (done, finished) = std::sync::mpsc::channel();
        let writers: Vec<_> = (0..2u32)
            .map(|t| {
                let (dram, done) = (dram.clone(), done.clone());
                std::thread::spawn(move || {
                    for k in scrambled(40_000).filter(|k| k % 2 == t) {
                        dram.put_with(&key(k), Some(&value(k)), Meta::default(), None, 0, |_| ());
                    }
                    done.send(()).unwrap();
                })
            })
            .collect();
        let evictor = {
            let dram = dram.clone();
            std::thread::spawn(move || {
                while finished.recv_timeout(std::time::Duration::ZERO).is_err() {
                    dram.evict_one(None, 0);
                }
                finished
            })
        };
        // Liveness, not speed: the writers take well under a second without a deadlock.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for w in writers {
                w.join().unwrap();
            }
            tx.send(()).unwrap();
        });
        rx.recv_timeout(std::time::Duration::from_secs(120))
            .expect("writers deadlocked with the evictions");
        drop(done);
        evictor.join().unwrap();
        for k in 0..40_000 {
            match dram.get(&key(k), 0, true) {
                Lookup::Found(v, ..) => assert_eq!(v, value(k), "key {k}"),
                Lookup::Absent => {}
                other => panic!("key {k}: {other:?}"),
            }
        }
    }

    /// While leaves share, every key written reads back at once, from any thread, with
    /// its newest value (no eviction: nothing may miss). A share publishes two or three
    /// leaves: published first-to-last, the first owned its successors' keys meanwhile.
    #[test]
    fn reads_see_every_write_while_leaves_share() {
        let dram = std::sync::Arc::new(tier_with(settings(256)).0);
        let threads: Vec<_> = (0..3u32)
            .map(|t| {
                let dram = dram.clone();
                std::thread::spawn(move || {
                    let mut last = std::collections::HashMap::new();
                    for (n, k) in scrambled(60_000).filter(|k| k % 3 == t).enumerate() {
                        let v = value(k ^ (n as u32) << 16);
                        dram.put_with(&key(k), Some(&v), Meta::default(), None, 0, |_| ());
                        last.insert(k, v);
                        // An earlier key of this thread, overwritten or read back.
                        let old = k.wrapping_mul(7) % 60_000 / 3 * 3 + t;
                        if let Some(want) = last.get(&old) {
                            match dram.get(&key(old), 0, true) {
                                Lookup::Found(got, ..) => assert_eq!(&got, want, "key {old}"),
                                other => panic!("key {old}: {other:?}"),
                            }
                        }
                        if n % 5 == 0 {
                            dram.delete(&key(old), 0, |_| ());
                            last.remove(&old);
                            assert_eq!(dram.get(&key(old), 0, true), Lookup::Deleted, "key {old}");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
