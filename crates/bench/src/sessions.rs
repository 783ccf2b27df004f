//! `zipcache bench sessions`: web sessions kept as Redis hashes, as session stores
//! (Spring Session, express-session stores, PHP and Python handlers) keep them — one hash
//! per session, a dozen fields of ids, timestamps, an address, a user agent, a random
//! token and a small JSON cart, and a key TTL. Each server (started by the bench on
//! 127.0.0.1 with the same DRAM budget: redis-server's `maxmemory`, ZipCache's `--dram`)
//! is filled with `--sessions` sessions by pipelined HSET + EXPIRE, then every session is
//! read back by HGETALL and compared with what was written: held whole, gone, or wrong
//! (a session with a field missing, added or changed — which must never happen).
//! `--values records` writes real rows instead (`vega_datasets`' tables, a hash per row,
//! a field per column), as an object cache keeps them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::peers::{self, Peer};
use crate::procfs::{cpu_seconds, wait_idle};
use crate::targets::network::{Conn, Value};

#[derive(clap::Args, Debug, Clone)]
pub struct SessionsArgs {
    /// Sessions written (ids 0..N-1).
    #[arg(long, default_value_t = 300_000)]
    pub sessions: u64,
    /// Every server's DRAM budget (redis-server's `maxmemory`, ZipCache's `--dram`).
    #[arg(long, default_value = "64MiB")]
    pub dram: String,
    /// ZipCache's SSD tier (`--ssd-size`), or `none` for DRAM only.
    #[arg(long, default_value = "none")]
    pub ssd: String,
    /// The servers, in order: `zipcache`, `redis`.
    #[arg(long, default_value = "zipcache,redis")]
    pub targets: String,
    /// Requests in flight on the connection.
    #[arg(long, default_value_t = 64)]
    pub pipeline: usize,
    /// The TTL each session's key gets (EXPIRE, seconds); 0 for none.
    #[arg(long, default_value_t = 3600)]
    pub ttl: u64,
    /// Where the servers' files and `sessions.json` go.
    #[arg(long, default_value = "bench-sessions")]
    pub out: PathBuf,
    /// An engine setting for ZipCache (`NAME=VALUE`, as `zipcache serve --set`); repeatable.
    #[arg(long = "set", value_parser = crate::setting_arg)]
    pub settings: Vec<(String, String)>,
    /// What the hashes hold: web `sessions` (synthetic, below), or real `records` — the
    /// rows of `vega_datasets`' tables (airports, cars, stocks, …), one hash per row, a
    /// field per column, as an object cache keeps them.
    #[arg(long, value_enum, default_value = "sessions")]
    pub values: HashValues,
}

/// What `zipcache bench sessions` writes into its hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum HashValues {
    Sessions,
    Records,
}

/// A hash's fields and their values.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// The hashes a run writes: hash `i`'s key and fields, the same on every call.
enum Source {
    Sessions,
    /// Each table's name and its rows' columns.
    Records(Vec<(String, Vec<Fields>)>),
}

impl Source {
    fn load(values: HashValues) -> Result<Source, String> {
        if values == HashValues::Sessions {
            return Ok(Source::Sessions);
        }
        let documents = crate::values::Documents::load()?;
        let tables = documents
            .tables()
            .map(|(name, records)| {
                let rows = records.iter().filter_map(|r| columns(r)).collect();
                (name.to_string(), rows)
            })
            .collect();
        Ok(Source::Records(tables))
    }

    fn hash(&self, i: u64) -> Session {
        let Source::Records(tables) = self else {
            return session(i);
        };
        let (name, rows) = &tables[(i % tables.len() as u64) as usize];
        let row = &rows[(crate::values::mix64(i) % rows.len() as u64) as usize];
        (format!("object:{name}:{i}").into_bytes(), row.clone())
    }
}

/// A JSON object's members as a hash's fields: strings as they are, the rest as JSON.
fn columns(record: &[u8]) -> Option<Fields> {
    let serde_json::Value::Object(members) = serde_json::from_slice(record).ok()? else {
        return None;
    };
    let mut fields: Fields = members
        .into_iter()
        .map(|(name, value)| {
            let text = match value {
                serde_json::Value::String(text) => text,
                other => other.to_string(),
            };
            (name.into_bytes(), text.into_bytes())
        })
        .collect();
    fields.sort();
    fields.dedup_by(|a, b| a.0 == b.0);
    (!fields.is_empty()).then_some(fields)
}

