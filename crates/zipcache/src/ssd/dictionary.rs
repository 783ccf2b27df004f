//! Block dictionaries (`device_compression=host`; issue 22, issue 21 item 5): zstd
//! dictionaries trained on the records the flusher writes, that SSD blocks are packed
//! with, persisted beside the SSD file before the first block that names one is written.
//!
//! A 4 KiB block packed alone starts from an empty window: LZ4 shrinks 64-byte rows of
//! real text by a third. zstd at level [`LEVEL`] with a dictionary trained on recent
//! records puts 1.7–1.95× as many of them in a block, JSON documents 3.2×
//! (`crates/bench/examples/ssd_block_codecs.rs`, docs/RESULTS.md "Fourth part"); on
//! random or half-random values it gains a few percent, and none is adopted (a first
//! candidate must pack held-out records ≥ 20 % smaller than LZ4: `FIRST_BELOW`).
//!
//! * Training: [`Trainer`] (`dictionary/training.rs`) over a reservoir of the evicted
//!   records as blocks encode them, charged to the DRAM budget, as the DRAM
//!   dictionaries are.
//! * Adoption ([`BlockDictionaries::adopt`], by the flusher under the tier's writer lock):
//!   a new current dictionary takes one of [`LIVE`] slots, is named by a hash of its
//!   bytes (so that no file, damaged or lost, can leave an id to be reused for other
//!   bytes), and is written to its slot's file (`<ssd file>.dict-<slot>`, sealed,
//!   fsynced, renamed, directory fsynced) before any block is packed with it.
//! * Lifetime: each super-leaf descriptor remembers which slot each of its blocks was
//!   packed with; the table counts blocks per slot. A dictionary that is not current and
//!   that no block names any more leaves the table and its file is removed. With all
//!   slots still named by blocks, a new candidate waits (blocks keep their dictionary
//!   until rewritten, trimmed or evicted).
//! * Restart: `open` loads every slot file that is intact; a warm start counts the blocks
//!   the index names per dictionary, a cold one none; unnamed dictionaries go, except the
//!   one most blocks name (the largest id among equals: ids are hashes, so a cold start
//!   keeps an arbitrary one), which stays current so that packing goes on without retraining. A block
//!   naming a dictionary that is missing or was damaged is a miss (no dictionary by that
//!   id, or the zstd frame's checksum fails), never wrong bytes.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::RwLock;

use super::host_compression;
use crate::dictionary::Dictionary;
use crate::dictionary::training::{Kind, Trainer, TrainingSettings, train_from_samples};
use crate::eviction::EvictedObject;
use crate::format::dictionary_file::{
    FORMAT_VERSION, HEADER, ID, LENGTH, MAGIC, MAX_LENGTH, VERSION,
};
use crate::memory::{Memory, alloc_size};
use crate::record::{Payload, Record};
use crate::restart::dir::IndexDir;
use crate::restart::sealed_file;

/// The zstd level blocks are packed at with a dictionary: level 3 puts 8 % more
/// `airports` rows in a block than level 1 with a 64 KiB dictionary, 25 % more with
/// 112 KiB (level 1's single hash table reaches little of a large dictionary).
const LEVEL: i32 = 3;
/// Dictionaries alive at once, each in a slot of the table and a file of its own.
pub const LIVE: usize = 4;
/// Raw record bytes of the blocks held-out records are judged in: about what a block
/// packed within `T` holds.
const JUDGED_BLOCK: usize = 6 << 10;

/// The reservoir and dictionary sizes for blocks, from the DRAM dictionaries' ones: eight
/// times the samples (records are small: 4,096 at a 16 MiB budget), and twice the
/// dictionary, up to 112 KiB.
pub fn block_training(dram: TrainingSettings) -> TrainingSettings {
    TrainingSettings {
        samples: (dram.samples * 8).min(4096),
        dictionary_size: (dram.dictionary_size * 2).min(112 << 10),
    }
}

