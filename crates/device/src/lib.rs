//! The device layer: everything ZipCache's SSD tier knows about storage.
//!
//! The SSD tier speaks only [`BlockDevice`]: 4 KiB logical blocks (LBAs) that can be
//! read, written, trimmed and flushed. Implementations live one per module:
//!
//! * [`FileDevice`] — a file or block device through `pread`/`pwrite`, `O_DIRECT` by default;
//! * [`CompressingDevice`] — wraps any device and emulates an SSD with transparent per-4KB
//!   zlib compression (the paper's ScaleFlux CSD 3000), accounting physical bytes and `V_NAND`;
//! * [`MemDevice`] — sparse and in memory, for fast tests of the layers above;
//! * [`FaultyDevice`] — wraps a device and injects I/O errors and bit flips, for tests;
//! * [`HeldDevice`] — in memory, with asynchronous reads that wait until a test completes
//!   them, for tests of what happens while reads are in flight.
//!
//! Besides one request at a time, a device takes batches ([`BlockDevice::read_batch`],
//! [`BlockDevice::write_batch`]), which a [`FileDevice`] keeps in flight together through
//! io_uring, and asynchronous reads ([`BlockDevice::read_async`]) that complete on the thread
//! that submitted them once it has installed a ring ([`uring`]).
//!
//! ```
//! use zipcache_device::{BlockDevice, CompressingDevice, EmulatorOptions, MemDevice, BLOCK_SIZE};
//!
//! // In production: CompressingDevice::open_file(path, size, &FileOptions::default(), options).
//! let ssd = CompressingDevice::new(MemDevice::new(1024), EmulatorOptions::default())?;
//! let mut sub_page = vec![0u8; BLOCK_SIZE];
//! sub_page[..1024].fill(7); // a quarter-filled sub-page; the zeros compress away
//! ssd.write(3, &sub_page)?;
//! ssd.drain()?; // wait for the emulated controller before reading exact stats
//! let stats = ssd.stats();
//! assert_eq!(stats.host_bytes_written, 4096);
//! assert!(stats.nand_bytes_written < 100);
//! assert_eq!(stats.physical_capacity, stats.logical_capacity / 4);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;
use std::ops::Range;
use std::sync::Arc;

mod aligned;
mod counters;
mod emulated;
mod faulty;
mod file;
mod held;
mod memory;
mod shared_file;
pub mod uring;

pub use aligned::AlignedBuf;
pub use emulated::{AccountingOrigin, CompressingDevice, EmulatorOptions, RebuildReason};
pub use faulty::{FaultOp, FaultyDevice, InjectedFault};
pub use file::{FileDevice, FileOptions};
pub use held::HeldDevice;
pub use memory::MemDevice;
pub use uring::{
    ReadCompletion, ReadFuture, SubmitBatch, batch_thread_ring_submissions, install_thread_ring,
    install_thread_ring_owned, reap_thread_ring, thread_ring_in_flight, uninstall_thread_ring,
    wait_thread_ring,
};

/// The unit of every device I/O, and the size of one SSD sub-page.
pub const BLOCK_SIZE: usize = 4096;

/// [`BLOCK_SIZE`] as a `u64`, for byte offsets and capacities.
pub const BLOCK_BYTES: u64 = BLOCK_SIZE as u64;

/// How the device treats the bytes the host writes (SPEC §3, `device_compression`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceCompression {
    /// A plain SSD whose blocks the host compresses before writing them (the engine packs
    /// each 4 KiB block with LZ4): to the device, as [`DeviceCompression::None`].
    #[default]
    Host,
    /// Benchmarking only: emulates an SSD with built-in per-4KB zlib compression and
    /// accounts the physical bytes such a drive would use; the file holds the blocks whole.
    Emulate,
    /// A plain SSD: physical bytes equal host bytes.
    None,
    /// The device compresses in hardware; the host cannot observe physical bytes.
    Hardware,
}

impl DeviceCompression {
    /// Whether the host compresses blocks before they reach the device.
    pub fn by_host(self) -> bool {
        self == DeviceCompression::Host
    }

    /// Whether the device stores every written block whole, so that its physical bytes
    /// are its written blocks (the host cannot see compression it does not do).
    pub fn plain(self) -> bool {
        matches!(self, DeviceCompression::None | DeviceCompression::Host)
    }
}

