//! The status manager: the only writer of `pods/status`. Pod workers hand it the status
//! they computed and go on; one task sends each changed status to the API, coalescing
//! bursts (only the newest status of a pod is sent), and retries failures. It also makes
//! the final `DELETE` of a terminated pod, with grace period 0 and a UID precondition, as
//! the kubelet's status manager does. The status of a static pod is written to its mirror
//! pod (its UID translated to the mirror pod's), once there is one; a static pod is never
//! deleted from the API by it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, Patch, PatchParams};
use tracing::Instrument;

use crate::kubetypes::pod_condition_by_kubelet;
use crate::pod::PodId;
use crate::pod::state::ForgetPod;

/// How many status patches are in flight at once.
const PARALLEL_PATCHES: usize = 16;
/// Failed patches are retried after a back-off from this, doubling up to
/// [`RETRY_MAX`] (the kubelet's status manager re-sends every 10 s).
const RETRY_INITIAL: Duration = Duration::from_secs(1);
/// The longest wait before failed patches are retried.
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Errors of one API write.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The patch of `pods/status` failed.
    #[error("patching the status of pod {pod}: {source}")]
    Patch {
        /// The pod.
        pod: PodId,
        /// The API error.
        source: kube::Error,
    },
    /// The final delete failed.
    #[error("deleting pod {pod}: {source}")]
    Delete {
        /// The pod.
        pod: PodId,
        /// The API error.
        source: kube::Error,
    },
}

#[derive(Debug)]
struct Entry {
    id: PodId,
    status: PodStatus,
    sent: Option<PodStatus>,
    /// The back-off of this pod's failed patches; none while they succeed.
    retry: Option<crate::backoff::Backoff>,
}

#[derive(Debug, Default)]
struct State {
    pods: HashMap<String, Entry>,
    dirty: HashSet<String>,
    /// The static pods, by UID.
    statics: HashMap<String, Static>,
}

/// A static pod: its namespace and name, and the UID of its mirror pod once it is seen.
#[derive(Debug)]
struct Static {
    id: PodId,
    mirror: Option<String>,
}

/// The status manager. Cheap to clone.
#[derive(Clone)]
pub struct StatusManager {
    client: kube::Client,
    state: Arc<Mutex<State>>,
    notify: Arc<tokio::sync::Notify>,
    /// The back-off of retries: initial and longest wait.
    retry: (Duration, Duration),
}

impl std::fmt::Debug for StatusManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusManager")
            .field("pods", &self.lock().pods.len())
            .finish_non_exhaustive()
    }
}

fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
}