/// A trained block dictionary: its raw bytes (written to its file when adopted) and its
/// prepared zstd forms, charged to the DRAM budget while it lives.
pub struct BlockDictionary {
    raw: Box<[u8]>,
    zstd: Arc<Dictionary>,
    charge: i64,
    memory: Arc<Memory>,
}

impl BlockDictionary {
    /// `raw` prepared for packing, charged to `memory`; `None` if zstd cannot take it.
    pub fn prepare(raw: &[u8], memory: Arc<Memory>) -> Option<Arc<BlockDictionary>> {
        let zstd = Dictionary::prepare_at(0, raw, LEVEL, memory.clone())?;
        let charge = (alloc_size(raw.len()) + alloc_size(size_of::<BlockDictionary>())) as i64;
        memory.change_dictionaries(charge);
        Some(Arc::new(BlockDictionary {
            raw: raw.into(),
            zstd,
            charge,
            memory,
        }))
    }

    /// Its prepared zstd form, which blocks are packed with (`host_compression::pack`).
    pub fn zstd(&self) -> &Dictionary {
        &self.zstd
    }
}

impl Drop for BlockDictionary {
    fn drop(&mut self) {
        self.memory.change_dictionaries(-self.charge);
    }
}

/// Samples are records as a block encodes them, judged by the blocks held-out records
/// pack into: with the dictionary (zstd) or without (LZ4), as the flusher packs them.
impl Kind for BlockDictionary {
    const SAMPLE_PREFIX: usize = 512;
    /// Packing with zstd and a dictionary costs the flusher 4–5× LZ4's time: on η = 0.5
    /// values, where it gains 6–8 %, a fill kept 13–18 % fewer objects (the flusher fell
    /// behind and dropped them, docs/RESULTS.md "Fourth part"). It is taken where it pays
    /// for that: real text packs about half as large.
    const FIRST_BELOW: f64 = 0.8;

    fn train(
        _generation: u64,
        samples: &[&[u8]],
        size: usize,
        memory: Arc<Memory>,
    ) -> Option<Arc<Self>> {
        BlockDictionary::prepare(&train_from_samples(samples, size)?, memory)
    }

    fn cost(held_out: &[&[u8]], dictionary: Option<&Self>) -> usize {
        let spent = AtomicU64::new(0);
        let mut cost = 0;
        let mut block = Vec::with_capacity(JUDGED_BLOCK + 512);
        for (i, record) in held_out.iter().enumerate() {
            block.extend_from_slice(record);
            if block.len() >= JUDGED_BLOCK || i + 1 == held_out.len() {
                let packed =
                    host_compression::pack(&block, dictionary.map(|d| (1, d.zstd())), &spent);
                cost += packed.map_or(block.len(), |(bytes, _)| bytes.len());
                block.clear();
            }
        }
        cost
    }
}

/// The id blocks packed with `raw` name: 32 bits of its hash, never 0. Two
/// dictionaries share one only by a collision, and then the zstd frame's checksum
/// refuses a block read with the other.
fn id_of(raw: &[u8]) -> u32 {
    (xxhash_rust::xxh3::xxh3_64_with_seed(raw, 0x0b10_cd1c) as u32).max(1)
}

/// Where the dictionary files live: `<prefix><slot>` in `dir`.
pub struct DictionaryFiles {
    pub dir: Arc<dyn IndexDir>,
    pub prefix: String,
}

impl DictionaryFiles {
    fn name(&self, slot: u8) -> String {
        format!("{}{slot}", self.prefix)
    }

