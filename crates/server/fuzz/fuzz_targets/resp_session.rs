//! Arbitrary bytes through a RESP session over a real engine, split at a fuzzer-chosen
//! read size; the same byte decides whether the server wants a password (bit 0) and
//! refuses flushes (bit 1).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zipcache_server::fuzzing::{engine, options, resp_session_with};
use zipcache_server::{Password, ServerOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    let options = ServerOptions {
        requirepass: Password::new("pw").filter(|_| chunk & 1 == 1),
        flush_all_enabled: chunk & 2 == 0,
        ..options()
    };
    resp_session_with(engine(), &options, input, usize::from(chunk) + 1);
});
