//! The BT_DRAM leaf page (paper §3.2, Fig. 5), with sub-pages of variable length: an
//! object still goes to sub-page `f(key) mod n`, but the sub-pages are laid end to end
//! without padding, and a small table of where each one ends stands uncompressed in
//! front of the (compressed) body. A GET decompresses the body only through the end of
//! its own sub-page (early termination, `early_termination.rs`), and a leaf splits when
//! its records no longer fit `leaf_size` — not, as with fixed sub-pages, as soon as one
//! hash bin overflows, which left pages mostly padding and leaves of ~7 objects.
//!
//! ```text
//! page   := header body          (body: LZ4 of it while cold, as is while hot)
//! header := ends[0] .. ends[n-1]  (u16 LE each, u32 LE when leaf_size > 65,535)
//!           cas_base              (varint: the smallest CAS version in the page, 0 if none)
//! body   := sub-page 0 | sub-page 1 | ... | sub-page n-1      (bytes ends[n-1])
//! sub-page i := records, bytes ends[i-1]..ends[i]             (ends[-1] = 0)
//! ```
//!
//! Records store their CAS version as the distance from `cas_base` (`record.rs`). The
//! header is checked before use (ends never decrease, the last is within the page, the
//! base is a whole varint): a damaged one reads as a damaged page, never as a slice out
//! of bounds.

use std::ops::Range;

use super::early_termination::{Chunks, MAX_CHUNKS};
use crate::format::page::end_width;
use crate::record::{CasBase, Record, put_varint, read_varint, records_in};

#[derive(Clone, Copy, Debug)]
pub struct PackedLayout {
    pub subpages: usize,
    /// Chunks the body is compressed in (`early_termination.rs`), each of a run of whole
    /// sub-pages: chunk `c` holds sub-pages `c × subpages / chunks` up to the next's.
    pub chunks: usize,
    /// Most body bytes one page holds (`leaf_size`).
    pub capacity: usize,
    pub hash: fn(&[u8], usize) -> usize,
}

/// A page's checked header: where each sub-page ends, and the CAS base of its records.
pub struct Table<'p> {
    ends: &'p [u8],
    width: usize,
    cas_base: CasBase,
    /// Bytes of the header, ends and base together.
    len: usize,
}

impl PackedLayout {
    /// Bytes of one table entry.
    fn width(&self) -> usize {
        end_width(self.capacity)
    }

    /// Bytes of the end table at the front of every page (the header without its base).
    pub fn table_len(&self) -> usize {
        self.subpages * self.width()
    }

    pub fn subpage_of(&self, key: &[u8]) -> usize {
        (self.hash)(key, self.subpages)
    }

