//! The memcached protocols on a unix-domain socket (memcached's `-s PATH -a MASK`): the
//! socket file bound with its mode, a stale one from an earlier run cleared, and the file
//! removed when the listener goes.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use socket2::{Domain, SockAddr, Socket, Type};

use super::LISTEN_BACKLOG;

/// The socket file a listener bound: removed when this is dropped (the listener stopped,
/// or a start failed after binding), unless the path no longer names this very file.
pub struct SocketFile {
    path: PathBuf,
    device: u64,
    inode: u64,
}

impl SocketFile {
    fn of(path: &Path) -> io::Result<SocketFile> {
        let meta = fs::symlink_metadata(path)?;
        Ok(SocketFile {
            path: path.to_path_buf(),
            device: meta.dev(),
            inode: meta.ino(),
        })
    }

    fn is_still_ours(&self) -> bool {
        fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == (self.device, self.inode))
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        // Another server may have taken the path since (after someone removed ours).
        if self.is_still_ours() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Listens on a unix-domain socket at `path` whose file has permission bits `mode`.
/// A socket file nothing listens on (left by a process that did not stop cleanly) is
/// replaced; a live server's socket, or a path that is not a socket, is an error.
pub fn bind(path: &Path, mode: u32) -> io::Result<(UnixListener, SocketFile)> {
    let context = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    if mode & !0o777 != 0 {
        let e = io::Error::new(io::ErrorKind::InvalidInput, "mode beyond 0777");
        return Err(context(e));
    }
    let addr = SockAddr::unix(path).map_err(context)?;
    clear_stale(&addr, path).map_err(context)?;
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(context)?;
    socket.set_nonblocking(true).map_err(context)?;
    socket.bind(&addr).map_err(context)?;
    let file = SocketFile::of(path).map_err(context)?;
    // Until `listen` every connect is refused, so no client gets in under the mode the
    // file was created with (the process's umask, which other threads share: not
    // changed here, unlike memcached).
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(context)?;
    socket.listen(LISTEN_BACKLOG).map_err(context)?;
    Ok((socket.into(), file))
}

/// Removes the socket file at `path` if nothing accepts connections on it.
fn clear_stale(addr: &SockAddr, path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(meta) => meta,
    };
    if !meta.file_type().is_socket() {
        let e = "exists and is not a socket: refusing to replace it";
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, e));
    }
    // Not blocking: a live server whose backlog is full answers `WouldBlock`.
    let probe = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    probe.set_nonblocking(true)?;
    match probe.connect(addr) {
        Ok(()) => Err(live()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(live()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        // Removed meanwhile: nothing to clear.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn live() -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        "a server is listening on this socket",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::DEFAULT_UNIX_SOCKET_MODE;
    use std::os::unix::net::UnixStream;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("zc-unix-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_socket_takes_its_mode_and_goes_with_its_listener() {
        let dir = dir("mode");
        let path = dir.join("s");
        let (listener, file) = bind(&path, 0o750).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o750);
        UnixStream::connect(&path).expect("accepts connections");
        drop((listener, file));
        assert!(!path.exists(), "removed with its listener");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        let dir = dir("stale");
        let path = dir.join("s");
        // A socket file nobody listens on: a server that was killed.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let (_listener, _file) =
            bind(&path, DEFAULT_UNIX_SOCKET_MODE).expect("stale file replaced");
        let second = bind(&path, DEFAULT_UNIX_SOCKET_MODE)
            .err()
            .expect("a live owner");
        assert_eq!(second.kind(), io::ErrorKind::AddrInUse);
        assert!(second.to_string().contains("listening"), "{second}");
        UnixStream::connect(&path).expect("the first server still listens");
        drop((_listener, _file));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_path_that_is_not_a_socket_is_left_alone() {
        let dir = dir("file");
        let path = dir.join("data");
        fs::write(&path, b"keep me").unwrap();
        let error = bind(&path, DEFAULT_UNIX_SOCKET_MODE)
            .err()
            .expect("not a socket");
        assert!(error.to_string().contains("not a socket"), "{error}");
        assert_eq!(fs::read(&path).unwrap(), b"keep me");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_replaced_socket_file_is_not_removed_by_the_old_listener() {
        let dir = dir("replaced");
        let path = dir.join("s");
        let (listener, file) = bind(&path, DEFAULT_UNIX_SOCKET_MODE).unwrap();
        // Someone removes our file and another server binds the path.
        fs::remove_file(&path).unwrap();
        let (other, other_file) = bind(&path, DEFAULT_UNIX_SOCKET_MODE).unwrap();
        drop((listener, file));
        UnixStream::connect(&path).expect("the new server's socket stays");
        drop((other, other_file));
        assert!(!path.exists());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_paths_and_modes_are_errors_naming_the_path() {
        let long = PathBuf::from(format!("/tmp/{}", "x".repeat(120)));
        let error = bind(&long, DEFAULT_UNIX_SOCKET_MODE)
            .err()
            .expect("too long for sun_path");
        assert!(
            error.to_string().contains(&*long.to_string_lossy()),
            "{error}"
        );
        let dir = dir("badmode");
        let error = bind(&dir.join("s"), 0o1777).err().expect("mode");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        let missing = dir.join("no/such/dir/s");
        let error = bind(&missing, DEFAULT_UNIX_SOCKET_MODE)
            .err()
            .expect("no directory");
        assert!(error.to_string().contains("no/such/dir"), "{error}");
        fs::remove_dir_all(dir).unwrap();
    }
}
