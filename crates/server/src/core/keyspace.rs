//! The keys clients name, as the engine stores them. Both protocols reach the engine
//! through [`Keyspace`], never directly with a client's key, because a key's slot may
//! have moved away and back (`--cluster-mode on`): the values this node held before it
//! lost the slot must never be served once it owns the slot again, while another node
//! took the writes in between. Deleting the slot's keys first would take a walk of the
//! whole store (flash included) before the slot could be served; instead each slot has
//! a **generation**, bumped whenever the slot changes hands, and a key is stored under
//! its slot's generation. Versions of an older generation are unreachable at once and
//! dropped by a background sweep (`core/cluster.rs`).
//!
//! ```text
//! generation 0, key not starting with 0x00 or 0x01:   key             (as it was)
//! otherwise:                                  0x00 ‖ LEB128(generation) ‖ key
//! a collection's element (a hash's field):    0x01 ‖ …                (core/hashes.rs)
//! ```
//!
//! A node whose slots never moved stores keys as they are, and a key starting with 0x00
//! or 0x01 is stored escaped, so that no client key can name another's stored form nor
//! an element. The escape keeps the order of keys while every generation is 0 (escaped
//! keys sorted first, as they would be; elements lie between them and the others and
//! are no client's key), which ZCRANGE's ranges need; once a slot has moved, only walks
//! of the whole keyspace stay meaningful.
//!
//! A collection's header (a hash's, `core/hashes.rs`) is stored at its client's key with
//! the engine's `collection` bit. The RESP port sees it (its string commands answer
//! `WRONGTYPE`); the memcached ports use the view [`Keyspace::strings_only`], to which
//! a key holding a hash is absent: no memcached command reads or rewrites a header's
//! bytes as a value.

use std::borrow::Cow;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use zipcache::{AsyncGet, GetOptions, Item, ItemInfo, PutOptions, Result, Update, ZipCache};

use super::slot::{SLOTS, key_slot};

const ESCAPE: u8 = 0x00;
/// The first byte of every collection element's stored key (`core/hashes.rs`).
pub const ELEMENT: u8 = 0x01;

/// Whether a client's key is stored escaped at generation 0.
fn needs_escape(key: &[u8]) -> bool {
    matches!(key.first(), Some(&(ESCAPE | ELEMENT)))
}

/// Whether a stored key is a collection's element rather than a client's key.
pub fn is_element(stored: &[u8]) -> bool {
    stored.first() == Some(&ELEMENT)
}

/// Each slot's generation. Bumped only by the cluster's topology changes, under its
/// write lock: a RESP command that checked its slot holds the read lock until it ends,
/// so the generation it stores under is the one of the topology it was checked against.
#[derive(Debug)]
pub struct Generations {
    slots: Box<[AtomicU32]>,
    /// Any slot above generation 0: keys need their slot computed.
    moved: AtomicBool,
    /// Bumps so far: what was read before a change may be of a slot that moved.
    changes: AtomicU64,
}

impl Default for Generations {
    fn default() -> Self {
        Generations {
            slots: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            moved: AtomicBool::new(false),
            changes: AtomicU64::new(0),
        }
    }
}

impl Generations {
    pub fn of(&self, slot: u16) -> u32 {
        self.slots[usize::from(slot)].load(Ordering::Acquire)
    }

