//! CAS versions handed out per leaf, so that a page's versions stay close (see
//! `next_cas`), and the floor below which no version may be handed out again.

use std::sync::atomic::Ordering;

use super::DramTier;
use super::leaf::{DramLeaf, LOST, LeafState};
use super::page::Summary;
use super::write_buffer::WriteBuffer;

impl DramTier {
    /// The page of a locked leaf is damaged (counted): see `LOST`.
    pub(super) fn mark_lost(&self, leaf: &DramLeaf) {
        self.counters.corrupt_pages.fetch_add(1, Ordering::Relaxed);
        leaf.set(LOST, true);
        // Which versions the page held is unknown: none of them may be handed out again.
        self.raise_cas_floor(self.cas_high.load(Ordering::Acquire));
    }

    /// A new CAS version for a write into a locked leaf. Versions only need to differ
    /// between the versions of one key (clients compare a key's version with what they
    /// read of that key), so instead of one counter for all writes — which spreads the
    /// versions of a page over everything written while it filled, costing three or four
    /// incompressible bytes each — a write takes the first version above both the
    /// leaf's own (`leaf_cas_top`) and every version that left DRAM (`cas_floor`).
    /// Every version ever handed out for a key is either in its leaf (so at most the
    /// leaf's top) or gone from DRAM (so below the floor), hence below the new one; and
    /// the floor moves only when versions leave, so the versions of one page stay close
    /// and their deltas (`record.rs`) take a byte.
    pub(super) fn next_cas(&self, st: &LeafState) -> u64 {
        let floor = self.cas_floor.load(Ordering::Acquire);
        let cas = floor.max(self.leaf_cas_top(st).saturating_add(1));
        self.cas_high.fetch_max(cas, Ordering::AcqRel);
        cas
    }

    /// The largest CAS version in a locked leaf's page and buffer (0 for none).
    pub(super) fn leaf_cas_top(&self, st: &LeafState) -> u64 {
        let page = st.page.as_deref().and_then(|page| {
            let (summary, packed) = Summary::split(page)?;
            let base = self.layout.table(packed)?.cas_base();
            Some(base.0.wrapping_add(summary.cas_top_above_base))
        });
        let buffer = st.buffer().map(WriteBuffer::cas_top);
        page.unwrap_or(0).max(buffer.unwrap_or(0))
    }

