//! rkubelet on a kind-style node, booted for real (issue 24): `cluster.sh add-kind-node`
//! builds the kind node image around the binary under test (Debian with systemd as PID 1,
//! containerd + runc, the CNI plugins, rkubelet as `kubelet.service`), boots it as a
//! podman container in a network namespace of its own on the cluster's underlay, writes
//! what `kubeadm join` writes on a kind worker (`cgroupDriver: systemd`, containerd with
//! `SystemdCgroup = true`) and restarts the kubelet: the node joins with the bootstrap
//! token only. A 3-replica Deployment pinned to it runs, with a Guaranteed and a
//! BestEffort pod beside it: each pod's cgroup is a slice systemd made in its QoS class's
//! slice, with the kubelet's CPU and memory values, removed with the pod; a `systemctl
//! restart kubelet` in the node keeps its pods and containers as they are; the node's
//! journal holds rkubelet's log; `kubectl logs` and `kubectl exec` reach a pod through the
//! API server; rkubelet with the other cgroup driver than containerd's stops at its start
//! with one message naming both, each way round; removing the node leaves nothing of it
//! on the host.
//!
//! And the `agent` image run once as its Dockerfile says: privileged, in the host's
//! namespaces, against the host's containerd; its Node registers and a pod runs.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::agent::{NODE_IP, TEST_EVICTION_HARD, TEST_IMAGE_GC_HIGH_THRESHOLD};
use common::pods::{TestPods, running_and_ready, sleeper};
use common::{cleanup_blocking, cluster, eventually, kube_client, kubectl, state_dir};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// The kind node's name (its container's, its hostname, its Node's).
const NODE: &str = "rk-kind1";
/// The label of this test's objects.
const TEST_LABEL: &str = "rk-test=kind-node";
const REPLICAS: usize = 3;

/// The binary the node image is built around: the one under test, or
/// `RKUBELET_KIND_BINARY` (e.g. a binary with another cgroup driver).
fn node_binary() -> String {
    std::env::var("RKUBELET_KIND_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rkubelet").into())
}

/// `podman ARGS` as the cluster script runs it: its own network config dir (any podman
/// command would make `/etc/cni/net.d`), events in a file, cgroupfs where systemd does not
/// run the machine.
fn podman_output(args: &[&str]) -> std::process::Output {
    let netcfg = state_dir().join("kind/podman-net");
    std::fs::create_dir_all(&netcfg).expect("podman network config dir");
    let manager = if Path::new("/run/systemd/system").is_dir() {
        "systemd"
    } else {
        "cgroupfs"
    };
    Command::new("podman")
        .arg("--network-config-dir")
        .arg(&netcfg)
        .args(["--events-backend", "file", "--cgroup-manager", manager])
        .args(args)
        .output()
        .expect("podman")
}

/// `podman ARGS`: stdout, or a panic naming the command.
fn podman(args: &[&str]) -> String {
    let out = podman_output(args);
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// CMD inside the kind node.
fn in_node(cmd: &[&str]) -> String {
    podman(&[&["exec", NODE], cmd].concat())
}

/// The kind node; dropped, it goes with all it holds (and this test's objects).
struct KindNode {
    /// How long `add-kind-node` took, image build and join included.
    took: Duration,
}

impl KindNode {
    async fn add() -> Self {
        let start = Instant::now();
        cluster(&["add-kind-node", NODE, "--binary", &node_binary()]).await;
        Self {
            took: start.elapsed(),
        }
    }
}

impl Drop for KindNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for unit in ["kubelet", "containerd"] {
                let out = podman_output(&[
                    "exec",
                    NODE,
                    "journalctl",
                    "--no-pager",
                    "-n",
                    "40",
                    "-u",
                    unit,
                ]);
                eprintln!(
                    "---- journalctl -u {unit} in {NODE}\n{}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
        }
        cleanup_blocking(|| async {
            let _ = common::kubectl_command(&[
                "delete",
                "deployments,pods",
                "-l",
                TEST_LABEL,
                "--wait=false",
            ])
            .output()
            .await;
            let _ = common::kubectl_command(&["delete", "node", NODE, "--ignore-not-found"])
                .output()
                .await;
            cluster(&["remove-kind-node", NODE]).await;
        });
    }
}

