//! The load loops: fill (insert every key once) and look-aside (GET, on a miss wait for the
//! backend and PUT), over `--threads` threads, with warm-up excluded from what is measured.
//! The look-aside loop is closed (a virtual client sends on a reply) or, with `--rate`,
//! open: requests arrive on a Poisson schedule and latency counts from each one's arrival.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp};

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
    /// Open loop: requests per second offered (all threads together), Poisson arrivals;
    /// `None` = closed loop (every virtual client sends its next request on a reply).
    pub rate: Option<f64>,
    /// A fill reads every key back once after its figures are taken (`--read-back`).
    pub read_back: bool,
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

    /// The next request of the workload and its key id.
    fn draw(&self, rng: &mut SmallRng) -> (u64, Request) {
        let (id, op) = self.next_request(rng);
        let key = self.key(id);
        let request = match op {
            OpKind::Get => Request::Get(key),
            OpKind::Put => Request::Put(key, self.values.value(id, rand::Rng::random(rng))),
            OpKind::Delete => Request::Delete(key),
            OpKind::Scan => Request::Scan(key, self.scan_limit),
        };
        (id, request)
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
    /// Key and value bytes of the PUTs stored, look-aside fills included: what the bytes
    /// a cache wrote to flash are set against.
    pub put_bytes: u64,
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
    pub(crate) fn new() -> Counts {
        Counts {
            ops: 0,
            gets: 0,
            hits: 0,
            misses: 0,
            puts: 0,
            put_bytes: 0,
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
        self.put_bytes += other.put_bytes;
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

    /// Counts the reply to `request` (key id `id`; `is_fill` if it is the PUT after a miss),
    /// recording `latency` for a GET if given; returns whether it was a GET that missed, so
    /// the caller fetches from the backend and fills.
    fn tally(
        &mut self,
        w: &Workload,
        request: &Request,
        reply: &Reply,
        id: u64,
        is_fill: bool,
        latency: Option<Duration>,
    ) -> bool {
        if let (Request::Put(key, value), Reply::Stored) = (request, reply) {
            self.put_bytes += (key.len() + value.len()) as u64;
        }
        match (request, reply) {
            (_, Reply::Stored) if is_fill => {}
            (_, other) if is_fill => self.error(format!("fill: {other:?}")),
            (Request::Get(_), Reply::Value(value)) => {
                self.gets += 1;
                if let Some(latency) = latency {
                    let ns = latency.as_nanos().clamp(1, 60_000_000_000) as u64;
                    self.get_latency.saturating_record(ns);
                }
                match value {
                    Some(v) => {
                        self.hits += 1;
                        if !w.values.verify(id, v) {
                            self.wrong_values += 1;
                        }
                    }
                    None => {
                        self.misses += 1;
                        return true;
                    }
                }
            }
            (Request::Put(..), Reply::Stored) => self.puts += 1,
            (Request::Delete(_), Reply::Deleted(_)) => self.deletes += 1,
            (Request::Scan(..), Reply::Scanned(_)) => self.scans += 1,
            (_, Reply::Unsupported) => self.unsupported += 1,
            (_, other) => self.error(format!("{other:?}")),
        }
        false
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
    /// A fill's keys read back after its figures were taken (`--read-back`).
    pub read_back: Option<ReadBack>,
}

/// Every key of a fill read once (GET, verified), after the fill's figures were taken:
/// what a GET of what the fill left costs the server.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReadBack {
    pub gets: u64,
    /// GETs that found their key's value.
    pub found: u64,
    pub wrong_values: u64,
    pub elapsed_s: f64,
    /// The server's CPU seconds meanwhile (and the background work the GETs left, as a
    /// fill's count): a target whose server the bench knows.
    pub server_cpu_seconds: Option<f64>,
}

/// One thread's share of `total`.
fn share(total: u64, threads: usize, thread: usize) -> u64 {
    total / threads as u64 + u64::from((thread as u64) < total % threads as u64)
}

fn own_cpu() -> Option<f64> {
    crate::procfs::cpu_seconds(std::process::id())
}

/// Longest a fill waits for the cache's process to go idle before its figures are taken.
const FILL_IDLE_LIMIT: Duration = Duration::from_secs(60);

/// Runs `run` on `w.threads` threads at once, each with a client of its own and its
/// contiguous slice of keys `0..keys` (thread `t` the `t`-th): each thread's result.
fn by_slices<T: Send>(
    target: &dyn Target,
    w: &Workload,
    run: impl Fn(&mut dyn Client, std::ops::Range<u64>) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..w.threads)
            .map(|t| {
                let run = &run;
                s.spawn(move || -> Result<T, String> {
                    let mut client = target.client()?;
                    let first: u64 = (0..t).map(|i| share(w.keys, w.threads, i)).sum();
                    run(client.as_mut(), first..first + share(w.keys, w.threads, t))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| "a bench thread panicked".to_string())?
            })
            .collect()
    })
}

