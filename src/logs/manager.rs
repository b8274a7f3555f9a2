//! The container log manager (the kubelet's `containerLogManager`): every monitor period,
//! each running container's current log file that has reached the policy's size is renamed
//! with a timestamp and the runtime is told to reopen it (CRI `ReopenContainerLog`); the
//! rotated files before it are compressed and the oldest removed, so a container keeps at
//! most `max_files` log files. [`ContainerLogManager::clean`] removes a container's log
//! files when the container is removed.
//!
//! Beyond the kubelet, whose periodic pass lets a fast writer exceed the size by all it
//! writes in one period (10 s): between passes, each container whose log grows is looked
//! at again (one `stat` of the path its last `ContainerStatus` gave; no runtime call unless
//! it rotates) when its file would reach the size at the rate it grew ([`super::schedule`]),
//! and a container the agent starts ([`StartedContainers`]) is looked at from its start.
//! Idle containers are left to the pass. A rotation cuts the current file first (rename,
//! reopen) and compresses the file rotated before it afterwards, so the time gzip takes
//! does not add to the current file; a second rotation in one second gets a sequence
//! number after the kubelet's timestamp ([`super::rotation::rotated_name`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::closed::WriterClosed;
use super::rotation::{
    COMPRESS_SUFFIX, LogRotatePolicy, TMP_SUFFIX, compress_newest_at_once, is_rotated_of,
    rotated_name, split_excess, split_unused,
};
use super::schedule::{Look, Watches};
use crate::cri::{Cri, CriError, api};

/// The kubelet's `logMonitorPeriod`.
pub const LOG_MONITOR_PERIOD: Duration = Duration::from_secs(10);
/// How long the compression after a rotation waits for the runtime to close the file just
/// rotated (containerd: a few milliseconds after the reopen), unless the next rotation
/// comes first; without the close, the file stays plain until the next rotation.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// A log manager failure, naming the container or file.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// A runtime call failed.
    #[error("{what} of container {container:?}: {source}")]
    Cri {
        /// The call.
        what: &'static str,
        /// The container's id.
        container: String,
        /// The error.
        source: CriError,
    },
    /// Listing the running containers failed.
    #[error("failed to list containers: {0}")]
    List(CriError),
    /// A file operation failed.
    #[error("failed to {op} {}: {source}", path.display())]
    Io {
        /// What was done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl LogsError {
    /// Whether the runtime does not know the container (it is gone already).
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Cri { source, .. } if source.is_not_found())
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LogsError + 'a {
    move |source| LogsError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Tells the log manager about the containers the agent starts, so that their logs are
/// watched from the start, not from the next pass.
#[derive(Debug, Clone)]
pub struct StartedContainers(mpsc::UnboundedSender<(String, PathBuf)>);

impl StartedContainers {
    /// Container `id` started, writing its log to `log`.
    pub fn started(&self, id: &str, log: PathBuf) {
        // The manager is gone only when the agent stops.
        let _ = self.0.send((id.to_owned(), log));
    }
}

/// Rotates the logs of the runtime's running containers under one policy.
pub struct ContainerLogManager<C> {
    cri: Arc<C>,
    policy: LogRotatePolicy,
    /// Rotation and cleaning one container at a time (the kubelet's mutex): a container's
    /// files are never rotated while they are removed.
    busy: tokio::sync::Mutex<()>,
    starts: StartedContainers,
    started: tokio::sync::Mutex<mpsc::UnboundedReceiver<(String, PathBuf)>>,
    /// The compressions under way, by current log path.
    compressing: std::sync::Mutex<HashMap<PathBuf, Compressing>>,
}

/// The compression of a log's older rotated files, in the background after a cut (after
/// the compression before it), and of the file just rotated once the runtime has closed
/// it, if it is overfilled.
struct Compressing {
    /// The rotated files kept at its cut, the one just rotated included: the plain ones
    /// are its work.
    files: Vec<String>,
    /// Set to abandon it (its file is about to be removed).
    stop: Arc<AtomicBool>,
    /// Set to stop waiting for the runtime to close the file just rotated (the next
    /// rotation is due: it compresses that file if the close did not come).
    hurry: Arc<AtomicBool>,
    done: tokio::task::JoinHandle<()>,
}

/// The file just rotated, and the watch for the runtime's close of it (none when inotify
/// could not watch it: it stays plain until the next rotation).
struct Newest {
    name: String,
    closed: Option<WriterClosed>,
    policy: LogRotatePolicy,
}

