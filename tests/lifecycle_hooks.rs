//! Lifecycle hooks and graceful termination end to end, against the local cluster:
//! postStart and preStop exec hooks leave their marks in a volume, an httpGet hook reaches
//! an HTTP server of the pod, a failing postStart hook kills and restarts the container
//! (`FailedPostStartHook`), a preStop hook's time counts against the grace period, an
//! httpGet preStop hook reaches the container before its SIGTERM, an httpGet preStop hook
//! of a host-network pod reaches its server at the node's IP, an exec preStop hook is not
//! cut by the runtime request timeout, and a grace period under 2 s gets the kubelet's 2 s
//! minimum.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::agent::{NODE_IP, free_port_on_node_ip};
use common::case::{Case, delete_and_wait, get, running};
use common::eventually;
use common::pods::{event_messages, events_of};
use serde_json::json;

/// A host directory of this test, shared with its pod, removed when dropped.
struct HostDir(PathBuf);

impl HostDir {
    fn new(name: &str) -> Self {
        let dir = common::state_dir().join("test-hooks").join(name);
        std::fs::create_dir_all(&dir).expect("host dir");
        Self(dir)
    }

    fn marks(&self) -> String {
        std::fs::read_to_string(self.0.join("marks")).unwrap_or_default()
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A busybox pod whose `main` container sleeps (as PID 1 it ignores SIGTERM, so a stop
/// takes the whole grace period) with `lifecycle`, and `/hooks` from `dir`.
fn sleeper(dir: &HostDir, lifecycle: serde_json::Value, grace: i64) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "volumes": [{ "name": "hooks", "hostPath": { "path": dir.0 } }],
            "containers": [{
                "name": "main",
                "image": "busybox",
                "command": ["sleep", "3600"],
                "lifecycle": lifecycle,
                "volumeMounts": [{ "name": "hooks", "mountPath": "/hooks" }],
            }],
        }
    })
}

fn mark(what: &str) -> serde_json::Value {
    json!({ "exec": { "command": ["sh", "-c", format!("echo {what} >> /hooks/marks")] } })
}

