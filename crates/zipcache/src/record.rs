//! Object records as they sit inside a DRAM leaf page, a write buffer and an SSD sub-page.

use crate::config::Config;

/// Fixed bytes of every record: key length and kind/flag byte.
pub const RECORD_HEADER: usize = 2;
/// Optional metadata: expiry (8), client flags (4), CAS (8).
pub const MAX_METADATA: usize = 8 + 4 + 8;
/// Bytes a medium pointer holds after the key: the blob slot.
pub const MEDIUM_POINTER: usize = 2;

/// The largest record that must fit in one DRAM sub-page.
pub fn max_inline_record(config: &Config) -> usize {
    let tiny = RECORD_HEADER + varint_len(config.tiny_max as u64) + config.tiny_max + MAX_METADATA;
    let medium_pointer = RECORD_HEADER + config.max_key_size + MEDIUM_POINTER;
    tiny.max(medium_pointer)
}

pub fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}
