//! A DRAM leaf: its 40-byte descriptor (`DramLeaf`) in the tier's table of slots, the
//! state its lock guards (page, write buffer, medium blobs, objects' access state), its
//! flags, and what its state is charged to the DRAM budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU32, Ordering};

use parking_lot::RwLock;
use thin_vec::ThinVec;

use super::DramTier;
use super::access::AccessTable;
use super::block::Block;
use super::write_buffer::{Newest, WriteBuffer};
use crate::btree::Lockable;
use crate::dictionary::Dictionary;
use crate::dictionary::page::PageDictionary;
use crate::memory::{Charge, alloc_size};
use crate::record::Record;

/// What the blobs themselves take (not their table).
pub(super) fn blob_bytes<'a>(blobs: impl IntoIterator<Item = &'a Block>) -> usize {
    blobs.into_iter().map(|b| alloc_size(b.len())).sum()
}

/// What a leaf's blob table takes: nothing while it has no capacity (an empty `ThinVec`
/// points to a shared header), else its header (length and capacity) and its slots.
fn blob_table_bytes(blobs: &ThinVec<Option<Block>>) -> usize {
    match blobs.capacity() {
        0 => 0,
        capacity => alloc_size(2 * size_of::<usize>() + capacity * size_of::<Option<Block>>()),
    }
}

/// What a leaf holds besides its page while it has any of it: the write buffer, the
/// medium objects' blobs, the dictionary its page was compressed with and, with
/// `track_access`, its objects' access state. Boxed, and absent for most leaves (no
/// medium objects, no write since the last merge, a page without a dictionary, no
/// tracking).
#[derive(Default)]
pub(super) struct Extras {
    pub(super) buffer: WriteBuffer,
    /// How the buffer changes the number of live objects (+1 for each new key, -1 for
    /// each deletion of a live one), worked out when `stats` asks rather than on every
    /// write (it takes a page lookup); `UNKNOWN` after each append.
    pub(super) buffered: AtomicI32,
    /// GETs that looked through the buffer since the last merge (`next_level`).
    pub(super) reads: AtomicU32,
    /// Medium objects' blobs, by the slot their record names: the page's first, then
    /// those of the buffered writes, compressed as they were written (`add_blob`). A
    /// buffered blob that a newer write of its key replaced is freed at once (`None`).
    /// A `ThinVec` (one pointer, its length and capacity on the heap): the box stays within
    /// its 80-byte chunk with both dictionaries' pointers.
    pub(super) blobs: ThinVec<Option<Block>>,
    /// The dictionary of those blobs that name one (a merge compresses them all with the
    /// current one, so there is at most one a leaf).
    pub(super) dictionary: Option<Arc<Dictionary>>,
    /// The dictionary the page's body was compressed with, the one its summary names
    /// (`page.rs`); a page chooses one only where it saves more than this box costs.
    pub(super) page_dictionary: Option<Arc<PageDictionary>>,
    /// Boxed again, so that a leaf without it pays one pointer.
    pub(super) access_table: Option<Box<AccessTable>>,
}

impl Extras {
    /// Counts a GET that looks through the buffer. A plain load and store, as in
    /// `DramLeaf::touch`: GETs hold the lock shared, and a lost count does not matter.
    pub(super) fn count_read(&self) {
        let reads = self.reads.load(Ordering::Relaxed);
        self.reads.store(reads.saturating_add(1), Ordering::Relaxed);
    }

    /// Makes way for a write of `record`: frees the blob of its key's newest buffered
    /// version if it is a medium one — the write about to replace it leaves nothing that
    /// reads it (its record keeps the metadata a merge needs), so overwrites between two
    /// merges hold no dead blobs — and, if that version is the buffer's last record, takes
    /// it out with its blob's slot when that is the table's last (a pipeline's SET and
    /// then EXPIRE of one key leave one record and one slot, not two).
    /// Returns the bytes freed (`blob_bytes`).
    pub(super) fn make_way(&mut self, record: &Record<'_>) -> usize {
        // Without blobs no buffered record points at one: the buffer need not be read
        // here (`WriteBuffer::append` takes back a last record of an inline value).
        if self.blobs.is_empty() {
            return 0;
        }
        let (slot, taken_back) = match self.buffer.take_back_last(record) {
            Some(Newest::TakenBack(Some(slot))) => (slot, true),
            Some(Newest::Kept(Some(slot))) => (slot, false),
            _ => return 0,
        };
        let at = usize::from(slot);
        let freed = self
            .blobs
            .get_mut(at)
            .map_or(0, |blob| blob_bytes(blob.take().as_ref()));
        if taken_back && at + 1 == self.blobs.len() {
            self.blobs.pop();
        }
        freed
    }

