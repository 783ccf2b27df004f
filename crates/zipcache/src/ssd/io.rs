//! The tier's I/O: the sub-pages of a super-leaf read or written with every request in
//! flight at once.

use std::sync::atomic::Ordering;

use zipcache_device::{AlignedBuf, BLOCK_SIZE, BatchRead, BatchWrite};

use super::block::{self, Owner, Packing, Stored};
use super::{Contents, SlState, SsdTier, presence};
use crate::record::{Payload, Record};

impl SsdTier {
    pub(super) fn lba(&self, slot: u32, subpage: usize) -> u64 {
        u64::from(slot) * self.settings.subpages as u64 + subpage as u64
    }

    /// The records of `subpages`, read with every read in flight at once; `None` for a
    /// sub-page whose block could not be read or checked (counted), so that what it holds
    /// is unknown (a writer must then replace the block, not keep it).
    pub(super) fn contents_of(&self, st: &SlState, subpages: &[usize]) -> Vec<Option<Contents>> {
        let mut out: Vec<Option<Contents>> = subpages
            .iter()
            .map(|&s| (st.counts[s] == 0).then(Contents::new))
            .collect();
        let Some(slot) = st.slot else { return out };
        let wanted: Vec<usize> = (0..subpages.len()).filter(|&i| out[i].is_none()).collect();
        if wanted.is_empty() {
            return out;
        }
        let mut blocks = AlignedBuf::zeroed(wanted.len());
        let mut reads: Vec<BatchRead<'_>> = wanted
            .iter()
            .zip(blocks.chunks_mut(BLOCK_SIZE))
            .map(|(&i, buf)| BatchRead {
                lba: self.lba(slot, subpages[i]),
                buf,
            })
            .collect();
        // may do I/O: every read in flight at once
        let results = self.device.read_batch(&mut reads);
        drop(reads);
        let mut scratch = Vec::new();
        for ((&i, result), block) in wanted.iter().zip(results).zip(blocks.chunks(BLOCK_SIZE)) {
            self.counters.reads.fetch_add(1, Ordering::Relaxed);
            if result.is_err() {
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let owner = Owner {
                superleaf: slot,
                generation: st.generation,
                subpage: subpages[i] as u16,
            };
            match block::open(block, owner, &self.dictionaries, &mut scratch) {
                Some(records) => {
                    out[i] = Some(
                        records
                            .filter_map(|r| match r.payload {
                                Payload::Inline(v) => Some((r.key.to_vec(), (v.to_vec(), r.meta))),
                                Payload::Medium(_) | Payload::Tombstone => None,
                            })
                            .collect(),
                    )
                }
                None => {
                    self.counters
                        .checksum_failures
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        out
    }

    /// Writes (or, when empty, trims) sub-pages of a super-leaf that has a slot, every
    /// write in flight at once. A sub-page whose records do not go into one block (only
    /// when packing them shrank them less than a split expected) is emptied, its objects
    /// forgotten. Returns how many blocks were written.
    pub(super) fn write_subpages(&self, st: &mut SlState, pages: &[(usize, &Contents)]) -> u64 {
        let Some(slot) = st.slot else { return 0 };
        let mut blocks = AlignedBuf::zeroed(pages.len());
        let mut ok = vec![false; pages.len()];
        let mut emptied = vec![false; pages.len()];
        let mut dictionaries = vec![0u8; pages.len()];
        let mut batch = Vec::new();
        for ((i, &(s, contents)), block) in
            pages.iter().enumerate().zip(blocks.chunks_mut(BLOCK_SIZE))
        {
            let lba = self.lba(slot, s);
            if contents.is_empty() {
                ok[i] = self.device.trim(lba, 1).is_ok();
                continue;
            }
            let owner = Owner {
                superleaf: slot,
                generation: st.generation,
                subpage: s as u16,
            };
            let stored = self.stored(contents);
            if let Some(stored) = stored.filter(|stored| stored.seal(block, owner)) {
                dictionaries[i] = stored.dictionary();
                let buf: &[u8] = block;
                batch.push((i, BatchWrite { lba, buf }));
            } else {
                self.counters
                    .evicted_objects
                    .fetch_add(contents.len() as u64, Ordering::Relaxed);
                ok[i] = self.device.trim(lba, 1).is_ok();
                emptied[i] = true;
            }
        }
        let (index, writes): (Vec<usize>, Vec<BatchWrite<'_>>) = batch.into_iter().unzip();
        let mut written = 0;
        // may do I/O: every write in flight at once
        for (i, result) in index.into_iter().zip(self.device.write_batch(&writes)) {
            ok[i] = result.is_ok();
            written += u64::from(ok[i]);
        }
        for (((&(s, contents), ok), emptied), dictionary) in
            pages.iter().zip(ok).zip(emptied).zip(dictionaries)
        {
            let old_count = i64::from(st.counts[s]);
            let new_count = if ok && !emptied { contents.len() } else { 0 };
            let dictionary = if new_count > 0 { dictionary } else { 0 };
            // may do I/O: a dictionary no block names any more loses its file
            self.dictionaries.count(st.dictionary(s), dictionary);
            if let Some(slot) = st.dictionaries.get_mut(s) {
                *slot = dictionary;
            }
            if !ok {
                // The block's content is now unknown: forget it rather than risk serving
                // an older version from it.
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
                let _ = self.device.trim(self.lba(slot, s), 1);
            }
            st.counts[s] = new_count as u16;
            if let Some(filters) = &mut st.filters {
                filters[s] = if new_count > 0 {
                    presence::filter_of(contents.keys().map(Vec::as_slice))
                } else {
                    0
                };
            }
            self.counters
                .objects
                .fetch_add(new_count as i64 - old_count, Ordering::Relaxed);
        }
        written
    }

    /// A sub-page's records as its block stores them in this tier's mode: packed by
    /// the host in `device_compression=host`, with the current block dictionary if there
    /// is one (may compress).
    pub(super) fn stored(&self, contents: &Contents) -> Option<Stored> {
        let records = contents.iter().map(|(k, (v, meta))| Record {
            key: k,
            payload: Payload::Inline(v),
            meta: *meta,
        });
        let current = self.dictionaries.current();
        let packing = match self.settings.host_compression {
            true => Packing::Host(current.as_ref()),
            false => Packing::Raw,
        };
        Stored::of(records, packing, &self.counters.compress_ns)
    }
}
