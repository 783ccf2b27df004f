//! A memory device whose asynchronous reads wait until a test completes them: for tests of
//! what the layers above do while reads are in flight (writers moving blocks, requests
//! answered in order, GETs dropped before their read completes).

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::{
    AlignedBuf, BlockDevice, DeviceCompression, DeviceStats, MemDevice, ReadCompletion, ReadFuture,
};

/// Holds every [`BlockDevice::read_async`] while holding is on; everything else goes
/// straight to the [`MemDevice`] underneath. A held read's block is copied when it is
/// submitted (what a read in flight may return), or, `late`, when it is completed (a read
/// the device served after later writes).
pub struct HeldDevice {
    inner: MemDevice,
    late: bool,
    holding: AtomicBool,
    held: Mutex<Vec<(u64, AlignedBuf, ReadCompletion)>>,
}

impl HeldDevice {
    /// A device of `blocks` blocks that holds reads from the start.
    pub fn new(blocks: u64, late: bool) -> HeldDevice {
        HeldDevice {
            inner: MemDevice::new(blocks),
            late,
            holding: AtomicBool::new(true),
            held: Mutex::new(Vec::new()),
        }
    }

    /// Whether reads submitted from now on are held (those held already stay held).
    pub fn hold(&self, holding: bool) {
        self.holding.store(holding, Ordering::SeqCst);
    }

    /// Reads held now.
    pub fn in_flight(&self) -> usize {
        self.held.lock().len()
    }

    /// Completes the read held longest.
    pub fn complete_oldest(&self) {
        let oldest = self.held.lock().remove(0);
        self.complete(oldest);
    }

    /// Completes every held read, the newest first, and holds no more.
    pub fn release_all(&self) {
        self.hold(false);
        let held = std::mem::take(&mut *self.held.lock());
        for read in held.into_iter().rev() {
            self.complete(read);
        }
    }

    fn complete(&self, (lba, mut buf, completion): (u64, AlignedBuf, ReadCompletion)) {
        let result = match self.late {
            true => self.inner.read(lba, &mut buf),
            false => Ok(()),
        };
        completion.complete(result, buf);
    }
}

impl BlockDevice for HeldDevice {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write(lba, buf)
    }
    fn trim(&self, lba: u64, count: u64) -> io::Result<()> {
        self.inner.trim(lba, count)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn compression(&self) -> DeviceCompression {
        self.inner.compression()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
    fn data_extents(&self) -> io::Result<Option<Vec<Range<u64>>>> {
        self.inner.data_extents()
    }
    fn read_async(&self, lba: u64, mut buf: AlignedBuf) -> ReadFuture {
        if !self.holding.load(Ordering::SeqCst) {
            let result = self.inner.read(lba, &mut buf);
            return ReadFuture::ready(result, buf);
        }
        if !self.late && self.inner.read(lba, &mut buf).is_err() {
            return ReadFuture::ready(Err(io::Error::other("read failed")), buf);
        }
        let (future, completion) = ReadFuture::pending();
        self.held.lock().push((lba, buf, completion));
        future
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(byte: u8) -> Vec<u8> {
        vec![byte; crate::BLOCK_SIZE]
    }

    /// Held reads wait; the oldest completes first, and a `late` read sees the write made
    /// while it was held.
    #[test]
    fn held_reads_complete_when_the_test_says() {
        let device = HeldDevice::new(4, true);
        device.write(0, &block(1)).unwrap();
        let mut first = device.read_async(0, AlignedBuf::zeroed(1));
        let mut second = device.read_async(0, AlignedBuf::zeroed(1));
        assert_eq!(device.in_flight(), 2);
        device.write(0, &block(2)).unwrap();
        device.complete_oldest();
        let (done, buf) = completed(&mut first);
        assert!(done.is_ok());
        assert_eq!(&buf[..], &block(2)[..], "late: copied when completed");
        assert_eq!(device.in_flight(), 1);
        device.release_all();
        assert!(completed(&mut second).0.is_ok());
        device.hold(false);
        let ready = device.read_async(0, AlignedBuf::zeroed(1));
        assert!(!ready.is_in_flight());
    }

    fn completed(read: &mut ReadFuture) -> (io::Result<()>, AlignedBuf) {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        match std::pin::Pin::new(read).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(outcome) => outcome,
            Poll::Pending => panic!("a completed read is ready"),
        }
    }
}
