//! Redis Cluster as this node serves it (`--cluster-mode`): the slots it owns (a key's
//! slot: `slot.rs`), the node's id, and the address it tells clients to reach it
//! at. Protocol-neutral: RESP's `CLUSTER` commands and its redirections read it.
//!
//! `emulated`: one node owns every slot, so cluster-aware clients (redis-py
//! `RedisCluster`, `redis-cli -c`, Jedis, lettuce, ioredis `Cluster`, go-redis) that an
//! application built for a managed Redis Cluster can use ZipCache as it is. Multi-key
//! commands still refuse keys of different slots (`-CROSSSLOT`), as every Redis Cluster
//! node does, so that an application that passes here passes on a real fleet.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard};
use zipcache::ZipCache;

use super::ServerOptions;
use super::keyspace::{Generations, Keyspace};
use super::slot::SLOTS;
use super::sweep::Sweep;
use super::topology::{ID_LEN, Node, Role, Topology};

/// How the RESP port takes part in a Redis Cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMode {
    /// A plain Redis server: `CLUSTER` answers that cluster support is disabled.
    #[default]
    Off,
    /// One node owning all 16,384 slots.
    Emulated,
    /// A node of a fleet whose topology is pushed from outside (`CLUSTERX SETNODES`
    /// from a controller, or `--cluster-config`): keys of slots it does not own are
    /// answered `-MOVED`.
    On,
}

/// What `--cluster-announce-ip` and `--cluster-announce-port` set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Announce {
    pub ip: Option<IpAddr>,
    pub port: Option<u16>,
}

/// This node of a cluster.
#[derive(Debug)]
pub struct Cluster {
    pub mode: ClusterMode,
    announce: Announce,
    /// Where the id and the topology are kept; `None` keeps nothing.
    dir: Option<PathBuf>,
    /// The address this node's RESP port listens at, to find itself in a topology.
    listen: SocketAddr,
    state: RwLock<State>,
    generations: Arc<Generations>,
    /// The sweep of stored keys left over by slots that moved.
    sweep: Arc<Sweep>,
    /// `--cluster-config`.
    config: Option<PathBuf>,
}

/// Who this node is and, with `--cluster-mode on`, the topology it was last given.
#[derive(Debug)]
pub struct State {
    /// 40 bytes: hex digits as Redis makes them, or what `CLUSTERX SETNODEID` or a
    /// topology naming this node's address gave it.
    pub id: String,
    /// `None` until a topology is pushed (`on`), and in the other modes.
    pub topology: Option<Topology>,
    /// The last `CLUSTERX MIGRATE`, until the next topology is pushed.
    pub migrated: Option<Migrated>,
}

/// Slots given away by `CLUSTERX MIGRATE`: for a cache there is nothing to copy (the
/// new owner starts cold), so a migration ends as it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migrated {
    pub slots: (u16, u16),
    pub to: String,
}

impl State {
    /// The version of the topology: -1 until one is pushed, as Kvrocks says.
    pub fn version(&self) -> i64 {
        self.topology.as_ref().map_or(-1, |t| t.version)
    }

    fn owns(&self, slot: u16) -> bool {
        self.topology
            .as_ref()
            .is_some_and(|t| t.owned_by(slot, &self.id))
    }
}

/// Where a command on keys of one slot must go, as one topology says: checked, and
/// held (`Route::Pushed` keeps the topology's read lock) until the command has run, so
/// that the generation its keys are stored under is that topology's
/// (`core/keyspace.rs`).
pub enum Route<'c> {
    /// Every slot is served here (`off`, `emulated`).
    Here,
    Pushed(RwLockReadGuard<'c, State>),
}

/// Why a command on keys of a slot is not served here.
#[derive(Debug, PartialEq, Eq)]
pub enum Redirect {
    /// Another node owns the slot: its address.
    Moved { slot: u16, host: String, port: u16 },
    /// No node owns it, or no topology was pushed yet.
    Down,
}

impl Route<'_> {
    pub fn check(&self, slot: u16) -> Result<(), Redirect> {
        let Route::Pushed(state) = self else {
            return Ok(());
        };
        let owner = state.topology.as_ref().and_then(|t| t.owner(slot));
        match owner {
            Some(node) if node.id == state.id => Ok(()),
            Some(node) => Err(Redirect::Moved {
                slot,
                host: node.host.clone(),
                port: node.port,
            }),
            None => Err(Redirect::Down),
        }
    }
}

/// A topology change as it came: whether it follows the one held without a gap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// The next version (or the same topology under a new id for this node): only
    /// the slots that change hands start over.
    Next,
    /// Versions were skipped, or FORCE: a slot this node owns may have been elsewhere
    /// meanwhile, so every slot it owns starts over (cold), as do those it loses.
    Unknown,
}

