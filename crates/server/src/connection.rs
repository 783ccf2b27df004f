//! The connection loop shared by both protocols and by plain TCP and TLS: read, execute
//! every complete request in the buffer (pipelining), append all replies to one buffer,
//! write once.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

use crate::buffer_budget::ConnectionBuffers;
use crate::prefetch::{self, Prefetch, ReadAhead};
use crate::server::Shared;
use crate::stats::Counters;
use crate::watch::Watcher;

/// A byte stream a connection is served over.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send {
    /// Resolves once a read can make progress, before any read buffer is allocated, so an
    /// idle connection holds none.
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
}

impl Transport for TcpStream {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        TcpStream::readable(self)
    }
}

/// rustls may hold decrypted bytes the socket no longer signals, so a TLS connection
/// goes straight to its read (and its idle cost is rustls's own buffers anyway).
impl Transport for TlsStream<TcpStream> {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        std::future::ready(Ok(()))
    }
}

/// What one protocol session does with the front of its read buffer.
pub enum Step {
    /// No complete request at the front: read more.
    NeedMore,
    /// A request spanning this many bytes was executed (its reply, if any, appended).
    Consumed(usize),
    /// The request at the front has appended part of its reply and has more to send
    /// (a dump): step again, once what is buffered is written if the buffer is full.
    Partial,
    /// Write what is buffered, then close (quit, or a protocol error the peer would not
    /// recover from either).
    Close,
    /// The request at the front reads the SSD: nothing was executed; await the reads in
    /// flight (`prefetch`), then step again.
    Await,
}

pub trait Session {
    fn step(&mut self, input: &[u8], out: &mut Vec<u8>) -> Step;

    /// If the request at the front is complete and `ahead` walks past it (starting its
    /// GETs if it only reads: `ReadAhead::pass`), returns its length without executing
    /// it; else `None`.
    fn read_ahead(&mut self, input: &[u8], ahead: &mut ReadAhead) -> Option<usize>;

    /// Once a request made this connection a log watcher (memcached's `watch`), the
    /// watcher: the connection then only streams its lines.
    fn take_watcher(&mut self) -> Option<Watcher> {
        None
    }

    /// Appends the error reply for a request larger than `max_request_size`, after
    /// which the connection is closed.
    fn too_large(&mut self, out: &mut Vec<u8>);
}

/// Requests after one that waits for the SSD walked past to start their reads with it, so
/// that a pipeline's GETs have their reads in flight together rather than one after
/// another.
const READ_AHEAD: usize = 64;

/// Replies are written out once they pass this size even mid-pipeline, so a pipeline
/// of large GETs cannot grow the write buffer without bound.
const FLUSH_AT: usize = 256 * 1024;
const READ_CHUNK: usize = 16 * 1024;

/// How a `process` call ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Processed {
    /// Everything complete was executed; read more.
    NeedMore,
    /// The reply buffer is full: write it, then call again.
    Flush,
    Close,
    /// Reads are in flight for the request at the front (`Step::Await`).
    Await,
}

/// Executes requests from the front of `input` until it runs out of complete requests,
/// `out` passes `FLUSH_AT`, or the session closes; returns the bytes consumed.
///
/// The SSD reads its requests start reach the kernel together when it returns, before
/// anything awaits them.
pub fn process<S: Session>(session: &mut S, input: &[u8], out: &mut Vec<u8>) -> (usize, Processed) {
    let _submit_reads_at_return = zipcache_device::batch_thread_ring_submissions();
    let mut pos = 0;
    while pos < input.len() {
        match session.step(&input[pos..], out) {
            Step::NeedMore => break,
            Step::Consumed(n) => pos += n,
            Step::Partial => {}
            Step::Close => return (pos, Processed::Close),
            Step::Await => {
                prefetch::walk_once(pos, || {
                    let (mut ahead, mut walk) = (pos, ReadAhead::default());
                    for _ in 0..READ_AHEAD {
                        match session.read_ahead(&input[ahead..], &mut walk) {
                            Some(len) => ahead += len,
                            None => break,
                        }
                    }
                    ahead - pos
                });
                return (pos, Processed::Await);
            }
        }
        if out.len() >= FLUSH_AT {
            return (pos, Processed::Flush);
        }
    }
    (pos, Processed::NeedMore)
}

/// How long a closing connection keeps discarding what the client still sends.
const LINGER: Duration = Duration::from_secs(1);

/// Closes after the last reply without losing it: closing a socket with unread input
/// sends a reset, which can destroy the reply (say, a protocol error) before the client
/// reads it. So: send FIN, then discard input until the client closes or `LINGER` passes.
async fn linger<T: Transport>(mut stream: T) {
    let _ = stream.shutdown().await;
    // On the heap: an array here would make every connection's future 4 KiB larger.
    let mut sink = vec![0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// `future`'s output, or `None` if `deadline` passes first.
async fn until<F: Future>(deadline: Option<Instant>, future: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, future).await.ok(),
        None => Some(future.await),
    }
}

/// The read buffer, its capacity charged to the connection's share of the budget for
/// all connections' buffers.
struct Input<'a> {
    bytes: Vec<u8>,
    buffers: &'a ConnectionBuffers,
    charged: usize,
}

