//! memcached framing alone (text, meta, and the authentication block of a connection that
//! must log in first), request after request, with the checks of `check_memcached_framing`:
//! no engine, so far more inputs per second than the session targets.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zipcache_server::fuzzing::check_memcached_framing;

fuzz_target!(|data: &[u8]| {
    check_memcached_framing(data);
});
