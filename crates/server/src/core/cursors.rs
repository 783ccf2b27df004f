//! SCAN and HSCAN cursors. A walk of ours resumes after a key (or a hash's field) in key
//! order, so that keys added or evicted meanwhile never make it repeat or skip one; but
//! clients take a cursor for an unsigned 64-bit number (redis-py's `int()`, go-redis's
//! `uint64`, Jedis's `Long` in its scan helpers). So the server keeps where each cursor
//! it handed out stands, in a bounded table that forgets the oldest first (a cursor
//! forgotten is refused as invalid, never taken for another position). Shared by every
//! connection and thread; each call holds the table's lock only to insert or look up.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;

/// Positions kept, and the bytes they may hold together.
const MAX_CURSORS: usize = 65_536;
const MAX_BYTES: usize = 4 << 20;

/// Where a walk goes on: after `position` within `scope` (empty for SCAN; the hash's key
/// for HSCAN, so that a cursor of one hash is not taken for another's).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Parked {
    scope: Vec<u8>,
    position: Vec<u8>,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<u64, Parked>,
    order: VecDeque<u64>,
    bytes: usize,
    next: u64,
}

pub struct Cursors {
    table: Mutex<Table>,
    /// The high half of every id, from the engine's run epoch: cursors of another run
    /// (whose walks the device may have outlived) are not taken for this one's.
    salt: u64,
}

impl Cursors {
    pub fn new(run_epoch: u64) -> Cursors {
        use std::hash::BuildHasher;
        let salt = foldhash::fast::FixedState::default().hash_one(run_epoch);
        Cursors {
            table: Mutex::default(),
            salt: salt << 32,
        }
    }

    /// A cursor (never 0) standing for `position` within `scope`.
    pub fn park(&self, scope: &[u8], position: Vec<u8>) -> u64 {
        let mut table = self.table.lock();
        table.next = table.next.wrapping_add(1);
        let id = (self.salt | (table.next & 0xffff_ffff)).max(1);
        table.bytes += scope.len() + position.len();
        let parked = Parked {
            scope: scope.to_vec(),
            position,
        };
        if let Some(old) = table.by_id.insert(id, parked) {
            table.bytes -= old.scope.len() + old.position.len();
        } else {
            table.order.push_back(id);
        }
        while table.order.len() > MAX_CURSORS || table.bytes > MAX_BYTES {
            let Some(oldest) = table.order.pop_front() else {
                break;
            };
            if let Some(old) = table.by_id.remove(&oldest) {
                table.bytes -= old.scope.len() + old.position.len();
            }
        }
        id
    }

    /// Where `cursor` stands within `scope`; `None` for a cursor not handed out for it
    /// (or forgotten). A cursor may be used again: a client retries a lost reply.
    pub fn resume(&self, scope: &[u8], cursor: u64) -> Option<Vec<u8>> {
        let table = self.table.lock();
        let parked = table.by_id.get(&cursor)?;
        (parked.scope == scope).then(|| parked.position.clone())
    }
}

/// A cursor as clients send it: "0" or an unsigned 64-bit number, as Redis parses it.
pub fn parse(text: &[u8]) -> Option<u64> {
    let digits = std::str::from_utf8(text).ok()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_stand_for_their_position_in_their_scope_only() {
        let cursors = Cursors::new(1);
        let a = cursors.park(b"", b"key:1".to_vec());
        let b = cursors.park(b"hash", b"field".to_vec());
        assert_ne!(a, 0);
        assert_ne!(a, b);
        assert_eq!(cursors.resume(b"", a), Some(b"key:1".to_vec()));
        assert_eq!(
            cursors.resume(b"", a),
            Some(b"key:1".to_vec()),
            "used again"
        );
        assert_eq!(cursors.resume(b"hash", b), Some(b"field".to_vec()));
        assert_eq!(cursors.resume(b"other", b), None, "another hash's cursor");
        assert_eq!(cursors.resume(b"", b), None);
        assert_eq!(cursors.resume(b"", 12345), None);
        assert_eq!(parse(b"0"), Some(0));
        assert_eq!(parse(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse(b"18446744073709551616"), None);
        assert_eq!(parse(b"-1"), None);
        assert_eq!(parse(b"abc"), None);
    }

    #[test]
    fn the_table_forgets_the_oldest_within_its_bounds() {
        let cursors = Cursors::new(1);
        let first = cursors.park(b"", vec![b'k'; 200]);
        for _ in 0..MAX_CURSORS {
            cursors.park(b"", vec![b'k'; 200]);
        }
        assert_eq!(cursors.resume(b"", first), None);
        let table = cursors.table.lock();
        assert!(table.order.len() <= MAX_CURSORS && table.bytes <= MAX_BYTES);
        assert_eq!(table.order.len(), table.by_id.len());
    }
}
