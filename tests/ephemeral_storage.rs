//! Local storage capacity isolation on the real node, as the kubelet v1.20 enforces it:
//! pods writing past their limits are evicted by the eviction manager's pass (every 10 s)
//! with reason `Evicted`, the kubelet's message and a Warning `Evicted` event, their
//! containers killed — one over the pod's total `limits.ephemeral-storage` (its writable
//! layer), one container over its own limit within the pod's, one emptyDir over its
//! `sizeLimit` — while a pod within its limit, whose memory-backed emptyDir holds more than
//! the limit (its files' sizes read back), keeps running through a whole pass after its
//! writes; and a pod requesting more `ephemeral-storage` than the node's
//! allocatable less what the admitted pods request is refused with `OutOfephemeral-storage`.

mod common;

use std::time::{Duration, Instant};

use common::case::{Case, failed, get, phase, reason_and_message, running};
use common::pods::{
    event_with_reason, events_of, exec_in, running_containers_of, sandboxes_of, sleeper,
};
use common::{eventually, node_allocatable};
use serde_json::{Value, json};

const MIB: i64 = 1 << 20;

/// A container `name` that writes `mib` MiB to `path`, then sleeps; with an
/// ephemeral-storage limit when given.
fn writer(name: &str, path: &str, mib: u32, limit: Option<&str>) -> Value {
    let script = format!("dd if=/dev/zero of={path} bs=1M count={mib} && sync; sleep 3600");
    let mut c = json!({ "name": name, "image": "busybox", "command": ["sh", "-c", script] });
    if let Some(limit) = limit {
        c["resources"] = json!({ "limits": { "ephemeral-storage": limit } });
    }
    c
}

/// The eviction passes that checked the pods' local storage limits so far (the agent logs
/// each at debug).
fn passes_checked(case: &Case) -> usize {
    case.agent()
        .this_runs_log()
        .expect("agent log")
        .matches("local storage limits checked")
        .count()
}

