//! The tree's nodes: inner nodes of `(low fence, node)` entries, and bottom nodes whose
//! leaves' fences are packed into one byte string, their shared prefix stored once; which
//! entry of a node routes a key, found by the fences' heads (`Heads`).

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
    heads: Heads,
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
        let heads = Heads::new(entries.iter().map(|(fence, _)| *fence));
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
            heads,
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
        with_first(self.count_after_first(key, strict), strict, || {
            match self.children.is_empty() {
                true => KeyOrder::Greater,
                false => self.prefix().iter().chain(self.suffix(0)).cmp(key.iter()),
            }
        })
    }

    /// How many fences after the first are below `key` (`strict`) or at most `key`.
    fn count_after_first(&self, key: &[u8], strict: bool) -> usize {
        // Fence `i + 1` after the bytes the heads' fences share (at least `shared`).
        let skip = self.heads.prefix.len() - self.shared as usize;
        self.heads
            .count_below(key, strict, |i| &self.suffix(i + 1)[skip..])
    }

    /// Index of the entry whose range holds `key`: the last with `fence <= key` (the
    /// first if none is).
    pub(super) fn route(&self, key: &[u8]) -> usize {
        self.count_after_first(key, false)
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
            + self.heads.bytes()
            + alloc_size(self.children.len() * size_of::<C>())
            + kept
    }
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A node's fences from its second on, laid out for search: the bytes they all begin
/// with, and each one's next 4 bytes as a big-endian number (`head`). A search compares
/// numbers read from one array, and reads a fence itself only where two heads are equal.
/// Comparing the fences chased a pointer and called memcmp at every step: the walk took
/// 13 % of the server's CPU in pipelined `SET`s and `GET`s of tiny values, half of it in
/// memcmp. The first fence stays out: the first node of each level, the root among them,
/// has the empty fence, and with it no prefix its fences share.
pub(super) struct Heads {
    prefix: Box<[u8]>,
    heads: Box<[u32]>,
}

/// The first 4 bytes of `bytes` (zeros after its end) as a big-endian number: where two
/// heads differ, their strings are ordered as the numbers are (a string that ends first
/// compares as if it went on with zeros, and is below whatever longer string it
/// begins); equal heads say nothing. Four bytes after the prefix a node's fences share
/// tell them apart (they are neighbours), in half the cache lines eight would take.
fn head(bytes: &[u8]) -> u32 {
    let mut first = [0u8; 4];
    let n = bytes.len().min(4);
    first[..n].copy_from_slice(&bytes[..n]);
    u32::from_be_bytes(first)
}

impl Heads {
    /// The heads of sorted `fences`, the node's fence 0 first (left out).
    fn new<'f>(fences: impl Iterator<Item = &'f [u8]>) -> Heads {
        let rest: Vec<&[u8]> = fences.skip(1).collect();
        let shared = match (rest.first(), rest.last()) {
            // Sorted: what the first and the last share, all share.
            (Some(first), Some(last)) => common_prefix(first, last),
            _ => 0,
        };
        Heads {
            prefix: rest.first().map_or(&[][..], |f| &f[..shared]).into(),
            heads: rest.iter().map(|f| head(&f[shared..])).collect(),
        }
    }

    /// How many of the fences (from the node's second) are below `key` (`strict`) or at
    /// most `key`; `rest(i)` is fence `i + 1` after `prefix`.
    fn count_below<'n>(&self, key: &[u8], strict: bool, rest: impl Fn(usize) -> &'n [u8]) -> usize {
        let prefix = &self.prefix[..];
        let start = &key[..key.len().min(prefix.len())];
        match start.cmp(prefix) {
            // Every fence starts with the prefix, so the prefix decides (a key that
            // ends inside it is Less).
            KeyOrder::Less => 0,
            KeyOrder::Greater => self.heads.len(),
            KeyOrder::Equal => {
                let key_rest = &key[prefix.len()..];
                let key_head = head(key_rest);
                let below = |i: usize| match self.heads[i].cmp(&key_head) {
                    KeyOrder::Equal => counts(rest(i).cmp(key_rest), strict),
                    order => order == KeyOrder::Less,
                };
                // The fences below are a run from the start: halve the rest of the
                // node until one entry is left, moving `base` without a branch.
                let (mut base, mut size) = (0, self.heads.len());
                if size == 0 {
                    return 0;
                }
                while size > 1 {
                    let half = size / 2;
                    base = if below(base + half) {
                        base + half
                    } else {
                        base
                    };
                    size -= half;
                }
                base + usize::from(below(base))
            }
        }
    }

    fn bytes(&self) -> usize {
        alloc_size(self.prefix.len()) + alloc_size(self.heads.len() * size_of::<u32>())
    }
}

/// Whether a fence ordered `order` against a key counts as below it (`strict`) or at
/// most it.
fn counts(order: KeyOrder, strict: bool) -> bool {
    order == KeyOrder::Less || (order == KeyOrder::Equal && !strict)
}

/// A node's count of fences below a key (`strict`) or at most it, from the count
/// `after_first` of those after the first and how fence 0 orders against the key
/// (`first`, asked only if none after it counts: they are sorted; `Greater` for a node
/// without entries).
fn with_first(after_first: usize, strict: bool, first: impl FnOnce() -> KeyOrder) -> usize {
    after_first + usize::from(after_first > 0 || counts(first(), strict))
}

