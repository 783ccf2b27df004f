//! The `zipcache` command: `serve` runs the cache server, `bench` drives workloads.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc hands freed memory back and fragments less than glibc's per-thread arenas
/// under the cache's churn of small page and blob allocations, so RSS tracks what the
/// engine accounts; `allocator` says how it is tuned.
mod allocator;

#[derive(Parser)]
#[command(
    name = "zipcache",
    version,
    about = "A hybrid DRAM/SSD key-value cache with built-in compression"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the memcached (text + meta) and Redis RESP protocols.
    Serve(Box<zipcache_server::ServeArgs>),
    /// Run a cachebench-style workload against ZipCache and its peers.
    Bench(Box<zipcache_bench::BenchArgs>),
}

fn main() -> ExitCode {
    allocator::configure();
    let result = match Cli::parse().command {
        Command::Serve(args) => {
            allocator::disable_thp();
            zipcache_server::run(*args)
        }
        Command::Bench(args) => zipcache_bench::run(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("zipcache: {message}");
            ExitCode::FAILURE
        }
    }
}
