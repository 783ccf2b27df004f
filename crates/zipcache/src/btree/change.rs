//! Changes of the tree's structure, serialized on the writer mutex: a leaf put in (a split,
//! published by `split_and_publish`) or taken out (`retire`, `collapse`), each a copy of
//! the path from the root published with one atomic swap, its inner-node bytes accounted.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::{RwLock, RwLockWriteGuard};

use super::node::{Children, InnerEntries, LeafEntries, Node};
use super::{BTree, Child, FANOUT, Fence, Ranged};

impl<C: Child> BTree<C> {
    /// Publishes the leaves a split of a locked leaf made: each `(low, leaf)`, in key
    /// order, takes over `[low, next low)` from the split leaf. The caller holds the split
    /// leaf's lock throughout (and has narrowed its range, if it keeps one), so a reader
    /// routed to it waits, then finds that it no longer owns the keys that moved. Returns
    /// the change in inner-node bytes.
    ///
    /// The last leaf goes in first: each new leaf is unlocked once published, so it must
    /// own no more than its own keys from then on. Published first, the first of three
    /// would own the other two's ranges until they follow, and a reader (a miss) or a
    /// writer (a version the next leaf then hides) could reach it for their keys.
    pub fn split_and_publish(&self, new_leaves: impl IntoIterator<Item = (Fence, C)>) -> i64 {
        let new_leaves: Vec<(Fence, C)> = new_leaves.into_iter().collect();
        new_leaves
            .into_iter()
            .rev()
            .map(|(low, leaf)| self.insert(low, leaf))
            .sum()
    }

    /// Takes the leaf at `low` (not the first) out of the tree: its range goes to its left
    /// neighbour, and `release` runs on its state while both are locked. Returns the
    /// change in inner-node bytes, or `None` if either leaf changed since the caller
    /// chose them.
    pub fn retire<S: Ranged>(
        &self,
        low: &Fence,
        leaf: &C,
        state: impl Fn(&C) -> &RwLock<S>,
        release: impl FnOnce(&mut S),
    ) -> Option<i64> {
        let prev = self.prev_leaf(low)?;
        let run = [prev, (low.clone(), leaf.clone())];
        let locks = [state(&run[0].1), state(&run[1].1)];
        self.collapse(&run, &locks, |states| {
            let (left, right) = states.split_at_mut(1);
            let absorbed = left[0].range().absorb_right(right[0].range(), low);
            debug_assert!(absorbed, "the tree checked them, under the same locks");
            release(&mut states[1])
        })
    }

