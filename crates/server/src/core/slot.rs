//! Which of a Redis Cluster's 16,384 hash slots a key belongs to (Redis's
//! `keyHashSlot`): what the keyspace counts its generations by (`keyspace.rs`), a
//! topology assigns to nodes (`topology.rs`) and the cluster routes on (`cluster.rs`).
//! A module of its own so that none of those reaches into another for it.

use crc::{CRC_16_XMODEM, Crc};

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

const CRC16: Crc<u16> = Crc::<u16>::new(&CRC_16_XMODEM);

/// Redis's `keyHashSlot`: CRC16/XMODEM of the key, or of its hash tag — what lies between
/// the first `{` and the first `}` after it, if that is not empty — modulo 16,384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let tag = &key[open + 1..];
            let close = tag.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &tag[..close])
        })
        .unwrap_or(key);
    CRC16.checksum(hashed) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots `redis-server` 7.0 answered to `CLUSTER KEYSLOT` (`CRATES.md`), hash tags
    /// included: the first `{…}` counts only if it is not empty.
    #[test]
    fn slots_are_those_redis_computes() {
        for (key, slot) in [
            (&b"foo"[..], 12182),
            (b"{user1}.x", 8106),
            (b"user1", 8106),
            (b"123456789", 12739),
            (b"", 0),
            (b"{}foo", 9500),
            (b"foo{}{bar}", 8363),
            (b"foo{{bar}}zap", 4015),
            (b"{bar", 4015),
            (b"foo{bar}{zap}", 5061),
            (b"bar", 5061),
        ] {
            assert_eq!(key_slot(key), slot, "{}", String::from_utf8_lossy(key));
        }
    }
}
