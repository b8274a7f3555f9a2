//! Taking a live node over from the kubelet v1.20.2, and handing it back, restarting
//! nothing (issue 43). On the host node, the real kubelet (the one `scripts/setup.sh`
//! builds) runs a mixed workload: a Deployment of two pods, each with an init container,
//! two app containers with readiness, liveness and startup probes, env from a ConfigMap,
//! an emptyDir, a Secret volume, a projected volume (service account token, ConfigMap,
//! downward API), and a static pod with its mirror pod. The kubelet stops; rkubelet takes
//! over with the same root dir, static pod path and pod log dir, and starts one more pod
//! (ports, a preStop hook, limits); then the kubelet again, which must read every
//! annotation rkubelet wrote. The kubelet's hash of each container it started is also
//! held against rkubelet's hash of the container's spec.
//! After each swap: the same sandboxes and containers (ids and states), the same restart
//! counts, no `Killing` event, the volumes' mounts not made again (mount ids), the
//! emptyDir's file still there, the static pod under the same UID with the same mirror
//! pod, and every pod Ready again within one readiness period of the new agent's first
//! status; the longest a pod was not Ready is printed for both agents.
//!
//! The node runs without QoS cgroups here (`--cgroups-per-qos=false`, the flags the
//! kubelet runs with on this machine); the kind-style node's swap (tests/kind_node.rs) has
//! them, with the systemd driver. Everything is removed at the end, also on failure: the
//! workload through rkubelet (started in the kubelet's place, or if no agent runs), then
//! the leak check of the pods and their log dirs, then the root dir.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::agent::{AgentProcess, NODE_IP, Owner};
use common::pods::{TestPods, containers_of, is_ready, pods_api, sandboxes_of};
use common::{cleanup_blocking, eventually, kube_client, node_name, retrying, state_dir};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The label of this test's objects (`rk-test=takeover`).
const LABEL: &str = "takeover";
/// The Deployment, ConfigMap and Secret.
const APP: &str = "takeover-web";
/// The static pod's name in its manifest.
const STATIC: &str = "takeover-static";
/// The pod rkubelet starts, for the kubelet to adopt.
const LATE: &str = "takeover-late";
/// The readiness probes' period: a pod is Ready again within it after a swap.
const READINESS_PERIOD: u64 = 5;
/// Where both agents write container logs (the kubelet v1.20.2 cannot be told otherwise).
const POD_LOGS: &str = "/var/log/pods";

/// The real kubelet, started with the flags that work on this machine
/// (`/work/shared/ENVIRONMENT.md`, scripts/bench.sh's `kubelet_cmd`).
struct Kubelet {
    child: Option<Child>,
    log: PathBuf,
}

impl Kubelet {
    fn start(node: &str, root: &Path, manifests: &Path) -> Self {
        let pki = state_dir().join("pki");
        let log = root.with_extension("kubelet.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("kubelet log");
        let arg = |flag: &str, path: &Path| format!("--{flag}={}", path.display());
        let child = Command::new(common::k8s_1_20_binary("kubelet"))
            .arg(arg(
                "kubeconfig",
                &pki.join(format!("node-{node}.kubeconfig")),
            ))
            .args([
                &format!("--hostname-override={node}"),
                &format!("--node-ip={NODE_IP}"),
            ])
            .arg(arg("root-dir", root))
            .arg(arg("pod-manifest-path", manifests))
            .args([
                "--container-runtime=remote",
                "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
                "--cgroup-driver=cgroupfs",
                "--cgroups-per-qos=false",
                "--enforce-node-allocatable=",
                "--fail-swap-on=false",
                "--eviction-hard=",
                "--image-gc-high-threshold=100",
                "--resolv-conf=",
                "--read-only-port=0",
                "--anonymous-auth=false",
                "--make-iptables-util-chains=false",
                "--file-check-frequency=5s",
                &format!("--address={NODE_IP}"),
            ])
            .arg(arg("client-ca-file", &pki.join("ca.crt")))
            .arg(arg(
                "tls-cert-file",
                &pki.join(format!("node-{node}-serving.crt")),
            ))
            .arg(arg(
                "tls-private-key-file",
                &pki.join(format!("node-{node}-serving.key")),
            ))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log fd"))
            .stderr(out)
            .spawn()
            .expect("start the kubelet");
        Self {
            child: Some(child),
            log,
        }
    }

    /// SIGTERM, as `systemctl stop kubelet`; it must be gone within 15 s, and must not
    /// have exited before.
    fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the kubelet exited by itself with {status}\n{}",
                self.tail()
            );
        }
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        kill(pid, Signal::SIGTERM).expect("SIGTERM to the kubelet");
        let deadline = Instant::now() + Duration::from_secs(15);
        while child.try_wait().expect("waiting for the kubelet").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the kubelet did not exit within 15 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The node's agent of the moment.
