//! BT_LO as a clean `close()` leaves it for the next `open()` (`docs/FORMAT.md`, "The
//! large-object index file"); the same body is the crash journal's checkpoint
//! (`journal.rs`), and one extent entry's encoding serves both.

use std::sync::Arc;

use zipcache_device::BlockDevice;

use super::{Extent, LargeObjects, Log};
use crate::format::index_file::large::{
    BLOCKS, COUNT, FILE, HEAD, HEADER, NEXT_SEQ, START, TAG_CLIENT_CAS, TAG_COLLECTION, TAG_EXPIRY,
    TAGS_KNOWN,
};
use crate::memory::Memory;
use crate::record::Meta;
use crate::restart::sealed_file::{self, Fields, IndexFile};

/// An index body read back: the log's position and its live extents, oldest first, each
/// with its first block relative to the region.
pub(super) struct Parsed {
    pub(super) head: u64,
    pub(super) next_seq: u64,
    pub(super) extents: Vec<(u64, Arc<[u8]>, Extent)>,
}

impl LargeObjects {
    /// Writes the live extents (in log order) and the log's position to `at`, atomically
    /// and durably (`sealed_file`). Called only after the device was flushed, so the file
    /// never names an extent that is not durable.
    pub fn save(&self, at: IndexFile<'_>) -> std::io::Result<()> {
        let log = self.log.lock();
        sealed_file::write(at.dir, at.name, self.index_body(&log, at.epoch))
    }

    /// The index as the log (`log`, its lock held) and BT_LO hold it now.
    pub(super) fn index_body(&self, log: &Log, epoch: u64) -> Vec<u8> {
        let mut out = FILE.header(epoch);
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
            self.encode_entry(&mut out, key, &e);
        }
        out
    }

    /// One extent as the index file (and the journal's records) encode it: key length
    /// (2), key, first block relative to the region (8), blocks (4), value length (4),
    /// sequence number (8), tags (1), expiry (8), client flags (4), CAS (8).
    pub(super) fn encode_entry(&self, out: &mut Vec<u8>, key: &[u8], e: &Extent) {
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(&(e.lba - self.start).to_le_bytes());
        out.extend_from_slice(&e.blocks.to_le_bytes());
        out.extend_from_slice(&e.value_len.to_le_bytes());
        out.extend_from_slice(&e.seq.to_le_bytes());
        encode_meta(out, &e.meta);
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
        let parsed = parse(&body, at.epoch, start, blocks)?;
        Some(LargeObjects::rebuilt(parsed, device, start, blocks, memory))
    }

    /// BT_LO and its log holding `parsed`, whose extents are in log order.
    pub(super) fn rebuilt(
        parsed: Parsed,
        device: Arc<dyn BlockDevice>,
        start: u64,
        blocks: u64,
        memory: Arc<Memory>,
    ) -> LargeObjects {
        let lo = LargeObjects::new(device, start, blocks, memory);
        {
            let mut log = lo.log.lock();
            log.head = parsed.head;
            log.next_seq = parsed.next_seq;
            for (first, key, extent) in &parsed.extents {
                log.extents
                    .push_back((*first, extent.blocks, key.clone(), extent.seq));
            }
        }
        for (_, key, extent) in parsed.extents {
            lo.insert(key, extent);
        }
        lo
    }
}

/// An extent's metadata: tags (1), expiry (8), client flags (4), CAS (8).
pub(super) fn encode_meta(out: &mut Vec<u8>, meta: &Meta) {
    let expiry = if meta.expires_at_ms.is_some() {
        TAG_EXPIRY
    } else {
        0
    };
    let client_cas = if meta.client_cas { TAG_CLIENT_CAS } else { 0 };
    let collection = if meta.collection { TAG_COLLECTION } else { 0 };
    out.push(expiry | client_cas | collection);
    out.extend_from_slice(&meta.expires_at_ms.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&meta.flags.to_le_bytes());
    out.extend_from_slice(&meta.cas.to_le_bytes());
}

/// What `encode_meta` wrote; `None` for bytes it never writes.
pub(super) fn decode_meta(f: &mut Fields<'_>) -> Option<Meta> {
    let tags = f.u8()?;
    if tags & !TAGS_KNOWN != 0 {
        return None;
    }
    let has_expiry = tags & TAG_EXPIRY != 0;
    let expires_at_ms = f.u64()?;
    let flags = f.u32()?;
    let cas = f.u64()?;
    Some(Meta {
        expires_at_ms: has_expiry.then_some(expires_at_ms),
        flags,
        cas,
        clean: false,
        client_cas: tags & TAG_CLIENT_CAS != 0,
        collection: tags & TAG_COLLECTION != 0,
    })
}

/// One entry as `encode_entry` wrote it, for a region of `blocks` at `start`: its first
/// block relative to the region, key and extent; `None` if it is malformed or does not
/// fit the region.
pub(super) fn decode_entry(
    f: &mut Fields<'_>,
    start: u64,
    blocks: u64,
) -> Option<(u64, Arc<[u8]>, Extent)> {
    let key_len = f.u16()? as usize;
    let key: Arc<[u8]> = Arc::from(f.bytes(key_len)?);
    let first = f.u64()?;
    let len = f.u32()?;
    let value_len = f.u32()?;
    let seq = f.u64()?;
    let meta = decode_meta(f)?;
    let fits = first
        .checked_add(u64::from(len))
        .is_some_and(|end| end <= blocks);
    if !fits || len == 0 {
        return None;
    }
    let extent = Extent {
        lba: start + first,
        blocks: len,
        value_len,
        seq,
        meta,
    };
    Some((first, key, extent))
}

/// An index body of the run of `epoch` for this region, checked whole: every extent
/// fits the region, no key twice, every sequence below the next one.
pub(super) fn parse(body: &[u8], epoch: u64, start: u64, blocks: u64) -> Option<Parsed> {
    if !FILE.is_current(body, epoch) || START.get(body) != start || BLOCKS.get(body) != blocks {
        return None;
    }
    let head = HEAD.get(body);
    let next_seq = NEXT_SEQ.get(body);
    let count = COUNT.get(body) as usize;
    let mut f = Fields::new(&body[HEADER..]);
    let mut extents = Vec::with_capacity(count.min(1 << 20));
    let mut keys = std::collections::HashSet::new();
    for _ in 0..count {
        let (first, key, extent) = decode_entry(&mut f, start, blocks)?;
        if extent.seq >= next_seq || !keys.insert(key.clone()) {
            return None;
        }
        extents.push((first, key, extent));
    }
    if !f.is_done() || head > blocks {
        return None;
    }
    Some(Parsed {
        head,
        next_seq,
        extents,
    })
}
