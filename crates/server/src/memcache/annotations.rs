//! What memcached keeps on an item that the engine does not store: the stale mark of an
//! invalidated item (`md I`, `ms I`), and whether a client was already handed the win
//! token (`W`, then `Z` for everyone else). (A CAS the client chooses, `E`, the engine
//! stores itself: `PutOptions::cas`.)
//!
//! An annotation belongs to one version of one item, named by its CAS. A plain write
//! asks the engine for a fresh CAS, so a later write, delete, expiry or eviction makes a
//! new version or none, which outdates the annotation without our knowing: it only counts
//! while the engine still holds that version. So plain writes and deletes never touch
//! this table; reads and read-modify-writes consult it. A write that chooses its CAS
//! (`E`, or a touch keeping the item's) goes through `update`, which replaces the key's
//! annotation, since the CAS may repeat that of the version annotated.
//!
//! Consistency: a read-modify-write holds its key's shard lock across the engine update
//! and the annotation it leaves, and a read takes that lock after reading the item, so a
//! reader never sees a new version without its annotation. Lock order is shard, then the
//! engine's own; nothing takes them the other way round.
//!
//! The table is bounded: when a shard is full an arbitrary annotation is dropped. A
//! dropped stale mark takes its item with it, so an invalidated value is never served as
//! fresh; a dropped token lets one more client win.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};

use zipcache::{GetOptions, Item, Update};

use crate::core::keyspace::Keyspace;
use crate::transport::prefetch::Prefetch;

const SHARDS: usize = 64;
/// Annotations kept per shard (64 Ki in all).
const SHARD_CAPACITY: usize = 1024;

/// The memcached state of one item version beyond value, flags, expiry and CAS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// Invalidated (`I`): served with `X` until rewritten.
    pub stale: bool,
    /// A client got `W` for this version; the others get `Z`.
    pub token_sent: bool,
}

/// An item as memcached clients see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub item: Item,
    pub marks: Marks,
}

/// What a read-modify-write does: the engine update, and the marks of the version it
/// leaves — the new one after a `Put`, the current one after `Keep`. Converted from a
/// bare `Update`, a put leaves no marks and a `Keep` leaves the current ones.
pub struct Write {
    pub update: Update,
    pub marks: Option<Marks>,
}

impl Write {
    pub fn marked(update: Update, marks: Marks) -> Write {
        Write {
            update,
            marks: Some(marks),
        }
    }
}

impl From<Update> for Write {
    fn from(update: Update) -> Write {
        Write {
            update,
            marks: None,
        }
    }
}

#[derive(Clone, Copy)]
struct Annotation {
    version: u64,
    marks: Marks,
}

type Shard = HashMap<Vec<u8>, Annotation>;

pub struct Annotations {
    shards: Vec<Mutex<Shard>>,
    hasher: RandomState,
}

