//! The per-LBA physical sizes of a [`CompressingDevice`](super::CompressingDevice) and the
//! totals derived from them.

use std::ops::Range;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use crate::BLOCK_SIZE;

/// What NAND holds for an incompressible block: the drive stores it raw rather than grow it
/// by zlib's framing, so no block ever costs more than the host wrote.
pub(super) const RAW_BLOCK: u16 = BLOCK_SIZE as u16;

/// Per-LBA physical sizes and the totals derived from them, shared by the controllers and
/// the device. Each LBA is only ever updated by one controller (LBAs are sharded), so
/// relaxed atomics suffice; `drain`'s channel round trip orders them for readers.
pub(super) struct Accounting {
    /// Bytes on NAND per LBA; 0 = unmapped (never written or trimmed). Two bytes per 4 KiB
    /// keeps the table at 1/2048 of the logical space (4 MiB for 8 GiB).
    pub(super) sizes: Box<[AtomicU16]>,
    pub(super) physical_used: AtomicU64,
    pub(super) nand_bytes_written: AtomicU64,
}

impl Accounting {
    pub(super) fn new(block_count: u64) -> Self {
        Self {
            sizes: (0..block_count).map(|_| AtomicU16::new(0)).collect(),
            physical_used: AtomicU64::new(0),
            nand_bytes_written: AtomicU64::new(0),
        }
    }

    pub(super) fn record_write(&self, lba: u64, size: u16) {
        let Some(slot) = self.sizes.get(lba as usize) else {
            return;
        };
        let old = slot.swap(size, Ordering::Relaxed);
        // Add before subtracting so a concurrent reader never sees a wrapped-around total.
        self.physical_used
            .fetch_add(u64::from(size), Ordering::Relaxed);
        self.physical_used
            .fetch_sub(u64::from(old), Ordering::Relaxed);
        self.nand_bytes_written
            .fetch_add(u64::from(size), Ordering::Relaxed);
    }

    /// Unmaps the LBAs of `lbas` that are `shard` modulo `shards`.
    pub(super) fn record_trim(&self, lbas: Range<u64>, shard: u64, shards: u64) {
        let end = lbas.end.min(self.sizes.len() as u64);
        let first = lbas.start + (shard + shards - lbas.start % shards) % shards;
        let mut freed = 0;
        for lba in (first..end).step_by(shards as usize) {
            freed += u64::from(self.sizes[lba as usize].swap(0, Ordering::Relaxed));
        }
        self.physical_used.fetch_sub(freed, Ordering::Relaxed);
    }
}
