//! BT_LO as a clean `close()` leaves it for the next `open()` (`docs/FORMAT.md`, "The
//! large-object index file").

use std::sync::Arc;

use zipcache_device::BlockDevice;

use super::{Extent, LargeObjects};
use crate::memory::Memory;
use crate::record::Meta;
use crate::sealed_file::{self, Fields, IndexFile};

const MAGIC: [u8; 4] = *b"ZCLX";
/// 3 since extents of version 2 (format 5): an index of 2 names extents of version 1,
/// which are refused, so it is not loaded (the region starts empty).
const VERSION: u32 = 3;

impl LargeObjects {
    /// Writes the live extents (in log order) and the log's position to `at`, atomically
    /// and durably (`sealed_file`). Called only after the device was flushed, so the file
    /// never names an extent that is not durable.
    pub fn save(&self, at: IndexFile<'_>) -> std::io::Result<()> {
        let log = self.log.lock();
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&at.epoch.to_le_bytes());
        for n in [self.start, self.blocks, log.head, log.next_seq] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        let live: Vec<(&Arc<[u8]>, Extent)> = log
            .extents
            .iter()
            .filter_map(|(_, _, key, seq)| {
                self.lookup(key).filter(|e| e.seq == *seq).map(|e| (key, e))
            })
            .collect();
        out.extend_from_slice(&(live.len() as u32).to_le_bytes());
        for (key, e) in live {
            out.extend_from_slice(&(key.len() as u16).to_le_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(&(e.lba - self.start).to_le_bytes());
            out.extend_from_slice(&e.blocks.to_le_bytes());
            out.extend_from_slice(&e.value_len.to_le_bytes());
            out.extend_from_slice(&e.seq.to_le_bytes());
            out.push(u8::from(e.meta.expires_at_ms.is_some()) | u8::from(e.meta.client_cas) << 1);
            out.extend_from_slice(&e.meta.expires_at_ms.unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&e.meta.flags.to_le_bytes());
            out.extend_from_slice(&e.meta.cas.to_le_bytes());
        }
        sealed_file::write(at.dir, at.name, out)
    }

    /// Rebuilds BT_LO and its log from a file `save` wrote for this very region; `None`
    /// if the file is missing, damaged or describes another layout (then the region
    /// starts empty). Every extent is still checked against its on-device header and
    /// CRC when it is read.
    pub fn load(
        at: IndexFile<'_>,
        device: Arc<dyn BlockDevice>,
        start: u64,
        blocks: u64,
        memory: Arc<Memory>,
    ) -> Option<LargeObjects> {
        let body = sealed_file::read(at.dir, at.name)?;
        let mut f = Fields::new(&body);
        if f.bytes(4)? != MAGIC
            || f.u32()? != VERSION
            || f.u64()? != at.epoch
            || f.u64()? != start
            || f.u64()? != blocks
        {
            return None;
        }
        let head = f.u64()?;
        let next_seq = f.u64()?;
        let count = f.u32()? as usize;
        let mut extents = Vec::with_capacity(count.min(1 << 20));
        let mut keys = std::collections::HashSet::new();
        for _ in 0..count {
            let key_len = f.u16()? as usize;
            let key: Arc<[u8]> = Arc::from(f.bytes(key_len)?);
            let first = f.u64()?;
            let len = f.u32()?;
            let value_len = f.u32()?;
            let seq = f.u64()?;
            let tags = f.u8()?;
            if tags > 0b11 {
                return None;
            }
            let (has_expiry, client_cas) = (tags & 1 != 0, tags & 0b10 != 0);
            let expires_at_ms = f.u64()?;
            let flags = f.u32()?;
            let cas = f.u64()?;
            let fits = first
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= blocks);
            if !fits || len == 0 || seq >= next_seq || !keys.insert(key.clone()) {
                return None;
            }
            let meta = Meta {
                expires_at_ms: has_expiry.then_some(expires_at_ms),
                flags,
                cas,
                clean: false,
                client_cas,
            };
            let extent = Extent {
                lba: start + first,
                blocks: len,
                value_len,
                seq,
                meta,
            };
            extents.push((first, key, extent));
        }
        if !f.is_done() || head > blocks {
            return None;
        }
        let lo = LargeObjects::new(device, start, blocks, memory);
        {
            let mut log = lo.log.lock();
            log.head = head;
            log.next_seq = next_seq;
            for (first, key, extent) in &extents {
                log.extents
                    .push_back((*first, extent.blocks, key.clone(), extent.seq));
            }
        }
        for (_, key, extent) in extents {
            lo.insert(key, extent);
        }
        Some(lo)
    }
}
