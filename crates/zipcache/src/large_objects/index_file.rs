//! BT_LO as a clean `close()` leaves it for the next `open()` (`docs/FORMAT.md`, "The
//! large-object index file").

use std::sync::Arc;

use zipcache_device::BlockDevice;

use super::{Extent, LargeObjects};
use crate::format::index_file::large::{
    BLOCKS, COUNT, FILE, HEAD, HEADER, NEXT_SEQ, START, TAG_CLIENT_CAS, TAG_EXPIRY, TAGS_KNOWN,
};
use crate::memory::Memory;
use crate::record::Meta;
use crate::restart::sealed_file::{self, Fields, IndexFile};

impl LargeObjects {
    /// Writes the live extents (in log order) and the log's position to `at`, atomically
    /// and durably (`sealed_file`). Called only after the device was flushed, so the file
    /// never names an extent that is not durable.
    pub fn save(&self, at: IndexFile<'_>) -> std::io::Result<()> {
        let log = self.log.lock();
        let mut out = FILE.header(at.epoch);
        START.set(&mut out, self.start);
        BLOCKS.set(&mut out, self.blocks);
        HEAD.set(&mut out, log.head);
        NEXT_SEQ.set(&mut out, log.next_seq);
        let live: Vec<(&Arc<[u8]>, Extent)> = log
            .extents
            .iter()
            .filter_map(|(_, _, key, seq)| {
                self.lookup(key).filter(|e| e.seq == *seq).map(|e| (key, e))
            })
            .collect();
        COUNT.set(&mut out, live.len() as u32);
        for (key, e) in live {
            out.extend_from_slice(&(key.len() as u16).to_le_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(&(e.lba - self.start).to_le_bytes());
            out.extend_from_slice(&e.blocks.to_le_bytes());
            out.extend_from_slice(&e.value_len.to_le_bytes());
            out.extend_from_slice(&e.seq.to_le_bytes());
            let expiry = if e.meta.expires_at_ms.is_some() {
                TAG_EXPIRY
            } else {
                0
            };
            let client_cas = if e.meta.client_cas { TAG_CLIENT_CAS } else { 0 };
            out.push(expiry | client_cas);
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
        if !FILE.is_current(&body, at.epoch)
            || START.get(&body) != start
            || BLOCKS.get(&body) != blocks
        {
            return None;
        }
        let head = HEAD.get(&body);
        let next_seq = NEXT_SEQ.get(&body);
        let count = COUNT.get(&body) as usize;
        let mut f = Fields::new(&body[HEADER..]);
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
            if tags & !TAGS_KNOWN != 0 {
                return None;
            }
            let (has_expiry, client_cas) = (tags & TAG_EXPIRY != 0, tags & TAG_CLIENT_CAS != 0);
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
