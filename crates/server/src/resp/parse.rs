//! RESP2 request framing: multi-bulk arrays (`*N\r\n$len\r\n...`) and the inline form
//! (`SET k v\r\n`) that redis-cli and telnet send. Limits and error texts follow Redis;
//! a framing error is answered and the connection closed, as Redis does.

use std::borrow::Cow;

/// Redis's default `proto-max-bulk-len` is 512 MiB; a cache with 1 MiB values needs far
/// less, and a smaller bound caps what one client can make us buffer.
const MAX_BULK: usize = 16 << 20;
const MAX_MULTIBULK: usize = 1024 * 1024;
const MAX_INLINE: usize = 64 * 1024;
/// What a client that has not authenticated (with `requirepass`) may send in one
/// multi-bulk request, as Redis since the fix of CVE-2021-32675: enough for `AUTH` and
/// `HELLO … AUTH`, so that unauthenticated connections cannot make us buffer megabytes.
const UNAUTHENTICATED_MULTIBULK: i64 = 10;
const UNAUTHENTICATED_BULK: i64 = 16 * 1024;

/// Refusal of a request longer than `max_request_size`; the connection is closed.
pub const REQUEST_TOO_LARGE: &str = "ERR Protocol error: request exceeds max-request-size";

#[derive(Debug, PartialEq)]
pub enum Parsed<'a> {
    Incomplete,
    /// A command (possibly empty: an empty inline line) spanning `len` bytes.
    Command {
        args: Vec<Cow<'a, [u8]>>,
        len: usize,
    },
    /// Reply with this error and close.
    Error(String),
    /// The request announces more than `max_request_size` bytes: reply
    /// `REQUEST_TOO_LARGE` and close, before buffering them.
    TooLarge,
}

/// Frames the request at the front of `input` from a client `authenticated` or not,
/// from its start (read-ahead, tests); a connection keeps a [`Framer`] instead.
pub fn parse(input: &[u8], authenticated: bool, max_request_size: usize) -> Parsed<'_> {
    Framer::default().parse(input, authenticated, max_request_size)
}

/// Frames the requests at the front of a connection's input, keeping its progress
/// through one that is not complete yet: each read's bytes are looked at once, so a
/// request trickling in (a large bulk string, an MSET of many keys) costs work linear in
/// its length, not in its length times the reads.
#[derive(Default)]
pub struct Framer {
    /// The multi-bulk count, once its line is in, and where its first element starts.
    count: Option<(usize, usize)>,
    /// Elements read whole so far, and where the next one starts.
    elements: usize,
    next: usize,
    /// The next element is not all in before the input is this long: until then, no
    /// call looks at it again.
    next_complete_at: usize,
    line: LineSearch,
}

/// The search for the end of one line, resumed where the last attempt stopped.
#[derive(Default)]
struct LineSearch {
    /// No line end starts before this offset.
    searched: usize,
    /// Bytes looked at, for the tests of linear work.
    #[cfg(test)]
    examined: usize,
}

impl LineSearch {
    /// The offset of the first `end` at or after `from`.
    fn find(&mut self, input: &[u8], from: usize, end: &[u8]) -> Option<usize> {
        let start = self.searched.max(from);
        let rest = input.get(start..)?;
        let found = rest.windows(end.len()).position(|w| w == end);
        #[cfg(test)]
        {
            self.examined += found.map_or(rest.len(), |at| at + end.len());
        }
        match found {
            Some(at) => {
                self.searched = 0;
                Some(start + at)
            }
            None => {
                // An `end` cut by the end of the input starts in its last bytes.
                self.searched = (input.len() + 1).saturating_sub(end.len()).max(from);
                None
            }
        }
    }
}

/// One bulk string of a multi-bulk request.
enum Element<'a> {
    /// Not all in yet: complete once the input is `complete_at` bytes long (0: unknown).
    Incomplete {
        complete_at: usize,
    },
    /// Its data, and where the element after it starts.
    Read {
        data: &'a [u8],
        next: usize,
    },
    Refused(Parsed<'a>),
}

