//! BT_DRAM, the compressed DRAM tier (paper §3.2).
//!
//! A B+ tree ([`BTree`]) of leaves. Each leaf holds a 4 KiB logical page of `n`
//! hash-partitioned sub-pages of variable length ([`packed_page`](crate::packed_page))
//! stored as one LZ4 stream (or uncompressed while hot, [`bypass`](crate::bypass)), the
//! individually compressed blobs of its medium objects, and a write buffer
//! ([`write_buffer`](crate::write_buffer)).
//!
//! A leaf is small because there are many: its descriptor is a 40-byte slot in a table
//! ([`slots`](crate::slots)) that the tree names by a 32-bit id; it keeps no fences (the
//! tree's bottom nodes hold them packed, and a leaf's high fence is its right
//! neighbour's low); its object counts travel in its page; its blobs and buffer sit in
//! one box that exists only while it has either.
//!
//! Concurrency: the tree is read without locks; each leaf has its own `RwLock`. GETs take
//! it shared, writers exclusive. Whoever locks a leaf checks with the tree that the leaf
//! still owns its key (it may have split, been evicted, or its slot been reused since
//! the tree was read) and otherwise goes back to the root. Lock order is left leaf →
//! right leaf → tree writer, which the splitting merge and eviction both follow.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU8, AtomicU32, AtomicU64, Ordering};

use crossbeam_channel::Sender;
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

use crate::btree::{BTree, Child, Fence};
use crate::bypass::Bypass;
use crate::early_termination::{compress_behind, decompress_prefix, with_prefix};
use crate::eviction::{EvictedObject, EvictionSink};
use crate::memory::{Charge, Memory, alloc_size};
use crate::packed_page::PackedLayout;
use crate::record::{
    ASSIGN_CAS, CasBase, Meta, Payload, Record, blob_header, decode_blob, encode_blob, put_varint,
    read_varint,
};
use crate::slots::{SlotId, Slots, View};
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

/// A DRAM leaf as the tree names it: its slot in the tier's table of descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeafId(SlotId);

impl Child for LeafId {
    fn same(&self, other: &Self) -> bool {
        self == other
    }

    /// A DRAM leaf keeps no fence: the tree's copy is the only one.
    fn kept_fence_bytes(_fence_len: usize) -> usize {
        0
    }
}

/// A leaf's page, as one allocation: a summary of what it holds, then the packed page
/// (`packed_page.rs`: end table, CAS base, body — LZ4-compressed unless the leaf's
/// `RAW_PAGE` flag is set).
///
/// ```text
/// summary := objects:varint clean:varint raw_bytes:varint cas_top - cas_base:varint
/// ```
/// The counts are read when `stats` asks, so the leaf does not carry them; `cas_top`, the
/// largest CAS version of the page's objects (medium ones included, whose versions sit in
/// their blobs), when a write asks for a new version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Summary {
    /// Live objects in the page.
    objects: u64,
    /// Of those, the clean ones: unchanged copies of what the SSD tier holds.
    clean: u64,
    /// Their key + value bytes (for the compression ratio).
    raw_bytes: u64,
    /// `cas_top` as stored: its distance from the packed page's CAS base (wrapping).
    cas_top_above_base: u64,
}

impl Summary {
    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.objects);
        put_varint(out, self.clean);
        put_varint(out, self.raw_bytes);
        put_varint(out, self.cas_top_above_base);
    }

    /// The summary at the front of a page and the packed page behind it.
    fn split(page: &[u8]) -> Option<(Summary, &[u8])> {
        let mut at = 0;
        let mut next = || {
            let (v, n) = read_varint(page.get(at..)?)?;
            at += n;
            Some(v)
        };
        let (objects, clean, raw_bytes, cas_top_above_base) = (next()?, next()?, next()?, next()?);
        Some((
            Summary {
                objects,
                clean,
                raw_bytes,
                cas_top_above_base,
            },
            &page[at..],
        ))
    }
}

/// What a leaf holds besides its page while it has any of it: the write buffer and the
/// medium objects' blobs. Boxed, and absent for most leaves (no medium objects, no write
/// since the last merge).
#[derive(Default)]
struct Extras {
    buffer: WriteBuffer,
    /// How the buffer changes the number of live objects (+1 for each new key, -1 for
    /// each deletion of a live one), worked out when `stats` asks rather than on every
    /// write (it takes a page lookup); `UNKNOWN` after each append.
    buffered: AtomicI32,
    /// Medium objects' blobs, by the slot their page record names.
    blobs: Box<[Option<Box<[u8]>>]>,
}

#[derive(Default)]
struct LeafState {
    page: Option<Box<[u8]>>,
    extras: Option<Box<Extras>>,
}

impl LeafState {
    fn buffer(&self) -> Option<&WriteBuffer> {
        self.extras.as_ref().map(|e| &e.buffer)
    }

    fn blobs(&self) -> &[Option<Box<[u8]>>] {
        self.extras.as_ref().map_or(&[], |e| &e.blobs)
    }

    fn summary(&self) -> Summary {
        self.page
            .as_deref()
            .and_then(Summary::split)
            .map_or_else(Summary::default, |(s, _)| s)
    }

    /// Drops the box of extras once it holds nothing.
    fn tidy(&mut self) {
        if self
            .extras
            .as_ref()
            .is_some_and(|e| e.buffer.is_empty() && e.blobs.is_empty())
        {
            self.extras = None;
        }
    }
}

/// Bits of `DramLeaf::flags`.
const REFERENCED: u8 = 1;
/// Chosen for the uncompressed hot sub-tier.
const HOT: u8 = 1 << 1;
const MERGE_QUEUED: u8 = 1 << 2;
/// The page was found damaged: which keys it held newer versions or tombstones of is
/// unknown, so every key of the range it cannot answer for hides the lower tiers (a
/// miss), and the range is forgotten below when the leaf leaves. Set under the read lock
/// by whoever finds the damage.
const LOST: u8 = 1 << 3;
/// Removed from the tree by an eviction; its slot is free (or handed out again, which
/// clears the flag).
const RETIRED: u8 = 1 << 4;
/// The page's body is stored uncompressed (the hot sub-tier), not as LZ4.
const RAW_PAGE: u8 = 1 << 5;

/// One slot of the tier's table: 40 bytes per leaf.
#[derive(Default)]
pub struct DramLeaf {
    state: RwLock<LeafState>,
    /// Accesses since the bypass pass last aged the counters.
    access: AtomicU32,
    flags: AtomicU8,
}

impl DramLeaf {
    /// Counts an access. A plain load/store, not an atomic add: a lost increment under a
    /// race does not matter to a hotness estimate, a locked bus cycle per GET would.
    fn touch(&self) {
        self.access.store(
            self.access.load(Ordering::Relaxed).saturating_add(1),
            Ordering::Relaxed,
        );
        if !self.has(REFERENCED) {
            self.flags.fetch_or(REFERENCED, Ordering::Relaxed);
        }
    }

    fn has(&self, flag: u8) -> bool {
        self.flags.load(Ordering::Relaxed) & flag != 0
    }

    /// Sets or clears `flag`; returns whether it was set before.
    fn set(&self, flag: u8, on: bool) -> bool {
        let before = if on {
            self.flags.fetch_or(flag, Ordering::AcqRel)
        } else {
            self.flags.fetch_and(!flag, Ordering::AcqRel)
        };
        before & flag != 0
    }

    fn hot(&self) -> bool {
        self.has(HOT)
    }

