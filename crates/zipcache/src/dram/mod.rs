//! BT_DRAM, the compressed DRAM tier (paper §3.2).
//!
//! A B+ tree ([`BTree`]) of leaves. Each leaf holds a 4 KiB logical page of `n`
//! hash-partitioned sub-pages of variable length ([`packed_page`])
//! stored as one LZ4 stream (or uncompressed while hot, [`bypass`]), the
//! individually compressed blobs of its medium objects, and a write buffer
//! ([`write_buffer`]).
//!
//! A leaf is small because there are many: its descriptor is a 40-byte slot in a table
//! ([`slots`]) that the tree names by a 32-bit id; it keeps no fences (the
//! tree's bottom nodes hold them packed, and a leaf's high fence is its right
//! neighbour's low); its object counts travel in its page; its blobs and buffer sit in
//! one box that exists only while it has either.
//!
//! Concurrency: the tree is read without locks; each leaf has its own `RwLock`. GETs take
//! it shared, writers exclusive. Whoever locks a leaf checks with the tree that the leaf
//! still owns its key (it may have split, been evicted, or its slot been reused since
//! the tree was read) and otherwise goes back to the root ([`BTree::with_leaf_locked`]).
//! Lock order is left leaf → right leaf → tree writer, which the splitting merge and
//! eviction both follow.
//!
//! Modules by technique: this one holds the tier, its GET, writes and scan; [`leaf`] the
//! leaf descriptor, its state and what that is charged; [`access`] objects' access state
//! (setting `track_access`); [`page`] the page format;
//! [`medium_blob`] a medium value's blob as a write makes it; [`merge`] buffer merges
//! and splits; [`share`] a full leaf sharing with its
//! neighbour before it splits; [`eviction`] CLOCK and group eviction; [`hot`]
//! compression bypassing; [`cas`] CAS versions; [`tally`] object counts for `stats`;
//! [`remark`] marking dirty keys again for the crash journal.

mod access;
mod block;
mod bypass;
mod cas;
mod defrag;
pub(crate) use defrag::SPARSE_PERCENT;
pub(crate) mod early_termination;
mod eviction;
mod frequency;
mod hot;
mod leaf;
mod medium_blob;
use medium_blob::BlobSource;
mod merge;
pub(crate) mod packed_page;
mod page;
mod patch;
mod reclaim;
mod remark;
use remark::Marking;
mod share;
mod slots;
mod tally;
#[cfg(test)]
mod test_support;
mod write_buffer;

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::AccessState;
use crate::btree::{BTree, Child, Exclusive, Fence, Shared};
use crate::dictionary::Dictionary;
use crate::dictionary::kinds::Dictionaries;
use crate::dictionary::page::PageDictionary;
use crate::dictionary::training::TrainingSettings;
use crate::eviction::EvictionListener;
use crate::memory::Memory;
use crate::record::{
    ASSIGN_CAS, Meta, Payload, Record, blob_dictionary, blob_header, decode_blob,
    reheader_blob_with,
};
use crate::restart::shadow::{MayBeOnFlash, Shadow};
use crate::subpage_hash::dram_subpage;
use access::{AccessClock, fingerprint};
use block::Block;
use bypass::Bypass;
use hot::Heat;
use leaf::{DramLeaf, Extras, LeafState, MERGE_QUEUED, UNKNOWN, WRITTEN};
use packed_page::PackedLayout;
pub use reclaim::Reclaimed;
use slots::{SlotId, Slots, View};
use write_buffer::{Pressure, buffer_limit};

/// What the DRAM tier knows about a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A live value, and with `track_access` its access state before this read.
    Found(Vec<u8>, Meta, Option<AccessState>),
    /// A live medium value left compressed, with its length: what a write that needs
    /// the metadata alone finds (`Wanted::Meta`). Never what `get` answers.
    Sealed(Meta, usize, Option<AccessState>),
    /// A tombstone: the key was deleted or replaced by a large object. Also what a
    /// damaged page or blob answers (counted): it may have held a newer version or a
    /// tombstone, so the older SSD copies must stay hidden.
    Deleted,
    /// The newest DRAM version expired: a miss, and lower tiers hold nothing newer.
    Expired,
    /// Not in DRAM; lower tiers may have it.
    Absent,
}

/// How much of a live value a lookup under the leaf lock hands back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// The value, decompressed.
    Value,
    /// Its metadata and length: a medium value's blob is not decompressed
    /// (`Lookup::Sealed`), as a TTL change or a delete needs no value.
    Meta,
}

/// Whether a read-modify-write's look at its key counts as a GET of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// Not at all: the object's access state, its leaf's CLOCK bit and the frequency
    /// sketch stay as they were.
    Peek,
    /// As a GET's would (`DramTier::get`): for a write that reads the value where a GET
    /// used to read it first, so that eviction still sees the object read.
    Read,
}