enum Agent {
    Kubelet(Kubelet),
    Rkubelet(AgentProcess),
}

impl Agent {
    fn stop(self) {
        match self {
            Self::Kubelet(k) => k.stop(),
            Self::Rkubelet(a) => a.stop(),
        }
    }
}

/// The node of the test: its dirs, its agent, the workload, and the clean-up of all of
/// them, also when the test fails half-way.
struct Node {
    name: String,
    root: PathBuf,
    manifests: PathBuf,
    agent: Option<Agent>,
    pods: Option<TestPods>,
    /// The UIDs of the test's pods seen so far (API and runtime), for their log dirs.
    uids: BTreeSet<String>,
}

impl Node {
    fn new() -> Self {
        let dir = state_dir().join("takeover");
        let _ = std::fs::remove_dir_all(&dir);
        let (root, manifests) = (dir.join("root"), dir.join("manifests"));
        std::fs::create_dir_all(&root).expect("root dir");
        std::fs::create_dir_all(&manifests).expect("manifest dir");
        Self {
            name: node_name(),
            pods: Some(TestPods::new(LABEL, root.clone())),
            root,
            manifests,
            agent: None,
            uids: BTreeSet::new(),
        }
    }

    fn start_kubelet(&mut self) {
        assert!(self.agent.is_none());
        self.agent = Some(Agent::Kubelet(Kubelet::start(
            &self.name,
            &self.root,
            &self.manifests,
        )));
    }

    fn start_rkubelet(&mut self) {
        assert!(self.agent.is_none());
        let manifests = self.manifests.display().to_string();
        self.agent = Some(Agent::Rkubelet(AgentProcess::start_with_args(
            Owner::Runtime,
            &self.name,
            self.root.clone(),
            &[
                "--cgroups-per-qos=false",
                "--pod-manifest-path",
                &manifests,
                "--file-check-frequency",
                "5s",
                "--pod-logs-dir",
                POD_LOGS,
            ],
        )));
    }

    /// What runs now ([`snapshot`]); the pods' UIDs are kept for the clean-up's check.
    async fn snapshot(&mut self) -> Snapshot {
        let now = snapshot(&self.root).await;
        for (api, runtime) in now.pods.values() {
            self.uids.extend([api.clone(), runtime.clone()]);
        }
        now
    }

