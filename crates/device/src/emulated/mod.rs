//! An emulated SSD with transparent per-4KB compression (paper §2.3, §3.3; SPEC §3).
//!
//! The host writes uncompressed 4 KiB blocks; a real computational SSD (the paper's ScaleFlux
//! CSD 3000) compresses each one with hardware zlib on its controller and stores only the
//! compressed bytes. We have no such drive, so [`CompressingDevice`] writes the data to an
//! ordinary device unchanged and, on its own "controller" threads, computes what each block
//! would occupy on NAND. That gives the SSD tier the two figures it needs: physical usage
//! (its capacity manager obeys it) and `V_NAND` (for `wr_nand` and `wa`).
//!
//! The device and its options are here; the accounting table (`accounting`), the zlib sizing
//! of a block (`sizer`), the controller threads (`controller`), the sidecar that persists the
//! table (`sidecar`) and its rebuild from the data (`rebuild`) have a module each.

mod accounting;
mod controller;
mod rebuild;
mod sidecar;
mod sizer;
#[cfg(test)]
mod tests;

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ThreadId;

use parking_lot::{Mutex, RwLock};

use crate::{
    AlignedBuf, BLOCK_BYTES, BLOCK_SIZE, BatchRead, BatchWrite, BlockDevice, DeviceCompression,
    DeviceStats, FileDevice, FileOptions, ReadFuture, invalid_input,
};
use accounting::{Accounting, RAW_BLOCK};
use controller::{Controller, Job, controller_stopped};
use rebuild::rebuild;
pub use sidecar::{AccountingOrigin, RebuildReason};
use sidecar::{Sidecar, load_sidecar, remove_if_present};

/// How a [`CompressingDevice`] behaves and where it keeps its accounting.
#[derive(Clone, Debug, PartialEq)]
pub struct EmulatorOptions {
    /// `Emulate` compresses every block on the controller threads; `None` and `Host` account
    /// a plain SSD (physical = host bytes) with no compression work; `Hardware` passes everything
    /// through and reports physical figures as 0 (unknown).
    pub mode: DeviceCompression,
    /// Logical capacity / physical capacity in `Emulate` mode (default 4.0, as in the
    /// paper's Fig. 3: 4 TB of NAND behind 16 TB of LBAs). `None` mode ignores it: a plain
    /// SSD exposes exactly its NAND.
    pub logical_to_physical: f64,
    /// Where to persist the per-LBA physical sizes for a warm restart. `None` rebuilds them
    /// from the device's contents at every open.
    pub sidecar: Option<PathBuf>,
    /// Controller threads compressing in `Emulate` mode, each with its own zlib compressor.
    /// One sustains about 200 MB/s of host writes.
    pub controller_threads: usize,
    /// Blocks that may wait for the controllers before a write blocks (back-pressure). Each
    /// waiting block holds a 4 KiB copy, so this bounds the emulator's memory.
    pub queue_blocks: usize,
    /// Nice level of the controller threads (default 10). The real drive compresses on its
    /// own silicon, so the emulation should take as little CPU from the host's threads as
    /// it can: at a lower priority the scheduler runs a woken foreground thread first.
    /// When the CPUs are saturated the controllers then fall behind and back-pressure slows
    /// writers instead. 0 = the caller's priority.
    pub controller_nice: i32,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        Self {
            mode: DeviceCompression::Emulate,
            logical_to_physical: 4.0,
            sidecar: None,
            controller_threads: 1,
            queue_blocks: 4096,
            controller_nice: 10,
        }
    }
}

impl EmulatorOptions {
    /// The conventional sidecar for a data file: `<data_path>.csd`.
    pub fn sidecar_for(data_path: &Path) -> PathBuf {
        let mut name = data_path.as_os_str().to_owned();
        name.push(".csd");
        PathBuf::from(name)
    }
}