/// Inserts keys `0..keys` once each (thread `t` takes a contiguous slice), waits for the
/// cache's process to go idle, then snapshots.
pub fn fill(target: &dyn Target, w: &Workload, progress: &ProgressBar) -> Result<Run, String> {
    let before = target.snapshot()?;
    let cpu = own_cpu();
    let start = Instant::now();
    let deadline = start + w.duration;
    let mut counts = Counts::new();
    for slice in by_slices(target, w, |client, ids| {
        fill_ids(client, w, ids, deadline, progress)
    })? {
        counts.merge(&slice);
    }
    let elapsed = start.elapsed();
    // CPU per SET counts what the fill left to do in the background (merges, evictions
    // to flash), not only what its requests did before they were answered.
    if let Some(pid) = target.cache_pid() {
        crate::procfs::wait_idle(pid, FILL_IDLE_LIMIT);
    }
    let bench_cpu_seconds = own_cpu().zip(cpu).map(|(a, b)| a - b);
    let after = target.snapshot()?;
    let read = if w.read_back || target.probe_resident() {
        Some(read_back(target, w)?)
    } else {
        None
    };
    Ok(Run {
        counts,
        before,
        after,
        elapsed,
        bench_cpu_seconds,
        probed_resident: read
            .as_ref()
            .filter(|_| target.probe_resident())
            .map(|r| r.found),
        read_back: read.filter(|_| w.read_back),
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
        for (request, (reply, _)) in requests.iter().zip(&replies) {
            match (request, reply) {
                (Request::Put(key, value), Reply::Stored) => {
                    counts.puts += 1;
                    counts.put_bytes += (key.len() + value.len()) as u64;
                }
                (_, other) => counts.error(format!("{other:?}")),
            }
        }
        counts.ops += end - next;
        progress.inc(end - next);
        next = end;
    }
    Ok(counts)
}

/// Reads keys `0..keys` once each (thread `t` takes the slice it filled), each value
/// found verified, then waits for the cache's process to go idle, as a fill does.
fn read_back(target: &dyn Target, w: &Workload) -> Result<ReadBack, String> {
    let before = target.snapshot()?.server_cpu_seconds;
    let start = Instant::now();
    let slices = by_slices(target, w, |client, ids| read_ids(client, w, ids))?;
    let elapsed = start.elapsed();
    if let Some(pid) = target.cache_pid() {
        crate::procfs::wait_idle(pid, FILL_IDLE_LIMIT);
    }
    let after = target.snapshot()?.server_cpu_seconds;
    let (gets, found, wrong_values) = slices
        .into_iter()
        .fold((0, 0, 0), |t, s| (t.0 + s.0, t.1 + s.1, t.2 + s.2));
    Ok(ReadBack {
        gets,
        found,
        wrong_values,
        elapsed_s: elapsed.as_secs_f64(),
        server_cpu_seconds: after.zip(before).map(|(a, b)| a - b),
    })
}

/// GETs of `ids` in batches: how many were sent, found, and found wrong.
fn read_ids(
    client: &mut dyn Client,
    w: &Workload,
    ids: std::ops::Range<u64>,
) -> Result<(u64, u64, u64), String> {
    let batch = client.batch_size() as u64;
    let (mut gets, mut found, mut wrong) = (0, 0, 0);
    let mut requests = Vec::new();
    let mut replies = Vec::new();
    let mut next = ids.start;
    while next < ids.end && !STOP.load(Relaxed) {
        let end = (next + batch).min(ids.end);
        requests.clear();
        requests.extend((next..end).map(|id| Request::Get(w.key(id))));
        replies.clear();
        client.execute(&requests, &mut replies)?;
        for ((reply, _), id) in replies.iter().zip(next..end) {
            gets += 1;
            if let Reply::Value(Some(v)) = reply {
                match w.values.verify(id, v) {
                    true => found += 1,
                    false => wrong += 1,
                }
            }
        }
        next = end;
    }
    Ok((gets, found, wrong))
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
                    match w.rate {
                        Some(rate) => {
                            let arrivals = Arrivals::new(rate / w.threads as f64, Instant::now());
                            run_open_phase(client.as_mut(), w, &mut rng, arrivals, &measured)
                        }
                        None => run_phase(client.as_mut(), w, &mut rng, &mut slots, &measured),
                    }
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
        read_back: None,
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
            let (id, request) = w.draw(rng);
            requests.push(request);
            meta.push((slot, id, false));
        }
        replies.clear();
        client.execute(&requests, &mut replies)?;
        let done = Instant::now();
        for ((request, (reply, latency)), &(slot, id, is_fill)) in
            requests.iter().zip(&replies).zip(&meta)
        {
            let measured = phase.progress.is_some().then_some(*latency);
            if counts.tally(w, request, reply, id, is_fill, measured) {
                slots[slot].fill = Some(id);
                slots[slot].ready_at = done + w.backend_latency;
            }
        }
        counts.ops += ready.len() as u64;
        if let Some(progress) = phase.progress {
            progress.inc(ready.len() as u64);
        }
    }
    Ok(counts)
}

