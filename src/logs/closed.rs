//! When the runtime has closed a rotated log: an inotify watch for `IN_CLOSE_WRITE` on the
//! renamed file, set between the rename and `ReopenContainerLog`. containerd writes to the
//! old file what its logger still held after the reopen, then closes it; a file is safe to
//! compress (and remove) only after that close.
//!
//! The OS boundary of the newest rotated file's early compression (see
//! [`super::rotation::compress_newest_at_once`]): it knows no runtime call and no policy.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// How often a wait looks at the watch (on the blocking pool, only after a rotation).
const POLL: Duration = Duration::from_millis(2);

/// A watch on one rotated file for the close of its last writer.
pub struct WriterClosed(Inotify);

impl std::fmt::Debug for WriterClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriterClosed")
    }
}

impl WriterClosed {
    /// Watches `path` (the file, not its name: the watch follows it through renames).
    ///
    /// # Errors
    /// inotify is not available or out of watches.
    pub fn watch(path: &Path) -> nix::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        inotify.add_watch(path, AddWatchFlags::IN_CLOSE_WRITE)?;
        Ok(Self(inotify))
    }

    /// Blocks until a writer of the file closed it (`true`), or until `timeout` passed,
    /// `give_up` was set or the file was removed (`false`). Blocking: run it on the blocking
    /// pool.
    #[must_use]
    pub fn wait(&self, timeout: Duration, give_up: &AtomicBool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.0.read_events() {
                Ok(events) => {
                    if events
                        .iter()
                        .any(|e| e.mask.contains(AddWatchFlags::IN_CLOSE_WRITE))
                    {
                        return true;
                    }
                    if events
                        .iter()
                        .any(|e| e.mask.contains(AddWatchFlags::IN_IGNORED))
                    {
                        return false;
                    }
                }
                Err(Errno::EAGAIN) => {}
                Err(_) => return false,
            }
            if give_up.load(Ordering::SeqCst) || Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file(name: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("rk-closed-{name}-{}", std::process::id()));
        std::fs::write(&path, "").unwrap();
        path
    }

    #[test]
    fn the_close_of_a_writer_is_seen_after_a_rename_and_a_reader_is_not_a_writer() {
        let path = file("rename");
        let mut writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let renamed = path.with_extension("rotated");
        std::fs::rename(&path, &renamed).unwrap();
        let watch = WriterClosed::watch(&renamed).unwrap();
        let give_up = AtomicBool::new(false);
        // Still open for writing; a reader opening and closing it is no writer's close.
        writer.write_all(b"late line\n").unwrap();
        drop(std::fs::read(&renamed).unwrap());
        assert!(!watch.wait(Duration::from_millis(20), &give_up));
        drop(writer);
        assert!(watch.wait(Duration::from_secs(5), &give_up));
        std::fs::remove_file(renamed).unwrap();
    }

    #[test]
    fn a_wait_ends_when_given_up_or_when_the_file_goes() {
        let path = file("give-up");
        let writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let watch = WriterClosed::watch(&path).unwrap();
        let started = Instant::now();
        assert!(!watch.wait(Duration::from_secs(5), &AtomicBool::new(true)));
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(writer);
        std::fs::remove_file(&path).unwrap();
        // Removed (no writer left to close it): the watch ends at once.
        let path = file("removed");
        let watch = WriterClosed::watch(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let started = Instant::now();
        assert!(!watch.wait(Duration::from_secs(5), &AtomicBool::new(false)));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(WriterClosed::watch(&path).is_err());
    }
}
