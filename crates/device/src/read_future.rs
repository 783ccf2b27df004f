//! The future a [`crate::BlockDevice::read_async`] returns.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use crate::AlignedBuf;

type Outcome = (io::Result<()>, AlignedBuf);

/// A read in flight; gives the buffer back with the result.
pub struct ReadFuture(State);

enum State {
    Ready(Option<Outcome>),
    /// Completed by whoever holds the [`ReadCompletion`], on any thread.
    Pending(Arc<Mutex<Slot>>),
}

#[derive(Default)]
struct Slot {
    outcome: Option<Outcome>,
    waker: Option<Waker>,
}

/// The other end of a pending [`ReadFuture`].
pub struct ReadCompletion(Arc<Mutex<Slot>>);

impl ReadFuture {
    /// A read that already completed.
    pub fn ready(result: io::Result<()>, buf: AlignedBuf) -> ReadFuture {
        ReadFuture(State::Ready(Some((result, buf))))
    }

    /// A read that completes when `complete` is called on the returned handle (devices
    /// that complete reads elsewhere, and tests that complete them out of order).
    pub fn pending() -> (ReadFuture, ReadCompletion) {
        let slot = Arc::new(Mutex::new(Slot::default()));
        (
            ReadFuture(State::Pending(slot.clone())),
            ReadCompletion(slot),
        )
    }
}

impl ReadCompletion {
    pub fn complete(self, result: io::Result<()>, buf: AlignedBuf) {
        let waker = {
            let mut slot = self.0.lock();
            slot.outcome = Some((result, buf));
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Future for ReadFuture {
    type Output = Outcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        match &mut self.0 {
            State::Ready(outcome) => {
                Poll::Ready(outcome.take().expect("ReadFuture polled after completion"))
            }
            State::Pending(slot) => {
                let mut slot = slot.lock();
                match slot.outcome.take() {
                    Some(outcome) => Poll::Ready(outcome),
                    None => {
                        slot.waker = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_read_completes_with_what_its_handle_gives() {
        let (mut future, completion) = ReadFuture::pending();
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        let mut buf = AlignedBuf::zeroed(1);
        buf[0] = 9;
        completion.complete(Ok(()), buf);
        match Pin::new(&mut future).poll(&mut cx) {
            Poll::Ready((Ok(()), buf)) => assert_eq!(buf[0], 9),
            _ => panic!("not completed"),
        }
    }
}