impl Input<'_> {
    fn charge_capacity(&mut self) {
        let capacity = self.bytes.capacity();
        self.buffers.recharge(self.charged, capacity);
        self.charged = capacity;
    }

    /// Room for one more read. Growth doubles, so a request trickling in costs linear
    /// copying, but never past `limit` plus one read.
    fn reserve_read(&mut self, limit: usize) {
        let wanted = self.bytes.len() + READ_CHUNK;
        if self.bytes.capacity() < wanted {
            let capacity = (self.bytes.capacity() * 2).clamp(wanted, limit.max(wanted));
            self.bytes.reserve_exact(capacity - self.bytes.len());
            self.charge_capacity();
        }
    }

    /// Drops the `n` bytes at the front; an emptied buffer is freed.
    fn consume(&mut self, n: usize) {
        self.bytes.drain(..n);
        if self.bytes.is_empty() {
            self.bytes = Vec::new();
            self.charge_capacity();
        }
    }
}

/// Why a connection waiting for its next bytes was closed.
#[derive(Clone, Copy)]
enum Kick {
    /// Nothing for `idle_timeout` (memcached's `idle_kicks`).
    Idle,
    /// No complete request within `first_request_timeout` of opening (slowloris).
    FirstRequest,
}

/// When the wait for a connection's next bytes ends, and why.
fn read_deadline(shared: &Shared, opened: Instant, completed: bool) -> Option<(Instant, Kick)> {
    let idle = shared
        .idle_timeout
        .map(|timeout| (Instant::now() + timeout, Kick::Idle));
    let first = shared
        .first_request_timeout
        .filter(|_| !completed)
        .map(|timeout| (opened + timeout, Kick::FirstRequest));
    idle.into_iter().chain(first).min_by_key(|(at, _)| *at)
}

/// Buffers are allocated per read, not per connection: an idle connection holds no
/// buffer at all, so thousands of open connections do not eat into the memory the cache
/// is accounted for (32 KiB each would be 32 MiB per 1000 connections). What a
/// connection buffers is charged to `shared.buffers`, which closes the biggest
/// connection when all of them hold too much (`buffer_budget_kicks`).
///
/// A connection that sends nothing for `shared.idle_timeout` is closed (`idle_kicks`),
/// as is one that has not completed a request `shared.first_request_timeout` after it
/// opened (`first_request_kicks`), and one whose request grows past
/// `shared.max_request_size` (`request_size_kicks`, after the session's error reply).
pub async fn serve<T: Transport, S: Session>(
    mut stream: T,
    mut session: S,
    shared: &Shared,
    mut shutdown: watch::Receiver<bool>,
) {
    let counters = &shared.counters;
    let buffers = shared.buffers.register();
    // Holds only an incomplete request between reads.
    let mut input = Input {
        bytes: Vec::new(),
        buffers: &buffers,
        charged: 0,
    };
    let mut prefetch = Prefetch::default();
    let opened = Instant::now();
    let mut completed = false;
    loop {
        let deadline = read_deadline(shared, opened, completed);
        let read = async {
            stream.readable().await?;
            input.reserve_read(shared.max_request_size);
            stream.read_buf(&mut input.bytes).await
        };
        let read = tokio::select! {
            read = until(deadline.map(|(at, _)| at), read) => read,
            () = buffers.closed() => None,
            // In-flight requests finished synchronously before we got here.
            _ = shutdown.changed() => return,
        };
        if buffers.is_closed() {
            Counters::bump(&counters.buffer_budget_kicks);
            return;
        }
        match read {
            None => {
                Counters::bump(match deadline {
                    Some((_, Kick::FirstRequest)) => &counters.first_request_kicks,
                    _ => &counters.idle_kicks,
                });
                return;
            }
            Some(Ok(0) | Err(_)) => return,
            Some(Ok(n)) => Counters::add(&counters.bytes_read, n),
        }
        let input_bytes = &input.bytes;
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let (consumed, processed) = prefetch::within(&mut prefetch, || {
                process(&mut session, &input_bytes[pos..], &mut out)
            });
            pos += consumed;
            if !out.is_empty() {
                // TLS writes sit in rustls until flushed; for TCP the flush is free.
                if stream.write_all(&out).await.is_err() || stream.flush().await.is_err() {
                    return;
                }
                Counters::add(&counters.bytes_written, out.len());
                out.clear();
            }
            if let Some(watcher) = session.take_watcher() {
                return watcher.stream(stream, shutdown).await;
            }
            if processed != Processed::Await {
                // Every complete request ran: nothing prefetched is owed to anyone.
                prefetch.clear();
            }
            match processed {
                Processed::Flush => continue,
                // Replies so far are written; this connection's thread serves others
                // until the oldest of its reads completes.
                Processed::Await => prefetch.settle().await,
                Processed::NeedMore => break,
                Processed::Close => {
                    linger(stream).await;
                    return;
                }
            }
        }
        completed |= pos > 0;
        input.consume(pos);
        if input.bytes.len() > shared.max_request_size {
            Counters::bump(&counters.request_size_kicks);
            let mut out = Vec::new();
            session.too_large(&mut out);
            if stream.write_all(&out).await.is_ok() && stream.flush().await.is_ok() {
                linger(stream).await;
            }
            return;
        }
    }
}
