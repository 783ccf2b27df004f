//! `ZipCache`: the public engine. It validates requests, routes them through the tiers in
//! the paper's order (§3.4), and runs the background threads (write-buffer merges,
//! eviction down to the low watermark, compression-bypass passes).
//!
//! This module holds the engine's types, its opening and closing; each job has its own
//! file: GET (`get.rs`), writes and removals (`write.rs`), SCAN (`scan.rs`), the DRAM
//! budget and making room in it (`room.rs`), the background threads (`background.rs`),
//! `stats` (`stats.rs`). What a restart keeps is the restart protocol's (`restart/`).

mod background;
mod get;
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
use crate::large_objects::LargeObjects;
use crate::memory::{Memory, alloc_size};
use crate::promotion::{self, PromotionFilter};
use crate::restart;
use crate::restart::dir::DataLock;
use crate::restart::files::{Persist, sibling};
use crate::restart::open::{Recovery, RecoveryKind, open_tiers};
use crate::restart::shadow::Shadow;
use crate::rss_governor::RssGovernor;
use crate::ssd::SsdTier;
use crate::{Config, Error, Result};

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
    /// The run epoch written to the device at open (`restart::epoch`); 0 without a device.
    epoch: u64,
    /// How the open kept the flash tier.
    recovery: Recovery,
    /// Keys whose flash versions must not be served (`restart/shadow.rs`); with an SSD.
    pub(crate) shadow: Option<Arc<Shadow>>,
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
    /// Held for each step of `make_room` (look at the target, evict once) and while
    /// `set_dram_capacity` changes the budget: a step never evicts for a budget that was
    /// raised after it looked.
    eviction_step: Mutex<()>,
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
    /// Set by `crash`: the drop that follows keeps the crash journal.
    #[cfg(test)]
    crashed: bool,
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
                let block = zipcache_device::BLOCK_SIZE as u64;
                let size = ssd.size / block * block;
                Some(Arc::new(CompressingDevice::open_file(
                    &ssd.path, size, &file, emulator,
                )?))
            }
        };
        let persist = config
            .ssd
            .as_ref()
            .map(|ssd| Persist::beside(&ssd.path, config.crash_journal.as_deref()));
        Self::start(config, device, persist, lock)
    }

    /// Opens a cache whose SSD tier lives on `device` (tests, other devices), or DRAM-only.
    /// With `config.ssd` set, its index files live beside that path (not locked: the
    /// caller owns the device).
    pub fn open_on(config: Config, device: Option<Arc<dyn BlockDevice>>) -> Result<ZipCache> {
        let persist = config
            .ssd
            .as_ref()
            .map(|ssd| Persist::beside(&ssd.path, config.crash_journal.as_deref()));
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
        let tiers = match device {
            None => None,
            // may do I/O: the restart protocol's steps (`restart::open`)
            Some(device) => Some(open_tiers(&config, device, persist.as_ref(), &memory)?),
        };
        let dram = DramTier::new(
            dram_settings(&config, tiers.is_some()),
            memory.clone(),
            config.bypass_r,
        );
        // Marks serve only crash recovery: without a journal a crash is cold anyway.
        let dram = match &tiers {
            Some(t) if t.recovery.journal => {
                dram.with_shadow(t.shadow.clone(), Arc::new(t.ssd.presence()))
            }
            _ => dram,
        };
        let recovery = tiers.as_ref().map(|t| t.recovery).unwrap_or_default();
        let epoch = tiers.as_ref().map_or(0, |t| t.epoch);
        let shadow = tiers.as_ref().map(|t| t.shadow.clone());
        let (ssd, large) = tiers.map(|t| (t.ssd, t.large)).unzip();
        let promotion = (ssd.is_some() && config.promotion == Promotion::SecondHit)
            .then(|| promotion_filter(&config, &memory));
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
            recovery,
            shadow,
            _lock: lock,
            ops: OpCounters::default(),
            shutdown: AtomicBool::new(false),
            promotion,
            flush_epoch: AtomicU64::new(0),
            flushing: Mutex::new(()),
            flushed: (Mutex::new(()), Condvar::new()),
            flush_wake: (Mutex::new(()), Condvar::new()),
            eviction_step: Mutex::new(()),
            flusher_stuck: AtomicBool::new(false),
            flusher_waiting: AtomicU64::new(0),
            io_rates: IoRates::default(),
            governor,
        });
        let workers = inner.spawn_workers()?;
        Ok(ZipCache {
            inner,
            workers: Mutex::new(workers),
            #[cfg(test)]
            crashed: false,
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

    /// This run's epoch (`restart::epoch`): no other run whose objects the device may
    /// still hold had it, so a run can name things its objects outlive by it (a hash's
    /// id, `zipcache-server`'s `core/hashes.rs`). 0 without an SSD tier, whose objects
    /// end with the run.
    pub fn run_epoch(&self) -> u64 {
        self.inner.epoch
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
            if let (Some(p), Some(large), Some(shadow)) =
                (&inner.persist, &inner.large, &inner.shadow)
            {
                // may do I/O: the indexes written and made durable
                restart::close::save_indexes(p, inner.epoch, ssd, large, shadow)?;
            }
        }
        Ok(())
    }

    /// Whether this open kept the SSD tier: a clean shutdown's indexes, or a crashed
    /// run's journal.
    pub fn warm_started(&self) -> bool {
        self.inner.recovery.kind != RecoveryKind::Cold
    }

    /// How this open kept the flash tier (`stats` reports it too).
    pub fn recovery(&self) -> Recovery {
        self.inner.recovery
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

    /// Ends the engine as a process crash would: the background threads stop where
    /// they are between two steps, nothing is written down or saved, and the crash
    /// journal stays (for the power-loss model, which kills no process).
    #[cfg(test)]
    pub(crate) fn crash(mut self) {
        self.stop();
        // Dropped all the same (a model that crashes thousands of engines must not keep
        // their memory and mappings), but the drop keeps the journal.
        self.crashed = true;
    }

    fn stop(&self) {
        self.inner.shutdown.store(true, Ordering::Release);
        for worker in self.workers.lock().drain(..) {
            let _ = worker.join();
        }
    }
}

impl Drop for ZipCache {
    /// Stops the background threads. An engine dropped without `close` (and not by a
    /// panic unwinding) was let go on purpose: its crash journal goes, and the next open
    /// is cold, as it always was. A panic keeps the journal, like any crash.
    fn drop(&mut self) {
        self.stop();
        #[cfg(test)]
        if self.crashed {
            return;
        }
        if !std::thread::panicking()
            && let Some(journal) = self.inner.persist.as_ref().and_then(|p| p.journal.as_ref())
        {
            journal.remove();
        }
    }
}

/// The DRAM tier's settings from the engine's; `with_ssd`: tombstones are kept until
/// they reach the SSD tier, to delete its copies.
fn dram_settings(config: &Config, with_ssd: bool) -> DramSettings {
    DramSettings {
        leaf_size: config.leaf_size,
        subpages: config.subpages,
        page_chunks: config.page_chunks,
        write_buffer: config.write_buffer,
        tiny_max: config.tiny_max,
        dram_capacity: config.dram_capacity,
        bypass_max_fraction: config.bypass_max_fraction,
        keep_tombstones: with_ssd,
        // CAS versions start from the clock so a restarted cache never reissues one a
        // client may still hold.
        cas_origin: config.clock.now_ms().max(1) << 16,
        track_access: config.track_access,
        dictionaries: config.training_settings(),
        opened_ms: config.clock.now_ms(),
    }
}

/// `promotion = second_hit`'s filter, its memory counted in the index's.
fn promotion_filter(config: &Config, memory: &Memory) -> PromotionFilter {
    let filter =
        PromotionFilter::new((config.dram_capacity / promotion::DRAM_BYTES_PER_SLOT) as usize);
    memory.change_index(alloc_size(filter.bytes()) as i64);
    filter
}

impl Inner {
    /// The background threads (merges, eviction passes, bypass) and the flusher.
    fn spawn_workers(self: &Arc<Self>) -> std::io::Result<Vec<JoinHandle<()>>> {
        let mut workers = (0..self.config.background_threads)
            .map(|i| {
                let inner = self.clone();
                std::thread::Builder::new()
                    .name(format!("zipcache-bg-{i}"))
                    .spawn(move || inner.background(i == 0))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let flusher = self.clone();
        workers.push(
            std::thread::Builder::new()
                .name("zipcache-flusher".into())
                .spawn(move || flusher.flusher())?,
        );
        Ok(workers)
    }

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