/// Where the first argument of a multi-bulk request at the front of `input` starts;
/// `None` for an inline request.
pub fn first_arg_at(input: &[u8]) -> Option<usize> {
    if input.first() != Some(&b'*') {
        return None;
    }
    line_at(input, 0).map(|(_, next)| next)
}

/// The bulk string whose `$` line starts at `at`, in a multi-bulk request `parse` framed
/// already, and where the one after it starts.
pub fn bulk_at(input: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let (len_line, data_start) = line_at(input, at)?;
    let len = usize::try_from(integer(len_line.get(1..)?)?).ok()?;
    let end = data_start.checked_add(len)?;
    Some((input.get(data_start..end)?, end + 2))
}

/// The line starting at `from`, without its `\r\n`, and the offset after it.
fn line_at(input: &[u8], from: usize) -> Option<(&[u8], usize)> {
    let end = from + input.get(from..)?.windows(2).position(|w| w == b"\r\n")?;
    Some((&input[from..end], end + 2))
}

impl Framer {
    /// Frames the request at the front of `input`, resuming where the last call stopped
    /// if it returned `Incomplete`: `input` must then start with the same bytes.
    pub fn parse<'a>(
        &mut self,
        input: &'a [u8],
        authenticated: bool,
        max_request_size: usize,
    ) -> Parsed<'a> {
        let parsed = match input.first() {
            None => Parsed::Incomplete,
            Some(b'*') => self.multibulk(input, authenticated, max_request_size),
            Some(_) => self.inline(input),
        };
        if parsed != Parsed::Incomplete {
            self.count = None;
            self.elements = 0;
            self.next = 0;
            self.next_complete_at = 0;
            self.line.searched = 0;
        }
        parsed
    }

    fn multibulk<'a>(&mut self, input: &'a [u8], authenticated: bool, limit: usize) -> Parsed<'a> {
        let (count, first) = match self.count {
            Some(known) => known,
            None => {
                let Some(end) = self.line.find(input, 0, b"\r\n") else {
                    return if input.len() > MAX_INLINE {
                        Parsed::Error("ERR Protocol error: too big mbulk count string".into())
                    } else {
                        Parsed::Incomplete
                    };
                };
                let count = match integer(&input[1..end]) {
                    Some(n) if !authenticated && n > UNAUTHENTICATED_MULTIBULK => {
                        return Parsed::Error(
                            "ERR Protocol error: unauthenticated multibulk length".into(),
                        );
                    }
                    Some(n) if n <= MAX_MULTIBULK as i64 => usize::try_from(n).unwrap_or(0),
                    _ => {
                        return Parsed::Error(
                            "ERR Protocol error: invalid multibulk length".into(),
                        );
                    }
                };
                self.count = Some((count, end + 2));
                self.next = end + 2;
                (count, end + 2)
            }
        };
        // The elements read by this call; those read by earlier calls are framed again
        // below, from a pass over their headers, as `input` may have moved since.
        let resumed = self.elements > 0;
        let mut args = Vec::new();
        while self.elements < count {
            if input.len() < self.next_complete_at {
                return Parsed::Incomplete;
            }
            match element(&mut self.line, input, self.next, authenticated, limit) {
                Element::Incomplete { complete_at } => {
                    self.next_complete_at = complete_at;
                    return Parsed::Incomplete;
                }
                Element::Refused(refusal) => return refusal,
                Element::Read { data, next } => {
                    self.elements += 1;
                    self.next = next;
                    if !resumed {
                        // Allocated once an element is in: a request trickling in
                        // costs no allocation per read.
                        if args.is_empty() {
                            args.reserve(count.min(16));
                        }
                        args.push(Cow::Borrowed(data));
                    }
                }
            }
        }
        if !resumed {
            return Parsed::Command {
                args,
                len: self.next,
            };
        }
        // Every element is in: one more pass over their headers frames the arguments.
        let mut args = Vec::with_capacity(count);
        let (mut line, mut pos) = (LineSearch::default(), first);
        for _ in 0..count {
            match element(&mut line, input, pos, authenticated, limit) {
                Element::Read { data, next } => {
                    args.push(Cow::Borrowed(data));
                    pos = next;
                }
                Element::Incomplete { .. } => return Parsed::Incomplete,
                Element::Refused(refusal) => return refusal,
            }
        }
        Parsed::Command { args, len: pos }
    }

    fn inline<'a>(&mut self, input: &'a [u8]) -> Parsed<'a> {
        let Some(newline) = self.line.find(input, 0, b"\n") else {
            return if input.len() > MAX_INLINE {
                Parsed::Error("ERR Protocol error: too big inline request".into())
            } else {
                Parsed::Incomplete
            };
        };
        let line = input[..newline]
            .strip_suffix(b"\r")
            .unwrap_or(&input[..newline]);
        match split_args(line) {
            Some(args) => Parsed::Command {
                args,
                len: newline + 1,
            },
            None => Parsed::Error("ERR Protocol error: unbalanced quotes in request".into()),
        }
    }
}

