//! Codecs a medium object could be stored with, measured on the `--values json` or
//! `--values json-mixed` documents (issue 21's fill row, issue 33's mixed documents): per
//! document, the bytes each stores and the CPU it takes to compress and to decompress
//! one, with a dictionary trained by the engine's trainer as it trains one at a 16 MiB
//! budget, and as the reference, zstd level 3 with a 112 KiB dictionary trained by zstd
//! on as many other documents of the source as are measured. The engine uses zstd level
//! 1 with the dictionary (`dictionary/mod.rs`); docs/RESULTS.md has the figures and the
//! choice.
//!
//! `cargo run --release -p zipcache-bench --example medium_codecs [json|json-mixed [DOCUMENTS [DICTIONARY_KIB]]]`

use std::hint::black_box;
use std::sync::Arc;

use zipcache::internals::{Memory, PageDictionary, train_from_samples};
use zipcache_bench::procfs::cpu_seconds;
use zipcache_bench::values::{Content, Documents, MixedDocuments, ValueGen};
use zstd::zstd_safe::{
    self, CCtx, CParameter, DCtx, DParameter, DictAttachPref, FrameFormat, ParamSwitch,
};

/// What the engine trains at a 16 MiB budget: a reservoir of 512 samples of at most
/// 1 KiB, one in 8 held out, into a 64 KiB dictionary.
const SAMPLES: usize = 512;
const SAMPLE_PREFIX: usize = 1024;
const HELD_OUT_EVERY: usize = 8;
const DICTIONARY_KIB: usize = 64;
/// The reference: zstd's own trainer, a dictionary of 112 KiB, used at level 3.
const REFERENCE_KIB: usize = 112;
const REFERENCE_LEVEL: i32 = 3;
/// Passes over the documents a timed round makes (the process's CPU time has 10 ms
/// ticks), and the rounds, of which the fastest counts.
const PASSES: usize = 10;
const ROUNDS: usize = 3;

/// A codec under test: compresses a document into a `Vec` (cleared first), and
/// decompresses one of a known length.
trait Codec {
    fn compress(&mut self, value: &[u8], out: &mut Vec<u8>);
    fn decompress(&mut self, data: &[u8], len: usize, out: &mut Vec<u8>);
}

/// zstd frames as the engine writes them (magicless, no dictionary id or content size,
/// a checksum), with a prepared dictionary referenced by each call.
struct Zstd {
    cctx: CCtx<'static>,
    dctx: DCtx<'static>,
    cdict: zstd::dict::EncoderDictionary<'static>,
    ddict: zstd::dict::DecoderDictionary<'static>,
}

impl Zstd {
    /// At `level`; `huffman` Huffman-codes literals where a negative level would not;
    /// `copy` copies the dictionary's tables into the context instead of attaching them.
    fn new(raw: &[u8], level: i32, huffman: bool, copy: bool) -> Zstd {
        let mut cctx = CCtx::create();
        let mut dctx = DCtx::create();
        let mut parameters = vec![
            CParameter::Format(FrameFormat::Magicless),
            CParameter::DictIdFlag(false),
            CParameter::ContentSizeFlag(false),
            CParameter::ChecksumFlag(true),
        ];
        if huffman {
            parameters.push(CParameter::LiteralCompressionMode(ParamSwitch::Enable));
        }
        if copy {
            parameters.push(CParameter::ForceAttachDict(DictAttachPref::ForceCopy));
        }
        for p in parameters {
            cctx.set_parameter(p).expect("zstd takes the parameter");
        }
        dctx.set_parameter(DParameter::Format(FrameFormat::Magicless))
            .expect("zstd takes the parameter");
        Zstd {
            cctx,
            dctx,
            cdict: zstd::dict::EncoderDictionary::copy(raw, level),
            ddict: zstd::dict::DecoderDictionary::copy(raw),
        }
    }
}

impl Codec for Zstd {
    fn compress(&mut self, value: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.reserve(zstd_safe::compress_bound(value.len()));
        self.cctx.ref_cdict(self.cdict.as_cdict()).expect("refs");
        let mut o = zstd_safe::OutBuffer::around(out);
        let left = self
            .cctx
            .compress_stream2(
                &mut o,
                &mut zstd_safe::InBuffer::around(value),
                zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_end,
            )
            .expect("compresses");
        assert_eq!(left, 0, "one call");
    }

    fn decompress(&mut self, data: &[u8], len: usize, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(len);
        self.dctx.ref_ddict(self.ddict.as_ddict()).expect("refs");
        self.dctx.decompress(out, data).expect("decompresses");
    }
}

/// LZ4 with the trained dictionary as its history, as pages use one (`PageDictionary`).
struct Lz4Dictionary(Arc<PageDictionary>);

