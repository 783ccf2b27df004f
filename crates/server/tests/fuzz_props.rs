//! Bounded property tests run in CI on stable (the cargo-fuzz targets in `fuzz/` go
//! deeper on nightly): whole protocol sessions fed arbitrary bytes, and valid commands
//! with mutations, in arbitrary read-sized pieces. A session may answer errors or close,
//! but never panic, and a valid request after garbage still gets an answer. The framing
//! checks (`check_*_framing`, shared with the fuzz targets) hold for every request.

use std::sync::{Arc, LazyLock};

use proptest::prelude::*;
use zipcache::{Config, ZipCache};
use zipcache_server::fuzzing::{
    check_memcached_binary_framing, check_memcached_framing, check_resp_framing, hybrid_engine,
    memcached_binary_request, memcached_session, memcached_session_with, new_hybrid_engine,
    options, resp_command_names, resp_request, resp_session, resp_session_with,
};
use zipcache_server::{Credentials, ServerOptions};

fn cache() -> Arc<ZipCache> {
    let config = Config {
        dram_capacity: 16 << 20,
        ..Config::default()
    };
    Arc::new(ZipCache::open(config).expect("engine"))
}

const MEMCACHED_SEEDS: &[&[u8]] = &[
    b"set k 0 0 5\r\nhello\r\n",
    b"get k k2 k3\r\n",
    b"gats 100 k\r\n",
    b"cas k 1 2 3 4 noreply\r\nabc\r\n",
    b"incr k 18446744073709551615\r\n",
    b"delete k 0 noreply\r\n",
    b"touch k -1\r\n",
    b"flush_all 0\r\n",
    b"stats settings\r\n",
    b"ms k 3 T10 F5 C7 MA N30 c k s O1 q\r\nabc\r\n",
    b"mg k v f t c k s O9 q N30 T40\r\n",
    b"ma k N0 J5 D3 MD T1 C1 v t c k q\r\n",
    b"md k C3 q k O2\r\n",
    b"me k\r\nmn\r\n",
    b"mg k T9223372036854775807 N-9223372036854775808 v t\r\n",
    b"ma k N9223372036854775807 J18446744073709551615 D18446744073709551615 v t\r\n",
    b"mg aGk= b k v\r\n",
    b"ms k 2 E973 I C5 c s k\r\nhi\r\n",
    b"md k E5 I x F3 T30 C1 q k O7\r\n",
    b"mg k E5 C7 N30 R3000 v c t s\r\n",
    b"ma k E18446744073709551615 N0 v c\r\n",
    b"cas foo 0 0 6 \r\nbarva2\r\n",
    b"prepend k x 0 2 noreply\r\nhi\r\n",
    b"set k 0 0 2147483647\r\n",
    b"verbosity x noreply\r\n",
    b" \r\n",
    b"get foo b\r\nmg hi v\r\nset a 0 0 1\r\nx\r\nget a\r\nmg aA v u\r\n",
];

/// Operator and introspection commands: their replies depend on timing or on what else
/// the read held (`watch` refuses to follow pipelined commands), so they are fuzzed for
/// panics and framing, not compared across read boundaries.
const OPERATOR_SEEDS: &[&[u8]] = &[
    b"lru_crawler metadump all\r\n",
    b"lru_crawler mgdump 1,2\r\n",
    b"lru_crawler crawl hash\r\n",
    b"lru_crawler tocrawl 5\r\nlru_crawler sleep 100\r\n",
    b"lru_crawler disable\r\nlru_crawler enable\r\n",
    b"stats cachedump 1 2\r\n",
    b"stats detail on\r\nstats detail dump\r\n",
    b"stats conns\r\n",
    b"stats reset\r\n",
    b"watch fetchers mutations evictions\r\n",
    b"shutdown graceful\r\n",
    b"cache_memlimit 100 noreply\r\n",
    b"refresh_certs\r\n",
];