/// The bulk string at `pos` of a multi-bulk request, whose bytes through it may not pass
/// `limit`.
fn element<'a>(
    line: &mut LineSearch,
    input: &'a [u8],
    pos: usize,
    authenticated: bool,
    limit: usize,
) -> Element<'a> {
    let Some(&first) = input.get(pos) else {
        return Element::Incomplete { complete_at: 0 };
    };
    if first != b'$' {
        return Element::Refused(Parsed::Error(expected_dollar(first)));
    }
    let Some(end) = line.find(input, pos, b"\r\n") else {
        return if input.len() - pos > MAX_INLINE {
            Element::Refused(Parsed::Error(
                "ERR Protocol error: too big bulk count string".into(),
            ))
        } else {
            Element::Incomplete { complete_at: 0 }
        };
    };
    let len = match integer(&input[pos + 1..end]) {
        Some(n) if !authenticated && n > UNAUTHENTICATED_BULK => {
            return Element::Refused(Parsed::Error(
                "ERR Protocol error: unauthenticated bulk length".into(),
            ));
        }
        Some(n) if (0..=MAX_BULK as i64).contains(&n) => n as usize,
        _ => {
            return Element::Refused(Parsed::Error(
                "ERR Protocol error: invalid bulk length".into(),
            ));
        }
    };
    let data = end + 2;
    // Like Redis, the two bytes after a bulk are skipped unchecked.
    let next = data + len + 2;
    if next > limit {
        return Element::Refused(Parsed::TooLarge);
    }
    match input.get(data..data + len) {
        Some(bytes) if input.len() >= next => Element::Read { data: bytes, next },
        _ => Element::Incomplete { complete_at: next },
    }
}

