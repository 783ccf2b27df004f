//! SSD reads in flight while the runtime thread serves other connections.
//!
//! Sessions execute requests synchronously (`Session::step`). Before a request runs, its
//! session tells [`Prefetch::admit`] what it does to the store ([`Access`]). A plain read names
//! the keys it will read: each GET begins through `ZipCache::get_item_async`; DRAM and
//! BT_LO answer at once, an SSD read goes in flight. If any is in flight the step returns
//! `Step::Await` without executing anything; the connection task writes the replies so
//! far and awaits the oldest read ([`Prefetch::settle`]; its thread meanwhile serves
//! other connections), then runs the step again, and the command takes its answers from
//! here through [`Prefetch::get_item`], which matches them by key and by how the GET reads
//! (`GetOptions`: a peek leaves the access state a GET marks, so one cannot stand in for
//! the other).
//!
//! Before awaiting, the reads pipelined behind it start too ([`ReadAhead`]), so that a
//! pipeline's reads are in flight together — also past writes of other keys (a
//! look-aside client pipelines the SETs that fill its misses between its GETs): a
//! read-ahead stops only at a request whose keys it cannot name, or at a read of a key
//! that a request before it may change. Each reply goes out once its own reads are in,
//! not when the pipeline's last read is; the requests behind are walked once
//! ([`Prefetch::walk_once`]), not at every await.
//!
//! Memory: every byte a `Prefetch` holds is charged to its connection's share of the
//! budget for all connections' buffers ([`ConnectionBuffers`]) as it is taken: the buffer
//! of each read in flight (a BT_LO read holds its whole extent) from the moment it starts,
//! then its decoded answer, and the hit held. A read-ahead stops once the reads and
//! answers hold [`MAX_HELD_BYTES`] or the budget for all connections is spent: the
//! request then waits until earlier replies drain (back-pressure, not an error). The
//! front request's next key is still read past this connection's share and past the
//! budget for all, one at a time however large. A large object's read (BT_LO's whole
//! extent) passes the budget by its overdraft at most, then waits for room
//! ([`ConnectionBuffers::room`]), so that a crowd of connections does not each pass the
//! budget by a megabyte; a read of one SSD block never waits, so that a well-behaved
//! client's small reads are not held behind readers that never read their replies.
//!
//! Owner: each connection task holds its `Prefetch` and hands it to every request it runs
//! (`Session::step`'s `reads`), synchronously: no other connection's request can run in
//! between, so no answer crosses connections. An answer is taken by the GET that uses it;
//! a request that may change keys drops their answers before it runs, one whose keys are
//! unknown drops them all, and so does the connection once it has run every complete
//! request ([`Prefetch::clear`]). A request is answered with what the store held at some
//! moment after it arrived and before its reply.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use foldhash::fast::RandomState;
use zipcache::{AsyncGet, GetOptions, Item};

use super::buffer_budget::ConnectionBuffers;
use crate::core::keyspace::Keyspace;

/// SSD reads one connection may have in flight: a request naming more keys runs as far
/// as its answers allow, awaits, and resumes (`Step::Partial`).
const MAX_READS: usize = 64;
/// Answers one connection may hold, and the bytes its reads in flight and answers may
/// hold (read buffers, keys and values) before it stops reading ahead: one read may hold a
/// 1 MiB item's extent. A read starts while they are under this, and is charged as it
/// starts, so they pass it by one read at most. The front request's next key is read
/// past them, so it can always progress.
const MAX_ANSWERS: usize = 1024;
const MAX_HELD_BYTES: usize = 1 << 20;
/// Keys past the answered ones a request's admission looks at, starting their reads: it
/// bounds the work of each step of a request naming many keys.
const LOOK_AHEAD: usize = MAX_READS;

/// A GET as a prefetched answer is matched to it.
type Get = (Vec<u8>, GetOptions);
type Answer = zipcache::Result<Option<Item>>;

enum Fetch {
    Reading(AsyncGet),
    Answered(Answer),
}

/// What a GET started weighs: the bytes it holds (its key, and its read's buffer while in
/// flight, then its answer's value), and whether it is an answer.
fn weigh(key: &[u8], fetch: &Fetch) -> (usize, bool) {
    match fetch {
        Fetch::Reading(read) => (key.len() + read.buffer_bytes(), false),
        Fetch::Answered(answer) => {
            let value = answer.as_ref().ok().and_then(Option::as_ref);
            (key.len() + value.map_or(0, |i| i.value.len()), true)
        }
    }
}

