//! memcached's binary protocol, spoken by a connection whose first byte is the request
//! magic (as memcached decides it). Each command runs through the same engine paths as
//! its text twin (`text.rs`): the same counters, log events, annotations and SSD
//! read-ahead. A reply holds at most one item, so the output budget is kept by the
//! connection loop between requests. SASL (`sasl.rs`) checks the server's one access
//! policy.

pub mod parse;
pub mod sasl;

use zipcache::Update;

use super::parse::StoreMode;
use super::text::{self, Counted, Counting, FlushRefused, StoreOutcome, Storing};
use super::watch::CloseReason;
use super::{Expiry, MemcacheSession, Memcached, RequestContext};
use crate::core::stats::Counters;
use crate::transport::connection::Step;
use crate::transport::prefetch::{Prefetch, ReadAhead};
use parse::{Command, Framed, Header, Parsed, Request, Status};

/// A binary incr/decr with this expiry does not create a missing counter.
const NO_CREATE: u32 = u32::MAX;

impl MemcacheSession {
    /// One binary request at the front of `input`.
    pub(super) fn step_binary(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        reads: &mut Prefetch,
    ) -> Step {
        let header = match Header::parse(input) {
            Framed::Incomplete => return Step::NeedMore,
            Framed::BadMagic => return self.close_on_error(),
            Framed::Header(header) => header,
        };
        if !self.authenticated && !header.allowed_unauthenticated() {
            // Then hang up, as memcached does: its clients take the reset their next
            // request meets as the sign to open a new connection and log in there.
            self.count_request();
            parse::respond_error(out, &header, Status::AuthError);
            self.close_reason = CloseReason::Error;
            return Step::HangUp;
        }
        let (request, len, swallow) = match parse::parse(&header, input, self.shared.core.max_value)
        {
            Parsed::Incomplete => return Step::NeedMore,
            Parsed::Refused {
                status,
                len,
                swallow,
                close,
            } => {
                self.count_request();
                Counters::bump(&self.shared.core.counters.protocol_errors);
                parse::respond_error(out, &header, status);
                if close {
                    return self.close_on_error();
                }
                self.swallow = swallow;
                return Step::Consumed(len);
            }
            Parsed::Request {
                request,
                len,
                swallow,
            } => (request, len, swallow),
        };
        if reads.admit(&self.shared.core.strings, || request.command.access()) == 0 {
            return Step::Await(len);
        }
        self.count_request();
        self.swallow = swallow;
        if self.execute_binary(&request, out, reads) {
            Step::Consumed(len)
        } else {
            Step::Close
        }
    }

    /// The length of the complete binary request at the front of `input` once `ahead`
    /// walked past it (`Session::read_ahead`).
    pub(super) fn read_ahead_binary(
        &self,
        input: &[u8],
        ahead: &mut ReadAhead<'_>,
    ) -> Option<usize> {
        let Framed::Header(header) = Header::parse(input) else {
            return None;
        };
        match parse::parse(&header, input, self.shared.core.max_value) {
            Parsed::Request {
                request,
                len,
                swallow: 0,
            } => ahead
                .pass(&self.shared.core.strings, &request.command.access())
                .then_some(len),
            _ => None,
        }
    }

    fn close_on_error(&mut self) -> Step {
        self.close_reason = CloseReason::Error;
        Step::Close
    }

