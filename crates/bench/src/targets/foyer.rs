//! foyer (crate `foyer`), in-process: its hybrid cache with a disk tier compressed as the
//! target's name says (`foyer` LZ4, `foyer-zstd`, `foyer-none`), or its in-memory cache
//! alone with `--ssd none`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use foyer::{
    BlockEngineConfig, Cache, CacheBuilder, Compression, DeviceBuilder, FsDeviceBuilder,
    HybridCache, HybridCacheBuilder, HybridCacheEntry, Source,
};
use futures_util::future::join_all;
use tokio::runtime::Runtime;

use super::{Budget, Client, Engine, EngineClient, Holdings, Reply, Snapshot, Target};
use crate::procfs;

type Bytes = Vec<u8>;

enum Tiers {
    Hybrid(HybridCache<Bytes, Bytes>),
    Memory(Cache<Bytes, Bytes>),
}

struct FoyerEngine {
    tiers: Tiers,
    /// foyer's disk tier runs on tokio; the bench threads enter this runtime per call.
    runtime: Runtime,
    dram_hits: AtomicU64,
    ssd_hits: AtomicU64,
}

pub struct FoyerTarget {
    name: &'static str,
    /// What each bench thread's client is a copy of.
    clients: EngineClient<FoyerEngine>,
    /// Whether this process's RSS is this target's (see `procfs::claim_own_rss`).
    own_rss: bool,
}

/// foyer charges an entry `key + value` bytes against its memory capacity.
fn weight(key: &Bytes, value: &Bytes) -> usize {
    key.len() + value.len()
}

/// Disk block (foyer's unit of reclaim): its 16 MiB default, smaller for small disks so a
/// disk holds enough blocks to reclaim one at a time.
fn block_size(disk: u64) -> usize {
    (disk / 64)
        .clamp(1 << 20, 16 << 20)
        .next_power_of_two()
        .min(16 << 20) as usize
}

/// The foyer targets and how each compresses entries on its disk tier: `foyer` is LZ4 (the
/// peer as first measured), the others foyer's remaining `Compression` settings, so a
/// density comparison can be made against foyer's best.
pub const VARIANTS: &[(&str, Compression)] = &[
    ("foyer", Compression::Lz4),
    ("foyer-zstd", Compression::Zstd),
    ("foyer-none", Compression::None),
];

