//! `--cluster-mode on`: three nodes on 127.0.0.1 whose topology is pushed from outside —
//! by the command sequence kvrocks-controller sends (read from its source,
//! `docs/notes/kvrocks-controller.md`), replayed here since the controller cannot be
//! built on this machine — and the cluster clients that use it: redis-py's
//! `RedisCluster` and `redis-cli -c`. Slots that move, under load and away and back,
//! never make a node serve a value another node overwrote.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{TestServer, py_script, require_python_modules, require_tool, run_tool};
use zipcache::ZipCache;
use zipcache_server::{ClusterMode, ServerOptions, key_slot};

/// A RESP reply, as far as these tests read them.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

impl Reply {
    fn text(&self) -> String {
        match self {
            Reply::Simple(s) | Reply::Error(s) => s.clone(),
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        }
    }
}

struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Conn(BufReader::new(stream))
    }

    fn call(&mut self, args: &[&[u8]]) -> Reply {
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            request.extend(format!("${}\r\n", arg.len()).into_bytes());
            request.extend_from_slice(arg);
            request.extend(b"\r\n");
        }
        self.0.get_mut().write_all(&request).unwrap();
        self.read()
    }

    fn read(&mut self) -> Reply {
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        let (kind, rest) = line.trim_end().split_at(1);
        match kind {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Integer(rest.parse().unwrap()),
            "$" | "=" => {
                let len: i64 = rest.parse().unwrap();
                if len < 0 {
                    return Reply::Bulk(None);
                }
                let mut data = vec![0; len as usize + 2];
                self.0.read_exact(&mut data).unwrap();
                data.truncate(len as usize);
                Reply::Bulk(Some(data))
            }
            "*" => {
                let n: i64 = rest.parse().unwrap();
                Reply::Array((0..n.max(0)).map(|_| self.read()).collect())
            }
            _ => panic!("unexpected reply line {line:?}"),
        }
    }
}

/// A node id as kvrocks-controller makes them: 40 letters and digits.
fn controller_id(node: usize) -> String {
    format!("{:Z<40}", format!("kvrocksCtl{node}node"))
}

struct Fleet {
    nodes: Vec<TestServer>,
    engines: Vec<Arc<ZipCache>>,
    dirs: Vec<PathBuf>,
    ids: Vec<String>,
}

impl Fleet {
    fn start(n: usize, name: &str) -> Fleet {
        Fleet::with(n, name, |_| TestServer::options())
    }

    /// `n` nodes, node `i` started with `options(i)` (and `--cluster-mode on`, its own
    /// data directory).
    fn with(n: usize, name: &str, options: impl Fn(usize) -> ServerOptions) -> Fleet {
        let dirs: Vec<PathBuf> = (0..n)
            .map(|i| {
                let dir = std::env::temp_dir()
                    .join(format!("zipcache-fleet-{name}-{}-{i}", std::process::id()));
                let _ = std::fs::remove_dir_all(&dir);
                dir
            })
            .collect();
        let engines: Vec<Arc<ZipCache>> = (0..n)
            .map(|_| {
                Arc::new(
                    ZipCache::open(zipcache::Config {
                        dram_capacity: 64 << 20,
                        ..zipcache::Config::default()
                    })
                    .unwrap(),
                )
            })
            .collect();
        let nodes = (0..n)
            .map(|i| Fleet::node(&engines[i], &dirs[i], options(i)))
            .collect();
        Fleet {
            nodes,
            engines,
            dirs,
            ids: (0..n).map(controller_id).collect(),
        }
    }

    fn node(engine: &Arc<ZipCache>, dir: &std::path::Path, options: ServerOptions) -> TestServer {
        TestServer::on_with(
            engine.clone(),
            ServerOptions {
                cluster_mode: ClusterMode::On,
                data_dir: Some(dir.to_path_buf()),
                ..options
            },
        )
    }

    /// Stops node `i` and starts it again on its engine, data directory and ports: a
    /// warm restart (the engine's objects stay, as a restart on the SSD tier keeps them).
    fn restart(&mut self, i: usize) {
        let old = self.nodes.remove(i);
        let (memcached, resp) = (old.memcached.port(), old.resp.port());
        old.stop();
        let options = ServerOptions {
            memcached_port: Some(memcached),
            resp_port: Some(resp),
            ..TestServer::options()
        };
        let node = Fleet::node(&self.engines[i], &self.dirs[i], options);
        self.nodes.insert(i, node);
    }

