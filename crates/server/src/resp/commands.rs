//! RESP command execution. Read-modify-write commands go through `ZipCache::update`,
//! so they are atomic per key like Redis's single-threaded execution.

use std::ops::Bound;

use zipcache::{Item, PutOptions, Update};

use super::{Reply, RespSession, glob};
use crate::server::Shared;
use crate::stats::{Counters, engine_metrics};

pub enum Flow {
    Continue,
    Close,
}

const SYNTAX: &str = "ERR syntax error";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
/// Redis version reported to clients; tools gate features on it.
const REDIS_VERSION: &str = "7.0.0";
/// Default and largest `LIMIT` of `ZCRANGE`.
const RANGE_DEFAULT_LIMIT: usize = 1000;
const RANGE_MAX_LIMIT: usize = 100_000;
const SCAN_MAX_COUNT: usize = 100_000;

/// Redis arity: positive = exactly that many arguments (command included), negative =
/// at least that many.
const COMMANDS: &[(&str, i32)] = &[
    ("get", 2),
    ("set", -3),
    ("setnx", 3),
    ("setex", 4),
    ("psetex", 4),
    ("getset", 3),
    ("getdel", 2),
    ("append", 3),
    ("strlen", 2),
    ("del", -2),
    ("unlink", -2),
    ("exists", -2),
    ("type", 2),
    ("mget", -2),
    ("mset", -3),
    ("incr", 2),
    ("decr", 2),
    ("incrby", 3),
    ("decrby", 3),
    ("expire", -3),
    ("pexpire", -3),
    ("ttl", 2),
    ("pttl", 2),
    ("persist", 2),
    ("scan", -2),
    ("zcrange", -3),
    ("dbsize", 1),
    ("info", -1),
    ("ping", -1),
    ("echo", 2),
    ("flushall", -1),
    ("flushdb", -1),
    ("quit", -1),
    ("select", 2),
    ("command", -1),
    ("config", -2),
    ("client", -2),
    ("hello", -1),
];

/// Redis's strict integer syntax: optional `-`, no `+`, no leading zeros or spaces.
fn integer(arg: &[u8]) -> Option<i64> {
    let digits = arg.strip_prefix(b"-").unwrap_or(arg);
    if digits.is_empty()
        || digits.len() > 19
        || !digits.iter().all(u8::is_ascii_digit)
        || (digits[0] == b'0' && arg.len() > 1)
    {
        return None;
    }
    std::str::from_utf8(arg).ok()?.parse().ok()
}

fn engine_error(out: &mut Reply, error: &zipcache::Error) {
    out.error(&format!("ERR {error}"));
}

