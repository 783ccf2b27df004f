//! Per-page write buffering (paper §3.2): PUTs and DELETEs append a record to a small
//! uncompressed buffer on their leaf instead of recompressing the page each time. A full
//! buffer queues the leaf for a background merge (decompress → apply → recompress), so
//! one recompression absorbs several writes. GETs look here before the page.
//!
//! A medium value's record here is a pointer, as in the page: its blob is compressed
//! when it is written, so a record takes a few dozen bytes however long the value.
//!
//! The limit adapts: a leaf of medium objects whose buffer took at least as many writes
//! as GETs looked through it since its last merge gets twice the room after that merge
//! (`DramTier::merge_full`), up to `2^MAX_LEVEL` times
//! `write_buffer` (fewer merges for the same writes), while all buffers together stay
//! within a share of the budget; a leaf read more than written, or left idle, goes back
//! down (`next_level`).
//!
//! Every write looks for its key's buffered version (to free that version's blob) and
//! every GET looks through the buffer, and most find none: a filter of the buffered keys
//! in front of the records answers "not here" without walking ~100 of them (that walk
//! took 15 % of the server's CPU in a JSON fill, docs/RESULTS.md).

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::leaf::LeafState;
use crate::format::buffer::{CAS_TOP, FILTER, FILTER_LEN};
use crate::memory::alloc_size;
use crate::record::{Payload, Record, key_and_len, records};

/// The records appended since the last merge. A leaf keeps it in a box beside its blobs
/// only while it is not empty, so the many leaves without one pay nothing for it.
#[derive(Debug, Default)]
pub struct WriteBuffer {
    /// Once written: the largest ordered CAS version of the records, which every write
    /// asking for a version needs; the filter's length and the filter (two bits set by
    /// each buffered key); then the records (`format/buffer.rs`).
    bytes: Vec<u8>,
}

/// The filter's length for a buffer of `limit` bytes: a byte for every 32 (about five
/// bits a pointer record of 20 bytes, so that one key in nine not buffered passes it),
/// 8 to 64 bytes.
fn filter_len(limit: usize) -> usize {
    (limit / 32).clamp(8, 64)
}

/// The two filter bits (of `bits`) that `key` sets.
fn filter_bits(key: &[u8], bits: usize) -> [usize; 2] {
    let hash = xxh3_64_with_seed(key, 0x5a1b_cace_0000_0b0f);
    [
        (hash as u32) as usize % bits,
        ((hash >> 32) as u32) as usize % bits,
    ]
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

/// What became of a key's newest buffered record before a write of the key
/// (`WriteBuffer::take_back_last`), and the blob slot it names if it is a medium one's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Newest {
    /// Out of the buffer: the write's record goes where it was.
    TakenBack(Option<u16>),
    /// Still buffered, below the write's.
    Kept(Option<u16>),
}

/// Whether a write of `new` keeps the leaf's versions as appending it would, were it
/// written in the place of `old`, its key's newest record: a version at least the old
/// one's, which a merge would keep above it, or neither ordered. Otherwise the old
/// version disappears unseen (a client's unordered version over an ordered one), and
/// only a merge may let it go, raising the CAS floor.
fn may_take_place(new: &Record<'_>, old: &Record<'_>) -> bool {
    new.meta.ordered_cas() >= old.meta.ordered_cas()
}

/// Doublings of `write_buffer` a buffer may grow by.
pub const MAX_LEVEL: u8 = 3;

/// A buffer's limit at `level`.
pub fn limit_at(write_buffer: usize, level: u8) -> usize {
    write_buffer << level.min(MAX_LEVEL)
}

/// How many times `write_buffer` the buffer of a leaf without medium objects holds.
pub const TINY_LEAF_BUFFERS: usize = 2;