    /// The slot the next blob will take; `None` once a record could not name it.
    pub(super) fn next_blob_slot(&self) -> Option<u16> {
        u16::try_from(self.blobs.len()).ok()
    }

    /// Takes in a buffered write's blob at `next_blob_slot`.
    pub(super) fn push_blob(&mut self, blob: Block) {
        if self.blobs.len() == self.blobs.capacity() {
            // By an eighth, not doubled: the table is charged by its capacity, and most
            // leaves take a few blobs between two merges.
            self.blobs.reserve_exact((self.blobs.len() / 8).max(4));
        }
        self.blobs.push(Some(blob));
    }
}

#[derive(Default)]
pub(super) struct LeafState {
    pub(super) page: Option<Block>,
    pub(super) extras: Option<Box<Extras>>,
}

impl LeafState {
    pub(super) fn buffer(&self) -> Option<&WriteBuffer> {
        self.extras.as_ref().map(|e| &e.buffer)
    }

    pub(super) fn blobs(&self) -> &[Option<Block>] {
        self.extras.as_ref().map_or(&[], |e| &e.blobs)
    }

    /// Whether a buffered write may take one more blob (`Extras::next_blob_slot`).
    pub(super) fn blob_slot_free(&self) -> bool {
        self.extras
            .as_ref()
            .is_none_or(|e| e.next_blob_slot().is_some())
    }

    pub(super) fn dictionary(&self) -> Option<&Dictionary> {
        self.extras.as_ref()?.dictionary.as_deref()
    }

    pub(super) fn page_dictionary(&self) -> Option<&PageDictionary> {
        self.extras.as_ref()?.page_dictionary.as_deref()
    }

    pub(super) fn access_table(&self) -> Option<&AccessTable> {
        self.extras.as_ref()?.access_table.as_deref()
    }

    /// Replaces the page, with the dictionary its body was compressed with.
    pub(super) fn set_page(
        &mut self,
        page: Option<Block>,
        dictionary: Option<Arc<PageDictionary>>,
    ) {
        self.page = page;
        if dictionary.is_some() {
            self.extras.get_or_insert_default().page_dictionary = dictionary;
        } else if let Some(extras) = &mut self.extras {
            extras.page_dictionary = None;
        }
    }

    /// Drops the box of extras once it holds nothing.
    pub(super) fn tidy(&mut self) {
        if let Some(extras) = &mut self.extras {
            if extras.access_table.as_ref().is_some_and(|t| t.is_empty()) {
                extras.access_table = None;
            }
            if extras.blobs.is_empty() {
                extras.dictionary = None;
            }
            if self.page.is_none() {
                extras.page_dictionary = None;
            }
        }
        if self.extras.as_ref().is_some_and(|e| {
            e.buffer.is_empty()
                && e.blobs.is_empty()
                && e.access_table.is_none()
                && e.page_dictionary.is_none()
        }) {
            self.extras = None;
        }
    }
}

/// What a leaf's box of extras takes: the most a page dictionary must save to be worth
/// holding.
pub(super) fn extras_box() -> usize {
    alloc_size(size_of::<Extras>())
}

/// Bits of `DramLeaf::flags`.
pub(super) const REFERENCED: u8 = 1;
/// Chosen for the uncompressed hot sub-tier.
pub(super) const HOT: u8 = 1 << 1;
pub(super) const MERGE_QUEUED: u8 = 1 << 2;
/// The page was found damaged: which keys it held newer versions or tombstones of is
/// unknown, so every key of the range it cannot answer for hides the lower tiers (a
/// miss), and the range is forgotten below when the leaf leaves. Set under the read lock
/// by whoever finds the damage.
pub(super) const LOST: u8 = 1 << 3;
/// Removed from the tree by an eviction; its slot is free (or handed out again, which
/// clears the flag).
pub(super) const RETIRED: u8 = 1 << 4;
/// The page's body is stored uncompressed (the hot sub-tier), not as LZ4.
pub(super) const RAW_PAGE: u8 = 1 << 5;
/// Written since the last pass of `shrink_idle_buffers`.
pub(super) const WRITTEN: u8 = 1 << 6;
/// Its medium objects' blobs are stored as is (`hot.rs`, `Heat::HotBlobs`).
pub(super) const RAW_BLOBS: u8 = 1 << 7;

