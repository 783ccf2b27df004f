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
//!
//! Modules by job: this one holds the tier and its GET (`plan_get`, `finish_get`) and
//! scan; [`merge`] takes evicted objects in and splits super-leaves; [`reclaim`] hands
//! out slots and evicts cold super-leaves (CLOCK); [`index_file`] saves and loads the
//! descriptors across a clean restart; [`io`] reads and writes sub-pages; [`block`] a
//! sub-page's 4 KiB block (header, checks); [`host_compression`] the host's packing
//! (`device_compression=host`: LZ4 for blocks and BT_LO's extents, zstd with a block
//! dictionary for blocks); [`dictionary`] the block dictionaries, trained, persisted and
//! counted; [`explain`] a key's place told in words, for a test's failure report; [`leaf_page`] where a
//! super-leaf's records go (`Geometry`: `m` sub-pages, `g(key) mod m`, under-filling).

mod block;
pub(crate) mod dictionary;
mod explain;
pub(crate) mod host_compression;
mod index_file;
mod io;
mod journal;
pub(crate) mod leaf_page;
mod merge;
mod presence;
mod reclaim;
#[cfg(test)]
mod test_support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use zipcache_device::{AlignedBuf, BLOCK_SIZE, BlockDevice};

use crate::btree::{BTree, Fence, KeyRange, Ranged, Shared, lockable_by_range};
use crate::config::Clock;
use crate::dictionary::training::TrainingSettings;
use crate::dram::ScanEntry;
use crate::format::block::{HEADER, PAYLOAD};
use crate::memory::{Memory, alloc_size};
use crate::record::{Meta, Payload};
use crate::subpage_hash::ssd_subpage;
use block::Owner;
use dictionary::BlockDictionaries;
pub(crate) use index_file::Opening;
use leaf_page::Geometry;
use reclaim::Writer;

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
    /// The slot of the block dictionary each sub-page's block was packed with
    /// (`dictionary.rs`); 0 for none. Empty (no allocation) where no block may name one
    /// (`SsdSettings::dictionary_slots`).
    dictionaries: Box<[u8]>,
    /// Each sub-page's presence filter (`presence.rs`): a GET whose key it rules out
    /// reads nothing. `None` when the setting is off.
    filters: Option<presence::Filters>,
    /// Bumped by every write to this super-leaf.
    version: u64,
}

impl SlState {
    /// The slot of the block dictionary sub-page `s`'s block was packed with; 0 for none.
    fn dictionary(&self, s: usize) -> u8 {
        self.dictionaries.get(s).copied().unwrap_or(0)
    }

    /// Whether sub-page `s`'s presence filter says its block certainly does not hold
    /// `key` (never without filters).
    fn rules_out(&self, s: usize, key: &[u8]) -> bool {
        self.filters
            .as_ref()
            .is_some_and(|filters| !presence::may_hold(filters[s], key))
    }
}

impl Ranged for SlState {
    fn range(&mut self) -> &mut KeyRange {
        &mut self.range
    }
}

lockable_by_range!(SuperLeaf, SlState);

struct SuperLeaf {
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
    /// Keep a presence filter per sub-page (`presence.rs`).
    pub presence_filters: bool,
    /// Pack each block's records with LZ4 (`device_compression=host`): `T` then bounds
    /// the packed bytes of a sub-page.
    pub host_compression: bool,
    /// With `host_compression`: train block dictionaries this way and pack with zstd and
    /// them where they pay (`dictionary.rs`); `None`, LZ4 alone.
    pub dictionaries: Option<TrainingSettings>,
    /// With `host_compression`: block dictionaries a previous run wrote were loaded, so
    /// blocks may name them even if none is trained now; each descriptor then remembers
    /// which dictionary its blocks were packed with, so that a dictionary stays while
    /// blocks name it.
    pub loaded_dictionaries: bool,
}

