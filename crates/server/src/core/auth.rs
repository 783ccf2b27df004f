//! Passwords kept out of logs and compared in constant time.

use std::fmt;

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

#[cfg(test)]
mod tests {
    use super::*;

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
