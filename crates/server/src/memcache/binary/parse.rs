//! memcached's binary protocol framing: the 24-byte request header, each command's
//! extras/key/value layout checked as memcached's `dispatch_bin_command` checks it, and
//! the response packets. Every length comes from the network, so each is checked before
//! it is used, and a body is buffered only once it is known to be accepted.

use crate::memcache::parse::{KEY_MAX, StoreMode};
use crate::transport::prefetch::Access;
use zipcache::GetOptions;

/// The first byte of every request; a connection whose first byte is this speaks binary.
pub const REQUEST_MAGIC: u8 = 0x80;
const RESPONSE_MAGIC: u8 = 0x81;
pub const HEADER_LEN: usize = 24;
/// memcached's `ITEM_SIZE_MAX_UPPER_LIMIT`: a longer body is refused before anything
/// else, and the connection closed.
const BODY_MAX: u32 = 1024 * 1024 * 1024;
/// memcached's `MAX_SASL_MECH_LEN`.
const SASL_MECHANISM_MAX: usize = 32;
/// Longest SASL message accepted (PLAIN's `\0user\0password`, a CRAM-MD5 answer), as
/// ascii auth's token.
const SASL_DATA_MAX: usize = 16384;

pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// The quiet opcode's loud twin, and whether it was quiet.
fn unquiet(op: u8) -> (u8, bool) {
    use opcode::*;
    let loud = match op {
        GETQ => GET,
        GETKQ => GETK,
        SETQ => SET,
        ADDQ => ADD,
        REPLACEQ => REPLACE,
        DELETEQ => DELETE,
        INCREMENTQ => INCREMENT,
        DECREMENTQ => DECREMENT,
        QUITQ => QUIT,
        FLUSHQ => FLUSH,
        APPENDQ => APPEND,
        PREPENDQ => PREPEND,
        GATQ => GAT,
        GATKQ => GATK,
        other => return (other, false),
    };
    (loud, true)
}

/// Response status codes (memcached's `protocol_binary_response_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    Success = 0x00,
    KeyNotFound = 0x01,
    KeyExists = 0x02,
    TooLarge = 0x03,
    InvalidArguments = 0x04,
    NotStored = 0x05,
    NonNumeric = 0x06,
    AuthError = 0x20,
    /// A SASL exchange goes on: the body is the server's challenge.
    AuthContinue = 0x21,
    UnknownCommand = 0x81,
    InternalError = 0x84,
}

impl Status {
    /// The body memcached's `write_bin_error` sends with the status.
    fn message(self) -> &'static str {
        match self {
            Status::Success => "",
            Status::KeyNotFound => "Not found",
            Status::KeyExists => "Data exists for key.",
            Status::TooLarge => "Too large.",
            Status::InvalidArguments => "Invalid arguments",
            Status::NotStored => "Not stored.",
            Status::NonNumeric => "Non-numeric server-side value for incr or decr",
            Status::AuthError => "Auth failure.",
            Status::AuthContinue => "",
            Status::UnknownCommand => "Unknown command",
            Status::InternalError => "Internal error",
        }
    }
}

/// A request header, in host order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub opcode: u8,
    pub key_len: u16,
    pub extras_len: u8,
    pub body_len: u32,
    pub opaque: u32,
    pub cas: u64,
}

/// What the header at the front of the input is.
#[derive(Debug, PartialEq, Eq)]
pub enum Framed {
    Incomplete,
    /// Not a request magic: memcached closes the connection.
    BadMagic,
    Header(Header),
}

impl Header {
    pub fn parse(input: &[u8]) -> Framed {
        let Some(bytes) = input.first_chunk::<HEADER_LEN>() else {
            return Framed::Incomplete;
        };
        if bytes[0] != REQUEST_MAGIC {
            return Framed::BadMagic;
        }
        let be16 = |at: usize| u16::from_be_bytes([bytes[at], bytes[at + 1]]);
        let be32 = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        Framed::Header(Header {
            opcode: bytes[1],
            key_len: be16(2),
            extras_len: bytes[4],
            body_len: be32(8),
            opaque: be32(12),
            cas: u64::from_be_bytes(bytes[16..24].try_into().unwrap()),
        })
    }

    /// What may run before the client authenticates (memcached's `authenticated`).
    pub fn allowed_unauthenticated(&self) -> bool {
        matches!(
            self.opcode,
            opcode::SASL_LIST_MECHS | opcode::SASL_AUTH | opcode::SASL_STEP | opcode::VERSION
        )
    }

