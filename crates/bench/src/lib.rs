//! `zipcache bench`: cachebench-style workloads against ZipCache and its peers.
//!
//! * [`workload`]: keys, locality, op mix; [`values`]: value sizes and bytes (synthetic η or
//!   a real dataset), verifiable on every GET; [`trace`]: real key traces to replay instead;
//! * [`targets`]: the caches, in-process and over the network; [`peers`]: starting and
//!   stopping memcached / redis;
//! * [`driver`]: the fill and look-aside loops; [`report`]: the table and JSON;
//! * [`sweep`] and [`plot`]: the paper's figures;
//! * [`hostile`]: well-behaved clients beside hostile ones against `zipcache serve`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

pub mod driver;
pub mod hostile;
pub mod pagecache;
pub mod peers;
pub mod plot;
pub mod procfs;
pub mod report;
pub mod sessions;
pub mod sweep;
pub mod targets;
pub mod trace;
pub mod values;
pub mod workload;

use report::TargetResult;
use targets::Budget;
use values::{Content, Dataset, Documents, MixedDocuments, SizeDist, ValueGen};
use workload::{HotPlacement, KeyChooser, Locality, OpMix};

/// Arguments of `zipcache bench` (SPEC §8).
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// Comma-separated: zipcache, foyer (LZ4 on its disk; foyer-zstd, foyer-none: its other
    /// compressions), segcache, memcached, memcached-ext, redis, zipcache-serve,
    /// zipcache-cluster (three `--cluster-mode on` nodes, the budget each), zipcache-node
    /// (one of them owning every slot) (started by the bench), or zipcache://H:P, memcached://H:P, redis://H:P, cluster://H:P[+H:P…] (a
    /// Redis Cluster's seed nodes) (already running).
    #[arg(long, default_value = "zipcache")]
    pub target: String,
    /// Write the results as a JSON array, one object per target.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub params: Params,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Run the paper's experiments and draw their figures (PNG + markdown table).
    Sweep(sweep::SweepArgs),
    /// Start `zipcache serve` and run well-behaved clients beside hostile ones (issue 20).
    Hostile(hostile::HostileArgs),
    /// Web sessions as Redis hashes in ZipCache and redis-server, same DRAM (issue 34).
    Sessions(sessions::SessionsArgs),
}

/// What the look-aside loop does, or whether to fill once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// GET; on a miss wait `--backend-latency-us`, then PUT (cachebench's look-aside loop).
    Lookaside,
    /// Insert keys 0..N-1 once, then report how many objects are resident.
    Fill,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Lookaside => "lookaside",
            Mode::Fill => "fill",
        }
    }
}

fn size_arg(text: &str) -> Result<u64, String> {
    zipcache::parse_size(text).map_err(|e| e.to_string())
}

pub(crate) fn setting_arg(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("--set takes NAME=VALUE, not {text:?}"))?;
    Ok((name.trim().to_string(), value.trim().to_string()))
}

