//! The ZipCache engine, in-process.
//!
//! With `--in-process-gets overlapped` (the default) the GETs a batch lets go together
//! (see `EngineClient`) start through `ZipCache::get_item_async`: DRAM answers at once, and each GET that must
//! read the SSD submits its read to the bench thread's own io_uring (installed on the
//! thread's first batch, as the server installs one per runtime thread). The thread then
//! reaps that ring and polls the reads until all have answered, sleeping in `poll(2)` on
//! the ring's eventfd while none has completed.

use std::cell::OnceCell;
use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use zipcache::{Config, GetOptions, Item, SsdConfig, ZipCache};
use zipcache_device::uring::MAX_THREAD_RING_DEPTH;
use zipcache_device::{install_thread_ring, reap_thread_ring, thread_ring_in_flight};

use super::{Budget, Client, Engine, EngineClient, Holdings, Reply, Snapshot, Target};
use crate::procfs;

/// File of the SSD tier inside the data directory.
const SSD_FILE: &str = "zipcache-ssd.img";

/// Longest single wait for the ring's eventfd. A completion ends the wait at once; the
/// bound only makes the thread look again if a wake-up were ever lost.
const RING_WAIT: Duration = Duration::from_millis(100);

/// The engine, and how many reads each bench thread's ring keeps in flight.
pub struct ZipEngine {
    cache: ZipCache,
    /// A batch's GETs each have one read in flight at most, so a batch never needs more
    /// slots; reads beyond them would run synchronously.
    ring_depth: u32,
}

pub struct ZipTarget {
    /// What each bench thread's client is a copy of.
    clients: EngineClient<ZipEngine>,
    dram_only: bool,
    /// Whether this process's RSS is this target's (see `procfs::claim_own_rss`).
    own_rss: bool,
}

/// The engine `Config` for a budget: `--dram`, `--ssd-size`, `--data-dir`, then `--set`s.
pub fn config(budget: &Budget) -> Result<Config, String> {
    let mut config = Config {
        dram_capacity: budget.dram,
        ..Config::default()
    };
    if let Some(size) = budget.ssd {
        config.ssd = Some(SsdConfig {
            path: budget.data_dir.join(SSD_FILE),
            size,
            direct_io: true,
            device_compression: Default::default(),
            // Same logical size as every peer's disk; the emulated device only counts.
            logical_to_physical: 1.0,
        });
    }
    for (name, value) in &budget.settings {
        config
            .set(name, value)
            .map_err(|e| format!("--set {name}={value}: {e}"))?;
    }
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

impl ZipTarget {
    pub fn open(budget: &Budget) -> Result<ZipTarget, String> {
        let config = config(budget)?;
        let dram_only = config.ssd.is_none();
        let cache = ZipCache::open(config).map_err(|e| format!("zipcache: {e}"))?;
        let engine = Arc::new(ZipEngine {
            cache,
            ring_depth: budget.batch().clamp(1, MAX_THREAD_RING_DEPTH as usize) as u32,
        });
        Ok(ZipTarget {
            clients: EngineClient::of(engine, budget),
            dram_only,
            own_rss: procfs::claim_own_rss(),
        })
    }
}

impl Engine for ZipEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        self.cache.get(key).map_err(|e| e.to_string())
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
        self.cache.put(key, value, None).map_err(|e| e.to_string())
    }

    fn delete(&self, key: &[u8]) -> Result<bool, String> {
        self.cache.delete(key).map_err(|e| e.to_string())
    }

    fn scan(&self, from: &[u8], limit: usize) -> Result<Option<usize>, String> {
        self.cache
            .scan(from.., limit)
            .map(|items| Some(items.len()))
            .map_err(|e| e.to_string())
    }

    fn get_overlapped(&self, keys: &[&[u8]], start: Instant, replies: &mut Vec<(Reply, Duration)>) {
        let cache = &self.cache;
        // Without an SSD tier every GET answers at once: no ring to set up.
        let eventfd = if cache.has_ssd_tier() {
            thread_ring(self.ring_depth)
        } else {
            None
        };
        // Every GET starts before any read is waited for, so the batch's reads are in
        // flight together (and reach the kernel in one submission, as the server's do);
        // a reply's place is kept for each one still reading.
        let mut reading = Vec::new();
        let submit_at_end_of_batch = zipcache_device::batch_thread_ring_submissions();
        for key in keys {
            let mut get = cache.get_item_async(key, GetOptions::default());
            match get.take_ready() {
                Some(answer) => replies.push((reply(answer), start.elapsed())),
                None => {
                    reading.push((replies.len(), get));
                    replies.push((Reply::Value(None), Duration::ZERO));
                }
            }
        }
        drop(submit_at_end_of_batch);
        // The reads complete only when this thread reaps its ring, so no waker is needed:
        // after each reap every read still pending is polled again.
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            reading.retain_mut(|(at, get)| match Pin::new(get).poll(&mut cx) {
                Poll::Ready(answer) => {
                    replies[*at] = (reply(answer), start.elapsed());
                    false
                }
                Poll::Pending => true,
            });
            if reading.is_empty() {
                return;
            }
            reap_or_wait(eventfd);
        }
    }
}

