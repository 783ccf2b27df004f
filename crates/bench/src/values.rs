//! Value bytes: sizes, η-compressible synthetic content and real-data content, generated
//! deterministically from (key id, version) so every GET can be verified.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// The SplitMix64 finaliser: a fast, well-mixed hash of a 64-bit word.
pub fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Bytes of the version stamp at the start of a synthetic value's random part.
const STAMP: usize = 8;

/// Value sizes: one size, or a weighted distribution (fixed per key so a GET knows the size).
#[derive(Clone, Debug)]
pub enum SizeDist {
    Fixed(usize),
    Weighted {
        sizes: Vec<usize>,
        /// Cumulative weights, normalised so the last is 1.
        cumulative: Vec<f64>,
    },
    /// The sizes a trace records, by dense key id; ids it records none for (size 0, or
    /// past the end) take `fallback`.
    PerKey {
        sizes: Arc<[u32]>,
        fallback: Box<SizeDist>,
        mean: f64,
    },
}

impl SizeDist {
    /// Reads `SIZE WEIGHT` (or `SIZE,WEIGHT`) lines; `#` starts a comment.
    pub fn from_file(path: &Path) -> Result<SizeDist, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--value-size-file {}: {e}", path.display()))?;
        let mut sizes = Vec::new();
        let mut weights = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut fields = line.split([',', ' ', '\t']).filter(|f| !f.is_empty());
            let bad = || format!("{}:{}: expected `SIZE WEIGHT`", path.display(), n + 1);
            let size = zipcache::parse_size(fields.next().ok_or_else(bad)?).map_err(|_| bad())?;
            let weight: f64 = fields
                .next()
                .map_or(Ok(1.0), str::parse)
                .map_err(|_| bad())?;
            if size == 0 || !weight.is_finite() || weight <= 0.0 {
                return Err(bad());
            }
            sizes.push(size as usize);
            weights.push(weight);
        }
        if sizes.is_empty() {
            return Err(format!("{}: no sizes", path.display()));
        }
        let total: f64 = weights.iter().sum();
        let cumulative = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w / total;
                Some(*acc)
            })
            .collect();
        Ok(SizeDist::Weighted { sizes, cumulative })
    }

    pub fn size_of(&self, key_id: u64, seed: u64) -> usize {
        match self {
            SizeDist::Fixed(size) => *size,
            SizeDist::Weighted { sizes, cumulative } => {
                let u = (mix64(key_id ^ mix64(seed ^ 0x5151)) >> 11) as f64 / (1u64 << 53) as f64;
                let i = cumulative.partition_point(|c| *c <= u).min(sizes.len() - 1);
                sizes[i]
            }
            SizeDist::PerKey {
                sizes, fallback, ..
            } => match sizes.get(key_id as usize) {
                Some(&size) if size > 0 => size as usize,
                _ => fallback.size_of(key_id, seed),
            },
        }
    }

    /// Sizes recorded per key id (`sizes[id]`, 0 = not recorded), the rest from `fallback`.
    pub fn per_key(sizes: Vec<u32>, fallback: SizeDist, seed: u64) -> SizeDist {
        let mean = if sizes.is_empty() {
            fallback.mean()
        } else {
            let sum: f64 = (0..sizes.len() as u64)
                .map(|id| match sizes[id as usize] {
                    0 => fallback.size_of(id, seed) as f64,
                    size => size as f64,
                })
                .sum();
            sum / sizes.len() as f64
        };
        SizeDist::PerKey {
            sizes: sizes.into(),
            fallback: Box::new(fallback),
            mean,
        }
    }

    /// Whether some key may have a value of `len` bytes.
    pub fn has_size(&self, len: usize) -> bool {
        match self {
            SizeDist::Fixed(size) => *size == len,
            SizeDist::Weighted { sizes, .. } => sizes.contains(&len),
            SizeDist::PerKey {
                sizes, fallback, ..
            } => sizes.contains(&(len as u32)) || fallback.has_size(len),
        }
    }

    /// Mean size, for sizing working sets and budgets.
    pub fn mean(&self) -> f64 {
        match self {
            SizeDist::Fixed(size) => *size as f64,
            SizeDist::Weighted { sizes, cumulative } => {
                let mut prev = 0.0;
                sizes
                    .iter()
                    .zip(cumulative)
                    .map(|(s, c)| {
                        let w = c - prev;
                        prev = *c;
                        *s as f64 * w
                    })
                    .sum()
            }
            SizeDist::PerKey { mean, .. } => *mean,
        }
    }
}