/// One server's figures.
#[derive(Debug, Serialize)]
pub struct SessionsResult {
    pub target: String,
    pub values: HashValues,
    pub dram_bytes: u64,
    pub ssd_bytes: Option<u64>,
    pub written: u64,
    /// Read back exactly as written.
    pub whole: u64,
    /// Read back as absent (evicted or never stored).
    pub gone: u64,
    /// Read back as anything else: fields missing, added or changed.
    pub wrong: u64,
    pub write_errors: u64,
    /// Bytes of field names and values per session, on average.
    pub session_bytes: f64,
    pub fill_seconds: f64,
    pub hset_per_second: f64,
    pub read_seconds: f64,
    pub hgetall_per_second: f64,
    /// Server CPU per session written (HSET + EXPIRE) and per HGETALL, microseconds.
    pub server_cpu_us_per_write: Option<f64>,
    pub server_cpu_us_per_read: Option<f64>,
    pub whole_per_dram_mib: f64,
    pub whole_per_ssd_mib: Option<f64>,
    /// What the server's INFO says of its memory after the reads.
    pub info: BTreeMap<String, String>,
}

/// INFO fields kept in the result: Redis's memory, ZipCache's objects and DRAM.
const INFO_FIELDS: [&str; 14] = [
    "used_memory",
    "dram_used",
    "dram_hot_page_bytes",
    "dram_write_buffer_bytes",
    "dram_medium_bytes",
    "evicted_keys",
    "objects_resident",
    "dram_objects",
    "ssd_objects",
    "compression_ratio_dram",
    "dram_fragmentation_bytes",
    "dram_index_bytes",
    "dram_compressed_page_bytes",
    "evicted_objects",
];

fn info(conn: &mut Conn) -> Result<BTreeMap<String, String>, String> {
    let text = match conn.call(&[b"INFO", b"everything"])? {
        Value::Bulk(Some(text)) => String::from_utf8_lossy(&text).into_owned(),
        other => return Err(format!("INFO answered {other:?}")),
    };
    Ok(text
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| INFO_FIELDS.contains(name))
        .map(|(name, value)| (name.to_string(), value.trim().to_string()))
        .collect())
}

const USER_AGENTS: [&str; 8] = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.6367.82 Mobile Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36 Edg/124.0.2478.67",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10.15; rv:125.0) Gecko/20100101 Firefox/125.0",
    "Mozilla/5.0 (iPad; CPU OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/124.0.6367.88 Mobile/15E148 Safari/604.1",
];
const LOCALES: [&str; 6] = ["en-US", "en-GB", "de-DE", "fr-FR", "es-ES", "ja-JP"];
const NAMES: [&str; 10] = [
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
];
const DOMAINS: [&str; 4] = [
    "example.com",
    "mail.example.org",
    "corp.example.net",
    "example.io",
];

/// A session: its key, and its fields and their values.
pub type Session = (Vec<u8>, Fields);

