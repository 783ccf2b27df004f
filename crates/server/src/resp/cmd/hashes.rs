//! Hash commands: HSET HSETNX HMSET HGET HMGET HGETALL HKEYS HVALS HDEL HEXISTS HLEN
//! HSTRLEN HINCRBY HINCRBYFLOAT HSCAN HRANDFIELD, field expiry (HEXPIRE HPEXPIRE
//! HEXPIREAT HPEXPIREAT HTTL HPTTL HEXPIRETIME HPEXPIRETIME HPERSIST) and Redis 8's HGETDEL
//! HGETEX HSETEX, with Redis's replies. The hashes themselves — a header and one element
//! per field, partial hashes never served — are `core/hashes.rs`.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use super::keys::INVALID_CURSOR;
use super::strings::{NOT_FLOAT, float, float_text};
use super::{
    Args, Command, ErrorReply, Flow, NOT_INTEGER, READS_ONE, Result, SYNTAX, Spec, WRITES_ONE,
    integer, keyed,
};
use crate::core::cursors;
use crate::core::hashes::{
    All, Exists, ExpiryCondition, FieldChange, FieldExpiry, HashError, MAX_FIELDS, NO_EXPIRY,
    NO_FIELD, Pairs, Part, Streamed, WRONGTYPE,
};
use crate::core::keyspace::Keyspace;
use crate::core::stats::Counters;
use crate::resp::{Reply, Resp, glob};
use crate::transport::connection::Step;
use crate::transport::output::OUTPUT_BUDGET;

/// The latest field expiry Redis takes: 2^46 − 1 ms after the epoch (`HFE_MAX_ABS_TIME_MSEC`).
const MAX_FIELD_EXPIRY_MS: i64 = (1 << 46) - 1;
const FIELDS_MISSING: &str =
    "ERR Mandatory argument FIELDS is missing or not at the right position";
const NUMFIELDS_MISMATCH: &str = "ERR The `numfields` parameter must match the number of arguments";
const NUMFIELDS_POSITIVE: &str = "ERR Number of fields must be a positive integer";
const SCAN_MAX_COUNT: usize = 100_000;

