//! Redis hashes, kept by the engine as ordinary objects (`format.rs` draws their bytes;
//! FORMAT.md, "The server's key bytes"): a **header** at the hash's key, with the
//! engine's `collection` bit so that string commands see another type, in one of two
//! layouts, as Redis keeps a small hash as a listpack and a large one as a table:
//!
//! * **packed** — the header holds the fields (up to 128 of them and 1,536 bytes): one
//!   object, so a session is written, read, evicted, moved to flash and back whole, as
//!   one value compressed with the trained dictionary that fits such values;
//! * **elements** (`elements.rs`) — past that, one element object per field, under a
//!   stored key of its own that starts with the hash's id, so the fields of one hash
//!   neighbour in key order (HGETALL is one range read) and a hash of any size is never
//!   read or rewritten whole. A hash's id — the engine's run epoch and a serial counted
//!   in the run — is never given twice while the device may hold an element of it, so
//!   replacing or deleting a hash is one write of its header: the old elements are
//!   unreachable at once (DEL deletes them; a SET over the hash or its expiry leaves
//!   them to eviction).
//!
//! A hash packed grows into elements once it passes either limit, and stays so.
//!
//! **A partial hash is never served.** The engine evicts elements one by one; without
//! an SSD tier (or once the SSD drops them) some fields of a hash may be gone while its
//! header stays. The header counts its elements; a command that reads the whole hash
//! (HGETALL, HKEYS, HVALS, HLEN, HSCAN's first call) and finds fewer drops the hash and
//! answers as if the key were gone. A command that reads some fields answers each as
//! Redis would — a field it does not find is nil, as it is whether it was never set or
//! was forgotten with its hash. A field's expiry is kept in its element's value (or the
//! packed header), not as the engine's expiry, so that an element never vanishes by
//! expiring without its header knowing: an expired field still counts, is never served,
//! and is deleted by the next command that meets it.
//!
//! Every hash command that writes, or reads a large hash, holds its key's stripe lock from
//! reading the header to its last write, so a header and its elements change together:
//! alone, or — a command on one field of a large hash (`one_field.rs`) — shared with
//! others on one field, each changing its element and then its header's counts in one
//! engine update each, while the commands that read a hash whole wait. A
//! packed hash is one object, read whole at once: a read of it takes no stripe lock
//! ([`Hashes::read`]), and a write of it is one engine update that reads it
//! ([`Hashes::edit_packed`]). String writes take no lock: a
//! SET over a hash replaces the header in one engine update, and a hash command whose
//! header was replaced meanwhile (its bytes are no longer the ones it read) starts again.

mod elements;
mod format;
#[cfg(test)]
mod model_tests;
mod one_field;
mod rename;
mod stream;
#[cfg(test)]
mod tests;

pub use rename::Renamed;
pub use stream::{All, Streamed};

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use zipcache::{GetOptions, Item, ItemInfo, PutOptions, Update};

use self::format::{ELEMENT_KEY_OVERHEAD, FieldSpan, HashId, Header, Layout, Packed};
use self::one_field::LastLarge;
use super::keyspace::Keyspace;

/// Locks hash commands take, by their key's hash.
const STRIPES: usize = 1024;
/// Times a hash command tries its stripe's lock, a pause (~18 ns here) between tries,
/// before it sleeps on it: about two holds of an HSET into a large hash. Both serving
/// threads writing one hash handed the lock over through futex sleeps and wake-ups, a
/// fifth of the server's CPU (redis-benchmark `-t hset -r 100000`, docs/RESULTS.md Y4);
/// a holder waiting for an SSD read costs a waiter these few µs, then it sleeps.
const SPINS: usize = 400;
/// Fields a hash may hold.
pub const MAX_FIELDS: u64 = 1 << 20;
/// A packed hash's limits: past either, its fields become elements.
const PACKED_MAX_FIELDS: usize = 128;
const PACKED_MAX_BYTES: usize = 1536;
/// What a field costs in a reply besides its bytes (`$<len>\r\n…\r\n`).
const REPLY_OVERHEAD: usize = 16;
/// Fields HLEN holds at a time while it counts a large hash's live ones.
const LEN_PAGE: usize = 1024;

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// Redis's reply for a field that does not exist (HTTL, HEXPIRE, HPERSIST).
pub const NO_FIELD: i64 = -2;
/// Redis's reply for a field without an expiry (HTTL, HPERSIST).
pub const NO_EXPIRY: i64 = -1;

#[derive(Debug)]
pub enum HashError {
    /// The key holds a string (or another collection).
    WrongType,
    Engine(zipcache::Error),
    /// A field longer than an element's key can hold.
    FieldTooLong {
        max: usize,
    },
    /// A field's value longer than an element holds (the engine's `max_value_size`, less
    /// the element's expiry).
    ValueTooLarge {
        max: usize,
    },
    /// A write that would pass [`MAX_FIELDS`].
    TooManyFields,
    /// A whole-hash reply larger than the connection's output budget.
    TooLarge {
        budget: usize,
    },
}

impl From<zipcache::Error> for HashError {
    fn from(error: zipcache::Error) -> Self {
        HashError::Engine(error)
    }
}

pub type Result<T> = std::result::Result<T, HashError>;

/// Fields and values, in field order.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// What a field of a hash holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Field {
    /// Not there.
    Absent,
    /// There but never served: its field expired (or an element's bytes are not an
    /// element's). Counted by an elements header until deleted.
    Dead { had_expiry: bool },
    Live {
        value: Vec<u8>,
        expires_at_ms: Option<u64>,
    },
}

impl Field {
    /// What an element object holds.
    fn of_element(item: Option<&Item>, now_ms: u64) -> Field {
        // An object under an element's key without the collection bit is none of ours
        // (written under that key before elements existed): absent.
        let Some(item) = item.filter(|i| i.collection) else {
            return Field::Absent;
        };
        match format::parse_element(&item.value) {
            Some((expires_at_ms, value)) => Field::at(value, expires_at_ms, now_ms),
            None => Field::Dead { had_expiry: false },
        }
    }

