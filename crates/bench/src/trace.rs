//! Real key traces, replayed look-aside (`--trace FILE --trace-format F`).
//!
//! A trace is read once into memory: every distinct key gets a dense id `0..U-1` (in order
//! of first appearance), which the value generator and the driver use like a generated key
//! id; the key bytes sent to the cache are the trace's own key (an integer written as
//! zero-padded decimal, or the string of a CSV trace, zero-padded to its recorded size).
//!
//! Formats:
//! * `caffeine-u32` / `caffeine-u64`: a sequence of big-endian 32- or 64-bit integers, one
//!   key per request (the Caffeine simulator's binary traces; cache2k's traces are signed
//!   32-bit, read here as their unsigned bit pattern).
//! * `cachelib-kvcache`: CacheLib cachebench's key-value replay CSV. Without a header the
//!   columns are `key,op,size,op_count,key_size[,ttl]`; a header row naming `key`, `op` and
//!   `size` (and optionally `op_count`, `key_size`, `op_time`, `cache_hits`, `ttl`) sets
//!   the order. `op` is `GET`/`GET_LEASE`, `SET`/`SET_LEASE` or `DELETE`; a line stands for
//!   `op_count` consecutive requests.
//! * `twitter`: Twitter's cache traces, `timestamp,key,key size,value size,client id,
//!   operation,TTL`; `get`/`gets` are GETs, `set`/`add`/`replace`/`cas` SETs, `delete`
//!   DELETEs; `append`/`prepend`/`incr`/`decr` are skipped (counted in `skipped`).
//!
//! Files whose name ends in `.xz` are decompressed while they are read.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::Serialize;

use crate::workload::{OpKind, digits};

/// How a trace file is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    /// Big-endian 32-bit keys (cache2k / Caffeine simulator binary traces).
    CaffeineU32,
    /// Big-endian 64-bit keys.
    CaffeineU64,
    /// CacheLib kvcache CSV: key,op,size,op_count,key_size[,ttl] (or as its header says).
    CachelibKvcache,
    /// Twitter cache-trace CSV: timestamp,key,key size,value size,client id,operation,TTL.
    Twitter,
}

impl TraceFormat {
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::CaffeineU32 => "caffeine-u32",
            TraceFormat::CaffeineU64 => "caffeine-u64",
            TraceFormat::CachelibKvcache => "cachelib-kvcache",
            TraceFormat::Twitter => "twitter",
        }
    }
}

/// What a request of the trace does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceOp {
    Get,
    Set,
    Delete,
}

impl TraceOp {
    pub fn kind(self) -> OpKind {
        match self {
            TraceOp::Get => OpKind::Get,
            TraceOp::Set => OpKind::Put,
            TraceOp::Delete => OpKind::Delete,
        }
    }
}

/// One request: the dense id of its key and its operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    pub key: u32,
    pub op: TraceOp,
}

/// The keys of a trace, by dense id.
#[derive(Clone, Debug)]
enum Keys {
    /// Integer keys, written as zero-padded decimal of `width` digits.
    Ints { values: Vec<u64>, width: usize },
    /// String keys, already padded.
    Strings(Vec<Box<[u8]>>),
}

/// A trace in memory, ready to be replayed against every target.
#[derive(Clone, Debug)]
pub struct Trace {
    pub format: TraceFormat,
    pub requests: Vec<TraceRequest>,
    keys: Keys,
    /// Per dense id: the value size the trace records for the key (its first non-zero
    /// size), or 0 if it records none. Empty for formats without sizes.
    pub sizes: Vec<u32>,
    /// Requests of operations the bench does not replay (e.g. `incr`).
    pub skipped: u64,
}

/// What the JSON result says about the trace a run replayed.
#[derive(Clone, Debug, Serialize)]
pub struct TraceSummary {
    pub path: String,
    pub format: TraceFormat,
    pub requests: u64,
    pub unique_keys: u64,
    pub gets: u64,
    pub sets: u64,
    pub deletes: u64,
    pub skipped: u64,
}

