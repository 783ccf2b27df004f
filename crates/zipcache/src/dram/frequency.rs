//! How often each key was read lately, so that a cold leaf leaving DRAM keeps its hot
//! objects instead of taking them along with its cold neighbours (`DramTier::shed_cold`,
//! `drop_clean`). A leaf's page has no room for a reference bit per object; a count-min
//! sketch of GETs stands in for one, halved every ten reads per counter as in TinyLFU so
//! that old popularity fades.
//!
//! Every GET passes through `record`, from every serving thread at once, so the sketch is
//! built to cost one cache line and few writes: a key's counters all lie in one 64-byte
//! block (a blocked count-min sketch, as Caffeine's), only the smallest of them go up and
//! none past `CAP`, an increment is a plain load and store (a lost one only makes a key
//! look a little colder), and a shard's period is counted by one read in
//! `PERIOD_SAMPLE`.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::memory::alloc_size;

/// Independent counters per key, one in each row of its block: an estimate is the
/// smallest of them.
const ROWS: usize = 4;
/// Counters a block holds for each row: a block is one cache line.
const ROW_SLOTS: usize = 16;
/// Counters per row of one shard, at most: the GET that completes a shard's period
/// halves its 16 Ki counters, a few microseconds once in 40 Ki reads.
const MAX_SHARD_WIDTH: u64 = 4096;
/// Reads a shard counts per counter of a row before it halves them all (TinyLFU's
/// sample size).
const READS_PER_COUNTER: u64 = 10;
/// Where counters saturate: `keep` needs `HOT_READS` and an order among the hot, and at
/// the cap a hot key's counters are only read until the next halving, so the serving
/// threads do not keep writing the same cache lines (TinyLFU's 4-bit counters stop here).
const CAP: u8 = 15;
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
/// Seeds the key hash that picks a shard, a block and the block's counters.
const SEED: u64 = 0x5a1b_0c2d_3e4f_6071;
/// One read in this many, drawn at random per thread, adds this many to its shard's
/// count of reads: one shared write per 16 GETs instead of one per GET, and the same
/// period on average.
const PERIOD_SAMPLE: u32 = 16;

/// One cache line of counters: `ROWS` rows of `ROW_SLOTS`.
#[repr(align(64))]
struct Block([AtomicU8; ROWS * ROW_SLOTS]);

/// One shard: its counters, and its reads since it last halved them. Aligned so that
/// no two shards' counts of reads share a cache line.
#[repr(align(64))]
struct Shard {
    blocks: Box<[Block]>,
    reads: AtomicU32,
}

impl Shard {
    fn halve(&self) {
        for counter in self.blocks.iter().flat_map(|block| &block.0) {
            let count = counter.load(Ordering::Relaxed);
            if count > 0 {
                counter.store(count >> 1, Ordering::Relaxed);
            }
        }
    }
}

/// A key's counters: its block and, for each row, the index of its counter there. The
/// block is fetched into the cache as soon as it is found (`ReadFrequency::locate`), so
/// that a GET can walk the tree meanwhile and count its read after.
pub(super) struct Counters<'a> {
    shard: &'a Shard,
    block: &'a Block,
    slots: [usize; ROWS],
}

impl Counters<'_> {
    fn iter(&self) -> impl Iterator<Item = &AtomicU8> {
        self.slots.iter().map(|&slot| &self.block.0[slot])
    }

    /// The key's estimated reads.
    fn smallest(&self) -> u8 {
        let counts = self.iter().map(|counter| counter.load(Ordering::Relaxed));
        counts.min().unwrap_or(0)
    }
}

pub(super) struct ReadFrequency {
    /// Sketches by key hash, so that halving one is quick.
    shards: Box<[Shard]>,
    /// Reads a shard counts before it halves its counters.
    period: u32,
}

/// `x` scaled from 0..2^32 to 0..n without a division (Lemire's fast range).
fn scale(x: u32, n: usize) -> usize {
    ((x as u64 * n as u64) >> 32) as usize
}

/// Asks for `block`'s cache line ahead of its use: a sketch of a large cache is larger
/// than the CPU's caches, and the one miss on it was most of a read's cost.
#[cfg(target_arch = "x86_64")]
fn prefetch(block: &Block) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: SSE, which `_mm_prefetch` needs, is part of every x86_64 CPU; a prefetch
    // is a hint that neither faults nor reads anything into the program, and the pointer
    // is a live reference's anyway. Every test that counts a read runs it.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(block).cast()) };
}

#[cfg(not(target_arch = "x86_64"))]
fn prefetch(_: &Block) {}

/// Whether this read is one of the `PERIOD_SAMPLE` that count for a shard's period:
/// a xorshift per thread, not a shared counter.
fn sampled() -> bool {
    thread_local! {
        static STATE: Cell<u32> = const { Cell::new(0x9e37_79b9) };
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        state.set(x);
        x % PERIOD_SAMPLE == 0
    })
}

impl ReadFrequency {
    /// A sketch sized for `dram_capacity` bytes of objects.
    pub(super) fn new(dram_capacity: u64) -> Self {
        let counters = (dram_capacity / BUDGET_PER_COUNTER).max(64);
        let shards = counters.div_ceil(MAX_SHARD_WIDTH);
        let blocks = counters.div_ceil(shards).div_ceil(ROW_SLOTS as u64);
        ReadFrequency {
            shards: (0..shards)
                .map(|_| Shard {
                    blocks: (0..blocks)
                        .map(|_| Block(std::array::from_fn(|_| AtomicU8::new(0))))
                        .collect(),
                    reads: AtomicU32::new(0),
                })
                .collect(),
            period: (READS_PER_COUNTER * blocks * ROW_SLOTS as u64) as u32,
        }
    }

