//! The background threads' loops: the merge threads (`zipcache-bg-<i>`: write-buffer
//! merges; the first also frees retired leaves and runs the bypass pass, the RSS
//! governor's tick and the crash journal's heal) and the flusher (`zipcache-flusher`: eviction down to the low
//! watermark, the only thread that writes evicted objects to the SSD).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Inner;

/// Background eviction keeps DRAM below this fraction of the budget, so foreground
/// writers rarely have to evict themselves.
const LOW_WATERMARK: f64 = 0.985;
/// How often the bypass pass re-ranks leaves.
const BYPASS_PERIOD: Duration = Duration::from_millis(100);
/// How often the RSS governor (setting `rss_limit`) measures: RSS moves by at most a few
/// MiB in that time, which its margin absorbs.
const RSS_PERIOD: Duration = Duration::from_millis(100);
/// How often the housekeeper moves blocks out of sparse allocator pages (with an
/// `rss_limit`, where RSS is the figure that counts): a pass over every leaf, write-locking
/// only those with a block to move.
const DEFRAG_PERIOD: Duration = Duration::from_secs(1);
/// How long a merge thread sleeps between rounds while writers keep queueing leaves (a
/// full buffer waits about this long for its merge), and when nothing was queued.
const MERGE_PERIOD_BUSY: Duration = Duration::from_millis(1);
const MERGE_PERIOD_IDLE: Duration = Duration::from_millis(10);
/// How often the housekeeper looks whether an overflowed shadow table can heal
/// (`heal_shadow`); each walk that found no room for every mark doubles the wait, up to
/// [`HEAL_PERIOD_MAX`].
const HEAL_PERIOD: Duration = Duration::from_secs(1);
const HEAL_PERIOD_MAX: Duration = Duration::from_secs(32);
/// Merges between two looks at the housekeeping clocks.
const MERGES_PER_ROUND: usize = 256;

impl Inner {
    /// A merge thread: write-buffer merges; the first one also re-ranks hot leaves.
    pub(super) fn background(&self, housekeeper: bool) {
        let mut last_bypass = Instant::now();
        let mut last_rss = Instant::now();
        let mut last_defrag = Instant::now();
        let mut last_heal = Instant::now();
        let mut heal_period = HEAL_PERIOD;
        while !self.shutdown.load(Ordering::Acquire) {
            let mut merged = 0;
            while merged < MERGES_PER_ROUND
                && let Some(leaf) = self.dram.merge_queue.pop()
            {
                self.dram.merge(&leaf, self.now());
                merged += 1;
            }
            if housekeeper && last_bypass.elapsed() >= BYPASS_PERIOD {
                last_bypass = Instant::now();
                self.dram.free_retired_leaves();
                self.dram.bypass_pass(self.budget());
                self.dram.shrink_idle_buffers();
            }
            if housekeeper && last_rss.elapsed() >= RSS_PERIOD {
                last_rss = Instant::now();
                self.govern_rss();
            }
            if housekeeper && self.governor.is_some() && last_defrag.elapsed() >= DEFRAG_PERIOD {
                last_defrag = Instant::now();
                self.dram.defragment(crate::dram::SPARSE_PERCENT);
            }
            if housekeeper && last_heal.elapsed() >= heal_period {
                last_heal = Instant::now();
                heal_period = match self.heal_shadow() {
                    Healing::Futile => (heal_period * 2).min(HEAL_PERIOD_MAX),
                    Healing::Done => HEAL_PERIOD,
                };
            }
            let period = if merged > 0 {
                MERGE_PERIOD_BUSY
            } else {
                MERGE_PERIOD_IDLE
            };
            self.dram.merge_queue.wait(period);
        }
    }

    /// The flusher thread: keeps DRAM under the low watermark by evicting CLOCK victims to
    /// the SSD tier (the only thread that writes evicted objects to the device), and lets
    /// writers held back by `relieve_pressure` know after each pass.
    pub(super) fn flusher(&self) {
        while !self.shutdown.load(Ordering::Acquire) {
            // may do I/O: the SSD tier's read-modify-writes
            let stuck = !self.make_room(|| self.flusher_target(), usize::MAX);
            self.flusher_stuck.store(stuck, Ordering::Release);
            self.flushed.1.notify_all();
            let mut idle = self.flush_wake.0.lock();
            // Nothing to do, or nothing it can do (all that is left is index): sleep.
            if stuck || self.memory.snapshot().total() <= self.flusher_target() {
                self.flush_wake
                    .1
                    .wait_for(&mut idle, Duration::from_millis(10));
            }
        }
    }

    /// A shadow table that overflowed (a crash would restart cold) is trusted again once
    /// every key it must name is in it: while it has room, a heal begins (writes mark
    /// their keys again), DRAM's dirty keys that the SSD may hold are marked again
    /// (`DramTier::remark_dirty`), and the table heals unless a mark found no room
    /// meanwhile. How many of DRAM's dirty keys need a mark only the walk finds out, so a
    /// walk that ran out of room makes the next look wait longer.
    fn heal_shadow(&self) -> Healing {
        let Some(shadow) = &self.shadow else {
            return Healing::Done;
        };
        if !shadow.overflowed() {
            return Healing::Done;
        }
        // Within three quarters of the table: two-choice buckets fill unevenly past that.
        if shadow.len() * 4 > shadow.capacity() * 3 {
            return Healing::Futile;
        }
        let Some(watching) = shadow.begin_heal() else {
            return Healing::Futile;
        };
        let marked = self.dram.remark_dirty(self.now());
        if shadow.finish_heal(watching, marked) {
            Healing::Done
        } else {
            Healing::Futile
        }
    }

    /// The DRAM use the flusher evicts down to.
    pub(super) fn flusher_target(&self) -> i64 {
        (self.budget() as f64 * LOW_WATERMARK) as i64
    }
}

/// What a look at an overflowed shadow table did (`heal_shadow`).
enum Healing {
    /// Healed, or nothing to heal.
    Done,
    /// No room for every mark, or a mark failed during the walk.
    Futile,
}
