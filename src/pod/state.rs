//! A pod's per-node state has one owner. Every module that remembers something per pod
//! UID (why containers wait, back-offs, probe workers, statuses, admitted pods, volume
//! set-ups, referenced Secrets and ConfigMaps, events kept for aggregation) registers it
//! here as a [`ForgetPod`]; the pod's worker, which owns the pod's lifecycle (the
//! kubelet's pod workers), forgets it in every module in one call when it ends — the
//! pod is then finally gone (the kubelet spreads the same across `HandlePodCleanups`,
//! `probeManager.CleanupPods` and `statusManager.RemoveOrphanedStatuses`).
//!
//! A module's map keyed by pod UID is a [`PodMap`] taken from [`PodStates::map`]:
//! registered as it is made, it cannot be left out of the forgetting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Per-pod state of one module, forgotten when the pod is gone.
pub trait ForgetPod: Send + Sync {
    /// What the state is (for logs and tests).
    fn name(&self) -> &'static str;
    /// Whether anything of pod `uid` is held.
    fn holds(&self, uid: &str) -> bool;
    /// Forgets everything of pod `uid`.
    fn forget(&self, uid: &str);
}

/// Why a pod's worker is woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeFor {
    /// Something the next sync acts on: a container to restart (a liveness or startup
    /// probe failed), a changed Secret or ConfigMap the pod uses, an eviction.
    Sync,
    /// The runtime's state of the pod changed (the PLEG's relist): a sync, unless the
    /// worker's last sync acted on all of that very state (the sync that started the pod's
    /// containers reads them running, before the relist sees them; one that reads one it
    /// started already exited has not acted on that).
    Runtime,
    /// Only what the pod's status shows changed (a readiness result, a container known to
    /// have started): its status is generated anew from the runtime state its last sync
    /// read, with no sync and no runtime call (the kubelet's probe manager sets a
    /// container's readiness in its status manager likewise, with no pod sync).
    Status,
}

/// Wakes the pod worker of a pod UID: what a module that learns something new about a pod
/// (a probe result changed, a referenced Secret changed) is given to call, so it never
/// knows the pod workers.
pub type Wake = Arc<dyn Fn(&str, WakeFor) + Send + Sync>;

/// The per-pod state of the node: every registered module's. Cheap to clone.
#[derive(Clone, Default)]
pub struct PodStates(Arc<Mutex<Vec<Arc<dyn ForgetPod>>>>);

impl std::fmt::Debug for PodStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.states().iter().map(|s| s.name()))
            .finish()
    }
}

impl PodStates {
    fn states(&self) -> Vec<Arc<dyn ForgetPod>> {
        crate::lock::lock(&self.0).clone()
    }

    /// Registers a module's per-pod state; `state` is returned for the module to keep.
    pub fn register<S: ForgetPod + 'static>(&self, state: Arc<S>) -> Arc<S> {
        crate::lock::lock(&self.0).push(state.clone());
        state
    }

    /// A new map keyed by pod UID, registered.
    #[must_use]
    pub fn map<V: Send + 'static>(&self, name: &'static str) -> Arc<PodMap<V>> {
        self.register(Arc::new(PodMap {
            name,
            pods: Mutex::default(),
        }))
    }

    /// Forgets pod `uid` in every registered module.
    pub fn forget(&self, uid: &str) {
        for state in self.states() {
            state.forget(uid);
        }
        tracing::debug!(pod_uid = uid, "per-pod state forgotten");
    }

    /// The registered modules that hold something of pod `uid`.
    #[must_use]
    pub fn holding(&self, uid: &str) -> Vec<&'static str> {
        self.states()
            .iter()
            .filter(|s| s.holds(uid))
            .map(|s| s.name())
            .collect()
    }

    /// The names of the registered modules.
    #[must_use]
    pub fn names(&self) -> Vec<&'static str> {
        self.states().iter().map(|s| s.name()).collect()
    }
}

/// A map keyed by pod UID that [`PodStates`] forgets: made only by [`PodStates::map`].
pub struct PodMap<V> {
    name: &'static str,
    pods: Mutex<HashMap<String, V>>,
}

impl<V> PodMap<V> {
    /// The map, locked.
    pub fn lock(&self) -> MutexGuard<'_, HashMap<String, V>> {
        crate::lock::lock(&self.pods)
    }
}

impl<V: Send> ForgetPod for PodMap<V> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn holds(&self, uid: &str) -> bool {
        self.lock().contains_key(uid)
    }

    fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forget_reaches_every_registered_map_and_only_the_pod() {
        let states = PodStates::default();
        let reasons = states.map::<String>("reasons");
        let backoff = states.map::<u32>("backoff");
        reasons.lock().insert("u1".into(), "ErrImagePull".into());
        reasons
            .lock()
            .insert("u2".into(), "CrashLoopBackOff".into());
        backoff.lock().insert("u1".into(), 3);
        assert_eq!(states.names(), ["reasons", "backoff"]);
        assert_eq!(states.holding("u1"), ["reasons", "backoff"]);
        states.forget("u1");
        assert!(states.holding("u1").is_empty());
        assert_eq!(states.holding("u2"), ["reasons"]);
    }
}
