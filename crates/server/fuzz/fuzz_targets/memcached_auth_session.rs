//! Arbitrary bytes through a memcached session that must authenticate first (users
//! `foo:bar`), split at a fuzzer-chosen read size.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use zipcache_server::fuzzing::{engine, memcached_session_with, options};
use zipcache_server::{Credentials, ServerOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    let options = ServerOptions {
        users: Some(Arc::new(
            Credentials::parse(b"foo:bar").expect("credentials"),
        )),
        ..options()
    };
    memcached_session_with(engine(), &options, input, usize::from(chunk) + 1);
});
