//! Pod admission and `activeDeadlineSeconds` end to end, against the local cluster: pods
//! bound with `nodeName` (no scheduler, which is what the kubelet's own admission is for)
//! that do not fit the node end Failed with the kubelet's reason and message and get no
//! sandbox; a RuntimeClass deleted after its pod was created fails the sandbox creation
//! as in the kubelet v1.20; under PIDPressure a new pod is refused `Evicted` with the
//! eviction manager's message and nothing of it run;
//! a running pod past its active deadline ends Failed/DeadlineExceeded with its
//! containers stopped, also when the deadline is added to it while it runs.

mod common;

use std::time::{Duration, Instant};

use common::agent::{AgentProcess, TEST_EVICTION_HARD};
use common::case::{Case, delete_and_wait, failed, get, phase, running};
use common::pods::{events_of, pods_api, running_containers_of, sandboxes_of, sleeper};
use common::{
    TestRuntimeClass, eventually, node_allocatable as allocatable, node_condition, node_name,
};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

fn requesting(requests: serde_json::Value) -> serde_json::Value {
    let mut pod = sleeper(json!({}));
    pod["spec"]["containers"][0]["resources"] = json!({ "requests": requests });
    pod
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
    let event = pod_event(name, reason, "Warning").await;
    assert_eq!(event.message.as_deref(), Some(message));
    assert_no_trace(agent, &pod).await;
}

