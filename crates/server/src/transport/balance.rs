//! Connections packed onto fewer serving threads while fewer can carry them, and spread
//! again when a thread is saturated (`Runtime::PerCore`; `PerCoreFixed` never moves one).
//!
//! Why: a serving thread that runs out of work sleeps in `epoll_wait` and is woken by the
//! next request, and on the VMs we run on a sleep and a wake-up cost more than a pipelined
//! GET. Two threads each serving half of a load that one could carry sleep twice as
//! often as the one would: the bench's GETs cost 1.75 µs of server CPU on two threads
//! against 1.30 on one, at the same throughput. So while the serving threads together keep
//! less than [`PACK_BELOW`] of a core busy, the thread serving the fewest connections hands
//! them to the one serving the most; a thread busy above [`SPREAD_ABOVE`] of its core hands
//! half of its connections to the idlest thread.
//!
//! Who does what: thread 0's balancer task (`balance`) samples every thread's CPU time
//! each [`TICK`] and asks a thread to let connections go (`Runtimes::leaving`, a nudge);
//! each connection of that thread, when it next waits for its client with nothing
//! buffered (`connection::serve`), claims one departure and leaves with its session for
//! the destination thread's inbox. TLS connections stay where they are (rustls's state
//! does not move between reactors).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, futures::Notified, watch};

use super::Runtimes;

/// How often thread 0 samples the serving threads' CPU time and moves connections.
pub const TICK: Duration = Duration::from_millis(250);
/// The serving threads together busy below this share of one core: pack them.
pub const PACK_BELOW: f64 = 1.1;
/// A thread busy above this share of its core: spread its connections.
pub const SPREAD_ABOVE: f64 = 0.95;
/// After a spread, no packing for this long: a load that saturates one thread and keeps
/// two below [`PACK_BELOW`] would otherwise move back and forth every tick.
const PACK_HOLD_OFF: Duration = Duration::from_secs(10);

/// Connections to move from one serving thread to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub from: usize,
    pub to: usize,
    pub connections: usize,
}

/// What one tick moves, from each thread's busy share of a core over the last tick and the
/// connections it serves; `pack` is false while packing is held off.
pub fn plan(busy: &[f64], connections: &[usize], pack: bool) -> Option<Move> {
    let by_busy = |a: &usize, b: &usize| busy[*a].total_cmp(&busy[*b]);
    let threads = 0..busy.len().min(connections.len());
    let hot = threads.clone().max_by(by_busy)?;
    let cold = threads.clone().min_by(by_busy)?;
    if busy[hot] > SPREAD_ABOVE && busy[cold] < SPREAD_ABOVE / 2.0 && connections[hot] >= 2 {
        return Some(Move {
            from: hot,
            to: cold,
            connections: connections[hot] / 2,
        });
    }
    let serving: Vec<usize> = threads.filter(|&i| connections[i] > 0).collect();
    if !pack || serving.len() < 2 || busy.iter().sum::<f64>() >= PACK_BELOW {
        return None;
    }
    // The fewest go to the most; among equals the higher thread gives to the lower.
    let from = *serving
        .iter()
        .min_by_key(|&&i| (connections[i], usize::MAX - i))?;
    let to = *serving
        .iter()
        .filter(|&&i| i != from)
        .max_by_key(|&&i| (connections[i], usize::MAX - i))?;
    Some(Move {
        from,
        to,
        connections: connections[from],
    })
}

/// What the balancer keeps of each serving thread.
pub struct Lanes {
    /// The thread's id in `/proc/self/task`, once it has started.
    tid: Vec<AtomicU64>,
    /// Connections the thread is asked to let go, and where to.
    leaving: Vec<AtomicUsize>,
    destination: Vec<AtomicUsize>,
    /// Wakes the thread's connections waiting for their clients to claim a departure.
    nudge: Vec<Notify>,
}

impl Lanes {
    pub fn new(threads: usize) -> Lanes {
        Lanes {
            tid: (0..threads).map(|_| AtomicU64::new(0)).collect(),
            leaving: (0..threads).map(|_| AtomicUsize::new(0)).collect(),
            destination: (0..threads).map(|_| AtomicUsize::new(0)).collect(),
            nudge: (0..threads).map(|_| Notify::new()).collect(),
        }
    }

    /// Records the calling thread as serving thread `me` (its CPU time is then sampled).
    pub fn started(&self, me: usize) {
        if let Some(tid) = own_tid() {
            self.tid[me].store(tid, Ordering::Relaxed);
        }
    }

