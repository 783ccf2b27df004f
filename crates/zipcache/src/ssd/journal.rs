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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use zipcache_device::{BlockDevice, MemDevice};

    use super::super::dictionary::BlockDictionaries;
    use super::super::index_file::Opening;
    use super::super::test_support::*;
    use super::*;
    use crate::config::SystemClock;
    use crate::eviction::EvictionSink;
    use crate::memory::Memory;
    use crate::record::Meta;
    use crate::restart::shadow::fingerprint;

    const KEYS: u32 = 400;

    fn value(i: u32, version: u64) -> Vec<u8> {
        let mut v = format!("{i}:{version}|").into_bytes();
        v.resize(100, b'.');
        v
    }

    fn version_of(i: u32, v: &[u8]) -> u64 {
        let head = std::str::from_utf8(&v[..v.iter().position(|&b| b == b'|').unwrap()]);
        let (k, version) = head.unwrap().split_once(':').unwrap();
        assert_eq!(k, i.to_string(), "key {i} read another key's value");
        version.parse().unwrap()
    }

    /// A run of the tier: its log at `path` for `epoch`, `carried` hidden.
    fn run(ssd: &mut SsdTier, path: &Path, epoch: u64, carried: &[u64]) -> Arc<Shadow> {
        let shadow = Arc::new(Shadow::in_memory(256, carried));
        ssd.start_journal(shadow.clone(), Some(path), epoch)
            .unwrap();
        shadow
    }

    /// Records that sit in a block of a super-leaf whose range does not hold their key:
    /// a later widening of the range would serve them.
    fn foreign_records(ssd: &SsdTier) -> Vec<String> {
        let mut out = Vec::new();
        ssd.tree.for_each_leaf(|_, leaf| {
            let st = leaf.state.read();
            let subpages: Vec<usize> = (0..st.counts.len()).collect();
            for contents in ssd.contents_of(&st, &subpages).into_iter().flatten() {
                out.extend(contents.keys().filter(|k| !st.range.owns(k)).map(|k| {
                    let shown = |f: &[u8]| String::from_utf8_lossy(f).into_owned();
                    let high = st.range.high.as_deref().map(shown);
                    format!(
                        "{} in a block of [{}, {high:?})",
                        shown(k),
                        shown(&st.range.low)
                    )
                }));
            }
        });
        out
    }

    /// A crash in a writer's turn keeps every block the turn wrote and loses what the
    /// turn had not appended to the log yet (its last `write(2)`); the keys it evicted
    /// stay hidden. Turns here evict super-leaves to make room (the tier has six slots),
    /// so the replay may bring back a super-leaf that the turn took away, whose range
    /// went to its left neighbour and whose slot to another: whatever any restart
    /// brings back, no block holds a record outside its super-leaf's range, and every
    /// key reads a miss or its newest version, never an older or deleted one.
    #[test]
    fn a_crash_in_a_turn_that_evicted_super_leaves_brings_back_no_older_version() {
        let dir = std::env::temp_dir().join(format!("zc-ssd-turn-crash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log");
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 6));
        let mut ssd = tier_on(device.clone(), settings(6));
        let mut epoch = 1;
        let mut shadow = run(&mut ssd, &path, epoch, &[]);
        // Each key's newest version; `None` once deleted.
        let mut newest: HashMap<u32, Option<u64>> = HashMap::new();
        let seed = std::env::var("ZIPCACHE_TURN_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x7ac0_5eed);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut version = 0u64;
        let (mut crashes, mut evicted, mut stale) = (0, 0, Vec::new());
        let check = |ssd: &SsdTier, newest: &HashMap<u32, Option<u64>>, i: u32| {
            let read = ssd.get(&key(i), 0)?;
            let got = version_of(i, &read.value);
            let want = newest.get(&i).copied().flatten();
            (Some(got) != want).then(|| format!("key {i} read version {got}, newest {want:?}"))
        };
        for step in 0..3000 {
            // One DRAM leaf's batch: keys of a narrow range, marked as DRAM marks them.
            let low = rng.random_range(0..KEYS - 40);
            let keys: BTreeSet<u32> = (0..rng.random_range(1..30))
                .map(|_| low + rng.random_range(0..40))
                .collect();
            let batch = keys
                .iter()
                .map(|&i| {
                    version += 1;
                    // Now and then a delete (a tombstone).
                    let written = rng.random_bool(0.8).then_some(version);
                    newest.insert(i, written);
                    shadow.mark(&key(i));
                    EvictedObject {
                        key: key(i),
                        value: written.map(|v| value(i, v)),
                        meta: Meta::default(),
                    }
                })
                .collect();
            assert!(ssd.absorb(&[], None, batch));
            // Reads mark super-leaves referenced, as CLOCK sees them.
            for _ in 0..4 {
                stale.extend(check(&ssd, &newest, rng.random_range(0..KEYS)));
            }
            let before_last = ssd.logging().unwrap().len_before_last_append();
            let Some(len) = before_last.filter(|_| rng.random_bool(0.2)) else {
                continue;
            };
            // The crash: the turn's last append never happened, so its keys kept
            // their marks.
            crashes += 1;
            let log = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            log.set_len(len).unwrap();
            let mut carried = shadow.fingerprints();
            carried.extend(keys.iter().map(|&i| fingerprint(&key(i))));
            let replay = DescriptorLog::replay(&path, epoch).unwrap();
            let memory = Arc::new(Memory::default());
            let opening = Opening {
                device: device.clone(),
                settings: settings(6),
                memory: memory.clone(),
                clock: Arc::new(SystemClock),
                dictionaries: Arc::new(BlockDictionaries::open(None, None, memory)),
            };
            evicted += ssd.counters.evicted_superleaves.load(Ordering::Relaxed);
            ssd = SsdTier::recover(&replay, epoch, opening).expect("the log replays");
            let foreign = foreign_records(&ssd);
            assert!(foreign.is_empty(), "step {step}: {foreign:?}");
            epoch += 1;
            shadow = run(&mut ssd, &path, epoch, &carried);
            for i in 0..KEYS {
                stale.extend(check(&ssd, &newest, i).map(|e| format!("step {step}: {e}")));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(crashes > 100, "{crashes} crashes");
        assert!(evicted > 100, "{evicted} super-leaves evicted");
        assert!(stale.is_empty(), "{} stale reads: {stale:#?}", stale.len());
    }
}
