//! A key's place in BT_SSD told in words, for a test's report of a wrong answer
//! (`ZipCache::explain`): the super-leaf and block a GET reads, and every block on the
//! device that holds a record of the key, whichever super-leaf its header names.

use std::collections::HashMap;
use std::fmt::Write;

use zipcache_device::AlignedBuf;

use super::SsdTier;
use super::block::{self, Owner};
use crate::btree::Shared;
use crate::format::block::{GENERATION, MAGIC, SUBPAGE, SUPERLEAF};
use crate::record::Payload;

/// Bytes of a value shown.
const SHOWN: usize = 24;

impl SsdTier {
    /// The super-leaf a GET of `key` asks, then every block of the device holding a
    /// record of `key` (may do I/O: the whole super-leaf region is read).
    pub(crate) fn explain(&self, key: &[u8]) -> String {
        let subpage = self.geometry.subpage_of(key);
        let mut out = self.tree.with_arc_leaf_locked::<Shared, _>(key, |_, st| {
            format!(
                "BT_SSD: super-leaf [{}, {}) slot {:?} generation {} sub-page {subpage} \
                     count {} version {}",
                shown(&st.range.low),
                st.range.high.as_deref().map_or("∞".into(), shown),
                st.slot,
                st.generation,
                st.counts[subpage],
                st.version,
            )
        });
        out.push_str(if self.hidden(key) {
            ", hidden"
        } else {
            ", not hidden"
        });
        let mut holders: HashMap<u32, (String, u32)> = HashMap::new();
        self.tree.for_each_leaf(|low, leaf| {
            let st = leaf.state.read();
            if let Some(slot) = st.slot {
                holders.insert(slot, (shown(low), st.generation));
            }
        });
        let m = self.settings.subpages as u64;
        let mut block = AlignedBuf::zeroed(1);
        let mut scratch = Vec::new();
        for lba in 0..u64::from(self.max_slots) * m {
            // may do I/O: one block
            if self.device.read(lba, &mut block).is_err() || !MAGIC.is_in(&block) {
                continue;
            }
            let owner = Owner {
                superleaf: SUPERLEAF.get(&block),
                generation: GENERATION.get(&block),
                subpage: SUBPAGE.get(&block),
            };
            let Some(records) = block::open(&block, owner, &self.dictionaries, &mut scratch) else {
                continue;
            };
            for r in records.filter(|r| r.key == key) {
                let value = match r.payload {
                    Payload::Inline(v) => shown(&v[..v.len().min(SHOWN)]),
                    Payload::Medium(_) => "medium".into(),
                    Payload::Tombstone => "tombstone".into(),
                };
                let holder = holders.get(&((lba / m) as u32));
                let _ = write!(
                    out,
                    "\n  block {lba} (slot {}, sub-page {}): {owner:?} holds {value} \
                     expires {:?}; the slot is now {holder:?}",
                    lba / m,
                    lba % m,
                    r.meta.expires_at_ms,
                );
            }
        }
        out
    }
}

fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
