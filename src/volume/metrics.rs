//! The figures of the pods' persistent and CSI volumes for the stats
//! ([`PersistentVolumeMetrics`]), as the kubelet's volume plugins give them: a `local`
//! PV's mount read with `statfs` (its plugin's `MetricsStatFS`), a CSI volume through its
//! driver's `NodeGetVolumeStats` (the CSI plugin's `MetricsProvider`), a hostPath PV none
//! (`MetricsNil`). The volumes are those last set up for the pod ([`SetUps`], the kubelet's
//! actual state of the world); which plugin mounted one is the plugin directory it is in.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;

use super::SetUps;
use super::csi::{self, CsiPlugin};
use super::local::PLUGIN_DIR;
use crate::stats::fs::{DiskUsage, FsInfo};
use crate::stats::volume::{PersistentVolumeMetrics, SpecVolume, metrics_statfs};

/// The pods' mounted volumes, with the CSI plugin that serves the CSI ones (if any).
pub struct MountedVolumeMetrics<K> {
    set_ups: Arc<SetUps<K>>,
    csi: Option<Arc<CsiPlugin>>,
}

impl<K> MountedVolumeMetrics<K> {
    /// The volumes last set up in `set_ups`; CSI volumes through `csi`.
    pub fn new(set_ups: Arc<SetUps<K>>, csi: Option<Arc<CsiPlugin>>) -> Self {
        Self { set_ups, csi }
    }
}

/// How a mounted volume's figures are read, from where it is mounted.
#[derive(Debug, PartialEq, Eq)]
enum Reader {
    /// `statfs` of a local PV's mount.
    StatFs(PathBuf),
    /// `NodeGetVolumeStats` of the CSI volume in `<pod>/volumes/kubernetes.io~csi/<name>`.
    Csi(String),
}

fn reader(host_path: &Path) -> Option<Reader> {
    let parent = host_path.parent()?;
    if parent.file_name()? == PLUGIN_DIR {
        return Some(Reader::StatFs(host_path.to_owned()));
    }
    // A CSI volume is published at `<volume dir>/mount`.
    let volume_dir = parent;
    (volume_dir.parent()?.file_name()? == csi::paths::POD_VOLUMES_DIR)
        .then(|| Some(Reader::Csi(volume_dir.file_name()?.to_str()?.to_owned())))?
}

impl<K: PartialEq + Send + Sync> PersistentVolumeMetrics for MountedVolumeMetrics<K> {
    fn metrics<'a>(
        &'a self,
        uid: &'a str,
        volume: &'a SpecVolume,
    ) -> BoxFuture<'a, Option<(DiskUsage, Option<FsInfo>)>> {
        let found = matches!(volume, SpecVolume::Claim { .. } | SpecVolume::Csi { .. })
            .then(|| {
                let volumes = self.set_ups.mounted(uid)?;
                reader(volumes.host_path(volume.name())?)
            })
            .flatten();
        Box::pin(async move {
            match found? {
                Reader::StatFs(path) => tokio::task::spawn_blocking(move || metrics_statfs(&path))
                    .await
                    .ok()?,
                Reader::Csi(name) => {
                    let stats = self
                        .csi
                        .as_ref()?
                        .volume_stats(uid, &name)
                        .await
                        .inspect_err(|e| tracing::debug!(%uid, volume = %name, error = %e, "CSI volume stats"))
                        .ok()??;
                    let usage = DiskUsage {
                        bytes: stats.used_bytes,
                        inodes: stats.inodes_used,
                    };
                    let fs = FsInfo {
                        capacity_bytes: stats.capacity_bytes,
                        available_bytes: stats.available_bytes,
                        used_bytes: stats.used_bytes,
                        inodes: stats.inodes,
                        inodes_free: stats.inodes_free,
                    };
                    Some((usage, Some(fs)))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_directory_tells_how_a_volume_is_read() {
        let pod = Path::new("/var/lib/kubelet/pods/u1/volumes");
        let local = pod.join("kubernetes.io~local-volume/pv-1");
        assert_eq!(reader(&local), Some(Reader::StatFs(local.clone())));
        assert_eq!(
            reader(&pod.join("kubernetes.io~csi/pv-2/mount")),
            Some(Reader::Csi("pv-2".into()))
        );
        // A hostPath PV is the host's own path: no figures, as the kubelet's MetricsNil.
        assert_eq!(reader(Path::new("/srv/data")), None);
        assert_eq!(reader(&pod.join("kubernetes.io~empty-dir/cache")), None);
    }
}
