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

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use zipcache_device::{AlignedBuf, BLOCK_SIZE, BlockDevice};

use crate::btree::{BTree, Exclusive, Fence, KeyRange, Shared, lockable_by_range};
use crate::memory::{Memory, alloc_size};
use crate::record::Meta;
use crate::sealed_file::{self, Fields, IndexFile};
use crate::ssd::host_compression::{compress_if_smaller, decompress_exactly};

const MAGIC: [u8; 4] = *b"ZCLO";
/// Version 1 (format 4 and before) had no stored length and no encoding: refused.
const VERSION: u8 = 2;
const HEADER: usize = 32;
/// How an extent stores its value (header byte 5).
const STORED_RAW: u8 = 0;
const STORED_LZ4: u8 = 1;
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
    pub counters: LoCounters,
}

/// The extent a GET is to read ([`LargeObjects::plan_get`]): where BT_LO pointed then.
pub struct LoRead(Extent);

impl LoRead {
    pub fn lba(&self) -> u64 {
        self.0.lba
    }

    /// A buffer the whole extent fits in.
    pub fn buffer(&self) -> AlignedBuf {
        AlignedBuf::zeroed(self.0.blocks as usize)
    }
}

/// How [`LargeObjects::finish_get`] ended.
pub enum LoFinished {
    /// The value and its metadata, or a miss (the read failed, or the extent is damaged).
    Done(Option<(Vec<u8>, Meta)>),
    /// BT_LO no longer points at the extent read: ask again, from DRAM down.
    Moved,
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

    /// The live large objects with keys in `[cursor, end)` in the BT_LO leaf holding
    /// `cursor` (their index entries: no value is read), and where the next leaf starts.
    pub fn scan_leaf(
        &self,
        cursor: &[u8],
        end: std::ops::Bound<&[u8]>,
        now_ms: u64,
    ) -> (Vec<(Vec<u8>, LargeEntry)>, Option<Fence>) {
        self.tree
            .with_arc_leaf_locked::<Shared, _>(cursor, |_, st| {
                let range = (std::ops::Bound::Included(cursor), end);
                let entries = st
                    .entries
                    .iter()
                    .filter(|(k, extent)| {
                        std::ops::RangeBounds::contains(&range, k.as_ref())
                            && !extent.meta.expired(now_ms)
                    })
                    .map(|(k, extent)| {
                        let entry = LargeEntry {
                            meta: extent.meta,
                            value_len: extent.value_len as usize,
                        };
                        (k.to_vec(), entry)
                    })
                    .collect();
                (entries, st.range.high.clone())
            })
    }

    fn lookup(&self, key: &[u8]) -> Option<Extent> {
        self.tree.with_arc_leaf_locked::<Shared, _>(key, |_, st| {
            st.entries
                .binary_search_by(|(k, _)| k.as_ref().cmp(key))
                .ok()
                .map(|i| st.entries[i].1)
        })
    }

    /// The large object stored under `key`, read from its extent on this thread; `None`
    /// also if the key moved on while it was read (`LoFinished::Moved`).
    pub fn get(&self, key: &[u8], now_ms: u64) -> Option<(Vec<u8>, Meta)> {
        match self.read(self.plan_get(key, now_ms)?, key) {
            LoFinished::Done(found) => found,
            LoFinished::Moved => None,
        }
    }

    /// The first half of a GET: the extent BT_LO points at for `key`, if any and not
    /// expired. The read happens on this thread (`read`) or in flight; `finish_get` then
    /// checks what it found.
    pub fn plan_get(&self, key: &[u8], now_ms: u64) -> Option<LoRead> {
        if self.is_empty() {
            return None;
        }
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let extent = self.lookup(key)?;
        (!extent.meta.expired(now_ms)).then_some(LoRead(extent))
    }

    /// Reads the extent planned for `key` on this thread and finishes the GET.
    pub fn read(&self, read: LoRead, key: &[u8]) -> LoFinished {
        let mut buf = read.buffer();
        // may do I/O: the whole extent
        let done = self.device.read(read.lba(), &mut buf).is_ok();
        self.finish_get(read, key, done.then_some(&buf[..]))
    }

