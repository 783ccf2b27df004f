//! Meta-command state beyond value and flags: a CAS the client sets (`E`), invalidation
//! (`md I`, `ms I`: stale items served with `X`, one client at a time winning `W` while
//! the others see `Z`), `md x` (empty the value, keep the item and its CAS), and with the
//! engine setting `track_access` the fetched bit and last access time (`h`, `l`, `u`,
//! `me`'s `fetch=` and `la=`).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{Client, TestServer};
use zipcache::config::DeviceCompression;
use zipcache::{Clock, Config, SsdConfig};

/// The token after `letter` in a meta reply line (`c123` → "123"), if present.
fn flag(line: &str, letter: char) -> Option<String> {
    line.split(' ')
        .skip(1)
        .find_map(|f| f.strip_prefix(letter))
        .map(str::to_string)
}

fn has(line: &str, letter: char) -> bool {
    line.split(' ').skip(1).any(|f| f == letter.to_string())
}

#[test]
fn e_sets_the_cas_that_gets_and_compares_see() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("ms k 2 E973\r\nji\r\n", 1), ["HD"]);
    assert_eq!(
        flag(&c.ask("mg k c\r\n", 1)[0], 'c').as_deref(),
        Some("973")
    );
    assert_eq!(c.ask("gets k\r\n", 3)[0], "VALUE k 0 2 973");
    assert_eq!(c.ask("ms k 2 c C1 E5\r\nno\r\n", 1), ["EX c0"]);
    assert_eq!(c.ask("ms k 2 c C973 E4000\r\nlo\r\n", 1), ["HD c4000"]);
    assert_eq!(c.ask("cas k 0 0 1 4000\r\nx\r\n", 1), ["STORED"]);
    let cas = flag(&c.ask("mg k c\r\n", 1)[0], 'c').unwrap();
    assert_ne!(cas, "4000", "a write without E gets a fresh CAS");

    // md: the compare sees the client CAS, E sets the next one.
    assert_eq!(c.ask("ms d 2 E1234\r\nmE\r\n", 1), ["HD"]);
    assert_eq!(c.ask("md d C1234 E5678 I\r\n", 1), ["HD"]);
    assert_eq!(
        flag(&c.ask("mg d c\r\n", 1)[0], 'c').as_deref(),
        Some("5678")
    );

    // ma: E on autovivify and on increment; without E the CAS changes.
    let seeded = c.ask("ma n v N0 c E4321 J5\r\n", 2);
    assert_eq!(
        (flag(&seeded[0], 'c').as_deref(), seeded[1].as_str()),
        (Some("4321"), "5")
    );
    let bumped = c.ask("ma n C4321 c v\r\n", 2);
    assert_eq!(bumped[1], "6");
    assert_ne!(flag(&bumped[0], 'c').as_deref(), Some("4321"));
    let bumped = c.ask("ma n c v E8765\r\n", 2);
    assert_eq!(
        (flag(&bumped[0], 'c').as_deref(), bumped[1].as_str()),
        (Some("8765"), "7")
    );
}

/// `E` is the item's CAS in the engine, not an entry of the bounded annotation table:
/// filling that table far past its 64 Ki entries (a vivified item leaves one: its win
/// token went out) forgets none of the CASes clients chose.
#[test]
fn a_client_cas_outlives_a_full_annotation_table() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    let chosen = |i: usize| 1_000_000 + i;
    for i in 0..100 {
        let set = format!("ms e{i} 1 E{}\r\nx\r\n", chosen(i));
        assert_eq!(c.ask(&set, 1), ["HD"]);
    }
    const BATCH: usize = 1000;
    for batch in 0..4 * 64 {
        let fill: String = (0..BATCH)
            .map(|i| format!("mg f{batch}.{i} N30\r\n"))
            .collect();
        let replies = c.ask(&fill, BATCH);
        assert!(replies.iter().all(|r| r == "HD W"), "{replies:?}");
    }
    for i in 0..100 {
        let got = c.ask(&format!("mg e{i} c\r\n"), 1);
        assert_eq!(flag(&got[0], 'c'), Some(chosen(i).to_string()), "e{i}");
    }
}

