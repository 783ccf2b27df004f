//! RENAME and RENAMENX of any key (`Hashes::rename`), under both keys' stripe locks so
//! that no hash command on either interleaves. A string or a packed hash moves as its
//! bytes, with its expiry. A hash of elements is copied to a new id, element by element,
//! its header written last: the two keys never share elements. Were they to share an id
//! (a header moved as it is and the process killed before the source's deletion), a
//! later HSET through one key would show through the other; copied, a kill part way
//! leaves the source whole and the destination as it was or whole. The copy costs a
//! write per field, where Redis's RENAME is one pointer move.

use std::ops::Bound;

use parking_lot::RwLockWriteGuard;
use zipcache::{GetOptions, PutOptions, Update};

use super::format::{self, Header, Layout, element_key, element_range};
use super::{Hashes, Result, elements};
use crate::core::keyspace::Keyspace;

/// Elements copied per engine scan step, and the bytes a step may hold.
const COPY_BATCH: usize = 64;
const COPY_BUDGET: usize = 1 << 20;

/// What a rename did.
#[derive(Debug, PartialEq, Eq)]
pub enum Renamed {
    Done,
    /// Nothing at the source (or a hash found partial, dropped).
    NoSuchKey,
    /// RENAMENX: the destination holds a key (the source and the destination being one
    /// key included, as Redis answers it).
    DestinationExists,
}

impl Hashes {
    /// Moves `from`'s value, type and expiry to `to`, replacing what `to` held (unless
    /// `only_new`), and deletes `from`. A string write to `from` while this runs (string
    /// writes take no stripe lock) keeps its value there: the rename came first.
    pub fn rename(
        &self,
        keys: &Keyspace,
        from: &[u8],
        to: &[u8],
        only_new: bool,
    ) -> Result<Renamed> {
        let _locked = self.lock_both(from, to);
        // may do I/O: one SSD block, or a large object's extent
        let Some(item) = keys.get_item(from, GetOptions::default())? else {
            return Ok(Renamed::NoSuchKey);
        };
        if from == to {
            return Ok(match only_new {
                true => Renamed::DestinationExists,
                false => Renamed::Done,
            });
        }
        // may do I/O: one SSD block for a small object; no large extent
        let replaced = keys.info(to)?;
        if only_new && replaced.is_some() {
            return Ok(Renamed::DestinationExists);
        }
        let hash = item.collection && format::is_hash(&item.value);
        let source_elements = match hash.then(|| Layout::decode(&item.value)).flatten() {
            Some(Layout::Elements(header)) => Some(header),
            Some(Layout::Packed(_)) => None,
            None if hash => {
                self.commit(keys, from, Some(&item.value), None)?;
                return Ok(Renamed::NoSuchKey);
            }
            None => None,
        };
        // A large hash's header names its copy; anything else moves as its bytes.
        let copied = match source_elements {
            Some(header) => match self.copy_elements(keys, header)? {
                Some(copy) => Some(copy.encode()),
                None => {
                    self.drop_partial(keys, from, header)?;
                    return Ok(Renamed::NoSuchKey);
                }
            },
            None => None,
        };
        if replaced.is_some_and(|info| info.collection) {
            // may do I/O: a hash's elements
            self.delete_hash_locked(keys, to)?;
        }
        let options = PutOptions {
            flags: item.flags,
            expires_at_ms: item.expires_at_ms,
            collection: item.collection,
            // A large hash's header is versioned (`header_put`).
            assign_cas: copied.is_some(),
            ..PutOptions::default()
        };
        // may do I/O: a large value's extent; may evict
        keys.put_with(to, copied.as_deref().unwrap_or(&item.value), options)?;
        // may do I/O: one SSD block, or a large object's extent
        let (deleted, _) = keys.update(from, |current| match current {
            Some(c) if c.collection == item.collection && c.value == item.value => {
                (Update::Delete, true)
            }
            _ => (Update::Keep, false),
        })?;
        if deleted && let Some(header) = source_elements {
            elements::delete_all(keys, header.id)?;
        }
        Ok(Renamed::Done)
    }

    /// Both keys' stripe locks, the lower stripe first (one lock if they share it).
    fn lock_both(&self, a: &[u8], b: &[u8]) -> [Option<RwLockWriteGuard<'_, ()>>; 2] {
        let (i, j) = (self.stripe(a), self.stripe(b));
        if i == j {
            return [Some(self.stripes[i].lock.write()), None];
        }
        let first = self.stripes[i.min(j)].lock.write();
        [Some(first), Some(self.stripes[i.max(j)].lock.write())]
    }

    /// `header`'s elements copied under a new id, and the header that counts them;
    /// `None` if the hash is partial (its copies deleted again).
    fn copy_elements(&self, keys: &Keyspace, header: Header) -> Result<Option<Header>> {
        let copy = Header {
            id: self.new_id(keys),
            ..header
        };
        let (start, end) = element_range(header.id);
        let prefix = start.len();
        let mut from = Bound::Included(start);
        let mut copied = 0u64;
        loop {
            let range = (from.as_ref().map(Vec::as_slice), Bound::Excluded(&end[..]));
            // may do I/O: SSD blocks and large elements' extents
            let batch = keys
                .engine()
                .scan_bytes::<&[u8]>(range, COPY_BATCH, COPY_BUDGET)?;
            let ended = batch.len() < COPY_BATCH;
            for (stored, item) in &batch {
                if !item.collection {
                    continue;
                }
                let options = PutOptions {
                    collection: true,
                    ..PutOptions::default()
                };
                let key = element_key(copy.id, &stored[prefix..]);
                // may evict
                keys.engine().put_with(&key, &item.value, options)?;
                copied += 1;
            }
            match batch.into_iter().last() {
                Some((stored, _)) if !ended => from = Bound::Excluded(stored),
                _ => break,
            }
        }
        if copied == header.elements {
            return Ok(Some(copy));
        }
        elements::delete_all(keys, copy.id)?;
        Ok(None)
    }
}
