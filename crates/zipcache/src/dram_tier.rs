//! BT_DRAM, the compressed DRAM tier (paper §3.2).
//!
//! A B+ tree ([`BTree`]) of leaves. Each leaf holds a 4 KiB logical page of `n`
//! hash-partitioned sub-pages ([`leaf_page`](crate::leaf_page)) stored as one LZ4 stream
//! (or uncompressed while hot, [`bypass`](crate::bypass)), the individually compressed
//! blobs of its medium objects, and a write buffer ([`write_buffer`](crate::write_buffer)).
//!
//! Concurrency: the tree is read without locks; each leaf has its own `RwLock`. GETs take
//! it shared, writers exclusive. A leaf keeps its own fences: whoever locks a leaf that no
//! longer owns its key (split or evicted since the tree was read) goes back to the root.
//! Lock order is left leaf → right leaf → tree writer, which the splitting merge and
//! eviction both follow.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use crossbeam_channel::Sender;
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

use crate::btree::{BTree, Fence, KeyRange, Ranged};
use crate::bypass::Bypass;
use crate::early_termination::{compress_behind, decompress_prefix, with_prefix};
use crate::eviction::{EvictedObject, EvictionSink};
use crate::memory::{Charge, LeafCharge, Memory, alloc_size};
use crate::packed_page::PackedLayout;
use crate::record::{CasBase, Meta, Payload, Record, blob_header, decode_blob, encode_blob};
use crate::subpage_hash::dram_subpage;
use crate::write_buffer::{Pressure, WriteBuffer};

/// What the DRAM tier knows about a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(Vec<u8>, Meta),
    /// A tombstone: the key was deleted or replaced by a large object. Also what a
    /// damaged page or blob answers (counted): it may have held a newer version or a
    /// tombstone, so the older SSD copies must stay hidden.
    Deleted,
    /// The newest DRAM version expired: a miss, and lower tiers hold nothing newer.
    Expired,
    /// Not in DRAM; lower tiers may have it.
    Absent,
}

enum Page {
    Empty,
    Compressed(Box<[u8]>),
    Hot(Box<[u8]>),
}

struct LeafState {
    range: KeyRange,
    page: Page,
    /// Medium objects' blobs, by the slot their page record names.
    blobs: Box<[Option<Box<[u8]>>]>,
    buffer: WriteBuffer,
    /// Live objects in the page and their key + value bytes (for the compression ratio).
    objects: u32,
    /// How the buffer changes the number of live objects (+1 for each new key, -1 for
    /// each deletion of a live one), worked out when `stats` asks rather than on every
    /// write (it takes a page lookup); `UNKNOWN` after each append.
    buffered: AtomicI32,
    raw_bytes: u32,
    /// Objects in the page that are clean: unchanged copies of what the SSD tier holds.
    clean: u32,
    charge: LeafCharge,
    /// The page was found damaged: which keys it held newer versions or tombstones of is
    /// unknown, so every key of the range it cannot answer for hides the lower tiers
    /// (a miss), and the range is forgotten below when the leaf leaves. Set under the
    /// read lock by whoever finds the damage.
    lost: AtomicBool,
}

impl Ranged for LeafState {
    fn range(&mut self) -> &mut KeyRange {
        &mut self.range
    }
}

pub struct DramLeaf {
    state: RwLock<LeafState>,
    /// Accesses since the bypass pass last aged the counters.
    access: AtomicU32,
    /// CLOCK reference bit.
    referenced: AtomicBool,
    /// Chosen for the uncompressed hot sub-tier.
    hot: AtomicBool,
    merge_queued: AtomicBool,
}

impl DramLeaf {
    fn new(state: LeafState, access: u32, hot: bool) -> Arc<Self> {
        Arc::new(DramLeaf {
            state: RwLock::new(state),
            access: AtomicU32::new(access),
            referenced: AtomicBool::new(true),
            hot: AtomicBool::new(hot),
            merge_queued: AtomicBool::new(false),
        })
    }

    /// Counts an access. A plain load/store, not an atomic add: a lost increment under a
    /// race does not matter to a hotness estimate, a locked bus cycle per GET would.
    fn touch(&self) {
        self.access.store(
            self.access.load(Ordering::Relaxed).saturating_add(1),
            Ordering::Relaxed,
        );
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }
}

/// Most leaves one eviction takes (see `evict_group`): bounds how long their readers
/// wait and how much a hot neighbour can be pulled out with a cold victim.
const MAX_EVICTION_GROUP: usize = 8;

/// `LeafState::buffered` until someone asks.
const UNKNOWN: i32 = i32::MIN;

/// Medium objects one page can name: a page record points at its blob by a `u16` slot,
/// so a page with more (a large `leaf_size`, short keys) splits instead.
const MAX_BLOBS_PER_LEAF: usize = u16::MAX as usize + 1;

/// DRAM a leaf descriptor takes besides its page, blobs and buffer.
const LEAF_OVERHEAD: usize = size_of::<DramLeaf>() + 16;

#[derive(Clone, Copy, Debug)]
pub struct DramSettings {
    pub leaf_size: usize,
    pub subpages: usize,
    pub write_buffer: usize,
    pub tiny_max: usize,
    pub dram_capacity: u64,
    pub bypass_max_fraction: f64,
    /// With an SSD tier below, tombstones must live until they reach it.
    pub keep_tombstones: bool,
}

#[derive(Debug, Default)]
pub struct DramCounters {
    pub merges: AtomicU64,
    pub foreground_merges: AtomicU64,
    pub splits: AtomicU64,
    pub evicted_leaves: AtomicU64,
    pub evicted_objects: AtomicU64,
    pub clean_dropped: AtomicU64,
    pub corrupt_pages: AtomicU64,
    /// Live objects in pages.
    pub objects: AtomicI64,
    pub clean_objects: AtomicI64,
    pub raw_bytes: AtomicI64,
    pub hot_leaves: AtomicI64,
}

pub struct DramTier {
    tree: BTree<DramLeaf>,
    layout: PackedLayout,
    settings: DramSettings,
    memory: Arc<Memory>,
    merge_queue: Sender<Arc<DramLeaf>>,
    pub bypass: Bypass,
    pub counters: DramCounters,
    /// Low fence of the leaf the CLOCK hand points at.
    hand: Mutex<Fence>,
}

