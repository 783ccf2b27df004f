//! The future `ZipCache::get_item_async` returns: ready at once when DRAM or BT_LO
//! answered, in flight while an SSD read is.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::{Item, Result};

type Reading = Pin<Box<dyn Future<Output = Result<Option<Item>>> + Send>>;

/// A GET in progress. A server polls it once: `Ready` needs no waiting (the common case,
/// no allocation); otherwise it awaits the SSD read without blocking its thread.
pub struct AsyncGet(State);

enum State {
    Ready(Option<Result<Option<Item>>>),
    /// The read, and the bytes of the device buffer it holds until it completes.
    Reading(Reading, usize),
}

impl AsyncGet {
    pub(crate) fn ready(answer: Result<Option<Item>>) -> AsyncGet {
        AsyncGet(State::Ready(Some(answer)))
    }

    pub(crate) fn reading(
        read: impl Future<Output = Result<Option<Item>>> + Send + 'static,
        buffer_bytes: usize,
    ) -> AsyncGet {
        AsyncGet(State::Reading(Box::pin(read), buffer_bytes))
    }

    /// The bytes the GET's device buffer holds while its read is in flight (a BT_LO
    /// extent's whole length, or one SSD block), allocation included; 0 once ready. A
    /// server charges them to the connection that started the read before it awaits it.
    pub fn buffer_bytes(&self) -> usize {
        match self.0 {
            State::Ready(_) => 0,
            State::Reading(_, bytes) => bytes,
        }
    }

    /// The answer if it needs no waiting (DRAM, BT_LO, or a miss known without a read).
    pub fn take_ready(&mut self) -> Option<Result<Option<Item>>> {
        match &mut self.0 {
            State::Ready(answer) => answer.take(),
            State::Reading(..) => None,
        }
    }
}

impl Future for AsyncGet {
    type Output = Result<Option<Item>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            State::Ready(answer) => {
                Poll::Ready(answer.take().expect("AsyncGet polled after completion"))
            }
            State::Reading(read, _) => read.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for AsyncGet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            State::Ready(_) => "AsyncGet::Ready",
            State::Reading(..) => "AsyncGet::Reading",
        })
    }
}