pub fn execute(session: &mut RespSession, args: &[&[u8]], out: &mut Reply) -> Flow {
    let name = String::from_utf8_lossy(args[0]).to_ascii_lowercase();
    let Some(&(name, arity)) = COMMANDS.iter().find(|(n, _)| *n == name) else {
        unknown_command(args, out);
        return Flow::Continue;
    };
    let argc = args.len() as i32;
    if (arity > 0 && argc != arity) || (arity < 0 && argc < -arity) {
        out.error(&format!(
            "ERR wrong number of arguments for '{name}' command"
        ));
        return Flow::Continue;
    }
    let shared = &*session.shared;
    let result = match name {
        "get" => get(shared, args[1], out),
        "set" => set(shared, args, out),
        "setnx" => setnx(shared, args[1], args[2], out),
        "setex" | "psetex" => set_expiring(shared, name, args, out),
        "getset" => getset(shared, args[1], Some(args[2]), out),
        "getdel" => getset(shared, args[1], None, out),
        "append" => append(shared, args[1], args[2], out),
        "strlen" => shared.cache.get(args[1]).map(|v| {
            out.integer(v.map_or(0, |v| v.len() as i64));
        }),
        "del" | "unlink" => delete(shared, &args[1..], out),
        "exists" => exists(shared, &args[1..], out),
        "type" => shared.cache.get_item(args[1]).map(|item| {
            out.simple(if item.is_some() { "string" } else { "none" });
        }),
        "mget" => mget(shared, &args[1..], out),
        "mset" => mset(shared, args, out),
        "incr" => incr_by(shared, args[1], Ok(1), out),
        "decr" => incr_by(shared, args[1], Ok(-1), out),
        "incrby" => incr_by(shared, args[1], integer(args[2]).ok_or(NOT_INTEGER), out),
        "decrby" => incr_by(
            shared,
            args[1],
            integer(args[2])
                .and_then(i64::checked_neg)
                .ok_or(NOT_INTEGER),
            out,
        ),
        "expire" | "pexpire" => expire(shared, name, args, out),
        "ttl" | "pttl" => ttl(shared, args[1], name == "pttl", out),
        "persist" => persist(shared, args[1], out),
        "scan" => scan(shared, args, out),
        "zcrange" => range(shared, args, out),
        "dbsize" => {
            out.integer(shared.cache.stats().objects_resident as i64);
            Ok(())
        }
        "info" => {
            out.bulk(info(shared, &args[1..]).as_bytes());
            Ok(())
        }
        "ping" => {
            match args.len() {
                1 => out.simple("PONG"),
                2 => out.bulk(args[1]),
                _ => out.error("ERR wrong number of arguments for 'ping' command"),
            }
            Ok(())
        }
        "echo" => {
            out.bulk(args[1]);
            Ok(())
        }
        "flushall" | "flushdb" => shared.cache.flush_all().map(|()| out.simple("OK")),
        "quit" => {
            out.simple("OK");
            return Flow::Close;
        }
        "select" => {
            match integer(args[1]) {
                Some(0) => out.simple("OK"),
                Some(_) => out.error("ERR DB index is out of range"),
                None => out.error(NOT_INTEGER),
            }
            Ok(())
        }
        "command" => {
            command(args, out);
            Ok(())
        }
        "config" => {
            config(shared, args, out);
            Ok(())
        }
        "client" => {
            client(session, args, out);
            Ok(())
        }
        "hello" => {
            hello(session, args, out);
            Ok(())
        }
        _ => {
            unknown_command(args, out);
            Ok(())
        }
    };
    if let Err(e) = result {
        engine_error(out, &e);
    }
    Flow::Continue
}

fn unknown_command(args: &[&[u8]], out: &mut Reply) {
    let mut listed = String::new();
    for arg in &args[1..] {
        let room = 128usize.saturating_sub(listed.len());
        let arg = String::from_utf8_lossy(arg);
        listed.push_str(&format!(
            "'{}' ",
            arg.chars().take(room).collect::<String>()
        ));
    }
    let name = String::from_utf8_lossy(args[0]);
    let name: String = name.chars().take(128).collect();
    out.error(&format!(
        "ERR unknown command '{name}', with args beginning with: {listed}"
    ));
}

fn unknown_subcommand(args: &[&[u8]], out: &mut Reply) {
    out.error(&format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        String::from_utf8_lossy(args[1]),
        String::from_utf8_lossy(args[0]).to_ascii_uppercase()
    ));
}

fn put_options(expires_at_ms: Option<u64>) -> PutOptions {
    PutOptions {
        expires_at_ms,
        ..PutOptions::default()
    }
}

/// `value` as a new version of `item`, keeping its expiry and flags (INCR, APPEND).
fn rewrite(item: Option<&Item>, value: Vec<u8>) -> Update {
    store(
        value,
        item.and_then(|i| i.expires_at_ms),
        item.map_or(0, |i| i.flags),
    )
}

/// `item` as it is, expiring at `at` instead (EXPIRE, PERSIST).
fn redate(item: &Item, at: Option<u64>) -> Update {
    store(item.value.clone(), at, item.flags)
}

fn store(value: Vec<u8>, expires_at_ms: Option<u64>, flags: u32) -> Update {
    Update::Put {
        value,
        options: PutOptions {
            expires_at_ms,
            flags,
            assign_cas: false,
        },
    }
}

fn get(shared: &Shared, key: &[u8], out: &mut Reply) -> zipcache::Result<()> {
    Counters::bump(&shared.counters.cmd_get);
    let value = shared.cache.get(key)?;
    shared.counters.hit_or_miss(value.is_some());
    out.maybe_bulk(value.as_deref());
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SetCondition {
    Always,
    IfMissing,
    IfPresent,
}

/// When a SET's value expires.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SetExpiry {
    Never,
    At(u64),
    Keep,
}

struct SetOptions {
    condition: SetCondition,
    expiry: SetExpiry,
    get: bool,
}

