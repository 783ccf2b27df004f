//! What the commands report as they run, beside their replies: the hit and miss
//! counters, `stats detail`'s per-prefix counts and the log streams (`watch`). Each
//! costs a relaxed atomic load while off.

use zipcache::{GetOptions, Item, Update};

use super::parse::StoreMode;
use super::watch::{Event, StoreStatus, Streams};
use super::{Expiry, Memcached};

/// A read by connection `conn` looked `key` up and found a value of this many bytes, or
/// nothing.
pub fn fetched(shared: &Memcached, conn: u64, key: &[u8], found: Option<usize>) {
    shared.core.counters.hit_or_miss(found.is_some());
    shared.prefix_stats.record_get(key, found.is_some());
    log_fetch(shared, conn, key, found);
}

/// memcached logs the item a storage command finds (a `set` too) as a fetch, without
/// counting it as one.
pub fn log_fetch(shared: &Memcached, conn: u64, key: &[u8], found: Option<usize>) {
    if shared.logger.wants(Streams::FETCHERS) {
        shared.logger.log(Event::ItemGet {
            key: key.into(),
            found,
            conn,
        });
    }
}

/// Whether a storage command should look at the item it replaces, for `log_fetch`.
pub fn wants_previous(shared: &Memcached) -> bool {
    shared.logger.wants(Streams::FETCHERS)
}

/// The value stored under `key` now, without marking it fetched, for `log_fetch`.
pub fn peek_size(shared: &Memcached, key: &[u8]) -> Option<usize> {
    let peek = GetOptions { peek: true };
    let found = shared.core.strings.get_item(key, peek).ok().flatten();
    found.map(|item: Item| item.value.len())
}

/// A storage command of connection `conn` for `key` ended as `status` says, sending
/// `size` bytes.
pub fn stored(
    shared: &Memcached,
    conn: u64,
    key: &[u8],
    mode: StoreMode,
    status: StoreStatus,
    expiry: Expiry,
    size: usize,
) {
    shared.prefix_stats.record_set(key);
    if !shared.logger.wants(Streams::MUTATIONS) {
        return;
    }
    let ttl = match expiry {
        Expiry::At(at) => at
            .saturating_sub(shared.core.strings.engine().now_ms())
            .div_ceil(1000),
        Expiry::Never | Expiry::Past => 0,
    };
    shared.logger.log(Event::ItemStore {
        key: key.into(),
        status,
        command: match mode {
            StoreMode::Set => "set",
            StoreMode::Add => "add",
            StoreMode::Replace => "replace",
            StoreMode::Append => "append",
            StoreMode::Prepend => "prepend",
            StoreMode::Cas(_) => "cas",
        },
        ttl,
        size,
        conn,
    });
}

/// Whether deletes should find out the size of what they remove, for `deleted`.
pub fn wants_deletions(shared: &Memcached) -> bool {
    shared.logger.wants(Streams::DELETIONS)
}

/// `command` (`delete` or `md`) removed `key`, whose value was `size` bytes.
pub fn deleted(shared: &Memcached, key: &[u8], command: &'static str, size: usize) {
    shared.logger.log(Event::Deleted {
        key: key.into(),
        command,
        size,
    });
}

/// `delete`: removes `key`; whether it was there. Watched, the removal reads the size it
/// logs in the same atomic update.
pub fn delete(shared: &Memcached, key: &[u8]) -> zipcache::Result<bool> {
    if !wants_deletions(shared) {
        return shared.core.strings.delete(key);
    }
    let (size, _) =
        shared
            .annotations
            .update(&shared.core.strings, key, |current| match current {
                None => (Update::Keep.into(), None),
                Some(entry) => (Update::Delete.into(), Some(entry.item.value.len())),
            })?;
    if let Some(size) = size {
        deleted(shared, key, "delete", size);
    }
    Ok(size.is_some())
}
