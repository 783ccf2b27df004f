//! A sparse in-memory [`BlockDevice`] for fast tests of the layers above.

use std::collections::HashMap;
use std::io;
use std::ops::Range;

use parking_lot::RwLock;

use crate::counters::IoCounters;
use crate::{BLOCK_BYTES, BLOCK_SIZE, BlockDevice, DeviceStats, check_io, check_range};

/// Lock shards, so threads touching different LBAs rarely meet on one lock.
const SHARDS: u64 = 16;

type Shard = HashMap<u64, Box<[u8]>>;

/// A sparse device in memory: only written blocks take memory; unwritten and trimmed
/// blocks read as zeros. Nothing is persisted; `flush` does nothing.
///
/// Physical figures in [`DeviceStats`] are 0 (unknown), as for a raw file; wrap it in a
/// [`crate::CompressingDevice`] to account them.
#[derive(Debug)]
pub struct MemDevice {
    block_count: u64,
    shards: Box<[RwLock<Shard>]>,
    counters: IoCounters,
}

impl MemDevice {
    /// An empty device of `block_count` blocks.
    pub fn new(block_count: u64) -> Self {
        Self {
            block_count,
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::new())).collect(),
            counters: IoCounters::default(),
        }
    }

    /// Blocks currently held in memory (written and not trimmed).
    pub fn resident_blocks(&self) -> u64 {
        self.shards
            .iter()
            .map(|shard| shard.read().len() as u64)
            .sum()
    }

    fn shard(&self, lba: u64) -> &RwLock<Shard> {
        &self.shards[(lba % SHARDS) as usize]
    }
}

impl BlockDevice for MemDevice {
    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        check_io(self.block_count, lba, buf.len())?;
        for (block_lba, out) in (lba..).zip(buf.chunks_exact_mut(BLOCK_SIZE)) {
            match self.shard(block_lba).read().get(&block_lba) {
                Some(block) => out.copy_from_slice(block),
                None => out.fill(0),
            }
        }
        self.counters.record_read(buf.len());
        Ok(())
    }

    fn write(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        check_io(self.block_count, lba, buf.len())?;
        for (block_lba, data) in (lba..).zip(buf.chunks_exact(BLOCK_SIZE)) {
            let mut shard = self.shard(block_lba).write();
            match shard.get_mut(&block_lba) {
                Some(block) => block.copy_from_slice(data),
                None => {
                    shard.insert(block_lba, data.into());
                }
            }
        }
        self.counters.record_write(buf.len());
        Ok(())
    }

    fn trim(&self, lba: u64, count: u64) -> io::Result<()> {
        check_range(self.block_count, lba, count)?;
        if count == 0 {
            return Ok(());
        }
        let range = lba..lba + count;
        for (index, shard) in (0..SHARDS).zip(self.shards.iter()) {
            let mut shard = shard.write();
            // A trim of the whole device must not walk billions of absent LBAs.
            if count / SHARDS > shard.len() as u64 {
                shard.retain(|block_lba, _| !range.contains(block_lba));
            } else {
                let first = lba + (index + SHARDS - lba % SHARDS) % SHARDS;
                for block_lba in (first..range.end).step_by(SHARDS as usize) {
                    shard.remove(&block_lba);
                }
            }
        }
        self.counters.record_trim();
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        self.counters.snapshot(self.block_count * BLOCK_BYTES)
    }

    fn data_extents(&self) -> io::Result<Option<Vec<Range<u64>>>> {
        let mut lbas: Vec<u64> = self
            .shards
            .iter()
            .flat_map(|shard| shard.read().keys().copied().collect::<Vec<_>>())
            .collect();
        lbas.sort_unstable();
        let mut extents: Vec<Range<u64>> = Vec::new();
        for lba in lbas {
            match extents.last_mut() {
                Some(last) if last.end == lba => last.end += 1,
                _ => extents.push(lba..lba + 1),
            }
        }
        Ok(Some(extents))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::random_bytes;

    #[test]
    fn unwritten_blocks_read_as_zeros() {
        let device = MemDevice::new(8);
        let mut buf = vec![0xAAu8; 2 * BLOCK_SIZE];
        device.read(6, &mut buf).expect("read");
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(device.resident_blocks(), 0);
    }

    #[test]
    fn read_after_write_and_overwrite() {
        let device = MemDevice::new(8);
        let first = random_bytes(1, 3 * BLOCK_SIZE);
        device.write(2, &first).expect("write");
        let second = random_bytes(2, BLOCK_SIZE);
        device.write(3, &second).expect("overwrite");
        let mut back = vec![0u8; 3 * BLOCK_SIZE];
        device.read(2, &mut back).expect("read");
        assert_eq!(&back[..BLOCK_SIZE], &first[..BLOCK_SIZE]);
        assert_eq!(&back[BLOCK_SIZE..2 * BLOCK_SIZE], &second[..]);
        assert_eq!(&back[2 * BLOCK_SIZE..], &first[2 * BLOCK_SIZE..]);
        assert_eq!(device.resident_blocks(), 3);
        let stats = device.stats();
        assert_eq!((stats.writes, stats.reads), (2, 1));
        assert_eq!(stats.host_bytes_written, 4 * BLOCK_BYTES);
    }

    #[test]
    fn trim_frees_blocks_and_reads_zeros() {
        let device = MemDevice::new(1 << 40);
        device
            .write(100, &random_bytes(3, 4 * BLOCK_SIZE))
            .expect("write");
        device.trim(101, 2).expect("trim");
        assert_eq!(
            device.data_extents().expect("extents"),
            Some(vec![100..101, 103..104])
        );
        let mut block = vec![1u8; BLOCK_SIZE];
        device.read(102, &mut block).expect("read");
        assert!(block.iter().all(|&b| b == 0));
        // The whole (huge) device at once must be quick.
        device.trim(0, 1 << 40).expect("trim all");
        assert_eq!(device.resident_blocks(), 0);
        assert_eq!(device.stats().trims, 2);
    }

    #[test]
    fn bounds_are_checked() {
        let device = MemDevice::new(4);
        let mut buf = vec![0u8; BLOCK_SIZE];
        assert!(device.read(4, &mut buf).is_err());
        assert!(device.write(3, &[0u8; 2 * BLOCK_SIZE]).is_err());
        assert!(device.write(0, &[0u8; 10]).is_err());
        assert!(device.trim(3, 2).is_err());
        assert_eq!(device.resident_blocks(), 0);
    }
}