impl Codec for Lz4Dictionary {
    fn compress(&mut self, value: &[u8], out: &mut Vec<u8>) {
        out.clear();
        self.0.compress_into(value, out).expect("compresses");
    }

    fn decompress(&mut self, data: &[u8], len: usize, out: &mut Vec<u8>) {
        out.resize(len, 0);
        assert!(self.0.decompress_prefix(data, len, len, out));
    }
}

/// LZ4 alone, as medium objects were stored before dictionaries.
struct Lz4;

impl Codec for Lz4 {
    fn compress(&mut self, value: &[u8], out: &mut Vec<u8>) {
        out.clear();
        lzzzz::lz4::compress_to_vec(value, out, lzzzz::lz4::ACC_LEVEL_DEFAULT).expect("compresses");
    }

    fn decompress(&mut self, data: &[u8], len: usize, out: &mut Vec<u8>) {
        out.resize(len, 0);
        lzzzz::lz4::decompress(data, out).expect("decompresses");
    }
}

/// The bytes of a document up to its first field's name's end (at most 32): its schema's
/// cheapest fingerprint.
fn first_field(document: &[u8]) -> &[u8] {
    let head = &document[..document.len().min(32)];
    head.windows(2)
        .position(|w| w == b"\":")
        .map_or(head, |end| &head[..end])
}

/// zstd 1 with one of several dictionaries: one for each of the commonest first fields
/// of the reservoir's samples (trained on those samples alone), the whole reservoir's
/// (`all`) for the rest; or, with `best`, whichever stores the document in the fewest bytes. The
/// dictionary used is named by a byte ahead of the frame.
struct Clustered {
    fields: Vec<Vec<u8>>,
    codecs: Vec<Zstd>,
    best: bool,
    scratch: Vec<u8>,
}

impl Clustered {
    fn new(samples: &[&[u8]], all: &[u8], clusters: usize, size: usize, best: bool) -> Clustered {
        let mut counts = std::collections::HashMap::<&[u8], usize>::new();
        for s in samples {
            *counts.entry(first_field(s)).or_default() += 1;
        }
        let mut common: Vec<(&[u8], usize)> = counts.into_iter().collect();
        common.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut fields = Vec::new();
        let mut codecs = Vec::new();
        for (field, _) in common.into_iter().take(clusters) {
            let theirs: Vec<&[u8]> = samples
                .iter()
                .copied()
                .filter(|s| first_field(s) == field)
                .collect();
            if let Some(raw) = train_from_samples(&theirs, size) {
                fields.push(field.to_vec());
                codecs.push(Zstd::new(&raw, 1, false, false));
            }
        }
        codecs.push(Zstd::new(all, 1, false, false));
        Clustered {
            fields,
            codecs,
            best,
            scratch: Vec::new(),
        }
    }
}

impl Codec for Clustered {
    fn compress(&mut self, value: &[u8], out: &mut Vec<u8>) {
        let chosen = if self.best {
            (0..self.codecs.len())
                .min_by_key(|&i| {
                    self.codecs[i].compress(value, &mut self.scratch);
                    self.scratch.len()
                })
                .expect("one codec at least")
        } else {
            let field = first_field(value);
            self.fields
                .iter()
                .position(|f| f == field)
                .unwrap_or(self.fields.len())
        };
        self.codecs[chosen].compress(value, &mut self.scratch);
        out.clear();
        out.push(chosen as u8);
        out.extend_from_slice(&self.scratch);
    }

    fn decompress(&mut self, data: &[u8], len: usize, out: &mut Vec<u8>) {
        self.codecs[usize::from(data[0])].decompress(&data[1..], len, out);
    }
}

/// CPU nanoseconds per document of `f` over every document, the fastest of the rounds.
fn ns_per_document(documents: usize, mut f: impl FnMut()) -> f64 {
    let pid = std::process::id();
    (0..ROUNDS)
        .map(|_| {
            let start = cpu_seconds(pid).expect("reads /proc");
            for _ in 0..PASSES {
                f();
            }
            cpu_seconds(pid).expect("reads /proc") - start
        })
        .fold(f64::INFINITY, f64::min)
        * 1e9
        / (PASSES * documents) as f64
}

