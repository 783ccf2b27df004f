//! `ZipCache`: the public engine. It validates requests, routes them through the tiers in
//! the paper's order (§3.4), and runs the background threads (write-buffer merges,
//! eviction down to the low watermark, compression-bypass passes).
//!
//! This module holds the engine's types, its opening and closing; each job has its own
//! file: GET (`get.rs`), writes and removals (`write.rs`), SCAN (`scan.rs`), the DRAM
//! budget and making room in it (`room.rs`), the background threads (`background.rs`),
//! `stats` (`stats.rs`), where the index files live (`persist.rs`).

mod background;
mod get;
pub(crate) mod persist;
mod room;
mod scan;
mod stats;
mod write;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::counters::Counter;
use crate::io_rates::IoRates;
use zipcache_device::{BlockDevice, CompressingDevice, EmulatorOptions, FileOptions};

use crate::config::Promotion;
use crate::dram::{DramSettings, DramTier};
use crate::index_dir::DataLock;
use crate::large_objects::LargeObjects;
use crate::memory::{Memory, alloc_size};
use crate::promotion::{self, PromotionFilter};
use crate::rss_governor::RssGovernor;
use crate::run_epoch;
use crate::ssd::dictionary::{BlockDictionaries, DictionaryFiles, block_training};
use crate::ssd::{SsdSettings, SsdTier};
use crate::{Config, Error, Result};
use persist::{Persist, sibling};

/// The device's block: one SSD sub-page.
const BLOCK: usize = zipcache_device::BLOCK_SIZE;
/// Share of the SSD device given to the large-object log (BT_LO).
const LARGE_REGION: f64 = 0.125;

#[derive(Default)]
struct OpCounters {
    gets: Counter,
    dram_hits: Counter,
    large_hits: Counter,
    ssd_hits: Counter,
    promotions: Counter,
    /// SSD hits not promoted because DRAM was far over its budget (`room_for_promotion`).
    promotions_skipped: Counter,
    misses: Counter,
    expired: Counter,
    puts: Counter,
    /// Writes refused for want of room (`evictions` off).
    refused_writes: Counter,
    deletes: Counter,
    scans: Counter,
    /// GET reads of the SSD that went in flight (`get_item_async`) rather than completing
    /// on the caller's thread.
    async_ssd_reads: Counter,
    /// GETs with such a read not yet completed and taken, nor the GET dropped
    /// ([`ReadInFlight`](get::ReadInFlight)).
    ssd_reads_in_flight: AtomicU64,
}

pub(crate) struct Inner {
    config: Config,
    memory: Arc<Memory>,
    pub(crate) dram: DramTier,
    pub(crate) ssd: Option<SsdTier>,
    large: Option<LargeObjects>,
    /// Where a clean `close()` leaves the indexes for a warm restart.
    persist: Option<Persist>,
    /// The run epoch written to the device at open (`run_epoch`); 0 without a device.
    epoch: u64,
    warm_start: bool,
    /// Held while the engine lives: one engine per SSD file.
    _lock: Option<DataLock>,
    ops: OpCounters,
    shutdown: AtomicBool,
    /// With `promotion = second_hit`: which SSD hits are copied into DRAM.
    promotion: Option<PromotionFilter>,
    /// Odd while `flush_all` runs; bumped at its start and its end.
    flush_epoch: AtomicU64,
    /// One `flush_all` at a time.
    flushing: Mutex<()>,
    /// Signalled by the background threads after each eviction pass, for writers held
    /// back by memory pressure.
    flushed: (Mutex<()>, Condvar),
    /// Wakes the flusher early when a writer finds DRAM over budget.
    flush_wake: (Mutex<()>, Condvar),
    /// The flusher's last pass ended over the low watermark with nothing it could evict.
    flusher_stuck: AtomicBool,
    /// Writers in `relieve_pressure`'s wait for the flusher.
    flusher_waiting: AtomicU64,
    io_rates: IoRates,
    /// With an `rss_limit`: how much of `dram_capacity` RSS leaves the cache.
    governor: Option<RssGovernor>,
    /// The process's RSS when the engine opened (0 where /proc cannot tell), the base of
    /// `dram_fragmentation_bytes`.
    rss_at_open: u64,
    /// `dram_capacity` now: the configured one until `set_dram_capacity` changes it.
    capacity: AtomicU64,
}

