//! How often each key was read lately, so that a cold leaf leaving DRAM keeps its hot
//! objects instead of taking them along with its cold neighbours (`DramTier::shed_cold`,
//! `drop_clean`). A leaf's page has no room for a reference bit per object; a count-min
//! sketch of GETs (`cmsketch`: lock-free, 8-bit saturating counters) stands in for one,
//! halved every ten reads per counter as in TinyLFU so that old popularity fades.

use std::sync::atomic::{AtomicU32, Ordering};

use cmsketch::CMSketchAtomicU8;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::memory::alloc_size;

/// Independent hashes (rows) per sketch: an estimate is the smallest of their counters.
/// `CMSketchAtomicU8` derives them from a confidence, 1 − 2^-rows.
const ROWS: i32 = 4;
/// Counters per row of one shard, at most: the GET that completes a shard's period
/// halves its 16 Ki counters, tens of microseconds once in 40 Ki reads.
const MAX_SHARD_WIDTH: u64 = 4096;
/// Reads a shard counts per counter of a row before it halves them all (TinyLFU's
/// sample size). Counters saturate at 255.
const READS_PER_COUNTER: u64 = 10;
/// DRAM budget per counter of a row: 0.8 % of the budget for four rows. Eviction compares
/// the objects of one leaf, so the sketch need not tell every resident key apart: on the
/// cache2k replays (1 KiB values, about 550 bytes an object) half as many counters hit
/// 0.4–0.5 points less, twice as many 0.2 more.
const BUDGET_PER_COUNTER: u64 = 512;
/// Reads that make an object worth keeping: read again since it came in (look-aside,
/// a miss and then a hit or a second miss).
const HOT_READS: u8 = 2;
/// Share of a leaf's candidate bytes its hot objects may keep, at most: each eviction
/// frees at least the rest, so eviction always makes progress.
const KEPT_SHARE: (usize, usize) = (7, 8);
/// Seeds the key hash that picks a shard and feeds its rows.
const SEED: u64 = 0x5a1b_0c2d_3e4f_6071;

/// One shard: its counters, and its reads since it last halved them.
struct Shard {
    sketch: CMSketchAtomicU8,
    reads: AtomicU32,
}

pub(super) struct ReadFrequency {
    /// Sketches by key hash, so that halving one is quick.
    shards: Box<[Shard]>,
    /// Reads a shard counts before it halves its counters.
    period: u32,
}

impl ReadFrequency {
    /// A sketch sized for `dram_capacity` bytes of objects.
    pub(super) fn new(dram_capacity: u64) -> Self {
        let counters = (dram_capacity / BUDGET_PER_COUNTER).max(64);
        let shards = counters.div_ceil(MAX_SHARD_WIDTH);
        let width = counters.div_ceil(shards);
        // `new` sizes a row at ⌈2 / eps⌉ counters and takes ⌈-log2(1 − confidence)⌉ rows.
        let eps = 2.0 / width as f64;
        let confidence = 1.0 - 0.5f64.powi(ROWS);
        ReadFrequency {
            shards: (0..shards)
                .map(|_| Shard {
                    sketch: CMSketchAtomicU8::new(eps, confidence),
                    reads: AtomicU32::new(0),
                })
                .collect(),
            period: (READS_PER_COUNTER * width) as u32,
        }
    }

    /// What the sketch takes of DRAM: the shards and each one's counters.
    pub(super) fn bytes(&self) -> i64 {
        let sketch = &self.shards[0].sketch;
        let counters = alloc_size(sketch.width() * sketch.depth());
        let table = alloc_size(size_of_val(&*self.shards));
        (table + self.shards.len() * counters) as i64
    }

    fn shard(&self, key: &[u8]) -> (u64, &Shard) {
        let hash = xxh3_64_with_seed(key, SEED);
        let shard = (hash >> 32) as usize % self.shards.len();
        (hash, &self.shards[shard])
    }

