use zipcache_device::{
    AlignedBuf, BLOCK_SIZE, CompressingDevice, DeviceCompression, EmulatorOptions, FaultyDevice,
    MemDevice,
};

use super::extent::checksum;
use super::*;
use crate::format::extent::{HEADER, STORED_LZ4, STORED_RAW};
use crate::restart::sealed_file::{self, IndexFile};

fn region(blocks: u64) -> LargeObjects {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(blocks + 10));
    LargeObjects::new(device, 10, blocks, Arc::new(Memory::default()))
}

#[test]
fn objects_round_trip_and_replace() {
    let lo = region(64);
    let big = vec![7u8; 10_000];
    assert!(lo.put(b"k", &big, Meta::default()));
    assert_eq!(lo.get(b"k", 0).unwrap().0, big);
    assert!(lo.put(
        b"k",
        &[1u8; 5000],
        Meta {
            flags: 3,
            ..Meta::default()
        }
    ));
    let (v, m) = lo.get(b"k", 0).unwrap();
    assert_eq!((v.len(), m.flags), (5000, 3));
    assert_eq!(lo.len(), 1);
    lo.remove(b"k");
    assert!(lo.get(b"k", 0).is_none());
    assert!(lo.is_empty());
}

/// An extent pinned byte by byte (`docs/FORMAT.md`, "The large-object region").
#[test]
fn the_extent_layout_is_pinned() {
    let lo = region(64);
    let value = vec![7u8; 5000];
    assert!(lo.put(b"key", &value, Meta::default()));
    let mut buf = AlignedBuf::zeroed(2);
    lo.device.read(10, &mut buf).unwrap();
    let mut head = Vec::new();
    head.extend_from_slice(b"ZCLO");
    head.extend_from_slice(&[2, 0]); // version, encoding: raw
    head.extend_from_slice(&3u16.to_le_bytes());
    head.extend_from_slice(&5000u32.to_le_bytes());
    head.extend_from_slice(&1u64.to_le_bytes()); // the run's first sequence number
    assert_eq!(&buf[..20], &head[..]);
    let tail = [5000u32.to_le_bytes(), [0; 4]].concat(); // stored length, reserved
    assert_eq!(&buf[24..32], &tail[..]);
    assert_eq!(&buf[32..35], b"key");
    assert_eq!(&buf[35..5035], &value[..]);
    assert!(buf[5035..].iter().all(|&b| b == 0));
    let crc = [&head[..], &tail, b"key", &value]
        .iter()
        .fold(0, |crc, part| crc32c::crc32c_append(crc, part));
    assert_eq!(&buf[20..24], &crc.to_le_bytes());
}

/// Finding 4 of issue 9: the object counter is a hint that can read 0 for a moment
/// while an entry is in BT_LO (one put's insert not yet counted, another put's FIFO
/// drop already subtracted). A removal must not trust it.
#[test]
fn removal_does_not_trust_the_object_counter() {
    let lo = region(64);
    assert!(lo.put(b"k", &[7u8; 5000], Meta::default()));
    lo.counters.objects.store(0, Ordering::Relaxed);
    lo.remove(b"k");
    lo.counters.objects.store(1, Ordering::Relaxed);
    assert!(lo.get(b"k", 0).is_none(), "an older large version survived");
}

