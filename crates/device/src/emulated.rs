//! An emulated SSD with transparent per-4KB compression (paper §2.3, §3.3; SPEC §3).
//!
//! The host writes uncompressed 4 KiB blocks; a real computational SSD (the paper's ScaleFlux
//! CSD 3000) compresses each one with hardware zlib on its controller and stores only the
//! compressed bytes. We have no such drive, so [`CompressingDevice`] writes the data to an
//! ordinary device unchanged and, on its own "controller" threads, computes what each block
//! would occupy on NAND. That gives the SSD tier the two figures it needs: physical usage
//! (its capacity manager obeys it) and `V_NAND` (for `wr_nand` and `wa`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use libdeflater::{CompressionLvl, Compressor};
use parking_lot::{Mutex, RwLock};

use crate::{
    AlignedBuf, BLOCK_BYTES, BLOCK_SIZE, BatchRead, BatchWrite, BlockDevice, DeviceCompression,
    DeviceStats, FileDevice, FileOptions, ReadFuture, invalid_input,
};

/// The CSD 3000 compresses with hardware zlib at about level 6 (SPEC §3).
const ZLIB_LEVEL: i32 = 6;

/// What NAND holds for an incompressible block: the drive stores it raw rather than grow it
/// by zlib's framing, so no block ever costs more than the host wrote.
const RAW_BLOCK: u16 = BLOCK_SIZE as u16;

/// How long an idle controller sleeps at first, and at most, between looks at its queue.
/// Callers never wake it (a wake-up costs 35–90 µs on this VM), so it polls; the back-off
/// keeps an idle emulator from costing CPU, and the bound keeps accounting at most a few
/// milliseconds behind.
const IDLE_SLEEP_MIN: Duration = Duration::from_micros(500);
const IDLE_SLEEP_MAX: Duration = Duration::from_millis(4);

/// Blocks read per request when rebuilding accounting from the data on the device.
const REBUILD_CHUNK_BLOCKS: u64 = 64;

/// Sidecar format: magic, version, mode, block count, one little-endian u16 per LBA, CRC32C.
const SIDECAR_MAGIC: [u8; 8] = *b"ZCCSDTBL";
const SIDECAR_VERSION: u32 = 1;
const SIDECAR_HEADER_LEN: usize = 8 + 4 + 4 + 8;

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

/// Where the per-LBA physical sizes of a [`CompressingDevice`] came from at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccountingOrigin {
    /// `Hardware` mode: the host cannot see physical sizes, so none are kept.
    NotTracked,
    /// Read from a valid sidecar written by a clean flush or close (warm restart).
    Loaded,
    /// Recomputed by reading and compressing every data extent of the device.
    Rebuilt(RebuildReason),
}