    /// Whether `records` fit one page.
    pub fn fits<'a>(&self, records: impl Iterator<Item = Record<'a>> + Clone) -> bool {
        let base = CasBase::of_versions(records.clone().map(|r| r.meta.cas));
        records.map(|r| r.encoded_len_in(base)).sum::<usize>() <= self.capacity
    }

    /// The page for `records`, each with its sub-page (`subpage_of` its key), uncompressed:
    /// header, then body; a sub-page's records in the order given. `None` if they do not
    /// fit.
    ///
    /// Records given in sub-page order (as a merge that does not split hands them over)
    /// are encoded straight into the page; others are put in that order first.
    pub fn build(&self, records: &mut [(usize, Record<'_>)]) -> Option<Vec<u8>> {
        // Stable, and a single pass over records already in order.
        records.sort_by_key(|&(subpage, _)| subpage);
        let base = CasBase::of(records.iter().map(|(_, r)| r));
        let mut ends = vec![0usize; self.subpages];
        for (subpage, r) in records.iter() {
            ends[*subpage] += r.encoded_len_in(base);
        }
        let body: usize = ends.iter().sum();
        if body > self.capacity {
            return None;
        }
        let mut page = self.header(ends, base, body);
        for (_, r) in records.iter() {
            r.encode_in(&mut page, base);
        }
        Some(page)
    }

    /// A page's header for sub-pages of `lens` bytes and `base`, in a vector with room
    /// for the `body` bytes that follow.
    pub fn header(
        &self,
        lens: impl IntoIterator<Item = usize>,
        base: CasBase,
        body: usize,
    ) -> Vec<u8> {
        let mut page = Vec::with_capacity(self.table_len() + 10 + body);
        let mut end = 0;
        for len in lens {
            end += len;
            page.extend_from_slice(&(end as u32).to_le_bytes()[..self.width()]);
        }
        put_varint(&mut page, base.0);
        page
    }

    /// Every record of a body, with the sub-page it is stored in, sub-page by sub-page.
    pub fn placed<'p>(
        &self,
        table: &Table<'_>,
        body: &'p [u8],
    ) -> impl Iterator<Item = (usize, Record<'p>)> {
        let cas_base = table.cas_base;
        let ends: Vec<usize> = (0..self.subpages).map(|i| table.end(i)).collect();
        (0..self.subpages).flat_map(move |i| {
            let start = if i == 0 { 0 } else { ends[i - 1] };
            let sub = body.get(start..ends[i]).unwrap_or_default();
            records_in(sub, cas_base).map(move |r| (i, r))
        })
    }

    /// The header at the front of `page`, checked; `None` if it is damaged.
    pub fn table<'p>(&self, page: &'p [u8]) -> Option<Table<'p>> {
        let ends = page.get(..self.table_len())?;
        let (base, base_len) = read_varint(&page[ends.len()..])?;
        let table = Table {
            ends,
            width: self.width(),
            cas_base: CasBase(base),
            len: ends.len() + base_len,
        };
        let mut last = 0;
        for i in 0..self.subpages {
            let end = table.end(i);
            if end < last {
                return None;
            }
            last = end;
        }
        (last <= self.capacity).then_some(table)
    }

    /// A page split into its checked header and its body; `None` if the header is damaged.
    pub fn split<'p>(&self, page: &'p [u8]) -> Option<(Table<'p>, &'p [u8])> {
        let table = self.table(page)?;
        let body = &page[table.len..];
        Some((table, body))
    }

    /// Where `key`'s sub-page lies in the body.
    pub fn subpage_for(&self, table: &Table<'_>, key: &[u8]) -> Range<usize> {
        table.subpage(self.subpage_of(key))
    }

    /// Where each chunk of a body with header `table` ends (`chunks` taken within 1 and
    /// the sub-pages, at most `MAX_CHUNKS`); `None` for a table whose ends decrease.
    pub fn chunks(&self, table: &Table<'_>) -> Option<Chunks> {
        let k = self.chunks.clamp(1, self.subpages.min(MAX_CHUNKS));
        Chunks::new((0..k).map(|c| table.end((c + 1) * self.subpages / k - 1)))
    }

    /// The record of `key` in a body (or in any bytes that hold its sub-page where the
    /// body would).
    pub fn find<'p>(&self, table: &Table<'_>, body: &'p [u8], key: &[u8]) -> Option<Record<'p>> {
        self.find_in(table, body.get(self.subpage_for(table, key))?, key)
    }

    /// The record of `key` in `subpage`, the bytes of its sub-page.
    pub fn find_in<'p>(
        &self,
        table: &Table<'_>,
        subpage: &'p [u8],
        key: &[u8],
    ) -> Option<Record<'p>> {
        records_in(subpage, table.cas_base).find(|r| r.key == key)
    }

    /// Every record of a body whose header names `cas_base`, sub-page by sub-page.
    pub fn all<'p>(&self, cas_base: CasBase, body: &'p [u8]) -> impl Iterator<Item = Record<'p>> {
        records_in(body, cas_base)
    }
}