    fn lost(&self) -> bool {
        self.has(LOST)
    }

    fn raw_page(&self) -> bool {
        self.has(RAW_PAGE)
    }
}

/// Most leaves one eviction takes (see `evict_group`): bounds how long their readers
/// wait and how much a hot neighbour can be pulled out with a cold victim.
const MAX_EVICTION_GROUP: usize = 8;

/// `Extras::buffered` until someone asks.
const UNKNOWN: i32 = i32::MIN;

/// Medium objects one page can name: a page record points at its blob by a `u16` slot,
/// so a page with more (a large `leaf_size`, short keys) splits instead.
const MAX_BLOBS_PER_LEAF: usize = u16::MAX as usize + 1;

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
    /// Where CAS versions start: above every version an earlier run may have handed out.
    pub cas_origin: u64,
}

#[derive(Debug, Default)]
pub struct DramCounters {
    pub merges: AtomicU64,
    pub foreground_merges: AtomicU64,
    pub splits: AtomicU64,
    pub evicted_leaves: AtomicU64,
    pub evicted_objects: AtomicU64,
    /// Objects of leaves evicted with no tier below to take them.
    pub dropped_objects: AtomicU64,
    pub clean_dropped: AtomicU64,
    /// Objects dropped unwritten because the flusher was behind (`drop_one`).
    pub write_drops: AtomicU64,
    pub corrupt_pages: AtomicU64,
    pub hot_leaves: AtomicI64,
}

/// What the DRAM tier holds, counted leaf by leaf when asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Live objects, in pages and write buffers.
    pub objects: i64,
    /// Clean objects in pages.
    pub clean: u64,
    /// Key + value bytes of the objects in pages.
    pub raw_bytes: u64,
}

/// Why leaves leave DRAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Departure {
    /// Evicted to make room: hot neighbours are spared, and the leaves count as evicted.
    ForRoom,
    /// `flush_all` or a clean shutdown: every leaf goes, and none is an eviction.
    Everything,
}

pub struct DramTier {
    tree: BTree<LeafId>,
    leaves: Slots<DramLeaf>,
    layout: PackedLayout,
    settings: DramSettings,
    memory: Arc<Memory>,
    merge_queue: Sender<LeafId>,
    pub bypass: Bypass,
    pub counters: DramCounters,
    /// Low fence of the leaf the CLOCK hand points at.
    hand: Mutex<Fence>,
    /// Held by `evict_one` for its whole group eviction.
    evicting: Mutex<()>,
    /// Above every CAS version that left DRAM (evicted, dropped, replaced by a version
    /// without one, or moved to BT_LO). See `next_cas`.
    cas_floor: AtomicU64,
    /// At least every CAS version handed out.
    cas_high: AtomicU64,
}

