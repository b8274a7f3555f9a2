//! Volume statistics, as the kubelet's volume stats calculator
//! (`pkg/kubelet/server/stats/volume_stat_calculator.go`) gathers them for each pod: every
//! volume of the pod spec that is set up on the node gets its figures from its plugin's
//! metrics provider — `du` and the filesystem's `statfs` for emptyDir, configMap, secret,
//! projected and downwardAPI volumes (`pkg/volume/metrics_du.go`), the filesystem alone for
//! persistent volumes (`metrics_statfs.go`), the driver's `NodeGetVolumeStats` for CSI —
//! and a volume that comes from a PersistentVolumeClaim carries a `pvcRef` (the claim's
//! name and the pod's namespace). emptyDir volumes on disk and configMaps are ephemeral
//! (they count in the pod's ephemeral storage); the others are not.
//!
//! Persistent and CSI volumes are mounted by other parts of the agent: they join through
//! [`PersistentVolumeMetrics`], which tells where a pod's claim is and reads its figures.
//! Nothing here knows how they are mounted.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Pod, Volume};

use super::fs::{self, DiskUsage, FsInfo};

/// A volume of a pod, with its figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeUsage {
    /// Its name in the pod spec.
    pub name: String,
    /// What it holds.
    pub usage: DiskUsage,
    /// The filesystem it is on (tmpfs for `medium: Memory`).
    pub fs: Option<FsInfo>,
    /// The PersistentVolumeClaim it comes from.
    pub claim: Option<String>,
    /// Whether it counts in the pod's ephemeral storage.
    pub ephemeral: bool,
}

/// A pod volume's plugin directory under `<root-dir>/pods/<uid>/volumes/`, for the in-tree
/// plugins whose figures are read with `du`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InTree {
    /// `emptyDir`; `memory` for `medium: Memory` (tmpfs).
    EmptyDir {
        /// On tmpfs.
        memory: bool,
    },
    /// `configMap`.
    ConfigMap,
    /// `secret`.
    Secret,
    /// `projected`.
    Projected,
    /// `downwardAPI`.
    DownwardApi,
}

impl InTree {
    /// The plugin's directory name (`kubernetes.io~empty-dir`, ...).
    #[must_use]
    pub fn dir(self) -> &'static str {
        match self {
            Self::EmptyDir { .. } => "kubernetes.io~empty-dir",
            Self::ConfigMap => "kubernetes.io~configmap",
            Self::Secret => "kubernetes.io~secret",
            Self::Projected => "kubernetes.io~projected",
            Self::DownwardApi => "kubernetes.io~downward-api",
        }
    }
}

/// A volume of a pod spec, as the stats see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecVolume {
    /// An in-tree volume measured with `du` under the pod's volume directory.
    InTree {
        /// Its name in the pod spec.
        name: String,
        /// Its plugin.
        plugin: InTree,
    },
    /// A `persistentVolumeClaim` volume.
    Claim {
        /// Its name in the pod spec.
        name: String,
        /// `claimName`.
        claim: String,
    },
    /// A CSI inline volume (`csi:`).
    Csi {
        /// Its name in the pod spec.
        name: String,
    },
}

impl SpecVolume {
    /// The volume of `v`, when its plugin has metrics (hostPath and the others have none,
    /// the kubelet's `MetricsNil`).
    #[must_use]
    pub fn of(v: &Volume) -> Option<Self> {
        let name = v.name.clone();
        let plugin = if let Some(e) = &v.empty_dir {
            InTree::EmptyDir {
                memory: e.medium.as_deref() == Some("Memory"),
            }
        } else if v.config_map.is_some() {
            InTree::ConfigMap
        } else if v.secret.is_some() {
            InTree::Secret
        } else if v.projected.is_some() {
            InTree::Projected
        } else if v.downward_api.is_some() {
            InTree::DownwardApi
        } else if let Some(c) = &v.persistent_volume_claim {
            return Some(Self::Claim {
                name,
                claim: c.claim_name.clone(),
            });
        } else if v.csi.is_some() {
            return Some(Self::Csi { name });
        } else {
            return None;
        };
        Some(Self::InTree { name, plugin })
    }

    /// The volumes of `pod`'s spec that have metrics.
    #[must_use]
    pub fn all_of(pod: &Pod) -> Vec<Self> {
        pod.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(Self::of)
            .collect()
    }

