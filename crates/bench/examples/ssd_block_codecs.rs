//! Which codec packs an SSD sub-page block best (issue 22, `--values airports`; issue 21
//! item 5): records laid out as the flusher writes them — 16-byte decimal keys of one
//! super-leaf's range, the ones `g(key) mod 16` sends to one sub-page, in key order, CAS
//! versions stored against the block's base — each block filled with as many records as
//! its codec packs within `T = 0.75` (3,040 stored bytes), for LZ4 (what `host` mode
//! does), LZ4 with a 64 KiB prefix dictionary, zstd levels 1 and 3 without and with a
//! dictionary trained by the engine's trainer on 4,096 records of other keys.
//!
//! The values are the bench's own (`zipcache_bench::values`): `--values airports`,
//! `--eta 0.5` and `--values json` documents of at most 2 KiB (longer ones are large
//! objects, never in a sub-page block).
//!
//! `cargo run --release -p zipcache-bench --example ssd_block_codecs` (needs the PyPI
//! package `vega_datasets`).

use std::sync::Arc;
use std::time::Instant;

use zipcache::internals::{
    CasBase, Memory, Meta, PageDictionary, Payload, Record, ssd_subpage, train_from_samples,
};
use zipcache_bench::values::{Content, Dataset, Documents, SizeDist, ValueGen, mix64};
use zstd::zstd_safe::{CParameter, DParameter, FrameFormat};

const LIMIT: usize = 3040;
const SUBPAGES: usize = 16;
const BLOCKS: usize = 150;

fn key(id: u64) -> Vec<u8> {
    format!("{id:016}").into_bytes()
}

/// A record as the flusher writes it, its CAS as a server fill assigns them (in write
/// order, keys written in random order).
fn encoded(records: &[(Vec<u8>, Vec<u8>, u64)]) -> Vec<u8> {
    let recs: Vec<Record> = records
        .iter()
        .map(|(k, v, cas)| Record {
            key: k,
            payload: Payload::Inline(v),
            meta: Meta {
                cas: *cas,
                ..Meta::default()
            },
        })
        .collect();
    let base = CasBase::of(&recs);
    let mut out = Vec::new();
    for r in &recs {
        r.encode_in(&mut out, base);
    }
    out
}

fn object(source: &ValueGen, id: u64) -> (Vec<u8>, Vec<u8>, u64) {
    (
        key(id),
        source.value(id, 0),
        (1 << 40) + mix64(id ^ 77) % 6_000_000,
    )
}

/// The records of sub-page 0 of a super-leaf from `base` on, in key order: ids whose
/// `g` sends them there, three in four present (a filled tier holds most keys).
fn subpage_stream(source: &ValueGen, base: u64, n: usize) -> Vec<(Vec<u8>, Vec<u8>, u64)> {
    (base..)
        .filter(|&id| ssd_subpage(&key(id), SUBPAGES) == 0 && !mix64(id).is_multiple_of(4))
        .take(n)
        .map(|id| object(source, id))
        .collect()
}

trait Codec {
    fn name(&self) -> String;
    fn pack(&mut self, raw: &[u8]) -> Vec<u8>;
    fn unpack(&mut self, packed: &[u8], raw_len: usize) -> Vec<u8>;
}

struct Lz4(Option<Arc<PageDictionary>>);

impl Codec for Lz4 {
    fn name(&self) -> String {
        match &self.0 {
            None => "LZ4".into(),
            Some(d) => format!("LZ4 + {} KiB dictionary", d.bytes().len() >> 10),
        }
    }
    fn pack(&mut self, raw: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match &self.0 {
            None => {
                lzzzz::lz4::compress_to_vec(raw, &mut out, lzzzz::lz4::ACC_LEVEL_DEFAULT).unwrap();
            }
            Some(d) => {
                d.compress_into(raw, &mut out).unwrap();
            }
        }
        out
    }
    fn unpack(&mut self, packed: &[u8], raw_len: usize) -> Vec<u8> {
        let mut out = vec![0u8; raw_len];
        match &self.0 {
            None => {
                lzzzz::lz4::decompress(packed, &mut out).unwrap();
            }
            Some(d) => assert!(d.decompress_prefix(packed, raw_len, raw_len, &mut out)),
        }
        out
    }
}

struct Zstd {
    level: i32,
    dictionary: usize,
    c: zstd::bulk::Compressor<'static>,
    d: zstd::bulk::Decompressor<'static>,
}

impl Zstd {
    fn new(level: i32, dictionary: &[u8]) -> Zstd {
        let mut c = zstd::bulk::Compressor::with_dictionary(level, dictionary).unwrap();
        let mut d = zstd::bulk::Decompressor::with_dictionary(dictionary).unwrap();
        // The frames the engine writes: no magic, size or dictionary id; a checksum.
        for p in [
            CParameter::Format(FrameFormat::Magicless),
            CParameter::DictIdFlag(false),
            CParameter::ContentSizeFlag(false),
            CParameter::ChecksumFlag(true),
        ] {
            c.set_parameter(p).unwrap();
        }
        d.set_parameter(DParameter::Format(FrameFormat::Magicless))
            .unwrap();
        Zstd {
            level,
            dictionary: dictionary.len(),
            c,
            d,
        }
    }
}

