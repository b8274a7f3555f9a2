//! Init containers end to end, against the local cluster: they run one at a time, in
//! order, before the app container, which sees what they wrote; a failed one fails a pod
//! that must not restart (the app container never starts) and backs off in a pod that
//! restarts, as the kubelet shows it (`kubectl get pods`: `Init:Error`,
//! `Init:CrashLoopBackOff`). And `restartPolicy: OnFailure` for the app container: a
//! failed run is restarted, a succeeded one is not, and the pod ends Succeeded.

mod common;

use std::time::Duration;

use common::case::{Case, failed, get, running};
use common::eventually;
use common::pods::events_of;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use rkubelet::cri::{Cri, api};
use serde_json::json;

/// A pod whose init containers run `init` (name, shell script) in order and whose app
/// container runs `main`; all share an emptyDir at /work.
fn pod(init: &[(&str, &str)], main: &str, restart_policy: &str) -> serde_json::Value {
    let mount = json!([{ "name": "work", "mountPath": "/work" }]);
    let container = |name: &str, script: &str| {
        json!({
            "name": name,
            "image": "busybox",
            "command": ["sh", "-c", script],
            "volumeMounts": mount,
        })
    };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 1,
            "volumes": [{ "name": "work", "emptyDir": {} }],
            "initContainers": init.iter().map(|(n, s)| container(n, s)).collect::<Vec<_>>(),
            "containers": [container("main", main)],
        }
    })
}

fn init_statuses(p: &Pod) -> Vec<ContainerStatus> {
    p.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.clone())
        .unwrap_or_default()
}

fn condition(p: &Pod, kind: &str) -> Option<String> {
    let conditions = p.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
}

