//! Model-based tests: the engine against a `BTreeMap`, with a clock the test moves and a
//! DRAM budget small enough that leaves split and get evicted. A miss is allowed once
//! anything was evicted; a wrong, stale or deleted value never is. With `track_access`,
//! an object's access state never claims a read the model did not make, nor a last
//! access before its last write; DRAM-only, where every hit is a DRAM hit, it is exact.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;

use zipcache_device::{
    BlockDevice, CompressingDevice, DeviceCompression, EmulatorOptions, FaultOp, FaultyDevice,
    MemDevice,
};

use crate::config::Promotion;
use crate::dictionary::tests::documents;
use crate::{AccessState, Clock, Config, GetOptions, Item, ItemInfo, PutOptions, Update, ZipCache};

#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl ManualClock {
    pub fn starting_at(ms: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock(AtomicU64::new(ms)))
    }

    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::Relaxed);
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Op {
    Put {
        key: u16,
        len: usize,
        ttl_ms: Option<u64>,
    },
    Get {
        key: u16,
    },
    Delete {
        key: u16,
    },
    Append {
        key: u16,
    },
    /// A metadata change alone (`update_meta`): a new expiry and flags, the CAS kept.
    Touch {
        key: u16,
        ttl_ms: Option<u64>,
    },
    Scan {
        start: u16,
        end: u16,
        limit: usize,
        view: ScanView,
    },
    Advance {
        ms: u64,
    },
    Maintain,
}

/// Which of the engine's scans an `Op::Scan` runs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ScanView {
    /// `scan`: values.
    Values,
    /// `scan_bytes` with this byte budget.
    Bytes(usize),
    /// `scan_keys`: metadata only.
    Keys,
}

/// Runs a future on this thread to completion: the engine's futures are woken by their
/// device, which for the test devices completes reads when the test says (or at once).
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::yield_now();
    }
}

/// A boolean setting's value.
fn on(flag: bool) -> &'static str {
    if flag { "true" } else { "false" }
}

pub(crate) fn key_of(k: u16) -> Vec<u8> {
    // Zero-padded ids like real workloads, plus a few long keys to stress sub-pages.
    if k.is_multiple_of(97) {
        format!("{k:0>200}").into_bytes()
    } else {
        format!("{k:016}").into_bytes()
    }
}

/// Settings that train dictionaries at the tests' small budgets: dictionaries of 2 KiB
/// (about 80 KB prepared) trained on 16 medium values, so that a few hundred writes
/// train, swap and retire several; with `device_compression=host`, block dictionaries too.
pub(crate) const SMALL_DICTIONARIES: [(&str, &str); 3] = [
    ("dictionary_size", "2KiB"),
    ("dictionary_samples", "16"),
    ("ssd_dictionaries", "true"),
];

/// The DRAM budget of the tests under eviction: 64 KiB, or with [`SMALL_DICTIONARIES`]
/// room for a few of them besides the objects.
fn budget_under_eviction(dictionaries: bool) -> u64 {
    if dictionaries { 512 << 10 } else { 64 << 10 }
}

/// A value of `len` bytes for `key`'s `version`: for even versions, documents of a
/// record schema that changes every 400 versions (a trained dictionary shrinks them
/// well beyond LZ4, so dictionaries are chosen, and retrained as the schema changes);
/// for odd ones, a pattern and zeros.
fn value_of(key: u16, len: usize, version: u64) -> Vec<u8> {
    if version.is_multiple_of(2) {
        let schema = (version / 400 % 2) as u8;
        return documents(schema, (u64::from(key) << 32) | version, len);
    }
    let mut v = vec![0u8; len];
    for (i, b) in v.iter_mut().enumerate().take(len / 2) {
        *b = (key as u64 ^ version ^ (i as u64 * 131)) as u8;
    }
    v
}

fn scan_view() -> impl Strategy<Value = ScanView> {
    prop_oneof![
        Just(ScanView::Values),
        (1usize..20_000).prop_map(ScanView::Bytes),
        Just(ScanView::Keys),
    ]
}

fn op_strategy(keys: u16) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..keys, prop_oneof![4 => 0usize..100, 2 => 100usize..700, 1 => 2000usize..5000], proptest::option::weighted(0.2, 1u64..5000))
            .prop_map(|(key, len, ttl_ms)| Op::Put { key, len, ttl_ms }),
        6 => (0..keys).prop_map(|key| Op::Get { key }),
        2 => (0..keys).prop_map(|key| Op::Delete { key }),
        1 => (0..keys).prop_map(|key| Op::Append { key }),
        1 => (0..keys, proptest::option::weighted(0.5, 1u64..5000))
            .prop_map(|(key, ttl_ms)| Op::Touch { key, ttl_ms }),
        1 => (0..keys, 0..keys, 1usize..50, scan_view()).prop_map(|(start, end, limit, view)| Op::Scan { start, end, limit, view }),
        1 => (1u64..3000).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Maintain),
    ]
}

/// Where the harness clock starts: the engine counts access times in seconds from it.
const START_MS: u64 = 1_000_000;

pub(crate) struct Harness {
    pub(crate) cache: ZipCache,
    pub(crate) clock: Arc<ManualClock>,
    model: BTreeMap<Vec<u8>, Item>,
    /// With `track_access`: the second of each key's last write, and its access state as
    /// the engine should report it (accessed at its last write or GET, to the second;
    /// fetched by a GET since the write).
    accesses: BTreeMap<Vec<u8>, (u64, AccessState)>,
    version: u64,
}

