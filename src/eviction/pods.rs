//! The eviction manager's view of the kubelet's pods: the active pods from the pod store,
//! an eviction through the kubelet (status and event) and the pod's worker (the kill).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::manager::PodEvictor;
use crate::cri::Cri;
use crate::kubelet::Kubelet;
use crate::pod::source::PodStore;
use crate::pod::workers::PodWorkers;

/// The kubelet's pods, as the eviction manager sees them.
pub struct KubeletPods<C> {
    store: PodStore,
    workers: PodWorkers<Kubelet<C>>,
    kubelet: Arc<Kubelet<C>>,
}

impl<C> std::fmt::Debug for KubeletPods<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletPods").finish_non_exhaustive()
    }
}

impl<C> KubeletPods<C> {
    /// The pods of `store`, synced by `workers` with `kubelet`.
    pub fn new(store: PodStore, workers: PodWorkers<Kubelet<C>>, kubelet: Arc<Kubelet<C>>) -> Self {
        Self {
            store,
            workers,
            kubelet,
        }
    }
}

impl<C: Cri + Clone> PodEvictor for KubeletPods<C> {
    /// The kubelet's `GetActivePods`: the node's pods that have not finished and are not
    /// being deleted (their termination is already under way).
    fn active_pods(&self) -> Option<Vec<Arc<Pod>>> {
        if !*self.store.synced.borrow() {
            return None;
        }
        let pods = self.store.store.state();
        Some(
            pods.into_iter()
                .filter(|p| !crate::pod::is_terminating(p) && !self.kubelet.finished(p))
                .collect(),
        )
    }

    async fn evict(&self, pod: &Pod, message: &str, grace: i64) {
        self.kubelet.evict(pod, message, grace).await;
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.workers.wake(uid);
        }
    }

    async fn cleaned_up(&self, uid: &str) -> bool {
        self.kubelet.pod_stopped(uid).await
    }
}
