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

use std::cmp::Ordering as KeyOrder;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::memory::alloc_size;

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

/// Shared or exclusive: how the leaf protocol ([`BTree::with_leaf_locked`]) takes a
/// leaf's lock.
pub trait LockMode {
    type Guard<'l, S: 'l>: std::ops::Deref<Target = S>;

    fn lock<S>(lock: &RwLock<S>) -> Self::Guard<'_, S>;
}

/// The leaf's lock taken shared: readers.
pub enum Shared {}

/// The leaf's lock taken exclusive: writers.
pub enum Exclusive {}

impl LockMode for Shared {
    type Guard<'l, S: 'l> = RwLockReadGuard<'l, S>;

    fn lock<S>(lock: &RwLock<S>) -> RwLockReadGuard<'_, S> {
        lock.read()
    }
}

impl LockMode for Exclusive {
    type Guard<'l, S: 'l> = RwLockWriteGuard<'l, S>;

    fn lock<S>(lock: &RwLock<S>) -> RwLockWriteGuard<'_, S> {
        lock.write()
    }
}

/// A leaf the leaf protocol can lock.
pub trait Lockable {
    type State;

    fn lock(&self) -> &RwLock<Self::State>;

    /// Whether the leaf, locked in `state`, owns `key`, if it keeps its own range
    /// (BT_SSD, BT_LO: a [`KeyRange`]); `None` if it keeps none (BT_DRAM): it then owns
    /// `key` while the tree still routes `key` to it.
    fn owns(state: &Self::State, key: &[u8]) -> Option<bool>;
}

/// Implements [`Lockable`] for a leaf `$leaf { state: RwLock<$state>, .. }` whose state
/// keeps its range in a `range: KeyRange` field (BT_SSD, BT_LO): the range answers the
/// owns check.
macro_rules! lockable_by_range {
    ($leaf:ty, $state:ty) => {
        impl $crate::btree::Lockable for $leaf {
            type State = $state;

            fn lock(&self) -> &parking_lot::RwLock<$state> {
                &self.state
            }

            fn owns(state: &$state, key: &[u8]) -> Option<bool> {
                Some(state.range.owns(key))
            }
        }
    };
}
pub(crate) use lockable_by_range;

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

/// The entries of a bottom node: its leaves and their low fences, in key order. Fence
/// `i` is `keys[..shared]` followed by `keys[ends[i-1]..ends[i]]` (`ends[-1] = shared`).
struct LeafEntries<C> {
    /// Leading bytes every fence of the node has in common, stored once at the front.
    shared: u16,
    keys: Box<[u8]>,
    ends: Box<[u16]>,
    children: Box<[C]>,
}

