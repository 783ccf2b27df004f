//! The shadow table: which keys' flash versions must not be served after a crash
//! (`docs/FORMAT.md`, "The crash journal").
//!
//! A key is *shadowed* from the moment a DRAM write, delete or touch of it is made
//! (`DramTier::append_locked`, under the key's leaf lock, before the write can be seen
//! or acknowledged) until its leaf's eviction has written that state down
//! (`SsdTier::absorb`, still under the DRAM leaf's lock, after the device writes and the
//! descriptor log): in between, DRAM holds a newer state than flash, and a crash would
//! lose it. The table holds a 64-bit fingerprint of each shadowed key in a shared
//! mapping of a file in tmpfs, so every mark is in the kernel's page cache the moment
//! it is made — it survives `kill -9`, an OOM kill or a panic at no system call, and it
//! does not survive a reboot, which is exactly when the device's state can no longer be
//! trusted without a clean close.
//!
//! Layout: 8-byte buckets of [`SLOTS`] fingerprints each (one cache line); a key may
//! sit in either of two buckets chosen by its fingerprint (two-choice hashing fills the
//! table past 90 % before a key finds both full). A key found in both is impossible: a
//! mark first looks in both. An empty slot is 0. No tombstones: a clear empties the
//! slot, and every look reads both whole buckets. A key that finds both buckets full is
//! not recorded: the table says so ([`INCOMPLETE`]), and a crash while it says so
//! restarts cold. Writes then stop marking (`mark`): what the table holds no longer
//! decides anything until a heal, and a mark that scans two full buckets and counts its
//! failure in the shared header word cost 2.5 % of the server's CPU in a fill. The state
//! heals: once the table has room again, the housekeeper starts a heal ([`HEALING`]:
//! writes mark again), marks every dirty DRAM object's key again
//! (`DramTier::remark_dirty`), and if no mark failed meanwhile the flag goes
//! (`finish_heal`). A burst of new keys that overflows the table costs a crash-warm
//! restart only until DRAM has written it down.
//!
//! Thread: marks run on writers' threads, clears on the flusher's, reads on GETs';
//! the fingerprint's owner is whoever holds the key's DRAM leaf lock, so two marks or a
//! mark and a clear of one key never race.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapMut;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::format::shadow::{
    BOOT_ID, BUCKETS, DEVICE_BLOCKS, EPOCH, FLAGS, HEADER_WORDS, MAGIC_WORD, SHADOW_MAGIC,
};
use crate::restart::files::beside;

/// Fingerprints a bucket holds: 64 bytes, one cache line.
pub(crate) const SLOTS: usize = 8;
/// Set in the header's flags when a key found no room: the table no longer names every
/// shadowed key, so a crash must start cold; cleared by `heal`.
pub(crate) const INCOMPLETE: u64 = 1;
/// Set while `flush_all` empties the tiers, and from a flush promised for later until
/// it runs: a crash in between must start cold.
pub(crate) const FLUSHING: u64 = 2;
/// Set when BT_SSD's descriptor log could not be written: it no longer describes the
/// tier, so a crash must start cold, for the rest of the run.
pub(crate) const UNLOGGED: u64 = 4;
/// Set, with [`INCOMPLETE`], while a heal walks DRAM (`begin_heal`): writes mark their
/// keys again, and the first that finds no room clears it.
pub(crate) const HEALING: u64 = 8;
/// Added to the header's flags word by each mark that found no room while the table was
/// whole or a heal watched (its high 32 bits count them, wrapping), together with
/// [`INCOMPLETE`].
const FAILED_MARK: u64 = 1 << 32;
/// The flags under which a crashed run's table is not trusted.
pub(crate) const UNTRUSTED: u64 = INCOMPLETE | FLUSHING | UNLOGGED;

const SEED: u64 = 0x5a1b_cace_5ad0_0001;

/// A key's fingerprint: never 0 (an empty slot).
pub(crate) fn fingerprint(key: &[u8]) -> u64 {
    xxh3_64_with_seed(key, SEED).max(1)
}

/// Whether the flash tier may hold a version of a key (`ssd/presence.rs`). A write of a
/// key it certainly does not hold needs no mark: after a crash there is nothing on flash
/// to hide, only a miss.
pub(crate) trait MayBeOnFlash: Send + Sync {
    fn may_be_on_flash(&self, key: &[u8]) -> bool;
}

