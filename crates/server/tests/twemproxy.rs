//! Sharding behind twemproxy (nutcracker) with the YAML of docs/DEPLOY.md: three
//! servers, ketama + md5, one memcached pool and one redis pool. Every key lands on
//! exactly one server, keys reach all three, and reads through the proxy return what was
//! written through it.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{ChildGuard, Client, TestServer, free_port, require_tool, wait_for_port};

const KEYS: usize = 300;

/// docs/DEPLOY.md's nutcracker YAML with its listen addresses and the fleet's servers
/// (`10.0.0.11`–`13`) replaced by the test's.
fn deploy_yaml(servers: &[TestServer], mc_port: u16, resp_port: u16) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/DEPLOY.md");
    let text = std::fs::read_to_string(&path).expect("docs/DEPLOY.md");
    let start = text.find("```yaml\n").expect("a yaml block in DEPLOY.md") + 8;
    let mut yaml = text[start..start + text[start..].find("```").expect("closed")].to_string();
    let mut replace = |from: String, to: String| {
        assert!(yaml.contains(&from), "DEPLOY.md's YAML has no {from}");
        yaml = yaml.replace(&from, &to);
    };
    replace("0.0.0.0:22121".into(), format!("127.0.0.1:{mc_port}"));
    replace("0.0.0.0:22122".into(), format!("127.0.0.1:{resp_port}"));
    for (i, server) in servers.iter().enumerate() {
        replace(
            format!("10.0.0.1{}:11211", i + 1),
            server.memcached.to_string(),
        );
        replace(format!("10.0.0.1{}:6379", i + 1), server.resp.to_string());
    }
    yaml
}

#[test]
fn keys_shard_over_three_servers_behind_nutcracker() {
    let nutcracker = require_tool("nutcracker", "nutcracker");
    let servers: Vec<TestServer> = (0..3).map(|_| TestServer::start()).collect();
    let (mc_port, resp_port, stats_port) = (free_port(), free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("zipcache-twemproxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("nutcracker.yml");
    std::fs::write(&config, deploy_yaml(&servers, mc_port, resp_port)).unwrap();
    let _proxy = ChildGuard(
        Command::new(nutcracker)
            .arg("-c")
            .arg(&config)
            .args(["-a", "127.0.0.1", "-s", &stats_port.to_string()])
            .arg("-o")
            .arg(dir.join("nutcracker.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nutcracker"),
    );
    wait_for_port(mc_port, Duration::from_secs(10));
    wait_for_port(resp_port, Duration::from_secs(10));

    let mut mc = Client::connect(([127, 0, 0, 1], mc_port).into());
    for i in 0..KEYS {
        let reply = mc.ask(&format!("set mc:{i:05} 0 0 5\r\nv{i:04}\r\n"), 1);
        assert_eq!(reply, ["STORED"], "key {i}");
    }
    for i in 0..KEYS {
        let reply = mc.ask(&format!("get mc:{i:05}\r\n"), 3);
        assert_eq!(
            reply,
            [
                format!("VALUE mc:{i:05} 0 5"),
                format!("v{i:04}"),
                "END".into()
            ]
        );
    }
    let mut rs = Client::connect(([127, 0, 0, 1], resp_port).into());
    for i in 0..KEYS {
        let key = format!("rs:{i:05}");
        let set = format!(
            "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$5\r\nr{i:04}\r\n",
            key.len()
        );
        assert_eq!(rs.ask(&set, 1), ["+OK"], "key {i}");
    }
    for i in 0..KEYS {
        let key = format!("rs:{i:05}");
        let get = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
        assert_eq!(rs.ask(&get, 2), ["$5".to_string(), format!("r{i:04}")]);
    }

    for prefix in ["mc", "rs"] {
        let mut per_server = [0usize; 3];
        for i in 0..KEYS {
            let key = format!("{prefix}:{i:05}");
            let holders: Vec<usize> = (0..3)
                .filter(|&s| servers[s].cache.get(key.as_bytes()).unwrap().is_some())
                .collect();
            assert_eq!(holders.len(), 1, "{key} is on servers {holders:?}");
            per_server[holders[0]] += 1;
        }
        assert!(
            per_server.iter().all(|&n| n > 0),
            "{prefix} keys did not reach every server: {per_server:?}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
