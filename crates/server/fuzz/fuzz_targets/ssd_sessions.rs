//! Arbitrary bytes through a memcached and a RESP session over an engine whose SSD tier
//! holds the short keys the dictionaries name (`k`, `a`, `foo`, …: see
//! `fuzzing::new_hybrid_engine`), split at a fuzzer-chosen read size: their GETs go in
//! flight and the requests pipelined behind them are read ahead (`prefetch`), a path the
//! DRAM-only session targets never take.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zipcache_server::fuzzing::{hybrid_engine, memcached_session, resp_session};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk) + 1;
    memcached_session(hybrid_engine(), input, chunk);
    resp_session(hybrid_engine(), input, chunk, None);
});