/// Who wrote a shadow table: it is trusted only by the same boot, for the device run
/// that wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) boot_id: [u8; 16],
    pub(crate) epoch: u64,
    pub(crate) device_blocks: u64,
}

/// The kernel's id of this boot (`/proc/sys/kernel/random/boot_id`), or `None` where
/// it cannot be read: then no journal is trusted, as after a reboot.
pub(crate) fn boot_id() -> Option<[u8; 16]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

/// Where the table's words live.
enum Backing {
    /// A file in tmpfs, shared: what survives the process.
    File(MmapMut),
    /// This process's memory (no journal): the table still hides the flash versions a
    /// clean index carried over.
    Memory(Box<[AtomicU64]>),
}

pub(crate) struct Shadow {
    backing: Backing,
    buckets: usize,
    /// Fingerprints held now (this process's count, for `stats`).
    held: AtomicU64,
    /// Marks that found no room, ever (for `stats`; the header counts them too).
    overflows: AtomicU64,
    /// Times [`INCOMPLETE`] was cleared by `heal`.
    heals: AtomicU64,
}

/// The fewest buckets, from `buckets` up by doubling, in which every fingerprint of
/// `carried` finds room. Those name flash versions a crash left stale, and a table that
/// lost one could heal (`heal` marks DRAM's keys again, not these) and then serve it.
/// Marking is deterministic: the table built for real holds them all as the trial did.
fn holding_all(buckets: usize, carried: &[u64]) -> usize {
    let mut buckets = buckets.max(1);
    loop {
        let trial = Shadow::empty(buckets);
        if carried.iter().all(|&tag| trial.mark_fingerprint(tag)) {
            return buckets;
        }
        buckets *= 2;
    }
}

impl Shadow {
    /// A table in this process's memory alone, holding `carried` (at least `buckets`
    /// buckets; more if `carried` needs them).
    pub(crate) fn in_memory(buckets: usize, carried: &[u64]) -> Shadow {
        let shadow = Shadow::empty(holding_all(buckets, carried));
        for &tag in carried {
            shadow.mark_fingerprint(tag);
        }
        shadow
    }

    fn empty(buckets: usize) -> Shadow {
        let words = HEADER_WORDS + buckets * SLOTS;
        Shadow {
            backing: Backing::Memory((0..words).map(|_| AtomicU64::new(0)).collect()),
            buckets,
            held: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
            heals: AtomicU64::new(0),
        }
    }

