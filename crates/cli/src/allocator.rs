//! The global allocator and how it is tuned, so that `zipcache serve`'s RSS stays within
//! its DRAM budget (docs/RESULTS.md, "RSS within budget").
//!
//! mimalloc v3 as configured by default held ~14 MiB more than necessary after a 64 MiB
//! fill, for two reasons, both measured:
//!
//! * It marks its 1 GiB arena `MADV_HUGEPAGE`, so on a kernel whose THP mode is `madvise`
//!   (or `always`) any touched 2 MiB of the arena becomes resident whole: 8 MiB before the
//!   first request, ~34 MiB of huge pages after the fill, +7 MiB RSS. The crate's `no_thp`
//!   feature drops the `madvise`; [`disable_thp`] also opts the server out of THP where the
//!   kernel would apply it unasked (`always`).
//! * It returns emptied pages to the OS only 1 s after they empty, and only when a later
//!   allocation gets round to it; a server that goes quiet keeps them resident. A purge
//!   delay of 0 returns them as they empty (−5 MiB after the fill), but a busy server then
//!   frees and faults the same pages back all the time: in the look-aside run of issue 11
//!   (SSD tier on, 16 s) 56 k `madvise` calls and 536 k page faults, each `madvise` also a
//!   TLB shootdown of the other core. [`PURGE_DELAY_MS`] of 10 cut them to 14 k and 114 k
//!   for +2 MiB of RSS after the 64 MiB fill (`scripts/rss.sh`, still within budget).
//!
//! C code linked in allocates with glibc's malloc, not mimalloc: zstd's dictionary
//! trainer (`ZDICT_trainFromBuffer`, run in the background while the server serves) takes
//! a few MiB of buffers of 64 KiB and more on its thread, and glibc kept them resident in
//! that thread's arena after they were freed: a 6.3 MiB anonymous mapping appeared within
//! two seconds of a 64 MiB server taking writes (`/proc/PID/smaps`, issue 20's adversarial
//! runs: most of the +17 MiB an amplified `get` seemed to cost). [`C_MMAP_THRESHOLD`]
//! gives such buffers their own mappings, unmapped when freed; the mapping no longer
//! appears.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in the `mi_option_t` enum of the vendored mimalloc (v3 and v2
/// alike); `libmimalloc-sys` does not name it. [`tests::purge_delay_is_set`] checks the
/// number against the option's documented default and its effect.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long an emptied page stays resident before mimalloc returns it (see the module doc).
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// C allocations (glibc malloc) this large and larger get a mapping of their own, returned
/// to the OS when freed (see the module doc). Fixed, it also stops glibc from raising the
/// threshold after each such free, as it does by default (up to 32 MiB).
#[cfg(target_env = "gnu")]
const C_MMAP_THRESHOLD: libc::c_int = 64 << 10;

/// Tunes the allocators for a long-running cache; call first thing in `main`.
pub fn configure() {
    // SAFETY: mi_option_set only stores a value in mimalloc's option table (an atomic
    // store); it takes no pointers, and MI_OPTION_PURGE_DELAY is within the enum.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    configure_c_malloc();
}

/// glibc's malloc, which the C code linked in uses (see the module doc).
fn configure_c_malloc() {
    // SAFETY: mallopt sets a glibc malloc parameter; it takes integers only.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, C_MMAP_THRESHOLD)
    };
}

/// Opts this process (and what it starts) out of transparent huge pages, so RSS counts the
/// 4 KiB pages the cache touches rather than the 2 MiB ones around them. Best effort: a
/// kernel without the call leaves THP as it was. Only `serve` calls it: the bench starts
/// peers (memcached, redis) whose figures must come from their own defaults.
pub fn disable_thp() {
    // SAFETY: prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) takes integers only and changes a flag
    // of this process's memory map; it touches no memory of ours.
    unsafe {
        libc::prctl(
            libc::PR_SET_THP_DISABLE,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_long;

    fn purge_delay() -> c_long {
        // SAFETY: mi_option_get only reads mimalloc's option table.
        unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
    }

    /// Held by each test here: they change how this process's memory is handled and
    /// measure its RSS, so run together one would upset another's figures.
    static PROCESS_MEMORY: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Resident anonymous bytes of this process.
    fn rss_anon() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .unwrap()
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap();
        kib * 1024
    }

    #[test]
    fn purge_delay_is_set() {
        let _alone = PROCESS_MEMORY.lock().unwrap_or_else(|e| e.into_inner());
        // Option 15 is the purge delay if it still holds its default of 1000 ms (or the
        // environment's MIMALLOC_PURGE_DELAY) before `configure`, and ours after.
        let expected = std::env::var("MIMALLOC_PURGE_DELAY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        let before = purge_delay();
        assert!(
            before == expected || before == PURGE_DELAY_MS,
            "option 15 = {before}"
        );
        configure();
        assert_eq!(purge_delay(), PURGE_DELAY_MS);

        // And it does what it is for: 64 MiB of freed 1 KiB blocks leave RSS while
        // allocations go on. The option's value is checked above; the window here is
        // generous (1,000 × 5 ms), as the purge waited past half a second in
        // `scripts/test.sh` on a loaded machine (the RSS unchanged at 100 × 5 ms).
        let base = rss_anon();
        let blocks: Vec<Box<[u8]>> = (0..65_536).map(|i| vec![i as u8; 1024].into()).collect();
        let full = rss_anon();
        assert!(full >= base + (48 << 20), "{base} -> {full}");
        drop(blocks);
        let returned = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            // A page of blocks emptied: mimalloc purges what is due when a page empties.
            let page: Vec<Box<[u8]>> = (0..512).map(|_| vec![0u8; 1024].into()).collect();
            drop(std::hint::black_box(page));
            rss_anon() < base + (16 << 20)
        });
        assert!(returned, "{base} -> {full} -> {}", rss_anon());
        #[cfg(target_env = "gnu")]
        freed_c_buffers_are_returned();
    }

    /// C buffers of 100 KiB freed among small ones still in use, as a C library's work
    /// leaves them: without the threshold glibc keeps all 6.4 MB resident.
    /// Run by `purge_delay_is_set` after its own measurement: two tests measuring the
    /// process's RSS at once would each count the other's allocations, and run first this
    /// one left mimalloc's purge unmeasurable there.
    #[cfg(target_env = "gnu")]
    fn freed_c_buffers_are_returned() {
        std::thread::spawn(|| {
            const BLOCK: usize = 100 << 10;
            let base = rss_anon();
            // SAFETY: each block is malloc'd, filled within its size and freed once; the
            // small ones are freed after the check.
            unsafe {
                let mut small = Vec::new();
                let mut big = Vec::new();
                for _ in 0..64 {
                    let block = libc::malloc(BLOCK);
                    assert!(!block.is_null());
                    libc::memset(block, 1, BLOCK);
                    big.push(block);
                    small.push(libc::malloc(64));
                }
                big.into_iter().for_each(|block| libc::free(block));
                let after = rss_anon();
                small.into_iter().for_each(|block| libc::free(block));
                assert!(after < base + (2 << 20), "{base} -> {after}");
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn thp_is_disabled() {
        let _alone = PROCESS_MEMORY.lock().unwrap_or_else(|e| e.into_inner());
        disable_thp();
        // SAFETY: as in disable_thp; PR_GET_THP_DISABLE returns the flag.
        let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(flag, 1);
    }
}