impl StatusManager {
    /// A manager writing through `client`.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            state: Arc::default(),
            notify: Arc::default(),
            retry: (RETRY_INITIAL, RETRY_MAX),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::lock::lock(&self.state)
    }

    /// Records the newest status of a pod; it is sent soon if it differs from the last
    /// one sent. Never blocks on the API.
    pub fn set_pod_status(&self, id: &PodId, status: PodStatus) {
        let mut state = self.lock();
        let entry = state.pods.entry(id.uid.clone()).or_insert_with(|| Entry {
            id: id.clone(),
            status: PodStatus::default(),
            sent: None,
            retry: None,
        });
        // Only what the kubelet owns counts: others' conditions are never sent.
        if entry.sent.as_ref().map(by_kubelet) == Some(by_kubelet(&status)) {
            entry.status = status;
            return;
        }
        entry.status = status;
        state.dirty.insert(id.uid.clone());
        drop(state);
        self.notify.notify_one();
    }

    /// The kubelet's `needsReconcile`: when the API's copy of a pod says neither what we
    /// last sent nor what we are about to send (the node lifecycle controller marks the
    /// pods of a node it lost contact with not Ready, and nobody else puts them back), the
    /// pod's status is sent again. The API's echo of a patch still in flight says the
    /// status being sent, so it triggers nothing; resource versions are opaque and are not
    /// compared.
    pub fn reconcile(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        let mut state = self.lock();
        let Some(entry) = state.pods.get_mut(uid) else {
            return;
        };
        let Some(sent) = &entry.sent else {
            return;
        };
        let api = pod.status.clone().unwrap_or_default();
        if !differs(sent, &api) || !differs(&entry.status, &api) {
            return;
        }
        tracing::info!(pod = %entry.id, "the API's pod status differs from the one sent; sending it again");
        entry.sent = None;
        state.dirty.insert(uid.to_owned());
        drop(state);
        self.notify.notify_one();
    }

    /// Marks a pod as static: its status goes to its mirror pod.
    pub fn track_static(&self, id: &PodId) {
        self.lock()
            .statics
            .entry(id.uid.clone())
            .or_insert_with(|| Static {
                id: id.clone(),
                mirror: None,
            });
    }

    /// A mirror pod was seen in the API (`present`) or deleted. The status of its static
    /// pod goes to it: at once when it is new (a mirror pod is created, or created again,
    /// without a status) or says another status than ours, as [`Self::reconcile`] does.
    /// A mirror pod is its static pod's by namespace and name, as in the kubelet's pod
    /// manager, and by the hash it carries: an API pod elsewhere that writes a static pod's
    /// hash into its own `kubernetes.io/config.mirror` does not take the status.
    pub fn mirror(&self, mirror: &Pod, present: bool) {
        let (Some(static_uid), Some(mirror_id)) =
            (crate::kubetypes::mirrored_uid(mirror), PodId::of(mirror))
        else {
            return;
        };
        let mirror_uid = mirror_id.uid.as_str();
        let mut state = self.lock();
        let State {
            pods,
            dirty,
            statics,
        } = &mut *state;
        let Some(Static { id, mirror: target }) = statics.get_mut(static_uid) else {
            return;
        };
        if (&id.namespace, &id.name) != (&mirror_id.namespace, &mirror_id.name) {
            tracing::debug!(pod = %mirror_id, "a pod names a static pod of another name as the one it mirrors");
            return;
        }
        if !present || mirror.metadata.deletion_timestamp.is_some() {
            if target.as_deref() == Some(mirror_uid) {
                *target = None;
            }
            return;
        }
        let new = target.as_deref() != Some(mirror_uid);
        *target = Some(mirror_uid.to_owned());
        let Some(entry) = pods.get_mut(static_uid) else {
            return;
        };
        let api = mirror.status.clone().unwrap_or_default();
        let stale = entry.sent.as_ref().is_none_or(|sent| differs(sent, &api));
        if new || (stale && differs(&entry.status, &api)) {
            entry.sent = None;
            dirty.insert(static_uid.to_owned());
            drop(state);
            self.notify.notify_one();
        }
    }

    /// Where a pod's status goes: the pod itself, the mirror pod of a static pod, or
    /// nowhere yet (a static pod without a mirror pod).
    fn target(&self, id: &PodId) -> Option<PodId> {
        match self.lock().statics.get(&id.uid) {
            None => Some(id.clone()),
            Some(Static { mirror, .. }) => mirror.as_ref().map(|uid| PodId {
                uid: uid.clone(),
                ..id.clone()
            }),
        }
    }

    /// The newest status recorded for a pod.
    #[must_use]
    pub fn get(&self, uid: &str) -> Option<PodStatus> {
        self.lock().pods.get(uid).map(|e| e.status.clone())
    }

    /// Patches the pod's status (a static pod's, its mirror pod's); `false` when there is
    /// nowhere to send it yet.
    async fn patch(&self, id: &PodId, status: &PodStatus) -> Result<bool, StatusError> {
        let Some(target) = self.target(id) else {
            tracing::debug!(pod = %id, "static pod has no mirror pod yet; its status waits");
            return Ok(false);
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &id.namespace);
        let body = patch_body(&target, status);
        // The timeline's end: the first acknowledged patch that says Ready.
        let span = tracing::info_span!(
            crate::timeline::STATUS_PATCH_SPAN,
            pod_uid = %id.uid,
            phase = status.phase.as_deref().unwrap_or_default(),
            ready = is_ready(status),
            outcome = tracing::field::Empty
        );
        let patched = api
            .patch_status(&id.name, &PatchParams::default(), &Patch::Strategic(body))
            .instrument(span.clone())
            .await;
        span.record("outcome", if patched.is_ok() { "ok" } else { "error" });
        patched.map(|_| true).map_err(|source| StatusError::Patch {
            pod: id.clone(),
            source,
        })
    }

    /// Sends the status of a pod now, waiting for the API (for the final status of a pod
    /// before it is deleted).
    ///
    /// # Errors
    /// The API refused or could not be reached; a pod already gone is not an error.
    pub async fn flush(&self, id: &PodId) -> Result<(), StatusError> {
        let status = {
            let mut state = self.lock();
            state.dirty.remove(&id.uid);
            state.pods.get(&id.uid).map(|e| e.status.clone())
        };
        let Some(status) = status else { return Ok(()) };
        match self.patch(id, &status).await {
            Err(StatusError::Patch { source, .. }) if !is_gone(&source) => {
                Err(StatusError::Patch {
                    pod: id.clone(),
                    source,
                })
            }
            _ => Ok(()),
        }
    }

    /// The final delete of a pod whose containers are all gone: grace period 0 and the
    /// pod's UID as precondition, so a new pod of the same name is never deleted.
    ///
    /// # Errors
    /// The API refused or could not be reached; a pod already gone is not an error.
    pub async fn delete_pod(&self, id: &PodId) -> Result<(), StatusError> {
        if self.lock().statics.contains_key(&id.uid) {
            // A static pod goes with its file; its mirror pod is deleted as an orphan.
            return Ok(());
        }
        let deleted = crate::pod::delete_now(&self.client, id)
            .await
            .map_err(|source| StatusError::Delete {
                pod: id.clone(),
                source,
            })?;
        if deleted {
            tracing::info!(pod = %id, "pod deleted from the API");
        }
        Ok(())
    }

    /// Sends dirty statuses until the process ends. A pod whose patch failed is retried
    /// with its own back-off; the others' statuses go out at once meanwhile.
    pub async fn run(self) {
        loop {
            let next_retry = self
                .lock()
                .pods
                .values()
                .filter_map(|e| e.retry.as_ref().and_then(crate::backoff::Backoff::until))
                .min();
            match next_retry {
                Some(at) => {
                    tokio::select! {
                        () = self.notify.notified() => {}
                        () = tokio::time::sleep_until(at.into()) => {}
                    }
                }
                None => self.notify.notified().await,
            }
            let now = std::time::Instant::now();
            let batch: Vec<(PodId, PodStatus)> = {
                let mut state = self.lock();
                let State { pods, dirty, .. } = &mut *state;
                let due: Vec<String> = dirty
                    .iter()
                    .filter(|uid| {
                        pods.get(*uid)
                            .is_none_or(|e| !e.retry.as_ref().is_some_and(|r| r.waiting(now)))
                    })
                    .cloned()
                    .collect();
                due.into_iter()
                    .filter_map(|uid| {
                        dirty.remove(&uid);
                        pods.get(&uid).map(|e| (e.id.clone(), e.status.clone()))
                    })
                    .collect()
            };
            let this = &self;
            let results: Vec<_> = futures::stream::iter(batch)
                .map(|(id, status)| async move {
                    let outcome = this.patch(&id, &status).await;
                    (id, status, outcome)
                })
                .buffer_unordered(PARALLEL_PATCHES)
                .collect()
                .await;
            for (id, status, outcome) in results {
                let mut state = self.lock();
                match outcome {
                    Ok(false) => {}
                    Ok(true) => {
                        if let Some(e) = state.pods.get_mut(&id.uid) {
                            e.sent = Some(status);
                            e.retry = None;
                        }
                    }
                    Err(StatusError::Patch { source, .. }) if is_gone(&source) => {
                        tracing::debug!(pod = %id, "pod gone before its status was sent");
                    }
                    Err(e) => {
                        let (initial, max) = self.retry;
                        let wait = state.pods.get_mut(&id.uid).map(|entry| {
                            entry
                                .retry
                                .get_or_insert_with(|| crate::backoff::Backoff::new(initial, max))
                                .failed(now)
                        });
                        tracing::warn!(error = %e, retry_in = ?wait, "status update failed; will retry");
                        state.dirty.insert(id.uid.clone());
                    }
                }
            }
        }
    }
}

