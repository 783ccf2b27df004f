//! A merge that patches the page instead of rebuilding it: on a leaf of tiny values (no
//! blobs, no access table, not hot) whose buffer only sets values that never expire,
//! with versions the engine assigned, the sub-pages that no buffered key hashes to are
//! copied as they are, and only the others are walked and written again, each write
//! replacing its key's record (the one record decoded whole) or joining the sub-page in
//! key order. The page that comes out is the one the whole merge (`merge_locked`)
//! builds, byte for byte, so a leaf takes this way only where that is certain: its CAS
//! base stays (no replaced record holds it), the records copied are inline values
//! without an expiry (a merge drops expired ones), its sub-pages hold their keys in
//! order, and the objects still fit one page. Anything else merges whole.
//!
//! In a SET load of 64-byte values over 200,000 keys, parsing every record of the page
//! into the merge's objects and encoding them again took most of the merger's CPU
//! besides LZ4; a merge of ~6 writes touches ~5 of 16 sub-pages.

use std::sync::atomic::Ordering;

use super::DramTier;
use super::leaf::{DramLeaf, LeafContents, LeafState, install};
use super::page::{PriorPage, Summary, Won};
use crate::record::{Payload, Record, kind_key_and_len, lasting_inline};

/// A page patched, and the page it replaces.
pub(super) struct Patched {
    pub(super) summary: Summary,
    /// Header and body, uncompressed.
    pub(super) packed: Vec<u8>,
    prior: PriorPage,
    /// The largest version that leaves with the merge (0 for none).
    gone: u64,
}

/// A buffered write as a patch applies it: the newest of its key.
struct Write<'a> {
    subpage: usize,
    record: Record<'a>,
    /// The largest version among the key's older buffered writes.
    replaced_cas: u64,
}

impl Write<'_> {
    /// The version that leaves when this write replaces the versions before it, the
    /// page's (`page_cas`, 0 for none) among them: none if the write has a version
    /// (which stays above them), else the largest of theirs.
    fn gone(&self, page_cas: u64) -> u64 {
        if self.record.meta.ordered_cas() == 0 {
            self.replaced_cas.max(page_cas)
        } else {
            0
        }
    }
}

impl DramTier {
    /// Merges a locked leaf's buffer by patching its page; false, having changed
    /// nothing, where a patch would not be the whole merge's page (`patched`).
    pub(super) fn merge_by_patching(&self, leaf: &DramLeaf, st: &mut LeafState) -> bool {
        let Some(patched) = self.patched(leaf, st) else {
            return false;
        };
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        self.raise_cas_floor(patched.gone);
        let before = self.charge_of(leaf, st);
        // The box goes, as with the whole merge: the buffer and its counts with it.
        let extras = st.extras.take().unwrap_or_default();
        self.offer_tiny(&extras.buffer);
        // may compress: the page, once or twice (`DramTier::page`)
        let (page, page_dictionary, lz4_beat) =
            self.page(patched.summary, &patched.packed, false, Some(patched.prior));
        drop(extras);
        install(
            leaf,
            st,
            LeafContents {
                page: Some(page),
                lz4_beat,
                raw: false,
                blobs: thin_vec::ThinVec::new(),
                dictionary: None,
                page_dictionary,
                access_table: None,
            },
        );
        self.memory.change(&before, &self.charge_of(leaf, st));
        true
    }

