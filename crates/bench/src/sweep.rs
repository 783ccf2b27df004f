//! `zipcache bench sweep --figure NAME`: the paper's experiments (§4) as a series of bench
//! runs, drawn as PNG and tabulated in markdown. Every point is an ordinary `zipcache bench`
//! command line, printed in the table, so any point can be re-run alone.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::Params;
use plotters::chart::SeriesLabelPosition;

use crate::plot::{Chart, Series, line_chart};
use crate::report::TargetResult;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Figure {
    /// Objects per MiB of DRAM vs η, every target, DRAM only (fill).
    Capacity,
    /// Hit ratio and throughput vs C_DRAM:C_WS, moderate locality (paper Fig. 8(b)).
    DramRatio,
    /// wa_host, wr_nand, wa vs value size, super-leaf size and `T` (paper Fig. 11).
    Wa,
    /// GET latency CDF with bypass_r = 3 vs 0, strong locality, GET:PUT 70:30 and 30:70
    /// (paper Fig. 12).
    Bypass,
    /// DRAM-tier hit ratio vs η at C_DRAM:C_WS = 1:16, moderate locality (paper Fig. 14).
    Eta,
    /// GET p50, p99 and p999 vs offered load (open loop, `--rate`), every target, the
    /// working set resident in DRAM.
    LatencyLoad,
}

#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    #[arg(long, value_enum)]
    pub figure: Figure,
    /// Directory for NAME*.png, NAME.md and NAME.json.
    #[arg(long, default_value = "bench-figures")]
    pub out: PathBuf,
    /// Targets to run (default: the figure's own list).
    #[arg(long)]
    pub target: Option<String>,
    /// Multiplies keys, DRAM and run time; 1 finishes within 15 minutes on 2 cores.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
}

/// Parses bench flags the way the command line does, defaults included.
#[derive(Parser)]
struct BenchFlags {
    #[command(flatten)]
    params: Params,
}

/// One point of a sweep: its x value, the series it belongs to beyond the target's name,
/// and its bench flags.
struct Point {
    x: f64,
    series: String,
    flags: Vec<String>,
}

struct Measured {
    point: Point,
    result: TargetResult,
}

const ETAS: [f64; 4] = [0.0, 0.25, 0.5, 0.75];
/// Offered loads of the latency-load figure, requests per second: from well below every
/// target's peak to past most of them.
const RATES: [f64; 6] = [10e3, 25e3, 50e3, 100e3, 200e3, 400e3];
const KEY_SIZE: u64 = 16;
const VALUE_SIZE: u64 = 64;

fn size_flag(bytes: f64) -> String {
    format!("{}KiB", ((bytes / 1024.0).round() as u64).max(1024))
}

fn flags(pairs: &[(&str, String)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(name, value)| {
            let flag = format!("--{name}");
            if value.is_empty() {
                vec![flag]
            } else {
                vec![flag, value.clone()]
            }
        })
        .collect()
}

fn scaled(value: f64, scale: f64) -> u64 {
    (value * scale).round().max(1.0) as u64
}

