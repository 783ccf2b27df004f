//! The connection loop shared by both protocols and by plain TCP, TLS and unix-domain
//! sockets: read, execute every complete request in the buffer (pipelining), append
//! their replies to one buffer, write it once it passes the output budget or the
//! requests run out. A request whose reply would pass the budget stops and resumes once
//! what is buffered is written.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use zipcache::Item;

use super::Transport;
use super::buffer_budget::ConnectionBuffers;
use super::output::Output;
use super::prefetch::{Prefetch, ReadAhead};
use crate::core::auth::Logins;
use crate::core::stats::Counters;

/// A byte stream a connection is served over.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {
    /// Resolves once a read can make progress, before any read buffer is allocated, so an
    /// idle connection holds none.
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
}

impl Stream for TcpStream {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        TcpStream::readable(self)
    }
}

impl Stream for UnixStream {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        UnixStream::readable(self)
    }
}

/// rustls may hold decrypted bytes the socket no longer signals, so a TLS connection
/// goes straight to its read (and its idle cost is rustls's own buffers anyway).
impl Stream for TlsStream<TcpStream> {
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
    /// The request at the front has done part of its work (appended part of its reply)
    /// and has more: step again, once what is buffered is written if it passed the
    /// output budget. The session remembers where the request stopped (a dump's last
    /// key, a multi-key read's next key); the request stays at the front of the input
    /// until its last part is out.
    Partial,
    /// Write what is buffered, then close (quit, or a protocol error the peer would not
    /// recover from either).
    Close,
    /// Write what is buffered, then close at once, without lingering: what the client
    /// sends next is answered by a reset, as by memcached's plain `close()`, which some
    /// clients rely on to tell that a connection is gone (memcached's binary refusal of
    /// an unauthenticated request).
    HangUp,
    /// The request at the front, this many bytes long, reads the SSD: nothing was
    /// executed in this step; await the reads in flight (`prefetch`), then step again.
    Await(usize),
}

/// One connection's protocol: it executes requests from the front of the input, and
/// knows nothing of sockets, buffers or their limits.
pub trait Session {
    /// What the connection turns into when the session stops taking requests.
    type Takeover: Takeover;

    /// Executes the request at the front of `input`, appending its reply to `out`; its
    /// GETs take their answers from `reads`, the connection's reads in flight. These two
    /// are all a request carries besides its bytes: the per-request context.
    fn step(&mut self, input: &[u8], out: &mut Output, reads: &mut Prefetch) -> Step;

    /// If the request at the front is complete and `ahead` walks past it (starting its
    /// GETs if it only reads: `ReadAhead::pass`), returns its length without executing
    /// it; else `None`.
    fn read_ahead(&mut self, input: &[u8], ahead: &mut ReadAhead<'_>) -> Option<usize>;

    /// Once a request handed the connection over (memcached's `watch`), what takes it:
    /// the connection then runs only that.
    fn take_over(&mut self) -> Option<Self::Takeover>;

    /// Appends the error reply for a request larger than `max_request_size`, after
    /// which the connection is closed.
    fn too_large(&mut self, out: &mut Output);

    /// Whether the client has logged in, or needs not: a connection that has not within
    /// `auth_timeout` of opening is closed.
    fn authenticated(&self) -> bool {
        true
    }

    /// The session's logins, whose failures delay their replies (`None`: it has none).
    fn logins(&mut self) -> Option<&mut Logins> {
        None
    }
}

/// What runs a connection a session handed over (memcached's log watcher: lines streamed
/// until the client leaves or the server stops).
pub trait Takeover: Send {
    fn run<S: Stream>(
        self,
        stream: S,
        shutdown: watch::Receiver<bool>,
    ) -> impl Future<Output = ()> + Send;
}

/// A session that never hands its connection over.
impl Takeover for std::convert::Infallible {
    async fn run<S: Stream>(self, _: S, _: watch::Receiver<bool>) {}
}

/// Requests after one that waits for the SSD walked past to start their reads with it, so
/// that a pipeline's GETs have their reads in flight together rather than one after
/// another.
const READ_AHEAD: usize = 64;

const READ_CHUNK: usize = 16 * 1024;

/// How a `process` call ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Processed {
    /// Everything complete was executed; read more.
    NeedMore,
    /// The reply buffer is full: write it, then call again.
    Flush,
    Close,
    /// Close without lingering (`Step::HangUp`).
    HangUp,
    /// Reads are in flight for the request at the front (`Step::Await`).
    Await,
}