/// An object of a leaf on its way into a rebuilt page, an eviction or a scan.
struct Obj<'a> {
    key: &'a [u8],
    body: Body<'a>,
    meta: Meta,
    /// Came from the buffer with a key the page did not have.
    new_key: bool,
    /// The largest CAS version among the older versions of the key this one replaced.
    replaced_cas: u64,
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
        merge_queue: Sender<LeafId>,
        bypass_r: f64,
    ) -> Self {
        let layout = PackedLayout {
            subpages: settings.subpages,
            capacity: settings.leaf_size,
            hash: dram_subpage,
        };
        let leaves = Slots::default();
        let (first, slots_bytes) = leaves.allocate();
        let tree = BTree::new(LeafId(first));
        memory.change_index(tree.node_bytes() as i64 + slots_bytes);
        DramTier {
            tree,
            leaves,
            layout,
            settings,
            memory,
            merge_queue,
            bypass: Bypass::new(bypass_r),
            counters: DramCounters::default(),
            hand: Mutex::new(Fence::from(&[][..])),
            evicting: Mutex::new(()),
            cas_floor: AtomicU64::new(settings.cas_origin),
            cas_high: AtomicU64::new(settings.cas_origin),
        }
    }

    pub fn leaf_count(&self) -> u64 {
        self.tree.leaf_count()
    }

    /// Every leaf, in key order, as the tree is now (for passes that lock them one by one).
    fn leaves(&self) -> Vec<LeafId> {
        let mut leaves = Vec::with_capacity(self.tree.leaf_count() as usize);
        self.tree.for_each_leaf(|_, &leaf| leaves.push(leaf));
        leaves
    }

    /// The table as of now: every id the tree has named so far is in it.
    fn view(&self) -> View<DramLeaf> {
        self.leaves.view()
    }

    /// Runs `f` on the leaf that owns `key`, locked shared.
    fn read_leaf<R>(&self, key: &[u8], f: impl FnOnce(&DramLeaf, &LeafState) -> R) -> R {
        loop {
            let generation = self.tree.generation();
            let id = self.tree.with_leaf(key, |&id| id);
            let view = self.view();
            let Some(leaf) = view.get(id.0) else { continue };
            let st = leaf.state.read();
            if self.owns(generation, key, id) {
                return f(leaf, &st);
            }
        }
    }

    /// Runs `f` on the leaf that owns `key`, locked exclusive.
    fn write_leaf<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(LeafId, &DramLeaf, &mut LeafState) -> R,
    ) -> R {
        loop {
            let generation = self.tree.generation();
            let id = self.tree.with_leaf(key, |&id| id);
            let view = self.view();
            let Some(leaf) = view.get(id.0) else { continue };
            let mut st = leaf.state.write();
            if self.owns(generation, key, id) {
                return f(id, leaf, &mut st);
            }
        }
    }

    /// Whether the leaf `id`, routed to for `key` at `generation` and locked since, owns
    /// `key`: nothing changed in the tree since it was routed, or the tree routes there
    /// still (every change of a leaf's range is published under the leaf's lock).
    fn owns(&self, generation: u64, key: &[u8], id: LeafId) -> bool {
        self.tree.generation() == generation || self.tree.routes_to(key, &id)
    }

    pub fn get(&self, key: &[u8], now_ms: u64) -> Lookup {
        self.read_leaf(key, |leaf, st| {
            leaf.touch();
            self.lookup_locked(leaf, st, key, now_ms)
        })
    }

    fn resolve(&self, st: &LeafState, r: &Record<'_>, now_ms: u64) -> Lookup {
        let (value, meta) = match r.payload {
            Payload::Tombstone => return Lookup::Deleted,
            Payload::Inline(v) => (v.to_vec(), r.meta),
            Payload::Medium(slot) => {
                match st
                    .blobs()
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

    /// What the leaf holding `key` knows of it; the caller holds the leaf's lock.
    fn lookup_locked(&self, leaf: &DramLeaf, st: &LeafState, key: &[u8], now_ms: u64) -> Lookup {
        let found = self.with_record(leaf, st, key, |r| match r {
            Some(r) => self.resolve(st, &r, now_ms),
            // Not in this leaf; unless the leaf lost its page, then nobody knows.
            None if leaf.lost() => Lookup::Deleted,
            None => Lookup::Absent,
        });
        found.unwrap_or_else(|| {
            self.mark_lost(leaf);
            Lookup::Deleted
        })
    }

    /// Hands the newest record of `key` in a locked leaf (buffer first, then the page
    /// through early termination) to `f`; `None` if the page is damaged.
    fn with_record<R>(
        &self,
        leaf: &DramLeaf,
        st: &LeafState,
        key: &[u8],
        f: impl FnOnce(Option<Record<'_>>) -> R,
    ) -> Option<R> {
        match st.buffer().and_then(|b| b.find(key)) {
            Some(r) => Some(f(Some(r))),
            None => self.with_page_record(leaf, st, key, f),
        }
    }

    /// `with_record` for the page alone.
    fn with_page_record<R>(
        &self,
        leaf: &DramLeaf,
        st: &LeafState,
        key: &[u8],
        f: impl FnOnce(Option<Record<'_>>) -> R,
    ) -> Option<R> {
        let Some(page) = st.page.as_deref() else {
            return Some(f(None));
        };
        let (_, packed) = Summary::split(page)?;
        let (table, body) = self.layout.split(packed)?;
        if leaf.raw_page() {
            return Some(f(self.layout.find(&table, body, key)));
        }
        with_prefix(
            body,
            table.body_len(),
            self.layout.prefix_for(&table, key),
            |prefix| prefix.map(|p| f(self.layout.find(&table, p, key))),
        )
    }

    /// How a locked leaf's buffer changes its number of live objects: for each key it
    /// holds, its newest buffered record against the page's.
    fn buffered_delta(
        &self,
        leaf: &DramLeaf,
        st: &LeafState,
        buffer: &WriteBuffer,
        now_ms: u64,
    ) -> i32 {
        let mut newest: BTreeMap<&[u8], Record<'_>> = BTreeMap::new();
        for r in buffer.records() {
            newest.insert(r.key, r);
        }
        let live = |r: &Record<'_>| match r.payload {
            Payload::Tombstone => false,
            Payload::Inline(_) => !r.meta.expired(now_ms),
            Payload::Medium(slot) => st
                .blobs()
                .get(slot as usize)
                .and_then(Option::as_deref)
                .and_then(blob_header)
                .is_some_and(|(meta, _)| !meta.expired(now_ms)),
        };
        newest
            .into_iter()
            .map(|(key, r)| {
                let was = self.with_page_record(leaf, st, key, |p| p.is_some_and(|p| live(&p)));
                i32::from(live(&r)) - i32::from(was.unwrap_or(false))
            })
            .sum()
    }

    /// What the tier holds: each leaf's page summary, and its buffer's delta, worked out
    /// for the leaves written since they were last asked.
    pub fn tally(&self, now_ms: u64) -> Tally {
        let view = self.view();
        let mut tally = Tally::default();
        for id in self.leaves() {
            let Some(leaf) = view.get(id.0) else { continue };
            let st = leaf.state.read();
            let summary = st.summary();
            tally.objects += summary.objects as i64;
            tally.clean += summary.clean;
            tally.raw_bytes += summary.raw_bytes;
            if let Some(extras) = &st.extras {
                let delta = match extras.buffered.load(Ordering::Relaxed) {
                    UNKNOWN => {
                        let delta = self.buffered_delta(leaf, &st, &extras.buffer, now_ms);
                        extras.buffered.store(delta, Ordering::Relaxed);
                        delta
                    }
                    known => known,
                };
                tally.objects += i64::from(delta);
            }
        }
        tally
    }

    /// The page of a locked leaf is damaged (counted): see `LOST`.
    fn mark_lost(&self, leaf: &DramLeaf) {
        self.counters.corrupt_pages.fetch_add(1, Ordering::Relaxed);
        leaf.set(LOST, true);
        // Which versions the page held is unknown: none of them may be handed out again.
        self.raise_cas_floor(self.cas_high.load(Ordering::Acquire));
    }

    /// A new CAS version for a write into a locked leaf. Versions only need to differ
    /// between the versions of one key (clients compare a key's version with what they
    /// read of that key), so instead of one counter for all writes — which spreads the
    /// versions of a page over everything written while it filled, costing three or four
    /// incompressible bytes each — a write takes the first version above both the
    /// leaf's own (`leaf_cas_top`) and every version that left DRAM (`cas_floor`).
    /// Every version ever handed out for a key is either in its leaf (so at most the
    /// leaf's top) or gone from DRAM (so below the floor), hence below the new one; and
    /// the floor moves only when versions leave, so the versions of one page stay close
    /// and their deltas (`record.rs`) take a byte.
    fn next_cas(&self, st: &LeafState) -> u64 {
        let floor = self.cas_floor.load(Ordering::Acquire);
        let cas = floor.max(self.leaf_cas_top(st).saturating_add(1));
        self.cas_high.fetch_max(cas, Ordering::AcqRel);
        cas
    }

    /// The largest CAS version in a locked leaf's page and buffer (0 for none).
    fn leaf_cas_top(&self, st: &LeafState) -> u64 {
        let page = st.page.as_deref().and_then(|page| {
            let (summary, packed) = Summary::split(page)?;
            let base = self.layout.table(packed)?.cas_base();
            Some(base.0.wrapping_add(summary.cas_top_above_base))
        });
        let buffer = st
            .buffer()
            .and_then(|b| b.records().map(|r| r.meta.ordered_cas()).max());
        page.unwrap_or(0).max(buffer.unwrap_or(0))
    }

    /// Versions up to `cas` left DRAM: none may be handed out again.
    fn raise_cas_floor(&self, cas: u64) {
        if cas != 0 {
            self.cas_floor
                .fetch_max(cas.saturating_add(1), Ordering::AcqRel);
        }
    }

    /// Stores `value` under `key` (`None`: a tombstone, without metadata), after running
    /// `alongside` under the same leaf lock with the write's CAS version (a new one if
    /// `meta.cas` is [`ASSIGN_CAS`]): a write that must change BT_LO too (drop or add a
    /// large version) is then atomic with respect to every other write of the key.
    pub fn put_with<R>(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
        meta: Meta,
        now_ms: u64,
        alongside: impl FnOnce(u64) -> R,
    ) -> R {
        self.write_leaf(key, |id, leaf, st| {
            let meta = meta.assigning(if meta.cas == ASSIGN_CAS && !meta.client_cas {
                self.next_cas(st)
            } else {
                0
            });
            let result = alongside(meta.cas);
            let record = match value {
                Some(v) => Record {
                    key,
                    payload: Payload::Inline(v),
                    meta,
                },
                None => {
                    // The version went elsewhere (a large object's extent).
                    self.raise_cas_floor(meta.ordered_cas());
                    Record {
                        key,
                        payload: Payload::Tombstone,
                        meta: Meta::default(),
                    }
                }
            };
            self.append_locked(id, leaf, st, &record, now_ms);
            result
        })
    }

    /// Deletes `key`; returns what DRAM held of it before, and what `alongside` (run
    /// under the same leaf lock) returned.
    pub fn delete<R>(&self, key: &[u8], now_ms: u64, alongside: impl FnOnce() -> R) -> (Lookup, R) {
        self.write_leaf(key, |id, leaf, st| {
            let before = self.lookup_locked(leaf, st, key, now_ms);
            let result = alongside();
            // Without a lower tier a tombstone is only needed to hide a DRAM copy.
            if self.settings.keep_tombstones || before != Lookup::Absent {
                let record = Record {
                    key,
                    payload: Payload::Tombstone,
                    meta: Meta::default(),
                };
                self.append_locked(id, leaf, st, &record, now_ms);
            }
            (before, result)
        })
    }

    /// Atomic read-modify-write of one key: `decide` sees what DRAM holds and the CAS
    /// version a put would take, and returns the change to make (`Some(Some(value))`
    /// put, `Some(None)` delete, `None` nothing). The leaf stays locked throughout, so no
    /// other write to the key interleaves.
    pub fn modify<R>(
        &self,
        key: &[u8],
        now_ms: u64,
        decide: impl FnOnce(Lookup, u64) -> (Option<Option<(Vec<u8>, Meta)>>, R),
    ) -> R {
        self.write_leaf(key, |id, leaf, st| {
            let current = self.lookup_locked(leaf, st, key, now_ms);
            let cas = self.next_cas(st);
            let (change, result) = decide(current, cas);
            match change {
                None => {}
                Some(Some((value, meta))) => {
                    let record = Record {
                        key,
                        payload: Payload::Inline(&value),
                        meta: meta.assigning(cas),
                    };
                    self.append_locked(id, leaf, st, &record, now_ms);
                }
                Some(None) => {
                    // `decide` may have given the version to a large object.
                    self.raise_cas_floor(cas);
                    let record = Record {
                        key,
                        payload: Payload::Tombstone,
                        meta: Meta::default(),
                    };
                    self.append_locked(id, leaf, st, &record, now_ms);
                }
            }
            result
        })
    }

    fn append_locked(
        &self,
        id: LeafId,
        leaf: &DramLeaf,
        st: &mut LeafState,
        record: &Record<'_>,
        now_ms: u64,
    ) {
        leaf.touch();
        let pressure = self.charged(leaf, st, |st| {
            let extras = st.extras.get_or_insert_default();
            extras.buffered.store(UNKNOWN, Ordering::Relaxed);
            extras.buffer.append(record, self.settings.write_buffer)
        });
        match pressure {
            Pressure::Fine => {}
            Pressure::Full => {
                if !leaf.set(MERGE_QUEUED, true) {
                    // The merger may be gone at shutdown; the buffer then merges on close.
                    let _ = self.merge_queue.send(id);
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

    /// The background merger's entry: merges the buffer of leaf `id` if it still has
    /// one (the slot may hold another leaf by now; merging it does no harm).
    pub fn merge(&self, id: &LeafId, now_ms: u64) {
        let view = self.view();
        let Some(leaf) = view.get(id.0) else { return };
        let mut st = leaf.state.write();
        leaf.set(MERGE_QUEUED, false);
        if !leaf.has(RETIRED) && st.buffer().is_some_and(|b| !b.is_empty()) {
            self.merge_locked(leaf, &mut st, now_ms, false);
        }
    }

    /// Decompress → apply the buffer → recompress; splits the leaf when its records no
    /// longer fit a page. Objects that do not survive (expired, tombstones with nothing
    /// below, and with `drop_clean` the clean ones) are dropped here.
    fn merge_locked(&self, leaf: &DramLeaf, st: &mut LeafState, now_ms: u64, drop_clean: bool) {
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        let before = self.charge_of(leaf, st);
        let mut extras = st.extras.take().unwrap_or_default();
        let buffer = extras.buffer.take();
        let mut old_blobs = std::mem::take(&mut extras.blobs);
        drop(extras);
        let old_page = st.page.take();
        let decoded = self.decode(leaf, old_page.as_deref());
        let page = decoded.as_ref().map(|(base, body)| (*base, &body[..]));
        let keep_tombstones = self.settings.keep_tombstones;
        let mut objs = self.gather(page, &buffer, &old_blobs, now_ms);
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
        let dropped = |o: &Obj| {
            (drop_clean && o.meta.clean) || (!keep_tombstones && matches!(o.body, Body::Tombstone))
        };
        // Versions that leave with this merge: dropped objects, tombstones (a blob that
        // went missing above, from corruption, is one too) and what a value without a
        // version replaced. A surviving version stays in the leaf, above what it replaced.
        let gone = objs
            .iter()
            .map(|o| match o.body {
                Body::Tombstone => o.meta.ordered_cas().max(o.replaced_cas),
                _ if dropped(o) => o.meta.ordered_cas().max(o.replaced_cas),
                _ if o.meta.ordered_cas() == 0 => o.replaced_cas,
                _ => 0,
            })
            .max();
        self.raise_cas_floor(gone.unwrap_or(0));
        if drop_clean {
            let before = objs.len();
            objs.retain(|o| !o.meta.clean);
            self.counters
                .clean_dropped
                .fetch_add((before - objs.len()) as u64, Ordering::Relaxed);
        }
        // A tombstone with nothing below to hide (the blob of one that went missing above
        // must still hide an older SSD copy, so only without a lower tier).
        if !keep_tombstones {
            objs.retain(|o| !matches!(o.body, Body::Tombstone));
        }
        let chunks = self.partition(&objs);
        let hot = leaf.hot();
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
        let mut contents = contents.into_iter();
        if let Some(first) = contents.next() {
            install(leaf, st, first);
        }
        self.memory.change(&before, &self.charge_of(leaf, st));
        let access = leaf.access.load(Ordering::Relaxed);
        let lost = leaf.lost();
        for (fence, c) in fences.iter().zip(contents) {
            // New leaves start compressed: a hot leaf that splits on every few sequential
            // inserts would otherwise fill DRAM with uncompressed pages between two bypass
            // passes. The next pass promotes whichever half stays hot.
            let id = self.new_leaf(access / 2, lost, c);
            let delta = self.tree.insert(fence, id);
            self.memory.change_index(delta);
            self.counters.splits.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A leaf for `contents`, in a free slot, charged; not in the tree yet.
    fn new_leaf(&self, access: u32, lost: bool, contents: LeafContents) -> LeafId {
        let (slot, grown) = self.leaves.allocate();
        self.memory.change_index(grown);
        let view = self.view();
        let leaf = view
            .get(slot)
            .expect("a slot just handed out is in the table");
        let mut st = leaf.state.write();
        leaf.access.store(access, Ordering::Relaxed);
        leaf.flags.store(
            if lost { LOST | REFERENCED } else { REFERENCED },
            Ordering::Release,
        );
        let before = self.charge_of(leaf, &st);
        install(leaf, &mut st, contents);
        self.memory.change(&before, &self.charge_of(leaf, &st));
        LeafId(slot)
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
        let mut summary = Summary::default();
        for o in &objs {
            let value_len = match &o.body {
                Body::Inline(v) => v.len(),
                Body::Blob(b) => blob_header(b).map_or(0, |(_, n)| n),
                Body::Slot(_) | Body::Tombstone => continue,
            };
            summary.objects += 1;
            summary.clean += u64::from(o.meta.clean);
            summary.raw_bytes += (o.key.len() + value_len) as u64;
        }
        let cas_top = objs.iter().map(|o| o.meta.ordered_cas()).max().unwrap_or(0);
        summary.cas_top_above_base = cas_top.wrapping_sub(CasBase::of(&records).0);
        // `partition` only hands over chunks that fit (a single record always does:
        // `Config::validate` sees to it).
        let page = if records.is_empty() {
            None
        } else {
            self.layout
                .build(&records)
                .map(|packed| self.page(summary, &packed, hot))
        };
        drop(records);
        // Pushed one by one: `collect` would reuse the far larger `objs` allocation.
        let mut blobs = Vec::new();
        for o in objs {
            if let Body::Blob(b) = o.body {
                blobs.push(Some(b));
            }
        }
        LeafContents {
            page,
            raw: hot,
            blobs: blobs.into_boxed_slice(),
        }
    }

    /// A leaf's page from its summary and an uncompressed packed page: the body
    /// compressed unless `raw`, all in one allocation.
    fn page(&self, summary: Summary, packed: &[u8], raw: bool) -> Box<[u8]> {
        let mut front = Vec::with_capacity(32 + packed.len().min(64));
        summary.encode(&mut front);
        let header = self.layout.table(packed).map_or(packed.len(), |t| t.len());
        let (table, body) = packed.split_at(header);
        front.extend_from_slice(table);
        if raw {
            front.extend_from_slice(body);
            front.into_boxed_slice()
        } else {
            compress_behind(&front, body)
        }
    }

    /// The body of a locked leaf's page, decompressed, with its CAS base; `None` if there
    /// is no page, or it is damaged (then the leaf is marked lost: its keys are misses
    /// that hide the lower tiers).
    fn decode<'p>(
        &self,
        leaf: &DramLeaf,
        page: Option<&'p [u8]>,
    ) -> Option<(CasBase, std::borrow::Cow<'p, [u8]>)> {
        let page = page?;
        let decoded = Summary::split(page).and_then(|(_, packed)| {
            let (table, body) = self.layout.split(packed)?;
            let len = table.body_len();
            let body = if leaf.raw_page() {
                (body.len() == len).then_some(std::borrow::Cow::Borrowed(body))
            } else {
                let mut out = vec![0u8; len];
                decompress_prefix(body, len, len, &mut out).then_some(std::borrow::Cow::Owned(out))
            };
            body.map(|body| (table.cas_base(), body))
        });
        if decoded.is_none() {
            self.mark_lost(leaf);
        }
        decoded
    }

    /// The newest version of every key in a page and buffer, in key order.
    /// Expired values come back as tombstones (which hide older copies below).
    fn gather<'a>(
        &self,
        page: Option<(CasBase, &'a [u8])>,
        buffer: &'a WriteBuffer,
        blobs: &[Option<Box<[u8]>>],
        now_ms: u64,
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
                    replaced_cas: 0,
                },
            );
        }
        for r in buffer.records() {
            let body = match r.payload {
                Payload::Inline(v) => Body::Inline(v),
                // Buffers hold only inline values and tombstones.
                Payload::Medium(_) | Payload::Tombstone => Body::Tombstone,
            };
            let older = map.get(r.key);
            let new_key = older.is_none_or(|o| o.new_key);
            let replaced_cas = older.map_or(0, |o| o.meta.ordered_cas().max(o.replaced_cas));
            map.insert(
                r.key,
                Obj {
                    key: r.key,
                    body,
                    meta: r.meta,
                    new_key,
                    replaced_cas,
                },
            );
        }
        map.into_values()
            .map(|mut o| {
                if !matches!(o.body, Body::Tombstone) && o.meta.expired(now_ms) {
                    // An expired value must still hide any older copy below it.
                    o.body = Body::Tombstone;
                    o.replaced_cas = o.replaced_cas.max(o.meta.ordered_cas());
                    o.meta = Meta::default();
                }
                o
            })
            .collect()
    }

    /// What a leaf's state takes besides its slot: a pure function of the state, so
    /// every change is charged as the difference of this before and after it.
    fn charge_of(&self, leaf: &DramLeaf, st: &LeafState) -> Charge {
        let page = st.page.as_deref().map_or(0, |p| alloc_size(p.len())) as i64;
        let raw = leaf.raw_page();
        let (buffer, mediums) = match &st.extras {
            None => (0, 0),
            Some(e) => {
                let blobs: usize = e.blobs.iter().flatten().map(|b| alloc_size(b.len())).sum();
                let table = alloc_size(e.blobs.len() * size_of::<Option<Box<[u8]>>>());
                // The box itself goes with whichever of the two keeps it.
                let boxed = alloc_size(size_of::<Extras>());
                let buffer = e.buffer.charge();
                if e.buffer.is_empty() {
                    (buffer, blobs + table + boxed)
                } else {
                    (buffer + boxed, blobs + table)
                }
            }
        };
        Charge {
            compressed_pages: if raw { 0 } else { page },
            hot_pages: if raw { page } else { 0 },
            write_buffers: buffer as i64,
            mediums: mediums as i64,
            index: 0,
        }
    }

    /// Runs `f` on a locked leaf's state (and flags) and charges what it changed.
    fn charged<R>(
        &self,
        leaf: &DramLeaf,
        st: &mut LeafState,
        f: impl FnOnce(&mut LeafState) -> R,
    ) -> R {
        let before = self.charge_of(leaf, st);
        let result = f(st);
        st.tidy();
        self.memory.change(&before, &self.charge_of(leaf, st));
        result
    }

    /// Evicts one group of leaves around a victim chosen by CLOCK. Returns false if
    /// nothing could be evicted. With a sink, may do I/O (the SSD tier's merge).
    pub fn evict_one(&self, sink: Option<&dyn EvictionSink>, now_ms: u64) -> bool {
        // One group eviction at a time: two collapses over overlapping runs of leaves
        // would each hold leaves the other waits for.
        let _evicting = self.evicting.lock();
        self.clock_victim(|low, id, leaf| {
            if self.drop_clean(leaf, now_ms) {
                return true;
            }
            let high = self.tree.next_leaf(low).map(|(next, _)| next);
            let span = match sink {
                Some(sink) => sink.span(low, high.as_deref()),
                None => (low.clone(), high),
            };
            self.evict_group(low, id, span, Departure::ForRoom, sink, now_ms)
        })
    }

    /// Overload (the flusher is behind and DRAM is full): frees one CLOCK victim without
    /// writing anything. Its clean objects go as in `evict_one`; otherwise its objects are
    /// dropped (counted in `write_drops`) and the leaf is marked lost, so that its keys
    /// miss instead of reaching older copies below until the flusher evicts it and the SSD
    /// tier forgets its range. Never does I/O nor waits for it.
    pub fn drop_one(&self, now_ms: u64) -> bool {
        self.clock_victim(|_, _, leaf| self.drop_clean(leaf, now_ms) || self.drop_unwritten(leaf))
    }

    /// Moves the CLOCK hand until `take` takes a victim: referenced leaves are spared
    /// once, hot ones for two sweeps; then, with nothing else left to take, the budget
    /// wins over the hot sub-tier. The hand's lock is not held while `take` runs, which
    /// may do I/O: a foreground `drop_one` (which locks one leaf at a time, as a merge
    /// does) must not wait behind the flusher's.
    fn clock_victim(&self, mut take: impl FnMut(&Fence, LeafId, &DramLeaf) -> bool) -> bool {
        let leaves = self.tree.leaf_count();
        for step in 0..3 * leaves + 2 {
            let spare_hot = step < 2 * leaves + 1;
            let (low, id) = self.tree.clock_step(&mut self.hand.lock());
            let view = self.view();
            let Some(leaf) = view.get(id.0) else { continue };
            if leaf.set(REFERENCED, false) || (spare_hot && leaf.hot()) {
                continue;
            }
            if take(&low, id, leaf) {
                return true;
            }
        }
        false
    }

    /// Empties a leaf without handing its objects to the lower tier: see `drop_one`.
    fn drop_unwritten(&self, leaf: &DramLeaf) -> bool {
        let mut st = leaf.state.write();
        let buffered = st.buffer().map_or(0, |b| b.records().count() as u64);
        if leaf.has(RETIRED) || st.summary().objects + buffered == 0 {
            return false;
        }
        self.counters
            .write_drops
            .fetch_add(st.summary().objects + buffered, Ordering::Relaxed);
        // Its versions are forgotten with it: none may be handed out again.
        self.raise_cas_floor(self.leaf_cas_top(&st));
        self.charged(leaf, &mut st, |st| *st = LeafState::default());
        leaf.set(RAW_PAGE, false);
        leaf.set(LOST, true);
        true
    }

    /// Clean first: a cold leaf that holds clean objects (unchanged copies of SSD-tier
    /// objects) gives up just those. Dropping them writes nothing and loses no hit (a
    /// later GET finds them on the SSD); its dirty objects stay and gather company, so
    /// that when the leaf does leave, its super-leaves are rewritten for more new
    /// objects. False if the leaf holds nothing clean.
    fn drop_clean(&self, leaf: &DramLeaf, now_ms: u64) -> bool {
        let mut st = leaf.state.write();
        let buffered = st
            .buffer()
            .map_or(0, |b| b.records().filter(|r| r.meta.clean).count());
        if leaf.has(RETIRED) || st.summary().clean as usize + buffered == 0 {
            return false;
        }
        self.merge_locked(leaf, &mut st, now_ms, true);
        true
    }

    /// Evicts `leaf` together with its neighbours inside `span`, the key range of the SSD
    /// super-leaves `leaf` maps to ([`EvictionSink::span`]), so that one read-modify-write
    /// of each super-leaf takes the objects of all of them: a super-leaf covers the key
    /// range of several DRAM leaves, and rewriting it once per DRAM leaf multiplies the
    /// bytes written to the SSD. Evicted for room, hot (bypassed) neighbours stay. The
    /// group's range joins the leaf left of it; the first leaf of the tree is emptied in
    /// place instead.
    fn evict_group(
        &self,
        low: &Fence,
        leaf: LeafId,
        (span_low, span_high): (Fence, Option<Fence>),
        why: Departure,
        sink: Option<&dyn EvictionSink>,
        now_ms: u64,
    ) -> bool {
        let spare_hot = why == Departure::ForRoom;
        let hot = |id: &LeafId| {
            let view = self.view();
            view.get(id.0).is_some_and(DramLeaf::hot)
        };
        let mut run = VecDeque::from([(low.clone(), leaf)]);
        while run.len() < MAX_EVICTION_GROUP && run[0].0.as_ref() > span_low.as_ref() {
            match self.tree.prev_leaf(&run[0].0) {
                Some(prev) if !(spare_hot && hot(&prev.1)) => run.push_front(prev),
                _ => break,
            }
        }
        while run.len() < MAX_EVICTION_GROUP {
            let last = &run[run.len() - 1].0;
            match self.tree.next_leaf(last) {
                Some(next)
                    if !(spare_hot && hot(&next.1))
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
        // Ids the tree named before this view was taken are all in it.
        let view = self.view();
        let Some(locks) = run
            .iter()
            .map(|(_, id)| view.get(id.0).map(|l| &l.state))
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        let leaf = |id: &LeafId| {
            view.get(id.0)
                .expect("every leaf of the run is in the view")
        };
        let removed = self.tree.collapse(&run, &locks, |states| {
            let high = self
                .tree
                .next_leaf(&run[run.len() - 1].0)
                .map(|(next, _)| next);
            let victims = &run[keeps_range..];
            if why == Departure::ForRoom {
                for ((_, id), st) in victims.iter().zip(&states[keeps_range..]) {
                    self.count_eviction(leaf(id), st, sink.is_none(), now_ms);
                }
            }
            self.hand_over(
                &view,
                victims,
                high,
                &mut states[keeps_range..],
                sink,
                now_ms,
            );
            for (_, id) in &run[1..] {
                leaf(id).set(RETIRED, true);
            }
        });
        let Some(delta) = removed else { return false };
        self.memory.change_index(delta);
        for (_, id) in &run[1..] {
            if leaf(id).set(HOT, false) {
                self.counters.hot_leaves.fetch_sub(1, Ordering::Relaxed);
            }
            self.memory.change_index(self.leaves.free(id.0));
        }
        true
    }

    /// Gives the objects of locked, consecutive leaves (`run`, the last one's range
    /// ending at `high`) to `sink` in one batch and empties the leaves.
    fn hand_over(
        &self,
        view: &View<DramLeaf>,
        run: &[(Fence, LeafId)],
        high: Option<Fence>,
        victims: &mut [RwLockWriteGuard<'_, LeafState>],
        sink: Option<&dyn EvictionSink>,
        now_ms: u64,
    ) {
        let leaf = |i: usize| view.get(run[i].1.0).expect("locked by the caller");
        if let Some(sink) = sink.filter(|_| !run.is_empty()) {
            for i in (0..run.len()).filter(|&i| leaf(i).lost()) {
                let high_i = run
                    .get(i + 1)
                    .map(|(f, _)| f.clone())
                    .or_else(|| high.clone());
                sink.forget(&run[i].0, high_i.as_deref());
            }
            let objects = victims
                .iter()
                .enumerate()
                .flat_map(|(i, st)| self.export(leaf(i), st, now_ms))
                .collect();
            sink.absorb(&run[0].0, high.as_deref(), objects);
        }
        for (i, st) in victims.iter_mut().enumerate() {
            self.raise_cas_floor(self.leaf_cas_top(st));
            let leaf = leaf(i);
            self.charged(leaf, st, |st| *st = LeafState::default());
            leaf.set(RAW_PAGE, false);
            leaf.set(LOST, false);
        }
    }

    /// Counts a locked leaf evicted for room; with nothing below to take its objects,
    /// they are dropped from the cache: the page's and the buffer's.
    fn count_eviction(&self, leaf: &DramLeaf, st: &LeafState, dropped: bool, now_ms: u64) {
        let objects = st.summary().objects;
        self.counters.evicted_leaves.fetch_add(1, Ordering::Relaxed);
        self.counters
            .evicted_objects
            .fetch_add(objects, Ordering::Relaxed);
        if dropped {
            let buffered = st.extras.as_ref().map_or(0, |extras| {
                match extras.buffered.load(Ordering::Relaxed) {
                    UNKNOWN => self.buffered_delta(leaf, st, &extras.buffer, now_ms),
                    known => known,
                }
            });
            let live = objects as i64 + i64::from(buffered);
            self.counters
                .dropped_objects
                .fetch_add(live.max(0) as u64, Ordering::Relaxed);
        }
    }

    /// A leaf's newest objects in key order, tombstones included.
    fn export(&self, leaf: &DramLeaf, st: &LeafState, now_ms: u64) -> Vec<EvictedObject> {
        self.entries(leaf, st, now_ms, None)
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
    fn entries(
        &self,
        leaf: &DramLeaf,
        st: &LeafState,
        now_ms: u64,
        range: Option<Bounds<'_>>,
    ) -> Vec<ScanEntry> {
        let decoded = self.decode(leaf, st.page.as_deref());
        let page = decoded.as_ref().map(|(base, body)| (*base, &body[..]));
        let in_range = |k: &[u8]| range.is_none_or(|r| std::ops::RangeBounds::contains(&r, k));
        let empty = WriteBuffer::default();
        let buffer = st.buffer().unwrap_or(&empty);
        self.gather(page, buffer, st.blobs(), now_ms)
            .into_iter()
            .filter(|o| in_range(o.key))
            .map(|o| {
                let value = match o.body {
                    Body::Inline(v) => Some((v.to_vec(), o.meta)),
                    Body::Slot(slot) => match st
                        .blobs()
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
        self.read_leaf(cursor, |leaf, st| {
            let entries = self.entries(leaf, st, now_ms, Some((Bound::Included(cursor), end)));
            // The leaf's high fence cannot move while it is locked.
            let next = self.tree.next_leaf(cursor).map(|(next, _)| next);
            (entries, next, leaf.lost())
        })
    }

    /// One pass of adaptive compression bypassing: choose the hot leaves, convert the
    /// leaves whose status changed, and age every counter.
    pub fn bypass_pass(&self) {
        let ids = self.leaves();
        let view = self.view();
        let leaves: Vec<&DramLeaf> = ids.iter().filter_map(|id| view.get(id.0)).collect();
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
            let beside_page = {
                let charge = self.charge_of(leaves[i], &leaves[i].state.read());
                (charge.write_buffers + charge.mediums) as u64
            };
            pinned += page + beside_page;
            if pinned > hot_budget {
                break;
            }
            want[i] = true;
        }
        for (leaf, (want, count)) in leaves.iter().zip(want.into_iter().zip(counts)) {
            if leaf.hot() != want {
                self.set_hot(leaf, want);
            }
            leaf.access.store(count >> 1, Ordering::Relaxed);
        }
    }

    fn set_hot(&self, leaf: &DramLeaf, hot: bool) {
        let mut st = leaf.state.write();
        if leaf.has(RETIRED) {
            return;
        }
        leaf.set(HOT, hot);
        self.counters
            .hot_leaves
            .fetch_add(if hot { 1 } else { -1 }, Ordering::Relaxed);
        if leaf.raw_page() == hot {
            return;
        }
        let converted = st.page.as_deref().map(|page| self.repage(leaf, page, hot));
        self.charged(leaf, &mut st, |st| match converted {
            None => {}
            Some(Some(page)) => {
                st.page = Some(page);
                leaf.set(RAW_PAGE, hot);
            }
            Some(None) => {
                // Damaged (the leaf is marked lost): its objects are gone either way.
                st.page = None;
                if let Some(extras) = &mut st.extras {
                    extras.blobs = Box::default();
                }
            }
        });
    }

    /// A locked leaf's page rebuilt with its body `raw` (or compressed); `None` if the
    /// page is damaged.
    fn repage(&self, leaf: &DramLeaf, page: &[u8], raw: bool) -> Option<Box<[u8]>> {
        let (summary, packed) = Summary::split(page)?;
        let header = self.layout.table(packed)?.len();
        let (_, body) = self.decode(leaf, Some(page))?;
        Some(self.page(summary, &[&packed[..header], &body].concat(), raw))
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
            if self.evict_group(&low, first, everything, Departure::Everything, sink, now_ms)
                && self.tree.leaf_count() == 1
            {
                return;
            }
        }
    }

    /// Merges every buffered write into its page (before a clean shutdown).
    pub fn merge_all(&self, now_ms: u64) {
        for id in self.leaves() {
            self.merge(&id, now_ms);
        }
    }
}

struct LeafContents {
    page: Option<Box<[u8]>>,
    /// The page's body is uncompressed.
    raw: bool,
    blobs: Box<[Option<Box<[u8]>>]>,
}

/// Puts a page and its blobs into a locked leaf (the caller charges the change).
fn install(leaf: &DramLeaf, st: &mut LeafState, c: LeafContents) {
    st.page = c.page;
    leaf.set(RAW_PAGE, c.raw && st.page.is_some());
    if !c.blobs.is_empty() {
        st.extras.get_or_insert_default().blobs = c.blobs;
    } else if let Some(extras) = &mut st.extras {
        extras.blobs = Box::default();
    }
    st.tidy();
}

/// The shortest key `s` with `left < s <= right`: a prefix of `right` (suffix truncation
/// keeps inner-node fences short).
pub(crate) fn separator(left: &[u8], right: &[u8]) -> Fence {
    debug_assert!(left < right);
    let common = left.iter().zip(right).take_while(|(a, b)| a == b).count();
    Fence::from(&right[..(common + 1).min(right.len())])
}

#[cfg(test)]
impl DramTier {
    /// Overwrites the page of the leaf holding `key` with garbage, as a DRAM error would.
    pub(crate) fn corrupt_page_of(&self, key: &[u8]) {
        self.write_leaf(key, |_, _, st| {
            if let Some(page) = &mut st.page {
                page.fill(0xf7);
            }
        });
    }

    /// What a bypass pass would do to leaves that are all above the threshold.
    pub(crate) fn make_every_leaf_hot(&self) {
        let view = self.view();
        for id in self.leaves() {
            if let Some(leaf) = view.get(id.0).filter(|l| !l.hot()) {
                self.set_hot(leaf, true);
            }
        }
    }

    /// Overwrites every medium blob of the leaf holding `key` with garbage.
    pub(crate) fn corrupt_blob_of(&self, key: &[u8]) {
        self.write_leaf(key, |_, _, st| {
            if let Some(extras) = &mut st.extras {
                for blob in extras.blobs.iter_mut().flatten() {
                    blob.iter_mut().for_each(|b| *b = 0xf7);
                }
            }
        });
    }
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
            cas_origin: 1 << 40,
        };
        let (merges, _) = crossbeam_channel::unbounded();
        DramTier::new(settings, Arc::new(Memory::default()), merges, 0.0)
    }

    fn key(i: u32) -> Vec<u8> {
        format!("{i:08}").into_bytes()
    }

    /// Clears a leaf's CLOCK bit, as a sweep of the hand would.
    fn unreference(dram: &DramTier, id: LeafId) {
        dram.view().get(id.0).unwrap().set(REFERENCED, false);
    }

    /// The account, recounted from scratch: every leaf's state, the tree, the table.
    fn recount(dram: &DramTier) -> Charge {
        let view = dram.view();
        let mut total = Charge::default();
        for id in dram.leaves() {
            let leaf = view.get(id.0).unwrap();
            let c = dram.charge_of(leaf, &leaf.state.read());
            total.compressed_pages += c.compressed_pages;
            total.hot_pages += c.hot_pages;
            total.write_buffers += c.write_buffers;
            total.mediums += c.mediums;
        }
        total.index = (dram.tree.node_bytes() + dram.leaves.bytes() as u64) as i64;
        total
    }

    fn settings(write_buffer: usize) -> DramSettings {
        DramSettings {
            write_buffer,
            ..tier().settings
        }
    }

    fn tier_with(settings: DramSettings) -> (DramTier, Arc<Memory>) {
        let memory = Arc::new(Memory::default());
        let (merges, _) = crossbeam_channel::unbounded();
        (DramTier::new(settings, memory.clone(), merges, 0.0), memory)
    }

    /// A leaf costs a 40-byte slot; with the tree's entry (a 4-byte id, its fence's
    /// distinct bytes and a 2-byte offset) and its share of the inner nodes it stays
    /// within 64 bytes, as the account charges it. The account matches a recount of
    /// every allocation's size and capacity, before and after evictions.
    #[test]
    fn a_leaf_costs_at_most_64_bytes_and_the_account_is_exact() {
        assert_eq!(size_of::<DramLeaf>(), 40);
        let (dram, memory) = tier_with(settings(256));
        let mut order: Vec<u32> = (0..40_000).collect();
        // Spread over the key space, as a hashed workload would.
        order.sort_by_key(|&i| i.wrapping_mul(2_654_435_761));
        for &i in &order {
            let key = format!("{i:016}").into_bytes();
            let meta = Meta {
                cas: 1 << 40 | u64::from(i),
                ..Meta::default()
            };
            dram.put_with(&key, Some(&[i as u8; 64]), meta, 0, |_| ());
        }
        dram.merge_all(0);
        assert_eq!(memory.snapshot(), recount(&dram));
        let leaves = dram.leaf_count() as i64;
        let per_leaf = memory.snapshot().index / leaves;
        assert!(leaves > 500, "{leaves} leaves");
        assert!(per_leaf <= 64, "{per_leaf} bytes per leaf");
        assert_eq!(
            memory.snapshot().write_buffers,
            0,
            "merged buffers keep nothing"
        );
        for _ in 0..200 {
            dram.evict_one(None, 0);
        }
        assert_eq!(memory.snapshot(), recount(&dram));
        for &i in &order[..5000] {
            dram.put_with(
                &format!("{i:016}").into_bytes(),
                Some(b"again"),
                Meta::default(),
                0,
                |_| (),
            );
        }
        assert_eq!(memory.snapshot(), recount(&dram));
        dram.evict_all(None, 0);
        assert_eq!(memory.snapshot(), recount(&dram));
        assert_eq!(dram.leaf_count(), 1);
    }

    /// Every new CAS version of a key is above every version handed out for it before,
    /// through overwrites, deletes, expiry, merges, splits, evictions (to nowhere and to
    /// a lower tier whose copies come back as clean objects) and damaged pages.
    #[test]
    fn a_keys_cas_versions_only_grow() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (dram, _) = tier_with(settings(128));
        let sink = RecordingSink {
            span: (Fence::from(&[][..]), None),
            batches: Mutex::default(),
        };
        let mut last: BTreeMap<u32, u64> = BTreeMap::new();
        let mut now = 0;
        let assign = Meta {
            cas: ASSIGN_CAS,
            ..Meta::default()
        };
        for step in 0..20_000 {
            let k = rng.random_range(0..300u32);
            let key = format!("{k:016}").into_bytes();
            let value = vec![k as u8; rng.random_range(1..120)];
            let cas = match rng.random_range(0..10) {
                0 => {
                    dram.delete(&key, now, || ());
                    None
                }
                1 => Some(dram.modify(&key, now, |_, cas| {
                    (Some(Some((value.clone(), assign.assigning(cas)))), cas)
                })),
                2 => {
                    let meta = Meta {
                        expires_at_ms: Some(now + 1),
                        ..assign
                    };
                    Some(dram.put_with(&key, Some(&value), meta, now, |cas| cas))
                }
                3 => {
                    dram.evict_one(Some(&sink), now);
                    None
                }
                4 if step % 50 == 0 => {
                    dram.corrupt_page_of(&key);
                    None
                }
                5 => {
                    dram.evict_one(None, now);
                    None
                }
                _ => Some(dram.put_with(&key, Some(&value), assign, now, |cas| cas)),
            };
            if let Some(cas) = cas {
                let before = last.insert(k, cas).unwrap_or(0);
                assert!(cas > before, "key {k}: version {cas} after {before}");
            }
            // Some of what went below comes back as clean copies, versions and all.
            for batch in sink.batches.lock().drain(..) {
                for o in batch
                    .into_iter()
                    .filter(|o| o.value.is_some() && o.key[15] % 2 == 0)
                {
                    dram.modify(&o.key, now, |current, _| {
                        let change = (current == Lookup::Absent).then(|| {
                            let meta = Meta {
                                clean: true,
                                ..o.meta
                            };
                            Some((o.value.clone().unwrap(), meta))
                        });
                        (change, ())
                    });
                }
            }
            now += rng.random_range(0..2);
        }
    }

    /// Written in random key order, without a counter shared by all writes, the versions
    /// of each page stay within a two-byte delta of its base.
    #[test]
    fn cas_versions_in_a_page_stay_close() {
        let (dram, _) = tier_with(settings(256));
        let assign = Meta {
            cas: ASSIGN_CAS,
            ..Meta::default()
        };
        for n in 0..40_000u32 {
            let i = n.wrapping_mul(2_654_435_761) % 1_000_000;
            dram.put_with(
                &format!("{i:016}").into_bytes(),
                Some(&[1; 64]),
                assign,
                0,
                |_| (),
            );
            if n % 64 == 0 {
                dram.evict_one(None, 0);
            }
        }
        dram.merge_all(0);
        let view = dram.view();
        for id in dram.leaves() {
            let st = view.get(id.0).unwrap().state.read();
            let Some(page) = st.page.as_deref() else {
                continue;
            };
            let (summary, packed) = Summary::split(page).unwrap();
            let base = dram.layout.table(packed).unwrap().cas_base();
            assert!(base.0 >= 1 << 40);
            assert!(summary.cas_top_above_base < 1 << 14, "{summary:?}");
        }
    }

    /// Write buffers at rest after a fill: only leaves written since their last merge
    /// hold one, and it is gone once merged.
    #[test]
    fn write_buffers_at_rest_take_under_two_bytes_an_object() {
        let (dram, memory) = tier_with(settings(256));
        for i in 0..40_000u32 {
            let key = format!("{:016}", i.wrapping_mul(2_654_435_761) % 1_000_000).into_bytes();
            dram.put_with(&key, Some(&[i as u8; 64]), Meta::default(), 0, |_| ());
        }
        // Full buffers are queued for the background merger, which this tier has not.
        for _ in 0..2 {
            let view = dram.view();
            for id in dram.leaves() {
                let leaf = view.get(id.0).unwrap();
                if leaf.has(MERGE_QUEUED) {
                    dram.merge(&id, 0);
                }
            }
        }
        let objects = dram.tally(0).objects;
        let at_rest = memory.snapshot().write_buffers as f64 / objects as f64;
        assert!(at_rest <= 2.0, "{at_rest} buffer bytes per object");
        dram.merge_all(0);
        assert_eq!(memory.snapshot().write_buffers, 0);
        assert_eq!(dram.tally(0).objects, objects);
    }

    #[test]
    fn one_eviction_takes_every_leaf_of_the_sinks_span_in_one_batch() {
        let dram = tier();
        for i in 0..3000 {
            dram.put_with(&key(i), Some(&[7; 60]), Meta::default(), 0, |_| ());
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
        unreference(&dram, victim);
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
            dram.put_with(&key(i), Some(&[7; 60]), Meta::default(), 0, |_| ());
        }
        let sink = RecordingSink {
            span: (Fence::from(&[][..]), None),
            batches: Mutex::default(),
        };
        let (low, victim) = dram.tree.find(&key(1300));
        let (right_first, right) = dram.tree.next_leaf(&low).unwrap();
        dram.set_hot(dram.view().get(right.0).unwrap(), true);
        unreference(&dram, victim);
        *dram.hand.lock() = low;
        assert!(dram.evict_one(Some(&sink), 0));
        assert!(!dram.view().get(right.0).unwrap().has(RETIRED));
        assert!(dram.tree.routes_to(&right_first, &right));
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
            dram.put_with(&key(i), Some(&[i as u8; 40]), meta, 0, |_| ());
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
        unreference(&dram, dram.tree.find(&[]).1);
        assert!(dram.evict_one(Some(&sink), 0));
        let batches = sink.batches.lock();
        let keys: Vec<Vec<u8>> = batches[0].iter().map(|o| o.key.clone()).collect();
        assert_eq!(
            keys,
            (0..10).filter(|i| i % 2 == 1).map(key).collect::<Vec<_>>()
        );
    }
}