/// What a GET's look at `leaf` counts: its access (a peek's not), and a read of its
/// buffer — what a bigger buffer costs (`next_level`). A write's own look, under the
/// write lock, is part of the write and counts neither (unless it reads in a GET's
/// place, `Look::Read`).
fn count_look(leaf: &DramLeaf, st: &LeafState, peek: bool) {
    if !peek {
        leaf.touch();
    }
    if let Some(extras) = st.extras.as_ref().filter(|e| !e.buffer.is_empty()) {
        extras.count_read();
    }
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

#[derive(Clone, Copy, Debug)]
pub struct DramSettings {
    pub leaf_size: usize,
    pub subpages: usize,
    /// Chunks a page's body is compressed in (`early_termination.rs`).
    pub page_chunks: usize,
    pub write_buffer: usize,
    pub tiny_max: usize,
    pub dram_capacity: u64,
    pub bypass_max_fraction: f64,
    /// With an SSD tier below, tombstones must live until they reach it.
    pub keep_tombstones: bool,
    /// Where CAS versions start: above every version an earlier run may have handed out.
    pub cas_origin: u64,
    /// Keep each object's access state ([`access`]).
    pub track_access: bool,
    /// Compress medium objects with dictionaries trained so ([`crate::dictionary`]);
    /// `None`: LZ4 alone.
    pub dictionaries: Option<TrainingSettings>,
    /// The engine clock at open: access times are whole seconds from it.
    pub opened_ms: u64,
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
    /// Objects a leaf kept because they are read often, each time it was evicted.
    pub retained_objects: AtomicU64,
    /// Objects dropped unwritten because the flusher was behind (`drop_one`).
    pub write_drops: AtomicU64,
    pub corrupt_pages: AtomicU64,
    pub hot_leaves: AtomicI64,
    /// Hot leaves whose blobs are stored as is (`Heat::HotBlobs`).
    pub hot_blob_leaves: AtomicI64,
    /// Bytes of pages and blobs moved out of sparse allocator pages (`defrag.rs`).
    pub defrag_moved_bytes: AtomicU64,
}

pub struct DramTier {
    /// With an SSD tier: every write of a key the SSD may hold marks it before it can be
    /// seen, so a crash cannot bring back the key's older flash version (`remark.rs`).
    marking: Option<Marking>,
    tree: BTree<LeafId>,
    leaves: Slots<DramLeaf>,
    layout: PackedLayout,
    settings: DramSettings,
    memory: Arc<Memory>,
    /// Leaves whose write buffer is full, for the background merger.
    pub(crate) merge_queue: merge::MergeQueue,
    pub bypass: Bypass,
    pub counters: DramCounters,
    /// How often keys were read lately: eviction keeps a cold leaf's hot objects.
    reads: frequency::ReadFrequency,
    /// Trained dictionaries for medium objects; `None` with the setting off.
    pub(crate) dictionaries: Option<Arc<Dictionaries>>,
    /// Low fence of the leaf the CLOCK hand points at.
    hand: Mutex<Fence>,
    /// Held by `evict_one` for its whole group eviction, and by whoever frees the slots
    /// of leaves taken out of the tree: an eviction walks the tree one step at a time,
    /// and a slot freed and handed out again meanwhile could sit twice in its run, or be
    /// locked by it while a split takes it.
    evicting: Mutex<()>,
    /// Leaves a share took out of the tree, their slots not free yet (see `evicting`).
    retired: Mutex<Vec<LeafId>>,
    /// Above every CAS version that left DRAM (evicted, dropped, replaced by a version
    /// without one, or moved to BT_LO). See `next_cas`.
    cas_floor: AtomicU64,
    /// At least every CAS version handed out.
    cas_high: AtomicU64,
    /// Told of the values dropped for room (`ZipCache::set_eviction_listener`); read
    /// once per eviction, not per request.
    pub(crate) eviction_listener: RwLock<Option<Arc<dyn EvictionListener>>>,
}

/// The leaf `id` names in `view`; `None` if it was handed out after the view was taken.
fn reach<'v>(view: &'v View<DramLeaf>, id: &'v LeafId) -> Option<&'v DramLeaf> {
    view.get(id.0)
}

/// A value `modify` stores: value, metadata and the access state it starts with.
pub type Stored = (Vec<u8>, Meta, Option<AccessState>);

/// What `modify` writes.
pub enum Change {
    /// A value.
    Put(Stored),
    /// The value `modify` found, with new metadata (a TTL set, a touch): a medium value's
    /// blob keeps its compressed bytes under a new header rather than being compressed
    /// again (`record::reheader_blob_with`). `value` is stored where DRAM holds no blob of
    /// it; `None` for a value found sealed (`Lookup::Sealed`), whose blob is re-headed.
    Redate {
        value: Option<Vec<u8>>,
        meta: Meta,
        access: Option<AccessState>,
    },
    /// A tombstone.
    Delete,
}

/// One key of a scan: its newest DRAM version, `None` for a tombstone or an expired value
/// (which hide older versions in lower tiers).
pub type ScanEntry = (Vec<u8>, Option<(Vec<u8>, Meta)>);

/// One DRAM leaf's part of a scan.
pub struct LeafScan {
    pub entries: Vec<ScanEntry>,
    /// Where the next leaf starts; `None` after the last leaf.
    pub next: Option<Fence>,
    /// The leaf lost its page: no lower tier may answer for its range.
    pub lost: bool,
    /// The access state of its live entries (setting `track_access`), read as a peek.
    pub access: HashMap<Vec<u8>, AccessState>,
}

type Bounds<'k> = (Bound<&'k [u8]>, Bound<&'k [u8]>);

impl DramTier {
    pub fn new(settings: DramSettings, memory: Arc<Memory>, bypass_r: f64) -> Self {
        let layout = PackedLayout {
            subpages: settings.subpages,
            chunks: settings.page_chunks,
            capacity: settings.leaf_size,
            hash: dram_subpage,
        };
        let leaves = Slots::default();
        let (first, slots_bytes) = leaves.allocate();
        let tree = BTree::new(LeafId(first));
        let reads = frequency::ReadFrequency::new(settings.dram_capacity);
        let dictionaries = settings
            .dictionaries
            .map(|training| Arc::new(Dictionaries::new(training, memory.clone())));
        memory.change_index(tree.node_bytes() as i64 + slots_bytes + reads.bytes());
        DramTier {
            marking: None,
            tree,
            leaves,
            layout,
            settings,
            memory,
            merge_queue: merge::MergeQueue::new(),
            bypass: Bypass::new(bypass_r),
            counters: DramCounters::default(),
            reads,
            dictionaries,
            hand: Mutex::new(Fence::from(&[][..])),
            evicting: Mutex::new(()),
            retired: Mutex::new(Vec::new()),
            eviction_listener: RwLock::new(None),
            cas_floor: AtomicU64::new(settings.cas_origin),
            cas_high: AtomicU64::new(settings.cas_origin),
        }
    }

    /// The tier marking in `shadow` every write of a key `flash` may hold
    /// (`append_locked`).
    pub(crate) fn with_shadow(self, shadow: Arc<Shadow>, flash: Arc<dyn MayBeOnFlash>) -> Self {
        DramTier {
            marking: Some(Marking {
                table: shadow,
                flash,
            }),
            ..self
        }
    }

    /// The dictionary new medium blobs are compressed with.
    fn current_dictionary(&self) -> Option<Arc<Dictionary>> {
        self.dictionaries.as_ref()?.blobs.current()
    }

    /// The dictionary new pages are compressed with (where it makes them smaller).
    fn current_page_dictionary(&self) -> Option<Arc<PageDictionary>> {
        self.dictionaries.as_ref()?.pages.current()
    }

    /// One of the dictionaries' training counters (0 with dictionaries off).
    pub(crate) fn training(&self, counter: impl Fn(&Dictionaries) -> &AtomicU64) -> u64 {
        self.dictionaries
            .as_ref()
            .map_or(0, |d| counter(d).load(Ordering::Relaxed))
    }

    pub fn leaf_count(&self) -> u64 {
        self.tree.leaf_count()
    }

    /// The eviction listener, if one is set and listening now.
    pub(crate) fn eviction_listener(&self) -> Option<Arc<dyn EvictionListener>> {
        let listener = self.eviction_listener.read().clone()?;
        listener.listening().then_some(listener)
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
        self.tree.with_leaf_locked::<Shared, _, _, _>(
            key,
            || self.view(),
            reach,
            |_, leaf, st| f(leaf, &st),
        )
    }

    /// Runs `f` on the leaf that owns `key`, locked exclusive.
    fn write_leaf<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(LeafId, &DramLeaf, &mut LeafState) -> R,
    ) -> R {
        self.tree.with_leaf_locked::<Exclusive, _, _, _>(
            key,
            || self.view(),
            reach,
            |&id, leaf, mut st| f(id, leaf, &mut st),
        )
    }

    /// What DRAM holds of `key`. A hit marks the object fetched and accessed now, and
    /// the leaf referenced, and the read counts in the frequency sketch, unless `peek`.
    pub fn get(&self, key: &[u8], now_ms: u64, peek: bool) -> Lookup {
        // Found first and counted last: the sketch's cache line comes in during the walk.
        let counters = (!peek).then(|| self.reads.locate(key));
        let lookup = self.read_leaf(key, |leaf, st| {
            count_look(leaf, st, peek);
            self.lookup_locked(leaf, st, key, now_ms, peek, Wanted::Value)
        });
        if let Some(counters) = counters {
            self.reads.record(counters);
        }
        lookup
    }

    fn access_clock(&self) -> AccessClock {
        AccessClock {
            origin_ms: self.settings.opened_ms,
        }
    }

    fn resolve(&self, st: &LeafState, r: &Record<'_>, now_ms: u64, wanted: Wanted) -> Lookup {
        let found = match r.payload {
            Payload::Tombstone => return Lookup::Deleted,
            Payload::Inline(v) => Some(Lookup::Found(v.to_vec(), r.meta, None)),
            Payload::Medium(slot) => {
                let blob = st.blobs().get(slot as usize).and_then(Option::as_deref);
                match wanted {
                    Wanted::Value => blob
                        .and_then(|blob| decode_blob(blob, st.dictionary()))
                        .map(|(value, meta)| Lookup::Found(value, meta, None)),
                    // The header alone, of a blob that names the leaf's dictionary or none
                    // (as `decode_blob` asks).
                    Wanted::Meta => blob
                        .filter(|blob| {
                            blob_dictionary(blob).is_some_and(|id| {
                                id == 0 || st.dictionary().is_some_and(|d| d.id() == id)
                            })
                        })
                        .and_then(blob_header)
                        .map(|(meta, len)| Lookup::Sealed(meta, len, None)),
                }
            }
        };
        match found {
            Some(Lookup::Found(_, meta, _) | Lookup::Sealed(meta, _, _))
                if meta.expired(now_ms) =>
            {
                Lookup::Expired
            }
            Some(live) => live,
            None => {
                self.counters.corrupt_pages.fetch_add(1, Ordering::Relaxed);
                Lookup::Deleted
            }
        }
    }

    /// What the leaf holding `key` knows of it, a live value as `wanted` asks; the
    /// caller holds the leaf's lock. A hit is marked fetched and accessed now unless
    /// `peek`.
    fn lookup_locked(
        &self,
        leaf: &DramLeaf,
        st: &LeafState,
        key: &[u8],
        now_ms: u64,
        peek: bool,
        wanted: Wanted,
    ) -> Lookup {
        let found = self.with_record(leaf, st, key, |r| match r {
            Some(r) => self.resolve(st, &r, now_ms, wanted),
            // Not in this leaf; unless the leaf lost its page, then nobody knows.
            None if leaf.lost() => Lookup::Deleted,
            None => Lookup::Absent,
        });
        let access = || {
            st.access_table()
                .and_then(|table| table.read(self.access_clock(), fingerprint(key), now_ms, peek))
        };
        match found {
            Some(Lookup::Found(value, meta, _)) if self.settings.track_access => {
                Lookup::Found(value, meta, access())
            }
            Some(Lookup::Sealed(meta, len, _)) if self.settings.track_access => {
                Lookup::Sealed(meta, len, access())
            }
            Some(found) => found,
            None => {
                self.mark_lost(leaf);
                Lookup::Deleted
            }
        }
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
        if let Some(extras) = st.extras.as_ref().filter(|e| !e.buffer.is_empty())
            && let Some(r) = extras.buffer.find(key)
        {
            return Some(f(Some(r)));
        }
        self.with_page_record(leaf, st, key, f)
    }

    /// Stores `value` under `key` (`None`: a tombstone, without metadata), after running
    /// `alongside` under the same leaf lock with the write's CAS version (a new one if
    /// `meta.cas` is [`ASSIGN_CAS`]): a write that must change BT_LO too (drop or add a
    /// large version) is then atomic with respect to every other write of the key. The
    /// value starts with access state `access` (`None`: not fetched, accessed now).
    pub fn put_with<R>(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
        meta: Meta,
        access: Option<AccessState>,
        now_ms: u64,
        alongside: impl FnOnce(u64) -> R,
    ) -> R {
        // may compress: a medium value, before the leaf's lock (`medium_blob.rs`)
        let blob = value.map_or(BlobSource::Compress, |v| self.compress_ahead(key, v));
        self.write_leaf(key, |id, leaf, st| {
            let meta = meta.assigning(if meta.cas == ASSIGN_CAS && !meta.client_cas {
                self.next_cas(st)
            } else {
                0
            });
            // BT_LO's change, which `alongside` logs, must find the key's older flash
            // versions hidden already (a clean copy hides nothing: it is the flash version;
            // a tombstone always hides)
            if !meta.clean || value.is_none() {
                self.mark_newer(key);
            }
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
            // Marked above, where it needs a mark.
            self.append_marked(id, leaf, st, &record, access, now_ms, blob);
            result
        })
    }

    /// Deletes `key`; returns what DRAM held of it before, and what `alongside` (run
    /// under the same leaf lock, before the tombstone is written, given what DRAM held)
    /// returned.
    pub fn delete<R>(
        &self,
        key: &[u8],
        now_ms: u64,
        alongside: impl FnOnce(&Lookup) -> R,
    ) -> (Lookup, R) {
        self.write_leaf(key, |id, leaf, st| {
            let before = self.lookup_locked(leaf, st, key, now_ms, true, Wanted::Meta);
            let result = alongside(&before);
            // Without a lower tier a tombstone is only needed to hide a DRAM copy.
            if self.settings.keep_tombstones || before != Lookup::Absent {
                let record = Record {
                    key,
                    payload: Payload::Tombstone,
                    meta: Meta::default(),
                };
                self.append_locked(id, leaf, st, &record, None, now_ms);
            }
            (before, result)
        })
    }

    /// Atomic read-modify-write of one key: `decide` sees what DRAM holds (a hit's
    /// access state as it is, not marked) and the CAS version a put would take, and
    /// returns the change to make, if any. The leaf stays locked throughout, so no other
    /// write to the key interleaves.
    pub fn modify<R>(
        &self,
        key: &[u8],
        now_ms: u64,
        decide: impl FnOnce(Lookup, u64) -> (Option<Change>, R),
    ) -> R {
        self.modify_wanting(key, now_ms, Wanted::Value, Look::Peek, decide)
    }

    /// `modify`, with a live value found as `wanted` asks: `Wanted::Meta` leaves a
    /// medium value compressed (`Lookup::Sealed`), for a change of its metadata alone.
    pub fn modify_wanting<R>(
        &self,
        key: &[u8],
        now_ms: u64,
        wanted: Wanted,
        look: Look,
        decide: impl FnOnce(Lookup, u64) -> (Option<Change>, R),
    ) -> R {
        // Counted first, unlike a GET: a merge the write sets off sheds by these counts,
        // and must not find the key unread.
        if look == Look::Read {
            self.reads.record(self.reads.locate(key));
        }
        self.write_leaf(key, |id, leaf, st| {
            if look == Look::Read {
                count_look(leaf, st, false);
            }
            let current = self.lookup_locked(leaf, st, key, now_ms, look == Look::Peek, wanted);
            let cas = self.next_cas(st);
            let (change, result) = decide(current, cas);
            let tombstone = |st: &mut LeafState| {
                // `decide` may have given the version to a large object.
                self.raise_cas_floor(cas);
                let record = Record {
                    key,
                    payload: Payload::Tombstone,
                    meta: Meta::default(),
                };
                self.append_locked(id, leaf, st, &record, None, now_ms);
            };
            let (value, meta, access, redate) = match change {
                None => return result,
                Some(Change::Put((value, meta, access))) => (Some(value), meta, access, false),
                Some(Change::Redate {
                    value,
                    meta,
                    access,
                }) => (value, meta, access, true),
                Some(Change::Delete) => {
                    tombstone(st);
                    return result;
                }
            };
            let meta = meta.assigning(cas);
            let blob = redate
                .then(|| self.reheadered_blob(leaf, st, key, &meta))
                .flatten();
            let value = match (value, &blob) {
                (Some(value), _) => value,
                // A sealed value is kept as its blob, re-headed, or not at all: the
                // record's own bytes are never stored then (`buffered_blob` takes the
                // blob given, in the slot checked free here under the same lock).
                (None, Some(_)) if st.blob_slot_free() => Vec::new(),
                // No slot for it (a leaf of 65,536 blobs): forgotten, as a cache may.
                (None, _) => {
                    tombstone(st);
                    return result;
                }
            };
            let record = Record {
                key,
                payload: Payload::Inline(&value),
                meta,
            };
            // A clean copy (a promotion) is the flash version itself: nothing to hide.
            if !record.meta.clean {
                self.mark_newer(key);
            }
            let blob = blob.map_or(BlobSource::Compress, BlobSource::Made);
            self.append_marked(id, leaf, st, &record, access, now_ms, blob);
            result
        })
    }

    /// The blob of `key`'s newest version in a locked leaf with `meta` for its header;
    /// `None` if that version is not a medium object's blob (the value is then
    /// compressed again).
    fn reheadered_blob(
        &self,
        leaf: &DramLeaf,
        st: &LeafState,
        key: &[u8],
        meta: &Meta,
    ) -> Option<Block> {
        let slot = self
            .with_record(leaf, st, key, |r| match r?.payload {
                Payload::Medium(slot) => Some(slot),
                Payload::Inline(_) | Payload::Tombstone => None,
            })
            .flatten()?;
        let blob = st.blobs().get(usize::from(slot))?.as_deref()?;
        reheader_blob_with(blob, meta, Block::new)
    }

    /// Records in the shadow table (`restart/shadow.rs`) that `key`'s flash versions, if
    /// any, are older than what is about to be written. Called under the key's leaf lock
    /// before a write changes BT_LO as well as DRAM (a large version logged in BT_LO, or
    /// one dropped from it): were the process killed between the two, the BT_LO log
    /// would replay a change while the older small version on flash stood unhidden, and
    /// once the large version expired or left BT_LO, a GET would fall through to it.
    pub(crate) fn mark_newer(&self, key: &[u8]) {
        if let Some(marking) = &self.marking {
            marking.mark(key);
        }
    }

    /// Appends a write to a locked leaf's buffer; a value's access state becomes
    /// `access` (`None`: not fetched, accessed now), a tombstone's key loses its own.
    fn append_locked(
        &self,
        id: LeafId,
        leaf: &DramLeaf,
        st: &mut LeafState,
        record: &Record<'_>,
        access: Option<AccessState>,
        now_ms: u64,
    ) {
        // A clean copy (a promotion) is the flash version itself: nothing to hide.
        if !record.meta.clean {
            self.mark_newer(record.key);
        }
        self.append_marked(id, leaf, st, record, access, now_ms, BlobSource::Compress);
    }

    /// `append_locked` for a write whose key the caller has marked already; a medium
    /// value's blob comes from `blob` (`medium_blob.rs`).
    #[allow(clippy::too_many_arguments)]
    fn append_marked(
        &self,
        id: LeafId,
        leaf: &DramLeaf,
        st: &mut LeafState,
        record: &Record<'_>,
        access: Option<AccessState>,
        now_ms: u64,
        blob: BlobSource,
    ) {
        leaf.touch();
        if !leaf.has(WRITTEN) {
            leaf.set(WRITTEN, true);
        }
        let limit = buffer_limit(self.settings.write_buffer, leaf.buffer_level(), st);
        let raw_blobs = leaf.heat() == Heat::HotBlobs;
        let pressure = self.charged_knowing_blobs(leaf, st, |st| {
            let extras = st.extras.get_or_insert_default();
            extras.buffered.store(UNKNOWN, Ordering::Relaxed);
            if self.settings.track_access {
                self.restamp(extras, record, access, now_ms);
            }
            let freed = extras.make_way(record);
            let blob = match record.payload {
                // may compress: a medium value goes into its blob now, once
                Payload::Inline(value) => {
                    self.buffered_blob(extras, record.key, value, &record.meta, blob, raw_blobs)
                }
                Payload::Medium(_) | Payload::Tombstone => None,
            };
            let added = blob.map_or(0, |(_, _, bytes)| bytes);
            let pressure = match blob {
                Some((slot, stale, _)) => {
                    let pointer = Record {
                        payload: Payload::Medium(slot),
                        ..*record
                    };
                    let pressure = extras.buffer.append(&pointer, limit);
                    // A leaf behind the current dictionary merges now, which compresses
                    // its blobs again with that one: once a leaf after each swap, as
                    // each written leaf used to on its next merge.
                    if stale {
                        Pressure::Overflowing
                    } else {
                        pressure
                    }
                }
                None => extras.buffer.append(record, limit),
            };
            (pressure, added as i64 - freed as i64)
        });
        match pressure {
            Pressure::Fine => {}
            Pressure::Full => {
                if !leaf.set(MERGE_QUEUED, true) {
                    // At shutdown the merger may be gone; the buffer then merges on close.
                    self.merge_queue.push(id);
                }
            }
            Pressure::Overflowing => {
                self.counters
                    .foreground_merges
                    .fetch_add(1, Ordering::Relaxed);
                self.merge_full(leaf, st, now_ms);
            }
        }
    }

    fn restamp(
        &self,
        extras: &mut Extras,
        record: &Record<'_>,
        access: Option<AccessState>,
        now_ms: u64,
    ) {
        let fingerprint = fingerprint(record.key);
        match record.payload {
            Payload::Tombstone => {
                if let Some(table) = &mut extras.access_table {
                    table.remove(fingerprint);
                }
            }
            Payload::Inline(_) | Payload::Medium(_) => {
                let written = AccessState {
                    fetched: false,
                    last_access_ms: now_ms,
                };
                extras.access_table.get_or_insert_default().set(
                    self.access_clock(),
                    fingerprint,
                    access.unwrap_or(written),
                );
            }
        }
    }

    /// The entries with keys in `[cursor, end)` of the one leaf holding `cursor`.
    pub fn scan_leaf(&self, cursor: &[u8], end: Bound<&[u8]>, now_ms: u64) -> LeafScan {
        self.read_leaf(cursor, |leaf, st| {
            let entries = self.entries(leaf, st, now_ms, Some((Bound::Included(cursor), end)));
            let access = match st.access_table() {
                Some(table) if self.settings.track_access => entries
                    .iter()
                    .filter(|(_, version)| version.is_some())
                    .filter_map(|(key, _)| {
                        let state =
                            table.read(self.access_clock(), fingerprint(key), now_ms, true)?;
                        Some((key.clone(), state))
                    })
                    .collect(),
                _ => HashMap::new(),
            };
            LeafScan {
                entries,
                // The leaf's high fence cannot move while it is locked.
                next: self.tree.next_leaf(cursor).map(|(next, _)| next),
                lost: leaf.lost(),
                access,
            }
        })
    }
}

