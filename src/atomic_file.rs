//! Files replaced atomically, and the temporaries a crash leaves: every file rkubelet
//! writes whole (CNI result cache entries, the runtime's CNI conf and plugin hand-off,
//! certificates, keys and kubeconfigs, the routes state) is written to a temporary beside
//! it, synced, and renamed over it. The temporary's name is fixed by the target's
//! (`.<name>.rkubelet-tmp`), so the owner's next write of the same file removes one a
//! crash left, and [`sweep`] finds them all by that suffix for owners that sweep their
//! directory at start-up. Knows nothing of what the files hold.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The suffix of every temporary this module makes.
pub const TEMP_SUFFIX: &str = ".rkubelet-tmp";

/// A file operation that failed, with the path it was on.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct FileError {
    /// What was done.
    pub op: &'static str,
    /// Where.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

fn at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> FileError + 'a {
    move |source| FileError {
        op,
        path: path.to_owned(),
        source,
    }
}

/// The temporary of `path`: `.<file name>.rkubelet-tmp` in the same directory.
#[must_use]
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(TEMP_SUFFIX);
    path.with_file_name(name)
}

/// Whether `name` is one of this module's temporaries.
#[must_use]
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(TEMP_SUFFIX)
}

/// Removes `path` if it is there.
fn remove_if_present(path: &Path) -> Result<(), FileError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(at("removing a stale temporary", path)(e))
        }
        _ => Ok(()),
    }
}

/// `data` written and synced to the temporary of a file, not yet in its place: the
/// temporary is removed when this is dropped without [`Staged::commit`].
#[derive(Debug)]
pub struct Staged {
    path: PathBuf,
    temp: Option<PathBuf>,
}

/// Writes `data` with permission bits `mode` to the temporary of `path` (a temporary a
/// crash left there is replaced, never opened) and syncs it. Blocking.
///
/// # Errors
/// The temporary cannot be written; nothing is left of it then.
pub fn stage(path: &Path, data: &[u8], mode: u32) -> Result<Staged, FileError> {
    let temp = temp_path(path);
    remove_if_present(&temp)?;
    let staged = Staged {
        path: path.to_owned(),
        temp: Some(temp.clone()),
    };
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(data)?;
            f.sync_all()
        })
        .map_err(at("writing", &temp))?;
    Ok(staged)
}

/// A symlink to `target` made as the temporary of `link`, not yet in its place. Blocking.
///
/// # Errors
/// The symlink cannot be made.
fn stage_symlink(target: &Path, link: &Path) -> Result<Staged, FileError> {
    let temp = temp_path(link);
    remove_if_present(&temp)?;
    std::os::unix::fs::symlink(target, &temp).map_err(at("linking", &temp))?;
    Ok(Staged {
        path: link.to_owned(),
        temp: Some(temp),
    })
}