pub const COMMANDS: &[Spec] = &[
    keyed("hset", -4, WRITES_ONE, |a| set(a, Set::Count)),
    keyed("hmset", -4, WRITES_ONE, |a| set(a, Set::Ok)),
    keyed("hsetnx", 4, WRITES_ONE, |a| set(a, Set::IfNew)),
    keyed("hget", 3, READS_ONE, |a| get(a, Get::One)),
    keyed("hmget", -3, READS_ONE, |a| get(a, Get::Many)),
    keyed("hexists", 3, READS_ONE, |a| get(a, Get::Exists)),
    keyed("hstrlen", 3, READS_ONE, |a| get(a, Get::Length)),
    keyed("hgetall", 2, READS_ONE, |a| all(a, Part::Both)),
    keyed("hkeys", 2, READS_ONE, |a| all(a, Part::Fields)),
    keyed("hvals", 2, READS_ONE, |a| all(a, Part::Values)),
    keyed("hdel", -3, WRITES_ONE, |a| {
        let key = a.next()?;
        Ok(HashCommand::Delete {
            key,
            fields: a.rest(),
        }
        .into())
    }),
    keyed("hlen", 2, READS_ONE, |a| {
        Ok(HashCommand::Len { key: a.next()? }.into())
    }),
    keyed("hincrby", 4, WRITES_ONE, |a| {
        let (key, field) = (a.next()?, a.next()?);
        let by = a.integer()?;
        Ok(HashCommand::IncrBy { key, field, by }.into())
    }),
    keyed("hgetdel", -5, WRITES_ONE, |a| {
        let key = a.next()?;
        let fields = fields(a, NUMFIELDS_POSITIVE, 1)?;
        Ok(HashCommand::GetAndChange {
            key,
            fields,
            change: Some(FieldChange::Delete),
        }
        .into())
    }),
    keyed("hgetex", -5, WRITES_ONE, |a| {
        let key = a.next()?;
        let expiry = expiry_option(a, "hgetex", b"PERSIST")?;
        let fields = fields(a, NUMFIELDS_POSITIVE, 1)?;
        Ok(HashCommand::GetAndChange {
            key,
            fields,
            change: expiry.map(FieldChange::Expire),
        }
        .into())
    }),
    keyed("hsetex", -6, WRITES_ONE, |a| {
        let key = a.next()?;
        let mut condition = Exists::Any;
        let mut expiry = None;
        while let Some(word) = a.peek().filter(|w| !w.eq_ignore_ascii_case(b"FIELDS")) {
            let fnx = word.eq_ignore_ascii_case(b"FNX");
            if (fnx || word.eq_ignore_ascii_case(b"FXX")) && condition == Exists::Any {
                a.next()?;
                condition = if fnx { Exists::None } else { Exists::All };
                continue;
            }
            if expiry.is_none() {
                expiry = expiry_option(a, "hsetex", b"KEEPTTL")?;
                if expiry.is_some() {
                    continue;
                }
            }
            return Err(SYNTAX.into());
        }
        let pairs = fields(a, NUMFIELDS_POSITIVE, 2)?;
        let expiry = expiry.unwrap_or(FieldExpiry::Never);
        Ok(HashCommand::SetExpiring {
            key,
            pairs,
            condition,
            expiry,
        }
        .into())
    }),
    keyed("hexpire", -6, WRITES_ONE, |a| {
        expire(a, 1000, false, "hexpire")
    }),
    keyed("hpexpire", -6, WRITES_ONE, |a| {
        expire(a, 1, false, "hpexpire")
    }),
    keyed("hexpireat", -6, WRITES_ONE, |a| {
        expire(a, 1000, true, "hexpireat")
    }),
    keyed("hpexpireat", -6, WRITES_ONE, |a| {
        expire(a, 1, true, "hpexpireat")
    }),
    keyed("httl", -5, READS_ONE, |a| ttl(a, Ttl::Seconds)),
    keyed("hpttl", -5, READS_ONE, |a| ttl(a, Ttl::Millis)),
    keyed("hexpiretime", -5, READS_ONE, |a| ttl(a, Ttl::UnixSeconds)),
    keyed("hpexpiretime", -5, READS_ONE, |a| ttl(a, Ttl::UnixMillis)),
    keyed("hpersist", -5, WRITES_ONE, |a| {
        let key = a.next()?;
        let fields = fields(a, NUMFIELDS_POSITIVE, 1)?;
        Ok(HashCommand::Persist { key, fields }.into())
    }),
    keyed("hscan", -3, READS_ONE, scan),
    keyed("hrandfield", -2, READS_ONE, random_fields),
    keyed("hincrbyfloat", 4, WRITES_ONE, |a| {
        let (key, field) = (a.next()?, a.next()?);
        let by = float(a.next()?).ok_or(NOT_FLOAT)?;
        if !by.is_finite() {
            return Err("ERR value is NaN or Infinity".into());
        }
        Ok(HashCommand::IncrByFloat { key, field, by }.into())
    }),
];

/// What a write of fields answers.
#[derive(Clone, Copy)]
pub enum Set {
    /// HSET: the number of fields added.
    Count,
    /// HMSET: `+OK`.
    Ok,
    /// HSETNX: 1 if the field was set, 0 if it held a value.
    IfNew,
}

/// What a read of some fields answers.
#[derive(Clone, Copy)]
pub enum Get {
    /// HGET: the value or nil.
    One,
    /// HMGET: an array of values and nils.
    Many,
    /// HEXISTS: 1 or 0.
    Exists,
    /// HSTRLEN: the value's length, 0 for none.
    Length,
}

