//! Page-based eviction (paper §3.3): when DRAM is full, a whole BT_DRAM leaf leaves,
//! chosen by second chance (CLOCK). The hand walks the leaves in key order; a leaf
//! touched since the hand last passed gets its bit cleared and is spared once.
//!
//! The victim's objects go to an [`EvictionSink`]: the SSD tier, which merges them into
//! the super-leaves covering the leaf's key range, or nothing in DRAM-only mode. The sink
//! runs while the victim is still locked, so no GET can see the leaf gone and the SSD
//! copy not yet written (which could serve an older value).

use crate::btree::Fence;
use crate::record::Meta;

/// Told of each value the cache forgets to make room (memcached's `watch evictions`).
/// Reported: values dropped from DRAM with no tier below to take them. Not reported:
/// leaves handed to the SSD tier (nothing is forgotten), clean copies dropped (the SSD
/// holds them), and what the SSD tier itself gives up.
pub trait EvictionListener: Send + Sync {
    /// Checked once per eviction: while false, an eviction costs nothing more.
    fn listening(&self) -> bool;
    /// `key`'s value of `value_len` bytes left the cache at `now_ms`; it would have
    /// expired at `expires_at_ms`.
    fn evicted(&self, key: &[u8], value_len: usize, expires_at_ms: Option<u64>, now_ms: u64);
}

/// One object of an evicted leaf, as the newest version the DRAM tier held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictedObject {
    pub key: Vec<u8>,
    /// `None` is a tombstone: the key was deleted (or overwritten by a large object) and
    /// any SSD copy must go.
    pub value: Option<Vec<u8>>,
    pub meta: Meta,
}

/// Where evicted objects go.
pub trait EvictionSink: Send + Sync {
    /// Takes the objects of one leaf covering keys `[low, high)`, in key order.
    /// Returns false if it could not keep them (they are then forgotten: a miss later,
    /// never a wrong value, because the SSD tier drops every copy it holds in the range
    /// that it failed to update).
    fn absorb(&self, low: &[u8], high: Option<&[u8]>, objects: Vec<EvictedObject>) -> bool;

    /// The key range that one `absorb` of `[low, high)` rewrites anyway: the DRAM tier
    /// evicts the neighbours inside it in the same batch.
    fn span(&self, low: &Fence, high: Option<&[u8]>) -> (Fence, Option<Fence>);

    /// Drops every copy it holds of keys in `[low, high)`: a DRAM leaf whose page was
    /// damaged no longer knows which of its keys hold newer versions or tombstones.
    fn forget(&self, low: &[u8], high: Option<&[u8]>);
}
