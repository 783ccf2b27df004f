//! Where the index files of a clean shutdown live (`docs/FORMAT.md`, "Restart"), behind
//! the few file-system steps durability is made of, so that a test can cut the power
//! between any two of them (`tests/power_loss.rs`).
//!
//! What survives a power cut is only what was synced: a file's bytes after
//! [`IndexDir::sync_file`], a name created, renamed or removed after
//! [`IndexDir::sync_dir`]. The callers (`sealed_file`, `restart::open`) are written
//! against exactly that.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// One directory of small files, with explicit durability.
pub trait IndexDir: Send + Sync {
    /// The bytes of `name`, or `None` if there is no such file.
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>>;
    /// Creates or truncates `name` and writes `bytes` (not yet durable).
    fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()>;
    /// Makes the bytes of `name` durable.
    fn sync_file(&self, name: &str) -> io::Result<()>;
    /// Renames `from` over `to` (atomic; durable after `sync_dir`).
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Removes `name` if it exists (durable after `sync_dir`).
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes every name created, renamed or removed so far durable.
    fn sync_dir(&self) -> io::Result<()>;
}

/// A real directory.
pub struct FsDir {
    path: PathBuf,
}

impl FsDir {
    pub fn new(path: &Path) -> FsDir {
        FsDir {
            path: path.to_path_buf(),
        }
    }
}

impl IndexDir for FsDir {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.path.join(name)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        File::create(self.path.join(name))?.write_all(bytes)
    }

    fn sync_file(&self, name: &str) -> io::Result<()> {
        OpenOptions::new()
            .write(true)
            .open(self.path.join(name))?
            .sync_all()
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.path.join(from), self.path.join(to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.path)?.sync_all()
    }
}

/// An exclusive lock on the SSD file's data for the life of one engine: a second
/// process (or a second engine in this one) opening the same SSD file is refused,
/// with the holder's PID in the error. The kernel releases it when the process dies.
pub struct DataLock {
    _file: File,
}

impl DataLock {
    /// Locks `path` (created if missing) and writes this process's PID into it.
    pub fn acquire(path: &Path) -> crate::Result<DataLock> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(path).unwrap_or_default();
                return Err(crate::Error::Locked {
                    path: path.to_path_buf(),
                    holder: holder.trim().to_string(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
        file.set_len(0)?;
        writeln!(file, "{}", std::process::id())?;
        Ok(DataLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_names_the_holder() {
        let path = std::env::temp_dir().join(format!("zc-lock-{}", std::process::id()));
        let first = DataLock::acquire(&path).unwrap();
        let err = DataLock::acquire(&path).err().expect("refused").to_string();
        assert!(
            err.contains(&std::process::id().to_string()),
            "names the holder: {err}"
        );
        drop(first);
        DataLock::acquire(&path).expect("free again once the holder is gone");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_real_directory_replaces_and_removes_files() {
        let dir = std::env::temp_dir().join(format!("zc-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fs = FsDir::new(&dir);
        fs.write("a.tmp", b"one").unwrap();
        fs.sync_file("a.tmp").unwrap();
        fs.rename("a.tmp", "a").unwrap();
        fs.sync_dir().unwrap();
        assert_eq!(fs.read("a").unwrap().as_deref(), Some(&b"one"[..]));
        assert_eq!(fs.read("a.tmp").unwrap(), None);
        fs.remove("a").unwrap();
        fs.remove("a").unwrap();
        assert_eq!(fs.read("a").unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