/// The node's Ready condition is true.
fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Each pod of the Deployment by name: (its uid, its containers' ids and restart counts).
type PodsSeen = BTreeMap<String, (String, Vec<(String, i32)>)>;

fn seen(pods: &[Pod]) -> PodsSeen {
    pods.iter()
        .map(|p| {
            let statuses = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default();
            (
                p.metadata.name.clone().unwrap_or_default(),
                (
                    p.metadata.uid.clone().unwrap_or_default(),
                    statuses
                        .into_iter()
                        .map(|c| (c.container_id.unwrap_or_default(), c.restart_count))
                        .collect(),
                ),
            )
        })
        .collect()
}

/// The Deployment's pods, once all `REPLICAS` run and are Ready on the node.
async fn all_running(pods: &Api<Pod>) -> Vec<Pod> {
    eventually(
        "the Deployment's pods Running and Ready on the kind node",
        Duration::from_secs(180),
        || async {
            let list = pods
                .list(&ListParams::default().labels(TEST_LABEL))
                .await
                .ok()?
                .items;
            (list.len() == REPLICAS
                && list.iter().all(|p| {
                    running_and_ready(p)
                        && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE)
                }))
            .then_some(list)
        },
    )
    .await
}

/// The container ids containerd holds in the node's `k8s.io` namespace.
fn node_containers() -> Vec<String> {
    let mut ids: Vec<String> = in_node(&["ctr", "-n", "k8s.io", "containers", "ls", "-q"])
        .lines()
        .map(str::to_owned)
        .collect();
    ids.sort();
    ids
}

