//! The DRAM budget (`dram_capacity`, less what the RSS governor withholds) and making
//! room in it: back-pressure on the writers' threads (`relieve_pressure`; a GET's
//! promotion only wakes the flusher, `wake_flusher_if_over_budget`), and eviction
//! down to a target (`make_room`), run by the flusher or, DRAM-only, by writers,
//! `set_dram_capacity` and the RSS governor's tick.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Inner, ZipCache};
use crate::config::{MAX_DRAM_CAPACITY, MIN_DRAM_CAPACITY};
use crate::eviction::EvictionSink;
use crate::{Error, Result};

/// Promotions may take DRAM 1/32 of its budget beyond it, and no further: a margin the
/// flusher's wake-up leaves room for (a burst of GETs between two of its passes is not
/// turned away), within the 5 % that the default `rss_limit` allows beyond
/// `dram_capacity`. Each GET thread may add one object beyond it, as the check and the
/// insert are not one step.
const PROMOTION_HEADROOM: i64 = 32;

impl ZipCache {
    /// Changes `dram_capacity` while running (memcached's `cache_memlimit`). Lowered, the
    /// cache evicts down to it before this returns when DRAM-only; with an SSD tier the
    /// flusher moves the excess down to the SSD, as it does for any write. Raised, the
    /// cache may grow into it at once. The RSS governor keeps its `rss_limit`, and the
    /// structures sized at open (the hot sub-tier's share, the frequency sketch, the
    /// promotion filter) keep their sizes.
    pub fn set_dram_capacity(&self, bytes: u64) -> Result<()> {
        if bytes < MIN_DRAM_CAPACITY {
            return Err(Error::Config(format!(
                "dram_capacity {bytes} is below {MIN_DRAM_CAPACITY} bytes"
            )));
        }
        if bytes > MAX_DRAM_CAPACITY {
            return Err(Error::Config(format!(
                "dram_capacity {bytes} is above {MAX_DRAM_CAPACITY} bytes (1 PiB)"
            )));
        }
        let inner = &self.inner;
        {
            let _between_steps = inner.eviction_step.lock();
            inner.capacity.store(bytes, Ordering::Relaxed);
        }
        if inner.ssd.is_none() {
            inner.make_room(|| inner.budget(), usize::MAX);
        } else {
            inner.wake_flusher();
        }
        Ok(())
    }
}

impl Inner {
    fn sink(&self) -> Option<&dyn EvictionSink> {
        self.ssd.as_ref().map(|ssd| ssd as &dyn EvictionSink)
    }

    /// Memory back-pressure on the writers (PUT, DELETE, `update`), which never does
    /// device I/O: in DRAM-only mode eviction is a drop anyway; with an SSD
    /// tier, the background flusher writes victims down and this waits for it, at most
    /// `flush_wait_ms`, then drops cold leaves unwritten until DRAM is back in budget
    /// (`DramTier::drop_one`, `ssd_write_drops`): a cache may forget.
    pub(super) fn relieve_pressure(&self) {
        let capacity = self.budget();
        let over = || self.memory.snapshot().total() > capacity;
        if !over() {
            return;
        }
        if self.ssd.is_none() {
            self.make_room(|| self.budget(), 64);
            return;
        }
        self.wake_flusher();
        let deadline = Instant::now() + Duration::from_millis(self.config.flush_wait_ms);
        self.flusher_waiting.fetch_add(1, Ordering::Relaxed);
        let mut waiting = self.flushed.0.lock();
        // Not behind a flusher that has nothing left to evict (the rest is index).
        while over() && !self.flusher_stuck.load(Ordering::Acquire) {
            if self
                .flushed
                .1
                .wait_until(&mut waiting, deadline)
                .timed_out()
            {
                break;
            }
        }
        drop(waiting);
        self.flusher_waiting.fetch_sub(1, Ordering::Relaxed);
        let now = self.now();
        for _ in 0..64 {
            if !over() || !self.dram.drop_one(now) {
                return;
            }
        }
    }

    /// A GET's promotion never waits for the flusher (`relieve_pressure` would hold a
    /// server's runtime thread for up to `flush_wait_ms`): over the budget it wakes the
    /// flusher and goes on.
    pub(super) fn wake_flusher_if_over_budget(&self) {
        if self.memory.snapshot().total() > self.budget() {
            self.wake_flusher();
        }
    }

