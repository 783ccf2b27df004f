//! A medium object's blob in DRAM (`docs/FORMAT.md`, "A medium object's blob"; never
//! written to the device); encoded and decoded by `record.rs`.
//!
//! ```text
//! blob := bits:u8 [dictionary_id:u8] [expires_at_ms:varint] [flags:varint] [cas:varint]
//!         value_len:varint data
//! bits := the record kind's metadata bits (bit 6 a collection's header among them);
//!         bits 0-1 the codec (0 LZ4, 1 zstd with the dictionary named next, 2 stored as
//!         is, 3 stored as is while its leaf is hot)
//! ```

/// The first byte: the codec and the record kind's metadata bits.
pub const BITS: usize = 0;
/// With [`BLOB_DICTIONARY`]: the dictionary's id (1..=255).
pub const DICTIONARY_ID: usize = BITS + 1;

/// In [`BITS`], where a record has its payload bits: how the value is compressed.
pub const BLOB_CODEC: u8 = 0b11;
/// LZ4 alone (dictionary id 0, no id byte).
pub const BLOB_LZ4: u8 = 0;
/// zstd with a trained dictionary, whose id follows the first byte.
pub const BLOB_DICTIONARY: u8 = 1;
/// The value is stored as is (dictionary id 0, no id byte) because neither LZ4 nor the
/// dictionary would shrink it. (It was bit 6 until the record kind took that bit for a
/// collection's header; blobs never leave DRAM, so no stored format changed.)
pub const BLOB_RAW: u8 = 2;
/// The value is stored as is because its leaf is hot (adaptive compression bypassing,
/// `dram/hot.rs`): read without a decompression, and compressed again once the leaf
/// cools or a merge moves the blob to a leaf that is not hot.
pub const BLOB_HOT: u8 = 3;
