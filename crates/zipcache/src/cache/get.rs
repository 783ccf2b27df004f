//! GET, on the caller's thread (`get`, `get_item`) or with its device reads in flight
//! (`get_item_async`): DRAM, then BT_LO's extent, then the SSD tier, whose hits are
//! promoted into DRAM without waiting for room.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use zipcache_device::{AlignedBuf, BlockDevice, ReadFuture};

use super::{Inner, OpCounters, ZipCache};
use crate::async_get::{Abandoned, AsyncGet};
use crate::dram::{Change, Lookup};
use crate::large_objects::{LoFinished, LoRead};
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

    /// GET that never waits for the device on the caller's thread: DRAM answers at once
    /// (the returned future is ready); when a BT_LO extent or the SSD tier must be read,
    /// the read is in flight (`BlockDevice::read_async`) and the future resolves when it
    /// completes. Same answers and guarantees as `get_item`.
    pub fn get_item_async(&self, key: &[u8], options: GetOptions) -> AsyncGet {
        let inner = &self.inner;
        if let Err(e) = inner.check_key(key) {
            return AsyncGet::ready(Err(e));
        }
        inner.ops.gets.incr();
        let now = inner.now();
        let first = inner.after_dram(key, now, options);
        // may do I/O: submitted now, so that a command's GETs are all in flight at once
        let mut reading = match inner.submit(key, first, now, options) {
            Ok(reading) => reading,
            Err(answer) => return AsyncGet::ready(Ok(answer)),
        };
        let counted = reading.is_in_flight().then(|| ReadInFlight::new(inner));
        let buffer_bytes = reading.buffer_bytes();
        let (inner, key) = (self.inner.clone(), key.to_vec());
        let abandoned = Arc::new(Abandoned::default());
        let unwanted = abandoned.clone();
        AsyncGet::reading(
            async move {
                let _counted_until_answered_or_dropped = counted;
                loop {
                    let next = inner.complete(&key, reading, now, options, &unwanted).await;
                    // may do I/O: the next read (the SSD tier's, or the key's extent again)
                    reading = match inner.submit(&key, next, now, options) {
                        Ok(reading) => reading,
                        Err(answer) => return Ok(answer),
                    };
                }
            },
            buffer_bytes,
            abandoned,
        )
    }

    /// How each tier holds `key` now — DRAM's answer, BT_LO's entry, BT_SSD's super-leaf,
    /// and every block of the device with a record of `key` —, for a test's report of a
    /// wrong answer (may do I/O: the whole super-leaf region is read).
    #[doc(hidden)]
    pub fn explain(&self, key: &[u8]) -> String {
        let inner = &self.inner;
        let mut out = format!("DRAM: {:?}", inner.dram.get(key, inner.now(), true));
        if let Some(lo) = &inner.large {
            out = format!("{out}\n{}", lo.explain(key));
        }
        if let Some(ssd) = &inner.ssd {
            out = format!("{out}\n{}", ssd.explain(key));
        }
        out
    }

    /// Whether a GET of `key` would read a large object's whole extent: BT_LO holds a live
    /// one under it (its index alone is asked: nothing is read or counted). A server asks
    /// it only when its connections' buffers are past their budget, to make large reads
    /// wait for room and let one-block reads go.
    pub fn reads_large_object(&self, key: &[u8]) -> bool {
        let now = self.inner.now();
        (self.inner.large.as_ref()).is_some_and(|lo| lo.entry(key, now).is_some())
    }

    /// Whether a GET may have to read the SSD tier: without one, `get_item` never waits
    /// for a device and `get_item_async` is always ready.
    pub fn has_ssd_tier(&self) -> bool {
        self.inner.ssd.is_some()
    }
}

/// Where a GET goes next, once DRAM was asked (`Inner::after_dram`) or a BT_LO extent
/// was read (`Inner::after_extent`).
enum Next {
    /// DRAM or the extent answered, or a miss known without a read (counted).
    Answer(Option<Item>),
    /// BT_LO holds the key: read its extent. If that finds nothing and DRAM had no
    /// version of the key (`then_ssd`), the SSD tier is next.
    Extent { read: LoRead, then_ssd: bool },
    /// The SSD tier, with the flush epoch read before it (for promotion,
    /// `lower_tiers_current`).
    Ssd { epoch: u64 },
}