/// The file in the data directory that keeps a cluster node's id across restarts.
const NODE_ID_FILE: &str = "cluster-node-id";
/// The file in the data directory that keeps the topology and the slots' generations
/// (`--cluster-mode on`).
const TOPOLOGY_FILE: &str = "cluster-topology";
const TOPOLOGY_HEADER: &str = "zipcache-cluster-topology 1";

/// Kvrocks' errors for topology versions (`docs/notes/kvrocks-controller.md` §2).
pub const INVALID_VERSION: &str = "ERR Invalid cluster version";

impl Cluster {
    /// This node; in a cluster mode its id is the one kept in `data_dir` (made and kept
    /// there on the first start), as a Redis node keeps its id in `nodes.conf`: clients
    /// and controllers know a node by it. With `on`, the topology and the slots'
    /// generations kept there too; where they cannot be trusted to describe the
    /// engine's keys (none kept beside a warm engine, or damaged), the engine is
    /// flushed: a cache may forget, never serve a value another node overwrote.
    /// Leaving `on` for another mode forgets what the generations hid the same way.
    pub fn new(options: &ServerOptions, listen: SocketAddr, engine: &Arc<ZipCache>) -> Cluster {
        let (mode, announce) = (options.cluster_mode, options.cluster_announce);
        let data_dir = options.data_dir.as_deref();
        let id = match data_dir.filter(|_| mode != ClusterMode::Off) {
            Some(dir) => kept_node_id(dir).unwrap_or_else(|e| {
                let id = new_node_id();
                eprintln!(
                    "zipcache: cannot keep the cluster node id in {}: {e}; this run's id is {id}",
                    dir.display()
                );
                id
            }),
            None => new_node_id(),
        };
        let generations = Arc::new(Generations::default());
        let topology = match data_dir {
            Some(dir) => kept_topology(dir, mode, &generations, engine),
            None => None,
        };
        let cluster = Cluster {
            mode,
            announce,
            dir: data_dir.map(Path::to_path_buf),
            listen,
            state: RwLock::new(State {
                id,
                topology,
                migrated: None,
            }),
            generations,
            sweep: Arc::default(),
            config: options.cluster_config.clone(),
        };
        if let Some(said) = cluster.reload_config() {
            eprintln!("zipcache: {said}");
        }
        cluster
    }

    /// Each slot's generation, which the keyspace stores keys under.
    pub fn generations(&self) -> Arc<Generations> {
        self.generations.clone()
    }

    pub fn enabled(&self) -> bool {
        self.mode != ClusterMode::Off
    }

    /// This node's id now.
    pub fn id(&self) -> String {
        self.state.read().id.clone()
    }

