//! String commands: GET SET SETNX SETEX PSETEX GETSET GETDEL GETEX APPEND STRLEN MGET
//! MSET MSETNX INCR DECR INCRBY DECRBY INCRBYFLOAT GETRANGE SETRANGE. Read-modify-write
//! commands go through `ZipCache::update`, so they are atomic per key.

use std::borrow::Cow;
use std::sync::Arc;

use zipcache::{GetOptions, Item, Update};

use super::{
    Args, Command, ErrorReply, Flow, NOT_INTEGER, NewExpiry, READS_ALL, READS_ONE, Result, SYNTAX,
    Spec, WRITES_ONE, WRITES_PAIRS, expiry_ms, integer, invalid_expire, keyed, rewrite, store,
};
use crate::core::hashes::WRONGTYPE;
use crate::core::stats::Counters;
use crate::resp::Resp;
use crate::resp::{Reply, parse};
use crate::transport::connection::Step;
use crate::transport::prefetch::{Access, Prefetch};

pub(super) const NOT_FLOAT: &str = "ERR value is not a valid float";
const TOO_LONG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";

pub const COMMANDS: &[Spec] = &[
    keyed("get", 2, READS_ONE, |a| {
        Ok(StringCommand::Get { key: a.next()? }.into())
    }),
    keyed("set", -3, WRITES_ONE, |a| {
        let (key, value) = (a.next()?, a.next()?);
        let options = string_options(a, "set")?;
        Ok(StringCommand::Set {
            key,
            value,
            options,
        }
        .into())
    }),
    keyed("setnx", 3, WRITES_ONE, |a| {
        let (key, value) = (a.next()?, a.next()?);
        Ok(StringCommand::SetNx { key, value }.into())
    }),
    keyed("setex", 4, WRITES_ONE, |a| set_expiring(a, 1000, "setex")),
    keyed("psetex", 4, WRITES_ONE, |a| set_expiring(a, 1, "psetex")),
    keyed("getset", 3, WRITES_ONE, |a| {
        let (key, value) = (a.next()?, a.next()?);
        Ok(StringCommand::GetSet {
            key,
            value: Some(value),
        }
        .into())
    }),
    keyed("getdel", 2, WRITES_ONE, |a| {
        let key = a.next()?;
        Ok(StringCommand::GetSet { key, value: None }.into())
    }),
    keyed("getex", -2, WRITES_ONE, |a| {
        let key = a.next()?;
        let expiry = string_options(a, "getex")?.expiry;
        Ok(StringCommand::GetEx { key, expiry }.into())
    }),
    keyed("append", 3, WRITES_ONE, |a| {
        let (key, suffix) = (a.next()?, a.next()?);
        Ok(StringCommand::Append { key, suffix }.into())
    }),
    keyed("strlen", 2, READS_ONE, |a| {
        Ok(StringCommand::Strlen { key: a.next()? }.into())
    }),
    keyed("mget", -2, READS_ALL, |a| {
        Ok(StringCommand::MGet { keys: a.rest() }.into())
    }),
    keyed("mset", -3, WRITES_PAIRS, |a| mset(a, false)),
    keyed("msetnx", -3, WRITES_PAIRS, |a| mset(a, true)),
    keyed("incr", 2, WRITES_ONE, |a| incr_by(a.next()?, 1)),
    keyed("decr", 2, WRITES_ONE, |a| incr_by(a.next()?, -1)),
    keyed("incrby", 3, WRITES_ONE, |a| {
        let key = a.next()?;
        incr_by(key, a.integer()?)
    }),
    keyed("decrby", 3, WRITES_ONE, |a| {
        let key = a.next()?;
        let delta = a.integer()?;
        incr_by(
            key,
            delta.checked_neg().ok_or("ERR decrement would overflow")?,
        )
    }),
    keyed("incrbyfloat", 3, WRITES_ONE, |a| {
        let key = a.next()?;
        let delta = float(a.next()?).ok_or(NOT_FLOAT)?;
        Ok(StringCommand::IncrByFloat { key, delta }.into())
    }),
    keyed("getrange", 4, READS_ONE, |a| {
        let key = a.next()?;
        let (start, end) = (a.integer()?, a.integer()?);
        Ok(StringCommand::GetRange { key, start, end }.into())
    }),
    keyed("setrange", 4, WRITES_ONE, |a| {
        let key = a.next()?;
        let offset = usize::try_from(a.integer()?).map_err(|_| "ERR offset is out of range")?;
        let value = a.next()?;
        Ok(StringCommand::SetRange { key, offset, value }.into())
    }),
];

