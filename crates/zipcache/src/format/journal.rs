//! The crash journal's descriptor log (`docs/FORMAT.md`, "The crash journal";
//! `restart/journal.rs`): its header, then the checkpoint, then framed records.

use super::{Magic, U32, U64};

pub const JOURNAL: Magic = Magic {
    at: 0,
    bytes: *b"ZCJL",
};
pub const VERSION: U32 = U32(JOURNAL.end());
/// The run epoch of the run that writes it.
pub const EPOCH: U64 = U64(VERSION.end());
/// Bytes of the checkpoint that follows the header.
pub const CHECKPOINT_LEN: U64 = U64(EPOCH.end());
/// CRC32C of the checkpoint.
pub const CHECKPOINT_CRC: U32 = U32(CHECKPOINT_LEN.end());
pub const HEADER: usize = CHECKPOINT_CRC.end();

/// The descriptor log's version written now.
pub const JOURNAL_VERSION: u32 = 1;

/// A record's kind, its first byte: a descriptor as it is now (the slot counter, then
/// the descriptor as the index file encodes one).
pub const UPSERT: u8 = 1;
/// A descriptor gone (its range joined its left neighbour): its low fence's length
/// (u16) and bytes.
pub const REMOVE: u8 = 2;

const _: () = assert!(HEADER == 28);
