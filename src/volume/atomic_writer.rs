//! The kubelet's atomic writer: a volume's files are written into a fresh timestamped
//! directory `..<timestamp>`, the `..data` symlink is switched to it with one `rename`, and
//! each user-visible top-level name is a symlink into `..data`. A reader sees either the
//! old or the new set of files, never a mix. Blocking: call from a blocking thread.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::Timestamp;

use super::error::FsError;
use super::payload::{FileProjection, Payload};

/// The symlink to the current timestamped directory.
pub(super) const DATA_DIR: &str = "..data";
/// The new `..data` symlink before its rename over the old one.
const NEW_DATA_DIR: &str = "..data_tmp";
/// Mode of the timestamped directory and of directories inside it.
const DIR_MODE: u32 = 0o755;

/// Makes `target` (an existing directory) hold exactly `payload`. Returns false when it
/// already did and nothing was written.
pub(super) fn write(target: &Path, payload: &Payload) -> Result<bool, FsError> {
    let data_link = target.join(DATA_DIR);
    let old_dir = match fs::read_link(&data_link) {
        Ok(name) => Some(name),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(FsError::at("reading the symlink", &data_link)(e)),
    };
    // The current files; `None` also when `..data` points nowhere (an interrupted cleanup).
    let old_files = match &old_dir {
        Some(name) => match read_tree(&target.join(name)) {
            Ok(files) => Some(files),
            Err(e) if e.source.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        },
        None => None,
    };
    if let (Some(files), Some(current)) = (&old_files, &old_dir)
        && files == payload
    {
        ensure_visible_links(target, payload)?;
        remove_unused_data_dirs(target, current)?;
        return Ok(false);
    }

    let new_dir = create_timestamped_dir(target)?;
    for (path, file) in payload {
        write_file(&new_dir.join(path), file)?;
    }
    let new_name = new_dir
        .file_name()
        .map(PathBuf::from)
        .ok_or_else(|| FsError::at("naming", &new_dir)(io::ErrorKind::InvalidInput.into()))?;
    let tmp_link = target.join(NEW_DATA_DIR);
    match fs::remove_file(&tmp_link) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(FsError::at("removing the stale symlink", &tmp_link)(e));
        }
        _ => {}
    }
    symlink(&new_name, &tmp_link).map_err(FsError::at("creating the symlink", &tmp_link))?;
    fs::rename(&tmp_link, &data_link).map_err(FsError::at("renaming over", &data_link))?;
    ensure_visible_links(target, payload)?;

    if let Some(old_files) = old_files {
        // User-visible names of the old payload that the new one lacks.
        let new_top = top_level_names(payload.keys());
        for stale in top_level_names(old_files.keys()).difference(&new_top) {
            let path = target.join(stale);
            fs::remove_file(&path).map_err(FsError::at("removing the stale symlink", &path))?;
        }
    }
    remove_unused_data_dirs(target, &new_name)?;
    Ok(true)
}

/// Removes every timestamped data directory in `target` but `current`: the one the
/// switch replaced, and any a crash left before its switch.
fn remove_unused_data_dirs(target: &Path, current: &Path) -> Result<(), FsError> {
    for entry in fs::read_dir(target).map_err(FsError::at("reading", target))? {
        let entry = entry.map_err(FsError::at("reading", target))?;
        let name = entry.file_name();
        let unused = name.to_str().is_some_and(|n| {
            n.starts_with("..") && n != DATA_DIR && n != NEW_DATA_DIR && Path::new(n) != current
        });
        if unused && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let dir = entry.path();
            fs::remove_dir_all(&dir)
                .map_err(FsError::at("removing the old data directory", &dir))?;
        }
    }
    Ok(())
}

