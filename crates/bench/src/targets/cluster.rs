//! A Redis Cluster as one target: `cluster://H:P[+H:P…]` (a fleet already running; its
//! slot map read from the first seed that answers `CLUSTER SLOTS`) or `zipcache-cluster`
//! (the bench starts three `zipcache serve --cluster-mode on` nodes, each with the whole
//! budget, and pushes them an even split of the slots with `CLUSTERX SETNODES`, as
//! kvrocks-controller does), or `zipcache-node`: one such node owning every slot, what
//! the fleet is measured against. Each bench thread opens its connections to every node and
//! sends each request to its key's slot owner, pipelined per node, following `-MOVED`.
//! A snapshot sums the nodes and says what each holds (`objects_per_node`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use zipcache_server::key_slot;

use super::network::{Conn, Protocol, Value, pipelined, snapshot_of};
use super::{Budget, Client, Reply, Request, Snapshot, Target};
use crate::peers::{self, Peer};

/// Nodes `zipcache-cluster` starts.
const FLEET: usize = 3;
const SLOTS: usize = 16_384;
/// Redirections one request may follow before the run fails rather than loops.
const MAX_REDIRECTS: usize = 16;

struct Node {
    addr: SocketAddr,
    /// Kept for its PID; dropping it stops the node.
    peer: Option<Peer>,
    control: Mutex<Conn>,
}

pub struct ClusterTarget {
    name: String,
    nodes: Vec<Node>,
    /// Each slot's owner, an index in `nodes`; learnt again from `-MOVED`.
    owners: Arc<RwLock<Vec<u8>>>,
    connections: usize,
    pipeline: usize,
    dram_only: bool,
}

impl ClusterTarget {
    /// `zipcache-cluster`: three nodes of `zipcache serve --cluster-mode on` with the
    /// budget each, given 16384 / 3 slots each; `zipcache-node`: one, given them all.
    pub fn spawn(name: &str, budget: &Budget) -> Result<ClusterTarget, String> {
        let threads = budget.threads.clamp(1, 4);
        let count = if name == "zipcache-node" { 1 } else { FLEET };
        let mut nodes = Vec::new();
        for i in 0..count {
            let dir = budget.data_dir.join(format!("node{i}"));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let peer = peers::zipcache_cluster_node(
                budget.dram,
                budget.ssd,
                &budget.settings,
                &dir,
                threads,
            )?;
            nodes.push(Node {
                addr: peer.addr,
                control: Mutex::new(Conn::open(peer.addr)?),
                peer: Some(peer),
            });
        }
        push_even_split(&nodes)?;
        ClusterTarget::new(name, nodes, budget, budget.ssd.is_none())
    }

    /// `cluster://H:P+H:P…`: a running fleet, found from these seeds.
    pub fn remote(name: &str, seeds: &str, budget: &Budget) -> Result<ClusterTarget, String> {
        let mut last_error = format!("{name}: no seed node");
        for seed in seeds.split('+') {
            let addr: SocketAddr = match seed.parse() {
                Ok(addr) => addr,
                Err(e) => return Err(format!("{name}: seed {seed:?}: {e}")),
            };
            match Conn::open(addr).and_then(|mut conn| masters(&mut conn)) {
                Ok(addrs) => {
                    let nodes = addrs
                        .into_iter()
                        .map(|addr| {
                            Ok(Node {
                                addr,
                                peer: None,
                                control: Mutex::new(Conn::open(addr)?),
                            })
                        })
                        .collect::<Result<Vec<_>, String>>()?;
                    return ClusterTarget::new(name, nodes, budget, false);
                }
                Err(e) => last_error = format!("{name}: seed {addr}: {e}"),
            }
        }
        Err(last_error)
    }

    fn new(
        name: &str,
        nodes: Vec<Node>,
        budget: &Budget,
        dram_only: bool,
    ) -> Result<ClusterTarget, String> {
        let mut owners = vec![0u8; SLOTS];
        let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
        let slots = nodes[0]
            .control
            .lock()
            .unwrap()
            .call(&[b"CLUSTER", b"SLOTS"])?;
        for (first, last, addr) in slot_ranges(&slots)? {
            let owner = addrs
                .iter()
                .position(|&a| a == addr)
                .ok_or_else(|| format!("CLUSTER SLOTS names {addr}, not a node of the fleet"))?;
            owners[first..=last].fill(owner as u8);
        }
        Ok(ClusterTarget {
            name: name.into(),
            nodes,
            owners: Arc::new(RwLock::new(owners)),
            connections: budget.connections.max(1),
            pipeline: budget.pipeline.max(1),
            dram_only,
        })
    }
}