    /// The second half of a GET: the value in the extent read for `read` (`None` if the
    /// read failed). BT_LO is asked first: if it no longer points at that very extent,
    /// the key was overwritten or deleted, or the extent left the log, while it was read,
    /// and what the read found may be an older value (`Moved`). Otherwise the extent was
    /// neither trimmed nor reused before the read completed: its own trim and reuse
    /// follow its removal from BT_LO, and another extent's trim lands only while the log
    /// owns that extent's blocks (`trim_if_owned`). Bytes that fail the header or checksum
    /// are damage: a miss.
    pub fn finish_get(&self, read: LoRead, key: &[u8], bytes: Option<&[u8]>) -> LoFinished {
        if self.lookup(key).is_none_or(|now| now.seq != read.0.seq) {
            return LoFinished::Moved;
        }
        let Some(bytes) = bytes else {
            self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
            return LoFinished::Done(None);
        };
        match decode(bytes, key, &read.0) {
            Some(value) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                LoFinished::Done(Some((value, read.0.meta)))
            }
            None => {
                self.counters
                    .checksum_failures
                    .fetch_add(1, Ordering::Relaxed);
                LoFinished::Done(None)
            }
        }
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// Writes a large object and points BT_LO at it. Returns false if it cannot be kept
    /// (larger than the region, or the device failed); any older large version is then
    /// removed all the same.
    pub fn put(&self, key: &[u8], value: &[u8], meta: Meta) -> bool {
        let stored = self.stored_form(value);
        let blocks = (HEADER + key.len() + stored.bytes().len()).div_ceil(BLOCK_SIZE) as u64;
        if blocks > self.blocks / 2 {
            self.remove(key);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let mut log = self.log.lock();
        if log.head + blocks > self.blocks {
            // Wrap: the extents between the head and the end of the region are the oldest
            // now, and the log skips them; they go first.
            let skipped = log.head;
            while log
                .extents
                .front()
                .is_some_and(|&(first, ..)| first >= skipped)
            {
                let (first, len, old_key, old_seq) = log.extents.pop_front().expect("front exists");
                self.drop_oldest(&old_key, old_seq, first, len);
            }
            log.head = 0;
        }
        let (from, to) = (log.head, log.head + blocks);
        // Drop the oldest extents the new one will overwrite.
        while let Some(&(first, len, _, _)) = log.extents.front() {
            let overlaps = first < to && first + u64::from(len) > from;
            if !overlaps {
                break;
            }
            let (first, len, old_key, old_seq) = log.extents.pop_front().expect("front exists");
            self.drop_oldest(&old_key, old_seq, first, len);
        }
        let seq = log.next_seq;
        log.next_seq += 1;
        let extent = Extent {
            lba: self.start + from,
            blocks: blocks as u32,
            value_len: value.len() as u32,
            seq,
            meta,
        };
        let buf = encode(key, &stored, &extent);
        log.head = to;
        if self.device.write(extent.lba, &buf).is_err() {
            self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
            drop(log);
            self.remove(key);
            return false;
        }
        self.counters
            .bytes_written
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        let key: Arc<[u8]> = Arc::from(key);
        log.extents
            .push_back((from, blocks as u32, key.clone(), seq));
        // Into BT_LO before the log's lock goes, so that the log never wraps onto an
        // extent the index does not know yet; the extent it replaces is trimmed while the
        // log still owns its blocks (`trim_if_owned`).
        if let Some(replaced) = self.insert(key, extent) {
            self.trim_if_owned(&log, &replaced);
        }
        true
    }

    /// How `value` goes to its extent: LZ4-compressed in `host` mode if that shrinks it.
    /// Compressed before the log's lock is taken, so writers do not queue behind it.
    fn stored_form<'v>(&self, value: &'v [u8]) -> Stored<'v> {
        if self.host_compression {
            let mut compressed = Vec::with_capacity(lzzzz::lz4::max_compressed_size(value.len()));
            if compress_if_smaller(value, &mut compressed, &self.counters.compress_ns) {
                return Stored::Lz4(compressed);
            }
        }
        Stored::Raw(value)
    }

    /// About the DRAM BT_LO holds (inner nodes, and entries taken at a 32-byte key), to
    /// weigh it against the budget without taking the log's lock.
    pub fn index_bytes(&self) -> u64 {
        self.tree.node_bytes() + self.len() * entry_bytes(32) as u64
    }

    /// Drops the oldest extent of the log (FIFO), to shrink BT_LO; false if it is empty.
    pub fn drop_oldest_one(&self) -> bool {
        let mut log = self.log.lock();
        let Some((first, len, key, seq)) = log.extents.pop_front() else {
            return false;
        };
        self.drop_oldest(&key, seq, first, len);
        true
    }

    /// FIFO eviction of one extent (`first`, `len` blocks into the region), popped from
    /// the log by the caller, which still holds the log's lock: if BT_LO still points at
    /// it, it leaves BT_LO and its blocks are trimmed before anyone can reuse them. A dead
    /// extent was trimmed when it died.
    fn drop_oldest(&self, key: &[u8], seq: u64, first: u64, len: u32) {
        if self.remove_if(key, |e| e.seq == seq).is_some() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            let _ = self.device.trim(self.start + first, u64::from(len));
        }
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

    /// Drops the large object under `key`, if any (a small PUT or a DELETE replaced it),
    /// and returns its metadata. Decided by BT_LO alone: no device read, and not by the
    /// object counter, which can read 0 for a moment while an entry is in the tree.
    pub fn remove(&self, key: &[u8]) -> Option<Meta> {
        // Every small PUT asks: look under the shared lock first, so that writers of small
        // objects queue neither on the log nor on BT_LO's one leaf for nothing.
        self.lookup(key)?;
        let log = self.log.lock();
        let removed = self.remove_if(key, |_| true)?;
        self.trim_if_owned(&log, &removed);
        Some(removed.meta)
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

    /// Trims a dead extent's blocks so the SSD stops holding them — only while the log
    /// (`log`: its lock held) still owns them. Once an extent leaves BT_LO, the log's next
    /// wrap may pop it and write another key's extent there, and a trim landing after that
    /// would erase a live object; a popped extent's blocks are the writer's, not ours.
    fn trim_if_owned(&self, log: &Log, extent: &Extent) {
        // The log holds its extents in the order written, which is the order of their seq.
        let owned = log
            .extents
            .binary_search_by_key(&extent.seq, |&(.., seq)| seq)
            .is_ok();
        if owned {
            let _ = self.device.trim(extent.lba, u64::from(extent.blocks));
        }
    }

    /// Forgets every large object and trims the region.
    pub fn clear(&self) {
        let mut log = self.log.lock();
        while let Some((_, _, key, seq)) = log.extents.pop_front() {
            self.remove_if(&key, |e| e.seq == seq);
        }
        log.head = 0;
        let _ = self.device.trim(self.start, self.blocks);
    }
}

