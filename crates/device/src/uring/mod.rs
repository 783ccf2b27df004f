//! io_uring for [`FileDevice`](crate::FileDevice): batches with many requests in flight, and
//! reads that complete on the thread that submitted them.
//!
//! Every ring belongs to one thread and is used only by it:
//!
//! * the **batch ring**, created by a thread's first `read_batch`/`write_batch` on a
//!   `FileDevice` and kept until the thread exits. A batch puts up to [`BATCH_DEPTH`] requests
//!   in flight at once, refills as completions arrive, and returns only once every request has
//!   completed, so the caller's buffers are lent to the kernel for no longer than the call.
//! * the **thread ring** of [`install_thread_ring`], for
//!   [`BlockDevice::read_async`](crate::BlockDevice::read_async). Its slot table owns each
//!   read's buffer and an `Arc` of the file until the kernel has completed the read;
//!   [`reap_thread_ring`] (on the same thread) moves the result and the buffer into the read's
//!   [`ReadFuture`] and wakes it. A future dropped before that leaves its slot in place, and
//!   the completion, when it comes, is discarded. At thread exit the ring waits for the reads
//!   still in flight and completes their futures.
//!
//! A [`ReadFuture`] may be polled and awaited on any thread; it is woken by whoever reaps the
//! ring of the thread that submitted it. On a server, that is the same thread: waking
//! another thread costs 35–90 µs on our VMs, which is why the ring is per thread.

mod batch;
mod read_future;
mod thread_ring;
mod transfer;

pub use batch::BATCH_DEPTH;
#[cfg(test)]
pub(crate) use batch::batch_ring_requests;
pub(crate) use batch::run_batch;
pub use read_future::{ReadCompletion, ReadFuture};
pub(crate) use thread_ring::submit_read;
pub use thread_ring::{
    MAX_THREAD_RING_DEPTH, SubmitBatch, batch_thread_ring_submissions, install_thread_ring,
    install_thread_ring_owned, reap_thread_ring, thread_ring_in_flight, uninstall_thread_ring,
    wait_thread_ring,
};
pub(crate) use transfer::{Direction, Transfer};
