//! `device_compression=host`: the host packs each sub-page block's records, so that on a
//! drive that stores every byte it is given, one 4 KiB block holds as many records as
//! compress into it (`docs/FORMAT.md`, "Packed payload").
//!
//! Packed payload: the records' raw length (u16 LE), then one LZ4 block of them; or,
//! while the tier has a block dictionary (`ssd/dictionary.rs`), the dictionary's id
//! (u32 LE) and one zstd frame compressed with it, whose checksum refuses a frame
//! decoded with any other dictionary. Packing happens in the flusher (merges, splits); a
//! GET only unpacks the one block it read.
//!
//! Codecs only: which dictionary a block is packed with, and which one an id names, is
//! the block dictionaries' business (`ssd/dictionary.rs`), which packs through here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::dictionary::Dictionary;
use crate::format::block::{PACKED, PACKED_ZSTD};
use crate::format::packing::{DICTIONARY, LZ4_BLOCK, RAW_LEN, RAW_MAX, ZSTD_FRAME};

/// `raw` packed (its length, then LZ4, or the dictionary's id and zstd with `dictionary`
/// when given), with its packing byte; `None` when packing would not make it smaller or
/// it is longer than [`RAW_MAX`]. Adds the time spent to `spent_ns`.
pub fn pack(
    raw: &[u8],
    dictionary: Option<(u32, &Dictionary)>,
    spent_ns: &AtomicU64,
) -> Option<(Vec<u8>, u8)> {
    if raw.len() > RAW_MAX {
        return None;
    }
    let Some((id, dictionary)) = dictionary else {
        let mut packed = vec![0; LZ4_BLOCK];
        packed.reserve(lzzzz::lz4::max_compressed_size(raw.len()));
        RAW_LEN.set(&mut packed, raw.len() as u16);
        return compress_if_smaller(raw, &mut packed, spent_ns).then_some((packed, PACKED));
    };
    let started = Instant::now();
    let mut packed = vec![0; ZSTD_FRAME];
    RAW_LEN.set(&mut packed, raw.len() as u16);
    DICTIONARY.set(&mut packed, id);
    let compressed = dictionary.compress(raw, &mut packed).is_some();
    spent_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    (compressed && packed.len() < raw.len()).then_some((packed, PACKED_ZSTD))
}

/// The raw records of a payload of packing `packing`, unpacked into `scratch`; `None`
/// unless it decodes to exactly the length it claims (with, for zstd, the dictionary of
/// the id it names, as `dictionary_of` gives it, and the frame's checksum good).
pub fn unpack<'s>(
    packing: u8,
    packed: &[u8],
    dictionary_of: impl FnOnce(u32) -> Option<Arc<Dictionary>>,
    scratch: &'s mut Vec<u8>,
) -> Option<&'s [u8]> {
    let raw_len = usize::from(RAW_LEN.get(packed.get(..RAW_LEN.end())?));
    match packing {
        PACKED => {
            scratch.clear();
            scratch.resize(raw_len, 0);
            decompress_exactly(&packed[LZ4_BLOCK..], scratch).then_some(&scratch[..])
        }
        PACKED_ZSTD => {
            let (header, frame) = packed.split_at_checked(ZSTD_FRAME)?;
            let dictionary = dictionary_of(DICTIONARY.get(header))?;
            *scratch = dictionary.decompress(frame, raw_len)?;
            Some(&scratch[..])
        }
        _ => None,
    }
}

/// Appends `raw` compressed with LZ4 to `out` and says whether `out`, with whatever it held
/// before, is now shorter than `raw` (after a `false` its bytes are not to be used). Adds
/// the time spent to `spent_ns`. Sub-page blocks without a dictionary (above) and
/// large-object extents (`large_objects/`) are packed through here.
pub fn compress_if_smaller(raw: &[u8], out: &mut Vec<u8>, spent_ns: &AtomicU64) -> bool {
    let started = Instant::now();
    let compressed = lzzzz::lz4::compress_to_vec(raw, out, lzzzz::lz4::ACC_LEVEL_DEFAULT).is_ok();
    spent_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    compressed && out.len() < raw.len()
}

/// Decodes one LZ4 block into `raw`: true only if it fills `raw` exactly.
pub fn decompress_exactly(block: &[u8], raw: &mut [u8]) -> bool {
    matches!(lzzzz::lz4::decompress(block, raw), Ok(n) if n == raw.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No block dictionary known by any id.
    fn none(_: u32) -> Option<Arc<Dictionary>> {
        None
    }

    #[test]
    fn packed_bytes_unpack_to_the_raw_ones() {
        let spent = AtomicU64::new(0);
        let raw: Vec<u8> = (0..3000u32).map(|i| (i % 7) as u8).collect();
        let (packed, packing) = pack(&raw, None, &spent).expect("repetitive bytes pack smaller");
        assert_eq!(packing, PACKED);
        assert!(packed.len() < raw.len() / 4);
        let mut scratch = Vec::new();
        assert_eq!(unpack(packing, &packed, none, &mut scratch), Some(&raw[..]));
        assert!(spent.load(Ordering::Relaxed) > 0);
    }

    /// A packed payload that lies about its raw length, or is cut short, is refused.
    #[test]
    fn damaged_packed_bytes_are_refused() {
        let spent = AtomicU64::new(0);
        let raw: Vec<u8> = (0..3000u32).map(|i| (i % 13) as u8).collect();
        let (packed, packing) = pack(&raw, None, &spent).unwrap();
        let mut scratch = Vec::new();
        for claimed in [raw.len() - 1, raw.len() + 1, 0, RAW_MAX] {
            let mut lying = packed.clone();
            lying[..2].copy_from_slice(&(claimed as u16).to_le_bytes());
            assert!(
                unpack(packing, &lying, none, &mut scratch).is_none(),
                "claimed {claimed}"
            );
        }
        for cut in [0, 1, 2, packed.len() / 2, packed.len() - 1] {
            assert!(
                unpack(packing, &packed[..cut], none, &mut scratch).is_none(),
                "cut at {cut}"
            );
        }
        assert!(unpack(3, &packed, none, &mut scratch).is_none());
    }
}