/// Binary protocol requests: every opcode with valid extras, quiet forms, CAS, SASL,
/// and lengths at their limits.
static BINARY_SEEDS: LazyLock<&'static [&'static [u8]]> = LazyLock::new(|| {
    let set_extras = [0, 0, 0, 7, 0, 0, 0, 100];
    let arith = [&5u64.to_be_bytes()[..], &10u64.to_be_bytes(), &[0, 0, 0, 0]].concat();
    let packets = vec![
        memcached_binary_request(0x01, &set_extras, b"k", b"hello", 1, 0),
        memcached_binary_request(0x11, &set_extras, b"k", b"quiet", 2, 0),
        memcached_binary_request(0x02, &set_extras, b"k", b"v", 3, 99),
        memcached_binary_request(0x00, &[], b"k", &[], 4, 0),
        memcached_binary_request(0x0d, &[], b"k", &[], 5, 0),
        memcached_binary_request(0x09, &[], b"missing", &[], 6, 0),
        memcached_binary_request(0x05, &arith, b"n", &[], 7, 0),
        memcached_binary_request(0x16, &arith, b"n", &[], 8, 0),
        memcached_binary_request(0x0e, &[], b"k", b"!", 9, 0),
        memcached_binary_request(0x04, &[], b"k", &[], 10, 5),
        memcached_binary_request(0x1c, &[0, 0, 0, 9], b"k", &[], 11, 0),
        memcached_binary_request(0x24, &[0, 0, 0, 9], b"k", &[], 12, 0),
        memcached_binary_request(0x08, &[0, 0, 0, 1], &[], &[], 13, 0),
        memcached_binary_request(0x10, &[], b"settings", &[], 14, 0),
        memcached_binary_request(0x10, &[], b"detail dump", &[], 15, 0),
        memcached_binary_request(0x0a, &[], &[], &[], 16, 0),
        memcached_binary_request(0x0b, &[], &[], &[], 17, 0),
        memcached_binary_request(0x21, &[], b"PLAIN", b"\0foo\0bar", 18, 0),
        memcached_binary_request(0x22, &[], b"PLAIN", b"x", 19, 0),
        memcached_binary_request(0x20, &[], &[], &[], 20, 0),
        memcached_binary_request(0x21, &[], b"CRAM-MD5", &[], 25, 0),
        memcached_binary_request(
            0x22,
            &[],
            b"CRAM-MD5",
            b"foo 0123456789abcdef0123456789abcdef",
            26,
            0,
        ),
        memcached_binary_request(0x1b, &[0; 4], &[], &[], 21, 0),
        memcached_binary_request(0x00, &[], &[b'k'; 250], &[], 22, 0),
        memcached_binary_request(0x01, &set_extras, b"big", &[0x80; 3000], 23, 0),
        memcached_binary_request(0x17, &[], &[], &[], 24, 0),
    ];
    let leaked: Vec<&'static [u8]> = packets
        .into_iter()
        .map(|packet| &*Box::leak(packet.into_boxed_slice()))
        .collect();
    Box::leak(leaked.into_boxed_slice())
});

/// A NOOP first, so that the session speaks binary whatever follows; with users, a SASL
/// login instead, so that what follows runs logged in (an unauthenticated request is
/// refused and hung up on).
fn binary_session(body: &[u8], chunk: usize, users: bool) -> Vec<u8> {
    binary_session_on(cache(), body, chunk, users)
}

fn binary_session_on(engine: Arc<ZipCache>, body: &[u8], chunk: usize, users: bool) -> Vec<u8> {
    let mut input = if users {
        memcached_binary_request(0x21, &[], b"PLAIN", b"\0foo\0bar", 0, 0)
    } else {
        memcached_binary_request(0x0a, &[], &[], &[], 0, 0)
    };
    let first = input[1];
    input.extend_from_slice(body);
    let options = ServerOptions {
        users: users.then(|| Arc::new(Credentials::parse(b"foo:bar").unwrap())),
        max_value_size: 1024,
        ..options()
    };
    let out = memcached_session_with(engine, &options, &input, chunk);
    assert_eq!(
        out[..8],
        [0x81, first, 0, 0, 0, 0, 0, 0],
        "the first request succeeds"
    );
    out
}

