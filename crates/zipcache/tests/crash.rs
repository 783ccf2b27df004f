//! Crashes with real process kills: a child process runs the engine on a file with its
//! crash journal and writes, overwrites, deletes, touches and flushes at random,
//! printing each operation before it starts and after it returns; the parent kills it
//! with SIGKILL at a random moment (now and then it lets it close cleanly instead), and
//! the next child, opening the same files, first prints what every key reads. Every
//! answer is checked against a model of the acknowledged operations: a miss is allowed,
//! a value overwritten, deleted, expired or flushed before the kill never. The tier must
//! also come back warm: most keys the model holds must be served.
//!
//! `ZIPCACHE_CRASH_ROUNDS` sets the number of kills (default 12). With
//! `ZIPCACHE_CRASH_KEEP` set, the files as each of the last two children found them are
//! kept (`<dir>.round-N`), so that a failure's state can be opened again and examined.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zipcache::config::DeviceCompression;
use zipcache::{Config, PutOptions, SsdConfig, Update, ZipCache};

const KEYS: u32 = 6000;
/// Set in the child's environment: the directory of the cache files.
const CHILD_DIR: &str = "ZIPCACHE_CRASH_CHILD_DIR";
/// Set in the child's environment: close cleanly after this many operations.
const CHILD_OPS: &str = "ZIPCACHE_CRASH_CHILD_OPS";
const CHILD_SEED: &str = "ZIPCACHE_CRASH_CHILD_SEED";

/// The engine every child runs; `presence_filters` for half the children (by seed): with
/// them, writes of keys the SSD tier certainly does not hold are not marked in the crash
/// journal.
fn config(dir: &Path, presence_filters: bool) -> Config {
    Config {
        ssd_presence_filters: presence_filters,
        dram_capacity: 512 << 10,
        superleaf_size: 16 << 10,
        ssd: Some(SsdConfig {
            path: dir.join("ssd.bin"),
            size: 48 << 20,
            direct_io: true,
            device_compression: DeviceCompression::Host,
            logical_to_physical: 4.0,
        }),
        crash_journal: Some(dir.join("journal")),
        crash_journal_bytes: 64 << 10,
        dictionary_size: 4 << 10,
        dictionary_samples: 64,
        ..Config::default()
    }
}

/// Values longer than this go to BT_LO (the default `medium_max`).
const LARGE: usize = 2048;

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

/// Version `version` of key `i`'s value: its first bytes name both; sizes run from
/// tiny through medium to large (BT_LO).
fn value(i: u32, version: u64) -> Vec<u8> {
    let len = match (version + u64::from(i)) % 10 {
        0 => 3000 + (version % 7) as usize * 1000,
        1..=3 => 300 + (version % 13) as usize * 90,
        _ => 20 + (version % 11) as usize * 8,
    };
    // Hex digits of a stream seeded by the version: compresses to about half, as
    // real values do, so DRAM holds a share of the keys and flash the rest.
    let mut v = format!("{i}:{version}|").into_bytes();
    let mut rng = StdRng::seed_from_u64(version ^ u64::from(i) << 40);
    while v.len() < len {
        v.push(b"0123456789abcdef"[rng.random_range(0..16)]);
    }
    v
}

/// What a value's first bytes name: its version.
fn version_of(v: &[u8]) -> Option<(u32, u64)> {
    let head = std::str::from_utf8(&v[..v.iter().position(|&b| b == b'|')?]).ok()?;
    let (i, version) = head.split_once(':')?;
    Some((i.parse().ok()?, version.parse().ok()?))
}