fn waiting_reason(s: &ContainerStatus) -> Option<&str> {
    s.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

/// The STATUS column of `kubectl get pod` (the API server's table printer computes it).
async fn kubectl_status(name: &str) -> String {
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(common::state_dir().join("pki/admin.kubeconfig"))
        .args(["get", "pod", name, "--no-headers"])
        .output()
        .await
        .expect("kubectl runs");
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    line.split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_owned()
}

/// The names of every container the runtime made for the pod.
async fn runtime_container_names(uid: &str) -> Vec<String> {
    common::cri()
        .list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
                ..Default::default()
            }),
        })
        .await
        .expect("ListContainers")
        .containers
        .into_iter()
        .filter_map(|c| c.metadata.map(|m| m.name))
        .collect()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn init_containers_run_in_order_before_the_app_container_which_sees_their_output() {
    let case = Case::with_agent("init-order", &[]).await;
    let name = case
        .create(
            "p",
            pod(
                &[
                    ("first", "echo first >> /work/out"),
                    ("second", "sleep 1; echo second >> /work/out"),
                ],
                "cat /work/out; sleep 3600",
                "Always",
            ),
        )
        .await;
    let pod = running(&name).await;
    let init = init_statuses(&pod);
    assert_eq!(init.len(), 2, "{init:?}");
    for s in &init {
        let done = s.state.as_ref().and_then(|st| st.terminated.as_ref());
        assert_eq!(
            done.and_then(|t| t.reason.as_deref()),
            Some("Completed"),
            "{s:?}"
        );
        assert!(s.ready && s.restart_count == 0, "{s:?}");
    }
    // The second one started after the first had finished.
    let finished = |s: &ContainerStatus| {
        s.state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .and_then(|t| Some((t.started_at.clone()?.0, t.finished_at.clone()?.0)))
            .expect("run times")
    };
    assert!(finished(&init[0]).1 <= finished(&init[1]).0, "{init:?}");
    assert_eq!(condition(&pod, "Initialized").as_deref(), Some("True"));
    eventually("Ready", Duration::from_secs(30), || async {
        let p = get(&name).await?;
        (condition(&p, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;

    // The app container printed what the init containers wrote, in their order.
    let uid = pod.metadata.uid.clone().expect("uid");
    let log = case.log_of(&name, &uid, "main");
    let lines: Vec<String> = eventually("the app container's log", Duration::from_secs(10), || {
        let log = log.clone();
        async move {
            let text = tokio::fs::read_to_string(&log).await.ok()?;
            let lines: Vec<String> = text
                .lines()
                .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
                .collect();
            (lines.len() >= 2).then_some(lines)
        }
    })
    .await;
    assert_eq!(lines, ["first", "second"]);

    // Their events name them as init containers.
    let events = events_of(&name).await;
    let started_init = events.iter().any(|e| {
        e.reason.as_deref() == Some("Started")
            && e.involved_object.field_path.as_deref() == Some("spec.initContainers{second}")
    });
    assert!(started_init, "{events:?}");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_failed_init_container_fails_a_never_restart_pod_without_starting_the_app() {
    let case = Case::with_agent("init-never", &[]).await;
    let name = case
        .create("p", pod(&[("setup", "exit 3")], "sleep 3600", "Never"))
        .await;
    let pod = failed(&name, Duration::from_secs(60)).await;
    let init = &init_statuses(&pod)[0];
    let done = init
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("terminated");
    assert_eq!((done.exit_code, done.reason.as_deref()), (3, Some("Error")));
    let app = &pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    assert_eq!(waiting_reason(app), Some("PodInitializing"), "{app:?}");
    assert_eq!(condition(&pod, "Initialized").as_deref(), Some("False"));
    assert_eq!(kubectl_status(&name).await, "Init:Error");
    // The app container was never created, and nothing runs any more.
    let uid = pod.metadata.uid.clone().expect("uid");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let names = runtime_container_names(&uid).await;
    assert_eq!(names, ["setup"], "only the init container ran");
    assert!(common::pods::running_containers_of(&uid).await.is_empty());
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_failing_init_container_backs_off_in_a_pod_that_restarts() {
    let case = Case::with_agent("init-backoff", &[]).await;
    let name = case
        .create("p", pod(&[("setup", "exit 1")], "sleep 3600", "Always"))
        .await;
    let pod = eventually(
        "the init container in CrashLoopBackOff",
        Duration::from_secs(60),
        || async {
            let p = get(&name).await?;
            let init = init_statuses(&p).into_iter().next()?;
            (init.restart_count >= 1 && waiting_reason(&init) == Some("CrashLoopBackOff"))
                .then_some(p)
        },
    )
    .await;
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    let init = &init_statuses(&pod)[0];
    let last = init
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("the last failure");
    assert_eq!(last.exit_code, 1);
    assert_eq!(kubectl_status(&name).await, "Init:CrashLoopBackOff");
    let uid = pod.metadata.uid.clone().expect("uid");
    assert!(
        !runtime_container_names(&uid)
            .await
            .contains(&"main".to_owned()),
        "the app container never starts"
    );
    let backoff = events_of(&name).await.into_iter().any(|e| {
        e.reason.as_deref() == Some("BackOff")
            && e.involved_object.field_path.as_deref() == Some("spec.initContainers{setup}")
    });
    assert!(backoff, "a BackOff event for the init container");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn on_failure_restarts_a_failed_container_and_not_a_succeeded_one() {
    let case = Case::with_agent("on-failure", &[]).await;
    // The first run fails, the second (which finds its mark in the emptyDir) succeeds.
    let main = "if [ -e /work/failed-once ]; then exit 0; fi; touch /work/failed-once; exit 3";
    let name = case
        .create("p", pod(&[("setup", "true")], main, "OnFailure"))
        .await;
    let pod = eventually(
        &format!("{name} Succeeded"),
        Duration::from_secs(60),
        || async {
            get(&name)
                .await
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
        },
    )
    .await;
    let app = &pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .expect("container statuses")[0];
    assert_eq!(
        app.restart_count, 1,
        "restarted after the failure only: {app:?}"
    );
    let exit = |s: &Option<k8s_openapi::api::core::v1::ContainerState>| {
        s.as_ref()?.terminated.as_ref().map(|t| t.exit_code)
    };
    assert_eq!(exit(&app.last_state), Some(3), "{app:?}");
    assert_eq!(exit(&app.state), Some(0), "{app:?}");
    // The init container, done once, is not run again for the restart.
    assert_eq!(init_statuses(&pod)[0].restart_count, 0);
    // Succeeded is final: nothing runs again.
    let uid = pod.metadata.uid.clone().expect("uid");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(common::pods::running_containers_of(&uid).await.is_empty());
    let again = get(&name).await.expect("pod");
    let restarts = again
        .status
        .and_then(|s| s.container_statuses)
        .map(|c| c[0].restart_count);
    assert_eq!(restarts, Some(1));
    drop(case);
}
