//! Adaptive compression bypassing (paper §3.2): the hottest leaves, within a share of
//! the DRAM budget, keep their pages uncompressed, and — while the budget has room to
//! spare — their medium objects' blobs too (`BLOB_HOT`: a GET of a hot medium object
//! decompresses nothing, and a write of one compresses nothing: a PUT not before the
//! leaf's lock, a read-modify-write such as an HSET of a hot session not under it). A
//! blob stored as is for heat is compressed again when its leaf cools (`set_heat`) or a
//! merge moves it into a leaf that is not hot (`merge.rs`, `build`, through
//! [`DramTier::blob_for_heat`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::DramTier;
use super::block::Block;
use super::leaf::{DramLeaf, Extras, HOT, LeafState, RAW_BLOBS, RAW_PAGE, RETIRED};
use super::page::{DictionaryPage, Summary};
use crate::dictionary::Dictionary;
use crate::dictionary::page::PageDictionary;
use crate::memory::alloc_size;
use crate::record::{
    blob_dictionary, decode_blob, encode_blob_with, hot_blob_len, hot_blob_with,
    is_compressed_blob, is_hot_blob,
};

/// How a leaf is kept, from the coolest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Heat {
    /// Its page compressed, and its medium objects' blobs.
    Cool,
    /// Its page stored as is (the hot sub-tier); its blobs compressed, DRAM having no
    /// room to spare for them.
    Hot,
    /// Its page stored as is, and its blobs (`BLOB_HOT`).
    HotBlobs,
}

impl DramLeaf {
    pub(super) fn heat(&self) -> Heat {
        match (self.hot(), self.has(RAW_BLOBS)) {
            (false, _) => Heat::Cool,
            (true, false) => Heat::Hot,
            (true, true) => Heat::HotBlobs,
        }
    }
}

impl DramTier {
    /// One pass of adaptive compression bypassing: choose the hot leaves, and those of
    /// them whose blobs are stored as is, convert the leaves whose heat changed, and age
    /// every counter. `budget`: the DRAM budget now.
    pub fn bypass_pass(&self, budget: i64) {
        let ids = self.leaves();
        let view = self.view();
        let leaves: Vec<&DramLeaf> = ids.iter().filter_map(|id| view.get(id.0)).collect();
        let counts: Vec<u32> = leaves
            .iter()
            .map(|l| l.access.load(Ordering::Relaxed))
            .collect();
        // The hot sub-tier's budget counts all that a hot leaf pins (it is spared by
        // eviction): its uncompressed page, and its blobs and buffer.
        let hot_budget =
            (self.settings.dram_capacity as f64 * self.settings.bypass_max_fraction) as u64;
        // Blobs are stored as is only in DRAM that the objects do not need: half the room
        // the budget has left, counted without the blobs stored as is already (else the
        // next pass, finding less room, would compress them again, and the one after
        // store them as is again). A fill takes that room, and a full tier stores none.
        let as_is_now: u64 = leaves
            .iter()
            .filter(|l| l.heat() == Heat::HotBlobs)
            .map(|l| hot_blob_bytes(&l.state.read()))
            .sum();
        let used = self.memory.snapshot().total() - as_is_now as i64;
        let mut blob_room = (budget - used).max(0) as u64 / 2;
        let page = alloc_size(self.settings.leaf_size) as u64;
        let mut want = vec![Heat::Cool; leaves.len()];
        let mut pinned = 0;
        for i in self.bypass.choose(&counts, leaves.len()) {
            let (buffer, as_is, blobs) = {
                let st = leaves[i].state.read();
                let charge = self.charge_of(leaves[i], &st);
                (
                    charge.write_buffers as u64,
                    hot_blob_bytes(&st),
                    charge.mediums as u64,
                )
            };
            // A leaf without blobs stays `Hot`: nothing to store as is, and no medium
            // PUT need ask where its value goes (`keeps_blobs_as_is`).
            let blobs_as_is = as_is > 0 && as_is <= blob_room;
            pinned += page + buffer + if blobs_as_is { as_is } else { blobs };
            if pinned > hot_budget {
                break;
            }
            want[i] = if blobs_as_is {
                blob_room -= as_is;
                Heat::HotBlobs
            } else {
                Heat::Hot
            };
        }
        for (leaf, (want, count)) in leaves.iter().zip(want.into_iter().zip(counts)) {
            if leaf.heat() != want {
                self.set_heat(leaf, want);
            }
            leaf.access.store(count >> 1, Ordering::Relaxed);
        }
    }