    fn addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].resp
    }

    /// SETNODES lines: node `i` owns `ranges[i]`.
    fn lines(&self, ranges: &[Vec<(u16, u16)>]) -> String {
        let ports: Vec<u16> = (0..self.nodes.len()).map(|i| self.addr(i).port()).collect();
        setnodes_lines(&ports, ranges)
    }

    /// What kvrocks-controller sends each node when it pushes a topology version
    /// (`syncClusterInfoToAllNodes`: SETNODEID, then SETNODES), to the nodes `to`.
    fn push(&self, ranges: &[Vec<(u16, u16)>], version: i64, to: &[usize]) {
        let lines = self.lines(ranges);
        for &i in to {
            let mut conn = Conn::open(self.addr(i));
            let id = conn.call(&[b"CLUSTERX", b"setnodeid", self.ids[i].as_bytes()]);
            assert_eq!(id, Reply::Simple("OK".into()), "node {i}");
            let set = conn.call(&[
                b"CLUSTERX",
                b"setnodes",
                lines.as_bytes(),
                version.to_string().as_bytes(),
            ]);
            assert_eq!(set, Reply::Simple("OK".into()), "node {i}");
        }
    }

    fn stop(self) {
        for node in self.nodes {
            node.stop();
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// SETNODES lines of nodes on 127.0.0.1 at `ports`, node `i` owning `ranges[i]`.
fn setnodes_lines(ports: &[u16], ranges: &[Vec<(u16, u16)>]) -> String {
    let mut text = String::new();
    for (i, owned) in ranges.iter().enumerate() {
        text.push_str(&format!(
            "{} 127.0.0.1 {} master -",
            controller_id(i),
            ports[i]
        ));
        for &(first, last) in owned {
            if first == last {
                text.push_str(&format!(" {first}"));
            } else {
                text.push_str(&format!(" {first}-{last}"));
            }
        }
        text.push('\n');
    }
    text
}

/// The slots split as kvrocks-controller splits them: 16384 / n each, the last to 16383.
fn even_split(n: usize) -> Vec<Vec<(u16, u16)>> {
    let size = 16384 / n as u16;
    (0..n as u16)
        .map(|i| {
            let last = if i as usize == n - 1 {
                16383
            } else {
                (i + 1) * size - 1
            };
            vec![(i * size, last)]
        })
        .collect()
}

/// The controller's create sequence, reply by reply, then the cluster clients: every
/// key set and read through redis-py's `RedisCluster` and `redis-cli -c`, and the keys
/// spread within ±5 % of a third per node.
#[test]
fn a_fleet_pushed_as_the_controller_pushes_it_serves_cluster_clients() {
    let fleet = Fleet::start(3, "clients");
    for i in 0..3 {
        let mut conn = Conn::open(fleet.addr(i));
        // The controller's probe: a node not yet in a cluster says so in these words.
        assert_eq!(
            conn.call(&[b"cluster", b"info"]),
            Reply::Error("ERR CLUSTERDOWN The cluster is not initialized".into())
        );
        assert_eq!(
            conn.call(&[b"CLUSTERX", b"VERSION"]),
            Reply::Bulk(Some(b"-1".to_vec()))
        );
        assert_eq!(
            conn.call(&[b"GET", b"k"]),
            Reply::Error("CLUSTERDOWN Hash slot not served".into())
        );
    }
    fleet.push(&even_split(3), 1, &[0, 1, 2]);
    for i in 0..3 {
        let mut conn = Conn::open(fleet.addr(i));
        let info = conn.call(&[b"cluster", b"info"]).text();
        for line in [
            "cluster_state:ok\r\n",
            "cluster_current_epoch:1\r\n",
            "cluster_my_epoch:1\r\n",
            "cluster_known_nodes:3\r\n",
            "cluster_size:3\r\n",
        ] {
            assert!(info.contains(line), "{line:?} in {info}");
        }
        assert!(!info.contains("migrating_slot"), "{info}");
        let nodes = conn.call(&[b"cluster", b"nodes"]).text();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            assert_eq!(fields[6], "1", "the config epoch is the version: {line}");
            assert_eq!(
                fields[2].starts_with("myself"),
                fields[0] == fleet.ids[i],
                "{line}"
            );
        }
        assert_eq!(
            conn.call(&[b"CLUSTERX", b"MYID"]),
            Reply::Bulk(Some(fleet.ids[i].clone().into_bytes()))
        );
        let info = conn.call(&[b"INFO"]).text();
        assert!(info.contains("\r\nrole:master\r\n"), "{info}");
        // The same version again changes nothing; an older one is refused.
        let lines = fleet.lines(&even_split(3));
        assert_eq!(
            conn.call(&[b"CLUSTERX", b"SETNODES", lines.as_bytes(), b"1"]),
            Reply::Simple("OK".into())
        );
        assert_eq!(
            conn.call(&[b"CLUSTERX", b"SETNODES", lines.as_bytes(), b"0"]),
            Reply::Error("ERR Invalid cluster version".into())
        );
    }

    require_python_modules(&[("redis", "redis")]);
    let ports: Vec<String> = (0..3).map(|i| fleet.addr(i).port().to_string()).collect();
    let run = run_tool(
        Command::new("python3")
            .arg(py_script("cluster_fleet.py"))
            .args(&ports)
            .arg("30000"),
        Duration::from_secs(300),
    );
    assert!(run.ok, "cluster_fleet.py failed:\n{run}");
    let sizes: Vec<i64> = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("dbsize "))
        .expect("a dbsize line")
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(sizes.iter().sum::<i64>(), 30_000, "{sizes:?}");
    for size in &sizes {
        assert!(
            (9_500..=10_500).contains(size),
            "±5 % of a third: {sizes:?}"
        );
    }

    let tool = require_tool("redis-cli", "redis-tools");
    let cli = |args: &[&str]| {
        let run = run_tool(
            Command::new(&tool)
                .args(["-c", "-h", "127.0.0.1", "-p", &ports[0]])
                .args(args),
            Duration::from_secs(30),
        );
        assert!(run.ok, "redis-cli {args:?}: {run}");
        run.stdout
    };
    for i in 0..30 {
        assert_eq!(
            cli(&["set", &format!("cli{i}"), &format!("v{i}")]).trim(),
            "OK"
        );
    }
    for i in 0..30 {
        assert_eq!(cli(&["get", &format!("cli{i}")]).trim(), format!("v{i}"));
    }
    let check = cli(&["--cluster", "check", &format!("127.0.0.1:{}", ports[0])]);
    assert!(check.contains("All 16384 slots covered"), "{check}");

    // redis-benchmark reads the fleet from one node and spreads its load over all three.
    let benchmark = require_tool("redis-benchmark", "redis-tools");
    let run = run_tool(
        Command::new(benchmark)
            .args(["--cluster", "-h", "127.0.0.1", "-p", &ports[1]])
            .args([
                "-t", "set,get", "-n", "20000", "-P", "8", "-r", "5000", "-q",
            ]),
        Duration::from_secs(120),
    );
    let results = run.stdout.replace('\r', "\n");
    assert!(run.ok, "redis-benchmark --cluster: {run}");
    for op in ["SET:", "GET:"] {
        assert!(
            results
                .lines()
                .any(|l| l.starts_with(op) && l.contains("requests per second")),
            "{op} {results}"
        );
    }
    assert!(results.contains("Cluster has 3 master nodes"), "{results}");

    // memcached's auto-discovery lists the fleet at the topology's version.
    let mut memcached = common::Client::connect(fleet.nodes[0].memcached);
    let reply = memcached.ask("config get cluster\r\n", 5);
    let shift = i32::from(fleet.nodes[0].memcached.port()) - i32::from(fleet.addr(0).port());
    let listed: Vec<String> = (0..3)
        .map(|i| {
            let port = i32::from(fleet.addr(i).port()) + shift;
            format!("127.0.0.1|127.0.0.1|{port}")
        })
        .collect();
    assert_eq!(reply[1], "1", "{reply:?}");
    assert_eq!(reply[2], listed.join(" "), "{reply:?}");
    assert_eq!(reply[4], "END", "{reply:?}");

    // The controller moves slot 0 as it does (`migrate/migrator.go`): CLUSTERX MIGRATE
    // to the source, CLUSTER INFO polled for the slot and `success`, then the next
    // version pushed to every node.
    let mut source = Conn::open(fleet.addr(0));
    let target = fleet.ids[1].as_bytes();
    assert_eq!(
        source.call(&[b"CLUSTERX", b"migrate", b"0", target]),
        Reply::Simple("OK".into())
    );
    let info = source.call(&[b"cluster", b"info"]).text();
    let field = |name: &str| {
        info.split("\r\n")
            .find_map(|line| line.split_once(':').filter(|(k, _)| k.trim() == name))
            .map(|(_, v)| v.trim().to_string())
    };
    assert_eq!(field("migrating_slot").as_deref(), Some("0"), "{info}");
    assert_eq!(
        field("migrating_state").as_deref(),
        Some("success"),
        "{info}"
    );
    assert_eq!(
        field("destination_node").as_deref(),
        Some(fleet.ids[1].as_str())
    );
    let in_slot_0 = (0..)
        .map(|i| format!("slot0-{i}").into_bytes())
        .find(|key| key_slot(key) == 0)
        .unwrap();
    let in_slot_0 = in_slot_0.as_slice();
    let moved = format!("MOVED 0 127.0.0.1:{}", fleet.addr(1).port());
    assert_eq!(source.call(&[b"GET", in_slot_0]), Reply::Error(moved));
    let mut moved = even_split(3);
    moved[0] = vec![(1, 5460)];
    moved[1].insert(0, (0, 0));
    fleet.push(&moved, 2, &[0, 1, 2]);
    let info = source.call(&[b"cluster", b"info"]).text();
    assert!(!info.contains("migrating"), "a new version ends it: {info}");
    let mut target = Conn::open(fleet.addr(1));
    assert_eq!(
        target.call(&[b"SET", in_slot_0, b"v"]),
        Reply::Simple("OK".into())
    );
    fleet.stop();
}

