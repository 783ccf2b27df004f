//! The one B+ tree of ZipCache: an ordered index from key ranges to leaves.
//!
//! BT_DRAM, BT_SSD and BT_LO are all `BTree<L>` with different leaf types. The tree only
//! routes a key to the leaf whose range holds it; what a leaf stores, and how, is the
//! leaf type's business.
//!
//! Inner nodes are immutable and shared (`Arc`); a change copies the path from the root
//! to the changed node and publishes the new root with one atomic swap. Readers therefore
//! take no lock at all: they load the root and walk down. Writers of the structure (leaf
//! splits and removals, which are rare next to GETs) serialize on one mutex.
//!
//! Every entry carries the low fence of its subtree, so a leaf covers
//! `[its low, next leaf's low)`. The first leaf's low is the empty key and it is never
//! removed, so every key has a leaf.
//!
//! A reader may route by a root that was replaced a moment later; the leaf types keep
//! their own fences under their own locks and send the reader back to the root when the
//! key is no longer theirs (see `dram_tier`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

use crate::memory::alloc_size;

/// Entries per inner node before it splits. 64 keeps a path copy cheap (a few hundred
/// pointer copies) and the tree shallow (three levels index 260 k leaves).
const FANOUT: usize = 64;

pub type Fence = Arc<[u8]>;

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

enum Children<L> {
    Leaves(Vec<(Fence, Arc<L>)>),
    Nodes(Vec<(Fence, Arc<Node<L>>)>),
}

struct Node<L> {
    children: Children<L>,
}

impl<L> Node<L> {
    fn len(&self) -> usize {
        match &self.children {
            Children::Leaves(v) => v.len(),
            Children::Nodes(v) => v.len(),
        }
    }

    fn low(&self) -> Fence {
        match &self.children {
            Children::Leaves(v) => v[0].0.clone(),
            Children::Nodes(v) => v[0].0.clone(),
        }
    }

    /// DRAM this node holds: its entry vector and the fence keys it introduced.
    fn bytes(&self) -> u64 {
        let entry = size_of::<(Fence, Arc<()>)>();
        let fences: usize = match &self.children {
            Children::Leaves(v) => v.iter().map(|(k, _)| alloc_size(k.len() + 16)).sum(),
            Children::Nodes(_) => 0,
        };
        (alloc_size(size_of::<Node<L>>() + 16) + alloc_size(self.len() * entry) + fences) as u64
    }
}

/// Index of the entry whose range holds `key`: the last entry with `low <= key`.
fn route<T>(entries: &[(Fence, T)], key: &[u8]) -> usize {
    entries
        .partition_point(|(low, _)| low.as_ref() <= key)
        .saturating_sub(1)
}

pub struct BTree<L> {
    root: ArcSwap<Node<L>>,
    /// Serializes structural changes; never held while waiting for a leaf lock.
    writer: Mutex<()>,
    node_bytes: AtomicU64,
    leaves: AtomicU64,
    depth: AtomicU64,
}

impl<L> BTree<L> {
    /// A tree of one leaf covering every key.
    pub fn new(first: Arc<L>) -> Self {
        let root = Node {
            children: Children::Leaves(vec![(Fence::from(&[][..]), first)]),
        };
        let bytes = root.bytes();
        BTree {
            root: ArcSwap::from_pointee(root),
            writer: Mutex::new(()),
            node_bytes: AtomicU64::new(bytes),
            leaves: AtomicU64::new(1),
            depth: AtomicU64::new(1),
        }
    }

    /// The leaf whose range holds `key`, with that range's low fence.
    pub fn find(&self, key: &[u8]) -> (Fence, Arc<L>) {
        self.with_leaf(key, |low, leaf| (low.clone(), leaf.clone()))
    }