/// A relative or absolute expiry argument in `unit_ms` units as an absolute time.
fn expiry_at(
    arg: &[u8],
    unit_ms: u64,
    absolute: bool,
    now_ms: u64,
    command: &str,
) -> Result<u64, String> {
    let n = integer(arg).ok_or(NOT_INTEGER)?;
    let invalid = || format!("ERR invalid expire time in '{command}' command");
    if n <= 0 {
        return Err(invalid());
    }
    let ms = (n as u64).checked_mul(unit_ms).ok_or_else(invalid)?;
    if absolute {
        Ok(ms)
    } else {
        now_ms.checked_add(ms).ok_or_else(invalid)
    }
}

fn set_options(shared: &Shared, args: &[&[u8]]) -> Result<SetOptions, String> {
    let mut options = SetOptions {
        condition: SetCondition::Always,
        expiry: SetExpiry::Never,
        get: false,
    };
    let mut i = 0;
    while i < args.len() {
        let option = args[i].to_ascii_uppercase();
        let has_expiry = options.expiry != SetExpiry::Never;
        match option.as_slice() {
            b"NX" if options.condition == SetCondition::Always => {
                options.condition = SetCondition::IfMissing
            }
            b"XX" if options.condition == SetCondition::Always => {
                options.condition = SetCondition::IfPresent
            }
            b"GET" => options.get = true,
            b"KEEPTTL" if !has_expiry => options.expiry = SetExpiry::Keep,
            b"EX" | b"PX" | b"EXAT" | b"PXAT" if !has_expiry && i + 1 < args.len() => {
                let unit = if option.starts_with(b"E") { 1000 } else { 1 };
                let absolute = option.ends_with(b"AT");
                i += 1;
                let at = expiry_at(args[i], unit, absolute, shared.cache.now_ms(), "set")?;
                options.expiry = SetExpiry::At(at);
            }
            _ => return Err(SYNTAX.into()),
        }
        i += 1;
    }
    Ok(options)
}

fn set(shared: &Shared, args: &[&[u8]], out: &mut Reply) -> zipcache::Result<()> {
    Counters::bump(&shared.counters.cmd_set);
    let options = match set_options(shared, &args[3..]) {
        Ok(options) => options,
        Err(message) => {
            out.error(&message);
            return Ok(());
        }
    };
    let (key, value) = (args[1], args[2]);
    if options.condition == SetCondition::Always
        && !options.get
        && options.expiry != SetExpiry::Keep
    {
        let at = match options.expiry {
            SetExpiry::At(t) => Some(t),
            SetExpiry::Never | SetExpiry::Keep => None,
        };
        shared.cache.put_with(key, value, put_options(at))?;
        out.simple("OK");
        return Ok(());
    }
    let ((stored, old), _) = shared.cache.update(key, |current| {
        let allowed = match options.condition {
            SetCondition::Always => true,
            SetCondition::IfMissing => current.is_none(),
            SetCondition::IfPresent => current.is_some(),
        };
        let old = current.map(|i| i.value.clone());
        if !allowed {
            return (Update::Keep, (false, old));
        }
        let at = match options.expiry {
            SetExpiry::Never => None,
            SetExpiry::At(t) => Some(t),
            SetExpiry::Keep => current.and_then(|i| i.expires_at_ms),
        };
        (store(value.to_vec(), at, 0), (true, old))
    })?;
    match (options.get, stored) {
        (true, _) => out.maybe_bulk(old.as_deref()),
        (false, true) => out.simple("OK"),
        (false, false) => out.nil(),
    }
    Ok(())
}

fn setnx(shared: &Shared, key: &[u8], value: &[u8], out: &mut Reply) -> zipcache::Result<()> {
    Counters::bump(&shared.counters.cmd_set);
    let (stored, _) = shared.cache.update(key, |current| match current {
        Some(_) => (Update::Keep, false),
        None => (store(value.to_vec(), None, 0), true),
    })?;
    out.integer(stored as i64);
    Ok(())
}

fn set_expiring(
    shared: &Shared,
    name: &str,
    args: &[&[u8]],
    out: &mut Reply,
) -> zipcache::Result<()> {
    Counters::bump(&shared.counters.cmd_set);
    let unit = if name == "setex" { 1000 } else { 1 };
    match expiry_at(args[2], unit, false, shared.cache.now_ms(), name) {
        Ok(at) => {
            shared
                .cache
                .put_with(args[1], args[3], put_options(Some(at)))?;
            out.simple("OK");
        }
        Err(message) => out.error(&message),
    }
    Ok(())
}