/// The child: reports what every key reads, then runs operations until killed (or
/// closes cleanly after `CHILD_OPS` of them).
fn child(dir: &Path) {
    let seed: u64 = std::env::var(CHILD_SEED).unwrap().parse().unwrap();
    let cache = ZipCache::open(config(dir, seed % 2 == 1)).unwrap();
    let out = std::io::stdout();
    let mut out = out.lock();
    let stats = cache.stats();
    // On a line of its own: the test harness may have begun one.
    writeln!(
        out,
        "\n@recovery {} {} {}",
        stats.recovery_kind, stats.recovery_objects, stats.recovery_shadowed_keys
    )
    .unwrap();
    for i in 0..KEYS {
        let read = cache.get(&key(i)).unwrap();
        let answer = match read.as_deref().map(|v| (version_of(v), v)) {
            None => "miss".to_string(),
            Some((Some((k, version)), v)) if k == i && *v == value(i, version)[..] => {
                version.to_string()
            }
            Some(_) => "garbage".to_string(),
        };
        writeln!(out, "@read {i} {answer}").unwrap();
    }
    writeln!(out, "@ready").unwrap();
    out.flush().unwrap();
    // The parent says go on, or first asks where the tiers hold a key it found wrong.
    for line in std::io::stdin().lines() {
        let line = line.unwrap();
        let Some(i) = line.strip_prefix("explain ") else {
            break;
        };
        let explained = cache.explain(&key(i.parse().unwrap()));
        for part in explained.lines() {
            writeln!(out, "@explain {part}").unwrap();
        }
        writeln!(out, "@explained").unwrap();
        out.flush().unwrap();
    }
    let ops: Option<u64> = std::env::var(CHILD_OPS).ok().and_then(|n| n.parse().ok());
    let mut rng = StdRng::seed_from_u64(seed);
    // Versions grow across runs: the seed's high bits start this run's.
    let mut version = seed << 24;
    let mut done = 0u64;
    // A flush promised for later (memcached's `flush_all <delay>`) runs this many
    // operations after its promise.
    let mut promised_flush_at = None;
    while ops.is_none_or(|n| done < n) {
        let i = rng.random_range(0..KEYS);
        version += 1;
        // Rare: the whole cache forgets, now or later.
        let op = match rng.random_range(0..60_000) {
            _ if promised_flush_at == Some(done) => 99,
            0 => 99,
            1..3 if promised_flush_at.is_none() => 100,
            _ => rng.random_range(0..99),
        };
        // Begun: from here the operation may or may not have happened.
        let line = match op {
            0..70 => format!("@begin put {i} {version}"),
            70..85 => format!("@begin delete {i}"),
            85..93 => format!("@begin expire {i}"),
            93..99 => format!("@begin touch {i}"),
            99 => "@begin flush".to_string(),
            _ => "@begin promise".to_string(),
        };
        writeln!(out, "{line}").unwrap();
        out.flush().unwrap();
        // A touch answers whether it found the key (memcached's TOUCHED or NOT_FOUND).
        let mut found = true;
        match op {
            0..70 => cache.put(&key(i), &value(i, version), None).unwrap(),
            70..85 => {
                cache.delete(&key(i)).unwrap();
            }
            // A touch that makes the value expire: it must never come back.
            85..93 => {
                let past = cache.now_ms().saturating_sub(1000);
                found = set_expiry(&cache, i, Some(past));
            }
            // A touch that keeps it an hour.
            93..99 => {
                let later = cache.now_ms() + 3_600_000;
                found = set_expiry(&cache, i, Some(later));
            }
            99 => {
                cache.flush_all().unwrap();
                promised_flush_at = None;
            }
            _ => {
                cache.promise_flush();
                promised_flush_at = Some(done + 2_000);
            }
        }
        // A touch that found nothing, though a GET right after finds a value: the two
        // reads disagree (reported; the model does not count on either).
        let ghost = match found {
            true => None,
            false => cache.get(&key(i)).unwrap().and_then(|v| version_of(&v)),
        };
        match (found, ghost) {
            (true, _) => writeln!(out, "@ack").unwrap(),
            (false, None) => writeln!(out, "@ack not-found").unwrap(),
            (false, Some((_, v))) => writeln!(out, "@ack not-found-but-get-finds-{v}").unwrap(),
        }
        out.flush().unwrap();
        done += 1;
    }
    // As the server's stop does: a promised flush runs before the close.
    if promised_flush_at.is_some() {
        writeln!(out, "@begin flush").unwrap();
        cache.flush_all().unwrap();
        writeln!(out, "@ack").unwrap();
    }
    cache.close().unwrap();
    writeln!(out, "@closed").unwrap();
}