    /// Runs `request`; false closes the connection (QUIT, the last failed login allowed).
    fn execute_binary(
        &mut self,
        request: &Request<'_>,
        out: &mut Vec<u8>,
        reads: &mut Prefetch,
    ) -> bool {
        let shared = &*self.shared;
        let mut cx = RequestContext {
            shared,
            conn: self.id,
            reads,
            local: self.local,
        };
        let header = &request.header;
        // Successes of quiet commands are not answered; errors always are.
        let mut reply = Reply {
            out,
            header,
            quiet: request.quiet,
        };
        match request.command {
            Command::Get {
                key,
                with_key,
                touch,
            } => get(&mut cx, key, with_key, touch, &mut reply),
            Command::Touch { key, exptime } => {
                Counters::bump(&shared.core.counters.cmd_touch);
                match text::touch_metadata(shared, key, i64::from(exptime)) {
                    Ok(Some(info)) => {
                        reply.success(info.cas, &info.flags.to_be_bytes(), &[], &[]);
                    }
                    Ok(None) => reply.error(Status::KeyNotFound),
                    Err(e) => reply.engine_error(&e),
                }
            }
            Command::Store {
                mode,
                key,
                flags,
                exptime,
                value,
            } => store(&mut cx, mode, key, flags, exptime, value, &mut reply),
            Command::TooLarge { key, mode } => {
                Counters::bump(&shared.core.counters.store_too_large);
                // memcached unlinks the old value of a refused set, never leaving it stale.
                if mode == StoreMode::Set {
                    let _ = shared.core.strings.delete(key);
                }
                reply.error(Status::TooLarge);
            }
            Command::Delete { key } => delete(shared, key, header.cas, &mut reply),
            Command::Arith {
                key,
                incr,
                delta,
                initial,
                exptime,
            } => {
                let counting = Counting {
                    create: (exptime != NO_CREATE).then(|| {
                        let now = shared.core.strings.engine().now_ms();
                        (initial, Expiry::from_exptime(i64::from(exptime), now))
                    }),
                    compare: (header.cas != 0).then_some(header.cas),
                };
                match text::count(shared, key, delta, incr, counting) {
                    Ok((Counted::Value(n), cas)) => {
                        reply.success(cas.unwrap_or(0), &[], &[], &n.to_be_bytes());
                    }
                    Ok((Counted::Missing, _)) => reply.error(Status::KeyNotFound),
                    Ok((Counted::Mismatch, _)) => reply.error(Status::KeyExists),
                    Ok((Counted::NonNumeric, _)) => reply.error(Status::NonNumeric),
                    Err(e) => reply.engine_error(&e),
                }
            }
            Command::Quit => {
                reply.success(0, &[], &[], &[]);
                return false;
            }
            Command::Flush { delay } => {
                Counters::bump(&shared.core.counters.cmd_flush);
                match text::flush_all(shared, i64::from(delay)) {
                    Ok(()) => reply.success(0, &[], &[], &[]),
                    // memcached's status for a refused flush.
                    Err(FlushRefused::Disabled) => reply.error(Status::AuthError),
                    Err(FlushRefused::Engine(e)) => reply.engine_error(&e),
                }
            }
            Command::Noop => reply.success(0, &[], &[], &[]),
            Command::Version => reply.success(0, &[], &[], text::VERSION.as_bytes()),
            Command::Stat { group } => stat(shared, group, &mut reply),
            Command::SaslListMechs if shared.core.access.required() => {
                reply.success(0, &[], &[], sasl::MECHANISMS);
            }
            // Either logs the connection out first, as memcached's (`init_sasl_conn`):
            // a step after a login, which has no exchange to continue, ends it.
            Command::SaslAuth { mechanism, data } if shared.core.access.required() => {
                self.authenticated = false;
                let outcome = self.sasl.start(&shared.core.access, mechanism, data);
                return self.sasl_reply(outcome, &mut reply);
            }
            Command::SaslStep { data } if shared.core.access.required() => {
                self.authenticated = false;
                let outcome = self.sasl.step(&shared.core.access, data);
                return self.sasl_reply(outcome, &mut reply);
            }
            // As memcached without SASL.
            Command::SaslListMechs | Command::SaslAuth { .. } | Command::SaslStep { .. } => {
                reply.error(Status::UnknownCommand);
            }
        }
        true
    }

    /// Answers a SASL command as memcached does, counting what it counts: a login and a
    /// refusal in `auth_cmds`, a refusal in `auth_errors`, a challenge in neither. False
    /// after the last refusal a connection is allowed (`Logins`): it closes.
    fn sasl_reply(&mut self, outcome: sasl::Outcome, reply: &mut Reply<'_>) -> bool {
        let counters = &self.shared.core.counters;
        match outcome {
            sasl::Outcome::Authenticated => {
                self.logins.attempted(true, counters);
                self.authenticated = true;
                reply.success(0, &[], &[], b"Authenticated");
            }
            sasl::Outcome::Continue(challenge) => parse::respond(
                reply.out,
                reply.header,
                Status::AuthContinue,
                0,
                &[],
                &[],
                &challenge,
            ),
            sasl::Outcome::Failed => {
                reply.error(Status::AuthError);
                if self.logins.attempted(false, counters) {
                    self.close_reason = CloseReason::Error;
                    return false;
                }
            }
        }
        true
    }
}

