//! Liveness, readiness and startup probes end to end, against the local cluster: exec,
//! httpGet and tcpSocket probes of busybox containers, restarts on liveness failure with
//! the kubelet's events, readiness gating the Ready condition, a startup probe holding
//! both back, an exec probe cut at its timeout, `prober_probe_total` on `/metrics/probes`, and
//! every probe kind of a host-network pod reaching it at the node's IP.

mod common;

use std::time::Duration;

use common::agent::{NODE_IP, free_port_on_node_ip};
use common::case::{Case, get};
use common::pods::{event_messages, events_of};
use common::{eventually, kubectl, node_name};
use k8s_openapi::api::core::v1::ContainerStatus;

/// A busybox pod with one container `c` running `script` and `probes` (merged into the
/// container).
fn pod(script: &str, probes: serde_json::Value) -> serde_json::Value {
    let mut container = serde_json::json!({
        "name": "c",
        "image": "busybox",
        "command": ["sh", "-c", script],
        "ports": [{ "name": "http", "containerPort": 8080 }],
    });
    if let (Some(c), Some(p)) = (container.as_object_mut(), probes.as_object()) {
        c.extend(p.clone());
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    })
}

/// The container's status and the pod's Ready condition, once the container runs.
async fn running_status(name: &str) -> Option<(ContainerStatus, bool)> {
    let pod = get(name).await?;
    let status = pod.status?;
    let cs = status.container_statuses?.into_iter().next()?;
    cs.state.as_ref()?.running.as_ref()?;
    let ready = status
        .conditions?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    Some((cs, ready))
}