/// GETSET (a new value) and GETDEL (`None`): reply with the old value.
fn getset(
    shared: &Shared,
    key: &[u8],
    new: Option<&[u8]>,
    out: &mut Reply,
) -> zipcache::Result<()> {
    let (old, _) = shared.cache.update(key, |current| {
        let update = match new {
            Some(value) => store(value.to_vec(), None, 0),
            None if current.is_some() => Update::Delete,
            None => Update::Keep,
        };
        (update, current.map(|i| i.value.clone()))
    })?;
    out.maybe_bulk(old.as_deref());
    Ok(())
}

fn append(shared: &Shared, key: &[u8], suffix: &[u8], out: &mut Reply) -> zipcache::Result<()> {
    let (len, _) = shared.cache.update(key, |current| {
        let value = match current {
            Some(item) => [&item.value[..], suffix].concat(),
            None => suffix.to_vec(),
        };
        let len = value.len();
        (rewrite(current, value), len)
    })?;
    out.integer(len as i64);
    Ok(())
}

fn delete(shared: &Shared, keys: &[&[u8]], out: &mut Reply) -> zipcache::Result<()> {
    let mut deleted = 0;
    for key in keys {
        deleted += shared.cache.delete(key)? as i64;
    }
    out.integer(deleted);
    Ok(())
}

fn exists(shared: &Shared, keys: &[&[u8]], out: &mut Reply) -> zipcache::Result<()> {
    let mut found = 0;
    for key in keys {
        found += shared.cache.get_item(key)?.is_some() as i64;
    }
    out.integer(found);
    Ok(())
}

fn mget(shared: &Shared, keys: &[&[u8]], out: &mut Reply) -> zipcache::Result<()> {
    // Fetch first: an engine error must not leave a half-written array.
    let mut values = Vec::with_capacity(keys.len());
    for key in keys {
        Counters::bump(&shared.counters.cmd_get);
        let value = shared.cache.get(key)?;
        shared.counters.hit_or_miss(value.is_some());
        values.push(value);
    }
    out.array(values.len());
    for value in &values {
        out.maybe_bulk(value.as_deref());
    }
    Ok(())
}

fn mset(shared: &Shared, args: &[&[u8]], out: &mut Reply) -> zipcache::Result<()> {
    if args.len().is_multiple_of(2) {
        out.error("ERR wrong number of arguments for 'mset' command");
        return Ok(());
    }
    for pair in args[1..].chunks_exact(2) {
        Counters::bump(&shared.counters.cmd_set);
        shared.cache.put_with(pair[0], pair[1], put_options(None))?;
    }
    out.simple("OK");
    Ok(())
}

fn incr_by(
    shared: &Shared,
    key: &[u8],
    delta: Result<i64, &str>,
    out: &mut Reply,
) -> zipcache::Result<()> {
    let delta = match delta {
        Ok(d) => d,
        Err(message) => {
            out.error(message);
            return Ok(());
        }
    };
    let (result, _) = shared.cache.update(key, |current| {
        let old = match current {
            None => Some(0),
            Some(item) => integer(&item.value),
        };
        match old.map(|n| n.checked_add(delta)) {
            None => (Update::Keep, Err(NOT_INTEGER)),
            Some(None) => (
                Update::Keep,
                Err("ERR increment or decrement would overflow"),
            ),
            Some(Some(n)) => (rewrite(current, n.to_string().into_bytes()), Ok(n)),
        }
    })?;
    match result {
        Ok(n) => out.integer(n),
        Err(message) => out.error(message),
    }
    Ok(())
}