    /// Whether `key`'s leaf stores its blobs as is, asked without its lock before a write
    /// compresses its value ahead of it (the lock decides: a wrong answer costs a
    /// compression, or a compression under the lock). A walk of the tree only while
    /// some leaf does.
    pub(super) fn keeps_blobs_as_is(&self, key: &[u8]) -> bool {
        self.counters.hot_blob_leaves.load(Ordering::Relaxed) > 0
            && self.tree.with_leaf(key, |id| {
                self.view()
                    .get(id.0)
                    .is_some_and(|leaf| leaf.heat() == Heat::HotBlobs)
            })
    }

    pub(super) fn set_heat(&self, leaf: &DramLeaf, heat: Heat) {
        let mut st = leaf.state.write();
        if leaf.has(RETIRED) {
            return;
        }
        let hot = heat != Heat::Cool;
        if leaf.set(HOT, hot) != hot {
            self.counters
                .hot_leaves
                .fetch_add(if hot { 1 } else { -1 }, Ordering::Relaxed);
        }
        let raw_blobs = heat == Heat::HotBlobs;
        let reblob = leaf.set(RAW_BLOBS, raw_blobs) != raw_blobs;
        if reblob {
            self.counters
                .hot_blob_leaves
                .fetch_add(if raw_blobs { 1 } else { -1 }, Ordering::Relaxed);
        }
        let converted = st
            .page
            .as_deref()
            .filter(|_| leaf.raw_page() != hot)
            .map(|page| self.repage(leaf, page, st.page_dictionary(), hot));
        let current = self.current_dictionary();
        self.charged(leaf, &mut st, |st| match converted {
            Some(None) => {
                // Damaged (the leaf is marked lost): its objects are gone either way.
                st.page = None;
                if let Some(extras) = &mut st.extras {
                    extras.blobs = thin_vec::ThinVec::new();
                }
            }
            converted => {
                if let Some(Some((page, dictionary, lz4_beat))) = converted {
                    st.set_page(Some(page), dictionary);
                    leaf.lz4_beat.store(lz4_beat, Ordering::Relaxed);
                    leaf.set(RAW_PAGE, hot);
                }
                if let Some(extras) = st.extras.as_mut().filter(|_| reblob) {
                    self.reblob(extras, raw_blobs, current);
                }
            }
        });
    }

    /// A locked leaf's page (compressed with `dictionary`, if it names one) rebuilt with
    /// its body `raw` (or compressed), and the dictionary it then needs; `None` if the
    /// page is damaged.
    fn repage(
        &self,
        leaf: &DramLeaf,
        page: &[u8],
        dictionary: Option<&PageDictionary>,
        raw: bool,
    ) -> Option<DictionaryPage> {
        let (summary, packed) = Summary::split(page)?;
        let header = self.layout.table(packed)?.len();
        let (_, body) = self.decode(leaf, Some(page), dictionary)?;
        Some(self.page(summary, &[&packed[..header], &body].concat(), raw, None))
    }

    /// A locked leaf's blobs as a leaf of that heat keeps them: each compressed one
    /// stored as is (`as_is`), or each stored as is for heat compressed with the leaf's
    /// dictionary, else `current` (which the leaf then holds, if a blob names it). A
    /// blob that does not decode stays as it is, to fail its reads as it would have.
    fn reblob(&self, extras: &mut Extras, as_is: bool, current: Option<Arc<Dictionary>>) {
        let dictionary = extras.dictionary.clone().or(current);
        let mut named = false;
        for blob in extras.blobs.iter_mut().flatten() {
            if let Some(again) = self.blob_for_heat(blob, as_is, dictionary.as_ref()) {
                *blob = again;
            }
            named |= blob_dictionary(blob).is_some_and(|id| id != 0);
        }
        extras.dictionary = dictionary.filter(|_| named);
    }

    /// `blob` (compressed with `dictionary`, if it names one) as a leaf keeps it whose
    /// blobs are stored as is (`as_is`) or not, where that differs from how it is: a
    /// compressed one stored as is, or one stored as is for heat compressed with
    /// `dictionary` (where that wins). `None` if it stays as it is, or does not decode.
    pub(super) fn blob_for_heat(
        &self,
        blob: &[u8],
        as_is: bool,
        dictionary: Option<&Arc<Dictionary>>,
    ) -> Option<Block> {
        let converts = if as_is {
            is_compressed_blob(blob)
        } else {
            is_hot_blob(blob)
        };
        if !converts {
            return None;
        }
        let (value, meta) = decode_blob(blob, dictionary.map(|d| &**d))?;
        Some(if as_is {
            hot_blob_with(&value, &meta, Block::new)
        } else {
            // Offered to the dictionaries' trainer when it was written: not again.
            encode_blob_with(&value, &meta, dictionary.map(|d| &**d), Block::new)
        })
    }
}

