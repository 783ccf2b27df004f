//! The batch ring: one per thread, created by its first batch, that keeps a batch's requests
//! in flight together and returns once all have completed.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;

use io_uring::IoUring;

use super::transfer::{Transfer, submit_and_wait};

/// Requests a batch keeps in flight: fio here reaches its peak random-write rate at queue
/// depth 32, and 64 leaves room for the reads the engine mixes in.
pub const BATCH_DEPTH: u32 = 64;

thread_local! {
    /// `None` until the thread's first batch; `Unavailable` once io_uring could not be set up
    /// here, so later batches go straight to the fallback instead of retrying the setup.
    static BATCH_RING: Cell<Option<BatchRing>> = const { Cell::new(None) };
    /// Requests this thread's batches ran through io_uring, so tests can tell the ring from
    /// the fallback.
    #[cfg(test)]
    static BATCH_RING_REQUESTS: Cell<usize> = const { Cell::new(0) };
}

/// Requests the calling thread's batches have run through io_uring so far.
#[cfg(test)]
pub(crate) fn batch_ring_requests() -> usize {
    BATCH_RING_REQUESTS.with(Cell::get)
}

/// Runs `transfers` through the calling thread's batch ring with up to [`BATCH_DEPTH`] in
/// flight, and returns one outcome per transfer once all have completed. `None` when the
/// thread has no batch ring (io_uring cannot be set up here, or the thread is exiting): the
/// caller then uses system calls.
///
/// # Safety
///
/// Until this function returns, every transfer's buffer must stay valid for `len` bytes
/// (writable for reads, readable for writes, and not otherwise accessed) and its descriptor
/// must stay open.
pub(crate) unsafe fn run_batch(transfers: &mut [Transfer]) -> Option<Vec<io::Result<()>>> {
    let mut ring = match BATCH_RING.try_with(Cell::take).ok()? {
        Some(BatchRing::Ready(ring)) => ring,
        Some(BatchRing::Unavailable) => {
            put_batch_ring(BatchRing::Unavailable);
            return None;
        }
        None => match IoUring::new(BATCH_DEPTH) {
            Ok(ring) => Box::new(ring),
            Err(_) => {
                put_batch_ring(BatchRing::Unavailable);
                return None;
            }
        },
    };
    // SAFETY: forwarded from this function's contract.
    let outcomes = unsafe { drive_batch(&mut ring, transfers) };
    put_batch_ring(BatchRing::Ready(ring));
    Some(outcomes)
}

enum BatchRing {
    Ready(Box<IoUring>),
    /// io_uring could not be set up on this thread.
    Unavailable,
}

fn put_batch_ring(ring: BatchRing) {
    // Fails only while the thread's locals are being destroyed; the ring then closes here,
    // with nothing in flight.
    let _ = BATCH_RING.try_with(|cell| cell.set(Some(ring)));
}

/// # Safety
///
/// As [`run_batch`].
unsafe fn drive_batch(ring: &mut IoUring, transfers: &mut [Transfer]) -> Vec<io::Result<()>> {
    let mut outcomes: Vec<io::Result<()>> = transfers.iter().map(|_| Ok(())).collect();
    let mut waiting: VecDeque<usize> = (0..transfers.len()).collect();
    let mut in_flight = 0;
    let depth = ring.params().sq_entries() as usize;
    while in_flight > 0 || !waiting.is_empty() {
        let mut queue = ring.submission();
        while in_flight < depth
            && let Some(&index) = waiting.front()
        {
            // SAFETY: the caller keeps the buffer and the descriptor valid until we return,
            // and we return only when nothing is in flight (the loop's condition; the
            // process aborts below if the kernel's hold on them becomes unknown).
            if unsafe { queue.push(&transfers[index].entry(index as u64)) }.is_err() {
                break;
            }
            waiting.pop_front();
            in_flight += 1;
        }
        drop(queue);
        if let Err(err) = submit_and_wait(ring, 1) {
            // The kernel may still write into buffers our caller gets back when we return,
            // and we cannot wait for it: no error value can make that memory safe.
            eprintln!(
                "zipcache-device: io_uring_enter failed with {in_flight} requests in flight \
                 ({err}); aborting rather than release their buffers"
            );
            std::process::abort();
        }
        for completion in ring.completion() {
            let index = completion.user_data() as usize;
            let Some(transfer) = transfers.get_mut(index) else {
                continue;
            };
            in_flight -= 1;
            match transfer.complete(completion.result()) {
                None => waiting.push_back(index),
                Some(outcome) => outcomes[index] = outcome,
            }
        }
    }
    #[cfg(test)]
    BATCH_RING_REQUESTS.with(|count| count.set(count.get() + transfers.len()));
    outcomes
}
