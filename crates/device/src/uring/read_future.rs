//! [`ReadFuture`]: an asynchronous read's outcome, handed over by whoever completes it.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use crate::AlignedBuf;

/// Where a read in flight meets its future: the ring puts the outcome here and takes the
/// waker; the future takes the outcome or leaves its waker. Shared across threads because a
/// future may be polled on another thread than the one that reaps.
#[derive(Default)]
struct Completion {
    state: Mutex<CompletionState>,
}

#[derive(Default)]
struct CompletionState {
    outcome: Option<(io::Result<()>, AlignedBuf)>,
    waker: Option<Waker>,
}

impl Completion {
    fn finish(&self, result: io::Result<()>, buf: AlignedBuf) -> Option<Waker> {
        let mut state = self.state.lock();
        state.outcome = Some((result, buf));
        state.waker.take()
    }

    fn poll(&self, waker: &Waker) -> Option<(io::Result<()>, AlignedBuf)> {
        let mut state = self.state.lock();
        let outcome = state.outcome.take();
        if outcome.is_none() && !state.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            state.waker = Some(waker.clone());
        }
        outcome
    }
}

type Inspect = Box<dyn FnOnce(&mut io::Result<()>, &mut AlignedBuf) + Send>;

/// The other end of a [`ReadFuture::pending`].
pub struct ReadCompletion(Arc<Completion>);

impl ReadCompletion {
    /// Completes the read and wakes whoever polled its future.
    pub fn complete(self, result: io::Result<()>, buf: AlignedBuf) {
        if let Some(waker) = self.finish(result, buf) {
            waker.wake();
        }
    }

    /// Completes the read and returns the waker to call, for a completer that must wake
    /// only after it has put its own state back (the thread ring).
    pub(super) fn finish(self, result: io::Result<()>, buf: AlignedBuf) -> Option<Waker> {
        self.0.finish(result, buf)
    }
}

/// A read from [`BlockDevice::read_async`](crate::BlockDevice::read_async):
/// `Future<Output = (io::Result<()>, AlignedBuf)>`, `Send + 'static`, that gives the buffer
/// back with the result.
///
/// A read in flight completes when the thread that submitted it calls [`reap_thread_ring`](super::reap_thread_ring)
/// (the future may be polled on any thread; it is woken from the reaping one). Dropping the
/// future does not cancel the read: the ring keeps the buffer until the kernel is done with
/// it, then drops it. Polling again after completion yields an error and an empty buffer.
pub struct ReadFuture {
    state: ReadState,
    /// Applied to the outcome when it arrives (a [`crate::FaultyDevice`]'s bit flips).
    then: Option<Inspect>,
}

enum ReadState {
    /// `None` once the outcome has been handed out.
    Ready(Option<(io::Result<()>, AlignedBuf)>),
    InFlight(Arc<Completion>),
}

impl ReadFuture {
    /// A read that has already completed with `result` into `buf`.
    pub fn ready(result: io::Result<()>, buf: AlignedBuf) -> ReadFuture {
        ReadFuture {
            state: ReadState::Ready(Some((result, buf))),
            then: None,
        }
    }

    /// A read that completes when [`ReadCompletion::complete`] is called, on any thread:
    /// for devices that complete reads elsewhere, and tests that complete them out of
    /// order.
    pub fn pending() -> (ReadFuture, ReadCompletion) {
        let completion = Arc::new(Completion {
            state: Mutex::new(CompletionState::default()),
        });
        let future = ReadFuture {
            state: ReadState::InFlight(completion.clone()),
            then: None,
        };
        (future, ReadCompletion(completion))
    }

    /// True when the read has not completed yet (its outcome is still with the ring).
    pub fn is_in_flight(&self) -> bool {
        match &self.state {
            ReadState::Ready(_) => false,
            ReadState::InFlight(completion) => completion.state.lock().outcome.is_none(),
        }
    }

    /// Runs `inspect` on the outcome when it arrives: now if it has, else on completion.
    pub(crate) fn inspect(
        mut self,
        inspect: impl FnOnce(&mut io::Result<()>, &mut AlignedBuf) + Send + 'static,
    ) -> ReadFuture {
        match (&mut self.state, self.then.take()) {
            (ReadState::Ready(Some((result, buf))), None) => inspect(result, buf),
            (_, None) => self.then = Some(Box::new(inspect)),
            (_, Some(earlier)) => {
                self.then = Some(Box::new(move |result, buf| {
                    earlier(result, buf);
                    inspect(result, buf);
                }));
            }
        }
        self
    }
}

impl Future for ReadFuture {
    type Output = (io::Result<()>, AlignedBuf);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let outcome = match &mut this.state {
            ReadState::Ready(outcome) => outcome.take(),
            ReadState::InFlight(completion) => match completion.poll(cx.waker()) {
                None => return Poll::Pending,
                outcome => outcome,
            },
        };
        this.state = ReadState::Ready(None);
        let Some((mut result, mut buf)) = outcome else {
            let err = io::Error::other("ReadFuture polled after it completed");
            return Poll::Ready((Err(err), AlignedBuf::zeroed(0)));
        };
        if let Some(inspect) = this.then.take() {
            inspect(&mut result, &mut buf);
        }
        Poll::Ready((result, buf))
    }
}

impl fmt::Debug for ReadFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadFuture")
            .field("in_flight", &self.is_in_flight())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{Flag, complete, poll_once};

    #[test]
    fn a_pending_read_completes_with_what_its_handle_gives() {
        let (mut read, completion) = ReadFuture::pending();
        assert!(read.is_in_flight());
        let (flag, waker) = Flag::waker();
        assert!(poll_once(&mut read, &waker).is_pending());
        let mut buf = AlignedBuf::zeroed(1);
        buf[0] = 9;
        completion.complete(Ok(()), buf);
        assert!(flag.woken(), "completing wakes the poller");
        let (result, buf) = complete(read);
        assert!(result.is_ok());
        assert_eq!(buf[0], 9);
    }
}