    /// The next generation of `slot`: its stored keys become unreachable.
    pub fn bump(&self, slot: u16) {
        self.moved.store(true, Ordering::Release);
        self.slots[usize::from(slot)].fetch_add(1, Ordering::AcqRel);
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    pub fn set(&self, slot: u16, generation: u32) {
        if generation != 0 {
            self.moved.store(true, Ordering::Release);
        }
        self.slots[usize::from(slot)].store(generation, Ordering::Release);
    }

    pub fn moved(&self) -> bool {
        self.moved.load(Ordering::Acquire)
    }

    /// The generation a client's key is stored under now.
    fn of_key(&self, key: &[u8]) -> u32 {
        if self.moved() {
            self.of(key_slot(key))
        } else {
            0
        }
    }
}

/// `key` as stored under `generation`.
pub fn stored(key: &[u8], generation: u32) -> Cow<'_, [u8]> {
    if generation == 0 && !needs_escape(key) {
        return Cow::Borrowed(key);
    }
    let mut out = Vec::with_capacity(key.len() + 6);
    out.push(ESCAPE);
    let mut g = generation;
    loop {
        let byte = (g & 0x7f) as u8;
        g >>= 7;
        if g == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(key);
    Cow::Owned(out)
}

/// The generation and client key of a stored key; `None` for bytes `stored` never makes
/// (elements among them).
pub fn parse(stored: &[u8]) -> Option<(u32, &[u8])> {
    if is_element(stored) {
        return None;
    }
    let Some((&ESCAPE, rest)) = stored.split_first() else {
        return Some((0, stored));
    };
    let mut generation: u32 = 0;
    for (i, &byte) in rest.iter().enumerate().take(5) {
        if i == 4 && byte > 0x0f {
            return None;
        }
        generation |= u32::from(byte & 0x7f).checked_shl(7 * i as u32)?;
        if byte & 0x80 == 0 {
            let key = &rest[i + 1..];
            let canonical = (generation != 0 || needs_escape(key)) && (i == 0 || byte != 0);
            return canonical.then_some((generation, key));
        }
    }
    None
}

/// The engine as clients' keys reach it.
pub struct Keyspace {
    engine: Arc<ZipCache>,
    generations: Arc<Generations>,
    /// A collection's header reads as absent (the memcached ports' view).
    strings_only: bool,
}

impl Keyspace {
    pub fn new(engine: Arc<ZipCache>, generations: Arc<Generations>) -> Keyspace {
        Keyspace {
            engine,
            generations,
            strings_only: false,
        }
    }

    /// The same keys, with every collection (a hash) absent: what a memcached client
    /// reads, rewrites or lists is a string's value or nothing.
    pub fn strings_only(&self) -> Keyspace {
        Keyspace {
            strings_only: true,
            ..Keyspace::new(self.engine.clone(), self.generations.clone())
        }
    }

    /// What this view shows of an object the engine found.
    pub fn visible(&self, item: Option<Item>) -> Option<Item> {
        item.filter(|i| !(self.strings_only && i.collection))
    }

