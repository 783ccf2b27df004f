//! The descriptor log: BT_SSD's descriptors as a checkpoint plus every change since, in
//! a file in tmpfs, so that after a process crash the next open rebuilds the tier's
//! index without reading the device (`docs/FORMAT.md`, "The crash journal").
//!
//! The file: a header (magic, version, the run epoch, the checkpoint's length and
//! CRC32C), the checkpoint (an index file's body, `ssd/index_file.rs`), then records
//! appended with `write(2)` — each its length, its CRC32C and its bytes. A write(2) is in
//! the kernel's page cache when it returns, so it survives the process; a record cut
//! short by a crash fails its CRC and ends the replay (nothing after it was ever
//! relied on: the writer appends before it lets any key's shadow go). A new checkpoint
//! replaces the whole file atomically (written beside it, renamed).
//!
//! Thread: appended and checkpointed by BT_SSD's writer (the flusher, or a closing or
//! flushing thread) under the tier's writer lock; the file's own mutex is never
//! contended.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::format::journal::{CHECKPOINT_CRC, CHECKPOINT_LEN, EPOCH, HEADER, JOURNAL, VERSION};
use crate::restart::files::beside;

/// A checkpoint is due once the records since the last one pass this many bytes, or the
/// checkpoint's own size if larger: replay stays within twice a checkpoint's work. Unit
/// tests checkpoint every 16 KiB, so that their logs cross many checkpoints.
const CHECKPOINT_AFTER: u64 = if cfg!(test) { 16 << 10 } else { 4 << 20 };

pub(crate) struct DescriptorLog {
    path: PathBuf,
    state: Mutex<LogState>,
}

struct LogState {
    file: File,
    checkpoint_len: u64,
    appended: u64,
    /// Where the last append began, among the records (none since the checkpoint):
    /// unit tests cut the file there to crash just before it.
    #[cfg(test)]
    last_append: Option<u64>,
}

/// What a crashed run's log holds: its checkpoint and the records after it, in order.
pub(crate) struct Replay {
    pub(crate) checkpoint: Vec<u8>,
    pub(crate) records: Vec<Vec<u8>>,
}

impl DescriptorLog {
    /// Starts the log of the run of `epoch` at `path` with `checkpoint`, replacing any
    /// log there atomically.
    pub(crate) fn create(path: &Path, epoch: u64, checkpoint: &[u8]) -> std::io::Result<Self> {
        let file = write_checkpoint(path, epoch, checkpoint)?;
        Ok(DescriptorLog {
            path: path.to_path_buf(),
            state: Mutex::new(LogState {
                file,
                checkpoint_len: checkpoint.len() as u64,
                appended: 0,
                #[cfg(test)]
                last_append: None,
            }),
        })
    }