/// The statuses of a pod, dirty or sent, and its mirror pod when static (the kubelet's
/// `RemoveOrphanedStatuses`). Until then a pod deleted from the API keeps its status:
/// a retried termination finds it.
impl ForgetPod for StatusManager {
    fn name(&self) -> &'static str {
        "status manager"
    }

    fn holds(&self, uid: &str) -> bool {
        let state = self.lock();
        state.pods.contains_key(uid) || state.dirty.contains(uid) || state.statics.contains_key(uid)
    }

    fn forget(&self, uid: &str) {
        let mut state = self.lock();
        state.pods.remove(uid);
        state.dirty.remove(uid);
        state.statics.remove(uid);
    }
}

/// The kubelet's `mergePodStatus`: the conditions others own (readiness gates') as the
/// API's status of the pod has them, with the rest of the status ours.
#[must_use]
pub fn merge_pod_status(api: Option<&PodStatus>, mut ours: PodStatus) -> PodStatus {
    let others = api
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| !pod_condition_by_kubelet(&c.type_));
    let own = ours
        .conditions
        .iter()
        .flatten()
        .filter(|c| pod_condition_by_kubelet(&c.type_));
    ours.conditions = Some(others.chain(own).cloned().collect());
    ours
}

/// The part of a status the kubelet owns: without the conditions others own, which are
/// never sent (a strategic merge patch leaves them as they are in the API).
fn by_kubelet(status: &PodStatus) -> PodStatus {
    let mut own = status.clone();
    if let Some(conditions) = own.conditions.as_mut() {
        conditions.retain(|c| pod_condition_by_kubelet(&c.type_));
    }
    own
}

