//! A minimal HTTP/1.0 responder for Prometheus scrapes of `GET /metrics`, over TLS when
//! the data ports speak it (the same acceptor, so the same certificates, reloaded with
//! theirs). Only the users of `--metrics-auth-file` may scrape: HTTP Basic, or
//! `Authorization: Bearer <password>` for its user `default`. The data ports' passwords are
//! not accepted here, so a scraper's credential opens nothing else; when the data ports
//! require a login and no metrics user is set, no one may scrape.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::core::Core;
use crate::core::access::{AccessPolicy, DEFAULT_USER};
use crate::core::stats::prometheus;
use crate::transport::{Direct, Transport};

const MAX_REQUEST: usize = 8 * 1024;
/// The whole of one scrape — TLS handshake, request, reply — or the connection is
/// dropped: a client dribbling bytes holds a slot this long at most.
pub const SCRAPE_DEADLINE: Duration = Duration::from_secs(5);
/// Scrapes served at once; more are closed unanswered (a scraper retries next interval).
pub const MAX_SCRAPES: usize = 8;

const LOG_IN: &str = "log in: HTTP Basic with a user of --metrics-auth-file, or Bearer <its user default's password>\n";
const NO_SCRAPERS: &str = "the data ports require a login and their passwords are not accepted here: set --metrics-auth-file\n";

/// The metrics port: at most [`MAX_SCRAPES`] connections open at once.
pub struct Endpoint {
    transport: Arc<Transport>,
    slots: Arc<Semaphore>,
}

impl Endpoint {
    pub fn new(transport: Arc<Transport>) -> Endpoint {
        Endpoint {
            transport,
            slots: Arc::new(Semaphore::new(MAX_SCRAPES)),
        }
    }

    /// The port's service: [`Endpoint::admit`] on the accepting thread.
    pub fn into_direct(self) -> Direct {
        Arc::new(move |stream| self.admit(stream))
    }

    /// Answers `stream` in a task of its own, within [`SCRAPE_DEADLINE`], or closes it at
    /// once when every slot is taken.
    pub fn admit(&self, stream: TcpStream) {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return;
        };
        let transport = self.transport.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(SCRAPE_DEADLINE, serve(stream, &transport)).await;
            drop(slot);
        });
    }
}

async fn serve(stream: TcpStream, transport: &Transport) {
    match &transport.tls {
        None => respond(stream, &transport.core).await,
        Some(tls) => {
            if let Ok(stream) = tls.acceptor().accept(stream).await {
                respond(stream, &transport.core).await;
            }
        }
    }
}

async fn respond<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, core: &Core) {
    let mut request = Vec::with_capacity(1024);
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < MAX_REQUEST {
        match stream.read_buf(&mut request).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    let (status, body) = if let Some(refusal) = refusal(&request, core) {
        (
            "401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"zipcache metrics\"",
            refusal.to_string(),
        )
    } else if request.starts_with(b"GET /metrics ") {
        (
            "200 OK",
            prometheus(&core.counters, &core.keys.engine().stats()),
        )
    } else {
        ("404 Not Found", "try /metrics\n".to_string())
    };
    let response = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Why the request may not scrape, if it may not: it does not log in as a metrics user,
/// or there are none while the data ports require a login.
fn refusal(request: &[u8], core: &Core) -> Option<&'static str> {
    if core.metrics_access.required() {
        (!authorized(request, &core.metrics_access)).then_some(LOG_IN)
    } else if core.access.required() {
        Some(NO_SCRAPERS)
    } else {
        None
    }
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