#[cfg(test)]
impl DramTier {
    /// Overwrites the page of the leaf holding `key` with garbage, as a DRAM error would.
    pub(crate) fn corrupt_page_of(&self, key: &[u8]) {
        self.write_leaf(key, |_, _, st| {
            if let Some(page) = &mut st.page {
                *page = Block::new(&vec![0xf7; page.len()]);
            }
        });
    }

    /// Overwrites every medium blob of the leaf holding `key` with garbage.
    pub(crate) fn corrupt_blob_of(&self, key: &[u8]) {
        self.write_leaf(key, |_, _, st| {
            if let Some(extras) = &mut st.extras {
                for blob in extras.blobs.iter_mut().flatten() {
                    *blob = Block::new(&vec![0xf7; blob.len()]);
                }
            }
        });
    }

    /// Gives the leaf holding `key` `dictionary` in place of the one its blobs were
    /// compressed with, as a mix-up or a damaged dictionary would; the one it held.
    pub(crate) fn replace_dictionary_of(
        &self,
        key: &[u8],
        dictionary: Option<Arc<Dictionary>>,
    ) -> Option<Arc<Dictionary>> {
        self.write_leaf(key, |_, _, st| {
            let extras = st.extras.get_or_insert_default();
            std::mem::replace(&mut extras.dictionary, dictionary)
        })
    }

