//! Host-side I/O counters shared by the devices that sit on a medium.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::DeviceStats;

/// Counts what the host asked for. Relaxed atomics: each counter is a statistic read on its
/// own, never used to order memory between threads.
#[derive(Debug, Default)]
pub(crate) struct IoCounters {
    host_bytes_read: AtomicU64,
    host_bytes_written: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    trims: AtomicU64,
}

impl IoCounters {
    pub(crate) fn record_read(&self, bytes: usize) {
        self.reads.fetch_add(1, Relaxed);
        self.host_bytes_read.fetch_add(bytes as u64, Relaxed);
    }

    pub(crate) fn record_write(&self, bytes: usize) {
        self.writes.fetch_add(1, Relaxed);
        self.host_bytes_written.fetch_add(bytes as u64, Relaxed);
    }

    pub(crate) fn record_trim(&self) {
        self.trims.fetch_add(1, Relaxed);
    }

    /// Stats with the host counters filled in and every physical figure unknown (0).
    pub(crate) fn snapshot(&self, logical_capacity: u64) -> DeviceStats {
        DeviceStats {
            logical_capacity,
            host_bytes_read: self.host_bytes_read.load(Relaxed),
            host_bytes_written: self.host_bytes_written.load(Relaxed),
            reads: self.reads.load(Relaxed),
            writes: self.writes.load(Relaxed),
            trims: self.trims.load(Relaxed),
            ..DeviceStats::default()
        }
    }
}
