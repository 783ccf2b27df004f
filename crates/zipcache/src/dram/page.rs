//! The page format of a DRAM leaf: a summary of what it holds in front of the packed
//! page (`packed_page.rs`), the body LZ4-compressed (with the current page dictionary
//! where that makes it smaller) unless the leaf is hot; reading one record through early
//! termination, building and decoding whole pages.

use std::sync::Arc;

use super::DramTier;
use super::block::Block;
use super::early_termination::{Chunks, compress_chunks, decode_span, with_span};
use super::leaf::{DramLeaf, LeafState, extras_box};
use super::packed_page::Table;
use crate::dictionary::page::PageDictionary;
use crate::format::page::dictionary_version_at;
use crate::record::{CasBase, Record, put_varint, read_varint};

/// A page, the dictionary its body was compressed with (which its leaf then holds),
/// and the tag (`lz4_tag`) of the current page dictionary if LZ4 alone beat it (else 0).
pub(super) type DictionaryPage = (Block, Option<Arc<PageDictionary>>, u8);

/// A byte that names a page dictionary's version (never 0): what a leaf keeps of the
/// one LZ4 alone beat for its page (`DramLeaf::lz4_beat`). Versions 255 apart share it.
pub(super) fn lz4_tag(version: u32) -> u8 {
    (version % 255) as u8 + 1
}

/// A leaf's page, as one allocation: a summary of what it holds, then the packed page
/// (`packed_page.rs`: end table, CAS base, body — LZ4-compressed unless the leaf's
/// `RAW_PAGE` flag is set).
///
/// ```text
/// summary := objects:varint clean×2+named:varint raw_bytes:varint cas_top - cas_base:varint
///            [dictionary:u32 LE, if named]
/// ```
/// The counts are read when `stats` asks, so the leaf does not carry them; `cas_top`, the
/// largest CAS version of the page's objects (medium ones included, whose versions sit in
/// their blobs), when a write asks for a new version. A body compressed with a page
/// dictionary names its version (`named` set, then the version); one without pays no
/// byte for it (bit 0 of the clean count's varint). A hot (raw) body never names one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Summary {
    /// Live objects in the page.
    pub(super) objects: u64,
    /// Of those, the clean ones: unchanged copies of what the SSD tier holds.
    pub(super) clean: u64,
    /// Their key + value bytes (for the compression ratio).
    pub(super) raw_bytes: u64,
    /// `cas_top` as stored: its distance from the packed page's CAS base (wrapping).
    pub(super) cas_top_above_base: u64,
    /// The version of the dictionary the body was compressed with; 0 for none.
    pub(super) dictionary: u32,
}

impl Summary {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let named = self.dictionary != 0;
        put_varint(out, self.objects);
        put_varint(out, self.clean << 1 | u64::from(named));
        put_varint(out, self.raw_bytes);
        put_varint(out, self.cas_top_above_base);
        if named {
            let version = dictionary_version_at(out.len());
            out.resize(version.end(), 0);
            version.set(out, self.dictionary);
        }
    }

    /// The summary at the front of a page and the packed page behind it.
    pub(super) fn split(page: &[u8]) -> Option<(Summary, &[u8])> {
        let mut at = 0;
        let mut next = || {
            let (v, n) = read_varint(page.get(at..)?)?;
            at += n;
            Some(v)
        };
        let (objects, clean, raw_bytes, cas_top_above_base) = (next()?, next()?, next()?, next()?);
        let dictionary = if clean & 1 == 0 {
            0
        } else {
            let version = dictionary_version_at(at);
            if page.len() < version.end() {
                return None;
            }
            at = version.end();
            // A named version is never 0 (that would name none): a damaged summary.
            Some(version.get(page)).filter(|&v| v != 0)?
        };
        Some((
            Summary {
                objects,
                clean: clean >> 1,
                raw_bytes,
                cas_top_above_base,
                dictionary,
            },
            &page[at..],
        ))
    }

    /// The dictionary the body needs, of the one its leaf holds: `Some(None)` if it names
    /// none, `None` if it names one the leaf does not hold (a mix-up, or damage: the
    /// body must not be decoded with another, which would give wrong bytes).
    fn dictionary_of<'d>(
        &self,
        held: Option<&'d PageDictionary>,
    ) -> Option<Option<&'d PageDictionary>> {
        match self.dictionary {
            0 => Some(None),
            version => held.filter(|d| d.version() == version).map(Some),
        }
    }
}

