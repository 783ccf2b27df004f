//! Power loss at any point: a device and a directory that keep only what was made
//! durable (a device write survives only after a flush, a file's bytes only after an
//! fsync, a name only after the directory's fsync; of what was not, a random part), a
//! random workload of lives (open, puts, overwrites, deletes, large objects, flush_all,
//! a clean close or not), and the power cut after a random number of device and file
//! operations — in the middle of a workload, of a close, or of an open. After every
//! restart each key must be a miss or its newest acknowledged value.
//!
//! `ZIPCACHE_POWER_LOSS_SECS=N` runs lives for N seconds instead of the CI-sized count;
//! `ZIPCACHE_POWER_LOSS_SEED=S` replays one seed.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zipcache_device::{BLOCK_SIZE, BlockDevice, DeviceCompression, DeviceStats};

use super::model::SMALL_DICTIONARIES;
use crate::dictionary::tests::documents;
use crate::restart::dir::IndexDir;
use crate::restart::files::{JournalFiles, Persist};
use crate::restart::open::RecoveryKind;
use crate::{Config, ZipCache};

/// Operations left before the power goes; at 0 every mutation fails. The moment it goes
/// is also where a process crash ends the life: the crash journal's files (tmpfs, not
/// behind the switch) are copied aside then (`journal_at_the_cut`), as a kill would
/// leave them, before the engine goes on to react to the failures.
#[derive(Clone)]
struct PowerSwitch(Arc<AtomicI64>, Arc<PathBuf>);

impl PowerSwitch {
    fn new(ops: i64, journal: &Path) -> PowerSwitch {
        PowerSwitch(
            Arc::new(AtomicI64::new(ops)),
            Arc::new(journal.to_path_buf()),
        )
    }

    fn spend(&self) -> io::Result<()> {
        match self.0.fetch_sub(1, Ordering::SeqCst) {
            1.. => Ok(()),
            0 => {
                copy_journal(&self.1, &journal_at_the_cut(&self.1));
                Err(io::Error::other("power lost"))
            }
            _ => Err(io::Error::other("power lost")),
        }
    }

    fn is_off(&self) -> bool {
        self.0.load(Ordering::SeqCst) <= 0
    }
}

/// Where the journal's files are copied when the switch goes.
fn journal_at_the_cut(journal: &Path) -> PathBuf {
    journal.with_extension("at-the-cut")
}

/// Copies the journal's files from `from` into a fresh `to`: the shadow table first, so
/// that a log append and the clears after it, racing the copy, are never seen as the
/// clears without the append.
fn copy_journal(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(from)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort_by_key(|f| f.extension().is_none_or(|e| e != "shadow"));
    for file in files {
        // A file renamed away meanwhile (a checkpoint replacing a log) is gone.
        let _ = std::fs::copy(&file, to.join(file.file_name().unwrap()));
    }
}

type Block = Option<Box<[u8]>>;

#[derive(Default)]
struct DeviceState {
    durable: HashMap<u64, Box<[u8]>>,
    /// Writes (`Some`) and trims (`None`) since the last flush, in order.
    pending: Vec<(u64, Block)>,
}

struct CrashDevice {
    blocks: u64,
    /// Whether the engine packs blocks (`Host`) or writes them raw (`None`).
    compression: DeviceCompression,
    state: Mutex<DeviceState>,
    power: PowerSwitch,
}

impl CrashDevice {
    /// The device as it comes back after the power went: durable blocks, and a random
    /// part of what was written since the last flush, in order. After a process crash
    /// (`keep_all`) the kernel and the drive still hold every write that completed.
    fn after_crash(&self, rng: &mut StdRng, power: PowerSwitch, keep_all: bool) -> CrashDevice {
        let st = self.state.lock();
        let mut durable = st.durable.clone();
        for (lba, block) in &st.pending {
            if keep_all || rng.random_bool(0.5) {
                match block {
                    Some(b) => durable.insert(*lba, b.clone()),
                    None => durable.remove(lba),
                };
            }
        }
        CrashDevice {
            blocks: self.blocks,
            compression: self.compression,
            state: Mutex::new(DeviceState {
                durable,
                pending: Vec::new(),
            }),
            power,
        }
    }

