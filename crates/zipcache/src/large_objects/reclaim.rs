//! The log's space: the oldest extents dropped (FIFO) as the head comes round or BT_LO
//! must shrink, dead extents trimmed while the log still owns their blocks, everything
//! forgotten at once (`clear`).

use std::sync::atomic::Ordering;

use super::{Extent, LargeObjects, Log};

impl LargeObjects {
    /// Drops the oldest extent of the log (FIFO), to shrink BT_LO; false if it is empty.
    pub fn drop_oldest_one(&self) -> bool {
        let mut log = self.log.lock();
        let Some((first, len, key, seq)) = log.extents.pop_front() else {
            return false;
        };
        self.drop_oldest(&log, &key, seq, first, len);
        true
    }

    /// FIFO eviction of one extent (`first`, `len` blocks into the region), popped from
    /// the log by the caller, which still holds the log's lock: if BT_LO still points at
    /// it, it leaves BT_LO and its blocks are trimmed before anyone can reuse them. A dead
    /// extent was trimmed when it died.
    pub(super) fn drop_oldest(&self, log: &Log, key: &[u8], seq: u64, first: u64, len: u32) {
        if self.lookup(key).is_none_or(|e| e.seq != seq) {
            return;
        }
        // may do I/O: the crash journal's record (tmpfs)
        self.log_remove(log, key, seq);
        if self.remove_if(key, |e| e.seq == seq).is_some() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            let _ = self.device.trim(self.start + first, u64::from(len));
        }
    }

    /// Trims a dead extent's blocks so the SSD stops holding them — only while the log
    /// (`log`: its lock held) still owns them. Once an extent leaves BT_LO, the log's next
    /// wrap may pop it and write another key's extent there, and a trim landing after that
    /// would erase a live object; a popped extent's blocks are the writer's, not ours.
    pub(super) fn trim_if_owned(&self, log: &Log, extent: &Extent) {
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
        // may do I/O: the crash journal's record (tmpfs)
        self.log_clear(&log);
        while let Some((_, _, key, seq)) = log.extents.pop_front() {
            self.remove_if(&key, |e| e.seq == seq);
        }
        log.head = 0;
        let _ = self.device.trim(self.start, self.blocks);
    }
}