    fn extras_end(&self) -> usize {
        HEADER_LEN + usize::from(self.extras_len)
    }

    fn key_end(&self) -> usize {
        self.extras_end() + usize::from(self.key_len)
    }

    fn value_len(&self) -> usize {
        self.body_len as usize - usize::from(self.extras_len) - usize::from(self.key_len)
    }

    /// The whole request's length.
    fn len(&self) -> usize {
        HEADER_LEN + self.body_len as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// GET/GETK/GAT/GATK and their quiet forms; `touch` re-dates (GAT) first.
    Get {
        key: &'a [u8],
        with_key: bool,
        touch: Option<u32>,
    },
    Touch {
        key: &'a [u8],
        exptime: u32,
    },
    /// SET/ADD/REPLACE/APPEND/PREPEND; the header's CAS, when not 0, must match.
    Store {
        mode: StoreMode,
        key: &'a [u8],
        flags: u32,
        exptime: u32,
        value: &'a [u8],
    },
    /// A store whose value is over the size limit: refused, its value not read.
    TooLarge {
        key: &'a [u8],
        mode: StoreMode,
    },
    Delete {
        key: &'a [u8],
    },
    Arith {
        key: &'a [u8],
        incr: bool,
        delta: u64,
        initial: u64,
        /// `0xffffffff`: a missing counter is not created.
        exptime: u32,
    },
    Quit,
    Flush {
        delay: u32,
    },
    Noop,
    Version,
    Stat {
        group: &'a [u8],
    },
    SaslListMechs,
    SaslAuth {
        mechanism: &'a [u8],
        data: &'a [u8],
    },
    /// The mechanism named is not looked at, as memcached's (Cyrus SASL continues the
    /// exchange `SaslAuth` started).
    SaslStep {
        data: &'a [u8],
    },
}

impl Command<'_> {
    /// What the command does to the store, for the SSD read-ahead (`prefetch`).
    pub fn access(&self) -> Access<'_> {
        match *self {
            Command::Get {
                key, touch: None, ..
            } => Access::Reads(vec![key], GetOptions::default()),
            Command::Store { key, mode, .. } => mode.access(key),
            Command::Get { key, .. }
            | Command::Touch { key, .. }
            | Command::TooLarge { key, .. }
            | Command::Delete { key }
            | Command::Arith { key, .. } => Access::Changes(vec![key]),
            Command::Noop
            | Command::Version
            | Command::SaslListMechs
            | Command::SaslAuth { .. }
            | Command::SaslStep { .. } => Access::Changes(Vec::new()),
            Command::Quit | Command::Flush { .. } | Command::Stat { .. } => Access::Barrier,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub header: Header,
    pub command: Command<'a>,
    /// A quiet opcode: answered only on error.
    pub quiet: bool,
}

/// What the request behind a header amounts to.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    Incomplete,
    /// Runs; it spans `len` bytes of the input, and `swallow` more follow it that are
    /// discarded unread (a refused value).
    Request {
        request: Request<'a>,
        len: usize,
        swallow: usize,
    },
    /// Refused with `status` after `len` bytes, `swallow` more discarded; `close`: the
    /// connection is closed after the reply, as memcached does for malformed headers.
    Refused {
        status: Status,
        len: usize,
        swallow: usize,
        close: bool,
    },
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes[..4].try_into().unwrap())
}

fn be64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes[..8].try_into().unwrap())
}

