//! A device wrapper that injects I/O errors and corrupts reads, for tests of the layers above
//! (SPEC §2 "Integrity": a bad block or an I/O error must be a miss, never wrong data).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::{
    AlignedBuf, BLOCK_SIZE, BatchRead, BatchWrite, BlockDevice, DeviceCompression, DeviceStats,
    ReadFuture,
};

/// The kind of device operation a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultOp {
    /// [`BlockDevice::read`], each request of [`BlockDevice::read_batch`], and
    /// [`BlockDevice::read_async`].
    Read,
    /// [`BlockDevice::write`] and each request of [`BlockDevice::write_batch`].
    Write,
    /// [`BlockDevice::trim`].
    Trim,
    /// [`BlockDevice::flush`].
    Flush,
}

/// The error a [`FaultyDevice`] returns for an injected fault, inside an `io::Error` of
/// kind [`io::ErrorKind::Other`]. Tests tell injected faults from real ones with
/// [`InjectedFault::is_injected`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("injected {op:?} fault (first lba {lba:?})")]
pub struct InjectedFault {
    /// The operation that failed.
    pub op: FaultOp,
    /// The first LBA of the failed request; `None` for flush.
    pub lba: Option<u64>,
}

impl InjectedFault {
    /// True when `err` came from a [`FaultyDevice`] rather than the device underneath.
    pub fn is_injected(err: &io::Error) -> bool {
        err.get_ref()
            .is_some_and(|inner| inner.downcast_ref::<InjectedFault>().is_some())
    }

    fn into_io_error(self) -> io::Error {
        io::Error::other(self)
    }
}

#[derive(Debug, Default)]
struct FaultPlan {
    failing_lbas: HashSet<(FaultOp, u64)>,
    every_nth: HashMap<FaultOp, u64>,
    op_counts: HashMap<FaultOp, u64>,
    /// Per LBA: (byte offset in the block, XOR mask) applied to every read of it.
    bit_flips: BTreeMap<u64, Vec<(usize, u8)>>,
}

impl FaultPlan {
    fn should_fail(&mut self, op: FaultOp, lbas: Range<u64>) -> bool {
        let count = self.op_counts.entry(op).or_default();
        *count += 1;
        let nth_hit = self
            .every_nth
            .get(&op)
            .is_some_and(|&n| n > 0 && (*count).is_multiple_of(n));
        nth_hit
            || self
                .failing_lbas
                .iter()
                .any(|&(fault_op, lba)| fault_op == op && lbas.contains(&lba))
    }
}

/// Wraps a device and makes chosen operations fail or return corrupted data. Faults stay in
/// force until [`FaultyDevice::clear`] (or the matching `heal_*`). Failed writes and trims
/// never reach the inner device; corruption is applied to the caller's buffer only, so the
/// inner device keeps the true bytes.
///
/// ```
/// use zipcache_device::{BlockDevice, FaultOp, FaultyDevice, InjectedFault, MemDevice, BLOCK_SIZE};
/// let device = FaultyDevice::new(MemDevice::new(16));
/// device.fail_lba(FaultOp::Read, 3);
/// let mut block = vec![0u8; BLOCK_SIZE];
/// let err = device.read(3, &mut block).unwrap_err();
/// assert!(InjectedFault::is_injected(&err));
/// assert!(device.read(4, &mut block).is_ok());
/// ```
#[derive(Debug)]
pub struct FaultyDevice<D> {
    inner: D,
    plan: Mutex<FaultPlan>,
    injected: AtomicU64,
}

impl<D: BlockDevice> FaultyDevice<D> {
    /// Wraps `inner` with no faults planned.
    pub fn new(inner: D) -> Self {
        Self {
            inner,
            plan: Mutex::new(FaultPlan::default()),
            injected: AtomicU64::new(0),
        }
    }

    /// The wrapped device, e.g. to check what really reached it.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Unwraps the device.
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// Makes every `op` whose blocks include `lba` fail. For [`FaultOp::Flush`] use
    /// [`FaultyDevice::fail_every_nth`] instead: a flush has no LBA.
    pub fn fail_lba(&self, op: FaultOp, lba: u64) {
        self.plan.lock().failing_lbas.insert((op, lba));
    }

