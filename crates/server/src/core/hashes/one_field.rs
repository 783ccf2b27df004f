//! A command on one field of a large hash (HSET or HINCRBY of a field, HDEL of one, …),
//! run with its key's stripe lock **shared**, so that the serving threads writing one
//! large hash run side by side instead of queueing on its lock (redis-benchmark `-t hset
//! -r 100000`, docs/RESULTS.md Y4: a fifth of the server's CPU was a waiter spinning).
//!
//! Two steps, each one engine update, atomic under its object's leaf lock: the field's
//! element is read and changed in one (so of two commands adding one field, one finds
//! it absent), then the header's counts take what that change did to them (not a value
//! read before: another command may have counted since) and the header a new version.
//! Between the two the header miscounts by this command's change; the commands that
//! read a hash whole — and check its count against its elements, or a streamed HGETALL
//! its version — hold the lock alone, as does every command on several fields (its
//! fields change together) and every command on a packed hash (one object, rewritten
//! whole). If the header was replaced between the steps (a string SET or the key's
//! expiry take no stripe lock), the element changed belongs to an id no key names any
//! more, and the command runs again the general way ([`Hashes::edit`]), as a command
//! whose commit failed does. A command that only reads the field (HGET, HEXISTS,
//! HSTRLEN, HTTL) takes one step, a GET of the element
//! ([`Hashes::read_one_element`]): no leaf locked exclusively, nothing written.
//!
//! The element's key needs the hash's id: each stripe remembers the large hash last met
//! there ([`LargeHash`]), so a hot hash's header is not read before each command — only
//! checked after it, by the second step, or by a read when nothing changed (a command
//! that found the id stale has read or changed an element no hash holds, which no
//! reply shows: it runs again the general way).

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use zipcache::{PutOptions, Update};

use super::format::{Header, Layout, element_key, element_value, is_hash};
use super::{Edit, Field, HashError, Hashes, MAX_FIELDS, Result, count, elements, header_put};
use crate::core::keyspace::Keyspace;

/// Fields below [`MAX_FIELDS`] under which a hash takes the shared way: each serving
/// thread may add one field past what it read, so the limit holds for up to this many.
const ADDS_IN_FLIGHT: u64 = 1 << 16;

/// The large hash a stripe's commands met last: its key and its header as last seen.
/// Whether there is one is also kept outside the lock, so that the commands on a packed
/// hash — every session's HGET and HSET — in a stripe that never met a large one look
/// without taking it.
#[derive(Default)]
pub(super) struct LastLarge {
    last: Mutex<Option<LargeHash>>,
    any: AtomicBool,
}

struct LargeHash {
    key: Box<[u8]>,
    header: Header,
}

impl LastLarge {
    /// Whether a large hash was met here (one field's commands take the shared way only
    /// then, so that one on a packed hash reads its header once).
    pub(super) fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// The header last seen at `key`, if `key` is the hash remembered.
    fn of(&self, key: &[u8]) -> Option<Header> {
        if !self.any() {
            return None;
        }
        let last = self.last.lock();
        last.as_ref().filter(|l| *l.key == *key).map(|l| l.header)
    }

    /// Remembers `header` as the large hash at `key`.
    pub(super) fn remember(&self, key: &[u8], header: Header) {
        let mut last = self.last.lock();
        self.any.store(true, Ordering::Relaxed);
        match last.as_mut() {
            Some(last) if *last.key == *key => last.header = header,
            _ => {
                *last = Some(LargeHash {
                    key: key.into(),
                    header,
                })
            }
        }
    }

    fn forget(&self) {
        let mut last = self.last.lock();
        *last = None;
        self.any.store(false, Ordering::Relaxed);
    }
}