/// What a locked leaf's blobs would take stored as a hot leaf stores them (`BLOB_HOT`),
/// for the hot sub-tier's budget: a leaf chosen by its compressed blobs would take
/// several times its share once hot.
fn hot_blob_bytes(st: &LeafState) -> u64 {
    st.blobs()
        .iter()
        .flatten()
        .map(|blob| alloc_size(hot_blob_len(blob).unwrap_or(blob.len())) as u64)
        .sum()
}

#[cfg(test)]
impl DramTier {
    /// What a bypass pass would do to leaves that are all above the threshold, with
    /// room to spare for their blobs.
    pub(crate) fn make_every_leaf_hot(&self) {
        self.make_every_leaf(Heat::HotBlobs);
    }

    /// Every leaf kept as `heat` says.
    fn make_every_leaf(&self, heat: Heat) {
        let view = self.view();
        for id in self.leaves() {
            if let Some(leaf) = view.get(id.0).filter(|l| l.heat() != heat) {
                self.set_heat(leaf, heat);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::test_support::{key, settings, tier_with};
    use super::super::{DramSettings, DramTier, Lookup};
    use super::Heat;
    use crate::dictionary::tests::{documents, trained};
    use crate::memory::Memory;
    use crate::record::{Meta, is_compressed_blob, is_hot_blob};

    /// Blobs stored as is for heat, and compressed ones, in hot leaves and in the others.
    #[derive(Debug, Default, PartialEq)]
    struct Blobs {
        hot_in_hot: usize,
        compressed_in_hot: usize,
        hot_in_cool: usize,
        compressed_in_cool: usize,
    }

    fn blobs(dram: &DramTier) -> Blobs {
        let view = dram.view();
        let mut blobs = Blobs::default();
        for id in dram.leaves() {
            let leaf = view.get(id.0).expect("a live leaf");
            for blob in leaf.state.read().blobs().iter().flatten() {
                match (leaf.hot(), is_hot_blob(blob), is_compressed_blob(blob)) {
                    (true, true, _) => blobs.hot_in_hot += 1,
                    (true, _, true) => blobs.compressed_in_hot += 1,
                    (false, true, _) => blobs.hot_in_cool += 1,
                    (false, _, true) => blobs.compressed_in_cool += 1,
                    _ => {}
                }
            }
        }
        blobs
    }

    fn reads(dram: &DramTier, key: &[u8]) -> Option<Vec<u8>> {
        match dram.get(key, 0, true) {
            Lookup::Found(value, _, _) => Some(value),
            _ => None,
        }
    }

    /// Medium objects of a hot leaf are stored as is — those it held when it became hot,
    /// and those written to it while it is — and compressed again, with the leaf's
    /// dictionary, when it cools; each reads back its value throughout, and the blobs'
    /// DRAM is charged as they are.
    #[test]
    fn a_hot_leaf_keeps_its_medium_objects_as_is_until_it_cools() {
        let (dram, memory) = tier_with(settings(256));
        let dictionary = trained(1, 0, Arc::new(Memory::default()));
        let trainer = &dram.dictionaries.as_ref().expect("dictionaries on").blobs;
        trainer.make_current(Some(dictionary));
        let value = |i: u32, round: u64| documents(0, u64::from(i) << 8 | round, 1500);
        for i in 0..40 {
            dram.put_with(
                &key(i),
                Some(&value(i, 0)),
                Meta::default(),
                None,
                0,
                |_| (),
            );
        }
        dram.merge_all(0);
        let cool = blobs(&dram);
        assert_eq!((cool.compressed_in_cool, cool.hot_in_cool), (40, 0));
        let cool_bytes = memory.snapshot().mediums;

        dram.make_every_leaf_hot();
        assert_eq!(
            blobs(&dram),
            Blobs {
                hot_in_hot: 40,
                ..Blobs::default()
            }
        );
        assert!(
            memory.snapshot().mediums > cool_bytes + 40 * 1000,
            "charged as they are"
        );
        // Nothing compressed ahead of the lock either: `compress_ahead` offers each value
        // it compresses to the trainer.
        let offered = trainer.offered();
        for i in 0..10 {
            dram.put_with(
                &key(i),
                Some(&value(i, 1)),
                Meta::default(),
                None,
                0,
                |_| (),
            );
        }
        assert_eq!(trainer.offered(), offered);
        let written = blobs(&dram);
        assert_eq!(written.compressed_in_hot, 0, "{written:?}");
        assert!(written.hot_in_hot >= 40, "{written:?}");
        for i in 0..40 {
            assert_eq!(
                reads(&dram, &key(i)),
                Some(value(i, u64::from(i < 10))),
                "key {i}"
            );
        }

        dram.make_every_leaf(Heat::Cool);
        let cooled = blobs(&dram);
        assert_eq!(
            (cooled.hot_in_cool, cooled.hot_in_hot),
            (0, 0),
            "{cooled:?}"
        );
        assert!(cooled.compressed_in_cool >= 40);
        for i in 0..40 {
            assert_eq!(
                reads(&dram, &key(i)),
                Some(value(i, u64::from(i < 10))),
                "key {i}"
            );
        }
        dram.merge_all(0);
        assert!(
            memory.snapshot().mediums < cool_bytes + 10 * 1000,
            "compressed again"
        );
    }

    /// A hot leaf that splits keeps its heat in the part that stays; the new leaves start
    /// cool, and the blobs the merge moves into them are compressed again.
    #[test]
    fn a_merge_compresses_the_blobs_it_moves_out_of_a_hot_leaf() {
        let (dram, _) = tier_with(settings(256));
        let value = |i: u32| documents(1, u64::from(i), 1500);
        for i in 0..100 {
            dram.put_with(
                &key(i * 10),
                Some(&value(i * 10)),
                Meta::default(),
                None,
                0,
                |_| (),
            );
        }
        dram.merge_all(0);
        dram.make_every_leaf_hot();
        let leaves = dram.leaves().len();
        for i in 0..1000 {
            dram.put_with(&key(i), Some(&value(i)), Meta::default(), None, 0, |_| ());
        }
        dram.merge_all(0);
        assert!(dram.leaves().len() > leaves, "the hot leaves split");
        let after = blobs(&dram);
        assert_eq!(after.hot_in_cool, 0, "{after:?}");
        assert!(
            after.hot_in_hot > 0 && after.compressed_in_cool > 0,
            "{after:?}"
        );
        for i in 0..1000 {
            assert_eq!(reads(&dram, &key(i)), Some(value(i)), "key {i}");
        }
    }

    /// The blobs of a hot leaf are stored as is only while the DRAM budget has room to
    /// spare for them: with the tier's own use as its budget (full), the same hot leaf
    /// keeps its page as is and its blobs compressed; a budget with room stores them as
    /// is again.
    #[test]
    fn a_hot_leafs_blobs_are_stored_as_is_only_with_room_to_spare() {
        let settings = DramSettings {
            bypass_max_fraction: 0.5,
            ..settings(256)
        };
        let memory = Arc::new(Memory::default());
        let dram = DramTier::new(settings, memory.clone(), 3.0);
        let value = |i: u32| documents(0, u64::from(i), 1100);
        for i in 0..6000 {
            dram.put_with(&key(i), Some(&value(i)), Meta::default(), None, 0, |_| ());
        }
        dram.merge_all(0);
        assert!(dram.leaves().len() >= 12, "{} leaves", dram.leaves().len());
        let pass = |budget: i64| {
            for _ in 0..2000 {
                dram.get(&key(7), 0, false);
            }
            dram.bypass_pass(budget);
            dram.read_leaf(&key(7), |leaf, st| {
                let blobs = st.blobs().iter().flatten();
                let (as_is, compressed) = blobs.fold((0, 0), |(h, c), b| {
                    (
                        h + usize::from(is_hot_blob(b)),
                        c + usize::from(is_compressed_blob(b)),
                    )
                });
                (leaf.heat(), as_is, compressed)
            })
        };
        let (heat, as_is, compressed) = pass(i64::MAX / 2);
        assert_eq!(heat, Heat::HotBlobs);
        assert!(
            as_is > 0 && compressed == 0,
            "{as_is} as is, {compressed} compressed"
        );
        let (heat, as_is, compressed) = pass(memory.snapshot().total());
        assert_eq!(heat, Heat::Hot);
        assert!(
            as_is == 0 && compressed > 0,
            "{as_is} as is, {compressed} compressed"
        );
        assert_eq!(pass(i64::MAX / 2).0, Heat::HotBlobs);
        assert_eq!(reads(&dram, &key(7)), Some(value(7)));
        // A hot leaf of tiny values alone has no blobs to store as is.
        for i in 0..2000 {
            dram.put_with(
                &key(100_000 + i),
                Some(b"tiny"),
                Meta::default(),
                None,
                0,
                |_| (),
            );
        }
        dram.merge_all(0);
        let tiny = key(100_500);
        for _ in 0..4000 {
            dram.get(&tiny, 0, false);
        }
        dram.bypass_pass(i64::MAX / 2);
        let (heat, blobs) = dram.read_leaf(&tiny, |leaf, st| (leaf.heat(), st.blobs().len()));
        assert_eq!((heat, blobs), (Heat::Hot, 0));
    }
}
