//! Sub-page hashing (paper §3.2 and §3.3): which sub-page of a leaf an object lives in.
//!
//! A GET computes its object's sub-page before touching the page, which is what lets
//! the DRAM tier stop decompressing early and the SSD tier read a single 4 KiB block.
//! The DRAM hash `f` and the SSD hash `g` use different seeds so that objects sharing a
//! DRAM sub-page do not all crowd into one SSD sub-page, and vice versa. Both are part
//! of the on-SSD format (`g` decides where an object is stored) and must never change.

use xxhash_rust::xxh3::xxh3_64_with_seed;

const SEED_DRAM: u64 = 0x5a1b_cace_0000_0f00;
const SEED_SSD: u64 = 0x5a1b_cace_0000_0600;

/// `f(key) mod n`: the DRAM leaf sub-page of `key`.
pub fn dram_subpage(key: &[u8], subpages: usize) -> usize {
    (xxh3_64_with_seed(key, SEED_DRAM) % subpages as u64) as usize
}

/// `g(key) mod m`: the 4 KiB SSD sub-page of `key` within its super-leaf.
pub fn ssd_subpage(key: &[u8], subpages: usize) -> usize {
    (xxh3_64_with_seed(key, SEED_SSD) % subpages as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_spread_and_are_independent() {
        let n = 16;
        let mut dram = vec![0u32; n];
        let mut same = 0;
        for i in 0..16_000u32 {
            let key = format!("{i:016}");
            let f = dram_subpage(key.as_bytes(), n);
            dram[f] += 1;
            same += u32::from(f == ssd_subpage(key.as_bytes(), n));
        }
        assert!(dram.iter().all(|&c| (800..1200).contains(&c)), "{dram:?}");
        assert!(
            (800..1200).contains(&same),
            "f and g agree {same} times of 16000"
        );
    }

    /// `g` of keys 0..8 as format version 1 places them.
    const PINNED_SSD: [usize; 8] = [1, 4, 2, 3, 12, 1, 7, 1];

    #[test]
    fn hashes_are_stable() {
        // Part of the on-SSD format: a change here must bump the format version.
        let pinned: Vec<usize> = (0..8u32)
            .map(|i| ssd_subpage(format!("{i:016}").as_bytes(), 16))
            .collect();
        assert_eq!(
            pinned, PINNED_SSD,
            "g changed: bump the on-SSD format version"
        );
        assert_eq!(dram_subpage(b"", 1), 0);
    }
}