impl<C: Cri> ContainerLogManager<C> {
    /// A manager applying `policy` through `cri`.
    pub fn new(cri: Arc<C>, policy: LogRotatePolicy) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            cri,
            policy,
            busy: tokio::sync::Mutex::new(()),
            starts: StartedContainers(tx),
            started: tokio::sync::Mutex::new(rx),
            compressing: std::sync::Mutex::default(),
        }
    }

    /// Where to report the containers the agent starts.
    pub fn starts(&self) -> StartedContainers {
        self.starts.clone()
    }

    /// Rotates now and then `period` after each pass ends, until `cancel` (the kubelet's
    /// `Start`: `wait.Forever` with [`LOG_MONITOR_PERIOD`]); between passes, looks at the
    /// growing logs when they are due and at the containers started.
    pub async fn run(self: Arc<Self>, period: Duration, cancel: CancellationToken) {
        let mut started = self.started.lock().await;
        let mut watches = Watches::default();
        let mut next_pass = Instant::now();
        loop {
            if Instant::now() >= next_pass {
                if let Err(e) = self.pass(&mut watches, period).await {
                    tracing::error!(error = %e, "Failed to rotate container logs");
                }
                next_pass = Instant::now() + period;
            }
            for (id, path) in watches.due(Instant::now()) {
                let late = watches
                    .due_at(&id)
                    .map(|due| Instant::now().saturating_duration_since(due));
                let span = tracing::debug_span!("check_container_log", container = %id, late_ms = late.map(|l| l.as_millis()));
                let from = watches.rotate_from(&id, self.policy.max_size);
                let looked = self.look(&id, &path, from).instrument(span).await;
                match looked {
                    Ok(looks) => watches.looked(&id, path, looks, self.limits(period)),
                    Err(e) => {
                        self.report(&id, &e).await;
                        watches.forget(&id);
                    }
                }
            }
            let wake = watches
                .next_due()
                .map_or(next_pass, |due| due.min(next_pass));
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(wake) => {}
                Some((id, path)) = started.recv() => {
                    let look = Look { size: 0, at: Instant::now() };
                    watches.first(&id, path, look);
                }
            }
        }
    }

    /// Logs a failed look at container `id`'s log: an error if the container still runs,
    /// quietly if it stopped or went since it was listed (its log directory may be gone
    /// with its pod, and a stopped container's log cannot be reopened). The kubelet
    /// rotates running containers only.
    async fn report(&self, id: &str, e: &LogsError) {
        if self.still_running(id).await {
            tracing::error!(container = %id, error = %e, "Failed to rotate container log");
        } else {
            tracing::debug!(container = %id, error = %e, "container no longer running: its log is not rotated");
        }
    }

    /// Whether container `id` runs, as far as the runtime says (a runtime that cannot
    /// answer is taken to run it: its failure is reported).
    async fn still_running(&self, id: &str) -> bool {
        match self.status("ContainerStatus", id).await {
            Ok(status) => {
                status.is_some_and(|s| s.state == i32::from(api::ContainerState::ContainerRunning))
            }
            Err(e) => !e.is_not_found(),
        }
    }

    fn limits(&self, period: Duration) -> (u64, Duration) {
        (self.policy.max_size, period)
    }

    /// The runtime's status of container `id` (CRI `ContainerStatus`, asked as `what`).
    async fn status(
        &self,
        what: &'static str,
        id: &str,
    ) -> Result<Option<api::ContainerStatus>, LogsError> {
        let req = api::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        };
        self.cri
            .container_status(req)
            .await
            .map(|r| r.status)
            .map_err(|source| LogsError::Cri {
                what,
                container: id.to_owned(),
                source,
            })
    }

    async fn log_path(&self, what: &'static str, id: &str) -> Result<PathBuf, LogsError> {
        let status = self.status(what, id).await?;
        Ok(status.map(|s| s.log_path).unwrap_or_default().into())
    }

    async fn reopen(&self, id: &str) -> Result<(), LogsError> {
        let req = api::ReopenContainerLogRequest {
            container_id: id.to_owned(),
        };
        self.cri
            .reopen_container_log(req)
            .await
            .map(drop)
            .map_err(|source| LogsError::Cri {
                what: "ReopenContainerLog",
                container: id.to_owned(),
                source,
            })
    }

    /// One pass over the running containers (`rotateLogs`): a container whose log cannot
    /// be read or rotated is logged and left for the next pass.
    ///
    /// # Errors
    /// The running containers could not be listed.
    pub async fn rotate_logs(&self) -> Result<(), LogsError> {
        self.pass(&mut Watches::default(), LOG_MONITOR_PERIOD).await
    }

    /// [`Self::rotate_logs`], scheduling the next look at each container in `watches`.
    async fn pass(&self, watches: &mut Watches, period: Duration) -> Result<(), LogsError> {
        let containers = self
            .cri
            .list_containers(crate::cri::running_containers_request())
            .await
            .map_err(LogsError::List)?
            .containers;
        for c in &containers {
            let span = tracing::debug_span!("rotate_container_log", container = %c.id);
            let from = watches.rotate_from(&c.id, self.policy.max_size);
            match self.rotate_if_due(&c.id, from).instrument(span).await {
                Ok(Some((path, looks))) => watches.looked(&c.id, path, looks, self.limits(period)),
                Ok(None) => {}
                Err(e) => self.report(&c.id, &e).await,
            }
        }
        let running: Vec<String> = containers.into_iter().map(|c| c.id).collect();
        watches.retain_running(&running);
        self.forget_finished_compressions();
        Ok(())
    }

    /// Forgets the compressions that have ended: a finished one is of no use to the next
    /// rotation (its files are compressed or gone), and the container of one may be gone
    /// without [`Self::clean`] (removed by the runtime's own GC or another client), whose
    /// entry would otherwise stay for the agent's life.
    fn forget_finished_compressions(&self) {
        crate::lock::lock(&self.compressing).retain(|_, c| !c.done.is_finished());
    }

    /// Rotates the container's log if it has reached the policy's size; its path and what
    /// was seen, or nothing for a container without a CRI log (not started by a kubelet).
    async fn rotate_if_due(
        &self,
        id: &str,
        from: u64,
    ) -> Result<Option<(PathBuf, (Look, Look))>, LogsError> {
        let path = self.log_path("ContainerStatus", id).await?;
        if path.as_os_str().is_empty() {
            return Ok(None);
        }
        let looks = self.look(id, &path, from).await?;
        Ok(Some((path, looks)))
    }

    /// Looks at the container's current log `path` and rotates it if it holds `from` bytes
    /// or more (the policy's size, or less for a fast writer: see
    /// [`Watches::rotate_from`]): the look, and the current file after it (the new one if
    /// rotated). A
    /// missing current file (lost by an agent stop between a rename and the reopen) is
    /// recovered by reopening it.
    async fn look(&self, id: &str, path: &Path, from: u64) -> Result<(Look, Look), LogsError> {
        let _busy = self.busy.lock().await;
        let size = match tokio::fs::metadata(path).await {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.reopen(id).await?;
                tokio::fs::metadata(path)
                    .await
                    .map_err(io("stat after reopen", path))?
                    .len()
            }
            Err(e) => return Err(io("stat", path)(e)),
        };
        let seen = Look {
            size,
            at: Instant::now(),
        };
        if size < from {
            return Ok((seen, seen));
        }
        self.rotate_log(id, path, size).await?;
        let size = match tokio::fs::metadata(path).await {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io("stat", path)(e)),
        };
        Ok((
            seen,
            Look {
                size,
                at: Instant::now(),
            },
        ))
    }

    /// Rotates the current log `path` of container `id` (`rotateLog`): leftovers of a
    /// failed rotation go, then the oldest rotated files beyond the policy; the current one
    /// is renamed and reopened, then the older ones kept are compressed in the background
    /// (the kubelet compresses before renaming, which lets the current file grow meanwhile).
    /// A compression still under way from the rotation before goes on during the cut (the
    /// next one starts after it), or is abandoned first when its file is one too many now, so
    /// compressions never hold up a cut nor the next look, and run one at a time.
    async fn rotate_log(&self, id: &str, path: &Path, seen: u64) -> Result<(), LogsError> {
        let started = std::time::Instant::now();
        let pending = crate::lock::lock(&self.compressing).remove(path);
        let work = pending.as_ref().map(|p| {
            p.hurry.store(true, Ordering::SeqCst);
            (p.files.clone(), Arc::clone(&p.stop))
        });
        let (log_path, policy) = (path.to_owned(), self.policy);
        let cut = blocking(move || {
            let work = work
                .as_ref()
                .map(|(files, stop)| (files.as_slice(), stop.as_ref()));
            cut_files(&log_path, policy, work, Timestamp::now())
        })
        .await;
        let cut = match cut {
            Ok(cut) => cut,
            Err(e) => {
                if let Some(pending) = pending {
                    crate::lock::lock(&self.compressing).insert(path.to_owned(), pending);
                }
                return Err(e);
            }
        };
        let renamed = started.elapsed();
        let reopened = self.reopen(id).await;
        let took = started.elapsed();
        // An abandoned compression stops within a chunk. One past its last chunk when told
        // has written the `.gz` of a file the cut removed: one too many as well.
        let pending = match pending {
            Some(pending) if cut.abandoned => {
                let _ = pending.done.await;
                let dir = split_path(path).0.to_owned();
                let late: Vec<String> = cut
                    .excess
                    .iter()
                    .filter(|n| !n.ends_with(COMPRESS_SUFFIX))
                    .map(|n| format!("{n}{COMPRESS_SUFFIX}"))
                    .collect();
                if let Err(e) = blocking(move || remove_files(&dir, &late)).await {
                    tracing::warn!(error = %e, "Failed to remove the compressed copy of an excess log");
                }
                None
            }
            pending => pending,
        };
        let rotated = cut.rotated;
        if let Err(e) = reopened {
            // Renamed back, to be rotated again at the next look; unless the runtime did
            // open a new file before it failed: that one is not replaced (the kubelet's
            // `os.Rename` would, losing what the container wrote there), and the rotated
            // file stays as rotated.
            let (from, to) = (rotated.clone(), path.to_owned());
            let back = tokio::task::spawn_blocking(move || rename_without_replacing(&from, &to))
                .await
                .map_err(std::io::Error::other)
                .and_then(|r| r);
            match back {
                Ok(()) => {}
                Err(back) if back.kind() == std::io::ErrorKind::AlreadyExists => {
                    tracing::warn!(rotated = %rotated.display(), log = %path.display(), reopen_error = %e, "the runtime opened a new log before failing to reopen: the rotated log is kept");
                }
                Err(back) => {
                    tracing::error!(rotated = %rotated.display(), log = %path.display(), error = %back, reopen_error = %e, "Failed to rename rotated log back");
                }
            }
            if let Some(pending) = pending {
                crate::lock::lock(&self.compressing).insert(path.to_owned(), pending);
            }
            return Err(e);
        }
        let dir = split_path(path).0;
        let closed = cut.closed;
        let kept = cut.kept;
        let newest = Newest {
            name: split_path(&rotated).1.to_owned(),
            closed,
            policy: self.policy,
        };
        let older: Vec<String> = kept
            .iter()
            .filter(|n| !n.ends_with(COMPRESS_SUFFIX))
            .cloned()
            .collect();
        let files = kept.into_iter().chain([newest.name.clone()]).collect();
        // One chain: abandoning this compression abandons the one before, which it awaits.
        let stop = pending
            .as_ref()
            .map_or_else(Arc::default, |p| Arc::clone(&p.stop));
        let hurry = Arc::default();
        let span = tracing::debug_span!("compress_container_logs", container = %id);
        let job = compress_all(
            pending.map(|p| p.done),
            (dir.to_owned(), older),
            newest,
            (Arc::clone(&stop), Arc::clone(&hurry)),
        );
        let done = tokio::spawn(job.instrument(span));
        crate::lock::lock(&self.compressing).insert(
            path.to_owned(),
            Compressing {
                files,
                stop,
                hurry,
                done,
            },
        );
        // What the runtime wrote to the renamed file during the cut: one more `stat`, for
        // the debug log only.
        let rotated_bytes = if tracing::enabled!(tracing::Level::DEBUG) {
            tokio::fs::metadata(&rotated).await.map_or(0, |m| m.len())
        } else {
            0
        };
        tracing::debug!(
            log = %path.display(),
            rotated = %rotated.display(),
            took_ms = took.as_millis(),
            renamed_ms = renamed.as_millis(),
            seen_bytes = seen,
            rotated_bytes,
            "rotated container log"
        );
        Ok(())
    }

    #[cfg(test)]
    async fn compressed(&self) {
        let paths: Vec<PathBuf> = crate::lock::lock(&self.compressing)
            .keys()
            .cloned()
            .collect();
        for path in paths {
            let pending = crate::lock::lock(&self.compressing).remove(&path);
            if let Some(pending) = pending {
                let _ = pending.done.await;
            }
        }
    }

    /// Removes every log file of the container, rotated ones included (`Clean`), before
    /// the container is removed.
    ///
    /// # Errors
    /// The runtime does not know the container, or a file could not be removed.
    pub async fn clean(&self, id: &str) -> Result<(), LogsError> {
        let _busy = self.busy.lock().await;
        let path = self.log_path("ContainerStatus", id).await?;
        if path.as_os_str().is_empty() {
            return Ok(());
        }
        let pending = crate::lock::lock(&self.compressing).remove(&path);
        if let Some(pending) = pending {
            pending.stop.store(true, Ordering::SeqCst);
            pending.hurry.store(true, Ordering::SeqCst);
            let _ = pending.done.await;
        }
        let (dir, log) = split_path(&path);
        let mut names = rotated_files(dir, log).await?;
        names.push(log.to_owned());
        let dir = dir.to_owned();
        blocking(move || remove_files(&dir, &names)).await
    }
}

