//! `device_compression=host`: the host packs each sub-page block's records, so that on a
//! drive that stores every byte it is given, one 4 KiB block holds as many records as
//! compress into it (`docs/FORMAT.md`, "Packed payload").
//!
//! Packed payload: the records' raw length (u16 LE), then one LZ4 block of them; or,
//! while the tier has a block dictionary (`ssd/dictionary.rs`), the dictionary's id
//! (u32 LE) and one zstd frame compressed with it, whose checksum refuses a frame
//! decoded with any other dictionary. Packing happens in the flusher (merges, splits); a
//! GET only unpacks the one block it read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::dictionary::{BlockDictionaries, BlockDictionary};
use crate::format::block::{PACKED, PACKED_ZSTD};
use crate::format::packing::{DICTIONARY, LZ4_BLOCK, RAW_LEN, RAW_MAX, ZSTD_FRAME};

/// `raw` packed (its length, then LZ4, or the dictionary's id and zstd with `dictionary`
/// when given), with its packing byte; `None` when packing would not make it smaller or
/// it is longer than [`RAW_MAX`]. Adds the time spent to `spent_ns`.
pub fn pack(
    raw: &[u8],
    dictionary: Option<(u32, &BlockDictionary)>,
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
/// unless it decodes to exactly the length it claims (with, for zstd, the dictionary it
/// names, known to `dictionaries`, and the frame's checksum good).
pub fn unpack<'s>(
    packing: u8,
    packed: &[u8],
    dictionaries: &BlockDictionaries,
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
            let dictionary = dictionaries.get(DICTIONARY.get(header))?;
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
    use std::sync::Arc;

    use super::*;
    use crate::dictionary::page::tests::text_records;
    use crate::dictionary::training::train_from_samples;
    use crate::memory::Memory;

    fn none() -> BlockDictionaries {
        BlockDictionaries::open(None, None, Arc::default())
    }

    /// A dictionary trained on text records like the ones packed below, not those.
    fn trained(seed: u64) -> Arc<BlockDictionary> {
        let samples: Vec<Vec<u8>> = (0..2000u64)
            .map(|i| text_records(seed ^ (i << 20), 1))
            .collect();
        let samples: Vec<&[u8]> = samples.iter().map(|s| &s[..]).collect();
        let raw = train_from_samples(&samples, 32 << 10).expect("trains");
        BlockDictionary::prepare(&raw, Arc::new(Memory::default())).expect("prepares")
    }

    /// A table whose current dictionary is `dictionary`.
    fn holding(dictionary: &Arc<BlockDictionary>) -> BlockDictionaries {
        let training = crate::dictionary::training::TrainingSettings {
            samples: 64,
            dictionary_size: 16 << 10,
        };
        let dictionaries = BlockDictionaries::open(Some(training), None, Arc::default());
        dictionaries.make_candidate(dictionary.clone());
        dictionaries.adopt();
        assert!(dictionaries.current().is_some());
        dictionaries
    }

    #[test]
    fn packed_bytes_unpack_to_the_raw_ones() {
        let spent = AtomicU64::new(0);
        let raw: Vec<u8> = (0..3000u32).map(|i| (i % 7) as u8).collect();
        let (packed, packing) = pack(&raw, None, &spent).expect("repetitive bytes pack smaller");
        assert_eq!(packing, PACKED);
        assert!(packed.len() < raw.len() / 4);
        let mut scratch = Vec::new();
        assert_eq!(
            unpack(packing, &packed, &none(), &mut scratch),
            Some(&raw[..])
        );
        assert!(spent.load(Ordering::Relaxed) > 0);
    }

    /// Text records packed with zstd and a trained dictionary: smaller than LZ4, named by
    /// the dictionary's id, and read back only with that very dictionary.
    #[test]
    fn zstd_with_a_dictionary_round_trips_and_only_with_it() {
        let spent = AtomicU64::new(0);
        let raw = text_records(0x5151, 70);
        let dictionary = trained(1);
        let (lz4, _) = pack(&raw, None, &spent).unwrap();
        let (packed, packing) = pack(&raw, Some((1, &dictionary)), &spent).unwrap();
        assert_eq!(packing, PACKED_ZSTD);
        assert_eq!(DICTIONARY.get(&packed), 1);
        let mut scratch = Vec::new();
        assert!(
            packed.len() * 10 < lz4.len() * 9,
            "{} with the dictionary, {} LZ4",
            packed.len(),
            lz4.len()
        );
        let with = holding(&dictionary);
        let id = with.current().unwrap().id;
        let (packed, _) = pack(&raw, Some((id, &dictionary)), &spent).unwrap();
        assert_eq!(
            unpack(packing, &packed, &with, &mut scratch),
            Some(&raw[..])
        );
        // No dictionary by that id, or another one under its id: refused.
        assert_eq!(unpack(packing, &packed, &none(), &mut scratch), None);
        let impostor = holding(&trained(2));
        assert_eq!(unpack(packing, &packed, &impostor, &mut scratch), None);
        // A frame cut short or damaged, a raw length that lies: refused.
        let mut damaged = packed.clone();
        let last = damaged.len() - 3;
        damaged[last] ^= 0x20;
        assert_eq!(unpack(packing, &damaged, &with, &mut scratch), None);
        for cut in [0, 1, ZSTD_FRAME, packed.len() - 1] {
            assert_eq!(unpack(packing, &packed[..cut], &with, &mut scratch), None);
        }
        let mut lying = packed.clone();
        RAW_LEN.set(&mut lying, raw.len() as u16 - 1);
        assert_eq!(unpack(packing, &lying, &with, &mut scratch), None);
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
        let dictionary = trained(3);
        for with in [None, Some((1, &*dictionary))] {
            assert!(pack(&noise, with, &spent).is_none());
            assert!(pack(&vec![0u8; RAW_MAX + 1], with, &spent).is_none());
            assert!(pack(&vec![0u8; RAW_MAX], with, &spent).is_some());
        }
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
                unpack(packing, &lying, &none(), &mut scratch).is_none(),
                "claimed {claimed}"
            );
        }
        for cut in [0, 1, 2, packed.len() / 2, packed.len() - 1] {
            assert!(
                unpack(packing, &packed[..cut], &none(), &mut scratch).is_none(),
                "cut at {cut}"
            );
        }
        assert!(unpack(3, &packed, &none(), &mut scratch).is_none());
    }
}
