//! CSI node plugins against the local cluster: the test's host-path CSI driver
//! (`examples/csi-hostpath-driver.rs`) registers through `<root>/plugins_registry`, the
//! node's CSINode lists it, an inline CSI volume is published into a pod and seen in its
//! container, an agent killed mid-pod and started again neither publishes it twice nor
//! leaks a mount, and the pod deleted while the agent is down is unpublished after its next
//! start; the driver's going deregisters it.
//! A claim of the driver's StorageClass (a PV the test makes, pre-bound) is staged at the
//! kubelet's global mount, published, measured with `NodeGetVolumeStats` and unstaged.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use common::case::{Case, delete_and_wait, root_dir, running};
use common::leaks::mounts_under;
use common::pods::{exec_in, pods_api, sleeper};
use common::{eventually, kube_client, node_name};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kube::api::{Api, DeleteParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

/// The annotation with the drivers' node IDs.
const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// The test driver, started by the test and ended by its PID (SIGTERM).
struct Driver {
    child: Option<Child>,
    state: PathBuf,
}

impl Driver {
    fn start(name: &str, extra: &[&str]) -> Self {
        // The example is built by `cargo test` beside the test binaries' `deps` dir.
        let exe = std::env::current_exe().expect("test binary");
        let bin = exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .join("examples")
            .join("csi-hostpath-driver");
        assert!(
            bin.exists(),
            "{} is not built (cargo test builds it)",
            bin.display()
        );
        let state = common::state_dir().join("csi-driver").join(name);
        let _ = std::fs::remove_dir_all(&state);
        let child = Command::new(&bin)
            .args(["--name", name, "--node-id", &node_name()])
            .arg("--root-dir")
            .arg(root_dir())
            .arg("--state-dir")
            .arg(&state)
            .args(extra)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        Self {
            child: Some(child),
            state,
        }
    }

    /// The driver's call log, one call a line.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.state.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn count(&self, prefix: &str) -> usize {
        self.calls()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    /// SIGTERM to the recorded PID, then wait for it.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The node's turn with the test driver, started once the turn is taken (so that no other
/// test's agent registers it); when dropped, the case's pods go first, while the driver
/// still runs to unpublish their volumes, then the driver.
struct DriverCase {
    case: Case,
    driver: Driver,
}

impl DriverCase {
    async fn new(prefix: &str, name: &str, extra: &[&str]) -> Self {
        let case = Case::new(prefix).await;
        let driver = Driver::start(name, extra);
        Self { case, driver }
    }
}

async fn csi_node() -> Option<CSINode> {
    Api::<CSINode>::all(kube_client("admin.kubeconfig").await)
        .get_opt(&node_name())
        .await
        .expect("reading the CSINode")
}

async fn node_ids() -> serde_json::Value {
    let node = Api::<Node>::all(kube_client("admin.kubeconfig").await)
        .get(&node_name())
        .await
        .expect("reading the node");
    node.metadata
        .annotations
        .and_then(|a| a.get(NODE_ID_ANNOTATION).cloned())
        .map_or(json!({}), |v| serde_json::from_str(&v).expect("a JSON map"))
}

/// Deletes one object the test made, through a client of the clean-up's own runtime.
type Deletion = Box<dyn FnOnce(kube::Client) -> BoxFuture<'static, ()> + Send>;

/// The cluster objects a test made, deleted when dropped (the last made first).
#[derive(Default)]
struct Made(Vec<Deletion>);

impl Made {
    /// Creates `manifest` through the API `api` makes from a client.
    async fn create<K>(&mut self, api: fn(kube::Client) -> Api<K>, manifest: serde_json::Value)
    where
        K: kube::Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug + Send + 'static,
    {
        let object: K = serde_json::from_value(manifest).expect("a manifest");
        let name = object.meta().name.clone().expect("a name");
        api(kube_client("admin.kubeconfig").await)
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creating {name}: {e}"));
        self.0.push(Box::new(move |client| {
            Box::pin(async move {
                let _ = api(client).delete(&name, &DeleteParams::default()).await;
            })
        }));
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        let deletions = std::mem::take(&mut self.0);
        common::cleanup_blocking(move || async move {
            let client = kube_client("admin.kubeconfig").await;
            for delete in deletions.into_iter().rev() {
                delete(client.clone()).await;
            }
        });
    }
}

/// The test driver's CSIDriver: no attach, the pod's attributes on publish.
fn csi_driver(name: &str, modes: &[&str]) -> serde_json::Value {
    json!({
        "metadata": { "name": name },
        "spec": { "attachRequired": false, "podInfoOnMount": true, "volumeLifecycleModes": modes },
    })
}

fn mountinfo() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo")
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_csi_driver_registers_publishes_into_a_pod_and_survives_an_agent_restart() {
    // Short: its socket path must fit in a sockaddr_un.
    let name = "hostpath.csi.rkubelet.test".to_owned();
    let mut turn = DriverCase::new("csi", &name, &[]).await;
    let DriverCase { case, driver } = &mut turn;
    let mut made = Made::default();
    made.create(
        Api::<CSIDriver>::all,
        csi_driver(&name, &["Persistent", "Ephemeral"]),
    )
    .await;
    // Trace: a re-set-up of a volume found published says so at trace level only (it
    // runs at every pod sync).
    let trace = [("RUST_LOG", "info,rkubelet::volume::csi=trace")];
    case.start_agent_with(None, &[], &trace);

    // Registration: GetInfo, NodeGetInfo, the CSINode and the node's annotation, then the
    // driver is told.
    let registered = eventually(
        "the CSINode lists the driver",
        Duration::from_secs(30),
        || async {
            csi_node()
                .await?
                .spec
                .drivers
                .into_iter()
                .find(|d| d.name == name)
        },
    )
    .await;
    assert_eq!(registered.node_id, node_name());
    assert_eq!(
        registered.topology_keys,
        Some(vec!["topology.hostpath.csi/node".to_owned()])
    );
    assert_eq!(node_ids().await[&name], json!(node_name()));
    eventually(
        "the driver told it is registered",
        Duration::from_secs(10),
        || async { (driver.count("NotifyRegistrationStatus true") == 1).then_some(()) },
    )
    .await;

    // An inline volume, published into the pod.
    let manifest = sleeper(json!({
        "volumes": [{ "name": "data", "csi": { "driver": name, "volumeAttributes": { "size": "1Mi" } } }],
        "containers": [{
            "name": "main", "image": "busybox", "command": ["sleep", "3600"],
            "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
        }],
    }));
    let pod_name = case.create("inline", manifest).await;
    let pod = running(&pod_name).await;
    let uid = pod.metadata.uid.expect("uid");
    let target = root_dir()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~csi/data/mount");
    let written = exec_in(
        &uid,
        "main",
        vec![
            "sh".into(),
            "-c".into(),
            "echo hello > /data/f && cat /data/f".into(),
        ],
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&written.stdout).trim(),
        "hello",
        "{written:?}"
    );
    let publishes: Vec<String> = driver
        .calls()
        .into_iter()
        .filter(|l| l.starts_with("NodePublishVolume csi-"))
        .collect();
    assert_eq!(publishes.len(), 1, "{publishes:?}");
    assert!(
        publishes[0].ends_with(&target.to_string_lossy().into_owned()),
        "{publishes:?}"
    );
    let handle = publishes[0].split(' ').nth(1).expect("a handle").to_owned();
    let data_file = driver.state.join("volumes").join(&handle).join("f");
    assert_eq!(
        std::fs::read_to_string(&data_file).expect("the driver's volume holds the file"),
        "hello\n"
    );
    let context = driver
        .calls()
        .into_iter()
        .find(|l| l.starts_with("context "))
        .expect("the publish's context");
    for attribute in [
        format!("csi.storage.k8s.io/pod.name={pod_name}"),
        format!("csi.storage.k8s.io/pod.uid={uid}"),
        "csi.storage.k8s.io/ephemeral=true".into(),
        "size=1Mi".into(),
    ] {
        assert!(
            context.contains(&attribute),
            "{attribute} missing in {context}"
        );
    }
    let vol_data: serde_json::Value = serde_json::from_slice(
        &std::fs::read(target.parent().expect("volume dir").join("vol_data.json"))
            .expect("vol_data.json"),
    )
    .expect("JSON");
    assert_eq!(vol_data["driverName"], json!(name));
    assert_eq!(vol_data["volumeLifecycleMode"], json!("Ephemeral"));
    assert_eq!(vol_data["volumeHandle"], json!(handle));

    // A crash mid-pod, then a new start: the driver registers again, the volume is found
    // published (no second NodePublishVolume, one mount).
    case.crash_agent();
    case.start_agent_with(None, &[], &trace);
    eventually(
        "the driver registered again",
        Duration::from_secs(30),
        || async { (driver.count("NotifyRegistrationStatus true") == 2).then_some(()) },
    )
    .await;
    eventually(
        "the restarted agent found the volume published",
        Duration::from_secs(60),
        || async {
            let log = case.agent().this_runs_log().unwrap_or_default();
            log.contains("already published").then_some(())
        },
    )
    .await;
    assert_eq!(driver.count("NodePublishVolume"), 1, "{:?}", driver.calls());
    let mounts = mounts_under(&mountinfo(), &target);
    assert_eq!(mounts.len(), 1, "one mount at the target: {mounts:?}");
    let read = exec_in(&uid, "main", vec!["cat".into(), "/data/f".into()]).await;
    assert_eq!(String::from_utf8_lossy(&read.stdout), "hello\n");

    // The pod deleted while the agent is down: the next start tears it down through the
    // driver (from its vol_data.json); the driver's data stays.
    case.crash_agent();
    let pods = Api::<Pod>::namespaced(kube_client("admin.kubeconfig").await, "default");
    pods.delete(
        &pod_name,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("deleting the pod");
    assert_eq!(driver.count("NodeUnpublishVolume"), 0);
    case.start_agent_with(None, &[], &trace);
    eventually(
        "the volume unpublished",
        Duration::from_secs(30),
        || async { (driver.count("NodeUnpublishVolume") == 1).then_some(()) },
    )
    .await;
    let pod_dir = root_dir().join("pods").join(&uid);
    eventually(
        "no mount left of the pod",
        Duration::from_secs(30),
        || async {
            mounts_under(&mountinfo(), &pod_dir)
                .is_empty()
                .then_some(())
        },
    )
    .await;
    assert!(data_file.exists(), "the volume's data was removed");

    // The driver goes: its registration socket with it, and the node forgets it.
    driver.stop();
    eventually(
        "the CSINode no longer lists the driver",
        Duration::from_secs(30),
        || async {
            let listed = csi_node()
                .await
                .is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == name));
            (!listed).then_some(())
        },
    )
    .await;
    assert!(node_ids().await.get(&name).is_none());
    let _ = std::fs::remove_dir_all(&driver.state);
}