    /// Gives the leaf holding `key` `dictionary` in place of the one its page was
    /// compressed with, as a mix-up would; the one it held.
    pub(crate) fn replace_page_dictionary_of(
        &self,
        key: &[u8],
        dictionary: Option<Arc<PageDictionary>>,
    ) -> Option<Arc<PageDictionary>> {
        self.write_leaf(key, |_, _, st| {
            let extras = st.extras.get_or_insert_default();
            std::mem::replace(&mut extras.page_dictionary, dictionary)
        })
    }

    /// Flips a bit of the dictionary version the page of the leaf holding `key` names,
    /// if it names one; whether it did.
    pub(crate) fn corrupt_page_dictionary_version_of(&self, key: &[u8]) -> bool {
        self.write_leaf(key, |_, _, st| {
            let Some(page) = &mut st.page else {
                return false;
            };
            let Some((summary, packed)) = page::Summary::split(page) else {
                return false;
            };
            if summary.dictionary == 0 {
                return false;
            }
            // The version is the summary's last four bytes.
            let at = page.len() - packed.len() - 4;
            let mut damaged = page.to_vec();
            damaged[at] ^= 0x10;
            *page = Block::new(&damaged);
            true
        })
    }

    /// The versions of the page dictionaries the leaves hold, and how many leaves hold
    /// each.
    pub(crate) fn page_dictionaries_held(&self) -> std::collections::BTreeMap<u32, usize> {
        let view = self.view();
        let mut held = std::collections::BTreeMap::new();
        for id in self.leaves() {
            let Some(leaf) = view.get(id.0) else { continue };
            if let Some(d) = leaf.state.read().page_dictionary() {
                *held.entry(d.version()).or_default() += 1;
            }
        }
        held
    }