/// Executes requests from the front of `input` until it runs out of complete requests
/// (then drops what `reads` holds), `out` passes `OUTPUT_BUDGET`, or the session closes;
/// returns the bytes consumed.
/// Every request that ends, however, ends through `Prefetch::request_done`.
///
/// The SSD reads its requests start reach the kernel together when it returns, before
/// anything awaits them.
pub fn process<S: Session>(
    session: &mut S,
    input: &[u8],
    out: &mut Output,
    reads: &mut Prefetch,
) -> (usize, Processed) {
    let _submit_reads_at_return = zipcache_device::batch_thread_ring_submissions();
    let mut pos = 0;
    while pos < input.len() {
        // One instant for the request: its engine calls read the clock once between them.
        let _now = zipcache::PinnedNow::pin();
        match session.step(&input[pos..], out, reads) {
            Step::NeedMore => break,
            Step::Consumed(n) => {
                reads.request_done(n);
                pos += n;
            }
            Step::Partial => {}
            Step::Close => {
                reads.request_done(0);
                return (pos, Processed::Close);
            }
            Step::HangUp => {
                reads.request_done(0);
                return (pos, Processed::HangUp);
            }
            Step::Await(front) => {
                // The front request started its own reads; the walk starts behind it.
                reads.walk_once(|walk| {
                    let mut ahead = pos + front;
                    for _ in 0..READ_AHEAD {
                        match session.read_ahead(&input[ahead..], walk) {
                            Some(len) => ahead += len,
                            None => break,
                        }
                    }
                    ahead - pos
                });
                return (pos, Processed::Await);
            }
        }
        // A failed login's reply is written, after its delay, before anything runs next.
        if !out.within_budget() || session.logins().is_some_and(|l| l.owes_delay()) {
            return (pos, Processed::Flush);
        }
    }
    // Every complete request ran: nothing prefetched is owed to anyone.
    reads.clear();
    (pos, Processed::NeedMore)
}

/// Waits, if this connection's thread serves others, until those that are ready have run
/// their requests (`yield_now` puts this task behind them): the replies of one round then
/// go out back to back, Redis's `beforeSleep`, and the client, asleep in its poll, is woken
/// by the first of them and finds the rest waiting, instead of being woken by each. That
/// wake-up is paid inside the server's `send` (`sock_def_readable`): it was 31 % of the
/// samples of one serving thread answering redis-benchmark's 50 pipelined connections,
/// against Redis's 4.5 %. A lone connection writes at once: the yield would cost it a
/// poll of the reactor per reply.
async fn after_neighbours(connections_here: &AtomicUsize) {
    if connections_here.load(Ordering::Relaxed) > 1 {
        tokio::task::yield_now().await;
    }
}

/// How long a closing connection keeps discarding what the client still sends.
const LINGER: Duration = Duration::from_secs(1);

/// Closes after the last reply without losing it: closing a socket with unread input
/// sends a reset, which can destroy the reply (say, a protocol error) before the client
/// reads it. So: send FIN, then discard input until the client closes or `LINGER` passes.
async fn linger<T: Stream>(mut stream: T) {
    let _ = stream.shutdown().await;
    // On the heap: an array here would make every connection's future 4 KiB larger.
    let mut sink = vec![0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// `future`'s output if it is ready at its first poll; `None` if it waits (it is then
/// registered to be woken, and may be polled on).
async fn poll_once<F: Future>(mut future: Pin<&mut F>) -> Option<F::Output> {
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
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
            self.free();
        }
    }

    /// Frees the buffer, and its charge: a closing connection does before it lingers,
    /// which would hold them against every other connection's budget for a second.
    fn free(&mut self) {
        self.bytes = Vec::new();
        self.charge_capacity();
    }
}

/// The reply buffer, charged to the connection's share of the budget for all
/// connections' buffers: what a reply holds while it is written, and the capacity kept
/// between the writes of one burst of requests; a connection waiting for input holds none.
struct Reply<'a> {
    out: Output,
    buffers: &'a ConnectionBuffers,
    charged: usize,
}

