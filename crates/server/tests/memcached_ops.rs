//! memcached's operator features: the `stats` inventory (`t/stats.t`: each counter
//! counts what memcached counts, `stats reset` zeroes what memcached zeroes, `stats
//! settings` reports our settings), `--idle-timeout` with its `idle_kicks`
//! (`t/idle-timeout.t`), `shutdown` refused unless enabled (`t/shutdown.t`; stopping is
//! in `shutdown_command.rs`) and `cache_memlimit` (`t/dyn-maxbytes.t`).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Client, TestServer};
use zipcache::Config;
use zipcache_server::ServerOptions;

fn number(stats: &HashMap<String, String>, name: &str) -> u64 {
    stats
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {stats:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number: {stats:?}"))
}

fn numbers(mc: &mut Client, names: &[&str]) -> Vec<u64> {
    let stats = mc.stats("");
    names.iter().map(|name| number(&stats, name)).collect()
}

#[test]
fn commands_are_counted_under_memcached_names() {
    let server = TestServer::with_options(ServerOptions {
        max_value_size: 1024,
        ..TestServer::options()
    });
    let mut mc = Client::connect(server.memcached);
    let counted = [
        "delete_hits",
        "delete_misses",
        "incr_hits",
        "incr_misses",
        "decr_hits",
        "decr_misses",
        "cas_hits",
        "cas_misses",
        "cas_badval",
        "touch_hits",
        "touch_misses",
        "cmd_flush",
        "total_items",
        "store_too_large",
        "cmd_meta",
        "cmd_touch",
    ];
    assert_eq!(numbers(&mut mc, &counted), vec![0; counted.len()]);

    mc.ask("set n 0 0 1\r\n5\r\n", 1);
    assert_eq!(mc.ask("incr n 2\r\nincr nope 1\r\n", 2), ["7", "NOT_FOUND"]);
    assert_eq!(
        mc.ask("decr n 1\r\ndecr nope 1\r\ndecr nope 1\r\n", 3),
        ["6", "NOT_FOUND", "NOT_FOUND"]
    );
    assert_eq!(
        mc.ask("touch n 100\r\ntouch nope 100\r\n", 2),
        ["TOUCHED", "NOT_FOUND"]
    );
    assert_eq!(mc.ask("gat 100 n nope\r\n", 3), ["VALUE n 0 1", "6", "END"]);
    assert_eq!(mc.ask("cas nope 0 0 1 1\r\nx\r\n", 1), ["NOT_FOUND"]);
    let cas = mc.ask("gets n\r\n", 3)[0]
        .rsplit(' ')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(mc.ask("cas n 0 0 1 1\r\nx\r\n", 1), ["EXISTS"]);
    assert_eq!(
        mc.ask(&format!("cas n 0 0 1 {cas}\r\ny\r\n"), 1),
        ["STORED"]
    );
    assert_eq!(
        mc.ask("delete n\r\ndelete n\r\nmd n\r\n", 3),
        ["DELETED", "NOT_FOUND", "NF"]
    );
    let large = "x".repeat(2048);
    assert_eq!(
        mc.ask(&format!("set big 0 0 2048\r\n{large}\r\n"), 1),
        ["SERVER_ERROR object too large for cache"]
    );
    // Meta arithmetic: a hit, a miss, and a created counter (neither, as memcached).
    mc.ask("set m 0 0 1\r\n1\r\n", 1);
    assert_eq!(
        mc.ask("ma m\r\nma nope MD\r\nma fresh N0\r\n", 3),
        ["HD", "NF", "HD"]
    );
    assert_eq!(mc.ask("mn\r\nflush_all\r\n", 2), ["MN", "OK"]);

    // Three stores (two sets, the good cas; not the vivified counter); five meta
    // commands; touch and gat each one hit and one miss, and every key of a gat is a
    // touch command, as in memcached.
    assert_eq!(
        numbers(&mut mc, &counted),
        [1, 2, 2, 1, 1, 3, 1, 1, 1, 2, 2, 1, 3, 1, 5, 4]
    );
}

#[test]
fn traffic_is_counted_in_bytes_read_and_written() {
    let server = TestServer::start();
    let mut mc = Client::connect(server.memcached);
    assert_eq!(numbers(&mut mc, &["bytes_written"]), [0]);
    let before = numbers(&mut mc, &["bytes_read", "bytes_written"]);
    let request = "set k 0 0 5\r\nhello\r\n";
    mc.ask(request, 1);
    let after = numbers(&mut mc, &["bytes_read", "bytes_written"]);
    // This `stats` line and the set; the first `stats` reply and `STORED`.
    assert_eq!(
        after[0] - before[0],
        (request.len() + "stats\r\n".len()) as u64
    );
    assert!(after[1] - before[1] > "STORED\r\n".len() as u64);
}

#[test]
fn stats_reset_zeroes_counters_but_not_gauges() {
    let server = TestServer::start();
    let mut mc = Client::connect(server.memcached);
    mc.ask(
        "set k 0 0 1\r\nv\r\nget k\r\nget nope\r\ndelete nope\r\n",
        6,
    );
    let names = [
        "cmd_get",
        "cmd_set",
        "get_hits",
        "get_misses",
        "delete_misses",
        "total_items",
        "total_connections",
    ];
    assert_eq!(numbers(&mut mc, &names), [2, 1, 1, 1, 1, 1, 1]);
    assert_eq!(mc.ask("stats reset\r\n", 1), ["RESET"]);
    let stats = mc.stats("");
    for name in names.iter().chain(&["evictions", "get_expired"]) {
        assert_eq!(number(&stats, name), 0, "{name}");
    }
    // Written since the reset: its own reply.
    assert_eq!(number(&stats, "bytes_written"), "RESET\r\n".len() as u64);
    assert_eq!(number(&stats, "curr_items"), 1);
    assert_eq!(number(&stats, "curr_connections"), 1);
    assert_eq!(number(&stats, "accepting_conns"), 1);
    assert!(number(&stats, "bytes") > 0);
}

#[test]
fn a_read_of_an_expired_key_counts_in_get_expired() {
    let server = TestServer::start();
    let mut mc = Client::connect(server.memcached);
    // An absolute exptime one second from now, by the engine's clock.
    let now = server.cache.now_ms() / 1000;
    mc.ask(&format!("set k 0 {} 1\r\nv\r\n", now + 1), 1);
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(mc.ask("get k\r\n", 1), ["END"]);
    assert_eq!(numbers(&mut mc, &["get_expired", "get_misses"]), [1, 1]);
}

#[test]
fn stats_settings_report_our_settings() {
    let server = TestServer::with_options(ServerOptions {
        max_connections: 1024,
        idle_timeout: Some(Duration::from_secs(7)),
        shutdown_enabled: true,
        flush_all_enabled: false,
        ..TestServer::options()
    });
    let mut mc = Client::connect(server.memcached);
    let settings = mc.stats(" settings");
    for (name, value) in [
        ("maxconns", "1024"),
        ("maxbytes", "268435456"),
        ("domain_socket", "NULL"),
        ("evictions", "on"),
        ("cas_enabled", "yes"),
        ("auth_enabled_sasl", "no"),
        ("auth_enabled_ascii", "no"),
        ("shutdown_command", "yes"),
        ("flush_enabled", "no"),
        ("idle_timeout", "7"),
    ] {
        assert_eq!(
            settings.get(name).map(String::as_str),
            Some(value),
            "{name}"
        );
    }
    let defaults = TestServer::start();
    let settings = Client::connect(defaults.memcached).stats(" settings");
    assert_eq!(settings["shutdown_command"], "no");
    assert_eq!(settings["idle_timeout"], "0");
}

#[test]
fn idle_connections_are_closed_and_counted_busy_ones_kept() {
    let server = TestServer::with_options(ServerOptions {
        idle_timeout: Some(Duration::from_secs(1)),
        ..TestServer::options()
    });
    let mut idle = Client::connect(server.memcached);
    let mut busy = Client::connect(server.memcached);
    assert_eq!(idle.ask("version\r\n", 1).len(), 1);
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(numbers(&mut busy, &["idle_kicks"]).len(), 1);
    }
    // 2.4 s without a request: the idle one is gone, the busy one still served.
    assert!(idle.closed());
    assert_eq!(numbers(&mut busy, &["idle_kicks"]), [1]);
}

