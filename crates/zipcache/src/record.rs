//! Object records as they sit inside a DRAM leaf page, a write buffer and an SSD sub-page,
//! and the individually compressed blobs of medium objects: their layouts are
//! `format/record.rs` and `format/blob.rs`.
//!
//! A zero `key_len` ends a run of records (a buffer's spare capacity, a damaged page).
//! Metadata fields are present only when set, so a plain `put` pays nothing for them, and
//! they are varints, so small flags take one byte. A CAS version is stored as its distance
//! from a base kept once by the container of the run (a DRAM page's header, an SSD block's
//! header; 0 in a write buffer): versions come from one counter, so the objects of one
//! page lie close together and a delta takes a byte or two where the version takes eight.
//! The metadata sits between the key and the value, not after the value: a key's last
//! bytes differ from its neighbours' and LZ4 stores them as literals, so the varying
//! metadata bytes join that run; behind a value they would cut the match that often runs
//! from one value's tail through the next record's header and key prefix, which costs a
//! new LZ4 sequence (token and offset) per record.
//! A medium pointer in a page carries no metadata: it lives in the blob. In a write
//! buffer it carries a copy, which merges read instead of the blob's header.

use std::cell::RefCell;

use crate::dictionary::Dictionary;
use crate::format::blob::{
    BITS, BLOB_CODEC, BLOB_DICTIONARY, BLOB_HOT, BLOB_LZ4, BLOB_RAW, DICTIONARY_ID,
};
use crate::format::record::{
    CLEAN, CLIENT_CAS, COLLECTION, HAS_CAS, HAS_EXPIRY, HAS_FLAGS, MAX_METADATA, MEDIUM_POINTER,
    PAYLOAD_INLINE, PAYLOAD_MASK, PAYLOAD_MEDIUM, PAYLOAD_TOMBSTONE, RECORD_HEADER,
};
/// A decoded length a blob of `stored` bytes may claim: LZ4 and zstd expand at most
/// ~255× (zstd with a dictionary may do more, so up to 64 KiB is always taken); a larger
/// claim is damage, not a reason to allocate gigabytes.
fn plausible(len: usize, stored: usize) -> bool {
    len <= stored.saturating_mul(255) + 16 || len <= 1 << 16
}

/// The largest record that must fit in one DRAM page: a tiny object of `tiny_max` bytes
/// with its metadata, or a medium pointer with a key of `max_key_size` bytes.
pub fn max_inline_record(tiny_max: usize, max_key_size: usize) -> usize {
    let tiny = RECORD_HEADER + varint_len(tiny_max as u64) + tiny_max + MAX_METADATA;
    let medium_pointer = RECORD_HEADER + max_key_size + MEDIUM_POINTER;
    tiny.max(medium_pointer)
}

/// What the CAS versions of a run of records are stored relative to: the smallest version
/// among them, kept once by the run's container. 0 (versions stored whole) where no
/// container keeps one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CasBase(pub u64);

impl CasBase {
    /// The base that makes every delta of `records` as short as it gets.
    pub fn of<'r, 'a: 'r>(records: impl IntoIterator<Item = &'r Record<'a>>) -> CasBase {
        Self::of_versions(records.into_iter().map(|r| r.meta.cas))
    }

    /// `of` for the versions alone (0 for none).
    pub fn of_versions(versions: impl IntoIterator<Item = u64>) -> CasBase {
        CasBase(
            versions
                .into_iter()
                .filter(|&cas| cas != 0)
                .min()
                .unwrap_or(0),
        )
    }

    /// A version as stored. Wrapping, so a version below the base (never written by the
    /// containers, which take the minimum) still round-trips, only longer.
    fn delta(self, cas: u64) -> u64 {
        cas.wrapping_sub(self.0)
    }
}

/// `Meta::cas` of a write that asks the DRAM tier for a new CAS version (never stored).
pub const ASSIGN_CAS: u64 = u64::MAX;