/// The limit of the buffer of a leaf in state `st` at `level`. A leaf without medium
/// objects buffers [`TINY_LEAF_BUFFERS`] × `write_buffer` and does not grow: its records
/// hold their values whole (~90 bytes for a 64-byte value, against ~25 for a medium
/// object's pointer), so at `write_buffer` it merged every three writes, and merges took
/// half the server's CPU under pipelined SETs of 64-byte values. Twice the room halved
/// its merges for 0.6 % fewer objects in a 64 MiB fill (its buffers at rest: ~0.6 B an
/// object; docs/history/RESULTS-HISTORY.md). Buffers whose size changes with the load
/// (grown as a leaf of medium objects grows, or merged down once idle) left the
/// allocator's pages of their size classes half empty in some fills, and fewer objects
/// held.
pub fn buffer_limit(write_buffer: usize, level: u8, st: &LeafState) -> usize {
    match st.blobs().is_empty() {
        true => TINY_LEAF_BUFFERS * write_buffer,
        false => limit_at(write_buffer, level),
    }
}

/// The level a buffer takes after a merge its pressure asked for, from how many `writes`
/// and `reads` (GETs that looked through it) it saw since the merge before: up one while
/// writes are at least as many and there is `room`, else down one. A bigger buffer means
/// fewer merges per write and a longer look for every GET of its leaf.
pub fn next_level(level: u8, writes: usize, reads: u32, room: bool) -> u8 {
    if room && reads as usize <= writes {
        (level + 1).min(MAX_LEVEL)
    } else {
        level.saturating_sub(1)
    }
}

impl WriteBuffer {
    /// Buffers `record`: appended, or written over its key's newest record
    /// (`replace_newest`). The pressure says whether the leaf should merge.
    pub fn append(&mut self, record: &Record<'_>, limit: usize) -> Pressure {
        let cas_top = self.cas_top().max(record.meta.ordered_cas());
        // Room for the record at once: its bytes pushed one by one grew the vector
        // several times a record (17, 34, 68, 136 bytes for the first of 90), and left
        // it up to twice as large as it held.
        let encoded = record.encoded_len();
        if self.bytes.is_empty() {
            let filter = filter_len(limit);
            self.bytes.reserve_exact(FILTER + filter + encoded);
            self.bytes.resize(FILTER + filter, 0);
            FILTER_LEN.set(&mut self.bytes, filter as u8);
        }
        CAS_TOP.set(&mut self.bytes, cas_top);
        if !self.replace_newest(record, encoded) {
            self.bytes.reserve(encoded);
            let filter = self.filter_mut();
            for bit in filter_bits(record.key, filter.len() * 8) {
                filter[bit / 8] |= 1 << (bit % 8);
            }
            record.encode(&mut self.bytes);
        }
        let len = self.len();
        if limit == 0 || len > limit.max(64).saturating_mul(4) {
            Pressure::Overflowing
        } else if len > limit {
            Pressure::Full
        } else {
            Pressure::Fine
        }
    }

    /// Writes `record` (`encoded` bytes) over its key's newest buffered record where that
    /// takes as many bytes and the write keeps the leaf's versions as appending would: a
    /// version at least the replaced one's, which a merge would keep above it, or neither
    /// ordered. A key written again and again (a large hash's header at every HSET, a
    /// counter) then holds one record, not a buffer full of its versions that every GET
    /// walks and a merge every few dozen writes empties. Merges keep a key's newest
    /// record alone, so the leaf reads as if the record were appended. A newest record
    /// that is the buffer's last goes whatever the new one's length (`take_back_last`),
    /// and the new one is appended in its place.
    ///
    /// Not a medium value's pointer: each takes a new slot of the leaf's blob table,
    /// which only a merge empties, so its writes must go on filling the buffer — but the
    /// last record, whose blob the leaf takes back with its slot (`Extras::make_way`).
    fn replace_newest(&mut self, record: &Record<'_>, encoded: usize) -> bool {
        if matches!(record.payload, Payload::Medium(_)) {
            return false;
        }
        let Some((at, len)) = self.newest(record.key) else {
            return false;
        };
        let start = self.filter_end() + at;
        let Some((old, _)) = Record::parse(&self.bytes[start..]) else {
            return false;
        };
        if !may_take_place(record, &old) {
            return false;
        }
        if start + len == self.bytes.len() && !matches!(old.payload, Payload::Medium(_)) {
            self.bytes.truncate(start);
            return false;
        }
        let replaceable = len == encoded;
        if replaceable {
            let mut bytes = Vec::with_capacity(encoded);
            record.encode(&mut bytes);
            self.bytes[start..start + len].copy_from_slice(&bytes);
        }
        replaceable
    }