/// The tests of this file one at a time: each compares the host's network namespaces (and
/// links, cgroups) before and after, which the other's node would change meanwhile.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_kind_style_node_joins_by_bootstrap_token_and_runs_a_deployment() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let admin = kube_client("admin.kubeconfig").await;
    let netns_before = netns_names();
    let node = KindNode::add().await;
    eprintln!("add-kind-node (image build, boot, join): {:?}", node.took);

    // Joined by TLS bootstrap: Ready, its CSR made by the bootstrap token's user.
    let nodes: Api<Node> = Api::all(admin.clone());
    let n = nodes.get(NODE).await.expect("the kind node's Node");
    assert!(ready(&n), "{n:?}");
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(format!("kind://podman/kind/{NODE}").as_str())
    );
    let internal_ip = common::internal_ip(&n);
    assert!(internal_ip.starts_with("198.18.0."), "{internal_ip}");
    common::assert_joined_by_bootstrap_token(&admin).await;
    // The node's own view: systemd runs, the kubelet is rkubelet under kubelet.service, the
    // kubeconfig is the one TLS bootstrap wrote.
    assert_eq!(
        in_node(&["systemctl", "is-active", "kubelet", "containerd"]),
        "active\nactive\n"
    );
    let pid1 = in_node(&["cat", "/proc/1/comm"]);
    assert_eq!(pid1.trim(), "systemd");
    // Its systemd in the node's own cgroup tree on every hierarchy (podman's systemd mode
    // mounts the machine's whole name=systemd hierarchy: a path out of the node's
    // namespace, `/../..`, would be the machine's root).
    let cgroups = in_node(&["cat", "/proc/1/cgroup"]);
    assert!(
        cgroups.lines().all(|l| !l.contains("/..")),
        "PID 1 of the node outside its cgroup namespace: {cgroups}"
    );
    assert!(
        cgroups
            .lines()
            .any(|l| l.ends_with(":name=systemd:/init.scope") || l == "0::/init.scope"),
        "{cgroups}"
    );
    assert!(in_node(&["cat", "/etc/kubernetes/kubelet.conf"]).contains("client-certificate"));
    // Its state where the kubelet keeps it (kubelet.service gives no --root-dir): the
    // client certificate kubeadm's kubelet.conf names, and the sockets device plugins and
    // CSI drivers look for under /var/lib/kubelet.
    assert!(
        in_node(&["ls", "/var/lib/kubelet/pki"]).contains("kubelet-client-current.pem"),
        "the client certificate in /var/lib/kubelet/pki"
    );
    assert_eq!(
        in_node(&[
            "sh",
            "-c",
            "test -S /var/lib/kubelet/device-plugins/kubelet.sock && test -d /var/lib/kubelet/plugins_registry && echo yes"
        ])
        .trim(),
        "yes"
    );

    // Three replicas pinned to the node.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": "kind-node-app", "labels": { "rk-test": "kind-node" } },
        "spec": {
            "replicas": REPLICAS,
            "selector": { "matchLabels": { "rk-test": "kind-node" } },
            "template": {
                "metadata": { "labels": { "rk-test": "kind-node" } },
                "spec": {
                    "nodeSelector": { "kubernetes.io/hostname": NODE },
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "main",
                        "image": "busybox",
                        "command": ["sh", "-c", "echo hello from $(hostname); exec sleep 3600"],
                        "resources": {
                            "requests": { "cpu": "100m", "memory": "16Mi" },
                            "limits": { "cpu": "250m", "memory": "64Mi" }
                        }
                    }]
                }
            }
        }
    }))
    .unwrap();
    let start = Instant::now();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create the Deployment");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let before = seen(&all_running(&pods).await);
    eprintln!(
        "{REPLICAS} replicas Running and Ready in {:?}",
        start.elapsed()
    );
    // Each pod's cgroup is a slice systemd made, in its QoS class's slice, with the
    // kubelet's values; a Guaranteed and a BestEffort pod beside the Burstable replicas.
    let qos_pods = QosPods::create(&pods).await;
    for p in pods
        .list(&ListParams::default().labels(TEST_LABEL))
        .await
        .expect("pods")
        .items
    {
        check_pod_slice(&p);
    }
    for unit in [
        "kubepods.slice",
        "kubepods-burstable.slice",
        "kubepods-besteffort.slice",
    ] {
        assert_eq!(
            in_node(&["systemctl", "is-active", unit]).trim(),
            "active",
            "{unit}"
        );
    }
    qos_pods.delete(&pods).await;
    let containers_before = node_containers();
    // A sandbox and a container per pod.
    assert_eq!(
        containers_before.len(),
        2 * REPLICAS,
        "{containers_before:?}"
    );

    // `systemctl restart kubelet`: the pods stay as they are.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let events_api: Api<Event> = Api::namespaced(admin.clone(), "default");
    let restarted = Timestamp::now();
    in_node(&["systemctl", "restart", "kubelet"]);
    eventually(
        "the kind node's Lease renewed after the kubelet's restart",
        Duration::from_secs(60),
        || async {
            let renewed = leases.get_opt(NODE).await.ok()??.spec?.renew_time?.0;
            (renewed > restarted).then_some(())
        },
    )
    .await;
    // The new process's own sync of every pod (its timeline of the pod, which lives in the
    // process, begins after the restart and holds a finished `sync_pod`) changes nothing.
    for name in before.keys() {
        let path = format!("/api/v1/nodes/{NODE}/proxy/debug/timeline/default/{name}");
        eventually(
            &format!("the restarted agent's sync of {name}"),
            Duration::from_secs(60),
            || async {
                let out = common::kubectl_command(&["get", "--raw", &path])
                    .output()
                    .await
                    .ok()?;
                let timeline: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
                let seen: Timestamp = timeline["seen"].as_str()?.parse().ok()?;
                let synced = timeline["steps"]
                    .as_array()?
                    .iter()
                    .any(|s| s["name"] == "sync_pod");
                (seen > restarted && synced).then_some(())
            },
        )
        .await;
    }
    let after = seen(&all_running(&pods).await);
    assert_eq!(
        before, after,
        "the pods, their containers and restart counts"
    );
    assert!(
        after
            .values()
            .all(|(_, cs)| cs.iter().all(|(_, n)| *n == 0))
    );
    assert_eq!(node_containers(), containers_before);
    assert!(ready(&nodes.get(NODE).await.unwrap()));

    // Handed to the kubelet v1.20.2 and back (issue 43), as docs/packaging.md says:
    // `systemctl stop kubelet`, the other binary in its place (a drop-in's `ExecStart`),
    // `systemctl start kubelet`. The same pods, containers, restart counts and pod
    // slices, no `Killing` event, each way.
    let mounts_before = pod_volume_mounts();
    assert!(!mounts_before.is_empty(), "the pods' token volumes");
    for to_kubelet in [true, false] {
        let who = if to_kubelet {
            "the kubelet"
        } else {
            "rkubelet"
        };
        let since = Timestamp::now();
        let swapped = Instant::now();
        swap_agent(to_kubelet);
        eventually(
            &format!("the kind node's Lease renewed by {who}"),
            Duration::from_secs(90),
            || async {
                let renewed = leases.get_opt(NODE).await.ok()??.spec?.renew_time?.0;
                (renewed > since).then_some(())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(15)).await;
        let running = all_running(&pods).await;
        assert_eq!(
            seen(&running),
            before,
            "{who}: the pods, containers, restart counts"
        );
        assert_eq!(
            node_containers(),
            containers_before,
            "{who}: the sandboxes and containers"
        );
        assert_eq!(
            pod_volume_mounts(),
            mounts_before,
            "{who}: the volumes' mounts"
        );
        for p in &running {
            check_pod_slice(p);
        }
        let killed = events_api
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Killing"))
            .filter_map(|e| e.involved_object.name)
            .filter(|name| before.contains_key(name))
            .collect::<Vec<_>>();
        assert!(killed.is_empty(), "{who} killed containers of {killed:?}");
        assert!(
            ready(&nodes.get(NODE).await.unwrap()),
            "{who}: the node Ready"
        );
        eprintln!(
            "handed to {who}: {} pods, {} sandboxes and containers kept, checked {:.1} s after the swap began",
            before.len(),
            containers_before.len(),
            swapped.elapsed().as_secs_f64()
        );
    }

    // rkubelet's log is the node's kubelet journal: two starts.
    let journal = in_node(&["journalctl", "--no-pager", "-u", "kubelet"]);
    let starts = journal
        .lines()
        .filter(|l| l.contains("rkubelet running"))
        .count();
    assert!(
        starts >= 2,
        "two starts of rkubelet in the journal:\n{journal}"
    );
    assert!(
        journal.contains("pod networking owned by the runtime"),
        "{journal}"
    );

    // The kubelet API through the API server: logs and exec.
    let pod = before.keys().next().expect("a pod").clone();
    let logs = kubectl(&["logs", &pod]).await;
    assert_eq!(logs.trim(), format!("hello from {pod}"));
    let hostname = kubectl(&["exec", &pod, "--", "cat", "/etc/hostname"]).await;
    assert_eq!(hostname.trim(), pod);

    // Deleted, the pods' slices go: stopped in systemd, their directories removed.
    let slices: Vec<String> = after
        .values()
        .map(|(uid, _)| pod_slice(uid, "burstable"))
        .collect();
    deployments
        .delete("kind-node-app", &DeleteParams::default())
        .await
        .expect("delete the Deployment");
    eventually(
        "the Deployment's pods gone and their slices removed",
        Duration::from_secs(90),
        || async {
            let left = pods
                .list(&ListParams::default().labels(TEST_LABEL))
                .await
                .ok()?
                .items;
            (left.is_empty() && slices.iter().all(|s| !slice_exists(s))).then_some(())
        },
    )
    .await;
    for slice in &slices {
        let unit = slice.rsplit('/').next().expect("a unit name");
        let state = podman_output(&["exec", NODE, "systemctl", "is-active", unit]);
        assert_ne!(
            String::from_utf8_lossy(&state.stdout).trim(),
            "active",
            "{unit} stopped"
        );
    }

    // A cgroup driver other than the runtime's stops rkubelet at its start, with one
    // message naming both: each way round, by hand beside the node's own rkubelet.
    assert_driver_mismatch_refused();

    // Gone, and nothing of it on the host.
    let container_id = podman(&["inspect", "--format", "{{.Id}}", NODE])
        .trim()
        .to_owned();
    let octet = internal_ip.rsplit('.').next().unwrap().to_owned();
    drop(node);
    assert_node_left_nothing(&container_id, &octet, &netns_before);
}

