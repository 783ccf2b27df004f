//! A connection's reply under construction: bytes appended by the requests it runs, and
//! the large values they reference rather than copy.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use zipcache::Item;

/// Replies are written out once they pass this size even mid-pipeline or mid-request: a
/// request appends no more past it (`Step::Partial`), so a connection holds at most this
/// plus one item's reply, however many keys its requests name.
pub const OUTPUT_BUDGET: usize = 256 * 1024;

/// Values this long and longer go into a reply by reference ([`Output::append_value`]);
/// shorter ones are copied, cheaper than a write of their own.
const SHARED_VALUE_MIN: usize = 16 << 10;

/// The reply a connection's requests append to. Its bytes are a `Vec<u8>` (requests
/// write through `Deref`); the values it references sit at offsets of those bytes, so a
/// request only ever appends: nothing truncates a reply once a value is referenced.
#[derive(Default)]
pub struct Output {
    bytes: Vec<u8>,
    /// Values referenced rather than held ([`Output::append_value`]), each with its
    /// offset in `bytes`, and their bytes.
    values: Vec<(usize, Arc<Item>)>,
    value_bytes: usize,
}

impl Deref for Output {
    type Target = Vec<u8>;

    fn deref(&self) -> &Vec<u8> {
        &self.bytes
    }
}

impl DerefMut for Output {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }
}

impl Output {
    /// Appends `item`'s value: a large one by reference, written from the item itself
    /// when the reply is ([`Output::parts`]), so that a connection answering a 1 MiB value
    /// holds that value once, shared with the engine's answer, not a copy per naming; a
    /// small one copied.
    pub fn append_value(&mut self, item: &Arc<Item>) {
        let len = item.value.len();
        if len >= SHARED_VALUE_MIN {
            self.values.push((self.bytes.len(), item.clone()));
            self.value_bytes += len;
        } else {
            self.bytes.extend_from_slice(&item.value);
        }
    }

    /// Whether a request may append more before the reply is written (the values it
    /// references count).
    pub fn within_budget(&self) -> bool {
        self.reply_len() < OUTPUT_BUDGET
    }

    /// The reply's length, the values it references included (`len`, through `Deref`, is
    /// that of its bytes alone: offsets within them).
    pub fn reply_len(&self) -> usize {
        self.bytes.len() + self.value_bytes
    }

    /// What the reply holds in memory: its buffer and the values it references, but for
    /// `shared`, which the connection holds and charges anyway (its read-ahead's hit).
    pub fn held_besides(&self, shared: Option<&Arc<Item>>) -> usize {
        let shared_bytes: usize = self
            .values
            .iter()
            .filter(|(_, item)| shared.is_some_and(|shared| Arc::ptr_eq(item, shared)))
            .map(|(_, item)| item.value.len())
            .sum();
        self.bytes.capacity() + self.value_bytes - shared_bytes
    }

    /// The reply as the slices to write in order: its bytes with the values it references
    /// in place.
    pub fn parts(&self) -> Vec<&[u8]> {
        let mut parts = Vec::with_capacity(2 * self.values.len() + 1);
        let mut from = 0;
        for (at, item) in &self.values {
            parts.push(&self.bytes[from..*at]);
            parts.push(&item.value[..]);
            from = *at;
        }
        parts.push(&self.bytes[from..]);
        parts
    }

    /// Empties the reply once written, keeping its buffer for the next (`Output::free`
    /// lets it go).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.values.clear();
        self.value_bytes = 0;
    }

    /// Empties the reply and frees its buffer: a connection waiting for input holds none,
    /// however large its last reply was.
    pub fn free(&mut self) {
        *self = Output::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(len: usize) -> Arc<Item> {
        Arc::new(Item {
            value: vec![b'v'; len],
            flags: 0,
            cas: 0,
            expires_at_ms: None,
            access: None,
            collection: false,
        })
    }

    /// A large value goes into the reply by reference, a small one is copied; the reply's
    /// parts put it back in place.
    #[test]
    fn large_values_are_referenced_not_copied() {
        let (big, small) = (item(SHARED_VALUE_MIN), item(10));
        let mut out = Output::default();
        out.extend_from_slice(b"a");
        out.append_value(&big);
        out.extend_from_slice(b"b");
        out.append_value(&small);
        assert_eq!(
            out.bytes.len(),
            2 + 10,
            "the large value is not in the buffer"
        );
        assert_eq!(out.reply_len(), 2 + 10 + SHARED_VALUE_MIN);
        let expected = [&b"a"[..], &big.value, b"b", &small.value].concat();
        assert_eq!(out.parts().concat(), expected);
        out.clear();
        assert_eq!(out.reply_len(), 0);
        assert_eq!(out.parts().concat(), b"");
    }

    /// What a reply holds counts its buffer's capacity and the values it references, but
    /// not the one the connection charges already; freed, it holds nothing.
    #[test]
    fn a_reply_holds_its_capacity_and_values_until_freed() {
        let (held, other) = (item(SHARED_VALUE_MIN), item(2 * SHARED_VALUE_MIN));
        let mut out = Output::default();
        out.extend_from_slice(&[b'x'; 100_000]);
        out.append_value(&held);
        out.append_value(&other);
        let capacity = out.bytes.capacity();
        assert!(capacity >= 100_000);
        assert_eq!(out.held_besides(None), capacity + 3 * SHARED_VALUE_MIN);
        assert_eq!(
            out.held_besides(Some(&held)),
            capacity + 2 * SHARED_VALUE_MIN
        );
        out.clear();
        assert_eq!(
            out.held_besides(None),
            capacity,
            "a written reply keeps its buffer"
        );
        out.free();
        assert_eq!(out.held_besides(None), 0);
    }
}