    /// The page a merge of a locked leaf makes, patched (see the module doc); `None`
    /// where patching does not apply.
    pub(super) fn patched(&self, leaf: &DramLeaf, st: &LeafState) -> Option<Patched> {
        if leaf.lost() || leaf.raw_page() || leaf.hot() {
            return None;
        }
        let extras = st.extras.as_deref()?;
        if !extras.blobs.is_empty() || extras.access_table.is_some() {
            return None;
        }
        let stored = st.page.as_deref()?;
        let (old, _) = Summary::split(stored)?;
        let mut writes = Vec::with_capacity(8);
        for record in extras.buffer.records() {
            let Payload::Inline(value) = record.payload else {
                return None;
            };
            let meta = &record.meta;
            if self.is_medium(record.key, value) || meta.expires_at_ms.is_some() || meta.client_cas
            {
                return None;
            }
            writes.push(Write {
                subpage: self.layout.subpage_of(record.key),
                record,
                replaced_cas: 0,
            });
        }
        // Stable: a key's writes stay in the order written, and the newest is kept,
        // knowing the largest version it replaced.
        writes.sort_by(|a, b| {
            (a.subpage.cmp(&b.subpage)).then_with(|| a.record.key.cmp(b.record.key))
        });
        writes.dedup_by(|next, kept| {
            let same = next.subpage == kept.subpage && next.record.key == kept.record.key;
            if same {
                let replaced_cas = kept.replaced_cas.max(kept.record.meta.ordered_cas());
                std::mem::swap(next, kept);
                kept.replaced_cas = replaced_cas;
            }
            same
        });
        let (table, body) = self.decode_with_table(leaf, Some(stored), st.page_dictionary())?;
        // The base stays if no write's version lies below it, or names one where the
        // page has none.
        let base = table.cas_base();
        let moves_base = |cas: u64| cas != 0 && (base.0 == 0 || cas < base.0);
        if writes.iter().any(|w| moves_base(w.record.meta.cas)) {
            return None;
        }
        let old_top = base.0.wrapping_add(old.cas_top_above_base);
        let mut summary = Summary {
            dictionary: 0,
            ..old
        };
        let mut top_replaced = false;
        let mut lens = vec![0; self.layout.subpages];
        let mut out = Vec::with_capacity(body.len() + 128 * writes.len());
        let written_top = writes.iter().map(|w| w.record.meta.ordered_cas()).max();
        // Versions that leave: those an unversioned write replaced (the CAS floor passes
        // them, as `survivors` has it).
        let mut gone = 0;
        let mut writes = writes.into_iter().peekable();
        let add = |summary: &mut Summary, w: &Record, out: &mut Vec<u8>| {
            summary.raw_bytes += record_bytes(w);
            summary.clean += u64::from(w.meta.clean);
            w.encode_in(out, base);
        };
        let mut end = 0;
        for (s, len) in lens.iter_mut().enumerate() {
            let start = end;
            end = table.end(s);
            let sub = body.get(start..end)?;
            let before = out.len();
            if writes.peek().is_none_or(|w| w.subpage != s) {
                let mut at = 0;
                while at < sub.len() {
                    let (kind, _, len) = kind_key_and_len(&sub[at..])?;
                    if !lasting_inline(kind) {
                        return None;
                    }
                    at += len;
                }
                out.extend_from_slice(sub);
                *len = sub.len();
                continue;
            }
            let mut last: Option<&[u8]> = None;
            let mut at = 0;
            while at < sub.len() {
                // A record a write passes is copied: its key and kind tell enough. Only
                // one replaced is decoded whole.
                let (kind, key, used) = kind_key_and_len(&sub[at..])?;
                if !lasting_inline(kind) || last.is_some_and(|k| k >= key) {
                    return None;
                }
                last = Some(key);
                while let Some(w) = writes.next_if(|w| w.subpage == s && w.record.key < key) {
                    summary.objects += 1;
                    gone = gone.max(w.gone(0));
                    add(&mut summary, &w.record, &mut out);
                }
                match writes.next_if(|w| w.subpage == s && w.record.key == key) {
                    Some(w) => {
                        let (r, _) = Record::parse_in(&sub[at..at + used], base)?;
                        if r.meta.cas == base.0 && base.0 != 0 {
                            // The base may move.
                            return None;
                        }
                        top_replaced |= r.meta.ordered_cas() == old_top;
                        gone = gone.max(w.gone(r.meta.ordered_cas()));
                        let w = w.record;
                        summary.raw_bytes = summary.raw_bytes.saturating_sub(record_bytes(&r));
                        summary.clean = summary.clean.saturating_sub(u64::from(r.meta.clean));
                        add(&mut summary, &w, &mut out);
                    }
                    None => out.extend_from_slice(&sub[at..at + used]),
                }
                at += used;
            }
            while let Some(w) = writes.next_if(|w| w.subpage == s) {
                summary.objects += 1;
                gone = gone.max(w.gone(0));
                add(&mut summary, &w.record, &mut out);
            }
            *len = out.len() - before;
        }
        if out.len() > self.layout.capacity {
            return None;
        }
        summary.cas_top_above_base =
            new_top(old_top, top_replaced, written_top.unwrap_or(0))?.wrapping_sub(base.0);
        let mut packed = self.layout.header(lens, base, out.len());
        packed.extend_from_slice(&out);
        let won = match st.page_dictionary() {
            Some(dictionary) => Won::Dictionary(dictionary.version()),
            None => Won::Lz4(leaf.lz4_beat.load(Ordering::Relaxed)),
        };
        let prior = PriorPage {
            won,
            stored: stored.len(),
            packed: table.len() + body.len(),
        };
        Some(Patched {
            summary,
            packed,
            prior,
            gone,
        })
    }
}

