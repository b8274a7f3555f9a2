//! The pod lifecycle event generator: relists the runtime's sandboxes and containers
//! every second (the kubelet's `GenericPLEG`), and wakes the worker of every pod whose
//! runtime state changed — a container that exits is noticed within about a second.
//! It also knows which pods the runtime holds, for finding orphans, and reports its own
//! health to the node's Ready condition.
//! Knows no pod worker (it calls back with a pod UID), prober or status manager.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cri::{Cri, CriError, api};
use crate::kuberuntime::{PodRuntimeStatus, RunState, labels};
use crate::pod::PodId;

/// How often the runtime is relisted.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// The PLEG is unhealthy when no relist completed for this long (the kubelet's 3 min).
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);

/// What a relist sees of one pod: the state of each sandbox and container by id.
pub type PodFingerprint = BTreeMap<String, i32>;

/// One relist: every pod in the runtime, by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Relist {
    /// Each pod's identity and fingerprint.
    pub pods: HashMap<String, (PodId, PodFingerprint)>,
}

/// A sandbox's key in a fingerprint.
fn sandbox_key(id: &str) -> String {
    format!("s/{id}")
}

/// A container's key in a fingerprint.
fn container_key(id: &str) -> String {
    format!("c/{id}")
}

/// Lists the runtime once.
///
/// # Errors
/// A failed CRI call.
pub async fn relist<C: Cri>(cri: &C) -> Result<Relist, CriError> {
    let sandboxes = cri
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
        .await?
        .items;
    let containers = cri
        .list_containers(api::ListContainersRequest { filter: None })
        .await?
        .containers;
    let mut out = Relist::default();
    let objects = sandboxes
        .into_iter()
        .map(|s| (s.labels, sandbox_key(&s.id), s.state))
        .chain(
            containers
                .into_iter()
                .map(|c| (c.labels, container_key(&c.id), c.state)),
        );
    for (object_labels, key, state) in objects {
        let Some(pod) = labels::pod_of(&object_labels) else {
            continue;
        };
        out.pods
            .entry(pod.uid.clone())
            .or_insert_with(|| (pod, PodFingerprint::new()))
            .1
            .insert(key, state);
    }
    Ok(out)
}

/// The fingerprint a relist would give a pod whose state a sync read as `status`: what
/// the worker saw, to compare with what the PLEG sees.
#[must_use]
pub fn fingerprint_of(status: &PodRuntimeStatus) -> PodFingerprint {
    let sandboxes = status.sandboxes.iter().map(|s| {
        let state = if s.ready {
            api::PodSandboxState::SandboxReady
        } else {
            api::PodSandboxState::SandboxNotready
        };
        (sandbox_key(&s.id), state as i32)
    });
    let containers = status.containers.iter().map(|c| {
        let state = match c.state {
            RunState::Created => api::ContainerState::ContainerCreated,
            RunState::Running => api::ContainerState::ContainerRunning,
            RunState::Exited => api::ContainerState::ContainerExited,
            RunState::Unknown => api::ContainerState::ContainerUnknown,
        };
        (container_key(&c.id), state as i32)
    });
    sandboxes.chain(containers).collect()
}

/// Whether `after`, read at the end of a sync that acted on `before` (what it read first),
/// shows only what such a sync does: whatever `before` showed is as it was, and whatever is
/// new is a ready sandbox or a running container. A relist showing that state holds
/// nothing the sync did not act on. Any other state (an init container the sync started
/// that has already run to its end, a container that failed at once) needs a sync of its
/// own, as the kubelet's PLEG event for it brings one.
#[must_use]
pub fn only_sync_changes(before: &PodRuntimeStatus, after: &PodRuntimeStatus) -> bool {
    let sandboxes = after.sandboxes.iter().all(|s| {
        before
            .sandboxes
            .iter()
            .find(|b| b.id == s.id)
            .map_or(s.ready, |b| b.ready == s.ready)
    });
    let containers = after.containers.iter().all(|c| {
        before
            .containers
            .iter()
            .find(|b| b.id == c.id)
            .map_or(c.state == RunState::Running, |b| b.state == c.state)
    });
    sandboxes && containers
}

