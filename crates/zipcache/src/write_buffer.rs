//! Per-page write buffering (paper §3.2): PUTs and DELETEs append a record to a small
//! uncompressed buffer on their leaf instead of recompressing the page each time. A full
//! buffer queues the leaf for a background merge (decompress → apply → recompress), so
//! one recompression absorbs several writes. GETs look here before the page.

use crate::memory::alloc_size;
use crate::record::{Record, records};

/// Boxed so that the many leaves with an empty buffer pay one pointer, not a `Vec`.
#[derive(Debug, Default)]
#[allow(clippy::box_collection)]
pub struct WriteBuffer {
    bytes: Option<Box<Vec<u8>>>,
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
        let bytes = self.bytes.get_or_insert_default();
        record.encode(bytes);
        let len = bytes.len();
        if limit == 0 || len > 4 * limit.max(64) {
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
        records(self.bytes.as_deref().map_or(&[][..], Vec::as_slice))
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.as_ref().is_none_or(|b| b.is_empty())
    }

    /// DRAM the buffer holds.
    pub fn charge(&self) -> usize {
        self.bytes.as_ref().map_or(0, |b| {
            alloc_size(size_of::<Vec<u8>>()) + alloc_size(b.capacity())
        })
    }

    /// Empties the buffer after a merge, keeping a modest allocation for the next writes.
    pub fn clear(&mut self, limit: usize) {
        match &mut self.bytes {
            Some(b) if b.capacity() <= 2 * limit.max(64) => b.clear(),
            _ => self.bytes = None,
        }
    }

    /// Takes the buffered bytes out, leaving the buffer empty.
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
        b.clear(64);
        assert!(b.is_empty());
    }

    #[test]
    fn a_zero_limit_merges_every_write() {
        let mut b = WriteBuffer::default();
        assert_eq!(b.append(&rec(b"k", Some(b"1")), 0), Pressure::Overflowing);
    }
}
