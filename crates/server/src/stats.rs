//! Server counters and the rendering of engine metrics for `stats`, INFO and `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters shared by every connection thread. Relaxed atomics: they are statistics,
/// never used to order anything.
#[derive(Default)]
pub struct Counters {
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub commands: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub auth_cmds: AtomicU64,
    pub auth_errors: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn hit_or_miss(&self, hit: bool) {
        Counters::bump(if hit {
            &self.get_hits
        } else {
            &self.get_misses
        });
    }

    /// Name and value of every counter, in the names memcached uses where it has one.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("curr_connections", get(&self.curr_connections)),
            ("total_connections", get(&self.total_connections)),
            ("rejected_connections", get(&self.rejected_connections)),
            ("cmd_get", get(&self.cmd_get)),
            ("cmd_set", get(&self.cmd_set)),
            ("cmd_touch", get(&self.cmd_touch)),
            ("get_hits", get(&self.get_hits)),
            ("get_misses", get(&self.get_misses)),
            ("total_commands_processed", get(&self.commands)),
            ("protocol_errors", get(&self.protocol_errors)),
            ("auth_cmds", get(&self.auth_cmds)),
            ("auth_errors", get(&self.auth_errors)),
        ]
    }
}

/// Every field of the engine's `Stats`, under its own name (SPEC §4 names are the
/// interface), as text. Fields a tier cannot report (`None`) are left out.
pub fn engine_metrics(stats: &zipcache::Stats) -> Vec<(String, String)> {
    match serde_json::to_value(stats) {
        Ok(serde_json::Value::Object(fields)) => fields
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k, v.to_string()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Prometheus text exposition of the server counters and the engine metrics.
pub fn prometheus(counters: &Counters, stats: &zipcache::Stats) -> String {
    let mut text = String::new();
    let counter_lines = counters
        .snapshot()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()));
    for (name, value) in counter_lines.chain(engine_metrics(stats)) {
        text.push_str(&format!(
            "# TYPE zipcache_{name} gauge\nzipcache_{name} {value}\n"
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

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
