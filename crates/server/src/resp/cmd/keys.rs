//! Keyspace commands: DEL UNLINK EXISTS TYPE RENAME RENAMENX SCAN KEYS ZCRANGE DBSIZE
//! FLUSHALL FLUSHDB. They name strings and hashes alike (`core/hashes/`): DEL takes a
//! hash's elements, RENAME moves a hash (`core/hashes/rename.rs`).
//! SCAN, KEYS and ZCRANGE walk the engine's key order: SCAN and KEYS its keys only
//! (`ZipCache::scan_keys`), ZCRANGE its values within the output budget
//! (`ZipCache::scan_bytes`).

use std::ops::Bound;

use super::{
    Args, Command, NOT_INTEGER, READS_ALL, READS_ONE, Result, SYNTAX, Spec, WRITES_ALL, WRITES_TWO,
    integer, keyed, spec,
};
use crate::core::cursors;
use crate::core::hashes::{Renamed, type_name};
use crate::core::keyspace::Keyspace;
use crate::resp::Resp;
use crate::resp::{Reply, glob};
use crate::transport::output::OUTPUT_BUDGET;

/// RENAME's source missing, as Redis words it.
const NO_SUCH_KEY: &str = "ERR no such key";
/// A cursor that no scan handed out (or one forgotten), as Redis words a bad one.
pub(super) const INVALID_CURSOR: &str = "ERR invalid cursor";
/// Default and largest `LIMIT` of `ZCRANGE`.
const RANGE_DEFAULT_LIMIT: usize = 1000;
const RANGE_MAX_LIMIT: usize = 100_000;
const SCAN_MAX_COUNT: usize = 100_000;
/// Objects SCAN, KEYS and ZCRANGE ask the engine for at a time.
const BATCH: usize = 64;
/// ZCRANGE once a slot has moved (`core/keyspace.rs`).
const UNORDERED: &str =
    "ERR ZCRANGE is not served once a slot of this node has moved: key order is lost";
/// What a key costs in a reply besides its bytes (`$<len>\r\n…\r\n`), as the replies
/// are kept within the output budget.
pub(super) const BULK_OVERHEAD: usize = 16;

pub const COMMANDS: &[Spec] = &[
    keyed("del", -2, WRITES_ALL, |a| {
        Ok(KeyCommand::Delete { keys: a.rest() }.into())
    }),
    keyed("unlink", -2, WRITES_ALL, |a| {
        Ok(KeyCommand::Delete { keys: a.rest() }.into())
    }),
    keyed("exists", -2, READS_ALL, |a| {
        Ok(KeyCommand::Exists { keys: a.rest() }.into())
    }),
    keyed("type", 2, READS_ONE, |a| {
        Ok(KeyCommand::Type { key: a.next()? }.into())
    }),
    keyed("rename", 3, WRITES_TWO, |a| rename(a, false)),
    keyed("renamenx", 3, WRITES_TWO, |a| rename(a, true)),
    spec("scan", -2, scan),
    spec("keys", 2, |a| {
        Ok(KeyCommand::Keys { pattern: a.next()? }.into())
    }),
    spec("zcrange", -3, range),
    spec("dbsize", 1, |_| Ok(KeyCommand::DbSize.into())),
    spec("flushall", -1, flush),
    spec("flushdb", -1, flush),
];

pub enum KeyCommand<'a> {
    /// DEL / UNLINK.
    Delete {
        keys: &'a [&'a [u8]],
    },
    Exists {
        keys: &'a [&'a [u8]],
    },
    Type {
        key: &'a [u8],
    },
    /// RENAME / RENAMENX (`only_new`).
    Rename {
        from: &'a [u8],
        to: &'a [u8],
        only_new: bool,
    },
    Scan {
        /// 0 starts; any other is a cursor handed out (`core/cursors.rs`).
        cursor: u64,
        count: usize,
        pattern: Option<&'a [u8]>,
        /// `TYPE`: only keys of this type (`string`, `hash`).
        kind: Option<&'a [u8]>,
    },
    Keys {
        pattern: &'a [u8],
    },
    /// ZCRANGE: key/value pairs in `range`, in key order.
    Range {
        start: Bound<&'a [u8]>,
        end: Bound<&'a [u8]>,
        limit: usize,
    },
    DbSize,
    Flush,
}

