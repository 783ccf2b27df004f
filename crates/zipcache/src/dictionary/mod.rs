//! Trained dictionaries (issue 21): zstd ones for medium objects (here), LZ4 prefixes
//! for tiny objects' pages ([`page`]), both trained the same way ([`training`]).
//!
//! A medium object (`tiny_max` .. `medium_max`) is compressed alone, so with LZ4 it starts
//! from an empty window every time: a JSON document of 560 bytes shrinks by less than
//! half. A dictionary trained on recent values gives zstd the window those values share
//! (field names, common strings), and the same document shrinks by three quarters.
//!
//! * [`Dictionary`]: one trained dictionary in its prepared forms (`ZSTD_CDict`,
//!   `ZSTD_DDict`: no call loads it again), named by a small id that its blobs carry;
//!   charged to the DRAM budget while it lives, which is while any leaf holding blobs
//!   compressed with it, or the engine as its current one, holds it (an `Arc`).
//! * [`training`]: for each kind, the reservoir of recent values, background training,
//!   and the swap to a new dictionary when a held-out sample compresses noticeably better.
//!
//! Every frame carries zstd's checksum of its content, so a blob decoded with a damaged
//! dictionary (or a damaged blob) fails to decode instead of giving wrong bytes.

pub mod kinds;
pub mod page;
pub mod training;

use std::cell::RefCell;
use std::sync::Arc;

use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, DParameter, FrameFormat};

use crate::memory::{Memory, alloc_size};

/// The zstd level dictionaries are prepared for. Level 1 held as many JSON documents
/// in 16 MiB as level 3 at the same fill rate (docs/RESULTS.md), and its prepared
/// compression dictionary takes a third of level 3's (162 KB against 523 KB for 112 KiB:
/// `ZSTD_fast` keeps one hash table, `ZSTD_dfast` two, larger).
const LEVEL: i32 = 1;

/// A trained dictionary, prepared for compression and decompression.
pub struct Dictionary {
    id: u8,
    encoder: zstd::dict::EncoderDictionary<'static>,
    decoder: zstd::dict::DecoderDictionary<'static>,
    /// What it is charged: the prepared forms (the raw bytes are not kept).
    charge: i64,
    memory: Arc<Memory>,
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary")
            .field("id", &self.id)
            .field("charge", &self.charge)
            .finish()
    }
}

thread_local! {
    /// One compression and one decompression context per thread, set up once for the
    /// frames blobs use; each call references the dictionary it needs (no copy).
    static CONTEXTS: RefCell<Option<(CCtx<'static>, DCtx<'static>)>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's contexts.
fn with_contexts<R>(f: impl FnOnce(&mut CCtx<'static>, &mut DCtx<'static>) -> R) -> Option<R> {
    CONTEXTS.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            let mut cctx = CCtx::try_create()?;
            let mut dctx = DCtx::try_create()?;
            // No magic number and no dictionary id (the blob header names its
            // dictionary), no content size (the header has the length); a checksum.
            for p in [
                CParameter::Format(FrameFormat::Magicless),
                CParameter::DictIdFlag(false),
                CParameter::ContentSizeFlag(false),
                CParameter::ChecksumFlag(true),
            ] {
                cctx.set_parameter(p).ok()?;
            }
            dctx.set_parameter(DParameter::Format(FrameFormat::Magicless))
                .ok()?;
            *cell = Some((cctx, dctx));
        }
        let (cctx, dctx) = cell.as_mut()?;
        Some(f(cctx, dctx))
    })
}

impl Dictionary {
    /// Prepares the dictionary `raw` under `id` and charges it to `memory`. `None` if
    /// zstd cannot take it.
    pub fn prepare(id: u8, raw: &[u8], memory: Arc<Memory>) -> Option<Arc<Dictionary>> {
        Self::prepare_at(id, raw, LEVEL, memory)
    }

