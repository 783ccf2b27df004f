//! Server commands: INFO, COMMAND (COUNT DOCS INFO), CONFIG (GET RESETSTAT SET), TIME.

use super::{Command, Result, Spec, command_table, names, spec, with_subcommands};
use crate::core::stats::engine_metrics;
use crate::resp::Resp;
use crate::resp::{Reply, glob};

/// Redis version reported to clients; tools gate features on it.
pub const REDIS_VERSION: &str = "7.0.0";

pub const COMMANDS: &[Spec] = &[
    spec("info", -1, |a| {
        Ok(ServerCommand::Info { sections: a.rest() }.into())
    }),
    with_subcommands("command", -1, COMMAND_SUBCOMMANDS, |a| {
        if a.remaining() == 0 {
            return Ok(ServerCommand::CommandTable { names: None }.into());
        }
        a.subcommand(COMMAND_SUBCOMMANDS)
    }),
    with_subcommands("config", -2, CONFIG_SUBCOMMANDS, |a| {
        a.subcommand(CONFIG_SUBCOMMANDS)
    }),
    spec("time", 1, |_| Ok(ServerCommand::Time.into())),
];

const COMMAND_SUBCOMMANDS: &[Spec] = &[
    spec("count", 2, |_| Ok(ServerCommand::CommandCount.into())),
    // No documentation is served: whatever names are asked about, the table is empty.
    spec("docs", -2, |a| {
        a.rest();
        Ok(ServerCommand::EmptyTable.into())
    }),
    spec("info", -2, |a| {
        Ok(ServerCommand::CommandTable {
            names: Some(a.rest()),
        }
        .into())
    }),
];

const CONFIG_SUBCOMMANDS: &[Spec] = &[
    spec("get", -3, |a| {
        Ok(ServerCommand::ConfigGet { patterns: a.rest() }.into())
    }),
    spec(
        "resetstat",
        2,
        |_| Ok(ServerCommand::ConfigResetStat.into()),
    ),
    spec("set", -4, config_set),
];

/// CONFIG SET name value [name value …], as Redis 7: every name is checked (unknown,
/// repeated) before any value, and nothing changes unless every pair is valid. What can
/// change at run time is `maxmemory` (the DRAM budget, as memcached's `cache_memlimit`);
/// `maxmemory-policy` only takes the policy in use, `allkeys-lru`, which clients that
/// set up a cache send.
fn config_set<'a>(args: &mut super::Args<'a>) -> Result<Command<'a>> {
    let pairs = args.rest();
    if !pairs.len().is_multiple_of(2) {
        return Err(super::SYNTAX.into());
    }
    let names: Vec<&[u8]> = pairs.iter().step_by(2).copied().collect();
    for (i, name) in names.iter().enumerate() {
        if !CONFIG_SETTABLE
            .iter()
            .any(|s| name.eq_ignore_ascii_case(s.as_bytes()))
        {
            return Err(format!(
                "ERR Unknown option or number of arguments for CONFIG SET - '{}'",
                String::from_utf8_lossy(name)
            )
            .into());
        }
        if names[..i]
            .iter()
            .any(|earlier| earlier.eq_ignore_ascii_case(name))
        {
            return Err(set_failed(name, "duplicate parameter").into());
        }
    }
    let mut maxmemory = None;
    for pair in pairs.chunks(2) {
        let (name, value) = (pair[0], pair[1]);
        if name.eq_ignore_ascii_case(b"maxmemory") {
            let bytes = memory_value(value)
                .ok_or_else(|| set_failed(name, "argument must be a memory value"))?;
            maxmemory = Some(bytes);
        } else if !value.eq_ignore_ascii_case(b"allkeys-lru") {
            let why = "argument(s) must be one of the following: allkeys-lru";
            return Err(set_failed(name, why).into());
        }
    }
    Ok(ServerCommand::ConfigSet { maxmemory }.into())
}

/// Redis's CONFIG SET error for a value of parameter `name` it could not take.
fn set_failed(name: &[u8], why: &str) -> String {
    format!(
        "ERR CONFIG SET failed (possibly related to argument '{}') - {why}",
        String::from_utf8_lossy(name).to_ascii_lowercase()
    )
}

/// The parameters CONFIG SET takes.
const CONFIG_SETTABLE: [&str; 2] = ["maxmemory", "maxmemory-policy"];