#[test]
fn without_an_idle_timeout_connections_stay() {
    let server = TestServer::start();
    let mut quiet = Client::connect(server.memcached);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(numbers(&mut quiet, &["idle_kicks"]), [0]);
}

#[test]
fn shutdown_is_refused_unless_enabled() {
    let server = TestServer::start();
    let mut mc = Client::connect(server.memcached);
    for request in ["shutdown\r\n", "shutdown graceful\r\n", "shutdown foo\r\n"] {
        assert_eq!(mc.ask(request, 1), ["SERVER_ERROR: shutdown not enabled"]);
    }
    assert_eq!(mc.ask("version\r\n", 1).len(), 1, "still serving");
}

const MIB: u64 = 1 << 20;

/// Stores a 1000-byte value that compresses poorly under each key of `keys`, pipelined.
fn fill(mc: &mut Client, keys: std::ops::Range<u32>) {
    for chunk in keys.collect::<Vec<_>>().chunks(100) {
        let mut batch = String::new();
        for i in chunk {
            let value: String = (0..125u32)
                .map(|j| format!("{:08x}", (i * 7919 + j).wrapping_mul(2_654_435_761)))
                .collect();
            batch.push_str(&format!("set key{i} 0 0 1000\r\n{value}\r\n"));
        }
        let replies = mc.ask(&batch, chunk.len());
        assert!(replies.iter().all(|r| r == "STORED"), "{replies:?}");
    }
}

