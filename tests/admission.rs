//! Pod admission and `activeDeadlineSeconds` end to end, against the local cluster: pods
//! bound with `nodeName` (no scheduler, which is what the kubelet's own admission is for)
//! that do not fit the node end Failed with the kubelet's reason and message and get no
//! sandbox; a RuntimeClass deleted after its pod was created fails the sandbox creation
//! as in the kubelet v1.20;
//! a running pod past its active deadline ends Failed/DeadlineExceeded with its
//! containers stopped, also when the deadline is added to it while it runs.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::agent::{AgentProcess, Owner};
use common::pods::{TestPods, events_of, pods_api, running_containers_of, sandboxes_of};
use common::{eventually, kube_client, node_name, unique};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use rkubelet::resources::Quantity;
use serde_json::json;

/// The tests share one node: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The agent's root dir: one per node across test files, as on a real node.
fn root_dir() -> PathBuf {
    common::state_dir().join("test-agents").join(node_name())
}

fn start_agent(extra: &[&str]) -> AgentProcess {
    AgentProcess::start_with_args(Owner::Agent, &node_name(), root_dir(), extra)
}

/// A busybox pod that sleeps, with `spec` merged into its spec.
fn sleeper(name: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name },
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

fn requesting(name: &str, requests: serde_json::Value) -> serde_json::Value {
    let mut pod = sleeper(name, json!({}));
    pod["spec"]["containers"][0]["resources"] = json!({ "requests": requests });
    pod
}

async fn get(name: &str) -> Option<Pod> {
    pods_api().await.get_opt(name).await.ok().flatten()
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.phase.as_deref()
}

async fn running(name: &str) -> Pod {
    eventually(
        &format!("{name} Running"),
        Duration::from_secs(60),
        || async { get(name).await.filter(|p| phase(p) == Some("Running")) },
    )
    .await
}

async fn failed(name: &str, timeout: Duration) -> Pod {
    eventually(&format!("{name} Failed"), timeout, || async {
        get(name).await.filter(|p| phase(p) == Some("Failed"))
    })
    .await
}

/// The pod ends Failed with `reason` and `Pod <message>`, with a Warning event of that
/// reason and message, and nothing of it in the runtime or on disk.
async fn assert_rejected(agent: &AgentProcess, name: &str, reason: &str, message: &str) {
    let pod = failed(name, Duration::from_secs(30)).await;
    let status = pod.status.clone().unwrap_or_default();
    assert_eq!(
        status.reason.as_deref(),
        Some(reason),
        "{}",
        agent.log_tail()
    );
    assert_eq!(status.message, Some(format!("Pod {message}")));
    let event = eventually(
        &format!("{reason} event"),
        Duration::from_secs(20),
        || async {
            events_of(name)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
        },
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.message.as_deref(), Some(message));
    assert_no_trace(agent, &pod).await;
}

/// Nothing was created for the pod: no sandbox, no pod directory.
async fn assert_no_trace(agent: &AgentProcess, pod: &Pod) {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    assert!(sandboxes_of(&uid).await.is_empty(), "a sandbox for {uid}");
    assert!(
        !agent.root_dir.join("pods").join(&uid).exists(),
        "a pod directory for {uid}"
    );
}

/// The node's allocatable `name`, in milli units for cpu, else in units.
async fn allocatable(name: &str) -> i64 {
    let node = Api::<Node>::all(kube_client("admin.kubeconfig").await)
        .get(&node_name())
        .await
        .expect("the node");
    let q = node
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get(name).cloned())
        .expect("allocatable");
    let q = Quantity::parse(&q.0).expect("a quantity");
    let v = if name == "cpu" {
        q.milli_value()
    } else {
        q.value()
    };
    i64::try_from(v).expect("fits")
}

