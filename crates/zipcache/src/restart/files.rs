//! Where a clean `close()` leaves the BT_SSD and BT_LO index files, and the data lock's
//! file, beside the SSD file; where the crash journal lives (tmpfs).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use crate::restart::dir::{FsDir, IndexDir};
use crate::restart::sealed_file::IndexFile;

/// The crash journal's files (`shadow.rs`; BT_SSD's and BT_LO's logs, `journal.rs`),
/// in the journal's directory (tmpfs), named after the SSD file they describe.
pub(crate) struct JournalFiles {
    pub(crate) shadow: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) lo_log: PathBuf,
}

impl JournalFiles {
    /// `<dir>/zipcache-<hash of the SSD file's absolute path>.shadow`, `.ssd-log` and
    /// `.lo-log`.
    pub(crate) fn for_ssd(dir: &Path, ssd: &Path) -> JournalFiles {
        let absolute = ssd
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .and_then(|d| d.canonicalize().ok())
            .map(|d| d.join(ssd.file_name().unwrap_or_default()))
            .unwrap_or_else(|| ssd.to_path_buf());
        let name = format!(
            "zipcache-{:016x}",
            xxh3_64(absolute.as_os_str().as_encoded_bytes())
        );
        JournalFiles {
            shadow: dir.join(format!("{name}.shadow")),
            log: dir.join(format!("{name}.ssd-log")),
            lo_log: dir.join(format!("{name}.lo-log")),
        }
    }

    /// Removes the files: a clean close's indexes describe the tiers now.
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_file(&self.shadow);
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(&self.lo_log);
    }
}

/// Where a clean shutdown leaves the indexes: `<ssd file>.index` (BT_SSD) and
/// `<ssd file>.lo-index` (BT_LO), in the SSD file's directory; beside them the block
/// dictionaries, `<ssd file>.dict-<slot>`.
pub(crate) struct Persist {
    pub(crate) dir: Arc<dyn IndexDir>,
    pub(crate) ssd_index: String,
    pub(crate) lo_index: String,
    pub(crate) dictionaries: String,
    /// The crash journal, unless it is off.
    pub(crate) journal: Option<JournalFiles>,
}

impl Persist {
    pub(crate) fn beside(ssd: &Path, journal_dir: Option<&Path>) -> Persist {
        let dir = ssd.parent().filter(|d| !d.as_os_str().is_empty());
        let name = ssd.file_name().unwrap_or_default().to_string_lossy();
        Persist {
            dir: Arc::new(FsDir::new(dir.unwrap_or(Path::new(".")))),
            ssd_index: format!("{name}.index"),
            lo_index: format!("{name}.lo-index"),
            dictionaries: format!("{name}.dict-"),
            journal: journal_dir.map(|dir| JournalFiles::for_ssd(dir, ssd)),
        }
    }

    pub(crate) fn file<'a>(&'a self, name: &'a str, epoch: u64) -> IndexFile<'a> {
        IndexFile {
            dir: self.dir.as_ref(),
            name,
            epoch,
        }
    }
}

/// `<ssd file>.<extension>`.
pub(crate) fn sibling(ssd: &Path, extension: &str) -> std::path::PathBuf {
    let mut name = ssd.as_os_str().to_owned();
    name.push(".");
    name.push(extension);
    name.into()
}

/// `<path>.new`: where a file of the crash journal is made before it is renamed over
/// `path`.
pub(crate) fn beside(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".new");
    name.into()
}
