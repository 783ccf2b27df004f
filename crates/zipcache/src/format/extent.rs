//! A BT_LO extent in the large-object region (`docs/FORMAT.md`, "The large-object
//! region"): a 32-byte header, the key, the value as stored, zeros to the 4 KiB boundary.

use super::{Magic, U8, U16, U32, U64};

pub const MAGIC: Magic = Magic {
    at: 0,
    bytes: *b"ZCLO",
};
pub const VERSION: U8 = U8(MAGIC.end());
/// How the value is stored: [`STORED_RAW`] or [`STORED_LZ4`].
pub const ENCODING: U8 = U8(VERSION.end());
pub const KEY_LEN: U16 = U16(ENCODING.end());
/// The value's length as the client stored it.
pub const VALUE_LEN: U32 = U32(KEY_LEN.end());
/// Unique to this extent within the run.
pub const SEQ: U64 = U64(VALUE_LEN.end());
/// CRC32C of the header but for this field, then of the key and the stored value.
pub const CRC: U32 = U32(SEQ.end());
/// The stored value's length (the value length when raw).
pub const STORED_LEN: U32 = U32(CRC.end());
/// Zeros.
pub const RESERVED: U32 = U32(STORED_LEN.end());
/// Where the key starts; the stored value follows it.
pub const HEADER: usize = RESERVED.end();

/// The extent version written now. Version 1 (format 4 and before) had no stored length
/// and no encoding: refused.
pub const EXTENT_VERSION: u8 = 2;

/// [`ENCODING`]: the value as it is.
pub const STORED_RAW: u8 = 0;
/// [`ENCODING`]: the value as one LZ4 block.
pub const STORED_LZ4: u8 = 1;

const _: () = assert!(HEADER == 32);
