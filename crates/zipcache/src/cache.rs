//! `ZipCache`: the public engine. It validates requests, routes them through the tiers in
//! the paper's order (§3.4), and runs the background threads (write-buffer merges,
//! eviction down to the low watermark, compression-bypass passes).

use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::counters::Counter;
use crate::io_rates::IoRates;
use zipcache_device::{
    AlignedBuf, BlockDevice, CompressingDevice, EmulatorOptions, FileOptions, ReadFuture,
};

use crate::async_get::AsyncGet;
use crate::config::Promotion;
use crate::dram::{DramSettings, DramTier, LeafScan, Lookup, Reclaimed, ScanEntry};
use crate::eviction::EvictionSink;
use crate::index_dir::{DataLock, FsDir, IndexDir};
use crate::large_objects::LargeObjects;
use crate::memory::{Memory, alloc_size};
use crate::promotion::{self, PromotionFilter};
use crate::record::{ASSIGN_CAS, Meta};
use crate::rss_governor::RssGovernor;
use crate::run_epoch;
use crate::sealed_file::IndexFile;
use crate::ssd::{Finished, Freshness, PlannedRead, SsdHit, SsdSettings, SsdTier};
use crate::stats::ratio;
use crate::{AccessState, Config, Error, GetOptions, Item, PutOptions, Result, Stats, Update};

/// Background eviction keeps DRAM below this fraction of the budget, so foreground
/// writers rarely have to evict themselves.
const LOW_WATERMARK: f64 = 0.985;
/// The smallest `dram_capacity` an engine takes.
pub(crate) const MIN_DRAM_CAPACITY: u64 = 64 << 10;
/// 1 PiB: beyond any machine, and far inside the signed arithmetic of the budget.
pub(crate) const MAX_DRAM_CAPACITY: u64 = 1 << 50;
/// The device's block: one SSD sub-page.
const BLOCK: usize = zipcache_device::BLOCK_SIZE;
/// Share of the SSD device given to the large-object log (BT_LO).
const LARGE_REGION: f64 = 0.125;
/// How often the bypass pass re-ranks leaves.
const BYPASS_PERIOD: Duration = Duration::from_millis(100);
/// How often the RSS governor (setting `rss_limit`) measures: RSS moves by at most a few
/// MiB in that time, which its margin absorbs.
const RSS_PERIOD: Duration = Duration::from_millis(100);
/// How long a merge thread sleeps between rounds while writers keep queueing leaves (a
/// full buffer waits about this long for its merge), and when nothing was queued.
const MERGE_PERIOD_BUSY: Duration = Duration::from_millis(1);
const MERGE_PERIOD_IDLE: Duration = Duration::from_millis(10);
/// Merges between two looks at the housekeeping clocks.
const MERGES_PER_ROUND: usize = 256;