    fn check(&self, lba: u64, len: usize) -> io::Result<u64> {
        let n = (len / BLOCK_SIZE) as u64;
        if !len.is_multiple_of(BLOCK_SIZE) || lba.checked_add(n).is_none_or(|e| e > self.blocks) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        Ok(n)
    }
}

impl BlockDevice for CrashDevice {
    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn compression(&self) -> DeviceCompression {
        self.compression
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(lba, buf.len())?;
        let st = self.state.lock();
        for (i, out) in buf.chunks_mut(BLOCK_SIZE).enumerate() {
            let at = lba + i as u64;
            let newest = st.pending.iter().rev().find(|(l, _)| *l == at);
            match newest.map_or(st.durable.get(&at), |(_, b)| b.as_ref()) {
                Some(b) => out.copy_from_slice(b),
                None => out.fill(0),
            }
        }
        Ok(())
    }

    fn write(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.check(lba, buf.len())?;
        self.power.spend()?;
        let mut st = self.state.lock();
        for (i, b) in buf.chunks(BLOCK_SIZE).enumerate() {
            st.pending.push((lba + i as u64, Some(b.into())));
        }
        Ok(())
    }

    fn trim(&self, lba: u64, count: u64) -> io::Result<()> {
        self.check(lba, (count as usize) * BLOCK_SIZE)?;
        self.power.spend()?;
        let mut st = self.state.lock();
        for at in lba..lba + count {
            st.pending.push((at, None));
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.power.spend()?;
        let mut st = self.state.lock();
        for (lba, block) in std::mem::take(&mut st.pending) {
            match block {
                Some(b) => st.durable.insert(lba, b),
                None => st.durable.remove(&lba),
            };
        }
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats::default()
    }
}

struct Inode {
    bytes: Vec<u8>,
    synced: Option<Vec<u8>>,
}

#[derive(Default)]
struct DirState {
    names: HashMap<String, u64>,
    synced_names: HashMap<String, u64>,
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
}

struct CrashDir {
    state: Mutex<DirState>,
    power: PowerSwitch,
}

impl CrashDir {
    /// The directory after a power cut: synced names (or, as a file system may also
    /// leave them, the unsynced ones), each file with its synced bytes or, at random,
    /// what was written since. After a process crash (`keep_all`): every name and byte.
    fn after_crash(&self, rng: &mut StdRng, power: PowerSwitch, keep_all: bool) -> CrashDir {
        let st = self.state.lock();
        let names = match keep_all || rng.random_bool(0.5) {
            false => st.synced_names.clone(),
            true => st.names.clone(),
        };
        let inodes = st
            .inodes
            .iter()
            .map(|(&n, inode)| {
                let survives = match (&inode.synced, !keep_all && rng.random_bool(0.5)) {
                    (Some(synced), true) => synced.clone(),
                    (None, true) => Vec::new(),
                    (_, false) => inode.bytes.clone(),
                };
                let synced = Some(survives.clone());
                (
                    n,
                    Inode {
                        bytes: survives,
                        synced,
                    },
                )
            })
            .collect();
        CrashDir {
            state: Mutex::new(DirState {
                synced_names: names.clone(),
                names,
                inodes,
                next_inode: st.next_inode,
            }),
            power,
        }
    }
}

impl IndexDir for CrashDir {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let st = self.state.lock();
        Ok(st.names.get(name).map(|n| st.inodes[n].bytes.clone()))
    }

    fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.power.spend()?;
        let mut st = self.state.lock();
        match st.names.get(name).copied() {
            Some(n) => st.inodes.get_mut(&n).expect("named").bytes = bytes.to_vec(),
            None => {
                let n = st.next_inode;
                st.next_inode += 1;
                st.inodes.insert(
                    n,
                    Inode {
                        bytes: bytes.to_vec(),
                        synced: None,
                    },
                );
                st.names.insert(name.to_string(), n);
            }
        }
        Ok(())
    }

    fn sync_file(&self, name: &str) -> io::Result<()> {
        self.power.spend()?;
        let mut st = self.state.lock();
        let n = *st.names.get(name).ok_or(io::ErrorKind::NotFound)?;
        let inode = st.inodes.get_mut(&n).expect("named");
        inode.synced = Some(inode.bytes.clone());
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.power.spend()?;
        let mut st = self.state.lock();
        let n = st.names.remove(from).ok_or(io::ErrorKind::NotFound)?;
        st.names.insert(to.to_string(), n);
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.power.spend()?;
        self.state.lock().names.remove(name);
        Ok(())
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.power.spend()?;
        let mut st = self.state.lock();
        st.synced_names = st.names.clone();
        Ok(())
    }
}

fn key(k: u16) -> Vec<u8> {
    format!("key-{k:05}").into_bytes()
}

/// A value that names its key and version, of one of three classes: tiny, medium
/// (a blob of its own in DRAM; documents of a schema that changes every 500 versions,
/// which trained dictionaries compress) or large (BT_LO).
fn value(k: u16, version: u64, rng: &mut StdRng) -> Vec<u8> {
    let class = rng.random_range(0..10);
    let len = match class {
        0..6 => rng.random_range(8..100usize),
        6..9 => rng.random_range(150..1_500),
        _ => rng.random_range(3_000..9_000),
    };
    let mut v = format!("{k}:{version}:").into_bytes();
    if (6..9).contains(&class) {
        let schema = (version / 500 % 2) as u8;
        v.extend(documents(schema, version, len.saturating_sub(v.len())));
    }
    v.resize(len, (version % 251) as u8);
    v
}

const KEYS: u16 = 400;

