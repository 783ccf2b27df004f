//! A Redis Cluster topology pushed from outside (`--cluster-mode on`): the nodes and who
//! owns each of the 16,384 slots, at a version. Written in Kvrocks' `CLUSTERX SETNODES`
//! lines, so that apache/kvrocks-controller drives a ZipCache fleet unmodified and an
//! operator's `--cluster-config` file holds the same lines:
//!
//! ```text
//! <node-id> <ip> <port> master - <slot> <slot-slot> ...
//! <node-id> <ip> <port> slave <master-id>
//! ```
//!
//! Parsed with Kvrocks' rules and errors (`docs/notes/kvrocks-controller.md` §2.3):
//! ids are any 40 bytes, a range `A-B` needs `A < B`, a slot has one master. Pure data:
//! who this node is and what a change costs its keys is `core/cluster.rs`'s job.

use super::slot::SLOTS;

/// A node's id: 40 bytes, as Kvrocks checks them (the controller makes them of
/// `[a-zA-Z0-9]`; Redis of hex digits).
pub const ID_LEN: usize = 40;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Master,
    /// A replica of the master with this id. ZipCache keeps no replicas in sync (a cache
    /// node is refilled, not copied); a replica line names a node that owns no slots.
    Replica(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: String,
    pub host: String,
    pub port: u16,
    pub role: Role,
}

/// The nodes and the owner of every slot, at `version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub version: i64,
    pub nodes: Vec<Node>,
    /// The index in `nodes` of each slot's master; `UNOWNED` where none.
    owners: Vec<u16>,
}

const UNOWNED: u16 = u16::MAX;

/// `-ERR` messages of a topology Kvrocks would refuse, in its words.
pub const INVALID_NODES: &str = "Invalid cluster nodes info";
pub const INVALID_ID: &str = "Invalid cluster node id";
const INVALID_PORT: &str = "Invalid cluster node port";
const INVALID_ROLE: &str = "Invalid cluster node role";
pub const SLOT_OUT_OF_RANGE: &str = "Slot is out of range";
const OVERLAPPED: &str = "Slot distribution is overlapped";
const MISSING_NEWLINE: &str = "Invalid nodes definition: Missing newline between node entries.";

