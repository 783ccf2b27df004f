//! The caches a workload drives, behind one trait: in-process engines and network servers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub mod foyer;
pub mod network;
pub mod segcache;
#[cfg(test)]
mod test_support;
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

/// A per-thread handle on a target. Executes a batch and returns each reply with its latency:
/// from the start of the batch until that reply was known (for a pipelined network client,
/// parsed; for an in-process engine, returned by the engine).
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
    /// In-process targets: GETs overlapped through the asynchronous API, or one by one.
    pub in_process_gets: InProcessGets,
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

/// How an in-process target executes a batch's GETs (`--in-process-gets`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum InProcessGets {
    /// A batch's GETs through the engine's asynchronous API, their reads in flight together
    /// (as many as a network target has pipelined); see [`EngineClient`].
    #[default]
    Overlapped,
    /// Every request through the synchronous API, one after another: a GET that reads the
    /// SSD holds up the rest of the batch (what an embedder calling `get` gets).
    Serial,
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
    /// GETs every key of `keys` with their device reads in flight together, and pushes one
    /// reply per key, in order, each with the time from `start` until its answer was known.
    /// The default, for an engine without an asynchronous GET, runs them one by one.
    fn get_overlapped(&self, keys: &[&[u8]], start: Instant, replies: &mut Vec<(Reply, Duration)>) {
        for key in keys {
            let reply = self.get(key).map_or_else(Reply::Error, Reply::Value);
            replies.push((reply, start.elapsed()));
        }
    }
}

/// The [`Client`] of every in-process engine. It serves as many virtual clients as a network
/// client does, so every target sees the same look-aside concurrency, and it times replies
/// as a pipelined network client does: from the start of the batch until the reply is
/// known.
///
/// With [`InProcessGets::Overlapped`], every GET of the batch whose key no earlier request of
/// the batch writes goes to [`Engine::get_overlapped`] at once, ahead of the writes, as the
/// requests of a network batch reach the server together over several connections; the
/// other requests then run in batch order, so a GET behind a PUT or DELETE of its own key
/// sees that write. A GET answered ahead of a write of another key may miss what that write
/// evicted a moment later; it never sees anything a request behind it wrote.
pub struct EngineClient<E> {
    pub engine: std::sync::Arc<E>,
    pub batch: usize,
    pub gets: InProcessGets,
}

impl<E: Engine> EngineClient<E> {
    /// One request through the synchronous API.
    fn run(&self, request: &Request) -> Reply {
        let engine = &self.engine;
        let reply = match request {
            Request::Get(key) => engine.get(key).map(Reply::Value),
            Request::Put(key, value) => engine.put(key, value).map(|()| Reply::Stored),
            Request::Delete(key) => engine.delete(key).map(Reply::Deleted),
            Request::Scan(from, limit) => engine
                .scan(from, *limit)
                .map(|n| n.map_or(Reply::Unsupported, Reply::Scanned)),
        };
        reply.unwrap_or_else(Reply::Error)
    }

    /// The GETs `gets` (request index, key) together; each reply goes to its request's place.
    fn get_together(
        &self,
        gets: &[(usize, &[u8])],
        start: Instant,
        replies: &mut [(Reply, Duration)],
    ) {
        if gets.is_empty() {
            return;
        }
        let keys: Vec<&[u8]> = gets.iter().map(|(_, key)| *key).collect();
        let mut answers = Vec::with_capacity(keys.len());
        self.engine.get_overlapped(&keys, start, &mut answers);
        for ((i, _), answer) in gets.iter().zip(answers) {
            replies[*i] = answer;
        }
    }

    fn execute_overlapped(&self, requests: &[Request], replies: &mut [(Reply, Duration)]) {
        let start = Instant::now();
        let mut written = std::collections::HashSet::new();
        let mut ahead = Vec::new();
        let mut in_order = Vec::new();
        for (i, request) in requests.iter().enumerate() {
            match request {
                Request::Get(key) if !written.contains(key.as_slice()) => ahead.push((i, &key[..])),
                Request::Put(key, _) | Request::Delete(key) => {
                    written.insert(key.as_slice());
                    in_order.push(i);
                }
                _ => in_order.push(i),
            }
        }
        self.get_together(&ahead, start, replies);
        // The rest in order; consecutive GETs among them (each behind a write of its key)
        // still go together.
        let mut run = Vec::new();
        for i in in_order {
            if let Request::Get(key) = &requests[i] {
                run.push((i, key.as_slice()));
                continue;
            }
            self.get_together(&run, start, replies);
            run.clear();
            replies[i] = (self.run(&requests[i]), start.elapsed());
        }
        self.get_together(&run, start, replies);
    }
}

impl<E: Engine> Client for EngineClient<E> {
    fn execute(
        &mut self,
        requests: &[Request],
        replies: &mut Vec<(Reply, Duration)>,
    ) -> Result<(), String> {
        match self.gets {
            InProcessGets::Overlapped => {
                let base = replies.len();
                replies.resize(base + requests.len(), (Reply::Unsupported, Duration::ZERO));
                self.execute_overlapped(requests, &mut replies[base..]);
            }
            InProcessGets::Serial => {
                let start = Instant::now();
                for request in requests {
                    replies.push((self.run(request), start.elapsed()));
                }
            }
        }
        Ok(())
    }

    fn batch_size(&self) -> usize {
        self.batch
    }
}
