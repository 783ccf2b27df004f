//! memcached meta commands: mg, ms, md, ma, mn, me.

use zipcache::{AccessState, GetOptions, Item, Update};

use super::annotations::{Entry, Marks, Write};
use super::events;
use super::parse::{Meta, MetaKind, StoreMode};
use super::text::{StoreOutcome, Storing, apply_delta, count_arith, read_before, store_item};
use super::{
    Expiry, Memcached, NON_NUMERIC, RequestContext, after_read, engine_error, line, ttl_seconds,
    with_access,
};
use crate::core::stats::Counters;

const BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format";

pub fn execute(cx: RequestContext<'_>, meta: &Meta<'_>, out: &mut Vec<u8>) {
    let shared = cx.shared;
    let result = match meta.kind {
        MetaKind::Noop => {
            line(out, "MN");
            Ok(())
        }
        MetaKind::Debug => debug(cx, meta, out),
        MetaKind::Get => get(cx, meta, out),
        MetaKind::Set => set(cx, meta, out),
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
            // Known with the engine setting `track_access`, else left out.
            (
                b'h',
                Some(Item {
                    access: Some(access),
                    ..
                }),
            ) => u8::from(access.fetched).to_string(),
            (
                b'l',
                Some(Item {
                    access: Some(access),
                    ..
                }),
            ) => idle_seconds(access, now_ms).to_string(),
            _ => continue,
        };
        out.push(b' ');
        out.push(flag.letter);
        out.extend_from_slice(value.as_bytes());
    }
}

/// Seconds since the last access, as memcached counts them (whole seconds of its clock).
fn idle_seconds(access: &AccessState, now_ms: u64) -> u64 {
    now_ms.saturating_sub(access.last_access_ms) / 1000
}