impl Reply<'_> {
    /// Charges what the reply holds besides `shared` (charged where it is held).
    fn charge(&mut self, shared: Option<&Arc<Item>>) {
        let held = self.out.held_besides(shared);
        self.buffers.recharge(self.charged, held);
        self.charged = held;
    }

    /// The reply went out: its buffer is kept for the next, charged.
    fn written(&mut self) {
        self.out.clear();
        self.charge(None);
    }

    /// Frees the buffer, before waiting for input.
    fn free(&mut self) {
        self.out.free();
        self.charge(None);
    }
}

/// Why a connection waiting for its next bytes was closed.
#[derive(Clone, Copy)]
enum Kick {
    /// Nothing for `idle_timeout` (memcached's `idle_kicks`).
    Idle,
    /// No complete request within `first_request_timeout` of opening (slowloris).
    FirstRequest,
    /// Not logged in within `auth_timeout` of opening, whatever it sent.
    Auth,
}

/// What a connection has done so far that its deadlines depend on.
#[derive(Clone, Copy, Default)]
struct Progress {
    /// A request was executed (refused ones count).
    completed: bool,
    /// The client logged in, or needs not. A later failed login does not revoke this: the
    /// auth timeout is for connections that never log in.
    logged_in: bool,
}

/// When the wait for a connection's next bytes ends, and why.
fn read_deadline(
    transport: &Transport,
    opened: Instant,
    progress: Progress,
) -> Option<(Instant, Kick)> {
    let idle = transport
        .idle_timeout
        .map(|timeout| (Instant::now() + timeout, Kick::Idle));
    let first = transport
        .first_request_timeout
        .filter(|_| !progress.completed)
        .map(|timeout| (opened + timeout, Kick::FirstRequest));
    let auth = transport
        .auth_timeout
        .filter(|_| !progress.logged_in)
        .map(|timeout| (opened + timeout, Kick::Auth));
    [idle, first, auth]
        .into_iter()
        .flatten()
        .min_by_key(|(at, _)| *at)
}