impl FoyerTarget {
    /// Opens the foyer target `name`, one of [`VARIANTS`].
    pub fn open(name: &str, budget: &Budget) -> Result<FoyerTarget, String> {
        let &(name, compression) = VARIANTS
            .iter()
            .find(|(variant, _)| *variant == name)
            .ok_or_else(|| format!("no foyer target {name:?}"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("foyer: tokio runtime: {e}"))?;
        let dram = budget.dram as usize;
        let tiers = match budget.ssd {
            None => Tiers::Memory(CacheBuilder::new(dram).with_weighter(weight).build()),
            Some(disk) => {
                let dir = budget.data_dir.join("foyer");
                std::fs::create_dir_all(&dir).map_err(|e| format!("foyer: {e}"))?;
                let device = FsDeviceBuilder::new(&dir)
                    .with_capacity(disk as usize)
                    .with_direct(true)
                    .build()
                    .map_err(|e| format!("foyer device: {e}"))?;
                let build = HybridCacheBuilder::new()
                    .with_name("bench")
                    .memory(dram)
                    .with_weighter(weight)
                    .storage()
                    .with_engine_config(
                        BlockEngineConfig::new(device).with_block_size(block_size(disk)),
                    )
                    .with_compression(compression)
                    .build();
                Tiers::Hybrid(
                    runtime
                        .block_on(build)
                        .map_err(|e| format!("foyer hybrid: {e}"))?,
                )
            }
        };
        Ok(FoyerTarget {
            name,
            clients: EngineClient::of(
                Arc::new(FoyerEngine {
                    tiers,
                    runtime,
                    dram_hits: AtomicU64::new(0),
                    ssd_hits: AtomicU64::new(0),
                }),
                budget,
            ),
            own_rss: procfs::claim_own_rss(),
        })
    }
}

impl FoyerEngine {
    /// A hybrid GET's answer, counted as a DRAM or a disk hit.
    fn counted(&self, entry: Option<HybridCacheEntry<Bytes, Bytes>>) -> Option<Vec<u8>> {
        let entry = entry?;
        let counter = match entry.source() {
            Source::Disk => &self.ssd_hits,
            _ => &self.dram_hits,
        };
        counter.fetch_add(1, Relaxed);
        Some(entry.value().clone())
    }
}

impl Engine for FoyerEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        match &self.tiers {
            Tiers::Memory(cache) => {
                let value = cache.get(key).map(|entry| entry.value().clone());
                if value.is_some() {
                    self.dram_hits.fetch_add(1, Relaxed);
                }
                Ok(value)
            }
            Tiers::Hybrid(cache) => {
                let entry = self
                    .runtime
                    .block_on(cache.get(key))
                    .map_err(|e| e.to_string())?;
                Ok(self.counted(entry))
            }
        }
    }

    /// foyer's GETs are futures on its tokio runtime: awaited together, every disk read of
    /// the batch is in flight at once (foyer's I/O engine runs them), as through a server.
    fn get_overlapped(&self, keys: &[&[u8]], start: Instant, replies: &mut Vec<(Reply, Duration)>) {
        let Tiers::Hybrid(cache) = &self.tiers else {
            // In memory only every GET answers at once: nothing to overlap.
            for key in keys {
                let reply = self.get(key).map_or_else(Reply::Error, Reply::Value);
                replies.push((reply, start.elapsed()));
            }
            return;
        };
        let gets = keys.iter().map(|key| async move {
            let answer = cache.get(*key).await;
            (answer, start.elapsed())
        });
        for (answer, latency) in self.runtime.block_on(join_all(gets)) {
            let reply = match answer {
                Ok(entry) => Reply::Value(self.counted(entry)),
                Err(e) => Reply::Error(e.to_string()),
            };
            replies.push((reply, latency));
        }
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
        match &self.tiers {
            Tiers::Memory(cache) => drop(cache.insert(key.to_vec(), value.to_vec())),
            Tiers::Hybrid(cache) => {
                // Inserting may hand an evicted entry to the disk writer, a tokio task.
                let _runtime = self.runtime.enter();
                drop(cache.insert(key.to_vec(), value.to_vec()));
            }
        }
        Ok(())
    }

    fn delete(&self, key: &[u8]) -> Result<bool, String> {
        match &self.tiers {
            Tiers::Memory(cache) => Ok(cache.remove(key).is_some()),
            Tiers::Hybrid(cache) => {
                let _runtime = self.runtime.enter();
                // foyer's hybrid remove does not say whether the key was there.
                let was_cached = cache.contains(key);
                cache.remove(key);
                Ok(was_cached)
            }
        }
    }
}

impl Target for FoyerTarget {
    fn name(&self) -> &str {
        self.name
    }

    fn client(&self) -> Result<Box<dyn Client>, String> {
        Ok(Box::new(self.clients.clone()))
    }

    fn snapshot(&self) -> Result<Snapshot, String> {
        let engine = &self.clients.engine;
        let (usage, written) = match &engine.tiers {
            Tiers::Memory(cache) => (cache.usage(), None),
            Tiers::Hybrid(cache) => (
                cache.memory().usage(),
                Some(cache.statistics().disk_write_bytes() as u64),
            ),
        };
        Ok(Snapshot {
            dram_hits: Some(engine.dram_hits.load(Relaxed)),
            ssd_hits: Some(engine.ssd_hits.load(Relaxed)),
            host_bytes_written: written,
            held: Holdings {
                dram_bytes_used: Some(usage as u64),
                rss_bytes: procfs::own_rss(self.own_rss),
                ..Holdings::default()
            },
            ..Snapshot::default()
        })
    }