fn expire(shared: &Shared, name: &str, args: &[&[u8]], out: &mut Reply) -> zipcache::Result<()> {
    let Some(n) = integer(args[2]) else {
        out.error(NOT_INTEGER);
        return Ok(());
    };
    let unit: i64 = if name == "expire" { 1000 } else { 1 };
    let now = shared.cache.now_ms() as i64;
    let Some(at) = n.checked_mul(unit).and_then(|ms| ms.checked_add(now)) else {
        out.error(&format!("ERR invalid expire time in '{name}' command"));
        return Ok(());
    };
    let condition = match args.get(3).map(|a| a.to_ascii_uppercase()) {
        None => None,
        Some(c) if args.len() == 4 && [&b"NX"[..], b"XX", b"GT", b"LT"].contains(&c.as_slice()) => {
            Some(c)
        }
        Some(_) => {
            out.error("ERR Unsupported option");
            return Ok(());
        }
    };
    let (changed, _) = shared.cache.update(args[1], |current| {
        let Some(item) = current else {
            return (Update::Keep, false);
        };
        let old = item.expires_at_ms.map(|t| t as i64);
        // Redis: no TTL counts as infinite for GT/LT.
        let allowed = match condition.as_deref() {
            None => true,
            Some(b"NX") => old.is_none(),
            Some(b"XX") => old.is_some(),
            Some(b"GT") => old.is_some_and(|t| at > t),
            _ => old.is_none_or(|t| at < t),
        };
        if !allowed {
            return (Update::Keep, false);
        }
        if at <= now {
            return (Update::Delete, true);
        }
        (redate(item, Some(at as u64)), true)
    })?;
    out.integer(changed as i64);
    Ok(())
}

fn ttl(shared: &Shared, key: &[u8], millis: bool, out: &mut Reply) -> zipcache::Result<()> {
    let item = shared.cache.get_item(key)?;
    let now = shared.cache.now_ms();
    let ttl = match item.map(|i| i.expires_at_ms) {
        None => -2,
        Some(None) => -1,
        Some(Some(at)) => {
            let left = i64::try_from(at.saturating_sub(now)).unwrap_or(i64::MAX);
            if millis {
                left
            } else {
                left.saturating_add(500) / 1000
            }
        }
    };
    out.integer(ttl);
    Ok(())
}