/// Waits (`within`) until the server's log at `log` shows a hook's request for
/// `/hostname` (busybox httpd -vv logs "<peer>: url:/hostname").
async fn hook_request_logged(log: &std::path::Path, within: Duration) {
    eventually("the hook's request in the server's log", within, || async {
        let text = tokio::fs::read_to_string(log).await.ok()?;
        text.contains("url:/hostname").then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn post_start_and_pre_stop_exec_hooks_run_around_the_container() {
    let case = Case::with_agent("hooks-exec", &[]).await;
    let dir = HostDir::new(&case.pods.label);
    let lifecycle = json!({ "postStart": mark("post-start"), "preStop": mark("pre-stop") });
    let name = case.create("p", sleeper(&dir, lifecycle, 5)).await;
    running(&name).await;
    eventually("the postStart mark", Duration::from_secs(10), || async {
        (dir.marks() == "post-start\n").then_some(())
    })
    .await;
    delete_and_wait(&name).await;
    assert_eq!(dir.marks(), "post-start\npre-stop\n");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_http_post_start_hook_reaches_the_pods_server() {
    let case = Case::with_agent("hooks-http", &[]).await;
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "server",
                    "image": "busybox",
                    "command": ["httpd", "-f", "-vv", "-p", "8080", "-h", "/etc"],
                    "ports": [{ "name": "web", "containerPort": 8080 }],
                },
                {
                    "name": "app",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "ports": [{ "name": "web", "containerPort": 8080 }],
                    "lifecycle": {
                        "postStart": { "httpGet": { "path": "/hostname", "port": "web" } }
                    },
                },
            ],
        }
    });
    let name = case.create("p", manifest).await;
    let pod = running(&name).await;
    let uid = pod.metadata.uid.clone().expect("uid");
    hook_request_logged(&case.log_of(&name, &uid, "server"), Duration::from_secs(30)).await;
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_failing_post_start_hook_kills_and_restarts_the_container() {
    let case = Case::with_agent("hooks-fail", &[]).await;
    let dir = HostDir::new(&case.pods.label);
    let lifecycle = json!({ "postStart": { "exec": { "command": ["sh", "-c", "exit 7"] } } });
    let name = case.create("p", sleeper(&dir, lifecycle, 1)).await;
    eventually(
        "a restart after the failed hook",
        Duration::from_secs(60),
        || async {
            let p = get(&name).await?;
            let restarts = p.status?.container_statuses?.first()?.restart_count;
            (restarts >= 1).then_some(())
        },
    )
    .await;
    let event = events_of(&name)
        .await
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("FailedPostStartHook"))
        .expect("a FailedPostStartHook event");
    let message = event.message.unwrap_or_default();
    assert!(
        message.starts_with("Exec lifecycle hook ([sh -c exit 7]) for Container \"main\""),
        "{message}"
    );
    assert!(
        message.contains("exited with 7"),
        "the exit code is in the message: {message}"
    );
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_pre_stop_hooks_time_counts_against_the_grace_period() {
    let case = Case::with_agent("hooks-grace", &[]).await;
    let dir = HostDir::new(&case.pods.label);
    // 6 s of hook, then the 2 s left of the 8 s grace period before SIGKILL (the container
    // ignores SIGTERM): gone after about 8 s. Were the hook's time not counted, 6 s of hook
    // + the whole 8 s = 14 s. The bounds sit 3 s from either answer.
    let lifecycle = json!({
        "preStop": { "exec": { "command": ["sh", "-c", "sleep 6; echo pre-stop >> /hooks/marks"] } }
    });
    let name = case.create("p", sleeper(&dir, lifecycle, 8)).await;
    running(&name).await;
    let started = Instant::now();
    delete_and_wait(&name).await;
    let took = started.elapsed();
    // The hook ran to its end before the kill.
    assert_eq!(dir.marks(), "pre-stop\n");
    assert!(
        took >= Duration::from_millis(7500),
        "the grace period is honoured: {took:?}"
    );
    assert!(
        took < Duration::from_secs(11),
        "the hook's time counts against the grace period: {took:?}"
    );
    eprintln!("preStop 6 s + grace 8 s: gone after {took:?}");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_second_delete_with_a_shorter_grace_shortens_the_termination() {
    let case = Case::with_agent("grace-shorter", &[]).await;
    let dir = HostDir::new(&case.pods.label);
    let name = case.create("p", sleeper(&dir, json!({}), 60)).await;
    running(&name).await;
    let api = common::pods::pods_api().await;
    api.delete(&name, &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    // The agent is now waiting out the 60 s grace period (the container ignores SIGTERM).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(get(&name).await.is_some(), "still terminating");
    let started = Instant::now();
    let shorter = kube::api::DeleteParams {
        grace_period_seconds: Some(1),
        ..Default::default()
    };
    api.delete(&name, &shorter).await.expect("delete again");
    eventually("the pod gone", Duration::from_secs(15), || async {
        get(&name).await.is_none().then_some(())
    })
    .await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    eprintln!("grace 60 s shortened to 1 s: gone {took:?} after the second delete");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_http_pre_stop_hook_of_a_host_network_pod_reaches_its_server_at_the_node_ip() {
    let case = Case::with_agent("hooks-hostnet", &[]).await;
    let port = free_port_on_node_ip();
    // httpd as PID 1 ignores SIGTERM: it serves until the grace period ends.
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 20,
            "containers": [{
                "name": "server",
                "image": "busybox",
                "command": ["httpd", "-f", "-vv", "-p", format!("{NODE_IP}:{port}"), "-h", "/etc"],
                "lifecycle": { "preStop": { "httpGet": { "path": "/hostname", "port": port } } },
            }],
        }
    });
    let name = case.create("p", manifest).await;
    let pod = running(&name).await;
    let uid = pod.metadata.uid.clone().expect("uid");
    let log = case.log_of(&name, &uid, "server");
    common::pods::pods_api()
        .await
        .delete(&name, &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    // While the pod terminates (its log goes with it).
    hook_request_logged(&log, Duration::from_secs(15)).await;
    // Done: no need to wait out the grace period. The hook has ended once the pod is gone
    // (the container is stopped after it), and its failure event, had there been one,
    // was recorded before the stop.
    let now = kube::api::DeleteParams {
        grace_period_seconds: Some(1),
        ..Default::default()
    };
    common::pods::pods_api()
        .await
        .delete(&name, &now)
        .await
        .expect("delete again");
    eventually("the pod gone", Duration::from_secs(30), || async {
        get(&name).await.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failed = event_messages(&name, "FailedPreStopHook").await;
    assert!(failed.is_empty(), "{failed:?}");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_exec_pre_stop_hook_runs_past_the_runtime_request_timeout() {
    // A hook with no timeout of its own used to get the runtime request timeout as its
    // deadline: the 2-minute default, which the kubelet's own flag sets to 10 s here, so
    // a 20 s hook shows what a 10-minute drain under a 600 s grace period would.
    let case = Case::with_agent("hooks-long", &["--runtime-request-timeout=10s"]).await;
    let dir = HostDir::new(&case.pods.label);
    let lifecycle = json!({
        "preStop": { "exec": { "command": [
            "sh", "-c", "echo draining >> /hooks/marks; sleep 20; echo drained >> /hooks/marks"
        ] } }
    });
    let mut manifest = sleeper(&dir, lifecycle, 60);
    // Ends on SIGTERM (so a hook cut short is killed with it, and never leaves its mark).
    manifest["spec"]["containers"][0]["command"] = json!([
        "sh",
        "-c",
        "trap 'exit 0' TERM; while true; do sleep 1; done"
    ]);
    let name = case.create("p", manifest).await;
    running(&name).await;
    let started = Instant::now();
    common::pods::pods_api()
        .await
        .delete(&name, &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    eventually("the pod gone", Duration::from_secs(55), || async {
        get(&name).await.is_none().then_some(())
    })
    .await;
    let took = started.elapsed();
    assert_eq!(dir.marks(), "draining\ndrained\n");
    let failed = event_messages(&name, "FailedPreStopHook").await;
    assert!(failed.is_empty(), "{failed:?}");
    assert!(
        took >= Duration::from_secs(20),
        "the hook ran out: {took:?}"
    );
    eprintln!("a 20 s preStop hook under a 10 s runtime request timeout: gone after {took:?}");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_grace_period_under_2_s_is_raised_to_the_kubelets_minimum() {
    use rkubelet::cri::{Cri as _, api};
    let case = Case::with_agent("grace-minimum", &[]).await;
    let dir = HostDir::new(&case.pods.label);
    // The container notes the kernel's uptime when SIGTERM comes and waits on; its end is
    // the runtime's record of its exit (nanoseconds, read before the agent removes it):
    // the gap between the two is the grace it got. Neither depends on the container's own
    // loop being scheduled on a loaded machine.
    let script = "trap 'cat /proc/uptime > /hooks/term' TERM; while :; do usleep 50000; done";
    let mut manifest = sleeper(&dir, json!({}), 1);
    manifest["spec"]["containers"][0]["command"] = json!(["sh", "-c", script]);
    let name = case.create("p", manifest).await;
    let uid = running(&name).await.metadata.uid.expect("uid");
    let container = common::pods::running_containers_of(&uid)
        .await
        .into_iter()
        .next()
        .expect("the running container")
        .id;
    let exited = tokio::spawn(async move {
        let cri = common::cri();
        loop {
            let status = cri
                .container_status(api::ContainerStatusRequest {
                    container_id: container.clone(),
                    verbose: false,
                })
                .await
                .ok()?
                .status?;
            if status.finished_at > 0 {
                return Some(status.finished_at);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    delete_and_wait(&name).await;
    let finished_ns = exited
        .await
        .expect("the watcher")
        .expect("the container's exit, seen before its removal");
    let term_uptime: f64 = std::fs::read_to_string(dir.0.join("term"))
        .expect("/hooks/term")
        .split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .expect("an uptime");
    // The kernel's uptime now against the wall clock now: the SIGTERM on the wall clock.
    let now_uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .expect("/proc/uptime")
        .split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .expect("an uptime");
    let now_wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64();
    let term_wall = now_wall - (now_uptime - term_uptime);
    #[allow(clippy::cast_precision_loss)]
    let alive_after_term = finished_ns as f64 / 1e9 - term_wall;
    // With the pod's 1 s the kill would come 1 s after SIGTERM; the kubelet's 2 s minimum
    // ends it about 2 s after (half a second allowed for a late trap). Not the default
    // 30 s either: gone within 10 s.
    assert!(
        alive_after_term > 1.5,
        "alive {alive_after_term:.2} s after SIGTERM"
    );
    assert!(
        alive_after_term < 10.0,
        "alive {alive_after_term:.2} s after SIGTERM"
    );
    eprintln!("grace 1 s: alive {alive_after_term:.2} s after SIGTERM");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_http_pre_stop_hook_reaches_the_container_before_it_is_stopped() {
    let case = Case::with_agent("hooks-http-stop", &[]).await;
    let dir = HostDir::new(&case.pods.label);
    // busybox httpd logs each request (-vv, on stderr) into the host dir. The shell (PID 1)
    // notes SIGTERM there too, and waits on: the server stays up until the kill.
    let mut manifest = sleeper(
        &dir,
        json!({ "preStop": { "httpGet": { "path": "/stopping", "port": "web" } } }),
        3,
    );
    manifest["spec"]["containers"][0]["command"] = json!([
        "sh",
        "-c",
        "trap 'echo TERM >> /hooks/marks' TERM; \
         httpd -f -vv -p 8080 -h /etc 2>> /hooks/marks & while true; do wait; done"
    ]);
    manifest["spec"]["containers"][0]["ports"] = json!([{ "name": "web", "containerPort": 8080 }]);
    let name = case.create("p", manifest).await;
    running(&name).await;
    assert!(
        !dir.marks().contains("url:/stopping"),
        "no hook before the deletion"
    );
    delete_and_wait(&name).await;
    let marks = dir.marks();
    let hook = marks.find("url:/stopping");
    let term = marks.find("TERM");
    assert!(
        matches!((hook, term), (Some(h), Some(t)) if h < t),
        "the hook's request, then SIGTERM: {marks}"
    );
    drop(case);
}
