//! subPath and subPathExpr: a path inside a volume for one volumeMount, as the kubelet's
//! safe subpath does it. The expression is expanded from the container's environment; the
//! path is checked (relative, no `..`), created when missing with `mkdirat` from a
//! directory opened without following symlinks, opened again element by element with
//! `O_NOFOLLOW`, and that open file is bind-mounted (through `/proc/self/fd/<fd>`) at
//! `<pod dir>/volume-subpaths/<volume>/<container>/<mount index>`. The container gets that
//! bind mount: a symlink planted in the volume, before or after, cannot lead it out.
//! Blocking parts: call from a blocking thread.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fchmod, fstat, mkdirat};

use super::error::FsError;
use super::mounter::Mounter;

/// Under the pod directory: the bind mounts of subpaths.
pub(super) const SUBPATHS_DIR: &str = "volume-subpaths";
/// Mode of the directories holding subpath bind mounts, and of directory targets.
const BIND_DIR_MODE: u32 = 0o750;
/// Mode of file targets.
const BIND_FILE_MODE: u32 = 0o640;

/// Expands a `subPathExpr` with the container's environment (the kubelet's
/// `ExpandContainerVolumeMounts`): every referenced variable must be set and not empty.
pub(super) fn expand(expr: &str, env: &HashMap<String, String>) -> Result<String, String> {
    let mut missing = std::collections::BTreeSet::new();
    let expanded = crate::expansion::expand(expr, |name| {
        let value = env.get(name).cloned().unwrap_or_default();
        if value.is_empty() {
            missing.insert(name.to_owned());
        }
        Some(value)
    });
    if missing.is_empty() {
        Ok(expanded)
    } else {
        let names: Vec<_> = missing.into_iter().collect();
        Err(format!("missing value for {}", names.join(", ")))
    }
}

/// A subPath must be a relative path without `..` elements (the kubelet's texts).
pub(super) fn check(sub_path: &str) -> Result<(), String> {
    if Path::new(sub_path).is_absolute() {
        return Err(format!(
            "error SubPath `{sub_path}` must not be an absolute path"
        ));
    }
    if sub_path.split('/').any(|part| part == "..") {
        return Err(format!(
            "unable to provision SubPath `{sub_path}`: must not contain '..'"
        ));
    }
    Ok(())
}

/// A step of making or binding a subpath that failed. The details go to the log only (as
/// in the kubelet: they could tell the user about the host's file system).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct SubPathFailure(String);

impl From<FsError> for SubPathFailure {
    fn from(e: FsError) -> Self {
        Self(format!("{} {}: {}", e.action, e.path.display(), e.source))
    }
}

fn fail(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> SubPathFailure {
    move |e| SubPathFailure(format!("{what}: {e}"))
}

fn errno(what: impl std::fmt::Display) -> impl FnOnce(nix::Error) -> SubPathFailure {
    move |e| SubPathFailure(format!("{what}: {e}"))
}

/// The plain elements of a checked subPath.
fn elements(path: &Path) -> Vec<&OsStr> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect()
}

const NOFOLLOW_DIR: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_CLOEXEC);

/// Creates `<volume>/<sub_path>` as a directory with `mode` unless something exists there
/// (the kubelet's
/// `SafeMakeDir`): the existing part must resolve inside the volume, and the missing
/// elements are made with `mkdirat` and entered with `O_NOFOLLOW`, so that nothing is
/// ever created outside the volume.
pub(super) fn safe_make_dir(
    volume: &Path,
    sub_path: &str,
    mode: u32,
) -> Result<(), SubPathFailure> {
    let base = fs::canonicalize(volume).map_err(fail(format_args!(
        "error resolving symlinks in {}",
        volume.display()
    )))?;
    let full = base.join(sub_path);
    match fs::metadata(&full) {
        // Whatever it is, the bind mount checks it.
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(format_args!("stat {}", full.display()))(e)),
    }
    let parts = elements(Path::new(sub_path));
    let mut existing = base.clone();
    let mut created_from = parts.len();
    for (i, part) in parts.iter().enumerate() {
        let next = existing.join(part);
        match fs::metadata(&next) {
            Ok(_) => existing = next,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                created_from = i;
                break;
            }
            Err(e) => return Err(fail(format_args!("stat {}", next.display()))(e)),
        }
    }
    let real = resolve_within(&existing, &base, |path, base| {
        format!(
            "path {} is outside of allowed base {}",
            path.display(),
            base.display()
        )
    })?;
    let mut dir = safe_open(&real, &base, NOFOLLOW_DIR)?;
    let mut current = real;
    for part in &parts[created_from..] {
        current.push(part);
        mkdirat(dir.as_fd(), *part, Mode::from_bits_truncate(mode)).map_err(errno(
            format_args!("cannot create directory {}", current.display()),
        ))?;
        dir = openat(dir.as_fd(), *part, NOFOLLOW_DIR, Mode::empty())
            .map_err(errno(format_args!("cannot open {}", current.display())))?;
    }
    // mkdirat went through the umask: the last directory, the one the container sees,
    // gets the volume's mode exactly.
    fchmod(dir.as_fd(), Mode::from_bits_truncate(mode))
        .map_err(errno(format_args!("chmod {}", current.display())))
}