pub enum StringCommand<'a> {
    Get {
        key: &'a [u8],
    },
    Set {
        key: &'a [u8],
        value: &'a [u8],
        options: StringOptions,
    },
    SetNx {
        key: &'a [u8],
        value: &'a [u8],
    },
    /// SETEX / PSETEX, the expiry resolved.
    SetExpiring {
        key: &'a [u8],
        value: &'a [u8],
        at: u64,
    },
    /// GETSET with a value, GETDEL without: reply with the old value.
    GetSet {
        key: &'a [u8],
        value: Option<&'a [u8]>,
    },
    GetEx {
        key: &'a [u8],
        expiry: NewExpiry,
    },
    Append {
        key: &'a [u8],
        suffix: &'a [u8],
    },
    Strlen {
        key: &'a [u8],
    },
    MGet {
        keys: &'a [&'a [u8]],
    },
    /// MSET, or MSETNX (`only_new`); `pairs` alternates keys and values.
    MSet {
        pairs: &'a [&'a [u8]],
        only_new: bool,
    },
    IncrBy {
        key: &'a [u8],
        delta: i64,
    },
    IncrByFloat {
        key: &'a [u8],
        delta: f64,
    },
    GetRange {
        key: &'a [u8],
        start: i64,
        end: i64,
    },
    SetRange {
        key: &'a [u8],
        offset: usize,
        value: &'a [u8],
    },
}

impl<'a> From<StringCommand<'a>> for Command<'a> {
    fn from(command: StringCommand<'a>) -> Self {
        Command::Strings(command)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    Always,
    IfMissing,
    IfPresent,
}

/// The options of SET (NX XX GET KEEPTTL EX PX EXAT PXAT) and GETEX (EX PX EXAT PXAT
/// PERSIST), with Redis's rules for which may be combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringOptions {
    condition: Condition,
    get: bool,
    expiry: NewExpiry,
}

/// Parses the options of `command` (`set` or `getex`): first every option's syntax, then
/// the expiry's number, as Redis does (`SET k v EX x FOO` is a syntax error).
fn string_options(args: &mut Args, command: &'static str) -> Result<StringOptions> {
    let set = command == "set";
    let mut options = StringOptions {
        condition: Condition::Always,
        get: false,
        expiry: if set {
            NewExpiry::Never
        } else {
            NewExpiry::Keep
        },
    };
    let (mut keep_ttl, mut persist) = (false, false);
    // The expiry option given (EX PX EXAT PXAT; repeating the same one is allowed).
    let mut timed: Option<(Vec<u8>, &[u8])> = None;
    while args.remaining() > 0 {
        let option = args.next()?.to_ascii_uppercase();
        let untimed = timed.is_none() && !keep_ttl && !persist;
        match option.as_slice() {
            b"NX" if set && options.condition != Condition::IfPresent => {
                options.condition = Condition::IfMissing
            }
            b"XX" if set && options.condition != Condition::IfMissing => {
                options.condition = Condition::IfPresent
            }
            b"GET" if set => options.get = true,
            b"KEEPTTL" if set && timed.is_none() => keep_ttl = true,
            b"PERSIST" if !set && timed.is_none() => persist = true,
            b"EX" | b"PX" | b"EXAT" | b"PXAT"
                if args.remaining() > 0
                    && (untimed || timed.as_ref().is_some_and(|(o, _)| *o == option)) =>
            {
                timed = Some((option, args.next()?));
            }
            _ => return Err(SYNTAX.into()),
        }
    }
    if keep_ttl {
        options.expiry = NewExpiry::Keep;
    }
    if persist {
        options.expiry = NewExpiry::Never;
    }
    if let Some((option, amount)) = timed {
        let amount = integer(amount).ok_or(NOT_INTEGER)?;
        let unit = if option.starts_with(b"E") { 1000 } else { 1 };
        let at = positive_expiry(amount, unit, option.ends_with(b"AT"), args.now_ms())
            .ok_or_else(|| invalid_expire(command))?;
        options.expiry = NewExpiry::At(at);
    }
    Ok(options)
}

/// A SET-style expiry (it must be positive) as absolute milliseconds.
fn positive_expiry(amount: i64, unit_ms: i64, absolute: bool, now_ms: i64) -> Option<u64> {
    if amount <= 0 {
        return None;
    }
    let at = expiry_ms(amount, unit_ms, absolute, now_ms)?;
    u64::try_from(at).ok()
}

