//! Device plugins end to end, against the local cluster, with the test device plugin
//! (`src/bin/sample-device-plugin.rs`, devices backed by files in a temporary directory):
//! it registers 4 devices and the Node shows `example.com/dev: 4`; of three pods asking
//! for 2 each, two run with their device files, devices and env, the third is refused
//! with the kubelet's `UnexpectedAdmissionError`; a device marked unhealthy drops
//! allocatable to 3; after an agent restart the plugin registers again and the running
//! pods keep their devices (the checkpoint); a deleted pod's devices go to the next pod;
//! a plugin that goes leaves capacity with nothing allocatable, and registers again when
//! it starts again. A registration whose endpoint names a socket outside the device
//! plugin directory is refused. A resource patched into the Node's capacity by someone else
//! becomes allocatable, and leaves it with capacity.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::case::{Case, delete_and_wait, failed, root_dir, running};
use common::{cleanup_blocking, eventually, kube_client, node_name, unique};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

const RESOURCE: &str = "example.com/dev";

/// The test device plugin and its devices' directory: when dropped, the plugin is ended
/// by its PID and the directory removed.
struct SamplePlugin {
    child: Option<Child>,
    devices: PathBuf,
}

/// What the device manager leaves on the node, taken away when dropped (after the agent
/// stopped, before the next test's turn: [`Case::clean_up_after_agent`]): the checkpoint, and the resource in the Node's
/// status, so later tests find the node as it was. Nothing else may be left in the
/// device plugin directory (sockets included).
struct NodeCleanup;

impl Drop for NodeCleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(plugin_dir().join("kubelet_internal_checkpoint"));
        let left: Vec<_> = std::fs::read_dir(plugin_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        cleanup_blocking(|| async {
            let patch = json!({ "status": {
                "capacity": { RESOURCE: null },
                "allocatable": { RESOURCE: null },
            }});
            nodes()
                .await
                .patch_status(&node_name(), &PatchParams::default(), &Patch::Merge(patch))
                .await
                .expect("taking the resource out of the Node's status");
        });
        if !std::thread::panicking() {
            assert!(
                left.is_empty(),
                "left in the device plugin directory: {left:?}"
            );
        }
    }
}

impl SamplePlugin {
    fn start(devices: &Path) -> Self {
        std::fs::create_dir_all(devices).expect("devices dir");
        let log = std::fs::File::create(devices.join("plugin.log")).expect("plugin log");
        let child = Command::new(env!("CARGO_BIN_EXE_sample-device-plugin"))
            .arg(plugin_dir())
            .arg(devices)
            .args([RESOURCE, "4", "--pre-start"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the sample device plugin");
        Self {
            child: Some(child),
            devices: devices.to_path_buf(),
        }
    }

    /// Ends the plugin (SIGTERM, by its PID) and waits for it.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
            let _ = kill(pid, Signal::SIGTERM);
            let _ = child.wait();
        }
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.devices.join(name)).unwrap_or_default()
    }

    /// How many times it registered.
    fn registrations(&self) -> usize {
        self.log("plugin.log").matches("registered").count()
    }
}

impl Drop for SamplePlugin {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.devices);
    }
}

fn plugin_dir() -> PathBuf {
    root_dir().join("device-plugins")
}

/// The agent's registration socket, once it is there.
async fn registration_socket() -> PathBuf {
    let socket = plugin_dir().join("kubelet.sock");
    eventually(
        "the registration socket",
        Duration::from_secs(60),
        || async { socket.exists().then_some(()) },
    )
    .await;
    socket
}

async fn nodes() -> Api<Node> {
    Api::all(kube_client("admin.kubeconfig").await)
}

/// The Node's (capacity, allocatable) of the resource.
async fn node_devices() -> (Option<String>, Option<String>) {
    let node = nodes().await.get(&node_name()).await.expect("the node");
    let status = node.status.unwrap_or_default();
    let of = |list: Option<std::collections::BTreeMap<_, _>>| {
        list.and_then(|l| {
            l.get(RESOURCE)
                .map(|q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| q.0.clone())
        })
    };
    (of(status.capacity), of(status.allocatable))
}

async fn node_shows(capacity: &str, allocatable: &str) {
    let want = (Some(capacity.to_owned()), Some(allocatable.to_owned()));
    eventually(
        &format!("Node {RESOURCE} capacity {capacity}, allocatable {allocatable}"),
        Duration::from_secs(30),
        || async {
            let seen = node_devices().await;
            (seen == want).then_some(())
        },
    )
    .await;
}

/// A pod asking for `count` devices, printing what it got, then sleeping.
fn asking(count: u32) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "command": ["sh", "-c",
                    "echo env=$SAMPLE_DEVICES; for f in /sample/*; do echo file=$(cat $f); done; ls /dev/sample-*; sleep 3600"],
                "resources": { "limits": { RESOURCE: count.to_string() } }
            }]
        }
    })
}