/// The intended send times of an open-loop client: Poisson arrivals at `rate` per second,
/// fixed by the schedule alone, never by when replies came back — so a request the client
/// could not send while the server stalled is still due at its own time, and its latency
/// counts from then (wrk2's and mutilate's correction for coordinated omission).
pub struct Arrivals {
    gap: Exp<f64>,
    next: Instant,
}

impl Arrivals {
    /// Arrivals from `start` at `rate` per second (at least one per hour).
    pub fn new(rate: f64, start: Instant) -> Arrivals {
        let rate = if rate.is_finite() {
            rate.max(1.0 / 3600.0)
        } else {
            1.0
        };
        Arrivals {
            gap: Exp::new(rate).expect("a positive finite rate"),
            next: start,
        }
    }

    /// When the next request is due.
    pub fn peek(&self) -> Instant {
        self.next
    }

    /// Takes the next due time and schedules the one after it.
    pub fn advance(&mut self, rng: &mut SmallRng) -> Instant {
        let due = self.next;
        self.next += Duration::from_secs_f64(self.gap.sample(rng));
        due
    }
}

/// The open-loop measured phase of one thread: every request that has arrived by now (up to
/// the client's batch) goes out in one batch; a miss's fill goes out once the backend has
/// answered. A GET's latency runs from its arrival to its reply, so time a request waited
/// behind a slow batch — or for the bench to wake up — is counted, not hidden.
fn run_open_phase(
    client: &mut dyn Client,
    w: &Workload,
    rng: &mut SmallRng,
    mut arrivals: Arrivals,
    phase: &Phase,
) -> Result<Counts, String> {
    let mut counts = Counts::new();
    let batch = client.batch_size().max(1);
    // Key ids whose backend value is fetched, with when it is: FIFO, as every fetch takes
    // the same time.
    let mut fills: VecDeque<(Instant, u64)> = VecDeque::new();
    // Per request of the batch: its arrival (`None` for a fill), key id.
    let (mut requests, mut meta, mut replies) = (Vec::new(), Vec::new(), Vec::new());
    while !STOP.load(Relaxed) && Instant::now() < phase.deadline {
        let remaining = phase.ops.map_or(u64::MAX, |ops| ops - counts.ops);
        if remaining == 0 {
            break;
        }
        let now = Instant::now();
        requests.clear();
        meta.clear();
        while requests.len() < batch && fills.front().is_some_and(|(at, _)| *at <= now) {
            let (_, id) = fills.pop_front().expect("a due fill");
            requests.push(Request::Put(w.key(id), w.values.value(id, 0)));
            meta.push((None, id));
        }
        let mut taken = 0;
        while requests.len() < batch && taken < remaining && arrivals.peek() <= now {
            let (id, request) = w.draw(rng);
            requests.push(request);
            meta.push((Some(arrivals.advance(rng)), id));
            taken += 1;
        }
        if requests.is_empty() {
            let next_fill = fills.front().map(|(at, _)| *at);
            let until = next_fill
                .map_or(arrivals.peek(), |at| at.min(arrivals.peek()))
                .min(phase.deadline);
            std::thread::sleep(until.saturating_duration_since(now));
            continue;
        }
        replies.clear();
        let sent = Instant::now();
        client.execute(&requests, &mut replies)?;
        for ((request, (reply, latency)), &(arrival, id)) in
            requests.iter().zip(&replies).zip(&meta)
        {
            let replied = sent + *latency;
            let since_arrival = arrival.map(|at| replied.saturating_duration_since(at));
            if counts.tally(w, request, reply, id, arrival.is_none(), since_arrival) {
                fills.push_back((replied + w.backend_latency, id));
            }
        }
        counts.ops += taken;
        if let Some(progress) = phase.progress {
            progress.inc(taken);
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::test_support::lookaside_workload;

    #[test]
    fn arrivals_keep_the_mean_rate_and_are_exponential() {
        let mut rng = SmallRng::seed_from_u64(5);
        let start = Instant::now();
        let mut arrivals = Arrivals::new(10_000.0, start);
        let n = 200_000;
        let mut previous = arrivals.advance(&mut rng);
        assert_eq!(previous, start, "the first request is due at the start");
        let mut longer_than_mean = 0;
        for _ in 1..n {
            let due = arrivals.advance(&mut rng);
            if due - previous > Duration::from_micros(100) {
                longer_than_mean += 1;
            }
            previous = due;
        }
        let rate = (n - 1) as f64 / (previous - start).as_secs_f64();
        assert!((9_800.0..10_200.0).contains(&rate), "rate {rate}");
        // P(gap > mean) = 1/e for exponential gaps; evenly spaced arrivals would give 0 or 1.
        let share = longer_than_mean as f64 / (n - 1) as f64;
        assert!((0.36..0.376).contains(&share), "share {share}");
    }

    /// Answers every GET with a miss and every PUT with stored; its first batch stalls.
    struct StallingClient {
        stall: Option<Duration>,
    }

    impl Client for StallingClient {
        fn execute(
            &mut self,
            requests: &[Request],
            replies: &mut Vec<(Reply, Duration)>,
        ) -> Result<(), String> {
            if let Some(stall) = self.stall.take() {
                std::thread::sleep(stall);
            }
            replies.extend(requests.iter().map(|request| match request {
                Request::Get(_) => (Reply::Value(None), Duration::ZERO),
                _ => (Reply::Stored, Duration::ZERO),
            }));
            Ok(())
        }

        fn batch_size(&self) -> usize {
            64
        }
    }

    #[test]
    fn a_stalled_server_shows_up_as_open_loop_latency() {
        // 2,000 GETs/s for one second; the server stalls 300 ms on the first batch. Every
        // request that arrived during the stall waited for it, from its own arrival on.
        let stall = Duration::from_millis(300);
        let w = lookaside_workload(1000, 2000);
        let phase = Phase {
            ops: Some(2000),
            deadline: Instant::now() + Duration::from_secs(60),
            progress: None,
        };
        let mut rng = SmallRng::seed_from_u64(1);
        let mut client = StallingClient { stall: Some(stall) };
        let arrivals = Arrivals::new(2000.0, Instant::now());
        let open = run_open_phase(&mut client, &w, &mut rng, arrivals, &phase).unwrap();
        assert_eq!(open.ops, 2000, "every arrival was sent");
        assert_eq!(open.gets, 2000);
        assert!(
            open.puts == 0 && open.errors == 0,
            "fills are not counted as puts"
        );
        // ~600 of the 2,000 arrived during the stall, waiting up to 300 ms.
        let p99 = Duration::from_nanos(open.get_latency.value_at_quantile(0.99));
        assert!(p99 >= stall / 2, "open-loop p99 {p99:?} hides the stall");
        let max = Duration::from_nanos(open.get_latency.max());
        assert!(max >= stall * 9 / 10, "open-loop max {max:?}");

        // The closed loop, same stall: only the one batch in flight sees it.
        let mut client = StallingClient { stall: Some(stall) };
        let mut slots = vec![
            Slot {
                ready_at: Instant::now(),
                fill: None,
            };
            64
        ];
        let measured = Phase {
            ops: Some(20_000),
            deadline: Instant::now() + Duration::from_secs(60),
            progress: Some(&ProgressBar::hidden()),
        };
        let closed = run_phase(&mut client, &w, &mut rng, &mut slots, &measured).unwrap();
        let p99 = Duration::from_nanos(closed.get_latency.value_at_quantile(0.99));
        assert!(p99 < stall / 2, "closed-loop p99 {p99:?}");
    }

    #[test]
    fn shares_add_up() {
        for (total, threads) in [(10u64, 3usize), (0, 2), (7, 7), (1_000_001, 4)] {
            let sum: u64 = (0..threads).map(|t| share(total, threads, t)).sum();
            assert_eq!(sum, total);
        }
    }
}