    /// The ids of the dictionaries the leaves hold, and how many leaves hold each.
    pub(crate) fn dictionaries_held(&self) -> std::collections::BTreeMap<u8, usize> {
        let view = self.view();
        let mut held = std::collections::BTreeMap::new();
        for id in self.leaves() {
            let Some(leaf) = view.get(id.0) else { continue };
            if let Some(d) = leaf.state.read().dictionary() {
                *held.entry(d.id()).or_default() += 1;
            }
        }
        held
    }
}

#[cfg(test)]
mod buffer_tests {
    use super::leaf::WRITTEN;
    use super::test_support::*;
    use super::write_buffer::{MAX_LEVEL, TINY_LEAF_BUFFERS, WriteBuffer};
    use super::*;
    use crate::memory::alloc_size;

    /// A tier whose values of 128 bytes and more (with the key) are medium, with LZ4
    /// alone (no dictionary trained in the background while a test looks).
    fn medium_tier(write_buffer: usize) -> (DramTier, Arc<Memory>) {
        tier_with(DramSettings {
            tiny_max: 128,
            dictionaries: None,
            ..settings(write_buffer)
        })
    }

    /// A ~600-byte document, different for each key and version.
    fn doc(i: u32, version: u32) -> Vec<u8> {
        format!("{{\"id\":{i},\"version\":{version},\"name\":\"item {i}\",\"tags\":[\"a\",\"b\"],")
            .repeat(8)
            .into_bytes()
    }

