//! Keeps the process's resident memory within a limit (setting `rss_limit`), by
//! withholding part of `dram_capacity` from the cache while RSS is above it.
//!
//! The engine charges every byte it allocates (`memory.rs`), but the allocator holds more
//! than that: blocks rounded up to its size classes, and, above all, half-empty pages of
//! size classes the workload has moved away from. When a churn of overwrites with other
//! sizes shrinks the leaf pages and grows the medium blobs, the pages of the old classes
//! stay resident around their surviving blocks while the new classes take fresh ones:
//! measured through `zipcache serve` (docs/RESULTS.md, "RSS within budget"), RSS went from
//! 85 MiB to 130 MiB while the engine's own count stayed at 63 MiB. No model of the
//! allocator predicts that, so the governor measures it: every tick it reads RSS and, if
//! it is above the limit, withholds the excess from the budget, so the cache evicts and
//! the allocator reuses the freed blocks instead of taking new pages; when RSS is well
//! below the limit it gives the budget back, a little per tick. A cache may forget.
//!
//! What an eviction frees does not show in RSS at once: the freed blocks lie scattered
//! over pages that stay resident until later writes reuse them or a defrag pass (every
//! second, `dram/defrag.rs`) empties them. A governor that withheld more at every tick
//! RSS stood over its target wound up: filling 64 MiB with sessions it withheld 22 MiB
//! within a second while RSS fell 5 MiB, and the cache held a third fewer of them
//! (docs/RESULTS.md, Y1) — and so it did while RSS still crept up, as the evictions'
//! own churn grows the fragmentation for a while. So once it has withheld, it withholds
//! more only once [`SETTLE_TICKS`] have passed with RSS still over the target.
//!
//! Off unless set: an engine embedded in another program shares its RSS with it.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

/// RSS is steered to this far below the limit, so that it stays under it between ticks.
const MARGIN: i64 = 2 << 20;
/// Budget given back per tick while RSS is more than two margins below the limit.
const RELEASE_PER_TICK: i64 = 256 << 10;
/// Ticks a withholding is given to show in RSS (see the module doc): a defrag period.
const SETTLE_TICKS: u32 = 10;

#[derive(Debug)]
pub struct RssGovernor {
    limit: i64,
    /// Most the governor withholds: it never starves the cache below half its budget.
    max_reserve: i64,
    reserve: AtomicI64,
    /// Ticks since the reserve was last raised.
    since_raise: AtomicU32,
}

impl RssGovernor {
    pub fn new(limit: u64, dram_capacity: u64) -> RssGovernor {
        RssGovernor {
            limit: limit as i64,
            max_reserve: dram_capacity as i64 / 2,
            reserve: AtomicI64::new(0),
            since_raise: AtomicU32::new(0),
        }
    }

    /// Bytes of `dram_capacity` withheld from the cache now.
    pub fn reserve(&self) -> i64 {
        self.reserve.load(Ordering::Relaxed)
    }

    /// One control step on a measurement of RSS; returns the new reserve. Withholds half
    /// the excess over the target at once, more only as the module says (evictions turn
    /// into freed pages with some lag), gives back slowly. One caller: the housekeeper.
    pub fn step(&self, rss: u64) -> i64 {
        let target = self.limit - MARGIN;
        let rss = rss as i64;
        let excess = rss - target;
        let reserve = self.reserve();
        let since_raise = self.since_raise.load(Ordering::Relaxed).saturating_add(1);
        self.since_raise.store(since_raise, Ordering::Relaxed);
        let settled = reserve == 0 || since_raise >= SETTLE_TICKS;
        let next = if excess > 0 && settled {
            self.since_raise.store(0, Ordering::Relaxed);
            (reserve + (excess + 1) / 2).min(self.max_reserve)
        } else if excess > 0 {
            reserve
        } else if excess < -MARGIN {
            (reserve - RELEASE_PER_TICK).max(0)
        } else {
            reserve
        };
        self.reserve.store(next, Ordering::Relaxed);
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn withholds_the_excess_and_gives_it_back_slowly() {
        let g = RssGovernor::new(91 * MIB, 64 * MIB);
        // Under the target: nothing withheld.
        assert_eq!(g.step(80 * MIB), 0);
        // 11 MiB over the target (89 MiB): half of it at once, then more once a raise
        // has had its ticks to show.
        assert_eq!(g.step(100 * MIB), (11 * MIB / 2) as i64);
        for _ in 1..SETTLE_TICKS {
            assert_eq!(g.step(100 * MIB), (11 * MIB / 2) as i64);
        }
        assert_eq!(g.step(100 * MIB), (11 * MIB) as i64);
        // Between target - margin and target: held.
        assert_eq!(g.step(88 * MIB), (11 * MIB) as i64);
        // Well below: given back a tick at a time, never below zero.
        let ticks = (11 * MIB as i64) / RELEASE_PER_TICK;
        for _ in 0..ticks {
            g.step(70 * MIB);
        }
        assert_eq!(g.reserve(), 0);
        assert_eq!(g.step(70 * MIB), 0);
    }

    /// RSS over the target after a raise is mostly the evictions' freed blocks not yet
    /// reused, not a reason to withhold more at every tick (it wound up to a third of the
    /// budget in a second): only RSS still over the target `SETTLE_TICKS` after the last
    /// raise raises the reserve again, however it moved meanwhile.
    #[test]
    fn withholds_more_only_once_a_raise_has_had_its_ticks() {
        let g = RssGovernor::new(91 * MIB, 64 * MIB);
        assert_eq!(g.step(93 * MIB), (2 * MIB) as i64);
        for rss in [93, 94, 95, 96, 97, 97, 98, 99, 99] {
            assert_eq!(g.step(rss * MIB), (2 * MIB) as i64, "RSS at {rss} MiB");
        }
        assert_eq!(
            g.step(99 * MIB),
            (7 * MIB) as i64,
            "over a defrag period on"
        );
        assert_eq!(g.step(101 * MIB), (7 * MIB) as i64);
    }

    #[test]
    fn never_withholds_more_than_half_the_budget() {
        let g = RssGovernor::new(91 * MIB, 64 * MIB);
        for _ in 0..100 {
            g.step(500 * MIB);
        }
        assert_eq!(g.reserve(), (32 * MIB) as i64);
    }

    /// An engine whose process is always over its `rss_limit` gives up half its budget,
    /// evicts down to it without a write to prompt it, and still answers only what was
    /// stored.
    #[test]
    fn an_engine_over_its_rss_limit_holds_half_its_budget() {
        let cache = crate::ZipCache::open(crate::Config {
            dram_capacity: 8 * MIB,
            rss_limit: 1,
            ..crate::Config::default()
        })
        .unwrap();
        let value = |i: u32| format!("value {i:08} {}", "x".repeat(40)).into_bytes();
        for i in 0..200_000u32 {
            cache
                .put(format!("{i:012}").as_bytes(), &value(i), None)
                .unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let stats = loop {
            let stats = cache.stats();
            if stats.dram_withheld_bytes == 4 * MIB && stats.dram_used <= 4 * MIB
                || std::time::Instant::now() > deadline
            {
                break stats;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert_eq!(stats.dram_withheld_bytes, 4 * MIB);
        assert!(stats.dram_used <= 4 * MIB, "{stats:?}");
        let mut found = 0;
        for i in 0..200_000u32 {
            if let Some(v) = cache.get(format!("{i:012}").as_bytes()).unwrap() {
                assert_eq!(v, value(i));
                found += 1;
            }
        }
        assert!(found > 10_000, "{found}");
    }
}
