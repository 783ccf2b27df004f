//! BT_SSD, the SSD tier (paper §3.3).
//!
//! The same [`BTree`] as BT_DRAM, with leaves that are super-leaf descriptors: the leaf's
//! key range and where its `m` 4 KiB sub-pages sit on the device. Inner nodes and
//! descriptors stay in DRAM; records live on the SSD.
//!
//! * Intra-page object hashing: an object's sub-page is `g(key) mod m`, so a GET reads
//!   exactly one 4 KiB block whatever the super-leaf size, and an eviction rewrites only
//!   the sub-pages its objects hash to.
//! * Sub-page under-filling: no sub-page holds more than `T × 4 KiB`; a merge that would
//!   push one past it splits the super-leaf instead. The unused rest of every block is
//!   zeros, which the SSD's transparent compression removes.
//! * Page-based eviction lands here as [`EvictionSink::absorb`]: one DRAM leaf's objects
//!   merge into the one or few super-leaves covering its key range. Clean objects (read
//!   from the SSD and unchanged since) are not written again.
//! * When the device runs short of free slots or physical space, whole cold super-leaves
//!   leave (CLOCK over super-leaves, referenced by SSD hits), are trimmed, and hand their
//!   key range to their left neighbour.
//!
//! Writers (eviction merges, splits, super-leaf eviction) are serialized by one mutex:
//! they are bound by the device, and one writer keeps slot allocation and the tree's
//! structure simple. Readers take only the super-leaf's read lock.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use zipcache_device::{AlignedBuf, BLOCK_SIZE, BatchRead, BatchWrite, BlockDevice};

use crate::btree::{BTree, Fence, KeyRange, Ranged};
use crate::config::Clock;
use crate::dram::{ScanEntry, separator};
use crate::eviction::{EvictedObject, EvictionSink};
use crate::leaf_page::Geometry;
use crate::memory::{Memory, alloc_size};
use crate::record::{Meta, Payload, Record};
use crate::sealed_file::{self, Fields, IndexFile};
use crate::ssd_block::{self, Owner, PAYLOAD};
use crate::subpage_hash::ssd_subpage;

/// Free slots kept before merging into a super-leaf: a DRAM leaf's objects rarely split
/// one super-leaf more than two ways.
const SLOTS_PER_MERGE: usize = 4;
/// Start evicting super-leaves when physical use passes this share of the device.
const PHYSICAL_HIGH: f64 = 0.90;
/// ... and stop when it is back under this one.
const PHYSICAL_LOW: f64 = 0.85;

/// A key's newest SSD version, with what is needed to check later that it is still the
/// newest (see `ZipCache` inclusive caching).
pub struct SsdHit {
    pub value: Vec<u8>,
    pub meta: Meta,
    pub proof: Freshness,
}

/// Where a GET will find `key`'s block, planned under the super-leaf's lock
/// ([`SsdTier::plan_get`]).
pub struct PlannedRead {
    pub lba: u64,
    owner: Owner,
    proof: Freshness,
}

/// How [`SsdTier::finish_get`] ended.
pub enum Finished {
    Done(Option<SsdHit>),
    /// The block changed hands while it was read: plan again.
    Retry,
}

/// The super-leaf a value was read from and its version at the time.
pub struct Freshness {
    leaf: Arc<SuperLeaf>,
    version: u64,
}

struct SlState {
    range: KeyRange,
    /// Where the sub-pages live (`slot × m` is the first LBA); `None` while empty.
    slot: Option<u32>,
    generation: u32,
    /// Objects in each sub-page; 0 means the block holds nothing (and is not read).
    counts: Box<[u16]>,
    /// Bumped by every write to this super-leaf.
    version: u64,
}

impl Ranged for SlState {
    fn range(&mut self) -> &mut KeyRange {
        &mut self.range
    }
}

pub struct SuperLeaf {
    state: RwLock<SlState>,
    referenced: AtomicBool,
}

