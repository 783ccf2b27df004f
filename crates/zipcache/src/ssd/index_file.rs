//! The BT_SSD index as a clean `close()` leaves it for the next `open()`
//! (`docs/FORMAT.md`, "The index file"), and as the crash journal's descriptor log
//! checkpoints and replays it ("The crash journal"): one encoding of a descriptor for
//! both, and one way back from descriptors to a tier.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use zipcache_device::BlockDevice;

use super::reclaim::Writer;
use super::{BlockDictionaries, SlState, SsdSettings, SsdTier, SuperLeaf, presence};
use crate::btree::{Fence, KeyRange};
use crate::config::Clock;
use crate::format::index_file::ssd::{BLOCK_COUNT, COUNT, FILE, HEADER, NEXT_SLOT, SUBPAGES};
use crate::format::journal::{REMOVE, UPSERT};
use crate::memory::Memory;
use crate::restart::journal::Replay;
use crate::restart::sealed_file::{self, Fields, IndexFile};

/// What opening an index or a journal needs besides its bytes.
pub struct Opening {
    pub device: Arc<dyn BlockDevice>,
    pub settings: SsdSettings,
    pub memory: Arc<Memory>,
    pub clock: Arc<dyn Clock>,
    pub dictionaries: Arc<BlockDictionaries>,
}

/// A super-leaf descriptor as a file holds it: the low fence (the high is the next
/// one's low), the slot, the generation, objects per sub-page, and each sub-page's
/// block dictionary (as a slot of `dictionaries`).
struct Descriptor {
    low: Fence,
    slot: Option<u32>,
    generation: u32,
    counts: Vec<u16>,
    dictionaries: Box<[u8]>,
}

impl SsdTier {
    /// Writes the descriptors of every super-leaf to `at` (atomically: a temporary
    /// file, fsync, rename), and `shadowed`, the fingerprints of keys whose flash
    /// versions must stay hidden. Called only after the device was flushed, so the index
    /// never names a block that is not durable.
    pub fn save(&self, at: IndexFile<'_>, shadowed: &[u64]) -> std::io::Result<()> {
        let mut body = self.index_body(&self.writer.lock(), at.epoch);
        body.extend_from_slice(&(shadowed.len() as u32).to_le_bytes());
        for tag in shadowed {
            body.extend_from_slice(&tag.to_le_bytes());
        }
        sealed_file::write(at.dir, at.name, body)
    }

    /// The index file's header and every descriptor, in key order (the caller holds the
    /// writer lock, so no descriptor changes meanwhile).
    pub(super) fn index_body(&self, w: &Writer, epoch: u64) -> Vec<u8> {
        let mut out = FILE.header(epoch);
        SUBPAGES.set(&mut out, self.settings.subpages as u32);
        BLOCK_COUNT.set(&mut out, self.device.block_count());
        NEXT_SLOT.set(&mut out, w.next_slot);
        let mut leaves = Vec::new();
        self.tree.for_each_leaf(|_, leaf| leaves.push(leaf.clone()));
        COUNT.set(&mut out, leaves.len() as u32);
        for leaf in &leaves {
            self.encode_descriptor(&mut out, &leaf.state.read());
        }
        out
    }

    /// One descriptor as the index file and the descriptor log hold it.
    pub(super) fn encode_descriptor(&self, out: &mut Vec<u8>, st: &SlState) {
        out.extend_from_slice(&(st.range.low.len() as u16).to_le_bytes());
        out.extend_from_slice(&st.range.low);
        out.extend_from_slice(&st.slot.unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&st.generation.to_le_bytes());
        for c in st.counts.iter() {
            out.extend_from_slice(&c.to_le_bytes());
        }
        for s in 0..st.counts.len() {
            let id = self.dictionaries.id_of(st.dictionary(s));
            out.extend_from_slice(&id.to_le_bytes());
        }
    }

    /// Rebuilds BT_SSD from an index `save` wrote for this very device and geometry,
    /// its blocks packed with `dictionaries`' (a block naming one it does not hold reads
    /// as a miss), with the fingerprints it kept shadowed; `None` if the file is missing,
    /// damaged or from another layout (then start cold).
    pub fn load(at: IndexFile<'_>, opening: Opening) -> Option<(SsdTier, Vec<u64>)> {
        let body = sealed_file::read(at.dir, at.name)?;
        let (next_slot, descriptors, mut f) = parse_body(&body, at.epoch, &opening)?;
        let count = f.u32()? as usize;
        let mut shadowed = Vec::with_capacity(count.min(1 << 24));
        for _ in 0..count {
            shadowed.push(f.u64()?);
        }
        if !f.is_done() {
            return None;
        }
        Some((build(next_slot, descriptors, opening)?, shadowed))
    }