/// The GETs started for the requests at the front of one connection's input.
pub struct Prefetch {
    /// The connection's share of the budget for all connections' buffers: what this
    /// holds is charged to it.
    buffers: Arc<ConnectionBuffers>,
    /// Every GET started and not yet taken, by key, then by how it reads (a key is read
    /// at most twice: plainly and as a peek).
    fetches: HashMap<Vec<u8>, Vec<(GetOptions, Fetch)>, RandomState>,
    /// The GETs in flight, in the order they started (the front request's first).
    reading: VecDeque<Get>,
    answers: usize,
    /// The bytes the GETs in `fetches` hold ([`weigh`]), charged to `buffers`.
    held_bytes: usize,
    /// The GETs the request at the front was admitted with (`admit`): what it leaves of
    /// them is dropped once it ends ([`request_done`]), however it ends.
    front: Vec<Get>,
    /// The key the request at the front rewrites from its current value
    /// ([`Access::Rewrites`]): a walk behind it starts no read of that key.
    front_rewrites: Option<Vec<u8>>,
    /// Bytes of input, from the front request on, that the last read-ahead walked: while
    /// the front lies within them, walking again would only find what was started.
    walked: usize,
    /// The last hit a GET took ([`Prefetch::get_shared`]): the same GET repeated answers
    /// from it. Its value is charged to `buffers` too.
    held: Option<(Get, Arc<Item>)>,
    /// The keyspace's generations when the answers held were read
    /// ([`Keyspace::changes`]).
    generations_seen: u64,
    /// The front request's next read waits for every connection's buffers to fall within
    /// the budget's overdraft ([`Prefetch::settle`]).
    awaiting_room: bool,
}

/// The bytes of the hit held.
fn hit_bytes(held: &Option<(Get, Arc<Item>)>) -> usize {
    held.as_ref().map_or(0, |(_, item)| item.value.len())
}

/// Sessions driven without a connection (`fuzzing`, tests) charge a budget of their own,
/// unlimited.
impl Default for Prefetch {
    fn default() -> Prefetch {
        let budget = super::buffer_budget::BufferBudget::new(usize::MAX);
        Prefetch::new(Arc::new(budget.register()))
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        for (key, fetches) in std::mem::take(&mut self.fetches) {
            for (_, fetch) in fetches {
                self.drop_fetch(&key, fetch);
            }
        }
        self.buffers
            .release(self.held_bytes + hit_bytes(&self.held));
    }
}

/// A read in flight nobody will take ([`AsyncGet::abandon`]): its buffer is held until the
/// device completes it, so its charge stays on the connection's share until then, released
/// by a task on this thread (a connection closed by the budget dropped its reads in
/// flight, and a burst of such reads, uncharged, passed the budget:
/// `connections_reading_large_values_ahead_without_reading_replies`).
/// Without a runtime (sessions driven by tests), released at once.
fn abandon(buffers: &Arc<ConnectionBuffers>, read: AsyncGet, bytes: usize) {
    let (Some(freed), Ok(runtime)) = (read.abandon(), tokio::runtime::Handle::try_current()) else {
        buffers.release(bytes);
        return;
    };
    let buffers = buffers.clone();
    runtime.spawn(async move {
        freed.await;
        buffers.release(bytes);
    });
}

impl Prefetch {
    /// Nothing started yet; what it will hold is charged to `buffers`.
    pub fn new(buffers: Arc<ConnectionBuffers>) -> Prefetch {
        Prefetch {
            buffers,
            fetches: HashMap::default(),
            reading: VecDeque::new(),
            answers: 0,
            held_bytes: 0,
            front: Vec::new(),
            front_rewrites: None,
            walked: 0,
            held: None,
            generations_seen: 0,
            awaiting_room: false,
        }
    }

