//! Container log rotation (the kubelet's `pkg/kubelet/logs`): the container log manager
//! that keeps each running container's CRI log file under `--container-log-max-size` and
//! its rotated, compressed files under `--container-log-max-files`, telling the runtime to
//! reopen the file it writes (CRI `ReopenContainerLog`), and removes a container's log
//! files when the container goes.
//!
//! It owns the log files' names and lifecycle only: it knows the runtime through the
//! [`crate::cri::Cri`] calls and nothing of pods, the API server, or how logs are read
//! (`kubectl logs` reads the current file, as the kubelet v1.20's does).

mod manager;
mod rotation;

pub use manager::{ContainerLogManager, LOG_MONITOR_PERIOD, LogsError};
pub use rotation::{DEFAULT_MAX_FILES, DEFAULT_MAX_SIZE, LogRotatePolicy, PolicyError};