/// The points and default targets of `figure`.
fn plan(figure: Figure, scale: f64) -> (Vec<Point>, &'static str) {
    let object = (KEY_SIZE + VALUE_SIZE) as f64;
    let seconds = (8.0 * scale).max(1.0).to_string();
    match figure {
        Figure::Capacity => {
            let dram = 16.0 * scale * (1 << 20) as f64;
            // Enough keys to overflow even a 4×-compressing cache.
            let keys = (dram / object * 6.0) as u64;
            let points = ETAS
                .iter()
                .map(|eta| Point {
                    x: *eta,
                    series: String::new(),
                    flags: flags(&[
                        ("mode", "fill".into()),
                        ("ssd", "none".into()),
                        ("dram", size_flag(dram)),
                        ("keys", keys.to_string()),
                        ("value-size", VALUE_SIZE.to_string()),
                        ("eta", eta.to_string()),
                    ]),
                })
                .collect();
            (points, "zipcache,foyer,segcache,memcached,redis")
        }
        Figure::DramRatio => {
            let keys = scaled(800_000.0, scale);
            let working_set = keys as f64 * object;
            let points = [16.0, 8.0, 4.0, 2.0]
                .iter()
                .map(|den| Point {
                    x: 1.0 / den,
                    series: String::new(),
                    flags: flags(&[
                        ("dram", size_flag(working_set / den)),
                        ("ssd-size", size_flag(working_set * 4.0)),
                        ("keys", keys.to_string()),
                        ("value-size", VALUE_SIZE.to_string()),
                        ("locality", "moderate".into()),
                        ("warmup-ops", keys.to_string()),
                        ("duration", seconds.clone()),
                        ("backend-latency-us", "1000".into()),
                    ]),
                })
                .collect();
            (
                points,
                "zipcache,foyer,segcache,memcached,memcached-ext,redis",
            )
        }
        Figure::Wa => {
            // The workload at 1/4 of its size per unit of scale: look-aside,
            // moderate locality, η = 0.5, as many GETs as keys, DRAM ≈ 1/10 of the working
            // set, from an empty cache.
            let dram = 8.0 * scale * (1 << 20) as f64;
            let keys = scaled(1_000_000.0, scale);
            let mut points = Vec::new();
            for superleaf in [4, 16, 64] {
                for fill in ["1.0", "0.9", "0.8"] {
                    for value_size in [32u64, 64, 128] {
                        points.push(Point {
                            x: value_size as f64,
                            series: format!("{superleaf} KiB T={fill}"),
                            flags: flags(&[
                                (
                                    "dram",
                                    size_flag(dram * (KEY_SIZE + value_size) as f64 / object),
                                ),
                                ("ssd-size", size_flag(dram * 64.0)),
                                ("keys", keys.to_string()),
                                ("ops", keys.to_string()),
                                ("value-size", value_size.to_string()),
                                ("eta", "0.5".into()),
                                ("locality", "moderate".into()),
                                ("set", format!("superleaf_size={superleaf}KiB")),
                                ("set", format!("fill_threshold={fill}")),
                            ]),
                        });
                    }
                }
            }
            (points, "zipcache")
        }
        Figure::Bypass => {
            let keys = scaled(400_000.0, scale);
            let working_set = keys as f64 * object;
            let mut points = Vec::new();
            for (get, put) in [("0.7", "0.3"), ("0.3", "0.7")] {
                for r in [3.0, 0.0] {
                    points.push(Point {
                        x: r,
                        series: format!("bypass_r={r} GET:PUT={get}:{put}"),
                        flags: flags(&[
                            ("dram", size_flag(working_set * 2.0)),
                            ("ssd", "none".into()),
                            ("keys", keys.to_string()),
                            ("value-size", VALUE_SIZE.to_string()),
                            ("locality", "strong".into()),
                            ("get-ratio", get.into()),
                            ("put-ratio", put.into()),
                            ("warmup-ops", keys.to_string()),
                            ("duration", seconds.clone()),
                            ("set", format!("bypass_r={r}")),
                        ]),
                    });
                }
            }
            (points, "zipcache")
        }
        Figure::LatencyLoad => {
            let keys = scaled(200_000.0, scale);
            let working_set = keys as f64 * object;
            // Twice the working set in DRAM: no target evicts, so latency is the serving
            // path's; the SSD budget only lets memcached-ext start.
            let points = RATES
                .iter()
                .map(|rate| Point {
                    x: rate / 1e3,
                    series: String::new(),
                    flags: flags(&[
                        ("rate", rate.to_string()),
                        ("dram", size_flag(working_set * 2.0)),
                        ("ssd-size", size_flag(working_set * 4.0)),
                        ("keys", keys.to_string()),
                        ("value-size", VALUE_SIZE.to_string()),
                        ("locality", "moderate".into()),
                        ("warmup-ops", keys.to_string()),
                        ("duration", seconds.clone()),
                    ]),
                })
                .collect();
            (
                points,
                "zipcache,zipcache-serve,memcached,memcached-ext,redis,foyer,segcache",
            )
        }
        Figure::Eta => {
            let keys = scaled(1_600_000.0, scale);
            let working_set = keys as f64 * object;
            let points = ETAS
                .iter()
                .map(|eta| Point {
                    x: *eta,
                    series: String::new(),
                    flags: flags(&[
                        ("dram", size_flag(working_set / 16.0)),
                        ("ssd-size", size_flag(working_set * 4.0)),
                        ("keys", keys.to_string()),
                        ("value-size", VALUE_SIZE.to_string()),
                        ("eta", eta.to_string()),
                        ("locality", "moderate".into()),
                        ("warmup-ops", keys.to_string()),
                        ("duration", seconds.clone()),
                    ]),
                })
                .collect();
            (
                points,
                "zipcache,foyer,memcached-ext,memcached,redis,segcache",
            )
        }
    }
}

fn series_name(m: &Measured) -> String {
    if m.point.series.is_empty() {
        m.result.target.clone()
    } else {
        format!("{} {}", m.result.target, m.point.series)
    }
}

