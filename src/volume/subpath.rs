//! subPath resolution: a path inside a volume for one volumeMount, refused when it could
//! lead out of the volume. Blocking parts: call from a blocking thread.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use super::error::FsError;

/// A subPath must be a relative path without `..` elements.
pub(super) fn check_sub_path(sub_path: &str) -> Result<(), &'static str> {
    let path = Path::new(sub_path);
    if path.is_absolute() {
        return Err("subPath must be a relative path");
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err("subPath must not contain '..'");
    }
    Ok(())
}

#[derive(Debug)]
pub(super) enum SubPathError {
    Escapes(PathBuf),
    Fs(FsError),
}

impl From<FsError> for SubPathError {
    fn from(e: FsError) -> Self {
        Self::Fs(e)
    }
}

/// `root/sub_path` with symlinks resolved, created as a directory first when missing.
pub(super) fn resolve_sub_path(root: &Path, sub_path: &str) -> Result<PathBuf, SubPathError> {
    let root = fs::canonicalize(root).map_err(FsError::at("resolving", root))?;
    let target = root.join(sub_path);
    if let Err(e) = fs::symlink_metadata(&target) {
        if e.kind() != io::ErrorKind::NotFound {
            return Err(FsError::at("inspecting", &target)(e).into());
        }
        let mode = fs::metadata(&root)
            .map_err(FsError::at("inspecting", &root))?
            .permissions()
            .mode()
            & 0o7777;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(&target)
            .map_err(FsError::at("creating the subPath", &target))?;
        fs::set_permissions(&target, fs::Permissions::from_mode(mode))
            .map_err(FsError::at("setting the mode of", &target))?;
    }
    let resolved = fs::canonicalize(&target).map_err(FsError::at("resolving", &target))?;
    if resolved.starts_with(&root) {
        Ok(resolved)
    } else {
        Err(SubPathError::Escapes(resolved))
    }
}