    /// What the sketch takes of DRAM: the shards and each one's counters.
    pub(super) fn bytes(&self) -> i64 {
        let counters = alloc_size(size_of_val(&*self.shards[0].blocks));
        let table = alloc_size(size_of_val(&*self.shards));
        (table + self.shards.len() * counters) as i64
    }

    /// Where `key`'s counters are; their cache line starts coming in now.
    pub(super) fn locate(&self, key: &[u8]) -> Counters<'_> {
        let hash = xxh3_64_with_seed(key, SEED);
        let shard = &self.shards[scale((hash >> 32) as u32, self.shards.len())];
        let block = &shard.blocks[scale(hash as u32, shard.blocks.len())];
        prefetch(block);
        // The rows' slots from the top bits of the hash remixed, so that keys that share
        // a block (by the hash's low bits) seldom share their slots too.
        let mixed = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48;
        let slots =
            std::array::from_fn(|row| row * ROW_SLOTS + (mixed >> (4 * row)) as usize % ROW_SLOTS);
        Counters {
            shard,
            block,
            slots,
        }
    }

    /// Counts a read of the key `counters` belong to; the GET that completes its shard's
    /// period halves the shard's counters. Only the key's smallest counters go up
    /// (conservative update: the others already count more than this key's reads), which
    /// also spares writes.
    pub(super) fn record(&self, counters: Counters<'_>) {
        let smallest = counters.smallest();
        if smallest < CAP {
            for counter in counters.iter() {
                // Another thread may have moved it since: a lost or extra increment of
                // a sketch is noise, not a wrong value.
                if counter.load(Ordering::Relaxed) == smallest {
                    counter.store(smallest + 1, Ordering::Relaxed);
                }
            }
        }
        if sampled() {
            let reads = &counters.shard.reads;
            let before = reads.fetch_add(PERIOD_SAMPLE, Ordering::Relaxed);
            if before < self.period && before + PERIOD_SAMPLE >= self.period {
                reads.fetch_sub(self.period, Ordering::Relaxed);
                counters.shard.halve();
            }
        }
    }

    /// How often `key` was read, as its counters say.
    pub(super) fn estimate(&self, key: &[u8]) -> u8 {
        self.locate(key).smallest()
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

    fn read(reads: &ReadFrequency, i: u32) {
        reads.record(reads.locate(&key(i)));
    }

    /// Key i read i times.
    fn reads_of_0_to_9() -> ReadFrequency {
        let reads = ReadFrequency::new(2 << 20);
        for i in 0..10 {
            for _ in 0..i {
                read(&reads, i);
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
            read(&reads, 1);
        }
        assert_eq!(reads.keep(&[(&key(1), 40)]), [false]);
    }

    #[test]
    fn old_reads_fade() {
        let reads = ReadFrequency::new(2 << 20);
        for _ in 0..8 {
            read(&reads, 1);
        }
        assert_eq!(reads.estimate(&key(1)), 8);
        // Five periods' worth of reads of another key, counted by a sample of them: at
        // least four halvings (8 → 0) but with odds of about 10^-80.
        for _ in 0..5 * reads.period {
            read(&reads, 2);
        }
        assert_eq!(reads.estimate(&key(1)), 0);
    }

    #[test]
    fn counts_stop_at_the_cap() {
        let reads = ReadFrequency::new(2 << 20);
        for _ in 0..100 {
            read(&reads, 1);
        }
        assert_eq!(reads.estimate(&key(1)), CAP);
    }

    #[test]
    fn a_sample_of_reads_counts_for_the_period() {
        let reads = ReadFrequency::new(2 << 20);
        let half = reads.period / 2;
        for i in 0..half {
            read(&reads, i % 1000);
        }
        // 1,280 samples expected of 20,480 reads: ±15 % is ±5 standard deviations.
        let counted = reads.shards[0].reads.load(Ordering::Relaxed);
        assert!(
            counted.abs_diff(half) < half / 7,
            "{counted} of {half} reads counted"
        );
    }

    #[test]
    fn few_keys_are_counted_exactly() {
        // 1,000 keys in 256 blocks of 16 counters a row: a key's estimate is wrong only
        // when each of its four counters is shared with a busier key.
        let reads = ReadFrequency::new(2 << 20);
        let times = |i: u32| (i % 10) as u8;
        for i in 0..1000 {
            for _ in 0..times(i) {
                read(&reads, i);
            }
        }
        let estimates: Vec<u8> = (0..1000).map(|i| reads.estimate(&key(i))).collect();
        assert!((0..1000).all(|i| estimates[i as usize] >= times(i)));
        let exact = (0..1000)
            .filter(|&i| estimates[i as usize] == times(i))
            .count();
        assert!(exact >= 950, "{exact} of 1,000 exact");
    }

    #[test]
    fn the_sketch_is_a_small_share_of_the_budget() {
        for budget in [1u64 << 20, 64 << 20, 8 << 30] {
            let reads = ReadFrequency::new(budget);
            let counters = reads.shards.len() * reads.shards[0].blocks.len() * ROW_SLOTS;
            assert!(
                counters as u64 >= budget / BUDGET_PER_COUNTER,
                "{counters} a row"
            );
            let bytes = reads.bytes() as f64;
            assert!(bytes / budget as f64 <= 0.01, "{bytes} bytes for {budget}");
        }
    }
}