/// The reply to a request over `--max-request-size`, before the connection closes: its
/// header may not even be complete, so the response names no opcode or opaque.
pub(super) fn request_too_large(out: &mut Vec<u8>) {
    let unknown = Header {
        opcode: 0,
        key_len: 0,
        extras_len: 0,
        body_len: 0,
        opaque: 0,
        cas: 0,
    };
    let message = super::REQUEST_TOO_LARGE.as_bytes();
    parse::respond(out, &unknown, Status::TooLarge, 0, &[], &[], message);
}

/// Where one request's response goes.
struct Reply<'a> {
    out: &'a mut Vec<u8>,
    header: &'a Header,
    quiet: bool,
}

impl Reply<'_> {
    fn success(&mut self, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
        if !self.quiet {
            parse::respond(
                self.out,
                self.header,
                Status::Success,
                cas,
                extras,
                key,
                value,
            );
        }
    }

    fn error(&mut self, status: Status) {
        parse::respond_error(self.out, self.header, status);
    }

    fn engine_error(&mut self, error: &zipcache::Error) {
        match error {
            zipcache::Error::EmptyKey | zipcache::Error::KeyTooLarge { .. } => {
                self.error(Status::InvalidArguments);
            }
            zipcache::Error::ValueTooLarge { .. } => self.error(Status::TooLarge),
            other => {
                let message = other.to_string();
                parse::respond(
                    self.out,
                    self.header,
                    Status::InternalError,
                    0,
                    &[],
                    &[],
                    message.as_bytes(),
                );
            }
        }
    }
}

fn get(
    cx: &mut RequestContext<'_>,
    key: &[u8],
    with_key: bool,
    touch: Option<u32>,
    reply: &mut Reply<'_>,
) {
    let returned_key = if with_key { key } else { &[] };
    match text::fetch(cx, key, touch.map(i64::from)) {
        // A hit is answered even by the quiet forms: it is what they are for.
        Ok(Some(item)) => {
            let flags = item.flags.to_be_bytes();
            let (out, header) = (&mut *reply.out, reply.header);
            parse::respond(
                out,
                header,
                Status::Success,
                item.cas,
                &flags,
                returned_key,
                &item.value,
            );
        }
        // A quiet get's miss is not an error: nothing is sent.
        Ok(None) if reply.quiet => {}
        // GETK's miss names the key, as memcached's: in the key field only.
        Ok(None) if with_key => {
            parse::respond(
                reply.out,
                reply.header,
                Status::KeyNotFound,
                0,
                &[],
                key,
                &[],
            );
        }
        Ok(None) => reply.error(Status::KeyNotFound),
        Err(e) => reply.engine_error(&e),
    }
}

fn store(
    cx: &mut RequestContext<'_>,
    mode: StoreMode,
    key: &[u8],
    flags: u32,
    exptime: u32,
    value: &[u8],
    reply: &mut Reply<'_>,
) {
    Counters::bump(&cx.shared.core.counters.cmd_set);
    let cas = reply.header.cas;
    // A CAS makes set/add/replace a compare-and-swap, and append/prepend conditional.
    let (mode, compare) = match mode {
        StoreMode::Append | StoreMode::Prepend => (mode, (cas != 0).then_some(cas)),
        _ if cas != 0 => (StoreMode::Cas(cas), None),
        _ => (mode, None),
    };
    let before = text::read_before(cx.reads, mode, key);
    let storing = Storing {
        mode,
        flags,
        expiry: Expiry::from_exptime(i64::from(exptime), cx.shared.core.strings.engine().now_ms()),
        data: value,
        cas: None,
        allow_stale: false,
        compare,
    };
    match text::store_item(cx.shared, cx.conn, key, &storing, before) {
        Ok((StoreOutcome::Stored { .. }, cas)) => reply.success(cas.unwrap_or(0), &[], &[], &[]),
        Ok((StoreOutcome::Exists, _)) => reply.error(Status::KeyExists),
        Ok((StoreOutcome::NotFound, _)) => reply.error(Status::KeyNotFound),
        Ok((StoreOutcome::NotStored, _)) => reply.error(match mode {
            StoreMode::Add => Status::KeyExists,
            StoreMode::Replace => Status::KeyNotFound,
            _ => Status::NotStored,
        }),
        Err(e) => reply.engine_error(&e),
    }
}

