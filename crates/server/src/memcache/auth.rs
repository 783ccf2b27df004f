//! memcached's ascii authentication (`-Y FILE`, here `--auth-file FILE`): the file holds
//! `user:password` lines; until a connection authenticates, its only accepted request is
//! `set <any key> <flags> <exptime> <bytes>\r\n<user> <password>\r\n`, answered `STORED`;
//! everything else gets a `CLIENT_ERROR`, with memcached's wording.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::auth::constant_time_eq;

/// The users of an auth file.
pub struct Credentials {
    users: Vec<(Vec<u8>, Vec<u8>)>,
    /// The file they were read from, to read again on SIGHUP.
    source: Option<PathBuf>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials({} users)", self.users.len())
    }
}

impl Credentials {
    pub fn load(path: &Path) -> Result<Credentials, String> {
        let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let users = Credentials::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Credentials {
            source: Some(path.to_path_buf()),
            ..users
        })
    }

    /// The users of the same file read again (`None`: these were not read from a file).
    pub fn reloaded(&self) -> Option<Result<Credentials, String>> {
        self.source.as_deref().map(Credentials::load)
    }

    /// `user:password` per line (the password runs to the end of the line); blank lines
    /// are skipped.
    pub fn parse(text: &[u8]) -> Result<Credentials, String> {
        let mut users = Vec::new();
        for (number, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let colon = line
                .iter()
                .position(|&b| b == b':')
                .ok_or_else(|| format!("line {}: expected user:password", number + 1))?;
            users.push((line[..colon].to_vec(), line[colon + 1..].to_vec()));
        }
        if users.is_empty() {
            return Err("no user:password line".into());
        }
        Ok(Credentials {
            users,
            source: None,
        })
    }

    /// Whether `user` and `password` match a line. Every line is compared in full, in
    /// time that depends only on the lengths, so timing tells nothing about how much of
    /// a guess was right.
    pub fn check(&self, user: &[u8], password: &[u8]) -> bool {
        self.users.iter().fold(false, |found, (u, p)| {
            found | (constant_time_eq(user, u) & constant_time_eq(password, p))
        })
    }
}

/// An auth line shorter than this cannot be one; memcached hangs up.
const LINE_MIN: usize = 6;
/// A line this long without a newline is junk; memcached hangs up.
const LINE_MAX: usize = 2048;
/// Longest `user password` block memcached reads.
const TOKEN_MAX: usize = 16384;

/// What an unauthenticated connection's input amounts to.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    NeedMore,
    Close,
    /// `len` bytes were consumed and get `reply`; `granted` when it is `STORED`.
    Answered {
        reply: &'static str,
        len: usize,
        granted: bool,
    },
}

/// Frames and checks one authentication attempt at the front of `input`.
pub fn attempt(input: &[u8], credentials: &Credentials) -> Attempt {
    let Some(newline) = input.iter().position(|&b| b == b'\n') else {
        return if input.len() > LINE_MAX {
            Attempt::Close
        } else {
            Attempt::NeedMore
        };
    };
    if newline < LINE_MIN {
        return Attempt::Close;
    }
    let line_len = newline + 1;
    let refuse = |reply, len| Attempt::Answered {
        reply,
        len,
        granted: false,
    };
    let tokens = super::parse::line_tokens(input, newline);
    let size = tokens
        .get(4)
        .and_then(|t| std::str::from_utf8(t).ok())
        .and_then(|t| t.parse::<u32>().ok());
    let (Some(b"set"), Some(size)) = (tokens.first().copied(), size) else {
        return refuse("CLIENT_ERROR unauthenticated", line_len);
    };
    let size = size as usize;
    if size > TOKEN_MAX {
        return refuse("CLIENT_ERROR auth token too long", line_len);
    }
    let len = line_len + size + 2;
    let Some(block) = input.get(line_len..len) else {
        return Attempt::NeedMore;
    };
    let (token, end) = block.split_at(size);
    if end != b"\r\n" {
        return refuse("CLIENT_ERROR bad command line termination", len);
    }
    let Some(space) = token.iter().position(|&b| b == b' ') else {
        return refuse("CLIENT_ERROR bad authentication token format", len);
    };
    if credentials.check(&token[..space], &token[space + 1..]) {
        Attempt::Answered {
            reply: "STORED",
            len,
            granted: true,
        }
    } else {
        refuse("CLIENT_ERROR authentication failure", len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users() -> Credentials {
        Credentials::parse(b"foo:bar\r\nbaaaz:quux\n\n").unwrap()
    }

    fn reply(input: &[u8]) -> (&'static str, usize) {
        match attempt(input, &users()) {
            Attempt::Answered { reply, len, .. } => (reply, len),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn auth_files_parse_like_memcached() {
        let users = users();
        assert!(users.check(b"foo", b"bar"));
        assert!(users.check(b"baaaz", b"quux"));
        assert!(!users.check(b"foo", b"bab"));
        assert!(!users.check(b"foo", b"ba"));
        assert!(!users.check(b"foo", b"barr"));
        assert!(!users.check(b"baaaz", b"bar"));
        assert!(Credentials::parse(b"a:b:c").unwrap().check(b"a", b"b:c"));
        assert!(Credentials::parse(b"nocolon\n").is_err());
        assert!(Credentials::parse(b"\n").is_err());
        assert_eq!(format!("{users:?}"), "Credentials(2 users)");
    }

    #[test]
    fn only_a_set_with_user_and_password_authenticates() {
        assert_eq!(
            attempt(b"set foo 0 0 7\r\nfoo bar\r\nget x\r\n", &users()),
            Attempt::Answered {
                reply: "STORED",
                len: 24,
                granted: true
            }
        );
        assert_eq!(
            reply(b"set foo 0 0 7\r\nfoo bab\r\n"),
            ("CLIENT_ERROR authentication failure", 24)
        );
        assert_eq!(
            reply(b"set foo 0 0 2\r\nhi\r\n"),
            ("CLIENT_ERROR bad authentication token format", 19)
        );
        assert_eq!(
            reply(b"set foo 0 0 2\r\nhiXX"),
            ("CLIENT_ERROR bad command line termination", 19)
        );
        assert_eq!(reply(b"get foo\r\n"), ("CLIENT_ERROR unauthenticated", 9));
        assert_eq!(
            reply(b"set foo 0 0 -1\r\n"),
            ("CLIENT_ERROR unauthenticated", 16)
        );
        assert_eq!(
            reply(b"set foo 0 0 2147483646\r\n"),
            ("CLIENT_ERROR auth token too long", 24)
        );
    }

    #[test]
    fn partial_and_junk_input() {
        assert_eq!(
            attempt(b"set foo 0 0 7\r\nfoo", &users()),
            Attempt::NeedMore
        );
        assert_eq!(attempt(b"set fo", &users()), Attempt::NeedMore);
        assert_eq!(attempt(b"ab\r\n", &users()), Attempt::Close);
        assert_eq!(attempt(&[b'x'; 3000], &users()), Attempt::Close);
    }
}