    /// Its name in the pod spec.
    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            Self::InTree { name, .. } | Self::Claim { name, .. } | Self::Csi { name } => name,
        }
    }

    /// Whether it counts in the pod's ephemeral storage (the kubelet's
    /// `isVolumeEphemeral`: emptyDir on disk, configMap).
    #[must_use]
    pub fn is_ephemeral(&self) -> bool {
        matches!(
            self,
            Self::InTree {
                plugin: InTree::EmptyDir { memory: false } | InTree::ConfigMap,
                ..
            }
        )
    }

    /// The claim it comes from.
    #[must_use]
    pub fn claim(&self) -> Option<&str> {
        match self {
            Self::Claim { claim, .. } => Some(claim),
            _ => None,
        }
    }
}

/// The figures of a volume directory read with `du` and `statfs` (the kubelet's
/// `metricsDu`): what the tree uses, on its filesystem; `None` when it is not set up.
#[must_use]
pub fn metrics_du(path: &Path) -> Option<(DiskUsage, Option<FsInfo>)> {
    if !path.is_dir() {
        return None;
    }
    let (bytes, inodes) = fs::disk_usage(path);
    Some((DiskUsage { bytes, inodes }, fs::fs_info(path)))
}

/// The figures of a volume that is a whole filesystem (the kubelet's `metricsStatFS`, for
/// persistent volumes): its use is the filesystem's; `None` when it cannot be read.
#[must_use]
pub fn metrics_statfs(path: &Path) -> Option<(DiskUsage, Option<FsInfo>)> {
    if !path.exists() {
        return None;
    }
    let info = fs::fs_info(path)?;
    let usage = DiskUsage {
        bytes: info.used_bytes,
        inodes: info.inodes_used(),
    };
    Some((usage, Some(info)))
}

/// Where a pod's in-tree volume lives: `<root-dir>/pods/<uid>/volumes/<plugin>/<name>`.
#[must_use]
pub fn in_tree_dir(root_dir: &Path, uid: &str, plugin: InTree, name: &str) -> PathBuf {
    root_dir
        .join("pods")
        .join(uid)
        .join("volumes")
        .join(plugin.dir())
        .join(name)
}

/// Orders a pod's volumes as the kubelet lists them: the ephemeral ones first, then the
/// others, each group by name.
pub fn sort_volumes(volumes: &mut [VolumeUsage]) {
    volumes.sort_by(|a, b| (!a.ephemeral, &a.name).cmp(&(!b.ephemeral, &b.name)));
}

/// Reads the in-tree volumes of a pod (blocking): one entry per volume set up on the node,
/// in [`sort_volumes`] order; claims and CSI volumes are left to
/// [`PersistentVolumeMetrics`].
#[must_use]
pub fn read_in_tree(root_dir: &Path, uid: &str, volumes: &[SpecVolume]) -> Vec<VolumeUsage> {
    let mut found: Vec<VolumeUsage> = volumes
        .iter()
        .filter_map(|v| {
            let SpecVolume::InTree { name, plugin } = v else {
                return None;
            };
            let (usage, fs) = metrics_du(&in_tree_dir(root_dir, uid, *plugin, name))?;
            Some(VolumeUsage {
                name: name.clone(),
                usage,
                fs,
                claim: None,
                ephemeral: v.is_ephemeral(),
            })
        })
        .collect();
    sort_volumes(&mut found);
    found
}

/// The figures of a pod's persistent (claim) and CSI volumes: the hook through which the
/// parts of the agent that mount them give their metrics (a PV's mount read with
/// [`metrics_statfs`]; a CSI volume through the driver's `NodeGetVolumeStats`).
pub trait PersistentVolumeMetrics: Send + Sync {
    /// The figures of `volume` of the pod `uid`, or `None` when it is not mounted here
    /// or has no metrics.
    fn metrics<'a>(
        &'a self,
        uid: &'a str,
        volume: &'a SpecVolume,
    ) -> BoxFuture<'a, Option<(DiskUsage, Option<FsInfo>)>>;
}

impl<T: PersistentVolumeMetrics + ?Sized> PersistentVolumeMetrics for std::sync::Arc<T> {
    fn metrics<'a>(
        &'a self,
        uid: &'a str,
        volume: &'a SpecVolume,
    ) -> BoxFuture<'a, Option<(DiskUsage, Option<FsInfo>)>> {
        self.as_ref().metrics(uid, volume)
    }
}

/// No persistent or CSI volumes (tests): none has figures.
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPersistentVolumes;

