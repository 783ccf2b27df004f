//! SSD reads in flight while the runtime thread serves other connections.
//!
//! Sessions execute requests synchronously (`Session::step`). Before a request runs, its
//! session tells [`admit`] what it does to the store ([`Access`]). A plain read names
//! the keys it will read: each GET begins through `ZipCache::get_item_async`; DRAM and
//! BT_LO answer at once, an SSD read goes in flight. If any is in flight the step returns
//! `Step::Await` without executing anything; the connection task awaits the reads (its
//! thread meanwhile serves other connections), then runs the step again, and the command
//! takes its answers from here through [`get_item`], which matches them by key and by how
//! the GET reads (`GetOptions`: a peek leaves the access state a GET marks, so one cannot
//! stand in for the other).
//!
//! Before awaiting, the reads pipelined behind it start too ([`ReadAhead`]), so that a
//! pipeline's reads are in flight together — also past writes of other keys (a
//! look-aside client pipelines the SETs that fill its misses between its GETs): a
//! read-ahead stops only at a request whose keys it cannot name, or at a read of a key
//! that a request before it may change.
//!
//! Owner: each connection task holds its `Prefetch` and installs it in this thread's slot
//! only while it runs `process` ([`within`]), which never yields: no other connection's
//! request can run in between, so no answer crosses connections. An answer is taken by
//! the GET that uses it; a request that may change keys drops their answers before it
//! runs, one whose keys are unknown drops them all, and so does the connection once it
//! has run every complete request ([`Prefetch::clear`]). A request is answered with what
//! the store held at some moment after it arrived and before its reply.

use std::cell::RefCell;

use zipcache::{AsyncGet, GetOptions, Item, ZipCache};

/// A GET as a prefetched answer is matched to it.
type Get = (Vec<u8>, GetOptions);

/// The GETs started for the request at the front of one connection's input.
#[derive(Default)]
pub struct Prefetch {
    answered: Vec<(Get, zipcache::Result<Option<Item>>)>,
    reading: Vec<(Get, AsyncGet)>,
}

impl Prefetch {
    /// Awaits every read in flight; their answers join the ready ones.
    pub async fn finish(&mut self) {
        for (get, read) in std::mem::take(&mut self.reading) {
            let answer = read.await;
            self.answered.push((get, answer));
        }
    }

    /// Drops every answer and read in flight (a dropped read completes unobserved).
    pub fn clear(&mut self) {
        self.answered.clear();
        self.reading.clear();
    }

    fn answered(&self, key: &[u8], options: GetOptions) -> bool {
        let same = |(k, o): &Get| k == key && *o == options;
        self.answered.iter().any(|(get, _)| same(get))
            || self.reading.iter().any(|(get, _)| same(get))
    }

    /// Starts a GET (as `options` say) of every key not yet answered; true when all are
    /// answered.
    fn start(&mut self, cache: &ZipCache, keys: &[&[u8]], options: GetOptions) -> bool {
        for &key in keys {
            if self.answered(key, options) {
                continue;
            }
            let mut read = cache.get_item_async(key, options);
            let get = (key.to_vec(), options);
            match read.take_ready() {
                Some(answer) => self.answered.push((get, answer)),
                None => self.reading.push((get, read)),
            }
        }
        self.reading.is_empty()
    }