/// One row: stored bytes a document, ratio, and CPU to compress and decompress one;
/// every document round-trips first.
fn measure(name: &str, codec: &mut dyn Codec, documents: &[Vec<u8>]) {
    let mut back = Vec::new();
    let stored: Vec<Vec<u8>> = documents
        .iter()
        .map(|d| {
            let mut out = Vec::new();
            codec.compress(d, &mut out);
            codec.decompress(&out, d.len(), &mut back);
            assert_eq!(&back, d, "{name} round-trips");
            out
        })
        .collect();
    let mut out = Vec::new();
    let compress = ns_per_document(documents.len(), || {
        for d in documents {
            codec.compress(d, &mut out);
            black_box(&out);
        }
    });
    let decompress = ns_per_document(documents.len(), || {
        for (s, d) in stored.iter().zip(documents) {
            codec.decompress(s, d.len(), &mut back);
            black_box(&back);
        }
    });
    let raw: usize = documents.iter().map(Vec::len).sum();
    let bytes: usize = stored.iter().map(Vec::len).sum();
    println!(
        "| {name} | {:.1} | {:.2} | {compress:.0} | {decompress:.0} |",
        bytes as f64 / documents.len() as f64,
        raw as f64 / bytes as f64,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let source = args.next().unwrap_or_else(|| "json".into());
    let count: u64 = args.next().map_or(20_000, |n| n.parse().expect("a count"));
    let dictionary_kib: usize = args
        .next()
        .map_or(DICTIONARY_KIB, |n| n.parse().expect("KiB"));
    let values = ValueGen {
        sizes: Documents::sizes(),
        content: match source.as_str() {
            "json" => Content::Documents(Arc::new(Documents::load().expect("vega_datasets"))),
            "json-mixed" => {
                let mixed = MixedDocuments::load().expect("botocore");
                let (documents, files) = mixed.counts();
                println!("the source: {documents} documents cut from {files} files");
                Content::MixedDocuments(Arc::new(mixed))
            }
            other => panic!("documents are json or json-mixed, not {other}"),
        },
        seed: 42,
        overwrite_sizes: None,
    };
    let documents: Vec<Vec<u8>> = (0..count).map(|k| values.value(k, 0)).collect();
    // The reservoir: documents the measured ones do not include.
    let reservoir: Vec<Vec<u8>> = (count..count + SAMPLES as u64)
        .map(|k| values.value(k, 0))
        .collect();
    let samples: Vec<&[u8]> = reservoir
        .iter()
        .enumerate()
        .filter(|(i, _)| i % HELD_OUT_EVERY != 0)
        .map(|(_, d)| &d[..d.len().min(SAMPLE_PREFIX)])
        .collect();
    let raw = train_from_samples(&samples, dictionary_kib << 10).expect("trains");
    let mean = documents.iter().map(Vec::len).sum::<usize>() as f64 / count as f64;
    println!(
        "{count} {source} documents of {mean:.0} B on average; a dictionary of {} B trained on {} samples",
        raw.len(),
        samples.len()
    );
    // The reference's training set: as many documents again, none of them measured.
    let training: Vec<Vec<u8>> = (count + SAMPLES as u64..2 * count + SAMPLES as u64)
        .map(|k| values.value(k, 0))
        .collect();
    let reference = zstd::dict::from_samples(&training, REFERENCE_KIB << 10).expect("trains");
    println!("| codec | stored B/doc | ratio | compress ns/doc (CPU) | decompress ns/doc (CPU) |");
    println!("|---|---:|---:|---:|---:|");
    measure(
        &format!(
            "reference: zstd {REFERENCE_LEVEL} + {REFERENCE_KIB} KiB dictionary trained on {count} documents"
        ),
        &mut Zstd::new(&reference, REFERENCE_LEVEL, false, false),
        &documents,
    );
    for (level, huffman, copy) in [
        (3, false, false),
        (1, false, false),
        (1, false, true),
        (-1, false, false),
        (-1, true, false),
        (-3, false, false),
        (-3, true, false),
        (-5, false, false),
        (-5, true, false),
    ] {
        let name = format!(
            "zstd {level}{}{} + dictionary",
            if huffman { ", Huffman literals" } else { "" },
            if copy { ", tables copied" } else { "" }
        );
        measure(
            &name,
            &mut Zstd::new(&raw, level, huffman, copy),
            &documents,
        );
    }
    let lz4_dictionary = PageDictionary::prepare(1, &raw, Arc::new(Memory::default()))
        .expect("liblz4 takes the dictionary");
    measure(
        "LZ4 + dictionary",
        &mut Lz4Dictionary(lz4_dictionary),
        &documents,
    );
    measure("LZ4 alone", &mut Lz4, &documents);
    // Mixed schemas: a dictionary per cluster of values, from the same reservoir.
    for (clusters, best) in [(4, false), (4, true)] {
        let name = format!(
            "zstd 1 + {} of {clusters} first-field dictionaries and the reservoir's",
            if best { "the best" } else { "the document's" }
        );
        measure(
            &name,
            &mut Clustered::new(&samples, &raw, clusters, dictionary_kib << 10, best),
            &documents,
        );
    }
}
