//! Filesystem figures as cAdvisor gives them the kubelet: a filesystem's capacity,
//! available and used bytes and inodes (`statvfs`), the device it is mounted from
//! (`/proc/self/mountinfo`), and the disk usage of a directory tree (`du`: allocated
//! blocks and inodes), for container logs and emptyDir volumes. Everything here blocks.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// A filesystem's size and use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsInfo {
    /// Total size, in bytes.
    pub capacity_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// Bytes in use: total less free blocks (reserved blocks count as used).
    pub used_bytes: u64,
    /// Total inodes.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
}

impl FsInfo {
    /// Inodes in use.
    #[must_use]
    pub fn inodes_used(&self) -> u64 {
        self.inodes.saturating_sub(self.inodes_free)
    }
}

/// The disk usage of a directory tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskUsage {
    /// Allocated bytes.
    pub bytes: u64,
    /// Inodes.
    pub inodes: u64,
}

/// The filesystem holding `path` (or its nearest existing ancestor).
#[must_use]
pub fn fs_info(path: &Path) -> Option<FsInfo> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let st = nix::sys::statvfs::statvfs(existing)
        .inspect_err(|e| tracing::debug!(path = %existing.display(), error = %e, "statvfs"))
        .ok()?;
    let fragment = st.fragment_size();
    Some(FsInfo {
        capacity_bytes: st.blocks().saturating_mul(fragment),
        available_bytes: st.blocks_available().saturating_mul(fragment),
        used_bytes: st
            .blocks()
            .saturating_sub(st.blocks_free())
            .saturating_mul(fragment),
        inodes: st.files(),
        inodes_free: st.files_free(),
    })
}

/// The source (device) of the mount that holds `path`, from a mountinfo text: the mount
/// with the longest mount point that is a prefix of `path`.
#[must_use]
pub fn device_of(mountinfo: &str, path: &Path) -> Option<String> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount = PathBuf::from(left.split(' ').nth(4)?);
            let source = right.split(' ').nth(1)?;
            path.starts_with(&mount).then(|| (mount, source.to_owned()))
        })
        .max_by_key(|(mount, _)| mount.as_os_str().len())
        .map(|(_, source)| source)
}

/// Disk usage of a directory tree: allocated bytes (512-byte blocks, as `du`) and inodes
/// (entries, the directory itself included). A tree that cannot be read counts as empty;
/// entries that vanish while it is walked are skipped.
#[must_use]
pub fn disk_usage(dir: &Path) -> (u64, u64) {
    let mut bytes = 0u64;
    let mut inodes = 0u64;
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&next) else {
            continue;
        };
        bytes = bytes.saturating_add(meta.blocks().saturating_mul(512));
        inodes += 1;
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&next)
        {
            pending.extend(entries.flatten().map(|e| e.path()));
        }
    }
    (bytes, inodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_mount_point_holds_a_path() {
        let mountinfo = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
            30 22 0:26 / /var/lib/kubelet rw shared:2 - xfs /dev/sdb1 rw\n\
            31 22 0:27 / /var/lib/kubelet-other rw shared:3 - xfs /dev/sdc1 rw\n";
        assert_eq!(
            device_of(mountinfo, Path::new("/var/lib/kubelet/pods")).as_deref(),
            Some("/dev/sdb1")
        );
        assert_eq!(
            device_of(mountinfo, Path::new("/var/log/pods")).as_deref(),
            Some("/dev/sda1")
        );
    }

    #[test]
    fn disk_usage_counts_allocated_blocks_and_entries() {
        let dir = std::env::temp_dir().join(format!("rkubelet-du-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.log"), vec![b'x'; 10_000]).unwrap();
        std::fs::write(dir.join("sub/b.log"), vec![b'y'; 5000]).unwrap();
        let (bytes, inodes) = disk_usage(&dir);
        assert_eq!(inodes, 4);
        assert!(bytes >= 15_000, "{bytes}");
        let meta = |p: &str| std::fs::symlink_metadata(dir.join(p)).unwrap().blocks() * 512;
        assert_eq!(
            bytes,
            meta("") + meta("sub") + meta("a.log") + meta("sub/b.log")
        );
        assert_eq!(disk_usage(&dir.join("missing")), (0, 0));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn fs_info_agrees_with_statvfs() {
        let info = fs_info(Path::new("/")).unwrap();
        assert!(info.capacity_bytes >= info.used_bytes);
        assert!(info.capacity_bytes >= info.available_bytes);
        assert!(info.inodes >= info.inodes_free);
        // A path that does not exist yet is on its nearest ancestor's filesystem.
        assert!(fs_info(Path::new("/nonexistent-rkubelet/dir")).is_some());
    }
}
