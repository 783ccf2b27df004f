//! A file or block device as a [`BlockDevice`], through `pread`/`pwrite` and io_uring.

use std::cell::RefCell;
use std::fs::OpenOptions;
use std::io::{self, Seek, SeekFrom};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::aligned::{AlignedBuf, is_aligned};
use crate::counters::IoCounters;
use crate::shared_file::SharedFile;
use crate::uring::{self, Direction, ReadFuture, Transfer};
use crate::{
    BLOCK_BYTES, BLOCK_SIZE, BatchRead, BatchWrite, BlockDevice, DeviceStats, check_io,
    check_range, invalid_input,
};

/// Blocks per bounce copy for unaligned buffers under `O_DIRECT`: large enough that a
/// super-leaf (64 KiB) goes in one system call, small enough to keep per thread forever.
const BOUNCE_BLOCKS: usize = 16;

thread_local! {
    // Per thread, so concurrent callers never contend for it and no call allocates.
    static BOUNCE: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::zeroed(BOUNCE_BLOCKS));
}

/// How [`FileDevice::open_with`] opens its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// Open with `O_DIRECT` so reads hit the device rather than the page cache (SPEC §3:
    /// a benchmark served from the page cache is not an SSD benchmark). Default `true`;
    /// turn off for filesystems that reject `O_DIRECT`.
    pub direct_io: bool,
    /// Create the file if it does not exist. Default `true`.
    pub create: bool,
    /// Run batches and asynchronous reads through io_uring. Default `true`. Off, or on a
    /// thread where io_uring cannot be set up (`ENOSYS`, `EPERM` under seccomp), batches run
    /// one request after another and `read_async` reads synchronously.
    pub io_uring: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            direct_io: true,
            create: true,
            io_uring: true,
        }
    }
}

/// A regular file (sparse, sized to the logical capacity) or a block device.
///
/// Reads and writes are positional (`pread`/`pwrite`), so any number of threads may use one
/// `FileDevice` at once. With `O_DIRECT`, buffers that are not 4096-aligned are copied
/// through a per-thread aligned bounce buffer; pass an [`AlignedBuf`] to avoid the copy.
/// Batches keep up to [`uring::BATCH_DEPTH`] requests in flight through the calling thread's
/// io_uring, and `read_async` submits to the thread's ring when one is installed (see
/// [`crate::uring`]); [`FileOptions::io_uring`] turns both off.
/// Trim punches a hole (`fallocate(PUNCH_HOLE | KEEP_SIZE)`), so trimmed blocks free their
/// space and read as zeros.
///
/// Physical figures in [`DeviceStats`] are 0 (unknown): wrap the device in a
/// [`crate::CompressingDevice`] to account them.
#[derive(Debug)]
pub struct FileDevice {
    shared: Arc<SharedFile>,
    path: PathBuf,
    block_count: u64,
    direct_io: bool,
    io_uring: bool,
    /// `lseek(SEEK_DATA)` on a block device reports it all as data, which says nothing.
    is_block_device: bool,
}

impl FileDevice {
    /// Opens (creating if needed) `path` with `O_DIRECT` as a device of `logical_size` bytes.
    pub fn open(path: impl AsRef<Path>, logical_size: u64) -> io::Result<Self> {
        Self::open_with(path, logical_size, &FileOptions::default())
    }