    fn at(value: &[u8], expires_at_ms: Option<u64>, now_ms: u64) -> Field {
        match expires_at_ms {
            Some(at) if at <= now_ms => Field::Dead { had_expiry: true },
            _ => Field::live(value, expires_at_ms),
        }
    }

    fn had_expiry(&self) -> bool {
        match self {
            Field::Absent => false,
            Field::Dead { had_expiry } => *had_expiry,
            Field::Live { expires_at_ms, .. } => expires_at_ms.is_some(),
        }
    }

    fn live(value: &[u8], expires_at_ms: Option<u64>) -> Field {
        Field::Live {
            value: value.to_vec(),
            expires_at_ms,
        }
    }

    fn is_live(&self) -> bool {
        matches!(self, Field::Live { .. })
    }

    fn value(&self) -> Option<&[u8]> {
        match self {
            Field::Live { value, .. } => Some(value),
            _ => None,
        }
    }
}

/// One named field of an [`Hashes::edit`]: as read, and as the command leaves it.
struct Named {
    name: Vec<u8>,
    before: Field,
    after: Field,
}

/// The fields a command named, as it reads and changes them.
pub struct Edit {
    now_ms: u64,
    fields: Vec<Named>,
    /// Where each name is in `fields`, once there are more than [`SCANNED_NAMES`]: a
    /// command may name a great many. Fewer are found by a scan, which costs a session's
    /// HSET of a dozen fields no allocation or hash per name.
    index: Option<HashMap<Vec<u8>, usize, foldhash::fast::RandomState>>,
}

/// The most names an [`Edit`] finds by scanning its fields.
const SCANNED_NAMES: usize = 16;

impl Edit {
    /// The fields `names` (each once) as `found` reads them, none changed yet.
    fn of(
        now_ms: u64,
        names: &[&[u8]],
        mut found: impl FnMut(&[u8]) -> Result<Field>,
    ) -> Result<Edit> {
        let mut edit = Edit {
            now_ms,
            fields: Vec::with_capacity(names.len()),
            index: None,
        };
        for &name in names {
            if edit.position(name).is_some() {
                continue;
            }
            let before = found(name)?;
            edit.add(Named {
                name: name.to_vec(),
                after: before.clone(),
                before,
            });
        }
        Ok(edit)
    }

    /// The one field `name`, holding `before`.
    fn one(now_ms: u64, name: &[u8], before: Field) -> Edit {
        Edit {
            now_ms,
            fields: vec![Named {
                name: name.to_vec(),
                after: before.clone(),
                before,
            }],
            index: None,
        }
    }

    /// What the command changed: `(name, before, after)` of each field whose value or
    /// expiry differs from what was read (a dead field met becomes absent). A new field
    /// longer than `max_field` is refused.
    fn changes(self, max_field: usize) -> Result<Vec<(Vec<u8>, Field, Field)>> {
        let mut changes = Vec::with_capacity(self.fields.len());
        for field in self.fields {
            let after = match field.after {
                Field::Dead { .. } => Field::Absent,
                after => after,
            };
            if after == field.before {
                continue;
            }
            if field.before == Field::Absent && field.name.len() > max_field {
                return Err(HashError::FieldTooLong { max: max_field });
            }
            changes.push((field.name, field.before, after));
        }
        Ok(changes)
    }

    fn position(&self, name: &[u8]) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(name).copied(),
            None => self.fields.iter().position(|f| f.name == name),
        }
    }

    fn add(&mut self, named: Named) {
        if let Some(index) = &mut self.index {
            index.insert(named.name.clone(), self.fields.len());
        } else if self.fields.len() == SCANNED_NAMES {
            let all = self.fields.iter().chain([&named]).enumerate();
            self.index = Some(all.map(|(at, f)| (f.name.clone(), at)).collect());
        }
        self.fields.push(named);
    }

    fn get(&self, name: &[u8]) -> &Field {
        let at = self.position(name).expect("a field the command named");
        &self.fields[at].after
    }

    fn set(&mut self, name: &[u8], to: Field) {
        let at = self.position(name).expect("a field the command named");
        self.fields[at].after = to;
    }

    /// `field` expiring at `at`: gone if that is now or past.
    fn at(&self, field: Field, at: Option<u64>) -> Field {
        match field {
            Field::Live { value, .. } if at.is_none_or(|t| t > self.now_ms) => Field::Live {
                value,
                expires_at_ms: at,
            },
            Field::Live { .. } => Field::Absent,
            other => other,
        }
    }
}

/// The values of `fields` as `edit` shows them, in order; `None` past `budget` bytes.
fn values(edit: &Edit, fields: &[&[u8]], budget: usize) -> Option<Vec<Option<Vec<u8>>>> {
    let mut bytes = 0usize;
    let mut values = Vec::with_capacity(fields.len());
    for field in fields {
        let value = edit.get(field).value();
        bytes += value.map_or(0, <[u8]>::len) + REPLY_OVERHEAD;
        if bytes > budget {
            return None;
        }
        values.push(value.map(<[u8]>::to_vec));
    }
    Some(values)
}

/// HSETEX's condition on the fields it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exists {
    Any,
    /// FNX: none holds a value.
    None,
    /// FXX: each holds a value.
    All,
}

/// What a write does to a field's expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldExpiry {
    Never,
    At(u64),
    /// The field's own (HSETEX KEEPTTL).
    Keep,
}

impl FieldExpiry {
    fn resolve(self, current: &Field) -> Option<u64> {
        match (self, current) {
            (FieldExpiry::Never, _) => None,
            (FieldExpiry::At(at), _) => Some(at),
            (FieldExpiry::Keep, Field::Live { expires_at_ms, .. }) => *expires_at_ms,
            (FieldExpiry::Keep, _) => None,
        }
    }
}

/// What HGETEX / HGETDEL do to the fields they read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldChange {
    Expire(FieldExpiry),
    Delete,
}

/// HEXPIRE's NX XX GT LT; a field without an expiry counts as never expiring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpiryCondition {
    Always,
    Nx,
    Xx,
    Gt,
    Lt,
}