fn set_expiring<'a>(args: &mut Args<'a>, unit_ms: i64, command: &str) -> Result<Command<'a>> {
    let key = args.next()?;
    let amount = args.integer()?;
    let at = positive_expiry(amount, unit_ms, false, args.now_ms())
        .ok_or_else(|| invalid_expire(command))?;
    let value = args.next()?;
    Ok(StringCommand::SetExpiring { key, value, at }.into())
}

fn mset<'a>(args: &mut Args<'a>, only_new: bool) -> Result<Command<'a>> {
    let pairs = args.rest();
    if !pairs.len().is_multiple_of(2) {
        return Err(args.wrong_number());
    }
    Ok(StringCommand::MSet { pairs, only_new }.into())
}

fn incr_by(key: &[u8], delta: i64) -> Result<Command<'_>> {
    Ok(StringCommand::IncrBy { key, delta }.into())
}

/// A float as Redis's `string2ld` takes it: no spaces, not NaN.
pub(super) fn float(text: &[u8]) -> Option<f64> {
    let value: f64 = std::str::from_utf8(text).ok()?.parse().ok()?;
    (!value.is_nan()).then_some(value)
}

/// INCRBYFLOAT's result as text. Redis adds in `long double` and prints 17 decimals with
/// the trailing zeros cut; in `f64`, rounding to 15 significant digits first gives the
/// same text for ordinary decimals (0.1 + 0.2 is "0.3", not "0.30000000000000004").
pub(super) fn float_text(value: f64) -> String {
    let rounded: f64 = format!("{value:.14e}").parse().unwrap_or(value);
    let shortest = rounded.to_string();
    let decimals = shortest.split_once('.').map_or(0, |(_, d)| d.len());
    let text = if decimals > 17 {
        let fixed = format!("{rounded:.17}");
        fixed
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        shortest
    };
    if text == "-0" { "0".into() } else { text }
}

/// The bulk of `item`'s value, the value by reference (`Output::append_value`); nil
/// for none.
fn item_bulk(out: &mut Reply, item: Option<&Arc<Item>>) {
    let Some(item) = item else {
        return out.nil();
    };
    out.header(b'$', item.value.len());
    out.buf.append_value(item);
    out.buf.extend_from_slice(b"\r\n");
}

/// Keys one step of an MGET offers its admission (`Prefetch::admit`): no more than it can
/// use, so that a step of an MGET of many keys costs what it runs.
const ADMITTED_KEYS: usize = 2048;

/// An MGET at the front of the input whose values are part-way out: they are appended
/// as the socket drains, and the request resumes at its next key.
#[derive(Clone, Copy, Debug)]
pub struct MultiGet {
    keys: usize,
    /// Keys answered so far.
    done: usize,
    /// Where the next key's bulk starts, in a multi-bulk request; `None` in an inline one
    /// (at most `MAX_INLINE` bytes), whose keys are split again at each step.
    next: Option<usize>,
    /// The request's length.
    len: usize,
}

/// A key of an MGET and where its bulk starts (`MultiGet::next`).
type Key<'a> = (Option<usize>, Cow<'a, [u8]>);

impl MultiGet {
    /// The MGET of `keys` keys, `len` bytes at the front of `input`, from its first key.
    pub fn start(input: &[u8], keys: usize, len: usize) -> MultiGet {
        // Past the header and the command name.
        let next = parse::first_arg_at(input)
            .and_then(|at| parse::bulk_at(input, at))
            .map(|(_, next)| next);
        MultiGet {
            keys,
            done: 0,
            next,
            len,
        }
    }