/// Lines of `metric` vs x, one per target (and series), skipping points without a value.
fn lines(measured: &[Measured], metric: impl Fn(&TargetResult) -> Option<f64>) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for m in measured {
        let Some(y) = metric(&m.result) else { continue };
        let name = series_name(m);
        match out.iter_mut().find(|s| s.label == name) {
            Some(series) => series.points.push((m.point.x, y)),
            None => out.push(Series {
                label: name,
                points: vec![(m.point.x, y)],
            }),
        }
    }
    out
}

/// The GET latency CDF of a run: x = log10(latency in µs), y = fraction of GETs.
fn cdf(result: &TargetResult) -> Vec<(f64, f64)> {
    let Some(h) = &result.get_latency_ns else {
        return Vec::new();
    };
    (0..=200)
        .map(|i| {
            let q = 1.0 - 10f64.powf(-(i as f64) / 50.0);
            let us = h.value_at_quantile(q) as f64 / 1000.0;
            (us.max(0.01).log10(), q)
        })
        .collect()
}

fn draw(figure: Figure, out: &Path, measured: &[Measured]) -> Result<Vec<PathBuf>, String> {
    let name = figure_name(figure);
    let mut charts: Vec<(String, String, &str, &str, Vec<Series>)> = Vec::new();
    let mut chart = |file: &str, title: &str, x: &'static str, y: &'static str, s: Vec<Series>| {
        charts.push((file.to_string(), title.to_string(), x, y, s));
    };
    match figure {
        Figure::Capacity => chart(
            name,
            "Objects per MiB of DRAM vs compressibility (fill, DRAM only)",
            "eta (fraction of value that is zeros)",
            "objects resident per MiB of DRAM budget",
            lines(measured, |r| {
                Some(r.objects_resident? as f64 / (r.workload.dram as f64 / (1 << 20) as f64))
            }),
        ),
        Figure::DramRatio => {
            chart(
                "dram-ratio-hit",
                "Hit ratio vs C_DRAM:C_WS (moderate locality)",
                "C_DRAM / C_WS",
                "hit ratio",
                lines(measured, |r| r.hit_ratio),
            );
            chart(
                "dram-ratio-throughput",
                "Throughput vs C_DRAM:C_WS (moderate locality, look-aside, 1 ms backend)",
                "C_DRAM / C_WS",
                "ops/s",
                lines(measured, |r| Some(r.throughput_ops)),
            );
        }
        Figure::Wa => {
            chart(
                "wa-host",
                "wa_host vs value size (16 B keys, moderate, look-aside, η = 0.5)",
                "value size (B)",
                "wa_host",
                lines(measured, |r| r.held.wa_host),
            );
            chart(
                "wr-nand",
                "wr_nand vs value size (16 B keys, moderate, look-aside, η = 0.5)",
                "value size (B)",
                "wr_nand",
                lines(measured, |r| r.held.wr_nand),
            );
            chart(
                "wa",
                "wa vs value size (16 B keys, moderate, look-aside, η = 0.5)",
                "value size (B)",
                "wa",
                lines(measured, |r| r.held.wa),
            );
        }
        Figure::Bypass => chart(
            name,
            "GET latency CDF, strong locality: bypass on (r=3) vs off (r=0)",
            "log10 GET latency (us)",
            "fraction of GETs",
            measured
                .iter()
                .map(|m| Series {
                    label: series_name(m),
                    points: cdf(&m.result),
                })
                .collect(),
        ),
        Figure::LatencyLoad => {
            for (file, label, q) in [
                ("latency-load-p50", "p50", 0.5),
                ("latency-load-p99", "p99", 0.99),
                ("latency-load-p999", "p999", 0.999),
            ] {
                chart(
                    file,
                    &format!("GET {label} latency vs offered load (open loop, DRAM-resident)"),
                    "offered load (k requests/s, Poisson)",
                    "log10 GET latency (us), from each request's arrival",
                    lines(measured, |r| {
                        let h = r.get_latency_ns.as_ref()?;
                        Some((h.value_at_quantile(q) as f64 / 1e3).max(0.01).log10())
                    }),
                );
            }
        }
        Figure::Eta => chart(
            name,
            "DRAM-tier hit ratio vs compressibility (C_DRAM:C_WS = 1:16, moderate)",
            "eta (fraction of value that is zeros)",
            "DRAM-tier hit ratio",
            lines(measured, |r| r.dram_hit_ratio),
        ),
    }
    let mut written = Vec::new();
    for (file, title, x_label, y_label, series) in charts {
        let path = out.join(format!("{file}.png"));
        line_chart(
            &path,
            &Chart {
                title: &title,
                x_label,
                y_label,
                series: &series,
                // A CDF is a dense curve rising to the upper right.
                markers: figure != Figure::Bypass,
                legend_at: if figure == Figure::Bypass {
                    SeriesLabelPosition::LowerRight
                } else {
                    SeriesLabelPosition::UpperLeft
                },
            },
        )?;
        written.push(path);
    }
    Ok(written)
}