/// The UIDs whose fingerprint differs between two relists (new, changed or gone pods).
#[must_use]
pub fn changed(old: &Relist, new: &Relist) -> Vec<String> {
    let mut uids: Vec<String> = new
        .pods
        .iter()
        .filter(|(uid, (_, fp))| old.pods.get(*uid).is_none_or(|(_, o)| o != fp))
        .map(|(uid, _)| uid.clone())
        .chain(
            old.pods
                .keys()
                .filter(|uid| !new.pods.contains_key(*uid))
                .cloned(),
        )
        .collect();
    uids.sort();
    uids
}

/// The PLEG's shared state: the last relist and when it completed.
#[derive(Debug, Default)]
pub struct Pleg {
    last: Mutex<(Option<Instant>, Relist)>,
}

impl Pleg {
    /// The pods the runtime held at the last relist.
    #[must_use]
    pub fn pods(&self) -> HashMap<String, PodId> {
        let last = crate::lock::lock(&self.last);
        last.1
            .pods
            .iter()
            .map(|(uid, (id, _))| (uid.clone(), id.clone()))
            .collect()
    }

    /// Takes `relist` as the last one.
    #[cfg(test)]
    pub(crate) fn set_last(&self, relist: Relist) {
        *crate::lock::lock(&self.last) = (Some(Instant::now()), relist);
    }

    /// The pod's fingerprint at the last relist (`None`: nothing of it in the runtime).
    #[must_use]
    pub fn fingerprint(&self, uid: &str) -> Option<PodFingerprint> {
        let last = crate::lock::lock(&self.last);
        last.1.pods.get(uid).map(|(_, fp)| fp.clone())
    }

    /// Whether the last relist found anything of the pod `uid`.
    #[must_use]
    pub fn holds(&self, uid: &str) -> bool {
        crate::lock::lock(&self.last).1.pods.contains_key(uid)
    }

    /// Healthy while relists keep completing.
    ///
    /// # Errors
    /// The kubelet's message when the last relist is too old.
    pub fn healthy(&self) -> Result<(), String> {
        let last = crate::lock::lock(&self.last);
        match last.0 {
            Some(at) if at.elapsed() <= RELIST_THRESHOLD => Ok(()),
            Some(at) => Err(format!(
                "pleg was last seen active {:?} ago; threshold is {RELIST_THRESHOLD:?}",
                at.elapsed()
            )),
            None => Err("pleg has yet to be successful".into()),
        }
    }

