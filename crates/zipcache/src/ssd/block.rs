//! The on-SSD sub-page: one 4 KiB block of a super-leaf (`docs/FORMAT.md`): a 32-byte
//! header (`format/block.rs`: magic, version, packing, record count, the owner — slot,
//! generation, sub-page —, stored length, CAS base, CRC32C), then the stored payload:
//! records (`record.rs`) raw or packed by the host (`host_compression`: LZ4, or zstd with
//! a block dictionary, `dictionary.rs`), then zeros.
//!
//! Every byte read back is checked: a block that is not exactly what this super-leaf
//! wrote last (wrong magic, version, packing, id, generation or index, a bad checksum, a
//! packed payload that does not unpack to its stated length, or one naming a dictionary
//! the tier does not hold) is a miss and a counted checksum failure, never data. A version-2 block is a raw version-3 block (its byte 5
//! was reserved, 0) and reads as before; a version-1 block is refused by its version byte
//! before anything else is read: its records would parse differently.

use std::sync::atomic::AtomicU64;

use zipcache_device::BLOCK_SIZE;

use super::dictionary::{BlockDictionaries, Current};
use super::host_compression;
use crate::format::block::{
    CAS_BASE, CHECKED_HEADER, COUNT, CRC, FORMAT_VERSION, GENERATION, HEADER, MAGIC, PACKED_ZSTD,
    PACKING, PAYLOAD, RAW, RAW_ONLY_VERSION, STORED_LEN, SUBPAGE, SUPERLEAF, VERSION,
};
use crate::record::{CasBase, Record, records_in};

/// Who a block belongs to; a block read back must name the same owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub superleaf: u32,
    pub generation: u32,
    pub subpage: u16,
}

/// How a block's records are stored.
#[derive(Clone, Copy)]
pub enum Packing<'d> {
    /// As they are (every mode but `device_compression=host`).
    Raw,
    /// Packed by the host when that makes them smaller: with zstd and this dictionary, or
    /// with LZ4 without one.
    Host(Option<&'d Current>),
}

/// A sub-page's records as a block stores them: raw, or packed when the host compresses
/// and packing makes them smaller.
pub struct Stored {
    bytes: Vec<u8>,
    packing: u8,
    count: u16,
    base: CasBase,
    /// The slot of the block dictionary it was packed with; 0 for none.
    dictionary: u8,
}

impl Stored {
    /// `records` encoded, and packed as `packing` says (time added to `spent_ns`);
    /// `None` if there are more than a block can count.
    pub fn of<'a>(
        records: impl IntoIterator<Item = Record<'a>>,
        packing: Packing<'_>,
        spent_ns: &AtomicU64,
    ) -> Option<Stored> {
        let records: Vec<Record> = records.into_iter().collect();
        let count = u16::try_from(records.len()).ok()?;
        let base = CasBase::of(&records);
        let mut raw = Vec::with_capacity(PAYLOAD);
        for r in &records {
            r.encode_in(&mut raw, base);
        }
        let Packing::Host(current) = packing else {
            return Some(Stored::raw(raw, count, base));
        };
        let with = current.map(|c| (c.id, c.dictionary.zstd()));
        Some(match host_compression::pack(&raw, with, spent_ns) {
            Some((bytes, packing)) => Stored {
                bytes,
                packing,
                count,
                base,
                dictionary: current
                    .filter(|_| packing == PACKED_ZSTD)
                    .map_or(0, |c| c.slot),
            },
            None => Stored::raw(raw, count, base),
        })
    }

    fn raw(bytes: Vec<u8>, count: u16, base: CasBase) -> Stored {
        Stored {
            bytes,
            packing: RAW,
            count,
            base,
            dictionary: 0,
        }
    }

    /// The slot of the block dictionary the records were packed with; 0 for none.
    pub fn dictionary(&self) -> u8 {
        self.dictionary
    }

    /// Payload bytes the block needs.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Writes the records into `block` (4 KiB) behind a header; false if they exceed the
    /// payload.
    pub fn seal(&self, block: &mut [u8], owner: Owner) -> bool {
        let len = self.bytes.len();
        if len > PAYLOAD {
            return false;
        }
        block.fill(0);
        MAGIC.put(block);
        VERSION.set(block, FORMAT_VERSION);
        PACKING.set(block, self.packing);
        COUNT.set(block, self.count);
        SUPERLEAF.set(block, owner.superleaf);
        GENERATION.set(block, owner.generation);
        SUBPAGE.set(block, owner.subpage);
        STORED_LEN.set(block, len as u16);
        CAS_BASE.set(block, self.base.0);
        block[HEADER..HEADER + len].copy_from_slice(&self.bytes);
        let crc = checksum(block, len);
        CRC.set(block, crc);
        true
    }
}