/// Longest key the text protocols accept (memcached).
pub const MAX_KEY: usize = 250;

impl Trace {
    /// Reads up to `limit` requests of `path` (decompressing `.xz`), keys padded to at
    /// least `key_size` bytes.
    pub fn load(
        path: &Path,
        format: TraceFormat,
        key_size: usize,
        limit: Option<u64>,
    ) -> Result<Trace, String> {
        let file = File::open(path).map_err(|e| format!("--trace {}: {e}", path.display()))?;
        let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "xz") {
            Box::new(liblzma::read::XzDecoder::new_multi_decoder(BufReader::new(
                file,
            )))
        } else {
            Box::new(file)
        };
        let reader = BufReader::with_capacity(1 << 20, reader);
        Trace::parse(reader, format, key_size, limit)
            .map_err(|e| format!("--trace {}: {e}", path.display()))
    }

    /// Parses a trace from `reader` (already decompressed).
    pub fn parse(
        reader: impl BufRead,
        format: TraceFormat,
        key_size: usize,
        limit: Option<u64>,
    ) -> Result<Trace, String> {
        let limit = limit.unwrap_or(u64::MAX);
        let trace = match format {
            TraceFormat::CaffeineU32 => parse_binary::<4>(reader, key_size, limit)?,
            TraceFormat::CaffeineU64 => parse_binary::<8>(reader, key_size, limit)?,
            TraceFormat::CachelibKvcache | TraceFormat::Twitter => {
                parse_csv(reader, format, key_size, limit)?
            }
        };
        if trace.requests.is_empty() {
            return Err("the trace holds no request".into());
        }
        Ok(trace)
    }

    pub fn len(&self) -> u64 {
        self.requests.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    pub fn unique_keys(&self) -> u64 {
        match &self.keys {
            Keys::Ints { values, .. } => values.len() as u64,
            Keys::Strings(keys) => keys.len() as u64,
        }
    }

    /// The bytes of the key of dense id `id`.
    pub fn key(&self, id: u64) -> Vec<u8> {
        match &self.keys {
            Keys::Ints { values, width } => format!("{:0width$}", values[id as usize]).into(),
            Keys::Strings(keys) => keys[id as usize].to_vec(),
        }
    }

    pub fn summary(&self, path: &Path) -> TraceSummary {
        let count = |op| self.requests.iter().filter(|r| r.op == op).count() as u64;
        TraceSummary {
            path: path.display().to_string(),
            format: self.format,
            requests: self.len(),
            unique_keys: self.unique_keys(),
            gets: count(TraceOp::Get),
            sets: count(TraceOp::Set),
            deletes: count(TraceOp::Delete),
            skipped: self.skipped,
        }
    }
}

fn too_many_keys() -> String {
    "more than 2^32 distinct keys".into()
}

