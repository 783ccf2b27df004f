//! memcached meta commands: mg, ms, md, ma, mn, me.

use zipcache::{Item, Update};

use super::parse::{Meta, MetaKind, StoreMode};
use super::text::{StoreOutcome, apply_delta, store_item, touch};
use super::{Expiry, NON_NUMERIC, engine_error, line, ttl_seconds};
use crate::server::Shared;
use crate::stats::Counters;

const BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format";

pub fn execute(shared: &Shared, meta: &Meta<'_>, out: &mut Vec<u8>) {
    let result = match meta.kind {
        MetaKind::Noop => {
            line(out, "MN");
            Ok(())
        }
        MetaKind::Debug => debug(shared, meta, out),
        MetaKind::Get => get(shared, meta, out),
        MetaKind::Set => set(shared, meta, out),
        MetaKind::Delete => delete(shared, meta, out),
        MetaKind::Arith => arith(shared, meta, out),
    };
    if let Err(message) = result {
        line(out, &message);
    }
}

/// A numeric flag token, or the memcached error for a malformed one.
fn numeric<T: std::str::FromStr>(meta: &Meta<'_>, letter: u8) -> Result<Option<T>, String> {
    match meta.token(letter) {
        None => Ok(None),
        Some(token) => std::str::from_utf8(token)
            .ok()
            .and_then(|t| t.parse().ok())
            .map(Some)
            .ok_or_else(|| BAD_TOKEN.to_string()),
    }
}

/// The `k` return flag: the key as sent, marked ` b` when it is base64 (memcached does).
fn key_flag(meta: &Meta<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b" k");
    out.extend_from_slice(meta.key_token);
    if meta.has(b'b') {
        out.extend_from_slice(b" b");
    }
}

/// Appends the return flags the request asked for, in request order.
fn return_flags(
    meta: &Meta<'_>,
    item: Option<&Item>,
    cas: Option<u64>,
    now_ms: u64,
    out: &mut Vec<u8>,
) {
    for flag in &meta.flags {
        let value = match (flag.letter, item) {
            (b'k', _) => {
                key_flag(meta, out);
                continue;
            }
            (b'O', _) => {
                out.extend_from_slice(b" O");
                out.extend_from_slice(flag.token);
                continue;
            }
            (b'c', Some(item)) => cas.unwrap_or(item.cas).to_string(),
            (b'c', None) => match cas {
                Some(cas) => cas.to_string(),
                None => continue,
            },
            (b'f', Some(item)) if meta.kind == MetaKind::Get => item.flags.to_string(),
            (b's', Some(item)) => item.value.len().to_string(),
            (b't', Some(item)) => ttl_seconds(item, now_ms).to_string(),
            _ => continue,
        };
        out.push(b' ');
        out.push(flag.letter);
        out.extend_from_slice(value.as_bytes());
    }
}

fn value_reply(
    meta: &Meta<'_>,
    item: &Item,
    cas: Option<u64>,
    now_ms: u64,
    extra: &str,
    out: &mut Vec<u8>,
) {
    if meta.has(b'v') {
        out.extend_from_slice(format!("VA {}", item.value.len()).as_bytes());
    } else {
        out.extend_from_slice(b"HD");
    }
    return_flags(meta, Some(item), cas, now_ms, out);
    out.extend_from_slice(extra.as_bytes());
    out.extend_from_slice(b"\r\n");
    if meta.has(b'v') {
        out.extend_from_slice(&item.value);
        out.extend_from_slice(b"\r\n");
    }
}

/// A status line (`HD`, `NS`, ...) with return flags; `q` hides the success status.
fn status(
    meta: &Meta<'_>,
    code: &str,
    item: Option<&Item>,
    cas: Option<u64>,
    now_ms: u64,
    out: &mut Vec<u8>,
) {
    if code == "HD" && meta.has(b'q') {
        return;
    }
    out.extend_from_slice(code.as_bytes());
    return_flags(meta, item, cas, now_ms, out);
    out.extend_from_slice(b"\r\n");
}