/// Why a [`CompressingDevice`] rebuilt its accounting instead of loading it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RebuildReason {
    /// No sidecar path was configured.
    NoSidecar,
    /// The sidecar file does not exist: first open, or writes happened after the last
    /// flush and the process stopped without a clean close.
    SidecarMissing,
    /// The sidecar exists but is unusable (bad checksum, wrong size, other mode or geometry).
    SidecarInvalid(String),
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
        let Some(sidecar) = &self.sidecar else {
            return Ok(());
        };
        if sidecar.on_disk.load(Ordering::Acquire) {
            let _only_one = sidecar.invalidation.lock();
            if sidecar.on_disk.load(Ordering::Acquire) {
                remove_if_present(&sidecar.path)?;
                sidecar.on_disk.store(false, Ordering::Release);
            }
        }
        Ok(())
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

    fn persist_sidecar(&self, sidecar: &Sidecar, accounting: &Accounting) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(SIDECAR_HEADER_LEN + accounting.sizes.len() * 2 + 4);
        bytes.extend_from_slice(&SIDECAR_MAGIC);
        bytes.extend_from_slice(&SIDECAR_VERSION.to_le_bytes());
        bytes.extend_from_slice(&mode_tag(self.mode).to_le_bytes());
        bytes.extend_from_slice(&(accounting.sizes.len() as u64).to_le_bytes());
        for size in accounting.sizes.iter() {
            bytes.extend_from_slice(&size.load(Ordering::Relaxed).to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());

        // Write-then-rename: a crash mid-write leaves the old state (no sidecar), never half
        // a table that could pass for a whole one.
        let mut temp = sidecar.path.clone().into_os_string();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        fs::rename(&temp, &sidecar.path)?;
        if let Some(dir) = sidecar.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
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
            self.persist_sidecar(sidecar, accounting)?;
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

/// Per-LBA physical sizes and the totals derived from them, shared by the controllers and
/// the device. Each LBA is only ever updated by one controller (LBAs are sharded), so
/// relaxed atomics suffice; `drain`'s channel round trip orders them for readers.
struct Accounting {
    /// Bytes on NAND per LBA; 0 = unmapped (never written or trimmed). Two bytes per 4 KiB
    /// keeps the table at 1/2048 of the logical space (4 MiB for 8 GiB).
    sizes: Box<[AtomicU16]>,
    physical_used: AtomicU64,
    nand_bytes_written: AtomicU64,
}

impl Accounting {
    fn new(block_count: u64) -> Self {
        Self {
            sizes: (0..block_count).map(|_| AtomicU16::new(0)).collect(),
            physical_used: AtomicU64::new(0),
            nand_bytes_written: AtomicU64::new(0),
        }
    }

    fn record_write(&self, lba: u64, size: u16) {
        let Some(slot) = self.sizes.get(lba as usize) else {
            return;
        };
        let old = slot.swap(size, Ordering::Relaxed);
        // Add before subtracting so a concurrent reader never sees a wrapped-around total.
        self.physical_used
            .fetch_add(u64::from(size), Ordering::Relaxed);
        self.physical_used
            .fetch_sub(u64::from(old), Ordering::Relaxed);
        self.nand_bytes_written
            .fetch_add(u64::from(size), Ordering::Relaxed);
    }

    /// Unmaps the LBAs of `lbas` that are `shard` modulo `shards`.
    fn record_trim(&self, lbas: Range<u64>, shard: u64, shards: u64) {
        let end = lbas.end.min(self.sizes.len() as u64);
        let first = lbas.start + (shard + shards - lbas.start % shards) % shards;
        let mut freed = 0;
        for lba in (first..end).step_by(shards as usize) {
            freed += u64::from(self.sizes[lba as usize].swap(0, Ordering::Relaxed));
        }
        self.physical_used.fetch_sub(freed, Ordering::Relaxed);
    }
}

/// Computes a block's size on NAND. One per thread: a libdeflate compressor is not shared.
struct BlockSizer {
    compressor: Compressor,
    output: Vec<u8>,
    zero_block_size: u16,
}

impl BlockSizer {
    fn new() -> Self {
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

    fn size(&mut self, block: &[u8]) -> u16 {
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

enum Job {
    Write { lba: u64, block: Box<[u8]> },
    Trim { lbas: Range<u64> },
    Barrier(Sender<()>),
}

/// One controller thread and its queue; it owns the LBAs congruent to its shard index.
struct Controller {
    jobs: Sender<Job>,
    thread: JoinHandle<()>,
}

impl Controller {
    fn spawn(
        shard: usize,
        shard_count: usize,
        capacity: usize,
        nice: i32,
        accounting: Arc<Accounting>,
        compression_threads: Arc<Mutex<Vec<ThreadId>>>,
    ) -> io::Result<Self> {
        let (jobs, queue) = crossbeam_channel::bounded(capacity);
        let thread = thread::Builder::new()
            .name(format!("zipcache-csd-{shard}"))
            .spawn(move || {
                set_current_thread_nice(nice);
                let shard = (shard as u64, shard_count as u64);
                run_controller(shard, &queue, &accounting, &compression_threads);
            })?;
        Ok(Self { jobs, thread })
    }

    /// Queues a job without waking the controller, unless the queue is full: then the
    /// caller wakes it and waits for room (back-pressure).
    fn submit(&self, job: Job) -> io::Result<()> {
        match self.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(job)) => {
                self.thread.thread().unpark();
                self.jobs.send(job).map_err(|_| controller_stopped())
            }
            Err(TrySendError::Disconnected(_)) => Err(controller_stopped()),
        }
    }

    fn stop(self) {
        let Self { jobs, thread } = self;
        drop(jobs);
        thread.thread().unpark();
        // A controller that panicked has nothing left to clean up.
        let _ = thread.join();
    }
}

/// The controller's loop: drains its queue in one go whenever it looks, sleeps when empty.
fn run_controller(
    (shard, shard_count): (u64, u64),
    queue: &Receiver<Job>,
    accounting: &Accounting,
    compression_threads: &Mutex<Vec<ThreadId>>,
) {
    let mut sizer = BlockSizer::new();
    let mut registered = false;
    let mut idle_sleep = IDLE_SLEEP_MIN;
    loop {
        match queue.try_recv() {
            Ok(Job::Write { lba, block }) => {
                if !registered {
                    compression_threads.lock().push(thread::current().id());
                    registered = true;
                }
                accounting.record_write(lba, sizer.size(&block));
                idle_sleep = IDLE_SLEEP_MIN;
            }
            Ok(Job::Trim { lbas }) => accounting.record_trim(lbas, shard, shard_count),
            Ok(Job::Barrier(done)) => {
                // The waiter may have given up; nothing to do about it here.
                let _ = done.send(());
            }
            Err(TryRecvError::Empty) => {
                thread::park_timeout(idle_sleep);
                idle_sleep = (idle_sleep * 2).min(IDLE_SLEEP_MAX);
            }
            Err(TryRecvError::Disconnected) => return,
        }
    }
}

struct Sidecar {
    path: PathBuf,
    /// True while the file at `path` matches the table (written by the last flush and no
    /// mutation since).
    on_disk: AtomicBool,
    /// Writers and trimmers hold it shared, flush exclusively: a flush's snapshot then never
    /// misses a write that already reached the device.
    gate: RwLock<()>,
    /// Lets one mutator delete the sidecar while the others wait for the deletion.
    invalidation: Mutex<()>,
}

fn mode_tag(mode: DeviceCompression) -> u32 {
    match mode {
        DeviceCompression::Emulate => 1,
        DeviceCompression::None => 2,
        DeviceCompression::Hardware => 3,
        DeviceCompression::Host => 4,
    }
}

/// Fills `accounting` from the sidecar at `path`. The outer error is an I/O failure to
/// report; the inner one says why the sidecar cannot be used (then we rebuild).
fn load_sidecar(
    path: &Path,
    mode: DeviceCompression,
    accounting: &Accounting,
) -> io::Result<Result<(), RebuildReason>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Ok(Err(RebuildReason::SidecarMissing));
        }
        Err(err) => return Err(err),
    };
    let invalid = |why: &str| Ok(Err(RebuildReason::SidecarInvalid(why.to_string())));
    let blocks = accounting.sizes.len();
    if bytes.len() != SIDECAR_HEADER_LEN + blocks * 2 + 4 {
        return invalid("length does not match the device's block count");
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return invalid("CRC32C mismatch");
    }
    let (header, table) = body.split_at(SIDECAR_HEADER_LEN);
    let field = |range: Range<usize>| {
        let mut out = [0u8; 8];
        out[..range.len()].copy_from_slice(&header[range]);
        u64::from_le_bytes(out)
    };
    if header[..8] != SIDECAR_MAGIC || field(8..12) != u64::from(SIDECAR_VERSION) {
        return invalid("not a version-1 sidecar");
    }
    if field(12..16) != u64::from(mode_tag(mode)) {
        return invalid("written in another compression mode");
    }
    if field(16..24) != blocks as u64 {
        return invalid("written for a device of another size");
    }
    let mut used = 0;
    for (slot, entry) in accounting.sizes.iter().zip(table.chunks_exact(2)) {
        let size = u16::from_le_bytes([entry[0], entry[1]]);
        if size > RAW_BLOCK {
            return invalid("block size above 4096");
        }
        slot.store(size, Ordering::Relaxed);
        used += u64::from(size);
    }
    accounting.physical_used.store(used, Ordering::Relaxed);
    Ok(Ok(()))
}