/// What the bytes of a value are.
#[derive(Clone, Debug)]
pub enum Content {
    /// The paper's (and FIO's) method: fraction `eta` of the value is zeros, the rest random.
    Synthetic { eta: f64 },
    /// Records of a real public dataset, concatenated from a per-key starting row.
    Dataset(Arc<Dataset>),
    /// JSON documents: arrays of consecutive records of one real table ([`Documents`]).
    Documents(Arc<Documents>),
    /// JSON documents of many schemas: objects and arrays cut out of many real JSON
    /// files ([`MixedDocuments`]).
    MixedDocuments(Arc<MixedDocuments>),
}

/// Generates and verifies values.
#[derive(Clone, Debug)]
pub struct ValueGen {
    pub sizes: SizeDist,
    pub content: Content,
    pub seed: u64,
    /// Sizes of versions other than 0 (overwrites), each (key, version) drawing its own,
    /// so overwrites change a value's size (churn that moves objects between allocator
    /// size classes); version 0, what fills and look-aside misses store, keeps `sizes`.
    pub overwrite_sizes: Option<SizeDist>,
}

impl ValueGen {
    /// The value of `key_id` at `version`. Synthetic values carry their version (xor a key
    /// hash, so the stamp looks random) in their first bytes, which lets a reader check a
    /// value whose version it does not know.
    pub fn value(&self, key_id: u64, version: u64) -> Vec<u8> {
        self.value_of_len(key_id, version, self.size_for(key_id, version))
    }

    /// The size of `key_id`'s value at `version`.
    pub fn size_for(&self, key_id: u64, version: u64) -> usize {
        match &self.overwrite_sizes {
            Some(sizes) if version != 0 => sizes.size_of(key_id ^ mix64(version), self.seed),
            _ => self.sizes.size_of(key_id, self.seed),
        }
    }

    /// The bytes of `key_id`'s value at `version`, `len` long.
    fn value_of_len(&self, key_id: u64, version: u64, len: usize) -> Vec<u8> {
        match &self.content {
            Content::Synthetic { eta } => {
                let random = random_len(len, *eta);
                let version = if random >= STAMP { version } else { 0 };
                let mut value = vec![0u8; len];
                let mut state = mix64(self.seed ^ mix64(key_id) ^ mix64(version ^ 0xabcd));
                for chunk in value[..random].chunks_mut(8) {
                    state = mix64(state);
                    chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
                }
                if random >= STAMP {
                    let stamp = version ^ self.key_hash(key_id);
                    value[..STAMP].copy_from_slice(&stamp.to_le_bytes());
                }
                value
            }
            Content::Dataset(dataset) => dataset.fill(mix64(self.seed ^ key_id), len),
            Content::Documents(documents) => documents.document(mix64(self.seed ^ key_id), len),
            Content::MixedDocuments(documents) => {
                documents.document(mix64(self.seed ^ key_id), len).to_vec()
            }
        }
    }

    fn key_hash(&self, key_id: u64) -> u64 {
        mix64(key_id ^ self.seed.rotate_left(17))
    }

    /// Whether `bytes` is a value this generator could have produced for `key_id`.
    pub fn verify(&self, key_id: u64, bytes: &[u8]) -> bool {
        let stamped = match &self.content {
            Content::Synthetic { eta } => random_len(bytes.len(), *eta) >= STAMP,
            Content::Dataset(_) | Content::Documents(_) | Content::MixedDocuments(_) => false,
        };
        match &self.overwrite_sizes {
            _ if stamped => {
                let stamp = u64::from_le_bytes(bytes[..STAMP].try_into().expect("8 bytes"));
                // The stamp names the version, and the version the size.
                self.value(key_id, stamp ^ self.key_hash(key_id)) == bytes
            }
            // No stamp (too little random room, or a dataset): the content is the
            // key's alone. Its size is the key's own, unless overwrites draw sizes, in
            // which case the length must at least be one of theirs.
            Some(sizes) if sizes.has_size(bytes.len()) => {
                self.value_of_len(key_id, 0, bytes.len()) == bytes
            }
            _ => self.value(key_id, 0) == bytes,
        }
    }
}

/// Bytes of a synthetic value of `len` bytes that are random rather than zeros.
pub fn random_len(len: usize, eta: f64) -> usize {
    len - ((len as f64 * eta).round() as usize).min(len)
}

/// A real dataset, as rows of text.
#[derive(Debug)]
pub struct Dataset {
    pub name: String,
    pub path: PathBuf,
    rows: Vec<Vec<u8>>,
}

/// The PyPI package the real-data value sources come from.
pub const DATASET_PACKAGE: &str = "vega_datasets";

impl Dataset {
    /// Loads dataset `name` (a file of the `vega_datasets` package, e.g. `airports`,
    /// `seattle-weather`, `cars`): CSV rows, or JSON records re-serialised one per row.
    pub fn load(name: &str) -> Result<Dataset, String> {
        Self::load_from(&dataset_dir()?, name)
    }