/// The entries of an inner node: its children and their low fences, in key order, with
/// the fences' heads.
pub(super) struct InnerEntries<C> {
    entries: Box<[(Fence, Arc<Node<C>>)]>,
    heads: Heads,
}

impl<C> InnerEntries<C> {
    pub(super) fn new(entries: Vec<(Fence, Arc<Node<C>>)>) -> Self {
        InnerEntries {
            heads: Heads::new(entries.iter().map(|(fence, _)| &fence[..])),
            entries: entries.into_boxed_slice(),
        }
    }

    /// How many fences are below `key` (`strict`) or at most `key`.
    pub(super) fn count_below(&self, key: &[u8], strict: bool) -> usize {
        with_first(self.count_after_first(key, strict), strict, || {
            self.entries
                .first()
                .map_or(KeyOrder::Greater, |(fence, _)| fence[..].cmp(key))
        })
    }

    /// How many fences after the first are below `key` (`strict`) or at most `key`.
    fn count_after_first(&self, key: &[u8], strict: bool) -> usize {
        let skip = self.heads.prefix.len();
        self.heads
            .count_below(key, strict, |i| &self.entries[i + 1].0[skip..])
    }

    /// Index of the entry whose range holds `key`: the last with `fence <= key` (the
    /// first if none is).
    pub(super) fn route(&self, key: &[u8]) -> usize {
        self.count_after_first(key, false)
    }
}

impl<C> std::ops::Deref for InnerEntries<C> {
    type Target = [(Fence, Arc<Node<C>>)];

    fn deref(&self) -> &Self::Target {
        &self.entries
    }
}

pub(super) enum Children<C> {
    Leaves(LeafEntries<C>),
    Nodes(InnerEntries<C>),
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
                alloc_size(v.len() * size_of::<(Fence, Arc<Node<C>>)>()) + v.heads.bytes() + made
            }
        };
        (own + entries) as u64
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::{btree_set, vec};
    use proptest::prelude::*;

    use super::*;

    /// Bytes drawn from a few values, zeros among them, so that fences share long
    /// prefixes, run past 8 bytes after them, and end where others go on with zeros.
    fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        vec(
            prop_oneof![Just(0u8), Just(1u8), Just(b'k'), Just(255u8)],
            0..max,
        )
    }

    fn both_kinds(fences: &[&[u8]]) -> (LeafEntries<Arc<()>>, InnerEntries<Arc<()>>) {
        let leaf = Arc::new(());
        let leaves = LeafEntries::pack(fences.iter().map(|f| (*f, leaf.clone())));
        let below = Arc::new(Node {
            children: Children::Leaves(LeafEntries::pack([(&[][..], leaf)])),
        });
        let inner = InnerEntries::new(
            fences
                .iter()
                .map(|f| (Fence::from(*f), below.clone()))
                .collect(),
        );
        (leaves, inner)
    }

    /// A key that begins the fences' shared prefix but ends inside it is below every
    /// fence after the first, the one equal to the prefix included (its head and the
    /// key's rest are both empty).
    #[test]
    fn a_key_inside_the_shared_prefix_is_below_the_fences() {
        let (leaves, inner) = both_kinds(&[b"", b"kk", b"kkb", b"kkc"]);
        for strict in [false, true] {
            assert_eq!(leaves.count_below(b"k", strict), 1);
            assert_eq!(inner.count_below(b"k", strict), 1);
        }
        assert_eq!(inner.route(b"kk"), 1);
        assert_eq!(leaves.route(b"kkb\0"), 2);
        assert_eq!(inner.route(b"l"), 3);
    }

    proptest! {
        /// Both kinds of node count the fences below a key as comparing every fence
        /// would, whatever the fences and the key: heads decide only where they differ.
        #[test]
        fn heads_count_as_the_fences_compare(
            common in bytes(12),
            tails in btree_set(bytes(14), 1..70),
            empty_first in any::<bool>(),
            probes in vec((bytes(26), any::<bool>(), any::<prop::sample::Index>()), 1..40),
        ) {
            let mut fences: Vec<Vec<u8>> = tails
                .iter()
                .map(|t| [&common[..], t].concat())
                .collect();
            if empty_first && !fences[0].is_empty() {
                fences.insert(0, Vec::new());
            }
            let (leaves, inner) = both_kinds(&fences.iter().map(|f| &f[..]).collect::<Vec<_>>());
            for (probe, strict, at) in probes {
                // Keys near the fences too: a fence itself, and one cut or lengthened.
                let fence = at.get(&fences);
                let cut = fence[..fence.len() / 2].to_vec();
                let near = [fence.clone(), cut, [&fence[..], &[0]].concat()];
                for key in std::iter::once(probe).chain(near) {
                    let below = fences.iter().filter(|f| f[..] < key[..]).count();
                    let at_most = fences.iter().filter(|f| f[..] <= key[..]).count();
                    let expected = if strict { below } else { at_most };
                    prop_assert_eq!(leaves.count_below(&key, strict), expected, "{:?}", key);
                    prop_assert_eq!(inner.count_below(&key, strict), expected, "{:?}", key);
                    prop_assert_eq!(leaves.route(&key), at_most.saturating_sub(1));
                    prop_assert_eq!(inner.route(&key), at_most.saturating_sub(1));
                }
            }
        }
    }
}
