//! An extent's bytes on the device (`docs/FORMAT.md`, "The large-object region"): a
//! 32-byte header, the key, the value as stored (raw or one LZ4 block), zeros to the
//! 4 KiB boundary; built for a write and checked when read back.

use zipcache_device::AlignedBuf;

use super::Extent;
use crate::format::extent::{
    CRC, ENCODING, EXTENT_VERSION, HEADER, KEY_LEN, MAGIC, SEQ, STORED_LEN, STORED_LZ4, STORED_RAW,
    VALUE_LEN, VERSION,
};
use crate::ssd::host_compression::decompress_exactly;

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
    MAGIC.put(&mut buf);
    VERSION.set(&mut buf, EXTENT_VERSION);
    ENCODING.set(&mut buf, stored.tag());
    KEY_LEN.set(&mut buf, key.len() as u16);
    VALUE_LEN.set(&mut buf, extent.value_len);
    SEQ.set(&mut buf, extent.seq);
    STORED_LEN.set(&mut buf, bytes.len() as u32);
    buf[HEADER..HEADER + key.len()].copy_from_slice(key);
    buf[HEADER + key.len()..HEADER + key.len() + bytes.len()].copy_from_slice(bytes);
    let crc = checksum(&buf, key.len() + bytes.len());
    CRC.set(&mut buf, crc);
    buf
}

/// CRC32C of the header but for its own field ([`CRC`]), then `body` bytes of key and
/// stored value: whatever the extent holds that a read will use.
pub(super) fn checksum(buf: &[u8], body: usize) -> u32 {
    let header = crc32c::crc32c_append(crc32c::crc32c(&buf[..CRC.0]), &buf[CRC.end()..HEADER]);
    crc32c::crc32c_append(header, &buf[HEADER..HEADER + body])
}

/// The value in an extent read for `extent` under `key`, or `None` if anything in it
/// disagrees: header, lengths (a stored length past the bytes read, a value that does not
/// decompress to exactly its length), sequence number, key or CRC32C.
pub(super) fn decode(read: AlignedBuf, key: &[u8], extent: &Extent) -> Option<Vec<u8>> {
    let buf = &read[..];
    let value_len = extent.value_len as usize;
    if buf.len() < HEADER || !MAGIC.is_in(buf) || VERSION.get(buf) != EXTENT_VERSION {
        return None;
    }
    let stored_len = STORED_LEN.get(buf) as usize;
    let body = key.len().checked_add(stored_len)?;
    let ok = HEADER.checked_add(body).is_some_and(|end| end <= buf.len())
        && usize::from(KEY_LEN.get(buf)) == key.len()
        && VALUE_LEN.get(buf) as usize == value_len
        && SEQ.get(buf) == extent.seq
        && CRC.get(buf) == checksum(buf, body)
        && &buf[HEADER..HEADER + key.len()] == key;
    if !ok {
        return None;
    }
    let stored = HEADER + key.len()..HEADER + body;
    match ENCODING.get(buf) {
        STORED_RAW if stored_len == value_len => Some(read.into_vec(stored)),
        STORED_LZ4 => {
            let mut value = vec![0; value_len];
            decompress_exactly(&buf[stored], &mut value).then_some(value)
        }
        _ => None,
    }
}