    /// Awaits the oldest read in flight (the front request's come first), then moves every
    /// read that has completed meanwhile to the ready answers: the connection then runs
    /// as far as its answers allow and writes those replies while later reads are still
    /// in flight, rather than holding every reply until the slowest read of the pipeline.
    /// With none in flight, awaits room for the front request's next read.
    pub async fn settle(&mut self) {
        let awaiting_room = std::mem::take(&mut self.awaiting_room);
        let Some((key, options)) = self.reading.pop_front() else {
            if awaiting_room {
                self.buffers.room().await;
            }
            return;
        };
        if let Some(Fetch::Reading(read)) = self.fetch_mut(&key, options) {
            let answer = read.await;
            self.answer(&key, options, answer);
        }
        let mut polled = Context::from_waker(Waker::noop());
        for (key, options) in std::mem::take(&mut self.reading) {
            let Some(Fetch::Reading(read)) = self.fetch_mut(&key, options) else {
                continue;
            };
            match Pin::new(read).poll(&mut polled) {
                Poll::Ready(answer) => self.answer(&key, options, answer),
                Poll::Pending => self.reading.push_back((key, options)),
            }
        }
    }

    /// Drops every answer and read in flight (a dropped read completes unobserved), and
    /// the hit held; their charges go with them (`Drop`).
    pub fn clear(&mut self) {
        let seen = self.generations_seen;
        *self = Prefetch::new(self.buffers.clone());
        self.generations_seen = seen;
    }

    /// Drops every answer if a slot's generation moved since they were read: a slot
    /// that went away and came back must not be answered from before
    /// (`core/keyspace.rs`).
    fn follow_generations(&mut self, cache: &Keyspace) {
        let now = cache.changes();
        if now != self.generations_seen {
            self.clear();
            self.generations_seen = now;
        }
    }

    /// The hit held, whose value is charged here: a reply that references it as well
    /// holds no more ([`super::output::Output::held_besides`]).
    pub fn held_item(&self) -> Option<&Arc<Item>> {
        self.held.as_ref().map(|(_, item)| item)
    }

    /// Holds `hit` (or none) in place of the hit held, charging the difference.
    fn hold_hit(&mut self, hit: Option<(Get, Arc<Item>)>) {
        self.buffers
            .recharge(hit_bytes(&self.held), hit_bytes(&hit));
        self.held = hit;
    }

    /// Counts a GET started or answered ([`weigh`]), and charges what it holds.
    fn hold(&mut self, (bytes, answer): (usize, bool)) {
        self.held_bytes += bytes;
        self.buffers.charge(bytes);
        self.answers += usize::from(answer);
    }

    /// Counts out a GET answered, taken or dropped, and releases what it held.
    fn let_go(&mut self, (bytes, answer): (usize, bool)) {
        self.held_bytes -= bytes;
        self.buffers.release(bytes);
        self.answers -= usize::from(answer);
    }

    /// Counts out a GET no request will take: an answer's bytes are released now, a read
    /// in flight's once the device is done with its buffer ([`abandon`]).
    fn drop_fetch(&mut self, key: &[u8], fetch: Fetch) {
        let (bytes, answer) = weigh(key, &fetch);
        self.held_bytes -= bytes;
        self.answers -= usize::from(answer);
        match fetch {
            Fetch::Answered(_) => self.buffers.release(bytes),
            Fetch::Reading(read) => abandon(&self.buffers, read, bytes),
        }
    }

    fn fetch_mut(&mut self, key: &[u8], options: GetOptions) -> Option<&mut Fetch> {
        let fetches = self.fetches.get_mut(key)?;
        let (_, fetch) = fetches.iter_mut().find(|(o, _)| *o == options)?;
        Some(fetch)
    }

    fn fetch(&self, key: &[u8], options: GetOptions) -> Option<&Fetch> {
        let fetches = self.fetches.get(key)?;
        fetches.iter().find(|(o, _)| *o == options).map(|(_, f)| f)
    }

    fn answered(&self, key: &[u8], options: GetOptions) -> bool {
        matches!(self.fetch(key, options), Some(Fetch::Answered(_)))
    }

    /// Records the answer of a read in flight (its place in `reading` is the caller's):
    /// its read buffer's charge becomes its value's.
    fn answer(&mut self, key: &[u8], options: GetOptions, answer: Answer) {
        let answered = Fetch::Answered(answer);
        let weight = weigh(key, &answered);
        if let Some(fetch) = self.fetch_mut(key, options) {
            let reading = std::mem::replace(fetch, answered);
            self.let_go(weigh(key, &reading));
            self.hold(weight);
        }
    }

