//! The thread ring of [`install_thread_ring`]: asynchronous reads submitted by a thread and
//! reaped by the same thread, its slot table owning each read's buffer and file meanwhile.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::task::Waker;

use io_uring::IoUring;

use super::read_future::{ReadCompletion, ReadFuture};
use super::transfer::{Direction, Transfer, submit_and_wait};
use crate::AlignedBuf;
use crate::invalid_input;
use crate::shared_file::SharedFile;

/// The deepest thread ring [`install_thread_ring`] accepts.
pub const MAX_THREAD_RING_DEPTH: u32 = 4096;

thread_local! {
    // Taken out while in use and put back after, so no borrow can be held across a waker
    // that calls back into this module.
    static THREAD_RING: Cell<Option<Box<ThreadRing>>> = const { Cell::new(None) };
}

thread_local! {
    // Open `SubmitBatch` guards on this thread: while any is open, reads are queued and
    // handed to the kernel when the last one closes.
    static OPEN_SUBMIT_BATCHES: Cell<u32> = const { Cell::new(0) };
}

/// Holds back the calling thread's read submissions until the returned guard drops, then
/// hands every read queued meanwhile to the kernel in one `io_uring_enter`: one system call,
/// one block-layer plug and one doorbell for a request batch's reads instead of one each
/// (a doorbell is a VM exit on our virtual disks). Guards nest; the outermost submits.
///
/// Nothing may wait for one of those reads (poll its future to completion, or call
/// [`wait_thread_ring`]) while the guard is alive: it has not reached the kernel yet.
#[must_use = "reads are submitted when the guard drops"]
pub fn batch_thread_ring_submissions() -> SubmitBatch {
    let _ = OPEN_SUBMIT_BATCHES.try_with(|depth| depth.set(depth.get() + 1));
    SubmitBatch {
        _not_send: std::marker::PhantomData,
    }
}