    /// Appends `records` (each already framed by [`frame`]) with one `write(2)`.
    pub(crate) fn append(&self, records: &[u8]) -> std::io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock();
        #[cfg(test)]
        {
            state.last_append = Some(state.appended);
        }
        state.file.write_all(records)?;
        state.appended += records.len() as u64;
        Ok(())
    }

    /// Whether the records since the checkpoint are worth a new one.
    pub(crate) fn checkpoint_due(&self) -> bool {
        let state = self.state.lock();
        state.appended > CHECKPOINT_AFTER.max(state.checkpoint_len)
    }

    /// Replaces the log by `checkpoint` alone (the caller holds every writer back, so it
    /// is the state the records so far add up to).
    pub(crate) fn checkpoint(&self, epoch: u64, checkpoint: &[u8]) -> std::io::Result<()> {
        let file = write_checkpoint(&self.path, epoch, checkpoint)?;
        *self.state.lock() = LogState {
            file,
            checkpoint_len: checkpoint.len() as u64,
            appended: 0,
            #[cfg(test)]
            last_append: None,
        };
        Ok(())
    }

    /// The file's length before the last append, if one came after the checkpoint: a
    /// crash just before that `write(2)` leaves the file this long.
    #[cfg(test)]
    pub(crate) fn len_before_last_append(&self) -> Option<u64> {
        let state = self.state.lock();
        Some(HEADER as u64 + state.checkpoint_len + state.last_append?)
    }

    /// The checkpoint and the whole records of the log at `path` if the run of `epoch`
    /// wrote it; `None` if it is missing, another run's, or its checkpoint is damaged.
    pub(crate) fn replay(path: &Path, epoch: u64) -> Option<Replay> {
        let bytes = std::fs::read(path).ok()?;
        if bytes.len() < HEADER
            || !JOURNAL.is_in(&bytes)
            || VERSION.get(&bytes) != crate::format::journal::JOURNAL_VERSION
            || EPOCH.get(&bytes) != epoch
        {
            return None;
        }
        let end = HEADER.checked_add(usize::try_from(CHECKPOINT_LEN.get(&bytes)).ok()?)?;
        let checkpoint = bytes.get(HEADER..end)?;
        if crc32c::crc32c(checkpoint) != CHECKPOINT_CRC.get(&bytes) {
            return None;
        }
        let mut records = Vec::new();
        let mut at = end;
        // A record cut short or damaged ends the log: nothing after it was relied on.
        while let Some(head) = bytes.get(at..at + 8) {
            let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(head[4..].try_into().unwrap());
            let Some(payload) = bytes.get(at + 8..at + 8 + len) else {
                break;
            };
            if crc32c::crc32c(payload) != crc {
                break;
            }
            records.push(payload.to_vec());
            at += 8 + len;
        }
        Some(Replay {
            checkpoint: checkpoint.to_vec(),
            records,
        })
    }
}

/// Appends one record, framed (length, CRC32C, bytes), to `out`.
pub(crate) fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Writes a log holding `checkpoint` alone beside `path` and renames it into place;
/// returns it open for appending.
fn write_checkpoint(path: &Path, epoch: u64, checkpoint: &[u8]) -> std::io::Result<File> {
    let mut header = vec![0; HEADER];
    JOURNAL.put(&mut header);
    VERSION.set(&mut header, crate::format::journal::JOURNAL_VERSION);
    EPOCH.set(&mut header, epoch);
    CHECKPOINT_LEN.set(&mut header, checkpoint.len() as u64);
    CHECKPOINT_CRC.set(&mut header, crc32c::crc32c(checkpoint));
    let temporary = beside(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&temporary)?;
    file.write_all(&header)?;
    file.write_all(checkpoint)?;
    std::fs::rename(&temporary, path)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            frame(&mut out, p);
        }
        out
    }

    #[test]
    fn a_log_replays_its_checkpoint_and_whole_records_only() {
        let dir = std::env::temp_dir().join(format!("zc-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.ssd-log");
        let log = DescriptorLog::create(&path, 9, b"checkpoint").unwrap();
        log.append(&framed(&[b"one", b"two"])).unwrap();
        log.append(&framed(&[b"three"])).unwrap();
        let replay = DescriptorLog::replay(&path, 9).unwrap();
        assert_eq!(replay.checkpoint, b"checkpoint");
        assert_eq!(
            replay.records,
            vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]
        );
        assert!(
            DescriptorLog::replay(&path, 10).is_none(),
            "another run's log"
        );
        // A record cut short by a crash: the replay stops before it.
        let mut bytes = std::fs::read(&path).unwrap();
        let cut = bytes.len() - 2;
        bytes.truncate(cut);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(DescriptorLog::replay(&path, 9).unwrap().records.len(), 2);
        // A flipped bit in a record: the same.
        bytes[HEADER + 10 + 8] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(DescriptorLog::replay(&path, 9).unwrap().records.len(), 0);
        // In the checkpoint: nothing is trusted.
        bytes[HEADER] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(DescriptorLog::replay(&path, 9).is_none());
        // A new checkpoint replaces the records.
        let log = DescriptorLog::create(&path, 9, b"a").unwrap();
        log.append(&framed(&[b"x"])).unwrap();
        log.checkpoint(9, b"b").unwrap();
        log.append(&framed(&[b"y"])).unwrap();
        let replay = DescriptorLog::replay(&path, 9).unwrap();
        assert_eq!(
            (replay.checkpoint, replay.records),
            (b"b".to_vec(), vec![b"y".to_vec()])
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
