//! Redis Cluster commands (`core/cluster.rs` holds the node): CLUSTER (SLOTS SHARDS
//! NODES INFO MYID KEYSLOT COUNTKEYSINSLOT GETKEYSINSLOT LINKS HELP), READONLY,
//! READWRITE, ASKING — answered as Redis 7 answers them — and the slot check every
//! multi-key command passes first (`-CROSSSLOT`). Without `--cluster-mode` they answer
//! that cluster support is disabled, as a plain Redis does.

use std::ops::Bound;

use super::keys::BULK_OVERHEAD;
use super::{Args, Command, ErrorReply, Result, Spec, integer, spec, with_subcommands};
use crate::core::cluster::{ClusterMode, Redirect, State, valid_node_id};
use crate::core::slot::{SLOTS, key_slot};
use crate::core::topology::{Role, run};
use crate::resp::{Client, Reply, Resp};
use crate::transport::output::OUTPUT_BUDGET;

const DISABLED: &str = "ERR This instance has cluster support disabled";
const NOT_PUSHED: &str = "ERR CLUSTERX needs --cluster-mode on: this node's topology is not pushed";
const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
/// Before a topology is pushed, with the `ERR` both kvrocks-controller generations
/// match (`docs/notes/kvrocks-controller.md` §4).
const NOT_INITIALIZED: &str = "ERR CLUSTERDOWN The cluster is not initialized";
const SLOT_NOT_SERVED: &str = "CLUSTERDOWN Hash slot not served";
const CLUSTERX_USAGE: &str =
    "ERR CLUSTERX command, CLUSTERX VERSION|MYID|SETNODEID|SETNODES|SETSLOT|MIGRATE";

pub const COMMANDS: &[Spec] = &[
    with_subcommands("cluster", -2, SUBCOMMANDS, |a| a.subcommand(SUBCOMMANDS)),
    with_subcommands("clusterx", -2, CLUSTERX_SUBCOMMANDS, |a| {
        a.subcommand(CLUSTERX_SUBCOMMANDS)
    }),
    spec("readonly", 1, |_| Ok(ClusterCommand::Ok.into())),
    spec("readwrite", 1, |_| Ok(ClusterCommand::Ok.into())),
    spec("asking", 1, |_| Ok(ClusterCommand::Ok.into())),
];

const SUBCOMMANDS: &[Spec] = &[
    spec("slots", 2, |_| Ok(ClusterCommand::Slots.into())),
    spec("shards", 2, |_| Ok(ClusterCommand::Shards.into())),
    spec("nodes", 2, |_| Ok(ClusterCommand::Nodes.into())),
    spec("info", 2, |_| Ok(ClusterCommand::Info.into())),
    spec("myid", 2, |_| Ok(ClusterCommand::MyId.into())),
    spec("links", 2, |_| Ok(ClusterCommand::Links.into())),
    spec("help", 2, |_| Ok(ClusterCommand::Help.into())),
    spec("keyslot", 3, |a| {
        Ok(ClusterCommand::KeySlot { key: a.next()? }.into())
    }),
    spec("countkeysinslot", 3, |a| {
        let slot = a.integer()?;
        let slot = valid_slot(slot).ok_or("ERR Invalid slot")?;
        Ok(ClusterCommand::CountKeysInSlot { slot }.into())
    }),
    spec("getkeysinslot", 4, |a| {
        let (slot, count) = (a.integer()?, a.integer()?);
        match (valid_slot(slot), usize::try_from(count)) {
            (Some(slot), Ok(count)) => Ok(ClusterCommand::GetKeysInSlot { slot, count }.into()),
            _ => Err("ERR Invalid slot or number of keys".into()),
        }
    }),
];

