//! The run epoch: which run of the engine last wrote to the device (`docs/FORMAT.md`,
//! "The superblock"). The last block of the device holds it; every `open()` writes a new
//! one and flushes it before any other device write, and every index file a clean
//! `close()` writes names the epoch of the run that wrote it. An index is trusted only
//! if its epoch is the one on the device: then no run has written a block since it was
//! saved, even if a power cut brought back an index file that a later run had deleted.

use std::io;

use zipcache_device::{AlignedBuf, BlockDevice};

use crate::format::superblock::{BLOCK_COUNT, CRC, EPOCH, MAGIC, SUPERBLOCK_VERSION, VERSION};

/// Where the superblock lives: the device's last block.
pub fn lba(device: &dyn BlockDevice) -> u64 {
    device.block_count() - 1
}

/// The epoch on the device, or `None` if the superblock is missing, damaged, unreadable
/// or from a device of another size.
pub fn read(device: &dyn BlockDevice) -> Option<u64> {
    let mut block = AlignedBuf::zeroed(1);
    device.read(lba(device), &mut block).ok()?;
    let fits = MAGIC.is_in(&block)
        && VERSION.get(&block) == SUPERBLOCK_VERSION
        && BLOCK_COUNT.get(&block) == device.block_count()
        && crc32c::crc32c(&block[..CRC.0]) == CRC.get(&block);
    fits.then(|| EPOCH.get(&block))
}

/// Makes `epoch` the device's run epoch, durably (write, then flush).
pub fn write(device: &dyn BlockDevice, epoch: u64) -> io::Result<()> {
    let mut block = AlignedBuf::zeroed(1);
    MAGIC.put(&mut block);
    VERSION.set(&mut block, SUPERBLOCK_VERSION);
    EPOCH.set(&mut block, epoch);
    BLOCK_COUNT.set(&mut block, device.block_count());
    let crc = crc32c::crc32c(&block[..CRC.0]);
    CRC.set(&mut block, crc);
    device.write(lba(device), &block)?;
    device.flush()
}

/// The epoch of a new run: one past the device's, or, on a device without a valid
/// superblock, one drawn from the clock and the PID (so that no index file left from some
/// earlier life of the device names it).
pub fn next(on_device: Option<u64>) -> u64 {
    match on_device {
        Some(epoch) => epoch.wrapping_add(1).max(1),
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            (nanos ^ (u64::from(std::process::id()) << 40)) | 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zipcache_device::MemDevice;

    #[test]
    fn the_epoch_round_trips_and_damage_reads_as_none() {
        let device = MemDevice::new(16);
        assert_eq!(read(&device), None);
        write(&device, 42).unwrap();
        assert_eq!(read(&device), Some(42));
        assert_eq!(next(Some(42)), 43);
        assert_ne!(next(None), 0);
        let mut block = AlignedBuf::zeroed(1);
        device.read(15, &mut block).unwrap();
        block[9] ^= 1;
        device.write(15, &block).unwrap();
        assert_eq!(read(&device), None);
    }

    /// The superblock pinned byte by byte (`docs/FORMAT.md`, "The superblock").
    #[test]
    fn the_superblock_layout_is_pinned() {
        let device = MemDevice::new(16);
        write(&device, 0x0102_0304_0506_0708).unwrap();
        let mut block = AlignedBuf::zeroed(1);
        device.read(15, &mut block).unwrap();
        let mut want = Vec::new();
        want.extend_from_slice(b"ZCSB");
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        want.extend_from_slice(&16u64.to_le_bytes());
        assert_eq!(&block[..24], &want[..]);
        assert_eq!(&block[24..28], &crc32c::crc32c(&want).to_le_bytes());
        assert!(block[28..].iter().all(|&b| b == 0));
    }
}
