//! Typed RESP commands: a real command name chosen by the first byte, arguments split at
//! zero bytes, sent as one multi-bulk request; an odd second byte requires a password.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use zipcache::{Config, ZipCache};
use zipcache_server::fuzzing::{resp_command_names, resp_request, resp_session};

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
    let [pick, flags, rest @ ..] = data else {
        return;
    };
    let names = resp_command_names();
    let name = names[usize::from(*pick) % names.len()];
    let mut args = vec![name.as_bytes()];
    args.extend(rest.split(|&b| b == 0));
    let request = resp_request(&args);
    let requirepass = (flags % 2 == 1).then_some("pw");
    resp_session(cache(), &request, request.len(), requirepass);
});