/// DELETE; a CAS other than 0 must be the item's.
fn delete(shared: &Memcached, key: &[u8], cas: u64, reply: &mut Reply<'_>) {
    let deleted = if cas == 0 {
        text::delete(shared, key).map(|hit| hit.then_some(true))
    } else {
        shared
            .annotations
            .update(&shared.core.strings, key, |current| match current {
                None => (Update::Keep.into(), None),
                Some(entry) if entry.item.cas != cas => (Update::Keep.into(), Some(false)),
                Some(_) => (Update::Delete.into(), Some(true)),
            })
            .map(|(outcome, _)| outcome)
    };
    if cas != 0
        && let Ok(outcome @ (None | Some(true))) = deleted
    {
        let counters = &shared.core.counters;
        Counters::hit_or_miss_of(
            &counters.delete_hits,
            &counters.delete_misses,
            outcome.is_some(),
        );
    }
    match deleted {
        Ok(Some(true)) => reply.success(0, &[], &[], &[]),
        Ok(Some(false)) => reply.error(Status::KeyExists),
        Ok(None) => reply.error(Status::KeyNotFound),
        Err(e) => reply.engine_error(&e),
    }
}

/// STAT: the text protocol's `stats` lines, one packet each (key the name, value the
/// value), then an empty packet; `detail dump` as one packet named `detailed`.
fn stat(shared: &Memcached, group: &[u8], reply: &mut Reply<'_>) {
    let mut lines = Vec::new();
    let detail = group.strip_prefix(b"detail ");
    match detail {
        Some(action) => text::stats_detail(shared, Some(action), &mut lines),
        None => text::stats(shared, (!group.is_empty()).then_some(group), &mut lines),
    }
    if detail == Some(b"dump") {
        let dump = lines.strip_suffix(b"END\r\n").unwrap_or(&lines);
        parse::respond(
            reply.out,
            reply.header,
            Status::Success,
            0,
            &[],
            b"detailed",
            dump,
        );
    } else {
        for line in lines.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(stat) = line.strip_prefix(b"STAT ") {
                let space = stat.iter().position(|&b| b == b' ').unwrap_or(stat.len());
                let (name, value) = (&stat[..space], stat.get(space + 1..).unwrap_or(&[]));
                parse::respond(
                    reply.out,
                    reply.header,
                    Status::Success,
                    0,
                    &[],
                    name,
                    value,
                );
            } else if line.starts_with(b"ERROR") || line.starts_with(b"CLIENT_ERROR") {
                return reply.error(Status::KeyNotFound);
            }
        }
    }
    parse::respond(reply.out, reply.header, Status::Success, 0, &[], &[], &[]);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::parse::{HEADER_LEN, opcode::*, request};
    use super::*;
    use crate::core::ServerOptions;
    use crate::core::access::Credentials;
    use crate::core::auth::Password;
    use crate::fuzzing::{memcached_session_with, options};
    use crate::serving_tests::{dram_engine, memcache_session};

    /// A response packet, fields in host order.
    #[derive(Debug, PartialEq, Eq)]
    struct Response {
        opcode: u8,
        status: u16,
        opaque: u32,
        cas: u64,
        extras: Vec<u8>,
        key: Vec<u8>,
        value: Vec<u8>,
    }

    fn responses(mut bytes: &[u8]) -> Vec<Response> {
        let mut all = Vec::new();
        while !bytes.is_empty() {
            assert_eq!(bytes[0], 0x81, "response magic");
            let key_len = usize::from(u16::from_be_bytes([bytes[2], bytes[3]]));
            let extras_len = usize::from(bytes[4]);
            let body_len = u32::from_be_bytes(bytes[8..12].try_into().unwrap()) as usize;
            let body = &bytes[HEADER_LEN..HEADER_LEN + body_len];
            all.push(Response {
                opcode: bytes[1],
                status: u16::from_be_bytes([bytes[6], bytes[7]]),
                opaque: u32::from_be_bytes(bytes[12..16].try_into().unwrap()),
                cas: u64::from_be_bytes(bytes[16..24].try_into().unwrap()),
                extras: body[..extras_len].to_vec(),
                key: body[extras_len..extras_len + key_len].to_vec(),
                value: body[extras_len + key_len..].to_vec(),
            });
            bytes = &bytes[HEADER_LEN + body_len..];
        }
        all
    }

    fn run_with(options: &ServerOptions, packets: &[Vec<u8>], chunk: usize) -> Vec<Response> {
        let input = packets.concat();
        responses(&memcached_session_with(
            dram_engine(),
            options,
            &input,
            chunk,
        ))
    }

    fn run(packets: &[Vec<u8>]) -> Vec<Response> {
        run_with(&options(), packets, 1 << 20)
    }

    fn set_extras(flags: u32, exptime: u32) -> Vec<u8> {
        [flags.to_be_bytes(), exptime.to_be_bytes()].concat()
    }

    fn arith_extras(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
        [
            &delta.to_be_bytes()[..],
            &initial.to_be_bytes(),
            &exptime.to_be_bytes(),
        ]
        .concat()
    }

    #[test]
    fn set_get_and_the_keyed_and_quiet_gets() {
        let got = run(&[
            request(SET, &set_extras(7, 0), b"k", b"hello", 1, 0),
            request(GET, &[], b"k", &[], 2, 0),
            request(GETK, &[], b"k", &[], 3, 0),
            request(GETQ, &[], b"missing", &[], 4, 0),
            request(GETKQ, &[], b"k", &[], 5, 0),
            request(GETK, &[], b"missing", &[], 6, 0),
            request(GET, &[], b"missing", &[], 7, 0),
            request(NOOP, &[], &[], &[], 8, 0),
        ]);
        let opaques: Vec<u32> = got.iter().map(|r| r.opaque).collect();
        // The quiet miss (4) is not answered at all.
        assert_eq!(opaques, [1, 2, 3, 5, 6, 7, 8]);
        let cas = got[0].cas;
        assert_ne!(cas, 0);
        assert_eq!(
            (
                got[1].status,
                got[1].cas,
                &got[1].extras[..],
                &got[1].key[..]
            ),
            (0, cas, &7u32.to_be_bytes()[..], &b""[..])
        );
        assert_eq!(got[1].value, b"hello");
        assert_eq!(
            (&got[2].key[..], &got[2].value[..]),
            (&b"k"[..], &b"hello"[..])
        );
        assert_eq!((got[3].opcode, &got[3].key[..]), (GETKQ, &b"k"[..]));
        // memcached 1.6 on the wire: the key once, and no value (body length = key).
        assert_eq!(
            (got[4].status, &got[4].key[..], &got[4].value[..]),
            (1, &b"missing"[..], &b""[..])
        );
        assert_eq!((got[5].status, &got[5].value[..]), (1, &b"Not found"[..]));
        assert_eq!((got[6].opcode, got[6].status), (NOOP, 0));
    }

    #[test]
    fn quiet_stores_answer_only_their_errors() {
        let got = run(&[
            request(SETQ, &set_extras(0, 0), b"a", b"1", 1, 0),
            request(ADDQ, &set_extras(0, 0), b"a", b"2", 2, 0),
            request(REPLACEQ, &set_extras(0, 0), b"nope", b"3", 3, 0),
            request(APPENDQ, &[], b"a", b"x", 4, 0),
            request(PREPENDQ, &[], b"nope", b"x", 5, 0),
            request(DELETEQ, &[], b"nope", &[], 6, 0),
            request(GET, &[], b"a", &[], 7, 0),
        ]);
        let summary: Vec<(u32, u16)> = got.iter().map(|r| (r.opaque, r.status)).collect();
        assert_eq!(summary, [(2, 2), (3, 1), (5, 5), (6, 1), (7, 0)]);
        assert_eq!(got[4].value, b"1x");
    }

    #[test]
    fn cas_guards_every_write() {
        let got = run(&[request(SET, &set_extras(0, 0), b"k", b"v1", 1, 0)]);
        let cas = got[0].cas;
        let got = run(&[
            request(SET, &set_extras(0, 0), b"k", b"v1", 1, 0),
            request(SET, &set_extras(0, 0), b"k", b"v2", 2, cas + 1000),
            request(APPEND, &[], b"k", b"!", 3, cas + 1000),
            request(DELETE, &[], b"k", &[], 4, cas + 1000),
            request(SET, &set_extras(0, 0), b"nope", b"v", 5, 9),
        ]);
        let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [0, 2, 2, 2, 1]);
        // With the item's own CAS, each goes through.
        let first = got[0].cas;
        let got = run(&[
            request(GET, &[], b"k", &[], 1, 0),
            request(SET, &set_extras(0, 0), b"k", b"v3", 2, first),
        ]);
        let current = got[0].cas;
        let got = run(&[
            request(SET, &set_extras(0, 0), b"k", b"v4", 1, current),
            request(DELETE, &[], b"k", &[], 2, 0),
        ]);
        assert_eq!((got[0].status, got[1].status), (0, 0));
    }

    #[test]
    fn incr_and_decr_create_count_and_refuse() {
        let got = run(&[
            request(INCREMENT, &arith_extras(1, 10, NO_CREATE), b"n", &[], 1, 0),
            request(INCREMENT, &arith_extras(1, 10, 0), b"n", &[], 2, 0),
            request(INCREMENT, &arith_extras(5, 0, 0), b"n", &[], 3, 0),
            request(DECREMENT, &arith_extras(100, 0, 0), b"n", &[], 4, 0),
            request(INCREMENTQ, &arith_extras(u64::MAX, 0, 0), b"n", &[], 5, 0),
            request(SET, &set_extras(0, 0), b"s", b"abc", 6, 0),
            request(INCREMENT, &arith_extras(1, 0, 0), b"s", &[], 7, 0),
            request(GET, &[], b"n", &[], 8, 0),
        ]);
        let summary: Vec<(u32, u16)> = got.iter().map(|r| (r.opaque, r.status)).collect();
        assert_eq!(
            summary,
            [(1, 1), (2, 0), (3, 0), (4, 0), (6, 0), (7, 6), (8, 0)]
        );
        let value = |r: &Response| u64::from_be_bytes(r.value[..].try_into().unwrap());
        assert_eq!(
            (value(&got[1]), value(&got[2]), value(&got[3])),
            (10, 15, 0)
        );
        assert_eq!(got[6].value, b"18446744073709551615");
    }

    #[test]
    fn malformed_headers_are_answered_then_closed() {
        let got = run(&[
            request(GET, &[0; 4], b"k", &[], 1, 0),
            request(NOOP, &[], &[], &[], 2, 0),
        ]);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].opaque, got[0].status), (1, 4));
        // Unknown opcodes are answered and skipped; the connection goes on.
        let got = run(&[
            request(0x1b, &[0; 4], &[], &[], 1, 0),
            request(NOOP, &[], &[], &[], 2, 0),
        ]);
        let summary: Vec<(u32, u16)> = got.iter().map(|r| (r.opaque, r.status)).collect();
        assert_eq!(summary, [(1, 0x81), (2, 0)]);
        // Text after binary is a bad magic: the connection closes without a reply.
        let mut input = request(NOOP, &[], &[], &[], 1, 0);
        input.extend_from_slice(b"get k\r\n0123456789012345678901234");
        let out = memcached_session_with(dram_engine(), &options(), &input, 7);
        assert_eq!(responses(&out).len(), 1);
    }

    #[test]
    fn a_value_over_the_limit_is_refused_and_skipped() {
        let options = ServerOptions {
            max_value_size: 100,
            ..options()
        };
        let got = run_with(
            &options,
            &[
                request(SET, &set_extras(0, 0), b"k", b"old", 1, 0),
                request(SET, &set_extras(0, 0), b"k", &[0x80; 500], 2, 0),
                request(GET, &[], b"k", &[], 3, 0),
            ],
            13,
        );
        let summary: Vec<(u32, u16)> = got.iter().map(|r| (r.opaque, r.status)).collect();
        // The old value is gone too, as memcached unlinks it.
        assert_eq!(summary, [(1, 0), (2, 3), (3, 1)]);
    }

    #[test]
    fn flush_quit_version_and_stats() {
        let disabled = ServerOptions {
            flush_all_enabled: false,
            ..options()
        };
        let got = run_with(&disabled, &[request(FLUSH, &[], &[], &[], 1, 0)], 64);
        assert_eq!(got[0].status, 0x20);
        let got = run(&[
            request(SET, &set_extras(0, 0), b"k", b"v", 1, 0),
            request(FLUSHQ, &[], &[], &[], 2, 0),
            request(GET, &[], b"k", &[], 3, 0),
            request(VERSION, &[], &[], &[], 4, 0),
            request(STAT, &[], b"settings", &[], 5, 0),
            request(STAT, &[], b"nonsense", &[], 6, 0),
            request(QUITQ, &[], &[], &[], 7, 0),
            request(NOOP, &[], &[], &[], 8, 0),
        ]);
        assert_eq!((got[1].opaque, got[1].status), (3, 1));
        assert!(got[2].value.starts_with(b"1.6.0-zipcache-"));
        let settings: Vec<&Response> = got.iter().filter(|r| r.opaque == 5).collect();
        assert!(
            settings
                .iter()
                .any(|r| r.key == b"flush_enabled" && r.value == b"yes")
        );
        let end = settings.last().unwrap();
        assert!(end.key.is_empty() && end.value.is_empty());
        assert_eq!(got.last().unwrap().opaque, 6);
        assert_eq!(got.last().unwrap().status, 1);
    }

    fn secured() -> ServerOptions {
        let users = Credentials::parse(b"foo:bar\n").unwrap();
        ServerOptions {
            requirepass: Password::new("secret"),
            users: Some(Arc::new(users)),
            ..options()
        }
    }

    fn plain(data: &[u8], opaque: u32) -> Vec<u8> {
        request(SASL_AUTH, &[], b"PLAIN", data, opaque, 0)
    }

    #[test]
    fn sasl_plain_logs_in_with_the_access_policy() {
        let got = run_with(
            &secured(),
            &[
                request(VERSION, &[], &[], &[], 1, 0),
                request(SASL_LIST_MECHS, &[], &[], &[], 2, 0),
                // A refused login keeps the connection, as memcached's.
                plain(b"\0foo\0wrong", 3),
                plain(b"\0default\0bar", 4),
                request(SASL_STEP, &[], b"PLAIN", b"x", 5, 0),
                plain(b"\0foo\0bar", 6),
                request(SET, &set_extras(0, 0), b"k", b"v", 7, 0),
                plain(b"\0default\0secret", 8),
                request(GET, &[], b"k", &[], 9, 0),
            ],
            5,
        );
        let summary: Vec<(u32, u16)> = got.iter().map(|r| (r.opaque, r.status)).collect();
        assert_eq!(
            summary,
            [
                (1, 0),
                (2, 0),
                (3, 0x20),
                (4, 0x20),
                (5, 0x20),
                (6, 0),
                (7, 0),
                (8, 0),
                (9, 0)
            ]
        );
        assert_eq!(got[1].value, b"CRAM-MD5 PLAIN");
        assert_eq!(got[5].value, b"Authenticated");
        // Without a policy, SASL is not served, as memcached without -S.
        let got = run(&[request(SASL_LIST_MECHS, &[], &[], &[], 1, 0)]);
        assert_eq!(got[0].status, 0x81);
    }

    #[test]
    fn an_unauthenticated_request_is_refused_then_hung_up() {
        use crate::transport::connection::Session;
        use crate::transport::output::Output;
        // Before a login, anything but SASL and VERSION is refused and the connection
        // hung up, as memcached does: nothing behind it is answered.
        for refused in [
            request(GET, &[], b"k", &[], 1, 0),
            request(SET, &set_extras(0, 0), b"k", &[0x80; 100], 1, 0),
            request(NOOP, &[], &[], &[], 1, 0),
        ] {
            let got = run_with(
                &secured(),
                &[
                    refused.clone(),
                    plain(b"\0foo\0bar", 2),
                    request(NOOP, &[], &[], &[], 3, 0),
                ],
                64,
            );
            let summary: Vec<(u32, u16)> = got.iter().map(|r| (r.opaque, r.status)).collect();
            assert_eq!(summary, [(1, 0x20)]);
            let mut session = memcache_session(dram_engine(), &secured());
            let (mut out, mut reads) = (Output::default(), Prefetch::default());
            assert!(matches!(
                session.step(&refused, &mut out, &mut reads),
                Step::HangUp
            ));
        }
        // A failed login logs out, and so does a step: PLAIN has none to take.
        for logout in [
            plain(b"\0foo\0wrong", 3),
            request(SASL_STEP, &[], b"PLAIN", b"x", 3, 0),
        ] {
            let got = run_with(
                &secured(),
                &[
                    plain(b"\0foo\0bar", 1),
                    request(GET, &[], b"k", &[], 2, 0),
                    logout,
                    request(GET, &[], b"k", &[], 4, 0),
                    request(NOOP, &[], &[], &[], 5, 0),
                ],
                64,
            );
            let summary: Vec<(u32, u16)> = got.iter().map(|r| (r.opaque, r.status)).collect();
            assert_eq!(summary, [(1, 0), (2, 1), (3, 0x20), (4, 0x20)]);
        }
    }

    #[test]
    fn sasl_cram_md5_answers_a_challenge_with_auth_continue() {
        use crate::transport::connection::Session;
        use crate::transport::output::Output;
        let mut session = memcache_session(dram_engine(), &secured());
        let mut exchange = |packet: Vec<u8>| {
            let (mut out, mut reads) = (Output::default(), Prefetch::default());
            let step = session.step(&packet, &mut out, &mut reads);
            assert!(matches!(step, Step::Consumed(n) if n == packet.len()));
            responses(&out).pop().unwrap()
        };
        let cram = |opaque| request(SASL_AUTH, &[], b"CRAM-MD5", &[], opaque, 0);
        let step =
            |response: &[u8], opaque| request(SASL_STEP, &[], b"CRAM-MD5", response, opaque, 0);
        let challenge = exchange(cram(1));
        assert_eq!((challenge.opaque, challenge.status), (1, 0x21));
        let digest = sasl::cram_md5_digest(b"bar", &challenge.value);
        let wrong = sasl::cram_md5_digest(b"baz", &challenge.value);
        assert_eq!(
            exchange(step(&[b"foo ", &wrong[..]].concat(), 2)).status,
            0x20
        );
        // The challenge was used up by the wrong answer.
        assert_eq!(
            exchange(step(&[b"foo ", &digest[..]].concat(), 3)).status,
            0x20
        );
        let challenge = exchange(cram(4)).value;
        let digest = sasl::cram_md5_digest(b"bar", &challenge);
        let logged_in = exchange(step(&[b"foo ", &digest[..]].concat(), 5));
        assert_eq!(
            (logged_in.status, &logged_in.value[..]),
            (0, &b"Authenticated"[..])
        );
        assert_eq!(exchange(request(GET, &[], b"k", &[], 6, 0)).status, 1);
        // memcached's counts: a login and each refusal, never the challenge.
        let (mut out, mut reads) = (Output::default(), Prefetch::default());
        session.step(&request(STAT, &[], &[], &[], 7, 0), &mut out, &mut reads);
        let stats = responses(&out);
        let stat = |name: &[u8]| {
            stats
                .iter()
                .find(|r| r.key == name)
                .map(|r| r.value.clone())
        };
        assert_eq!(stat(b"auth_cmds"), Some(b"3".to_vec()));
        assert_eq!(stat(b"auth_errors"), Some(b"2".to_vec()));
    }

    #[test]
    fn a_request_over_the_size_limit_is_refused_in_binary() {
        use crate::transport::connection::Session;
        use crate::transport::output::Output;
        let mut session = memcache_session(dram_engine(), &options());
        let (mut out, mut reads) = (Output::default(), Prefetch::default());
        let noop = request(NOOP, &[], &[], &[], 1, 0);
        assert!(matches!(
            session.step(&noop, &mut out, &mut reads),
            Step::Consumed(24)
        ));
        session.too_large(&mut out);
        let got = responses(&out);
        assert_eq!(
            (got[1].status, &got[1].value[..]),
            (3, super::super::REQUEST_TOO_LARGE.as_bytes())
        );
    }

    #[test]
    fn touch_and_gat_redate_and_return_flags() {
        let got = run(&[
            request(SET, &set_extras(3, 0), b"k", b"v", 1, 0),
            request(TOUCH, &[0, 0, 0, 100], b"k", &[], 2, 0),
            request(GAT, &[0, 0, 0, 100], b"k", &[], 3, 0),
            request(GATK, &[0, 0, 0, 100], b"nope", &[], 4, 0),
            request(GATQ, &[0, 0, 0, 100], b"nope", &[], 5, 0),
            request(TOUCH, &[0, 0, 0, 100], b"nope", &[], 6, 0),
        ]);
        let summary: Vec<(u32, u16)> = got.iter().map(|r| (r.opaque, r.status)).collect();
        assert_eq!(summary, [(1, 0), (2, 0), (3, 0), (4, 1), (6, 1)]);
        assert_eq!(
            (&got[1].extras[..], &got[1].value[..]),
            (&3u32.to_be_bytes()[..], &b""[..])
        );
        assert_eq!(got[2].value, b"v");
        assert_eq!(got[1].cas, got[0].cas);
    }
}