    /// Up to `ADMITTED_KEYS` of the keys not answered yet, and where the key after them
    /// starts.
    fn window<'a>(&self, input: &'a [u8]) -> (Vec<Key<'a>>, Option<usize>) {
        let wanted = (self.keys - self.done).min(ADMITTED_KEYS);
        let Some(mut at) = self.next else {
            let parse::Parsed::Command { args, .. } =
                parse::parse(&input[..self.len], true, usize::MAX)
            else {
                return (Vec::new(), None);
            };
            let keys = args.into_iter().skip(1 + self.done).take(wanted);
            return (keys.map(|key| (None, key)).collect(), None);
        };
        let mut keys = Vec::with_capacity(wanted);
        while keys.len() < wanted {
            let Some((key, next)) = parse::bulk_at(input, at) else {
                break;
            };
            keys.push((Some(at), Cow::Borrowed(key)));
            at = next;
        }
        (keys, Some(at))
    }

    /// Appends the values of the keys it may read now, within the output budget; leaves
    /// in `resume` where it stopped, unless its reply is complete.
    pub fn run(
        mut self,
        shared: &Resp,
        input: &[u8],
        out: &mut Reply,
        reads: &mut Prefetch,
        resume: &mut Option<MultiGet>,
    ) -> Step {
        let (window, after) = self.window(input);
        let admitted = reads.admit(&shared.core.keys, || {
            let keys = window.iter().map(|(_, key)| key.as_ref()).collect();
            Access::Reads(keys, GetOptions::default())
        });
        if admitted == 0 {
            *resume = Some(self);
            return Step::Await(self.len);
        }
        for (n, (at, key)) in window.iter().enumerate() {
            if n == admitted || !out.buf.within_budget() {
                self.next = *at;
                *resume = Some(self);
                return Step::Partial;
            }
            Counters::bump(&shared.core.counters.cmd_get);
            // may do I/O: a synchronous SSD read when nothing was prefetched
            match reads.get_shared(&shared.core.keys, key, GetOptions::default()) {
                Ok(item) => {
                    // As Redis: a key of another type is nil in an MGET.
                    let item = item.filter(|i| !i.collection);
                    shared.core.counters.hit_or_miss(item.is_some());
                    item_bulk(out, item.as_ref());
                }
                // A key no value can be stored under: as Redis, which has no such keys.
                Err(zipcache::Error::EmptyKey | zipcache::Error::KeyTooLarge { .. }) => {
                    shared.core.counters.hit_or_miss(false);
                    out.nil();
                }
                // The array's length is out: a short reply and a closed connection
                // tell the client, where an error in its place would be read as a value.
                Err(_) => return Step::Close,
            }
            self.done += 1;
        }
        if self.done == self.keys || window.is_empty() {
            return Step::Consumed(self.len);
        }
        self.next = after;
        *resume = Some(self);
        Step::Partial
    }
}

