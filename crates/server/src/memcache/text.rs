//! The classic memcached text commands.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use zipcache::{AccessState, GetOptions, Item, ItemInfo, Update};

use super::annotations::{Entry, Marks, Write};
use super::events;
use super::parse::{Request, StoreMode, TOO_LARGE};
use super::watch::StoreStatus;
use super::{
    Expiry, Memcached, NON_NUMERIC, PendingFlush, RequestContext, after_read, engine_error, line,
    parse_counter, with_access,
};
use crate::core::cluster::ClusterMode;
use crate::core::stats::{Counters, engine_metrics};
use crate::core::topology::Role;
use crate::transport::output::Output;
use crate::transport::prefetch::{Access, Prefetch};

/// Executes `request`, of connection `cx.conn`.
pub fn execute(cx: RequestContext<'_>, request: Request<'_>, out: &mut Vec<u8>) {
    let (shared, conn) = (cx.shared, cx.conn);
    match request {
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            data,
            noreply,
        } => {
            Counters::bump(&shared.core.counters.cmd_set);
            let before = read_before(cx.reads, mode, key);
            let storing = Storing {
                mode,
                flags,
                expiry: Expiry::from_exptime(exptime, shared.core.strings.engine().now_ms()),
                data,
                cas: None,
                allow_stale: false,
                compare: None,
            };
            let reply = store(shared, conn, key, &storing, before);
            reply_unless(noreply, &reply, out);
        }
        Request::Arith {
            key,
            delta,
            incr,
            noreply,
        } => {
            let reply = arith(shared, key, delta, incr);
            reply_unless(noreply, &reply, out);
        }
        Request::Delete { key, noreply } => {
            let reply = match delete(shared, key) {
                Ok(true) => "DELETED".to_string(),
                Ok(false) => "NOT_FOUND".to_string(),
                Err(e) => engine_error(&e),
            };
            reply_unless(noreply, &reply, out);
        }
        Request::Touch {
            key,
            exptime,
            noreply,
        } => {
            Counters::bump(&shared.core.counters.cmd_touch);
            let reply = match touch_metadata(shared, key, exptime) {
                Ok(Some(_)) => "TOUCHED".to_string(),
                Ok(None) => "NOT_FOUND".to_string(),
                Err(e) => engine_error(&e),
            };
            reply_unless(noreply, &reply, out);
        }
        Request::TooLarge {
            key,
            drop_old,
            noreply,
        } => {
            Counters::bump(&shared.core.counters.store_too_large);
            // memcached unlinks the old value so a failed set never leaves it stale.
            if drop_old {
                let _ = shared.core.strings.delete(&key);
            }
            reply_unless(noreply, TOO_LARGE, out);
        }
        Request::FlushAll { delay, noreply } => {
            Counters::bump(&shared.core.counters.cmd_flush);
            let reply = match flush_all(shared, delay) {
                Ok(()) => "OK".to_string(),
                Err(FlushRefused::Disabled) => "CLIENT_ERROR flush_all not allowed".to_string(),
                Err(FlushRefused::Engine(e)) => engine_error(&e),
            };
            reply_unless(noreply, &reply, out);
        }
        Request::Stats(section) => stats(shared, section, out),
        Request::StatsDetail(action) => stats_detail(shared, action, out),
        Request::Version => line(out, &format!("VERSION {VERSION}")),
        Request::ConfigGetCluster => config_get_cluster(shared, cx.local, out),
        Request::Verbosity { noreply } => reply_unless(noreply, "OK", out),
        // The session handles these before dispatching here.
        Request::Retrieve { .. }
        | Request::Quit
        | Request::Meta(_)
        | Request::Crawler(_)
        | Request::Operator(_)
        | Request::Error { .. }
        | Request::Watch(_) => {}
    }
}

/// The version both protocols report: memcached's protocol level, then ours.
pub const VERSION: &str = concat!("1.6.0-zipcache-", env!("CARGO_PKG_VERSION"));

/// `delete`: removes `key`, counted in `delete_hits`/`delete_misses` and `stats detail`;
/// whether it was there.
pub fn delete(shared: &Memcached, key: &[u8]) -> zipcache::Result<bool> {
    shared.prefix_stats.record_delete(key);
    let deleted = events::delete(shared, key);
    if let Ok(hit) = deleted {
        let counters = &shared.core.counters;
        Counters::hit_or_miss_of(&counters.delete_hits, &counters.delete_misses, hit);
    }
    deleted
}

