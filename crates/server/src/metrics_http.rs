//! A minimal HTTP/1.0 responder for Prometheus scrapes of `GET /metrics`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::server::Shared;
use crate::stats::prometheus;

const MAX_REQUEST: usize = 8 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn respond(mut stream: TcpStream, shared: Arc<Shared>) {
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
    let (status, body) = if request.starts_with(b"GET /metrics ") {
        (
            "200 OK",
            prometheus(&shared.counters, &shared.cache.stats()),
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
