//! Filesystem figures as cAdvisor gives them the kubelet: a filesystem's capacity,
//! available and used bytes and inodes (`statvfs`), the device it is mounted from
//! (`/proc/self/mountinfo`), and the disk usage of a directory tree (`du`: allocated
//! blocks and inodes), for container logs and emptyDir volumes; and the machine's
//! filesystems cAdvisor reports on the root cgroup (its "partitions", [`partitions`]) with
//! their disks' I/O counters (`/proc/diskstats`, [`parse_diskstats`]). Everything here
//! that reads blocks.

use std::collections::HashMap;
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
    statvfs_of(path.ancestors().find(|p| p.exists())?)
}

/// The filesystem mounted at (or holding) an existing `path`.
fn statvfs_of(existing: &Path) -> Option<FsInfo> {
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

/// A filesystem of the machine as cAdvisor lists it: its device (a tmpfs is named by its
/// mount point, an overlay by its source and device numbers) and where it is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The `device` label.
    pub device: String,
    /// Where it is mounted (the first mount of the device).
    pub mount_point: PathBuf,
    /// The device numbers of the mount.
    pub major: u32,
    /// See `major`.
    pub minor: u32,
}

/// The machine's filesystems as cAdvisor lists them once at start (`fs.NewFsInfo`): the
/// mounts of ext*, btrfs, overlay, tmpfs, xfs and zfs filesystems in mountinfo's order,
/// one per device (a device's first mount, as a bind mount is left out), except tmpfs,
/// each mount of which is its own (named by its mount point; the last one kept).
#[must_use]
pub fn partitions(mountinfo: &str) -> Vec<Partition> {
    let mut out: Vec<Partition> = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let (Some(fs_type), Some(source)) = (right.next(), right.next()) else {
            continue;
        };
        let (Some(numbers), Some(mount_point)) = (left.get(2), left.get(4)) else {
            continue;
        };
        let Some((major, minor)) = numbers
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        else {
            continue;
        };
        if !fs_type.starts_with("ext")
            && !["btrfs", "overlay", "tmpfs", "xfs", "zfs"].contains(&fs_type)
        {
            continue;
        }
        let device = match fs_type {
            "tmpfs" => (*mount_point).to_owned(),
            "overlay" => format!("{source}_{major}-{minor}"),
            _ => source.to_owned(),
        };
        let partition = Partition {
            device,
            mount_point: PathBuf::from(mount_point),
            major,
            minor,
        };
        match out.iter_mut().find(|p| p.device == partition.device) {
            Some(known) if fs_type == "tmpfs" => *known = partition,
            Some(_) => {}
            None => out.push(partition),
        }
    }
    out
}

/// A disk's I/O counters, as `/proc/diskstats` gives them (times in milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskStats {
    /// Reads completed.
    pub reads: u64,
    /// Reads merged.
    pub reads_merged: u64,
    /// Sectors read.
    pub sectors_read: u64,
    /// Time spent reading (ms).
    pub read_ms: u64,
    /// Writes completed.
    pub writes: u64,
    /// Writes merged.
    pub writes_merged: u64,
    /// Sectors written.
    pub sectors_written: u64,
    /// Time spent writing (ms).
    pub write_ms: u64,
    /// I/Os in progress.
    pub in_progress: u64,
    /// Time spent doing I/Os (ms).
    pub io_ms: u64,
    /// Weighted time spent doing I/Os (ms).
    pub weighted_io_ms: u64,
}

/// The disks of a `/proc/diskstats` text cAdvisor reads (`sd*`, `vd*`, `xvd*`, `dm-*`), by
/// device number, with their `/dev/` name.
#[must_use]
pub fn parse_diskstats(text: &str) -> HashMap<(u32, u32), (String, DiskStats)> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [major, minor, name, figures @ ..] = words.as_slice() else {
            continue;
        };
        if !is_cadvisor_disk(name) || figures.len() < 11 {
            continue;
        }
        let Some(n) = figures[..11]
            .iter()
            .map(|f| f.parse::<u64>().ok())
            .collect::<Option<Vec<u64>>>()
        else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) else {
            continue;
        };
        let stats = DiskStats {
            reads: n[0],
            reads_merged: n[1],
            sectors_read: n[2],
            read_ms: n[3],
            writes: n[4],
            writes_merged: n[5],
            sectors_written: n[6],
            write_ms: n[7],
            in_progress: n[8],
            io_ms: n[9],
            weighted_io_ms: n[10],
        };
        out.insert((major, minor), (format!("/dev/{name}"), stats));
    }
    out
}

