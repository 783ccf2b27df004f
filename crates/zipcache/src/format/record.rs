//! A record (`docs/FORMAT.md`, "A record"), as it sits in a DRAM leaf page, a write
//! buffer and an SSD sub-page; encoded and parsed by `record.rs`.
//!
//! ```text
//! record := key_len:u8 kind:u8 [value_len:varint] key
//!           [expires_at_ms:varint] [flags:varint] [cas - base:varint] [value | blob_slot:u16le]
//! kind   := bits 0-1 payload (0 inline value, 1 medium pointer, 2 tombstone)
//!           bit 2 has expiry, bit 3 has flags, bit 4 has cas, bit 5 clean,
//!           bit 6 the value is a collection's header, bit 7 the client chose the cas
//!           (memcached meta `E`)
//! ```
//! A zero `key_len` ends a run of records. Only the first two bytes stand at fixed
//! offsets; what follows is varints and the key, so their places are found by reading.

/// Fixed bytes of every record: the key's length (u8; 0 ends a run), then the kind byte.
pub const RECORD_HEADER: usize = 2 * size_of::<u8>();

/// The kind byte's payload bits.
pub const PAYLOAD_MASK: u8 = 0b11;
pub const PAYLOAD_INLINE: u8 = 0;
pub const PAYLOAD_MEDIUM: u8 = 1;
pub const PAYLOAD_TOMBSTONE: u8 = 2;
pub const HAS_EXPIRY: u8 = 1 << 2;
pub const HAS_FLAGS: u8 = 1 << 3;
pub const HAS_CAS: u8 = 1 << 4;
/// DRAM only; written as 0 on the SSD.
pub const CLEAN: u8 = 1 << 5;
/// The value is a collection's header (a Redis hash's), not a string's bytes. Records
/// written before the bit was given this meaning have it 0 (it was free): strings.
pub const COLLECTION: u8 = 1 << 6;
/// With [`HAS_CAS`]: the client chose the version.
pub const CLIENT_CAS: u8 = 1 << 7;

/// The longest varint: a `u64` takes ten groups of seven bits.
pub const MAX_VARINT: usize = 10;
/// Optional metadata at its longest: expiry (varint u64), client flags (varint u32), CAS
/// delta (varint u64).
pub const MAX_METADATA: usize = MAX_VARINT + 5 + MAX_VARINT;
/// Bytes a medium pointer holds after the key: the blob slot (u16 LE).
pub const MEDIUM_POINTER: usize = size_of::<u16>();
