//! The eviction manager's figures on a real node: a view of the stats housekeeping's
//! reading ([`crate::stats::housekeeping`]), as the kubelet's eviction manager reads the
//! summary provider. The node's signals are the reading's machine memory (capacity less
//! the root cgroup's working set), the filesystems of `--root-dir` and of the runtime's
//! images, and the PIDs; each running pod's usage is its summary entry (containers'
//! working sets, writable layers and logs), and its local storage (writable layers, logs,
//! volumes) with its managed hosts file and whether the images are on a filesystem of
//! their own. The last reading is shared with the endpoints; after a node-level reclaim
//! the manager asks for a reading made then. So eviction knows neither the runtime's
//! labels nor where logs live, and reads nothing twice.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::cri::Cri;
use crate::eviction::{
    ContainerUsage, EvictionError, LocalStorage, Observations, PodStorage, PodUsage, StatsSource,
};
use crate::kuberuntime::names::etc_hosts_path;
use crate::node::{FsStats, MachineInfo};
use crate::stats::fs::FsInfo;
use crate::stats::housekeeping::HOUSEKEEPING_INTERVAL;
use crate::stats::{ContainerStats, Figures, Housekeeping, Reading, Summary};

/// The eviction manager's view of the stats housekeeping.
pub struct NodeStats<C, M> {
    stats: Arc<Housekeeping<C, M>>,
    root_dir: PathBuf,
}

impl<C, M> std::fmt::Debug for NodeStats<C, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStats")
            .field("root_dir", &self.root_dir)
            .finish_non_exhaustive()
    }
}

impl<C, M> NodeStats<C, M> {
    /// The view of `stats`, on the node whose pods' directories are under `root_dir`.
    pub fn new(stats: Arc<Housekeeping<C, M>>, root_dir: PathBuf) -> Self {
        Self { stats, root_dir }
    }
}

impl<C: Cri, M: MachineInfo + Clone + 'static> NodeStats<C, M> {
    /// The last reading (the housekeeping keeps it at most an interval old), or one made
    /// now with `update`.
    async fn reading(&self, update: bool) -> Reading {
        let max_age = if update {
            Duration::ZERO
        } else {
            HOUSEKEEPING_INTERVAL
        };
        self.stats.updated(max_age).await
    }
}

fn fs(info: Option<&FsInfo>) -> Option<FsStats> {
    info.map(|f| FsStats {
        capacity_bytes: f.capacity_bytes,
        available_bytes: f.available_bytes,
        inodes: f.inodes,
        inodes_free: f.inodes_free,
    })
}

/// The signals of a reading.
fn observations(figures: &Figures) -> Observations {
    let snapshot = &figures.snapshot;
    Observations {
        memory_available_bytes: snapshot.machine.memory.and_then(|m| m.available_bytes()),
        nodefs: fs(snapshot.storage.root_fs.as_ref()),
        imagefs: fs(snapshot.storage.image_fs.as_ref()),
        pids: snapshot.machine.pids,
    }
}

/// A container's working set, writable layer and logs in the summary.
fn container_usage(c: &ContainerStats) -> ContainerUsage {
    ContainerUsage {
        name: c.name.clone(),
        working_set_bytes: c.memory.as_ref().and_then(|m| m.working_set_bytes),
        rootfs_bytes: c.rootfs.as_ref().and_then(|f| f.used_bytes),
        logs_bytes: c.logs.as_ref().and_then(|f| f.used_bytes),
    }
}

/// Each pod's usage in a reading, by UID.
fn pod_usage(figures: &Figures) -> HashMap<String, PodUsage> {
    figures
        .summary
        .pods
        .iter()
        .map(|p| {
            let mut containers: Vec<ContainerUsage> =
                p.containers.iter().map(container_usage).collect();
            containers.sort_by(|a, b| a.name.cmp(&b.name));
            (p.pod_ref.uid.clone(), PodUsage { containers })
        })
        .collect()
}