impl Harness {
    fn new(dram: u64, write_buffer: usize, bypass_r: f64) -> Harness {
        Harness::on(
            dram,
            write_buffer,
            bypass_r,
            None,
            16 << 10,
            Promotion::EveryHit,
            &[],
        )
    }

    pub(crate) fn on(
        dram: u64,
        write_buffer: usize,
        bypass_r: f64,
        device: Option<Arc<dyn BlockDevice>>,
        superleaf: usize,
        promotion: Promotion,
        settings: &[(&str, &str)],
    ) -> Harness {
        let clock = ManualClock::starting_at(START_MS);
        let mut config = Config {
            dram_capacity: dram,
            write_buffer,
            bypass_r,
            superleaf_size: superleaf,
            promotion,
            clock: clock.clone(),
            // Writers wait for the flusher rather than drop: the tests that count hits
            // need every object kept; dropping has tests of its own.
            flush_wait_ms: 60_000,
            ..Config::default()
        };
        for (name, value) in settings {
            config.set(name, value).unwrap();
        }
        let cache = ZipCache::open_on(config, device).unwrap();
        Harness {
            cache,
            clock,
            model: BTreeMap::new(),
            accesses: BTreeMap::new(),
            version: 0,
        }
    }

    /// 128 KiB of DRAM over an in-memory SSD of `blocks` blocks, driven in `mode`, whose
    /// faults the caller plans.
    pub(crate) fn over_faulty_device(
        blocks: u64,
        mode: DeviceCompression,
    ) -> (Harness, Arc<FaultyDevice<Box<dyn BlockDevice>>>) {
        let faulty = Arc::new(FaultyDevice::new(plain_device(blocks, mode)));
        let device: Arc<dyn BlockDevice> = faulty.clone();
        let h = Harness::on(
            128 << 10,
            256,
            3.0,
            Some(device),
            16 << 10,
            Promotion::EveryHit,
            &[],
        );
        (h, faulty)
    }

    /// Puts every key of `keys` with a value of `len` bytes, no TTL.
    pub(crate) fn put_all(&mut self, keys: impl Iterator<Item = u16>, len: usize) {
        for key in keys {
            self.run(&Op::Put {
                key,
                len,
                ttl_ms: None,
            });
        }
    }

    /// Every third key's writes carry a CAS the client chose (memcached's meta `E`), one
    /// no engine-assigned CAS would collide with; the model then holds that CAS, so every
    /// read and scan checks that it was stored, on whichever tier the object is.
    fn client_cas(&self, key: u16) -> Option<u64> {
        key.is_multiple_of(3).then_some(u64::MAX - self.version)
    }

    /// Every fifth key's writes store a collection's header (`PutOptions::collection`)
    /// where the object is not large (a large one is refused): the model holds the mark,
    /// so every read and scan checks that it was kept, on whichever tier the object is.
    fn collection(&self, key: u16, key_len: usize, value_len: usize) -> bool {
        key % 5 == 1 && key_len + value_len <= self.cache.config().medium_max
    }

    fn live(&self, key: &[u8]) -> Option<&Item> {
        let now = self.clock.now_ms();
        self.model
            .get(key)
            .filter(|i| i.expires_at_ms.is_none_or(|t| t > now))
    }

    /// Whether anything may have been forgotten: objects left DRAM (DRAM-only: with
    /// their leaf, or the cold ones of a leaf that kept its hot ones), a large object
    /// left the log, a super-leaf left the SSD, or a block could not be read or written.
    fn evicted(&self) -> bool {
        let s = self.cache.stats();
        (s.dropped_objects > 0 && self.cache.inner.ssd.is_none())
            || s.large_dropped > 0
            || s.ssd_evicted_superleaves > 0
            || s.checksum_failures > 0
            || s.io_errors > 0
            || s.ssd_write_drops > 0
    }