    /// Loads dataset `name` from the files in `dir`.
    pub fn load_from(dir: &Path, name: &str) -> Result<Dataset, String> {
        let (path, text) = read_table(dir, name)?;
        let rows: Vec<Vec<u8>> = if is_json(&path) {
            json_records(&path, &text)?
        } else {
            // Skip the header: a cache holds records, not column names.
            text.lines()
                .skip(1)
                .map(|l| l.as_bytes().to_vec())
                .collect()
        };
        if rows.is_empty() {
            return Err(format!("{}: no rows", path.display()));
        }
        Ok(Dataset {
            name: name.into(),
            path,
            rows,
        })
    }

    /// `len` bytes of consecutive rows (newline-separated) starting at row `start % rows`.
    fn fill(&self, start: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 128);
        let mut row = (start % self.rows.len() as u64) as usize;
        while out.len() < len {
            out.extend_from_slice(&self.rows[row]);
            out.push(b'\n');
            row = (row + 1) % self.rows.len();
        }
        out.truncate(len);
        out
    }
}

/// The file of table `name` in `dir` (`name.csv` or `name.json`) and its text.
fn read_table(dir: &Path, name: &str) -> Result<(PathBuf, String), String> {
    let path = ["csv", "json"]
        .iter()
        .map(|ext| dir.join(format!("{name}.{ext}")))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no dataset {name:?} in {} (has: {})",
                dir.display(),
                available(dir).join(", ")
            )
        })?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((path, text))
}

fn is_json(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "json")
}

/// The records of a JSON array, each serialised on its own.
fn json_records(path: &Path, text: &str) -> Result<Vec<Vec<u8>>, String> {
    let records: Vec<serde_json::Value> = serde_json::from_str(text)
        .map_err(|e| format!("{}: not a JSON array: {e}", path.display()))?;
    Ok(records.iter().map(|r| r.to_string().into_bytes()).collect())
}

/// The rows of a CSV text as JSON objects named by its header: numbers as numbers, the
/// rest as strings.
fn csv_records(text: &str) -> Vec<Vec<u8>> {
    let mut lines = text.lines();
    let header = csv_fields(lines.next().unwrap_or(""));
    lines
        .filter(|l| !l.is_empty())
        .map(|line| {
            let object: serde_json::Map<String, serde_json::Value> = header
                .iter()
                .cloned()
                .zip(csv_fields(line).into_iter().map(json_scalar))
                .collect();
            serde_json::Value::Object(object).to_string().into_bytes()
        })
        .collect()
}

/// The fields of a CSV line; a field in double quotes may hold commas and `""` quotes.
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let field = fields.last_mut().expect("never empty");
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(String::new()),
            c => field.push(c),
        }
    }
    fields
}

fn json_scalar(field: String) -> serde_json::Value {
    if let Ok(n) = field.parse::<i64>() {
        return n.into();
    }
    match field
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
    {
        Some(n) => n.into(),
        None => field.into(),
    }
}

/// The tables of `vega_datasets` that JSON documents are cut from: every one with at
/// least 8 KiB of records, so that no document repeats its table.
pub const DOCUMENT_TABLES: [&str; 8] = [
    "airports",
    "cars",
    "la-riots",
    "seattle-weather",
    "stocks",
    "us-employment",
    "iris",
    "barley",
];

/// The shortest JSON document but for a table of less.
pub const MIN_DOCUMENT: usize = 256;

/// JSON documents of real records: a key's document is a JSON array of consecutive
/// records of one table (CSV rows as objects named by the header), its table and first
/// record chosen by the key, as long as its target size allows (at least one record).
#[derive(Debug)]
pub struct Documents {
    tables: Vec<(String, Vec<Vec<u8>>)>,
}

impl Documents {
    /// The documents of [`DOCUMENT_TABLES`] in the installed `vega_datasets`.
    pub fn load() -> Result<Documents, String> {
        Self::load_from(&dataset_dir()?, &DOCUMENT_TABLES)
    }

    /// The documents of tables `names` in `dir`.
    pub fn load_from(dir: &Path, names: &[&str]) -> Result<Documents, String> {
        let mut tables = Vec::with_capacity(names.len());
        for name in names {
            let (path, text) = read_table(dir, name)?;
            let records = if is_json(&path) {
                json_records(&path, &text)?
            } else {
                csv_records(&text)
            };
            if records.is_empty() {
                return Err(format!("{}: no records", path.display()));
            }
            tables.push((name.to_string(), records));
        }
        if tables.is_empty() {
            return Err("JSON documents need at least one table".into());
        }
        Ok(Documents { tables })
    }