impl SsdSettings {
    /// DRAM one super-leaf descriptor takes besides its tree entry.
    fn descriptor_bytes(&self) -> usize {
        let filters = if self.presence_filters {
            alloc_size(size_of::<Box<[u128]>>()) + alloc_size(self.subpages * size_of::<u128>())
        } else {
            0
        };
        let dictionaries = self.dictionary_slots().len();
        alloc_size(size_of::<SuperLeaf>() + 16)
            + alloc_size(self.subpages * size_of::<u16>())
            + if dictionaries > 0 {
                alloc_size(dictionaries)
            } else {
                0
            }
            + filters
    }

    /// A new descriptor's state of a super-leaf without a slot, covering `range`.
    fn empty_state(&self, range: KeyRange) -> SlState {
        SlState {
            range,
            slot: None,
            generation: 0,
            counts: vec![0; self.subpages].into_boxed_slice(),
            dictionaries: self.dictionary_slots(),
            filters: self.filters(0),
            version: 0,
        }
    }

    /// A new descriptor's dictionary slots, each 0: one a sub-page if blocks may name a
    /// dictionary (one is trained, or was loaded), none otherwise.
    fn dictionary_slots(&self) -> Box<[u8]> {
        let on = self.host_compression && (self.dictionaries.is_some() || self.loaded_dictionaries);
        vec![0; if on { self.subpages } else { 0 }].into_boxed_slice()
    }

    /// A new descriptor's filters, each `filter` (none when filters are off).
    fn filters(&self, filter: u128) -> Option<presence::Filters> {
        self.presence_filters
            .then(|| Box::new(vec![filter; self.subpages].into_boxed_slice()))
    }
}

#[derive(Debug, Default)]
pub struct SsdCounters {
    pub v_obj: AtomicU64,
    /// Blocks written by merges (an eviction's read-modify-write of the sub-pages its
    /// objects hash to) and by splits (super-leaves rewritten whole), and the evicted
    /// object bytes (`v_obj`) that went into splits: where `wa` comes from.
    pub merge_blocks: AtomicU64,
    pub split_blocks: AtomicU64,
    pub split_v_obj: AtomicU64,
    pub gets: AtomicU64,
    pub reads: AtomicU64,
    /// Reads made by GETs (the paper's promise: at most one per GET).
    pub get_reads: AtomicU64,
    /// GETs whose read a presence filter saved (the key's sub-page held other keys only).
    pub filtered_gets: AtomicU64,
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
    /// Flash versions found but not served: the shadow table hid them (a newer state was
    /// in DRAM, or a crash lost one).
    pub hidden: AtomicU64,
    /// Time the flusher spent packing blocks (`device_compression=host`), in nanoseconds
    /// of the packing calls.
    pub compress_ns: AtomicU64,
}

pub struct SsdTier {
    device: Arc<dyn BlockDevice>,
    /// Shared with the DRAM tier's marks (`presence::FlashPresence`).
    tree: Arc<BTree<Arc<SuperLeaf>>>,
    geometry: Geometry,
    settings: SsdSettings,
    max_slots: u32,
    /// Payload bytes a sub-page may hold under `T`.
    fill_limit: usize,
    writer: Mutex<Writer>,
    memory: Arc<Memory>,
    clock: Arc<dyn Clock>,
    /// The dictionaries blocks are packed with (`device_compression=host`).
    dictionaries: Arc<BlockDictionaries>,
    /// The crash journal this tier writes (`journal.rs`); `None` until the open starts it.
    journal: Option<journal::Journaling>,
    pub counters: SsdCounters,
}

thread_local! {
    static BLOCK: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::zeroed(1));
    /// Where a GET unpacks a packed block.
    static UNPACKED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

type Contents = BTreeMap<Vec<u8>, (Vec<u8>, Meta)>;
/// An object on its way into a super-leaf: key, value and metadata.
type Object = (Vec<u8>, (Vec<u8>, Meta));

impl SsdTier {
    /// A tier with block dictionaries of its own, kept in no file.
    #[cfg(test)]
    pub fn new(
        device: Arc<dyn BlockDevice>,
        settings: SsdSettings,
        memory: Arc<Memory>,
        clock: Arc<dyn Clock>,
    ) -> SsdTier {
        let dictionaries = BlockDictionaries::open(settings.dictionaries, None, memory.clone());
        SsdTier::with_dictionaries(device, settings, memory, clock, Arc::new(dictionaries))
    }

