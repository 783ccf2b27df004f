//! The superblock, the device's last block (`docs/FORMAT.md`, "The superblock"): which
//! run of the engine last wrote to the device.

use super::{Magic, U32, U64};

pub const MAGIC: Magic = Magic {
    at: 0,
    bytes: *b"ZCSB",
};
pub const VERSION: U32 = U32(MAGIC.end());
pub const EPOCH: U64 = U64(VERSION.end());
/// The device's block count when the superblock was written.
pub const BLOCK_COUNT: U64 = U64(EPOCH.end());
/// CRC32C of every byte before it.
pub const CRC: U32 = U32(BLOCK_COUNT.end());
/// The bytes that carry anything; the rest of the block is zeros.
pub const LEN: usize = CRC.end();

/// The superblock version written now.
pub const SUPERBLOCK_VERSION: u32 = 1;

const _: () = assert!(LEN == 28);