    /// Waits until the first relist completed, or `timeout` passed (the runtime is slow
    /// or down: the node then reports the PLEG as unhealthy).
    pub async fn wait_for_first_relist(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.healthy().is_err() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Relists forever, calling `on_change` with each pod whose runtime state changed.
    pub async fn run<C: Cri>(self: Arc<Self>, cri: Arc<C>, on_change: impl Fn(&str) + Send) {
        let mut ticker = tokio::time::interval(RELIST_PERIOD);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut previous_start: Option<Instant> = None;
        loop {
            ticker.tick().await;
            // As the kubelet's relist: the interval between relists' starts, the duration
            // of each, and the time it was last seen active.
            let started = Instant::now();
            let interval = previous_start.map(|p| started - p);
            previous_start = Some(started);
            let listed = relist(cri.as_ref()).await;
            let epoch_s = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            crate::metrics::observe_pleg_relist(started.elapsed(), interval, epoch_s);
            let new = match listed {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "PLEG relist failed");
                    continue;
                }
            };
            let uids = {
                let mut last = crate::lock::lock(&self.last);
                let uids = changed(&last.1, &new);
                *last = (Some(Instant::now()), new);
                uids
            };
            for uid in uids {
                on_change(&uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::runtime_status::testing::{container, sandbox};

    #[test]
    fn a_state_after_a_sync_settles_only_with_what_a_sync_does() {
        let empty = PodRuntimeStatus::default();
        let started = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container("c1", "init", "s1", 0, RunState::Running)],
        };
        assert!(
            only_sync_changes(&empty, &started),
            "a new sandbox and container"
        );
        assert!(only_sync_changes(&started, &started), "nothing new");
        // The init container the sync started ran to its end before the read after it:
        // the next one is started by a sync of its own.
        let ended = PodRuntimeStatus {
            containers: vec![container("c1", "init", "s1", 0, RunState::Exited)],
            ..started.clone()
        };
        assert!(!only_sync_changes(&empty, &ended));
        assert!(!only_sync_changes(&started, &ended), "a running one exited");
        let created = PodRuntimeStatus {
            containers: vec![container("c1", "init", "s1", 0, RunState::Created)],
            ..started.clone()
        };
        assert!(!only_sync_changes(&empty, &created), "created, not started");
        let not_ready = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, false)],
            ..PodRuntimeStatus::default()
        };
        assert!(!only_sync_changes(&empty, &not_ready));
        assert!(!only_sync_changes(&started, &not_ready), "the sandbox went");
        // Gone from the runtime (removed by the sync): nothing to act on.
        assert!(only_sync_changes(&started, &empty));
    }

    struct FakeRuntime {
        sandboxes: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    }

    impl Cri for FakeRuntime {
        async fn list_pod_sandbox(
            &self,
            _: api::ListPodSandboxRequest,
        ) -> crate::cri::Result<api::ListPodSandboxResponse> {
            Ok(api::ListPodSandboxResponse {
                items: self.sandboxes.clone(),
            })
        }
        async fn list_containers(
            &self,
            _: api::ListContainersRequest,
        ) -> crate::cri::Result<api::ListContainersResponse> {
            Ok(api::ListContainersResponse {
                containers: self.containers.clone(),
            })
        }
    }

    fn pod(uid: &str) -> PodId {
        PodId {
            uid: uid.into(),
            namespace: "default".into(),
            name: format!("p-{uid}"),
        }
    }

    fn runtime(container_state: api::ContainerState) -> FakeRuntime {
        FakeRuntime {
            sandboxes: vec![api::PodSandbox {
                id: "s1".into(),
                labels: labels::pod_labels(&pod("u1")),
                state: api::PodSandboxState::SandboxReady.into(),
                ..Default::default()
            }],
            containers: vec![
                api::Container {
                    id: "c1".into(),
                    labels: labels::pod_labels(&pod("u1")),
                    state: container_state.into(),
                    ..Default::default()
                },
                api::Container {
                    id: "foreign".into(),
                    state: api::ContainerState::ContainerRunning.into(),
                    ..Default::default()
                },
            ],
        }
    }

    #[tokio::test]
    async fn an_exit_changes_the_pods_fingerprint() {
        let running = relist(&runtime(api::ContainerState::ContainerRunning))
            .await
            .unwrap();
        let exited = relist(&runtime(api::ContainerState::ContainerExited))
            .await
            .unwrap();
        assert_eq!(
            running.pods.len(),
            1,
            "objects without the kubelet's labels are not ours"
        );
        assert_eq!(changed(&Relist::default(), &running), ["u1"]);
        assert!(changed(&running, &running).is_empty());
        assert_eq!(changed(&running, &exited), ["u1"]);
        assert_eq!(changed(&exited, &Relist::default()), ["u1"]);
    }

    #[tokio::test]
    async fn a_pods_state_as_a_sync_reads_it_has_the_relists_fingerprint() {
        use crate::kuberuntime::runtime_status::testing::{container, sandbox};
        let relisted = relist(&runtime(api::ContainerState::ContainerRunning))
            .await
            .unwrap();
        let read = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container("c1", "c", "s1", 0, RunState::Running)],
        };
        assert_eq!(fingerprint_of(&read), relisted.pods["u1"].1);
        let exited = PodRuntimeStatus {
            containers: vec![container("c1", "c", "s1", 0, RunState::Exited)],
            ..read.clone()
        };
        assert_ne!(fingerprint_of(&exited), relisted.pods["u1"].1);
        let stopped = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, false)],
            ..read
        };
        assert_ne!(fingerprint_of(&stopped), relisted.pods["u1"].1);
    }

    #[tokio::test]
    async fn health_follows_the_last_relist() {
        let pleg = Arc::new(Pleg::default());
        assert!(pleg.healthy().is_err());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(pleg.clone().run(
            Arc::new(runtime(api::ContainerState::ContainerRunning)),
            move |uid| {
                tx.send(uid.to_owned()).unwrap();
            },
        ));
        assert_eq!(rx.recv().await.unwrap(), "u1");
        assert!(pleg.healthy().is_ok());
        assert_eq!(pleg.pods().keys().collect::<Vec<_>>(), ["u1"]);
        assert_eq!(pleg.fingerprint("u1").map(|fp| fp.len()), Some(2));
        assert_eq!(pleg.fingerprint("u2"), None);
        task.abort();
    }
}