    /// `key`'s newest buffered record, taken out of the buffer if it is the last one and a
    /// write of `record` may take its place (as in `replace_newest`): what the leaf must
    /// do with the blob it points at, if any.
    pub fn take_back_last(&mut self, record: &Record<'_>) -> Option<Newest> {
        let (at, len) = self.newest(record.key)?;
        let start = self.filter_end() + at;
        let (old, _) = Record::parse(&self.bytes[start..])?;
        let slot = match old.payload {
            Payload::Medium(slot) => Some(slot),
            Payload::Inline(_) | Payload::Tombstone => None,
        };
        if start + len == self.bytes.len() && may_take_place(record, &old) {
            self.bytes.truncate(start);
            Some(Newest::TakenBack(slot))
        } else {
            Some(Newest::Kept(slot))
        }
    }

    /// The newest buffered record of `key`: the others are only skipped, the last match
    /// alone decoded.
    pub fn find(&self, key: &[u8]) -> Option<Record<'_>> {
        let (at, _) = self.newest(key)?;
        Record::parse(&self.run()[at..]).map(|(record, _)| record)
    }

    /// Where in the run the newest record of `key` starts, and its length.
    fn newest(&self, key: &[u8]) -> Option<(usize, usize)> {
        if !self.may_hold(key) {
            return None;
        }
        let run = self.run();
        let (mut at, mut newest) = (0, None);
        while let Some((k, len)) = key_and_len(&run[at..]) {
            if k == key {
                newest = Some((at, len));
            }
            at += len;
        }
        newest
    }

    /// Buffered records, oldest first.
    pub fn records(&self) -> impl Iterator<Item = Record<'_>> {
        records(self.run())
    }

    /// Whether the filter lets `key` pass: false only if no record of it is buffered.
    fn may_hold(&self, key: &[u8]) -> bool {
        let filter = self.filter();
        !filter.is_empty()
            && filter_bits(key, filter.len() * 8)
                .iter()
                .all(|&bit| filter[bit / 8] & (1 << (bit % 8)) != 0)
    }

    /// Where the filter ends, from its length byte (0 while empty).
    fn filter_end(&self) -> usize {
        if self.bytes.len() < FILTER {
            0
        } else {
            FILTER + usize::from(FILTER_LEN.get(&self.bytes))
        }
    }

    fn filter(&self) -> &[u8] {
        self.bytes
            .get(FILTER..self.filter_end())
            .unwrap_or_default()
    }

    fn filter_mut(&mut self) -> &mut [u8] {
        let end = self.filter_end();
        &mut self.bytes[FILTER..end]
    }

    fn run(&self) -> &[u8] {
        self.bytes.get(self.filter_end()..).unwrap_or_default()
    }

    /// The largest ordered CAS version of the buffered records (0 for none).
    pub fn cas_top(&self) -> u64 {
        if self.bytes.len() < FILTER {
            0
        } else {
            CAS_TOP.get(&self.bytes)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Bytes the buffered records take (and the CAS version in front of them; not the
    /// filter, so that the limits mean what they meant before it).
    pub fn len(&self) -> usize {
        match self.bytes.len() {
            0 => 0,
            len => len - (self.filter_end() - CAS_TOP.end()),
        }
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
    use crate::record::Meta;

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
        assert_eq!(b.find(b"other"), None);
        let big = [0u8; 52];
        assert_eq!(b.append(&rec(b"x", Some(&big)), 64), Pressure::Full);
        for y in [b"y0", b"y1", b"y2", b"y3"] {
            b.append(&rec(y, Some(&big)), 64);
        }
        assert_eq!(b.append(&rec(b"z", Some(&big)), 64), Pressure::Overflowing);
        // "k"'s second value took its first's place, and its tombstone the second's.
        assert_eq!(b.records().count(), 7);
        assert!(b.charge() >= alloc_size(b.bytes.len()));

        let taken = b.take();
        assert_eq!(taken.records().count(), 7);
        assert!(b.is_empty());
        assert_eq!(b.charge(), 0, "a merged buffer keeps no capacity");
    }

    #[test]
    fn a_buffer_written_more_than_read_doubles_up_to_the_cap() {
        let mut level = 0;
        let mut limits = vec![limit_at(256, level)];
        for _ in 0..5 {
            level = next_level(level, 10, 10, true);
            limits.push(limit_at(256, level));
        }
        assert_eq!(limits, [256, 512, 1024, 2048, 2048, 2048]);
        assert_eq!(level, MAX_LEVEL);
        // Without room, or read more than written, it goes back a step at a time.
        assert_eq!(next_level(3, 10, 0, false), 2);
        assert_eq!(next_level(2, 10, 11, true), 1);
        assert_eq!(next_level(0, 10, 11, true), 0);
        assert_eq!(limit_at(0, MAX_LEVEL), 0, "a zero limit stays zero");
    }

    #[test]
    fn the_buffer_keeps_the_largest_ordered_cas_of_its_records() {
        let mut b = WriteBuffer::default();
        assert_eq!(b.cas_top(), 0);
        let with_cas = |cas, client_cas| Record {
            meta: Meta {
                cas,
                client_cas,
                ..Meta::default()
            },
            ..rec(b"k", Some(b"v"))
        };
        for (cas, client, top) in [
            (7, false, 7),
            (5, false, 7),
            (u64::MAX, true, 7),
            (9, false, 9),
        ] {
            b.append(&with_cas(cas, client), 1 << 10);
            assert_eq!(b.cas_top(), top);
        }
        // 5 and the client's version were appended (each below the one before), 9 took
        // the client's place.
        assert_eq!(b.records().count(), 3);
        assert_eq!(b.find(b"k").unwrap().meta.cas, 9);
        assert_eq!(b.take().cas_top(), 9);
        assert_eq!(b.cas_top(), 0);
    }

    /// A key written again in a record of the same length takes its newest record's
    /// place when its version is at least that one's — at any length if that record is
    /// the buffer's last; otherwise it is appended (a merge then counts the version it
    /// replaced as gone).
    #[test]
    fn a_key_written_again_takes_its_newest_records_place() {
        let mut b = WriteBuffer::default();
        let at = |cas, value: &'static [u8]| Record {
            meta: Meta {
                cas,
                ..Meta::default()
            },
            ..rec(b"hot", Some(value))
        };
        b.append(&at(7, b"aa"), 1 << 10);
        b.append(&rec(b"other", Some(b"x")), 1 << 10);
        let len = b.len();
        b.append(&at(8, b"bb"), 1 << 10);
        assert_eq!(b.len(), len, "written in place");
        assert_eq!(b.records().count(), 2);
        let found = b.find(b"hot").unwrap();
        assert_eq!((found.meta.cas, found.payload), (8, Payload::Inline(b"bb")));
        assert_eq!(b.records().last().unwrap().key, b"other", "the order kept");
        // A write without an ordered version (a client's) would lose the replaced one's
        // unseen: appended.
        let clients = Record {
            meta: Meta {
                cas: 5,
                client_cas: true,
                ..Meta::default()
            },
            ..at(0, b"cc")
        };
        assert_eq!(clients.encoded_len(), at(8, b"bb").encoded_len());
        b.append(&clients, 1 << 10);
        assert_eq!(b.records().count(), 3);
        // The buffer's last record goes for one of another length; a tombstone (no
        // version) over a version is appended.
        b.append(&at(9, b"dddd"), 1 << 10);
        assert_eq!(b.records().count(), 3);
        assert_eq!(b.find(b"hot").unwrap().payload, Payload::Inline(b"dddd"));
        b.append(&rec(b"hot", None), 1 << 10);
        assert_eq!(b.records().count(), 4);
        assert_eq!(b.find(b"hot").unwrap().payload, Payload::Tombstone);
        // Two writes without versions: the second over the first.
        b.append(&rec(b"plain", Some(b"1")), 1 << 10);
        b.append(&rec(b"plain", Some(b"2")), 1 << 10);
        assert_eq!(b.records().count(), 5);
        assert_eq!(b.find(b"plain").unwrap().payload, Payload::Inline(b"2"));
        // A medium value's pointer names a new blob slot: appended (the leaf takes back a
        // last one with its slot first, `Extras::make_way`).
        let pointer = |slot| Record {
            payload: Payload::Medium(slot),
            ..rec(b"doc", None)
        };
        b.append(&pointer(0), 1 << 10);
        b.append(&pointer(1), 1 << 10);
        assert_eq!(b.records().count(), 7);
        assert_eq!(b.cas_top(), 9);
    }

    /// A fill's buffer: 100 keys of medium values (pointer records) under a limit of
    /// 2 KiB. Every buffered key is found; of keys not buffered, the filter stops all but
    /// a few before any record is read.
    #[test]
    fn the_filter_finds_every_buffered_key_and_stops_most_others() {
        let mut b = WriteBuffer::default();
        let key = |i: u32| format!("key:{i:012}").into_bytes();
        for i in 0..100 {
            let k = key(i);
            let record = Record {
                key: &k,
                payload: Payload::Medium(i as u16),
                meta: Meta::default(),
            };
            b.append(&record, 2048);
        }
        assert_eq!(b.filter().len(), 64);
        for i in 0..100 {
            assert_eq!(b.find(&key(i)).unwrap().payload, Payload::Medium(i as u16));
        }
        let passed = (100..10_100).filter(|&i| b.may_hold(&key(i))).count();
        assert!(passed < 1_500, "{passed} of 10,000 absent keys passed");
        assert_eq!(
            (100..10_100).filter(|&i| b.find(&key(i)).is_some()).count(),
            0
        );
        let records = b.records().count();
        assert_eq!(records, 100, "the filter is not read as records");
        assert_eq!(
            b.len(),
            CAS_TOP.end() + b.run().len(),
            "the filter is not counted"
        );
    }

    /// A buffer grows once a record: the first takes exactly its bytes, and the vector
    /// never holds twice what it uses (a merge takes it at the limit).
    #[test]
    fn a_buffer_grows_once_a_record_and_holds_little_slack() {
        let mut b = WriteBuffer::default();
        let value = [b'x'; 64];
        let key = |i: u32| format!("key:{i:012}").into_bytes();
        let k = key(0);
        b.append(&rec(&k, Some(&value)), 256);
        assert_eq!(b.bytes.capacity(), b.bytes.len());
        for i in 1..3 {
            let k = key(i);
            let before = b.bytes.len();
            b.append(&rec(&k, Some(&value)), 256);
            assert!(
                b.bytes.capacity() < 2 * before + 100,
                "{}",
                b.bytes.capacity()
            );
        }
    }

    #[test]
    fn a_zero_limit_merges_every_write() {
        let mut b = WriteBuffer::default();
        assert_eq!(b.append(&rec(b"k", Some(b"1")), 0), Pressure::Overflowing);
    }
}
