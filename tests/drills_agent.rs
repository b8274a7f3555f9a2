//! Reliability drills of the agent itself (issue 16), against the local cluster:
//!
//! - the agent SIGKILLed at each step of a pod's start-up and teardown, through the fault
//!   points of its debug build (`src/fault.rs`, `RKUBELET_FAULT`), then restarted without
//!   the fault: the pod converges (Running with one ready sandbox and the restart count the
//!   kubelet gives, or gone), and no IP reservation, netns, veth or temporary file of the
//!   CNI result cache is left over — not even of a sandbox whose creation the crash cut
//!   short, which the runtime never lists;
//! - a CNI plugin that hangs: the `ADD` times out, the pod gets `FailedCreatePodSandBox`
//!   and is retried, another pod starts meanwhile, and the hung plugin leaves no process.
//!
//! Each drill prints its recovery time (agent restart to convergence).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::case::{Case, get, phase, root_dir, running};
use common::leaks::NodeNetwork;
use common::pods::{event_with_reason, pods_api, sandboxes_of, sleeper};
use common::{eventually, state_dir};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use rkubelet::cri::api::PodSandboxState;
use rkubelet::fault;
use rkubelet::procfs::ProcFs;
use serde_json::json;

const READY: i32 = PodSandboxState::SandboxReady as i32;

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().expect("uid")
}

/// Waits until the agent died, and checks that it was by SIGKILL.
async fn killed_at(case: &mut Case, point: &str) {
    let Some(status) = case.agent_mut().exited(Duration::from_secs(60)).await else {
        panic!(
            "the agent did not crash at {point}:\n{}",
            case.agent().log_tail()
        );
    };
    assert_eq!(
        status.signal(),
        Some(9),
        "the agent ended at {point} with {status}, not SIGKILL:\n{}",
        case.agent().log_tail()
    );
}

/// What the node has of pod networks now, beyond what it had `before`.
fn new_since(before: &NodeNetwork) -> NodeNetwork {
    NodeNetwork::now().since(before)
}

