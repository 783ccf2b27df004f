//! A large hash's fields as element objects of their own (`format.rs`): each read,
//! written and deleted by its stored key, a hash's elements walked in field order, and
//! counted against the header to tell a whole hash from a partial one.

use std::ops::Bound;

use zipcache::{GetOptions, PutOptions, Update};

use super::format::{HashId, Header, element_key, element_range, element_value};
use super::{Field, HashError, Part, REPLY_OVERHEAD, Result};
use crate::core::keyspace::Keyspace;

/// Elements one engine scan step returns.
const BATCH: usize = 64;

/// What a walk of a hash's elements found.
#[derive(Default)]
pub(super) struct Walked {
    /// Live fields and values (as the walk's `part` keeps them).
    pub live: Vec<(Vec<u8>, Vec<u8>)>,
    /// Fields of dead elements.
    pub dead: Vec<Vec<u8>>,
    /// Elements examined, dead ones included.
    pub elements: u64,
    /// The last field examined, if the walk stopped before the hash's end.
    pub next: Option<Vec<u8>>,
}

pub(super) fn read(keys: &Keyspace, id: HashId, field: &[u8]) -> Result<Field> {
    // may do I/O: one SSD block, or a large element's extent
    let item = keys
        .engine()
        .get_item(&element_key(id, field), GetOptions::default())?;
    Ok(Field::of_element(item.as_ref(), keys.engine().now_ms()))
}

pub(super) fn write(
    keys: &Keyspace,
    id: HashId,
    field: &[u8],
    value: &[u8],
    expires_at_ms: Option<u64>,
) -> Result<()> {
    let options = PutOptions {
        collection: true,
        ..PutOptions::default()
    };
    let key = element_key(id, field);
    // may evict
    keys.engine()
        .put_with(&key, &element_value(value, expires_at_ms), options)
        .map_err(write_error)?;
    Ok(())
}

/// What a failed write of an element tells the client.
pub(super) fn write_error(error: zipcache::Error) -> HashError {
    match error {
        // Past the engine's largest value, with the element's expiry before the value.
        zipcache::Error::ValueTooLarge { max, .. } => HashError::ValueTooLarge {
            max: max.saturating_sub(1),
        },
        error => error.into(),
    }
}

/// Deletes `field`'s element; what it held.
pub(super) fn delete(keys: &Keyspace, id: HashId, field: &[u8]) -> Result<Field> {
    let now = keys.engine().now_ms();
    // may do I/O: one SSD block, or a large element's extent
    let (before, _) = keys.engine().update(&element_key(id, field), |current| {
        let before = Field::of_element(current, now);
        let update = if before == Field::Absent {
            Update::Keep
        } else {
            Update::Delete
        };
        (update, before)
    })?;
    Ok(before)
}

/// The elements of hash `id` after field `after`, in field order, live or dead as of
/// `now` (ms): at most `limit` examined, and none past the one that takes the bytes held
/// — the live ones' as `part` keeps them, the dead ones' names — past `budget`.
pub(super) fn walk(
    keys: &Keyspace,
    id: HashId,
    after: Option<&[u8]>,
    limit: usize,
    budget: usize,
    part: Part,
    now: u64,
) -> Result<Walked> {
    let (start, end) = element_range(id);
    let prefix = start.len();
    let mut from = match after {
        Some(field) => Bound::Excluded(element_key(id, field)),
        None => Bound::Included(start),
    };
    let mut walked = Walked::default();
    let (mut examined, mut bytes) = (0, 0usize);
    while examined < limit {
        let range = (from.as_ref().map(Vec::as_slice), Bound::Excluded(&end[..]));
        let wanted = BATCH.min(limit - examined);
        // may do I/O: SSD blocks and large elements' extents
        let batch = keys.engine().scan_bytes::<&[u8]>(
            range,
            wanted,
            budget.saturating_sub(bytes).saturating_add(1),
        )?;
        let ended = batch.len() < wanted;
        for (stored, item) in batch {
            let name = stored[prefix..].to_vec();
            match Field::of_element(Some(&item), now) {
                Field::Live { value, .. } => {
                    bytes += part.bytes(&name, &value) + 2 * REPLY_OVERHEAD;
                    walked.live.push(part.keep(name.clone(), value));
                }
                Field::Dead { .. } => {
                    // Held until deleted: counted as a reply's bytes are, to bound them.
                    bytes += name.len() + REPLY_OVERHEAD;
                    walked.dead.push(name.clone());
                }
                Field::Absent => continue,
            }
            walked.elements += 1;
            examined += 1;
            if bytes > budget || examined == limit {
                walked.next = Some(name);
                return Ok(walked);
            }
            from = Bound::Excluded(stored);
        }
        if ended {
            break;
        }
    }
    Ok(walked)
}

/// Whether every element the header counts is there (its keys counted, no value read).
pub(super) fn whole(keys: &Keyspace, header: Header) -> Result<bool> {
    let (start, end) = element_range(header.id);
    let mut from = Bound::Included(start);
    let mut found = 0;
    loop {
        let range = (from.as_ref().map(Vec::as_slice), Bound::Excluded(&end[..]));
        // may do I/O: SSD blocks (keys only)
        let batch = keys.engine().scan_keys::<&[u8]>(range, BATCH)?;
        let ended = batch.len() < BATCH;
        found += batch.iter().filter(|(_, info)| info.collection).count() as u64;
        match batch.into_iter().last() {
            Some((stored, _)) if !ended && found <= header.elements => {
                from = Bound::Excluded(stored)
            }
            _ => return Ok(found == header.elements),
        }
    }
}

/// Deletes every element of hash `id` (its header is gone already).
pub(super) fn delete_all(keys: &Keyspace, id: HashId) -> Result<()> {
    let (start, end) = element_range(id);
    loop {
        let range = (Bound::Included(&start[..]), Bound::Excluded(&end[..]));
        // may do I/O: SSD blocks (keys only)
        let batch = keys.engine().scan_keys::<&[u8]>(range, BATCH)?;
        for (stored, _) in &batch {
            // may do I/O: one SSD block
            keys.engine().delete(stored)?;
        }
        if batch.len() < BATCH {
            return Ok(());
        }
    }
}
