//! An extent's bytes on the device (`docs/FORMAT.md`, "The large-object region"): a
//! 32-byte header, the key, the value as stored (raw or one LZ4 block), zeros to the
//! 4 KiB boundary; built for a write and checked when read back.

use zipcache_device::AlignedBuf;

use super::Extent;
use crate::ssd::host_compression::decompress_exactly;

const MAGIC: [u8; 4] = *b"ZCLO";
/// Version 1 (format 4 and before) had no stored length and no encoding: refused.
const VERSION: u8 = 2;
pub(super) const HEADER: usize = 32;
/// How an extent stores its value (header byte 5).
pub(super) const STORED_RAW: u8 = 0;
pub(super) const STORED_LZ4: u8 = 1;

/// A value as its extent holds it.
pub(super) enum Stored<'v> {
    Raw(&'v [u8]),
    Lz4(Vec<u8>),
}

impl Stored<'_> {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Stored::Raw(value) => value,
            Stored::Lz4(compressed) => compressed,
        }
    }

    fn tag(&self) -> u8 {
        match self {
            Stored::Raw(_) => STORED_RAW,
            Stored::Lz4(_) => STORED_LZ4,
        }
    }
}

pub(super) fn encode(key: &[u8], stored: &Stored<'_>, extent: &Extent) -> AlignedBuf {
    let bytes = stored.bytes();
    let mut buf = AlignedBuf::zeroed(extent.blocks as usize);
    buf[0..4].copy_from_slice(&MAGIC);
    buf[4] = VERSION;
    buf[5] = stored.tag();
    buf[6..8].copy_from_slice(&(key.len() as u16).to_le_bytes());
    buf[8..12].copy_from_slice(&extent.value_len.to_le_bytes());
    buf[12..20].copy_from_slice(&extent.seq.to_le_bytes());
    buf[24..28].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
    buf[HEADER..HEADER + key.len()].copy_from_slice(key);
    buf[HEADER + key.len()..HEADER + key.len() + bytes.len()].copy_from_slice(bytes);
    let crc = checksum(&buf, key.len() + bytes.len());
    buf[20..24].copy_from_slice(&crc.to_le_bytes());
    buf
}

/// CRC32C of the header but for its own field (bytes 20..24), then `body` bytes of key and
/// stored value: whatever the extent holds that a read will use.
pub(super) fn checksum(buf: &[u8], body: usize) -> u32 {
    let header = crc32c::crc32c_append(crc32c::crc32c(&buf[..20]), &buf[24..HEADER]);
    crc32c::crc32c_append(header, &buf[HEADER..HEADER + body])
}

/// The value in an extent read for `extent` under `key`, or `None` if anything in it
/// disagrees: header, lengths (a stored length past the bytes read, a value that does not
/// decompress to exactly its length), sequence number, key or CRC32C.
pub(super) fn decode(buf: &[u8], key: &[u8], extent: &Extent) -> Option<Vec<u8>> {
    let value_len = extent.value_len as usize;
    if buf.len() < HEADER || buf[0..4] != MAGIC || buf[4] != VERSION {
        return None;
    }
    let field = |at: usize| u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    let stored_len = field(24) as usize;
    let body = key.len().checked_add(stored_len)?;
    let ok = HEADER.checked_add(body).is_some_and(|end| end <= buf.len())
        && usize::from(u16::from_le_bytes([buf[6], buf[7]])) == key.len()
        && field(8) as usize == value_len
        && u64::from_le_bytes(buf[12..20].try_into().ok()?) == extent.seq
        && field(20) == checksum(buf, body)
        && &buf[HEADER..HEADER + key.len()] == key;
    if !ok {
        return None;
    }
    let stored = &buf[HEADER + key.len()..HEADER + body];
    match buf[5] {
        STORED_RAW if stored_len == value_len => Some(stored.to_vec()),
        STORED_LZ4 => {
            let mut value = vec![0; value_len];
            decompress_exactly(stored, &mut value).then_some(value)
        }
        _ => None,
    }
}