/// `path` with its symlinks resolved, refused with the text `outside(path, base)` when that
/// is not inside `base`.
fn resolve_within(
    path: &Path,
    base: &Path,
    outside: fn(&Path, &Path) -> String,
) -> Result<PathBuf, SubPathFailure> {
    let real = fs::canonicalize(path).map_err(fail(format_args!(
        "error resolving symlinks in {}",
        path.display()
    )))?;
    if real.starts_with(base) {
        Ok(real)
    } else {
        Err(SubPathFailure(outside(&real, base)))
    }
}

/// Opens `path` (resolved, inside `base`) element by element from `base` without following
/// any symlink (the kubelet's `doSafeOpen`); the last element with `last_flags`.
fn safe_open(path: &Path, base: &Path, last_flags: OFlag) -> Result<OwnedFd, SubPathFailure> {
    let rest = path.strip_prefix(base).map_err(|_| {
        SubPathFailure(format!(
            "path {} is outside of allowed base {}",
            path.display(),
            base.display()
        ))
    })?;
    let parts = elements(rest);
    let base_flags = if parts.is_empty() {
        last_flags
    } else {
        NOFOLLOW_DIR
    };
    let mut fd = nix::fcntl::open(base, base_flags, Mode::empty()).map_err(errno(format_args!(
        "cannot open directory {}",
        base.display()
    )))?;
    let mut current = base.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        current.push(part);
        let flags = if i + 1 == parts.len() {
            last_flags
        } else {
            NOFOLLOW_DIR
        };
        fd = openat(fd.as_fd(), *part, flags, Mode::empty())
            .map_err(errno(format_args!("cannot open {}", current.display())))?;
        let stat = fstat(fd.as_fd()).map_err(errno(format_args!(
            "error running fstat on {}",
            current.display()
        )))?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK {
            return Err(SubPathFailure(format!(
                "unexpected symlink found {}",
                current.display()
            )));
        }
    }
    Ok(fd)
}

/// Where one subpath of a container is bind-mounted.
#[derive(Debug, Clone)]
pub(super) struct BindTarget<'a> {
    pub(super) pod_dir: &'a Path,
    pub(super) volume: &'a str,
    pub(super) container: &'a str,
    pub(super) mount_index: usize,
}

impl BindTarget<'_> {
    fn path(&self) -> PathBuf {
        self.pod_dir
            .join(SUBPATHS_DIR)
            .join(self.volume)
            .join(self.container)
            .join(self.mount_index.to_string())
    }
}