impl ExpiryCondition {
    fn allows(self, current: Option<u64>, at: u64) -> bool {
        match (self, current) {
            (ExpiryCondition::Always, _) => true,
            (ExpiryCondition::Nx, current) => current.is_none(),
            (ExpiryCondition::Xx | ExpiryCondition::Gt, None) => false,
            (ExpiryCondition::Lt, None) | (ExpiryCondition::Xx, Some(_)) => true,
            (ExpiryCondition::Gt, Some(t)) => at > t,
            (ExpiryCondition::Lt, Some(t)) => at < t,
        }
    }
}

/// How a whole hash is read: what its reply keeps of each field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Fields,
    Values,
    Both,
}

impl Part {
    /// The bytes a live field takes in a reply of this part.
    fn bytes(self, name: &[u8], value: &[u8]) -> usize {
        match self {
            Part::Fields => name.len(),
            Part::Values => value.len(),
            Part::Both => name.len() + value.len(),
        }
    }

    /// A field and value as a reply of this part keeps them (the other half empty).
    fn keep(self, name: Vec<u8>, value: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
        match self {
            Part::Fields => (name, Vec::new()),
            Part::Values | Part::Both => (name, value),
        }
    }
}

/// An elements header's counts after a field went from `before` to an element with or
/// without an expiry (`after`: `None` deletes it).
fn count(header: &mut Header, before: &Field, after: Option<bool>) {
    if before.had_expiry() {
        header.volatile -= 1;
    }
    if *before == Field::Absent {
        header.elements += 1;
    }
    match after {
        Some(true) => header.volatile += 1,
        Some(false) => {}
        None => header.elements -= 1,
    }
}

/// A hash as a command read it: its header's bytes (a commit checks the key still holds
/// them) and what they say.
struct Read {
    bytes: Vec<u8>,
    layout: Layout,
    /// The header's CAS version: a large hash's changes at each write of the hash.
    version: u64,
}

impl Read {
    /// The hash the object `item` holds, its bytes copied; `None` if they are not a
    /// header's. A string is the wrong type.
    fn of(item: &Item) -> Result<Option<Read>> {
        Ok(layout_of(item)?.map(|layout| Read {
            bytes: item.value.clone(),
            layout,
            version: item.cas,
        }))
    }
}

/// What the header `item` says; `None` if its bytes are not a header's. A string is the
/// wrong type.
fn layout_of(item: &Item) -> Result<Option<Layout>> {
    if !item.collection || !format::is_hash(&item.value) {
        return Err(HashError::WrongType);
    }
    Ok(Layout::decode(&item.value))
}

/// How [`Hashes::edit_packed`]'s engine update left the key.
enum InHeader<T> {
    /// The command ran on a packed hash, or on none, and what it left is stored.
    Done(T),
    /// It needs elements: the hash is large, or the command grows it past a packed one.
    /// The hash as the update read it (`None`: none, or a header that was not one).
    Elements(Option<Read>),
}

/// A packed hash's fields, found where `bytes` (its header) hold them, as `Field`s, by
/// name.
fn packed_field(bytes: &[u8], fields: &[FieldSpan], name: &[u8], now_ms: u64) -> Field {
    match fields.binary_search_by(|f| f.name(bytes).cmp(name)) {
        Ok(at) => Field::at(fields[at].value(bytes), fields[at].expires_at_ms, now_ms),
        Err(_) => Field::Absent,
    }
}

/// A packed hash's fields after a command's changes.
enum Repacked {
    Empty,
    /// The header of the fields packed.
    Packed(Vec<u8>),
    /// Too many or too large to pack in `room` bytes: they become elements.
    Grown(Vec<Packed>),
}

/// `fields` with `changes` made and the fields expired by `now_ms` dropped, packed if
/// they fit in `room` bytes.
fn repack(
    fields: Vec<Packed>,
    mut changes: Vec<(Vec<u8>, Field, Field)>,
    now_ms: u64,
    room: usize,
) -> Repacked {
    // A merge of two lists in name order: `fields` as `Layout::decode` reads them (in
    // order, distinct), the changes (one a name, `Edit`) sorted here.
    changes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut changes = changes.into_iter().peekable();
    let mut merged = Vec::with_capacity(fields.len() + changes.len());
    // A field a change leaves live, as packed.
    let packed = |(name, _, after): (Vec<u8>, Field, Field)| match after {
        Field::Live {
            value,
            expires_at_ms,
        } => Some(Packed {
            name,
            value,
            expires_at_ms,
        }),
        Field::Absent | Field::Dead { .. } => None,
    };
    for field in fields {
        while let Some(change) = changes.next_if(|c| c.0 < field.name) {
            merged.extend(packed(change));
        }
        match changes.next_if(|c| c.0 == field.name) {
            Some(change) => merged.extend(packed(change)),
            None if field.expires_at_ms.is_none_or(|at| at > now_ms) => merged.push(field),
            None => {}
        }
    }
    merged.extend(changes.filter_map(packed));
    let fields = merged;
    if fields.is_empty() {
        return Repacked::Empty;
    }
    let packed = format::packed_bytes(&fields);
    if fields.len() <= PACKED_MAX_FIELDS && packed.len() <= room {
        Repacked::Packed(packed)
    } else {
        Repacked::Grown(fields)
    }
}

/// The engine write of a hash's new header over `current`: the key's expiry is kept. A
/// large hash's header takes a new CAS version at every write of the hash, which a
/// streamed HGETALL checks between its parts (a packed header, read whole at once,
/// needs none and is spared its bytes).
fn header_put(header: Vec<u8>, current: Option<&Item>) -> Update {
    Update::Put {
        options: PutOptions {
            expires_at_ms: current.and_then(|c| c.expires_at_ms),
            collection: true,
            assign_cas: format::is_elements(&header),
            ..PutOptions::default()
        },
        value: header,
    }
}

/// The live elements of a large hash as of `now_ms`; `None` if it is partial. Without
/// expiring fields its keys are counted, no value read; with some, its live fields are
/// counted a page at a time.
fn live_elements(keys: &Keyspace, header: Header, now_ms: u64) -> Result<Option<u64>> {
    if !elements::whole(keys, header)? {
        return Ok(None);
    }
    if header.volatile == 0 {
        return Ok(Some(header.elements));
    }
    let (mut live, mut after) = (0, None);
    loop {
        let page = elements::walk(
            keys,
            header.id,
            after.as_deref(),
            LEN_PAGE,
            usize::MAX,
            Part::Fields,
            now_ms,
        )?;
        live += page.live.len() as u64;
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(Some(live)),
        }
    }
}

