//! memcached's binary protocol: the framing checks of `check_memcached_binary_framing`
//! request after request, then the same bytes through a session over a real engine,
//! split at a fuzzer-chosen read size. The first byte's high bit picks an open server
//! (the bytes behind a NOOP, so the connection speaks binary) or one with users (behind
//! a SASL PLAIN login as `foo:bar`, so SASL, its CRAM-MD5 exchange and the hang-up of
//! unauthenticated requests are reached).
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use zipcache_server::fuzzing::{
    check_memcached_binary_framing, engine, memcached_binary_request, memcached_session_with,
    options,
};
use zipcache_server::{Credentials, ServerOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&first, input)) = data.split_first() else {
        return;
    };
    check_memcached_binary_framing(input);
    let with_users = first & 0x80 != 0;
    let (options, mut session) = if with_users {
        let users = Credentials::parse(b"foo:bar").expect("credentials");
        let options = ServerOptions {
            users: Some(Arc::new(users)),
            ..options()
        };
        let login = memcached_binary_request(0x21, &[], b"PLAIN", b"\0foo\0bar", 0, 0);
        (options, login)
    } else {
        (
            options(),
            memcached_binary_request(0x0a, &[], &[], &[], 0, 0),
        )
    };
    session.extend_from_slice(input);
    memcached_session_with(engine(), &options, &session, usize::from(first & 0x7f) + 1);
});