/// The directory and file name of a log path.
fn split_path(path: &Path) -> (&Path, &str) {
    (
        path.parent().unwrap_or_else(|| Path::new("/")),
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default(),
    )
}

/// What the file work of a cut did.
struct Cut {
    /// The current log's new name.
    rotated: PathBuf,
    /// The watch for the runtime's close of it.
    closed: Option<WriterClosed>,
    /// The rotated files kept before it.
    kept: Vec<String>,
    /// Whether the compression under way was told to stop (one of its files was one too
    /// many).
    abandoned: bool,
    /// The rotated files removed as one too many.
    excess: Vec<String>,
}

/// The file work of cutting the current log `path` at `now`, in one go (blocking: the steps
/// each sent to the blocking pool added up to tens of milliseconds on a loaded node while
/// the writer filled the file): leftovers of a failed rotation and the oldest rotated files
/// beyond `policy` go, the current file is renamed and watched for its close. The files the
/// compression under way (`work`: its files and stop flag) writes are left to it, unless
/// one is one too many: then it is told to stop.
fn cut_files(
    path: &Path,
    policy: LogRotatePolicy,
    work: Option<(&[String], &AtomicBool)>,
    now: Timestamp,
) -> Result<Cut, LogsError> {
    let (dir, log) = split_path(path);
    let (in_use, unused) = split_unused(rotated_files_in(dir, log)?);
    let rotated = dir.join(rotated_name(log, now, &in_use));
    let (excess, kept) = split_excess(in_use, policy);
    let abandoned = work.is_some_and(|(files, stop)| {
        let abandon = files.iter().any(|f| excess.contains(f));
        if abandon {
            stop.store(true, Ordering::SeqCst);
        }
        abandon
    });
    let unused: Vec<String> = unused
        .into_iter()
        .filter(|n| work.is_none_or(|(files, _)| !works_on(files, n)))
        .collect();
    remove_files(dir, &unused)?;
    remove_files(dir, &excess)?;
    std::fs::rename(path, &rotated).map_err(io("rotate", path))?;
    // Before the reopen, so that the runtime's close of the old file cannot be missed.
    let closed = WriterClosed::watch(&rotated)
        .inspect_err(|e| tracing::debug!(rotated = %rotated.display(), error = %e, "not watching the rotated log for its close"))
        .ok();
    Ok(Cut {
        rotated,
        closed,
        kept,
        abandoned,
        excess,
    })
}