/// Redis's memory values: digits, then optionally `b`, `k`/`kb`, `m`/`mb`, `g`/`gb`
/// (any case; `k` is 1000, `kb` 1024). `None` for anything else, or past `u64`.
fn memory_value(text: &[u8]) -> Option<u64> {
    let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let number: u64 = std::str::from_utf8(&text[..digits]).ok()?.parse().ok()?;
    let unit = text[digits..].to_ascii_lowercase();
    let scale: u64 = match &unit[..] {
        b"" | b"b" => 1,
        b"k" => 1000,
        b"kb" => 1 << 10,
        b"m" => 1000 * 1000,
        b"mb" => 1 << 20,
        b"g" => 1000 * 1000 * 1000,
        b"gb" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(scale)
}

pub enum ServerCommand<'a> {
    /// The engine's clock (expiries are times on it), as Redis's seconds and
    /// microseconds.
    Time,
    Info {
        sections: &'a [&'a [u8]],
    },
    /// COMMAND DOCS: clients only need an answer; an empty table makes them fall back
    /// to plain behaviour.
    EmptyTable,
    /// COMMAND (`None`: every command) and COMMAND INFO: names, arities and where the
    /// keys are, which cluster clients route by.
    CommandTable {
        names: Option<&'a [&'a [u8]]>,
    },
    CommandCount,
    ConfigGet {
        patterns: &'a [&'a [u8]],
    },
    ConfigResetStat,
    /// Validated: the new DRAM budget, if the request sets one.
    ConfigSet {
        maxmemory: Option<u64>,
    },
}

impl<'a> From<ServerCommand<'a>> for Command<'a> {
    fn from(command: ServerCommand<'a>) -> Self {
        Command::Server(command)
    }
}

impl ServerCommand<'_> {
    pub fn execute(self, shared: &Resp, out: &mut Reply) -> Result<()> {
        match self {
            ServerCommand::Info { sections } => out.verbatim(info(shared, sections).as_bytes()),
            ServerCommand::EmptyTable => out.array(0),
            ServerCommand::Time => {
                let ms = shared.core.keys.engine().now_ms();
                out.array(2);
                out.bulk((ms / 1000).to_string().as_bytes());
                out.bulk(((ms % 1000) * 1000).to_string().as_bytes());
            }
            ServerCommand::CommandTable { names } => command_table(out, names),
            ServerCommand::CommandCount => out.integer(names().count() as i64),
            ServerCommand::ConfigGet { patterns } => {
                let parameters = [
                    ("save", String::new()),
                    ("appendonly", "no".to_string()),
                    (
                        "maxmemory",
                        shared.core.keys.engine().stats().dram_capacity.to_string(),
                    ),
                    ("maxmemory-policy", "allkeys-lru".to_string()),
                    ("maxclients", shared.core.info.max_connections.to_string()),
                    ("databases", "1".to_string()),
                    ("port", shared.core.info.resp_port.to_string()),
                    ("bind", shared.core.info.listen.to_string()),
                ];
                let found: Vec<&(&str, String)> = parameters
                    .iter()
                    .filter(|(name, _)| {
                        patterns
                            .iter()
                            .any(|p| glob::matches(&p.to_ascii_lowercase(), name.as_bytes()))
                    })
                    .collect();
                out.map(found.len());
                for (name, value) in found {
                    out.bulk(name.as_bytes());
                    out.bulk(value.as_bytes());
                }
            }
            ServerCommand::ConfigResetStat => out.simple("OK"),
            ServerCommand::ConfigSet { maxmemory } => {
                if let Some(bytes) = maxmemory {
                    // may evict: DRAM-only, down to the new budget before the reply
                    shared
                        .core
                        .keys
                        .engine()
                        .set_dram_capacity(bytes)
                        .map_err(|e| set_failed(b"maxmemory", &e.to_string()))?;
                }
                out.simple("OK");
            }
        }
        Ok(())
    }
}

