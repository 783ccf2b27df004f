//! Commands that act on the server rather than on items: `shutdown` (memcached `-A`)
//! and `cache_memlimit` (the DRAM budget, at run time: `ZipCache::set_dram_capacity`).

use super::Memcached;
use super::line;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    /// `shutdown` or `shutdown graceful` (`valid`), or a mode memcached does not know.
    Shutdown { valid: bool },
    /// `cache_memlimit <MiB> [noreply]`; `None`: no number memcached would take.
    CacheMemlimit {
        mebibytes: Option<u32>,
        noreply: bool,
    },
    /// `refresh_certs`: the TLS certificate, key and CA files read again.
    RefreshCerts,
}

/// memcached's bounds on `cache_memlimit`, in MiB.
const MEMLIMIT_MIN: u32 = 8;
const MEMLIMIT_MAX: u32 = 1_000_000_000;

/// `shutdown [graceful]`. Both modes stop the server the way SIGTERM does: ours always
/// finishes the requests it has read and closes the engine for a warm restart.
pub fn shutdown(tokens: &[&[u8]]) -> Operator {
    let valid = matches!(tokens, [_] | [_, b"graceful"]);
    Operator::Shutdown { valid }
}

/// `cache_memlimit <MiB> [noreply]`: the DRAM budget, in MiB as memcached's.
pub fn cache_memlimit(tokens: &[&[u8]]) -> Operator {
    let noreply = tokens.len() > 2 && tokens.last() == Some(&&b"noreply"[..]);
    let mebibytes = tokens
        .get(1)
        .and_then(|t| std::str::from_utf8(t).ok())
        .and_then(|t| t.parse().ok());
    Operator::CacheMemlimit { mebibytes, noreply }
}

fn memlimit_reply(shared: &Memcached, mebibytes: Option<u32>) -> &'static str {
    match mebibytes {
        None => "ERROR",
        Some(m) if m < MEMLIMIT_MIN => "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m",
        Some(m) if m > MEMLIMIT_MAX => "MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes",
        Some(m) => match shared
            .core
            .strings
            .engine()
            .set_dram_capacity(u64::from(m) << 20)
        {
            Ok(()) => "OK",
            Err(_) => "MEMLIMIT_ADJUST_FAILED out of bounds or unable to adjust",
        },
    }
}

/// Executes `operator`; false closes the connection.
pub fn execute(shared: &Memcached, operator: Operator, out: &mut Vec<u8>) -> bool {
    match operator {
        Operator::Shutdown { .. } if !shared.core.shutdown_enabled => {
            line(out, "SERVER_ERROR: shutdown not enabled");
        }
        Operator::Shutdown { valid: false } => line(out, "CLIENT_ERROR invalid shutdown mode"),
        Operator::Shutdown { valid: true } => {
            // The owner of the server stops it, this connection included; memcached
            // closes the asking connection without a reply.
            shared.core.shutdown_requested.notify_one();
            return false;
        }
        Operator::CacheMemlimit { mebibytes, noreply } => {
            let reply = memlimit_reply(shared, mebibytes);
            if !noreply {
                line(out, reply);
            }
        }
        // memcached's replies, errors included, which it writes without a prefix.
        Operator::RefreshCerts => match shared.transport.refresh_certs() {
            Ok(true) => line(out, "OK"),
            Ok(false) => line(out, "Error TLS not enabled"),
            // A line break in a file name would end the reply early.
            Err(e) => line(
                out,
                &format!("Error loading the certificates: {e}").replace(['\r', '\n'], " "),
            ),
        },
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_takes_no_mode_or_graceful() {
        let parsed = |tokens: &[&[u8]]| shutdown(tokens);
        let valid = |valid| Operator::Shutdown { valid };
        assert_eq!(parsed(&[b"shutdown"]), valid(true));
        assert_eq!(parsed(&[b"shutdown", b"graceful"]), valid(true));
        assert_eq!(parsed(&[b"shutdown", b"foo"]), valid(false));
        assert_eq!(parsed(&[b"shutdown", b"graceful", b"now"]), valid(false));
    }

    #[test]
    fn cache_memlimit_takes_a_32_bit_count_of_mib() {
        let limit = |mebibytes, noreply| Operator::CacheMemlimit { mebibytes, noreply };
        assert_eq!(
            cache_memlimit(&[b"cache_memlimit", b"16"]),
            limit(Some(16), false)
        );
        assert_eq!(
            cache_memlimit(&[b"cache_memlimit", b"16", b"noreply"]),
            limit(Some(16), true)
        );
        assert_eq!(cache_memlimit(&[b"cache_memlimit"]), limit(None, false));
        assert_eq!(
            cache_memlimit(&[b"cache_memlimit", b"-1"]),
            limit(None, false)
        );
        assert_eq!(
            cache_memlimit(&[b"cache_memlimit", b"4294967296"]),
            limit(None, false)
        );
        assert_eq!(
            cache_memlimit(&[b"cache_memlimit", b"8m"]),
            limit(None, false)
        );
    }
}