/// A hybrid DRAM/SSD key-value cache. `Send + Sync`: share it between threads by `Arc`
/// or by reference.
pub struct ZipCache {
    pub(crate) inner: Arc<Inner>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl ZipCache {
    /// Opens a cache; with `config.ssd` set, its SSD tier lives in that file (O_DIRECT by
    /// default) behind the emulated transparent-compression SSD.
    pub fn open(config: Config) -> Result<ZipCache> {
        config.validate()?;
        let mut lock = None;
        let device: Option<Arc<dyn BlockDevice>> = match &config.ssd {
            None => None,
            Some(ssd) => {
                if let Some(dir) = ssd.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)?;
                }
                lock = Some(DataLock::acquire(&sibling(&ssd.path, "lock"))?);
                let file = FileOptions {
                    direct_io: ssd.direct_io,
                    create: true,
                    ..FileOptions::default()
                };
                let emulator = EmulatorOptions {
                    mode: ssd.device_compression,
                    logical_to_physical: ssd.logical_to_physical,
                    ..EmulatorOptions::default()
                };
                let size = ssd.size / BLOCK as u64 * BLOCK as u64;
                Some(Arc::new(CompressingDevice::open_file(
                    &ssd.path, size, &file, emulator,
                )?))
            }
        };
        let persist = config.ssd.as_ref().map(|ssd| Persist::beside(&ssd.path));
        Self::start(config, device, persist, lock)
    }

    /// Opens a cache whose SSD tier lives on `device` (tests, other devices), or DRAM-only.
    /// With `config.ssd` set, its index files live beside that path (not locked: the
    /// caller owns the device).
    pub fn open_on(config: Config, device: Option<Arc<dyn BlockDevice>>) -> Result<ZipCache> {
        let persist = config.ssd.as_ref().map(|ssd| Persist::beside(&ssd.path));
        Self::start(config, device, persist, None)
    }

    /// Opens the engine: the run epoch and the index files decide between a warm and a
    /// cold start (`docs/FORMAT.md`, "Restart").
    pub(crate) fn start(
        config: Config,
        device: Option<Arc<dyn BlockDevice>>,
        persist: Option<Persist>,
        lock: Option<DataLock>,
    ) -> Result<ZipCache> {
        config.validate()?;
        if !config.evictions && device.is_some() {
            return Err(Error::Config(
                "evictions=false needs a DRAM-only cache: with an SSD tier, room is made by moving objects down".into(),
            ));
        }
        let memory = Arc::new(Memory::default());
        let settings = DramSettings {
            leaf_size: config.leaf_size,
            subpages: config.subpages,
            write_buffer: config.write_buffer,
            tiny_max: config.tiny_max,
            dram_capacity: config.dram_capacity,
            bypass_max_fraction: config.bypass_max_fraction,
            // Tombstones must reach the SSD tier to delete its copies.
            keep_tombstones: device.is_some(),
            // CAS versions start from the clock so a restarted cache never reissues one a
            // client may still hold.
            cas_origin: config.clock.now_ms().max(1) << 16,
            track_access: config.track_access,
            dictionaries: config.training_settings(),
            opened_ms: config.clock.now_ms(),
        };
        let dram = DramTier::new(settings, memory.clone(), config.bypass_r);
        let mut warm_start = false;
        let mut epoch = 0;
        let (ssd, large) = match device {
            None => (None, None),
            Some(device) => {
                // The last block is the superblock; the rest is split between BT_SSD's
                // super-leaves and the large-object log.
                let total = run_epoch::lba(device.as_ref());
                let large_blocks = (total as f64 * LARGE_REGION) as u64;
                let small_blocks = total - large_blocks;
                let on_device = run_epoch::read(device.as_ref());
                let host_compression = device.compression().by_host();
                let mut settings = SsdSettings {
                    subpages: config.superleaf_size / BLOCK,
                    fill_threshold: config.fill_threshold,
                    blocks: small_blocks,
                    presence_filters: config.ssd_presence_filters,
                    host_compression,
                    dictionaries: config
                        .training_settings()
                        .filter(|_| host_compression && config.ssd_dictionaries)
                        .map(block_training),
                    loaded_dictionaries: false,
                };
                let (memory, clock) = (&memory, &config.clock);
                // may do I/O: the block dictionaries' files are read
                let dictionaries = Arc::new(BlockDictionaries::open(
                    settings.dictionaries,
                    persist.as_ref().map(|p| DictionaryFiles {
                        dir: p.dir.clone(),
                        prefix: p.dictionaries.clone(),
                    }),
                    memory.clone(),
                ));
                settings.loaded_dictionaries = dictionaries.any_live();
                // Only an index saved by the run that last wrote to the device describes
                // what the device holds.
                let saved = persist.as_ref().zip(on_device);
                let loaded = saved.and_then(|(p, epoch)| {
                    let at = p.file(&p.ssd_index, epoch);
                    let (memory, clock) = (memory.clone(), clock.clone());
                    SsdTier::load(
                        at,
                        device.clone(),
                        settings,
                        memory,
                        clock,
                        dictionaries.clone(),
                    )
                });
                let loaded_large = match (&loaded, saved) {
                    (Some(_), Some((p, epoch))) => LargeObjects::load(
                        p.file(&p.lo_index, epoch),
                        device.clone(),
                        small_blocks,
                        large_blocks,
                        memory.clone(),
                    ),
                    _ => None,
                };
                // From here on the index files are stale: if this process dies before a
                // clean close, the next open must start cold. Their removal is made
                // durable before the first device write of this run; the new epoch on
                // the device would refuse them anyway.
                if let Some(p) = &persist {
                    p.dir.remove(&p.ssd_index)?;
                    p.dir.remove(&p.lo_index)?;
                    p.dir.sync_dir()?;
                }
                epoch = run_epoch::next(on_device);
                run_epoch::write(device.as_ref(), epoch)?;
                let ssd = match loaded {
                    Some(tier) => {
                        warm_start = true;
                        tier
                    }
                    None => {
                        // Nothing the device holds can be trusted (a crash may have left
                        // values that were deleted or overwritten in DRAM): start cold, and
                        // trim so the old blocks free their space.
                        device.trim(0, small_blocks)?;
                        let (memory, clock) = (memory.clone(), clock.clone());
                        SsdTier::with_dictionaries(
                            device.clone(),
                            settings,
                            memory,
                            clock,
                            dictionaries.clone(),
                        )
                    }
                };
                // may do I/O: dictionaries no block names lose their files
                dictionaries.settle_after_open();
                let large = match loaded_large {
                    Some(large) => large,
                    None => {
                        // Without its index the region's extents cannot be told live from
                        // dead: forget them. Safe, because every large PUT also left a
                        // DRAM tombstone that the clean close wrote to BT_SSD.
                        device.trim(small_blocks, large_blocks)?;
                        LargeObjects::new(device, small_blocks, large_blocks, memory.clone())
                    }
                };
                (Some(ssd), Some(large))
            }
        };
        let promotion = (ssd.is_some() && config.promotion == Promotion::SecondHit).then(|| {
            let filter = PromotionFilter::new(
                (config.dram_capacity / promotion::DRAM_BYTES_PER_SLOT) as usize,
            );
            memory.change_index(alloc_size(filter.bytes()) as i64);
            filter
        });
        let governor = (config.rss_limit > 0)
            .then(|| RssGovernor::new(config.rss_limit, config.dram_capacity));
        let inner = Arc::new(Inner {
            rss_at_open: crate::stats::rss_bytes(std::process::id()).unwrap_or(0),
            capacity: AtomicU64::new(config.dram_capacity),
            config,
            memory,
            dram,
            ssd,
            large,
            persist,
            epoch,
            warm_start,
            _lock: lock,
            ops: OpCounters::default(),
            shutdown: AtomicBool::new(false),
            promotion,
            flush_epoch: AtomicU64::new(0),
            flushing: Mutex::new(()),
            flushed: (Mutex::new(()), Condvar::new()),
            flush_wake: (Mutex::new(()), Condvar::new()),
            flusher_stuck: AtomicBool::new(false),
            flusher_waiting: AtomicU64::new(0),
            io_rates: IoRates::default(),
            governor,
        });
        let mut workers = (0..inner.config.background_threads)
            .map(|i| {
                let inner = inner.clone();
                std::thread::Builder::new()
                    .name(format!("zipcache-bg-{i}"))
                    .spawn(move || inner.background(i == 0))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let flusher = inner.clone();
        workers.push(
            std::thread::Builder::new()
                .name("zipcache-flusher".into())
                .spawn(move || flusher.flusher())?,
        );
        Ok(ZipCache {
            inner,
            workers: Mutex::new(workers),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Sets who is told of the values evicted for room (see `EvictionListener` for which
    /// are), in place of any listener set before.
    pub fn set_eviction_listener(&self, listener: Arc<dyn crate::EvictionListener>) {
        *self.inner.dram.eviction_listener.write() = Some(listener);
    }

    /// The engine clock, Unix milliseconds; expiries are absolute times on it.
    pub fn now_ms(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// Tunes adaptive compression bypassing while running (`0` turns it off).
    pub fn set_bypass_r(&self, r: f64) {
        self.inner.dram.bypass.set_r(r);
    }

    /// Shuts down cleanly: stops the background threads, writes every DRAM object and
    /// tombstone down to the SSD tier (so the SSD alone holds the newest versions), flushes
    /// the device and saves the BT_SSD and BT_LO indexes; the next `open` restarts warm.
    pub fn close(self) -> Result<()> {
        self.stop();
        let inner = &self.inner;
        let now = inner.now();
        inner.dram.merge_all(now);
        if let Some(ssd) = &inner.ssd {
            inner.dram.evict_all(Some(ssd), now);
            ssd.device().drain()?;
            ssd.device().flush()?;
            if let (Some(p), Some(large)) = (&inner.persist, &inner.large) {
                ssd.save(p.file(&p.ssd_index, inner.epoch))?;
                large.save(p.file(&p.lo_index, inner.epoch))?;
            }
        }
        Ok(())
    }

    /// Whether this open found a clean shutdown's index and kept the SSD tier.
    pub fn warm_started(&self) -> bool {
        self.inner.warm_start
    }

    /// Merges every write buffer and waits until the device has accounted every write so
    /// far (emulated physical bytes are computed off the request path), so that `stats()`
    /// is exact afterwards. For measurements; the cache works without it.
    pub fn settle(&self) -> Result<()> {
        if let Some(dictionaries) = &self.inner.dram.dictionaries {
            // A training under way may swap the dictionary the merges compress with.
            dictionaries.settle();
        }
        self.inner.dram.merge_all(self.inner.now());
        if let Some(ssd) = &self.inner.ssd {
            ssd.settle_dictionaries();
            ssd.device().drain()?;
        }
        Ok(())
    }

    fn stop(&self) {
        self.inner.shutdown.store(true, Ordering::Release);
        for worker in self.workers.lock().drain(..) {
            let _ = worker.join();
        }
    }
}

impl Drop for ZipCache {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Inner {
    fn now(&self) -> u64 {
        self.config.clock.now_ms()
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if key.len() > self.config.max_key_size {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: self.config.max_key_size,
            });
        }
        Ok(())
    }
}