/// Kvrocks' CLUSTERX, which kvrocks-controller drives a fleet with
/// (`docs/notes/kvrocks-controller.md`), with its arities and errors.
const CLUSTERX_SUBCOMMANDS: &[Spec] = &[
    spec("version", 2, |_| Ok(ClusterCommand::Version.into())),
    spec("myid", 2, |_| Ok(ClusterCommand::MyId.into())),
    spec("setnodeid", -3, |a| {
        let id = a.next()?;
        let version = match a.rest() {
            [] => None,
            [version] => Some(integer(version).ok_or(super::NOT_INTEGER)?),
            _ => return Err(CLUSTERX_USAGE.into()),
        };
        let id = std::str::from_utf8(id)
            .ok()
            .filter(|id| valid_node_id(id))
            .ok_or(CLUSTERX_USAGE)?;
        Ok(ClusterCommand::SetNodeId { id, version }.into())
    }),
    spec("setnodes", -4, |a| {
        let lines = std::str::from_utf8(a.next()?).map_err(|_| "ERR Invalid cluster nodes info")?;
        let version = integer(a.next()?).ok_or("ERR Invalid version")?;
        let force = match a.rest() {
            [] => false,
            [word] if word.eq_ignore_ascii_case(b"force") => true,
            _ => return Err("ERR Invalid setnodes options".into()),
        };
        Ok(ClusterCommand::SetNodes {
            lines,
            version,
            force,
        }
        .into())
    }),
    spec("setslot", 6, |a| {
        let slots = slot_ranges(a.next()?)?;
        if !a.next()?.eq_ignore_ascii_case(b"node") {
            return Err("ERR Invalid setslot options".into());
        }
        let id = std::str::from_utf8(a.next()?)
            .ok()
            .filter(|id| valid_node_id(id))
            .ok_or("ERR Invalid node id")?;
        let version = a.integer()?;
        if version < 0 {
            return Err("ERR Invalid version".into());
        }
        Ok(ClusterCommand::SetSlot { slots, id, version }.into())
    }),
    spec("migrate", -4, migrate),
];

/// `CLUSTERX MIGRATE <slot|A-B> <node-id> [ASYNC | SYNC [timeout]]`: the first range only.
fn migrate<'a>(a: &mut Args<'a>) -> Result<Command<'a>> {
    let slots = *slot_ranges(a.next()?)?
        .first()
        .ok_or("ERR Slot range is invalid")?;
    let id =
        std::str::from_utf8(a.next()?).map_err(|_| "ERR Can't find the destination node id")?;
    match a.rest() {
        [] => {}
        [mode] if mode.eq_ignore_ascii_case(b"async") => {}
        [mode] if mode.eq_ignore_ascii_case(b"sync") => {}
        [mode, _] if mode.eq_ignore_ascii_case(b"async") => {
            return Err("ERR Async migration does not support timeout".into());
        }
        [mode, timeout] if mode.eq_ignore_ascii_case(b"sync") => match integer(timeout) {
            Some(t) if t >= 0 => {}
            Some(_) => return Err("ERR timeout is negative".into()),
            None => return Err("ERR timeout is not an integer or out of range".into()),
        },
        [_] | [_, _] => return Err("ERR Invalid sync flag".into()),
        _ => return Err(super::wrong_number("clusterx")),
    }
    Ok(ClusterCommand::Migrate { slots, id }.into())
}

/// Kvrocks' slot list: `N`, `A-B` (A ≤ B), several separated by spaces in one argument.
fn slot_ranges(arg: &[u8]) -> Result<Vec<(u16, u16)>> {
    let text = std::str::from_utf8(arg).map_err(|_| "ERR Invalid slot id")?;
    let slot = |s: &str| -> Result<u16> {
        s.parse::<u16>()
            .ok()
            .filter(|&n| n < SLOTS)
            .ok_or_else(|| format!("ERR Invalid slot id: {s}").into())
    };
    let mut ranges = Vec::new();
    for token in text.split(' ').filter(|t| !t.is_empty()) {
        if token.starts_with('-') || token.ends_with('-') {
            return Err(format!(
                "ERR Invalid slot range: `{token}`. The character '-' can't appear in the first or last position."
            )
            .into());
        }
        ranges.push(match token.split_once('-') {
            None => (slot(token)?, slot(token)?),
            Some((first, last)) if !last.contains('-') => {
                let (first, last) = (slot(first)?, slot(last)?);
                if first > last {
                    return Err(format!("ERR Invalid slot range: `{token}`. The slot range needs to satisfy the condition (int1 <= int2).").into());
                }
                (first, last)
            }
            Some(_) => {
                return Err(format!("ERR Invalid slot range: `{token}`. The slot range should be of the form `int1-int2`.").into());
            }
        });
    }
    if ranges.is_empty() {
        return Err("ERR Invalid slot id: empty".into());
    }
    Ok(ranges)
}