/// Key and value bytes of an inline record (`Summary::raw_bytes`).
fn record_bytes(r: &Record) -> u64 {
    let value = match r.payload {
        Payload::Inline(v) => v.len(),
        Payload::Medium(_) | Payload::Tombstone => 0,
    };
    (r.key.len() + value) as u64
}

/// The largest version after the patch, from the page's (`old_top`, which a replaced
/// record may have held) and the buffer's; `None` if a replaced record held it and no
/// write passes it (then the next largest is unknown).
fn new_top(old_top: u64, top_replaced: bool, written_top: u64) -> Option<u64> {
    match (top_replaced, written_top >= old_top) {
        (_, true) => Some(written_top),
        (false, false) => Some(old_top),
        (true, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::merge::Shed;
    use super::super::test_support::*;
    use super::*;
    use crate::record::Meta;

    /// The page of `key`'s leaf: its summary (the dictionary aside) and its packed page
    /// uncompressed.
    fn page_of(dram: &DramTier, key: &[u8]) -> (Summary, Vec<u8>) {
        dram.read_leaf(key, |leaf, st| {
            let (summary, packed) = Summary::split(st.page.as_deref().unwrap()).unwrap();
            let header = dram.layout.table(packed).unwrap().len();
            let (_, body) = dram
                .decode(leaf, st.page.as_deref(), st.page_dictionary())
                .unwrap();
            let summary = Summary {
                dictionary: 0,
                ..summary
            };
            (summary, [&packed[..header], &body].concat())
        })
    }

    fn value(v: u8) -> Vec<u8> {
        if v == 5 {
            vec![b'v'; 600]
        } else {
            format!("value {v}").into_bytes()
        }
    }

    /// Versions from here up: above the tier's first CAS floor (`cas_origin`), so that
    /// the floor a merge raises shows.
    const V: u64 = 1 << 40;

    /// A write's metadata, of one of these kinds (version `cas` where it has one).
    fn meta(kind: u8, cas: u64) -> Meta {
        let meta = Meta {
            cas,
            ..Meta::default()
        };
        match kind {
            0 => Meta {
                expires_at_ms: Some(10_000),
                ..meta
            },
            // Below the page's base, and above it but likely below its top.
            1 => Meta {
                cas: V + 500,
                ..meta
            },
            2 => Meta {
                cas: V + 1_002,
                ..meta
            },
            3 => Meta {
                clean: true,
                ..meta
            },
            4 => Meta {
                client_cas: true,
                ..meta
            },
            5 => Meta { cas: 0, ..meta },
            // A collection's header (kind bit 6), with a version and without.
            6 => Meta {
                collection: true,
                ..meta
            },
            7 => Meta {
                cas: 0,
                collection: true,
                ..meta
            },
            _ => meta,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Where a patch applies, its page is the one the whole merge builds, byte for
        /// byte; where the whole merge splits the leaf, no patch applies. Pages and
        /// writes of every kind a patch declines: expiring values, versions below the
        /// base or below the top, clean copies, clients' versions, values too large; and
        /// collections' headers, which it patches in and copies with their mark.
        #[test]
        fn a_patched_page_is_the_page_the_whole_merge_builds(
            merged in proptest::collection::vec((0u32..24, 0u8..6, 0u8..10), 1..30),
            written in proptest::collection::vec((0u32..24, 0u8..6, 0u8..20), 1..8),
        ) {
            let (dram, _) = tier_with(settings(1 << 16));
            assert_eq!(dram.settings.cas_origin, V);
            let mut cas = V + 1_000;
            let mut put = |i: u32, v: u8, kind: u8| {
                cas += 1;
                dram.put_with(&key(i), Some(&value(v)), meta(kind, cas), None, 0, |_| ());
            };
            for &(i, v, kind) in &merged {
                put(i, v, kind);
            }
            dram.merge_all(0);
            prop_assume!(dram.leaf_count() == 1);
            for &(i, v, kind) in &written {
                put(i, v, kind);
            }
            let floor = dram.cas_floor.load(Ordering::Relaxed);
            let patched = dram.read_leaf(&key(0), |leaf, st| {
                dram.patched(leaf, st).map(|p| {
                    let summary = Summary { dictionary: 0, ..p.summary };
                    let floor = if p.gone == 0 { floor } else { floor.max(p.gone + 1) };
                    (summary, p.packed, floor)
                })
            });
            // After the values written to expire have: the whole merge drops them.
            dram.write_leaf(&key(0), |_, leaf, st| {
                dram.merge_whole(leaf, st, 20_000, Shed::Nothing);
            });
            if dram.leaf_count() > 1 {
                prop_assert!(patched.is_none());
            } else if let Some((summary, packed, floor)) = patched {
                prop_assert_eq!((summary, packed), page_of(&dram, &key(0)));
                prop_assert_eq!(floor, dram.cas_floor.load(Ordering::Relaxed));
            }
        }
    }

    /// The largest version after a patch is known unless the record that held it was
    /// replaced by a lower one.
    #[test]
    fn the_top_version_after_a_patch() {
        assert_eq!(new_top(10, false, 12), Some(12));
        assert_eq!(new_top(10, true, 12), Some(12));
        assert_eq!(new_top(10, false, 5), Some(10));
        assert_eq!(new_top(10, true, 5), None);
    }

    /// Writes that no longer fit one page are not patched in: the leaf splits.
    #[test]
    fn writes_past_a_page_are_not_patched() {
        let (dram, _) = tier_with(settings(1 << 16));
        for i in 0..6 {
            dram.put_with(
                &key(i),
                Some(&value(5)),
                meta(9, 1_001 + u64::from(i)),
                None,
                0,
                |_| (),
            );
        }
        dram.merge_all(0);
        assert_eq!(dram.leaf_count(), 1);
        dram.put_with(&key(6), Some(&value(5)), meta(9, 1_010), None, 0, |_| ());
        let patched = dram.read_leaf(&key(0), |leaf, st| dram.patched(leaf, st).is_some());
        assert!(!patched);
        dram.merge_all(0);
        assert_eq!(dram.leaf_count(), 2);
    }

    /// A page whose sub-page does not hold its keys in order (never built so) is not
    /// patched where a write lands: the write could not meet its key's record.
    #[test]
    fn a_sub_page_out_of_order_is_not_patched() {
        let (dram, _) = tier_with(settings(1 << 16));
        let keys: Vec<Vec<u8>> = (0..200).map(key).collect();
        let subpage = |k: &[u8]| dram.layout.subpage_of(k);
        let (a, b) = keys
            .iter()
            .enumerate()
            .find_map(|(i, a)| {
                let b = keys[i + 1..].iter().find(|b| subpage(b) == subpage(a))?;
                Some((a, b))
            })
            .expect("two keys of one sub-page");
        let record = |key, cas| Record {
            key,
            payload: Payload::Inline(b"old"),
            meta: meta(9, cas),
        };
        let mut placed = [
            (subpage(a), record(b, 1_002)),
            (subpage(a), record(a, 1_001)),
        ];
        let packed = dram.layout.build(&mut placed).expect("fits");
        let summary = Summary {
            objects: 2,
            raw_bytes: (a.len() + b.len() + 6) as u64,
            cas_top_above_base: 1,
            ..Summary::default()
        };
        dram.write_leaf(a, |_, _, st| {
            st.page = Some(dram.page(summary, &packed, false, None).0);
        });
        dram.put_with(a, Some(b"new"), meta(9, 1_003), None, 0, |_| ());
        let patched = dram.read_leaf(a, |leaf, st| dram.patched(leaf, st).is_some());
        assert!(!patched);
    }

    /// Collections' headers are patched in, replaced and copied with their mark (record
    /// kind bit 6): a header made a string loses it, a string made a header gains it.
    #[test]
    fn headers_keep_their_mark_through_a_patch() {
        let (dram, _) = tier_with(settings(1 << 16));
        let mut cas = 1_000;
        let mut put = |i: u32, kind: u8| {
            cas += 1;
            dram.put_with(&key(i), Some(&value(1)), meta(kind, cas), None, 0, |_| ());
        };
        // Even keys headers, odd ones strings.
        for i in 0..40 {
            put(i, if i % 2 == 0 { 6 } else { 9 });
        }
        dram.merge_all(0);
        // Two overwritten each way, and two new keys of each type.
        for (i, kind) in [
            (2, 9),
            (4, 9),
            (3, 6),
            (5, 7),
            (40, 6),
            (41, 9),
            (42, 9),
            (43, 7),
        ] {
            put(i, kind);
        }
        let patched = dram.read_leaf(&key(0), |leaf, st| dram.patched(leaf, st).is_some());
        assert!(patched);
        let merges = dram.counters.merges.load(Ordering::Relaxed);
        dram.merge_all(0);
        assert_eq!(dram.counters.merges.load(Ordering::Relaxed), merges + 1);
        for i in 0..44 {
            let want = match i {
                2 | 4 | 41 | 42 => false,
                3 | 5 | 40 | 43 => true,
                i => i % 2 == 0,
            };
            match dram.get(&key(i), 0, true) {
                super::super::Lookup::Found(v, meta, _) => {
                    assert_eq!((v, meta.collection), (value(1), want), "key {i}");
                }
                other => panic!("key {i}: {other:?}"),
            }
        }
    }

    /// Overwrites and new keys with values that never expire patch the page; the
    /// values read back, and the page is the whole merge's.
    #[test]
    fn plain_writes_patch_the_page() {
        let (dram, _) = tier_with(settings(1 << 16));
        let mut cas = 1_000;
        let mut put = |i: u32, v: u8| {
            cas += 1;
            dram.put_with(&key(i), Some(&value(v)), meta(9, cas), None, 0, |_| ());
        };
        for i in 0..40 {
            put(i * 2, 1);
        }
        dram.merge_all(0);
        for i in [3, 4, 17, 40, 41] {
            put(i, 2);
        }
        let patched = dram.read_leaf(&key(0), |leaf, st| dram.patched(leaf, st).is_some());
        assert!(patched);
        let merges = dram.counters.merges.load(Ordering::Relaxed);
        dram.merge_all(0);
        assert_eq!(dram.counters.merges.load(Ordering::Relaxed), merges + 1);
        for i in 0..80 {
            let want = match i {
                3 | 4 | 17 | 40 | 41 => Some(value(2)),
                i if i % 2 == 0 => Some(value(1)),
                _ => None,
            };
            let got = match dram.get(&key(i), 0, true) {
                super::super::Lookup::Found(v, _, _) => Some(v),
                _ => None,
            };
            assert_eq!(got, want, "key {i}");
        }
        assert_eq!(dram.tally(0).objects, 43);
    }
}