/// Session `i`, the same on every call.
pub fn session(i: u64) -> Session {
    let mut rng = SmallRng::seed_from_u64(i ^ 0x5e55_1015);
    let hex = |rng: &mut SmallRng, n: usize| -> String {
        (0..n)
            .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap())
            .collect()
    };
    let id = format!(
        "{}-{}-4{}-{}-{}",
        hex(&mut rng, 8),
        hex(&mut rng, 4),
        hex(&mut rng, 3),
        hex(&mut rng, 4),
        hex(&mut rng, 12)
    );
    let created: u64 = 1_764_000_000_000 + rng.random_range(0..86_400_000);
    let accessed = created + rng.random_range(0..1_800_000);
    let name = NAMES[rng.random_range(0..NAMES.len())];
    let user = rng.random_range(10_000..10_000_000u32);
    let items: usize = rng.random_range(0..4);
    let cart: Vec<String> = (0..items)
        .map(|_| {
            format!(
                "{{\"sku\":\"SKU-{:05}\",\"qty\":{},\"price\":{}.{:02}}}",
                rng.random_range(0..100_000),
                rng.random_range(1..4),
                rng.random_range(1..200),
                rng.random_range(0..100)
            )
        })
        .collect();
    let roles = if rng.random_range(0..20) == 0 {
        "[\"USER\",\"ADMIN\"]"
    } else {
        "[\"USER\"]"
    };
    let fields: Vec<(&str, String)> = vec![
        ("creationTime", created.to_string()),
        ("lastAccessedTime", accessed.to_string()),
        ("maxInactiveInterval", "1800".into()),
        ("sessionAttr:userId", format!("u-{user:08}")),
        ("sessionAttr:username", format!("{name}{}", user % 1000)),
        (
            "sessionAttr:email",
            format!(
                "{name}.{}@{}",
                user % 1000,
                DOMAINS[rng.random_range(0..DOMAINS.len())]
            ),
        ),
        (
            "sessionAttr:remoteAddr",
            format!(
                "{}.{}.{}.{}",
                rng.random_range(1..224),
                rng.random_range(0..256),
                rng.random_range(0..256),
                rng.random_range(1..255)
            ),
        ),
        (
            "sessionAttr:userAgent",
            USER_AGENTS[rng.random_range(0..USER_AGENTS.len())].into(),
        ),
        ("sessionAttr:csrfToken", hex(&mut rng, 32)),
        (
            "sessionAttr:locale",
            LOCALES[rng.random_range(0..LOCALES.len())].into(),
        ),
        ("sessionAttr:roles", roles.into()),
        (
            "sessionAttr:cart",
            format!("{{\"items\":[{}],\"currency\":\"USD\"}}", cart.join(",")),
        ),
    ];
    let key = format!("spring:session:sessions:{id}").into_bytes();
    let fields = fields
        .into_iter()
        .map(|(f, v)| (f.as_bytes().to_vec(), v.into_bytes()))
        .collect();
    (key, fields)
}