/// What CLUSTER HELP lists: the subcommands served here.
const HELP: &[&str] = &[
    "CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "COUNTKEYSINSLOT <slot>",
    "    Return the number of keys in <slot>.",
    "GETKEYSINSLOT <slot> <count>",
    "    Return key names stored by current node in a slot.",
    "INFO",
    "    Return information about the cluster.",
    "KEYSLOT <key>",
    "    Return the hash slot for <key>.",
    "LINKS",
    "    Return information about all network links between this node and its peers.",
    "MYID",
    "    Return the node id.",
    "NODES",
    "    Return cluster configuration seen by node. Output format:",
    "    <id> <ip:port@bus-port> <flags> <master> <pings> <pongs> <epoch> <link> <slot> ...",
    "SHARDS",
    "    Return information about slot range mappings and the nodes associated with them.",
    "SLOTS",
    "    Return information about slots range mappings. Each range is made of:",
    "    start, end, master and replicas IP addresses, ports and ids",
    "HELP",
    "    Print this help.",
];

fn valid_slot(slot: i64) -> Option<u16> {
    u16::try_from(slot).ok().filter(|&s| s < SLOTS)
}

pub enum ClusterCommand<'a> {
    /// READONLY, READWRITE, ASKING: a node serves reads and writes of its own slots.
    Ok,
    Slots,
    Shards,
    Nodes,
    Info,
    MyId,
    Links,
    Help,
    KeySlot {
        key: &'a [u8],
    },
    CountKeysInSlot {
        slot: u16,
    },
    GetKeysInSlot {
        slot: u16,
        count: usize,
    },
    Version,
    SetNodeId {
        id: &'a str,
        version: Option<i64>,
    },
    SetNodes {
        lines: &'a str,
        version: i64,
        force: bool,
    },
    SetSlot {
        slots: Vec<(u16, u16)>,
        id: &'a str,
        version: i64,
    },
    Migrate {
        slots: (u16, u16),
        id: &'a str,
    },
}

impl<'a> From<ClusterCommand<'a>> for Command<'a> {
    fn from(command: ClusterCommand<'a>) -> Self {
        Command::Cluster(command)
    }
}

/// A node as the CLUSTER replies show it.
struct Shown {
    id: String,
    host: String,
    port: u16,
    /// `None` for a master; a replica's master id.
    master: Option<String>,
    myself: bool,
    slots: Vec<(u16, u16)>,
}

/// The fleet as this node sees it: its version and nodes. Emulated, this node alone at
/// the address the client reached (or the announced one), owning every slot.
struct View {
    version: i64,
    nodes: Vec<Shown>,
    /// The slot runs and their master's index in `nodes`, in slot order.
    ranges: Vec<(u16, u16, usize)>,
}

impl View {
    fn of(shared: &Resp, client: &Client, state: &State) -> Result<View> {
        let cluster = &shared.core.cluster;
        if cluster.mode == ClusterMode::Emulated {
            let info = &shared.core.info;
            let me = cluster.address(client.local, info.listen, info.resp_port);
            return Ok(View {
                version: 0,
                nodes: vec![Shown {
                    id: state.id.clone(),
                    host: me.ip().to_string(),
                    port: me.port(),
                    master: None,
                    myself: true,
                    slots: vec![(0, SLOTS - 1)],
                }],
                ranges: vec![(0, SLOTS - 1, 0)],
            });
        }
        let topology = state.topology.as_ref().ok_or(NOT_INITIALIZED)?;
        let nodes: Vec<Shown> = topology
            .nodes
            .iter()
            .map(|node| Shown {
                id: node.id.clone(),
                host: node.host.clone(),
                port: node.port,
                master: match &node.role {
                    Role::Master => None,
                    Role::Replica(master) => Some(master.clone()),
                },
                myself: node.id == state.id,
                slots: topology.slots_of(&node.id),
            })
            .collect();
        let ranges = topology
            .ranges()
            .into_iter()
            .filter_map(|(first, last, owner)| {
                let index = nodes.iter().position(|n| n.id == owner.id)?;
                Some((first, last, index))
            })
            .collect();
        Ok(View {
            version: topology.version,
            nodes,
            ranges,
        })
    }

