//! Block buffers whose address is 4096-aligned, as `O_DIRECT` requires.

use std::cell::RefCell;
use std::fmt;
use std::ops::{Deref, DerefMut};

use crate::BLOCK_SIZE;

/// A zero-initialised heap buffer of whole 4 KiB blocks whose first byte sits on a 4096-byte
/// boundary, so a [`crate::FileDevice`] opened with `O_DIRECT` can use it without a bounce
/// copy. Dereferences to `[u8]`.
///
/// Built without `unsafe`: it over-allocates a `Vec` by one block and exposes the aligned
/// window inside it. Moving the `AlignedBuf` moves only the `Vec` header, never the heap
/// bytes, so the window stays aligned for the buffer's whole life.
pub struct AlignedBuf {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

/// One-block buffers a thread keeps for reuse when they drop: every SSD GET reads one
/// block into a fresh buffer, and allocating (and zeroing) its 8 KiB afresh each time was
/// 3–5 % of a server's CPU in the look-aside run of issue 11. At most 256 KiB per thread.
const POOLED_PER_THREAD: usize = 32;

thread_local! {
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

impl AlignedBuf {
    /// A buffer of `blocks` zeroed 4 KiB blocks.
    pub fn zeroed(blocks: usize) -> Self {
        if blocks == 1
            && let Some(storage) = POOL.try_with(|pool| pool.borrow_mut().pop()).ok().flatten()
        {
            let mut buf = Self::window(storage, BLOCK_SIZE);
            buf.fill(0);
            return buf;
        }
        let len = blocks * BLOCK_SIZE;
        // One spare block guarantees an aligned window of `len` bytes wherever the allocator
        // puts the Vec; `vec![0; n]` gets lazily-zeroed pages, so the spare costs no writes.
        Self::window(vec![0u8; len + BLOCK_SIZE], len)
    }

    /// The aligned window of `len` bytes inside `storage` (`len` + one block long).
    fn window(storage: Vec<u8>, len: usize) -> Self {
        let address = storage.as_ptr() as usize;
        let offset = address.next_multiple_of(BLOCK_SIZE) - address;
        Self {
            storage,
            offset,
            len,
        }
    }

    /// A buffer holding a copy of `data`, zero-padded to whole blocks.
    pub fn copy_from(data: &[u8]) -> Self {
        let mut buf = Self::zeroed(data.len().div_ceil(BLOCK_SIZE));
        buf[..data.len()].copy_from_slice(data);
        buf
    }

    /// The bytes `range` of the buffer as a `Vec`: moved to the front of the buffer's own
    /// allocation where it fills nearly all of it, so that a large value read from the
    /// device takes no second allocation (a copy into 1 MiB of fresh pages per read of a
    /// 1 MiB value); copied out where most of the allocation would be spare.
    pub fn into_vec(mut self, range: std::ops::Range<usize>) -> Vec<u8> {
        let window = self.offset + range.start..self.offset + range.end;
        let spare = self.storage.capacity() - range.len();
        if spare > range.len() / 16 {
            return self[range].to_vec();
        }
        let mut storage = std::mem::take(&mut self.storage);
        // Nothing left to pool when `self` drops.
        self.len = 0;
        storage.copy_within(window, 0);
        storage.truncate(range.len());
        storage
    }

    /// The bytes the buffer holds in memory: its blocks and the spare block that aligns
    /// them.
    pub fn allocated(&self) -> usize {
        self.storage.capacity()
    }

    /// Number of 4 KiB blocks in the buffer.
    pub fn blocks(&self) -> usize {
        self.len / BLOCK_SIZE
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != BLOCK_SIZE {
            return;
        }
        let storage = std::mem::take(&mut self.storage);
        // Fails only while the thread's locals are being destroyed: the bytes are freed.
        let _ = POOL.try_with(|pool| {
            let mut pool = pool.borrow_mut();
            if pool.len() < POOLED_PER_THREAD {
                pool.push(storage);
            }
        });
    }
}

// Not derived: a cloned Vec lands at a new address, so the window offset must be recomputed.
impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        let mut copy = Self::zeroed(self.blocks());
        copy.copy_from_slice(self);
        copy
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl fmt::Debug for AlignedBuf {
    // The contents are kilobytes of mostly zeros; the shape is what a reader of a test
    // failure needs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("blocks", &self.blocks())
            .finish_non_exhaustive()
    }
}

/// True when `buf` starts on a 4096-byte boundary.
pub(crate) fn is_aligned(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(BLOCK_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_whole_blocks() {
        for blocks in [0, 1, 3, 16] {
            let buf = AlignedBuf::zeroed(blocks);
            assert!(is_aligned(&buf), "{blocks} blocks");
            assert_eq!(buf.len(), blocks * BLOCK_SIZE);
            assert_eq!(buf.blocks(), blocks);
            assert!(buf.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn a_reused_block_is_aligned_and_zeroed_again() {
        std::thread::spawn(|| {
            let mut first = AlignedBuf::zeroed(1);
            first.fill(0xAB);
            let address = first.as_ptr();
            drop(first);
            let again = AlignedBuf::zeroed(1);
            assert_eq!(again.as_ptr(), address, "the dropped block is reused");
            assert!(is_aligned(&again));
            assert_eq!(again.len(), BLOCK_SIZE);
            assert!(again.iter().all(|&b| b == 0));
            // Only so many are kept.
            let many: Vec<AlignedBuf> = (0..2 * POOLED_PER_THREAD)
                .map(|_| AlignedBuf::zeroed(1))
                .collect();
            drop(many);
            assert_eq!(POOL.with(|pool| pool.borrow().len()), POOLED_PER_THREAD);
        })
        .join()
        .expect("thread");
    }

    /// A range filling nearly all of the buffer keeps its allocation; a small one is
    /// copied out; either holds exactly the range's bytes.
    #[test]
    fn into_vec_reuses_the_allocation_of_a_range_that_fills_it() {
        let patterned = |blocks: usize| {
            let mut buf = AlignedBuf::zeroed(blocks);
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            buf
        };
        let expected =
            |range: std::ops::Range<usize>| -> Vec<u8> { range.map(|i| (i % 251) as u8).collect() };
        let buf = patterned(64);
        let allocation = buf.storage.as_ptr();
        let value = buf.into_vec(100..64 * BLOCK_SIZE - 7);
        assert_eq!(
            value.as_ptr(),
            allocation,
            "moved within its own allocation"
        );
        assert_eq!(value, expected(100..64 * BLOCK_SIZE - 7));
        let buf = patterned(64);
        let allocation = buf.storage.as_ptr();
        let value = buf.into_vec(100..200);
        assert_ne!(value.as_ptr(), allocation);
        assert_eq!(value.capacity(), 100, "copied out, not holding 260 KiB");
        assert_eq!(value, expected(100..200));
        // A one-block buffer is half spare: copied out, it goes back to the pool.
        std::thread::spawn(move || {
            let value = patterned(1).into_vec(0..BLOCK_SIZE);
            assert_eq!(value, expected(0..BLOCK_SIZE));
            assert_eq!(POOL.with(|pool| pool.borrow().len()), 1);
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn alignment_survives_moves_and_clones() {
        let mut bufs: Vec<AlignedBuf> = (1..8).map(AlignedBuf::zeroed).collect();
        bufs.reverse();
        let clones: Vec<AlignedBuf> = bufs.clone();
        for buf in bufs.iter().chain(&clones) {
            assert!(is_aligned(buf));
        }
    }

    #[test]
    fn copy_from_pads_to_whole_blocks() {
        let buf = AlignedBuf::copy_from(&[7u8; 5000]);
        assert_eq!(buf.blocks(), 2);
        assert!(buf[..5000].iter().all(|&b| b == 7));
        assert!(buf[5000..].iter().all(|&b| b == 0));
    }

    #[test]
    fn writes_through_deref_mut_are_visible() {
        let mut buf = AlignedBuf::zeroed(2);
        buf[BLOCK_SIZE] = 42;
        assert_eq!(buf.as_ref()[BLOCK_SIZE], 42);
        assert_eq!(format!("{buf:?}"), "AlignedBuf { blocks: 2, .. }");
    }
}
