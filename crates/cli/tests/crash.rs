//! `zipcache serve` killed with SIGKILL, as the OOM killer, a stop timeout or a host agent
//! does it, and started again on the same files: the flash tier is served again (the
//! crash journal), and no key is ever served with a value that was overwritten, deleted
//! or flushed before the kill.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{Conn, KEYS, Server, fill, served, small_dram_args, test_dir};

/// The key range the write-heavy load overwrites and deletes while the kill comes.
const HOT_KEYS: u64 = 50_000;
/// Share of the untouched keys a crash restart must serve.
const SERVED_AFTER_CRASH: f64 = 0.95;

fn args(dir: &std::path::Path) -> Vec<String> {
    let journal = dir.join("journal");
    std::fs::create_dir_all(&journal).expect("journal dir");
    let mut args = small_dram_args();
    args.extend([
        "--set".to_string(),
        format!("crash_journal={}", journal.display()),
    ]);
    args
}

/// Version `version` of hot key `key`: 40 B to about 600 B of hex (2:1 compressible),
/// so its versions land in different size classes and the load turns DRAM over.
fn hot_value(key: u64, version: u64) -> String {
    let words = ((key * 31 + version * 17) % 36) as usize;
    let mut x = (key << 32 | version).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let pad: String = (0..words)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect();
    format!("hot-{key}-{version}-{pad}")
}

/// One hot key's writes as the client knows them: the last acknowledged state (a
/// version, or deleted) and the writes sent whose reply never came.
#[derive(Default, Clone)]
struct HotKey {
    acked: Option<Option<u64>>,
    unacked: Vec<Option<u64>>,
}

/// The write-heavy load: pipelined batches of sets and deletes over the hot keys until
/// the server dies under it (or `stop` is set); returns what it knows of every hot key.
fn write_load(addr: SocketAddr, stop: Arc<AtomicBool>, seed: u64) -> Vec<HotKey> {
    let mut keys = vec![HotKey::default(); HOT_KEYS as usize];
    let mut conn = Conn::open(addr);
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut version = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut batch = String::new();
        let mut ops = Vec::new();
        for _ in 0..200 {
            let key = next() % HOT_KEYS;
            version += 1;
            if next() % 8 == 0 {
                batch.push_str(&format!("delete hot:{key}\r\n"));
                ops.push((key, None));
            } else {
                let v = hot_value(key, version);
                batch.push_str(&format!("set hot:{key} 0 0 {}\r\n{v}\r\n", v.len()));
                ops.push((key, Some(version)));
            }
        }
        for &(key, op) in &ops {
            keys[key as usize].unacked.push(op);
        }
        if conn.try_send(batch.as_bytes()).is_err() {
            return keys;
        }
        for &(key, op) in &ops {
            let Ok(reply) = conn.try_reply() else {
                return keys;
            };
            let expected = if op.is_some() { "STORED" } else { "DELETED" };
            assert!(
                reply == expected || (op.is_none() && reply == "NOT_FOUND"),
                "hot:{key}: {reply}"
            );
            let key = &mut keys[key as usize];
            key.acked = Some(op);
            key.unacked.remove(0);
        }
    }
    keys
}

/// Every hot key the restarted server serves holds its last acknowledged version or one
/// whose reply never came; a key deleted (and not rewritten since) is a miss. Returns
/// how many hot keys were served.
fn check_hot(conn: &mut Conn, keys: &[HotKey]) -> usize {
    let mut served = 0;
    for chunk in (0..HOT_KEYS).collect::<Vec<_>>().chunks(1000) {
        let request: String = chunk.iter().map(|k| format!("mg hot:{k} v\r\n")).collect();
        conn.send(request.as_bytes());
        for &k in chunk {
            let header = conn.reply();
            if header == "EN" {
                continue;
            }
            let got = conn.reply();
            let known = &keys[k as usize];
            let last_acked = known.acked.flatten().map(|v| hot_value(k, v));
            let in_flight = known.unacked.iter().flatten().map(|&v| hot_value(k, v));
            assert!(
                Some(&got) == last_acked.as_ref() || in_flight.into_iter().any(|v| v == got),
                "hot:{k} served a value overwritten or deleted before the kill: {header} {got:.40}…"
            );
            served += 1;
        }
    }
    served
}

/// Dirty DRAM objects a stats reply counts: what DRAM holds newer than flash (or not on
/// flash at all), which a kill loses.
fn dirty(stats: &HashMap<String, String>) -> u64 {
    let count = |name: &str| stats[name].parse::<u64>().unwrap();
    count("dram_objects").saturating_sub(count("dram_clean_objects"))
}