    fn put(dram: &DramTier, k: &[u8], value: &[u8]) {
        dram.put_with(k, Some(value), Meta::default(), None, 0, |_| ());
    }

    fn found(value: &[u8]) -> Lookup {
        Lookup::Found(value.to_vec(), Meta::default(), None)
    }

    fn level_of(dram: &DramTier, k: &[u8]) -> u8 {
        dram.read_leaf(k, |leaf, _| leaf.buffer_level())
    }

    #[test]
    fn a_medium_value_is_compressed_as_it_is_written_and_buffered_as_a_pointer() {
        let (dram, memory) = medium_tier(4096);
        let value = doc(1, 0);
        put(&dram, &key(1), &value);
        let blob = dram.read_leaf(&key(1), |_, st| {
            let buffer = st.buffer().expect("a buffer");
            let records: Vec<Record> = buffer.records().collect();
            assert_eq!(records.len(), 1);
            assert_eq!(records[0].payload, Payload::Medium(0));
            assert!(buffer.len() < 24, "{} bytes buffered", buffer.len());
            let blob = st.blobs()[0].as_deref().expect("its blob").to_vec();
            assert!(blob.len() < value.len() / 2, "{} bytes", blob.len());
            blob
        });
        assert_eq!(dram.get(&key(1), 0, false), found(&value));
        assert_eq!(memory.snapshot(), recount(&dram));
        // The merge keeps the blob as it was written, now named by the page.
        dram.merge_all(0);
        dram.read_leaf(&key(1), |_, st| {
            assert!(st.buffer().is_none_or(WriteBuffer::is_empty));
            assert_eq!(st.blobs().len(), 1);
            assert_eq!(st.blobs()[0].as_deref(), Some(&blob[..]));
        });
        assert_eq!(dram.get(&key(1), 0, false), found(&value));
        assert_eq!(memory.snapshot(), recount(&dram));
    }