    fn stop_agent(&mut self) {
        self.agent.take().expect("an agent runs").stop();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.root.with_extension("kubelet.log"));
            let text = log.unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "---- the kubelet's log, last lines:\n{}",
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
        let _ = std::fs::remove_file(self.manifests.join(format!("{STATIC}.yaml")));
        // The pods go through rkubelet, started in the kubelet's place if the kubelet runs
        // (it would leave the static pod's dead sandbox and container, and the deleted
        // pods' log dirs, to its garbage collection a minute later), and if no agent runs
        // (a failure half-way).
        if let Some(Agent::Kubelet(kubelet)) = self
            .agent
            .take_if(|agent| matches!(agent, Agent::Kubelet(_)))
        {
            if std::thread::panicking() {
                drop(kubelet);
            } else {
                kubelet.stop();
            }
        }
        if self.agent.is_none() {
            self.start_rkubelet();
        }
        cleanup_blocking(|| async {
            let client = kube_client("admin.kubeconfig").await;
            let gone = DeleteParams::background();
            let _ = Api::<Deployment>::namespaced(client.clone(), "default")
                .delete(APP, &gone)
                .await;
        });
        // The leak check's failure is raised once the rest is cleaned up.
        let pods = self.pods.take();
        let leak_check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(pods)));
        if let Some(agent) = self.agent.take() {
            agent.stop();
        }
        // The pods' log dirs (in the node's pod log dir, not the test's own).
        let logs_left: Vec<PathBuf> = std::fs::read_dir(POD_LOGS)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.rsplit_once('_')
                    .is_some_and(|(_, uid)| self.uids.contains(uid))
            })
            .map(|e| e.path())
            .collect();
        for dir in &logs_left {
            let _ = std::fs::remove_dir_all(dir);
        }
        cleanup_blocking(|| async {
            let client = kube_client("admin.kubeconfig").await;
            let _ = Api::<ConfigMap>::namespaced(client.clone(), "default")
                .delete(APP, &DeleteParams::default())
                .await;
            let _ = Api::<Secret>::namespaced(client, "default")
                .delete(APP, &DeleteParams::default())
                .await;
        });
        let mounts = mounts_under(&self.root);
        // The kubelet makes its root dir a shared mount at its first start (bound onto
        // itself, `setupDataDirs`), and leaves it.
        if mounts.is_empty() {
            let _ = nix::mount::umount(&self.root);
        }
        // With `RKUBELET_TAKEOVER_LOGS=<dir>`, both agents' logs are kept there.
        if let Some(keep) = std::env::var_os("RKUBELET_TAKEOVER_LOGS") {
            for log in [
                self.root.with_extension("log"),
                self.root.with_extension("kubelet.log"),
            ] {
                let to = Path::new(&keep).join(log.file_name().expect("a log's name"));
                let _ = std::fs::copy(&log, to);
            }
        }
        let removed = std::fs::remove_dir_all(self.root.parent().expect("takeover dir"));
        if let Err(failed) = leak_check {
            std::panic::resume_unwind(failed);
        }
        if !std::thread::panicking() {
            assert!(logs_left.is_empty(), "pod log dirs left: {logs_left:?}");
            assert!(
                mounts.is_empty(),
                "mounts left under the root dir: {mounts:?}"
            );
            removed.expect("removing the take-over's dirs");
        }
    }
}

/// The mounts under `dir` (mount point to mount id, from this process's mountinfo).
fn mounts_under(dir: &Path) -> BTreeMap<String, String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    common::mounts_under(&table, &format!("{}/", dir.display()))
}