    /// Who this node is and what topology it holds, read-locked: topology changes wait.
    pub fn state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read()
    }

    /// Where commands on keys go: with `on`, the topology read-locked for as long as
    /// the route is held.
    pub fn route(&self) -> Route<'_> {
        match self.mode {
            ClusterMode::On => Route::Pushed(self.state.read()),
            _ => Route::Here,
        }
    }

    /// The address a client is told to reach this node at: the announced one where set,
    /// else the address and port the client's own connection reached (`local`), else
    /// (a unix-socket client) the listening address and `resp_port`.
    pub fn address(&self, local: Option<SocketAddr>, listen: IpAddr, resp_port: u16) -> SocketAddr {
        let reached = local.unwrap_or(SocketAddr::new(listen, resp_port));
        SocketAddr::new(
            self.announce.ip.unwrap_or(reached.ip()),
            self.announce.port.unwrap_or(reached.port()),
        )
    }

    /// `CLUSTERX SETNODES <lines> <version> [FORCE]`: an older version is refused, the
    /// same one changes nothing (unless FORCE), a newer one is kept on disk, then
    /// served.
    pub fn set_nodes(&self, lines: &str, version: i64, force: bool) -> Result<(), String> {
        if version < 0 {
            return Err(INVALID_VERSION.into());
        }
        let mut state = self.state.write();
        let current = state.version();
        if !force && version < current {
            return Err(INVALID_VERSION.into());
        }
        if !force && version == current {
            return Ok(());
        }
        let topology = Topology::parse(lines, version).map_err(|e| format!("ERR {e}"))?;
        let change = if !force && current >= 0 && version == current + 1 {
            Change::Next
        } else {
            Change::Unknown
        };
        self.apply(&mut state, topology, None, change)
    }

    /// `CLUSTERX SETNODEID <id> [<version>]`: this node's id from now on (kept on
    /// disk). The slots it owns are those the topology gives that id.
    pub fn set_node_id(&self, id: &str, version: Option<i64>) -> Result<(), String> {
        let mut state = self.state.write();
        if version.is_some_and(|v| v < state.version()) {
            return Err(INVALID_VERSION.into());
        }
        if state.id == id {
            return Ok(());
        }
        match state.topology.clone() {
            Some(topology) => self.apply(&mut state, topology, Some(id.to_string()), Change::Next),
            None => {
                self.keep_id(id)?;
                state.id = id.to_string();
                Ok(())
            }
        }
    }

    /// `CLUSTERX SETSLOT <slots> NODE <id> <version>`: the slots go to node `id`; the
    /// version must be the next one (Kvrocks' rule).
    pub fn set_slots(&self, slots: &[(u16, u16)], id: &str, version: i64) -> Result<(), String> {
        let mut state = self.state.write();
        let Some(topology) = &state.topology else {
            return Err(INVALID_VERSION.into());
        };
        if version != topology.version + 1 {
            return Err(INVALID_VERSION.into());
        }
        let Some(node) = topology.nodes.iter().find(|n| n.id == id) else {
            return Err("ERR No this node in the cluster".into());
        };
        if node.role != Role::Master {
            return Err("ERR The node isn't a master".into());
        }
        let mut moved = topology.clone();
        moved.version = version;
        moved.assign(slots, id);
        self.apply(&mut state, moved, None, Change::Next)
    }

    /// `CLUSTERX MIGRATE <slots> <node-id>`: the slots go to that node at once (this node
    /// answers `-MOVED` for them and drops their keys), and CLUSTER INFO reports the
    /// migration done, which is what kvrocks-controller waits for before it pushes the
    /// next version. Kvrocks' checks and errors.
    pub fn migrate(&self, slots: (u16, u16), to: &str) -> Result<(), String> {
        let mut state = self.state.write();
        let Some(topology) = state.topology.clone() else {
            return Err("ERR Can't find the destination node id".into());
        };
        let Some(destination) = topology.nodes.iter().find(|n| n.id == to) else {
            return Err("ERR Can't find the destination node id".into());
        };
        let me = topology.nodes.iter().find(|n| n.id == state.id);
        if me.is_some_and(|me| me.role != Role::Master) {
            return Err("ERR Slave can't migrate slot".into());
        }
        if !(slots.0..=slots.1).all(|slot| state.owns(slot)) {
            return Err("ERR Can't migrate slot which doesn't belong to me".into());
        }
        if destination.role != Role::Master {
            return Err("ERR Can't migrate slot to a slave".into());
        }
        if to == state.id {
            return Err("ERR Can't migrate slot to myself".into());
        }
        let mut moved = topology.clone();
        moved.assign(&[slots], to);
        self.apply(&mut state, moved, None, Change::Next)?;
        state.migrated = Some(Migrated {
            slots,
            to: to.to_string(),
        });
        Ok(())
    }

    /// `--cluster-config FILE`, read again (SIGHUP): a line for the log, if there is a
    /// file. One that cannot be applied leaves the topology as it was.
    pub fn reload_config(&self) -> Option<String> {
        let path = self.config.as_deref()?;
        Some(
            self.load_config(path)
                .unwrap_or_else(|e| format!("{e}; the topology stays")),
        )
    }

    /// A `--cluster-config` file: its `version N` line and its SETNODES lines, applied as
    /// SETNODES applies them. What it did, for the log.
    fn load_config(&self, path: &Path) -> Result<String, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (version, lines) =
            config_lines(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let before = self.state.read().version();
        self.set_nodes(&lines, version, false)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(if version > before {
            format!("cluster topology version {version} from {}", path.display())
        } else {
            format!(
                "cluster topology of {} unchanged (version {version})",
                path.display()
            )
        })
    }

    /// Serves `topology` with this node as `id` (default: the one it has, or the one
    /// of the node at its own address), after bumping the generation of every slot
    /// that changes hands here (every owned one for an `Unknown` change) and keeping
    /// both on disk: a crash after this leaves the next start with the new ones.
    fn apply(
        &self,
        state: &mut State,
        topology: Topology,
        id: Option<String>,
        change: Change,
    ) -> Result<(), String> {
        let id = id.unwrap_or_else(|| self.myself(&state.id, &topology));
        let bumps: Vec<bool> = (0..SLOTS)
            .map(|slot| {
                let was = state.owns(slot);
                let now = topology.owned_by(slot, &id);
                was != now || (now && change == Change::Unknown)
            })
            .collect();
        let generations: Vec<(u16, u32)> = (0..SLOTS)
            .map(|slot| {
                let g = self.generations.of(slot);
                (slot, g + u32::from(bumps[usize::from(slot)]))
            })
            .collect();
        // The topology first: should the id then fail to be kept, the next start finds
        // the old id with generations bumped for the new one's slots — what it held of
        // them forgotten, never served.
        if let Some(dir) = &self.dir {
            keep_topology(dir, &topology, &generations)
                .map_err(|e| format!("ERR cannot keep the topology in {}: {e}", dir.display()))?;
        }
        if id != state.id {
            self.keep_id(&id)?;
        }
        let bumped: Vec<u16> = (0..SLOTS).filter(|&s| bumps[usize::from(s)]).collect();
        for &slot in &bumped {
            self.generations.bump(slot);
        }
        state.id = id;
        state.topology = Some(topology);
        state.migrated = None;
        if !bumped.is_empty() {
            self.sweep.wake();
        }
        Ok(())
    }

    /// This node in `topology`: by its id, else the one node at its own address (the
    /// announced one, or the RESP port's), whose id it takes, as Kvrocks finds itself.
    fn myself(&self, id: &str, topology: &Topology) -> String {
        if topology.nodes.iter().any(|n| n.id == id) {
            return id.to_string();
        }
        let port = self.announce.port.unwrap_or(self.listen.port());
        let hosts: Vec<IpAddr> = match self.announce.ip {
            Some(ip) => vec![ip],
            None if self.listen.ip().is_unspecified() => Vec::new(),
            None => vec![self.listen.ip()],
        };
        let at_my_address: Vec<&Node> = (topology.nodes.iter())
            .filter(|n| n.port == port)
            .filter(|n| {
                hosts.is_empty() || n.host.parse::<IpAddr>().is_ok_and(|ip| hosts.contains(&ip))
            })
            .collect();
        match at_my_address.as_slice() {
            [node] => node.id.clone(),
            _ => id.to_string(),
        }
    }

    fn keep_id(&self, id: &str) -> Result<(), String> {
        match &self.dir {
            Some(dir) => write_synced(dir, NODE_ID_FILE, &format!("{id}\n"))
                .map_err(|e| format!("ERR cannot keep the node id in {}: {e}", dir.display())),
            None => Ok(()),
        }
    }

    /// Keys dropped by the sweep of slots that moved, and whether one is under way.
    pub fn swept(&self) -> (u64, bool) {
        self.sweep.progress()
    }

    /// Starts the thread that drops the stored keys of slots that moved (with `on`).
    pub fn start_sweeping(&self, keys: &Keyspace) {
        if self.mode == ClusterMode::On {
            self.sweep.start(keys);
        }
    }

    /// Stops the sweep's thread (the server is stopping).
    pub fn stop_sweeping(&self) {
        self.sweep.stop();
    }
}