    /// Every table's name and its records (JSON objects).
    pub fn tables(&self) -> impl Iterator<Item = (&str, &[Vec<u8>])> {
        self.tables
            .iter()
            .map(|(name, records)| (name.as_str(), records.as_slice()))
    }

    /// The document that `pick` (a hash of the key) chooses: records while they fit in
    /// `len` bytes, and while it is shorter than [`MIN_DOCUMENT`] (at least one).
    fn document(&self, pick: u64, len: usize) -> Vec<u8> {
        let (_, records) = &self.tables[(pick % self.tables.len() as u64) as usize];
        let mut row = (mix64(pick) % records.len() as u64) as usize;
        let mut out = Vec::with_capacity(len);
        out.push(b'[');
        for _ in 0..records.len() {
            let record = &records[row];
            let more = out.len() > 1;
            if more && out.len() >= MIN_DOCUMENT && out.len() + 1 + record.len() + 1 > len {
                break;
            }
            if more {
                out.push(b',');
            }
            out.extend_from_slice(record);
            row = (row + 1) % records.len();
        }
        out.push(b']');
        out
    }

    /// Document sizes when no `--value-size-file` says otherwise: log-normal (median
    /// 470 bytes, σ = 0.75) from 256 B to 8 KiB in 64 steps, so that the documents, which
    /// end at a record within their size, have a median of about 550 bytes.
    pub fn sizes() -> SizeDist {
        const MEDIAN: f64 = 470.0;
        const SIGMA: f64 = 0.75;
        const STEPS: usize = 64;
        let (low, high) = (256f64.ln(), 8192f64.ln());
        let sizes: Vec<usize> = (0..STEPS)
            .map(|i| {
                (low + (high - low) * i as f64 / (STEPS - 1) as f64)
                    .exp()
                    .round() as usize
            })
            .collect();
        let density = |size: usize| {
            let z = ((size as f64).ln() - MEDIAN.ln()) / SIGMA;
            (-z * z / 2.0).exp()
        };
        let total: f64 = sizes.iter().map(|&s| density(s)).sum();
        let cumulative = sizes
            .iter()
            .scan(0.0, |acc, &s| {
                *acc += density(s) / total;
                Some(*acc)
            })
            .collect();
        SizeDist::Weighted { sizes, cumulative }
    }
}

/// The PyPI package `--values json-mixed` cuts its documents from: botocore (Apache-2.0,
/// Amazon.com, Inc.), whose `data` directory holds ~1,900 JSON files of ~450 services —
/// API models, endpoint rule sets, request and response examples, paginators, waiters.
pub const MIXED_PACKAGE: &str = "botocore";

/// The longest a JSON document of [`MixedDocuments`] is.
pub const MAX_DOCUMENT: usize = 8192;

/// JSON documents of many schemas: every object and array, [`MIN_DOCUMENT`] to
/// [`MAX_DOCUMENT`] bytes once serialised compactly, found at any depth of the JSON files
/// (`.json`, `.json.gz`) under a directory, each once. Unlike [`Documents`], whose
/// records repeat one table's field names, neighbouring keys hold documents of
/// unrelated shapes, as a cache of many applications' objects does.
#[derive(Debug)]
pub struct MixedDocuments {
    /// Distinct, shortest first (ties in byte order), so that a build is deterministic.
    docs: Vec<Vec<u8>>,
    files: usize,
}

impl MixedDocuments {
    /// The documents of the installed [`MIXED_PACKAGE`].
    pub fn load() -> Result<MixedDocuments, String> {
        let dir = package_dir(
            MIXED_PACKAGE,
            "data",
            "ZIPCACHE_MIXED_JSON_DIR",
            "--values json-mixed",
        )?;
        Self::load_from(&dir)
    }

    /// The documents of every JSON file under `dir`.
    pub fn load_from(dir: &Path) -> Result<MixedDocuments, String> {
        let mut paths = Vec::new();
        json_files(dir, &mut paths)?;
        paths.sort();
        let mut docs = Vec::new();
        for path in &paths {
            let value: serde_json::Value = read_json(path)?;
            cut_documents(&value, &mut docs);
        }
        docs.sort_unstable_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        docs.dedup();
        if docs.is_empty() {
            return Err(format!(
                "{}: no JSON object or array of {MIN_DOCUMENT}–{MAX_DOCUMENT} bytes in {} files",
                dir.display(),
                paths.len()
            ));
        }
        Ok(MixedDocuments {
            docs,
            files: paths.len(),
        })
    }

    /// Documents held, and the files they came from.
    pub fn counts(&self) -> (usize, usize) {
        (self.docs.len(), self.files)
    }