/// A GET's read of an extent BT_LO stopped pointing at before the read completed
/// (overwritten, deleted, dropped from the log) is not trusted, even if its bytes are
/// intact; damaged bytes of the current extent are a miss.
#[test]
fn a_read_is_checked_against_bt_lo_when_it_completes() {
    let lo = region(64);
    let read_of = |lo: &LargeObjects| {
        let read = lo.plan_get(b"k", 0).unwrap();
        let mut buf = read.buffer();
        lo.device.read(read.lba(), &mut buf).unwrap();
        (read, buf)
    };
    let moved = |finished| matches!(finished, LoFinished::Moved);
    assert!(lo.put(b"k", &[1u8; 5000], Meta::default()));
    let (read, old) = read_of(&lo);
    assert!(lo.put(b"k", &[2u8; 5000], Meta::default()));
    assert!(moved(lo.finish_get(read, b"k", Some(old))), "overwritten");
    let (read, current) = read_of(&lo);
    match lo.finish_get(read, b"k", Some(current)) {
        LoFinished::Done(Some((value, _))) => assert_eq!(value, vec![2u8; 5000]),
        _ => panic!("the current extent"),
    }
    let (read, mut damaged) = read_of(&lo);
    damaged[HEADER + 10] ^= 1;
    assert!(matches!(
        lo.finish_get(read, b"k", Some(damaged)),
        LoFinished::Done(None)
    ));
    assert_eq!(lo.counters.checksum_failures.load(Ordering::Relaxed), 1);
    let (read, _) = read_of(&lo);
    assert!(matches!(
        lo.finish_get(read, b"k", None),
        LoFinished::Done(None)
    ));
    assert_eq!(lo.counters.io_errors.load(Ordering::Relaxed), 1);
    let (read, intact) = read_of(&lo);
    lo.remove(b"k");
    assert!(moved(lo.finish_get(read, b"k", Some(intact))), "deleted");
}

/// A region on a device that asks the host to compress (`device_compression=host`),
/// which also accounts the blocks written.
fn host_region(blocks: u64) -> (LargeObjects, Arc<dyn BlockDevice>) {
    let options = EmulatorOptions {
        mode: DeviceCompression::Host,
        ..EmulatorOptions::default()
    };
    let device = CompressingDevice::new(MemDevice::new(blocks + 10), options).unwrap();
    let device: Arc<dyn BlockDevice> = Arc::new(device);
    let lo = LargeObjects::new(device.clone(), 10, blocks, Arc::new(Memory::default()));
    (lo, device)
}

