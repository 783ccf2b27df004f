//! `ZipCache`: the public engine. It validates requests, routes them through the tiers in
//! the paper's order (§3.4), and runs the background threads (write-buffer merges,
//! eviction down to the low watermark, compression-bypass passes).

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use parking_lot::Mutex;

use crate::counters::Counter;
use crate::dram_tier::{DramLeaf, DramSettings, DramTier, Lookup};
use crate::memory::Memory;
use crate::record::Meta;
use crate::stats::ratio;
use crate::{Config, Error, Item, PutOptions, Result, Stats, Update};

/// Background eviction keeps DRAM below this fraction of the budget, so foreground
/// writers rarely have to evict themselves.
const LOW_WATERMARK: f64 = 0.985;
/// How often the bypass pass re-ranks leaves.
const BYPASS_PERIOD: Duration = Duration::from_millis(100);

#[derive(Default)]
struct OpCounters {
    gets: Counter,
    dram_hits: Counter,
    misses: Counter,
    expired: Counter,
    puts: Counter,
    deletes: Counter,
    scans: Counter,
}

pub(crate) struct Inner {
    config: Config,
    memory: Arc<Memory>,
    pub(crate) dram: DramTier,
    ops: OpCounters,
    next_cas: AtomicU64,
    shutdown: AtomicBool,
}