/// BT_LO as a clean `close()` leaves it for the next `open()` (`docs/FORMAT.md`, "The
/// large-object index file").
mod index_file {
    pub const MAGIC: [u8; 4] = *b"ZCLX";
    /// 3 since extents of version 2 (format 5): an index of 2 names extents of version 1,
    /// which are refused, so it is not loaded (the region starts empty).
    pub const VERSION: u32 = 3;
}

impl LargeObjects {
    /// Writes the live extents (in log order) and the log's position to `at`, atomically
    /// and durably (`sealed_file`). Called only after the device was flushed, so the file
    /// never names an extent that is not durable.
    pub fn save(&self, at: IndexFile<'_>) -> std::io::Result<()> {
        let log = self.log.lock();
        let mut out = Vec::new();
        out.extend_from_slice(&index_file::MAGIC);
        out.extend_from_slice(&index_file::VERSION.to_le_bytes());
        out.extend_from_slice(&at.epoch.to_le_bytes());
        for n in [self.start, self.blocks, log.head, log.next_seq] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        let live: Vec<(&Arc<[u8]>, Extent)> = log
            .extents
            .iter()
            .filter_map(|(_, _, key, seq)| {
                self.lookup(key).filter(|e| e.seq == *seq).map(|e| (key, e))
            })
            .collect();
        out.extend_from_slice(&(live.len() as u32).to_le_bytes());
        for (key, e) in live {
            out.extend_from_slice(&(key.len() as u16).to_le_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(&(e.lba - self.start).to_le_bytes());
            out.extend_from_slice(&e.blocks.to_le_bytes());
            out.extend_from_slice(&e.value_len.to_le_bytes());
            out.extend_from_slice(&e.seq.to_le_bytes());
            out.push(u8::from(e.meta.expires_at_ms.is_some()) | u8::from(e.meta.client_cas) << 1);
            out.extend_from_slice(&e.meta.expires_at_ms.unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&e.meta.flags.to_le_bytes());
            out.extend_from_slice(&e.meta.cas.to_le_bytes());
        }
        sealed_file::write(at.dir, at.name, out)
    }

    /// Rebuilds BT_LO and its log from a file `save` wrote for this very region; `None`
    /// if the file is missing, damaged or describes another layout (then the region
    /// starts empty). Every extent is still checked against its on-device header and
    /// CRC when it is read.
    pub fn load(
        at: IndexFile<'_>,
        device: Arc<dyn BlockDevice>,
        start: u64,
        blocks: u64,
        memory: Arc<Memory>,
    ) -> Option<LargeObjects> {
        let body = sealed_file::read(at.dir, at.name)?;
        let mut f = Fields::new(&body);
        if f.bytes(4)? != index_file::MAGIC
            || f.u32()? != index_file::VERSION
            || f.u64()? != at.epoch
            || f.u64()? != start
            || f.u64()? != blocks
        {
            return None;
        }
        let head = f.u64()?;
        let next_seq = f.u64()?;
        let count = f.u32()? as usize;
        let mut extents = Vec::with_capacity(count.min(1 << 20));
        let mut keys = std::collections::HashSet::new();
        for _ in 0..count {
            let key_len = f.u16()? as usize;
            let key: Arc<[u8]> = Arc::from(f.bytes(key_len)?);
            let first = f.u64()?;
            let len = f.u32()?;
            let value_len = f.u32()?;
            let seq = f.u64()?;
            let tags = f.u8()?;
            if tags > 0b11 {
                return None;
            }
            let (has_expiry, client_cas) = (tags & 1 != 0, tags & 0b10 != 0);
            let expires_at_ms = f.u64()?;
            let flags = f.u32()?;
            let cas = f.u64()?;
            let fits = first
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= blocks);
            if !fits || len == 0 || seq >= next_seq || !keys.insert(key.clone()) {
                return None;
            }
            let meta = Meta {
                expires_at_ms: has_expiry.then_some(expires_at_ms),
                flags,
                cas,
                clean: false,
                client_cas,
            };
            let extent = Extent {
                lba: start + first,
                blocks: len,
                value_len,
                seq,
                meta,
            };
            extents.push((first, key, extent));
        }
        if !f.is_done() || head > blocks {
            return None;
        }
        let lo = LargeObjects::new(device, start, blocks, memory);
        {
            let mut log = lo.log.lock();
            log.head = head;
            log.next_seq = next_seq;
            for (first, key, extent) in &extents {
                log.extents
                    .push_back((*first, extent.blocks, key.clone(), extent.seq));
            }
        }
        for (_, key, extent) in extents {
            lo.insert(key, extent);
        }
        Some(lo)
    }
}