fn reply(answer: zipcache::Result<Option<Item>>) -> Reply {
    match answer {
        Ok(item) => Reply::Value(item.map(|item| item.value)),
        Err(e) => Reply::Error(e.to_string()),
    }
}

thread_local! {
    /// The eventfd of this thread's ring, or `None` where io_uring is unavailable (the
    /// engine then reads synchronously inside `get_item_async`); set up on first use.
    static RING: OnceCell<Option<RawFd>> = const { OnceCell::new() };
}

/// Installs this thread's ring once (the device crate keeps it until the thread exits).
fn thread_ring(depth: u32) -> Option<RawFd> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    RING.with(|ring| {
        *ring.get_or_init(|| match install_thread_ring(depth) {
            Ok(eventfd) => Some(eventfd),
            Err(e) => {
                if !WARNED.swap(true, Relaxed) {
                    eprintln!(
                        "zipcache: io_uring unavailable ({e}): SSD reads block the bench thread"
                    );
                }
                None
            }
        })
    })
}

/// Completes what this thread's ring has finished; when nothing has, sleeps until the
/// kernel posts a completion (the eventfd turns readable) rather than spinning.
fn reap_or_wait(eventfd: Option<RawFd>) {
    loop {
        if reap_thread_ring() > 0 {
            return;
        }
        match eventfd {
            // `reap_thread_ring` empties the eventfd before it collects completions, so one
            // posted since then has made it readable again and the wait returns at once.
            Some(fd) if thread_ring_in_flight() > 0 => {
                zipcache_device::wait_thread_ring(fd, RING_WAIT);
            }
            // A read pending with nothing on this ring completes elsewhere (a device that
            // does not use the ring): look again shortly.
            _ => {
                std::thread::sleep(Duration::from_micros(50));
                return;
            }
        }
    }
}

impl Target for ZipTarget {
    fn name(&self) -> &str {
        "zipcache"
    }

    fn client(&self) -> Result<Box<dyn Client>, String> {
        Ok(Box::new(self.clients.clone()))
    }

    fn snapshot(&self) -> Result<Snapshot, String> {
        // Merged buffers and a drained device make the counts and V_NAND exact.
        let cache = &self.clients.engine.cache;
        cache
            .settle()
            .map_err(|e| format!("zipcache settle: {e}"))?;
        let s = cache.stats();
        let ssd = !self.dram_only;
        let engine_stats = serde_json::to_value(&s).map_err(|e| format!("zipcache stats: {e}"))?;
        Ok(Snapshot {
            dram_hits: Some(s.dram_hits),
            ssd_hits: Some(s.ssd_hits + s.large_hits),
            objects_resident: Some(s.objects_resident),
            server_cpu_seconds: None,
            host_bytes_written: ssd.then_some(s.v_host),
            held: Holdings {
                dram_bytes_used: Some(s.dram_used),
                compression_ratio_dram: Some(s.compression_ratio_dram),
                wa_host: s.wa_host,
                wr_nand: s.wr_nand,
                wa: s.wa,
                zeta: s.zeta,
                ssd_objects: ssd.then_some(s.ssd_objects),
                ssd_index_bytes: ssd.then_some(s.ssd_index_bytes),
                ssd_reads_per_ssd_get: s.ssd_reads_per_ssd_get,
                ssd_flash_bytes: s.ssd_flash_bytes,
                rss_bytes: procfs::own_rss(self.own_rss),
                engine_stats: Some(engine_stats),
                objects_per_node: None,
            },
        })
    }