impl<C: Child> LeafEntries<C> {
    /// Packs sorted `(fence, leaf)` pairs.
    fn pack<'f>(entries: impl IntoIterator<Item = (&'f [u8], C)>) -> Self {
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

    fn len(&self) -> usize {
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
    fn fence_into(&self, i: usize, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(self.prefix());
        out.extend_from_slice(self.suffix(i));
    }

    fn fence(&self, i: usize) -> Fence {
        let mut out = Vec::new();
        self.fence_into(i, &mut out);
        Fence::from(out)
    }

    /// How many fences are below `key` (`strict`) or at most `key`.
    fn count_below(&self, key: &[u8], strict: bool) -> usize {
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
    fn route(&self, key: &[u8]) -> usize {
        self.count_below(key, false).saturating_sub(1)
    }

    /// The entries unpacked, for a rebuilt copy of the node.
    fn unpack(&self) -> (Vec<u8>, Vec<(std::ops::Range<usize>, C)>) {
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
    fn repack(bytes: &[u8], entries: &[(std::ops::Range<usize>, C)]) -> Self {
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

enum Children<C> {
    Leaves(LeafEntries<C>),
    Nodes(Vec<(Fence, Arc<Node<C>>)>),
}

struct Node<C> {
    children: Children<C>,
}

impl<C: Child> Node<C> {
    fn len(&self) -> usize {
        match &self.children {
            Children::Leaves(v) => v.len(),
            Children::Nodes(v) => v.len(),
        }
    }

    /// The node's low fence. A bottom node makes it from its packed fences; the node
    /// above keeps it, and the levels above share that one allocation.
    fn low(&self) -> Fence {
        match &self.children {
            Children::Leaves(v) => v.fence(0),
            Children::Nodes(v) => v[0].0.clone(),
        }
    }

    /// DRAM this node holds: its entries, and the fences it introduced (a node above
    /// bottom nodes holds the one fence made for each of them).
    fn bytes(&self) -> u64 {
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
fn route<T>(entries: &[(Fence, T)], key: &[u8]) -> usize {
    entries
        .partition_point(|(low, _)| low.as_ref() <= key)
        .saturating_sub(1)
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

    /// The leaf protocol of all three trees: routes `key` to a leaf, locks it (`M`) and
    /// runs `body` on it if it still owns `key` ([`Lockable::owns`]); otherwise (it
    /// split, was retired, or its slot was reused since the tree was read) routes again.
    /// `reach` finds the leaf a handle names in a `view()` taken for each attempt, after
    /// routing (BT_DRAM's table of leaves grows); `None` routes again.
    pub fn with_leaf_locked<M: LockMode, V, L: Lockable, R>(
        &self,
        key: &[u8],
        view: impl Fn() -> V,
        reach: impl for<'v> Fn(&'v V, &'v C) -> Option<&'v L>,
        body: impl FnOnce(&C, &L, M::Guard<'_, L::State>) -> R,
    ) -> R {
        loop {
            let generation = self.generation();
            let handle = self.with_leaf(key, C::clone);
            let view = view();
            let Some(leaf) = reach(&view, &handle) else {
                continue;
            };
            let state = M::lock(leaf.lock());
            let owns = L::owns(&state, key)
                .unwrap_or_else(|| self.generation() == generation || self.routes_to(key, &handle));
            if owns {
                return body(&handle, leaf, state);
            }
        }
    }

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

    /// The bottom node and entry that route `key`.
    fn bottom<'n>(root: &'n Node<C>, key: &[u8]) -> (&'n LeafEntries<C>, usize) {
        let mut node = root;
        loop {
            match &node.children {
                Children::Nodes(v) => node = &v[route(v, key)].1,
                Children::Leaves(v) => return (v, v.route(key)),
            }
        }
    }

    /// Changes of the structure published so far. A reader that routed a key to a leaf,
    /// then locked the leaf and reads the same generation, knows the leaf still owns the
    /// key (see the module documentation).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the tree routes `key` to `leaf` now. Called with the leaf locked, a yes
    /// means the leaf owns the key until the lock is released.
    pub fn routes_to(&self, key: &[u8], leaf: &C) -> bool {
        self.with_leaf(key, |c| c.same(leaf))
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
                    let i = v
                        .partition_point(|(l, _)| l.as_ref() < low)
                        .checked_sub(1)?;
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
    fn for_each_from(node: &Node<C>, key: &[u8], visit: &mut dyn FnMut(&[u8], &C) -> bool) -> bool {
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
            Children::Nodes(v) => v[route(v, key)..]
                .iter()
                .all(|(_, child)| Self::walk_from(child, key, fence, visit)),
        }
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
                    children: Children::Nodes(vec![(left.low(), left), (right.low(), right)]),
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
                let at = route(v, low);
                let (left, right) = Self::insert_into(&v[at].1, low, leaf, delta);
                let mut v = match right {
                    Some(right) => with_inserted(v, at + 1, (right.low(), right)),
                    None => v.clone(),
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

impl<L: Lockable> BTree<Arc<L>> {
    /// [`BTree::with_leaf_locked`] for a tree whose handles hold their leaves (BT_SSD,
    /// BT_LO).
    pub fn with_arc_leaf_locked<M: LockMode, R>(
        &self,
        key: &[u8],
        body: impl FnOnce(&Arc<L>, M::Guard<'_, L::State>) -> R,
    ) -> R {
        self.with_leaf_locked::<M, _, _, _>(
            key,
            || (),
            |_, leaf| Some(&**leaf),
            |leaf, _, state| body(leaf, state),
        )
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
        return (Children::Nodes(v), None);
    }
    let right = v.split_off(v.len() / 2);
    v.shrink_to_fit();
    (Children::Nodes(v), Some(Children::Nodes(right)))
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
    type Run = Vec<(Fence, Arc<Ranges>)>;

    fn ranged_tree() -> (BTree<Arc<Ranges>>, Run) {
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

    fn locks(run: &[(Fence, Arc<Ranges>)]) -> Vec<&RwLock<KeyRange>> {
        run.iter().map(|(_, l)| &l.0).collect()
    }

    impl Lockable for Ranges {
        type State = KeyRange;

        fn lock(&self) -> &RwLock<KeyRange> {
            &self.0
        }

        fn owns(state: &KeyRange, key: &[u8]) -> Option<bool> {
            Some(state.owns(key))
        }
    }

    /// A leaf that keeps no range, as BT_DRAM's: the tree decides what it owns.
    struct Unranged(RwLock<u32>);

    impl Lockable for Unranged {
        type State = u32;

        fn lock(&self) -> &RwLock<u32> {
            &self.0
        }

        fn owns(_: &u32, _: &[u8]) -> Option<bool> {
            None
        }
    }

    #[test]
    fn the_leaf_protocol_routes_again_when_a_split_moved_the_key() {
        let (tree, leaves) = ranged_tree();
        let right = Arc::new(Ranges(RwLock::new(KeyRange::new(key(15), Some(key(20))))));
        let attempts = std::cell::Cell::new(0);
        let (found, low) = tree.with_leaf_locked::<Shared, _, _, _>(
            &key(17),
            || {
                // Between routing and locking, the leaf [10, 20) splits at 15.
                attempts.set(attempts.get() + 1);
                if attempts.get() == 1 {
                    leaves[1].1.0.write().high = Some(key(15));
                    tree.split_and_publish([(key(15), right.clone())]);
                }
            },
            |_, leaf| Some(&**leaf),
            |leaf, _, state| (leaf.clone(), state.low.clone()),
        );
        assert!(Arc::ptr_eq(&found, &right));
        assert_eq!((low, attempts.get()), (key(15), 2));
    }

    #[test]
    fn a_leaf_without_a_range_owns_what_the_tree_routes_to_it() {
        let tree = BTree::new(Arc::new(Unranged(RwLock::new(0))));
        let attempts = std::cell::Cell::new(0);
        // Locks the leaf of `k` while a leaf `(low, id)` splits off between routing and
        // locking; the id it found, and how many routings it took.
        let lock = |k: u32, low: u32, id: u32| {
            attempts.set(0);
            let split = tree.with_leaf_locked::<Exclusive, _, _, _>(
                &key(k),
                || {
                    attempts.set(attempts.get() + 1);
                    if attempts.get() == 1 {
                        tree.split_and_publish([(key(low), Arc::new(Unranged(RwLock::new(id))))]);
                    }
                },
                |_, leaf| Some(&**leaf),
                |_, _, state| *state,
            );
            (split, attempts.get())
        };
        // The tree changed, but a second walk still leads to the locked leaf.
        assert_eq!(lock(3, 15, 1), (0, 1));
        // Routed to leaf 1, which leaf 2 took key 17 from: routed again.
        assert_eq!(lock(17, 16, 2), (2, 2));
    }

    #[test]
    fn splits_cut_into_fitting_chunks_at_short_fences() {
        let halves = |start, end| (start + end) / 2;
        let chunks = cut_into_leaves(10, |start, end| end - start <= 3, halves);
        assert_eq!(chunks, vec![(0, 2), (2, 5), (5, 7), (7, 10)]);
        assert_eq!(
            cut_into_leaves(2, |_, _| false, halves),
            vec![(0, 1), (1, 2)],
            "a single item is a chunk, fits or not"
        );
        let keys: Vec<&[u8]> = vec![b"apple", b"apricot", b"banana", b"bandana"];
        let fences = split_fences(&keys, &[(0, 1), (1, 3), (3, 4)], |k| k);
        assert_eq!(
            fences,
            vec![Fence::from(&b"apr"[..]), Fence::from(&b"band"[..])]
        );
    }

    #[test]
    fn collapse_folds_a_run_into_its_first_leaf() {
        let (tree, leaves) = ranged_tree();
        let run = &leaves[1..4];
        let mut released = Vec::new();
        let removed = tree.collapse(run, &locks(run), |states| {
            released = states.iter().map(|st| st.low.clone()).collect()
        });
        assert!(removed.is_some());
        assert_eq!(
            released,
            vec![key(10), key(20), key(30)],
            "release sees the whole run, locked"
        );
        assert_eq!(tree.leaf_count(), 3);
        for k in [10, 25, 39] {
            assert!(Arc::ptr_eq(&tree.find(&key(k)).1, &leaves[1].1));
            assert!(tree.routes_to(&key(k), &leaves[1].1));
        }
        assert!(Arc::ptr_eq(&tree.find(&key(40)).1, &leaves[4].1));
    }

    #[test]
    fn retire_hands_the_range_to_the_left_neighbour() {
        let (tree, leaves) = ranged_tree();
        let generation = tree.generation();
        assert!(
            tree.retire(
                &leaves[2].0,
                &leaves[2].1,
                |l| &l.0,
                |st| assert!(st.retired)
            )
            .is_some()
        );
        assert!(tree.generation() > generation, "a published change");
        let left = leaves[1].1.0.read().clone();
        assert_eq!((left.low, left.high), (key(10), Some(key(30))));
        assert!(tree.routes_to(&key(25), &leaves[1].1));
        assert!(!tree.routes_to(&key(25), &leaves[2].1));
    }

    #[test]
    fn collapse_refuses_a_run_that_changed() {
        let (tree, leaves) = ranged_tree();
        // Not consecutive: [10, 20) and [30, 40).
        let gap = [leaves[1].clone(), leaves[3].clone()];
        assert!(
            tree.collapse(&gap, &locks(&gap), |_| panic!("released"))
                .is_none()
        );
        // A fence that is not the leaf's.
        let moved = [leaves[1].clone(), (key(21), leaves[2].1.clone())];
        assert!(
            tree.collapse(&moved, &locks(&moved), |_| panic!("released"))
                .is_none()
        );
        // A leaf retired since it was chosen.
        assert!(
            tree.retire(&leaves[2].0, &leaves[2].1, |l| &l.0, |_| {})
                .is_some()
        );
        let stale = [leaves[1].clone(), leaves[2].clone()];
        assert!(
            tree.collapse(&stale, &locks(&stale), |_| panic!("released"))
                .is_none()
        );
        assert_eq!(tree.leaf_count(), 4);
    }
}