fn figure_name(figure: Figure) -> &'static str {
    match figure {
        Figure::Capacity => "capacity",
        Figure::DramRatio => "dram-ratio",
        Figure::Wa => "wa",
        Figure::Bypass => "bypass",
        Figure::Eta => "eta",
        Figure::LatencyLoad => "latency-load",
    }
}

fn opt<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

fn opt_f(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

fn markdown(figure: Figure, measured: &[Measured], failures: &[String]) -> String {
    let mut md = format!("# bench sweep --figure {}\n\n", figure_name(figure));
    md.push_str(
        "| target | x | series | ops/s | hit | dram hit | ssd hit | p50 us | p99 us | p999 us | objects | obj/MiB | wa_host | wr_nand | wa | rss MiB | server CPU s/Mop | command |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for m in measured {
        let r = &m.result;
        let per_mib = r
            .objects_resident
            .map(|o| o as f64 / (r.workload.dram as f64 / (1 << 20) as f64));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | `zipcache bench --target {} {}` |",
            r.target,
            m.point.x,
            m.point.series,
            r.throughput_ops,
            opt_f(r.hit_ratio, 3),
            opt_f(r.dram_hit_ratio, 3),
            opt_f(r.ssd_hit_ratio, 3),
            opt_f(r.get_latency_us.p50, 1),
            opt_f(r.get_latency_us.p99, 1),
            opt_f(r.get_latency_us.p999, 1),
            opt(r.objects_resident),
            opt_f(per_mib, 0),
            opt_f(r.held.wa_host, 2),
            opt_f(r.held.wr_nand, 2),
            opt_f(r.held.wa, 2),
            opt_f(r.held.rss_bytes.map(|b| b as f64 / (1 << 20) as f64), 1),
            opt_f(r.server_cpu_s_per_mop, 2),
            r.target,
            m.point.flags.join(" "),
        );
    }
    if !failures.is_empty() {
        md.push_str("\nFailed points:\n\n");
        for f in failures {
            let _ = writeln!(md, "* {f}");
        }
    }
    md
}

/// Runs `figure`: every point against every target, then the PNGs, markdown and JSON.
pub fn run(args: &SweepArgs) -> Result<(), String> {
    if !args.scale.is_finite() || args.scale <= 0.0 {
        return Err("--scale must be positive".into());
    }
    let (points, default_targets) = plan(args.figure, args.scale);
    let targets = args.target.as_deref().unwrap_or(default_targets);
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let mut measured = Vec::new();
    let mut failures = Vec::new();
    for point in points {
        let argv = std::iter::once("bench".to_string()).chain(point.flags.iter().cloned());
        let params = BenchFlags::try_parse_from(argv)
            .map_err(|e| format!("sweep point {:?}: {e}", point.flags))?
            .params;
        eprintln!(
            "sweep {}: {}",
            figure_name(args.figure),
            point.flags.join(" ")
        );
        let (results, failed) = crate::run_all(targets, &params);
        failures.extend(
            failed
                .into_iter()
                .map(|f| format!("{}: {f}", point.flags.join(" "))),
        );
        for result in results {
            measured.push(Measured {
                point: Point {
                    x: point.x,
                    series: point.series.clone(),
                    flags: point.flags.clone(),
                },
                result,
            });
        }
        if crate::driver::STOP.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
    }
    let name = figure_name(args.figure);
    let pngs = draw(args.figure, &args.out, &measured)?;
    let md_path = args.out.join(format!("{name}.md"));
    std::fs::write(&md_path, markdown(args.figure, &measured, &failures))
        .map_err(|e| format!("{}: {e}", md_path.display()))?;
    let results: Vec<TargetResult> = measured.iter().map(|m| m.result.clone()).collect();
    crate::report::write_json(&args.out.join(format!("{name}.json")), &results)?;
    for path in pngs.iter().chain([&md_path]) {
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_parses_as_bench_flags() {
        for figure in [
            Figure::Capacity,
            Figure::DramRatio,
            Figure::Wa,
            Figure::Bypass,
            Figure::Eta,
            Figure::LatencyLoad,
        ] {
            let (points, targets) = plan(figure, 1.0);
            assert!(!points.is_empty() && !targets.is_empty());
            for point in points {
                let argv = std::iter::once("bench".to_string()).chain(point.flags.clone());
                let params = BenchFlags::try_parse_from(argv)
                    .unwrap_or_else(|e| panic!("{:?}: {e}", point.flags))
                    .params;
                params.workload().expect("valid workload");
            }
        }
    }
}