    /// The newest version of a key in the buffer while an older one sits in the page,
    /// for every pair of tiny and medium; then a buffered delete hides both.
    #[test]
    fn a_get_answers_from_the_buffer_over_the_page_and_a_buffered_delete_hides_both() {
        let (dram, memory) = medium_tier(4096);
        let tiny = |i, v| format!("tiny {i} {v}").into_bytes();
        let pairs: [(Vec<u8>, Vec<u8>); 4] = [
            (tiny(0, 0), tiny(0, 1)),
            (tiny(1, 0), doc(1, 1)),
            (doc(2, 0), tiny(2, 1)),
            (doc(3, 0), doc(3, 1)),
        ];
        for (i, (old, _)) in (0u32..).zip(&pairs) {
            put(&dram, &key(i), old);
        }
        dram.merge_all(0);
        for (i, (old, new)) in (0u32..).zip(&pairs) {
            put(&dram, &key(i), new);
            assert_eq!(dram.get(&key(i), 0, false), found(new), "key {i}");
            dram.read_leaf(&key(i), |leaf, st| {
                let in_page = dram.with_page_record(leaf, st, &key(i), |r| {
                    let r = r.expect("the old version in the page");
                    dram.resolve(st, &r, 0, Wanted::Value)
                });
                assert_eq!(in_page, Some(found(old)), "key {i}");
            });
        }
        assert_eq!(memory.snapshot(), recount(&dram));
        for (i, _) in (0u32..).zip(&pairs) {
            dram.delete(&key(i), 0, |_| ());
            assert_eq!(dram.get(&key(i), 0, false), Lookup::Deleted, "key {i}");
        }
        assert_eq!(memory.snapshot(), recount(&dram));
        dram.merge_all(0);
        for (i, _) in (0u32..).zip(&pairs) {
            assert_eq!(dram.get(&key(i), 0, false), Lookup::Deleted, "key {i}");
        }
        assert_eq!(memory.snapshot(), recount(&dram));
    }

    #[test]
    fn overwrites_between_two_merges_hold_one_live_blob_and_a_delete_none() {
        let (dram, memory) = medium_tier(4096);
        for version in 0..20 {
            put(&dram, &key(7), &doc(7, version));
        }
        let live = dram.read_leaf(&key(7), |_, st| {
            assert_eq!(
                st.blobs().len(),
                1,
                "each write takes its buffer's last record back, and the slot"
            );
            let live: Vec<usize> = st.blobs().iter().flatten().map(|b| b.len()).collect();
            assert_eq!(live.len(), 1);
            live[0]
        });
        assert_eq!(dram.get(&key(7), 0, false), found(&doc(7, 19)));
        assert_eq!(memory.snapshot(), recount(&dram));
        // Another key's write in between: key 7's newest record is kept below it, its
        // blob freed, and the next write of key 7 takes a new slot.
        put(&dram, &key(8), &doc(8, 0));
        put(&dram, &key(7), &doc(7, 20));
        dram.read_leaf(&key(7), |_, st| {
            assert_eq!(st.blobs().len(), 3, "a slot for each write not last");
            assert_eq!(
                st.blobs().iter().flatten().count(),
                2,
                "the replaced blob freed"
            );
        });
        assert_eq!(dram.get(&key(7), 0, false), found(&doc(7, 20)));
        assert_eq!(dram.get(&key(8), 0, false), found(&doc(8, 0)));
        let mediums = memory.snapshot().mediums as usize;
        assert!(
            mediums < alloc_size(live) + 20 * 16 + 128,
            "{mediums} bytes for one blob of {live}"
        );
        assert_eq!(memory.snapshot(), recount(&dram));
        dram.delete(&key(7), 0, |_| ());
        dram.read_leaf(&key(7), |_, st| {
            assert_eq!(st.blobs().iter().flatten().count(), 1, "key 8's alone");
        });
        assert_eq!(memory.snapshot(), recount(&dram));
        dram.merge_all(0);
        assert_eq!(dram.get(&key(7), 0, false), Lookup::Deleted);
        assert_eq!(memory.snapshot(), recount(&dram));
    }

    /// A medium value of about 200 bytes, of a write counted `i`.
    fn medium(i: u32) -> Vec<u8> {
        format!("{i:>200}").into_bytes()
    }

    /// No merger runs here: a full buffer is merged by its writer at four times its limit,
    /// and each such merge of a leaf only written doubles the limit, up to the cap. The
    /// housekeeper's passes after the writes stop take the room back.
    #[test]
    fn a_leaf_written_and_not_read_grows_its_buffer_and_gives_the_room_back_when_idle() {
        let (dram, memory) = medium_tier(256);
        let mut written = 0u32;
        let mut merges_at_level = Vec::new();
        while level_of(&dram, &key(0)) < MAX_LEVEL {
            let before = dram.counters.foreground_merges.load(Ordering::Relaxed);
            let level = level_of(&dram, &key(0));
            // Rewrites of the same eight keys: the leaf never splits.
            put(&dram, &key(written % 8), &medium(written));
            written += 1;
            if dram.counters.foreground_merges.load(Ordering::Relaxed) > before {
                merges_at_level.push((level, written));
            }
            assert!(
                written < 10_000,
                "stuck at level {level}: {merges_at_level:?}"
            );
        }
        let writes_between: Vec<u32> = merges_at_level
            .windows(2)
            .map(|w| w[1].1 - w[0].1)
            .collect();
        assert!(
            writes_between.windows(2).all(|w| w[1] > w[0] * 3 / 2),
            "each level takes about twice the writes before it merges: {merges_at_level:?}"
        );
        assert_eq!(memory.snapshot(), recount(&dram));
        // What the merger would have done meanwhile; then ten writes, under the limit.
        for id in std::iter::from_fn(|| dram.merge_queue.pop()) {
            dram.merge(&id, 0);
        }
        for i in 0..10u32 {
            put(&dram, &key(i % 8), &medium(i));
        }
        assert!(dram.merge_queue.pop().is_none());
        // The first pass sees the leaf written; a write after it keeps it grown.
        dram.shrink_idle_buffers();
        assert_eq!(level_of(&dram, &key(0)), MAX_LEVEL);
        put(&dram, &key(1), b"again");
        dram.shrink_idle_buffers();
        assert_eq!(level_of(&dram, &key(0)), MAX_LEVEL);
        // Idle for a whole pass: back to the first limit, and a buffer past it is queued.
        dram.shrink_idle_buffers();
        assert_eq!(level_of(&dram, &key(0)), 0);
        let held = dram.read_leaf(&key(0), |_, st| st.buffer().map_or(0, WriteBuffer::len));
        let queued = std::iter::from_fn(|| dram.merge_queue.pop()).collect::<Vec<_>>();
        assert_eq!(queued.len(), usize::from(held > 256), "{held} bytes held");
        for id in &queued {
            dram.merge(id, 0);
        }
        let held = dram.read_leaf(&key(0), |_, st| st.buffer().map_or(0, WriteBuffer::len));
        assert!(held <= 256, "{held} bytes held at rest");
        assert_eq!(
            level_of(&dram, &key(0)),
            0,
            "an idle leaf's merge keeps level 0"
        );
        assert_eq!(memory.snapshot(), recount(&dram));
        for i in 0..8 {
            let found = matches!(dram.get(&key(i), 0, false), Lookup::Found(..));
            assert!(found, "key {i}");
        }
    }

