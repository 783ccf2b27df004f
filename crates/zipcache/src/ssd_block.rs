//! The on-SSD sub-page: one 4 KiB block of a super-leaf (`docs/FORMAT.md`).
//!
//! ```text
//! offset size field
//!      0    4 magic "ZCSP"
//!      4    1 format version (2)
//!      5    1 reserved, 0
//!      6    2 record count, u16 LE
//!      8    4 super-leaf id (its slot), u32 LE
//!     12    4 super-leaf generation, u32 LE
//!     16    2 sub-page index within the super-leaf, u16 LE
//!     18    2 payload length in bytes, u16 LE
//!     20    8 CAS base of the payload's records, u64 LE
//!     28    4 CRC32C of bytes 0..28 and of the payload
//!     32    . payload: records (`record.rs`), then zeros to the end of the block
//! ```
//! Every byte read back is checked: a block that is not exactly what this super-leaf
//! wrote last (wrong magic, version, id, generation or index, or a bad checksum) is a miss
//! and a counted checksum failure, never data. A block of an older format version is
//! refused by its version byte before anything else is read: its records would parse
//! differently.

use zipcache_device::BLOCK_SIZE;

use crate::record::{CasBase, Record, records_in};

pub const MAGIC: [u8; 4] = *b"ZCSP";
pub const FORMAT_VERSION: u8 = 2;
pub const HEADER: usize = 32;
/// Bytes the checksum covers ahead of the payload.
const CHECKED_HEADER: usize = 28;
/// Record bytes one block can carry.
pub const PAYLOAD: usize = BLOCK_SIZE - HEADER;

/// Who a block belongs to; a block read back must name the same owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub superleaf: u32,
    pub generation: u32,
    pub subpage: u16,
}

/// Writes `records` into `block` (4 KiB) behind a header; returns false if they exceed
/// the payload. The payload is never longer than the records' `encoded_len` sum.
pub fn seal<'a>(
    block: &mut [u8],
    owner: Owner,
    records: impl IntoIterator<Item = Record<'a>>,
) -> bool {
    let records: Vec<Record> = records.into_iter().collect();
    let base = CasBase::of(&records);
    let mut payload = Vec::with_capacity(PAYLOAD);
    for r in &records {
        r.encode_in(&mut payload, base);
    }
    if payload.len() > PAYLOAD || records.len() > u16::MAX as usize {
        return false;
    }
    block.fill(0);
    block[0..4].copy_from_slice(&MAGIC);
    block[4] = FORMAT_VERSION;
    block[6..8].copy_from_slice(&(records.len() as u16).to_le_bytes());
    block[8..12].copy_from_slice(&owner.superleaf.to_le_bytes());
    block[12..16].copy_from_slice(&owner.generation.to_le_bytes());
    block[16..18].copy_from_slice(&owner.subpage.to_le_bytes());
    block[18..20].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    block[20..28].copy_from_slice(&base.0.to_le_bytes());
    block[HEADER..HEADER + payload.len()].copy_from_slice(&payload);
    let crc = checksum(block, payload.len());
    block[28..32].copy_from_slice(&crc.to_le_bytes());
    true
}

fn checksum(block: &[u8], payload_len: usize) -> u32 {
    crc32c::crc32c_append(
        crc32c::crc32c(&block[..CHECKED_HEADER]),
        &block[HEADER..HEADER + payload_len],
    )
}

