//! A DRAM leaf's page (DRAM only, never written; `docs/FORMAT.md`, "A tiny objects' page
//! and its dictionary"): a summary, the end table, the CAS base, the body.
//!
//! ```text
//! page    := summary header body     (body: LZ4 of it while cold, as is while hot)
//! summary := objects:varint clean×2+named:varint raw_bytes:varint cas_top - cas_base:varint
//!            [dictionary:u32 LE, if named]
//! header  := ends[0] .. ends[n-1]    (u16 LE each, u32 LE when leaf_size > 65,535)
//!            cas_base                (varint: the smallest CAS version in the page, 0 if none)
//! body    := sub-page 0 | sub-page 1 | ... | sub-page n-1      (bytes ends[n-1])
//! ```
//! A cold body is compressed in chunks of whole sub-pages, a table of where each block
//! ends in front of them (`dram/early_termination.rs` draws it).
//! The summary's varints put everything after them at offsets found by reading: the
//! fields here are those of fixed width, placed at a given offset.

use super::U32;

/// The version of the dictionary a page's body was compressed with (never 0), behind the
/// summary's varints when the page names one.
pub const fn dictionary_version_at(at: usize) -> U32 {
    U32(at)
}

/// Bytes of one entry of the end table, for pages of at most `capacity` body bytes.
pub const fn end_width(capacity: usize) -> usize {
    if capacity <= u16::MAX as usize {
        size_of::<u16>()
    } else {
        size_of::<u32>()
    }
}
