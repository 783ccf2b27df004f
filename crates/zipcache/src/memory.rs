//! DRAM accounting: every byte the cache holds is charged to `dram_capacity`.
//!
//! Allocators do not hand freed memory back promptly, so the cache cannot steer by RSS;
//! it counts its own structures instead, including the allocator's per-chunk overhead,
//! and reports RSS beside the count.

use std::sync::atomic::{AtomicI64, Ordering};

/// Bytes an allocation of `n` bytes really takes: glibc malloc rounds a chunk to 16 bytes
/// with an 8-byte header and a 32-byte minimum.
pub fn alloc_size(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (n + 8).div_ceil(16).max(2) * 16
    }
}

/// What one leaf (or any other holder) is charged, by component.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    pub compressed_pages: i64,
    pub hot_pages: i64,
    pub write_buffers: i64,
    pub mediums: i64,
    /// Per-object access state (setting `track_access`).
    pub access_tables: i64,
    pub index: i64,
    /// Trained dictionaries (prepared forms) and the reservoir they are trained on.
    pub dictionaries: i64,
}

impl Charge {
    pub fn total(&self) -> i64 {
        self.compressed_pages
            + self.hot_pages
            + self.write_buffers
            + self.mediums
            + self.access_tables
            + self.index
            + self.dictionaries
    }
}

/// The cache-wide account. Holders keep the `Charge` they last reported and pass the
/// old and new charge on every change, so the totals never drift.
#[derive(Debug, Default)]
pub struct Memory {
    compressed_pages: AtomicI64,
    hot_pages: AtomicI64,
    write_buffers: AtomicI64,
    mediums: AtomicI64,
    access_tables: AtomicI64,
    index: AtomicI64,
    dictionaries: AtomicI64,
}

impl Memory {
    pub fn change(&self, old: &Charge, new: &Charge) {
        let apply = |counter: &AtomicI64, old: i64, new: i64| {
            if old != new {
                counter.fetch_add(new - old, Ordering::Relaxed);
            }
        };
        apply(
            &self.compressed_pages,
            old.compressed_pages,
            new.compressed_pages,
        );
        apply(&self.hot_pages, old.hot_pages, new.hot_pages);
        apply(&self.write_buffers, old.write_buffers, new.write_buffers);
        apply(&self.mediums, old.mediums, new.mediums);
        apply(&self.access_tables, old.access_tables, new.access_tables);
        apply(&self.index, old.index, new.index);
    }

    /// Adds `delta` bytes to the index account (inner nodes, descriptors, tables): for
    /// holders whose index DRAM changes by known amounts rather than by re-charging.
    pub fn change_index(&self, delta: i64) {
        self.index.fetch_add(delta, Ordering::Relaxed);
    }

    /// Adds `delta` bytes to the dictionaries' account.
    pub fn change_dictionaries(&self, delta: i64) {
        self.dictionaries.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Charge {
        Charge {
            compressed_pages: self.compressed_pages.load(Ordering::Relaxed),
            hot_pages: self.hot_pages.load(Ordering::Relaxed),
            write_buffers: self.write_buffers.load(Ordering::Relaxed),
            mediums: self.mediums.load(Ordering::Relaxed),
            access_tables: self.access_tables.load(Ordering::Relaxed),
            index: self.index.load(Ordering::Relaxed),
            dictionaries: self.dictionaries.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_size_models_malloc_chunks() {
        assert_eq!(alloc_size(0), 0);
        assert_eq!(alloc_size(1), 32);
        assert_eq!(alloc_size(24), 32);
        assert_eq!(alloc_size(25), 48);
        assert_eq!(alloc_size(4096), 4112);
    }

    #[test]
    fn changes_add_up() {
        let m = Memory::default();
        let a = Charge {
            compressed_pages: 100,
            index: 10,
            ..Charge::default()
        };
        let b = Charge {
            hot_pages: 4096,
            index: 10,
            ..Charge::default()
        };
        m.change(&Charge::default(), &a);
        m.change(&a, &b);
        assert_eq!(m.snapshot(), b);
        m.change(&b, &Charge::default());
        assert_eq!(m.snapshot().total(), 0);
    }
}
