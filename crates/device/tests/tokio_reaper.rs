//! The server's pattern: a `current_thread` runtime whose reaper task awaits the thread ring's
//! eventfd with `AsyncFd` and reaps, while request tasks await `read_async`.

use std::os::fd::BorrowedFd;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::task::{LocalSet, spawn_local};
use zipcache_device::{
    AlignedBuf, BLOCK_BYTES, BLOCK_SIZE, BlockDevice, FileDevice, install_thread_ring,
    reap_thread_ring, thread_ring_in_flight,
};

const BLOCKS: u64 = 1024;
const READS: u64 = 512;

fn block_byte(lba: u64) -> u8 {
    (lba % 251) as u8
}

#[test]
fn a_current_thread_runtime_completes_reads_through_its_reaper_task() {
    let dir = tempfile::tempdir().expect("temp dir");
    let device =
        Arc::new(FileDevice::open(dir.path().join("ssd"), BLOCKS * BLOCK_BYTES).expect("open"));
    let mut data = AlignedBuf::zeroed(BLOCKS as usize);
    for (lba, block) in (0..).zip(data.chunks_mut(BLOCK_SIZE)) {
        block.fill(block_byte(lba));
    }
    device.write(0, &data).expect("fill");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime");
    let most_in_flight = Rc::new(AtomicUsize::new(0));
    LocalSet::new().block_on(&runtime, async {
        let eventfd = install_thread_ring(64).expect("ring");
        // SAFETY: the ring keeps its eventfd open until this thread exits, after this borrow.
        let eventfd = unsafe { BorrowedFd::borrow_raw(eventfd) };
        // A descriptor of our own, so tokio's registration cannot outlive it.
        let eventfd = eventfd.try_clone_to_owned().expect("dup");
        // SAFETY: the `AsyncFd` owns `eventfd`, so it stays open and the same for its life.
        let eventfd = unsafe { AsyncFd::register_with_interest(eventfd, Interest::READABLE) }
            .expect("AsyncFd");
        let reaper = spawn_local(async move {
            loop {
                let mut ready = eventfd.readable().await.expect("eventfd");
                // Cleared before reaping: a completion posted after this sets it again.
                ready.clear_ready();
                reap_thread_ring();
            }
        });
        let readers: Vec<_> = (0..READS)
            .map(|i| {
                let (device, most_in_flight) = (Arc::clone(&device), Rc::clone(&most_in_flight));
                spawn_local(async move {
                    let lba = (i * 389) % BLOCKS;
                    let read = device.read_async(lba, AlignedBuf::zeroed(1));
                    most_in_flight.fetch_max(thread_ring_in_flight(), Ordering::Relaxed);
                    let (result, buf) = read.await;
                    result.expect("read");
                    assert!(buf.iter().all(|&b| b == block_byte(lba)), "lba {lba}");
                })
            })
            .collect();
        for reader in readers {
            reader.await.expect("reader");
        }
        reaper.abort();
    });
    assert_eq!(device.stats().reads, READS);
    assert!(
        most_in_flight.load(Ordering::Relaxed) > 1,
        "reads overlapped: at most {} in flight",
        most_in_flight.load(Ordering::Relaxed)
    );
    assert_eq!(thread_ring_in_flight(), 0);
}
