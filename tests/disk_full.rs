//! A full disk under the agent's root dir and pod logs dir (a 16 MiB tmpfs): the node
//! reports DiskPressure, new pods are refused as the kubelet's eviction manager refuses
//! them (`Evicted`, "The node had condition: [DiskPressure]. "), the pod already running
//! is evicted as the kubelet evicts it (`Evicted`, "The node was low on resource:
//! ephemeral-storage. "), nothing panics, and once space returns the condition clears
//! and a new pod runs.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::agent::{AgentProcess, Owner};
use common::case::get;
use common::pods::{TestPods, events_of};
use common::{eventually, node_condition, node_name, state_dir, unique};

/// A tmpfs mounted for the test, lazily unmounted (and its dir removed) when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&dir).expect("mount point");
        nix::mount::mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(format!("size={size},mode=0755").as_str()),
        )
        .expect("mount a tmpfs");
        Self(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Writes `path` until the filesystem is full; the bytes written.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).expect("filler");
    let block = vec![0x5au8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match file.write(&block) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = file.sync_all();
    written
}

async fn disk_pressure() -> Option<bool> {
    node_condition("DiskPressure").await
}

fn logger() -> serde_json::Value {
    serde_json::json!({
        "metadata": {},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": "busybox",
                "command": ["sh", "-c", "while true; do echo a line of log to fill the disk with; sleep 0.1; done"],
            }]
        }
    })
}

async fn create(pods: &TestPods, suffix: &str) -> String {
    let name = format!("{}-{suffix}", pods.label);
    let mut manifest = logger();
    manifest["metadata"]["name"] = name.clone().into();
    pods.create(&node_name(), manifest).await;
    name
}

/// The pod's phase and its container's restart count, once it has a container status.
async fn phase_and_restarts(name: &str) -> Option<(String, i32)> {
    let status = get(name).await?.status?;
    let restarts = status
        .container_statuses
        .as_ref()
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count);
    Some((status.phase?, restarts))
}

async fn running(name: &str, timeout: Duration) {
    eventually(&format!("{name} Running"), timeout, || async {
        let (phase, _) = phase_and_restarts(name).await?;
        (phase == "Running").then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_full_disk_is_disk_pressure_refuses_new_pods_and_recovers() {
    let root = state_dir().join("test-agents").join(unique("diskfull"));
    let _tmpfs = Tmpfs::mount(root.clone(), "16m");
    let agent = AgentProcess::start_with_args(
        Owner::Agent,
        &node_name(),
        root.clone(),
        &["--eviction-pressure-transition-period", "5s"],
    );
    let pods = TestPods::new(&unique("diskfull"), root.clone());
    let steady = create(&pods, "steady").await;
    running(&steady, Duration::from_secs(90)).await;
    eventually("no DiskPressure", Duration::from_secs(30), || async {
        (disk_pressure().await == Some(false)).then_some(())
    })
    .await;

    // Full: the root dir and the logs dir in it.
    let filler = root.join("filler");
    let written = tokio::task::spawn_blocking({
        let filler = filler.clone();
        move || fill(&filler)
    })
    .await
    .expect("fill");
    let full_at = Instant::now();
    eventually("DiskPressure", Duration::from_secs(60), || async {
        (disk_pressure().await == Some(true)).then_some(())
    })
    .await;
    let pressure_after = full_at.elapsed();
    // Admission reads the eviction manager's own conditions, from passes of its own.
    eventually(
        "the eviction manager holding DiskPressure",
        Duration::from_secs(30),
        || async { agent.eviction_manager_holds("DiskPressure").then_some(()) },
    )
    .await;

    // A new pod is refused as the kubelet refuses it.
    let refused = create(&pods, "refused").await;
    let pod = eventually("the new pod Failed", Duration::from_secs(60), || async {
        get(&refused)
            .await
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
    })
    .await;
    let status = pod.status.expect("status");
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod The node had condition: [DiskPressure]. ")
    );
    let events = eventually("the Evicted event", Duration::from_secs(20), || async {
        let events = events_of(&refused).await;
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("Evicted"))
            .then_some(events)
    })
    .await;
    let event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Evicted"))
        .expect("event");
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    // The running pod is evicted (its writable layer and log are over its request of
    // none), and the agent lives.
    let evicted = eventually(
        "the running pod evicted",
        Duration::from_secs(60),
        || async {
            get(&steady)
                .await
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
        },
    )
    .await;
    let status = evicted.status.expect("status");
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("The node was low on resource: ephemeral-storage. ")),
        "{status:?}"
    );
    assert!(
        nix::sys::signal::kill(agent.pid(), None).is_ok(),
        "the agent died: {}",
        agent.log_tail()
    );

    // Space returns: the condition clears and a new pod runs.
    std::fs::remove_file(&filler).expect("remove the filler");
    let freed_at = Instant::now();
    eventually("DiskPressure cleared", Duration::from_secs(60), || async {
        (disk_pressure().await == Some(false)).then_some(())
    })
    .await;
    eventually(
        "the eviction manager no longer holding DiskPressure",
        Duration::from_secs(60),
        || async { (!agent.eviction_manager_holds("DiskPressure")).then_some(()) },
    )
    .await;
    let cleared_after = freed_at.elapsed();
    let after = create(&pods, "after").await;
    running(&after, Duration::from_secs(90)).await;
    let recovered_after = freed_at.elapsed();
    let log = std::fs::read_to_string(&agent.log).expect("agent log");
    assert!(!log.contains("panicked"), "{}", agent.log_tail());
    eprintln!(
        "full disk ({} MiB filler): DiskPressure after {pressure_after:?}; space back: \
         condition cleared after {cleared_after:?}, a new pod Running after {recovered_after:?}",
        written >> 20
    );
    drop(pods);
    drop(agent);
}
