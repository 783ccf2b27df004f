//! Pelikan's Segcache (crate `segcache`), in-process, DRAM only.

use std::sync::Arc;
use std::time::Duration;

use segcache::{Policy, Segcache, Value};

use super::{Budget, Client, Engine, EngineClient, Holdings, InProcessGets, Snapshot, Target};
use crate::procfs;

/// Segment size: Pelikan's default for its segcache server.
const SEGMENT_SIZE: i32 = 1 << 20;

pub struct SegTarget {
    cache: Arc<SegEngine>,
    heap: u64,
    batch: usize,
    /// Whether this process's RSS is this target's (see `procfs::claim_own_rss`).
    own_rss: bool,
}

struct SegEngine(Segcache);

/// Hash power whose table holds twice `items` (`7 · 2^(N-3)` items): keys hash unevenly
/// and a full bucket chain fails the insert.
fn hash_power_for(items: u64) -> u8 {
    let buckets = (2 * items).div_ceil(7).max(16);
    (3 + buckets.next_power_of_two().ilog2()).clamp(7, 32) as u8
}

impl SegTarget {
    pub fn open(budget: &Budget) -> Result<SegTarget, String> {
        if budget.ssd.is_some() {
            eprintln!("segcache: DRAM-only engine, the SSD budget is not used");
        }
        // Segcache holds items in a heap of segments (the DRAM budget); its hash table is
        // sized for the most items that heap can hold and, like memcached's, sits outside it.
        let max_items = budget.dram / budget.mean_object.max(1) as u64;
        // The heap is whole segments: the budget rounded down, at least two.
        let segment = SEGMENT_SIZE as u64;
        let heap = (budget.dram / segment).max(2) * segment;
        let cache = Segcache::builder()
            .heap_size(heap as usize)
            .segment_size(SEGMENT_SIZE)
            .hash_power(hash_power_for(max_items))
            .overflow_factor(1.0)
            .eviction(Policy::Fifo)
            .build()
            .map_err(|e| format!("segcache: {e}"))?;
        Ok(SegTarget {
            cache: Arc::new(SegEngine(cache)),
            heap,
            batch: budget.batch(),
            own_rss: procfs::claim_own_rss(),
        })
    }
}

impl Engine for SegEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        Ok(self.0.get(key).map(|item| match item.value() {
            Value::Bytes(bytes) => bytes.to_vec(),
            Value::U64(n) => n.to_string().into_bytes(),
        }))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
        self.0
            .insert(key, value, None, Duration::ZERO)
            .map_err(|e| format!("segcache insert: {e:?}"))
    }

    fn delete(&self, key: &[u8]) -> Result<bool, String> {
        Ok(self.0.delete(key))
    }
}

impl Target for SegTarget {
    fn name(&self) -> &str {
        "segcache"
    }

    fn client(&self) -> Result<Box<dyn Client>, String> {
        Ok(Box::new(EngineClient {
            engine: self.cache.clone(),
            batch: self.batch,
            // A DRAM-only engine without an asynchronous GET: nothing to overlap.
            gets: InProcessGets::Serial,
            streams: 1,
        }))
    }

    fn snapshot(&self) -> Result<Snapshot, String> {
        Ok(Snapshot {
            // The heap is allocated whole up front; segcache reports no finer figure.
            held: Holdings {
                dram_bytes_used: Some(self.heap),
                rss_bytes: procfs::own_rss(self.own_rss),
                ..Holdings::default()
            },
            ..Snapshot::default()
        })
    }

    fn dram_only(&self) -> bool {
        true
    }

    fn probe_resident(&self) -> bool {
        true
    }

    fn close(self: Box<Self>) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_table_fits_the_items() {
        for items in [1u64, 1000, 1_000_000, 3_000_000] {
            let power = hash_power_for(items);
            assert!(7 * (1u64 << (power - 3)) >= items, "{items}: {power}");
        }
    }
}
