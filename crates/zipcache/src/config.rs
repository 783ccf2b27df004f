//! Engine configuration: every tunable of the paper's design, with the defaults of SPEC §7–8.
//!
//! `Config::set(name, value)` is what `--set NAME=VALUE` on the command line and the keys of
//! a TOML config file go through, so the engine, the server and the bench agree on names.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

pub use zipcache_device::DeviceCompression;

use crate::dictionary::training::{MIN_BUDGET, TrainingSettings};
use crate::dram::early_termination::MAX_CHUNKS;
use crate::error::{Error, Result};
use crate::record::max_inline_record;

/// The smallest `dram_capacity` an engine takes.
pub(crate) const MIN_DRAM_CAPACITY: u64 = 64 << 10;
/// 1 PiB: beyond any machine, and far inside the signed arithmetic of the budget.
pub(crate) const MAX_DRAM_CAPACITY: u64 = 1 << 50;

/// Wall-clock milliseconds since the Unix epoch. Injectable so tests can move time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> u64;
}

/// The system's clock, or the instant a [`PinnedNow`] holds on this thread.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        match PINNED.get() {
            Pin::Off => system_now_ms(),
            Pin::Armed => {
                let now = system_now_ms();
                PINNED.set(Pin::At(now));
                now
            }
            Pin::At(now) => now,
        }
    }
}

fn system_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Whether [`SystemClock`] answers a pinned instant on this thread.
#[derive(Clone, Copy)]
enum Pin {
    Off,
    /// A [`PinnedNow`] lives, and the clock was not read since: the first read fixes it.
    Armed,
    At(u64),
}

thread_local! {
    static PINNED: Cell<Pin> = const { Cell::new(Pin::Off) };
}

/// One instant for everything a request does: while it lives, [`SystemClock`] answers
/// on this thread the time it first read, as a Redis command sees one time
/// (`commandTimeSnapshot`). A server request then reads the clock once, not once per
/// engine call (a clock read costs tens of nanoseconds on a virtual machine, and an
/// HSET or HGET of a large hash's field makes three or four), and not at all if nothing
/// asks. A pin made while one lives keeps the outer one's instant. Other threads, and
/// the engine's own, read the clock as it runs.
#[must_use = "the time is pinned only while the guard lives"]
pub struct PinnedNow {
    outermost: bool,
}

impl PinnedNow {
    pub fn pin() -> PinnedNow {
        let outermost = matches!(PINNED.get(), Pin::Off);
        if outermost {
            PINNED.set(Pin::Armed);
        }
        PinnedNow { outermost }
    }
}

impl Drop for PinnedNow {
    fn drop(&mut self) {
        if self.outermost {
            PINNED.set(Pin::Off);
        }
    }
}

