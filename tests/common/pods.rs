//! Bare pods bound to the test node (`nodeName`, no scheduler), as the kubelet's own
//! admission sees them: creating them from JSON, reading their events and what the runtime
//! holds of them, and removing them when a test ends, also when it fails, then checking
//! that they left nothing behind (`leaks`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use rkubelet::cri::{Cri, CriClient, api};

use super::leaks::{self, Recorder};
use super::{API_RETRY, cleanup_blocking, cri, eventually, kube_client, retrying};

/// The pod runs and is Ready.
pub fn running_and_ready(p: &Pod) -> bool {
    let status = p.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pods API of the `default` namespace, as the cluster admin.
pub async fn pods_api() -> Api<Pod> {
    Api::namespaced(kube_client("admin.kubeconfig").await, "default")
}

/// The pods of one test, labelled `rk-test=<label>`; deleted when dropped: gracefully
/// (so that the agent stops and deletes them), then by force after 30 s; then the test
/// fails if they left anything behind on the node.
pub struct TestPods {
    /// The label value.
    pub label: String,
    /// The agent's root dir (its pod dirs and CNI cache are looked at for leaks).
    root_dir: PathBuf,
    recorder: Recorder,
}

impl TestPods {
    /// Pods labelled `rk-test=<label>`, run by the agent whose root dir is `root_dir`.
    pub fn new(label: &str, root_dir: PathBuf) -> Self {
        Self {
            label: label.to_owned(),
            recorder: Recorder::start(label, &root_dir),
            root_dir,
        }
    }

    /// Creates a pod from `manifest` (a Pod as JSON) with this test's label, bound to
    /// `node`; returns it as created.
    pub async fn create(&self, node: &str, mut manifest: serde_json::Value) -> Pod {
        manifest["metadata"]["labels"]["rk-test"] = self.label.clone().into();
        manifest["spec"]["nodeName"] = node.into();
        let pod: Pod = serde_json::from_value(manifest).expect("a Pod manifest");
        let created = pods_api()
            .await
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating pod: {e}"));
        if let (Some(uid), Some(name)) = (&created.metadata.uid, &created.metadata.name) {
            self.recorder.pod(uid, name);
        }
        created
    }

    /// Records a pod this test did not create itself (a controller's, labelled
    /// `rk-test=<label>`), so that the leak check looks at what it left.
    pub fn track(&self, pod: &Pod) {
        if let (Some(uid), Some(name)) = (&pod.metadata.uid, &pod.metadata.name) {
            self.recorder.pod(uid, name);
        }
    }

    /// What was recorded of the pods so far (for the leak check).
    pub fn record(&self) -> leaks::Record {
        self.recorder.record.lock().expect("record").clone()
    }

    fn selector(&self) -> ListParams {
        ListParams::default().labels(&format!("rk-test={}", self.label))
    }

    /// The pods of this test that still exist (an API error is retried, then fails).
    pub async fn list(&self) -> Vec<Pod> {
        list_pods(&pods_api().await, &self.selector()).await
    }
}

/// The pods `selector` selects; an API error is retried for [`API_RETRY`], then fails.
async fn list_pods(api: &Api<Pod>, selector: &ListParams) -> Vec<Pod> {
    retrying("listing the test's pods", API_RETRY, || api.list(selector))
        .await
        .items
}

impl Drop for TestPods {
    fn drop(&mut self) {
        let selector = self.selector();
        self.recorder.stop();
        let mut record = self.record();
        let root_dir = self.root_dir.clone();
        // A clean-up or check that cannot run (the API or the runtime unreachable, a
        // command failing) panics on its thread: that fails the test, never "nothing left".
        let left = cleanup_blocking(move || async move {
            let api = pods_api().await;
            for pod in list_pods(&api, &selector).await {
                if let (Some(uid), Some(name)) = (pod.metadata.uid, pod.metadata.name) {
                    record.pods.insert(uid, name);
                }
            }
            let delete = |params: DeleteParams| {
                let (api, selector) = (api.clone(), selector.clone());
                async move {
                    retrying("deleting the test's pods", API_RETRY, || {
                        api.delete_collection(&params, &selector)
                    })
                    .await;
                }
            };
            delete(DeleteParams::default()).await;
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && !list_pods(&api, &selector).await.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            delete(DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            })
            .await;
            // A pod with no grace period leaves the API at once: the agent (still running)
            // tears it down after, its sandboxes removed last (its cgroup before them).
            let rest = deadline.saturating_duration_since(Instant::now());
            leaks::check_once_removed(&cri(), &record, &root_dir, rest).await
        })
        .unwrap_or_else(|| vec!["(the leak check could not run: see its panic above)".into()]);
        if left.is_empty() {
            return;
        }
        let report = format!(
            "the pods of test {} left behind:\n  {}",
            self.label,
            left.join("\n  ")
        );
        if std::thread::panicking() {
            eprintln!("{report}");
        } else {
            panic!("{report}");
        }
    }
}