pub enum HashCommand<'a> {
    Set {
        key: &'a [u8],
        pairs: &'a [&'a [u8]],
        reply: Set,
    },
    Get {
        key: &'a [u8],
        fields: &'a [&'a [u8]],
        reply: Get,
    },
    All {
        key: &'a [u8],
        part: Part,
    },
    Delete {
        key: &'a [u8],
        fields: &'a [&'a [u8]],
    },
    Len {
        key: &'a [u8],
    },
    IncrBy {
        key: &'a [u8],
        field: &'a [u8],
        by: i64,
    },
    IncrByFloat {
        key: &'a [u8],
        field: &'a [u8],
        by: f64,
    },
    /// HGETEX / HGETDEL.
    GetAndChange {
        key: &'a [u8],
        fields: &'a [&'a [u8]],
        change: Option<FieldChange>,
    },
    SetExpiring {
        key: &'a [u8],
        pairs: &'a [&'a [u8]],
        condition: Exists,
        expiry: FieldExpiry,
    },
    /// The HEXPIRE family, its time absolute.
    Expire {
        key: &'a [u8],
        at: u64,
        condition: ExpiryCondition,
        fields: &'a [&'a [u8]],
    },
    Ttl {
        key: &'a [u8],
        unit: Ttl,
        fields: &'a [&'a [u8]],
    },
    Persist {
        key: &'a [u8],
        fields: &'a [&'a [u8]],
    },
    Scan {
        key: &'a [u8],
        /// 0 starts; any other is a cursor handed out (`core/cursors.rs`).
        cursor: u64,
        count: usize,
        pattern: Option<&'a [u8]>,
        values: bool,
    },
    /// HRANDFIELD: one field (`count` `None`), or `count` of them (negative: repeats
    /// allowed).
    Random {
        key: &'a [u8],
        count: Option<i64>,
        values: bool,
    },
}

/// How the HTTL family answers.
#[derive(Clone, Copy)]
pub enum Ttl {
    Seconds,
    Millis,
    UnixSeconds,
    UnixMillis,
}

impl<'a> From<HashCommand<'a>> for Command<'a> {
    fn from(command: HashCommand<'a>) -> Self {
        Command::Hashes(command)
    }
}

impl From<HashError> for ErrorReply {
    fn from(error: HashError) -> Self {
        match error {
            HashError::WrongType => WRONGTYPE.into(),
            HashError::Engine(error) => error.into(),
            HashError::FieldTooLong { max } => {
                format!("ERR hash field too long: this cache holds fields of at most {max} bytes")
                    .into()
            }
            HashError::ValueTooLarge { max } => format!(
                "ERR hash field value too long: this cache holds field values of at most {max} bytes"
            )
            .into(),
            HashError::TooManyFields => {
                format!("ERR hash would hold more than {MAX_FIELDS} fields").into()
            }
            HashError::TooLarge { budget } => format!(
                "ERR hash reply would pass {budget} bytes (the reply budget); use HSCAN or HMGET"
            )
            .into(),
        }
    }
}

fn set<'a>(args: &mut Args<'a>, reply: Set) -> Result<Command<'a>> {
    let key = args.next()?;
    let pairs = args.rest();
    if !pairs.len().is_multiple_of(2) {
        return Err(args.wrong_number());
    }
    Ok(HashCommand::Set { key, pairs, reply }.into())
}

fn get<'a>(args: &mut Args<'a>, reply: Get) -> Result<Command<'a>> {
    let key = args.next()?;
    Ok(HashCommand::Get {
        key,
        fields: args.rest(),
        reply,
    }
    .into())
}

/// `FIELDS numfields` and the fields (`per` arguments each) that end a command.
fn fields<'a>(args: &mut Args<'a>, bad_count: &'static str, per: usize) -> Result<&'a [&'a [u8]]> {
    if !args.next()?.eq_ignore_ascii_case(b"FIELDS") {
        return Err(FIELDS_MISSING.into());
    }
    let count = integer(args.next()?).filter(|&n| n >= 1).ok_or(bad_count)?;
    let rest = args.rest();
    if usize::try_from(count).ok().and_then(|n| n.checked_mul(per)) != Some(rest.len()) {
        return Err(NUMFIELDS_MISMATCH.into());
    }
    Ok(rest)
}