/// Creates `path` in the pod's container and waits until the pod is Ready.
async fn touch_until_ready(name: &str, path: &str) -> ContainerStatus {
    kubectl(&["exec", name, "-c", "c", "--", "touch", path]).await;
    let (cs, _) = eventually("the pod ready", Duration::from_secs(30), || async {
        running_status(name).await.filter(|(_, ready)| *ready)
    })
    .await;
    cs
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_failing_liveness_probe_restarts_the_container_with_the_kubelets_events() {
    let case = Case::with_agent("liveness", &[]).await;
    // Alive for 4 s after each start, then the exec probe fails.
    let probes = serde_json::json!({
        "livenessProbe": {
            "exec": { "command": ["test", "-f", "/tmp/alive"] },
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    });
    let name = case
        .create(
            "p",
            pod(
                "touch /tmp/alive; sleep 4; rm /tmp/alive; sleep 3600",
                probes,
            ),
        )
        .await;
    eventually(
        "a restart after the liveness failure",
        Duration::from_secs(90),
        || async {
            let (cs, _) = running_status(&name).await?;
            (cs.restart_count >= 1).then_some(())
        },
    )
    .await;
    let unhealthy = event_messages(&name, "Unhealthy").await;
    assert!(
        unhealthy
            .iter()
            .any(|m| m.starts_with("Liveness probe failed:")),
        "{unhealthy:?}"
    );
    let killing = event_messages(&name, "Killing").await;
    assert!(
        killing.contains(&"Container c failed liveness probe, will be restarted".to_owned()),
        "{killing:?}"
    );
    let metrics = kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}/proxy/metrics/probes", node_name()),
    ])
    .await;
    let series =
        format!("prober_probe_total{{container=\"c\",namespace=\"default\",pod=\"{name}\",");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with(&series)
                && l.contains("probe_type=\"Liveness\",result=\"failed\"}")),
        "{series} missing from the metrics"
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_http_readiness_probe_gates_ready_and_a_tcp_liveness_probe_keeps_it_running() {
    let case = Case::with_agent("readiness", &[]).await;
    let probes = serde_json::json!({
        "readinessProbe": {
            "httpGet": { "path": "/ready", "port": "http" },
            "periodSeconds": 1,
        },
        "livenessProbe": {
            "tcpSocket": { "port": 8080 },
            "initialDelaySeconds": 2,
            "periodSeconds": 1,
        },
    });
    let name = case
        .create("p", pod("mkdir -p /www; httpd -f -p 8080 -h /www", probes))
        .await;
    // Running but not ready: /ready answers 404.
    let (cs, ready) = eventually("the container running", Duration::from_secs(60), || {
        running_status(&name)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (cs_later, ready_later) = running_status(&name).await.expect("still running");
    assert!(!cs.ready && !ready && !cs_later.ready && !ready_later);
    let unhealthy = event_messages(&name, "Unhealthy").await;
    assert!(
        unhealthy
            .contains(&"Readiness probe failed: HTTP probe failed with statuscode: 404".to_owned()),
        "{unhealthy:?}"
    );
    let cs = touch_until_ready(&name, "/www/ready").await;
    assert!(cs.ready);
    assert_eq!(cs.restart_count, 0, "the TCP liveness probe passes");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_startup_probe_holds_readiness_back_until_it_succeeds() {
    let case = Case::with_agent("startup", &[]).await;
    let probes = serde_json::json!({
        "startupProbe": {
            "exec": { "command": ["cat", "/tmp/started"] },
            "periodSeconds": 1,
            "failureThreshold": 600,
        },
        "readinessProbe": {
            "exec": { "command": ["true"] },
            "periodSeconds": 1,
        },
    });
    let name = case.create("p", pod("sleep 3600", probes)).await;
    eventually("the container running", Duration::from_secs(60), || {
        running_status(&name)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (cs, ready) = running_status(&name).await.expect("still running");
    assert_eq!(cs.started, Some(false));
    assert!(!cs.ready && !ready);
    let cs = touch_until_ready(&name, "/tmp/started").await;
    assert_eq!(cs.started, Some(true));
    assert!(cs.ready);
}

/// The liveness and readiness probe of `kind` (`exec`, `httpGet`, `tcpSocket`): every
/// second, failing after 3 misses.
fn both_probes(kind: &str, action: serde_json::Value) -> serde_json::Value {
    let probe = serde_json::json!({ kind: action, "periodSeconds": 1, "failureThreshold": 3 });
    serde_json::json!({ "livenessProbe": probe, "readinessProbe": probe })
}

/// A pod on the host's network has no IP of its own in the runtime: its httpGet and
/// tcpSocket probes dial the node's IP (its `status.podIP`), where its server listens, so
/// it becomes Ready and is never restarted.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_host_network_pods_probes_of_every_kind_reach_it_at_the_node_ip() {
    let case = Case::with_agent("probes-hostnet", &[]).await;
    let port = free_port_on_node_ip();
    let server = format!(
        "mkdir -p /tmp/www && echo ok > /tmp/www/healthz && exec httpd -f -p {NODE_IP}:{port} -h /tmp/www"
    );
    let container = |name: &str, script: &str, probes: serde_json::Value| {
        let mut c = serde_json::json!({
            "name": name,
            "image": "busybox",
            "command": ["sh", "-c", script],
        });
        if let (Some(c), Some(p)) = (c.as_object_mut(), probes.as_object()) {
            c.extend(p.clone());
        }
        c
    };
    let manifest = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                container("web", &server, both_probes("httpGet", serde_json::json!({ "path": "/healthz", "port": port }))),
                container("tcp", "sleep 3600", both_probes("tcpSocket", serde_json::json!({ "port": port }))),
                container("exec", "sleep 3600", both_probes("exec", serde_json::json!({ "command": ["true"] }))),
            ],
        },
    });
    let name = case.create("p", manifest).await;
    let ready = |pod: &k8s_openapi::api::core::v1::Pod| {
        let status = pod.status.as_ref()?;
        let ready = status
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then(|| status.clone())
    };
    let status = eventually(
        "the host-network pod Ready",
        Duration::from_secs(60),
        || async { ready(&get(&name).await?) },
    )
    .await;
    assert_eq!(status.pod_ip.as_deref(), Some(NODE_IP));
    // Three periods of failures would restart a container and unready the pod: twice that.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let pod = get(&name).await.expect("the pod");
    let status = ready(&pod).expect("still Ready");
    let restarts: Vec<(String, i32)> = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .map(|cs| (cs.name, cs.restart_count))
        .collect();
    assert_eq!(restarts.len(), 3, "{restarts:?}");
    assert!(restarts.iter().all(|(_, n)| *n == 0), "{restarts:?}");
    // A readiness probe may miss once while the server starts; a liveness probe never.
    let unhealthy = event_messages(&name, "Unhealthy").await;
    assert!(
        !unhealthy
            .iter()
            .any(|m| m.starts_with("Liveness probe failed")),
        "{unhealthy:?}"
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_exec_probe_that_outlives_its_timeout_fails() {
    let case = Case::with_agent("probe-timeout", &[]).await;
    // Two containers run the same 2 s readiness command: within a 5 s timeout it
    // succeeds, within 1 s it is cut and fails (ExecProbeTimeout), with no output.
    let container = |name: &str, timeout: i32| {
        serde_json::json!({
            "name": name,
            "image": "busybox",
            "command": ["sleep", "3600"],
            "readinessProbe": {
                "exec": { "command": ["sh", "-c", "sleep 2"] },
                "timeoutSeconds": timeout,
                "periodSeconds": 3,
                "failureThreshold": 1,
            },
        })
    };
    let mut manifest = pod("sleep 3600", serde_json::json!({}));
    manifest["spec"]["containers"] =
        serde_json::json!([container("patient", 5), container("cut", 1)]);
    let name = case.create("p", manifest).await;
    let failed = eventually(
        "the patient container ready and the cut one's probe failed",
        Duration::from_secs(60),
        || async {
            let statuses = get(&name).await?.status?.container_statuses?;
            let ready = |c: &str| statuses.iter().any(|s| s.name == c && s.ready);
            let failed = event_messages(&name, "Unhealthy").await;
            (ready("patient") && !failed.is_empty()).then_some((failed, ready("cut")))
        },
    )
    .await;
    let (messages, cut_ready) = failed;
    assert!(!cut_ready, "the cut container is not ready");
    // Only the cut container's probe failed, as the kubelet says it (no output to add).
    assert!(
        messages
            .iter()
            .all(|m| m.trim_end() == "Readiness probe failed:"),
        "{messages:?}"
    );
    let events = events_of(&name).await;
    let about = |e: &k8s_openapi::api::core::v1::Event| {
        e.involved_object.field_path.clone().unwrap_or_default()
    };
    let unhealthy: Vec<String> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Unhealthy"))
        .map(about)
        .collect();
    assert!(
        unhealthy.iter().all(|f| f == "spec.containers{cut}"),
        "{unhealthy:?}"
    );
    drop(case);
}