/// The first event about the pod with `reason`, waited for; it must be of type `kind`.
async fn pod_event(name: &str, reason: &str, kind: &str) -> Event {
    let event = eventually(
        &format!("{reason} event"),
        Duration::from_secs(30),
        || async {
            events_of(name)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
        },
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some(kind), "{event:?}");
    event
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

/// A pod rejected earlier is still Failed, with nothing of it created since.
async fn assert_still_rejected(agent: &AgentProcess, name: &str) {
    let pod = get(name).await.expect("the rejected pod");
    assert_eq!(phase(&pod), Some("Failed"));
    assert_no_trace(agent, &pod).await;
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
    let mut case = Case::new("adm-res").await;
    assert_eq!(active_pods_on_node().await, 0, "other pods on the node");
    case.start_agent(&[]);
    let cpu = allocatable("cpu").await;
    let memory = allocatable("memory").await;
    // Admitted first: all the node's cpu but 100m.
    let big = case
        .create(
            "big",
            requesting(json!({ "cpu": format!("{}m", cpu - 100) })),
        )
        .await;
    running(&big).await;
    let cpu_pod = case
        .create("cpu", requesting(json!({ "cpu": "200m" })))
        .await;
    let message = format!(
        "Node didn't have enough resource: cpu, requested: 200, used: {}, capacity: {cpu}",
        cpu - 100
    );
    assert_rejected(case.agent(), &cpu_pod, "OutOfcpu", &message).await;
    let want = memory / (1 << 20) + 1;
    let mem_pod = case
        .create("mem", requesting(json!({ "memory": format!("{want}Mi") })))
        .await;
    let message = format!(
        "Node didn't have enough resource: memory, requested: {}, used: 0, capacity: {memory}",
        want << 20
    );
    assert_rejected(case.agent(), &mem_pod, "OutOfmemory", &message).await;
    // With the cpu free again, the rejected pod stays rejected.
    delete_and_wait(&big).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_still_rejected(case.agent(), &cpu_pod).await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn more_pods_than_max_pods_fail_out_of_pods() {
    let mut case = Case::new("adm-pods").await;
    let max = active_pods_on_node().await + 1;
    case.start_agent(&["--max-pods", &max.to_string()]);
    let first = case.create("a", sleeper(json!({}))).await;
    running(&first).await;
    let second = case.create("b", sleeper(json!({}))).await;
    let message = format!(
        "Node didn't have enough resource: pods, requested: 1, used: {max}, capacity: {max}"
    );
    assert_rejected(case.agent(), &second, "OutOfpods", &message).await;
}

/// With `pid.available` below a threshold this machine always meets (`kernel.pid_max`
/// itself: at least one task runs) beside the test agents' usual ones, a new pod, of any
/// QoS class, is refused as the kubelet's eviction manager refuses it at admission: as
/// soon as the manager's own pass met the threshold (its log says so), not when the Node
/// reports it. Then the agent without the threshold clears the Node's condition (the
/// next test's agent must not read a stale one).
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn pid_pressure_refuses_new_pods_as_the_eviction_manager_does() {
    let mut case = Case::new("adm-pids").await;
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").expect("pid_max");
    let thresholds = format!("{TEST_EVICTION_HARD},pid.available<{}", pid_max.trim());
    let started = Instant::now();
    case.start_agent(&["--eviction-hard", &thresholds]);
    eventually(
        "the eviction manager holding PIDPressure",
        Duration::from_secs(60),
        || async {
            case.agent()
                .eviction_manager_holds("PIDPressure")
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "PIDPressure held by the eviction manager {:?} after the agent's start",
        started.elapsed()
    );
    let guaranteed = json!({ "cpu": "100m", "memory": "32Mi" });
    let mut manifest = sleeper(json!({}));
    manifest["spec"]["containers"][0]["resources"] =
        json!({ "requests": guaranteed, "limits": guaranteed });
    let name = case.create("p", manifest).await;
    let message = "The node had condition: [PIDPressure]. ";
    assert_rejected(case.agent(), &name, "Evicted", message).await;
    case.start_agent(&[]);
    eventually("PIDPressure cleared", Duration::from_secs(60), || async {
        (node_condition("PIDPressure").await == Some(false)).then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_node_selector_the_node_does_not_match_fails_node_affinity() {
    let case = Case::with_agent("adm-aff", &[]).await;
    let spec = json!({ "nodeSelector": { "rkubelet.test/absent": "yes" } });
    let name = case.create("p", sleeper(spec)).await;
    let message = "Predicate NodeAffinity failed";
    assert_rejected(case.agent(), &name, "NodeAffinity", message).await;
    // A rejected pod is deleted like any other: the agent finishes its deletion.
    delete_and_wait(&name).await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_host_port_in_use_fails_node_ports() {
    let case = Case::with_agent("adm-port", &[]).await;
    let with_port = || {
        let mut pod = sleeper(json!({}));
        pod["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 80, "hostPort": 31080 }]);
        pod
    };
    let first = case.create("a", with_port()).await;
    running(&first).await;
    let second = case.create("b", with_port()).await;
    assert_rejected(
        case.agent(),
        &second,
        "NodePorts",
        "Predicate NodePorts failed",
    )
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_unsafe_sysctl_fails_sysctl_forbidden_unless_allowed_by_the_flag() {
    let mut case = Case::with_agent("adm-sysctl", &[]).await;
    let with_sysctl = || {
        sleeper(json!({
            "securityContext": { "sysctls": [{ "name": "kernel.msgmax", "value": "65536" }] }
        }))
    };
    let forbidden = case.create("a", with_sysctl()).await;
    let message = "forbidden sysctl: \"kernel.msgmax\" not whitelisted";
    assert_rejected(case.agent(), &forbidden, "SysctlForbidden", message).await;
    case.start_agent(&["--allowed-unsafe-sysctls", "kernel.msg*"]);
    let allowed = case.create("b", with_sysctl()).await;
    running(&allowed).await;
    // The pod rejected before stays rejected under the new flag.
    assert_still_rejected(case.agent(), &forbidden).await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_unknown_runtime_class_fails_the_sandbox_creation_as_in_the_kubelet() {
    let mut case = Case::new("adm-rc").await;
    // The API server's RuntimeClass admission refuses pods of an unknown RuntimeClass: the
    // kubelet meets one only when it is deleted after the pod was created (here before
    // the agent runs).
    let classes = TestRuntimeClass::create("rkubelet-test-missing", "runc").await;
    let spec = json!({ "runtimeClassName": "rkubelet-test-missing" });
    let name = case.create("p", sleeper(spec)).await;
    drop(classes);
    case.start_agent(&[]);
    let event = pod_event(&name, "FailedCreatePodSandBox", "Warning").await;
    assert_eq!(
        event.message.as_deref(),
        Some(
            "Failed to create pod sandbox: runtimeclass.node.k8s.io \"rkubelet-test-missing\" not found"
        )
    );
    // The kubelet v1.20 keeps such a pod Pending (ContainerCreating) and retries.
    let pod = get(&name).await.expect("the pod");
    assert_eq!(phase(&pod), Some("Pending"), "{}", case.agent().log_tail());
    let waiting = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.state?.waiting?.reason);
    assert_eq!(waiting.as_deref(), Some("ContainerCreating"));
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    assert!(sandboxes_of(&uid).await.is_empty(), "a sandbox for {uid}");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_handler_of_a_runtime_class_reaches_the_runtime() {
    let case = Case::with_agent("adm-rch", &[]).await;
    let _runc = TestRuntimeClass::create("rkubelet-test-runc", "runc").await;
    let _bogus = TestRuntimeClass::create("rkubelet-test-bogus", "rkubelet-bogus").await;
    let good = case
        .create(
            "a",
            sleeper(json!({ "runtimeClassName": "rkubelet-test-runc" })),
        )
        .await;
    running(&good).await;
    let bad = case
        .create(
            "b",
            sleeper(json!({ "runtimeClassName": "rkubelet-test-bogus" })),
        )
        .await;
    let event = pod_event(&bad, "FailedCreatePodSandBox", "Warning").await;
    let message = event.message.unwrap_or_default();
    assert!(message.contains("rkubelet-bogus"), "{message}");
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
    pod_event(name, "DeadlineExceeded", "Normal").await;
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
    let case = Case::with_agent("adm-dl", &[]).await;
    let name = case
        .create("p", sleeper(json!({ "activeDeadlineSeconds": 5 })))
        .await;
    running(&name).await;
    let after = assert_deadline_exceeded(case.agent(), &name).await;
    eprintln!("Failed seen {after:?} after the start time (deadline 5 s)");
    assert!(after >= Duration::from_secs(4), "{after:?}");
    assert!(after < Duration::from_secs(10), "{after:?}");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_deadline_added_to_a_running_pod_ends_it() {
    let case = Case::with_agent("adm-dlp", &[]).await;
    let name = case.create("p", sleeper(json!({}))).await;
    running(&name).await;
    let started = Instant::now();
    let patch = json!({ "spec": { "activeDeadlineSeconds": 3 } });
    pods_api()
        .await
        .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .expect("patch activeDeadlineSeconds");
    assert_deadline_exceeded(case.agent(), &name).await;
    eprintln!("Failed {:?} after the patch", started.elapsed());
}
