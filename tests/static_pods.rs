//! Static pods end to end, against the local cluster: a manifest in `--pod-manifest-path`
//! runs as a pod and gets a mirror pod in the API (the kubelet's annotations, the Node as
//! its controller, created through the NodeRestriction admission with the node's own
//! identity) that shows the pod's status; a mirror pod deleted through the API comes back
//! without the container being restarted; an edited manifest replaces the pod (new UID,
//! new container); the agent restarted adopts the pod; a removed manifest removes the pod,
//! its sandbox and its mirror pod. The pods' sandboxes are recorded and checked for leaks
//! when the test ends. An API pod that writes a static pod's annotations on itself is
//! still an API pod.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::case::{Case, failed, get, phase, reason_and_message, running};
use common::pods::{exec_in, pods_api, running_containers_of, sandboxes_of, sleeper};
use common::{eventually, kube_client, kubectl, meminfo, node_name};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::DeleteParams;

const MIRROR: &str = "kubernetes.io/config.mirror";
const HASH: &str = "kubernetes.io/config.hash";

/// The test's manifest directory, removed when dropped (before its pods are cleaned up).
struct Manifests(PathBuf);

impl Manifests {
    /// Writes the manifest of the pod `name` (label `rk-test=<label>`) sleeping `seconds`,
    /// as an editor should: a dot file renamed into place.
    fn write(&self, name: &str, label: &str, seconds: u32) {
        let yaml = format!(
            "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels:
    rk-test: {label}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    command: [sleep, '{seconds}']
    readinessProbe:
      exec: {{command: ['true']}}
      periodSeconds: 1
"
        );
        let tmp = self.0.join(format!(".{name}.yaml"));
        std::fs::write(&tmp, yaml).expect("write manifest");
        std::fs::rename(&tmp, self.path(name)).expect("rename manifest");
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(format!("{name}.yaml"))
    }
}

