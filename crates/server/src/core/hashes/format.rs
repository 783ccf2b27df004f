//! The bytes of a hash (`docs/FORMAT.md`, "The server's key bytes"): its header — the
//! value at the hash's key, with the engine's `collection` bit — in one of two layouts,
//! and the element objects of the larger layout.
//!
//! ```text
//! packed header   := 0x02 ‖ LEB128(n) ‖ n × field          (n ≥ 1, fields in field order)
//!   field         := LEB128(len) ‖ name ‖ LEB128(expiry ms + 1, or 0) ‖ LEB128(len) ‖ value
//! elements header := 0x01 ‖ LEB128(epoch) ‖ LEB128(serial) ‖ LEB128(elements)
//!                    ‖ LEB128(elements with an expiry)
//! element key     := 0x01 ‖ LEB128(epoch) ‖ LEB128(serial) ‖ name
//! element value   := LEB128(expiry ms + 1, or 0) ‖ value
//! ```
//!
//! A set or a sorted set would take other first bytes; every number is LEB128 (7 bits a
//! byte, low first, at most 10 bytes). Bytes read from the engine are untrusted: every
//! parse checks them whole and answers `None` for bytes the encoders never make.

use std::ops::Range;

use crate::core::keyspace::ELEMENT;

/// The first byte of a header whose fields are elements of their own.
const ELEMENTS: u8 = 1;
/// The first byte of a header that holds its fields.
const PACKED: u8 = 2;
pub(super) const MAX_LEB: usize = 10;
/// Bytes an element's key takes besides the field's: the tag and the id at its longest.
pub(super) const ELEMENT_KEY_OVERHEAD: usize = 1 + 2 * MAX_LEB;

/// A hash's id: the run that made it, and its serial in that run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HashId {
    pub epoch: u64,
    pub serial: u64,
}

/// The header of a hash whose fields are elements: its id and what it counts of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    pub id: HashId,
    /// Elements stored, expired ones not yet deleted included.
    pub elements: u64,
    /// Of them, those with an expiry.
    pub volatile: u64,
}

/// One field of a packed hash: its value and its expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Packed {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    pub expires_at_ms: Option<u64>,
}

/// One field of a packed header where its bytes hold it: a read finds a field, or
/// sends a whole hash, without a copy of every name and value (decoded into vectors
/// they took a seventh of an HGETALL's CPU).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FieldSpan {
    name: Range<usize>,
    value: Range<usize>,
    pub expires_at_ms: Option<u64>,
}

impl FieldSpan {
    /// The field's name in `bytes`, the header it was found in.
    pub fn name<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.name.clone()]
    }

    /// The field's value in `bytes`, the header it was found in.
    pub fn value<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.value.clone()]
    }

    /// The field copied out of `bytes`, the header it was found in, to be changed.
    pub fn to_packed(&self, bytes: &[u8]) -> Packed {
        Packed {
            name: self.name(bytes).to_vec(),
            value: self.value(bytes).to_vec(),
            expires_at_ms: self.expires_at_ms,
        }
    }
}

/// A packed hash's live fields where its header's bytes hold them: HGETALL, HKEYS and
/// HVALS send them from there.
pub struct PackedFields {
    bytes: Vec<u8>,
    fields: Vec<FieldSpan>,
}

impl PackedFields {
    /// `fields`, found in `bytes` by [`Layout::decode`].
    pub(super) fn new(bytes: Vec<u8>, fields: Vec<FieldSpan>) -> PackedFields {
        PackedFields { bytes, fields }
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Each field's name and value, in field order.
    pub fn pairs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields
            .iter()
            .map(|f| (f.name(&self.bytes), f.value(&self.bytes)))
    }
}

/// A header as read: where a small hash's fields are in its bytes, or a large one's
/// counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    Packed(Vec<FieldSpan>),
    Elements(Header),
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![ELEMENTS];
        for n in [self.id.epoch, self.id.serial, self.elements, self.volatile] {
            put_leb(&mut out, n);
        }
        out
    }
}

