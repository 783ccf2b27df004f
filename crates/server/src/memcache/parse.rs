//! memcached text-protocol framing: one request line (plus its data block for storage
//! commands) into a [`Request`] borrowing from the read buffer. Execution lives in
//! `text.rs` and `meta.rs`; this file only decides what the bytes mean and how many of
//! them the request spans, replying with memcached 1.6's own error strings.

use std::borrow::Cow;

use zipcache::GetOptions;

use super::{BAD_FORMAT, base64_decode};
use crate::transport::prefetch::Access;

/// Longest key memcached accepts; longer keys get `CLIENT_ERROR bad command line format`.
pub const KEY_MAX: usize = 250;
/// A request line without a newline after this many bytes closes the connection, as
/// memcached does — except retrievals, whose key lists may legitimately be long.
const LINE_MAX: usize = 2048;
pub const RETRIEVAL_LINE_MAX: usize = crate::core::REQUEST_LINE_MAX;
/// Longest opaque (`O`) token of a meta command.
const OPAQUE_MAX: usize = 32;

/// Longest data block a storage line may announce (memcached's `INT_MAX - 2`); a larger
/// or negative length is refused at once, without waiting for the data.
const DATA_LEN_MAX: usize = i32::MAX as usize - 2;
const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk";
const INVALID_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";
pub const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// `cas`, or `ms` with a `C` token.
    Cas(u64),
}

impl StoreMode {
    /// What a store of `key` does, for the answers read ahead: an append or a prepend
    /// builds on the current value, which is read first (off the serving thread).
    pub fn access(self, key: &[u8]) -> Access<'_> {
        match self {
            StoreMode::Append | StoreMode::Prepend => Access::Rewrites(key),
            _ => Access::Changes(vec![key]),
        }
    }
}

