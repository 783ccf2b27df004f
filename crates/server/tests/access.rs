//! Access control with real clients: `requirepass` through redis-cli and redis-py (which
//! logs in with `HELLO 3 AUTH`), and TLS on both ports through redis-cli, redis-py and
//! pymemcache, with and without required client certificates. The certificates are
//! made here with rcgen. A missing client program skips its test with a message.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::certificates::{Certificates, tls_stream};
use common::{TestServer, ToolRun, py_script, run_tool};
use zipcache_server::{Password, ServerOptions, TlsFiles};

/// The program's path, or `None` after saying which test is skipped and why.
fn client_program(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        eprintln!(
            "SKIPPED: `{name}` is not installed (package {package}; scripts/test.sh installs it)"
        );
    }
    found
}

/// Whether python3 can import every module, saying what is missing otherwise.
fn python_has(modules: &[&str]) -> bool {
    let Some(python) = client_program("python3", "python3") else {
        return false;
    };
    let ok = Command::new(python)
        .args(["-c", &format!("import {}", modules.join(", "))])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIPPED: python modules {modules:?} missing (pip install pymemcache redis)");
    }
    ok
}

fn redis_cli(program: &Path, port: u16, extra: &[&str], command: &[&str]) -> ToolRun {
    let mut cli = Command::new(program);
    cli.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(extra)
        .args(command);
    run_tool(&mut cli, Duration::from_secs(20))
}

fn server(requirepass: Option<&str>, tls: Option<TlsFiles>) -> TestServer {
    TestServer::with_options(ServerOptions {
        requirepass: requirepass.and_then(Password::new),
        tls,
        ..TestServer::options()
    })
}

#[test]
fn requirepass_gates_redis_cli_and_redis_py() {
    let server = server(Some("s3cret"), None);
    let port = server.resp.port();
    if let Some(cli) = client_program("redis-cli", "redis-tools") {
        let refused = redis_cli(&cli, port, &[], &["PING"]);
        assert!(
            refused.stdout.contains("NOAUTH Authentication required."),
            "{refused}"
        );
        let login = ["-a", "s3cret", "--no-auth-warning"];
        let set = redis_cli(&cli, port, &login, &["SET", "k", "v"]);
        assert!(set.ok && set.stdout.trim() == "OK", "{set}");
        let get = redis_cli(&cli, port, &login, &["GET", "k"]);
        assert!(get.ok && get.stdout.trim() == "v", "{get}");
        let wrong = redis_cli(
            &cli,
            port,
            &["-a", "wrong", "--no-auth-warning"],
            &["GET", "k"],
        );
        // redis-cli reports a refused login on stderr, and the refused GET on stdout.
        assert!(wrong.stderr.contains("WRONGPASS"), "{wrong}");
    }
    if python_has(&["redis", "pymemcache"]) {
        let run = run_tool(
            Command::new("python3")
                .arg(py_script("secure_clients.py"))
                .args(["--resp", &port.to_string(), "--password", "s3cret"]),
            Duration::from_secs(60),
        );
        assert!(
            run.ok && run.stdout.contains("ok"),
            "secure_clients.py failed:\n{run}"
        );
    }
}

#[test]
fn tls_serves_redis_cli_redis_py_and_pymemcache() {
    let certificates = Certificates::generate("server-only");
    let server = server(Some("s3cret"), Some(certificates.server_files(false)));
    let ca = certificates.path("ca.pem");
    let ca = ca.to_str().expect("utf-8 path");
    // Plain text gets no reply from a TLS port.
    let mut plain = TcpStream::connect(server.resp).expect("connect");
    plain
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    plain.write_all(b"PING\r\n").expect("send");
    let mut reply = Vec::new();
    let _ = plain.read_to_end(&mut reply);
    assert!(!reply.starts_with(b"+PONG"), "{reply:?}");
    if let Some(cli) = client_program("redis-cli", "redis-tools") {
        let tls = ["--tls", "--cacert", ca, "-a", "s3cret", "--no-auth-warning"];
        let set = redis_cli(&cli, server.resp.port(), &tls, &["SET", "k", "over tls"]);
        assert!(set.ok && set.stdout.trim() == "OK", "{set}");
        let get = redis_cli(&cli, server.resp.port(), &tls, &["GET", "k"]);
        assert!(get.ok && get.stdout.trim() == "over tls", "{get}");
    }
    if python_has(&["redis", "pymemcache"]) {
        let run = run_tool(
            Command::new("python3")
                .arg(py_script("secure_clients.py"))
                .args([
                    "--resp",
                    &server.resp.port().to_string(),
                    "--memcached",
                    &server.memcached.port().to_string(),
                    "--password",
                    "s3cret",
                    "--ca",
                    ca,
                ]),
            Duration::from_secs(60),
        );
        assert!(
            run.ok && run.stdout.contains("ok"),
            "secure_clients.py failed:\n{run}"
        );
    }
}