/// The mounts under the node's pod directories: mount point to mount id, from the
/// node's mount table (a volume mounted again has a new id).
fn pod_volume_mounts() -> BTreeMap<String, String> {
    let table = in_node(&["cat", "/proc/self/mountinfo"]);
    common::mounts_under(&table, "/var/lib/kubelet/pods/")
}

/// The drop-in that makes `kubelet.service` start the kubelet v1.20.2 in the node image
/// (`/usr/bin/kubelet`) with kubeadm's variables, in place of rkubelet's.
const KUBELET_DROP_IN: &str = "/etc/systemd/system/kubelet.service.d/20-kubelet-v1.20.2.conf";

/// `systemctl stop kubelet`, the other agent in its place, `systemctl start kubelet`.
fn swap_agent(to_kubelet: bool) {
    in_node(&["systemctl", "stop", "kubelet"]);
    if to_kubelet {
        let unit = "[Service]\nExecStart=\nExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS \
                    $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS\n";
        in_node(&["sh", "-c", &format!("printf '{unit}' > {KUBELET_DROP_IN}")]);
    } else {
        in_node(&["rm", KUBELET_DROP_IN]);
    }
    in_node(&["systemctl", "daemon-reload"]);
    in_node(&["systemctl", "start", "kubelet"]);
}