/// One slot of the tier's table: 40 bytes per leaf.
#[derive(Default)]
pub(super) struct DramLeaf {
    pub(super) state: RwLock<LeafState>,
    /// Accesses since the bypass pass last aged the counters.
    pub(super) access: AtomicU32,
    pub(super) flags: AtomicU8,
    /// How many times its buffer's limit doubled `write_buffer` (`write_buffer::next_level`).
    pub(super) buffer_level: AtomicU8,
    /// The tag (`page::lz4_tag`) of the page dictionary that LZ4 alone beat when the
    /// page was built (0: none), which its next merge tries first (`DramTier::page`).
    pub(super) lz4_beat: AtomicU8,
}

impl DramLeaf {
    /// Counts an access. A plain load/store, not an atomic add: a lost increment under a
    /// race does not matter to a hotness estimate, a locked bus cycle per GET would.
    pub(super) fn touch(&self) {
        self.access.store(
            self.access.load(Ordering::Relaxed).saturating_add(1),
            Ordering::Relaxed,
        );
        if !self.has(REFERENCED) {
            self.flags.fetch_or(REFERENCED, Ordering::Relaxed);
        }
    }

    pub(super) fn has(&self, flag: u8) -> bool {
        self.flags.load(Ordering::Relaxed) & flag != 0
    }

    /// Sets or clears `flag`; returns whether it was set before.
    pub(super) fn set(&self, flag: u8, on: bool) -> bool {
        let before = if on {
            self.flags.fetch_or(flag, Ordering::AcqRel)
        } else {
            self.flags.fetch_and(!flag, Ordering::AcqRel)
        };
        before & flag != 0
    }

    pub(super) fn hot(&self) -> bool {
        self.has(HOT)
    }

    pub(super) fn lost(&self) -> bool {
        self.has(LOST)
    }

    pub(super) fn raw_page(&self) -> bool {
        self.has(RAW_PAGE)
    }

    pub(super) fn buffer_level(&self) -> u8 {
        self.buffer_level.load(Ordering::Relaxed)
    }

    pub(super) fn set_buffer_level(&self, level: u8) {
        self.buffer_level.store(level, Ordering::Relaxed);
    }
}

/// A DRAM leaf keeps no range: the tree decides whether it owns a key.
impl Lockable for DramLeaf {
    type State = LeafState;

    fn lock(&self) -> &RwLock<LeafState> {
        &self.state
    }

    fn owns(_: &LeafState, _: &[u8]) -> Option<bool> {
        None
    }
}

/// `Extras::buffered` until someone asks.
pub(super) const UNKNOWN: i32 = i32::MIN;

pub(super) struct LeafContents {
    pub(super) page: Option<Block>,
    /// `DramLeaf::lz4_beat` for the page.
    pub(super) lz4_beat: u8,
    /// The page's body is uncompressed.
    pub(super) raw: bool,
    pub(super) blobs: ThinVec<Option<Block>>,
    pub(super) dictionary: Option<Arc<Dictionary>>,
    pub(super) page_dictionary: Option<Arc<PageDictionary>>,
    pub(super) access_table: Option<Box<AccessTable>>,
}

/// Puts a page, its blobs and its access state into a locked leaf (the caller charges
/// the change).
pub(super) fn install(leaf: &DramLeaf, st: &mut LeafState, c: LeafContents) {
    st.page = c.page;
    leaf.set(RAW_PAGE, c.raw && st.page.is_some());
    leaf.lz4_beat.store(c.lz4_beat, Ordering::Relaxed);
    if !c.blobs.is_empty() || c.access_table.is_some() || c.page_dictionary.is_some() {
        let extras = st.extras.get_or_insert_default();
        extras.blobs = c.blobs;
        extras.dictionary = c.dictionary;
        extras.page_dictionary = c.page_dictionary;
        extras.access_table = c.access_table;
    } else if let Some(extras) = &mut st.extras {
        extras.blobs = ThinVec::new();
        extras.dictionary = None;
        extras.page_dictionary = None;
        extras.access_table = None;
    }
    st.tidy();
}

impl DramTier {
    /// What a leaf's state takes besides its slot: a pure function of the state, so
    /// every change is charged as the difference of this before and after it.
    pub(super) fn charge_of(&self, leaf: &DramLeaf, st: &LeafState) -> Charge {
        let mut charge = self.charge_besides_blobs(leaf, st);
        charge.mediums += blob_bytes(st.blobs().iter().flatten()) as i64;
        charge
    }

