//! The tree's tests: routing through splits and removals, the leaf protocol, where splits
//! cut, collapse and retire.

use parking_lot::RwLock;

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
