//! What the pod sources fill and the rest of the agent reads (the kubelet's pod manager and
//! `PodConfig` seen from outside): the static pods of the manifests ([`StaticPods`]), the
//! store of the API's pods beside them ([`PodStore`]), and the admission every source asks
//! before a pod reaches its worker ([`PodAdmission`]). It knows no source (file, API
//! watch), no mirror pod and no pod worker.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Notify, watch};

/// The static pods now in the manifests, by UID, a wake-up for whoever follows them
/// (the mirror pods), and whether the manifests were read once (the kubelet's "source
/// ready": no mirror pod or runtime pod is removed as an orphan before). Cheap to clone.
#[derive(Clone)]
pub struct StaticPods {
    pub(super) pods: Arc<RwLock<BTreeMap<String, Arc<Pod>>>>,
    changed: Arc<Notify>,
    pub(super) listed: Arc<watch::Sender<bool>>,
}

impl Default for StaticPods {
    /// No manifest path: nothing to read, so listed from the start.
    fn default() -> Self {
        Self {
            pods: Arc::default(),
            changed: Arc::default(),
            listed: Arc::new(watch::Sender::new(true)),
        }
    }
}

impl StaticPods {
    /// Static pods of a manifest path not read yet.
    #[must_use]
    pub fn unlisted() -> Self {
        let statics = Self::default();
        statics.listed.send_replace(false);
        statics
    }

    /// Returns once the manifests were read (at once without a manifest path).
    pub async fn listed(&self) {
        let mut listed = self.listed.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = listed.wait_for(|l| *l).await;
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Pod>>> {
        crate::lock::read(&self.pods)
    }

    /// The static pods.
    #[must_use]
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.read().values().cloned().collect()
    }

    /// Their UIDs.
    #[must_use]
    pub fn uids(&self) -> HashSet<String> {
        self.read().keys().cloned().collect()
    }

    /// The static pod named `name` in `namespace`.
    #[must_use]
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.read()
            .values()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.metadata.name.as_deref() == Some(name)
            })
            .cloned()
    }

    /// Something about static or mirror pods changed.
    pub fn notify(&self) {
        self.changed.notify_one();
    }

    /// Returns at the next [`Self::notify`] (or at once if one came since the last call).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// The reflector's store, and whether its first full list has completed.
#[derive(Clone)]
pub struct PodStore {
    /// The pods bound to this node, as last seen.
    pub store: Store<Pod>,
    /// True once the first full list is in the store.
    pub synced: watch::Receiver<bool>,
    /// The static pods (from manifest files).
    pub statics: StaticPods,
}

impl PodStore {
    /// The pod named `name` in `namespace` that runs here: a static pod rather than its
    /// mirror pod.
    #[must_use]
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.statics
            .get(namespace, name)
            .or_else(|| self.store.get(&ObjectRef::new(name).within(namespace)))
    }

    /// The UIDs of the pods that should exist: the API's and the static ones.
    #[must_use]
    pub fn uids(&self) -> HashSet<String> {
        let mut uids = self.statics.uids();
        uids.extend(
            self.store
                .state()
                .iter()
                .filter_map(|p| p.metadata.uid.clone()),
        );
        uids
    }
}

/// What the source asks before a pod reaches its worker: the kubelet's admission.
pub trait PodAdmission: Send + Sync + 'static {
    /// A pod was seen (added or updated); decided once, at its first sighting.
    fn admit(&self, pod: &Arc<Pod>);
    /// A pod is gone from the API.
    fn forget(&self, uid: &str);
    /// A full list came: pods not in it are gone (their deletions were missed).
    fn retain(&self, listed: &HashSet<String>);
    /// Every version of a pod the watch delivers, also one whose only change is its
    /// status (which wakes no worker): the status manager's reconciliation looks at it.
    fn observed(&self, _pod: &Pod) {}
    /// A mirror pod was seen (`present`) or deleted.
    fn mirror(&self, _pod: &Pod, _present: bool) {}
}
