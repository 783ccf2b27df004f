//! A DRAM leaf's write buffer (DRAM only, never written): once written, the largest
//! ordered CAS version of its records, then the records (`format/record.rs`) with their
//! versions whole.

use super::U64;

pub const CAS_TOP: U64 = U64(0);
/// Where the records start.
pub const RECORDS: usize = CAS_TOP.end();
