//! The headers of the two index files a clean `close()` writes beside the SSD file
//! (`docs/FORMAT.md`, "The index file", "The large-object index file"). Each file is a
//! header, then its entries one after another (variable length: read in order, by
//! `sealed_file::Fields`), then its seal: the CRC32C of all before it (`restart/sealed_file.rs`).
//! Both headers start alike: magic, version, the run epoch of the run that wrote the file.

use super::{Magic, U32, U64};

/// Both files' magic bytes stand first.
const MAGIC_LEN: usize = 4;
pub const VERSION: U32 = U32(MAGIC_LEN);
/// The run epoch of the run that wrote it.
pub const EPOCH: U64 = U64(VERSION.end());

/// One kind of index file: its magic, the version written now, its header's length.
pub struct IndexKind {
    pub magic: Magic,
    pub version: u32,
    pub header: usize,
}

impl IndexKind {
    /// A header of this kind for the run of `epoch`, its other fields zeros for the caller
    /// to set.
    pub fn header(&self, epoch: u64) -> Vec<u8> {
        let mut out = vec![0; self.header];
        self.magic.put(&mut out);
        VERSION.set(&mut out, self.version);
        EPOCH.set(&mut out, epoch);
        out
    }

    /// Whether `body` holds a whole header of this kind and version, written by the run of
    /// `epoch`: only then are its other fields read.
    pub fn is_current(&self, body: &[u8], epoch: u64) -> bool {
        body.len() >= self.header
            && self.magic.is_in(body)
            && VERSION.get(body) == self.version
            && EPOCH.get(body) == epoch
    }
}

/// The seal behind a body of `body_len` bytes: its CRC32C.
pub const fn seal_at(body_len: usize) -> U32 {
    U32(body_len)
}

const fn magic(bytes: [u8; MAGIC_LEN]) -> Magic {
    Magic { at: 0, bytes }
}

/// `<ssd file>.index`: BT_SSD's super-leaf descriptors.
pub mod ssd {
    use super::{EPOCH, IndexKind, magic};
    use crate::format::{U32, U64};

    /// `m`, sub-pages per super-leaf.
    pub const SUBPAGES: U32 = U32(EPOCH.end());
    pub const BLOCK_COUNT: U64 = U64(SUBPAGES.end());
    /// The next never-used slot.
    pub const NEXT_SLOT: U32 = U32(BLOCK_COUNT.end());
    /// Super-leaves that follow, in key order: low fence length (u16), low fence, slot
    /// (u32, `u32::MAX` for none), generation (u32), objects per sub-page (`m` × u16),
    /// the id of the block dictionary each sub-page's block was packed with (`m` × u32,
    /// 0 for none).
    pub const COUNT: U32 = U32(NEXT_SLOT.end());
    pub const HEADER: usize = COUNT.end();

    /// After the descriptors: the count (u32) of the fingerprints (u64 each) of keys
    /// whose flash versions stay hidden (`restart/shadow.rs`), then those.
    ///
    /// Version 5 since the crash journal (format 7): an index of 4 is not loaded (a cold
    /// start).
    pub const FILE: IndexKind = IndexKind {
        magic: magic(*b"ZCIX"),
        version: 5,
        header: HEADER,
    };
}

/// `<ssd file>.lo-index`: BT_LO's live extents and where its log stands.
pub mod large {
    use super::{EPOCH, IndexKind, magic};
    use crate::format::{U32, U64};

    /// The region: its first block and its length in blocks.
    pub const START: U64 = U64(EPOCH.end());
    pub const BLOCKS: U64 = U64(START.end());
    /// The log's head: the next block to write, relative to the region.
    pub const HEAD: U64 = U64(BLOCKS.end());
    pub const NEXT_SEQ: U64 = U64(HEAD.end());
    /// Extents that follow, oldest first: key length (u16), key, first block relative to
    /// the region (u64), blocks (u32), value length (u32), sequence number (u64), tags
    /// (u8: [`TAG_EXPIRY`], [`TAG_CLIENT_CAS`], [`TAG_COLLECTION`]), expiry (u64), flags
    /// (u32), CAS (u64).
    pub const COUNT: U32 = U32(NEXT_SEQ.end());
    pub const HEADER: usize = COUNT.end();

    /// An extent's tags: it has an expiry; the client chose its CAS; it is a collection's
    /// (a hash field's element: `Meta::collection`). Other bits are refused: an engine
    /// older than a tag refuses the file that carries it (its BT_LO starts empty) rather
    /// than serve an element as a string.
    pub const TAG_EXPIRY: u8 = 1;
    pub const TAG_CLIENT_CAS: u8 = 1 << 1;
    pub const TAG_COLLECTION: u8 = 1 << 2;
    pub const TAGS_KNOWN: u8 = TAG_EXPIRY | TAG_CLIENT_CAS | TAG_COLLECTION;

    /// Version 3 since extents of version 2 (format 5): an index of 2 names extents of
    /// version 1, which are refused, so it is not loaded (the region starts empty).
    pub const FILE: IndexKind = IndexKind {
        magic: magic(*b"ZCLX"),
        version: 3,
        header: HEADER,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header offsets `docs/FORMAT.md` gives, field by field.
    #[test]
    fn the_index_file_headers_are_pinned() {
        assert_eq!([VERSION.0, EPOCH.0], [4, 8]);
        let bt_ssd = [
            ssd::SUBPAGES.0,
            ssd::BLOCK_COUNT.0,
            ssd::NEXT_SLOT.0,
            ssd::COUNT.0,
            ssd::HEADER,
        ];
        assert_eq!(bt_ssd, [16, 20, 28, 32, 36]);
        let bt_lo = [
            large::START.0,
            large::BLOCKS.0,
            large::HEAD.0,
            large::NEXT_SEQ.0,
            large::COUNT.0,
            large::HEADER,
        ];
        assert_eq!(bt_lo, [16, 24, 32, 40, 48, 52]);
        let header = ssd::FILE.header(0x0102_0304_0506_0708);
        assert_eq!(
            &header[..16],
            b"ZCIX\x05\0\0\0\x08\x07\x06\x05\x04\x03\x02\x01"
        );
        assert!(ssd::FILE.is_current(&header, 0x0102_0304_0506_0708));
        assert!(!ssd::FILE.is_current(&header, 7), "another run's");
        assert!(
            !large::FILE.is_current(&header, 0x0102_0304_0506_0708),
            "another kind"
        );
        assert!(
            !ssd::FILE.is_current(&header[..35], 0x0102_0304_0506_0708),
            "cut short"
        );
        assert_eq!(&large::FILE.header(1)[..8], b"ZCLX\x03\0\0\0");
    }
}