/// The workload's objects: ConfigMap, Secret, Deployment.
async fn create_workload(node: &str) {
    let client = kube_client("admin.kubeconfig").await;
    let config_map: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": APP, "labels": { "rk-test": LABEL } },
        "data": { "GREETING": "hello", "page": "<h1>taken over</h1>" }
    }))
    .expect("ConfigMap");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": APP, "labels": { "rk-test": LABEL } },
        "stringData": { "password": "s3cret" }
    }))
    .expect("Secret");
    let probe = |handler: serde_json::Value| {
        let mut p = serde_json::json!({ "periodSeconds": READINESS_PERIOD });
        p.as_object_mut()
            .expect("object")
            .extend(handler.as_object().expect("handler").clone());
        p
    };
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": APP, "labels": { "rk-test": LABEL } },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": APP } },
            "template": {
                "metadata": { "labels": { "app": APP, "rk-test": LABEL } },
                "spec": {
                    "nodeSelector": { "kubernetes.io/hostname": node },
                    "terminationGracePeriodSeconds": 2,
                    "initContainers": [{
                        "name": "setup", "image": "busybox",
                        "command": ["sh", "-c", "echo $RANDOM$RANDOM > /work/token && cp /config/page /work/index.html"],
                        "volumeMounts": [
                            { "name": "work", "mountPath": "/work" },
                            { "name": "projected", "mountPath": "/config" }
                        ]
                    }],
                    "containers": [
                        {
                            "name": "web", "image": "busybox",
                            "command": ["httpd", "-f", "-p", "8080", "-h", "/work"],
                            "ports": [{ "name": "http", "containerPort": 8080 }],
                            "env": [{ "name": "GREETING", "valueFrom": { "configMapKeyRef": { "name": APP, "key": "GREETING" } } }],
                            "envFrom": [{ "prefix": "CM_", "configMapRef": { "name": APP } }],
                            "readinessProbe": probe(serde_json::json!({ "httpGet": { "path": "/index.html", "port": "http" } })),
                            "livenessProbe": probe(serde_json::json!({ "tcpSocket": { "port": 8080 } })),
                            "volumeMounts": [
                                { "name": "work", "mountPath": "/work" },
                                { "name": "secret", "mountPath": "/secret", "readOnly": true },
                                { "name": "projected", "mountPath": "/config", "readOnly": true }
                            ]
                        },
                        {
                            "name": "sidecar", "image": "busybox",
                            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                            "readinessProbe": probe(serde_json::json!({ "exec": { "command": ["cat", "/secret/password"] } })),
                            "startupProbe": { "exec": { "command": ["cat", "/work/token"] }, "periodSeconds": 1 },
                            "lifecycle": { "preStop": { "exec": { "command": ["sh", "-c", "echo bye"] } } },
                            "volumeMounts": [
                                { "name": "work", "mountPath": "/work" },
                                { "name": "secret", "mountPath": "/secret", "readOnly": true }
                            ]
                        }
                    ],
                    "volumes": [
                        { "name": "work", "emptyDir": {} },
                        { "name": "secret", "secret": { "secretName": APP } },
                        { "name": "projected", "projected": { "sources": [
                            { "serviceAccountToken": { "path": "token", "expirationSeconds": 3600 } },
                            { "configMap": { "name": APP, "items": [{ "key": "page", "path": "page" }] } },
                            { "downwardAPI": { "items": [{ "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } }] } }
                        ] } }
                    ]
                }
            }
        }
    }))
    .expect("Deployment");
    let post = PostParams::default();
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&post, &config_map)
        .await
        .expect("create the ConfigMap");
    Api::<Secret>::namespaced(client.clone(), "default")
        .create(&post, &secret)
        .await
        .expect("create the Secret");
    Api::<Deployment>::namespaced(client, "default")
        .create(&post, &deployment)
        .await
        .expect("create the Deployment");
}

/// The static pod's manifest: busybox's httpd with a readiness probe.
fn static_manifest() -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {STATIC}
  labels: {{rk-test: {LABEL}}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: busybox
    command: [httpd, -f, -p, '8081']
    readinessProbe:
      tcpSocket: {{port: 8081}}
      periodSeconds: {READINESS_PERIOD}
"
    )
}

/// The test's pods in the API (the Deployment's and the mirror pod).
async fn test_pods() -> Vec<Pod> {
    let api = pods_api().await;
    let selector = ListParams::default().labels(&format!("rk-test={LABEL}"));
    retrying("listing the test's pods", common::API_RETRY, || {
        api.list(&selector)
    })
    .await
    .items
}

/// The runtime UID of a pod: a mirror pod's is its static pod's (`config.mirror`).
fn runtime_uid(pod: &Pod) -> String {
    let annotations = pod.metadata.annotations.as_ref();
    annotations
        .and_then(|a| a.get("kubernetes.io/config.mirror"))
        .or(pod.metadata.uid.as_ref())
        .cloned()
        .expect("uid")
}

