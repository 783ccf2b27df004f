//! SSD reads in flight while the runtime thread serves other connections.
//!
//! Sessions execute requests synchronously (`Session::step`). Before a request runs, its
//! session tells [`admit`] what it does to the store ([`Access`]). A plain read names
//! the keys it will read: each GET begins through `ZipCache::get_item_async`; DRAM and
//! BT_LO answer at once, an SSD read goes in flight. If any is in flight the step returns
//! `Step::Await` without executing anything; the connection task writes the replies so
//! far and awaits the oldest read ([`Prefetch::settle`]; its thread meanwhile serves
//! other connections), then runs the step again, and the command takes its answers from
//! here through [`get_item`], which matches them by key and by how the GET reads
//! (`GetOptions`: a peek leaves the access state a GET marks, so one cannot stand in for
//! the other).
//!
//! Before awaiting, the reads pipelined behind it start too ([`ReadAhead`]), so that a
//! pipeline's reads are in flight together — also past writes of other keys (a
//! look-aside client pipelines the SETs that fill its misses between its GETs): a
//! read-ahead stops only at a request whose keys it cannot name, or at a read of a key
//! that a request before it may change. Each reply goes out once its own reads are in,
//! not when the pipeline's last read is; the requests behind are walked once
//! ([`walk_once`]), not at every await.
//!
//! Owner: each connection task holds its `Prefetch` and installs it in this thread's slot
//! only while it runs `process` ([`within`]), which never yields: no other connection's
//! request can run in between, so no answer crosses connections. An answer is taken by
//! the GET that uses it; a request that may change keys drops their answers before it
//! runs, one whose keys are unknown drops them all, and so does the connection once it
//! has run every complete request ([`Prefetch::clear`]). A request is answered with what
//! the store held at some moment after it arrived and before its reply.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use zipcache::{AsyncGet, GetOptions, Item, ZipCache};

/// A GET as a prefetched answer is matched to it.
type Get = (Vec<u8>, GetOptions);

fn same((k, o): &Get, key: &[u8], options: GetOptions) -> bool {
    k == key && *o == options
}

/// The GETs started for the request at the front of one connection's input.
#[derive(Default)]
pub struct Prefetch {
    answered: Vec<(Get, zipcache::Result<Option<Item>>)>,
    reading: Vec<(Get, AsyncGet)>,
    /// Bytes of input, from the front request on, that the last read-ahead walked: while
    /// the front lies within them, walking again would only find what was started.
    walked: usize,
}

impl Prefetch {
    /// Awaits the oldest read in flight (the front request's come first), then moves every
    /// read that has completed meanwhile to the ready answers: the connection then runs
    /// as far as its answers allow and writes those replies while later reads are still
    /// in flight, rather than holding every reply until the slowest read of the pipeline.
    pub async fn settle(&mut self) {
        if self.reading.is_empty() {
            return;
        }
        let (get, read) = self.reading.remove(0);
        let answer = read.await;
        self.answered.push((get, answer));
        let mut polled = Context::from_waker(Waker::noop());
        let mut still_reading = Vec::with_capacity(self.reading.len());
        for (get, mut read) in std::mem::take(&mut self.reading) {
            match Pin::new(&mut read).poll(&mut polled) {
                Poll::Ready(answer) => self.answered.push((get, answer)),
                Poll::Pending => still_reading.push((get, read)),
            }
        }
        self.reading = still_reading;
    }

    /// Drops every answer and read in flight (a dropped read completes unobserved).
    pub fn clear(&mut self) {
        self.answered.clear();
        self.reading.clear();
        self.walked = 0;
    }

    fn answered(&self, key: &[u8], options: GetOptions) -> bool {
        self.answered.iter().any(|(get, _)| same(get, key, options))
    }

    fn started(&self, key: &[u8], options: GetOptions) -> bool {
        self.answered(key, options) || self.reading.iter().any(|(get, _)| same(get, key, options))
    }