    /// Rebuilds BT_SSD from a crashed run's descriptor log: its checkpoint, then each
    /// record in order. `None` if what they add up to is not a tier this code writes.
    pub fn recover(replay: &Replay, epoch: u64, opening: Opening) -> Option<SsdTier> {
        let (mut next_slot, descriptors, f) = parse_body(&replay.checkpoint, epoch, &opening)?;
        if !f.is_done() {
            return None;
        }
        let mut by_low: BTreeMap<Fence, Descriptor> = descriptors
            .into_iter()
            .map(|d| (d.low.clone(), d))
            .collect();
        for record in &replay.records {
            let (&kind, rest) = record.split_first()?;
            let mut f = Fields::new(rest);
            match kind {
                UPSERT => {
                    next_slot = f.u32()?;
                    let d = parse_descriptor(&mut f, &opening)?;
                    by_low.insert(d.low.clone(), d);
                }
                REMOVE => {
                    let len = f.u16()? as usize;
                    by_low.remove(f.bytes(len)?);
                }
                _ => return None,
            }
            if !f.is_done() {
                return None;
            }
        }
        build(next_slot, by_low.into_values().collect(), opening)
    }
}

/// An index body's header checked against this device and geometry, its slot counter,
/// its descriptors, and what follows them.
fn parse_body<'a>(
    body: &'a [u8],
    epoch: u64,
    opening: &Opening,
) -> Option<(u32, Vec<Descriptor>, Fields<'a>)> {
    if !FILE.is_current(body, epoch)
        || SUBPAGES.get(body) as usize != opening.settings.subpages
        || BLOCK_COUNT.get(body) != opening.device.block_count()
    {
        return None;
    }
    let count = COUNT.get(body) as usize;
    let mut f = Fields::new(&body[HEADER..]);
    let mut descriptors = Vec::with_capacity(count.min(1 << 24));
    for _ in 0..count {
        descriptors.push(parse_descriptor(&mut f, opening)?);
    }
    Some((NEXT_SLOT.get(body), descriptors, f))
}

fn parse_descriptor(f: &mut Fields<'_>, opening: &Opening) -> Option<Descriptor> {
    let m = opening.settings.subpages;
    let len = f.u16()? as usize;
    let low = Fence::from(f.bytes(len)?);
    let slot = f.u32()?;
    let generation = f.u32()?;
    let mut counts = vec![0u16; m];
    for c in &mut counts {
        *c = f.u16()?;
    }
    let mut dictionaries = opening.settings.dictionary_slots();
    for s in 0..m {
        let slot = opening.dictionaries.slot_of(f.u32()?);
        if let Some(id) = dictionaries.get_mut(s) {
            *id = slot;
        }
    }
    Some(Descriptor {
        low,
        slot: (slot != u32::MAX).then_some(slot),
        generation,
        counts,
        dictionaries,
    })
}

/// The tier `descriptors` (in key order) describe, if they are one this code writes:
/// the first covers the empty key, fences ascend, every slot is below `next_slot`, the
/// slot counter fits the device, and no two share a slot.
fn build(next_slot: u32, descriptors: Vec<Descriptor>, opening: Opening) -> Option<SsdTier> {
    let Opening {
        device,
        settings,
        memory,
        clock,
        dictionaries,
    } = opening;
    let m = settings.subpages;
    let ordered = descriptors.windows(2).all(|p| p[0].low < p[1].low);
    let first_is_empty = descriptors.first().is_some_and(|d| d.low.is_empty());
    let max_slots = settings.blocks / m as u64;
    let slots_valid = next_slot as u64 <= max_slots
        && descriptors
            .iter()
            .all(|d| d.slot.is_none_or(|s| s < next_slot));
    if !ordered || !first_is_empty || !slots_valid {
        return None;
    }
    let tier = SsdTier::with_dictionaries(device, settings, memory, clock, dictionaries);
    let mut used = vec![false; next_slot as usize];
    let highs: Vec<Option<Fence>> = descriptors
        .iter()
        .skip(1)
        .map(|d| Some(d.low.clone()))
        .chain([None])
        .collect();
    for (d, high) in descriptors.into_iter().zip(highs) {
        if let Some(s) = d.slot {
            if std::mem::replace(&mut used[s as usize], true) {
                return None; // two super-leaves in one slot: not an index we wrote
            }
            tier.counters.occupied.fetch_add(1, Ordering::Relaxed);
        }
        let objects: i64 = d.counts.iter().map(|&c| i64::from(c)).sum();
        tier.counters.objects.fetch_add(objects, Ordering::Relaxed);
        let state = SlState {
            range: KeyRange::new(d.low.clone(), high),
            slot: d.slot,
            generation: d.generation,
            // Not saved: "maybe" for every key until the sub-page is written again.
            filters: settings.filters(presence::UNKNOWN),
            counts: d.counts.into_boxed_slice(),
            dictionaries: d.dictionaries,
            version: 0,
        };
        if d.low.is_empty() {
            *tier.tree.find(&[]).1.state.write() = state;
        } else {
            let delta = tier.tree.insert(d.low, SuperLeaf::new(state));
            tier.counters.superleaves.fetch_add(1, Ordering::Relaxed);
            tier.memory
                .change_index(delta + settings.descriptor_bytes() as i64);
        }
    }
    {
        let mut w = tier.writer.lock();
        w.next_slot = next_slot;
        w.free_slots = (0..next_slot).filter(|&s| !used[s as usize]).collect();
    }
    tier.tree.for_each_leaf(|_, leaf| {
        let st = leaf.state.read();
        for (s, &count) in st.counts.iter().enumerate() {
            if count > 0 {
                tier.dictionaries.count(0, st.dictionary(s));
            }
        }
    });
    Some(tier)
}

