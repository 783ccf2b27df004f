//! A block dictionary's file beside the SSD file (`<ssd file>.dict-<slot>`;
//! `docs/FORMAT.md`, "Block dictionary files"): a header naming the dictionary, its raw
//! bytes, then the seal every index file ends with (CRC32C of all before it,
//! `restart/sealed_file.rs`).

use super::{Magic, U32};

pub const MAGIC: Magic = Magic {
    at: 0,
    bytes: *b"ZCBD",
};
pub const VERSION: U32 = U32(MAGIC.end());
/// The id blocks packed with it name (`format/packing.rs`, `DICTIONARY`), never 0.
pub const ID: U32 = U32(VERSION.end());
/// Bytes of the raw dictionary that follow the header.
pub const LENGTH: U32 = U32(ID.end());
pub const HEADER: usize = LENGTH.end();

/// The version written now.
pub const FORMAT_VERSION: u32 = 1;
/// The most dictionary bytes a file may hold: larger is not one the engine trained.
pub const MAX_LENGTH: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_file_header_is_pinned() {
        assert_eq!(
            [MAGIC.at, VERSION.0, ID.0, LENGTH.0, HEADER],
            [0, 4, 8, 12, 16]
        );
    }
}