fn get(shared: &Shared, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    Counters::bump(&shared.counters.cmd_get);
    let touch_exptime = numeric::<i64>(meta, b'T')?;
    let vivify_exptime = numeric::<i64>(meta, b'N')?;
    let found = match touch_exptime {
        Some(exptime) => touch(shared, &meta.key, exptime),
        None => shared.cache.get_item(&meta.key),
    }
    .map_err(|e| engine_error(&e))?;
    let now = shared.cache.now_ms();
    shared.counters.hit_or_miss(found.is_some());
    match (found, vivify_exptime) {
        (Some(item), _) => value_reply(meta, &item, None, now, "", out),
        (None, Some(exptime)) => {
            // Autovivify: an empty placeholder, and this client wins the right to fill it.
            let expiry = Expiry::from_exptime(exptime, now);
            let (item, cas) = shared
                .cache
                .update(&meta.key, |current| match current {
                    Some(item) => (Update::Keep, item.clone()),
                    None => (
                        expiry.store(Vec::new(), 0),
                        Item {
                            value: Vec::new(),
                            flags: 0,
                            cas: 0,
                            expires_at_ms: None,
                        },
                    ),
                })
                .map_err(|e| engine_error(&e))?;
            let item = Item {
                expires_at_ms: expiry.expires_at_ms().or(item.expires_at_ms),
                ..item
            };
            let won = if cas.is_some() { " W" } else { "" };
            value_reply(meta, &item, cas, now, won, out);
        }
        (None, None) => {
            if !meta.has(b'q') {
                out.extend_from_slice(b"EN");
                for flag in meta
                    .flags
                    .iter()
                    .filter(|f| matches!(f.letter, b'k' | b'O'))
                {
                    if flag.letter == b'k' {
                        key_flag(meta, out);
                    } else {
                        out.extend_from_slice(b" O");
                        out.extend_from_slice(flag.token);
                    }
                }
                out.extend_from_slice(b"\r\n");
            }
        }
    }
    Ok(())
}

fn set(shared: &Shared, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    Counters::bump(&shared.counters.cmd_set);
    let flags = numeric::<u32>(meta, b'F')?.unwrap_or(0);
    let exptime = numeric::<i64>(meta, b'T')?.unwrap_or(0);
    let compare = numeric::<u64>(meta, b'C')?;
    let mode = match meta.token(b'M') {
        None | Some(b"S" | b"s") => StoreMode::Set,
        Some(b"E" | b"e") => StoreMode::Add,
        Some(b"A" | b"a") => StoreMode::Append,
        Some(b"P" | b"p") => StoreMode::Prepend,
        Some(b"R" | b"r") => StoreMode::Replace,
        Some(_) => return Err("CLIENT_ERROR invalid mode for ms M token".into()),
    };
    let now = shared.cache.now_ms();
    let expiry = Expiry::from_exptime(exptime, now);
    let mode = match (mode, compare) {
        (StoreMode::Set | StoreMode::Replace, Some(unique)) => StoreMode::Cas(unique),
        (mode, _) => mode,
    };
    // Append/prepend with N creates the item when it is missing.
    let vivify = numeric::<i64>(meta, b'N')?;
    let (mut outcome, mut cas) = store_item(shared, mode, &meta.key, flags, expiry, meta.data)
        .map_err(|e| engine_error(&e))?;
    if let (StoreOutcome::NotStored, Some(exptime), StoreMode::Append | StoreMode::Prepend) =
        (outcome, vivify, mode)
    {
        let vivify_expiry = Expiry::from_exptime(exptime, now);
        (outcome, cas) = store_item(
            shared,
            StoreMode::Add,
            &meta.key,
            flags,
            vivify_expiry,
            meta.data,
        )
        .map_err(|e| engine_error(&e))?;
    }
    let code = match outcome {
        StoreOutcome::Stored => "HD",
        StoreOutcome::NotStored => "NS",
        StoreOutcome::Exists => "EX",
        StoreOutcome::NotFound => "NF",
    };
    let stored = Item {
        value: meta.data.to_vec(),
        flags,
        cas: cas.unwrap_or(0),
        expires_at_ms: None,
    };
    status(
        meta,
        code,
        (outcome == StoreOutcome::Stored).then_some(&stored),
        cas,
        now,
        out,
    );
    Ok(())
}