    /// Undoes [`FaultyDevice::fail_lba`] for that operation and LBA.
    pub fn heal_lba(&self, op: FaultOp, lba: u64) {
        self.plan.lock().failing_lbas.remove(&(op, lba));
    }

    /// Makes the n-th, 2n-th, … `op` from now on fail (`n == 1`: all of them; `n == 0`:
    /// none). Counting restarts at each call.
    pub fn fail_every_nth(&self, op: FaultOp, n: u64) {
        let mut plan = self.plan.lock();
        plan.every_nth.insert(op, n);
        plan.op_counts.insert(op, 0);
    }

    /// XORs `mask` into byte `offset` (0..4096) of block `lba` in every read that covers it,
    /// like a flash bit error the device failed to correct. Repeated calls accumulate.
    pub fn flip_bits_on_read(&self, lba: u64, offset: usize, mask: u8) {
        self.plan
            .lock()
            .bit_flips
            .entry(lba)
            .or_default()
            .push((offset % BLOCK_SIZE, mask));
    }

    /// Removes every planned fault and corruption.
    pub fn clear(&self) {
        *self.plan.lock() = FaultPlan::default();
    }

    /// How many operations failed by injection so far.
    pub fn injected_faults(&self) -> u64 {
        self.injected.load(Relaxed)
    }

    fn check(&self, op: FaultOp, lba: Option<u64>, count: u64) -> io::Result<()> {
        let start = lba.unwrap_or(0);
        let lbas = start..start.saturating_add(count);
        if self.plan.lock().should_fail(op, lbas) {
            self.injected.fetch_add(1, Relaxed);
            return Err(InjectedFault { op, lba }.into_io_error());
        }
        Ok(())
    }

    /// The bytes of a read of `len` bytes at `lba` to corrupt: (position in the buffer, mask).
    fn flips(&self, lba: u64, len: usize) -> Vec<(usize, u8)> {
        let plan = self.plan.lock();
        let end = lba.saturating_add((len / BLOCK_SIZE) as u64);
        plan.bit_flips
            .range(lba..end)
            .flat_map(|(&block_lba, flips)| {
                let block_start = (block_lba - lba) as usize * BLOCK_SIZE;
                flips
                    .iter()
                    .map(move |&(offset, mask)| (block_start + offset, mask))
            })
            .collect()
    }

    fn corrupt(&self, lba: u64, buf: &mut [u8]) {
        flip(&self.flips(lba, buf.len()), buf);
    }
}

fn flip(flips: &[(usize, u8)], buf: &mut [u8]) {
    for &(position, mask) in flips {
        if let Some(byte) = buf.get_mut(position) {
            *byte ^= mask;
        }
    }
}

