//! Typed RESP commands (mini-redis's `Command::from_frame` shape). Each family file holds
//! one table of its commands — name, Redis arity, parser — and its typed command enum.
//! A request is looked up, checked for arity, authentication and its own syntax once, in
//! Redis's order (so a bad request gets Redis's error), and only a complete typed
//! [`Command`] runs against the engine.

mod cluster;
mod connection;
mod expiry;
pub(crate) mod hashes;
mod keys;
mod server;
pub(crate) mod strings;

use std::borrow::Cow;

use zipcache::{AccessState, GetOptions, Item, PutOptions, Update};

use super::{Client, Reply};
use crate::core::cluster::{Cluster, Route};
use crate::core::keyspace::Keyspace;
use crate::resp::Resp;
use crate::transport::prefetch::{Access, Prefetch, ReadAhead};

pub const SYNTAX: &str = "ERR syntax error";
pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const NOAUTH: &str = "NOAUTH Authentication required.";
/// Commands a client may send before it authenticates (Redis's `no-auth` flag).
const BEFORE_AUTH: [&str; 3] = ["auth", "hello", "quit"];
/// What `--disable-flush-all` refuses on this port.
const FLUSHES: [&str; 2] = ["flushall", "flushdb"];

/// The error a request is answered with instead of running (`ERR …`, `WRONGPASS …`).
#[derive(Debug, PartialEq, Eq)]
pub struct ErrorReply(pub Cow<'static, str>);

impl From<&'static str> for ErrorReply {
    fn from(message: &'static str) -> Self {
        ErrorReply(Cow::Borrowed(message))
    }
}

impl From<String> for ErrorReply {
    fn from(message: String) -> Self {
        ErrorReply(Cow::Owned(message))
    }
}

impl From<zipcache::Error> for ErrorReply {
    fn from(error: zipcache::Error) -> Self {
        match error {
            // Redis's reply under `maxmemory-policy noeviction`.
            zipcache::Error::OutOfMemory => ErrorReply(Cow::Borrowed(
                "OOM command not allowed when used memory > 'maxmemory'.",
            )),
            other => ErrorReply(Cow::Owned(format!("ERR {other}"))),
        }
    }
}

pub type Result<T, E = ErrorReply> = std::result::Result<T, E>;

/// Whether the connection goes on after a command.
pub enum Flow {
    Continue,
    Close,
    /// Nothing executed: SSD reads are in flight for it (`prefetch`).
    Await,
    /// An MGET of this many keys wrote its array header: its values follow, as the
    /// socket drains (`strings::MultiGet`).
    MultiGet(usize),
    /// An HGETALL, HKEYS or HVALS wrote its length: its fields follow, as the socket
    /// drains (`hashes::stream_hash`).
    StreamedHash(crate::core::hashes::Streamed),
}