/// Binary responses with their CAS fields zeroed.
fn without_binary_cas(mut replies: Vec<u8>) -> Vec<u8> {
    let mut at = 0;
    while at + 24 <= replies.len() {
        let body = u32::from_be_bytes(replies[at + 8..at + 12].try_into().unwrap()) as usize;
        replies[at + 16..at + 24].fill(0);
        at += 24 + body;
    }
    replies
}

/// An unauthenticated session's inputs (the users are `foo:bar`).
const AUTH_SEEDS: &[&[u8]] = &[
    b"set a 0 0 7\r\nfoo bar\r\n",
    b"set a 0 0 7\r\nfoo bab\r\n",
    b"set a 0 0 2\r\nhi\r\n",
    b"set a 0 0 16385\r\n",
    b"set a 0 0 3\r\nabcXX",
    b"get foo\r\n",
    b"set k 0 0 5\r\nhello\r\nget k\r\n",
];

fn authenticating(input: &[u8], chunk: usize) -> Vec<u8> {
    let options = ServerOptions {
        users: Some(Arc::new(Credentials::parse(b"foo:bar").unwrap())),
        ..options()
    };
    memcached_session_with(cache(), &options, input, chunk)
}

const RESP_SEEDS: &[&[u8]] = &[
    b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n",
    b"*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n",
    b"*6\r\n$4\r\nSCAN\r\n$1\r\n0\r\n$5\r\nMATCH\r\n$3\r\n*[a\r\n$5\r\nCOUNT\r\n$1\r\n5\r\n",
    b"*5\r\n$7\r\nZCRANGE\r\n$1\r\n-\r\n$1\r\n+\r\n$5\r\nLIMIT\r\n$1\r\n3\r\n",
    b"SET \"a\\x41\" 'b'\r\nGET aA\r\n",
    b"*4\r\n$6\r\nEXPIRE\r\n$1\r\nk\r\n$2\r\n-1\r\n$2\r\nGT\r\n",
    b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$1\r\n*\r\n",
    b"SET k 9223372036854775807\r\nINCRBY k 9223372036854775807\r\nDECRBY k -9223372036854775808\r\n",
    b"PEXPIRE k 9223372036854775807\r\nEXPIRE k -9223372036854775808\r\n",
    b"INCRBYFLOAT k 1e308\r\nINCRBYFLOAT k 1e308\r\nINCRBYFLOAT k -inf\r\n",
    b"MSETNX a 1 b\r\nMSETNX a 1 b 2\r\n",
    b"EXPIREAT k 9223372036854775807 NX XX\r\nPEXPIRETIME k\r\nEXPIRETIME k\r\n",
    b"SETRANGE k 1048570 abcdefghij\r\nGETRANGE k -9223372036854775808 9223372036854775807\r\n",
    b"KEYS *\r\nKEYS k\xff*\r\nKEYS [\r\n",
    b"CLIENT SETINFO lib-name x\r\nCLIENT ID x\r\nCONFIG GET\r\nCOMMAND COUNT\r\n",
    b"FLUSHALL ASYNC\r\nFLUSHDB x\r\n*1\r\n$7\r\nflushdb\r\n",
    b"GET k\r\nMGET k b aA\r\nSET a x\r\nGET a\r\nDEL hi\r\nMGET a hi\r\n",
    b"HSET h a 1 b 2\r\nHGET h a\r\nHMGET h a z\r\nHGETALL h\r\nHLEN h\r\nGET h\r\nHSET k f v\r\n",
    b"HINCRBY h n 9223372036854775807\r\nHINCRBY h n 1\r\nHINCRBYFLOAT h f 1e308\r\nHSTRLEN h n\r\n",
    b"HDEL h a a z\r\nHEXISTS h b\r\nHKEYS h\r\nHVALS h\r\nHSETNX h b 3\r\nHRANDFIELD h 5 WITHVALUES\r\n",
    b"HSCAN h 0 MATCH * COUNT 1\r\nHSCAN h 99 COUNT 1 NOVALUES\r\nTYPE h\r\nSCAN 0 TYPE hash\r\n",
    b"HPERSIST h FIELDS 1 a\r\nHTTL h FIELDS 2 a z\r\nHEXPIRE h -1 FIELDS 1 a\r\nHEXPIRE h 10 FIELDS 2 a\r\n",
    b"HGETDEL h FIELDS 1 a\r\nHSETEX h FNX KEEPTTL FIELDS 1 q w\r\nHGETEX h PERSIST FIELDS 1 q\r\n",
    b"HSET h a 1\r\nRENAME h g\r\nRENAMENX g k\r\nRENAME nokey x\r\nHGETALL g\r\nRENAME k k\r\n",
];