#[derive(Debug, PartialEq)]
pub enum Request<'a> {
    /// get / gets / gat / gats.
    Retrieve {
        keys: Vec<&'a [u8]>,
        with_cas: bool,
        touch: Option<i64>,
    },
    Store {
        mode: StoreMode,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        data: &'a [u8],
        noreply: bool,
    },
    Arith {
        key: &'a [u8],
        delta: u64,
        incr: bool,
        noreply: bool,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: i64,
        noreply: bool,
    },
    Stats(Option<&'a [u8]>),
    /// `stats detail on|off|dump`; `None` for anything else (a usage error).
    StatsDetail(Option<&'a [u8]>),
    /// `watch [stream ...]`: the stream names as sent.
    Watch(Vec<&'a [u8]>),
    Version,
    /// `config get cluster`: the fleet's nodes, as ElastiCache's auto-discovery answers.
    ConfigGetCluster,
    Verbosity {
        noreply: bool,
    },
    Quit,
    Meta(Meta<'a>),
    /// `lru_crawler ...` and `stats cachedump` (`crawler.rs`).
    Crawler(super::crawler::Command),
    /// `shutdown`, `cache_memlimit`, `refresh_certs`: `operator.rs`.
    Operator(super::operator::Operator),
    /// A value over the size limit: its data block is skipped, then `TOO_LARGE` is sent.
    /// A `set` also drops the key's old value, as memcached does.
    TooLarge {
        key: Cow<'a, [u8]>,
        drop_old: bool,
        noreply: bool,
    },
    /// The request was consumed and gets `reply` — unless it asked for `noreply`, which
    /// memcached honours for the errors of a command it recognised.
    Error {
        reply: &'static str,
        noreply: bool,
    },
}

impl Request<'_> {
    /// What the request does to the store (`prefetch`): a plain read names its keys and
    /// how it reads them (an `mg` with `u` peeks), and may be fetched from the SSD ahead
    /// of it without blocking; a request that reads and writes (gat/gats, an mg that
    /// touches, vivifies or sets a CAS: they read under the engine's update lock) or only
    /// writes names the keys it may change.
    pub fn access(&self) -> Access<'_> {
        match self {
            Request::Retrieve {
                keys, touch: None, ..
            } if !keys.is_empty() => Access::Reads(keys.clone(), GetOptions::default()),
            Request::Retrieve { keys, .. } => Access::Changes(keys.clone()),
            Request::Meta(meta) => match meta.kind {
                MetaKind::Get if !meta.flags.iter().any(|f| b"TNE".contains(&f.letter)) => {
                    Access::Reads(vec![&meta.key[..]], meta.get_options())
                }
                MetaKind::Noop => Access::Changes(Vec::new()),
                // `ms … MA` / `MP`: an append or a prepend.
                MetaKind::Set if matches!(meta.token(b'M'), Some(b"A" | b"a" | b"P" | b"p")) => {
                    Access::Rewrites(&meta.key[..])
                }
                _ => Access::Changes(vec![&meta.key[..]]),
            },
            Request::Store { key, mode, .. } => mode.access(key),
            Request::Arith { key, .. }
            | Request::Delete { key, .. }
            | Request::Touch { key, .. } => Access::Changes(vec![key]),
            Request::TooLarge { key, .. } => Access::Changes(vec![&key[..]]),
            Request::Error { .. } => Access::Changes(Vec::new()),
            Request::FlushAll { .. }
            | Request::Stats(_)
            | Request::StatsDetail(_)
            | Request::Watch(_)
            | Request::Version
            | Request::ConfigGetCluster
            | Request::Verbosity { .. }
            | Request::Quit
            | Request::Crawler(_)
            | Request::Operator(_) => Access::Barrier,
        }
    }
}

/// An error reply that `noreply` does not silence.
pub fn error(reply: &'static str) -> Request<'static> {
    Request::Error {
        reply,
        noreply: false,
    }
}

/// A crawler command, or the error reply its line gets.
fn crawler_request(parsed: Result<super::crawler::Command, &'static str>) -> Request<'static> {
    parsed.map_or_else(error, Request::Crawler)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaKind {
    Get,
    Set,
    Delete,
    Arith,
    Noop,
    Debug,
}

/// A meta command: its key, its flags in request order (return flags echo that order),
/// and for `ms` the data block.
#[derive(Debug, PartialEq)]
pub struct Meta<'a> {
    pub kind: MetaKind,
    /// The key as the engine knows it (base64-decoded under the `b` flag).
    pub key: Cow<'a, [u8]>,
    /// The key as the client sent it, which `k` and `me` echo back.
    pub key_token: &'a [u8],
    pub flags: Vec<MetaFlag<'a>>,
    pub data: &'a [u8],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaFlag<'a> {
    pub letter: u8,
    pub token: &'a [u8],
}

impl<'a> Meta<'a> {
    pub fn has(&self, letter: u8) -> bool {
        self.flags.iter().any(|f| f.letter == letter)
    }

    pub fn token(&self, letter: u8) -> Option<&'a [u8]> {
        self.flags
            .iter()
            .find(|f| f.letter == letter)
            .map(|f| f.token)
    }

    /// How an `mg` reads: `u` leaves the item's access state as it was.
    pub fn get_options(&self) -> GetOptions {
        GetOptions {
            peek: self.has(b'u'),
        }
    }
}

/// Result of looking at the front of the read buffer.
#[derive(Debug, PartialEq)]
pub enum Parsed<'a> {
    /// Not a whole request yet.
    Incomplete,
    /// A request spanning `len` bytes.
    Request { request: Request<'a>, len: usize },
    /// Skip `len` bytes first (the line), then `swallow` more as they arrive (a data block
    /// too large to buffer), then execute `request`.
    Swallow {
        request: Request<'a>,
        len: usize,
        swallow: usize,
    },
    /// Unrecoverable (an endless line): close the connection like memcached does.
    Close,
}

pub fn parse(input: &[u8], max_value: usize) -> Parsed<'_> {
    let Some(newline) = input.iter().position(|&b| b == b'\n') else {
        let limit = if is_retrieval(input) {
            RETRIEVAL_LINE_MAX
        } else {
            LINE_MAX
        };
        return if input.len() > limit {
            Parsed::Close
        } else {
            Parsed::Incomplete
        };
    };
    let line_len = newline + 1;
    let tokens = line_tokens(input, newline);
    let rest = &input[line_len..];
    let request = match tokens.first().copied() {
        None => error(BAD_FORMAT),
        Some(b"get") | Some(b"gets") | Some(b"gat") | Some(b"gats") => retrieval(&tokens),
        Some(b"set") => return storage(&tokens, StoreMode::Set, line_len, rest, max_value),
        Some(b"add") => return storage(&tokens, StoreMode::Add, line_len, rest, max_value),
        Some(b"replace") => {
            return storage(&tokens, StoreMode::Replace, line_len, rest, max_value);
        }
        Some(b"append") => {
            return storage(&tokens, StoreMode::Append, line_len, rest, max_value);
        }
        Some(b"prepend") => {
            return storage(&tokens, StoreMode::Prepend, line_len, rest, max_value);
        }
        Some(b"cas") => return storage(&tokens, StoreMode::Cas(0), line_len, rest, max_value),
        Some(b"incr") => arith(&tokens, true),
        Some(b"decr") => arith(&tokens, false),
        Some(b"delete") => delete(&tokens),
        Some(b"touch") => touch(&tokens),
        Some(b"flush_all") => flush_all(&tokens),
        Some(b"stats") => stats(&tokens),
        Some(b"lru_crawler") => crawler_request(super::crawler::parse(&tokens)),
        Some(b"version") => Request::Version,
        Some(b"config") if tokens[1..] == [&b"get"[..], b"cluster"] => Request::ConfigGetCluster,
        Some(b"watch") => Request::Watch(tokens[1..].to_vec()),
        Some(b"verbosity") if (2..=3).contains(&tokens.len()) => verbosity(&tokens),
        Some(b"quit") if tokens.len() == 1 => Request::Quit,
        Some(b"shutdown") => Request::Operator(super::operator::shutdown(&tokens)),
        Some(b"cache_memlimit") => Request::Operator(super::operator::cache_memlimit(&tokens)),
        Some(b"refresh_certs") => Request::Operator(super::operator::Operator::RefreshCerts),
        Some(b"mn") => Request::Meta(Meta {
            kind: MetaKind::Noop,
            key: Cow::Borrowed(b""),
            key_token: b"",
            flags: Vec::new(),
            data: b"",
        }),
        Some(b"me") => meta(&tokens, MetaKind::Debug),
        Some(b"mg") => meta(&tokens, MetaKind::Get),
        Some(b"md") => meta(&tokens, MetaKind::Delete),
        Some(b"ma") => meta(&tokens, MetaKind::Arith),
        Some(b"ms") => return meta_set(&tokens, line_len, rest, max_value),
        // memcached hangs up on what looks like HTTP rather than answer a web client.
        Some(_) if tokens.len() > 1 && tokens.last().is_some_and(|t| t.starts_with(b"HTTP/")) => {
            return Parsed::Close;
        }
        Some(_) => error("ERROR"),
    };
    Parsed::Request {
        request,
        len: line_len,
    }
}

/// The space-separated tokens of the line that ends at `input[newline]` (`\r` dropped).
pub(super) fn line_tokens(input: &[u8], newline: usize) -> Vec<&[u8]> {
    let line = input[..newline]
        .strip_suffix(b"\r")
        .unwrap_or(&input[..newline]);
    line.split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .collect()
}

fn is_retrieval(input: &[u8]) -> bool {
    [&b"get "[..], b"gets ", b"gat ", b"gats "]
        .iter()
        .any(|p| input.starts_with(p))
}

fn noreply(tokens: &[&[u8]]) -> bool {
    tokens.last() == Some(&&b"noreply"[..])
}

fn number<T: std::str::FromStr>(token: &[u8]) -> Option<T> {
    std::str::from_utf8(token).ok()?.parse().ok()
}

/// memcached's exptime is a 32-bit signed number.
fn exptime(token: &[u8]) -> Option<i64> {
    number::<i32>(token).map(i64::from)
}

fn key_ok(key: &[u8]) -> bool {
    key.len() <= KEY_MAX
}

fn retrieval<'a>(tokens: &[&'a [u8]]) -> Request<'a> {
    let command = tokens[0];
    let with_cas = command.ends_with(b"s");
    let (touch, keys) = if command.starts_with(b"gat") {
        if tokens.len() < 2 {
            return error("ERROR");
        }
        let Some(t) = exptime(tokens[1]) else {
            return error(INVALID_EXPTIME);
        };
        (Some(t), &tokens[2..])
    } else {
        if tokens.len() < 2 {
            return error("ERROR");
        }
        (None, &tokens[1..])
    };
    if !keys.iter().all(|k| key_ok(k)) {
        return error(BAD_FORMAT);
    }
    Request::Retrieve {
        keys: keys.to_vec(),
        with_cas,
        touch,
    }
}