/// For each container the kubelet started: its spec (from the API) and the annotations the
/// kubelet wrote on it; rkubelet's hash of the spec must be the kubelet's. With
/// `RKUBELET_TAKEOVER_RECORD=<file>` they are also written there, one JSON line each (how
/// tests/data/kubelet-v1.20.2/real-containers.jsonl was recorded).
async fn check_the_kubelets_hashes() {
    let mut lines = Vec::new();
    for pod in test_pods().await {
        let uid = runtime_uid(&pod);
        let running = containers_of(&uid, None).await;
        let spec = pod.spec.as_ref().expect("spec");
        for c in spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
        {
            let made = running
                .iter()
                .find(|r| r.metadata.as_ref().is_some_and(|m| m.name == c.name))
                .unwrap_or_else(|| panic!("no container {} in the runtime", c.name));
            let hash = &made.annotations["io.kubernetes.container.hash"];
            assert_eq!(
                &rkubelet::kuberuntime::container::container_hash(c),
                hash,
                "the kubelet's hash of {}",
                c.name
            );
            lines.push(serde_json::json!({
                "pod": pod.metadata.name,
                "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
                "container": c,
                "annotations": made.annotations,
            }));
        }
    }
    assert_eq!(lines.len(), 2 * 3 + 1, "containers checked");
    if let Some(path) = std::env::var_os("RKUBELET_TAKEOVER_RECORD") {
        let text: Vec<String> = lines.iter().map(ToString::to_string).collect();
        std::fs::write(path, text.join("\n") + "\n").expect("record");
    }
}

/// What must not change across a swap.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    /// API pod name to its API UID and runtime UID.
    pods: BTreeMap<String, (String, String)>,
    /// Runtime UID to its sandbox ids.
    sandboxes: BTreeMap<String, BTreeSet<String>>,
    /// Runtime UID to its containers: (name, id, attempt, state).
    containers: BTreeMap<String, BTreeSet<(String, String, u32, i32)>>,
    /// API pod name to each container's restart count (init containers too).
    restarts: BTreeMap<String, BTreeMap<String, i32>>,
    /// The volumes' mounts: mount point to mount id.
    mounts: BTreeMap<String, String>,
    /// Each emptyDir's token file, written once by the init container.
    tokens: BTreeMap<String, String>,
}

async fn snapshot(root: &Path) -> Snapshot {
    let mut s = Snapshot {
        pods: BTreeMap::new(),
        sandboxes: BTreeMap::new(),
        containers: BTreeMap::new(),
        restarts: BTreeMap::new(),
        mounts: mounts_under(&root.join("pods")),
        tokens: BTreeMap::new(),
    };
    for pod in test_pods().await {
        let name = pod.metadata.name.clone().expect("name");
        let uid = runtime_uid(&pod);
        s.pods.insert(
            name.clone(),
            (pod.metadata.uid.clone().expect("uid"), uid.clone()),
        );
        s.sandboxes.insert(
            uid.clone(),
            sandboxes_of(&uid)
                .await
                .into_iter()
                .map(|sb| sb.id)
                .collect(),
        );
        let containers = containers_of(&uid, None).await.into_iter().map(|c| {
            let meta = c.metadata.unwrap_or_default();
            (meta.name, c.id, meta.attempt, c.state)
        });
        s.containers.insert(uid.clone(), containers.collect());
        let status = pod.status.unwrap_or_default();
        let statuses = status
            .init_container_statuses
            .into_iter()
            .flatten()
            .chain(status.container_statuses.into_iter().flatten());
        s.restarts
            .insert(name, statuses.map(|c| (c.name, c.restart_count)).collect());
        let token = root.join(format!(
            "pods/{uid}/volumes/kubernetes.io~empty-dir/work/token"
        ));
        if let Ok(text) = std::fs::read_to_string(&token) {
            s.tokens.insert(uid, text);
        }
    }
    s
}

/// The `Killing` events of the test's pods.
async fn killings() -> Vec<String> {
    let api: Api<Event> = Api::namespaced(kube_client("admin.kubeconfig").await, "default");
    let all = ListParams::default();
    let events = retrying("listing events", common::API_RETRY, || api.list(&all)).await;
    events
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Killing"))
        .filter(|e| {
            let name = e.involved_object.name.as_deref().unwrap_or_default();
            name.starts_with(APP) || name.starts_with(STATIC) || name == LATE
        })
        .map(|e| format!("{:?}: {:?}", e.involved_object.name, e.message))
        .collect()
}