    /// No room for another read or answer: this connection's share is spent, or every
    /// connection's together.
    fn full(&self) -> bool {
        self.reading.len() >= MAX_READS
            || self.answers >= MAX_ANSWERS
            || self.held_bytes >= MAX_HELD_BYTES
            || self.buffers.budget_spent()
    }

    /// Starts a GET of `key` (as `options` say).
    fn begin(&mut self, cache: &Keyspace, key: &[u8], options: GetOptions) {
        // may do I/O: an SSD read goes in flight
        let mut read = cache.get_item_async(key, options);
        let fetch = match read.take_ready() {
            Some(answer) => Fetch::Answered(answer),
            None => {
                self.reading.push_back((key.to_vec(), options));
                Fetch::Reading(read)
            }
        };
        self.hold(weigh(key, &fetch));
        self.fetches
            .entry(key.to_vec())
            .or_default()
            .push((options, fetch));
    }

    /// Starts, in order, GETs (as `options` say) of `keys` not yet started, as far as
    /// the caps allow, and returns how many of them, from the first, are answered — a key
    /// repeated among those counts once, as its answer is taken once. `front`: the
    /// request at the front, admitted with those answers (it drops what it leaves of them
    /// when it ends), whose first key starts even past the caps; a large object's read
    /// past the budget's overdraft waits for room (`settle`).
    fn start(
        &mut self,
        cache: &Keyspace,
        keys: &[&[u8]],
        options: GetOptions,
        front: bool,
    ) -> usize {
        let mut ready = HashSet::with_hasher(RandomState::default());
        let (mut held, mut past_ready) = (0, 0);
        for &key in keys {
            // The held hit answers a run of its key from the front, read once however
            // often it is named (one item held: another key between would replace it).
            if ready.is_empty() && past_ready == 0 && self.holds(key, options) {
                held += 1;
                continue;
            }
            let first = front && ready.is_empty() && past_ready == 0;
            if self.fetch(key, options).is_none() {
                if self.full() && !first {
                    break;
                }
                if self.buffers.overdrawn() && cache.reads_large_object(key) {
                    self.awaiting_room = true;
                    break;
                }
                self.begin(cache, key, options);
            }
            if past_ready == 0 && self.answered(key, options) && ready.insert(key) {
                continue;
            }
            past_ready += 1;
            if past_ready > LOOK_AHEAD || self.full() {
                break;
            }
        }
        if front {
            self.front = ready.iter().map(|key| (key.to_vec(), options)).collect();
        }
        held + ready.len()
    }

    fn holds(&self, key: &[u8], options: GetOptions) -> bool {
        self.held_hit(key, options).is_some()
    }

    fn held_hit(&self, key: &[u8], options: GetOptions) -> Option<Arc<Item>> {
        let ((held, o), item) = self.held.as_ref()?;
        (held == key && *o == options).then(|| item.clone())
    }

    /// The current value of the key the front request rewrites ([`Access::Rewrites`]),
    /// read ahead of it off the serving thread; `None` where none was read (no SSD tier,
    /// or it failed): the engine then reads what it needs itself.
    pub fn rewritten_value(&mut self, key: &[u8]) -> Option<Item> {
        let answer = self.take(key, REWRITE_READ)?;
        answer.ok().flatten()
    }

    /// Takes the answer of a GET, if one is ready.
    fn take(&mut self, key: &[u8], options: GetOptions) -> Option<Answer> {
        let fetches = self.fetches.get_mut(key)?;
        let at = fetches
            .iter()
            .position(|(o, f)| *o == options && matches!(f, Fetch::Answered(_)))?;
        let (_, answered) = fetches.swap_remove(at);
        if fetches.is_empty() {
            self.fetches.remove(key);
        }
        self.let_go(weigh(key, &answered));
        let Fetch::Answered(answer) = answered else {
            unreachable!("the position of an answer");
        };
        Some(answer)
    }

