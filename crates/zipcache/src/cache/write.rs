//! Writes: PUT, DELETE, the atomic read-modify-write (`update`), and removal in bulk
//! (`reclaim_expired`, `flush_all` and its flush epoch); the checks and metadata a write
//! is built from, and where an object goes (DRAM, or BT_LO behind a DRAM tombstone).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::get::item_of;
use super::{Inner, ZipCache};
use crate::dram::Change;
use crate::dram::{Look, Lookup, Reclaimed, Wanted};
use crate::large_objects::{LargeEntry, LargeObjects};
use crate::record::{ASSIGN_CAS, Meta};
use crate::restart::shadow::FLUSHING;
use crate::{AccessState, Error, Item, ItemInfo, PutOptions, Result, Update};

impl ZipCache {
    pub fn put(&self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<()> {
        let expires_at_ms = ttl.map(|d| self.now_ms().saturating_add(d.as_millis() as u64));
        self.put_with(
            key,
            value,
            PutOptions {
                expires_at_ms,
                ..PutOptions::default()
            },
        )?;
        Ok(())
    }

    /// Stores an object; returns its CAS version (0 unless `assign_cas`).
    pub fn put_with(&self, key: &[u8], value: &[u8], options: PutOptions) -> Result<u64> {
        let inner = &self.inner;
        inner.check_key(key)?;
        inner.check_value(value)?;
        inner.check_room()?;
        inner.ops.puts.incr();
        let meta = inner.meta(&options);
        let cas = inner.store(key, value, meta, options.access, inner.now());
        inner.relieve_pressure();
        Ok(cas)
    }

    /// Deletes `key`; true if a live value was there.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        let inner = &self.inner;
        inner.check_key(key)?;
        inner.ops.deletes.incr();
        let now = inner.now();
        // The SSD is asked under the leaf lock (like `update`, this may read the device
        // with the lock held): once the lock is released, the tombstone may leave for
        // the SSD and erase the copy that says the key existed.
        let (before, (large, on_ssd)) = inner.dram.delete(key, now, |before| {
            let held_large = inner.large.as_ref().and_then(|lo| lo.entry(key, now));
            // may do I/O: one 4 KiB read; before the mark below, which hides the flash
            // version
            let on_ssd = *before == Lookup::Absent
                && held_large.is_none()
                && inner
                    .ssd
                    .as_ref()
                    .is_some_and(|ssd| ssd.get(key, now).is_some());
            // may write the crash journal: the key first, then BT_LO's log (`mark_newer`)
            inner.dram.mark_newer(key);
            let removed = inner.large.as_ref().and_then(|lo| lo.remove(key));
            let large = removed.filter(|meta| !meta.expired(now));
            (large, on_ssd)
        });
        let existed = match before {
            Lookup::Found(..) | Lookup::Sealed(..) => true,
            Lookup::Expired => false,
            Lookup::Deleted => large.is_some(),
            Lookup::Absent => large.is_some() || on_ssd,
        };
        inner.relieve_pressure();
        Ok(existed)
    }

    /// Atomic read-modify-write of one key: `f` sees the live item (if any) and decides.
    /// No other write to `key` happens between the read and the write. Returns `f`'s
    /// result and, for a put or a metadata change, the item's CAS version then.
    pub fn update<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(Option<&Item>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        // may do I/O: a large object's whole extent, or one SSD block
        self.update_read_before(key, None, f)
    }

    /// [`ZipCache::update`] for a command that reads the value where it used to GET it
    /// first (a hash edited in one update): the read counts in the frequency sketch as
    /// the GET's did, so that eviction still sees the object read (uncounted, DRAM-only
    /// eviction took every such object for cold and emptied whole leaves of them).
    pub fn update_as_read<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(Option<&Item>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        // may do I/O: a large object's whole extent, or one SSD block
        let outcome = self
            .inner
            .read_modify_write(key, ValueRead::WholeAsRead, |found| {
                f(found.map(|found| &found.item))
            });
        self.inner.relieve_pressure();
        outcome
    }

