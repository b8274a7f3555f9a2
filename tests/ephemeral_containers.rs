//! Ephemeral containers end to end, against the local cluster (its API server has the
//! 1.20 `EphemeralContainers` gate on): the debug container starts in the pod's sandbox in
//! its target's PID namespace (`ps` in it shows the target's process), `kubectl attach`
//! carries its input and output (also through a terminal, as `kubectl debug -it`, for one
//! without a target, which sees its own processes only), its status appears in
//! `ephemeralContainerStatuses`, `kubectl logs` reads its log, it is not restarted after it
//! exits, and it goes with the pod.
//!
//! The container is added as `kubectl debug` adds it, through the API directly: the
//! machine's kubectl (v1.32) sends a strategic merge patch of a Pod to
//! `pods/ephemeralcontainers`, which a 1.20 server applies to its `EphemeralContainers`
//! kind as a no-op, and then fails to decode the answer (`no kind "EphemeralContainers" is
//! registered`) without falling back to its pre-1.22 JSON patch. The test sends that JSON
//! patch itself.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::case::{Case, delete_and_wait, get, running};
use common::pods::{containers_of, events_of, sleeper};
use common::{eventually, kube_client, kubectl, kubectl_command};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use rkubelet::cri::api;
use serde_json::json;
use tokio::io::AsyncWriteExt;

/// What the target runs: a process the debug container can only see in its namespace.
const TARGET_PROCESS: &str = "sleep 3601";

fn debugger_status(p: &Pod) -> Option<ContainerStatus> {
    let statuses = p.status.as_ref()?.ephemeral_container_statuses.as_ref()?;
    statuses.iter().find(|s| s.name == "debugger").cloned()
}

/// The names of the pod's containers in the runtime, with their attempts.
async fn runtime_containers(uid: &str) -> Vec<(String, u32)> {
    let mut names: Vec<(String, u32)> = containers_of(uid, None)
        .await
        .into_iter()
        .filter_map(|c: api::Container| c.metadata.map(|m| (m.name, m.attempt)))
        .collect();
    names.sort();
    names
}

/// What the debug shells print last: computed, so that a terminal's echo of the input
/// does not show it.
const DONE: &str = "42-done";

