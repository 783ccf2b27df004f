//! Server counters and the rendering of engine metrics for `stats`, INFO and `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Declares `Counters`: each counter under its memcached `stats` name, and whether
/// `stats reset` zeroes it (`reset`) or leaves it (`kept`: a gauge), as memcached does.
macro_rules! counters {
    ($($name:ident: $kind:ident),* $(,)?) => {
        /// Counters shared by every connection thread. Relaxed atomics: they are
        /// statistics, never used to order anything.
        #[derive(Default)]
        pub struct Counters {
            $(pub $name: AtomicU64,)*
            /// Engine counters as they stood at the last `stats reset`.
            engine_at_reset: EngineAtReset,
        }

        impl Counters {
            /// Name and value of every server counter, in memcached's names.
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }

            /// `stats reset`: zeroes the counters memcached zeroes and restarts the
            /// engine-derived ones (`since_reset`) from `engine`.
            pub fn reset(&self, engine: &zipcache::Stats) {
                $(counters!(@reset self.$name, $kind);)*
                self.engine_at_reset.evictions.store(engine.dropped_objects, Ordering::Relaxed);
                self.engine_at_reset.get_expired.store(engine.expired, Ordering::Relaxed);
                self.engine_at_reset.store_no_memory.store(engine.refused_writes, Ordering::Relaxed);
            }
        }
    };
    (@reset $counter:expr, reset) => { $counter.store(0, Ordering::Relaxed) };
    (@reset $counter:expr, kept) => {};
}

counters! {
    curr_connections: kept,
    total_connections: reset,
    rejected_connections: reset,
    cmd_get: reset,
    cmd_set: reset,
    cmd_flush: reset,
    cmd_touch: reset,
    cmd_meta: reset,
    get_hits: reset,
    get_misses: reset,
    delete_misses: reset,
    delete_hits: reset,
    incr_misses: reset,
    incr_hits: reset,
    decr_misses: reset,
    decr_hits: reset,
    cas_misses: reset,
    cas_hits: reset,
    cas_badval: reset,
    touch_hits: reset,
    touch_misses: reset,
    store_too_large: reset,
    auth_cmds: reset,
    auth_errors: reset,
    idle_kicks: reset,
    write_timeouts: reset,
    first_request_kicks: reset,
    auth_timeout_kicks: reset,
    request_size_kicks: reset,
    buffer_budget_kicks: reset,
    bytes_read: reset,
    bytes_written: reset,
    total_items: reset,
    total_commands_processed: reset,
    protocol_errors: reset,
    broken_hash_replies: reset,
}

#[derive(Default)]
struct EngineAtReset {
    evictions: AtomicU64,
    get_expired: AtomicU64,
    store_no_memory: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Bumps `hits` or `misses`.
    pub fn hit_or_miss_of(hits: &AtomicU64, misses: &AtomicU64, hit: bool) {
        Counters::bump(if hit { hits } else { misses });
    }

    pub fn hit_or_miss(&self, hit: bool) {
        Counters::hit_or_miss_of(&self.get_hits, &self.get_misses, hit);
    }