    /// The document `pick` (a hash of the key) chooses for a value of `len` bytes: one
    /// of those from three quarters of `len` to `len` long, or the longest shorter one
    /// where there is none (the shortest where none is shorter).
    fn document(&self, pick: u64, len: usize) -> &[u8] {
        let end = self.docs.partition_point(|d| d.len() <= len);
        let start = self.docs.partition_point(|d| d.len() < len * 3 / 4);
        let i = match end.checked_sub(start) {
            Some(n) if n > 0 => start + (pick % n as u64) as usize,
            _ => end.saturating_sub(1),
        };
        &self.docs[i]
    }
}

/// Every `.json` and `.json.gz` file under `dir`.
fn json_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            json_files(&path, out)?;
        } else if name.ends_with(".json") || name.ends_with(".json.gz") {
            out.push(path);
        }
    }
    Ok(())
}

/// A JSON file, gzip-compressed where its name ends in `.gz`.
fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let bad = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| bad(&e))?;
    let reader = std::io::BufReader::new(file);
    if path.extension().is_some_and(|e| e == "gz") {
        serde_json::from_reader(flate2::read::GzDecoder::new(reader)).map_err(|e| bad(&e))
    } else {
        serde_json::from_reader(reader).map_err(|e| bad(&e))
    }
}

/// Adds every object and array in `value` (itself included) whose compact form is
/// [`MIN_DOCUMENT`] to [`MAX_DOCUMENT`] bytes long to `docs`.
fn cut_documents(value: &serde_json::Value, docs: &mut Vec<Vec<u8>>) {
    let children: Box<dyn Iterator<Item = &serde_json::Value>> = match value {
        serde_json::Value::Object(map) => Box::new(map.values()),
        serde_json::Value::Array(items) => Box::new(items.iter()),
        _ => return,
    };
    let text = value.to_string().into_bytes();
    // Nothing shorter than a document holds one.
    if text.len() < MIN_DOCUMENT {
        return;
    }
    if text.len() <= MAX_DOCUMENT {
        docs.push(text);
    }
    for child in children {
        cut_documents(child, docs);
    }
}

fn available(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name
                .strip_suffix(".csv")
                .or_else(|| name.strip_suffix(".json"))?;
            Some(stem.to_string())
        })
        .collect();
    names.sort();
    names
}

/// The data directory of the installed `vega_datasets` package: `$ZIPCACHE_DATASETS_DIR`, or
/// asked of `python3`, which knows where its site-packages are.
fn dataset_dir() -> Result<PathBuf, String> {
    package_dir(
        DATASET_PACKAGE,
        "_data",
        "ZIPCACHE_DATASETS_DIR",
        "real-data values",
    )
}

