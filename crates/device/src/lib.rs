//! The device layer: everything ZipCache's SSD tier knows about storage.
//!
//! The SSD tier speaks only [`BlockDevice`]: 4 KiB logical blocks (LBAs) that can be
//! read, written, trimmed and flushed. Implementations live one per module.

use std::io;

/// The unit of every device I/O, and the size of one SSD sub-page.
pub const BLOCK_SIZE: usize = 4096;

/// How the device treats the bytes the host writes (SPEC §3, `device_compression`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceCompression {
    /// Emulate an SSD with built-in per-4KB zlib compression and account physical bytes.
    #[default]
    Emulate,
    /// A plain SSD: physical bytes equal host bytes.
    None,
    /// The device compresses in hardware; the host cannot observe physical bytes.
    Hardware,
}

/// Counters a device exposes. Byte counts are totals since the device was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct DeviceStats {
    /// Logical capacity in bytes (may exceed physical capacity under compression).
    pub logical_capacity: u64,
    /// Physical (NAND) capacity in bytes.
    pub physical_capacity: u64,
    /// Physical bytes currently holding live blocks (after compression).
    pub physical_used: u64,
    /// `V_host`: bytes the host wrote through the interface.
    pub host_bytes_written: u64,
    /// `V_NAND`: bytes that reached NAND after per-4KB compression.
    pub nand_bytes_written: u64,
    pub host_bytes_read: u64,
    pub reads: u64,
    pub writes: u64,
    pub trims: u64,
}

/// A device of 4 KiB logical blocks. Buffers are whole blocks: `buf.len()` is a multiple
/// of [`BLOCK_SIZE`]. Implementations accept any buffer; an [`AlignedBuf`] avoids a copy
/// on devices opened with `O_DIRECT`.
pub trait BlockDevice: Send + Sync {
    /// Number of logical blocks.
    fn block_count(&self) -> u64;
    /// Reads `buf.len() / BLOCK_SIZE` blocks starting at `lba`. Trimmed blocks read as zeros.
    fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf.len() / BLOCK_SIZE` blocks starting at `lba`.
    fn write(&self, lba: u64, buf: &[u8]) -> io::Result<()>;
    /// Discards `count` blocks starting at `lba`; they read as zeros afterwards.
    fn trim(&self, lba: u64, count: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    fn stats(&self) -> DeviceStats;
}