/// `NodeGetVolumeStats` figures no statvfs gives (a capacity that is no multiple of a
/// block), which the test driver answers with `--stats`: seen in the summary and the
/// gauges, they can only have come from the agent's call.
const DRIVER_STATS: [u64; 6] = [
    7_777_777_777,
    1_234_567_891,
    6_543_209_886,
    424_242,
    420_000,
    4_242,
];

fn driver_stats_flag() -> String {
    DRIVER_STATS.map(|v| v.to_string()).join(",")
}

/// The test driver's CSIDriver, its class, a PV of `handle` pre-bound to a claim, and the
/// claim: their names (class, PV, claim).
async fn claim_of_driver(made: &mut Made, driver: &str, handle: &str) -> (String, String, String) {
    let suffix = common::unique("csi");
    let (class, pv, claim) = (
        format!("{suffix}-sc"),
        format!("{suffix}-pv"),
        format!("{suffix}-pvc"),
    );
    made.create(Api::<CSIDriver>::all, csi_driver(driver, &["Persistent"]))
        .await;
    made.create(
        Api::<StorageClass>::all,
        json!({ "metadata": { "name": class }, "provisioner": driver, "reclaimPolicy": "Retain" }),
    )
    .await;
    made.create(
        Api::<PersistentVolume>::all,
        json!({
            "metadata": { "name": pv },
            "spec": {
                "capacity": { "storage": "1Gi" },
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": class,
                "claimRef": { "namespace": "default", "name": claim },
                "csi": { "driver": driver, "volumeHandle": handle, "volumeAttributes": { "kind": "test" } },
            },
        }),
    )
    .await;
    made.create(
        |c| Api::<PersistentVolumeClaim>::namespaced(c, "default"),
        json!({
            "metadata": { "name": claim, "namespace": "default" },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "volumeName": pv,
                "resources": { "requests": { "storage": "1Gi" } },
            },
        }),
    )
    .await;
    (class, pv, claim)
}