    /// A hash command reads its header (a GET) and then writes under the leaf lock
    /// (`modify`, which looks for the key again): that look is part of the write, not a
    /// read, so a leaf written so grows its buffer as a leaf only written does. It once
    /// counted as a read, and session stores' leaves merged at the first limit forever.
    /// A write that reads in the GET's place (`Look::Read`) counts that one read alone.
    #[test]
    fn a_leaf_written_by_read_modify_writes_grows_its_buffer() {
        for get_first in [true, false] {
            let (dram, _) = medium_tier(256);
            let mut written = 0u32;
            while level_of(&dram, &key(0)) < MAX_LEVEL {
                let k = key(written % 8);
                let look = match get_first {
                    true => {
                        dram.get(&k, 0, false);
                        Look::Peek
                    }
                    false => Look::Read,
                };
                let value = medium(written);
                dram.modify_wanting(&k, 0, Wanted::Value, look, |_, _| {
                    (Some(Change::Put((value, Meta::default(), None))), ())
                });
                written += 1;
                let level = level_of(&dram, &key(0));
                assert!(written < 10_000, "{look:?}: stuck at level {level}");
            }
        }
    }

    /// A write that reads in a GET's place (`Look::Read`) is seen read as the GET's
    /// object was: its leaf accessed once more than by the write (hot leaves are told by
    /// those counts), its key counted in the frequency sketch — before the write, since a
    /// merge the write sets off sheds by those counts and must not find the key unread.
    /// A peek counts neither.
    #[test]
    fn a_write_that_reads_as_a_get_counts_its_key_read_before_it_writes() {
        let (dram, _) = tier_with(settings(4096));
        let k = key(1);
        put(&dram, &k, b"v");
        let accesses = || dram.read_leaf(&k, |leaf, _| leaf.access.load(Ordering::Relaxed));
        let write = |look| {
            let before = accesses();
            let seen = dram.modify_wanting(&k, 0, Wanted::Value, look, |current, _| {
                assert!(matches!(current, Lookup::Found(..)), "{look:?}");
                let seen = dram.reads.estimate(&k);
                (
                    Some(Change::Put((b"w".to_vec(), Meta::default(), None))),
                    seen,
                )
            });
            (seen, accesses() - before)
        };
        assert_eq!(write(Look::Peek), (0, 1), "the write's own access");
        assert_eq!(write(Look::Read), (1, 2), "counted before the write");
        assert_eq!(dram.reads.estimate(&k), 1);
    }

    #[test]
    fn a_buffer_read_more_than_written_shrinks_back() {
        let (dram, _) = medium_tier(256);
        dram.read_leaf(&key(0), |leaf, _| leaf.set_buffer_level(MAX_LEVEL));
        let merges = || dram.counters.foreground_merges.load(Ordering::Relaxed);
        let mut i = 0u32;
        while merges() == 0 {
            put(&dram, &key(i % 8), &medium(i));
            for _ in 0..2 {
                dram.get(&key(i % 8), 0, false);
            }
            i += 1;
        }
        assert_eq!(level_of(&dram, &key(0)), MAX_LEVEL - 1);
    }

    #[test]
    fn buffers_grow_only_while_all_of_them_fit_their_share_of_the_budget() {
        // A 16 KiB budget: 256 bytes for all buffers, less than one full buffer.
        let (dram, memory) = tier_with(DramSettings {
            dram_capacity: 16 << 10,
            tiny_max: 128,
            dictionaries: None,
            ..settings(256)
        });
        for i in 0..2_000u32 {
            put(&dram, &key(i % 8), &medium(i));
        }
        assert!(dram.counters.foreground_merges.load(Ordering::Relaxed) >= 10);
        assert_eq!(level_of(&dram, &key(0)), 0);
        assert!(memory.snapshot().write_buffers > (16 << 10) / 64);
        dram.read_leaf(&key(0), |leaf, _| assert!(leaf.has(WRITTEN)));
    }

    /// A leaf of tiny values buffers `TINY_LEAF_BUFFERS` × `write_buffer` and grows no
    /// further (its level stays 0). Without a merger here, the buffer merges in the
    /// foreground at four times its limit.
    #[test]
    fn a_leaf_of_tiny_values_buffers_twice_its_first_limit_and_no_more() {
        let (dram, _) = tier_with(settings(256));
        let held = || dram.read_leaf(&key(0), |_, st| st.buffer().map_or(0, WriteBuffer::len));
        let mut most = 0;
        for i in 0..2_000u32 {
            // A key's next value is longer or shorter: appended, not written over the last.
            put(&dram, &key(i % 8), &vec![i as u8; 100 + (i % 3) as usize]);
            most = most.max(held());
            assert_eq!(level_of(&dram, &key(0)), 0, "write {i}");
        }
        assert!(dram.counters.foreground_merges.load(Ordering::Relaxed) >= 10);
        let limit = TINY_LEAF_BUFFERS * 256;
        assert!((4 * 256 + 128..=4 * limit + 128).contains(&most), "{most}");
    }
}