impl Codec for Zstd {
    fn name(&self) -> String {
        match self.dictionary {
            0 => format!("zstd {}", self.level),
            n => format!("zstd {} + {} KiB dictionary", self.level, n >> 10),
        }
    }
    fn pack(&mut self, raw: &[u8]) -> Vec<u8> {
        self.c.compress(raw).unwrap()
    }
    fn unpack(&mut self, packed: &[u8], raw_len: usize) -> Vec<u8> {
        self.d.decompress(packed, raw_len).unwrap()
    }
}

/// How many of `stream`'s records a block packed by `codec` takes within the limit
/// (the most that fit, by bisection), and the packed bytes.
fn fill(codec: &mut dyn Codec, stream: &[(Vec<u8>, Vec<u8>, u64)]) -> (usize, Vec<u8>, Vec<u8>) {
    let (mut lo, mut hi) = (1, stream.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if codec.pack(&encoded(&stream[..mid])).len() <= LIMIT {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let raw = encoded(&stream[..lo]);
    (lo, codec.pack(&raw), raw)
}

fn measure(name: &str, source: &ValueGen) {
    let samples: Vec<Vec<u8>> = (0..4096u64)
        .map(|i| encoded(&[object(source, 1_000_000_000 + mix64(i) % 1_000_000_000)]))
        .collect();
    let samples: Vec<&[u8]> = samples.iter().map(|s| &s[..]).collect();
    let dictionary = |size: usize| train_from_samples(&samples, size).expect("trains");
    let memory = Arc::new(Memory::default());
    let mut codecs: Vec<Box<dyn Codec>> = vec![
        Box::new(Lz4(None)),
        Box::new(Lz4(Some(
            PageDictionary::prepare(1, &dictionary(64 << 10), memory).unwrap(),
        ))),
        Box::new(Zstd::new(1, &[])),
        Box::new(Zstd::new(3, &[])),
    ];
    for size in [16 << 10, 32 << 10, 64 << 10, 112 << 10] {
        let d = dictionary(size);
        codecs.push(Box::new(Zstd::new(1, &d)));
        codecs.push(Box::new(Zstd::new(3, &d)));
    }
    println!("\n{name}: {BLOCKS} blocks of sub-page 0, filled to {LIMIT} stored bytes");
    println!(
        "{:<28} {:>10} {:>8} {:>13} {:>11} {:>10} {:>10}",
        "codec", "rec/block", "vs LZ4", "raw B/record", "stored/raw", "pack µs", "decode µs"
    );
    let mut lz4_records = 0.0;
    for codec in &mut codecs {
        let (mut records, mut raw_bytes, mut packed_bytes) = (0, 0, 0);
        let (mut pack_ns, mut decode_ns) = (0u128, 0u128);
        for b in 0..BLOCKS as u64 {
            let stream = subpage_stream(source, 100_000 + b * 40_000, 400);
            let (n, packed, raw) = fill(codec.as_mut(), &stream);
            records += n;
            raw_bytes += raw.len();
            packed_bytes += packed.len();
            let started = Instant::now();
            for _ in 0..20 {
                assert_eq!(codec.pack(&raw).len(), packed.len());
            }
            pack_ns += started.elapsed().as_nanos() / 20;
            let started = Instant::now();
            for _ in 0..20 {
                assert_eq!(codec.unpack(&packed, raw.len()), raw);
            }
            decode_ns += started.elapsed().as_nanos() / 20;
        }
        let per_block = records as f64 / BLOCKS as f64;
        if lz4_records == 0.0 {
            lz4_records = per_block;
        }
        println!(
            "{:<28} {:>10.1} {:>7.2}× {:>13.1} {:>11.3} {:>10.2} {:>10.2}",
            codec.name(),
            per_block,
            per_block / lz4_records,
            raw_bytes as f64 / records as f64,
            packed_bytes as f64 / raw_bytes as f64,
            pack_ns as f64 / BLOCKS as f64 / 1000.0,
            decode_ns as f64 / BLOCKS as f64 / 1000.0
        );
    }
}

/// The largest object a sub-page block holds: `medium_max`'s default.
const MEDIUM_MAX: usize = 2048;

/// The values of `content`, `sizes` long.
fn values(content: Content, sizes: SizeDist) -> ValueGen {
    ValueGen {
        sizes,
        content,
        seed: 0x5eed,
        overwrite_sizes: None,
    }
}

/// The JSON documents' sizes below [`MEDIUM_MAX`], with their weights.
fn medium_document_sizes() -> SizeDist {
    let SizeDist::Weighted { sizes, cumulative } = Documents::sizes() else {
        unreachable!("documents draw their sizes from a distribution")
    };
    let kept = sizes.iter().take_while(|&&s| s <= MEDIUM_MAX).count();
    let total = cumulative[kept - 1];
    SizeDist::Weighted {
        sizes: sizes[..kept].to_vec(),
        cumulative: cumulative[..kept].iter().map(|c| c / total).collect(),
    }
}

fn main() {
    let airports = Dataset::load("airports").expect("vega_datasets");
    let documents = Documents::load().expect("vega_datasets");
    measure(
        "airports rows, 64 B",
        &values(Content::Dataset(Arc::new(airports)), SizeDist::Fixed(64)),
    );
    measure(
        "synthetic eta = 0.5, 64 B",
        &values(Content::Synthetic { eta: 0.5 }, SizeDist::Fixed(64)),
    );
    measure(
        "JSON documents 256 B - 2 KiB",
        &values(
            Content::Documents(Arc::new(documents)),
            medium_document_sizes(),
        ),
    );
}
