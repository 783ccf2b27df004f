//! A table of fixed-size records (BT_DRAM's leaf descriptors) addressed by 32-bit ids,
//! in chunks of `CHUNK`: a leaf costs its descriptor and nothing more (no allocation of
//! its own, so no allocator header or rounding, no reference counts), and the tree
//! names it in four bytes instead of eight.
//!
//! Chunks are never freed while the table lives; a freed id is handed out again. A
//! reader that reached an id through a tree that changed since may therefore find
//! another leaf there: it locks the slot and checks with the tree that the slot owns its
//! key (`BTree::routes_to`), as it would for a leaf that split or moved.

use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use parking_lot::Mutex;

use crate::memory::alloc_size;

/// Slots per chunk: small enough that the last, partly used chunk wastes little of a
/// small cache, large enough that the directory stays a fraction of a byte per slot.
const CHUNK: usize = 64;

pub type SlotId = u32;

pub struct Slots<T> {
    /// Chunk `i` holds ids `i * CHUNK ..`. Replaced, not changed, when it grows.
    chunks: ArcSwap<Vec<Arc<[T]>>>,
    /// Ids handed back, and the first never used; growth and reuse serialize here.
    free: Mutex<Free>,
}

#[derive(Default)]
struct Free {
    ids: Vec<SlotId>,
    next: usize,
}

/// The table as one reader sees it: ids handed out before it was taken are in it.
pub struct View<T> {
    chunks: Guard<Arc<Vec<Arc<[T]>>>>,
}

impl<T> View<T> {
    /// The slot `id`; `None` if it was handed out after this view was taken.
    pub fn get(&self, id: SlotId) -> Option<&T> {
        let id = id as usize;
        self.chunks.get(id / CHUNK).map(|chunk| &chunk[id % CHUNK])
    }
}

impl<T: Default> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            chunks: ArcSwap::from_pointee(Vec::new()),
            free: Mutex::default(),
        }
    }
}

impl<T: Default> Slots<T> {
    pub fn view(&self) -> View<T> {
        View {
            chunks: self.chunks.load(),
        }
    }

    /// A slot for a new record (its previous contents, if any, are the caller's to reset)
    /// and the change in the table's bytes (`bytes`) it took.
    pub fn allocate(&self) -> (SlotId, i64) {
        let mut free = self.free.lock();
        let before = self.bytes_locked(&free);
        let id = match free.ids.pop() {
            Some(id) => id as usize,
            None => {
                let id = free.next;
                free.next += 1;
                let chunks = self.chunks.load();
                if id / CHUNK == chunks.len() {
                    let mut more = Vec::with_capacity(chunks.len() + 1);
                    more.extend(chunks.iter().cloned());
                    more.push((0..CHUNK).map(|_| T::default()).collect());
                    self.chunks.store(Arc::new(more));
                }
                id
            }
        };
        let delta = self.bytes_locked(&free) as i64 - before as i64;
        // Ids stay below `u32::MAX`: each slot is charged to a DRAM budget far smaller.
        (SlotId::try_from(id).expect("slot ids fit 32 bits"), delta)
    }

    /// Hands `id` back for reuse (the caller has emptied it); returns the change in the
    /// table's bytes (the free list may grow).
    pub fn free(&self, id: SlotId) -> i64 {
        let mut free = self.free.lock();
        let before = self.bytes_locked(&free);
        free.ids.push(id);
        self.bytes_locked(&free) as i64 - before as i64
    }

    /// DRAM the table holds: its chunks, the directory, and the free list.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes_locked(&self.free.lock())
    }

    fn bytes_locked(&self, free: &Free) -> usize {
        let chunks = self.chunks.load().len();
        let chunk = alloc_size(2 * size_of::<usize>() + CHUNK * size_of::<T>());
        chunks * chunk
            + alloc_size(chunks * size_of::<Arc<[T]>>())
            + alloc_size(free.ids.capacity() * size_of::<SlotId>())
    }

    /// Ids never handed back: the table's high-water mark.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        let free = self.free.lock();
        free.next - free.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn ids_are_reused_and_growth_is_charged() {
        let slots: Slots<AtomicU64> = Slots::default();
        assert_eq!(slots.bytes(), 0);
        let mut charged = 0;
        let ids: Vec<SlotId> = (0..CHUNK + 1)
            .map(|_| {
                let (id, delta) = slots.allocate();
                charged += delta;
                id
            })
            .collect();
        assert_eq!(ids, (0..=CHUNK as u32).collect::<Vec<_>>());
        assert_eq!(slots.bytes() as i64, charged);
        assert_eq!(
            charged as usize,
            2 * alloc_size(16 + CHUNK * 8) + alloc_size(2 * 16),
            "two chunks and a directory of two"
        );
        let view = slots.view();
        view.get(3).unwrap().store(7, Ordering::Relaxed);
        assert!(view.get(2 * CHUNK as u32).is_none(), "never handed out");
        charged += slots.free(3);
        assert_eq!(
            slots.bytes() as i64,
            charged,
            "the free list is charged too"
        );
        let (id, delta) = slots.allocate();
        assert_eq!((id, delta), (3, 0), "a freed id comes back first");
        assert_eq!(slots.view().get(3).unwrap().load(Ordering::Relaxed), 7);
        assert_eq!(slots.used(), CHUNK + 1);
    }
}
