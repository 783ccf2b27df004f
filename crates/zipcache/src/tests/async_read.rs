//! The asynchronous GET with its SSD read in flight while writers move on: reads that
//! complete out of order, after the block was rewritten, re-homed under a new generation,
//! or after the key was deleted. The answer may be any version current during the GET;
//! what the cache keeps afterwards must be the newest.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use zipcache_device::{BlockDevice, DeviceStats, HeldDevice, MemDevice};

use super::model::{Harness, Op, block_on, key_of};
use crate::GetOptions;
use crate::config::{Clock, Promotion};

fn harness(late: bool) -> (Harness, Arc<HeldDevice>) {
    let device = Arc::new(HeldDevice::new(1 << 14, late));
    let h = Harness::on(
        128 << 10,
        256,
        3.0,
        Some(device.clone()),
        16 << 10,
        Promotion::EveryHit,
        &[],
    );
    (h, device)
}

fn evict_to_ssd(h: &Harness) {
    let inner = &h.cache.inner;
    inner
        .dram
        .evict_all(Some(inner.ssd.as_ref().unwrap()), h.clock.now_ms());
}

/// Releases the held reads and resolves `get` (its retries read at once).
fn complete(device: &HeldDevice, get: crate::AsyncGet) -> Option<Vec<u8>> {
    device.release_all();
    block_on(get).unwrap().map(|item| item.value)
}

fn value(h: &Harness, key: u16) -> Option<Vec<u8>> {
    h.cache.get(&key_of(key)).unwrap()
}

#[test]
fn reads_completing_out_of_order_answer_their_own_keys() {
    let (mut h, device) = harness(false);
    h.put_all(0..3_000, 64);
    evict_to_ssd(&h);
    let keys = [5u16, 1_500, 2_999, 700];
    let gets: Vec<_> = keys
        .iter()
        .map(|&k| h.cache.get_item_async(&key_of(k), GetOptions::default()))
        .collect();
    assert_eq!(device.in_flight(), keys.len(), "every GET reads the SSD");
    // `release_all` completes the newest first: the reverse of submission.
    device.release_all();
    for (k, get) in keys.iter().zip(gets) {
        let answer = block_on(get).unwrap().map(|item| item.value);
        assert_eq!(answer, value(&h, *k), "key {k}");
    }
    for k in keys {
        h.run(&Op::Get { key: k });
    }
}

/// `ssd_reads_in_flight` counts a GET from its read's submission, whether or not anything
/// awaits it yet, until the GET has its answer or is dropped.
#[test]
fn a_get_counts_in_flight_until_answered_or_dropped() {
    let (mut h, device) = harness(false);
    h.put_all(0..3_000, 64);
    evict_to_ssd(&h);
    let in_flight = |h: &Harness| h.cache.stats().ssd_reads_in_flight;
    let answered = h.cache.get_item_async(&key_of(5), GetOptions::default());
    let dropped = h
        .cache
        .get_item_async(&key_of(1_500), GetOptions::default());
    assert_eq!(device.in_flight(), 2);
    assert_eq!(in_flight(&h), 2, "counted before anything awaits them");
    drop(dropped);
    assert_eq!(in_flight(&h), 1, "a dropped GET leaves the gauge");
    assert!(complete(&device, answered).is_some());
    assert_eq!(in_flight(&h), 0);
}

/// A GET with its read in flight says how many bytes its buffer holds (a server charges
/// them to the connection); one answered at once holds none.
#[test]
fn a_get_in_flight_reports_its_buffer() {
    let (mut h, device) = harness(false);
    h.put_all(0..3_000, 64);
    evict_to_ssd(&h);
    let reading = h.cache.get_item_async(&key_of(5), GetOptions::default());
    assert_eq!(device.in_flight(), 1);
    let block = zipcache_device::BLOCK_SIZE;
    // One block, and the spare block that aligns it.
    assert_eq!(reading.buffer_bytes(), 2 * block);
    assert!(complete(&device, reading).is_some());
    h.put_all(3_000..3_001, 64);
    let mut ready = h
        .cache
        .get_item_async(&key_of(3_000), GetOptions::default());
    assert_eq!(ready.buffer_bytes(), 0, "a DRAM hit");
    assert!(ready.take_ready().is_some());
}

