//! Paper Fig. 2a: LZ4 compression ratio of 4 KiB pages when objects are sorted by key
//! (a B+ tree leaf) versus hashed into pages (a hash index), on a real time series:
//! hourly Seattle temperatures from the `vega_datasets` PyPI package (timestamp key,
//! small value, like the paper's Bitstamp ticks).
//!
//! `cargo bench -p zipcache --bench page_compression`

use std::process::Command;

use zipcache::internals::{Geometry, Meta, Payload, Record, compress_page, dram_subpage};

fn dataset() -> Vec<(Vec<u8>, Vec<u8>)> {
    let dir = Command::new("python3")
        .args([
            "-c",
            "import os, vega_datasets; print(os.path.dirname(vega_datasets.__file__))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .expect("this benchmark needs the PyPI package vega_datasets: pip install vega_datasets");
    let text = std::fs::read_to_string(format!("{dir}/_data/seattle-temps.csv"))
        .expect("seattle-temps.csv");
    text.lines()
        .skip(1)
        .enumerate()
        .filter_map(|(i, line)| {
            let (date, temp) = line.split_once(',')?;
            // Key: 8-byte big-endian hour number (sorts like the timestamp); value: the
            // reading as the CSV has it, with its date.
            let key = (i as u64).to_be_bytes().to_vec();
            Some((key, format!("{date},{temp}").into_bytes()))
        })
        .collect()
}

/// Lays objects out page by page, each page as full as it gets without a sub-page
/// overflowing; returns (object bytes, compressed bytes).
fn pack(objects: &[&(Vec<u8>, Vec<u8>)], geometry: &Geometry) -> (usize, usize) {
    let (mut raw, mut compressed) = (0, 0);
    let mut start = 0;
    while start < objects.len() {
        let mut end = start + 1;
        let records = |r: &[&(Vec<u8>, Vec<u8>)]| -> Vec<(Vec<u8>, Vec<u8>)> {
            r.iter().map(|&o| o.clone()).collect()
        };
        let fits = |s: usize, e: usize| {
            let recs = records(&objects[s..e]);
            let recs: Vec<Record> = recs
                .iter()
                .map(|(k, v)| Record {
                    key: k,
                    payload: Payload::Inline(v),
                    meta: Meta::default(),
                })
                .collect();
            geometry.build(&recs)
        };
        let mut page = fits(start, end).expect("one object fits");
        while end < objects.len() {
            match fits(start, end + 1) {
                Some(p) => {
                    page = p;
                    end += 1;
                }
                None => break,
            }
        }
        raw += objects[start..end]
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
        compressed += compress_page(&page).len();
        start = end;
    }
    (raw, compressed)
}

fn main() {
    let data = dataset();
    // One sub-page of 4 KiB: plain packing, so the only difference is the order.
    let plain = Geometry {
        subpages: 1,
        subpage_size: 4096,
        fill_limit: 4096,
        hash: dram_subpage,
    };
    let zipcache = Geometry {
        subpages: 16,
        subpage_size: 256,
        fill_limit: 256,
        hash: dram_subpage,
    };
    let sorted: Vec<&(Vec<u8>, Vec<u8>)> = data.iter().collect();
    let mut hashed = sorted.clone();
    hashed.sort_by_key(|(k, _)| xxhash_rust::xxh3::xxh3_64(k));
    println!(
        "dataset: vega_datasets seattle-temps.csv, {} objects",
        data.len()
    );
    println!("| layout | object bytes | compressed bytes | compression ratio |");
    println!("|---|---|---|---|");
    for (name, objs, g) in [
        ("hashed into pages (hash index)", &hashed, &plain),
        ("sorted by key (B+ tree leaf)", &sorted, &plain),
        (
            "sorted, 16 hash sub-pages (ZipCache leaf)",
            &sorted,
            &zipcache,
        ),
    ] {
        let (raw, comp) = pack(objs, g);
        println!(
            "| {name} | {raw} | {comp} | {:.2} |",
            raw as f64 / comp as f64
        );
    }
}
