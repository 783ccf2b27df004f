//! The one B+ tree of ZipCache: an ordered index from key ranges to leaves.
//!
//! BT_DRAM, BT_SSD and BT_LO are all `BTree<C>` with different leaf handles `C` (an
//! `Arc` of the leaf, or an id into a table of leaves). The tree only routes a key to the
//! leaf whose range holds it; what a leaf stores, and how, is the leaf type's business.
//!
//! Inner nodes are immutable and shared (`Arc`); a change copies the path from the root
//! to the changed node and publishes the new root with one atomic swap. Readers therefore
//! take no lock at all: they load the root and walk down. Writers of the structure (leaf
//! splits and removals, which are rare next to GETs) serialize on one mutex.
//!
//! Every entry carries the low fence of its subtree, so a leaf covers
//! `[its low, next leaf's low)`. The first leaf's low is the empty key and it is never
//! removed, so every key has a leaf. A bottom node packs its leaves' fences into one
//! byte string, the bytes they all share stored once: a fence costs its distinct bytes
//! and two bytes of offset, not an allocation of its own.
//!
//! A reader may route by a root that was replaced a moment later. Every change to a
//! leaf's range is published while the leaf is locked, so a reader that holds a leaf's
//! lock and finds that the tree still routes its key there (`generation` unchanged since
//! it routed, or a second walk) knows the leaf owns the key.
//!
//! That leaf protocol (route, lock, check that the leaf owns the key, else route again) is
//! [`BTree::with_leaf_locked`] for all three trees; a leaf that keeps its own
//! [`KeyRange`] (BT_SSD, BT_LO) answers the check from it, one that keeps none (BT_DRAM)
//! leaves it to the tree. A split is cut by [`cut_into_leaves`] and [`split_fences`] and
//! published, under the split leaf's lock, by [`BTree::split_and_publish`].
//!
//! This module holds the handle types and the tree; each job has its own file: the
//! lock-free reads (`walk.rs`), the leaf protocol and its lock modes (`lock.rs`), the
//! changes of the structure (`change.rs`: split and publish, retire, collapse), the nodes
//! and their packed fences (`node.rs`), the ranges leaves keep and where a split cuts
//! (`range.rs`).

mod change;
mod lock;
mod node;
mod range;
#[cfg(test)]
mod tests;
mod walk;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::memory::alloc_size;
use node::{Children, LeafEntries, Node};

pub(crate) use lock::lockable_by_range;
pub use lock::{Exclusive, Lockable, Shared};
pub use range::{KeyRange, Ranged, cut_into_leaves, split_fences};

/// Entries per inner node before it splits. 64 keeps a path copy cheap (a few hundred
/// pointer copies) and the tree shallow (three levels index 260 k leaves).
const FANOUT: usize = 64;

pub type Fence = Arc<[u8]>;

/// How the tree holds a leaf.
pub trait Child: Clone {
    /// Whether two handles name the same leaf.
    fn same(&self, other: &Self) -> bool;

    /// DRAM the leaf spends on a copy of its own low fence, charged with its entry.
    fn kept_fence_bytes(fence_len: usize) -> usize;
}

/// BT_SSD and BT_LO leaves are `Arc`s that keep their range as a [`KeyRange`]: one
/// `Fence` allocation per leaf (a leaf's high fence is its right neighbour's low).
impl<L> Child for Arc<L> {
    fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(self, other)
    }

    fn kept_fence_bytes(fence_len: usize) -> usize {
        alloc_size(fence_len + 2 * size_of::<usize>())
    }
}

pub struct BTree<C> {
    root: ArcSwap<Node<C>>,
    /// Serializes structural changes; never held while waiting for a leaf lock.
    writer: Mutex<()>,
    /// Bumped after every published change of the structure.
    generation: AtomicU64,
    node_bytes: AtomicU64,
    leaves: AtomicU64,
    depth: AtomicU64,
}

impl<C: Child> BTree<C> {
    /// A tree of one leaf covering every key.
    pub fn new(first: C) -> Self {
        let root = Node {
            children: Children::Leaves(LeafEntries::pack([(&[][..], first)])),
        };
        let bytes = root.bytes();
        BTree {
            root: ArcSwap::from_pointee(root),
            writer: Mutex::new(()),
            generation: AtomicU64::new(0),
            node_bytes: AtomicU64::new(bytes),
            leaves: AtomicU64::new(1),
            depth: AtomicU64::new(1),
        }
    }

    /// Changes of the structure published so far. A reader that routed a key to a leaf,
    /// then locked the leaf and reads the same generation, knows the leaf still owns the
    /// key (see the module documentation).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
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
