//! SASL on the binary protocol, against the server's one access policy: PLAIN (RFC 4616:
//! the password in the clear, one step) and CRAM-MD5 (RFC 2195: the server sends a
//! challenge, the client answers with its user and the HMAC-MD5 of the challenge keyed
//! by its password, so the password never crosses the network). memcached with Cyrus
//! SASL lists both, and libmemcached-based clients (pylibmc) pick CRAM-MD5 when it is
//! listed. CRAM-MD5 is not strong either: anyone who records an exchange can test
//! password guesses against it offline, so TLS is still what protects a login on a
//! network that is not trusted.

use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use md5::Md5;
use ring::rand::{SecureRandom, SystemRandom};

use crate::core::access::AccessPolicy;
use crate::core::auth::constant_time_eq;

/// What `SASL_LIST_MECHS` answers (space-separated, as Cyrus SASL lists them).
pub const MECHANISMS: &[u8] = b"CRAM-MD5 PLAIN";

const PLAIN: &[u8] = b"PLAIN";
const CRAM_MD5: &[u8] = b"CRAM-MD5";

/// How one `SASL_AUTH` or `SASL_STEP` ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The connection is logged in.
    Authenticated,
    /// The client must answer this challenge with a `SASL_STEP` (memcached's "auth
    /// continue").
    Continue(Vec<u8>),
    Failed,
}

/// A connection's SASL exchange: the CRAM-MD5 challenge it was sent and has not answered.
#[derive(Debug, Default)]
pub struct Exchange {
    challenge: Option<Vec<u8>>,
}

impl Exchange {
    /// `SASL_AUTH`: starts over with `mechanism` and the client's first message.
    pub fn start(&mut self, access: &AccessPolicy, mechanism: &[u8], data: &[u8]) -> Outcome {
        self.challenge = None;
        if mechanism == PLAIN {
            let admitted = plain_credentials(data)
                .is_some_and(|(user, password)| access.admits(user, password));
            return if admitted {
                Outcome::Authenticated
            } else {
                Outcome::Failed
            };
        }
        if mechanism != CRAM_MD5 {
            return Outcome::Failed;
        }
        match new_challenge() {
            Some(challenge) => {
                self.challenge = Some(challenge.clone());
                Outcome::Continue(challenge)
            }
            None => Outcome::Failed,
        }
    }

    /// `SASL_STEP`: the answer to the challenge sent; without one there is no step to
    /// take (PLAIN has one step), as in memcached. Either way the challenge is used up.
    pub fn step(&mut self, access: &AccessPolicy, data: &[u8]) -> Outcome {
        let Some(challenge) = self.challenge.take() else {
            return Outcome::Failed;
        };
        if cram_md5_admits(access, &challenge, data) {
            Outcome::Authenticated
        } else {
            Outcome::Failed
        }
    }
}

/// `authzid \0 authcid \0 password` (RFC 4616): the user and password.
fn plain_credentials(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (_authzid, user, password) = (parts.next()?, parts.next()?, parts.next()?);
    Some((user, password))
}

/// RFC 2195's msg-id form, `<random.time@host>`: never the same twice, and not
/// predictable, so a recorded answer is good for no later challenge. `None` if the
/// system's random source fails.
fn new_challenge() -> Option<Vec<u8>> {
    let mut random = [0u8; 16];
    SystemRandom::new().fill(&mut random).ok()?;
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    Some(format!("<{}.{seconds}@zipcache>", lower_hex(&random)).into_bytes())
}

/// Whether `response` (`user SP digest`, the digest in hex) answers `challenge` for a
/// user of `access`. The digest is compared with each password's in constant time.
fn cram_md5_admits(access: &AccessPolicy, challenge: &[u8], response: &[u8]) -> bool {
    // The digest has no space; the user name may.
    let Some(space) = response.iter().rposition(|&b| b == b' ') else {
        return false;
    };
    let (user, digest) = (
        &response[..space],
        response[space + 1..].to_ascii_lowercase(),
    );
    access.admits_proof(user, |password| {
        constant_time_eq(&digest, &cram_md5_digest(password, challenge))
    })
}