impl Staged {
    /// The file the temporary replaces.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the temporary over the file, then syncs the directory so the rename
    /// survives a power loss. Blocking.
    ///
    /// # Errors
    /// The rename or the sync fails; the temporary is removed if it is still there.
    pub fn commit(mut self) -> Result<(), FileError> {
        let Some(temp) = self.temp.take() else {
            return Ok(());
        };
        if let Err(e) = std::fs::rename(&temp, &self.path) {
            let _ = std::fs::remove_file(&temp);
            return Err(at("renaming into place", &self.path)(e));
        }
        match self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(dir) => std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(at("syncing", dir)),
            None => Ok(()),
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// Replaces `path` with `data` (permission bits `mode`) atomically. Blocking.
///
/// # Errors
/// As [`stage`] and [`Staged::commit`].
pub fn write(path: &Path, data: &[u8], mode: u32) -> Result<(), FileError> {
    stage(path, data, mode)?.commit()
}

/// [`write`] on the blocking pool.
///
/// # Errors
/// As [`write`].
pub async fn write_async(path: &Path, data: Vec<u8>, mode: u32) -> Result<(), FileError> {
    let owned = path.to_owned();
    tokio::task::spawn_blocking(move || write(&owned, &data, mode))
        .await
        .map_err(|e| at("writing", path)(std::io::Error::other(e)))?
}

/// Replaces `link` with a symlink to `target` atomically. Blocking.
///
/// # Errors
/// As [`stage_symlink`] and [`Staged::commit`].
pub fn symlink(target: &Path, link: &Path) -> Result<(), FileError> {
    stage_symlink(target, link)?.commit()
}

/// Removes every temporary in `dir` (not below it) whose target's name starts with
/// `prefix` (`""` for all): for the owner of the directory at start-up, before it writes.
/// Returns what was removed; a directory that does not exist has none. Blocking.
///
/// # Errors
/// The directory cannot be listed, or a temporary cannot be removed.
pub fn sweep(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, FileError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(at("listing", dir)(e)),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(at("listing", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_temp_name(name) || !name[1..].starts_with(prefix) {
            continue;
        }
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir {
            continue;
        }
        let path = entry.path();
        remove_if_present(&path)?;
        tracing::info!(path = %path.display(), "removed a temporary file a crash left");
        removed.push(path);
    }
    removed.sort();
    Ok(removed)
}

/// [`sweep`] on the blocking pool.
///
/// # Errors
/// As [`sweep`].
pub async fn sweep_async(dir: &Path, prefix: &'static str) -> Result<Vec<PathBuf>, FileError> {
    let owned = dir.to_owned();
    tokio::task::spawn_blocking(move || sweep(&owned, prefix))
        .await
        .map_err(|e| at("listing", dir)(std::io::Error::other(e)))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tempdir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rkubelet-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempdir("write");
        let file = dir.join("key.pem");
        write(&file, b"one", 0o600).unwrap();
        write(&file, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"two");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(names(&dir), ["key.pem"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_next_write_replaces_a_temporary_a_crash_left() {
        let dir = tempdir("crash");
        let file = dir.join("entry");
        assert_eq!(temp_path(&file), dir.join(".entry.rkubelet-tmp"));
        // A crash between the temporary's write and its rename: the staged file is
        // forgotten, not dropped.
        std::mem::forget(stage(&file, b"half", 0o644).unwrap());
        assert_eq!(names(&dir), [".entry.rkubelet-tmp"]);
        write(&file, b"whole", 0o644).unwrap();
        assert_eq!(names(&dir), ["entry"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_staged_file_dropped_uncommitted_is_removed() {
        let dir = tempdir("drop");
        let file = dir.join("entry");
        drop(stage(&file, b"x", 0o644).unwrap());
        let link = dir.join("current");
        drop(stage_symlink(Path::new("entry"), &link).unwrap());
        assert!(names(&dir).is_empty());
        symlink(Path::new("entry"), &link).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("entry"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_sweep_removes_only_temporaries_of_the_prefix() {
        let dir = tempdir("sweep");
        for name in [
            "kubelet-client-current.pem",
            ".kubelet-client-2026.pem.rkubelet-tmp",
            ".kubelet-server-2026.pem.rkubelet-tmp",
            ".hidden",
            "other.tmp",
        ] {
            std::fs::write(dir.join(name), "x").unwrap();
        }
        std::fs::create_dir(dir.join(".a-dir.rkubelet-tmp")).unwrap();
        let removed = sweep(&dir, "kubelet-client-").unwrap();
        assert_eq!(removed, [dir.join(".kubelet-client-2026.pem.rkubelet-tmp")]);
        let removed = sweep(&dir, "").unwrap();
        assert_eq!(removed, [dir.join(".kubelet-server-2026.pem.rkubelet-tmp")]);
        assert_eq!(
            names(&dir),
            [
                ".a-dir.rkubelet-tmp",
                ".hidden",
                "kubelet-client-current.pem",
                "other.tmp"
            ]
        );
        assert!(sweep(&dir.join("absent"), "").unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
