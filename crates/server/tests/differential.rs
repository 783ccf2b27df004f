//! The same request scripts against the real memcached / redis-server binaries and
//! against our server: replies must be byte-identical. Cases where we differ on purpose
//! (version strings, CAS numbering, stale items) are left out and listed in SERVER.md,
//! and so are inputs on which this memcached (Debian's 1.6.18) and the current one
//! (1.6.45, whose own test suite we pass) answer differently: there we follow the
//! current one, and `malformed.rs` checks it.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{ChildGuard, TestServer, free_port, require_tool, wait_for_port};
use zipcache_server::{Password, ServerOptions};

/// Sends `script` plus a sentinel request and returns everything before the sentinel's
/// reply, which starts with `marker` and ends the stream with `\r\n` (or everything up
/// to the close, if the script closes the connection).
fn exchange(
    addr: SocketAddr,
    script: &[u8],
    sentinel: &[u8],
    marker: &[u8],
) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(addr)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(script).expect("send");
    let _ = stream.write_all(sentinel);
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if reply.ends_with(b"\r\n")
            && let Some(at) = reply.windows(marker.len()).rposition(|w| w == marker)
        {
            reply.truncate(at);
            return Ok(reply);
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return Ok(reply),
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
}

fn compare(
    cases: &[&str],
    (real, real_server): (SocketAddr, &mut ChildGuard),
    ours: SocketAddr,
    flush: &str,
    sentinel: (&str, &str),
) {
    compare_as(
        cases,
        (real, real_server),
        ours,
        flush,
        sentinel,
        |_, reply| reply,
    );
}