/// An abandoned GET waits only for its device read, which holds its buffer until then,
/// and then ends: nothing decoded, promoted or counted as a hit or a miss.
#[test]
fn an_abandoned_get_ends_with_its_read_and_answers_nothing() {
    let (mut h, device) = harness(false);
    h.put_all(0..3_000, 64);
    evict_to_ssd(&h);
    let before = h.cache.stats();
    let reading = h.cache.get_item_async(&key_of(5), GetOptions::default());
    assert_eq!(device.in_flight(), 1);
    let mut freed = Box::pin(reading.abandon().expect("a read in flight"));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(
        freed.as_mut().poll(&mut cx).is_pending(),
        "the read holds its buffer"
    );
    device.release_all();
    block_on(freed);
    let after = h.cache.stats();
    assert_eq!(after.ssd_hits, before.ssd_hits);
    assert_eq!(after.misses, before.misses);
    assert_eq!(
        after.ssd_promotions, before.ssd_promotions,
        "promotes every hit"
    );
    assert_eq!(after.ssd_reads_in_flight, 0);
    // A GET answered at once has nothing to wait for.
    h.put_all(3_000..3_001, 64);
    let ready = h
        .cache
        .get_item_async(&key_of(3_000), GetOptions::default());
    assert!(ready.abandon().is_none());
}

#[test]
fn a_read_overtaken_by_a_rewrite_never_installs_the_older_value() {
    let (mut h, device) = harness(false);
    h.put_all(0..3_000, 64);
    evict_to_ssd(&h);
    let old = value(&h, 42);
    evict_to_ssd(&h);
    let get = h.cache.get_item_async(&key_of(42), GetOptions::default());
    assert_eq!(device.in_flight(), 1);
    // A newer version reaches the same sub-page while the old block is in flight.
    h.put_all(40..45, 30);
    evict_to_ssd(&h);
    let new = value(&h, 42);
    assert_ne!(old, new);
    evict_to_ssd(&h);
    let answer = complete(&device, get);
    assert!(
        answer == old || answer == new,
        "an answer no GET could give"
    );
    // The overtaken copy must not have been promoted over the newer one.
    h.run(&Op::Get { key: 42 });
}

#[test]
fn a_read_of_a_block_rehomed_by_a_split_reads_again() {
    let (mut h, device) = harness(true);
    h.put_all((0..3_000).step_by(4), 64);
    evict_to_ssd(&h);
    let get = h.cache.get_item_async(&key_of(400), GetOptions::default());
    assert_eq!(device.in_flight(), 1);
    // Fill the gaps: super-leaves split, so blocks are rewritten under new generations
    // and the planned block may now belong to a different layout.
    h.put_all(0..3_000, 70);
    evict_to_ssd(&h);
    let answer = complete(&device, get);
    assert_eq!(answer, value(&h, 400));
    h.run(&Op::Get { key: 400 });
}

#[test]
fn a_key_deleted_while_its_read_is_in_flight_stays_deleted() {
    let (mut h, device) = harness(false);
    h.put_all(0..3_000, 64);
    evict_to_ssd(&h);
    let old = value(&h, 77);
    evict_to_ssd(&h);
    let get = h.cache.get_item_async(&key_of(77), GetOptions::default());
    assert_eq!(device.in_flight(), 1);
    h.run(&Op::Delete { key: 77 });
    evict_to_ssd(&h);
    let answer = complete(&device, get);
    assert!(answer.is_none() || answer == old);
    h.run(&Op::Get { key: 77 });
    assert_eq!(value(&h, 77), None);
}