impl<'a> From<KeyCommand<'a>> for Command<'a> {
    fn from(command: KeyCommand<'a>) -> Self {
        Command::Keys(command)
    }
}

fn rename<'a>(args: &mut Args<'a>, only_new: bool) -> Result<Command<'a>> {
    let (from, to) = (args.next()?, args.next()?);
    Ok(KeyCommand::Rename { from, to, only_new }.into())
}

/// SCAN's cursor stands for the last key returned (`core/cursors.rs`), so a scan resumes
/// in key order after it, whatever was inserted or evicted meanwhile; "0" starts and ends
/// a scan.
fn scan<'a>(args: &mut Args<'a>) -> Result<Command<'a>> {
    let cursor = cursors::parse(args.next()?).ok_or(INVALID_CURSOR)?;
    let (mut count, mut pattern, mut kind) = (10, None, None);
    while args.remaining() > 0 {
        let option = args.next()?;
        if args.remaining() == 0 {
            return Err(SYNTAX.into());
        }
        let value = args.next()?;
        match option.to_ascii_uppercase().as_slice() {
            b"COUNT" => match integer(value).ok_or(NOT_INTEGER)? {
                n if n >= 1 => count = (n as usize).min(SCAN_MAX_COUNT),
                _ => return Err(SYNTAX.into()),
            },
            b"MATCH" => pattern = Some(value),
            b"TYPE" => kind = Some(value),
            _ => return Err(SYNTAX.into()),
        }
    }
    Ok(KeyCommand::Scan {
        cursor,
        count,
        pattern,
        kind,
    }
    .into())
}

/// `ZCRANGE start end [LIMIT n]`: `-` and `+` stand for the open ends.
fn range<'a>(args: &mut Args<'a>) -> Result<Command<'a>> {
    let start = match args.next()? {
        b"-" => Bound::Unbounded,
        key => Bound::Included(key),
    };
    let end = match args.next()? {
        b"+" => Bound::Unbounded,
        key => Bound::Excluded(key),
    };
    let limit = match args.rest() {
        [] => RANGE_DEFAULT_LIMIT,
        [word, n] if word.eq_ignore_ascii_case(b"LIMIT") => match integer(n) {
            Some(n) if n >= 0 => (n as usize).min(RANGE_MAX_LIMIT),
            _ => return Err(NOT_INTEGER.into()),
        },
        _ => return Err(SYNTAX.into()),
    };
    Ok(KeyCommand::Range { start, end, limit }.into())
}

/// FLUSHALL / FLUSHDB `[ASYNC | SYNC]`: both flush at once.
fn flush<'a>(args: &mut Args<'a>) -> Result<Command<'a>> {
    if args.remaining() > 0 {
        let mode = args.next()?;
        if !mode.eq_ignore_ascii_case(b"ASYNC") && !mode.eq_ignore_ascii_case(b"SYNC") {
            return Err(SYNTAX.into());
        }
    }
    Ok(KeyCommand::Flush.into())
}

/// The key range holding every key that starts with `pattern`'s literal prefix (before
/// its first `*`, `?`, `[` or `\`), so KEYS examines only those keys.
fn prefix_range(pattern: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let literal = pattern
        .iter()
        .position(|b| matches!(b, b'*' | b'?' | b'[' | b'\\'))
        .unwrap_or(pattern.len());
    let prefix = &pattern[..literal];
    // The first key after every key with this prefix: the prefix with its last byte
    // below 0xff incremented (all 0xff: no end).
    let end = match prefix.iter().rposition(|&b| b != 0xff) {
        Some(at) => {
            let mut end = prefix[..=at].to_vec();
            end[at] += 1;
            Bound::Excluded(end)
        }
        None => Bound::Unbounded,
    };
    (Bound::Included(prefix.to_vec()), end)
}