    /// `charge_of` without the blobs' own bytes, which `mediums` alone counts whatever
    /// else the leaf holds: a change that knows what it did to the blobs adds that
    /// instead of walking them all (`charged_knowing_blobs`).
    fn charge_besides_blobs(&self, leaf: &DramLeaf, st: &LeafState) -> Charge {
        let page = st.page.as_deref().map_or(0, |p| alloc_size(p.len())) as i64;
        let raw = leaf.raw_page();
        let (buffer, mediums, access, page_box) = match &st.extras {
            None => (0, 0, 0, 0),
            Some(e) => {
                let table = blob_table_bytes(&e.blobs);
                let access = e.access_table.as_ref().map_or(0, |t| t.charge());
                // The box itself goes with the first of the four that keeps it.
                let boxed = extras_box();
                let buffer = e.buffer.charge();
                if !e.buffer.is_empty() {
                    (buffer + boxed, table, access, 0)
                } else if !e.blobs.is_empty() {
                    (buffer, table + boxed, access, 0)
                } else if e.access_table.is_some() {
                    (buffer, table, access + boxed, 0)
                } else if e.page_dictionary.is_some() {
                    (buffer, table, access, boxed)
                } else {
                    (buffer, table + boxed, access, 0)
                }
            }
        };
        let page = page + page_box as i64;
        Charge {
            compressed_pages: if raw { 0 } else { page },
            hot_pages: if raw { page } else { 0 },
            write_buffers: buffer as i64,
            mediums: mediums as i64,
            access_tables: access as i64,
            index: 0,
            dictionaries: 0,
        }
    }