/// Counters a device exposes. Byte counts are totals since the device was opened, except
/// `physical_used`, which describes what the device holds now (and survives a warm restart
/// of a [`CompressingDevice`]).
///
/// A physical field (`physical_capacity`, `physical_used`, `nand_bytes_written`) of 0 means
/// **unknown**: raw devices and [`DeviceCompression::Hardware`] cannot observe NAND.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct DeviceStats {
    /// Logical capacity in bytes (may exceed physical capacity under compression).
    pub logical_capacity: u64,
    /// Physical (NAND) capacity in bytes; 0 = unknown.
    pub physical_capacity: u64,
    /// Physical bytes currently holding live blocks (after compression).
    pub physical_used: u64,
    /// `V_host`: bytes the host wrote through the interface.
    pub host_bytes_written: u64,
    /// `V_NAND`: bytes that reached NAND after per-4KB compression; 0 = unknown.
    pub nand_bytes_written: u64,
    /// Bytes the host read through the interface.
    pub host_bytes_read: u64,
    /// Read calls that succeeded.
    pub reads: u64,
    /// Write calls that succeeded.
    pub writes: u64,
    /// Trim calls that succeeded.
    pub trims: u64,
    /// Reads and writes submitted to the medium and not yet completed: batches, reads in
    /// flight on thread rings, and synchronous calls under way.
    pub in_flight: u64,
}

impl DeviceStats {
    /// Physical bytes still free, or `None` when the device cannot observe NAND.
    /// Saturates at 0: an emulated device may hold more than its physical capacity, because
    /// it never refuses a write (see [`CompressingDevice`]).
    pub fn physical_free(&self) -> Option<u64> {
        (self.physical_capacity > 0)
            .then(|| self.physical_capacity.saturating_sub(self.physical_used))
    }

    /// `wr_nand = V_host / V_NAND` (SPEC §4), or `None` while either is unknown or zero.
    pub fn wr_nand(&self) -> Option<f64> {
        (self.nand_bytes_written > 0 && self.host_bytes_written > 0)
            .then(|| self.host_bytes_written as f64 / self.nand_bytes_written as f64)
    }
}

/// One block-aligned read of a batch: `buf.len()` a multiple of [`BLOCK_SIZE`].
#[derive(Debug)]
pub struct BatchRead<'a> {
    /// First block to read.
    pub lba: u64,
    /// Receives `buf.len() / BLOCK_SIZE` blocks.
    pub buf: &'a mut [u8],
}

/// One block-aligned write of a batch: `buf.len()` a multiple of [`BLOCK_SIZE`].
#[derive(Clone, Copy, Debug)]
pub struct BatchWrite<'a> {
    /// First block to write.
    pub lba: u64,
    /// `buf.len() / BLOCK_SIZE` blocks of data.
    pub buf: &'a [u8],
}