    fn dram_only(&self) -> bool {
        self.dram_only
    }

    fn close(self: Box<Self>) -> Result<(), String> {
        let engine = Arc::try_unwrap(self.clients.engine)
            .map_err(|_| "zipcache: a client outlived the run".to_string())?;
        engine
            .cache
            .close()
            .map_err(|e| format!("zipcache close: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use indicatif::ProgressBar;

    use super::*;
    use crate::targets::InProcessGets;
    use crate::targets::test_support::{
        TempDir, budget, check_ordered_batches, fill, lookaside_workload,
    };

    const KEYS: u64 = 20_000;

    /// Keeps every object: the tests check answers, not what overload forgets.
    const KEEP_ALL: &[(&str, &str)] = &[("flush_wait_ms", "60000")];

    fn open(dir: &TempDir, gets: InProcessGets) -> ZipTarget {
        ZipTarget::open(&budget(dir, gets, KEEP_ALL)).expect("open")
    }

    #[test]
    fn overlapped_batches_read_the_ssd_in_flight_and_reply_in_order() {
        let dir = TempDir::new("zc-overlapped");
        let target = open(&dir, InProcessGets::Overlapped);
        let mut client = target.client().expect("client");
        fill(client.as_mut(), KEYS);
        let cache = &target.clients.engine.cache;
        cache.settle().expect("settle");
        assert!(cache.stats().ssd_objects > KEYS / 2, "{:?}", cache.stats());

        let checked = check_ordered_batches(client.as_mut(), KEYS, 40, true);
        let stats = cache.stats();
        assert!(checked.found > checked.gets / 2, "{checked:?}");
        assert!(stats.ssd_hits > 100, "{stats:?}");
        assert!(
            stats.ssd_async_reads > 100,
            "the batch's SSD reads went in flight: {stats:?}"
        );
        assert_eq!(stats.ssd_reads_in_flight, 0);
        drop(client);
        Box::new(target).close().expect("close");
    }

    #[test]
    fn serial_batches_use_the_synchronous_api_with_the_same_answers() {
        let dir = TempDir::new("zc-serial");
        let target = open(&dir, InProcessGets::Serial);
        let mut client = target.client().expect("client");
        fill(client.as_mut(), KEYS);
        let cache = &target.clients.engine.cache;
        cache.settle().expect("settle");

        let checked = check_ordered_batches(client.as_mut(), KEYS, 20, true);
        let stats = cache.stats();
        assert!(checked.found > checked.gets / 2, "{checked:?}");
        assert!(stats.ssd_hits > 100, "{stats:?}");
        assert_eq!(stats.ssd_async_reads, 0, "{stats:?}");
        drop(client);
        Box::new(target).close().expect("close");
    }

    #[test]
    fn lookaside_over_the_ssd_tier_verifies_every_value() {
        let dir = TempDir::new("zc-lookaside");
        let target = open(&dir, InProcessGets::Overlapped);
        let w = lookaside_workload(KEYS, 20_000);
        let run = crate::driver::lookaside(&target, &w, &ProgressBar::hidden()).expect("run");
        let counts = &run.counts;
        assert_eq!(counts.wrong_values, 0, "{counts:?}");
        assert_eq!(counts.errors, 0, "{:?}", counts.first_error);
        assert_eq!(counts.gets, 20_000);
        assert!(counts.hits > 0 && counts.misses > 0, "{counts:?}");
        let stats = target.clients.engine.cache.stats();
        assert!(
            stats.ssd_async_reads > 0,
            "look-aside GETs read the SSD in flight: {stats:?}"
        );
        Box::new(target).close().expect("close");
    }

    #[test]
    fn waiting_for_a_descriptor_ends_when_it_turns_readable() {
        use std::io::Write;
        use std::os::fd::AsRawFd;

        let (reader, mut writer) = std::io::pipe().expect("pipe");
        let start = Instant::now();
        assert!(!zipcache_device::wait_thread_ring(
            reader.as_raw_fd(),
            Duration::from_millis(20)
        ));
        assert!(start.elapsed() >= Duration::from_millis(20), "it waited");
        writer.write_all(b"x").expect("write");
        assert!(zipcache_device::wait_thread_ring(
            reader.as_raw_fd(),
            Duration::from_secs(10)
        ));
    }
}