impl Layout {
    /// `None` for bytes the encoders never make (a packed hash's fields out of order or
    /// repeated, or none; more elements with an expiry than elements).
    pub fn decode(bytes: &[u8]) -> Option<Layout> {
        let (&kind, _) = bytes.split_first()?;
        let mut at = 1;
        let mut number = || {
            let (n, used) = read_leb(&bytes[at..])?;
            at += used;
            Some(n)
        };
        let layout = match kind {
            ELEMENTS => {
                let header = Header {
                    id: HashId {
                        epoch: number()?,
                        serial: number()?,
                    },
                    elements: number()?,
                    volatile: number()?,
                };
                (header.volatile <= header.elements).then_some(Layout::Elements(header))?
            }
            PACKED => {
                let n = number()?;
                let mut fields: Vec<FieldSpan> = Vec::with_capacity(n.min(1024) as usize);
                for _ in 0..n {
                    let span = |at: &mut usize| {
                        let (len, used) = read_leb(&bytes[*at..])?;
                        let start = *at + used;
                        let end = start.checked_add(usize::try_from(len).ok()?)?;
                        (end <= bytes.len()).then(|| {
                            *at = end;
                            start..end
                        })
                    };
                    let name = span(&mut at)?;
                    let (expiry, used) = read_leb(&bytes[at..])?;
                    at += used;
                    let value = span(&mut at)?;
                    if fields
                        .last()
                        .is_some_and(|last| bytes[last.name.clone()] >= bytes[name.clone()])
                    {
                        return None;
                    }
                    fields.push(FieldSpan {
                        name,
                        value,
                        expires_at_ms: expiry.checked_sub(1),
                    });
                }
                (!fields.is_empty()).then_some(Layout::Packed(fields))?
            }
            _ => return None,
        };
        (at == bytes.len()).then_some(layout)
    }
}

/// A packed header of `fields` (in field order, distinct).
pub(super) fn packed_bytes(fields: &[Packed]) -> Vec<u8> {
    let size: usize = fields
        .iter()
        .map(|f| f.name.len() + f.value.len() + 6)
        .sum();
    let mut out = Vec::with_capacity(size + 4);
    out.push(PACKED);
    put_leb(&mut out, fields.len() as u64);
    for field in fields {
        put_leb(&mut out, field.name.len() as u64);
        out.extend_from_slice(&field.name);
        put_leb(&mut out, expiry_code(field.expires_at_ms));
        put_leb(&mut out, field.value.len() as u64);
        out.extend_from_slice(&field.value);
    }
    out
}

/// Whether `bytes` are a hash's header of either layout (or a damaged one): what TYPE
/// names `hash`.
pub(super) fn is_hash(bytes: &[u8]) -> bool {
    matches!(bytes.first(), Some(&(ELEMENTS | PACKED)))
}

/// Whether a hash header's fields are elements of their own.
pub(super) fn is_elements(bytes: &[u8]) -> bool {
    bytes.first() == Some(&ELEMENTS)
}

fn expiry_code(expires_at_ms: Option<u64>) -> u64 {
    expires_at_ms.map_or(0, |at| at.saturating_add(1))
}

pub(super) fn put_leb(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A LEB128 number and the bytes it took; `None` if cut short or past 64 bits.
pub(super) fn read_leb(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut n: u64 = 0;
    for (i, &byte) in bytes.iter().enumerate().take(MAX_LEB) {
        if i == MAX_LEB - 1 && byte > 1 {
            return None;
        }
        n |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((n, i + 1));
        }
    }
    None
}

/// The stored key every element of hash `id` starts with.
pub(super) fn element_prefix(id: HashId) -> Vec<u8> {
    let mut out = Vec::with_capacity(ELEMENT_KEY_OVERHEAD);
    out.push(ELEMENT);
    put_leb(&mut out, id.epoch);
    put_leb(&mut out, id.serial);
    out
}