impl KeyCommand<'_> {
    pub fn execute(self, shared: &Resp, out: &mut Reply) -> Result<()> {
        let cache = &shared.core.keys;
        match self {
            KeyCommand::Delete { keys } => {
                let mut deleted = 0;
                for key in keys {
                    // may do I/O: one SSD block; a hash's elements
                    deleted += shared.core.hashes.delete_key(cache, key)? as i64;
                }
                out.integer(deleted);
            }
            KeyCommand::Exists { keys } => {
                let mut found = 0;
                for key in keys {
                    // may do I/O: one SSD block for a small object; no large extent
                    found += cache.info(key)?.is_some() as i64;
                }
                out.integer(found);
            }
            KeyCommand::Type { key } => {
                // may do I/O: one SSD block for a small object; no large extent
                let found = cache.info(key)?;
                out.simple(found.as_ref().map_or("none", type_name));
            }
            KeyCommand::Scan {
                cursor,
                count,
                pattern,
                kind,
            } => {
                let start = match cursor {
                    0 => Bound::Unbounded,
                    cursor => Bound::Excluded(
                        shared
                            .core
                            .cursors
                            .resume(b"", cursor)
                            .ok_or(INVALID_CURSOR)?,
                    ),
                };
                // COUNT is a hint: the reply stops at the output budget, and the cursor
                // says where.
                let (mut keys, mut bytes) = (Vec::new(), 0);
                let stopped = cache.walk(start, Bound::Unbounded, count, |key, info| {
                    let typed =
                        kind.is_none_or(|k| k.eq_ignore_ascii_case(type_name(info).as_bytes()));
                    if typed && pattern.is_none_or(|p| glob::matches(p, key)) {
                        bytes += key.len() + BULK_OVERHEAD;
                        keys.push(key.to_vec());
                    }
                    bytes < OUTPUT_BUDGET
                })?;
                let next = stopped.map_or(0, |key| shared.core.cursors.park(b"", key));
                out.array(2);
                out.bulk(next.to_string().as_bytes());
                out.array(keys.len());
                for key in keys {
                    out.bulk(&key);
                }
            }
            KeyCommand::Keys { pattern } => {
                let keys = keys(shared, pattern)?;
                out.array(keys.len());
                for key in keys {
                    out.bulk(&key);
                }
            }
            KeyCommand::Range { start, end, limit } => {
                // may do I/O: reads the values of large objects
                let items = pairs(cache, start, end, limit)?;
                out.array(items.len() * 2);
                for (key, value) in &items {
                    out.bulk(key);
                    out.bulk(value);
                }
            }
            KeyCommand::Rename { from, to, only_new } => {
                // may do I/O: the source's value (a large extent, a hash's elements)
                match shared.core.hashes.rename(cache, from, to, only_new)? {
                    Renamed::NoSuchKey => return Err(NO_SUCH_KEY.into()),
                    Renamed::Done if only_new => out.integer(1),
                    Renamed::Done => out.simple("OK"),
                    Renamed::DestinationExists => out.integer(0),
                }
            }
            KeyCommand::DbSize => out.integer(cache.engine().stats().objects_resident as i64),
            KeyCommand::Flush => {
                cache.engine().flush_all()?;
                out.simple("OK");
            }
        }
        Ok(())
    }
}

/// ZCRANGE's key/value pairs from `start` to `end`, at most `limit`, and fewer once the
/// reply passes the output budget (the client goes on after the last key). Each batch
/// asks the engine for what is left of the budget, so the pairs held are at most the
/// budget and one object.
fn pairs(
    cache: &Keyspace,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    // Ranges of client keys are ranges of stored keys only while no slot has moved.
    let (Some(mut from), Some(end)) = (cache.stored_bound(start), cache.stored_bound(end)) else {
        return Err(UNORDERED.into());
    };
    let (mut pairs, mut bytes) = (Vec::new(), 0);
    while pairs.len() < limit && bytes < OUTPUT_BUDGET {
        let (wanted, left) = (BATCH.min(limit - pairs.len()), OUTPUT_BUDGET - bytes);
        let range = (
            from.as_ref().map(Vec::as_slice),
            end.as_ref().map(Vec::as_slice),
        );
        // may do I/O: reads the values of large objects
        let batch = cache.engine().scan_bytes::<&[u8]>(range, wanted, left)?;
        let found = batch.len();
        let mut batch_bytes = 0;
        for (stored, item) in batch {
            batch_bytes += stored.len() + item.value.len();
            // ZCRANGE lists strings: a hash's header is not a value.
            if let Some(key) = cache.client_key(&stored).filter(|_| !item.collection) {
                bytes += key.len() + item.value.len() + 2 * BULK_OVERHEAD;
                pairs.push((key.to_vec(), item.value));
            }
            from = Bound::Excluded(stored);
        }
        if found < wanted && batch_bytes < left {
            // The range ended.
            break;
        }
    }
    Ok(pairs)
}