/// A block device that accounts physical (compressed) bytes like an SSD with built-in
/// transparent compression. See the crate docs and `docs/DEVICE.md` for the accounting rules.
///
/// Reads, writes, trims and flushes go to the inner device synchronously. In `Emulate` mode a
/// write also hands a copy of each block to a controller thread through a bounded channel;
/// the controller compresses it (zlib level 6, `libdeflater`) and records its size. The
/// caller pays one copy and one channel send per block, never the compression and never a
/// thread wake-up — unless the queue is full, which is back-pressure.
///
/// Accounting rules:
/// * a block's physical size is its zlib level-6 size, capped at 4096 (stored raw); an
///   all-zero block costs what zlib makes of 4 KiB of zeros (26 bytes), computed once and
///   reused;
/// * `V_NAND` (`nand_bytes_written`) adds the physical size of every block written;
///   `physical_used` is the sum of the sizes of live blocks (an overwrite replaces, a trim
///   frees);
/// * the emulator never refuses a write: `physical_used` may exceed `physical_capacity`,
///   and the SSD tier's capacity manager must keep below its watermark;
/// * writes and trims are accounted in the order they returned, per LBA; for concurrent
///   writes to the same LBA the accounted size is that of one of them;
/// * stats lag the controllers by a few milliseconds; [`BlockDevice::drain`] waits until
///   every write and trim that returned before it is accounted.
///
/// With a sidecar configured, `flush` (and `close`/drop) persist the size table; the first
/// write or trim after that deletes the sidecar, so a process that stops without a clean
/// close leaves none and the next open rebuilds by scanning the data (see
/// [`AccountingOrigin`]). After a power loss, blocks written in the last seconds may be
/// mis-accounted, since the sidecar's deletion is not synced.
pub struct CompressingDevice<D: BlockDevice> {
    inner: D,
    mode: DeviceCompression,
    physical_capacity: u64,
    /// `None` in `Hardware` mode.
    accounting: Option<Arc<Accounting>>,
    controllers: Vec<Controller>,
    sidecar: Option<Sidecar>,
    origin: AccountingOrigin,
    compression_threads: Arc<Mutex<Vec<ThreadId>>>,
    /// (reads, bytes) the rebuild made on the inner device: the emulator's own doing, not
    /// the host's, so they are left out of the host counters.
    rebuild_reads: (u64, u64),
}

impl CompressingDevice<FileDevice> {
    /// Opens a [`FileDevice`] at `path` and wraps it; unless `options.sidecar` is set, the
    /// sidecar is `<path>.csd`.
    pub fn open_file(
        path: impl AsRef<Path>,
        logical_size: u64,
        file_options: &FileOptions,
        mut options: EmulatorOptions,
    ) -> io::Result<Self> {
        let path = path.as_ref();
        let file = FileDevice::open_with(path, logical_size, file_options)?;
        options
            .sidecar
            .get_or_insert_with(|| EmulatorOptions::sidecar_for(path));
        Self::new(file, options)
    }
}