/// A lock `try_lock` gives, tried [`SPINS`] times with a pause between, else `wait`ed for.
fn spin_then_wait<G>(try_lock: impl Fn() -> Option<G>, wait: impl FnOnce() -> G) -> G {
    for _ in 0..SPINS {
        if let Some(locked) = try_lock() {
            return locked;
        }
        std::hint::spin_loop();
    }
    wait()
}

/// What DEL found at a key.
enum Deleting {
    Nothing,
    Deleted,
    Hash,
}

/// The hashes of one server: their ids and their locks.
pub struct Hashes {
    serial: AtomicU64,
    stripes: Box<[Stripe]>,
    hasher: foldhash::fast::FixedState,
}

/// The hash commands of the keys whose hash falls in one stripe.
#[derive(Default)]
struct Stripe {
    lock: RwLock<()>,
    /// The large hash last met here: a command on one field takes the shared way
    /// (`one_field.rs`) only if there is one, and skips reading the header of that one.
    last_large: LastLarge,
}

impl Default for Hashes {
    fn default() -> Self {
        Hashes {
            serial: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
            hasher: foldhash::fast::FixedState::default(),
        }
    }
}

impl Hashes {
    fn stripe(&self, key: &[u8]) -> usize {
        self.hasher.hash_one(key) as usize % STRIPES
    }