/// Whether the API's status of a pod says something else than the one we sent: another
/// phase, or one of the kubelet's conditions with another status (or missing). Conditions
/// others own and fields the API fills in do not count.
fn differs(sent: &PodStatus, api: &PodStatus) -> bool {
    let theirs = api.conditions.as_deref().unwrap_or_default();
    sent.phase != api.phase
        || by_kubelet(sent).conditions.iter().flatten().any(|ours| {
            !theirs
                .iter()
                .any(|c| c.type_ == ours.type_ && c.status == ours.status)
        })
}

/// Whether a status says the pod is Ready.
fn is_ready(status: &PodStatus) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The strategic merge patch of a pod's status, with only the conditions the kubelet owns
/// (conditions merge by type: the others stay as their owners set them). The uid is a
/// precondition: a pod re-created under the same name is never given the old pod's
/// status. `podIPs` merges by IP, so a new sandbox's IP would be added to the old one
/// (which the API refuses): the list is replaced instead.
fn patch_body(id: &PodId, status: &PodStatus) -> serde_json::Value {
    let status = by_kubelet(status);
    let mut body = serde_json::json!({ "metadata": { "uid": id.uid }, "status": status });
    if let Some(serde_json::Value::Array(ips)) = body["status"].get_mut("podIPs") {
        ips.insert(0, serde_json::json!({ "$patch": "replace" }));
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodIP;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An API server answering every request with `fail_first` errors (500), then with
    /// the patched pod (always an error for the pod named `bad`); returns its address and
    /// request count.
    async fn api_server(fail_first: usize) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let seen = seen.clone();
                let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let n = seen.fetch_add(1, Ordering::SeqCst);
                    let bad = req.uri().path().contains("/pods/bad/");
                    let (code, body) = if n < fail_first || bad {
                        (
                            500,
                            serde_json::json!({"kind": "Status", "apiVersion": "v1",
                            "status": "Failure", "message": "etcd is down", "code": 500}),
                        )
                    } else {
                        (
                            200,
                            serde_json::json!({"kind": "Pod", "apiVersion": "v1",
                            "metadata": {"name": "p", "namespace": "default", "uid": "u"}}),
                        )
                    };
                    async move {
                        hyper::Response::builder()
                            .status(code)
                            .header("content-type", "application/json")
                            .body(http_body_util::Full::new(hyper::body::Bytes::from(
                                body.to_string(),
                            )))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), service),
                );
            }
        });
        (addr, requests)
    }

    /// A running manager (retry back-off from 20 ms to 400 ms) with one status to send to
    /// an API server failing `fail_first` requests; returns it and the request count.
    async fn sending_one_status(fail_first: usize) -> (StatusManager, Arc<AtomicUsize>) {
        let (addr, requests) = api_server(fail_first).await;
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let mut manager = StatusManager::new(kube::Client::try_from(config).unwrap());
        manager.retry = (Duration::from_millis(20), Duration::from_millis(400));
        tokio::spawn(manager.clone().run());
        let id = PodId {
            namespace: "default".into(),
            name: "p".into(),
            uid: "u".into(),
        };
        manager.set_pod_status(&id, PodStatus::default());
        (manager, requests)
    }

    /// While the API fails, a status is retried with a growing wait, not at a fixed rate;
    /// once the API answers, it is sent.
    #[tokio::test]
    async fn failed_patches_are_retried_with_back_off() {
        let (manager, requests) = sending_one_status(1000).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        // 20, 40, 80, 160, 320, 400 ms waits: 6 or 7 attempts in 1.2 s (60 at the first
        // wait's fixed rate).
        let attempts = requests.load(Ordering::SeqCst);
        assert!((4..=8).contains(&attempts), "{attempts} attempts");
        assert!(manager.lock().pods["u"].sent.is_none(), "never sent");
    }

    /// One pod whose patches keep failing does not hold back the others' statuses.
    #[tokio::test]
    async fn a_failing_pod_does_not_delay_the_others() {
        let (manager, _) = sending_one_status(0).await;
        let bad = PodId {
            namespace: "default".into(),
            name: "bad".into(),
            uid: "b".into(),
        };
        manager.set_pod_status(&bad, PodStatus::default());
        // Let the bad pod fail a few times: its back-off now exceeds 100 ms.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let good = PodId {
            namespace: "default".into(),
            name: "good".into(),
            uid: "g".into(),
        };
        manager.set_pod_status(&good, PodStatus::default());
        tokio::time::sleep(Duration::from_millis(60)).await;
        let state = manager.lock();
        assert!(
            state.pods["g"].sent.is_some(),
            "the good pod's status went out at once"
        );
        assert!(state.pods["b"].sent.is_none());
        assert!(state.pods["b"].retry.is_some());
    }

    #[tokio::test]
    async fn a_failed_patch_is_sent_once_the_api_answers() {
        let (manager, requests) = sending_one_status(2).await;
        for _ in 0..100 {
            if manager.lock().pods["u"].sent.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            manager.lock().pods["u"].sent.is_some(),
            "sent after the failures"
        );
        assert_eq!(requests.load(Ordering::SeqCst), 3);
    }

    fn ready_status(ready: &str) -> PodStatus {
        PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn api_pod(version: &str, status: PodStatus) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u".into());
        pod.metadata.resource_version = Some(version.into());
        pod.status = Some(status);
        pod
    }

    /// A pod the node lifecycle controller marked not Ready (after the API server or the
    /// node was away) gets our status again; an older copy of the pod, or one that says
    /// what we sent, does not cause a patch.
    #[tokio::test]
    async fn a_status_someone_else_changed_is_sent_again() {
        let (manager, requests) = sending_one_status(0).await;
        let sent = ready_status("True");
        manager.set_pod_status(
            &PodId {
                namespace: "default".into(),
                name: "p".into(),
                uid: "u".into(),
            },
            sent.clone(),
        );
        for _ in 0..100 {
            if manager.lock().pods["u"].sent.as_ref() == Some(&sent) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let before = requests.load(Ordering::SeqCst);
        // The echo of a patch in flight (saying what is being sent), or the same with
        // others' fields: nothing to do.
        manager.lock().pods.get_mut("u").unwrap().status = ready_status("False");
        manager.reconcile(&api_pod("90", ready_status("False")));
        manager.lock().pods.get_mut("u").unwrap().status = sent.clone();
        let mut same = sent.clone();
        same.qos_class = Some("BestEffort".into());
        same.conditions
            .as_mut()
            .unwrap()
            .push(k8s_openapi::api::core::v1::PodCondition {
                type_: "PodScheduled".into(),
                status: "True".into(),
                ..Default::default()
            });
        manager.reconcile(&api_pod("110", same));
        assert!(manager.lock().dirty.is_empty());
        // Not Ready, which we neither sent nor are sending: sent again.
        manager.reconcile(&api_pod("120", ready_status("False")));
        for _ in 0..100 {
            if requests.load(Ordering::SeqCst) > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(requests.load(Ordering::SeqCst), before + 1);
        assert!(differs(&sent, &ready_status("False")));
        assert!(differs(&sent, &PodStatus::default()));
        assert!(!differs(&sent, &sent));
    }

    /// A static pod's status goes to its mirror pod once one is seen (at once, also when
    /// it is created again), nowhere before; the static pod is never deleted from the API.
    #[tokio::test]
    async fn a_static_pods_status_goes_to_its_mirror_pod() {
        let (manager, requests) = sending_one_status(0).await;
        let id = PodId {
            namespace: "default".into(),
            name: "web-n1".into(),
            uid: "static".into(),
        };
        manager.track_static(&id);
        manager.set_pod_status(&id, ready_status("True"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(manager.target(&id), None);
        assert!(
            manager.lock().pods["static"].sent.is_none(),
            "nowhere to send"
        );
        let before = requests.load(Ordering::SeqCst);
        let mut mirror = api_pod("1", PodStatus::default());
        mirror.metadata.uid = Some("m1".into());
        mirror.metadata.annotations = Some(
            [(
                crate::kubetypes::CONFIG_MIRROR.to_owned(),
                "static".to_owned(),
            )]
            .into(),
        );
        // A pod of another name that claims to mirror the static pod is not its mirror.
        mirror.metadata.name = Some("claims".into());
        manager.mirror(&mirror, true);
        assert_eq!(manager.target(&id), None);
        mirror.metadata.name = Some("web-n1".into());
        mirror.metadata.namespace = Some("other".into());
        manager.mirror(&mirror, true);
        assert_eq!(manager.target(&id), None);
        mirror.metadata.namespace = Some("default".into());
        manager.mirror(&mirror, true);
        let target = manager.target(&id).expect("the mirror pod");
        assert_eq!(
            (target.uid.as_str(), target.name.as_str()),
            ("m1", "web-n1")
        );
        for _ in 0..100 {
            if manager.lock().pods["static"].sent.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(requests.load(Ordering::SeqCst), before + 1, "sent to it");
        // Deleted, then created again: sent again to the new one.
        manager.mirror(&mirror, false);
        assert_eq!(manager.target(&id), None);
        mirror.metadata.uid = Some("m2".into());
        manager.mirror(&mirror, true);
        assert_eq!(manager.target(&id).map(|t| t.uid), Some("m2".into()));
        assert!(manager.lock().dirty.contains("static"));
        // The final delete leaves the API alone.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let sent = requests.load(Ordering::SeqCst);
        manager.delete_pod(&id).await.unwrap();
        assert_eq!(requests.load(Ordering::SeqCst), sent);
        // Its status is forgotten with the rest of the pod's state, when its worker ends.
        assert!(manager.holds("static"));
        manager.forget("static");
        assert!(!manager.holds("static"));
        assert!(manager.get("static").is_none());
    }

    fn conditions(list: &[(&str, &str)]) -> Option<Vec<k8s_openapi::api::core::v1::PodCondition>> {
        Some(crate::pod::testing::conditions(list))
    }

    fn types_and_statuses(status: &serde_json::Value) -> Vec<(String, String)> {
        status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (c["type"].to_string(), c["status"].to_string()))
            .collect()
    }

    /// Conditions others own (a readiness gate's) come from the API's status, never from
    /// ours, and are never sent: a strategic merge patch leaves them as their owner set
    /// them; a change in them alone sends nothing.
    #[tokio::test]
    async fn conditions_others_own_are_taken_from_the_api_and_never_sent() {
        let api = PodStatus {
            conditions: conditions(&[("Ready", "False"), ("example.com/lb", "True")]),
            ..Default::default()
        };
        let ours = PodStatus {
            conditions: conditions(&[("Ready", "True"), ("example.com/lb", "False")]),
            ..Default::default()
        };
        let merged = merge_pod_status(Some(&api), ours);
        assert_eq!(
            merged.conditions,
            conditions(&[("example.com/lb", "True"), ("Ready", "True")])
        );
        let id = PodId {
            namespace: "default".into(),
            name: "p".into(),
            uid: "u".into(),
        };
        let body = patch_body(&id, &merged);
        assert_eq!(
            types_and_statuses(&body["status"]),
            [("\"Ready\"".to_owned(), "\"True\"".to_owned())]
        );
        assert!(!differs(
            &merged,
            &PodStatus {
                conditions: conditions(&[("Ready", "True")]),
                ..Default::default()
            }
        ));
        let (manager, requests) = sending_one_status(0).await;
        manager.set_pod_status(&id, merged.clone());
        for _ in 0..100 {
            if manager.lock().pods["u"].sent.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let before = requests.load(Ordering::SeqCst);
        let mut gate_closed = merged;
        gate_closed.conditions = conditions(&[("example.com/lb", "False"), ("Ready", "True")]);
        manager.set_pod_status(&id, gate_closed);
        assert!(manager.lock().dirty.is_empty(), "nothing of ours changed");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(requests.load(Ordering::SeqCst), before);
    }

    #[test]
    fn pod_ips_are_replaced_not_merged() {
        let id = PodId {
            namespace: "default".into(),
            name: "p".into(),
            uid: "u".into(),
        };
        let status = PodStatus {
            pod_ips: Some(vec![PodIP {
                ip: "10.0.0.2".into(),
            }]),
            ..Default::default()
        };
        let body = patch_body(&id, &status);
        assert_eq!(body["metadata"]["uid"], "u");
        assert_eq!(
            body["status"]["podIPs"],
            serde_json::json!([{ "$patch": "replace" }, { "ip": "10.0.0.2" }])
        );
        let none = patch_body(&id, &PodStatus::default());
        assert!(none["status"].get("podIPs").is_none());
    }
}
