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
    Reading(Reading),
}

impl AsyncGet {
    pub(crate) fn ready(answer: Result<Option<Item>>) -> AsyncGet {
        AsyncGet(State::Ready(Some(answer)))
    }

    pub(crate) fn reading(
        read: impl Future<Output = Result<Option<Item>>> + Send + 'static,
    ) -> AsyncGet {
        AsyncGet(State::Reading(Box::pin(read)))
    }

    /// The answer if it needs no waiting (DRAM, BT_LO, or a miss known without a read).
    pub fn take_ready(&mut self) -> Option<Result<Option<Item>>> {
        match &mut self.0 {
            State::Ready(answer) => answer.take(),
            State::Reading(_) => None,
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
            State::Reading(read) => read.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for AsyncGet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            State::Ready(_) => "AsyncGet::Ready",
            State::Reading(_) => "AsyncGet::Reading",
        })
    }
}
