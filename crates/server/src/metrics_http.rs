//! A minimal HTTP/1.0 responder for Prometheus scrapes of `GET /metrics`. When the access
//! policy requires a login, so does a scrape: HTTP Basic with any user of the policy, or
//! `Authorization: Bearer <password>` with the `default` user's (`--requirepass`).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::core::Core;
use crate::core::access::{AccessPolicy, DEFAULT_USER};
use crate::core::stats::prometheus;
use crate::transport::Direct;

const MAX_REQUEST: usize = 8 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A scraper that does not take its reply in this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Scrapes served at once; more are closed unanswered (a scraper retries next interval).
pub const MAX_SCRAPES: usize = 8;

/// The metrics port: at most [`MAX_SCRAPES`] connections open at once.
pub struct Endpoint {
    core: Arc<Core>,
    slots: Arc<Semaphore>,
}

impl Endpoint {
    pub fn new(core: Arc<Core>) -> Endpoint {
        Endpoint {
            core,
            slots: Arc::new(Semaphore::new(MAX_SCRAPES)),
        }
    }

    /// The port's service: [`Endpoint::admit`] on the accepting thread.
    pub fn into_direct(self) -> Direct {
        Arc::new(move |stream| self.admit(stream))
    }

    /// Answers `stream` in a task of its own, or closes it at once when every slot is
    /// taken.
    pub fn admit(&self, stream: TcpStream) {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return;
        };
        let core = self.core.clone();
        tokio::spawn(async move {
            respond(stream, &core).await;
            drop(slot);
        });
    }
}

async fn respond(mut stream: TcpStream, core: &Core) {
    let mut request = Vec::with_capacity(1024);
    let headers_read = tokio::time::timeout(READ_TIMEOUT, async {
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < MAX_REQUEST {
            match stream.read_buf(&mut request).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
        true
    })
    .await;
    if headers_read != Ok(true) {
        return;
    }
    let (status, body) = if !authorized(&request, &core.access) {
        (
            "401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"zipcache\"",
            "log in: HTTP Basic with a user of the server, or Bearer <requirepass>\n".to_string(),
        )
    } else if request.starts_with(b"GET /metrics ") {
        ("200 OK", prometheus(&core.counters, &core.cache.stats()))
    } else {
        ("404 Not Found", "try /metrics\n".to_string())
    };
    let response = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Whether the request's `Authorization` header logs in under `access` (any request does
/// when the policy requires no login).
fn authorized(request: &[u8], access: &AccessPolicy) -> bool {
    if !access.required() {
        return true;
    }
    let Some(credentials) = header(request, b"authorization") else {
        return false;
    };
    let Some(space) = credentials.iter().position(|&b| b == b' ') else {
        return false;
    };
    let (scheme, value) = (&credentials[..space], credentials[space + 1..].trim_ascii());
    if scheme.eq_ignore_ascii_case(b"bearer") {
        return access.admits(DEFAULT_USER, value);
    }
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return false;
    }
    let Ok(pair) = base64::engine::general_purpose::STANDARD.decode(value) else {
        return false;
    };
    let Some(colon) = pair.iter().position(|&b| b == b':') else {
        return false;
    };
    access.admits(&pair[..colon], &pair[colon + 1..])
}

/// The value of the first header `name` (lowercase) in the request's head.
fn header<'a>(request: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let head_end = request.windows(4).position(|w| w == b"\r\n\r\n")?;
    request[..head_end]
        .split(|&b| b == b'\n')
        .skip(1)
        .find_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            line[..colon]
                .eq_ignore_ascii_case(name)
                .then(|| line[colon + 1..].trim_ascii())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::auth::Password;

    const REQUEST: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n";

    fn with(header: &str) -> Vec<u8> {
        [REQUEST, header.as_bytes(), b"\r\n"].concat()
    }

    #[test]
    fn basic_and_bearer_log_in_against_the_policy() {
        let users = crate::core::access::Credentials::parse(b"alice:a:b\n").unwrap();
        let access = AccessPolicy::new(Password::new("pw"), Some(Arc::new(users)));
        // alice:a:b — the password runs past the first colon.
        assert!(authorized(
            &with("Authorization: Basic YWxpY2U6YTpi\r\n"),
            &access
        ));
        assert!(authorized(&with("AUTHORIZATION:  bearer pw \r\n"), &access));
        assert!(!authorized(&with("Authorization: Bearer p\r\n"), &access));
        assert!(!authorized(
            &with("Authorization: Basic YWxpY2U6YQ==\r\n"),
            &access
        ));
        assert!(!authorized(&with("Authorization: Digest x\r\n"), &access));
        assert!(!authorized(&with("Authorization: Basic\r\n"), &access));
        assert!(!authorized(
            &with("X-Authorization: Bearer pw\r\n"),
            &access
        ));
        assert!(!authorized(&with(""), &access));
        // A header after the head's end is the body's, not a header.
        assert!(!authorized(
            &[REQUEST, b"\r\nAuthorization: Bearer pw\r\n\r\n"].concat(),
            &access
        ));
        assert!(authorized(&with(""), &AccessPolicy::new(None, None)));
    }
}
