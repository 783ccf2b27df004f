//! Object records as they sit inside a DRAM leaf page, a write buffer and an SSD sub-page,
//! and the individually compressed blobs of medium objects.
//!
//! ```text
//! record := key_len:u8 kind:u8 [value_len:varint] key [value | blob_slot:u16le]
//!           [expires_at_ms:u64le] [flags:u32le] [cas:u64le]
//! kind   := bits 0-1 payload (0 inline value, 1 medium pointer, 2 tombstone)
//!           bit 2 has expiry, bit 3 has flags, bit 4 has cas, bit 5 clean
//! ```
//! A zero `key_len` ends a sub-page (the rest is zero padding, which compresses away).
//! Metadata fields are present only when set, so a plain `put` pays nothing for them.
//! A medium pointer carries no metadata: it lives in the blob, which keeps the largest
//! pointer record (a 250 B key) inside one 256 B sub-page.

use crate::config::Config;

const PAYLOAD_MASK: u8 = 0b11;
const PAYLOAD_INLINE: u8 = 0;
const PAYLOAD_MEDIUM: u8 = 1;
const PAYLOAD_TOMBSTONE: u8 = 2;
const HAS_EXPIRY: u8 = 1 << 2;
const HAS_FLAGS: u8 = 1 << 3;
const HAS_CAS: u8 = 1 << 4;
const CLEAN: u8 = 1 << 5;
/// In a blob header: the value is stored as is because LZ4 would not shrink it.
const BLOB_RAW: u8 = 1 << 6;

/// Fixed bytes of every record: key length and kind byte.
pub const RECORD_HEADER: usize = 2;
/// Optional metadata: expiry (8), client flags (4), CAS (8).
pub const MAX_METADATA: usize = 8 + 4 + 8;
/// Bytes a medium pointer holds after the key: the blob slot.
pub const MEDIUM_POINTER: usize = 2;

/// The largest record that must fit in one DRAM sub-page.
pub fn max_inline_record(config: &Config) -> usize {
    let tiny = RECORD_HEADER + varint_len(config.tiny_max as u64) + config.tiny_max + MAX_METADATA;
    let medium_pointer = RECORD_HEADER + config.max_key_size + MEDIUM_POINTER;
    tiny.max(medium_pointer)
}

/// Per-object metadata beside the value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub expires_at_ms: Option<u64>,
    pub flags: u32,
    pub cas: u64,
    /// The object came from the SSD tier and has not changed since: evicting it again
    /// writes nothing.
    pub clean: bool,
}

impl Meta {
    fn bits(&self) -> u8 {
        let mut bits = 0;
        if self.expires_at_ms.is_some() {
            bits |= HAS_EXPIRY;
        }
        if self.flags != 0 {
            bits |= HAS_FLAGS;
        }
        if self.cas != 0 {
            bits |= HAS_CAS;
        }
        if self.clean {
            bits |= CLEAN;
        }
        bits
    }

    fn encoded_len(&self) -> usize {
        let bits = self.bits();
        (if bits & HAS_EXPIRY != 0 { 8 } else { 0 })
            + (if bits & HAS_FLAGS != 0 { 4 } else { 0 })
            + (if bits & HAS_CAS != 0 { 8 } else { 0 })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        if let Some(t) = self.expires_at_ms {
            out.extend_from_slice(&t.to_le_bytes());
        }
        if self.flags != 0 {
            out.extend_from_slice(&self.flags.to_le_bytes());
        }
        if self.cas != 0 {
            out.extend_from_slice(&self.cas.to_le_bytes());
        }
    }

    fn decode(bits: u8, r: &mut Reader<'_>) -> Option<Meta> {
        Some(Meta {
            expires_at_ms: if bits & HAS_EXPIRY != 0 {
                Some(r.u64()?)
            } else {
                None
            },
            flags: if bits & HAS_FLAGS != 0 { r.u32()? } else { 0 },
            cas: if bits & HAS_CAS != 0 { r.u64()? } else { 0 },
            clean: bits & CLEAN != 0,
        })
    }

    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|t| t <= now_ms)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload<'a> {
    Inline(&'a [u8]),
    /// Index of the object's compressed blob in its leaf's blob table.
    Medium(u16),
    Tombstone,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub key: &'a [u8],
    pub payload: Payload<'a>,
    pub meta: Meta,
}

impl<'a> Record<'a> {
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER
            + self.key.len()
            + match self.payload {
                Payload::Inline(v) => varint_len(v.len() as u64) + v.len(),
                Payload::Medium(_) => MEDIUM_POINTER,
                Payload::Tombstone => 0,
            }
            + self.meta.encoded_len()
    }

    /// Appends the record. Keys are at most 255 bytes (checked at the API boundary).
    pub fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!(!self.key.is_empty() && self.key.len() <= 255);
        let payload = match self.payload {
            Payload::Inline(_) => PAYLOAD_INLINE,
            Payload::Medium(_) => PAYLOAD_MEDIUM,
            Payload::Tombstone => PAYLOAD_TOMBSTONE,
        };
        out.push(self.key.len() as u8);
        out.push(payload | self.meta.bits());
        if let Payload::Inline(v) = self.payload {
            put_varint(out, v.len() as u64);
        }
        out.extend_from_slice(self.key);
        match self.payload {
            Payload::Inline(v) => out.extend_from_slice(v),
            Payload::Medium(slot) => out.extend_from_slice(&slot.to_le_bytes()),
            Payload::Tombstone => {}
        }
        self.meta.encode(out);
    }

    /// Parses one record at the start of `buf`. `None` at the zero terminator, at the end
    /// of the buffer, or on bytes that are not a well-formed record.
    pub fn parse(buf: &'a [u8]) -> Option<(Record<'a>, usize)> {
        let mut r = Reader { buf, pos: 0 };
        let key_len = r.u8()? as usize;
        if key_len == 0 {
            return None;
        }
        let kind = r.u8()?;
        let value_len = match kind & PAYLOAD_MASK {
            PAYLOAD_INLINE => Some(usize::try_from(r.varint()?).ok()?),
            PAYLOAD_MEDIUM | PAYLOAD_TOMBSTONE => None,
            _ => return None,
        };
        let key = r.take(key_len)?;
        let payload = match (kind & PAYLOAD_MASK, value_len) {
            (PAYLOAD_INLINE, Some(n)) => Payload::Inline(r.take(n)?),
            (PAYLOAD_MEDIUM, _) => Payload::Medium(u16::from_le_bytes(r.array()?)),
            _ => Payload::Tombstone,
        };
        let meta = Meta::decode(kind, &mut r)?;
        Some((Record { key, payload, meta }, r.pos))
    }
}

