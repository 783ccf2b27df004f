//! memcached's ascii authentication (memcached `-Y`): while the server's access policy
//! requires a login, a connection's only accepted request is
//! `set <any key> <flags> <exptime> <bytes>\r\n<user> <password>\r\n`, answered `STORED`;
//! everything else gets a `CLIENT_ERROR`, with memcached's wording. The users are the
//! policy's: those of `--auth-file`, and `default` with the `--requirepass` password.

use crate::core::access::AccessPolicy;

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
    /// `len` bytes were consumed and get `reply`; `login` says whether they were a user
    /// and password checked (`Some`), and whether those logged in.
    Answered {
        reply: &'static str,
        len: usize,
        login: Option<bool>,
    },
}

/// Frames and checks one authentication attempt at the front of `input`.
pub fn attempt(input: &[u8], access: &AccessPolicy) -> Attempt {
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
    // Refused before any password is checked: memcached counts no login then.
    let refuse = |reply, len| Attempt::Answered {
        reply,
        len,
        login: None,
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
    let granted = access.admits(&token[..space], &token[space + 1..]);
    Attempt::Answered {
        reply: if granted {
            "STORED"
        } else {
            "CLIENT_ERROR authentication failure"
        },
        len,
        login: Some(granted),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::core::access::Credentials;

    fn users() -> AccessPolicy {
        let file = Credentials::parse(b"foo:bar\r\nbaaaz:quux\n\n").unwrap();
        AccessPolicy::new(None, Some(Arc::new(file)))
    }

    /// The reply to a request refused before any password was checked.
    fn reply(input: &[u8]) -> (&'static str, usize) {
        match attempt(input, &users()) {
            Attempt::Answered {
                reply,
                len,
                login: None,
            } => (reply, len),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_a_set_with_user_and_password_authenticates() {
        assert_eq!(
            attempt(b"set foo 0 0 7\r\nfoo bar\r\nget x\r\n", &users()),
            Attempt::Answered {
                reply: "STORED",
                len: 24,
                login: Some(true)
            }
        );
        assert_eq!(
            attempt(b"set foo 0 0 7\r\nfoo bab\r\n", &users()),
            Attempt::Answered {
                reply: "CLIENT_ERROR authentication failure",
                len: 24,
                login: Some(false)
            }
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