/// Per-object metadata beside the value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub expires_at_ms: Option<u64>,
    pub flags: u32,
    pub cas: u64,
    /// The object came from the SSD tier and has not changed since: evicting it again
    /// writes nothing.
    pub clean: bool,
    /// `cas` was chosen by the client (memcached meta `E`), not assigned: it may be any
    /// number, so the engine's version ordering leaves it out (`ordered_cas`).
    pub client_cas: bool,
    /// The value is a collection's header (a Redis hash's), not a string's bytes
    /// (`PutOptions::collection`). Never set on a large object: BT_LO does not keep it.
    pub collection: bool,
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
            if self.client_cas {
                bits |= CLIENT_CAS;
            }
        }
        if self.clean {
            bits |= CLEAN;
        }
        if self.collection {
            bits |= COLLECTION;
        }
        bits
    }

    fn encoded_len(&self, base: CasBase) -> usize {
        self.expires_at_ms.map_or(0, varint_len)
            + if self.flags != 0 {
                varint_len(u64::from(self.flags))
            } else {
                0
            }
            + if self.cas != 0 {
                varint_len(base.delta(self.cas))
            } else {
                0
            }
    }

    fn encode(&self, out: &mut Vec<u8>, base: CasBase) {
        if let Some(t) = self.expires_at_ms {
            put_varint(out, t);
        }
        if self.flags != 0 {
            put_varint(out, u64::from(self.flags));
        }
        if self.cas != 0 {
            put_varint(out, base.delta(self.cas));
        }
    }

    fn decode(bits: u8, r: &mut Reader<'_>, base: CasBase) -> Option<Meta> {
        Some(Meta {
            expires_at_ms: if bits & HAS_EXPIRY != 0 {
                Some(r.varint()?)
            } else {
                None
            },
            flags: if bits & HAS_FLAGS != 0 {
                u32::try_from(r.varint()?).ok()?
            } else {
                0
            },
            cas: if bits & HAS_CAS != 0 {
                base.0.wrapping_add(r.varint()?)
            } else {
                0
            },
            clean: bits & CLEAN != 0,
            client_cas: bits & CLIENT_CAS != 0 && bits & HAS_CAS != 0,
            collection: bits & COLLECTION != 0,
        })
    }

    /// The version as the engine orders versions: a client's choice counts as none. The
    /// versions the engine assigns each lie above every assigned one before them (see
    /// `DramTier::next_cas`); a client may choose `u64::MAX`, above which nothing lies, so
    /// its choices stay out of that reckoning (distinct from them is the client's
    /// business, as in memcached).
    pub fn ordered_cas(&self) -> u64 {
        if self.client_cas { 0 } else { self.cas }
    }

    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|t| t <= now_ms)
    }

    /// This metadata with `cas` in place of a request for a new version.
    pub fn assigning(self, cas: u64) -> Meta {
        if self.cas == ASSIGN_CAS && !self.client_cas {
            Meta { cas, ..self }
        } else {
            self
        }
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
    /// Encoded length with the CAS version stored whole: never less than with any base.
    pub fn encoded_len(&self) -> usize {
        self.encoded_len_in(CasBase::default())
    }

    /// Encoded length in a run whose CAS versions are stored relative to `base`.
    pub fn encoded_len_in(&self, base: CasBase) -> usize {
        RECORD_HEADER
            + self.key.len()
            + match self.payload {
                Payload::Inline(v) => varint_len(v.len() as u64) + v.len(),
                Payload::Medium(_) => MEDIUM_POINTER,
                Payload::Tombstone => 0,
            }
            + self.meta.encoded_len(base)
    }

    /// Appends the record with its CAS version stored whole (a write buffer's way).
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_in(out, CasBase::default());
    }

    /// Appends the record to a run whose CAS versions are stored relative to `base`.
    /// Keys are at most 255 bytes (checked at the API boundary).
    pub fn encode_in(&self, out: &mut Vec<u8>, base: CasBase) {
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
        self.meta.encode(out, base);
        match self.payload {
            Payload::Inline(v) => out.extend_from_slice(v),
            Payload::Medium(slot) => out.extend_from_slice(&slot.to_le_bytes()),
            Payload::Tombstone => {}
        }
    }

    /// Parses one record, CAS stored whole, at the start of `buf`. `None` at the zero
    /// terminator, at the end of the buffer, or on bytes that are not a well-formed record.
    pub fn parse(buf: &'a [u8]) -> Option<(Record<'a>, usize)> {
        Self::parse_in(buf, CasBase::default())
    }

    /// `parse` for a run whose CAS versions are stored relative to `base`.
    pub fn parse_in(buf: &'a [u8], base: CasBase) -> Option<(Record<'a>, usize)> {
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
        let meta = Meta::decode(kind, &mut r, base)?;
        let payload = match (kind & PAYLOAD_MASK, value_len) {
            (PAYLOAD_INLINE, Some(n)) => Payload::Inline(r.take(n)?),
            (PAYLOAD_MEDIUM, _) => Payload::Medium(u16::from_le_bytes(r.array()?)),
            _ => Payload::Tombstone,
        };
        Some((Record { key, payload, meta }, r.pos))
    }
}

