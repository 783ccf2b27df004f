//! Arbitrary bytes through a RESP session, split at a fuzzer-chosen read size.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use zipcache::{Config, ZipCache};
use zipcache_server::fuzzing::resp_session;

fn cache() -> Arc<ZipCache> {
    static CACHE: OnceLock<Arc<ZipCache>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let config = Config {
                dram_capacity: 16 << 20,
                ..Config::default()
            };
            Arc::new(ZipCache::open(config).expect("engine"))
        })
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    // An odd chunk byte makes the session require a password (AUTH paths).
    let requirepass = (chunk % 2 == 1).then_some("pw");
    resp_session(cache(), input, usize::from(chunk) + 1, requirepass);
});
