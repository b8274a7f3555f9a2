//! The OS mount boundary: tmpfs mounts for memory-backed volumes, bind mounts of subpaths
//! and local persistent volumes (read-only by a remount),
//! their unmount, and the mount table. Behind a trait so the volume logic is tested without root.

use std::io;
use std::path::{Path, PathBuf};

/// Mounts and unmounts the tmpfs file systems of memory-backed volumes. Called from blocking
/// threads only (never on the async runtime).
pub trait Mounter: Send + Sync + 'static {
    /// Mounts a new tmpfs on the existing directory `target`, of at most `size_bytes` if
    /// given (else the kernel's default, half of RAM).
    ///
    /// # Errors
    /// The OS error of the mount.
    fn mount_tmpfs(&self, target: &Path, size_bytes: Option<u64>) -> io::Result<()>;

    /// Bind-mounts `source` (a file or directory, or a `/proc/self/fd/<fd>` link to one) on
    /// the existing `target` of the same kind.
    ///
    /// # Errors
    /// The OS error of the mount.
    fn bind_mount(&self, source: &Path, target: &Path) -> io::Result<()>;

    /// Makes the bind mount on `target` read-only (a bind remount with `MS_RDONLY`).
    ///
    /// # Errors
    /// The OS error of the remount.
    fn remount_read_only(&self, target: &Path) -> io::Result<()>;

    /// Unmounts the file system mounted on `target` (the topmost one, if stacked).
    ///
    /// # Errors
    /// The OS error of the unmount (`EBUSY` while something still uses it).
    fn unmount(&self, target: &Path) -> io::Result<()>;

    /// The mount points of this process's mount namespace, in mount-table order (a point
    /// appears once per stacked mount).
    ///
    /// # Errors
    /// When the mount table cannot be read.
    fn mount_points(&self) -> io::Result<Vec<PathBuf>>;

    /// Whether a file system is mounted on the directory `dir` (a canonical path); by
    /// default from the mount table.
    ///
    /// # Errors
    /// When the mount table cannot be read.
    fn is_mount_point(&self, dir: &Path) -> io::Result<bool> {
        Ok(self.mount_points()?.iter().any(|p| p == dir))
    }
}

/// The mount table of this process.
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// [`Mounter`] with the Linux `mount(2)` and `umount2(2)` system calls. Needs
/// `CAP_SYS_ADMIN`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxMounter;

impl Mounter for LinuxMounter {
    fn mount_tmpfs(&self, target: &Path, size_bytes: Option<u64>) -> io::Result<()> {
        use nix::mount::{MsFlags, mount};
        let data = size_bytes.map(|size| format!("size={size}"));
        // nosuid and nodev: nothing in a secret or scratch volume needs either.
        mount(
            Some("tmpfs"),
            target,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            data.as_deref(),
        )
        .map_err(io::Error::from)
    }

    fn bind_mount(&self, source: &Path, target: &Path) -> io::Result<()> {
        use nix::mount::{MsFlags, mount};
        mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(io::Error::from)
    }

    fn remount_read_only(&self, target: &Path) -> io::Result<()> {
        use nix::mount::{MsFlags, mount};
        mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(io::Error::from)
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        use nix::mount::{MntFlags, umount2};
        umount2(target, MntFlags::UMOUNT_NOFOLLOW).map_err(io::Error::from)
    }

    fn mount_points(&self) -> io::Result<Vec<PathBuf>> {
        Ok(parse_mountinfo(&std::fs::read_to_string(MOUNTINFO)?))
    }

    /// As the kubelet's `IsLikelyNotMountPoint`: `dir` is on another device than its
    /// parent. Two `stat`s, where the mount table of a node with a hundred pods is some
    /// hundreds of lines the kernel writes out (its overlay options most of it) on every
    /// read; a bind mount of the same file system is not seen, which a tmpfs never is.
    fn is_mount_point(&self, dir: &Path) -> io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        let parent = dir.parent().unwrap_or(dir);
        Ok(std::fs::metadata(dir)?.dev() != std::fs::metadata(parent)?.dev())
    }
}

/// The mount points (fifth field) of a `/proc/<pid>/mountinfo` text, unescaped.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_octal(field)))
        .collect()
}

/// Undoes the kernel's `\ooo` escapes of space, tab, newline and backslash in mountinfo.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let Some(digits) = octal {
            let value = digits
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_mount_points_are_unescaped() {
        let text = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
97 22 0:50 / /var/lib/rk/pods/u1/volumes/kubernetes.io~secret/tok rw,nosuid,nodev,relatime shared:50 - tmpfs tmpfs rw
98 22 0:51 / /tmp/with\\040space\\134x rw - tmpfs tmpfs rw
";
        assert_eq!(
            parse_mountinfo(text),
            [
                PathBuf::from("/"),
                PathBuf::from("/var/lib/rk/pods/u1/volumes/kubernetes.io~secret/tok"),
                PathBuf::from("/tmp/with space\\x"),
            ]
        );
    }

    #[test]
    fn the_real_mount_table_has_a_root() {
        let points = LinuxMounter.mount_points().expect("read mountinfo");
        assert!(points.iter().any(|p| p == Path::new("/")), "{points:?}");
    }

    #[test]
    fn a_mount_point_is_on_another_device_than_its_parent() {
        // /proc is procfs wherever this runs; a fresh directory is on its parent's device.
        assert!(LinuxMounter.is_mount_point(Path::new("/proc")).unwrap());
        let dir = std::env::temp_dir().join(format!("rk-mountpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fresh = LinuxMounter.is_mount_point(&dir.canonicalize().unwrap());
        std::fs::remove_dir(&dir).unwrap();
        assert!(!fresh.unwrap());
        assert!(
            LinuxMounter
                .is_mount_point(Path::new("/no/such/dir"))
                .is_err()
        );
    }
}
