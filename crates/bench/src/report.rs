//! One result row per target: the JSON object of `--json` and the summary table.

use std::io::Write;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::Params;
use crate::driver::Run;
use crate::targets::Holdings;

/// GET latency percentiles in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
}

/// The JSON object of one target (SPEC §5, §8); `null` where the target cannot say.
#[derive(Clone, Debug, Serialize)]
pub struct TargetResult {
    pub target: String,
    pub mode: String,
    /// Operations (fill: PUTs; look-aside: requests of the mix) per second of measured time.
    pub throughput_ops: f64,
    pub elapsed_s: f64,
    pub ops: u64,
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    pub hit_ratio: Option<f64>,
    pub dram_hit_ratio: Option<f64>,
    pub ssd_hit_ratio: Option<f64>,
    pub get_latency_us: Latency,
    /// Values that came back different from what was stored: must be 0.
    pub wrong_values: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub unsupported_ops: u64,
    /// What the tiers hold after the run (`Snapshot::held`).
    #[serde(flatten)]
    pub held: Holdings,
    pub objects_resident: Option<u64>,
    /// How `objects_resident` was obtained: `stats` of the target, or `probe` (GET of every key).
    pub objects_resident_source: Option<&'static str>,
    /// `objects_resident` per MiB of the SSD budget (`--ssd-size`): every target's
    /// flash is that size, so this compares what each keeps in it.
    pub objects_per_ssd_mib: Option<f64>,
    /// `ssd_objects` per MiB of `ssd_flash_bytes`: the flash tier's own density, whatever
    /// share of the budget a run got to write.
    pub ssd_objects_per_flash_mib: Option<f64>,
    /// Bytes the cache wrote to its SSD file during the measured phase.
    pub host_bytes_written: Option<u64>,
    /// CPU seconds of the bench process in the measured phase (clients; in-process engines too).
    pub bench_cpu_seconds: Option<f64>,
    /// CPU seconds (user + system, /proc/PID/stat) of the server process in the measured
    /// phase: a server the bench started, or the `--server-pid` of a remote one.
    pub server_cpu_seconds: Option<f64>,
    /// `server_cpu_seconds` per million measured operations.
    pub server_cpu_s_per_mop: Option<f64>,
    pub workload: Params,
    /// The trace replayed (`--trace`): its requests, unique keys and op counts.
    pub trace: Option<crate::trace::TraceSummary>,
    #[serde(skip)]
    pub get_latency_ns: Option<Histogram<u64>>,
}

/// The JSON fields every result carries (null allowed), as scripts rely on them.
pub const REQUIRED_FIELDS: &[&str] = &[
    "target",
    "throughput_ops",
    "hit_ratio",
    "dram_hit_ratio",
    "ssd_hit_ratio",
    "get_latency_us",
    "dram_bytes_used",
    "objects_resident",
    "compression_ratio_dram",
    "wa_host",
    "wr_nand",
    "wa",
    "zeta",
    "workload",
    "ssd_objects",
    "ssd_index_bytes",
    "ssd_reads_per_ssd_get",
    "rss_bytes",
];

fn delta(after: Option<u64>, before: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before.unwrap_or(0)))
}

fn ratio(num: Option<u64>, den: u64) -> Option<f64> {
    (den > 0)
        .then(|| num.map(|n| n as f64 / den as f64))
        .flatten()
}

fn percentile_us(h: &Histogram<u64>, q: f64) -> Option<f64> {
    (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0)
}