fn parse_binary<const N: usize>(
    mut reader: impl BufRead,
    key_size: usize,
    limit: u64,
) -> Result<Trace, String> {
    let mut ids: HashMap<u64, u32> = HashMap::new();
    let mut values = Vec::new();
    let mut requests = Vec::new();
    let mut word = [0u8; N];
    while (requests.len() as u64) < limit {
        let mut filled = 0;
        while filled < N {
            match reader.read(&mut word[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        if filled == 0 {
            break;
        }
        if filled < N {
            return Err(format!(
                "truncated: {filled} trailing bytes after {} keys of {N} bytes (is this a {}-bit trace?)",
                requests.len(),
                N * 8
            ));
        }
        let key = if N == 4 {
            u32::from_be_bytes(word[..4].try_into().expect("4 bytes")) as u64
        } else {
            u64::from_be_bytes(word[..8].try_into().expect("8 bytes"))
        };
        let next = u32::try_from(values.len()).map_err(|_| too_many_keys())?;
        let id = *ids.entry(key).or_insert_with(|| {
            values.push(key);
            next
        });
        requests.push(TraceRequest {
            key: id,
            op: TraceOp::Get,
        });
    }
    let width = values
        .iter()
        .map(|v| digits(*v))
        .max()
        .unwrap_or(1)
        .max(key_size);
    Ok(Trace {
        format: if N == 4 {
            TraceFormat::CaffeineU32
        } else {
            TraceFormat::CaffeineU64
        },
        requests,
        keys: Keys::Ints { values, width },
        sizes: Vec::new(),
        skipped: 0,
    })
}

/// Columns of a CSV trace line.
#[derive(Clone, Copy, Debug)]
struct Columns {
    key: usize,
    op: usize,
    size: usize,
    op_count: Option<usize>,
    key_size: Option<usize>,
    /// Fields a line has at least.
    min_fields: usize,
}

const KVCACHE_DEFAULT: Columns = Columns {
    key: 0,
    op: 1,
    size: 2,
    op_count: Some(3),
    key_size: Some(4),
    min_fields: 5,
};

/// A kvcache header row (a first line with a column named `key`), or `None` if the line
/// is data.
fn kvcache_header(line: &str) -> Result<Option<Columns>, String> {
    let names: Vec<&str> = line.split(',').map(str::trim).collect();
    if !names.contains(&"key") {
        return Ok(None);
    }
    let find = |name| names.iter().position(|n| *n == name);
    let required =
        |name| find(name).ok_or_else(|| format!("the header {line:?} has no column {name:?}"));
    let (key, op, size) = (required("key")?, required("op")?, required("size")?);
    let (op_count, key_size) = (find("op_count"), find("key_size"));
    let min_fields = [Some(key), Some(op), Some(size), op_count, key_size]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0)
        + 1;
    Ok(Some(Columns {
        key,
        op,
        size,
        op_count,
        key_size,
        min_fields,
    }))
}

/// One parsed CSV line: key, recorded key size, op (`None`: skipped), value size, repeats.
type CsvLine<'a> = (&'a str, usize, Option<TraceOp>, u32, u64);

fn number<T: std::str::FromStr>(field: &str, what: &str) -> Result<T, String> {
    field
        .trim()
        .parse()
        .map_err(|_| format!("{what} {field:?} is not a number"))
}

fn kvcache_line<'a>(fields: &[&'a str], c: &Columns) -> Result<CsvLine<'a>, String> {
    if fields.len() < c.min_fields {
        return Err(format!(
            "{} fields, expected at least {} (key,op,size,op_count,key_size)",
            fields.len(),
            c.min_fields
        ));
    }
    let op = match fields[c.op].trim() {
        "GET" | "GET_LEASE" => TraceOp::Get,
        "SET" | "SET_LEASE" => TraceOp::Set,
        "DELETE" => TraceOp::Delete,
        other => return Err(format!("unknown op {other:?} (GET, SET, DELETE)")),
    };
    let size = number(fields[c.size], "size")?;
    let repeats = match c.op_count {
        Some(i) => number(fields[i], "op_count")?,
        None => 1,
    };
    if repeats == 0 {
        return Err("op_count is 0".into());
    }
    let key_size = match c.key_size {
        Some(i) => number(fields[i], "key_size")?,
        None => 0,
    };
    Ok((fields[c.key].trim(), key_size, Some(op), size, repeats))
}