/// Whether the key was there to take the new expiry.
fn set_expiry(cache: &ZipCache, i: u32, expires_at_ms: Option<u64>) -> bool {
    let (found, _) = cache
        .update_meta(&key(i), |found| match found {
            Some(info) => (
                Update::SetMeta(PutOptions {
                    expires_at_ms,
                    flags: info.flags,
                    ..PutOptions::default()
                }),
                true,
            ),
            None => (Update::Keep, false),
        })
        .unwrap();
    found
}

/// What the parent knows of a key: the version it must hold if anything (`None`:
/// absent, deleted, expired or flushed), and another it may hold instead (the
/// operation under way at the kill).
#[derive(Clone, Copy, Debug, Default)]
struct Known {
    now: Option<u64>,
    maybe: Option<Option<u64>>,
}

/// The model: applies the child's lines.
struct Model {
    keys: HashMap<u32, Known>,
    begun: Option<Vec<String>>,
    /// A flush promised and not yet run: what each key held at the promise. A kill
    /// before it runs must not bring any of those back (the promise dies with the
    /// process; its time may have come by the restart).
    promised: Option<HashMap<u32, Option<u64>>>,
    /// The round under way, and each key's last events and the whole cache's (flushes,
    /// promises, kills), for the report of a failure.
    round: u32,
    history: HashMap<u32, VecDeque<String>>,
    events: VecDeque<String>,
    /// Touches that found the key missing although the model held a version of it.
    not_found: u64,
    /// Touches that found nothing while a GET right after found a value.
    ghosts: u64,
}

/// Events kept per key, and for the whole cache.
const HISTORY: usize = 16;

impl Model {
    fn new() -> Model {
        Model {
            keys: HashMap::new(),
            begun: None,
            promised: None,
            round: 0,
            history: HashMap::new(),
            events: VecDeque::new(),
            not_found: 0,
            ghosts: 0,
        }
    }

    fn note(&mut self, key: Option<u32>, event: String) {
        let event = format!("round {}: {event}", self.round);
        let list = match key {
            Some(i) => self.history.entry(i).or_default(),
            None => &mut self.events,
        };
        if list.len() == HISTORY {
            list.pop_front();
        }
        list.push_back(event);
    }

    /// What the model saw of key `i` and of the whole cache lately.
    fn story(&self, i: u32) -> String {
        format!(
            "key {i}: {:?}; the cache: {:?}",
            self.history.get(&i),
            self.events
        )
    }

    fn begin(&mut self, words: Vec<String>) {
        self.begun = Some(words);
    }

    /// The operation begun is done; `answer` is `not-found` for a touch that found no
    /// key (it changed nothing).
    fn ack(&mut self, answer: Option<&str>) {
        let words = self.begun.take().expect("an ack follows a begin");
        let key = words.get(1).and_then(|w| w.parse().ok());
        let answer = answer.map(|a| format!(" ({a})")).unwrap_or_default();
        self.note(key, format!("acked {}{answer}", words.join(" ")));
        if !answer.is_empty() {
            let held = key
                .and_then(|k| self.keys.get(&k))
                .is_some_and(|k| k.now.is_some());
            self.not_found += u64::from(held);
            self.ghosts += u64::from(answer.contains("finds"));
            return;
        }
        match words[0].as_str() {
            "promise" => {
                let held = self.keys.iter().map(|(&k, known)| (k, known.now));
                self.promised = Some(held.collect());
            }
            "flush" => self.promised = None,
            _ => {}
        }
        for (i, after) in Self::effect(&words, &self.keys) {
            self.keys.entry(i).or_default().now = after;
        }
    }

    /// The keys an operation changes and what each holds after it.
    fn effect(words: &[String], keys: &HashMap<u32, Known>) -> Vec<(u32, Option<u64>)> {
        let i = || words[1].parse::<u32>().unwrap();
        match words[0].as_str() {
            "put" => vec![(i(), Some(words[2].parse().unwrap()))],
            "delete" | "expire" => vec![(i(), None)],
            "touch" | "promise" => vec![],
            "flush" => keys.keys().map(|&k| (k, None)).collect(),
            other => panic!("unknown operation {other}"),
        }
    }