/// Where the SSD tier lives.
#[derive(Clone, Debug)]
pub struct SsdConfig {
    /// File (sparse, created if missing) or block device holding the SSD tier.
    pub path: PathBuf,
    /// Logical size of the SSD tier in bytes.
    pub size: u64,
    /// Open the device with `O_DIRECT` so the page cache never serves "SSD" reads.
    pub direct_io: bool,
    pub device_compression: DeviceCompression,
    /// Logical capacity / physical capacity of the emulated compressing SSD.
    pub logical_to_physical: f64,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// Every DRAM byte the cache holds is charged against this.
    pub dram_capacity: u64,
    /// `None` runs DRAM-only (`--ssd none`): evicted leaves are dropped.
    pub ssd: Option<SsdConfig>,
    /// Logical size of a BT_DRAM leaf page.
    pub leaf_size: usize,
    /// Hash-partitioned sub-pages per DRAM leaf (`n`).
    pub subpages: usize,
    /// Independent LZ4 blocks a DRAM page's body is compressed in, each of a run of
    /// whole sub-pages: a GET decodes one, through its sub-page (1: the paper's page).
    /// More chunks trade objects held for CPU per GET (docs/RESULTS.md, G3, and the
    /// history's "A page in chunks": with 2, about a fifth less server CPU per GET of
    /// real rows for 1–3 % fewer objects).
    pub page_chunks: usize,
    /// Size of a BT_SSD super-leaf (`m` × 4 KiB).
    pub superleaf_size: usize,
    /// Under-filling threshold `T` of SSD sub-pages.
    pub fill_threshold: f64,
    /// Per-page write buffer limit in bytes.
    pub write_buffer: usize,
    /// Adaptive compression bypassing: hot if access > mean + r·stddev; 0 turns it off.
    pub bypass_r: f64,
    /// Most DRAM the uncompressed hot sub-tier may take, as a fraction of `dram_capacity`.
    pub bypass_max_fraction: f64,
    /// Objects (key + value) smaller than this are tiny and live inside the page.
    pub tiny_max: usize,
    /// Objects up to this size are medium (compressed one by one); larger ones are large.
    pub medium_max: usize,
    pub max_key_size: usize,
    pub max_value_size: usize,
    /// Background threads merging write buffers (eviction has its own flusher thread).
    pub background_threads: usize,
    /// With an SSD tier: how long a writer that finds DRAM over budget waits for the
    /// flusher before dropping cold objects unwritten (`ssd_write_drops`). Larger trades
    /// write latency under overload for fewer forgotten objects.
    pub flush_wait_ms: u64,
    /// Which SSD hits are copied into DRAM.
    pub promotion: Promotion,
    /// With an SSD tier: keep a 128-bit presence filter per SSD sub-page in DRAM
    /// (`ssd/presence.rs`), so that a GET of a key its sub-page does not hold reads
    /// nothing. Off by default: it costs 16 bytes of DRAM per sub-page, about one byte
    /// per SSD object with the default geometry and 64-byte values, which doubles the SSD
    /// index (0.91 → 1.85 B per object, docs/RESULTS.md) — at a large SSD-to-DRAM ratio,
    /// DRAM taken from the objects. Worth it where many GETs miss both tiers, or where
    /// many writes are of new keys: the crash journal marks only writes of keys a filter
    /// does not rule out, so a fill of new keys no longer fills its table.
    pub ssd_presence_filters: bool,
    /// With `device_compression=host` and `dictionaries`: pack SSD blocks with zstd and a
    /// block dictionary trained on the records the flusher writes (`ssd/dictionary.rs`),
    /// persisted beside the SSD file. Off by default: real text holds 2–2.4× LZ4's
    /// records per block, but training and the prepared forms (about 1.2 MB per
    /// dictionary) are charged to the DRAM budget, and at 16 MiB a fill of η = 0.5 values
    /// — where no dictionary is taken — dropped 3× the objects (docs/RESULTS.md, "Fourth
    /// part"). Worth it where the values are text and the SSD, not DRAM, is the limit.
    pub ssd_dictionaries: bool,
    /// Resident memory (bytes) the process should stay within: while RSS is above it the
    /// engine withholds the excess from `dram_capacity` (`rss_governor.rs`); 0 = off.
    /// For a process that is mostly the cache, such as `zipcache serve`.
    pub rss_limit: u64,
    /// Keep memcached's per-object access state (fetched bit, last access time) for the
    /// objects in DRAM, reported in `Item::access`. Off by default: it costs about 15
    /// bytes per DRAM object (a 12-byte stamp and its share of the tables beside the
    /// leaves' pages), which a leaf's dense page otherwise avoids.
    pub track_access: bool,
    /// Where the crash journal lives (`restart/shadow.rs`, `restart/journal.rs`): a
    /// directory in tmpfs, so it survives the process (kill -9, an OOM kill, a panic) and
    /// not a reboot. With an SSD tier, a restart after a crash then keeps the flash tier
    /// warm, never serving a version that was overwritten, deleted or flushed before the
    /// crash. `None` (`crash_journal=off`): a crash restarts cold.
    pub crash_journal: Option<PathBuf>,
    /// Bytes of the journal's shadow table (8 per fingerprint of a key whose newest state
    /// is in DRAM only and whose older version the SSD tier may hold), charged to
    /// `dram_capacity`; 0: 1/16 of `dram_capacity`, at
    /// least 16 KiB. A table that fills up makes the next crash restart cold.
    pub crash_journal_bytes: u64,
    /// Compress medium objects with zstd dictionaries trained in the background on recent
    /// values (true); false keeps LZ4 alone for every medium object.
    pub dictionaries: bool,
    /// Bytes of a trained dictionary; 0 sizes it from the budget (1/256 of it, 32 to 112
    /// KiB) and trains none below 8 MiB, where its prepared forms would crowd out the
    /// objects. Set, dictionaries are trained at any budget (the tests force them on
    /// small budgets with dictionaries of a few KiB).
    pub dictionary_size: usize,
    /// Medium values the training reservoir keeps; 0 keeps one per 32 KiB of budget (up
    /// to 2,048). A window of writes this long yields the first dictionary.
    pub dictionary_samples: usize,
    /// Make room for new objects by evicting old ones. Off (memcached `-M`, Redis
    /// `noeviction`), a write that finds the DRAM budget full is refused with
    /// [`Error::OutOfMemory`] and nothing is ever forgotten; DRAM-only.
    pub evictions: bool,
    pub clock: Arc<dyn Clock>,
}

