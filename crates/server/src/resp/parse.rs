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
}

/// Frames the request at the front of `input` from a client `authenticated` or not.
pub fn parse(input: &[u8], authenticated: bool) -> Parsed<'_> {
    match input.first() {
        None => Parsed::Incomplete,
        Some(b'*') => multibulk(input, authenticated),
        Some(_) => inline(input),
    }
}

/// The line starting at `from`, without its `\r\n`, and the offset after it.
fn line_at(input: &[u8], from: usize) -> Option<(&[u8], usize)> {
    let end = from + input.get(from..)?.windows(2).position(|w| w == b"\r\n")?;
    Some((&input[from..end], end + 2))
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

fn integer(text: &[u8]) -> Option<i64> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

fn multibulk(input: &[u8], authenticated: bool) -> Parsed<'_> {
    let Some((header, mut pos)) = line_at(input, 0) else {
        return if input.len() > MAX_INLINE {
            Parsed::Error("ERR Protocol error: too big mbulk count string".into())
        } else {
            Parsed::Incomplete
        };
    };
    let count = match integer(&header[1..]) {
        Some(n) if !authenticated && n > UNAUTHENTICATED_MULTIBULK => {
            return Parsed::Error("ERR Protocol error: unauthenticated multibulk length".into());
        }
        Some(n) if n <= MAX_MULTIBULK as i64 => n,
        _ => return Parsed::Error("ERR Protocol error: invalid multibulk length".into()),
    };
    let count = usize::try_from(count).unwrap_or(0);
    let mut args = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let Some(&first) = input.get(pos) else {
            return Parsed::Incomplete;
        };
        if first != b'$' {
            return Parsed::Error(expected_dollar(first));
        }
        let Some((len_line, data_start)) = line_at(input, pos) else {
            return if input.len() - pos > MAX_INLINE {
                Parsed::Error("ERR Protocol error: too big bulk count string".into())
            } else {
                Parsed::Incomplete
            };
        };
        let len = match integer(&len_line[1..]) {
            Some(n) if !authenticated && n > UNAUTHENTICATED_BULK => {
                return Parsed::Error("ERR Protocol error: unauthenticated bulk length".into());
            }
            Some(n) if (0..=MAX_BULK as i64).contains(&n) => n as usize,
            _ => return Parsed::Error("ERR Protocol error: invalid bulk length".into()),
        };
        let end = data_start + len;
        if input.len() < end + 2 {
            return Parsed::Incomplete;
        }
        // Like Redis, the two bytes after a bulk are skipped unchecked.
        args.push(Cow::Borrowed(&input[data_start..end]));
        pos = end + 2;
    }
    Parsed::Command { args, len: pos }
}

fn expected_dollar(found: u8) -> String {
    format!(
        "ERR Protocol error: expected '$', got '{}'",
        char::from(found).escape_default()
    )
}

fn inline(input: &[u8]) -> Parsed<'_> {
    let Some(newline) = input.iter().position(|&b| b == b'\n') else {
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
        match parse(input, true) {
            Parsed::Command { args, len } => {
                (args.into_iter().map(|a| a.into_owned()).collect(), len)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn multibulk_frames() {
        assert_eq!(parse(b"*2\r\n$3\r\nGET\r\n$1\r", true), Parsed::Incomplete);
        let (args, len) = command(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1");
        assert_eq!(args, vec![b"GET".to_vec(), b"k".to_vec()]);
        assert_eq!(len, 20);
        assert_eq!(command(b"*0\r\n").0.len(), 0);
        assert!(matches!(parse(b"*x\r\n", true), Parsed::Error(_)));
        assert!(matches!(parse(b"*1\r\n$-5\r\n", true), Parsed::Error(_)));
        assert!(matches!(parse(b"*1\r\n:5\r\n", true), Parsed::Error(_)));
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
        assert!(matches!(parse(b"get \"k\r\n", true), Parsed::Error(_)));
        assert_eq!(command(b"\r\n").0.len(), 0);
    }

    /// Before `AUTH`, as Redis: at most 10 arguments of at most 16 KiB each.
    #[test]
    fn unauthenticated_requests_stay_small() {
        let error = |input: &[u8]| match parse(input, false) {
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
        assert_eq!(parse(b"*10\r\n$16384\r\n", false), Parsed::Incomplete);
        assert_eq!(parse(b"*11\r\n", true), Parsed::Incomplete);
        assert_eq!(parse(b"*2\r\n$16385\r\n", true), Parsed::Incomplete);
    }
}