#[cfg(test)]
impl PersistentVolumeMetrics for NoPersistentVolumes {
    fn metrics<'a>(
        &'a self,
        _uid: &'a str,
        _volume: &'a SpecVolume,
    ) -> BoxFuture<'a, Option<(DiskUsage, Option<FsInfo>)>> {
        Box::pin(async { None })
    }
}

/// The entry of a persistent or CSI volume whose figures the hook gave.
#[must_use]
pub fn persistent_usage(
    volume: &SpecVolume,
    (usage, fs): (DiskUsage, Option<FsInfo>),
) -> VolumeUsage {
    VolumeUsage {
        name: volume.name().to_owned(),
        usage,
        fs,
        claim: volume.claim().map(str::to_owned),
        ephemeral: volume.is_ephemeral(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(json: serde_json::Value) -> Volume {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_kubelets_metrics_providers_and_ephemeral_rule() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "ram", "emptyDir": {"medium": "Memory"}},
                {"name": "conf", "configMap": {"name": "c"}},
                {"name": "creds", "secret": {"secretName": "s"}},
                {"name": "token", "projected": {"sources": []}},
                {"name": "info", "downwardAPI": {}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}},
                {"name": "inline", "csi": {"driver": "d"}},
                {"name": "host", "hostPath": {"path": "/tmp"}},
            ]},
        }))
        .unwrap();
        let volumes = SpecVolume::all_of(&pod);
        let names: Vec<&str> = volumes.iter().map(SpecVolume::name).collect();
        assert_eq!(
            names,
            [
                "scratch", "ram", "conf", "creds", "token", "info", "data", "inline"
            ],
            "hostPath has no metrics"
        );
        let ephemeral: Vec<&str> = volumes
            .iter()
            .filter(|v| v.is_ephemeral())
            .map(SpecVolume::name)
            .collect();
        assert_eq!(ephemeral, ["scratch", "conf"]);
        assert_eq!(volumes[6].claim(), Some("data-0"));
        assert!(volumes.iter().take(6).all(|v| v.claim().is_none()));
        assert_eq!(
            SpecVolume::of(&volume(
                serde_json::json!({"name": "r", "emptyDir": {"medium": "Memory"}})
            )),
            Some(SpecVolume::InTree {
                name: "r".into(),
                plugin: InTree::EmptyDir { memory: true }
            })
        );
    }

    #[test]
    fn in_tree_volumes_set_up_are_read_with_du_and_statfs() {
        let root = std::env::temp_dir().join(format!("rkubelet-volstats-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cache = in_tree_dir(&root, "u1", InTree::EmptyDir { memory: false }, "cache");
        std::fs::create_dir_all(cache.join("sub")).unwrap();
        std::fs::write(cache.join("sub/f"), vec![7u8; 20_000]).unwrap();
        let conf = in_tree_dir(&root, "u1", InTree::ConfigMap, "conf");
        std::fs::create_dir_all(&conf).unwrap();
        let volumes = [
            SpecVolume::InTree {
                name: "conf".into(),
                plugin: InTree::ConfigMap,
            },
            SpecVolume::InTree {
                name: "cache".into(),
                plugin: InTree::EmptyDir { memory: false },
            },
            // Not set up (yet): no entry, as the kubelet lists mounted volumes only.
            SpecVolume::InTree {
                name: "later".into(),
                plugin: InTree::Secret,
            },
            SpecVolume::Claim {
                name: "data".into(),
                claim: "c".into(),
            },
        ];
        let read = read_in_tree(&root, "u1", &volumes);
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].name, "cache");
        assert_eq!(read[0].usage.inodes, 3);
        assert!(read[0].usage.bytes >= 20_000, "{:?}", read[0]);
        assert!(read[0].ephemeral && read[0].claim.is_none());
        let fs = read[0].fs.unwrap();
        assert!(fs.capacity_bytes > 0 && fs.inodes >= fs.inodes_free);
        assert_eq!(read[1].name, "conf");
        // A claim's volume is the filesystem it is on.
        let (usage, info) = metrics_statfs(&cache).unwrap();
        let info = info.unwrap();
        assert_eq!(
            (usage.bytes, usage.inodes),
            (info.used_bytes, info.inodes_used())
        );
        let entry = persistent_usage(&volumes[3], (usage, Some(info)));
        assert_eq!(
            (entry.name.as_str(), entry.claim.as_deref(), entry.ephemeral),
            ("data", Some("c"), false)
        );
        assert!(metrics_statfs(&root.join("missing")).is_none());
        std::fs::remove_dir_all(root).unwrap();
    }
}
