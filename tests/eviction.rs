//! The eviction manager on the real node: pods run under an agent with the tests'
//! thresholds (`tests/common/agent.rs`: the kubelet's memory threshold, 1% of the disk);
//! the agent restarts with `memory.available` 128Mi below the machine's memory (a
//! threshold always met that leaves 128Mi allocatable, so the running pods are admitted
//! again), the node reports MemoryPressure, and the pods are evicted one per pass in
//! the kubelet's order — BestEffort first, then Burstable (within its request, least far
//! below it), then Guaranteed — each ending Failed with reason `Evicted`, the kubelet's
//! message and a Warning `Evicted` event, its containers killed; nothing is left behind.
//! Then the image filesystem (containerd's, as CRI `ImageFsInfo` names it): with
//! `imagefs.available` above what it has free, the node reports DiskPressure, image GC
//! reclaims first, and the pod is evicted as low on ephemeral-storage.

mod common;

use std::time::Duration;

use common::case::{Case, failed, get, reason_and_message, running};
use common::pods::{event_with_reason, events_of, running_containers_of, sleeper};
use common::{eventually, meminfo, node_condition};
use k8s_openapi::api::core::v1::Event;

/// The pod's `Evicted` event, once published.
async fn evicted_event(name: &str) -> Event {
    event_with_reason(name, "Evicted", Duration::from_secs(20)).await
}

/// A Guaranteed pod of 64Mi.
fn guaranteed_pod() -> serde_json::Value {
    let both = serde_json::json!({ "cpu": "10m", "memory": "64Mi" });
    resources(both.clone(), both)
}

fn resources(requests: serde_json::Value, limits: serde_json::Value) -> serde_json::Value {
    sleeper(serde_json::json!({
        "containers": [{
            "name": "main", "image": "busybox", "command": ["sleep", "3600"],
            "resources": { "requests": requests, "limits": limits },
        }]
    }))
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn memory_pressure_evicts_best_effort_then_burstable_then_guaranteed() {
    let mut case = Case::with_agent("evict", &[]).await;
    let best_effort = case
        .create("besteffort", sleeper(serde_json::json!({})))
        .await;
    let burstable = case
        .create(
            "burstable",
            resources(
                serde_json::json!({ "memory": "32Mi" }),
                serde_json::json!({}),
            ),
        )
        .await;
    let guaranteed = case.create("guaranteed", guaranteed_pod()).await;
    let mut uids = Vec::new();
    for name in [&best_effort, &burstable, &guaranteed] {
        uids.push(running(name).await.metadata.uid.expect("uid"));
    }

    // Memory is short from now on: the restarted agent admits its running pods, then
    // evicts them one per pass.
    // 128Mi stays allocatable: enough for the pods' 96Mi of requests, so none is refused
    // at admission; the threshold is met while more than 384Mi is in use (the cluster
    // alone uses about 1Gi).
    let threshold = always_met_memory_threshold();
    case.start_agent(&["--eviction-hard", &format!("memory.available<{threshold}")]);
    let first = failed(&best_effort, Duration::from_secs(60)).await;
    let (reason, message) = reason_and_message(&first);
    assert_eq!(reason, Some("Evicted"), "{}", case.agent().log_tail());
    let message = message.expect("a message");
    assert!(
        message.starts_with("The node was low on resource: memory. Container main was using ")
            && message.ends_with(", which exceeds its request of 0. "),
        "{message}"
    );
    // Still running while the BestEffort pod goes: one pod per pass.
    let others = [get(&burstable).await, get(&guaranteed).await];
    let still_running = others
        .iter()
        .flatten()
        .filter(|p| common::case::phase(p) == Some("Running"))
        .count();
    assert!(still_running >= 1, "two pods evicted in one pass");
    assert_eq!(node_condition("MemoryPressure").await, Some(true));
    let event = evicted_event(&best_effort).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.message.as_deref(), Some(message));

    // Then the Burstable pod (within its request), then the Guaranteed one.
    let second = failed(&burstable, Duration::from_secs(60)).await;
    assert_eq!(
        reason_and_message(&second),
        (
            Some("Evicted"),
            Some("The node was low on resource: memory. ")
        )
    );
    let third = failed(&guaranteed, Duration::from_secs(60)).await;
    assert_eq!(reason_and_message(&third).0, Some("Evicted"));
    let mut times = Vec::new();
    for name in [&best_effort, &burstable, &guaranteed] {
        let event = evicted_event(name).await;
        let at = event
            .event_time
            .map(|t| t.0)
            .or(event.first_timestamp.map(|t| t.0))
            .expect("event time");
        times.push(at);
    }
    assert!(
        times[0] < times[1] && times[1] < times[2],
        "evicted out of order: {times:?}"
    );
    // Killed, not only reported: nothing of them runs.
    for uid in &uids {
        eventually(
            "the evicted pod's containers stopped",
            Duration::from_secs(30),
            || async { running_containers_of(uid).await.is_empty().then_some(()) },
        )
        .await;
    }
    let log = case.agent().this_runs_log().expect("agent log");
    assert!(!log.contains("panicked"), "{}", case.agent().log_tail());
    eprintln!(
        "evicted at {:?} (BestEffort), {:?} (Burstable), {:?} (Guaranteed)",
        times[0], times[1], times[2]
    );
}

