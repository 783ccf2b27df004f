//! BT_SSD's side of the crash journal (`restart/journal.rs`, `restart/shadow.rs`): every
//! descriptor a writer changes is logged, and only then are the keys it wrote down let
//! out of the shadow table; a GET or scan never serves a flash version the table hides.
//!
//! Thread: `log_upsert`, `log_remove` and `publish` run on BT_SSD's writer (under the
//! writer lock, so records reach the log in the order the changes were made);
//! `written_down` on the same thread, still under the evicted DRAM leaves' locks;
//! `hidden` on GETs' and scans'.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::reclaim::Writer;
use super::{SlState, SsdTier};
use crate::eviction::EvictedObject;
use crate::format::journal::{REMOVE, UPSERT};
use crate::restart::journal::{DescriptorLog, frame};
use crate::restart::shadow::{Shadow, UNLOGGED};

/// The journal a tier writes to: the shadow table always (it may hide flash versions a
/// restart carried over), the descriptor log where crash recovery is on.
pub(super) struct Journaling {
    shadow: Arc<Shadow>,
    log: Option<DescriptorLog>,
    epoch: u64,
}

impl SsdTier {
    /// Starts this run's journal: `shadow`, and with `log_at` a descriptor log there
    /// whose checkpoint is the tier as it stands (before any write of the run).
    pub(crate) fn start_journal(
        &mut self,
        shadow: Arc<Shadow>,
        log_at: Option<&Path>,
        epoch: u64,
    ) -> std::io::Result<()> {
        let log = match log_at {
            // may do I/O: the checkpoint written to tmpfs
            Some(path) => Some(DescriptorLog::create(
                path,
                epoch,
                &self.index_body(&self.writer.lock(), epoch),
            )?),
            None => None,
        };
        self.journal = Some(Journaling { shadow, log, epoch });
        Ok(())
    }

    fn logging(&self) -> Option<&DescriptorLog> {
        self.journal.as_ref()?.log.as_ref()
    }

    /// Notes `st`, just changed, for the log (`publish` appends it).
    pub(super) fn log_upsert(&self, w: &mut Writer, st: &SlState) {
        if self.logging().is_none() {
            return;
        }
        let mut record = vec![UPSERT];
        record.extend_from_slice(&w.next_slot.to_le_bytes());
        self.encode_descriptor(&mut record, st);
        frame(&mut w.log, &record);
    }

    /// Notes that the descriptor whose low fence is `low` is gone.
    pub(super) fn log_remove(&self, w: &mut Writer, low: &[u8]) {
        if self.logging().is_none() {
            return;
        }
        let mut record = vec![REMOVE];
        record.extend_from_slice(&(low.len() as u16).to_le_bytes());
        record.extend_from_slice(low);
        frame(&mut w.log, &record);
    }

    /// Appends what the writer noted (one `write(2)`), and replaces the log by a
    /// checkpoint when it has grown enough. Called at the end of every writer's turn,
    /// before it lets any key out of the shadow table. A log that cannot be written no
    /// longer describes the tier: the table is marked incomplete, so a crash starts cold.
    pub(super) fn publish(&self, w: &mut Writer) {
        let Some(journal) = &self.journal else { return };
        let Some(log) = &journal.log else { return };
        // may do I/O: a write(2) to tmpfs, and now and then a checkpoint
        let written = log.append(&w.log).and_then(|()| {
            if log.checkpoint_due() {
                log.checkpoint(journal.epoch, &self.index_body(w, journal.epoch))
            } else {
                Ok(())
            }
        });
        w.log.clear();
        if written.is_err() {
            journal.shadow.set_flag(UNLOGGED, true);
        }
    }

    /// The dirty objects of an eviction are on flash now (or their older flash versions
    /// are gone): their keys leave the shadow table. Called after `publish`.
    pub(super) fn written_down(&self, dirty: &[&EvictedObject]) {
        if let Some(journal) = &self.journal {
            for o in dirty {
                journal.shadow.clear(&o.key);
            }
        }
    }

    /// Whether `key`'s flash version must not be served: DRAM may hold a newer state of
    /// it, or a crash lost one. Counted when it hides a version found.
    pub(super) fn hidden(&self, key: &[u8]) -> bool {
        let hidden = self
            .journal
            .as_ref()
            .is_some_and(|j| j.shadow.contains(key));
        if hidden {
            self.counters.hidden.fetch_add(1, Ordering::Relaxed);
        }
        hidden
    }
}