    /// Starts a GET (as `options` say) of every key not yet started; true when every one
    /// is answered (reads of other requests may still be in flight).
    fn start(&mut self, cache: &ZipCache, keys: &[&[u8]], options: GetOptions) -> bool {
        for &key in keys {
            if self.started(key, options) {
                continue;
            }
            let mut read = cache.get_item_async(key, options);
            let get = (key.to_vec(), options);
            match read.take_ready() {
                Some(answer) => self.answered.push((get, answer)),
                None => self.reading.push((get, read)),
            }
        }
        keys.iter().all(|key| self.answered(key, options))
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

/// At an await of the front request, after `process` ran `consumed` bytes of its input:
/// `walk` (which walks the requests behind the front and returns how many bytes from the
/// front on it passed) runs unless the front still lies within the last walk, whose reads
/// are started already. Outside [`within`], `walk` always runs.
pub fn walk_once(consumed: usize, walk: impl FnOnce() -> usize) {
    let within_last_walk = CURRENT.with(|slot| {
        let mut slot = slot.borrow_mut();
        let prefetch = slot.as_mut()?;
        let left = prefetch
            .walked
            .checked_sub(consumed)
            .filter(|&left| left > 0)?;
        prefetch.walked = left;
        Some(())
    });
    if within_last_walk.is_some() {
        return;
    }
    let walked = walk();
    CURRENT.with(|slot| {
        if let Some(prefetch) = slot.borrow_mut().as_mut() {
            prefetch.walked = walked;
        }
    });
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
    use std::sync::Arc;
    use std::time::Duration;

    use zipcache::Config;
    use zipcache_device::HeldDevice;

    use super::*;
    use crate::connection::{Processed, process};
    use crate::memcache::MemcacheSession;
    use crate::server::{ServerInfo, ServerOptions, Shared};

    /// Two pipelined GETs of keys on the SSD: the first one's reply is written while the
    /// second one's read is still in flight, not held back until it completes.
    #[test]
    fn a_reply_goes_out_once_its_own_reads_are_in() {
        let device = Arc::new(HeldDevice::new(1 << 14, true));
        device.hold(false);
        let config = Config {
            dram_capacity: 256 << 10,
            // Keep every object: the flusher waits rather than dropping any.
            flush_wait_ms: 60_000,
            ..Config::default()
        };
        let cache = Arc::new(ZipCache::open_on(config, Some(device.clone())).unwrap());
        let key = |i: usize| format!("key:{i:08}");
        // Hex of a hash: about as compressible as real values, so most keys leave DRAM.
        let value = |i: usize| {
            let hash = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            format!(
                "{hash:016x}{:016x}{:016x}",
                hash.rotate_left(17),
                hash.rotate_left(41)
            )
        };
        for i in 0..20_000 {
            cache
                .put(key(i).as_bytes(), value(i).as_bytes(), None)
                .unwrap();
        }
        cache.settle().unwrap();
        let on_ssd: Vec<usize> = (0..20_000)
            .filter(|&i| {
                let mut get = cache.get_item_async(key(i).as_bytes(), GetOptions::default());
                get.take_ready().is_none()
            })
            .take(2)
            .collect();
        assert_eq!(on_ssd.len(), 2, "the flusher moved keys to the SSD");
        device.hold(true);

        let shared = Arc::new(Shared::new(
            cache,
            ServerInfo::detached(),
            &ServerOptions::default(),
        ));
        let mut session = MemcacheSession::new(shared);
        let input = format!("get {}\r\nget {}\r\n", key(on_ssd[0]), key(on_ssd[1]));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let mut prefetch = Prefetch::default();
        let mut out = Vec::new();
        let mut step = |prefetch: &mut Prefetch, out: &mut Vec<u8>, from: usize| {
            within(prefetch, || {
                process(&mut session, &input.as_bytes()[from..], out)
            })
        };

        let (consumed, processed) = step(&mut prefetch, &mut out, 0);
        assert_eq!((consumed, processed), (0, Processed::Await));
        assert_eq!(
            device.in_flight(),
            2,
            "the second GET's read started with the first's"
        );
        device.complete_oldest();
        let settled = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), prefetch.settle()).await
        });
        assert!(settled.is_ok(), "settling waits for the oldest read only");
        let (more, processed) = step(&mut prefetch, &mut out, consumed);
        assert_eq!(processed, Processed::Await);
        let reply = |i: usize| format!("VALUE {} 0 48\r\n{}\r\nEND\r\n", key(i), value(i));
        assert_eq!(String::from_utf8_lossy(&out), reply(on_ssd[0]));

        device.complete_oldest();
        runtime.block_on(prefetch.settle());
        let (last, processed) = step(&mut prefetch, &mut out, consumed + more);
        assert_eq!(processed, Processed::NeedMore);
        assert_eq!(consumed + more + last, input.len());
        assert_eq!(
            String::from_utf8_lossy(&out),
            reply(on_ssd[0]) + &reply(on_ssd[1])
        );
    }

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