/// The escaped pod UID in a slice name (dashes are systemd's separators).
fn slice_uid(uid: &str) -> String {
    uid.replace('-', "_")
}

/// The pod's slice, as a path under a hierarchy: `kubepods.slice/kubepods-<qos>.slice/
/// kubepods-<qos>-pod<uid>.slice`, or `kubepods.slice/kubepods-pod<uid>.slice` for
/// Guaranteed pods (`qos` empty).
fn pod_slice(uid: &str, qos: &str) -> String {
    let uid = slice_uid(uid);
    if qos.is_empty() {
        format!("kubepods.slice/kubepods-pod{uid}.slice")
    } else {
        format!("kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice")
    }
}

/// Whether the slice's directory exists in the node's cpu hierarchy.
fn slice_exists(slice: &str) -> bool {
    podman_output(&[
        "exec",
        NODE,
        "test",
        "-d",
        &format!("/sys/fs/cgroup/cpu/{slice}"),
    ])
    .status
    .success()
}

/// A cgroup file of `slice` in the node's `hierarchy`, as a number.
fn cgroup_value(hierarchy: &str, slice: &str, file: &str) -> u64 {
    let text = in_node(&["cat", &format!("/sys/fs/cgroup/{hierarchy}/{slice}/{file}")]);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{hierarchy}/{slice}/{file}: {text:?}: {e}"))
}

/// The pod's QoS class as its status says, and the values the kubelet gives its cgroup
/// (`ResourceConfigForPod`): CPU shares, CFS quota (none: -1), memory limit (none: `None`).
fn expected_pod_cgroup(p: &Pod) -> (&'static str, u64, i64, Option<u64>) {
    match p.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        // requests 100m/16Mi, limits 250m/64Mi.
        Some("Burstable") => ("burstable", 102, 25_000, Some(64 << 20)),
        // 100m/32Mi.
        Some("Guaranteed") => ("", 102, 10_000, Some(32 << 20)),
        Some("BestEffort") => ("besteffort", 2, -1, None),
        other => panic!("QoS class {other:?}"),
    }
}

/// The pod's cgroup is the slice systemd made for its QoS class, active as a unit, holding
/// its containers' scopes, with the kubelet's CPU and memory values.
fn check_pod_slice(p: &Pod) {
    let uid = p.metadata.uid.as_deref().expect("uid");
    let (qos, shares, quota, memory) = expected_pod_cgroup(p);
    let slice = pod_slice(uid, qos);
    let unit = slice.rsplit('/').next().expect("a unit name").to_owned();
    assert_eq!(
        in_node(&["systemctl", "is-active", &unit]).trim(),
        "active",
        "{unit}"
    );
    assert_eq!(cgroup_value("cpu", &slice, "cpu.shares"), shares, "{slice}");
    let got_quota = in_node(&[
        "cat",
        &format!("/sys/fs/cgroup/cpu/{slice}/cpu.cfs_quota_us"),
    ]);
    assert_eq!(
        got_quota.trim(),
        quota.to_string(),
        "{slice} cpu.cfs_quota_us"
    );
    if quota > 0 {
        assert_eq!(cgroup_value("cpu", &slice, "cpu.cfs_period_us"), 100_000);
    }
    let limit = cgroup_value("memory", &slice, "memory.limit_in_bytes");
    match memory {
        Some(bytes) => assert_eq!(limit, bytes, "{slice} memory.limit_in_bytes"),
        None => assert!(limit > 1 << 60, "{slice}: no memory limit, got {limit}"),
    }
    // runc, told by containerd (SystemdCgroup), puts each container in a scope of the slice.
    for status in p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .expect("container statuses")
    {
        let id = status
            .container_id
            .as_deref()
            .and_then(|c| c.strip_prefix("containerd://"))
            .expect("a containerd container id");
        let scope = format!("/sys/fs/cgroup/cpu/{slice}/cri-containerd-{id}.scope");
        in_node(&["test", "-d", &scope]);
    }
}

