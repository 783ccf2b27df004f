//! The lock-free reads: route a key down from the loaded root to its leaf, and walk the
//! leaves in key order on one snapshot of the tree.

use super::node::{Children, LeafEntries, Node};
use super::{BTree, Child, Fence};

impl<C: Child> BTree<C> {
    /// The leaf whose range holds `key`, with that range's low fence.
    pub fn find(&self, key: &[u8]) -> (Fence, C) {
        let root = self.root.load();
        let (entries, i) = Self::bottom(&root, key);
        (entries.fence(i), entries.children[i].clone())
    }

    /// Runs `f` on the leaf whose range holds `key`, without copying its fence or its
    /// handle: the loaded root keeps the leaf alive, and two threads reading one hot
    /// leaf do not fight over a reference count's cache line.
    pub fn with_leaf<R>(&self, key: &[u8], f: impl FnOnce(&C) -> R) -> R {
        let root = self.root.load();
        let (entries, i) = Self::bottom(&root, key);
        f(&entries.children[i])
    }

    /// The bottom node and entry that route `key`.
    fn bottom<'n>(root: &'n Node<C>, key: &[u8]) -> (&'n LeafEntries<C>, usize) {
        let mut node = root;
        loop {
            match &node.children {
                Children::Nodes(v) => node = &v[v.route(key)].1,
                Children::Leaves(v) => return (v, v.route(key)),
            }
        }
    }

    /// Whether the tree routes `key` to `leaf` now. Called with the leaf locked, a yes
    /// means the leaf owns the key until the lock is released.
    pub fn routes_to(&self, key: &[u8], leaf: &C) -> bool {
        self.with_leaf(key, |c| c.same(leaf))
    }

    /// One step of a CLOCK hand walking the leaves in key order: the leaf at `hand`, and
    /// `hand` moved to the next leaf (back to the first after the last).
    pub fn clock_step(&self, hand: &mut Fence) -> (Fence, C) {
        let (low, leaf) = self.find(hand);
        *hand = self
            .next_leaf(&low)
            .map_or_else(|| Fence::from(&[][..]), |(next, _)| next);
        (low, leaf)
    }

    /// The leaf after the one whose low fence is `low`, in key order, if any.
    pub fn next_leaf(&self, low: &[u8]) -> Option<(Fence, C)> {
        let root = self.root.load();
        let mut found = None;
        Self::for_each_from(&root, low, &mut |fence, leaf| {
            if fence > low {
                found = Some((Fence::from(fence), leaf.clone()));
                false
            } else {
                true
            }
        });
        found
    }

    /// The leaf just before the one whose low fence is `low`: the one holding the keys
    /// immediately below `low`.
    pub fn prev_leaf(&self, low: &[u8]) -> Option<(Fence, C)> {
        let root = self.root.load();
        let mut node: &Node<C> = &root;
        loop {
            match &node.children {
                Children::Nodes(v) => {
                    let i = v.count_below(low, true).checked_sub(1)?;
                    node = &v[i].1;
                }
                Children::Leaves(v) => {
                    let i = v.count_below(low, true).checked_sub(1)?;
                    return Some((v.fence(i), v.children[i].clone()));
                }
            }
        }
    }

    /// Calls `visit` for every leaf and its low fence in key order, on one consistent
    /// snapshot of the tree.
    pub fn for_each_leaf(&self, mut visit: impl FnMut(&[u8], &C)) {
        let root = self.root.load();
        Self::for_each_from(&root, &[], &mut |fence, leaf| {
            visit(fence, leaf);
            true
        });
    }

    /// Visits leaves in order starting with the one holding `key`; stops when `visit`
    /// returns false. Returns false if it was stopped.
    pub(super) fn for_each_from(
        node: &Node<C>,
        key: &[u8],
        visit: &mut dyn FnMut(&[u8], &C) -> bool,
    ) -> bool {
        let mut fence = Vec::new();
        Self::walk_from(node, key, &mut fence, visit)
    }

    fn walk_from(
        node: &Node<C>,
        key: &[u8],
        fence: &mut Vec<u8>,
        visit: &mut dyn FnMut(&[u8], &C) -> bool,
    ) -> bool {
        match &node.children {
            Children::Leaves(v) => (v.route(key)..v.len()).all(|i| {
                v.fence_into(i, fence);
                visit(fence, &v.children[i])
            }),
            Children::Nodes(v) => v[v.route(key)..]
                .iter()
                .all(|(_, child)| Self::walk_from(child, key, fence, visit)),
        }
    }
}