    /// Runs `f` on the leaf whose range holds `key` without taking a reference count:
    /// the loaded root keeps the leaf alive, and two threads reading one hot leaf do
    /// not fight over its counter's cache line.
    pub fn with_leaf<R>(&self, key: &[u8], f: impl FnOnce(&Fence, &Arc<L>) -> R) -> R {
        let root = self.root.load();
        let mut node: &Node<L> = &root;
        loop {
            match &node.children {
                Children::Nodes(v) => node = &v[route(v, key)].1,
                Children::Leaves(v) => {
                    let (low, leaf) = &v[route(v, key)];
                    return f(low, leaf);
                }
            }
        }
    }

    /// Takes the leaf at `low` (not the first) out of the tree: its range goes to its left
    /// neighbour, and `release` runs on its state while both are locked. Returns the
    /// change in inner-node bytes, or `None` if either leaf changed since the caller
    /// chose them.
    pub fn retire<S: Ranged>(
        &self,
        low: &Fence,
        leaf: &Arc<L>,
        state: impl Fn(&L) -> &RwLock<S>,
        release: impl FnOnce(&mut S),
    ) -> Option<i64> {
        let prev = self.prev_leaf(low)?;
        self.collapse(&[prev, (low.clone(), leaf.clone())], state, |states| {
            release(&mut states[1])
        })
    }

