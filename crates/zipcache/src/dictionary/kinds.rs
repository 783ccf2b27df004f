//! The kinds of dictionary the engine trains (`training::Kind`): zstd dictionaries for
//! medium objects' blobs, LZ4 prefixes for tiny objects' pages; and [`Dictionaries`], the
//! engine's trainer of each.

use std::sync::Arc;

use super::Dictionary;
use super::page::{MAX_PAGE_DICTIONARY, PageDictionary};
use super::training::{Kind, Trainer, TrainingSettings, train_from_samples};
use crate::dram::early_termination::compress_page;
use crate::memory::Memory;
use crate::record::stored_len;

/// Medium objects' blobs: zstd dictionaries, one sample a value (its first 1 KiB: the
/// start of a document is where its schema shows, and the bound keeps the reservoir's
/// bytes bounded), judged by the blobs the held-out values make.
impl Kind for Dictionary {
    const SAMPLE_PREFIX: usize = 1024;

    fn train(
        generation: u64,
        samples: &[&[u8]],
        size: usize,
        memory: Arc<Memory>,
    ) -> Option<Arc<Self>> {
        // Blobs name their dictionary by a byte: ids 1..=255 in turn.
        let id = ((generation - 1) % 255 + 1) as u8;
        let raw = train_from_samples(samples, size)?;
        Dictionary::prepare(id, &raw, memory)
    }

    fn cost(held_out: &[&[u8]], dictionary: Option<&Self>) -> usize {
        held_out.iter().map(|v| stored_len(v, dictionary)).sum()
    }
}

/// The engine's dictionaries: zstd ones for medium objects' blobs, LZ4 prefixes for
/// tiny objects' pages, each kind trained on samples of what it compresses.
pub struct Dictionaries {
    pub blobs: Arc<Trainer<Dictionary>>,
    pub pages: Arc<Trainer<PageDictionary>>,
}

impl Dictionaries {
    pub fn new(settings: TrainingSettings, memory: Arc<Memory>) -> Self {
        let pages = TrainingSettings {
            dictionary_size: settings.dictionary_size.min(MAX_PAGE_DICTIONARY),
            ..settings
        };
        Dictionaries {
            blobs: Arc::new(Trainer::new(settings, memory.clone())),
            pages: Arc::new(Trainer::new(pages, memory)),
        }
    }

    /// Waits for trainings under way to finish (for tests and a clean close).
    pub fn settle(&self) {
        self.blobs.settle();
        self.pages.settle();
    }
}

/// Tiny objects' pages: the samples are records as a page holds them (`record.rs`), the
/// dictionary is the content zstd's trainer makes of them, used by LZ4 as a raw prefix
/// (LZ4 matches whole strings, so record text is what a page's records find), judged by
/// held-out records packed into
/// pages of the default leaf size, each compressed as a merge would: with the
/// dictionary or without, whichever is smaller.
impl Kind for PageDictionary {
    const SAMPLE_PREFIX: usize = 512;

    fn train(
        generation: u64,
        samples: &[&[u8]],
        size: usize,
        memory: Arc<Memory>,
    ) -> Option<Arc<Self>> {
        // zstd's trainer picks the segments the samples share most: 1–2 % smaller pages
        // of `airports` and `seattle-weather` than the latest samples as they are, which
        // remain for sample sets it refuses (too few).
        let raw = train_from_samples(samples, size).unwrap_or_else(|| samples.concat());
        PageDictionary::prepare(generation, &raw[raw.len().saturating_sub(size)..], memory)
    }

    fn cost(held_out: &[&[u8]], dictionary: Option<&Self>) -> usize {
        let mut cost = 0;
        let mut page = Vec::with_capacity(JUDGED_PAGE + 512);
        let mut compressed = Vec::new();
        for (i, record) in held_out.iter().enumerate() {
            page.extend_from_slice(record);
            if page.len() >= JUDGED_PAGE || i + 1 == held_out.len() {
                let plain = compress_page(&page).len();
                compressed.clear();
                cost += dictionary
                    .and_then(|d| d.compress_into(&page, &mut compressed))
                    .map_or(plain, |with| with.min(plain));
                page.clear();
            }
        }
        cost
    }
}

/// Bytes of the pages held-out records are judged in: the default `leaf_size`.
const JUDGED_PAGE: usize = 4096;