/// A server with a 16 MiB budget, and a memcached client that filled about 14 MiB of it.
fn nearly_full_16_mib() -> (TestServer, Client) {
    let server = TestServer::on_engine(
        Config {
            dram_capacity: 16 * MIB,
            // The fill's hex values share a pattern a trained dictionary would squeeze far
            // below "nearly full"; these tests are about the budget, not the ratio.
            dictionaries: false,
            ..Config::default()
        },
        TestServer::options(),
    );
    let mut mc = Client::connect(server.memcached);
    fill(&mut mc, 0..14_000);
    (server, mc)
}

#[test]
fn cache_memlimit_resizes_the_dram_budget() {
    let (_server, mut mc) = nearly_full_16_mib();
    let full = numbers(&mut mc, &["bytes", "evictions"]);
    assert!(full[0] > 12 * MIB, "{full:?}");

    assert_eq!(mc.ask("cache_memlimit 8\r\n", 1), ["OK"]);
    let lowered = numbers(&mut mc, &["limit_maxbytes", "bytes", "evictions"]);
    assert_eq!(lowered[0], 8 * MIB);
    assert!(lowered[1] <= 8 * MIB, "{lowered:?}");
    assert!(lowered[2] > full[1], "{lowered:?}");
    assert_eq!(mc.stats(" settings")["maxbytes"], (8 * MIB).to_string());

    assert_eq!(mc.ask("cache_memlimit 32\r\n", 1), ["OK"]);
    // Counted once the count settles after the raise: the flusher may be taking a leaf
    // out under the old budget (a group eviction it began before the raise, seen to land
    // after `cache_memlimit 32` was answered).
    let mut evicted_at_raise = numbers(&mut mc, &["evictions"])[0];
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let now = numbers(&mut mc, &["evictions"])[0];
        if now == evicted_at_raise {
            break;
        }
        evicted_at_raise = now;
    }
    fill(&mut mc, 14_000..30_000);
    let raised = numbers(&mut mc, &["limit_maxbytes", "bytes", "evictions"]);
    assert_eq!(raised[0], 32 * MIB);
    assert!(raised[1] > 14 * MIB, "grew past the old budget: {raised:?}");
    assert_eq!(
        raised[2], evicted_at_raise,
        "nothing evicted after the raise"
    );
}

#[test]
fn cache_memlimit_errors_are_memcached_s() {
    let server = TestServer::start();
    let mut mc = Client::connect(server.memcached);
    for (request, reply) in [
        ("cache_memlimit\r\n", "ERROR"),
        ("cache_memlimit lots\r\n", "ERROR"),
        ("cache_memlimit -8\r\n", "ERROR"),
        (
            "cache_memlimit 7\r\n",
            "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m",
        ),
        (
            "cache_memlimit 1000000001\r\n",
            "MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes",
        ),
    ] {
        assert_eq!(mc.ask(request, 1), [reply], "{request:?}");
    }
    assert_eq!(numbers(&mut mc, &["limit_maxbytes"]), [256 * MIB]);
    mc.send(b"cache_memlimit 64 noreply\r\n");
    assert_eq!(numbers(&mut mc, &["limit_maxbytes"]), [64 * MIB]);
}