impl Topology {
    /// The lines of `CLUSTERX SETNODES` (or a `--cluster-config` file) at `version`.
    /// Blank lines and repeated spaces are ignored, as Kvrocks ignores them.
    pub fn parse(text: &str, version: i64) -> Result<Topology, &'static str> {
        let mut nodes: Vec<Node> = Vec::new();
        let mut owners = vec![UNOWNED; usize::from(SLOTS)];
        for line in text.split('\n') {
            let fields: Vec<&str> = line.split(' ').filter(|f| !f.is_empty()).collect();
            if fields.is_empty() {
                continue;
            }
            if fields.len() < 5 {
                return Err(INVALID_NODES);
            }
            let id = fields[0];
            if id.len() != ID_LEN {
                return Err(INVALID_ID);
            }
            let port: u16 = fields[2].parse().map_err(|_| INVALID_PORT)?;
            let role = match fields[3].to_ascii_lowercase().as_str() {
                "master" if fields[4] == "-" => Role::Master,
                "master" => return Err(INVALID_ID),
                "slave" | "replica" if fields[4].len() == ID_LEN => {
                    if fields.len() > 5 {
                        return Err(INVALID_NODES);
                    }
                    Role::Replica(fields[4].to_string())
                }
                "slave" | "replica" => return Err(INVALID_ID),
                _ => return Err(INVALID_ROLE),
            };
            // A later line with the same id replaces the earlier one (Kvrocks: the last
            // one wins).
            let index = match nodes.iter().position(|n| n.id == id) {
                Some(i) => i,
                None => {
                    nodes.push(Node {
                        id: id.to_string(),
                        host: String::new(),
                        port,
                        role: Role::Master,
                    });
                    nodes.len() - 1
                }
            };
            if nodes.len() >= usize::from(UNOWNED) {
                return Err(INVALID_NODES);
            }
            nodes[index] = Node {
                id: id.to_string(),
                host: fields[1].to_string(),
                port,
                role,
            };
            for token in &fields[5..] {
                if token.len() == ID_LEN && token.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(MISSING_NEWLINE);
                }
                let (first, last) = slot_range(token)?;
                for slot in first..=last {
                    let owner = &mut owners[usize::from(slot)];
                    if *owner != UNOWNED && *owner != index as u16 {
                        return Err(OVERLAPPED);
                    }
                    *owner = index as u16;
                }
            }
        }
        if nodes.is_empty() {
            return Err(INVALID_NODES);
        }
        Ok(Topology {
            version,
            nodes,
            owners,
        })
    }

    /// Gives the slots of `ranges` (first, last) to the node `id`, which must be one of
    /// the nodes (CLUSTERX SETSLOT).
    pub fn assign(&mut self, ranges: &[(u16, u16)], id: &str) {
        let Some(index) = self.nodes.iter().position(|n| n.id == id) else {
            return;
        };
        for &(first, last) in ranges {
            for slot in first..=last.min(SLOTS - 1) {
                self.owners[usize::from(slot)] = index as u16;
            }
        }
    }

    /// The master that owns `slot`, if any.
    pub fn owner(&self, slot: u16) -> Option<&Node> {
        match self.owners.get(usize::from(slot)) {
            Some(&index) if index != UNOWNED => self.nodes.get(usize::from(index)),
            _ => None,
        }
    }

    /// Whether the node `id` owns `slot`.
    pub fn owned_by(&self, slot: u16, id: &str) -> bool {
        self.owner(slot).is_some_and(|node| node.id == id)
    }

    /// The runs of consecutive slots with one owner, in slot order: first, last, owner.
    pub fn ranges(&self) -> Vec<(u16, u16, &Node)> {
        let mut runs: Vec<(u16, u16, u16)> = Vec::new();
        for (slot, &owner) in self.owners.iter().enumerate() {
            let slot = slot as u16;
            match runs.last_mut() {
                Some((_, last, o)) if *o == owner && *last + 1 == slot => *last = slot,
                _ => runs.push((slot, slot, owner)),
            }
        }
        runs.into_iter()
            .filter(|&(_, _, owner)| owner != UNOWNED)
            .map(|(first, last, owner)| (first, last, &self.nodes[usize::from(owner)]))
            .collect()
    }

    /// Slots that have an owner.
    pub fn slots_assigned(&self) -> usize {
        self.owners.iter().filter(|&&o| o != UNOWNED).count()
    }

    /// The slots of the node `id`, written as SETNODES and CLUSTER NODES write them:
    /// `A-B` for a run, `N` for a single slot, separated by spaces.
    pub fn slots_of(&self, id: &str) -> Vec<(u16, u16)> {
        self.ranges()
            .into_iter()
            .filter(|(_, _, node)| node.id == id)
            .map(|(first, last, _)| (first, last))
            .collect()
    }

    /// Masters that own at least one slot (`cluster_size`).
    pub fn size(&self) -> usize {
        let mut owning = vec![false; self.nodes.len()];
        for &owner in self.owners.iter().filter(|&&o| o != UNOWNED) {
            owning[usize::from(owner)] = true;
        }
        owning.into_iter().filter(|&o| o).count()
    }

    /// The topology as SETNODES lines, which `parse` reads back to an equal topology.
    pub fn to_lines(&self) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            match &node.role {
                Role::Master => {
                    text.push_str(&format!("{} {} {} master -", node.id, node.host, node.port));
                    for (first, last) in self.slots_of(&node.id) {
                        text.push(' ');
                        text.push_str(&run(first, last));
                    }
                }
                Role::Replica(master) => text.push_str(&format!(
                    "{} {} {} slave {master}",
                    node.id, node.host, node.port
                )),
            }
            text.push('\n');
        }
        text
    }
}

/// A run of slots as Redis and Kvrocks write it.
pub fn run(first: u16, last: u16) -> String {
    if first == last {
        first.to_string()
    } else {
        format!("{first}-{last}")
    }
}