/// A GET's device read, submitted (`Inner::submit`), with the bytes its buffer holds.
enum Reading {
    Extent {
        read: LoRead,
        then_ssd: bool,
        extent: ReadFuture,
        buffer_bytes: usize,
    },
    Ssd {
        read: PlannedRead,
        epoch: u64,
        block: ReadFuture,
        buffer_bytes: usize,
    },
}

impl Reading {
    fn is_in_flight(&self) -> bool {
        match self {
            Reading::Extent { extent: read, .. } | Reading::Ssd { block: read, .. } => {
                read.is_in_flight()
            }
        }
    }

    fn buffer_bytes(&self) -> usize {
        match self {
            Reading::Extent { buffer_bytes, .. } | Reading::Ssd { buffer_bytes, .. } => {
                *buffer_bytes
            }
        }
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
    abandoned: &Abandoned,
) -> Option<SsdHit> {
    loop {
        let (result, buf) = block.await;
        if abandoned.is_set() {
            return None;
        }
        match ssd.finish_get(read, key, result.is_ok().then_some(&buf[..]), now) {
            Finished::Done(hit) => return hit,
            Finished::Retry => {}
        }
        read = ssd.plan_get(key)?;
        block = ops.read_in_flight(ssd.device(), read.lba, buf);
    }
}

impl OpCounters {
    /// Submits a read of `buf.len()` blocks at `lba`, counted if it goes in flight rather
    /// than completing on this thread (no io_uring here, or every slot taken).
    fn read_in_flight(&self, device: &dyn BlockDevice, lba: u64, buf: AlignedBuf) -> ReadFuture {
        // may do I/O: the read is in flight until the future resolves
        let read = device.read_async(lba, buf);
        if read.is_in_flight() {
            self.async_ssd_reads.incr();
        }
        read
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
        collection: meta.collection,
    }
}

impl Inner {
    /// GET through the tiers in the paper's order: DRAM (buffer, page), then BT_LO's
    /// extent or one SSD read, on the calling thread.
    fn lookup(&self, key: &[u8], now: u64, options: GetOptions) -> Option<Item> {
        let mut next = self.after_dram(key, now, options);
        loop {
            next = match next {
                Next::Answer(item) => return item,
                Next::Extent { read, then_ssd } => {
                    let lo = self.large.as_ref().expect("an extent read follows BT_LO");
                    // may do I/O: the whole extent
                    let found = lo.read(read, key);
                    self.after_extent(key, found, then_ssd, now, options)
                }
                Next::Ssd { epoch } => {
                    // may do I/O: one 4 KiB read
                    let hit = self.ssd.as_ref().and_then(|ssd| ssd.get(key, now));
                    Next::Answer(self.ssd_answer(key, hit, epoch, now, options))
                }
            };
        }
    }

    /// Submits the device read `next` needs, or gives its answer if it needs none.
    fn submit(
        &self,
        key: &[u8],
        next: Next,
        now: u64,
        options: GetOptions,
    ) -> std::result::Result<Reading, Option<Item>> {
        match next {
            Next::Answer(item) => Err(item),
            Next::Extent { read, then_ssd } => {
                let lo = self.large.as_ref().expect("an extent read follows BT_LO");
                let buffer = read.buffer();
                let buffer_bytes = buffer.allocated();
                let extent = self.ops.read_in_flight(lo.device(), read.lba(), buffer);
                Ok(Reading::Extent {
                    read,
                    then_ssd,
                    extent,
                    buffer_bytes,
                })
            }
            Next::Ssd { epoch } => {
                let ssd = self.ssd.as_ref().expect("only an SSD tier defers a GET");
                let Some(read) = ssd.plan_get(key) else {
                    return Err(self.ssd_answer(key, None, epoch, now, options));
                };
                let buffer = AlignedBuf::zeroed(1);
                let buffer_bytes = buffer.allocated();
                let block = self.ops.read_in_flight(ssd.device(), read.lba, buffer);
                Ok(Reading::Ssd {
                    read,
                    epoch,
                    block,
                    buffer_bytes,
                })
            }
        }
    }