/// How long until the load has written most of the fill down (dirty DRAM objects below a
/// quarter of the untouched keys) and the shadow table is whole: before, a kill loses
/// the fill's keys still in DRAM only (a miss, not the flash tier), or restarts cold.
fn written_down(watcher: &mut Conn) -> Duration {
    let loading = Instant::now();
    loop {
        let stats = watcher.stats();
        if stats["crash_journal_incomplete"] == "0" && dirty(&stats) < KEYS as u64 / 4 {
            return loading.elapsed();
        }
        assert!(
            loading.elapsed() < Duration::from_secs(60),
            "the fill was never written down, or the shadow table never healed: {stats:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// The scenario through the server: 200,000 keys filled and verified, a
/// write-heavy load on other keys (overwrites and deletes of keys whose older versions
/// are on flash), `kill -9` by PID mid-load, a restart on the same files. The restart
/// serves at least 95 % of the untouched keys (all of them with their values) and never
/// an overwritten or deleted hot key. `ZIPCACHE_SERVER_CRASH_ROUNDS` kills again and
/// again on the same files (default 2).
#[test]
fn kill_9_under_writes_keeps_the_flash_tier_and_serves_nothing_stale() {
    let rounds: usize = std::env::var("ZIPCACHE_SERVER_CRASH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let dir = test_dir("crash", "kill9");
    let args = args(&dir);
    let mut server = Server::spawn(dir.clone(), args.clone());
    let mut conn = Conn::open(server.memcached);
    fill(&mut conn);
    assert_eq!(
        served(&mut conn),
        KEYS,
        "the fill is served before the kill"
    );
    // Untouched keys served before this round's kill: a key a kill lost (dirty in DRAM
    // only, an allowed miss) is not on flash at the next one.
    let mut present = KEYS as u64;
    let mut hot: Vec<HotKey> = vec![HotKey::default(); HOT_KEYS as usize];
    let mut killed_servers = Vec::new();
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (addr, stop) = (server.memcached, stop.clone());
            thread::spawn(move || write_load(addr, stop, round as u64 * 7919 + 11))
        };
        let mut watcher = Conn::open(server.memcached);
        let written_after = written_down(&mut watcher);
        // Then long enough for the load to evict hot keys' versions to flash again.
        thread::sleep(Duration::from_millis(300 + 900 * round as u64));
        let before = watcher.stats();
        let killed = server.kill();
        let load = writer.join().expect("writer");
        assert!(!killed.success(), "SIGKILL ends the server: {killed}");
        // This round's writes replace what the last round knew of the keys they touched.
        for (known, now) in hot.iter_mut().zip(load) {
            if now.acked.is_some() || !now.unacked.is_empty() {
                let mut merged = now.clone();
                if merged.acked.is_none() {
                    // Only unacknowledged writes this round: the older state may stand.
                    merged.acked = known.acked;
                    merged.unacked.extend(known.unacked.iter().copied());
                }
                *known = merged;
            }
        }
        drop(conn);

        let started = Instant::now();
        // The killed server's value removes the directory when dropped: it waits.
        killed_servers.push(std::mem::replace(
            &mut server,
            Server::spawn(dir.clone(), args.clone()),
        ));
        let to_serving = started.elapsed();
        conn = Conn::open(server.memcached);
        let stats = conn.stats();
        assert_eq!(
            stats.get("recovery_kind").map(String::as_str),
            Some("crash"),
            "{}",
            server.log()
        );
        let kept = served(&mut conn);
        // Untouched keys only leave DRAM for flash after the stats are read: at least this
        // many were on flash at the kill.
        let on_dram_only = dirty(&before);
        let on_flash = present.saturating_sub(on_dram_only);
        let hot_served = check_hot(&mut conn, &hot);
        eprintln!(
            "round {round}: fill written down {written_after:?} into the load; at the kill \
             {} keys marked, {} DRAM objects ({on_dram_only} dirty), {} SSD objects; restart serves \
             {kept}/{KEYS} untouched keys ({:.2} %), {hot_served}/{HOT_KEYS} hot keys; \
             listening {to_serving:?} after start; recovery {} objects, {} keys hidden as \
             possibly stale, {} ms",
            before["crash_journal_keys"],
            before["dram_objects"],
            before["ssd_objects"],
            100.0 * kept as f64 / KEYS as f64,
            stats["recovery_objects"],
            stats["recovery_shadowed_keys"],
            stats["recovery_ms"],
        );
        assert!(
            kept as f64 >= SERVED_AFTER_CRASH * on_flash as f64,
            "round {round}: only {kept} of the {on_flash} untouched keys on flash at the \
             kill served after it: {}",
            server.log()
        );
        present = kept as u64;
    }
    assert!(server.stop().success(), "{}", server.log());
}

/// `flush_all <delay>` is acknowledged, then the server is killed before it fires: the
/// promise stands (everything stored before it is gone once the delay passes), so the
/// restart serves none of the keys stored before it.
#[test]
fn a_delayed_flush_cut_short_by_a_kill_still_empties_the_cache() {
    let dir = test_dir("crash", "delayed-flush");
    let args = args(&dir);
    let mut server = Server::spawn(dir.clone(), args.clone());
    let mut conn = Conn::open(server.memcached);
    fill(&mut conn);
    // Until the load writes the fill down, a crash would be cold anyway.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (addr, stop) = (server.memcached, stop.clone());
        thread::spawn(move || write_load(addr, stop, 3))
    };
    written_down(&mut conn);
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    conn.send(b"flush_all 2\r\n");
    assert_eq!(conn.reply(), "OK");
    let promised = Instant::now() + Duration::from_secs(2);
    server.kill();
    drop(conn);

    let mut server = Server::spawn(dir.clone(), args);
    let mut conn = Conn::open(server.memcached);
    thread::sleep(promised.saturating_duration_since(Instant::now()));
    assert_eq!(served(&mut conn), 0, "{}", server.log());
    assert!(server.stop().success(), "{}", server.log());
}
