//! Arbitrary bytes through a memcached session that must authenticate first (users
//! `foo:bar`), split at a fuzzer-chosen read size.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use zipcache::{Config, ZipCache};
use zipcache_server::fuzzing::memcached_session_with;
use zipcache_server::{Credentials, ServerOptions};

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
    let options = ServerOptions {
        max_value_size: 1 << 20,
        memcached_auth: Some(Arc::new(
            Credentials::parse(b"foo:bar").expect("credentials"),
        )),
        ..ServerOptions::default()
    };
    memcached_session_with(cache(), &options, input, usize::from(chunk) + 1);
});