    /// `prepare` for compression at zstd `level` (SSD blocks: `ssd/dictionary.rs`).
    pub fn prepare_at(
        id: u8,
        raw: &[u8],
        level: i32,
        memory: Arc<Memory>,
    ) -> Option<Arc<Dictionary>> {
        if raw.is_empty() {
            return None;
        }
        let encoder = zstd::dict::EncoderDictionary::copy(raw, level);
        let decoder = zstd::dict::DecoderDictionary::copy(raw);
        let charge = (alloc_size(encoder.as_cdict().sizeof())
            + alloc_size(decoder.as_ddict().sizeof())
            + alloc_size(size_of::<Dictionary>())) as i64;
        memory.change_dictionaries(charge);
        Some(Arc::new(Dictionary {
            id,
            encoder,
            decoder,
            charge,
            memory,
        }))
    }

    pub fn id(&self) -> u8 {
        self.id
    }

    /// What it is charged while it lives.
    #[cfg(test)]
    pub fn charge(&self) -> i64 {
        self.charge
    }

    /// Appends `value` compressed with this dictionary to `out`; its length, or `None`
    /// if zstd fails.
    pub fn compress(&self, value: &[u8], out: &mut Vec<u8>) -> Option<usize> {
        with_contexts(|cctx, _| {
            cctx.ref_cdict(self.encoder.as_cdict()).ok()?;
            out.reserve(zstd_safe::compress_bound(value.len()));
            let start = out.len();
            let mut tail = zstd_safe::OutBuffer::around_pos(out, start);
            let done = cctx
                .compress_stream2(
                    &mut tail,
                    &mut zstd_safe::InBuffer::around(value),
                    zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_end,
                )
                .ok();
            let written = tail.pos() - start;
            // The context must not keep a reference past this dictionary's life.
            cctx.disable_dictionary().ok()?;
            (done == Some(0)).then_some(written)
        })
        .flatten()
    }

    /// Decompresses a frame of this dictionary that must hold `len` bytes; `None` if it
    /// does not (damaged frame or dictionary: the checksum fails).
    pub fn decompress(&self, frame: &[u8], len: usize) -> Option<Vec<u8>> {
        with_contexts(|_, dctx| {
            dctx.ref_ddict(self.decoder.as_ddict()).ok()?;
            let mut value = Vec::with_capacity(len);
            let done = dctx.decompress(&mut value, frame);
            dctx.disable_dictionary().ok()?;
            (done.ok()? == len && value.len() == len).then_some(value)
        })
        .flatten()
    }
}

impl Drop for Dictionary {
    fn drop(&mut self) {
        self.memory.change_dictionaries(-self.charge);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;
    use crate::record::{Meta, blob_dictionary, decode_blob, encode_blob};

    const CITIES: [&str; 6] = ["Oslo", "Lima", "Perth", "Quito", "Accra", "Hanoi"];

    /// A JSON document of one of two schemas: `orders` (schema 1) or `users` (0), its
    /// values drawn from `seed`.
    pub(crate) fn document(schema: u8, seed: u64) -> Vec<u8> {
        let mut doc = String::from("[");
        let records = 3 + seed % 4;
        for i in 0..records {
            let n = super::training::mix(seed.wrapping_mul(31).wrapping_add(i));
            let city = CITIES[(n % 6) as usize];
            if i > 0 {
                doc.push(',');
            }
            doc += &if schema == 0 {
                format!(
                    r#"{{"id":{},"name":"user{}","email":"user{}@example.com","city":"{city}","active":{},"score":{}}}"#,
                    n % 100_000,
                    n % 9973,
                    n % 9973,
                    n.is_multiple_of(2),
                    n % 1000
                )
            } else {
                format!(
                    r#"{{"order":"ORD-{:08}","sku":"SKU-{}","quantity":{},"warehouse":"{city} depot","shipped_at":"2026-{:02}-{:02}T10:00:00Z"}}"#,
                    n % 100_000_000,
                    n % 977,
                    n % 50,
                    1 + n % 12,
                    1 + n % 28
                )
            };
        }
        doc.push(']');
        doc.into_bytes()
    }

    /// `len` bytes of documents of `schema` (the last one cut short), drawn from `seed`:
    /// a value a trained dictionary shrinks well beyond LZ4 alone.
    pub(crate) fn documents(schema: u8, seed: u64, len: usize) -> Vec<u8> {
        let mut text = Vec::with_capacity(len + 512);
        let mut next = seed;
        while text.len() < len {
            text.extend_from_slice(&document(schema, next));
            next = super::training::mix(next);
        }
        text.truncate(len);
        text
    }

    /// A dictionary trained on 400 documents of `schema`.
    pub(crate) fn trained(id: u8, schema: u8, memory: Arc<Memory>) -> Arc<Dictionary> {
        let samples: Vec<Vec<u8>> = (0..400).map(|i| document(schema, i)).collect();
        let samples: Vec<&[u8]> = samples.iter().map(|s| &s[..]).collect();
        let raw = super::training::train_from_samples(&samples, 16 << 10).expect("trains");
        Dictionary::prepare(id, &raw, memory).expect("prepares")
    }

    /// Three generations: two of schema 0 (ids 1 and 2), one of schema 1 (id 3).
    fn generations() -> &'static [Arc<Dictionary>] {
        static GENERATIONS: OnceLock<Vec<Arc<Dictionary>>> = OnceLock::new();
        GENERATIONS.get_or_init(|| {
            let memory = Arc::new(Memory::default());
            vec![
                trained(1, 0, memory.clone()),
                trained(2, 0, memory.clone()),
                trained(3, 1, memory),
            ]
        })
    }

