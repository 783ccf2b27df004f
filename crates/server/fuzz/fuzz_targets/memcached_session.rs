//! Arbitrary bytes through a memcached session over a real engine, split at a
//! fuzzer-chosen read size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zipcache_server::fuzzing::{engine, memcached_session};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    memcached_session(engine(), input, usize::from(chunk) + 1);
});
