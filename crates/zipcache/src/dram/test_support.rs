//! What the DRAM tier's unit tests share: a small tier, keys, a sink that records.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{DramSettings, DramTier};
use crate::Config;
use crate::btree::Fence;
use crate::dictionary::Dictionary;
use crate::dictionary::page::PageDictionary;
use crate::eviction::{EvictedObject, EvictionSink};
use crate::memory::{Charge, Memory};
use crate::restart::shadow::MayBeOnFlash;

/// A flash tier that may hold every key: every write is marked.
pub(super) struct EveryKey;

impl MayBeOnFlash for EveryKey {
    fn may_be_on_flash(&self, _key: &[u8]) -> bool {
        true
    }
}

/// Records every batch it is given; its span is a fixed range of keys.
pub(super) struct RecordingSink {
    pub(super) span: (Fence, Option<Fence>),
    pub(super) batches: Mutex<Vec<Vec<EvictedObject>>>,
}

impl EvictionSink for RecordingSink {
    fn absorb(&self, _low: &[u8], _high: Option<&[u8]>, objects: Vec<EvictedObject>) -> bool {
        self.batches.lock().push(objects);
        true
    }

    fn span(&self, _low: &Fence, _high: Option<&[u8]>) -> (Fence, Option<Fence>) {
        self.span.clone()
    }

    fn forget(&self, _low: &[u8], _high: Option<&[u8]>) {}
}

pub(super) fn tier() -> DramTier {
    let settings = DramSettings {
        leaf_size: 4096,
        subpages: 16,
        page_chunks: 4,
        write_buffer: 0,
        tiny_max: 1024,
        dram_capacity: 64 << 20,
        bypass_max_fraction: 0.0,
        keep_tombstones: true,
        cas_origin: 1 << 40,
        track_access: false,
        dictionaries: Config {
            dram_capacity: 64 << 20,
            ..Config::default()
        }
        .training_settings(),
        opened_ms: 0,
    };
    DramTier::new(settings, Arc::new(Memory::default()), 0.0)
}

pub(super) fn key(i: u32) -> Vec<u8> {
    format!("{i:08}").into_bytes()
}

pub(super) fn settings(write_buffer: usize) -> DramSettings {
    DramSettings {
        write_buffer,
        ..tier().settings
    }
}

pub(super) fn tier_with(settings: DramSettings) -> (DramTier, Arc<Memory>) {
    let memory = Arc::new(Memory::default());
    (DramTier::new(settings, memory.clone(), 0.0), memory)
}

/// The account, recounted from scratch (once the dictionaries settle, so evaluate it
/// before the account): every leaf's state, the tree, the table, the dictionaries.
pub(super) fn recount(dram: &DramTier) -> Charge {
    let view = dram.view();
    let mut total = Charge::default();
    for id in dram.leaves() {
        let leaf = view.get(id.0).unwrap();
        let c = dram.charge_of(leaf, &leaf.state.read());
        total.compressed_pages += c.compressed_pages;
        total.hot_pages += c.hot_pages;
        total.write_buffers += c.write_buffers;
        total.mediums += c.mediums;
        total.access_tables += c.access_tables;
    }
    total.dictionaries = recount_dictionaries(dram);
    total.index = (dram.tree.node_bytes() + dram.leaves.bytes() as u64) as i64 + dram.reads.bytes();
    total
}

/// The dictionaries' samples, and every dictionary alive: the current ones and those
/// the leaves hold, each once.
fn recount_dictionaries(dram: &DramTier) -> i64 {
    let Some(d) = &dram.dictionaries else {
        return 0;
    };
    d.settle();
    let view = dram.view();
    let mut blobs: Vec<Arc<Dictionary>> = d.blobs.current().into_iter().collect();
    let mut pages: Vec<Arc<PageDictionary>> = d.pages.current().into_iter().collect();
    for id in dram.leaves() {
        let st = view.get(id.0).unwrap().state.read();
        if let Some(e) = &st.extras {
            blobs.extend(e.dictionary.clone());
            pages.extend(e.page_dictionary.clone());
        }
    }
    blobs.sort_by_key(Arc::as_ptr);
    blobs.dedup_by(|a, b| Arc::ptr_eq(a, b));
    pages.sort_by_key(Arc::as_ptr);
    pages.dedup_by(|a, b| Arc::ptr_eq(a, b));
    d.blobs.sample_charge()
        + d.pages.sample_charge()
        + blobs.iter().map(|d| d.charge()).sum::<i64>()
        + pages.iter().map(|d| d.charge()).sum::<i64>()
}