/// A value as its extent holds it.
enum Stored<'v> {
    Raw(&'v [u8]),
    Lz4(Vec<u8>),
}

impl Stored<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Stored::Raw(value) => value,
            Stored::Lz4(compressed) => compressed,
        }
    }

    fn tag(&self) -> u8 {
        match self {
            Stored::Raw(_) => STORED_RAW,
            Stored::Lz4(_) => STORED_LZ4,
        }
    }
}

fn encode(key: &[u8], stored: &Stored<'_>, extent: &Extent) -> AlignedBuf {
    let bytes = stored.bytes();
    let mut buf = AlignedBuf::zeroed(extent.blocks as usize);
    buf[0..4].copy_from_slice(&MAGIC);
    buf[4] = VERSION;
    buf[5] = stored.tag();
    buf[6..8].copy_from_slice(&(key.len() as u16).to_le_bytes());
    buf[8..12].copy_from_slice(&extent.value_len.to_le_bytes());
    buf[12..20].copy_from_slice(&extent.seq.to_le_bytes());
    buf[24..28].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
    buf[HEADER..HEADER + key.len()].copy_from_slice(key);
    buf[HEADER + key.len()..HEADER + key.len() + bytes.len()].copy_from_slice(bytes);
    let crc = checksum(&buf, key.len() + bytes.len());
    buf[20..24].copy_from_slice(&crc.to_le_bytes());
    buf
}

/// CRC32C of the header but for its own field (bytes 20..24), then `body` bytes of key and
/// stored value: whatever the extent holds that a read will use.
fn checksum(buf: &[u8], body: usize) -> u32 {
    let header = crc32c::crc32c_append(crc32c::crc32c(&buf[..20]), &buf[24..HEADER]);
    crc32c::crc32c_append(header, &buf[HEADER..HEADER + body])
}

