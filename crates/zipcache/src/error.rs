//! Errors the engine returns. Bad input is an error, never a panic.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("key is empty")]
    EmptyKey,
    #[error("key of {len} bytes exceeds the limit of {max} bytes")]
    KeyTooLarge { len: usize, max: usize },
    #[error("value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge { len: usize, max: usize },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("the cache is closed")]
    Closed,
    /// The DRAM budget is full and `evictions` is off: the write was not made.
    #[error("out of memory storing object")]
    OutOfMemory,
    #[error(
        "{path} is locked by another engine (process {holder}): one process per data directory"
    )]
    Locked {
        path: std::path::PathBuf,
        holder: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