/// JSON-like text: compresses several times over with LZ4.
fn document(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0u32;
    while out.len() < len {
        out.extend_from_slice(
            format!(r#"{{"id":{i},"name":"airport {}","state":"CA"}},"#, i * 7).as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    out
}

/// Bytes LZ4 cannot shrink (xorshift).
fn noise(len: usize) -> Vec<u8> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn extent_blocks(lo: &LargeObjects, key: &[u8]) -> u32 {
    lo.lookup(key).unwrap().blocks
}

#[test]
fn host_mode_stores_a_value_compressed_in_fewer_blocks_and_raw_when_that_does_not_pay() {
    let (lo, device) = host_region(256);
    let doc = document(40_000);
    let raw_blocks = (HEADER + 3 + doc.len()).div_ceil(BLOCK_SIZE) as u32;
    assert!(lo.put(b"doc", &doc, Meta::default()));
    let doc_blocks = extent_blocks(&lo, b"doc");
    assert!(doc_blocks * 3 <= raw_blocks, "{doc_blocks} of {raw_blocks}");
    assert_eq!(lo.get(b"doc", 0).unwrap().0, doc);
    assert!(lo.counters.compress_ns.load(Ordering::Relaxed) > 0);

    let random = noise(10_000);
    assert!(lo.put(b"noise", &random, Meta::default()));
    let noise_blocks = extent_blocks(&lo, b"noise");
    assert_eq!(noise_blocks, 3, "stored raw");
    assert_eq!(lo.get(b"noise", 0).unwrap().0, random);

    // What reaches the device is the blocks of the extents as stored, and that is
    // what a plain drive's flash holds (`ssd_flash_bytes`).
    device.drain().unwrap();
    let written = u64::from(doc_blocks + noise_blocks) * BLOCK_SIZE as u64;
    assert_eq!(lo.counters.bytes_written.load(Ordering::Relaxed), written);
    assert_eq!(device.stats().host_bytes_written, written);
    assert_eq!(device.stats().physical_used, written);

    // Without `host`, the same value is stored whole.
    let plain = region(256);
    assert!(plain.put(b"doc", &doc, Meta::default()));
    assert_eq!(extent_blocks(&plain, b"doc"), raw_blocks);
    assert_eq!(plain.counters.compress_ns.load(Ordering::Relaxed), 0);
    assert_eq!(plain.get(b"doc", 0).unwrap().0, doc);
}

/// Every way a compressed extent can be damaged reads as a miss, counted, never as
/// other bytes and never as a panic: a flipped bit (the CRC), and header fields that
/// lie although the CRC was made to match (a stored length past the extent or short
/// of the LZ4 block, another encoding, another version).
#[test]
fn damaged_compressed_extents_read_as_misses() {
    let (lo, _device) = host_region(64);
    let doc = document(20_000);
    assert!(lo.put(b"k", &doc, Meta::default()));
    let read_of = || {
        let read = lo.plan_get(b"k", 0).unwrap();
        let mut buf = read.buffer();
        lo.device.read(read.lba(), &mut buf).unwrap();
        (read, buf)
    };
    let (_, intact) = read_of();
    assert_eq!(intact[5], STORED_LZ4);
    let stored_len = u32::from_le_bytes(intact[24..28].try_into().unwrap()) as usize;
    let resealed = |mut buf: AlignedBuf, body: usize| {
        let crc = checksum(&buf, body.min(buf.len() - HEADER));
        buf[20..24].copy_from_slice(&crc.to_le_bytes());
        buf
    };
    type Damage<'a> = Box<dyn Fn(AlignedBuf) -> AlignedBuf + 'a>;
    let damage: Vec<(&str, Damage<'_>)> = vec![
        (
            "a flipped bit in the stored value",
            Box::new(|mut b| {
                b[HEADER + 1 + stored_len / 2] ^= 0x10;
                b
            }),
        ),
        (
            "a flipped bit in the stored length",
            Box::new(|mut b| {
                b[25] ^= 1;
                b
            }),
        ),
        (
            "a stored length past the extent",
            Box::new(|mut b| {
                let len = b.len() as u32;
                b[24..28].copy_from_slice(&len.to_le_bytes());
                resealed(b, 1 + len as usize)
            }),
        ),
        (
            "a stored length one short",
            Box::new(|mut b| {
                let len = stored_len as u32 - 1;
                b[24..28].copy_from_slice(&len.to_le_bytes());
                resealed(b, 1 + len as usize)
            }),
        ),
        (
            "a stored length of u32::MAX",
            Box::new(|mut b| {
                b[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
                b
            }),
        ),
        (
            "the raw encoding",
            Box::new(|mut b| {
                b[5] = STORED_RAW;
                resealed(b, 1 + stored_len)
            }),
        ),
        (
            "an unknown encoding",
            Box::new(|mut b| {
                b[5] = 7;
                resealed(b, 1 + stored_len)
            }),
        ),
        (
            "version 1",
            Box::new(|mut b| {
                b[4] = 1;
                resealed(b, 1 + stored_len)
            }),
        ),
    ];
    for (failures, (what, damage)) in (1..).zip(&damage) {
        let (read, buf) = read_of();
        let damaged = damage(buf);
        assert!(
            matches!(
                lo.finish_get(read, b"k", Some(damaged)),
                LoFinished::Done(None)
            ),
            "{what}"
        );
        assert_eq!(
            lo.counters.checksum_failures.load(Ordering::Relaxed),
            failures,
            "{what}"
        );
    }
    let (read, _) = read_of();
    // What a read future polled after completing gives back: no header at all.
    let short = AlignedBuf::zeroed(0);
    assert!(matches!(
        lo.finish_get(read, b"k", Some(short)),
        LoFinished::Done(None)
    ));
    // The extent itself was never touched.
    assert_eq!(lo.get(b"k", 0).unwrap().0, doc);
}

/// Through a device that flips bits as it reads: a miss, never a wrong value.
#[test]
fn bits_flipped_on_the_device_make_a_compressed_extent_a_miss() {
    let options = EmulatorOptions {
        mode: DeviceCompression::Host,
        ..EmulatorOptions::default()
    };
    let inner = CompressingDevice::new(MemDevice::new(74), options).unwrap();
    let faulty = Arc::new(FaultyDevice::new(inner));
    let device: Arc<dyn BlockDevice> = faulty.clone();
    let lo = LargeObjects::new(device, 10, 64, Arc::new(Memory::default()));
    let doc = document(30_000);
    assert!(lo.put(b"k", &doc, Meta::default()));
    let lba = lo.lookup(b"k").unwrap().lba;
    faulty.flip_bits_on_read(lba, 100, 0x04);
    assert_eq!(lo.get(b"k", 0), None);
    assert_eq!(lo.counters.checksum_failures.load(Ordering::Relaxed), 1);
    faulty.clear();
    assert_eq!(lo.get(b"k", 0).unwrap().0, doc);
}

#[test]
fn the_log_wraps_and_drops_the_oldest() {
    let lo = region(32);
    for i in 0..100u32 {
        let key = format!("key-{i:04}");
        assert!(lo.put(key.as_bytes(), &vec![i as u8; 6000], Meta::default()));
    }
    // 2 blocks each in a 32-block region: the newest 16 survive.
    let live: Vec<u32> = (0..100)
        .filter(|i| lo.get(format!("key-{i:04}").as_bytes(), 0).is_some())
        .collect();
    assert!(
        live.len() >= 15 && live.iter().all(|&i| i >= 84),
        "{live:?}"
    );
    for &i in &live {
        assert_eq!(
            lo.get(format!("key-{i:04}").as_bytes(), 0).unwrap().0,
            vec![i as u8; 6000]
        );
    }
    assert_eq!(lo.len(), live.len() as u64);
    assert!(lo.counters.dropped.load(Ordering::Relaxed) >= 84);
}

#[test]
fn wrapping_drops_the_extents_it_skips() {
    let lo = region(10);
    let one = [1u8; 100];
    for i in 0..10u32 {
        assert!(lo.put(format!("a{i}").as_bytes(), &one, Meta::default()));
    }
    // Wraps to block 0 and overwrites a0..a2; c, d, e then take blocks 3, 4, 5.
    assert!(lo.put(b"three", &[3u8; 9000], Meta::default()));
    for key in ["c", "d", "e"] {
        assert!(lo.put(key.as_bytes(), &one, Meta::default()));
    }
    // Five blocks do not fit after block 6: the log wraps again, skipping a6..a9 at
    // the end, and overwrites `three`, `c` and `d` at the start. All of them must
    // leave BT_LO: none may point at blocks that now hold something else.
    assert!(lo.put(b"five", &[5u8; 18000], Meta::default()));
    assert_eq!(lo.get(b"five", 0).unwrap().0, vec![5u8; 18000]);
    assert!(lo.get(b"e", 0).is_some());
    for key in ["a6", "a7", "a8", "a9", "three", "c", "d"] {
        assert!(lo.get(key.as_bytes(), 0).is_none(), "{key}");
    }
    assert_eq!(
        lo.counters.checksum_failures.load(Ordering::Relaxed),
        0,
        "no dangling extent"
    );
    assert_eq!(lo.len(), 2);
}

#[test]
fn many_keys_split_leaves_and_stay_findable() {
    let lo = region(4096);
    for i in 0..500u32 {
        assert!(lo.put(
            format!("{i:08}").as_bytes(),
            &vec![1u8; 3000],
            Meta::default()
        ));
    }
    assert!(lo.tree.leaf_count() > 10);
    for i in 0..500u32 {
        assert!(lo.get(format!("{i:08}").as_bytes(), 0).is_some(), "{i}");
    }
}

#[test]
fn the_index_file_round_trips_and_refuses_damage() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(42));
    let memory = Arc::new(Memory::default());
    let lo = LargeObjects::new(device.clone(), 10, 32, memory.clone());
    for i in 0..20u32 {
        let meta = Meta {
            expires_at_ms: (i % 2 == 0).then_some(1_000 + u64::from(i)),
            flags: i,
            cas: 77,
            clean: false,
            client_cas: i % 3 == 0,
            collection: i % 4 == 1,
        };
        assert!(lo.put(format!("key-{i:02}").as_bytes(), &vec![i as u8; 5000], meta));
    }
    lo.remove(b"key-19");
    let path = std::env::temp_dir().join(format!("zc-lo-index-{}", std::process::id()));
    std::fs::create_dir_all(&path).unwrap();
    let dir = crate::restart::dir::FsDir::new(&path);
    let at = |epoch| IndexFile {
        dir: &dir,
        name: "lo",
        epoch,
    };
    lo.save(at(7)).unwrap();
    let back = LargeObjects::load(at(7), device.clone(), 10, 32, memory.clone()).unwrap();
    assert_eq!(back.len(), lo.len());
    for i in 0..20u32 {
        let key = format!("key-{i:02}");
        assert_eq!(
            back.get(key.as_bytes(), 0),
            lo.get(key.as_bytes(), 0),
            "{key}"
        );
    }
    // The restored log goes on where it stopped: the next put drops the oldest.
    assert!(back.put(b"new", &[9u8; 5000], Meta::default()));
    assert_eq!(back.get(b"new", 0).unwrap().0, vec![9u8; 5000]);
    assert_eq!(back.log.lock().head, lo.log.lock().head + 2);
    // Another run epoch, another region, or one flipped byte: not loaded.
    assert!(LargeObjects::load(at(8), device.clone(), 10, 32, memory.clone()).is_none());
    assert!(LargeObjects::load(at(7), device.clone(), 10, 31, memory.clone()).is_none());
    // An index of version 2 names extents of version 1, which reads refuse: not
    // loaded, even sealed intact.
    let mut older = sealed_file::read(&dir, "lo").unwrap();
    older[4..8].copy_from_slice(&2u32.to_le_bytes());
    sealed_file::write(&dir, "lo", older).unwrap();
    assert!(LargeObjects::load(at(7), device.clone(), 10, 32, memory.clone()).is_none());
    lo.save(at(7)).unwrap();
    let mut bytes = std::fs::read(path.join("lo")).unwrap();
    bytes[30] ^= 1;
    std::fs::write(path.join("lo"), &bytes).unwrap();
    assert!(LargeObjects::load(at(7), device, 10, 32, memory).is_none());
    std::fs::remove_dir_all(&path).unwrap();
}

std::thread_local! {
    /// Whether this thread's trims of `TrimGate::held_lba` wait for the test.
    static HOLDS_TRIMS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A memory device whose trim of one chosen block, on a thread that `HOLDS_TRIMS`,
/// waits until the test lets it go: the trim of a dead extent held between leaving
/// BT_LO and reaching the device.
struct TrimGate {
    inner: MemDevice,
    held_lba: u64,
    entered: std::sync::mpsc::SyncSender<()>,
    release: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl BlockDevice for TrimGate {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write(lba, buf)
    }
    fn trim(&self, lba: u64, count: u64) -> std::io::Result<()> {
        if HOLDS_TRIMS.get() && (lba..lba + count).contains(&self.held_lba) {
            self.entered.send(()).unwrap();
            self.release.lock().recv().unwrap();
        }
        self.inner.trim(lba, count)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn stats(&self) -> zipcache_device::DeviceStats {
        self.inner.stats()
    }
}

/// The stress test's `checksum_failures` with an SSD tier: a small PUT or a DELETE
/// takes a large object out of BT_LO (`remove`), and a large PUT replaces one
/// (`insert`), and each trims the dead extent only after BT_LO's leaf lock is let go,
/// without the log's lock. The log no longer counts the extent as live (its FIFO
/// drop finds BT_LO pointing elsewhere), so a PUT of another key may wrap onto those
/// blocks first; the late trim then zeroes that live extent, and its GET misses with a
/// checksum failure. Not a wrong value (the extent header's unique sequence number
/// and CRC refuse the zeros), but a live object lost and a counted failure on a
/// healthy device.
#[test]
fn a_dead_extents_trim_never_erases_the_extent_that_reused_its_blocks() {
    type Kill = fn(&LargeObjects);
    let kills: [(&str, Kill); 2] = [
        ("remove", |lo| {
            lo.remove(b"dead");
        }),
        ("replace", |lo| {
            lo.put(b"dead", &[2u8; 1000], Meta::default());
        }),
    ];
    let (mut outcomes, mut expected) = (Vec::new(), Vec::new());
    for (how, kill) in kills {
        let (entered, on_enter) = std::sync::mpsc::sync_channel(1);
        let (let_go, release) = std::sync::mpsc::channel();
        let region_start = 10;
        let device = Arc::new(TrimGate {
            inner: MemDevice::new(region_start + 8),
            held_lba: region_start,
            entered,
            release: Mutex::new(release),
        });
        let lo = LargeObjects::new(device, region_start, 8, Arc::new(Memory::default()));
        // One block per object: "dead" takes the region's first block.
        assert!(lo.put(b"dead", &[1u8; 1000], Meta::default()));
        // PUTs that fill the region and wrap onto its first block (a replacing PUT
        // took one block more).
        let fill = if how == "replace" { 7 } else { 8 };
        std::thread::scope(|s| {
            let killer = s.spawn(|| {
                HOLDS_TRIMS.set(true);
                kill(&lo)
            });
            // A killer that does not trim the block itself leaves nothing to race.
            let _ = on_enter.recv_timeout(std::time::Duration::from_secs(5));
            // The trim of "dead"'s extent is on its way; meanwhile the log wraps —
            // unless the trim holds the log's lock, as it must: then the writer waits
            // for it, and the test lets the trim go after a while.
            let (wrapped, on_wrapped) = std::sync::mpsc::channel();
            let lo = &lo;
            let writer = s.spawn(move || {
                for i in 0..fill {
                    let key = format!("live-{i}");
                    assert!(lo.put(key.as_bytes(), &[i as u8 + 10; 1000], Meta::default()));
                }
                let _ = wrapped.send(());
            });
            let _ = on_wrapped.recv_timeout(std::time::Duration::from_secs(2));
            let_go.send(()).unwrap();
            killer.join().unwrap();
            writer.join().unwrap();
        });
        // The last PUT wrapped onto the dead extent's block; BT_LO still points at it.
        let reused = format!("live-{}", fill - 1);
        assert!(lo.lookup(reused.as_bytes()).is_some());
        let found = lo.get(reused.as_bytes(), 0).map(|(v, _)| v[0]);
        let failures = lo.counters.checksum_failures.load(Ordering::Relaxed);
        outcomes.push((how, found, failures));
        expected.push((how, Some(fill as u8 - 1 + 10), 0));
    }
    assert_eq!(
        outcomes, expected,
        "the extent that reused a dead one's block was erased by its trim"
    );
}

/// An engine over a 64 MiB SSD file in `dir`, with room in DRAM for all the test writes.
fn engine(dir: &std::path::Path) -> crate::ZipCache {
    let config = crate::Config {
        dram_capacity: 16 << 20,
        ssd: Some(crate::SsdConfig {
            path: dir.join("ssd.bin"),
            size: 64 << 20,
            direct_io: false,
            device_compression: DeviceCompression::Host,
            logical_to_physical: 4.0,
        }),
        ..crate::Config::default()
    };
    crate::ZipCache::open(config).unwrap()
}

/// A touch of a large object (`update_meta` with `Update::SetMeta`) changes its BT_LO
/// index entry alone: nothing is written to the device, no extent read; nor does a
/// length or existence check (`info`) read one. The new expiry and flags are served, the
/// value unchanged, and they survive a clean restart (the index file saves them).
#[test]
fn a_touch_of_a_large_object_writes_and_reads_nothing_and_survives_a_restart() {
    let dir = std::env::temp_dir().join(format!("zc-lo-touch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cache = engine(&dir);
    let big = noise(300 << 10);
    let options = crate::PutOptions {
        assign_cas: true,
        ..crate::PutOptions::default()
    };
    let cas = cache.put_with(b"big", &big, options).unwrap();
    cache.settle().unwrap();
    let before = cache.stats();
    let expires = cache.now_ms() + 3_600_000;
    let (seen, kept) = cache
        .update_meta(b"big", |info| {
            let info = *info.expect("the large object is there");
            let touched = crate::PutOptions {
                expires_at_ms: Some(expires),
                flags: 9,
                cas: Some(info.cas),
                ..crate::PutOptions::default()
            };
            (crate::Update::SetMeta(touched), info)
        })
        .unwrap();
    assert_eq!((seen.value_len, seen.cas, seen.flags), (big.len(), cas, 0));
    assert_eq!(kept, Some(cas), "a touch keeps the CAS");
    for _ in 0..100 {
        let info = cache.info(b"big").unwrap().expect("still there");
        assert_eq!(info.value_len, big.len());
        assert_eq!((info.flags, info.expires_at_ms), (9, Some(expires)));
    }
    assert_eq!(cache.info(b"nothing").unwrap(), None);
    cache.settle().unwrap();
    let after = cache.stats();
    assert_eq!(after.v_host, before.v_host, "device bytes written");
    assert_eq!(
        after.ssd_device_reads, before.ssd_device_reads,
        "device reads"
    );

    let served_touched = |cache: &crate::ZipCache| {
        let item = cache.get_item(b"big", crate::GetOptions::default());
        let item = item.unwrap().expect("served");
        assert!(item.value == big);
        let meta = (item.flags, item.cas, item.expires_at_ms);
        assert_eq!(meta, (9, cas, Some(expires)));
    };
    served_touched(&cache);
    cache.close().unwrap();

    let cache = engine(&dir);
    assert!(cache.warm_started());
    served_touched(&cache);
    drop(cache);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `update_read_before` with the value read before: the current version is not read
/// again; a version written since (even of the same length, flags and expiry) is read
/// afresh, so an append never builds on an overwritten value — nor on one whose version
/// no CAS names (written without one).
#[test]
fn an_append_uses_the_value_read_before_only_while_it_is_current() {
    let dir = std::env::temp_dir().join(format!("zc-lo-read-before-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cache = engine(&dir);
    let versioned = crate::PutOptions {
        assign_cas: true,
        ..crate::PutOptions::default()
    };
    let append = |cache: &crate::ZipCache, before: Option<crate::Item>| {
        cache
            .update_read_before(b"big", before, |current| {
                let value = [&current.expect("there").value[..], b"!"].concat();
                (
                    crate::Update::Put {
                        value,
                        options: versioned,
                    },
                    (),
                )
            })
            .unwrap();
    };
    let read = |cache: &crate::ZipCache| {
        let item = cache.get_item(b"big", crate::GetOptions { peek: true });
        item.unwrap().expect("stored")
    };
    let first = noise(300 << 10);
    cache.put_with(b"big", &first, versioned).unwrap();
    let before = read(&cache);
    cache.settle().unwrap();
    let reads_before = cache.stats().ssd_device_reads;
    append(&cache, Some(before));
    cache.settle().unwrap();
    assert_eq!(cache.stats().ssd_device_reads, reads_before, "read again");
    let appended = [&first[..], b"!"].concat();
    assert!(cache.get(b"big").unwrap().expect("appended") == appended);

    // Overwritten after the read, by a value of the same length, flags and expiry: the
    // stale copy is not used, whether the new version has a CAS or none.
    for options in [versioned, crate::PutOptions::default()] {
        let stale = read(&cache);
        let mut overwritten = stale.value.clone();
        overwritten[0] ^= 1;
        cache.put_with(b"big", &overwritten, options).unwrap();
        append(&cache, Some(stale));
        let want = [&overwritten[..], b"!"].concat();
        assert!(
            cache.get(b"big").unwrap().expect("appended") == want,
            "stale base"
        );
    }
    drop(cache);
    let _ = std::fs::remove_dir_all(&dir);
}

/// BT_LO's crash journal: after random puts (the log wrapping and dropping the oldest),
/// removals, touches, FIFO drops and a clear, the log's replay rebuilds BT_LO exactly as
/// it stands — every key's extent, metadata and value — across checkpoints too; a log
/// of another run is refused.
#[test]
fn the_crash_journal_rebuilds_bt_lo_as_it_stands() {
    use rand::{Rng, SeedableRng, rngs::StdRng};

    use crate::restart::journal::DescriptorLog;
    use crate::restart::shadow::{Shadow, UNLOGGED};

    let dir = std::env::temp_dir().join(format!("zipcache-lo-journal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lo-log");
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(256 + 10));
    let mut lo = LargeObjects::new(device.clone(), 10, 256, Arc::new(Memory::default()));
    let shadow = Arc::new(Shadow::in_memory(16, &[]));
    lo.start_journal(&path, 7, shadow.clone()).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let value = |k: u32, v: u32| vec![(k * 31 + v) as u8; 5_000 + (v as usize % 5) * 3_000];
    for round in 0..40_000u32 {
        let k = rng.random_range(0..60u32);
        let key = format!("large-{k}");
        match rng.random_range(0..10) {
            0..6 => {
                let meta = Meta {
                    flags: round,
                    ..Meta::default()
                };
                lo.put(key.as_bytes(), &value(k, round), meta);
            }
            6 => {
                lo.remove(key.as_bytes());
            }
            7 | 8 => {
                let meta = Meta {
                    flags: round,
                    expires_at_ms: Some(u64::from(round) * 1_000),
                    ..Meta::default()
                };
                lo.set_meta(key.as_bytes(), meta);
            }
            _ => {
                lo.drop_oldest_one();
            }
        }
        if round == 20_000 {
            lo.clear();
        }
    }
    assert_eq!(shadow.flags() & UNLOGGED, 0);
    let replay = DescriptorLog::replay(&path, 7).unwrap();
    let recovered = LargeObjects::recover(
        &replay,
        7,
        device.clone(),
        10,
        256,
        Arc::new(Memory::default()),
    )
    .expect("the log replays");
    assert!(lo.len() > 5, "{} objects", lo.len());
    assert_eq!(recovered.len(), lo.len());
    for k in 0..60u32 {
        let key = format!("large-{k}");
        assert_eq!(
            recovered.lookup(key.as_bytes()),
            lo.lookup(key.as_bytes()),
            "{key}"
        );
        assert_eq!(
            recovered.get(key.as_bytes(), 0),
            lo.get(key.as_bytes(), 0),
            "{key}"
        );
    }
    {
        let (mine, theirs) = (lo.log.lock(), recovered.log.lock());
        assert_eq!(theirs.head, mine.head);
        assert_eq!(theirs.next_seq, mine.next_seq);
    }
    // Writes go on where the crashed run left off.
    assert!(recovered.put(b"after", &value(1, 1), Meta::default()));
    assert!(
        LargeObjects::recover(&replay, 8, device, 10, 256, Arc::new(Memory::default())).is_none()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