fn reply_unless(noreply: bool, reply: &str, out: &mut Vec<u8>) {
    if !noreply {
        line(out, reply);
    }
}

/// Re-dates `key` (gat/gats) and returns the item as it now is, its value read for the
/// reply: a new expiry, the same CAS (as memcached's touch, which changes the expiry in
/// place), fetched and accessed now (memcached counts a touch as a fetch). The value is
/// not written again.
pub fn touch(shared: &Memcached, key: &[u8], exptime: i64) -> zipcache::Result<Option<Entry>> {
    let now = shared.core.strings.engine().now_ms();
    let expiry = Expiry::from_exptime(exptime, now);
    // may do I/O: a large object's extent is read (for the reply), not written
    let (entry, _) =
        shared
            .annotations
            .update(&shared.core.strings, key, |current| match current {
                None => (Update::Keep.into(), None),
                Some(Entry { item, marks }) => (
                    Write::marked(
                        redate(expiry, item.flags, item.cas, item.access, now),
                        *marks,
                    ),
                    Some(Entry {
                        item: item.clone(),
                        marks: *marks,
                    }),
                ),
            })?;
    count_touch(shared, entry.is_some());
    Ok(entry.map(|entry| entry.redated(expiry)))
}

/// `touch` for the commands that answer without the value (memcached's touch, binary
/// TOUCH): the item's metadata as it now is. A large object's value is neither read nor
/// written; the CAS is kept, so any annotation of the item still names it.
pub fn touch_metadata(
    shared: &Memcached,
    key: &[u8],
    exptime: i64,
) -> zipcache::Result<Option<ItemInfo>> {
    let now = shared.core.strings.engine().now_ms();
    let expiry = Expiry::from_exptime(exptime, now);
    // may do I/O: one SSD block, for a small object only the SSD tier holds
    let (info, _) = shared
        .core
        .strings
        .update_meta(key, |current| match current {
            None => (Update::Keep, None),
            Some(info) => (
                redate(expiry, info.flags, info.cas, info.access, now),
                Some(ItemInfo {
                    expires_at_ms: expiry.expires_at_ms(),
                    ..*info
                }),
            ),
        })?;
    count_touch(shared, info.is_some());
    Ok(info)
}

/// What a touch does to an item: `expiry`, its flags and CAS kept, fetched and accessed
/// `now`.
fn redate(expiry: Expiry, flags: u32, cas: u64, access: Option<AccessState>, now: u64) -> Update {
    with_access(expiry.set_meta(flags, cas), after_read(false, access, now))
}

fn count_touch(shared: &Memcached, hit: bool) {
    let counters = &shared.core.counters;
    Counters::hit_or_miss_of(&counters.touch_hits, &counters.touch_misses, hit);
}

/// A get / gets / gat / gats at the front of the input, from its next key on: its reply
/// is produced as the socket drains, so it stops past the output budget and resumes
/// where it stopped.
#[derive(Clone, Copy, Debug)]
pub struct Retrieval {
    with_cas: bool,
    touch: Option<i64>,
    /// Where its next key starts in the request.
    at: usize,
    /// The request's length (its line, newline included).
    pub len: usize,
}

/// Keys one step of a retrieval offers its admission (`prefetch::admit`): no more than
/// it can use, so that a step of a request naming many keys costs what it runs.
const ADMITTED_KEYS: usize = 2048;

impl Retrieval {
    /// The retrieval `request` (from its first key), if it is one; `len` long.
    pub fn of(request: &Request<'_>, input: &[u8], len: usize) -> Option<Retrieval> {
        let Request::Retrieve {
            with_cas, touch, ..
        } = *request
        else {
            return None;
        };
        let line = request_line(input, len);
        // The command word, and gat's exptime, come before the keys.
        let first_key = 1 + usize::from(touch.is_some());
        let at = tokens_from(line, 0)
            .nth(first_key)
            .map_or(line.len(), |(at, _)| at);
        Some(Retrieval {
            with_cas,
            touch,
            at,
            len,
        })
    }

