//! The caches a workload drives, behind one trait: in-process engines and network servers.

use std::path::PathBuf;
use std::time::Duration;

pub mod foyer;
pub mod network;
pub mod segcache;
pub mod zipcache;

/// One request of a batch.
#[derive(Clone, Debug)]
pub enum Request {
    Get(Vec<u8>),
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    /// Up to `limit` objects from this key on, in key order.
    Scan(Vec<u8>, usize),
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Value(Option<Vec<u8>>),
    Stored,
    Deleted(bool),
    Scanned(usize),
    /// The target has no such operation (e.g. a key-range scan on memcached).
    Unsupported,
    /// The target answered with an error; the operation counts as failed, not as a miss.
    Error(String),
}

/// A per-thread handle on a target. Executes a batch and returns each reply with its latency
/// (for a pipelined network client: from sending the batch to parsing that reply).
pub trait Client: Send {
    fn execute(
        &mut self,
        requests: &[Request],
        replies: &mut Vec<(Reply, Duration)>,
    ) -> Result<(), String>;

    /// How many requests this client takes per batch.
    fn batch_size(&self) -> usize;
}

/// What a target can say about itself; `None` = it cannot say.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub dram_hits: Option<u64>,
    pub ssd_hits: Option<u64>,
    pub dram_bytes_used: Option<u64>,
    pub objects_resident: Option<u64>,
    pub compression_ratio_dram: Option<f64>,
    pub wa_host: Option<f64>,
    pub wr_nand: Option<f64>,
    pub wa: Option<f64>,
    pub zeta: Option<f64>,
    pub ssd_objects: Option<u64>,
    pub ssd_index_bytes: Option<u64>,
    pub ssd_reads_per_ssd_get: Option<f64>,
    /// Resident set of the process holding the cache.
    pub rss_bytes: Option<u64>,
    /// CPU seconds the server process has used (network peers the bench started).
    pub server_cpu_seconds: Option<f64>,
    /// Bytes the cache process wrote to files (memcached extstore: `/proc/PID/io` wchar).
    pub host_bytes_written: Option<u64>,
}

/// A cache under test.
pub trait Target: Send + Sync {
    fn name(&self) -> &str;
    fn client(&self) -> Result<Box<dyn Client>, String>;
    fn snapshot(&self) -> Result<Snapshot, String>;
    /// Whether the target has no SSD tier, so every hit is a DRAM hit.
    fn dram_only(&self) -> bool;
    /// Counts resident keys among `0..keys` by probing, for targets that keep no count.
    fn probe_resident(&self) -> bool {
        false
    }
    /// Stops the target and releases what it holds (processes, files).
    fn close(self: Box<Self>) -> Result<(), String>;
}

/// The budgets every target gets, so rows are comparable.
#[derive(Clone, Debug)]
pub struct Budget {
    pub dram: u64,
    /// `None`: DRAM only.
    pub ssd: Option<u64>,
    pub data_dir: PathBuf,
    /// Mean object size (key + value), for sizing hash tables.
    pub mean_object: usize,
    pub settings: Vec<(String, String)>,
    pub threads: usize,
    pub connections: usize,
    pub pipeline: usize,
    /// PID of the server of a remote (`scheme://`) target, for its RSS and CPU time.
    pub server_pid: Option<u32>,
}

impl Budget {
    /// Requests per batch of every client: connections × pipeline depth.
    pub fn batch(&self) -> usize {
        self.connections.max(1) * self.pipeline.max(1)
    }
}

/// The `--target` names the bench starts itself.
pub const MANAGED: &[&str] = &[
    "zipcache",
    "foyer",
    "segcache",
    "memcached",
    "memcached-ext",
    "redis",
];

/// Opens target `spec`: a name of [`MANAGED`] or `zipcache://`, `memcached://`, `redis://H:P`.
pub fn open(spec: &str, budget: &Budget) -> Result<Box<dyn Target>, String> {
    use network::{NetTarget, Protocol};
    if let Some((scheme, addr)) = spec.split_once("://") {
        let protocol = match scheme {
            "zipcache" | "memcached" => Protocol::Memcached,
            "redis" => Protocol::Resp,
            _ => return Err(format!("unknown target scheme {scheme:?} in {spec:?}")),
        };
        return Ok(Box::new(NetTarget::remote(spec, addr, protocol, budget)?));
    }
    match spec {
        "zipcache" => Ok(Box::new(zipcache::ZipTarget::open(budget)?)),
        "foyer" => Ok(Box::new(foyer::FoyerTarget::open(budget)?)),
        "segcache" => Ok(Box::new(segcache::SegTarget::open(budget)?)),
        "memcached" | "memcached-ext" | "redis" => Ok(Box::new(NetTarget::spawn(spec, budget)?)),
        _ => Err(format!(
            "unknown target {spec:?}; known: {}, or memcached://H:P, redis://H:P, zipcache://H:P",
            MANAGED.join(", ")
        )),
    }
}

/// An in-process cache, called directly from the bench threads.
pub trait Engine: Send + Sync + 'static {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String>;
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String>;
    fn delete(&self, key: &[u8]) -> Result<bool, String>;
    /// Number of objects a key-range scan returned; `None` if the engine cannot scan.
    fn scan(&self, _from: &[u8], _limit: usize) -> Result<Option<usize>, String> {
        Ok(None)
    }
}

/// The [`Client`] of every in-process engine: requests run one at a time, each timed. It
/// serves as many virtual clients as a network client does, so every target sees the same
/// look-aside concurrency.
pub struct EngineClient<E> {
    pub engine: std::sync::Arc<E>,
    pub batch: usize,
}

impl<E: Engine> Client for EngineClient<E> {
    fn execute(
        &mut self,
        requests: &[Request],
        replies: &mut Vec<(Reply, Duration)>,
    ) -> Result<(), String> {
        let engine = &self.engine;
        for request in requests {
            let start = std::time::Instant::now();
            let reply = match request {
                Request::Get(key) => engine.get(key).map(Reply::Value),
                Request::Put(key, value) => engine.put(key, value).map(|()| Reply::Stored),
                Request::Delete(key) => engine.delete(key).map(Reply::Deleted),
                Request::Scan(from, limit) => engine
                    .scan(from, *limit)
                    .map(|n| n.map_or(Reply::Unsupported, Reply::Scanned)),
            };
            replies.push((reply.unwrap_or_else(Reply::Error), start.elapsed()));
        }
        Ok(())
    }

    fn batch_size(&self) -> usize {
        self.batch
    }
}