/// A data block length as memcached accepts it: `0..=DATA_LEN_MAX`.
fn data_len(token: &[u8]) -> Option<usize> {
    usize::try_from(number::<i32>(token)?)
        .ok()
        .filter(|&len| len <= DATA_LEN_MAX)
}

/// Frames a data block of `len` bytes after the line (`line_len` bytes): waits for all of
/// it plus `\r\n`, refuses a block that does not end so, and hands the data to `request`.
fn with_data_block<'a>(
    rest: &'a [u8],
    line_len: usize,
    len: usize,
    request: impl FnOnce(&'a [u8]) -> Request<'a>,
) -> Parsed<'a> {
    let total = len + 2;
    if rest.len() < total {
        return Parsed::Incomplete;
    }
    let request = if &rest[len..total] == b"\r\n" {
        request(&rest[..len])
    } else {
        error(BAD_CHUNK)
    };
    Parsed::Request {
        request,
        len: line_len + total,
    }
}

/// `set/add/replace/append/prepend <key> <flags> <exptime> <bytes> [noreply]` and
/// `cas <key> <flags> <exptime> <bytes> <unique> [noreply]`, framed as memcached 1.6's
/// parser does: once the length is known, every refusal skips the data block, so its
/// bytes are never read as commands.
fn storage<'a>(
    tokens: &[&'a [u8]],
    mode: StoreMode,
    line_len: usize,
    rest: &'a [u8],
    max_value: usize,
) -> Parsed<'a> {
    let Some(len) = tokens.get(4).and_then(|t| data_len(t)) else {
        return Parsed::Request {
            request: error(BAD_FORMAT),
            len: line_len,
        };
    };
    let noreply = noreply(tokens);
    let skip = |request| Parsed::Swallow {
        request,
        len: line_len,
        swallow: len + 2,
    };
    let refuse = || {
        skip(Request::Error {
            reply: BAD_FORMAT,
            noreply,
        })
    };
    let key = tokens[1];
    let (true, Some(flags), Some(exptime)) =
        (key_ok(key), number::<u32>(tokens[2]), exptime(tokens[3]))
    else {
        return refuse();
    };
    let mode = match mode {
        StoreMode::Cas(_) => match tokens.get(5).and_then(|t| number::<u64>(t)) {
            Some(unique) => StoreMode::Cas(unique),
            None => return refuse(),
        },
        mode => mode,
    };
    if len > max_value {
        return skip(Request::TooLarge {
            key: Cow::Borrowed(key),
            drop_old: mode == StoreMode::Set,
            noreply,
        });
    }
    with_data_block(rest, line_len, len, |data| Request::Store {
        mode,
        key,
        flags,
        exptime,
        data,
        noreply,
    })
}