fn claim_pod(claim: &str) -> serde_json::Value {
    sleeper(json!({
        "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }],
        "containers": [{
            "name": "main", "image": "busybox", "command": ["sleep", "3600"],
            "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
        }],
    }))
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_claim_of_the_csi_drivers_class_is_staged_published_measured_and_unstaged() {
    let name = "staged.csi.rkubelet.test".to_owned();
    let stats = driver_stats_flag();
    let mut turn = DriverCase::new("csi-pvc", &name, &["--stage", "--stats", &stats]).await;
    let DriverCase { case, driver } = &mut turn;
    let mut made = Made::default();
    let handle = common::unique("csi-handle");
    let (_, pv, claim) = claim_of_driver(&mut made, &name, &handle).await;
    case.start_agent(&[]);
    eventually("the driver registered", Duration::from_secs(30), || async {
        (driver.count("NotifyRegistrationStatus true") == 1).then_some(())
    })
    .await;
    let pod_name = case.create("claim", claim_pod(&claim)).await;
    let pod = running(&pod_name).await;
    let uid = pod.metadata.uid.expect("uid");
    let global = root_dir().join(format!("plugins/kubernetes.io/csi/pv/{pv}/globalmount"));
    let target = root_dir().join(format!("pods/{uid}/volumes/kubernetes.io~csi/{pv}/mount"));
    assert_eq!(
        driver
            .calls()
            .into_iter()
            .filter(|l| l.starts_with("Node") && !l.starts_with("NodeGetVolumeStats"))
            .collect::<Vec<_>>(),
        vec![
            format!("NodeStageVolume {handle} {}", global.display()),
            format!("NodePublishVolume {handle} {}", target.display()),
        ]
    );
    let script = "dd if=/dev/zero of=/data/blob bs=1M count=10 2>/dev/null && sync && ls /data";
    let written = exec_in(&uid, "main", vec!["sh".into(), "-c".into(), script.into()]).await;
    assert_eq!(
        String::from_utf8_lossy(&written.stdout).trim(),
        "blob",
        "{written:?}"
    );
    let blob = driver.state.join("volumes").join(&handle).join("blob");
    assert_eq!(
        std::fs::metadata(&blob)
            .expect("the driver's volume holds the file")
            .len(),
        10 << 20
    );
    assert_eq!(mounts_under(&mountinfo(), &global).len(), 1);

    // The agent asks the driver (the stats housekeeping, every 10 s, as the kubelet's
    // volume stats calculator): the driver's figures, which no statvfs gives, are in the
    // summary and the volume gauges, and the driver saw the agent's calls (no one else
    // calls it here).
    let summary_path = format!("/api/v1/nodes/{}/proxy/stats/summary", node_name());
    let volume = eventually(
        "the claim in the summary",
        Duration::from_secs(30),
        || async {
            let text = common::kubectl(&["get", "--raw", &summary_path]).await;
            let summary: serde_json::Value = serde_json::from_str(&text).ok()?;
            summary["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["uid"] == uid.as_str())?["volume"]
                .as_array()?
                .iter()
                .find(|v| v["name"] == "data")
                .cloned()
        },
    )
    .await;
    let [capacity, available, used, inodes, inodes_free, inodes_used] = DRIVER_STATS;
    assert_eq!(
        volume["pvcRef"],
        json!({ "name": claim, "namespace": "default" })
    );
    for (field, value) in [
        ("capacityBytes", capacity),
        ("availableBytes", available),
        ("usedBytes", used),
        ("inodes", inodes),
        ("inodesFree", inodes_free),
        ("inodesUsed", inodes_used),
    ] {
        assert_eq!(volume[field].as_u64(), Some(value), "{field}: {volume}");
    }
    assert!(
        driver
            .calls()
            .iter()
            .any(|l| l == &format!("NodeGetVolumeStats {handle} {}", target.display())),
        "the agent never called NodeGetVolumeStats"
    );
    let metrics_path = format!("/api/v1/nodes/{}/proxy/metrics", node_name());
    let metrics = common::kubectl(&["get", "--raw", &metrics_path]).await;
    let labels = format!("{{namespace=\"default\",persistentvolumeclaim=\"{claim}\"}}");
    for (gauge, value) in [
        ("kubelet_volume_stats_capacity_bytes", capacity),
        ("kubelet_volume_stats_available_bytes", available),
        ("kubelet_volume_stats_used_bytes", used),
        ("kubelet_volume_stats_inodes", inodes),
        ("kubelet_volume_stats_inodes_free", inodes_free),
        ("kubelet_volume_stats_inodes_used", inodes_used),
    ] {
        let line = format!("{gauge}{labels} {value}");
        assert!(metrics.lines().any(|l| l == line), "{line} not on /metrics");
    }

    // The pod goes: unpublished, then unstaged (no other pod uses the volume); the data stays.
    delete_and_wait(&pod_name).await;
    eventually("the volume unstaged", Duration::from_secs(30), || async {
        (driver.count("NodeUnstageVolume") == 1).then_some(())
    })
    .await;
    let node_calls: Vec<String> = driver
        .calls()
        .into_iter()
        .filter(|l| l.starts_with("Node") && !l.starts_with("NodeGetVolumeStats"))
        .collect();
    assert_eq!(
        node_calls[node_calls.len() - 2..],
        [
            format!("NodeUnpublishVolume {handle} {}", target.display()),
            format!("NodeUnstageVolume {handle} {}", global.display()),
        ]
    );
    assert!(mounts_under(&mountinfo(), &global).is_empty());
    assert!(
        !global.parent().expect("pv dir").exists(),
        "the PV's global mount dir is removed"
    );
    assert!(blob.exists(), "the volume's data was removed");
    // Stopped before the case ends: its leak check looks for registration sockets.
    driver.stop();
    let _ = std::fs::remove_dir_all(&driver.state);
}

/// Two pods share one PV, one after the other: each time the running pod is deleted, the
/// next is created as soon as the old one's volume is unpublished, while the driver
/// unstages it (slowly, 1.5 s, as a device detach). The kubelet runs the operations of one
/// volume one at a time: the new pod's set-up waits and stages the volume again, and the
/// driver never sees an unstage under a published pod nor a publish from an unstaged
/// path (rkubelet before issue 46 published from the staging mount being unstaged). Four
/// rounds; each pod sees the volume's data.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_shared_volume_is_never_unstaged_under_a_pod_setting_it_up() {
    let name = "shared.csi.rkubelet.test".to_owned();
    let mut turn = DriverCase::new(
        "csi-shared",
        &name,
        &["--stage", "--unstage-delay-ms", "1500"],
    )
    .await;
    let DriverCase { case, driver } = &mut turn;
    let mut made = Made::default();
    let handle = common::unique("csi-shared");
    let (_, pv, claim) = claim_of_driver(&mut made, &name, &handle).await;
    let data = driver.state.join("volumes").join(&handle);
    std::fs::create_dir_all(&data).expect("the volume's dir");
    std::fs::write(data.join("marker"), "shared\n").expect("a file in the volume");
    case.start_agent(&[]);
    eventually("the driver registered", Duration::from_secs(30), || async {
        (driver.count("NotifyRegistrationStatus true") == 1).then_some(())
    })
    .await;
    let global = root_dir().join(format!("plugins/kubernetes.io/csi/pv/{pv}/globalmount"));
    let mut current = case.create("shared-0", claim_pod(&claim)).await;
    let mut uid = running(&current).await.metadata.uid.expect("uid");
    for round in 1..=4 {
        let unpublished = driver.count("NodeUnpublishVolume");
        pods_api()
            .await
            .delete(&current, &DeleteParams::default())
            .await
            .expect("delete");
        eventually(
            "the old pod's volume unpublished",
            Duration::from_secs(30),
            || async { (driver.count("NodeUnpublishVolume") > unpublished).then_some(()) },
        )
        .await;
        // Now, while the driver unstages it.
        let next = case
            .create(&format!("shared-{round}"), claim_pod(&claim))
            .await;
        let next_uid = running(&next).await.metadata.uid.expect("uid");
        let seen = exec_in(&next_uid, "main", vec!["cat".into(), "/data/marker".into()]).await;
        assert_eq!(
            String::from_utf8_lossy(&seen.stdout),
            "shared\n",
            "round {round}: {seen:?}"
        );
        eventually("the old pod gone", Duration::from_secs(30), || async {
            common::case::get(&current).await.is_none().then_some(())
        })
        .await;
        assert_eq!(
            mounts_under(&mountinfo(), &global).len(),
            1,
            "round {round}: the running pod's volume is staged"
        );
        let violations: Vec<String> = driver
            .calls()
            .into_iter()
            .filter(|l| l.starts_with("VIOLATION"))
            .collect();
        assert!(
            violations.is_empty(),
            "round {round} ({uid} to {next_uid}): {violations:?}"
        );
        (current, uid) = (next, next_uid);
    }
    let stages = driver.count("NodeStageVolume");
    eprintln!(
        "4 rounds: {stages} stages, {} unstages",
        driver.count("NodeUnstageVolume")
    );
    assert_eq!(stages, 5, "staged again for each new pod");
    delete_and_wait(&current).await;
    eventually("the volume unstaged", Duration::from_secs(30), || async {
        (driver.count("NodeUnstageVolume") == 5).then_some(())
    })
    .await;
    assert!(mounts_under(&mountinfo(), &global).is_empty());
    driver.stop();
    let _ = std::fs::remove_dir_all(&driver.state);
}