    /// Waits for the read `reading` submitted and says where the GET goes next: nowhere
    /// once `abandoned` (a miss no one sees, not counted).
    async fn complete(
        &self,
        key: &[u8],
        reading: Reading,
        now: u64,
        options: GetOptions,
        abandoned: &Abandoned,
    ) -> Next {
        match reading {
            Reading::Extent {
                read,
                then_ssd,
                extent,
                ..
            } => {
                let (result, buf) = extent.await;
                if abandoned.is_set() {
                    return Next::Answer(None);
                }
                let lo = self.large.as_ref().expect("an extent read follows BT_LO");
                let found = lo.finish_get(read, key, result.is_ok().then_some(buf));
                self.after_extent(key, found, then_ssd, now, options)
            }
            Reading::Ssd {
                read, epoch, block, ..
            } => {
                let ssd = self.ssd.as_ref().expect("an SSD read follows the SSD tier");
                let hit = finish_ssd_async(ssd, &self.ops, key, read, block, now, abandoned).await;
                if abandoned.is_set() {
                    return Next::Answer(None);
                }
                Next::Answer(self.ssd_answer(key, hit, epoch, now, options))
            }
        }
    }

    /// What DRAM answers for `key`, or which tier to read: a tombstone hides small
    /// versions, but a large one may stand behind it (BT_LO); with no version in DRAM at
    /// all, BT_LO and then the SSD tier may hold one.
    fn after_dram(&self, key: &[u8], now: u64, options: GetOptions) -> Next {
        let then_ssd = match self.dram.get(key, now, options.peek) {
            Lookup::Found(value, meta, access) => {
                self.ops.dram_hits.incr();
                return Next::Answer(Some(Item {
                    access,
                    ..item_of(value, &meta)
                }));
            }
            Lookup::Expired => {
                self.ops.expired.incr();
                return self.miss();
            }
            // `get` reads values whole (`Wanted::Value`); a live value left sealed would
            // still hide every older version below it.
            Lookup::Sealed(..) => return self.miss(),
            Lookup::Deleted => false,
            Lookup::Absent => self.ssd.is_some(),
        };
        match self.large.as_ref().and_then(|lo| lo.plan_get(key, now)) {
            Some(read) => Next::Extent { read, then_ssd },
            None => self.below_large(then_ssd),
        }
    }

    /// Where a GET goes once its extent was read: the large object's value; the tiers
    /// below BT_LO if the extent held none; or DRAM again if the key was overwritten or
    /// deleted (or the extent left the log) during the read, which may have found an
    /// older value.
    fn after_extent(
        &self,
        key: &[u8],
        found: LoFinished,
        then_ssd: bool,
        now: u64,
        options: GetOptions,
    ) -> Next {
        match found {
            LoFinished::Done(Some((value, meta))) => {
                self.ops.large_hits.incr();
                Next::Answer(Some(item_of(value, &meta)))
            }
            LoFinished::Done(None) => self.below_large(then_ssd),
            LoFinished::Moved => self.after_dram(key, now, options),
        }
    }

    /// Past BT_LO: the SSD tier if DRAM had no version of the key, else a miss.
    fn below_large(&self, then_ssd: bool) -> Next {
        if then_ssd {
            Next::Ssd {
                epoch: self.flush_epoch.load(Ordering::SeqCst),
            }
        } else {
            self.miss()
        }
    }

    fn miss(&self) -> Next {
        self.ops.misses.incr();
        Next::Answer(None)
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
    ///
    /// Never waits for room: a GET runs on a server's runtime thread, which must not
    /// block on the flusher. Past the budget the flusher is woken; far past it
    /// (`room_for_promotion`) the object stays on the SSD only.
    fn promote(&self, key: &[u8], hit: SsdHit, epoch: u64, access: Option<AccessState>, now: u64) {
        let ssd = self.ssd.as_ref().expect("promote follows an SSD hit");
        if self.promotion.as_ref().is_some_and(|f| !f.admit(key)) {
            return;
        }
        if !self.room_for_promotion() {
            self.ops.promotions_skipped.incr();
            self.wake_flusher();
            return;
        }
        let promoted = self.dram.modify(key, now, |current, _| {
            let fresh = current == Lookup::Absent
                && ssd.still_current(&hit.proof)
                && self.lower_tiers_current(epoch);
            let change = fresh.then_some(Change::Put((
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
        self.wake_flusher_if_over_budget();
    }
}