/// Creates `target/..YYYY_MM_DD_HH_MM_SS.<nanos>` (UTC), like the kubelet's `ioutil.TempDir`.
fn create_timestamped_dir(target: &Path) -> Result<PathBuf, FsError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let stamp = Timestamp::from_second(seconds)
        .map(|t| t.strftime("%Y_%m_%d_%H_%M_%S").to_string())
        .unwrap_or_else(|_| seconds.to_string());
    let mut suffix = now.subsec_nanos();
    loop {
        let dir = target.join(format!("..{stamp}.{suffix:09}"));
        match fs::DirBuilder::new().mode(DIR_MODE).create(&dir) {
            Ok(()) => {
                set_mode(&dir, DIR_MODE)?;
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => suffix = suffix.wrapping_add(1),
            Err(e) => return Err(FsError::at("creating", &dir)(e)),
        }
    }
}

fn write_file(path: &Path, file: &FileProjection) -> Result<(), FsError> {
    if let Some(parent) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(parent)
            .map_err(FsError::at("creating", parent))?;
    }
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(file.mode)
        .open(path)
        .map_err(FsError::at("creating", path))?;
    f.write_all(&file.data)
        .map_err(FsError::at("writing", path))?;
    // The umask applied at creation: set the mode exactly.
    set_mode(path, file.mode)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), FsError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(FsError::at("setting the mode of", path))
}

/// `target/<name> -> ..data/<name>` for each top-level name of the payload that has no entry
/// yet (an existing entry is left alone, as by the kubelet).
fn ensure_visible_links(target: &Path, payload: &Payload) -> Result<(), FsError> {
    for name in top_level_names(payload.keys()) {
        let link = target.join(&name);
        match fs::symlink_metadata(&link) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                symlink(Path::new(DATA_DIR).join(&name), &link)
                    .map_err(FsError::at("creating the symlink", &link))?;
            }
            Err(e) => return Err(FsError::at("inspecting", &link)(e)),
        }
    }
    Ok(())
}

fn top_level_names<'a>(paths: impl Iterator<Item = &'a String>) -> BTreeSet<OsString> {
    paths
        .filter_map(|p| {
            Path::new(p).components().find_map(|c| match c {
                Component::Normal(name) => Some(name.to_owned()),
                _ => None,
            })
        })
        .collect()
}

