//! The caches a workload drives, behind one trait: in-process engines and network servers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub mod cluster;
pub mod foyer;
pub mod network;
pub mod segcache;
#[cfg(test)]
pub(crate) mod test_support;
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
    pub objects_resident: Option<u64>,
    /// CPU seconds the server process has used (network peers the bench started).
    pub server_cpu_seconds: Option<f64>,
    /// Bytes the cache process wrote to files (memcached extstore: `/proc/PID/io` wchar).
    pub host_bytes_written: Option<u64>,
    pub held: Holdings,
}

/// What a target's tiers hold and have cost at one moment: a snapshot's, shown as they
/// are in the result row of the snapshot after the run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Holdings {
    pub dram_bytes_used: Option<u64>,
    pub compression_ratio_dram: Option<f64>,
    pub wa_host: Option<f64>,
    pub wr_nand: Option<f64>,
    pub wa: Option<f64>,
    pub zeta: Option<f64>,
    pub ssd_objects: Option<u64>,
    pub ssd_index_bytes: Option<u64>,
    pub ssd_reads_per_ssd_get: Option<f64>,
    /// Flash the SSD tier's data really takes (zipcache on a drive that stores blocks
    /// whole: `device_compression` host or none).
    pub ssd_flash_bytes: Option<u64>,
    /// Resident set of the process holding the cache.
    pub rss_bytes: Option<u64>,
    /// Every figure of the in-process zipcache engine's `stats()`, for what the columns
    /// leave out (e.g. where its SSD writes come from).
    pub engine_stats: Option<serde_json::Value>,
    /// A cluster target's objects on each node, in the order of its slot map.
    pub objects_per_node: Option<Vec<u64>>,
}

/// A cache under test.
pub trait Target: Send + Sync {
    fn name(&self) -> &str;
    fn client(&self) -> Result<Box<dyn Client>, String>;
    fn snapshot(&self) -> Result<Snapshot, String>;
    /// Whether the target has no SSD tier, so every hit is a DRAM hit.
    fn dram_only(&self) -> bool;
    /// The process the cache runs in, whose CPU time a run counts: this one for the
    /// in-process targets; a server's when its PID is known.
    fn cache_pid(&self) -> Option<u32> {
        Some(std::process::id())
    }
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
    "foyer-zstd",
    "foyer-none",
    "segcache",
    "memcached",
    "memcached-ext",
    "redis",
    "zipcache-serve",
    "zipcache-cluster",
    "zipcache-node",
];

/// Opens target `spec`: a name of [`MANAGED`] or `zipcache://`, `memcached://`, `redis://H:P`,
/// or `cluster://H:P[+H:P…]` (a Redis Cluster's seed nodes).
pub fn open(spec: &str, budget: &Budget) -> Result<Box<dyn Target>, String> {
    use network::{NetTarget, Protocol};
    if let Some((scheme, addr)) = spec.split_once("://") {
        if scheme == "cluster" {
            return Ok(Box::new(cluster::ClusterTarget::remote(
                spec, addr, budget,
            )?));
        }
        let protocol = match scheme {
            "zipcache" | "memcached" => Protocol::Memcached,
            "redis" => Protocol::Resp,
            _ => return Err(format!("unknown target scheme {scheme:?} in {spec:?}")),
        };
        return Ok(Box::new(NetTarget::remote(spec, addr, protocol, budget)?));
    }
    match spec {
        "zipcache" => Ok(Box::new(zipcache::ZipTarget::open(budget)?)),
        _ if foyer::VARIANTS.iter().any(|&(name, _)| name == spec) => {
            Ok(Box::new(foyer::FoyerTarget::open(spec, budget)?))
        }
        "segcache" => Ok(Box::new(segcache::SegTarget::open(budget)?)),
        "zipcache-cluster" | "zipcache-node" => {
            Ok(Box::new(cluster::ClusterTarget::spawn(spec, budget)?))
        }
        "memcached" | "memcached-ext" | "redis" | "zipcache-serve" | network::NOCACHE => {
            Ok(Box::new(NetTarget::spawn(spec, budget)?))
        }
        _ => Err(format!(
            "unknown target {spec:?}; known: {}, or memcached://H:P, redis://H:P, zipcache://H:P, cluster://H:P[+H:P…]",
            MANAGED.join(", ")
        )),
    }
}

