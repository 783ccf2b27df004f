//! Passwords kept out of logs and compared in constant time, and the logins a
//! connection gets wrong.

use std::fmt;
use std::time::Duration;

use super::stats::Counters;

/// Failed logins one connection may make: the reply to the last one is its last.
pub const MAX_FAILED_LOGINS: u32 = 5;
/// How long the reply to a connection's first failed login waits; each further failure's
/// waits twice as long as the one before (100, 200, 400, 800, 1600 ms).
const FIRST_FAILURE_DELAY: Duration = Duration::from_millis(100);

/// A required password (`--requirepass`); never empty.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(Vec<u8>);

impl Password {
    /// `None` for an empty text: Redis treats `requirepass ""` as no password.
    pub fn new(text: &str) -> Option<Password> {
        (!text.is_empty()).then(|| Password(text.as_bytes().to_vec()))
    }

    /// Whether `given` is this password. The time taken depends only on `given`'s length:
    /// neither on where it differs nor on the password's own length.
    pub fn matches(&self, given: &[u8]) -> bool {
        self.proven_by(|secret| constant_time_eq(given, secret))
    }

    /// What `proves` says of the password, which it sees and must not leak (a SASL
    /// CRAM-MD5 digest is keyed by it).
    pub fn proven_by(&self, proves: impl FnOnce(&[u8]) -> bool) -> bool {
        proves(&self.0)
    }
}

/// Whether `given` equals `secret`, in time that depends only on `given`'s length:
/// neither on where they differ nor on the secret's own length.
pub fn constant_time_eq(given: &[u8], secret: &[u8]) -> bool {
    let mut differences = u8::from(given.len() != secret.len());
    for (a, b) in given.iter().zip(secret.iter().cycle()) {
        differences |= a ^ b;
    }
    std::hint::black_box(differences) == 0
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

/// One connection's logins: each failure delays its own reply, longer every time, and
/// the connection closes after [`MAX_FAILED_LOGINS`], so that guessing a password costs
/// seconds per guess rather than a round trip. The delay is served by the connection's
/// task (`take_delay`), never by blocking its thread, which serves other connections too.
#[derive(Debug, Default)]
pub struct Logins {
    failures: u32,
    /// The wait owed before the replies appended so far are written.
    delay: Option<Duration>,
}

impl Logins {
    /// Counts a login attempt in `auth_cmds`, and a refused one in `auth_errors` too
    /// (memcached's names) and against this connection. True when the connection must
    /// close after this reply: it has made its last allowed failure.
    pub fn attempted(&mut self, granted: bool, counters: &Counters) -> bool {
        Counters::bump(&counters.auth_cmds);
        if granted {
            return false;
        }
        Counters::bump(&counters.auth_errors);
        self.failures += 1;
        // The longest wait is the last allowed failure's.
        let doublings = self.failures.min(MAX_FAILED_LOGINS) - 1;
        self.delay = Some(FIRST_FAILURE_DELAY * (1 << doublings));
        self.failures >= MAX_FAILED_LOGINS
    }

    /// Whether replies wait for a delay not yet served: nothing more is executed until then.
    pub fn owes_delay(&self) -> bool {
        self.delay.is_some()
    }

    /// The delay owed, once.
    pub fn take_delay(&mut self) -> Option<Duration> {
        self.delay.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failed_login_waits_twice_as_long_and_the_fifth_closes() {
        let counters = Counters::default();
        let mut logins = Logins::default();
        assert!(!logins.attempted(true, &counters));
        assert_eq!(logins.take_delay(), None, "a login is answered at once");
        let mut delays = Vec::new();
        let mut closing = Vec::new();
        for _ in 0..MAX_FAILED_LOGINS {
            closing.push(logins.attempted(false, &counters));
            assert!(logins.owes_delay());
            delays.push(logins.take_delay().unwrap().as_millis());
            assert!(!logins.owes_delay());
        }
        assert_eq!(delays, [100, 200, 400, 800, 1600]);
        assert_eq!(closing, [false, false, false, false, true]);
        let count = |name| {
            let snapshot = counters.snapshot();
            snapshot.into_iter().find(|(n, _)| *n == name).unwrap().1
        };
        assert_eq!((count("auth_cmds"), count("auth_errors")), (6, 5));
    }

    #[test]
    fn passwords_match_exactly_and_stay_out_of_logs() {
        let password = Password::new("s3cret").unwrap();
        assert!(password.matches(b"s3cret"));
        for wrong in [
            &b""[..],
            b"s3cre",
            b"s3cret ",
            b"s3cres",
            b"S3cret",
            b"s3crets3cret",
        ] {
            assert!(!password.matches(wrong), "{wrong:?}");
        }
        assert_eq!(Password::new(""), None);
        assert!(!format!("{password:?}").contains("s3cret"));
    }
}