fn delete(shared: &Shared, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let compare = numeric::<u64>(meta, b'C')?;
    let (code, _) = shared
        .cache
        .update(&meta.key, |current| match (current, compare) {
            (None, _) => (Update::Keep, "NF"),
            (Some(item), Some(unique)) if item.cas != unique => (Update::Keep, "EX"),
            (Some(_), _) => (Update::Delete, "HD"),
        })
        .map_err(|e| engine_error(&e))?;
    status(meta, code, None, None, 0, out);
    Ok(())
}

fn arith(shared: &Shared, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let incr = match meta.token(b'M') {
        None | Some(b"I" | b"i" | b"+") => true,
        Some(b"D" | b"d" | b"-") => false,
        Some(_) => return Err("CLIENT_ERROR invalid mode for ma M token".into()),
    };
    let delta = numeric::<u64>(meta, b'D')?.unwrap_or(1);
    let initial = numeric::<u64>(meta, b'J')?.unwrap_or(0);
    let vivify = numeric::<i64>(meta, b'N')?;
    let touch_exptime = numeric::<i64>(meta, b'T')?;
    let compare = numeric::<u64>(meta, b'C')?;
    let now = shared.cache.now_ms();

    enum Outcome {
        Missing,
        Mismatch,
        NonNumeric,
        Done(Item),
    }
    let (outcome, cas) = shared
        .cache
        .update(&meta.key, |current| match (current, vivify) {
            (None, None) => (Update::Keep, Outcome::Missing),
            (None, Some(exptime)) => {
                let expiry = Expiry::from_exptime(exptime, now);
                let value = initial.to_string().into_bytes();
                let item = Item {
                    value: value.clone(),
                    flags: 0,
                    cas: 0,
                    expires_at_ms: expiry.expires_at_ms(),
                };
                (expiry.store(value, 0), Outcome::Done(item))
            }
            (Some(item), _) if compare.is_some_and(|c| c != item.cas) => {
                (Update::Keep, Outcome::Mismatch)
            }
            (Some(item), _) => match apply_delta(&item.value, delta, incr, false) {
                None => (Update::Keep, Outcome::NonNumeric),
                Some((_, value)) => {
                    let expiry = touch_exptime
                        .map_or(Expiry::from_item(item), |t| Expiry::from_exptime(t, now));
                    let new = Item {
                        value: value.clone(),
                        flags: item.flags,
                        cas: 0,
                        expires_at_ms: expiry.expires_at_ms(),
                    };
                    (expiry.store(value, item.flags), Outcome::Done(new))
                }
            },
        })
        .map_err(|e| engine_error(&e))?;
    match outcome {
        Outcome::Missing => status(meta, "NF", None, None, now, out),
        Outcome::Mismatch => status(meta, "EX", None, None, now, out),
        Outcome::NonNumeric => return Err(NON_NUMERIC.into()),
        Outcome::Done(item) if meta.has(b'v') => value_reply(meta, &item, cas, now, "", out),
        Outcome::Done(item) => status(meta, "HD", Some(&item), cas, now, out),
    }
    Ok(())
}

fn debug(shared: &Shared, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let Some(item) = shared
        .cache
        .get_item(&meta.key)
        .map_err(|e| engine_error(&e))?
    else {
        line(out, "EN");
        return Ok(());
    };
    out.extend_from_slice(b"ME ");
    out.extend_from_slice(meta.key_token);
    // The engine keeps no last-access time or fetched bit; report them as memcached
    // reports a fresh item.
    let details = format!(
        " exp={} la=0 cas={} fetch=no cls=1 size={}\r\n",
        ttl_seconds(&item, shared.cache.now_ms()),
        item.cas,
        meta.key.len() + item.value.len()
    );
    out.extend_from_slice(details.as_bytes());
    Ok(())
}