/// `compare`, each side's replies first passed through `normalize` (given which side:
/// `true` for the real server) — for what differs by nature, such as node ids and ports.
fn compare_as(
    cases: &[&str],
    (real, real_server): (SocketAddr, &mut ChildGuard),
    ours: SocketAddr,
    flush: &str,
    sentinel: (&str, &str),
    normalize: impl Fn(bool, Vec<u8>) -> Vec<u8>,
) {
    let mut talk = |addr: SocketAddr, script: &str| {
        let send = || {
            exchange(
                addr,
                script.as_bytes(),
                sentinel.0.as_bytes(),
                sentinel.1.as_bytes(),
            )
        };
        let mut reply = send();
        // A live server has been seen to refuse one connection when the VM is loaded
        // (4 in 60 runs, never alone): this test compares replies, so a refused connect
        // is retried for up to 2 s, and reported on stderr.
        for _ in 0..20 {
            match &reply {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    let side = if addr == real { "real" } else { "ours" };
                    eprintln!("connect {addr} ({side}) refused; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                    reply = send();
                }
                _ => break,
            }
        }
        reply.unwrap_or_else(|e| {
            // Say whether the peer process is gone: something outside this test (a
            // `pkill` by name elsewhere on the machine) is then the likely cause.
            let state = real_server.0.try_wait();
            panic!("connect {addr}: {e}; real server process state: {state:?}")
        })
    };
    let mut mismatches = Vec::new();
    for case in cases {
        talk(real, flush);
        talk(ours, flush);
        let expected = normalize(true, talk(real, case));
        let got = normalize(false, talk(ours, case));
        if expected != got {
            mismatches.push(format!(
                "{case:?}\n  real: {:?}\n  ours: {:?}",
                String::from_utf8_lossy(&expected),
                String::from_utf8_lossy(&got)
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} cases differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

const MEMCACHED_CASES: &[&str] = &[
    // ElastiCache's auto-discovery command: unknown to a plain memcached, and to us
    // without a cluster mode.
    "config get cluster\r\nconfig\r\nconfig get\r\n",
    "get\r\n",
    "get a b\r\n",
    "set k 0 0 2\r\nabXYget k\r\n",
    "set k 0 0 -1\r\nget k\r\n",
    "set k 5 0 2 noreply\r\nab\r\nget k\r\n",
    "incr k 1\r\nincr k x\r\nset n 0 0 2\r\n10\r\ndecr n 11\r\nget n\r\nincr n 18446744073709551615\r\nincr n 2\r\n",
    "set n 0 0 2\r\n10\r\ndecr n 1\r\nget n\r\nappend n 0 0 1\r\nx\r\nget n\r\nincr n 1\r\n",
    "set t 0 0 3\r\nabc\r\nincr t 1\r\n",
    "delete a b c d e\r\ndelete k 0\r\ndelete k 1\r\ndelete k noreply\r\ndelete k\r\n",
    "stats noreply\r\nstats foo\r\nverbosity\r\nverbosity 1\r\nverbosity 1 noreply\r\nflush_all foo\r\nflush_all 0\r\nflush_all noreply\r\nfoo\r\n",
    "touch k\r\ntouch k 10\r\nset k 0 0 1\r\nx\r\ntouch k 10\r\ngat 10\r\ngat 10 k n\r\ngats x n\r\n",
    "cas zz 0 0 1 5\r\n1\r\n",
    "add a 0 0 1\r\n1\r\nadd a 0 0 1\r\n2\r\nreplace a 3 0 1\r\n3\r\nreplace b 0 0 1\r\n3\r\nprepend a 0 0 1\r\n<\r\nappend b 0 0 1\r\n>\r\nget a b\r\n",
    "set e 0 -1 1\r\nx\r\nget e\r\nadd e 0 0 1\r\ny\r\nget e\r\n",
    "quit\r\nget a\r\n",
    "mn\r\nms mk 2\r\nhi\r\nmg mk v\r\nmg mk k v f t s O123 q\r\nmg miss v\r\nmg miss v q\r\nmg miss v k O9\r\nmn\r\n",
    "ms mk 2 T100 F5 k O1\r\nhi\r\nmg mk f t v\r\nmg mk\r\nms mk 2 q\r\nhi\r\nms mk 2 MA\r\nzz\r\nmg mk v\r\nms none 2 MA\r\nzz\r\nms mk 2 ME\r\nzz\r\nms mk 2 MR\r\nyy\r\nms mk 2 MP\r\nxx\r\nmg mk v s\r\n",
    "ms mk S2\r\nzz\r\nms mk\r\nms mk 2 MX\r\nzz\r\nmn\r\n",
    "ms mk 1\r\nx\r\nmd mk q\r\nmd mk\r\nmd mk q\r\nmn\r\n",
    "ma cnt\r\nma cnt N0 J10\r\nma cnt v\r\nma cnt MD D3 v t\r\nma cnt q\r\nma nope q\r\nma nope D1 MX\r\nms s 1\r\na\r\nma s\r\nma cnt M+ D100 v\r\nma cnt M- D1000 v\r\n",
    "me mk\r\nme\r\nmg k zz\r\nmg k v v\r\nmg k v T\r\n",
    "ms mk 1 T0\r\nx\r\nmg mk s v\r\nmg mk T-1 v\r\nmg mk v\r\n",
    "ms aGk= 2 b\r\nhi\r\nmg aGk= b v k\r\nget hi\r\n",
];

#[test]
fn memcached_replies_match_the_real_memcached() {
    let memcached = require_tool("memcached", "memcached");
    let port = free_port();
    let mut real = ChildGuard(
        Command::new(memcached)
            .args([
                "-u",
                "root",
                "-l",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-m",
                "64",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start memcached"),
    );
    wait_for_port(port, Duration::from_secs(10));
    let ours = TestServer::start();
    compare(
        MEMCACHED_CASES,
        (([127, 0, 0, 1], port).into(), &mut real),
        ours.memcached,
        "flush_all\r\n",
        // No case sends `version`, so its reply marks the end of a case's replies.
        ("version\r\n", "VERSION "),
    );
}

const RESP_CASES: &[&str] = &[
    // Without cluster mode, as a plain Redis.
    "CLUSTER INFO\r\nCLUSTER SLOTS\r\nCLUSTER KEYSLOT foo\r\nREADONLY\r\nREADWRITE\r\nASKING\r\nCLUSTER\r\nINFO cluster\r\nmget a b\r\n",
    "PING\r\nping hello\r\necho\r\nfoo a b\r\nget\r\nset k v\r\nget k\r\nset k v NX\r\nset k v2 XX GET\r\nset k v EX 0\r\nset k v EX x\r\nset k v FOO\r\nset k v EX 10 PX 10\r\nttl k\r\nset k v EX 100\r\nttl k\r\npersist k\r\nttl k\r\nttl nokey\r\n",
    "set n 10\r\nincr n\r\nincrby n 5\r\ndecrby n x\r\nincr k\r\nset big 9223372036854775807\r\nincr big\r\ndecr newkey\r\nmset a 1 b\r\nmset a 1 b 2\r\nmget a b zz\r\nexists a b zz\r\ndel a b zz\r\nexpire n 100\r\nexpire n 50 GT\r\nexpire n 200 GT\r\nttl n\r\nexpire n -1\r\nexists n\r\nselect 0\r\nselect x\r\n",
    "*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
    "*x\r\n",
    "*1\r\n:4\r\n",
    "*1\r\n$-3\r\n",
    "*1\r\n$2\r\nabc\r\nping\r\n",
    "set \"a b\" 'x y'\r\nget \"a b\"\r\nget \"unbalanced\r\n",
    "set \"\\x41\\n\" v\r\nget \"A\\n\"\r\n",
    "client setname foo\r\nclient getname\r\nclient foo\r\nconfig get appendonly\r\nconfig foo\r\n",
    "setnx a 1\r\nsetnx a 2\r\nget a\r\ngetset a 3\r\ngetdel a\r\nget a\r\nappend s ab\r\nappend s cd\r\nstrlen s\r\ntype s\r\ntype nope\r\nsetex e 100 v\r\nttl e\r\npsetex e 0 v\r\nunlink s e\r\n",
    "set k v KEEPTTL EX 5\r\nset k v GET NX\r\nset k v PXAT 99999999999999\r\nset k v2 KEEPTTL\r\npersist k\r\nttl k\r\n",
    "quit\r\nping\r\n",
    // GETEX: options, then the number; repeating one option is allowed.
    "set k v\r\ngetex k\r\ngetex k EX 100\r\nttl k\r\ngetex k PERSIST\r\nttl k\r\ngetex k EX 0\r\ngetex k EX 10 PX 10\r\ngetex k PERSIST EX 10\r\ngetex k FOO\r\ngetex k EX\r\ngetex k EX x\r\ngetex k EX x FOO\r\ngetex nokey EX 10\r\ngetex k EXAT 1\r\nexists k\r\nset k v\r\ngetex k EX 9223372036854775\r\ngetex k ex 10 ex 20\r\nttl k\r\ngetex k persist persist\r\nttl k\r\n",
    "incrbyfloat f 0.1\r\nincrbyfloat f 0.2\r\nincrbyfloat f x\r\nincrbyfloat f inf\r\nincrbyfloat f nan\r\nset s abc\r\nincrbyfloat s 1\r\nset f 10.50\r\nincrbyfloat f 0\r\nincrbyfloat f \" 1\"\r\nincrbyfloat f +1\r\nset g 5\r\nincrbyfloat g -5\r\nincrbyfloat g -0.0001\r\nincrbyfloat h 1e20\r\nincrbyfloat h -1e20\r\nincrbyfloat f\r\nget f\r\n",
    "msetnx a 1 b 2\r\nmsetnx b 3 c 4\r\nmget a b c\r\nmsetnx a\r\nmsetnx a 1 b\r\n",
    "set a 1\r\nset b 2\r\nexpireat a 9999999999\r\nexpiretime a\r\npexpiretime a\r\nexpiretime nokey\r\nexpiretime b\r\npexpireat b 99999999999999\r\npexpiretime b\r\nexpireat b 1\r\nexists b\r\nexpireat a 9999999999 NX\r\nexpireat a 9999999999 FOO\r\nexpire a 10 NX XX\r\nexpire a 10 GT LT\r\nexpire a 10 XX GT\r\nexpireat a x\r\nexpire a x FOO\r\nexpireat a 9223372036854775807\r\npexpireat a 9223372036854775807\r\npexpiretime a\r\nexpire a 9223372036854775807\r\npexpire a 9223372036854775807\r\nexpire a 10 xx xx\r\nexpireat nokey 1\r\nexpireat a 0\r\nexists a\r\nexpiretime\r\n",
    "set k \"Hello World\"\r\ngetrange k 0 4\r\ngetrange k -5 -1\r\ngetrange k -1 -5\r\ngetrange k 5 3\r\ngetrange k 0 100\r\ngetrange k -100 2\r\ngetrange nokey 0 1\r\ngetrange k x 1\r\ngetrange k 0 9223372036854775807\r\ngetrange k -9223372036854775808 1\r\nsetrange k 6 Redis\r\nget k\r\nsetrange n 3 ab\r\nget n\r\nsetrange n2 3 \"\"\r\nexists n2\r\nsetrange k 1 \"\"\r\nsetrange k -1 x\r\nsetrange k x x\r\nsetrange k 9223372036854775807 x\r\nset e \"\"\r\ngetrange e 0 -1\r\ngetrange k 0\r\n",
    "mset b 1 a 2 ab 3\r\nkeys a\r\nkeys ab*\r\nkeys zz*\r\nkeys a?\r\nkeys\r\nkeys a b\r\n",
    "client id x\r\nclient getname x\r\nclient setname\r\nclient setname \"a b\"\r\nclient setname \"\"\r\nclient getname\r\nclient\r\nclient foo a\r\nhello 4\r\nhello x\r\nhello 3 FOO\r\nhello 3 SETNAME\r\nhello 3 SETNAME \"a b\"\r\nhello 3 AUTH default\r\nauth x\r\nauth default x\r\nauth bob x\r\nauth a b c\r\nauth\r\n",
    "flushall x\r\nflushall async\r\nflushdb sync\r\nflushall async x\r\nping a b\r\necho a b\r\ndecrby k -9223372036854775808\r\nsetex k 0 v\r\npsetex k -1 v\r\nsetex k x v\r\nset k v nx nx\r\nset k v ex 10 ex 20\r\nttl k\r\nset k v xx nx\r\nset k v get get\r\nset k v keepttl keepttl\r\nset k v ex 10 keepttl\r\nset k v ex x foo\r\nconfig get\r\nconfig resetstat x\r\nconfig set\r\ncommand count x\r\ncommand foo\r\ndbsize x\r\ninfo a b c\r\nquit extra\r\n",
];

/// Hashes, and strings and hashes meeting (`WRONGTYPE` both ways). A small hash's
/// fields come back from Redis in the order they were set, ours in field order: each
/// case sets its fields in field order.
const RESP_HASH_CASES: &[&str] = &[
    "hset h a 1 b 2\r\nhset h a 3 c 4\r\nhget h a\r\nhget h z\r\nhget nokey a\r\nhmget h a z c\r\nhmget nokey a b\r\nhgetall h\r\nhkeys h\r\nhvals h\r\nhlen h\r\nhlen nokey\r\nhgetall nokey\r\nhkeys nokey\r\nhexists h a\r\nhexists h z\r\nhexists nokey a\r\nhstrlen h a\r\nhstrlen h z\r\nhdel h a z a\r\nhlen h\r\nhdel nokey a\r\nhdel h b c\r\nexists h\r\ntype h\r\nhset h a 1 a 2\r\nhget h a\r\nhlen h\r\n",
    "hset h\r\nhset h a\r\nhset h a 1 b\r\nhmset h a\r\nhmset h a 1\r\nhmset h a 1 b\r\nhsetnx h a 2\r\nhsetnx h b 2\r\nhsetnx h\r\nhget h\r\nhget h a b\r\nhgetall\r\nhgetall a b\r\nhdel h\r\nhlen\r\nhexists h\r\nhstrlen h a b\r\nhmget h\r\nhkeys\r\nhvals a b\r\nhgetall h\r\n",
    "hincrby h n\r\nhincrby h n x\r\nhincrby h n 5\r\nhincrby h n -10\r\nhset h t text\r\nhincrby h t 1\r\nhset h big 9223372036854775807\r\nhincrby h big 1\r\nhincrby h n 07\r\nhincrbyfloat h f 0.1\r\nhincrbyfloat h f 0.2\r\nhincrbyfloat h f x\r\nhincrbyfloat h f inf\r\nhincrbyfloat h f -inf\r\nhincrbyfloat h f nan\r\nhincrbyfloat h t 1\r\nhincrbyfloat h n 1.5\r\nhget h n\r\nhincrbyfloat h g 1e20\r\nhincrbyfloat h g -1e20\r\nhmget h f g n\r\nhlen h\r\n",
    "set s v\r\nhset s a 1\r\nhsetnx s a 1\r\nhmset s a 1\r\nhget s a\r\nhmget s a\r\nhgetall s\r\nhkeys s\r\nhvals s\r\nhlen s\r\nhdel s a\r\nhexists s a\r\nhstrlen s a\r\nhincrby s a 1\r\nhincrbyfloat s a 1\r\nget s\r\n",
    "hset h a 1\r\nget h\r\nappend h x\r\nstrlen h\r\nincr h\r\nincrbyfloat h 1\r\ndecrby h 1\r\ngetrange h 0 1\r\nsetrange h 0 x\r\nsetrange h 1 \"\"\r\ngetset h x\r\ngetdel h\r\ngetex h\r\ngetex h PERSIST\r\nmget h nokey\r\nset h v GET\r\nsetnx h v\r\nset h v NX\r\nmsetnx h v\r\ntype h\r\nexists h h\r\nhget h a\r\nset h v XX\r\ntype h\r\nget h\r\nhget h a\r\n",
    "hset h a 1 b 2 c 3\r\nhscan h 0\r\nhscan h 0 MATCH b*\r\nhscan h 0 COUNT 100 MATCH *\r\nhscan h 0 COUNT 0\r\nhscan h 0 COUNT x\r\nhscan h 0 FOO bar\r\nhscan h 0 MATCH\r\nhscan nokey 0\r\nhscan h\r\nhrandfield nokey\r\nhrandfield nokey 3\r\nhrandfield nokey 3 WITHVALUES\r\nhrandfield h 0\r\nhrandfield h 3\r\nhrandfield h 5 WITHVALUES\r\nhrandfield h 3 FOO\r\nhrandfield h x\r\nhrandfield h 1 WITHVALUES x\r\nset s v\r\nhscan s 0\r\nhrandfield s\r\nhset one f v\r\nhrandfield one\r\nhrandfield one -3\r\nhrandfield one -2 WITHVALUES\r\n",
    "rename nokey x\r\nrenamenx nokey x\r\nrename a\r\nrenamenx a b c\r\nset a 1\r\nexpire a 100\r\nrename a b\r\nget a\r\nget b\r\nttl b\r\nrename b b\r\nrenamenx b b\r\nset c 2\r\nrenamenx b c\r\nrenamenx b d\r\nget d\r\nttl d\r\nexists b\r\nhset h f v g w\r\nexpire h 50\r\nrename h d\r\ntype d\r\nhgetall d\r\nttl d\r\nexists h\r\nhset h2 a 1\r\nrename c h2\r\ntype h2\r\nget h2\r\nhset h3 x y\r\nrenamenx d h3\r\nrename d h3\r\nhgetall h3\r\nhset d z 1\r\nhgetall d\r\nhgetall h3\r\nset s v\r\nrename s h3\r\nhget h3 x\r\nget h3\r\n",
    "hset h a 1\r\nexpire h 100\r\nttl h\r\npersist h\r\nttl h\r\nexpire h 100\r\nhset h b 2\r\nttl h\r\nhdel h a\r\nttl h\r\ndel h nokey\r\nexists h\r\nhget h b\r\nhset h a 1\r\nunlink h\r\nhgetall h\r\nhset h a 1\r\nset h v\r\nget h\r\nhset h a 1\r\nsetex h 100 v\r\ntype h\r\nhset h2 a 1\r\nmset h2 v\r\ntype h2\r\nhset h3 a 1\r\nexpire h3 0\r\nexists h3\r\nhset h3 x y\r\nhgetall h3\r\n",
];

/// CONFIG SET as Redis 7 answers it (a budget and the policy we have, then errors: bad
/// memory values, unknown and repeated names before any value, an odd count). Each case
/// leaves the budget at 64 MiB. Not here: 0 or an empty value, which Redis takes as no
/// limit and we refuse (`memcached_ops.rs`).
const RESP_CONFIG_SET_CASES: &[&str] = &[
    "CONFIG SET maxmemory 100mb\r\nCONFIG GET maxmemory\r\nCONFIG SET MaxMemory 1GB\r\nCONFIG GET maxmemory\r\nCONFIG SET maxmemory 1g\r\nCONFIG GET maxmemory\r\nCONFIG SET maxmemory 64mb maxmemory-policy allkeys-lru\r\nCONFIG GET maxmemory\r\nCONFIG GET maxmemory-policy\r\n",
    "CONFIG SET maxmemory abc\r\nCONFIG SET maxmemory -1\r\nCONFIG SET maxmemory 1.5mb\r\nCONFIG SET maxmemory 10xb\r\nCONFIG SET foo bar\r\nCONFIG SET Foo bar\r\nCONFIG SET maxmemory 1mb maxmemory 2mb\r\nCONFIG SET maxmemory 1mb foo\r\nCONFIG SET maxmemory abc foo bar\r\nCONFIG SET maxmemory\r\nCONFIG GET maxmemory\r\n",
];

/// With `requirepass secret`: NOAUTH before AUTH (but unknown commands and arity errors
/// first, as Redis checks them first), WRONGPASS, what works before logging in, and how
/// large a request may be before. Each case ends logged in (or closed), so the sentinel
/// is answered.
const RESP_AUTH_CASES: &[&str] = &[
    "PING\r\nGET k\r\nFOO a\r\nGET\r\nGET a b\r\nCLIENT SETNAME x\r\nHELLO 3\r\nHELLO\r\nAUTH\r\nAUTH a b c\r\nAUTH x\r\nAUTH default x\r\nAUTH bob secret\r\nHELLO 3 AUTH default\r\nHELLO 3 AUTH default bad\r\nHELLO 3 SETNAME \"a b\"\r\nSELECT 0\r\nAUTH default secret\r\nPING\r\nSET k v\r\nAUTH secret\r\nGET k\r\n",
    "AUTH secret\r\nAUTH wrong\r\nGET k\r\nAUTH default wrong\r\nPING\r\n",
    "quit\r\nping\r\n",
    // Before AUTH, at most 10 arguments of at most 16 KiB (the connection closes).
    "*11\r\n",
    "*2\r\n$4\r\nECHO\r\n$16385\r\n",
    "*3\r\n$4\r\nECHO\r\n$1\r\na\r\n$1\r\nb\r\n*10\r\n$3\r\nDEL\r\n",
    // After it, no such limits.
    "AUTH secret\r\n*11\r\n$3\r\nDEL\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nd\r\n$1\r\ne\r\n$1\r\nf\r\n$1\r\ng\r\n$1\r\nh\r\n$1\r\ni\r\n$1\r\nj\r\n",
];

/// With `--disable-flush-all`, as a redis-server whose user may not run the two flushes
/// (`-NOPERM`, checked after arity and before the command's own syntax). `DEL k` resets.
const RESP_FLUSH_REFUSED_CASES: &[&str] = &[
    "SET k v\r\nFLUSHALL\r\nFLUSHDB\r\nGET k\r\n",
    "SET k v\r\nflushall async\r\nFlushDB SYNC\r\nflushall foo\r\nflushdb a b\r\nFLUSHALL ASYNC x\r\nGET k\r\n",
];

/// A real redis-server on a free loopback port, with `extra` arguments.
fn real_redis(extra: &[&str]) -> (u16, ChildGuard) {
    let redis = require_tool("redis-server", "redis-server");
    let port = free_port();
    let port_text = port.to_string();
    let mut args = vec![
        "--port",
        &port_text,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ];
    args.extend_from_slice(extra);
    let child = ChildGuard(
        Command::new(redis)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server"),
    );
    wait_for_port(port, Duration::from_secs(10));
    (port, child)
}

#[test]
fn resp_replies_match_the_real_redis() {
    let (port, mut real) = real_redis(&[]);
    let ours = TestServer::start();
    compare(
        RESP_CASES,
        (([127, 0, 0, 1], port).into(), &mut real),
        ours.resp,
        "FLUSHALL\r\n",
        ("ECHO sentinel\r\n", "$8\r\nsentinel\r\n"),
    );
}

#[test]
fn resp_hash_replies_match_the_real_redis() {
    let (port, mut real) = real_redis(&[]);
    let ours = TestServer::start();
    compare(
        RESP_HASH_CASES,
        (([127, 0, 0, 1], port).into(), &mut real),
        ours.resp,
        "FLUSHALL\r\n",
        ("ECHO sentinel\r\n", "$8\r\nsentinel\r\n"),
    );
}

/// RENAME of a hash past the packed limits (its fields are elements of their own, copied
/// to the new key): what either key holds afterwards, and the source written again apart.
/// No HGETALL: Redis lists a hash this large in its table's order.
#[test]
fn resp_rename_of_a_large_hash_matches_the_real_redis() {
    let (port, mut real) = real_redis(&[]);
    let ours = TestServer::start();
    let fields: String = (0..200).map(|i| format!(" f{i} v{i}")).collect();
    let case = format!(
        "hset big{fields}\r\nexpire big 100\r\nset other x\r\nrename big other\r\nhlen other\r\nhmget other f0 f7 f199 f200\r\nexists big\r\nttl other\r\nhset big f1 new\r\nhget other f1\r\nhget big f1\r\nhlen big\r\nrenamenx other big\r\nrename other big\r\nhlen big\r\nhmget big f1 f150\r\nexists other\r\ndel big\r\nexists big\r\n"
    );
    compare(
        &[&case],
        (([127, 0, 0, 1], port).into(), &mut real),
        ours.resp,
        "FLUSHALL\r\n",
        ("ECHO sentinel\r\n", "$8\r\nsentinel\r\n"),
    );
}

#[test]
fn resp_config_set_matches_the_real_redis() {
    let (port, mut real) = real_redis(&[]);
    let ours = TestServer::start();
    compare(
        RESP_CONFIG_SET_CASES,
        (([127, 0, 0, 1], port).into(), &mut real),
        ours.resp,
        "FLUSHALL\r\n",
        ("ECHO sentinel\r\n", "$8\r\nsentinel\r\n"),
    );
}

#[test]
fn resp_authentication_matches_the_real_redis() {
    let (port, mut real) = real_redis(&["--requirepass", "secret"]);
    let ours = TestServer::with_options(ServerOptions {
        requirepass: Password::new("secret"),
        ..TestServer::options()
    });
    compare(
        RESP_AUTH_CASES,
        (([127, 0, 0, 1], port).into(), &mut real),
        ours.resp,
        "AUTH secret\r\nFLUSHALL\r\n",
        ("ECHO sentinel\r\n", "$8\r\nsentinel\r\n"),
    );
}

#[test]
fn resp_flush_refusal_matches_the_real_redis() {
    let no_flushes = ["--user", "default", "on", "nopass", "~*", "&*", "+@all"];
    let (port, mut real) = real_redis(&[&no_flushes[..], &["-flushall", "-flushdb"]].concat());
    let ours = TestServer::with_options(ServerOptions {
        flush_all_enabled: false,
        ..TestServer::options()
    });
    compare(
        RESP_FLUSH_REFUSED_CASES,
        (([127, 0, 0, 1], port).into(), &mut real),
        ours.resp,
        "DEL k\r\n",
        ("ECHO sentinel\r\n", "$8\r\nsentinel\r\n"),
    );
}

/// `--cluster-mode emulated` against a redis-server in cluster mode that owns every slot
/// (`CLUSTER ADDSLOTSRANGE 0 16383`): the node id, its port and its cluster bus port (we
/// have no bus: 0) are set aside, and HELLO's version and client id.
const RESP_CLUSTER_CASES: &[&str] = &[
    "CLUSTER INFO\r\nCLUSTER MYID\r\nCLUSTER SLOTS\r\nCLUSTER SHARDS\r\nCLUSTER NODES\r\nCLUSTER LINKS\r\n",
    "CLUSTER KEYSLOT foo\r\nCLUSTER KEYSLOT {user1}.x\r\nCLUSTER KEYSLOT foo{}{bar}\r\nCLUSTER KEYSLOT foo{{bar}}zap\r\nCLUSTER KEYSLOT \"\"\r\n",
    "CLUSTER\r\nCLUSTER BOGUS\r\nCLUSTER KEYSLOT\r\nCLUSTER KEYSLOT a b\r\nCLUSTER INFO x\r\nCLUSTER COUNTKEYSINSLOT 16384\r\nCLUSTER COUNTKEYSINSLOT -1\r\nCLUSTER COUNTKEYSINSLOT x\r\nCLUSTER GETKEYSINSLOT 1 -1\r\nCLUSTER GETKEYSINSLOT 16384 1\r\nCLUSTER GETKEYSINSLOT x 1\r\nCLUSTER GETKEYSINSLOT 1 x\r\n",
    "SET foo bar\r\nCLUSTER COUNTKEYSINSLOT 12182\r\nCLUSTER GETKEYSINSLOT 12182 10\r\nCLUSTER GETKEYSINSLOT 12182 0\r\nSET {foo}2 x\r\nCLUSTER COUNTKEYSINSLOT 12182\r\nCLUSTER COUNTKEYSINSLOT 0\r\n",
    // (GETKEYSINSLOT of several keys: Redis lists the newest first, we in key order.)
    "MGET a b\r\nDEL a b\r\nUNLINK a b\r\nEXISTS a b\r\nMSET a 1 b 2\r\nMSETNX a 1 b 2\r\nMSET {t}a 1 {t}b 2\r\nMGET {t}a {t}b\r\nDEL {t}a {t}b\r\nMSET a 1 b\r\nMGET a\r\n",
    "SELECT 0\r\nSELECT 1\r\nSELECT x\r\nREADONLY\r\nREADWRITE\r\nASKING\r\nREADONLY x\r\nINFO cluster\r\n",
    "HELLO 3\r\nCLUSTER SLOTS\r\nCLUSTER SHARDS\r\nCLUSTER INFO\r\nCLUSTER NODES\r\nINFO cluster\r\n",
];

#[test]
fn resp_cluster_replies_match_the_real_redis_cluster() {
    let dir = std::env::temp_dir().join(format!("zipcache-cluster-diff-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let nodes = dir.join("nodes.conf");
    let nodes = nodes.to_str().unwrap();
    let (port, mut real) = real_redis(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        nodes,
        "--cluster-announce-ip",
        "127.0.0.1",
    ]);
    let real_addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let ask = |script: &str| exchange(real_addr, script.as_bytes(), b"ECHO s\r\n", b"$1\r\ns\r\n");
    ask("CLUSTER ADDSLOTSRANGE 0 16383\r\n").unwrap();
    let started = std::time::Instant::now();
    while !String::from_utf8_lossy(&ask("CLUSTER INFO\r\n").unwrap()).contains("cluster_state:ok") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "redis cluster never ok"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ours = TestServer::with_options(ServerOptions {
        cluster_mode: zipcache_server::ClusterMode::Emulated,
        ..TestServer::options()
    });
    let ours_addr = ours.resp;
    compare_as(
        RESP_CLUSTER_CASES,
        (real_addr, &mut real),
        ours_addr,
        "FLUSHALL\r\n",
        ("ECHO sentinel\r\n", "$8\r\nsentinel\r\n"),
        |real_side, reply| {
            let port = if real_side { port } else { ours_addr.port() };
            normalize_node(&reply, port)
        },
    );
    drop(real);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cluster reply with the node's id, port and bus port set aside, and HELLO's version
/// and client id: replaced by `<id>`, `<port>`, `<bus>`, `<version>` and `<client>`, and
/// the length of the bulk or verbatim string holding a CLUSTER NODES line by `<len>`.
/// (The ports are ephemeral, above every slot number a case asks about.)
fn normalize_node(reply: &[u8], port: u16) -> Vec<u8> {
    let text = String::from_utf8_lossy(reply).into_owned();
    let mut lines: Vec<String> = Vec::new();
    for line in text.split("\r\n") {
        let mut line: String = line
            .split(' ')
            .map(|word| {
                // A verbatim string starts with its format.
                let (format, id) = word.split_at(if word.starts_with("txt:") { 4 } else { 0 });
                let hex = id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit());
                if hex {
                    format!("{format}<id>")
                } else {
                    word.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        if line == format!(":{port}") {
            line = ":<port>".into();
        }
        if let Some(at) = line.find(&format!(":{port}@")) {
            let bus = at + format!(":{port}@").len();
            let end = line[bus..].find(' ').map_or(line.len(), |n| bus + n);
            line.replace_range(at..end, ":<port>@<bus>");
            if let Some(header) = lines.last_mut().filter(|h| h.starts_with(['$', '='])) {
                header.replace_range(1.., "<len>");
            }
        }
        if line == "$40" {
            line = "$<idlen>".into();
        }
        lines.push(line);
    }
    let mut text = lines.join("\r\n");
    for version in ["$6\r\n7.0.15\r\n", "$5\r\n7.0.0\r\n"] {
        text = text.replace(version, "<version>\r\n");
    }
    if let Some(at) = text.find("$2\r\nid\r\n:") {
        let start = at + "$2\r\nid\r\n:".len();
        let digits = text[start..].find('\r').unwrap_or(0);
        text.replace_range(start..start + digits, "<client>");
    }
    text.into_bytes()
}
