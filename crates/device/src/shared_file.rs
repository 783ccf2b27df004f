//! The open file of a [`FileDevice`](crate::FileDevice), shared with the reads it has in
//! flight on thread rings.

use std::fs::File;

use crate::counters::IoCounters;

/// The open file and its counters, shared with the reads in flight on thread rings: each
/// holds an `Arc` so the descriptor stays open until the kernel is done with it.
#[derive(Debug)]
pub(crate) struct SharedFile {
    pub(crate) file: File,
    pub(crate) counters: IoCounters,
}