/// How an in-process target executes a batch's GETs (`--in-process-gets`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum InProcessGets {
    /// A batch's GETs through the engine's asynchronous API, their reads in flight together
    /// across the streams a network client would spread the batch over; see
    /// [`EngineClient`].
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
/// With [`InProcessGets::Overlapped`] it splits a batch into `streams` as the network
/// client spreads one over its connections (request `i` on stream `i % streams`), and keeps
/// each stream's order as a server keeps a connection's: a stream's consecutive GETs go
/// together, and a write waits for the requests ahead of it. Every round, each stream's
/// ready GETs join one [`Engine::get_overlapped`] call — so the reads of all streams are in
/// flight together, as on a server serving several connections — and then each stream with
/// a write at its head runs it. Across streams a request also waits for the batch's earlier
/// requests on its key (a GET for an earlier write of the key, a write for any earlier
/// request of it) and a SCAN for every earlier request, so replies are those of the batch
/// run in order, except that a GET may answer before a write of another key that precedes
/// it (which may evict what it reads, as on a server).
pub struct EngineClient<E> {
    pub engine: std::sync::Arc<E>,
    pub batch: usize,
    pub gets: InProcessGets,
    /// Network connections per thread, whose streams an overlapped batch mirrors.
    pub streams: usize,
}

impl<E> EngineClient<E> {
    /// A client of `engine` as `budget` sets clients up: its batch, GET mode and streams.
    pub fn of(engine: std::sync::Arc<E>, budget: &Budget) -> EngineClient<E> {
        EngineClient {
            engine,
            batch: budget.batch(),
            gets: budget.in_process_gets,
            streams: budget.connections,
        }
    }
}

/// Each bench thread's client of one engine: the engine shared, the settings copied.
impl<E> Clone for EngineClient<E> {
    fn clone(&self) -> Self {
        EngineClient {
            engine: self.engine.clone(),
            ..*self
        }
    }
}

/// What request `i` of an overlapped batch waits for besides the one ahead of it on its
/// stream: earlier requests of the same key, and the latest earlier SCAN.
#[derive(Default)]
struct Deps {
    /// A GET: the latest earlier write of its key. A write: that write and every GET of the
    /// key since (GETs of one key may sit on different streams, so each is named).
    key: Vec<usize>,
    scan: Option<usize>,
}

/// The batch's requests of one key so far.
#[derive(Default)]
struct KeyHistory {
    last_write: Option<usize>,
    gets_since: Vec<usize>,
}

impl Deps {
    /// For each request: what it waits for (see [`EngineClient`]).
    fn of(requests: &[Request]) -> Vec<Deps> {
        let mut keys: HashMap<&[u8], KeyHistory> = HashMap::new();
        let mut last_scan = None;
        let mut deps = Vec::with_capacity(requests.len());
        for (i, request) in requests.iter().enumerate() {
            let scan = last_scan;
            let key = match request {
                Request::Get(key) => {
                    let history = keys.entry(key.as_slice()).or_default();
                    history.gets_since.push(i);
                    history.last_write.into_iter().collect()
                }
                Request::Put(key, _) | Request::Delete(key) => {
                    let history = keys.entry(key.as_slice()).or_default();
                    let mut key: Vec<usize> = history.last_write.into_iter().collect();
                    key.append(&mut history.gets_since);
                    history.last_write = Some(i);
                    key
                }
                // Waits for every earlier request (checked when it runs).
                Request::Scan(..) => {
                    last_scan = Some(i);
                    Vec::new()
                }
            };
            deps.push(Deps { key, scan });
        }
        deps
    }
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