/// One parsed request, borrowing its keys and values from the read buffer.
pub enum Command<'a> {
    Strings(strings::StringCommand<'a>),
    Keys(keys::KeyCommand<'a>),
    Expiry(expiry::ExpiryCommand<'a>),
    Server(server::ServerCommand<'a>),
    Connection(connection::ConnectionCommand<'a>),
    Cluster(cluster::ClusterCommand<'a>),
    Hashes(hashes::HashCommand<'a>),
}

type Parser = for<'a> fn(&mut Args<'a>) -> Result<Command<'a>>;

/// A command (or subcommand) name, its Redis arity — positive: exactly that many
/// arguments, the name included; negative: at least that many — and its parser.
pub struct Spec {
    name: &'static str,
    arity: i32,
    parse: Parser,
    /// Where its keys are, for COMMAND (cluster clients route by them); `None`: it names
    /// no key.
    keys: Option<KeyPositions>,
    /// A command with subcommands: their table.
    subcommands: &'static [Spec],
}

/// Where a command's keys are among its arguments, as COMMAND reports them: from `first`
/// to `last` (negative: counted from the end), every `step`th; and whether it writes.
#[derive(Clone, Copy)]
pub struct KeyPositions {
    first: i32,
    last: i32,
    step: i32,
    writes: bool,
}

impl KeyPositions {
    /// The keys among `argv` (the command's name first).
    fn of<'a>(self, argv: &'a [&'a [u8]]) -> impl Iterator<Item = &'a [u8]> {
        let argc = argv.len() as i32;
        let last = if self.last < 0 {
            argc + self.last
        } else {
            self.last
        };
        let step = self.step.max(1) as usize;
        (self.first..=last)
            .step_by(step)
            .filter_map(move |i| argv.get(i as usize).copied())
    }
}

/// Reads the key that is its first argument.
pub const READS_ONE: KeyPositions = KeyPositions {
    first: 1,
    last: 1,
    step: 1,
    writes: false,
};
/// Writes the key that is its first argument.
pub const WRITES_ONE: KeyPositions = KeyPositions {
    writes: true,
    ..READS_ONE
};
/// Reads every argument as a key.
pub const READS_ALL: KeyPositions = KeyPositions {
    last: -1,
    ..READS_ONE
};
/// Writes every argument as a key.
pub const WRITES_ALL: KeyPositions = KeyPositions {
    writes: true,
    ..READS_ALL
};
/// Writes the two keys that are its arguments (RENAME: Redis's COMMAND says 1, 2, 1).
pub const WRITES_TWO: KeyPositions = KeyPositions {
    last: 2,
    ..WRITES_ONE
};
/// Writes key/value pairs.
pub const WRITES_PAIRS: KeyPositions = KeyPositions {
    step: 2,
    ..WRITES_ALL
};

/// A command that names no key.
pub const fn spec(name: &'static str, arity: i32, parse: Parser) -> Spec {
    Spec {
        name,
        arity,
        parse,
        keys: None,
        subcommands: &[],
    }
}

/// A command whose keys are at `keys`.
pub const fn keyed(name: &'static str, arity: i32, keys: KeyPositions, parse: Parser) -> Spec {
    Spec {
        keys: Some(keys),
        ..spec(name, arity, parse)
    }
}

/// A command of subcommands (`CLIENT`, `CLUSTER`): `parse` dispatches into `table`.
pub const fn with_subcommands(
    name: &'static str,
    arity: i32,
    table: &'static [Spec],
    parse: Parser,
) -> Spec {
    Spec {
        subcommands: table,
        ..spec(name, arity, parse)
    }
}

impl Spec {
    fn accepts(&self, argc: usize) -> bool {
        let arity = self.arity.unsigned_abs() as usize;
        if self.arity > 0 {
            argc == arity
        } else {
            argc >= arity
        }
    }
}

const FAMILIES: [&[Spec]; 7] = [
    strings::COMMANDS,
    hashes::COMMANDS,
    keys::COMMANDS,
    expiry::COMMANDS,
    server::COMMANDS,
    connection::COMMANDS,
    cluster::COMMANDS,
];

fn lookup<'t>(table: &'t [Spec], name: &[u8]) -> Option<&'t Spec> {
    table
        .iter()
        .find(|spec| name.eq_ignore_ascii_case(spec.name.as_bytes()))
}

/// Every command name we serve (COMMAND COUNT, the fuzz targets).
pub fn names() -> impl Iterator<Item = &'static str> {
    FAMILIES.into_iter().flatten().map(|spec| spec.name)
}

/// COMMAND's reply: every command (`asked` `None`), or COMMAND INFO's — each name's entry,
/// nil for a name not served.
pub fn command_table(out: &mut Reply, asked: Option<&[&[u8]]>) {
    match asked {
        None => {
            out.array(names().count());
            for spec in FAMILIES.into_iter().flatten() {
                command_entry(out, spec, spec.name);
            }
        }
        Some(names) => {
            out.array(names.len());
            for name in names {
                match FAMILIES.iter().find_map(|table| lookup(table, name)) {
                    Some(spec) => command_entry(out, spec, spec.name),
                    None => out.nil(),
                }
            }
        }
    }
}

/// One command as Redis 7's COMMAND describes it: name, arity, flags, first key, last key,
/// step, ACL categories, tips, key specifications (none: the positions say it all) and
/// subcommands, each described the same way as `command|subcommand`.
fn command_entry(out: &mut Reply, spec: &Spec, name: &str) {
    out.array(10);
    out.bulk(name.as_bytes());
    out.integer(i64::from(spec.arity));
    let (first, last, step, flag) = match spec.keys {
        Some(k) => (
            k.first,
            k.last,
            k.step,
            Some(if k.writes { "write" } else { "readonly" }),
        ),
        None => (0, 0, 0, None),
    };
    out.array(usize::from(flag.is_some()));
    if let Some(flag) = flag {
        out.simple(flag);
    }
    for n in [first, last, step] {
        out.integer(i64::from(n));
    }
    for _ in 0..3 {
        out.array(0);
    }
    out.array(spec.subcommands.len());
    for sub in spec.subcommands {
        command_entry(out, sub, &format!("{name}|{}", sub.name));
    }
}

fn wrong_number(name: &str) -> ErrorReply {
    format!("ERR wrong number of arguments for '{name}' command").into()
}

/// The commands a server refuses (`NOPERM`): the flushes under `--disable-flush-all`.
pub fn refused(flush_all_enabled: bool) -> &'static [&'static str] {
    if flush_all_enabled { &[] } else { &FLUSHES }
}

/// Runs one request (`argv` is never empty) and writes its reply.
pub fn execute(
    shared: &Resp,
    client: &mut Client,
    argv: &[&[u8]],
    out: &mut Reply,
    reads: &mut Prefetch,
) -> Flow {
    let refused = refused(shared.core.flush_all_enabled);
    let cluster = shared
        .core
        .cluster
        .enabled()
        .then_some(&shared.core.cluster);
    let outcome = Command::parse(
        argv,
        client.authenticated,
        refused,
        cluster,
        &shared.core.keys,
    )
    // The route is held until the command has run (`Route`): a topology change waits.
    .and_then(|(command, _route)| {
        if reads.admit(&shared.core.keys, || command.access()) == 0 {
            return Ok(Flow::Await);
        }
        command.execute(shared, client, out, reads)
    });
    match outcome {
        Ok(flow) => flow,
        Err(ErrorReply(message)) => {
            out.error(&message);
            Flow::Continue
        }
    }
}

/// `Session::read_ahead` for RESP: walks past one request (`ReadAhead::pass`); false
/// where the walk stops, and at a request that would be refused.
pub fn read_ahead(
    shared: &Resp,
    client: &Client,
    argv: &[&[u8]],
    ahead: &mut ReadAhead<'_>,
) -> bool {
    let refused = refused(shared.core.flush_all_enabled);
    let cluster = shared
        .core
        .cluster
        .enabled()
        .then_some(&shared.core.cluster);
    match Command::parse(
        argv,
        client.authenticated,
        refused,
        cluster,
        &shared.core.keys,
    ) {
        Ok((command, _route)) => ahead.pass(&shared.core.keys, &command.access()),
        Err(_) => false,
    }
}

impl<'a> Command<'a> {
    /// What the command does to the store (`prefetch`): GET and MGET only read, and may
    /// be fetched from the SSD ahead of it without blocking; the other string and key
    /// commands of named keys may change those (a few only look, without the GET's
    /// access mark); anything else is a barrier.
    fn access(&self) -> Access<'a> {
        use keys::KeyCommand;
        use strings::StringCommand as S;
        match self {
            Command::Strings(S::Get { key }) => Access::Reads(vec![key], GetOptions::default()),
            Command::Strings(S::MGet { keys }) => {
                Access::Reads(keys.to_vec(), GetOptions::default())
            }
            Command::Strings(S::MSet { pairs, .. }) => {
                Access::Changes(pairs.iter().step_by(2).copied().collect())
            }
            Command::Strings(
                S::Set { key, .. }
                | S::SetNx { key, .. }
                | S::SetExpiring { key, .. }
                | S::GetSet { key, .. }
                | S::GetEx { key, .. }
                | S::Append { key, .. }
                | S::Strlen { key }
                | S::IncrBy { key, .. }
                | S::IncrByFloat { key, .. }
                | S::GetRange { key, .. }
                | S::SetRange { key, .. },
            ) => Access::Changes(vec![key]),
            Command::Keys(KeyCommand::Delete { keys } | KeyCommand::Exists { keys }) => {
                Access::Changes(keys.to_vec())
            }
            Command::Keys(KeyCommand::Type { key }) => Access::Changes(vec![key]),
            _ => Access::Barrier,
        }
    }

    /// Name, arity, authentication, permission (`refused` names the commands this server
    /// does not allow: a Redis ACL's `NOPERM`), in a `cluster` mode the slot of its keys
    /// (`-CROSSSLOT`) and whether this node serves it (`-MOVED`, `-CLUSTERDOWN`), then
    /// the command's own syntax, as Redis checks them; arguments its parser left over
    /// are a syntax error. With the command, the route its keys were checked on, to be
    /// held while it runs (a keyless command holds none: CLUSTERX changes the topology).
    pub fn parse<'c>(
        argv: &'a [&'a [u8]],
        authenticated: bool,
        refused: &[&str],
        cluster: Option<&'c Cluster>,
        cache: &'a Keyspace,
    ) -> Result<(Command<'a>, Route<'c>)> {
        let Some((name, _)) = argv.split_first() else {
            return Err(unknown_command(argv));
        };
        let spec = FAMILIES
            .iter()
            .find_map(|table| lookup(table, name))
            .ok_or_else(|| unknown_command(argv))?;
        if !spec.accepts(argv.len()) {
            return Err(wrong_number(spec.name));
        }
        if !authenticated && !BEFORE_AUTH.contains(&spec.name) {
            return Err(NOAUTH.into());
        }
        if refused.contains(&spec.name) {
            return Err(format!(
                "NOPERM this user has no permissions to run the '{}' command",
                spec.name
            )
            .into());
        }
        let mut route = Route::Here;
        if let Some(cluster) = cluster
            && let Some(keys) = spec.keys
            && let Some(slot) = cluster::same_slot(keys.of(argv))?
        {
            route = cluster.route();
            route.check(slot).map_err(cluster::redirect)?;
        }
        let mut args = Args {
            argv,
            pos: 1,
            name: Cow::Borrowed(spec.name),
            cache,
        };
        let command = (spec.parse)(&mut args)?;
        if args.remaining() > 0 {
            return Err(SYNTAX.into());
        }
        Ok((command, route))
    }

    fn execute(
        self,
        shared: &Resp,
        client: &mut Client,
        out: &mut Reply,
        reads: &mut Prefetch,
    ) -> Result<Flow> {
        match self {
            Command::Strings(command) => return command.execute(shared, out, reads),
            Command::Keys(command) => command.execute(shared, out)?,
            Command::Expiry(command) => command.execute(shared, out)?,
            Command::Server(command) => command.execute(shared, out)?,
            Command::Connection(command) => return command.execute(shared, client, out),
            Command::Cluster(command) => command.execute(shared, client, out)?,
            Command::Hashes(command) => return command.execute(shared, out),
        }
        Ok(Flow::Continue)
    }
}