/// Overload: a leaf dropped unwritten (the flusher behind) must not let an older SSD
/// copy of any of its keys be served, nor come back when the flusher evicts it.
#[test]
fn objects_dropped_unwritten_never_expose_older_ssd_copies() {
    let (mut h, device) = harness(false);
    // Reads complete at once here: this test is about what they find, and a read held
    // with nothing to release it would never finish (whether a GET reads the SSD at all
    // depends on whether a leaf's tombstones were merged before it was dropped).
    device.release_all();
    h.put_all(0..3_000, 64);
    evict_to_ssd(&h);
    // Newer versions and tombstones in DRAM, then dropped instead of written.
    h.put_all((0..3_000).step_by(2), 50);
    for key in (1..3_000).step_by(6) {
        h.run(&Op::Delete { key });
    }
    let now = h.clock.now_ms();
    while h.cache.inner.dram.drop_one(now) {}
    assert!(h.cache.stats().ssd_write_drops > 0);
    for key in 0..3_000 {
        h.run(&Op::Get { key });
    }
    evict_to_ssd(&h);
    for key in 0..3_000 {
        h.run(&Op::Get { key });
    }
}

/// A leaf dropped unwritten keeps its dirty keys as tombstones, so the keys it did not
/// hold — whose only copies are on the SSD — are still served, before and after the
/// flusher evicts it (marking the whole leaf lost made the SSD tier forget its range).
#[test]
fn a_leaf_dropped_unwritten_leaves_the_rest_of_its_range_to_the_ssd() {
    let (mut h, device) = harness(false);
    device.release_all(); // reads complete at once, as in the test above
    h.put_all(0..3_000, 64);
    evict_to_ssd(&h);
    // Every fourth key rewritten in DRAM; the others live only on the SSD.
    h.put_all((0..3_000).step_by(4), 50);
    let now = h.clock.now_ms();
    for _ in 0..5 {
        assert!(h.cache.inner.dram.drop_one(now));
    }
    let drops = h.cache.stats().ssd_write_drops;
    assert!(drops > 0 && drops < 750, "{drops}");
    let only_on_ssd = (0..3_000).filter(|k| k % 4 != 0);
    for key in only_on_ssd.clone() {
        assert!(value(&h, key).is_some(), "key {key} was never dropped");
    }
    for key in 0..3_000 {
        h.run(&Op::Get { key });
    }
    evict_to_ssd(&h);
    for key in only_on_ssd {
        assert!(value(&h, key).is_some(), "key {key} after the flusher");
    }
    for key in 0..3_000 {
        h.run(&Op::Get { key });
    }
}

/// A value of `len` bytes stored under `key` 10 on the harness: with `len` above
/// `medium_max`, a large object in BT_LO.
const LARGE: usize = 5_000;

#[test]
fn an_async_get_of_a_large_object_waits_for_its_extent() {
    let (mut h, device) = harness(false);
    h.put_all(10..11, LARGE);
    assert_eq!(h.cache.stats().large_objects, 1);
    let mut get = h.cache.get_item_async(&key_of(10), GetOptions::default());
    assert!(
        get.take_ready().is_none(),
        "answered before its extent was read"
    );
    assert_eq!(device.in_flight(), 1, "the extent read is in flight");
    assert_eq!(h.cache.stats().ssd_reads_in_flight, 1);
    let answer = complete(&device, get);
    assert!(answer.is_some());
    assert_eq!(answer, value(&h, 10));
    assert_eq!(h.cache.stats().ssd_reads_in_flight, 0);
    h.run(&Op::Get { key: 10 });
}

/// What a test does to the large object under key 10 while its read is in flight.
#[derive(Clone, Copy, Debug)]
enum Change {
    LargeAgain,
    Small,
    Delete,
}

/// The read's block holds the old extent, intact: only checking BT_LO after the read
/// tells that the key moved on.
#[test]
fn a_large_object_changed_while_its_read_is_in_flight_never_answers_the_old_value() {
    for change in [Change::LargeAgain, Change::Small, Change::Delete] {
        let (mut h, device) = harness(false);
        h.put_all(10..11, LARGE);
        let old = value(&h, 10);
        let get = h.cache.get_item_async(&key_of(10), GetOptions::default());
        assert_eq!(device.in_flight(), 1, "{change:?}");
        match change {
            Change::LargeAgain => h.put_all(10..11, LARGE + 1_000),
            Change::Small => h.put_all(10..11, 100),
            Change::Delete => h.run(&Op::Delete { key: 10 }),
        }
        let new = value(&h, 10);
        assert_ne!(old, new);
        let answer = complete(&device, get);
        assert_eq!(answer, new, "{change:?}: the value after the change");
        h.run(&Op::Get { key: 10 });
    }
}