/// Which SSD-tier hits inclusive caching copies into DRAM (setting `promotion`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promotion {
    /// Every tiny or medium SSD hit, as in the paper.
    EveryHit,
    /// A key's second SSD hit within a short window ([`crate::promotion`]): DRAM then
    /// holds fewer clean copies and more dirty objects, which cuts SSD writes at the
    /// price of some DRAM hits (an SSD hit instead).
    SecondHit,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dram_capacity: 1 << 30,
            ssd: None,
            leaf_size: 4096,
            subpages: 16,
            page_chunks: 2,
            superleaf_size: 64 << 10,
            fill_threshold: 0.75,
            write_buffer: 256,
            bypass_r: 3.0,
            bypass_max_fraction: 0.05,
            tiny_max: 128,
            medium_max: 2048,
            max_key_size: 250,
            max_value_size: 1 << 20,
            background_threads: 1,
            flush_wait_ms: 2,
            promotion: Promotion::EveryHit,
            ssd_presence_filters: false,
            ssd_dictionaries: false,
            rss_limit: 0,
            track_access: false,
            crash_journal: Some(PathBuf::from("/dev/shm")),
            crash_journal_bytes: 0,
            dictionaries: true,
            dictionary_size: 0,
            dictionary_samples: 0,
            evictions: true,
            clock: Arc::new(SystemClock),
        }
    }
}

/// Parses `4096`, `4KiB`, `64MiB`, `1GiB`, `2TiB` (also `K`, `KB`, `M`, `MB`, ... as powers of 1024).
pub fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: f64 = number
        .parse()
        .map_err(|_| Error::Config(format!("not a size: {text:?}")))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(Error::Config(format!("unknown size unit in {text:?}"))),
    };
    let bytes = number * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(Error::Config(format!("size out of range: {text:?}")));
    }
    Ok(bytes as u64)
}

fn parse_f64(name: &str, value: &str) -> Result<f64> {
    value
        .trim()
        .parse()
        .map_err(|_| Error::Config(format!("{name}: not a number: {value:?}")))
}

fn parse_bool(name: &str, value: &str) -> Result<bool> {
    match value.trim() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        other => Err(Error::Config(format!(
            "{name} must be true or false, not {other:?}"
        ))),
    }
}

fn parse_usize(name: &str, value: &str) -> Result<usize> {
    let v = parse_size(value).map_err(|e| Error::Config(format!("{name}: {e}")))?;
    usize::try_from(v).map_err(|_| Error::Config(format!("{name}: too large")))
}