/// A threshold on `memory.available` that this machine always meets: 128Mi below its
/// memory (128Mi stays allocatable, so running pods requesting less are admitted again).
fn always_met_memory_threshold() -> u64 {
    let threshold = meminfo("MemTotal") - (128 << 20);
    assert!(
        meminfo("MemAvailable") + (256 << 20) < threshold,
        "the machine has too little memory in use for an always-met threshold"
    );
    threshold
}

/// A pod being deleted with a long grace period, its container still running (a `sleep`
/// as PID 1 ignores SIGTERM), holds its memory: the kubelet still ranks it with the active
/// pods. Here it is Burstable, within its request and least far below it, so it ranks
/// before the healthy Guaranteed pod; its eviction cuts its 10-minute termination short.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_terminating_pod_is_still_an_eviction_candidate() {
    let mut case = Case::with_agent("evict-terminating", &[]).await;
    let mut slow = resources(
        serde_json::json!({ "memory": "16Mi" }),
        serde_json::json!({}),
    );
    slow["spec"]["terminationGracePeriodSeconds"] = 600.into();
    let terminating = case.create("terminating", slow).await;
    let guaranteed = case.create("guaranteed", guaranteed_pod()).await;
    let uid = running(&terminating).await.metadata.uid.expect("uid");
    running(&guaranteed).await;
    common::pods::pods_api()
        .await
        .delete(&terminating, &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    // Its termination is under way, for up to 10 minutes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = get(&terminating).await.expect("the pod is still there");
    assert!(pod.metadata.deletion_timestamp.is_some());
    assert!(
        !running_containers_of(&uid).await.is_empty(),
        "the terminating pod's container stopped early"
    );

    let threshold = always_met_memory_threshold();
    case.start_agent(&["--eviction-hard", &format!("memory.available<{threshold}")]);
    let event = event_with_reason(&terminating, "Evicted", Duration::from_secs(60)).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.message.as_deref(),
        Some("The node was low on resource: memory. "),
        "{}",
        case.agent().log_tail()
    );
    // Killed at once (grace period 0), not after its 10 minutes, and then gone.
    eventually(
        "the terminating pod's container killed",
        Duration::from_secs(30),
        || async { running_containers_of(&uid).await.is_empty().then_some(()) },
    )
    .await;
    eventually(
        "the terminating pod gone from the API",
        Duration::from_secs(30),
        || async { get(&terminating).await.is_none().then_some(()) },
    )
    .await;
    // The healthy pod went second, if at all.
    let evicted_at = |e: &Event| {
        e.event_time
            .as_ref()
            .map(|t| t.0)
            .or(e.first_timestamp.as_ref().map(|t| t.0))
    };
    if let Some(other) = events_of(&guaranteed)
        .await
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("Evicted"))
    {
        assert!(
            evicted_at(&event) <= evicted_at(&other),
            "the healthy pod was evicted first"
        );
    }
    let log = case.agent().this_runs_log().expect("agent log");
    assert!(!log.contains("panicked"), "{}", case.agent().log_tail());
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn image_filesystem_pressure_reclaims_images_then_evicts() {
    let mut case = Case::with_agent("imagefs", &[]).await;
    let pod = case
        .create("besteffort", sleeper(serde_json::json!({})))
        .await;
    running(&pod).await;
    // containerd's root (`cluster.sh`), where its image filesystem is.
    let imagefs = common::state_dir().join("containerd/root");
    let fs = nix::sys::statvfs::statvfs(&imagefs).expect("statvfs of containerd's root");
    assert!(
        fs.blocks_available() * 100 < fs.blocks() * 99,
        "the image filesystem is more than 99% free: no always-met imagefs threshold"
    );

    // Only the image filesystem is short: a threshold above what it has free. The agent's
    // log (one per node, appended) is read from here on.
    let from = std::fs::metadata(&case.agent().log).map_or(0, |m| m.len());
    case.start_agent(&["--eviction-hard", "imagefs.available<99%"]);
    let evicted = failed(&pod, Duration::from_secs(60)).await;
    let (reason, message) = reason_and_message(&evicted);
    assert_eq!(reason, Some("Evicted"), "{}", case.agent().log_tail());
    assert!(
        message.is_some_and(|m| m.starts_with("The node was low on resource: ephemeral-storage. ")),
        "{message:?}"
    );
    eventually("DiskPressure", Duration::from_secs(30), || async {
        (node_condition("DiskPressure").await == Some(true)).then_some(())
    })
    .await;
    assert_eq!(node_condition("MemoryPressure").await, Some(false));
    let event = evicted_event(&pod).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // Node-level reclaim came first: container GC, then image GC (which removes every
    // unused image of the node's containerd, as the kubelet's would), for the imagefs
    // signal.
    let log = std::fs::read(&case.agent().log).expect("agent log");
    let log = String::from_utf8_lossy(
        log.get(usize::try_from(from).expect("size")..)
            .unwrap_or_default(),
    );
    let reclaimed = |what: &str| {
        log.lines()
            .position(|l| l.contains(what) && l.contains("imagefs.available"))
    };
    let (containers, images) = (reclaimed("container GC"), reclaimed("image GC"));
    let evicting = log
        .lines()
        .position(|l| l.contains("evicting pod") && l.contains(pod.as_str()));
    assert!(
        containers.is_some() && containers < images && images < evicting,
        "no image GC before the eviction: {:?}",
        log.lines()
            .filter(|l| l.contains(" GC ") || l.contains("evicting pod"))
            .collect::<Vec<_>>()
    );
    assert!(!log.contains("panicked"), "{}", case.agent().log_tail());
}