/// `VA <len> <flags>` and the value, or `HD <flags>` without it; `extra` ends the line.
fn value_reply(
    meta: &Meta<'_>,
    item: &Item,
    with_value: bool,
    now_ms: u64,
    extra: &str,
    out: &mut Vec<u8>,
) {
    if with_value {
        out.extend_from_slice(b"VA ");
        out.extend_from_slice(itoa::Buffer::new().format(item.value.len()).as_bytes());
    } else {
        out.extend_from_slice(b"HD");
    }
    return_flags(meta, Some(item), None, now_ms, out);
    out.extend_from_slice(extra.as_bytes());
    out.extend_from_slice(b"\r\n");
    if with_value {
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

/// The `EN` of a miss, echoing `k` and `O` (`q` hides it).
fn miss(meta: &Meta<'_>, out: &mut Vec<u8>) {
    if meta.has(b'q') {
        return;
    }
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

/// What `mg` found, once any write it asked for is done.
struct Fetched {
    entry: Entry,
    /// This request won the right to refill the item (`W`).
    won: bool,
    /// The token went out before this request (`Z`).
    token_was_sent: bool,
}

/// The `mg` flags that may write: touch (`T`), autovivify (`N`), recache (`R`).
struct GetWrites {
    touch: Option<Expiry>,
    vivify: Option<Expiry>,
    recache_before_ms: Option<u64>,
    client_cas: Option<u64>,
    /// `u`: the item's access state stays as it was.
    peek: bool,
    now_ms: u64,
}

impl GetWrites {
    /// Whether this request wins the token of `entry`: the first to see it stale, or
    /// (`R`) the first to see it expire within the recache time — in whole seconds, as
    /// memcached compares them.
    fn wins(&self, entry: &Entry) -> bool {
        let recache = match (self.recache_before_ms, entry.item.expires_at_ms) {
            (Some(limit), Some(expires)) => expires / 1000 < limit / 1000,
            _ => false,
        };
        !entry.marks.token_sent && (entry.marks.stale || recache)
    }

    fn fetch(&self, shared: &Memcached, key: &[u8]) -> Result<Option<Fetched>, String> {
        let (fetched, cas) = shared
            .annotations
            .update(&shared.core.strings, key, |current| match current {
                None => match self.vivify {
                    // An empty placeholder; this client wins the right to fill it.
                    Some(expiry) => {
                        let marks = Marks {
                            token_sent: true,
                            ..Marks::default()
                        };
                        // Its CAS is the one the write returns; as memcached, it was
                        // created unfetched just now, and this read then fetches it.
                        let created = AccessState {
                            fetched: false,
                            last_access_ms: self.now_ms,
                        };
                        let item = Item {
                            value: Vec::new(),
                            flags: 0,
                            cas: 0,
                            expires_at_ms: expiry.expires_at_ms(),
                            access: shared
                                .core
                                .strings
                                .engine()
                                .config()
                                .track_access
                                .then_some(created),
                            collection: false,
                        };
                        let fetched = Fetched {
                            entry: Entry { item, marks },
                            won: true,
                            token_was_sent: false,
                        };
                        let update = with_access(
                            expiry.store(Vec::new(), 0, self.client_cas),
                            after_read(self.peek, None, self.now_ms),
                        );
                        (Write::marked(update, marks), Some(fetched))
                    }
                    None => (Update::Keep.into(), None),
                },
                Some(entry) => {
                    let won = self.wins(entry);
                    let marks = Marks {
                        token_sent: entry.marks.token_sent || won,
                        ..entry.marks
                    };
                    let item = &entry.item;
                    let (update, entry) = match self.touch {
                        // The read before this one marked the access (unless `u`):
                        // the rewrite keeps the state as it is.
                        Some(expiry) => (
                            with_access(expiry.set_meta(item.flags, item.cas), item.access),
                            entry.clone().redated(expiry),
                        ),
                        None => (Update::Keep, entry.clone()),
                    };
                    let fetched = Fetched {
                        token_was_sent: entry.marks.token_sent,
                        entry,
                        won,
                    };
                    (Write::marked(update, marks), Some(fetched))
                }
            })
            .map_err(|e| engine_error(&e))?;
        Ok(fetched.map(|mut fetched| {
            if let Some(cas) = cas {
                fetched.entry.item.cas = cas;
            }
            fetched
        }))
    }
}

fn get(cx: RequestContext<'_>, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let shared = cx.shared;
    Counters::bump(&shared.core.counters.cmd_get);
    let now = shared.core.strings.engine().now_ms();
    let expiry = |letter| -> Result<Option<Expiry>, String> {
        Ok(numeric::<i64>(meta, letter)?.map(|t| Expiry::from_exptime(t, now)))
    };
    let writes = GetWrites {
        touch: expiry(b'T')?,
        vivify: expiry(b'N')?,
        recache_before_ms: expiry(b'R')?.map(|e| e.expires_at_ms().unwrap_or(0)),
        client_cas: numeric::<u64>(meta, b'E')?,
        peek: meta.get_options().peek,
        now_ms: now,
    };
    let unless_cas = numeric::<u64>(meta, b'C')?;
    // A plain read unless this request may write: touch, vivify, or win a token.
    let found = shared
        .annotations
        .get(
            &shared.core.strings,
            cx.reads,
            &meta.key,
            meta.get_options(),
        )
        .map_err(|e| engine_error(&e))?;
    let must_write = writes.touch.is_some()
        || match &found {
            None => writes.vivify.is_some(),
            Some(entry) => writes.wins(entry),
        };
    let fetched = if must_write {
        let mut fetched = writes.fetch(shared, &meta.key)?;
        // `h` and `l` report the state before this request, which the read above saw.
        if let (Some(fetched), Some(found)) = (&mut fetched, &found) {
            fetched.entry.item.access = found.item.access;
        }
        fetched
    } else {
        found.map(|entry| Fetched {
            token_was_sent: entry.marks.token_sent,
            entry,
            won: false,
        })
    };
    let size = fetched.as_ref().map(|f| f.entry.item.value.len());
    events::fetched(shared, cx.conn, &meta.key, size);
    let Some(fetched) = fetched else {
        miss(meta, out);
        return Ok(());
    };
    let mut extra = String::new();
    if fetched.token_was_sent {
        extra.push_str(" Z");
    }
    if fetched.entry.marks.stale {
        extra.push_str(" X");
    }
    if fetched.won {
        extra.push_str(" W");
    }
    // `C` matching the item's CAS: the client has this value already.
    let with_value = meta.has(b'v') && unless_cas != Some(fetched.entry.item.cas);
    value_reply(meta, &fetched.entry.item, with_value, now, &extra, out);
    Ok(())
}

fn set(cx: RequestContext<'_>, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let (shared, conn) = (cx.shared, cx.conn);
    Counters::bump(&shared.core.counters.cmd_set);
    let flags = numeric::<u32>(meta, b'F')?.unwrap_or(0);
    let exptime = numeric::<i64>(meta, b'T')?.unwrap_or(0);
    let compare = numeric::<u64>(meta, b'C')?;
    let client_cas = numeric::<u64>(meta, b'E')?;
    let mode = match meta.token(b'M') {
        None | Some(b"S" | b"s") => StoreMode::Set,
        Some(b"E" | b"e") => StoreMode::Add,
        Some(b"A" | b"a") => StoreMode::Append,
        Some(b"P" | b"p") => StoreMode::Prepend,
        Some(b"R" | b"r") => StoreMode::Replace,
        Some(_) => return Err("CLIENT_ERROR invalid mode for ms M token".into()),
    };
    let now = shared.core.strings.engine().now_ms();
    let expiry = Expiry::from_exptime(exptime, now);
    let mode = match (mode, compare) {
        (StoreMode::Set | StoreMode::Replace, Some(unique)) => StoreMode::Cas(unique),
        (mode, _) => mode,
    };
    let invalidate = meta.has(b'I');
    // Append/prepend with N creates the item when it is missing.
    let vivify = numeric::<i64>(meta, b'N')?;
    let store = |mode, expiry, before| {
        let storing = Storing {
            mode,
            flags,
            expiry,
            data: meta.data,
            cas: client_cas,
            allow_stale: invalidate,
            compare,
        };
        store_item(shared, conn, &meta.key, &storing, before).map_err(|e| engine_error(&e))
    };
    let before = read_before(cx.reads, mode, &meta.key);
    let (mut outcome, mut cas) = store(mode, expiry, before)?;
    if let (StoreOutcome::NotStored, Some(exptime), StoreMode::Append | StoreMode::Prepend) =
        (outcome, vivify, mode)
    {
        (outcome, cas) = store(StoreMode::Add, Expiry::from_exptime(exptime, now), None)?;
    }
    let (code, size) = match outcome {
        StoreOutcome::Stored { size } => ("HD", Some(size)),
        StoreOutcome::NotStored => ("NS", None),
        StoreOutcome::Exists => ("EX", None),
        StoreOutcome::NotFound => ("NF", None),
    };
    // The item as reported: `s` is the size now stored (appends included).
    let stored = size.map(|size| Item {
        value: if meta.has(b's') {
            vec![0; size]
        } else {
            Vec::new()
        },
        flags,
        cas: cas.unwrap_or(0),
        expires_at_ms: None,
        access: None,
        collection: false,
    });
    // memcached reports `c0` when nothing was stored.
    status(
        meta,
        code,
        stored.as_ref(),
        Some(cas.unwrap_or(0)),
        now,
        out,
    );
    Ok(())
}

/// `md`: deletes, or with `I` marks the item stale (new CAS, win token back on offer),
/// or with `x` empties its value but keeps the item (and its CAS).
fn delete(shared: &Memcached, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let compare = numeric::<u64>(meta, b'C')?;
    let client_cas = numeric::<u64>(meta, b'E')?;
    let new_flags = numeric::<u32>(meta, b'F')?.unwrap_or(0);
    let now = shared.core.strings.engine().now_ms();
    let new_expiry = numeric::<i64>(meta, b'T')?.map(|t| Expiry::from_exptime(t, now));
    let (invalidate, empty) = (meta.has(b'I'), meta.has(b'x'));
    let mut removed = None;
    let (code, _) = shared
        .annotations
        .update(&shared.core.strings, &meta.key, |current| match current {
            None => (Update::Keep.into(), "NF"),
            Some(entry) if compare.is_some_and(|c| c != entry.item.cas) => {
                (Update::Keep.into(), "EX")
            }
            Some(entry) if !invalidate && !empty => {
                removed = Some(entry.item.value.len());
                (Update::Delete.into(), "HD")
            }
            Some(entry) => {
                let item = &entry.item;
                let (value, flags, expiry) = if empty {
                    (Vec::new(), new_flags, new_expiry.unwrap_or(Expiry::Never))
                } else {
                    let expiry = new_expiry.unwrap_or_else(|| Expiry::from_item(item));
                    (item.value.clone(), item.flags, expiry)
                };
                let (cas, marks) = if invalidate {
                    let stale = Marks {
                        stale: true,
                        token_sent: false,
                    };
                    (client_cas, stale)
                } else {
                    (client_cas.or(Some(item.cas)), Marks::default())
                };
                let update = expiry.store(value, flags, cas);
                (Write::marked(update, marks), "HD")
            }
        })
        .map_err(|e| engine_error(&e))?;
    if code != "EX" {
        let counters = &shared.core.counters;
        Counters::hit_or_miss_of(&counters.delete_hits, &counters.delete_misses, code == "HD");
    }
    if let Some(size) = removed.filter(|_| events::wants_deletions(shared)) {
        events::deleted(shared, &meta.key, "md", size);
    }
    status(meta, code, None, None, 0, out);
    Ok(())
}

fn arith(shared: &Memcached, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
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
    let client_cas = numeric::<u64>(meta, b'E')?;
    let now = shared.core.strings.engine().now_ms();

    enum Outcome {
        Missing,
        Mismatch,
        NonNumeric,
        Done(Item),
    }
    let mut existed = false;
    let (outcome, cas) = shared
        .annotations
        .update(&shared.core.strings, &meta.key, |current| {
            existed = current.is_some();
            match (current, vivify) {
                (None, None) => (Update::Keep.into(), Outcome::Missing),
                (None, Some(exptime)) => {
                    let expiry = Expiry::from_exptime(exptime, now);
                    let value = initial.to_string().into_bytes();
                    let item = Item {
                        value: value.clone(),
                        flags: 0,
                        cas: 0,
                        expires_at_ms: expiry.expires_at_ms(),
                        access: None,
                        collection: false,
                    };
                    let update = expiry.store(value, 0, client_cas);
                    (update.into(), Outcome::Done(item))
                }
                (Some(Entry { item, .. }), _) if compare.is_some_and(|c| c != item.cas) => {
                    (Update::Keep.into(), Outcome::Mismatch)
                }
                (Some(Entry { item, .. }), _) => match apply_delta(&item.value, delta, incr, false)
                {
                    None => (Update::Keep.into(), Outcome::NonNumeric),
                    Some((_, value)) => {
                        let expiry = touch_exptime
                            .map_or(Expiry::from_item(item), |t| Expiry::from_exptime(t, now));
                        let new = Item {
                            value: value.clone(),
                            flags: item.flags,
                            cas: 0,
                            expires_at_ms: expiry.expires_at_ms(),
                            access: None,
                            collection: false,
                        };
                        let update = expiry.store(value, item.flags, client_cas);
                        (update.into(), Outcome::Done(new))
                    }
                },
            }
        })
        .map_err(|e| engine_error(&e))?;
    // As memcached: a created (vivified) counter is neither a hit nor a miss.
    match &outcome {
        Outcome::Missing => count_arith(shared, incr, false),
        Outcome::Done(_) if existed => count_arith(shared, incr, true),
        _ => {}
    }
    match outcome {
        Outcome::Missing => status(meta, "NF", None, None, now, out),
        Outcome::Mismatch => status(meta, "EX", None, None, now, out),
        Outcome::NonNumeric => return Err(NON_NUMERIC.into()),
        Outcome::Done(item) => {
            let item = Item {
                cas: cas.unwrap_or(item.cas),
                ..item
            };
            if meta.has(b'v') {
                value_reply(meta, &item, true, now, "", out);
            } else {
                status(meta, "HD", Some(&item), None, now, out);
            }
        }
    }
    Ok(())
}

/// `me`: the item's metadata, read without touching it (as memcached, which does not
/// bump the item either).
fn debug(cx: RequestContext<'_>, meta: &Meta<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let shared = cx.shared;
    let Some(Entry { item, .. }) = shared
        .annotations
        .get(
            &shared.core.strings,
            cx.reads,
            &meta.key,
            GetOptions { peek: true },
        )
        .map_err(|e| engine_error(&e))?
    else {
        line(out, "EN");
        return Ok(());
    };
    out.extend_from_slice(b"ME ");
    out.extend_from_slice(meta.key_token);
    let now = shared.core.strings.engine().now_ms();
    // `la=` and `fetch=` only where the engine knows them (setting `track_access`): a
    // made-up value would be a wrong answer.
    let (last_access, fetch) = match item.access {
        Some(access) => (
            format!(" la={}", idle_seconds(&access, now)),
            format!(" fetch={}", if access.fetched { "yes" } else { "no" }),
        ),
        None => (String::new(), String::new()),
    };
    let details = format!(
        " exp={}{last_access} cas={}{fetch} cls=1 size={}\r\n",
        ttl_seconds(&item, now),
        item.cas,
        meta.key.len() + item.value.len()
    );
    out.extend_from_slice(details.as_bytes());
    Ok(())
}