    /// [`ZipCache::update`] with the value the caller already read (`before`, from
    /// `get_item_async` off its thread): a large object whose BT_LO entry still names
    /// that version (CAS, flags, expiry, length) is not read again; any other is read as
    /// `update` reads it. An append of a large value then reads no extent on the caller's
    /// thread.
    pub fn update_read_before<R>(
        &self,
        key: &[u8],
        before: Option<Item>,
        f: impl FnOnce(Option<&Item>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        let read = before.map_or(ValueRead::Whole, ValueRead::ReadBefore);
        // may do I/O: a large object's whole extent unless `before` is its version, or
        // one SSD block
        let outcome = self
            .inner
            .read_modify_write(key, read, |found| f(found.map(|found| &found.item)));
        self.inner.relieve_pressure();
        outcome
    }

    /// `update` for a closure that needs no value: it sees the item's metadata and
    /// length. A large object's extent is not read, and an `Update::SetMeta` of it
    /// changes its BT_LO index entry alone: no device I/O (a touch of a 1 MiB object
    /// writes nothing to the device).
    pub fn update_meta<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(Option<&ItemInfo>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        // may do I/O: one SSD block, for a small object only the SSD tier holds
        let outcome = self
            .inner
            .read_modify_write(key, ValueRead::UnlessLarge, |found| {
                f(found.map(Found::info).as_ref())
            });
        self.inner.relieve_pressure();
        outcome
    }

    /// The metadata and length of `key`'s live item, for existence and length checks:
    /// a large object's extent is not read; its access state stays as it was.
    pub fn info(&self, key: &[u8]) -> Result<Option<ItemInfo>> {
        // may do I/O: one SSD block, for a small object only the SSD tier holds
        let (info, _) = self
            .inner
            .read_modify_write(key, ValueRead::UnlessLarge, |found| {
                (Update::Keep, found.map(Found::info))
            })?;
        Ok(info)
    }

    /// Drops the expired objects DRAM still holds (they count as resident until their
    /// leaf next merges), leaf by leaf; `keep_going` sees the totals after each leaf and
    /// may end the pass. Expired objects on the SSD tier and in BT_LO stay until those
    /// tiers rewrite them (no read ever returns them).
    pub fn reclaim_expired(&self, keep_going: impl FnMut(&Reclaimed) -> bool) -> Reclaimed {
        let inner = &self.inner;
        let done = inner.dram.reclaim_expired(inner.now(), keep_going);
        inner.relieve_pressure();
        done
    }

    /// Forgets every object: a barrier, after which nothing stored before it is served.
    ///
    /// DRAM is emptied first, so no eviction can carry an old object down to a tier that
    /// was already cleared; GETs that race the flush may still read the lower tiers until
    /// they are cleared too, but what they read is not copied back into DRAM: promotions
    /// and read-modify-writes check the flush epoch under the DRAM leaf's lock, and the
    /// epoch moves before DRAM is emptied (`Inner::lower_tiers_current`).
    pub fn flush_all(&self) -> Result<()> {
        let inner = &self.inner;
        let _one_at_a_time = inner.flushing.lock();
        // A crash from here until the tiers are empty restarts cold: the journal cannot
        // say which flash versions the flush had erased.
        if let Some(shadow) = &inner.shadow {
            shadow.set_flag(FLUSHING, true);
        }
        inner.flush_epoch.fetch_add(1, Ordering::SeqCst);
        inner.dram.evict_all(None, inner.now());
        // Before the SSD tier is emptied: a key written meanwhile and evicted after the
        // clear leaves its newest version on flash, and one written after this keeps
        // its mark.
        if let Some(shadow) = &inner.shadow {
            shadow.reset();
        }
        if let Some(ssd) = &inner.ssd {
            ssd.clear();
        }
        if let Some(lo) = &inner.large {
            lo.clear();
        }
        inner.flush_epoch.fetch_add(1, Ordering::SeqCst);
        if let Some(shadow) = &inner.shadow {
            shadow.set_flag(FLUSHING, false);
        }
        Ok(())
    }

    /// A [`flush_all`](Self::flush_all) promised for later (memcached's `flush_all
    /// <delay>`): until one runs, a crash restarts cold, since the promise dies with the
    /// process and the flash tier holds what it was to erase. After a running flush
    /// ends, so that its end does not withdraw the promise.
    pub fn promise_flush(&self) {
        let inner = &self.inner;
        let _after_a_running_flush = inner.flushing.lock();
        if let Some(shadow) = &inner.shadow {
            shadow.set_flag(FLUSHING, true);
        }
    }
}

/// What a read-modify-write leaves in DRAM (`DramTier::modify`), if anything.
type DramChange = Option<Change>;

/// Whether a read-modify-write reads a large object's value from its extent.
enum ValueRead {
    Whole,
    /// `Whole`, the look counted as a GET (`Look::Read`).
    WholeAsRead,
    /// Its index entry alone: the closure needs no value.
    UnlessLarge,
    /// The value the caller read before (off its thread): used, without reading the
    /// extent again, if BT_LO's entry still describes that very version; else `Whole`.
    ReadBefore(Item),
}

/// A live object as a read-modify-write finds it under its DRAM leaf's lock.
struct Found {
    /// Without its value if it was not read (`ValueRead::UnlessLarge`: a large one, or a
    /// medium one in DRAM left compressed).
    item: Item,
    value_len: usize,
    /// Held in BT_LO: a metadata change rewrites its index entry alone.
    large: bool,
    /// `item` holds the value.
    read: bool,
}

impl Found {
    fn small(item: Item) -> Found {
        Found {
            value_len: item.value.len(),
            item,
            large: false,
            read: true,
        }
    }