    /// Checks what a scan of `range` returned against what the model holds there
    /// (`want`, access states left out): in key order, within the range and the limit,
    /// every entry the model's live one (as `convert` shows it), and all of `want` unless
    /// something may have been evicted. The access state each entry reports (`access`)
    /// is checked as a peek's.
    fn check_scan<T: PartialEq + std::fmt::Debug>(
        &mut self,
        mut got: Vec<(Vec<u8>, T)>,
        want: Vec<(Vec<u8>, T)>,
        range: &std::ops::Range<Vec<u8>>,
        limit: usize,
        convert: impl Fn(&Item) -> T,
        access: impl Fn(&mut T) -> &mut Option<AccessState>,
    ) {
        // A scan peeks: it reports access states and changes none.
        for (k, entry) in &mut got {
            let state = access(entry).take();
            self.check_access(k, state, true);
        }
        assert!(got.len() <= limit);
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "scan out of order");
        for (k, entry) in &got {
            assert!(range.contains(k), "scan returned a key out of range");
            let live = self.live(k).map(&convert);
            assert_eq!(
                Some(entry),
                live.as_ref(),
                "scan returned a wrong entry for {k:?}"
            );
        }
        if !self.evicted() && got != want {
            let got_keys: Vec<_> = got
                .iter()
                .map(|(k, _)| String::from_utf8_lossy(k))
                .collect();
            let want_keys: Vec<_> = want
                .iter()
                .map(|(k, _)| String::from_utf8_lossy(k))
                .collect();
            panic!(
                "scan mismatch: got {got_keys:?} / want {want_keys:?}; stats {:?}",
                self.cache.stats()
            );
        }
    }

    /// Checks the access state a read reported for `key` (`peek`: an `update`, which
    /// does not mark it), then records the read.
    fn check_access(&mut self, key: &[u8], got: Option<AccessState>, peek: bool) {
        if !self.cache.config().track_access {
            assert_eq!(got, None, "access state without tracking");
            return;
        }
        let (written, want) = self.accesses[key];
        if self.cache.inner.ssd.is_none() {
            assert_eq!(got, Some(want), "access state of {key:?}");
        } else if let Some(got) = got {
            // The object may have left DRAM and come back: the engine knows less.
            assert!(!got.fetched || want.fetched, "a read that never was");
            assert!(
                got.last_access_ms >= written,
                "a last access before the write"
            );
            assert!(got.last_access_ms <= self.clock.now_ms());
        }
        if !peek {
            let fetched = AccessState {
                fetched: true,
                last_access_ms: self.second(),
            };
            self.accesses.insert(key.to_vec(), (written, fetched));
        }
    }

    /// Records a write of `key`: not fetched, accessed now.
    fn written(&mut self, key: &[u8]) {
        let now = self.second();
        let state = AccessState {
            fetched: false,
            last_access_ms: now,
        };
        self.accesses.insert(key.to_vec(), (now, state));
    }

    /// Now, to the second the engine keeps access times in.
    fn second(&self) -> u64 {
        START_MS + (self.clock.now_ms() - START_MS) / 1000 * 1000
    }

    pub(crate) fn run(&mut self, op: &Op) {
        match *op {
            Op::Put { key, len, ttl_ms } => {
                self.version += 1;
                let k = key_of(key);
                let value = value_of(key, len, self.version);
                let expires_at_ms = ttl_ms.map(|t| self.clock.now_ms() + t);
                let client_cas = self.client_cas(key);
                let collection = self.collection(key, k.len(), value.len());
                let options = PutOptions {
                    expires_at_ms,
                    flags: key as u32,
                    assign_cas: key % 2 == 0,
                    cas: client_cas,
                    access: None,
                    collection,
                };
                let cas = self.cache.put_with(&k, &value, options).unwrap();
                assert!(client_cas.is_none_or(|chosen| chosen == cas));
                self.written(&k);
                self.model.insert(
                    k,
                    Item {
                        value,
                        flags: key as u32,
                        cas,
                        expires_at_ms,
                        access: None,
                        collection,
                    },
                );
            }
            Op::Get { key } => {
                let k = key_of(key);
                // Odd keys through the asynchronous GET: the same answers are owed.
                let got = match key % 2 {
                    0 => self.cache.get_item(&k, GetOptions::default()).unwrap(),
                    _ => block_on(self.cache.get_item_async(&k, GetOptions::default())).unwrap(),
                };
                match (got, self.live(&k)) {
                    (Some(got), Some(want)) => {
                        let access = got.access;
                        let got = Item {
                            access: None,
                            ..got
                        };
                        assert_eq!(&got, want, "wrong value for {key}");
                        self.check_access(&k, access, false);
                    }
                    (Some(got), None) => {
                        panic!("key {key} served {} bytes but it is gone", got.value.len())
                    }
                    (None, Some(_)) => assert!(self.evicted(), "key {key} missed with no eviction"),
                    (None, None) => {}
                }
            }
            Op::Delete { key } => {
                let k = key_of(key);
                let existed = self.cache.delete(&k).unwrap();
                let model_had = self.live(&k).is_some();
                assert!(
                    !existed || model_had,
                    "delete of {key} found a value the model did not have"
                );
                if !self.evicted() {
                    assert_eq!(existed, model_had);
                }
                self.model.remove(&k);
            }
            Op::Append { key } => {
                let k = key_of(key);
                self.version += 1;
                let client_cas = self.client_cas(key);
                // A header grown past `medium_max` is put as a string (a large one would
                // be refused).
                let (key_len, medium_max) = (k.len(), self.cache.config().medium_max);
                let collection =
                    move |item: &Item| item.collection && key_len + item.value.len() < medium_max;
                let (appended, cas) = self
                    .cache
                    .update(&k, |cur| match cur {
                        Some(item) => {
                            let mut value = item.value.clone();
                            value.extend_from_slice(b"+");
                            let options = PutOptions {
                                expires_at_ms: item.expires_at_ms,
                                flags: item.flags,
                                assign_cas: true,
                                cas: client_cas,
                                access: None,
                                collection: collection(item),
                            };
                            (Update::Put { value, options }, Some(item.clone()))
                        }
                        None => (Update::Keep, None),
                    })
                    .unwrap();
                match appended {
                    Some(old) => {
                        let access = old.access;
                        let old = Item {
                            access: None,
                            ..old
                        };
                        assert_eq!(
                            Some(&old),
                            self.live(&k),
                            "update saw a wrong value for {key}"
                        );
                        self.check_access(&k, access, true);
                        self.written(&k);
                        let collection = collection(&old);
                        let mut value = old.value;
                        value.push(b'+');
                        let cas = cas.unwrap();
                        assert!(client_cas.is_none_or(|chosen| chosen == cas));
                        let appended = Item {
                            value,
                            cas,
                            collection,
                            ..old
                        };
                        self.model.insert(k, appended);
                    }
                    None => assert!(self.live(&k).is_none() || self.evicted()),
                }
            }
            Op::Touch { key, ttl_ms } => {
                let k = key_of(key);
                let expires_at_ms = ttl_ms.map(|t| self.clock.now_ms() + t);
                let (seen, cas) = self
                    .cache
                    .update_meta(&k, |cur| match cur {
                        Some(info) => {
                            // The opposite mark, which a touch ignores: it keeps the type.
                            let options = PutOptions {
                                expires_at_ms,
                                flags: info.flags + 1,
                                cas: Some(info.cas),
                                collection: !info.collection,
                                ..PutOptions::default()
                            };
                            (Update::SetMeta(options), Some(*info))
                        }
                        None => (Update::Keep, None),
                    })
                    .unwrap();
                match seen {
                    Some(seen) => {
                        let want = self.live(&k).cloned();
                        let want = want.expect("touch found a key the model has not");
                        let want_info = ItemInfo {
                            value_len: want.value.len(),
                            flags: want.flags,
                            cas: want.cas,
                            expires_at_ms: want.expires_at_ms,
                            access: seen.access,
                            collection: want.collection,
                        };
                        assert_eq!(seen, want_info, "touch saw wrong metadata for {key}");
                        assert_eq!(cas, Some(want.cas), "a touch keeps the CAS");
                        self.written(&k);
                        let touched = Item {
                            flags: want.flags + 1,
                            expires_at_ms,
                            ..want
                        };
                        self.model.insert(k, touched);
                    }
                    None => assert!(self.live(&k).is_none() || self.evicted()),
                }
            }
            Op::Scan {
                start,
                end,
                limit,
                view,
            } => {
                let (a, b) = (key_of(start), key_of(end));
                let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                let range = lo.clone()..hi.clone();
                let now = self.clock.now_ms();
                let want = self
                    .model
                    .range(range.clone())
                    .filter(|(_, i)| i.expires_at_ms.is_none_or(|t| t > now))
                    .take(limit)
                    .map(|(k, i)| (k.clone(), i.clone()));
                let info = |item: &Item| ItemInfo {
                    value_len: item.value.len(),
                    flags: item.flags,
                    cas: item.cas,
                    expires_at_ms: item.expires_at_ms,
                    access: item.access,
                    collection: item.collection,
                };
                match view {
                    ScanView::Values => {
                        let got = self.cache.scan(range.clone(), limit).unwrap();
                        self.check_scan(got, want.collect(), &range, limit, Item::clone, |i| {
                            &mut i.access
                        });
                    }
                    ScanView::Bytes(max_bytes) => {
                        let got = self.cache.scan_bytes(range.clone(), limit, max_bytes);
                        let mut bytes = 0;
                        let want = want
                            .take_while(|(k, i)| {
                                let below = bytes < max_bytes;
                                bytes += k.len() + i.value.len();
                                below
                            })
                            .collect();
                        let got = got.unwrap();
                        self.check_scan(got, want, &range, limit, Item::clone, |i| &mut i.access);
                    }
                    ScanView::Keys => {
                        let got = self.cache.scan_keys(range.clone(), limit).unwrap();
                        let want = want.map(|(k, i)| (k, info(&i))).collect();
                        self.check_scan(got, want, &range, limit, info, |i| &mut i.access);
                    }
                }
            }
            Op::Advance { ms } => self.clock.advance(ms),
            Op::Maintain => {
                self.cache.inner.dram.bypass_pass(self.cache.inner.budget());
                self.cache.inner.dram.merge_all(self.clock.now_ms());
                // Compaction forced: every page and blob not in a page its thread
                // allocates from moves.
                self.cache.inner.dram.defragment(100);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Plenty of DRAM: nothing is evicted, so the engine must agree with the model exactly.
    #[test]
    fn engine_matches_model_without_eviction(
        ops in proptest::collection::vec(op_strategy(400), 1..600),
        track_access in any::<bool>(),
    ) {
        let mut h = Harness::on(64 << 20, 256, 3.0, None, 16 << 10, Promotion::EveryHit, &[("track_access", on(track_access))]);
        for op in &ops {
            h.run(op);
        }
        prop_assert!(!h.evicted());
    }

    /// 64 KiB of DRAM: constant eviction; misses allowed, wrong values never.
    #[test]
    fn engine_never_serves_wrong_values_under_eviction(
        ops in proptest::collection::vec(op_strategy(3000), 1..1500),
        write_buffer in prop_oneof![Just(0usize), Just(128), Just(256), Just(1024)],
        bypass_r in prop_oneof![Just(0.0), Just(0.5), Just(3.0)],
        track_access in any::<bool>(),
        dictionaries in any::<bool>(),
    ) {
        let mut settings = vec![("track_access", on(track_access))];
        if dictionaries {
            settings.extend(SMALL_DICTIONARIES);
        }
        let mut h = Harness::on(budget_under_eviction(dictionaries), write_buffer, bypass_r, None, 16 << 10, Promotion::EveryHit, &settings);
        for op in &ops {
            h.run(op);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// 64 KiB of DRAM over an SSD tier: most objects live on the SSD, which itself evicts
    /// super-leaves when its few slots fill up.
    #[test]
    fn hybrid_engine_never_serves_wrong_values(
        ops in proptest::collection::vec(op_strategy(3000), 1..1500),
        superleaf in prop_oneof![Just(4usize << 10), Just(16 << 10), Just(64 << 10)],
        blocks in prop_oneof![Just(64u64), Just(4096)],
        write_buffer in prop_oneof![Just(0usize), Just(256)],
        promotion in prop_oneof![Just(Promotion::EveryHit), Just(Promotion::SecondHit)],
        transient_faults in any::<bool>(),
        track_access in any::<bool>(),
        presence_filters in any::<bool>(),
        dictionaries in any::<bool>(),
        mode in prop_oneof![Just(DeviceCompression::Host), Just(DeviceCompression::None)],
    ) {
        let faulty = Arc::new(FaultyDevice::new(plain_device(blocks, mode)));
        let device: Arc<dyn BlockDevice> = faulty.clone();
        let mut settings = vec![("track_access", on(track_access)), ("ssd_presence_filters", on(presence_filters))];
        if dictionaries {
            settings.extend(SMALL_DICTIONARIES);
        }
        let mut h = Harness::on(budget_under_eviction(dictionaries), write_buffer, 3.0, Some(device), superleaf, promotion, &settings);
        // Faults that clear: reads and writes fail during the first half, then the device
        // heals, and every key is checked again (an old block kept behind a failed read
        // would now be served).
        if transient_faults {
            faulty.fail_every_nth(FaultOp::Read, 3);
            faulty.fail_every_nth(FaultOp::Write, 5);
        }
        for (i, op) in ops.iter().enumerate() {
            if i == ops.len() / 2 {
                faulty.clear();
            }
            h.run(op);
        }
        faulty.clear();
        for key in 0..3000 {
            h.run(&Op::Get { key });
        }
        h.cache.settle().unwrap();
    }
}

/// Dictionaries under the model, DRAM-only and over an SSD tier: medium values whose
/// schema changes every 400 versions, so that dictionaries are trained and swapped in
/// during the writes and leaves hold several at once while others are evicted (to the
/// SSD tier, decoded); no value is ever wrong, and the ratio is the dictionaries'.
#[test]
fn dictionaries_retrained_during_writes_never_serve_wrong_values() {
    for ssd in [false, true] {
        let keys: u16 = 2_000;
        let device = ssd.then(|| Arc::new(MemDevice::new(1 << 14)) as Arc<dyn BlockDevice>);
        let mut h = Harness::on(
            budget_under_eviction(true),
            256,
            3.0,
            device,
            16 << 10,
            Promotion::EveryHit,
            &SMALL_DICTIONARIES,
        );
        let mut most_held = 0;
        let mut rng = 0x5eed_u64;
        for round in 0..60u64 {
            for i in 0..100u64 {
                rng = crate::dictionary::training::mix(rng);
                let key = (rng % u64::from(keys)) as u16;
                let len = 150 + (rng >> 20) as usize % 1_200;
                h.run(&Op::Put {
                    key,
                    len,
                    ttl_ms: None,
                });
                h.run(&Op::Get {
                    key: (rng >> 40) as u16 % keys,
                });
                if i % 16 == 0 {
                    h.run(&Op::Delete {
                        key: (rng >> 48) as u16 % keys,
                    });
                }
                // A training finishes here, not at a moment the scheduler picks: one
                // that landed during `Maintain` would be adopted by every leaf at once.
                if let Some(d) = &h.cache.inner.dram.dictionaries {
                    d.settle();
                }
                let held = h.cache.inner.dram.dictionaries_held().len();
                most_held = most_held.max(held);
            }
            if round % 4 == 0 {
                h.run(&Op::Maintain);
            }
        }
        for key in 0..keys {
            h.run(&Op::Get { key });
        }
        let s = h.cache.stats();
        // Windows the current dictionary still fits train nothing (`training.rs`), and
        // which windows fit depends on what the flusher evicted by then: a swap per
        // schema change, and candidates beyond the first, are what must happen (it trained
        // 3 and swapped 2 in one run of six against the earlier bar of 4 trained).
        assert!(
            s.dictionaries_swapped >= 2 && s.dictionaries_trained >= 3,
            "{s:?}"
        );
        assert!(most_held >= 2, "at most {most_held} held at once: {s:?}");
        // Over the SSD tier leaves are evicted throughout; DRAM-only, a well-trained
        // dictionary may fit all 2,000 keys in the budget, and whether it does depends on
        // when training ends.
        assert!(!ssd || s.evicted_objects > 0, "{s:?}");
        assert!(s.dram_dictionary_bytes > 0, "{s:?}");
    }
}

/// An in-memory drive of `blocks` blocks that stores what it is given, driven in `mode`
/// (`Host`: the engine packs blocks; `None`: it writes them raw).
pub(crate) fn plain_device(blocks: u64, mode: DeviceCompression) -> Box<dyn BlockDevice> {
    let options = EmulatorOptions {
        mode,
        ..EmulatorOptions::default()
    };
    Box::new(CompressingDevice::new(MemDevice::new(blocks), options).unwrap())
}

/// A DRAM budget far below the data: the SSD tier serves most GETs with one read each.
#[test]
fn ssd_tier_serves_what_dram_evicted() {
    let device: Arc<dyn BlockDevice> = Arc::new(
        CompressingDevice::new(MemDevice::new(1 << 16), EmulatorOptions::default()).unwrap(),
    );
    let mut h = Harness::on(
        256 << 10,
        256,
        3.0,
        Some(device),
        64 << 10,
        Promotion::EveryHit,
        &[],
    );
    h.put_all(0..20_000, 64);
    for key in (0..20_000u16).step_by(5) {
        h.run(&Op::Delete { key });
    }
    let mut hits = 0;
    for key in 0..20_000u16 {
        h.run(&Op::Get { key });
        hits += u32::from(h.cache.get(&key_of(key)).unwrap().is_some());
    }
    h.cache.settle().unwrap();
    let s = h.cache.stats();
    assert!(s.evicted_leaves > 100, "{s:?}");
    assert_eq!(s.ssd_evicted_superleaves, 0, "{s:?}");
    assert_eq!(
        hits, 16_000,
        "every live key is on one tier or the other: {s:?}"
    );
    assert!(s.ssd_hits > 1000, "{s:?}");
    let reads_per_get = s.ssd_reads_per_ssd_get.unwrap();
    assert!(
        reads_per_get <= 1.0,
        "at most one 4 KiB read per SSD GET, saw {reads_per_get}"
    );
    assert!(
        s.wa_host.unwrap() > 1.0 && s.wr_nand.unwrap() > 1.0,
        "{s:?}"
    );
    assert!(
        s.ssd_index_bytes as f64 / s.ssd_objects as f64 <= 1.0,
        "{s:?}"
    );
    for view in [ScanView::Values, ScanView::Keys, ScanView::Bytes(64 << 10)] {
        h.run(&Op::Scan {
            start: 0,
            end: 19_999,
            limit: 100_000,
            view,
        });
    }
}

/// On a drive that stores blocks whole, `stats` counts the flash the tier really takes
/// (its written blocks) and objects per GiB of it; packing costs flusher time only in
/// `host` mode, and an emulating device reports no real flash figure.
#[test]
fn flash_figures_are_real_for_the_mode() {
    let mut per_gib = Vec::new();
    for mode in [
        DeviceCompression::Host,
        DeviceCompression::None,
        DeviceCompression::Emulate,
    ] {
        let device: Arc<dyn BlockDevice> = Arc::from(plain_device(1 << 14, mode));
        let mut h = Harness::on(
            256 << 10,
            256,
            3.0,
            Some(device.clone()),
            64 << 10,
            Promotion::EveryHit,
            &[],
        );
        h.put_all(0..20_000, 64);
        h.cache.settle().unwrap();
        device.drain().unwrap();
        let s = h.cache.stats();
        assert!(s.ssd_objects > 5_000, "{mode:?}: {s:?}");
        assert_eq!(s.ssd_compress_seconds > 0.0, mode.by_host(), "{mode:?}");
        if mode == DeviceCompression::Emulate {
            assert_eq!(s.ssd_flash_bytes, None, "{s:?}");
            continue;
        }
        let flash = s.ssd_flash_bytes.unwrap();
        assert_eq!(flash, device.stats().physical_used, "{mode:?}");
        assert!(flash >= s.ssd_leaf_bytes / 16, "{mode:?}: {s:?}");
        let objects = s.ssd_objects_per_flash_gib.unwrap();
        assert_eq!(objects, (s.ssd_objects << 30) as f64 / flash as f64);
        per_gib.push(objects);
    }
    assert!(
        per_gib[0] > 1.5 * per_gib[1],
        "packing stores more objects per GiB of flash: {per_gib:?}"
    );
}

/// `promotion = second_hit`: a key's first SSD hit leaves it on the SSD, its second
/// copies it into DRAM (`every_hit` copies on the first); every hit serves the right
/// value either way. Counted by `ssd_promotions`: a promotion may also be skipped because
/// a background eviction rewrote the super-leaf in between, never made early.
#[test]
fn second_hit_promotion_waits_for_the_second_hit() {
    for promotion in [Promotion::SecondHit, Promotion::EveryHit] {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 14));
        let mut h = Harness::on(256 << 10, 256, 3.0, Some(device), 16 << 10, promotion, &[]);
        // Enough keys that most of them leave the 256 KiB of DRAM.
        h.put_all(0..25_000, 64);
        h.cache.settle().unwrap();
        let promotions = |h: &Harness| h.cache.stats().ssd_promotions;
        let ssd_hits = |h: &Harness| h.cache.stats().ssd_hits;
        // Keys that left DRAM, each read once.
        let mut on_ssd = Vec::new();
        for key in (0..25_000u16).step_by(60) {
            let before = ssd_hits(&h);
            h.run(&Op::Get { key });
            if ssd_hits(&h) > before {
                on_ssd.push(key);
            }
        }
        assert!(on_ssd.len() > 200, "{}", on_ssd.len());
        let after_first = promotions(&h);
        for &key in &on_ssd {
            h.run(&Op::Get { key });
        }
        let after_second = promotions(&h) - after_first;
        match promotion {
            Promotion::SecondHit => {
                assert_eq!(after_first, 0, "no key was copied on its first hit");
                assert!(after_second > on_ssd.len() as u64 / 2, "{after_second}");
            }
            Promotion::EveryHit => {
                assert!(after_first > on_ssd.len() as u64 / 2, "{after_first}");
            }
        }
    }
}

#[test]
fn every_key_survives_many_splits() {
    let mut h = Harness::new(256 << 20, 256, 3.0);
    h.put_all(0..20_000, 64);
    // Descending too, so splits in the middle of leaves are exercised.
    h.put_all((0..20_000).rev().step_by(3), 40);
    for key in 0..20_000u16 {
        h.run(&Op::Get { key });
        assert!(h.cache.get(&key_of(key)).unwrap().is_some());
    }
    let stats = h.cache.stats();
    assert!(stats.leaf_splits > 100, "{stats:?}");
    assert_eq!(
        stats.dram_objects, 20_000,
        "after merging, every object is counted once"
    );
    for view in [ScanView::Values, ScanView::Keys, ScanView::Bytes(64 << 10)] {
        h.run(&Op::Scan {
            start: 0,
            end: 19_999,
            limit: 50_000,
            view,
        });
    }
}

#[test]
fn ttl_expires_objects() {
    let h = Harness::new(8 << 20, 256, 3.0);
    h.cache
        .put(b"short", b"lived", Some(Duration::from_secs(2)))
        .unwrap();
    h.cache.put(b"forever", b"young", None).unwrap();
    assert_eq!(
        h.cache.get(b"short").unwrap().as_deref(),
        Some(&b"lived"[..])
    );
    h.clock.advance(2000);
    assert_eq!(h.cache.get(b"short").unwrap(), None);
    assert_eq!(
        h.cache.get(b"forever").unwrap().as_deref(),
        Some(&b"young"[..])
    );
    assert_eq!(
        h.cache
            .scan(b"a".as_slice()..b"z".as_slice(), 10)
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn tiny_objects_take_no_medium_blobs() {
    let h = Harness::new(256 << 20, 256, 3.0);
    for i in 0..20_000u32 {
        h.cache
            .put(format!("{i:016}").as_bytes(), &[7u8; 64], None)
            .unwrap();
    }
    h.cache.inner.dram.merge_all(0);
    let s = h.cache.stats();
    assert_eq!(s.dram_medium_bytes, 0, "{s:?}");
}

/// Corrupt blocks and failing I/O on the SSD: misses and counters, never a wrong value.
#[test]
fn bad_blocks_and_io_errors_are_misses_not_wrong_values() {
    for mode in [DeviceCompression::Host, DeviceCompression::None] {
        let (mut h, faulty) = Harness::over_faulty_device(1 << 14, mode);
        h.put_all(0..8_000, 64);
        // Flip bits in the header, the payload and the checksum of blocks across the device.
        for lba in (0..400u64).step_by(3) {
            faulty.flip_bits_on_read(lba, [0usize, 30, 100, 21][lba as usize % 4], 0x04);
        }
        faulty.fail_lba(FaultOp::Read, 401);
        faulty.fail_lba(FaultOp::Read, 402);
        for key in 0..8_000u16 {
            h.run(&Op::Get { key });
        }
        // Writes that fail: the sub-pages they were meant for are forgotten, not left stale.
        faulty.fail_every_nth(FaultOp::Write, 3);
        h.put_all((0..8_000).step_by(2), 50);
        for key in (1..8_000u16).step_by(4) {
            h.run(&Op::Delete { key });
        }
        h.put_all(8_000..12_000, 64);
        for key in 0..12_000u16 {
            h.run(&Op::Get { key });
        }
        let s = h.cache.stats();
        assert!(s.checksum_failures > 0, "{s:?}");
        assert!(s.io_errors > 0, "{s:?}");
        assert!(s.ssd_hits > 0, "the healthy blocks still serve: {s:?}");
    }
}

/// `PutOptions::cas`: a CAS the client chose is stored as the object's, instead of one
/// the engine assigns, through `put_with` and `update` alike.
#[test]
fn a_client_cas_is_stored_as_the_objects_cas() {
    let h = Harness::new(64 << 20, 256, 3.0);
    let chosen = |cas| PutOptions {
        assign_cas: true,
        cas: Some(cas),
        ..PutOptions::default()
    };
    assert_eq!(h.cache.put_with(b"k", b"v", chosen(973)).unwrap(), 973);
    assert_eq!(
        h.cache
            .get_item(b"k", GetOptions::default())
            .unwrap()
            .unwrap()
            .cas,
        973
    );
    let put = Update::Put {
        value: b"w".to_vec(),
        options: chosen(5),
    };
    let ((), cas) = h.cache.update(b"k", |_| (put, ())).unwrap();
    assert_eq!(cas, Some(5));
    assert_eq!(
        h.cache
            .get_item(b"k", GetOptions::default())
            .unwrap()
            .unwrap(),
        Item {
            value: b"w".to_vec(),
            flags: 0,
            cas: 5,
            expires_at_ms: None,
            access: None,
            collection: false,
        }
    );
    let assign = PutOptions {
        assign_cas: true,
        ..PutOptions::default()
    };
    let assigned = h.cache.put_with(b"k", b"x", assign).unwrap();
    assert!(assigned != 5 && assigned != 0);
    assert_eq!(
        h.cache
            .get_item(b"k", GetOptions::default())
            .unwrap()
            .unwrap()
            .cas,
        assigned
    );
}

/// `dropped_objects` counts the objects the cache forgot to make room (memcached's
/// `evictions`), not the ones it moved: DRAM leaves evicted onto a roomy SSD drop
/// nothing, a small SSD drops super-leaves with their objects, DRAM-only eviction drops
/// the leaves' objects. Every key that went missing was counted. A flush is no eviction.
#[test]
fn dropped_objects_count_what_left_the_cache_to_make_room() {
    let hybrid = |blocks, dram| {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(blocks));
        Harness::on(
            dram,
            256,
            3.0,
            Some(device),
            16 << 10,
            Promotion::EveryHit,
            &[],
        )
    };
    let fill = |h: &mut Harness| {
        h.put_all(0..20_000, 64);
        h.cache.settle().unwrap();
        let missing = (0..20_000u16)
            .filter(|&k| h.cache.get(&key_of(k)).unwrap().is_none())
            .count() as u64;
        (h.cache.stats(), missing)
    };

    // 512 KiB of DRAM: the SSD's index of 20,000 objects (~36 KB) stays under 1/8 of the
    // budget, so writers refilling DRAM beside the flusher never make `make_room` give up
    // super-leaves for the index (at 256 KiB it did, on a busy machine).
    let (s, missing) = fill(&mut hybrid(1 << 16, 512 << 10));
    // About 2,800 of the 20,000 leave a DRAM that holds the rest compressed.
    assert!(s.evicted_objects > 1_000, "{s:?}");
    assert_eq!((s.dropped_objects, missing), (0, 0), "{s:?}");

    let (s, missing) = fill(&mut hybrid(64, 256 << 10));
    assert!(s.ssd_evicted_superleaves > 0, "{s:?}");
    assert!(
        missing > 0 && missing <= s.dropped_objects,
        "{missing} {s:?}"
    );
    assert!(s.dropped_objects <= 20_000, "{s:?}");

    let mut dram_only = Harness::new(256 << 10, 256, 3.0);
    let (s, missing) = fill(&mut dram_only);
    assert!(
        missing > 0 && missing <= s.dropped_objects,
        "{missing} {s:?}"
    );
    assert!(s.dropped_objects <= 20_000, "{s:?}");

    // A flush is no eviction. Background threads keep evicting for room meanwhile, so
    // only what cannot happen for room is compared: nothing is ever evicted from 64 MiB
    // of DRAM, nothing dropped over a roomy SSD.
    let mut roomy = Harness::new(64 << 20, 256, 3.0);
    roomy.put_all(0..20_000, 64);
    roomy.cache.flush_all().unwrap();
    let s = roomy.cache.stats();
    assert_eq!(
        (s.evicted_leaves, s.evicted_objects, s.dropped_objects),
        (0, 0, 0),
        "{s:?}"
    );
    let mut over_ssd = hybrid(1 << 16, 512 << 10);
    over_ssd.put_all(0..20_000, 64);
    over_ssd.cache.settle().unwrap();
    assert!(over_ssd.cache.stats().ssd_objects > 0);
    over_ssd.cache.flush_all().unwrap();
    let s = over_ssd.cache.stats();
    assert_eq!(
        (s.ssd_evicted_superleaves, s.dropped_objects),
        (0, 0),
        "{s:?}"
    );
}

/// A client may choose any CAS (meta `E`), the largest ones too; the versions the engine
/// assigns afterwards must still differ from every earlier version of the key — in its
/// leaf, and once those versions left DRAM (a flush), for every key.
#[test]
fn assigned_versions_stay_distinct_after_a_client_cas_at_the_top_of_the_range() {
    let h = Harness::new(64 << 20, 256, 3.0);
    let assign = PutOptions {
        assign_cas: true,
        ..PutOptions::default()
    };
    for (round, top) in [u64::MAX - 1, u64::MAX].into_iter().enumerate() {
        let key = format!("k{round}");
        let chosen = PutOptions {
            cas: Some(top),
            ..assign
        };
        let mut seen = vec![h.cache.put_with(key.as_bytes(), b"v", chosen).unwrap()];
        for _ in 0..3 {
            let cas = h.cache.put_with(key.as_bytes(), b"w", assign).unwrap();
            assert!(!seen.contains(&cas), "{cas} repeats one of {seen:?}");
            assert_eq!(
                h.cache
                    .get_item(key.as_bytes(), GetOptions::default())
                    .unwrap()
                    .unwrap()
                    .cas,
                cas
            );
            seen.push(cas);
        }
        h.cache.flush_all().unwrap();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let cas = h.cache.put_with(b"other", b"x", assign).unwrap();
            assert!(!seen.contains(&cas), "{cas} repeats one of {seen:?}");
            seen.push(cas);
        }
    }
}

/// `track_access` through the public API: a GET reports the state before it and marks
/// the object (a peek does not), a write starts afresh or with the state it names, and
/// an object that comes back from the SSD tier starts fetched by the GET that promoted
/// it. Without the setting nothing is reported.
#[test]
fn access_state_through_the_api() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 14));
    let h = Harness::on(
        256 << 10,
        256,
        3.0,
        Some(device),
        16 << 10,
        Promotion::EveryHit,
        &[("track_access", "true")],
    );
    let state = |fetched, since_start_ms| {
        Some(AccessState {
            fetched,
            last_access_ms: START_MS + since_start_ms,
        })
    };
    let (get, peek) = (GetOptions::default(), GetOptions { peek: true });
    let access = |options| h.cache.get_item(b"k", options).unwrap().unwrap().access;
    h.cache.put(b"k", b"v", None).unwrap();
    h.clock.advance(2_500);
    assert_eq!(access(peek), state(false, 0));
    assert_eq!(access(get), state(false, 0));
    h.clock.advance(1_000);
    assert_eq!(access(get), state(true, 2_000));
    assert_eq!(access(peek), state(true, 3_000));
    // A touch: rewritten to re-date it, fetched and accessed now.
    let touched = h.cache.update(b"k", |item| {
        let item = item.unwrap();
        let options = PutOptions {
            expires_at_ms: Some(START_MS + 60_000),
            access: state(true, 3_000),
            ..PutOptions::default()
        };
        let value = item.value.clone();
        (Update::Put { value, options }, item.access)
    });
    assert_eq!(
        touched.unwrap().0,
        state(true, 3_000),
        "update sees it as it is"
    );
    assert_eq!(access(peek), state(true, 3_000));
    h.cache.put(b"k", b"w", None).unwrap();
    assert_eq!(access(get), state(false, 3_000));
    h.cache.delete(b"k").unwrap();
    h.cache.put(b"k", b"x", None).unwrap();
    assert_eq!(access(peek), state(false, 3_000));

    // Down to the SSD tier and back.
    let ssd = h.cache.inner.ssd.as_ref().unwrap();
    h.cache.inner.dram.evict_all(Some(ssd), h.clock.now_ms());
    h.clock.advance(2_000);
    assert_eq!(access(peek), None, "the SSD tier keeps no state");
    assert_eq!(
        access(get),
        state(false, 5_000),
        "promoted by a peek: not fetched"
    );
    h.cache.inner.dram.evict_all(Some(ssd), h.clock.now_ms());
    assert_eq!(access(get), None);
    assert_eq!(
        access(peek),
        state(true, 5_000),
        "promoted by a GET: fetched"
    );

    let untracked = Harness::new(256 << 10, 256, 3.0);
    untracked.cache.put(b"k", b"v", None).unwrap();
    assert_eq!(
        untracked.cache.get_item(b"k", get).unwrap().unwrap().access,
        None
    );
}