/// An object of a leaf on its way into a rebuilt page, an eviction or a scan.
struct Obj<'a> {
    key: &'a [u8],
    body: Body<'a>,
    meta: Meta,
    /// Came from the buffer with a key the page did not have.
    new_key: bool,
}

enum Body<'a> {
    Inline(&'a [u8]),
    /// A medium object whose blob sits in the source leaf's blob table.
    Slot(u16),
    /// A medium object's blob, compressed during this merge.
    Blob(Box<[u8]>),
    Tombstone,
}

impl Obj<'_> {
    fn record(&self, slot: u16) -> Record<'_> {
        let payload = match &self.body {
            Body::Inline(v) => Payload::Inline(v),
            Body::Slot(_) | Body::Blob(_) => {
                return Record {
                    key: self.key,
                    payload: Payload::Medium(slot),
                    meta: Meta::default(),
                };
            }
            Body::Tombstone => Payload::Tombstone,
        };
        Record {
            key: self.key,
            payload,
            meta: self.meta,
        }
    }

    fn is_medium(&self) -> bool {
        matches!(self.body, Body::Slot(_) | Body::Blob(_))
    }
}

/// One key of a scan: its newest DRAM version, `None` for a tombstone or an expired value
/// (which hide older versions in lower tiers).
pub type ScanEntry = (Vec<u8>, Option<(Vec<u8>, Meta)>);

type Bounds<'k> = (Bound<&'k [u8]>, Bound<&'k [u8]>);

impl DramTier {
    pub fn new(
        settings: DramSettings,
        memory: Arc<Memory>,
        merge_queue: Sender<Arc<DramLeaf>>,
        bypass_r: f64,
    ) -> Self {
        let layout = PackedLayout {
            subpages: settings.subpages,
            capacity: settings.leaf_size,
            hash: dram_subpage,
        };
        let first = LeafState {
            range: KeyRange::everything(),
            page: Page::Empty,
            blobs: Box::default(),
            buffer: WriteBuffer::default(),
            objects: 0,
            buffered: AtomicI32::new(0),
            raw_bytes: 0,
            clean: 0,
            charge: LeafCharge::default(),
            lost: AtomicBool::new(false),
        };
        let first = DramLeaf::new(first, 0, false);
        let tier = DramTier {
            tree: BTree::new(first.clone()),
            layout,
            settings,
            memory,
            merge_queue,
            bypass: Bypass::new(bypass_r),
            counters: DramCounters::default(),
            hand: Mutex::new(Fence::from(&[][..])),
        };
        let mut st = first.state.write();
        tier.recharge(&mut st);
        drop(st);
        tier.memory.change_index(tier.tree.node_bytes() as i64);
        tier
    }

    pub fn leaf_count(&self) -> u64 {
        self.tree.leaf_count()
    }

    /// Every leaf, in key order, as the tree is now (for passes that lock them one by one).
    fn leaves(&self) -> Vec<Arc<DramLeaf>> {
        let mut leaves = Vec::with_capacity(self.tree.leaf_count() as usize);
        self.tree.for_each_leaf(|_, leaf| leaves.push(leaf.clone()));
        leaves
    }

    /// Runs `f` on the leaf that owns `key`, locked shared.
    fn read_leaf<R>(&self, key: &[u8], f: impl FnOnce(&DramLeaf, &LeafState) -> R) -> R {
        let mut f = Some(f);
        loop {
            let done = self.tree.with_leaf(key, |_, leaf| {
                let st = leaf.state.read();
                // `f` is taken only once the leaf owns the key, so it runs exactly once.
                st.range.owns(key).then(|| f.take().map(|f| f(leaf, &st)))
            });
            if let Some(Some(result)) = done {
                return result;
            }
        }
    }

    /// Runs `f` on the leaf that owns `key`, locked exclusive.
    fn write_leaf<R>(&self, key: &[u8], f: impl FnOnce(&Arc<DramLeaf>, &mut LeafState) -> R) -> R {
        loop {
            let (_, leaf) = self.tree.find(key);
            let mut st = leaf.state.write();
            if st.range.owns(key) {
                return f(&leaf, &mut st);
            }
        }
    }

    pub fn get(&self, key: &[u8], now_ms: u64) -> Lookup {
        self.read_leaf(key, |leaf, st| {
            leaf.touch();
            self.lookup_locked(st, key, now_ms)
        })
    }

    fn resolve(&self, st: &LeafState, r: &Record<'_>, now_ms: u64) -> Lookup {
        let (value, meta) = match r.payload {
            Payload::Tombstone => return Lookup::Deleted,
            Payload::Inline(v) => (v.to_vec(), r.meta),
            Payload::Medium(slot) => {
                match st
                    .blobs
                    .get(slot as usize)
                    .and_then(Option::as_deref)
                    .and_then(decode_blob)
                {
                    Some(found) => found,
                    None => {
                        self.counters.corrupt_pages.fetch_add(1, Ordering::Relaxed);
                        return Lookup::Deleted;
                    }
                }
            }
        };
        if meta.expired(now_ms) {
            Lookup::Expired
        } else {
            Lookup::Found(value, meta)
        }
    }
}

impl DramTier {
    /// What the leaf holding `key` knows of it; the caller holds the leaf's lock.
    fn lookup_locked(&self, st: &LeafState, key: &[u8], now_ms: u64) -> Lookup {
        let found = self.with_record(st, key, |r| match r {
            Some(r) => self.resolve(st, &r, now_ms),
            // Not in this leaf; unless the leaf lost its page, then nobody knows.
            None if st.lost.load(Ordering::Relaxed) => Lookup::Deleted,
            None => Lookup::Absent,
        });
        found.unwrap_or_else(|| {
            self.mark_lost(st);
            Lookup::Deleted
        })
    }