/// The files under `dir` as a payload (paths relative to `dir`).
fn read_tree(dir: &Path) -> Result<Payload, FsError> {
    let mut payload = Payload::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let abs = dir.join(&rel);
        for entry in fs::read_dir(&abs).map_err(FsError::at("reading", &abs))? {
            let entry = entry.map_err(FsError::at("reading", &abs))?;
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).map_err(FsError::at("inspecting", &path))?;
            let rel = rel.join(entry.file_name());
            if meta.is_dir() {
                pending.push(rel);
            } else {
                let data = fs::read(&path).map_err(FsError::at("reading", &path))?;
                payload.insert(
                    rel.to_string_lossy().into_owned(),
                    FileProjection {
                        data,
                        mode: meta.permissions().mode() & 0o7777,
                    },
                );
            }
        }
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::super::testing::TempDir;
    use super::*;

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(path, data, mode)| {
                (
                    (*path).to_owned(),
                    FileProjection {
                        data: data.as_bytes().to_vec(),
                        mode: *mode,
                    },
                )
            })
            .collect()
    }

    fn entries(dir: &Path) -> BTreeSet<String> {
        fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn writes_a_timestamped_dir_behind_data_and_visible_symlinks() {
        let tmp = TempDir::new("atomic");
        let target = tmp.path();
        let p = payload(&[("token", "abc", 0o600), ("conf/app.yaml", "x: 1", 0o644)]);
        assert!(write(target, &p).expect("write"));

        let data = fs::read_link(target.join(DATA_DIR)).expect("..data link");
        let data = data.to_string_lossy().into_owned();
        assert!(data.starts_with("..20"), "{data}");
        assert_eq!(
            fs::read_link(target.join("token")).expect("token link"),
            Path::new("..data/token")
        );
        assert_eq!(
            fs::read_link(target.join("conf")).expect("conf link"),
            Path::new("..data/conf")
        );
        assert_eq!(
            fs::read_to_string(target.join("token")).expect("read"),
            "abc"
        );
        assert_eq!(
            fs::read_to_string(target.join("conf/app.yaml")).expect("read"),
            "x: 1"
        );
        let mode = |p: &str| fs::metadata(target.join(p)).expect("stat").mode() & 0o7777;
        assert_eq!(mode("token"), 0o600);
        assert_eq!(mode("conf/app.yaml"), 0o644);
        assert_eq!(mode(&data), 0o755);
        assert_eq!(
            entries(target),
            BTreeSet::from(["..data".into(), data, "conf".into(), "token".into()])
        );
    }

    #[test]
    fn an_unchanged_payload_is_not_rewritten_and_a_changed_one_replaces_all() {
        let tmp = TempDir::new("atomic");
        let target = tmp.path();
        let first = payload(&[("a", "1", 0o644), ("b", "2", 0o644)]);
        assert!(write(target, &first).expect("write"));
        let data = fs::read_link(target.join(DATA_DIR)).expect("link");
        assert!(!write(target, &first).expect("rewrite"));
        assert_eq!(fs::read_link(target.join(DATA_DIR)).expect("link"), data);

        let second = payload(&[("a", "1", 0o400), ("c", "3", 0o644)]);
        assert!(write(target, &second).expect("write"));
        let new_data = fs::read_link(target.join(DATA_DIR)).expect("link");
        assert_ne!(new_data, data);
        assert!(!target.join(&data).exists(), "old data dir removed");
        assert!(
            fs::symlink_metadata(target.join("b")).is_err(),
            "stale link removed"
        );
        assert_eq!(fs::read_to_string(target.join("c")).expect("read"), "3");
        assert_eq!(
            fs::metadata(target.join("a")).expect("stat").mode() & 0o777,
            0o400
        );
        let mut expected = BTreeSet::from(["..data".into(), "a".into(), "c".into()]);
        expected.insert(new_data.to_string_lossy().into_owned());
        assert_eq!(entries(target), expected);
    }

    #[test]
    fn a_data_dir_a_crash_left_before_its_switch_is_removed_by_the_next_write() {
        let tmp = TempDir::new("atomic");
        let target = tmp.path();
        let p = payload(&[("a", "1", 0o644)]);
        assert!(write(target, &p).expect("write"));
        let data = fs::read_link(target.join(DATA_DIR)).expect("link");
        let orphan = target.join("..2020_01_01_00_00_00.000000001");
        fs::create_dir(&orphan).expect("orphan");
        fs::write(orphan.join("a"), "half").expect("half");
        assert!(!write(target, &p).expect("rewrite"));
        assert!(!orphan.exists(), "the crash's data dir removed");
        assert_eq!(fs::read_link(target.join(DATA_DIR)).expect("link"), data);
        fs::create_dir(&orphan).expect("orphan");
        let changed = payload(&[("a", "2", 0o644)]);
        assert!(write(target, &changed).expect("write"));
        assert!(!orphan.exists(), "the crash's data dir removed");
        assert_eq!(entries(target).len(), 3, "{:?}", entries(target));
    }

    #[test]
    fn a_dangling_data_link_is_replaced() {
        let tmp = TempDir::new("atomic");
        symlink("..2020_01_01_00_00_00.1", tmp.path().join(DATA_DIR)).expect("symlink");
        let p = payload(&[("a", "1", 0o644)]);
        assert!(write(tmp.path(), &p).expect("write"));
        assert_eq!(fs::read_to_string(tmp.path().join("a")).expect("read"), "1");
    }

    #[test]
    fn an_empty_payload_still_gets_a_data_dir() {
        let tmp = TempDir::new("atomic");
        assert!(write(tmp.path(), &Payload::new()).expect("write"));
        assert!(tmp.path().join(DATA_DIR).is_dir());
        assert!(!write(tmp.path(), &Payload::new()).expect("rewrite"));
    }
}
