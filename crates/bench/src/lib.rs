//! `zipcache bench`: cachebench-style workloads against ZipCache and its peers.

/// Arguments of `zipcache bench` (SPEC §8).
#[derive(clap::Args, Debug)]
pub struct BenchArgs {}

/// Runs `zipcache bench`; the error is the message printed to the operator.
pub fn run(_args: BenchArgs) -> Result<(), String> {
    Err("not built yet".into())
}