    fn execute_overlapped(&self, requests: &[Request], replies: &mut [(Reply, Duration)]) {
        let start = Instant::now();
        let n = requests.len();
        let streams = self.streams.clamp(1, n.max(1));
        let deps = Deps::of(requests);
        let mut done = vec![false; n];
        // Requests 0..prefix are all done (what a SCAN waits for).
        let mut prefix = 0;
        // The next request of each stream.
        let mut head: Vec<usize> = (0..streams).collect();
        let (mut gets, mut keys, mut writes, mut answers) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        while prefix < n {
            let ready = |i: usize, done: &[bool]| {
                let d = &deps[i];
                d.key.iter().all(|&j| done[j])
                    && d.scan.is_none_or(|j| done[j])
                    && (!matches!(requests[i], Request::Scan(..)) || i == prefix)
            };
            gets.clear();
            keys.clear();
            writes.clear();
            for next in head.iter_mut() {
                let first = *next;
                while let Some(Request::Get(key)) = requests.get(*next) {
                    if !ready(*next, &done) {
                        break;
                    }
                    gets.push(*next);
                    keys.push(key.as_slice());
                    *next += streams;
                }
                if *next == first && *next < n && ready(*next, &done) {
                    writes.push(*next);
                    *next += streams;
                }
            }
            // The earliest request not done is always ready (all it waits for is earlier),
            // and heads its stream, so every round makes progress.
            debug_assert!(!gets.is_empty() || !writes.is_empty());
            if !keys.is_empty() {
                answers.clear();
                self.engine.get_overlapped(&keys, start, &mut answers);
                for (&i, answer) in gets.iter().zip(answers.drain(..)) {
                    replies[i] = answer;
                    done[i] = true;
                }
            }
            // A round's writes are of different keys (each waits for the earlier requests of
            // its key, none of them done when the round began), so their order is free.
            for &i in &writes {
                replies[i] = (self.run(&requests[i]), start.elapsed());
                done[i] = true;
            }
            while prefix < n && done[prefix] {
                prefix += 1;
            }
        }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// A map that never forgets, so an overlapped batch must answer exactly as the batch
    /// run in order; it records the size of every overlapped call.
    #[derive(Default)]
    struct Map {
        objects: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
        overlapped: Mutex<Vec<usize>>,
    }

    impl Engine for Map {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
            Ok(self.objects.lock().unwrap().get(key).cloned())
        }
        fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
            self.objects
                .lock()
                .unwrap()
                .insert(key.to_vec(), value.to_vec());
            Ok(())
        }
        fn delete(&self, key: &[u8]) -> Result<bool, String> {
            Ok(self.objects.lock().unwrap().remove(key).is_some())
        }
        fn scan(&self, from: &[u8], limit: usize) -> Result<Option<usize>, String> {
            let objects = self.objects.lock().unwrap();
            Ok(Some(objects.range(from.to_vec()..).take(limit).count()))
        }
        fn get_overlapped(
            &self,
            keys: &[&[u8]],
            start: Instant,
            replies: &mut Vec<(Reply, Duration)>,
        ) {
            self.overlapped.lock().unwrap().push(keys.len());
            for key in keys {
                replies.push((Reply::Value(self.get(key).unwrap()), start.elapsed()));
            }
        }
    }

    fn client(gets: InProcessGets, streams: usize) -> EngineClient<Map> {
        EngineClient {
            engine: Arc::new(Map::default()),
            batch: 64,
            gets,
            streams,
        }
    }

    fn random_batch(rng: &mut SmallRng, len: usize) -> Vec<Request> {
        (0..len)
            .map(|_| {
                // Few keys, so that requests of one key meet in most batches.
                let key = vec![b'a' + rng.random_range(0..6u8)];
                match rng.random_range(0..10) {
                    0..=4 => Request::Get(key),
                    5..=7 => Request::Put(key, vec![rng.random()]),
                    8 => Request::Delete(key),
                    _ => Request::Scan(key, 3),
                }
            })
            .collect()
    }

    #[test]
    fn overlapped_batches_answer_as_the_batch_run_in_order() {
        let mut rng = SmallRng::seed_from_u64(5);
        for streams in [1, 2, 4, 64] {
            let (mut serial, mut overlapped) = (
                client(InProcessGets::Serial, 1),
                client(InProcessGets::Overlapped, streams),
            );
            for _ in 0..300 {
                let len = rng.random_range(1..=64);
                let batch = random_batch(&mut rng, len);
                let (mut want, mut got) = (Vec::new(), Vec::new());
                serial.execute(&batch, &mut want).unwrap();
                overlapped.execute(&batch, &mut got).unwrap();
                let replies = |r: &[(Reply, Duration)]| r.iter().map(|(r, _)| r.clone()).collect();
                let (want, got): (Vec<Reply>, Vec<Reply>) = (replies(&want), replies(&got));
                assert_eq!(got, want, "{streams} streams, batch {batch:?}");
            }
        }
    }

    #[test]
    fn a_batch_of_gets_is_one_overlapped_call_and_writes_split_streams_only() {
        let mut client = client(InProcessGets::Overlapped, 4);
        let get = |k: u8| Request::Get(vec![k]);
        let put = |k: u8| Request::Put(vec![k], vec![k]);
        let mut replies = Vec::new();
        client
            .execute(&(0..64).map(get).collect::<Vec<_>>(), &mut replies)
            .unwrap();
        assert_eq!(*client.engine.overlapped.lock().unwrap(), [64]);

        // Stream 0 holds a write ahead of its second GET: the other streams' GETs and its
        // first go in round one, its second in round two.
        client.engine.overlapped.lock().unwrap().clear();
        let batch = vec![
            get(0),
            get(1),
            get(2),
            get(3),
            put(9),
            get(5),
            get(6),
            get(7),
            get(8),
        ];
        replies.clear();
        client.execute(&batch, &mut replies).unwrap();
        assert_eq!(replies.len(), batch.len());
        assert_eq!(*client.engine.overlapped.lock().unwrap(), [7, 1]);
    }
}
