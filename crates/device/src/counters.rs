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
    /// Reads and writes handed to the medium and not yet completed.
    in_flight: AtomicU64,
}

/// Counts `n` I/Os as in flight until dropped.
pub(crate) struct InFlight<'a> {
    counters: &'a IoCounters,
    n: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counters.in_flight.fetch_sub(self.n, Relaxed);
    }
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

    /// `n` I/Os start; they end when the guard goes.
    pub(crate) fn in_flight(&self, n: usize) -> InFlight<'_> {
        self.submitted(n);
        InFlight {
            counters: self,
            n: n as u64,
        }
    }

    /// `n` I/Os start whose ends are counted by `completed` (reads on a thread ring,
    /// which outlive the call that submitted them).
    pub(crate) fn submitted(&self, n: usize) {
        self.in_flight.fetch_add(n as u64, Relaxed);
    }

    pub(crate) fn completed(&self, n: usize) {
        self.in_flight.fetch_sub(n as u64, Relaxed);
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
            in_flight: self.in_flight.load(Relaxed),
            ..DeviceStats::default()
        }
    }
}
