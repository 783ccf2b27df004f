//! Block dictionaries (`device_compression=host`; issue 22, issue 21 item 5): zstd
//! dictionaries trained on the records the flusher writes, that SSD blocks are packed
//! with, persisted beside the SSD file before the first block that names one is written.
//!
//! A 4 KiB block packed alone starts from an empty window: LZ4 shrinks 64-byte rows of
//! real text by a third. zstd at level [`LEVEL`] with a dictionary trained on recent
//! records puts 1.7–1.95× as many of them in a block (`benches/ssd_block_codecs.rs`,
//! docs/RESULTS.md "Fourth part"); on random values a dictionary gains nothing, and none
//! is adopted (the trainer keeps a candidate only if held-out records pack ≥ 5 %
//! smaller with it).
//!
//! * Training: [`Trainer`] (`dictionary/training.rs`) over a reservoir of the evicted
//!   records as blocks encode them, charged to the DRAM budget, as the DRAM
//!   dictionaries are.
//! * Adoption ([`BlockDictionaries::adopt`], by the flusher under the tier's writer lock):
//!   a new current dictionary takes one of [`LIVE`] slots, gets an id never used in this
//!   data directory, and is written to its slot's file (`<ssd file>.dict-<slot>`, sealed,
//!   fsynced, renamed, directory fsynced) before any block is packed with it.
//! * Lifetime: each super-leaf descriptor remembers which slot each of its blocks was
//!   packed with; the table counts blocks per slot. A dictionary that is not current and
//!   that no block names any more leaves the table and its file is removed. With all
//!   slots still named by blocks, a new candidate waits (blocks keep their dictionary
//!   until rewritten, trimmed or evicted).
//! * Restart: `open` loads every slot file that is intact; a warm start counts the blocks
//!   the index names per dictionary, a cold one none; unnamed dictionaries go, except the
//!   newest, which stays current so that packing goes on without retraining. A block
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
use crate::index_dir::IndexDir;
use crate::memory::{Memory, alloc_size};
use crate::record::{Payload, Record};
use crate::sealed_file;

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

    /// Appends `raw` compressed with this dictionary (a zstd frame with its checksum).
    pub fn compress(&self, raw: &[u8], out: &mut Vec<u8>) -> Option<usize> {
        self.zstd.compress(raw, out)
    }

    /// The `len` bytes a frame of this dictionary holds; `None` if it does not decode to
    /// exactly that with a good checksum.
    pub fn decompress(&self, frame: &[u8], len: usize) -> Option<Vec<u8>> {
        self.zstd.decompress(frame, len)
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
                let packed = host_compression::pack(&block, dictionary.map(|d| (1, d)), &spent);
                cost += packed.map_or(block.len(), |(bytes, _)| bytes.len());
                block.clear();
            }
        }
        cost
    }
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
    /// The id the next adopted dictionary gets: above every id found in a file.
    next_id: u32,
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
    /// Block dictionaries trained with `training` (`None`: never, blocks are packed with
    /// LZ4 alone), persisted in `files` if given, which are loaded now: every intact one
    /// goes into the table, named by no block yet (may do I/O).
    pub fn open(
        training: Option<TrainingSettings>,
        files: Option<DictionaryFiles>,
        memory: Arc<Memory>,
    ) -> BlockDictionaries {
        let mut table = Table {
            live: Default::default(),
            current: 0,
            next_id: 1,
        };
        if let Some(files) = &files {
            for slot in 1..=LIVE as u8 {
                let Some((id, raw)) = files.read(slot) else {
                    continue;
                };
                table.next_id = table.next_id.max(id.saturating_add(1));
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
    /// leave, but for the newest, which stays current (may do I/O).
    pub fn settle_after_open(&self) {
        let mut table = self.table.write();
        let newest = (1..=LIVE as u8)
            .filter_map(|slot| table.slot(slot).map(|live| (live.id, slot)))
            .max()
            .map_or(0, |(_, slot)| slot);
        table.current = newest;
        if let (Some(trainer), Some(live)) = (&self.trainer, table.slot(newest)) {
            trainer.make_current(Some(live.dictionary.clone()));
        }
        for slot in 1..=LIVE as u8 {
            self.drop_if_unused(&mut table, slot);
        }
    }

    /// Objects the flusher is about to write: offered to the trainer's reservoir as
    /// records, then the trainer's newest dictionary adopted (may do I/O: `adopt`).
    pub fn take_in(&self, objects: &[&EvictedObject]) {
        let Some(trainer) = &self.trainer else { return };
        let mut encoded = Vec::new();
        let mut ends = Vec::new();
        for o in objects {
            let Some(value) = &o.value else { continue };
            let record = Record {
                key: &o.key,
                payload: Payload::Inline(value),
                meta: o.meta,
            };
            record.encode(&mut encoded);
            ends.push(encoded.len());
        }
        let starts = std::iter::once(0).chain(ends.iter().copied());
        trainer.offer_all(starts.zip(&ends).map(|(start, &end)| &encoded[start..end]));
        self.adopt();
    }

    /// Makes the trainer's newest dictionary the one blocks are packed with: it takes a
    /// slot no block names, a new id, and its file, written durably first (may do I/O).
    /// With every slot named by blocks, or the file not written, nothing changes.
    pub fn adopt(&self) {
        let Some(candidate) = self.trainer.as_ref().and_then(|t| t.current()) else {
            return;
        };
        let mut table = self.table.write();
        if table
            .slot(table.current)
            .is_some_and(|live| Arc::ptr_eq(&live.dictionary, &candidate))
        {
            return;
        }
        let free = (1..=LIVE as u8).find(|&slot| {
            table
                .slot(slot)
                .is_none_or(|live| live.blocks == 0 && slot != table.current)
        });
        let Some(slot) = free else { return };
        let id = table.next_id;
        if let Some(files) = &self.files
            && files.write(slot, id, &candidate.raw).is_err()
        {
            return;
        }
        table.next_id = id.wrapping_add(1).max(1);
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

    /// The live dictionary of id `id`, for a block that names it.
    pub fn get(&self, id: u32) -> Option<Arc<BlockDictionary>> {
        let table = self.table.read();
        table
            .live
            .iter()
            .flatten()
            .find(|live| live.id == id)
            .map(|live| live.dictionary.clone())
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
