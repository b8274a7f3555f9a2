//! Liveness, readiness and startup probes end to end, against the local cluster: exec,
//! httpGet and tcpSocket probes of busybox containers, restarts on liveness failure with
//! the kubelet's events, readiness gating the Ready condition, a startup probe holding
//! both back, and `prober_probe_total` on `/metrics`.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::agent::{AgentProcess, Owner};
use common::{eventually, kube_client, node_name, state_dir, unique};
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tokio::process::Command;

/// The tests share one node: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NS: &str = "default";

fn start_agent() -> AgentProcess {
    let root: PathBuf = state_dir().join("test-agents").join(node_name());
    AgentProcess::start(Owner::Agent, &node_name(), root)
}

async fn pods_api() -> Api<Pod> {
    Api::namespaced(kube_client("admin.kubeconfig").await, NS)
}

/// `kubectl` as the admin; answers stdout, panics on failure.
async fn kubectl(args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(state_dir().join("pki").join("admin.kubeconfig"))
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deletes the test's pod when it ends, also when it fails, and waits until it is gone.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let name = self.0.clone();
        common::cleanup_blocking(move || async move {
            let api = pods_api().await;
            let _ = api.delete(&name, &DeleteParams::default()).await;
            let deadline = Instant::now() + Duration::from_secs(40);
            while Instant::now() < deadline {
                if api.get_opt(&name).await.ok().flatten().is_none() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let force = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            let _ = api.delete(&name, &force).await;
        });
    }
}

/// A busybox pod bound to the node with one container `c` running `script` and `probes`
/// (merged into the container).
async fn create_pod(name: &str, script: &str, probes: serde_json::Value) {
    let mut container = serde_json::json!({
        "name": "c",
        "image": "busybox",
        "command": ["sh", "-c", script],
        "ports": [{ "name": "http", "containerPort": 8080 }],
    });
    if let (Some(c), Some(p)) = (container.as_object_mut(), probes.as_object()) {
        c.extend(p.clone());
    }
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NS },
        "spec": {
            "nodeName": node_name(),
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }))
    .expect("pod");
    pods_api()
        .await
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

/// The container's status and the pod's Ready condition, once the container runs.
async fn running_status(name: &str) -> Option<(ContainerStatus, bool)> {
    let pod = pods_api().await.get_opt(name).await.ok().flatten()?;
    let status = pod.status?;
    let cs = status.container_statuses?.into_iter().next()?;
    cs.state.as_ref()?.running.as_ref()?;
    let ready = status
        .conditions?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    Some((cs, ready))
}

/// Takes the node for one test and starts the agent; the pod named after `prefix` is
/// deleted when the returned guard drops (before the agent stops).
async fn begin(prefix: &str) -> (tokio::sync::MutexGuard<'static, ()>, AgentProcess, Cleanup) {
    let turn = ONE_AT_A_TIME.lock().await;
    (turn, start_agent(), Cleanup(unique(prefix)))
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

/// The messages of the pod's events with `reason`.
async fn event_messages(name: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(kube_client("admin.kubeconfig").await, NS);
    let selector = format!("involvedObject.name={name},reason={reason}");
    events
        .list(&ListParams::default().fields(&selector))
        .await
        .map(|l| l.items.into_iter().filter_map(|e| e.message).collect())
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_failing_liveness_probe_restarts_the_container_with_the_kubelets_events() {
    let (_turn, _agent, pod) = begin("liveness").await;
    let name = pod.0.clone();
    // Alive for 4 s after each start, then the exec probe fails.
    let probes = serde_json::json!({
        "livenessProbe": {
            "exec": { "command": ["test", "-f", "/tmp/alive"] },
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    });
    create_pod(
        &name,
        "touch /tmp/alive; sleep 4; rm /tmp/alive; sleep 3600",
        probes,
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
        &format!("/api/v1/nodes/{}/proxy/metrics", node_name()),
    ])
    .await;
    let series = format!(
        "prober_probe_total{{probe_type=\"Liveness\",result=\"failed\",container=\"c\",pod=\"{name}\",namespace=\"{NS}\","
    );
    assert!(
        metrics.lines().any(|l| l.starts_with(&series)),
        "{series} missing from the metrics"
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_http_readiness_probe_gates_ready_and_a_tcp_liveness_probe_keeps_it_running() {
    let (_turn, _agent, pod) = begin("readiness").await;
    let name = pod.0.clone();
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
    create_pod(&name, "mkdir -p /www; httpd -f -p 8080 -h /www", probes).await;
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
    let (_turn, _agent, pod) = begin("startup").await;
    let name = pod.0.clone();
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
    create_pod(&name, "sleep 3600", probes).await;
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