/// The page a merge replaces, as `DramTier::page` weighs the next one by it.
#[derive(Clone, Copy)]
pub(super) struct PriorPage {
    /// The compression that won there.
    pub(super) won: Won,
    /// Bytes of the whole page, as stored.
    pub(super) stored: usize,
    /// Bytes of its packed page (header and body) uncompressed.
    pub(super) packed: usize,
}

#[derive(Clone, Copy)]
pub(super) enum Won {
    /// The page dictionary of this version.
    Dictionary(u32),
    /// LZ4 alone, over the dictionary of this tag (`lz4_tag`; 0: none was tried).
    Lz4(u8),
}

impl LeafState {
    /// What the leaf's page holds, as its summary says (an empty one without a page).
    pub(super) fn summary(&self) -> Summary {
        self.page
            .as_deref()
            .and_then(Summary::split)
            .map_or_else(Summary::default, |(s, _)| s)
    }
}

impl DramTier {
    /// `with_record` for the page alone.
    pub(super) fn with_page_record<R>(
        &self,
        leaf: &DramLeaf,
        st: &LeafState,
        key: &[u8],
        f: impl FnOnce(Option<Record<'_>>) -> R,
    ) -> Option<R> {
        let Some(page) = st.page.as_deref() else {
            return Some(f(None));
        };
        let (summary, packed) = Summary::split(page)?;
        let (table, body) = self.layout.split(packed)?;
        if leaf.raw_page() {
            return (summary.dictionary == 0).then(|| f(self.layout.find(&table, body, key)));
        }
        let dictionary = summary.dictionary_of(st.page_dictionary())?;
        with_span(
            body,
            &self.layout.chunks(&table)?,
            self.layout.subpage_for(&table, key),
            dictionary,
            |subpage| subpage.map(|s| f(self.layout.find_in(&table, s, key))),
        )
    }

    /// A leaf's page from its summary and an uncompressed packed page, in one
    /// allocation: the body as it is if `raw`, else compressed — with the current page
    /// dictionary if that saves more than holding it costs (the leaf's box of extras),
    /// then returned beside the page for the leaf to hold, else without.
    ///
    /// `prior` is the page this one replaces. If the compression that won there (the
    /// current dictionary, or LZ4 alone against it) compresses this body about as well
    /// (within 1/16 of the ratio, either way), it is taken without trying the other: compressing
    /// every page both ways was a third of the merger's CPU in a SET load of 64-byte
    /// values. A new dictionary, or values that changed, try both again.
    pub(super) fn page(
        &self,
        summary: Summary,
        packed: &[u8],
        raw: bool,
        prior: Option<PriorPage>,
    ) -> DictionaryPage {
        // A page without a header (never one this tier built) keeps its bytes as the
        // header and no body: a later decode marks its leaf lost.
        let table = self.layout.table(packed);
        let chunks = table.as_ref().and_then(|t| self.layout.chunks(t));
        let (header, body, chunks) = match (table, chunks) {
            (Some(table), Some(chunks)) => {
                let (header, body) = packed.split_at(table.len());
                (header, body, chunks)
            }
            _ => (packed, &[][..], Chunks::whole(0)),
        };
        let front = |dictionary: u32| {
            let mut front = Vec::with_capacity(40 + header.len() + body.len());
            Summary {
                dictionary,
                ..summary
            }
            .encode(&mut front);
            front.extend_from_slice(header);
            front
        };
        if raw {
            let mut page = front(0);
            page.extend_from_slice(body);
            return (Block::new(&page), None, 0);
        }
        let compressed = |dictionary: Option<&PageDictionary>| {
            let mut page = front(dictionary.map_or(0, |d| d.version()));
            compress_chunks(body, &chunks, dictionary, &mut page).then_some(page)
        };
        // Without a dictionary LZ4 cannot fail (an empty page would read as damaged).
        let plain = || compressed(None).unwrap_or_default();
        let Some(dictionary) = self.current_page_dictionary() else {
            return (Block::new(&plain()), None, 0);
        };
        let tag = lz4_tag(dictionary.version());
        // `stored / packed` within 1/16 of the prior page's, either way.
        let as_well = |stored: usize| {
            prior.is_some_and(|p| {
                let this = (stored * p.packed) as u64 * 16;
                let before = (p.stored * packed.len()) as u64;
                (before * 15..=before * 17).contains(&this)
            })
        };
        let with_dictionary = || compressed(Some(&dictionary));
        let (with, plain) = match prior.map(|p| p.won) {
            Some(Won::Dictionary(version)) if version == dictionary.version() => {
                let with = with_dictionary();
                if let Some(with) = with.as_ref().filter(|with| as_well(with.len())) {
                    return (Block::new(with), Some(dictionary), 0);
                }
                (with, plain())
            }
            Some(Won::Lz4(beaten)) if beaten == tag => {
                let plain = plain();
                if as_well(plain.len()) {
                    return (Block::new(&plain), None, tag);
                }
                (with_dictionary(), plain)
            }
            _ => (with_dictionary(), plain()),
        };
        match with {
            Some(with) if with.len() + extras_box() < plain.len() => {
                (Block::new(&with), Some(dictionary), 0)
            }
            _ => (Block::new(&plain), None, tag),
        }
    }

    /// The body of a locked leaf's page, decompressed (with `dictionary`, the one the
    /// leaf holds, if the page names it), with its CAS base; `None` if there is no page,
    /// or it is damaged or names a dictionary other than `dictionary` (then the leaf is
    /// marked lost: its keys are misses that hide the lower tiers).
    pub(super) fn decode<'p>(
        &self,
        leaf: &DramLeaf,
        page: Option<&'p [u8]>,
        dictionary: Option<&PageDictionary>,
    ) -> Option<(CasBase, std::borrow::Cow<'p, [u8]>)> {
        self.decode_with_table(leaf, page, dictionary)
            .map(|(table, body)| (table.cas_base(), body))
    }