/// The key of the record at the start of `buf` and the record's length, its metadata
/// skipped rather than decoded: a scan for one key passes the others this way.
pub fn key_and_len(buf: &[u8]) -> Option<(&[u8], usize)> {
    kind_key_and_len(buf).map(|(_, key, len)| (key, len))
}

/// Whether a record of `kind` (its second byte) holds its value inline and never
/// expires: a page merged again keeps such a record as it is, unless it is replaced.
pub fn lasting_inline(kind: u8) -> bool {
    kind & PAYLOAD_MASK == PAYLOAD_INLINE && kind & HAS_EXPIRY == 0
}

/// `key_and_len`, with the record's kind byte (payload and metadata bits) in front.
pub fn kind_key_and_len(buf: &[u8]) -> Option<(u8, &[u8], usize)> {
    let mut r = Reader { buf, pos: 0 };
    let key_len = r.u8()? as usize;
    if key_len == 0 {
        return None;
    }
    let kind = r.u8()?;
    let payload_len = match kind & PAYLOAD_MASK {
        PAYLOAD_INLINE => usize::try_from(r.varint()?).ok()?,
        PAYLOAD_MEDIUM => MEDIUM_POINTER,
        PAYLOAD_TOMBSTONE => 0,
        _ => return None,
    };
    let key = r.take(key_len)?;
    for field in [HAS_EXPIRY, HAS_FLAGS, HAS_CAS] {
        if kind & field != 0 {
            r.varint()?;
        }
    }
    r.take(payload_len)?;
    Some((kind, key, r.pos))
}

/// The records of a run whose CAS versions are stored whole (a write buffer), in stored
/// order, up to the terminator.
pub fn records(buf: &[u8]) -> impl Iterator<Item = Record<'_>> {
    records_in(buf, CasBase::default())
}

/// `records` for a run whose CAS versions are stored relative to `base`.
pub fn records_in(buf: &[u8], base: CasBase) -> impl Iterator<Item = Record<'_>> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let (record, used) = Record::parse_in(rest, base)?;
        rest = &rest[used..];
        Some(record)
    })
}

/// How a medium value is stored: the smallest of LZ4, zstd with `dictionary`, and the
/// value as is.
enum Stored {
    Raw,
    Lz4,
    Dictionary(u8),
}

impl Stored {
    /// With a dictionary, zstd alone where it shrinks the value (it does, by far more
    /// than LZ4, on the values a dictionary was trained on: compressing with both cost a
    /// third of the fill rate), LZ4 where it does not; without one, LZ4. The compressed
    /// bytes go to `compressed` (cleared first).
    fn of(value: &[u8], dictionary: Option<&Dictionary>, compressed: &mut Vec<u8>) -> Stored {
        compressed.clear();
        if let Some(d) = dictionary {
            if let Some(n) = d.compress(value, compressed)
                && n < value.len()
                && plausible(value.len(), n)
            {
                return Stored::Dictionary(d.id());
            }
            compressed.clear();
        }
        match lzzzz::lz4::compress_to_vec(value, compressed, lzzzz::lz4::ACC_LEVEL_DEFAULT) {
            Ok(n) if n < value.len() && plausible(value.len(), n) => Stored::Lz4,
            _ => Stored::Raw,
        }
    }

    /// The blob's codec bits and dictionary id (0 for none).
    fn codec(&self) -> (u8, u8) {
        match self {
            Stored::Raw => (BLOB_RAW, 0),
            Stored::Lz4 => (BLOB_LZ4, 0),
            Stored::Dictionary(id) => (BLOB_DICTIONARY, *id),
        }
    }

    fn data<'a>(&self, value: &'a [u8], compressed: &'a [u8]) -> &'a [u8] {
        match self {
            Stored::Raw => value,
            Stored::Lz4 | Stored::Dictionary(_) => compressed,
        }
    }
}