/// A hybrid DRAM/SSD key-value cache. `Send + Sync`: share it between threads by `Arc`
/// or by reference.
pub struct ZipCache {
    pub(crate) inner: Arc<Inner>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl ZipCache {
    pub fn open(config: Config) -> Result<ZipCache> {
        config.validate()?;
        let memory = Arc::new(Memory::default());
        let (merge_tx, merge_rx) = crossbeam_channel::unbounded();
        let settings = DramSettings {
            leaf_size: config.leaf_size,
            subpages: config.subpages,
            write_buffer: config.write_buffer,
            tiny_max: config.tiny_max,
            dram_capacity: config.dram_capacity,
            bypass_max_fraction: config.bypass_max_fraction,
            keep_tombstones: false,
        };
        let dram = DramTier::new(settings, memory.clone(), merge_tx, config.bypass_r);
        // CAS versions start from the clock so a restarted cache never reissues one a
        // client may still hold.
        let next_cas = AtomicU64::new(config.clock.now_ms().max(1) << 16);
        let inner = Arc::new(Inner {
            config,
            memory,
            dram,
            ops: OpCounters::default(),
            next_cas,
            shutdown: AtomicBool::new(false),
        });
        let workers = (0..inner.config.background_threads)
            .map(|i| {
                let inner = inner.clone();
                let rx = merge_rx.clone();
                std::thread::Builder::new()
                    .name(format!("zipcache-bg-{i}"))
                    .spawn(move || inner.background(rx, i == 0))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(ZipCache {
            inner,
            workers: Mutex::new(workers),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The engine clock, Unix milliseconds; expiries are absolute times on it.
    pub fn now_ms(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.get_item(key)?.map(|item| item.value))
    }

    pub fn get_item(&self, key: &[u8]) -> Result<Option<Item>> {
        let inner = &self.inner;
        inner.check_key(key)?;
        inner.ops.gets.incr();
        let found = inner.lookup(key, inner.now());
        match &found {
            Some(_) => inner.ops.dram_hits.incr(),
            None => inner.ops.misses.incr(),
        }
        Ok(found)
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
        inner.ops.puts.incr();
        let meta = inner.meta(&options);
        inner.dram.put(key, value, meta, inner.now());
        inner.relieve_pressure();
        Ok(meta.cas)
    }

    /// Deletes `key`; true if a live value was there.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        let inner = &self.inner;
        inner.check_key(key)?;
        inner.ops.deletes.incr();
        let existed = matches!(inner.dram.delete(key, inner.now()), Lookup::Found(..));
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
        let outcome = inner.dram.modify(key, now, |current| {
            let current = match current {
                Lookup::Found(value, meta) => Some(item_of(value, &meta)),
                Lookup::Deleted | Lookup::Expired | Lookup::Absent => None,
            };
            let (update, result) = f(current.as_ref());
            match update {
                Update::Keep => (None, Ok((result, None))),
                Update::Delete if current.is_none() => (None, Ok((result, None))),
                Update::Delete => (Some(None), Ok((result, None))),
                Update::Put { value, options } => match inner.check_value(&value) {
                    Err(e) => (None, Err(e)),
                    Ok(()) => {
                        let meta = inner.meta(&options);
                        (Some(Some((value, meta))), Ok((result, Some(meta.cas))))
                    }
                },
            }
        });
        inner.relieve_pressure();
        outcome
    }

    /// Live objects with keys in `range`, in key order, at most `limit` of them.
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
        while out.len() < limit {
            let (entries, next) = inner.dram.scan_leaf(&cursor, end, now);
            for (key, version) in entries {
                if let Some((value, meta)) = version {
                    out.push((key, item_of(value, &meta)));
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

    /// Forgets every object.
    pub fn flush_all(&self) -> Result<()> {
        self.inner.dram.clear();
        Ok(())
    }

    /// Tunes adaptive compression bypassing while running (`0` turns it off).
    pub fn set_bypass_r(&self, r: f64) {
        self.inner.dram.bypass.set_r(r);
    }

    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Stops the background threads and merges pending writes.
    pub fn close(self) -> Result<()> {
        self.stop();
        self.inner.dram.merge_all(self.inner.now());
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

fn item_of(value: Vec<u8>, meta: &Meta) -> Item {
    Item {
        value,
        flags: meta.flags,
        cas: meta.cas,
        expires_at_ms: meta.expires_at_ms,
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
        let cas = if options.assign_cas {
            self.next_cas.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        Meta {
            expires_at_ms: options.expires_at_ms,
            flags: options.flags,
            cas,
            clean: false,
        }
    }

    fn lookup(&self, key: &[u8], now: u64) -> Option<Item> {
        match self.dram.get(key, now) {
            Lookup::Found(value, meta) => Some(item_of(value, &meta)),
            Lookup::Expired => {
                self.ops.expired.incr();
                None
            }
            Lookup::Deleted | Lookup::Absent => None,
        }
    }

    /// Memory back-pressure: a writer that pushed DRAM past its budget evicts until it is
    /// back under it (the background thread normally keeps it below the low watermark).
    fn relieve_pressure(&self) {
        let capacity = self.config.dram_capacity as i64;
        let mut attempts = 0;
        while self.memory.snapshot().total() > capacity && attempts < 64 {
            if !self.dram.evict_one(None, self.now()) {
                break;
            }
            attempts += 1;
        }
    }

    fn background(&self, merges: Receiver<Arc<DramLeaf>>, housekeeper: bool) {
        let low_watermark = (self.config.dram_capacity as f64 * LOW_WATERMARK) as i64;
        let mut last_bypass = Instant::now();
        while !self.shutdown.load(Ordering::Acquire) {
            match merges.recv_timeout(Duration::from_millis(10)) {
                Ok(leaf) => self.dram.merge(&leaf, self.now()),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            while self.memory.snapshot().total() > low_watermark
                && !self.shutdown.load(Ordering::Relaxed)
            {
                if !self.dram.evict_one(None, self.now()) {
                    break;
                }
            }
            if housekeeper && last_bypass.elapsed() >= BYPASS_PERIOD {
                last_bypass = Instant::now();
                self.dram.bypass_pass();
            }
        }
    }

    fn stats(&self) -> Stats {
        let mem = self.memory.snapshot();
        let c = &self.dram.counters;
        let gets = self.ops.gets.get();
        let dram_hits = self.ops.dram_hits.get();
        let hits = dram_hits;
        let dram_objects = c.objects.load(Ordering::Relaxed).max(0) as u64;
        let raw = c.raw_bytes.load(Ordering::Relaxed).max(0) as u64;
        let holding = (mem.compressed_pages + mem.hot_pages + mem.mediums).max(0) as u64;
        Stats {
            dram_capacity: self.config.dram_capacity,
            dram_used: mem.total().max(0) as u64,
            dram_compressed_page_bytes: mem.compressed_pages.max(0) as u64,
            dram_hot_page_bytes: mem.hot_pages.max(0) as u64,
            dram_write_buffer_bytes: mem.write_buffers.max(0) as u64,
            dram_medium_bytes: mem.mediums.max(0) as u64,
            dram_index_bytes: mem.index.max(0) as u64,
            objects_resident: dram_objects,
            dram_objects,
            dram_leaves: self.dram.leaf_count(),
            hot_leaves: c.hot_leaves.load(Ordering::Relaxed).max(0) as u64,
            compression_ratio_dram: ratio(raw, holding).unwrap_or(0.0),
            gets,
            hits,
            dram_hits,
            misses: self.ops.misses.get(),
            puts: self.ops.puts.get(),
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
            bypass_threshold: self.dram.bypass.threshold(),
            checksum_failures: c.corrupt_pages.load(Ordering::Relaxed),
            ..Stats::default()
        }
    }
}
