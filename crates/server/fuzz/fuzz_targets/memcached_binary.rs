//! memcached's binary protocol: the framing checks of `check_memcached_binary_framing`
//! request after request, then the same bytes through a session over a real engine
//! (behind a NOOP, so the connection speaks binary), split at a fuzzer-chosen read size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zipcache_server::fuzzing::{
    check_memcached_binary_framing, engine, memcached_binary_request, memcached_session,
};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    check_memcached_binary_framing(input);
    let mut session = memcached_binary_request(0x0a, &[], &[], &[], 0, 0);
    session.extend_from_slice(input);
    memcached_session(engine(), &session, usize::from(chunk) + 1);
});
