//! ZipCache: a hybrid DRAM/SSD key-value cache with compression built into its design.
//!
//! See `docs/ARCHITECTURE.md` for how the paper's techniques map to modules.

pub mod config;
pub mod error;
pub mod stats;

mod async_get;
mod btree;
mod cache;
mod counters;
mod dictionary;
mod dram;
mod eviction;
mod format;
mod io_rates;
mod large_objects;
mod memory;
mod promotion;
mod record;
mod restart;
mod rss_governor;
mod ssd;
mod subpage_hash;
#[cfg(test)]
mod tests;

pub use async_get::AsyncGet;
pub use cache::ZipCache;
pub use config::{Clock, Config, PinnedNow, SsdConfig, SystemClock, parse_size};
pub use dram::Reclaimed;
pub use error::{Error, Result};
pub use eviction::EvictionListener;
pub use stats::Stats;

/// A stored object as `get_item` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub value: Vec<u8>,
    /// Opaque client flags (memcached's `flags`); 0 when never set.
    pub flags: u32,
    /// Compare-and-swap version; 0 when the writer did not ask for one.
    pub cas: u64,
    /// Absolute expiry, Unix milliseconds by the engine's clock; `None` = never expires.
    pub expires_at_ms: Option<u64>,
    /// How the object had been read before the request that returned it (setting
    /// `track_access`, for objects held in DRAM); `None` when tracking is off or the
    /// engine does not know: the answer came from the SSD tier or BT_LO, or from a write.
    pub access: Option<AccessState>,
    /// The value is a collection's header, not a string's bytes (stored with
    /// [`PutOptions::collection`]).
    pub collection: bool,
}

/// What `scan_keys` reports of a stored object: everything [`Item`] holds but the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemInfo {
    /// The value's length in bytes.
    pub value_len: usize,
    pub flags: u32,
    pub cas: u64,
    pub expires_at_ms: Option<u64>,
    pub access: Option<AccessState>,
    /// The value is a collection's header ([`Item::collection`]).
    pub collection: bool,
}

/// memcached's per-item access metadata (its `h`, `l` and `me`'s `fetch=`, `la=`), kept
/// with the setting `track_access` while the object is in DRAM. A write starts it
/// afresh (not fetched, accessed now); a GET that is not a peek marks the object fetched
/// and accessed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessState {
    /// A GET read the object since it was written (or came into DRAM).
    pub fetched: bool,
    /// Its last GET, or the write that stored it: Unix milliseconds by the engine's
    /// clock, kept to the second (a whole number of seconds since the engine opened).
    pub last_access_ms: u64,
}

/// How `get_item` and `get_item_async` read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetOptions {
    /// Leave the object's access state as it is: no fetched mark, no new access time, no
    /// CLOCK reference for its leaf (memcached's meta `u` flag, and `me`).
    pub peek: bool,
}

/// How `put_with` stores an object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// Absolute expiry in Unix milliseconds (engine clock); `None` = never.
    pub expires_at_ms: Option<u64>,
    pub flags: u32,
    /// Stamp the object with a fresh CAS version (memcached clients need one; it costs
    /// a byte or two per object in a page, so plain `put` does not ask for it). Versions
    /// differ between the versions of one key, not between keys.
    pub assign_cas: bool,
    /// Store this CAS instead of assigning one (memcached's meta `E`: the client chooses).
    pub cas: Option<u64>,
    /// The access state the object starts with (setting `track_access`). `None`, a new
    /// write: not fetched, accessed now. A rewrite that only re-dates the object (a
    /// touch) passes the state memcached leaves: fetched and accessed now, or as it was.
    pub access: Option<AccessState>,
    /// The value is a collection's header (a Redis hash's), not a string's bytes: string
    /// commands see the key as holding another type. Kept with the object on every tier
    /// and reported as [`Item::collection`]: a large object's BT_LO entry keeps it as a
    /// tag (`TAG_COLLECTION`).
    pub collection: bool,
}

/// What an `update` closure decides to do with the key it was shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    /// Leave the key as it is.
    Keep,
    Put {
        value: Vec<u8>,
        options: PutOptions,
    },
    /// Keep the value, and store it with `options`' expiry, flags, CAS and access state
    /// (a touch). A large object's value is neither read for it nor written again: only
    /// its BT_LO index entry changes. `options.collection` is ignored: a touch never
    /// changes an object's type, so the stored object keeps its collection mark.
    SetMeta(PutOptions),
    Delete,
}

/// Building blocks the benchmarks measure on their own (paper Table 1 and Fig. 2a, a page
/// in chunks).
/// Not a stable interface.
#[doc(hidden)]
pub mod internals {
    pub use crate::dictionary::page::{PageDictionary, text_record};
    pub use crate::dictionary::training::train_from_samples;
    pub use crate::dram::early_termination::{
        Chunks, compress_chunks, compress_page, decode_span, decompress_prefix,
    };
    pub use crate::dram::packed_page::PackedLayout;
    pub use crate::memory::Memory;
    pub use crate::record::{CasBase, Meta, Payload, Record};
    pub use crate::ssd::leaf_page::Geometry;
    pub use crate::subpage_hash::{dram_subpage, ssd_subpage};
}