    /// Runs the retrieval at the front of `input` as far as its admitted keys and the
    /// output budget allow: `Some` where it stopped (its next key), `None` once its reply
    /// is complete; `Err` while its next key's read is in flight.
    pub fn run(
        self,
        cx: RequestContext<'_>,
        input: &[u8],
        out: &mut Output,
    ) -> Result<Option<Self>, ()> {
        let keys = tokens_from(request_line(input, self.len), self.at);
        let admitted = cx.reads.admit(&cx.shared.core.strings, || {
            let window = keys
                .clone()
                .take(ADMITTED_KEYS)
                .map(|(_, key)| key)
                .collect();
            match self.touch {
                None => Access::Reads(window, GetOptions::default()),
                Some(_) => Access::Changes(window),
            }
        });
        if admitted == 0 {
            return Err(());
        }
        Ok(retrieve(cx, keys, admitted, self.with_cas, self.touch, out)
            .map(|at| Retrieval { at, ..self }))
    }
}

/// The line of the `len`-byte request at the front of `input`, without its newline.
fn request_line(input: &[u8], len: usize) -> &[u8] {
    let line = &input[..len - 1];
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The space-separated tokens of `line` from offset `at` on, each with its offset.
fn tokens_from(line: &[u8], mut at: usize) -> impl Iterator<Item = (usize, &[u8])> + Clone {
    std::iter::from_fn(move || {
        at += line.get(at..)?.iter().take_while(|&&b| b == b' ').count();
        let start = at;
        at += line[start..].iter().take_while(|&&b| b != b' ').count();
        (at > start).then(|| (start, &line[start..at]))
    })
}

/// Appends the replies of `keys` (each with its offset) until `admitted` of them are
/// answered or the output budget is passed: returns the offset of the next key then, or
/// `None` once `END` (or an error) ends the reply.
fn retrieve<'k>(
    mut cx: RequestContext<'_>,
    keys: impl Iterator<Item = (usize, &'k [u8])>,
    admitted: usize,
    with_cas: bool,
    touch_exptime: Option<i64>,
    out: &mut Output,
) -> Option<usize> {
    for (n, (at, key)) in keys.enumerate() {
        if n == admitted || !out.within_budget() {
            return Some(at);
        }
        let item = match fetch(&mut cx, key, touch_exptime) {
            Ok(item) => item,
            Err(e) => {
                line(out, &engine_error(&e));
                return None;
            }
        };
        if let Some(item) = item {
            out.extend_from_slice(b"VALUE ");
            out.extend_from_slice(key);
            // Numbers by `itoa`, not `core::fmt`'s machinery (2 % of the server's CPU
            // in a GET load of 64-byte values).
            let mut number = itoa::Buffer::new();
            out.extend_from_slice(b" ");
            out.extend_from_slice(number.format(item.flags).as_bytes());
            out.extend_from_slice(b" ");
            out.extend_from_slice(number.format(item.value.len()).as_bytes());
            if with_cas {
                out.extend_from_slice(b" ");
                out.extend_from_slice(number.format(item.cas).as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            out.append_value(&item);
            out.extend_from_slice(b"\r\n");
        }
    }
    line(out, "END");
    None
}

/// One key of a get (or, with an exptime, a gat): the item, counted and logged as read.
pub fn fetch(
    cx: &mut RequestContext<'_>,
    key: &[u8],
    touch_exptime: Option<i64>,
) -> zipcache::Result<Option<Arc<Item>>> {
    let shared = cx.shared;
    Counters::bump(&shared.core.counters.cmd_get);
    let item = match touch_exptime {
        Some(exptime) => {
            Counters::bump(&shared.core.counters.cmd_touch);
            touch(shared, key, exptime)?.map(|entry| Arc::new(entry.item))
        }
        // A plain get needs no annotation marks: the item alone, shared with the same key
        // named again.
        None => cx
            .reads
            .get_shared(&shared.core.strings, key, GetOptions::default())?,
    };
    events::fetched(
        shared,
        cx.conn,
        key,
        item.as_ref().map(|item| item.value.len()),
    );
    Ok(item)
}

/// Outcome of a storage command, shared with `ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOutcome {
    /// The value now stored is `size` bytes long (appends included).
    Stored {
        size: usize,
    },
    NotStored,
    Exists,
    NotFound,
}

impl StoreOutcome {
    /// As the log stream of mutations names it.
    fn status(self) -> StoreStatus {
        match self {
            StoreOutcome::Stored { .. } => StoreStatus::Stored,
            StoreOutcome::NotStored => StoreStatus::NotStored,
            StoreOutcome::Exists => StoreStatus::Exists,
            StoreOutcome::NotFound => StoreStatus::NotFound,
        }
    }
}

/// A storage command (classic or `ms`) for one key.
pub struct Storing<'a> {
    pub mode: StoreMode,
    pub flags: u32,
    pub expiry: Expiry,
    pub data: &'a [u8],
    /// The CAS the client chose (`ms E`); `None`: a fresh one.
    pub cas: Option<u64>,
    /// A `Cas` older than the item's CAS stores the value as stale instead of failing
    /// (`ms I`).
    pub allow_stale: bool,
    /// The CAS an append or prepend must find (`ms MA C`).
    pub compare: Option<u64>,
}

/// An append's or prepend's current value, read ahead of it ([`Access::Rewrites`]); none
/// for other stores.
pub fn read_before(reads: &mut Prefetch, mode: StoreMode, key: &[u8]) -> Option<Item> {
    match mode {
        StoreMode::Append | StoreMode::Prepend => reads.rewritten_value(key),
        _ => None,
    }
}

/// Runs a storage command atomically; returns the outcome and the CAS clients now see.
/// Counts it in `total_items` and, for a compare-and-swap, in `cas_*`. `before`: an
/// append's or prepend's current value, read ahead of it off the serving thread
/// ([`read_before`]), which a large value then is not read again for.
pub fn store_item(
    shared: &Memcached,
    conn: u64,
    key: &[u8],
    storing: &Storing<'_>,
    before: Option<Item>,
) -> zipcache::Result<(StoreOutcome, Option<u64>)> {
    let mut previous = None;
    let stored = apply_store(shared, key, storing, before, &mut previous);
    if let Ok((outcome, _)) = &stored {
        events::log_fetch(shared, conn, key, previous);
        let size = storing.data.len();
        events::stored(
            shared,
            conn,
            key,
            storing.mode,
            outcome.status(),
            storing.expiry,
            size,
        );
        let counters = &shared.core.counters;
        if let StoreOutcome::Stored { .. } = outcome {
            Counters::bump(&counters.total_items);
        }
        if let StoreMode::Cas(_) = storing.mode {
            match outcome {
                StoreOutcome::Stored { .. } => Counters::bump(&counters.cas_hits),
                StoreOutcome::Exists => Counters::bump(&counters.cas_badval),
                StoreOutcome::NotFound => Counters::bump(&counters.cas_misses),
                StoreOutcome::NotStored => {}
            }
        }
    }
    stored
}

/// `store_item`'s work; `previous` gets the size of the value it found, when the log
/// streams want it.
fn apply_store(
    shared: &Memcached,
    key: &[u8],
    storing: &Storing<'_>,
    before: Option<Item>,
    previous: &mut Option<usize>,
) -> zipcache::Result<(StoreOutcome, Option<u64>)> {
    let &Storing {
        mode,
        flags,
        expiry,
        data,
        cas,
        allow_stale,
        compare,
    } = storing;
    // The common case needs no read: a plain write, under a fresh CAS that no annotation
    // names. A CAS the client chose may repeat an annotated one, so the table must see it.
    if mode == StoreMode::Set && cas.is_none() {
        if events::wants_previous(shared) {
            *previous = events::peek_size(shared, key);
        }
        return match expiry.put_options(flags, None) {
            Some(options) => shared
                .core
                .strings
                .put_with(key, data, options)
                .map(|cas| (StoreOutcome::Stored { size: data.len() }, Some(cas))),
            None => shared
                .core
                .strings
                .delete(key)
                .map(|_| (StoreOutcome::Stored { size: data.len() }, None)),
        };
    }
    // An add asks only whether the key is there: a large object's extent is not read.
    // Under a fresh CAS it is a plain write, which no annotation names.
    if mode == StoreMode::Add && cas.is_none() {
        // may do I/O: one SSD block, for a small object only the SSD tier holds; the
        // extent of a large value added
        return shared.core.strings.update_meta(key, |current| {
            *previous = current.map(|info| info.value_len);
            match current {
                Some(_) => (Update::Keep, StoreOutcome::NotStored),
                None => (
                    expiry.store(data.to_vec(), flags, None),
                    StoreOutcome::Stored { size: data.len() },
                ),
            }
        });
    }
    shared
        .annotations
        .update_read_before(&shared.core.strings, key, before, |current| {
            *previous = current.map(|entry| entry.item.value.len());
            match (mode, current) {
                (StoreMode::Set, _) | (StoreMode::Add, None) => (
                    expiry.store(data.to_vec(), flags, cas).into(),
                    StoreOutcome::Stored { size: data.len() },
                ),
                (StoreMode::Add, Some(_)) => (Update::Keep.into(), StoreOutcome::NotStored),
                (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
                    (Update::Keep.into(), StoreOutcome::NotStored)
                }
                (StoreMode::Cas(_), None) => (Update::Keep.into(), StoreOutcome::NotFound),
                // An older CAS under `I`: the value is stored, but stays stale and keeps the
                // item's expiry and win token, as memcached does.
                (StoreMode::Cas(unique), Some(entry)) if allow_stale && unique < entry.item.cas => {
                    (
                        Write::marked(
                            Expiry::from_item(&entry.item).store(data.to_vec(), flags, cas),
                            Marks {
                                stale: true,
                                token_sent: entry.marks.token_sent,
                            },
                        ),
                        StoreOutcome::Stored { size: data.len() },
                    )
                }
                (StoreMode::Cas(unique), Some(entry)) if entry.item.cas != unique => {
                    (Update::Keep.into(), StoreOutcome::Exists)
                }
                (StoreMode::Append | StoreMode::Prepend, Some(entry))
                    if compare.is_some_and(|unique| unique != entry.item.cas) =>
                {
                    (Update::Keep.into(), StoreOutcome::Exists)
                }
                (StoreMode::Replace | StoreMode::Cas(_), Some(_)) => (
                    expiry.store(data.to_vec(), flags, cas).into(),
                    StoreOutcome::Stored { size: data.len() },
                ),
                // Appends keep the item's own flags and expiry, as memcached does.
                (StoreMode::Append, Some(entry)) => (
                    Expiry::from_item(&entry.item)
                        .store(
                            [&entry.item.value[..], data].concat(),
                            entry.item.flags,
                            cas,
                        )
                        .into(),
                    StoreOutcome::Stored {
                        size: entry.item.value.len() + data.len(),
                    },
                ),
                (StoreMode::Prepend, Some(entry)) => (
                    Expiry::from_item(&entry.item)
                        .store(
                            [data, &entry.item.value[..]].concat(),
                            entry.item.flags,
                            cas,
                        )
                        .into(),
                    StoreOutcome::Stored {
                        size: entry.item.value.len() + data.len(),
                    },
                ),
            }
        })
}

/// The reply line of a text-protocol store.
fn store(
    shared: &Memcached,
    conn: u64,
    key: &[u8],
    storing: &Storing<'_>,
    before: Option<Item>,
) -> String {
    match store_item(shared, conn, key, storing, before) {
        Ok((StoreOutcome::Stored { .. }, _)) => "STORED".into(),
        Ok((StoreOutcome::NotStored, _)) => "NOT_STORED".into(),
        Ok((StoreOutcome::Exists, _)) => "EXISTS".into(),
        Ok((StoreOutcome::NotFound, _)) => "NOT_FOUND".into(),
        Err(e) => engine_error(&e),
    }
}

/// What incr/decr found.
pub enum Counted {
    Missing,
    NonNumeric,
    /// The item's CAS was not the one the command named.
    Mismatch,
    /// The counter's new value (or the initial value of one created).
    Value(u64),
}

/// What an incr/decr does beyond changing the number.
#[derive(Clone, Copy, Default)]
pub struct Counting {
    /// A missing counter is created with this value and expiry (the binary protocol's
    /// initial value), counted neither as a hit nor a miss, as memcached does.
    pub create: Option<(u64, Expiry)>,
    /// The CAS the item must have.
    pub compare: Option<u64>,
}

/// incr wraps at 2^64, decr stops at 0 (memcached semantics). `pad` keeps the stored
/// length when the number gets shorter, as memcached's in-place update does.
pub fn apply_delta(current: &[u8], delta: u64, incr: bool, pad: bool) -> Option<(u64, Vec<u8>)> {
    let old = parse_counter(current)?;
    let new = if incr {
        old.wrapping_add(delta)
    } else {
        old.saturating_sub(delta)
    };
    let mut text = new.to_string().into_bytes();
    if pad && text.len() < current.len() {
        text.resize(current.len(), b' ');
    }
    Some((new, text))
}

fn arith(shared: &Memcached, key: &[u8], delta: u64, incr: bool) -> String {
    match count(shared, key, delta, incr, Counting::default()) {
        Ok((Counted::Missing, _)) => "NOT_FOUND".into(),
        Ok((Counted::NonNumeric, _)) => NON_NUMERIC.into(),
        Ok((Counted::Mismatch, _)) => "EXISTS".into(),
        Ok((Counted::Value(n), _)) => n.to_string(),
        Err(e) => engine_error(&e),
    }
}

/// incr (or decr) of `key` by `delta`, as `counting` says, counted in `incr_*`/`decr_*`;
/// returns what it found and the new CAS.
pub fn count(
    shared: &Memcached,
    key: &[u8],
    delta: u64,
    incr: bool,
    counting: Counting,
) -> zipcache::Result<(Counted, Option<u64>)> {
    let mut existed = false;
    let result = shared
        .annotations
        .update(&shared.core.strings, key, |current| match current {
            None => match counting.create {
                None => (Update::Keep.into(), Counted::Missing),
                Some((initial, expiry)) => (
                    expiry
                        .store(initial.to_string().into_bytes(), 0, None)
                        .into(),
                    Counted::Value(initial),
                ),
            },
            Some(Entry { item, .. }) if counting.compare.is_some_and(|c| c != item.cas) => {
                existed = true;
                (Update::Keep.into(), Counted::Mismatch)
            }
            Some(Entry { item, .. }) => {
                existed = true;
                match apply_delta(&item.value, delta, incr, true) {
                    None => (Update::Keep.into(), Counted::NonNumeric),
                    Some((n, text)) => (
                        Expiry::from_item(item).store(text, item.flags, None).into(),
                        Counted::Value(n),
                    ),
                }
            }
        });
    match &result {
        Ok((Counted::Missing, _)) => count_arith(shared, incr, false),
        Ok((Counted::Value(_), _)) if existed => count_arith(shared, incr, true),
        _ => {}
    }
    result
}

/// Counts an incr/decr (classic or `ma`) in `incr_*` / `decr_*`: a hit found a number
/// to change, a miss no key.
pub fn count_arith(shared: &Memcached, incr: bool, hit: bool) {
    let counters = &shared.core.counters;
    if incr {
        Counters::hit_or_miss_of(&counters.incr_hits, &counters.incr_misses, hit);
    } else {
        Counters::hit_or_miss_of(&counters.decr_hits, &counters.decr_misses, hit);
    }
}

/// Why a `flush_all` did not happen.
pub enum FlushRefused {
    /// `--disable-flush-all`.
    Disabled,
    Engine(zipcache::Error),
}

/// `flush_all [delay]`: the delay is an exptime (seconds, or a Unix time past 30 days);
/// when it comes, everything stored by then is gone. As in memcached, one flush waits at
/// a time: a later `flush_all` replaces it, with a delay or without.
pub fn flush_all(shared: &Memcached, delay: i64) -> Result<(), FlushRefused> {
    if !shared.core.flush_all_enabled {
        return Err(FlushRefused::Disabled);
    }
    let mut pending = shared
        .pending_flush
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(replaced) = pending.take() {
        replaced.timer.abort();
    }
    let now = shared.core.strings.engine().now_ms();
    let Expiry::At(at) = Expiry::from_exptime(delay, now) else {
        return shared
            .core
            .strings
            .engine()
            .flush_all()
            .map_err(FlushRefused::Engine);
    };
    // Until it runs, a crash restarts the flash tier cold: the promise dies with us.
    shared.core.strings.engine().promise_flush();
    let (cache, fired) = (
        shared.core.strings.engine().clone(),
        Arc::new(AtomicBool::new(false)),
    );
    let fires = fired.clone();
    let flush = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(at - now)).await;
        let _ = cache.flush_all();
        fires.store(true, Ordering::Release);
    });
    *pending = Some(PendingFlush {
        timer: flush.abort_handle(),
        fired,
    });
    Ok(())
}