/// See [`batch_thread_ring_submissions`]. Bound to the thread that made it.
pub struct SubmitBatch {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for SubmitBatch {
    fn drop(&mut self) {
        let outermost = OPEN_SUBMIT_BATCHES
            .try_with(|depth| {
                depth.set(depth.get() - 1);
                depth.get() == 0
            })
            .unwrap_or(true);
        if !outermost {
            return;
        }
        if let Some(mut ring) = take_thread_ring() {
            if !ring.ring.submission().is_empty() {
                ring.submit();
            }
            put_thread_ring(ring);
        }
    }
}

/// Reads queued on this thread's ring and not yet handed to the kernel.
#[cfg(test)]
fn thread_ring_unsubmitted() -> usize {
    let Some(mut ring) = take_thread_ring() else {
        return 0;
    };
    let queued = ring.ring.submission().len();
    put_thread_ring(ring);
    queued
}

fn submissions_held_back() -> bool {
    OPEN_SUBMIT_BATCHES
        .try_with(|depth| depth.get() > 0)
        .unwrap_or(false)
}

fn take_thread_ring() -> Option<Box<ThreadRing>> {
    THREAD_RING.try_with(Cell::take).ok().flatten()
}

fn put_thread_ring(ring: Box<ThreadRing>) {
    // Fails only while the thread's locals are being destroyed: the ring is then dropped
    // here, which waits for its reads in flight.
    let _ = THREAD_RING.try_with(|cell| cell.set(Some(ring)));
}

/// Installs an io_uring for asynchronous reads on the calling thread; returns an eventfd
/// that becomes readable when completions wait to be reaped. Idempotent per thread: a second
/// call returns the same eventfd and ignores `depth`.
///
/// `depth` (1..=[`MAX_THREAD_RING_DEPTH`], rounded up to a power of two by the kernel) bounds
/// the reads in flight; a read submitted while every slot is taken runs synchronously.
/// Fails when io_uring is unavailable (`ENOSYS`, `EPERM` under seccomp): reads then stay
/// synchronous.
///
/// The eventfd belongs to the ring and stays open until the thread exits. To wait for it with
/// tokio, register a duplicate (`BorrowedFd::borrow_raw(fd).try_clone_to_owned()`) with
/// `AsyncFd::register_with_interest(dup, Interest::READABLE)`, and loop in a task on the same
/// thread: `readable().await`, `clear_ready()`, then [`reap_thread_ring`] — readiness cleared
/// before reaping, so a completion posted meanwhile makes the eventfd readable again.
pub fn install_thread_ring(depth: u32) -> io::Result<RawFd> {
    if !(1..=MAX_THREAD_RING_DEPTH).contains(&depth) {
        return Err(invalid_input(format!(
            "thread ring depth {depth} is outside 1..={MAX_THREAD_RING_DEPTH}"
        )));
    }
    let ring = match take_thread_ring() {
        Some(ring) => ring,
        None => Box::new(ThreadRing::new(depth)?),
    };
    let eventfd = ring.eventfd.as_raw_fd();
    put_thread_ring(ring);
    Ok(eventfd)
}

/// Removes the calling thread's ring, if it has one: its reads in flight complete first
/// (their futures wake with their outcomes), and later reads on this thread run
/// synchronously. For a thread that cannot watch the ring's eventfd after all — a ring
/// nobody reaps would leave its reads in flight forever.
pub fn uninstall_thread_ring() {
    // Dropping the ring waits for its reads in flight.
    drop(take_thread_ring());
}

/// [`install_thread_ring`], returning a duplicate of the eventfd that the caller owns (to
/// hand to an event loop, e.g. tokio's `AsyncFd`).
pub fn install_thread_ring_owned(depth: u32) -> io::Result<OwnedFd> {
    install_thread_ring(depth)?;
    let ring = take_thread_ring().ok_or_else(|| io::Error::other("thread ring vanished"))?;
    let eventfd = ring.eventfd.try_clone();
    put_thread_ring(ring);
    eventfd
}

/// Blocks until `eventfd` (from [`install_thread_ring`]) is readable — a completion is due
/// — or `timeout` passes; true if it is readable. For a thread that has nothing to do but
/// wait for its reads (a bench client, a test); a server watches the eventfd from its
/// reactor instead.
pub fn wait_thread_ring(eventfd: RawFd, timeout: std::time::Duration) -> bool {
    let mut pollfd = libc::pollfd {
        fd: eventfd,
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pollfd` is one live, initialised `struct pollfd` that `poll` may write, and
    // the count passed is 1. A descriptor that is not open is reported in `revents`
    // (POLLNVAL), not undefined behaviour.
    let ready = unsafe { libc::poll(&raw mut pollfd, 1, millis) };
    ready > 0 && pollfd.revents & libc::POLLIN != 0
}

/// Reaps the calling thread's completions and wakes their futures; returns how many reads
/// completed. Call it when the eventfd of [`install_thread_ring`] is readable; it empties the
/// eventfd first, so a completion that arrives meanwhile makes it readable again.
pub fn reap_thread_ring() -> usize {
    let Some(mut ring) = take_thread_ring() else {
        return 0;
    };
    let mut wakers = Vec::new();
    let reaped = ring.reap(&mut wakers);
    put_thread_ring(ring);
    wakers.into_iter().for_each(Waker::wake);
    reaped
}

/// Reads submitted on this thread and not yet reaped, including those whose future was
/// dropped.
pub fn thread_ring_in_flight() -> usize {
    let Some(ring) = take_thread_ring() else {
        return 0;
    };
    let in_flight = ring.in_flight();
    put_thread_ring(ring);
    in_flight
}

/// Submits a read of `buf` at byte `offset` of `file` to the calling thread's ring. Gives the
/// buffer back when the thread has no ring or every slot is taken: the caller then reads
/// synchronously. (Reaping here to free a slot would wake other futures from inside a
/// read; the reaper task is the one place that wakes.)
pub(crate) fn submit_read(
    file: &Arc<SharedFile>,
    offset: u64,
    buf: AlignedBuf,
) -> Result<ReadFuture, AlignedBuf> {
    let Some(mut ring) = take_thread_ring() else {
        return Err(buf);
    };
    let submitted = ring.submit_read(file, offset, buf);
    put_thread_ring(ring);
    submitted
}

/// What the ring holds for one read until its completion: everything the kernel touches.
struct ReadSlot {
    transfer: Transfer,
    /// The kernel writes here. The bytes live on the heap and do not move with the
    /// `AlignedBuf`, so the address in `transfer` stays valid wherever the slot goes.
    buf: AlignedBuf,
    /// Keeps the descriptor open, and takes the read into the device's counters.
    file: Arc<SharedFile>,
    completion: ReadCompletion,
}

struct ThreadRing {
    ring: IoUring,
    eventfd: OwnedFd,
    /// Indexed by submission `user_data`; a slot is emptied only when its read completes.
    slots: Vec<Option<ReadSlot>>,
    free: Vec<usize>,
    /// (user_data, result) of the completions being reaped; kept to reuse its allocation.
    completed: Vec<(u64, i32)>,
}

impl ThreadRing {
    fn new(depth: u32) -> io::Result<Self> {
        let ring = IoUring::new(depth)?;
        // SAFETY: `eventfd` takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let eventfd = unsafe { OwnedFd::from_raw_fd(fd) };
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        // The submission queue holds as many entries as there are slots, and each slot has at
        // most one entry queued or in flight, so a push for a slot never finds it full; the
        // completion queue is twice as large, so it never overflows either.
        let slot_count = ring.params().sq_entries() as usize;
        Ok(Self {
            ring,
            eventfd,
            slots: (0..slot_count).map(|_| None).collect(),
            free: (0..slot_count).rev().collect(),
            completed: Vec::with_capacity(slot_count),
        })
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn submit_read(
        &mut self,
        file: &Arc<SharedFile>,
        offset: u64,
        mut buf: AlignedBuf,
    ) -> Result<ReadFuture, AlignedBuf> {
        let Some(index) = self.free.pop() else {
            return Err(buf);
        };
        let transfer = Transfer::new(
            Direction::Read,
            file.file.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
            offset,
        );
        // SAFETY: queued, not submitted: the kernel sees the entry only at `self.submit()`
        // below, once the slot owns the buffer and an `Arc` of the file. The slot is emptied
        // only by `reap`, on this read's completion, and `Drop` waits for every completion
        // (or leaks the slots), so both stay valid for as long as the kernel may use them.
        if unsafe { self.ring.submission().push(&transfer.entry(index as u64)) }.is_err() {
            self.free.push(index);
            return Err(buf);
        }
        let (future, completion) = ReadFuture::pending();
        self.slots[index] = Some(ReadSlot {
            transfer,
            buf,
            file: Arc::clone(file),
            completion,
        });
        file.counters.submitted(1);
        if !submissions_held_back() {
            self.submit();
        }
        Ok(future)
    }

    /// Hands queued entries to the kernel without waiting. On failure they stay queued, the
    /// next submit or reap retries them, and the eventfd is signalled so that a reaper comes
    /// back even if no completion is due.
    fn submit(&self) {
        loop {
            match self.ring.submit() {
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => {}
                Err(_) => return self.signal(),
                Ok(_) => return,
            }
        }
    }

    fn signal(&self) {
        let one = 1u64;
        // SAFETY: writes the 8 bytes of a live `u64` to our eventfd.
        unsafe { libc::write(self.eventfd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    fn clear_eventfd(&self) {
        let mut count = 0u64;
        // SAFETY: reads at most 8 bytes into a live `u64`. The eventfd is non-blocking, and
        // an empty one (EAGAIN) is as good as one just emptied.
        unsafe { libc::read(self.eventfd.as_raw_fd(), (&raw mut count).cast(), 8) };
    }

    /// Completes every read the kernel has finished, collecting the wakers to call once the
    /// ring is back in its thread-local; returns how many completed.
    fn reap(&mut self, wakers: &mut Vec<Waker>) -> usize {
        self.clear_eventfd();
        let mut completed = std::mem::take(&mut self.completed);
        completed.extend(
            self.ring
                .completion()
                .map(|entry| (entry.user_data(), entry.result())),
        );
        let mut reaped = 0;
        for (user_data, result) in completed.drain(..) {
            let index = user_data as usize;
            let Some(Some(slot)) = self.slots.get_mut(index) else {
                continue;
            };
            let outcome = match slot.transfer.complete(result) {
                Some(outcome) => outcome,
                None => {
                    // SAFETY: as in `submit_read`; the slot still owns the buffer and the file.
                    let entry = slot.transfer.entry(user_data);
                    if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                        continue;
                    }
                    Err(io::Error::other("io_uring submission queue full"))
                }
            };
            let Some(slot) = self.slots[index].take() else {
                continue;
            };
            self.free.push(index);
            slot.file.counters.completed(1);
            if outcome.is_ok() {
                slot.file.counters.record_read(slot.buf.len());
            }
            wakers.extend(slot.completion.finish(outcome, slot.buf));
            reaped += 1;
        }
        self.completed = completed;
        if !self.ring.submission().is_empty() {
            self.submit();
        }
        reaped
    }
}

impl Drop for ThreadRing {
    fn drop(&mut self) {
        let mut wakers = Vec::new();
        while self.in_flight() > 0 {
            if submit_and_wait(&self.ring, 1).is_err() {
                // The kernel's hold on the buffers is unknown: leak them (their futures never
                // complete) rather than free memory it may still write.
                self.slots.drain(..).flatten().for_each(std::mem::forget);
                break;
            }
            self.reap(&mut wakers);
        }
        wakers.into_iter().for_each(Waker::wake);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::task::Poll;
    use std::thread;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::test_util::{Flag, complete, poll_once, random_bytes};
    use crate::{
        BLOCK_BYTES, BLOCK_SIZE, BlockDevice, CompressingDevice, DeviceCompression,
        EmulatorOptions, FaultOp, FaultyDevice, FileDevice, FileOptions, InjectedFault,
    };

    const BLOCKS: u64 = 256;

    /// A device whose every block holds random bytes, and those bytes.
    fn written_device(options: &FileOptions) -> (tempfile::TempDir, FileDevice, Vec<u8>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ssd");
        let device = FileDevice::open_with(path, BLOCKS * BLOCK_BYTES, options).expect("open");
        let data = random_bytes(42, BLOCKS as usize * BLOCK_SIZE);
        device
            .write(0, &AlignedBuf::copy_from(&data))
            .expect("fill");
        (dir, device, data)
    }

    fn blocks(data: &[u8], lba: u64, count: usize) -> &[u8] {
        &data[lba as usize * BLOCK_SIZE..][..count * BLOCK_SIZE]
    }

    /// Waits for the eventfd and reaps until nothing is in flight on this thread.
    fn reap_all() -> usize {
        let eventfd = install_thread_ring(1).expect("ring");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut reaped = 0;
        while thread_ring_in_flight() > 0 {
            assert!(Instant::now() < deadline, "reads never completed");
            wait_thread_ring(eventfd, Duration::from_millis(100));
            reaped += reap_thread_ring();
        }
        reaped
    }

    fn expect_ready(read: &mut ReadFuture) -> (io::Result<()>, AlignedBuf) {
        let (_, waker) = Flag::waker();
        match poll_once(read, &waker) {
            Poll::Ready(outcome) => outcome,
            Poll::Pending => panic!("the read is still pending"),
        }
    }

    #[test]
    fn read_futures_are_send_and_static() {
        fn sendable<T: Send + 'static>(value: T) -> T {
            value
        }
        let read = sendable(ReadFuture::ready(Ok(()), AlignedBuf::zeroed(1)));
        assert!(!read.is_in_flight());
        assert_eq!(format!("{read:?}"), "ReadFuture { in_flight: false, .. }");
    }

    #[test]
    fn without_a_ring_reads_complete_at_once() {
        let (_dir, device, data) = written_device(&FileOptions::default());
        thread::spawn(move || {
            let mut read = device.read_async(7, AlignedBuf::zeroed(2));
            assert!(!read.is_in_flight());
            let (result, buf) = expect_ready(&mut read);
            result.expect("read");
            assert_eq!(&buf[..], blocks(&data, 7, 2));
            assert_eq!((thread_ring_in_flight(), reap_thread_ring()), (0, 0));
        })
        .join()
        .expect("reader");
    }

    #[test]
    fn a_submit_batch_hands_its_reads_to_the_kernel_when_the_outermost_guard_drops() {
        let (_dir, device, data) = written_device(&FileOptions::default());
        thread::spawn(move || {
            install_thread_ring(16).expect("ring");
            let requests = [(3, 1), (90, 2), (200, 1)];
            let outer = batch_thread_ring_submissions();
            let inner = batch_thread_ring_submissions();
            let mut reads: Vec<ReadFuture> = requests
                .iter()
                .map(|&(lba, count)| device.read_async(lba, AlignedBuf::zeroed(count)))
                .collect();
            assert!(reads.iter().all(ReadFuture::is_in_flight));
            assert_eq!(thread_ring_unsubmitted(), requests.len());
            drop(inner);
            assert_eq!(
                thread_ring_unsubmitted(),
                requests.len(),
                "an inner guard holds on"
            );
            drop(outer);
            assert_eq!(thread_ring_unsubmitted(), 0);
            assert_eq!(reap_all(), requests.len());
            for (read, &(lba, count)) in reads.iter_mut().zip(&requests) {
                let (result, buf) = expect_ready(read);
                result.expect("read");
                assert_eq!(&buf[..], blocks(&data, lba, count), "lba {lba}");
            }
            // Without a guard, a read goes to the kernel at once.
            let mut read = device.read_async(5, AlignedBuf::zeroed(1));
            assert_eq!(thread_ring_unsubmitted(), 0);
            assert_eq!(reap_all(), 1);
            assert_eq!(&expect_ready(&mut read).1[..], blocks(&data, 5, 1));
        })
        .join()
        .expect("reader");
    }

    #[test]
    fn reads_stay_in_flight_until_the_submitting_thread_reaps() {
        let (_dir, device, data) = written_device(&FileOptions::default());
        let eventfd = install_thread_ring(16).expect("ring");
        let requests = [(0, 1), (7, 1), (50, 3), (100, 1), (255, 1)];
        let mut reads: Vec<ReadFuture> = requests
            .iter()
            .map(|&(lba, count)| device.read_async(lba, AlignedBuf::zeroed(count)))
            .collect();
        let (flag, waker) = Flag::waker();
        for read in &mut reads {
            assert!(read.is_in_flight());
            assert!(poll_once(read, &waker).is_pending());
        }
        assert_eq!(thread_ring_in_flight(), requests.len());
        assert!(!flag.woken(), "nothing wakes a read before it is reaped");
        assert_eq!(device.stats().in_flight, requests.len() as u64);

        let deadline = Instant::now() + Duration::from_secs(10);
        let mut reaped = 0;
        while reaped < requests.len() {
            assert!(Instant::now() < deadline, "reads never completed");
            assert!(wait_thread_ring(eventfd, Duration::from_secs(5)));
            reaped += reap_thread_ring();
        }
        assert!(flag.woken());
        assert_eq!(thread_ring_in_flight(), 0);
        for (read, &(lba, count)) in reads.iter_mut().zip(&requests) {
            let (result, buf) = expect_ready(read);
            result.expect("read");
            assert_eq!(&buf[..], blocks(&data, lba, count), "lba {lba}");
        }
        let stats = device.stats();
        assert_eq!(stats.reads, requests.len() as u64);
        assert_eq!(stats.host_bytes_read, 7 * BLOCK_BYTES);
        assert_eq!(stats.in_flight, 0, "every read was reaped");

        let (result, buf) = expect_ready(&mut reads[0]);
        assert!(result.is_err(), "polled after completion");
        assert_eq!(buf.len(), 0);
    }

    #[test]
    fn many_reads_in_flight_all_complete_with_their_data() {
        let (_dir, device, data) = written_device(&FileOptions::default());
        let eventfd = install_thread_ring(64).expect("ring");
        let (_, waker) = Flag::waker();
        let total = 2000u64;
        let lba_of = |i: u64| (i * 97) % BLOCKS;
        let mut in_flight: Vec<(u64, ReadFuture)> = Vec::new();
        let (mut submitted, mut completed) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        while completed < total {
            assert!(Instant::now() < deadline, "reads never completed");
            while submitted < total && in_flight.len() < 48 {
                let read = device.read_async(lba_of(submitted), AlignedBuf::zeroed(1));
                in_flight.push((lba_of(submitted), read));
                submitted += 1;
            }
            wait_thread_ring(eventfd, Duration::from_millis(100));
            reap_thread_ring();
            in_flight.retain_mut(|(lba, read)| match poll_once(read, &waker) {
                Poll::Ready((result, buf)) => {
                    result.expect("read");
                    assert_eq!(&buf[..], blocks(&data, *lba, 1), "lba {lba}");
                    completed += 1;
                    false
                }
                Poll::Pending => true,
            });
        }
        assert_eq!(device.stats().reads, total);
    }

    #[test]
    fn dropped_futures_and_a_dropped_device_leave_the_ring_safe() {
        let (_dir, device, data) = written_device(&FileOptions::default());
        install_thread_ring(64).expect("ring");
        for lba in 0..48 {
            drop(device.read_async(lba, AlignedBuf::zeroed(1)));
        }
        assert_eq!(thread_ring_in_flight(), 48);
        assert_eq!(reap_all(), 48);
        assert_eq!(device.stats().reads, 48, "completed reads count");

        let kept: Vec<(u64, ReadFuture)> = (100..108)
            .map(|lba| (lba, device.read_async(lba, AlignedBuf::zeroed(1))))
            .collect();
        for lba in 0..20 {
            drop(device.read_async(lba, AlignedBuf::zeroed(1)));
        }
        // The slots keep the file open for the reads in flight.
        drop(device);
        for (lba, read) in kept {
            let (result, buf) = complete(read);
            result.expect("read after the device was dropped");
            assert_eq!(&buf[..], blocks(&data, lba, 1));
        }
        reap_all();
        assert_eq!(thread_ring_in_flight(), 0);
    }

    #[test]
    fn a_full_ring_reads_synchronously() {
        let (_dir, device, data) = written_device(&FileOptions::default());
        install_thread_ring(4).expect("ring");
        let mut reads: Vec<ReadFuture> = (0..10)
            .map(|lba| device.read_async(lba, AlignedBuf::zeroed(1)))
            .collect();
        let in_flight: Vec<bool> = reads.iter().map(ReadFuture::is_in_flight).collect();
        assert_eq!(
            in_flight,
            [
                true, true, true, true, false, false, false, false, false, false
            ]
        );
        assert_eq!(thread_ring_in_flight(), 4);
        for (lba, read) in (0..).zip(&mut reads).skip(4) {
            let (result, buf) = expect_ready(read);
            result.expect("synchronous read");
            assert_eq!(&buf[..], blocks(&data, lba, 1));
        }
        for (lba, read) in (0..).zip(reads).take(4) {
            let (result, buf) = complete(read);
            result.expect("read");
            assert_eq!(&buf[..], blocks(&data, lba, 1));
        }
    }

    #[test]
    fn errors_are_per_read() {
        let (dir, device, data) = written_device(&FileOptions::default());
        install_thread_ring(8).expect("ring");
        for (lba, count) in [(BLOCKS, 1), (BLOCKS - 1, 2), (u64::MAX, 1)] {
            let mut read = device.read_async(lba, AlignedBuf::zeroed(count));
            assert!(!read.is_in_flight());
            let (result, _) = expect_ready(&mut read);
            let kind = result.err().map(|e| e.kind());
            assert_eq!(kind, Some(io::ErrorKind::InvalidInput), "lba {lba}");
        }
        let (result, _) = expect_ready(&mut device.read_async(3, AlignedBuf::zeroed(0)));
        result.expect("an empty read");

        // Something shrinks the file under the device: 8.5 blocks remain, so block 8 reads
        // short (half a block, then nothing) and block 12 reads nothing.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("ssd"))
            .expect("reopen");
        file.set_len(8 * BLOCK_BYTES + 2048).expect("truncate");
        let reads: Vec<ReadFuture> = [2, 8, 12]
            .map(|lba| device.read_async(lba, AlignedBuf::zeroed(1)))
            .into();
        assert!(reads.iter().all(ReadFuture::is_in_flight));
        let outcomes: Vec<(io::Result<()>, AlignedBuf)> = reads.into_iter().map(complete).collect();
        let kinds: Vec<_> = outcomes
            .iter()
            .map(|(result, _)| result.as_ref().err().map(io::Error::kind))
            .collect();
        let eof = Some(io::ErrorKind::UnexpectedEof);
        assert_eq!(kinds, [None, eof, eof]);
        assert_eq!(&outcomes[0].1[..], blocks(&data, 2, 1));
        assert_eq!(device.stats().reads, 1);
    }

    #[test]
    fn a_future_polled_on_another_thread_is_woken_by_the_reaping_thread() {
        let (_dir, device, data) = written_device(&FileOptions::default());
        install_thread_ring(8).expect("ring");
        let read = device.read_async(9, AlignedBuf::zeroed(1));
        let (to_poller, submitted) = mpsc::channel::<ReadFuture>();
        let (to_submitter, polled) = mpsc::channel();
        let poller = thread::spawn(move || {
            let mut read = submitted.recv().expect("read");
            let (flag, waker) = Flag::waker();
            assert!(poll_once(&mut read, &waker).is_pending());
            to_submitter.send(()).expect("submitter");
            let deadline = Instant::now() + Duration::from_secs(10);
            while !flag.woken() {
                assert!(Instant::now() < deadline, "never woken");
                thread::sleep(Duration::from_millis(1));
            }
            expect_ready(&mut read)
        });
        to_poller.send(read).expect("poller");
        polled.recv().expect("polled once");
        reap_all();
        let (result, buf) = poller.join().expect("poller");
        result.expect("read");
        assert_eq!(&buf[..], blocks(&data, 9, 1));
    }

    #[test]
    fn an_exiting_thread_completes_its_reads_in_flight() {
        let (_dir, device, data) = written_device(&FileOptions::default());
        let device = Arc::new(device);
        let reads = thread::spawn({
            let device = Arc::clone(&device);
            move || {
                install_thread_ring(16).expect("ring");
                let reads: Vec<ReadFuture> = (0..8)
                    .map(|i| device.read_async(i * 3, AlignedBuf::zeroed(1)))
                    .collect();
                assert_eq!(thread_ring_in_flight(), 8);
                reads
            }
        })
        .join()
        .expect("submitter");
        for (i, mut read) in (0..).zip(reads) {
            assert!(!read.is_in_flight());
            let (result, buf) = expect_ready(&mut read);
            result.expect("read");
            assert_eq!(&buf[..], blocks(&data, i * 3, 1));
        }
        assert_eq!(device.stats().reads, 8);
    }

    #[test]
    fn uninstalling_completes_reads_in_flight_and_later_reads_are_synchronous() {
        let (_dir, device, data) = written_device(&FileOptions::default());
        thread::spawn(move || {
            install_thread_ring(8).expect("ring");
            let mut in_flight = device.read_async(5, AlignedBuf::zeroed(1));
            assert!(in_flight.is_in_flight());
            uninstall_thread_ring();
            assert_eq!(thread_ring_in_flight(), 0);
            let (result, buf) = expect_ready(&mut in_flight);
            result.expect("read");
            assert_eq!(&buf[..], blocks(&data, 5, 1));
            let mut later = device.read_async(7, AlignedBuf::zeroed(1));
            assert!(!later.is_in_flight());
            let (result, buf) = expect_ready(&mut later);
            result.expect("read");
            assert_eq!(&buf[..], blocks(&data, 7, 1));
            uninstall_thread_ring();
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn install_is_idempotent_and_checks_its_depth() {
        thread::spawn(|| {
            let eventfd = install_thread_ring(8).expect("ring");
            assert_eq!(install_thread_ring(32).expect("again"), eventfd);
            for depth in [0, MAX_THREAD_RING_DEPTH + 1] {
                let kind = install_thread_ring(depth).err().map(|e| e.kind());
                assert_eq!(kind, Some(io::ErrorKind::InvalidInput));
            }
        })
        .join()
        .expect("installer");
    }

    #[test]
    fn a_signalled_eventfd_is_emptied_by_the_next_reap() {
        thread::spawn(|| {
            let eventfd = install_thread_ring(4).expect("ring");
            assert!(!wait_thread_ring(eventfd, Duration::ZERO));
            let ring = take_thread_ring().expect("installed");
            ring.signal();
            put_thread_ring(ring);
            assert!(wait_thread_ring(eventfd, Duration::ZERO));
            assert_eq!(reap_thread_ring(), 0);
            assert!(!wait_thread_ring(eventfd, Duration::ZERO));
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn devices_without_io_uring_read_synchronously_on_a_ring_thread() {
        let options = FileOptions {
            io_uring: false,
            ..FileOptions::default()
        };
        let (_dir, device, data) = written_device(&options);
        install_thread_ring(8).expect("ring");
        let mut read = device.read_async(4, AlignedBuf::zeroed(1));
        assert!(!read.is_in_flight());
        assert_eq!(thread_ring_in_flight(), 0);
        let (result, buf) = expect_ready(&mut read);
        result.expect("read");
        assert_eq!(&buf[..], blocks(&data, 4, 1));
    }

    #[test]
    fn wrapped_devices_keep_reads_in_flight() {
        install_thread_ring(8).expect("ring");
        let (_dir, device, data) = written_device(&FileOptions::default());
        let faulty = FaultyDevice::new(device);
        faulty.fail_lba(FaultOp::Read, 6);
        faulty.flip_bits_on_read(5, 100, 0x21);
        let mut failed = faulty.read_async(6, AlignedBuf::zeroed(1));
        assert!(!failed.is_in_flight());
        let (result, _) = expect_ready(&mut failed);
        assert!(result.is_err_and(|err| InjectedFault::is_injected(&err)));
        let flipped = faulty.read_async(4, AlignedBuf::zeroed(2));
        assert!(flipped.is_in_flight());
        let (result, buf) = complete(flipped);
        result.expect("read");
        let mut expected = blocks(&data, 4, 2).to_vec();
        expected[BLOCK_SIZE + 100] ^= 0x21;
        assert_eq!(&buf[..], &expected[..]);

        let (_dir, device, data) = written_device(&FileOptions::default());
        let options = EmulatorOptions {
            mode: DeviceCompression::None,
            ..EmulatorOptions::default()
        };
        let emulated: Arc<dyn BlockDevice> =
            Arc::new(CompressingDevice::new(device, options).expect("emulator"));
        let read = emulated.read_async(30, AlignedBuf::zeroed(1));
        assert!(read.is_in_flight());
        let (result, buf) = complete(read);
        result.expect("read");
        assert_eq!(&buf[..], blocks(&data, 30, 1));
        assert_eq!(emulated.stats().reads, 1, "counted as a host read");
    }
}
