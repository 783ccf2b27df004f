//! memcached text and meta protocol sessions.

pub mod annotations;
pub(crate) mod auth;
pub mod binary;
pub mod conns;
mod crawler;
mod events;
mod meta;
mod operator;
pub mod parse;
pub mod prefix_stats;
mod text;
pub mod watch;

pub use crawler::Crawler;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::{GeneralPurpose, GeneralPurposeConfig};
use tokio::task::AbortHandle;
use zipcache::{AccessState, Item, PutOptions, Update};

use crate::core::Core;
use crate::core::ServerOptions;
use crate::core::auth::Logins;
use crate::core::stats::Counters;
use crate::transport::connection::{Session, Step};
use crate::transport::output::Output;
use crate::transport::prefetch::{Prefetch, ReadAhead};
use crate::transport::{Peer, Protocol, Transport};
use annotations::Annotations;
use conns::Connections;
use parse::{Parsed, Request};
use prefix_stats::PrefixStats;
use watch::{CloseReason, Event, Logger, Streams, TooManyWatchers, Watcher};

/// What every memcached connection shares beyond the core: memcached's own state of
/// items, log streams, connections and crawler.
pub struct Memcached {
    pub core: Arc<Core>,
    /// The limits and buffers `stats settings` reports, and `refresh_certs`.
    pub transport: Arc<Transport>,
    pub annotations: Annotations,
    pub crawler: Arc<Crawler>,
    /// memcached's log streams (`watch`).
    pub logger: Arc<Logger>,
    /// `stats detail`.
    pub prefix_stats: PrefixStats,
    /// Open memcached connections (`stats conns`).
    pub conns: Connections,
    /// memcached's `flush_all <delay>` waiting to fire: one, replaced by the next.
    pub pending_flush: Mutex<Option<PendingFlush>>,
}

/// A `flush_all <delay>` acknowledged and not yet fired.
pub struct PendingFlush {
    pub timer: AbortHandle,
    /// Set by the timer's task once the flush ran.
    pub fired: Arc<AtomicBool>,
}

impl Memcached {
    pub fn new(transport: Arc<Transport>, options: &ServerOptions) -> Memcached {
        Memcached {
            core: transport.core.clone(),
            transport,
            annotations: Annotations::default(),
            crawler: Crawler::new(options.lru_crawler),
            logger: Arc::default(),
            prefix_stats: PrefixStats::default(),
            conns: Connections::default(),
            pending_flush: Mutex::new(None),
        }
    }

    /// The server stops, its serving threads ended: the crawl under way ends and its
    /// thread is joined (it holds the engine), and a `flush_all <delay>` that has not
    /// fired fires now — the client was promised that everything stored before it is
    /// gone, and the engine closing now keeps what it holds for the next start.
    pub fn stop(&self) {
        self.crawler.stop();
        let pending = self
            .pending_flush
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(PendingFlush { timer, fired }) = pending {
            timer.abort();
            if !fired.load(Ordering::Acquire) {
                let _ = self.core.strings.engine().flush_all();
            }
        }
    }
}

/// What a memcached request runs with besides its bytes and its reply: the state every
/// connection shares, the connection it came on (`cfd=` in the log lines it causes), and
/// that connection's reads in flight.
pub struct RequestContext<'a> {
    pub shared: &'a Memcached,
    pub conn: u64,
    pub reads: &'a mut Prefetch,
    /// The address the client reached (`None` over the unix socket or outside a server).
    pub local: Option<SocketAddr>,
}

/// The memcached port.
impl Protocol for Memcached {
    type Session = MemcacheSession;

    fn open(self: Arc<Self>, peer: Peer, local: Option<SocketAddr>) -> MemcacheSession {
        let mut session = MemcacheSession::accepted(self, Some(peer));
        session.local = local;
        session
    }

    fn over_limit(&self) -> &'static [u8] {
        b"ERROR Too many open connections\r\n"
    }
}

/// memcached treats exptimes above 30 days as absolute Unix times.
const RELATIVE_EXPTIME_MAX: i64 = 60 * 60 * 24 * 30;

/// An exptime resolved against the engine clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expiry {
    Never,
    At(u64),
    /// Negative or in the past: the write behaves as a delete.
    Past,
}

impl Expiry {
    fn from_exptime(exptime: i64, now_ms: u64) -> Expiry {
        if exptime == 0 {
            Expiry::Never
        } else if exptime < 0 {
            Expiry::Past
        } else if exptime > RELATIVE_EXPTIME_MAX {
            // Meta tokens may carry any i64, so the arithmetic saturates.
            let at = (exptime as u64).saturating_mul(1000);
            if at <= now_ms {
                Expiry::Past
            } else {
                Expiry::At(at)
            }
        } else {
            Expiry::At(now_ms.saturating_add(exptime as u64 * 1000))
        }
    }