/// A device of 4 KiB logical blocks. Buffers are whole blocks: `buf.len()` is a multiple
/// of [`BLOCK_SIZE`]. Implementations accept any buffer; an [`AlignedBuf`] avoids a copy
/// on devices opened with `O_DIRECT`.
///
/// Out-of-range LBAs and buffers that are not whole blocks are rejected with
/// [`io::ErrorKind::InvalidInput`]; no method panics on bad input.
pub trait BlockDevice: Send + Sync {
    /// Number of logical blocks.
    fn block_count(&self) -> u64;
    /// Reads `buf.len() / BLOCK_SIZE` blocks starting at `lba`. Trimmed blocks read as zeros.
    fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf.len() / BLOCK_SIZE` blocks starting at `lba`.
    fn write(&self, lba: u64, buf: &[u8]) -> io::Result<()>;
    /// Discards `count` blocks starting at `lba`; they read as zeros afterwards.
    fn trim(&self, lba: u64, count: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// A snapshot of the device's counters.
    fn stats(&self) -> DeviceStats;

    /// Waits until background accounting (an emulated controller) has caught up with every
    /// write and trim that returned before this call, so [`BlockDevice::stats`] is exact.
    /// Devices without background work return at once.
    fn drain(&self) -> io::Result<()> {
        Ok(())
    }

    /// How the host must write to this device: [`DeviceCompression::Host`] asks it to
    /// pack blocks itself. By default a plain device that stores blocks whole.
    fn compression(&self) -> DeviceCompression {
        DeviceCompression::None
    }

    /// Physical bytes free now, or `None` when the device cannot observe NAND.
    /// Reflects only writes the controller has accounted; call [`BlockDevice::drain`]
    /// first for an exact figure.
    fn physical_free(&self) -> Option<u64> {
        self.stats().physical_free()
    }

    /// LBA ranges that may hold data (written and not trimmed), ascending and disjoint;
    /// blocks outside them read as zeros. `None` when the device cannot tell.
    fn data_extents(&self) -> io::Result<Option<Vec<Range<u64>>>> {
        Ok(None)
    }

    /// Reads every request of the batch and returns one result per request, in the same
    /// order: a failing request fails alone. The requests may run in any order and at once
    /// (a [`FileDevice`] keeps up to 64 in flight through io_uring); counters count each
    /// request as one [`BlockDevice::read`]. By default, one request after another.
    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<()>> {
        reads
            .iter_mut()
            .map(|read| self.read(read.lba, read.buf))
            .collect()
    }

    /// Writes every request of the batch and returns one result per request, in the same
    /// order. The requests may run in any order and at once: two writes of one LBA in a batch
    /// leave either. Counters count each request as one [`BlockDevice::write`]. By default,
    /// one request after another.
    fn write_batch(&self, writes: &[BatchWrite<'_>]) -> Vec<io::Result<()>> {
        writes
            .iter()
            .map(|write| self.write(write.lba, write.buf))
            .collect()
    }

    /// Reads `buf.len() / BLOCK_SIZE` blocks at `lba` into `buf` and gives the buffer back
    /// with the result. A [`FileDevice`] submits the read to the calling thread's ring when
    /// one is installed ([`install_thread_ring`]) and returns at once; the future completes
    /// when that thread calls [`reap_thread_ring`]. By default (and without a ring), the
    /// read runs synchronously and the future is ready.
    fn read_async(&self, lba: u64, mut buf: AlignedBuf) -> ReadFuture {
        let result = self.read(lba, &mut buf);
        ReadFuture::ready(result, buf)
    }
}

/// Implements [`BlockDevice`] for smart pointers by forwarding every method, the provided
/// ones included, to the device they point to: one list of methods for `Arc` (the engine
/// shares one device between owners) and `Box` (a `Box<dyn BlockDevice>` chosen at run time
/// is wrapped like a concrete device).
macro_rules! forward_block_device {
    ($($pointer:ident),+) => {$(
        impl<D: BlockDevice + ?Sized> BlockDevice for $pointer<D> {
            fn block_count(&self) -> u64 {
                (**self).block_count()
            }
            fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
                (**self).read(lba, buf)
            }
            fn write(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
                (**self).write(lba, buf)
            }
            fn trim(&self, lba: u64, count: u64) -> io::Result<()> {
                (**self).trim(lba, count)
            }
            fn flush(&self) -> io::Result<()> {
                (**self).flush()
            }
            fn stats(&self) -> DeviceStats {
                (**self).stats()
            }
            fn drain(&self) -> io::Result<()> {
                (**self).drain()
            }
            fn compression(&self) -> DeviceCompression {
                (**self).compression()
            }
            fn physical_free(&self) -> Option<u64> {
                (**self).physical_free()
            }
            fn data_extents(&self) -> io::Result<Option<Vec<Range<u64>>>> {
                (**self).data_extents()
            }
            fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<()>> {
                (**self).read_batch(reads)
            }
            fn write_batch(&self, writes: &[BatchWrite<'_>]) -> Vec<io::Result<()>> {
                (**self).write_batch(writes)
            }
            fn read_async(&self, lba: u64, buf: AlignedBuf) -> ReadFuture {
                (**self).read_async(lba, buf)
            }
        }
    )+};
}

forward_block_device!(Arc, Box);

/// Checks that `len` bytes starting at `lba` are whole blocks inside a device of
/// `block_count` blocks, and returns the number of blocks.
///
/// Every device validates through here so that a bad request is an
/// [`io::ErrorKind::InvalidInput`] error with the same wording everywhere.
pub fn check_io(block_count: u64, lba: u64, len: usize) -> io::Result<u64> {
    if !len.is_multiple_of(BLOCK_SIZE) {
        return Err(invalid_input(format!(
            "buffer of {len} bytes is not a whole number of {BLOCK_SIZE}-byte blocks"
        )));
    }
    let blocks = (len / BLOCK_SIZE) as u64;
    check_range(block_count, lba, blocks)?;
    Ok(blocks)
}

/// Checks that `count` blocks starting at `lba` lie inside a device of `block_count` blocks.
pub fn check_range(block_count: u64, lba: u64, count: u64) -> io::Result<()> {
    match lba.checked_add(count) {
        Some(end) if end <= block_count => Ok(()),
        _ => Err(invalid_input(format!(
            "blocks {lba}..{lba}+{count} are outside the device's {block_count} blocks"
        ))),
    }
}

pub(crate) fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

#[cfg(test)]
pub(crate) mod test_util {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::{Duration, Instant};

    use super::{AlignedBuf, BLOCK_SIZE, ReadFuture, install_thread_ring, reap_thread_ring};

    /// A waker that only records that it was woken.
    #[derive(Default)]
    pub struct Flag(AtomicBool);

    impl Flag {
        pub fn waker() -> (Arc<Flag>, Waker) {
            let flag = Arc::new(Flag::default());
            (Arc::clone(&flag), Waker::from(flag))
        }

        pub fn woken(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    pub fn poll_once<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
        Pin::new(future).poll(&mut Context::from_waker(waker))
    }

    /// Drives a read submitted on this thread to completion as a server's reaper task would:
    /// polls it, and while it is pending waits for this thread's eventfd and reaps.
    pub fn complete(mut read: ReadFuture) -> (io::Result<()>, AlignedBuf) {
        let (_, waker) = Flag::waker();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Poll::Ready(outcome) = poll_once(&mut read, &waker) {
                return outcome;
            }
            assert!(Instant::now() < deadline, "read never completed");
            let eventfd = install_thread_ring(1).expect("a pending read implies a ring");
            crate::wait_thread_ring(eventfd, Duration::from_millis(100));
            reap_thread_ring();
        }
    }

    /// Incompressible bytes without a `rand` dependency: xorshift64* is far beyond what
    /// zlib can model, so its output costs a full block on the emulated NAND.
    pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// A block whose first `(1 - eta)` fraction is random and the rest zeros: the paper's
    /// and FIO's compressibility parameter η.
    pub fn block_with_eta(seed: u64, eta: f64) -> Vec<u8> {
        let random = ((1.0 - eta) * BLOCK_SIZE as f64) as usize;
        let mut block = random_bytes(seed, random);
        block.resize(BLOCK_SIZE, 0);
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::random_bytes;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    #[test]
    fn check_io_accepts_whole_blocks_inside_the_device() {
        assert_eq!(check_io(10, 0, 0).ok(), Some(0));
        assert_eq!(check_io(10, 8, 2 * BLOCK_SIZE).ok(), Some(2));
    }

    #[test]
    fn check_io_rejects_partial_blocks_and_out_of_range() {
        for (lba, len) in [
            (0, 100),
            (9, 2 * BLOCK_SIZE),
            (u64::MAX, BLOCK_SIZE),
            (11, 0),
        ] {
            let err = check_io(10, lba, len).err().map(|e| e.kind());
            assert_eq!(
                err,
                Some(io::ErrorKind::InvalidInput),
                "lba {lba} len {len}"
            );
        }
    }

    #[test]
    fn physical_free_is_unknown_without_physical_capacity() {
        let mut stats = DeviceStats::default();
        assert_eq!(stats.physical_free(), None);
        stats.physical_capacity = 100;
        stats.physical_used = 130;
        assert_eq!(stats.physical_free(), Some(0));
        stats.physical_used = 30;
        assert_eq!(stats.physical_free(), Some(70));
    }

    #[test]
    fn wr_nand_divides_host_by_nand_bytes() {
        let stats = DeviceStats {
            host_bytes_written: 8192,
            nand_bytes_written: 2048,
            ..DeviceStats::default()
        };
        assert_eq!(stats.wr_nand(), Some(4.0));
        assert_eq!(DeviceStats::default().wr_nand(), None);
    }

    #[test]
    fn default_batches_run_every_request_and_fail_alone() {
        let device = MemDevice::new(16);
        let data = random_bytes(1, 4 * BLOCK_SIZE);
        let writes = [
            BatchWrite {
                lba: 0,
                buf: &data[..2 * BLOCK_SIZE],
            },
            BatchWrite {
                lba: 15,
                buf: &data[..2 * BLOCK_SIZE],
            },
            BatchWrite {
                lba: 4,
                buf: &data[..100],
            },
            BatchWrite {
                lba: 9,
                buf: &data[2 * BLOCK_SIZE..],
            },
        ];
        let kinds = |results: Vec<io::Result<()>>| -> Vec<Option<io::ErrorKind>> {
            results
                .into_iter()
                .map(|r| r.err().map(|e| e.kind()))
                .collect()
        };
        let invalid = Some(io::ErrorKind::InvalidInput);
        assert_eq!(
            kinds(device.write_batch(&writes)),
            [None, invalid, invalid, None]
        );

        let (mut first, mut second, mut outside) = (
            vec![0u8; 2 * BLOCK_SIZE],
            vec![0u8; 2 * BLOCK_SIZE],
            vec![0u8; BLOCK_SIZE],
        );
        let mut reads = [
            BatchRead {
                lba: 9,
                buf: &mut second,
            },
            BatchRead {
                lba: 16,
                buf: &mut outside,
            },
            BatchRead {
                lba: 0,
                buf: &mut first,
            },
        ];
        assert_eq!(kinds(device.read_batch(&mut reads)), [None, invalid, None]);
        assert_eq!(first, data[..2 * BLOCK_SIZE]);
        assert_eq!(second, data[2 * BLOCK_SIZE..]);
        let stats = device.stats();
        assert_eq!((stats.reads, stats.writes), (2, 2));
        assert_eq!(stats.host_bytes_read, 4 * BLOCK_BYTES);
    }

    /// Counts which batch and async entry points reached it.
    #[derive(Default)]
    struct Recorder {
        batches: AtomicUsize,
        async_reads: AtomicUsize,
    }

    impl BlockDevice for Recorder {
        fn block_count(&self) -> u64 {
            4
        }
        fn read(&self, _lba: u64, _buf: &mut [u8]) -> io::Result<()> {
            Ok(())
        }
        fn write(&self, _lba: u64, _buf: &[u8]) -> io::Result<()> {
            Ok(())
        }
        fn trim(&self, _lba: u64, _count: u64) -> io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn stats(&self) -> DeviceStats {
            DeviceStats::default()
        }
        fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<()>> {
            self.batches.fetch_add(1, Relaxed);
            reads.iter().map(|_| Ok(())).collect()
        }
        fn write_batch(&self, writes: &[BatchWrite<'_>]) -> Vec<io::Result<()>> {
            self.batches.fetch_add(1, Relaxed);
            writes.iter().map(|_| Ok(())).collect()
        }
        fn read_async(&self, _lba: u64, buf: AlignedBuf) -> ReadFuture {
            self.async_reads.fetch_add(1, Relaxed);
            ReadFuture::ready(Ok(()), buf)
        }
    }

    #[test]
    fn arc_and_box_forward_batches_and_async_reads() {
        fn exercise(device: &dyn BlockDevice) {
            let mut block = vec![0u8; BLOCK_SIZE];
            let mut reads = [BatchRead {
                lba: 0,
                buf: &mut block,
            }];
            assert_eq!(device.read_batch(&mut reads).len(), 1);
            let writes = [BatchWrite {
                lba: 1,
                buf: &[0; BLOCK_SIZE],
            }];
            assert_eq!(device.write_batch(&writes).len(), 1);
            drop(device.read_async(2, AlignedBuf::zeroed(1)));
        }
        let shared = Arc::new(Recorder::default());
        exercise(&Arc::clone(&shared));
        let boxed: Box<dyn BlockDevice> = Box::new(Arc::clone(&shared));
        exercise(&boxed);
        assert_eq!(shared.batches.load(Relaxed), 4);
        assert_eq!(shared.async_reads.load(Relaxed), 2);
    }
}