    /// Counts a read of `key`; the GET that completes its shard's period halves the
    /// shard's counters.
    pub(super) fn record(&self, key: &[u8]) {
        let (hash, shard) = self.shard(key);
        shard.sketch.inc(hash);
        if shard.reads.fetch_add(1, Ordering::Relaxed) + 1 == self.period {
            shard.reads.store(0, Ordering::Relaxed);
            shard.sketch.halve();
        }
    }

    fn estimate(&self, key: &[u8]) -> u8 {
        let (hash, shard) = self.shard(key);
        shard.sketch.estimate(hash)
    }

    /// Which of a leaf's objects (key, bytes) stay in DRAM while the rest go: the most
    /// read of those read at least `HOT_READS` times, up to `KEPT_SHARE` of the bytes.
    pub(super) fn keep(&self, objects: &[(&[u8], usize)]) -> Vec<bool> {
        let total: usize = objects.iter().map(|&(_, bytes)| bytes).sum();
        let budget = total * KEPT_SHARE.0 / KEPT_SHARE.1;
        let mut hot: Vec<(u8, usize)> = objects
            .iter()
            .enumerate()
            .map(|(i, &(key, _))| (self.estimate(key), i))
            .filter(|&(reads, _)| reads >= HOT_READS)
            .collect();
        hot.sort_by_key(|&(reads, i)| (std::cmp::Reverse(reads), i));
        let mut keep = vec![false; objects.len()];
        let mut kept = 0;
        for (_, i) in hot {
            let bytes = objects[i].1;
            if kept + bytes <= budget {
                kept += bytes;
                keep[i] = true;
            }
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Vec<u8> {
        format!("{i:08}").into_bytes()
    }

    /// Key i read i times.
    fn reads_of_0_to_9() -> ReadFrequency {
        let reads = ReadFrequency::new(2 << 20);
        for i in 0..10 {
            for _ in 0..i {
                reads.record(&key(i));
            }
        }
        reads
    }

    fn kept(reads: &ReadFrequency, keys: impl Iterator<Item = u32>) -> Vec<u32> {
        let keys: Vec<(u32, Vec<u8>)> = keys.map(|i| (i, key(i))).collect();
        let objects: Vec<(&[u8], usize)> = keys.iter().map(|(_, k)| (&k[..], 100)).collect();
        let keep = reads.keep(&objects);
        keys.iter()
            .zip(keep)
            .filter(|(_, k)| *k)
            .map(|((i, _), _)| *i)
            .collect()
    }

    #[test]
    fn objects_read_twice_or_more_stay() {
        // 800 of 1,000 bytes: within 7/8.
        assert_eq!(kept(&reads_of_0_to_9(), 0..10), [2, 3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn the_least_read_go_beyond_seven_eighths_of_the_bytes() {
        // All hot, 700 of 800 bytes may stay.
        assert_eq!(kept(&reads_of_0_to_9(), 2..10), [3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn a_lone_object_always_goes_however_hot() {
        let reads = ReadFrequency::new(2 << 20);
        for _ in 0..100 {
            reads.record(&key(1));
        }
        assert_eq!(reads.keep(&[(&key(1), 40)]), [false]);
    }

    #[test]
    fn old_reads_fade() {
        let reads = ReadFrequency::new(2 << 20);
        for _ in 0..8 {
            reads.record(&key(1));
        }
        assert_eq!(reads.estimate(&key(1)), 8);
        // Four halvings' worth of reads of another key: 8 → 0.
        for _ in 0..4 * reads.period {
            reads.record(&key(2));
        }
        assert_eq!(reads.estimate(&key(1)), 0);
    }

    #[test]
    fn the_sketch_is_a_small_share_of_the_budget() {
        for budget in [1u64 << 20, 64 << 20, 8 << 30] {
            let reads = ReadFrequency::new(budget);
            assert_eq!(reads.shards[0].sketch.depth(), ROWS as usize);
            let bytes = reads.bytes() as f64;
            assert!(bytes / budget as f64 <= 0.01, "{bytes} bytes for {budget}");
        }
    }
}
