//! A medium value's blob as a write to DRAM makes it (paper §3.2, "medium objects"):
//! compressed before the write takes its leaf's lock ([`Ahead`], a PUT), re-headed from
//! the leaf's own blob (a change of metadata alone), or compressed under the lock (a
//! read-modify-write, whose value is known only there).
//!
//! Compressing under the lock made every writer of a leaf queue behind the one
//! compressing: a fill's keys in order all land in the last leaf, and in a JSON fill
//! through the server the two serving threads spent a tenth of their CPU waiting for
//! it (spinning, yielding, sleeping on the lock), a third of it compressing.
//!
//! Thread: the writer's. `Ahead::of` runs before the lock; `DramTier::buffered_blob`
//! under it, on the leaf's `Extras`, which the lock's holder owns.

use std::sync::Arc;

use super::DramTier;
use super::block::Block;
use super::leaf::{Extras, blob_bytes};
use crate::dictionary::Dictionary;
use crate::record::{Compressed, Meta, blob_dictionary, encode_blob_with, hot_blob_with};

/// A medium value compressed before its write took the leaf's lock, with the dictionary
/// that was current then.
pub(super) struct Ahead {
    compressed: Compressed,
    dictionary: Option<Arc<Dictionary>>,
}

/// What a write brings of a medium value's blob.
pub(super) enum BlobSource {
    /// Nothing: compressed under the lock, if the value is medium.
    Compress,
    /// The value compressed already ([`Ahead`]).
    Ahead(Ahead),
    /// The blob itself: the leaf's own, re-headed (`DramTier::reheadered_blob`).
    Made(Block),
}

impl DramTier {
    /// `value` compressed ahead of its write's lock, if it is a medium value bound for a
    /// leaf that does not store its blobs as is (`hot.rs`; the lock decides again); it
    /// joins the sample that dictionaries are trained on now.
    pub(super) fn compress_ahead(&self, key: &[u8], value: &[u8]) -> BlobSource {
        // Medium first: the heat's question may walk the tree.
        if !self.is_medium(key, value) || self.keeps_blobs_as_is(key) {
            return BlobSource::Compress;
        }
        if let Some(dictionaries) = &self.dictionaries {
            dictionaries.blobs.offer(value);
        }
        let dictionary = self.current_dictionary();
        BlobSource::Ahead(Ahead {
            compressed: Compressed::of(value, dictionary.as_deref()),
            dictionary,
        })
    }

    /// Puts a medium value written to a leaf into a blob of the leaf's table, compressed
    /// with the dictionary its blobs use (else the current one) — or stored as is if the
    /// leaf's blobs are (`raw_blobs`: `hot.rs`) — and returns the blob's
    /// slot for the buffered record (the merges that follow take the blob as it is),
    /// whether that dictionary is no longer the current one, and the blob's
    /// `blob_bytes`. `None` for a tiny value, or if the table is full (the merge
    /// compresses the value then).
    pub(super) fn buffered_blob(
        &self,
        extras: &mut Extras,
        key: &[u8],
        value: &[u8],
        meta: &Meta,
        source: BlobSource,
        raw_blobs: bool,
    ) -> Option<(u16, bool, usize)> {
        if matches!(source, BlobSource::Compress) && !self.is_medium(key, value) {
            return None;
        }
        let slot = extras.next_blob_slot()?;
        let current = self.current_dictionary();
        let stale = match (&extras.dictionary, &current) {
            (Some(held), Some(current)) => !Arc::ptr_eq(held, current),
            _ => false,
        };
        let blob = match source {
            // A re-headed blob names the dictionary the leaf holds, or none.
            BlobSource::Made(made) => made,
            // Not compressed ahead, unless the leaf turned hot since the write asked
            // (`keeps_blobs_as_is`): then what was compressed goes unused, as a hot
            // leaf's reads would only decompress it again.
            _ if raw_blobs => hot_blob_with(value, meta, Block::new),
            BlobSource::Ahead(ahead) => self.leaf_blob(extras, value, meta, current, Some(ahead)),
            BlobSource::Compress => self.leaf_blob(extras, value, meta, current, None),
        };
        let bytes = blob_bytes([&blob]);
        extras.push_blob(blob);
        Some((slot, stale, bytes))
    }

    /// `value`'s blob compressed with the dictionary the leaf's blobs use, else `current`
    /// (which the leaf then holds, if the blob names it): the bytes compressed `ahead`
    /// where they used that dictionary, else compressed here.
    fn leaf_blob(
        &self,
        extras: &mut Extras,
        value: &[u8],
        meta: &Meta,
        current: Option<Arc<Dictionary>>,
        ahead: Option<Ahead>,
    ) -> Block {
        let dictionary = extras.dictionary.clone().or(current);
        let blob = match ahead {
            Some(ahead) if same(&ahead.dictionary, &dictionary) => {
                ahead.compressed.blob_with(value, meta, Block::new)
            }
            // Compressed with another dictionary than the leaf's (it holds an older one,
            // or one was swapped in meanwhile): again, with the leaf's; the value was
            // offered to the trainer already.
            Some(_) => encode_blob_with(value, meta, dictionary.as_deref(), Block::new),
            None => self.blob_of(value, meta, dictionary.as_deref()),
        };
        if blob_dictionary(&blob).is_some_and(|id| id != 0) {
            extras.dictionary = dictionary;
        }
        blob
    }
}

