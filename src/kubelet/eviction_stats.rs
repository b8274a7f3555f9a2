//! Where the eviction manager's figures come from on a real node: the machine (the
//! node agent's [`MachineInfo`]: memory capacity less the root cgroup's working set, the
//! filesystems of `--root-dir` and of
//! the runtime's images, PIDs) and the runtime (CRI `ImageFsInfo` for where its images
//! are; `ListContainerStats` of the running containers: working set and writable layer),
//! plus each container's log files. The eviction manager takes it as its [`StatsSource`]
//! (the kubelet's summary provider), so eviction knows neither the runtime's labels nor
//! where logs live. The pods' local storage (writable layers, logs, volumes) is the stats
//! provider's summary ([`crate::stats`]), with each pod's managed hosts file and whether
//! the images are on a filesystem of their own.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::cri::{Cri, api};
use crate::eviction::{
    ContainerUsage, EvictionError, LocalStorage, Observations, PodStorage, PodUsage, StatsSource,
};
use crate::kuberuntime::labels;
use crate::kuberuntime::names::etc_hosts_path;
use crate::kuberuntime::sandbox::pod_log_dir;
use crate::node::{MachineInfo, image_fs_mountpoint};
use crate::stats::{StatsConfig, StatsProvider, Summary};

/// Stats from the machine and the runtime.
pub struct NodeStats<C, M> {
    cri: C,
    machine: M,
    root_dir: PathBuf,
    pod_logs_dir: PathBuf,
    node_name: String,
    provider: StatsProvider,
}

impl<C, M> std::fmt::Debug for NodeStats<C, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStats")
            .field("root_dir", &self.root_dir)
            .finish_non_exhaustive()
    }
}

impl<C, M> NodeStats<C, M> {
    /// Stats of the node `node_name`, read where `stats` says (its root dir is the
    /// nodefs), whose pod logs live in `pod_logs_dir`.
    pub fn new(
        cri: C,
        machine: M,
        stats: StatsConfig,
        pod_logs_dir: PathBuf,
        node_name: String,
    ) -> Self {
        Self {
            cri,
            machine,
            root_dir: stats.root_dir.clone(),
            pod_logs_dir,
            node_name,
            provider: StatsProvider::new(stats),
        }
    }
}

/// The pods' local storage in a summary, each with its hosts file's size from `hosts`.
fn local_storage(
    summary: &Summary,
    hosts: &HashMap<String, u64>,
    dedicated_image_fs: bool,
) -> LocalStorage {
    let pods = summary.pods.iter().map(|pod| {
        let uid = pod.pod_ref.uid.clone();
        let containers = pod
            .containers
            .iter()
            .map(|c| ContainerUsage {
                name: c.name.clone(),
                working_set_bytes: c.memory.as_ref().and_then(|m| m.working_set_bytes),
                rootfs_bytes: c.rootfs.as_ref().and_then(|fs| fs.used_bytes),
                logs_bytes: c.logs.as_ref().and_then(|fs| fs.used_bytes),
            })
            .collect();
        let volumes = pod
            .volume_stats
            .iter()
            .filter_map(|v| Some((v.name.clone(), v.fs.used_bytes?)))
            .collect();
        let etc_hosts_bytes = hosts.get(&uid).copied();
        let storage = PodStorage {
            containers,
            volumes,
            etc_hosts_bytes,
        };
        (uid, storage)
    });
    LocalStorage {
        dedicated_image_fs,
        pods: pods.collect(),
    }
}

/// Whether `a` and `b` are on different filesystems (the kubelet compares the devices of
/// the root and image filesystems); false when either cannot be read.
fn on_different_devices(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() != b.dev(),
        _ => false,
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

impl<C: Cri, M: MachineInfo + Clone + 'static> StatsSource for NodeStats<C, M> {
    async fn observe(&self) -> Observations {
        let imagefs = image_fs_mountpoint(&self.cri).await;
        let machine = self.machine.clone();
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

    async fn local_storage(&self) -> Result<LocalStorage, EvictionError> {
        let summary = self
            .provider
            .summary(&self.node_name, &self.cri, &self.machine)
            .await
            .map_err(|e| EvictionError::Storage(Box::new(e)))?;
        let imagefs = image_fs_mountpoint(&self.cri).await;
        let root_dir = self.root_dir.clone();
        let uids: Vec<String> = summary.pods.iter().map(|p| p.pod_ref.uid.clone()).collect();
        let (dedicated, hosts) = tokio::task::spawn_blocking(move || {
            let dedicated = imagefs.is_some_and(|m| on_different_devices(&root_dir, &m));
            let hosts: HashMap<String, u64> = uids
                .into_iter()
                .filter_map(|uid| {
                    let path = etc_hosts_path(&root_dir.join("pods").join(&uid));
                    Some((uid, std::fs::metadata(path).ok()?.len()))
                })
                .collect();
            (dedicated, hosts)
        })
        .await
        .map_err(|e| EvictionError::Storage(Box::new(e)))?;
        Ok(local_storage(&summary, &hosts, dedicated))
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

    #[test]
    fn a_summarys_pods_become_their_local_storage() {
        use crate::stats::{ContainerStats, FsStats, PodReference, PodStats, VolumeStats};
        let used = |bytes| {
            Some(FsStats {
                used_bytes: Some(bytes),
                ..FsStats::default()
            })
        };
        let summary = Summary {
            pods: vec![PodStats {
                pod_ref: PodReference {
                    uid: "u-1".into(),
                    ..PodReference::default()
                },
                containers: vec![ContainerStats {
                    name: "app".into(),
                    rootfs: used(20),
                    logs: used(3),
                    ..ContainerStats::default()
                }],
                volume_stats: vec![VolumeStats {
                    fs: used(7).unwrap(),
                    name: "cache".into(),
                }],
                ..PodStats::default()
            }],
            node: crate::stats::NodeStats::default(),
        };
        let hosts = HashMap::from([("u-1".to_owned(), 200)]);
        let storage = local_storage(&summary, &hosts, true);
        assert!(storage.dedicated_image_fs);
        assert_eq!(
            storage.pods["u-1"],
            PodStorage {
                containers: vec![ContainerUsage {
                    name: "app".into(),
                    rootfs_bytes: Some(20),
                    logs_bytes: Some(3),
                    working_set_bytes: None,
                }],
                volumes: [("cache".to_owned(), 7)].into(),
                etc_hosts_bytes: Some(200),
            }
        );
    }

    #[test]
    fn a_directory_is_on_its_own_device() {
        let here = std::env::temp_dir();
        assert!(!on_different_devices(&here, &here));
        assert!(on_different_devices(
            Path::new("/proc/self"),
            Path::new("/")
        ));
        assert!(!on_different_devices(
            &here.join("missing-rk"),
            Path::new("/")
        ));
    }
}