/// The workload and budgets; also written as `workload` into every JSON result.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct Params {
    #[arg(long, value_enum, default_value = "lookaside")]
    pub mode: Mode,
    /// DRAM budget of every target.
    #[arg(long, default_value = "64MiB", value_parser = size_arg)]
    pub dram: u64,
    /// SSD budget of targets with a flash tier (zipcache, foyer, memcached-ext).
    #[arg(long, default_value = "1GiB", value_parser = size_arg)]
    pub ssd_size: u64,
    /// `--ssd none`: DRAM only.
    #[arg(long, value_parser = ["none"], conflicts_with = "ssd_size")]
    pub ssd: Option<String>,
    /// Where targets keep their files (a subdirectory per target, removed afterwards).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Engine setting NAME=VALUE for the zipcache target (repeatable).
    #[arg(long = "set", value_parser = setting_arg)]
    pub settings: Vec<(String, String)>,
    /// How the zipcache target's SSD tier compresses: host (packs blocks with LZ4) |
    /// hardware | none | emulate (physical figures emulated). A `--set` overrides it.
    #[arg(long, default_value = "host", value_parser = ["host", "hardware", "none", "emulate"])]
    pub device_compression: String,
    /// Number of distinct keys (ids 0..N-1).
    #[arg(long, conflicts_with = "working_set")]
    pub keys: Option<u64>,
    /// Working-set size in bytes; sets --keys to this / (key size + mean value size).
    #[arg(long, value_parser = size_arg)]
    pub working_set: Option<u64>,
    #[arg(long, default_value_t = 16)]
    pub key_size: usize,
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Value sizes as `SIZE WEIGHT` lines (overrides --value-size).
    #[arg(long)]
    pub value_size_file: Option<PathBuf>,
    /// Value sizes of overwrites (PUTs of a new version), as `SIZE WEIGHT` lines: each
    /// overwrite draws its own, so a key's value changes size; fills and look-aside misses
    /// keep --value-size / --value-size-file, so a fill and a later churn agree.
    #[arg(long)]
    pub overwrite_size_file: Option<PathBuf>,
    /// Compressibility of synthetic values: this fraction of each value is zeros.
    #[arg(long, default_value_t = 0.5)]
    pub eta: f64,
    /// `synthetic` (η-controlled), `json` (JSON documents of 256 B – 8 KiB built from the
    /// records of vega_datasets tables; sizes log-normal around 560 B unless
    /// --value-size-file), `json-mixed` (JSON documents of many schemas, the same sizes:
    /// objects and arrays cut out of the JSON files of the PyPI package botocore), or a
    /// real dataset of the PyPI package vega_datasets: airports, seattle-weather, stocks,
    /// cars, iris, ...
    #[arg(long, default_value = "synthetic")]
    pub values: String,
    /// strong (80% of requests to 8% of keys), moderate (20%), weak (64%), zero, zipf:S.
    #[arg(long, default_value = "moderate", value_parser = |s: &str| s.parse::<Locality>())]
    pub locality: Locality,
    #[arg(long, value_enum, default_value = "random")]
    pub hot: HotPlacement,
    #[arg(long, default_value_t = 1.0)]
    pub get_ratio: f64,
    #[arg(long, default_value_t = 0.0)]
    pub put_ratio: f64,
    #[arg(long, default_value_t = 0.0)]
    pub delete_ratio: f64,
    #[arg(long, default_value_t = 0.0)]
    pub scan_ratio: f64,
    /// Objects per SCAN.
    #[arg(long, default_value_t = 16)]
    pub scan_limit: usize,
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Measured operations (default 1,000,000 unless --duration is given).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Measured seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Look-aside open loop: offer this many requests per second (all threads together) as
    /// Poisson arrivals, and time each GET from its arrival, so a stall shows as latency
    /// (coordinated-omission corrected). Without it the loop is closed. Warm-up stays closed.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Operations before measuring starts (not in any figure).
    #[arg(long, default_value_t = 0)]
    pub warmup_ops: u64,
    /// Look-aside: time a miss waits for the backend before its PUT (paper: 1000).
    #[arg(long, default_value_t = 1000)]
    pub backend_latency_us: u64,
    /// Fill: after the fill's figures are taken, GET every key once (each value verified)
    /// and report the server's CPU per GET (`read_back`, `server_cpu_us_per_get`). The
    /// GETs change what the cache holds (promotions), so the figures come first.
    #[arg(long)]
    pub read_back: bool,
    /// Hard cap on any phase, so no run is unbounded.
    #[arg(long, default_value_t = 900.0)]
    pub time_limit: f64,
    /// Network targets: connections per bench thread.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// PID of the server behind a `zipcache://`, `memcached://` or `redis://` target, so the
    /// report's RSS (and server CPU) comes from /proc rather than from what the server
    /// says of itself (zipcache's `rss_bytes`, Redis's `used_memory_rss`; memcached says
    /// nothing). For one such target only.
    #[arg(long)]
    #[serde(skip)]
    pub server_pid: Option<u32>,
    /// Run every memcached-ext target a second time as `memcached-ext-nocache`, its
    /// extstore file's pages dropped from the page cache every 50 ms during the run, so its
    /// flash reads reach the disk as ZipCache's do; both rows are reported.
    #[arg(long)]
    pub drop_peer_page_cache: bool,
    /// Network targets: requests in flight per connection.
    #[arg(long, default_value_t = 16)]
    pub pipeline: usize,
    /// In-process targets (zipcache, foyer): `overlapped` splits each batch into
    /// --connections streams, as a network client does, and runs the streams' GETs through
    /// the engine's asynchronous API with their SSD reads in flight together; `serial`
    /// calls the synchronous API one request at a time.
    #[arg(long, value_enum, default_value = "overlapped")]
    pub in_process_gets: targets::InProcessGets,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay this key trace look-aside (every target, same sequence) instead of generating
    /// keys and ops; `.xz` files are decompressed. Needs --trace-format.
    #[arg(long, requires = "trace_format")]
    pub trace: Option<PathBuf>,
    /// caffeine-u32 / caffeine-u64 (big-endian integer keys), cachelib-kvcache, twitter.
    #[arg(long, value_enum, requires = "trace")]
    pub trace_format: Option<trace::TraceFormat>,
    /// Replay at most this many requests of the trace (warm-up included).
    #[arg(long, requires = "trace")]
    pub trace_limit: Option<u64>,
}