    fn from_item(item: &Item) -> Expiry {
        item.expires_at_ms.map_or(Expiry::Never, Expiry::At)
    }

    fn expires_at_ms(self) -> Option<u64> {
        match self {
            Expiry::At(t) => Some(t),
            Expiry::Never | Expiry::Past => None,
        }
    }

    /// The update storing `value` with this expiry and `flags` (a past expiry deletes),
    /// under `cas` — the item's own, kept, or one the client chose — or a fresh CAS.
    fn store(self, value: Vec<u8>, flags: u32, cas: Option<u64>) -> Update {
        match self.put_options(flags, cas) {
            Some(options) => Update::Put { value, options },
            None => Update::Delete,
        }
    }

    /// The update giving an item this expiry, `flags` and CAS `cas` (kept: a touch) and
    /// leaving its value as it is, unread and unwritten if large (a past expiry deletes).
    fn set_meta(self, flags: u32, cas: u64) -> Update {
        match self.put_options(flags, Some(cas)) {
            Some(options) => Update::SetMeta(options),
            None => Update::Delete,
        }
    }

    /// `store`'s options for a put; `None` where it deletes (a past expiry). A plain
    /// `set` takes them alone, without a copy of its value for an `Update`.
    fn put_options(self, flags: u32, cas: Option<u64>) -> Option<PutOptions> {
        (self != Expiry::Past).then(|| PutOptions {
            expires_at_ms: self.expires_at_ms(),
            flags,
            assign_cas: true,
            cas,
            // A new write: not fetched, accessed now.
            access: None,
            collection: false,
        })
    }
}

/// `update`, if a put, storing an item that starts with access state `access`: what a
/// touch leaves (memcached counts it as a fetch), or a read's `u` keeps.
fn with_access(update: Update, access: Option<AccessState>) -> Update {
    match update {
        Update::Put { value, options } => Update::Put {
            value,
            options: PutOptions { access, ..options },
        },
        Update::SetMeta(options) => Update::SetMeta(PutOptions { access, ..options }),
        other => other,
    }
}

/// The access state a read leaves: fetched and accessed at `now_ms`, or with `u`
/// (`peek`) the state it found.
fn after_read(peek: bool, found: Option<AccessState>, now_ms: u64) -> Option<AccessState> {
    if peek {
        found
    } else {
        Some(AccessState {
            fetched: true,
            last_access_ms: now_ms,
        })
    }
}

/// Seconds left before `item` expires, as memcached reports it (`-1` = never).
fn ttl_seconds(item: &Item, now_ms: u64) -> i64 {
    item.expires_at_ms
        .map_or(-1, |t| t.saturating_sub(now_ms).div_ceil(1000) as i64)
}

/// The reply line for an engine error.
fn engine_error(error: &zipcache::Error) -> String {
    match error {
        zipcache::Error::EmptyKey | zipcache::Error::KeyTooLarge { .. } => BAD_FORMAT.to_string(),
        zipcache::Error::ValueTooLarge { .. } => parse::TOO_LARGE.to_string(),
        other => format!("SERVER_ERROR {other}"),
    }
}

/// memcached's reply to a request line it cannot parse.
const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";

/// Standard base64 with `=` padding, as memcached's `b` flag uses; bits past the last
/// byte are ignored on decoding, as memcached ignores them.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

fn base64_encode(bytes: &[u8]) -> Vec<u8> {
    BASE64.encode(bytes).into_bytes()
}

fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    BASE64.decode(text).ok().filter(|bytes| !bytes.is_empty())
}

