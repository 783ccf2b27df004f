//! The bytes a DRAM leaf holds — its page and its medium objects' blobs — each in an
//! allocation of exactly its length, from a mimalloc heap of the engine's own.
//!
//! Why not `Box<[u8]>` (docs/notes/engine-memory.md has the figures):
//!
//! * A page is compressed into a buffer of LZ4's worst-case bound, and `into_boxed_slice`
//!   shrinks it by `realloc`, which mimalloc answers in place whenever the new length is
//!   at least half the block. Real text compresses to just over half, so a 2 KB page kept
//!   a 3–4 KiB block: after a 64 MiB `airports` fill the pages took 77 MB of blocks for
//!   the 47 MB the engine charged. A [`Block`] is allocated at its final length.
//! * A heap of its own holds nothing but pages and blobs, so no connection buffer or merge
//!   scratch pins one of its allocator pages.
//! * The heap tells whether a block sits in a sparsely used allocator page
//!   ([`Block::in_sparse_page`]), so `dram/defrag.rs` can move it out and let the page
//!   empty: the engine owns the leaf that points to each block, so it can move any of them
//!   under that leaf's write lock.
//!
//! The heap is the process's (one for every engine in it) and lives as long as the
//! process. It works whatever the global allocator is: a block is freed into mimalloc,
//! never into the global allocator.

use std::alloc::{Layout, handle_alloc_error};
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::OnceLock;

use libmimalloc_sys as mi;

/// The engine's heap. mimalloc v3 heaps are first-class: any thread may allocate from one
/// (each thread through a thread-local part of it) and free into it.
struct Heap(NonNull<mi::mi_heap_t>);

// SAFETY: mimalloc v3 heaps may be used from any thread (mimalloc.h, "Heaps: first-class.
// Can allocate from any thread (and be free'd from any thread)"); the pointer is never
// freed (`mi_heap_delete` is not called), so it stays valid for every thread.
unsafe impl Send for Heap {}
// SAFETY: as for Send: every use of the heap goes through mimalloc's thread-safe calls.
unsafe impl Sync for Heap {}

static HEAP: OnceLock<Heap> = OnceLock::new();

fn heap() -> *mut mi::mi_heap_t {
    HEAP.get_or_init(|| {
        // SAFETY: mi_heap_new takes no arguments and returns a new heap or NULL.
        let heap = unsafe { mi::mi_heap_new() };
        Heap(NonNull::new(heap).unwrap_or_else(|| handle_alloc_error(Layout::new::<u8>())))
    })
    .0
    .as_ptr()
}

/// Bytes owned like a `Box<[u8]>`, allocated at their length in the engine's heap.
pub(crate) struct Block {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Block owns its allocation alone (as Box<[u8]> does) and hands out only shared
// references to it; mimalloc frees a block from any thread.
unsafe impl Send for Block {}
// SAFETY: &Block gives only &[u8] reads of bytes nothing writes after `new`.
unsafe impl Sync for Block {}

impl Block {
    /// A copy of `bytes` in a block of their length (mimalloc's size class of it).
    pub(crate) fn new(bytes: &[u8]) -> Block {
        let size = bytes.len().max(1);
        // SAFETY: the heap is valid (`heap`); mi_heap_malloc returns NULL or a block of at
        // least `size` bytes, aligned for u8.
        let raw = unsafe { mi::mi_heap_malloc(heap(), size) }.cast::<u8>();
        let ptr = NonNull::new(raw)
            .unwrap_or_else(|| handle_alloc_error(Layout::array::<u8>(size).unwrap()));
        // SAFETY: the block has room for `bytes.len()` bytes and is a fresh allocation, so
        // it cannot overlap `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
        Block {
            ptr,
            len: bytes.len(),
        }
    }

    /// Bytes the block takes from the allocator: its length rounded up to mimalloc's size
    /// class. Fixed for the block's life, and the same for a copy (`moved`).
    #[cfg(test)]
    pub(crate) fn occupied(&self) -> usize {
        // SAFETY: `ptr` is a live block of the engine's mimalloc heap.
        unsafe { mi::mi_usable_size(self.ptr.as_ptr().cast()) }
    }

    /// Whether the allocator page this block sits in has at most `percent` of its blocks
    /// in use (and is not the page its thread allocates from now): moving the block out
    /// helps that page empty. A hint: mimalloc reads the page's counts without claiming
    /// it, so a page another thread allocates from or frees into at the same moment may
    /// be judged from a stale count; the worst that does is one needless or one missed
    /// move.
    pub(crate) fn in_sparse_page(&self, percent: usize) -> bool {
        // SAFETY: `ptr` is a live block of the engine's heap, so its page's metadata is
        // live too (a page is not freed while a block of it is in use, and this block is
        // not freed while `self` is borrowed). The call only reads that metadata; the
        // "unsafe" of its name is the unsynchronised read described above.
        unsafe {
            mi::mi_unsafe_heap_page_is_under_utilized(heap(), self.ptr.as_ptr().cast(), percent)
        }
    }

    /// A copy in a new block, allocated by the calling thread, which fills its own current
    /// page rather than a sparse one; the caller puts it where `self` was and drops `self`.
    pub(crate) fn moved(&self) -> Block {
        Block::new(self)
    }
}

impl Deref for Block {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes that live as long as `self` and
        // are never written after `new`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from mi_heap_malloc and is freed once, here.
        unsafe { mi::mi_free(self.ptr.as_ptr().cast()) }
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_holds_its_bytes_at_their_length() {
        for len in [0, 1, 7, 100, 1_900, 2_100, 4_096, 70_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let block = Block::new(&bytes);
            assert_eq!(&block[..], &bytes[..]);
            assert!(block.occupied() >= len, "{len}: {}", block.occupied());
            // Never the 50 % slack a shrinking realloc leaves in place.
            assert!(
                block.occupied() <= len.max(8) * 5 / 4 + 16,
                "{len}: {}",
                block.occupied()
            );
            let moved = block.moved();
            assert_eq!(&moved[..], &bytes[..]);
            assert_eq!(moved.occupied(), block.occupied());
            assert_ne!(moved.ptr, block.ptr);
        }
    }

    /// Blocks of pages mostly emptied by frees are found sparse, and a move takes each to
    /// a page of the mover's own, filled side by side.
    #[test]
    fn blocks_in_emptied_pages_are_sparse_and_move_out() {
        let blocks: Vec<Block> = (0..4_000).map(|i| Block::new(&[i as u8; 1_000])).collect();
        // Free 15 of every 16 (on the allocating thread: mimalloc counts a page's frees
        // from other threads when its own thread next collects them).
        let keep: Vec<Block> = blocks
            .into_iter()
            .enumerate()
            .filter_map(|(i, b)| (i % 16 == 0).then_some(b))
            .collect();
        let sparse = keep.iter().filter(|b| b.in_sparse_page(50)).count();
        assert!(sparse > keep.len() / 2, "{sparse} of {}", keep.len());
        let moved: Vec<Block> = keep.iter().map(Block::moved).collect();
        for (i, (old, new)) in keep.iter().zip(&moved).enumerate() {
            assert_eq!(&old[..], &new[..], "{i}");
        }
        drop(keep);
        // The moved blocks sit side by side in their new pages: few of them are sparse.
        let still = moved.iter().filter(|b| b.in_sparse_page(50)).count();
        assert!(still < moved.len() / 4, "{still} of {}", moved.len());
    }
}
