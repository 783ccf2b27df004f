//! The asynchronous GET with its SSD read in flight while writers move on: reads that
//! complete out of order, after the block was rewritten, re-homed under a new generation,
//! or after the key was deleted. The answer may be any version current during the GET;
//! what the cache keeps afterwards must be the newest.

use std::sync::Arc;

use zipcache_device::HeldDevice;

use crate::GetOptions;
use crate::config::{Clock, Promotion};
use crate::model_tests::{Harness, Op, block_on, key_of};

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