/// Waits for the ephemeral container just added to run (the time is printed as a figure),
/// then attaches to its shell with `kubectl
/// attach -i` (`-it` in a terminal that `script` provides, when `tty`), has it run `ps`
/// and exit; answers what came back.
async fn debug_shell(pod: &str, container: &str, tty: bool) -> String {
    let added = std::time::Instant::now();
    eventually(
        &format!("{pod}: {container} running"),
        Duration::from_secs(30),
        || async {
            let p = get(pod).await?;
            let statuses = p.status?.ephemeral_container_statuses?;
            let s = statuses.into_iter().find(|s| s.name == container)?;
            s.state?.running.map(|_| ())
        },
    )
    .await;
    eprintln!(
        "FIGURE ephemeral container {container} added -> running (200 ms polls): {:?}",
        added.elapsed()
    );
    let mut attach = if tty {
        let kubeconfig = common::state_dir().join("pki/admin.kubeconfig");
        let kubectl = format!(
            "kubectl --kubeconfig {} attach -it {pod} -c {container}",
            kubeconfig.display()
        );
        let mut cmd = tokio::process::Command::new("script");
        cmd.args(["-qec", &kubectl, "/dev/null"]);
        cmd
    } else {
        kubectl_command(&["attach", pod, "-c", container, "-i"])
    };
    let mut child = attach
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl runs");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(b"ps -o pid,args; echo $((6*7))-done; exit 0\n")
        .await
        .expect("write to kubectl");
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("kubectl attach ends within 60 s")
        .expect("kubectl attach output");
    drop(stdin);
    format!(
        "{}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Adds an ephemeral container to the pod through `pods/ephemeralcontainers`, with the JSON
/// patch kubectl's pre-1.22 path sends (a 1.20 server answers with its `EphemeralContainers`
/// kind).
async fn add_ephemeral_container(pod: &str, container: serde_json::Value) {
    let patch = json!([{ "op": "add", "path": "/ephemeralContainers/-", "value": container }]);
    let request = hyper::Request::patch(format!(
        "/api/v1/namespaces/default/pods/{pod}/ephemeralcontainers"
    ))
    .header("Content-Type", "application/json-patch+json")
    .body(patch.to_string().into_bytes())
    .expect("a request");
    let answer = kube_client("admin.kubeconfig")
        .await
        .request_text(request)
        .await
        .unwrap_or_else(|e| panic!("adding the ephemeral container: {e}"));
    assert!(answer.contains("\"EphemeralContainers\""), "{answer}");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn kubectl_debug_targets_a_container_and_the_debugger_runs_once() {
    let case = Case::with_agent("ephem", &[]).await;
    let name = case
        .create(
            "target",
            sleeper(json!({ "containers": [{
                "name": "app",
                "image": "busybox",
                "command": ["sh", "-c", format!("exec {TARGET_PROCESS}")],
            }] })),
        )
        .await;
    let pod = running(&name).await;
    let uid = pod.metadata.uid.clone().expect("a uid");

    // What `kubectl debug -i POD --image=busybox --target=app -- sh` adds, sent as its
    // pre-1.22 path does (the machine's kubectl cannot: see the module comment).
    add_ephemeral_container(
        &name,
        json!({
            "name": "debugger",
            "image": "busybox",
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh"],
            "stdin": true,
            "terminationMessagePolicy": "File",
            "targetContainerName": "app",
        }),
    )
    .await;
    // As kubectl debug -i: wait for it to run, then attach; the shell's `ps` comes back
    // through the attach stream.
    let out = debug_shell(&name, "debugger", false).await;
    assert!(
        out.contains(TARGET_PROCESS) && out.contains(DONE),
        "the debug shell's ps through attach shows the target's process:\n{out}"
    );

    // Its status: it ran and ended, in the spec's ephemeral containers.
    let pod = eventually(
        &format!("{name}: the debugger's terminated status"),
        Duration::from_secs(20),
        || async {
            let p = get(&name).await?;
            let s = debugger_status(&p)?;
            s.state.as_ref()?.terminated.as_ref()?;
            Some(p)
        },
    )
    .await;
    let status = debugger_status(&pod).expect("its status");
    let terminated = status.state.as_ref().unwrap().terminated.clone().unwrap();
    assert_eq!(
        (terminated.exit_code, terminated.reason.as_deref()),
        (0, Some("Completed"))
    );
    assert_eq!((status.restart_count, status.ready), (0, false));
    assert!(status.container_id.is_some(), "{status:?}");
    let spec = pod.spec.as_ref().unwrap();
    let ephemeral = spec.ephemeral_containers.as_ref().expect("in the spec");
    assert_eq!(ephemeral[0].target_container_name.as_deref(), Some("app"));

    // Its log, through the kubelet API.
    let log = kubectl(&["logs", &name, "-c", "debugger"]).await;
    assert!(log.contains(TARGET_PROCESS), "log: {log}");

    // The kubelet's events name it by its own field path.
    let started = events_of(&name).await.into_iter().any(|e| {
        e.reason.as_deref() == Some("Started")
            && e.involved_object.field_path.as_deref() == Some("spec.ephemeralContainers{debugger}")
    });
    assert!(
        started,
        "a Started event for spec.ephemeralContainers{{debugger}}"
    );

    // `kubectl debug -it` without a target: a terminal, and the shell's own PID namespace
    // (the target's process is not there).
    add_ephemeral_container(
        &name,
        json!({
            "name": "shell",
            "image": "busybox",
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh"],
            "stdin": true,
            "tty": true,
            "terminationMessagePolicy": "File",
        }),
    )
    .await;
    let out = debug_shell(&name, "shell", true).await;
    assert!(
        out.contains(DONE) && !out.contains(TARGET_PROCESS),
        "the untargeted shell's ps through a terminal shows its own processes only:\n{out}"
    );

    // Never restarted: one run of each in the runtime, a while after they ended; the app
    // container still runs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        runtime_containers(&uid).await,
        [
            ("app".to_owned(), 0),
            ("debugger".to_owned(), 0),
            ("shell".to_owned(), 0)
        ]
    );
    let pod = get(&name).await.expect("the pod");
    let status = debugger_status(&pod).expect("its status");
    assert!(status.state.unwrap().terminated.is_some());
    assert_eq!(status.restart_count, 0);

    // It goes with the pod.
    delete_and_wait(&name).await;
    eventually(
        "the pod's containers gone from the runtime",
        Duration::from_secs(20),
        || async { runtime_containers(&uid).await.is_empty().then_some(()) },
    )
    .await;
    drop(case);
}