    /// At the kill: the operation under way may have happened.
    fn killed(&mut self) {
        let pending = self.promised.is_some();
        self.note(None, format!("ended; a promise pending: {pending}"));
        if let Some(words) = self.begun.take() {
            let key = words.get(1).and_then(|w| w.parse().ok());
            self.note(key, format!("in flight at the end: {}", words.join(" ")));
            for (i, after) in Self::effect(&words, &self.keys) {
                self.keys.entry(i).or_default().maybe = Some(after);
            }
        }
        // Versions are never reused: a key that still holds what it held at the
        // promise was not written since, and is to be gone.
        for (i, held) in self.promised.take().unwrap_or_default() {
            let known = self.keys.entry(i).or_default();
            if known.now == held {
                known.now = None;
            }
            if known.maybe == Some(held) {
                known.maybe = None;
            }
        }
    }

    /// Checks one read after the restart; afterwards the key holds what was read.
    fn check(&mut self, i: u32, read: Option<u64>) -> Result<(), String> {
        let known = self.keys.get(&i).copied().unwrap_or_default();
        if read != known.now {
            self.note(Some(i), format!("read {read:?}, model {known:?}"));
        }
        let allowed = read.is_none() || read == known.now || known.maybe == Some(read);
        self.keys.insert(
            i,
            Known {
                now: read,
                maybe: None,
            },
        );
        match allowed {
            true => Ok(()),
            false => Err(format!(
                "key {i} read version {read:?}; model {known:?}; {}",
                self.story(i)
            )),
        }
    }
}