/// Recomputes every LBA's physical size from the data on `inner`, on all cores.
///
/// Blocks inside the device's data extents are read and sized; holes are unmapped. When the
/// device cannot list its extents (a block device), every block is read and all-zero blocks
/// count as unmapped, since a fresh device reads as zeros too.
fn rebuild<D: BlockDevice>(
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

/// Linux keeps the nice level per thread, so this leaves the rest of the process alone.
fn set_current_thread_nice(nice: i32) {
    if nice == 0 {
        return;
    }
    // The result is ignored on purpose: raising the nice level is always allowed, and a
    // refused lowering (negative `nice` without CAP_SYS_NICE) only keeps the default.
    // SAFETY: neither call takes pointers. `gettid` cannot fail; `setpriority` with
    // PRIO_PROCESS and a thread id changes only that thread's nice level.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

fn controller_stopped() -> io::Error {
    io::Error::other("the emulated SSD's controller thread has stopped")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{block_with_eta, complete, random_bytes};
    use crate::{FaultOp, FaultyDevice, MemDevice};

    const BLOCKS: u64 = 1024;

    fn emulator(options: EmulatorOptions) -> CompressingDevice<MemDevice> {
        CompressingDevice::new(MemDevice::new(BLOCKS), options).expect("emulator")
    }

    fn zero_block_size() -> u64 {
        u64::from(BlockSizer::new().size(&[0; BLOCK_SIZE]))
    }

    fn file_emulator(dir: &Path) -> CompressingDevice<FileDevice> {
        CompressingDevice::open_file(
            dir.join("ssd"),
            BLOCKS * BLOCK_BYTES,
            &FileOptions::default(),
            EmulatorOptions::default(),
        )
        .expect("open emulator")
    }

    /// A mix the SSD tier produces: under-filled sub-pages, full ones, empty ones.
    fn write_mixed_blocks(device: &impl BlockDevice) {
        for lba in 0..48u64 {
            let block = match lba % 4 {
                0 => vec![0; BLOCK_SIZE],
                1 => random_bytes(lba, BLOCK_SIZE),
                _ => block_with_eta(lba, 0.25 * (lba % 4) as f64),
            };
            device.write(lba * 3, &block).expect("write");
        }
        device.trim(9, 6).expect("trim");
    }

    fn sizes(device: &CompressingDevice<impl BlockDevice>) -> Vec<u16> {
        (0..BLOCKS)
            .map(|lba| device.physical_size(lba).unwrap_or(u16::MAX))
            .collect()
    }

    #[test]
    fn block_sizes_follow_compressibility() {
        let device = emulator(EmulatorOptions::default());
        device.write(0, &[0; BLOCK_SIZE]).expect("zeros");
        device
            .write(1, &random_bytes(1, BLOCK_SIZE))
            .expect("random");
        device.write(2, &block_with_eta(2, 0.5)).expect("eta 0.5");
        device.drain().expect("drain");

        let zero = u64::from(device.physical_size(0).expect("tracked"));
        let random = u64::from(device.physical_size(1).expect("tracked"));
        let half = u64::from(device.physical_size(2).expect("tracked"));
        assert!((1..32).contains(&zero), "all-zero block costs {zero} B");
        assert_eq!(random, BLOCK_BYTES, "random blocks are stored raw");
        assert!((2048..2200).contains(&half), "η = 0.5 block costs {half} B");

        let stats = device.stats();
        assert_eq!(stats.host_bytes_written, 3 * BLOCK_BYTES);
        assert_eq!(stats.nand_bytes_written, zero + random + half);
        assert_eq!(stats.physical_used, zero + random + half);
        assert_eq!(stats.logical_capacity, BLOCKS * BLOCK_BYTES);
        assert_eq!(stats.physical_capacity, BLOCKS * BLOCK_BYTES / 4);
        assert_eq!(
            device.physical_free(),
            Some(stats.physical_capacity - stats.physical_used)
        );
        assert!(stats.wr_nand().is_some_and(|wr| wr > 1.9));
    }

    #[test]
    fn overwrites_replace_and_trims_free_physical_space() {
        let device = emulator(EmulatorOptions::default());
        device
            .write(5, &random_bytes(5, 2 * BLOCK_SIZE))
            .expect("write");
        device.write(6, &[0; BLOCK_SIZE]).expect("overwrite");
        device.drain().expect("drain");
        let stats = device.stats();
        assert_eq!(stats.physical_used, BLOCK_BYTES + zero_block_size());
        assert_eq!(
            stats.nand_bytes_written,
            2 * BLOCK_BYTES + zero_block_size()
        );
        assert_eq!(stats.host_bytes_written, 3 * BLOCK_BYTES);

        device.trim(0, 10).expect("trim");
        device.drain().expect("drain");
        let after = device.stats();
        assert_eq!(after.physical_used, 0);
        assert_eq!(
            after.nand_bytes_written, stats.nand_bytes_written,
            "trims write nothing"
        );
        assert_eq!(after.trims, 1);
        assert_eq!(device.physical_size(5), Some(0));
        let mut block = vec![1u8; BLOCK_SIZE];
        device.read(5, &mut block).expect("read");
        assert!(block.iter().all(|&b| b == 0));
    }

    #[test]
    fn compression_runs_on_controller_threads_only() {
        let device = emulator(EmulatorOptions {
            controller_threads: 2,
            ..EmulatorOptions::default()
        });
        assert!(device.compression_threads().is_empty());
        for lba in 0..8 {
            device.write(lba, &block_with_eta(lba, 0.5)).expect("write");
        }
        device.drain().expect("drain");
        let threads = device.compression_threads();
        assert_eq!(threads.len(), 2, "each shard compresses its own LBAs");
        assert!(!threads.contains(&thread::current().id()));
    }

    /// Nice levels of this process's threads named `zipcache-csd-*`, from /proc.
    fn controller_nice_levels() -> Vec<i32> {
        let mut levels = Vec::new();
        for task in fs::read_dir("/proc/self/task").expect("tasks").flatten() {
            let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            let stat = fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // Fields after the parenthesised name: state is field 3, nice is field 19.
            let after_name = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
            if comm.starts_with("zipcache-csd-")
                && let Some(nice) = after_name.split(' ').nth(16)
            {
                levels.push(nice.parse().expect("nice field"));
            }
        }
        levels
    }

    #[test]
    fn controllers_run_at_the_configured_nice_level() {
        // 7 is used by no other test, so concurrent tests' controllers cannot be mistaken.
        let device = emulator(EmulatorOptions {
            controller_nice: 7,
            controller_threads: 2,
            ..EmulatorOptions::default()
        });
        device.drain().expect("controllers started");
        let at_seven = controller_nice_levels().iter().filter(|&&n| n == 7).count();
        assert_eq!(at_seven, 2);
        assert_eq!(
            thread::current()
                .name()
                .map(|n| n.starts_with("zipcache-csd")),
            Some(false)
        );
    }

    #[test]
    fn concurrent_writers_give_exact_totals_after_drain() {
        let device = emulator(EmulatorOptions {
            controller_threads: 2,
            queue_blocks: 64,
            ..EmulatorOptions::default()
        });
        let writers = 4u64;
        let per_writer = 200u64;
        let block_for = |lba: u64| block_with_eta(lba, (lba % 5) as f64 / 4.0);
        thread::scope(|scope| {
            for writer in 0..writers {
                let device = &device;
                scope.spawn(move || {
                    for i in 0..per_writer {
                        let lba = i * writers + writer;
                        device.write(lba, &block_for(lba)).expect("write");
                    }
                });
            }
        });
        device.drain().expect("drain");
        assert_eq!(device.backlog(), 0);

        let mut sizer = BlockSizer::new();
        let expected: u64 = (0..writers * per_writer)
            .map(|lba| u64::from(sizer.size(&block_for(lba))))
            .sum();
        let stats = device.stats();
        assert_eq!(stats.writes, writers * per_writer);
        assert_eq!(stats.host_bytes_written, writers * per_writer * BLOCK_BYTES);
        assert_eq!(stats.nand_bytes_written, expected);
        assert_eq!(stats.physical_used, expected);
    }

    #[test]
    fn a_full_queue_applies_back_pressure_without_losing_blocks() {
        let device = emulator(EmulatorOptions {
            queue_blocks: 1,
            ..EmulatorOptions::default()
        });
        device
            .write(0, &random_bytes(9, 64 * BLOCK_SIZE))
            .expect("write");
        device.drain().expect("drain");
        assert_eq!(device.stats().physical_used, 64 * BLOCK_BYTES);
    }

    #[test]
    fn plain_modes_account_a_plain_ssd_without_compressing() {
        for mode in [DeviceCompression::None, DeviceCompression::Host] {
            let device = emulator(EmulatorOptions {
                mode,
                ..EmulatorOptions::default()
            });
            device.write(0, &[0; 3 * BLOCK_SIZE]).expect("write");
            device
                .write(1, &random_bytes(1, BLOCK_SIZE))
                .expect("overwrite");
            device.trim(2, 1).expect("trim");
            let stats = device.stats();
            assert_eq!(stats.physical_capacity, stats.logical_capacity, "{mode:?}");
            assert_eq!(
                stats.nand_bytes_written, stats.host_bytes_written,
                "{mode:?}"
            );
            assert_eq!(stats.physical_used, 2 * BLOCK_BYTES, "{mode:?}");
            assert!(device.compression_threads().is_empty(), "{mode:?}");
        }
    }

    #[test]
    fn hardware_mode_passes_through_and_reports_physical_as_unknown() {
        let device = emulator(EmulatorOptions {
            mode: DeviceCompression::Hardware,
            ..EmulatorOptions::default()
        });
        let data = random_bytes(3, BLOCK_SIZE);
        device.write(7, &data).expect("write");
        let mut back = vec![0u8; BLOCK_SIZE];
        device.read(7, &mut back).expect("read");
        assert_eq!(back, data);
        let stats = device.stats();
        assert_eq!(
            (
                stats.physical_capacity,
                stats.physical_used,
                stats.nand_bytes_written
            ),
            (0, 0, 0)
        );
        assert_eq!(stats.host_bytes_written, BLOCK_BYTES);
        assert_eq!(device.physical_free(), None);
        assert_eq!(device.physical_size(7), None);
        assert_eq!(device.accounting_origin(), &AccountingOrigin::NotTracked);
    }

    #[test]
    fn hardware_mode_discards_a_stale_sidecar() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sidecar = EmulatorOptions::sidecar_for(&dir.path().join("ssd"));
        let device = file_emulator(dir.path());
        write_mixed_blocks(&device);
        device.close().expect("close");
        assert!(sidecar.exists());
        let hardware = CompressingDevice::open_file(
            dir.path().join("ssd"),
            BLOCKS * BLOCK_BYTES,
            &FileOptions::default(),
            EmulatorOptions {
                mode: DeviceCompression::Hardware,
                ..EmulatorOptions::default()
            },
        )
        .expect("open in hardware mode");
        assert!(!sidecar.exists(), "its writes would go unaccounted");
        drop(hardware);
        assert!(!sidecar.exists());
    }

    #[test]
    fn failed_writes_are_not_accounted() {
        let faulty = FaultyDevice::new(MemDevice::new(BLOCKS));
        faulty.fail_lba(FaultOp::Write, 3);
        let device = CompressingDevice::new(faulty, EmulatorOptions::default()).expect("open");
        assert!(device.write(3, &random_bytes(1, BLOCK_SIZE)).is_err());
        device
            .write(4, &random_bytes(2, BLOCK_SIZE))
            .expect("write");
        device.drain().expect("drain");
        assert_eq!(device.stats().nand_bytes_written, BLOCK_BYTES);
        assert_eq!(device.stats().host_bytes_written, BLOCK_BYTES);
    }

    #[test]
    fn bad_options_are_rejected() {
        for options in [
            EmulatorOptions {
                logical_to_physical: 0.0,
                ..EmulatorOptions::default()
            },
            EmulatorOptions {
                logical_to_physical: f64::NAN,
                ..EmulatorOptions::default()
            },
            EmulatorOptions {
                controller_threads: 0,
                ..EmulatorOptions::default()
            },
            EmulatorOptions {
                queue_blocks: 0,
                ..EmulatorOptions::default()
            },
        ] {
            let err = CompressingDevice::new(MemDevice::new(4), options).err();
            assert_eq!(err.map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
        }
    }

    #[test]
    fn sidecar_round_trip_keeps_physical_accounting() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sidecar = EmulatorOptions::sidecar_for(&dir.path().join("ssd"));
        let device = file_emulator(dir.path());
        assert_eq!(
            device.accounting_origin(),
            &AccountingOrigin::Rebuilt(RebuildReason::SidecarMissing)
        );
        write_mixed_blocks(&device);
        device.flush().expect("flush");
        assert!(sidecar.exists(), "flush persists the table");
        let before = device.stats();
        let sizes_before = sizes(&device);
        device.close().expect("close");

        let device = file_emulator(dir.path());
        assert_eq!(device.accounting_origin(), &AccountingOrigin::Loaded);
        assert_eq!(sizes(&device), sizes_before);
        let after = device.stats();
        assert_eq!(after.physical_used, before.physical_used);
        assert_eq!(after.host_bytes_written, 0, "counters restart at open");

        device
            .write(1000, &random_bytes(7, BLOCK_SIZE))
            .expect("write");
        assert!(!sidecar.exists(), "a write makes the persisted table stale");
        drop(device);
        assert!(sidecar.exists(), "drop persists again");
    }

    #[test]
    fn corrupt_or_mismatched_sidecars_are_rebuilt_from_the_data() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sidecar = EmulatorOptions::sidecar_for(&dir.path().join("ssd"));
        let device = file_emulator(dir.path());
        write_mixed_blocks(&device);
        device.drain().expect("drain");
        let expected = device.stats().physical_used;
        let sizes_before = sizes(&device);
        device.close().expect("close");

        let mut bytes = fs::read(&sidecar).expect("sidecar");
        bytes[SIDECAR_HEADER_LEN + 10] ^= 0x40;
        fs::write(&sidecar, &bytes).expect("corrupt it");
        let device = file_emulator(dir.path());
        assert_eq!(
            device.accounting_origin(),
            &AccountingOrigin::Rebuilt(RebuildReason::SidecarInvalid("CRC32C mismatch".into()))
        );
        assert_eq!(
            sizes(&device),
            sizes_before,
            "rebuild recomputes the same sizes"
        );
        assert_eq!(device.stats().physical_used, expected);
        assert_eq!(device.stats().reads, 0, "rebuild reads are not host reads");
        device.close().expect("close");

        let other_mode = CompressingDevice::open_file(
            dir.path().join("ssd"),
            BLOCKS * BLOCK_BYTES,
            &FileOptions::default(),
            EmulatorOptions {
                mode: DeviceCompression::None,
                ..EmulatorOptions::default()
            },
        )
        .expect("open in None mode");
        assert!(matches!(
            other_mode.accounting_origin(),
            AccountingOrigin::Rebuilt(RebuildReason::SidecarInvalid(_))
        ));
        let live_blocks = sizes_before.iter().filter(|&&size| size > 0).count() as u64;
        assert_eq!(other_mode.stats().physical_used, live_blocks * BLOCK_BYTES);
    }

    #[test]
    fn an_unclean_stop_after_more_writes_rebuilds_instead_of_trusting_the_sidecar() {
        let dir = tempfile::tempdir().expect("temp dir");
        let device = file_emulator(dir.path());
        write_mixed_blocks(&device);
        device.flush().expect("flush");
        device
            .write(500, &random_bytes(1, 4 * BLOCK_SIZE))
            .expect("write after flush");
        device.trim(0, 3).expect("trim after flush");
        device.drain().expect("drain");
        let expected = sizes(&device);
        // A crash: no close, no drop, nothing persisted after the flush.
        std::mem::forget(device);

        let device = file_emulator(dir.path());
        assert_eq!(
            device.accounting_origin(),
            &AccountingOrigin::Rebuilt(RebuildReason::SidecarMissing)
        );
        assert_eq!(sizes(&device), expected);
    }

    #[test]
    fn without_a_sidecar_memory_devices_rebuild_from_their_blocks() {
        let memory = Arc::new(MemDevice::new(BLOCKS));
        let device =
            CompressingDevice::new(Arc::clone(&memory), EmulatorOptions::default()).expect("open");
        write_mixed_blocks(&device);
        device.drain().expect("drain");
        let expected = sizes(&device);
        drop(device);
        let device = CompressingDevice::new(memory, EmulatorOptions::default()).expect("reopen");
        assert_eq!(
            device.accounting_origin(),
            &AccountingOrigin::Rebuilt(RebuildReason::NoSidecar)
        );
        assert_eq!(sizes(&device), expected);
    }

    #[test]
    fn batches_account_and_count_like_single_requests() {
        for mode in [DeviceCompression::Emulate, DeviceCompression::None] {
            let options = EmulatorOptions {
                mode,
                controller_threads: 2,
                ..EmulatorOptions::default()
            };
            let (single, batched) = (emulator(options.clone()), emulator(options));
            let blocks: Vec<Vec<u8>> = (0..40)
                .map(|i| block_with_eta(i, (i % 5) as f64 / 4.0))
                .collect();
            let three_blocks = random_bytes(9, 3 * BLOCK_SIZE);
            let mut writes: Vec<BatchWrite<'_>> = (0..)
                .zip(&blocks)
                .map(|(i, buf)| BatchWrite { lba: i * 2, buf })
                .collect();
            writes.push(BatchWrite {
                lba: 200,
                buf: &three_blocks,
            });
            for write in &writes {
                single.write(write.lba, write.buf).expect("write");
            }
            writes.push(BatchWrite {
                lba: BLOCKS,
                buf: &blocks[0],
            });
            let failed: Vec<bool> = batched
                .write_batch(&writes)
                .iter()
                .map(Result::is_err)
                .collect();
            assert_eq!(failed.iter().filter(|&&f| f).count(), 1);
            assert!(
                failed[writes.len() - 1],
                "the request past the end fails alone"
            );
            single.drain().expect("drain");
            batched.drain().expect("drain");
            assert_eq!(sizes(&single), sizes(&batched), "{mode:?}");
            assert_eq!(single.stats(), batched.stats(), "{mode:?}");

            let mut back: Vec<Vec<u8>> = writes.iter().map(|w| vec![0; w.buf.len()]).collect();
            let mut reads: Vec<BatchRead<'_>> = writes
                .iter()
                .zip(back.iter_mut())
                .map(|(write, buf)| BatchRead {
                    lba: write.lba,
                    buf,
                })
                .collect();
            let results = batched.read_batch(&mut reads);
            assert_eq!(
                results.iter().filter(|r| r.is_ok()).count(),
                writes.len() - 1
            );
            for (write, read) in writes.iter().zip(&back).take(writes.len() - 1) {
                assert!(write.buf == &read[..], "lba {}", write.lba);
            }
            let (result, _) = complete(batched.read_async(200, AlignedBuf::zeroed(3)));
            result.expect("async read");
            assert_eq!(batched.stats().reads, writes.len() as u64);
        }
    }

    #[test]
    fn a_batch_invalidates_the_sidecar_and_is_persisted_by_the_next_flush() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sidecar = EmulatorOptions::sidecar_for(&dir.path().join("ssd"));
        let device = file_emulator(dir.path());
        write_mixed_blocks(&device);
        device.flush().expect("flush");
        assert!(sidecar.exists());
        let data = random_bytes(3, 2 * BLOCK_SIZE);
        let writes = [
            BatchWrite {
                lba: 1000,
                buf: &data[..BLOCK_SIZE],
            },
            BatchWrite {
                lba: 1002,
                buf: &data[BLOCK_SIZE..],
            },
        ];
        assert!(device.write_batch(&writes).iter().all(Result::is_ok));
        assert!(!sidecar.exists(), "a batch makes the persisted table stale");
        device.drain().expect("drain");
        let expected = sizes(&device);
        assert_eq!(expected[1000], RAW_BLOCK);
        device.close().expect("close");
        let device = file_emulator(dir.path());
        assert_eq!(device.accounting_origin(), &AccountingOrigin::Loaded);
        assert_eq!(sizes(&device), expected);
    }

    #[test]
    fn failed_requests_of_a_batch_are_not_accounted() {
        let faulty = FaultyDevice::new(MemDevice::new(BLOCKS));
        faulty.fail_lba(FaultOp::Write, 3);
        let device = CompressingDevice::new(faulty, EmulatorOptions::default()).expect("open");
        let data = random_bytes(1, 2 * BLOCK_SIZE);
        let writes = [
            BatchWrite {
                lba: 3,
                buf: &data[..BLOCK_SIZE],
            },
            BatchWrite {
                lba: 4,
                buf: &data[BLOCK_SIZE..],
            },
        ];
        let failed: Vec<bool> = device
            .write_batch(&writes)
            .iter()
            .map(Result::is_err)
            .collect();
        assert_eq!(failed, [true, false]);
        device.drain().expect("drain");
        assert_eq!(device.physical_size(3), Some(0));
        assert_eq!(device.stats().nand_bytes_written, BLOCK_BYTES);
        assert_eq!(device.stats().host_bytes_written, BLOCK_BYTES);
    }
}
