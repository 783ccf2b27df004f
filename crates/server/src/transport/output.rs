//! A connection's reply under construction: bytes appended by the requests it runs, and
//! the large values they reference rather than copy.

use std::cell::RefCell;
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

/// The largest reply buffer a serving thread keeps for the next burst's replies
/// ([`Output::free`]), and the most capacity it keeps in all.
const SPARE_CAPACITY: usize = 64 << 10;
const SPARES_CAPACITY: usize = 1 << 20;

/// Reply buffers the bursts on a serving thread left, for the next ones to take
/// (`Output::take_spare`): a buffer freed after every burst and grown again by doubling
/// cost a pipeline of hash replies a twentieth of its CPU (reallocations and first
/// touches of fresh pages). Several, because a round's connections each hold a reply
/// until they write together (`after_neighbours`); bounded per thread whatever the
/// number of connections. A connection is charged for the one it takes as for its own.
#[derive(Default)]
struct Spares {
    buffers: Vec<Vec<u8>>,
    capacity: usize,
}

thread_local! {
    static SPARES: RefCell<Spares> = RefCell::default();
}

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

    /// Empties the reply and lets its buffer go: a connection waiting for input holds
    /// none, however large its last reply was. A buffer of up to [`SPARE_CAPACITY`] is
    /// kept among the serving thread's spares while they take under [`SPARES_CAPACITY`].
    pub fn free(&mut self) {
        let mut bytes = std::mem::take(&mut self.bytes);
        *self = Output::default();
        let capacity = bytes.capacity();
        if (1..=SPARE_CAPACITY).contains(&capacity) {
            SPARES.with_borrow_mut(|spares| {
                if spares.capacity + capacity <= SPARES_CAPACITY {
                    bytes.clear();
                    spares.capacity += capacity;
                    spares.buffers.push(bytes);
                }
            });
        }
    }

    /// Takes one of the serving thread's spare buffers, if there is one and this reply
    /// holds no buffer of its own, before a burst of requests appends to it.
    pub fn take_spare(&mut self) {
        if self.bytes.capacity() == 0 {
            SPARES.with_borrow_mut(|spares| {
                if let Some(bytes) = spares.buffers.pop() {
                    spares.capacity -= bytes.capacity();
                    self.bytes = bytes;
                }
            });
        }
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

    /// A burst's buffer, freed, is one of the thread's spares and a later burst's reply
    /// starts in it; a buffer past `SPARE_CAPACITY` is let go, and the spares never
    /// hold more than `SPARES_CAPACITY`. Each test runs on a thread of its own: its
    /// spares start empty.
    #[test]
    fn freed_buffers_are_later_bursts_within_the_spares_bound() {
        let mut first = Output::default();
        first.extend_from_slice(&[b'x'; 10_000]);
        let (ptr, capacity) = (first.bytes.as_ptr(), first.bytes.capacity());
        first.free();
        assert_eq!(first.held_besides(None), 0, "a freed reply holds nothing");
        let mut next = Output::default();
        next.take_spare();
        assert_eq!(
            (next.bytes.as_ptr(), next.bytes.capacity()),
            (ptr, capacity)
        );
        assert!(next.is_empty());
        // Taken: no spare is left, and a connection holding a buffer keeps its own.
        let mut other = Output::default();
        other.take_spare();
        assert_eq!(other.bytes.capacity(), 0);
        next.extend_from_slice(b"reply");
        next.take_spare();
        assert_eq!(next.bytes.as_ptr(), ptr);
        next.free();
        let mut huge = Output::default();
        huge.extend_from_slice(&vec![b'y'; SPARE_CAPACITY + 1]);
        huge.free();
        // Many connections freeing at once: the spares stop at their bound.
        let mut many: Vec<Output> = (0..2 * SPARES_CAPACITY / SPARE_CAPACITY)
            .map(|_| {
                let mut out = Output::default();
                out.reserve_exact(SPARE_CAPACITY);
                out
            })
            .collect();
        many.iter_mut().for_each(Output::free);
        let kept = SPARES.with_borrow(|spares| {
            assert_eq!(
                spares.capacity,
                spares.buffers.iter().map(Vec::capacity).sum::<usize>()
            );
            spares.capacity
        });
        assert!(
            kept <= SPARES_CAPACITY && kept > SPARES_CAPACITY / 2,
            "{kept}"
        );
        let mut taken = 0;
        loop {
            let mut out = Output::default();
            out.take_spare();
            if out.bytes.capacity() == 0 {
                break;
            }
            assert!(out.bytes.capacity() <= SPARE_CAPACITY && out.is_empty());
            taken += out.bytes.capacity();
        }
        assert_eq!(taken, kept);
    }
}