/// A Guaranteed and a BestEffort pod on the node, beside the Burstable replicas.
struct QosPods;

impl QosPods {
    const NAMES: [&'static str; 2] = ["kind-node-guaranteed", "kind-node-besteffort"];

    async fn create(pods: &Api<Pod>) -> Self {
        let resources = [
            serde_json::json!({
                "requests": { "cpu": "100m", "memory": "32Mi" },
                "limits": { "cpu": "100m", "memory": "32Mi" }
            }),
            serde_json::json!({}),
        ];
        for (name, resources) in Self::NAMES.into_iter().zip(resources) {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": { "name": name, "labels": { "rk-test": "kind-node" } },
                "spec": {
                    "nodeName": NODE,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "main",
                        "image": "busybox",
                        "command": ["sleep", "3600"],
                        "resources": resources
                    }]
                }
            }))
            .expect("a Pod");
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create a QoS pod");
        }
        for name in Self::NAMES {
            eventually(
                &format!("{name} Running and Ready"),
                Duration::from_secs(90),
                || async {
                    pods.get(name)
                        .await
                        .ok()
                        .filter(running_and_ready)
                        .map(|_| ())
                },
            )
            .await;
        }
        Self
    }

    /// Deletes both and waits until they are gone with their slices.
    async fn delete(self, pods: &Api<Pod>) {
        let mut slices = Vec::new();
        for name in Self::NAMES {
            let p = pods.get(name).await.expect("the QoS pod");
            let (qos, ..) = expected_pod_cgroup(&p);
            slices.push(pod_slice(p.metadata.uid.as_deref().expect("uid"), qos));
            pods.delete(name, &DeleteParams::default())
                .await
                .expect("delete a QoS pod");
        }
        eventually(
            "the QoS pods gone and their slices removed",
            Duration::from_secs(90),
            || async {
                for name in Self::NAMES {
                    if pods.get_opt(name).await.ok()?.is_some() {
                        return None;
                    }
                }
                slices.iter().all(|s| !slice_exists(s)).then_some(())
            },
        )
        .await;
    }
}

/// rkubelet run by hand in the node with the other cgroup driver than containerd's: it
/// stops at once with the message naming both. First the node's containerd as it is
/// (systemd) and rkubelet with cgroupfs; then, with the node's own rkubelet stopped,
/// containerd switched to cgroupfs and rkubelet with the node's config (systemd).
fn assert_driver_mismatch_refused() {
    let run_by_hand = |driver: &str| {
        let out = podman_output(&[
            "exec",
            NODE,
            "timeout",
            "60",
            "/usr/bin/rkubelet",
            "--config",
            "/var/lib/kubelet/config.yaml",
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            "--container-runtime-endpoint",
            "unix:///run/containerd/containerd.sock",
            "--root-dir",
            "/tmp/rkubelet-mismatch",
            "--cgroup-driver",
            driver,
        ]);
        let code = out.status.code();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (code, stderr)
    };
    let (code, stderr) = run_by_hand("cgroupfs");
    assert!(
        code.is_some_and(|c| c != 0 && c != 124),
        "exit {code:?}:\n{stderr}"
    );
    assert!(
        stderr.contains(
            "--cgroup-driver=cgroupfs but the container runtime uses systemd (SystemdCgroup = true)"
        ),
        "{stderr}"
    );
    in_node(&["systemctl", "stop", "kubelet"]);
    in_node(&[
        "sed",
        "-i",
        "s/^\\([[:space:]]*SystemdCgroup = \\).*/\\1false/",
        "/etc/containerd/config.toml",
    ]);
    in_node(&["systemctl", "restart", "containerd"]);
    let (code, stderr) = run_by_hand("systemd");
    assert!(
        code.is_some_and(|c| c != 0 && c != 124),
        "exit {code:?}:\n{stderr}"
    );
    assert!(
        stderr.contains(
            "--cgroup-driver=systemd but the container runtime uses cgroupfs (SystemdCgroup = false)"
        ),
        "{stderr}"
    );
}

