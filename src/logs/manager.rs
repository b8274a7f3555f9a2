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

use super::rotation::{
    COMPRESS_SUFFIX, LogRotatePolicy, TMP_SUFFIX, is_rotated_of, rotated_name, split_excess,
    split_unused,
};
use super::schedule::{Look, Watches};
use crate::cri::{Cri, CriError, api};

/// The kubelet's `logMonitorPeriod`.
pub const LOG_MONITOR_PERIOD: Duration = Duration::from_secs(10);

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

/// The compression of a log's older rotated files, in the background after a cut.
struct Compressing {
    /// The plain files it compresses.
    files: Vec<String>,
    /// Set to abandon it (its file is about to be removed).
    stop: Arc<AtomicBool>,
    done: tokio::task::JoinHandle<()>,
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
        Ok(())
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
    /// A compression still under way from the rotation before is awaited, or abandoned when
    /// its file is one too many now, so compressions never pile up.
    async fn rotate_log(&self, id: &str, path: &Path, seen: u64) -> Result<(), LogsError> {
        let started = std::time::Instant::now();
        let (dir, log) = split_path(path);
        self.finish_compressing(path, Some(self.policy)).await?;
        let (in_use, unused) = split_unused(rotated_files(dir, log).await?);
        remove_all(dir, &unused).await?;
        let rotated = dir.join(rotated_name(log, Timestamp::now(), &in_use));
        let (excess, kept) = split_excess(in_use, self.policy);
        remove_all(dir, &excess).await?;
        tokio::fs::rename(path, &rotated)
            .await
            .map_err(io("rotate", path))?;
        if let Err(e) = self.reopen(id).await {
            // Renamed back, to be rotated again at the next look.
            if let Err(back) = tokio::fs::rename(&rotated, path).await {
                tracing::error!(rotated = %rotated.display(), log = %path.display(), error = %back, reopen_error = %e, "Failed to rename rotated log back");
            }
            return Err(e);
        }
        let files: Vec<String> = kept
            .into_iter()
            .filter(|n| !n.ends_with(COMPRESS_SUFFIX))
            .collect();
        if !files.is_empty() {
            let stop = Arc::new(AtomicBool::new(false));
            let span = tracing::debug_span!("compress_container_logs", container = %id);
            let done = tokio::spawn(
                compress_all(dir.to_owned(), files.clone(), stop.clone()).instrument(span),
            );
            crate::lock::lock(&self.compressing)
                .insert(path.to_owned(), Compressing { files, stop, done });
        }
        let took = started.elapsed();
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
            seen_bytes = seen,
            rotated_bytes,
            "rotated container log"
        );
        Ok(())
    }

    /// Waits for the compression under way of the log at `path`, if any; abandons it when
    /// its files are one too many for the next rotation under `policy` (or, without a
    /// policy, always: the files are being removed).
    async fn finish_compressing(
        &self,
        path: &Path,
        policy: Option<LogRotatePolicy>,
    ) -> Result<(), LogsError> {
        let Some(pending) = crate::lock::lock(&self.compressing).remove(path) else {
            return Ok(());
        };
        let abandon = match policy {
            None => true,
            Some(policy) => {
                let (dir, log) = split_path(path);
                let (in_use, _) = split_unused(rotated_files(dir, log).await?);
                let (excess, _) = split_excess(in_use, policy);
                pending.files.iter().any(|f| excess.contains(f))
            }
        };
        if abandon {
            pending.stop.store(true, Ordering::SeqCst);
        }
        let _ = pending.done.await;
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
        self.finish_compressing(&path, None).await?;
        let (dir, log) = split_path(&path);
        let mut names = rotated_files(dir, log).await?;
        names.push(log.to_owned());
        remove_all(dir, &names).await
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

/// The names of the files `<log>.*` in `dir`.
async fn rotated_files(dir: &Path, log: &str) -> Result<Vec<String>, LogsError> {
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .map_err(io("list log files in", dir))?;
    let mut names = Vec::new();
    while let Some(entry) = entries
        .next_entry()
        .await
        .map_err(io("list log files in", dir))?
    {
        if let Some(name) = entry.file_name().to_str()
            && is_rotated_of(name, log)
        {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Removes the named files of `dir`; one already gone is not an error.
async fn remove_all(dir: &Path, names: &[String]) -> Result<(), LogsError> {
    for name in names {
        let path = dir.join(name);
        match tokio::fs::remove_file(&path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("remove log file", &path)(e));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Compresses the plain rotated files `names` of `dir`, until `stop`; a failure is logged
/// (the files stay, and the next rotation compresses them or removes them).
async fn compress_all(dir: PathBuf, names: Vec<String>, stop: Arc<AtomicBool>) {
    for name in names {
        if let Err(e) = compress(dir.join(name), stop.clone()).await {
            tracing::error!(error = %e, "Failed to compress rotated container log");
            return;
        }
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
    tokio::fs::remove_file(&log)
        .await
        .map_err(io("remove log after compressing", &log))
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

    /// A runtime whose containers write their logs into a temp dir; `ReopenContainerLog`
    /// creates the current file anew (as containerd does), or fails when told to.
    #[derive(Default)]
    struct FakeRuntime {
        /// Running container id → log path.
        logs: Mutex<BTreeMap<String, PathBuf>>,
        reopen_fails: AtomicBool,
        reopened: Mutex<Vec<String>>,
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
            std::fs::File::create(&path).unwrap();
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
        let s = Setup::new("keep", 10, 3);
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
        std::fs::write(&log, "second current line\n").unwrap();
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
            "second current line\n"
        );
    }

    #[tokio::test]
    async fn a_compression_still_under_way_at_the_next_rotation_is_abandoned_if_excess() {
        let s = Setup::new("abandon", 10, 3);
        let log = s.container("a", "current line\n");
        std::fs::write(s.dir.join("a.log.20260101-000010"), "rotated before\n").unwrap();
        // A compression of that file that would never end on its own.
        let stop = Arc::new(AtomicBool::new(false));
        let done = tokio::spawn({
            let stop = stop.clone();
            async move {
                while !stop.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        let files = vec!["a.log.20260101-000010".to_owned()];
        crate::lock::lock(&s.manager.compressing)
            .insert(log.clone(), Compressing { files, stop, done });
        std::fs::write(s.dir.join("a.log.20260101-000020"), "rotated last\n").unwrap();
        s.manager.rotate_logs().await.unwrap();
        s.manager.compressed().await;
        // The abandoned file went as the oldest; the one rotated last is compressed.
        let files = s.files();
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[1], "a.log.20260101-000020.gz");
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
        // ~2 MiB/s in 8 KiB writes, to whichever file the path names, for 1.5 s.
        let writer = tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let line = vec![b'x'; 8 << 10];
            for _ in 0..375 {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap();
                f.write_all(&line).unwrap();
                std::thread::sleep(Duration::from_millis(4));
            }
        });
        writer.await.unwrap();
        cancel.cancel();
        running.await.unwrap();
        let reopened = crate::lock::lock(&s.runtime.reopened).len();
        // 3 MiB at 64 KiB: dozens of rotations, all before the second pass (10 s).
        assert!(reopened >= 10, "{reopened} rotations");
        let mut files = s.files();
        files.sort_by(|a, b| a.trim_end_matches(".gz").cmp(b.trim_end_matches(".gz")));
        assert_eq!(files.len(), 3, "{files:?}");
        assert!(
            files[1].ends_with(".gz") && !files[2].ends_with(".gz"),
            "{files:?}"
        );
        // Rotated near the size: within what 2 MiB/s writes in a few looks.
        let rotated = std::fs::metadata(s.dir.join(&files[2])).unwrap().len();
        assert!(rotated < 4 * (64 << 10), "{rotated} B rotated");
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