/// The value in an extent read for `extent` under `key`, or `None` if anything in it
/// disagrees: header, lengths (a stored length past the bytes read, a value that does not
/// decompress to exactly its length), sequence number, key or CRC32C.
fn decode(buf: &[u8], key: &[u8], extent: &Extent) -> Option<Vec<u8>> {
    let value_len = extent.value_len as usize;
    if buf.len() < HEADER || buf[0..4] != MAGIC || buf[4] != VERSION {
        return None;
    }
    let field = |at: usize| u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    let stored_len = field(24) as usize;
    let body = key.len().checked_add(stored_len)?;
    let ok = HEADER.checked_add(body).is_some_and(|end| end <= buf.len())
        && usize::from(u16::from_le_bytes([buf[6], buf[7]])) == key.len()
        && field(8) as usize == value_len
        && u64::from_le_bytes(buf[12..20].try_into().ok()?) == extent.seq
        && field(20) == checksum(buf, body)
        && &buf[HEADER..HEADER + key.len()] == key;
    if !ok {
        return None;
    }
    let stored = &buf[HEADER + key.len()..HEADER + body];
    match buf[5] {
        STORED_RAW if stored_len == value_len => Some(stored.to_vec()),
        STORED_LZ4 => {
            let mut value = vec![0; value_len];
            decompress_exactly(stored, &mut value).then_some(value)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zipcache_device::{
        CompressingDevice, DeviceCompression, EmulatorOptions, FaultyDevice, MemDevice,
    };

    fn region(blocks: u64) -> LargeObjects {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(blocks + 10));
        LargeObjects::new(device, 10, blocks, Arc::new(Memory::default()))
    }

    #[test]
    fn objects_round_trip_and_replace() {
        let lo = region(64);
        let big = vec![7u8; 10_000];
        assert!(lo.put(b"k", &big, Meta::default()));
        assert_eq!(lo.get(b"k", 0).unwrap().0, big);
        assert!(lo.put(
            b"k",
            &[1u8; 5000],
            Meta {
                flags: 3,
                ..Meta::default()
            }
        ));
        let (v, m) = lo.get(b"k", 0).unwrap();
        assert_eq!((v.len(), m.flags), (5000, 3));
        assert_eq!(lo.len(), 1);
        lo.remove(b"k");
        assert!(lo.get(b"k", 0).is_none());
        assert!(lo.is_empty());
    }

    /// Finding 4 of issue 9: the object counter is a hint that can read 0 for a moment
    /// while an entry is in BT_LO (one put's insert not yet counted, another put's FIFO
    /// drop already subtracted). A removal must not trust it.
    #[test]
    fn removal_does_not_trust_the_object_counter() {
        let lo = region(64);
        assert!(lo.put(b"k", &[7u8; 5000], Meta::default()));
        lo.counters.objects.store(0, Ordering::Relaxed);
        lo.remove(b"k");
        lo.counters.objects.store(1, Ordering::Relaxed);
        assert!(lo.get(b"k", 0).is_none(), "an older large version survived");
    }

    /// A GET's read of an extent BT_LO stopped pointing at before the read completed
    /// (overwritten, deleted, dropped from the log) is not trusted, even if its bytes are
    /// intact; damaged bytes of the current extent are a miss.
    #[test]
    fn a_read_is_checked_against_bt_lo_when_it_completes() {
        let lo = region(64);
        let read_of = |lo: &LargeObjects| {
            let read = lo.plan_get(b"k", 0).unwrap();
            let mut buf = read.buffer();
            lo.device.read(read.lba(), &mut buf).unwrap();
            (read, buf)
        };
        let moved = |finished| matches!(finished, LoFinished::Moved);
        assert!(lo.put(b"k", &[1u8; 5000], Meta::default()));
        let (read, old) = read_of(&lo);
        assert!(lo.put(b"k", &[2u8; 5000], Meta::default()));
        assert!(moved(lo.finish_get(read, b"k", Some(&old))), "overwritten");
        let (read, current) = read_of(&lo);
        match lo.finish_get(read, b"k", Some(&current)) {
            LoFinished::Done(Some((value, _))) => assert_eq!(value, vec![2u8; 5000]),
            _ => panic!("the current extent"),
        }
        let (read, mut damaged) = read_of(&lo);
        damaged[HEADER + 10] ^= 1;
        assert!(matches!(
            lo.finish_get(read, b"k", Some(&damaged)),
            LoFinished::Done(None)
        ));
        assert_eq!(lo.counters.checksum_failures.load(Ordering::Relaxed), 1);
        let (read, _) = read_of(&lo);
        assert!(matches!(
            lo.finish_get(read, b"k", None),
            LoFinished::Done(None)
        ));
        assert_eq!(lo.counters.io_errors.load(Ordering::Relaxed), 1);
        let (read, intact) = read_of(&lo);
        lo.remove(b"k");
        assert!(moved(lo.finish_get(read, b"k", Some(&intact))), "deleted");
    }

    /// A region on a device that asks the host to compress (`device_compression=host`),
    /// which also accounts the blocks written.
    fn host_region(blocks: u64) -> (LargeObjects, Arc<dyn BlockDevice>) {
        let options = EmulatorOptions {
            mode: DeviceCompression::Host,
            ..EmulatorOptions::default()
        };
        let device = CompressingDevice::new(MemDevice::new(blocks + 10), options).unwrap();
        let device: Arc<dyn BlockDevice> = Arc::new(device);
        let lo = LargeObjects::new(device.clone(), 10, blocks, Arc::new(Memory::default()));
        (lo, device)
    }

    /// JSON-like text: compresses several times over with LZ4.
    fn document(len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 64);
        let mut i = 0u32;
        while out.len() < len {
            out.extend_from_slice(
                format!(r#"{{"id":{i},"name":"airport {}","state":"CA"}},"#, i * 7).as_bytes(),
            );
            i += 1;
        }
        out.truncate(len);
        out
    }

    /// Bytes LZ4 cannot shrink (xorshift).
    fn noise(len: usize) -> Vec<u8> {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    fn extent_blocks(lo: &LargeObjects, key: &[u8]) -> u32 {
        lo.lookup(key).unwrap().blocks
    }

    #[test]
    fn host_mode_stores_a_value_compressed_in_fewer_blocks_and_raw_when_that_does_not_pay() {
        let (lo, device) = host_region(256);
        let doc = document(40_000);
        let raw_blocks = (HEADER + 3 + doc.len()).div_ceil(BLOCK_SIZE) as u32;
        assert!(lo.put(b"doc", &doc, Meta::default()));
        let doc_blocks = extent_blocks(&lo, b"doc");
        assert!(doc_blocks * 3 <= raw_blocks, "{doc_blocks} of {raw_blocks}");
        assert_eq!(lo.get(b"doc", 0).unwrap().0, doc);
        assert!(lo.counters.compress_ns.load(Ordering::Relaxed) > 0);

        let random = noise(10_000);
        assert!(lo.put(b"noise", &random, Meta::default()));
        let noise_blocks = extent_blocks(&lo, b"noise");
        assert_eq!(noise_blocks, 3, "stored raw");
        assert_eq!(lo.get(b"noise", 0).unwrap().0, random);

        // What reaches the device is the blocks of the extents as stored, and that is
        // what a plain drive's flash holds (`ssd_flash_bytes`).
        device.drain().unwrap();
        let written = u64::from(doc_blocks + noise_blocks) * BLOCK_SIZE as u64;
        assert_eq!(lo.counters.bytes_written.load(Ordering::Relaxed), written);
        assert_eq!(device.stats().host_bytes_written, written);
        assert_eq!(device.stats().physical_used, written);

        // Without `host`, the same value is stored whole.
        let plain = region(256);
        assert!(plain.put(b"doc", &doc, Meta::default()));
        assert_eq!(extent_blocks(&plain, b"doc"), raw_blocks);
        assert_eq!(plain.counters.compress_ns.load(Ordering::Relaxed), 0);
        assert_eq!(plain.get(b"doc", 0).unwrap().0, doc);
    }

    /// Every way a compressed extent can be damaged reads as a miss, counted, never as
    /// other bytes and never as a panic: a flipped bit (the CRC), and header fields that
    /// lie although the CRC was made to match (a stored length past the extent or short
    /// of the LZ4 block, another encoding, another version).
    #[test]
    fn damaged_compressed_extents_read_as_misses() {
        let (lo, _device) = host_region(64);
        let doc = document(20_000);
        assert!(lo.put(b"k", &doc, Meta::default()));
        let read_of = || {
            let read = lo.plan_get(b"k", 0).unwrap();
            let mut buf = read.buffer();
            lo.device.read(read.lba(), &mut buf).unwrap();
            (read, buf)
        };
        let (_, intact) = read_of();
        assert_eq!(intact[5], STORED_LZ4);
        let stored_len = u32::from_le_bytes(intact[24..28].try_into().unwrap()) as usize;
        let resealed = |mut buf: AlignedBuf, body: usize| {
            let crc = checksum(&buf, body.min(buf.len() - HEADER));
            buf[20..24].copy_from_slice(&crc.to_le_bytes());
            buf
        };
        type Damage<'a> = Box<dyn Fn(AlignedBuf) -> AlignedBuf + 'a>;
        let damage: Vec<(&str, Damage<'_>)> = vec![
            (
                "a flipped bit in the stored value",
                Box::new(|mut b| {
                    b[HEADER + 1 + stored_len / 2] ^= 0x10;
                    b
                }),
            ),
            (
                "a flipped bit in the stored length",
                Box::new(|mut b| {
                    b[25] ^= 1;
                    b
                }),
            ),
            (
                "a stored length past the extent",
                Box::new(|mut b| {
                    let len = b.len() as u32;
                    b[24..28].copy_from_slice(&len.to_le_bytes());
                    resealed(b, 1 + len as usize)
                }),
            ),
            (
                "a stored length one short",
                Box::new(|mut b| {
                    let len = stored_len as u32 - 1;
                    b[24..28].copy_from_slice(&len.to_le_bytes());
                    resealed(b, 1 + len as usize)
                }),
            ),
            (
                "a stored length of u32::MAX",
                Box::new(|mut b| {
                    b[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
                    b
                }),
            ),
            (
                "the raw encoding",
                Box::new(|mut b| {
                    b[5] = STORED_RAW;
                    resealed(b, 1 + stored_len)
                }),
            ),
            (
                "an unknown encoding",
                Box::new(|mut b| {
                    b[5] = 7;
                    resealed(b, 1 + stored_len)
                }),
            ),
            (
                "version 1",
                Box::new(|mut b| {
                    b[4] = 1;
                    resealed(b, 1 + stored_len)
                }),
            ),
        ];
        for (failures, (what, damage)) in (1..).zip(&damage) {
            let (read, buf) = read_of();
            let damaged = damage(buf);
            assert!(
                matches!(
                    lo.finish_get(read, b"k", Some(&damaged)),
                    LoFinished::Done(None)
                ),
                "{what}"
            );
            assert_eq!(
                lo.counters.checksum_failures.load(Ordering::Relaxed),
                failures,
                "{what}"
            );
        }
        let (read, _) = read_of();
        let short = &intact[..HEADER - 1];
        assert!(matches!(
            lo.finish_get(read, b"k", Some(short)),
            LoFinished::Done(None)
        ));
        // The extent itself was never touched.
        assert_eq!(lo.get(b"k", 0).unwrap().0, doc);
    }

    /// Through a device that flips bits as it reads: a miss, never a wrong value.
    #[test]
    fn bits_flipped_on_the_device_make_a_compressed_extent_a_miss() {
        let options = EmulatorOptions {
            mode: DeviceCompression::Host,
            ..EmulatorOptions::default()
        };
        let inner = CompressingDevice::new(MemDevice::new(74), options).unwrap();
        let faulty = Arc::new(FaultyDevice::new(inner));
        let device: Arc<dyn BlockDevice> = faulty.clone();
        let lo = LargeObjects::new(device, 10, 64, Arc::new(Memory::default()));
        let doc = document(30_000);
        assert!(lo.put(b"k", &doc, Meta::default()));
        let lba = lo.lookup(b"k").unwrap().lba;
        faulty.flip_bits_on_read(lba, 100, 0x04);
        assert_eq!(lo.get(b"k", 0), None);
        assert_eq!(lo.counters.checksum_failures.load(Ordering::Relaxed), 1);
        faulty.clear();
        assert_eq!(lo.get(b"k", 0).unwrap().0, doc);
    }

    #[test]
    fn the_log_wraps_and_drops_the_oldest() {
        let lo = region(32);
        for i in 0..100u32 {
            let key = format!("key-{i:04}");
            assert!(lo.put(key.as_bytes(), &vec![i as u8; 6000], Meta::default()));
        }
        // 2 blocks each in a 32-block region: the newest 16 survive.
        let live: Vec<u32> = (0..100)
            .filter(|i| lo.get(format!("key-{i:04}").as_bytes(), 0).is_some())
            .collect();
        assert!(
            live.len() >= 15 && live.iter().all(|&i| i >= 84),
            "{live:?}"
        );
        for &i in &live {
            assert_eq!(
                lo.get(format!("key-{i:04}").as_bytes(), 0).unwrap().0,
                vec![i as u8; 6000]
            );
        }
        assert_eq!(lo.len(), live.len() as u64);
        assert!(lo.counters.dropped.load(Ordering::Relaxed) >= 84);
    }

    #[test]
    fn wrapping_drops_the_extents_it_skips() {
        let lo = region(10);
        let one = [1u8; 100];
        for i in 0..10u32 {
            assert!(lo.put(format!("a{i}").as_bytes(), &one, Meta::default()));
        }
        // Wraps to block 0 and overwrites a0..a2; c, d, e then take blocks 3, 4, 5.
        assert!(lo.put(b"three", &[3u8; 9000], Meta::default()));
        for key in ["c", "d", "e"] {
            assert!(lo.put(key.as_bytes(), &one, Meta::default()));
        }
        // Five blocks do not fit after block 6: the log wraps again, skipping a6..a9 at
        // the end, and overwrites `three`, `c` and `d` at the start. All of them must
        // leave BT_LO: none may point at blocks that now hold something else.
        assert!(lo.put(b"five", &[5u8; 18000], Meta::default()));
        assert_eq!(lo.get(b"five", 0).unwrap().0, vec![5u8; 18000]);
        assert!(lo.get(b"e", 0).is_some());
        for key in ["a6", "a7", "a8", "a9", "three", "c", "d"] {
            assert!(lo.get(key.as_bytes(), 0).is_none(), "{key}");
        }
        assert_eq!(
            lo.counters.checksum_failures.load(Ordering::Relaxed),
            0,
            "no dangling extent"
        );
        assert_eq!(lo.len(), 2);
    }

    #[test]
    fn many_keys_split_leaves_and_stay_findable() {
        let lo = region(4096);
        for i in 0..500u32 {
            assert!(lo.put(
                format!("{i:08}").as_bytes(),
                &vec![1u8; 3000],
                Meta::default()
            ));
        }
        assert!(lo.tree.leaf_count() > 10);
        for i in 0..500u32 {
            assert!(lo.get(format!("{i:08}").as_bytes(), 0).is_some(), "{i}");
        }
    }

    #[test]
    fn the_index_file_round_trips_and_refuses_damage() {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(42));
        let memory = Arc::new(Memory::default());
        let lo = LargeObjects::new(device.clone(), 10, 32, memory.clone());
        for i in 0..20u32 {
            let meta = Meta {
                expires_at_ms: (i % 2 == 0).then_some(1_000 + u64::from(i)),
                flags: i,
                cas: 77,
                clean: false,
                client_cas: i % 3 == 0,
            };
            assert!(lo.put(format!("key-{i:02}").as_bytes(), &vec![i as u8; 5000], meta));
        }
        lo.remove(b"key-19");
        let path = std::env::temp_dir().join(format!("zc-lo-index-{}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        let dir = crate::index_dir::FsDir::new(&path);
        let at = |epoch| IndexFile {
            dir: &dir,
            name: "lo",
            epoch,
        };
        lo.save(at(7)).unwrap();
        let back = LargeObjects::load(at(7), device.clone(), 10, 32, memory.clone()).unwrap();
        assert_eq!(back.len(), lo.len());
        for i in 0..20u32 {
            let key = format!("key-{i:02}");
            assert_eq!(
                back.get(key.as_bytes(), 0),
                lo.get(key.as_bytes(), 0),
                "{key}"
            );
        }
        // The restored log goes on where it stopped: the next put drops the oldest.
        assert!(back.put(b"new", &[9u8; 5000], Meta::default()));
        assert_eq!(back.get(b"new", 0).unwrap().0, vec![9u8; 5000]);
        assert_eq!(back.log.lock().head, lo.log.lock().head + 2);
        // Another run epoch, another region, or one flipped byte: not loaded.
        assert!(LargeObjects::load(at(8), device.clone(), 10, 32, memory.clone()).is_none());
        assert!(LargeObjects::load(at(7), device.clone(), 10, 31, memory.clone()).is_none());
        // An index of version 2 names extents of version 1, which reads refuse: not
        // loaded, even sealed intact.
        let mut older = sealed_file::read(&dir, "lo").unwrap();
        older[4..8].copy_from_slice(&2u32.to_le_bytes());
        sealed_file::write(&dir, "lo", older).unwrap();
        assert!(LargeObjects::load(at(7), device.clone(), 10, 32, memory.clone()).is_none());
        lo.save(at(7)).unwrap();
        let mut bytes = std::fs::read(path.join("lo")).unwrap();
        bytes[30] ^= 1;
        std::fs::write(path.join("lo"), &bytes).unwrap();
        assert!(LargeObjects::load(at(7), device, 10, 32, memory).is_none());
        std::fs::remove_dir_all(&path).unwrap();
    }

    std::thread_local! {
        /// Whether this thread's trims of `TrimGate::held_lba` wait for the test.
        static HOLDS_TRIMS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A memory device whose trim of one chosen block, on a thread that `HOLDS_TRIMS`,
    /// waits until the test lets it go: the trim of a dead extent held between leaving
    /// BT_LO and reaching the device.
    struct TrimGate {
        inner: MemDevice,
        held_lba: u64,
        entered: std::sync::mpsc::SyncSender<()>,
        release: Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl BlockDevice for TrimGate {
        fn block_count(&self) -> u64 {
            self.inner.block_count()
        }
        fn read(&self, lba: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.inner.read(lba, buf)
        }
        fn write(&self, lba: u64, buf: &[u8]) -> std::io::Result<()> {
            self.inner.write(lba, buf)
        }
        fn trim(&self, lba: u64, count: u64) -> std::io::Result<()> {
            if HOLDS_TRIMS.get() && (lba..lba + count).contains(&self.held_lba) {
                self.entered.send(()).unwrap();
                self.release.lock().recv().unwrap();
            }
            self.inner.trim(lba, count)
        }
        fn flush(&self) -> std::io::Result<()> {
            self.inner.flush()
        }
        fn stats(&self) -> zipcache_device::DeviceStats {
            self.inner.stats()
        }
    }

    /// The stress test's `checksum_failures` with an SSD tier: a small PUT or a DELETE
    /// takes a large object out of BT_LO (`remove`), and a large PUT replaces one
    /// (`insert`), and each trims the dead extent only after BT_LO's leaf lock is let go,
    /// without the log's lock. The log no longer counts the extent as live (its FIFO
    /// drop finds BT_LO pointing elsewhere), so a PUT of another key may wrap onto those
    /// blocks first; the late trim then zeroes that live extent, and its GET misses with a
    /// checksum failure. Not a wrong value (the extent header's unique sequence number
    /// and CRC refuse the zeros), but a live object lost and a counted failure on a
    /// healthy device.
    #[test]
    fn a_dead_extents_trim_never_erases_the_extent_that_reused_its_blocks() {
        type Kill = fn(&LargeObjects);
        let kills: [(&str, Kill); 2] = [
            ("remove", |lo| {
                lo.remove(b"dead");
            }),
            ("replace", |lo| {
                lo.put(b"dead", &[2u8; 1000], Meta::default());
            }),
        ];
        let (mut outcomes, mut expected) = (Vec::new(), Vec::new());
        for (how, kill) in kills {
            let (entered, on_enter) = std::sync::mpsc::sync_channel(1);
            let (let_go, release) = std::sync::mpsc::channel();
            let region_start = 10;
            let device = Arc::new(TrimGate {
                inner: MemDevice::new(region_start + 8),
                held_lba: region_start,
                entered,
                release: Mutex::new(release),
            });
            let lo = LargeObjects::new(device, region_start, 8, Arc::new(Memory::default()));
            // One block per object: "dead" takes the region's first block.
            assert!(lo.put(b"dead", &[1u8; 1000], Meta::default()));
            // PUTs that fill the region and wrap onto its first block (a replacing PUT
            // took one block more).
            let fill = if how == "replace" { 7 } else { 8 };
            std::thread::scope(|s| {
                let killer = s.spawn(|| {
                    HOLDS_TRIMS.set(true);
                    kill(&lo)
                });
                // A killer that does not trim the block itself leaves nothing to race.
                let _ = on_enter.recv_timeout(std::time::Duration::from_secs(5));
                // The trim of "dead"'s extent is on its way; meanwhile the log wraps —
                // unless the trim holds the log's lock, as it must: then the writer waits
                // for it, and the test lets the trim go after a while.
                let (wrapped, on_wrapped) = std::sync::mpsc::channel();
                let lo = &lo;
                let writer = s.spawn(move || {
                    for i in 0..fill {
                        let key = format!("live-{i}");
                        assert!(lo.put(key.as_bytes(), &[i as u8 + 10; 1000], Meta::default()));
                    }
                    let _ = wrapped.send(());
                });
                let _ = on_wrapped.recv_timeout(std::time::Duration::from_secs(2));
                let_go.send(()).unwrap();
                killer.join().unwrap();
                writer.join().unwrap();
            });
            // The last PUT wrapped onto the dead extent's block; BT_LO still points at it.
            let reused = format!("live-{}", fill - 1);
            assert!(lo.lookup(reused.as_bytes()).is_some());
            let found = lo.get(reused.as_bytes(), 0).map(|(v, _)| v[0]);
            let failures = lo.counters.checksum_failures.load(Ordering::Relaxed);
            outcomes.push((how, found, failures));
            expected.push((how, Some(fill as u8 - 1 + 10), 0));
        }
        assert_eq!(
            outcomes, expected,
            "the extent that reused a dead one's block was erased by its trim"
        );
    }
}