fn unknown_command(argv: &[&[u8]]) -> ErrorReply {
    let mut listed = String::new();
    // As Redis: arguments are listed until 128 characters are, however many follow.
    for arg in argv.iter().skip(1) {
        let room = 128usize.saturating_sub(listed.len());
        if room == 0 {
            break;
        }
        let arg = String::from_utf8_lossy(arg);
        listed.push_str(&format!(
            "'{}' ",
            arg.chars().take(room).collect::<String>()
        ));
    }
    let name = argv
        .first()
        .map_or(Cow::Borrowed(""), |n| String::from_utf8_lossy(n));
    let name: String = name.chars().take(128).collect();
    format!("ERR unknown command '{name}', with args beginning with: {listed}").into()
}

/// The arguments of one request after its name, consumed front to back by a parser.
pub struct Args<'a> {
    argv: &'a [&'a [u8]],
    pos: usize,
    /// For errors: `get`, or `client|setname` for a subcommand.
    name: Cow<'static, str>,
    cache: &'a Keyspace,
}

impl<'a> Args<'a> {
    /// The next argument; a missing one is an arity error (the table's arity rules most
    /// of these out before parsing starts).
    pub fn next(&mut self) -> Result<&'a [u8]> {
        let arg = self
            .argv
            .get(self.pos)
            .ok_or_else(|| wrong_number(&self.name))?;
        self.pos += 1;
        Ok(arg)
    }

    /// The next argument, not consumed; `None` at the end.
    pub fn peek(&self) -> Option<&'a [u8]> {
        self.argv.get(self.pos).copied()
    }

    /// The next argument as a Redis integer.
    pub fn integer(&mut self) -> Result<i64> {
        integer(self.next()?).ok_or_else(|| NOT_INTEGER.into())
    }

    /// Every argument not consumed yet.
    pub fn rest(&mut self) -> &'a [&'a [u8]] {
        let rest = self.argv.get(self.pos..).unwrap_or(&[]);
        self.pos = self.argv.len();
        rest
    }

    /// How many arguments are left.
    pub fn remaining(&self) -> usize {
        self.argv.len().saturating_sub(self.pos)
    }

    /// The arity error for this command.
    pub fn wrong_number(&self) -> ErrorReply {
        wrong_number(&self.name)
    }

    /// The engine clock in milliseconds, for expiries given relative to now.
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.cache.engine().now_ms()).unwrap_or(i64::MAX)
    }

    /// Parses a subcommand (`CLIENT SETNAME …`) from its own table: an unknown one is
    /// Redis's `unknown subcommand`, a wrong count names `client|setname`.
    pub fn subcommand(&mut self, table: &[Spec]) -> Result<Command<'a>> {
        let parent = self.name.clone();
        let name = self.next()?;
        let Some(spec) = lookup(table, name) else {
            return Err(format!(
                "ERR unknown subcommand '{}'. Try {} HELP.",
                String::from_utf8_lossy(name),
                parent.to_ascii_uppercase()
            )
            .into());
        };
        self.name = Cow::Owned(format!("{parent}|{}", spec.name));
        if !spec.accepts(self.argv.len()) {
            return Err(self.wrong_number());
        }
        (spec.parse)(self)
    }
}