/// Renames `from` to `to` unless `to` exists (`renameat2` with `RENAME_NOREPLACE`):
/// `AlreadyExists` then (blocking).
fn rename_without_replacing(from: &Path, to: &Path) -> std::io::Result<()> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    renameat2(AT_FDCWD, from, AT_FDCWD, to, RenameFlags::RENAME_NOREPLACE)
        .map_err(std::io::Error::from)
}

/// Whether `name` is one of `files` (a compression's), its temporary file or its result.
fn works_on(files: &[String], name: &str) -> bool {
    let stem = name.strip_suffix(TMP_SUFFIX).unwrap_or(name);
    let stem = stem.strip_suffix(COMPRESS_SUFFIX).unwrap_or(stem);
    files.iter().any(|f| f == stem)
}

/// Runs blocking file work on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, LogsError> + Send + 'static,
) -> Result<T, LogsError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        io("run file work on", Path::new("the blocking pool"))(std::io::Error::other(e))
    })?
}

/// The names of the files `<log>.*` in `dir` (blocking).
fn rotated_files_in(dir: &Path, log: &str) -> Result<Vec<String>, LogsError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("list log files in", dir))? {
        let entry = entry.map_err(io("list log files in", dir))?;
        if let Some(name) = entry.file_name().to_str()
            && is_rotated_of(name, log)
        {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// The names of the files `<log>.*` in `dir`.
async fn rotated_files(dir: &Path, log: &str) -> Result<Vec<String>, LogsError> {
    let (dir, log) = (dir.to_owned(), log.to_owned());
    blocking(move || rotated_files_in(&dir, &log)).await
}

/// Removes the named files of `dir`; one already gone is not an error (blocking).
fn remove_files(dir: &Path, names: &[String]) -> Result<(), LogsError> {
    for name in names {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("remove log file", &path)(e));
            }
            _ => {}
        }
    }
    Ok(())
}

/// After the compression `before` (from the rotation before), compresses the plain rotated
/// files `older` of `dir` (those kept at its cut; one the compression before has compressed
/// already is skipped), then the `newest` one if it is overfilled once the runtime has
/// closed it ([`compress_newest_at_once`]), until `stop`; the wait for the close ends early
/// at `hurry`. A failure is logged (the files stay, and the next rotation compresses them or
/// removes them).
async fn compress_all(
    before: Option<tokio::task::JoinHandle<()>>,
    (dir, older): (PathBuf, Vec<String>),
    newest: Newest,
    (stop, hurry): (Arc<AtomicBool>, Arc<AtomicBool>),
) {
    if let Some(before) = before {
        let _ = before.await;
    }
    for name in older {
        let path = dir.join(name);
        if stop.load(Ordering::SeqCst) || !tokio::fs::try_exists(&path).await.unwrap_or(false) {
            continue;
        }
        if let Err(e) = compress(path, stop.clone()).await {
            tracing::error!(error = %e, "Failed to compress rotated container log");
            return;
        }
    }
    let Newest {
        name,
        closed,
        policy,
    } = newest;
    let Some(closed) = closed else {
        return;
    };
    let waited = std::time::Instant::now();
    let closed = matches!(
        tokio::task::spawn_blocking(move || closed.wait(CLOSE_WAIT, &hurry)).await,
        Ok(true)
    );
    let path = dir.join(&name);
    let size = tokio::fs::metadata(&path).await.map_or(0, |m| m.len());
    if !compress_newest_at_once(closed, size, policy) {
        return;
    }
    tracing::debug!(rotated = %path.display(), size, closed_after_ms = waited.elapsed().as_millis(), "compressing the overfilled newest rotated container log");
    if let Err(e) = compress(path, stop).await {
        tracing::error!(error = %e, "Failed to compress rotated container log");
    }
}