    /// Opens `path` as a device of `logical_size` bytes (a positive multiple of 4 KiB).
    ///
    /// A regular file shorter than that is extended sparsely; a longer one is an error rather
    /// than silently truncated (it may hold a larger cache's data). A block device must be at
    /// least `logical_size` bytes; only its first `logical_size` bytes are used.
    ///
    /// With `direct_io`, a filesystem that refuses `O_DIRECT` (tmpfs before Linux 6.6, some
    /// FUSE and network filesystems) yields an `InvalidInput` error that says so.
    pub fn open_with(
        path: impl AsRef<Path>,
        logical_size: u64,
        options: &FileOptions,
    ) -> io::Result<Self> {
        let path = path.as_ref();
        if logical_size == 0 || !logical_size.is_multiple_of(BLOCK_BYTES) {
            return Err(invalid_input(format!(
                "{}: device size {logical_size} is not a positive multiple of {BLOCK_SIZE} bytes",
                path.display()
            )));
        }
        let mut open_options = OpenOptions::new();
        open_options.read(true).write(true).create(options.create);
        if options.direct_io {
            open_options.custom_flags(libc::O_DIRECT);
        }
        let file = open_options
            .open(path)
            .map_err(|err| explain_open_error(err, path, options.direct_io))?;
        let metadata = file.metadata().map_err(|err| with_path(err, path))?;
        let is_block_device = metadata.file_type().is_block_device();
        if is_block_device {
            let device_size = (&file)
                .seek(SeekFrom::End(0))
                .map_err(|err| with_path(err, path))?;
            if device_size < logical_size {
                return Err(invalid_input(format!(
                    "{}: block device holds {device_size} bytes, fewer than the {logical_size} requested",
                    path.display()
                )));
            }
        } else if metadata.len() < logical_size {
            file.set_len(logical_size)
                .map_err(|err| with_path(err, path))?;
        } else if metadata.len() > logical_size {
            return Err(invalid_input(format!(
                "{}: file holds {} bytes, more than the {logical_size} requested; refusing to truncate it",
                path.display(),
                metadata.len()
            )));
        }
        let device = Self {
            shared: Arc::new(SharedFile {
                file,
                counters: IoCounters::default(),
            }),
            path: path.to_path_buf(),
            block_count: logical_size / BLOCK_BYTES,
            direct_io: options.direct_io,
            io_uring: options.io_uring,
            is_block_device,
        };
        if options.direct_io {
            device.probe_direct_io()?;
        }
        Ok(device)
    }

    /// The path the device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file was opened with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct_io
    }

    /// Whether batches and asynchronous reads may use io_uring ([`FileOptions::io_uring`]).
    pub fn uses_io_uring(&self) -> bool {
        self.io_uring
    }

    /// Some filesystems accept `O_DIRECT` at open and refuse it at the first I/O; finding out
    /// at open time turns a baffling EINVAL in the middle of a run into a clear error.
    fn probe_direct_io(&self) -> io::Result<()> {
        let mut block = AlignedBuf::zeroed(1);
        self.shared
            .file
            .read_exact_at(&mut block, 0)
            .map_err(|err| explain_open_error(err, &self.path, true))
    }

    fn read_blocks(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if !self.direct_io || is_aligned(buf) {
            return self.shared.file.read_exact_at(buf, offset);
        }
        BOUNCE.with_borrow_mut(|bounce| {
            let mut chunk_offset = offset;
            for chunk in buf.chunks_mut(bounce.len()) {
                let aligned = &mut bounce[..chunk.len()];
                self.shared.file.read_exact_at(aligned, chunk_offset)?;
                chunk.copy_from_slice(aligned);
                chunk_offset += chunk.len() as u64;
            }
            Ok(())
        })
    }

    fn write_blocks(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if !self.direct_io || is_aligned(buf) {
            return self.shared.file.write_all_at(buf, offset);
        }
        BOUNCE.with_borrow_mut(|bounce| {
            let mut chunk_offset = offset;
            for chunk in buf.chunks(bounce.len()) {
                let aligned = &mut bounce[..chunk.len()];
                aligned.copy_from_slice(chunk);
                self.shared.file.write_all_at(aligned, chunk_offset)?;
                chunk_offset += chunk.len() as u64;
            }
            Ok(())
        })
    }

    /// Under `O_DIRECT` the kernel moves data only to and from 4096-aligned memory.
    fn needs_bounce(&self, buf: &[u8]) -> bool {
        self.direct_io && !is_aligned(buf)
    }

    fn transfer(&self, direction: Direction, buf: *mut u8, len: usize, lba: u64) -> Transfer {
        let fd = self.shared.file.as_raw_fd();
        Transfer::new(direction, fd, buf, len, lba * BLOCK_BYTES)
    }

    /// A batch of reads or of writes: each request checked, then those with blocks to move
    /// kept in flight together on the calling thread's ring; one after another without
    /// it (io_uring off, or not available on this thread).
    fn run_batch<B: Batch + ?Sized>(&self, batch: &mut B) -> Vec<io::Result<()>> {
        if !self.io_uring || batch.count() < 2 {
            return (0..batch.count()).map(|i| batch.run_one(self, i)).collect();
        }
        let mut results = Vec::with_capacity(batch.count());
        let mut transfers = Vec::with_capacity(batch.count());
        // (index in the batch, the aligned bounce copy the kernel moves the data through)
        let mut planned = Vec::with_capacity(batch.count());
        for index in 0..batch.count() {
            let (lba, len) = batch.span(index);
            let checked = check_io(self.block_count, lba, len);
            let runs = matches!(checked, Ok(blocks) if blocks > 0);
            results.push(checked.map(drop));
            if !runs {
                continue;
            }
            let (target, bounce) = batch.target(self, index);
            transfers.push(self.transfer(B::DIRECTION, target, len, lba));
            planned.push((index, bounce));
        }
        let in_flight = self.shared.counters.in_flight(transfers.len());
        // SAFETY: each transfer points into its request's buffer, borrowed (mutably, for
        // reads) through `batch` for this whole call, or into its bounce copy, whose heap
        // bytes `planned` keeps until after the call; `self` keeps the descriptor open.
        let outcomes = unsafe { uring::run_batch(&mut transfers) };
        drop(in_flight);
        let Some(outcomes) = outcomes else {
            for (index, _) in planned {
                results[index] = batch.run_one(self, index);
            }
            return results;
        };
        for ((index, bounce), outcome) in planned.into_iter().zip(outcomes) {
            if outcome.is_ok() {
                batch.completed(self, index, bounce);
            }
            results[index] = outcome;
        }
        results
    }

    /// Filesystems without hole punching still owe the caller zeros on read.
    fn write_zeros(&self, lba: u64, count: u64) -> io::Result<()> {
        let zeros = AlignedBuf::zeroed(BOUNCE_BLOCKS);
        let mut done = 0;
        while done < count {
            let blocks = (count - done).min(BOUNCE_BLOCKS as u64);
            let bytes = blocks as usize * BLOCK_SIZE;
            self.shared
                .file
                .write_all_at(&zeros[..bytes], (lba + done) * BLOCK_BYTES)?;
            done += blocks;
        }
        Ok(())
    }

    /// `lseek(SEEK_DATA | SEEK_HOLE)` from `offset`; `Ok(None)` when no data/hole follows.
    fn seek_extent(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        let offset = to_off_t(offset)?;
        // SAFETY: `lseek` takes no pointers; the descriptor is owned by `self.shared.file` and stays
        // open for this call. Moving the file offset is harmless: every read and write here
        // is positional (pread/pwrite) and never uses it.
        let position = unsafe { libc::lseek(self.shared.file.as_raw_fd(), offset, whence) };
        if position >= 0 {
            return Ok(Some(position as u64));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(err)
        }
    }
}