fn stat(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    out.extend_from_slice(format!("STAT {name} {value}\r\n").as_bytes());
}

fn yes_no(on: bool) -> &'static str {
    if on { "yes" } else { "no" }
}

pub fn stats(shared: &Memcached, section: Option<&[u8]>, out: &mut Vec<u8>) {
    let engine = shared.core.strings.engine().stats();
    let counters = &shared.core.counters;
    match section {
        None => {
            stat(out, "pid", std::process::id());
            stat(out, "uptime", shared.core.started.elapsed().as_secs());
            stat(out, "time", shared.core.strings.engine().now_ms() / 1000);
            stat(out, "version", env!("CARGO_PKG_VERSION"));
            stat(out, "pointer_size", usize::BITS);
            stat(out, "max_connections", shared.core.info.max_connections);
            stat(out, "threads", shared.core.info.threads);
            stat(
                out,
                "accepting_conns",
                u8::from(shared.transport.accepting.load(Relaxed)),
            );
            stat(out, "curr_items", engine.objects_resident);
            // memcached's bytes of items: DRAM charged to objects, the indexes left out.
            stat(
                out,
                "bytes",
                engine.dram_used.saturating_sub(engine.dram_index_bytes),
            );
            stat(out, "limit_maxbytes", engine.dram_capacity);
            for (name, value) in counters.snapshot() {
                stat(out, name, value);
            }
            stat(
                out,
                "conn_buffer_bytes",
                shared.transport.buffers.buffered(),
            );
            for (name, value) in counters.since_reset(&engine) {
                stat(out, name, value);
            }
            for (name, value) in shared
                .crawler
                .general_stats()
                .into_iter()
                .chain(shared.logger.stats())
            {
                stat(out, name, value);
            }
            for (name, value) in engine_metrics(&engine) {
                stat(out, &name, value);
            }
        }
        Some(b"settings") => {
            stat(out, "maxconns", shared.core.info.max_connections);
            stat(out, "maxbytes", engine.dram_capacity);
            stat(out, "tcpport", shared.core.info.memcached_port);
            stat(out, "interface", shared.core.info.listen);
            let evictions = shared.core.strings.engine().config().evictions;
            stat(out, "evictions", if evictions { "on" } else { "off" });
            let info = &shared.core.info;
            let domain_socket = info.unix_socket.as_ref();
            let domain_socket =
                domain_socket.map_or("NULL".into(), |path| path.display().to_string());
            stat(out, "domain_socket", domain_socket);
            stat(out, "umask", format!("{:o}", info.unix_socket_mode));
            stat(
                out,
                "shutdown_command",
                yes_no(shared.core.shutdown_enabled),
            );
            stat(out, "num_threads", shared.core.info.threads);
            stat(out, "cas_enabled", "yes");
            stat(out, "tcp_backlog", crate::transport::LISTEN_BACKLOG);
            stat(
                out,
                "auth_enabled_sasl",
                yes_no(shared.core.access.required()),
            );
            stat(
                out,
                "auth_enabled_ascii",
                yes_no(shared.core.access.required()),
            );
            stat(out, "item_size_max", shared.core.max_value);
            stat(out, "key_max", super::parse::KEY_MAX);
            for (name, value) in shared.crawler.settings_stats() {
                stat(out, name, value);
            }
            stat(out, "maxconns_fast", "yes");
            stat(out, "flush_enabled", yes_no(shared.core.flush_all_enabled));
            stat(
                out,
                "idle_timeout",
                shared.transport.idle_timeout.map_or(0, |t| t.as_secs()),
            );
            stat(
                out,
                "first_request_timeout",
                shared
                    .transport
                    .first_request_timeout
                    .map_or(0, |t| t.as_secs()),
            );
            stat(out, "max_request_size", shared.transport.max_request_size);
            stat(out, "max_clients_memory", shared.transport.buffers.limit());
        }
        Some(b"items") => {
            // One "slab class": the engine has size classes, not memcached slabs.
            let [(_, evicted), ..] = counters.since_reset(&engine);
            stat(out, "items:1:number", engine.objects_resident);
            stat(out, "items:1:number_dram", engine.dram_objects);
            stat(out, "items:1:number_ssd", engine.ssd_objects);
            stat(out, "items:1:evicted", evicted);
            stat(out, "items:1:expired_unfetched", engine.expired);
            for (name, value) in shared.crawler.items_stats() {
                stat(out, name, value);
            }
        }
        Some(b"slabs") => {
            // Class 1 holds every item (`crawler.rs`).
            stat(out, "1:used_chunks", engine.objects_resident);
            stat(out, "active_slabs", 1);
            stat(out, "total_malloced", engine.dram_used);
        }
        Some(b"conns") => {
            let info = &shared.core.info;
            let listen = SocketAddr::new(info.listen, info.memcached_port);
            for (name, value) in shared.conns.stats(listen, info.unix_socket.as_deref()) {
                stat(out, &name, value);
            }
        }
        Some(b"reset") => {
            shared.prefix_stats.clear();
            counters.reset(&engine);
            line(out, "RESET");
            return;
        }
        Some(_) => {
            line(out, "ERROR");
            return;
        }
    }
    line(out, "END");
}