/// Lives of one engine on one device and directory, each ended by a power cut (after a
/// clean close, or in the middle of anything) or by a process crash (the crash journal
/// and every completed write kept). Returns the restarts checked, how many of them were
/// warm, how many warm from the crash journal, and how many lives compressed with a
/// dictionary they trained.
fn lives(seed: u64, count: usize) -> (usize, usize, usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    // The crash journal's directory: tmpfs, which a process crash keeps and a power cut
    // empties.
    let journal_dir =
        std::env::temp_dir().join(format!("zipcache-power-loss-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&journal_dir);
    std::fs::create_dir_all(&journal_dir).unwrap();
    let mut power = PowerSwitch::new(i64::MAX, &journal_dir);
    let mut device = Arc::new(CrashDevice {
        blocks: 1_024,
        // Packed and raw blocks each with and without trained dictionaries (below).
        compression: [DeviceCompression::Host, DeviceCompression::None][seed as usize / 4 % 2],
        state: Mutex::new(DeviceState::default()),
        power: power.clone(),
    });
    let mut dir = Arc::new(CrashDir {
        state: Mutex::new(DirState::default()),
        power: power.clone(),
    });
    // The newest acknowledged version of each key (`None`: deleted or flushed).
    let mut model: BTreeMap<u16, Option<Vec<u8>>> = BTreeMap::new();
    let mut version = 0;
    let (mut checked, mut warm, mut crash_warm, mut with_dictionaries) = (0, 0, 0, 0);
    let mut last_life = String::from("none");
    let mut process_crash = false;
    // A put under way when a process crash cut the last life: its key, and the value it
    // may hold after all.
    let mut in_flight: Option<(u16, Option<Vec<u8>>)> = None;
    for life in 0..count {
        // Where the power goes: during the workload, the close or the next open.
        power.0.store(
            match rng.random_range(0..4) {
                0 => rng.random_range(0..40),
                1 => rng.random_range(0..400),
                2 => rng.random_range(0..4_000),
                _ => i64::MAX,
            },
            Ordering::SeqCst,
        );
        let mut config = Config {
            dram_capacity: 96 << 10,
            superleaf_size: [4 << 10, 16 << 10][seed as usize % 2],
            write_buffer: [0, 256][rng.random_range(0..2)],
            // With filters, writes of keys flash certainly lacks are not marked.
            ssd_presence_filters: seed / 8 % 2 == 1,
            ..Config::default()
        };
        // Every other seed with trained dictionaries, each life training its own again.
        if seed % 4 >= 2 {
            config.dram_capacity = 512 << 10;
            for (name, value) in SMALL_DICTIONARIES {
                config.set(name, value).unwrap();
            }
        }
        let persist = Persist {
            dir: dir.clone(),
            ssd_index: "ssd.index".into(),
            lo_index: "ssd.lo-index".into(),
            dictionaries: "ssd.dict-".into(),
            journal: Some(JournalFiles::for_ssd(&journal_dir, Path::new("ssd"))),
        };
        let device_dyn: Arc<dyn BlockDevice> = device.clone();
        if let Ok(cache) = ZipCache::start(config, Some(device_dyn), Some(persist), None) {
            for (&k, want) in &model {
                let before = cache.stats();
                let got = cache.get(&key(k)).unwrap();
                let tag = |v: &Option<Vec<u8>>| {
                    v.as_ref().map(|v| {
                        let end = v.iter().take(24).position(|&b| b == b':').unwrap_or(0);
                        let end = end
                            + 1
                            + v[end + 1..]
                                .iter()
                                .take(24)
                                .position(|&b| b == b':')
                                .unwrap_or(0);
                        (String::from_utf8_lossy(&v[..end]).into_owned(), v.len())
                    })
                };
                // The write in flight when a process crash cut the life may have landed.
                let landed = got.is_some() && in_flight.as_ref() == Some(&(k, got.clone()));
                if got.is_some() && got != *want && !landed {
                    let after = cache.stats();
                    panic!(
                        "seed {seed} life {life}: key {k} served {:?}, newest is {:?} (warm start: \
                         {}, from BT_LO: {}, from the SSD: {}, last life: {last_life})",
                        tag(&got),
                        tag(want),
                        cache.warm_started(),
                        after.large_hits > before.large_hits,
                        after.ssd_hits > before.ssd_hits,
                    );
                }
            }
            if let Some((k, value)) = in_flight.take() {
                let read = cache.get(&key(k)).unwrap();
                if read.is_some() && read == value {
                    model.insert(k, value);
                }
            }
            checked += 1;
            warm += usize::from(cache.warm_started());
            crash_warm += usize::from(cache.recovery().kind == RecoveryKind::Crash);
            // What the clients were told when the switch went, and the write then in
            // flight: a process crash ends the life there (`PowerSwitch`).
            let mut at_the_cut = power.is_off().then(|| (model.clone(), None));
            for _ in 0..rng.random_range(20..600) {
                let k = rng.random_range(0..KEYS);
                let op = rng.random_range(0..100);
                // What the model said before this operation, should the switch go during
                // it: the key's entry, or the whole model before a flush.
                let before = (at_the_cut.is_none() && op >= 99).then(|| model.clone());
                let before_key = model.get(&k).cloned();
                let written = match op {
                    0..70 => {
                        version += 1;
                        let v = value(k, version, &mut rng);
                        cache.put(&key(k), &v, None).unwrap();
                        model.insert(k, Some(v.clone()));
                        Some((k, Some(v)))
                    }
                    70..95 => {
                        cache.delete(&key(k)).unwrap();
                        model.insert(k, None);
                        None
                    }
                    95..99 => {
                        let _ = cache.get(&key(k)).unwrap();
                        None
                    }
                    _ => {
                        cache.flush_all().unwrap();
                        model.values_mut().for_each(|v| *v = None);
                        None
                    }
                };
                if at_the_cut.is_none() && power.is_off() {
                    let told = before.unwrap_or_else(|| {
                        let mut told = model.clone();
                        match before_key {
                            Some(entry) => told.insert(k, entry),
                            None => told.remove(&k),
                        };
                        told
                    });
                    at_the_cut = Some((told, written));
                }
            }
            with_dictionaries += usize::from(cache.stats().dictionaries_swapped > 0);
            // How the life ends: a clean close, or the process crashes (the switch, if it
            // went off, marks the moment: nothing after it reached the device or the
            // directory), or it is dropped; and then the power goes, or not.
            process_crash = false;
            last_life = match rng.random_range(0..10) {
                0..6 => format!(
                    "close {:?}, power cut: {}",
                    cache.close().err(),
                    power.is_off()
                ),
                6..9 => {
                    process_crash = rng.random_bool(0.7);
                    if let Some((told, written)) = at_the_cut.filter(|_| process_crash) {
                        // Killed when the switch went: nothing after was acknowledged.
                        model = told;
                        in_flight = written;
                    }
                    cache.crash();
                    format!("process crash, power cut after: {}", !process_crash)
                }
                _ => format!("dropped, power cut: {}", power.is_off()),
            };
        } else {
            last_life = "open failed".into();
        }
        let cut = journal_at_the_cut(&journal_dir);
        if process_crash && cut.exists() {
            // The process died when the switch went: its journal as it was then.
            copy_journal(&cut, &journal_dir);
        }
        let _ = std::fs::remove_dir_all(&cut);
        power = PowerSwitch::new(i64::MAX, &journal_dir);
        device = Arc::new(device.after_crash(&mut rng, power.clone(), process_crash));
        dir = Arc::new(dir.after_crash(&mut rng, power.clone(), process_crash));
        if !process_crash {
            // The power went: tmpfs with it.
            let _ = std::fs::remove_dir_all(&journal_dir);
            std::fs::create_dir_all(&journal_dir).unwrap();
        }
    }
    let _ = std::fs::remove_dir_all(&journal_dir);
    (checked, warm, crash_warm, with_dictionaries)
}

#[test]
fn no_power_cut_ever_brings_back_a_stale_or_deleted_value() {
    let budget = std::env::var("ZIPCACHE_POWER_LOSS_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    // `ZIPCACHE_POWER_LOSS_SEED=S` replays one seed over and over (background threads
    // make a run vary).
    let only = std::env::var("ZIPCACHE_POWER_LOSS_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let start = std::time::Instant::now();
    let (mut seeds, mut restarts, mut warm, mut crash_warm, mut with_dictionaries) =
        (0u64, 0, 0, 0, 0);
    loop {
        let seed = only.unwrap_or(0x5eed_0000 + seeds);
        let (checked, warm_ones, crash_warm_ones, dictionary_lives) = lives(seed, 8);
        restarts += checked;
        warm += warm_ones;
        crash_warm += crash_warm_ones;
        with_dictionaries += dictionary_lives;
        seeds += 1;
        let done = match budget {
            Some(secs) => start.elapsed().as_secs() >= secs,
            None => seeds >= 24,
        };
        if done {
            break;
        }
    }
    eprintln!(
        "power loss: {seeds} seeds, {restarts} restarts checked ({warm} warm, \
         {crash_warm} of them from the crash journal), {with_dictionaries} lives with a \
         trained dictionary, in {:?}",
        start.elapsed()
    );
    assert!(
        warm > crash_warm && (crash_warm > 0 || only.is_some()),
        "no restart was warm after a clean close, or none after a crash: the test would \
         prove nothing"
    );
    assert!(
        with_dictionaries > 0 || only.is_some(),
        "no life trained a dictionary: they went untested"
    );
}
