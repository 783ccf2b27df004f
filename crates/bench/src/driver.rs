//! The load loops: fill (insert every key once) and look-aside (GET, on a miss wait for the
//! backend and PUT), over `--threads` threads, with warm-up excluded from what is measured.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::targets::{Client, Reply, Request, Snapshot, Target};
use crate::trace::Trace;
use crate::values::{ValueGen, mix64};
use crate::workload::{KeyChooser, OpKind, OpMix, key_bytes};

/// Set by Ctrl-C: every load loop stops at its next batch.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Everything a run needs to generate requests.
pub struct Workload {
    pub keys: u64,
    pub key_size: usize,
    pub chooser: KeyChooser,
    pub values: ValueGen,
    pub mix: OpMix,
    pub scan_limit: usize,
    pub threads: usize,
    /// Measured operations (all threads); `None` = until `duration`.
    pub ops: Option<u64>,
    /// Measured wall time; always set, so no run is unbounded.
    pub duration: Duration,
    pub warmup_ops: u64,
    pub backend_latency: Duration,
    pub seed: u64,
    /// A real trace to replay instead of `chooser` and `mix`: key ids are its dense ids.
    pub trace: Option<Arc<Trace>>,
    /// Next request of `trace`, shared by the threads (reset for every target).
    pub trace_cursor: AtomicU64,
}

impl Workload {
    /// The key bytes of key id `id`.
    pub fn key(&self, id: u64) -> Vec<u8> {
        match &self.trace {
            Some(trace) => trace.key(id),
            None => key_bytes(id, self.key_size),
        }
    }

    /// The next request: the trace's next one, or a draw of the locality and the mix.
    fn next_request(&self, rng: &mut SmallRng) -> (u64, OpKind) {
        match &self.trace {
            Some(trace) => {
                // Threads take requests in trace order; the op counts keep the cursor
                // within the trace, the modulo only guards.
                let i = self.trace_cursor.fetch_add(1, Relaxed) % trace.len();
                let request = trace.requests[i as usize];
                (request.key as u64, request.op.kind())
            }
            None => (self.chooser.next_id(rng), self.mix.next(rng)),
        }
    }
}

/// What the bench itself counted in the measured phase.
#[derive(Clone, Debug)]
pub struct Counts {
    pub ops: u64,
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    pub puts: u64,
    pub deletes: u64,
    pub scans: u64,
    pub unsupported: u64,
    pub errors: u64,
    pub wrong_values: u64,
    pub first_error: Option<String>,
    /// GET latency in nanoseconds.
    pub get_latency: Histogram<u64>,
}

impl Counts {
    fn new() -> Counts {
        Counts {
            ops: 0,
            gets: 0,
            hits: 0,
            misses: 0,
            puts: 0,
            deletes: 0,
            scans: 0,
            unsupported: 0,
            errors: 0,
            wrong_values: 0,
            first_error: None,
            get_latency: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
        }
    }

    fn merge(&mut self, other: &Counts) {
        self.ops += other.ops;
        self.gets += other.gets;
        self.hits += other.hits;
        self.misses += other.misses;
        self.puts += other.puts;
        self.deletes += other.deletes;
        self.scans += other.scans;
        self.unsupported += other.unsupported;
        self.errors += other.errors;
        self.wrong_values += other.wrong_values;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        self.get_latency
            .add(&other.get_latency)
            .expect("same histogram bounds");
    }

    fn error(&mut self, message: String) {
        self.errors += 1;
        self.first_error.get_or_insert(message);
    }
}

/// A finished run: bench counts, target snapshots around the measured phase, wall time.
pub struct Run {
    pub counts: Counts,
    pub before: Snapshot,
    pub after: Snapshot,
    pub elapsed: Duration,
    /// CPU seconds of the bench process (client threads, and the engine if in-process).
    pub bench_cpu_seconds: Option<f64>,
    /// Keys found by probing `0..keys` after a fill, for targets that keep no count.
    pub probed_resident: Option<u64>,
}

/// One thread's share of `total`.
fn share(total: u64, threads: usize, thread: usize) -> u64 {
    total / threads as u64 + u64::from((thread as u64) < total % threads as u64)
}

fn own_cpu() -> Option<f64> {
    crate::procfs::cpu_seconds(std::process::id())
}

