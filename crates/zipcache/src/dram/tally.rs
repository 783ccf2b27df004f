//! What the DRAM tier holds, counted leaf by leaf when `stats` asks.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::DramTier;
use super::leaf::{DramLeaf, LeafState, UNKNOWN};
use super::write_buffer::WriteBuffer;
use crate::record::{Payload, Record, blob_header};

/// What the DRAM tier holds, counted leaf by leaf when asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Live objects, in pages and write buffers.
    pub objects: i64,
    /// Clean objects in pages.
    pub clean: u64,
    /// Key + value bytes of the objects in pages.
    pub raw_bytes: u64,
}

impl DramTier {
    /// How a locked leaf's buffer changes its number of live objects: for each key it
    /// holds, its newest buffered record against the page's.
    pub(super) fn buffered_delta(
        &self,
        leaf: &DramLeaf,
        st: &LeafState,
        buffer: &WriteBuffer,
        now_ms: u64,
    ) -> i32 {
        let mut newest: BTreeMap<&[u8], Record<'_>> = BTreeMap::new();
        for r in buffer.records() {
            newest.insert(r.key, r);
        }
        let live = |r: &Record<'_>| match r.payload {
            Payload::Tombstone => false,
            Payload::Inline(_) => !r.meta.expired(now_ms),
            Payload::Medium(slot) => st
                .blobs()
                .get(slot as usize)
                .and_then(Option::as_deref)
                .and_then(blob_header)
                .is_some_and(|(meta, _)| !meta.expired(now_ms)),
        };
        newest
            .into_iter()
            .map(|(key, r)| {
                let was = self.with_page_record(leaf, st, key, |p| p.is_some_and(|p| live(&p)));
                i32::from(live(&r)) - i32::from(was.unwrap_or(false))
            })
            .sum()
    }

    /// What the tier holds: each leaf's page summary, and its buffer's delta, worked out
    /// for the leaves written since they were last asked.
    pub fn tally(&self, now_ms: u64) -> Tally {
        let view = self.view();
        let mut tally = Tally::default();
        for id in self.leaves() {
            let Some(leaf) = view.get(id.0) else { continue };
            let st = leaf.state.read();
            let summary = st.summary();
            tally.objects += summary.objects as i64;
            tally.clean += summary.clean;
            tally.raw_bytes += summary.raw_bytes;
            if let Some(extras) = &st.extras {
                let delta = match extras.buffered.load(Ordering::Relaxed) {
                    UNKNOWN => {
                        let delta = self.buffered_delta(leaf, &st, &extras.buffer, now_ms);
                        extras.buffered.store(delta, Ordering::Relaxed);
                        delta
                    }
                    known => known,
                };
                tally.objects += i64::from(delta);
            }
        }
        tally
    }
}
