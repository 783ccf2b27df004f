//! The emulated drive's controller threads: each sizes the blocks of its shard of LBAs off
//! the request path, fed through a bounded queue it polls.

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::thread::{self, JoinHandle, ThreadId};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use parking_lot::Mutex;

use super::accounting::Accounting;
use super::sizer::BlockSizer;

/// How long an idle controller sleeps at first, and at most, between looks at its queue.
/// Callers never wake it (a wake-up costs 35–90 µs on this VM), so it polls; the back-off
/// keeps an idle emulator from costing CPU, and the bound keeps accounting at most a few
/// milliseconds behind.
const IDLE_SLEEP_MIN: Duration = Duration::from_micros(500);
const IDLE_SLEEP_MAX: Duration = Duration::from_millis(4);

pub(super) enum Job {
    Write { lba: u64, block: Box<[u8]> },
    Trim { lbas: Range<u64> },
    Barrier(Sender<()>),
}

/// One controller thread and its queue; it owns the LBAs congruent to its shard index.
pub(super) struct Controller {
    pub(super) jobs: Sender<Job>,
    pub(super) thread: JoinHandle<()>,
}

impl Controller {
    pub(super) fn spawn(
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
    pub(super) fn submit(&self, job: Job) -> io::Result<()> {
        match self.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(job)) => {
                self.thread.thread().unpark();
                self.jobs.send(job).map_err(|_| controller_stopped())
            }
            Err(TrySendError::Disconnected(_)) => Err(controller_stopped()),
        }
    }

    pub(super) fn stop(self) {
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

pub(super) fn controller_stopped() -> io::Error {
    io::Error::other("the emulated SSD's controller thread has stopped")
}