/// Inserts keys `0..keys` once each (thread `t` takes a contiguous slice), then snapshots.
pub fn fill(target: &dyn Target, w: &Workload, progress: &ProgressBar) -> Result<Run, String> {
    let before = target.snapshot()?;
    let cpu = own_cpu();
    let start = Instant::now();
    let deadline = start + w.duration;
    let totals = Mutex::new(Counts::new());
    std::thread::scope(|s| -> Result<(), String> {
        let handles: Vec<_> = (0..w.threads)
            .map(|t| {
                let totals = &totals;
                s.spawn(move || -> Result<(), String> {
                    let mut client = target.client()?;
                    let first: u64 = (0..t).map(|i| share(w.keys, w.threads, i)).sum();
                    let ids = first..first + share(w.keys, w.threads, t);
                    let counts = fill_ids(client.as_mut(), w, ids, deadline, progress)?;
                    totals.lock().expect("counts lock").merge(&counts);
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().map_err(|_| "a fill thread panicked".to_string())?)
    })?;
    let elapsed = start.elapsed();
    let bench_cpu_seconds = own_cpu().zip(cpu).map(|(a, b)| a - b);
    let after = target.snapshot()?;
    let probed_resident = if target.probe_resident() {
        Some(count_resident(target, w)?)
    } else {
        None
    };
    Ok(Run {
        counts: totals.into_inner().expect("counts lock"),
        before,
        after,
        elapsed,
        bench_cpu_seconds,
        probed_resident,
    })
}

fn fill_ids(
    client: &mut dyn Client,
    w: &Workload,
    ids: std::ops::Range<u64>,
    deadline: Instant,
    progress: &ProgressBar,
) -> Result<Counts, String> {
    let mut counts = Counts::new();
    let mut requests = Vec::new();
    let mut replies = Vec::new();
    let batch = client.batch_size() as u64;
    let mut next = ids.start;
    while next < ids.end && !STOP.load(Relaxed) && Instant::now() < deadline {
        let end = (next + batch).min(ids.end);
        requests.clear();
        requests.extend((next..end).map(|id| Request::Put(w.key(id), w.values.value(id, 0))));
        replies.clear();
        client.execute(&requests, &mut replies)?;
        for (reply, _) in &replies {
            match reply {
                Reply::Stored => counts.puts += 1,
                other => counts.error(format!("{other:?}")),
            }
        }
        counts.ops += end - next;
        progress.inc(end - next);
        next = end;
    }
    Ok(counts)
}

/// How many of keys `0..keys` a GET finds (each found value verified).
fn count_resident(target: &dyn Target, w: &Workload) -> Result<u64, String> {
    let mut client = target.client()?;
    let batch = client.batch_size() as u64;
    let mut found = 0;
    let mut requests = Vec::new();
    let mut replies = Vec::new();
    let mut next = 0;
    while next < w.keys && !STOP.load(Relaxed) {
        let end = (next + batch).min(w.keys);
        requests.clear();
        requests.extend((next..end).map(|id| Request::Get(w.key(id))));
        replies.clear();
        client.execute(&requests, &mut replies)?;
        found += replies
            .iter()
            .zip(next..end)
            .filter(|((reply, _), id)| {
                matches!(reply, Reply::Value(Some(v)) if w.values.verify(*id, v))
            })
            .count() as u64;
        next = end;
    }
    Ok(found)
}

/// The cachebench look-aside loop. Warm-up runs first on every thread; the target is
/// snapshotted between warm-up and the measured phase, so figures exclude warm-up.
pub fn lookaside(target: &dyn Target, w: &Workload, progress: &ProgressBar) -> Result<Run, String> {
    // Every target replays a trace from its first request.
    w.trace_cursor.store(0, Relaxed);
    let warmed = Barrier::new(w.threads + 1);
    let go = Barrier::new(w.threads + 1);
    let totals = Mutex::new(Counts::new());
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let mut before = Snapshot::default();
    let mut window = (Instant::now(), None);
    std::thread::scope(|s| -> Result<(), String> {
        for t in 0..w.threads {
            let (warmed, go, totals, failure) = (&warmed, &go, &totals, &failure);
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(w.seed ^ mix64(t as u64 + 1));
                let mut client = target.client();
                let mut slots = vec![
                    Slot {
                        ready_at: Instant::now(),
                        fill: None,
                    };
                    client.as_ref().map_or(1, |c| c.batch_size())
                ];
                let warmup = Phase {
                    ops: Some(share(w.warmup_ops, w.threads, t)),
                    deadline: Instant::now() + w.duration,
                    progress: None,
                };
                let warm = match &mut client {
                    Ok(client) => run_phase(client.as_mut(), w, &mut rng, &mut slots, &warmup),
                    Err(e) => Err(e.clone()),
                };
                // Every thread reaches both barriers, failed or not, so none waits forever.
                warmed.wait();
                go.wait();
                let measured = Phase {
                    ops: w.ops.map(|ops| share(ops, w.threads, t)),
                    deadline: Instant::now() + w.duration,
                    progress: Some(progress),
                };
                let result = warm.and_then(|_| {
                    let client = client.as_mut().map_err(|e| e.clone())?;
                    run_phase(client.as_mut(), w, &mut rng, &mut slots, &measured)
                });
                match result {
                    Ok(counts) => totals.lock().expect("counts lock").merge(&counts),
                    Err(e) => {
                        failure.lock().expect("failure lock").get_or_insert(e);
                    }
                }
            });
        }
        warmed.wait();
        let snapshot = target.snapshot();
        window = (Instant::now(), own_cpu());
        go.wait();
        before = snapshot?;
        Ok(())
    })?;
    if let Some(e) = failure.into_inner().expect("failure lock") {
        return Err(e);
    }
    let elapsed = window.0.elapsed();
    let bench_cpu_seconds = own_cpu().zip(window.1).map(|(a, b)| a - b);
    Ok(Run {
        counts: totals.into_inner().expect("counts lock"),
        before,
        after: target.snapshot()?,
        elapsed,
        bench_cpu_seconds,
        probed_resident: None,
    })
}

/// A stretch of the loop: until `ops` are done or `deadline` passes.
struct Phase<'a> {
    ops: Option<u64>,
    deadline: Instant,
    /// Only the measured phase records latency and moves the progress bar.
    progress: Option<&'a ProgressBar>,
}