/// RESP requests whose replies depend on when they run (a 10 ms expiry, expiry times
/// set relative to now, TTLs left) or on
/// the connection (the client id HELLO reports), so they are fuzzed but not compared
/// between two runs.
const RESP_VARYING_SEEDS: &[&[u8]] = &[
    b"CONFIG SET maxmemory 1mb maxmemory-policy allkeys-lru\r\nCONFIG SET maxmemory 64MB\r\n",
    b"GETEX k PXAT 1 PERSIST\r\nGETEX k EX 10 EX 10\r\n",
    b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n",
    b"AUTH default pw\r\nAUTH pw\r\nHELLO 3 AUTH default pw SETNAME x\r\n",
    b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nPX\r\n$2\r\n10\r\n",
    b"SET k v EXAT 9223372036854775\r\nTTL k\r\nPTTL k\r\n",
    b"HSET h a 1\r\nHPEXPIRE h 10 FIELDS 1 a\r\nHPTTL h FIELDS 1 a\r\nHGETEX h EX 100 FIELDS 1 a\r\n",
];

/// Any RESP seed, mutated.
fn mutated_resp() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![5 => mutated(RESP_SEEDS), 2 => mutated(RESP_VARYING_SEEDS)]
}

/// Arguments the typed parser treats specially: numbers at their limits, every option
/// keyword, patterns, and bytes that are none of those.
const ARGUMENT_WORDS: &[&[u8]] = &[
    b"k",
    b"v",
    b"",
    b"0",
    b"1",
    b"-1",
    b"10",
    b"1.5",
    b"1e400",
    b"inf",
    b"nan",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"18446744073709551616",
    b"EX",
    b"PX",
    b"EXAT",
    b"PXAT",
    b"KEEPTTL",
    b"PERSIST",
    b"NX",
    b"XX",
    b"GT",
    b"LT",
    b"GET",
    b"MATCH",
    b"COUNT",
    b"TYPE",
    b"LIMIT",
    b"*",
    b"k*",
    b"[a-",
    b"\\",
    b"-",
    b"+",
    b"AUTH",
    b"SETNAME",
    b"default",
    b"pw",
    b"2",
    b"3",
    b"ID",
    b"GETNAME",
    b"SETINFO",
    b"LIB-NAME",
    b"ASYNC",
    b"DOCS",
    b"\xff\x00",
];

/// A multi-bulk request: a real command name (any case) and arguments from the words.
fn typed_request() -> impl Strategy<Value = Vec<u8>> {
    let names = resp_command_names();
    (
        0..names.len(),
        any::<bool>(),
        prop::collection::vec(0..ARGUMENT_WORDS.len(), 0..7),
    )
        .prop_map(move |(name, upper, words)| {
            let name = if upper {
                names[name].to_ascii_uppercase()
            } else {
                names[name].to_string()
            };
            let mut args = vec![name.as_bytes()];
            args.extend(words.iter().map(|&w| ARGUMENT_WORDS[w]));
            resp_request(&args)
        })
}

