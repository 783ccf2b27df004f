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
                // Dictionaries trained in the background would change `dram_used` while
                // the test compares it; moving blocks is what is tested here.
                dictionaries: false,
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
        cache.inner.dram.merge_all(0);
        let used = cache.stats().dram_used;
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (cache, stop, reads) = (cache.clone(), stop.clone(), reads.clone());
                std::thread::spawn(move || {
                    let mut i = t * 7919;
                    while !stop.load(Ordering::Relaxed) {
                        i = (i + 104_729) % KEYS;
                        let got = cache.get(format!("key{i:06}").as_bytes()).unwrap();
                        assert_eq!(got.as_deref(), Some(&value(i, 0)[..]), "key {i}");
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Moves overlap reads however the threads are scheduled: the readers have started
        // before the first pass, and read on through at least 20 passes and 2,000 reads.
        while reads.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        let before = reads.load(Ordering::Relaxed);
        let (mut moved, mut passes) = (0, 0);
        while passes < 20 || reads.load(Ordering::Relaxed) < before + 2_000 {
            moved += cache.inner.dram.defragment(100);
            passes += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for reader in readers {
            reader.join().unwrap();
        }
        assert!(moved > 0, "{moved} bytes moved in {passes} passes");
        assert_eq!(cache.stats().dram_used, used);
        assert_eq!(cache.stats().dram_defrag_moved_bytes, moved);
    }
}
