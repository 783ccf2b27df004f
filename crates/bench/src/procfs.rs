//! What Linux's /proc says about a process: resident memory, bytes written, CPU time.

pub use zipcache::stats::rss_bytes;

/// Whether the in-process target being opened is the first of this process, the only one
/// whose figure the process's RSS is: memory freed by an earlier target is not reliably
/// returned to the OS, so later ones would be charged for it.
pub fn claim_own_rss() -> bool {
    static CLAIMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    !CLAIMED.swap(true, std::sync::atomic::Ordering::SeqCst)
}

/// This process's RSS if `claimed` (see [`claim_own_rss`]).
pub fn own_rss(claimed: bool) -> Option<u64> {
    claimed.then(|| rss_bytes(std::process::id())).flatten()
}

/// `wchar` of process `pid`: bytes it passed to write calls, page cache or not (what
/// memcached's extstore hands the kernel; `write_bytes` misses rewrites of dirty pages).
pub fn wchar(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))?
        .trim()
        .parse()
        .ok()
}

/// User + system CPU seconds process `pid` has used.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are fixed.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// Waits until process `pid` is idle — less than 1 % of a core over a quarter second —
/// or `limit` has passed: the work a fill leaves behind it (merges, evictions to flash)
/// then counts in its CPU time.
pub fn wait_idle(pid: u32, limit: std::time::Duration) {
    const STEP: std::time::Duration = std::time::Duration::from_millis(250);
    let start = std::time::Instant::now();
    let Some(mut last) = cpu_seconds(pid) else {
        return;
    };
    while start.elapsed() < limit {
        std::thread::sleep(STEP);
        let Some(now) = cpu_seconds(pid) else { return };
        if now - last < STEP.as_secs_f64() / 100.0 {
            return;
        }
        last = now;
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).unwrap() > 0);
        assert!(wchar(pid).is_some());
        let mut x = 0u64;
        for i in 0..3_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_seconds(pid).unwrap() >= 0.0);
        assert!(clock_ticks() > 0.0);
    }
}