/// A seed command with a few bytes overwritten, inserted or removed.
fn mutated(seeds: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<u8>> {
    (
        0..seeds.len(),
        prop::collection::vec((any::<usize>(), any::<u8>(), 0..3u8), 0..6),
    )
        .prop_map(move |(seed, edits)| {
            let mut bytes = seeds[seed].to_vec();
            for (at, byte, kind) in edits {
                let at = at % (bytes.len() + 1);
                match kind {
                    0 if at < bytes.len() => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    _ if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    _ => {}
                }
            }
            bytes
        })
}

/// Replies with CAS values (which differ between two engines) blanked out.
fn without_cas(replies: &[u8]) -> String {
    let text = String::from_utf8_lossy(replies);
    let mut blanked = String::new();
    let mut digits = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        // CAS values are long; sizes, flags and counters in the seeds are short.
        blanked.push_str(if digits.len() >= 8 { "#" } else { &digits });
        digits.clear();
        blanked.push(c);
    }
    blanked
}

/// RESP replies with each SCAN cursor (a number only the server that gave it knows,
/// `core/cursors.rs`) named by the order it first appears in: two servers that walk
/// alike give the same text.
fn with_cursors_numbered(replies: &[u8]) -> String {
    let text = String::from_utf8_lossy(replies).into_owned();
    let mut seen: Vec<String> = Vec::new();
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("*2\r\n$") {
        out.push_str(&rest[..at + 5]);
        rest = &rest[at + 5..];
        let Some((len, after)) = rest.split_once("\r\n") else {
            break;
        };
        let cursor = len.parse::<usize>().ok().and_then(|n| after.get(..n));
        match cursor {
            Some(cursor) if after[cursor.len()..].starts_with("\r\n*") && cursor != "0" => {
                let n = seen.iter().position(|c| c == cursor).unwrap_or_else(|| {
                    seen.push(cursor.to_string());
                    seen.len() - 1
                });
                out.push_str(&format!("cursor-{n}"));
                rest = &after[cursor.len()..];
            }
            _ => {}
        }
    }
    out.push_str(rest);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn memcached_sessions_survive_arbitrary_bytes(input in prop::collection::vec(any::<u8>(), 0..2048), chunk in 1..64usize) {
        memcached_session(cache(), &input, chunk);
    }

    #[test]
    fn resp_sessions_survive_arbitrary_bytes(input in prop::collection::vec(any::<u8>(), 0..2048), chunk in 1..64usize) {
        resp_session(cache(), &input, chunk, None);
    }

    #[test]
    fn memcached_sessions_survive_mutated_commands(cmds in prop::collection::vec(prop_oneof![3 => mutated(MEMCACHED_SEEDS), 1 => mutated(OPERATOR_SEEDS)], 1..8), chunk in 1..64usize) {
        memcached_session(cache(), &cmds.concat(), chunk);
    }

    #[test]
    fn resp_sessions_survive_mutated_commands(cmds in prop::collection::vec(mutated_resp(), 1..8), chunk in 1..64usize, flush_all_enabled in any::<bool>()) {
        let options = ServerOptions { flush_all_enabled, ..options() };
        resp_session_with(cache(), &options, &cmds.concat(), chunk);
    }

    /// Every command with arguments it may or may not accept, with and without a
    /// password to log in with: each request gets exactly one reply, never a panic.
    #[test]
    fn typed_resp_commands_answer_every_argument_list(requests in prop::collection::vec(typed_request(), 1..12), password in any::<bool>()) {
        let requirepass = password.then_some("pw");
        let input = requests.concat();
        let replies = resp_session(cache(), &input, input.len(), requirepass);
        prop_assert!(!replies.is_empty());
        let closed = requests.iter().any(|r| r.len() > 12 && r[8..12].eq_ignore_ascii_case(b"quit"));
        if !closed {
            // One more request is still answered: nothing desynchronised the stream.
            let mut more = input.clone();
            more.extend_from_slice(b"*2\r\n$4\r\nECHO\r\n$4\r\ndone\r\n");
            let replies = resp_session(cache(), &more, more.len(), requirepass);
            let expected: &[u8] = if password { b"-NOAUTH Authentication required.\r\n" } else { b"$4\r\ndone\r\n" };
            let authenticated = requests.iter().any(|r| {
                let text = String::from_utf8_lossy(r).to_ascii_lowercase();
                text.contains("\r\nauth\r\n") || text.contains("\r\nhello\r\n")
            });
            if !authenticated || !password {
                prop_assert!(replies.ends_with(expected), "{}", String::from_utf8_lossy(&replies));
            }
        }
    }

    #[test]
    fn memcached_framing_holds_for_any_bytes(input in prop::collection::vec(any::<u8>(), 0..2048)) {
        check_memcached_framing(&input);
    }

    #[test]
    fn memcached_framing_holds_for_mutated_commands(cmds in prop::collection::vec(prop_oneof![mutated(MEMCACHED_SEEDS), mutated(OPERATOR_SEEDS), mutated(AUTH_SEEDS)], 1..8)) {
        check_memcached_framing(&cmds.concat());
    }

    #[test]
    fn resp_framing_holds_for_any_bytes(input in prop::collection::vec(any::<u8>(), 0..2048), authenticated in any::<bool>(), flush in any::<bool>()) {
        check_resp_framing(&cache(), &input, authenticated, flush);
    }

    #[test]
    fn resp_framing_holds_for_mutated_commands(cmds in prop::collection::vec(mutated_resp(), 1..8), authenticated in any::<bool>(), flush in any::<bool>()) {
        check_resp_framing(&cache(), &cmds.concat(), authenticated, flush);
    }

    #[test]
    fn authenticating_sessions_survive_mutated_attempts(cmds in prop::collection::vec(mutated(AUTH_SEEDS), 1..8), chunk in 1..64usize) {
        let input = cmds.concat();
        prop_assert_eq!(authenticating(&input, input.len().max(1)), authenticating(&input, chunk));
    }

    /// Whatever CAS a client chooses, it is the one reported until the next write.
    #[test]
    fn a_client_cas_is_reported_back(cas in any::<u64>()) {
        let input = format!("ms k 1 E{cas}\r\nx\r\nmg k c\r\ngets k\r\n");
        let replies = memcached_session(cache(), input.as_bytes(), 7);
        let expected = format!("HD\r\nHD c{cas}\r\nVALUE k 0 1 {cas}\r\nx\r\nEND\r\n");
        prop_assert_eq!(String::from_utf8_lossy(&replies), expected);
    }

    #[test]
    fn binary_sessions_survive_arbitrary_bytes(input in prop::collection::vec(any::<u8>(), 0..2048), chunk in 1..64usize, users in any::<bool>()) {
        binary_session(&input, chunk, users);
    }

    #[test]
    fn binary_sessions_survive_mutated_commands(cmds in prop::collection::vec(mutated(*BINARY_SEEDS), 1..8), chunk in 1..64usize, users in any::<bool>()) {
        binary_session(&cmds.concat(), chunk, users);
    }

    #[test]
    fn binary_framing_holds_for_any_bytes(input in prop::collection::vec(any::<u8>(), 0..2048)) {
        check_memcached_binary_framing(&input);
    }

    #[test]
    fn binary_framing_holds_for_mutated_commands(cmds in prop::collection::vec(mutated(*BINARY_SEEDS), 1..8)) {
        check_memcached_binary_framing(&cmds.concat());
    }

    /// Every valid binary request is answered the same in pieces of any size as in one
    /// read (CAS values aside: the two engines number their writes alike).
    #[test]
    fn binary_replies_do_not_depend_on_read_boundaries(seeds in prop::collection::vec(0..BINARY_SEEDS.len(), 1..10), chunk in 1..32usize) {
        let input: Vec<u8> = seeds.iter().flat_map(|&i| BINARY_SEEDS[i].to_vec()).collect();
        let whole = without_binary_cas(binary_session(&input, input.len() + 24, false));
        let pieces = without_binary_cas(binary_session(&input, chunk, false));
        prop_assert_eq!(whole, pieces);
    }

    /// Pieces of any size give the same replies as one read: framing is resumable.
    #[test]
    fn replies_do_not_depend_on_read_boundaries(seeds in prop::collection::vec(0..MEMCACHED_SEEDS.len(), 1..10), chunk in 1..32usize) {
        let input: Vec<u8> = seeds.iter().flat_map(|&i| MEMCACHED_SEEDS[i].to_vec()).collect();
        let whole = without_cas(&memcached_session(cache(), &input, input.len()));
        let pieces = without_cas(&memcached_session(cache(), &input, chunk));
        prop_assert_eq!(whole, pieces);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Over an SSD tier, GETs go in flight and the requests behind them are read ahead:
    /// mutated requests must not panic there either (one engine for every case).
    #[test]
    fn sessions_over_the_ssd_tier_survive_mutated_commands(memcached in prop::collection::vec(prop_oneof![3 => mutated(MEMCACHED_SEEDS), 1 => mutated(OPERATOR_SEEDS)], 1..8), resp in prop::collection::vec(mutated_resp(), 1..8), chunk in 1..64usize) {
        memcached_session(hybrid_engine(), &memcached.concat(), chunk);
        resp_session(hybrid_engine(), &resp.concat(), chunk, None);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Over an SSD tier, a pipeline read in one piece has its GETs read ahead past other
    /// requests, and in small pieces it has none: the replies must be the same.
    #[test]
    fn read_ahead_over_the_ssd_tier_answers_as_one_request_at_a_time(memcached in prop::collection::vec(0..MEMCACHED_SEEDS.len(), 1..12), resp in prop::collection::vec(0..RESP_SEEDS.len(), 1..12), chunk in 1..8usize) {
        let input: Vec<u8> = memcached.iter().flat_map(|&i| MEMCACHED_SEEDS[i].to_vec()).collect();
        let whole = without_cas(&memcached_session(new_hybrid_engine(), &input, input.len()));
        let pieces = without_cas(&memcached_session(new_hybrid_engine(), &input, chunk));
        prop_assert_eq!(whole, pieces);
        let input: Vec<u8> = resp.iter().flat_map(|&i| RESP_SEEDS[i].to_vec()).collect();
        let whole = resp_session(new_hybrid_engine(), &input, input.len(), None);
        let pieces = resp_session(new_hybrid_engine(), &input, chunk, None);
        prop_assert_eq!(with_cursors_numbered(&whole), with_cursors_numbered(&pieces));
    }

    /// The same for binary pipelines: their GETs are read ahead too.
    #[test]
    fn binary_read_ahead_over_the_ssd_tier_answers_as_one_request_at_a_time(seeds in prop::collection::vec(0..BINARY_SEEDS.len(), 1..12), chunk in 1..8usize) {
        let input: Vec<u8> = seeds.iter().flat_map(|&i| BINARY_SEEDS[i].to_vec()).collect();
        let whole = binary_session_on(new_hybrid_engine(), &input, input.len() + 24, false);
        let pieces = binary_session_on(new_hybrid_engine(), &input, chunk, false);
        prop_assert_eq!(without_binary_cas(whole), without_binary_cas(pieces));
    }
}

#[test]
fn a_valid_request_after_garbage_is_answered() {
    let replies = memcached_session(cache(), b"\x00\xff garbage\r\nmn\r\n", 3);
    assert!(
        replies.ends_with(b"MN\r\n"),
        "{}",
        String::from_utf8_lossy(&replies)
    );
    let replies = resp_session(cache(), b"garbage here\r\nPING\r\n", 5, None);
    assert!(
        replies.ends_with(b"+PONG\r\n"),
        "{}",
        String::from_utf8_lossy(&replies)
    );
}