/// Writes raw `records` into `block` (4 KiB) behind a header; returns false if they exceed
/// the payload. The payload is never longer than the records' `encoded_len` sum.
#[cfg(test)]
pub fn seal<'a>(
    block: &mut [u8],
    owner: Owner,
    records: impl IntoIterator<Item = Record<'a>>,
) -> bool {
    Stored::of(records, Packing::Raw, &AtomicU64::new(0))
        .is_some_and(|stored| stored.seal(block, owner))
}

fn checksum(block: &[u8], payload_len: usize) -> u32 {
    crc32c::crc32c_append(
        crc32c::crc32c(&block[..CHECKED_HEADER]),
        &block[HEADER..HEADER + payload_len],
    )
}

/// The records of a block if it is intact and belongs to `owner`; a packed block is
/// unpacked into `scratch` (with the dictionary of `dictionaries` it names, if any).
pub fn open<'a>(
    block: &'a [u8],
    owner: Owner,
    dictionaries: &BlockDictionaries,
    scratch: &'a mut Vec<u8>,
) -> Option<impl Iterator<Item = Record<'a>> + use<'a>> {
    if block.len() != BLOCK_SIZE
        || !MAGIC.is_in(block)
        || !matches!(VERSION.get(block), FORMAT_VERSION | RAW_ONLY_VERSION)
    {
        return None;
    }
    let found = Owner {
        superleaf: SUPERLEAF.get(block),
        generation: GENERATION.get(block),
        subpage: SUBPAGE.get(block),
    };
    let len = STORED_LEN.get(block) as usize;
    if found != owner || len > PAYLOAD || checksum(block, len) != CRC.get(block) {
        return None;
    }
    let base = CasBase(CAS_BASE.get(block));
    let count = COUNT.get(block) as usize;
    let stored = &block[HEADER..HEADER + len];
    let payload = match PACKING.get(block) {
        RAW => stored,
        packing if VERSION.get(block) == FORMAT_VERSION => {
            host_compression::unpack(packing, stored, |id| dictionaries.get(id), scratch)?
        }
        _ => return None,
    };
    (records_in(payload, base).count() == count).then(|| records_in(payload, base))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::block::PACKED;
    use crate::record::{Meta, Payload};

    /// A tier's dictionaries before any is trained.
    fn none() -> BlockDictionaries {
        BlockDictionaries::open(None, None, Default::default())
    }

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
            open(&block, owner(), &none(), &mut Vec::new())
                .unwrap()
                .collect::<Vec<_>>(),
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
            assert!(open(&block, other, &none(), &mut Vec::new()).is_none());
        }
        for at in [0, 4, 7, 19, 21, 27, 29, HEADER, HEADER + 3] {
            let mut bad = block.clone();
            bad[at] ^= 0x10;
            assert!(
                open(&bad, owner(), &none(), &mut Vec::new()).is_none(),
                "flipped byte {at} went unnoticed"
            );
        }
        assert!(
            open(&vec![0u8; BLOCK_SIZE], owner(), &none(), &mut Vec::new()).is_none(),
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
        want.extend_from_slice(&[3, 0, 2, 0]); // version, packing, count
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
            open(&block, owner(), &none(), &mut Vec::new())
                .unwrap()
                .collect::<Vec<_>>(),
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
        assert!(open(&block, owner(), &none(), &mut Vec::new()).is_none());
        // Even with the version byte forged, the checksum no longer matches.
        block[4] = FORMAT_VERSION;
        assert!(open(&block, owner(), &none(), &mut Vec::new()).is_none());
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

    /// Sixty records of 16-byte keys and 64-byte values that repeat their key: more raw
    /// bytes than a block's payload.
    fn many_compressible() -> (Vec<String>, Vec<String>) {
        let keys: Vec<String> = (0..60).map(|i| format!("key:{i:012}")).collect();
        let values = keys.iter().map(|k| k.repeat(4)).collect();
        (keys, values)
    }

    fn records_of<'a>(keys: &'a [String], values: &'a [String]) -> Vec<Record<'a>> {
        keys.iter()
            .zip(values)
            .map(|(k, v)| Record {
                key: k.as_bytes(),
                payload: Payload::Inline(v.as_bytes()),
                meta: Meta::default(),
            })
            .collect()
    }

    fn packed_block() -> (Vec<u8>, Vec<Record<'static>>) {
        let (keys, values) = many_compressible();
        let (keys, values) = (keys.leak(), values.leak());
        let recs = records_of(keys, values);
        let stored = Stored::of(
            recs.iter().copied(),
            Packing::Host(None),
            &AtomicU64::new(0),
        )
        .unwrap();
        let mut block = vec![0u8; BLOCK_SIZE];
        assert!(stored.seal(&mut block, owner()), "{} bytes", stored.len());
        (block, recs)
    }

    #[test]
    fn a_packed_block_holds_more_records_than_a_raw_one() {
        let (keys, values) = many_compressible();
        let recs = records_of(&keys, &values);
        let raw: usize = recs.iter().map(Record::encoded_len).sum();
        assert!(raw > PAYLOAD, "the records overflow a raw block");
        assert!(!seal(
            &mut vec![0u8; BLOCK_SIZE],
            owner(),
            recs.iter().copied()
        ));
        let (block, recs) = packed_block();
        assert_eq!(block[5], PACKED);
        assert_eq!(
            open(&block, owner(), &none(), &mut Vec::new())
                .unwrap()
                .collect::<Vec<_>>(),
            recs
        );
    }

    /// Bit flips anywhere in the header or stored payload, a stored length cut short or
    /// grown, and a raw length that lies are all misses, never records.
    #[test]
    fn a_damaged_packed_block_is_no_data() {
        let (block, _) = packed_block();
        let len = usize::from(u16::from_le_bytes([block[18], block[19]]));
        let mut scratch = Vec::new();
        for at in (0..HEADER + len).step_by(7).chain([5, HEADER, HEADER + 1]) {
            let mut bad = block.clone();
            bad[at] ^= 0x04;
            assert!(
                open(&bad, owner(), &none(), &mut scratch).is_none(),
                "flipped byte {at} went unnoticed"
            );
        }
        let resealed = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut bad = block.clone();
            edit(&mut bad);
            let len = usize::from(u16::from_le_bytes([bad[18], bad[19]])).min(PAYLOAD);
            let crc = checksum(&bad, len);
            bad[28..32].copy_from_slice(&crc.to_le_bytes());
            bad
        };
        // Damage the checksum cannot see (written with a good checksum) is still refused.
        for stored_len in [0, 1, 2, len - 1, len + 1, PAYLOAD] {
            let bad = resealed(&|b| b[18..20].copy_from_slice(&(stored_len as u16).to_le_bytes()));
            assert!(
                open(&bad, owner(), &none(), &mut scratch).is_none(),
                "stored length {stored_len}"
            );
        }
        let bad = resealed(&|b| b[18..20].copy_from_slice(&(PAYLOAD as u16 + 1).to_le_bytes()));
        assert!(
            open(&bad, owner(), &none(), &mut scratch).is_none(),
            "oversized length"
        );
        let raw_len = u16::from_le_bytes([block[HEADER], block[HEADER + 1]]);
        for lie in [raw_len - 1, raw_len + 1, u16::MAX] {
            let bad = resealed(&|b| b[HEADER..HEADER + 2].copy_from_slice(&lie.to_le_bytes()));
            assert!(
                open(&bad, owner(), &none(), &mut scratch).is_none(),
                "raw length {lie}"
            );
        }
        let bad = resealed(&|b| b[6..8].copy_from_slice(&59u16.to_le_bytes()));
        assert!(
            open(&bad, owner(), &none(), &mut scratch).is_none(),
            "record count"
        );
        let bad = resealed(&|b| b[5] = 3);
        assert!(
            open(&bad, owner(), &none(), &mut scratch).is_none(),
            "unknown packing"
        );
    }

    /// A block written by format version 2 (the same header with byte 5 reserved, 0) reads
    /// as before; a packed block claiming version 2 does not.
    #[test]
    fn a_version_2_block_reads_as_before() {
        let (keys, values) = (["a".to_string()], ["1".to_string()]);
        let recs = records_of(&keys, &values);
        let mut block = vec![0u8; BLOCK_SIZE];
        assert!(seal(&mut block, owner(), recs.iter().copied()));
        block[4] = RAW_ONLY_VERSION;
        let len = usize::from(u16::from_le_bytes([block[18], block[19]]));
        let crc = checksum(&block, len);
        block[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            open(&block, owner(), &none(), &mut Vec::new())
                .unwrap()
                .collect::<Vec<_>>(),
            recs
        );
        let (mut packed, _) = packed_block();
        packed[4] = RAW_ONLY_VERSION;
        let len = usize::from(u16::from_le_bytes([packed[18], packed[19]]));
        let crc = checksum(&packed, len);
        packed[28..32].copy_from_slice(&crc.to_le_bytes());
        assert!(open(&packed, owner(), &none(), &mut Vec::new()).is_none());
    }
}
