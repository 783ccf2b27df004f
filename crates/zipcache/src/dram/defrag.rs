//! Moving a leaf's page and blobs out of sparsely used allocator pages, so those pages
//! empty and mimalloc returns them to the OS.
//!
//! Churn leaves allocator pages part-used: a size class the workload moves away from
//! keeps a few live blocks in each of its pages, and each such page stays resident
//! whole. The engine owns the one leaf that points to each of its blocks
//! ([`Block`]), so it can move any of them: under the leaf's write lock (no GET reads the
//! page or a blob meanwhile: they hold the read lock while they decode), a block in a page
//! at most [`SPARSE_PERCENT`] used is copied into a block of the mover's own current page
//! and the old one freed. What moves is what mimalloc's hint
//! (`mi_unsafe_heap_page_is_under_utilized`, Valkey's active defrag asks the same) calls
//! sparse; a leaf is write-locked only when its read-locked look found something to move.

use std::sync::atomic::Ordering;

use super::DramTier;
use super::block::Block;
use super::leaf::{LeafState, RETIRED};

/// A block moves when its allocator page has at most this share of its blocks in use.
pub(crate) const SPARSE_PERCENT: usize = 60;

/// The blocks a leaf's state holds: its page and its blobs.
fn blocks(st: &LeafState) -> impl Iterator<Item = &Block> {
    st.page.iter().chain(st.blobs().iter().flatten())
}

/// Moves the state's blocks that sit in sparse pages; returns the bytes moved.
fn move_sparse(st: &mut LeafState, percent: usize) -> u64 {
    let mut moved = 0;
    let mut relocate = |block: &mut Block| {
        if block.in_sparse_page(percent) {
            moved += block.len() as u64;
            *block = block.moved();
        }
    };
    if let Some(page) = &mut st.page {
        relocate(page);
    }
    if let Some(extras) = &mut st.extras {
        extras.blobs.iter_mut().flatten().for_each(relocate);
    }
    moved
}

impl DramTier {
    /// One pass over the leaves, moving every block that sits in an allocator page at
    /// most `percent` used (100: every block outside the pages its threads allocate from
    /// now, as the tests force); returns the bytes moved. A block keeps its length, so
    /// the charge does not change.
    pub(crate) fn defragment(&self, percent: usize) -> u64 {
        let view = self.view();
        let mut moved = 0;
        for id in self.leaves() {
            let Some(leaf) = view.get(id.0) else {
                continue;
            };
            if !blocks(&leaf.state.read()).any(|b| b.in_sparse_page(percent)) {
                continue;
            }
            let mut st = leaf.state.write();
            if leaf.has(RETIRED) {
                continue;
            }
            moved += self.charged(leaf, &mut st, |st| move_sparse(st, percent));
        }
        self.counters
            .defrag_moved_bytes
            .fetch_add(moved, Ordering::Relaxed);
        moved
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use crate::{Config, ZipCache};

    fn value(i: u32, version: u32) -> Vec<u8> {
        let len = 40 + (i * 7 + version * 13) as usize % 400;
        format!("{i:08}.{version}.")
            .into_bytes()
            .into_iter()
            .cycle()
            .take(len)
            .collect()
    }

    /// GETs on other threads while every block of every leaf is moved again and again:
    /// each reads its key's value or (never stored otherwise) nothing, never freed or
    /// foreign bytes; and moving changes no charge.
    #[test]
    fn gets_read_the_right_bytes_while_blocks_move() {
        let cache = Arc::new(
            ZipCache::open(Config {
                dram_capacity: 32 << 20,
                ..Config::default()
            })
            .unwrap(),
        );
        const KEYS: u32 = 20_000;
        for i in 0..KEYS {
            cache
                .put(format!("key{i:06}").as_bytes(), &value(i, 0), None)
                .unwrap();
        }
        // Churn, so that allocator pages are part-used: every key written again, then
        // every other key once more (each write frees the blob it replaces, each merge
        // the page).
        let version = |i: u32| 1 + i % 2;
        for (i, v) in (0..KEYS)
            .map(|i| (i, 1))
            .chain((1..KEYS).step_by(2).map(|i| (i, 2)))
        {
            cache
                .put(format!("key{i:06}").as_bytes(), &value(i, v), None)
                .unwrap();
        }
        cache.settle().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (cache, stop, started) = (cache.clone(), stop.clone(), started.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    let mut i = t * 7919;
                    while !stop.load(Ordering::Relaxed) {
                        i = (i + 104_729) % KEYS;
                        let got = cache.get(format!("key{i:06}").as_bytes()).unwrap();
                        assert_eq!(got.as_deref(), Some(&value(i, version(i))[..]), "key {i}");
                        reads += 1;
                        started.fetch_add(1, Ordering::Relaxed);
                    }
                    reads
                })
            })
            .collect();
        // Blocks move while GETs run, not before the readers start.
        while started.load(Ordering::Relaxed) < 2 {
            std::thread::yield_now();
        }
        // On a thread of its own, as the housekeeper's: blocks in the pages the writing
        // thread allocates from are not sparse to that thread.
        let mover = cache.clone();
        let moved: u64 =
            std::thread::spawn(move || (0..20).map(|_| mover.inner.dram.defragment(100)).sum())
                .join()
                .unwrap();
        stop.store(true, Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        assert!(moved > 0 && reads > 0, "{moved} bytes moved, {reads} reads");
        assert_eq!(cache.stats().dram_defrag_moved_bytes, moved);
        // Moving changes no charge: the account still matches a recount. (Not `dram_used`
        // before and after: the housekeeper's idle-buffer pass and dictionary training run
        // meanwhile and change it legitimately.)
        cache.settle().unwrap();
        let dram = &cache.inner.dram;
        assert_eq!(
            super::super::test_support::recount(dram),
            dram.memory.snapshot()
        );
    }
}
