//! The crash journal's shadow table (`docs/FORMAT.md`, "The crash journal"): a file in
//! tmpfs read and written as little-endian 64-bit words through a shared mapping
//! (`restart/shadow.rs`). The header is [`HEADER_WORDS`] words; the table follows, in
//! buckets of `restart::shadow::SLOTS` fingerprints.

/// Word 0: the magic, written last when the file is made, so a table cut short is never
/// read.
pub const MAGIC_WORD: usize = 0;
/// `ZCSH` and the version (1) in the high half.
pub const SHADOW_MAGIC: u64 = u64::from_le_bytes(*b"ZCSH\x01\0\0\0");
/// Words 1–2: the boot id of the boot that wrote it (16 bytes).
pub const BOOT_ID: usize = MAGIC_WORD + 1;
/// Word 3: the run epoch on the device while it was written.
pub const EPOCH: usize = BOOT_ID + 2;
/// Word 4: the device's block count.
pub const DEVICE_BLOCKS: usize = EPOCH + 1;
/// Word 5: buckets in the table.
pub const BUCKETS: usize = DEVICE_BLOCKS + 1;
/// Word 6: flags (bit 0 overflowed: a key found no room; bit 1 a `flush_all` under way or
/// promised; bit 2 the descriptor log failed), and in bits 32–63 the count of marks that
/// found no room (wrapping), moved with bit 0 in one step.
pub const FLAGS: usize = BUCKETS + 1;
/// Words 7: reserved, 0. The table starts after the header.
pub const HEADER_WORDS: usize = FLAGS + 2;

const _: () = assert!(HEADER_WORDS == 8);