/// Watches the pods' Ready conditions (every 200 ms): the longest each was not Ready.
#[derive(Clone, Default)]
struct Readiness(Arc<Mutex<BTreeMap<String, NotReady>>>);

/// A pod's readiness as watched: not Ready since (if it is not), the longest it was not.
type NotReady = (Option<Instant>, Duration);

impl Readiness {
    fn start(&self) -> tokio::task::JoinHandle<()> {
        let state = self.0.clone();
        tokio::spawn(async move {
            loop {
                let pods = test_pods().await;
                let now = Instant::now();
                {
                    let mut state = state.lock().expect("readiness");
                    for pod in &pods {
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        let (since, longest) = state.entry(name).or_default();
                        match (is_ready(pod), *since) {
                            (true, Some(from)) => {
                                *longest = (*longest).max(now - from);
                                *since = None;
                            }
                            (false, None) => *since = Some(now),
                            _ => {}
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    }

    /// The longest a pod was not Ready since the last call (a pod not Ready now counts
    /// until now); then starts over.
    fn take_longest(&self) -> (String, Duration) {
        let mut state = self.0.lock().expect("readiness");
        let now = Instant::now();
        let mut worst = (String::new(), Duration::ZERO);
        for (name, (since, longest)) in state.iter_mut() {
            let d = (*longest).max(since.map_or(Duration::ZERO, |s| now - s));
            if d > worst.1 {
                worst = (name.clone(), d);
            }
            *longest = Duration::ZERO;
        }
        worst
    }
}

/// Waits until the workload's `n` pods are there and Ready (the Deployment's two, the
/// mirror pod, and the pod rkubelet started once it runs the node); on time-out, fails
/// naming each pod's phase, conditions and containers' states.
async fn all_ready(n: usize, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let pods = test_pods().await;
        if pods.len() == n && pods.iter().all(is_ready) {
            return Instant::now();
        }
        if Instant::now() > deadline {
            let states: Vec<String> = pods.iter().map(pod_state).collect();
            panic!(
                "timed out after {within:?} waiting for the workload's {n} pods Ready:\n{}",
                states.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A pod's name, phase, conditions and containers' states, for a failure's message.
fn pod_state(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let conditions: Vec<String> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| format!("{}={} {:?}", c.type_, c.status, c.message))
        .collect();
    let containers: Vec<String> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .map(|c| format!("{} ready={} {:?}", c.name, c.ready, c.state))
        .collect();
    format!(
        "{:?} {:?} {conditions:?} {containers:?}",
        pod.metadata.name, status.phase
    )
}

/// A pod rkubelet starts while it runs the node, for the kubelet to adopt: ports, a
/// preStop hook and a grace period, whose annotations the kubelet reads back.
async fn create_late_pod(pods: &TestPods, node: &str) {
    pods.create(
        node,
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": LATE },
            "spec": {
                "terminationGracePeriodSeconds": 3,
                "containers": [{
                    "name": "web", "image": "busybox",
                    "command": ["httpd", "-f", "-p", "8082"],
                    "ports": [{ "name": "http", "containerPort": 8082, "protocol": "TCP" }],
                    "env": [{ "name": "HTML", "value": "<b>&</b>" }],
                    "readinessProbe": { "tcpSocket": { "port": "http" }, "periodSeconds": READINESS_PERIOD },
                    "lifecycle": { "preStop": { "httpGet": { "path": "/bye", "port": "http" } } },
                    "resources": { "limits": { "cpu": "0.1", "memory": "32Mi" } }
                }]
            }
        }),
    )
    .await;
}

/// When the node's Lease was last renewed (every 10 s by either agent).
async fn renewed() -> Option<k8s_openapi::jiff::Timestamp> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(kube_client("admin.kubeconfig").await, "kube-node-lease");
    Some(
        leases
            .get_opt(&node_name())
            .await
            .ok()??
            .spec?
            .renew_time?
            .0,
    )
}

/// One swap: the agent stops, the other starts with the same dirs; once it has reported
/// its node and had time for a full sync and a readiness period, the checks of the module
/// comment. Answers the longest a pod was not Ready.
async fn swap(node: &mut Node, readiness: &Readiness, to_rkubelet: bool, pods: usize) -> Duration {
    let before = node.snapshot().await;
    readiness.take_longest();
    node.stop_agent();
    let started = Instant::now();
    let since = k8s_openapi::jiff::Timestamp::now();
    if to_rkubelet {
        node.start_rkubelet();
    } else {
        node.start_kubelet();
    }
    let who = if to_rkubelet {
        "rkubelet"
    } else {
        "the kubelet"
    };
    eventually(
        &format!("the Lease renewed by {who}"),
        Duration::from_secs(60),
        || async { renewed().await.filter(|t| *t > since) },
    )
    .await;
    let reported = Instant::now();
    tokio::time::sleep(Duration::from_secs(READINESS_PERIOD + 2)).await;
    let ready = all_ready(pods, Duration::from_secs(30)).await;
    let after = node.snapshot().await;
    let (pod, longest) = readiness.take_longest();
    eprintln!(
        "{who} took over: Lease renewed {:.1} s after its start, all Ready by {:.1} s; \
         longest a pod was not Ready: {:.1} s ({pod})",
        (reported - started).as_secs_f64(),
        (ready - started).as_secs_f64(),
        longest.as_secs_f64()
    );
    assert_eq!(before, after, "{who} changed what runs");
    eprintln!(
        "{who} kept {} sandboxes, {} containers (restart counts {:?}), {} volume mounts",
        after.sandboxes.values().map(BTreeSet::len).sum::<usize>(),
        after.containers.values().map(BTreeSet::len).sum::<usize>(),
        after.restarts,
        after.mounts.len()
    );
    assert_eq!(
        killings().await,
        Vec::<String>::new(),
        "{who} killed containers"
    );
    longest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_kubelet_and_rkubelet_take_a_live_node_over_from_each_other_restarting_nothing() {
    let mut node = Node::new();
    node.start_kubelet();
    eventually(
        "the kubelet's node Ready",
        Duration::from_secs(90),
        || async { common::node_condition("Ready").await.filter(|r| *r) },
    )
    .await;
    create_workload(&node.name).await;
    std::fs::write(
        node.manifests.join(format!("{STATIC}.yaml")),
        static_manifest(),
    )
    .expect("static pod manifest");
    all_ready(3, Duration::from_secs(120)).await;
    let pods = node.pods.as_ref().expect("pods");
    test_pods().await.iter().for_each(|p| pods.track(p));
    let first = node.snapshot().await;
    assert_eq!(first.pods.len(), 3, "{first:?}");
    assert_eq!(first.tokens.len(), 2, "each emptyDir's token: {first:?}");
    assert!(
        !first.mounts.is_empty(),
        "the kubelet's volume mounts: {first:?}"
    );
    check_the_kubelets_hashes().await;
    let readiness = Readiness::default();
    let watcher = readiness.start();
    let rkubelet_gap = swap(&mut node, &readiness, true, 3).await;
    create_late_pod(node.pods.as_ref().expect("pods"), &node.name).await;
    all_ready(4, Duration::from_secs(60)).await;
    let kubelet_gap = swap(&mut node, &readiness, false, 4).await;
    // The kubelet read every annotation rkubelet wrote (it logs those it cannot).
    let log = std::fs::read_to_string(node.root.with_extension("kubelet.log")).expect("log");
    let unread: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Unable to get"))
        .collect();
    assert!(unread.is_empty(), "the kubelet could not read: {unread:#?}");
    watcher.abort();
    // Not Ready for no longer than the kubelet's own start makes a pod, or one period.
    let limit = kubelet_gap.max(Duration::from_secs(READINESS_PERIOD));
    assert!(
        rkubelet_gap <= limit + Duration::from_secs(1),
        "rkubelet: a pod was not Ready for {rkubelet_gap:?} (the kubelet: {kubelet_gap:?})"
    );
    drop(node);
}
