//! Keeping a peer's SSD file out of the page cache (`--drop-peer-page-cache`): memcached's
//! extstore reads its file through the page cache, so without this its "flash" reads are
//! mostly RAM reads while ZipCache's are the device's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the file's cached pages are dropped: pages a read brings in stay at most this
/// long (plus one pass), so nearly every extstore read goes to the device.
pub const DROP_EVERY: Duration = Duration::from_millis(50);

/// Writes `path`'s dirty pages back, then asks the kernel to drop all its cached pages
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`; pages under writeback would otherwise stay).
pub fn drop_cached_pages(path: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    file.sync_data()
        .map_err(|e| format!("{}: fdatasync: {e}", path.display()))?;
    // SAFETY: `file` is open for the whole call, so the descriptor is valid; fadvise only
    // reads its arguments.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(format!(
            "{}: posix_fadvise: {}",
            path.display(),
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok(())
}

/// A thread that drops a file's cached pages every [`DROP_EVERY`] until dropped itself.
pub struct PageCacheDropper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl PageCacheDropper {
    /// Starts dropping `path`'s pages (the file need not exist yet: a pass before it does
    /// is skipped).
    pub fn start(path: PathBuf) -> PageCacheDropper {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if path.exists() {
                    drop_cached_pages(&path)?;
                }
                std::thread::sleep(DROP_EVERY);
            }
            Ok(())
        });
        PageCacheDropper {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread; the error of a pass that failed, if one did.
    pub fn stop(mut self) -> Result<(), String> {
        self.halt()
    }

    fn halt(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| "the page-cache dropper panicked".to_string())?,
            None => Ok(()),
        }
    }
}

impl Drop for PageCacheDropper {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Bytes of `path` in the page cache, as util-linux's `fincore` (mincore(2)) says.
    fn resident_bytes(path: &Path) -> u64 {
        let out = std::process::Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES"])
            .arg(path)
            .output()
            .expect("fincore (util-linux) runs");
        assert!(out.status.success(), "fincore: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("fincore prints bytes")
    }

    fn cached_file(name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("zc-pagecache-{name}-{}", std::process::id()));
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&vec![7u8; 8 << 20]).unwrap();
        drop(file);
        std::fs::read(&path).unwrap();
        assert!(
            resident_bytes(&path) > 4 << 20,
            "a file just written and read is cached"
        );
        path
    }

    #[test]
    fn dropping_leaves_none_of_the_file_cached() {
        let path = cached_file("once");
        drop_cached_pages(&path).unwrap();
        let resident = resident_bytes(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(resident, 0);
    }

    #[test]
    fn the_dropper_keeps_dropping_pages_read_again() {
        let path = cached_file("timer");
        let dropper = PageCacheDropper::start(path.clone());
        std::thread::sleep(DROP_EVERY * 6);
        let first = resident_bytes(&path);
        std::fs::read(&path).unwrap();
        std::thread::sleep(DROP_EVERY * 6);
        let again = resident_bytes(&path);
        dropper.stop().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!((first, again), (0, 0));
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let err = drop_cached_pages(Path::new("/nonexistent/extstore.dat")).unwrap_err();
        assert!(err.contains("/nonexistent/extstore.dat"), "{err}");
    }
}