/// DEPLOY.md's fleet from a file: three nodes read one `--cluster-config`; a new version
/// of it moves a slot when reloaded (SIGHUP's `reload_files`); an older one is refused.
#[test]
fn a_fleet_from_a_file_reloads_it() {
    let options: Vec<ServerOptions> = (0..3).map(|_| TestServer::options()).collect();
    let ports: Vec<u16> = options.iter().map(|o| o.resp_port.unwrap()).collect();
    let dir = std::env::temp_dir().join(format!("zipcache-fleet-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fleet.conf");
    let write = |version: i64, ranges: &[Vec<(u16, u16)>]| {
        let text = format!(
            "# the fleet\nversion {version}\n{}",
            setnodes_lines(&ports, ranges)
        );
        std::fs::write(&file, text).unwrap();
    };
    write(1, &even_split(3));
    let fleet = Fleet::with(3, "file", |i| ServerOptions {
        cluster_config: Some(file.clone()),
        ..options[i].clone()
    });
    let key = b"from-a-file";
    let owner = usize::from(key_slot(key) / 5461).min(2);
    let mut router = Router::new(&fleet);
    assert_eq!(
        router.call(key, &[b"SET", key, b"v1"]),
        Reply::Simple("OK".into())
    );
    assert_eq!(router.owner[usize::from(key_slot(key))], owner);

    let next = (owner + 1) % 3;
    let mut moved = even_split(3);
    let slot = key_slot(key);
    let (first, last) = moved[owner][0];
    moved[owner] = [(first, slot.wrapping_sub(1)), (slot + 1, last)]
        .into_iter()
        .filter(|&(a, b)| a <= b && b != u16::MAX)
        .collect();
    moved[next].push((slot, slot));
    write(2, &moved);
    for node in &fleet.nodes {
        let said = node.handle().reload_files();
        assert!(said.iter().any(|l| l.contains("version 2")), "{said:?}");
    }
    let moved_to = format!("MOVED {slot} 127.0.0.1:{}", ports[next]);
    assert_eq!(
        Conn::open(fleet.addr(owner)).call(&[b"GET", key]),
        Reply::Error(moved_to)
    );
    assert_eq!(
        router.call(key, &[b"GET", key]),
        Reply::Bulk(None),
        "cold on its new node"
    );

    write(1, &even_split(3));
    let said = fleet.nodes[0].handle().reload_files();
    assert!(
        said.iter().any(|l| l.contains("Invalid cluster version")),
        "{said:?}"
    );
    let mut conn = Conn::open(fleet.addr(0));
    assert_eq!(
        conn.call(&[b"CLUSTERX", b"VERSION"]),
        Reply::Bulk(Some(b"2".to_vec()))
    );
    fleet.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// ioredis's `Cluster` (npm) sets and reads every key through a pushed fleet.
#[test]
fn ioredis_cluster_client_uses_the_fleet() {
    let node_path = common::node_modules("ioredis");
    let fleet = Fleet::start(3, "ioredis");
    fleet.push(&even_split(3), 1, &[0, 1, 2]);
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/ioredis_cluster.js");
    let run = run_tool(
        Command::new("node")
            .env("NODE_PATH", node_path)
            .arg(script)
            .args((0..3).map(|i| fleet.addr(i).port().to_string())),
        Duration::from_secs(120),
    );
    assert!(
        run.ok && run.stdout.contains("ok"),
        "ioredis_cluster.js failed:\n{run}"
    );
    fleet.stop();
}

/// A slot moves from node 0 to node 1 and back while a client writes the key on node
/// 1: node 0 must not serve what it held before — nor after a warm restart in between,
/// nor when it missed the version that moved the slot away. Its left-overs are swept.
#[test]
fn a_slot_that_moves_away_and_back_never_serves_its_old_value() {
    let mut fleet = Fleet::start(2, "a-b-a");
    let (k, gap) = (b"{a-b-a}key", b"{gap}key");
    let (slot, gap_slot) = (key_slot(k), key_slot(gap));
    assert_ne!(slot, gap_slot);
    let all = vec![(0, 16383)];
    fleet.push(&[all.clone(), vec![]], 1, &[0, 1]);
    let mut a = Conn::open(fleet.addr(0));
    for key in [&k[..], gap] {
        assert_eq!(a.call(&[b"SET", key, b"old"]), Reply::Simple("OK".into()));
    }
    drop(a);

    // A restart keeps the node's id, its slots and its data.
    fleet.restart(0);
    let mut a = Conn::open(fleet.addr(0));
    assert_eq!(a.call(&[b"GET", k]), Reply::Bulk(Some(b"old".to_vec())));
    assert_eq!(
        a.call(&[b"CLUSTER", b"MYID"]),
        Reply::Bulk(Some(fleet.ids[0].clone().into_bytes()))
    );

    // Away: node 0 redirects at once; node 1 takes the writes.
    let away = |slot: u16| vec![vec![(0, slot - 1), (slot + 1, 16383)], vec![(slot, slot)]];
    fleet.push(&away(slot), 2, &[0, 1]);
    assert_eq!(
        a.call(&[b"GET", k]),
        Reply::Error(format!("MOVED {slot} 127.0.0.1:{}", fleet.addr(1).port()))
    );
    let mut b = Conn::open(fleet.addr(1));
    assert_eq!(
        b.call(&[b"GET", k]),
        Reply::Bulk(None),
        "the new owner starts cold"
    );
    assert_eq!(b.call(&[b"SET", k, b"new"]), Reply::Simple("OK".into()));
    // Node 0 is restarted while away, then gets the slot back.
    drop(a);
    fleet.restart(0);
    fleet.push(&[all.clone(), vec![]], 3, &[0, 1]);
    let mut a = Conn::open(fleet.addr(0));
    assert_eq!(
        a.call(&[b"GET", k]),
        Reply::Bulk(None),
        "never the old value"
    );
    assert_eq!(
        b.call(&[b"GET", k]),
        Reply::Error(format!("MOVED {slot} 127.0.0.1:{}", fleet.addr(0).port()))
    );

    // The other slot moves away (version 4, which node 0 never gets) and back
    // (version 5): with versions skipped, node 0 cannot know, and serves nothing old.
    fleet.push(&away(gap_slot), 4, &[1]);
    let mut b = Conn::open(fleet.addr(1));
    assert_eq!(b.call(&[b"SET", gap, b"new"]), Reply::Simple("OK".into()));
    fleet.push(&[all, vec![]], 5, &[0, 1]);
    assert_eq!(
        a.call(&[b"GET", gap]),
        Reply::Bulk(None),
        "never the old value"
    );

    // The sweep drops what the moves left behind on node 0.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = a.call(&[b"INFO", b"cluster"]).text();
        if info.contains("cluster_slot_sweep_running:0") && !info.contains("keys_dropped:0\r") {
            break;
        }
        assert!(Instant::now() < deadline, "{info}");
        std::thread::sleep(Duration::from_millis(50));
    }
    fleet.stop();
}

/// A node restarted on its SSD tier — the engine closed and opened again on the same
/// files — keeps its id, its slots and the values its flash holds; the same node with
/// its topology file lost starts empty (its generations cannot be trusted) and
/// unconfigured.
#[test]
fn a_restarted_node_keeps_its_id_slots_and_flash_data() {
    let dir = std::env::temp_dir().join(format!("zipcache-fleet-flash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = zipcache::Config {
        dram_capacity: 4 << 20,
        ssd: Some(zipcache::SsdConfig {
            path: dir.join("ssd.bin"),
            size: 64 << 20,
            direct_io: false,
            device_compression: zipcache::config::DeviceCompression::Emulate,
            logical_to_physical: 4.0,
        }),
        ..zipcache::Config::default()
    };
    let options = ServerOptions {
        cluster_mode: ClusterMode::On,
        data_dir: Some(dir.join("node")),
        ..TestServer::options()
    };
    let start = || {
        let engine = Arc::new(ZipCache::open(config.clone()).unwrap());
        (TestServer::on_with(engine.clone(), options.clone()), engine)
    };
    let stop = |server: TestServer, engine: Arc<ZipCache>| {
        server.stop();
        Arc::try_unwrap(engine)
            .ok()
            .expect("the server let go")
            .close()
            .unwrap();
    };
    let (server, engine) = start();
    let mut conn = Conn::open(server.resp);
    let lines = setnodes_lines(&[server.resp.port()], &[vec![(0, 16383)]]);
    assert_eq!(
        conn.call(&[b"CLUSTERX", b"SETNODES", lines.as_bytes(), b"7"]),
        Reply::Simple("OK".into())
    );
    let value = vec![b'v'; 2000];
    for i in 0..3_000 {
        let key = format!("k{i}");
        assert_eq!(
            conn.call(&[b"SET", key.as_bytes(), &value]),
            Reply::Simple("OK".into())
        );
    }
    drop(conn);
    stop(server, engine);

    let (server, engine) = start();
    assert!(engine.warm_started());
    let mut conn = Conn::open(server.resp);
    assert_eq!(
        conn.call(&[b"CLUSTERX", b"VERSION"]),
        Reply::Bulk(Some(b"7".to_vec()))
    );
    assert_eq!(
        conn.call(&[b"CLUSTER", b"MYID"]),
        Reply::Bulk(Some(controller_id(0).into_bytes()))
    );
    let served = (0..3_000)
        .filter(|i| {
            conn.call(&[b"GET", format!("k{i}").as_bytes()]) == Reply::Bulk(Some(value.clone()))
        })
        .count();
    assert!(served > 2_900, "{served} of 3000 served after the restart");
    drop(conn);
    stop(server, engine);

    std::fs::remove_file(dir.join("node").join("cluster-topology")).unwrap();
    let (server, engine) = start();
    let mut conn = Conn::open(server.resp);
    assert_eq!(
        conn.call(&[b"CLUSTERX", b"VERSION"]),
        Reply::Bulk(Some(b"-1".to_vec()))
    );
    conn.call(&[b"CLUSTERX", b"SETNODES", lines.as_bytes(), b"8"]);
    assert_eq!(
        conn.call(&[b"GET", b"k1"]),
        Reply::Bulk(None),
        "forgotten, not served"
    );
    drop(conn);
    stop(server, engine);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A cluster client of this test: the slot map read from CLUSTER SLOTS, a `-MOVED`
/// followed (and learnt), `-CLUSTERDOWN` retried.
struct Router {
    conns: Vec<Conn>,
    ports: Vec<u16>,
    owner: Vec<usize>,
}

impl Router {
    fn new(fleet: &Fleet) -> Router {
        let n = fleet.nodes.len();
        Router {
            conns: (0..n).map(|i| Conn::open(fleet.addr(i))).collect(),
            ports: (0..n).map(|i| fleet.addr(i).port()).collect(),
            owner: vec![0; 16384],
        }
    }

    fn call(&mut self, key: &[u8], args: &[&[u8]]) -> Reply {
        let slot = usize::from(key_slot(key));
        // Nodes get a new version one after another: until the last has it, two may
        // send each other's clients back and forth, as in any pushed topology.
        for attempt in 0..5_000 {
            match self.conns[self.owner[slot]].call(args) {
                Reply::Error(e) if e.starts_with("MOVED ") => {
                    let port: u16 = e.rsplit(':').next().unwrap().parse().unwrap();
                    self.owner[slot] = self.ports.iter().position(|&p| p == port).unwrap();
                    if attempt > 3 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                Reply::Error(e) if e.starts_with("CLUSTERDOWN") => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                reply => return reply,
            }
        }
        panic!("no node served {}", String::from_utf8_lossy(key));
    }
}

/// Slots move between three nodes, a new topology version every 20 ms, while writers
/// set increasing versions of their keys and read each back: a read may miss (a slot's
/// new owner starts cold) but never returns a version older than the last one written.
#[test]
fn resharding_under_load_serves_no_wrong_value() {
    let fleet = Fleet::start(3, "reshard");
    fleet.push(&even_split(3), 1, &[0, 1, 2]);
    let fleet = Arc::new(fleet);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (fleet, stop) = (fleet.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut router = Router::new(&fleet);
                let keys: Vec<Vec<u8>> = (0..200)
                    .map(|i| format!("w{w}:k{i}").into_bytes())
                    .collect();
                let mut last = vec![0u64; keys.len()];
                let (mut reads, mut misses) = (0u64, 0u64);
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    for (i, key) in keys.iter().enumerate() {
                        let value = round.to_string();
                        let set = router.call(key, &[b"SET", key, value.as_bytes()]);
                        assert_eq!(set, Reply::Simple("OK".into()));
                        last[i] = round;
                        let got = router.call(key, &[b"GET", key]);
                        reads += 1;
                        match got {
                            Reply::Bulk(None) => misses += 1,
                            Reply::Bulk(Some(v)) => {
                                let v: u64 = String::from_utf8(v).unwrap().parse().unwrap();
                                assert_eq!(
                                    v,
                                    last[i],
                                    "{}: a wrong value",
                                    String::from_utf8_lossy(key)
                                );
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                }
                (reads, misses)
            })
        })
        .collect();
    // The controller: slot ranges move round the ring, one version at a time.
    let mut version = 1;
    let started = Instant::now();
    let mut ranges = even_split(3);
    while started.elapsed() < Duration::from_secs(4) {
        version += 1;
        let moving = ranges[version as usize % 3].pop();
        if let Some(range) = moving {
            ranges[(version as usize + 1) % 3].push(range);
        }
        fleet.push(&ranges, version, &[0, 1, 2]);
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let (mut reads, mut misses) = (0, 0);
    for writer in writers {
        let (r, m) = writer.join().expect("no wrong value");
        reads += r;
        misses += m;
    }
    assert!(version > 20, "{version} versions pushed");
    assert!(
        reads > 1_000 && misses < reads,
        "{reads} reads, {misses} misses"
    );
    Arc::try_unwrap(fleet).ok().unwrap().stop();
}

/// `reply` with every node's id, port and bus port, the epochs, the ping and pong
/// times, and the cluster bus's message counts set aside, and the entries of the
/// replies whose order Redis leaves to its node table (CLUSTER SLOTS, SHARDS, NODES)
/// sorted: what is left is the reply's shape and the facts a client reads.
fn canonical(reply: Reply, ports: &[u16]) -> Reply {
    let word = |w: &str| -> String {
        if w.len() == 40 && w.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return "<id>".into();
        }
        for (i, port) in ports.iter().enumerate() {
            let (node, bus) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{port}@"));
            if w == node || w.starts_with(&bus) {
                return format!("<node{i}>");
            }
            if w == port.to_string() {
                return format!("<port{i}>");
            }
        }
        w.to_string()
    };
    match reply {
        Reply::Bulk(Some(text)) => {
            let text = String::from_utf8_lossy(&text).into_owned();
            if text.contains(" connected") {
                // CLUSTER NODES: id addr flags master ping pong epoch link slots…
                let mut lines: Vec<String> = text
                    .lines()
                    .map(|line| {
                        let mut fields: Vec<String> = line.split(' ').map(word).collect();
                        for i in [4, 5, 6] {
                            fields[i] = "<n>".into();
                        }
                        fields.join(" ")
                    })
                    .collect();
                lines.sort();
                return Reply::Bulk(Some(lines.join("\n").into_bytes()));
            }
            // CLUSTER INFO: the bus's message counts (Redis lists one per kind of message
            // it exchanged; a fleet without a bus exchanges none) left out.
            let lines: Vec<String> = text
                .split("\r\n")
                .filter(|line| !line.starts_with("cluster_stats_messages"))
                .map(|line| match line.split_once(':') {
                    Some((name, _)) if name.contains("epoch") => format!("{name}:<n>"),
                    _ => line.to_string(),
                })
                .collect();
            Reply::Bulk(Some(word(&lines.join("\r\n")).into_bytes()))
        }
        Reply::Bulk(None) => Reply::Bulk(None),
        Reply::Error(e) => Reply::Error(e.split(' ').map(word).collect::<Vec<_>>().join(" ")),
        Reply::Integer(n) if ports.contains(&(n as u16)) => {
            let i = ports.iter().position(|&p| p == n as u16).unwrap();
            Reply::Simple(format!("<port{i}>"))
        }
        Reply::Array(items) => {
            let mut items: Vec<Reply> = items.into_iter().map(|r| canonical(r, ports)).collect();
            let sortable = items.len() > 1
                && items
                    .iter()
                    .all(|r| matches!(r, Reply::Array(a) if a.len() >= 3));
            if sortable {
                items.sort_by_key(|r| format!("{r:?}"));
            }
            Reply::Array(items)
        }
        other => other,
    }
}

/// Three real `redis-server --cluster-enabled yes` made a fleet by `redis-cli --cluster
/// create`, and three ZipCache nodes pushed the same slots: the cluster replies a client
/// reads compare equal, ids, ports and epochs aside.
#[test]
fn cluster_replies_match_a_real_redis_cluster_fleet() {
    let redis = require_tool("redis-server", "redis-server");
    let cli = require_tool("redis-cli", "redis-tools");
    let dir = std::env::temp_dir().join(format!("zipcache-real-fleet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let _real: Vec<common::ChildGuard> = ports
        .iter()
        .map(|port| {
            let conf = dir.join(format!("nodes-{port}.conf"));
            let child = Command::new(&redis)
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                ])
                .args(["--appendonly", "no", "--cluster-enabled", "yes"])
                .arg("--cluster-config-file")
                .arg(&conf)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start redis-server");
            common::wait_for_port(*port, Duration::from_secs(10));
            common::ChildGuard(child)
        })
        .collect();
    let mut create = Command::new(&cli);
    create.arg("--cluster").arg("create");
    for port in &ports {
        create.arg(format!("127.0.0.1:{port}"));
    }
    let run = run_tool(
        create.args(["--cluster-replicas", "0", "--cluster-yes"]),
        Duration::from_secs(60),
    );
    assert!(run.ok, "redis-cli --cluster create: {run}");
    let deadline = Instant::now() + Duration::from_secs(30);
    for &port in &ports {
        let mut conn = Conn::open(([127, 0, 0, 1], port).into());
        while !conn
            .call(&[b"CLUSTER", b"INFO"])
            .text()
            .contains("cluster_state:ok")
        {
            assert!(Instant::now() < deadline, "the real fleet never became ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // redis-cli's split of 16384 slots over three masters.
    let split = vec![vec![(0, 5460)], vec![(5461, 10922)], vec![(10923, 16383)]];
    let fleet = Fleet::start(3, "real");
    fleet.push(&split, 1, &[0, 1, 2]);
    let ours: Vec<u16> = (0..3).map(|i| fleet.addr(i).port()).collect();
    // The real fleet's node `i` is the one owning the i-th range, as ours.
    let mut theirs = Vec::new();
    for (first, _) in split.iter().map(|r| r[0]) {
        let probe = (0..)
            .map(|n| format!("probe{n}"))
            .find(|k| key_slot(k.as_bytes()) == first)
            .unwrap();
        let mut conn = Conn::open(([127, 0, 0, 1], ports[0]).into());
        theirs.push(match conn.call(&[b"GET", probe.as_bytes()]) {
            Reply::Error(e) => e.rsplit(':').next().unwrap().parse::<u16>().unwrap(),
            _ => ports[0],
        });
    }
    let key_on_2 = (0..)
        .map(|n| format!("k{n}"))
        .find(|k| key_slot(k.as_bytes()) > 10923)
        .unwrap();
    let requests: Vec<Vec<&[u8]>> = vec![
        vec![b"CLUSTER", b"SLOTS"],
        vec![b"CLUSTER", b"SHARDS"],
        vec![b"CLUSTER", b"NODES"],
        vec![b"CLUSTER", b"INFO"],
        vec![b"CLUSTER", b"MYID"],
        vec![b"CLUSTER", b"KEYSLOT", key_on_2.as_bytes()],
        vec![b"GET", key_on_2.as_bytes()],
        vec![b"SET", key_on_2.as_bytes(), b"v"],
        vec![b"MGET", b"a", b"b"],
        vec![b"DEL", b"{t}a", b"{t}b", b"x"],
        vec![b"READONLY"],
        vec![b"READWRITE"],
        vec![b"ASKING"],
    ];
    for node in 0..2 {
        let mut real = Conn::open(([127, 0, 0, 1], theirs[node]).into());
        let mut zipcache = Conn::open(fleet.addr(node));
        for request in &requests {
            let want = canonical(real.call(request), &theirs);
            let got = canonical(zipcache.call(request), &ours);
            let asked: Vec<String> = request
                .iter()
                .map(|a| String::from_utf8_lossy(a).into())
                .collect();
            assert_eq!(got, want, "node {node}: {asked:?}");
        }
    }
    fleet.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