fn twitter_line<'a>(line: &'a str) -> Result<CsvLine<'a>, String> {
    // The key is the second field; the five after it are fixed, so a key holding a comma
    // still parses.
    let fields: Vec<&str> = line.split(',').collect();
    if fields.len() < 7 {
        return Err(format!(
            "{} fields, expected 7 (timestamp,key,key size,value size,client id,operation,TTL)",
            fields.len()
        ));
    }
    let n = fields.len();
    let key_start = fields[0].len() + 1;
    let key_end = line.len() - fields[n - 5..].iter().map(|f| f.len() + 1).sum::<usize>();
    let key = &line[key_start..key_end];
    number::<u64>(fields[0], "timestamp")?;
    let key_size = number(fields[n - 5], "key size")?;
    let size = number(fields[n - 4], "value size")?;
    let op = match fields[n - 2].trim() {
        "get" | "gets" => Some(TraceOp::Get),
        "set" | "add" | "replace" | "cas" => Some(TraceOp::Set),
        "delete" => Some(TraceOp::Delete),
        "append" | "prepend" | "incr" | "decr" => None,
        other => return Err(format!("unknown operation {other:?}")),
    };
    Ok((key, key_size, op, size, 1))
}

/// `key` zero-padded (on the left, like the bench's generated keys) to `width` bytes.
fn padded_key(key: &str, width: usize) -> Result<Box<[u8]>, String> {
    if key.is_empty() {
        return Err("empty key".into());
    }
    if let Some(b) = key.bytes().find(|b| *b <= b' ' || *b == 0x7f) {
        return Err(format!(
            "key {key:?} holds byte {b:#04x} (no space or control byte may be in a key)"
        ));
    }
    let width = width.min(MAX_KEY);
    if key.len() > MAX_KEY {
        return Err(format!("key of {} bytes (at most {MAX_KEY})", key.len()));
    }
    let mut out = Vec::with_capacity(width.max(key.len()));
    out.resize(width.saturating_sub(key.len()), b'0');
    out.extend_from_slice(key.as_bytes());
    Ok(out.into())
}

