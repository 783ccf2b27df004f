//! RESP framing (multi-bulk and inline) and typing of every framed request into a command,
//! with the checks of `check_resp_framing`; the first byte says whether the client is
//! logged in (bit 0) and whether the server refuses flushes (bit 1).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zipcache_server::fuzzing::{check_resp_framing, engine};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, input)) = data.split_first() else {
        return;
    };
    check_resp_framing(&engine(), input, flags & 1 == 1, flags & 2 == 0);
});