/// An expiry option of HGETEX / HSETEX, if the next argument is one: `EX s`, `PX ms`,
/// `EXAT s`, `PXAT ms`, or `keep` (PERSIST: none; KEEPTTL: each field's own).
fn expiry_option(args: &mut Args<'_>, command: &str, keep: &[u8]) -> Result<Option<FieldExpiry>> {
    let Some(word) = args.peek() else {
        return Ok(None);
    };
    let word = word.to_ascii_uppercase();
    if word == keep {
        args.next()?;
        return Ok(Some(if keep == b"PERSIST" {
            FieldExpiry::Never
        } else {
            FieldExpiry::Keep
        }));
    }
    let (unit_ms, absolute) = match word.as_slice() {
        b"EX" => (1000, false),
        b"PX" => (1, false),
        b"EXAT" => (1000, true),
        b"PXAT" => (1, true),
        _ => return Ok(None),
    };
    args.next()?;
    let amount = args.integer()?;
    let now = args.now_ms();
    let at = at_ms(amount, unit_ms, absolute, now).ok_or_else(|| super::invalid_expire(command))?;
    Ok(Some(FieldExpiry::At(at)))
}

/// `amount` units from now (or from the epoch) in ms, within what Redis takes for a
/// field's expiry; `None` for a negative amount or one past it.
fn at_ms(amount: i64, unit_ms: i64, absolute: bool, now: i64) -> Option<u64> {
    let at = super::expiry_ms(amount, unit_ms, absolute, now).filter(|_| amount >= 0)?;
    u64::try_from(at)
        .ok()
        .filter(|&at| at <= MAX_FIELD_EXPIRY_MS as u64)
}

/// `HEXPIRE key time [NX|XX|GT|LT] FIELDS numfields field…`, checked as Redis 7.4 does.
fn expire<'a>(
    args: &mut Args<'a>,
    unit_ms: i64,
    absolute: bool,
    command: &str,
) -> Result<Command<'a>> {
    let key = args.next()?;
    let amount = args.integer()?;
    if amount < 0 {
        return Err("ERR invalid expire time, must be >= 0".into());
    }
    let at = at_ms(amount, unit_ms, absolute, args.now_ms())
        .ok_or_else(|| super::invalid_expire(command))?;
    let condition = match args.peek().map(<[u8]>::to_ascii_uppercase).as_deref() {
        Some(b"NX") => ExpiryCondition::Nx,
        Some(b"XX") => ExpiryCondition::Xx,
        Some(b"GT") => ExpiryCondition::Gt,
        Some(b"LT") => ExpiryCondition::Lt,
        _ => ExpiryCondition::Always,
    };
    if condition != ExpiryCondition::Always {
        args.next()?;
    }
    let fields = fields(
        args,
        "ERR Parameter `numFields` should be greater than 0",
        1,
    )?;
    Ok(HashCommand::Expire {
        key,
        at,
        condition,
        fields,
    }
    .into())
}

fn ttl<'a>(args: &mut Args<'a>, unit: Ttl) -> Result<Command<'a>> {
    let key = args.next()?;
    let fields = fields(args, NUMFIELDS_POSITIVE, 1)?;
    Ok(HashCommand::Ttl { key, unit, fields }.into())
}

/// `HSCAN key cursor [MATCH pattern] [COUNT count] [NOVALUES]`; the cursor stands for
/// the last field returned, as SCAN's for a key (`core/cursors.rs`).
fn scan<'a>(args: &mut Args<'a>) -> Result<Command<'a>> {
    let key = args.next()?;
    let cursor = cursors::parse(args.next()?).ok_or(INVALID_CURSOR)?;
    let (mut count, mut pattern, mut values) = (10, None, true);
    while args.remaining() > 0 {
        let option = args.next()?.to_ascii_uppercase();
        if option == b"NOVALUES" {
            values = false;
            continue;
        }
        if args.remaining() == 0 {
            return Err(SYNTAX.into());
        }
        let value = args.next()?;
        match option.as_slice() {
            b"COUNT" => match integer(value).ok_or(NOT_INTEGER)? {
                n if n >= 1 => count = (n as usize).min(SCAN_MAX_COUNT),
                _ => return Err(SYNTAX.into()),
            },
            b"MATCH" => pattern = Some(value),
            _ => return Err(SYNTAX.into()),
        }
    }
    Ok(HashCommand::Scan {
        key,
        cursor,
        count,
        pattern,
        values,
    }
    .into())
}