/// Measured operations when neither --ops nor --duration is given.
const DEFAULT_OPS: u64 = 1_000_000;
/// Keys when neither --keys nor --working-set is given.
const DEFAULT_KEYS: u64 = 1_000_000;

impl Params {
    fn value_gen(&self) -> Result<ValueGen, String> {
        let json = matches!(self.values.as_str(), "json" | "json-mixed");
        let sizes = match &self.value_size_file {
            Some(path) => SizeDist::from_file(path)?,
            None if json => Documents::sizes(),
            None if self.value_size == 0 => return Err("--value-size must be at least 1".into()),
            None => SizeDist::Fixed(self.value_size),
        };
        if !(0.0..=1.0).contains(&self.eta) {
            return Err(format!("--eta must be within 0..=1, not {}", self.eta));
        }
        if json && self.overwrite_size_file.is_some() {
            // A document ends at a record, so its length does not name its version.
            return Err(format!(
                "--overwrite-size-file does not apply to --values {}",
                self.values
            ));
        }
        let content = match self.values.as_str() {
            "synthetic" => Content::Synthetic { eta: self.eta },
            "json" => Content::Documents(Arc::new(Documents::load()?)),
            "json-mixed" => Content::MixedDocuments(Arc::new(MixedDocuments::load()?)),
            name => Content::Dataset(Arc::new(Dataset::load(name)?)),
        };
        Ok(ValueGen {
            sizes,
            content,
            seed: self.seed,
            overwrite_sizes: self
                .overwrite_size_file
                .as_deref()
                .map(SizeDist::from_file)
                .transpose()?,
        })
    }

    pub fn ssd_budget(&self) -> Option<u64> {
        self.ssd.is_none().then_some(self.ssd_size)
    }

    fn check_rate(&self) -> Result<(), String> {
        match self.rate {
            Some(rate) if !(rate.is_finite() && rate > 0.0) => Err(format!(
                "--rate must be a positive number of requests per second, not {rate}"
            )),
            Some(_) if self.mode != Mode::Lookaside => {
                Err("--rate offers look-aside requests; --mode fill does not apply".into())
            }
            _ => Ok(()),
        }
    }

    /// Reads `--trace` and checks the flags that go with it.
    fn load_trace(&self) -> Result<Option<trace::Trace>, String> {
        let (Some(path), Some(format)) = (&self.trace, self.trace_format) else {
            return Ok(None);
        };
        if self.mode != Mode::Lookaside {
            return Err("--trace replays look-aside; --mode fill does not apply".into());
        }
        if self.ops.is_some() {
            return Err("--ops does not apply to --trace (use --trace-limit)".into());
        }
        let trace = trace::Trace::load(path, format, self.key_size, self.trace_limit)?;
        if self.warmup_ops >= trace.len() {
            return Err(format!(
                "--warmup-ops {} leaves nothing to measure of the {} requests replayed",
                self.warmup_ops,
                trace.len()
            ));
        }
        eprintln!(
            "trace {}: {} requests, {} unique keys{}",
            path.display(),
            trace.len(),
            trace.unique_keys(),
            match trace.skipped {
                0 => String::new(),
                n => format!(", {n} requests of unreplayed operations skipped"),
            }
        );
        Ok(Some(trace))
    }

