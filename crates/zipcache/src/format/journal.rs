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

/// The kinds of BT_LO's log's records (`large_objects/journal.rs`), in a file of the
/// same layout whose checkpoint is a large-object index file's body.
pub mod large {
    /// An extent written and pointed at: the log's head after it (u64), then the extent
    /// as the index file encodes one.
    pub const PUT: u8 = 1;
    /// A key's extent gone, if it is still the one of this sequence number: key length
    /// (u16), key, sequence (u64).
    pub const REMOVE: u8 = 2;
    /// A key's extent's metadata changed (a touch), if it is still the one of this
    /// sequence number: key length (u16), key, sequence (u64), metadata as the index file
    /// encodes it.
    pub const META: u8 = 3;
    /// Every extent gone, the head back at the region's start (`flush_all`).
    pub const CLEAR: u8 = 4;
}