/// `HRANDFIELD key [count [WITHVALUES]]`.
fn random_fields<'a>(args: &mut Args<'a>) -> Result<Command<'a>> {
    let key = args.next()?;
    let count = match args.remaining() {
        0 => None,
        _ => Some(args.integer()?),
    };
    let values = match args.remaining() {
        0 => false,
        _ if args.next()?.eq_ignore_ascii_case(b"WITHVALUES") => true,
        _ => return Err(SYNTAX.into()),
    };
    if count.is_some_and(|n| n.unsigned_abs() > (i64::MAX / 2) as u64) && values {
        return Err("ERR value is out of range".into());
    }
    Ok(HashCommand::Random { key, count, values }.into())
}

/// A random number below `n` (HRANDFIELD): a fresh hasher's hash of a counter.
fn random_below(n: usize) -> usize {
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let draw = DRAWS.fetch_add(1, Ordering::Relaxed);
    (foldhash::fast::RandomState::default().hash_one(draw) % n as u64) as usize
}

fn all<'a>(args: &mut Args<'a>, part: Part) -> Result<Command<'a>> {
    Ok(HashCommand::All {
        key: args.next()?,
        part,
    }
    .into())
}

impl HashCommand<'_> {
    pub fn execute(self, shared: &Resp, out: &mut Reply) -> Result<Flow> {
        let (hashes, keys) = (&shared.core.hashes, &shared.core.keys);
        match self {
            HashCommand::Set { key, pairs, reply } => {
                let added = hashes.set(keys, key, pairs, matches!(reply, Set::IfNew))?;
                match reply {
                    Set::Ok => out.simple("OK"),
                    Set::Count | Set::IfNew => out.integer(added as i64),
                }
            }
            HashCommand::Get { key, fields, reply } => {
                let values = hashes.get(keys, key, fields, reply_budget(keys))?;
                let value = |i: usize| values.as_ref().and_then(|v| v[i].as_deref());
                match reply {
                    Get::One => out.maybe_bulk(value(0)),
                    Get::Many => {
                        out.array(fields.len());
                        for i in 0..fields.len() {
                            out.maybe_bulk(value(i));
                        }
                    }
                    Get::Exists => out.integer(value(0).is_some() as i64),
                    Get::Length => out.integer(value(0).map_or(0, |v| v.len() as i64)),
                }
            }
            HashCommand::All { key, part } => {
                match hashes.read_all(keys, key, part, reply_budget(keys))? {
                    All::Packed(fields) => {
                        all_header(out, part, fields.len() as u64);
                        all_fields(out, part, fields.pairs());
                    }
                    All::Whole(pairs) => {
                        all_header(out, part, pairs.len() as u64);
                        all_fields(out, part, owned_pairs(&pairs));
                    }
                    All::Streamed { count, stream } => {
                        all_header(out, part, count);
                        return Ok(Flow::StreamedHash(stream));
                    }
                }
            }
            HashCommand::Delete { key, fields } => {
                out.integer(hashes.delete_fields(keys, key, fields)? as i64);
            }
            HashCommand::Len { key } => out.integer(hashes.len(keys, key)? as i64),
            HashCommand::IncrBy { key, field, by } => {
                let new = hashes.update_field(keys, key, field, |old| {
                    let old = match old {
                        None => 0,
                        Some(text) => super::integer(text)
                            .ok_or(ErrorReply::from("ERR hash value is not an integer"))?,
                    };
                    let new = old.checked_add(by).ok_or(ErrorReply::from(
                        "ERR increment or decrement would overflow",
                    ))?;
                    Ok::<_, ErrorReply>(new.to_string().into_bytes())
                })??;
                out.integer(super::integer(&new).unwrap_or_default());
            }
            HashCommand::IncrByFloat { key, field, by } => {
                let new = hashes.update_field(keys, key, field, |old| {
                    let old = match old {
                        None => 0.0,
                        Some(text) => {
                            float(text).ok_or(ErrorReply::from("ERR hash value is not a float"))?
                        }
                    };
                    let sum = old + by;
                    if !sum.is_finite() {
                        return Err("ERR increment would produce NaN or Infinity".into());
                    }
                    Ok::<_, ErrorReply>(float_text(sum).into_bytes())
                })??;
                out.bulk(&new);
            }
            HashCommand::GetAndChange {
                key,
                fields,
                change,
            } => {
                let values =
                    hashes.get_and_change(keys, key, fields, change, reply_budget(keys))?;
                out.array(values.len());
                for value in &values {
                    out.maybe_bulk(value.as_deref());
                }
            }
            HashCommand::SetExpiring {
                key,
                pairs,
                condition,
                expiry,
            } => {
                let done = hashes.set_expiring(keys, key, pairs, condition, expiry)?;
                out.integer(done as i64);
            }
            HashCommand::Expire {
                key,
                at,
                condition,
                fields,
            } => {
                let codes = hashes.expire_fields(keys, key, fields, at, condition)?;
                integers(out, &codes);
            }
            HashCommand::Ttl { key, unit, fields } => {
                let now = keys.engine().now_ms();
                let codes: Vec<i64> = hashes
                    .field_expiries(keys, key, fields)?
                    .into_iter()
                    .map(|found| match found {
                        None => NO_FIELD,
                        Some(None) => NO_EXPIRY,
                        Some(Some(at)) => {
                            let at = at as i64;
                            let now = now as i64;
                            // Seconds round up, as Redis's `(expire + 999 - base) / 1000`.
                            match unit {
                                Ttl::Seconds => (at - now + 999) / 1000,
                                Ttl::Millis => at - now,
                                Ttl::UnixSeconds => (at + 999) / 1000,
                                Ttl::UnixMillis => at,
                            }
                        }
                    })
                    .collect();
                integers(out, &codes);
            }
            HashCommand::Persist { key, fields } => {
                integers(out, &hashes.persist_fields(keys, key, fields)?);
            }
            HashCommand::Scan {
                key,
                cursor,
                count,
                pattern,
                values,
            } => {
                let cursors = &shared.core.cursors;
                let after = match cursor {
                    0 => None,
                    cursor => Some(cursors.resume(key, cursor).ok_or(INVALID_CURSOR)?),
                };
                let part = if values { Part::Both } else { Part::Fields };
                let (found, next) =
                    hashes.scan(keys, key, after.as_deref(), count, part, reply_budget(keys))?;
                let found: Vec<_> = found
                    .into_iter()
                    .filter(|(field, _)| pattern.is_none_or(|p| glob::matches(p, field)))
                    .collect();
                let cursor = next.map_or(0, |field| cursors.park(key, field));
                out.array(2);
                out.bulk(cursor.to_string().as_bytes());
                out.array(found.len() * if values { 2 } else { 1 });
                for (field, value) in &found {
                    out.bulk(field);
                    if values {
                        out.bulk(value);
                    }
                }
            }
            HashCommand::Random { key, count, values } => {
                let part = if values { Part::Both } else { Part::Fields };
                let budget = reply_budget(keys);
                let all = hashes.all(keys, key, part, budget)?;
                random_reply(out, &all, count, values, budget);
            }
        }
        Ok(Flow::Continue)
    }
}

