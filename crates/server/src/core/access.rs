//! One access policy for both data ports. A password (`--requirepass`, the user
//! `default`'s, as Redis) and a user file (`--auth-file`, memcached's `user:password`
//! lines) are two sources of the same users: a memcached client logs in with memcached's
//! ascii handshake (text) or SASL PLAIN or CRAM-MD5 (binary), a RESP client with
//! `AUTH`/`HELLO … AUTH`, and each accepts every user. Either source set protects both;
//! neither set leaves both open. The metrics port's scrapers are a policy of their own,
//! of a user file only (`--metrics-auth-file`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::auth::{Password, constant_time_eq};

/// The user a `--requirepass` password belongs to, on every protocol (Redis's name).
pub const DEFAULT_USER: &[u8] = b"default";

/// Who may use the server.
pub struct AccessPolicy {
    password: Option<Password>,
    /// Replaced whole when the user file is read again (SIGHUP).
    users: Option<ArcSwap<Credentials>>,
}

impl fmt::Debug for AccessPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let users = self.users.as_ref().map(|users| users.load().users.len());
        write!(
            f,
            "AccessPolicy(password: {}, users: {users:?})",
            self.password.is_some()
        )
    }
}

impl AccessPolicy {
    pub fn new(password: Option<Password>, users: Option<Arc<Credentials>>) -> AccessPolicy {
        AccessPolicy {
            password,
            users: users.map(ArcSwap::new),
        }
    }

    /// Whether clients must log in before anything else, on every port.
    pub fn required(&self) -> bool {
        self.password.is_some() || self.users.is_some()
    }

    /// Whether `user` logs in with `password`: the `default` user with the
    /// `--requirepass` password, or a user of the user file. Without either, only
    /// `default` exists and takes any password (Redis's `nopass` default user). Every
    /// secret is compared in full, in time that depends only on the lengths given.
    pub fn admits(&self, user: &[u8], password: &[u8]) -> bool {
        if !self.required() {
            return user == DEFAULT_USER;
        }
        self.admits_proof(user, |secret| constant_time_eq(password, secret))
    }

    /// Whether `user` proves it knows its password without sending it (SASL CRAM-MD5):
    /// `proves` is asked of every password the policy holds (the `--requirepass` one and
    /// each user file line's), whoever `user` is, so the time taken depends only on how
    /// many there are; a password counts only for its own user. Without a policy no one
    /// has a password to prove.
    pub fn admits_proof(&self, user: &[u8], proves: impl Fn(&[u8]) -> bool) -> bool {
        let by_password = self
            .password
            .as_ref()
            .is_some_and(|required| required.proven_by(&proves))
            & (user == DEFAULT_USER);
        let by_file = self
            .users
            .as_ref()
            .is_some_and(|users| users.load().check_proof(user, &proves));
        by_password | by_file
    }

    /// SIGHUP, as memcached: the user file read again. `None` without one; otherwise what
    /// happened, and a file that fails to load leaves the users loaded before.
    pub fn reload_users(&self) -> Option<String> {
        let users = self.users.as_ref()?;
        let reloaded = users.load().reloaded()?;
        Some(match reloaded {
            Ok(new) => {
                users.store(Arc::new(new));
                "auth file reloaded".to_string()
            }
            Err(e) => format!("auth file not reloaded, the old users stay: {e}"),
        })
    }
}

/// The users of an auth file (memcached's `-Y` format).
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
    fn reloaded(&self) -> Option<Result<Credentials, String>> {
        self.source.as_deref().map(Credentials::load)
    }

    /// `user:password` per line (the password runs to the end of the line); blank lines
    /// are skipped. A user name with a space is refused: memcached's handshake ends the
    /// name at the first space, so that user could log in over RESP and never over
    /// memcached.
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
            let (user, password) = (&line[..colon], &line[colon + 1..]);
            if user.contains(&b' ') {
                return Err(format!(
                    "line {}: a user name with a space cannot log in over memcached",
                    number + 1
                ));
            }
            users.push((user.to_vec(), password.to_vec()));
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
        self.check_proof(user, |secret| constant_time_eq(password, secret))
    }

    /// Whether `user` is a line's user and `proves` accepts that line's password, asked
    /// of every line (`AccessPolicy::admits_proof`).
    fn check_proof(&self, user: &[u8], proves: impl Fn(&[u8]) -> bool) -> bool {
        self.users.iter().fold(false, |found, (u, p)| {
            found | (constant_time_eq(user, u) & proves(p))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users() -> Credentials {
        Credentials::parse(b"foo:bar\r\nbaaaz:quux\n\n").unwrap()
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
        assert!(Credentials::parse(b"a:b c").unwrap().check(b"a", b"b c"));
        assert!(Credentials::parse(b"nocolon\n").is_err());
        assert!(Credentials::parse(b"\n").is_err());
        assert_eq!(format!("{users:?}"), "Credentials(2 users)");
    }

    #[test]
    fn a_user_memcached_could_not_name_is_refused() {
        let error = Credentials::parse(b"ok:1\nann lee:pw\n").unwrap_err();
        assert!(
            error.contains("line 2") && error.contains("space"),
            "{error}"
        );
    }

    #[test]
    fn the_password_is_the_default_users_and_the_file_adds_users() {
        let password_only = AccessPolicy::new(Password::new("s3cret"), None);
        assert!(password_only.required());
        assert!(password_only.admits(b"default", b"s3cret"));
        assert!(!password_only.admits(b"default", b"s3cre"));
        assert!(!password_only.admits(b"alice", b"s3cret"));

        let file_only = AccessPolicy::new(None, Some(Arc::new(users())));
        assert!(file_only.required());
        assert!(file_only.admits(b"foo", b"bar"));
        assert!(!file_only.admits(b"default", b""));
        assert!(!file_only.admits(b"default", b"bar"));

        let both = AccessPolicy::new(Password::new("s3cret"), Some(Arc::new(users())));
        assert!(both.admits(b"default", b"s3cret") && both.admits(b"baaaz", b"quux"));
        assert!(!both.admits(b"foo", b"s3cret"));
        assert!(!format!("{both:?}").contains("s3cret"));
    }

    #[test]
    fn a_proof_is_asked_of_every_password_and_counts_for_its_own_user() {
        let both = AccessPolicy::new(Password::new("s3cret"), Some(Arc::new(users())));
        let asked = std::cell::RefCell::new(Vec::new());
        let proves = |secret: &[u8]| {
            asked.borrow_mut().push(secret.to_vec());
            secret == b"bar"
        };
        assert!(both.admits_proof(b"foo", proves));
        // Every password was asked, whichever user logs in.
        assert_eq!(asked.borrow().len(), 3);
        assert!(!both.admits_proof(b"baaaz", proves));
        assert!(!both.admits_proof(b"default", proves));
        assert!(both.admits_proof(b"default", |secret| secret == b"s3cret"));
        assert!(!both.admits_proof(b"foo", |secret| secret == b"s3cret"));
        // Without a policy there is no password to prove.
        assert!(!AccessPolicy::new(None, None).admits_proof(b"default", |_| true));
    }

    #[test]
    fn without_a_password_or_a_file_only_default_exists_and_is_open() {
        let open = AccessPolicy::new(None, None);
        assert!(!open.required());
        assert!(open.admits(b"default", b"anything"));
        assert!(!open.admits(b"foo", b"bar"));
        assert_eq!(open.reload_users(), None);
    }
}