/// Waits until the pod `name` is evicted; its time from `start`.
async fn evicted(name: &str, start: Instant, want: &str) -> Duration {
    let pod = failed(name, Duration::from_secs(60)).await;
    let took = start.elapsed();
    assert_eq!(reason_and_message(&pod), (Some("Evicted"), Some(want)));
    let event = event_with_reason(name, "Evicted", Duration::from_secs(20)).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.message.as_deref(), Some(want));
    let uid = pod.metadata.uid.expect("uid");
    eventually(
        "the evicted pod's containers stopped",
        Duration::from_secs(30),
        || async { running_containers_of(&uid).await.is_empty().then_some(()) },
    )
    .await;
    took
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn pods_over_their_local_storage_limits_are_evicted_with_the_kubelets_messages() {
    let case = Case::with_agent("eph", &[]).await;
    let start = Instant::now();
    let pod_limit = case
        .create(
            "pod",
            sleeper(json!({ "containers": [writer("main", "/fill", 20, Some("10Mi"))] })),
        )
        .await;
    let container_limit = case
        .create(
            "container",
            sleeper(json!({ "containers": [
                writer("writer", "/fill", 20, Some("10Mi")),
                writer("idle", "/fill", 0, Some("100Mi")),
            ] })),
        )
        .await;
    let mut cache_main = writer("main", "/cache/fill", 20, None);
    cache_main["volumeMounts"] = json!([{ "name": "cache", "mountPath": "/cache" }]);
    let size_limit = case
        .create(
            "emptydir",
            sleeper(json!({
                "containers": [cache_main],
                "volumes": [{ "name": "cache", "emptyDir": { "sizeLimit": "10Mi" } }],
            })),
        )
        .await;
    // 5 MiB on disk, 20 MiB in a memory-backed emptyDir: within its 16Mi.
    let mut within_main = writer("main", "/fill", 5, Some("16Mi"));
    within_main["command"][2] = "dd if=/dev/zero of=/fill bs=1M count=5 && \
        dd if=/dev/zero of=/ram/fill bs=1M count=20 && sync; sleep 3600"
        .into();
    within_main["volumeMounts"] = json!([{ "name": "ram", "mountPath": "/ram" }]);
    let within = case
        .create(
            "within",
            sleeper(json!({
                "containers": [within_main],
                "volumes": [{ "name": "ram", "emptyDir": { "medium": "Memory" } }],
            })),
        )
        .await;

    let (pod_took, container_took, size_took) = tokio::join!(
        evicted(
            &pod_limit,
            start,
            "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. "
        ),
        evicted(
            &container_limit,
            start,
            "Container writer exceeded its local ephemeral storage limit \"10Mi\". "
        ),
        evicted(
            &size_limit,
            start,
            "Usage of EmptyDir volume \"cache\" exceeds the limit \"10Mi\". "
        ),
    );
    // The pod within its limit wrote what it claims: 5 MiB on disk, 20 MiB in memory.
    let within_uid = running(&within).await.metadata.uid.expect("uid");
    let sizes = eventually(
        "the pod within its limit written",
        Duration::from_secs(30),
        || async {
            let script = "test -f /ram/fill && sleep 1 && stat -c %s /fill /ram/fill";
            let out = exec_in(
                &within_uid,
                "main",
                vec!["sh".into(), "-c".into(), script.into()],
            )
            .await;
            (out.exit_code == 0).then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        },
    )
    .await;
    assert_eq!(sizes, format!("{}\n{}\n", 5 * MIB, 20 * MIB));
    // It saw the passes that evicted the others, and a whole pass after its writes.
    let seen = passes_checked(&case);
    eventually(
        "an eviction pass after the writes",
        Duration::from_secs(30),
        || async { (passes_checked(&case) > seen + 1).then_some(()) },
    )
    .await;
    let pod = get(&within).await.expect("the pod within its limit");
    assert_eq!(phase(&pod), Some("Running"), "{}", case.agent().log_tail());
    assert!(
        !events_of(&within)
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("Evicted")),
        "the pod within its limit was evicted"
    );
    let log = case.agent().this_runs_log().expect("agent log");
    assert!(!log.contains("panicked"), "{}", case.agent().log_tail());
    eprintln!(
        "evicted after creation: pod limit {pod_took:?}, container limit {container_took:?}, \
         emptyDir sizeLimit {size_took:?}"
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn ephemeral_storage_requests_beyond_allocatable_fail_out_of_ephemeral_storage() {
    let case = Case::with_agent("eph-adm", &[]).await;
    let allocatable = node_allocatable("ephemeral-storage").await;
    assert!(allocatable > MIB, "the node reports no ephemeral-storage");
    let requesting = |bytes: i64| {
        let mut pod = sleeper(json!({}));
        pod["spec"]["containers"][0]["resources"] =
            json!({ "requests": { "ephemeral-storage": bytes.to_string() } });
        pod
    };
    // Admitted first: 1Mi; then 1 byte more than what is left.
    let first = case.create("first", requesting(MIB)).await;
    running(&first).await;
    let wanted = allocatable - MIB + 1;
    let refused = case.create("refused", requesting(wanted)).await;
    let pod = failed(&refused, Duration::from_secs(30)).await;
    let message = format!(
        "Node didn't have enough resource: ephemeral-storage, requested: {wanted}, used: {MIB}, \
         capacity: {allocatable}"
    );
    let status_message = format!("Pod {message}");
    assert_eq!(
        reason_and_message(&pod),
        (
            Some("OutOfephemeral-storage"),
            Some(status_message.as_str())
        ),
        "{}",
        case.agent().log_tail()
    );
    let event =
        event_with_reason(&refused, "OutOfephemeral-storage", Duration::from_secs(20)).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.message.as_deref(), Some(message.as_str()));
    let uid = pod.metadata.uid.expect("uid");
    assert!(
        sandboxes_of(&uid).await.is_empty(),
        "a sandbox for the refused pod"
    );
    // What is left still fits.
    let fits = case.create("fits", requesting(wanted - 1)).await;
    running(&fits).await;
}
