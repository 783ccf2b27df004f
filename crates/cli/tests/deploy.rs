//! docs/DEPLOY.md as it is written: its systemd unit passes `systemd-analyze verify`, every
//! flag its `ExecStart` names is one `zipcache serve` takes, and its off-loopback config
//! file starts a server with authentication and TLS on. (Its nutcracker YAML is started
//! by `crates/server/tests/twemproxy.rs`.)

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{Server, test_dir};

const ZIPCACHE: &str = env!("CARGO_BIN_EXE_zipcache");
/// Where the unit expects the binary and the credentials.
const INSTALLED: &str = "/usr/local/bin/zipcache";
const CREDENTIALS: &str = "/run/credentials/zipcache.service/";

/// The first fenced block of `language` in docs/DEPLOY.md.
fn deploy_block(language: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/DEPLOY.md");
    let text = std::fs::read_to_string(&path).expect("docs/DEPLOY.md");
    let fence = format!("```{language}\n");
    let start = text
        .find(&fence)
        .unwrap_or_else(|| panic!("no {language} block in DEPLOY.md"))
        + fence.len();
    let len = text[start..].find("```").expect("closed block");
    text[start..start + len].to_string()
}

/// The path of `tool`, or `None` after printing why the test is skipped.
fn tool(tool: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(tool))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        eprintln!("skipped: `{tool}` is not installed");
    }
    found
}

#[test]
fn the_systemd_unit_verifies() {
    let Some(analyze) = tool("systemd-analyze") else {
        return;
    };
    let unit = deploy_block("ini");
    assert!(unit.contains(INSTALLED), "the unit runs {INSTALLED}");
    // verify checks that ExecStart's program exists: point it at the one just built.
    let dir = test_dir("deploy", "unit");
    let path = dir.join("zipcache.service");
    std::fs::write(&path, unit.replace(INSTALLED, ZIPCACHE)).expect("write the unit");
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // An unknown or misspelt directive is only a warning (exit 0): any output fails.
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {}\n{said}",
        out.status
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_unit_names_only_flags_zipcache_serve_takes() {
    let unit = deploy_block("ini");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let help = Command::new(ZIPCACHE)
        .args(["serve", "--help"])
        .output()
        .expect("zipcache serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let flags: Vec<&str> = exec
        .split_whitespace()
        .filter(|word| word.starts_with("--"))
        .collect();
    assert!(flags.contains(&"--data-dir") && flags.contains(&"--dram"));
    for flag in flags {
        assert!(
            help.contains(&format!("{flag} ")),
            "zipcache serve has no {flag}"
        );
    }
}

/// A self-signed certificate and its key from `openssl`, in `dir`.
fn certificate(openssl: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let made = Command::new(openssl)
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .arg("ec_paramgen_curve:prime256v1")
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(
        made.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    (cert, key)
}

#[test]
fn the_off_loopback_config_starts_with_auth_and_tls() {
    let Some(openssl) = tool("openssl") else {
        return;
    };
    let dir = test_dir("deploy", "config");
    certificate(&openssl, &dir);
    std::fs::write(dir.join("users"), "app:a long random password\n").expect("users");
    std::fs::write(
        dir.join("metrics-users"),
        "prometheus:another long password\n",
    )
    .expect("metrics users");
    let config = deploy_block("toml");
    assert!(config.contains(CREDENTIALS), "the config reads credentials");
    let path = dir.join("zipcache.toml");
    let credentials = format!("{}/", dir.display());
    std::fs::write(&path, config.replace(CREDENTIALS, &credentials)).expect("config");
    // The command line overrides the file: loopback and free ports for the test.
    let args = [
        "--config",
        path.to_str().expect("utf-8 path"),
        "--listen",
        "127.0.0.1",
        "--memcached-port",
        "0",
        "--resp-port",
        "0",
        "--dram",
        "64MiB",
        "--ssd",
        "none",
    ];
    let mut server = Server::spawn(dir.clone(), args.iter().map(|s| s.to_string()).collect());
    let banner = server.log();
    for off in [
        "tls              off",
        "requirepass      off",
        "auth-file        off",
        "no one (the data ports require a login",
    ] {
        assert!(!banner.contains(off), "the config left {off:?}:\n{banner}");
    }
    assert!(
        banner.contains("flush_all        disabled"),
        "flush_all is not disabled:\n{banner}"
    );
    let status = server.stop();
    assert!(status.success(), "stop: {status}: {}", server.log());
}
