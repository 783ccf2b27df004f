//! Adaptive compression bypassing (paper §3.2): leaves accessed far more than the rest
//! stay uncompressed, so hot GETs and PUTs skip LZ4 entirely.
//!
//! Every leaf counts its accesses. A background pass computes the mean µ and standard
//! deviation σ of the counters, marks the leaves above µ + r·σ hot (hottest first, within
//! a DRAM cap), and halves every counter so old accesses age out. With no locality σ is
//! small and µ + r·σ is reached only by noise; a floor on the count keeps such leaves
//! out. `r = 0` turns bypassing off.

use std::sync::atomic::{AtomicU64, Ordering};

/// Accesses a leaf needs within one aging period before it can be hot at all.
const MIN_HOT_ACCESSES: u32 = 32;

#[derive(Debug)]
pub struct Bypass {
    r_bits: AtomicU64,
    threshold_bits: AtomicU64,
}

impl Bypass {
    pub fn new(r: f64) -> Self {
        Bypass {
            r_bits: AtomicU64::new(r.to_bits()),
            threshold_bits: AtomicU64::new(f64::INFINITY.to_bits()),
        }
    }

    pub fn r(&self) -> f64 {
        f64::from_bits(self.r_bits.load(Ordering::Relaxed))
    }

    pub fn set_r(&self, r: f64) {
        self.r_bits.store(r.max(0.0).to_bits(), Ordering::Relaxed);
    }

    /// The access count above which a leaf was last judged hot.
    pub fn threshold(&self) -> f64 {
        f64::from_bits(self.threshold_bits.load(Ordering::Relaxed))
    }

    /// Chooses the hot leaves from their access counts: indexes into `counts`, hottest
    /// first, at most `max_hot` of them.
    pub fn choose(&self, counts: &[u32], max_hot: usize) -> Vec<usize> {
        let r = self.r();
        if r == 0.0 || counts.is_empty() || max_hot == 0 {
            self.threshold_bits
                .store(f64::INFINITY.to_bits(), Ordering::Relaxed);
            return Vec::new();
        }
        let n = counts.len() as f64;
        let mean = counts.iter().map(|&c| f64::from(c)).sum::<f64>() / n;
        let var = counts
            .iter()
            .map(|&c| (f64::from(c) - mean).powi(2))
            .sum::<f64>()
            / n;
        let threshold = (mean + r * var.sqrt()).max(f64::from(MIN_HOT_ACCESSES));
        self.threshold_bits
            .store(threshold.to_bits(), Ordering::Relaxed);
        let mut hot: Vec<usize> = (0..counts.len())
            .filter(|&i| f64::from(counts[i]) > threshold)
            .collect();
        hot.sort_unstable_by_key(|&i| std::cmp::Reverse(counts[i]));
        hot.truncate(max_hot);
        hot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_outliers_are_hot() {
        let b = Bypass::new(3.0);
        let mut counts = vec![50u32; 1000];
        counts[7] = 5000;
        counts[9] = 4000;
        assert_eq!(b.choose(&counts, 10), vec![7, 9]);
        assert_eq!(
            b.choose(&counts, 1),
            vec![7],
            "the DRAM cap keeps the hottest"
        );
        assert!(b.threshold() > 50.0);
    }

    #[test]
    fn uniform_load_and_r_zero_mean_no_bypass() {
        let b = Bypass::new(3.0);
        let counts: Vec<u32> = (0..1000).map(|i| 10 + (i % 7)).collect();
        assert!(
            b.choose(&counts, 100).is_empty(),
            "noise never reaches the floor"
        );
        let mut counts = vec![100u32; 1000];
        counts[1] = 10_000;
        b.set_r(0.0);
        assert!(b.choose(&counts, 100).is_empty());
        assert!(b.threshold().is_infinite());
    }
}
