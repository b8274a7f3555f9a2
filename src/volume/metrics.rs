//! The figures of the pods' persistent volumes for the stats ([`PersistentVolumeMetrics`]),
//! as the kubelet's volume plugins give them: a `local` PV's mount read with `statfs`
//! (its plugin's `MetricsStatFS`), a hostPath PV none (`MetricsNil`). The volumes are those
//! last set up for the pod ([`SetUps`], the kubelet's actual state of the world).

use futures::future::BoxFuture;

use super::SetUps;
use super::local::PLUGIN_DIR;
use crate::stats::fs::{DiskUsage, FsInfo};
use crate::stats::volume::{PersistentVolumeMetrics, SpecVolume, metrics_statfs};

impl<K: PartialEq + Send + Sync> PersistentVolumeMetrics for SetUps<K> {
    fn metrics<'a>(
        &'a self,
        uid: &'a str,
        volume: &'a SpecVolume,
    ) -> BoxFuture<'a, Option<(DiskUsage, Option<FsInfo>)>> {
        // A claim mounted by the local plugin (`.../kubernetes.io~local-volume/<pv>`).
        let path = volume.claim().and_then(|_| {
            let volumes = self.mounted(uid)?;
            let path = volumes.host_path(volume.name())?.to_owned();
            let plugin = path.parent()?.file_name()?;
            (plugin == PLUGIN_DIR).then_some(path)
        });
        Box::pin(async move {
            let path = path?;
            tokio::task::spawn_blocking(move || metrics_statfs(&path))
                .await
                .ok()?
        })
    }
}
