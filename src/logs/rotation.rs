//! The rotation policy and the decisions on a container's log files, without touching
//! them: which size and count the flags ask for (`--container-log-max-size`,
//! `--container-log-max-files`), what a rotated file is named, which leftovers of a failed
//! rotation are unused, and which rotated files are one too many.
//!
//! Names are file names within the container's log directory: the current log `0.log`, its
//! rotated files `0.log.<timestamp>` (compressed: `0.log.<timestamp>.gz`), and the
//! temporary file of a compression under way `0.log.<timestamp>.tmp`.

use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::tz::TimeZone;

use crate::resources::Quantity;

/// The kubelet's `containerLogMaxSize` default.
pub const DEFAULT_MAX_SIZE: &str = "10Mi";
/// The kubelet's `containerLogMaxFiles` default.
pub const DEFAULT_MAX_FILES: i32 = 5;
/// The suffix of a compressed rotated log.
pub const COMPRESS_SUFFIX: &str = ".gz";
/// The suffix of a compression's temporary file.
pub const TMP_SUFFIX: &str = ".tmp";
/// The timestamp of a rotated log (Go's `20060102-150405`).
const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";

/// A policy the kubelet refuses at start-up, in its words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// `--container-log-max-files` below 2.
    #[error("invalid MaxFiles {0}, must be > 1")]
    MaxFiles(i32),
    /// `--container-log-max-size` is not a whole, non-negative quantity.
    #[error("failed to parse container log max size {size:?}: {reason}")]
    MaxSize {
        /// The value given.
        size: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// How container logs are rotated (the kubelet's `LogRotatePolicy`): one policy for every
/// container of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRotatePolicy {
    /// A current log of at least this many bytes is rotated.
    pub max_size: u64,
    /// At most this many files per container log, the current one included.
    pub max_files: usize,
}

impl LogRotatePolicy {
    /// The policy of `--container-log-max-size` and `--container-log-max-files`, checked
    /// as the kubelet's `NewContainerLogManager` checks them.
    ///
    /// # Errors
    /// Fewer than 2 files, or a size that is not a whole number of bytes.
    pub fn new(max_size: &str, max_files: i32) -> Result<Self, PolicyError> {
        let max_files = usize::try_from(max_files)
            .ok()
            .filter(|n| *n > 1)
            .ok_or(PolicyError::MaxFiles(max_files))?;
        let bad = |reason: String| PolicyError::MaxSize {
            size: max_size.to_owned(),
            reason,
        };
        let quantity = Quantity::parse(max_size).map_err(bad)?;
        let bytes = quantity
            .as_int64()
            .ok_or_else(|| bad("invalid max log size".into()))?;
        Ok(Self {
            max_size: bytes.unsigned_abs(),
            max_files,
        })
    }

    /// How many rotated files stay before a rotation: the runtime is about to start a new
    /// current file and the current one becomes a rotated one, so `max_files - 2` of the
    /// older ones can stay.
    #[must_use]
    fn rotated_to_keep(self) -> usize {
        self.max_files.saturating_sub(2)
    }
}

impl Default for LogRotatePolicy {
    /// The kubelet's defaults: 10 MiB, 5 files.
    fn default() -> Self {
        Self {
            max_size: 10 << 20,
            max_files: 5,
        }
    }
}

/// The name the current log `log` is rotated to at `now` (UTC; the kubelet uses the node's
/// local time, which is UTC on the usual node): `<log>.<YYYYmmdd-HHMMSS>` as the kubelet.
/// The kubelet rotates at most once per 10 s pass; a fast writer is rotated more than once
/// a second here, so when `existing` (the log's rotated files) holds a file of the same
/// second, the name gets the next sequence number, `<log>.<YYYYmmdd-HHMMSS>.<NNN>`, which
/// sorts after it (a rename never replaces a rotated file).
#[must_use]
pub fn rotated_name(log: &str, now: Timestamp, existing: &[String]) -> String {
    let base = format!(
        "{log}.{}",
        now.to_zoned(TimeZone::UTC).strftime(TIMESTAMP_FORMAT)
    );
    let sequence = existing
        .iter()
        .filter_map(|name| {
            let stem = name.strip_suffix(TMP_SUFFIX).unwrap_or(name);
            match age_key(stem).strip_prefix(&base)? {
                "" => Some(0),
                rest => rest.strip_prefix('.')?.parse::<u32>().ok(),
            }
        })
        .max();
    match sequence {
        None => base,
        Some(n) => format!("{base}.{:03}", n + 1),
    }
}

