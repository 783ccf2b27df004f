//! Each per-core runtime thread's own io_uring for the engine's SSD reads, and the task
//! that reaps its completions on that thread.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Reads in flight per runtime thread; more wait for a slot as synchronous reads.
const SSD_READS_IN_FLIGHT: u32 = 256;

/// Gives this runtime thread its own io_uring for the engine's SSD reads, watched by this
/// thread's reactor through `watch` (tokio's registration of the ring's eventfd): a
/// connection awaiting a GET's read costs no cross-thread wake-up (35–90 µs on our VMs),
/// and the thread serves its other connections meanwhile. Installing and watching are one
/// step: when either fails, the thread has no ring and its reads stay synchronous, for a
/// ring nobody watches would leave its reads in flight forever.
pub(super) fn install_ssd_ring(
    watch: impl FnOnce(OwnedFd) -> io::Result<AsyncFd<OwnedFd>>,
) -> Option<AsyncFd<OwnedFd>> {
    let eventfd = match zipcache_device::install_thread_ring_owned(SSD_READS_IN_FLIGHT) {
        Ok(eventfd) => eventfd,
        Err(e) => {
            eprintln!(
                "zipcache: warning: io_uring unavailable ({e}): SSD reads block their thread"
            );
            return None;
        }
    };
    match watch(eventfd) {
        Ok(watched) => Some(watched),
        Err(e) => {
            zipcache_device::uninstall_thread_ring();
            eprintln!(
                "zipcache: warning: cannot watch the io_uring eventfd ({e}): SSD reads block their thread"
            );
            None
        }
    }
}

/// Registers the ring's eventfd with this thread's tokio reactor.
pub(super) fn watch_eventfd(eventfd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `register_with_interest` requires the fd to stay open and the same while the
    // AsyncFd owns it; it owns the `OwnedFd` (a duplicate of the ring's eventfd), which
    // closes only when the AsyncFd is dropped.
    let registered = unsafe { AsyncFd::register_with_interest(eventfd, Interest::READABLE) };
    registered.map_err(|refused| refused.into_parts().1)
}

/// Completes this thread's SSD reads as the kernel does, on this thread. Should watching
/// the eventfd fail, the ring is uninstalled (its reads complete first): reads then stay
/// synchronous rather than wait for a reaper that is gone.
pub(super) async fn reap_ssd_reads(eventfd: AsyncFd<OwnedFd>) {
    while let Ok(mut ready) = eventfd.readable().await {
        // Cleared before reaping: a completion posted meanwhile makes it readable again.
        ready.clear_ready();
        zipcache_device::reap_thread_ring();
    }
    zipcache_device::uninstall_thread_ring();
    eprintln!("zipcache: warning: the io_uring eventfd failed: SSD reads block their thread");
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use zipcache_device::{AlignedBuf, BLOCK_BYTES, BlockDevice, FileDevice};

    use super::*;

    /// Runs `body` with a 16-block file device of bytes `7` on a fresh thread (its own ring
    /// state) inside a current-thread runtime, as a per-core runtime thread runs.
    fn on_a_runtime_thread(name: &str, body: impl AsyncFnOnce(&FileDevice) + Send + 'static) {
        let path = std::env::temp_dir().join(format!("zipcache-{name}-{}", std::process::id()));
        let device = FileDevice::open(&path, 16 * BLOCK_BYTES).expect("device");
        let mut blocks = AlignedBuf::zeroed(16);
        blocks.fill(7);
        device.write(0, &blocks).expect("fill");
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(body(&device));
        })
        .join()
        .expect("the runtime thread");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_ring_whose_eventfd_cannot_be_watched_is_uninstalled() {
        on_a_runtime_thread("unwatched-ring", async |device| {
            let injected = |_| Err(io::Error::other("injected: no reactor"));
            assert!(install_ssd_ring(injected).is_none());
            let read = device.read_async(3, AlignedBuf::zeroed(1));
            assert!(
                !read.is_in_flight(),
                "a read went to a ring that nobody reaps"
            );
            let (result, buf) = tokio::time::timeout(Duration::from_secs(10), read)
                .await
                .expect("the read completes");
            result.expect("read");
            assert!(buf.iter().all(|&b| b == 7));
        });
    }

    #[test]
    fn a_watched_ring_completes_reads_through_the_reaper() {
        on_a_runtime_thread("watched-ring", async |device| {
            let Some(eventfd) = install_ssd_ring(watch_eventfd) else {
                panic!("io_uring is available on the machines we test on");
            };
            let reaper = tokio::spawn(reap_ssd_reads(eventfd));
            let read = device.read_async(5, AlignedBuf::zeroed(1));
            assert!(read.is_in_flight());
            let (result, buf) = tokio::time::timeout(Duration::from_secs(10), read)
                .await
                .expect("the reaper completes the read");
            result.expect("read");
            assert!(buf.iter().all(|&b| b == 7));
            reaper.abort();
            zipcache_device::uninstall_thread_ring();
        });
    }
}
