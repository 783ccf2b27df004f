//! `device_compression=host`: the host packs each sub-page block's records with LZ4, so
//! that on a drive that stores every byte it is given, one 4 KiB block holds as many
//! records as compress into it (`docs/FORMAT.md`, "Packing").
//!
//! Packed payload: the records' raw length (u16 LE), then one LZ4 block of them. Packing
//! happens in the flusher (merges, splits); a GET only unpacks the one block it read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::format::packing::{LZ4_BLOCK, RAW_LEN, RAW_MAX};

/// `raw` packed (its length, then LZ4), or `None` when packing would not make it smaller
/// or it is longer than [`RAW_MAX`]. Adds the time spent to `spent_ns`.
pub fn pack(raw: &[u8], spent_ns: &AtomicU64) -> Option<Vec<u8>> {
    if raw.len() > RAW_MAX {
        return None;
    }
    let mut packed = vec![0; LZ4_BLOCK];
    packed.reserve(lzzzz::lz4::max_compressed_size(raw.len()));
    RAW_LEN.set(&mut packed, raw.len() as u16);
    compress_if_smaller(raw, &mut packed, spent_ns).then_some(packed)
}

/// The raw records of a packed payload, unpacked into `scratch`; `None` unless the LZ4
/// block decodes to exactly the length it claims.
pub fn unpack<'s>(packed: &[u8], scratch: &'s mut Vec<u8>) -> Option<&'s [u8]> {
    let (length, block) = packed.split_at_checked(LZ4_BLOCK)?;
    let raw_len = usize::from(RAW_LEN.get(length));
    scratch.clear();
    scratch.resize(raw_len, 0);
    decompress_exactly(block, scratch).then_some(&scratch[..])
}

/// Appends `raw` compressed with LZ4 to `out` and says whether `out`, with whatever it held
/// before, is now shorter than `raw` (after a `false` its bytes are not to be used). Adds
/// the time spent to `spent_ns`. Sub-page blocks (above) and large-object extents
/// (`large_objects/`) are packed through here.
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

    #[test]
    fn packed_bytes_unpack_to_the_raw_ones() {
        let spent = AtomicU64::new(0);
        let raw: Vec<u8> = (0..3000u32).map(|i| (i % 7) as u8).collect();
        let packed = pack(&raw, &spent).expect("repetitive bytes pack smaller");
        assert!(packed.len() < raw.len() / 4);
        let mut scratch = Vec::new();
        assert_eq!(unpack(&packed, &mut scratch), Some(&raw[..]));
        assert!(spent.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn what_packing_cannot_shrink_or_describe_is_not_packed() {
        let spent = AtomicU64::new(0);
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let noise: Vec<u8> = (0..2000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        assert!(pack(&noise, &spent).is_none());
        assert!(pack(&vec![0u8; RAW_MAX + 1], &spent).is_none());
        assert!(pack(&vec![0u8; RAW_MAX], &spent).is_some());
    }

    /// A packed payload that lies about its raw length, or is cut short, is refused.
    #[test]
    fn damaged_packed_bytes_are_refused() {
        let spent = AtomicU64::new(0);
        let raw: Vec<u8> = (0..3000u32).map(|i| (i % 13) as u8).collect();
        let packed = pack(&raw, &spent).unwrap();
        let mut scratch = Vec::new();
        for claimed in [raw.len() - 1, raw.len() + 1, 0, RAW_MAX] {
            let mut lying = packed.clone();
            lying[..2].copy_from_slice(&(claimed as u16).to_le_bytes());
            assert!(unpack(&lying, &mut scratch).is_none(), "claimed {claimed}");
        }
        for cut in [0, 1, 2, packed.len() / 2, packed.len() - 1] {
            assert!(
                unpack(&packed[..cut], &mut scratch).is_none(),
                "cut at {cut}"
            );
        }
    }
}
