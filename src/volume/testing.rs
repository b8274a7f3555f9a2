//! Test doubles of the module's boundary (a mounter that records calls) and a
//! self-removing temporary directory. Compiled for tests only; the pod worker's unit tests
//! may use them too. The fake API server is [`crate::watch_manager::testing::FakeApi`].

use crate::lock::lock;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::mounter::Mounter;

/// A group the test process may give its files: any as root (one it is not in, so that
/// the change shows), else its own.
pub(crate) fn fs_group_for_tests() -> u32 {
    if nix::unistd::geteuid().is_root() {
        4321
    } else {
        nix::unistd::getegid().as_raw()
    }
}

/// A directory under the system temp dir, removed with its contents on drop.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(prefix: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "rkubelet-{prefix}-{}-{nanos:x}-{n}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A call made to the [`FakeMounter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MountCall {
    Tmpfs {
        target: PathBuf,
        size: Option<u64>,
    },
    /// `source` as resolved at the call (a `/proc/self/fd` link names the opened file).
    Bind {
        source: PathBuf,
        target: PathBuf,
    },
    RemountReadOnly {
        target: PathBuf,
    },
    Unmount {
        target: PathBuf,
    },
}

/// A mounter that mounts nothing but records calls and keeps a mount table. Clones share
/// their state.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeMounter {
    inner: Arc<FakeMounterState>,
}

#[derive(Debug, Default)]
struct FakeMounterState {
    calls: Mutex<Vec<MountCall>>,
    table: Mutex<Vec<PathBuf>>,
}

impl FakeMounter {
    pub(crate) fn calls(&self) -> Vec<MountCall> {
        lock(&self.inner.calls).clone()
    }

    /// A mount that exists without a call (another program's, or an earlier agent's).
    pub(crate) fn add_existing(&self, target: &Path) {
        lock(&self.inner.table).push(target.to_owned());
    }
}

impl Mounter for FakeMounter {
    fn mount_tmpfs(&self, target: &Path, size_bytes: Option<u64>) -> io::Result<()> {
        if !target.is_dir() {
            return Err(io::ErrorKind::NotFound.into());
        }
        lock(&self.inner.calls).push(MountCall::Tmpfs {
            target: target.to_owned(),
            size: size_bytes,
        });
        lock(&self.inner.table).push(target.to_owned());
        Ok(())
    }

    fn bind_mount(&self, source: &Path, target: &Path) -> io::Result<()> {
        let source = std::fs::read_link(source).unwrap_or_else(|_| source.to_owned());
        std::fs::symlink_metadata(target)?;
        lock(&self.inner.calls).push(MountCall::Bind {
            source,
            target: target.to_owned(),
        });
        lock(&self.inner.table).push(target.to_owned());
        Ok(())
    }

    fn remount_read_only(&self, target: &Path) -> io::Result<()> {
        if !lock(&self.inner.table).iter().any(|p| p == target) {
            return Err(nix::errno::Errno::EINVAL.into());
        }
        lock(&self.inner.calls).push(MountCall::RemountReadOnly {
            target: target.to_owned(),
        });
        Ok(())
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        lock(&self.inner.calls).push(MountCall::Unmount {
            target: target.to_owned(),
        });
        let mut table = lock(&self.inner.table);
        match table.iter().rposition(|p| p == target) {
            Some(i) => {
                table.remove(i);
                Ok(())
            }
            None => Err(nix::errno::Errno::EINVAL.into()),
        }
    }

    fn mount_points(&self) -> io::Result<Vec<PathBuf>> {
        Ok(lock(&self.inner.table).clone())
    }
}