fn line(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// memcached's counter parse: leading decimal digits, then whitespace or the end.
fn parse_counter(value: &[u8]) -> Option<u64> {
    let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || value.get(digits).is_some_and(|b| !b.is_ascii_whitespace()) {
        return None;
    }
    std::str::from_utf8(&value[..digits]).ok()?.parse().ok()
}

const NON_NUMERIC: &str = "CLIENT_ERROR cannot increment or decrement non-numeric value";
const REQUEST_TOO_LARGE: &str = "SERVER_ERROR request exceeds max-request-size";

/// One memcached connection.
pub struct MemcacheSession {
    shared: Arc<Memcached>,
    /// The address the client reached: what `config get cluster` names this node by.
    local: Option<SocketAddr>,
    /// Bytes of a refused data block still to be discarded.
    swallow: usize,
    /// False until the client authenticates, when the server asks for it.
    authenticated: bool,
    /// A binary connection's SASL exchange in progress.
    sasl: binary::sasl::Exchange,
    /// Logins tried, over either protocol.
    logins: Logins,
    /// A metadump or mgdump being sent, and the length of its request line: the line
    /// stays at the front of the input until the dump's last line is out.
    dump: Option<(crawler::Dump, usize)>,
    /// A get/gets/gat/gats at the front of the input whose reply is part-way out.
    retrieval: Option<text::Retrieval>,
    /// The connection's id (`cfd=` in log lines, `stats conns`).
    id: u64,
    /// The client, for connection events; `None` outside a listening server.
    peer: Option<Peer>,
    /// Whether the connection speaks the binary protocol, decided by its first byte.
    binary: Option<bool>,
    close_reason: CloseReason,
    /// Set by `watch`: the connection now only streams log lines (`take_watcher`).
    watcher: Option<Watcher>,
}

impl MemcacheSession {
    /// A session outside a listening server (fuzzing, property tests).
    pub fn new(shared: Arc<Memcached>) -> MemcacheSession {
        MemcacheSession::accepted(shared, None)
    }

    /// The session of a connection accepted from `peer`: listed in `stats conns` and
    /// logged (`watch connevents`) until it closes.
    pub fn accepted(shared: Arc<Memcached>, peer: Option<Peer>) -> MemcacheSession {
        let authenticated = !shared.core.access.required();
        let id = shared.conns.open(peer);
        if let Some(peer) = peer {
            shared.logger.log(Event::ConnNew { peer, conn: id });
        }
        MemcacheSession {
            shared,
            swallow: 0,
            authenticated,
            sasl: binary::sasl::Exchange::default(),
            logins: Logins::default(),
            dump: None,
            retrieval: None,
            id,
            peer,
            binary: None,
            close_reason: CloseReason::Normal,
            watcher: None,
            local: None,
        }
    }

    /// `watch`: turns this connection into a watcher of the streams named, once every
    /// earlier reply is out (memcached refuses a `watch` behind pipelined commands).
    fn watch(&mut self, names: &[&[u8]], out: &mut Vec<u8>) {
        if !out.is_empty() {
            return line(out, "ERROR cannot pipeline other commands before watch");
        }
        let Some(streams) = Streams::parse(names) else {
            return line(out, "ERROR");
        };
        match self.shared.logger.subscribe(streams) {
            Ok(watcher) => {
                self.watcher = Some(watcher);
                line(out, "OK");
            }
            Err(TooManyWatchers) => line(out, "WATCHER_TOO_MANY log watcher limit reached"),
        }
    }

    fn authenticate(&mut self, input: &[u8], out: &mut Vec<u8>) -> Step {
        match auth::attempt(input, &self.shared.core.access) {
            auth::Attempt::NeedMore => Step::NeedMore,
            auth::Attempt::Close => {
                self.close_reason = CloseReason::Error;
                Step::Close
            }
            auth::Attempt::Answered { reply, len, login } => {
                line(out, reply);
                let Some(granted) = login else {
                    return Step::Consumed(len);
                };
                self.authenticated = granted;
                if self.logins.attempted(granted, &self.shared.core.counters) {
                    self.close_reason = CloseReason::Error;
                    return Step::Close;
                }
                Step::Consumed(len)
            }
        }
    }
}

impl Drop for MemcacheSession {
    fn drop(&mut self) {
        self.shared.conns.close(self.id);
        if let Some(peer) = self.peer {
            self.shared.logger.log(Event::ConnClose {
                peer,
                reason: self.close_reason,
                conn: self.id,
            });
        }
    }
}

impl Session for MemcacheSession {
    type Takeover = Watcher;

    fn step(&mut self, input: &[u8], out: &mut Output, reads: &mut Prefetch) -> Step {
        if self.watcher.is_some() {
            // A watcher's input is ignored, as memcached does.
            return Step::NeedMore;
        }
        if self.swallow > 0 {
            let n = self.swallow.min(input.len());
            self.swallow -= n;
            return Step::Consumed(n);
        }
        if *self
            .binary
            .get_or_insert(input[0] == binary::parse::REQUEST_MAGIC)
        {
            return self.step_binary(input, out, reads);
        }
        if !self.authenticated {
            return self.authenticate(input, out);
        }
        if let Some((dump, len)) = &mut self.dump {
            if !dump.fill(&self.shared.core.strings, out) {
                return Step::Partial;
            }
            let len = *len;
            self.dump = None;
            return Step::Consumed(len);
        }
        if let Some(retrieval) = self.retrieval.take() {
            return self.retrieve(retrieval, input, out, reads);
        }
        let (request, len, swallow) = match parse::parse(input, self.shared.core.max_value) {
            Parsed::Incomplete => return Step::NeedMore,
            Parsed::Close => {
                self.close_reason = CloseReason::Error;
                return Step::Close;
            }
            Parsed::Request { request, len } => (request, len, 0),
            Parsed::Swallow {
                request,
                len,
                swallow,
            } => (request, len, swallow),
        };
        if let Some(retrieval) = text::Retrieval::of(&request, input, len) {
            self.count_request();
            return self.retrieve(retrieval, input, out, reads);
        }
        // Every other request, refused or swallowed ones too, is admitted here.
        if reads.admit(&self.shared.core.strings, || request.access()) == 0 {
            return Step::Await(len);
        }
        // The skipped bytes hold no requests, so replying before they arrive keeps
        // replies in request order.
        self.swallow = swallow;
        if !self.execute(request, len, out, reads) {
            Step::Close
        } else if self.dump.is_some() {
            Step::Partial
        } else {
            Step::Consumed(len)
        }
    }

    fn take_over(&mut self) -> Option<Watcher> {
        self.watcher.take()
    }

    fn authenticated(&self) -> bool {
        self.authenticated
    }

    fn logins(&mut self) -> Option<&mut Logins> {
        Some(&mut self.logins)
    }

    fn too_large(&mut self, out: &mut Output) {
        self.close_reason = CloseReason::Error;
        if self.binary == Some(true) {
            return binary::request_too_large(out);
        }
        line(out, REQUEST_TOO_LARGE);
    }

    fn read_ahead(&mut self, input: &[u8], ahead: &mut ReadAhead<'_>) -> Option<usize> {
        if self.watcher.is_some() || self.swallow > 0 || !self.authenticated {
            return None;
        }
        if self.binary == Some(true) {
            return self.read_ahead_binary(input, ahead);
        }
        match parse::parse(input, self.shared.core.max_value) {
            Parsed::Request { request, len } => ahead
                .pass(&self.shared.core.strings, &request.access())
                .then_some(len),
            _ => None,
        }
    }
}

impl MemcacheSession {
    /// What a request of this connection runs with.
    fn context<'a>(&'a self, reads: &'a mut Prefetch) -> RequestContext<'a> {
        RequestContext {
            shared: &self.shared,
            conn: self.id,
            reads,
            local: self.local,
        }
    }

    /// Counts a request once, however many steps it runs in.
    fn count_request(&self) {
        Counters::bump(&self.shared.core.counters.total_commands_processed);
    }

    /// One step of the retrieval at the front of the input.
    fn retrieve(
        &mut self,
        retrieval: text::Retrieval,
        input: &[u8],
        out: &mut Output,
        reads: &mut Prefetch,
    ) -> Step {
        match retrieval.run(self.context(reads), input, out) {
            Err(()) => {
                self.retrieval = Some(retrieval);
                Step::Await(retrieval.len)
            }
            Ok(Some(rest)) => {
                self.retrieval = Some(rest);
                Step::Partial
            }
            Ok(None) => Step::Consumed(retrieval.len),
        }
    }

    /// Executes one request (`len` bytes long); false closes the connection.
    fn execute(
        &mut self,
        request: Request<'_>,
        len: usize,
        out: &mut Output,
        reads: &mut Prefetch,
    ) -> bool {
        self.count_request();
        match request {
            Request::Quit => return false,
            Request::Operator(operator) => return operator::execute(&self.shared, operator, out),
            Request::Watch(names) => self.watch(&names, out),
            Request::Meta(meta) => {
                Counters::bump(&self.shared.core.counters.cmd_meta);
                meta::execute(self.context(reads), &meta, out)
            }
            Request::Crawler(command) => {
                let (cache, crawler) = (self.shared.core.strings.engine(), &self.shared.crawler);
                self.dump = crawler::execute(cache, crawler, command, out).map(|dump| (dump, len));
            }
            Request::Error { reply, noreply } => {
                Counters::bump(&self.shared.core.counters.protocol_errors);
                if !noreply {
                    line(out, reply);
                }
            }
            other => text::execute(self.context(reads), other, out),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exptime_follows_memcached_rules() {
        let now = 1_700_000_000_000;
        assert_eq!(Expiry::from_exptime(0, now), Expiry::Never);
        assert_eq!(Expiry::from_exptime(-1, now), Expiry::Past);
        assert_eq!(Expiry::from_exptime(10, now), Expiry::At(now + 10_000));
        assert_eq!(Expiry::from_exptime(1_000_000_000, now), Expiry::Past);
        assert_eq!(
            Expiry::from_exptime(1_800_000_000, now),
            Expiry::At(1_800_000_000_000)
        );
        assert_eq!(Expiry::from_exptime(i64::MAX, now), Expiry::At(u64::MAX));
    }

    #[test]
    fn counters_parse_like_strtoull() {
        assert_eq!(parse_counter(b"10"), Some(10));
        assert_eq!(parse_counter(b"9 "), Some(9));
        assert_eq!(parse_counter(b"9 x"), Some(9));
        assert_eq!(parse_counter(b"x"), None);
        assert_eq!(parse_counter(b""), None);
        assert_eq!(parse_counter(b"12a"), None);
        assert_eq!(parse_counter(b"99999999999999999999999"), None);
    }
}
