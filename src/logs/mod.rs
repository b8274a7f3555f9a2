//! Container log rotation (the kubelet's `pkg/kubelet/logs`): the container log manager
//! that keeps each running container's CRI log file under `--container-log-max-size` and
//! its rotated, compressed files under `--container-log-max-files`, telling the runtime to
//! reopen the file it writes (CRI `ReopenContainerLog`), and removes a container's log
//! files when the container goes. Beyond the kubelet's periodic pass, a container whose log
//! grows fast is looked at again when its file would reach the size (`schedule`), and a
//! rotated file the runtime overfilled while it reopened is compressed once the runtime has
//! closed it (`closed`), so the size holds for fast writers too.
//!
//! It owns the log files' names and lifecycle only: it knows the runtime through the
//! [`crate::cri::Cri`] calls and nothing of pods, the API server, or how logs are read
//! (`kubectl logs` reads the current file, as the kubelet v1.20's does).

mod closed;
mod manager;
mod rotation;
mod schedule;

pub use manager::{ContainerLogManager, LOG_MONITOR_PERIOD, LogsError, StartedContainers};
pub use rotation::{DEFAULT_MAX_FILES, DEFAULT_MAX_SIZE, LogRotatePolicy, PolicyError};
