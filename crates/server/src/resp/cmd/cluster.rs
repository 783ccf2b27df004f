//! Redis Cluster commands (`core/cluster.rs` holds the node): CLUSTER (SLOTS SHARDS
//! NODES INFO MYID KEYSLOT COUNTKEYSINSLOT GETKEYSINSLOT LINKS HELP), READONLY,
//! READWRITE, ASKING — answered as Redis 7 answers them — and the slot check every
//! multi-key command passes first (`-CROSSSLOT`). Without `--cluster-mode` they answer
//! that cluster support is disabled, as a plain Redis does.

use std::net::SocketAddr;
use std::ops::Bound;

use super::keys::BULK_OVERHEAD;
use super::{Command, Result, Spec, spec, with_subcommands};
use crate::core::cluster::{SLOTS, key_slot};
use crate::resp::{Client, Reply, Resp};
use crate::transport::output::OUTPUT_BUDGET;

const DISABLED: &str = "ERR This instance has cluster support disabled";
const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

pub const COMMANDS: &[Spec] = &[
    with_subcommands("cluster", -2, SUBCOMMANDS, |a| a.subcommand(SUBCOMMANDS)),
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
    /// READONLY, READWRITE, ASKING: a single node serves every slot, reads and writes.
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
}

impl<'a> From<ClusterCommand<'a>> for Command<'a> {
    fn from(command: ClusterCommand<'a>) -> Self {
        Command::Cluster(command)
    }
}

impl ClusterCommand<'_> {
    pub fn execute(self, shared: &Resp, client: &Client, out: &mut Reply) -> Result<()> {
        let cluster = &shared.core.cluster;
        if !cluster.enabled() {
            return Err(DISABLED.into());
        }
        let info = &shared.core.info;
        let me = cluster.address(client.local, info.listen, info.resp_port);
        let ip = me.ip().to_string();
        match self {
            ClusterCommand::Ok => out.simple("OK"),
            ClusterCommand::Slots => {
                out.array(1);
                out.array(3);
                out.integer(0);
                out.integer(i64::from(SLOTS - 1));
                node_entry(out, &ip, me, &cluster.id);
            }
            ClusterCommand::Shards => {
                out.array(1);
                out.map(2);
                out.bulk(b"slots");
                out.array(2);
                out.integer(0);
                out.integer(i64::from(SLOTS - 1));
                out.bulk(b"nodes");
                out.array(1);
                out.map(7);
                out.bulk(b"id");
                out.bulk(cluster.id.as_bytes());
                out.bulk(b"port");
                out.integer(i64::from(me.port()));
                for (name, value) in [("ip", ip.as_str()), ("endpoint", ip.as_str())] {
                    out.bulk(name.as_bytes());
                    out.bulk(value.as_bytes());
                }
                out.bulk(b"role");
                out.bulk(b"master");
                out.bulk(b"replication-offset");
                out.integer(0);
                out.bulk(b"health");
                out.bulk(b"online");
            }
            ClusterCommand::Nodes => {
                // No cluster bus: its port is 0. Epochs are 0: the topology never changes.
                let line = format!(
                    "{} {}@0 myself,master - 0 0 0 connected 0-{}\n",
                    cluster.id,
                    me,
                    SLOTS - 1
                );
                out.verbatim(line.as_bytes());
            }
            ClusterCommand::Info => {
                let mut text = String::new();
                for (name, value) in [
                    ("cluster_state", "ok".to_string()),
                    ("cluster_slots_assigned", SLOTS.to_string()),
                    ("cluster_slots_ok", SLOTS.to_string()),
                    ("cluster_slots_pfail", "0".into()),
                    ("cluster_slots_fail", "0".into()),
                    ("cluster_known_nodes", "1".into()),
                    ("cluster_size", "1".into()),
                    ("cluster_current_epoch", "0".into()),
                    ("cluster_my_epoch", "0".into()),
                    ("cluster_stats_messages_sent", "0".into()),
                    ("cluster_stats_messages_received", "0".into()),
                    ("total_cluster_links_buffer_limit_exceeded", "0".into()),
                ] {
                    text.push_str(&format!("{name}:{value}\r\n"));
                }
                out.verbatim(text.as_bytes());
            }
            ClusterCommand::MyId => out.bulk(cluster.id.as_bytes()),
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
        }
        Ok(())
    }
}

/// One node of a CLUSTER SLOTS range: ip, port, id, and (Redis 7) its metadata, none.
fn node_entry(out: &mut Reply, ip: &str, me: SocketAddr, id: &str) {
    out.array(4);
    out.bulk(ip.as_bytes());
    out.integer(i64::from(me.port()));
    out.bulk(id.as_bytes());
    out.map(0);
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

/// `-CROSSSLOT` unless every key lies in one slot: checked in cluster mode before a
/// command runs, as every Redis Cluster node does.
pub fn same_slot<'a>(mut keys: impl Iterator<Item = &'a [u8]>) -> Result<()> {
    let Some(first) = keys.next().map(key_slot) else {
        return Ok(());
    };
    if keys.any(|key| key_slot(key) != first) {
        return Err(CROSSSLOT.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::core::ServerOptions;
    use crate::core::cluster::{ClusterMode, key_slot};
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