    /// Resolves when thread `me` is asked to let connections go.
    pub fn nudged(&self, me: usize) -> Notified<'_> {
        self.nudge[me].notified()
    }

    /// Takes one of the departures asked of thread `me`: where to go, if any is left.
    pub fn claim_departure(&self, me: usize) -> Option<usize> {
        let leaving = &self.leaving[me];
        let claimed =
            leaving.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        claimed
            .ok()
            .map(|_| self.destination[me].load(Ordering::Acquire))
    }

    fn ask(&self, m: Move) {
        self.destination[m.from].store(m.to, Ordering::Release);
        self.leaving[m.from].store(m.connections, Ordering::Release);
        self.nudge[m.from].notify_waiters();
    }

    /// Each thread's CPU time so far (ns), `None` for one not started or not readable.
    fn cpu_ns(&self) -> Vec<Option<u64>> {
        self.tid
            .iter()
            .map(|tid| match tid.load(Ordering::Relaxed) {
                0 => None,
                tid => thread_cpu_ns(tid),
            })
            .collect()
    }
}

/// This thread's id, from `/proc/thread-self` (`PID/task/TID`).
fn own_tid() -> Option<u64> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// Nanoseconds thread `tid` of this process has run: the first field of its `schedstat`.
fn thread_cpu_ns(tid: u64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// Thread 0's balancer: each [`TICK`], every serving thread's busy share of a core since
/// the last tick, and the move [`plan`] makes of them, until shutdown.
pub async fn balance(runtimes: Arc<Runtimes>, mut stopped: watch::Receiver<bool>) {
    let lanes = &runtimes.lanes;
    let mut last = (Instant::now(), lanes.cpu_ns());
    let mut pack_after = Instant::now();
    let mut moved = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(TICK) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        let now = (Instant::now(), lanes.cpu_ns());
        let wall = now.0.duration_since(last.0).as_nanos().max(1) as f64;
        let busy: Option<Vec<f64>> = (now.1.iter().zip(&last.1))
            .map(|(now, then)| Some(now.as_ref()?.saturating_sub(*then.as_ref()?) as f64 / wall))
            .collect();
        last = now;
        // The tick after a move measured the threads while connections were leaving.
        let Some(busy) = busy.filter(|_| !std::mem::take(&mut moved)) else {
            continue;
        };
        let Some(m) = plan(&busy, &runtimes.connections(), Instant::now() >= pack_after) else {
            continue;
        };
        if busy[m.from] > SPREAD_ABOVE {
            pack_after = Instant::now() + PACK_HOLD_OFF;
        }
        lanes.ask(m);
        moved = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_threads_that_one_could_carry_are_packed_onto_the_busier_one() {
        let m = plan(&[0.3, 0.4], &[4, 4], true);
        assert_eq!(
            m,
            Some(Move {
                from: 1,
                to: 0,
                connections: 4
            })
        );
        let m = plan(&[0.3, 0.4], &[3, 5], true);
        assert_eq!(
            m,
            Some(Move {
                from: 0,
                to: 1,
                connections: 3
            })
        );
    }

    #[test]
    fn nothing_moves_when_packed_held_off_or_busy() {
        assert_eq!(plan(&[0.5, 0.0], &[8, 0], true), None, "already packed");
        assert_eq!(plan(&[0.3, 0.4], &[4, 4], false), None, "held off");
        assert_eq!(
            plan(&[0.6, 0.6], &[4, 4], true),
            None,
            "one would not carry them"
        );
        assert_eq!(plan(&[0.0, 0.0], &[0, 0], true), None, "no connections");
    }

    #[test]
    fn a_saturated_thread_gives_half_its_connections_to_the_idlest() {
        let m = plan(&[0.99, 0.01, 0.2], &[9, 0, 1], true);
        assert_eq!(
            m,
            Some(Move {
                from: 0,
                to: 1,
                connections: 4
            })
        );
        assert_eq!(
            plan(&[0.99, 0.0], &[1, 0], true),
            None,
            "one connection is not split"
        );
        assert_eq!(
            plan(&[0.99, 0.6], &[4, 4], true),
            None,
            "no thread idle enough to take them"
        );
    }

    #[test]
    fn departures_are_claimed_once_each() {
        let lanes = Lanes::new(2);
        lanes.ask(Move {
            from: 1,
            to: 0,
            connections: 2,
        });
        assert_eq!(lanes.claim_departure(1), Some(0));
        assert_eq!(lanes.claim_departure(1), Some(0));
        assert_eq!(lanes.claim_departure(1), None);
        assert_eq!(lanes.claim_departure(0), None);
    }

    #[test]
    fn a_thread_reads_its_own_cpu_time() {
        let tid = own_tid().expect("/proc/thread-self");
        let before = thread_cpu_ns(tid).expect("schedstat");
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {
            std::hint::black_box(spin.elapsed());
        }
        let after = thread_cpu_ns(tid).expect("schedstat");
        assert!(after > before, "{before} → {after}");
    }
}