    /// Resolves the parameters into a runnable workload.
    pub fn workload(&self) -> Result<driver::Workload, String> {
        let values = self.value_gen()?;
        if let Some(trace) = self.load_trace()? {
            return self.trace_workload(trace, values);
        }
        let mean_object = self.key_size as f64 + values.sizes.mean();
        let keys = match (self.keys, self.working_set) {
            (Some(keys), _) => keys,
            (None, Some(bytes)) => (bytes as f64 / mean_object) as u64,
            (None, None) => DEFAULT_KEYS,
        };
        if keys == 0 {
            return Err("the working set holds no key".into());
        }
        if workload::digits(keys - 1) > self.key_size {
            return Err(format!(
                "--key-size {} is too short for {keys} keys (needs {} digits)",
                self.key_size,
                workload::digits(keys - 1)
            ));
        }
        if self.threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        self.check_rate()?;
        let limit = Duration::from_secs_f64(self.time_limit.max(0.001));
        Ok(driver::Workload {
            keys,
            key_size: self.key_size,
            chooser: KeyChooser::new(keys, self.locality, self.hot, self.seed)?,
            values,
            mix: OpMix::new(
                self.get_ratio,
                self.put_ratio,
                self.delete_ratio,
                self.scan_ratio,
            )?,
            scan_limit: self.scan_limit,
            threads: self.threads,
            ops: match (self.ops, self.duration) {
                (None, None) => Some(DEFAULT_OPS),
                (ops, _) => ops,
            },
            duration: self
                .duration
                .map_or(limit, |d| Duration::from_secs_f64(d.max(0.0)).min(limit)),
            warmup_ops: self.warmup_ops,
            backend_latency: Duration::from_micros(self.backend_latency_us),
            seed: self.seed,
            trace: None,
            trace_cursor: 0.into(),
            rate: self.rate,
            read_back: self.read_back,
        })
    }

    /// A workload replaying `trace`: keys are its dense ids, sizes its own where it records
    /// them (the --value-size distribution elsewhere), ops its own.
    fn trace_workload(
        &self,
        mut trace: trace::Trace,
        mut values: ValueGen,
    ) -> Result<driver::Workload, String> {
        if self.threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        self.check_rate()?;
        let sizes = std::mem::take(&mut trace.sizes);
        if sizes.iter().any(|s| *s > 0) {
            values.sizes = SizeDist::per_key(sizes, values.sizes, self.seed);
        }
        let limit = Duration::from_secs_f64(self.time_limit.max(0.001));
        Ok(driver::Workload {
            keys: trace.unique_keys(),
            key_size: self.key_size,
            chooser: KeyChooser::new(1, Locality::Uniform, self.hot, self.seed)?,
            values,
            mix: OpMix::new(1.0, 0.0, 0.0, 0.0)?,
            scan_limit: self.scan_limit,
            threads: self.threads,
            ops: Some(trace.len() - self.warmup_ops),
            duration: self
                .duration
                .map_or(limit, |d| Duration::from_secs_f64(d.max(0.0)).min(limit)),
            warmup_ops: self.warmup_ops,
            backend_latency: Duration::from_micros(self.backend_latency_us),
            seed: self.seed,
            trace: Some(Arc::new(trace)),
            trace_cursor: 0.into(),
            rate: self.rate,
            read_back: self.read_back,
        })
    }

    fn budget(&self, data_dir: PathBuf, w: &driver::Workload) -> Budget {
        Budget {
            dram: self.dram,
            ssd: self.ssd_budget(),
            data_dir,
            mean_object: self.key_size + w.values.sizes.mean().ceil() as usize,
            settings: self
                .ssd_budget()
                .map(|_| {
                    (
                        "device_compression".to_string(),
                        self.device_compression.clone(),
                    )
                })
                .into_iter()
                .chain(self.settings.iter().cloned())
                .collect(),
            threads: self.threads,
            connections: self.connections,
            pipeline: self.pipeline,
            in_process_gets: self.in_process_gets,
            server_pid: self.server_pid,
        }
    }
}

fn progress_bar(target: &str, total: Option<u64>) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(total) => ProgressBar::new(total).with_style(
            ProgressStyle::with_template("{prefix:>14} {wide_bar} {pos}/{len} {per_sec} eta {eta}")
                .expect("valid template"),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{prefix:>14} {spinner} {pos} ops {per_sec} {elapsed}")
                .expect("valid template"),
        ),
    };
    bar.with_prefix(target.to_string())
}

/// Lets Ctrl-C stop the load loops so started peers are stopped on the way out.
fn stop_on_ctrl_c() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // A host program may own SIGINT already; then Ctrl-C ends the process as usual
        // and the peers, in our process group, get the same SIGINT.
        let _ =
            ctrlc::set_handler(|| driver::STOP.store(true, std::sync::atomic::Ordering::Relaxed));
    });
}

