//! DRAM-tier latencies: early-termination decode (paper Table 1), a GET's decode of a page
//! compressed in 1, 2 and 4 chunks (setting `page_chunks`), GET on a compressed
//! and on a bypassed hot page, GET of a medium object compressed with a trained
//! dictionary, and GET throughput with 1 and 2 threads.
//!
//! `cargo bench -p zipcache --bench dram`

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use zipcache::internals::{
    Chunks, Memory, Meta, PackedLayout, PageDictionary, Payload, Record, compress_chunks,
    compress_page, decode_span, decompress_prefix, dram_subpage, text_record,
};
use zipcache::{Config, ZipCache};

/// A leaf page as BT_DRAM builds it (`dram/packed_page.rs`): 16 B keys and the values
/// `value(i)` gives, as many as fit 4 KiB, in 16 variable-length sub-pages behind their
/// end table. Returns the end of each sub-page and the body, whose LZ4 a GET decodes
/// through the end of its key's sub-page.
fn leaf_page(value: impl Fn(u64) -> Vec<u8>) -> (Vec<usize>, Vec<u8>) {
    let layout = PackedLayout {
        subpages: 16,
        chunks: 1,
        capacity: 4096,
        hash: dram_subpage,
    };
    let keys: Vec<String> = (0..128u64)
        .map(|i| format!("{:016}", 1_000_000 + i))
        .collect();
    let values: Vec<Vec<u8>> = (0..128u64).map(value).collect();
    let mut n = keys.len();
    loop {
        let mut records: Vec<(usize, Record)> = (0..n)
            .map(|i| {
                let key = keys[i].as_bytes();
                let record = Record {
                    key,
                    payload: Payload::Inline(&values[i]),
                    meta: Meta::default(),
                };
                (layout.subpage_of(key), record)
            })
            .collect();
        if let Some(page) = layout.build(&mut records) {
            let (table, body) = layout.split(&page).expect("a page just built");
            let ends = (0..16).map(|i| table.end(i)).collect();
            return (ends, body.to_vec());
        }
        n -= 1;
    }
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The paper's values: 64 B, half random, half zeros (η = 0.5).
fn synthetic_value(i: u64) -> Vec<u8> {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut v = vec![0u8; 64];
    for b in &mut v[..32] {
        *b = xorshift(&mut rng) as u8;
    }
    v
}

/// Paper Table 1: the time to decode a 4 KiB leaf through its first m of 16 sub-pages;
/// on the paper's values, then on text rows compressed alone and with an LZ4 page
/// dictionary of other rows (issue 21: Table 1 with and without).
fn early_termination(c: &mut Criterion) {
    let dictionary = {
        let rows: Vec<u8> = (1_000..2_000).flat_map(text_record).collect();
        PageDictionary::prepare(1, &rows, Arc::new(Memory::default())).expect("prepares")
    };
    let pages = [
        ("decode_4KiB_leaf", leaf_page(synthetic_value), None),
        ("decode_4KiB_text_leaf", leaf_page(text_record), None),
        (
            "decode_4KiB_text_leaf_dictionary",
            leaf_page(text_record),
            Some(&*dictionary),
        ),
    ];
    for (name, (ends, body), dictionary) in pages {
        let compressed = match dictionary {
            Some(d) => {
                let mut out = Vec::new();
                d.compress_into(&body, &mut out).expect("compresses");
                out.into_boxed_slice()
            }
            None => compress_page(&body),
        };
        eprintln!(
            "{name}: {} B of records in {} B",
            body.len(),
            compressed.len()
        );
        let mut out = vec![0u8; body.len()];
        let mut group = c.benchmark_group(name);
        for m in [1usize, 2, 4, 8, 16] {
            group.bench_function(format!("subpages_{m}_of_16"), |b| {
                b.iter(|| {
                    assert!(decompress_prefix(
                        black_box(&compressed),
                        body.len(),
                        ends[m - 1],
                        dictionary,
                        &mut out
                    ))
                })
            });
        }
        group.finish();
    }
}

/// A GET's decode of a 4 KiB leaf compressed in `k` chunks (setting `page_chunks`): each
/// iteration decodes the span of every one of the 16 sub-pages in turn, as GETs of keys
/// spread over them do, so a sixteenth of its time is a GET's mean; text rows with an LZ4
/// page dictionary, and the paper's values. Prints each page's compressed size.
fn page_in_chunks(c: &mut Criterion) {
    let dictionary = {
        let rows: Vec<u8> = (1_000..2_000).flat_map(text_record).collect();
        PageDictionary::prepare(1, &rows, Arc::new(Memory::default())).expect("prepares")
    };
    let pages = [
        (
            "page_in_chunks_text_dictionary",
            leaf_page(text_record),
            Some(&*dictionary),
        ),
        ("page_in_chunks", leaf_page(synthetic_value), None),
    ];
    for (name, (ends, body), dictionary) in pages {
        let mut group = c.benchmark_group(name);
        for k in [1usize, 2, 4] {
            let chunks = Chunks::new((1..=k).map(|c| ends[c * 16 / k - 1])).expect("1..=16");
            let mut compressed = Vec::new();
            assert!(compress_chunks(&body, &chunks, dictionary, &mut compressed));
            eprintln!(
                "{name}, {k} chunks: {} B of records in {} B",
                body.len(),
                compressed.len()
            );
            let mut out = vec![0u8; body.len()];
            group.bench_function(format!("chunks_{k}_every_subpage"), |b| {
                b.iter(|| {
                    for s in 0..16 {
                        let start = if s == 0 { 0 } else { ends[s - 1] };
                        let span = start..ends[s];
                        assert!(decode_span(
                            black_box(&compressed),
                            &chunks,
                            span,
                            dictionary,
                            &mut out
                        ));
                    }
                })
            });
        }
        group.finish();
    }
}

fn filled_cache(bypass_r: f64) -> ZipCache {
    let cache = ZipCache::open(Config {
        dram_capacity: 256 << 20,
        bypass_r,
        ..Config::default()
    })
    .unwrap();
    let mut v = [0u8; 64];
    for i in 0..200_000u64 {
        v[..8].copy_from_slice(&i.to_le_bytes());
        cache.put(format!("{i:016}").as_bytes(), &v, None).unwrap();
    }
    cache
}

/// A JSON document of 3 to 6 user records, about 600 B, drawn from `i`.
fn document(i: u64) -> Vec<u8> {
    const CITIES: [&str; 6] = ["Oslo", "Lima", "Perth", "Quito", "Accra", "Hanoi"];
    let mut doc = String::from("[");
    for r in 0..3 + i % 4 {
        let n = (i * 31 + r).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 17;
        if r > 0 {
            doc.push(',');
        }
        doc += &format!(
            r#"{{"id":{},"name":"user{}","email":"user{}@example.com","city":"{}","active":{},"score":{}}}"#,
            n % 100_000,
            n % 9973,
            n % 9973,
            CITIES[(n % 6) as usize],
            n.is_multiple_of(2),
            n % 1000
        );
    }
    doc.push(']');
    doc.into_bytes()
}

/// 64 MiB holding 100,000 JSON documents (medium objects); with `dictionaries`, written
/// again once a dictionary trained on them is current, so that their blobs use it.
fn medium_cache(dictionaries: bool) -> ZipCache {
    let cache = ZipCache::open(Config {
        dram_capacity: 64 << 20,
        bypass_r: 0.0,
        dictionaries,
        ..Config::default()
    })
    .unwrap();
    let fill = |cache: &ZipCache| {
        for i in 0..100_000u64 {
            cache
                .put(format!("{i:016}").as_bytes(), &document(i), None)
                .unwrap();
        }
        cache.settle().unwrap();
    };
    fill(&cache);
    if dictionaries {
        assert!(cache.stats().dictionaries_swapped > 0, "no dictionary");
        fill(&cache);
    }
    let s = cache.stats();
    eprintln!(
        "medium objects: {} objects, {} B of blobs, {} B of dictionaries",
        s.dram_objects, s.dram_medium_bytes, s.dram_dictionary_bytes
    );
    cache
}

fn get_latency(c: &mut Criterion) {
    let mut group = c.benchmark_group("get");
    // Bypass off: every GET decompresses (up to) its sub-page.
    let cold = filled_cache(0.0);
    group.bench_function("compressed_page", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i = (i + 7919) % 200_000;
            black_box(cold.get(format!("{i:016}").as_bytes()).unwrap())
        })
    });
    drop(cold);
    // The same documents with LZ4 alone, then with a trained dictionary.
    for (name, dictionaries) in [
        ("lz4_medium_object", false),
        ("dictionary_medium_object", true),
    ] {
        let medium = medium_cache(dictionaries);
        group.bench_function(name, |b| {
            let mut i = 0u64;
            b.iter(|| {
                i = (i + 7919) % 100_000;
                black_box(medium.get(format!("{i:016}").as_bytes()).unwrap())
            })
        });
        assert_eq!(
            medium.get(b"0000000000000042").unwrap().as_deref(),
            Some(&document(42)[..])
        );
    }
    // Bypass on, a few hot keys hammered until their leaves are promoted.
    let hot = filled_cache(3.0);
    let hot_keys: Vec<String> = (0..8u64).map(|i| format!("{:016}", 100_000 + i)).collect();
    let started = Instant::now();
    while hot.stats().hot_leaves == 0 && started.elapsed() < Duration::from_secs(10) {
        for k in &hot_keys {
            hot.get(k.as_bytes()).unwrap();
        }
    }
    assert!(
        hot.stats().hot_leaves > 0,
        "the hot leaf was never promoted"
    );
    group.bench_function("hot_bypassed_page", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % hot_keys.len();
            black_box(hot.get(hot_keys[i].as_bytes()).unwrap())
        })
    });
    group.finish();
}

fn get_throughput(c: &mut Criterion) {
    let cache = filled_cache(0.0);
    let mut group = c.benchmark_group("get_throughput");
    for threads in [1u64, 2] {
        group.bench_function(format!("threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                let per_thread = iters / threads + 1;
                let started = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..threads {
                        let cache = &cache;
                        s.spawn(move || {
                            let mut i = t * 1_000_003;
                            let mut key = String::with_capacity(16);
                            for _ in 0..per_thread {
                                i = (i + 7919) % 200_000;
                                key.clear();
                                use std::fmt::Write;
                                let _ = write!(key, "{i:016}");
                                black_box(cache.get(key.as_bytes()).unwrap());
                            }
                        });
                    }
                });
                // Wall time per operation across all threads: lower means more throughput.
                started
                    .elapsed()
                    .mul_f64(iters as f64 / (per_thread * threads) as f64)
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    early_termination,
    page_in_chunks,
    get_latency,
    get_throughput
);
criterion_main!(benches);