pub fn run(args: &SessionsArgs) -> Result<(), String> {
    let dram = zipcache::parse_size(&args.dram).map_err(|e| e.to_string())?;
    let ssd = match args.ssd.as_str() {
        "none" => None,
        size => Some(zipcache::parse_size(size).map_err(|e| e.to_string())?),
    };
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let source = Source::load(args.values)?;
    let mut results = Vec::new();
    for target in args.targets.split(',').map(str::trim) {
        let dir = args.out.join(target);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (peer, ssd) = match target {
            "zipcache" => (
                peers::zipcache_resp(dram, ssd, &args.settings, &dir, 2)?,
                ssd,
            ),
            "redis" => (peers::redis(dram, &dir)?, None),
            other => {
                return Err(format!(
                    "unknown sessions target {other:?} (zipcache, redis)"
                ));
            }
        };
        eprintln!("sessions: {target} ...");
        let result = measure(target, &peer, dram, ssd, &source, args)?;
        println!(
            "{:<10} {:>9} whole of {:>9} ({:.2} per DRAM MiB), {} gone, {} wrong; HSET+EXPIRE {:.0}/s, HGETALL {:.0}/s",
            result.target,
            result.whole,
            result.written,
            result.whole_per_dram_mib,
            result.gone,
            result.wrong,
            result.hset_per_second,
            result.hgetall_per_second
        );
        results.push(result);
    }
    if let [ours, redis] = &results[..] {
        println!(
            "zipcache/redis: sessions held {:.2}x, HSET {:.2}x, HGETALL {:.2}x",
            ours.whole as f64 / redis.whole.max(1) as f64,
            ours.hset_per_second / redis.hset_per_second,
            ours.hgetall_per_second / redis.hgetall_per_second
        );
    }
    let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
    let path = args.out.join("sessions.json");
    std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn measure(
    target: &str,
    peer: &Peer,
    dram: u64,
    ssd: Option<u64>,
    source: &Source,
    args: &SessionsArgs,
) -> Result<SessionsResult, String> {
    let mut conn = Conn::open(peer.addr)?;
    let pipeline = args.pipeline.max(1) as u64;
    let ttl = args.ttl.to_string();
    let cpu = || cpu_seconds(peer.pid());
    let (mut write_errors, mut session_bytes) = (0u64, 0u64);

    let (cpu0, start) = (cpu(), Instant::now());
    let mut i = 0;
    while i < args.sessions {
        let end = (i + pipeline).min(args.sessions);
        let mut replies = 0;
        for id in i..end {
            let (key, fields) = source.hash(id);
            session_bytes += fields
                .iter()
                .map(|(f, v)| (f.len() + v.len()) as u64)
                .sum::<u64>();
            let mut hset: Vec<&[u8]> = vec![b"HSET", &key];
            hset.extend(
                fields
                    .iter()
                    .flat_map(|(f, v)| [f.as_slice(), v.as_slice()]),
            );
            conn.command(&hset)?;
            replies += 1;
            if args.ttl > 0 {
                conn.command(&[b"EXPIRE", &key, ttl.as_bytes()])?;
                replies += 1;
            }
        }
        conn.flush()?;
        for _ in 0..replies {
            if let Value::Error(_) = conn.value()? {
                write_errors += 1;
            }
        }
        i = end;
    }
    let fill_seconds = start.elapsed().as_secs_f64();
    let cpu1 = cpu();
    wait_idle(peer.pid(), std::time::Duration::from_secs(30));

    let (cpu2, start) = (cpu(), Instant::now());
    let (mut whole, mut gone, mut wrong) = (0, 0, 0);
    let mut i = 0;
    while i < args.sessions {
        let end = (i + pipeline).min(args.sessions);
        let keys: Vec<Vec<u8>> = (i..end).map(|id| source.hash(id).0).collect();
        for key in &keys {
            conn.command(&[b"HGETALL", key])?;
        }
        conn.flush()?;
        for id in i..end {
            let got = match conn.value()? {
                Value::Array(items) => items,
                other => return Err(format!("{target}: HGETALL answered {other:?}")),
            };
            if got.is_empty() {
                gone += 1;
                continue;
            }
            let got: BTreeMap<Vec<u8>, Vec<u8>> = got
                .chunks(2)
                .filter_map(|pair| match pair {
                    [Value::Bulk(Some(f)), Value::Bulk(Some(v))] => Some((f.clone(), v.clone())),
                    _ => None,
                })
                .collect();
            let want: BTreeMap<Vec<u8>, Vec<u8>> = source.hash(id).1.into_iter().collect();
            if got == want {
                whole += 1;
            } else {
                wrong += 1;
            }
        }
        i = end;
    }
    let read_seconds = start.elapsed().as_secs_f64();
    let cpu3 = cpu();
    let per = |a: Option<f64>, b: Option<f64>, n: u64| Some((b? - a?) * 1e6 / n.max(1) as f64);
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    Ok(SessionsResult {
        target: target.into(),
        values: args.values,
        dram_bytes: dram,
        ssd_bytes: ssd,
        written: args.sessions,
        whole,
        gone,
        wrong,
        write_errors,
        session_bytes: session_bytes as f64 / args.sessions.max(1) as f64,
        fill_seconds,
        hset_per_second: args.sessions as f64 / fill_seconds,
        read_seconds,
        hgetall_per_second: args.sessions as f64 / read_seconds,
        server_cpu_us_per_write: per(cpu0, cpu1, args.sessions),
        server_cpu_us_per_read: per(cpu2, cpu3, args.sessions),
        whole_per_dram_mib: whole as f64 / mib(dram),
        whole_per_ssd_mib: ssd.map(|s| whole as f64 / mib(s)),
        info: info(&mut conn)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_the_same_on_every_call_and_look_like_sessions() {
        let (key, fields) = session(7);
        assert_eq!(session(7), (key.clone(), fields.clone()));
        assert_ne!(session(8).0, key);
        assert!(key.starts_with(b"spring:session:sessions:"));
        assert_eq!(fields.len(), 12);
        let bytes: usize = (0..1000)
            .map(|i| {
                session(i)
                    .1
                    .iter()
                    .map(|(f, v)| f.len() + v.len())
                    .sum::<usize>()
            })
            .sum();
        let mean = bytes / 1000;
        let row = columns(br#"{"name":"Ann Arbor","lat":42.2,"iata":"ARB","tags":[1]}"#);
        let text = |f: &[(&str, &str)]| -> Fields {
            f.iter()
                .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect()
        };
        assert_eq!(
            row,
            Some(text(&[
                ("iata", "ARB"),
                ("lat", "42.2"),
                ("name", "Ann Arbor"),
                ("tags", "[1]")
            ]))
        );
        assert_eq!(columns(b"[1,2]"), None);
        assert_eq!(columns(b"{}"), None);
        assert!(
            (450..=650).contains(&mean),
            "{mean} bytes of fields per session"
        );
    }
}
