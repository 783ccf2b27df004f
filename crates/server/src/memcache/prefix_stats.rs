//! `stats detail on|off|dump`: memcached's per-key-prefix counters. A key's prefix is
//! what comes before its first `:`; keys without one are not counted (memcached's rule).
//! Off by default: while off, the request path pays one relaxed atomic load.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// memcached's prefix delimiter (its `-D` default).
const DELIMITER: u8 = b':';
/// Most prefixes tracked. Keys of further prefixes are not counted (memcached, whose
/// limit is 65536, does the same): the table cannot grow with what clients send.
pub const MAX_PREFIXES: usize = 4096;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    gets: u64,
    hits: u64,
    sets: u64,
    deletes: u64,
}

#[derive(Default)]
pub struct PrefixStats {
    enabled: AtomicBool,
    // One lock: memcached's global stats lock too; only taken while collection is on.
    table: Mutex<BTreeMap<Box<[u8]>, Counts>>,
}

impl PrefixStats {
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub fn record_get(&self, key: &[u8], hit: bool) {
        self.record(key, |c| {
            c.gets += 1;
            c.hits += u64::from(hit);
        });
    }

    pub fn record_set(&self, key: &[u8]) {
        self.record(key, |c| c.sets += 1);
    }

    pub fn record_delete(&self, key: &[u8]) {
        self.record(key, |c| c.deletes += 1);
    }

    fn record(&self, key: &[u8], count: impl FnOnce(&mut Counts)) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        let Some(end) = key.iter().position(|&b| b == DELIMITER) else {
            return;
        };
        let prefix = &key[..end];
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(counts) = table.get_mut(prefix) {
            count(counts);
        } else if table.len() < MAX_PREFIXES {
            count(table.entry(prefix.into()).or_default());
        }
    }

    /// Forgets every prefix (`stats reset`).
    pub fn clear(&self) {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// `stats detail dump`: a `PREFIX` line per prefix, in prefix order, then `END`.
    pub fn dump(&self, out: &mut Vec<u8>) {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        for (prefix, c) in table.iter() {
            out.extend_from_slice(b"PREFIX ");
            out.extend_from_slice(prefix);
            out.extend_from_slice(
                format!(
                    " get {} hit {} set {} del {}\r\n",
                    c.gets, c.hits, c.sets, c.deletes
                )
                .as_bytes(),
            );
        }
        out.extend_from_slice(b"END\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(stats: &PrefixStats) -> String {
        let mut out = Vec::new();
        stats.dump(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn counts_per_prefix_only_while_on() {
        let stats = PrefixStats::default();
        stats.record_set(b"foo:1");
        assert_eq!(dump(&stats), "END\r\n");
        stats.set_enabled(true);
        stats.record_set(b"foo:1");
        stats.record_get(b"foo:2", true);
        stats.record_get(b"foo:3", false);
        stats.record_delete(b"bar:1");
        stats.record_get(b"nodelimiter", true);
        assert_eq!(
            dump(&stats),
            "PREFIX bar get 0 hit 0 set 0 del 1\r\n\
             PREFIX foo get 2 hit 1 set 1 del 0\r\nEND\r\n"
        );
        stats.set_enabled(false);
        stats.record_set(b"foo:1");
        assert!(dump(&stats).contains("PREFIX foo get 2 hit 1 set 1 del 0"));
        stats.clear();
        assert_eq!(dump(&stats), "END\r\n");
    }

    #[test]
    fn the_table_is_bounded() {
        let stats = PrefixStats::default();
        stats.set_enabled(true);
        for i in 0..MAX_PREFIXES + 10 {
            stats.record_set(format!("p{i}:k").as_bytes());
        }
        let text = dump(&stats);
        assert_eq!(text.lines().count(), MAX_PREFIXES + 1);
        // A tracked prefix still counts once the table is full.
        stats.record_set(b"p0:k");
        assert!(dump(&stats).contains("PREFIX p0 get 0 hit 0 set 2 del 0"));
    }
}