    /// Folds the consecutive leaves `run[1..]` into `run[0]`: locks them all in key order
    /// (`locks[i]` is `run[i]`'s), checks that the tree still holds them, consecutive, at
    /// these fences, runs `release` on all their states while every lock is still held,
    /// and removes `run[1..]` from the tree (their ranges join `run[0]`'s). Returns the
    /// change in inner-node bytes, or `None` (nothing released) if any leaf changed since
    /// the caller chose them.
    pub fn collapse<'s, S>(
        &self,
        run: &[(Fence, C)],
        locks: &[&'s RwLock<S>],
        release: impl FnOnce(&mut [RwLockWriteGuard<'s, S>]),
    ) -> Option<i64> {
        let mut states: Vec<_> = locks.iter().map(|lock| lock.write()).collect();
        if !self.holds_run(run) {
            return None;
        }
        release(&mut states);
        Some(run[1..].iter().map(|(low, _)| self.remove(low)).sum())
    }

    /// Whether the current tree has exactly `run`, consecutive, at these fences.
    fn holds_run(&self, run: &[(Fence, C)]) -> bool {
        let Some((first_low, _)) = run.first() else {
            return true;
        };
        let root = self.root.load();
        let mut matched = 0;
        Self::for_each_from(&root, first_low, &mut |fence, leaf| {
            let (low, want) = &run[matched];
            if fence != low.as_ref() || !leaf.same(want) {
                return false;
            }
            matched += 1;
            matched < run.len()
        });
        matched == run.len()
    }

    /// Puts `leaf` into the tree with low fence `low`; it takes over `[low, next low)` from
    /// the leaf that held `low` until now. The caller holds that leaf's lock, so no reader
    /// can be served wrongly in between. Returns the change in inner-node bytes.
    pub fn insert(&self, low: impl AsRef<[u8]>, leaf: C) -> i64 {
        let low = low.as_ref();
        let _writer = self.writer.lock();
        let root = self.root.load_full();
        let mut delta = Delta::default();
        let (left, right) = Self::insert_into(&root, low, leaf, &mut delta);
        let new_root = match right {
            None => left,
            Some(right) => {
                self.depth.fetch_add(1, Ordering::Relaxed);
                let node = Node {
                    children: Children::Nodes(InnerEntries::new(vec![
                        (left.low(), left),
                        (right.low(), right),
                    ])),
                };
                delta.added += node.bytes();
                Arc::new(node)
            }
        };
        self.publish(new_root);
        self.leaves.fetch_add(1, Ordering::Relaxed);
        self.apply(delta)
    }

    fn publish(&self, root: Arc<Node<C>>) {
        self.root.store(root);
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn insert_into(
        node: &Node<C>,
        low: &[u8],
        leaf: C,
        delta: &mut Delta,
    ) -> (Arc<Node<C>>, Option<Arc<Node<C>>>) {
        delta.removed += node.bytes();
        let (left, right) = match &node.children {
            Children::Leaves(v) => {
                let at = v.count_below(low, false);
                let (mut bytes, mut entries) = v.unpack();
                let start = bytes.len();
                bytes.extend_from_slice(low);
                entries.insert(at, (start..bytes.len(), leaf));
                if entries.len() <= FANOUT {
                    (
                        Children::Leaves(LeafEntries::repack(&bytes, &entries)),
                        None,
                    )
                } else {
                    let right = entries.split_off(entries.len() / 2);
                    (
                        Children::Leaves(LeafEntries::repack(&bytes, &entries)),
                        Some(Children::Leaves(LeafEntries::repack(&bytes, &right))),
                    )
                }
            }
            Children::Nodes(v) => {
                let at = v.route(low);
                let (left, right) = Self::insert_into(&v[at].1, low, leaf, delta);
                let mut v = match right {
                    Some(right) => with_inserted(v, at + 1, (right.low(), right)),
                    None => v.to_vec(),
                };
                v[at] = (left.low(), left);
                split_if_full(v)
            }
        };
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
    /// before it. The caller holds both leaves' locks. The first leaf (empty low fence)
    /// is never removed. Returns the change in inner-node bytes.
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
        self.publish(new_root);
        self.leaves.fetch_sub(1, Ordering::Relaxed);
        self.apply(delta)
    }

    /// The node without the leaf at `low`; `None` if that leaf is not in this subtree.
    /// An emptied node comes back with no children and its parent drops it.
    fn remove_from(node: &Node<C>, low: &[u8], delta: &mut Delta) -> Option<Arc<Node<C>>> {
        let children = match &node.children {
            Children::Leaves(v) => {
                let at = v.count_below(low, true);
                let (bytes, mut entries) = v.unpack();
                if entries
                    .get(at)
                    .is_none_or(|(r, _)| &bytes[r.clone()] != low)
                {
                    return None;
                }
                entries.remove(at);
                Children::Leaves(LeafEntries::repack(&bytes, &entries))
            }
            Children::Nodes(v) => {
                let at = v.route(low);
                let child = Self::remove_from(&v[at].1, low, delta)?;
                let mut v = v.to_vec();
                if child.len() == 0 {
                    v.remove(at);
                } else {
                    v[at] = (child.low(), child);
                }
                Children::Nodes(InnerEntries::new(v))
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

/// Splits an overfull inner entry vector in two halves.
fn split_if_full<C>(mut v: Vec<(Fence, Arc<Node<C>>)>) -> (Children<C>, Option<Children<C>>) {
    if v.len() <= FANOUT {
        return (Children::Nodes(InnerEntries::new(v)), None);
    }
    let right = v.split_off(v.len() / 2);
    (
        Children::Nodes(InnerEntries::new(v)),
        Some(Children::Nodes(InnerEntries::new(right))),
    )
}