fn info(shared: &Resp, sections: &[&[u8]]) -> String {
    let wanted = |name: &str| {
        sections.is_empty()
            || sections.iter().any(|s| {
                s.eq_ignore_ascii_case(name.as_bytes())
                    || s.eq_ignore_ascii_case(b"all")
                    || s.eq_ignore_ascii_case(b"everything")
                    || s.eq_ignore_ascii_case(b"default")
            })
    };
    let engine = shared.core.keys.engine().stats();
    let counters = shared.core.counters.snapshot();
    let counter = |name: &str| {
        counters
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    };
    let mut text = String::new();
    let mut section = |title: &str, fields: Vec<(String, String)>| {
        if wanted(title) {
            // As Redis: a blank line between sections, none after the last.
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            text.push_str(&format!("# {title}\r\n"));
            for (k, v) in fields {
                text.push_str(&format!("{k}:{v}\r\n"));
            }
        }
    };
    let pairs = |list: &[(&str, String)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    section(
        "Server",
        pairs(&[
            ("redis_version", REDIS_VERSION.into()),
            ("zipcache_version", env!("CARGO_PKG_VERSION").into()),
            (
                "redis_mode",
                if shared.core.cluster.enabled() {
                    "cluster"
                } else {
                    "standalone"
                }
                .into(),
            ),
            ("arch_bits", (usize::BITS).to_string()),
            ("process_id", std::process::id().to_string()),
            ("tcp_port", shared.core.info.resp_port.to_string()),
            (
                "uptime_in_seconds",
                shared.core.started.elapsed().as_secs().to_string(),
            ),
            ("io_threads_active", shared.core.info.threads.to_string()),
        ]),
    );
    section(
        "Clients",
        pairs(&[
            ("connected_clients", counter("curr_connections").to_string()),
            ("maxclients", shared.core.info.max_connections.to_string()),
        ]),
    );
    section(
        "Memory",
        pairs(&[
            ("used_memory", engine.dram_used.to_string()),
            ("used_memory_rss", engine.rss_bytes.unwrap_or(0).to_string()),
            ("maxmemory", engine.dram_capacity.to_string()),
            ("maxmemory_policy", "allkeys-lru".into()),
            (
                "mem_clients_normal",
                shared.transport.buffers.buffered().to_string(),
            ),
            (
                "maxmemory_clients",
                shared.transport.buffers.limit().to_string(),
            ),
        ]),
    );
    section(
        "Stats",
        pairs(&[
            (
                "total_connections_received",
                counter("total_connections").to_string(),
            ),
            (
                "rejected_connections",
                counter("rejected_connections").to_string(),
            ),
            (
                "total_commands_processed",
                counter("total_commands_processed").to_string(),
            ),
            ("keyspace_hits", counter("get_hits").to_string()),
            ("keyspace_misses", counter("get_misses").to_string()),
            ("evicted_keys", engine.dropped_objects.to_string()),
            ("expired_keys", engine.expired.to_string()),
            (
                "evicted_clients",
                counter("buffer_budget_kicks").to_string(),
            ),
            (
                "request_size_kicks",
                counter("request_size_kicks").to_string(),
            ),
            (
                "first_request_kicks",
                counter("first_request_kicks").to_string(),
            ),
            (
                "auth_timeout_kicks",
                counter("auth_timeout_kicks").to_string(),
            ),
            (
                "broken_hash_replies",
                counter("broken_hash_replies").to_string(),
            ),
            // Redis 7's name for refused AUTH and HELLO AUTH.
            ("acl_access_denied_auth", counter("auth_errors").to_string()),
        ]),
    );
    // No replicas: every node is a master of its slots (kvrocks-controller reads
    // `role`).
    section(
        "Replication",
        pairs(&[("role", "master".into()), ("connected_slaves", "0".into())]),
    );
    let cluster = &shared.core.cluster;
    let mut cluster_lines = vec![("cluster_enabled", u8::from(cluster.enabled()).to_string())];
    if cluster.mode == crate::core::cluster::ClusterMode::On {
        // The keys of slots that moved away or back, dropped by the sweep, and whether
        // one is under way (`core/sweep.rs`).
        let (dropped, sweeping) = cluster.swept();
        cluster_lines.push((
            "cluster_topology_version",
            cluster.state().version().to_string(),
        ));
        cluster_lines.push(("cluster_slot_keys_dropped", dropped.to_string()));
        cluster_lines.push(("cluster_slot_sweep_running", u8::from(sweeping).to_string()));
    }
    section("Cluster", pairs(&cluster_lines));
    section("Zipcache", engine_metrics(&engine));
    section(
        "Keyspace",
        pairs(&[(
            "db0",
            format!("keys={},expires=0,avg_ttl=0", engine.objects_resident),
        )]),
    );
    text
}
