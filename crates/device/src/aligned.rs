//! Block buffers whose address is 4096-aligned, as `O_DIRECT` requires.

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

impl AlignedBuf {
    /// A buffer of `blocks` zeroed 4 KiB blocks.
    pub fn zeroed(blocks: usize) -> Self {
        let len = blocks * BLOCK_SIZE;
        // One spare block guarantees an aligned window of `len` bytes wherever the allocator
        // puts the Vec; `vec![0; n]` gets lazily-zeroed pages, so the spare costs no writes.
        let storage = vec![0u8; len + BLOCK_SIZE];
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

    /// Number of 4 KiB blocks in the buffer.
    pub fn blocks(&self) -> usize {
        self.len / BLOCK_SIZE
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