/// Pods bound to the node that have not finished (other tests' leftovers would change
/// what is in use).
async fn active_pods_on_node() -> usize {
    let fields = format!("spec.nodeName={}", node_name());
    pods_api()
        .await
        .list(&ListParams::default().fields(&fields))
        .await
        .expect("pods")
        .items
        .iter()
        .filter(|p| !matches!(phase(p), Some("Succeeded" | "Failed")))
        .count()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn requests_beyond_allocatable_fail_out_of_cpu_and_out_of_memory_for_good() {
    let _turn = ONE_AT_A_TIME.lock().await;
    assert_eq!(active_pods_on_node().await, 0, "other pods on the node");
    let agent = start_agent(&[]);
    let pods = TestPods::new(&unique("adm-res"));
    let node = node_name();
    let cpu = allocatable("cpu").await;
    let memory = allocatable("memory").await;
    // Admitted first: all the node's cpu but 100m.
    let big = format!("{}-big", pods.label);
    pods.create(
        &node,
        requesting(&big, json!({ "cpu": format!("{}m", cpu - 100) })),
    )
    .await;
    running(&big).await;
    let cpu_pod = format!("{}-cpu", pods.label);
    pods.create(&node, requesting(&cpu_pod, json!({ "cpu": "200m" })))
        .await;
    let message = format!(
        "Node didn't have enough resource: cpu, requested: 200, used: {}, capacity: {cpu}",
        cpu - 100
    );
    assert_rejected(&agent, &cpu_pod, "OutOfcpu", &message).await;
    let mem_pod = format!("{}-mem", pods.label);
    let want = memory / (1 << 20) + 1;
    pods.create(
        &node,
        requesting(&mem_pod, json!({ "memory": format!("{want}Mi") })),
    )
    .await;
    let message = format!(
        "Node didn't have enough resource: memory, requested: {}, used: 0, capacity: {memory}",
        want << 20
    );
    assert_rejected(&agent, &mem_pod, "OutOfmemory", &message).await;
    // With the cpu free again, the rejected pod stays rejected.
    pods_api()
        .await
        .delete(&big, &DeleteParams::default())
        .await
        .expect("delete");
    eventually("big pod gone", Duration::from_secs(30), || async {
        get(&big).await.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = get(&cpu_pod).await.expect("the rejected pod");
    assert_eq!(phase(&still), Some("Failed"));
    assert_no_trace(&agent, &still).await;
    drop(pods);
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn more_pods_than_max_pods_fail_out_of_pods() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let max = active_pods_on_node().await + 1;
    let agent = start_agent(&["--max-pods", &max.to_string()]);
    let pods = TestPods::new(&unique("adm-pods"));
    let node = node_name();
    let first = format!("{}-a", pods.label);
    pods.create(&node, sleeper(&first, json!({}))).await;
    running(&first).await;
    let second = format!("{}-b", pods.label);
    pods.create(&node, sleeper(&second, json!({}))).await;
    let message = format!(
        "Node didn't have enough resource: pods, requested: 1, used: {max}, capacity: {max}"
    );
    assert_rejected(&agent, &second, "OutOfpods", &message).await;
    drop(pods);
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_node_selector_the_node_does_not_match_fails_node_affinity() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let agent = start_agent(&[]);
    let pods = TestPods::new(&unique("adm-aff"));
    let name = format!("{}-p", pods.label);
    let spec = json!({ "nodeSelector": { "rkubelet.test/absent": "yes" } });
    pods.create(&node_name(), sleeper(&name, spec)).await;
    assert_rejected(
        &agent,
        &name,
        "NodeAffinity",
        "Predicate NodeAffinity failed",
    )
    .await;
    drop(pods);
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_host_port_in_use_fails_node_ports() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let agent = start_agent(&[]);
    let pods = TestPods::new(&unique("adm-port"));
    let node = node_name();
    let with_port = |name: &str| {
        let mut pod = sleeper(name, json!({}));
        pod["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 80, "hostPort": 31080 }]);
        pod
    };
    let first = format!("{}-a", pods.label);
    pods.create(&node, with_port(&first)).await;
    running(&first).await;
    let second = format!("{}-b", pods.label);
    pods.create(&node, with_port(&second)).await;
    assert_rejected(&agent, &second, "NodePorts", "Predicate NodePorts failed").await;
    drop(pods);
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_unsafe_sysctl_fails_sysctl_forbidden_unless_allowed_by_the_flag() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let pods = TestPods::new(&unique("adm-sysctl"));
    let node = node_name();
    let with_sysctl = |name: &str| {
        let spec = json!({ "securityContext": { "sysctls": [{ "name": "kernel.msgmax", "value": "65536" }] } });
        sleeper(name, spec)
    };
    let agent = start_agent(&[]);
    let forbidden = format!("{}-a", pods.label);
    pods.create(&node, with_sysctl(&forbidden)).await;
    assert_rejected(
        &agent,
        &forbidden,
        "SysctlForbidden",
        "forbidden sysctl: \"kernel.msgmax\" not whitelisted",
    )
    .await;
    agent.stop();
    let agent = start_agent(&["--allowed-unsafe-sysctls", "kernel.msg*"]);
    let allowed = format!("{}-b", pods.label);
    pods.create(&node, with_sysctl(&allowed)).await;
    running(&allowed).await;
    // The pod rejected before stays rejected under the new flag.
    let still = get(&forbidden).await.expect("the rejected pod");
    assert_eq!(phase(&still), Some("Failed"));
    assert_no_trace(&agent, &still).await;
    drop(pods);
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_unknown_runtime_class_fails_the_sandbox_creation_as_in_the_kubelet() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let pods = TestPods::new(&unique("adm-rc"));
    let name = format!("{}-p", pods.label);
    // The API server's RuntimeClass admission refuses pods of an unknown RuntimeClass: the
    // kubelet meets one only when it is deleted after the pod was created (here before
    // the agent runs).
    let classes: Api<RuntimeClass> = Api::all(kube_client("admin.kubeconfig").await);
    let class: RuntimeClass = serde_json::from_value(json!({
        "metadata": { "name": "rkubelet-test-missing" },
        "handler": "runc"
    }))
    .expect("a RuntimeClass");
    let _ = classes
        .create(&kube::api::PostParams::default(), &class)
        .await;
    let spec = json!({ "runtimeClassName": "rkubelet-test-missing" });
    pods.create(&node_name(), sleeper(&name, spec)).await;
    classes
        .delete("rkubelet-test-missing", &DeleteParams::default())
        .await
        .expect("delete the RuntimeClass");
    let agent = start_agent(&[]);
    let event = eventually(
        "FailedCreatePodSandBox event",
        Duration::from_secs(30),
        || async {
            events_of(&name)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("FailedCreatePodSandBox"))
        },
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.message.as_deref(),
        Some(
            "Failed to create pod sandbox: runtimeclass.node.k8s.io \"rkubelet-test-missing\" not found"
        )
    );
    // The kubelet v1.20 keeps such a pod Pending (ContainerCreating) and retries.
    let pod = get(&name).await.expect("the pod");
    assert_eq!(phase(&pod), Some("Pending"), "{}", agent.log_tail());
    let waiting = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.state?.waiting?.reason);
    assert_eq!(waiting.as_deref(), Some("ContainerCreating"));
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    assert!(sandboxes_of(&uid).await.is_empty(), "a sandbox for {uid}");
    drop(pods);
    agent.stop();
}

/// The pod ends Failed/DeadlineExceeded with a Normal event and no running container;
/// returns how long after its start time it was seen Failed.
async fn assert_deadline_exceeded(agent: &AgentProcess, name: &str) -> Duration {
    let pod = failed(name, Duration::from_secs(60)).await;
    let seen = std::time::SystemTime::now();
    let status = pod.status.clone().unwrap_or_default();
    assert_eq!(
        status.reason.as_deref(),
        Some("DeadlineExceeded"),
        "{}",
        agent.log_tail()
    );
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    let event = eventually(
        "DeadlineExceeded event",
        Duration::from_secs(20),
        || async {
            events_of(name)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("DeadlineExceeded"))
        },
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    eventually("containers stopped", Duration::from_secs(20), || async {
        running_containers_of(&uid).await.is_empty().then_some(())
    })
    .await;
    let start = status.start_time.expect("a start time").0;
    let start = std::time::UNIX_EPOCH + Duration::from_secs(start.as_second().unsigned_abs());
    seen.duration_since(start).unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn active_deadline_seconds_fails_a_running_pod_and_stops_its_containers() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let agent = start_agent(&[]);
    let pods = TestPods::new(&unique("adm-dl"));
    let name = format!("{}-p", pods.label);
    pods.create(
        &node_name(),
        sleeper(&name, json!({ "activeDeadlineSeconds": 5 })),
    )
    .await;
    running(&name).await;
    let after = assert_deadline_exceeded(&agent, &name).await;
    eprintln!("Failed seen {after:?} after the start time (deadline 5 s)");
    assert!(after >= Duration::from_secs(4), "{after:?}");
    assert!(after < Duration::from_secs(10), "{after:?}");
    drop(pods);
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_deadline_added_to_a_running_pod_ends_it() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let agent = start_agent(&[]);
    let pods = TestPods::new(&unique("adm-dlp"));
    let name = format!("{}-p", pods.label);
    pods.create(&node_name(), sleeper(&name, json!({}))).await;
    running(&name).await;
    let started = Instant::now();
    let patch = json!({ "spec": { "activeDeadlineSeconds": 3 } });
    pods_api()
        .await
        .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .expect("patch activeDeadlineSeconds");
    assert_deadline_exceeded(&agent, &name).await;
    eprintln!("Failed {:?} after the patch", started.elapsed());
    drop(pods);
    agent.stop();
}