/// Compresses `log` into `<log>.gz` through `<log>.tmp` (`compressLog`), then removes
/// `log`; when `stop` is set meanwhile, removes the `.tmp` and leaves `log`. The gzip work
/// runs on the blocking pool.
async fn compress(log: PathBuf, stop: Arc<AtomicBool>) -> Result<(), LogsError> {
    let tmp = PathBuf::from(format!("{}{TMP_SUFFIX}", log.display()));
    let gz = PathBuf::from(format!("{}{COMPRESS_SUFFIX}", log.display()));
    let written = tokio::task::spawn_blocking({
        let (log, tmp) = (log.clone(), tmp.clone());
        move || gzip(&log, &tmp, &stop)
    })
    .await
    .map_err(|e| io("compress", &log)(std::io::Error::other(e)))
    .and_then(|r| r);
    let done = match written {
        Ok(true) => tokio::fs::rename(&tmp, &gz)
            .await
            .map_err(io("rename compressed log", &tmp)),
        Ok(false) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Ok(());
        }
        Err(e) => Err(e),
    };
    if let Err(e) = done {
        // Best effort: a leftover is removed as unused at the next rotation anyway.
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
    }
    // Gone already when a rotation removed it as one too many meanwhile.
    match tokio::fs::remove_file(&log).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io("remove log after compressing", &log)(e))
        }
        _ => Ok(()),
    }
}