    /// `decode`, with the page's header (where each sub-page ends) in place of its base.
    pub(super) fn decode_with_table<'p>(
        &self,
        leaf: &DramLeaf,
        page: Option<&'p [u8]>,
        dictionary: Option<&PageDictionary>,
    ) -> Option<(Table<'p>, std::borrow::Cow<'p, [u8]>)> {
        let page = page?;
        let decoded = Summary::split(page).and_then(|(summary, packed)| {
            let (table, body) = self.layout.split(packed)?;
            let len = table.body_len();
            let body = if leaf.raw_page() {
                (summary.dictionary == 0 && body.len() == len)
                    .then_some(std::borrow::Cow::Borrowed(body))
            } else {
                let dictionary = summary.dictionary_of(dictionary)?;
                let mut out = vec![0u8; len];
                decode_span(
                    body,
                    &self.layout.chunks(&table)?,
                    0..len,
                    dictionary,
                    &mut out,
                )
                .then_some(std::borrow::Cow::Owned(out))
            };
            body.map(|body| (table, body))
        });
        if decoded.is_none() {
            self.mark_lost(leaf);
        }
        decoded
    }
}

#[cfg(test)]
mod tests {
    use crate::dram::DramSettings;
    use proptest::prelude::*;

    use super::super::test_support::*;
    use super::*;
    use crate::dictionary::page::tests::text_records;
    use crate::dictionary::page::text_record;
    use crate::memory::Memory;
    use crate::record::Meta;

    fn value(dram: &DramTier, key: &[u8]) -> Option<Vec<u8>> {
        match dram.get(key, 0, true) {
            super::super::Lookup::Found(v, _, _) => Some(v),
            _ => None,
        }
    }

    /// 64 bytes no dictionary shrinks, different for each `seed`.
    fn random_value(seed: u64) -> Vec<u8> {
        (0..8)
            .flat_map(|j| crate::dictionary::training::mix(seed * 8 + j).to_le_bytes())
            .collect()
    }