/// The records of a block if it is intact and belongs to `owner`.
pub fn open(block: &[u8], owner: Owner) -> Option<impl Iterator<Item = Record<'_>>> {
    if block.len() != BLOCK_SIZE || block[0..4] != MAGIC || block[4] != FORMAT_VERSION {
        return None;
    }
    let u16_at = |at: usize| u16::from_le_bytes([block[at], block[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes(block[at..at + 4].try_into().unwrap_or_default());
    let found = Owner {
        superleaf: u32_at(8),
        generation: u32_at(12),
        subpage: u16_at(16),
    };
    let len = u16_at(18) as usize;
    if found != owner || len > PAYLOAD || checksum(block, len) != u32_at(28) {
        return None;
    }
    let base = CasBase(u64::from_le_bytes(
        block[20..28].try_into().unwrap_or_default(),
    ));
    let count = u16_at(6) as usize;
    let payload = &block[HEADER..HEADER + len];
    (records_in(payload, base).count() == count).then(|| records_in(payload, base))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Meta, Payload};

    fn owner() -> Owner {
        Owner {
            superleaf: 7,
            generation: 3,
            subpage: 5,
        }
    }

    #[test]
    fn sealed_blocks_open_only_for_their_owner_and_untouched() {
        let mut block = vec![0u8; BLOCK_SIZE];
        let recs = [
            Record {
                key: b"a",
                payload: Payload::Inline(b"1"),
                meta: Meta::default(),
            },
            Record {
                key: b"b",
                payload: Payload::Inline(b"22"),
                meta: Meta {
                    flags: 9,
                    ..Meta::default()
                },
            },
        ];
        assert!(seal(&mut block, owner(), recs));
        assert_eq!(
            open(&block, owner()).unwrap().collect::<Vec<_>>(),
            recs.to_vec()
        );
        for other in [
            Owner {
                superleaf: 8,
                ..owner()
            },
            Owner {
                generation: 4,
                ..owner()
            },
            Owner {
                subpage: 6,
                ..owner()
            },
        ] {
            assert!(open(&block, other).is_none());
        }
        for at in [0, 4, 7, 19, 21, 27, 29, HEADER, HEADER + 3] {
            let mut bad = block.clone();
            bad[at] ^= 0x10;
            assert!(
                open(&bad, owner()).is_none(),
                "flipped byte {at} went unnoticed"
            );
        }
        assert!(
            open(&vec![0u8; BLOCK_SIZE], owner()).is_none(),
            "a trimmed block is no data"
        );
    }

    /// The header, pinned byte by byte, with records whose CAS versions are stored against
    /// the block's base.
    #[test]
    fn the_block_layout_is_pinned() {
        let mut block = vec![0u8; BLOCK_SIZE];
        let meta = |cas| Meta {
            cas,
            ..Meta::default()
        };
        let recs = [
            Record {
                key: b"a",
                payload: Payload::Inline(b"1"),
                meta: meta(1_000_005),
            },
            Record {
                key: b"b",
                payload: Payload::Tombstone,
                meta: meta(1_000_000),
            },
        ];
        assert!(seal(&mut block, owner(), recs));
        let mut want = Vec::new();
        want.extend_from_slice(b"ZCSP");
        want.extend_from_slice(&[2, 0, 2, 0]); // version, reserved, count
        want.extend_from_slice(&7u32.to_le_bytes());
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&5u16.to_le_bytes());
        want.extend_from_slice(&10u16.to_le_bytes()); // payload length
        want.extend_from_slice(&1_000_000u64.to_le_bytes());
        assert_eq!(&block[..28], &want[..]);
        let payload = [1, 0b1_0000, 1, b'a', 5, b'1', 1, 0b1_0010, b'b', 0];
        assert_eq!(&block[HEADER..HEADER + 10], &payload);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&want), &payload);
        assert_eq!(&block[28..32], &crc.to_le_bytes());
        assert!(block[HEADER + 10..].iter().all(|&b| b == 0));
        assert_eq!(
            open(&block, owner()).unwrap().collect::<Vec<_>>(),
            recs.to_vec()
        );
    }

    /// A block written by format version 1 (24-byte header, CAS stored whole) is never
    /// read as data, even with a good version-1 checksum.
    #[test]
    fn a_version_1_block_is_refused() {
        let mut block = vec![0u8; BLOCK_SIZE];
        let payload = [1, 0b1_0000, 1, b'a', b'1', 5, 0, 0, 0, 0, 0, 0, 0];
        block[0..4].copy_from_slice(b"ZCSP");
        block[4] = 1;
        block[6..8].copy_from_slice(&1u16.to_le_bytes());
        block[8..12].copy_from_slice(&7u32.to_le_bytes());
        block[12..16].copy_from_slice(&3u32.to_le_bytes());
        block[16..18].copy_from_slice(&5u16.to_le_bytes());
        block[18..20].copy_from_slice(&(payload.len() as u16).to_le_bytes());
        block[24..24 + payload.len()].copy_from_slice(&payload);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&block[..20]), &payload);
        block[20..24].copy_from_slice(&crc.to_le_bytes());
        assert!(open(&block, owner()).is_none());
        // Even with the version byte forged, the checksum no longer matches.
        block[4] = FORMAT_VERSION;
        assert!(open(&block, owner()).is_none());
    }

    #[test]
    fn oversize_payload_is_refused() {
        let mut block = vec![0u8; BLOCK_SIZE];
        let big = vec![1u8; PAYLOAD];
        let recs = [Record {
            key: b"k",
            payload: Payload::Inline(&big),
            meta: Meta::default(),
        }];
        assert!(!seal(&mut block, owner(), recs));
    }
}