    fn info(&self) -> ItemInfo {
        ItemInfo {
            value_len: self.value_len,
            flags: self.item.flags,
            cas: self.item.cas,
            expires_at_ms: self.item.expires_at_ms,
            access: self.item.access,
            collection: self.item.collection,
        }
    }
}

impl Inner {
    /// `update`'s work, with a large object's value read as `read` says: the tiers are
    /// asked under `key`'s DRAM leaf lock, then `f` decides and its write is made.
    fn read_modify_write<R>(
        &self,
        key: &[u8],
        read: ValueRead,
        f: impl FnOnce(Option<&Found>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        self.check_key(key)?;
        let now = self.now();
        let wanted = match read {
            ValueRead::UnlessLarge => Wanted::Meta,
            ValueRead::Whole | ValueRead::ReadBefore(_) | ValueRead::WholeAsRead => Wanted::Value,
        };
        let look = match read {
            ValueRead::WholeAsRead => Look::Read,
            _ => Look::Peek,
        };
        let dram = &self.dram;
        dram.modify_wanting(key, now, wanted, look, |current, cas| {
            // The leaf stays locked while BT_LO and the SSD are read, so no write slips in.
            // What a racing flush_all is erasing below must not come back as a new value.
            let epoch = self.flush_epoch.load(Ordering::SeqCst);
            let below = |found: Option<Found>| found.filter(|_| self.lower_tiers_current(epoch));
            let current = match current {
                Lookup::Found(value, meta, access) => Some(Found::small(Item {
                    access,
                    ..item_of(value, &meta)
                })),
                Lookup::Sealed(meta, value_len, access) => Some(Found {
                    item: Item {
                        access,
                        ..item_of(Vec::new(), &meta)
                    },
                    value_len,
                    large: false,
                    read: false,
                }),
                Lookup::Expired => None,
                Lookup::Deleted => below(self.large_found(key, now, read)),
                Lookup::Absent => below(self.large_found(key, now, read).or_else(|| {
                    // may do I/O: one 4 KiB read
                    let hit = self.ssd.as_ref().and_then(|ssd| ssd.get(key, now));
                    hit.map(|hit| Found::small(item_of(hit.value, &hit.meta)))
                })),
            };
            let (update, result) = f(current.as_ref());
            match (update, current) {
                (Update::Keep, _) | (Update::Delete | Update::SetMeta(_), None) => {
                    (None, Ok((result, None)))
                }
                (Update::Delete, Some(_)) => {
                    if let Some(lo) = &self.large {
                        // may write the crash journal: the key first, then BT_LO's log
                        self.dram.mark_newer(key);
                        lo.remove(key);
                    }
                    (Some(Change::Delete), Ok((result, None)))
                }
                (Update::SetMeta(options), Some(found)) => {
                    // A touch keeps the object's type: its collection mark, whatever the
                    // options say.
                    let options = PutOptions {
                        collection: found.item.collection,
                        ..options
                    };
                    if found.large {
                        let meta = self.meta(&options).assigning(cas);
                        let lo = self.large.as_ref().expect("a large object is in BT_LO");
                        lo.set_meta(key, meta);
                        // A new version given out is recorded, so that it is never given
                        // again, as for a large put (a DRAM tombstone); a kept one needs
                        // none.
                        let change = (meta.cas == cas).then_some(Change::Delete);
                        return (change, Ok((result, Some(meta.cas))));
                    }
                    if !found.read {
                        // A medium value left compressed: its blob is re-headed.
                        if let Err(e) = self.check_room() {
                            return (None, Err(e));
                        }
                        let meta = self.meta(&options).assigning(cas);
                        let change = Change::Redate {
                            value: None,
                            meta,
                            access: options.access,
                        };
                        return (Some(change), Ok((result, Some(meta.cas))));
                    }
                    // The same value: a medium one's blob is re-headed, not compressed again.
                    let (change, outcome) =
                        self.put_in_modify(key, found.item.value, options, cas, result);
                    let change = change.map(|change| match change {
                        Change::Put((value, meta, access)) => Change::Redate {
                            value: Some(value),
                            meta,
                            access,
                        },
                        other => other,
                    });
                    (change, outcome)
                }
                (Update::Put { value, options }, _) => {
                    self.put_in_modify(key, value, options, cas, result)
                }
            }
        })
    }

    /// `key`'s large object, read whole or (`UnlessLarge`) as BT_LO's index describes it.
    fn large_found(&self, key: &[u8], now: u64, read: ValueRead) -> Option<Found> {
        if let ValueRead::ReadBefore(before) = read {
            let LargeEntry { meta, value_len } = self.large.as_ref()?.entry(key, now)?;
            // Only an assigned CAS names one version: a CAS the client chose may name two,
            // and 0 (none asked for) names them all.
            let unchanged = !meta.client_cas
                && meta.cas != 0
                && value_len == before.value.len()
                && (meta.cas, meta.flags, meta.expires_at_ms)
                    == (before.cas, before.flags, before.expires_at_ms);
            if unchanged {
                self.ops.large_hits.incr();
                return Some(Found {
                    item: Item {
                        access: None,
                        collection: meta.collection,
                        ..before
                    },
                    value_len,
                    large: true,
                    read: true,
                });
            }
        } else if let ValueRead::UnlessLarge = read {
            let entry = self.large.as_ref()?.entry(key, now)?;
            return Some(Found {
                item: item_of(Vec::new(), &entry.meta),
                value_len: entry.value_len,
                large: true,
                read: false,
            });
        }
        // may do I/O: the whole extent
        let item = self.large_get(key, now)?;
        Some(Found {
            large: true,
            ..Found::small(item)
        })
    }

    /// The DRAM change (and answer) of a read-modify-write that puts `value`: into BT_LO
    /// behind a DRAM tombstone if large (may do I/O: the extent), else into DRAM.
    fn put_in_modify<R>(
        &self,
        key: &[u8],
        value: Vec<u8>,
        options: PutOptions,
        cas: u64,
        result: R,
    ) -> (DramChange, Result<(R, Option<u64>)>) {
        let checked = self.check_value(&value).and_then(|()| self.check_room());
        if let Err(e) = checked {
            return (None, Err(e));
        }
        let meta = self.meta(&options).assigning(cas);
        // may write the crash journal: the key first, then BT_LO's log (`mark_newer`)
        self.dram.mark_newer(key);
        let change = match self.large_for(key, &value) {
            Some(lo) => {
                lo.put(key, &value, meta);
                Change::Delete
            }
            None => {
                if let Some(lo) = &self.large {
                    lo.remove(key);
                }
                Change::Put((value, meta, options.access))
            }
        };
        (Some(change), Ok((result, Some(meta.cas))))
    }

    /// With `evictions` off, a write is refused while the budget is full (counted in
    /// `refused_writes`): nothing is evicted to make room.
    fn check_room(&self) -> Result<()> {
        if self.config.evictions || self.memory.snapshot().total() < self.budget() {
            return Ok(());
        }
        self.ops.refused_writes.incr();
        Err(Error::OutOfMemory)
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        if value.len() > self.config.max_value_size {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: self.config.max_value_size,
            });
        }
        Ok(())
    }