    /// The dictionary in `slot`'s file, with its id; `None` if there is none or it is
    /// damaged.
    fn read(&self, slot: u8) -> Option<(u32, Vec<u8>)> {
        let body = sealed_file::read(self.dir.as_ref(), &self.name(slot))?;
        if body.len() < HEADER || !MAGIC.is_in(&body) || VERSION.get(&body) != FORMAT_VERSION {
            return None;
        }
        let (id, len) = (ID.get(&body), LENGTH.get(&body) as usize);
        (id != 0 && len <= MAX_LENGTH && body.len() == HEADER + len)
            .then(|| (id, body[HEADER..].to_vec()))
    }

    /// Writes `raw` as dictionary `id` to `slot`'s file, durably (may do I/O).
    fn write(&self, slot: u8, id: u32, raw: &[u8]) -> std::io::Result<()> {
        let mut body = vec![0; HEADER];
        MAGIC.put(&mut body);
        VERSION.set(&mut body, FORMAT_VERSION);
        ID.set(&mut body, id);
        LENGTH.set(&mut body, raw.len() as u32);
        body.extend_from_slice(raw);
        sealed_file::write(self.dir.as_ref(), &self.name(slot), body)
    }

    /// Removes `slot`'s file (may do I/O). Not made durable: a file that comes back after
    /// a power cut names an id no block of a later run uses, and the next open drops it.
    fn remove(&self, slot: u8) {
        let _ = self.dir.remove(&self.name(slot));
    }
}

/// The dictionary new blocks are packed with: its slot, id and prepared forms.
#[derive(Clone)]
pub struct Current {
    pub slot: u8,
    pub id: u32,
    pub dictionary: Arc<BlockDictionary>,
}

struct Live {
    id: u32,
    dictionary: Arc<BlockDictionary>,
    /// Blocks packed with it that the tier still holds.
    blocks: u64,
}

struct Table {
    /// Slot `s` (1..=LIVE) is `live[s - 1]`.
    live: [Option<Live>; LIVE],
    /// The slot new blocks are packed with; 0 for none (LZ4).
    current: u8,
}

impl Table {
    fn slot(&self, slot: u8) -> Option<&Live> {
        self.live.get(usize::from(slot).checked_sub(1)?)?.as_ref()
    }

    fn slot_mut(&mut self, slot: u8) -> Option<&mut Live> {
        self.live
            .get_mut(usize::from(slot).checked_sub(1)?)?
            .as_mut()
    }
}

/// The SSD tier's block dictionaries: the trainer, the table of live ones, their files.
pub struct BlockDictionaries {
    trainer: Option<Arc<Trainer<BlockDictionary>>>,
    table: RwLock<Table>,
    files: Option<DictionaryFiles>,
}

impl BlockDictionaries {
    /// Block dictionaries trained with `training` (`None`: never, new blocks are packed
    /// with LZ4 alone), persisted in `files` if given, which are loaded now whatever
    /// `training` says, since blocks a previous run wrote may name them: every intact one
    /// goes into the table, named by no block yet (may do I/O).
    pub fn open(
        training: Option<TrainingSettings>,
        files: Option<DictionaryFiles>,
        memory: Arc<Memory>,
    ) -> BlockDictionaries {
        let mut table = Table {
            live: Default::default(),
            current: 0,
        };
        if let Some(files) = &files {
            for slot in 1..=LIVE as u8 {
                let Some((id, raw)) = files.read(slot) else {
                    continue;
                };
                if let Some(dictionary) = BlockDictionary::prepare(&raw, memory.clone()) {
                    table.live[usize::from(slot) - 1] = Some(Live {
                        id,
                        dictionary,
                        blocks: 0,
                    });
                }
            }
        }
        BlockDictionaries {
            trainer: training.map(|t| Arc::new(Trainer::new(t, memory))),
            table: RwLock::new(table),
            files,
        }
    }