impl Drop for Manifests {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The mirror pod `name`, once it shows the static pod Running and Ready and `accept`s it.
async fn mirror_running(name: &str, accept: impl Fn(&Pod) -> bool) -> Pod {
    eventually(
        &format!("mirror pod {name} Running and Ready"),
        Duration::from_secs(90),
        || async {
            get(name).await.filter(|p| {
                annotation(p, MIRROR).is_some()
                    && p.metadata.deletion_timestamp.is_none()
                    && phase(p) == Some("Running")
                    && is_ready(p)
                    && accept(p)
            })
        },
    )
    .await
}

/// The id of the one running container of the pod with this UID, in the runtime.
async fn running_container(uid: &str) -> String {
    eventually(
        &format!("a running container of pod {uid}"),
        Duration::from_secs(30),
        || async {
            let running = running_containers_of(uid).await;
            (running.len() == 1).then(|| running[0].id.clone())
        },
    )
    .await
}

/// The container id the mirror pod's status shows.
fn mirrored_container_id(mirror: &Pod) -> Option<String> {
    let statuses = mirror.status.as_ref()?.container_statuses.as_ref()?;
    let id = statuses.first()?.container_id.as_deref()?;
    Some(id.trim_start_matches("containerd://").to_owned())
}

/// Waits until nothing of the pod with this UID is left in the runtime.
async fn gone_from_runtime(uid: &str) {
    eventually(
        &format!("pod {uid} gone from the runtime"),
        Duration::from_secs(30),
        || async { sandboxes_of(uid).await.is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_static_pod_runs_with_a_mirror_pod_that_follows_its_manifest() {
    let mut case = Case::new("static").await;
    let label = case.pods.label.clone();
    let manifests = Manifests(common::state_dir().join("manifests").join(&label));
    std::fs::create_dir_all(&manifests.0).expect("manifest dir");
    let dir = manifests.0.to_string_lossy().into_owned();
    case.start_agent(&["--pod-manifest-path", &dir, "--file-check-frequency", "5s"]);
    let node = node_name();
    let name = format!("{label}-{node}");

    // The manifest runs as a pod, and its mirror pod shows it Running and Ready.
    manifests.write(&label, &label, 3600);
    let mirror = mirror_running(&name, |_| true).await;
    let uid = annotation(&mirror, HASH).expect("config.hash").to_owned();
    assert_eq!(annotation(&mirror, MIRROR), Some(uid.as_str()));
    assert_eq!(
        annotation(&mirror, "kubernetes.io/config.source"),
        Some("file")
    );
    assert!(annotation(&mirror, "kubernetes.io/config.seen").is_some());
    assert_ne!(mirror.metadata.uid.as_deref(), Some(uid.as_str()));
    let spec = mirror.spec.as_ref().expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some(node.as_str()));
    assert!(
        spec.tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.effect.as_deref() == Some("NoExecute")
                && t.key.is_none())
    );
    let nodes: Api<Node> = Api::all(kube_client("admin.kubeconfig").await);
    let node_uid = nodes.get(&node).await.expect("node").metadata.uid;
    let owner = &mirror.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("Node", node.as_str(), Some(true))
    );
    assert_eq!(Some(owner.uid.clone()), node_uid);
    let container = running_container(&uid).await;
    assert_eq!(
        mirrored_container_id(&mirror).as_deref(),
        Some(container.as_str())
    );
    // `kubectl exec` on the mirror pod reaches the static pod's container (the agent's
    // server finds the static pod by the mirror pod's name).
    let out = kubectl(&["exec", &name, "--", "cat", "/proc/1/cmdline"]).await;
    assert_eq!(out, "sleep\u{0}3600\u{0}");

    // A mirror pod deleted through the API comes back; the container runs on.
    pods_api()
        .await
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the mirror pod");
    let old_mirror = mirror.metadata.uid.clone();
    let again = mirror_running(&name, |p| p.metadata.uid != old_mirror).await;
    assert_eq!(annotation(&again, MIRROR), Some(uid.as_str()));
    assert_eq!(running_container(&uid).await, container, "not restarted");
    let restarts = again
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    assert_eq!(restarts.map(|c| c[0].restart_count), Some(0));

    // After a restart of the agent, the same manifest is the same pod: adopted, not
    // restarted. The new agent shows it knows the pod by creating its mirror pod again.
    case.start_agent(&["--pod-manifest-path", &dir, "--file-check-frequency", "5s"]);
    pods_api()
        .await
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the mirror pod");
    let adopted = mirror_running(&name, |p| p.metadata.uid != again.metadata.uid).await;
    assert_eq!(annotation(&adopted, MIRROR), Some(uid.as_str()));
    // Housekeeping (every 2 s) has seen the pod by now: it is no orphan.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(running_container(&uid).await, container, "adopted");

    // An edited manifest is another pod: the old one goes, the new one runs.
    manifests.write(&label, &label, 3601);
    let edited = mirror_running(&name, |p| annotation(p, MIRROR) != Some(uid.as_str())).await;
    let new_uid = annotation(&edited, HASH).expect("config.hash").to_owned();
    assert_ne!(new_uid, uid);
    assert_eq!(annotation(&edited, MIRROR), Some(new_uid.as_str()));
    gone_from_runtime(&uid).await;
    let new_container = running_container(&new_uid).await;
    assert_ne!(new_container, container);
    assert_eq!(
        mirrored_container_id(&edited).as_deref(),
        Some(new_container.as_str())
    );
    let out = exec_in(
        &new_uid,
        "main",
        vec!["cat".into(), "/proc/1/cmdline".into()],
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sleep\u{0}3601\u{0}");

    // A removed manifest removes the pod and its mirror pod.
    std::fs::remove_file(manifests.path(&label)).expect("remove manifest");
    eventually(
        "the mirror pod deleted",
        Duration::from_secs(30),
        || async { get(&name).await.is_none().then_some(()) },
    )
    .await;
    gone_from_runtime(&new_uid).await;
    assert!(
        !Path::new(&case.agent().root_dir)
            .join("pods")
            .join(&new_uid)
            .exists(),
        "the pod directory is removed"
    );
    assert!(
        !case.pods.record().sandboxes.is_empty(),
        "the pods' sandboxes were recorded for the leak check"
    );
}

/// A BestEffort API pod that writes on itself what the agent writes on a static pod:
/// `kubernetes.io/config.source: file` and a `kubernetes.io/config.hash`.
fn claiming_to_be_static() -> serde_json::Value {
    let mut pod = sleeper(serde_json::json!({}));
    pod["metadata"]["annotations"] = serde_json::json!({
        "kubernetes.io/config.source": "file",
        "kubernetes.io/config.hash": "0123456789abcdef0123456789abcdef",
    });
    pod
}

/// An API pod cannot pass for a static pod by its annotations (the kubelet stamps every
/// pod with the source that delivered it): its status is written to itself, its
/// containers get the BestEffort OOM score, not the critical one; under memory pressure
/// it is evicted, and another such pod is refused at admission at once (the eviction
/// manager's pass that evicted the first holds MemoryPressure, which admission reads);
/// deleting them finishes.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_api_pod_claiming_a_file_source_is_an_ordinary_api_pod() {
    let mut case = Case::with_agent("claims", &[]).await;
    let name = case.create("run", claiming_to_be_static()).await;
    // Its status goes to the pod itself (a static pod's waits for a mirror pod).
    let pod = running(&name).await;
    let uid = pod.metadata.uid.clone().expect("uid");
    assert_eq!(
        annotation(&pod, "kubernetes.io/config.source"),
        Some("file"),
        "the API keeps what the author wrote"
    );
    // BestEffort's 1000, not a critical pod's -997 (which containerd raises to its own
    // score, below 1000).
    let out = exec_in(
        &uid,
        "main",
        vec!["cat".into(), "/proc/1/oom_score_adj".into()],
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1000");

    // Memory is short from now on (a threshold always met): the pod is evicted as a
    // BestEffort pod, not spared as a critical one.
    let threshold = meminfo("MemTotal") - (128 << 20);
    assert!(
        meminfo("MemAvailable") + (256 << 20) < threshold,
        "the machine has too little memory in use for an always-met threshold"
    );
    let restarted = Instant::now();
    case.start_agent(&["--eviction-hard", &format!("memory.available<{threshold}")]);
    let evicted = failed(&name, Duration::from_secs(60)).await;
    let (reason, message) = reason_and_message(&evicted);
    assert_eq!(reason, Some("Evicted"), "{}", case.agent().log_tail());
    assert!(
        message.is_some_and(|m| m.starts_with("The node was low on resource: memory. ")),
        "evicted, not refused: {message:?}"
    );
    // Another one is not spared either: refused at admission, as BestEffort pods are under
    // MemoryPressure, with nothing of it run.
    let refused = case.create("refused", claiming_to_be_static()).await;
    let rejected = failed(&refused, Duration::from_secs(60)).await;
    assert_eq!(
        reason_and_message(&rejected),
        (
            Some("Evicted"),
            Some("Pod The node had condition: [MemoryPressure]. ")
        ),
        "{}",
        case.agent().log_tail()
    );
    eprintln!(
        "evicted, then a new pod refused at admission, {:?} after the restart",
        restarted.elapsed()
    );
    let refused_uid = rejected.metadata.uid.clone().expect("uid");
    assert!(
        sandboxes_of(&refused_uid).await.is_empty(),
        "refused at admission, yet it has a sandbox"
    );

    // Deleting them finishes: the agent deletes them from the API as any API pod.
    for name in [&name, &refused] {
        pods_api()
            .await
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    for name in [&name, &refused] {
        eventually(
            &format!("{name} deleted"),
            Duration::from_secs(30),
            || async { get(name).await.is_none().then_some(()) },
        )
        .await;
    }
    gone_from_runtime(&uid).await;
}
