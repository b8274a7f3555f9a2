//! `local` PersistentVolumes on the host, as the kubelet's local plugin lays them out:
//! - volumeMode Filesystem: the volume's directory bind-mounted on
//!   `<pod dir>/volumes/kubernetes.io~local-volume/<pv name>` (read-only by a remount when
//!   the claim source says so), once; the pod's containers bind-mount that.
//! - volumeMode Block: the device node linked from
//!   `<pod dir>/volumeDevices/kubernetes.io~local-volume/<pv name>` (the kubelet's pod device
//!   map path), which reaches the containers as a CRI device. The kubelet also bind-mounts
//!   the device under a global map path and holds it open with a loop device; this agent
//!   does neither (the link alone is what the runtime reads).
//!
//! Nothing here removes a file: teardown (`teardown.rs`) unmounts and removes only the
//! empty mount points. Blocking: call from a blocking thread.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::Path;

use super::error::FsError;
use super::mounter::Mounter;

/// The plugin directory of local volumes under a pod's `volumes/` and `volumeDevices/`.
pub(super) const PLUGIN_DIR: &str = "kubernetes.io~local-volume";
/// A pod's directory of block volume links (the kubelet's `volumeDevices`).
pub(super) const DEVICES_DIR: &str = "volumeDevices";
/// Mode of the mount point and the directories above it (the kubelet's 0750).
const DIR_MODE: u32 = 0o750;

fn make_parent(path: &Path) -> Result<(), FsError> {
    match path.parent() {
        Some(parent) => fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(parent)
            .map_err(FsError::at("creating", parent)),
        None => Ok(()),
    }
}

/// Bind-mounts the local volume's directory `source` on `dir` unless it is mounted there
/// already. Returns whether it mounted now.
pub(super) fn mount_dir<M: Mounter + ?Sized>(
    mounter: &M,
    source: &Path,
    dir: &Path,
    read_only: bool,
) -> Result<bool, FsError> {
    let meta = fs::metadata(source).map_err(FsError::at("inspecting", source))?;
    if !meta.is_dir() {
        // A block device with volumeMode Filesystem would need formatting and a global
        // mount (the kubelet's device mounter): not done here.
        return Err(FsError::at(
            "a local volume of volumeMode Filesystem must be a directory:",
            source,
        )(nix::errno::Errno::ENOTDIR.into()));
    }
    make_parent(dir)?;
    match fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(FsError::at("creating", dir)(e));
        }
        _ => {}
    }
    let canonical = fs::canonicalize(dir).map_err(FsError::at("resolving", dir))?;
    let mounted = mounter
        .mount_points()
        .map_err(FsError::at("reading the mount table for", dir))?
        .contains(&canonical);
    if mounted {
        return Ok(false);
    }
    mounter
        .bind_mount(source, dir)
        .map_err(FsError::at("bind-mounting the local volume on", dir))?;
    if read_only && let Err(e) = mounter.remount_read_only(dir) {
        // Not left writable: the container must not see it so.
        if let Err(undo) = mounter.unmount(dir) {
            tracing::warn!(path = %dir.display(), error = %undo, "could not undo a bind mount");
        }
        return Err(FsError::at("remounting read-only", dir)(e));
    }
    tracing::info!(source = %source.display(), path = %dir.display(), read_only, "mounted local volume");
    Ok(true)
}

/// Removes the mount points of local volumes under `plugin_dir` (a pod's
/// `volumes/kubernetes.io~local-volume`) and the directory itself, once unmounted: each one
/// only while empty (`rmdir`), so that what a volume holds is never removed, even when the
/// mount table was wrong about it.
pub(super) fn remove_mount_points(plugin_dir: &Path) -> Result<(), FsError> {
    let entries = match fs::read_dir(plugin_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(FsError::at("reading", plugin_dir)(e)),
    };
    for entry in entries {
        let path = entry.map_err(FsError::at("reading", plugin_dir))?.path();
        fs::remove_dir(&path).map_err(FsError::at(
            "removing the mount point (only while empty)",
            &path,
        ))?;
    }
    fs::remove_dir(plugin_dir).map_err(FsError::at("removing", plugin_dir))
}