    #[test]
    fn a_dictionary_shrinks_its_schema_and_names_itself() {
        let memory = Arc::new(Memory::default());
        let users = trained(7, 0, memory.clone());
        assert!(memory.snapshot().dictionaries > 16 << 10, "charged");
        let doc = document(0, 12_345);
        let with = encode_blob(&doc, &Meta::default(), Some(&users));
        let without = encode_blob(&doc, &Meta::default(), None);
        assert_eq!(blob_dictionary(&with), Some(7));
        assert_eq!(blob_dictionary(&without), Some(0));
        assert!(
            with.len() * 2 < without.len(),
            "{} with, {} LZ4",
            with.len(),
            without.len()
        );
        drop(users);
        assert_eq!(
            memory.snapshot().dictionaries,
            0,
            "uncharged when the last goes"
        );
    }

    /// A blob read with a dictionary other than its own — none, another id, or one with
    /// its id but other contents (as a damaged one) — is a miss, never wrong bytes.
    #[test]
    fn a_blob_without_its_dictionary_does_not_decode() {
        let [first, second, orders] = generations() else {
            unreachable!()
        };
        let doc = document(0, 99);
        let blob = encode_blob(&doc, &Meta::default(), Some(first));
        assert_eq!(blob_dictionary(&blob), Some(1));
        assert_eq!(decode_blob(&blob, Some(first)).unwrap().0, doc);
        assert_eq!(decode_blob(&blob, None), None);
        assert_eq!(decode_blob(&blob, Some(second)), None);
        // Same id, other contents: the frame's checksum fails.
        let impostor = trained(1, 1, Arc::new(Memory::default()));
        assert_eq!(decode_blob(&blob, Some(&impostor)), None);
        assert_eq!(decode_blob(&blob, Some(orders)), None);
        // A damaged frame.
        let mut damaged = blob.to_vec();
        let last = damaged.len() - 6;
        damaged[last] ^= 0x40;
        assert_eq!(decode_blob(&damaged, Some(first)), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Any value, JSON of either schema or arbitrary bytes, round-trips through a blob
        /// under any generation.
        #[test]
        fn any_value_round_trips_under_any_generation(
            generation in 0usize..3,
            json in any::<bool>(),
            schema in 0u8..2,
            seed in any::<u64>(),
            bytes in proptest::collection::vec(any::<u8>(), 0..2048),
            flags in any::<u32>(),
            cas in any::<u64>(),
            expires in proptest::option::of(any::<u64>()),
        ) {
            let dictionary = &generations()[generation];
            let value = if json { document(schema, seed) } else { bytes };
            let meta = Meta { flags, cas, expires_at_ms: expires, ..Meta::default() };
            let blob = encode_blob(&value, &meta, Some(dictionary));
            let (decoded, decoded_meta) = decode_blob(&blob, Some(dictionary)).unwrap();
            prop_assert_eq!(decoded, value);
            prop_assert_eq!(decoded_meta.flags, flags);
            prop_assert_eq!(decoded_meta.expires_at_ms, expires);
            prop_assert_eq!(decoded_meta.cas, cas);
        }
    }
}
