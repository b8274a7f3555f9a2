//! Ephemeral containers end to end, against the local cluster (its API server has the
//! 1.20 `EphemeralContainers` gate on), added as a 1.20 cluster's user adds them: `kubectl
//! alpha debug -i POD --image=busybox --target=app -- sh` (and `kubectl debug -it` without a
//! target) with the v1.20.2 kubectl that scripts/setup.sh builds. It writes the pod's
//! `EphemeralContainers` through `pods/ephemeralcontainers`, waits for the container to
//! run and attaches to it. The machine's kubectl (v1.32) cannot add one to a 1.20 server:
//! it sends a strategic merge patch of a Pod, which a 1.20 server applies to its
//! `EphemeralContainers` kind as a no-op, and then fails to decode the answer (`no kind
//! "EphemeralContainers" is registered`). `kubectl logs` is the machine's.
//!
//! Checked: the debug container starts in the pod's sandbox in its target's PID namespace
//! (`ps` in it shows the target's process), attach carries its input and output (also
//! through a terminal, for one without a target, which sees its own processes only), its
//! status appears in `ephemeralContainerStatuses`, `kubectl logs` reads its log, it is not
//! restarted after it exits, and it goes with the pod.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::case::{Case, delete_and_wait, get, running};
use common::pods::{containers_of, events_of, sleeper};
use common::{eventually, kubectl, kubectl_1_20_command, send_until_answered};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use rkubelet::cri::api;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// What a debug shell answers to [`READY_PROBE`] once its output is attached.
const READY: &str = "ready-5";
const READY_PROBE: &[u8] = b"echo ready-$((2+3))\n";

/// Runs `kubectl debug` (`alpha debug`, as the issue names it, or 1.20's own `debug`) with
/// the v1.20.2 kubectl: adds the ephemeral container `container` (busybox's `sh`, targeting
/// `target` if any) to the pod, waits for it to run and attaches (`-it` in a terminal that
/// `script` provides, when `tty`). Then, as kubectl tells its user ("If you don't see a
/// command prompt, try pressing enter"), waits until the shell answers through the attach
/// before it has the shell run `ps` and exit: the runtime (containerd 1.6) starts copying a
/// new attach's input before it adds its output, so what the shell prints in between goes
/// to the log only. Asserts that kubectl succeeded and answers what came back (the time
/// it took is printed as a figure).
async fn kubectl_debug(
    verb: &[&str],
    pod: &str,
    container: &str,
    target: Option<&str>,
    tty: bool,
) -> String {
    let target = target.map(|t| format!("--target={t}"));
    let mut args = verb.to_vec();
    args.extend([
        if tty { "-it" } else { "-i" },
        pod,
        "--image=busybox",
        "-c",
        container,
    ]);
    args.extend(target.as_deref());
    args.extend(["--", "sh"]);
    let debug = kubectl_1_20_command(&args);
    let mut debug = if tty { in_terminal(&debug) } else { debug };
    let started = std::time::Instant::now();
    let mut child = debug
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl runs");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let stderr = tokio::spawn(async move {
        let mut text = Vec::new();
        stderr.read_to_end(&mut text).await.map(|_| text)
    });
    let mut seen = Vec::new();
    let attached = send_until_answered(
        &mut stdin,
        &mut stdout,
        READY_PROBE,
        READY,
        &mut seen,
        Duration::from_secs(60),
    )
    .await;
    if attached.is_err() {
        let _ = child.start_kill();
        let stderr = stderr.await.expect("stderr task").unwrap_or_default();
        panic!(
            "kubectl {args:?}: the debug shell answers through the attach within 60 s \
             ({attached:?}):\n{}\nstderr: {}",
            String::from_utf8_lossy(&seen),
            String::from_utf8_lossy(&stderr)
        );
    }
    stdin
        .write_all(b"ps -o pid,args; echo $((6*7))-done; exit 0\n")
        .await
        .expect("write to kubectl");
    let finished = tokio::time::timeout(Duration::from_secs(90), async {
        stdout.read_to_end(&mut seen).await?;
        child.wait().await
    })
    .await
    .expect("kubectl debug ends within 90 s")
    .expect("kubectl debug's output and exit");
    drop(stdin);
    eprintln!(
        "FIGURE kubectl {} {container} (add, run, attach, ps, exit): {:?}",
        verb.join(" "),
        started.elapsed()
    );
    let stderr = stderr
        .await
        .expect("stderr task")
        .expect("kubectl's stderr");
    let text = format!(
        "{}\nstderr: {}",
        String::from_utf8_lossy(&seen),
        String::from_utf8_lossy(&stderr)
    );
    assert!(
        finished.success() && !text.contains("falling back to logs"),
        "kubectl {args:?} attaches and succeeds ({finished}):\n{text}"
    );
    text
}

/// `cmd` run in a terminal that `script` provides, as a user's shell gives kubectl one.
fn in_terminal(cmd: &tokio::process::Command) -> tokio::process::Command {
    let cmd = cmd.as_std();
    let line: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect();
    let mut script = tokio::process::Command::new("script");
    script.args(["-qec", &line.join(" "), "/dev/null"]);
    script
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn kubectl_debug_targets_a_container_and_the_debugger_runs_once() {
    // Fails at once, with what to run, when scripts/setup.sh has not built it.
    common::kubectl_1_20();
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

    // As the user: `kubectl alpha debug -i POD --image=busybox --target=app -- sh`
    // (named, for the checks below); the shell's `ps` comes back through the attach stream.
    let out = kubectl_debug(&["alpha", "debug"], &name, "debugger", Some("app"), false).await;
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

    // `kubectl debug -it` (1.20's own name) without a target: a terminal, and the shell's
    // own PID namespace (the target's process is not there).
    let out = kubectl_debug(&["debug"], &name, "shell", None, true).await;
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
