//! Every fixed byte layout ZipCache persists or packs, in one place (`docs/FORMAT.md`):
//! each field a named offset built from the one before it (as redb's `header.rs`), read
//! and written through small typed helpers, so the code says `block::GENERATION.get(b)`
//! where it used to say `b[12..16]`.
//!
//! On the device: [`block`] a BT_SSD sub-page's block and [`packing`] its host-packed
//! payload, [`record`] the records in it (and in DRAM pages and buffers), [`extent`] a
//! BT_LO extent, [`superblock`] the run epoch's block. Beside it: [`index_file`] the
//! headers of the two index files, [`dictionary_file`] a block dictionary's file. In
//! DRAM only: [`page`] a leaf's page (its end table's width, the dictionary version its
//! summary names), [`blob`] a medium object's blob (codec bits, dictionary id),
//! [`buffer`] a write buffer's CAS prefix. Records, blobs
//! and page summaries are mostly varints: their fixed parts are here, the rest is read in
//! order by `record.rs` and `dram/page.rs`.
//!
//! Integers are little-endian. A field's `get` reads it from a buffer that holds the whole
//! layout: every caller checks the buffer's length against the layout's size first, so
//! bytes from the device or a file never reach a `get` short.

pub mod blob;
pub mod block;
pub mod buffer;
pub mod dictionary_file;
pub mod extent;
pub mod index_file;
pub mod journal;
pub mod packing;
pub mod page;
pub mod record;
pub mod shadow;
pub mod superblock;

macro_rules! le_field {
    ($(#[$doc:meta])* $name:ident, $int:ty) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name(pub usize);

        impl $name {
            pub const SIZE: usize = size_of::<$int>();

            /// The offset just past this field: where the next one starts.
            pub const fn end(self) -> usize {
                self.0 + Self::SIZE
            }

            pub fn get(self, buf: &[u8]) -> $int {
                let mut bytes = [0u8; size_of::<$int>()];
                bytes.copy_from_slice(&buf[self.0..self.end()]);
                <$int>::from_le_bytes(bytes)
            }

            pub fn set(self, buf: &mut [u8], value: $int) {
                buf[self.0..self.end()].copy_from_slice(&value.to_le_bytes());
            }
        }
    };
}

le_field!(
    /// A byte at its offset.
    U8,
    u8
);
le_field!(
    /// A little-endian `u16` at its offset.
    U16,
    u16
);
le_field!(
    /// A little-endian `u32` at its offset.
    U32,
    u32
);
le_field!(
    /// A little-endian `u64` at its offset.
    U64,
    u64
);

/// A layout's magic bytes at its offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Magic {
    pub at: usize,
    pub bytes: [u8; 4],
}

impl Magic {
    pub const fn end(self) -> usize {
        self.at + self.bytes.len()
    }

    /// Whether `buf` (the whole layout) carries these magic bytes.
    pub fn is_in(self, buf: &[u8]) -> bool {
        buf[self.at..self.end()] == self.bytes
    }

    pub fn put(self, buf: &mut [u8]) {
        buf[self.at..self.end()].copy_from_slice(&self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_little_endian_where_they_say() {
        let mut buf = [0u8; 16];
        U16(1).set(&mut buf, 0x0201);
        U32(3).set(&mut buf, 0x0605_0403);
        U64(7).set(&mut buf, 0x0e0d_0c0b_0a09_0807);
        U8(15).set(&mut buf, 0x0f);
        assert_eq!(buf, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
        assert_eq!(
            (U16(1).get(&buf), U32(3).get(&buf), U64(7).get(&buf)),
            (0x0201, 0x0605_0403, 0x0e0d_0c0b_0a09_0807)
        );
        assert_eq!((U8(15).get(&buf), U32(3).end(), U64(7).end()), (15, 7, 15));
        let magic = Magic {
            at: 0,
            bytes: *b"\0\x01\x02\x03",
        };
        assert!(magic.is_in(&buf));
        buf[2] = 9;
        assert!(!magic.is_in(&buf));
    }
}
