//! What a block costs on the emulated NAND: its zlib level-6 size.

use libdeflater::{CompressionLvl, Compressor};

use super::accounting::RAW_BLOCK;
use crate::BLOCK_SIZE;

/// The CSD 3000 compresses with hardware zlib at about level 6 (SPEC §3).
const ZLIB_LEVEL: i32 = 6;

/// Computes a block's size on NAND. One per thread: a libdeflate compressor is not shared.
pub(super) struct BlockSizer {
    compressor: Compressor,
    output: Vec<u8>,
    zero_block_size: u16,
}

impl BlockSizer {
    pub(super) fn new() -> Self {
        let level = CompressionLvl::new(ZLIB_LEVEL).unwrap_or_default();
        let mut compressor = Compressor::new(level);
        let output = vec![0; compressor.zlib_compress_bound(BLOCK_SIZE)];
        let mut sizer = Self {
            compressor,
            output,
            zero_block_size: RAW_BLOCK,
        };
        // Zeroed sub-page tails and trimmed-then-rewritten blocks are common; caching zlib's
        // answer for an all-zero block skips the compressor for them.
        sizer.zero_block_size = sizer.compressed_size(&[0; BLOCK_SIZE]);
        sizer
    }

    pub(super) fn size(&mut self, block: &[u8]) -> u16 {
        if block.iter().all(|&b| b == 0) {
            return self.zero_block_size;
        }
        self.compressed_size(block)
    }

    fn compressed_size(&mut self, block: &[u8]) -> u16 {
        match self.compressor.zlib_compress(block, &mut self.output) {
            // `max(1)`: 0 means "unmapped" in the table, and zlib never produces 0 bytes.
            Ok(len) => len.clamp(1, BLOCK_SIZE) as u16,
            Err(_) => RAW_BLOCK,
        }
    }
}