    fn meta(&self, options: &PutOptions) -> Meta {
        // A version the write names is kept as it is (memcached meta `E`); otherwise the
        // DRAM tier gives one, under the key's leaf lock.
        let cas = match options.cas {
            Some(chosen) => chosen,
            None if options.assign_cas => ASSIGN_CAS,
            None => 0,
        };
        let client_cas = options.cas.is_some_and(|chosen| chosen != 0);
        Meta {
            expires_at_ms: options.expires_at_ms,
            flags: options.flags,
            cas,
            clean: false,
            client_cas,
            collection: options.collection,
        }
    }

    /// BT_LO if `key` + `value` make a large object and there is an SSD to hold it.
    fn large_for(&self, key: &[u8], value: &[u8]) -> Option<&LargeObjects> {
        self.large
            .as_ref()
            .filter(|_| key.len() + value.len() > self.config.medium_max)
    }

    /// Writes one object: large ones to BT_LO behind a DRAM tombstone, small ones to DRAM
    /// (dropping any large version), both under the DRAM leaf's lock. Returns its CAS
    /// version.
    fn store(
        &self,
        key: &[u8],
        value: &[u8],
        meta: Meta,
        access: Option<AccessState>,
        now: u64,
    ) -> u64 {
        let dram = &self.dram;
        match (self.large_for(key, value), &self.large) {
            (Some(lo), _) => dram.put_with(key, None, meta, None, now, |cas| {
                lo.put(key, value, meta.assigning(cas));
                cas
            }),
            (None, Some(lo)) => dram.put_with(key, Some(value), meta, access, now, |cas| {
                lo.remove(key);
                cas
            }),
            (None, None) => dram.put_with(key, Some(value), meta, access, now, |cas| cas),
        }
    }

    /// Whether no `flush_all` ran or started since `epoch` was read (and none was running
    /// then): what the lower tiers gave since is not being erased. Called under the DRAM
    /// leaf's lock before copying it into DRAM: a flush that starts after this check
    /// empties DRAM after it, so it will find and drop the copy.
    pub(super) fn lower_tiers_current(&self, epoch: u64) -> bool {
        epoch.is_multiple_of(2) && self.flush_epoch.load(Ordering::SeqCst) == epoch
    }
}