    fn replicas_of<'v>(&'v self, master: &'v str) -> impl Iterator<Item = &'v Shown> {
        self.nodes
            .iter()
            .filter(move |n| n.master.as_deref() == Some(master))
    }

    fn slots_assigned(&self) -> usize {
        self.ranges
            .iter()
            .map(|&(first, last, _)| usize::from(last - first) + 1)
            .sum()
    }
}

impl ClusterCommand<'_> {
    pub fn execute(self, shared: &Resp, client: &Client, out: &mut Reply) -> Result<()> {
        let cluster = &shared.core.cluster;
        if !cluster.enabled() {
            return Err(DISABLED.into());
        }
        let pushed = cluster.mode == ClusterMode::On;
        match self {
            ClusterCommand::Ok => out.simple("OK"),
            ClusterCommand::Slots => {
                let view = View::of(shared, client, &cluster.state())?;
                out.array(view.ranges.len());
                for &(first, last, master) in &view.ranges {
                    let master = &view.nodes[master];
                    let replicas: Vec<&Shown> = view.replicas_of(&master.id).collect();
                    out.array(3 + replicas.len());
                    out.integer(i64::from(first));
                    out.integer(i64::from(last));
                    for node in std::iter::once(master).chain(replicas) {
                        node_entry(out, node);
                    }
                }
            }
            ClusterCommand::Shards => {
                let view = View::of(shared, client, &cluster.state())?;
                let masters: Vec<&Shown> =
                    view.nodes.iter().filter(|n| n.master.is_none()).collect();
                out.array(masters.len());
                for master in masters {
                    out.map(2);
                    out.bulk(b"slots");
                    out.array(master.slots.len() * 2);
                    for &(first, last) in &master.slots {
                        out.integer(i64::from(first));
                        out.integer(i64::from(last));
                    }
                    out.bulk(b"nodes");
                    let replicas: Vec<&Shown> = view.replicas_of(&master.id).collect();
                    out.array(1 + replicas.len());
                    for node in std::iter::once(master).chain(replicas) {
                        shard_node(out, node);
                    }
                }
            }
            ClusterCommand::Nodes => {
                let view = View::of(shared, client, &cluster.state())?;
                // No cluster bus: its port is 0. The epoch is the topology's version.
                let mut text = String::new();
                for node in &view.nodes {
                    let role = if node.master.is_some() {
                        "slave"
                    } else {
                        "master"
                    };
                    let flags = if node.myself {
                        format!("myself,{role}")
                    } else {
                        role.into()
                    };
                    text.push_str(&format!(
                        "{} {}:{}@0 {flags} {} 0 0 {} connected",
                        node.id,
                        node.host,
                        node.port,
                        node.master.as_deref().unwrap_or("-"),
                        view.version
                    ));
                    for &(first, last) in &node.slots {
                        text.push(' ');
                        text.push_str(&run(first, last));
                    }
                    text.push('\n');
                }
                out.verbatim(text.as_bytes());
            }
            ClusterCommand::Info => {
                let state = cluster.state();
                let view = View::of(shared, client, &state)?;
                let assigned = view.slots_assigned();
                let size = view.nodes.iter().filter(|n| !n.slots.is_empty()).count();
                let mut text = String::new();
                for (name, value) in [
                    (
                        "cluster_state",
                        if assigned == usize::from(SLOTS) {
                            "ok"
                        } else {
                            "fail"
                        }
                        .to_string(),
                    ),
                    ("cluster_slots_assigned", assigned.to_string()),
                    ("cluster_slots_ok", assigned.to_string()),
                    ("cluster_slots_pfail", "0".into()),
                    ("cluster_slots_fail", "0".into()),
                    ("cluster_known_nodes", view.nodes.len().to_string()),
                    ("cluster_size", size.to_string()),
                    ("cluster_current_epoch", view.version.to_string()),
                    ("cluster_my_epoch", view.version.to_string()),
                    ("cluster_stats_messages_sent", "0".into()),
                    ("cluster_stats_messages_received", "0".into()),
                    ("total_cluster_links_buffer_limit_exceeded", "0".into()),
                ] {
                    text.push_str(&format!("{name}:{value}\r\n"));
                }
                // The last CLUSTERX MIGRATE, as Kvrocks reports a finished one (the
                // space after the colon is Kvrocks'; both controllers trim it).
                if let Some(migrated) = &state.migrated {
                    text.push_str(&format!(
                        "migrating_slot: {}\r\ndestination_node: {}\r\nmigrating_state: success\r\n",
                        run(migrated.slots.0, migrated.slots.1),
                        migrated.to
                    ));
                }
                out.verbatim(text.as_bytes());
            }
            ClusterCommand::MyId => out.bulk(cluster.id().as_bytes()),
            ClusterCommand::Links => out.array(0),
            ClusterCommand::Help => {
                out.array(HELP.len());
                for line in HELP {
                    out.simple(line);
                }
            }
            ClusterCommand::KeySlot { key } => out.integer(i64::from(key_slot(key))),
            ClusterCommand::CountKeysInSlot { slot } => {
                let mut count = 0;
                keys_in_slot(shared, slot, |_| {
                    count += 1;
                    true
                })?;
                out.integer(count);
            }
            ClusterCommand::GetKeysInSlot { slot, count } => {
                // At most `count`, and fewer once the reply would pass the output budget
                // (as SCAN): a resharding client asks again until the slot is empty.
                let (mut found, mut bytes) = (Vec::new(), 0);
                if count > 0 {
                    keys_in_slot(shared, slot, |key| {
                        bytes += key.len() + BULK_OVERHEAD;
                        found.push(key.to_vec());
                        found.len() < count && bytes < OUTPUT_BUDGET
                    })?;
                }
                out.array(found.len());
                for key in &found {
                    out.bulk(key);
                }
            }
            ClusterCommand::Version if pushed => {
                out.bulk(cluster.state().version().to_string().as_bytes())
            }
            ClusterCommand::SetNodeId { id, version } if pushed => {
                cluster.set_node_id(id, version).map_err(ErrorReply::from)?;
                out.simple("OK");
            }
            ClusterCommand::SetNodes {
                lines,
                version,
                force,
            } if pushed => {
                cluster
                    .set_nodes(lines, version, force)
                    .map_err(ErrorReply::from)?;
                out.simple("OK");
            }
            ClusterCommand::SetSlot { slots, id, version } if pushed => {
                cluster
                    .set_slots(&slots, id, version)
                    .map_err(ErrorReply::from)?;
                out.simple("OK");
            }
            ClusterCommand::Migrate { slots, id } if pushed => {
                cluster.migrate(slots, id).map_err(ErrorReply::from)?;
                out.simple("OK");
            }
            ClusterCommand::Version
            | ClusterCommand::SetNodeId { .. }
            | ClusterCommand::SetNodes { .. }
            | ClusterCommand::SetSlot { .. }
            | ClusterCommand::Migrate { .. } => return Err(NOT_PUSHED.into()),
        }
        Ok(())
    }
}