    /// Drops the answers and reads of `keys` (a dropped read completes unobserved).
    fn forget<'k>(&mut self, keys: impl IntoIterator<Item = &'k [u8]>) {
        let mut dropped_a_read = false;
        for key in keys {
            for (_, fetch) in self.fetches.remove(key).unwrap_or_default() {
                dropped_a_read |= matches!(fetch, Fetch::Reading(_));
                self.drop_fetch(key, fetch);
            }
        }
        if dropped_a_read {
            let fetches = &self.fetches;
            self.reading.retain(|(key, options)| {
                fetches
                    .get(key)
                    .is_some_and(|f| f.iter().any(|(o, _)| o == options))
            });
        }
    }

    /// At an await of the front request: `walk` (which walks the requests behind the
    /// front and returns how many bytes from the front on it passed) runs unless the
    /// front still lies within the last walk, whose reads are started already.
    pub fn walk_once(&mut self, walk: impl FnOnce(&mut ReadAhead<'_>) -> usize) {
        if self.walked > 0 {
            return;
        }
        let mut changed = HashSet::default();
        changed.extend(self.front_rewrites.clone());
        let mut ahead = ReadAhead {
            changed,
            reads: self,
        };
        let walked = walk(&mut ahead);
        self.walked = walked;
    }

    /// The request at the front of the input ended (replied, refused or failed, spanning
    /// `len` bytes; 0 when the connection closes): the answers it was admitted with and
    /// did not take are dropped — whatever it did, a later request reads afresh — and
    /// the front moves on past it. Every request ends here (`connection::process`), so
    /// no early return of its own can leave an answer behind.
    pub fn request_done(&mut self, len: usize) {
        self.front_rewrites = None;
        let front = std::mem::take(&mut self.front);
        self.forget(front.iter().map(|(key, _)| &key[..]));
        self.walked = self.walked.saturating_sub(len);
    }

    /// Lets the request at the front of a connection's input run, and returns how many
    /// of its keys, from the first, it may read now (every request that does not only
    /// read: all). A read's GETs start, as far as the caps allow; 0 while its first key
    /// is in flight (the caller returns `Step::Await`). A change drops the answers of its
    /// keys, a barrier every answer. Without an SSD tier, all at once, and the command
    /// reads as it runs: `access` is asked for only with an SSD tier, so DRAM-only a
    /// request's keys are not even collected.
    pub fn admit<'k>(&mut self, cache: &Keyspace, access: impl FnOnce() -> Access<'k>) -> usize {
        self.follow_generations(cache);
        // DRAM-only, every GET answers at once: nothing to start, copy or keep.
        if !cache.engine().has_ssd_tier() {
            return usize::MAX;
        }
        match access() {
            Access::Reads(keys, options) => self.start(cache, &keys, options, true),
            Access::Rewrites(key) => {
                // The hit held may be the value being rewritten: it goes now, as for any
                // change; the value is read as a peek, which this request alone takes.
                if self.held.as_ref().is_some_and(|((held, _), _)| held == key) {
                    self.hold_hit(None);
                }
                self.front_rewrites = Some(key.to_vec());
                match self.start(cache, &[key], REWRITE_READ, true) {
                    0 => 0,
                    _ => usize::MAX,
                }
            }
            Access::Changes(keys) => {
                self.forget(keys.iter().copied());
                if let Some(((held, _), _)) = &self.held
                    && keys.contains(&&held[..])
                {
                    self.hold_hit(None);
                }
                usize::MAX
            }
            Access::Barrier => {
                self.clear();
                usize::MAX
            }
        }
    }

    /// What a GET of `key` answers: the hit held ([`Prefetch::get_shared`]; a copy), the
    /// prefetched answer (taken, so a key repeated in one command reads again), or the
    /// engine's, read now. The held hit comes first because admission counts it as an
    /// answer.
    pub fn get_item(
        &mut self,
        cache: &Keyspace,
        key: &[u8],
        options: GetOptions,
    ) -> zipcache::Result<Option<Item>> {
        self.follow_generations(cache);
        if let Some(item) = self.held_hit(key, options) {
            return Ok(Some(Item::clone(&item)));
        }
        match self.take(key, options) {
            Some(answer) => answer.map(|item| cache.visible(item)),
            // may do I/O: a synchronous SSD read when nothing was prefetched
            None => cache.get_item(key, options),
        }
    }

    /// What a GET of `key` answers, as [`Prefetch::get_item`], shared: with an SSD tier
    /// the connection holds the last hit it took (one item), and the same GET repeated —
    /// `get big big …`, an MGET naming one key 1,500 times, a pipeline of `GET big` —
    /// answers from it rather than reading the value (and allocating a copy) again. A
    /// change of the key or a barrier drops it, as they drop answers read ahead, and so
    /// does the end of the input read together ([`Prefetch::clear`]): the requests it
    /// answers were read before it was. DRAM-only, `admit` sees no changes, so nothing is
    /// held.
    pub fn get_shared(
        &mut self,
        cache: &Keyspace,
        key: &[u8],
        options: GetOptions,
    ) -> zipcache::Result<Option<Arc<Item>>> {
        if let Some(item) = self.held_hit(key, options) {
            return Ok(Some(item));
        }
        // may do I/O: a synchronous SSD read when nothing was prefetched
        let item = self.get_item(cache, key, options)?.map(Arc::new);
        if let Some(item) = item.as_ref().filter(|_| cache.engine().has_ssd_tier()) {
            self.hold_hit(Some(((key.to_vec(), options), item.clone())));
        }
        Ok(item)
    }
}

