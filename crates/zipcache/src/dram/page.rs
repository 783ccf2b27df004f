//! The page format of a DRAM leaf: a summary of what it holds in front of the packed
//! page (`packed_page.rs`), the body LZ4-compressed unless the leaf is hot; reading one
//! record through early termination, building and decoding whole pages.

use super::DramTier;
use super::block::Block;
use super::leaf::{DramLeaf, LeafState};
use crate::early_termination::{compress_behind, decompress_prefix, with_prefix};
use crate::record::{CasBase, Record, put_varint, read_varint};

/// A leaf's page, as one allocation: a summary of what it holds, then the packed page
/// (`packed_page.rs`: end table, CAS base, body — LZ4-compressed unless the leaf's
/// `RAW_PAGE` flag is set).
///
/// ```text
/// summary := objects:varint clean:varint raw_bytes:varint cas_top - cas_base:varint
/// ```
/// The counts are read when `stats` asks, so the leaf does not carry them; `cas_top`, the
/// largest CAS version of the page's objects (medium ones included, whose versions sit in
/// their blobs), when a write asks for a new version.
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
}

impl Summary {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.objects);
        put_varint(out, self.clean);
        put_varint(out, self.raw_bytes);
        put_varint(out, self.cas_top_above_base);
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
        Some((
            Summary {
                objects,
                clean,
                raw_bytes,
                cas_top_above_base,
            },
            &page[at..],
        ))
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
        let (_, packed) = Summary::split(page)?;
        let (table, body) = self.layout.split(packed)?;
        if leaf.raw_page() {
            return Some(f(self.layout.find(&table, body, key)));
        }
        with_prefix(
            body,
            table.body_len(),
            self.layout.prefix_for(&table, key),
            |prefix| prefix.map(|p| f(self.layout.find(&table, p, key))),
        )
    }

    /// A leaf's page from its summary and an uncompressed packed page: the body
    /// compressed unless `raw`, all in one block.
    pub(super) fn page(&self, summary: Summary, packed: &[u8], raw: bool) -> Block {
        let mut front = Vec::with_capacity(32 + packed.len().min(64));
        summary.encode(&mut front);
        let header = self.layout.table(packed).map_or(packed.len(), |t| t.len());
        let (table, body) = packed.split_at(header);
        front.extend_from_slice(table);
        if raw {
            front.extend_from_slice(body);
            Block::new(&front)
        } else {
            Block::new(&compress_behind(&front, body))
        }
    }

    /// The body of a locked leaf's page, decompressed, with its CAS base; `None` if there
    /// is no page, or it is damaged (then the leaf is marked lost: its keys are misses
    /// that hide the lower tiers).
    pub(super) fn decode<'p>(
        &self,
        leaf: &DramLeaf,
        page: Option<&'p [u8]>,
    ) -> Option<(CasBase, std::borrow::Cow<'p, [u8]>)> {
        let page = page?;
        let decoded = Summary::split(page).and_then(|(_, packed)| {
            let (table, body) = self.layout.split(packed)?;
            let len = table.body_len();
            let body = if leaf.raw_page() {
                (body.len() == len).then_some(std::borrow::Cow::Borrowed(body))
            } else {
                let mut out = vec![0u8; len];
                decompress_prefix(body, len, len, &mut out).then_some(std::borrow::Cow::Owned(out))
            };
            body.map(|body| (table.cas_base(), body))
        });
        if decoded.is_none() {
            self.mark_lost(leaf);
        }
        decoded
    }
}