thread_local! {
    /// A medium value compressed, and its blob, while it is encoded: reused, so that
    /// encoding allocates nothing (a PUT's blob is then copied into its `Block` alone).
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Bytes a medium value takes in its blob (not counting the header) when compressed with
/// `dictionary` where that wins.
pub fn stored_len(value: &[u8], dictionary: Option<&Dictionary>) -> usize {
    SCRATCH.with_borrow_mut(|(compressed, _)| {
        Stored::of(value, dictionary, compressed)
            .data(value, compressed)
            .len()
    })
}

/// Compresses a medium object's value and metadata into its own blob
/// (`format/blob.rs`): with `dictionary` where that beats LZ4 alone, and the value as is
/// where neither shrinks it.
///
/// The blob is handed to `keep` (which must not encode another) in this thread's
/// scratch, not in a `Vec` of its own.
pub fn encode_blob_with<R>(
    value: &[u8],
    meta: &Meta,
    dictionary: Option<&Dictionary>,
    keep: impl FnOnce(&[u8]) -> R,
) -> R {
    SCRATCH.with_borrow_mut(|(compressed, out)| {
        let stored = Stored::of(value, dictionary, compressed);
        let (codec, id) = stored.codec();
        put_blob(
            out,
            codec,
            id,
            meta,
            value.len(),
            stored.data(value, compressed),
        );
        keep(out)
    })
}

/// A medium object's blob with its value stored as is, for a hot leaf (`BLOB_HOT`),
/// handed to `keep` as in `encode_blob_with`.
pub fn hot_blob_with<R>(value: &[u8], meta: &Meta, keep: impl FnOnce(&[u8]) -> R) -> R {
    SCRATCH.with_borrow_mut(|(_, out)| {
        put_blob(out, BLOB_HOT, 0, meta, value.len(), value);
        keep(out)
    })
}

/// Whether a blob is stored as is for its hot leaf (`hot_blob_with`).
pub fn is_hot_blob(blob: &[u8]) -> bool {
    blob.first()
        .is_some_and(|bits| bits & BLOB_CODEC == BLOB_HOT)
}

/// Whether a blob's value is compressed (LZ4, or zstd with a dictionary).
pub fn is_compressed_blob(blob: &[u8]) -> bool {
    blob.first()
        .is_some_and(|bits| matches!(bits & BLOB_CODEC, BLOB_LZ4 | BLOB_DICTIONARY))
}

/// The bytes `blob` would take stored as is for a hot leaf: its header (without a
/// dictionary id) and its value's length.
pub fn hot_blob_len(blob: &[u8]) -> Option<usize> {
    let (_, dictionary, _, len, start) = parse_blob_header(blob)?;
    Some(start - usize::from(dictionary != 0) + len)
}

/// A medium value compressed ahead of its blob's header, whose metadata (a CAS version)
/// a write learns only under its leaf's lock: a PUT compresses before it takes the lock,
/// so that writers of one leaf (a fill's keys in order all land in the last one) do not
/// queue behind each other's compression.
pub struct Compressed {
    stored: Stored,
    /// Empty where the value is stored as it is.
    data: Vec<u8>,
}

impl Compressed {
    /// `value` compressed as `encode_blob_with` would with `dictionary`.
    pub fn of(value: &[u8], dictionary: Option<&Dictionary>) -> Compressed {
        let mut data = Vec::new();
        let stored = Stored::of(value, dictionary, &mut data);
        if matches!(stored, Stored::Raw) {
            data = Vec::new();
        }
        Compressed { stored, data }
    }

    /// The blob of `value`, the value compressed, with `meta`: what `encode_blob_with`
    /// makes, handed to `keep` as there.
    pub fn blob_with<R>(&self, value: &[u8], meta: &Meta, keep: impl FnOnce(&[u8]) -> R) -> R {
        SCRATCH.with_borrow_mut(|(_, out)| {
            let (codec, id) = self.stored.codec();
            put_blob(
                out,
                codec,
                id,
                meta,
                value.len(),
                self.stored.data(value, &self.data),
            );
            keep(out)
        })
    }
}

/// Writes a blob into `out` (cleared first): its header — the `codec` bits with `meta`'s,
/// the `dictionary` id for `BLOB_DICTIONARY`, `meta`, the value's length `len` — then
/// its `data`.
fn put_blob(out: &mut Vec<u8>, codec: u8, dictionary: u8, meta: &Meta, len: usize, data: &[u8]) {
    out.clear();
    out.push(meta.bits() | codec);
    if codec == BLOB_DICTIONARY {
        out.push(dictionary);
    }
    meta.encode(out, CasBase::default());
    put_varint(out, len as u64);
    out.extend_from_slice(data);
}

/// A blob's header: codec bits, dictionary id (0 for none), metadata, value length,
/// and where its data starts.
fn parse_blob_header(blob: &[u8]) -> Option<(u8, u8, Meta, usize, usize)> {
    let dictionary = blob_dictionary(blob)?;
    let mut r = Reader {
        buf: blob,
        pos: DICTIONARY_ID + usize::from(dictionary != 0),
    };
    let bits = blob[BITS];
    let meta = Meta::decode(bits, &mut r, CasBase::default())?;
    let len = usize::try_from(r.varint()?).ok()?;
    Some((bits, dictionary, meta, len, r.pos))
}

/// A blob of the same value with metadata `meta`: the header written anew, the data
/// (compressed or not) copied as it is, so a change of metadata alone (a TTL set, a
/// touch) costs a copy rather than a compression. Handed to `keep` as in
/// `encode_blob_with`; `None` if `blob` is malformed.
pub fn reheader_blob_with<R>(blob: &[u8], meta: &Meta, keep: impl FnOnce(&[u8]) -> R) -> Option<R> {
    let (bits, dictionary, _, len, start) = parse_blob_header(blob)?;
    SCRATCH.with_borrow_mut(|(_, out)| {
        put_blob(
            out,
            bits & BLOB_CODEC,
            dictionary,
            meta,
            len,
            &blob[start..],
        );
        Some(keep(out))
    })
}

/// A blob's data: its value as stored (compressed or not), after the header.
#[cfg(test)]
pub fn blob_data(blob: &[u8]) -> Option<&[u8]> {
    parse_blob_header(blob).map(|(.., start)| &blob[start..])
}

/// `encode_blob_with`, the blob in a `Vec`.
#[cfg(test)]
pub fn encode_blob(value: &[u8], meta: &Meta, dictionary: Option<&Dictionary>) -> Vec<u8> {
    encode_blob_with(value, meta, dictionary, <[u8]>::to_vec)
}

/// The metadata and value length of a blob, without decompressing its value.
pub fn blob_header(blob: &[u8]) -> Option<(Meta, usize)> {
    parse_blob_header(blob).map(|(_, _, meta, len, _)| (meta, len))
}

/// The id of the dictionary a blob was compressed with, 0 for none, from its first
/// bytes alone (a merge asks of every blob it keeps).
pub fn blob_dictionary(blob: &[u8]) -> Option<u8> {
    match blob.get(BITS)? & BLOB_CODEC {
        BLOB_LZ4 | BLOB_RAW | BLOB_HOT => Some(0),
        BLOB_DICTIONARY => blob.get(DICTIONARY_ID).copied().filter(|&id| id != 0),
        _ => None,
    }
}

/// Decompresses a blob into its value and metadata; `None` if the blob is malformed, or
/// names a dictionary other than `dictionary` (the one its leaf holds), or does not
/// decode with it.
pub fn decode_blob(blob: &[u8], dictionary: Option<&Dictionary>) -> Option<(Vec<u8>, Meta)> {
    let (bits, id, meta, len, start) = parse_blob_header(blob)?;
    let data = &blob[start..];
    if matches!(bits & BLOB_CODEC, BLOB_RAW | BLOB_HOT) {
        return (data.len() == len).then(|| (data.to_vec(), meta));
    }
    if !plausible(len, data.len()) {
        return None;
    }
    if id != 0 {
        let dictionary = dictionary.filter(|d| d.id() == id)?;
        return dictionary.decompress(data, len).map(|value| (value, meta));
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

/// A varint at the start of `buf` and its length; `None` if it is cut short or too long.
pub fn read_varint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut r = Reader { buf, pos: 0 };
    let v = r.varint()?;
    Some((v, r.pos))
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
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

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            // The tenth group holds the top bit alone; more would not fit a u64.
            if shift == 63 && b > 1 {
                return None;
            }
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
    use crate::format::record::MAX_VARINT;
    use proptest::prelude::*;

    /// A value compressed ahead of its metadata (`Compressed`) makes the blob that
    /// `encode_blob_with` makes, byte for byte: with a dictionary, with LZ4 alone, and
    /// as it is.
    #[test]
    fn a_blob_compressed_ahead_is_the_blob_encoded_at_once() {
        let memory = std::sync::Arc::new(crate::memory::Memory::default());
        let dictionary = crate::dictionary::tests::trained(1, 0, memory);
        let random: Vec<u8> = (0..700u64)
            .map(|i| crate::dictionary::training::mix(i) as u8)
            .collect();
        let values = [
            crate::dictionary::tests::documents(0, 3, 700),
            b"abc".repeat(300),
            random,
        ];
        let meta = Meta {
            cas: 300,
            flags: 7,
            expires_at_ms: Some(1 << 40),
            ..Meta::default()
        };
        let mut codecs = Vec::new();
        for value in &values {
            for d in [Some(&*dictionary), None] {
                let at_once = encode_blob_with(value, &meta, d, <[u8]>::to_vec);
                let ahead = Compressed::of(value, d).blob_with(value, &meta, <[u8]>::to_vec);
                assert_eq!(ahead, at_once);
                assert_eq!(decode_blob(&ahead, d).map(|(v, _)| v).as_ref(), Some(value));
                codecs.push(ahead[BITS] & BLOB_CODEC);
            }
        }
        for codec in [BLOB_DICTIONARY, BLOB_LZ4, BLOB_RAW] {
            assert!(codecs.contains(&codec), "{codec} in {codecs:?}");
        }
    }

    /// Lengths on both sides of every varint boundary a value length can cross in a page.
    fn boundary_len() -> impl Strategy<Value = usize> {
        prop_oneof![
            Just(0usize),
            Just(1),
            Just(127),
            Just(128),
            Just(129),
            Just(16_383),
            Just(16_384),
            0usize..300,
        ]
    }

    /// Metadata with each field present or absent, values at varint boundaries, CAS
    /// versions at, near and below the run's base, and a collection's header or a string.
    fn boundary_meta(base: u64) -> impl Strategy<Value = Meta> {
        let number = prop_oneof![
            Just(1u64),
            Just(127),
            Just(128),
            Just(u64::from(u32::MAX)),
            Just(u64::MAX),
            any::<u64>(),
        ];
        let cas = prop_oneof![
            Just(0u64),
            Just(base.max(1)),
            Just(base.wrapping_add(127).max(1)),
            Just(base.wrapping_add(128).max(1)),
            Just(base.wrapping_sub(1).max(1)),
            any::<u64>(),
        ];
        (
            proptest::option::of(number.clone()),
            prop_oneof![
                Just(0u32),
                Just(127),
                Just(128),
                Just(u32::MAX),
                any::<u32>()
            ],
            cas,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                |(expires_at_ms, flags, cas, clean, client, collection)| Meta {
                    expires_at_ms,
                    flags,
                    cas,
                    clean,
                    // Only a version can be the client's.
                    client_cas: client && cas != 0,
                    collection,
                },
            )
    }

    /// Every field, byte by byte: this is the format of DRAM pages, write buffers and SSD
    /// blocks (`docs/FORMAT.md`).
    #[test]
    fn the_record_layout_is_pinned() {
        let meta = Meta {
            expires_at_ms: Some(300),
            flags: 5,
            cas: 1_000_130,
            clean: true,
            client_cas: false,
            collection: false,
        };
        let rec = Record {
            key: b"ab",
            payload: Payload::Inline(&[7; 130]),
            meta,
        };
        let mut buf = Vec::new();
        rec.encode_in(&mut buf, CasBase(1_000_000));
        let mut want = vec![
            2,           // key length
            0b0011_1100, // inline | expiry | flags | cas | clean
            0x82,
            0x01, // value length 130, LEB128
            b'a',
            b'b',
        ];
        want.extend_from_slice(&[0xac, 0x02]); // expiry 300
        want.push(5); // flags
        want.extend_from_slice(&[0x82, 0x01]); // cas - base = 130
        want.extend_from_slice(&[7; 130]);
        assert_eq!(buf, want);
        assert_eq!(rec.encoded_len_in(CasBase(1_000_000)), want.len());

        // Nothing optional: four bytes of overhead for a short value.
        let plain = Record {
            key: b"k",
            payload: Payload::Inline(b"v"),
            meta: Meta::default(),
        };
        let mut buf = Vec::new();
        plain.encode(&mut buf);
        assert_eq!(buf, [1, 0, 1, b'k', b'v']);

        // A medium pointer and a tombstone.
        let mut buf = Vec::new();
        Record {
            key: b"m",
            payload: Payload::Medium(0x0102),
            meta: Meta::default(),
        }
        .encode(&mut buf);
        Record {
            key: b"t",
            payload: Payload::Tombstone,
            meta: Meta::default(),
        }
        .encode(&mut buf);
        assert_eq!(buf, [1, 1, b'm', 0x02, 0x01, 1, 2, b't']);

        // Without a base the version is stored whole.
        let mut buf = Vec::new();
        Record {
            key: b"c",
            payload: Payload::Tombstone,
            meta: Meta {
                cas: 300,
                ..Meta::default()
            },
        }
        .encode(&mut buf);
        assert_eq!(buf, [1, 0b1_0010, b'c', 0xac, 0x02]);

        // A version the client chose: bit 7 besides bit 4.
        let mut buf = Vec::new();
        let chosen = Meta {
            cas: u64::MAX,
            client_cas: true,
            ..Meta::default()
        };
        Record {
            key: b"c",
            payload: Payload::Tombstone,
            meta: chosen,
        }
        .encode(&mut buf);
        assert_eq!(buf[..3], [1, 0b1001_0010, b'c']);
        let (back, _) = Record::parse(&buf).expect("decodes");
        assert_eq!((back.meta, back.meta.ordered_cas()), (chosen, 0));

        // A collection's header: bit 6, beside the others.
        let mut buf = Vec::new();
        let header = Meta {
            cas: 300,
            client_cas: true,
            collection: true,
            ..Meta::default()
        };
        Record {
            key: b"h",
            payload: Payload::Inline(b"v"),
            meta: header,
        }
        .encode(&mut buf);
        assert_eq!(buf, [1, 0b1101_0000, 1, b'h', 0xac, 0x02, b'v']);
        let (back, _) = Record::parse(&buf).expect("decodes");
        assert_eq!(back.meta, header);
        let string = Meta {
            collection: false,
            ..header
        };
        buf[1] &= !COLLECTION;
        assert_eq!(Record::parse(&buf).expect("decodes").0.meta, string);
    }

    /// A medium object's blob carries the bit in its first byte as a record's kind does,
    /// whichever way the value is stored; the codec stays in bits 0-1.
    #[test]
    fn a_blob_keeps_the_collection_bit_apart_from_its_codec() {
        let header = Meta {
            collection: true,
            ..Meta::default()
        };
        let compressible = vec![b'x'; 600];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let incompressible: Vec<u8> = (0..600)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 56) as u8
            })
            .collect();
        for (value, codec) in [(&compressible, BLOB_LZ4), (&incompressible, BLOB_RAW)] {
            for meta in [header, Meta::default()] {
                let blob = encode_blob(value, &meta, None);
                assert_eq!(blob[BITS] & BLOB_CODEC, codec);
                assert_eq!(blob[BITS] & COLLECTION != 0, meta.collection);
                assert_eq!(blob_dictionary(&blob), Some(0));
                assert_eq!(decode_blob(&blob, None), Some((value.clone(), meta)));
                assert_eq!(blob_header(&blob), Some((meta, value.len())));
            }
        }
    }

    /// A blob stored as is for a hot leaf decodes to its value and metadata without a
    /// dictionary, names none, and is as long as `hot_blob_len` says of the same value's
    /// compressed blob; only the compressed one counts as compressed.
    #[test]
    fn a_hot_blob_holds_its_value_as_is() {
        let meta = Meta {
            expires_at_ms: Some(1_234_567),
            collection: true,
            ..Meta::default()
        };
        let value = b"{\"user\":\"ada\",\"cart\":[1,2,3]}".repeat(20);
        let hot = hot_blob_with(&value, &meta, <[u8]>::to_vec);
        let compressed = encode_blob(&value, &meta, None);
        assert!(is_hot_blob(&hot) && !is_compressed_blob(&hot));
        assert!(is_compressed_blob(&compressed) && !is_hot_blob(&compressed));
        assert_eq!(blob_dictionary(&hot), Some(0));
        assert_eq!(decode_blob(&hot, None), Some((value.clone(), meta)));
        assert_eq!(blob_header(&hot), Some((meta, value.len())));
        assert_eq!(hot_blob_len(&compressed), Some(hot.len()));
        assert_eq!(hot_blob_len(&hot), Some(hot.len()));
        // Cut short, it is damaged, not a shorter value.
        assert_eq!(decode_blob(&hot[..hot.len() - 1], None), None);
    }

    /// Re-headed, a blob decodes to the same value with the new metadata, whichever way
    /// it was stored (raw, LZ4, a dictionary), and its data is the same bytes.
    #[test]
    fn a_blob_reheadered_keeps_its_data_and_takes_the_new_metadata() {
        use crate::dictionary::tests::{documents, trained};
        let dictionary = trained(1, 0, Default::default());
        let document = documents(0, 7, 700);
        let noise: Vec<u8> = (0..700u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let old = Meta {
            expires_at_ms: Some(5_000),
            flags: 7,
            ..Meta::default()
        };
        let new = Meta {
            expires_at_ms: Some(90_000_000),
            collection: true,
            cas: 41,
            ..Meta::default()
        };
        for (value, with) in [
            (&document, Some(&*dictionary)),
            (&document, None),
            (&noise, None),
        ] {
            let blob = encode_blob(value, &old, with);
            assert_eq!(blob_dictionary(&blob) != Some(0), with.is_some());
            let again = reheader_blob_with(&blob, &new, <[u8]>::to_vec).expect("well formed");
            assert_eq!(decode_blob(&again, with), Some((value.clone(), new)));
            assert_eq!(again[BITS] & BLOB_CODEC, blob[BITS] & BLOB_CODEC);
            assert_eq!(blob_dictionary(&again), blob_dictionary(&blob));
            assert_eq!(
                blob_data(&again),
                blob_data(&blob),
                "the data is copied, not compressed again"
            );
        }
        assert_eq!(reheader_blob_with(&[0xff], &new, <[u8]>::to_vec), None);
    }

    #[test]
    fn the_base_is_the_smallest_version_present() {
        let recs = [0, 90, 70, 0].map(|cas| Record {
            key: b"k",
            payload: Payload::Tombstone,
            meta: Meta {
                cas,
                ..Meta::default()
            },
        });
        assert_eq!(CasBase::of(&recs), CasBase(70));
        assert_eq!(CasBase::of(&recs[..1]), CasBase(0));
    }

    proptest! {
        #[test]
        fn records_round_trip(
            key_len in prop_oneof![Just(1usize), Just(255), 1usize..=255],
            value_len in boundary_len(),
            kind in 0u8..3,
            slot in any::<u16>(),
            (base, meta) in any::<u64>().prop_flat_map(|b| (Just(b), boundary_meta(b))),
        ) {
            let key = vec![b'k'; key_len];
            let value: Vec<u8> = (0..value_len).map(|i| i as u8).collect();
            let payload = match kind {
                0 => Payload::Inline(&value),
                1 => Payload::Medium(slot),
                _ => Payload::Tombstone,
            };
            let rec = Record { key: &key, payload, meta };
            let base = CasBase(base);
            let mut buf = Vec::new();
            rec.encode_in(&mut buf, base);
            prop_assert_eq!(buf.len(), rec.encoded_len_in(base));
            prop_assert!(rec.encoded_len_in(base) <= rec.encoded_len() || base.delta(meta.cas) > meta.cas);
            // Any strict prefix is an error, never a record.
            for cut in [0, 1, 2, buf.len() / 2, buf.len() - 1] {
                prop_assert!(Record::parse_in(&buf[..cut], base).is_none(), "cut at {}", cut);
            }
            buf.extend_from_slice(&[0, 0, 0]);
            let (parsed, used) = Record::parse_in(&buf, base).unwrap();
            prop_assert_eq!(parsed, rec);
            prop_assert_eq!(used, rec.encoded_len_in(base));
            prop_assert_eq!(key_and_len(&buf), Some((&key[..], used)));
            prop_assert_eq!(records_in(&buf, base).count(), 1);
        }

        #[test]
        fn parsing_garbage_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            base in any::<u64>(),
        ) {
            let _ = records_in(&bytes, CasBase(base)).count();
            let _ = decode_blob(&bytes, None);
            let _ = blob_header(&bytes);
            let _ = read_varint(&bytes);
        }

        #[test]
        fn blobs_round_trip(value in proptest::collection::vec(0u8..4, 0..3000), meta in boundary_meta(0)) {
            let blob = encode_blob(&value, &meta, None);
            let (v, m) = decode_blob(&blob, None).unwrap();
            prop_assert_eq!(&v, &value);
            prop_assert_eq!(m, meta);
            prop_assert_eq!(blob_header(&blob).unwrap(), (meta, value.len()));
        }

        #[test]
        fn varints_round_trip(v in prop_oneof![any::<u64>(), Just(u64::MAX), 0u64..300]) {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            prop_assert_eq!(buf.len(), varint_len(v));
            prop_assert!(buf.len() <= MAX_VARINT);
            prop_assert_eq!(read_varint(&buf), Some((v, buf.len())));
        }
    }

    #[test]
    fn overlong_varints_are_refused() {
        let mut too_big = vec![0xff; 9];
        too_big.push(0x02);
        assert_eq!(read_varint(&too_big), None);
        assert_eq!(read_varint(&[0x80; 11]), None);
    }

    #[test]
    fn terminator_ends_a_run() {
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