impl StringCommand<'_> {
    pub fn execute(self, shared: &Resp, out: &mut Reply, reads: &mut Prefetch) -> Result<Flow> {
        let cache = &shared.core.keys;
        match self {
            StringCommand::Get { key } => {
                Counters::bump(&shared.core.counters.cmd_get);
                let item = reads.get_shared(cache, key, GetOptions::default())?;
                string(item.as_deref())?;
                shared.core.counters.hit_or_miss(item.is_some());
                item_bulk(out, item.as_ref());
            }
            StringCommand::Set {
                key,
                value,
                options,
            } => set(shared, key, value, options, out)?,
            StringCommand::SetNx { key, value } => {
                Counters::bump(&shared.core.counters.cmd_set);
                // may do I/O: one SSD block for a small object; no large extent
                let (stored, _) = cache.update_meta(key, |current| match current {
                    Some(_) => (Update::Keep, false),
                    None => (store(value.to_vec(), None, 0), true),
                })?;
                out.integer(stored as i64);
            }
            StringCommand::SetExpiring { key, value, at } => {
                Counters::bump(&shared.core.counters.cmd_set);
                let options = zipcache::PutOptions {
                    expires_at_ms: Some(at),
                    ..Default::default()
                };
                cache.put_with(key, value, options)?;
                out.simple("OK");
            }
            StringCommand::GetSet { key, value } => {
                let (old, _) = cache.update(key, |current| {
                    let Ok(current) = string(current) else {
                        return (Update::Keep, Err(WRONGTYPE));
                    };
                    let update = match value {
                        Some(value) => store(value.to_vec(), None, 0),
                        None => Update::Delete,
                    };
                    (update, Ok(current.map(|i| i.value.clone())))
                })?;
                out.maybe_bulk(old?.as_deref());
            }
            StringCommand::GetEx { key, expiry } => {
                Counters::bump(&shared.core.counters.cmd_get);
                let value = if expiry == NewExpiry::Keep {
                    let item = cache.get_item(key, GetOptions::default())?;
                    string(item.as_ref())?;
                    item.map(|i| i.value)
                } else {
                    getex(shared, key, expiry)?
                };
                shared.core.counters.hit_or_miss(value.is_some());
                out.maybe_bulk(value.as_deref());
            }
            StringCommand::Append { key, suffix } => {
                // may do I/O: a large value's whole extent (RESP's strings carry no version
                // that a value read ahead could be checked against), or one SSD block
                let (len, _) = cache.update(key, |current| {
                    let Ok(current) = string(current) else {
                        return (Update::Keep, Err(WRONGTYPE));
                    };
                    let value = match current {
                        Some(item) => [&item.value[..], suffix].concat(),
                        None => suffix.to_vec(),
                    };
                    let len = value.len();
                    (rewrite(current, value), Ok(len))
                })?;
                out.integer(len? as i64);
            }
            StringCommand::Strlen { key } => {
                // may do I/O: one SSD block for a small object; no large extent
                out.integer(string_info(cache.info(key)?)?.map_or(0, |i| i.value_len as i64));
            }
            StringCommand::MGet { keys } => {
                // The values follow as the socket drains (`MultiGet`).
                out.array(keys.len());
                return Ok(Flow::MultiGet(keys.len()));
            }
            StringCommand::MSet { pairs, only_new } => {
                // MSETNX checks, then writes: atomic per key, not across its keys.
                if only_new {
                    for pair in pairs.chunks_exact(2) {
                        if cache.info(pair[0])?.is_some() {
                            out.integer(0);
                            return Ok(Flow::Continue);
                        }
                    }
                }
                for pair in pairs.chunks_exact(2) {
                    Counters::bump(&shared.core.counters.cmd_set);
                    cache.put_with(pair[0], pair[1], Default::default())?;
                }
                if only_new {
                    out.integer(1);
                } else {
                    out.simple("OK");
                }
            }
            StringCommand::IncrBy { key, delta } => {
                let n = counter(shared, key, |old| match old.map(integer) {
                    None => Ok(delta),
                    Some(None) => Err(NOT_INTEGER.into()),
                    Some(Some(n)) => n.checked_add(delta).ok_or_else(|| {
                        ErrorReply::from("ERR increment or decrement would overflow")
                    }),
                })?;
                out.integer(n);
            }
            StringCommand::IncrByFloat { key, delta } => {
                let text = counter(shared, key, |old| {
                    let old = match old {
                        None => 0.0,
                        Some(text) => float(text).ok_or(NOT_FLOAT)?,
                    };
                    let sum = old + delta;
                    if !sum.is_finite() {
                        return Err("ERR increment would produce NaN or Infinity".into());
                    }
                    Ok(float_text(sum))
                })?;
                out.bulk(text.as_bytes());
            }
            StringCommand::GetRange { key, start, end } => {
                let item = cache.get_item(key, GetOptions::default())?;
                let value = string(item.as_ref())?.map_or(&[][..], |i| &i.value);
                out.bulk(substring(value, start, end));
            }
            StringCommand::SetRange { key, offset, value } => {
                out.integer(setrange(shared, key, offset, value)? as i64);
            }
        }
        Ok(Flow::Continue)
    }
}

fn set(
    shared: &Resp,
    key: &[u8],
    value: &[u8],
    options: StringOptions,
    out: &mut Reply,
) -> Result<()> {
    Counters::bump(&shared.core.counters.cmd_set);
    if options.condition == Condition::Always && !options.get && options.expiry != NewExpiry::Keep {
        let options = zipcache::PutOptions {
            expires_at_ms: options.expiry.resolve(None),
            ..Default::default()
        };
        shared.core.keys.put_with(key, value, options)?;
        out.simple("OK");
        return Ok(());
    }
    let (outcome, _) = shared.core.keys.update(key, |current| {
        if options.get && string(current).is_err() {
            return (Update::Keep, Err(WRONGTYPE));
        }
        let allowed = match options.condition {
            Condition::Always => true,
            Condition::IfMissing => current.is_none(),
            Condition::IfPresent => current.is_some(),
        };
        let old = current.map(|i| i.value.clone());
        if !allowed {
            return (Update::Keep, Ok((false, old)));
        }
        let at = options.expiry.resolve(current);
        (store(value.to_vec(), at, 0), Ok((true, old)))
    })?;
    let (stored, old) = outcome?;
    match (options.get, stored) {
        (true, _) => out.maybe_bulk(old.as_deref()),
        (false, true) => out.simple("OK"),
        (false, false) => out.nil(),
    }
    Ok(())
}

