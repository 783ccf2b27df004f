//! Server commands: INFO, COMMAND (COUNT DOCS INFO), CONFIG (GET RESETSTAT SET).

use super::{Command, Result, Spec, names, spec};
use crate::resp::{Reply, glob};
use crate::server::Shared;
use crate::stats::engine_metrics;

/// Redis version reported to clients; tools gate features on it.
pub const REDIS_VERSION: &str = "7.0.0";

pub const COMMANDS: &[Spec] = &[
    spec("info", -1, |a| {
        Ok(ServerCommand::Info { sections: a.rest() }.into())
    }),
    spec("command", -1, |a| {
        if a.remaining() == 0 {
            return Ok(ServerCommand::EmptyTable.into());
        }
        a.subcommand(COMMAND_SUBCOMMANDS)
    }),
    spec("config", -2, |a| a.subcommand(CONFIG_SUBCOMMANDS)),
];

const COMMAND_SUBCOMMANDS: &[Spec] = &[
    spec("count", 2, |_| Ok(ServerCommand::CommandCount.into())),
    spec("docs", -2, any_names),
    spec("info", -2, any_names),
];

/// COMMAND DOCS / INFO [name…]: whatever names are asked about, the table is empty.
fn any_names<'a>(args: &mut super::Args<'a>) -> Result<Command<'a>> {
    args.rest();
    Ok(ServerCommand::EmptyTable.into())
}

const CONFIG_SUBCOMMANDS: &[Spec] = &[
    spec("get", -3, |a| {
        Ok(ServerCommand::ConfigGet { patterns: a.rest() }.into())
    }),
    spec(
        "resetstat",
        2,
        |_| Ok(ServerCommand::ConfigResetStat.into()),
    ),
    spec("set", -4, |_| {
        Err("ERR CONFIG SET is not supported; restart with --set NAME=VALUE".into())
    }),
];

pub enum ServerCommand<'a> {
    Info {
        sections: &'a [&'a [u8]],
    },
    /// COMMAND, COMMAND DOCS / INFO: clients only need an answer; an empty table makes
    /// them fall back to plain behaviour.
    EmptyTable,
    CommandCount,
    ConfigGet {
        patterns: &'a [&'a [u8]],
    },
    ConfigResetStat,
}

impl<'a> From<ServerCommand<'a>> for Command<'a> {
    fn from(command: ServerCommand<'a>) -> Self {
        Command::Server(command)
    }
}

impl ServerCommand<'_> {
    pub fn execute(self, shared: &Shared, out: &mut Reply) -> Result<()> {
        match self {
            ServerCommand::Info { sections } => out.bulk(info(shared, sections).as_bytes()),
            ServerCommand::EmptyTable => out.array(0),
            ServerCommand::CommandCount => out.integer(names().count() as i64),
            ServerCommand::ConfigGet { patterns } => {
                let parameters = [
                    ("save", String::new()),
                    ("appendonly", "no".to_string()),
                    ("maxmemory", shared.cache.stats().dram_capacity.to_string()),
                    ("maxmemory-policy", "allkeys-lru".to_string()),
                    ("maxclients", shared.info.max_connections.to_string()),
                    ("databases", "1".to_string()),
                    ("port", shared.info.resp_port.to_string()),
                    ("bind", shared.info.listen.to_string()),
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
        }
        Ok(())
    }
}

fn info(shared: &Shared, sections: &[&[u8]]) -> String {
    let wanted = |name: &str| {
        sections.is_empty()
            || sections.iter().any(|s| {
                s.eq_ignore_ascii_case(name.as_bytes())
                    || s.eq_ignore_ascii_case(b"all")
                    || s.eq_ignore_ascii_case(b"everything")
                    || s.eq_ignore_ascii_case(b"default")
            })
    };
    let engine = shared.cache.stats();
    let counters = shared.counters.snapshot();
    let counter = |name: &str| {
        counters
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    };
    let mut text = String::new();
    let mut section = |title: &str, fields: Vec<(String, String)>| {
        if wanted(title) {
            text.push_str(&format!("# {title}\r\n"));
            for (k, v) in fields {
                text.push_str(&format!("{k}:{v}\r\n"));
            }
            text.push_str("\r\n");
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
            ("redis_mode", "standalone".into()),
            ("process_id", std::process::id().to_string()),
            ("tcp_port", shared.info.resp_port.to_string()),
            (
                "uptime_in_seconds",
                shared.started.elapsed().as_secs().to_string(),
            ),
            ("io_threads_active", shared.info.threads.to_string()),
        ]),
    );
    section(
        "Clients",
        pairs(&[
            ("connected_clients", counter("curr_connections").to_string()),
            ("maxclients", shared.info.max_connections.to_string()),
        ]),
    );
    section(
        "Memory",
        pairs(&[
            ("used_memory", engine.dram_used.to_string()),
            ("used_memory_rss", engine.rss_bytes.unwrap_or(0).to_string()),
            ("maxmemory", engine.dram_capacity.to_string()),
            ("maxmemory_policy", "allkeys-lru".into()),
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
        ]),
    );
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