/// Redis's strict integer syntax: optional `-`, no `+`, no leading zeros or spaces.
pub fn integer(arg: &[u8]) -> Option<i64> {
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

/// `amount` units of `unit_ms` after now, or after the epoch when `absolute`, as absolute
/// milliseconds; `None` when that overflows (Redis: "invalid expire time").
pub fn expiry_ms(amount: i64, unit_ms: i64, absolute: bool, now_ms: i64) -> Option<i64> {
    let ms = amount.checked_mul(unit_ms)?;
    if absolute {
        Some(ms)
    } else {
        ms.checked_add(now_ms)
    }
}

pub fn invalid_expire(command: &str) -> ErrorReply {
    format!("ERR invalid expire time in '{command}' command").into()
}

/// What a write does to the key's expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewExpiry {
    Never,
    At(u64),
    /// The key's current expiry (SET KEEPTTL; GETEX without an option).
    Keep,
}

impl NewExpiry {
    /// The absolute expiry for a write over `current`.
    pub fn resolve(self, current: Option<&Item>) -> Option<u64> {
        match self {
            NewExpiry::Never => None,
            NewExpiry::At(at) => Some(at),
            NewExpiry::Keep => current.and_then(|item| item.expires_at_ms),
        }
    }
}

/// The update storing `value` with this expiry and flags (RESP writes ask for no CAS).
pub fn store(value: Vec<u8>, expires_at_ms: Option<u64>, flags: u32) -> Update {
    Update::Put {
        value,
        options: PutOptions {
            expires_at_ms,
            flags,
            ..PutOptions::default()
        },
    }
}