/// A virtual client of a thread's batch: after a miss it waits for the backend (without
/// holding up the others), then PUTs the value it fetched, then goes on.
#[derive(Clone)]
struct Slot {
    ready_at: Instant,
    /// Key id whose backend value this client PUTs next.
    fill: Option<u64>,
}

fn run_phase(
    client: &mut dyn Client,
    w: &Workload,
    rng: &mut SmallRng,
    slots: &mut [Slot],
    phase: &Phase,
) -> Result<Counts, String> {
    let mut counts = Counts::new();
    // Per request of the batch: its slot, key id, and whether it is a fill.
    let (mut requests, mut meta, mut replies) = (Vec::new(), Vec::new(), Vec::new());
    while !STOP.load(Relaxed) && Instant::now() < phase.deadline {
        let remaining = phase.ops.map_or(u64::MAX, |ops| ops - counts.ops);
        if remaining == 0 {
            break;
        }
        let now = Instant::now();
        let ready: Vec<usize> = (0..slots.len())
            .filter(|s| slots[*s].ready_at <= now)
            .take(remaining.min(slots.len() as u64) as usize)
            .collect();
        if ready.is_empty() {
            let next = slots.iter().map(|s| s.ready_at).min().unwrap_or(now);
            let until = next.min(phase.deadline);
            std::thread::sleep(until.saturating_duration_since(now));
            continue;
        }
        requests.clear();
        meta.clear();
        for &slot in &ready {
            if let Some(id) = slots[slot].fill.take() {
                // The backend holds version 0; the cache is filled from it.
                requests.push(Request::Put(w.key(id), w.values.value(id, 0)));
                meta.push((slot, id, true));
            }
            let (id, op) = w.next_request(rng);
            let key = w.key(id);
            requests.push(match op {
                OpKind::Get => Request::Get(key),
                OpKind::Put => Request::Put(key, w.values.value(id, rand::Rng::random(rng))),
                OpKind::Delete => Request::Delete(key),
                OpKind::Scan => Request::Scan(key, w.scan_limit),
            });
            meta.push((slot, id, false));
        }
        replies.clear();
        client.execute(&requests, &mut replies)?;
        let done = Instant::now();
        for ((request, (reply, latency)), &(slot, id, is_fill)) in
            requests.iter().zip(&replies).zip(&meta)
        {
            match (request, reply) {
                (_, Reply::Stored) if is_fill => {}
                (_, other) if is_fill => counts.error(format!("fill: {other:?}")),
                (Request::Get(_), Reply::Value(value)) => {
                    counts.gets += 1;
                    if phase.progress.is_some() {
                        let ns = latency.as_nanos().clamp(1, 60_000_000_000) as u64;
                        counts.get_latency.saturating_record(ns);
                    }
                    match value {
                        Some(v) => {
                            counts.hits += 1;
                            if !w.values.verify(id, v) {
                                counts.wrong_values += 1;
                            }
                        }
                        None => {
                            counts.misses += 1;
                            slots[slot].fill = Some(id);
                            slots[slot].ready_at = done + w.backend_latency;
                        }
                    }
                }
                (Request::Put(..), Reply::Stored) => counts.puts += 1,
                (Request::Delete(_), Reply::Deleted(_)) => counts.deletes += 1,
                (Request::Scan(..), Reply::Scanned(_)) => counts.scans += 1,
                (_, Reply::Unsupported) => counts.unsupported += 1,
                (_, other) => counts.error(format!("{other:?}")),
            }
        }
        counts.ops += ready.len() as u64;
        if let Some(progress) = phase.progress {
            progress.inc(ready.len() as u64);
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up() {
        for (total, threads) in [(10u64, 3usize), (0, 2), (7, 7), (1_000_001, 4)] {
            let sum: u64 = (0..threads).map(|t| share(total, threads, t)).sum();
            assert_eq!(sum, total);
        }
    }
}