/// Buffers are allocated per read, not per connection: an idle connection holds no
/// buffer at all, so thousands of open connections do not eat into the memory the cache
/// is accounted for (32 KiB each would be 32 MiB per 1000 connections). What a
/// connection holds — its input, its reply, and its SSD reads in flight with their
/// answers (`Prefetch`) — is charged to `transport.buffers`, which closes the biggest
/// connection when all of them hold too much (`buffer_budget_kicks`).
///
/// A connection that sends nothing for `transport.idle_timeout` is closed (`idle_kicks`),
/// as is one that has not completed a request `transport.first_request_timeout` after it
/// opened (`first_request_kicks`), one that has not logged in
/// `transport.auth_timeout` after it opened (`auth_timeout_kicks`), and one whose request
/// grows past `transport.max_request_size` (`request_size_kicks`, after the session's
/// error reply). A failed login's reply waits for its delay (`Logins`) in this task.
///
/// `connections_here` counts the connections the serving thread serves, this one included
/// (`after_neighbours`).
pub async fn serve<T: Stream, S: Session>(
    mut stream: T,
    mut session: S,
    transport: &Transport,
    mut shutdown: watch::Receiver<bool>,
    connections_here: &AtomicUsize,
) {
    let counters = &transport.core.counters;
    let buffers = Arc::new(transport.buffers.register());
    // Holds only an incomplete request between reads.
    let mut input = Input {
        bytes: Vec::new(),
        buffers: &buffers,
        charged: 0,
    };
    let mut reads = Prefetch::new(buffers.clone());
    let mut reply = Reply {
        out: Output::default(),
        buffers: &buffers,
        charged: 0,
    };
    let opened = Instant::now();
    let mut progress = Progress::default();
    // Waited for beside every read and every write that waits: made once, so that each
    // wait does not register a new waiter with the budget and the shutdown signal and
    // unlink it again (locks both) — each returns once it resolves, never polled again.
    let mut stopping = shutdown.clone();
    let mut server_stops = std::pin::pin!(stopping.changed());
    let mut budget_closes = std::pin::pin!(buffers.closed());
    loop {
        progress.logged_in |= session.authenticated();
        let deadline = read_deadline(transport, opened, progress);
        let read = async {
            stream.readable().await?;
            input.reserve_read(transport.max_request_size);
            stream.read_buf(&mut input.bytes).await
        };
        let read = tokio::select! {
            read = until(deadline.map(|(at, _)| at), read) => read,
            () = budget_closes.as_mut() => None,
            // In-flight requests finished synchronously before we got here.
            _ = server_stops.as_mut() => return,
        };
        if buffers.is_closed() {
            Counters::bump(&counters.buffer_budget_kicks);
            return;
        }
        match read {
            None => {
                Counters::bump(match deadline {
                    Some((_, Kick::FirstRequest)) => &counters.first_request_kicks,
                    Some((_, Kick::Auth)) => &counters.auth_timeout_kicks,
                    _ => &counters.idle_kicks,
                });
                return;
            }
            Some(Ok(0) | Err(_)) => return,
            Some(Ok(n)) => Counters::add(&counters.bytes_read, n),
        }
        reply.out.take_spare();
        let mut pos = 0;
        loop {
            let (consumed, processed) = process(
                &mut session,
                &input.bytes[pos..],
                &mut reply.out,
                &mut reads,
            );
            pos += consumed;
            if let Some(delay) = session.logins().and_then(Logins::take_delay) {
                // Nothing is read meanwhile: the connection holds no more than it did.
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => return,
                }
            }
            let reply_len = reply.out.reply_len();
            if reply_len > 0 {
                // Replies waiting for a slow reader count against the budget for all
                // connections' buffers, as the input does.
                reply.charge(reads.held_item());
                after_neighbours(connections_here).await;
                // Large values are written from the items the reply references, not
                // copied (the write is dropped before the reply is touched again). TLS
                // writes sit in rustls until flushed; for TCP the flush is free.
                let written = {
                    let out = &reply.out;
                    let write = async {
                        for part in out.parts() {
                            stream.write_all(part).await?;
                        }
                        stream.flush().await
                    };
                    let mut write = std::pin::pin!(write);
                    // Most replies go out at once: the write timeout's timer and the wait for
                    // the budget are set up (a clock read and two locks) only for one that
                    // waits for the client to read.
                    match poll_once(write.as_mut()).await {
                        Some(written) => Some(written),
                        None => {
                            let deadline =
                                transport.write_timeout.map(|limit| Instant::now() + limit);
                            tokio::select! {
                                written = until(deadline, write) => written,
                                () = budget_closes.as_mut() => {
                                    Some(Err(io::ErrorKind::OutOfMemory.into()))
                                }
                            }
                        }
                    }
                };
                match written {
                    Some(Ok(())) => {}
                    Some(Err(_)) if buffers.is_closed() => {
                        Counters::bump(&counters.buffer_budget_kicks);
                        return;
                    }
                    Some(Err(_)) => return,
                    None => {
                        // The client stopped reading: its replies would wait forever.
                        Counters::bump(&counters.write_timeouts);
                        return;
                    }
                }
                Counters::add(&counters.bytes_written, reply_len);
                reply.written();
            }
            if let Some(takeover) = session.take_over() {
                return takeover.run(stream, shutdown).await;
            }
            match processed {
                Processed::Flush => continue,
                // Replies so far are written; this connection's thread serves others
                // until the oldest of its reads completes, or the budget closes it.
                Processed::Await => {
                    tokio::select! {
                        () = reads.settle() => {}
                        () = budget_closes.as_mut() => {
                            Counters::bump(&counters.buffer_budget_kicks);
                            return;
                        }
                    }
                }
                Processed::NeedMore => {
                    reply.free();
                    break;
                }
                Processed::Close => {
                    input.free();
                    reads.clear();
                    reply.free();
                    linger(stream).await;
                    return;
                }
                Processed::HangUp => return,
            }
        }
        progress.completed |= pos > 0;
        input.consume(pos);
        if input.bytes.len() > transport.max_request_size {
            Counters::bump(&counters.request_size_kicks);
            // Freed before the refusal goes out, and the second the connection lingers.
            input.free();
            reads.clear();
            reply.out.clear();
            session.too_large(&mut reply.out);
            if stream.write_all(&reply.out[..]).await.is_ok() && stream.flush().await.is_ok() {
                linger(stream).await;
            }
            return;
        }
    }
}
