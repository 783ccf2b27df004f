//! `zipcache serve --unix-socket` as a process: the socket file removed on SIGTERM, a
//! stale one (a killed server's) replaced by the next start, a live server's socket and
//! a path that is not a socket refused with a clear error and a non-zero exit.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, test_dir};

fn args(socket: &Path) -> Vec<String> {
    [
        "--memcached-port",
        "0",
        "--resp-port",
        "0",
        "--ssd",
        "none",
        "--dram",
        "32MiB",
        "--threads",
        "2",
        "--unix-socket",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([socket.display().to_string()])
    .collect()
}

/// Sends one memcached request over the socket and returns the first `lines` lines.
fn ask(socket: &Path, request: &str, lines: usize) -> Vec<String> {
    let mut stream = UnixStream::connect(socket).expect("connect to the unix socket");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    (0..lines)
        .map(|_| {
            let mut line = String::new();
            reader.read_line(&mut line).expect("reply");
            line.trim_end().to_string()
        })
        .collect()
}

/// Runs `zipcache serve ARGS` expecting it to fail at start: its exit status and stderr.
/// A server that starts anyway is killed after 30 s and the test fails.
fn failed_start(dir: &Path, args: Vec<String>) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_zipcache"))
        .arg("serve")
        .args(args)
        .arg("--data-dir")
        .arg(dir.join("refused-data"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("refused.err")).unwrap())
        .spawn()
        .expect("start zipcache serve");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("zipcache serve started where it must refuse to");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status,
        std::fs::read_to_string(dir.join("refused.err")).unwrap(),
    )
}

fn socket_dir(name: &str) -> (PathBuf, PathBuf) {
    let dir = test_dir("unix", name);
    let socket = dir.join("mc.sock");
    (dir, socket)
}

#[test]
fn sigterm_removes_the_socket_and_a_killed_servers_socket_is_replaced() {
    let (dir, socket) = socket_dir("lifecycle");
    let killed = Server::spawn(test_dir("unix", "killed"), args(&socket));
    assert_eq!(ask(&socket, "set k 0 0 1\r\nv\r\n", 1), ["STORED"]);
    drop(killed); // SIGKILL: no clean stop, the socket file stays
    let stale = std::fs::symlink_metadata(&socket).expect("a killed server leaves its socket");
    assert!(stale.file_type().is_socket());
    assert!(
        UnixStream::connect(&socket).is_err(),
        "nothing listens on it"
    );

    let mut server = Server::spawn(test_dir("unix", "next"), args(&socket));
    assert_eq!(ask(&socket, "set k 0 0 2\r\nv2\r\n", 1), ["STORED"]);

    // While it listens, another start on the same path is refused and changes nothing.
    let (status, stderr) = failed_start(&dir, args(&socket));
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&*socket.to_string_lossy())
            && stderr.contains("a server is listening on this socket"),
        "{stderr}"
    );
    assert_eq!(
        ask(&socket, "get k\r\n", 3),
        ["VALUE k 0 2", "v2", "END"],
        "the live server keeps its socket"
    );

    let status = server.stop();
    assert!(status.success(), "{}", server.log());
    assert!(!socket.exists(), "SIGTERM removes the socket file");
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_path_that_is_not_a_socket_is_refused_and_left_alone() {
    let (dir, socket) = socket_dir("not-a-socket");
    std::fs::write(&socket, "an operator's file\n").unwrap();
    let (status, stderr) = failed_start(&dir, args(&socket));
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("is not a socket"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&socket).unwrap(),
        "an operator's file\n"
    );
    let _ = std::fs::remove_dir_all(dir);
}