    /// After the tier counted the blocks it holds (`count`): dictionaries no block names
    /// leave, but for the one most blocks name, which stays current when dictionaries are
    /// trained (without training none is current: new blocks are packed with LZ4 alone,
    /// and the loaded ones stay only while blocks name them) (may do I/O).
    pub fn settle_after_open(&self) {
        let mut table = self.table.write();
        if let Some(trainer) = &self.trainer {
            let kept = (1..=LIVE as u8)
                .filter_map(|slot| table.slot(slot).map(|live| (live.blocks, live.id, slot)))
                .max()
                .map_or(0, |(_, _, slot)| slot);
            table.current = kept;
            if let Some(live) = table.slot(kept) {
                trainer.make_current(Some(live.dictionary.clone()));
            }
        }
        for slot in 1..=LIVE as u8 {
            self.drop_if_unused(&mut table, slot);
        }
    }

    /// Whether the table holds any dictionary (one loaded at open, or adopted since).
    pub fn any_live(&self) -> bool {
        self.table.read().live.iter().any(Option::is_some)
    }

    /// Objects the flusher is about to write: offered to the trainer's reservoir as
    /// records, then the trainer's newest dictionary adopted (may do I/O: `adopt`).
    pub fn take_in(&self, objects: &[&EvictedObject]) {
        let Some(trainer) = &self.trainer else { return };
        let records = objects.iter().filter_map(|o| {
            Some(Record {
                key: &o.key,
                payload: Payload::Inline(o.value.as_deref()?),
                meta: o.meta,
            })
        });
        trainer.offer_each(records, |record, sample| record.encode(sample));
        self.adopt();
    }

    /// Makes the trainer's newest dictionary the one blocks are packed with: it takes a
    /// slot no block names, a new id, and its file, written durably first (may do I/O).
    /// With every slot named by blocks, or the file not written, nothing changes.
    pub fn adopt(&self) {
        let Some(candidate) = self.trainer.as_ref().and_then(|t| t.current()) else {
            return;
        };
        let adopted = |table: &Table| {
            table
                .slot(table.current)
                .is_some_and(|live| Arc::ptr_eq(&live.dictionary, &candidate))
        };
        // Every flusher batch asks; SSD GETs read the table, so the write lock is taken
        // only for a new candidate.
        if adopted(&self.table.read()) {
            return;
        }
        let mut table = self.table.write();
        if adopted(&table) {
            return;
        }
        let free = (1..=LIVE as u8).find(|&slot| {
            table
                .slot(slot)
                .is_none_or(|live| live.blocks == 0 && slot != table.current)
        });
        let Some(slot) = free else { return };
        let id = id_of(&candidate.raw);
        if let Some(files) = &self.files
            && files.write(slot, id, &candidate.raw).is_err()
        {
            return;
        }
        table.live[usize::from(slot) - 1] = Some(Live {
            id,
            dictionary: candidate,
            blocks: 0,
        });
        let previous = std::mem::replace(&mut table.current, slot);
        self.drop_if_unused(&mut table, previous);
    }

    /// The dictionary new blocks are packed with, if any.
    pub fn current(&self) -> Option<Current> {
        let table = self.table.read();
        let live = table.slot(table.current)?;
        Some(Current {
            slot: table.current,
            id: live.id,
            dictionary: live.dictionary.clone(),
        })
    }

    /// The prepared zstd form of the live dictionary of id `id`, for a block that names
    /// it (`host_compression::unpack`).
    pub fn get(&self, id: u32) -> Option<Arc<Dictionary>> {
        let table = self.table.read();
        table
            .live
            .iter()
            .flatten()
            .find(|live| live.id == id)
            .map(|live| live.dictionary.zstd.clone())
    }

    /// The slot of the live dictionary of id `id` (a block of a loaded index), 0 if none.
    pub fn slot_of(&self, id: u32) -> u8 {
        let table = self.table.read();
        (1..=LIVE as u8)
            .find(|&slot| id != 0 && table.slot(slot).is_some_and(|live| live.id == id))
            .unwrap_or(0)
    }