impl BlockDevice for FileDevice {
    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        if check_io(self.block_count, lba, buf.len())? == 0 {
            return Ok(());
        }
        let in_flight = self.shared.counters.in_flight(1);
        self.read_blocks(lba * BLOCK_BYTES, buf)?;
        drop(in_flight);
        self.shared.counters.record_read(buf.len());
        Ok(())
    }

    fn write(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        if check_io(self.block_count, lba, buf.len())? == 0 {
            return Ok(());
        }
        let in_flight = self.shared.counters.in_flight(1);
        self.write_blocks(lba * BLOCK_BYTES, buf)?;
        drop(in_flight);
        self.shared.counters.record_write(buf.len());
        Ok(())
    }

    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<()>> {
        self.run_batch(reads)
    }

    fn write_batch(&self, writes: &[BatchWrite<'_>]) -> Vec<io::Result<()>> {
        self.run_batch(&mut Writes(writes))
    }

    fn read_async(&self, lba: u64, mut buf: AlignedBuf) -> ReadFuture {
        match check_io(self.block_count, lba, buf.len()) {
            Err(err) => return ReadFuture::ready(Err(err), buf),
            Ok(0) => return ReadFuture::ready(Ok(()), buf),
            Ok(_) => {}
        }
        if self.io_uring {
            match uring::submit_read(&self.shared, lba * BLOCK_BYTES, buf) {
                Ok(in_flight) => return in_flight,
                Err(returned) => buf = returned,
            }
        }
        let result = self.read(lba, &mut buf);
        ReadFuture::ready(result, buf)
    }

    fn trim(&self, lba: u64, count: u64) -> io::Result<()> {
        check_range(self.block_count, lba, count)?;
        if count == 0 {
            return Ok(());
        }
        let offset = to_off_t(lba * BLOCK_BYTES)?;
        let len = to_off_t(count * BLOCK_BYTES)?;
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: `fallocate` takes no pointers; the descriptor is owned by `self.shared.file` and
        // stays open for this call, and the range was checked to lie inside the device.
        let result = unsafe { libc::fallocate(self.shared.file.as_raw_fd(), mode, offset, len) };
        if result != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(err);
            }
            self.write_zeros(lba, count)?;
        }
        self.shared.counters.record_trim();
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.shared.file.sync_data()
    }

    fn stats(&self) -> DeviceStats {
        self.shared
            .counters
            .snapshot(self.block_count * BLOCK_BYTES)
    }

    fn data_extents(&self) -> io::Result<Option<Vec<Range<u64>>>> {
        if self.is_block_device {
            return Ok(None);
        }
        let end = self.block_count * BLOCK_BYTES;
        let mut extents: Vec<Range<u64>> = Vec::new();
        let mut offset = 0;
        while offset < end {
            let data = match self.seek_extent(offset, libc::SEEK_DATA) {
                Ok(Some(data)) if data < end => data,
                Ok(_) => break,
                // Filesystems without SEEK_DATA support cannot say where data is.
                Err(err) if err.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
                Err(err) => return Err(with_path(err, &self.path)),
            };
            let hole = self
                .seek_extent(data, libc::SEEK_HOLE)
                .map_err(|err| with_path(err, &self.path))?
                .unwrap_or(end)
                .min(end);
            let extent = data / BLOCK_BYTES..hole.div_ceil(BLOCK_BYTES);
            match extents.last_mut() {
                Some(last) if last.end >= extent.start => last.end = extent.end,
                _ => extents.push(extent),
            }
            offset = hole.max(data + 1);
        }
        Ok(Some(extents))
    }
}

