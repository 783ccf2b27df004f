//! GET, on the caller's thread (`get`, `get_item`) or with the SSD read in flight
//! (`get_item_async`): DRAM and BT_LO first, then the SSD tier, whose hits are promoted
//! into DRAM.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use zipcache_device::{AlignedBuf, ReadFuture};

use super::{Inner, OpCounters, ZipCache};
use crate::async_get::AsyncGet;
use crate::dram::Lookup;
use crate::record::Meta;
use crate::ssd::{Finished, PlannedRead, SsdHit, SsdTier};
use crate::{AccessState, GetOptions, Item, Result};

impl ZipCache {
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
}

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

pub(super) fn item_of(value: Vec<u8>, meta: &Meta) -> Item {
    Item {
        value,
        flags: meta.flags,
        cas: meta.cas,
        expires_at_ms: meta.expires_at_ms,
        access: None,
    }
}

impl Inner {
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

    pub(super) fn large_get(&self, key: &[u8], now: u64) -> Option<Item> {
        let (value, meta) = self.large.as_ref()?.get(key, now)?;
        self.ops.large_hits.incr();
        Some(item_of(value, &meta))
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
}