    /// The id of the dictionary in `slot`, 0 for none (for the index file).
    pub fn id_of(&self, slot: u8) -> u32 {
        self.table.read().slot(slot).map_or(0, |live| live.id)
    }

    /// A block packed with the dictionary in slot `before` (0: none) now holds one
    /// packed with `after`: the counts move, and a dictionary left unnamed and not
    /// current goes, its file removed (may do I/O).
    pub fn count(&self, before: u8, after: u8) {
        if before == after {
            return;
        }
        let mut table = self.table.write();
        if let Some(live) = table.slot_mut(after) {
            live.blocks += 1;
        }
        if let Some(live) = table.slot_mut(before) {
            live.blocks = live.blocks.saturating_sub(1);
        }
        self.drop_if_unused(&mut table, before);
    }

    fn drop_if_unused(&self, table: &mut Table, slot: u8) {
        let unused = table
            .slot(slot)
            .is_some_and(|live| live.blocks == 0 && slot != table.current);
        if unused {
            table.live[usize::from(slot) - 1] = None;
            if let Some(files) = &self.files {
                files.remove(slot);
            }
        }
    }

    /// Waits for a training under way (tests, measurements).
    pub fn settle(&self) {
        if let Some(trainer) = &self.trainer {
            trainer.settle();
        }
    }

    /// Live dictionaries and the blocks that name each, by slot (tests).
    #[cfg(test)]
    pub fn live(&self) -> Vec<(u8, u32, u64)> {
        let table = self.table.read();
        (1..=LIVE as u8)
            .filter_map(|slot| table.slot(slot).map(|l| (slot, l.id, l.blocks)))
            .collect()
    }

    /// Makes `dictionary` the trainer's current one, as a swap would (tests).
    #[cfg(test)]
    pub fn make_candidate(&self, dictionary: Arc<BlockDictionary>) {
        if let Some(trainer) = &self.trainer {
            trainer.make_current(Some(dictionary));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use zipcache_device::{BlockDevice, MemDevice};

    use super::super::test_support::settings;
    use super::super::{SsdSettings, SsdTier};
    use super::*;
    use crate::config::SystemClock;
    use crate::dictionary::page::tests::text_records;
    use crate::dictionary::page::text_record;
    use crate::eviction::EvictionSink;
    use crate::format::block::PACKED_ZSTD;
    use crate::format::packing::{DICTIONARY, RAW_LEN, RAW_MAX, ZSTD_FRAME};
    use crate::restart::dir::FsDir;
    use host_compression::{pack, unpack};

    fn key(i: u32) -> Vec<u8> {
        format!("{i:016}").into_bytes()
    }

    /// Key `i`'s value in `round`: a text row.
    fn value(i: u32, round: u32) -> Vec<u8> {
        text_record(u64::from(i) << 8 | u64::from(round))
    }

    /// A dictionary trained on text rows of keys the tests do not write.
    fn trained(seed: u64) -> Arc<BlockDictionary> {
        let samples: Vec<Vec<u8>> = (0..3000u64).map(|i| text_record(seed << 40 | i)).collect();
        let samples: Vec<&[u8]> = samples.iter().map(|s| &s[..]).collect();
        let raw = train_from_samples(&samples, 16 << 10).expect("trains");
        BlockDictionary::prepare(&raw, Arc::new(Memory::default())).unwrap()
    }

    fn absorb(ssd: &SsdTier, keys: std::ops::Range<u32>, round: u32) {
        let batch = keys
            .map(|i| crate::eviction::EvictedObject {
                key: key(i),
                value: Some(value(i, round)),
                meta: crate::record::Meta::default(),
            })
            .collect();
        assert!(ssd.absorb(&[], None, batch));
    }

    /// A packing tier whose dictionaries never train on their own (the reservoir's
    /// window is never full): the tests hand them candidates.
    fn tier(files: Option<DictionaryFiles>) -> SsdTier {
        let training = TrainingSettings {
            samples: 1 << 30,
            dictionary_size: 16 << 10,
        };
        let settings = SsdSettings {
            host_compression: true,
            dictionaries: Some(training),
            ..settings(512)
        };
        let memory = Arc::new(Memory::default());
        let dictionaries = BlockDictionaries::open(settings.dictionaries, files, memory.clone());
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 512));
        let clock = Arc::new(SystemClock);
        SsdTier::with_dictionaries(device, settings, memory, clock, Arc::new(dictionaries))
    }