    /// Versions up to `cas` left DRAM: none may be handed out again.
    pub(super) fn raise_cas_floor(&self, cas: u64) {
        if cas != 0 {
            self.cas_floor
                .fetch_max(cas.saturating_add(1), Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use parking_lot::Mutex;

    use super::super::test_support::*;
    use super::*;
    use crate::btree::Fence;
    use crate::dram::{Change, DramSettings, Lookup};
    use crate::record::{ASSIGN_CAS, Meta};

    /// Every new CAS version of a key is above every version handed out for it before,
    /// through overwrites (by versions of the client's choosing too), deletes, expiry,
    /// merges, splits, evictions (to nowhere and to a lower tier whose copies come back
    /// as clean objects) and damaged pages, of inline and medium values.
    #[test]
    fn a_keys_cas_versions_only_grow() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (dram, _) = tier_with(DramSettings {
            tiny_max: 96,
            dictionaries: None,
            ..settings(128)
        });
        let sink = RecordingSink {
            span: (Fence::from(&[][..]), None),
            batches: Mutex::default(),
        };
        let mut last: BTreeMap<u32, u64> = BTreeMap::new();
        let mut now = 0;
        let assign = Meta {
            cas: ASSIGN_CAS,
            ..Meta::default()
        };
        for step in 0..20_000 {
            let k = rng.random_range(0..300u32);
            let key = format!("{k:016}").into_bytes();
            let value = vec![k as u8; rng.random_range(1..120)];
            let cas = match rng.random_range(0..10) {
                0 => {
                    dram.delete(&key, now, |_| ());
                    None
                }
                1 => Some(dram.modify(&key, now, |_, cas| {
                    (
                        Some(Change::Put((value.clone(), assign.assigning(cas), None))),
                        cas,
                    )
                })),
                2 => {
                    let meta = Meta {
                        expires_at_ms: Some(now + 1),
                        ..assign
                    };
                    Some(dram.put_with(&key, Some(&value), meta, None, now, |cas| cas))
                }
                3 => {
                    dram.evict_one(Some(&sink), now);
                    None
                }
                4 if step % 50 == 0 => {
                    dram.corrupt_page_of(&key);
                    None
                }
                5 => {
                    dram.evict_one(None, now);
                    None
                }
                6 => {
                    let meta = Meta {
                        cas: rng.random(),
                        client_cas: true,
                        ..Meta::default()
                    };
                    dram.put_with(&key, Some(&value), meta, None, now, |_| ());
                    None
                }
                _ => Some(dram.put_with(&key, Some(&value), assign, None, now, |cas| cas)),
            };
            if let Some(cas) = cas {
                let before = last.insert(k, cas).unwrap_or(0);
                assert!(cas > before, "key {k}: version {cas} after {before}");
            }
            // Some of what went below comes back as clean copies, versions and all.
            for batch in sink.batches.lock().drain(..) {
                for o in batch
                    .into_iter()
                    .filter(|o| o.value.is_some() && o.key[15] % 2 == 0)
                {
                    dram.modify(&o.key, now, |current, _| {
                        let change = (current == Lookup::Absent).then(|| {
                            let meta = Meta {
                                clean: true,
                                ..o.meta
                            };
                            Change::Put((o.value.clone().unwrap(), meta, None))
                        });
                        (change, ())
                    });
                }
            }
            now += rng.random_range(0..2);
        }
    }

    /// A version of the client's choosing that replaces the buffer's last record, the
    /// key's newest, is appended below it: the version it hides leaves only with a merge,
    /// which raises the floor over it, so it is never handed out again.
    #[test]
    fn a_version_hidden_by_a_clients_is_never_handed_out_again() {
        let (dram, _) = tier_with(DramSettings {
            tiny_max: 96,
            dictionaries: None,
            ..settings(4096)
        });
        let assign = Meta {
            cas: ASSIGN_CAS,
            ..Meta::default()
        };
        let clients = Meta {
            cas: 3,
            client_cas: true,
            ..Meta::default()
        };
        for (k, len) in [(1, 16), (2, 200)] {
            let key = key(k);
            let first = dram.put_with(&key, Some(&vec![1; len]), assign, None, 0, |cas| cas);
            dram.put_with(&key, Some(&vec![2; len]), clients, None, 0, |_| ());
            dram.merge_all(0);
            let next = dram.put_with(&key, Some(&vec![3; len]), assign, None, 0, |cas| cas);
            assert!(next > first, "{len}-byte values: {next} after {first}");
        }
    }

    /// Written in random key order, without a counter shared by all writes, the versions
    /// of each page stay within a two-byte delta of its base.
    #[test]
    fn cas_versions_in_a_page_stay_close() {
        let (dram, _) = tier_with(settings(256));
        let assign = Meta {
            cas: ASSIGN_CAS,
            ..Meta::default()
        };
        for n in 0..40_000u32 {
            let i = n.wrapping_mul(2_654_435_761) % 1_000_000;
            dram.put_with(
                &format!("{i:016}").into_bytes(),
                Some(&[1; 64]),
                assign,
                None,
                0,
                |_| (),
            );
            if n % 64 == 0 {
                dram.evict_one(None, 0);
            }
        }
        dram.merge_all(0);
        let view = dram.view();
        for id in dram.leaves() {
            let st = view.get(id.0).unwrap().state.read();
            let Some(page) = st.page.as_deref() else {
                continue;
            };
            let (summary, packed) = Summary::split(page).unwrap();
            let base = dram.layout.table(packed).unwrap().cas_base();
            assert!(base.0 >= 1 << 40);
            assert!(summary.cas_top_above_base < 1 << 14, "{summary:?}");
        }
    }
}
