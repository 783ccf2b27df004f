//! SSD reads in flight while the runtime thread serves other connections.
//!
//! Sessions execute requests synchronously (`Session::step`). Before a read-only command
//! runs, its session asks [`start`] for the keys it will read: each GET begins through
//! `ZipCache::get_item_async`; DRAM and BT_LO answer at once, an SSD read goes in flight.
//! If any is in flight the step returns `Step::Await` without executing anything; the
//! connection task awaits the reads (its thread meanwhile serves other connections), then
//! runs the step again, and the command takes its answers from here through [`get_item`],
//! which matches them by key and by how the GET reads (`GetOptions`: a peek leaves the
//! access state a GET marks, so one cannot stand in for the other).
//! Before awaiting, the read-only requests pipelined behind it start their reads too
//! (`Session::read_ahead`), so their reads are in flight together.
//!
//! Owner: each connection task holds its `Prefetch` and installs it in this thread's slot
//! only while it runs `process` ([`within`]), which never yields: no other connection's
//! request can run in between, so no answer crosses connections. An answer is taken by
//! the GET that uses it; the rest are dropped before any request that is not a plain read
//! runs ([`start`] with no keys) — it could change what they answered — and once the
//! connection has run every complete request ([`Prefetch::clear`]). A request is answered
//! with what the store held at some moment after it arrived and before its reply.

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

/// Starts a GET (as `options` say) of every key not yet answered; true when all are answered, false when
/// some read is in flight (the caller returns `Step::Await`). No keys (a request that is
/// not a plain read): every answer is dropped first. Without an SSD tier, or outside
/// [`within`] (tests, fuzzing, the shared runtime's embedders; no slot), true at once, and
/// the command reads as it runs.
pub fn start<'k>(
    cache: &ZipCache,
    keys: impl IntoIterator<Item = &'k [u8]>,
    options: GetOptions,
) -> bool {
    // DRAM-only, every GET answers at once: nothing to start, copy or keep.
    if !cache.has_ssd_tier() {
        return true;
    }
    CURRENT.with(|slot| {
        let mut slot = slot.borrow_mut();
        let Some(prefetch) = slot.as_mut() else {
            return true;
        };
        let mut keys = keys.into_iter().peekable();
        if keys.peek().is_none() {
            prefetch.clear();
            return true;
        }
        for key in keys {
            if prefetch.answered(key, options) {
                continue;
            }
            let mut read = cache.get_item_async(key, options);
            let get = (key.to_vec(), options);
            match read.take_ready() {
                Some(answer) => prefetch.answered.push((get, answer)),
                None => prefetch.reading.push((get, read)),
            }
        }
        prefetch.reading.is_empty()
    })
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