/// cAdvisor's `(s|v|xv)d[a-z]+[0-9]*` or `dm-[0-9]+`.
fn is_cadvisor_disk(name: &str) -> bool {
    let digits_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(n) = name.strip_prefix("dm-") {
        return digits_only(n);
    }
    let Some(rest) = ["sd", "vd", "xvd"]
        .iter()
        .find_map(|p| name.strip_prefix(p))
    else {
        return false;
    };
    let letters = rest.bytes().take_while(u8::is_ascii_lowercase).count();
    letters > 0 && rest[letters..].bytes().all(|b| b.is_ascii_digit())
}

/// One of the machine's filesystems now: its size and use, and its disk's counters (none
/// for a tmpfs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesystemFigures {
    /// The `device` label.
    pub device: String,
    /// Its size and use.
    pub info: FsInfo,
    /// Its disk's counters, looked up by name, else by device number.
    pub disk: DiskStats,
}

/// The figures of `partitions` now, with the disks of `diskstats`; a filesystem that
/// cannot be read is left out, as cAdvisor leaves it.
#[must_use]
pub fn filesystems(
    partitions: &[Partition],
    diskstats: &HashMap<(u32, u32), (String, DiskStats)>,
) -> Vec<FilesystemFigures> {
    partitions
        .iter()
        .filter_map(|p| {
            let info = statvfs_of(&p.mount_point)?;
            let disk = diskstats
                .values()
                .find(|(name, _)| *name == p.device)
                .or_else(|| diskstats.get(&(p.major, p.minor)))
                .map(|(_, d)| *d)
                .unwrap_or_default();
            Some(FilesystemFigures {
                device: p.device.clone(),
                info,
                disk,
            })
        })
        .collect()
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
    fn partitions_as_cadvisor_lists_them() {
        let mountinfo = "24 27 0:6 / /dev rw - devtmpfs devtmpfs rw\n\
            25 24 0:23 / /dev/shm rw - tmpfs tmpfs rw\n\
            27 1 254:0 / / rw - ext4 /dev/vda rw\n\
            30 25 0:27 / /dev/shm rw - tmpfs tmpfs rw\n\
            31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
            32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
            42 27 254:0 /run/netns /run/netns rw shared:1 - ext4 /dev/vda rw\n\
            50 27 0:40 / /var/lib/x/rootfs rw - overlay overlay rw,lowerdir=/a\n";
        let p = partitions(mountinfo);
        let devices: Vec<&str> = p.iter().map(|p| p.device.as_str()).collect();
        assert_eq!(
            devices,
            ["/dev/shm", "/dev/vda", "/sys/fs/cgroup", "overlay_0-40"]
        );
        // The root's first mount; the second tmpfs on /dev/shm replaces the first.
        assert_eq!(p[1].mount_point, Path::new("/"));
        assert_eq!((p[0].major, p[0].minor), (0, 27));
        assert_eq!((p[1].major, p[1].minor), (254, 0));
    }

    #[test]
    fn diskstats_of_the_disks_cadvisor_reads() {
        let text = " 254       0 vda 1837021 43106 104584162 2534 961267 841721 333302584 1868 0 261 4518 0 0 0 0\n\
             254      16 vdb 5 0 10 0 0 0 0 0 0 0 0\n\
               7       0 loop0 1 2 3 4 5 6 7 8 9 10 11\n\
               8       1 sda1 1 2 3 4 5 6 7 8 9 10 11\n\
             253       0 dm-0 1 2 3 4 5 6 7 8 9 10 11\n\
               8       2 sdX 1 2 3 4 5 6 7 8 9 10 11\n";
        let d = parse_diskstats(text);
        let mut names: Vec<&str> = d.values().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["/dev/dm-0", "/dev/sda1", "/dev/vda", "/dev/vdb"]);
        let (_, vda) = &d[&(254, 0)];
        assert_eq!(vda.reads, 1_837_021);
        assert_eq!(vda.sectors_written, 333_302_584);
        assert_eq!(vda.weighted_io_ms, 4518);
    }

    #[test]
    fn the_filesystems_figures_with_their_disks() {
        let root = Partition {
            device: "/dev/vda".into(),
            mount_point: "/".into(),
            major: 254,
            minor: 0,
        };
        let by_number = Partition {
            device: "/dev/root".into(),
            ..root.clone()
        };
        let gone = Partition {
            device: "/gone".into(),
            mount_point: "/nonexistent-rkubelet-mount".into(),
            major: 0,
            minor: 99,
        };
        let disks = parse_diskstats("254 0 vda 1 2 3 4 5 6 7 8 9 10 11\n");
        let figures = filesystems(&[root, by_number, gone], &disks);
        assert_eq!(figures.len(), 2);
        assert_eq!(figures[0].disk.reads, 1);
        assert_eq!(figures[1].disk.weighted_io_ms, 11);
        let root_fs = fs_info(Path::new("/")).unwrap();
        assert_eq!(figures[0].info.capacity_bytes, root_fs.capacity_bytes);
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