fn parse_csv(
    reader: impl BufRead,
    format: TraceFormat,
    key_size: usize,
    limit: u64,
) -> Result<Trace, String> {
    let mut ids: HashMap<Box<str>, u32> = HashMap::new();
    let mut keys: Vec<Box<[u8]>> = Vec::new();
    let mut sizes: Vec<u32> = Vec::new();
    let mut requests = Vec::new();
    let mut skipped = 0u64;
    let mut columns = KVCACHE_DEFAULT;
    let mut first = true;
    for (n, line) in reader.lines().enumerate() {
        if requests.len() as u64 >= limit {
            break;
        }
        let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
        let line = line.trim_end_matches(['\r', '\n']);
        if line.trim().is_empty() {
            continue;
        }
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if format == TraceFormat::CachelibKvcache
            && std::mem::take(&mut first)
            && let Some(header) = kvcache_header(line).map_err(at)?
        {
            columns = header;
            continue;
        }
        let (key, recorded_key_size, op, size, repeats) = match format {
            TraceFormat::Twitter => twitter_line(line),
            _ => kvcache_line(&line.split(',').collect::<Vec<_>>(), &columns),
        }
        .map_err(at)?;
        let Some(op) = op else {
            skipped += 1;
            continue;
        };
        let id = match ids.get(key) {
            Some(id) => *id,
            None => {
                let id = u32::try_from(keys.len()).map_err(|_| too_many_keys())?;
                keys.push(padded_key(key, recorded_key_size.max(key_size)).map_err(at)?);
                sizes.push(0);
                ids.insert(key.into(), id);
                id
            }
        };
        if sizes[id as usize] == 0 {
            sizes[id as usize] = size;
        }
        let repeats = repeats.min(limit - requests.len() as u64);
        requests.extend((0..repeats).map(|_| TraceRequest { key: id, op }));
    }
    Ok(Trace {
        format,
        requests,
        keys: Keys::Strings(keys),
        sizes,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8], format: TraceFormat) -> Result<Trace, String> {
        Trace::parse(bytes, format, 16, None)
    }

    fn ids(trace: &Trace) -> Vec<u32> {
        trace.requests.iter().map(|r| r.key).collect()
    }

    #[test]
    fn caffeine_u32_is_big_endian_and_signed_keys_keep_their_bits() {
        let mut bytes = Vec::new();
        for key in [7i32, -1, 7, 123_456] {
            bytes.extend_from_slice(&key.to_be_bytes());
        }
        let trace = parse(&bytes, TraceFormat::CaffeineU32).unwrap();
        assert_eq!(ids(&trace), [0, 1, 0, 2]);
        assert_eq!(trace.unique_keys(), 3);
        assert_eq!(trace.key(0), b"0000000000000007");
        assert_eq!(trace.key(1), b"0000004294967295");
        assert!(trace.requests.iter().all(|r| r.op == TraceOp::Get));
        assert!(trace.sizes.is_empty());
        // The limit cuts the sequence.
        let cut = Trace::parse(&bytes[..], TraceFormat::CaffeineU32, 16, Some(2)).unwrap();
        assert_eq!(cut.len(), 2);
    }

    #[test]
    fn caffeine_u64_keys_wider_than_key_size_are_padded_to_one_width() {
        let mut bytes = Vec::new();
        for key in [u64::MAX, 5, u64::MAX] {
            bytes.extend_from_slice(&key.to_be_bytes());
        }
        let trace = parse(&bytes, TraceFormat::CaffeineU64).unwrap();
        assert_eq!(ids(&trace), [0, 1, 0]);
        assert_eq!(trace.key(0), b"18446744073709551615");
        assert_eq!(trace.key(1), b"00000000000000000005");
    }

    #[test]
    fn binary_traces_with_a_partial_key_or_nothing_fail_clearly() {
        let err = parse(&[0, 0, 0, 1, 0, 0], TraceFormat::CaffeineU32).unwrap_err();
        assert!(
            err.contains("truncated: 2 trailing bytes after 1 keys"),
            "{err}"
        );
        let err = parse(&[0; 12], TraceFormat::CaffeineU64).unwrap_err();
        assert!(err.contains("truncated"), "{err}");
        let err = parse(&[], TraceFormat::CaffeineU32).unwrap_err();
        assert!(err.contains("no request"), "{err}");
    }

    #[test]
    fn kvcache_default_columns_op_count_and_sizes() {
        let text = "\
1234,GET,0,2,20
1234,SET,100,1,20

99,GET_LEASE,0,1,4,3600
99,SET_LEASE,50,1,4
1234,DELETE,0,1,20,
";
        let trace = parse(text.as_bytes(), TraceFormat::CachelibKvcache).unwrap();
        let ops: Vec<TraceOp> = trace.requests.iter().map(|r| r.op).collect();
        use TraceOp::*;
        assert_eq!(ops, [Get, Get, Set, Get, Set, Delete]);
        assert_eq!(ids(&trace), [0, 0, 0, 1, 1, 0]);
        // Padded to max(--key-size, the recorded key size).
        assert_eq!(trace.key(0), b"00000000000000001234");
        assert_eq!(trace.key(1), b"0000000000000099");
        // The first non-zero size of each key.
        assert_eq!(trace.sizes, [100, 50]);
        let summary = trace.summary(Path::new("t.csv"));
        assert_eq!((summary.gets, summary.sets, summary.deletes), (3, 2, 1));
    }

    #[test]
    fn kvcache_header_sets_the_column_order() {
        let text = "\
op_time,key,key_size,op,op_count,size,cache_hits,ttl
564726470,abc,7,GET,3,0,1,
564726471,abc,7,SET,1,80,0,3600
";
        let trace = parse(text.as_bytes(), TraceFormat::CachelibKvcache).unwrap();
        assert_eq!(trace.len(), 4);
        assert_eq!(trace.key(0), b"0000000000000abc");
        assert_eq!(trace.sizes, [80]);
        let err = parse(b"key,_op,size\n1,GET,0\n", TraceFormat::CachelibKvcache).unwrap_err();
        assert!(err.contains("no column \"op\""), "{err}");
    }

    #[test]
    fn kvcache_malformed_lines_name_the_line() {
        for (text, needle) in [
            ("1,GET,0,1,4\n2,GOT,0,1,4\n", "line 2: unknown op \"GOT\""),
            ("1,GET,zero,1,4\n", "line 1: size \"zero\" is not a number"),
            ("1,GET,0\n", "line 1: 3 fields, expected at least 5"),
            ("1,GET,0,0,4\n", "line 1: op_count is 0"),
            ("a b,GET,0,1,4\n", "line 1: key \"a b\" holds byte 0x20"),
            ("1,GET,0,1,-4\n", "key_size \"-4\" is not a number"),
        ] {
            let err = parse(text.as_bytes(), TraceFormat::CachelibKvcache).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        let long = format!("{},GET,0,1,4\n", "k".repeat(300));
        let err = parse(long.as_bytes(), TraceFormat::CachelibKvcache).unwrap_err();
        assert!(err.contains("key of 300 bytes"), "{err}");
    }

    #[test]
    fn twitter_ops_sizes_and_keys_with_commas() {
        let text = "\
0,nz:u:eeW511W3,20,0,1,get,0
1,nz:u:eeW511W3,20,400,1,set,3600
2,other:k,30,90,2,add,0
3,a,b,5,7,1,gets,0
4,nz:u:eeW511W3,20,0,1,incr,0
5,other:k,30,0,2,delete,0
";
        let trace = parse(text.as_bytes(), TraceFormat::Twitter).unwrap();
        use TraceOp::*;
        let ops: Vec<TraceOp> = trace.requests.iter().map(|r| r.op).collect();
        assert_eq!(ops, [Get, Set, Set, Get, Delete]);
        assert_eq!(ids(&trace), [0, 0, 1, 2, 1]);
        assert_eq!(trace.skipped, 1);
        assert_eq!(trace.key(0), b"0000000nz:u:eeW511W3");
        assert_eq!(trace.key(2), b"0000000000000a,b");
        assert_eq!(trace.sizes, [400, 90, 7]);
    }

    #[test]
    fn twitter_malformed_lines_name_the_line() {
        for (text, needle) in [
            ("0,k,1,2,3,get\n", "line 1: 6 fields, expected 7"),
            (
                "0,k,1,2,3,get,0\nx,k,1,2,3,get,0\n",
                "line 2: timestamp \"x\"",
            ),
            ("0,k,1,big,3,get,0\n", "value size \"big\" is not a number"),
            ("0,k,1,2,3,fetch,0\n", "unknown operation \"fetch\""),
            ("0,,1,2,3,get,0\n", "empty key"),
        ] {
            let err = parse(text.as_bytes(), TraceFormat::Twitter).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn xz_files_are_decompressed_by_extension() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("zc-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut bytes = Vec::new();
        for key in [1u32, 2, 1] {
            bytes.extend_from_slice(&key.to_be_bytes());
        }
        let plain = dir.join("t.trace");
        std::fs::write(&plain, &bytes).unwrap();
        let xz = dir.join("t.trace.xz");
        let mut encoder = liblzma::write::XzEncoder::new(File::create(&xz).unwrap(), 6);
        encoder.write_all(&bytes).unwrap();
        encoder.finish().unwrap();
        let a = Trace::load(&plain, TraceFormat::CaffeineU32, 16, None).unwrap();
        let b = Trace::load(&xz, TraceFormat::CaffeineU32, 16, None).unwrap();
        // Not xz at all, though named so: an error, not a panic.
        std::fs::write(dir.join("bad.xz"), b"plain").unwrap();
        let bad = Trace::load(&dir.join("bad.xz"), TraceFormat::CaffeineU32, 16, None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(a.requests, b.requests);
        assert_eq!(ids(&b), [0, 1, 0]);
        assert!(bad.unwrap_err().contains("bad.xz"));
    }
}