/// The length of an HGETALL (a map: RESP2 counts its fields and values), HKEYS or HVALS.
fn all_header(out: &mut Reply, part: Part, fields: u64) {
    let fields = usize::try_from(fields).unwrap_or(usize::MAX);
    match part {
        Part::Both => out.map(fields),
        Part::Fields | Part::Values => out.array(fields),
    }
}

fn all_fields<'a>(out: &mut Reply, part: Part, pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>) {
    for (field, value) in pairs {
        if part != Part::Values {
            out.bulk(field);
        }
        if part != Part::Fields {
            out.bulk(value);
        }
    }
}

fn owned_pairs(pairs: &Pairs) -> impl Iterator<Item = (&[u8], &[u8])> {
    pairs.iter().map(|(f, v)| (f.as_slice(), v.as_slice()))
}

/// Sends the next parts of a whole-hash reply too large to be sent at once
/// (`core/hashes/stream.rs`) within the output budget; leaves in `resume` where it
/// stopped unless the reply is complete. The request is `len` bytes.
pub fn stream_hash(
    shared: &Resp,
    mut stream: Streamed,
    len: usize,
    out: &mut Reply,
    resume: &mut Option<(Streamed, usize)>,
) -> Step {
    let (hashes, keys) = (&shared.core.hashes, &shared.core.keys);
    while !stream.done() {
        if !out.buf.within_budget() {
            *resume = Some((stream, len));
            return Step::Partial;
        }
        let budget = OUTPUT_BUDGET.saturating_sub(out.buf.reply_len());
        match hashes.next_part(keys, &mut stream, budget) {
            Ok(Some(pairs)) => all_fields(out, stream.part(), owned_pairs(&pairs)),
            // The reply's length is out: a short reply and a closed connection tell the
            // client, where an error in its place would be read as a field.
            Ok(None) | Err(_) => {
                Counters::bump(&shared.core.counters.broken_hash_replies);
                return Step::Close;
            }
        }
    }
    Step::Consumed(len)
}

