//! The merge of a leaf's write buffer into its page (decompress → apply → recompress),
//! and the split of a leaf whose objects no longer fit one page.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use super::access::AccessTable;
use super::block::Block;
use super::hot::Heat;
use super::leaf::{
    DramLeaf, LOST, LeafContents, LeafState, MERGE_QUEUED, REFERENCED, RETIRED, WRITTEN, install,
};
use super::packed_page::Table;
use super::page::{PriorPage, Summary, Won};
use super::write_buffer::{WriteBuffer, next_level};
use super::{Bounds, DramTier, LeafId, ScanEntry};
use crate::btree::{cut_into_leaves, split_fences};
use crate::dictionary::Dictionary;
use crate::record::{
    CasBase, Meta, Payload, Record, blob_dictionary, blob_header, decode_blob, encode_blob_with,
};

/// All write buffers together may take up to this fraction (1/n) of the DRAM budget
/// before a full one is given more room.
const GROWN_BUFFERS_SHARE: u64 = 64;

/// Medium objects one page can name: a page record points at its blob by a `u16` slot,
/// so a page with more (a large `leaf_size`, short keys) splits instead.
const MAX_BLOBS_PER_LEAF: usize = u16::MAX as usize + 1;

/// Leaves whose write buffer is full, queued by writers for the background merger.
///
/// A writer does not wake the merger for each leaf: waking another thread costs 35–90 µs
/// on our VMs, more than the merge itself, and a blocking channel made every queued leaf a
/// futex wake-up plus the merger's spinning `sched_yield`s before it slept again (the
/// look-aside run of issue 11: 98 k futex calls and 205 k yields in 16 s). The merger
/// drains the queue at its own pace ([`MergeQueue::wait`]); a writer wakes it early only
/// when [`MERGE_BACKLOG`] leaves wait, and a buffer that overflows meanwhile is merged by
/// its writer (`Pressure::Overflowing`).
pub(crate) struct MergeQueue {
    sender: Sender<LeafId>,
    receiver: Receiver<LeafId>,
    wake: (Mutex<()>, Condvar),
}

/// Queued leaves at which a writer wakes the merger rather than let it sleep its period.
pub(crate) const MERGE_BACKLOG: usize = 64;

impl MergeQueue {
    pub(super) fn new() -> Self {
        let (sender, receiver) = crossbeam_channel::unbounded();
        MergeQueue {
            sender,
            receiver,
            wake: (Mutex::new(()), Condvar::new()),
        }
    }

    pub(super) fn push(&self, id: LeafId) {
        // Cannot fail: the queue holds its own receiver.
        let _ = self.sender.send(id);
        // No syscall unless the merger is asleep in `wait`.
        if self.sender.len() >= MERGE_BACKLOG {
            self.wake.1.notify_all();
        }
    }

    pub(crate) fn pop(&self) -> Option<LeafId> {
        self.receiver.try_recv().ok()
    }

    /// Sleeps up to `period`, or less if a writer finds the backlog full (a wake-up lost
    /// between the check and the sleep costs at most `period`).
    pub(crate) fn wait(&self, period: Duration) {
        let mut asleep = self.wake.0.lock();
        if self.receiver.len() < MERGE_BACKLOG {
            self.wake.1.wait_for(&mut asleep, period);
        }
    }
}

/// An object of a leaf on its way into a rebuilt page, an eviction or a scan.
pub(super) struct Obj<'a> {
    key: &'a [u8],
    body: Body<'a>,
    meta: Meta,
    /// Came from the buffer with a key the page did not have.
    new_key: bool,
    /// The largest CAS version among the older versions of the key this one replaced.
    replaced_cas: u64,
    /// The page sub-page its key hashes to (`PackedLayout::subpage_of`).
    subpage: usize,
}

enum Body<'a> {
    Inline(&'a [u8]),
    /// A medium object whose blob sits in the source leaf's blob table.
    Slot(u16),
    /// A medium object's blob, compressed during this merge.
    Blob(Block),
    Tombstone,
}

impl Obj<'_> {
    pub(super) fn record(&self, slot: u16) -> Record<'_> {
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

    pub(super) fn is_medium(&self) -> bool {
        matches!(self.body, Body::Slot(_) | Body::Blob(_))
    }

    fn is_value(&self) -> bool {
        !matches!(self.body, Body::Tombstone)
    }

    /// The value's length uncompressed (0 for a tombstone or a blob not at hand).
    fn value_len(&self) -> usize {
        match &self.body {
            Body::Inline(v) => v.len(),
            Body::Blob(b) => blob_header(b).map_or(0, |(_, n)| n),
            Body::Slot(_) | Body::Tombstone => 0,
        }
    }
}

/// The dictionaries of a merge: the one its source leaf's blobs name, and the one its
/// new blobs are compressed with (the current one).
#[derive(Clone, Copy)]
pub(super) struct Compression<'d> {
    source: Option<&'d Arc<Dictionary>>,
    target: Option<&'d Arc<Dictionary>>,
}

impl Compression<'_> {
    /// Whether `blob` names a dictionary other than the target: then it is compressed
    /// again, so that a leaf holds one dictionary and old ones can go.
    fn recompresses(&self, blob: &[u8]) -> bool {
        let named = blob_dictionary(blob).is_some_and(|id| id != 0);
        let same = match (self.source, self.target) {
            (Some(s), Some(t)) => Arc::ptr_eq(s, t),
            _ => false,
        };
        named && !same
    }
}

