//! The connection loop shared by both protocols: read, execute every complete request
//! in the buffer (pipelining), append all replies to one buffer, write once.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// What one protocol session does with the front of its read buffer.
pub enum Step {
    /// No complete request at the front: read more.
    NeedMore,
    /// A request spanning this many bytes was executed (its reply, if any, appended).
    Consumed(usize),
    /// Write what is buffered, then close (quit, or a protocol error the peer would not
    /// recover from either).
    Close,
}

pub trait Session {
    fn step(&mut self, input: &[u8], out: &mut Vec<u8>) -> Step;
}

/// Replies are written out once they pass this size even mid-pipeline, so a pipeline
/// of large GETs cannot grow the write buffer without bound.
const FLUSH_AT: usize = 256 * 1024;
const READ_CHUNK: usize = 16 * 1024;
/// A session never needs more buffered input than one request; a request larger than
/// this (a huge multi-bulk MSET, say) is refused by closing the connection.
const MAX_INPUT: usize = 64 << 20;

/// How a `process` call ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Processed {
    /// Everything complete was executed; read more.
    NeedMore,
    /// The reply buffer is full: write it, then call again.
    Flush,
    Close,
}

/// Executes requests from the front of `input` until it runs out of complete requests,
/// `out` passes `FLUSH_AT`, or the session closes; returns the bytes consumed.
pub fn process<S: Session>(session: &mut S, input: &[u8], out: &mut Vec<u8>) -> (usize, Processed) {
    let mut pos = 0;
    while pos < input.len() {
        match session.step(&input[pos..], out) {
            Step::NeedMore => break,
            Step::Consumed(n) => pos += n,
            Step::Close => return (pos, Processed::Close),
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
async fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    // On the heap: an array here would make every connection's future 4 KiB larger.
    let mut sink = vec![0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Buffers are allocated per read, not per connection: an idle connection holds no
/// buffer at all, so thousands of open connections do not eat into the memory the cache
/// is accounted for (32 KiB each would be 32 MiB per 1000 connections).
pub async fn serve<S: Session>(
    mut stream: TcpStream,
    mut session: S,
    mut shutdown: watch::Receiver<bool>,
) {
    // Latency over batching: replies go out as soon as a read's requests are done.
    let _ = stream.set_nodelay(true);
    // Holds only an incomplete request between reads.
    let mut input: Vec<u8> = Vec::new();
    loop {
        if input.len() >= MAX_INPUT {
            return;
        }
        let ready = tokio::select! {
            ready = stream.readable() => ready,
            // In-flight requests finished synchronously before we got here.
            _ = shutdown.changed() => return,
        };
        if ready.is_err() {
            return;
        }
        input.reserve(READ_CHUNK);
        match stream.try_read_buf(&mut input) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let (consumed, processed) = process(&mut session, &input[pos..], &mut out);
            pos += consumed;
            if !out.is_empty() {
                if stream.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
            }
            match processed {
                Processed::Flush => continue,
                Processed::NeedMore => break,
                Processed::Close => {
                    linger(stream).await;
                    return;
                }
            }
        }
        input.drain(..pos);
        if input.is_empty() {
            input = Vec::new();
        }
    }
}