impl TargetResult {
    pub fn new(target: &str, dram_only: bool, run: Run, params: &Params) -> TargetResult {
        let Run {
            counts: c,
            before,
            after,
            elapsed,
            bench_cpu_seconds,
            probed_resident,
        } = run;
        let hit_ratio = ratio(Some(c.hits), c.gets);
        let (dram_hit_ratio, ssd_hit_ratio) = if dram_only {
            (hit_ratio, hit_ratio.map(|_| 0.0))
        } else {
            (
                ratio(delta(after.dram_hits, before.dram_hits), c.gets),
                ratio(delta(after.ssd_hits, before.ssd_hits), c.gets),
            )
        };
        let h = &c.get_latency;
        let (objects_resident, objects_resident_source) =
            match (probed_resident, after.objects_resident) {
                (Some(n), _) => (Some(n), Some("probe")),
                (None, Some(n)) => (Some(n), Some("stats")),
                (None, None) => (None, None),
            };
        let held = after.held.clone();
        let (ssd_objects, ssd_flash_bytes) = (held.ssd_objects, held.ssd_flash_bytes);
        let server_cpu_seconds = after
            .server_cpu_seconds
            .zip(before.server_cpu_seconds)
            .map(|(a, b)| a - b);
        let objects_per_ssd_mib = params
            .ssd_budget()
            .filter(|_| !dram_only)
            .and_then(|ssd| Some(objects_resident? as f64 / (ssd as f64 / (1 << 20) as f64)));
        let ssd_objects_per_flash_mib = ssd_objects
            .zip(ssd_flash_bytes.filter(|&bytes| bytes > 0))
            .map(|(objects, bytes)| objects as f64 / (bytes as f64 / (1 << 20) as f64));
        TargetResult {
            target: target.into(),
            mode: params.mode.name().into(),
            throughput_ops: c.ops as f64 / elapsed.as_secs_f64().max(1e-9),
            elapsed_s: elapsed.as_secs_f64(),
            ops: c.ops,
            gets: c.gets,
            hits: c.hits,
            misses: c.misses,
            hit_ratio,
            dram_hit_ratio,
            ssd_hit_ratio,
            get_latency_us: Latency {
                p50: percentile_us(h, 0.5),
                p90: percentile_us(h, 0.9),
                p99: percentile_us(h, 0.99),
                p999: percentile_us(h, 0.999),
            },
            wrong_values: c.wrong_values,
            errors: c.errors,
            first_error: c.first_error.clone(),
            unsupported_ops: c.unsupported,
            held,
            objects_resident,
            objects_resident_source,
            objects_per_ssd_mib,
            ssd_objects_per_flash_mib,
            host_bytes_written: delta(after.host_bytes_written, before.host_bytes_written),
            bench_cpu_seconds,
            server_cpu_seconds,
            server_cpu_s_per_mop: server_cpu_seconds
                .filter(|_| c.ops > 0)
                .map(|s| s / c.ops as f64 * 1e6),
            workload: params.clone(),
            trace: None,
            get_latency_ns: (!h.is_empty()).then(|| h.clone()),
        }
    }
}

fn cell<T>(value: Option<T>, show: impl Fn(T) -> String) -> String {
    value.map_or_else(|| "-".into(), show)
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

fn pct(ratio: f64) -> String {
    format!("{:.1}", ratio * 100.0)
}

fn us(v: f64) -> String {
    format!("{v:.1}")
}

/// The summary table, one row per target.
pub fn table(results: &[TargetResult]) -> String {
    let header = [
        "target",
        "ops",
        "ops/s",
        "hit%",
        "dram%",
        "ssd%",
        "p50us",
        "p99us",
        "p999us",
        "objects",
        "dramMiB",
        "rssMiB",
        "obj/MiB",
        "srvCPUs/Mop",
        "obj/ssdMiB",
        "ssdObj/flashMiB",
        "wrong",
        "errors",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            // A cluster target has the DRAM budget on each of its nodes.
            let nodes = r
                .held
                .objects_per_node
                .as_ref()
                .map_or(1, |n| n.len().max(1));
            let per_mib = r
                .objects_resident
                .zip(Some(r.workload.dram * nodes as u64))
                .map(|(o, d)| o as f64 / (d as f64 / (1 << 20) as f64));
            vec![
                r.target.clone(),
                r.ops.to_string(),
                format!("{:.0}", r.throughput_ops),
                cell(r.hit_ratio, pct),
                cell(r.dram_hit_ratio, pct),
                cell(r.ssd_hit_ratio, pct),
                cell(r.get_latency_us.p50, us),
                cell(r.get_latency_us.p99, us),
                cell(r.get_latency_us.p999, us),
                cell(r.objects_resident, |o| o.to_string()),
                cell(r.held.dram_bytes_used, mib),
                cell(r.held.rss_bytes, mib),
                cell(per_mib, |v| format!("{v:.0}")),
                cell(r.server_cpu_s_per_mop, |v| format!("{v:.2}")),
                cell(r.objects_per_ssd_mib, |v| format!("{v:.0}")),
                cell(r.ssd_objects_per_flash_mib, |v| format!("{v:.0}")),
                r.wrong_values.to_string(),
                r.errors.to_string(),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| -> String {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    for r in results {
        if let Some(per_node) = &r.held.objects_per_node {
            let listed: Vec<String> = per_node.iter().map(u64::to_string).collect();
            out.push_str(&format!(
                "{}: objects per node {} (the fleet's: {})\n",
                r.target,
                listed.join(" "),
                per_node.iter().sum::<u64>()
            ));
        }
    }
    out
}

/// Writes `results` as a JSON array.
pub fn write_json(path: &Path, results: &[TargetResult]) -> Result<(), String> {
    let text = serde_json::to_string_pretty(results).map_err(|e| e.to_string())?;
    let mut file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(file, "{text}").map_err(|e| format!("{}: {e}", path.display()))
}