pub(super) fn element_key(id: HashId, field: &[u8]) -> Vec<u8> {
    let mut key = element_prefix(id);
    key.extend_from_slice(field);
    key
}

/// The stored keys of hash `id`'s elements: its prefix up to the prefix with its last
/// byte incremented (a LEB128's last byte is below 0x80, so it never carries).
pub(super) fn element_range(id: HashId) -> (Vec<u8>, Vec<u8>) {
    let start = element_prefix(id);
    let mut end = start.clone();
    *end.last_mut().expect("a prefix is never empty") += 1;
    (start, end)
}

pub(super) fn element_value(value: &[u8], expires_at_ms: Option<u64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 1);
    put_leb(&mut out, expiry_code(expires_at_ms));
    out.extend_from_slice(value);
    out
}

/// An element's field expiry and value; `None` for bytes `element_value` never makes.
pub(super) fn parse_element(bytes: &[u8]) -> Option<(Option<u64>, &[u8])> {
    let (at, used) = read_leb(bytes)?;
    Some((at.checked_sub(1), &bytes[used..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(list: &[(&str, &str, Option<u64>)]) -> Vec<Packed> {
        list.iter()
            .map(|(n, v, e)| Packed {
                name: n.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
                expires_at_ms: *e,
            })
            .collect()
    }

    /// The fields a packed header's bytes hold, copied out.
    fn fields_of(bytes: &[u8]) -> Option<Vec<Packed>> {
        match Layout::decode(bytes)? {
            Layout::Packed(spans) => Some(spans.iter().map(|f| f.to_packed(bytes)).collect()),
            Layout::Elements(_) => None,
        }
    }

    #[test]
    fn headers_round_trip_and_bytes_never_made_are_refused() {
        let header = Header {
            id: HashId {
                epoch: u64::MAX,
                serial: 300,
            },
            elements: 12,
            volatile: 2,
        };
        let small = packed(&[("a", "1", None), ("b", "", Some(7)), ("c", "three", None)]);
        assert_eq!(
            Layout::decode(&header.encode()),
            Some(Layout::Elements(header))
        );
        assert_eq!(fields_of(&packed_bytes(&small)), Some(small.clone()));
        for bytes in [header.encode(), packed_bytes(&small)] {
            assert_eq!(Layout::decode(&bytes[..bytes.len() - 1]), None);
            assert_eq!(Layout::decode(&[bytes.as_slice(), b"x"].concat()), None);
            assert!(is_hash(&bytes));
        }
        assert_eq!(Layout::decode(b"\x03\x00\x00\x01\x00"), None);
        assert_eq!(
            Layout::decode(b"\x01\x00\x00\x01\x02"),
            None,
            "more volatile than all"
        );
        assert_eq!(Layout::decode(b"\x02\x00"), None, "an empty packed hash");
        let unordered = packed_bytes(&packed(&[("b", "1", None), ("a", "2", None)]));
        assert_eq!(Layout::decode(&unordered), None);
        let repeated = packed_bytes(&packed(&[("a", "1", None), ("a", "2", None)]));
        assert_eq!(Layout::decode(&repeated), None);
        // A length past the bytes there are.
        assert_eq!(Layout::decode(b"\x02\x01\x7f"), None);
        assert_eq!(read_leb(&[0xff; 10]), None);
        assert_eq!(read_leb(&[0x80]), None);
        let mut out = Vec::new();
        put_leb(&mut out, u64::MAX);
        assert_eq!(read_leb(&out), Some((u64::MAX, 10)));
        assert_eq!(
            parse_element(&element_value(b"v", Some(7))),
            Some((Some(7), &b"v"[..]))
        );
        assert_eq!(
            parse_element(&element_value(b"", None)),
            Some((None, &b""[..]))
        );
        let id = HashId {
            epoch: 1,
            serial: 127,
        };
        let (start, end) = element_range(id);
        assert!(start < element_key(id, b"\xff\xff") && element_key(id, b"\xff") < end);
    }
}