/// Waits up to `timeout` until what the node has of pod networks beyond what it had
/// `before` is `fine`: that, or at the end what it was.
async fn settled(
    before: &NodeNetwork,
    timeout: Duration,
    fine: impl Fn(&NodeNetwork) -> bool,
) -> Result<NodeNetwork, NodeNetwork> {
    let deadline = Instant::now() + timeout;
    loop {
        let new = new_since(before);
        if fine(&new) {
            return Ok(new);
        }
        if Instant::now() >= deadline {
            return Err(new);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the node has no pod network beyond what it had `before`.
async fn nothing_left(before: &NodeNetwork, what: &str) {
    if let Err(left) = settled(before, Duration::from_secs(15), NodeNetwork::is_empty).await {
        panic!("{what} left on the node: {left:?}");
    }
}

/// The agent killed at `point` while it starts a pod, then restarted: the pod runs with
/// one ready sandbox, whose IP is the only one reserved, and `restarts` as its container's
/// restart count; once deleted, nothing of its network is left.
async fn crash_during_start_up(point: &str, restarts: i32) {
    let before = NodeNetwork::now();
    let mut case = Case::new(&format!("drill-{point}")).await;
    case.start_agent_with(None, &[], &[(fault::ENV, point)]);
    let name = case.create("p", sleeper(json!({}))).await;
    killed_at(&mut case, point).await;
    let restarted = Instant::now();
    case.start_agent(&[]);
    let (pod, sandbox) = eventually(
        &format!("{name} Running and ready in one ready sandbox"),
        Duration::from_secs(90),
        || async {
            let pod = get(&name).await.filter(|p| phase(p) == Some("Running"))?;
            let ready = pod
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .all(|c| c.ready);
            let sandboxes = sandboxes_of(&uid(&pod)).await;
            let ready_sandboxes: Vec<_> = sandboxes.iter().filter(|s| s.state == READY).collect();
            (ready && ready_sandboxes.len() == 1)
                .then(|| (pod.clone(), ready_sandboxes[0].id.clone()))
        },
    )
    .await;
    let converged = restarted.elapsed();
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    // A reservation of the crashed attempt is released by the network GC at start-up or
    // by the stop of its sandbox; one 30 s GC period at most.
    let network = settled(&before, Duration::from_secs(40), |new| {
        new.reservations.len() == 1 && new.netns.len() == 1 && new.interfaces.len() == 1
    })
    .await
    .unwrap_or_else(|left| panic!("not one reservation, netns and veth, the pod's: {left:?}"));
    let leak_free = restarted.elapsed();
    let temporaries: Vec<_> = std::fs::read_dir(root_dir().join("cni/results"))
        .expect("the agent's CNI result cache")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| rkubelet::atomic_file::is_temp_name(n))
        .collect();
    assert!(
        temporaries.is_empty(),
        "temporaries of the crash left in the CNI result cache: {temporaries:?}"
    );
    let reservation = network.reservations.first().cloned().unwrap_or_default();
    assert!(
        reservation.ends_with(&format!("/{ip} held by {sandbox}")),
        "the reservation is the pod's: {reservation}, pod IP {ip}, sandbox {sandbox}"
    );
    let statuses = pod
        .status
        .and_then(|s| s.container_statuses)
        .expect("statuses");
    assert_eq!(
        statuses[0].restart_count, restarts,
        "restart count after a crash at {point}"
    );
    eprintln!(
        "drill {point}: Running {converged:?} after the restart, no leftover network after {leak_free:?}"
    );
    common::case::delete_and_wait(&name).await;
    nothing_left(&before, "pod network").await;
}

/// The agent killed at `point` while it tears a deleted pod down, then restarted: the pod
/// leaves the API, its sandboxes go and nothing of its network is left.
async fn crash_during_teardown(point: &str) {
    let before = NodeNetwork::now();
    let mut case = Case::new(&format!("drill-{point}")).await;
    case.start_agent_with(None, &[], &[(fault::ENV, point)]);
    let name = case.create("p", sleeper(json!({}))).await;
    let uid = uid(&running(&name).await);
    assert!(
        case.agent_mut().exited(Duration::ZERO).await.is_none(),
        "the agent crashed before the pod was deleted:\n{}",
        case.agent().log_tail()
    );
    pods_api()
        .await
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    killed_at(&mut case, point).await;
    let restarted = Instant::now();
    case.start_agent(&[]);
    eventually(
        &format!("{name} gone from the API, its sandboxes removed"),
        Duration::from_secs(60),
        || async {
            (get(&name).await.is_none() && sandboxes_of(&uid).await.is_empty()).then_some(())
        },
    )
    .await;
    let converged = restarted.elapsed();
    nothing_left(&before, "pod network").await;
    eprintln!("drill {point}: pod gone {converged:?} after the restart");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_crash_after_run_pod_sandbox_reuses_the_sandbox() {
    crash_during_start_up(fault::AFTER_RUN_POD_SANDBOX, 0).await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_crash_during_cni_add_leaks_no_ip_and_makes_one_sandbox() {
    crash_during_start_up(fault::CNI_ADD, 0).await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_crash_while_caching_the_cni_result_leaves_no_temporary_and_no_ip() {
    // Killed between the cache entry's temporary file and its rename: the restarted agent
    // removes the temporary before it serves.
    crash_during_start_up(fault::CNI_CACHE_WRITE, 0).await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_crash_after_create_container_starts_a_new_one_counted_as_a_restart() {
    // As the kubelet: a container left Created is started anew, with the next count.
    crash_during_start_up(fault::AFTER_CREATE_CONTAINER, 1).await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_crash_during_stop_pod_sandboxs_cni_del_finishes_the_teardown() {
    crash_during_teardown(fault::CNI_DEL).await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_crash_between_the_final_status_and_the_api_delete_deletes_the_pod() {
    crash_during_teardown(fault::BEFORE_POD_DELETE).await;
}

/// A chained CNI plugin, `rk-hang`, after the repository's chain: it passes its
/// `prevResult` on, except that the first `ADD` of a pod whose name ends in `-hang` never
/// answers (its shell waits on a `sleep` of its own). Every call is logged. Its dirs are
/// removed when dropped.
struct HangingPlugin {
    dir: PathBuf,
}

impl HangingPlugin {
    fn new() -> Self {
        let dir = state_dir().join("test-agents").join("drill-hanging-cni");
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["conf", "bin"] {
            std::fs::create_dir_all(dir.join(sub)).expect("plugin dirs");
        }
        let shipped = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/cni-config/10-rkubelet.conflist"
        ))
        .expect("conflist");
        let mut conflist: serde_json::Value = serde_json::from_str(&shipped).expect("JSON");
        conflist["plugins"]
            .as_array_mut()
            .expect("plugins")
            .push(json!({"type": "rk-hang"}));
        std::fs::write(dir.join("conf/10-hang.conflist"), conflist.to_string())
            .expect("write conflist");
        let d = dir.display();
        let script = format!(
            r#"#!/bin/sh
case "$CNI_COMMAND" in
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}}'; exit 0 ;;
esac
conf=$(cat)
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_ARGS" >> {d}/calls
if [ "$CNI_COMMAND" = ADD ]; then
  case "$CNI_ARGS" in
  *K8S_POD_NAME=*-hang\;*)
    if mkdir {d}/hung 2>/dev/null; then
      sleep 3600 &
      echo "$$ $!" > {d}/hung/pids.tmp && mv {d}/hung/pids.tmp {d}/hung/pids
      wait
    fi ;;
  esac
  printf '%s' "$conf" | jq -c '.prevResult + {{cniVersion: .cniVersion}}'
fi
"#
        );
        let plugin = dir.join("bin/rk-hang");
        std::fs::write(&plugin, script).expect("write plugin");
        std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        Self { dir }
    }

    fn conf_dir(&self) -> PathBuf {
        self.dir.join("conf")
    }

    fn bin_dir(&self) -> String {
        self.dir.join("bin").display().to_string()
    }

    /// The PIDs of the hung shell and its `sleep`, once the plugin hangs.
    fn hung(&self) -> Option<Vec<u32>> {
        let text = std::fs::read_to_string(self.dir.join("hung/pids")).ok()?;
        Some(
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect(),
        )
    }

    /// The plugin's calls so far: `<command> <container id> <CNI_ARGS>`.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for HangingPlugin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether process `pid` runs (a zombie does not).
fn alive(pid: u32) -> bool {
    ProcFs::default().running(pid)
}

/// Whether a host-local reservation is held by `container_id`.
fn reserved_by(network: &NodeNetwork, container_id: &str) -> bool {
    network
        .reservations
        .iter()
        .any(|r| r.ends_with(&format!(" held by {container_id}")))
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_hanging_cni_plugin_times_out_is_retried_and_stalls_no_other_pod() {
    let before = NodeNetwork::now();
    let plugin = HangingPlugin::new();
    let mut case = Case::new("drill-cni").await;
    let bin = plugin.bin_dir();
    case.start_agent_with(Some(&plugin.conf_dir()), &["--cni-bin-dir", &bin], &[]);
    let hung = case.create("hang", sleeper(json!({}))).await;
    let pids = eventually("the plugin hangs", Duration::from_secs(60), || async {
        plugin.hung()
    })
    .await;
    let hang_began = Instant::now();
    assert_eq!(pids.len(), 2, "the shell and its sleep: {pids:?}");
    let hung_add = plugin
        .calls()
        .into_iter()
        .find(|c| c.starts_with("ADD ") && c.contains(&format!("K8S_POD_NAME={hung};")))
        .expect("the hung ADD is logged");
    let hung_sandbox = hung_add.split(' ').nth(1).expect("container id").to_owned();

    // Another pod, created while the ADD hangs, starts in normal time.
    let other = case.create("other", sleeper(json!({}))).await;
    running(&other).await;
    let other_took = hang_began.elapsed();
    assert!(
        pids.iter().all(|p| alive(*p)),
        "the ADD still hangs while the other pod started"
    );
    assert!(
        other_took < Duration::from_secs(20),
        "the other pod took {other_took:?}"
    );

    // The plugin gets 60 s; then the pod gets the kubelet's event with the reason.
    let failed = event_with_reason(&hung, "FailedCreatePodSandBox", Duration::from_secs(90)).await;
    let timed_out = hang_began.elapsed();
    let message = failed.message.unwrap_or_default();
    assert!(
        message.starts_with("Failed to create pod sandbox: ")
            && message.contains("no answer within 60s"),
        "{message}"
    );
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    eventually(
        "the hung plugin and its child killed",
        Duration::from_secs(5),
        || async { (!pids.iter().any(|p| alive(*p))).then_some(()) },
    )
    .await;
    assert!(
        !reserved_by(&new_since(&before), &hung_sandbox),
        "the timed-out ADD's IP is released"
    );

    // The retry succeeds (the plugin hangs once), in one sandbox.
    let pod = running(&hung).await;
    let retried = hang_began.elapsed();
    let sandboxes = sandboxes_of(&uid(&pod)).await;
    assert_eq!(
        sandboxes.iter().filter(|s| s.state == READY).count(),
        1,
        "one ready sandbox: {sandboxes:?}"
    );
    let adds = plugin
        .calls()
        .iter()
        .filter(|c| c.starts_with("ADD ") && c.contains(&format!("K8S_POD_NAME={hung};")))
        .count();
    assert!(adds >= 2, "the ADD was retried: {:?}", plugin.calls());
    eprintln!(
        "drill hanging CNI plugin: other pod Running after {other_took:?} of the hang, \
         FailedCreatePodSandBox after {timed_out:?}, retried pod Running after {retried:?}"
    );
    common::case::delete_and_wait(&hung).await;
    common::case::delete_and_wait(&other).await;
    nothing_left(&before, "pod network").await;
}
