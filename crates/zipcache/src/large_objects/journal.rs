//! BT_LO's side of the crash journal: every change to the index — an extent written, a
//! key's extent removed or dropped (FIFO), a touch, a `flush_all` — is appended to a log
//! in tmpfs (`restart/journal.rs`: a checkpoint, then framed records) *before* it is
//! made, so that after a process crash the next open rebuilds BT_LO as it was, with
//! every write the clients were told of (`docs/FORMAT.md`, "The crash journal").
//!
//! Thread: any writer of large objects, under the log's lock (`LargeObjects::log`),
//! which every change to BT_LO holds, so records reach the file in the order the changes
//! are made and a checkpoint taken under it is the state the records add up to. A record
//! comes after the extent it names is written: a write(2) to tmpfs and a device write
//! that returned both outlive the process.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use zipcache_device::BlockDevice;

use super::index_file::{Parsed, decode_entry, decode_meta, encode_meta, parse};
use super::{Extent, LargeObjects, Log};
use crate::format::journal::large::{CLEAR, META, PUT, REMOVE};
use crate::memory::Memory;
use crate::record::Meta;
use crate::restart::journal::{DescriptorLog, Replay, frame};
use crate::restart::sealed_file::Fields;
use crate::restart::shadow::{Shadow, UNLOGGED};

/// The log a BT_LO writes to, and the table that says when it failed.
pub(super) struct LoJournal {
    log: DescriptorLog,
    epoch: u64,
    shadow: Arc<Shadow>,
}

impl LargeObjects {
    /// Starts this run's log at `path`, its checkpoint BT_LO as it stands; a log that
    /// fails later marks `shadow` unlogged (a crash is then cold).
    pub(crate) fn start_journal(
        &mut self,
        path: &Path,
        epoch: u64,
        shadow: Arc<Shadow>,
    ) -> std::io::Result<()> {
        let checkpoint = self.index_body(&self.log.lock(), epoch);
        // may do I/O: the checkpoint written to tmpfs
        let log = DescriptorLog::create(path, epoch, &checkpoint)?;
        self.journal = Some(LoJournal { log, epoch, shadow });
        Ok(())
    }

    /// Appends one record of a change about to be made (the caller holds the log's
    /// lock, `log`). Now and then the file is first replaced by a checkpoint: of the
    /// state before the change, which is what the records so far add up to.
    fn journal(&self, log: &Log, record: impl FnOnce(&mut Vec<u8>)) {
        let Some(journal) = &self.journal else { return };
        let mut payload = Vec::new();
        record(&mut payload);
        let mut framed = Vec::with_capacity(payload.len() + 8);
        frame(&mut framed, &payload);
        // may do I/O: now and then a checkpoint, and a write(2), to tmpfs
        let checkpointed = match journal.log.checkpoint_due() {
            true => journal
                .log
                .checkpoint(journal.epoch, &self.index_body(log, journal.epoch)),
            false => Ok(()),
        };
        if checkpointed
            .and_then(|()| journal.log.append(&framed))
            .is_err()
        {
            journal.shadow.set_flag(UNLOGGED, true);
        }
    }

    /// `extent`, just written, is about to be `key`'s; the head moves to `head`.
    pub(super) fn log_put(&self, log: &Log, head: u64, key: &[u8], extent: &Extent) {
        self.journal(log, |out| {
            out.push(PUT);
            out.extend_from_slice(&head.to_le_bytes());
            self.encode_entry(out, key, extent);
        });
    }

    /// `key`'s extent of sequence `seq` is about to leave BT_LO.
    pub(super) fn log_remove(&self, log: &Log, key: &[u8], seq: u64) {
        self.journal(log, |out| {
            out.push(REMOVE);
            encode_key(out, key);
            out.extend_from_slice(&seq.to_le_bytes());
        });
    }

    /// `key`'s extent of sequence `seq` is about to take `meta`.
    pub(super) fn log_meta(&self, log: &Log, key: &[u8], seq: u64, meta: &Meta) {
        self.journal(log, |out| {
            out.push(META);
            encode_key(out, key);
            out.extend_from_slice(&seq.to_le_bytes());
            encode_meta(out, meta);
        });
    }

    /// Every extent is about to go.
    pub(super) fn log_clear(&self, log: &Log) {
        self.journal(log, |out| out.push(CLEAR));
    }

    /// BT_LO as a crashed run of `epoch` left it: its log's checkpoint with every whole
    /// record applied. `None` if the checkpoint is not this region's or a record is
    /// malformed (then the region starts empty). Every extent is still checked against
    /// its on-device header when it is read.
    pub(crate) fn recover(
        replay: &Replay,
        epoch: u64,
        device: Arc<dyn BlockDevice>,
        start: u64,
        blocks: u64,
        memory: Arc<Memory>,
    ) -> Option<LargeObjects> {
        let Parsed {
            mut head,
            mut next_seq,
            extents,
        } = parse(&replay.checkpoint, epoch, start, blocks)?;
        let mut live: HashMap<Arc<[u8]>, (u64, Extent)> = extents
            .into_iter()
            .map(|(first, key, extent)| (key, (first, extent)))
            .collect();
        for record in &replay.records {
            let (&kind, rest) = record.split_first()?;
            let mut f = Fields::new(rest);
            match kind {
                PUT => {
                    head = f.u64()?;
                    let (first, key, extent) = decode_entry(&mut f, start, blocks)?;
                    next_seq = next_seq.max(extent.seq + 1);
                    live.insert(key, (first, extent));
                }
                REMOVE => {
                    let key = decode_key(&mut f)?;
                    let seq = f.u64()?;
                    if live.get(key).is_some_and(|(_, e)| e.seq == seq) {
                        live.remove(key);
                    }
                }
                META => {
                    let key = decode_key(&mut f)?;
                    let seq = f.u64()?;
                    let meta = decode_meta(&mut f)?;
                    if let Some((_, e)) = live.get_mut(key).filter(|(_, e)| e.seq == seq) {
                        e.meta = meta;
                    }
                }
                CLEAR => {
                    live.clear();
                    head = 0;
                }
                _ => return None,
            }
            if !f.is_done() || head > blocks {
                return None;
            }
        }
        // In the order written, as the log keeps them.
        let mut extents: Vec<(u64, Arc<[u8]>, Extent)> = live
            .into_iter()
            .map(|(key, (first, extent))| (first, key, extent))
            .collect();
        extents.sort_unstable_by_key(|(_, _, e)| e.seq);
        let parsed = Parsed {
            head,
            next_seq,
            extents,
        };
        Some(LargeObjects::rebuilt(parsed, device, start, blocks, memory))
    }
}

fn encode_key(out: &mut Vec<u8>, key: &[u8]) {
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key);
}

fn decode_key<'b>(f: &mut Fields<'b>) -> Option<&'b [u8]> {
    let len = f.u16()? as usize;
    f.bytes(len)
}
