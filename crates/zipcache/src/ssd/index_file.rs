//! The BT_SSD index as a clean `close()` leaves it for the next `open()`
//! (`docs/FORMAT.md`, "The index file").

use std::sync::Arc;
use std::sync::atomic::Ordering;

use zipcache_device::BlockDevice;

use super::{BlockDictionaries, SlState, SsdSettings, SsdTier, SuperLeaf, presence};
use crate::btree::{Fence, KeyRange};
use crate::config::Clock;
use crate::format::index_file::ssd::{BLOCK_COUNT, COUNT, FILE, HEADER, NEXT_SLOT, SUBPAGES};
use crate::memory::Memory;
use crate::restart::sealed_file::{self, Fields, IndexFile};

impl SsdTier {
    /// Writes the descriptors of every super-leaf to `path` (atomically: a temporary
    /// file, fsync, rename). Called only after the device was flushed, so the index
    /// never names a block that is not durable.
    pub fn save(&self, at: IndexFile<'_>) -> std::io::Result<()> {
        let w = self.writer.lock();
        let mut out = FILE.header(at.epoch);
        SUBPAGES.set(&mut out, self.settings.subpages as u32);
        BLOCK_COUNT.set(&mut out, self.device.block_count());
        NEXT_SLOT.set(&mut out, w.next_slot);
        let mut leaves = Vec::new();
        self.tree.for_each_leaf(|_, leaf| leaves.push(leaf.clone()));
        COUNT.set(&mut out, leaves.len() as u32);
        for leaf in &leaves {
            let st = leaf.state.read();
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
        sealed_file::write(at.dir, at.name, out)
    }

    /// Rebuilds BT_SSD from an index `save` wrote for this very device and geometry,
    /// its blocks packed with `dictionaries`' (a block naming one it does not hold reads
    /// as a miss); `None` if the file is missing, damaged or from another layout (then
    /// start cold).
    pub fn load(
        at: IndexFile<'_>,
        device: Arc<dyn BlockDevice>,
        settings: SsdSettings,
        memory: Arc<Memory>,
        clock: Arc<dyn Clock>,
        dictionaries: Arc<BlockDictionaries>,
    ) -> Option<SsdTier> {
        let body = sealed_file::read(at.dir, at.name)?;
        let m = settings.subpages;
        if !FILE.is_current(&body, at.epoch)
            || SUBPAGES.get(&body) as usize != m
            || BLOCK_COUNT.get(&body) != device.block_count()
        {
            return None;
        }
        let next_slot = NEXT_SLOT.get(&body);
        let count = COUNT.get(&body) as usize;
        let mut f = Fields::new(&body[HEADER..]);
        let mut descriptors = Vec::with_capacity(count.min(1 << 24));
        for _ in 0..count {
            let len = f.u16()? as usize;
            let low = Fence::from(f.bytes(len)?);
            let slot = f.u32()?;
            let generation = f.u32()?;
            let mut counts = vec![0u16; m];
            for c in &mut counts {
                *c = f.u16()?;
            }
            let mut ids = settings.dictionary_slots();
            for s in 0..m {
                let slot = dictionaries.slot_of(f.u32()?);
                if let Some(id) = ids.get_mut(s) {
                    *id = slot;
                }
            }
            let slot = (slot != u32::MAX).then_some(slot);
            descriptors.push((low, slot, generation, counts, ids));
        }
        let ordered = descriptors.windows(2).all(|p| p[0].0 < p[1].0);
        let first_is_empty = descriptors.first().is_some_and(|d| d.0.is_empty());
        let max_slots = settings.blocks / m as u64;
        let slots_valid = next_slot as u64 <= max_slots
            && descriptors
                .iter()
                .all(|d| d.1.is_none_or(|s| s < next_slot));
        if !f.is_done() || !ordered || !first_is_empty || !slots_valid {
            return None;
        }
        let tier = SsdTier::with_dictionaries(device, settings, memory, clock, dictionaries);
        let mut used = vec![false; next_slot as usize];
        let highs: Vec<Option<Fence>> = descriptors
            .iter()
            .skip(1)
            .map(|d| Some(d.0.clone()))
            .chain([None])
            .collect();
        for ((low, slot, generation, counts, ids), high) in descriptors.into_iter().zip(highs) {
            if let Some(s) = slot {
                if std::mem::replace(&mut used[s as usize], true) {
                    return None; // two super-leaves in one slot: not an index we wrote
                }
                tier.counters.occupied.fetch_add(1, Ordering::Relaxed);
            }
            let objects: i64 = counts.iter().map(|&c| i64::from(c)).sum();
            tier.counters.objects.fetch_add(objects, Ordering::Relaxed);
            let state = SlState {
                range: KeyRange::new(low.clone(), high),
                slot,
                generation,
                // Not saved: "maybe" for every key until the sub-page is written again.
                filters: settings.filters(presence::UNKNOWN),
                counts: counts.into_boxed_slice(),
                dictionaries: ids,
                version: 0,
            };
            if low.is_empty() {
                *tier.tree.find(&[]).1.state.write() = state;
            } else {
                let delta = tier.tree.insert(low, SuperLeaf::new(state));
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
        assert_eq!(at, body.len());
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
                device.clone(),
                settings,
                memory,
                Arc::new(SystemClock),
                Arc::new(dictionaries),
            )
        };
        ssd.save(at(7)).unwrap();
        let back = load(7, &device, settings).unwrap();
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
        ssd.save(at(7)).unwrap();
        assert!(load(7, &device, settings).is_some());
        let mut bytes = std::fs::read(path.join("ssd")).unwrap();
        bytes[40] ^= 1;
        std::fs::write(path.join("ssd"), &bytes).unwrap();
        assert!(load(7, &device, settings).is_none());
        std::fs::remove_dir_all(&path).unwrap();
    }
}