/// The network namespaces now.
fn netns_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// No container, process, cgroup, netns, link, mount or state of the removed kind node.
fn assert_node_left_nothing(container_id: &str, octet: &str, netns_before: &[String]) {
    let mut left = Vec::new();
    let containers = podman(&["ps", "-a", "--format", "{{.ID}} {{.Names}}"]);
    if containers.lines().any(|l| l.ends_with(&format!(" {NODE}"))) {
        left.push(format!("podman container {NODE}"));
    }
    if netns_names() != netns_before {
        left.push(format!(
            "netns: {:?} (before: {netns_before:?})",
            netns_names()
        ));
    }
    let links = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .expect("ip link show")
            .stdout,
    )
    .into_owned();
    if links.contains(&format!("rkk-{octet}")) {
        left.push(format!("link rkk-{octet}"));
    }
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .expect("/sys/fs/cgroup")
        .flatten()
    {
        let dir = hierarchy.path().join(format!("rk-kind-{NODE}"));
        if dir.exists() {
            left.push(format!("cgroup {}", dir.display()));
        }
    }
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cgroup.contains(&format!("/rk-kind-{NODE}/"))
            || cgroup.contains(&format!("libpod-{container_id}"))
            || (cmdline.contains("conmon") && cmdline.contains(container_id))
        {
            left.push(format!("process {:?}: {cmdline}", entry.file_name()));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    for line in mounts.lines().filter(|l| l.contains(container_id)) {
        left.push(format!("mount {line}"));
    }
    if state_dir().join("kind").join(NODE).exists() {
        left.push(format!(
            "state {}",
            state_dir().join("kind").join(NODE).display()
        ));
    }
    assert!(
        left.is_empty(),
        "the kind node left behind:\n  {}",
        left.join("\n  ")
    );
}

/// The agent image run as its Dockerfile's comment says: a privileged container in the
/// host's network, PID and cgroup namespaces (the host's cgroup hierarchies mounted whole:
/// podman mounts only the container's own), with the node's files mounted at their own
/// paths, against the host's containerd (pod networking by the runtime: the agent's thin
/// CNI plugin would be a path inside the image, which the host's containerd cannot run).
/// Removed (with its image and its pods, and the mount made to share its root) on drop.
struct AgentContainer {
    name: String,
    node: String,
    image: String,
    root: PathBuf,
}

