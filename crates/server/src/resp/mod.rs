//! Redis RESP2 sessions.

mod commands;
mod glob;
pub mod parse;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::connection::{Session, Step};
use crate::server::Shared;
use crate::stats::Counters;

/// Client ids for `CLIENT ID` / `HELLO`, unique for the process like Redis's.
static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// One RESP connection.
pub struct RespSession {
    shared: Arc<Shared>,
    id: u64,
    name: Option<Vec<u8>>,
}

impl RespSession {
    pub fn new(shared: Arc<Shared>) -> RespSession {
        RespSession {
            shared,
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            name: None,
        }
    }
}

impl Session for RespSession {
    fn step(&mut self, input: &[u8], out: &mut Vec<u8>) -> Step {
        match parse::parse(input) {
            parse::Parsed::Incomplete => Step::NeedMore,
            parse::Parsed::Error(message) => {
                Counters::bump(&self.shared.counters.protocol_errors);
                reply::error(out, &message);
                Step::Close
            }
            parse::Parsed::Command { args, len } => {
                if args.is_empty() {
                    return Step::Consumed(len);
                }
                Counters::bump(&self.shared.counters.commands);
                let args: Vec<&[u8]> = args.iter().map(|a| a.as_ref()).collect();
                match commands::execute(self, &args, out) {
                    commands::Flow::Continue => Step::Consumed(len),
                    commands::Flow::Close => Step::Close,
                }
            }
        }
    }
}

/// RESP2 reply encoding.
mod reply {
    pub fn simple(out: &mut Vec<u8>, text: &str) {
        out.push(b'+');
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    /// `message` starts with the error code (`ERR ...`); line breaks would end the reply
    /// early, so they become spaces.
    pub fn error(out: &mut Vec<u8>, message: &str) {
        out.push(b'-');
        out.extend(
            message
                .bytes()
                .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
        out.extend_from_slice(b"\r\n");
    }

    pub fn integer(out: &mut Vec<u8>, n: i64) {
        out.extend_from_slice(format!(":{n}\r\n").as_bytes());
    }

    pub fn bulk(out: &mut Vec<u8>, value: &[u8]) {
        out.extend_from_slice(format!("${}\r\n", value.len()).as_bytes());
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }

    pub fn nil(out: &mut Vec<u8>) {
        out.extend_from_slice(b"$-1\r\n");
    }

    pub fn maybe_bulk(out: &mut Vec<u8>, value: Option<&[u8]>) {
        match value {
            Some(v) => bulk(out, v),
            None => nil(out),
        }
    }

    pub fn array(out: &mut Vec<u8>, len: usize) {
        out.extend_from_slice(format!("*{len}\r\n").as_bytes());
    }
}