impl<D: BlockDevice> CompressingDevice<D> {
    /// Wraps `inner`, loading the per-LBA sizes from the sidecar or rebuilding them by reading
    /// and compressing every data extent of `inner` (on all cores; ≈ 20 µs per written block
    /// per core), and starts the controller threads.
    pub fn new(inner: D, options: EmulatorOptions) -> io::Result<Self> {
        let ratio = options.logical_to_physical;
        if !(ratio.is_finite() && ratio > 0.0) {
            return Err(invalid_input(format!(
                "logical_to_physical must be a positive number, not {ratio}"
            )));
        }
        if options.controller_threads == 0 || options.queue_blocks == 0 {
            return Err(invalid_input(
                "controller_threads and queue_blocks must be at least 1".to_string(),
            ));
        }
        let logical_capacity = inner.block_count() * BLOCK_BYTES;
        let mode = options.mode;
        let physical_capacity = match mode {
            DeviceCompression::Emulate => {
                ((logical_capacity as f64 / ratio) as u64) / BLOCK_BYTES * BLOCK_BYTES
            }
            DeviceCompression::None | DeviceCompression::Host => logical_capacity,
            DeviceCompression::Hardware => 0,
        };
        let compression_threads = Arc::new(Mutex::new(Vec::new()));
        if mode == DeviceCompression::Hardware {
            // Writes in this mode go unaccounted, so a table left by an emulating run would
            // be stale the next time one opens the device.
            if let Some(path) = &options.sidecar {
                remove_if_present(path)?;
            }
            return Ok(Self {
                inner,
                mode,
                physical_capacity,
                accounting: None,
                controllers: Vec::new(),
                sidecar: None,
                origin: AccountingOrigin::NotTracked,
                compression_threads,
                rebuild_reads: (0, 0),
            });
        }

        let accounting = Arc::new(Accounting::new(inner.block_count()));
        let origin = match &options.sidecar {
            None => AccountingOrigin::Rebuilt(RebuildReason::NoSidecar),
            Some(path) => match load_sidecar(path, mode, &accounting)? {
                Ok(()) => AccountingOrigin::Loaded,
                Err(reason) => AccountingOrigin::Rebuilt(reason),
            },
        };
        let mut rebuild_reads = (0, 0);
        if let AccountingOrigin::Rebuilt(_) = origin {
            let before = inner.stats();
            rebuild(&inner, mode, &accounting)?;
            let after = inner.stats();
            rebuild_reads = (
                after.reads.saturating_sub(before.reads),
                after.host_bytes_read.saturating_sub(before.host_bytes_read),
            );
            // Whatever sidecar is there no longer describes the device.
            if let Some(path) = &options.sidecar {
                remove_if_present(path)?;
            }
        }
        let sidecar = options.sidecar.map(|path| Sidecar {
            on_disk: AtomicBool::new(origin == AccountingOrigin::Loaded),
            path,
            gate: RwLock::new(()),
            invalidation: Mutex::new(()),
        });

        let mut controllers = Vec::new();
        if mode == DeviceCompression::Emulate {
            let shards = options.controller_threads;
            let capacity = options.queue_blocks.div_ceil(shards);
            for shard in 0..shards {
                controllers.push(Controller::spawn(
                    shard,
                    shards,
                    capacity,
                    options.controller_nice,
                    Arc::clone(&accounting),
                    Arc::clone(&compression_threads),
                )?);
            }
        }
        Ok(Self {
            inner,
            mode,
            physical_capacity,
            accounting: Some(accounting),
            controllers,
            sidecar,
            origin,
            compression_threads,
            rebuild_reads,
        })
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The compression mode this device was opened with.
    pub fn mode(&self) -> DeviceCompression {
        self.mode
    }

    /// Where the per-LBA physical sizes came from when the device was opened.
    pub fn accounting_origin(&self) -> &AccountingOrigin {
        &self.origin
    }

    /// The accounted physical size of `lba` in bytes (0 = never written or trimmed), or
    /// `None` in `Hardware` mode or past the end of the device. Lags like the stats do.
    pub fn physical_size(&self, lba: u64) -> Option<u16> {
        let accounting = self.accounting.as_ref()?;
        let slot = accounting.sizes.get(usize::try_from(lba).ok()?)?;
        Some(slot.load(Ordering::Relaxed))
    }

    /// Threads that have compressed blocks so far: only controller threads, never a caller.
    pub fn compression_threads(&self) -> Vec<ThreadId> {
        self.compression_threads.lock().clone()
    }

    /// Blocks written but not yet accounted by the controllers.
    pub fn backlog(&self) -> usize {
        self.controllers.iter().map(|c| c.jobs.len()).sum()
    }

    /// Flushes the inner device, persists the accounting and stops the controllers,
    /// reporting the errors that dropping the device would have to ignore.
    pub fn close(mut self) -> io::Result<()> {
        let flushed = self.flush();
        self.stop_controllers();
        flushed
    }

    fn stop_controllers(&mut self) {
        for controller in std::mem::take(&mut self.controllers) {
            controller.stop();
        }
    }

    /// Deletes a persisted sidecar before the first mutation after it was written, so a
    /// sidecar on disk always matches the device (see the type's docs).
    fn invalidate_sidecar(&self) -> io::Result<()> {
        self.sidecar.as_ref().map_or(Ok(()), Sidecar::invalidate)
    }

    fn controller_for(&self, lba: u64) -> &Controller {
        &self.controllers[(lba % self.controllers.len() as u64) as usize]
    }

    /// Hands each block of a write that reached the device to the accounting.
    fn account_write(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        match (self.mode, &self.accounting) {
            (DeviceCompression::Emulate, Some(_)) => {
                for (block_lba, block) in (lba..).zip(buf.chunks_exact(BLOCK_SIZE)) {
                    self.controller_for(block_lba).submit(Job::Write {
                        lba: block_lba,
                        block: block.into(),
                    })?;
                }
            }
            (mode, Some(accounting)) if mode.plain() => {
                for block_lba in lba..lba + (buf.len() / BLOCK_SIZE) as u64 {
                    accounting.record_write(block_lba, RAW_BLOCK);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl<D: BlockDevice> BlockDevice for CompressingDevice<D> {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        // The drive decompresses in a few microseconds on its own silicon: nothing to model.
        self.inner.read(lba, buf)
    }

    fn write(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        let _no_flush_in_between = self.sidecar.as_ref().map(|s| s.gate.read());
        self.invalidate_sidecar()?;
        self.inner.write(lba, buf)?;
        self.account_write(lba, buf)
    }

    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<()>> {
        self.inner.read_batch(reads)
    }

    fn write_batch(&self, writes: &[BatchWrite<'_>]) -> Vec<io::Result<()>> {
        if writes.is_empty() {
            return Vec::new();
        }
        let _no_flush_in_between = self.sidecar.as_ref().map(|s| s.gate.read());
        if let Err(err) = self.invalidate_sidecar() {
            return writes
                .iter()
                .map(|_| Err(io::Error::new(err.kind(), err.to_string())))
                .collect();
        }
        let mut results = self.inner.write_batch(writes);
        for (write, result) in writes.iter().zip(&mut results) {
            if result.is_ok()
                && let Err(err) = self.account_write(write.lba, write.buf)
            {
                *result = Err(err);
            }
        }
        results
    }

    fn read_async(&self, lba: u64, buf: AlignedBuf) -> ReadFuture {
        self.inner.read_async(lba, buf)
    }

    fn trim(&self, lba: u64, count: u64) -> io::Result<()> {
        let _no_flush_in_between = self.sidecar.as_ref().map(|s| s.gate.read());
        self.invalidate_sidecar()?;
        self.inner.trim(lba, count)?;
        if count == 0 {
            return Ok(());
        }
        match (self.mode, &self.accounting) {
            (DeviceCompression::Emulate, Some(_)) => {
                // Through the queues, behind any write of these LBAs still waiting there.
                for controller in &self.controllers {
                    controller.submit(Job::Trim {
                        lbas: lba..lba + count,
                    })?;
                    // Trims are rare and the capacity manager acts on the space they
                    // free, so here (unlike writes) a wake-up is worth its cost.
                    controller.thread.thread().unpark();
                }
            }
            (mode, Some(accounting)) if mode.plain() => {
                accounting.record_trim(lba..lba + count, 0, 1)
            }
            _ => {}
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let (Some(sidecar), Some(accounting)) = (&self.sidecar, &self.accounting) else {
            return self.inner.flush();
        };
        let _writers_wait = sidecar.gate.write();
        // Data first: a durable sidecar must not describe blocks that are not.
        self.inner.flush()?;
        if !sidecar.on_disk.load(Ordering::Acquire) {
            self.drain()?;
            sidecar.persist(self.mode, accounting)?;
            sidecar.on_disk.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn compression(&self) -> DeviceCompression {
        self.mode
    }

    fn stats(&self) -> DeviceStats {
        let mut stats = self.inner.stats();
        stats.reads = stats.reads.saturating_sub(self.rebuild_reads.0);
        stats.host_bytes_read = stats.host_bytes_read.saturating_sub(self.rebuild_reads.1);
        stats.logical_capacity = self.inner.block_count() * BLOCK_BYTES;
        stats.physical_capacity = self.physical_capacity;
        (stats.physical_used, stats.nand_bytes_written) = match &self.accounting {
            Some(accounting) => (
                accounting.physical_used.load(Ordering::Relaxed),
                accounting.nand_bytes_written.load(Ordering::Relaxed),
            ),
            None => (0, 0),
        };
        stats
    }

    fn drain(&self) -> io::Result<()> {
        if self.controllers.is_empty() {
            return self.inner.drain();
        }
        let (done_tx, done_rx) = crossbeam_channel::bounded(self.controllers.len());
        for controller in &self.controllers {
            controller.submit(Job::Barrier(done_tx.clone()))?;
            controller.thread.thread().unpark();
        }
        // Dropped so that a controller dying with our barrier unqueued ends the wait.
        drop(done_tx);
        for _ in &self.controllers {
            done_rx.recv().map_err(|_| controller_stopped())?;
        }
        self.inner.drain()
    }

    fn data_extents(&self) -> io::Result<Option<Vec<Range<u64>>>> {
        self.inner.data_extents()
    }
}

impl<D: BlockDevice> Drop for CompressingDevice<D> {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; `close` reports them. A sidecar that failed
        // to persist is simply absent, and the next open rebuilds.
        if self
            .sidecar
            .as_ref()
            .is_some_and(|sidecar| !sidecar.on_disk.load(Ordering::Acquire))
        {
            let _ = self.flush();
        }
        self.stop_controllers();
    }
}

impl<D: BlockDevice + std::fmt::Debug> std::fmt::Debug for CompressingDevice<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompressingDevice")
            .field("inner", &self.inner)
            .field("mode", &self.mode)
            .field("physical_capacity", &self.physical_capacity)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}