/// The records of a sub-page or buffer, in stored order, up to the terminator.
pub fn records(buf: &[u8]) -> impl Iterator<Item = Record<'_>> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let (record, used) = Record::parse(rest)?;
        rest = &rest[used..];
        Some(record)
    })
}

/// Compresses a medium object's value and metadata into its own blob.
pub fn encode_blob(value: &[u8], meta: &Meta) -> Box<[u8]> {
    let mut out = Vec::with_capacity(value.len() / 2 + 32);
    out.push(meta.bits());
    meta.encode(&mut out);
    put_varint(&mut out, value.len() as u64);
    let header = out.len();
    let compressed = lzzzz::lz4::compress_to_vec(value, &mut out, lzzzz::lz4::ACC_LEVEL_DEFAULT);
    if compressed.map_or(true, |n| n >= value.len()) {
        out.truncate(header);
        out[0] |= BLOB_RAW;
        out.extend_from_slice(value);
    }
    out.into_boxed_slice()
}

/// The metadata and value length of a blob, without decompressing its value.
pub fn blob_header(blob: &[u8]) -> Option<(Meta, usize)> {
    let mut r = Reader { buf: blob, pos: 0 };
    let bits = r.u8()?;
    let meta = Meta::decode(bits, &mut r)?;
    Some((meta, usize::try_from(r.varint()?).ok()?))
}

/// Decompresses a blob into its value and metadata; `None` if the blob is malformed.
pub fn decode_blob(blob: &[u8]) -> Option<(Vec<u8>, Meta)> {
    let mut r = Reader { buf: blob, pos: 0 };
    let bits = r.u8()?;
    let meta = Meta::decode(bits, &mut r)?;
    let len = usize::try_from(r.varint()?).ok()?;
    let data = &blob[r.pos..];
    if bits & BLOB_RAW != 0 {
        return (data.len() == len).then(|| (data.to_vec(), meta));
    }
    // LZ4 expands at most ~255×; a larger claimed length is corruption, not a reason to
    // allocate gigabytes.
    if len > data.len().saturating_mul(255) + 16 {
        return None;
    }
    let mut value = vec![0; len];
    match lzzzz::lz4::decompress(data, &mut value) {
        Ok(n) if n == len => Some((value, meta)),
        _ => None,
    }
}

pub fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bounds-checked reading: malformed bytes end in `None`, never in a panic.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let bytes = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(bytes)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.array()?))
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn meta_strategy() -> impl Strategy<Value = Meta> {
        (
            proptest::option::of(any::<u64>()),
            any::<u32>(),
            any::<u64>(),
            any::<bool>(),
        )
            .prop_map(|(expires_at_ms, flags, cas, clean)| Meta {
                expires_at_ms,
                flags,
                cas,
                clean,
            })
    }

    proptest! {
        #[test]
        fn records_round_trip(
            key in proptest::collection::vec(any::<u8>(), 1..=255),
            value in proptest::collection::vec(any::<u8>(), 0..300),
            kind in 0u8..3,
            slot in any::<u16>(),
            meta in meta_strategy(),
        ) {
            let payload = match kind {
                0 => Payload::Inline(&value),
                1 => Payload::Medium(slot),
                _ => Payload::Tombstone,
            };
            let rec = Record { key: &key, payload, meta };
            let mut buf = Vec::new();
            rec.encode(&mut buf);
            prop_assert_eq!(buf.len(), rec.encoded_len());
            buf.extend_from_slice(&[0, 0, 0]);
            let (parsed, used) = Record::parse(&buf).unwrap();
            prop_assert_eq!(parsed, rec);
            prop_assert_eq!(used, rec.encoded_len());
        }

        #[test]
        fn parsing_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = records(&bytes).count();
            let _ = decode_blob(&bytes);
        }

        #[test]
        fn blobs_round_trip(value in proptest::collection::vec(0u8..4, 0..3000), meta in meta_strategy()) {
            let blob = encode_blob(&value, &meta);
            let (v, m) = decode_blob(&blob).unwrap();
            prop_assert_eq!(&v, &value);
            prop_assert_eq!(m, meta);
            prop_assert_eq!(blob_header(&blob).unwrap(), (meta, value.len()));
        }
    }

    #[test]
    fn terminator_ends_a_subpage() {
        let mut buf = Vec::new();
        Record {
            key: b"a",
            payload: Payload::Inline(b"1"),
            meta: Meta::default(),
        }
        .encode(&mut buf);
        Record {
            key: b"b",
            payload: Payload::Tombstone,
            meta: Meta::default(),
        }
        .encode(&mut buf);
        buf.resize(64, 0);
        let keys: Vec<_> = records(&buf).map(|r| r.key.to_vec()).collect();
        assert_eq!(keys, vec![b"a".to_vec(), b"b".to_vec()]);
    }
}
