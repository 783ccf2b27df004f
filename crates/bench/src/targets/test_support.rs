//! What the in-process targets' tests share: a scratch directory, a small budget with an SSD
//! tier, a look-aside workload, and batches whose replies are checked against their order.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Budget, Client, InProcessGets, Reply, Request};
use crate::driver::Workload;
use crate::values::{Content, SizeDist, ValueGen};
use crate::workload::{HotPlacement, KeyChooser, Locality, OpMix, key_bytes};

pub const KEY_SIZE: usize = 16;

/// A directory removed when the test ends.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("zc-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A DRAM far smaller than the keys written, so most of them live on the SSD tier.
pub fn budget(dir: &TempDir, gets: InProcessGets, settings: &[(&str, &str)]) -> Budget {
    Budget {
        dram: 512 << 10,
        ssd: Some(64 << 20),
        data_dir: dir.0.clone(),
        mean_object: KEY_SIZE + 64,
        settings: settings
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect(),
        threads: 2,
        connections: 4,
        pipeline: 16,
        in_process_gets: gets,
        server_pid: None,
    }
}

/// 64-byte values, a quarter zeros: they compress little, so they fill the DRAM fast.
pub fn values() -> ValueGen {
    ValueGen {
        sizes: SizeDist::Fixed(64),
        content: Content::Synthetic { eta: 0.25 },
        seed: 7,
        overwrite_sizes: None,
    }
}

/// A short look-aside of GETs only (misses are filled after no backend delay).
pub fn lookaside_workload(keys: u64, ops: u64) -> Workload {
    Workload {
        keys,
        key_size: KEY_SIZE,
        chooser: KeyChooser::new(keys, Locality::Uniform, HotPlacement::Random, 3)
            .expect("chooser"),
        values: values(),
        mix: OpMix::new(1.0, 0.0, 0.0, 0.0).expect("mix"),
        scan_limit: 16,
        threads: 2,
        ops: Some(ops),
        duration: Duration::from_secs(120),
        warmup_ops: ops,
        backend_latency: Duration::ZERO,
        seed: 11,
        trace: None,
        trace_cursor: 0.into(),
        rate: None,
        read_back: false,
    }
}

/// Writes version 0 of keys `0..keys`, a batch at a time.
pub fn fill(client: &mut dyn Client, keys: u64) {
    let values = values();
    let ids: Vec<u64> = (0..keys).collect();
    let mut replies = Vec::new();
    for chunk in ids.chunks(client.batch_size()) {
        let requests: Vec<Request> = chunk
            .iter()
            .map(|&id| Request::Put(key_bytes(id, KEY_SIZE), values.value(id, 0)))
            .collect();
        replies.clear();
        client.execute(&requests, &mut replies).expect("fill");
        assert!(replies.iter().all(|(reply, _)| *reply == Reply::Stored));
    }
}

/// GETs keys `0..keys`, a batch at a time, and checks that every value found is version 0
/// (as `fill` wrote it); returns how many were found.
pub fn read_filled(client: &mut dyn Client, keys: u64) -> u64 {
    let values = values();
    let ids: Vec<u64> = (0..keys).collect();
    let mut replies = Vec::new();
    let mut found = 0;
    for chunk in ids.chunks(client.batch_size()) {
        let requests: Vec<Request> = chunk
            .iter()
            .map(|&id| Request::Get(key_bytes(id, KEY_SIZE)))
            .collect();
        replies.clear();
        client.execute(&requests, &mut replies).expect("read");
        for (&id, (reply, _)) in chunk.iter().zip(&replies) {
            let Reply::Value(value) = reply else {
                panic!("key {id}: GET answered {reply:?}");
            };
            if let Some(value) = value {
                assert_eq!(*value, values.value(id, 0), "key {id} is not version 0");
                found += 1;
            }
        }
    }
    found
}

/// What a batch check saw.
#[derive(Debug, Default)]
pub struct Checked {
    pub gets: u64,
    pub found: u64,
}

/// Runs `batches` batches over keys `0..keys` (filled at version 0, never written since by
/// anyone else) mixing GETs with overwrites and deletes — some of keys read earlier in the
/// same batch, some read again after — and checks every reply against the batch's order:
/// a value found is the key's latest version, a GET after a write of its key in the batch
/// sees that write (the new value, or nothing after a delete), and each latency lies
/// within the batch. A GET of a key not written in the batch may miss (the cache may have
/// dropped it). Without `deletes`, every write is an overwrite.
pub fn check_ordered_batches(
    client: &mut dyn Client,
    keys: u64,
    batches: u64,
    deletes: bool,
) -> Checked {
    let values = values();
    // The version each key holds, `None` once deleted.
    let mut current: Vec<Option<u64>> = vec![Some(0); keys as usize];
    let mut checked = Checked::default();
    let mut replies = Vec::new();
    for batch in 0..batches {
        let mut requests = Vec::new();
        // Per request: its key id, and for a GET the answer the order implies and whether
        // the batch wrote the key before it (then a miss is wrong too).
        let mut expect = Vec::new();
        let mut written = std::collections::HashSet::new();
        for step in 0..client.batch_size() as u64 {
            let n = batch * 1000 + step;
            match step % 8 {
                5 | 7 => {
                    // The key the step before read: its GET must not see this write, the
                    // GET right behind it must.
                    let id = ((n - 1) * 7919) % keys;
                    let key = key_bytes(id, KEY_SIZE);
                    let version = (step % 8 == 5 || !deletes).then_some(n + 1);
                    requests.push(match version {
                        Some(version) => Request::Put(key.clone(), values.value(id, version)),
                        None => Request::Delete(key.clone()),
                    });
                    current[id as usize] = version;
                    written.insert(id);
                    expect.push((id, None, false));
                    requests.push(Request::Get(key));
                    expect.push((id, Some(version), true));
                }
                _ => {
                    let id = (n * 7919) % keys;
                    requests.push(Request::Get(key_bytes(id, KEY_SIZE)));
                    expect.push((id, Some(current[id as usize]), written.contains(&id)));
                }
            }
        }
        replies.clear();
        let start = Instant::now();
        client.execute(&requests, &mut replies).expect("execute");
        let elapsed = start.elapsed();
        assert_eq!(replies.len(), requests.len(), "one reply per request");
        for (i, ((request, (reply, latency)), (id, want, must_match))) in
            requests.iter().zip(&replies).zip(&expect).enumerate()
        {
            assert!(
                *latency <= elapsed,
                "request {i}: {latency:?} > {elapsed:?}"
            );
            match (request, want) {
                (Request::Get(_), Some(want)) => {
                    checked.gets += 1;
                    let Reply::Value(found) = reply else {
                        panic!("batch {batch} request {i}: GET answered {reply:?}");
                    };
                    let want_value = want.map(|version| values.value(*id, version));
                    match found {
                        Some(value) => {
                            checked.found += 1;
                            assert_eq!(
                                Some(value),
                                want_value.as_ref(),
                                "batch {batch} request {i}: key {id} is not its latest version"
                            );
                        }
                        None => assert!(
                            !*must_match || want_value.is_none(),
                            "batch {batch} request {i}: key {id} missed after its write"
                        ),
                    }
                }
                (Request::Put(..), _) => assert_eq!(*reply, Reply::Stored),
                (Request::Delete(_), _) => {
                    assert!(matches!(reply, Reply::Deleted(_)), "{reply:?}");
                }
                other => panic!("unexpected request/expectation {other:?}"),
            }
        }
    }
    checked
}