/// Redis's `CONFIG SET maxmemory` resizes the same budget as `cache_memlimit`; a request
/// with any invalid pair changes nothing. (Replies Redis shares are in `differential.rs`;
/// these are where ours differ: no unlimited budget, one eviction policy.)
#[test]
fn config_set_maxmemory_resizes_the_dram_budget() {
    let (server, mut mc) = nearly_full_16_mib();
    let mut resp = Client::connect(server.resp);
    assert_eq!(resp.ask("CONFIG SET maxmemory 8mb\r\n", 1), ["+OK"]);
    let lowered = numbers(&mut mc, &["limit_maxbytes", "bytes"]);
    assert_eq!(lowered[0], 8 * MIB);
    assert!(lowered[1] <= 8 * MIB, "{lowered:?}");
    assert_eq!(
        resp.ask("CONFIG GET maxmemory\r\n", 5),
        ["*2", "$9", "maxmemory", "$7", "8388608"]
    );
    let failed = "-ERR CONFIG SET failed (possibly related to argument";
    for (request, reply) in [
        (
            "CONFIG SET maxmemory 0\r\n",
            format!(
                "{failed} 'maxmemory') - invalid configuration: dram_capacity 0 is below 65536 bytes"
            ),
        ),
        (
            "CONFIG SET maxmemory 2gb maxmemory-policy volatile-lru\r\n",
            format!(
                "{failed} 'maxmemory-policy') - argument(s) must be one of the following: allkeys-lru"
            ),
        ),
        (
            "CONFIG SET maxmemory 2048pb\r\n",
            format!("{failed} 'maxmemory') - argument must be a memory value"),
        ),
    ] {
        assert_eq!(resp.ask(request, 1), [reply], "{request:?}");
    }
    assert_eq!(
        numbers(&mut mc, &["limit_maxbytes"]),
        [8 * MIB],
        "unchanged"
    );
    assert_eq!(
        resp.ask(
            "CONFIG SET maxmemory-policy ALLKEYS-LRU maxmemory 32mb\r\n",
            1
        ),
        ["+OK"]
    );
    assert_eq!(numbers(&mut mc, &["limit_maxbytes"]), [32 * MIB]);
}

/// `--set evictions=false` (memcached `-M`, `t/dash-M.t`; Redis `noeviction`): once DRAM
/// is full a `set` is refused with memcached's reply (a RESP `SET` with Redis's) and
/// counted in `store_no_memory`; every value stored before is still there, and `stats
/// settings` says `evictions off`.
#[test]
fn a_full_cache_without_evictions_refuses_sets() {
    let config = Config {
        dram_capacity: 1 << 20,
        evictions: false,
        ..Config::default()
    };
    let server = TestServer::on_engine(config, TestServer::options());
    let mut mc = Client::connect(server.memcached);
    // Incompressible values, so that 1 MiB fills after a few thousand.
    let value = |i: u32| -> String {
        (0..32u32)
            .map(|j| {
                format!(
                    "{:08x}",
                    i.wrapping_mul(2_654_435_761) ^ j.wrapping_mul(40_503)
                )
            })
            .collect()
    };
    let mut stored = 0;
    loop {
        let v = value(stored);
        let reply = mc.ask(&format!("set k{stored} 0 0 {}\r\n{v}\r\n", v.len()), 1);
        if reply[0] != "STORED" {
            assert_eq!(reply, ["SERVER_ERROR out of memory storing object"]);
            break;
        }
        stored += 1;
        assert!(stored < 100_000, "a 1 MiB cache never filled");
    }
    assert!(stored > 500, "{stored} stored");
    assert_eq!(numbers(&mut mc, &["store_no_memory", "evictions"]), [1, 0]);
    for i in 0..stored {
        let v = value(i);
        let reply = mc.ask(&format!("get k{i}\r\n"), 3);
        assert_eq!(
            reply,
            [format!("VALUE k{i} 0 {}", v.len()), v, "END".to_string()]
        );
    }
    assert_eq!(mc.stats(" settings")["evictions"], "off");
    // RESP clients get Redis's `noeviction` refusal (once merges have used up whatever
    // room they freed since), and `store_no_memory` counts it.
    let mut resp = Client::connect(server.resp);
    let refused = (stored..stored + 10_000)
        .map(|i| {
            let (key, v) = (format!("r{i}"), value(i));
            let set = format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{v}\r\n",
                key.len(),
                v.len()
            );
            resp.ask(&set, 1).remove(0)
        })
        .find(|reply| reply != "+OK");
    assert_eq!(
        refused.as_deref(),
        Some("-OOM command not allowed when used memory > 'maxmemory'.")
    );
    assert_eq!(numbers(&mut mc, &["store_no_memory"]), [2]);
}