/// `value` as a new version of `item`, keeping its expiry and flags (INCR, APPEND).
pub fn rewrite(item: Option<&Item>, value: Vec<u8>) -> Update {
    store(
        value,
        item.and_then(|i| i.expires_at_ms),
        item.map_or(0, |i| i.flags),
    )
}

/// `item` as it is, access state included, expiring at `at` instead (EXPIRE, PERSIST,
/// GETEX).
pub fn redate(flags: u32, access: Option<AccessState>, at: Option<u64>) -> Update {
    Update::SetMeta(PutOptions {
        expires_at_ms: at,
        flags,
        access,
        ..PutOptions::default()
    })
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
    fn every_name_is_listed_once_in_lower_case() {
        let names: Vec<&str> = names().collect();
        for name in &names {
            assert_eq!(*name, name.to_ascii_lowercase());
            assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{name}");
        }
        for name in BEFORE_AUTH.iter().chain(&FLUSHES) {
            assert!(names.contains(name), "{name}");
        }
    }

    /// The keys COMMAND's positions name are the ones each command's parser takes: a
    /// cluster client routes by them, and the node checks their slots by them.
    #[test]
    fn key_positions_name_the_keys_the_parsers_take() {
        let keys_of = |argv: &[&[u8]]| -> Vec<Vec<u8>> {
            let spec = FAMILIES.iter().find_map(|t| lookup(t, argv[0])).unwrap();
            spec.keys
                .map(|k| k.of(argv).map(<[u8]>::to_vec).collect())
                .unwrap_or_default()
        };
        let k = |s: &str| s.as_bytes().to_vec();
        assert_eq!(keys_of(&[b"get", b"a"]), [k("a")]);
        assert_eq!(keys_of(&[b"set", b"a", b"v", b"EX", b"10"]), [k("a")]);
        assert_eq!(
            keys_of(&[b"mget", b"a", b"b", b"c"]),
            [k("a"), k("b"), k("c")]
        );
        assert_eq!(
            keys_of(&[b"mset", b"a", b"1", b"b", b"2"]),
            [k("a"), k("b")]
        );
        // An odd MSET still names its keys: the slot check comes before the arity of
        // pairs, as in Redis.
        assert_eq!(keys_of(&[b"mset", b"a", b"1", b"b"]), [k("a"), k("b")]);
        assert_eq!(keys_of(&[b"del", b"a", b"b"]), [k("a"), k("b")]);
        assert_eq!(keys_of(&[b"rename", b"a", b"b"]), [k("a"), k("b")]);
        let rename = FAMILIES
            .iter()
            .find_map(|t| lookup(t, b"renamenx"))
            .unwrap();
        let positions = rename.keys.unwrap();
        assert_eq!((positions.first, positions.last, positions.step), (1, 2, 1));
        assert_eq!(keys_of(&[b"expire", b"a", b"10"]), [k("a")]);
        assert!(keys_of(&[b"scan", b"0"]).is_empty());
        assert!(keys_of(&[b"cluster", b"keyslot", b"a"]).is_empty());
        // Every command that names keys says where they are.
        let keyed = |name: &str| {
            FAMILIES
                .iter()
                .find_map(|t| lookup(t, name.as_bytes()))
                .unwrap()
                .keys
                .is_some()
        };
        for name in [
            "get",
            "set",
            "getdel",
            "incrbyfloat",
            "setrange",
            "msetnx",
            "unlink",
            "exists",
            "type",
            "ttl",
            "persist",
            "pexpireat",
        ] {
            assert!(keyed(name), "{name}");
        }
    }

    /// As Redis: the arguments are quoted until 128 characters are listed, whatever
    /// their number.
    #[test]
    fn the_unknown_command_error_is_cut_as_redis_cuts_it() {
        let few = unknown_command(&[b"NOPE", b"a", b"b"]);
        assert_eq!(
            few.0,
            "ERR unknown command 'NOPE', with args beginning with: 'a' 'b' "
        );
        let long = [b"x".repeat(200)];
        let many: Vec<&[u8]> = std::iter::once(&b"NOPE"[..])
            .chain(std::iter::repeat_n(&long[0][..], 100_000))
            .collect();
        let cut = unknown_command(&many);
        // Redis 7: `'` + 128 characters + `' `.
        let listed = format!("'{}' ", "x".repeat(128));
        assert_eq!(
            cut.0,
            format!("ERR unknown command 'NOPE', with args beginning with: {listed}")
        );
    }
}