impl Config {
    /// The setting names `--set NAME=VALUE` accepts.
    pub const SETTINGS: &'static [&'static str] = &[
        "dram",
        "leaf_size",
        "subpages",
        "page_chunks",
        "superleaf_size",
        "fill_threshold",
        "write_buffer",
        "bypass_r",
        "bypass_max_fraction",
        "tiny_max",
        "medium_max",
        "max_key_size",
        "max_value_size",
        "background_threads",
        "flush_wait_ms",
        "rss_limit",
        "promotion",
        "ssd_presence_filters",
        "ssd_dictionaries",
        "track_access",
        "crash_journal",
        "crash_journal_bytes",
        "dictionaries",
        "dictionary_size",
        "dictionary_samples",
        "evictions",
        "device_compression",
        "direct_io",
        "logical_to_physical",
    ];

    /// Applies one `NAME=VALUE` setting. SSD-only settings are kept for when an SSD is set.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        match name {
            "dram" | "dram_capacity" => self.dram_capacity = parse_size(value)?,
            "leaf_size" => self.leaf_size = parse_usize(name, value)?,
            "subpages" => self.subpages = parse_usize(name, value)?,
            "page_chunks" => self.page_chunks = parse_usize(name, value)?,
            "superleaf_size" => self.superleaf_size = parse_usize(name, value)?,
            "fill_threshold" => self.fill_threshold = parse_f64(name, value)?,
            "write_buffer" => self.write_buffer = parse_usize(name, value)?,
            "bypass_r" => self.bypass_r = parse_f64(name, value)?,
            "bypass_max_fraction" => self.bypass_max_fraction = parse_f64(name, value)?,
            "tiny_max" => self.tiny_max = parse_usize(name, value)?,
            "medium_max" => self.medium_max = parse_usize(name, value)?,
            "max_key_size" => self.max_key_size = parse_usize(name, value)?,
            "max_value_size" => self.max_value_size = parse_usize(name, value)?,
            "background_threads" => self.background_threads = parse_usize(name, value)?,
            "flush_wait_ms" => self.flush_wait_ms = parse_usize(name, value)? as u64,
            "rss_limit" => self.rss_limit = parse_size(value)?,
            "track_access" => self.track_access = parse_bool(name, value)?,
            "crash_journal" => {
                self.crash_journal = match value.trim() {
                    "off" | "" => None,
                    dir => Some(PathBuf::from(dir)),
                }
            }
            "crash_journal_bytes" => self.crash_journal_bytes = parse_size(value)?,
            "dictionaries" => self.dictionaries = parse_bool(name, value)?,
            "dictionary_size" => self.dictionary_size = parse_usize(name, value)?,
            "dictionary_samples" => self.dictionary_samples = parse_usize(name, value)?,
            "evictions" => self.evictions = parse_bool(name, value)?,
            "ssd_presence_filters" => self.ssd_presence_filters = parse_bool(name, value)?,
            "ssd_dictionaries" => self.ssd_dictionaries = parse_bool(name, value)?,
            "promotion" => {
                self.promotion = match value.trim() {
                    "every_hit" => Promotion::EveryHit,
                    "second_hit" => Promotion::SecondHit,
                    other => {
                        return Err(Error::Config(format!(
                            "promotion must be every_hit or second_hit, not {other:?}"
                        )));
                    }
                }
            }
            "device_compression" => {
                let mode = match value.trim() {
                    "host" => DeviceCompression::Host,
                    "emulate" => DeviceCompression::Emulate,
                    "none" => DeviceCompression::None,
                    "hardware" => DeviceCompression::Hardware,
                    other => {
                        return Err(Error::Config(format!(
                            "device_compression must be host, hardware, none or emulate, not {other:?}"
                        )));
                    }
                };
                self.ssd_mut()?.device_compression = mode;
            }
            "direct_io" => {
                let on = parse_bool(name, value)?;
                self.ssd_mut()?.direct_io = on;
            }
            "logical_to_physical" => {
                self.ssd_mut()?.logical_to_physical = parse_f64(name, value)?;
            }
            _ => {
                return Err(Error::Config(format!(
                    "unknown setting {name:?}; known: {}",
                    Self::SETTINGS.join(", ")
                )));
            }
        }
        Ok(())
    }

    fn ssd_mut(&mut self) -> Result<&mut SsdConfig> {
        self.ssd
            .as_mut()
            .ok_or_else(|| Error::Config("this setting needs an SSD tier".into()))
    }

    /// Rejects settings the engine cannot run with, before anything is allocated.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(msg));
        if !(1024..=1 << 20).contains(&self.leaf_size) {
            return bad(format!(
                "leaf_size {} must be within 1 KiB..1 MiB",
                self.leaf_size
            ));
        }
        if self.subpages == 0
            || self.subpages > 256
            || !self.leaf_size.is_multiple_of(self.subpages)
        {
            return bad(format!(
                "subpages {} must be 1..=256 and divide leaf_size {}",
                self.subpages, self.leaf_size
            ));
        }
        if self.page_chunks == 0 || self.page_chunks > self.subpages.min(MAX_CHUNKS) {
            return bad(format!(
                "page_chunks {} must be 1..={} (at most subpages, {})",
                self.page_chunks, MAX_CHUNKS, self.subpages
            ));
        }
        if self.tiny_max > self.medium_max {
            return bad("tiny_max must not exceed medium_max".into());
        }
        if self.max_key_size == 0 || self.max_key_size > 255 {
            return bad(format!(
                "max_key_size {} must be 1..=255",
                self.max_key_size
            ));
        }
        // A page must hold the largest in-page record: a tiny object with its metadata,
        // or a medium pointer with the longest key.
        let largest_record = max_inline_record(self.tiny_max, self.max_key_size);
        if largest_record > self.leaf_size {
            return bad(format!(
                "a leaf of {} B cannot hold a {} B record; raise leaf_size or lower tiny_max or max_key_size",
                self.leaf_size, largest_record
            ));
        }
        if self.dictionary_size != 0 && !(1024..=1 << 20).contains(&self.dictionary_size) {
            return bad("dictionary_size must be 0 (from the budget) or 1 KiB..1 MiB".into());
        }
        if self.dictionary_samples != 0 && !(8..=16_384).contains(&self.dictionary_samples) {
            return bad("dictionary_samples must be 0 (from the budget) or 8..=16384".into());
        }
        if self.max_value_size == 0 || self.max_value_size > 1 << 30 {
            return bad("max_value_size must be within 1 B..1 GiB".into());
        }
        if self.dram_capacity < MIN_DRAM_CAPACITY {
            return bad(format!(
                "dram_capacity {} is below 64 KiB",
                self.dram_capacity
            ));
        }
        if self.dram_capacity > MAX_DRAM_CAPACITY {
            return bad(format!(
                "dram_capacity {} is above 1 PiB",
                self.dram_capacity
            ));
        }
        if !(self.bypass_r >= 0.0 && self.bypass_r.is_finite()) {
            return bad("bypass_r must be >= 0".into());
        }
        if !(0.0..=0.5).contains(&self.bypass_max_fraction) {
            return bad("bypass_max_fraction must be within 0..=0.5".into());
        }
        if self.background_threads == 0 || self.background_threads > 64 {
            return bad("background_threads must be 1..=64".into());
        }
        if let Some(ssd) = &self.ssd {
            if self.superleaf_size < 4096
                || !self.superleaf_size.is_multiple_of(4096)
                || self.superleaf_size > 1 << 20
            {
                return bad("superleaf_size must be a multiple of 4 KiB up to 1 MiB".into());
            }
            if !(self.fill_threshold > 0.1 && self.fill_threshold <= 1.0) {
                return bad("fill_threshold must be within (0.1, 1]".into());
            }
            if ssd.size < 16 * self.superleaf_size as u64 {
                return bad("ssd size must hold at least 16 super-leaves".into());
            }
            if !(ssd.logical_to_physical >= 1.0 && ssd.logical_to_physical <= 64.0) {
                return bad("logical_to_physical must be within 1..=64".into());
            }
        }
        Ok(())
    }
}

