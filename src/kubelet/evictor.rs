//! The eviction manager's view of the kubelet's pods: the active pods from the pod store,
//! an eviction through the kubelet (status and event) and the pod's worker (the kill).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::Kubelet;
use crate::cri::Cri;
use crate::eviction::PodEvictor;
use crate::pod::store::PodStore;
use crate::pod::workers::{PodWork, PodWorkers};

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
    /// The kubelet's `GetActivePods`: the node's pods whose worker is not done with them
    /// ([`crate::pod::is_worker_terminal`]). A pod being deleted whose containers still run
    /// is one of them: it holds its resources for as long as its grace period.
    fn active_pods(&self) -> Option<Vec<Arc<Pod>>> {
        if !*self.store.synced.borrow() {
            return None;
        }
        let pods = self.store.store.state();
        Some(
            pods.into_iter()
                .filter(|p| !self.kubelet.finished(p))
                .collect(),
        )
    }

    /// Evicts `pod`. One already being deleted has its termination under way with its own
    /// grace period: the worker is handed the pod with the eviction's (shorter) one, which
    /// restarts that termination at once (the kubelet's kill with a grace period override).
    async fn evict(&self, pod: &Pod, message: &str, grace: i64) {
        self.kubelet.evict(pod, message, grace).await;
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        if crate::pod::is_terminating(pod) && crate::pod::termination_grace_period(pod) > grace {
            let mut shorter = pod.clone();
            shorter.metadata.deletion_grace_period_seconds = Some(grace);
            self.workers.update(uid, PodWork::Sync(Arc::new(shorter)));
        } else {
            self.workers.wake(uid, crate::pod::state::WakeFor::Sync);
        }
    }

    async fn cleaned_up(&self, uid: &str) -> bool {
        self.kubelet.pod_stopped(uid).await
    }
}