    fn all_read_back(ssd: &SsdTier, keys: std::ops::Range<u32>, round: impl Fn(u32) -> u32) {
        for i in keys {
            let hit = ssd.get(&key(i), 0).map(|hit| hit.value);
            assert_eq!(hit, Some(value(i, round(i))), "key {i}");
        }
        assert_eq!(ssd.counters.checksum_failures.load(Ordering::Relaxed), 0);
    }

    /// An empty directory of this test process's own, for dictionary files.
    fn scratch_dir(name: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    fn files_in(path: &std::path::Path) -> DictionaryFiles {
        DictionaryFiles {
            dir: Arc::new(FsDir::new(path)),
            prefix: "ssd.dict-".into(),
        }
    }

    /// Two dictionaries adopted one after the other while blocks are written: blocks of
    /// the first still read after the second is current, both live while blocks name
    /// them, both files on disk; when no block names the first any more, it and its file
    /// go, and a restart's open finds the second alone.
    #[test]
    fn a_dictionary_retrained_during_writes_leaves_older_blocks_readable() {
        let path = scratch_dir("zc-block-dict");
        let files = || files_in(&path);
        let ssd = tier(Some(files()));
        absorb(&ssd, 0..400, 0);
        assert!(ssd.dictionaries.live().is_empty(), "LZ4 until a dictionary");
        let (first, second) = (trained(1), trained(2));
        ssd.dictionaries.make_candidate(first.clone());
        absorb(&ssd, 400..1200, 0);
        let live = ssd.dictionaries.live();
        assert!(live.len() == 1 && live[0].2 > 0, "{live:?}");
        let first_id = live[0].1;
        assert_eq!(first_id, id_of(&first.raw));
        ssd.dictionaries.make_candidate(second.clone());
        absorb(&ssd, 1200..1400, 1);
        all_read_back(&ssd, 0..1400, |i| u32::from(i >= 1200));
        let live = ssd.dictionaries.live();
        assert_eq!(live.len(), 2, "both named by blocks: {live:?}");
        assert!(live.iter().all(|l| l.2 > 0), "{live:?}");
        for (slot, id, _) in &live {
            assert_eq!(files().read(*slot).map(|(i, _)| i), Some(*id));
        }

        // Every key written again: every block is packed with the second; the first
        // leaves with its file.
        absorb(&ssd, 0..1400, 2);
        all_read_back(&ssd, 0..1400, |_| 2);
        let live = ssd.dictionaries.live();
        assert_eq!(live.len(), 1, "{live:?}");
        assert_ne!(live[0].1, first_id);
        let kept: Vec<u8> = (1..=LIVE as u8)
            .filter(|&s| files().read(s).is_some())
            .collect();
        assert_eq!(kept, vec![live[0].0]);

        // A restart without an index: the one file left is loaded and stays current.
        let reopened = tier(Some(files()));
        reopened.dictionaries.settle_after_open();
        assert_eq!(
            reopened.dictionaries.current().map(|c| c.id),
            Some(live[0].1)
        );
        absorb(&reopened, 0..300, 3);
        all_read_back(&reopened, 0..300, |_| 3);
        // All evicted: the current dictionary stays, the others go.
        ssd.clear();
        assert_eq!(ssd.dictionaries.live().len(), 1);
        std::fs::remove_dir_all(&path).unwrap();
    }

    /// `len` bytes of xorshift noise seeded by `seed`: what no dictionary can shrink.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Offers the records of keys `0..4 * 512` with `value(i)` as the flusher would, a
    /// window at a time, and says whether a dictionary was adopted.
    fn adopted_for(value: impl Fn(u32) -> Vec<u8>) -> bool {
        let training = TrainingSettings {
            samples: 512,
            dictionary_size: 16 << 10,
        };
        let dictionaries = BlockDictionaries::open(Some(training), None, Arc::default());
        for round in 0..4u32 {
            let objects: Vec<EvictedObject> = (round * 512..(round + 1) * 512)
                .map(|i| EvictedObject {
                    key: key(i),
                    value: Some(value(i)),
                    meta: crate::record::Meta::default(),
                })
                .collect();
            dictionaries.take_in(&objects.iter().collect::<Vec<_>>());
            dictionaries.settle();
        }
        dictionaries.adopt();
        dictionaries.current().is_some()
    }

    /// The paper's synthetic values (half random, half zeros) with the bench's keys: a
    /// dictionary packs their blocks a few percent smaller than LZ4, not enough to pay
    /// for zstd's time in the flusher, so none is taken; text rows are.
    #[test]
    fn a_first_dictionary_must_pay_for_its_cpu() {
        let half_random = |i: u32| {
            let mut v = noise(u64::from(i), 32);
            v.resize(64, 0);
            v
        };
        assert!(!adopted_for(half_random));
        assert!(adopted_for(|i| value(i, 0)));
    }

    /// Random values: a dictionary is adopted only by the trainer's judgment, and the
    /// trainer does not keep one that packs them no better than LZ4.
    #[test]
    fn no_dictionary_is_kept_for_values_it_cannot_shrink() {
        let training = TrainingSettings {
            samples: 512,
            dictionary_size: 16 << 10,
        };
        let dictionaries = BlockDictionaries::open(Some(training), None, Arc::default());
        let trainer = dictionaries.trainer.as_ref().unwrap();
        for round in 0..4u64 {
            let values: Vec<Vec<u8>> = (0..512).map(|i| noise(round << 20 | i, 64)).collect();
            values.iter().for_each(|v| trainer.offer(v));
            trainer.settle();
        }
        assert!(trainer.counters.trained.load(Ordering::Relaxed) >= 1);
        dictionaries.adopt();
        assert!(dictionaries.current().is_none());
    }

    /// A dictionary trained on text records like the ones packed below, not those.
    fn trained_on_records(seed: u64) -> Arc<BlockDictionary> {
        let samples: Vec<Vec<u8>> = (0..2000u64)
            .map(|i| text_records(seed ^ (i << 20), 1))
            .collect();
        let samples: Vec<&[u8]> = samples.iter().map(|s| &s[..]).collect();
        let raw = train_from_samples(&samples, 32 << 10).expect("trains");
        BlockDictionary::prepare(&raw, Arc::new(Memory::default())).expect("prepares")
    }

    /// A table whose current dictionary is `dictionary`.
    fn holding(dictionary: &Arc<BlockDictionary>) -> BlockDictionaries {
        let training = TrainingSettings {
            samples: 64,
            dictionary_size: 16 << 10,
        };
        let dictionaries = BlockDictionaries::open(Some(training), None, Arc::default());
        dictionaries.make_candidate(dictionary.clone());
        dictionaries.adopt();
        assert!(dictionaries.current().is_some());
        dictionaries
    }

    /// How `unpack` finds the dictionary a block names: in `table`.
    fn by_id(table: &BlockDictionaries) -> impl FnOnce(u32) -> Option<Arc<Dictionary>> + '_ {
        move |id| table.get(id)
    }

