//! Commands that act on the server rather than on items: `shutdown` (memcached `-A`)
//! and `cache_memlimit` (the DRAM budget, at run time).

use super::line;
use super::parse::Request;
use crate::server::Shared;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    /// `shutdown` or `shutdown graceful` (`valid`), or a mode memcached does not know.
    Shutdown { valid: bool },
}

/// `shutdown [graceful]`. Both modes stop the server the way SIGTERM does: ours always
/// finishes the requests it has read and closes the engine for a warm restart.
pub fn shutdown<'a>(tokens: &[&'a [u8]]) -> Request<'a> {
    let valid = matches!(tokens, [_] | [_, b"graceful"]);
    Request::Operator(Operator::Shutdown { valid })
}

/// Executes `operator`; false closes the connection.
pub fn execute(shared: &Shared, operator: Operator, out: &mut Vec<u8>) -> bool {
    match operator {
        Operator::Shutdown { .. } if !shared.shutdown_enabled => {
            line(out, "SERVER_ERROR: shutdown not enabled");
        }
        Operator::Shutdown { valid: false } => line(out, "CLIENT_ERROR invalid shutdown mode"),
        Operator::Shutdown { valid: true } => {
            // The owner of the server stops it, this connection included; memcached
            // closes the asking connection without a reply.
            shared.shutdown_requested.notify_one();
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_takes_no_mode_or_graceful() {
        fn parsed(tokens: &[&'static [u8]]) -> Request<'static> {
            shutdown(tokens)
        }
        let valid = |valid| Request::Operator(Operator::Shutdown { valid });
        assert_eq!(parsed(&[b"shutdown"]), valid(true));
        assert_eq!(parsed(&[b"shutdown", b"graceful"]), valid(true));
        assert_eq!(parsed(&[b"shutdown", b"foo"]), valid(false));
        assert_eq!(parsed(&[b"shutdown", b"graceful", b"now"]), valid(false));
    }
}