impl AgentContainer {
    async fn start(node: &str) -> Self {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let image = format!("{}:test", common::unique("localhost/rkubelet-agent-test"));
        let mut build = tokio::process::Command::new("bash");
        build
            .arg(repo.join("scripts/image.sh"))
            .arg("build")
            .env("RKUBELET_BINARY", env!("CARGO_BIN_EXE_rkubelet"))
            .env("RKUBELET_IMAGE", &image);
        common::run_ok(build, "image.sh build").await;
        cluster(&["node-credentials", node, NODE_IP]).await;
        // The root dir holds the pods' volumes (tmpfs for tokens) that the host's containerd
        // bind-mounts into containers: mounted at the same path, shared both ways.
        let root = PathBuf::from(format!(
            "/var/lib/rkubelet-agent-image-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&root).expect("root dir");
        let root_s = root.display().to_string();
        for args in [
            vec!["--bind", &root_s, &root_s],
            vec!["--make-shared", &root_s],
        ] {
            assert!(
                Command::new("mount")
                    .args(&args)
                    .status()
                    .expect("mount")
                    .success()
            );
        }
        let this = Self {
            name: format!("rk-agent-image-{}", std::process::id()),
            node: node.to_owned(),
            image,
            root,
        };
        let state = state_dir().display().to_string();
        let pki = format!("{state}/pki");
        let cni = format!("{state}/cni");
        let vol = |a: &str, b: &str| format!("{a}:{a}{b}");
        podman(&[
            "run",
            "-d",
            "--name",
            &this.name,
            "--privileged",
            "--pid=host",
            "--network=host",
            "--cgroupns=host",
            "--cgroup-parent",
            &this.cgroup_parent(),
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=4096:4096",
            "-v",
            "/sys/fs/cgroup:/sys/fs/cgroup",
            "-v",
            "/run/containerd:/run/containerd",
            "-v",
            &vol(&root_s, ":rshared"),
            "-v",
            &vol(&pki, ":ro"),
            "-v",
            &vol(&cni, ""),
            &this.image,
            "--log-level",
            "info,rkubelet=debug",
            "run",
            "--kubeconfig",
            &format!("{pki}/node-{node}.kubeconfig"),
            "--hostname-override",
            node,
            "--node-ip",
            NODE_IP,
            "--root-dir",
            &root_s,
            "--pod-logs-dir",
            &format!("{root_s}/logs"),
            "--network-owner",
            "runtime",
            "--runtime-cni-conf-dir",
            &format!("{cni}/net.d"),
            "--runtime-cni-bin-dir",
            &format!("{cni}/bin"),
            "--resolv-conf",
            "",
            "--eviction-hard",
            TEST_EVICTION_HARD,
            "--image-gc-high-threshold",
            TEST_IMAGE_GC_HIGH_THRESHOLD,
            "--address",
            NODE_IP,
            "--client-ca-file",
            &format!("{pki}/ca.crt"),
            "--tls-cert-file",
            &format!("{pki}/node-{node}-serving.crt"),
            "--tls-private-key-file",
            &format!("{pki}/node-{node}-serving.key"),
        ]);
        this
    }

    /// The container's cgroup parent (conmon's and its own cgroups below it), removed with it.
    fn cgroup_parent(&self) -> String {
        format!("/{}", self.name)
    }

    fn logs(&self) -> String {
        let out = podman_output(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// SIGTERM (podman stop): the agent stops, its pods keep running.
    fn stop(&self) {
        podman(&["stop", "--time", "15", &self.name]);
    }
}

impl Drop for AgentContainer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- the agent container's log\n{}", self.logs());
        }
        let _ = podman_output(&["rm", "--force", "--time", "5", &self.name]);
        let node = self.node.clone();
        cleanup_blocking(move || async move {
            let nodes: Api<Node> = Api::all(kube_client("admin.kubeconfig").await);
            let _ = nodes.delete(&node, &DeleteParams::default()).await;
        });
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let parent = hierarchy.path().join(&self.name);
            for dir in [parent.join("conmon"), parent] {
                let _ = std::fs::remove_dir(dir);
            }
        }
        let _ = Command::new("buildah").args(["rmi", &self.image]).output();
        let _ = Command::new("umount").arg("-R").arg(&self.root).status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_agent_image_runs_privileged_in_the_hosts_namespaces() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = "rk-agent-image";
    let admin = kube_client("admin.kubeconfig").await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let agent = AgentContainer::start(node).await;
    let pods = TestPods::new("agent-image", agent.root.clone());
    let what = format!("node {node} Ready; the agent's log:\n{}", agent.logs());
    eventually(&what, Duration::from_secs(120), || async {
        nodes.get_opt(node).await.ok()?.filter(ready).map(|_| ())
    })
    .await;
    let pod = pods
        .create(node, {
            let mut pod = sleeper(serde_json::json!({}));
            pod["metadata"]["name"] = common::unique("agent-image").into();
            pod
        })
        .await
        .metadata
        .name
        .unwrap_or_default();
    let pods_api: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let what = format!(
        "pod {pod} Running and Ready; the agent's log:\n{}",
        agent.logs()
    );
    eventually(&what, Duration::from_secs(120), || async {
        pods_api
            .get_opt(&pod)
            .await
            .ok()?
            .filter(running_and_ready)
            .map(|_| ())
    })
    .await;
    // The pod's projected token reached the container through the shared root dir.
    let token = kubectl(&[
        "exec",
        &pod,
        "--",
        "cat",
        "/var/run/secrets/kubernetes.io/serviceaccount/namespace",
    ])
    .await;
    assert_eq!(token, "default");
    // The pod goes (the agent stops and removes it; nothing of it left on the host), then
    // the agent stops as a container stops: SIGTERM.
    drop(pods);
    agent.stop();
    assert!(
        agent.logs().contains("rkubelet stopped; pods keep running"),
        "{}",
        agent.logs()
    );
    drop(agent);
}