    /// Text records packed with zstd and a trained dictionary: smaller than LZ4, named by
    /// the dictionary's id, and read back only with that very dictionary.
    #[test]
    fn zstd_with_a_dictionary_round_trips_and_only_with_it() {
        let spent = AtomicU64::new(0);
        let raw = text_records(0x5151, 70);
        let dictionary = trained_on_records(1);
        let (lz4, _) = pack(&raw, None, &spent).unwrap();
        let (packed, packing) = pack(&raw, Some((1, dictionary.zstd())), &spent).unwrap();
        assert_eq!(packing, PACKED_ZSTD);
        assert_eq!(DICTIONARY.get(&packed), 1);
        let mut scratch = Vec::new();
        assert!(
            packed.len() * 10 < lz4.len() * 9,
            "{} with the dictionary, {} LZ4",
            packed.len(),
            lz4.len()
        );
        let with = holding(&dictionary);
        let id = with.current().unwrap().id;
        let (packed, _) = pack(&raw, Some((id, dictionary.zstd())), &spent).unwrap();
        assert_eq!(
            unpack(packing, &packed, by_id(&with), &mut scratch),
            Some(&raw[..])
        );
        // No dictionary by that id, or another one under its id: refused.
        let none = BlockDictionaries::open(None, None, Arc::default());
        assert_eq!(unpack(packing, &packed, by_id(&none), &mut scratch), None);
        let impostor = holding(&trained_on_records(2));
        let impostor_by_id = |_| impostor.get(impostor.current()?.id);
        assert_eq!(unpack(packing, &packed, impostor_by_id, &mut scratch), None);
        // A frame cut short or damaged, a raw length that lies: refused.
        let mut damaged = packed.clone();
        let last = damaged.len() - 3;
        damaged[last] ^= 0x20;
        assert_eq!(unpack(packing, &damaged, by_id(&with), &mut scratch), None);
        for cut in [0, 1, ZSTD_FRAME, packed.len() - 1] {
            assert_eq!(
                unpack(packing, &packed[..cut], by_id(&with), &mut scratch),
                None
            );
        }
        let mut lying = packed.clone();
        RAW_LEN.set(&mut lying, raw.len() as u16 - 1);
        assert_eq!(unpack(packing, &lying, by_id(&with), &mut scratch), None);
    }

