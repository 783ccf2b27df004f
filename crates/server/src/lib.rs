//! `zipcache serve`: memcached text/meta and RESP2 servers over the engine.

/// Arguments of `zipcache server` (SPEC §8).
#[derive(clap::Args, Debug)]
pub struct ServeArgs {}

/// Runs `zipcache server`; the error is the message printed to the operator.
pub fn run(_args: ServeArgs) -> Result<(), String> {
    Err("not built yet".into())
}