    /// Whether a GET may copy an SSD hit into DRAM: while DRAM is within the budget plus
    /// 1/[`PROMOTION_HEADROOM`] of it. Beyond that the flusher is behind (it is woken as
    /// soon as DRAM passes the budget, and evicts down to 98.5 % of it), and the hit
    /// stays on the SSD rather than push DRAM further.
    pub(super) fn room_for_promotion(&self) -> bool {
        let budget = self.budget();
        self.memory.snapshot().total() <= budget + budget / PROMOTION_HEADROOM
    }

    pub(super) fn wake_flusher(&self) {
        // Under the flusher's lock: it checks for work and sleeps under it, so the wake-up
        // cannot fall between the two.
        let _flusher = self.flush_wake.0.lock();
        self.flush_wake.1.notify_one();
    }

    /// Evicts until DRAM use is at most `target`, at most `attempts` times; false if it
    /// is still above (nothing left to evict). DRAM leaves go first; when they free
    /// nothing while the lower tiers' indexes hold more than 1/8 of the budget, or those
    /// indexes take more than half of it, the SSD tier gives up a super-leaf and BT_LO its
    /// oldest extent: their descriptors live in DRAM too. With `evictions` off, nothing.
    /// `target` is asked again at every step, under `eviction_step`: `set_dram_capacity`
    /// may raise the budget while the flusher is part way down to the old one, and what
    /// it evicted past the new one would be lost for nothing.
    pub(super) fn make_room(&self, target: impl Fn() -> i64, attempts: usize) -> bool {
        /// DRAM evictions in a row that free nothing before the indexes are shrunk.
        const FUTILE: usize = 8;
        let used = || self.memory.snapshot().total();
        if !self.config.evictions {
            return used() <= target();
        }
        let mut futile_runs = 0;
        for _ in 0..attempts {
            let _step = self.eviction_step.lock();
            let before = used();
            if before <= target() || self.shutdown.load(Ordering::Relaxed) {
                return true;
            }
            let index = self.lower_index_bytes();
            let index_heavy = index > self.capacity() / 2;
            // Evictions that seem to free nothing point at the index only when it is a
            // real share of DRAM: writers running beside the flusher refill what it frees,
            // and giving up super-leaves for that would throw away the SSD's objects.
            let futile = futile_runs >= FUTILE && index > self.capacity() / 8;
            if !index_heavy && !futile && self.dram.evict_one(self.sink(), self.now()) {
                futile_runs = if used() < before { 0 } else { futile_runs + 1 };
            } else if !self.shrink_lower_index() {
                return false;
            }
            // Writers held back by `relieve_pressure` may go on as soon as there is room.
            self.flushed.1.notify_all();
        }
        used() <= target()
    }

    pub(super) fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// What the cache may hold now: `dram_capacity`, less what the RSS governor withholds
    /// (never more than half of it, even after `set_dram_capacity` lowered it).
    pub(crate) fn budget(&self) -> i64 {
        let capacity = self.capacity() as i64;
        let withheld = self.governor.as_ref().map_or(0, |g| g.reserve());
        capacity - withheld.min(capacity / 2)
    }

    /// The RSS governor's tick: measure, re-set the budget and, DRAM-only (where only
    /// writers evict), evict down to it so a quiet server gives memory back too.
    pub(super) fn govern_rss(&self) {
        let Some(governor) = &self.governor else {
            return;
        };
        let Some(rss) = crate::stats::rss_bytes(std::process::id()) else {
            return;
        };
        governor.step(rss);
        if self.ssd.is_none() {
            self.make_room(|| self.budget(), 1024);
        }
    }

    /// DRAM held by the BT_SSD and BT_LO indexes.
    fn lower_index_bytes(&self) -> u64 {
        self.ssd.as_ref().map_or(0, |ssd| ssd.index_bytes())
            + self.large.as_ref().map_or(0, |lo| lo.index_bytes())
    }

    /// Makes BT_SSD smaller by its coldest super-leaf or, with none to give, BT_LO by its
    /// oldest large object; false if neither has anything to give.
    fn shrink_lower_index(&self) -> bool {
        self.ssd.as_ref().is_some_and(|ssd| ssd.give_up_one())
            || self.large.as_ref().is_some_and(|lo| lo.drop_oldest_one())
    }
}