/// The pods' local storage in a summary, each with its hosts file's size from `hosts`.
fn local_storage(
    summary: &Summary,
    hosts: &HashMap<String, u64>,
    dedicated_image_fs: bool,
) -> LocalStorage {
    let pods = summary.pods.iter().map(|pod| {
        let uid = pod.pod_ref.uid.clone();
        let containers = pod.containers.iter().map(container_usage).collect();
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

impl<C: Cri, M: MachineInfo + Clone + 'static> StatsSource for NodeStats<C, M> {
    async fn observe(&self, update: bool) -> Observations {
        match self.reading(update).await.as_ref() {
            Ok(figures) => observations(figures),
            Err(e) => {
                tracing::warn!(error = %e, "eviction signals unavailable");
                Observations::default()
            }
        }
    }

    async fn pod_usage(&self) -> Result<HashMap<String, PodUsage>, EvictionError> {
        let reading = self.reading(false).await;
        Ok(pod_usage(figures(&reading)?))
    }

    async fn local_storage(&self) -> Result<LocalStorage, EvictionError> {
        let reading = self.reading(false).await;
        let figures = figures(&reading)?;
        let imagefs = figures
            .snapshot
            .storage
            .image_fs_usage
            .as_ref()
            .and_then(|u| u.fs_id.as_ref())
            .map(|id| PathBuf::from(&id.mountpoint));
        let root_dir = self.root_dir.clone();
        let uids: Vec<String> = figures
            .summary
            .pods
            .iter()
            .map(|p| p.pod_ref.uid.clone())
            .collect();
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
        .map_err(|e| EvictionError::Stats(Box::new(e)))?;
        Ok(local_storage(&figures.summary, &hosts, dedicated))
    }
}

/// The figures of a reading, or why there are none.
fn figures(reading: &Reading) -> Result<&Figures, EvictionError> {
    reading
        .as_ref()
        .as_ref()
        .map_err(|e| EvictionError::Stats(e.to_string().into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{Memory, MemoryUsage, PidUsage};
    use crate::stats::{
        ContainerStats, FsStats as SummaryFs, MemoryStats, PodReference, PodStats, Snapshot,
        Summary,
    };

    fn used(bytes: u64) -> Option<SummaryFs> {
        Some(SummaryFs {
            used_bytes: Some(bytes),
            ..SummaryFs::default()
        })
    }

    #[test]
    fn signals_and_pod_usage_are_the_readings() {
        let mut snapshot = Snapshot::default();
        snapshot.machine.memory = Some(Memory {
            total_bytes: 1000,
            usage: Some(MemoryUsage {
                usage_bytes: 900,
                working_set_bytes: 700,
            }),
        });
        snapshot.machine.pids = Some(PidUsage {
            running: 10,
            max: 100,
        });
        let disk = FsInfo {
            capacity_bytes: 100,
            available_bytes: 40,
            used_bytes: 55,
            inodes: 10,
            inodes_free: 4,
        };
        snapshot.storage.root_fs = Some(disk);
        let container = |name: &str, ws: u64| ContainerStats {
            name: name.into(),
            memory: Some(MemoryStats {
                working_set_bytes: Some(ws),
                ..MemoryStats::default()
            }),
            rootfs: used(ws * 2),
            logs: used(ws * 3),
            ..ContainerStats::default()
        };
        let figures = Figures {
            snapshot,
            summary: Summary {
                node: crate::stats::NodeStats::default(),
                pods: vec![PodStats {
                    pod_ref: PodReference {
                        uid: "u1".into(),
                        ..PodReference::default()
                    },
                    containers: vec![container("web", 5), container("app", 7)],
                    ..PodStats::default()
                }],
            },
        };
        let seen = observations(&figures);
        assert_eq!(seen.memory_available_bytes, Some(300));
        assert_eq!(
            seen.nodefs,
            Some(FsStats {
                capacity_bytes: 100,
                available_bytes: 40,
                inodes: 10,
                inodes_free: 4
            })
        );
        assert_eq!(seen.imagefs, None);
        assert_eq!(seen.pids.map(|p| p.max), Some(100));
        let usage = pod_usage(&figures);
        let app = &usage["u1"].containers[0];
        assert_eq!(
            (
                app.name.as_str(),
                app.working_set_bytes,
                app.rootfs_bytes,
                app.logs_bytes
            ),
            ("app", Some(7), Some(14), Some(21))
        );
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
                    pvc_ref: None,
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
