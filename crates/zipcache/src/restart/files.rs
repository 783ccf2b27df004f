//! Where a clean `close()` leaves the BT_SSD and BT_LO index files, and the data lock's
//! file, beside the SSD file.

use std::path::Path;
use std::sync::Arc;

use crate::restart::dir::{FsDir, IndexDir};
use crate::restart::sealed_file::IndexFile;

/// Where a clean shutdown leaves the indexes: `<ssd file>.index` (BT_SSD) and
/// `<ssd file>.lo-index` (BT_LO), in the SSD file's directory; beside them the block
/// dictionaries, `<ssd file>.dict-<slot>`.
pub(crate) struct Persist {
    pub(crate) dir: Arc<dyn IndexDir>,
    pub(crate) ssd_index: String,
    pub(crate) lo_index: String,
    pub(crate) dictionaries: String,
}

impl Persist {
    pub(crate) fn beside(ssd: &Path) -> Persist {
        let dir = ssd.parent().filter(|d| !d.as_os_str().is_empty());
        let name = ssd.file_name().unwrap_or_default().to_string_lossy();
        Persist {
            dir: Arc::new(FsDir::new(dir.unwrap_or(Path::new(".")))),
            ssd_index: format!("{name}.index"),
            lo_index: format!("{name}.lo-index"),
            dictionaries: format!("{name}.dict-"),
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