/// `N` or `A-B` (with `A < B`, as Kvrocks insists) within 0..16,384.
fn slot_range(token: &str) -> Result<(u16, u16), &'static str> {
    let slot = |s: &str| {
        s.parse::<u16>()
            .ok()
            .filter(|&n| n < SLOTS)
            .ok_or(SLOT_OUT_OF_RANGE)
    };
    match token.split_once('-') {
        None => slot(token).map(|n| (n, n)),
        Some((first, last)) if !last.contains('-') => {
            let (first, last) = (slot(first)?, slot(last)?);
            if first >= last {
                return Err(SLOT_OUT_OF_RANGE);
            }
            Ok((first, last))
        }
        Some(_) => Err(SLOT_OUT_OF_RANGE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(c: char) -> String {
        std::iter::repeat_n(c, ID_LEN).collect()
    }

    #[test]
    fn setnodes_lines_parse_and_write_back() {
        let text = format!(
            "{a} 10.0.0.1 6666 master - 0-100 200 300-8191\n\
             {b} 10.0.0.2 6667 slave {a}\n\n  {c}  10.0.0.3 6668 master - 8192-16383\n",
            a = id('a'),
            b = id('b'),
            c = id('c')
        );
        let topology = Topology::parse(&text, 7).unwrap();
        assert_eq!(topology.version, 7);
        assert_eq!(topology.nodes.len(), 3);
        assert_eq!(topology.owner(0).unwrap().port, 6666);
        assert_eq!(topology.owner(200).unwrap().id, id('a'));
        assert!(topology.owner(150).is_none());
        assert_eq!(topology.owner(16383).unwrap().host, "10.0.0.3");
        assert_eq!(topology.slots_assigned(), 101 + 1 + 7892 + 8192);
        assert_eq!(topology.size(), 2);
        assert_eq!(
            topology.slots_of(&id('a')),
            vec![(0, 100), (200, 200), (300, 8191)]
        );
        assert_eq!(topology.nodes[1].role, Role::Replica(id('a')));
        let again = Topology::parse(&topology.to_lines(), 7).unwrap();
        assert_eq!(again, topology);
    }

    /// Each refusal Kvrocks makes, with its words.
    #[test]
    fn what_kvrocks_refuses_is_refused_alike() {
        let (a, b) = (id('a'), id('b'));
        for (text, error) in [
            (String::new(), INVALID_NODES),
            ("\n \n".into(), INVALID_NODES),
            (format!("{a} 1.2.3.4 6379 master"), INVALID_NODES),
            ("short 1.2.3.4 6379 master -".to_string(), INVALID_ID),
            (format!("{a} 1.2.3.4 70000 master -"), INVALID_PORT),
            (format!("{a} 1.2.3.4 6379 leader -"), INVALID_ROLE),
            (format!("{a} 1.2.3.4 6379 master {b}"), INVALID_ID),
            (format!("{a} 1.2.3.4 6379 slave -"), INVALID_ID),
            (format!("{a} 1.2.3.4 6379 slave {b} 5"), INVALID_NODES),
            (
                format!("{a} 1.2.3.4 6379 master - 16384"),
                SLOT_OUT_OF_RANGE,
            ),
            (format!("{a} 1.2.3.4 6379 master - 5-5"), SLOT_OUT_OF_RANGE),
            (format!("{a} 1.2.3.4 6379 master - 9-5"), SLOT_OUT_OF_RANGE),
            (
                format!("{a} 1.2.3.4 6379 master - 1-2-3"),
                SLOT_OUT_OF_RANGE,
            ),
            (format!("{a} 1.2.3.4 6379 master - x"), SLOT_OUT_OF_RANGE),
            (
                format!("{a} 1.2.3.4 6379 master - 0-10\n{b} 1.2.3.5 6379 master - 10"),
                OVERLAPPED,
            ),
            (
                format!("{a} 1.2.3.4 6379 master - 0 {}", "f".repeat(40)),
                MISSING_NEWLINE,
            ),
        ] {
            assert_eq!(Topology::parse(&text, 1), Err(error), "{text:?}");
        }
        // A master without slots is a node of the fleet that owns none yet.
        let empty = Topology::parse(&format!("{a} 1.2.3.4 6379 master - "), 1).unwrap();
        assert_eq!(empty.slots_assigned(), 0);
        assert_eq!(empty.size(), 0);
        assert!(empty.ranges().is_empty());
    }

    #[test]
    fn ranges_cover_each_owner_run() {
        let (a, b) = (id('a'), id('b'));
        let topology = Topology::parse(
            &format!("{a} h 1 master - 0-9 20-16383\n{b} h 2 master - 10-19"),
            1,
        )
        .unwrap();
        let runs: Vec<(u16, u16, u16)> = topology
            .ranges()
            .into_iter()
            .map(|(f, l, n)| (f, l, n.port))
            .collect();
        assert_eq!(runs, vec![(0, 9, 1), (10, 19, 2), (20, 16383, 1)]);
    }
}