impl AsRawFd for FileDevice {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.file.as_raw_fd()
    }
}

impl AsFd for FileDevice {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.file.as_fd()
    }
}

fn to_off_t(offset: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset)
        .map_err(|_| invalid_input(format!("offset {offset} does not fit in off_t")))
}

fn with_path(err: io::Error, path: &Path) -> io::Error {
    io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}

fn explain_open_error(err: io::Error, path: &Path, direct_io: bool) -> io::Error {
    if direct_io && err.raw_os_error() == Some(libc::EINVAL) {
        return invalid_input(format!(
            "{}: the filesystem rejects O_DIRECT (EINVAL); open it with direct I/O off \
             (FileOptions {{ direct_io: false, .. }}), e.g. on tmpfs",
            path.display()
        ));
    }
    with_path(err, path)
}

/// What [`FileDevice::run_batch`] needs of a batch of reads or of writes.
trait Batch {
    const DIRECTION: Direction;
    fn count(&self) -> usize;
    /// Request `index`'s first block and length in bytes.
    fn span(&self, index: usize) -> (u64, usize);
    /// The memory the kernel moves request `index`'s data to or from: its own buffer, or
    /// an aligned bounce copy where `O_DIRECT` needs one (kept until the batch is done).
    fn target(&mut self, device: &FileDevice, index: usize) -> (*mut u8, Option<AlignedBuf>);
    /// Request `index` alone, without the ring.
    fn run_one(&mut self, device: &FileDevice, index: usize) -> io::Result<()>;
    /// Request `index` went through the ring: its data is where the caller wants it.
    fn completed(&mut self, device: &FileDevice, index: usize, bounce: Option<AlignedBuf>);
}

impl Batch for [BatchRead<'_>] {
    const DIRECTION: Direction = Direction::Read;

    fn count(&self) -> usize {
        self.len()
    }

    fn span(&self, index: usize) -> (u64, usize) {
        (self[index].lba, self[index].buf.len())
    }

    fn target(&mut self, device: &FileDevice, index: usize) -> (*mut u8, Option<AlignedBuf>) {
        let buf = &mut *self[index].buf;
        match device.needs_bounce(buf) {
            true => {
                let mut bounce = AlignedBuf::zeroed(buf.len() / BLOCK_SIZE);
                (bounce.as_mut_ptr(), Some(bounce))
            }
            false => (buf.as_mut_ptr(), None),
        }
    }

    fn run_one(&mut self, device: &FileDevice, index: usize) -> io::Result<()> {
        let read = &mut self[index];
        device.read(read.lba, read.buf)
    }

    fn completed(&mut self, device: &FileDevice, index: usize, bounce: Option<AlignedBuf>) {
        let buf = &mut *self[index].buf;
        if let Some(bounce) = bounce {
            buf.copy_from_slice(&bounce);
        }
        device.shared.counters.record_read(buf.len());
    }
}

