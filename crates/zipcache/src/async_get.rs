//! The future `ZipCache::get_item_async` returns: ready at once when DRAM or BT_LO
//! answered, in flight while an SSD read is.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use crate::{Item, Result};

type Reading = Pin<Box<dyn Future<Output = Result<Option<Item>>> + Send>>;

/// A GET in progress. A server polls it once: `Ready` needs no waiting (the common case,
/// no allocation); otherwise it awaits the SSD read without blocking its thread.
pub struct AsyncGet(State);

enum State {
    Ready(Option<Result<Option<Item>>>),
    /// The read, the bytes of the device buffer it holds until it completes, and whether
    /// its answer is still wanted ([`AsyncGet::abandon`]).
    Reading(Reading, usize, Arc<Abandoned>),
}

/// Set once nobody wants a GET's answer: the read stops at its next device completion,
/// without decoding what it read or reading further.
#[derive(Default)]
pub(crate) struct Abandoned(AtomicBool);

impl Abandoned {
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl AsyncGet {
    pub(crate) fn ready(answer: Result<Option<Item>>) -> AsyncGet {
        AsyncGet(State::Ready(Some(answer)))
    }

    /// A GET whose device read is in flight: `read` resolves with its answer and stops
    /// early once `abandoned` is set.
    pub(crate) fn reading(
        read: impl Future<Output = Result<Option<Item>>> + Send + 'static,
        buffer_bytes: usize,
        abandoned: Arc<Abandoned>,
    ) -> AsyncGet {
        AsyncGet(State::Reading(Box::pin(read), buffer_bytes, abandoned))
    }

    /// The bytes the GET's device buffer holds while its read is in flight (a BT_LO
    /// extent's whole length, or one SSD block), allocation included; 0 once ready. A
    /// server charges them to the connection that started the read before it awaits it.
    pub fn buffer_bytes(&self) -> usize {
        match self.0 {
            State::Ready(_) => 0,
            State::Reading(_, bytes, _) => bytes,
        }
    }

    /// Gives up the answer, returning a future that resolves once the device holds no
    /// buffer for this GET any more (none if it holds none now). Dropping a GET in flight
    /// frees its buffer only when the device completes the read, unseen: a server that
    /// charges what its connections hold awaits this to keep the charge until then. No
    /// value is decoded, no access marked, no further tier read.
    pub fn abandon(self) -> Option<impl Future<Output = ()> + Send + 'static> {
        match self.0 {
            State::Ready(_) => None,
            State::Reading(read, _, abandoned) => {
                abandoned.0.store(true, Ordering::Relaxed);
                Some(async move {
                    let _unwanted = read.await;
                })
            }
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
            State::Reading(read, ..) => read.as_mut().poll(cx),
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