/// Links the block device `device` from `link` (replacing a link to something else).
pub(super) fn map_device(device: &Path, link: &Path) -> Result<(), FsError> {
    let meta = fs::metadata(device).map_err(FsError::at("inspecting", device))?;
    if !meta.file_type().is_block_device() {
        return Err(FsError::at(
            "a local volume of volumeMode Block must be a block device:",
            device,
        )(nix::errno::Errno::ENOTBLK.into()));
    }
    make_parent(link)?;
    match fs::read_link(link) {
        Ok(target) if target == device => return Ok(()),
        Ok(_) => fs::remove_file(link).map_err(FsError::at("replacing", link))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(FsError::at("reading the link", link)(e)),
    }
    std::os::unix::fs::symlink(device, link).map_err(FsError::at("linking the device at", link))?;
    tracing::info!(device = %device.display(), link = %link.display(), "mapped block volume");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{FakeMounter, MountCall, TempDir};
    use super::*;

    #[test]
    fn a_local_directory_is_bind_mounted_once_and_read_only_when_asked() {
        let tmp = TempDir::new("local");
        let source = tmp.path().join("disk");
        fs::create_dir(&source).expect("mkdir");
        let dir = tmp
            .path()
            .join("pods/u/volumes")
            .join(PLUGIN_DIR)
            .join("pv-1");
        let mounter = FakeMounter::default();
        assert!(mount_dir(&mounter, &source, &dir, true).expect("mounted"));
        assert!(
            !mount_dir(&mounter, &source, &dir, true).expect("again"),
            "a mounted volume is not mounted twice"
        );
        let canonical = fs::canonicalize(&dir).expect("dir");
        assert_eq!(
            mounter.calls(),
            [
                MountCall::Bind {
                    source: source.clone(),
                    target: dir.clone()
                },
                MountCall::RemountReadOnly {
                    target: dir.clone()
                },
            ]
        );
        assert_eq!(mounter.mount_points().expect("table"), [canonical]);

        let file = tmp.path().join("file");
        fs::write(&file, "x").expect("write");
        let err = mount_dir(&mounter, &file, &tmp.path().join("d2"), false).expect_err("file");
        assert_eq!(err.source.raw_os_error(), Some(nix::libc::ENOTDIR));
    }

    #[test]
    fn a_mount_point_holding_files_is_never_removed() {
        let tmp = TempDir::new("points");
        let plugin_dir = tmp.path().join(PLUGIN_DIR);
        fs::create_dir_all(plugin_dir.join("empty")).expect("mkdir");
        fs::create_dir_all(plugin_dir.join("full")).expect("mkdir");
        fs::write(plugin_dir.join("full/data"), "keep").expect("write");
        let err = remove_mount_points(&plugin_dir).expect_err("not empty");
        assert_eq!(err.source.raw_os_error(), Some(nix::libc::ENOTEMPTY));
        assert_eq!(
            fs::read_to_string(plugin_dir.join("full/data")).expect("kept"),
            "keep"
        );
        fs::remove_file(plugin_dir.join("full/data")).expect("rm");
        remove_mount_points(&plugin_dir).expect("empty mount points go");
        assert!(!plugin_dir.exists());
        remove_mount_points(&plugin_dir).expect("nothing to remove");
    }

    #[test]
    fn only_a_block_device_is_mapped() {
        let tmp = TempDir::new("block");
        let link = tmp
            .path()
            .join("pods/u/volumeDevices")
            .join(PLUGIN_DIR)
            .join("pv");
        let err = map_device(Path::new("/dev/null"), &link).expect_err("a char device");
        assert_eq!(err.source.raw_os_error(), Some(nix::libc::ENOTBLK));
        assert!(!link.exists());
    }
}