/// What a rotated file sorts by, oldest first: its name without the compression suffix.
fn age_key(name: &str) -> &str {
    name.strip_suffix(COMPRESS_SUFFIX).unwrap_or(name)
}

/// Whether `name` is a file of the log `log` other than the current one (`<log>.*`).
#[must_use]
pub fn is_rotated_of(name: &str, log: &str) -> bool {
    name.strip_prefix(log).is_some_and(|s| s.starts_with('.'))
}

/// Splits the rotated files of a log into those in use and those a failed rotation left
/// (`filterUnusedLogs`): temporary files, and uncompressed files whose compressed copy
/// exists.
#[must_use]
pub fn split_unused(names: Vec<String>) -> (Vec<String>, Vec<String>) {
    let compressed = |name: &str| {
        names
            .iter()
            .any(|n| n == &format!("{name}{COMPRESS_SUFFIX}"))
    };
    let (mut in_use, mut unused) = (Vec::new(), Vec::new());
    for name in &names {
        let used =
            !name.ends_with(TMP_SUFFIX) && (name.ends_with(COMPRESS_SUFFIX) || !compressed(name));
        if used {
            in_use.push(name.clone());
        } else {
            unused.push(name.clone());
        }
    }
    (in_use, unused)
}

/// The rotated files in use, oldest first (by name without `.gz`: the timestamps and
/// sequence numbers sort), split into
/// those to remove before the current file is rotated and those to keep
/// (`removeExcessLogs`).
#[must_use]
pub fn split_excess(
    mut in_use: Vec<String>,
    policy: LogRotatePolicy,
) -> (Vec<String>, Vec<String>) {
    in_use.sort_by(|a, b| age_key(a).cmp(age_key(b)));
    let excess = in_use.len().saturating_sub(policy.rotated_to_keep());
    let kept = in_use.split_off(excess);
    (in_use, kept)
}