/// The device IDs the pod's container printed it got, checked against each other: the
/// env, the mounted files and the device nodes name the same devices.
async fn devices_seen(case: &Case, pod: &Pod) -> Vec<String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let log = case.log_of(&name, &uid, "main");
    let text = eventually(
        &format!("{name} printed its devices"),
        Duration::from_secs(30),
        || async {
            let text = std::fs::read_to_string(&log).ok()?;
            text.contains("/dev/sample-").then_some(text)
        },
    )
    .await;
    let lines: Vec<&str> = text
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .collect();
    let env = lines
        .iter()
        .find_map(|l| l.strip_prefix("env="))
        .unwrap_or_else(|| panic!("no env in {text}"));
    let ids: Vec<String> = env.split(',').map(str::to_owned).collect();
    let files: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("file="))
        .collect();
    let nodes: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("/dev/sample-"))
        .collect();
    assert_eq!(files, ids, "the mounted device files: {text}");
    assert_eq!(nodes, ids, "the device nodes: {text}");
    ids
}

fn checkpoint() -> serde_json::Value {
    let bytes =
        std::fs::read(plugin_dir().join("kubelet_internal_checkpoint")).expect("checkpoint");
    serde_json::from_slice(&bytes).expect("checkpoint JSON")
}

/// The pod UIDs the checkpoint holds devices for.
fn checkpointed_pods() -> Vec<String> {
    let mut uids: Vec<String> = checkpoint()["Data"]["PodDeviceEntries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["PodUID"].as_str().map(str::to_owned))
        .collect();
    uids.sort();
    uids.dedup();
    uids
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs the local cluster (scripts/cluster.sh up)"]
async fn device_plugin_devices_reach_pods_survive_restarts_and_are_freed() {
    let devices = std::env::temp_dir().join(unique("rk-devices"));
    let mut case = Case::new("dp").await;
    case.clean_up_after_agent(NodeCleanup);
    case.start_agent(&[]);
    registration_socket().await;
    let started = Instant::now();
    let mut plugin = SamplePlugin::start(&devices);
    node_shows("4", "4").await;
    eprintln!(
        "plugin started → Node shows 4 devices: {:?}",
        started.elapsed()
    );

    // Two pods get two devices each; the third does not fit and is refused at admission.
    let a = case.create("a", asking(2)).await;
    let a = running(&a).await;
    let b = case.create("b", asking(2)).await;
    let b = running(&b).await;
    let (seen_a, seen_b) = (devices_seen(&case, &a).await, devices_seen(&case, &b).await);
    assert_eq!(seen_a.len(), 2);
    assert_eq!(seen_b.len(), 2);
    assert!(
        seen_a.iter().all(|d| !seen_b.contains(d)),
        "{seen_a:?} {seen_b:?}"
    );
    assert_eq!(
        plugin.log("allocate.log").lines().count(),
        2,
        "one Allocate per container"
    );
    assert_eq!(
        plugin.log("prestart.log").lines().count(),
        2,
        "PreStartContainer, as asked"
    );
    let c = case.create("c", asking(2)).await;
    let c = failed(&c, Duration::from_secs(30)).await;
    let status = c.status.clone().unwrap_or_default();
    assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod Allocate failed due to requested number of devices unavailable for example.com/dev. Requested: 2, Available: 0, which is unexpected"
        )
    );

    // An unhealthy device leaves allocatable.
    let marked = Instant::now();
    std::fs::write(devices.join(format!("{}.unhealthy", seen_b[1])), "").expect("mark");
    node_shows("4", "3").await;
    eprintln!(
        "device marked unhealthy → allocatable 3: {:?}",
        marked.elapsed()
    );

    // The agent restarts: the plugin registers again, the pods keep running with their
    // devices (a new pod finds none free), from the checkpoint.
    let mut held = vec![uid(&a), uid(&b)];
    held.sort();
    assert_eq!(checkpointed_pods(), held);
    let registered = plugin.registrations();
    let restarted = Instant::now();
    case.start_agent(&[]);
    eventually(
        "the plugin registered again",
        Duration::from_secs(60),
        || async { (plugin.registrations() > registered).then_some(()) },
    )
    .await;
    node_shows("4", "3").await;
    eprintln!(
        "agent restarted → plugin registered again, Node 4/3: {:?}",
        restarted.elapsed()
    );
    assert_eq!(checkpointed_pods(), held);
    let d = case.create("d", asking(1)).await;
    let d = failed(&d, Duration::from_secs(30)).await;
    assert!(
        d.status
            .and_then(|s| s.message)
            .is_some_and(|m| m.ends_with("Requested: 1, Available: 0, which is unexpected")),
        "{}",
        case.agent().log_tail()
    );
    for pod in [&a, &b] {
        let now = running(pod.metadata.name.as_deref().unwrap_or_default()).await;
        let restarts = now
            .status
            .and_then(|s| s.container_statuses)
            .map(|c| c[0].restart_count);
        assert_eq!(restarts, Some(0));
    }

    // A deleted pod's devices go to the next pod.
    delete_and_wait(a.metadata.name.as_deref().unwrap_or_default()).await;
    let e = case.create("e", asking(2)).await;
    let e = running(&e).await;
    assert_eq!(devices_seen(&case, &e).await, seen_a, "the freed devices");
    let mut held = vec![uid(&b), uid(&e)];
    held.sort();
    eventually(
        "the checkpoint follows",
        Duration::from_secs(10),
        || async { (checkpointed_pods() == held).then_some(()) },
    )
    .await;

    // The plugin goes: capacity is kept (for the grace period), nothing is allocatable.
    plugin.stop();
    node_shows("4", "0").await;
    // A plugin that starts again registers again (the unhealthy device still marked).
    let again = SamplePlugin::start(&devices);
    node_shows("4", "3").await;
    drop(again);
    drop(plugin);
    drop(case);
}

