//! Redis RESP2/RESP3 sessions: `parse` frames a request, `cmd` types and runs it.

pub(crate) mod cmd;
mod glob;
pub mod parse;

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::auth::Logins;
use crate::core::hashes::Streamed;
use crate::core::stats::Counters;
use crate::core::{Core, ServerOptions};
use crate::transport::connection::{Session, Step};
use crate::transport::output::Output;
use crate::transport::prefetch::{Prefetch, ReadAhead};
use crate::transport::{Peer, Protocol, Transport};
use cmd::hashes::stream_hash;
use cmd::strings::MultiGet;

/// Client ids for `CLIENT ID` / `HELLO`, unique for the process like Redis's.
static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// Every RESP command name we serve.
pub fn command_names() -> impl Iterator<Item = &'static str> {
    cmd::names()
}

/// What every RESP connection shares.
pub struct Resp {
    pub core: Arc<Core>,
    /// The limits CONFIG GET and INFO report, and the request size the framer allows.
    pub transport: Arc<Transport>,
    /// Most keys one `KEYS` examines.
    pub keys_limit: usize,
}

impl Resp {
    pub fn new(transport: Arc<Transport>, options: &ServerOptions) -> Resp {
        Resp {
            core: transport.core.clone(),
            transport,
            keys_limit: options.keys_limit,
        }
    }
}

/// The RESP port.
impl Protocol for Resp {
    type Session = RespSession;

    fn open(self: Arc<Self>, _peer: Peer, local: Option<SocketAddr>) -> RespSession {
        RespSession::new(self, local)
    }

    fn over_limit(&self) -> &'static [u8] {
        b"-ERR max number of clients reached\r\n"
    }
}

/// What a connection carries from one command to the next.
pub struct Client {
    id: u64,
    name: Option<Vec<u8>>,
    resp3: bool,
    /// True from the start when the access policy requires no login.
    authenticated: bool,
    logins: Logins,
    /// The address the client reached (`None` over the unix socket): what a cluster node
    /// tells it to reach the node at (`core/cluster.rs`).
    local: Option<SocketAddr>,
}

/// One RESP connection.
pub struct RespSession {
    shared: Arc<Resp>,
    client: Client,
    /// An MGET at the front of the input whose values are part-way out.
    multi_get: Option<MultiGet>,
    /// An HGETALL (HKEYS, HVALS) at the front of the input, its request's length, whose
    /// fields are part-way out.
    hash_reply: Option<(Streamed, usize)>,
    /// Progress through the request at the front of the input.
    framer: parse::Framer,
    /// The request at the front waits for its SSD reads: it was counted when it first
    /// stepped, and runs again once they are in.
    awaiting: bool,
}

impl RespSession {
    pub fn new(shared: Arc<Resp>, local: Option<SocketAddr>) -> RespSession {
        let client = Client {
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            name: None,
            resp3: false,
            authenticated: !shared.core.access.required(),
            logins: Logins::default(),
            local,
        };
        RespSession {
            shared,
            client,
            multi_get: None,
            hash_reply: None,
            awaiting: false,
            framer: parse::Framer::default(),
        }
    }
}

