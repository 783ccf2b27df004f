//! The on-SSD sub-page: one 4 KiB block of a super-leaf (`docs/FORMAT.md`).
//!
//! ```text
//! offset size field
//!      0    4 magic "ZCSP"
//!      4    1 format version (1)
//!      5    1 reserved, 0
//!      6    2 record count, u16 LE
//!      8    4 super-leaf id (its slot), u32 LE
//!     12    4 super-leaf generation, u32 LE
//!     16    2 sub-page index within the super-leaf, u16 LE
//!     18    2 payload length in bytes, u16 LE
//!     20    4 CRC32C of bytes 0..20 and of the payload
//!     24    . payload: records (`record.rs`), then zeros to the end of the block
//! ```
//! Every byte read back is checked: a block that is not exactly what this super-leaf
//! wrote last (wrong magic, version, id, generation or index, or a bad checksum) is a miss
//! and a counted checksum failure, never data.

use zipcache_device::BLOCK_SIZE;

use crate::record::{Record, records};

pub const MAGIC: [u8; 4] = *b"ZCSP";
pub const FORMAT_VERSION: u8 = 1;
pub const HEADER: usize = 24;
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
/// the payload.
pub fn seal<'a>(
    block: &mut [u8],
    owner: Owner,
    records: impl IntoIterator<Item = Record<'a>>,
) -> bool {
    let mut payload = Vec::with_capacity(PAYLOAD);
    let mut count = 0u16;
    for r in records {
        r.encode(&mut payload);
        count += 1;
    }
    if payload.len() > PAYLOAD {
        return false;
    }
    block.fill(0);
    block[0..4].copy_from_slice(&MAGIC);
    block[4] = FORMAT_VERSION;
    block[6..8].copy_from_slice(&count.to_le_bytes());
    block[8..12].copy_from_slice(&owner.superleaf.to_le_bytes());
    block[12..16].copy_from_slice(&owner.generation.to_le_bytes());
    block[16..18].copy_from_slice(&owner.subpage.to_le_bytes());
    block[18..20].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    block[HEADER..HEADER + payload.len()].copy_from_slice(&payload);
    let crc = checksum(block, payload.len());
    block[20..24].copy_from_slice(&crc.to_le_bytes());
    true
}

fn checksum(block: &[u8], payload_len: usize) -> u32 {
    crc32c::crc32c_append(
        crc32c::crc32c(&block[..20]),
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
    if found != owner || len > PAYLOAD || checksum(block, len) != u32_at(20) {
        return None;
    }
    let count = u16_at(6) as usize;
    let payload = &block[HEADER..HEADER + len];
    (records(payload).count() == count).then(|| records(payload))
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
        for at in [0, 4, 7, 19, 21, HEADER, HEADER + 3] {
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