#[test]
fn appends_compare_the_cas_too() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("ms a 2 MA C5000 T30\r\nhi\r\n", 1), ["NS"]);
    let cas = flag(&c.ask("ms a 2 T30 c\r\nho\r\n", 1)[0], 'c').unwrap();
    assert_eq!(c.ask("ms a 2 MA C1\r\nhi\r\n", 1), ["EX"]);
    assert_eq!(c.ask("ms a 2 MP C1\r\nhi\r\n", 1), ["EX"]);
    assert_eq!(
        c.ask(&format!("ms a 2 MA C{cas} s\r\nhi\r\n"), 1),
        ["HD s4"]
    );
    assert_eq!(c.ask("mg a v\r\n", 2)[1], "hohi");
}

#[test]
fn vivify_with_e_and_the_win_token() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    let created = c.ask("mg v s c v N30 t E9876\r\n", 2)[0].clone();
    assert!(has(&created, 'W') && !has(&created, 'Z'), "{created}");
    assert_eq!(flag(&created, 'c').as_deref(), Some("9876"));
    // The item exists now: E is ignored, and the token went out already.
    let again = c.ask("mg v c E5\r\n", 1)[0].clone();
    assert_eq!(flag(&again, 'c').as_deref(), Some("9876"));
    assert!(has(&again, 'Z') && !has(&again, 'W'), "{again}");
    // Filling it with the right CAS clears the token.
    assert_eq!(c.ask("ms v 2 C9876 T120\r\nmu\r\n", 1), ["HD"]);
    let filled = c.ask("mg v s v N30\r\n", 2)[0].clone();
    assert!(!has(&filled, 'W') && !has(&filled, 'Z'), "{filled}");
    // R: the first to see the item within the recache time wins.
    let recache = c.ask("mg v v N30 R130\r\n", 2)[0].clone();
    assert!(has(&recache, 'W'), "{recache}");
    let recache = c.ask("mg v v N30 R130\r\n", 2)[0].clone();
    assert!(has(&recache, 'Z') && !has(&recache, 'W'), "{recache}");
}

#[test]
fn invalidated_items_are_served_stale_until_rewritten() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("ms toinv 3\r\nmoo\r\n", 1), ["HD"]);
    let fresh = c.ask("mg toinv s c v\r\n", 2)[0].clone();
    assert!(!has(&fresh, 'X') && !has(&fresh, 'W') && !has(&fresh, 'Z'));
    let old_cas: u64 = flag(&fresh, 'c').unwrap().parse().unwrap();

    assert_eq!(c.ask("md toinv I T30\r\n", 1), ["HD"]);
    let stale = c.ask("mg toinv s c v t\r\n", 2);
    assert_eq!(stale[1], "moo", "an invalidated item keeps its value");
    assert!(has(&stale[0], 'X') && has(&stale[0], 'W'), "{}", stale[0]);
    let ttl: u64 = flag(&stale[0], 't').unwrap().parse().unwrap();
    assert!((1..=30).contains(&ttl), "md T re-dated it: {ttl}");
    let new_cas: u64 = flag(&stale[0], 'c').unwrap().parse().unwrap();
    assert_ne!(new_cas, old_cas, "invalidation bumps the CAS");

    // A set with a CAS newer than the item's fails; an older one under I stores the
    // value but leaves it stale, with its TTL and its sent token.
    assert_eq!(
        c.ask(&format!("ms toinv 1 I C{}\r\nf\r\n", new_cas + 1), 1),
        ["EX"]
    );
    assert_eq!(c.ask("ms toinv 1 I T90 C1\r\nf\r\n", 1), ["HD"]);
    let still = c.ask("mg toinv s t v\r\n", 2);
    assert_eq!(still[1], "f");
    assert!(
        has(&still[0], 'X') && has(&still[0], 'Z') && !has(&still[0], 'W'),
        "{}",
        still[0]
    );
    let ttl: u64 = flag(&still[0], 't').unwrap().parse().unwrap();
    assert!(ttl <= 30, "the stale set kept the TTL: {ttl}");

    // A plain set makes it fresh again.
    assert_eq!(c.ask("ms toinv 1\r\nn\r\n", 1), ["HD"]);
    let fresh = c.ask("mg toinv v\r\n", 2)[0].clone();
    assert!(
        !has(&fresh, 'X') && !has(&fresh, 'W') && !has(&fresh, 'Z'),
        "{fresh}"
    );
}

