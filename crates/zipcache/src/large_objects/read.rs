//! BT_LO's GET: the extent planned under the leaf's lock, read without it, checked against
//! BT_LO again when the read completes; and its part of a scan (index entries only).

use std::sync::atomic::Ordering;

use zipcache_device::AlignedBuf;

use super::extent::decode;
use super::{Extent, LargeEntry, LargeObjects};
use crate::btree::{Fence, Shared};
use crate::record::Meta;

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

impl LargeObjects {
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
                    .map(|(k, extent)| (k.to_vec(), extent.entry()))
                    .collect();
                (entries, st.range.high.clone())
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
        self.finish_get(read, key, done.then_some(buf))
    }

    /// The second half of a GET: the value in the extent read for `read` (`None` if the
    /// read failed). BT_LO is asked first: if it no longer points at that very extent,
    /// the key was overwritten or deleted, or the extent left the log, while it was read,
    /// and what the read found may be an older value (`Moved`). Otherwise the extent was
    /// neither trimmed nor reused before the read completed: its own trim and reuse
    /// follow its removal from BT_LO, and another extent's trim lands only while the log
    /// owns that extent's blocks (`trim_if_owned`). Bytes that fail the header or checksum
    /// are damage: a miss.
    pub fn finish_get(&self, read: LoRead, key: &[u8], bytes: Option<AlignedBuf>) -> LoFinished {
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
}