/// Whether two dictionaries are one (or both none).
fn same(a: &Option<Arc<Dictionary>>, b: &Option<Arc<Dictionary>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::leaf::Extras;
    use super::super::test_support::{key, settings, tier_with};
    use crate::dictionary::tests::{documents, trained};
    use crate::memory::Memory;
    use crate::record::{Meta, blob_dictionary, decode_blob};

    /// A value compressed ahead of its write's lock with the dictionary current then is
    /// stored as compressed only where that is the one its leaf's blobs use; where it is
    /// not (the leaf holds an older one, or holds none and another became current
    /// before the lock), it is compressed again with the leaf's. Either way the leaf's
    /// dictionary reads every blob it holds: a blob naming another would be lost as
    /// corrupt when read.
    #[test]
    fn a_value_compressed_ahead_is_stored_with_its_leafs_dictionary() {
        let (dram, _) = tier_with(settings(256));
        let dictionaries = dram.dictionaries.clone().expect("dictionaries on");
        let memory = Arc::new(Memory::default());
        let (older, newer) = (trained(1, 0, memory.clone()), trained(2, 0, memory));
        let value = documents(0, 7, 1500);
        let meta = Meta::default();
        // `value` compressed ahead with `ahead` current, then stored with `at_lock` current.
        let store = |extras: &mut Extras, ahead: &Arc<_>, at_lock: &Arc<_>| {
            dictionaries.blobs.make_current(Some(Arc::clone(ahead)));
            let source = dram.compress_ahead(&key(1), &value);
            dictionaries.blobs.make_current(Some(Arc::clone(at_lock)));
            dram.buffered_blob(extras, &key(1), &value, &meta, source, false)
                .expect("a slot");
            let blob = extras
                .blobs
                .last()
                .and_then(Option::as_deref)
                .expect("the blob")
                .to_vec();
            let held = extras
                .dictionary
                .clone()
                .expect("the blob's dictionary held");
            (
                blob_dictionary(&blob),
                held.id(),
                decode_blob(&blob, Some(&held)),
            )
        };
        // A leaf without one takes the dictionary current at the lock (a swap came
        // between the compression and the lock) ...
        let (named, held, read) = store(&mut Extras::default(), &older, &newer);
        assert_eq!((named, held), (Some(newer.id()), newer.id()));
        assert_eq!(read.map(|(v, _)| v), Some(value.clone()));
        // ... and a leaf that holds an older one keeps it for every blob it takes.
        let mut holding = Extras {
            dictionary: Some(older.clone()),
            ..Extras::default()
        };
        let (named, held, read) = store(&mut holding, &newer, &newer);
        assert_eq!((named, held), (Some(older.id()), older.id()));
        assert_eq!(read.map(|(v, _)| v), Some(value));
    }

    /// Writers of one leaf's keys compress ahead while another thread swaps the blob
    /// dictionary back and forth: whichever dictionary a value was compressed with, the
    /// leaf stores it with its own, and every key reads back the last value written to
    /// it, through the merges the writes set off and after a merge of everything.
    #[test]
    fn values_compressed_ahead_across_dictionary_swaps_read_back() {
        use std::sync::atomic::{AtomicBool, Ordering};

        use super::super::Lookup;

        let (dram, _) = tier_with(settings(256));
        let dictionaries = dram.dictionaries.clone().expect("dictionaries on");
        let memory = Arc::new(Memory::default());
        let generations = [trained(1, 0, memory.clone()), trained(2, 0, memory)];
        let value = |writer: u32, i: u32, round: u32| {
            documents(0, u64::from(writer << 20 | i << 4 | round), 1_200)
        };
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut turn = 0;
                while !done.load(Ordering::Relaxed) {
                    dictionaries
                        .blobs
                        .make_current(Some(generations[turn % 2].clone()));
                    turn += 1;
                    std::thread::yield_now();
                }
            });
            let writers: Vec<_> = (0..2u32)
                .map(|writer| {
                    let (dram, value) = (&dram, &value);
                    s.spawn(move || {
                        for round in 0..3 {
                            for i in 0..150 {
                                // Neighbouring keys: both writers share leaves.
                                let key = key(i * 2 + writer);
                                let v = value(writer, i, round);
                                dram.put_with(&key, Some(&v), Meta::default(), None, 0, |_| ());
                            }
                        }
                    })
                })
                .collect();
            for writer in writers {
                writer.join().expect("a writer");
            }
            done.store(true, Ordering::Relaxed);
        });
        dram.merge_all(0);
        for writer in 0..2u32 {
            for i in 0..150 {
                match dram.get(&key(i * 2 + writer), 0, true) {
                    Lookup::Found(v, _, _) => {
                        assert!(v == value(writer, i, 2), "key {i} of {writer}")
                    }
                    other => panic!("key {i} of {writer}: {other:?}"),
                }
            }
        }
        assert_eq!(
            dram.counters
                .corrupt_pages
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
}