/// A batch of writes, borrowed as [`BlockDevice::write_batch`] lends it.
struct Writes<'a, 'b>(&'a [BatchWrite<'b>]);

impl Batch for Writes<'_, '_> {
    const DIRECTION: Direction = Direction::Write;

    fn count(&self) -> usize {
        self.0.len()
    }

    fn span(&self, index: usize) -> (u64, usize) {
        (self.0[index].lba, self.0[index].buf.len())
    }

    fn target(&mut self, device: &FileDevice, index: usize) -> (*mut u8, Option<AlignedBuf>) {
        let buf = self.0[index].buf;
        // The kernel only reads a write's memory: the pointer is never written through.
        match device.needs_bounce(buf) {
            true => {
                let bounce = AlignedBuf::copy_from(buf);
                (bounce.as_ptr().cast_mut(), Some(bounce))
            }
            false => (buf.as_ptr().cast_mut(), None),
        }
    }

    fn run_one(&mut self, device: &FileDevice, index: usize) -> io::Result<()> {
        device.write(self.0[index].lba, self.0[index].buf)
    }

    fn completed(&mut self, device: &FileDevice, index: usize, _bounce: Option<AlignedBuf>) {
        device.shared.counters.record_write(self.0[index].buf.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::random_bytes;

    fn temp_device(blocks: u64) -> (tempfile::TempDir, FileDevice) {
        let dir = tempfile::tempdir().expect("temp dir");
        let device = FileDevice::open(dir.path().join("ssd"), blocks * BLOCK_BYTES).expect("open");
        (dir, device)
    }

    fn extents(ranges: &[(u64, u64)]) -> Option<Vec<Range<u64>>> {
        Some(ranges.iter().map(|&(start, end)| start..end).collect())
    }

    fn open_flags(device: &FileDevice) -> libc::c_int {
        let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", device.as_raw_fd()))
            .expect("fdinfo");
        let flags = fdinfo
            .lines()
            .find_map(|line| line.strip_prefix("flags:"))
            .expect("flags line");
        libc::c_int::from_str_radix(flags.trim(), 8).expect("octal flags")
    }

    #[test]
    fn opens_with_o_direct_by_default() {
        let (_dir, device) = temp_device(16);
        assert!(device.is_direct());
        assert_ne!(open_flags(&device) & libc::O_DIRECT, 0);
    }

    #[test]
    fn direct_io_can_be_turned_off() {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = FileOptions {
            direct_io: false,
            ..FileOptions::default()
        };
        let device =
            FileDevice::open_with(dir.path().join("ssd"), 4 * BLOCK_BYTES, &options).expect("open");
        assert!(!device.is_direct());
        assert_eq!(open_flags(&device) & libc::O_DIRECT, 0);
    }

    #[test]
    fn creates_a_sparse_file_of_the_logical_size() {
        let (dir, device) = temp_device(1024);
        let metadata = std::fs::metadata(dir.path().join("ssd")).expect("metadata");
        assert_eq!(metadata.len(), 1024 * BLOCK_BYTES);
        assert_eq!(device.block_count(), 1024);
        assert_eq!(device.data_extents().expect("extents"), extents(&[]));
        assert_eq!(device.stats().logical_capacity, 1024 * BLOCK_BYTES);
    }

    #[test]
    fn read_after_write_with_aligned_buffers() {
        let (_dir, device) = temp_device(64);
        let data = AlignedBuf::copy_from(&random_bytes(1, 3 * BLOCK_SIZE));
        device.write(10, &data).expect("write");
        let mut back = AlignedBuf::zeroed(3);
        device.read(10, &mut back).expect("read");
        assert_eq!(&back[..], &data[..]);
        let stats = device.stats();
        assert_eq!((stats.reads, stats.writes), (1, 1));
        assert_eq!(stats.host_bytes_written, 3 * BLOCK_BYTES);
        assert_eq!(stats.host_bytes_read, 3 * BLOCK_BYTES);
    }

    #[test]
    fn unaligned_buffers_work_under_o_direct() {
        let (_dir, device) = temp_device(64);
        // 40 blocks spans several bounce chunks; offset 1 guarantees misalignment.
        let blocks = 40;
        let mut backing = vec![0u8; blocks * BLOCK_SIZE + 1];
        let data = random_bytes(2, blocks * BLOCK_SIZE);
        backing[1..].copy_from_slice(&data);
        let unaligned = &backing[1..];
        assert!(!is_aligned(unaligned));
        device.write(5, unaligned).expect("unaligned write");

        let mut back = vec![0u8; blocks * BLOCK_SIZE + 1];
        device.read(5, &mut back[1..]).expect("unaligned read");
        assert_eq!(&back[1..], &data[..]);
        let mut aligned = AlignedBuf::zeroed(blocks);
        device.read(5, &mut aligned).expect("aligned read");
        assert_eq!(&aligned[..], &data[..]);
    }

    #[test]
    fn trim_reads_zeros_and_punches_a_hole() {
        let (_dir, device) = temp_device(64);
        let data = AlignedBuf::copy_from(&random_bytes(3, 8 * BLOCK_SIZE));
        device.write(8, &data).expect("write");
        assert_eq!(device.data_extents().expect("extents"), extents(&[(8, 16)]));

        device.trim(10, 3).expect("trim");
        let mut back = AlignedBuf::zeroed(8);
        device.read(8, &mut back).expect("read");
        assert_eq!(&back[..2 * BLOCK_SIZE], &data[..2 * BLOCK_SIZE]);
        assert!(back[2 * BLOCK_SIZE..5 * BLOCK_SIZE].iter().all(|&b| b == 0));
        assert_eq!(&back[5 * BLOCK_SIZE..], &data[5 * BLOCK_SIZE..]);
        assert_eq!(
            device.data_extents().expect("extents"),
            extents(&[(8, 10), (13, 16)])
        );
        assert_eq!(device.stats().trims, 1);
    }

    #[test]
    fn out_of_range_and_partial_blocks_are_invalid_input() {
        let (_dir, device) = temp_device(8);
        let mut block = AlignedBuf::zeroed(2);
        let kinds = [
            device.read(7, &mut block).err(),
            device.write(8, &block[..BLOCK_SIZE]).err(),
            device.write(0, &block[..100]).err(),
            device.read(u64::MAX, &mut block[..BLOCK_SIZE]).err(),
            device.trim(4, 5).err(),
            device.trim(u64::MAX, 2).err(),
        ]
        .map(|err| err.map(|e| e.kind()));
        assert_eq!(kinds, [Some(io::ErrorKind::InvalidInput); 6]);
        let stats = device.stats();
        assert_eq!((stats.reads, stats.writes, stats.trims), (0, 0, 0));
    }

    #[test]
    fn bad_sizes_are_rejected_at_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ssd");
        for size in [0, 100, BLOCK_BYTES + 1] {
            let err = FileDevice::open(&path, size).err().map(|e| e.kind());
            assert_eq!(err, Some(io::ErrorKind::InvalidInput), "size {size}");
        }
        FileDevice::open(&path, 8 * BLOCK_BYTES).expect("create");
        let err = FileDevice::open(&path, 4 * BLOCK_BYTES)
            .err()
            .map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::InvalidInput), "shrinking");
        let grown = FileDevice::open(&path, 16 * BLOCK_BYTES).expect("grow");
        assert_eq!(grown.block_count(), 16);
    }

    #[test]
    fn missing_file_without_create_is_not_found() {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = FileOptions {
            create: false,
            ..FileOptions::default()
        };
        let err = FileDevice::open_with(dir.path().join("absent"), BLOCK_BYTES, &options).err();
        assert_eq!(err.map(|e| e.kind()), Some(io::ErrorKind::NotFound));
    }

    #[test]
    fn o_direct_einval_is_explained() {
        let err = explain_open_error(
            io::Error::from_raw_os_error(libc::EINVAL),
            Path::new("/dev/shm/x"),
            true,
        );
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("O_DIRECT"), "{err}");
    }

    #[test]
    fn threads_share_one_device() {
        let (_dir, device) = temp_device(256);
        std::thread::scope(|scope| {
            for writer in 0..4u64 {
                let device = &device;
                scope.spawn(move || {
                    for i in 0..32u64 {
                        let lba = i * 4 + writer;
                        // Vec buffers: unaligned or not, each thread bounces through its own.
                        device
                            .write(lba, &random_bytes(lba, BLOCK_SIZE))
                            .expect("write");
                    }
                });
            }
        });
        let mut back = vec![0u8; BLOCK_SIZE];
        for lba in 0..128 {
            device.read(lba, &mut back).expect("read");
            assert_eq!(back, random_bytes(lba, BLOCK_SIZE), "lba {lba}");
        }
        assert_eq!(device.stats().writes, 128);
    }

    #[test]
    fn data_survives_reopen() {
        let (dir, device) = temp_device(32);
        let data = AlignedBuf::copy_from(&random_bytes(4, BLOCK_SIZE));
        device.write(31, &data).expect("write");
        device.flush().expect("flush");
        drop(device);
        let device = FileDevice::open(dir.path().join("ssd"), 32 * BLOCK_BYTES).expect("reopen");
        let mut back = AlignedBuf::zeroed(1);
        device.read(31, &mut back).expect("read");
        assert_eq!(&back[..], &data[..]);
        assert_eq!(
            device.data_extents().expect("extents"),
            extents(&[(31, 32)])
        );
    }

    fn device_with(blocks: u64, io_uring: bool) -> (tempfile::TempDir, FileDevice) {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = FileOptions {
            io_uring,
            ..FileOptions::default()
        };
        let path = dir.path().join("ssd");
        let device = FileDevice::open_with(path, blocks * BLOCK_BYTES, &options).expect("open");
        (dir, device)
    }

    fn error_kinds(results: &[io::Result<()>]) -> Vec<Option<io::ErrorKind>> {
        results
            .iter()
            .map(|r| r.as_ref().err().map(|e| e.kind()))
            .collect()
    }

    /// Buffers for `data` at byte 1 of an aligned buffer when `misaligned`, else at byte 0.
    fn placed(data: &[u8], misaligned: bool) -> (AlignedBuf, std::ops::Range<usize>) {
        let mut buf = AlignedBuf::zeroed(data.len() / BLOCK_SIZE + 1);
        let range = usize::from(misaligned)..usize::from(misaligned) + data.len();
        buf[range.clone()].copy_from_slice(data);
        (buf, range)
    }

    /// Single blocks and 3-block requests, aligned and not, more of them than a batch keeps
    /// in flight, with invalid requests among them.
    fn batch_round_trip(io_uring: bool) {
        let (_dir, device) = device_with(600, io_uring);
        let requests = 2 * uring::BATCH_DEPTH as usize + 5;
        let data: Vec<Vec<u8>> = (0..requests)
            .map(|i| random_bytes(i as u64 + 100, (1 + i % 3 / 2 * 2) * BLOCK_SIZE))
            .collect();
        let lba = |i: usize| i as u64 * 4;
        let sources: Vec<_> = (0..)
            .zip(&data)
            .map(|(i, d)| placed(d, i % 3 == 1))
            .collect();
        let mut writes: Vec<BatchWrite<'_>> = (0..)
            .zip(&sources)
            .map(|(i, (buf, range))| BatchWrite {
                lba: lba(i),
                buf: &buf[range.clone()],
            })
            .collect();
        writes.insert(
            7,
            BatchWrite {
                lba: 599,
                buf: &data[2],
            },
        );
        writes.push(BatchWrite {
            lba: 0,
            buf: &data[0][..100],
        });
        let through_ring_before = uring::batch_ring_requests();
        let results = device.write_batch(&writes);
        let mut expected = vec![None; writes.len()];
        expected[7] = Some(io::ErrorKind::InvalidInput);
        expected[writes.len() - 1] = Some(io::ErrorKind::InvalidInput);
        assert_eq!(error_kinds(&results), expected);

        let mut targets: Vec<_> = (0..)
            .zip(&data)
            .map(|(i, d)| placed(&vec![0; d.len()], i % 2 == 0))
            .collect();
        let mut outside = [0u8; BLOCK_SIZE];
        let mut reads: Vec<BatchRead<'_>> = (0..)
            .zip(targets.iter_mut())
            .map(|(i, (buf, range))| BatchRead {
                lba: lba(i),
                buf: &mut buf[range.clone()],
            })
            .collect();
        reads.insert(
            3,
            BatchRead {
                lba: 600,
                buf: &mut outside,
            },
        );
        let results = device.read_batch(&mut reads);
        let mut expected = vec![None; reads.len()];
        expected[3] = Some(io::ErrorKind::InvalidInput);
        assert_eq!(error_kinds(&results), expected);
        drop(reads);
        for (i, ((buf, range), d)) in targets.iter().zip(&data).enumerate() {
            assert!(buf[range.clone()] == d[..], "request {i}");
        }

        let stats = device.stats();
        let requests = requests as u64;
        assert_eq!((stats.writes, stats.reads), (requests, requests));
        let bytes: u64 = data.iter().map(|d| d.len() as u64).sum();
        assert_eq!(stats.host_bytes_written, bytes);
        assert_eq!(stats.host_bytes_read, bytes);
        let through_ring = uring::batch_ring_requests() - through_ring_before;
        let expected = if io_uring { 2 * requests as usize } else { 0 };
        assert_eq!(through_ring, expected);
    }

    #[test]
    fn batches_through_io_uring_round_trip() {
        batch_round_trip(true);
    }

    #[test]
    fn batches_without_io_uring_round_trip() {
        batch_round_trip(false);
    }

    #[test]
    fn requests_longer_than_one_submission_continue_where_they_stopped() {
        let (_dir, device) = device_with(1024, true);
        // 2.5 MiB: three submissions of at most 1 MiB each.
        let long = random_bytes(5, 640 * BLOCK_SIZE);
        let (source, range) = placed(&long, true);
        let short = AlignedBuf::copy_from(&random_bytes(6, BLOCK_SIZE));
        let writes = [
            BatchWrite {
                lba: 10,
                buf: &source[range.clone()],
            },
            BatchWrite {
                lba: 700,
                buf: &short,
            },
        ];
        assert!(device.write_batch(&writes).iter().all(Result::is_ok));
        let mut long_back = AlignedBuf::zeroed(640);
        let mut short_back = AlignedBuf::zeroed(1);
        let mut reads = [
            BatchRead {
                lba: 10,
                buf: &mut long_back,
            },
            BatchRead {
                lba: 700,
                buf: &mut short_back,
            },
        ];
        assert!(device.read_batch(&mut reads).iter().all(Result::is_ok));
        assert!(long_back[..] == long[..]);
        assert_eq!(&short_back[..], &short[..]);
    }

    #[test]
    fn reads_past_a_truncated_end_of_file_fail_alone() {
        for io_uring in [true, false] {
            let (dir, device) = device_with(16, io_uring);
            let data = AlignedBuf::copy_from(&random_bytes(7, 16 * BLOCK_SIZE));
            device.write(0, &data).expect("write");
            // Something shrinks the file under the device: 8.5 blocks remain, so block 8
            // reads short (half a block, then nothing) and block 12 reads nothing.
            let file = OpenOptions::new()
                .write(true)
                .open(dir.path().join("ssd"))
                .expect("reopen");
            file.set_len(8 * BLOCK_BYTES + 2048).expect("truncate");
            let [mut inside, mut straddling, mut beyond] = [1, 1, 2].map(AlignedBuf::zeroed);
            let mut reads = [
                BatchRead {
                    lba: 2,
                    buf: &mut inside,
                },
                BatchRead {
                    lba: 8,
                    buf: &mut straddling,
                },
                BatchRead {
                    lba: 12,
                    buf: &mut beyond,
                },
            ];
            let results = device.read_batch(&mut reads);
            let eof = Some(io::ErrorKind::UnexpectedEof);
            assert_eq!(
                error_kinds(&results),
                [None, eof, eof],
                "io_uring {io_uring}"
            );
            assert_eq!(&inside[..], &data[2 * BLOCK_SIZE..3 * BLOCK_SIZE]);
            assert_eq!(device.stats().reads, 1);
        }
    }
}