/// What a hash command's reply may hold: the output budget and one more value of the
/// largest the engine keeps, so that any field that can be written can be read back,
/// by HGET and in an HGETALL of a hash otherwise small. Past it (a large hash's HGETALL,
/// a field named over and over) the command is refused rather than held in memory.
fn reply_budget(keys: &Keyspace) -> usize {
    OUTPUT_BUDGET + keys.engine().config().max_value_size
}

fn integers(out: &mut Reply, numbers: &[i64]) {
    out.array(numbers.len());
    for &n in numbers {
        out.integer(n);
    }
}

/// HRANDFIELD's reply from the hash's `fields`: one field or nil (`count` `None`); up to
/// `count` distinct fields; or `-count` fields with repeats — with their values as
/// `[field, value]` pairs in RESP3, flat in RESP2.
fn random_reply(
    out: &mut Reply,
    fields: &[(Vec<u8>, Vec<u8>)],
    count: Option<i64>,
    values: bool,
    budget: usize,
) {
    let Some(count) = count else {
        return match fields.len() {
            0 => out.nil(),
            n => out.bulk(&fields[random_below(n)].0),
        };
    };
    let picked: Vec<&(Vec<u8>, Vec<u8>)> = if fields.is_empty() {
        Vec::new()
    } else if count < 0 {
        // Repeats may be asked for without end: as many as the reply budget holds.
        let mut bytes = 0;
        let mut picked = Vec::new();
        for _ in 0..count.unsigned_abs() {
            let pair = &fields[random_below(fields.len())];
            bytes += pair.0.len() + pair.1.len() + 2 * super::keys::BULK_OVERHEAD;
            if bytes > budget {
                return out.error(&format!(
                    "ERR HRANDFIELD reply would pass {budget} bytes (the reply budget)"
                ));
            }
            picked.push(pair);
        }
        picked
    } else if count as usize >= fields.len() {
        // The whole hash, as Redis gives it.
        fields.iter().collect()
    } else {
        // Distinct fields: a partial shuffle of the indexes.
        let mut order: Vec<usize> = (0..fields.len()).collect();
        let wanted = (count as usize).min(fields.len());
        for i in 0..wanted {
            let j = i + random_below(fields.len() - i);
            order.swap(i, j);
        }
        order[..wanted].iter().map(|&i| &fields[i]).collect()
    };
    if values && out.resp3 {
        out.array(picked.len());
        for (field, value) in picked {
            out.array(2);
            out.bulk(field);
            out.bulk(value);
        }
        return;
    }
    out.array(picked.len() * if values { 2 } else { 1 });
    for (field, value) in picked {
        out.bulk(field);
        if values {
            out.bulk(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field expiries as Redis 7.4 bounds them: not negative, not past 2^46 − 1 ms,
    /// relative ones from now.
    #[test]
    fn field_expiries_stay_within_redis_bounds() {
        let now = 1_764_000_000_000;
        assert_eq!(at_ms(10, 1000, false, now), Some(now as u64 + 10_000));
        assert_eq!(at_ms(7, 1, true, now), Some(7));
        assert_eq!(at_ms(-1, 1, true, now), None);
        assert_eq!(
            at_ms(MAX_FIELD_EXPIRY_MS, 1, true, now),
            Some(MAX_FIELD_EXPIRY_MS as u64)
        );
        assert_eq!(at_ms(MAX_FIELD_EXPIRY_MS + 1, 1, true, now), None);
        assert_eq!(at_ms(MAX_FIELD_EXPIRY_MS, 1, false, now), None);
        assert_eq!(at_ms(i64::MAX, 1000, false, now), None);
    }
}
