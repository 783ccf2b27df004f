//! Promotion filter: which SSD-tier hits are copied into DRAM (`promotion = second_hit`).
//!
//! Inclusive caching copies an SSD hit into DRAM as a clean object. In a look-aside
//! workload those copies are most of what enters DRAM, and every clean copy takes room a
//! dirty object could use to wait for company before its super-leaf is rewritten (see
//! `dram::eviction::drop_clean`). Copying a key only on its second SSD hit within a
//! short window keeps one-off reads on the SSD.
//!
//! The window is a table of 32-bit key fingerprints, one slot per key hash: a hit whose
//! fingerprint is in its slot is admitted (and the slot cleared); otherwise the
//! fingerprint takes the slot. A collision only forgets a sighting (a later promotion),
//! never admits a wrong key with more than 2^-31 odds; either way the value served is
//! the one just read, so the filter cannot make a GET wrong.

use std::sync::atomic::{AtomicU32, Ordering};

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Independent of the sub-page hashes f and g.
const SEED: u64 = 0x7a63_7072_6f6d_6f74;

/// DRAM bytes per slot of the window: one slot per ~3 DRAM-resident small objects, 1.6 %
/// of the DRAM budget.
pub const DRAM_BYTES_PER_SLOT: u64 = 256;

pub struct PromotionFilter {
    slots: Box<[AtomicU32]>,
}

impl PromotionFilter {
    pub fn new(slots: usize) -> PromotionFilter {
        PromotionFilter {
            slots: (0..slots.max(1)).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// DRAM the table takes (charged to the index).
    pub fn bytes(&self) -> usize {
        size_of_val(&*self.slots)
    }

    /// Whether this SSD hit of `key` should be copied into DRAM: true on the key's second
    /// sighting since its slot last changed hands.
    pub fn admit(&self, key: &[u8]) -> bool {
        let hash = xxh3_64_with_seed(key, SEED);
        let slot = &self.slots[(hash % self.slots.len() as u64) as usize];
        // Never 0, which marks an empty slot.
        let fingerprint = (hash >> 32) as u32 | 1;
        // Relaxed and not a compare-exchange: two racing hits of one key at worst both
        // promote (the second finds DRAM already holding it) or both wait one more hit.
        if slot.load(Ordering::Relaxed) == fingerprint {
            slot.store(0, Ordering::Relaxed);
            true
        } else {
            slot.store(fingerprint, Ordering::Relaxed);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_a_key_on_its_second_sighting() {
        let filter = PromotionFilter::new(1024);
        assert!(!filter.admit(b"k1"));
        assert!(filter.admit(b"k1"));
        // Admission clears the slot: the next hit starts over.
        assert!(!filter.admit(b"k1"));
        assert_eq!(filter.bytes(), 4096);
    }

    #[test]
    fn a_colliding_key_takes_the_slot() {
        let filter = PromotionFilter::new(1);
        assert!(!filter.admit(b"a"));
        assert!(
            !filter.admit(b"b"),
            "a different fingerprint is not admitted"
        );
        assert!(!filter.admit(b"a"), "b took the only slot");
        assert!(filter.admit(b"a"));
    }
}
