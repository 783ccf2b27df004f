//! A sub-page block's payload packed by the host (`device_compression=host`;
//! `docs/FORMAT.md`, "Packed payload"): the raw records' length, then one LZ4 block of
//! them.

use super::U16;

/// Raw record bytes the LZ4 block decodes to.
pub const RAW_LEN: U16 = U16(0);
/// Where the LZ4 block starts.
pub const LZ4_BLOCK: usize = RAW_LEN.end();
/// Raw record bytes one packed block may carry: what [`RAW_LEN`] can say.
pub const RAW_MAX: usize = u16::MAX as usize;
