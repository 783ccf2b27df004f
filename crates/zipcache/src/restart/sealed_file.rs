//! The index files a clean `close()` leaves for the next `open()` (`docs/FORMAT.md`): a
//! body followed by its CRC32C, replaced atomically and durably, and read back only if
//! intact.

use crate::format::index_file::seal_at;
use crate::format::{U8, U16, U32, U64};
use crate::restart::dir::IndexDir;

/// One index file: its directory and name, and the run epoch it is written for (or must
/// name to be read back; see `restart::epoch`).
#[derive(Clone, Copy)]
pub struct IndexFile<'a> {
    pub dir: &'a dyn IndexDir,
    pub name: &'a str,
    pub epoch: u64,
}

/// Writes `body` and its CRC32C as `name`: a temporary file beside it, fsync, rename,
/// directory fsync. After a power cut `name` holds either this body or what it held
/// before, never a mix.
pub fn write(dir: &dyn IndexDir, name: &str, mut body: Vec<u8>) -> std::io::Result<()> {
    let crc = crc32c::crc32c(&body);
    let seal = seal_at(body.len());
    body.resize(seal.end(), 0);
    seal.set(&mut body, crc);
    let tmp = format!("{name}.tmp");
    dir.write(&tmp, &body)?;
    dir.sync_file(&tmp)?;
    dir.rename(&tmp, name)?;
    dir.sync_dir()
}

/// The body `write` stored as `name`; `None` if the file is missing, unreadable or
/// damaged.
pub fn read(dir: &dyn IndexDir, name: &str) -> Option<Vec<u8>> {
    let mut bytes = dir.read(name).ok()??;
    let body = bytes.len().checked_sub(U32::SIZE)?;
    if crc32c::crc32c(&bytes[..body]) != seal_at(body).get(&bytes) {
        return None;
    }
    bytes.truncate(body);
    Some(bytes)
}

/// Little-endian fields read in order from a body; every read is `None` past the end.
pub struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        Fields(body)
    }

    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(U8(0).get(self.bytes(U8::SIZE)?))
    }

    pub fn u16(&mut self) -> Option<u16> {
        Some(U16(0).get(self.bytes(U16::SIZE)?))
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(U32(0).get(self.bytes(U32::SIZE)?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(U64(0).get(self.bytes(U64::SIZE)?))
    }

    /// Whether every byte was read (a longer body is not one `write` made).
    pub fn is_done(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restart::dir::FsDir;

    #[test]
    fn sealed_bodies_round_trip_and_damage_is_refused() {
        let path = std::env::temp_dir().join(format!("zc-sealed-{}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        let dir = FsDir::new(&path);
        write(&dir, "f", vec![1, 2, 0, 3, 0, 0, 0]).unwrap();
        let body = read(&dir, "f").unwrap();
        let mut f = Fields::new(&body);
        assert_eq!((f.u8(), f.u16(), f.u32()), (Some(1), Some(2), Some(3)));
        assert!(f.is_done() && f.u8().is_none());
        let mut bytes = std::fs::read(path.join("f")).unwrap();
        bytes[2] ^= 0x10;
        std::fs::write(path.join("f"), &bytes).unwrap();
        assert!(read(&dir, "f").is_none());
        std::fs::remove_dir_all(&path).unwrap();
        assert!(read(&dir, "f").is_none());
    }
}