#[test]
fn no_kill_ever_brings_back_a_value_overwritten_deleted_expired_or_flushed() {
    if let Ok(dir) = std::env::var(CHILD_DIR) {
        child(Path::new(&dir));
        return;
    }
    let rounds: u32 = std::env::var("ZIPCACHE_CRASH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(12);
    let dir = std::env::temp_dir().join(format!("zipcache-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("journal")).unwrap();
    let seed: u64 = std::env::var("ZIPCACHE_CRASH_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (ZIPCACHE_CRASH_SEED), {rounds} rounds");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::new();
    let mut warm = (0u64, 0u64); // keys the model held at a crash restart, and served
    let mut warm_large = (0u64, 0u64); // the same of large objects (BT_LO)
    let mut kinds: HashMap<String, u32> = HashMap::new();
    let mut last_was_crash = false;
    let keep = std::env::var_os("ZIPCACHE_CRASH_KEEP").is_some();
    let kept = |round: u32| dir.with_extension(format!("round-{round}"));
    for round in 0..=rounds {
        model.round = round;
        if keep {
            let status = Command::new("cp")
                .args(["-a", "--sparse=always"])
                .arg(&dir)
                .arg(kept(round))
                .status()
                .unwrap();
            assert!(status.success(), "cp of {}", dir.display());
            if let Some(old) = round.checked_sub(2) {
                let _ = std::fs::remove_dir_all(kept(old));
            }
        }
        let clean_close = round < rounds && rng.random_range(0..5) == 0;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "no_kill_ever_brings_back_a_value_overwritten_deleted_expired_or_flushed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, &dir)
            .env(
                CHILD_SEED,
                (u64::from(round + 1) << 8 | rng.random_range(0..255)).to_string(),
            )
            .env(CHILD_OPS, if clean_close { "3000" } else { "" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut orders = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut held, mut served) = (0u64, 0u64);
        let (mut large_held, mut large_served) = (0u64, 0u64);
        for line in lines.by_ref() {
            let line = line.unwrap();
            let words: Vec<String> = line.split_whitespace().map(String::from).collect();
            match words.first().map(String::as_str) {
                Some("@recovery") => {
                    eprintln!(
                        "round {round}: {line} (touches so far that missed a key held: {}, \
                         of them a GET right after found it: {})",
                        model.not_found, model.ghosts
                    );
                    model.note(None, line.clone());
                    *kinds.entry(words[1].clone()).or_default() += 1
                }
                Some("@read") => {
                    let i: u32 = words[1].parse().unwrap();
                    let read = match words[2].as_str() {
                        "miss" => None,
                        "garbage" => panic!("round {round}: key {i} read bytes of no version"),
                        v => Some(v.parse().unwrap()),
                    };
                    if let Some(version) = model.keys.get(&i).and_then(|k| k.now) {
                        held += 1;
                        served += u64::from(read.is_some());
                        if value(i, version).len() > LARGE {
                            large_held += 1;
                            large_served += u64::from(read.is_some());
                        }
                    }
                    if let Err(e) = model.check(i, read) {
                        writeln!(orders, "explain {i}").unwrap();
                        let explained: Vec<String> = lines
                            .by_ref()
                            .map_while(Result::ok)
                            .take_while(|line| line != "@explained")
                            .filter_map(|line| line.strip_prefix("@explain ").map(String::from))
                            .collect();
                        let e = format!("{e}\nwhere the tiers hold it:\n{}", explained.join("\n"));
                        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                        let files = match keep {
                            true => format!("; the files it opened: {}", kept(round).display()),
                            false => String::new(),
                        };
                        panic!("round {round} (seed {seed}): {e}{files}");
                    }
                }
                Some("@ready") => {
                    writeln!(orders, "go").unwrap();
                    break;
                }
                _ => {}
            }
        }
        if last_was_crash {
            warm.0 += held;
            warm.1 += served;
            warm_large.0 += large_held;
            warm_large.1 += large_served;
        }
        if round == rounds {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            let _ = child.wait();
            break;
        }
        // Runs until the kill, or to its clean close.
        let runs_for = Duration::from_millis(rng.random_range(50..1500));
        let (lines_tx, lines_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in lines {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let started = Instant::now();
        let mut closed = false;
        while clean_close || started.elapsed() < runs_for {
            match lines_rx.recv_timeout(Duration::from_millis(5)) {
                Ok(line) => {
                    let words: Vec<String> = line.split_whitespace().map(String::from).collect();
                    match words.first().map(String::as_str) {
                        Some("@begin") => model.begin(words[1..].to_vec()),
                        Some("@ack") => model.ack(words.get(1).map(String::as_str)),
                        Some("@closed") => {
                            closed = true;
                            break;
                        }
                        _ => {}
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        if !closed {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        let _ = child.wait();
        // What the child printed before it died is acknowledged too.
        reader.join().unwrap();
        while let Ok(line) = lines_rx.try_recv() {
            let words: Vec<String> = line.split_whitespace().map(String::from).collect();
            match words.first().map(String::as_str) {
                Some("@begin") => model.begin(words[1..].to_vec()),
                Some("@ack") => model.ack(words.get(1).map(String::as_str)),
                _ => {}
            }
        }
        assert!(
            clean_close == closed,
            "round {round}: the child closed only when asked"
        );
        model.killed();
        last_was_crash = !closed;
    }
    let _ = std::fs::remove_dir_all(&dir);
    for round in rounds.saturating_sub(1)..=rounds {
        let _ = std::fs::remove_dir_all(kept(round));
    }
    eprintln!(
        "recoveries {kinds:?}; after crashes {} of {} keys held were served, {} of {} large",
        warm.1, warm.0, warm_large.1, warm_large.0
    );
    assert!(
        warm_large.1 > 0,
        "after crashes {} of {} large objects held were served: BT_LO must come back too",
        warm_large.1,
        warm_large.0
    );
    assert!(
        kinds.get("crash").copied().unwrap_or(0) > 0,
        "some restart was crash-warm"
    );
    assert!(
        warm.1 * 2 > warm.0,
        "after crashes {} of {} keys held were served: the flash tier must come back warm",
        warm.1,
        warm.0
    );
}

/// Where tmpfs cannot take the journal (here: a directory that does not exist), the
/// engine opens without one and says so; where it can, the journal is on.
#[test]
fn an_engine_opens_without_a_journal_where_tmpfs_refuses_it() {
    let dir = std::env::temp_dir().join(format!("zipcache-crash-off-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("journal")).unwrap();
    let refused = Config {
        crash_journal: Some(dir.join("missing").join("journal")),
        ..config(&dir, false)
    };
    let cache = ZipCache::open(refused).unwrap();
    cache.put(b"k", b"v", None).unwrap();
    assert!(!cache.stats().crash_journal_on);
    cache.close().unwrap();
    let cache = ZipCache::open(config(&dir, false)).unwrap();
    let stats = cache.stats();
    assert!(stats.crash_journal_on, "{stats:?}");
    assert_eq!(stats.recovery_kind, "clean");
    assert_eq!(cache.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    drop(cache);
    let _ = std::fs::remove_dir_all(&dir);
}