    /// Hands the newest record of `key` in a locked leaf (buffer first, then the page
    /// through early termination) to `f`; `None` if the page is damaged.
    fn with_record<R>(
        &self,
        st: &LeafState,
        key: &[u8],
        f: impl FnOnce(Option<Record<'_>>) -> R,
    ) -> Option<R> {
        match st.buffer.find(key) {
            Some(r) => Some(f(Some(r))),
            None => self.with_page_record(st, key, f),
        }
    }

    /// `with_record` for the page alone.
    fn with_page_record<R>(
        &self,
        st: &LeafState,
        key: &[u8],
        f: impl FnOnce(Option<Record<'_>>) -> R,
    ) -> Option<R> {
        match &st.page {
            Page::Empty => Some(f(None)),
            Page::Hot(page) => {
                let (table, body) = self.layout.split(page)?;
                Some(f(self.layout.find(&table, body, key)))
            }
            Page::Compressed(page) => {
                let (table, body) = self.layout.split(page)?;
                with_prefix(
                    body,
                    table.body_len(),
                    self.layout.prefix_for(&table, key),
                    |prefix| prefix.map(|p| f(self.layout.find(&table, p, key))),
                )
            }
        }
    }

    /// How a locked leaf's buffer changes its number of live objects: for each key it
    /// holds, its newest buffered record against the page's.
    fn buffered_delta(&self, st: &LeafState, now_ms: u64) -> i32 {
        let mut newest: BTreeMap<&[u8], Record<'_>> = BTreeMap::new();
        for r in st.buffer.records() {
            newest.insert(r.key, r);
        }
        let live = |r: &Record<'_>| match r.payload {
            Payload::Tombstone => false,
            Payload::Inline(_) => !r.meta.expired(now_ms),
            Payload::Medium(slot) => st
                .blobs
                .get(slot as usize)
                .and_then(Option::as_deref)
                .and_then(blob_header)
                .is_some_and(|(meta, _)| !meta.expired(now_ms)),
        };
        newest
            .into_iter()
            .map(|(key, r)| {
                let was = self.with_page_record(st, key, |p| p.is_some_and(|p| live(&p)));
                i32::from(live(&r)) - i32::from(was.unwrap_or(false))
            })
            .sum()
    }

    /// Live objects still in write buffers, beyond those the pages count: each leaf's
    /// buffer delta, worked out for the leaves written since they were last asked.
    pub fn buffered_objects(&self, now_ms: u64) -> i64 {
        self.leaves()
            .iter()
            .map(|leaf| {
                let st = leaf.state.read();
                let known = st.buffered.load(Ordering::Relaxed);
                let delta = match known {
                    UNKNOWN => {
                        let delta = self.buffered_delta(&st, now_ms);
                        st.buffered.store(delta, Ordering::Relaxed);
                        delta
                    }
                    known => known,
                };
                i64::from(delta)
            })
            .sum()
    }

    /// The page of a locked leaf is damaged (counted): see `LeafState::lost`.
    fn mark_lost(&self, st: &LeafState) {
        self.counters.corrupt_pages.fetch_add(1, Ordering::Relaxed);
        st.lost.store(true, Ordering::Relaxed);
    }

    /// Stores `value` under `key` (`None`: a tombstone), after running `alongside` under
    /// the same leaf lock: a write that must change BT_LO too (drop or add a large
    /// version) is then atomic with respect to every other write of the key.
    pub fn put_with<R>(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
        meta: Meta,
        now_ms: u64,
        alongside: impl FnOnce() -> R,
    ) -> R {
        let payload = value.map_or(Payload::Tombstone, Payload::Inline);
        let record = Record { key, payload, meta };
        self.write_leaf(key, |leaf, st| {
            let result = alongside();
            self.append_locked(leaf, st, &record, now_ms);
            result
        })
    }

    /// Deletes `key`; returns what DRAM held of it before, and what `alongside` (run
    /// under the same leaf lock) returned.
    pub fn delete<R>(&self, key: &[u8], now_ms: u64, alongside: impl FnOnce() -> R) -> (Lookup, R) {
        self.write_leaf(key, |leaf, st| {
            let before = self.lookup_locked(st, key, now_ms);
            let result = alongside();
            // Without a lower tier a tombstone is only needed to hide a DRAM copy.
            if self.settings.keep_tombstones || before != Lookup::Absent {
                let record = Record {
                    key,
                    payload: Payload::Tombstone,
                    meta: Meta::default(),
                };
                self.append_locked(leaf, st, &record, now_ms);
            }
            (before, result)
        })
    }

    /// Atomic read-modify-write of one key: `decide` sees what DRAM holds and returns the
    /// change to make (`Some(Some(value))` put, `Some(None)` delete, `None` nothing).
    /// The leaf stays locked throughout, so no other write to the key interleaves.
    pub fn modify<R>(
        &self,
        key: &[u8],
        now_ms: u64,
        decide: impl FnOnce(Lookup) -> (Option<Option<(Vec<u8>, Meta)>>, R),
    ) -> R {
        self.write_leaf(key, |leaf, st| {
            let current = self.lookup_locked(st, key, now_ms);
            let (change, result) = decide(current);
            match change {
                None => {}
                Some(Some((value, meta))) => {
                    let record = Record {
                        key,
                        payload: Payload::Inline(&value),
                        meta,
                    };
                    self.append_locked(leaf, st, &record, now_ms);
                }
                Some(None) => {
                    let record = Record {
                        key,
                        payload: Payload::Tombstone,
                        meta: Meta::default(),
                    };
                    self.append_locked(leaf, st, &record, now_ms);
                }
            }
            result
        })
    }

    fn append_locked(
        &self,
        leaf: &Arc<DramLeaf>,
        st: &mut LeafState,
        record: &Record<'_>,
        now_ms: u64,
    ) {
        leaf.touch();
        st.buffered.store(UNKNOWN, Ordering::Relaxed);
        match st.buffer.append(record, self.settings.write_buffer) {
            Pressure::Fine => self.recharge(st),
            Pressure::Full => {
                self.recharge(st);
                if !leaf.merge_queued.swap(true, Ordering::AcqRel) {
                    // The merger may be gone at shutdown; the buffer then merges on close.
                    let _ = self.merge_queue.send(leaf.clone());
                }
            }
            Pressure::Overflowing => {
                self.counters
                    .foreground_merges
                    .fetch_add(1, Ordering::Relaxed);
                self.merge_locked(leaf, st, now_ms, false);
            }
        }
    }

    /// The background merger's entry: merges `leaf`'s buffer if it still has one.
    pub fn merge(&self, leaf: &Arc<DramLeaf>, now_ms: u64) {
        let mut st = leaf.state.write();
        leaf.merge_queued.store(false, Ordering::Release);
        if !st.range.retired && !st.buffer.is_empty() {
            self.merge_locked(leaf, &mut st, now_ms, false);
        }
    }

    /// Decompress → apply the buffer → recompress; splits the leaf when a sub-page
    /// overflows. Objects that do not survive (expired, tombstones with nothing below,
    /// and with `drop_clean` the clean ones) are dropped here.
    fn merge_locked(
        &self,
        leaf: &Arc<DramLeaf>,
        st: &mut LeafState,
        now_ms: u64,
        drop_clean: bool,
    ) {
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        let buffer = st.buffer.take();
        let mut old_blobs = std::mem::take(&mut st.blobs);
        let old_page = std::mem::replace(&mut st.page, Page::Empty);
        let decoded = self.decode(st, &old_page);
        let page = decoded.as_ref().map(|(base, body)| (*base, &body[..]));
        let keep_tombstones = self.settings.keep_tombstones;
        let mut objs = self.gather(page, &buffer, &old_blobs, now_ms, keep_tombstones);
        if drop_clean {
            let before = objs.len();
            objs.retain(|o| !o.meta.clean);
            self.counters
                .clean_dropped
                .fetch_add((before - objs.len()) as u64, Ordering::Relaxed);
        }
        for obj in &mut objs {
            match obj.body {
                Body::Slot(slot) => match old_blobs.get_mut(slot as usize).and_then(Option::take) {
                    Some(blob) => obj.body = Body::Blob(blob),
                    None => obj.body = Body::Tombstone,
                },
                Body::Inline(v) if obj.key.len() + v.len() >= self.settings.tiny_max => {
                    obj.body = Body::Blob(encode_blob(v, &obj.meta));
                }
                _ => {}
            }
        }
        // A blob that went missing above (corruption) must not resurrect an older SSD copy.
        if !keep_tombstones {
            objs.retain(|o| !matches!(o.body, Body::Tombstone));
        }
        let chunks = self.partition(&objs);
        let hot = leaf.hot.load(Ordering::Relaxed);
        let old_high = st.range.high.take();
        let mut fences: Vec<Fence> = Vec::with_capacity(chunks.len());
        for pair in chunks.windows(2) {
            fences.push(separator(objs[pair[0].1 - 1].key, objs[pair[1].0].key));
        }
        let mut objs_iter = objs.into_iter();
        let mut contents = Vec::with_capacity(chunks.len());
        for (i, &(start, end)) in chunks.iter().enumerate() {
            let chunk: Vec<Obj> = objs_iter.by_ref().take(end - start).collect();
            contents.push(self.build(chunk, hot && i == 0));
        }
        drop(buffer);
        st.buffer.clear(self.settings.write_buffer);
        st.buffered.store(0, Ordering::Relaxed);
        let mut contents = contents.into_iter();
        if let Some(first) = contents.next() {
            self.install(st, first);
        }
        st.range.high = fences.first().cloned().or_else(|| old_high.clone());
        self.recharge(st);
        let access = leaf.access.load(Ordering::Relaxed);
        for (i, c) in contents.enumerate() {
            let state = LeafState {
                range: KeyRange::new(
                    fences[i].clone(),
                    fences.get(i + 1).cloned().or_else(|| old_high.clone()),
                ),
                page: Page::Empty,
                blobs: Box::default(),
                buffer: WriteBuffer::default(),
                objects: 0,
                buffered: AtomicI32::new(0),
                raw_bytes: 0,
                clean: 0,
                charge: LeafCharge::default(),
                lost: AtomicBool::new(st.lost.load(Ordering::Relaxed)),
            };
            // New leaves start compressed: a hot leaf that splits on every few sequential
            // inserts would otherwise fill DRAM with uncompressed pages between two bypass
            // passes. The next pass promotes whichever half stays hot.
            let new_leaf = DramLeaf::new(state, access / 2, false);
            {
                let mut nst = new_leaf.state.write();
                self.install(&mut nst, c);
                self.recharge(&mut nst);
            }
            let delta = self.tree.insert(fences[i].clone(), new_leaf);
            self.memory.change_index(delta);
            self.counters.splits.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Chooses where to cut sorted objects into pages that fit. Sequential inserts (all
    /// buffered keys beyond the page's keys) cut right before the new keys, so the left
    /// leaf stays as full as hashing allows instead of half empty forever.
    fn partition(&self, objs: &[Obj]) -> Vec<(usize, usize)> {
        let fits = |range: &[Obj]| {
            range.iter().filter(|o| o.is_medium()).count() <= MAX_BLOBS_PER_LEAF
                && self.layout.fits(range.iter().map(|o| o.record(0)))
        };
        let mut out = Vec::new();
        let mut pending = vec![(0, objs.len())];
        while let Some((start, end)) = pending.pop() {
            if end - start <= 1 || fits(&objs[start..end]) {
                out.push((start, end));
                continue;
            }
            let appended = objs[start..end]
                .iter()
                .rev()
                .take_while(|o| o.new_key)
                .count();
            let mut cut = end - appended;
            let mid = if cut > start && cut < end && fits(&objs[start..cut]) {
                while cut + 1 < end && fits(&objs[start..=cut]) {
                    cut += 1;
                }
                cut
            } else {
                (start + end) / 2
            };
            pending.push((mid, end));
            pending.push((start, mid));
        }
        out
    }

    /// Page and blobs for one leaf's worth of objects.
    fn build(&self, objs: Vec<Obj>, hot: bool) -> LeafContents {
        let mut slots = 0usize;
        let records: Vec<Record> = objs
            .iter()
            .map(|o| {
                // `partition` keeps a page within `MAX_BLOBS_PER_LEAF` medium objects.
                let slot = u16::try_from(slots).expect("blob slots fit a u16");
                if o.is_medium() {
                    slots += 1;
                }
                o.record(slot)
            })
            .collect();
        let mut objects = 0;
        let mut clean = 0;
        let mut raw_bytes = 0;
        for o in &objs {
            let value_len = match &o.body {
                Body::Inline(v) => v.len(),
                Body::Blob(b) => blob_header(b).map_or(0, |(_, n)| n),
                Body::Slot(_) | Body::Tombstone => continue,
            };
            objects += 1;
            clean += u32::from(o.meta.clean);
            raw_bytes += o.key.len() + value_len;
        }
        let page = if records.is_empty() {
            Page::Empty
        } else {
            // `partition` only hands over chunks that fit (a single record always does:
            // `Config::validate` sees to it).
            match self.layout.build(&records) {
                Some(page) if hot => Page::Hot(page.into_boxed_slice()),
                Some(page) => Page::Compressed(self.compress(&page)),
                None => Page::Empty,
            }
        };
        drop(records);
        // Pushed one by one: `collect` would reuse the far larger `objs` allocation.
        let mut blobs = Vec::new();
        for o in objs {
            if let Body::Blob(b) = o.body {
                blobs.push(Some(b));
            }
        }
        let blobs = blobs.into_boxed_slice();
        LeafContents {
            page,
            blobs,
            objects,
            clean,
            raw_bytes,
        }
    }

    fn install(&self, st: &mut LeafState, c: LeafContents) {
        self.counters.objects.fetch_add(
            i64::from(c.objects) - i64::from(st.objects),
            Ordering::Relaxed,
        );
        self.counters
            .clean_objects
            .fetch_add(i64::from(c.clean) - i64::from(st.clean), Ordering::Relaxed);
        self.counters.raw_bytes.fetch_add(
            c.raw_bytes as i64 - i64::from(st.raw_bytes),
            Ordering::Relaxed,
        );
        st.page = c.page;
        st.blobs = c.blobs;
        st.objects = c.objects;
        st.clean = c.clean;
        st.raw_bytes = c.raw_bytes as u32;
    }

    /// The whole page of a locked leaf, decompressed; `None` if it is empty, or damaged
    /// (then the leaf is marked lost: its keys are misses that hide the lower tiers).
    fn decode<'p>(
        &self,
        st: &LeafState,
        page: &'p Page,
    ) -> Option<(CasBase, std::borrow::Cow<'p, [u8]>)> {
        let bytes = match page {
            Page::Empty => return None,
            Page::Hot(bytes) | Page::Compressed(bytes) => bytes,
        };
        let decoded = self.layout.split(bytes).and_then(|(table, body)| {
            let len = table.body_len();
            let body = match page {
                Page::Compressed(_) => {
                    let mut out = vec![0u8; len];
                    decompress_prefix(body, len, len, &mut out)
                        .then_some(std::borrow::Cow::Owned(out))
                }
                _ => (body.len() == len).then_some(std::borrow::Cow::Borrowed(body)),
            };
            body.map(|body| (table.cas_base(), body))
        });
        if decoded.is_none() {
            self.mark_lost(st);
        }
        decoded
    }

    /// A cold page from a built one: the table as it is, the body compressed.
    fn compress(&self, page: &[u8]) -> Box<[u8]> {
        let header = self.layout.table(page).map_or(page.len(), |t| t.len());
        let (table, body) = page.split_at(header);
        compress_behind(table, body)
    }

    /// The newest version of every key in a page and buffer, in key order.
    fn gather<'a>(
        &self,
        page: Option<(CasBase, &'a [u8])>,
        buffer: &'a WriteBuffer,
        blobs: &[Option<Box<[u8]>>],
        now_ms: u64,
        keep_tombstones: bool,
    ) -> Vec<Obj<'a>> {
        let mut map: BTreeMap<&'a [u8], Obj<'a>> = BTreeMap::new();
        let (cas_base, body) = page.unwrap_or_default();
        for r in self.layout.all(cas_base, body) {
            let (body, meta) = match r.payload {
                Payload::Inline(v) => (Body::Inline(v), r.meta),
                Payload::Medium(slot) => {
                    match blobs
                        .get(slot as usize)
                        .and_then(Option::as_deref)
                        .and_then(blob_header)
                    {
                        Some((meta, _)) => (Body::Slot(slot), meta),
                        None => (Body::Tombstone, Meta::default()),
                    }
                }
                Payload::Tombstone => (Body::Tombstone, r.meta),
            };
            map.insert(
                r.key,
                Obj {
                    key: r.key,
                    body,
                    meta,
                    new_key: false,
                },
            );
        }
        for r in buffer.records() {
            let body = match r.payload {
                Payload::Inline(v) => Body::Inline(v),
                // Buffers hold only inline values and tombstones.
                Payload::Medium(_) | Payload::Tombstone => Body::Tombstone,
            };
            let new_key = map.get(r.key).is_none_or(|o| o.new_key);
            map.insert(
                r.key,
                Obj {
                    key: r.key,
                    body,
                    meta: r.meta,
                    new_key,
                },
            );
        }
        map.into_values()
            .filter_map(|mut o| {
                if !matches!(o.body, Body::Tombstone) && o.meta.expired(now_ms) {
                    // An expired value must still hide any older copy below it.
                    o.body = Body::Tombstone;
                    o.meta = Meta::default();
                }
                (keep_tombstones || !matches!(o.body, Body::Tombstone)).then_some(o)
            })
            .collect()
    }

    fn recharge(&self, st: &mut LeafState) {
        let new = if st.range.retired {
            Charge::default()
        } else {
            let blob_bytes: usize = st.blobs.iter().flatten().map(|b| alloc_size(b.len())).sum();
            let table = alloc_size(st.blobs.len() * size_of::<Option<Box<[u8]>>>());
            Charge {
                compressed_pages: match &st.page {
                    Page::Compressed(c) => alloc_size(c.len()) as i64,
                    _ => 0,
                },
                hot_pages: match &st.page {
                    Page::Hot(p) => alloc_size(p.len()) as i64,
                    _ => 0,
                },
                write_buffers: st.buffer.charge() as i64,
                mediums: (blob_bytes + table) as i64,
                index: alloc_size(LEAF_OVERHEAD) as i64,
            }
        };
        // Round-trip through the stored form so the account sees exactly what the leaf keeps.
        let new = LeafCharge::from(new);
        self.memory.change(&st.charge.into(), &new.into());
        st.charge = new;
    }

    /// Evicts one group of leaves around a victim chosen by CLOCK. Returns false if
    /// nothing could be evicted.
    pub fn evict_one(&self, sink: Option<&dyn EvictionSink>, now_ms: u64) -> bool {
        let mut hand = self.hand.lock();
        let leaves = self.tree.leaf_count();
        for step in 0..3 * leaves + 2 {
            // Hot leaves are spared for two sweeps, referenced ones for one; then, with
            // nothing else left to take, the budget wins over the hot sub-tier.
            let spare_hot = step < 2 * leaves + 1;
            let (low, leaf) = self.tree.clock_step(&mut hand);
            if leaf.referenced.swap(false, Ordering::Relaxed)
                || (spare_hot && leaf.hot.load(Ordering::Relaxed))
            {
                continue;
            }
            if self.drop_clean(&leaf, now_ms) {
                return true;
            }
            let high = leaf.state.read().range.high.clone();
            let span = match sink {
                Some(sink) => sink.span(&low, high.as_deref()),
                None => (low.clone(), high),
            };
            if self.evict_group(&low, &leaf, span, true, sink, now_ms) {
                return true;
            }
        }
        false
    }

    /// Clean first: a cold leaf that holds clean objects (unchanged copies of SSD-tier
    /// objects) gives up just those. Dropping them writes nothing and loses no hit (a
    /// later GET finds them on the SSD); its dirty objects stay and gather company, so
    /// that when the leaf does leave, its super-leaves are rewritten for more new
    /// objects. False if the leaf holds nothing clean.
    fn drop_clean(&self, leaf: &Arc<DramLeaf>, now_ms: u64) -> bool {
        let mut st = leaf.state.write();
        let buffered = st.buffer.records().filter(|r| r.meta.clean).count();
        if st.range.retired || st.clean as usize + buffered == 0 {
            return false;
        }
        self.merge_locked(leaf, &mut st, now_ms, true);
        true
    }

    /// Evicts `leaf` together with its neighbours inside `span`, the key range of the SSD
    /// super-leaves `leaf` maps to ([`EvictionSink::span`]), so that one read-modify-write
    /// of each super-leaf takes the objects of all of them: a super-leaf covers the key
    /// range of several DRAM leaves, and rewriting it once per DRAM leaf multiplies the
    /// bytes written to the SSD. With `spare_hot`, hot (bypassed) neighbours stay. The
    /// group's range joins the leaf left of it; the first leaf of the tree is emptied in
    /// place instead.
    fn evict_group(
        &self,
        low: &Fence,
        leaf: &Arc<DramLeaf>,
        (span_low, span_high): (Fence, Option<Fence>),
        spare_hot: bool,
        sink: Option<&dyn EvictionSink>,
        now_ms: u64,
    ) -> bool {
        let mut run = VecDeque::from([(low.clone(), leaf.clone())]);
        while run.len() < MAX_EVICTION_GROUP && run[0].0.as_ref() > span_low.as_ref() {
            match self.tree.prev_leaf(&run[0].0) {
                Some(prev) if !(spare_hot && prev.1.hot.load(Ordering::Relaxed)) => {
                    run.push_front(prev)
                }
                _ => break,
            }
        }
        while run.len() < MAX_EVICTION_GROUP {
            let last = &run[run.len() - 1].0;
            match self.tree.next_leaf(last) {
                Some(next)
                    if !(spare_hot && next.1.hot.load(Ordering::Relaxed))
                        && span_high.as_ref().is_none_or(|h| next.0 < *h) =>
                {
                    run.push_back(next)
                }
                _ => break,
            }
        }
        let keeps_range = match run[0].0.is_empty() {
            true => 0,
            false => match self.tree.prev_leaf(&run[0].0) {
                Some(prev) => {
                    run.push_front(prev);
                    1
                }
                None => return false,
            },
        };
        let run: Vec<_> = run.into();
        let removed = self.tree.collapse(
            &run,
            |l| &l.state,
            |states| {
                self.hand_over(&mut states[keeps_range..], sink, now_ms);
            },
        );
        for (_, victim) in &run[keeps_range..] {
            if removed.is_some() && victim.hot.swap(false, Ordering::Relaxed) {
                self.counters.hot_leaves.fetch_sub(1, Ordering::Relaxed);
            }
        }
        removed
            .map(|delta| self.memory.change_index(delta))
            .is_some()
    }

    /// Gives the objects of locked, consecutive leaves to `sink` in one batch and empties
    /// the leaves.
    fn hand_over(
        &self,
        victims: &mut [RwLockWriteGuard<'_, LeafState>],
        sink: Option<&dyn EvictionSink>,
        now_ms: u64,
    ) {
        if let (Some(sink), Some(first), Some(last)) = (sink, victims.first(), victims.last()) {
            for st in victims.iter().filter(|st| st.lost.load(Ordering::Relaxed)) {
                sink.forget(&st.range.low, st.range.high.as_deref());
            }
            let objects = victims
                .iter()
                .flat_map(|st| self.export(st, now_ms))
                .collect();
            sink.absorb(&first.range.low, last.range.high.as_deref(), objects);
        }
        for st in victims.iter_mut() {
            self.counters.evicted_leaves.fetch_add(1, Ordering::Relaxed);
            self.counters
                .evicted_objects
                .fetch_add(u64::from(st.objects), Ordering::Relaxed);
            self.install(st, LeafContents::empty());
            st.buffer = WriteBuffer::default();
            st.buffered.store(0, Ordering::Relaxed);
            st.lost.store(false, Ordering::Relaxed);
            self.recharge(st);
        }
    }

    /// A leaf's newest objects in key order, tombstones included.
    fn export(&self, st: &LeafState, now_ms: u64) -> Vec<EvictedObject> {
        self.entries(st, now_ms, None)
            .into_iter()
            .map(|(key, v)| match v {
                Some((value, meta)) => EvictedObject {
                    key,
                    value: Some(value),
                    meta,
                },
                None => EvictedObject {
                    key,
                    value: None,
                    meta: Meta::default(),
                },
            })
            .collect()
    }

    /// A locked leaf's entries in key order, restricted to `range` if given.
    fn entries(&self, st: &LeafState, now_ms: u64, range: Option<Bounds<'_>>) -> Vec<ScanEntry> {
        let decoded = self.decode(st, &st.page);
        let page = decoded.as_ref().map(|(base, body)| (*base, &body[..]));
        let in_range = |k: &[u8]| range.is_none_or(|r| std::ops::RangeBounds::contains(&r, k));
        self.gather(page, &st.buffer, &st.blobs, now_ms, true)
            .into_iter()
            .filter(|o| in_range(o.key))
            .map(|o| {
                let value = match o.body {
                    Body::Inline(v) => Some((v.to_vec(), o.meta)),
                    Body::Slot(slot) => match st
                        .blobs
                        .get(slot as usize)
                        .and_then(Option::as_deref)
                        .and_then(decode_blob)
                    {
                        Some(found) => Some(found),
                        // A damaged blob: a tombstone, which hides the older copies below.
                        None => {
                            self.counters.corrupt_pages.fetch_add(1, Ordering::Relaxed);
                            None
                        }
                    },
                    Body::Blob(_) | Body::Tombstone => None,
                };
                (o.key.to_vec(), value)
            })
            .collect()
    }

    /// DRAM entries with keys in `[cursor, end)` from the one leaf holding `cursor`,
    /// where the next leaf starts (`None` after the last leaf), and whether the leaf lost
    /// its page (then no lower tier may answer for its range).
    pub fn scan_leaf(
        &self,
        cursor: &[u8],
        end: Bound<&[u8]>,
        now_ms: u64,
    ) -> (Vec<ScanEntry>, Option<Fence>, bool) {
        self.read_leaf(cursor, |_, st| {
            let entries = self.entries(st, now_ms, Some((Bound::Included(cursor), end)));
            let lost = st.lost.load(Ordering::Relaxed);
            (entries, st.range.high.clone(), lost)
        })
    }

    /// One pass of adaptive compression bypassing: choose the hot leaves, convert the
    /// leaves whose status changed, and age every counter.
    pub fn bypass_pass(&self) {
        let leaves = self.leaves();
        let counts: Vec<u32> = leaves
            .iter()
            .map(|l| l.access.load(Ordering::Relaxed))
            .collect();
        // The hot sub-tier's budget counts all that a hot leaf pins (it is spared by
        // eviction): its uncompressed page, and its blobs and buffer.
        let hot_budget =
            (self.settings.dram_capacity as f64 * self.settings.bypass_max_fraction) as u64;
        let page = alloc_size(self.settings.leaf_size) as u64;
        let mut want = vec![false; leaves.len()];
        let mut pinned = 0;
        for i in self.bypass.choose(&counts, leaves.len()) {
            pinned += page + leaves[i].state.read().charge.beside_page();
            if pinned > hot_budget {
                break;
            }
            want[i] = true;
        }
        for (leaf, (want, count)) in leaves.iter().zip(want.into_iter().zip(counts)) {
            if leaf.hot.load(Ordering::Relaxed) != want {
                self.set_hot(leaf, want);
            }
            leaf.access.store(count >> 1, Ordering::Relaxed);
        }
    }

    fn set_hot(&self, leaf: &DramLeaf, hot: bool) {
        let mut st = leaf.state.write();
        if st.range.retired {
            return;
        }
        leaf.hot.store(hot, Ordering::Relaxed);
        self.counters
            .hot_leaves
            .fetch_add(if hot { 1 } else { -1 }, Ordering::Relaxed);
        let page = std::mem::replace(&mut st.page, Page::Empty);
        st.page = match (&page, hot) {
            (Page::Compressed(c), true) => {
                let header = self.layout.table(c).map_or(0, |t| t.len());
                match self.decode(&st, &page) {
                    Some((_, body)) => Page::Hot([&c[..header], &body].concat().into_boxed_slice()),
                    None => {
                        // Damaged (the leaf is marked lost): its objects are gone either way.
                        self.install(&mut st, LeafContents::empty());
                        Page::Empty
                    }
                }
            }
            (Page::Hot(p), false) => Page::Compressed(self.compress(p)),
            _ => page,
        };
        self.recharge(&mut st);
    }

    /// Empties the tier: every leaf's objects go to `sink` (a clean shutdown writes them
    /// to the SSD tier) or are dropped (memcached `flush_all`).
    pub fn evict_all(&self, sink: Option<&dyn EvictionSink>, now_ms: u64) {
        loop {
            let (low, first) = self.tree.find(&[]);
            let everything = (low.clone(), None);
            // Counted after the group left, not before: a merge that was splitting one of
            // its leaves (it holds that leaf's lock, which the group waits for) publishes
            // the new leaf before it lets go, and that leaf must go too.
            if self.evict_group(&low, &first, everything, false, sink, now_ms)
                && self.tree.leaf_count() == 1
            {
                return;
            }
        }
    }

    /// Merges every buffered write into its page (before a clean shutdown).
    pub fn merge_all(&self, now_ms: u64) {
        for leaf in self.leaves() {
            self.merge(&leaf, now_ms);
        }
    }
}

#[cfg(test)]
impl DramTier {
    /// Overwrites the page of the leaf holding `key` with garbage, as a DRAM error would.
    pub(crate) fn corrupt_page_of(&self, key: &[u8]) {
        self.write_leaf(key, |_, st| match &mut st.page {
            Page::Compressed(c) | Page::Hot(c) => c.iter_mut().for_each(|b| *b = 0xf7),
            Page::Empty => {}
        });
    }

    /// What a bypass pass would do to leaves that are all above the threshold.
    pub(crate) fn make_every_leaf_hot(&self) {
        for leaf in self
            .leaves()
            .iter()
            .filter(|l| !l.hot.load(Ordering::Relaxed))
        {
            self.set_hot(leaf, true);
        }
    }

    /// Overwrites every medium blob of the leaf holding `key` with garbage.
    pub(crate) fn corrupt_blob_of(&self, key: &[u8]) {
        self.write_leaf(key, |_, st| {
            for blob in st.blobs.iter_mut().flatten() {
                blob.iter_mut().for_each(|b| *b = 0xf7);
            }
        });
    }
}

struct LeafContents {
    page: Page,
    blobs: Box<[Option<Box<[u8]>>]>,
    objects: u32,
    clean: u32,
    raw_bytes: usize,
}

impl LeafContents {
    fn empty() -> LeafContents {
        LeafContents {
            page: Page::Empty,
            blobs: Box::default(),
            objects: 0,
            clean: 0,
            raw_bytes: 0,
        }
    }
}

/// The shortest key `s` with `left < s <= right`: a prefix of `right` (suffix truncation
/// keeps inner-node fences short).
pub(crate) fn separator(left: &[u8], right: &[u8]) -> Fence {
    debug_assert!(left < right);
    let common = left.iter().zip(right).take_while(|(a, b)| a == b).count();
    Fence::from(&right[..(common + 1).min(right.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every batch it is given; its span is a fixed range of keys.
    struct RecordingSink {
        span: (Fence, Option<Fence>),
        batches: Mutex<Vec<Vec<EvictedObject>>>,
    }

    impl EvictionSink for RecordingSink {
        fn absorb(&self, _low: &[u8], _high: Option<&[u8]>, objects: Vec<EvictedObject>) -> bool {
            self.batches.lock().push(objects);
            true
        }

        fn span(&self, _low: &Fence, _high: Option<&[u8]>) -> (Fence, Option<Fence>) {
            self.span.clone()
        }

        fn forget(&self, _low: &[u8], _high: Option<&[u8]>) {}
    }

    fn tier() -> DramTier {
        let settings = DramSettings {
            leaf_size: 4096,
            subpages: 16,
            write_buffer: 0,
            tiny_max: 1024,
            dram_capacity: 64 << 20,
            bypass_max_fraction: 0.0,
            keep_tombstones: true,
        };
        let (merges, _) = crossbeam_channel::unbounded();
        DramTier::new(settings, Arc::new(Memory::default()), merges, 0.0)
    }

    fn key(i: u32) -> Vec<u8> {
        format!("{i:08}").into_bytes()
    }

    #[test]
    fn one_eviction_takes_every_leaf_of_the_sinks_span_in_one_batch() {
        let dram = tier();
        for i in 0..3000 {
            dram.put_with(&key(i), Some(&[7; 60]), Meta::default(), 0, || ());
        }
        let leaves = dram.leaf_count();
        assert!(leaves > 20, "{leaves} leaves");
        // The span covers keys [1000, 1600): the leaves inside it leave together.
        let sink = RecordingSink {
            span: (
                Fence::from(&key(1000)[..]),
                Some(Fence::from(&key(1600)[..])),
            ),
            batches: Mutex::default(),
        };
        let (low, victim) = dram.tree.find(&key(1300));
        victim.referenced.store(false, Ordering::Relaxed);
        *dram.hand.lock() = low;
        assert!(dram.evict_one(Some(&sink), 0));
        let batches = sink.batches.lock();
        assert_eq!(batches.len(), 1, "one batch for the whole group");
        let keys: Vec<&[u8]> = batches[0].iter().map(|o| o.key.as_slice()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "in key order");
        assert!(keys.contains(&key(1300).as_slice()));
        let evicted = leaves - dram.leaf_count();
        assert!(
            (2..=MAX_EVICTION_GROUP as u64).contains(&evicted),
            "{evicted} leaves evicted"
        );
        // What left is gone from DRAM, everything else is still there.
        for i in 0..3000 {
            let gone = keys.contains(&key(i).as_slice());
            let found = matches!(dram.get(&key(i), 0), Lookup::Found(..));
            assert_eq!(found, !gone, "key {i}");
        }
        // The leaves outside the span are untouched: every evicted key is inside it,
        // apart from the straddling leaves at its two ends.
        let inside = |k: &[u8]| (&key(900)[..]..&key(1700)[..]).contains(&k);
        assert!(keys.iter().all(|k| inside(k)));
    }

    #[test]
    fn hot_neighbours_are_spared() {
        let dram = tier();
        for i in 0..3000 {
            dram.put_with(&key(i), Some(&[7; 60]), Meta::default(), 0, || ());
        }
        let sink = RecordingSink {
            span: (Fence::from(&[][..]), None),
            batches: Mutex::default(),
        };
        let (low, victim) = dram.tree.find(&key(1300));
        let (_, right) = dram.tree.next_leaf(&low).unwrap();
        dram.set_hot(&right, true);
        victim.referenced.store(false, Ordering::Relaxed);
        *dram.hand.lock() = low;
        assert!(dram.evict_one(Some(&sink), 0));
        let right_first = right.state.read().range.low.clone();
        assert!(!right.state.read().range.retired);
        assert!(
            sink.batches.lock()[0]
                .iter()
                .all(|o| o.key.as_slice() < right_first.as_ref())
        );
    }

    #[test]
    fn clean_objects_leave_first_and_without_a_write() {
        let dram = tier();
        let clean = Meta {
            clean: true,
            ..Meta::default()
        };
        for i in 0..10 {
            let meta = if i % 2 == 0 { clean } else { Meta::default() };
            dram.put_with(&key(i), Some(&[i as u8; 40]), meta, 0, || ());
        }
        let sink = RecordingSink {
            span: (Fence::from(&[][..]), None),
            batches: Mutex::default(),
        };
        assert!(dram.evict_one(Some(&sink), 0));
        assert!(
            sink.batches.lock().is_empty(),
            "dropping clean objects writes nothing"
        );
        assert_eq!(dram.counters.clean_dropped.load(Ordering::Relaxed), 5);
        for i in 0..10 {
            let found = matches!(dram.get(&key(i), 0), Lookup::Found(..));
            assert_eq!(found, i % 2 == 1, "key {i}");
        }
        // Nothing clean is left: the next eviction hands the dirty objects over.
        dram.tree
            .find(&[])
            .1
            .referenced
            .store(false, Ordering::Relaxed);
        assert!(dram.evict_one(Some(&sink), 0));
        let batches = sink.batches.lock();
        let keys: Vec<Vec<u8>> = batches[0].iter().map(|o| o.key.clone()).collect();
        assert_eq!(
            keys,
            (0..10).filter(|i| i % 2 == 1).map(key).collect::<Vec<_>>()
        );
    }
}