/// The error reply of a recognised command, silenced by its `noreply`.
fn refusal(tokens: &[&[u8]], reply: &'static str) -> Request<'static> {
    Request::Error {
        reply,
        noreply: noreply(tokens),
    }
}

fn arith<'a>(tokens: &[&'a [u8]], incr: bool) -> Request<'a> {
    if tokens.len() != 3 && !(tokens.len() == 4 && noreply(tokens)) {
        return error("ERROR");
    }
    if !key_ok(tokens[1]) {
        return refusal(tokens, BAD_FORMAT);
    }
    match number::<u64>(tokens[2]) {
        Some(delta) => Request::Arith {
            key: tokens[1],
            delta,
            incr,
            noreply: noreply(tokens),
        },
        None => refusal(tokens, "CLIENT_ERROR invalid numeric delta argument"),
    }
}

fn delete<'a>(tokens: &[&'a [u8]]) -> Request<'a> {
    if !(2..=4).contains(&tokens.len()) {
        return error("ERROR");
    }
    if !key_ok(tokens[1]) {
        return refusal(tokens, BAD_FORMAT);
    }
    // Only the legacy hold time "0" and "noreply" may follow the key.
    let valid = match tokens.len() {
        2 => true,
        3 => tokens[2] == b"0" || noreply(tokens),
        _ => tokens[2] == b"0" && noreply(tokens),
    };
    if !valid {
        return refusal(
            tokens,
            "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]",
        );
    }
    Request::Delete {
        key: tokens[1],
        noreply: noreply(tokens),
    }
}

