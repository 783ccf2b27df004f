//! The sweep (`--cluster-mode on`): a thread of its own that walks every stored key once
//! slots changed hands and deletes those a slot's new generation left behind
//! (`core/keyspace.rs`). They are unreachable from the moment the generation moved, so
//! the sweep only gives their room back sooner than eviction would; it is counted
//! (`cluster_slot_keys_dropped`) and paced (a pause per batch) so that serving keeps the
//! cores. A sweep cut short by a restart is not resumed: what it left is never read, and
//! goes as the coldest objects go.
//!
//! It holds the engine weakly: closing the engine at shutdown never waits for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use zipcache::ZipCache;

use super::keyspace::{Generations, Keyspace};

/// Stored keys one step of the sweep examines, and the pause after it.
const BATCH: usize = 256;
const PAUSE: Duration = Duration::from_millis(1);

#[derive(Debug, Default)]
pub struct Sweep {
    state: Mutex<State>,
    woken: Condvar,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Slots changed hands since the last sweep began.
    pending: bool,
    sweeping: bool,
    stop: bool,
    thread: Option<JoinHandle<()>>,
}

impl Sweep {
    /// Slots changed hands: a sweep runs (again, once the one under way ends).
    pub fn wake(&self) {
        self.state.lock().pending = true;
        self.woken.notify_all();
    }

    /// Keys dropped so far, and whether a sweep is under way or due.
    pub fn progress(&self) -> (u64, bool) {
        let state = self.state.lock();
        (
            self.dropped.load(Ordering::Relaxed),
            state.sweeping || state.pending,
        )
    }

    pub fn start(self: &Arc<Self>, keys: &Keyspace) {
        let mut state = self.state.lock();
        if state.thread.is_some() {
            return;
        }
        let (sweep, engine) = (self.clone(), Arc::downgrade(keys.engine()));
        let generations = keys.generations();
        let spawned = std::thread::Builder::new()
            .name("zipcache-sweep".into())
            .spawn(move || sweep.run(engine, generations));
        match spawned {
            Ok(thread) => state.thread = Some(thread),
            Err(e) => eprintln!("zipcache: no thread to sweep moved slots' keys: {e}"),
        }
    }

    pub fn stop(&self) {
        let thread = {
            let mut state = self.state.lock();
            state.stop = true;
            state.thread.take()
        };
        self.woken.notify_all();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    /// Thread `zipcache-sweep`: waits for a wake, sweeps, until stopped.
    fn run(&self, engine: Weak<ZipCache>, generations: Arc<Generations>) {
        loop {
            {
                let mut state = self.state.lock();
                while !state.pending && !state.stop {
                    self.woken.wait(&mut state);
                }
                if state.stop {
                    return;
                }
                state.pending = false;
                state.sweeping = true;
            }
            let finished = self.sweep_once(&engine, &generations);
            self.state.lock().sweeping = false;
            if let Err(e) = finished {
                eprintln!("zipcache: the sweep of moved slots' keys stopped: {e}");
            }
        }
    }

    /// One walk of every stored key, deleting left-overs; ends early when stopped or
    /// when the engine is gone.
    fn sweep_once(
        &self,
        engine: &Weak<ZipCache>,
        generations: &Arc<Generations>,
    ) -> zipcache::Result<()> {
        let mut after: Option<Vec<u8>> = None;
        loop {
            if self.state.lock().stop {
                return Ok(());
            }
            let Some(engine) = engine.upgrade() else {
                return Ok(());
            };
            let keys = Keyspace::new(engine, generations.clone());
            let start = after
                .as_deref()
                .map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            let batch = keys
                .engine()
                .scan_keys::<&[u8]>((start, std::ops::Bound::Unbounded), BATCH)?;
            for (stored, _) in &batch {
                // may do I/O: a delete of a key only the SSD tier holds reads its block
                if keys.left_over(stored) && keys.engine().delete(stored)? {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            if batch.len() < BATCH {
                return Ok(());
            }
            after = batch.into_iter().last().map(|(stored, _)| stored);
            drop(keys);
            std::thread::sleep(PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::slot::key_slot;
    use zipcache::{GetOptions, PutOptions};

    /// After a slot's generation moves, the sweep deletes its stored keys — and only
    /// those — and counts them; the engine can close while the thread waits.
    #[test]
    fn the_sweep_drops_what_moved_slots_left_and_nothing_else() {
        let engine = Arc::new(
            ZipCache::open(zipcache::Config {
                dram_capacity: 8 << 20,
                ..zipcache::Config::default()
            })
            .unwrap(),
        );
        let generations = Arc::new(Generations::default());
        let keys = Keyspace::new(engine.clone(), generations.clone());
        let tagged = |tag: &str, i: u32| format!("{{{tag}}}{i}").into_bytes();
        for i in 0..2_000 {
            keys.put_with(&tagged("a", i), b"v", PutOptions::default())
                .unwrap();
            keys.put_with(&tagged("b", i), b"v", PutOptions::default())
                .unwrap();
        }
        let sweep = Arc::new(Sweep::default());
        sweep.start(&keys);
        generations.bump(key_slot(b"a"));
        sweep.wake();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while sweep.progress() != (2_000, false) {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                sweep.progress()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(engine.stats().objects_resident, 2_000);
        for i in 0..2_000 {
            let b = keys.get_item(&tagged("b", i), GetOptions::default());
            assert!(b.unwrap().is_some(), "{{b}}{i} kept");
        }
        drop(keys);
        sweep.stop();
        assert_eq!(Arc::strong_count(&engine), 1, "the sweep holds no engine");
    }
}