#[test]
fn md_x_empties_the_value_and_keeps_the_item() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("ms k 3 F7 T100\r\nabc\r\n", 1), ["HD"]);
    let cas = flag(&c.ask("mg k c\r\n", 1)[0], 'c').unwrap();
    assert_eq!(c.ask("md k x\r\n", 1), ["HD"]);
    let emptied = c.ask("mg k s f t c v\r\n", 2);
    assert_eq!(emptied[1], "", "the value is gone");
    assert_eq!(
        (
            flag(&emptied[0], 's'),
            flag(&emptied[0], 'f'),
            flag(&emptied[0], 't'),
            flag(&emptied[0], 'c'),
        ),
        (
            Some("0".into()),
            Some("0".into()),
            Some("-1".into()),
            Some(cas.clone())
        ),
        "client flags and TTL reset, CAS kept"
    );
    // x with I: emptied and stale.
    assert_eq!(c.ask("ms k 3\r\nabc\r\n", 1), ["HD"]);
    assert_eq!(c.ask("md k x I\r\n", 1), ["HD"]);
    let both = c.ask("mg k s v\r\n", 2)[0].clone();
    assert!(
        has(&both, 'X') && flag(&both, 's').as_deref() == Some("0"),
        "{both}"
    );
    assert_eq!(c.ask("md missing x\r\n", 1), ["NF"]);
}

/// Without `track_access` the engine keeps no last-access time or fetched bit, so `me`
/// leaves out memcached's `la=` and `fetch=` rather than make them up, and `mg` does not
/// report `h` or `l`.
#[test]
fn access_time_and_fetched_bit_are_never_made_up() {
    let server = TestServer::start();
    let mut c = Client::connect(server.memcached);
    assert_eq!(c.ask("ms k 2 T100\r\nhi\r\n", 1), ["HD"]);
    let cas = flag(&c.ask("mg k c\r\n", 1)[0], 'c').unwrap();
    let me = c.ask("me k\r\n", 1)[0].clone();
    let fields: Vec<&str> = me.split(' ').collect();
    assert_eq!(fields[..2], ["ME", "k"], "{me}");
    assert!(matches!(fields[2], "exp=100" | "exp=99"), "{me}");
    assert_eq!(
        fields[3..],
        [&format!("cas={cas}"), "cls=1", "size=3"],
        "{me}"
    );
    let hit = c.ask("mg k s h l t u\r\n", 1)[0].clone();
    assert!(matches!(hit.as_str(), "HD s2 t100" | "HD s2 t99"), "{hit}");
}

/// A clock the test moves, so `l` and `la=` are exact.
#[derive(Debug)]
struct TestClock(AtomicU64);

impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl TestClock {
    fn advance(&self, seconds: u64) {
        self.0.fetch_add(seconds * 1000, Ordering::Relaxed);
    }
}

/// The one-line reply to `request`.
fn one(c: &mut Client, request: &str) -> String {
    c.ask(request, 1).remove(0)
}

