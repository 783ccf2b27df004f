//! The keys a leaf answers for (`KeyRange`), and where a split cuts a leaf's sorted items
//! into new leaves and at which low fences (`cut_into_leaves`, `split_fences`).

use super::Fence;

/// The keys a leaf answers for, kept by the leaf itself under its own lock: readers that
/// routed through a tree which changed a moment later check here before trusting it.
#[derive(Clone, Debug)]
pub struct KeyRange {
    pub low: Fence,
    /// `None`: no upper bound (the last leaf).
    pub high: Option<Fence>,
    /// Removed from the tree; its range went to its left neighbour.
    pub retired: bool,
}

/// A leaf state that keeps its own `KeyRange`.
pub trait Ranged {
    fn range(&mut self) -> &mut KeyRange;
}

impl KeyRange {
    /// The range of a tree's first leaf: every key.
    pub fn everything() -> KeyRange {
        KeyRange {
            low: Fence::from(&[][..]),
            high: None,
            retired: false,
        }
    }

    pub fn new(low: Fence, high: Option<Fence>) -> KeyRange {
        KeyRange {
            low,
            high,
            retired: false,
        }
    }

    pub fn owns(&self, key: &[u8]) -> bool {
        !self.retired
            && self.low.as_ref() <= key
            && self.high.as_ref().is_none_or(|h| key < h.as_ref())
    }

    /// Gives `victim`'s range (whose low fence is `low`) to `self`, its left neighbour.
    /// Both are locked by the caller; false if either changed since it chose them.
    pub fn absorb_right(&mut self, victim: &mut KeyRange, low: &Fence) -> bool {
        if self.retired || self.high.as_ref() != Some(low) || victim.retired || victim.low != *low {
            return false;
        }
        self.high = victim.high.clone();
        victim.retired = true;
        true
    }
}

/// Where to cut `n` sorted items into leaves: consecutive chunks that `fits` (given a
/// chunk's start and end) accepts, or single items. A chunk that does not fit is cut at
/// `cut(start, end)`, strictly inside it, and both sides are cut again.
pub fn cut_into_leaves(
    n: usize,
    fits: impl Fn(usize, usize) -> bool,
    cut: impl Fn(usize, usize) -> usize,
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pending = vec![(0, n)];
    while let Some((start, end)) = pending.pop() {
        if end - start <= 1 || fits(start, end) {
            out.push((start, end));
            continue;
        }
        let mid = cut(start, end);
        pending.push((mid, end));
        pending.push((start, mid));
    }
    out
}

/// The low fences of the leaves that `chunks` (from [`cut_into_leaves`]) of sorted
/// `items` become, the first excepted: the shortest separator between each chunk's last
/// key and the next chunk's first.
pub fn split_fences<T>(
    items: &[T],
    chunks: &[(usize, usize)],
    key: impl Fn(&T) -> &[u8],
) -> Vec<Fence> {
    chunks
        .windows(2)
        .map(|pair| separator(key(&items[pair[0].1 - 1]), key(&items[pair[1].0])))
        .collect()
}

/// The shortest key `s` with `left < s <= right`: a prefix of `right` (suffix truncation
/// keeps inner-node fences short).
fn separator(left: &[u8], right: &[u8]) -> Fence {
    debug_assert!(left < right);
    let common = left.iter().zip(right).take_while(|(a, b)| a == b).count();
    Fence::from(&right[..(common + 1).min(right.len())])
}