/// The pods of `default` labelled `app=<app>` (a Deployment's or StatefulSet's).
pub async fn pods_of_app(app: &str) -> Vec<Pod> {
    pods_api()
        .await
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("list pods")
        .items
}

/// Whether the pod's Ready condition is true.
pub fn is_ready(p: &Pod) -> bool {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A busybox pod whose container `main` sleeps and stops at once, with `spec` merged into
/// its spec.
pub fn sleeper(spec: serde_json::Value) -> serde_json::Value {
    let mut pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{ "name": "main", "image": "busybox", "command": ["sleep", "3600"] }]
        }
    });
    for (k, v) in spec.as_object().into_iter().flatten() {
        pod["spec"][k] = v.clone();
    }
    pod
}

/// The events about the pod named `name`, oldest first (an API error is retried, then
/// fails).
pub async fn events_of(name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(kube_client("admin.kubeconfig").await, "default");
    let selector = ListParams::default().fields(&format!("involvedObject.name={name}"));
    retrying(&format!("listing the events of {name}"), API_RETRY, || {
        api.list(&selector)
    })
    .await
    .items
}

/// The first event about the pod named `name` with `reason`, once published; fails the
/// test after `timeout`.
pub async fn event_with_reason(name: &str, reason: &str, timeout: Duration) -> Event {
    eventually(
        &format!("the {reason} event of {name}"),
        timeout,
        || async {
            events_of(name)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
        },
    )
    .await
}

/// The messages of the events about the pod named `name` with `reason`, oldest first.
pub async fn event_messages(name: &str, reason: &str) -> Vec<String> {
    events_of(name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect()
}

/// The sandboxes the runtime holds for the pod with this UID.
pub async fn sandboxes_of(uid: &str) -> Vec<api::PodSandbox> {
    sandboxes_in(&cri(), uid).await
}

/// The sandboxes `cri` holds for the pod with this UID; panics if it cannot tell.
pub async fn sandboxes_in(cri: &CriClient, uid: &str) -> Vec<api::PodSandbox> {
    cri.list_pod_sandbox(api::ListPodSandboxRequest {
        filter: Some(api::PodSandboxFilter {
            label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
            ..Default::default()
        }),
    })
    .await
    .unwrap_or_else(|e| panic!("ListPodSandbox at {}: {e}", cri.endpoint()))
    .items
}

/// The containers of the pod with this UID, in `state` if given.
pub async fn containers_of(uid: &str, state: Option<api::ContainerState>) -> Vec<api::Container> {
    containers_in(&cri(), uid, state).await
}

/// The containers `cri` holds for the pod with this UID, in `state` if given; panics if it
/// cannot tell.
pub async fn containers_in(
    cri: &CriClient,
    uid: &str,
    state: Option<api::ContainerState>,
) -> Vec<api::Container> {
    cri.list_containers(api::ListContainersRequest {
        filter: Some(api::ContainerFilter {
            label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
            state: state.map(|s| api::ContainerStateValue { state: s.into() }),
            ..Default::default()
        }),
    })
    .await
    .unwrap_or_else(|e| panic!("ListContainers at {}: {e}", cri.endpoint()))
    .containers
}

/// The containers of the pod with this UID that are running.
pub async fn running_containers_of(uid: &str) -> Vec<api::Container> {
    containers_of(uid, Some(api::ContainerState::ContainerRunning)).await
}

/// Runs `cmd` in the container `container_id` (CRI ExecSync, 10 s).
pub async fn exec_sync(container_id: String, cmd: Vec<String>) -> api::ExecSyncResponse {
    cri()
        .exec_sync(api::ExecSyncRequest {
            container_id,
            cmd,
            timeout: 10,
        })
        .await
        .expect("ExecSync")
}

/// Runs `cmd` in the running container `container` of the pod with this UID.
pub async fn exec_in(uid: &str, container: &str, cmd: Vec<String>) -> api::ExecSyncResponse {
    let found = running_containers_of(uid)
        .await
        .into_iter()
        .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == container))
        .unwrap_or_else(|| panic!("no running container {container} in pod {uid}"));
    exec_sync(found.id, cmd).await
}
