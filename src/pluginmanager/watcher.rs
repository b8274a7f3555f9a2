//! The registration directory as the kubelet's plugin watcher sees it: every socket under
//! it (sub-directories walked, names starting with `.` skipped), each with a stamp that
//! changes when the socket is made anew. Blocking: call from a blocking thread.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What tells one socket file from the next one made at the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    inode: u64,
    changed_ns: i128,
}

/// Makes the registration directory (mode 0750, as the kubelet's).
pub(super) fn create_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
}

/// The sockets under `dir`; nothing when it does not exist.
pub(super) fn sockets(dir: &Path) -> io::Result<BTreeMap<PathBuf, Stamp>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                // Gone between the listing and the look.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.file_type().is_socket() {
                let stamp = Stamp {
                    inode: meta.ino(),
                    changed_ns: i128::from(meta.ctime()) * 1_000_000_000
                        + i128::from(meta.ctime_nsec()),
                };
                found.insert(entry.path(), stamp);
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_are_found_in_sub_directories_and_hidden_names_are_skipped() {
        let dir = std::env::temp_dir().join(format!("rkubelet-plugins-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        create_dir(&dir.join("sub")).unwrap();
        let _a = std::os::unix::net::UnixListener::bind(dir.join("a.sock")).unwrap();
        let _b = std::os::unix::net::UnixListener::bind(dir.join("sub/b.sock")).unwrap();
        let _hidden = std::os::unix::net::UnixListener::bind(dir.join(".c.sock")).unwrap();
        fs::write(dir.join("not-a-socket"), b"").unwrap();
        let found: Vec<_> = sockets(&dir).unwrap().into_keys().collect();
        assert_eq!(found, vec![dir.join("a.sock"), dir.join("sub/b.sock")]);
        let before = sockets(&dir).unwrap()[&dir.join("a.sock")];
        fs::remove_file(dir.join("a.sock")).unwrap();
        // The change time has the kernel's coarse clock.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let _again = std::os::unix::net::UnixListener::bind(dir.join("a.sock")).unwrap();
        assert_ne!(sockets(&dir).unwrap()[&dir.join("a.sock")], before);
        assert!(sockets(&dir.join("missing")).unwrap().is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