/// The request behind `header` at the front of `input`; values over `max_value` bytes
/// are refused without being buffered.
pub fn parse<'a>(header: &Header, input: &'a [u8], max_value: usize) -> Parsed<'a> {
    use opcode::*;
    let (extras_len, key_len, body_len) = (
        usize::from(header.extras_len),
        usize::from(header.key_len),
        header.body_len as usize,
    );
    let close = |status| Parsed::Refused {
        status,
        len: HEADER_LEN,
        swallow: 0,
        close: true,
    };
    if key_len + extras_len > body_len {
        return close(Status::UnknownCommand);
    }
    if header.body_len > BODY_MAX || key_len > KEY_MAX {
        return close(Status::InvalidArguments);
    }
    let (op, quiet) = unquiet(header.opcode);
    let value_len = header.value_len();
    let no_value = value_len == 0;
    let valid = match op {
        VERSION | NOOP | QUIT | SASL_LIST_MECHS => body_len == 0,
        FLUSH => key_len == 0 && no_value && matches!(extras_len, 0 | 4),
        SET | ADD | REPLACE => extras_len == 8 && key_len > 0,
        APPEND | PREPEND => extras_len == 0 && key_len > 0,
        GET | GETK | DELETE => extras_len == 0 && key_len > 0 && no_value,
        INCREMENT | DECREMENT => extras_len == 20 && key_len > 0 && no_value,
        TOUCH | GAT | GATK => extras_len == 4 && key_len > 0 && no_value,
        STAT => extras_len == 0 && no_value,
        SASL_AUTH | SASL_STEP => extras_len == 0 && key_len > 0,
        _ => {
            // Unknown: answered, and its body skipped.
            return Parsed::Refused {
                status: Status::UnknownCommand,
                len: HEADER_LEN,
                swallow: body_len,
                close: false,
            };
        }
    };
    if !valid {
        return close(Status::InvalidArguments);
    }
    let Some(head) = input.get(..header.key_end()) else {
        return Parsed::Incomplete;
    };
    let extras = &head[HEADER_LEN..header.extras_end()];
    let key = &head[header.extras_end()..];
    let store_mode = match op {
        SET => Some(StoreMode::Set),
        ADD => Some(StoreMode::Add),
        REPLACE => Some(StoreMode::Replace),
        APPEND => Some(StoreMode::Append),
        PREPEND => Some(StoreMode::Prepend),
        _ => None,
    };
    let refuse_value = |status| Parsed::Refused {
        status,
        len: head.len(),
        swallow: value_len,
        close: false,
    };
    if let Some(mode) = store_mode
        && value_len > max_value
    {
        let command = Command::TooLarge { key, mode };
        return Parsed::Request {
            request: Request {
                header: *header,
                command,
                quiet,
            },
            len: head.len(),
            swallow: value_len,
        };
    }
    if matches!(op, SASL_AUTH | SASL_STEP)
        && (key_len > SASL_MECHANISM_MAX || value_len > SASL_DATA_MAX)
    {
        return refuse_value(Status::InvalidArguments);
    }
    let Some(body) = input.get(..header.len()) else {
        return Parsed::Incomplete;
    };
    let value = &body[head.len()..];
    let command = match (op, store_mode) {
        (_, Some(mode)) => Command::Store {
            mode,
            key,
            flags: if extras.is_empty() { 0 } else { be32(extras) },
            exptime: if extras.is_empty() {
                0
            } else {
                be32(&extras[4..])
            },
            value,
        },
        (GET | GETK, _) => Command::Get {
            key,
            with_key: op == GETK,
            touch: None,
        },
        (GAT | GATK, _) => Command::Get {
            key,
            with_key: op == GATK,
            touch: Some(be32(extras)),
        },
        (TOUCH, _) => Command::Touch {
            key,
            exptime: be32(extras),
        },
        (DELETE, _) => Command::Delete { key },
        (INCREMENT | DECREMENT, _) => Command::Arith {
            key,
            incr: op == INCREMENT,
            delta: be64(extras),
            initial: be64(&extras[8..]),
            exptime: be32(&extras[16..]),
        },
        (QUIT, _) => Command::Quit,
        (FLUSH, _) => Command::Flush {
            delay: if extras.is_empty() { 0 } else { be32(extras) },
        },
        (NOOP, _) => Command::Noop,
        (VERSION, _) => Command::Version,
        (STAT, _) => Command::Stat { group: key },
        (SASL_LIST_MECHS, _) => Command::SaslListMechs,
        (SASL_AUTH, _) => Command::SaslAuth {
            mechanism: key,
            data: value,
        },
        (SASL_STEP, _) => Command::SaslStep { data: value },
        // Unknown opcodes were answered above.
        _ => {
            return Parsed::Refused {
                status: Status::UnknownCommand,
                len: body.len(),
                swallow: 0,
                close: false,
            };
        }
    };
    Parsed::Request {
        request: Request {
            header: *header,
            command,
            quiet,
        },
        len: body.len(),
        swallow: 0,
    }
}