/// memcached's `metaget.t` checks of `h`, `u` and `l`, and what else reads and writes do
/// to the state, with `track_access` on: DRAM-only, and over an SSD tier (where reads
/// are prefetched before a request runs, a `u` read apart from one that marks).
#[test]
fn hit_flag_last_access_and_no_update_with_track_access() {
    let dir = std::env::temp_dir().join(format!("zipcache-meta-access-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ssd = SsdConfig {
        path: dir.join("ssd.bin"),
        size: 64 << 20,
        direct_io: false,
        device_compression: DeviceCompression::Emulate,
        logical_to_physical: 4.0,
    };
    for ssd in [None, Some(ssd)] {
        let clock = Arc::new(TestClock(AtomicU64::new(1_700_000_000_000)));
        let config = Config {
            dram_capacity: 64 << 20,
            ssd,
            track_access: true,
            clock: clock.clone(),
            ..Config::default()
        };
        let server = TestServer::on_engine(config, TestServer::options());
        let mut c = Client::connect(server.memcached);

        // metaget.t: "test hit-before? flag"
        assert_eq!(one(&mut c, "ms hitflag 3 T100\r\nhit\r\n"), "HD");
        assert_eq!(one(&mut c, "mg hitflag s t h\r\n"), "HD s3 t100 h0");
        assert_eq!(one(&mut c, "mg hitflag s t h\r\n"), "HD s3 t100 h1");
        // "test no-update flag"
        assert_eq!(one(&mut c, "ms noupdate 3 T100\r\nhit\r\n"), "HD");
        assert_eq!(one(&mut c, "mg noupdate s t u h\r\n"), "HD s3 t100 h0");
        assert_eq!(one(&mut c, "mg noupdate s t h\r\n"), "HD s3 t100 h0");
        assert_eq!(one(&mut c, "mg noupdate s t u h\r\n"), "HD s3 t100 h1");
        // "test last-access time"
        assert_eq!(one(&mut c, "ms la_test 2 T100\r\nla\r\n"), "HD");
        clock.advance(2);
        assert_eq!(one(&mut c, "mg la_test s t l\r\n"), "HD s2 t98 l2");
        clock.advance(3);
        assert_eq!(
            one(&mut c, "mg la_test l u\r\n"),
            "HD l3",
            "the mg before accessed it"
        );
        assert_eq!(
            one(&mut c, "me la_test\r\n").split(' ').nth(3),
            Some("la=3")
        );

        // A set starts afresh; get, gets, gat and touch all fetch; me does not.
        assert_eq!(one(&mut c, "set hitflag 0 0 1\r\nx\r\n"), "STORED");
        assert_eq!(one(&mut c, "mg hitflag h u\r\n"), "HD h0");
        let me = one(&mut c, "me hitflag\r\n");
        assert!(me.contains(" la=0 ") && me.contains(" fetch=no "), "{me}");
        assert_eq!(c.ask("get hitflag\r\n", 3)[2], "END");
        assert_eq!(one(&mut c, "mg hitflag h\r\n"), "HD h1");
        assert_eq!(one(&mut c, "set t 0 0 1\r\nx\r\n"), "STORED");
        assert_eq!(one(&mut c, "touch t 100\r\n"), "TOUCHED");
        assert_eq!(one(&mut c, "mg t h t\r\n"), "HD h1 t100");
        // mg T reports the state before it, then the item is fetched.
        assert_eq!(one(&mut c, "ms tt 1\r\nx\r\n"), "HD");
        clock.advance(4);
        assert_eq!(one(&mut c, "mg tt T30 h l t\r\n"), "HD h0 l4 t30");
        assert_eq!(one(&mut c, "mg tt h l u\r\n"), "HD h1 l0");
        // A vivified item is new and unfetched; the mg that made it fetches it.
        assert_eq!(one(&mut c, "mg viv N30 h l\r\n"), "HD h0 l0 W");
        assert_eq!(one(&mut c, "mg viv h u\r\n"), "HD h1 Z");
        // A delete forgets the state.
        assert_eq!(one(&mut c, "md hitflag\r\n"), "HD");
        assert_eq!(one(&mut c, "ms hitflag 1\r\nx\r\n"), "HD");
        assert_eq!(one(&mut c, "mg hitflag h\r\n"), "HD h0");
        server.stop();
    }
    let _ = std::fs::remove_dir_all(dir);
}