/// What a request does to the store, as far as answers read ahead of it are concerned.
#[derive(Debug, PartialEq)]
pub enum Access<'k> {
    /// Only reads these keys (at least one), as `options` say: their GETs may start
    /// ahead of it.
    Reads(Vec<&'k [u8]>, GetOptions),
    /// May change these keys (maybe none: `mn`, an error reply) and no other.
    Changes(Vec<&'k [u8]>),
    /// Rewrites this key from its current value (an append, a prepend): the value is read
    /// first, off the serving thread, for this request alone; later reads of the key wait
    /// for it, as behind any change.
    Rewrites(&'k [u8]),
    /// Anything else (a flush, `stats`, an operator command): what it touches is unknown.
    Barrier,
}

/// How a rewrite's value is read: a peek, which marks nothing fetched.
const REWRITE_READ: GetOptions = GetOptions { peek: true };

/// The requests pipelined behind one that awaits the SSD, walked in order while their
/// reads start (`Session::read_ahead`, within [`Prefetch::walk_once`]).
pub struct ReadAhead<'r> {
    /// Keys a request walked past may change: a later read of one must see the change,
    /// so it cannot start now.
    changed: HashSet<Vec<u8>, RandomState>,
    reads: &'r mut Prefetch,
}

impl ReadAhead<'_> {
    /// Walks past one request: starts its reads, or remembers what it changes. False
    /// where the walk stops (a barrier, a read of a key changed before it, or no room
    /// for more reads).
    pub fn pass(&mut self, cache: &Keyspace, access: &Access<'_>) -> bool {
        self.reads.follow_generations(cache);
        match access {
            Access::Reads(keys, options) => {
                if keys.iter().any(|key| self.changed.contains(*key)) {
                    return false;
                }
                self.reads.start(cache, keys, *options, false);
                !self.reads.full()
            }
            Access::Changes(keys) => {
                self.changed.extend(keys.iter().map(|key| key.to_vec()));
                true
            }
            Access::Rewrites(key) => {
                self.changed.insert(key.to_vec());
                true
            }
            Access::Barrier => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use zipcache::Config;

    use std::time::Duration;

    use super::super::buffer_budget::BufferBudget;
    use super::*;

    fn futures_lite_block_on<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    /// A rewrite at the front (an append awaiting its value) changes its key: the walk
    /// behind it starts no read of that key, which would answer a later GET with the
    /// value from before the rewrite; reads of other keys start.
    #[test]
    fn a_walk_behind_a_rewrite_starts_no_read_of_its_key() {
        let cache = Keyspace::new(
            Arc::new(zipcache::ZipCache::open(Config::default()).unwrap()),
            Default::default(),
        );
        let plain = GetOptions::default();
        let mut reads = Prefetch::default();
        reads.front_rewrites = Some(b"k".to_vec());
        reads.walk_once(|walk| {
            assert!(walk.pass(&cache, &Access::Reads(vec![b"other"], plain)));
            assert!(!walk.pass(&cache, &Access::Reads(vec![b"k"], plain)));
            0
        });
        assert!(reads.fetch(b"other", plain).is_some());
        assert!(reads.fetch(b"k", plain).is_none());
        // Walked past, a rewrite is a change of its key.
        let mut walk = ReadAhead {
            changed: HashSet::default(),
            reads: &mut reads,
        };
        assert!(walk.pass(&cache, &Access::Rewrites(b"j")));
        assert!(!walk.pass(&cache, &Access::Reads(vec![b"j"], plain)));
    }

    /// The walk past pipelined requests: reads start, changes are remembered, and it stops
    /// at a read of a changed key or at a barrier.
    #[test]
    fn a_read_ahead_walks_past_changes_of_other_keys_only() {
        let cache = Keyspace::new(
            Arc::new(zipcache::ZipCache::open(Config::default()).unwrap()),
            Default::default(),
        );
        let plain = GetOptions::default();
        let mut reads = Prefetch::default();
        let mut walk = ReadAhead {
            changed: HashSet::default(),
            reads: &mut reads,
        };
        assert!(walk.pass(&cache, &Access::Reads(vec![b"a"], plain)));
        assert!(walk.pass(&cache, &Access::Changes(vec![b"b", b"c"])));
        assert!(walk.pass(&cache, &Access::Changes(Vec::new())));
        assert!(walk.pass(&cache, &Access::Reads(vec![b"a", b"d"], plain)));
        assert!(!walk.pass(&cache, &Access::Reads(vec![b"d", b"c"], plain)));
        assert!(!walk.pass(&cache, &Access::Reads(vec![b"b"], plain)));
        let mut walk = ReadAhead {
            changed: HashSet::default(),
            reads: &mut reads,
        };
        assert!(!walk.pass(&cache, &Access::Barrier));
    }

    /// An engine whose large values sit in BT_LO extents on an SSD file in `dir`.
    fn with_large_values(dir: &std::path::Path, values: usize, len: usize) -> zipcache::ZipCache {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        let cache = zipcache::ZipCache::open(Config {
            dram_capacity: 4 << 20,
            ssd: Some(zipcache::SsdConfig {
                path: dir.join("ssd.bin"),
                size: 64 << 20,
                direct_io: false,
                device_compression: zipcache::config::DeviceCompression::None,
                logical_to_physical: 1.0,
            }),
            ..Config::default()
        })
        .unwrap();
        for i in 0..values {
            cache
                .put(format!("big{i}").as_bytes(), &vec![b'v'; len], None)
                .unwrap();
        }
        cache
    }

    /// Each read's whole-extent buffer is charged to the connection as it starts, then its
    /// answer; a read-ahead stops once they hold its share, or once every connection's
    /// buffers hold the budget; whatever it held is released when it is dropped. (Reads of
    /// large values used to go in flight 64 at a time, none of them charged.)
    #[test]
    fn reads_ahead_are_charged_and_stop_when_the_share_is_spent() {
        const LEN: usize = 256 << 10;
        let dir = std::env::temp_dir().join(format!("zipcache-prefetch-{}", std::process::id()));
        let cache = Keyspace::new(
            Arc::new(with_large_values(&dir, 8, LEN)),
            Default::default(),
        );
        let keys: Vec<Vec<u8>> = (0..8).map(|i| format!("big{i}").into_bytes()).collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let plain = GetOptions::default();

        let budget = BufferBudget::new(64 << 20);
        let mut reads = Prefetch::new(Arc::new(budget.register()));
        reads.start(&cache, &keys, plain, true);
        let started = reads.reading.len();
        // Each read holds more than the value (its extent's header, whole blocks).
        assert_eq!(started, MAX_HELD_BYTES.div_ceil(LEN), "four, not all eight");
        assert_eq!(budget.buffered(), reads.held_bytes);
        assert!(reads.held_bytes >= started * LEN);
        assert!(reads.held_bytes < MAX_HELD_BYTES + LEN + (16 << 10));
        // Answered, the charge is the values'.
        while !reads.reading.is_empty() {
            futures_lite_block_on(reads.settle());
        }
        assert_eq!(reads.answers, started);
        assert_eq!(budget.buffered(), started * (LEN + b"big0".len()));
        drop(reads);
        assert_eq!(budget.buffered(), 0);

        // Every connection together at the budget: the front's first key only.
        let budget = BufferBudget::new(1 << 20);
        let others = budget.register();
        others.charge(1 << 20);
        let mut reads = Prefetch::new(Arc::new(budget.register()));
        reads.start(&cache, &keys, plain, true);
        assert_eq!(reads.reading.len(), 1);
        reads.clear();
        // Past the budget's overdraft (an eighth): not even that until there is room,
        // which the closing of the biggest makes.
        others.charge(1 << 17);
        assert!(others.is_closed());
        assert_eq!(reads.start(&cache, &keys, plain, true), 0);
        assert!(reads.reading.is_empty() && reads.awaiting_room);
        // A key BT_LO does not hold needs one block at most: it does not wait (small
        // reads of well-behaved clients waited while readers that never read held the
        // budget: `zipcache bench hostile`'s worst latency went from 0.2 s to 0.85 s).
        let mut small = Prefetch::new(Arc::new(budget.register()));
        assert_eq!(small.start(&cache, &[b"small"], plain, true), 1);
        assert!(!small.awaiting_room);
        drop(small);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let settled = tokio::time::timeout(Duration::from_millis(50), reads.settle());
            assert!(
                settled.await.is_err(),
                "no room while the overdraft is spent"
            );
        });
        reads.start(&cache, &keys, plain, true);
        runtime.block_on(async {
            let settled = tokio::time::timeout(Duration::from_secs(10), reads.settle());
            tokio::join!(
                async { assert!(settled.await.is_ok(), "room once it went") },
                async { drop(others) }
            );
        });
        assert!(!reads.awaiting_room);
        assert_eq!(budget.buffered(), 0);
        reads.start(&cache, &keys, plain, true);
        assert_eq!(reads.reading.len(), 4, "the share's reads start");
        reads.clear();
        assert_eq!(budget.buffered(), 0, "cleared, it holds nothing");
        drop(cache);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Reads in flight that no request will take keep their charge until the device is
    /// done with their buffers: released by a task on the connection's thread, not when
    /// they are dropped.
    #[test]
    fn reads_dropped_in_flight_stay_charged_until_their_buffers_are_freed() {
        const LEN: usize = 256 << 10;
        let dir = std::env::temp_dir().join(format!("zipcache-abandon-{}", std::process::id()));
        let cache = Keyspace::new(
            Arc::new(with_large_values(&dir, 4, LEN)),
            Default::default(),
        );
        let keys: Vec<Vec<u8>> = (0..4).map(|i| format!("big{i}").into_bytes()).collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let budget = BufferBudget::new(64 << 20);
        let buffers = Arc::new(budget.register());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut reads = Prefetch::new(buffers.clone());
            reads.start(&cache, &keys, GetOptions::default(), true);
            let charged = reads.held_bytes;
            assert!(charged >= 4 * LEN && !reads.reading.is_empty());
            // A later request changes two of the keys, then the connection goes.
            reads.forget([keys[0], keys[1]]);
            drop(reads);
            assert_eq!(budget.buffered(), charged, "every buffer still charged");
            for _ in 0..100 {
                if budget.buffered() == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(budget.buffered(), 0, "released once the reads completed");
        });
        drop(cache);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A change drops the answers of its own keys only, a barrier all of them.
    #[test]
    fn a_change_forgets_only_its_keys() {
        let cache = Keyspace::new(
            Arc::new(zipcache::ZipCache::open(Config::default()).unwrap()),
            Default::default(),
        );
        cache.engine().put(b"a", b"1", None).unwrap();
        cache.engine().put(b"b", b"2", None).unwrap();
        let plain = GetOptions::default();
        let mut prefetch = Prefetch::default();
        assert_eq!(prefetch.start(&cache, &[b"a", b"b"], plain, false), 2);
        prefetch.forget([&b"b"[..], b"z"]);
        assert!(prefetch.answered(b"a", plain));
        assert!(!prefetch.answered(b"b", plain));
        assert!(!prefetch.answered(b"a", GetOptions { peek: true }));
        prefetch.clear();
        assert!(!prefetch.answered(b"a", plain));
    }

    /// An answer read before a slot's generation moved is not given: the slot may have
    /// gone away and come back, and the value read then be one another node overwrote.
    #[test]
    fn answers_read_before_a_generation_moved_are_dropped() {
        let generations = Arc::new(crate::core::keyspace::Generations::default());
        let engine = Arc::new(zipcache::ZipCache::open(Config::default()).unwrap());
        let cache = Keyspace::new(engine, generations.clone());
        let options = zipcache::PutOptions::default();
        cache.put_with(b"k", b"old", options).unwrap();
        let plain = GetOptions::default();
        let mut prefetch = Prefetch::default();
        assert_eq!(prefetch.start(&cache, &[b"k"], plain, true), 1);
        generations.bump(crate::core::slot::key_slot(b"k"));
        let got = prefetch.get_item(&cache, b"k", plain).unwrap();
        assert_eq!(got, None, "read again under the new generation: a miss");
    }
}