    /// Folds the consecutive leaves `run[1..]` into `run[0]`: locks them all in key order,
    /// checks that they are still in the tree and consecutive, hands the ranges of
    /// `run[1..]` to `run[0]` (marking them retired), runs `release` on all their states
    /// while every lock is still held, and removes `run[1..]` from the tree. Returns the
    /// change in inner-node bytes, or `None` (nothing released) if any leaf changed since
    /// the caller chose them.
    pub fn collapse<S: Ranged>(
        &self,
        run: &[(Fence, Arc<L>)],
        state: impl Fn(&L) -> &RwLock<S>,
        release: impl FnOnce(&mut [RwLockWriteGuard<'_, S>]),
    ) -> Option<i64> {
        let mut states: Vec<_> = run.iter().map(|(_, leaf)| state(leaf).write()).collect();
        for (i, st) in states.iter_mut().enumerate() {
            let range = st.range();
            let next = run.get(i + 1).map(|(low, _)| low);
            if range.retired
                || range.low != run[i].0
                || next.is_some_and(|n| range.high.as_ref() != Some(n))
            {
                return None;
            }
        }
        for i in (1..run.len()).rev() {
            let (left, right) = states.split_at_mut(i);
            let absorbed = left[i - 1]
                .range()
                .absorb_right(right[0].range(), &run[i].0);
            debug_assert!(absorbed, "checked above, under the same locks");
        }
        release(&mut states);
        Some(run[1..].iter().map(|(low, _)| self.remove(low)).sum())
    }

    /// One step of a CLOCK hand walking the leaves in key order: the leaf at `hand`, and
    /// `hand` moved to the next leaf (back to the first after the last).
    pub fn clock_step(&self, hand: &mut Fence) -> (Fence, Arc<L>) {
        let (low, leaf) = self.find(hand);
        *hand = self
            .next_leaf(&low)
            .map_or_else(|| Fence::from(&[][..]), |(next, _)| next);
        (low, leaf)
    }

    /// The leaf after the one whose low fence is `low`, in key order, if any.
    pub fn next_leaf(&self, low: &[u8]) -> Option<(Fence, Arc<L>)> {
        let root = self.root.load();
        let mut found = None;
        Self::for_each_from(&root, low, &mut |fence, leaf| {
            if fence.as_ref() > low {
                found = Some((fence.clone(), leaf.clone()));
                false
            } else {
                true
            }
        });
        found
    }

    /// The leaf just before the one whose low fence is `low`: the one holding the keys
    /// immediately below `low`.
    pub fn prev_leaf(&self, low: &[u8]) -> Option<(Fence, Arc<L>)> {
        let below = |entries_low: &[u8]| entries_low < low;
        let root = self.root.load();
        let mut node: &Node<L> = &root;
        loop {
            match &node.children {
                Children::Nodes(v) => {
                    let i = v.partition_point(|(l, _)| below(l)).checked_sub(1)?;
                    node = &v[i].1;
                }
                Children::Leaves(v) => {
                    let i = v.partition_point(|(l, _)| below(l)).checked_sub(1)?;
                    return Some((v[i].0.clone(), v[i].1.clone()));
                }
            }
        }
    }

    /// Calls `visit` for every leaf in key order, on one consistent snapshot of the tree.
    pub fn for_each_leaf(&self, mut visit: impl FnMut(&Fence, &Arc<L>)) {
        let root = self.root.load();
        Self::for_each_from(&root, &[], &mut |fence, leaf| {
            visit(fence, leaf);
            true
        });
    }

    /// Visits leaves in order starting with the one holding `key`; stops when `visit`
    /// returns false. Returns false if it was stopped.
    fn for_each_from(
        node: &Node<L>,
        key: &[u8],
        visit: &mut dyn FnMut(&Fence, &Arc<L>) -> bool,
    ) -> bool {
        match &node.children {
            Children::Leaves(v) => v[route(v, key)..]
                .iter()
                .all(|(fence, leaf)| visit(fence, leaf)),
            Children::Nodes(v) => v[route(v, key)..]
                .iter()
                .all(|(_, child)| Self::for_each_from(child, key, visit)),
        }
    }

    /// Puts `leaf` into the tree with low fence `low`; it takes over `[low, next low)` from
    /// the leaf that held `low` until now. The caller holds that leaf's lock and has
    /// already shrunk its range, so no reader can be served wrongly in between.
    /// Returns the change in inner-node bytes.
    pub fn insert(&self, low: Fence, leaf: Arc<L>) -> i64 {
        let _writer = self.writer.lock();
        let root = self.root.load_full();
        let mut delta = Delta::default();
        let (left, right) = Self::insert_into(&root, low, leaf, &mut delta);
        let new_root = match right {
            None => left,
            Some(right) => {
                self.depth.fetch_add(1, Ordering::Relaxed);
                let node = Node {
                    children: Children::Nodes(vec![(left.low(), left), (right.low(), right)]),
                };
                delta.added += node.bytes();
                Arc::new(node)
            }
        };
        self.root.store(new_root);
        self.leaves.fetch_add(1, Ordering::Relaxed);
        self.apply(delta)
    }

    fn insert_into(
        node: &Node<L>,
        low: Fence,
        leaf: Arc<L>,
        delta: &mut Delta,
    ) -> (Arc<Node<L>>, Option<Arc<Node<L>>>) {
        delta.removed += node.bytes();
        let children = match &node.children {
            Children::Leaves(v) => {
                let at = v.partition_point(|(l, _)| l.as_ref() <= low.as_ref());
                let v = with_inserted(v, at, (low, leaf));
                split_if_full(v, Children::Leaves)
            }
            Children::Nodes(v) => {
                let at = route(v, &low);
                let (left, right) = Self::insert_into(&v[at].1, low, leaf, delta);
                let mut v = match right {
                    Some(right) => with_inserted(v, at + 1, (right.low(), right)),
                    None => v.clone(),
                };
                v[at] = (left.low(), left);
                split_if_full(v, Children::Nodes)
            }
        };
        let (left, right) = children;
        let left = Arc::new(Node { children: left });
        delta.added += left.bytes();
        let right = right.map(|c| {
            let n = Arc::new(Node { children: c });
            delta.added += n.bytes();
            n
        });
        (left, right)
    }

    /// Takes the leaf with low fence `low` out of the tree; its range joins the leaf
    /// before it. The caller holds both leaves' locks and has already widened the
    /// left neighbour's range. The first leaf (empty low fence) is never removed.
    /// Returns the change in inner-node bytes.
    pub fn remove(&self, low: &[u8]) -> i64 {
        debug_assert!(!low.is_empty(), "the first leaf is never removed");
        let _writer = self.writer.lock();
        let root = self.root.load_full();
        let mut delta = Delta::default();
        let Some(new_root) = Self::remove_from(&root, low, &mut delta) else {
            return 0;
        };
        // A root with one inner child is a level too many.
        let mut new_root = new_root;
        loop {
            let only_child = match &new_root.children {
                Children::Nodes(v) if v.len() == 1 => v[0].1.clone(),
                _ => break,
            };
            delta.removed += new_root.bytes();
            self.depth.fetch_sub(1, Ordering::Relaxed);
            new_root = only_child;
        }
        self.root.store(new_root);
        self.leaves.fetch_sub(1, Ordering::Relaxed);
        self.apply(delta)
    }

    /// The node without the leaf at `low`; `None` if that leaf is not in this subtree.
    /// An emptied node comes back with no children and its parent drops it.
    fn remove_from(node: &Node<L>, low: &[u8], delta: &mut Delta) -> Option<Arc<Node<L>>> {
        let children = match &node.children {
            Children::Leaves(v) => {
                let at = v.iter().position(|(l, _)| l.as_ref() == low)?;
                let mut v = v.clone();
                v.remove(at);
                Children::Leaves(v)
            }
            Children::Nodes(v) => {
                let at = route(v, low);
                let child = Self::remove_from(&v[at].1, low, delta)?;
                let mut v = v.clone();
                if child.len() == 0 {
                    v.remove(at);
                } else {
                    v[at] = (child.low(), child);
                }
                Children::Nodes(v)
            }
        };
        delta.removed += node.bytes();
        let node = Arc::new(Node { children });
        if node.len() > 0 {
            delta.added += node.bytes();
        }
        Some(node)
    }

    fn apply(&self, delta: Delta) -> i64 {
        self.node_bytes.fetch_add(delta.added, Ordering::Relaxed);
        self.node_bytes.fetch_sub(delta.removed, Ordering::Relaxed);
        delta.added as i64 - delta.removed as i64
    }

    /// DRAM held by inner nodes and fences.
    pub fn node_bytes(&self) -> u64 {
        self.node_bytes.load(Ordering::Relaxed)
    }

    pub fn leaf_count(&self) -> u64 {
        self.leaves.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub fn depth(&self) -> u64 {
        self.depth.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
struct Delta {
    added: u64,
    removed: u64,
}

/// A copy of `v` with `item` at `at`, allocated to its exact length: inner nodes are
/// copied on every change, and slack capacity in each copy would be DRAM for nothing.
fn with_inserted<T: Clone>(v: &[T], at: usize, item: T) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len() + 1);
    out.extend_from_slice(&v[..at]);
    out.push(item);
    out.extend_from_slice(&v[at..]);
    out
}

/// Splits an overfull entry vector in two halves.
fn split_if_full<T, L>(
    mut v: Vec<T>,
    wrap: fn(Vec<T>) -> Children<L>,
) -> (Children<L>, Option<Children<L>>) {
    if v.len() <= FANOUT {
        return (wrap(v), None);
    }
    let right = v.split_off(v.len() / 2);
    v.shrink_to_fit();
    (wrap(v), Some(wrap(right)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Fence {
        Fence::from(format!("{i:08}").as_bytes())
    }

    #[test]
    fn routes_every_key_through_splits_and_removals() {
        let tree = BTree::new(Arc::new(u32::MAX));
        let empty_bytes = tree.node_bytes();
        // Leaf `i` holds keys from key(i); inserted out of order to split inner nodes
        // in the middle as well as at the end.
        let order: Vec<u32> = (1..5000)
            .map(|i| (i * 7919) % 5000)
            .filter(|&i| i > 0)
            .collect();
        for &i in &order {
            tree.insert(key(i), Arc::new(i));
        }
        assert_eq!(tree.leaf_count(), 5000);
        assert!(
            tree.depth() >= 3,
            "5000 leaves need three levels at fanout {FANOUT}"
        );
        for i in 1..5000 {
            assert_eq!(*tree.find(&key(i)).1, i);
            let inside = [&key(i)[..], b"5"].concat();
            assert_eq!(*tree.find(&inside).1, i);
            assert_eq!(
                *tree.prev_leaf(&key(i)).unwrap().1,
                if i == 1 { u32::MAX } else { i - 1 }
            );
        }
        assert_eq!(*tree.find(b"").1, u32::MAX);
        assert_eq!(tree.next_leaf(&key(41)).map(|(_, l)| *l), Some(42));
        let mut seen = Vec::new();
        tree.for_each_leaf(|_, l| seen.push(**l));
        assert_eq!(seen.len(), 5000);
        // Removing a leaf hands its range to the left neighbour.
        for i in (2..5000).step_by(2) {
            tree.remove(&key(i));
        }
        for i in 1..5000 {
            let owner = if i % 2 == 0 { i - 1 } else { i };
            assert_eq!(*tree.find(&key(i)).1, owner);
        }
        for i in (1..5000).step_by(2) {
            tree.remove(&key(i));
        }
        assert_eq!(tree.leaf_count(), 1);
        assert_eq!(tree.depth(), 1);
        assert_eq!(
            tree.node_bytes(),
            empty_bytes,
            "node accounting returns to where it began"
        );
        assert_eq!(*tree.find(&key(77)).1, u32::MAX);
    }

    struct Ranges(RwLock<KeyRange>);

    impl Ranged for KeyRange {
        fn range(&mut self) -> &mut KeyRange {
            self
        }
    }

    /// Five leaves covering `["", 10)`, `[10, 20)`, ... `[40, ∞)`.
    fn ranged_tree() -> (BTree<Ranges>, Vec<(Fence, Arc<Ranges>)>) {
        let bounds: Vec<Fence> = (1..5).map(|i| key(i * 10)).collect();
        let lows: Vec<Fence> = std::iter::once(Fence::from(&[][..]))
            .chain(bounds.iter().cloned())
            .collect();
        let leaves: Vec<(Fence, Arc<Ranges>)> = lows
            .iter()
            .enumerate()
            .map(|(i, low)| {
                let range = KeyRange::new(low.clone(), bounds.get(i).cloned());
                (low.clone(), Arc::new(Ranges(RwLock::new(range))))
            })
            .collect();
        let tree = BTree::new(leaves[0].1.clone());
        for (low, leaf) in &leaves[1..] {
            tree.insert(low.clone(), leaf.clone());
        }
        (tree, leaves)
    }

    #[test]
    fn collapse_folds_a_run_into_its_first_leaf() {
        let (tree, leaves) = ranged_tree();
        let mut released = Vec::new();
        let removed = tree.collapse(
            &leaves[1..4],
            |l| &l.0,
            |states| {
                released = states
                    .iter()
                    .map(|st| (st.low.clone(), st.retired))
                    .collect()
            },
        );
        assert!(removed.is_some());
        assert_eq!(
            released,
            vec![(key(10), false), (key(20), true), (key(30), true)],
            "release sees the run with the ranges already handed over"
        );
        assert_eq!(tree.leaf_count(), 3);
        let survivor = leaves[1].1.0.read().clone();
        assert_eq!((survivor.low, survivor.high), (key(10), Some(key(40))));
        for k in [10, 25, 39] {
            assert!(Arc::ptr_eq(&tree.find(&key(k)).1, &leaves[1].1));
        }
        assert!(Arc::ptr_eq(&tree.find(&key(40)).1, &leaves[4].1));
    }

    #[test]
    fn collapse_refuses_a_run_that_changed() {
        let (tree, leaves) = ranged_tree();
        // Not consecutive: [10, 20) and [30, 40).
        let gap = [leaves[1].clone(), leaves[3].clone()];
        assert!(
            tree.collapse(&gap, |l| &l.0, |_| panic!("released"))
                .is_none()
        );
        // A leaf retired since it was chosen.
        assert!(
            tree.retire(&leaves[2].0, &leaves[2].1, |l| &l.0, |_| {})
                .is_some()
        );
        let stale = [leaves[1].clone(), leaves[2].clone()];
        assert!(
            tree.collapse(&stale, |l| &l.0, |_| panic!("released"))
                .is_none()
        );
        assert_eq!(tree.leaf_count(), 4);
    }
}
