//! Per-page write buffering (paper §3.2): PUTs and DELETEs append a record to a small
//! uncompressed buffer on their leaf instead of recompressing the page each time. A full
//! buffer queues the leaf for a background merge (decompress → apply → recompress), so
//! one recompression absorbs several writes. GETs look here before the page.

use crate::memory::alloc_size;
use crate::record::{Record, records};

/// The records appended since the last merge. A leaf keeps it in a box beside its blobs
/// only while it is not empty, so the many leaves without one pay nothing for it.
#[derive(Debug, Default)]
pub struct WriteBuffer {
    bytes: Vec<u8>,
}

/// What the writer should do after an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pressure {
    /// Room left.
    Fine,
    /// Over the limit: queue the leaf for a background merge.
    Full,
    /// Far over the limit (the merger is behind, or one record is huge): merge now in
    /// the foreground rather than let buffers eat the DRAM budget.
    Overflowing,
}

impl WriteBuffer {
    pub fn append(&mut self, record: &Record<'_>, limit: usize) -> Pressure {
        record.encode(&mut self.bytes);
        let len = self.bytes.len();
        if limit == 0 || len > limit.max(64).saturating_mul(4) {
            Pressure::Overflowing
        } else if len > limit {
            Pressure::Full
        } else {
            Pressure::Fine
        }
    }

    /// The newest buffered record of `key`.
    pub fn find(&self, key: &[u8]) -> Option<Record<'_>> {
        self.records().filter(|r| r.key == key).last()
    }

    /// Buffered records, oldest first.
    pub fn records(&self) -> impl Iterator<Item = Record<'_>> {
        records(&self.bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// DRAM the buffered bytes hold.
    pub fn charge(&self) -> usize {
        alloc_size(self.bytes.capacity())
    }

    /// Takes the buffered bytes out, leaving the buffer empty and without an allocation:
    /// after a merge a buffer costs nothing until the next write.
    pub fn take(&mut self) -> WriteBuffer {
        WriteBuffer {
            bytes: std::mem::take(&mut self.bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Meta, Payload};

    fn rec<'a>(key: &'a [u8], value: Option<&'a [u8]>) -> Record<'a> {
        let payload = value.map_or(Payload::Tombstone, Payload::Inline);
        Record {
            key,
            payload,
            meta: Meta::default(),
        }
    }

    #[test]
    fn newest_record_wins_and_pressure_rises() {
        let mut b = WriteBuffer::default();
        assert_eq!(b.append(&rec(b"k", Some(b"1")), 64), Pressure::Fine);
        assert_eq!(b.append(&rec(b"k", Some(b"2")), 64), Pressure::Fine);
        assert_eq!(b.find(b"k").unwrap().payload, Payload::Inline(b"2"));
        assert_eq!(b.append(&rec(b"k", None), 64), Pressure::Fine);
        assert_eq!(b.find(b"k").unwrap().payload, Payload::Tombstone);
        let big = [0u8; 60];
        assert_eq!(b.append(&rec(b"x", Some(&big)), 64), Pressure::Full);
        for _ in 0..4 {
            b.append(&rec(b"y", Some(&big)), 64);
        }
        assert_eq!(b.append(&rec(b"z", Some(&big)), 64), Pressure::Overflowing);
        assert_eq!(b.records().count(), 9);
        assert!(b.charge() >= alloc_size(b.bytes.len()));
        let taken = b.take();
        assert_eq!(taken.records().count(), 9);
        assert!(b.is_empty());
        assert_eq!(b.charge(), 0, "a merged buffer keeps no capacity");
    }

    #[test]
    fn a_zero_limit_merges_every_write() {
        let mut b = WriteBuffer::default();
        assert_eq!(b.append(&rec(b"k", Some(b"1")), 0), Pressure::Overflowing);
    }
}