    /// More than half of the tier's leaves hold their page with a dictionary.
    fn assert_most_pages_hold_a_dictionary(dram: &DramTier) {
        let held = dram.page_dictionaries_held();
        let leaves = dram.leaf_count() as usize;
        assert!(
            held.values().sum::<usize>() * 2 > leaves,
            "{held:?} of {leaves}"
        );
    }

    /// A page without a dictionary pays no byte for naming none; one with a dictionary
    /// names its version in four; a summary that claims one but names version 0, or is
    /// cut short, is refused.
    #[test]
    fn the_summary_names_its_dictionary() {
        let summary = Summary {
            objects: 3,
            clean: 2,
            raw_bytes: 200,
            cas_top_above_base: 5,
            dictionary: 0,
        };
        let mut plain = Vec::new();
        summary.encode(&mut plain);
        assert_eq!(plain, [3, 4, 200, 1, 5]);
        let named = Summary {
            dictionary: 0x0102_0304,
            ..summary
        };
        let mut with = Vec::new();
        named.encode(&mut with);
        assert_eq!(with, [3, 5, 200, 1, 5, 4, 3, 2, 1]);
        assert_eq!(Summary::split(&with), Some((named, &[][..])));
        assert_eq!(Summary::split(&plain), Some((summary, &[][..])));
        assert_eq!(Summary::split(&with[..8]), None, "version cut short");
        assert_eq!(
            Summary::split(&[3, 5, 200, 1, 5, 0, 0, 0, 0]),
            None,
            "version 0"
        );
    }

