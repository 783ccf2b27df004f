//! Device reads and writes per second for `stats`: counted over a window of at least one
//! second, sampled when `stats` asks (no thread of its own), so that an operator polling
//! every second or every minute sees the rate over their own interval.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The shortest window a rate is measured over: shorter ones are mostly noise.
const WINDOW: Duration = Duration::from_secs(1);

/// Reads and writes per second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    pub reads: f64,
    pub writes: f64,
}

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    reads: u64,
    writes: u64,
}

#[derive(Default)]
pub struct IoRates {
    /// The window's start, and the rates of the last window that ended.
    state: Mutex<(Option<Sample>, Option<Rates>)>,
}

impl IoRates {
    /// The rates over the last window that ended, given the device's counts `now`; `None`
    /// until one has.
    pub fn observe(&self, now: Instant, reads: u64, writes: u64) -> Option<Rates> {
        let mut state = self.state.lock();
        let (start, rates) = &mut *state;
        let sample = Sample {
            at: now,
            reads,
            writes,
        };
        match *start {
            None => *start = Some(sample),
            Some(from) if now.saturating_duration_since(from.at) >= WINDOW => {
                let seconds = (now - from.at).as_secs_f64();
                let per_second = |to: u64, from: u64| to.saturating_sub(from) as f64 / seconds;
                *rates = Some(Rates {
                    reads: per_second(reads, from.reads),
                    writes: per_second(writes, from.writes),
                });
                *start = Some(sample);
            }
            Some(_) => {}
        }
        *rates
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_cover_a_whole_window_and_hold_between_windows() {
        let rates = IoRates::default();
        let t0 = Instant::now();
        assert_eq!(rates.observe(t0, 100, 10), None, "no window yet");
        assert_eq!(
            rates.observe(t0 + Duration::from_millis(500), 400, 20),
            None
        );
        let first = rates.observe(t0 + Duration::from_secs(2), 1100, 50);
        assert_eq!(
            first,
            Some(Rates {
                reads: 500.0,
                writes: 20.0
            })
        );
        // Within the next window the last rates stand.
        assert_eq!(
            rates.observe(t0 + Duration::from_millis(2300), 9999, 9999),
            first
        );
        let second = rates.observe(t0 + Duration::from_secs(4), 1100, 50);
        assert_eq!(
            second,
            Some(Rates {
                reads: 0.0,
                writes: 0.0
            }),
            "idle device"
        );
    }
}