/// `stats detail on|off|dump` (per-prefix counters, `prefix_stats`).
pub fn stats_detail(shared: &Memcached, action: Option<&[u8]>, out: &mut Vec<u8>) {
    match action {
        Some(b"on") => {
            shared.prefix_stats.set_enabled(true);
            line(out, "OK");
        }
        Some(b"off") => {
            shared.prefix_stats.set_enabled(false);
            line(out, "OK");
        }
        Some(b"dump") => shared.prefix_stats.dump(out),
        _ => line(out, "CLIENT_ERROR usage: stats detail on|off|dump"),
    }
}

/// `config get cluster` in a cluster mode: ElastiCache's auto-discovery reply — a
/// configuration version, then `host|ip|port` of every node on one line — so that
/// auto-discovery clients find the fleet. In emulated mode the fleet is this node, at the
/// address the client reached (or the announced IP) and its memcached port; the
/// topology never changes, so its version is 1. With `on`, the topology's version and
/// its masters, each at its RESP port shifted as this node's memcached port is from its
/// RESP port (a fleet runs its ports alike); until a topology is pushed, this node
/// alone at version 0. Without a cluster mode, memcached's `ERROR` for a command it
/// does not know.
fn config_get_cluster(shared: &Memcached, local: Option<SocketAddr>, out: &mut Vec<u8>) {
    let cluster = &shared.core.cluster;
    if !cluster.enabled() {
        return line(out, "ERROR");
    }
    let info = &shared.core.info;
    let reached = local.unwrap_or(SocketAddr::new(info.listen, info.memcached_port));
    let ip = cluster
        .address(Some(reached), info.listen, info.memcached_port)
        .ip();
    let this_node = || format!("{ip}|{ip}|{}", reached.port());
    let (version, nodes) = match cluster.mode {
        ClusterMode::On => {
            let state = cluster.state();
            match &state.topology {
                Some(topology) => {
                    let shift = i32::from(info.memcached_port) - i32::from(info.resp_port);
                    let nodes: Vec<String> = (topology.nodes.iter())
                        .filter(|n| n.role == Role::Master)
                        .map(|n| {
                            let port = i32::from(n.port) + shift;
                            format!("{}|{}|{port}", n.host, n.host)
                        })
                        .collect();
                    (topology.version, nodes.join(" "))
                }
                None => (0, this_node()),
            }
        }
        _ => (1, this_node()),
    };
    let body = format!("{version}\n{nodes}\n");
    line(out, &format!("CONFIG cluster 0 {}", body.len()));
    out.extend_from_slice(body.as_bytes());
    line(out, "");
    line(out, "END");
}

#[cfg(test)]
mod tests {
    use crate::core::ServerOptions;
    use crate::core::cluster::ClusterMode;
    use crate::serving_tests::{dram_engine, memcache_session, serve_in_process};

    /// In a cluster mode, `config get cluster` answers as ElastiCache's auto-discovery:
    /// a version line and this node's `host|ip|port`, the length counting both lines;
    /// without one, memcached's `ERROR`.
    #[test]
    fn config_get_cluster_names_this_node_in_a_cluster_mode() {
        let ask = |mode| {
            let options = ServerOptions {
                cluster_mode: mode,
                ..ServerOptions::default()
            };
            let session = memcache_session(dram_engine(), &options);
            let (out, _) = serve_in_process(session, b"config get cluster\r\n");
            String::from_utf8(out).unwrap()
        };
        let body = "1\n127.0.0.1|127.0.0.1|0\n";
        assert_eq!(
            ask(ClusterMode::Emulated),
            format!("CONFIG cluster 0 {}\r\n{body}\r\nEND\r\n", body.len())
        );
        assert_eq!(ask(ClusterMode::Off), "ERROR\r\n");
    }
}
