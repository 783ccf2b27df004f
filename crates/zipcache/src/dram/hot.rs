//! Adaptive compression bypassing (paper §3.2): the hottest leaves, within a share of
//! the DRAM budget, keep their pages uncompressed.

use std::sync::atomic::Ordering;

use super::DramTier;
use super::leaf::{DramLeaf, HOT, RAW_PAGE, RETIRED};
use super::page::{DictionaryPage, Summary};
use crate::dictionary::page::PageDictionary;
use crate::memory::alloc_size;

impl DramTier {
    /// One pass of adaptive compression bypassing: choose the hot leaves, convert the
    /// leaves whose status changed, and age every counter.
    pub fn bypass_pass(&self) {
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
        let page = alloc_size(self.settings.leaf_size) as u64;
        let mut want = vec![false; leaves.len()];
        let mut pinned = 0;
        for i in self.bypass.choose(&counts, leaves.len()) {
            let beside_page = {
                let charge = self.charge_of(leaves[i], &leaves[i].state.read());
                (charge.write_buffers + charge.mediums) as u64
            };
            pinned += page + beside_page;
            if pinned > hot_budget {
                break;
            }
            want[i] = true;
        }
        for (leaf, (want, count)) in leaves.iter().zip(want.into_iter().zip(counts)) {
            if leaf.hot() != want {
                self.set_hot(leaf, want);
            }
            leaf.access.store(count >> 1, Ordering::Relaxed);
        }
    }

    pub(super) fn set_hot(&self, leaf: &DramLeaf, hot: bool) {
        let mut st = leaf.state.write();
        if leaf.has(RETIRED) {
            return;
        }
        leaf.set(HOT, hot);
        self.counters
            .hot_leaves
            .fetch_add(if hot { 1 } else { -1 }, Ordering::Relaxed);
        if leaf.raw_page() == hot {
            return;
        }
        let converted = st
            .page
            .as_deref()
            .map(|page| self.repage(leaf, page, st.page_dictionary(), hot));
        self.charged(leaf, &mut st, |st| match converted {
            None => {}
            Some(Some((page, dictionary, lz4_beat))) => {
                st.set_page(Some(page), dictionary);
                leaf.lz4_beat.store(lz4_beat, Ordering::Relaxed);
                leaf.set(RAW_PAGE, hot);
            }
            Some(None) => {
                // Damaged (the leaf is marked lost): its objects are gone either way.
                st.page = None;
                if let Some(extras) = &mut st.extras {
                    extras.blobs = thin_vec::ThinVec::new();
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
}

#[cfg(test)]
impl DramTier {
    /// What a bypass pass would do to leaves that are all above the threshold.
    pub(crate) fn make_every_leaf_hot(&self) {
        let view = self.view();
        for id in self.leaves() {
            if let Some(leaf) = view.get(id.0).filter(|l| !l.hot()) {
                self.set_hot(leaf, true);
            }
        }
    }
}