impl Hashes {
    /// `run` on field `name` of the large hash at `key`, its change stored as the
    /// module says; `None` if the command must take the general way: the key holds no
    /// large hash, the name is longer than any element's, the hash is near its field
    /// limit, or its header was replaced meanwhile.
    pub(super) fn edit_one_element<T>(
        &self,
        keys: &Keyspace,
        key: &[u8],
        name: &[u8],
        run: &mut impl FnMut(&mut Edit) -> T,
    ) -> Result<Option<T>> {
        let last = &self.stripes[self.stripe(key)].last_large;
        let _shared = self.lock_shared(key);
        let (header, remembered) = match last.of(key) {
            Some(header) => (header, true),
            // may do I/O: one SSD block
            None => match self.header(keys, key)?.map(|read| read.layout) {
                Some(Layout::Elements(header)) => {
                    last.remember(key, header);
                    (header, false)
                }
                _ => {
                    last.forget();
                    return Ok(None);
                }
            },
        };
        let max_field = Self::max_field(keys);
        if name.len() > max_field || header.elements >= MAX_FIELDS - ADDS_IN_FLIGHT {
            return Ok(None);
        }
        let now_ms = keys.engine().now_ms();
        // may do I/O: one SSD block, or a large element's extent; may evict
        let (done, _) = keys
            .engine()
            .update(&element_key(header.id, name), |current| {
                let mut edit = Edit::one(now_ms, name, Field::of_element(current, now_ms));
                let out = run(&mut edit);
                let change = match edit.changes(max_field) {
                    Ok(mut changes) => changes.pop(),
                    Err(error) => return (Update::Keep, Err(error)),
                };
                let Some((_, before, after)) = change else {
                    return (Update::Keep, Ok((out, None)));
                };
                let (update, counted) = match after {
                    Field::Live {
                        value,
                        expires_at_ms,
                    } => (
                        Update::Put {
                            value: element_value(&value, expires_at_ms),
                            options: PutOptions {
                                collection: true,
                                ..PutOptions::default()
                            },
                        },
                        Some(expires_at_ms.is_some()),
                    ),
                    Field::Absent | Field::Dead { .. } => (Update::Delete, None),
                };
                (update, Ok((out, Some((before, counted)))))
            })
            .map_err(elements::write_error)?;
        let (out, change) = done?;
        let Some((before, after)) = change else {
            // Nothing changed: the id read just now was current then; one remembered
            // is checked now (the key held it before and after the element's read, so
            // throughout: an id is never given twice).
            if remembered && !self.holds(keys, key, header)? {
                last.forget();
                return Ok(None);
            }
            return Ok(Some(out));
        };
        // may do I/O: one SSD block; may evict
        let (counted, _) = keys.update(key, |current| {
            let Some(current) = current.filter(|c| c.collection && is_hash(&c.value)) else {
                return (Update::Keep, None);
            };
            let Some(Layout::Elements(mut now)) = Layout::decode(&current.value) else {
                return (Update::Keep, None);
            };
            if now.id != header.id {
                return (Update::Keep, None);
            }
            count(&mut now, &before, after);
            match now.elements {
                0 => (Update::Delete, Some(now)),
                _ => (header_put(now.encode(), Some(current)), Some(now)),
            }
        })?;
        match counted {
            Some(now) if now.elements > 0 => last.remember(key, now),
            // Its last field deleted: the hash is gone.
            Some(_) => last.forget(),
            None => {
                last.forget();
                return Ok(None);
            }
        }
        Ok(Some(out))
    }

    /// `run` for a command that only reads field `name` of the large hash remembered at
    /// `key`: the element read as it is (no engine update), then the key checked to hold
    /// the hash still — before and after the read, so throughout (an id is never given
    /// twice, nor moved to another key). The shared lock keeps out the commands on
    /// several fields, whose changes a reader sees all or none of. `None` if the command
    /// must take the general way: no hash remembered at `key`, a name longer than any
    /// element's, a dead field met (the general way deletes it), or a header replaced.
    pub(super) fn read_one_element<T>(
        &self,
        keys: &Keyspace,
        key: &[u8],
        name: &[u8],
        run: &mut impl FnMut(&mut Edit) -> T,
    ) -> Result<Option<T>> {
        let last = &self.stripes[self.stripe(key)].last_large;
        let Some(header) = last.of(key) else {
            return Ok(None);
        };
        let max_field = Self::max_field(keys);
        if name.len() > max_field {
            return Ok(None);
        }
        let _shared = self.lock_shared(key);
        let now_ms = keys.engine().now_ms();
        // may do I/O: one SSD block, or a large element's extent
        let mut edit = Edit::one(now_ms, name, elements::read(keys, header.id, name)?);
        let out = run(&mut edit);
        if !edit.changes(max_field)?.is_empty() {
            return Ok(None);
        }
        // may do I/O: one SSD block
        if !self.holds(keys, key, header)? {
            last.forget();
            return Ok(None);
        }
        Ok(Some(out))
    }

    /// Whether `key` holds the large hash `header` names (by its id).
    fn holds(&self, keys: &Keyspace, key: &[u8], header: Header) -> Result<bool> {
        // may do I/O: one SSD block
        Ok(match self.header(keys, key) {
            Ok(Some(read)) => matches!(read.layout, Layout::Elements(h) if h.id == header.id),
            Ok(None) | Err(HashError::WrongType) => false,
            Err(error) => return Err(error),
        })
    }
}