impl<D: BlockDevice> BlockDevice for FaultyDevice<D> {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(FaultOp::Read, Some(lba), blocks(buf))?;
        self.inner.read(lba, buf)?;
        self.corrupt(lba, buf);
        Ok(())
    }

    fn write(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.check(FaultOp::Write, Some(lba), blocks(buf))?;
        self.inner.write(lba, buf)
    }

    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<()>> {
        let mut results: Vec<io::Result<()>> = reads
            .iter()
            .map(|read| self.check(FaultOp::Read, Some(read.lba), blocks(read.buf)))
            .collect();
        let (indices, mut passed): (Vec<usize>, Vec<BatchRead<'_>>) = reads
            .iter_mut()
            .enumerate()
            .filter(|(index, _)| results[*index].is_ok())
            .map(|(index, read)| {
                let lba = read.lba;
                (index, BatchRead { lba, buf: read.buf })
            })
            .unzip();
        let outcomes = self.inner.read_batch(&mut passed);
        for ((index, read), outcome) in indices.into_iter().zip(passed).zip(outcomes) {
            if outcome.is_ok() {
                self.corrupt(read.lba, read.buf);
            }
            results[index] = outcome;
        }
        results
    }

    fn write_batch(&self, writes: &[BatchWrite<'_>]) -> Vec<io::Result<()>> {
        let mut results: Vec<io::Result<()>> = writes
            .iter()
            .map(|write| self.check(FaultOp::Write, Some(write.lba), blocks(write.buf)))
            .collect();
        let (indices, passed): (Vec<usize>, Vec<BatchWrite<'_>>) = writes
            .iter()
            .enumerate()
            .filter(|(index, _)| results[*index].is_ok())
            .map(|(index, write)| (index, *write))
            .unzip();
        let outcomes = self.inner.write_batch(&passed);
        for (index, outcome) in indices.into_iter().zip(outcomes) {
            results[index] = outcome;
        }
        results
    }

    /// Faults are decided at submission: an injected error comes back as a ready future, and
    /// the bit flips planned then are applied when the read completes.
    fn read_async(&self, lba: u64, buf: AlignedBuf) -> ReadFuture {
        if let Err(err) = self.check(FaultOp::Read, Some(lba), blocks(&buf)) {
            return ReadFuture::ready(Err(err), buf);
        }
        let flips = self.flips(lba, buf.len());
        self.inner.read_async(lba, buf).inspect(move |result, buf| {
            if result.is_ok() {
                flip(&flips, buf);
            }
        })
    }

    fn trim(&self, lba: u64, count: u64) -> io::Result<()> {
        self.check(FaultOp::Trim, Some(lba), count)?;
        self.inner.trim(lba, count)
    }

    fn flush(&self) -> io::Result<()> {
        self.check(FaultOp::Flush, None, 0)?;
        self.inner.flush()
    }

    fn compression(&self) -> DeviceCompression {
        self.inner.compression()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }

    fn drain(&self) -> io::Result<()> {
        self.inner.drain()
    }

    fn physical_free(&self) -> Option<u64> {
        self.inner.physical_free()
    }

    fn data_extents(&self) -> io::Result<Option<Vec<Range<u64>>>> {
        self.inner.data_extents()
    }
}

fn blocks(buf: &[u8]) -> u64 {
    (buf.len() / BLOCK_SIZE) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;
    use crate::test_util::{complete, random_bytes};

    fn device() -> FaultyDevice<MemDevice> {
        FaultyDevice::new(MemDevice::new(64))
    }

    #[test]
    fn lba_faults_hit_requests_covering_the_lba_until_healed() {
        let device = device();
        let data = random_bytes(1, 4 * BLOCK_SIZE);
        device.fail_lba(FaultOp::Write, 6);
        let err = device.write(4, &data).expect_err("covers lba 6");
        assert!(InjectedFault::is_injected(&err));
        assert_eq!(
            device.inner().resident_blocks(),
            0,
            "failed write must not land"
        );
        device.write(0, &data).expect("lbas 0..4 are fine");

        device.fail_lba(FaultOp::Read, 2);
        let mut buf = vec![0u8; BLOCK_SIZE];
        assert!(device.read(2, &mut buf).is_err());
        device.heal_lba(FaultOp::Read, 2);
        device.read(2, &mut buf).expect("healed");
        assert_eq!(&buf[..], &data[2 * BLOCK_SIZE..3 * BLOCK_SIZE]);
        assert_eq!(device.injected_faults(), 2);
    }

    #[test]
    fn every_nth_op_fails() {
        let device = device();
        device.fail_every_nth(FaultOp::Write, 3);
        let block = random_bytes(2, BLOCK_SIZE);
        let outcomes: Vec<bool> = (0..7)
            .map(|lba| device.write(lba, &block).is_ok())
            .collect();
        assert_eq!(outcomes, [true, true, false, true, true, false, true]);
        device.fail_every_nth(FaultOp::Flush, 1);
        assert!(device.flush().is_err());
        device.clear();
        assert!(device.flush().is_ok());
        assert_eq!(device.injected_faults(), 3);
    }

    #[test]
    fn bit_flips_corrupt_reads_but_not_the_device() {
        let device = device();
        let data = random_bytes(3, 3 * BLOCK_SIZE);
        device.write(10, &data).expect("write");
        device.flip_bits_on_read(11, 100, 0x01);
        device.flip_bits_on_read(11, 4095, 0x80);

        let mut buf = vec![0u8; 3 * BLOCK_SIZE];
        device.read(10, &mut buf).expect("read");
        let diffs: Vec<usize> = (0..buf.len()).filter(|&i| buf[i] != data[i]).collect();
        assert_eq!(diffs, [BLOCK_SIZE + 100, BLOCK_SIZE + 4095]);
        assert_eq!(buf[BLOCK_SIZE + 100] ^ data[BLOCK_SIZE + 100], 0x01);

        device.inner().read(10, &mut buf).expect("inner read");
        assert_eq!(buf, data);
        device.clear();
        device.read(11, &mut buf[..BLOCK_SIZE]).expect("read");
        assert_eq!(&buf[..BLOCK_SIZE], &data[BLOCK_SIZE..2 * BLOCK_SIZE]);
    }

    #[test]
    fn trim_faults_leave_data_in_place() {
        let device = device();
        let data = random_bytes(4, BLOCK_SIZE);
        device.write(5, &data).expect("write");
        device.fail_lba(FaultOp::Trim, 5);
        assert!(device.trim(0, 64).is_err());
        assert_eq!(device.inner().resident_blocks(), 1);
    }

    #[test]
    fn real_errors_are_not_reported_as_injected() {
        let device = device();
        let err = device
            .read(64, &mut [0u8; BLOCK_SIZE])
            .expect_err("out of range");
        assert!(!InjectedFault::is_injected(&err));
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn batches_fail_only_the_faulty_requests() {
        let device = device();
        let data = random_bytes(5, 3 * BLOCK_SIZE);
        let block = |i: usize| &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
        device.fail_lba(FaultOp::Write, 3);
        let writes: Vec<BatchWrite<'_>> = [1, 3, 5]
            .iter()
            .enumerate()
            .map(|(i, &lba)| BatchWrite { lba, buf: block(i) })
            .collect();
        let injected: Vec<bool> = device
            .write_batch(&writes)
            .iter()
            .map(|r| r.as_ref().is_err_and(InjectedFault::is_injected))
            .collect();
        assert_eq!(injected, [false, true, false]);
        assert_eq!(device.inner().resident_blocks(), 2);

        device.fail_lba(FaultOp::Read, 1);
        device.flip_bits_on_read(5, 7, 0x10);
        let (mut first, mut second) = (vec![0u8; BLOCK_SIZE], vec![0u8; BLOCK_SIZE]);
        let mut reads = [
            BatchRead {
                lba: 1,
                buf: &mut first,
            },
            BatchRead {
                lba: 5,
                buf: &mut second,
            },
        ];
        let results = device.read_batch(&mut reads);
        assert!(results[0].as_ref().is_err_and(InjectedFault::is_injected));
        assert!(results[1].is_ok());
        let mut expected = block(2).to_vec();
        expected[7] ^= 0x10;
        assert_eq!(second, expected);
        assert_eq!(device.injected_faults(), 2);
        assert_eq!(device.inner().stats().reads, 1, "the failed read never ran");
    }

    #[test]
    fn every_nth_counts_each_request_of_a_batch() {
        let device = device();
        device.fail_every_nth(FaultOp::Write, 2);
        let block = random_bytes(6, BLOCK_SIZE);
        let writes: Vec<BatchWrite<'_>> =
            (0..5).map(|lba| BatchWrite { lba, buf: &block }).collect();
        let failed: Vec<bool> = device
            .write_batch(&writes)
            .iter()
            .map(Result::is_err)
            .collect();
        assert_eq!(failed, [false, true, false, true, false]);
    }

    #[test]
    fn async_reads_get_errors_ready_and_bit_flips_on_completion() {
        let device = device();
        let data = random_bytes(7, 2 * BLOCK_SIZE);
        device.write(20, &data).expect("write");
        device.fail_lba(FaultOp::Read, 21);
        device.flip_bits_on_read(20, 0, 0xFF);

        let (result, _) = complete(device.read_async(21, AlignedBuf::zeroed(1)));
        assert!(result.is_err_and(|err| InjectedFault::is_injected(&err)));
        let (result, buf) = complete(device.read_async(20, AlignedBuf::zeroed(1)));
        result.expect("read");
        assert_eq!(buf[0], data[0] ^ 0xFF);
        assert_eq!(&buf[1..], &data[1..BLOCK_SIZE]);
    }
}