#[test]
fn a_damaged_extent_read_in_flight_is_a_miss() {
    let (mut h, device) = harness(false);
    h.put_all(10..11, LARGE);
    let mut block = vec![0u8; zipcache_device::BLOCK_SIZE];
    let extent = (0..device.block_count())
        .find(|&lba| {
            device.read(lba, &mut block).unwrap();
            block.starts_with(b"ZCLO")
        })
        .expect("the extent is on the device");
    block[100] ^= 0x20; // a byte of the value
    device.write(extent, &block).unwrap();
    let get = h.cache.get_item_async(&key_of(10), GetOptions::default());
    assert_eq!(device.in_flight(), 1);
    assert_eq!(complete(&device, get), None);
    assert!(h.cache.stats().checksum_failures > 0);
}

/// A memory device whose writes wait while the test holds them: a flusher writing to it
/// is stuck for as long as the test says.
struct HeldWrites {
    inner: MemDevice,
    open: Mutex<bool>,
    opened: Condvar,
}

impl HeldWrites {
    fn set_open(&self, open: bool) {
        *self.open.lock() = open;
        self.opened.notify_all();
    }
}

impl BlockDevice for HeldWrites {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: u64, buf: &[u8]) -> std::io::Result<()> {
        let mut open = self.open.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
        self.inner.write(lba, buf)
    }
    fn trim(&self, lba: u64, count: u64) -> std::io::Result<()> {
        self.inner.trim(lba, count)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

/// Issue 20, item 8: a GET's promotion ran the writers' back-pressure on the caller's
/// thread, waiting up to `flush_wait_ms` (60 s here) for a flusher that cannot write.
/// It must return at once, the object left on the SSD while DRAM is far over budget.
#[test]
fn a_promotion_never_waits_for_the_flusher() {
    let device = Arc::new(HeldWrites {
        inner: MemDevice::new(1 << 14),
        open: Mutex::new(true),
        opened: Condvar::new(),
    });
    let mut h = Harness::on(
        1 << 20,
        256,
        3.0,
        Some(device.clone()),
        16 << 10,
        Promotion::EveryHit,
        &[],
    );
    // Keys 50,000..53,000 on the SSD, then 20,000..26,000 dirty in DRAM, then the even
    // keys of the first range copied back (clean): the odd ones at its end share no DRAM
    // leaf with the dirty ones, which the flusher locks while it writes them (the leaves
    // of the super-leaf it writes, and the leaf left of them).
    h.put_all(50_000..53_000, 64);
    evict_to_ssd(&h);
    h.put_all((20_000..26_000).filter(|k| k % 97 != 0), 200);
    for key in (50_000..53_000).step_by(2) {
        h.run(&Op::Get { key });
    }
    let before = h.cache.stats();
    assert!(before.dram_used > 2 * (64 << 10), "{before:?}");
    // From here until the writes go on, nothing that waits for the flusher's DRAM leaves
    // (`stats` counts every leaf under its lock).
    device.set_open(false);
    h.cache.set_dram_capacity(64 << 10).unwrap();
    let answer = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let cache = &h.cache;
        s.spawn(move || tx.send(cache.get(&key_of(52_999)).unwrap()));
        let answer = rx.recv_timeout(Duration::from_secs(10));
        // Whatever happened: the flusher (and a GET waiting for it) may go on.
        device.set_open(true);
        answer
    });
    let answer = answer.expect("the GET waited for the flusher");
    let s = h.cache.stats();
    assert!(answer.is_some());
    assert_eq!(s.ssd_promotions, before.ssd_promotions, "{s:?}");
    assert_eq!(s.ssd_promotions_skipped, 1, "{s:?}");
    assert_eq!(s.ssd_write_drops, 0, "nothing dropped for a GET: {s:?}");
    h.run(&Op::Get { key: 52_999 });
}
