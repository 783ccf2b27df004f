//! A sub-page block's payload packed by the host (`device_compression=host`;
//! `docs/FORMAT.md`, "Packed payload"): the raw records' length, then one LZ4 block of
//! them (packing [`super::block::PACKED`]), or the id of the block dictionary it was
//! packed with and one zstd frame (packing [`super::block::PACKED_ZSTD`]).

use super::{U16, U32};

/// Raw record bytes the packed payload decodes to.
pub const RAW_LEN: U16 = U16(0);
/// Where the LZ4 block starts.
pub const LZ4_BLOCK: usize = RAW_LEN.end();
/// Packing 2: the block dictionary's id (`format/dictionary_file.rs`), never 0.
pub const DICTIONARY: U32 = U32(RAW_LEN.end());
/// Packing 2: where the zstd frame starts (magicless, its content checksum at its end).
pub const ZSTD_FRAME: usize = DICTIONARY.end();
/// Raw record bytes one packed block may carry: what [`RAW_LEN`] can say.
pub const RAW_MAX: usize = u16::MAX as usize;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packed_payload_offsets_are_pinned() {
        assert_eq!(
            [RAW_LEN.0, LZ4_BLOCK, DICTIONARY.0, ZSTD_FRAME],
            [0, 2, 2, 6]
        );
    }
}