/// KEYS: the keys matching `pattern` in key order. It examines at most `keys_limit`
/// keys (those with the pattern's literal prefix), and refuses beyond that or when its
/// reply would pass the output budget: SCAN walks any number of keys in bounded replies.
fn keys(shared: &Resp, pattern: &[u8]) -> Result<Vec<Vec<u8>>> {
    let limit = shared.keys_limit;
    let keys = &shared.core.keys;
    let (start, end) = prefix_range(pattern);
    // Once a slot has moved, stored keys of one prefix no longer lie together.
    let (start, end) = match (
        keys.stored_bound(start.as_ref().map(Vec::as_slice)),
        keys.stored_bound(end.as_ref().map(Vec::as_slice)),
    ) {
        (Some(start), Some(end)) => (start, end),
        _ => (Bound::Unbounded, Bound::Unbounded),
    };
    let (mut found, mut bytes) = (Vec::new(), 0);
    let stopped = keys.walk(
        start,
        end.as_ref().map(Vec::as_slice),
        limit.saturating_add(1),
        |key, _| {
            if glob::matches(pattern, key) {
                bytes += key.len() + BULK_OVERHEAD;
                found.push(key.to_vec());
            }
            bytes <= OUTPUT_BUDGET
        },
    )?;
    // Stopped, and not by the budget: the walk reached `limit + 1` keys.
    if stopped.is_some() && bytes <= OUTPUT_BUDGET {
        return Err(format!(
            "ERR KEYS would examine more than {limit} keys (keys-limit); use SCAN"
        )
        .into());
    }
    if bytes > OUTPUT_BUDGET {
        return Err(format!("ERR KEYS reply would pass {OUTPUT_BUDGET} bytes; use SCAN").into());
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::fuzzing::{new_hybrid_engine, options, resp_request};
    use crate::serving_tests::{resp_session, serve_in_process};

    /// ZCRANGE walked page by page (each from the last key of the one before) over
    /// 20,000 small objects and 24 of 256 KiB: every pair once with its value, and no
    /// write larger than the budget and one object.
    #[test]
    fn zcrange_pages_stay_within_the_budget_and_miss_nothing() {
        let cache = new_hybrid_engine();
        for i in 0..24u8 {
            cache
                .put(format!("big:{i:02}").as_bytes(), &vec![i; 256 << 10], None)
                .unwrap();
        }
        let mut want = cache.scan::<&[u8]>(.., usize::MAX).unwrap().into_iter();
        let mut start = b"-".to_vec();
        let mut pages = 0;
        loop {
            let request = resp_request(&[b"ZCRANGE", &start, b"+", b"LIMIT", b"100000"]);
            let session = resp_session(Arc::clone(&cache), &options());
            let (reply, largest) = serve_in_process(session, &request);
            assert!(
                largest <= OUTPUT_BUDGET + (256 << 10) + 64,
                "{largest} bytes buffered"
            );
            let mut last = Vec::new();
            let mut pairs = 0;
            let mut rest = &reply[reply.iter().position(|&b| b == b'\n').unwrap() + 1..];
            while !rest.is_empty() {
                let (key, item) = want.next().expect("no pair past the last object");
                let bulk = |bytes: &[u8]| {
                    [format!("${}\r\n", bytes.len()).as_bytes(), bytes, b"\r\n"].concat()
                };
                let pair = [bulk(&key), bulk(&item.value)].concat();
                assert!(rest.starts_with(&pair), "the pair of {key:?}");
                rest = &rest[pair.len()..];
                last = key;
                pairs += 1;
            }
            pages += 1;
            if pairs == 0 {
                break;
            }
            // The next page starts after the last key (ZCRANGE's start is inclusive).
            start = [last.as_slice(), b"\0"].concat();
        }
        assert!(want.next().is_none(), "every pair listed");
        assert!(pages > 20, "{pages} pages");
    }

    #[test]
    fn keys_examines_only_the_literal_prefix() {
        let (start, end) = prefix_range(b"user:*");
        assert_eq!(start, Bound::Included(b"user:".to_vec()));
        assert_eq!(end, Bound::Excluded(b"user;".to_vec()));
        assert_eq!(prefix_range(b"a\xff?").1, Bound::Excluded(b"b".to_vec()));
        assert_eq!(prefix_range(b"\xff*").1, Bound::Unbounded);
        assert_eq!(
            prefix_range(b"*"),
            (Bound::Included(Vec::new()), Bound::Unbounded)
        );
    }
}
