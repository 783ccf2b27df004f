//! BT_LO's writes: a large object into the log's head (its value compressed first in
//! `host` mode), and a removal when a small PUT or a DELETE replaces it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use zipcache_device::BLOCK_SIZE;

use super::extent::{Stored, encode};
use super::{Extent, LargeObjects};
use crate::format::extent::HEADER;
use crate::record::Meta;
use crate::ssd::host_compression::compress_if_smaller;

impl LargeObjects {
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
                self.drop_oldest(&log, &old_key, old_seq, first, len);
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
            self.drop_oldest(&log, &old_key, old_seq, first, len);
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
        // may do I/O: the crash journal's record (tmpfs)
        self.log_put(&log, to, &key, &extent);
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

    /// Drops the large object under `key`, if any (a small PUT or a DELETE replaced it),
    /// and returns its metadata. Decided by BT_LO alone: no device read, and not by the
    /// object counter, which can read 0 for a moment while an entry is in the tree.
    pub fn remove(&self, key: &[u8]) -> Option<Meta> {
        // Every small PUT asks: look under the shared lock first, so that writers of small
        // objects queue neither on the log nor on BT_LO's one leaf for nothing.
        self.lookup(key)?;
        let log = self.log.lock();
        let seq = self.lookup(key)?.seq;
        // may do I/O: the crash journal's record (tmpfs)
        self.log_remove(&log, key, seq);
        let removed = self.remove_if(key, |e| e.seq == seq)?;
        self.trim_if_owned(&log, &removed);
        Some(removed.meta)
    }
}