/// `Register` with each endpoint in turn, from a client on a runtime of its own: its
/// connection is closed when that runtime goes, before the agent is stopped. (One left
/// open on the test's runtime, which is blocked while the agent stops, never answers the
/// server's shutdown, and the agent drops its registration server, socket and all.)
fn register_each(socket: &Path, endpoints: &[&str]) -> Vec<Result<(), tonic::Status>> {
    use hyper_util::rt::TokioIo;
    use rkubelet::cm::devicemanager::api::{
        RegisterRequest, registration_client::RegistrationClient,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let socket = socket.to_owned();
        let channel = tonic::transport::Endpoint::from_static("http://kubelet.local")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = socket.clone();
                async move {
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map(TokioIo::new)
                }
            }))
            .await
            .expect("connecting to the registration socket");
        let mut client = RegistrationClient::new(channel);
        let mut answers = Vec::new();
        for endpoint in endpoints {
            let answer = client
                .register(RegisterRequest {
                    version: "v1beta1".into(),
                    endpoint: (*endpoint).into(),
                    resource_name: RESOURCE.into(),
                    options: None,
                })
                .await;
            answers.push(answer.map(|_| ()));
        }
        answers
    })
}

/// A registration whose endpoint is not a file name in the device plugin directory (an
/// absolute path, `..`, a subdirectory) is refused at `Register` with the kubelet's
/// error, before anything is dialled: the kubelet v1.20 joins it to the directory and
/// dials whatever socket it names (containerd's, here).
#[tokio::test]
#[ignore = "needs the local cluster (scripts/cluster.sh up)"]
async fn a_registration_naming_a_socket_outside_the_plugin_directory_is_refused() {
    let mut case = Case::with_agent("dp-endpoint", &[]).await;
    case.clean_up_after_agent(NodeCleanup);
    let socket = registration_socket().await;
    let endpoints = [
        "/run/containerd/containerd.sock",
        "../../../../run/containerd/containerd.sock",
        "..",
        "sub/plugin.sock",
    ];
    let answers = tokio::task::spawn_blocking(move || register_each(&socket, &endpoints))
        .await
        .expect("the registering thread");
    assert_eq!(answers.len(), endpoints.len());
    for (endpoint, answer) in endpoints.iter().zip(answers) {
        let refused = answer.expect_err(endpoint);
        assert_eq!(
            refused.message(),
            format!(
                "invalid name of device plugin socket: endpoint {endpoint:?} must be a file name in the device plugin directory"
            )
        );
    }
    // Nothing was registered: the node shows no such resource.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(node_devices().await, (None, None));
}

/// A resource someone else patches into the Node's capacity (an operator advertising a
/// node's devices without a plugin; the conformance suite's SchedulerPreemption tests with
/// `scheduling.k8s.io/foo`) is made allocatable by the agent's next status update, and
/// leaves allocatable when it leaves capacity, as the kubelet's `MachineInfo` setter does.
#[tokio::test]
#[ignore = "needs the local cluster (scripts/cluster.sh up)"]
async fn a_resource_patched_into_capacity_becomes_allocatable() {
    let mut case = Case::with_agent("dp-patched", &[]).await;
    case.clean_up_after_agent(NodeCleanup);
    let add = json!({ "status": { "capacity": { RESOURCE: "3" } } });
    eventually(
        "the agent's Node, patched",
        Duration::from_secs(60),
        || async {
            nodes()
                .await
                .patch_status(&node_name(), &PatchParams::default(), &Patch::Merge(&add))
                .await
                .ok()
        },
    )
    .await;
    let added = Instant::now();
    node_shows("3", "3").await;
    eprintln!("patched into capacity → allocatable: {:?}", added.elapsed());
    let remove = json!({ "status": { "capacity": { RESOURCE: null } } });
    nodes()
        .await
        .patch_status(
            &node_name(),
            &PatchParams::default(),
            &Patch::Merge(&remove),
        )
        .await
        .expect("taking the resource out of capacity");
    eventually(
        "the resource gone from allocatable",
        Duration::from_secs(30),
        || async { (node_devices().await == (None, None)).then_some(()) },
    )
    .await;
}