/// HMAC-MD5 of `challenge` keyed by `password`, in lower-case hex (RFC 2195).
pub(super) fn cram_md5_digest(password: &[u8], challenge: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length, so this never fails.
    let Ok(mut mac) = Hmac::<Md5>::new_from_slice(password) else {
        return Vec::new();
    };
    mac.update(challenge);
    lower_hex(&mac.finalize().into_bytes()).into_bytes()
}

fn lower_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::core::access::Credentials;
    use crate::core::auth::Password;

    fn policy() -> AccessPolicy {
        let users = Credentials::parse(b"tim:tanstaaftanstaaf\n").unwrap();
        AccessPolicy::new(Password::new("s3cret"), Some(Arc::new(users)))
    }

    #[test]
    fn the_rfc_2195_example_digest() {
        let challenge = b"<1896.697170952@postoffice.reston.mci.net>";
        assert_eq!(
            cram_md5_digest(b"tanstaaftanstaaf", challenge),
            b"b913a602c7eda7a495b4e6e7334d3890"
        );
        assert!(cram_md5_admits(
            &policy(),
            challenge,
            b"tim b913a602c7eda7a495b4e6e7334d3890"
        ));
        // Hex digits in either case.
        assert!(cram_md5_admits(
            &policy(),
            challenge,
            b"tim B913A602C7EDA7A495B4E6E7334D3890"
        ));
        for wrong in [
            &b"tim b913a602c7eda7a495b4e6e7334d3891"[..],
            b"tim b913a602c7eda7a495b4e6e7334d389",
            b"tom b913a602c7eda7a495b4e6e7334d3890",
            b"default b913a602c7eda7a495b4e6e7334d3890",
            b"timb913a602c7eda7a495b4e6e7334d3890",
            b"",
        ] {
            assert!(!cram_md5_admits(&policy(), challenge, wrong), "{wrong:?}");
        }
    }

    fn answer(
        exchange: &mut Exchange,
        access: &AccessPolicy,
        user: &str,
        password: &[u8],
    ) -> Outcome {
        let Outcome::Continue(challenge) = exchange.start(access, CRAM_MD5, b"") else {
            panic!("no challenge");
        };
        let mut response = format!("{user} ").into_bytes();
        response.extend(cram_md5_digest(password, &challenge));
        exchange.step(access, &response)
    }

    #[test]
    fn cram_md5_logs_in_file_users_and_default_once_per_challenge() {
        let access = policy();
        let mut exchange = Exchange::default();
        assert_eq!(
            answer(&mut exchange, &access, "tim", b"tanstaaftanstaaf"),
            Outcome::Authenticated
        );
        assert_eq!(
            answer(&mut exchange, &access, "default", b"s3cret"),
            Outcome::Authenticated
        );
        assert_eq!(
            answer(&mut exchange, &access, "tim", b"s3cret"),
            Outcome::Failed
        );
        // Each challenge is new, and answers only once.
        let Outcome::Continue(first) = exchange.start(&access, CRAM_MD5, b"") else {
            panic!()
        };
        let Outcome::Continue(second) = exchange.start(&access, CRAM_MD5, b"") else {
            panic!()
        };
        assert_ne!(first, second);
        assert!(second.starts_with(b"<") && second.ends_with(b"@zipcache>"));
        let mut replayed = b"tim ".to_vec();
        replayed.extend(cram_md5_digest(b"tanstaaftanstaaf", &first));
        assert_eq!(exchange.step(&access, &replayed), Outcome::Failed);
        let mut late = b"tim ".to_vec();
        late.extend(cram_md5_digest(b"tanstaaftanstaaf", &second));
        assert_eq!(exchange.step(&access, &late), Outcome::Failed);
    }

    #[test]
    fn plain_and_unknown_mechanisms() {
        let access = policy();
        let mut exchange = Exchange::default();
        assert_eq!(
            exchange.start(&access, PLAIN, b"\0tim\0tanstaaftanstaaf"),
            Outcome::Authenticated
        );
        assert_eq!(
            exchange.start(&access, PLAIN, b"tim\0default\0s3cret"),
            Outcome::Authenticated
        );
        assert_eq!(exchange.start(&access, PLAIN, b"\0tim"), Outcome::Failed);
        assert_eq!(exchange.start(&access, b"DIGEST-MD5", b""), Outcome::Failed);
        // PLAIN has no second step.
        assert_eq!(exchange.step(&access, b"tim x"), Outcome::Failed);
    }
}
