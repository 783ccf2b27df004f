//! BT_LO and the large-object region (paper §3.1, §3.4).
//!
//! Objects larger than `medium_max` never take DRAM beyond their index entry: the value
//! is written once to a 4 KiB-aligned extent in the large-object region at the end of
//! the device, and BT_LO (the same [`BTree`], with leaves of sorted key → extent
//! entries) points at it. The region is a circular log: new extents go at the head; when
//! the head comes round to the oldest extents they are dropped (FIFO). An extent whose
//! key was overwritten or deleted is trimmed at once.
//!
//! Extent on the device (`docs/FORMAT.md`): a 32-byte header (magic `ZCLO`, version, how
//! the value is stored, key and value length, a sequence number unique to this extent, the
//! stored length, CRC32C of header, key and stored value), the key, the value as stored,
//! zeros to the 4 KiB boundary. With `device_compression=host` the value is stored LZ4
//! compressed when that makes it smaller, so the extent spans fewer blocks; otherwise raw.
//! A read that finds anything else there (the log wrapped, the block was trimmed, bits
//! flipped, a stored length past the extent) is a miss.
//!
//! Modules by job: this one holds BT_LO, the index (`lookup`, `insert`, `remove_if`);
//! [`read`] the GET (`plan_get`, `finish_get`) and scan; [`write`] the PUT into the log
//! and removal; [`reclaim`] the log's FIFO drops, trims and `clear`; [`index_file`] saving
//! and loading BT_LO across a clean restart; [`journal`] the crash journal's log of its
//! changes and the recovery from it; [`extent`] an extent's bytes on the device.
//!
//! Every change to BT_LO holds the log's lock (`LargeObjects::log`) and is journaled
//! before it is made.

mod extent;
mod index_file;
mod journal;
mod read;
mod reclaim;
#[cfg(test)]
mod tests;
mod write;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use zipcache_device::BlockDevice;

use crate::btree::{BTree, Exclusive, Fence, KeyRange, Shared, lockable_by_range};
use crate::memory::{Memory, alloc_size};
use crate::record::Meta;
pub use read::{LoFinished, LoRead};

/// Entries per BT_LO leaf before it splits.
const LEAF_ENTRIES: usize = 32;

/// What BT_LO's index says of a large object, without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LargeEntry {
    pub meta: Meta,
    pub value_len: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    lba: u64,
    blocks: u32,
    value_len: u32,
    seq: u64,
    meta: Meta,
}

impl Extent {
    fn entry(&self) -> LargeEntry {
        LargeEntry {
            meta: self.meta,
            value_len: self.value_len as usize,
        }
    }
}

struct LoState {
    range: KeyRange,
    entries: Vec<(Arc<[u8]>, Extent)>,
}

struct LoLeaf {
    state: RwLock<LoState>,
}

lockable_by_range!(LoLeaf, LoState);

struct Log {
    /// Next block to write, relative to the region start.
    head: u64,
    /// Extents in the order written: (first block relative to the region, blocks, key, seq).
    extents: VecDeque<(u64, u32, Arc<[u8]>, u64)>,
    next_seq: u64,
}

#[derive(Debug, Default)]
pub struct LoCounters {
    pub objects: AtomicI64,
    pub gets: AtomicU64,
    pub hits: AtomicU64,
    pub bytes_written: AtomicU64,
    pub dropped: AtomicU64,
    pub checksum_failures: AtomicU64,
    pub io_errors: AtomicU64,
    /// Host time spent compressing values (`device_compression=host`).
    pub compress_ns: AtomicU64,
}

pub struct LargeObjects {
    device: Arc<dyn BlockDevice>,
    tree: BTree<Arc<LoLeaf>>,
    /// First block of the region and its length in blocks.
    start: u64,
    blocks: u64,
    log: Mutex<Log>,
    memory: Arc<Memory>,
    /// `device_compression=host`: values are stored LZ4-compressed where that shrinks them.
    host_compression: bool,
    /// With crash recovery on: every change is logged before it is made.
    journal: Option<journal::LoJournal>,
    pub counters: LoCounters,
}

/// DRAM one BT_LO entry takes: the entry, its key, and its slot in the log's queue.
fn entry_bytes(key_len: usize) -> i64 {
    (size_of::<(Arc<[u8]>, Extent)>()
        + alloc_size(key_len + 16)
        + size_of::<(u64, u32, Arc<[u8]>, u64)>()) as i64
}

impl LargeObjects {
    pub fn new(device: Arc<dyn BlockDevice>, start: u64, blocks: u64, memory: Arc<Memory>) -> Self {
        let first = Arc::new(LoLeaf {
            state: RwLock::new(LoState {
                range: KeyRange::everything(),
                entries: Vec::new(),
            }),
        });
        let lo = LargeObjects {
            host_compression: device.compression().by_host(),
            device,
            tree: BTree::new(first),
            start,
            blocks,
            log: Mutex::new(Log {
                head: 0,
                extents: VecDeque::new(),
                next_seq: 1,
            }),
            memory,
            journal: None,
            counters: LoCounters::default(),
        };
        lo.memory.change_index(lo.tree.node_bytes() as i64);
        lo
    }