/// Which values a merge lets go besides expired ones: the candidates, less the most
/// read of them (`ReadFrequency::keep`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shed {
    Nothing,
    /// Clean copies of SSD-tier objects (`drop_clean`).
    Clean,
    /// Every value: the leaf is being evicted (`shed_cold`).
    Cold,
}

/// What a merge's `Shed` did: candidates let go, and candidates kept as hot.
pub(super) struct Shedding {
    pub(super) shed: u64,
    pub(super) kept: u64,
}

/// A page record as a merge takes it: a medium one's metadata read from its blob's
/// header (a tombstone if the blob is missing or damaged).
fn page_version<'a>(r: Record<'a>, subpage: usize, blobs: &[Option<Block>]) -> Obj<'a> {
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
    Obj {
        key: r.key,
        body,
        meta,
        new_key: false,
        replaced_cas: 0,
        subpage,
    }
}

/// A buffered record as a merge takes it.
fn buffered_version(r: Record<'_>, subpage: usize) -> Obj<'_> {
    Obj {
        key: r.key,
        // A buffered medium record carries its metadata (a page's does not): its
        // blob's header need not be read.
        body: match r.payload {
            Payload::Inline(v) => Body::Inline(v),
            Payload::Medium(slot) => Body::Slot(slot),
            Payload::Tombstone => Body::Tombstone,
        },
        meta: r.meta,
        new_key: true,
        replaced_cas: 0,
        subpage,
    }
}

/// The newest of each key's `versions` (which lie next to each other, oldest first),
/// knowing whether the key is new and the largest version it replaced; an expired
/// value becomes a tombstone (which hides older copies below). In place: most keys
/// have one version, which stays where it is.
fn newest_versions(mut versions: Vec<Obj<'_>>, now_ms: u64) -> Vec<Obj<'_>> {
    // Versions of one key share a sub-page, compared first: it is at hand, the key is not.
    versions.dedup_by(|next, kept| {
        if next.subpage != kept.subpage || next.key != kept.key {
            return false;
        }
        // The key is new if its oldest version came from the buffer; the newest
        // replaces every version before it.
        let replaced_cas = kept.replaced_cas.max(kept.meta.ordered_cas());
        let new_key = kept.new_key;
        std::mem::swap(kept, next);
        kept.replaced_cas = replaced_cas;
        kept.new_key = new_key;
        true
    });
    for newest in &mut versions {
        if !matches!(newest.body, Body::Tombstone) && newest.meta.expired(now_ms) {
            // An expired value must still hide any older copy below it.
            newest.body = Body::Tombstone;
            newest.replaced_cas = newest.replaced_cas.max(newest.meta.ordered_cas());
            newest.meta = Meta::default();
        }
    }
    versions
}

impl DramTier {
    /// The background merger's entry: merges the buffer of leaf `id` if it still has
    /// one (the slot may hold another leaf by now; merging it does no harm).
    pub fn merge(&self, id: &LeafId, now_ms: u64) {
        let view = self.view();
        let Some(leaf) = view.get(id.0) else { return };
        let mut st = leaf.state.write();
        leaf.set(MERGE_QUEUED, false);
        if !leaf.has(RETIRED) && st.buffer().is_some_and(|b| !b.is_empty()) {
            self.merge_full(leaf, &mut st, now_ms);
        }
    }

    /// The merge of a locked leaf whose buffer is full: its limit adapts first to the
    /// writes and GETs the buffer saw (`write_buffer::next_level`), and the leaves a
    /// split makes start at the same level. Not for a buffer `shrink_idle_buffers`
    /// queued (not written since): it keeps the level that pass gave it.
    ///
    /// Only a leaf with medium objects grows: its buffer holds their pointer records,
    /// a few dozen bytes a write, while its merge passes over hundreds of them. Tiny
    /// values sit in a buffer whole and uncompressed, and a leaf of them merges in a
    /// fraction of the time: growing their buffers took 5–7 MiB more RSS in a 64 MiB fill
    /// of 64-byte values (allocator pages of the buffers' larger size classes), and the
    /// RSS governor took it from the objects. Their buffers hold twice `write_buffer`
    /// from the start instead (`write_buffer::buffer_limit`).
    pub(super) fn merge_full(&self, leaf: &DramLeaf, st: &mut LeafState, now_ms: u64) {
        if leaf.has(WRITTEN)
            && let Some(extras) = &st.extras
        {
            let writes = extras.buffer.records().count();
            let reads = extras.reads.load(Ordering::Relaxed);
            let room = !extras.blobs.is_empty()
                && self.memory.snapshot().write_buffers
                    < (self.settings.dram_capacity / GROWN_BUFFERS_SHARE) as i64;
            leaf.set_buffer_level(next_level(leaf.buffer_level(), writes, reads, room));
        }
        self.merge_locked(leaf, st, now_ms, Shed::Nothing);
    }

    /// Brings the buffers of leaves not written since the last pass back to their first
    /// limit: their level goes to 0, and a buffer holding more than `write_buffer` bytes
    /// is queued for its merge, so that the room write-heavy load gave them is returned
    /// once the writes stop. Run every 100 ms by the housekeeper.
    pub fn shrink_idle_buffers(&self) {
        let view = self.view();
        for id in self.leaves() {
            let Some(leaf) = view.get(id.0) else { continue };
            if leaf.buffer_level() == 0 || leaf.set(WRITTEN, false) {
                continue;
            }
            leaf.set_buffer_level(0);
            let held = leaf.state.read().buffer().map_or(0, WriteBuffer::len);
            if held > self.settings.write_buffer && !leaf.set(MERGE_QUEUED, true) {
                self.merge_queue.push(id);
            }
        }
    }

    /// Decompress → apply the buffer → recompress; when its records no longer fit a page,
    /// the leaf shares with its right neighbour (`share.rs`) or splits. Objects that do
    /// not survive (expired, tombstones with nothing
    /// below, and what `shed` lets go) are dropped here. A merge that lets nothing go
    /// patches the page where that makes the same page (`patch.rs`).
    pub(super) fn merge_locked(
        &self,
        leaf: &DramLeaf,
        st: &mut LeafState,
        now_ms: u64,
        shed: Shed,
    ) -> Shedding {
        if shed == Shed::Nothing && self.merge_by_patching(leaf, st) {
            return Shedding { shed: 0, kept: 0 };
        }
        self.merge_whole(leaf, st, now_ms, shed)
    }

    /// `merge_locked`, every object of the leaf gathered and its page rebuilt.
    pub(super) fn merge_whole(
        &self,
        leaf: &DramLeaf,
        st: &mut LeafState,
        now_ms: u64,
        shed: Shed,
    ) -> Shedding {
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        let before = self.charge_of(leaf, st);
        // Declared before the objects that borrow from them (a neighbour's too).
        let view;
        let mut given = None;
        let mut extras = st.extras.take().unwrap_or_default();
        let buffer = extras.buffer.take();
        let mut old_blobs = std::mem::take(&mut extras.blobs);
        let old_dictionary = extras.dictionary.take();
        let page_dictionary = extras.page_dictionary.take();
        let access_table = extras.access_table.take();
        drop(extras);
        self.offer_tiny(&buffer);
        let dictionary = self.current_dictionary();
        let old_page = st.page.take();
        let decoded = self.decode_with_table(leaf, old_page.as_deref(), page_dictionary.as_deref());
        let page = decoded.as_ref().map(|(table, body)| (table, &body[..]));
        let won = match &page_dictionary {
            Some(dictionary) => Won::Dictionary(dictionary.version()),
            None => Won::Lz4(leaf.lz4_beat.load(Ordering::Relaxed)),
        };
        let prior = old_page
            .as_deref()
            .zip(decoded.as_ref())
            .filter(|_| !leaf.raw_page())
            .map(|(stored, (table, body))| PriorPage {
                won,
                stored: stored.len(),
                packed: table.len() + body.len(),
            });
        // A merge that lets nothing go takes the objects in page order, which a page that
        // does not split keeps; one that sheds passes them to `ReadFrequency::keep` and
        // the eviction listener in key order.
        let gathered = match shed {
            Shed::Nothing => self.gather_in_page_order(page, &buffer, &old_blobs, now_ms),
            Shed::Clean | Shed::Cold => None,
        }
        .unwrap_or_else(|| {
            let page = page.map(|(table, body)| (table.cas_base(), body));
            self.gather(page, &buffer, &old_blobs, now_ms)
        });
        let (mut objs, shedding) = self.survivors(
            gathered,
            &mut old_blobs,
            Compression {
                source: old_dictionary.as_ref(),
                target: dictionary.as_ref(),
            },
            shed,
            now_ms,
        );
        let fits = self.fits(&objs);
        if !fits {
            // Splits and shares cut the leaf's key range.
            objs.sort_unstable_by(|a, b| a.key.cmp(b.key));
        }
        // A full leaf shares with its right neighbour before it splits (`share`).
        let mut neighbour = None;
        if !fits && shed == Shed::Nothing && !leaf.lost() && self.splits_at_random(&objs) {
            view = self.view();
            neighbour = self.lock_right_neighbour(&view, leaf, objs[0].key);
        }
        if let Some(n) = &mut neighbour {
            given = self.take_neighbour(n);
        }
        let chunks = match (&mut given, neighbour) {
            (Some(given), Some(n)) => {
                let page = given.body.as_deref().map(|body| (given.cas_base, body));
                let theirs = self.gather(page, &given.buffer, &given.blobs, now_ms);
                let compression = Compression {
                    source: given.dictionary.as_ref(),
                    target: dictionary.as_ref(),
                };
                let (theirs, _) =
                    self.survivors(theirs, &mut given.blobs, compression, Shed::Nothing, now_ms);
                objs.extend(theirs);
                self.retire_neighbour(n);
                self.share(&objs)
            }
            _ if fits => vec![(0, objs.len())],
            _ => self.partition(&objs),
        };
        let heat = leaf.heat();
        let fences = split_fences(&objs, &chunks, |o| o.key);
        let mut objs_iter = objs.into_iter();
        let mut contents = Vec::with_capacity(chunks.len());
        for (i, &(start, end)) in chunks.iter().enumerate() {
            let chunk: Vec<Obj> = objs_iter.by_ref().take(end - start).collect();
            contents.push(self.build(
                chunk,
                if i == 0 { heat } else { Heat::Cool },
                access_table.as_deref(),
                dictionary.as_ref(),
                prior,
            ));
        }
        drop(buffer);
        let mut contents = contents.into_iter();
        if let Some(first) = contents.next() {
            install(leaf, st, first);
        }
        self.memory.change(&before, &self.charge_of(leaf, st));
        let access = leaf.access.load(Ordering::Relaxed);
        let lost = leaf.lost();
        let level = leaf.buffer_level();
        let splits = fences.len() as u64;
        // New leaves start compressed: a hot leaf that splits on every few sequential
        // inserts would otherwise fill DRAM with uncompressed pages between two bypass
        // passes. The next pass promotes whichever half stays hot.
        let new_leaves = fences
            .into_iter()
            .zip(contents)
            .map(|(fence, c)| (fence, self.new_leaf(access / 2, lost, level, c)));
        self.memory
            .change_index(self.tree.split_and_publish(new_leaves));
        self.counters.splits.fetch_add(splits, Ordering::Relaxed);
        shedding
    }

    /// The objects of a merge that stay: medium objects' blobs taken from `old_blobs`
    /// (compressed again with the current dictionary if they name another), new medium
    /// values compressed (and offered to the dictionaries' reservoir), less what `shed`
    /// lets go and tombstones with nothing below to hide. Raises the CAS floor over the
    /// versions that leave.
    fn survivors<'a>(
        &self,
        mut objs: Vec<Obj<'a>>,
        old_blobs: &mut [Option<Block>],
        compression: Compression<'_>,
        shed: Shed,
        now_ms: u64,
    ) -> (Vec<Obj<'a>>, Shedding) {
        let keep_tombstones = self.settings.keep_tombstones;
        let target = compression.target.map(|d| &**d);
        for obj in &mut objs {
            match obj.body {
                Body::Slot(slot) => match old_blobs.get_mut(slot as usize).and_then(Option::take) {
                    Some(blob) if compression.recompresses(&blob) => {
                        let source = compression.source.map(|d| &**d);
                        obj.body = match decode_blob(&blob, source) {
                            Some((value, meta)) => {
                                Body::Blob(encode_blob_with(&value, &meta, target, Block::new))
                            }
                            None => {
                                self.counters.corrupt_pages.fetch_add(1, Ordering::Relaxed);
                                Body::Tombstone
                            }
                        };
                    }
                    Some(blob) => obj.body = Body::Blob(blob),
                    None => obj.body = Body::Tombstone,
                },
                // Buffered as it came: the leaf's blob table was full when it was written.
                Body::Inline(v) if self.is_medium(obj.key, v) => {
                    obj.body = Body::Blob(self.blob_of(v, &obj.meta, target));
                }
                _ => {}
            }
        }
        let (shedding, kept) = self.shedding(&objs, shed);
        // Cold values shed are forgotten (no tier below): evictions, if anyone listens.
        let listener = (shed == Shed::Cold).then(|| self.eviction_listener());
        if let Some(listener) = listener.flatten() {
            for (o, _) in objs.iter().zip(&shedding).filter(|(_, shed)| **shed) {
                listener.evicted(o.key, o.value_len(), o.meta.expires_at_ms, now_ms);
            }
        }
        // A tombstone with nothing below to hide (the blob of one that went missing above
        // must still hide an older SSD copy, so only without a lower tier).
        let dropped =
            |o: &Obj, shed: bool| shed || (!keep_tombstones && matches!(o.body, Body::Tombstone));
        // Versions that leave with this merge: dropped objects, tombstones (a blob that
        // went missing above, from corruption, is one too) and what a value without a
        // version replaced. A surviving version stays in the leaf, above what it replaced.
        let gone = objs
            .iter()
            .zip(&shedding)
            .map(|(o, &shed)| match o.body {
                Body::Tombstone => o.meta.ordered_cas().max(o.replaced_cas),
                _ if dropped(o, shed) => o.meta.ordered_cas().max(o.replaced_cas),
                _ if o.meta.ordered_cas() == 0 => o.replaced_cas,
                _ => 0,
            })
            .max();
        self.raise_cas_floor(gone.unwrap_or(0));
        let let_go = shedding.iter().filter(|&&shed| shed).count() as u64;
        let objs = objs
            .into_iter()
            .zip(shedding)
            .filter(|(o, shed)| !dropped(o, *shed))
            .map(|(o, _)| o)
            .collect();
        (objs, Shedding { shed: let_go, kept })
    }

    /// Which of a merge's objects `shed` lets go, and how many candidates it kept: a
    /// candidate is a value (never a tombstone, which may hide an older copy below),
    /// clean for `Shed::Clean`; the most read stay.
    fn shedding(&self, objs: &[Obj], shed: Shed) -> (Vec<bool>, u64) {
        let candidate = |o: &Obj| match shed {
            Shed::Nothing => false,
            Shed::Clean => o.is_value() && o.meta.clean,
            Shed::Cold => o.is_value(),
        };
        let candidates: Vec<(&[u8], usize)> = objs
            .iter()
            .filter(|o| candidate(o))
            .map(|o| (o.key, o.key.len() + o.value_len()))
            .collect();
        if candidates.is_empty() {
            return (vec![false; objs.len()], 0);
        }
        let keep = self.reads.keep(&candidates);
        let kept = keep.iter().filter(|&&k| k).count() as u64;
        let mut keep = keep.into_iter();
        let shedding = objs
            .iter()
            .map(|o| candidate(o) && !keep.next().expect("one verdict per candidate"))
            .collect();
        (shedding, kept)
    }

    /// Offers the tiny objects of a buffer about to be merged to the page dictionaries'
    /// reservoir, as records the way a page holds them (the CAS as its own base: a
    /// one-byte delta, as close versions in a page take).
    pub(super) fn offer_tiny(&self, buffer: &WriteBuffer) {
        let Some(dictionaries) = &self.dictionaries else {
            return;
        };
        let tiny_max = self.settings.tiny_max;
        let tiny = buffer.records().filter(
            |r| matches!(r.payload, Payload::Inline(v) if r.key.len() + v.len() < tiny_max),
        );
        dictionaries
            .pages
            .offer_each(tiny, |r, sample| r.encode_in(sample, CasBase(r.meta.cas)));
    }

    /// Whether `key` and `value` make a medium object (its value in a blob of its own).
    pub(super) fn is_medium(&self, key: &[u8], value: &[u8]) -> bool {
        key.len() + value.len() >= self.settings.tiny_max
    }

    /// A medium value's blob, compressed with `dictionary` where that wins; the value
    /// joins the sample that dictionaries are trained on.
    pub(super) fn blob_of(
        &self,
        value: &[u8],
        meta: &Meta,
        dictionary: Option<&Dictionary>,
    ) -> Block {
        if let Some(dictionaries) = &self.dictionaries {
            dictionaries.blobs.offer(value);
        }
        encode_blob_with(value, meta, dictionary, Block::new)
    }

    /// A leaf for `contents`, in a free slot, charged; not in the tree yet.
    fn new_leaf(&self, access: u32, lost: bool, level: u8, contents: LeafContents) -> LeafId {
        let (slot, grown) = self.leaves.allocate();
        self.memory.change_index(grown);
        let view = self.view();
        let leaf = view
            .get(slot)
            .expect("a slot just handed out is in the table");
        let mut st = leaf.state.write();
        leaf.access.store(access, Ordering::Relaxed);
        leaf.set_buffer_level(level);
        leaf.flags.store(
            if lost { LOST | REFERENCED } else { REFERENCED },
            Ordering::Release,
        );
        let before = self.charge_of(leaf, &st);
        install(leaf, &mut st, contents);
        self.memory.change(&before, &self.charge_of(leaf, &st));
        LeafId(slot)
    }

    /// Whether `objs` fit one page.
    fn fits(&self, objs: &[Obj]) -> bool {
        objs.iter().filter(|o| o.is_medium()).count() <= MAX_BLOBS_PER_LEAF
            && self.layout.fits(objs.iter().map(|o| o.record(0)))
    }

    /// Where sequential inserts cut `objs[start..end]`: all buffered keys beyond the
    /// page's keys cut right before the new keys (as many more as still fit stay left),
    /// so the left leaf stays as full as hashing allows instead of half empty forever.
    /// `None` if the chunk's last keys are not new, or the old ones alone do not fit.
    fn sequential_cut(&self, objs: &[Obj], start: usize, end: usize) -> Option<usize> {
        let appended = objs[start..end]
            .iter()
            .rev()
            .take_while(|o| o.new_key)
            .count();
        let mut cut = end - appended;
        if cut > start && cut < end && self.fits(&objs[start..cut]) {
            while cut + 1 < end && self.fits(&objs[start..=cut]) {
                cut += 1;
            }
            Some(cut)
        } else {
            None
        }
    }

    /// Whether `objs` overflow a page with keys that did not arrive in order: the merge
    /// then shares with the right neighbour instead of cutting at the median.
    fn splits_at_random(&self, objs: &[Obj]) -> bool {
        !self.fits(objs) && self.sequential_cut(objs, 0, objs.len()).is_none()
    }

    /// Chooses where to cut sorted objects into pages that fit: at the sequential cut,
    /// else at the median.
    pub(super) fn partition(&self, objs: &[Obj]) -> Vec<(usize, usize)> {
        let cut = |start, end| {
            self.sequential_cut(objs, start, end)
                .unwrap_or((start + end) / 2)
        };
        cut_into_leaves(objs.len(), |start, end| self.fits(&objs[start..end]), cut)
    }

    /// Page, blobs and access state (from `access_table`, the merged leaf's) for one
    /// leaf's worth of objects, kept as `heat` says; `dictionary` is the one its blobs
    /// that name one were compressed with (`survivors` sees to it); `prior` the merged
    /// leaf's page, if it was compressed with a page dictionary (`DramTier::page`).
    fn build(
        &self,
        objs: Vec<Obj>,
        heat: Heat,
        access_table: Option<&AccessTable>,
        dictionary: Option<&Arc<Dictionary>>,
        prior: Option<PriorPage>,
    ) -> LeafContents {
        let mut slots = 0usize;
        let mut records: Vec<(usize, Record)> = objs
            .iter()
            .map(|o| {
                // `partition` keeps a page within `MAX_BLOBS_PER_LEAF` medium objects.
                let slot = u16::try_from(slots).expect("blob slots fit a u16");
                if o.is_medium() {
                    slots += 1;
                }
                (o.subpage, o.record(slot))
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
        summary.cas_top_above_base =
            cas_top.wrapping_sub(CasBase::of(records.iter().map(|(_, r)| r)).0);
        // `partition` only hands over chunks that fit (a single record always does:
        // `Config::validate` sees to it).
        let (page, page_dictionary, lz4_beat) = if records.is_empty() {
            (None, None, 0)
        } else {
            self.layout
                .build(&mut records)
                .map_or((None, None, 0), |packed| {
                    let (page, dictionary, lz4_beat) =
                        self.page(summary, &packed, heat != Heat::Cool, prior);
                    (Some(page), dictionary, lz4_beat)
                })
        };
        drop(records);
        let access_table = access_table.and_then(|table| {
            let values = objs.iter().filter(|o| !matches!(o.body, Body::Tombstone));
            table.carried(values.map(|o| o.key))
        });
        // Pushed one by one: `collect` would reuse the far larger `objs` allocation.
        let mut blobs = thin_vec::ThinVec::new();
        let mut named = false;
        let raw_blobs = heat == Heat::HotBlobs;
        for o in objs {
            if let Body::Blob(b) = o.body {
                // may compress: a blob stored as is for heat that leaves a hot leaf (and
                // decompress: one that joins a leaf keeping its blobs as is), `hot.rs`
                let b = self.blob_for_heat(&b, raw_blobs, dictionary).unwrap_or(b);
                named |= blob_dictionary(&b).is_some_and(|id| id != 0);
                blobs.push(Some(b));
            }
        }
        blobs.shrink_to_fit();
        LeafContents {
            page,
            lz4_beat,
            raw: heat != Heat::Cool,
            blobs,
            dictionary: dictionary.filter(|_| named).cloned(),
            page_dictionary,
            access_table,
        }
    }

    /// The newest version of every key in a page and buffer, in key order.
    /// Expired values come back as tombstones (which hide older copies below).
    fn gather<'a>(
        &self,
        page: Option<(CasBase, &'a [u8])>,
        buffer: &'a WriteBuffer,
        blobs: &[Option<Block>],
        now_ms: u64,
    ) -> Vec<Obj<'a>> {
        let (cas_base, body) = page.unwrap_or_default();
        let from_page = self
            .layout
            .all(cas_base, body)
            .map(|r| page_version(r, self.layout.subpage_of(r.key), blobs));
        let from_buffer = buffer
            .records()
            .map(|r| buffered_version(r, self.layout.subpage_of(r.key)));
        let mut versions: Vec<Obj<'a>> = from_page.chain(from_buffer).collect();
        // Stable, so a key's versions stay oldest first: the page's, then the buffer's in
        // the order written. (Inserting them into a `BTreeMap` one by one took 5 % of the
        // server's CPU in a JSON fill.)
        versions.sort_by(|a, b| a.key.cmp(b.key));
        newest_versions(versions, now_ms)
    }

    /// `gather` in page order (by sub-page, then key, as `build` stores them), without
    /// sorting the page: its sub-pages hold their keys in order, so the few buffered
    /// versions, sorted alone, are merged in as the page is walked (sorting every version
    /// by key was a fifth of the merger's CPU in a SET load of 64-byte values). `None` if
    /// a sub-page that a buffered key hashes to is out of order (never built so; then
    /// `gather` sorts).
    fn gather_in_page_order<'a>(
        &self,
        page: Option<(&Table<'_>, &'a [u8])>,
        buffer: &'a WriteBuffer,
        blobs: &[Option<Block>],
        now_ms: u64,
    ) -> Option<Vec<Obj<'a>>> {
        let in_page_order =
            |a: &Obj, b: &Obj| a.subpage.cmp(&b.subpage).then_with(|| a.key.cmp(b.key));
        let mut buffered: Vec<Obj<'a>> = buffer
            .records()
            .map(|r| buffered_version(r, self.layout.subpage_of(r.key)))
            .collect();
        // Stable: a key's buffered versions stay in the order written.
        buffered.sort_by(in_page_order);
        let placed = page.into_iter().flat_map(|(table, body)| {
            self.layout
                .placed(table, body)
                .map(|(subpage, r)| page_version(r, subpage, blobs))
        });
        let mut versions = Vec::with_capacity(buffered.len() + 64);
        let mut buffered = buffered.into_iter().peekable();
        let mut last: Option<(usize, &[u8])> = None;
        let mut last_buffered = None;
        for version in placed {
            while let Some(b) = buffered.next_if(|b| in_page_order(b, &version).is_lt()) {
                last_buffered = Some(b.subpage);
                versions.push(b);
            }
            // In a sub-page with buffered keys, the page's order is what lets a key's
            // versions meet: checked there.
            let touched = last_buffered == Some(version.subpage)
                || buffered
                    .peek()
                    .is_some_and(|b| b.subpage == version.subpage);
            let in_order =
                last.is_none_or(|(subpage, key)| subpage != version.subpage || key < version.key);
            if touched && !in_order {
                return None;
            }
            last = Some((version.subpage, version.key));
            versions.push(version);
        }
        versions.extend(buffered);
        Some(newest_versions(versions, now_ms))
    }

    /// A locked leaf's objects (tombstones aside) and how many of them have expired by
    /// `now_ms`: what a merge of it would drop.
    pub(super) fn census(&self, leaf: &DramLeaf, st: &LeafState, now_ms: u64) -> (u64, u64) {
        let decoded = self.decode(leaf, st.page.as_deref(), st.page_dictionary());
        let page = decoded.as_ref().map(|(base, body)| (*base, &body[..]));
        let empty = WriteBuffer::default();
        let buffer = st.buffer().unwrap_or(&empty);
        // At time 0 nothing has expired yet, so every stored object is gathered.
        let objs = self.gather(page, buffer, st.blobs(), 0);
        let stored = objs.iter().filter(|o| !matches!(o.body, Body::Tombstone));
        stored.fold((0, 0), |(objects, expired), o| {
            (objects + 1, expired + u64::from(o.meta.expired(now_ms)))
        })
    }

    /// A locked leaf's entries in key order, restricted to `range` if given.
    pub(super) fn entries(
        &self,
        leaf: &DramLeaf,
        st: &LeafState,
        now_ms: u64,
        range: Option<Bounds<'_>>,
    ) -> Vec<ScanEntry> {
        let decoded = self.decode(leaf, st.page.as_deref(), st.page_dictionary());
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
                        .and_then(|blob| decode_blob(blob, st.dictionary()))
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

    /// Merges every buffered write into its page (before a clean shutdown).
    pub fn merge_all(&self, now_ms: u64) {
        for id in self.leaves() {
            self.merge(&id, now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::dram::write_buffer::TINY_LEAF_BUFFERS;

    /// A merge's view of a leaf: the newest version of each key, in key order, knowing
    /// whether the page had the key and the largest version it replaced (which the CAS
    /// floor must pass when it leaves); an expired value is a tombstone above its own
    /// version.
    #[test]
    fn gather_keeps_each_keys_newest_version_and_what_it_replaced() {
        let (dram, _) = tier_with(settings(4096));
        let put = |key: &[u8], value: Option<&[u8]>, cas: u64, expires_at_ms: Option<u64>| {
            let meta = Meta {
                cas,
                expires_at_ms,
                ..Meta::default()
            };
            dram.put_with(key, value, meta, None, 0, |_| ());
        };
        put(b"d", Some(b"4"), 4, None);
        put(b"b", Some(b"5"), 5, None);
        put(b"a", Some(b"3"), 3, None);
        dram.merge_all(0);
        put(b"c", Some(b"9"), 9, None);
        put(b"a", Some(b"unversioned"), 0, None);
        put(b"c", Some(b"10"), 10, None);
        dram.delete(b"b", 0, |_| ());
        put(b"e", Some(b"11"), 11, Some(50));
        let gathered = dram.read_leaf(b"a", |leaf, st| {
            let decoded = dram.decode(leaf, st.page.as_deref(), st.page_dictionary());
            let page = decoded.as_ref().map(|(base, body)| (*base, &body[..]));
            let objs = dram.gather(page, st.buffer().expect("buffered"), st.blobs(), 100);
            objs.iter()
                .map(|o| {
                    let value = match o.body {
                        Body::Inline(v) => Some(v.to_vec()),
                        _ => None,
                    };
                    (o.key.to_vec(), value, o.new_key, o.replaced_cas)
                })
                .collect::<Vec<_>>()
        });
        let expected = [
            (&b"a"[..], Some(&b"unversioned"[..]), false, 3),
            (b"b", None, false, 5),
            (b"c", Some(b"10"), true, 9),
            (b"d", Some(b"4"), false, 0),
            (b"e", None, true, 11),
        ]
        .map(|(k, v, new_key, replaced)| (k.to_vec(), v.map(<[u8]>::to_vec), new_key, replaced));
        assert_eq!(gathered, expected);
    }

    /// A gathered object as the tests compare them.
    type Seen = (Vec<u8>, Option<Vec<u8>>, Meta, bool, u64);

    fn seen(objs: &[Obj]) -> Vec<Seen> {
        objs.iter()
            .map(|o| {
                let value = match o.body {
                    Body::Inline(v) => Some(v.to_vec()),
                    _ => None,
                };
                (o.key.to_vec(), value, o.meta, o.new_key, o.replaced_cas)
            })
            .collect()
    }

    /// A leaf's objects gathered both ways: in page order, and by key.
    fn both_gathers(dram: &DramTier, key: &[u8], now_ms: u64) -> (Option<Vec<Seen>>, Vec<Seen>) {
        dram.read_leaf(key, |leaf, st| {
            let empty = WriteBuffer::default();
            let buffer = st.buffer().unwrap_or(&empty);
            let decoded = dram.decode_with_table(leaf, st.page.as_deref(), st.page_dictionary());
            let page = decoded.as_ref().map(|(table, body)| (table, &body[..]));
            let in_page_order = dram
                .gather_in_page_order(page, buffer, st.blobs(), now_ms)
                .map(|objs| {
                    let subpages: Vec<usize> = objs.iter().map(|o| o.subpage).collect();
                    assert!(subpages.is_sorted(), "{subpages:?}");
                    for o in &objs {
                        assert_eq!(o.subpage, dram.layout.subpage_of(o.key));
                    }
                    let mut seen = seen(&objs);
                    seen.sort_by(|a, b| a.0.cmp(&b.0));
                    seen
                });
            let page = decoded
                .as_ref()
                .map(|(table, body)| (table.cas_base(), &body[..]));
            let by_key = seen(&dram.gather(page, buffer, st.blobs(), now_ms));
            (in_page_order, by_key)
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Walking the page in its order and merging the buffered versions in finds the
        /// same newest versions (what they replaced, expiry, new keys) as sorting them all.
        #[test]
        fn gathering_in_page_order_finds_what_sorting_finds(
            merged in proptest::collection::vec((0u32..60, 0u64..4), 0..40),
            buffered in proptest::collection::vec((0u32..60, 0u8..4, 0u64..4), 0..12),
        ) {
            let (dram, _) = tier_with(settings(1 << 16));
            let mut cas = 1u64;
            let mut put = |i: u32, value: Option<u64>, expires_at_ms: Option<u64>| {
                cas += 1;
                let meta = Meta { cas, expires_at_ms, ..Meta::default() };
                let value = value.map(|v| format!("value {v}").into_bytes());
                match value {
                    Some(v) => dram.put_with(&key(i), Some(&v), meta, None, 0, |_| ()),
                    None => {
                        dram.delete(&key(i), 0, |_| ());
                    }
                }
            };
            for &(i, v) in &merged {
                put(i, Some(v), None);
            }
            dram.merge_all(0);
            for &(i, kind, v) in &buffered {
                match kind {
                    0 => put(i, None, None),
                    1 => put(i, Some(v), Some(50)),
                    _ => put(i, Some(v), None),
                }
            }
            let (in_page_order, by_key) = both_gathers(&dram, &key(0), 100);
            proptest::prop_assert_eq!(in_page_order, Some(by_key));
        }
    }

    /// A page whose sub-page does not hold its keys in order (never built so) cannot
    /// be merged by walking it where a buffered key lands: the merge sorts instead, and
    /// the buffered version still replaces the page's.
    #[test]
    fn a_sub_page_out_of_order_is_gathered_by_sorting() {
        let (dram, _) = tier_with(settings(1 << 16));
        let keys: Vec<Vec<u8>> = (0..200).map(key).collect();
        let subpage = |k: &Vec<u8>| dram.layout.subpage_of(k);
        let (a, b) = keys
            .iter()
            .enumerate()
            .find_map(|(i, a)| {
                keys[i + 1..]
                    .iter()
                    .find(|b| subpage(b) == subpage(a))
                    .map(|b| (a, b))
            })
            .expect("two keys of one sub-page");
        let records = [b, a].map(|k| Record {
            key: k,
            payload: Payload::Inline(b"old"),
            meta: Meta::default(),
        });
        let mut placed = records.map(|r| (subpage(a), r));
        let packed = dram.layout.build(&mut placed).expect("fits");
        dram.write_leaf(a, |_, _, st| {
            st.page = Some(dram.page(Summary::default(), &packed, false, None).0);
        });
        dram.put_with(a, Some(b"new"), Meta::default(), None, 0, |_| ());
        let (in_page_order, by_key) = both_gathers(&dram, a, 0);
        assert_eq!(in_page_order, None);
        let values: Vec<_> = by_key.iter().map(|s| (s.0.clone(), s.1.clone())).collect();
        assert_eq!(
            values,
            [
                (a.clone(), Some(b"new".to_vec())),
                (b.clone(), Some(b"old".to_vec()))
            ]
        );
        dram.merge_all(0);
        assert!(
            matches!(dram.get(a, 0, true), super::super::Lookup::Found(v, _, _) if v == b"new")
        );
        assert!(
            matches!(dram.get(b, 0, true), super::super::Lookup::Found(v, _, _) if v == b"old")
        );
    }

    /// Write buffers at rest after a fill: only leaves written since their last merge
    /// hold one, no more than its first limit (`buffer_limit`: twice `write_buffer` for a
    /// leaf of tiny values, as here) once the housekeeper found them idle, and it is gone
    /// once merged. These values compress to a few bytes, so that is up to ~4 bytes an
    /// object (~0.6 in a fill of 64-byte values half zeros).
    #[test]
    fn write_buffers_at_rest_take_under_five_bytes_an_object() {
        let (dram, memory) = tier_with(settings(256));
        for i in 0..40_000u32 {
            let key = format!("{:016}", i.wrapping_mul(2_654_435_761) % 1_000_000).into_bytes();
            dram.put_with(&key, Some(&[i as u8; 64]), Meta::default(), None, 0, |_| ());
        }
        // The housekeeper's passes once the writes stop: the first finds every leaf
        // written, the second finds them idle and takes back the room they grew.
        for _ in 0..2 {
            dram.shrink_idle_buffers();
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
        assert!(at_rest <= 5.0, "{at_rest} buffer bytes per object");
        // No buffer past its limit and one record.
        let limit = TINY_LEAF_BUFFERS * 256 + 128;
        let most = dram.leaves().into_iter().map(|id| {
            let view = dram.view();
            let leaf = view.get(id.0).unwrap();
            leaf.state.read().buffer().map_or(0, WriteBuffer::len)
        });
        assert!(most.max().unwrap_or(0) <= limit);
        dram.merge_all(0);
        assert_eq!(memory.snapshot().write_buffers, 0);
        assert_eq!(dram.tally(0).objects, objects);
    }
}

#[cfg(test)]
mod merge_queue_tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{MERGE_BACKLOG, MergeQueue};
    use crate::dram::LeafId;

    #[test]
    fn leaves_come_out_in_the_order_they_were_queued() {
        let queue = MergeQueue::new();
        assert_eq!(queue.pop(), None);
        for id in [7, 3, 9] {
            queue.push(LeafId(id));
        }
        let popped: Vec<_> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(popped, [LeafId(7), LeafId(3), LeafId(9)]);
    }

    #[test]
    fn a_full_backlog_wakes_a_sleeping_merger() {
        let queue = Arc::new(MergeQueue::new());
        let merger = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                // A day: only a writer's wake-up ends this wait within the test.
                queue.wait(Duration::from_secs(86_400));
                start.elapsed()
            })
        };
        // Keep queueing until the merger is asleep and hears it (a push that comes before
        // it sleeps is not lost: `wait` sees the backlog and returns at once).
        let mut id = 0;
        while !merger.is_finished() && id < 10_000 {
            queue.push(LeafId(id));
            id += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(merger.is_finished(), "no push woke the merger");
        let slept = merger.join().expect("merger");
        assert!(slept < Duration::from_secs(86_400));
        assert!(
            id as usize >= MERGE_BACKLOG,
            "woken before the backlog was full: {id}"
        );
    }
}
