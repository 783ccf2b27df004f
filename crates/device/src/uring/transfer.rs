//! One request's way through a ring: its submissions, short transfers resubmitted, and the
//! wait for completions that batches and thread rings share.

use std::io;
use std::os::fd::RawFd;

use io_uring::{IoUring, opcode, squeue, types};

/// Bytes one submission moves at most; a longer request continues where the last one stopped.
/// io_uring lengths are `u32`, and a bound that is a whole number of blocks keeps every
/// continuation aligned for `O_DIRECT`.
const MAX_SUBMISSION_BYTES: usize = 1 << 20;

/// Resubmissions after a completion reports `EINTR` or `EAGAIN`, before that error stands.
const MAX_RETRIES: u8 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    Read,
    Write,
}

/// One request's progress through a ring. The kernel may move fewer bytes than asked (a read
/// that meets the end of the file, a signal); the rest is resubmitted, so a request completes
/// whole or fails, and a transfer of no bytes at all is an error rather than a loop.
#[derive(Debug)]
pub(crate) struct Transfer {
    direction: Direction,
    fd: RawFd,
    buf: *mut u8,
    len: usize,
    offset: u64,
    done: usize,
    retries: u8,
}

impl Transfer {
    /// A request to move `len` bytes between `buf` and byte `offset` of `fd`. Building it is
    /// harmless; submitting it is what needs `buf` and `fd` to stay valid (see [`run_batch`]).
    pub(crate) fn new(
        direction: Direction,
        fd: RawFd,
        buf: *mut u8,
        len: usize,
        offset: u64,
    ) -> Self {
        Self {
            direction,
            fd,
            buf,
            len,
            offset,
            done: 0,
            retries: 0,
        }
    }

    /// The submission for the bytes still to move.
    pub(super) fn entry(&self, user_data: u64) -> squeue::Entry {
        let len = (self.len - self.done).min(MAX_SUBMISSION_BYTES) as u32;
        let buf = self.buf.wrapping_add(self.done);
        let offset = self.offset + self.done as u64;
        let fd = types::Fd(self.fd);
        let entry = match self.direction {
            Direction::Read => opcode::Read::new(fd, buf, len).offset(offset).build(),
            Direction::Write => opcode::Write::new(fd, buf.cast_const(), len)
                .offset(offset)
                .build(),
        };
        entry.user_data(user_data)
    }

    /// Takes in a completion's result: `None` while bytes remain to move (submit
    /// [`Transfer::entry`] again), else the request's outcome.
    pub(super) fn complete(&mut self, result: i32) -> Option<io::Result<()>> {
        match result {
            moved if moved > 0 => {
                self.done = (self.done + moved as usize).min(self.len);
                (self.done == self.len).then_some(Ok(()))
            }
            0 => {
                let at = self.offset + self.done as u64;
                Some(Err(match self.direction {
                    Direction::Read => io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("end of file at byte {at}"),
                    ),
                    Direction::Write => io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("no byte written at byte {at}"),
                    ),
                }))
            }
            errno => {
                let errno = errno.wrapping_neg();
                if matches!(errno, libc::EINTR | libc::EAGAIN) && self.retries < MAX_RETRIES {
                    self.retries += 1;
                    return None;
                }
                Some(Err(io::Error::from_raw_os_error(errno)))
            }
        }
    }
}

/// Submits what is queued and waits for at least `want` completions, retrying while the
/// kernel is interrupted or short of resources. An error here leaves requests in flight
/// whose fate is unknown.
pub(super) fn submit_and_wait(ring: &IoUring, want: usize) -> io::Result<()> {
    loop {
        match ring.submit_and_wait(want) {
            Ok(_) => return Ok(()),
            Err(err) => match err.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN | libc::EBUSY) => std::thread::yield_now(),
                _ => return Err(err),
            },
        }
    }
}