impl SuperLeaf {
    fn new(state: SlState) -> Arc<Self> {
        Arc::new(SuperLeaf {
            state: RwLock::new(state),
            referenced: AtomicBool::new(true),
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub struct SsdSettings {
    /// Sub-pages per super-leaf (`m`).
    pub subpages: usize,
    /// Under-filling threshold `T`.
    pub fill_threshold: f64,
    /// Blocks of the device (from LBA 0) that hold super-leaves.
    pub blocks: u64,
}

#[derive(Debug, Default)]
pub struct SsdCounters {
    pub v_obj: AtomicU64,
    pub gets: AtomicU64,
    pub reads: AtomicU64,
    /// Reads made by GETs (the paper's promise: at most one per GET).
    pub get_reads: AtomicU64,
    pub hits: AtomicU64,
    pub checksum_failures: AtomicU64,
    pub io_errors: AtomicU64,
    pub splits: AtomicU64,
    pub evicted_superleaves: AtomicU64,
    /// Objects forgotten to make room: in evicted super-leaves, or left without a slot.
    pub evicted_objects: AtomicU64,
    pub objects: AtomicI64,
    pub superleaves: AtomicI64,
    pub occupied: AtomicI64,
}

struct Writer {
    free_slots: Vec<u32>,
    next_slot: u32,
    /// Low fence of the super-leaf the CLOCK hand points at.
    hand: Fence,
}

pub struct SsdTier {
    device: Arc<dyn BlockDevice>,
    tree: BTree<Arc<SuperLeaf>>,
    geometry: Geometry,
    settings: SsdSettings,
    max_slots: u32,
    /// Payload bytes a sub-page may hold under `T`.
    fill_limit: usize,
    writer: Mutex<Writer>,
    memory: Arc<Memory>,
    clock: Arc<dyn Clock>,
    pub counters: SsdCounters,
}

/// DRAM one super-leaf descriptor takes besides its tree entry.
fn descriptor_bytes(subpages: usize) -> usize {
    alloc_size(size_of::<SuperLeaf>() + 16) + alloc_size(subpages * 2)
}

thread_local! {
    static BLOCK: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::zeroed(1));
}

type Contents = BTreeMap<Vec<u8>, (Vec<u8>, Meta)>;
/// An object on its way into a super-leaf: key, value and metadata.
type Object = (Vec<u8>, (Vec<u8>, Meta));

impl SsdTier {
    pub fn new(
        device: Arc<dyn BlockDevice>,
        settings: SsdSettings,
        memory: Arc<Memory>,
        clock: Arc<dyn Clock>,
    ) -> SsdTier {
        let m = settings.subpages;
        let first = SuperLeaf::new(SlState {
            range: KeyRange::everything(),
            slot: None,
            generation: 0,
            counts: vec![0; m].into_boxed_slice(),
            version: 0,
        });
        let max_slots = u32::try_from(settings.blocks / m as u64).unwrap_or(u32::MAX);
        let fill_limit = ((settings.fill_threshold * BLOCK_SIZE as f64) as usize)
            .saturating_sub(ssd_block::HEADER)
            .min(PAYLOAD);
        let tier = SsdTier {
            device,
            tree: BTree::new(first),
            geometry: Geometry {
                subpages: m,
                subpage_size: PAYLOAD,
                fill_limit,
                hash: ssd_subpage,
            },
            settings,
            max_slots,
            fill_limit,
            writer: Mutex::new(Writer {
                free_slots: Vec::new(),
                next_slot: 0,
                hand: Fence::from(&[][..]),
            }),
            memory,
            clock,
            counters: SsdCounters::default(),
        };
        tier.counters.superleaves.store(1, Ordering::Relaxed);
        tier.memory
            .change_index(tier.tree.node_bytes() as i64 + descriptor_bytes(m) as i64);
        tier
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// DRAM held by BT_SSD: inner nodes and super-leaf descriptors.
    pub fn index_bytes(&self) -> u64 {
        let leaves = self.counters.superleaves.load(Ordering::Relaxed).max(0) as u64;
        self.tree.node_bytes() + leaves * descriptor_bytes(self.settings.subpages) as u64
    }

    /// SSD bytes of the super-leaves that hold data.
    pub fn leaf_bytes(&self) -> u64 {
        self.counters.occupied.load(Ordering::Relaxed).max(0) as u64
            * (self.settings.subpages * BLOCK_SIZE) as u64
    }

    fn lba(&self, slot: u32, subpage: usize) -> u64 {
        u64::from(slot) * self.settings.subpages as u64 + subpage as u64
    }

    /// The records of `subpages`, read with every read in flight at once; `None` for a
    /// sub-page whose block could not be read or checked (counted), so that what it holds
    /// is unknown (a writer must then replace the block, not keep it).
    fn contents_of(&self, st: &SlState, subpages: &[usize]) -> Vec<Option<Contents>> {
        let mut out: Vec<Option<Contents>> = subpages
            .iter()
            .map(|&s| (st.counts[s] == 0).then(Contents::new))
            .collect();
        let Some(slot) = st.slot else { return out };
        let wanted: Vec<usize> = (0..subpages.len()).filter(|&i| out[i].is_none()).collect();
        if wanted.is_empty() {
            return out;
        }
        let mut blocks = AlignedBuf::zeroed(wanted.len());
        let mut reads: Vec<BatchRead<'_>> = wanted
            .iter()
            .zip(blocks.chunks_mut(BLOCK_SIZE))
            .map(|(&i, buf)| BatchRead {
                lba: self.lba(slot, subpages[i]),
                buf,
            })
            .collect();
        // may do I/O: every read in flight at once
        let results = self.device.read_batch(&mut reads);
        drop(reads);
        for ((&i, result), block) in wanted.iter().zip(results).zip(blocks.chunks(BLOCK_SIZE)) {
            self.counters.reads.fetch_add(1, Ordering::Relaxed);
            if result.is_err() {
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let owner = Owner {
                superleaf: slot,
                generation: st.generation,
                subpage: subpages[i] as u16,
            };
            match ssd_block::open(block, owner) {
                Some(records) => {
                    out[i] = Some(
                        records
                            .filter_map(|r| match r.payload {
                                Payload::Inline(v) => Some((r.key.to_vec(), (v.to_vec(), r.meta))),
                                Payload::Medium(_) | Payload::Tombstone => None,
                            })
                            .collect(),
                    )
                }
                None => {
                    self.counters
                        .checksum_failures
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        out
    }

    /// The newest SSD version of `key`: at most one 4 KiB read, on the calling thread.
    pub fn get(&self, key: &[u8], now_ms: u64) -> Option<SsdHit> {
        loop {
            let read = self.plan_get(key)?;
            let found = BLOCK.with(|block| {
                let mut block = block.borrow_mut();
                let ok = self.device.read(read.lba, &mut block).is_ok();
                self.finish_get(read, key, ok.then_some(&block[..]), now_ms)
            });
            if let Finished::Done(hit) = found {
                return hit;
            }
        }
    }

    /// The first half of a GET, under the super-leaf's read lock: which block holds `key`
    /// if the SSD has it, `None` if its sub-page is empty. The read itself happens
    /// without the lock (on this thread or in flight); `finish_get` then checks that the
    /// block is still the one planned.
    pub fn plan_get(&self, key: &[u8]) -> Option<PlannedRead> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        loop {
            let (_, leaf) = self.tree.find(key);
            let st = leaf.state.read();
            if !st.range.owns(key) {
                continue;
            }
            let subpage = self.geometry.subpage_of(key);
            let slot = st.slot.filter(|_| st.counts[subpage] > 0)?;
            self.counters.get_reads.fetch_add(1, Ordering::Relaxed);
            self.counters.reads.fetch_add(1, Ordering::Relaxed);
            let owner = Owner {
                superleaf: slot,
                generation: st.generation,
                subpage: subpage as u16,
            };
            let version = st.version;
            drop(st);
            return Some(PlannedRead {
                lba: self.lba(slot, subpage),
                owner,
                proof: Freshness { leaf, version },
            });
        }
    }

    /// The second half of a GET: finds `key` in the block read for `read` (`None` if the
    /// read failed). A block that is not what the super-leaf wrote means a writer replaced
    /// it since the plan (`Retry`), unless the super-leaf is unchanged: then it is damage.
    /// A block that passes the owner check is the super-leaf's content at some moment after
    /// the plan, so what it holds is no older than what the GET could have read under the
    /// lock; the proof stays the planned version, so promotion refuses it if it moved.
    pub fn finish_get(
        &self,
        read: PlannedRead,
        key: &[u8],
        block: Option<&[u8]>,
        now_ms: u64,
    ) -> Finished {
        let Some(block) = block else {
            self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
            return Finished::Done(None);
        };
        let Some(records) = ssd_block::open(block, read.owner) else {
            if !self.still_current(&read.proof) {
                return Finished::Retry;
            }
            self.counters
                .checksum_failures
                .fetch_add(1, Ordering::Relaxed);
            return Finished::Done(None);
        };
        let found = records
            .filter(|r| r.key == key)
            .find_map(|r| match r.payload {
                Payload::Inline(v) => Some((v.to_vec(), r.meta)),
                Payload::Medium(_) | Payload::Tombstone => None,
            });
        let Some((value, meta)) = found.filter(|(_, meta)| !meta.expired(now_ms)) else {
            return Finished::Done(None);
        };
        read.proof.leaf.referenced.store(true, Ordering::Relaxed);
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        Finished::Done(Some(SsdHit {
            value,
            meta,
            proof: read.proof,
        }))
    }

    /// Whether nothing was written to the super-leaf since the value was read.
    pub fn still_current(&self, proof: &Freshness) -> bool {
        let st = proof.leaf.state.read();
        !st.range.retired && st.version == proof.version
    }

    /// SSD entries with keys in `[cursor, end)` from the super-leaf holding `cursor`,
    /// where the next super-leaf starts, and the proof to check later that nothing was
    /// written to it since.
    pub fn scan_leaf(
        &self,
        cursor: &[u8],
        end: Bound<&[u8]>,
        now_ms: u64,
    ) -> (Vec<ScanEntry>, Option<Fence>, Freshness) {
        loop {
            let (_, leaf) = self.tree.find(cursor);
            let st = leaf.state.read();
            if !st.range.owns(cursor) {
                continue;
            }
            let mut all = Contents::new();
            let every: Vec<usize> = (0..self.settings.subpages).collect();
            // An unreadable sub-page: its keys are misses (counted).
            for mut contents in self.contents_of(&st, &every).into_iter().flatten() {
                all.append(&mut contents);
            }
            let range = (Bound::Included(cursor), end);
            let entries = all
                .into_iter()
                .filter(|(k, (_, meta))| {
                    std::ops::RangeBounds::contains(&range, k.as_slice()) && !meta.expired(now_ms)
                })
                .map(|(k, v)| (k, Some(v)))
                .collect();
            let proof = Freshness {
                leaf: leaf.clone(),
                version: st.version,
            };
            return (entries, st.range.high.clone(), proof);
        }
    }

    /// Merges one group of evicted objects (all inside `leaf`'s range) into `leaf`.
    fn merge_into(&self, w: &mut Writer, st: &mut SlState, batch: &[&EvictedObject], now_ms: u64) {
        let mut by_subpage: BTreeMap<usize, Vec<&EvictedObject>> = BTreeMap::new();
        for o in batch {
            by_subpage
                .entry(self.geometry.subpage_of(&o.key))
                .or_default()
                .push(o);
        }
        let mut touched: BTreeMap<usize, Contents> = BTreeMap::new();
        let mut overflow = false;
        let mut appending = true;
        let subpages: Vec<usize> = by_subpage.keys().copied().collect();
        let read = self.contents_of(st, &subpages);
        for ((&s, objs), read) in by_subpage.iter().zip(read) {
            // An unreadable block may hold versions that the batch's tombstones and new
            // versions must hide: it is replaced (by what the batch brings) whatever happens.
            let (mut contents, unreadable) = match read {
                Some(contents) => (contents, false),
                None => (Contents::new(), true),
            };
            let before = contents.len();
            let first_new = objs.iter().map(|o| o.key.as_slice()).min();
            appending &= contents
                .keys()
                .next_back()
                .is_none_or(|last| first_new.is_none_or(|f| f > last.as_slice()));
            let mut changed = unreadable;
            for o in objs {
                match &o.value {
                    // Too big for any sub-page: it cannot be kept, and no older copy may stay.
                    Some(v) if record_len(&o.key, v, &o.meta) > PAYLOAD => {
                        changed |= contents.remove(&o.key).is_some()
                    }
                    Some(v) => {
                        contents.insert(
                            o.key.clone(),
                            (
                                v.clone(),
                                Meta {
                                    clean: false,
                                    ..o.meta
                                },
                            ),
                        );
                        changed = true;
                    }
                    None => changed |= contents.remove(&o.key).is_some(),
                }
            }
            contents.retain(|_, (_, meta)| !meta.expired(now_ms));
            changed |= contents.len() != before;
            if !changed {
                continue;
            }
            if payload_len(&contents) > self.fill_limit && contents.len() > 1 {
                overflow = true;
            }
            touched.insert(s, contents);
        }
        if touched.is_empty() {
            return;
        }
        if overflow {
            self.split(w, st, touched, appending, now_ms);
            return;
        }
        if st.slot.is_none() {
            match self.allocate(w) {
                Some(slot) => {
                    st.slot = Some(slot);
                    st.generation = st.generation.wrapping_add(1);
                    self.counters.occupied.fetch_add(1, Ordering::Relaxed);
                }
                // No room even after evicting: these objects are forgotten (a miss later).
                None => {
                    let objects = touched.values().map(|c| c.len() as u64).sum();
                    self.counters
                        .evicted_objects
                        .fetch_add(objects, Ordering::Relaxed);
                    return;
                }
            }
        }
        let pages: Vec<(usize, &Contents)> = touched.iter().map(|(&s, c)| (s, c)).collect();
        self.write_subpages(st, &pages);
        st.version += 1;
    }

    /// Writes (or, when empty, trims) sub-pages of a super-leaf that has a slot, every
    /// write in flight at once.
    fn write_subpages(&self, st: &mut SlState, pages: &[(usize, &Contents)]) {
        let Some(slot) = st.slot else { return };
        let mut blocks = AlignedBuf::zeroed(pages.len());
        let mut ok = vec![false; pages.len()];
        let mut batch = Vec::new();
        for ((i, &(s, contents)), block) in
            pages.iter().enumerate().zip(blocks.chunks_mut(BLOCK_SIZE))
        {
            let lba = self.lba(slot, s);
            if contents.is_empty() {
                ok[i] = self.device.trim(lba, 1).is_ok();
                continue;
            }
            let owner = Owner {
                superleaf: slot,
                generation: st.generation,
                subpage: s as u16,
            };
            let records = contents.iter().map(|(k, (v, meta))| Record {
                key: k,
                payload: Payload::Inline(v),
                meta: *meta,
            });
            if ssd_block::seal(block, owner, records) {
                let buf: &[u8] = block;
                batch.push((i, BatchWrite { lba, buf }));
            }
        }
        let (index, writes): (Vec<usize>, Vec<BatchWrite<'_>>) = batch.into_iter().unzip();
        // may do I/O: every write in flight at once
        for (i, result) in index.into_iter().zip(self.device.write_batch(&writes)) {
            ok[i] = result.is_ok();
        }
        for (&(s, contents), ok) in pages.iter().zip(ok) {
            let old_count = i64::from(st.counts[s]);
            let new_count = if ok { contents.len() } else { 0 };
            if !ok {
                // The block's content is now unknown: forget it rather than risk serving
                // an older version from it.
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                let _ = self.device.trim(self.lba(slot, s), 1);
            }
            st.counts[s] = new_count as u16;
            self.counters
                .objects
                .fetch_add(new_count as i64 - old_count, Ordering::Relaxed);
        }
    }

    /// Rebuilds an over-full super-leaf as two or more, each within `T`.
    /// `appending`: every new key sorts after every key the super-leaf held.
    fn split(
        &self,
        w: &mut Writer,
        st: &mut SlState,
        touched: BTreeMap<usize, Contents>,
        appending: bool,
        now_ms: u64,
    ) {
        self.counters.splits.fetch_add(1, Ordering::Relaxed);
        let mut all = Contents::new();
        for c in touched.values() {
            all.extend(c.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let untouched: Vec<usize> = (0..self.settings.subpages)
            .filter(|s| !touched.contains_key(s))
            .collect();
        // Unreadable: its objects are forgotten; the rewrite under a new generation leaves
        // no block of the old layout readable.
        for mut contents in self.contents_of(st, &untouched).into_iter().flatten() {
            all.append(&mut contents);
        }
        all.retain(|_, (_, meta)| !meta.expired(now_ms));
        let objs: Vec<Object> = all.into_iter().collect();
        let chunks = self.partition(&objs, appending);
        let old_high = st.range.high.take();
        let fences: Vec<Fence> = chunks
            .windows(2)
            .map(|p| separator(&objs[p[0].1 - 1].0, &objs[p[1].0].0))
            .collect();
        // The first chunk stays in this super-leaf, rewritten whole under a new generation
        // so that no block of the old layout can be mistaken for the new one.
        st.generation = st.generation.wrapping_add(1);
        st.range.high = fences.first().cloned().or_else(|| old_high.clone());
        self.rewrite(w, st, &objs[chunks[0].0..chunks[0].1]);
        st.version += 1;
        for (i, &(start, end)) in chunks.iter().enumerate().skip(1) {
            let mut nst = SlState {
                range: KeyRange::new(
                    fences[i - 1].clone(),
                    fences.get(i).cloned().or_else(|| old_high.clone()),
                ),
                slot: None,
                generation: 0,
                counts: vec![0; self.settings.subpages].into_boxed_slice(),
                version: 0,
            };
            self.rewrite(w, &mut nst, &objs[start..end]);
            let low = nst.range.low.clone();
            let delta = self.tree.insert(low, SuperLeaf::new(nst));
            self.counters.superleaves.fetch_add(1, Ordering::Relaxed);
            self.memory
                .change_index(delta + descriptor_bytes(self.settings.subpages) as i64);
        }
    }

    /// Writes `objs` as the whole content of a super-leaf, allocating a slot if needed.
    fn rewrite(&self, w: &mut Writer, st: &mut SlState, objs: &[Object]) {
        let mut per_subpage: Vec<Contents> = vec![Contents::new(); self.settings.subpages];
        for (k, v) in objs {
            per_subpage[self.geometry.subpage_of(k)].insert(k.clone(), v.clone());
        }
        if st.slot.is_none() && !objs.is_empty() {
            match self.allocate(w) {
                Some(slot) => {
                    st.slot = Some(slot);
                    self.counters.occupied.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    self.counters
                        .evicted_objects
                        .fetch_add(objs.len() as u64, Ordering::Relaxed);
                    return;
                }
            }
        }
        let pages: Vec<(usize, &Contents)> = per_subpage
            .iter()
            .enumerate()
            .filter(|(s, contents)| !contents.is_empty() || st.counts[*s] != 0)
            .collect();
        self.write_subpages(st, &pages);
    }

    /// Cuts sorted objects into runs whose sub-pages all stay within `T`: in halves, so
    /// that both sides have room for the inserts to come, or, when keys arrive in
    /// ascending order, as full as each run gets, since no insert will come back to it.
    fn partition(&self, objs: &[Object], appending: bool) -> Vec<(usize, usize)> {
        let len = |(k, (v, meta)): &Object| record_len(k, v, meta);
        let fits = |r: &[Object]| {
            self.geometry
                .fits(r.iter().map(|o| (o.0.as_slice(), len(o))))
        };
        let mut out = Vec::new();
        let mut pending = vec![(0, objs.len())];
        while let Some((start, end)) = pending.pop() {
            if end - start <= 1 || fits(&objs[start..end]) {
                out.push((start, end));
            } else {
                let mut mid = (start + end) / 2;
                if appending {
                    mid = start + 1;
                    while mid < end && fits(&objs[start..=mid]) {
                        mid += 1;
                    }
                }
                pending.push((mid, end));
                pending.push((start, mid));
            }
        }
        out
    }

    /// A free slot, if any is left (see `reserve`).
    fn allocate(&self, w: &mut Writer) -> Option<u32> {
        if let Some(slot) = w.free_slots.pop() {
            return Some(slot);
        }
        (w.next_slot < self.max_slots).then(|| {
            w.next_slot += 1;
            w.next_slot - 1
        })
    }

    /// Evicts cold super-leaves until `n` slots are free. Called with no super-leaf
    /// locked: the victim could be the very super-leaf about to be written.
    fn reserve(&self, w: &mut Writer, n: usize) {
        let free = |w: &Writer| w.free_slots.len() + (self.max_slots - w.next_slot) as usize;
        let mut attempts = self.tree.leaf_count() + 1;
        while free(w) < n && attempts > 0 && self.evict_one(w) {
            attempts -= 1;
        }
    }

    /// Frees physical space when the emulated SSD passes its high watermark.
    fn relieve_physical(&self, w: &mut Writer) {
        let stats = self.device.stats();
        if stats.physical_capacity == 0 {
            return;
        }
        let high = (stats.physical_capacity as f64 * PHYSICAL_HIGH) as u64;
        let low = (stats.physical_capacity as f64 * PHYSICAL_LOW) as u64;
        if stats.physical_used <= high {
            return;
        }
        let mut used = stats.physical_used;
        let mut attempts = self.tree.leaf_count() * 2;
        while used > low && attempts > 0 {
            self.evict_one(w);
            // The emulator accounts trims at once (only writes are compressed later).
            used = self.device.stats().physical_used;
            attempts -= 1;
        }
    }

    /// Evicts one super-leaf chosen by CLOCK: trims its blocks and frees its slot.
    fn evict_one(&self, w: &mut Writer) -> bool {
        let budget = 2 * self.tree.leaf_count() + 2;
        for _ in 0..budget {
            let (low, leaf) = self.tree.clock_step(&mut w.hand);
            if leaf.referenced.swap(false, Ordering::Relaxed) {
                continue;
            }
            if let Some(objects) = self.evict_superleaf(w, &low, &leaf) {
                self.counters
                    .evicted_superleaves
                    .fetch_add(1, Ordering::Relaxed);
                self.counters
                    .evicted_objects
                    .fetch_add(objects, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// Trims a super-leaf and frees its slot; the objects it held, or `None` if it could
    /// not go.
    fn evict_superleaf(&self, w: &mut Writer, low: &Fence, leaf: &Arc<SuperLeaf>) -> Option<u64> {
        let mut released = 0;
        let mut release = |st: &mut SlState, w: &mut Writer| {
            if let Some(slot) = st.slot.take() {
                let _ = self
                    .device
                    .trim(self.lba(slot, 0), self.settings.subpages as u64);
                w.free_slots.push(slot);
                self.counters.occupied.fetch_sub(1, Ordering::Relaxed);
            }
            let objects: i64 = st.counts.iter().map(|&c| i64::from(c)).sum();
            self.counters.objects.fetch_sub(objects, Ordering::Relaxed);
            released = objects.max(0) as u64;
            st.counts.iter_mut().for_each(|c| *c = 0);
            st.version += 1;
        };
        if low.is_empty() {
            let mut st = leaf.state.write();
            st.slot?;
            release(&mut st, w);
            return Some(released);
        }
        let delta = self
            .tree
            .retire(low, leaf, |l| &l.state, |st| release(st, w))?;
        self.counters.superleaves.fetch_sub(1, Ordering::Relaxed);
        self.memory
            .change_index(delta - descriptor_bytes(self.settings.subpages) as i64);
        Some(released)
    }
}

impl SsdTier {
    /// Evicts the coldest super-leaf (CLOCK), shrinking the DRAM index by its descriptor;
    /// false if none can go.
    pub fn give_up_one(&self) -> bool {
        let mut w = self.writer.lock();
        self.tree.leaf_count() > 1 && self.evict_one(&mut w)
    }

    /// Forgets every object (memcached `flush_all`).
    pub fn clear(&self) {
        let mut w = self.writer.lock();
        while self.tree.leaf_count() > 1 {
            let Some((low, leaf)) = self.tree.next_leaf(&[]) else {
                break;
            };
            if self.evict_superleaf(&mut w, &low, &leaf).is_none() {
                break;
            }
        }
        let (low, first) = self.tree.find(&[]);
        self.evict_superleaf(&mut w, &low, &first);
    }
}

fn record_len(key: &[u8], value: &[u8], meta: &Meta) -> usize {
    Record {
        key,
        payload: Payload::Inline(value),
        meta: *meta,
    }
    .encoded_len()
}

fn payload_len(contents: &Contents) -> usize {
    contents
        .iter()
        .map(|(k, (v, meta))| record_len(k, v, meta))
        .sum()
}

impl EvictionSink for SsdTier {
    fn absorb(&self, _low: &[u8], _high: Option<&[u8]>, objects: Vec<EvictedObject>) -> bool {
        let now_ms = self.clock.now_ms();
        let mut w = self.writer.lock();
        self.relieve_physical(&mut w);
        // Clean objects are already on the SSD as they are: nothing to write.
        let dirty: Vec<&EvictedObject> = objects.iter().filter(|o| !o.meta.clean).collect();
        let v_obj: usize = dirty
            .iter()
            .filter_map(|o| o.value.as_ref().map(|v| o.key.len() + v.len()))
            .sum();
        self.counters
            .v_obj
            .fetch_add(v_obj as u64, Ordering::Relaxed);
        let mut i = 0;
        while i < dirty.len() {
            // Enough for this group to split a few ways; if a split still runs out, the
            // objects it cannot place are forgotten (a miss, never a wrong value).
            self.reserve(&mut w, SLOTS_PER_MERGE);
            let (_, leaf) = self.tree.find(&dirty[i].key);
            let mut st = leaf.state.write();
            let end = i + dirty[i..].partition_point(|o| {
                st.range
                    .high
                    .as_ref()
                    .is_none_or(|h| o.key.as_slice() < h.as_ref())
            });
            self.merge_into(&mut w, &mut st, &dirty[i..end.max(i + 1)], now_ms);
            i = end.max(i + 1);
        }
        true
    }

    /// Evicts every super-leaf that overlaps `[low, high)`: more than asked, but damaged
    /// DRAM pages are rare and a whole super-leaf is what this tier knows how to drop.
    fn forget(&self, low: &[u8], high: Option<&[u8]>) {
        let mut w = self.writer.lock();
        let mut doomed = vec![self.tree.find(low)];
        while let Some(next) = self.tree.next_leaf(&doomed[doomed.len() - 1].0) {
            if high.is_some_and(|h| next.0.as_ref() >= h) {
                break;
            }
            doomed.push(next);
        }
        for (leaf_low, leaf) in doomed {
            if self.evict_superleaf(&mut w, &leaf_low, &leaf).is_some() {
                self.counters
                    .evicted_superleaves
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// From the low fence of the super-leaf holding `low` to the high fence of the one
    /// holding the keys just below `high`. Read from the tree without locks: a hint that
    /// a concurrent split or eviction may make slightly stale, which costs only a write.
    fn span(&self, low: &Fence, high: Option<&[u8]>) -> (Fence, Option<Fence>) {
        let (span_low, _) = self.tree.find(low);
        // `None` (no bound) when that super-leaf is the last one.
        let span_high = high.and_then(|h| {
            let (last, _) = self.tree.prev_leaf(h)?;
            self.tree.next_leaf(&last).map(|(next, _)| next)
        });
        (span_low, span_high)
    }
}

/// The BT_SSD index as a clean `close()` leaves it for the next `open()`
/// (`docs/FORMAT.md`, "The index file").
mod index_file {
    pub const MAGIC: [u8; 4] = *b"ZCIX";
    pub const VERSION: u32 = 3;
}

impl SsdTier {
    /// Writes the descriptors of every super-leaf to `path` (atomically: a temporary
    /// file, fsync, rename). Called only after the device was flushed, so the index
    /// never names a block that is not durable.
    pub fn save(&self, at: IndexFile<'_>) -> std::io::Result<()> {
        let w = self.writer.lock();
        let mut out = Vec::new();
        out.extend_from_slice(&index_file::MAGIC);
        out.extend_from_slice(&index_file::VERSION.to_le_bytes());
        out.extend_from_slice(&at.epoch.to_le_bytes());
        out.extend_from_slice(&(self.settings.subpages as u32).to_le_bytes());
        out.extend_from_slice(&self.device.block_count().to_le_bytes());
        out.extend_from_slice(&w.next_slot.to_le_bytes());
        let mut leaves = Vec::new();
        self.tree.for_each_leaf(|_, leaf| leaves.push(leaf.clone()));
        out.extend_from_slice(&(leaves.len() as u32).to_le_bytes());
        for leaf in &leaves {
            let st = leaf.state.read();
            out.extend_from_slice(&(st.range.low.len() as u16).to_le_bytes());
            out.extend_from_slice(&st.range.low);
            out.extend_from_slice(&st.slot.unwrap_or(u32::MAX).to_le_bytes());
            out.extend_from_slice(&st.generation.to_le_bytes());
            for c in st.counts.iter() {
                out.extend_from_slice(&c.to_le_bytes());
            }
        }
        sealed_file::write(at.dir, at.name, out)
    }

    /// Rebuilds BT_SSD from an index `save` wrote for this very device and geometry;
    /// `None` if the file is missing, damaged or from another layout (then start cold).
    pub fn load(
        at: IndexFile<'_>,
        device: Arc<dyn BlockDevice>,
        settings: SsdSettings,
        memory: Arc<Memory>,
        clock: Arc<dyn Clock>,
    ) -> Option<SsdTier> {
        let body = sealed_file::read(at.dir, at.name)?;
        let mut f = Fields::new(&body);
        let m = settings.subpages;
        if f.bytes(4)? != index_file::MAGIC
            || f.u32()? != index_file::VERSION
            || f.u64()? != at.epoch
            || f.u32()? as usize != m
            || f.u64()? != device.block_count()
        {
            return None;
        }
        let next_slot = f.u32()?;
        let count = f.u32()? as usize;
        let mut descriptors = Vec::with_capacity(count.min(1 << 24));
        for _ in 0..count {
            let len = f.u16()? as usize;
            let low = Fence::from(f.bytes(len)?);
            let slot = f.u32()?;
            let generation = f.u32()?;
            let mut counts = vec![0u16; m];
            for c in &mut counts {
                *c = f.u16()?;
            }
            descriptors.push((low, (slot != u32::MAX).then_some(slot), generation, counts));
        }
        let ordered = descriptors.windows(2).all(|p| p[0].0 < p[1].0);
        let first_is_empty = descriptors.first().is_some_and(|d| d.0.is_empty());
        let max_slots = settings.blocks / m as u64;
        let slots_valid = next_slot as u64 <= max_slots
            && descriptors
                .iter()
                .all(|d| d.1.is_none_or(|s| s < next_slot));
        if !f.is_done() || !ordered || !first_is_empty || !slots_valid {
            return None;
        }
        let tier = SsdTier::new(device, settings, memory, clock);
        let mut used = vec![false; next_slot as usize];
        let highs: Vec<Option<Fence>> = descriptors
            .iter()
            .skip(1)
            .map(|d| Some(d.0.clone()))
            .chain([None])
            .collect();
        for ((low, slot, generation, counts), high) in descriptors.into_iter().zip(highs) {
            if let Some(s) = slot {
                if std::mem::replace(&mut used[s as usize], true) {
                    return None; // two super-leaves in one slot: not an index we wrote
                }
                tier.counters.occupied.fetch_add(1, Ordering::Relaxed);
            }
            let objects: i64 = counts.iter().map(|&c| i64::from(c)).sum();
            tier.counters.objects.fetch_add(objects, Ordering::Relaxed);
            let state = SlState {
                range: KeyRange::new(low.clone(), high),
                slot,
                generation,
                counts: counts.into_boxed_slice(),
                version: 0,
            };
            if low.is_empty() {
                *tier.tree.find(&[]).1.state.write() = state;
            } else {
                let delta = tier.tree.insert(low, SuperLeaf::new(state));
                tier.counters.superleaves.fetch_add(1, Ordering::Relaxed);
                tier.memory.change_index(delta + descriptor_bytes(m) as i64);
            }
        }
        {
            let mut w = tier.writer.lock();
            w.next_slot = next_slot;
            w.free_slots = (0..next_slot).filter(|&s| !used[s as usize]).collect();
        }
        Some(tier)
    }
}