/// Where targets keep files: `--data-dir` or a fresh directory under the system temp dir.
fn data_root(params: &Params) -> PathBuf {
    params.data_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("zipcache-bench-{}", std::process::id()))
    })
}

/// Runs the workload against one target: opens (or starts) it, loads, reports, closes.
pub fn run_target(
    spec: &str,
    params: &Params,
    w: &driver::Workload,
) -> Result<TargetResult, String> {
    let dir_name: String = spec
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = data_root(params).join(dir_name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let target = match targets::open(spec, &params.budget(dir.clone(), w)) {
        Ok(target) => target,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let total = match params.mode {
        Mode::Fill => Some(w.keys),
        Mode::Lookaside => w.ops,
    };
    let bar = progress_bar(spec, total);
    let run = match params.mode {
        Mode::Fill => driver::fill(target.as_ref(), w, &bar),
        Mode::Lookaside => driver::lookaside(target.as_ref(), w, &bar),
    };
    bar.finish_and_clear();
    let dram_only = target.dram_only();
    let closed = target.close();
    // Only the per-target directory this function created is removed.
    let _ = std::fs::remove_dir_all(&dir);
    let mut result = TargetResult::new(spec, dram_only, run?, params);
    if let (Some(trace), Some(path)) = (&w.trace, &params.trace) {
        result.trace = Some(trace.summary(path));
    }
    closed?;
    Ok(result)
}

/// The targets of `--target` in order; with `drop_page_cache`, each memcached-ext followed by
/// its run with the page cache dropped, which never runs instead of the cached one.
fn expand_targets(list: &str, drop_page_cache: bool) -> Result<Vec<String>, String> {
    let mut specs = Vec::new();
    for spec in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if spec == targets::network::NOCACHE {
            return Err(format!(
                "{spec} runs only beside memcached-ext: --target memcached-ext \
                 --drop-peer-page-cache"
            ));
        }
        specs.push(spec.to_string());
        if drop_page_cache && spec == "memcached-ext" {
            specs.push(targets::network::NOCACHE.to_string());
        }
    }
    Ok(specs)
}

/// Runs every target of `list` with the same workload; a target that fails is reported and
/// the others still run.
pub fn run_all(list: &str, params: &Params) -> (Vec<TargetResult>, Vec<String>) {
    stop_on_ctrl_c();
    let mut results = Vec::new();
    let mut failures = Vec::new();
    let w = match params.workload() {
        Ok(w) => w,
        Err(e) => return (results, vec![e]),
    };
    let remotes = list.split(',').filter(|s| s.contains("://")).count();
    if params.server_pid.is_some() && remotes != 1 {
        return (
            results,
            vec![format!(
                "--server-pid names the server of one zipcache://, memcached:// or redis:// \
                 target; --target lists {remotes}"
            )],
        );
    }
    let specs = match expand_targets(list, params.drop_peer_page_cache) {
        Ok(specs) => specs,
        Err(e) => return (results, vec![e]),
    };
    for spec in specs {
        if driver::STOP.load(std::sync::atomic::Ordering::Relaxed) {
            failures.push("interrupted".into());
            break;
        }
        match run_target(&spec, params, &w) {
            Ok(result) => {
                if result.wrong_values > 0 {
                    eprintln!(
                        "!!! {spec}: {} GETs returned a WRONG VALUE (not what was stored)",
                        result.wrong_values
                    );
                    failures.push(format!("{spec}: {} wrong values", result.wrong_values));
                }
                results.push(result);
            }
            Err(e) => {
                eprintln!("{spec}: {e}");
                failures.push(format!("{spec}: {e}"));
            }
        }
    }
    if params.data_dir.is_none() {
        let _ = std::fs::remove_dir(data_root(params));
    }
    (results, failures)
}

/// Runs `zipcache bench`; the error is the message printed to the operator.
pub fn run(args: BenchArgs) -> Result<(), String> {
    match args.command {
        Some(BenchCommand::Sweep(sweep_args)) => return sweep::run(&sweep_args),
        Some(BenchCommand::Hostile(hostile_args)) => return hostile::run(&hostile_args),
        Some(BenchCommand::Sessions(sessions_args)) => return sessions::run(&sessions_args),
        None => {}
    }
    let (results, failures) = run_all(&args.target, &args.params);
    if !results.is_empty() {
        print!("{}", report::table(&results));
    }
    if let Some(path) = &args.json {
        report::write_json(path, &results)?;
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}
