//! Teardown of a pod's directory: unmount what the mount table shows under it (volumes and
//! subpath bind mounts, local persistent volumes), then remove its volumes, subpath targets
//! and block device links without ever crossing into another file system or removing what
//! a persistent volume's mount point holds. Blocking: call from a blocking thread.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::error::FsError;
use super::local;
use super::mounter::Mounter;
use super::subpath::SUBPATHS_DIR;

/// Unmounts everything under `pod_dir`, deepest first, then removes its `volumes` and
/// `volume-subpaths` directories, and `pod_dir` itself (`whole`) or only if empty.
pub(super) fn teardown_pod_dir<M: Mounter>(
    mounter: &M,
    pod_dir: &Path,
    whole: bool,
) -> Result<(), FsError> {
    let pod_dir = match fs::canonicalize(pod_dir) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(FsError::at("resolving", pod_dir)(e)),
    };
    let mounts_under = || -> Result<Vec<PathBuf>, FsError> {
        Ok(mounter
            .mount_points()
            .map_err(FsError::at("reading the mount table for", &pod_dir))?
            .into_iter()
            .filter(|m| m.starts_with(&pod_dir))
            .collect())
    };
    let mut mounts = mounts_under()?;
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for mount in &mounts {
        match mounter.unmount(mount) {
            Ok(()) => tracing::debug!(path = %mount.display(), "unmounted"),
            // Gone in the meantime: the check below tells.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(nix::libc::EINVAL | nix::libc::ENOENT)
                ) => {}
            Err(e) => return Err(FsError::at("unmounting", mount)(e)),
        }
    }
    if let Some(left) = mounts_under()?.into_iter().next() {
        return Err(FsError::at("still mounted after unmounting:", left)(
            nix::errno::Errno::EBUSY.into(),
        ));
    }
    // Persistent volumes' mount points first, and only while empty: their data is never
    // removed, whatever the mount table said.
    local::remove_mount_points(&pod_dir.join("volumes").join(local::PLUGIN_DIR))?;
    remove_all_one_filesystem(&pod_dir.join("volumes"))?;
    remove_all_one_filesystem(&pod_dir.join(SUBPATHS_DIR))?;
    // Links to block devices: removed as links, the devices untouched.
    remove_all_one_filesystem(&pod_dir.join(local::DEVICES_DIR))?;
    if whole {
        remove_all_one_filesystem(&pod_dir)?;
    } else {
        match fs::remove_dir(&pod_dir) {
            Err(e)
                if !matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty
                ) =>
            {
                return Err(FsError::at("removing", &pod_dir)(e));
            }
            _ => {}
        }
    }
    tracing::info!(unmounted = mounts.len(), "pod volumes torn down");
    Ok(())
}

/// Removes `path` and everything under it without following symlinks or entering another
/// file system (the kubelet's `RemoveAllOneFilesystem`): a mount point that is somehow still
/// there stops the removal instead of losing the mounted data.
pub(super) fn remove_all_one_filesystem(path: &Path) -> Result<(), FsError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(FsError::at("inspecting", path)(e)),
    };
    if !meta.is_dir() {
        return fs::remove_file(path).map_err(FsError::at("removing", path));
    }
    let device = meta.dev();
    let mut stack = vec![(path.to_path_buf(), false)];
    while let Some((dir, emptied)) = stack.pop() {
        if emptied {
            fs::remove_dir(&dir).map_err(FsError::at("removing", &dir))?;
            continue;
        }
        stack.push((dir.clone(), true));
        for entry in fs::read_dir(&dir).map_err(FsError::at("reading", &dir))? {
            let entry = entry.map_err(FsError::at("reading", &dir))?;
            let child = entry.path();
            let meta = fs::symlink_metadata(&child).map_err(FsError::at("inspecting", &child))?;
            if !meta.is_dir() {
                fs::remove_file(&child).map_err(FsError::at("removing", &child))?;
            } else if meta.dev() == device {
                stack.push((child, false));
            } else {
                return Err(FsError::at(
                    "refusing to remove another file system at",
                    child,
                )(nix::errno::Errno::EXDEV.into()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::super::testing::TempDir;
    use super::*;

    #[test]
    fn removal_stays_on_one_file_system() {
        let tmp = TempDir::new("rm");
        let tree = tmp.path().join("tree");
        fs::create_dir_all(tree.join("a/b")).expect("mkdir");
        fs::write(tree.join("a/b/f"), "x").expect("write");
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        fs::write(outside.join("keep"), "x").expect("write");
        symlink(&outside, tree.join("a/link")).expect("symlink");
        remove_all_one_filesystem(&tree).expect("remove");
        assert!(!tree.exists());
        assert!(outside.join("keep").exists(), "symlinks are not followed");
        remove_all_one_filesystem(&tree).expect("removing nothing");
    }
}
