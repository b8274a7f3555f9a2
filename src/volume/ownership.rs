//! fsGroup ownership of a volume, as the kubelet's `SetVolumeOwnership`: every file,
//! directory and symlink (the link itself) gets the group `fsGroup`; files and directories
//! also the group's read (read-only volumes) or read-write bits, directories also the group's search bit and setgid, so
//! files made later inherit the group. With `fsGroupChangePolicy: OnRootMismatch` the walk
//! is skipped when the volume's root already has that group and those bits. Blocking: call
//! from a blocking thread.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::error::FsError;

/// Group read-write bits.
const RW_MASK: u32 = 0o660;
/// Group read bits, for read-only volumes.
const RO_MASK: u32 = 0o440;
/// Search bits, for directories.
const EXEC_MASK: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// The pod's `securityContext.fsGroup` and its change policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FsGroup {
    pub(super) gid: u32,
    /// `fsGroupChangePolicy: OnRootMismatch`.
    pub(super) on_root_mismatch: bool,
}

/// The bits every file (and, with [`EXEC_MASK`] and setgid, directory) of the volume gets.
pub(super) fn file_mask(read_only: bool) -> u32 {
    if read_only { RO_MASK } else { RW_MASK }
}

/// Gives `dir` and everything under it the group and mode bits of `group`, children
/// before their directory. A failing `chown` or `chmod` is logged, as by the kubelet; a
/// tree that cannot be read is an error.
pub(super) fn set_volume_ownership(
    dir: &Path,
    group: FsGroup,
    read_only: bool,
) -> Result<(), FsError> {
    if group.on_root_mismatch && !requires_change(dir, group.gid, read_only) {
        tracing::debug!(path = %dir.display(), "volume root matches fsGroup: ownership kept");
        return Ok(());
    }
    walk_deep(dir, &mut |path, meta| {
        change_file(path, meta, group.gid, read_only);
    })
}

/// Whether the root of the volume lacks the group, the bits or setgid.
fn requires_change(dir: &Path, gid: u32, read_only: bool) -> bool {
    let Ok(meta) = fs::metadata(dir) else {
        return true;
    };
    if meta.gid() != gid || !meta.is_dir() {
        return true;
    }
    let wanted = file_mask(read_only) | EXEC_MASK;
    let mode = meta.permissions().mode();
    mode & wanted != wanted || mode & SETGID == 0
}

fn change_file(path: &Path, meta: &fs::Metadata, gid: u32, read_only: bool) {
    // The link itself is chowned (as the kubelet's Lchown), never followed.
    if let Err(e) = std::os::unix::fs::lchown(path, None, Some(gid)) {
        tracing::warn!(path = %path.display(), error = %e, "chown to the fsGroup failed");
    }
    if meta.file_type().is_symlink() {
        // chmod would reach the link's target and undo its mode.
        return;
    }
    let mut mask = file_mask(read_only);
    if meta.is_dir() {
        mask |= SETGID | EXEC_MASK;
    }
    let mode = (meta.permissions().mode() & 0o7777) | mask;
    if let Err(e) = fs::set_permissions(path, fs::Permissions::from_mode(mode)) {
        tracing::warn!(path = %path.display(), error = %e, "chmod for the fsGroup failed");
    }
}

/// Visits everything under `root` (not following symlinks), each directory after its
/// children, `root` last.
fn walk_deep(root: &Path, visit: &mut impl FnMut(&Path, &fs::Metadata)) -> Result<(), FsError> {
    let meta = fs::symlink_metadata(root).map_err(FsError::at("inspecting", root))?;
    if meta.is_dir() {
        for entry in fs::read_dir(root).map_err(FsError::at("reading", root))? {
            let entry = entry.map_err(FsError::at("reading", root))?;
            match walk_deep(&entry.path(), visit) {
                // Removed meanwhile (an atomic-writer swap): nothing to own.
                Err(e) if e.source.kind() == io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
    }
    visit(root, &meta);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::super::testing::{TempDir, fs_group_for_tests};
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).expect("stat").permissions().mode() & 0o7777
    }

    fn tree(tmp: &TempDir) -> std::path::PathBuf {
        let root = tmp.path().join("vol");
        fs::create_dir_all(root.join("sub")).expect("mkdir");
        fs::write(root.join("sub/f"), "x").expect("write");
        fs::set_permissions(root.join("sub/f"), fs::Permissions::from_mode(0o600)).expect("chmod");
        fs::set_permissions(root.join("sub"), fs::Permissions::from_mode(0o700)).expect("chmod");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).expect("chmod");
        symlink("sub/f", root.join("link")).expect("symlink");
        root
    }

    #[test]
    fn files_get_group_bits_and_directories_setgid() {
        let tmp = TempDir::new("owner");
        let root = tree(&tmp);
        let group = FsGroup {
            gid: fs_group_for_tests(),
            on_root_mismatch: false,
        };
        set_volume_ownership(&root, group, false).expect("owned");
        assert_eq!(mode(&root.join("sub/f")), 0o660);
        assert_eq!(mode(&root.join("sub")), 0o2770);
        assert_eq!(mode(&root), 0o2775);
        assert_eq!(
            fs::metadata(root.join("sub/f")).expect("stat").gid(),
            fs_group_for_tests()
        );
        let link = fs::symlink_metadata(root.join("link")).expect("lstat");
        assert_eq!(link.gid(), fs_group_for_tests(), "the link itself");

        let tmp = TempDir::new("owner");
        let root = tree(&tmp);
        set_volume_ownership(&root, group, true).expect("owned");
        assert_eq!(mode(&root.join("sub/f")), 0o640, "read-only: group read");
        assert_eq!(mode(&root.join("sub")), 0o2750);
    }

    #[test]
    fn on_root_mismatch_skips_the_walk_when_the_root_matches() {
        let tmp = TempDir::new("owner");
        let root = tree(&tmp);
        let group = FsGroup {
            gid: fs_group_for_tests(),
            on_root_mismatch: true,
        };
        std::os::unix::fs::chown(&root, None, Some(group.gid)).expect("chown");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o2770)).expect("chmod");
        set_volume_ownership(&root, group, false).expect("owned");
        assert_eq!(mode(&root.join("sub/f")), 0o600, "not walked");

        fs::set_permissions(&root, fs::Permissions::from_mode(0o770)).expect("chmod");
        set_volume_ownership(&root, group, false).expect("owned");
        assert_eq!(
            mode(&root.join("sub/f")),
            0o660,
            "no setgid on the root: walked"
        );
        assert_eq!(mode(&root), 0o2770);
    }
}