fn touch<'a>(tokens: &[&'a [u8]]) -> Request<'a> {
    if tokens.len() != 3 && !(tokens.len() == 4 && noreply(tokens)) {
        return error("ERROR");
    }
    if !key_ok(tokens[1]) {
        return refusal(tokens, BAD_FORMAT);
    }
    match exptime(tokens[2]) {
        Some(exptime) => Request::Touch {
            key: tokens[1],
            exptime,
            noreply: noreply(tokens),
        },
        None => refusal(tokens, INVALID_EXPTIME),
    }
}

fn flush_all<'a>(tokens: &[&'a [u8]]) -> Request<'a> {
    if tokens.len() > 3 {
        return error("ERROR");
    }
    let noreply = noreply(tokens);
    let delay_token = tokens.get(1).filter(|t| **t != b"noreply");
    let delay = match delay_token {
        None => 0,
        Some(t) => match exptime(t) {
            Some(d) => d,
            None => return refusal(tokens, INVALID_EXPTIME),
        },
    };
    Request::FlushAll { delay, noreply }
}

fn verbosity(tokens: &[&[u8]]) -> Request<'static> {
    match number::<u32>(tokens[1]) {
        Some(_) => Request::Verbosity {
            noreply: noreply(tokens),
        },
        None => refusal(tokens, BAD_FORMAT),
    }
}

fn stats<'a>(tokens: &[&'a [u8]]) -> Request<'a> {
    if tokens.get(1) == Some(&&b"cachedump"[..]) {
        return crawler_request(super::crawler::parse_cachedump(tokens));
    }
    match tokens.len() {
        2..=4 if tokens[1] == b"detail" => {
            Request::StatsDetail((tokens.len() == 3).then(|| tokens[2]))
        }
        1 => Request::Stats(None),
        2 => Request::Stats(Some(tokens[1])),
        _ => error("ERROR"),
    }
}

/// Flags each meta command accepts (memcached 1.6).
fn valid_flags(kind: MetaKind) -> &'static [u8] {
    match kind {
        MetaKind::Get => b"bcCEfhklOqstuvNRT",
        MetaKind::Set => b"bcCEFIkOqsTMN",
        MetaKind::Delete => b"bCEFIkOqTx",
        MetaKind::Arith => b"bCENJDTMOqtcvk",
        MetaKind::Noop | MetaKind::Debug => b"",
    }
}

fn meta_flags<'a>(kind: MetaKind, tokens: &[&'a [u8]]) -> Result<Vec<MetaFlag<'a>>, &'static str> {
    let valid = valid_flags(kind);
    let mut flags: Vec<MetaFlag<'a>> = Vec::with_capacity(tokens.len());
    for token in tokens {
        let letter = token[0];
        if !valid.contains(&letter) {
            return Err("CLIENT_ERROR invalid flag");
        }
        if flags.iter().any(|f| f.letter == letter) {
            return Err("CLIENT_ERROR duplicate flag");
        }
        if letter == b'O' && token.len() - 1 > OPAQUE_MAX {
            return Err("CLIENT_ERROR opaque token too long");
        }
        flags.push(MetaFlag {
            letter,
            token: &token[1..],
        });
    }
    Ok(flags)
}

fn meta<'a>(tokens: &[&'a [u8]], kind: MetaKind) -> Request<'a> {
    if tokens.len() < 2 {
        return error(BAD_FORMAT);
    }
    let flags = match meta_flags(kind, &tokens[2..]) {
        Ok(flags) => flags,
        Err(e) => return error(e),
    };
    // `me` takes a base64 key as a bare `b` after the key, like memcached.
    let binary = flags.iter().any(|f| f.letter == b'b')
        || (kind == MetaKind::Debug && tokens.get(2) == Some(&&b"b"[..]));
    match meta_key(tokens[1], binary) {
        Some(key) => Request::Meta(Meta {
            kind,
            key,
            key_token: tokens[1],
            flags,
            data: b"",
        }),
        None => error(BAD_FORMAT),
    }
}