    /// An empty tier whose blocks are packed with `dictionaries`'.
    pub fn with_dictionaries(
        device: Arc<dyn BlockDevice>,
        settings: SsdSettings,
        memory: Arc<Memory>,
        clock: Arc<dyn Clock>,
        dictionaries: Arc<BlockDictionaries>,
    ) -> SsdTier {
        let m = settings.subpages;
        let first = SuperLeaf::new(settings.empty_state(KeyRange::everything()));
        let max_slots = u32::try_from(settings.blocks / m as u64).unwrap_or(u32::MAX);
        let fill_limit = ((settings.fill_threshold * BLOCK_SIZE as f64) as usize)
            .saturating_sub(HEADER)
            .min(PAYLOAD);
        let tier = SsdTier {
            device,
            tree: Arc::new(BTree::new(first)),
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
                log: Vec::new(),
            }),
            memory,
            clock,
            dictionaries,
            journal: None,
            counters: SsdCounters::default(),
        };
        tier.counters.superleaves.store(1, Ordering::Relaxed);
        tier.memory
            .change_index(tier.tree.node_bytes() as i64 + settings.descriptor_bytes() as i64);
        tier
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// Waits for a block dictionary's training under way to finish.
    pub fn settle_dictionaries(&self) {
        self.dictionaries.settle();
    }

    /// DRAM held by BT_SSD: inner nodes and super-leaf descriptors.
    pub fn index_bytes(&self) -> u64 {
        let leaves = self.counters.superleaves.load(Ordering::Relaxed).max(0) as u64;
        self.tree.node_bytes() + leaves * self.settings.descriptor_bytes() as u64
    }

    /// SSD bytes of the super-leaves that hold data.
    pub fn leaf_bytes(&self) -> u64 {
        self.counters.occupied.load(Ordering::Relaxed).max(0) as u64
            * (self.settings.subpages * BLOCK_SIZE) as u64
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
        self.tree
            .with_arc_leaf_locked::<Shared, _>(key, |leaf, st| {
                let subpage = self.geometry.subpage_of(key);
                let slot = st.slot.filter(|_| st.counts[subpage] > 0)?;
                if st.rules_out(subpage, key) {
                    self.counters.filtered_gets.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                self.counters.get_reads.fetch_add(1, Ordering::Relaxed);
                self.counters.reads.fetch_add(1, Ordering::Relaxed);
                let owner = Owner {
                    superleaf: slot,
                    generation: st.generation,
                    subpage: subpage as u16,
                };
                let version = st.version;
                drop(st);
                Some(PlannedRead {
                    lba: self.lba(slot, subpage),
                    owner,
                    proof: Freshness {
                        leaf: leaf.clone(),
                        version,
                    },
                })
            })
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
        let found = UNPACKED.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let records = block::open(block, read.owner, &self.dictionaries, &mut scratch)?;
            Some(
                records
                    .filter(|r| r.key == key)
                    .find_map(|r| match r.payload {
                        Payload::Inline(v) => Some((v.to_vec(), r.meta)),
                        Payload::Medium(_) | Payload::Tombstone => None,
                    }),
            )
        });
        let Some(found) = found else {
            if !self.still_current(&read.proof) {
                return Finished::Retry;
            }
            self.counters
                .checksum_failures
                .fetch_add(1, Ordering::Relaxed);
            return Finished::Done(None);
        };
        let Some((value, meta)) =
            found.filter(|(_, meta)| !meta.expired(now_ms) && !self.hidden(key))
        else {
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
        self.tree
            .with_arc_leaf_locked::<Shared, _>(cursor, |leaf, st| {
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
                        std::ops::RangeBounds::contains(&range, k.as_slice())
                            && !meta.expired(now_ms)
                            && !self.hidden(k)
                    })
                    .map(|(k, v)| (k, Some(v)))
                    .collect();
                let proof = Freshness {
                    leaf: leaf.clone(),
                    version: st.version,
                };
                (entries, st.range.high.clone(), proof)
            })
    }
}
