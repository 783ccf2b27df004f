//! A DRAM leaf's write buffer (DRAM only, never written): once written, the largest
//! ordered CAS version of its records, a filter of the buffered keys (its length, then
//! its bytes: two bits set by each key), then the records (`format/record.rs`) with
//! their versions whole.

use super::{U8, U64};

pub const CAS_TOP: U64 = U64(0);
/// The filter's length in bytes (8 to 64, from the buffer's limit).
pub const FILTER_LEN: U8 = U8(CAS_TOP.end());
/// Where the filter starts; the records start where it ends.
pub const FILTER: usize = FILTER_LEN.end();
