//! The leaf protocol of all three trees: route a key to its leaf, lock the leaf shared or
//! exclusive, check that it still owns the key, else route again (`with_leaf_locked`).

use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{BTree, Child};

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

impl<C: Child> BTree<C> {
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