    fn visible_info<'i>(&self, info: Option<&'i ItemInfo>) -> Option<&'i ItemInfo> {
        info.filter(|i| !(self.strings_only && i.collection))
    }

    /// The engine itself, for what names no key (stats, flushes, sizing).
    pub fn engine(&self) -> &Arc<ZipCache> {
        &self.engine
    }

    /// `key` as stored now.
    pub fn stored<'k>(&self, key: &'k [u8]) -> Cow<'k, [u8]> {
        stored(key, self.generations.of_key(key))
    }

    /// The client's key of a stored one, if it is of its slot's current generation
    /// (else it is a left-over of a slot that moved, never served).
    pub fn client_key<'s>(&self, stored: &'s [u8]) -> Option<&'s [u8]> {
        let (generation, key) = parse(stored)?;
        (generation == self.generations.of_key(key)).then_some(key)
    }

    /// The client's key of a stored object a listing of this view shows: of its slot's
    /// current generation, and no collection in the strings-only view.
    pub fn listed<'s>(&self, stored: &'s [u8], info: &ItemInfo) -> Option<&'s [u8]> {
        self.visible_info(Some(info))?;
        self.client_key(stored)
    }

    /// A stored key no client key names any more: of an older generation than its
    /// slot's (or bytes `stored` never makes). What the sweep deletes.
    pub fn left_over(&self, stored: &[u8]) -> bool {
        !is_element(stored)
            && parse(stored)
                .is_none_or(|(generation, key)| generation < self.generations.of_key(key))
    }

    /// How many times a slot's generation moved: answers read before a change may be
    /// of a slot that moved (`transport/prefetch.rs`).
    pub fn changes(&self) -> u64 {
        self.generations.changes.load(Ordering::Acquire)
    }

    pub fn generations(&self) -> Arc<Generations> {
        self.generations.clone()
    }

    /// Whether key ranges keep their order when stored (every generation is 0).
    pub fn ordered(&self) -> bool {
        !self.generations.moved()
    }

    pub fn get_item(&self, key: &[u8], options: GetOptions) -> Result<Option<Item>> {
        // may do I/O: one SSD block, or a large object's extent
        let item = self.engine.get_item(&self.stored(key), options)?;
        Ok(self.visible(item))
    }

    /// A GET that may complete later: its answer is seen through [`visible`](Self::visible)
    /// by whoever takes it (`transport/prefetch.rs`).
    pub fn get_item_async(&self, key: &[u8], options: GetOptions) -> AsyncGet {
        self.engine.get_item_async(&self.stored(key), options)
    }

    /// See `ZipCache::reads_large_object`.
    pub fn reads_large_object(&self, key: &[u8]) -> bool {
        self.engine.reads_large_object(&self.stored(key))
    }

    pub fn put_with(&self, key: &[u8], value: &[u8], options: PutOptions) -> Result<u64> {
        // may evict
        self.engine.put_with(&self.stored(key), value, options)
    }

    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        // may do I/O: one SSD block
        self.engine.delete(&self.stored(key))
    }

    pub fn update<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(Option<&Item>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        // may do I/O: a large object's whole extent, or one SSD block; may evict
        self.engine
            .update(&self.stored(key), |current| f(self.visible_ref(current)))
    }

    fn visible_ref<'i>(&self, item: Option<&'i Item>) -> Option<&'i Item> {
        item.filter(|i| !(self.strings_only && i.collection))
    }

    /// [`Keyspace::update`] counted as a read of the key (`ZipCache::update_as_read`).
    pub fn update_as_read<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(Option<&Item>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        // may do I/O: a large object's whole extent, or one SSD block; may evict
        self.engine
            .update_as_read(&self.stored(key), |current| f(self.visible_ref(current)))
    }

    pub fn update_read_before<R>(
        &self,
        key: &[u8],
        before: Option<Item>,
        f: impl FnOnce(Option<&Item>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        // may do I/O: a large object's extent unless `before` is its version; may evict
        self.engine
            .update_read_before(&self.stored(key), before, |current| {
                f(self.visible_ref(current))
            })
    }

    pub fn update_meta<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(Option<&ItemInfo>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        // may do I/O: one SSD block; may evict
        self.engine
            .update_meta(&self.stored(key), |current| f(self.visible_info(current)))
    }

    pub fn info(&self, key: &[u8]) -> Result<Option<ItemInfo>> {
        // may do I/O: one SSD block
        let info = self.engine.info(&self.stored(key))?;
        Ok(self.visible_info(info.as_ref()).copied())
    }

    /// A client's key as a bound of stored keys, while stored order is client order
    /// ([`ordered`](Self::ordered)); `None` once a slot has moved.
    pub fn stored_bound(&self, bound: Bound<&[u8]>) -> Option<Bound<Vec<u8>>> {
        if !self.ordered() {
            return None;
        }
        Some(match bound {
            Bound::Included(k) => Bound::Included(stored(k, 0).into_owned()),
            Bound::Excluded(k) => Bound::Excluded(stored(k, 0).into_owned()),
            Bound::Unbounded => Bound::Unbounded,
        })
    }

    /// Hands the live client keys whose stored forms lie from `start` to `end` to
    /// `visit`, in stored order, with their metadata, a batch at a time, until `visit`
    /// returns false; at most `limit` stored keys are examined (left-overs of moved
    /// slots, and collections in the strings-only view, count but are not handed out;
    /// elements are stepped over uncounted, as they lie together). Returns the last
    /// stored key examined if the walk stopped before the range's end (maybe at it),
    /// else `None`: a walk goes on after it.
    pub fn walk(
        &self,
        mut start: Bound<Vec<u8>>,
        end: Bound<&[u8]>,
        limit: usize,
        mut visit: impl FnMut(&[u8], &ItemInfo) -> bool,
    ) -> Result<Option<Vec<u8>>> {
        let mut walked = 0;
        while walked < limit {
            let wanted = WALK_BATCH.min(limit - walked);
            let from = start.as_ref().map(Vec::as_slice);
            let batch = self.engine.scan_keys::<&[u8]>((from, end), wanted)?;
            let full = batch.len() == wanted;
            let mut past_elements = false;
            for (stored, info) in &batch {
                if is_element(stored) {
                    past_elements = true;
                    break;
                }
                walked += 1;
                let go_on = self.listed(stored, info).is_none_or(|key| visit(key, info));
                if !go_on || walked == limit {
                    return Ok(Some(stored.clone()));
                }
            }
            match batch.into_iter().last() {
                _ if past_elements => start = Bound::Included(vec![ELEMENT + 1]),
                Some((stored, _)) if full => start = Bound::Excluded(stored),
                _ => return Ok(None),
            }
        }
        Ok(None)
    }
}