fn persist(shared: &Shared, key: &[u8], out: &mut Reply) -> zipcache::Result<()> {
    let (changed, _) = shared.cache.update(key, |current| match current {
        Some(item) if item.expires_at_ms.is_some() => (redate(item, None), true),
        _ => (Update::Keep, false),
    })?;
    out.integer(changed as i64);
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

/// SCAN's cursor is the hex of the last key returned, so a scan resumes in key order
/// after it, whatever was inserted or evicted meanwhile; "0" starts and ends a scan.
fn scan(shared: &Shared, args: &[&[u8]], out: &mut Reply) -> zipcache::Result<()> {
    let after = match args[1] {
        b"0" => None,
        cursor => match unhex(cursor) {
            Some(key) if !key.is_empty() => Some(key),
            _ => {
                out.error("ERR invalid cursor");
                return Ok(());
            }
        },
    };
    let mut count = 10;
    let mut pattern: Option<&[u8]> = None;
    let mut strings_only = true;
    let mut options = args[2..].chunks(2);
    for option in options.by_ref() {
        let [name, value] = option else {
            out.error(SYNTAX);
            return Ok(());
        };
        match name.to_ascii_uppercase().as_slice() {
            b"COUNT" => match integer(value) {
                Some(n) if n >= 1 => count = (n as usize).min(SCAN_MAX_COUNT),
                Some(_) => {
                    out.error(SYNTAX);
                    return Ok(());
                }
                None => {
                    out.error(NOT_INTEGER);
                    return Ok(());
                }
            },
            b"MATCH" => pattern = Some(value),
            b"TYPE" => strings_only = value.eq_ignore_ascii_case(b"string"),
            _ => {
                out.error(SYNTAX);
                return Ok(());
            }
        }
    }
    let start = match &after {
        Some(key) => Bound::Excluded(key.as_slice()),
        None => Bound::Unbounded,
    };
    let batch = shared
        .cache
        .scan::<&[u8]>((start, Bound::Unbounded), count)?;
    let next = match batch.last() {
        Some((key, _)) if batch.len() == count => hex(key),
        _ => "0".into(),
    };
    let keys: Vec<&[u8]> = batch
        .iter()
        .map(|(k, _)| k.as_slice())
        .filter(|k| strings_only && pattern.is_none_or(|p| glob::matches(p, k)))
        .collect();
    out.array(2);
    out.bulk(next.as_bytes());
    out.array(keys.len());
    for key in keys {
        out.bulk(key);
    }
    Ok(())
}

/// `ZCRANGE start end [LIMIT n]`: key/value pairs with start <= key < end in key order;
/// `-` and `+` stand for the open ends.
fn range(shared: &Shared, args: &[&[u8]], out: &mut Reply) -> zipcache::Result<()> {
    let limit = match &args[3..] {
        [] => RANGE_DEFAULT_LIMIT,
        [word, n] if word.eq_ignore_ascii_case(b"LIMIT") => match integer(n) {
            Some(n) if n >= 0 => (n as usize).min(RANGE_MAX_LIMIT),
            _ => {
                out.error(NOT_INTEGER);
                return Ok(());
            }
        },
        _ => {
            out.error(SYNTAX);
            return Ok(());
        }
    };
    let start = match args[1] {
        b"-" => Bound::Unbounded,
        key => Bound::Included(key),
    };
    let end = match args[2] {
        b"+" => Bound::Unbounded,
        key => Bound::Excluded(key),
    };
    let items = shared.cache.scan::<&[u8]>((start, end), limit)?;
    out.array(items.len() * 2);
    for (key, item) in &items {
        out.bulk(key);
        out.bulk(&item.value);
    }
    Ok(())
}

fn info(shared: &Shared, sections: &[&[u8]]) -> String {
    let wanted = |name: &str| {
        sections.is_empty()
            || sections.iter().any(|s| {
                s.eq_ignore_ascii_case(name.as_bytes())
                    || s.eq_ignore_ascii_case(b"all")
                    || s.eq_ignore_ascii_case(b"everything")
                    || s.eq_ignore_ascii_case(b"default")
            })
    };
    let engine = shared.cache.stats();
    let counters = shared.counters.snapshot();
    let counter = |name: &str| {
        counters
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    };
    let mut text = String::new();
    let mut section = |title: &str, fields: Vec<(String, String)>| {
        if wanted(title) {
            text.push_str(&format!("# {title}\r\n"));
            for (k, v) in fields {
                text.push_str(&format!("{k}:{v}\r\n"));
            }
            text.push_str("\r\n");
        }
    };
    let pairs = |list: &[(&str, String)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    section(
        "Server",
        pairs(&[
            ("redis_version", REDIS_VERSION.into()),
            ("zipcache_version", env!("CARGO_PKG_VERSION").into()),
            ("redis_mode", "standalone".into()),
            ("process_id", std::process::id().to_string()),
            ("tcp_port", shared.info.resp_port.to_string()),
            (
                "uptime_in_seconds",
                shared.started.elapsed().as_secs().to_string(),
            ),
            ("io_threads_active", shared.info.threads.to_string()),
        ]),
    );
    section(
        "Clients",
        pairs(&[
            ("connected_clients", counter("curr_connections").to_string()),
            ("maxclients", shared.info.max_connections.to_string()),
        ]),
    );
    section(
        "Memory",
        pairs(&[
            ("used_memory", engine.dram_used.to_string()),
            ("maxmemory", engine.dram_capacity.to_string()),
            ("maxmemory_policy", "allkeys-lru".into()),
        ]),
    );
    section(
        "Stats",
        pairs(&[
            (
                "total_connections_received",
                counter("total_connections").to_string(),
            ),
            (
                "rejected_connections",
                counter("rejected_connections").to_string(),
            ),
            (
                "total_commands_processed",
                counter("total_commands_processed").to_string(),
            ),
            ("keyspace_hits", counter("get_hits").to_string()),
            ("keyspace_misses", counter("get_misses").to_string()),
            ("evicted_keys", engine.evicted_objects.to_string()),
            ("expired_keys", engine.expired.to_string()),
        ]),
    );
    section("Zipcache", engine_metrics(&engine));
    section(
        "Keyspace",
        pairs(&[(
            "db0",
            format!("keys={},expires=0,avg_ttl=0", engine.objects_resident),
        )]),
    );
    text
}

fn command(args: &[&[u8]], out: &mut Reply) {
    match args.get(1).map(|a| a.to_ascii_uppercase()).as_deref() {
        // Clients only need COMMAND to answer; an empty table makes them fall back to
        // plain behaviour.
        None | Some(b"DOCS") | Some(b"INFO") => out.array(0),
        Some(b"COUNT") => out.integer(COMMANDS.len() as i64),
        Some(_) => unknown_subcommand(args, out),
    }
}

fn config(shared: &Shared, args: &[&[u8]], out: &mut Reply) {
    match args[1].to_ascii_uppercase().as_slice() {
        b"GET" if args.len() >= 3 => {
            let parameters = [
                ("save", String::new()),
                ("appendonly", "no".to_string()),
                ("maxmemory", shared.cache.stats().dram_capacity.to_string()),
                ("maxmemory-policy", "allkeys-lru".to_string()),
                ("maxclients", shared.info.max_connections.to_string()),
                ("databases", "1".to_string()),
                ("port", shared.info.resp_port.to_string()),
                ("bind", shared.info.listen.to_string()),
            ];
            let found: Vec<&(&str, String)> = parameters
                .iter()
                .filter(|(name, _)| {
                    args[2..]
                        .iter()
                        .any(|p| glob::matches(&p.to_ascii_lowercase(), name.as_bytes()))
                })
                .collect();
            out.map(found.len());
            for (name, value) in found {
                out.bulk(name.as_bytes());
                out.bulk(value.as_bytes());
            }
        }
        b"RESETSTAT" => out.simple("OK"),
        b"SET" => out.error("ERR CONFIG SET is not supported; restart with --set NAME=VALUE"),
        _ => unknown_subcommand(args, out),
    }
}

fn client(session: &mut RespSession, args: &[&[u8]], out: &mut Reply) {
    match (args[1].to_ascii_uppercase().as_slice(), args.len()) {
        (b"ID", 2) => out.integer(session.id as i64),
        (b"GETNAME", 2) => out.maybe_bulk(session.name.as_deref()),
        (b"SETNAME", 3) => {
            if args[2].iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
                out.error(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            } else {
                session.name = (!args[2].is_empty()).then(|| args[2].to_vec());
                out.simple("OK");
            }
        }
        // Client libraries announce themselves; nothing to keep.
        (b"SETINFO", 4) => out.simple("OK"),
        _ => unknown_subcommand(args, out),
    }
}

fn hello(session: &mut RespSession, args: &[&[u8]], out: &mut Reply) {
    let resp3 = match args.get(1).map(|v| integer(v)) {
        None => session.resp3,
        Some(Some(version @ (2 | 3))) => version == 3,
        Some(Some(_)) => {
            out.error("NOPROTO sorry, this protocol version is not supported");
            return;
        }
        Some(None) => {
            out.error("ERR Protocol version is not an integer or out of range");
            return;
        }
    };
    let mut rest = args.get(2..).unwrap_or(&[]).iter();
    while let Some(option) = rest.next() {
        match (option.to_ascii_uppercase().as_slice(), rest.next()) {
            (b"SETNAME", Some(name)) => session.name = Some(name.to_vec()),
            (b"AUTH", Some(_)) if rest.next().is_some() => {}
            _ => {
                out.error(&format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(option)
                ));
                return;
            }
        }
    }
    session.resp3 = resp3;
    // The reply already speaks the protocol version just chosen.
    out.resp3 = resp3;
    out.map(7);
    for (key, value) in [("server", "redis"), ("version", REDIS_VERSION)] {
        out.bulk(key.as_bytes());
        out.bulk(value.as_bytes());
    }
    out.bulk(b"proto");
    out.integer(if session.resp3 { 3 } else { 2 });
    out.bulk(b"id");
    out.integer(session.id as i64);
    for (key, value) in [("mode", "standalone"), ("role", "master")] {
        out.bulk(key.as_bytes());
        out.bulk(value.as_bytes());
    }
    out.bulk(b"modules");
    out.array(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_strict_like_redis() {
        assert_eq!(integer(b"42"), Some(42));
        assert_eq!(integer(b"-7"), Some(-7));
        assert_eq!(integer(b"0"), Some(0));
        assert_eq!(integer(b"007"), None);
        assert_eq!(integer(b"+5"), None);
        assert_eq!(integer(b" 5"), None);
        assert_eq!(integer(b"-"), None);
        assert_eq!(integer(b"9223372036854775808"), None);
    }

    #[test]
    fn scan_cursors_round_trip() {
        assert_eq!(
            unhex(hex(b"\x00key\xff").as_bytes()),
            Some(b"\x00key\xff".to_vec())
        );
        assert_eq!(unhex(b"zz"), None);
        assert_eq!(unhex(b"abc"), None);
    }
}