fn integer(text: &[u8]) -> Option<i64> {
    // A length: a few digits, read without going through `str` (at most 18 cannot
    // overflow); anything else as `str::parse` reads it.
    if (1..=18).contains(&text.len()) && text.iter().all(u8::is_ascii_digit) {
        return Some(
            text.iter()
                .fold(0, |n: i64, digit| n * 10 + i64::from(digit - b'0')),
        );
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

fn expected_dollar(found: u8) -> String {
    format!(
        "ERR Protocol error: expected '$', got '{}'",
        char::from(found).escape_default()
    )
}

/// Splits an inline command like Redis's `sdssplitargs`: whitespace separates, and
/// "double" (with \n \r \t \\ \" \xHH escapes) or 'single' quotes group.
fn split_args(line: &[u8]) -> Option<Vec<Cow<'_, [u8]>>> {
    let mut args = Vec::new();
    let mut i = 0;
    while i < line.len() {
        if line[i].is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let quote = line[i];
        if quote != b'"' && quote != b'\'' {
            let start = i;
            while i < line.len() && !line[i].is_ascii_whitespace() {
                i += 1;
            }
            args.push(Cow::Borrowed(&line[start..i]));
            continue;
        }
        let mut arg = Vec::new();
        i += 1;
        loop {
            let &b = line.get(i)?;
            i += 1;
            if b == quote {
                // A closing quote must be followed by a space or the end.
                if line.get(i).is_some_and(|c| !c.is_ascii_whitespace()) {
                    return None;
                }
                break;
            }
            if b != b'\\' {
                arg.push(b);
                continue;
            }
            let &escaped = line.get(i)?;
            i += 1;
            match (quote, escaped) {
                (b'"', b'n') => arg.push(b'\n'),
                (b'"', b'r') => arg.push(b'\r'),
                (b'"', b't') => arg.push(b'\t'),
                (b'"', b'x') => match line.get(i..i + 2).and_then(hex_byte) {
                    Some(byte) => {
                        arg.push(byte);
                        i += 2;
                    }
                    None => arg.push(b'x'),
                },
                (b'\'', b'\'') => arg.push(b'\''),
                (b'\'', other) => {
                    arg.push(b'\\');
                    arg.push(other);
                }
                (_, other) => arg.push(other),
            }
        }
        args.push(Cow::Owned(arg));
    }
    Some(args)
}

fn hex_byte(digits: &[u8]) -> Option<u8> {
    u8::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(input: &[u8]) -> (Vec<Vec<u8>>, usize) {
        match parse(input, true, usize::MAX) {
            Parsed::Command { args, len } => {
                (args.into_iter().map(|a| a.into_owned()).collect(), len)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn multibulk_frames() {
        assert_eq!(
            parse(b"*2\r\n$3\r\nGET\r\n$1\r", true, usize::MAX),
            Parsed::Incomplete
        );
        let (args, len) = command(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1");
        assert_eq!(args, vec![b"GET".to_vec(), b"k".to_vec()]);
        assert_eq!(len, 20);
        assert_eq!(command(b"*0\r\n").0.len(), 0);
        assert!(matches!(
            parse(b"*x\r\n", true, usize::MAX),
            Parsed::Error(_)
        ));
        assert!(matches!(
            parse(b"*1\r\n$-5\r\n", true, usize::MAX),
            Parsed::Error(_)
        ));
        assert!(matches!(
            parse(b"*1\r\n:5\r\n", true, usize::MAX),
            Parsed::Error(_)
        ));
    }

    #[test]
    fn inline_commands_split_like_redis() {
        let (args, _) = command(b"set \"a b\" 'c\\'d' \"\\x41\\n\"\r\n");
        assert_eq!(
            args,
            vec![
                b"set".to_vec(),
                b"a b".to_vec(),
                b"c'd".to_vec(),
                b"A\n".to_vec()
            ]
        );
        assert!(matches!(
            parse(b"get \"k\r\n", true, usize::MAX),
            Parsed::Error(_)
        ));
        assert_eq!(command(b"\r\n").0.len(), 0);
    }

    /// Before `AUTH`, as Redis: at most 10 arguments of at most 16 KiB each.
    #[test]
    fn unauthenticated_requests_stay_small() {
        let error = |input: &[u8]| match parse(input, false, usize::MAX) {
            Parsed::Error(e) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            error(b"*11\r\n"),
            "ERR Protocol error: unauthenticated multibulk length"
        );
        assert_eq!(
            error(b"*2\r\n$16385\r\n"),
            "ERR Protocol error: unauthenticated bulk length"
        );
        assert_eq!(
            parse(b"*10\r\n$16384\r\n", false, usize::MAX),
            Parsed::Incomplete
        );
        assert_eq!(parse(b"*11\r\n", true, usize::MAX), Parsed::Incomplete);
        assert_eq!(
            parse(b"*2\r\n$16385\r\n", true, usize::MAX),
            Parsed::Incomplete
        );
    }

    /// Feeds `request` to one framer in `piece`-byte reads, as a connection would;
    /// returns the arguments and the bytes its line searches looked at.
    fn trickled(request: &[u8], piece: usize) -> (Vec<Vec<u8>>, usize) {
        let mut framer = Framer::default();
        let mut received = 0;
        loop {
            received = (received + piece).min(request.len());
            match framer.parse(&request[..received], true, usize::MAX) {
                Parsed::Incomplete => assert!(received < request.len(), "complete, unframed"),
                Parsed::Command { args, len } => {
                    assert_eq!(len, request.len());
                    let args = args.into_iter().map(|a| a.into_owned()).collect();
                    return (args, framer.line.examined);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    use crate::fuzzing::resp_request as multibulk_of;

    /// Each read's bytes are looked at about once, however many reads a request takes:
    /// re-framing from the start on every read looked at ~6 000 times as many here.
    #[test]
    fn a_trickled_request_costs_linear_work() {
        let keys: Vec<Vec<u8>> = (0..20_000).map(|i| format!("k{i}").into_bytes()).collect();
        let mut args: Vec<&[u8]> = vec![b"MSET"];
        args.extend(keys.iter().map(Vec::as_slice));
        let request = multibulk_of(&args);
        let (framed, examined) = trickled(&request, 7);
        assert_eq!(framed.len(), args.len());
        assert_eq!(framed[20_000], b"k19999");
        assert!(
            examined <= 3 * request.len(),
            "{examined} for {}",
            request.len()
        );

        let value = vec![b'v'; 8 << 20];
        let request = multibulk_of(&[b"SET", b"k", &value]);
        let (framed, examined) = trickled(&request, 1024);
        assert_eq!(framed[2], value);
        assert!(examined <= 64, "{examined}: the payload was scanned");

        let line = format!("SET k {}\r\n", "v".repeat(60_000)).into_bytes();
        let (framed, examined) = trickled(&line, 3);
        assert_eq!(framed[2].len(), 60_000);
        assert!(examined <= 2 * line.len(), "{examined} for {}", line.len());
    }

    /// Lengths read as `str::parse` reads them, the digits-only fast path included: signs,
    /// leading zeros, the largest values and one past them, and bytes that are no number.
    #[test]
    fn integers_read_as_str_parse_reads_them() {
        let texts: [&[u8]; 13] = [
            b"0",
            b"16",
            b"007",
            b"+5",
            b"-1",
            b"",
            b"1 ",
            b"x",
            b"123456789012345678",
            b"9223372036854775807",
            b"9223372036854775808",
            b"99999999999999999999",
            b"\xff1",
        ];
        for text in texts {
            let expected = std::str::from_utf8(text).ok().and_then(|t| t.parse().ok());
            assert_eq!(
                integer(text),
                expected,
                "{:?}",
                String::from_utf8_lossy(text)
            );
        }
    }

    /// Resumed at every cut, the framer frames what one parse of the whole does.
    #[test]
    fn resuming_frames_as_parsing_whole() {
        let requests: [&[u8]; 4] = [
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n",
            b"*2\r\n$0\r\n\r\n$12\r\nhello\r\nworld\r\n",
            b"GET \"a b\"\r\n",
            b"*1\r\n$10000000\r\n",
        ];
        for request in requests {
            let whole = parse(request, true, usize::MAX);
            for cut in 0..request.len() {
                let mut framer = Framer::default();
                let first = framer.parse(&request[..cut], true, usize::MAX);
                if first == Parsed::Incomplete {
                    assert_eq!(framer.parse(request, true, usize::MAX), whole, "cut {cut}");
                }
            }
        }
    }

    /// A bulk that would take the request past the limit is refused on its length line,
    /// before its bytes are buffered; a request of exactly the limit is framed.
    #[test]
    fn requests_past_the_limit_are_refused_before_their_data() {
        let request = multibulk_of(&[b"SET", b"k", &[b'v'; 100]]);
        let limit = request.len();
        assert!(matches!(
            parse(&request, true, limit),
            Parsed::Command { .. }
        ));
        assert_eq!(parse(&request[..26], true, limit - 1), Parsed::TooLarge);
        assert_eq!(parse(&request[..20], true, limit - 1), Parsed::Incomplete);
    }
}
