//! Pod readiness gates end to end, against the local cluster (the e2e "should support pod
//! readiness gates"): a pod whose containers are ready stays not Ready until the condition
//! of its readiness gate, set by a controller through `pods/status`, is True; it turns
//! Ready on that patch (within 10 s, not at the 60 s resync), stays Ready (the condition kept) across the agent's
//! later status patches, and turns not Ready again when the condition goes False.

mod common;

use std::time::{Duration, Instant};

use common::case::{Case, get, running};
use common::pods::{pods_api, sleeper};
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kube::api::{Patch, PatchParams};
use serde_json::json;

const GATE: &str = "example.com/lb-ready";

fn condition(p: &Pod, kind: &str) -> Option<PodCondition> {
    let conditions = p.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == kind).cloned()
}

fn status_of(p: &Pod, kind: &str) -> Option<String> {
    condition(p, kind).map(|c| c.status)
}

/// Sets a pod condition through `pods/status`, as a controller does (the admin here).
async fn set_condition(name: &str, kind: &str, status: &str) {
    let patch = json!({ "status": { "conditions": [{ "type": kind, "status": status }] } });
    pods_api()
        .await
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap_or_else(|e| panic!("patching {kind}={status} on {name}: {e}"));
}

/// How long until the pod's condition `kind` says `status`, polled every 20 ms (the
/// figure's resolution); panics after `within`.
async fn until_condition(
    name: &str,
    kind: &str,
    status: &str,
    within: Duration,
) -> (Duration, Pod) {
    let start = Instant::now();
    loop {
        if let Some(p) = get(name).await
            && status_of(&p, kind).as_deref() == Some(status)
        {
            return (start.elapsed(), p);
        }
        assert!(
            start.elapsed() < within,
            "{name}: {kind} not {status} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sets the gate's condition to `gate` as a controller does; the pod's Ready condition
/// must say `ready` well before the pod's periodic resync (60 s, the kubelet's
/// `syncFrequency`) could have done it: within [`GATE_BOUND`], on the pod update itself
/// (the time is printed as a figure: ~0.1 s on an idle machine).
async fn set_gate(name: &str, gate: &str, ready: &str) -> Pod {
    set_condition(name, GATE, gate).await;
    let (took, pod) = until_condition(name, "Ready", ready, GATE_BOUND).await;
    eprintln!("FIGURE readiness gate patched {gate} -> Ready {ready}: {took:?}");
    pod
}

/// A sixth of the 60 s resync: a loaded 2-core machine can take seconds to deliver the
/// watch event and sync (2 s was missed there), never a resync period.
const GATE_BOUND: Duration = Duration::from_secs(10);

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn ready_waits_for_the_readiness_gate_and_keeps_its_condition() {
    let case = Case::with_agent("rgates", &[]).await;
    let name = case
        .create(
            "gated",
            sleeper(json!({ "readinessGates": [{ "conditionType": GATE }] })),
        )
        .await;
    running(&name).await;
    let (_, pod) = until_condition(&name, "ContainersReady", "True", Duration::from_secs(30)).await;
    // The containers are ready; the gate's condition does not exist yet.
    let ready = condition(&pod, "Ready").expect("a Ready condition");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason.as_deref(), Some("ReadinessGatesNotReady"));
    let missing =
        format!("corresponding condition of pod readiness gate \"{GATE}\" does not exist.");
    assert_eq!(ready.message, Some(missing));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pod = get(&name).await.expect("the pod");
    assert_eq!(status_of(&pod, "Ready").as_deref(), Some("False"));

    let pod = set_gate(&name, "True", "True").await;
    assert_eq!(status_of(&pod, GATE).as_deref(), Some("True"));
    let opened = condition(&pod, GATE).expect("the gate's condition");

    // Someone else marks the containers not ready (as the node lifecycle controller
    // does): the agent sends its own status again, and that patch keeps the gate's
    // condition as its owner set it, and the pod Ready.
    set_condition(&name, "ContainersReady", "False").await;
    let (_, pod) = until_condition(&name, "ContainersReady", "True", Duration::from_secs(10)).await;
    assert_eq!(status_of(&pod, "Ready").as_deref(), Some("True"));
    assert_eq!(condition(&pod, GATE), Some(opened.clone()));
    // And it stays so while the agent goes on.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pod = get(&name).await.expect("the pod");
        assert_eq!(status_of(&pod, "Ready").as_deref(), Some("True"));
        assert_eq!(condition(&pod, GATE), Some(opened.clone()));
    }

    let pod = set_gate(&name, "False", "False").await;
    let ready = condition(&pod, "Ready").expect("a Ready condition");
    assert_eq!(
        ready.message,
        Some(format!(
            "the status of pod readiness gate \"{GATE}\" is not \"True\", but False"
        ))
    );
    assert_eq!(status_of(&pod, "ContainersReady").as_deref(), Some("True"));
    drop(case);
}