impl Default for Annotations {
    fn default() -> Self {
        Annotations {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl Entry {
    /// The entry after a rewrite that changed only its expiry (its CAS is kept).
    pub(super) fn redated(self, expiry: super::Expiry) -> Entry {
        Entry {
            item: Item {
                expires_at_ms: expiry.expires_at_ms(),
                ..self.item
            },
            ..self
        }
    }
}

fn entry_of(item: Item, annotation: Option<&Annotation>) -> Entry {
    let marks = annotation
        .filter(|a| a.version == item.cas)
        .map_or_else(Marks::default, |a| a.marks);
    Entry { item, marks }
}

impl Annotations {
    fn shard(&self, key: &[u8]) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        // A panic elsewhere cannot leave a shard half-written: every change is one insert.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The live item under `key` as clients see it, read as `options` say (answered by
    /// `reads` where it read the key ahead).
    pub fn get(
        &self,
        cache: &Keyspace,
        reads: &mut Prefetch,
        key: &[u8],
        options: GetOptions,
    ) -> zipcache::Result<Option<Entry>> {
        let Some(item) = reads.get_item(cache, key, options)? else {
            return Ok(None);
        };
        Ok(Some(entry_of(item, self.shard(key).get(key))))
    }

    /// Atomic read-modify-write of `key` as clients see it; returns `f`'s result and, for
    /// a put, the new CAS.
    pub fn update<R>(
        &self,
        cache: &Keyspace,
        key: &[u8],
        f: impl FnOnce(Option<&Entry>) -> (Write, R),
    ) -> zipcache::Result<(R, Option<u64>)> {
        self.update_read_before(cache, key, None, f)
    }

    /// [`Annotations::update`] with the value the caller read before
    /// ([`ZipCache::update_read_before`]): an append of a large value reads no extent.
    pub fn update_read_before<R>(
        &self,
        cache: &Keyspace,
        key: &[u8],
        before: Option<Item>,
        f: impl FnOnce(Option<&Entry>) -> (Write, R),
    ) -> zipcache::Result<(R, Option<u64>)> {
        let mut shard = self.shard(key);
        let annotation = shard.get(key).copied();
        let mut left = None;
        // may do I/O: a large object's extent unless `before` is its version, or one
        // SSD block
        let (result, new_version) = cache.update_read_before(key, before, |current| {
            let entry = current.map(|item| entry_of(item.clone(), annotation.as_ref()));
            let (write, result) = f(entry.as_ref());
            left = match (&write.update, &entry, write.marks) {
                (Update::Put { .. } | Update::SetMeta(_), _, marks) => {
                    Some((None, marks.unwrap_or_default()))
                }
                (Update::Keep, Some(entry), Some(marks)) if entry.marks != marks => {
                    Some((Some(entry.item.cas), marks))
                }
                (Update::Keep, _, _) => None,
                (Update::Delete, _, _) => Some((None, Marks::default())),
            };
            (write.update, result)
        })?;
        let Some((version, marks)) = left else {
            return Ok((result, None));
        };
        match version.or(new_version) {
            Some(version) if marks != Marks::default() => {
                self.insert(cache, &mut shard, key, Annotation { version, marks });
            }
            _ => {
                shard.remove(key);
            }
        }
        Ok((result, new_version))
    }

    fn insert(&self, cache: &Keyspace, shard: &mut Shard, key: &[u8], annotation: Annotation) {
        if shard.len() >= SHARD_CAPACITY && !shard.contains_key(key) {
            let victim = shard.keys().next().cloned();
            if let Some((victim, dropped)) = victim.and_then(|k| shard.remove_entry(&k))
                && dropped.marks.stale
            {
                drop_version(cache, &victim, dropped.version);
            }
        }
        shard.insert(key.to_vec(), annotation);
    }
}

/// Deletes `key` if the engine still holds `version` of it.
fn drop_version(cache: &Keyspace, key: &[u8], version: u64) {
    let _ = cache.update(key, |current| match current {
        Some(item) if item.cas == version => (Update::Delete, ()),
        _ => (Update::Keep, ()),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use zipcache::{Config, PutOptions};

    fn cache() -> Keyspace {
        let engine = zipcache::ZipCache::open(Config {
            dram_capacity: 16 << 20,
            ..Config::default()
        })
        .unwrap();
        Keyspace::new(std::sync::Arc::new(engine), Default::default())
    }

    fn put(value: &[u8], cas: Option<u64>, marks: Marks) -> Write {
        let update = Update::Put {
            value: value.to_vec(),
            options: PutOptions {
                assign_cas: true,
                cas,
                ..PutOptions::default()
            },
        };
        Write::marked(update, marks)
    }

    const STALE: Marks = Marks {
        stale: true,
        token_sent: false,
    };

    #[test]
    fn marks_last_until_the_next_write() {
        let (cache, annotations) = (cache(), Annotations::default());
        let (_, cas) = annotations
            .update(&cache, b"k", |_| (put(b"v", None, STALE), ()))
            .unwrap();
        let entry = annotations
            .get(
                &cache,
                &mut Prefetch::default(),
                b"k",
                GetOptions::default(),
            )
            .unwrap()
            .unwrap();
        assert_eq!((Some(entry.item.cas), entry.marks), (cas, STALE));
        // A plain write outdates the annotation without touching the table.
        let options = PutOptions {
            assign_cas: true,
            ..PutOptions::default()
        };
        let engine_cas = cache.put_with(b"k", b"w", options).unwrap();
        let entry = annotations
            .get(
                &cache,
                &mut Prefetch::default(),
                b"k",
                GetOptions::default(),
            )
            .unwrap()
            .unwrap();
        assert_eq!(
            (entry.item.cas, entry.marks),
            (engine_cas, Marks::default())
        );
    }

    #[test]
    fn a_write_repeating_the_annotated_cas_is_a_new_version() {
        let (cache, annotations) = (cache(), Annotations::default());
        annotations
            .update(&cache, b"k", |_| (put(b"v", Some(5), STALE), ()))
            .unwrap();
        let entry = annotations
            .get(
                &cache,
                &mut Prefetch::default(),
                b"k",
                GetOptions::default(),
            )
            .unwrap()
            .unwrap();
        assert_eq!((entry.item.cas, entry.marks), (5, STALE));
        let (_, cas) = annotations
            .update(&cache, b"k", |_| (put(b"w", Some(5), Marks::default()), ()))
            .unwrap();
        assert_eq!(cas, Some(5));
        let entry = annotations
            .get(
                &cache,
                &mut Prefetch::default(),
                b"k",
                GetOptions::default(),
            )
            .unwrap()
            .unwrap();
        assert_eq!((entry.item.cas, entry.marks), (5, Marks::default()));
    }

    #[test]
    fn a_full_shard_drops_stale_items_with_their_marks() {
        let (cache, annotations) = (cache(), Annotations::default());
        let keys: Vec<Vec<u8>> = (0..SHARDS * SHARD_CAPACITY * 2)
            .map(|i| format!("key{i}").into_bytes())
            .collect();
        for key in &keys {
            annotations
                .update(&cache, key, |_| (put(b"v", None, STALE), ()))
                .unwrap();
        }
        let mut stale_left = 0;
        for key in &keys {
            if let Some(entry) = annotations
                .get(&cache, &mut Prefetch::default(), key, GetOptions::default())
                .unwrap()
            {
                assert!(entry.marks.stale, "an item lost its stale mark");
                stale_left += 1;
            }
        }
        assert!(stale_left <= SHARDS * SHARD_CAPACITY);
        assert!(stale_left > 0);
    }
}