impl Config {
    /// Buckets of the crash journal's shadow table (64 bytes each).
    pub(crate) fn shadow_buckets(&self) -> usize {
        let bytes = match self.crash_journal_bytes {
            0 => (self.dram_capacity / 16).max(16 << 10),
            set => set,
        };
        (bytes / 64).max(1) as usize
    }

    /// Bytes the crash journal's shadow table takes with these settings (a restart that
    /// carries many hidden keys over may make it larger): for the start-up banner.
    pub fn crash_journal_table_bytes(&self) -> u64 {
        ((crate::format::shadow::HEADER_WORDS
            + self.shadow_buckets() * crate::restart::shadow::SLOTS)
            * 8) as u64
    }

    /// The dictionaries' training settings this configuration asks for: with `dictionary_samples` and `dictionary_size` 0, a
    /// reservoir of one sample per 32 KiB of budget (at most 2,048 of at most 1 KiB) and
    /// a dictionary of 1/256 of the budget (32 to 112 KiB), none below [`MIN_BUDGET`];
    /// either set, dictionaries at any budget. `None` with `dictionaries` off.
    pub(crate) fn training_settings(&self) -> Option<TrainingSettings> {
        let budget = self.dram_capacity;
        let chosen = self.dictionary_samples != 0 || self.dictionary_size != 0;
        (self.dictionaries && (chosen || budget >= MIN_BUDGET)).then(|| TrainingSettings {
            samples: match self.dictionary_samples {
                0 => (budget / (32 << 10)).clamp(8, 2048) as usize,
                samples => samples,
            },
            dictionary_size: match self.dictionary_size {
                0 => (budget / 256).clamp(32 << 10, 112 << 10) as usize,
                size => size,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pinned instant holds on its thread until the outermost pin goes, and nowhere
    /// else.
    #[test]
    fn a_pinned_instant_holds_on_its_thread_until_the_outer_pin_goes() {
        let clock = SystemClock;
        let outer = PinnedNow::pin();
        let pinned = clock.now_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(clock.now_ms(), pinned);
        let elsewhere = std::thread::spawn(|| SystemClock.now_ms()).join().unwrap();
        assert!(elsewhere >= pinned + 20, "{elsewhere} against {pinned}");
        {
            let _inner = PinnedNow::pin();
            assert_eq!(clock.now_ms(), pinned);
        }
        assert_eq!(
            clock.now_ms(),
            pinned,
            "an inner pin keeps the outer instant"
        );
        drop(outer);
        assert!(clock.now_ms() >= pinned + 20);
    }

    /// A pin fixes the time of the first read made under it, not its own: a request
    /// that waited before it asked sees the time it asked.
    #[test]
    fn a_pin_fixes_the_time_of_its_first_read() {
        let _pin = PinnedNow::pin();
        let pinned_at = system_now_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let first = SystemClock.now_ms();
        assert!(first >= pinned_at + 20, "{first} against {pinned_at}");
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(SystemClock.now_ms(), first);
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn set_accepts_spec_names_and_rejects_unknown() {
        let mut c = Config::default();
        c.set("leaf_size", "4KiB").unwrap();
        c.set("subpages", "16").unwrap();
        c.set("write_buffer", "128").unwrap();
        c.set("bypass_r", "0").unwrap();
        c.set("medium_max", "2KiB").unwrap();
        c.set("track_access", "true").unwrap();
        assert!(c.track_access);
        c.set("evictions", "false").unwrap();
        assert!(!c.evictions);
        assert!(c.set("track_access", "maybe").is_err());
        assert_eq!(c.write_buffer, 128);
        assert_eq!(c.bypass_r, 0.0);
        assert!(c.set("no_such_thing", "1").is_err());
        assert!(
            c.set("device_compression", "emulate").is_err(),
            "needs an SSD"
        );
        c.validate().unwrap();
    }

    #[test]
    fn validate_rejects_unworkable_layouts() {
        let mut c = Config {
            leaf_size: 1024,
            tiny_max: 1024,
            medium_max: 2048,
            ..Config::default()
        };
        assert!(
            c.validate().is_err(),
            "a 1 KiB leaf cannot hold a 1 KiB tiny object and its header"
        );
        c = Config {
            subpages: 64,
            ..Config::default()
        };
        c.validate()
            .expect("sub-pages have no size of their own: 64 of them hold 250 B keys");
        c.subpages = 3;
        assert!(c.validate().is_err());
        for (subpages, chunks, ok) in [
            (16, 1, true),
            (16, 16, true),
            (16, 0, false),
            (2, 4, false),
            (64, 17, false),
        ] {
            let c = Config {
                subpages,
                page_chunks: chunks,
                ..Config::default()
            };
            assert_eq!(
                c.validate().is_ok(),
                ok,
                "{subpages} sub-pages in {chunks} chunks"
            );
        }
        let c = Config {
            dram_capacity: 1000,
            ..Config::default()
        };
        assert!(c.validate().is_err());
        for (name, bad, good) in [
            ("dictionary_size", "100", "4KiB"),
            ("dictionary_size", "2MiB", "0"),
            ("dictionary_samples", "3", "32"),
            ("dictionary_samples", "100000", "0"),
        ] {
            let mut c = Config::default();
            c.set(name, bad).unwrap();
            assert!(c.validate().is_err(), "{name}={bad}");
            c.set(name, good).unwrap();
            c.validate().unwrap();
        }
    }
}