/// What kvrocks-controller sends each node to make a fleet: its id, then the topology
/// (version 1), the slots split evenly and the last node to 16383.
fn push_even_split(nodes: &[Node]) -> Result<(), String> {
    let id = |i: usize| format!("{:z<40}", format!("benchnode{i}"));
    let share = SLOTS / nodes.len();
    let mut lines = String::new();
    for (i, node) in nodes.iter().enumerate() {
        let last = if i + 1 == nodes.len() {
            SLOTS - 1
        } else {
            (i + 1) * share - 1
        };
        lines.push_str(&format!(
            "{} {} {} master - {}-{last}\n",
            id(i),
            node.addr.ip(),
            node.addr.port(),
            i * share
        ));
    }
    for (i, node) in nodes.iter().enumerate() {
        let mut conn = node.control.lock().unwrap();
        for args in [
            vec![&b"CLUSTERX"[..], b"SETNODEID", id(i).as_bytes()],
            vec![b"CLUSTERX", b"SETNODES", lines.as_bytes(), b"1"],
        ] {
            match conn.call(&args)? {
                Value::Simple(ok) if ok == "OK" => {}
                other => return Err(format!("node {}: {other:?}", node.addr)),
            }
        }
    }
    Ok(())
}

/// The masters CLUSTER SLOTS names, in the order they first appear.
fn masters(conn: &mut Conn) -> Result<Vec<SocketAddr>, String> {
    let slots = conn.call(&[b"CLUSTER", b"SLOTS"])?;
    let mut addrs = Vec::new();
    for (_, _, addr) in slot_ranges(&slots)? {
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    Ok(addrs)
}

/// CLUSTER SLOTS as (first, last, master's address) ranges.
fn slot_ranges(reply: &Value) -> Result<Vec<(usize, usize, SocketAddr)>, String> {
    let bad = || format!("unexpected CLUSTER SLOTS reply {reply:?}");
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    ranges
        .iter()
        .map(|range| match range {
            Value::Array(parts) => match parts.as_slice() {
                [
                    Value::Integer(first),
                    Value::Integer(last),
                    Value::Array(master),
                    ..,
                ] => match master.as_slice() {
                    [Value::Bulk(Some(host)), Value::Integer(port), ..] => {
                        let addr = format!("{}:{port}", String::from_utf8_lossy(host));
                        let addr = addr.parse().map_err(|_| bad())?;
                        Ok((*first as usize, (*last as usize).min(SLOTS - 1), addr))
                    }
                    _ => Err(bad()),
                },
                _ => Err(bad()),
            },
            _ => Err(bad()),
        })
        .collect()
}

/// The key a request routes by.
fn key_of(request: &Request) -> &[u8] {
    match request {
        Request::Get(key) | Request::Put(key, _) | Request::Delete(key) | Request::Scan(key, _) => {
            key
        }
    }
}

/// A bench thread's connections: `connections` to every node.
struct ClusterClient {
    conns: Vec<Vec<Conn>>,
    addrs: Vec<SocketAddr>,
    owners: Arc<RwLock<Vec<u8>>>,
    pipeline: usize,
}

impl ClusterClient {
    /// Sends `request` to `node` alone and follows its redirections.
    fn redirected(&mut self, request: &Request, mut reply: Reply) -> Result<Reply, String> {
        for _ in 0..MAX_REDIRECTS {
            let Reply::Error(error) = &reply else {
                return Ok(reply);
            };
            let Some(node) = self.moved_to(error) else {
                return Ok(reply);
            };
            let conn = &mut self.conns[node][0];
            conn.send(Protocol::Resp, request)?;
            conn.flush()?;
            reply = conn.receive(Protocol::Resp, request)?;
        }
        Err(format!("more than {MAX_REDIRECTS} redirections: {reply:?}"))
    }

    /// The node a `MOVED <slot> <host>:<port>` names, learnt as the slot's owner.
    fn moved_to(&self, error: &str) -> Option<usize> {
        let mut words = error.strip_prefix("-MOVED ")?.split(' ');
        let slot: usize = words.next()?.parse().ok()?;
        let addr: SocketAddr = words.next()?.parse().ok()?;
        let node = self.addrs.iter().position(|&a| a == addr)?;
        if slot < SLOTS {
            self.owners.write().unwrap()[slot] = node as u8;
        }
        Some(node)
    }
}

impl Client for ClusterClient {
    fn execute(
        &mut self,
        requests: &[Request],
        replies: &mut Vec<(Reply, Duration)>,
    ) -> Result<(), String> {
        let start = Instant::now();
        // Each request to its slot's owner, round-robin over that node's connections.
        let mut queues: Vec<Vec<Vec<usize>>> = self
            .conns
            .iter()
            .map(|c| vec![Vec::new(); c.len()])
            .collect();
        {
            let owners = self.owners.read().unwrap();
            let mut next = vec![0usize; self.conns.len()];
            for (i, request) in requests.iter().enumerate() {
                let node = usize::from(owners[usize::from(key_slot(key_of(request)))]);
                let conn = next[node] % self.conns[node].len();
                next[node] += 1;
                queues[node][conn].push(i);
            }
        }
        let lanes = self
            .conns
            .iter_mut()
            .zip(queues)
            .flat_map(|(conns, queues)| conns.iter_mut().zip(queues))
            .collect();
        let mut answers = pipelined(lanes, Protocol::Resp, requests, start)?;
        for (i, answer) in answers.iter_mut().enumerate() {
            if let Some((reply @ Reply::Error(_), at)) = answer {
                *reply = self.redirected(&requests[i], reply.clone())?;
                *at = start.elapsed();
            }
        }
        replies.extend(answers.into_iter().flatten());
        Ok(())
    }

    fn batch_size(&self) -> usize {
        self.conns.iter().map(Vec::len).sum::<usize>() * self.pipeline
    }
}

impl Target for ClusterTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn client(&self) -> Result<Box<dyn Client>, String> {
        let conns = self
            .nodes
            .iter()
            .map(|node| {
                (0..self.connections)
                    .map(|_| Conn::open(node.addr))
                    .collect()
            })
            .collect::<Result<_, _>>()?;
        Ok(Box::new(ClusterClient {
            conns,
            addrs: self.nodes.iter().map(|n| n.addr).collect(),
            owners: self.owners.clone(),
            pipeline: self.pipeline,
        }))
    }

    /// The nodes' snapshots summed; `objects_per_node` says what each holds.
    fn snapshot(&self) -> Result<Snapshot, String> {
        let mut total = Snapshot::default();
        let mut per_node = Vec::new();
        for node in &self.nodes {
            let stats = node.control.lock().unwrap().stats(Protocol::Resp)?;
            let pid = node.peer.as_ref().map(Peer::pid);
            let one = snapshot_of(Protocol::Resp, &stats, pid);
            per_node.push(one.objects_resident.unwrap_or(0));
            total.dram_hits = sum(total.dram_hits, one.dram_hits);
            total.ssd_hits = sum(total.ssd_hits, one.ssd_hits);
            total.objects_resident = sum(total.objects_resident, one.objects_resident);
            total.server_cpu_seconds = match (total.server_cpu_seconds, one.server_cpu_seconds) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            let held = &mut total.held;
            held.dram_bytes_used = sum(held.dram_bytes_used, one.held.dram_bytes_used);
            held.rss_bytes = sum(held.rss_bytes, one.held.rss_bytes);
            held.ssd_objects = sum(held.ssd_objects, one.held.ssd_objects);
        }
        total.held.objects_per_node = Some(per_node);
        Ok(total)
    }

    fn dram_only(&self) -> bool {
        self.dram_only
    }

    /// A fleet is several processes: its CPU time is summed in `snapshot`, and none of
    /// them alone is the cache to wait idle for.
    fn cache_pid(&self) -> Option<u32> {
        None
    }

    fn close(self: Box<Self>) -> Result<(), String> {
        drop(self);
        Ok(())
    }
}

fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}