/// One node of a CLUSTER SLOTS range: ip, port, id, and (Redis 7) its metadata, none.
fn node_entry(out: &mut Reply, node: &Shown) {
    out.array(4);
    out.bulk(node.host.as_bytes());
    out.integer(i64::from(node.port));
    out.bulk(node.id.as_bytes());
    out.map(0);
}

/// One node of a CLUSTER SHARDS entry.
fn shard_node(out: &mut Reply, node: &Shown) {
    out.map(7);
    out.bulk(b"id");
    out.bulk(node.id.as_bytes());
    out.bulk(b"port");
    out.integer(i64::from(node.port));
    for name in ["ip", "endpoint"] {
        out.bulk(name.as_bytes());
        out.bulk(node.host.as_bytes());
    }
    out.bulk(b"role");
    out.bulk(if node.master.is_some() {
        &b"replica"[..]
    } else {
        b"master"
    });
    out.bulk(b"replication-offset");
    out.integer(0);
    out.bulk(b"health");
    out.bulk(b"online");
}

/// A redirection as Redis Cluster words it.
pub fn redirect(redirect: Redirect) -> ErrorReply {
    match redirect {
        Redirect::Moved { slot, host, port } => format!("MOVED {slot} {host}:{port}").into(),
        Redirect::Down => SLOT_NOT_SERVED.into(),
    }
}