    /// Runs `f` on a locked leaf's state (and flags) and charges what it changed.
    pub(super) fn charged<R>(
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

    /// `charged` for a change that returns, beside its result, the blobs' bytes it
    /// added less those it freed (`blob_bytes` of each): a PUT into a leaf of ~200
    /// medium objects walked their blobs twice (5 % of the server's CPU in a JSON fill).
    pub(super) fn charged_knowing_blobs<R>(
        &self,
        leaf: &DramLeaf,
        st: &mut LeafState,
        f: impl FnOnce(&mut LeafState) -> (R, i64),
    ) -> R {
        let before = self.charge_besides_blobs(leaf, st);
        let (result, blobs) = f(st);
        st.tidy();
        let mut after = self.charge_besides_blobs(leaf, st);
        after.mediums += blobs;
        self.memory.change(&before, &after);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{Change, DramSettings, Look, Lookup, Wanted};
    use super::*;
    use crate::record::{Meta, Payload};

    /// The data of the blob `key`'s newest DRAM version names, if it is a medium one.
    fn blob_data_of(dram: &DramTier, key: &[u8]) -> Option<Vec<u8>> {
        dram.read_leaf(key, |leaf, st| {
            let slot = dram
                .with_record(leaf, st, key, |r| match r?.payload {
                    Payload::Medium(slot) => Some(slot),
                    _ => None,
                })
                .flatten()?;
            let blob = st.blobs().get(usize::from(slot))?.as_deref()?;
            crate::record::blob_data(blob).map(<[u8]>::to_vec)
        })
    }

    /// A change of metadata alone (`Change::Redate`: a TTL set, a touch) keeps a medium
    /// value's compressed bytes, whether its blob was buffered or in the page: the new
    /// blob is the old one's data under a new header, and nothing is compressed (the
    /// value is not offered to the dictionary trainer again, as each blob compressed
    /// is). The value reads back whole with the new metadata, and the account stays
    /// exact. A tiny value, inline, is written again as it is.
    #[test]
    fn a_redate_keeps_the_compressed_bytes_and_reads_back_whole() {
        let (dram, memory) = tier_with(settings(256));
        let value = |i: u32| format!("session {i} of user {i}: cart=apple,pear,plum; ").repeat(40);
        let keys: Vec<u32> = (0..300).collect();
        for &i in &keys {
            let key = key(i);
            let small = i % 10 == 0;
            let value = if small {
                b"tiny".to_vec()
            } else {
                value(i).into_bytes()
            };
            dram.put_with(&key, Some(&value), Meta::default(), None, 0, |_| ());
        }
        let offered = || dram.dictionaries.as_ref().expect("trained").blobs.offered();
        let medium = keys.iter().filter(|&&i| i % 10 != 0).count() as u64;
        assert_eq!(offered(), medium, "each blob compressed is offered");
        for (round, merged) in [(1u64, false), (2, true), (3, true)] {
            if merged {
                dram.merge_all(0);
            }
            for &i in &keys {
                let key = key(i);
                let before = blob_data_of(&dram, &key);
                assert_eq!(before.is_some(), i % 10 != 0, "key {i}");
                let expires = Some(1_000_000 * round + u64::from(i));
                // The last round reads the metadata alone: a medium value stays sealed.
                let wanted = if round == 3 {
                    Wanted::Meta
                } else {
                    Wanted::Value
                };
                let medium_len = value(i).len();
                dram.modify_wanting(&key, 0, wanted, Look::Peek, |current, _| {
                    let (value, meta, access) = match current {
                        Lookup::Found(value, meta, access) => (Some(value), meta, access),
                        Lookup::Sealed(meta, len, access) if wanted == Wanted::Meta => {
                            assert_eq!(len, medium_len, "key {i}");
                            (None, meta, access)
                        }
                        other => panic!("key {i}: {other:?}"),
                    };
                    assert_eq!(value.is_none(), wanted == Wanted::Meta && i % 10 != 0);
                    let meta = Meta {
                        expires_at_ms: expires,
                        ..meta
                    };
                    (
                        Some(Change::Redate {
                            value,
                            meta,
                            access,
                        }),
                        (),
                    )
                });
                assert_eq!(blob_data_of(&dram, &key), before, "key {i}, round {round}");
                let Lookup::Found(value_after, meta, _) = dram.get(&key, 0, true) else {
                    panic!("key {i} lost");
                };
                let expected = if i % 10 == 0 {
                    b"tiny".to_vec()
                } else {
                    value(i).into_bytes()
                };
                assert_eq!(value_after, expected, "key {i}");
                assert_eq!(meta.expires_at_ms, expires, "key {i}");
            }
            assert_eq!(recount(&dram), memory.snapshot(), "round {round}");
            assert_eq!(offered(), medium, "round {round}: nothing compressed again");
        }
    }

    /// A leaf costs a 40-byte slot; with the tree's entry (a 4-byte id, its fence's
    /// distinct bytes, a 2-byte offset and a 4-byte head) and its share of the inner
    /// nodes it stays within 64 bytes, as the account charges it. The account matches a recount of
    /// every allocation's size and capacity, before and after evictions.
    #[test]
    fn a_leaf_costs_at_most_64_bytes_and_the_account_is_exact() {
        assert_eq!(size_of::<DramLeaf>(), 40);
        // 64 bytes (an 80-byte chunk): the dictionary's pointer took it past 56 bytes.
        assert_eq!(
            alloc_size(size_of::<Extras>()),
            80,
            "the extras grew past the chunk they take"
        );
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
            dram.put_with(&key, Some(&[i as u8; 64]), meta, None, 0, |_| ());
        }
        dram.merge_all(0);
        assert_eq!(recount(&dram), memory.snapshot());
        let leaves = dram.leaf_count() as i64;
        let per_leaf = (memory.snapshot().index - dram.reads.bytes()) / leaves;
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
        assert_eq!(recount(&dram), memory.snapshot());
        for &i in &order[..5000] {
            dram.put_with(
                &format!("{i:016}").into_bytes(),
                Some(b"again"),
                Meta::default(),
                None,
                0,
                |_| (),
            );
        }
        assert_eq!(recount(&dram), memory.snapshot());
        dram.evict_all(None, 0);
        assert_eq!(recount(&dram), memory.snapshot());
        assert_eq!(dram.leaf_count(), 1);
    }

    /// With `track_access` the objects' states are charged too, exactly, at about 15
    /// bytes an object (12 a stamp, the rest the boxes holding them).
    #[test]
    fn access_tables_are_charged_exactly() {
        let (dram, memory) = tier_with(DramSettings {
            track_access: true,
            ..settings(256)
        });
        let keys: Vec<Vec<u8>> = (0..20_000u32)
            .map(|i| format!("{:016}", i.wrapping_mul(2_654_435_761)).into_bytes())
            .collect();
        for key in &keys {
            dram.put_with(key, Some(&[1; 64]), Meta::default(), None, 0, |_| ());
        }
        for key in keys.iter().step_by(3) {
            dram.get(key, 1_000, false);
        }
        dram.merge_all(2_000);
        assert_eq!(recount(&dram), memory.snapshot());
        let per_object = memory.snapshot().access_tables as f64 / keys.len() as f64;
        assert!(per_object <= 18.0, "{per_object} bytes an object");
        for key in keys.iter().step_by(5) {
            dram.delete(key, 3_000, |_| ());
        }
        for _ in 0..100 {
            dram.evict_one(None, 3_000);
        }
        assert_eq!(recount(&dram), memory.snapshot());
        dram.evict_all(None, 4_000);
        assert_eq!(recount(&dram), memory.snapshot());
        assert_eq!(memory.snapshot().access_tables, 0);
    }
}
