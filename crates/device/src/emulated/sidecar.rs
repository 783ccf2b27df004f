//! The sidecar `<data file>.csd`: the per-LBA size table persisted by a clean flush or
//! close, so that the next open need not rebuild it from the data.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, RwLock};

use super::accounting::{Accounting, RAW_BLOCK};
use crate::DeviceCompression;

/// Sidecar format: magic, version, mode, block count, one little-endian u16 per LBA, CRC32C.
const SIDECAR_MAGIC: [u8; 8] = *b"ZCCSDTBL";
const SIDECAR_VERSION: u32 = 1;
pub(super) const SIDECAR_HEADER_LEN: usize = 8 + 4 + 4 + 8;

/// Where the per-LBA physical sizes of a [`CompressingDevice`](crate::CompressingDevice) came from at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccountingOrigin {
    /// `Hardware` mode: the host cannot see physical sizes, so none are kept.
    NotTracked,
    /// Read from a valid sidecar written by a clean flush or close (warm restart).
    Loaded,
    /// Recomputed by reading and compressing every data extent of the device.
    Rebuilt(RebuildReason),
}

/// Why a [`CompressingDevice`](crate::CompressingDevice) rebuilt its accounting instead of loading it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RebuildReason {
    /// No sidecar path was configured.
    NoSidecar,
    /// The sidecar file does not exist: first open, or writes happened after the last
    /// flush and the process stopped without a clean close.
    SidecarMissing,
    /// The sidecar exists but is unusable (bad checksum, wrong size, other mode or geometry).
    SidecarInvalid(String),
}

pub(super) struct Sidecar {
    pub(super) path: PathBuf,
    /// True while the file at `path` matches the table (written by the last flush and no
    /// mutation since).
    pub(super) on_disk: AtomicBool,
    /// Writers and trimmers hold it shared, flush exclusively: a flush's snapshot then never
    /// misses a write that already reached the device.
    pub(super) gate: RwLock<()>,
    /// Lets one mutator delete the sidecar while the others wait for the deletion.
    pub(super) invalidation: Mutex<()>,
}

impl Sidecar {
    /// Writes the table to the sidecar, durably: a crash leaves the old state or the new.
    pub(super) fn persist(
        &self,
        mode: DeviceCompression,
        accounting: &Accounting,
    ) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(SIDECAR_HEADER_LEN + accounting.sizes.len() * 2 + 4);
        bytes.extend_from_slice(&SIDECAR_MAGIC);
        bytes.extend_from_slice(&SIDECAR_VERSION.to_le_bytes());
        bytes.extend_from_slice(&mode_tag(mode).to_le_bytes());
        bytes.extend_from_slice(&(accounting.sizes.len() as u64).to_le_bytes());
        for size in accounting.sizes.iter() {
            bytes.extend_from_slice(&size.load(Ordering::Relaxed).to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());

        // Write-then-rename: a crash mid-write leaves the old state (no sidecar), never half
        // a table that could pass for a whole one.
        let mut temp = self.path.clone().into_os_string();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        fs::rename(&temp, &self.path)?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
    /// Deletes a persisted sidecar before the first mutation after it was written, so a
    /// sidecar on disk always matches the device.
    pub(super) fn invalidate(&self) -> io::Result<()> {
        if self.on_disk.load(Ordering::Acquire) {
            let _only_one = self.invalidation.lock();
            if self.on_disk.load(Ordering::Acquire) {
                remove_if_present(&self.path)?;
                self.on_disk.store(false, Ordering::Release);
            }
        }
        Ok(())
    }
}

fn mode_tag(mode: DeviceCompression) -> u32 {
    match mode {
        DeviceCompression::Emulate => 1,
        DeviceCompression::None => 2,
        DeviceCompression::Hardware => 3,
        DeviceCompression::Host => 4,
    }
}

/// Fills `accounting` from the sidecar at `path`. The outer error is an I/O failure to
/// report; the inner one says why the sidecar cannot be used (then we rebuild).
pub(super) fn load_sidecar(
    path: &Path,
    mode: DeviceCompression,
    accounting: &Accounting,
) -> io::Result<Result<(), RebuildReason>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Ok(Err(RebuildReason::SidecarMissing));
        }
        Err(err) => return Err(err),
    };
    let invalid = |why: &str| Ok(Err(RebuildReason::SidecarInvalid(why.to_string())));
    let blocks = accounting.sizes.len();
    if bytes.len() != SIDECAR_HEADER_LEN + blocks * 2 + 4 {
        return invalid("length does not match the device's block count");
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return invalid("CRC32C mismatch");
    }
    let (header, table) = body.split_at(SIDECAR_HEADER_LEN);
    let field = |range: Range<usize>| {
        let mut out = [0u8; 8];
        out[..range.len()].copy_from_slice(&header[range]);
        u64::from_le_bytes(out)
    };
    if header[..8] != SIDECAR_MAGIC || field(8..12) != u64::from(SIDECAR_VERSION) {
        return invalid("not a version-1 sidecar");
    }
    if field(12..16) != u64::from(mode_tag(mode)) {
        return invalid("written in another compression mode");
    }
    if field(16..24) != blocks as u64 {
        return invalid("written for a device of another size");
    }
    let mut used = 0;
    for (slot, entry) in accounting.sizes.iter().zip(table.chunks_exact(2)) {
        let size = u16::from_le_bytes([entry[0], entry[1]]);
        if size > RAW_BLOCK {
            return invalid("block size above 4096");
        }
        slot.store(size, Ordering::Relaxed);
        used += u64::from(size);
    }
    accounting.physical_used.store(used, Ordering::Relaxed);
    Ok(Ok(()))
}

pub(super) fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}