#[derive(Default)]
struct OpCounters {
    gets: Counter,
    dram_hits: Counter,
    large_hits: Counter,
    ssd_hits: Counter,
    promotions: Counter,
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
    /// ([`ReadInFlight`]).
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
                let settings = SsdSettings {
                    subpages: config.superleaf_size / BLOCK,
                    fill_threshold: config.fill_threshold,
                    blocks: small_blocks,
                    presence_filters: config.ssd_presence_filters,
                };
                let (memory, clock) = (&memory, &config.clock);
                // Only an index saved by the run that last wrote to the device describes
                // what the device holds.
                let saved = persist.as_ref().zip(on_device);
                let loaded = saved.and_then(|(p, epoch)| {
                    let at = p.file(&p.ssd_index, epoch);
                    SsdTier::load(at, device.clone(), settings, memory.clone(), clock.clone())
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
                        SsdTier::new(device.clone(), settings, memory.clone(), clock.clone())
                    }
                };
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

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self
            .get_item(key, GetOptions::default())?
            .map(|item| item.value))
    }

    pub fn get_item(&self, key: &[u8], options: GetOptions) -> Result<Option<Item>> {
        let inner = &self.inner;
        inner.check_key(key)?;
        inner.ops.gets.incr();
        Ok(inner.lookup(key, inner.now(), options))
    }

    /// GET that never waits for the device on the caller's thread: DRAM and BT_LO answer at
    /// once (the returned future is ready); when the SSD tier must be read, the read is in
    /// flight (`BlockDevice::read_async`) and the future resolves when it completes.
    /// Same answers and guarantees as `get_item`.
    pub fn get_item_async(&self, key: &[u8], options: GetOptions) -> AsyncGet {
        let inner = &self.inner;
        if let Err(e) = inner.check_key(key) {
            return AsyncGet::ready(Err(e));
        }
        inner.ops.gets.incr();
        let now = inner.now();
        let epoch = match inner.lookup_memory(key, now, options) {
            Ok(item) => return AsyncGet::ready(Ok(item)),
            Err(epoch) => epoch,
        };
        let ssd = inner.ssd.as_ref().expect("only an SSD tier defers a GET");
        let Some(read) = ssd.plan_get(key) else {
            return AsyncGet::ready(Ok(inner.ssd_answer(key, None, epoch, now, options)));
        };
        // Submitted now, so that a command's GETs are all in flight at once.
        let block = inner
            .ops
            .read_in_flight(ssd, read.lba, AlignedBuf::zeroed(1));
        let counted = block.is_in_flight().then(|| ReadInFlight::new(inner));
        let (inner, key) = (self.inner.clone(), key.to_vec());
        AsyncGet::reading(async move {
            let _counted_until_answered_or_dropped = counted;
            let ssd = inner.ssd.as_ref().expect("an SSD tier");
            let hit = finish_ssd_async(ssd, &inner.ops, &key, read, block, now).await;
            Ok(inner.ssd_answer(&key, hit, epoch, now, options))
        })
    }

    /// Whether a GET may have to read the SSD tier: without one, `get_item` never waits
    /// for a device and `get_item_async` is always ready.
    pub fn has_ssd_tier(&self) -> bool {
        self.inner.ssd.is_some()
    }

    pub fn put(&self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<()> {
        let expires_at_ms = ttl.map(|d| self.now_ms().saturating_add(d.as_millis() as u64));
        self.put_with(
            key,
            value,
            PutOptions {
                expires_at_ms,
                ..PutOptions::default()
            },
        )?;
        Ok(())
    }

    /// Stores an object; returns its CAS version (0 unless `assign_cas`).
    pub fn put_with(&self, key: &[u8], value: &[u8], options: PutOptions) -> Result<u64> {
        let inner = &self.inner;
        inner.check_key(key)?;
        inner.check_value(value)?;
        inner.check_room()?;
        inner.ops.puts.incr();
        let meta = inner.meta(&options);
        let cas = inner.store(key, value, meta, options.access, inner.now());
        inner.relieve_pressure();
        Ok(cas)
    }

    /// Deletes `key`; true if a live value was there.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        let inner = &self.inner;
        inner.check_key(key)?;
        inner.ops.deletes.incr();
        let now = inner.now();
        // The SSD is asked under the leaf lock (like `update`, this may read the device
        // with the lock held): once the lock is released, the tombstone may leave for
        // the SSD and erase the copy that says the key existed.
        let (before, (large, on_ssd)) = inner.dram.delete(key, now, |before| {
            let removed = inner.large.as_ref().and_then(|lo| lo.remove(key));
            let large = removed.filter(|meta| !meta.expired(now));
            let on_ssd = *before == Lookup::Absent
                && large.is_none()
                && inner
                    .ssd
                    .as_ref()
                    .is_some_and(|ssd| ssd.get(key, now).is_some());
            (large, on_ssd)
        });
        let existed = match before {
            Lookup::Found(..) => true,
            Lookup::Expired => false,
            Lookup::Deleted => large.is_some(),
            Lookup::Absent => large.is_some() || on_ssd,
        };
        inner.relieve_pressure();
        Ok(existed)
    }

    /// Atomic read-modify-write of one key: `f` sees the live item (if any) and decides.
    /// No other write to `key` happens between the read and the write. Returns `f`'s
    /// result and, for a put, the new CAS version.
    pub fn update<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(Option<&Item>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        let inner = &self.inner;
        inner.check_key(key)?;
        let now = inner.now();
        let outcome = inner.dram.modify(key, now, |current, cas| {
            // The leaf stays locked while BT_LO and the SSD are read, so no write slips in.
            // What a racing flush_all is erasing below must not come back as a new value.
            let epoch = inner.flush_epoch.load(Ordering::SeqCst);
            let below = |item: Option<Item>| item.filter(|_| inner.lower_tiers_current(epoch));
            let current = match current {
                Lookup::Found(value, meta, access) => Some(Item {
                    access,
                    ..item_of(value, &meta)
                }),
                Lookup::Expired => None,
                Lookup::Deleted => below(inner.large_get(key, now)),
                Lookup::Absent => below(inner.large_get(key, now).or_else(|| {
                    let hit = inner.ssd.as_ref().and_then(|ssd| ssd.get(key, now));
                    hit.map(|hit| item_of(hit.value, &hit.meta))
                })),
            };
            let (update, result) = f(current.as_ref());
            match update {
                Update::Keep => (None, Ok((result, None))),
                Update::Delete if current.is_none() => (None, Ok((result, None))),
                Update::Delete => {
                    if let Some(lo) = &inner.large {
                        lo.remove(key);
                    }
                    (Some(None), Ok((result, None)))
                }
                Update::Put { value, options } => {
                    match inner.check_value(&value).and_then(|()| inner.check_room()) {
                        Err(e) => (None, Err(e)),
                        Ok(()) => {
                            let meta = inner.meta(&options).assigning(cas);
                            let change = match inner.large_for(key, &value) {
                                Some(lo) => {
                                    lo.put(key, &value, meta);
                                    None
                                }
                                None => {
                                    if let Some(lo) = &inner.large {
                                        lo.remove(key);
                                    }
                                    Some((value, meta, options.access))
                                }
                            };
                            (Some(change), Ok((result, Some(meta.cas))))
                        }
                    }
                }
            }
        });
        inner.relieve_pressure();
        outcome
    }

    /// Live objects with keys in `range`, in key order, at most `limit` of them. A scan
    /// peeks: it marks nothing read, and reports the access state DRAM keeps of its
    /// objects (setting `track_access`; `None` for the others).
    pub fn scan<K: AsRef<[u8]>>(
        &self,
        range: impl RangeBounds<K>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Item)>> {
        let inner = &self.inner;
        inner.ops.scans.incr();
        let now = inner.now();
        let end: Bound<&[u8]> = match range.end_bound() {
            Bound::Included(k) => Bound::Included(k.as_ref()),
            Bound::Excluded(k) => Bound::Excluded(k.as_ref()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut cursor: Vec<u8> = match range.start_bound() {
            Bound::Included(k) => k.as_ref().to_vec(),
            // The smallest key after `k`.
            Bound::Excluded(k) => [k.as_ref(), &[0]].concat(),
            Bound::Unbounded => Vec::new(),
        };
        let mut out = Vec::new();
        // The SSD super-leaf and BT_LO leaf last read, kept while DRAM leaves walk
        // through their ranges. The super-leaf is read again if it was written since:
        // an eviction may have moved a newer version from a DRAM leaf read after it.
        let mut ssd_chunk: Option<(Chunk, Freshness)> = None;
        let mut lo_chunk: Option<Chunk> = None;
        while out.len() < limit {
            let LeafScan {
                entries: dram_entries,
                next: dram_next,
                lost: dram_lost,
                access,
            } = inner.dram.scan_leaf(&cursor, end, now);
            let (entries, next) = match &inner.ssd {
                None => (dram_entries, dram_next),
                Some(ssd) => {
                    let stale = |chunk: Option<&Chunk>| {
                        chunk.is_none_or(|(_, high)| {
                            high.as_ref()
                                .is_some_and(|h| cursor.as_slice() >= h.as_ref())
                        })
                    };
                    let ssd_stale = ssd_chunk.as_ref().is_none_or(|(chunk, proof)| {
                        stale(Some(chunk)) || !ssd.still_current(proof)
                    });
                    if ssd_stale {
                        let (entries, high, proof) = ssd.scan_leaf(&cursor, end, now);
                        ssd_chunk = Some(((entries, high), proof));
                    }
                    let large = inner.large.as_ref().filter(|lo| !lo.is_empty());
                    if let Some(lo) = large.filter(|_| stale(lo_chunk.as_ref())) {
                        lo_chunk = Some(lo.scan_leaf(&cursor, end, now));
                    }
                    let ((ssd_entries, ssd_next), _) = ssd_chunk.as_ref().expect("just filled");
                    let lo_part = large.and(lo_chunk.as_ref());
                    // This step covers keys below whichever leaf ends first.
                    let mut next = dram_next.clone();
                    for other in [
                        Some(ssd_next.clone()),
                        lo_part.map(|(_, high)| high.clone()),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        next = match (next, other) {
                            (Some(a), Some(b)) => Some(if a <= b { a } else { b }),
                            (a, b) => a.or(b),
                        };
                    }
                    let below = |k: &[u8]| {
                        next.as_ref().is_none_or(|n| k < n.as_ref()) && k >= cursor.as_slice()
                    };
                    // A DRAM leaf that lost its page may have hidden any of these.
                    let mut merged: std::collections::BTreeMap<Vec<u8>, _> = ssd_entries
                        .iter()
                        .filter(|(k, _)| below(k) && !dram_lost)
                        .cloned()
                        .collect();
                    // A large version is newer than any SSD copy (writing it deleted them) ...
                    let mut large_keys = std::collections::BTreeSet::new();
                    for (k, v) in lo_part
                        .into_iter()
                        .flat_map(|(e, _)| e.iter())
                        .filter(|(k, _)| below(k))
                    {
                        large_keys.insert(k.clone());
                        merged.insert(k.clone(), v.clone());
                    }
                    // ... and DRAM holds the newest of all, except that its tombstone for a
                    // large object's key only hides the small versions below it.
                    for (k, v) in dram_entries.into_iter().filter(|(k, _)| below(k)) {
                        if v.is_some() || !large_keys.contains(&k) {
                            merged.insert(k, v);
                        }
                    }
                    (merged.into_iter().collect(), next)
                }
            };
            for (key, version) in entries {
                if let Some((value, meta)) = version {
                    // Only DRAM's version of a key can be in `access`: DRAM's wins.
                    let item = Item {
                        access: access.get(&key).copied(),
                        ..item_of(value, &meta)
                    };
                    out.push((key, item));
                    if out.len() == limit {
                        break;
                    }
                }
            }
            let Some(next) = next else { break };
            let past_end = match end {
                Bound::Included(e) => next.as_ref() > e,
                Bound::Excluded(e) => next.as_ref() >= e,
                Bound::Unbounded => false,
            };
            if past_end {
                break;
            }
            cursor = next.to_vec();
        }
        Ok(out)
    }

    /// Drops the expired objects DRAM still holds (they count as resident until their
    /// leaf next merges), leaf by leaf; `keep_going` sees the totals after each leaf and
    /// may end the pass. Expired objects on the SSD tier and in BT_LO stay until those
    /// tiers rewrite them (no read ever returns them).
    pub fn reclaim_expired(&self, keep_going: impl FnMut(&Reclaimed) -> bool) -> Reclaimed {
        let inner = &self.inner;
        let done = inner.dram.reclaim_expired(inner.now(), keep_going);
        inner.relieve_pressure();
        done
    }

    /// Forgets every object: a barrier, after which nothing stored before it is served.
    ///
    /// DRAM is emptied first, so no eviction can carry an old object down to a tier that
    /// was already cleared; GETs that race the flush may still read the lower tiers until
    /// they are cleared too, but what they read is not copied back into DRAM: promotions
    /// and read-modify-writes check the flush epoch under the DRAM leaf's lock, and the
    /// epoch moves before DRAM is emptied (`Inner::lower_tiers_current`).
    pub fn flush_all(&self) -> Result<()> {
        let inner = &self.inner;
        let _one_at_a_time = inner.flushing.lock();
        inner.flush_epoch.fetch_add(1, Ordering::SeqCst);
        inner.dram.evict_all(None, inner.now());
        if let Some(ssd) = &inner.ssd {
            ssd.clear();
        }
        if let Some(lo) = &inner.large {
            lo.clear();
        }
        inner.flush_epoch.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

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
        inner.capacity.store(bytes, Ordering::Relaxed);
        if inner.ssd.is_none() {
            inner.make_room(inner.budget(), usize::MAX);
        } else {
            let _flusher = inner.flush_wake.0.lock();
            inner.flush_wake.1.notify_one();
        }
        Ok(())
    }

    /// Tunes adaptive compression bypassing while running (`0` turns it off).
    pub fn set_bypass_r(&self, r: f64) {
        self.inner.dram.bypass.set_r(r);
    }

    pub fn stats(&self) -> Stats {
        self.inner.stats()
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
        self.inner.dram.merge_all(self.inner.now());
        if let Some(ssd) = &self.inner.ssd {
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

/// Where a clean shutdown leaves the indexes: `<ssd file>.index` (BT_SSD) and
/// `<ssd file>.lo-index` (BT_LO), in the SSD file's directory.
pub(crate) struct Persist {
    pub(crate) dir: Arc<dyn IndexDir>,
    pub(crate) ssd_index: String,
    pub(crate) lo_index: String,
}

impl Persist {
    fn beside(ssd: &Path) -> Persist {
        let dir = ssd.parent().filter(|d| !d.as_os_str().is_empty());
        let name = ssd.file_name().unwrap_or_default().to_string_lossy();
        Persist {
            dir: Arc::new(FsDir::new(dir.unwrap_or(Path::new(".")))),
            ssd_index: format!("{name}.index"),
            lo_index: format!("{name}.lo-index"),
        }
    }

    fn file<'a>(&'a self, name: &'a str, epoch: u64) -> IndexFile<'a> {
        IndexFile {
            dir: self.dir.as_ref(),
            name,
            epoch,
        }
    }
}

/// `<ssd file>.<extension>`.
fn sibling(ssd: &Path, extension: &str) -> std::path::PathBuf {
    let mut name = ssd.as_os_str().to_owned();
    name.push(".");
    name.push(extension);
    name.into()
}

/// A scan step's entries from one leaf of a lower tree, and where that leaf ends.
type Chunk = (Vec<ScanEntry>, Option<crate::btree::Fence>);

/// `SsdTier::get` with the block read in flight instead of on this thread: waits for the
/// first, already submitted read, then plans and reads again while writers keep moving
/// the block away.
async fn finish_ssd_async(
    ssd: &SsdTier,
    ops: &OpCounters,
    key: &[u8],
    mut read: PlannedRead,
    mut block: ReadFuture,
    now: u64,
) -> Option<SsdHit> {
    loop {
        let (result, buf) = block.await;
        match ssd.finish_get(read, key, result.is_ok().then_some(&buf[..]), now) {
            Finished::Done(hit) => return hit,
            Finished::Retry => {}
        }
        read = ssd.plan_get(key)?;
        block = ops.read_in_flight(ssd, read.lba, buf);
    }
}

impl OpCounters {
    /// Submits a read of block `lba` of the SSD tier, counted if it goes in flight rather
    /// than completing on this thread (no io_uring here, or every slot taken).
    fn read_in_flight(&self, ssd: &SsdTier, lba: u64, buf: AlignedBuf) -> ReadFuture {
        // may do I/O: the read is in flight until the future resolves
        let block = ssd.device().read_async(lba, buf);
        if block.is_in_flight() {
            self.async_ssd_reads.incr();
        }
        block
    }
}

/// A GET whose SSD read went in flight, counted in `ssd_reads_in_flight` until the GET
/// has its answer or is dropped (a server drops the GETs it read ahead for requests a
/// change or a barrier made stale; their reads complete unobserved).
struct ReadInFlight(Arc<Inner>);

impl ReadInFlight {
    fn new(inner: &Arc<Inner>) -> ReadInFlight {
        inner
            .ops
            .ssd_reads_in_flight
            .fetch_add(1, Ordering::Relaxed);
        ReadInFlight(inner.clone())
    }
}

impl Drop for ReadInFlight {
    fn drop(&mut self) {
        self.0
            .ops
            .ssd_reads_in_flight
            .fetch_sub(1, Ordering::Relaxed);
    }
}

fn item_of(value: Vec<u8>, meta: &Meta) -> Item {
    Item {
        value,
        flags: meta.flags,
        cas: meta.cas,
        expires_at_ms: meta.expires_at_ms,
        access: None,
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

    /// With `evictions` off, a write is refused while the budget is full (counted in
    /// `refused_writes`): nothing is evicted to make room.
    fn check_room(&self) -> Result<()> {
        if self.config.evictions || self.memory.snapshot().total() < self.budget() {
            return Ok(());
        }
        self.ops.refused_writes.incr();
        Err(Error::OutOfMemory)
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        if value.len() > self.config.max_value_size {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: self.config.max_value_size,
            });
        }
        Ok(())
    }

    fn meta(&self, options: &PutOptions) -> Meta {
        // A version the write names is kept as it is (memcached meta `E`); otherwise the
        // DRAM tier gives one, under the key's leaf lock.
        let cas = match options.cas {
            Some(chosen) => chosen,
            None if options.assign_cas => ASSIGN_CAS,
            None => 0,
        };
        let client_cas = options.cas.is_some_and(|chosen| chosen != 0);
        Meta {
            expires_at_ms: options.expires_at_ms,
            flags: options.flags,
            cas,
            clean: false,
            client_cas,
        }
    }

    /// GET through the tiers in the paper's order: DRAM (buffer, page), then one SSD read
    /// on the calling thread.
    fn lookup(&self, key: &[u8], now: u64, options: GetOptions) -> Option<Item> {
        match self.lookup_memory(key, now, options) {
            Ok(item) => item,
            // may do I/O: one 4 KiB read
            Err(epoch) => {
                let hit = self.ssd.as_ref().and_then(|ssd| ssd.get(key, now));
                self.ssd_answer(key, hit, epoch, now, options)
            }
        }
    }

    /// What DRAM and BT_LO answer for `key`, or `Err(flush epoch)` when the SSD must be
    /// read: the epoch is read before the SSD, for promotion (`lower_tiers_current`).
    fn lookup_memory(
        &self,
        key: &[u8],
        now: u64,
        options: GetOptions,
    ) -> std::result::Result<Option<Item>, u64> {
        let found = match self.dram.get(key, now, options.peek) {
            Lookup::Found(value, meta, access) => {
                self.ops.dram_hits.incr();
                return Ok(Some(Item {
                    access,
                    ..item_of(value, &meta)
                }));
            }
            Lookup::Expired => {
                self.ops.expired.incr();
                None
            }
            // A tombstone hides small versions; a large one may stand behind it.
            Lookup::Deleted => self.large_get(key, now),
            Lookup::Absent => match self.large_get(key, now) {
                Some(item) => Some(item),
                None if self.ssd.is_some() => {
                    return Err(self.flush_epoch.load(Ordering::SeqCst));
                }
                None => None,
            },
        };
        if found.is_none() {
            self.ops.misses.incr();
        }
        Ok(found)
    }

    /// Counts what the SSD tier answered and promotes a hit.
    fn ssd_answer(
        &self,
        key: &[u8],
        hit: Option<SsdHit>,
        epoch: u64,
        now: u64,
        options: GetOptions,
    ) -> Option<Item> {
        let Some(hit) = hit else {
            self.ops.misses.incr();
            return None;
        };
        self.ops.ssd_hits.incr();
        let item = item_of(hit.value.clone(), &hit.meta);
        // The copy starts fetched by this GET, unless it only peeked.
        let fetched = AccessState {
            fetched: true,
            last_access_ms: now,
        };
        self.promote(key, hit, epoch, (!options.peek).then_some(fetched), now);
        Some(item)
    }

    fn large_get(&self, key: &[u8], now: u64) -> Option<Item> {
        let (value, meta) = self.large.as_ref()?.get(key, now)?;
        self.ops.large_hits.incr();
        Some(item_of(value, &meta))
    }

    /// BT_LO if `key` + `value` make a large object and there is an SSD to hold it.
    fn large_for(&self, key: &[u8], value: &[u8]) -> Option<&LargeObjects> {
        self.large
            .as_ref()
            .filter(|_| key.len() + value.len() > self.config.medium_max)
    }

    /// Writes one object: large ones to BT_LO behind a DRAM tombstone, small ones to DRAM
    /// (dropping any large version), both under the DRAM leaf's lock. Returns its CAS
    /// version.
    fn store(
        &self,
        key: &[u8],
        value: &[u8],
        meta: Meta,
        access: Option<AccessState>,
        now: u64,
    ) -> u64 {
        let dram = &self.dram;
        match (self.large_for(key, value), &self.large) {
            (Some(lo), _) => dram.put_with(key, None, meta, None, now, |cas| {
                lo.put(key, value, meta.assigning(cas));
                cas
            }),
            (None, Some(lo)) => dram.put_with(key, Some(value), meta, access, now, |cas| {
                lo.remove(key);
                cas
            }),
            (None, None) => dram.put_with(key, Some(value), meta, access, now, |cas| cas),
        }
    }

    /// Whether no `flush_all` ran or started since `epoch` was read (and none was running
    /// then): what the lower tiers gave since is not being erased. Called under the DRAM
    /// leaf's lock before copying it into DRAM: a flush that starts after this check
    /// empties DRAM after it, so it will find and drop the copy.
    fn lower_tiers_current(&self, epoch: u64) -> bool {
        epoch.is_multiple_of(2) && self.flush_epoch.load(Ordering::SeqCst) == epoch
    }

    /// Inclusive caching: an SSD hit goes into DRAM as a clean object, which a later
    /// eviction will not write again. Only if DRAM still has no version of the key, the
    /// super-leaf was not written since the read and no flush ran since (`epoch`, read
    /// before the SSD): otherwise a PUT, DELETE or flush that landed in between is newer,
    /// and the copy read would be stale. The copy starts with access state `access`.
    fn promote(&self, key: &[u8], hit: SsdHit, epoch: u64, access: Option<AccessState>, now: u64) {
        let ssd = self.ssd.as_ref().expect("promote follows an SSD hit");
        if self.promotion.as_ref().is_some_and(|f| !f.admit(key)) {
            return;
        }
        let promoted = self.dram.modify(key, now, |current, _| {
            let fresh = current == Lookup::Absent
                && ssd.still_current(&hit.proof)
                && self.lower_tiers_current(epoch);
            let change = fresh.then_some(Some((
                hit.value,
                Meta {
                    clean: true,
                    ..hit.meta
                },
                access,
            )));
            (change, fresh)
        });
        if promoted {
            self.ops.promotions.incr();
        }
        self.relieve_pressure();
    }

    fn sink(&self) -> Option<&dyn EvictionSink> {
        self.ssd.as_ref().map(|ssd| ssd as &dyn EvictionSink)
    }

    /// Memory back-pressure on the foreground (PUT, DELETE, a GET's promotion), which
    /// never does device I/O: in DRAM-only mode eviction is a drop anyway; with an SSD
    /// tier, the background flusher writes victims down and this waits for it, at most
    /// `flush_wait_ms`, then drops cold leaves unwritten until DRAM is back in budget
    /// (`DramTier::drop_one`, `ssd_write_drops`): a cache may forget.
    fn relieve_pressure(&self) {
        let capacity = self.budget();
        let over = || self.memory.snapshot().total() > capacity;
        if !over() {
            return;
        }
        if self.ssd.is_none() {
            self.make_room(capacity, 64);
            return;
        }
        {
            // Under the flusher's lock: it checks for work and sleeps under it, so the
            // wake-up cannot fall between the two.
            let _flusher = self.flush_wake.0.lock();
            self.flush_wake.1.notify_one();
        }
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

    /// Evicts until DRAM use is at most `target`, at most `attempts` times; false if it
    /// is still above (nothing left to evict). DRAM leaves go first; when they free
    /// nothing while the lower tiers' indexes hold more than 1/8 of the budget, or those
    /// indexes take more than half of it, the SSD tier gives up a super-leaf and BT_LO its
    /// oldest extent: their descriptors live in DRAM too. With `evictions` off, nothing.
    fn make_room(&self, target: i64, attempts: usize) -> bool {
        /// DRAM evictions in a row that free nothing before the indexes are shrunk.
        const FUTILE: usize = 8;
        let used = || self.memory.snapshot().total();
        if !self.config.evictions {
            return used() <= target;
        }
        let mut futile_runs = 0;
        for _ in 0..attempts {
            let before = used();
            if before <= target || self.shutdown.load(Ordering::Relaxed) {
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
        used() <= target
    }

    fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// What the cache may hold now: `dram_capacity`, less what the RSS governor withholds
    /// (never more than half of it, even after `set_dram_capacity` lowered it).
    fn budget(&self) -> i64 {
        let capacity = self.capacity() as i64;
        let withheld = self.governor.as_ref().map_or(0, |g| g.reserve());
        capacity - withheld.min(capacity / 2)
    }

    /// The RSS governor's tick: measure, re-set the budget and, DRAM-only (where only
    /// writers evict), evict down to it so a quiet server gives memory back too.
    fn govern_rss(&self) {
        let Some(governor) = &self.governor else {
            return;
        };
        let Some(rss) = crate::stats::rss_bytes(std::process::id()) else {
            return;
        };
        governor.step(rss);
        if self.ssd.is_none() {
            self.make_room(self.budget(), 1024);
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

    /// A merge thread: write-buffer merges; the first one also re-ranks hot leaves.
    fn background(&self, housekeeper: bool) {
        let mut last_bypass = Instant::now();
        let mut last_rss = Instant::now();
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
                self.dram.bypass_pass();
            }
            if housekeeper && last_rss.elapsed() >= RSS_PERIOD {
                last_rss = Instant::now();
                self.govern_rss();
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
    fn flusher(&self) {
        while !self.shutdown.load(Ordering::Acquire) {
            let low_watermark = self.flusher_target();
            // may do I/O: the SSD tier's read-modify-writes
            let stuck = !self.make_room(low_watermark, usize::MAX);
            self.flusher_stuck.store(stuck, Ordering::Release);
            self.flushed.1.notify_all();
            let mut idle = self.flush_wake.0.lock();
            // Nothing to do, or nothing it can do (all that is left is index): sleep.
            if stuck || self.memory.snapshot().total() <= low_watermark {
                self.flush_wake
                    .1
                    .wait_for(&mut idle, Duration::from_millis(10));
            }
        }
    }

    /// The DRAM use the flusher evicts down to.
    fn flusher_target(&self) -> i64 {
        (self.budget() as f64 * LOW_WATERMARK) as i64
    }

    fn stats(&self) -> Stats {
        let mem = self.memory.snapshot();
        let c = &self.dram.counters;
        let gets = self.ops.gets.get();
        let dram_hits = self.ops.dram_hits.get();
        let ssd_hits = self.ops.ssd_hits.get();
        let large_hits = self.ops.large_hits.get();
        let hits = dram_hits + large_hits + ssd_hits;
        let tally = self.dram.tally(self.now());
        let dram_objects = tally.objects.max(0) as u64;
        let (dram_clean, raw) = (tally.clean, tally.raw_bytes);
        let holding = (mem.compressed_pages + mem.hot_pages + mem.mediums).max(0) as u64;
        let ssd = self.ssd.as_ref().map(|ssd| {
            let device = ssd.device().stats();
            let c = &ssd.counters;
            let ssd_gets = c.gets.load(Ordering::Relaxed);
            let v_obj = c.v_obj.load(Ordering::Relaxed);
            let (v_host, v_nand) = (device.host_bytes_written, device.nand_bytes_written);
            let index = ssd.index_bytes();
            let leaf_bytes = ssd.leaf_bytes();
            let rates = self
                .io_rates
                .observe(Instant::now(), device.reads, device.writes);
            Stats {
                ssd_io_in_flight: device.in_flight,
                ssd_device_reads: device.reads,
                ssd_device_writes: device.writes,
                ssd_device_reads_per_sec: rates.map(|r| r.reads),
                ssd_device_writes_per_sec: rates.map(|r| r.writes),
                flusher_backlog_bytes: (mem.total() - self.flusher_target()).max(0) as u64,
                flusher_waiting_writers: self.flusher_waiting.load(Ordering::Relaxed),
                v_obj,
                v_host,
                v_nand,
                wa_host: ratio(v_host, v_obj),
                wr_nand: device.wr_nand(),
                wa: ratio(v_nand, v_obj).filter(|_| v_nand > 0),
                zeta: ratio(index, leaf_bytes),
                ssd_objects: c.objects.load(Ordering::Relaxed).max(0) as u64,
                ssd_index_bytes: index,
                ssd_leaf_bytes: leaf_bytes,
                ssd_superleaves: c.superleaves.load(Ordering::Relaxed).max(0) as u64,
                ssd_gets,
                ssd_reads: c.reads.load(Ordering::Relaxed),
                ssd_reads_per_ssd_get: ratio(c.get_reads.load(Ordering::Relaxed), ssd_gets),
                ssd_filtered_gets: c.filtered_gets.load(Ordering::Relaxed),
                ssd_evicted_superleaves: c.evicted_superleaves.load(Ordering::Relaxed),
                ssd_evicted_objects: c.evicted_objects.load(Ordering::Relaxed),
                ssd_physical_used: device.physical_used,
                ssd_logical_capacity: device.logical_capacity,
                ssd_physical_capacity: device.physical_capacity,
                checksum_failures: c.checksum_failures.load(Ordering::Relaxed),
                io_errors: c.io_errors.load(Ordering::Relaxed),
                ..Stats::default()
            }
        });
        let ssd = ssd.unwrap_or_default();
        let large_objects = self.large.as_ref().map_or(0, |lo| lo.len());
        let large_dropped = self
            .large
            .as_ref()
            .map_or(0, |lo| lo.counters.dropped.load(Ordering::Relaxed));
        let large_failures = self.large.as_ref().map_or(0, |lo| {
            lo.counters.checksum_failures.load(Ordering::Relaxed)
                + lo.counters.io_errors.load(Ordering::Relaxed)
        });
        Stats {
            // A clean DRAM object is a copy of one the SSD tier counts already.
            objects_resident: dram_objects.saturating_sub(dram_clean)
                + ssd.ssd_objects
                + large_objects,
            large_objects,
            large_dropped,
            large_hits,
            ssd_hits,
            ssd_promotions: self.ops.promotions.get(),
            ssd_hit_ratio: ratio(ssd_hits, gets).unwrap_or(0.0),
            checksum_failures: ssd.checksum_failures
                + c.corrupt_pages.load(Ordering::Relaxed)
                + large_failures,
            dram_capacity: self.capacity(),
            dram_used: mem.total().max(0) as u64,
            dram_compressed_page_bytes: mem.compressed_pages.max(0) as u64,
            dram_hot_page_bytes: mem.hot_pages.max(0) as u64,
            dram_write_buffer_bytes: mem.write_buffers.max(0) as u64,
            dram_medium_bytes: mem.mediums.max(0) as u64,
            dram_access_bytes: mem.access_tables.max(0) as u64,
            dram_index_bytes: mem.index.max(0) as u64,
            rss_bytes: crate::stats::rss_bytes(std::process::id()),
            dram_withheld_bytes: self
                .governor
                .as_ref()
                .map_or(0, |g| g.reserve().max(0) as u64),
            dram_objects,
            dram_leaves: self.dram.leaf_count(),
            hot_leaves: c.hot_leaves.load(Ordering::Relaxed).max(0) as u64,
            compression_ratio_dram: ratio(raw, holding).unwrap_or(0.0),
            gets,
            hits,
            dram_hits,
            misses: self.ops.misses.get(),
            puts: self.ops.puts.get(),
            refused_writes: self.ops.refused_writes.get(),
            deletes: self.ops.deletes.get(),
            scans: self.ops.scans.get(),
            expired: self.ops.expired.get(),
            hit_ratio: ratio(hits, gets).unwrap_or(0.0),
            dram_hit_ratio: ratio(dram_hits, gets).unwrap_or(0.0),
            merges: c.merges.load(Ordering::Relaxed),
            foreground_merges: c.foreground_merges.load(Ordering::Relaxed),
            leaf_splits: c.splits.load(Ordering::Relaxed),
            evicted_leaves: c.evicted_leaves.load(Ordering::Relaxed),
            evicted_objects: c.evicted_objects.load(Ordering::Relaxed),
            dropped_objects: c.dropped_objects.load(Ordering::Relaxed)
                + c.write_drops.load(Ordering::Relaxed)
                + ssd.ssd_evicted_objects
                + large_dropped,
            clean_dropped: c.clean_dropped.load(Ordering::Relaxed),
            retained_objects: c.retained_objects.load(Ordering::Relaxed),
            ssd_write_drops: c.write_drops.load(Ordering::Relaxed),
            ssd_async_reads: self.ops.async_ssd_reads.get(),
            ssd_reads_in_flight: self.ops.ssd_reads_in_flight.load(Ordering::Relaxed),
            dram_clean_objects: dram_clean,
            bypass_threshold: self.dram.bypass.threshold(),
            ..ssd
        }
    }
}