/// Whether the newest rotated file is compressed as soon as the runtime has `closed` it,
/// holding `size` bytes then. The kubelet keeps it plain until the next rotation, because
/// the runtime may still write to it; once the runtime has closed it, nothing does (the
/// kubelet's log reader reads the current file only; a log shipper that followed the file
/// reads on through its open descriptor). Beyond the kubelet, a file that holds more than
/// the policy's size (the runtime wrote on into it while it reopened slowly) is compressed
/// then, so that the overshoot is not kept on disk ~15× over until the next rotation; one of
/// about the size stays plain, as the kubelet's.
#[must_use]
pub fn compress_newest_at_once(closed: bool, size: u64, policy: LogRotatePolicy) -> bool {
    closed && size > policy.max_size
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_policy_is_checked_as_the_kubelet_checks_it() {
        assert_eq!(
            LogRotatePolicy::new(DEFAULT_MAX_SIZE, DEFAULT_MAX_FILES),
            Ok(LogRotatePolicy::default())
        );
        assert_eq!(
            LogRotatePolicy::new("1Mi", 3),
            Ok(LogRotatePolicy {
                max_size: 1 << 20,
                max_files: 3
            })
        );
        assert_eq!(
            LogRotatePolicy::new("256Ki", 2).unwrap().max_size,
            256 * 1024
        );
        assert_eq!(LogRotatePolicy::new("1.5Ki", 2).unwrap().max_size, 1536);
        assert_eq!(LogRotatePolicy::new("0", 2).unwrap().max_size, 0);
        for files in [1, 0, -3] {
            assert_eq!(
                LogRotatePolicy::new("10Mi", files).unwrap_err().to_string(),
                format!("invalid MaxFiles {files}, must be > 1")
            );
        }
        for size in ["1.5", "500m", "ten", "-1Mi", ""] {
            let err = LogRotatePolicy::new(size, 5).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "failed to parse container log max size {size:?}: "
                )),
                "{err}"
            );
        }
        assert!(
            LogRotatePolicy::new("500m", 5)
                .unwrap_err()
                .to_string()
                .ends_with("invalid max log size")
        );
    }

    #[test]
    fn rotated_files_are_named_with_the_kubelets_timestamp() {
        let at = "2026-11-26T09:05:07.123456Z".parse::<Timestamp>().unwrap();
        assert_eq!(rotated_name("0.log", at, &[]), "0.log.20261126-090507");
        // A second rotation in the same second: the next sequence number, past the
        // compressed and the temporary files of that second, never another second's.
        let existing = names(&[
            "0.log.20261126-090506.gz",
            "0.log.20261126-090507.gz",
            "0.log.20261126-090508",
        ]);
        assert_eq!(
            rotated_name("0.log", at, &existing),
            "0.log.20261126-090507.001"
        );
        let existing = names(&[
            "0.log.20261126-090507.gz",
            "0.log.20261126-090507.001.gz",
            "0.log.20261126-090507.002.tmp",
            "0.log.20261126-090507.002",
        ]);
        assert_eq!(
            rotated_name("0.log", at, &existing),
            "0.log.20261126-090507.003"
        );
        assert!(is_rotated_of("0.log.20261126-090507", "0.log"));
        assert!(is_rotated_of("0.log.20261126-090507.gz", "0.log"));
        assert!(!is_rotated_of("0.log", "0.log"));
        assert!(!is_rotated_of("10.log", "0.log"));
        assert!(!is_rotated_of("0.logx", "0.log"));
    }

    #[test]
    fn leftovers_of_a_failed_rotation_are_unused() {
        let (in_use, unused) = split_unused(names(&[
            "0.log.20260101-000000.gz",
            "0.log.20260101-000010",
            "0.log.20260101-000010.gz",
            "0.log.20260101-000020.tmp",
            "0.log.20260101-000020",
            "0.log.20260101-000030",
        ]));
        assert_eq!(
            in_use,
            names(&[
                "0.log.20260101-000000.gz",
                "0.log.20260101-000010.gz",
                "0.log.20260101-000020",
                "0.log.20260101-000030",
            ])
        );
        assert_eq!(
            unused,
            names(&["0.log.20260101-000010", "0.log.20260101-000020.tmp"])
        );
    }

    #[test]
    fn the_oldest_rotated_files_go_so_that_max_files_remain_after_the_rotation() {
        let rotated = names(&[
            "0.log.20260101-000030",
            "0.log.20260101-000010.gz",
            "0.log.20260101-000000.gz",
            "0.log.20260101-000020.gz",
        ]);
        let policy = |max_files| LogRotatePolicy {
            max_size: 1,
            max_files,
        };
        // 3 files: the current one, the one it becomes, and one older.
        let (removed, kept) = split_excess(rotated.clone(), policy(3));
        assert_eq!(
            removed,
            names(&[
                "0.log.20260101-000000.gz",
                "0.log.20260101-000010.gz",
                "0.log.20260101-000020.gz",
            ])
        );
        assert_eq!(kept, names(&["0.log.20260101-000030"]));
        let (removed, kept) = split_excess(rotated.clone(), policy(2));
        assert_eq!(removed.len(), 4);
        assert!(kept.is_empty());
        let (removed, kept) = split_excess(rotated, policy(10));
        assert!(removed.is_empty());
        assert_eq!(kept.len(), 4);
        // Within one second, by sequence: the compressed first file is the oldest.
        let rotated = names(&[
            "0.log.20260101-000000.002",
            "0.log.20260101-000000.001.gz",
            "0.log.20260101-000000.gz",
        ]);
        let (removed, kept) = split_excess(rotated, policy(3));
        assert_eq!(
            removed,
            names(&["0.log.20260101-000000.gz", "0.log.20260101-000000.001.gz"])
        );
        assert_eq!(kept, names(&["0.log.20260101-000000.002"]));
    }

    #[test]
    fn only_an_overfilled_newest_file_the_runtime_has_closed_is_compressed_at_once() {
        let policy = LogRotatePolicy {
            max_size: 1 << 20,
            max_files: 3,
        };
        // 6 MiB: the runtime wrote on into it during a slow reopen.
        assert!(compress_newest_at_once(true, 6 << 20, policy));
        assert!(compress_newest_at_once(true, (1 << 20) + 1, policy));
        // About the size: plain, as the kubelet keeps it.
        assert!(!compress_newest_at_once(true, 1 << 20, policy));
        assert!(!compress_newest_at_once(true, 700 << 10, policy));
        // Not closed (yet, or the runtime never says): the runtime may still write to it.
        assert!(!compress_newest_at_once(false, 6 << 20, policy));
    }
}