    /// Text records take the dictionary the tier trains on them once it is current, and
    /// read back through it; random values keep pages without one.
    #[test]
    fn pages_take_a_dictionary_only_where_it_wins() {
        let (dram, memory) = tier_with(settings(256));
        let keys: Vec<Vec<u8>> = (0..6_000).map(key).collect();
        let dictionaries = dram.dictionaries.clone().unwrap();
        let mut round = 0u64;
        while dictionaries.pages.current().is_none() {
            round += 1;
            assert!(round < 20, "no page dictionary trained");
            for (i, k) in keys.iter().enumerate() {
                let v = text_record(round << 32 | i as u64);
                dram.put_with(k, Some(&v), Meta::default(), None, 0, |_| ());
            }
            dram.merge_all(0);
            dictionaries.settle();
        }
        let before = memory.snapshot().compressed_pages;
        for (i, k) in keys.iter().enumerate() {
            let v = text_record(i as u64);
            dram.put_with(k, Some(&v), Meta::default(), None, 0, |_| ());
        }
        dram.merge_all(0);
        assert_most_pages_hold_a_dictionary(&dram);
        let after = memory.snapshot().compressed_pages;
        assert!(after * 20 < before * 19, "{after} with, {before} before");
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(value(&dram, k), Some(text_record(i as u64)));
        }
        // Random values: the dictionary does not shrink them, no page takes it.
        for (i, k) in keys.iter().enumerate() {
            let v = random_value(i as u64);
            dram.put_with(k, Some(&v), Meta::default(), None, 0, |_| ());
        }
        dram.merge_all(0);
        assert!(dram.page_dictionaries_held().is_empty());
    }

    /// Pages compressed in any number of chunks read back every object — one at a time
    /// through its chunk, and whole through a merge's decode — with a dictionary and
    /// without; what a chunk costs in size stays small: pages of text records (a fifth
    /// random) within 1/16 of their size in one block, in two chunks, and in four with a
    /// dictionary (without one, four cost 13 % here: a table entry and, mostly, a block's
    /// start without the records before it).
    #[test]
    fn pages_in_any_number_of_chunks_read_back() {
        let keys: Vec<Vec<u8>> = (0..3_000).map(key).collect();
        let mut sizes = Vec::new();
        for chunks in [1, 2, 3, 4, 7, 16] {
            for with_dictionary in [false, true] {
                let (dram, memory) = tier_with(DramSettings {
                    page_chunks: chunks,
                    ..settings(256)
                });
                let dictionaries = dram.dictionaries.clone().unwrap();
                let current = with_dictionary.then(|| generations()[0].clone());
                dictionaries.pages.make_current(current);
                let written = |round: u64, i: usize| match i % 5 {
                    0 => random_value(round << 32 | i as u64),
                    _ => text_record(round << 32 | i as u64),
                };
                // Three rounds: the later ones merge into pages the first compressed.
                for round in 0..3 {
                    for (i, k) in keys.iter().enumerate() {
                        let v = written(round, i);
                        dram.put_with(k, Some(&v), Meta::default(), None, 0, |_| ());
                    }
                    dram.merge_all(0);
                }
                for (i, k) in keys.iter().enumerate() {
                    assert_eq!(
                        value(&dram, k),
                        Some(written(2, i)),
                        "{chunks} chunks, key {i}"
                    );
                }
                if with_dictionary {
                    assert_most_pages_hold_a_dictionary(&dram);
                }
                sizes.push((chunks, with_dictionary, memory.snapshot().compressed_pages));
            }
        }
        let size = |chunks, with| {
            sizes
                .iter()
                .find(|s| s.0 == chunks && s.1 == with)
                .unwrap()
                .2
        };
        for (chunks, with) in [(2, false), (2, true), (4, true)] {
            assert!(size(chunks, with) * 16 < size(1, with) * 17, "{sizes:?}");
        }
    }

    /// Pages where LZ4 alone beat the current dictionary (random values) keep LZ4 alone
    /// while the values stay alike, and take the dictionary once the values are what
    /// it was trained on.
    #[test]
    fn pages_that_lz4_won_take_the_dictionary_once_the_values_change() {
        let (dram, _) = tier_with(settings(256));
        let dictionaries = dram.dictionaries.clone().unwrap();
        dictionaries
            .pages
            .make_current(generations().first().cloned());
        let keys: Vec<Vec<u8>> = (0..6_000).map(key).collect();
        for round in 0..2 {
            for (i, k) in keys.iter().enumerate() {
                let v = random_value(round << 37 | i as u64);
                dram.put_with(k, Some(&v), Meta::default(), None, 0, |_| ());
            }
            dram.merge_all(0);
            assert!(dram.page_dictionaries_held().is_empty());
        }
        for (i, k) in keys.iter().enumerate() {
            dram.put_with(
                k,
                Some(&text_record(i as u64)),
                Meta::default(),
                None,
                0,
                |_| (),
            );
        }
        dram.merge_all(0);
        assert_most_pages_hold_a_dictionary(&dram);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(value(&dram, k), Some(text_record(i as u64)));
        }
    }

    /// Three generations of page dictionaries: two of text records, one of other text.
    fn generations() -> Vec<Arc<PageDictionary>> {
        let memory = Arc::new(Memory::default());
        vec![
            PageDictionary::prepare(1, &text_records(1, 900), memory.clone()).unwrap(),
            PageDictionary::prepare(2, &text_records(2, 300), memory.clone()).unwrap(),
            PageDictionary::prepare(
                3,
                &crate::dictionary::tests::documents(0, 3, 20_000),
                memory,
            )
            .unwrap(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// Any records — text or arbitrary bytes, any keys — round-trip through pages
        /// compressed under any dictionary generation (or none), read one at a time
        /// through early termination, and after the generation changes under them.
        #[test]
        fn any_records_round_trip_under_any_dictionary_generation(
            objects in proptest::collection::btree_map(
                proptest::collection::vec(any::<u8>(), 1..40),
                (any::<bool>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..100)),
                1..400,
            ),
            first in 0usize..4,
            second in 0usize..4,
        ) {
            let generations = generations();
            let (dram, _) = tier_with(settings(256));
            let dictionaries = dram.dictionaries.clone().unwrap();
            let values: Vec<(Vec<u8>, Vec<u8>)> = objects
                .into_iter()
                .map(|(k, (text, seed, bytes))| (k, if text { text_record(seed) } else { bytes }))
                .collect();
            for generation in [first, second] {
                dictionaries.pages.make_current(generations.get(generation).cloned());
                for (k, v) in &values {
                    dram.put_with(k, Some(v), Meta::default(), None, 0, |_| ());
                }
                dram.merge_all(0);
                for (k, v) in &values {
                    prop_assert_eq!(value(&dram, k), Some(v.clone()));
                }
            }
        }
    }
}