/// The engine key of a meta command: the token, or its base64 decoding (flag `b`).
fn meta_key(token: &[u8], binary: bool) -> Option<Cow<'_, [u8]>> {
    let key = if binary {
        Cow::Owned(base64_decode(token)?)
    } else {
        Cow::Borrowed(token)
    };
    (!key.is_empty() && key_ok(&key)).then_some(key)
}

/// `ms <key> <bytes> <flags>*`: once the length is known, every refusal skips the data.
fn meta_set<'a>(
    tokens: &[&'a [u8]],
    line_len: usize,
    rest: &'a [u8],
    max_value: usize,
) -> Parsed<'a> {
    let Some(len) = tokens.get(2).and_then(|t| data_len(t)) else {
        return Parsed::Request {
            request: error(BAD_FORMAT),
            len: line_len,
        };
    };
    let skip = |request| Parsed::Swallow {
        request,
        len: line_len,
        swallow: len + 2,
    };
    let key_token = tokens[1];
    let flags = match meta_flags(MetaKind::Set, &tokens[3..]) {
        Ok(flags) => flags,
        Err(e) => return skip(error(e)),
    };
    let Some(key) = meta_key(key_token, flags.iter().any(|f| f.letter == b'b')) else {
        return skip(error(BAD_FORMAT));
    };
    if len > max_value {
        let noreply = flags.iter().any(|f| f.letter == b'q');
        let mode = flags.iter().find(|f| f.letter == b'M').map(|f| f.token);
        return skip(Request::TooLarge {
            key,
            drop_old: matches!(mode, None | Some(b"S") | Some(b"s")),
            noreply,
        });
    }
    with_data_block(rest, line_len, len, |data| {
        Request::Meta(Meta {
            kind: MetaKind::Set,
            key,
            key_token,
            flags,
            data,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(input: &[u8]) -> (Request<'_>, usize) {
        match parse(input, 1 << 20) {
            Parsed::Request { request, len } => (request, len),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn access_names_what_a_request_reads_and_changes() {
        let access = |input: &[u8], want: Access<'_>| {
            let (req, _) = request(input);
            assert_eq!(req.access(), want, "{req:?}");
        };
        let plain = GetOptions::default();
        access(b"get a b\r\n", Access::Reads(vec![b"a", b"b"], plain));
        access(b"gets a\r\n", Access::Reads(vec![b"a"], plain));
        access(b"mg a v\r\n", Access::Reads(vec![b"a"], plain));
        access(
            b"mg a v u\r\n",
            Access::Reads(vec![b"a"], GetOptions { peek: true }),
        );
        // Reads that write: the engine reads them under its update lock as they run.
        access(b"gat 10 a b\r\n", Access::Changes(vec![b"a", b"b"]));
        access(b"mg a v T30\r\n", Access::Changes(vec![b"a"]));
        for write in [
            &b"set a 0 0 1\r\nx\r\n"[..],
            b"cas a 0 0 1 5\r\nx\r\n",
            b"incr a 1\r\n",
            b"delete a\r\n",
            b"touch a 10\r\n",
            b"ms a 1\r\nx\r\n",
            b"md a\r\n",
            b"ma a\r\n",
            b"me a\r\n",
        ] {
            access(write, Access::Changes(vec![b"a"]));
        }
        // Writes built on the current value, read first.
        for rewrite in [
            &b"append a 0 0 1\r\nx\r\n"[..],
            b"prepend a 0 0 1\r\nx\r\n",
            b"ms a 1 MA\r\nx\r\n",
            b"ms a 1 MP\r\nx\r\n",
        ] {
            access(rewrite, Access::Rewrites(b"a"));
        }
        access(b"mn\r\n", Access::Changes(Vec::new()));
        access(b"bogus\r\n", Access::Changes(Vec::new()));
        for barrier in [
            &b"flush_all\r\n"[..],
            b"stats\r\n",
            b"version\r\n",
            b"verbosity 1\r\n",
            b"quit\r\n",
            b"lru_crawler metadump all\r\n",
        ] {
            access(barrier, Access::Barrier);
        }
    }

    #[test]
    fn storage_waits_for_the_whole_data_block() {
        assert_eq!(parse(b"set k 0 0 5\r\nab", 1 << 20), Parsed::Incomplete);
        let (req, len) = request(b"set k 1 2 5 noreply\r\nhello\r\nget k\r\n");
        assert_eq!(len, 28);
        assert_eq!(
            req,
            Request::Store {
                mode: StoreMode::Set,
                key: b"k",
                flags: 1,
                exptime: 2,
                data: b"hello",
                noreply: true
            }
        );
    }

    #[test]
    fn errors_match_memcached() {
        assert_eq!(request(b"get\r\n").0, error("ERROR"));
        assert_eq!(request(b"set k 0 0 -1\r\n").0, error(BAD_FORMAT));
        assert_eq!(
            request(b"set k 0 0 1\r\nab\r\n").1,
            16,
            "bad chunk spans len + 2"
        );
        assert_eq!(request(b"delete a b c d e\r\n").0, error("ERROR"));
        let key = vec![b'k'; 251];
        let line = [b"get ".as_slice(), &key, b"\r\n"].concat();
        assert_eq!(request(&line).0, error(BAD_FORMAT));
        assert_eq!(
            request(b"mg k v v\r\n").0,
            error("CLIENT_ERROR duplicate flag")
        );
        assert_eq!(
            request(b"mg k zz\r\n").0,
            error("CLIENT_ERROR invalid flag")
        );
    }

    /// A refusal after the length is known skips `len + 2` bytes of data.
    fn swallowed(input: &[u8]) -> (Request<'_>, usize) {
        match parse(input, 1 << 20) {
            Parsed::Swallow {
                request,
                len,
                swallow,
            } => {
                assert_eq!(len, input.len(), "the line alone is consumed");
                (request, swallow)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_storage_lines_skip_their_data_block() {
        let long_key = format!("set {} 0 0 6\r\n", "k".repeat(251));
        for line in [
            "cas foo 0 0 6 \r\n",
            "cas foo 0 0 6 x\r\n",
            "set k x 0 6\r\n",
            "add k 0 x 6\r\n",
            "replace k 4294967296 0 6\r\n",
            "append k 0 99999999999 6\r\n",
            long_key.as_str(),
        ] {
            assert_eq!(
                swallowed(line.as_bytes()),
                (error(BAD_FORMAT), 8),
                "{line:?}"
            );
        }
        assert_eq!(
            swallowed(b"prepend k x 0 6 noreply\r\n"),
            (
                Request::Error {
                    reply: BAD_FORMAT,
                    noreply: true
                },
                8
            )
        );
        // Without a usable length there is no block to skip.
        for line in [
            &b"set k 0 0\r\n"[..],
            b"cas k 0 0 x 1\r\n",
            b"set k 0 0 4294967295\r\n",
            b"set k 0 0 2147483647\r\nscoobyscoobydoo",
            b"ms k\r\n",
            b"ms k -1\r\n",
        ] {
            assert_eq!(request(line).0, error(BAD_FORMAT), "{line:?}");
        }
        assert_eq!(swallowed(b"ms k 2 zz\r\n").1, 4);
    }

    #[test]
    fn blank_lines_http_and_keyless_meta() {
        assert_eq!(request(b" \n").0, error(BAD_FORMAT));
        assert_eq!(request(b"\r\n").0, error(BAD_FORMAT));
        for command in ["mg", "md", "ma", "me"] {
            let line = format!("{command}\r\n");
            assert_eq!(request(line.as_bytes()).0, error(BAD_FORMAT));
        }
        for line in [
            &b"GET / HTTP/1.0\r\n"[..],
            b"PUT /asdf/asd/fasdfasdf/sadf HTTP/1.1\r\n",
            b"DELETE HTTP/1.1\r\n",
        ] {
            assert_eq!(parse(line, 1 << 20), Parsed::Close);
        }
        assert_eq!(request(b"HTTP/1.1\r\n").0, error("ERROR"));
    }

    #[test]
    fn noreply_silences_errors_of_known_commands() {
        let silenced = |reply| Request::Error {
            reply,
            noreply: true,
        };
        assert_eq!(
            request(b"delete k 10 noreply\r\n").0,
            silenced("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]")
        );
        assert_eq!(
            request(b"delete k 0\r\n").0,
            Request::Delete {
                key: b"k",
                noreply: false
            }
        );
        assert_eq!(
            request(b"incr k x noreply\r\n").0,
            silenced("CLIENT_ERROR invalid numeric delta argument")
        );
        assert_eq!(
            request(b"touch k x noreply\r\n").0,
            silenced(INVALID_EXPTIME)
        );
        assert_eq!(request(b"verbosity invalid\r\n").0, error(BAD_FORMAT));
        assert_eq!(
            request(b"verbosity 1 noreply\r\n").0,
            Request::Verbosity { noreply: true }
        );
    }

    #[test]
    fn meta_flags_for_client_cas_invalidation_and_emptying() {
        for line in [
            &b"mg k E5 C7 N30 v\r\n"[..],
            b"md k E5 I x F3 T30\r\n",
            b"ma k E5 N0 J1\r\n",
        ] {
            assert!(matches!(request(line).0, Request::Meta(_)), "{line:?}");
        }
        match request(b"ms k 1 E973 I C5\r\nv\r\n").0 {
            Request::Meta(meta) => {
                assert_eq!(meta.token(b'E'), Some(&b"973"[..]));
                assert!(meta.has(b'I'));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(request(b"mg k x\r\n").0, error("CLIENT_ERROR invalid flag"));
    }

    #[test]
    fn base64_keys_round_trip() {
        use super::super::base64_encode;
        assert_eq!(base64_encode(b"hello"), b"aGVsbG8=");
        assert_eq!(base64_encode(b"hi"), b"aGk=");
        assert_eq!(base64_encode(&[0, 1, 2]), b"AAEC");
        assert_eq!(base64_encode(b""), b"");
        for len in 1..40u8 {
            let bytes: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
            assert_eq!(base64_decode(&base64_encode(&bytes)), Some(bytes));
        }
    }

    #[test]
    fn base64_keys_decode() {
        assert_eq!(base64_decode(b"aGVsbG8="), Some(b"hello".to_vec()));
        assert_eq!(base64_decode(b"aGk="), Some(b"hi".to_vec()));
        assert_eq!(base64_decode(b"AAEC"), Some(vec![0, 1, 2]));
        assert_eq!(base64_decode(b"aGk"), None);
        assert_eq!(base64_decode(b"a=Gk"), None);
        match request(b"mg aGk= b v k\r\n").0 {
            Request::Meta(meta) => {
                assert_eq!((&*meta.key, meta.key_token), (&b"hi"[..], &b"aGk="[..]))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn oversized_values_are_swallowed() {
        match parse(b"set k 0 0 2000000\r\n", 1 << 20) {
            Parsed::Swallow { swallow, len, .. } => assert_eq!((swallow, len), (2_000_002, 19)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn endless_lines_close_but_long_multigets_wait() {
        assert_eq!(parse(&[b'x'; 3000], 1 << 20), Parsed::Close);
        let mut get = b"get ".to_vec();
        get.extend_from_slice(&[b'k'; 3000]);
        assert_eq!(parse(&get, 1 << 20), Parsed::Incomplete);
    }

    #[test]
    fn watch_and_stats_detail_carry_their_arguments() {
        assert_eq!(request(b"watch\r\n").0, Request::Watch(vec![]));
        assert_eq!(
            request(b"watch fetchers mutations\r\n").0,
            Request::Watch(vec![&b"fetchers"[..], b"mutations"])
        );
        assert_eq!(
            request(b"stats detail dump\r\n").0,
            Request::StatsDetail(Some(b"dump"))
        );
        assert_eq!(request(b"stats detail\r\n").0, Request::StatsDetail(None));
        assert_eq!(
            request(b"stats detail on x\r\n").0,
            Request::StatsDetail(None)
        );
        assert_eq!(
            request(b"stats conns\r\n").0,
            Request::Stats(Some(b"conns"))
        );
    }
}
