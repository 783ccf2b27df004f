//! One result row per target: the JSON object of `--json` and the summary table.

use std::io::Write;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::driver::{ReadBack, Run};
use crate::targets::Holdings;
use crate::{Mode, Params};

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
    /// Values that came back different from what was stored (in the read-back too):
    /// must be 0.
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
    /// A fill's: the server's CPU microseconds per SET (every measured operation is one).
    pub server_cpu_us_per_set: Option<f64>,
    /// The server's CPU microseconds per GET of `read_back`.
    pub server_cpu_us_per_get: Option<f64>,
    /// Key and value bytes of the PUTs stored in the measured phase.
    pub put_bytes: u64,
    /// `host_bytes_written` per byte of `put_bytes`: what each byte a client stored cost
    /// the flash, for every target that writes a file (`wa_host` sets the same bytes
    /// against what zipcache evicted to its SSD tier).
    pub flash_bytes_per_put_byte: Option<f64>,
    /// A fill's keys read back after its figures were taken (`--read-back`).
    pub read_back: Option<ReadBack>,
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
            read_back,
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
        let server_cpu_s_per_mop = server_cpu_seconds
            .filter(|_| c.ops > 0)
            .map(|s| s / c.ops as f64 * 1e6);
        let host_bytes_written = delta(after.host_bytes_written, before.host_bytes_written);
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
            wrong_values: c.wrong_values + read_back.as_ref().map_or(0, |r| r.wrong_values),
            errors: c.errors,
            first_error: c.first_error.clone(),
            unsupported_ops: c.unsupported,
            held,
            objects_resident,
            objects_resident_source,
            objects_per_ssd_mib,
            ssd_objects_per_flash_mib,
            host_bytes_written,
            bench_cpu_seconds,
            server_cpu_seconds,
            server_cpu_s_per_mop,
            server_cpu_us_per_set: server_cpu_s_per_mop.filter(|_| params.mode == Mode::Fill),
            server_cpu_us_per_get: read_back
                .as_ref()
                .filter(|r| r.gets > 0)
                .and_then(|r| Some(r.server_cpu_seconds? / r.gets as f64 * 1e6)),
            put_bytes: c.put_bytes,
            flash_bytes_per_put_byte: ratio(host_bytes_written, c.put_bytes).filter(|_| !dram_only),
            read_back,
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

/// The summary table, one row per target. A fill's server CPU is per SET, and per GET
/// of its read-back; a look-aside's per request of the mix.
pub fn table(results: &[TargetResult]) -> String {
    let fill = results.iter().all(|r| r.mode == Mode::Fill.name());
    let cpu = if fill { "srvCPUus/SET" } else { "srvCPUus/req" };
    let mut header = vec![
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
        cpu,
        "obj/ssdMiB",
        "ssdObj/flashMiB",
        "flashB/putB",
        "wrong",
        "errors",
    ];
    let cpu_at = header
        .iter()
        .position(|&h| h == cpu)
        .expect("the CPU column")
        + 1;
    if fill {
        header.insert(cpu_at, "srvCPUus/GET");
    }
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
            let mut row = vec![
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
                cell(r.flash_bytes_per_put_byte, |v| format!("{v:.2}")),
                r.wrong_values.to_string(),
                r.errors.to_string(),
            ];
            if fill {
                row.insert(cpu_at, cell(r.server_cpu_us_per_get, |v| format!("{v:.2}")));
            }
            row
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::driver::Counts;
    use crate::targets::Snapshot;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        params: Params,
    }

    fn params(args: &[&str]) -> Params {
        let argv = ["bench"].iter().chain(args);
        Cli::try_parse_from(argv).expect("flags parse").params
    }

    /// A fill of 1,000 SETs of 100 bytes (0.02 s of the server's CPU, 300,000 bytes
    /// written to its file), and 500 GETs read back (0.001 s).
    fn fill_run() -> Run {
        let mut counts = Counts::new();
        counts.ops = 1000;
        counts.puts = 1000;
        counts.put_bytes = 100_000;
        let snapshot = |cpu, written| Snapshot {
            server_cpu_seconds: Some(cpu),
            host_bytes_written: Some(written),
            ..Snapshot::default()
        };
        Run {
            counts,
            before: snapshot(1.0, 50_000),
            after: snapshot(1.02, 350_000),
            elapsed: Duration::from_secs(1),
            bench_cpu_seconds: None,
            probed_resident: None,
            read_back: Some(ReadBack {
                gets: 500,
                found: 400,
                wrong_values: 1,
                elapsed_s: 0.1,
                server_cpu_seconds: Some(0.001),
            }),
        }
    }

    #[test]
    fn a_fill_reports_cpu_per_set_and_per_get_and_flash_bytes_per_byte_stored() {
        let fill = params(&["--mode", "fill", "--ssd-size", "64MiB"]);
        let r = TargetResult::new("t", false, fill_run(), &fill);
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(
            close(r.server_cpu_us_per_set, 20.0),
            "{:?}",
            r.server_cpu_us_per_set
        );
        assert!(
            close(r.server_cpu_us_per_get, 2.0),
            "{:?}",
            r.server_cpu_us_per_get
        );
        assert!(close(r.flash_bytes_per_put_byte, 3.0));
        assert_eq!(r.wrong_values, 1, "the read-back's wrong values count");
        let shown = table(&[r]);
        assert!(shown.contains("srvCPUus/SET  srvCPUus/GET"), "{shown}");
        assert!(shown.contains("20.00          2.00"), "{shown}");
        // Without flash, no flash figure; in a look-aside, CPU is per request of the mix.
        let r = TargetResult::new("t", true, fill_run(), &fill);
        assert_eq!(r.flash_bytes_per_put_byte, None);
        let lookaside = params(&["--mode", "lookaside"]);
        let r = TargetResult::new("t", false, fill_run(), &lookaside);
        assert_eq!(r.server_cpu_us_per_set, None);
        assert!(close(r.server_cpu_s_per_mop, 20.0));
        let shown = table(&[r]);
        assert!(
            shown.contains("srvCPUus/req") && !shown.contains("/GET"),
            "{shown}"
        );
    }
}