/// Calls `f` with a request's arguments as byte slices: from an array on the stack for
/// the usual few (a `Vec` per command was a heap allocation and free for every request),
/// collected for more.
fn with_argv<R>(args: &[Cow<'_, [u8]>], f: impl FnOnce(&[&[u8]]) -> R) -> R {
    const FEW: usize = 8;
    if args.len() <= FEW {
        let mut few: [&[u8]; FEW] = [&[]; FEW];
        for (slot, arg) in few.iter_mut().zip(args) {
            *slot = arg;
        }
        f(&few[..args.len()])
    } else {
        f(&args.iter().map(|a| a.as_ref()).collect::<Vec<&[u8]>>())
    }
}

impl Session for RespSession {
    type Takeover = Infallible;

    fn step(&mut self, input: &[u8], buf: &mut Output, reads: &mut Prefetch) -> Step {
        let mut out = Reply {
            buf,
            resp3: self.client.resp3,
        };
        if let Some(multi_get) = self.multi_get.take() {
            return multi_get.run(&self.shared, input, &mut out, reads, &mut self.multi_get);
        }
        if let Some((stream, len)) = self.hash_reply.take() {
            return stream_hash(&self.shared, stream, len, &mut out, &mut self.hash_reply);
        }
        let (authenticated, max_request_size) = (
            self.client.authenticated,
            self.shared.transport.max_request_size,
        );
        match self.framer.parse(input, authenticated, max_request_size) {
            parse::Parsed::Incomplete => Step::NeedMore,
            parse::Parsed::Error(message) => {
                Counters::bump(&self.shared.core.counters.protocol_errors);
                out.error(&message);
                Step::Close
            }
            parse::Parsed::TooLarge => {
                Counters::bump(&self.shared.core.counters.request_size_kicks);
                out.error(parse::REQUEST_TOO_LARGE);
                Step::Close
            }
            parse::Parsed::Command { args, len } => {
                if args.is_empty() {
                    return Step::Consumed(len);
                }
                if !std::mem::take(&mut self.awaiting) {
                    Counters::bump(&self.shared.core.counters.total_commands_processed);
                }
                let flow = with_argv(&args, |argv| {
                    cmd::execute(&self.shared, &mut self.client, argv, &mut out, reads)
                });
                match flow {
                    cmd::Flow::Continue => Step::Consumed(len),
                    cmd::Flow::Close => Step::Close,
                    cmd::Flow::Await => {
                        self.awaiting = true;
                        Step::Await(len)
                    }
                    cmd::Flow::MultiGet(keys) => MultiGet::start(input, keys, len).run(
                        &self.shared,
                        input,
                        &mut out,
                        reads,
                        &mut self.multi_get,
                    ),
                    cmd::Flow::StreamedHash(stream) => {
                        stream_hash(&self.shared, stream, len, &mut out, &mut self.hash_reply)
                    }
                }
            }
        }
    }
    fn read_ahead(&mut self, input: &[u8], ahead: &mut ReadAhead<'_>) -> Option<usize> {
        let (authenticated, max_request_size) = (
            self.client.authenticated,
            self.shared.transport.max_request_size,
        );
        // Not `self.framer`: its progress is the front request's, not this one's.
        let parse::Parsed::Command { args, len } =
            parse::parse(input, authenticated, max_request_size)
        else {
            return None;
        };
        // An empty command is skipped by `step` without running.
        let ready = args.is_empty()
            || with_argv(&args, |argv| {
                cmd::read_ahead(&self.shared, &self.client, argv, ahead)
            });
        ready.then_some(len)
    }

    fn take_over(&mut self) -> Option<Infallible> {
        None
    }

    fn too_large(&mut self, buf: &mut Output) {
        let mut out = Reply {
            buf,
            resp3: self.client.resp3,
        };
        out.error(parse::REQUEST_TOO_LARGE);
    }

    fn authenticated(&self) -> bool {
        self.client.authenticated
    }

    fn logins(&mut self) -> Option<&mut Logins> {
        Some(&mut self.client.logins)
    }
}

/// Reply encoding for the protocol version the client chose with HELLO: RESP3 differs
/// from RESP2 only in how nil and maps are written, for the replies we send.
pub struct Reply<'a> {
    pub buf: &'a mut Output,
    pub resp3: bool,
}

impl Reply<'_> {
    /// A type byte, a number and CRLF (`:5`, `$3`, `*2`), formatted in place: no
    /// allocation per reply, and none of `fmt`'s machinery (a tenth of a hash reply's
    /// CPU, which writes a header per field).
    pub fn header(&mut self, kind: u8, n: impl itoa::Integer) {
        self.buf.push(kind);
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn simple(&mut self, text: &str) {
        self.buf.push(b'+');
        self.buf.extend_from_slice(text.as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    /// `message` starts with the error code (`ERR ...`); line breaks would end the reply
    /// early, so they become spaces.
    pub fn error(&mut self, message: &str) {
        self.buf.push(b'-');
        self.buf.extend(
            message
                .bytes()
                .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn integer(&mut self, n: i64) {
        self.header(b':', n);
    }

    pub fn bulk(&mut self, value: &[u8]) {
        // Grown once for the whole bulk: appended piecewise, a 1 MiB value would double
        // the buffer to 2 MiB for its last two bytes.
        self.buf.reserve(value.len() + 24);
        self.header(b'$', value.len());
        self.buf.extend_from_slice(value);
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn nil(&mut self) {
        self.buf
            .extend_from_slice(if self.resp3 { b"_\r\n" } else { b"$-1\r\n" });
    }

    pub fn maybe_bulk(&mut self, value: Option<&[u8]>) {
        match value {
            Some(v) => self.bulk(v),
            None => self.nil(),
        }
    }

    pub fn array(&mut self, len: usize) {
        self.header(b'*', len);
    }

    /// Text for a person to read (INFO, CLUSTER INFO and NODES): RESP3's verbatim string
    /// of format `txt`, a bulk string in RESP2.
    pub fn verbatim(&mut self, text: &[u8]) {
        if self.resp3 {
            self.buf.reserve(text.len() + 24);
            self.header(b'=', text.len() + 4);
            self.buf.extend_from_slice(b"txt:");
            self.buf.extend_from_slice(text);
            self.buf.extend_from_slice(b"\r\n");
        } else {
            self.bulk(text);
        }
    }

    /// A map of `pairs` entries; RESP2 sends it as a flat array.
    pub fn map(&mut self, pairs: usize) {
        if self.resp3 {
            self.header(b'%', pairs);
        } else {
            self.array(pairs * 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever their number, on the stack or collected, the arguments reach the command
    /// whole and in order.
    #[test]
    fn every_argument_reaches_the_command() {
        for n in [0, 1, 8, 9, 40] {
            let args: Vec<Cow<'_, [u8]>> = (0..n)
                .map(|i| match i % 2 {
                    0 => Cow::Owned(format!("owned-{i}").into_bytes()),
                    _ => Cow::Borrowed(b"borrowed".as_slice()),
                })
                .collect();
            let seen: Vec<Vec<u8>> =
                with_argv(&args, |argv| argv.iter().map(|a| a.to_vec()).collect());
            let expected: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
            assert_eq!(seen, expected, "{n} arguments");
        }
    }
}