/// Writes `from` gzip-compressed to `to` (blocking), 64 KiB at a time; `false` when `stop`
/// was set before the end. At gzip's fastest level (the kubelet: the default level 6), so
/// that compressing keeps up with a container that logs at full speed; logs still
/// compress ~10× or more.
fn gzip(from: &Path, to: &Path, stop: &AtomicBool) -> Result<bool, LogsError> {
    use std::io::{Read, Write};
    let mut input = std::fs::File::open(from).map_err(io("open log", from))?;
    let output = std::fs::File::create(to).map_err(io("create temporary log", to))?;
    let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::fast());
    let mut chunk = vec![0; 64 << 10];
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let n = input.read(&mut chunk).map_err(io("read log", from))?;
        if n == 0 {
            break;
        }
        encoder
            .write_all(&chunk[..n])
            .map_err(io("compress log into", to))?;
    }
    encoder.finish().map_err(io("compress log into", to))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Read;
    use std::sync::Mutex;

    use super::*;

    /// A runtime whose containers write their logs into a temp dir; it holds each current
    /// file open and `ReopenContainerLog` opens the file anew and closes the old one (as
    /// containerd does), or fails when told to.
    #[derive(Default)]
    struct FakeRuntime {
        /// Running container id → log path.
        logs: Mutex<BTreeMap<String, PathBuf>>,
        /// Running container id → its open log.
        open: Mutex<BTreeMap<String, std::fs::File>>,
        reopen_fails: AtomicBool,
        /// A failing reopen has created the new file first and written to it.
        reopen_fails_after_open: AtomicBool,
        /// At a reopen of this container, its old file gets a line 50 ms later, then is
        /// closed.
        late_close: Mutex<Option<String>>,
        /// At a reopen, the old file stays open.
        keeps_old_open: AtomicBool,
        kept_open: Mutex<Vec<std::fs::File>>,
        reopened: Mutex<Vec<String>>,
    }

    /// `path` opened for appending, created if missing.
    fn append(path: &Path) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap()
    }

    impl Cri for FakeRuntime {
        async fn list_containers(
            &self,
            _: api::ListContainersRequest,
        ) -> crate::cri::Result<api::ListContainersResponse> {
            let containers = crate::lock::lock(&self.logs)
                .keys()
                .map(|id| api::Container {
                    id: id.clone(),
                    state: api::ContainerState::ContainerRunning.into(),
                    ..Default::default()
                })
                .collect();
            Ok(api::ListContainersResponse { containers })
        }

        async fn container_status(
            &self,
            req: api::ContainerStatusRequest,
        ) -> crate::cri::Result<api::ContainerStatusResponse> {
            let path = crate::lock::lock(&self.logs)
                .get(&req.container_id)
                .cloned();
            let Some(path) = path else {
                return Err(CriError::Rpc {
                    rpc: "ContainerStatus",
                    code: tonic::Code::NotFound,
                    message: "no such container".into(),
                });
            };
            Ok(api::ContainerStatusResponse {
                status: Some(api::ContainerStatus {
                    id: req.container_id,
                    state: api::ContainerState::ContainerRunning.into(),
                    log_path: path.display().to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            })
        }

        async fn reopen_container_log(
            &self,
            req: api::ReopenContainerLogRequest,
        ) -> crate::cri::Result<api::ReopenContainerLogResponse> {
            if self.reopen_fails_after_open.load(Ordering::SeqCst) {
                let path = crate::lock::lock(&self.logs)
                    .get(&req.container_id)
                    .cloned()
                    .unwrap();
                use std::io::Write;
                append(&path)
                    .write_all(b"written to the new file\n")
                    .unwrap();
            }
            if self.reopen_fails.load(Ordering::SeqCst) {
                return Err(CriError::Rpc {
                    rpc: "ReopenContainerLog",
                    code: tonic::Code::Unknown,
                    message: "failed to create and open log file".into(),
                });
            }
            let path = crate::lock::lock(&self.logs)
                .get(&req.container_id)
                .cloned();
            let Some(path) = path else {
                return Err(CriError::Rpc {
                    rpc: "ReopenContainerLog",
                    code: tonic::Code::NotFound,
                    message: "no such container".into(),
                });
            };
            let file = append(&path);
            let old = crate::lock::lock(&self.open).insert(req.container_id.clone(), file);
            if let Some(mut old) = old {
                if self.keeps_old_open.load(Ordering::SeqCst) {
                    crate::lock::lock(&self.kept_open).push(old);
                } else if crate::lock::lock(&self.late_close).as_ref() == Some(&req.container_id) {
                    std::thread::spawn(move || {
                        use std::io::Write;
                        std::thread::sleep(Duration::from_millis(50));
                        old.write_all(b"late\n").unwrap();
                    });
                }
            }
            crate::lock::lock(&self.reopened).push(req.container_id);
            Ok(api::ReopenContainerLogResponse {})
        }
    }

    struct Setup {
        dir: PathBuf,
        runtime: Arc<FakeRuntime>,
        manager: ContainerLogManager<FakeRuntime>,
    }

    impl Setup {
        fn new(name: &str, max_size: u64, max_files: usize) -> Self {
            let dir = std::env::temp_dir().join(format!("rk-logs-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let runtime = Arc::new(FakeRuntime::default());
            let manager = ContainerLogManager::new(
                runtime.clone(),
                LogRotatePolicy {
                    max_size,
                    max_files,
                },
            );
            Self {
                dir,
                runtime,
                manager,
            }
        }

        /// A running container `id` whose current log holds `content`.
        fn container(&self, id: &str, content: &str) -> PathBuf {
            let path = self.dir.join(format!("{id}.log"));
            std::fs::write(&path, content).unwrap();
            crate::lock::lock(&self.runtime.logs).insert(id.to_owned(), path.clone());
            crate::lock::lock(&self.runtime.open).insert(id.to_owned(), append(&path));
            path
        }

        fn files(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(&self.dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for Setup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn gunzip(path: &Path) -> String {
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    /// The rotated name of `0.log` at a time: `0.log.YYYYmmdd-HHMMSS` (rotation uses the
    /// clock, so the names are checked by shape and order).
    fn is_timestamped(name: &str, log: &str) -> bool {
        name.strip_prefix(&format!("{log}.")).is_some_and(|ts| {
            ts.len() == 15
                && ts.as_bytes()[8] == b'-'
                && ts
                    .bytes()
                    .enumerate()
                    .all(|(i, b)| i == 8 || b.is_ascii_digit())
        })
    }

    #[tokio::test]
    async fn a_log_below_the_size_is_left_alone() {
        let s = Setup::new("small", 100, 3);
        s.container("a", &"x".repeat(99));
        s.manager.rotate_logs().await.unwrap();
        assert_eq!(s.files(), ["a.log"]);
        assert!(crate::lock::lock(&s.runtime.reopened).is_empty());
    }

    #[tokio::test]
    async fn a_log_at_the_size_is_renamed_with_a_timestamp_and_reopened() {
        let s = Setup::new("rename", 100, 3);
        s.container("a", &"x".repeat(100));
        s.container("b", "short\n");
        s.manager.rotate_logs().await.unwrap();
        let files = s.files();
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[0], "a.log");
        assert!(is_timestamped(&files[1], "a.log"), "{files:?}");
        assert_eq!(files[2], "b.log");
        // The current file is the runtime's new, empty one; the rotated one is not
        // compressed yet (a reader may still be finishing it).
        assert_eq!(std::fs::read_to_string(s.dir.join("a.log")).unwrap(), "");
        assert_eq!(
            std::fs::read_to_string(s.dir.join(&files[1])).unwrap(),
            "x".repeat(100)
        );
        assert_eq!(*crate::lock::lock(&s.runtime.reopened), ["a"]);
    }

    #[tokio::test]
    async fn older_rotated_files_are_compressed_and_the_oldest_removed() {
        let s = Setup::new("keep", 13, 3);
        let log = s.container("a", "current line\n");
        for (name, content) in [
            ("a.log.20260101-000000.gz", None),
            ("a.log.20260101-000010.gz", None),
            ("a.log.20260101-000020", Some("newest rotated\n")),
        ] {
            match content {
                Some(text) => std::fs::write(s.dir.join(name), text).unwrap(),
                None => std::fs::write(s.dir.join(name), b"gz").unwrap(),
            }
        }
        s.manager.rotate_logs().await.unwrap();
        s.manager.compressed().await;
        let files = s.files();
        // max 3: the current file, the one just rotated, and the newest before it.
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[0], "a.log");
        assert_eq!(files[1], "a.log.20260101-000020.gz");
        assert!(is_timestamped(&files[2], "a.log"), "{files:?}");
        assert_eq!(gunzip(&s.dir.join(&files[1])), "newest rotated\n");
        assert_eq!(
            std::fs::read_to_string(s.dir.join(&files[2])).unwrap(),
            "current line\n"
        );
        // Again at once, the new current file big enough: still 3, the file rotated before
        // is now compressed, and the new one (in the same second, most likely) sorts after
        // it: the sequence number after the timestamp.
        std::fs::write(&log, "second line.\n").unwrap();
        let before = files[2].clone();
        s.manager.rotate_logs().await.unwrap();
        s.manager.compressed().await;
        let mut files = s.files();
        files.sort_by(|a, b| a.trim_end_matches(".gz").cmp(b.trim_end_matches(".gz")));
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[1], format!("{before}.gz"));
        assert_eq!(gunzip(&s.dir.join(&files[1])), "current line\n");
        assert!(
            files[2] == format!("{before}.001")
                || (is_timestamped(&files[2], "a.log") && files[2] > before),
            "{files:?}"
        );
        assert_eq!(
            std::fs::read_to_string(s.dir.join(&files[2])).unwrap(),
            "second line.\n"
        );
    }

    /// The oldest of two rotated files of container `a` (max 3 files), under a compression
    /// that would never end on its own: once told to stop, it runs `at_stop` and ends. Then a
    /// rotation, and the compressions after it; the files left.
    async fn abandon_a_compression(
        name: &str,
        at_stop: impl FnOnce(&Path) + Send + 'static,
    ) -> Vec<String> {
        let s = Setup::new(name, 13, 3);
        let log = s.container("a", "current line\n");
        std::fs::write(s.dir.join(OLDEST), "rotated before\n").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let done = tokio::spawn({
            let (stop, dir) = (stop.clone(), s.dir.clone());
            async move {
                while !stop.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                at_stop(&dir);
            }
        });
        crate::lock::lock(&s.manager.compressing).insert(
            log,
            Compressing {
                files: vec![OLDEST.to_owned()],
                stop,
                hurry: Arc::default(),
                done,
            },
        );
        std::fs::write(s.dir.join("a.log.20260101-000020"), "rotated last\n").unwrap();
        s.manager.rotate_logs().await.unwrap();
        s.manager.compressed().await;
        s.files()
    }

    const OLDEST: &str = "a.log.20260101-000010";

    #[tokio::test]
    async fn a_compression_still_under_way_at_the_next_rotation_is_abandoned_if_excess() {
        let files = abandon_a_compression("abandon", |_| {}).await;
        // The abandoned file went as the oldest; the one rotated last is compressed.
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[1], "a.log.20260101-000020.gz");
        assert!(is_timestamped(&files[2], "a.log"), "{files:?}");
    }

    #[tokio::test]
    async fn a_compression_past_its_last_chunk_when_abandoned_leaves_no_file_too_many() {
        // Past its last chunk when told to stop, it renames its result into place all the
        // same, after the cut removed the file it came from.
        let files = abandon_a_compression("abandon-late", |dir| {
            std::fs::write(dir.join(format!("{OLDEST}.gz")), "compressed late").unwrap();
        })
        .await;
        assert_eq!(
            files.len(),
            3,
            "max files, no late copy of the removed one: {files:?}"
        );
        assert!(!files.iter().any(|f| f.starts_with(OLDEST)), "{files:?}");
    }

    #[tokio::test]
    async fn a_compression_under_way_goes_on_during_the_cut() {
        let s = Setup::new("under-way", 13, 3);
        s.container("a", "current line\n");
        std::fs::write(s.dir.join("a.log.20260101-000010"), "rotated last\n").unwrap();
        // A compression of that file (kept: not one too many) that ends only once the
        // runtime has reopened the log, or after a second.
        let runtime = s.runtime.clone();
        let cut_first = Arc::new(AtomicBool::new(false));
        let done = tokio::spawn({
            let cut_first = cut_first.clone();
            async move {
                for _ in 0..200 {
                    if !crate::lock::lock(&runtime.reopened).is_empty() {
                        cut_first.store(true, Ordering::SeqCst);
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        let files = vec!["a.log.20260101-000010".to_owned()];
        let log = s.dir.join("a.log");
        crate::lock::lock(&s.manager.compressing).insert(
            log,
            Compressing {
                files,
                stop: Arc::default(),
                hurry: Arc::default(),
                done,
            },
        );
        s.manager.rotate_logs().await.unwrap();
        s.manager.compressed().await;
        assert!(cut_first.load(Ordering::SeqCst), "the cut waited for it");
        // It left its file plain: this rotation compressed it after the cut.
        let files = s.files();
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[1], "a.log.20260101-000010.gz");
        assert_eq!(gunzip(&s.dir.join(&files[1])), "rotated last\n");
        assert!(is_timestamped(&files[2], "a.log"), "{files:?}");
    }

    #[tokio::test]
    async fn leftovers_of_a_failed_compression_are_removed() {
        let s = Setup::new("leftovers", 1, 4);
        s.container("a", "line\n");
        std::fs::write(s.dir.join("a.log.20260101-000000.tmp"), "partial").unwrap();
        std::fs::write(s.dir.join("a.log.20260101-000010"), "done\n").unwrap();
        std::fs::write(s.dir.join("a.log.20260101-000010.gz"), "gz").unwrap();
        s.manager.rotate_logs().await.unwrap();
        let files = s.files();
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[1], "a.log.20260101-000010.gz");
        assert_eq!(std::fs::read(s.dir.join(&files[1])).unwrap(), b"gz");
    }

    #[tokio::test]
    async fn a_failed_reopen_renames_the_log_back() {
        let s = Setup::new("reopen", 1, 3);
        s.container("a", "keep me\n");
        s.runtime.reopen_fails.store(true, Ordering::SeqCst);
        // The failure is the container's, logged: the pass itself succeeds.
        s.manager.rotate_logs().await.unwrap();
        assert_eq!(s.files(), ["a.log"]);
        assert_eq!(
            std::fs::read_to_string(s.dir.join("a.log")).unwrap(),
            "keep me\n"
        );
        let err = s
            .manager
            .rotate_log("a", &s.dir.join("a.log"), 8)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("ReopenContainerLog of container \"a\": "),
            "{err}"
        );
        assert_eq!(s.files(), ["a.log"]);
    }

    /// A runtime that opened the new file before its reopen failed keeps it: the rotated
    /// file is not renamed over it.
    #[tokio::test]
    async fn a_failed_reopen_never_renames_over_a_file_the_runtime_opened() {
        let s = Setup::new("reopen-open", 1, 3);
        s.container("a", "keep me\n");
        s.runtime.reopen_fails.store(true, Ordering::SeqCst);
        s.runtime
            .reopen_fails_after_open
            .store(true, Ordering::SeqCst);
        s.manager.rotate_logs().await.unwrap();
        let files = s.files();
        assert_eq!(files.len(), 2, "{files:?}");
        assert_eq!(
            std::fs::read_to_string(s.dir.join("a.log")).unwrap(),
            "written to the new file\n"
        );
        assert_eq!(
            std::fs::read_to_string(s.dir.join(&files[1])).unwrap(),
            "keep me\n"
        );
    }

    /// A container removed without `clean` (by the runtime's GC, another client) leaves
    /// no compression behind once it has ended.
    #[tokio::test]
    async fn the_compressions_of_removed_containers_are_forgotten() {
        let s = Setup::new("forget", 10, 3);
        for id in ["a", "b"] {
            let log = s.container(id, "0123456789\n");
            s.manager.rotate_logs().await.unwrap();
            std::fs::write(&log, "0123456789\n").unwrap();
        }
        s.manager.rotate_logs().await.unwrap();
        assert!(s.files().len() > 2, "rotated: {:?}", s.files());
        crate::lock::lock(&s.runtime.logs).remove("a");
        crate::lock::lock(&s.runtime.logs).remove("b");
        for _ in 0..100 {
            let all_done = crate::lock::lock(&s.manager.compressing)
                .values()
                .all(|c| c.done.is_finished());
            if all_done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.manager.rotate_logs().await.unwrap();
        assert!(crate::lock::lock(&s.manager.compressing).is_empty());
    }

    #[tokio::test]
    async fn a_lost_current_log_is_reopened() {
        let s = Setup::new("lost", 100, 3);
        let log = s.container("a", "");
        std::fs::remove_file(&log).unwrap();
        s.manager.rotate_logs().await.unwrap();
        assert_eq!(s.files(), ["a.log"]);
        assert_eq!(*crate::lock::lock(&s.runtime.reopened), ["a"]);
    }

    #[tokio::test]
    async fn a_started_container_that_logs_fast_is_rotated_between_passes() {
        let s = Setup::new("fast", 64 << 10, 3);
        let manager = Arc::new(ContainerLogManager::new(
            s.runtime.clone(),
            s.manager.policy,
        ));
        let cancel = CancellationToken::new();
        let running = tokio::spawn(manager.clone().run(LOG_MONITOR_PERIOD, cancel.clone()));
        // Started after the first pass: only the start tells the manager.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let log = s.container("a", "");
        manager.starts().started("a", log.clone());
        // ~2 MiB/s in 8 KiB writes, to the file the runtime holds open, for 1.5 s.
        let runtime = s.runtime.clone();
        let writer = tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let line = vec![b'x'; 8 << 10];
            for _ in 0..375 {
                let mut open = crate::lock::lock(&runtime.open);
                open.get_mut("a").unwrap().write_all(&line).unwrap();
                drop(open);
                std::thread::sleep(Duration::from_millis(4));
            }
        });
        writer.await.unwrap();
        cancel.cancel();
        running.await.unwrap();
        manager.compressed().await;
        let reopened = crate::lock::lock(&s.runtime.reopened).len();
        // 3 MiB at 64 KiB: dozens of rotations, all before the second pass (10 s).
        assert!(reopened >= 10, "{reopened} rotations");
        let mut files = s.files();
        files.sort_by(|a, b| a.trim_end_matches(".gz").cmp(b.trim_end_matches(".gz")));
        assert_eq!(files.len(), 3, "{files:?}");
        assert!(files[1].ends_with(".gz"), "{files:?}");
        // The newest is plain, or compressed if it held more than the size (the runtime
        // closes it at the reopen). Rotated near the size: within what 2 MiB/s writes in a
        // few looks.
        let newest = s.dir.join(&files[2]);
        let compressed = files[2].ends_with(".gz");
        let rotated = if compressed {
            gunzip(&newest).len() as u64
        } else {
            std::fs::metadata(&newest).unwrap().len()
        };
        assert_eq!(compressed, rotated > 64 << 10, "{files:?}: {rotated} B");
        assert!(rotated < 4 * (64 << 10), "{rotated} B rotated");
    }

    #[tokio::test]
    async fn an_overfilled_rotated_file_is_compressed_once_the_runtime_has_closed_it() {
        let s = Setup::new("overfilled", 100, 3);
        s.container("a", &"x".repeat(250));
        s.container("b", &"y".repeat(100));
        // The runtime writes what its logger still held into the old file after the reopen
        // has returned, then closes it (containerd).
        *crate::lock::lock(&s.runtime.late_close) = Some("a".to_owned());
        s.manager.rotate_logs().await.unwrap();
        s.manager.compressed().await;
        let files = s.files();
        assert_eq!(files.len(), 4, "{files:?}");
        // a, 2.5 times the size: compressed, with the late line; b, at the size: plain, as
        // the kubelet keeps the newest rotated file.
        assert_eq!(files[0], "a.log");
        let a = files[1].strip_suffix(".gz").expect("compressed");
        assert!(is_timestamped(a, "a.log"), "{files:?}");
        assert_eq!(
            gunzip(&s.dir.join(&files[1])),
            format!("{}late\n", "x".repeat(250))
        );
        assert_eq!(files[2], "b.log");
        assert!(is_timestamped(&files[3], "b.log"), "{files:?}");
    }

    #[tokio::test]
    async fn a_rotated_file_the_runtime_keeps_open_stays_plain_and_holds_up_no_rotation() {
        let s = Setup::new("kept-open", 100, 3);
        let log = s.container("a", &"x".repeat(250));
        s.runtime.keeps_old_open.store(true, Ordering::SeqCst);
        s.manager.rotate_logs().await.unwrap();
        // The next rotation at once: it does not wait for a close that does not come.
        std::fs::write(&log, "y".repeat(100)).unwrap();
        let started = std::time::Instant::now();
        s.manager.rotate_logs().await.unwrap();
        assert!(
            started.elapsed() < CLOSE_WAIT / 2,
            "{:?}",
            started.elapsed()
        );
        s.manager.compressed().await;
        let mut files = s.files();
        files.sort_by(|a, b| a.trim_end_matches(".gz").cmp(b.trim_end_matches(".gz")));
        // The first rotated file was compressed by the second rotation, as the kubelet
        // does; the newest stays plain.
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(gunzip(&s.dir.join(&files[1])), "x".repeat(250));
        assert_eq!(
            std::fs::read_to_string(s.dir.join(&files[2])).unwrap(),
            "y".repeat(100)
        );
    }

    #[tokio::test]
    async fn clean_removes_every_file_of_the_container_only() {
        let s = Setup::new("clean", 1, 3);
        s.container("a", "a\n");
        s.container("b", "b\n");
        std::fs::write(s.dir.join("a.log.20260101-000000.gz"), "gz").unwrap();
        std::fs::write(s.dir.join("a.log.20260101-000010"), "old\n").unwrap();
        s.manager.clean("a").await.unwrap();
        assert_eq!(s.files(), ["b.log"]);
        let err = s.manager.clean("gone").await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
    }

    #[tokio::test]
    async fn a_container_gone_since_its_listing_is_not_a_failed_rotation() {
        let s = Setup::new("gone", 10, 2);
        let path = s.container("a", "");
        std::fs::remove_file(&path).unwrap();
        assert!(s.manager.still_running("a").await);
        crate::lock::lock(&s.runtime.logs).remove("a");
        let err = s.manager.look("a", &path, 10).await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(!s.manager.still_running("a").await);
    }
}