impl Table<'_> {
    /// Where sub-page `i` lies in the body.
    pub fn subpage(&self, i: usize) -> Range<usize> {
        let start = if i == 0 { 0 } else { self.end(i - 1) };
        start..self.end(i)
    }

    /// Where sub-page `i` ends in the body. Read by its width's own load, not copied
    /// through a buffer: every GET checks the whole table (`PackedLayout::table`), and
    /// a `memcpy` call per entry was 5 % of the server's CPU in uniform GETs.
    pub fn end(&self, i: usize) -> usize {
        let e = &self.ends[i * self.width..][..self.width];
        // `end_width`: two bytes, or four.
        match self.width {
            2 => usize::from(u16::from_le_bytes([e[0], e[1]])),
            _ => u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize,
        }
    }

    /// Bytes of the whole body.
    pub fn body_len(&self) -> usize {
        self.end(self.ends.len() / self.width - 1)
    }

    pub fn cas_base(&self) -> CasBase {
        self.cas_base
    }

    /// Bytes of the header in front of the body.
    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{self, Meta, Payload};
    use crate::subpage_hash::dram_subpage;
    use proptest::prelude::*;

    /// `l.build` for records placed by their keys' hash.
    fn build(l: &PackedLayout, recs: &[Record]) -> Option<Vec<u8>> {
        l.build(
            &mut recs
                .iter()
                .map(|r| (l.subpage_of(r.key), *r))
                .collect::<Vec<_>>(),
        )
    }

    fn layout(capacity: usize) -> PackedLayout {
        PackedLayout {
            subpages: 16,
            chunks: 4,
            capacity,
            hash: dram_subpage,
        }
    }

    /// The layout, pinned: two keys in known sub-pages, the table's bytes and the body.
    #[test]
    fn the_page_layout_is_pinned() {
        let l = layout(4096);
        let (a, b) = (b"a".as_slice(), b"b".as_slice());
        let recs = [a, b].map(|key| Record {
            key,
            payload: Payload::Inline(b"v"),
            meta: Meta::default(),
        });
        let page = build(&l, &recs).unwrap();
        let (sa, sb) = (l.subpage_of(a), l.subpage_of(b));
        assert_ne!(sa, sb, "the test wants two sub-pages");
        let len = recs[0].encoded_len();
        assert_eq!(page.len(), 32 + 1 + 2 * len, "table, base 0, two records");
        assert_eq!(page[32], 0, "no CAS: base 0");
        let table = l.table(&page).unwrap();
        let (first, second) = if sa < sb { (sa, sb) } else { (sb, sa) };
        for i in 0..16 {
            let want = match i {
                i if i < first => 0,
                i if i < second => len,
                _ => 2 * len,
            };
            assert_eq!(table.end(i), want, "end of sub-page {i}");
            assert_eq!(&page[2 * i..2 * i + 2], &(want as u16).to_le_bytes());
        }
        let body = &page[33..];
        assert_eq!(l.find(&table, body, a), Some(recs[0]));
        assert_eq!(
            l.find(&table, &body[..l.subpage_for(&table, b).end], b),
            Some(recs[1])
        );
    }

    /// The header holds the smallest version; each record its distance from it, so a page
    /// of objects written one after another pays a byte or two per CAS, not eight.
    #[test]
    fn cas_versions_are_stored_against_the_page_base() {
        let l = layout(4096);
        let base = 0x0123_4567_89ab_0000u64;
        let keys: Vec<Vec<u8>> = (0..40u32)
            .map(|i| format!("{i:016}").into_bytes())
            .collect();
        let recs: Vec<Record> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Record {
                key: k,
                payload: Payload::Inline(b"value"),
                meta: Meta {
                    cas: if i == 7 { 0 } else { base + 3 * i as u64 },
                    ..Meta::default()
                },
            })
            .collect();
        let page = build(&l, &recs).unwrap();
        assert_eq!(
            &page[32..41],
            &[0x80, 0x80, 0xac, 0xcd, 0xf8, 0xac, 0xd1, 0x91, 0x01]
        );
        let (table, body) = l.split(&page).unwrap();
        assert_eq!(table.len(), 41);
        let deltas: usize = recs
            .iter()
            .map(|r| {
                record::varint_len(r.meta.cas.saturating_sub(base)) * usize::from(r.meta.cas != 0)
            })
            .sum();
        let without_cas: usize = recs
            .iter()
            .map(|r| {
                Record {
                    meta: Meta::default(),
                    ..*r
                }
                .encoded_len()
            })
            .sum();
        assert_eq!(body.len(), without_cas + deltas);
        assert!(deltas <= 2 * 39);
        for r in &recs {
            assert_eq!(l.find(&table, body, r.key), Some(*r));
        }
        assert!(l.fits(recs.iter().copied()));
    }

    #[test]
    fn a_damaged_table_is_refused() {
        let l = layout(4096);
        let mut page = vec![0u8; 33];
        page[2] = 10; // sub-page 1 ends at 10 ...
        assert!(l.table(&page).is_none(), "... but sub-page 2 at 0");
        page.fill(0xff);
        assert!(l.table(&page).is_none(), "past the capacity");
        assert!(l.table(&page[..7]).is_none(), "short");
        let mut page = vec![0u8; 32];
        assert!(l.table(&page).is_none(), "no base");
        page.extend_from_slice(&[0x80, 0x80]);
        assert!(l.table(&page).is_none(), "a base cut short");
    }

    #[test]
    fn large_leaves_use_wide_ends() {
        let l = layout(1 << 20);
        assert_eq!(l.table_len(), 64);
        // Sub-pages ending past 64 KiB: their ends take all four bytes.
        let keys: Vec<Vec<u8>> = (0..4u8).map(|i| vec![b'k', i]).collect();
        let value = vec![7u8; 40_000];
        let recs: Vec<Record> = keys
            .iter()
            .map(|key| Record {
                key,
                payload: Payload::Inline(&value),
                meta: Meta::default(),
            })
            .collect();
        let page = build(&l, &recs).unwrap();
        let (table, body) = l.split(&page).unwrap();
        assert_eq!(table.body_len(), 4 * recs[0].encoded_len());
        assert!(table.body_len() > 1 << 17);
        for i in 0..16 {
            let bytes = &page[4 * i..4 * i + 4];
            assert_eq!(
                table.end(i),
                u32::from_le_bytes(bytes.try_into().unwrap()) as usize
            );
        }
        for r in &recs {
            assert_eq!(l.find(&table, body, r.key), Some(*r));
        }
    }

    proptest! {
        /// Any set of records either fits (and every one is found again, through its own
        /// prefix) or is refused as too large; never a wrong record.
        #[test]
        fn any_key_set_fits_or_is_refused(
            objects in proptest::collection::btree_map(
                proptest::collection::vec(any::<u8>(), 1..40),
                proptest::collection::vec(any::<u8>(), 0..120),
                0..80,
            ),
        ) {
            let l = layout(2048);
            let recs: Vec<Record> = objects
                .iter()
                .map(|(k, v)| Record { key: k, payload: Payload::Inline(v), meta: Meta::default() })
                .collect();
            let total: usize = recs.iter().map(Record::encoded_len).sum();
            prop_assert_eq!(l.fits(recs.iter().copied()), total <= 2048);
            match build(&l, &recs) {
                None => prop_assert!(total > 2048),
                Some(page) => {
                    prop_assert_eq!(page.len(), 32 + 1 + total);
                    let table = l.table(&page).unwrap();
                    let body = &page[table.len()..];
                    prop_assert_eq!(table.body_len(), total);
                    for r in &recs {
                        let prefix = &body[..l.subpage_for(&table, r.key).end];
                        prop_assert_eq!(l.find(&table, prefix, r.key), Some(*r));
                    }
                    prop_assert_eq!(l.all(table.cas_base(), body).count(), recs.len());
                }
            }
        }
    }
}