    fn dram_only(&self) -> bool {
        matches!(self.clients.engine.tiers, Tiers::Memory(_))
    }

    fn probe_resident(&self) -> bool {
        true
    }

    fn close(self: Box<Self>) -> Result<(), String> {
        if let Tiers::Hybrid(cache) = &self.clients.engine.tiers {
            self.clients
                .engine
                .runtime
                .block_on(cache.close())
                .map_err(|e| format!("foyer close: {e}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use indicatif::ProgressBar;

    use super::*;
    use crate::targets::InProcessGets;
    use crate::targets::test_support::{
        TempDir, budget, check_ordered_batches, fill, lookaside_workload, read_filled,
    };

    const KEYS: u64 = 20_000;

    #[test]
    fn overlapped_batches_read_the_disk_and_reply_in_order() {
        let dir = TempDir::new("foyer-overlapped");
        let target = FoyerTarget::open("foyer", &budget(&dir, InProcessGets::Overlapped, &[]))
            .expect("open");
        let mut client = target.client().expect("client");
        fill(client.as_mut(), KEYS);
        // foyer writes evicted entries to its disk in the background, so on a busy machine
        // reads right after the fill may find none there yet: read the filled keys (no
        // writes, so the batch check below still starts from version 0 everywhere) until
        // one is read from the disk, within a bound.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while target.clients.engine.ssd_hits.load(Relaxed) == 0
            && std::time::Instant::now() < deadline
        {
            read_filled(client.as_mut(), KEYS);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        // Overwrites only: foyer's delete leaves an entry still queued for its disk
        // readable (`Store::delete` does not touch the keeper), whichever way GETs run.
        let checked = check_ordered_batches(client.as_mut(), KEYS, 40, false);
        let (dram_hits, disk_hits) = (
            target.clients.engine.dram_hits.load(Relaxed),
            target.clients.engine.ssd_hits.load(Relaxed),
        );
        assert!(checked.found > 0, "{checked:?}");
        assert!(
            disk_hits > 0,
            "{checked:?}, {dram_hits} DRAM hits, no disk hit"
        );
        drop(client);
        Box::new(target).close().expect("close");
    }

    #[test]
    fn lookaside_over_the_disk_verifies_every_value_in_every_compression() {
        for &(name, _) in VARIANTS {
            let dir = TempDir::new(&format!("{name}-lookaside"));
            let target = FoyerTarget::open(name, &budget(&dir, InProcessGets::Overlapped, &[]))
                .expect("open");
            assert_eq!(target.name(), name);
            let w = lookaside_workload(KEYS, 20_000);
            let run = crate::driver::lookaside(&target, &w, &ProgressBar::hidden()).expect("run");
            let counts = &run.counts;
            assert_eq!(counts.wrong_values, 0, "{name}: {counts:?}");
            assert_eq!(counts.errors, 0, "{name}: {:?}", counts.first_error);
            assert_eq!(counts.gets, 20_000);
            assert!(counts.hits > 0 && counts.misses > 0, "{name}: {counts:?}");
            assert!(
                target.clients.engine.ssd_hits.load(Relaxed) > 0,
                "{name}: some GETs read the disk"
            );
            Box::new(target).close().expect("close");
        }
    }

    #[test]
    fn an_unknown_variant_is_refused() {
        let dir = TempDir::new("foyer-unknown");
        let refused =
            FoyerTarget::open("foyer-gzip", &budget(&dir, InProcessGets::Overlapped, &[]));
        assert!(refused.is_err());
    }

    #[test]
    fn block_size_fits_small_and_large_disks() {
        assert_eq!(block_size(64 << 20), 1 << 20);
        assert_eq!(block_size(1 << 30), 16 << 20);
        assert_eq!(block_size(100 << 30), 16 << 20);
    }
}