/// `version N` and the SETNODES lines of a `--cluster-config` file; `#` starts a
/// comment line.
fn config_lines(text: &str) -> Result<(i64, String), String> {
    let mut version = None;
    let mut lines = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.strip_prefix("version ") {
            Some(v) => {
                version = Some(
                    v.trim()
                        .parse::<i64>()
                        .ok()
                        .filter(|&v| v >= 0)
                        .ok_or("the version is not a number of 0 or more")?,
                )
            }
            None => {
                lines.push_str(line);
                lines.push('\n');
            }
        }
    }
    Ok((version.ok_or("no `version N` line")?, lines))
}

/// `contents` as `dir/name`, whole or not at all: a temporary file, synced, renamed,
/// and the directory synced, so that a crash or a power cut leaves the old file or the
/// new one.
fn write_synced(dir: &Path, name: &str, contents: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(format!("{name}.new"));
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// The topology file's text: its header, the version, the generations above 0, the
/// SETNODES lines.
fn topology_text(topology: Option<&Topology>, generations: &[(u16, u32)]) -> String {
    let mut text = format!("{TOPOLOGY_HEADER}\n");
    if let Some(t) = topology {
        text.push_str(&format!("version {}\n", t.version));
    }
    for chunk in generations
        .iter()
        .filter(|(_, g)| *g > 0)
        .collect::<Vec<_>>()
        .chunks(64)
    {
        let pairs: Vec<String> = chunk.iter().map(|(s, g)| format!("{s}={g}")).collect();
        text.push_str(&format!("generations {}\n", pairs.join(" ")));
    }
    if let Some(t) = topology {
        for line in t.to_lines().lines() {
            text.push_str(&format!("node {line}\n"));
        }
    }
    text
}

fn keep_topology(
    dir: &Path,
    topology: &Topology,
    generations: &[(u16, u32)],
) -> std::io::Result<()> {
    write_synced(
        dir,
        TOPOLOGY_FILE,
        &topology_text(Some(topology), generations),
    )
}

/// A topology file's topology (if one was pushed) and the generations above 0.
type Kept = (Option<Topology>, Vec<(u16, u32)>);

/// What `topology_text` wrote.
fn parse_topology_file(text: &str) -> Result<Kept, String> {
    let mut lines = text.lines();
    if lines.next() != Some(TOPOLOGY_HEADER) {
        return Err("not a topology this version wrote".into());
    }
    let (mut version, mut nodes, mut generations) = (None, String::new(), Vec::new());
    for line in lines {
        if let Some(v) = line.strip_prefix("version ") {
            version = Some(v.parse::<i64>().map_err(|_| "a bad version")?);
        } else if let Some(pairs) = line.strip_prefix("generations ") {
            for pair in pairs.split(' ') {
                let (slot, g) = pair.split_once('=').ok_or("a bad generation")?;
                let slot = slot.parse::<u16>().ok().filter(|&s| s < SLOTS);
                let g = g.parse::<u32>().ok();
                generations.push(slot.zip(g).ok_or("a bad generation")?);
            }
        } else if let Some(node) = line.strip_prefix("node ") {
            nodes.push_str(node);
            nodes.push('\n');
        } else {
            return Err(format!("an unknown line: {line}"));
        }
    }
    let topology = match version {
        Some(v) => Some(Topology::parse(&nodes, v).map_err(str::to_string)?),
        None if nodes.is_empty() => None,
        None => return Err("nodes without a version".into()),
    };
    Ok((topology, generations))
}

/// The topology and generations kept in `dir` for `on` (set into `generations`), or
/// none. Where the engine's keys cannot be trusted to match them — nothing kept beside
/// a warm engine, a damaged file, or a mode other than `on` after generations moved —
/// the engine is flushed and the file started anew (or removed).
fn kept_topology(
    dir: &Path,
    mode: ClusterMode,
    generations: &Generations,
    engine: &Arc<ZipCache>,
) -> Option<Topology> {
    let path = dir.join(TOPOLOGY_FILE);
    let kept = match std::fs::read_to_string(&path) {
        Ok(text) => Some(parse_topology_file(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(Err(e.to_string())),
    };
    let forget = |why: &str| {
        if engine.warm_started() {
            eprintln!("zipcache: {why}: the cache starts empty");
            if let Err(e) = engine.flush_all() {
                eprintln!("zipcache: cannot empty the cache: {e}");
            }
        }
    };
    if mode != ClusterMode::On {
        if let Some(kept) = kept {
            if !matches!(&kept, Ok((_, g)) if g.is_empty()) {
                forget(
                    "slots had moved under --cluster-mode on, whose keys this mode cannot tell apart",
                );
            }
            let _ = std::fs::remove_file(&path);
        }
        return None;
    }
    match kept {
        Some(Ok((topology, kept_generations))) => {
            for (slot, g) in kept_generations {
                generations.set(slot, g);
            }
            topology
        }
        Some(Err(e)) => {
            forget(&format!("{} cannot be read ({e})", path.display()));
            start_anew(dir);
            None
        }
        None => {
            forget("no cluster topology was kept beside this cache's data");
            start_anew(dir);
            None
        }
    }
}

/// An empty topology file: from now on a missing one means it was lost.
fn start_anew(dir: &Path) {
    if let Err(e) = write_synced(dir, TOPOLOGY_FILE, &topology_text(None, &[])) {
        eprintln!(
            "zipcache: cannot keep the cluster topology in {}: {e}",
            dir.display()
        );
    }
}

/// The id kept in `dir`, or a new one written there (whole or not at all: a crash or a
/// power cut never leaves half an id). A file that does not hold an id is an error,
/// not replaced: an operator's copy of another node's directory must not be silently
/// renamed.
fn kept_node_id(dir: &Path) -> std::io::Result<String> {
    let path = dir.join(NODE_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if valid_node_id(text.trim()) => Ok(text.trim().to_string()),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} does not hold a node id (40 characters)", path.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = new_node_id();
            write_synced(dir, NODE_ID_FILE, &format!("{id}\n"))?;
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// A node id as this node keeps and parses them: 40 printable characters (Redis makes
/// hex digits, kvrocks-controller letters and digits; Kvrocks checks the length only,
/// but a space or a line break would cut a topology line).
pub fn valid_node_id(id: &str) -> bool {
    id.len() == ID_LEN && id.bytes().all(|b| b.is_ascii_graphic())
}

/// A fresh node id: 160 random bits in hex, as `redis-server` makes them.
fn new_node_id() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 20];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        // No system randomness: the id still has to differ between nodes of one host.
        let seed = std::process::id() as u128
            ^ std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos());
        bytes[..16].copy_from_slice(&seed.to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::slot::key_slot;

    #[test]
    fn node_ids_are_forty_hex_digits_and_differ() {
        let (a, b) = (new_node_id(), new_node_id());
        assert_eq!(a.len(), 40);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(valid_node_id(&a));
        assert!(valid_node_id(&"Aa0".repeat(14)[..40]));
        assert!(!valid_node_id(&format!("{} ", &a[..39])));
        assert!(!valid_node_id(&a[..39]));
    }

    fn engine() -> Arc<ZipCache> {
        Arc::new(
            ZipCache::open(zipcache::Config {
                dram_capacity: 4 << 20,
                ..zipcache::Config::default()
            })
            .unwrap(),
        )
    }

    fn node(mode: ClusterMode, dir: Option<&Path>, engine: &Arc<ZipCache>) -> Cluster {
        let options = ServerOptions {
            cluster_mode: mode,
            data_dir: dir.map(Path::to_path_buf),
            ..ServerOptions::default()
        };
        Cluster::new(&options, "127.0.0.1:7000".parse().unwrap(), engine)
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("zipcache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_announced_address_wins_over_the_one_reached() {
        let reached: SocketAddr = "10.0.0.7:7000".parse().unwrap();
        let listen = IpAddr::from([0, 0, 0, 0]);
        let plain = node(ClusterMode::Emulated, None, &engine());
        assert_eq!(plain.address(Some(reached), listen, 6379), reached);
        assert_eq!(
            plain.address(None, IpAddr::from([127, 0, 0, 1]), 6379),
            "127.0.0.1:6379".parse().unwrap()
        );
        let options = ServerOptions {
            cluster_mode: ClusterMode::Emulated,
            cluster_announce: Announce {
                ip: Some(IpAddr::from([192, 0, 2, 1])),
                port: Some(30001),
            },
            ..ServerOptions::default()
        };
        let announced = Cluster::new(&options, reached, &engine());
        assert_eq!(
            announced.address(Some(reached), listen, 6379),
            "192.0.2.1:30001".parse().unwrap()
        );
    }

    /// A node keeps its id across restarts in its data directory; another directory is
    /// another node; a damaged file is reported, not replaced; off, nothing is written.
    #[test]
    fn a_node_keeps_its_id_in_its_data_directory() {
        let base = scratch("node-id");
        let id_in = |dir: &str| node(ClusterMode::Emulated, Some(&base.join(dir)), &engine()).id();
        let first = id_in("a");
        assert_eq!(id_in("a"), first, "the same directory, the same node");
        assert_ne!(id_in("b"), first);
        std::fs::create_dir_all(base.join("c")).unwrap();
        std::fs::write(base.join("c").join(NODE_ID_FILE), "not an id").unwrap();
        assert!(kept_node_id(&base.join("c")).is_err());
        assert_eq!(
            std::fs::read_to_string(base.join("c").join(NODE_ID_FILE)).unwrap(),
            "not an id",
            "left as it was"
        );
        node(ClusterMode::Off, Some(&base.join("d")), &engine());
        assert!(!base.join("d").exists(), "off: nothing kept");
        std::fs::remove_dir_all(&base).unwrap();
    }

    fn id(c: char) -> String {
        std::iter::repeat_n(c, ID_LEN).collect()
    }

    /// Three masters on 127.0.0.1:7000..7002, `a` at this node's address, owning
    /// `a_slots`; the rest split between `b` and `c`.
    fn fleet(a_slots: &str, b_slots: &str) -> String {
        format!(
            "{} 127.0.0.1 7000 master - {a_slots}\n{} 127.0.0.1 7001 master - {b_slots}\n{} 127.0.0.1 7002 master - 10000-16383\n",
            id('a'),
            id('b'),
            id('c')
        )
    }

    /// Versions as Kvrocks takes them: older refused, the same a no-op, newer applied;
    /// this node finds itself by its address and takes that id; its routes follow.
    #[test]
    fn pushed_topologies_route_keys_and_refuse_older_versions() {
        let cluster = node(ClusterMode::On, None, &engine());
        assert_eq!(
            cluster.route().check(0),
            Err(Redirect::Down),
            "not configured"
        );
        cluster
            .set_nodes(&fleet("0-4999", "5000-9999"), 1, false)
            .unwrap();
        assert_eq!(cluster.id(), id('a'), "found by its address");
        assert_eq!(cluster.route().check(4999), Ok(()));
        assert_eq!(
            cluster.route().check(5000),
            Err(Redirect::Moved {
                slot: 5000,
                host: "127.0.0.1".into(),
                port: 7001
            })
        );
        assert_eq!(
            cluster.set_nodes(&fleet("0-5000", "5001-9999"), 0, false),
            Err(INVALID_VERSION.into())
        );
        cluster
            .set_nodes(&fleet("0-5000", "5001-9999"), 1, false)
            .unwrap();
        assert!(
            cluster.route().check(5000).is_err(),
            "same version: unchanged"
        );
        cluster
            .set_nodes(&fleet("0-5000", "5001-9999"), 1, true)
            .unwrap();
        assert_eq!(cluster.route().check(5000), Ok(()), "FORCE applies it");
        assert!(cluster.set_nodes("bad", 9, false).is_err());
        assert_eq!(
            cluster.state().version(),
            1,
            "a refused topology changes nothing"
        );
    }

    /// The generations of slots that change hands move — both ways, and every owned
    /// slot when versions were skipped — so a slot that comes back serves nothing it
    /// held before; slots that stay keep their keys.
    #[test]
    fn slots_that_change_hands_start_a_new_generation() {
        let cluster = node(ClusterMode::On, None, &engine());
        let g = cluster.generations();
        cluster
            .set_nodes(&fleet("0-4999", "5000-9999"), 1, false)
            .unwrap();
        assert_eq!(
            (g.of(0), g.of(5000)),
            (1, 0),
            "gained from nothing: a new generation"
        );
        cluster
            .set_nodes(&fleet("0-4998", "4999-9999"), 2, false)
            .unwrap();
        assert_eq!((g.of(0), g.of(4999), g.of(5000)), (1, 2, 0), "lost: moved");
        cluster
            .set_nodes(&fleet("0-4999", "5000-9999"), 3, false)
            .unwrap();
        assert_eq!((g.of(0), g.of(4999)), (1, 3), "back: moved again");
        cluster
            .set_nodes(&fleet("0-4999", "5000-9999"), 5, false)
            .unwrap();
        assert_eq!(
            (g.of(0), g.of(4999), g.of(5000)),
            (2, 4, 0),
            "a gap: every owned slot"
        );
        cluster.migrate((0, 9), &id('b')).unwrap();
        assert_eq!((g.of(0), g.of(10)), (3, 2));
        assert_eq!(cluster.route().check(0).map_err(|_| ()), Err(()));
        assert_eq!(cluster.state().migrated.as_ref().unwrap().to, id('b'));
        assert_eq!(
            cluster.migrate((0, 9), &id('b')),
            Err("ERR Can't migrate slot which doesn't belong to me".into())
        );
        cluster.set_slots(&[(0, 9)], &id('a'), 6).unwrap();
        assert_eq!(g.of(0), 4, "SETSLOT gave it back");
        assert!(cluster.state().migrated.is_none());
        assert_eq!(
            cluster.set_slots(&[(0, 9)], &id('b'), 6),
            Err(INVALID_VERSION.into())
        );
    }

    /// The topology and generations survive a restart; a warm engine without a kept
    /// topology, or with a damaged one, starts empty; leaving `on` after slots moved
    /// empties it too.
    #[test]
    fn topologies_and_generations_are_kept_and_the_unprovable_is_forgotten() {
        let dir = scratch("topology");
        let engine = engine();
        let cluster = node(ClusterMode::On, Some(&dir), &engine);
        cluster
            .set_nodes(&fleet("0-4999", "5000-9999"), 1, false)
            .unwrap();
        cluster
            .set_nodes(&fleet("0-4998", "4999-9999"), 2, false)
            .unwrap();
        drop(cluster);
        let again = node(ClusterMode::On, Some(&dir), &engine);
        assert_eq!(again.state().version(), 2);
        assert_eq!(again.id(), id('a'));
        assert_eq!(again.generations().of(4999), 2);
        assert_eq!(again.generations().of(0), 1);
        drop(again);

        let (text, generations) = (
            std::fs::read_to_string(dir.join(TOPOLOGY_FILE)).unwrap(),
            Generations::default(),
        );
        assert_eq!(
            parse_topology_file(&text).unwrap().0.unwrap().version,
            2,
            "{text}"
        );
        std::fs::write(
            dir.join(TOPOLOGY_FILE),
            "zipcache-cluster-topology 1\nnode x\n",
        )
        .unwrap();
        assert!(kept_topology(&dir, ClusterMode::On, &generations, &engine).is_none());
        assert_eq!(
            std::fs::read_to_string(dir.join(TOPOLOGY_FILE)).unwrap(),
            "zipcache-cluster-topology 1\n",
            "started anew"
        );
        keep_topology(
            &dir,
            &Topology::parse(&fleet("0", "1"), 3).unwrap(),
            &[(7, 1)],
        )
        .unwrap();
        assert!(kept_topology(&dir, ClusterMode::Emulated, &generations, &engine).is_none());
        assert!(!dir.join(TOPOLOGY_FILE).exists(), "removed on leaving `on`");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cluster_config_files_hold_a_version_and_setnodes_lines() {
        let text = format!("# the fleet\nversion 4\n\n{}", fleet("0-9999", ""));
        let (version, lines) = config_lines(&text).unwrap();
        assert_eq!(version, 4);
        assert_eq!(Topology::parse(&lines, version).unwrap().nodes.len(), 3);
        assert!(config_lines(&fleet("0", "1")).is_err(), "no version");
        assert!(config_lines("version -1\n").is_err());

        let dir = scratch("cluster-config");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fleet.conf");
        std::fs::write(&path, &text).unwrap();
        let options = ServerOptions {
            cluster_mode: ClusterMode::On,
            cluster_config: Some(path.clone()),
            ..ServerOptions::default()
        };
        let cluster = Cluster::new(&options, "127.0.0.1:7000".parse().unwrap(), &engine());
        assert_eq!(cluster.state().version(), 4);
        std::fs::write(&path, format!("version 3\n{}", fleet("0", "1"))).unwrap();
        assert!(
            cluster
                .reload_config()
                .unwrap()
                .contains("Invalid cluster version")
        );
        assert_eq!(cluster.state().version(), 4, "an older file is refused");
        std::fs::write(&path, format!("version 5\n{}", fleet("0", "1-9999"))).unwrap();
        cluster.reload_config().unwrap();
        assert_eq!(cluster.route().check(1).map_err(|_| ()), Err(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The node against a model of what it may serve (`BTreeMap`), through writes, reads,
    /// pushed topologies (the next version, skipped versions, FORCE), `CLUSTERX MIGRATE` and
    /// restarts on the same data directory and engine: a read may miss, never return a value
    /// other than the last one written while this node owned the key's slot without a break.
    mod model {
        use std::collections::BTreeMap;

        use proptest::prelude::*;
        use zipcache::{GetOptions, PutOptions};

        use super::*;

        #[derive(Clone, Debug)]
        enum Op {
            Put(usize, u32),
            Get(usize),
            /// A topology giving this node the slots of the tags whose bit is set, pushed as
            /// the next version, after `skip` versions, or with FORCE.
            Push {
                mine: u8,
                skip: u8,
                force: bool,
            },
            /// `CLUSTERX MIGRATE` of one tag's slot to the other node.
            Migrate(usize),
            Restart,
        }

        const TAGS: [&str; 5] = ["a", "b", "c", "d", "e"];

        fn key(k: usize) -> Vec<u8> {
            format!("{{{}}}key{}", TAGS[k % TAGS.len()], k / TAGS.len()).into_bytes()
        }

        fn ops() -> impl Strategy<Value = Vec<Op>> {
            let op = prop_oneof![
                4 => (0..15usize, any::<u32>()).prop_map(|(k, v)| Op::Put(k, v)),
                4 => (0..15usize).prop_map(Op::Get),
                2 => (any::<u8>(), 0..3u8, prop::bool::weighted(0.1))
                    .prop_map(|(mine, skip, force)| Op::Push { mine, skip, force }),
                1 => (0..TAGS.len()).prop_map(Op::Migrate),
                1 => Just(Op::Restart),
            ];
            prop::collection::vec(op, 1..120)
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
            #[test]
            fn a_node_never_serves_what_another_may_have_overwritten(ops in ops()) {
                let dir = scratch(&format!("cluster-model-{}", rand_suffix()));
                let engine = engine();
                let mut cluster = node(ClusterMode::On, Some(&dir), &engine);
                let mut keys = Keyspace::new(engine.clone(), cluster.generations());
                let mut model: BTreeMap<usize, u32> = BTreeMap::new();
                let mut version = 0i64;
                let slot_of = |k: usize| key_slot(&key(k));
                for op in ops {
                    match op {
                        Op::Put(k, v) => {
                            let route = cluster.route();
                            if route.check(slot_of(k)).is_ok() {
                                keys.put_with(&key(k), &v.to_le_bytes(), PutOptions::default()).unwrap();
                                model.insert(k, v);
                            }
                        }
                        Op::Get(k) => {
                            let route = cluster.route();
                            if route.check(slot_of(k)).is_ok() {
                                let got = keys.get_item(&key(k), GetOptions::default()).unwrap();
                                if let Some(item) = got {
                                    let value = u32::from_le_bytes(item.value[..4].try_into().unwrap());
                                    prop_assert_eq!(Some(&value), model.get(&k), "key {}", k);
                                }
                            }
                        }
                        Op::Push { mine, skip, force } => {
                            let owned: Vec<bool> = (0..TAGS.len()).map(|t| (mine >> t) & 1 == 1).collect();
                            version += 1 + i64::from(skip);
                            let text = fleet_of_tags(&owned);
                            let before: Vec<bool> = (0..TAGS.len())
                                .map(|t| cluster.route().check(slot_of(t)).is_ok())
                                .collect();
                            cluster.set_nodes(&text, version, force).unwrap();
                            // A slot lost here: what the node held of it may be overwritten
                            // elsewhere from now on.
                            for t in 0..TAGS.len() {
                                if before[t] && !owned[t] {
                                    model.retain(|&k, _| k % TAGS.len() != t);
                                }
                            }
                        }
                        Op::Migrate(t) => {
                            if cluster.migrate((slot_of(t), slot_of(t)), &id('b')).is_ok() {
                                model.retain(|&k, _| k % TAGS.len() != t);
                            }
                        }
                        Op::Restart => {
                            drop(keys);
                            drop(cluster);
                            cluster = node(ClusterMode::On, Some(&dir), &engine);
                            keys = Keyspace::new(engine.clone(), cluster.generations());
                        }
                    }
                }
                drop(keys);
                drop(cluster);
                let _ = std::fs::remove_dir_all(&dir);
            }
        }

        /// Two masters on 127.0.0.1: `a` (this node, port 7000) owning the slots of the tags
        /// marked, `b` the rest.
        fn fleet_of_tags(owned: &[bool]) -> String {
            let slots = |mine: bool| -> String {
                (0..TAGS.len())
                    .filter(|&t| owned[t] == mine)
                    .map(|t| key_slot(&key(t)).to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            format!(
                "{} 127.0.0.1 7000 master - {}\n{} 127.0.0.1 7001 master - {}\n",
                id('a'),
                slots(true),
                id('b'),
                slots(false)
            )
        }

        fn rand_suffix() -> u64 {
            use std::sync::atomic::{AtomicU64, Ordering};
            static NEXT: AtomicU64 = AtomicU64::new(0);
            NEXT.fetch_add(1, Ordering::Relaxed)
        }
    }
}
