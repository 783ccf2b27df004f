//! Typed RESP commands over a real engine: a real command name chosen by the first byte,
//! arguments split at zero bytes, sent as one multi-bulk request; the second byte says
//! whether the server wants a password (bit 0) and refuses flushes (bit 1).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zipcache_server::fuzzing::{
    engine, options, resp_command_names, resp_request, resp_session_with,
};
use zipcache_server::{Password, ServerOptions};

fuzz_target!(|data: &[u8]| {
    let [pick, flags, rest @ ..] = data else {
        return;
    };
    let names = resp_command_names();
    let name = names[usize::from(*pick) % names.len()];
    let mut args = vec![name.as_bytes()];
    args.extend(rest.split(|&b| b == 0));
    let request = resp_request(&args);
    let options = ServerOptions {
        requirepass: Password::new("pw").filter(|_| flags & 1 == 1),
        flush_all_enabled: flags & 2 == 0,
        ..options()
    };
    resp_session_with(engine(), &options, &request, request.len());
});
