//! Where the eviction manager's figures come from on a real node: the machine (the
//! node agent's [`MachineInfo`]: memory capacity less the root cgroup's working set, the
//! filesystems of `--root-dir` and of
//! the runtime's images, PIDs) and the runtime (CRI `ImageFsInfo` for where its images
//! are; `ListContainerStats` of the running containers: working set and writable layer),
//! plus each container's log files. The eviction manager takes it as its [`StatsSource`]
//! (the kubelet's summary provider), so eviction knows neither the runtime's labels nor
//! where logs live.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cri::{Cri, api};
use crate::eviction::rank::{ContainerUsage, PodUsage};
use crate::eviction::{EvictionError, Observations, StatsSource};
use crate::kuberuntime::labels;
use crate::kuberuntime::sandbox::pod_log_dir;
use crate::node::{MachineInfo, image_fs_mountpoint};

/// Stats from the machine and the runtime.
pub struct NodeStats<C, M: ?Sized> {
    cri: C,
    machine: Arc<M>,
    root_dir: PathBuf,
    pod_logs_dir: PathBuf,
}

impl<C, M: ?Sized> std::fmt::Debug for NodeStats<C, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStats")
            .field("root_dir", &self.root_dir)
            .finish_non_exhaustive()
    }
}

impl<C, M: ?Sized> NodeStats<C, M> {
    /// Stats of the node whose state lives in `root_dir` (the nodefs) and whose pod logs
    /// live in `pod_logs_dir`.
    pub fn new(cri: C, machine: Arc<M>, root_dir: PathBuf, pod_logs_dir: PathBuf) -> Self {
        Self {
            cri,
            machine,
            root_dir,
            pod_logs_dir,
        }
    }
}

/// Bytes of the regular files under `dir` (0 when it cannot be read).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some(if meta.is_dir() {
                dir_bytes(&e.path())
            } else {
                meta.len()
            })
        })
        .sum()
}

impl<C: Cri, M: MachineInfo + ?Sized + 'static> StatsSource for NodeStats<C, M> {
    async fn observe(&self) -> Observations {
        let imagefs = image_fs_mountpoint(&self.cri).await;
        let machine = Arc::clone(&self.machine);
        let root_dir = self.root_dir.clone();
        let read = tokio::task::spawn_blocking(move || {
            let ok = |what: &str, e: crate::node::MachineError| {
                tracing::warn!(error = %e, signal = what, "eviction signal unavailable");
            };
            Observations {
                memory_available_bytes: machine
                    .memory()
                    .map_err(|e| ok("memory.available", e))
                    .ok()
                    .and_then(|m| m.available_bytes()),
                nodefs: machine
                    .fs_stats(&root_dir)
                    .map_err(|e| ok("nodefs.available", e))
                    .ok(),
                imagefs: imagefs.and_then(|path| {
                    machine
                        .fs_stats(&path)
                        .map_err(|e| ok("imagefs.available", e))
                        .ok()
                }),
                pids: machine.pid_usage().map_err(|e| ok("pid.available", e)).ok(),
            }
        })
        .await;
        read.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the eviction signals failed");
            Observations::default()
        })
    }

    async fn pod_usage(&self) -> Result<HashMap<String, PodUsage>, EvictionError> {
        let running: std::collections::HashSet<String> = self
            .cri
            .list_containers(crate::cri::running_containers_request())
            .await?
            .containers
            .into_iter()
            .map(|c| c.id)
            .collect();
        let stats = self
            .cri
            .list_container_stats(api::ListContainerStatsRequest { filter: None })
            .await?
            .stats;
        let mut by_pod: HashMap<String, PodUsage> = HashMap::new();
        let mut log_dirs = Vec::new();
        for s in stats {
            let Some(attributes) = s.attributes.as_ref() else {
                continue;
            };
            if !running.contains(&attributes.id) {
                continue;
            }
            let (Some(pod), Some(name)) = (
                labels::pod_of(&attributes.labels),
                attributes.labels.get(labels::CONTAINER_NAME),
            ) else {
                continue;
            };
            let usage = by_pod.entry(pod.uid.clone()).or_default();
            log_dirs.push((
                pod.uid.clone(),
                usage.containers.len(),
                pod_log_dir(&self.pod_logs_dir, &pod).join(name),
            ));
            usage.containers.push(ContainerUsage {
                name: name.clone(),
                working_set_bytes: s
                    .memory
                    .as_ref()
                    .and_then(|m| m.working_set_bytes.as_ref())
                    .map(|v| v.value),
                rootfs_bytes: s
                    .writable_layer
                    .as_ref()
                    .and_then(|w| w.used_bytes.as_ref())
                    .map(|v| v.value),
                logs_bytes: None,
            });
        }
        let sizes = tokio::task::spawn_blocking(move || {
            log_dirs
                .into_iter()
                .map(|(uid, i, dir)| (uid, i, dir_bytes(&dir)))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for (uid, i, bytes) in sizes {
            if let Some(c) = by_pod.get_mut(&uid).and_then(|u| u.containers.get_mut(i)) {
                c.logs_bytes = Some(bytes);
            }
        }
        for usage in by_pod.values_mut() {
            usage.containers.sort_by(|a, b| a.name.cmp(&b.name));
        }
        Ok(by_pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_bytes_sums_files_recursively_and_ignores_a_missing_dir() {
        let dir = std::env::temp_dir().join(format!("rk-eviction-logs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("0.log"), [0u8; 100]).unwrap();
        std::fs::write(dir.join("sub/1.log"), [0u8; 28]).unwrap();
        assert_eq!(dir_bytes(&dir), 128);
        assert_eq!(dir_bytes(&dir.join("missing")), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