    /// Creates the table for a new run at `path` (replacing any there atomically: written
    /// beside it, then renamed), holding `carried`, the fingerprints an earlier run left
    /// shadowed (at least `buckets` buckets; more if `carried` needs them).
    pub(crate) fn create(
        path: &Path,
        identity: Identity,
        buckets: usize,
        carried: &[u64],
    ) -> std::io::Result<Shadow> {
        let buckets = holding_all(buckets, carried);
        let temporary = beside(path);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temporary)?;
        // Written whole, not only sized: tmpfs allocates a page when it is first written,
        // and a store into the mapping that finds tmpfs full would kill the process
        // (SIGBUS). Written here, a full tmpfs is an error the open reports instead.
        let len = (HEADER_WORDS + buckets * SLOTS) * 8;
        let zeros = vec![0u8; len.min(1 << 20)];
        let mut left = len;
        while left > 0 {
            let n = left.min(zeros.len());
            file.write_all(&zeros[..n])?;
            left -= n;
        }
        // SAFETY: the file is this process's own, just created at its full length, and
        // nothing truncates it while the mapping lives (the engine's data lock keeps a
        // second engine away; the path is derived from the locked SSD file). Its words
        // are only ever touched as atomics (`words`).
        let map = unsafe { MmapMut::map_mut(&file)? };
        let shadow = Shadow {
            backing: Backing::File(map),
            buckets,
            held: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
            heals: AtomicU64::new(0),
        };
        let words = shadow.words();
        words[BOOT_ID].store(
            u64::from_le_bytes(identity.boot_id[..8].try_into().unwrap()),
            Ordering::Relaxed,
        );
        words[BOOT_ID + 1].store(
            u64::from_le_bytes(identity.boot_id[8..].try_into().unwrap()),
            Ordering::Relaxed,
        );
        words[EPOCH].store(identity.epoch, Ordering::Relaxed);
        words[DEVICE_BLOCKS].store(identity.device_blocks, Ordering::Relaxed);
        words[BUCKETS].store(buckets as u64, Ordering::Relaxed);
        for &tag in carried {
            shadow.mark_fingerprint(tag);
        }
        // The magic last: a table cut short by a crash before the rename is never read,
        // and one cut after it is whole.
        words[MAGIC_WORD].store(SHADOW_MAGIC, Ordering::Release);
        std::fs::rename(&temporary, path)?;
        Ok(shadow)
    }

    /// The fingerprints a crashed run's table at `path` holds, if it was written by
    /// `expected` (this boot, the device's run) and still names every shadowed key;
    /// `None` otherwise (then the flash tier cannot be trusted: cold).
    pub(crate) fn recover(path: &Path, expected: Identity) -> Option<Vec<u64>> {
        let bytes = std::fs::read(path).ok()?;
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        let mut boot_id = [0u8; 16];
        boot_id[..8].copy_from_slice(&word(BOOT_ID)?.to_le_bytes());
        boot_id[8..].copy_from_slice(&word(BOOT_ID + 1)?.to_le_bytes());
        let found = Identity {
            boot_id,
            epoch: word(EPOCH)?,
            device_blocks: word(DEVICE_BLOCKS)?,
        };
        let buckets = usize::try_from(word(BUCKETS)?).ok()?;
        let intact = word(MAGIC_WORD)? == SHADOW_MAGIC
            && found == expected
            && word(FLAGS)? & UNTRUSTED == 0
            && bytes.len() == (HEADER_WORDS + buckets.checked_mul(SLOTS)?) * 8;
        if !intact {
            return None;
        }
        let tags = (HEADER_WORDS..bytes.len() / 8)
            .filter_map(word)
            .filter(|&tag| tag != 0)
            .collect();
        Some(tags)
    }

    fn words(&self) -> &[AtomicU64] {
        match &self.backing {
            Backing::Memory(words) => words,
            Backing::File(map) => {
                // SAFETY: the mapping is page-aligned and a whole number of 8-byte words
                // long (`create` sized the file so); it lives as long as `self`, and every
                // access to it after `create` goes through these atomics, so no `&mut`
                // to its bytes exists alongside. Exercised by every test that opens an
                // engine on a file (`restart::shadow::tests`, `tests/crash.rs`).
                unsafe {
                    std::slice::from_raw_parts(map.as_ptr().cast::<AtomicU64>(), map.len() / 8)
                }
            }
        }
    }

    fn bucket(&self, i: usize) -> &[AtomicU64] {
        let start = HEADER_WORDS + i * SLOTS;
        &self.words()[start..start + SLOTS]
    }

    fn homes(&self, tag: u64) -> [usize; 2] {
        let n = self.buckets as u64;
        [
            ((tag as u32) as u64 % n) as usize,
            ((tag >> 32) % n) as usize,
        ]
    }

    /// Records that `key`'s flash version, if any, is older than DRAM's state of it;
    /// false if it is not recorded: it found no room (the table is then [`INCOMPLETE`]),
    /// or the table is incomplete and no heal watches, so that a crash starts cold
    /// whatever it holds and the next heal marks the key again. Called under the key's
    /// DRAM leaf lock, before the write is visible: a heal that began before the lock was
    /// taken is seen here, and one that begins after walks the key's leaf after it.
    pub(crate) fn mark(&self, key: &[u8]) -> bool {
        let flags = self.words()[FLAGS].load(Ordering::Acquire);
        if flags & (INCOMPLETE | HEALING) == INCOMPLETE {
            return false;
        }
        self.mark_fingerprint(fingerprint(key))
    }

    fn mark_fingerprint(&self, tag: u64) -> bool {
        let homes = self.homes(tag);
        // One pass over both buckets: the fingerprint already there, or how much room
        // each has.
        let mut free = [0usize; 2];
        for (room, &b) in free.iter_mut().zip(&homes) {
            for slot in self.bucket(b) {
                match slot.load(Ordering::Acquire) {
                    held if held == tag => return true,
                    0 => *room += 1,
                    _ => {}
                }
            }
        }
        // The emptier bucket first: two-choice hashing keeps both close to even.
        let order = if free[1] > free[0] {
            [homes[1], homes[0]]
        } else {
            homes
        };
        for b in order.into_iter().filter(|_| free != [0, 0]) {
            for slot in self.bucket(b) {
                // Another key may take the slot first: try the next. Read before the
                // locked exchange, which costs as much when it fails.
                if slot.load(Ordering::Relaxed) == 0
                    && slot
                        .compare_exchange(0, tag, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    self.held.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
            }
        }
        self.overflows.fetch_add(1, Ordering::Relaxed);
        // The flag and the count of marks that found no room move in one step: a heal
        // that began before this failure then finds the word changed (`finish_heal`),
        // and writes stop marking until the next one.
        let _ = self.words()[FLAGS].fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            Some((w.wrapping_add(FAILED_MARK) | INCOMPLETE) & !HEALING)
        });
        false
    }

    /// Whether the table is [`INCOMPLETE`].
    pub(crate) fn overflowed(&self) -> bool {
        self.flags() & INCOMPLETE != 0
    }

    /// Starts a heal of an [`INCOMPLETE`] table: from now on writes mark their keys
    /// again ([`HEALING`]). The flags word as it is then, which `finish_heal` must find
    /// unchanged; `None` if the table is whole or a heal is under way.
    pub(crate) fn begin_heal(&self) -> Option<u64> {
        let flags = &self.words()[FLAGS];
        let seen = flags.load(Ordering::Acquire);
        if seen & (INCOMPLETE | HEALING) != INCOMPLETE {
            return None;
        }
        let watching = seen | HEALING;
        flags
            .compare_exchange(seen, watching, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| watching)
    }

    /// Ends the heal `begin_heal` started (`watching`, the flags word it returned): if
    /// every dirty DRAM object's key was marked again (`marked`) and the word did not
    /// move since — a mark that found no room moves it —, [`INCOMPLETE`] goes, and true;
    /// otherwise the table stays incomplete and writes stop marking again.
    pub(crate) fn finish_heal(&self, watching: u64, marked: bool) -> bool {
        let flags = &self.words()[FLAGS];
        let healed = marked
            && flags
                .compare_exchange(
                    watching,
                    watching & !(INCOMPLETE | HEALING),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok();
        if healed {
            self.heals.fetch_add(1, Ordering::Relaxed);
        } else {
            flags.fetch_and(!HEALING, Ordering::AcqRel);
        }
        healed
    }

    /// Marks that found no room, ever (while the table was whole or a heal watched).
    pub(crate) fn overflows(&self) -> u64 {
        self.overflows.load(Ordering::Relaxed)
    }

    /// Times the table healed (`finish_heal`).
    pub(crate) fn heals(&self) -> u64 {
        self.heals.load(Ordering::Relaxed)
    }

    /// Fingerprints the table can hold.
    pub(crate) fn capacity(&self) -> u64 {
        (self.buckets * SLOTS) as u64
    }

    /// `key`'s state is on flash now: its fingerprint goes. Called under the key's DRAM
    /// leaf lock, after the device writes and the descriptor log that carry it.
    pub(crate) fn clear(&self, key: &[u8]) {
        let tag = fingerprint(key);
        for b in self.homes(tag) {
            for slot in self.bucket(b) {
                if slot.load(Ordering::Relaxed) == tag
                    && slot
                        .compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    self.held.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Whether `key` may have a newer state than its flash version (or none at all).
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        let tag = fingerprint(key);
        self.homes(tag).iter().any(|&b| {
            self.bucket(b)
                .iter()
                .any(|s| s.load(Ordering::Acquire) == tag)
        })
    }

    /// Every fingerprint held (for the clean close's index, and a new run's table).
    pub(crate) fn fingerprints(&self) -> Vec<u64> {
        self.words()[HEADER_WORDS..]
            .iter()
            .map(|s| s.load(Ordering::Acquire))
            .filter(|&tag| tag != 0)
            .collect()
    }

    /// Empties the table (`flush_all`, with [`FLUSHING`] set around it).
    pub(crate) fn reset(&self) {
        for slot in &self.words()[HEADER_WORDS..] {
            if slot.swap(0, Ordering::AcqRel) != 0 {
                self.held.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn set_flag(&self, flag: u64, on: bool) {
        let flags = &self.words()[FLAGS];
        match on {
            true => flags.fetch_or(flag, Ordering::AcqRel),
            false => flags.fetch_and(!flag, Ordering::AcqRel),
        };
    }

    pub(crate) fn flags(&self) -> u64 {
        self.words()[FLAGS].load(Ordering::Acquire)
    }

    /// Fingerprints held now.
    pub(crate) fn len(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Bytes of memory the table takes (charged to the DRAM budget).
    pub(crate) fn bytes(&self) -> u64 {
        (self.words().len() * 8) as u64
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn identity(epoch: u64) -> Identity {
        Identity {
            boot_id: [7; 16],
            epoch,
            device_blocks: 1024,
        }
    }

    fn key(i: u32) -> Vec<u8> {
        format!("key-{i}").into_bytes()
    }

    #[test]
    fn marks_and_clears_are_exact_and_survive_in_the_file() {
        let dir = std::env::temp_dir().join(format!("zc-shadow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.shadow");
        let shadow = Shadow::create(&path, identity(5), 1024, &[]).unwrap();
        for i in 0..4000 {
            shadow.mark(&key(i));
        }
        for i in (0..4000).step_by(2) {
            shadow.clear(&key(i));
        }
        for i in 0..4000 {
            assert_eq!(shadow.contains(&key(i)), i % 2 == 1, "key {i}");
        }
        // What another process would find after this one died: the file alone.
        let held: HashSet<u64> = Shadow::recover(&path, identity(5))
            .unwrap()
            .into_iter()
            .collect();
        let expected: HashSet<u64> = (1..4000).step_by(2).map(|i| fingerprint(&key(i))).collect();
        assert_eq!(held, expected);
        assert!(
            Shadow::recover(&path, identity(6)).is_none(),
            "another run's table"
        );
        let other_boot = Identity {
            boot_id: [8; 16],
            ..identity(5)
        };
        assert!(
            Shadow::recover(&path, other_boot).is_none(),
            "another boot's table"
        );
        shadow.set_flag(FLUSHING, true);
        assert!(
            Shadow::recover(&path, identity(5)).is_none(),
            "cut during a flush"
        );
        shadow.set_flag(FLUSHING, false);
        // A new run carries the fingerprints over.
        let next = Shadow::create(
            &path,
            identity(6),
            1024,
            &held.iter().copied().collect::<Vec<_>>(),
        )
        .unwrap();
        assert!(next.contains(&key(1)) && !next.contains(&key(2)));
        drop((shadow, next));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_full_table_says_so_and_is_not_trusted() {
        let shadow = Shadow::in_memory(4, &[]);
        for i in 0..(4 * SLOTS as u32) {
            shadow.mark(&key(i));
        }
        assert_ne!(
            shadow.flags() & INCOMPLETE,
            0,
            "32 keys in 32 slots by two choices: some must miss"
        );
        let fitting = (0..(4 * SLOTS as u32))
            .filter(|&i| shadow.contains(&key(i)))
            .count();
        assert!(fitting >= 20, "two choices fill most slots: {fitting}");
    }

    /// Fingerprints carried over from a crash name flash versions that must stay
    /// hidden, and `heal` re-marks DRAM's keys only: a table too small for them grows
    /// rather than lose one (it would heal, then serve the version).
    #[test]
    fn a_new_table_holds_every_carried_fingerprint_whatever_its_size() {
        let carried: Vec<u64> = (0..100).map(|i| fingerprint(&key(i))).collect();
        let dir = std::env::temp_dir().join(format!("zc-shadow-carry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let in_file = Shadow::create(&dir.join("t.shadow"), identity(5), 2, &carried).unwrap();
        for shadow in [Shadow::in_memory(2, &carried), in_file] {
            assert_eq!(shadow.flags() & INCOMPLETE, 0);
            assert_eq!(shadow.len(), 100);
            assert!((0..100).all(|i| shadow.contains(&key(i))));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_marks_of_different_keys_all_land() {
        let shadow = Shadow::in_memory(1 << 12, &[]);
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let shadow = &shadow;
                s.spawn(move || {
                    for i in 0..5000 {
                        shadow.mark(&key(t * 10_000 + i));
                    }
                });
            }
        });
        assert_eq!(shadow.flags() & INCOMPLETE, 0);
        for t in 0..4u32 {
            for i in 0..5000 {
                assert!(shadow.contains(&key(t * 10_000 + i)));
            }
        }
        assert_eq!(shadow.fingerprints().len(), 20_000);
    }
}