#[cfg(test)]
mod tests {
    use zipcache_device::MemDevice;

    use super::super::test_support::*;
    use super::*;
    use crate::config::SystemClock;
    use crate::restart::dir::FsDir;

    type Descriptor = (Fence, Option<Fence>, Option<u32>, u32, Vec<u16>);

    fn descriptors(ssd: &SsdTier) -> Vec<Descriptor> {
        let mut out = Vec::new();
        ssd.tree.for_each_leaf(|_, leaf| {
            let st = leaf.state.read();
            out.push((
                st.range.low.clone(),
                st.range.high.clone(),
                st.slot,
                st.generation,
                st.counts.to_vec(),
            ));
        });
        out
    }

    /// Where each descriptor's slot sits in an index file's body.
    fn slot_offsets(body: &[u8], subpages: usize) -> Vec<usize> {
        let count = u32::from_le_bytes(body[32..36].try_into().unwrap()) as usize;
        let mut at = 36;
        let mut out = Vec::new();
        for _ in 0..count {
            let len = u16::from_le_bytes([body[at], body[at + 1]]) as usize;
            at += 2 + len;
            out.push(at);
            at += 8 + 6 * subpages;
        }
        let shadowed = u32::from_le_bytes(body[at..at + 4].try_into().unwrap()) as usize;
        assert_eq!(at + 4 + 8 * shadowed, body.len());
        out
    }

    #[test]
    fn the_index_file_round_trips_and_refuses_damage() {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 64));
        let settings = settings(64);
        let ssd = tier_on(device.clone(), settings);
        for round in 0..20u32 {
            absorb(&ssd, (0..40).map(|i| (i * 20 + round) * 7919 % 100_000));
        }
        assert!(ssd.tree.leaf_count() > 2, "super-leaves split");
        let path = std::env::temp_dir().join(format!("zc-ssd-index-{}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        let dir = FsDir::new(&path);
        let at = |epoch| IndexFile {
            dir: &dir,
            name: "ssd",
            epoch,
        };
        let load = |epoch, device: &Arc<dyn BlockDevice>, settings| {
            let memory = Arc::new(Memory::default());
            let dictionaries = BlockDictionaries::open(None, None, memory.clone());
            SsdTier::load(
                at(epoch),
                Opening {
                    device: device.clone(),
                    settings,
                    memory,
                    clock: Arc::new(SystemClock),
                    dictionaries: Arc::new(dictionaries),
                },
            )
        };
        let shadowed = [11, u64::MAX, 22];
        ssd.save(at(7), &shadowed).unwrap();
        let (back, carried) = load(7, &device, settings).unwrap();
        assert_eq!(carried, shadowed, "the hidden keys' fingerprints come back");
        assert_eq!(descriptors(&back), descriptors(&ssd));
        let free = |t: &SsdTier| {
            let w = t.writer.lock();
            let mut free = w.free_slots.clone();
            free.sort_unstable();
            (w.next_slot, free)
        };
        assert_eq!(free(&back), free(&ssd));
        let mut hits = 0;
        for round in 0..20u32 {
            for i in 0..40 {
                let k = key((i * 20 + round) * 7919 % 100_000);
                let value = |t: &SsdTier| t.get(&k, 0).map(|hit| hit.value);
                assert_eq!(value(&back), value(&ssd));
                hits += usize::from(value(&back).is_some());
            }
        }
        assert!(hits > 400, "{hits} keys found");
        // Another run epoch, sub-page count or device: not loaded.
        assert!(load(8, &device, settings).is_none());
        let eight = SsdSettings {
            subpages: 8,
            ..settings
        };
        assert!(load(7, &device, eight).is_none());
        let other: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 64 + 1));
        assert!(load(7, &other, settings).is_none());
        // Intact, but two super-leaves in one slot: not an index `save` writes.
        let mut body = sealed_file::read(&dir, "ssd").unwrap();
        let offsets = slot_offsets(&body, settings.subpages);
        let first: [u8; 4] = body[offsets[0]..offsets[0] + 4].try_into().unwrap();
        assert_ne!(
            u32::from_le_bytes(first),
            u32::MAX,
            "the first super-leaf has a slot"
        );
        body[offsets[1]..offsets[1] + 4].copy_from_slice(&first);
        sealed_file::write(&dir, "ssd", body).unwrap();
        assert!(load(7, &device, settings).is_none());
        // One flipped byte: the seal refuses it.
        ssd.save(at(7), &shadowed).unwrap();
        assert!(load(7, &device, settings).is_some());
        let mut bytes = std::fs::read(path.join("ssd")).unwrap();
        bytes[40] ^= 1;
        std::fs::write(path.join("ssd"), &bytes).unwrap();
        assert!(load(7, &device, settings).is_none());
        std::fs::remove_dir_all(&path).unwrap();
    }
}
