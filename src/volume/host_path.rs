//! hostPath volumes: the host path itself, checked against the volume's `type` (and created
//! for the `...OrCreate` types) like the kubelet's hostPath plugin. Blocking: call from a
//! blocking thread.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Mode of directories made for `DirectoryOrCreate`.
const DIR_MODE: u32 = 0o755;
/// Mode of files made for `FileOrCreate`.
const FILE_MODE: u32 = 0o644;

/// Why a host path does not satisfy its `type`.
#[derive(Debug)]
pub(super) enum TypeError {
    /// The type itself is unknown.
    UnknownType,
    /// Making the path for a `...OrCreate` type failed: `mkdir` or `open`, and why.
    Create(&'static str, io::Error),
    /// The path is missing or of another kind; the text says what was found.
    Mismatch(String),
}

/// Checks `path` against the hostPath `type` (`None` or `""`: no check), creating it first
/// when missing for `DirectoryOrCreate` (mode 0755, with parents) and `FileOrCreate` (mode
/// 0644; the parent must exist).
pub(super) fn check_type(path: &Path, kind: Option<&str>) -> Result<(), TypeError> {
    let kind = kind.unwrap_or_default();
    match kind {
        "" => return Ok(()),
        // Made only when missing; whatever exists is checked below (the kubelet's order).
        "DirectoryOrCreate" if !path.exists() => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(path)
                .map_err(|e| TypeError::Create("mkdir", e))?;
        }
        "FileOrCreate" if !path.exists() => {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(FILE_MODE)
                .open(path)
                .map_err(|e| TypeError::Create("open", e))?;
        }
        "DirectoryOrCreate" | "FileOrCreate" => {}
        "Directory" | "File" | "Socket" | "CharDevice" | "BlockDevice" => {}
        _ => return Err(TypeError::UnknownType),
    }
    let meta = fs::metadata(path).map_err(|e| TypeError::Mismatch(e.to_string()))?;
    let t = meta.file_type();
    let ok = match kind {
        "DirectoryOrCreate" | "Directory" => t.is_dir(),
        "FileOrCreate" | "File" => t.is_file(),
        "Socket" => t.is_socket(),
        "CharDevice" => t.is_char_device(),
        _ => t.is_block_device(),
    };
    if ok {
        Ok(())
    } else {
        Err(TypeError::Mismatch(format!("found {}", describe(t))))
    }
}

fn describe(t: fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else {
        "something else"
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::super::testing::TempDir;
    use super::*;

    #[test]
    fn types_are_checked_and_created_like_the_kubelet() {
        let tmp = TempDir::new("hostpath");
        let dir = tmp.path().join("a/b");
        let file = tmp.path().join("f");
        let sock = tmp.path().join("s.sock");
        let _listener = UnixListener::bind(&sock).expect("bind");

        assert!(check_type(&tmp.path().join("missing"), None).is_ok());
        assert!(check_type(&tmp.path().join("missing"), Some("")).is_ok());
        assert!(matches!(
            check_type(&dir, Some("Directory")),
            Err(TypeError::Mismatch(_))
        ));
        check_type(&dir, Some("DirectoryOrCreate")).expect("created");
        assert!(dir.is_dir());
        check_type(&dir, Some("Directory")).expect("is a dir");
        assert!(
            matches!(check_type(&dir, Some("File")), Err(TypeError::Mismatch(m)) if m.contains("directory"))
        );
        assert!(
            matches!(check_type(&dir, Some("FileOrCreate")), Err(TypeError::Mismatch(m)) if m.contains("directory")),
            "an existing directory is not a file"
        );

        check_type(&file, Some("FileOrCreate")).expect("created");
        assert!(file.is_file());
        check_type(&file, Some("File")).expect("is a file");
        assert!(
            matches!(
                check_type(&file, Some("DirectoryOrCreate")),
                Err(TypeError::Mismatch(_))
            ),
            "an existing file is not a directory"
        );
        assert!(matches!(
            check_type(&tmp.path().join("no/parent"), Some("FileOrCreate")),
            Err(TypeError::Create("open", _))
        ));
        assert!(matches!(
            check_type(&file.join("sub"), Some("DirectoryOrCreate")),
            Err(TypeError::Create("mkdir", _))
        ));

        check_type(&sock, Some("Socket")).expect("is a socket");
        assert!(check_type(&sock, Some("CharDevice")).is_err());
        check_type(Path::new("/dev/null"), Some("CharDevice")).expect("char device");
        assert!(check_type(Path::new("/dev/null"), Some("BlockDevice")).is_err());
        assert!(matches!(
            check_type(&file, Some("Fancy")),
            Err(TypeError::UnknownType)
        ));
    }
}
