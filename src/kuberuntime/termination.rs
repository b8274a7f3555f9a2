//! A container's termination message, as the kubelet's `getTerminationMessage` reads it:
//! the file behind the container's `terminationMessagePath` mount (any path; the agent
//! makes that file writable by any user), at most 4 KiB from its end; with the policy
//! `FallbackToLogsOnError`, a failed container that wrote nothing there gets the tail of
//! its log instead (the last 80 lines, at most 2 KiB of them).

use std::io::SeekFrom;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::logs::{Joiner, parse_cri_line};
use crate::cri::api;

/// The most of a termination message the kubelet keeps.
pub const MAX_MESSAGE_BYTES: u64 = 4096;
/// Log lines a fallback message takes from the end of the log.
const FALLBACK_LINES: usize = 80;
/// Bytes of those lines a fallback message keeps.
const FALLBACK_BYTES: usize = 2048;
/// How much of the end of a log is read to find its last lines.
const LOG_TAIL_READ: u64 = 256 * 1024;

/// The policy that falls back to the log.
pub const FALLBACK_TO_LOGS_ON_ERROR: &str = "FallbackToLogsOnError";

/// At most `max` bytes from the end of a file; empty when it cannot be read.
async fn read_tail(path: &Path, max: u64) -> Vec<u8> {
    let read = async {
        let mut file = tokio::fs::File::open(path).await?;
        let len = file.metadata().await?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(max))).await?;
        let mut buf = Vec::new();
        file.take(max).read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    read.await.unwrap_or_else(|e| {
        tracing::debug!(path = %path.display(), error = %e, "cannot read a termination message");
        Vec::new()
    })
}

/// The text of the last [`FALLBACK_LINES`] lines of a CRI log, partial lines joined,
/// cut to [`FALLBACK_BYTES`] (the kubelet's `readLastStringFromContainerLogs`).
#[must_use]
pub fn log_tail(raw: &[u8]) -> String {
    let mut joiner = Joiner::default();
    let mut lines: Vec<Vec<u8>> = raw
        .split(|b| *b == b'\n')
        .filter_map(|l| parse_cri_line(l).ok())
        .filter_map(|l| joiner.push(&l))
        .map(|l| l.content)
        .collect();
    lines.extend(joiner.finish().into_iter().map(|l| l.content));
    let first = lines.len().saturating_sub(FALLBACK_LINES);
    let mut text: Vec<u8> = lines[first..].concat();
    text.truncate(FALLBACK_BYTES);
    String::from_utf8_lossy(&text).into_owned()
}

/// The termination message of an exited container, from its status (mounts, log path),
/// the path it was told to write to, and its policy.
pub async fn termination_message(
    status: &api::ContainerStatus,
    message_path: &str,
    policy: &str,
) -> String {
    let file = status
        .mounts
        .iter()
        .find(|m| !message_path.is_empty() && m.container_path == message_path);
    let written = match file {
        Some(m) => read_tail(Path::new(&m.host_path), MAX_MESSAGE_BYTES).await,
        None => Vec::new(),
    };
    if !written.is_empty() {
        return String::from_utf8_lossy(&written).into_owned();
    }
    let failed = status.exit_code != 0;
    if policy == FALLBACK_TO_LOGS_ON_ERROR && failed && !status.log_path.is_empty() {
        return log_tail(&read_tail(Path::new(&status.log_path), LOG_TAIL_READ).await);
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(dir: &Path, exit_code: i32) -> api::ContainerStatus {
        api::ContainerStatus {
            exit_code,
            mounts: vec![api::Mount {
                container_path: "/tmp/msg".into(),
                host_path: dir.join("termination-log-0").to_string_lossy().into_owned(),
                ..Default::default()
            }],
            log_path: dir.join("0.log").to_string_lossy().into_owned(),
            ..Default::default()
        }
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("rk-term-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn the_message_file_behind_the_mount_wins_and_is_capped_from_its_end() {
        let dir = temp_dir("file");
        let long = format!("{}END", "x".repeat(5000));
        std::fs::write(dir.join("termination-log-0"), &long).unwrap();
        let message = termination_message(&status(&dir, 1), "/tmp/msg", "File").await;
        assert_eq!(message.len(), 4096);
        assert!(message.ends_with("END"));
        // Another path than the one mounted reads nothing.
        assert_eq!(
            termination_message(&status(&dir, 1), "/dev/termination-log", "File").await,
            ""
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_failed_container_falls_back_to_its_log_only_with_that_policy() {
        let dir = temp_dir("fallback");
        std::fs::write(dir.join("termination-log-0"), b"").unwrap();
        let mut log = String::new();
        for i in 0..100 {
            log.push_str(&format!("2026-11-23T08:00:00.{i:09}Z stdout F line {i}\n"));
        }
        log.push_str("2026-11-23T08:00:01.000000000Z stderr P half \n");
        log.push_str("2026-11-23T08:00:01.100000000Z stderr F done\n");
        std::fs::write(dir.join("0.log"), &log).unwrap();
        let message =
            termination_message(&status(&dir, 2), "/tmp/msg", FALLBACK_TO_LOGS_ON_ERROR).await;
        // The last 80 lines (20..=99 and the joined one), cut to 2 KiB.
        assert!(message.starts_with("line 21\nline 22\n"), "{message}");
        assert!(message.len() <= 2048);
        assert!(log_tail(log.as_bytes()).ends_with("line 99\nhalf done\n"));
        assert_eq!(
            termination_message(&status(&dir, 0), "/tmp/msg", FALLBACK_TO_LOGS_ON_ERROR).await,
            "",
            "a container that succeeded keeps an empty message"
        );
        assert_eq!(
            termination_message(&status(&dir, 2), "/tmp/msg", "File").await,
            ""
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