/// Stored keys one step of [`Keyspace::walk`] asks the engine for.
const WALK_BATCH: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_keys_parse_back_and_no_client_key_names_another() {
        for (key, generation) in [
            (&b"foo"[..], 0),
            (b"", 0),
            (b"\0", 0),
            (b"\0\x03foo", 0),
            (b"foo", 1),
            (b"\0foo", 127),
            (b"foo", 128),
            (b"foo", u32::MAX),
        ] {
            let s = stored(key, generation);
            assert_eq!(parse(&s), Some((generation, key)), "{key:?} {generation}");
        }
        assert_eq!(stored(b"foo", 0), Cow::Borrowed(&b"foo"[..]));
        // Not made by `stored`: an escape at generation 0 before a key that needs
        // none, a varint with a needless zero byte, a truncated varint.
        assert_eq!(parse(b"\0\0foo"), None);
        assert_eq!(parse(b"\0\x81\0foo"), None);
        assert_eq!(parse(b"\0\x80"), None);
        assert_eq!(parse(b"\0\xff\xff\xff\xff\xff\x01"), None);
        // The escape keeps key order at generation 0.
        let mut keys: Vec<&[u8]> = vec![b"b", b"\0", b"\0\0", b"\x01", b"a", b"\0z", b""];
        let mut by_stored = keys.clone();
        keys.sort();
        by_stored.sort_by_key(|k| stored(k, 0).into_owned());
        assert_eq!(keys, by_stored);
    }

    #[test]
    fn a_bumped_slot_hides_its_stored_keys() {
        let generations = Arc::new(Generations::default());
        let engine = Arc::new(
            ZipCache::open(zipcache::Config {
                dram_capacity: 4 << 20,
                ..zipcache::Config::default()
            })
            .unwrap(),
        );
        let keys = Keyspace::new(engine, generations.clone());
        keys.put_with(b"foo", b"old", PutOptions::default())
            .unwrap();
        keys.put_with(b"bar", b"kept", PutOptions::default())
            .unwrap();
        assert!(keys.ordered());
        generations.bump(key_slot(b"foo"));
        assert!(!keys.ordered());
        assert_eq!(keys.get_item(b"foo", GetOptions::default()).unwrap(), None);
        assert_eq!(keys.info(b"foo").unwrap(), None);
        let bar = keys
            .get_item(b"bar", GetOptions::default())
            .unwrap()
            .unwrap();
        assert_eq!(bar.value, b"kept");
        keys.put_with(b"foo", b"new", PutOptions::default())
            .unwrap();
        let mut listed = Vec::new();
        let stopped = keys
            .walk(Bound::Unbounded, Bound::Unbounded, 10, |key, _| {
                listed.push(key.to_vec());
                true
            })
            .unwrap();
        assert_eq!(stopped, None);
        assert_eq!(
            listed,
            vec![b"foo".to_vec(), b"bar".to_vec()],
            "the old foo is not listed"
        );
        assert_eq!(keys.stored_bound(Bound::Included(b"a")), None);
        let foo = keys
            .get_item(b"foo", GetOptions::default())
            .unwrap()
            .unwrap();
        assert_eq!(foo.value, b"new");
    }
}