    /// Whether BT_LO holds anything at all: writers of small objects skip it otherwise.
    pub fn is_empty(&self) -> bool {
        self.counters.objects.load(Ordering::Relaxed) <= 0
    }

    pub fn len(&self) -> u64 {
        self.counters.objects.load(Ordering::Relaxed).max(0) as u64
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// About the DRAM BT_LO holds (inner nodes, and entries taken at a 32-byte key), to
    /// weigh it against the budget without taking the log's lock.
    pub fn index_bytes(&self) -> u64 {
        self.tree.node_bytes() + self.len() * entry_bytes(32) as u64
    }

    fn lookup(&self, key: &[u8]) -> Option<Extent> {
        self.tree.with_arc_leaf_locked::<Shared, _>(key, |_, st| {
            st.entries
                .binary_search_by(|(k, _)| k.as_ref().cmp(key))
                .ok()
                .map(|i| st.entries[i].1)
        })
    }

    /// What BT_LO's index says of `key`'s live large object: no extent is read.
    pub fn entry(&self, key: &[u8], now_ms: u64) -> Option<LargeEntry> {
        self.lookup(key)
            .filter(|extent| !extent.meta.expired(now_ms))
            .map(|extent| extent.entry())
    }

    /// `key`'s entry told in words, for a test's failure report (`ZipCache::explain`).
    pub(crate) fn explain(&self, key: &[u8]) -> String {
        format!("BT_LO: {:?}", self.lookup(key))
    }

    /// Gives `key`'s large object the metadata `meta` (a touch) in its index entry
    /// alone: the value stays in its extent, unread and unwritten (the extent's header
    /// holds no metadata; a clean close saves the entry's, the crash journal logs it).
    /// False if BT_LO holds no entry for `key`.
    pub fn set_meta(&self, key: &[u8], meta: Meta) -> bool {
        let log = self.log.lock();
        let Some(extent) = self.lookup(key) else {
            return false;
        };
        self.log_meta(&log, key, extent.seq, &meta);
        self.tree
            .with_arc_leaf_locked::<Exclusive, _>(key, |_, mut st| {
                match st.entries.binary_search_by(|(k, _)| k.as_ref().cmp(key)) {
                    Ok(i) => {
                        st.entries[i].1.meta = meta;
                        true
                    }
                    Err(_) => false,
                }
            })
    }

    /// Points BT_LO at `extent` for `key`; returns the extent it replaced, for the caller
    /// to trim while it holds the log's lock.
    fn insert(&self, key: Arc<[u8]>, extent: Extent) -> Option<Extent> {
        let replaced = self
            .tree
            .with_arc_leaf_locked::<Exclusive, _>(&key, |_, mut st| {
                let replaced = match st.entries.binary_search_by(|(k, _)| k.as_ref().cmp(&key)) {
                    Ok(i) => Some(std::mem::replace(&mut st.entries[i].1, extent)),
                    Err(i) => {
                        st.entries.insert(i, (key.clone(), extent));
                        None
                    }
                };
                if st.entries.len() > LEAF_ENTRIES {
                    let half = st.entries.len() / 2;
                    let right = st.entries.split_off(half);
                    let low = Fence::from(right[0].0.as_ref());
                    let new = Arc::new(LoLeaf {
                        state: RwLock::new(LoState {
                            range: KeyRange::new(low.clone(), st.range.high.take()),
                            entries: right,
                        }),
                    });
                    st.range.high = Some(low.clone());
                    self.memory
                        .change_index(self.tree.split_and_publish([(low, new)]));
                }
                replaced
            });
        if replaced.is_none() {
            self.counters.objects.fetch_add(1, Ordering::Relaxed);
            self.memory.change_index(entry_bytes(key.len()));
        }
        replaced
    }

    /// Takes `key`'s extent out of BT_LO if `pred` holds for it. Not trimmed here: the
    /// caller trims under the log's lock (`trim_if_owned`, `drop_oldest`).
    fn remove_if(&self, key: &[u8], pred: impl Fn(&Extent) -> bool) -> Option<Extent> {
        self.lookup(key)?;
        let removed = self
            .tree
            .with_arc_leaf_locked::<Exclusive, _>(key, |_, mut st| {
                match st.entries.binary_search_by(|(k, _)| k.as_ref().cmp(key)) {
                    Ok(i) if pred(&st.entries[i].1) => Some(st.entries.remove(i).1),
                    _ => None,
                }
            })?;
        self.counters.objects.fetch_sub(1, Ordering::Relaxed);
        self.memory.change_index(-entry_bytes(key.len()));
        Some(removed)
    }
}