/// Visits the keys of `slot`, in key order, while `visit` says go on. The engine keeps
/// no index by slot, so this walks every key: as KEYS, it refuses beyond `keys-limit`
/// keys rather than hold the connection's thread for the whole cache.
fn keys_in_slot(shared: &Resp, slot: u16, mut visit: impl FnMut(&[u8]) -> bool) -> Result<()> {
    let limit = shared.keys_limit;
    let mut satisfied = false;
    let stopped = shared.core.keys.walk(
        Bound::Unbounded,
        Bound::Unbounded,
        limit.saturating_add(1),
        |key, _| {
            satisfied = key_slot(key) == slot && !visit(key);
            !satisfied
        },
    )?;
    if stopped.is_some() && !satisfied {
        return Err(format!(
            "ERR the slot's keys would take examining more than {limit} keys (keys-limit)"
        )
        .into());
    }
    Ok(())
}

/// The one slot of `keys` (`None` for none), or `-CROSSSLOT`: checked in a cluster mode
/// before a command runs, as every Redis Cluster node does.
pub fn same_slot<'a>(mut keys: impl Iterator<Item = &'a [u8]>) -> Result<Option<u16>> {
    let Some(first) = keys.next().map(key_slot) else {
        return Ok(None);
    };
    if keys.any(|key| key_slot(key) != first) {
        return Err(CROSSSLOT.into());
    }
    Ok(Some(first))
}

#[cfg(test)]
mod tests {
    use crate::core::ServerOptions;
    use crate::core::cluster::ClusterMode;
    use crate::core::slot::key_slot;
    use crate::fuzzing::resp_request;
    use crate::serving_tests::{dram_engine, resp_session, serve_in_process};
    use crate::transport::output::OUTPUT_BUDGET;

    /// GETKEYSINSLOT of more keys than the output budget holds answers fewer, within
    /// it; COUNTKEYSINSLOT counts them all; past `keys-limit` both refuse.
    #[test]
    fn keys_in_a_slot_are_listed_within_the_budget_and_the_keys_limit() {
        let options = ServerOptions {
            cluster_mode: ClusterMode::Emulated,
            keys_limit: 5_000,
            ..ServerOptions::default()
        };
        let key = |i: u32| format!("{{tag}}{i:0>200}").into_bytes();
        let slot = key_slot(b"tag").to_string();
        let mut input = Vec::new();
        for i in 0..4_000 {
            input.extend(resp_request(&[b"SET", &key(i), b"v"]));
        }
        input.extend(resp_request(&[
            b"CLUSTER",
            b"GETKEYSINSLOT",
            slot.as_bytes(),
            b"100000",
        ]));
        input.extend(resp_request(&[
            b"CLUSTER",
            b"COUNTKEYSINSLOT",
            slot.as_bytes(),
        ]));
        let cache = dram_engine();
        let (out, _) = serve_in_process(resp_session(cache.clone(), &options), &input);
        let text = String::from_utf8_lossy(&out);
        let listed = text.split("+OK\r\n").last().unwrap();
        let (header, rest) = listed.split_once("\r\n").unwrap();
        let n: usize = header.strip_prefix('*').unwrap().parse().unwrap();
        assert!(n > 100 && n < 4_000, "{n} keys listed");
        assert!(rest.len() <= OUTPUT_BUDGET + 300, "{} bytes", rest.len());
        assert!(text.ends_with(":4000\r\n"), "{}", &text[text.len() - 40..]);

        // Past the keys limit: refused, not a partial count.
        let mut more = Vec::new();
        for i in 4_000..6_000 {
            more.extend(resp_request(&[b"SET", &key(i), b"v"]));
        }
        more.extend(resp_request(&[
            b"CLUSTER",
            b"COUNTKEYSINSLOT",
            slot.as_bytes(),
        ]));
        let (out, _) = serve_in_process(resp_session(cache, &options), &more);
        assert!(
            String::from_utf8_lossy(&out).ends_with("(keys-limit)\r\n"),
            "{}",
            String::from_utf8_lossy(&out[out.len() - 100..])
        );
    }
}