#[test]
fn tls_ca_requires_client_certificates() {
    let certificates = Certificates::generate("mutual");
    let server = server(None, Some(certificates.server_files(true)));
    let path = |file: &str| certificates.path(file).to_str().expect("utf-8").to_string();
    let (ca, cert, key) = (path("ca.pem"), path("client.pem"), path("client-key.pem"));
    if let Some(cli) = client_program("redis-cli", "redis-tools") {
        let port = server.resp.port();
        let refused = redis_cli(&cli, port, &["--tls", "--cacert", &ca], &["PING"]);
        assert!(
            !refused.stdout.contains("PONG"),
            "no client certificate: {refused}"
        );
        let with_cert = ["--tls", "--cacert", &ca, "--cert", &cert, "--key", &key];
        let ping = redis_cli(&cli, port, &with_cert, &["PING"]);
        assert!(ping.ok && ping.stdout.trim() == "PONG", "{ping}");
    }
    if python_has(&["redis", "pymemcache"]) {
        let run = run_tool(
            Command::new("python3")
                .arg(py_script("secure_clients.py"))
                .args([
                    "--resp",
                    &server.resp.port().to_string(),
                    "--memcached",
                    &server.memcached.port().to_string(),
                    "--ca",
                    &ca,
                    "--client-cert",
                    &cert,
                    "--client-key",
                    &key,
                ]),
            Duration::from_secs(60),
        );
        assert!(
            run.ok && run.stdout.contains("ok"),
            "secure_clients.py failed:\n{run}"
        );
    }
}

#[test]
fn bad_tls_files_are_reported_not_served() {
    let certificates = Certificates::generate("bad");
    let files = TlsFiles {
        cert: certificates.path("server.pem"),
        key: certificates.path("missing-key.pem"),
        ca: None,
    };
    let cache = std::sync::Arc::new(
        zipcache::ZipCache::open(zipcache::Config {
            dram_capacity: 16 << 20,
            ..zipcache::Config::default()
        })
        .expect("engine"),
    );
    let error = zipcache_server::start(
        cache,
        ServerOptions {
            tls: Some(files),
            ..TestServer::options()
        },
    )
    .err()
    .expect("a missing key file is an error");
    assert!(error.to_string().contains("missing-key.pem"), "{error}");
}

/// A memcached client over TLS that trusts only the CA in `ca`: `None` if the handshake
/// fails (the server presents a certificate that CA did not sign).
struct TlsClient(rustls::StreamOwned<rustls::ClientConnection, TcpStream>);

impl TlsClient {
    fn connect(port: u16, ca: &Path) -> Option<TlsClient> {
        let mut client = TlsClient(tls_stream(port, ca));
        // The handshake runs on first use; `version` answers one line.
        let answer = client.ask("version").ok()?;
        assert!(answer.starts_with("VERSION "), "{answer}");
        Some(client)
    }

    /// Sends one request line, returns the first line of the reply.
    fn ask(&mut self, request: &str) -> std::io::Result<String> {
        self.0.write_all(format!("{request}\r\n").as_bytes())?;
        self.0.flush()?;
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            if self.0.read(&mut byte)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            line.push(byte[0]);
        }
        line.truncate(line.len() - 2);
        Ok(String::from_utf8_lossy(&line).into_owned())
    }
}

/// memcached's `refresh_certs` reads the certificate files again: connections made
/// afterwards get the new certificate, open ones keep theirs, and files that do not load
/// leave the certificate in use as it was.
#[test]
fn refresh_certs_rotates_the_certificate_without_a_restart() {
    let (old, new) = (
        Certificates::generate("rotate-old"),
        Certificates::generate("rotate-new"),
    );
    let served = old.server_files(false);
    let server = server(None, Some(served.clone()));
    let port = server.memcached.port();
    let mut open = TlsClient::connect(port, &old.path("ca.pem")).expect("the old certificate");
    assert!(
        TlsClient::connect(port, &new.path("ca.pem")).is_none(),
        "the new CA did not sign what is served yet"
    );

    for file in ["server.pem", "server-key.pem"] {
        std::fs::copy(new.path(file), old.path(file)).expect("replace the served file");
    }
    assert_eq!(open.ask("refresh_certs").expect("reply"), "OK");
    assert!(TlsClient::connect(port, &new.path("ca.pem")).is_some());
    assert!(
        TlsClient::connect(port, &old.path("ca.pem")).is_none(),
        "the old certificate is no longer served"
    );
    assert!(open.ask("version").expect("reply").starts_with("VERSION "));

    std::fs::write(&served.key, "not a key").expect("break the key file");
    let reply = open.ask("refresh_certs").expect("reply");
    assert!(
        reply.starts_with("Error loading the certificates: ") && reply.contains("server-key.pem"),
        "{reply}"
    );
    assert!(
        TlsClient::connect(port, &new.path("ca.pem")).is_some(),
        "a failed reload keeps the certificate in use"
    );
}

#[test]
fn refresh_certs_without_tls_says_so() {
    let server = server(None, None);
    let mut client = common::Client::connect(server.memcached);
    assert_eq!(
        client.ask("refresh_certs\r\n", 1),
        ["Error TLS not enabled"]
    );
}