    /// memcached's counters that the engine keeps, counted since the last `stats reset`:
    /// `evictions` (objects the cache forgot to make room, `dropped_objects`) and
    /// `get_expired` (reads that found their key expired, `expired`) and `store_no_memory`
    /// (writes refused for want of room with `evictions` off, `refused_writes`).
    pub fn since_reset(&self, engine: &zipcache::Stats) -> [(&'static str, u64); 3] {
        let at_reset = &self.engine_at_reset;
        let since = |now: u64, then: &AtomicU64| now.saturating_sub(then.load(Ordering::Relaxed));
        [
            (
                "evictions",
                since(engine.dropped_objects, &at_reset.evictions),
            ),
            ("get_expired", since(engine.expired, &at_reset.get_expired)),
            (
                "store_no_memory",
                since(engine.refused_writes, &at_reset.store_no_memory),
            ),
        ]
    }
}

/// Every field of the engine's `Stats`, under its own name (SPEC §4 names are the
/// interface), as text: numbers as they are, flags as 1 or 0, names (`recovery_kind`)
/// unquoted. Fields a tier cannot report (`None`) are left out.
pub fn engine_metrics(stats: &zipcache::Stats) -> Vec<(String, String)> {
    match serde_json::to_value(stats) {
        Ok(serde_json::Value::Object(fields)) => fields
            .into_iter()
            .filter_map(|(k, v)| match v {
                serde_json::Value::Null => None,
                serde_json::Value::Bool(on) => Some((k, u8::from(on).to_string())),
                serde_json::Value::String(name) => Some((k, name)),
                other => Some((k, other.to_string())),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// What the engine's open kept of the flash tier, for the operator at start-up; `None`
/// without an SSD tier.
pub fn recovery_report(stats: &zipcache::Stats) -> Option<String> {
    let kept = match stats.recovery_kind {
        "" => return None,
        "clean" => "warm from the last clean stop's indexes",
        "crash" => "warm from the crash journal (the last run did not stop cleanly)",
        _ => {
            "cold: nothing the device held could be trusted (first start, power cut, reboot, or a crash without a usable journal)"
        }
    };
    let journal = match (stats.crash_journal_on, stats.crash_journal_incomplete) {
        (true, false) => "on",
        (true, true) => "on, but incomplete (a crash now restarts cold)",
        (false, _) => "off (a crash restarts cold)",
    };
    Some(format!(
        "flash tier: {kept}; {} objects, {} keys hidden as possibly stale, in {:.1} ms; crash journal {journal}",
        stats.recovery_objects, stats.recovery_shadowed_keys, stats.recovery_ms
    ))
}

/// Prometheus text exposition of the server counters and the engine metrics.
pub fn prometheus(counters: &Counters, stats: &zipcache::Stats) -> String {
    let mut text = String::new();
    let counter_lines = counters
        .snapshot()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()));
    for (name, value) in counter_lines.chain(engine_metrics(stats)) {
        // A sample is a number: a name (`recovery_kind clean`) goes in a label.
        let sample = match value.parse::<f64>() {
            Ok(_) => format!("zipcache_{name} {value}"),
            Err(_) => format!("zipcache_{name}{{value=\"{value}\"}} 1"),
        };
        text.push_str(&format!("# TYPE zipcache_{name} gauge\n{sample}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start-up line names how the flash tier was kept, its figures, and whether a
    /// crash of this run would restart warm; nothing without an SSD tier.
    #[test]
    fn the_recovery_report_says_how_the_tier_was_kept() {
        let crash = zipcache::Stats {
            recovery_kind: "crash",
            recovery_objects: 1234,
            recovery_shadowed_keys: 56,
            recovery_ms: 7.25,
            crash_journal_on: true,
            ..zipcache::Stats::default()
        };
        let line = recovery_report(&crash).unwrap();
        assert!(line.contains("warm from the crash journal"), "{line}");
        assert!(line.contains("1234 objects, 56 keys hidden"), "{line}");
        assert!(
            line.contains("in 7.2 ms") || line.contains("in 7.3 ms"),
            "{line}"
        );
        assert!(line.ends_with("crash journal on"), "{line}");
        let cold = zipcache::Stats {
            recovery_kind: "cold",
            ..zipcache::Stats::default()
        };
        let line = recovery_report(&cold).unwrap();
        assert!(line.starts_with("flash tier: cold"), "{line}");
        assert!(
            line.ends_with("crash journal off (a crash restarts cold)"),
            "{line}"
        );
        assert_eq!(recovery_report(&zipcache::Stats::default()), None);
    }

    /// Prometheus takes only numbers as samples: the engine's flags are 1 or 0, and its
    /// names (the recovery kind) are labels; memcached's `stats` shows them unquoted.
    #[test]
    fn flags_and_names_become_numbers_and_labels() {
        let engine = zipcache::Stats {
            recovery_kind: "crash",
            crash_journal_on: true,
            ..zipcache::Stats::default()
        };
        let text = prometheus(&Counters::default(), &engine);
        assert!(text.contains("zipcache_crash_journal_on 1\n"), "{text}");
        assert!(
            text.contains("zipcache_crash_journal_incomplete 0\n"),
            "{text}"
        );
        assert!(
            text.contains("zipcache_recovery_kind{value=\"crash\"} 1\n"),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let sample = line.rsplit(' ').next().unwrap();
            assert!(sample.parse::<f64>().is_ok(), "not a number: {line}");
        }
        let fields = engine_metrics(&engine);
        assert!(fields.contains(&("recovery_kind".to_string(), "crash".to_string())));
    }

    #[test]
    fn reset_zeroes_counts_keeps_gauges_and_restarts_engine_counts() {
        let counters = Counters::default();
        Counters::bump(&counters.curr_connections);
        Counters::bump(&counters.cmd_get);
        Counters::add(&counters.bytes_read, 10);
        let engine = zipcache::Stats {
            dropped_objects: 5,
            expired: 2,
            refused_writes: 4,
            ..Default::default()
        };
        assert_eq!(
            counters.since_reset(&engine),
            [("evictions", 5), ("get_expired", 2), ("store_no_memory", 4)]
        );
        counters.reset(&engine);
        let value = |name: &str| {
            counters
                .snapshot()
                .into_iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v)
        };
        assert_eq!(value("curr_connections"), Some(1));
        assert_eq!(value("cmd_get"), Some(0));
        assert_eq!(value("bytes_read"), Some(0));
        assert_eq!(
            counters.since_reset(&engine),
            [("evictions", 0), ("get_expired", 0), ("store_no_memory", 0)]
        );
        let later = zipcache::Stats {
            dropped_objects: 8,
            expired: 3,
            refused_writes: 6,
            ..engine
        };
        assert_eq!(
            counters.since_reset(&later),
            [("evictions", 3), ("get_expired", 1), ("store_no_memory", 2)]
        );
    }

    #[test]
    fn engine_metrics_use_spec_names_and_skip_unknowns() {
        let stats = zipcache::Stats {
            v_host: 7,
            wa: None,
            hit_ratio: 0.5,
            ..Default::default()
        };
        let metrics = engine_metrics(&stats);
        assert!(metrics.contains(&("V_host".into(), "7".into())));
        assert!(metrics.contains(&("hit_ratio".into(), "0.5".into())));
        assert!(!metrics.iter().any(|(k, _)| k == "wa"));
        assert!(prometheus(&Counters::default(), &stats).contains("\nzipcache_V_host 7\n"));
    }
}