/// GETEX with an option: the value, re-dated (an expiry already past deletes the key).
fn getex(shared: &Resp, key: &[u8], expiry: NewExpiry) -> Result<Option<Vec<u8>>> {
    let now = shared.core.keys.engine().now_ms();
    let (value, _) = shared.core.keys.update(key, |current| {
        let Some(item) = current else {
            return (Update::Keep, Ok(None));
        };
        if item.collection {
            return (Update::Keep, Err(WRONGTYPE));
        }
        let update = match expiry.resolve(current) {
            Some(at) if at <= now => Update::Delete,
            at if at == item.expires_at_ms => Update::Keep,
            at => super::redate(item.flags, item.access, at),
        };
        (update, Ok(Some(item.value.clone())))
    })?;
    Ok(value?)
}

/// INCRBY / INCRBYFLOAT: `next` turns the old value (if any) into the new one, stored as
/// text with the key's expiry kept.
fn counter<T: ToString>(
    shared: &Resp,
    key: &[u8],
    next: impl FnOnce(Option<&[u8]>) -> Result<T>,
) -> Result<T> {
    let (result, _) = shared.core.keys.update(key, |current| {
        let Ok(current) = string(current) else {
            return (Update::Keep, Err(WRONGTYPE.into()));
        };
        match next(current.map(|i| i.value.as_slice())) {
            Ok(value) => (rewrite(current, value.to_string().into_bytes()), Ok(value)),
            Err(error) => (Update::Keep, Err(error)),
        }
    })?;
    result
}

/// What a string command sees of a key: a hash is the wrong type.
fn string(item: Option<&Item>) -> Result<Option<&Item>> {
    match item {
        Some(item) if item.collection => Err(WRONGTYPE.into()),
        other => Ok(other),
    }
}

fn string_info(info: Option<zipcache::ItemInfo>) -> Result<Option<zipcache::ItemInfo>> {
    match info {
        Some(info) if info.collection => Err(WRONGTYPE.into()),
        other => Ok(other),
    }
}

/// GETRANGE's bytes `start..=end`, negative indexes counting from the end, as Redis.
fn substring(value: &[u8], start: i64, end: i64) -> &[u8] {
    let len = value.len() as i64;
    if (start < 0 && end < 0 && start > end) || len == 0 {
        return &[];
    }
    let from_end = |i: i64| {
        if i < 0 {
            len.saturating_add(i).max(0)
        } else {
            i
        }
    };
    let (start, end) = (from_end(start), from_end(end).min(len - 1));
    if start > end {
        return &[];
    }
    value.get(start as usize..=end as usize).unwrap_or(&[])
}

/// SETRANGE: overwrites from `offset`, zero-padding a shorter value; the new length.
fn setrange(shared: &Resp, key: &[u8], offset: usize, value: &[u8]) -> Result<usize> {
    if value.is_empty() {
        return Ok(string_info(shared.core.keys.info(key)?)?.map_or(0, |i| i.value_len));
    }
    let end = offset
        .checked_add(value.len())
        .filter(|&end| end <= shared.core.max_value)
        .ok_or(TOO_LONG)?;
    let (len, _) = shared.core.keys.update(key, |current| {
        let Ok(current) = string(current) else {
            return (Update::Keep, Err(WRONGTYPE));
        };
        let mut new = current.map_or_else(Vec::new, |i| i.value.clone());
        if new.len() < end {
            new.resize(end, 0);
        }
        new[offset..end].copy_from_slice(value);
        let len = new.len();
        (rewrite(current, new), Ok(len))
    })?;
    Ok(len?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_results_print_like_redis() {
        assert_eq!(float_text(0.1 + 0.2), "0.3");
        assert_eq!(float_text(10.5 + 0.1), "10.6");
        assert_eq!(float_text(1e20), "100000000000000000000");
        assert_eq!(float_text(5.0 - 5.0), "0");
        assert_eq!(float_text(-0.0001), "-0.0001");
        assert_eq!(float_text(1e-20), "0");
        assert_eq!(float(b"1e3"), Some(1000.0));
        assert_eq!(float(b" 1"), None);
        assert_eq!(float(b"nan"), None);
    }

    #[test]
    fn ranges_follow_redis_index_rules() {
        let hello = b"Hello World";
        assert_eq!(substring(hello, 0, 4), b"Hello");
        assert_eq!(substring(hello, -5, -1), b"World");
        assert_eq!(substring(hello, -1, -5), b"");
        assert_eq!(substring(hello, 5, 3), b"");
        assert_eq!(substring(hello, 0, i64::MAX), hello);
        assert_eq!(substring(hello, i64::MIN, 1), b"He");
        assert_eq!(substring(b"", 0, -1), b"");
    }
}