    /// Drops the answers and reads of `keys` (a dropped read completes unobserved).
    fn forget(&mut self, keys: &[&[u8]]) {
        let kept = |(key, _): &Get| !keys.iter().any(|k| *k == &key[..]);
        self.answered.retain(|(get, _)| kept(get));
        self.reading.retain(|(get, _)| kept(get));
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Prefetch>> = const { RefCell::new(None) };
}

/// Runs `f` (synchronous) with `prefetch` as this thread's slot.
pub fn within<R>(prefetch: &mut Prefetch, f: impl FnOnce() -> R) -> R {
    CURRENT.with(|slot| *slot.borrow_mut() = Some(std::mem::take(prefetch)));
    let result = f();
    *prefetch = CURRENT
        .with(|slot| slot.borrow_mut().take())
        .unwrap_or_default();
    result
}

/// What a request does to the store, as far as answers read ahead of it are concerned.
#[derive(Debug, PartialEq)]
pub enum Access<'k> {
    /// Only reads these keys (at least one), as `options` say: their GETs may start
    /// ahead of it.
    Reads(Vec<&'k [u8]>, GetOptions),
    /// May change these keys (maybe none: `mn`, an error reply) and no other.
    Changes(Vec<&'k [u8]>),
    /// Anything else (a flush, `stats`, an operator command): what it touches is unknown.
    Barrier,
}

/// Lets the request at the front of a connection's input run: a read's GETs start (false
/// while some read is in flight: the caller returns `Step::Await`); a change drops the
/// answers of its keys, a barrier every answer. Without an SSD tier, or outside
/// [`within`] (tests, fuzzing, the shared runtime's embedders; no slot), true at once, and
/// the command reads as it runs. `access` is asked for only with an SSD tier: DRAM-only,
/// a request's keys are not even collected.
pub fn admit<'k>(cache: &ZipCache, access: impl FnOnce() -> Access<'k>) -> bool {
    // DRAM-only, every GET answers at once: nothing to start, copy or keep.
    !cache.has_ssd_tier() || admit_known(cache, &access())
}

/// `admit` once the request's access is known.
fn admit_known(cache: &ZipCache, access: &Access<'_>) -> bool {
    CURRENT.with(|slot| {
        let mut slot = slot.borrow_mut();
        let Some(prefetch) = slot.as_mut() else {
            return true;
        };
        match access {
            Access::Reads(keys, options) => prefetch.start(cache, keys, *options),
            Access::Changes(keys) => {
                prefetch.forget(keys);
                true
            }
            Access::Barrier => {
                prefetch.clear();
                true
            }
        }
    })
}

/// The requests pipelined behind one that awaits the SSD, walked in order while their
/// reads start (`Session::read_ahead`).
#[derive(Default)]
pub struct ReadAhead {
    /// Keys a request walked past may change: a later read of one must see the change,
    /// so it cannot start now.
    changed: Vec<Vec<u8>>,
}

impl ReadAhead {
    /// Walks past one request: starts its reads, or remembers what it changes. False
    /// where the walk stops (a barrier, or a read of a key changed before it).
    pub fn pass(&mut self, cache: &ZipCache, access: &Access<'_>) -> bool {
        match access {
            Access::Reads(keys, _) => {
                let changed = |key: &&[u8]| self.changed.iter().any(|c| c == key);
                if keys.iter().any(changed) {
                    return false;
                }
                admit_known(cache, access);
                true
            }
            Access::Changes(keys) => {
                self.changed.extend(keys.iter().map(|key| key.to_vec()));
                true
            }
            Access::Barrier => false,
        }
    }
}

/// What a GET of `key` answers: the prefetched answer (taken, so a key repeated in one
/// command reads again), or the engine's, read now.
pub fn get_item(
    cache: &ZipCache,
    key: &[u8],
    options: GetOptions,
) -> zipcache::Result<Option<Item>> {
    let prefetched = CURRENT.with(|slot| {
        let mut slot = slot.borrow_mut();
        let answered = &mut slot.as_mut()?.answered;
        let at = answered
            .iter()
            .position(|((k, o), _)| k == key && *o == options)?;
        Some(answered.swap_remove(at).1)
    });
    match prefetched {
        Some(answer) => answer,
        // may do I/O: a synchronous SSD read when nothing was prefetched
        None => cache.get_item(key, options),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zipcache::Config;

    /// The walk past pipelined requests: reads start, changes are remembered, and it stops
    /// at a read of a changed key or at a barrier.
    #[test]
    fn a_read_ahead_walks_past_changes_of_other_keys_only() {
        let cache = ZipCache::open(Config::default()).unwrap();
        let plain = GetOptions::default();
        let mut walk = ReadAhead::default();
        assert!(walk.pass(&cache, &Access::Reads(vec![b"a"], plain)));
        assert!(walk.pass(&cache, &Access::Changes(vec![b"b", b"c"])));
        assert!(walk.pass(&cache, &Access::Changes(Vec::new())));
        assert!(walk.pass(&cache, &Access::Reads(vec![b"a", b"d"], plain)));
        assert!(!walk.pass(&cache, &Access::Reads(vec![b"d", b"c"], plain)));
        assert!(!walk.pass(&cache, &Access::Reads(vec![b"b"], plain)));
        assert!(!ReadAhead::default().pass(&cache, &Access::Barrier));
    }

    /// A change drops the answers of its own keys only, a barrier all of them.
    #[test]
    fn a_change_forgets_only_its_keys() {
        let cache = ZipCache::open(Config::default()).unwrap();
        cache.put(b"a", b"1", None).unwrap();
        cache.put(b"b", b"2", None).unwrap();
        let plain = GetOptions::default();
        let mut prefetch = Prefetch::default();
        assert!(prefetch.start(&cache, &[b"a", b"b"], plain));
        prefetch.forget(&[b"b", b"z"]);
        assert!(prefetch.answered(b"a", plain));
        assert!(!prefetch.answered(b"b", plain));
        assert!(!prefetch.answered(b"a", GetOptions { peek: true }));
        prefetch.clear();
        assert!(!prefetch.answered(b"a", plain));
    }
}