    /// The stripe lock of `key`, held alone: tried `SPINS` times, then waited for.
    fn lock(&self, key: &[u8]) -> RwLockWriteGuard<'_, ()> {
        let stripe = &self.stripes[self.stripe(key)].lock;
        spin_then_wait(|| stripe.try_write(), || stripe.write())
    }

    /// The stripe lock of `key`, shared with the other commands on one field of a
    /// large hash (`one_field.rs`).
    fn lock_shared(&self, key: &[u8]) -> RwLockReadGuard<'_, ()> {
        let stripe = &self.stripes[self.stripe(key)].lock;
        spin_then_wait(|| stripe.try_read(), || stripe.read())
    }

    fn new_id(&self, keys: &Keyspace) -> HashId {
        HashId {
            epoch: keys.engine().run_epoch(),
            serial: self.serial.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The bytes a packed header at `key` may take: it is one medium object.
    fn packed_room(keys: &Keyspace, key: &[u8]) -> usize {
        keys.engine()
            .config()
            .medium_max
            .saturating_sub(key.len())
            .min(PACKED_MAX_BYTES)
    }

    /// The longest field a hash may hold: an element's key is the engine's.
    pub fn max_field(keys: &Keyspace) -> usize {
        keys.engine()
            .config()
            .max_key_size
            .saturating_sub(ELEMENT_KEY_OVERHEAD)
    }

    /// The hash at `key`, `None` if there is none; a string is the wrong type. A header
    /// whose bytes are not one is dropped, as a cache drops what it cannot read.
    fn header(&self, keys: &Keyspace, key: &[u8]) -> Result<Option<Read>> {
        // may do I/O: one SSD block
        let Some(item) = keys.get_item(key, GetOptions::default())? else {
            return Ok(None);
        };
        // The header's bytes are moved into the `Read`, not copied: every HGETALL reads one.
        match layout_of(&item)? {
            Some(layout) => Ok(Some(Read {
                bytes: item.value,
                layout,
                version: item.cas,
            })),
            None => {
                self.commit(keys, key, Some(&item.value), None)?;
                Ok(None)
            }
        }
    }

    /// Stores the header `new` (or deletes the key, `None`) if `key` still holds the
    /// header bytes `read` (or nothing, `read` `None`); false if a string write or an
    /// expiry changed it, and the command starts again. The key's expiry is kept.
    fn commit(
        &self,
        keys: &Keyspace,
        key: &[u8],
        read: Option<&[u8]>,
        new: Option<Vec<u8>>,
    ) -> Result<bool> {
        // may do I/O: one SSD block; may evict
        let (committed, _) = keys.update(key, |current| {
            let same = match read {
                None => current.is_none(),
                Some(read) => current.is_some_and(|c| c.collection && c.value == read),
            };
            if !same {
                return (Update::Keep, false);
            }
            let update = match new {
                None => Update::Delete,
                Some(header) => header_put(header, current),
            };
            (update, true)
        })?;
        Ok(committed)
    }

    fn check_fields<'a>(
        &self,
        keys: &Keyspace,
        fields: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<()> {
        let max = Self::max_field(keys);
        match fields.into_iter().any(|f| f.len() > max) {
            true => Err(HashError::FieldTooLong { max }),
            false => Ok(()),
        }
    }

    /// Runs `run` on the fields `names` of the hash at `key` — each shown as it is, and
    /// as `run` left it for the names after it (a name repeated sees its first change,
    /// as Redis runs a command's fields in order) — then stores what changed, the header
    /// last (and runs the command again if a string write replaced the hash meanwhile).
    /// A dead field met is deleted. Without a hash at `key`: `None` unless `create`,
    /// which edits a new one.
    ///
    /// A command that may create the hash edits a packed one (or none) in one engine
    /// update of its header ([`Hashes::edit_packed`]): the header is not read before it.
    fn edit<T>(
        &self,
        keys: &Keyspace,
        key: &[u8],
        names: &[&[u8]],
        create: bool,
        mut run: impl FnMut(&mut Edit) -> T,
    ) -> Result<Option<T>> {
        let stripe = &self.stripes[self.stripe(key)];
        if let [name] = names
            && stripe.last_large.any()
            && let Some(out) = self.edit_one_element(keys, key, name, &mut run)?
        {
            return Ok(Some(out));
        }
        let max_field = Self::max_field(keys);
        loop {
            let _locked = self.lock(key);
            let now_ms = keys.engine().now_ms();
            // A command naming more fields than a packed hash holds is edited outside
            // the update, which holds the header's leaf locked while it runs.
            let read = if create && names.len() <= PACKED_MAX_FIELDS {
                // may do I/O: one SSD block; may evict
                match self.edit_packed(keys, key, names, now_ms, &mut run)? {
                    InHeader::Done(out) => return Ok(Some(out)),
                    InHeader::Elements(read) => read,
                }
            } else {
                self.header(keys, key)?
            };
            if read.is_none() && !create {
                return Ok(None);
            }
            let mut edit = Edit::of(now_ms, names, |name| {
                Ok(match read.as_ref().map(|r| (&r.bytes, &r.layout)) {
                    Some((bytes, Layout::Packed(fields))) => {
                        packed_field(bytes, fields, name, now_ms)
                    }
                    // A field too long for an element's key was never stored.
                    Some((_, Layout::Elements(header))) if name.len() <= max_field => {
                        elements::read(keys, header.id, name)?
                    }
                    _ => Field::Absent,
                })
            })?;
            let out = run(&mut edit);
            let changes = edit.changes(max_field)?;
            if changes.is_empty() {
                return Ok(Some(out));
            }
            let (bytes, layout) = read.map(|r| (r.bytes, r.layout)).unzip();
            let new = match layout {
                Some(Layout::Elements(header)) => self.change_elements(keys, header, changes)?,
                Some(Layout::Packed(fields)) => {
                    let bytes = bytes.as_deref().unwrap_or_default();
                    let fields = fields.iter().map(|f| f.to_packed(bytes)).collect();
                    self.change_packed(keys, key, fields, changes, now_ms)?
                }
                None => self.change_packed(keys, key, Vec::new(), changes, now_ms)?,
            };
            // A packed header is not decoded again for this.
            let large = match new.as_deref().filter(|n| format::is_elements(n)) {
                Some(bytes) => match Layout::decode(bytes) {
                    Some(Layout::Elements(header)) => Some(header),
                    _ => None,
                },
                None => None,
            };
            if self.commit(keys, key, bytes.as_deref(), new)? {
                if let Some(header) = large {
                    stripe.last_large.remember(key, header);
                }
                return Ok(Some(out));
            }
        }
    }

    /// [`Hashes::edit`] of a packed hash (or of none, which it creates) as one engine
    /// update of its header, counted as the read the GET before it was: `run` edits the
    /// fields as the update reads them, and the header they make is stored in the same
    /// update (a header that is not one is dropped). A large hash, or one the command
    /// grows past a packed one, is left as it is: its elements are written outside the
    /// update, which holds the header's leaf locked (`InHeader::Elements`).
    fn edit_packed<T>(
        &self,
        keys: &Keyspace,
        key: &[u8],
        names: &[&[u8]],
        now_ms: u64,
        run: &mut impl FnMut(&mut Edit) -> T,
    ) -> Result<InHeader<T>> {
        let (max_field, room) = (Self::max_field(keys), Self::packed_room(keys, key));
        // may do I/O: one SSD block; may evict
        let (outcome, _) = keys.update_as_read(key, |current| {
            let layout = match current.map(layout_of).transpose() {
                Ok(layout) => layout.flatten(),
                Err(wrong_type) => return (Update::Keep, Err(wrong_type)),
            };
            // A header whose bytes are not one is dropped unless the command stores one.
            let otherwise = match (current, &layout) {
                (Some(_), None) => Update::Delete,
                _ => Update::Keep,
            };
            // The hash as read, for a command that goes on outside the update.
            let read = || current.and_then(|item| Read::of(item).ok().flatten());
            let bytes = current.map_or(&[][..], |item| &item.value[..]);
            let fields = match layout {
                None => Vec::new(),
                Some(Layout::Packed(fields)) => fields,
                Some(Layout::Elements(_)) => return (otherwise, Ok(InHeader::Elements(read()))),
            };
            let found = |name: &[u8]| Ok(packed_field(bytes, &fields, name, now_ms));
            let mut edit = match Edit::of(now_ms, names, found) {
                Ok(edit) => edit,
                Err(error) => return (otherwise, Err(error)),
            };
            let out = run(&mut edit);
            let changes = match edit.changes(max_field) {
                Ok(changes) if changes.is_empty() => return (otherwise, Ok(InHeader::Done(out))),
                Ok(changes) => changes,
                Err(error) => return (otherwise, Err(error)),
            };
            let fields = fields.iter().map(|f| f.to_packed(bytes)).collect();
            match repack(fields, changes, now_ms, room) {
                Repacked::Empty => (Update::Delete, Ok(InHeader::Done(out))),
                Repacked::Packed(header) => (header_put(header, current), Ok(InHeader::Done(out))),
                Repacked::Grown(_) => (otherwise, Ok(InHeader::Elements(read()))),
            }
        })?;
        outcome
    }

    /// [`Hashes::edit`] for a command that only reads: a packed hash is one object, read
    /// whole at once, so `run` runs on it without the lock (readers of one hot session on
    /// both threads queued on it); one field of a large hash is read under the shared
    /// lock ([`Hashes::read_one_element`]). Several fields of a large hash, or an expired
    /// field met (deleted), are edited under the lock.
    fn read<T>(
        &self,
        keys: &Keyspace,
        key: &[u8],
        names: &[&[u8]],
        mut run: impl FnMut(&mut Edit) -> T,
    ) -> Result<Option<T>> {
        if let [name] = names
            && let Some(out) = self.read_one_element(keys, key, name, &mut run)?
        {
            return Ok(Some(out));
        }
        let now_ms = keys.engine().now_ms();
        let Some(read) = self.header(keys, key)? else {
            return Ok(None);
        };
        match &read.layout {
            Layout::Packed(fields) => {
                let found = |name: &[u8]| Ok(packed_field(&read.bytes, fields, name, now_ms));
                let mut edit = Edit::of(now_ms, names, found)?;
                let out = run(&mut edit);
                if edit.changes(usize::MAX)?.is_empty() {
                    return Ok(Some(out));
                }
            }
            // The next read of one field of it takes the way above.
            Layout::Elements(header) => self.stripes[self.stripe(key)]
                .last_large
                .remember(key, *header),
        }
        self.edit(keys, key, names, false, run)
    }

    /// Writes and deletes the elements `changes` name; the header that counts them
    /// (`None`: the hash is empty).
    fn change_elements(
        &self,
        keys: &Keyspace,
        mut header: Header,
        changes: Vec<(Vec<u8>, Field, Field)>,
    ) -> Result<Option<Vec<u8>>> {
        let added = changes
            .iter()
            .filter(|(_, before, _)| *before == Field::Absent)
            .count() as u64;
        if header.elements.saturating_add(added) > MAX_FIELDS {
            return Err(HashError::TooManyFields);
        }
        for (name, before, after) in changes {
            match after {
                Field::Live {
                    value,
                    expires_at_ms,
                } => {
                    // may evict
                    elements::write(keys, header.id, &name, &value, expires_at_ms)?;
                    count(&mut header, &before, Some(expires_at_ms.is_some()));
                }
                _ => {
                    // may do I/O: one SSD block
                    if elements::delete(keys, header.id, &name)? != Field::Absent {
                        count(&mut header, &before, None);
                    }
                }
            }
        }
        Ok((header.elements > 0).then(|| header.encode()))
    }

    /// A packed hash's fields with `changes` made (and its expired fields dropped):
    /// packed again if they fit, else written as elements of a new id; the header
    /// (`None`: the hash is empty).
    fn change_packed(
        &self,
        keys: &Keyspace,
        key: &[u8],
        fields: Vec<Packed>,
        changes: Vec<(Vec<u8>, Field, Field)>,
        now_ms: u64,
    ) -> Result<Option<Vec<u8>>> {
        let fields = match repack(fields, changes, now_ms, Self::packed_room(keys, key)) {
            Repacked::Empty => return Ok(None),
            Repacked::Packed(header) => return Ok(Some(header)),
            Repacked::Grown(fields) => fields,
        };
        if fields.len() as u64 > MAX_FIELDS {
            return Err(HashError::TooManyFields);
        }
        // Grown past a packed hash: its fields become elements of a new id.
        let mut header = Header {
            id: self.new_id(keys),
            elements: 0,
            volatile: 0,
        };
        for field in &fields {
            // may evict
            elements::write(
                keys,
                header.id,
                &field.name,
                &field.value,
                field.expires_at_ms,
            )?;
            count(
                &mut header,
                &Field::Absent,
                Some(field.expires_at_ms.is_some()),
            );
        }
        Ok(Some(header.encode()))
    }

    /// HSET / HMSET / HSETNX: stores each `(field, value)` of `pairs`, without expiry
    /// (a field named twice keeps its last value); the number of fields that held none.
    /// `only_new`: nothing is stored if a field holds a value (HSETNX).
    pub fn set(&self, keys: &Keyspace, key: &[u8], pairs: &[&[u8]], only_new: bool) -> Result<u64> {
        self.check_fields(keys, pairs.iter().step_by(2).copied())?;
        let names: Vec<&[u8]> = pairs.iter().step_by(2).copied().collect();
        let added = self.edit(keys, key, &names, true, |edit| {
            if only_new && names.iter().any(|n| edit.get(n).is_live()) {
                return 0;
            }
            let mut added = 0;
            for pair in pairs.chunks_exact(2) {
                added += u64::from(!edit.get(pair[0]).is_live());
                edit.set(pair[0], Field::live(pair[1], None));
            }
            added
        })?;
        Ok(added.unwrap_or_default())
    }

    /// HSETEX: stores each `(field, value)` of `pairs` with `expiry` (`Keep`: each field's
    /// own), if `condition` holds for them all (FNX: none holds a value; FXX: each does).
    pub fn set_expiring(
        &self,
        keys: &Keyspace,
        key: &[u8],
        pairs: &[&[u8]],
        condition: Exists,
        expiry: FieldExpiry,
    ) -> Result<bool> {
        self.check_fields(keys, pairs.iter().step_by(2).copied())?;
        let names: Vec<&[u8]> = pairs.iter().step_by(2).copied().collect();
        let done = self.edit(keys, key, &names, true, |edit| {
            let live = |edit: &Edit, n: &[u8]| edit.get(n).is_live();
            let holds = match condition {
                Exists::Any => true,
                Exists::None => !names.iter().any(|n| live(edit, n)),
                Exists::All => names.iter().all(|n| live(edit, n)),
            };
            if holds {
                for pair in pairs.chunks_exact(2) {
                    let at = expiry.resolve(edit.get(pair[0]));
                    let new = edit.at(Field::live(pair[1], None), at);
                    edit.set(pair[0], new);
                }
            }
            holds
        })?;
        Ok(done.unwrap_or_default())
    }

    /// HGET / HMGET / HEXISTS / HSTRLEN: the values of `fields`; `None` if the key holds
    /// no hash. Values past `budget` bytes together are refused (a field may be named
    /// any number of times).
    pub fn get(
        &self,
        keys: &Keyspace,
        key: &[u8],
        fields: &[&[u8]],
        budget: usize,
    ) -> Result<Option<Vec<Option<Vec<u8>>>>> {
        let values = self.read(keys, key, fields, |edit| values(edit, fields, budget))?;
        values
            .map(|v| v.ok_or(HashError::TooLarge { budget }))
            .transpose()
    }

    /// HGETEX / HGETDEL: the values of `fields`, then each field that holds one changed
    /// as `change` says. Values past `budget` bytes together are refused, and then
    /// nothing changes.
    pub fn get_and_change(
        &self,
        keys: &Keyspace,
        key: &[u8],
        fields: &[&[u8]],
        change: Option<FieldChange>,
        budget: usize,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let values = self.edit(keys, key, fields, false, |edit| {
            let values = values(edit, fields, budget)?;
            for &field in fields {
                let changed = match (change, edit.get(field).clone()) {
                    (Some(FieldChange::Delete), Field::Live { .. }) => Field::Absent,
                    (Some(FieldChange::Expire(expiry)), live @ Field::Live { .. }) => {
                        let at = expiry.resolve(&live);
                        edit.at(live, at)
                    }
                    _ => continue,
                };
                edit.set(field, changed);
            }
            Some(values)
        })?;
        match values {
            None => Ok(vec![None; fields.len()]),
            Some(values) => values.ok_or(HashError::TooLarge { budget }),
        }
    }

    /// HDEL: deletes `fields`; how many held a value.
    pub fn delete_fields(&self, keys: &Keyspace, key: &[u8], fields: &[&[u8]]) -> Result<u64> {
        let deleted = self.edit(keys, key, fields, false, |edit| {
            let mut deleted = 0;
            for field in fields {
                deleted += u64::from(edit.get(field).is_live());
                edit.set(field, Field::Absent);
            }
            deleted
        })?;
        Ok(deleted.unwrap_or_default())
    }

    /// HINCRBY / HINCRBYFLOAT: `next` turns the field's value (if any) into the new one,
    /// stored with the field's expiry kept. `next`'s error leaves the hash as it was.
    pub fn update_field<E>(
        &self,
        keys: &Keyspace,
        key: &[u8],
        field: &[u8],
        next: impl Fn(Option<&[u8]>) -> std::result::Result<Vec<u8>, E>,
    ) -> Result<std::result::Result<Vec<u8>, E>> {
        self.check_fields(keys, [field])?;
        let new = self.edit(keys, key, &[field], true, |edit| {
            let (old, expires_at_ms) = match edit.get(field) {
                Field::Live {
                    value,
                    expires_at_ms,
                } => (Some(value.as_slice()), *expires_at_ms),
                _ => (None, None),
            };
            let new = next(old)?;
            edit.set(field, Field::live(&new, expires_at_ms));
            Ok(new)
        })?;
        Ok(new.expect("a hash edited with `create`"))
    }

    /// HEXPIRE family: each field's expiry set to `at` if `condition` allows, with
    /// Redis's codes: -2 no such field, 0 the condition does not hold, 1 set, 2 deleted
    /// (`at` is past).
    pub fn expire_fields(
        &self,
        keys: &Keyspace,
        key: &[u8],
        fields: &[&[u8]],
        at: u64,
        condition: ExpiryCondition,
    ) -> Result<Vec<i64>> {
        let codes = self.edit(keys, key, fields, false, |edit| {
            let mut codes = Vec::with_capacity(fields.len());
            for &field in fields {
                let found = edit.get(field).clone();
                let Field::Live { expires_at_ms, .. } = found else {
                    codes.push(NO_FIELD);
                    continue;
                };
                if !condition.allows(expires_at_ms, at) {
                    codes.push(0);
                    continue;
                }
                let changed = edit.at(found, Some(at));
                codes.push(if changed.is_live() { 1 } else { 2 });
                edit.set(field, changed);
            }
            codes
        })?;
        Ok(codes.unwrap_or_else(|| vec![NO_FIELD; fields.len()]))
    }

    /// HPERSIST: each field's expiry removed, with Redis's codes: -2 no such field, -1
    /// no expiry, 1 removed.
    pub fn persist_fields(
        &self,
        keys: &Keyspace,
        key: &[u8],
        fields: &[&[u8]],
    ) -> Result<Vec<i64>> {
        let codes = self.edit(keys, key, fields, false, |edit| {
            let mut codes = Vec::with_capacity(fields.len());
            for &field in fields {
                let code = match edit.get(field).clone() {
                    Field::Live {
                        expires_at_ms: None,
                        ..
                    } => NO_EXPIRY,
                    Field::Live { value, .. } => {
                        edit.set(
                            field,
                            Field::Live {
                                value,
                                expires_at_ms: None,
                            },
                        );
                        1
                    }
                    _ => NO_FIELD,
                };
                codes.push(code);
            }
            codes
        })?;
        Ok(codes.unwrap_or_else(|| vec![NO_FIELD; fields.len()]))
    }

    /// HTTL family: each field's expiry — `None` no such field, `Some(None)` none.
    pub fn field_expiries(
        &self,
        keys: &Keyspace,
        key: &[u8],
        fields: &[&[u8]],
    ) -> Result<Vec<Option<Option<u64>>>> {
        let expiries = self.read(keys, key, fields, |edit| {
            fields
                .iter()
                .map(|f| match edit.get(f) {
                    Field::Live { expires_at_ms, .. } => Some(*expires_at_ms),
                    _ => None,
                })
                .collect()
        })?;
        Ok(expiries.unwrap_or_else(|| vec![None; fields.len()]))
    }

    /// HGETALL / HKEYS / HVALS: every live field and value in field order, as `part`
    /// says (the other half empty); nothing if the key holds no hash, or if the hash was
    /// partial (then it is dropped). A reply past `budget` bytes is refused.
    pub fn all(&self, keys: &Keyspace, key: &[u8], part: Part, budget: usize) -> Result<Pairs> {
        let (live, _) = self.read_whole(keys, key, None, usize::MAX, part, budget)?;
        Ok(live)
    }

    /// HSCAN: the live fields after `after` (from the first if `None`), `count` fields
    /// examined at most and fewer past `budget` bytes, and the field to go on after
    /// (`None`: the hash ended).
    pub fn scan(
        &self,
        keys: &Keyspace,
        key: &[u8],
        after: Option<&[u8]>,
        count: usize,
        part: Part,
        budget: usize,
    ) -> Result<(Pairs, Option<Vec<u8>>)> {
        self.read_whole(keys, key, after, count, part, budget)
    }

    /// HLEN: the fields holding a value; 0 if the key holds no hash, or if the hash was
    /// partial (then it is dropped). A large hash without expiring fields has its keys
    /// counted, no value read; with some, its live fields are counted a page at a time.
    pub fn len(&self, keys: &Keyspace, key: &[u8]) -> Result<u64> {
        let Some((read, _locked)) = self.header_to_read_whole(keys, key)? else {
            return Ok(0);
        };
        let header = match read.layout {
            Layout::Packed(fields) => {
                let now_ms = keys.engine().now_ms();
                let live = fields
                    .iter()
                    .filter(|f| f.expires_at_ms.is_none_or(|at| at > now_ms))
                    .count();
                return Ok(live as u64);
            }
            Layout::Elements(header) => header,
        };
        match live_elements(keys, header, keys.engine().now_ms())? {
            Some(live) => Ok(live),
            None => {
                self.drop_partial(keys, key, header)?;
                Ok(0)
            }
        }
    }

    /// The hash at `key` for a command that reads it whole (HGETALL and its kin, HLEN),
    /// and the lock the reading needs: a packed hash is one object, read whole at once,
    /// so none (readers of one hot session on both threads queued on it); a large one's
    /// header and elements are read under the lock, the header again.
    fn header_to_read_whole(
        &self,
        keys: &Keyspace,
        key: &[u8],
    ) -> Result<Option<(Read, Option<RwLockWriteGuard<'_, ()>>)>> {
        let Some(read) = self.header(keys, key)? else {
            return Ok(None);
        };
        if let Layout::Packed(_) = read.layout {
            return Ok(Some((read, None)));
        }
        let locked = self.lock(key);
        Ok(self.header(keys, key)?.map(|again| (again, Some(locked))))
    }

    /// The live fields of the hash at `key` after `after`, `limit` fields examined at
    /// most and none past the one that takes the reply past `budget`, and the field to
    /// go on after if some are left. A read of the whole hash (`limit` unbounded) past
    /// `budget` is refused; one from its start checks that the hash is whole (a partial
    /// one is dropped and reads as empty). Dead fields met are deleted.
    fn read_whole(
        &self,
        keys: &Keyspace,
        key: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        part: Part,
        budget: usize,
    ) -> Result<(Pairs, Option<Vec<u8>>)> {
        let (live, dead, next) = {
            let Some((read, _locked)) = self.header_to_read_whole(keys, key)? else {
                return Ok((Vec::new(), None));
            };
            match read.layout {
                Layout::Packed(fields) => {
                    let now_ms = keys.engine().now_ms();
                    let (mut live, mut dead, mut bytes) = (Vec::new(), Vec::new(), 0);
                    let mut next = None;
                    let from =
                        fields.partition_point(|f| after.is_some_and(|a| f.name(&read.bytes) <= a));
                    // The last one examined, live or dead, is where a scan goes on (`limit`
                    // is at least 1).
                    let mut last_live = false;
                    for (examined, field) in fields.iter().skip(from).enumerate() {
                        if examined == limit || bytes > budget {
                            next = match last_live {
                                true => live.last().map(|(name, _): &(Vec<u8>, _)| name.clone()),
                                false => dead.last().cloned(),
                            };
                            break;
                        }
                        last_live = field.expires_at_ms.is_none_or(|t| t > now_ms);
                        let name = field.name(&read.bytes);
                        if !last_live {
                            dead.push(name.to_vec());
                            continue;
                        }
                        let value = field.value(&read.bytes);
                        bytes += part.bytes(name, value) + 2 * REPLY_OVERHEAD;
                        live.push(part.keep(name.to_vec(), value.to_vec()));
                    }
                    (live, dead, next)
                }
                Layout::Elements(header) => {
                    if after.is_none() && limit != usize::MAX && !elements::whole(keys, header)? {
                        self.drop_partial(keys, key, header)?;
                        return Ok((Vec::new(), None));
                    }
                    let now_ms = keys.engine().now_ms();
                    let walked =
                        elements::walk(keys, header.id, after, limit, budget, part, now_ms)?;
                    if limit == usize::MAX
                        && walked.next.is_none()
                        && walked.elements != header.elements
                    {
                        self.drop_partial(keys, key, header)?;
                        return Ok((Vec::new(), None));
                    }
                    (walked.live, walked.dead, walked.next)
                }
            }
        };
        if limit == usize::MAX && next.is_some() {
            return Err(HashError::TooLarge { budget });
        }
        if !dead.is_empty() {
            let names: Vec<&[u8]> = dead.iter().map(Vec::as_slice).collect();
            self.edit(keys, key, &names, false, |_| ())?;
        }
        Ok((live, next))
    }

    /// Deletes a hash found partial: its header, then what is left of its elements.
    fn drop_partial(&self, keys: &Keyspace, key: &[u8], header: Header) -> Result<()> {
        let bytes = header.encode();
        if self.commit(keys, key, Some(&bytes), None)? {
            elements::delete_all(keys, header.id)?;
        }
        Ok(())
    }

    /// DEL / UNLINK of any key: a string in one engine update; a hash's header, then its
    /// elements. Whether the key held anything.
    pub fn delete_key(&self, keys: &Keyspace, key: &[u8]) -> Result<bool> {
        // may do I/O: one SSD block; no large extent
        let (found, _) = keys.update_meta(key, |current| match current {
            None => (Update::Keep, Deleting::Nothing),
            Some(info) if info.collection => (Update::Keep, Deleting::Hash),
            Some(_) => (Update::Delete, Deleting::Deleted),
        })?;
        match found {
            Deleting::Nothing => Ok(false),
            Deleting::Deleted => Ok(true),
            Deleting::Hash => {
                let _locked = self.lock(key);
                self.delete_hash_locked(keys, key)
            }
        }
    }

    /// `delete_key` of a key found holding a hash, its stripe lock held: its header, then
    /// its elements (whatever replaced it meanwhile is deleted instead). Whether the key
    /// held anything.
    fn delete_hash_locked(&self, keys: &Keyspace, key: &[u8]) -> Result<bool> {
        let read = match self.header(keys, key) {
            Ok(Some(read)) => read,
            // Replaced by a string meanwhile: DEL deletes whatever is there.
            Ok(None) | Err(HashError::WrongType) => {
                return keys.delete(key).map_err(Into::into);
            }
            Err(error) => return Err(error),
        };
        if self.commit(keys, key, Some(&read.bytes), None)?
            && let Layout::Elements(header) = read.layout
        {
            elements::delete_all(keys, header.id)?;
        }
        Ok(true)
    }
}

/// TYPE's name for what `info` describes.
pub fn type_name(info: &ItemInfo) -> &'static str {
    // Every collection is a hash so far; a set or a sorted set would be told apart by
    // its header's first byte.
    if info.collection { "hash" } else { "string" }
}
