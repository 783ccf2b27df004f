//! The tree's nodes: inner nodes of `(low fence, node)` entries, and bottom nodes whose
//! leaves' fences are packed into one byte string, their shared prefix stored once; which
//! entry of a node routes a key.

use std::cmp::Ordering as KeyOrder;
use std::sync::Arc;

use super::{Child, Fence};
use crate::memory::alloc_size;

/// The entries of a bottom node: its leaves and their low fences, in key order. Fence
/// `i` is `keys[..shared]` followed by `keys[ends[i-1]..ends[i]]` (`ends[-1] = shared`).
pub(super) struct LeafEntries<C> {
    /// Leading bytes every fence of the node has in common, stored once at the front.
    shared: u16,
    keys: Box<[u8]>,
    ends: Box<[u16]>,
    pub(super) children: Box<[C]>,
}

impl<C: Child> LeafEntries<C> {
    /// Packs sorted `(fence, leaf)` pairs.
    pub(super) fn pack<'f>(entries: impl IntoIterator<Item = (&'f [u8], C)>) -> Self {
        let entries: Vec<(&[u8], C)> = entries.into_iter().collect();
        let shared = match (entries.first(), entries.last()) {
            // Sorted: what the first and the last share, all share.
            (Some((first, _)), Some((last, _))) => common_prefix(first, last),
            _ => 0,
        };
        let total = shared + entries.iter().map(|(f, _)| f.len() - shared).sum::<usize>();
        let mut keys = Vec::with_capacity(total);
        if let Some((first, _)) = entries.first() {
            keys.extend_from_slice(&first[..shared]);
        }
        let mut ends = Vec::with_capacity(entries.len());
        let mut children = Vec::with_capacity(entries.len());
        for (fence, child) in entries {
            keys.extend_from_slice(&fence[shared..]);
            // Fences are at most a key long (255 B) and a node holds at most FANOUT + 1.
            ends.push(u16::try_from(keys.len()).expect("a node's fences fit 64 KiB"));
            children.push(child);
        }
        LeafEntries {
            shared: shared as u16,
            keys: keys.into_boxed_slice(),
            ends: ends.into_boxed_slice(),
            children: children.into_boxed_slice(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.children.len()
    }

    fn prefix(&self) -> &[u8] {
        &self.keys[..self.shared as usize]
    }

    /// Fence `i` without its shared prefix.
    fn suffix(&self, i: usize) -> &[u8] {
        let start = if i == 0 {
            self.shared as usize
        } else {
            self.ends[i - 1] as usize
        };
        &self.keys[start..self.ends[i] as usize]
    }

    /// Fence `i` written into `out` (cleared first).
    pub(super) fn fence_into(&self, i: usize, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(self.prefix());
        out.extend_from_slice(self.suffix(i));
    }

    pub(super) fn fence(&self, i: usize) -> Fence {
        let mut out = Vec::new();
        self.fence_into(i, &mut out);
        Fence::from(out)
    }

    /// How many fences are below `key` (`strict`) or at most `key`.
    pub(super) fn count_below(&self, key: &[u8], strict: bool) -> usize {
        let prefix = self.prefix();
        let head = &key[..key.len().min(prefix.len())];
        match head.cmp(prefix) {
            // Every fence starts with the prefix, so the prefix decides.
            KeyOrder::Less => 0,
            KeyOrder::Greater => self.len(),
            // `key` is a proper prefix of the prefix: below every fence longer than it.
            KeyOrder::Equal if key.len() < prefix.len() => 0,
            KeyOrder::Equal => {
                let rest = &key[prefix.len()..];
                let below = |i: usize| match self.suffix(i).cmp(rest) {
                    KeyOrder::Less => true,
                    KeyOrder::Equal => !strict,
                    KeyOrder::Greater => false,
                };
                let (mut lo, mut hi) = (0, self.len());
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if below(mid) {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                lo
            }
        }
    }

    /// Index of the entry whose range holds `key`: the last with `fence <= key`.
    pub(super) fn route(&self, key: &[u8]) -> usize {
        self.count_below(key, false).saturating_sub(1)
    }

    /// The entries unpacked, for a rebuilt copy of the node.
    pub(super) fn unpack(&self) -> (Vec<u8>, Vec<(std::ops::Range<usize>, C)>) {
        let mut bytes = Vec::new();
        let mut entries = Vec::with_capacity(self.len() + 1);
        for (i, child) in self.children.iter().enumerate() {
            let start = bytes.len();
            bytes.extend_from_slice(self.prefix());
            bytes.extend_from_slice(self.suffix(i));
            entries.push((start..bytes.len(), child.clone()));
        }
        (bytes, entries)
    }

    /// Packs unpacked entries whose fences are ranges of `bytes`.
    pub(super) fn repack(bytes: &[u8], entries: &[(std::ops::Range<usize>, C)]) -> Self {
        Self::pack(entries.iter().map(|(r, c)| (&bytes[r.clone()], c.clone())))
    }

    /// DRAM of the packed arrays and of the fence copies the leaves keep.
    fn bytes(&self) -> usize {
        let kept: usize = (0..self.len())
            .map(|i| C::kept_fence_bytes(self.shared as usize + self.suffix(i).len()))
            .sum();
        alloc_size(self.keys.len())
            + alloc_size(self.ends.len() * size_of::<u16>())
            + alloc_size(self.children.len() * size_of::<C>())
            + kept
    }
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

pub(super) enum Children<C> {
    Leaves(LeafEntries<C>),
    Nodes(Vec<(Fence, Arc<Node<C>>)>),
}

pub(super) struct Node<C> {
    pub(super) children: Children<C>,
}

impl<C: Child> Node<C> {
    pub(super) fn len(&self) -> usize {
        match &self.children {
            Children::Leaves(v) => v.len(),
            Children::Nodes(v) => v.len(),
        }
    }

    /// The node's low fence. A bottom node makes it from its packed fences; the node
    /// above keeps it, and the levels above share that one allocation.
    pub(super) fn low(&self) -> Fence {
        match &self.children {
            Children::Leaves(v) => v.fence(0),
            Children::Nodes(v) => v[0].0.clone(),
        }
    }

    /// DRAM this node holds: its entries, and the fences it introduced (a node above
    /// bottom nodes holds the one fence made for each of them).
    pub(super) fn bytes(&self) -> u64 {
        let own = alloc_size(size_of::<Node<C>>() + 2 * size_of::<usize>());
        let entries = match &self.children {
            Children::Leaves(v) => v.bytes(),
            Children::Nodes(v) => {
                let made: usize = v
                    .iter()
                    .filter(|(_, n)| matches!(n.children, Children::Leaves(_)))
                    .map(|(f, _)| alloc_size(f.len() + 2 * size_of::<usize>()))
                    .sum();
                alloc_size(v.len() * size_of::<(Fence, Arc<Node<C>>)>()) + made
            }
        };
        (own + entries) as u64
    }
}

/// Index of the entry whose range holds `key`: the last entry with `low <= key`.
pub(super) fn route<T>(entries: &[(Fence, T)], key: &[u8]) -> usize {
    entries
        .partition_point(|(low, _)| low.as_ref() <= key)
        .saturating_sub(1)
}
