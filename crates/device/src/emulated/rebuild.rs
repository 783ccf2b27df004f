//! Recomputing the accounting from the data on the device, when no sidecar can be trusted.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use super::accounting::{Accounting, RAW_BLOCK};
use super::sizer::BlockSizer;
use crate::{AlignedBuf, BLOCK_SIZE, BlockDevice, DeviceCompression};

/// Blocks read per request when rebuilding accounting from the data on the device.
const REBUILD_CHUNK_BLOCKS: u64 = 64;

/// Recomputes every LBA's physical size from the data on `inner`, on all cores.
///
/// Blocks inside the device's data extents are read and sized; holes are unmapped. When the
/// device cannot list its extents (a block device), every block is read and all-zero blocks
/// count as unmapped, since a fresh device reads as zeros too.
pub(super) fn rebuild<D: BlockDevice>(
    inner: &D,
    mode: DeviceCompression,
    accounting: &Accounting,
) -> io::Result<()> {
    let (extents, zero_is_unmapped) = match inner.data_extents()? {
        Some(extents) => (extents, false),
        None => {
            let whole_device = 0..inner.block_count();
            (vec![whole_device], true)
        }
    };
    let chunks: Vec<Range<u64>> = extents
        .into_iter()
        .flat_map(|extent| {
            (extent.start..extent.end)
                .step_by(REBUILD_CHUNK_BLOCKS as usize)
                .map(move |start| start..(start + REBUILD_CHUNK_BLOCKS).min(extent.end))
        })
        .collect();
    let next_chunk = AtomicUsize::new(0);
    let workers = thread::available_parallelism().map_or(1, |n| n.get());
    thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| -> io::Result<()> {
                    let mut sizer = BlockSizer::new();
                    let mut buf = AlignedBuf::zeroed(REBUILD_CHUNK_BLOCKS as usize);
                    while let Some(chunk) = chunks.get(next_chunk.fetch_add(1, Ordering::Relaxed)) {
                        let bytes = &mut buf[..(chunk.end - chunk.start) as usize * BLOCK_SIZE];
                        inner.read(chunk.start, bytes)?;
                        for (lba, block) in chunk.clone().zip(bytes.chunks_exact(BLOCK_SIZE)) {
                            let all_zero = block.iter().all(|&b| b == 0);
                            let size = match mode {
                                _ if all_zero && zero_is_unmapped => 0,
                                DeviceCompression::Emulate => sizer.size(block),
                                _ => RAW_BLOCK,
                            };
                            accounting.sizes[lba as usize].store(size, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|handle| {
            handle
                .join()
                .map_err(|_| io::Error::other("accounting rebuild thread panicked"))?
        })
    })?;
    let used = accounting
        .sizes
        .iter()
        .map(|size| u64::from(size.load(Ordering::Relaxed)))
        .sum();
    accounting.physical_used.store(used, Ordering::Relaxed);
    Ok(())
}