/// Directory `subdir` of the installed PyPI package `package` (its import name too):
/// `$env` if set, or asked of `python3`, which knows where its site-packages are. `what`
/// names the values that need it in the error.
fn package_dir(package: &str, subdir: &str, env: &str, what: &str) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(env) {
        return Ok(PathBuf::from(dir));
    }
    let missing = || {
        format!(
            "{what} need the PyPI package {package}: `pip install {package}` \
             (or point {env} at a directory of its data files)"
        )
    };
    let output = Command::new("python3")
        .args([
            "-c",
            &format!("import os, {package}; print(os.path.dirname({package}.__file__))"),
        ])
        .output()
        .map_err(|_| missing())?;
    if !output.status.success() {
        return Err(missing());
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join(subdir);
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(missing())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(size: usize, eta: f64) -> ValueGen {
        ValueGen {
            sizes: SizeDist::Fixed(size),
            content: Content::Synthetic { eta },
            seed: 11,
            overwrite_sizes: None,
        }
    }

    #[test]
    fn eta_is_the_fraction_of_zeros() {
        for eta in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let generator = synthetic(1000, eta);
            for key in 0..50 {
                let value = generator.value(key, key * 3);
                assert_eq!(value.len(), 1000);
                let zeros = value.iter().filter(|b| **b == 0).count();
                let expected = (1000.0 * eta) as usize;
                // Random bytes are zero one time in 256.
                assert!(
                    zeros >= expected && zeros <= expected + 15,
                    "eta {eta}: {zeros} zeros"
                );
                assert!(value[1000 - expected..].iter().all(|b| *b == 0));
            }
        }
    }

    #[test]
    fn values_verify_whatever_their_version() {
        let generator = synthetic(64, 0.5);
        let v7 = generator.value(5, 7);
        assert_ne!(v7, generator.value(5, 8));
        assert!(generator.verify(5, &v7));
        assert!(!generator.verify(6, &v7), "another key's value must fail");
        let mut corrupt = v7.clone();
        corrupt[20] ^= 1;
        assert!(!generator.verify(5, &corrupt));
        // Too little random room for a stamp: only version 0 exists, still verifiable.
        let tiny = synthetic(8, 0.5);
        assert_eq!(tiny.value(3, 9), tiny.value(3, 0));
        assert!(tiny.verify(3, &tiny.value(3, 9)));
    }

    #[test]
    fn datasets_load_csv_rows_and_json_records() {
        let dir = std::env::temp_dir().join(format!("zc-datasets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("towns.csv"),
            "name,pop\nOslo,700000\nBergen,290000\n",
        )
        .unwrap();
        std::fs::write(dir.join("pets.json"), r#"[{"a":1},{"b":2}]"#).unwrap();
        let csv = Dataset::load_from(&dir, "towns").unwrap();
        let json = Dataset::load_from(&dir, "pets").unwrap();
        let missing = Dataset::load_from(&dir, "nope").unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            csv.rows,
            vec![b"Oslo,700000".to_vec(), b"Bergen,290000".to_vec()]
        );
        assert_eq!(
            json.rows,
            vec![br#"{"a":1}"#.to_vec(), br#"{"b":2}"#.to_vec()]
        );
        assert!(missing.contains("pets, towns"), "{missing}");
        // Rows wrap around and the value is cut to its size.
        assert_eq!(
            csv.fill(1, 30),
            b"Bergen,290000\nOslo,700000\nBerg".to_vec()
        );
        let generator = ValueGen {
            sizes: SizeDist::Fixed(40),
            content: Content::Dataset(Arc::new(csv)),
            seed: 1,
            overwrite_sizes: None,
        };
        let value = generator.value(9, 5);
        assert_eq!(value.len(), 40);
        assert!(generator.verify(9, &value));
    }

    fn documents(sizes: SizeDist, documents: Documents) -> ValueGen {
        ValueGen {
            sizes,
            content: Content::Documents(Arc::new(documents)),
            seed: 5,
            overwrite_sizes: None,
        }
    }

    #[test]
    fn documents_are_json_arrays_of_one_tables_records() {
        let dir = std::env::temp_dir().join(format!("zc-documents-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut towns =
            "name,pop,note\nOslo,700000,\"cold, \"\"dark\"\"\"\nBergen,2.9e5,wet\n".to_string();
        let mut pets = r#"[{"a":1},{"b":[2,3]}"#.to_string();
        for i in 0..40 {
            towns += &format!("Town {i},{i},\n");
            pets += &format!(r#",{{"a":{i}}}"#);
        }
        std::fs::write(dir.join("towns.csv"), towns).unwrap();
        std::fs::write(dir.join("pets.json"), pets + "]").unwrap();
        let loaded = Documents::load_from(&dir, &["towns", "pets"]).unwrap();
        let missing = Documents::load_from(&dir, &["towns", "nope"]).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(missing.contains("nope"), "{missing}");
        let towns = &loaded.tables[0].1;
        let oslo: serde_json::Value = serde_json::from_slice(&towns[0]).unwrap();
        assert_eq!(
            oslo,
            serde_json::json!({"name": "Oslo", "pop": 700000, "note": "cold, \"dark\""})
        );
        let bergen: serde_json::Value = serde_json::from_slice(&towns[1]).unwrap();
        assert_eq!(bergen["pop"], serde_json::json!(290000.0));
        assert_eq!(towns.len(), 42);
        let generator = documents(SizeDist::Fixed(300), loaded);
        let mut tables = std::collections::HashSet::new();
        for key in 0..40 {
            let doc = generator.value(key, 0);
            assert_eq!(
                doc,
                generator.value(key, 9),
                "a document is the key's alone"
            );
            assert!(generator.verify(key, &doc));
            let records: Vec<serde_json::Value> = serde_json::from_slice(&doc).unwrap();
            assert!(!records.is_empty());
            // At least the shortest document, within its size (300 here).
            assert!((MIN_DOCUMENT..=300).contains(&doc.len()), "{}", doc.len());
            tables.insert(records[0].get("a").is_some() || records[0].get("b").is_some());
        }
        assert_eq!(tables.len(), 2, "keys choose both tables");
    }

    #[test]
    fn document_sizes_span_256_bytes_to_8_kib_around_560() {
        let sizes = Documents::sizes();
        let drawn: Vec<usize> = (0..20_000).map(|k| sizes.size_of(k, 3)).collect();
        assert!(drawn.iter().all(|s| (256..=8192).contains(s)));
        let mut sorted = drawn.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2];
        assert!((520..=640).contains(&median), "median {median}");
        assert!(
            sorted[sorted.len() * 99 / 100] > 2048,
            "a tail of large documents"
        );
    }

    /// The documents the bench serves: the tables `scripts/test.sh` installs.
    #[test]
    fn documents_of_vega_datasets_verify_and_differ_by_key() {
        let generator = documents(Documents::sizes(), Documents::load().unwrap());
        let mut lens = Vec::new();
        for key in 0..2_000 {
            let doc = generator.value(key, 0);
            assert!(generator.verify(key, &doc));
            assert!(!generator.verify(key + 1, &doc) || doc == generator.value(key + 1, 0));
            serde_json::from_slice::<Vec<serde_json::Value>>(&doc).unwrap();
            assert!((MIN_DOCUMENT..=8192).contains(&doc.len()), "{}", doc.len());
            lens.push(doc.len());
        }
        lens.sort_unstable();
        let median = lens[lens.len() / 2];
        assert!((500..=620).contains(&median), "median {median}");
    }

    fn mixed(documents: MixedDocuments) -> ValueGen {
        ValueGen {
            sizes: Documents::sizes(),
            content: Content::MixedDocuments(Arc::new(documents)),
            seed: 5,
            overwrite_sizes: None,
        }
    }

    /// An object of `fields` string fields of `width` characters, named by `prefix`.
    fn object(prefix: &str, fields: usize, width: usize) -> serde_json::Value {
        (0..fields)
            .map(|i| (format!("{prefix}{i}"), "x".repeat(width).into()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    #[test]
    fn mixed_documents_are_the_objects_and_arrays_of_every_json_file_within_bounds() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("zc-mixed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("service/2024")).unwrap();
        // A file longer than a document: its members are documents, the short one
        // is not; inside the array, each object is one too (and the array, once short
        // enough).
        let small = object("s", 3, 10);
        let medium = object("m", 10, 40);
        let items: Vec<serde_json::Value> =
            (0..3).map(|i| object(&format!("i{i}"), 4, 70)).collect();
        let whole = serde_json::json!({"small": small, "medium": medium, "items": items,
            "big": object("b", 40, 300)});
        std::fs::write(dir.join("a.json"), whole.to_string()).unwrap();
        // Nested and gzip-compressed; the same `medium` again counts once.
        let gz = serde_json::json!({"again": medium, "other": object("g", 8, 50)});
        let mut encoder = flate2::write::GzEncoder::new(
            std::fs::File::create(dir.join("service/2024/b.json.gz")).unwrap(),
            flate2::Compression::default(),
        );
        encoder.write_all(gz.to_string().as_bytes()).unwrap();
        encoder.finish().unwrap();
        std::fs::write(dir.join("service/notes.txt"), medium.to_string()).unwrap();
        let loaded = MixedDocuments::load_from(&dir).unwrap();
        let texts: Vec<String> = loaded
            .docs
            .iter()
            .map(|d| String::from_utf8(d.clone()).unwrap())
            .collect();
        let expected: std::collections::BTreeSet<String> = [
            medium.to_string(),
            serde_json::Value::Array(items.clone()).to_string(),
            items[0].to_string(),
            items[1].to_string(),
            items[2].to_string(),
            object("g", 8, 50).to_string(),
            gz.to_string(),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            texts
                .iter()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>(),
            expected
        );
        assert_eq!(texts.len(), expected.len(), "each document once");
        assert!(small.to_string().len() < MIN_DOCUMENT && whole.to_string().len() > MAX_DOCUMENT);
        assert_eq!(loaded.counts(), (7, 2));
        assert!(
            loaded.docs.windows(2).all(|w| w[0].len() <= w[1].len()),
            "shortest first"
        );
        std::fs::write(dir.join("broken.json"), "{\"a\": ").unwrap();
        let broken = MixedDocuments::load_from(&dir).unwrap_err();
        assert!(broken.contains("broken.json"), "{broken}");
        std::fs::remove_dir_all(&dir).unwrap();
        let empty = std::env::temp_dir().join(format!("zc-mixed-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        std::fs::write(empty.join("tiny.json"), "[1, 2]").unwrap();
        assert!(
            MixedDocuments::load_from(&empty)
                .unwrap_err()
                .contains("no JSON object")
        );
        std::fs::remove_dir_all(&empty).unwrap();
    }

    /// A key's document is one whose length is within a quarter below its drawn size,
    /// where the source has one; keys spread over all of them.
    #[test]
    fn a_mixed_document_is_near_its_size_and_chosen_by_the_key() {
        let docs: Vec<Vec<u8>> = (0..400)
            .map(|i| {
                let text = format!("[{i},\"{}\"]", "y".repeat(250 + i * 10));
                text.into_bytes()
            })
            .collect();
        let loaded = MixedDocuments { docs, files: 1 };
        for len in [600, 1000, 3000] {
            let chosen: std::collections::HashSet<&[u8]> = (0..500)
                .map(|pick| loaded.document(mix64(pick), len))
                .collect();
            assert!(
                chosen
                    .iter()
                    .all(|d| (len * 3 / 4..=len).contains(&d.len())),
                "{len}"
            );
            assert!(chosen.len() > 10, "{len}: {} documents", chosen.len());
        }
        // Shorter than every document: the shortest; longer than all: the longest.
        assert_eq!(loaded.document(1, 10).len(), loaded.docs[0].len());
        assert_eq!(loaded.document(1, 100_000), &loaded.docs[399][..]);
        let generator = mixed(loaded);
        for key in 0..200 {
            let doc = generator.value(key, 0);
            assert!(generator.verify(key, &doc));
            assert_eq!(doc, generator.value(key, 3), "a document has no version");
        }
    }

    /// The documents the bench serves: botocore's, which `scripts/test.sh` installs.
    #[test]
    fn mixed_documents_of_botocore_are_many_and_verify() {
        let loaded = MixedDocuments::load().unwrap();
        let (docs, files) = loaded.counts();
        assert!(
            docs > 50_000 && files > 500,
            "{docs} documents of {files} files"
        );
        let generator = mixed(loaded);
        let mut lens = Vec::new();
        for key in 0..2_000 {
            let doc = generator.value(key, 0);
            assert!(generator.verify(key, &doc));
            serde_json::from_slice::<serde_json::Value>(&doc).unwrap();
            lens.push(doc.len());
        }
        lens.sort_unstable();
        let median = lens[lens.len() / 2];
        assert!((400..=620).contains(&median), "median {median}");
    }

    #[test]
    fn size_distribution_is_stable_per_key() {
        let dir = std::env::temp_dir().join(format!("zc-sizes-{}", std::process::id()));
        std::fs::write(&dir, "# size weight\n32 1\n1KiB 3\n").unwrap();
        let dist = SizeDist::from_file(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert!((dist.mean() - (32.0 * 0.25 + 1024.0 * 0.75)).abs() < 1e-9);
        let big = (0..10_000).filter(|k| dist.size_of(*k, 1) == 1024).count();
        assert!((7_000..8_000).contains(&big), "{big}");
        assert_eq!(dist.size_of(77, 1), dist.size_of(77, 1));
    }

    #[test]
    fn per_key_sizes_fall_back_where_none_is_recorded() {
        let dist = SizeDist::per_key(vec![100, 0, 300], SizeDist::Fixed(64), 1);
        assert_eq!(dist.size_of(0, 1), 100);
        assert_eq!(dist.size_of(1, 1), 64);
        assert_eq!(dist.size_of(2, 1), 300);
        assert_eq!(dist.size_of(9, 1), 64);
        assert!((dist.mean() - 464.0 / 3.0).abs() < 1e-9);
        let generator = ValueGen {
            sizes: dist,
            content: Content::Synthetic { eta: 0.5 },
            seed: 1,
            overwrite_sizes: None,
        };
        let value = generator.value(2, 77);
        assert_eq!(value.len(), 300);
        assert!(generator.verify(2, &value));
    }

    #[test]
    fn overwrites_draw_their_own_sizes_and_still_verify() {
        let overwrites = SizeDist::Weighted {
            sizes: vec![12, 64, 300, 1500],
            cumulative: vec![0.25, 0.5, 0.75, 1.0],
        };
        let generator = ValueGen {
            sizes: SizeDist::Fixed(40),
            content: Content::Synthetic { eta: 0.5 },
            seed: 3,
            overwrite_sizes: Some(overwrites),
        };
        // Version 0 (fills) keeps the key's own size; other versions draw theirs.
        assert_eq!(generator.value(7, 0).len(), 40);
        let lens: std::collections::HashSet<usize> =
            (1..200).map(|v| generator.value(7, v).len()).collect();
        assert_eq!(lens, [12, 64, 300, 1500].into());
        for version in 0..200 {
            let value = generator.value(7, version);
            assert!(generator.verify(7, &value), "version {version}");
            assert!(!generator.verify(8, &value));
            // A value cut to another size is wrong.
            let cut = &value[..value.len().min(64)];
            assert!(cut.len() == value.len() || !generator.verify(7, cut));
        }
        // Stampless sizes (12 bytes at η 0.5: 6 random bytes) verify by content and size.
        let short = generator.value_of_len(7, 0, 12);
        assert!(generator.verify(7, &short));
        assert!(!generator.verify(7, &generator.value_of_len(7, 0, 13)));
        let mut bad = short.clone();
        bad[0] ^= 1;
        assert!(!generator.verify(7, &bad));
    }
}