/// Appends a response packet answering `header`.
pub fn respond(
    out: &mut Vec<u8>,
    header: &Header,
    status: Status,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    let body_len = extras.len() + key.len() + value.len();
    out.reserve(HEADER_LEN + body_len);
    out.push(RESPONSE_MAGIC);
    out.push(header.opcode);
    // Keys are at most KEY_MAX (stat names shorter still), extras at most 4 bytes, and
    // bodies at most a value: the narrowing casts cannot truncate.
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.push(0);
    out.extend_from_slice(&(status as u16).to_be_bytes());
    out.extend_from_slice(&(body_len as u32).to_be_bytes());
    out.extend_from_slice(&header.opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Appends an error response with memcached's text for `status`.
pub fn respond_error(out: &mut Vec<u8>, header: &Header, status: Status) {
    respond(
        out,
        header,
        status,
        0,
        &[],
        &[],
        status.message().as_bytes(),
    );
}

/// Builds a request packet (tests, fuzzing seeds).
pub fn request(op: u8, extras: &[u8], key: &[u8], value: &[u8], opaque: u32, cas: u64) -> Vec<u8> {
    let mut packet = vec![REQUEST_MAGIC, op];
    packet.extend_from_slice(&(key.len() as u16).to_be_bytes());
    packet.push(extras.len() as u8);
    packet.extend_from_slice(&[0, 0, 0]);
    let body_len = (extras.len() + key.len() + value.len()) as u32;
    packet.extend_from_slice(&body_len.to_be_bytes());
    packet.extend_from_slice(&opaque.to_be_bytes());
    packet.extend_from_slice(&cas.to_be_bytes());
    packet.extend_from_slice(extras);
    packet.extend_from_slice(key);
    packet.extend_from_slice(value);
    packet
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(packet: &[u8]) -> Parsed<'_> {
        match Header::parse(packet) {
            Framed::Header(header) => parse(&header, packet, 1024),
            other => panic!("{other:?}"),
        }
    }

    fn command(packet: &[u8]) -> (Command<'_>, bool) {
        match parsed(packet) {
            Parsed::Request {
                request,
                len,
                swallow: 0,
            } => {
                assert_eq!(len, packet.len());
                (request.command, request.quiet)
            }
            other => panic!("{other:?}"),
        }
    }

    fn refused(packet: &[u8]) -> (Status, usize, usize, bool) {
        match parsed(packet) {
            Parsed::Refused {
                status,
                len,
                swallow,
                close,
            } => (status, len, swallow, close),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn headers_need_24_bytes_and_the_request_magic() {
        let get = request(opcode::GET, &[], b"k", &[], 7, 0);
        assert_eq!(Header::parse(&get[..23]), Framed::Incomplete);
        let Framed::Header(header) = Header::parse(&get) else {
            panic!()
        };
        assert_eq!(
            (
                header.opcode,
                header.key_len,
                header.body_len,
                header.opaque
            ),
            (opcode::GET, 1, 1, 7)
        );
        assert_eq!(Header::parse(&[0x81; 24]), Framed::BadMagic);
        assert_eq!(
            Header::parse(b"get k\r\n0123456789abcdefghijk"),
            Framed::BadMagic
        );
    }

    #[test]
    fn commands_parse_with_their_extras() {
        let set = request(opcode::SETQ, &[0, 0, 0, 5, 0, 0, 0, 9], b"k", b"val", 0, 3);
        assert_eq!(
            command(&set),
            (
                Command::Store {
                    mode: StoreMode::Set,
                    key: b"k",
                    flags: 5,
                    exptime: 9,
                    value: b"val"
                },
                true
            )
        );
        let mut extras = 2u64.to_be_bytes().to_vec();
        extras.extend_from_slice(&10u64.to_be_bytes());
        extras.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            command(&request(opcode::DECREMENT, &extras, b"n", &[], 0, 0)),
            (
                Command::Arith {
                    key: b"n",
                    incr: false,
                    delta: 2,
                    initial: 10,
                    exptime: u32::MAX
                },
                false
            )
        );
        assert_eq!(
            command(&request(opcode::GATKQ, &[0, 0, 1, 0], b"k", &[], 0, 0)),
            (
                Command::Get {
                    key: b"k",
                    with_key: true,
                    touch: Some(256)
                },
                true
            )
        );
        assert_eq!(
            command(&request(opcode::APPEND, &[], b"k", b"x", 0, 0)).0,
            Command::Store {
                mode: StoreMode::Append,
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"x"
            }
        );
        assert_eq!(
            command(&request(opcode::FLUSHQ, &[0, 0, 0, 1], &[], &[], 0, 0)),
            (Command::Flush { delay: 1 }, true)
        );
        assert_eq!(
            command(&request(opcode::STAT, &[], b"settings", &[], 0, 0)).0,
            Command::Stat { group: b"settings" }
        );
        assert_eq!(
            command(&request(opcode::SASL_AUTH, &[], b"PLAIN", b"\0u\0p", 0, 0)).0,
            Command::SaslAuth {
                mechanism: b"PLAIN",
                data: b"\0u\0p"
            }
        );
    }

    #[test]
    fn partial_requests_wait_for_their_bytes() {
        let set = request(opcode::SET, &[0; 8], b"key", b"value", 0, 0);
        for cut in HEADER_LEN..set.len() {
            let Framed::Header(header) = Header::parse(&set[..cut]) else {
                panic!()
            };
            assert_eq!(parse(&header, &set[..cut], 1024), Parsed::Incomplete);
        }
    }

    #[test]
    fn malformed_requests_get_memcached_statuses() {
        use Status::*;
        // Extras and key longer than the body: closed.
        let mut bad = request(opcode::GET, &[], b"key", &[], 0, 0);
        bad[11] = 1;
        assert_eq!(refused(&bad), (UnknownCommand, HEADER_LEN, 0, true));
        // A get with extras, a set without, a get with a value, a long key, a noop with
        // a body: invalid, closed.
        for packet in [
            request(opcode::GET, &[0; 4], b"k", &[], 0, 0),
            request(opcode::SET, &[], b"k", b"v", 0, 0),
            request(opcode::SET, &[0; 8], &[], b"v", 0, 0),
            request(opcode::GET, &[], b"k", b"v", 0, 0),
            request(opcode::GET, &[], &[b'k'; 251], &[], 0, 0),
            request(opcode::NOOP, &[], &[], b"v", 0, 0),
            request(opcode::INCREMENT, &[0; 8], b"k", &[], 0, 0),
            request(opcode::TOUCH, &[], b"k", &[], 0, 0),
            request(opcode::FLUSH, &[0; 2], &[], &[], 0, 0),
            request(opcode::SASL_AUTH, &[], &[], b"x", 0, 0),
        ] {
            assert_eq!(refused(&packet), (InvalidArguments, HEADER_LEN, 0, true));
        }
        // Unknown opcodes: answered, the body skipped unread, the connection kept.
        let unknown = request(0x1b, &[0; 4], &[], &[], 0, 0);
        assert_eq!(
            refused(&unknown[..HEADER_LEN]),
            (UnknownCommand, HEADER_LEN, 4, false)
        );
        // A body past memcached's upper limit is refused before anything is buffered.
        let mut huge = request(opcode::SET, &[0; 8], b"k", &[], 0, 0);
        huge[8..12].copy_from_slice(&(BODY_MAX + 1).to_be_bytes());
        assert_eq!(refused(&huge), (InvalidArguments, HEADER_LEN, 0, true));
        // An oversized SASL mechanism: refused, its data skipped.
        let sasl = request(opcode::SASL_AUTH, &[], &[b'M'; 33], b"data", 0, 0);
        assert_eq!(
            refused(&sasl),
            (InvalidArguments, HEADER_LEN + 33, 4, false)
        );
    }

    #[test]
    fn an_oversized_value_is_refused_without_reading_it() {
        let set = request(opcode::SET, &[0; 8], b"k", &[b'v'; 1025], 0, 0);
        // Only header, extras and key are needed to refuse it.
        let head = &set[..HEADER_LEN + 9];
        let Framed::Header(header) = Header::parse(head) else {
            panic!()
        };
        match parse(&header, head, 1024) {
            Parsed::Request {
                request,
                len,
                swallow,
            } => {
                assert_eq!(
                    request.command,
                    Command::TooLarge {
                        key: b"k",
                        mode: StoreMode::Set
                    }
                );
                assert_eq!((len, swallow), (HEADER_LEN + 9, 1025));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn responses_echo_opcode_and_opaque() {
        let Framed::Header(header) =
            Header::parse(&request(opcode::GETK, &[], b"k", &[], 0xdead, 0))
        else {
            panic!()
        };
        let mut out = Vec::new();
        respond(
            &mut out,
            &header,
            Status::Success,
            9,
            &[0, 0, 0, 1],
            b"k",
            b"vv",
        );
        assert_eq!(
            out,
            [
                &[0x81, opcode::GETK, 0, 1, 4, 0, 0, 0, 0, 0, 0, 7][..],
                &0xdeadu32.to_be_bytes(),
                &9u64.to_be_bytes(),
                &[0, 0, 0, 1],
                b"k",
                b"vv"
            ]
            .concat()
        );
        out.clear();
        respond_error(&mut out, &header, Status::KeyNotFound);
        assert_eq!(&out[6..8], &[0, 1]);
        assert_eq!(&out[HEADER_LEN..], b"Not found");
    }
}