/// Bind-mounts `<volume>/<sub_path>`, opened safely, at the target, and returns the
/// target (the kubelet's `PrepareSafeSubpath`). A target already holding that very file
/// is reused; one holding something else is unmounted first.
pub(super) fn bind_sub_path<M: Mounter + ?Sized>(
    mounter: &M,
    volume: &Path,
    sub_path: &str,
    target: &BindTarget<'_>,
) -> Result<PathBuf, SubPathFailure> {
    let base = fs::canonicalize(volume).map_err(fail(format_args!(
        "error resolving symlinks in {}",
        volume.display()
    )))?;
    let full = base.join(sub_path);
    let path = resolve_within(&full, &base, |path, base| {
        format!(
            "subpath {} not within volume path {}",
            path.display(),
            base.display()
        )
    })?;
    let path_only = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = safe_open(&path, &base, path_only)
        .map_err(|e| SubPathFailure(format!("error opening subpath {}: {e}", path.display())))?;
    let opened = fstat(fd.as_fd()).map_err(errno(format_args!(
        "error running fstat on {}",
        path.display()
    )))?;

    let bind = target.path();
    let parent = bind.parent().unwrap_or(target.pod_dir);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(BIND_DIR_MODE)
        .create(parent)
        .map_err(fail(format_args!(
            "error creating directory {}",
            parent.display()
        )))?;
    let parent = fs::canonicalize(parent)
        .map_err(fail(format_args!("error resolving {}", parent.display())))?;
    let bind = parent.join(target.mount_index.to_string());
    let mounted = mounter
        .mount_points()
        .map_err(fail("error reading the mount table"))?
        .contains(&bind);
    if mounted {
        let same =
            fs::metadata(&bind).is_ok_and(|m| m.dev() == opened.st_dev && m.ino() == opened.st_ino);
        if same {
            return Ok(bind);
        }
        mounter
            .unmount(&bind)
            .map_err(fail(format_args!("error unmounting {}", bind.display())))?;
    }
    let is_dir = SFlag::from_bits_truncate(opened.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
    let made = if is_dir {
        fs::DirBuilder::new().mode(BIND_DIR_MODE).create(&bind)
    } else {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(BIND_FILE_MODE)
            .open(&bind)
            .map(drop)
    };
    match made {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(fail(format_args!("error creating {}", bind.display()))(e));
        }
        _ => {}
    }
    let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    mounter
        .bind_mount(&source, &bind)
        .map_err(fail(format_args!("error mounting {}", path.display())))?;
    tracing::debug!(sub_path = %path.display(), target = %bind.display(), "bound subPath");
    Ok(bind)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::super::testing::{FakeMounter, MountCall, TempDir};
    use super::*;

    #[test]
    fn expressions_expand_from_the_environment_and_missing_values_fail() {
        let env: HashMap<String, String> = [
            ("POD_NAME".to_owned(), "web-1".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ]
        .into();
        assert_eq!(
            expand("logs/$(POD_NAME)", &env).as_deref(),
            Ok("logs/web-1")
        );
        assert_eq!(expand("$$(POD_NAME)", &env).as_deref(), Ok("$(POD_NAME)"));
        assert_eq!(
            expand("$(NOPE)/$(EMPTY)/$(POD_NAME)", &env),
            Err("missing value for EMPTY, NOPE".to_owned())
        );
    }

    #[test]
    fn absolute_paths_and_backsteps_are_refused_with_the_kubelets_texts() {
        assert_eq!(
            check("/tmp"),
            Err("error SubPath `/tmp` must not be an absolute path".to_owned())
        );
        assert_eq!(
            check(".."),
            Err("unable to provision SubPath `..`: must not contain '..'".to_owned())
        );
        assert!(check("a/../../b").is_err());
        assert!(check("a/..b/c").is_ok());
        assert!(check("logs/web").is_ok());
    }

    #[test]
    fn missing_directories_are_made_inside_with_the_volumes_mode() {
        let tmp = TempDir::new("subpath");
        let volume = tmp.path().join("vol");
        fs::create_dir(&volume).expect("mkdir");
        fs::create_dir(volume.join("in")).expect("mkdir");
        symlink("in", volume.join("inner-link")).expect("symlink");
        safe_make_dir(&volume, "a/b/c", 0o2775).expect("made");
        let made = volume.join("a/b/c");
        assert!(made.is_dir());
        assert_eq!(
            fs::metadata(&made).expect("stat").permissions().mode() & 0o7777,
            0o2775
        );
        safe_make_dir(&volume, "a/b/c", 0o700).expect("exists: nothing to do");
        // A symlink that stays inside the volume is followed, as by the kubelet.
        safe_make_dir(&volume, "inner-link/x", 0o755).expect("inside");
        assert!(volume.join("in/x").is_dir());
        fs::write(volume.join("file"), "").expect("write");
        safe_make_dir(&volume, "file", 0o755).expect("exists: nothing to do");
        assert!(safe_make_dir(&volume, "file/x", 0o755).is_err());
    }

    #[test]
    fn a_symlink_out_of_the_volume_creates_nothing_outside() {
        let tmp = TempDir::new("subpath");
        let volume = tmp.path().join("vol");
        let outside = tmp.path().join("outside");
        fs::create_dir(&volume).expect("mkdir");
        fs::create_dir(&outside).expect("mkdir");
        symlink(&outside, volume.join("escape")).expect("symlink");
        let err = safe_make_dir(&volume, "escape/created/deeper", 0o777).expect_err("refused");
        assert!(err.0.contains("outside of allowed base"), "{err}");
        assert!(!outside.join("created").exists(), "nothing made outside");
        // An existing directory behind the symlink is not bound either.
        let mounter = FakeMounter::default();
        let target = BindTarget {
            pod_dir: tmp.path(),
            volume: "vol",
            container: "app",
            mount_index: 0,
        };
        let err = bind_sub_path(&mounter, &volume, "escape", &target).expect_err("refused");
        assert!(err.0.contains("not within volume path"), "{err}");
        assert!(mounter.calls().is_empty());
    }

    #[test]
    fn the_opened_path_is_bound_and_a_repeat_reuses_the_mount() {
        let tmp = TempDir::new("subpath");
        let volume = fs::canonicalize(tmp.path()).expect("canon").join("vol");
        fs::create_dir_all(volume.join("logs/app")).expect("mkdir");
        fs::write(volume.join("conf"), "x").expect("write");
        let pod_dir = fs::canonicalize(tmp.path()).expect("canon");
        let mounter = FakeMounter::default();
        let target = |mount_index| BindTarget {
            pod_dir: &pod_dir,
            volume: "vol",
            container: "app",
            mount_index,
        };
        let dir = bind_sub_path(&mounter, &volume, "logs/app", &target(0)).expect("bound");
        assert_eq!(dir, pod_dir.join("volume-subpaths/vol/app/0"));
        assert!(dir.is_dir());
        let file = bind_sub_path(&mounter, &volume, "conf", &target(3)).expect("bound");
        assert!(file.is_file(), "a file target for a file");
        assert_eq!(
            mounter.calls(),
            [
                MountCall::Bind {
                    source: volume.join("logs/app"),
                    target: dir.clone()
                },
                MountCall::Bind {
                    source: volume.join("conf"),
                    target: file
                },
            ]
        );
        // Mounted already, but (the fake binds nothing) not the same file: bound anew.
        bind_sub_path(&mounter, &volume, "logs/app", &target(0)).expect("bound");
        assert_eq!(
            mounter.calls()[2],
            MountCall::Unmount {
                target: dir.clone()
            }
        );
        assert_eq!(mounter.calls().len(), 4);
    }
}
