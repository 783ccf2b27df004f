//! A BT_SSD sub-page's 4 KiB block (`docs/FORMAT.md`, "A sub-page block"): a 32-byte
//! header, then the stored payload (records raw, or packed: [`super::packing`]), then
//! zeros to the end of the block.

use zipcache_device::BLOCK_SIZE;

use super::{Magic, U8, U16, U32, U64};

pub const MAGIC: Magic = Magic {
    at: 0,
    bytes: *b"ZCSP",
};
pub const VERSION: U8 = U8(MAGIC.end());
/// How the payload is stored: [`RAW`], [`PACKED`] or [`PACKED_ZSTD`].
pub const PACKING: U8 = U8(VERSION.end());
/// Records in the payload.
pub const COUNT: U16 = U16(PACKING.end());
/// The owner: the super-leaf's slot, its generation, the sub-page's index in it.
pub const SUPERLEAF: U32 = U32(COUNT.end());
pub const GENERATION: U32 = U32(SUPERLEAF.end());
pub const SUBPAGE: U16 = U16(GENERATION.end());
/// Stored payload bytes (≤ [`PAYLOAD`]).
pub const STORED_LEN: U16 = U16(SUBPAGE.end());
/// The smallest CAS version among the payload's records: their deltas' base.
pub const CAS_BASE: U64 = U64(STORED_LEN.end());
/// CRC32C of the header's bytes before this field, then of the stored payload.
pub const CRC: U32 = U32(CAS_BASE.end());
pub const HEADER: usize = CRC.end();
/// Bytes the checksum covers ahead of the payload.
pub const CHECKED_HEADER: usize = CRC.0;
/// Stored payload bytes one block can carry.
pub const PAYLOAD: usize = BLOCK_SIZE - HEADER;

/// The block format written now.
pub const FORMAT_VERSION: u8 = 3;
/// The version before packing: its blocks are raw version-3 blocks.
pub const RAW_ONLY_VERSION: u8 = 2;

/// [`PACKING`]: the payload is the records back to back.
pub const RAW: u8 = 0;
/// [`PACKING`]: the payload is packed by the host with LZ4 ([`super::packing`]).
pub const PACKED: u8 = 1;
/// [`PACKING`]: the payload is packed by the host with zstd and a block dictionary
/// ([`super::packing`], [`super::dictionary_file`]).
pub const PACKED_ZSTD: u8 = 2;

const _: () = assert!(HEADER == 32);

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets `docs/FORMAT.md` gives, field by field.
    #[test]
    fn the_block_header_offsets_are_pinned() {
        let fields = [
            MAGIC.at,
            VERSION.0,
            PACKING.0,
            COUNT.0,
            SUPERLEAF.0,
            GENERATION.0,
            SUBPAGE.0,
            STORED_LEN.0,
            CAS_BASE.0,
            CRC.0,
            HEADER,
        ];
        assert_eq!(fields, [0, 4, 5, 6, 8, 12, 16, 18, 20, 28, 32]);
        assert_eq!(PAYLOAD, 4064);
    }
}