    #[test]
    fn what_packing_cannot_shrink_or_describe_is_not_packed() {
        let spent = AtomicU64::new(0);
        let dictionary = trained_on_records(3);
        for with in [None, Some((1, dictionary.zstd()))] {
            assert!(pack(&noise(0x2545_F491, 2000), with, &spent).is_none());
            assert!(pack(&vec![0u8; RAW_MAX + 1], with, &spent).is_none());
            assert!(pack(&vec![0u8; RAW_MAX], with, &spent).is_some());
        }
    }

    /// A restart whose settings train no dictionary (`training` `None`) still loads the
    /// files, so that blocks naming them read; none becomes current, and once no block
    /// names one, it and its file go.
    #[test]
    fn dictionaries_are_loaded_without_training_and_leave_when_unnamed() {
        let path = scratch_dir("zc-block-dict-off");
        let files = || files_in(&path);
        let ssd = tier(Some(files()));
        let dictionary = trained(1);
        ssd.dictionaries.make_candidate(dictionary.clone());
        absorb(&ssd, 0..400, 0);
        let id = ssd.dictionaries.current().unwrap().id;

        let untrained = BlockDictionaries::open(None, Some(files()), Arc::default());
        assert!(untrained.any_live());
        assert!(untrained.get(id).is_some(), "loaded for reading");
        let slot = untrained.slot_of(id);
        untrained.count(0, slot);
        untrained.settle_after_open();
        assert!(
            untrained.current().is_none(),
            "no training: LZ4 for new blocks"
        );
        assert!(untrained.get(id).is_some(), "a block names it");
        untrained.count(slot, 0);
        assert!(untrained.get(id).is_none(), "no block names it any more");
        assert!(files().read(slot).is_none(), "its file went with it");
        std::fs::remove_dir_all(&path).unwrap();
    }
}
