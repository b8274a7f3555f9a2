//! rkubelet as the kubelet of a Debian 12 virtual machine on cgroup v2 (issue 44), booted
//! for real, once for every check here: `cluster.sh add-vm-node` boots the VM image (qemu,
//! software emulation: systemd 252 as PID 1 on cgroup v2 alone, containerd + runc with the
//! systemd cgroup driver, rkubelet as `kubelet.service`) on a tap of the cluster's
//! underlay and joins it as `kubeadm join` does, with the bootstrap token only. Then, from
//! inside the VM (its cgroup files, its journal, over SSH) and through the API server:
//!
//! - the QoS and pod cgroups are slices systemd made, with the kubelet's v2 values
//!   (`cpu.weight`, `cpu.max`, `memory.max`, `pids.max`, `hugetlb.2MB.max`), the kubelet's
//!   controllers enabled down the path, `kubepods` sized to the node;
//! - a container over its memory limit ends `OOMKilled` (the runtime reads v2's
//!   `memory.events`);
//! - `/stats/summary`, `/metrics/cadvisor` and `/metrics/resource` agree with the v2 files
//!   (`memory.current`, `memory.stat`, `cpu.stat`) within 5 %, and so does the node's
//!   `memory.available` (the eviction signal) with `/proc/meminfo` and the root's
//!   `memory.stat`;
//! - `kubectl logs`, `exec` and `port-forward` reach a pod in the VM;
//! - `systemctl restart kubelet` keeps every pod (same sandboxes, no restarts) and the
//!   journal holds rkubelet's log; `systemctl reboot` brings the node back Ready with its
//!   pods' sandboxes made again, as the kubelet makes them after a reboot;
//! - deleted pods' cgroups go;
//! - the same node switched to the cgroupfs driver (containerd's `SystemdCgroup` and the
//!   KubeletConfiguration's `cgroupDriver`, as an operator switches a drained node) makes
//!   the cgroupfs hierarchy on v2 (`/kubepods/burstable/pod<uid>`) with the same values;
//! - removing the VM node leaves nothing on the host (no qemu, SSH connection, tap device
//!   or state).
//!
//! Emulation is slow (a process costs 0.3–0.8 s, a busybox container 6–7 s): few pods, all
//! made at once, and read-only checks run side by side. The time of each phase is printed.

mod common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::pods::running_and_ready;
use common::{cleanup_blocking, cluster, eventually, kube_client, kubectl, state_dir};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};

/// The VM node's name (its hostname, its Node's).
const NODE: &str = "rk-vm1";
/// The label of this test's pods.
const LABEL: &str = "vm-node";
/// How long a pod may take to run in the emulated VM (pull, sandbox, container).
const POD_TIMEOUT: Duration = Duration::from_secs(240);

/// The VM node, added; dropped, it goes with all it holds (and this test's pods).
struct VmNode;

impl VmNode {
    async fn add() -> Self {
        forget_pods().await;
        cluster(&[
            "add-vm-node",
            NODE,
            "--binary",
            env!("CARGO_BIN_EXE_rkubelet"),
        ])
        .await;
        Self
    }
}

impl Drop for VmNode {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        let removed = cleanup_blocking(move || async move {
            if failed {
                let journal = in_vm_output(
                    "journalctl --no-pager -n 60 -u kubelet; journalctl --no-pager -n 20 -u containerd",
                )
                .await;
                eprintln!("---- the VM node's journal (kubelet, containerd)\n{journal}");
            }
            cluster(&["remove-vm-node", NODE]).await;
            // Its pods have no kubelet any more to finish them.
            forget_pods().await;
        });
        // A removal that failed fails the test (unless it fails already).
        assert!(
            removed.is_some() || failed,
            "removing the VM node or its pods failed (see above)"
        );
    }
}

/// This test's pods deleted at once (their node is gone, or a run before this one left
/// them).
async fn forget_pods() {
    let selector = format!("rk-test={LABEL}");
    kubectl(&[
        "delete",
        "pods",
        "-l",
        &selector,
        "--force",
        "--grace-period=0",
    ])
    .await;
}

/// `sh -c SCRIPT` inside the VM as root (its stdout and stderr), whatever its exit.
async fn in_vm_output(script: &str) -> String {
    let out = tokio::process::Command::new("bash")
        .arg(common::cluster_sh())
        .args(["vm-exec", NODE, script])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("cluster.sh vm-exec");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `sh -c SCRIPT` inside the VM as root: its stdout; a failure fails the test.
async fn in_vm(script: &str) -> String {
    cluster(&["vm-exec", NODE, script]).await
}

/// `NAME=VALUE` lines of the files of a cgroup directory in the VM (relative to
/// /sys/fs/cgroup), one read over SSH; a file that cannot be read is missing.
async fn cgroup_files(dir: &str, files: &[&str]) -> BTreeMap<String, String> {
    let script = format!(
        "cd /sys/fs/cgroup/{dir} && for f in {}; do [ -r $f ] && printf '%s=%s\\n' $f \"$(tr '\\n' ' ' <$f)\"; done; true",
        files.join(" ")
    );
    in_vm(&script)
        .await
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// Where the time of the test goes: each phase and its duration, printed as it ends and
/// all together at the end, to the process's stderr itself (the test harness keeps a
/// passing test's `eprintln!` to itself): the test command's log shows them.
struct Phases {
    start: Instant,
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

/// A line to the test process's stderr, past the harness's capture.
fn tell(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "[vm_node] {line}");
}

impl Phases {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            start: now,
            last: now,
            done: Vec::new(),
        }
    }

    fn mark(&mut self, phase: &'static str) {
        let now = Instant::now();
        self.done.push((phase, now - self.last));
        tell(&format!(
            "{phase}: {:.1} s",
            (now - self.last).as_secs_f64()
        ));
        self.last = now;
    }

    fn report(&self) {
        let mut text = String::from("where the time went:");
        for (phase, took) in &self.done {
            text += &format!("\n  {:>6.1} s  {phase}", took.as_secs_f64());
        }
        text += &format!("\n  {:>6.1} s  in all", self.start.elapsed().as_secs_f64());
        tell(&text);
    }
}

/// A container that sleeps and ends at SIGTERM. A PID 1 without a handler ignores it,
/// and a reboot then waits out systemd's stop timeout (90 s) for its scope, as on any
/// node whose kubelet has no graceful node shutdown.
const SLEEPER: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

/// A pod of this test, bound to the VM node: busybox with `command`, `resources`, its
/// restart policy, and a one-second grace period.
fn pod(name: &str, command: &str, resources: serde_json::Value, restart: &str) -> Pod {
    let mut pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "rk-test": LABEL } },
        "spec": {
            "nodeName": NODE,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "command": ["sh", "-c", command],
                "resources": resources
            }]
        }
    });
    // The web server is Ready once it listens.
    if command.contains("httpd") {
        pod["spec"]["containers"][0]["readinessProbe"] =
            serde_json::json!({ "tcpSocket": { "port": 80 }, "periodSeconds": 2 });
    }
    serde_json::from_value(pod).expect("a Pod")
}

/// The pods of the QoS checks: a Burstable web server (its log line, its page), a
/// Guaranteed pod with huge pages, a BestEffort sleeper.
fn qos_pods(suffix: &str) -> Vec<Pod> {
    vec![
        pod(
            &format!("vm-burstable{suffix}"),
            "mkdir -p /www && echo hello from the vm > /www/index.html && echo started $(hostname) && trap 'exit 0' TERM && httpd -f -p 80 -h /www & wait",
            serde_json::json!({
                "requests": { "cpu": "100m", "memory": "16Mi" },
                "limits": { "cpu": "250m", "memory": "64Mi" }
            }),
            "Always",
        ),
        pod(
            &format!("vm-guaranteed{suffix}"),
            SLEEPER,
            serde_json::json!({
                "requests": { "cpu": "100m", "memory": "32Mi", "hugepages-2Mi": "4Mi" },
                "limits": { "cpu": "100m", "memory": "32Mi", "hugepages-2Mi": "4Mi" }
            }),
            "Always",
        ),
        pod(
            &format!("vm-besteffort{suffix}"),
            SLEEPER,
            serde_json::json!({}),
            "Always",
        ),
    ]
}

/// Creates the pods at once.
async fn create(pods: &Api<Pod>, list: &[Pod]) {
    for p in list {
        pods.create(&PostParams::default(), p)
            .await
            .unwrap_or_else(|e| panic!("create {:?}: {e}", p.metadata.name));
    }
}

/// The named pods by name, if each runs and is Ready now.
async fn running_now(pods: &Api<Pod>, names: &[String]) -> Option<BTreeMap<String, Pod>> {
    let mut found = BTreeMap::new();
    for name in names {
        let p = pods.get_opt(name).await.ok()??;
        if !running_and_ready(&p) {
            return None;
        }
        found.insert(name.clone(), p);
    }
    Some(found)
}

/// Waits until each named pod runs and is Ready; answers them by name.
async fn all_running(pods: &Api<Pod>, names: &[String], what: &str) -> BTreeMap<String, Pod> {
    eventually(what, POD_TIMEOUT, || running_now(pods, names)).await
}

/// Deletes the named pods and waits until they are gone.
async fn delete_all(pods: &Api<Pod>, names: &[String]) {
    for name in names {
        pods.delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }
    eventually("the pods gone", POD_TIMEOUT, || async {
        for name in names {
            if pods.get_opt(name).await.ok()?.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
}

fn names(list: &[Pod]) -> Vec<String> {
    list.iter()
        .map(|p| p.metadata.name.clone().expect("a name"))
        .collect()
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().expect("a uid")
}

fn qos(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.qos_class.clone())
        .expect("a QoS class")
}

/// The first container's runtime id (without `containerd://`).
fn container_id(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("containerd://"))
        .expect("a containerd container id")
        .to_owned()
}

fn restart_count(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .map_or(-1, |c| c.restart_count)
}

/// The kubelet's v2 CPU weight for CPU shares (`getCpuWeight` in pkg/kubelet/cm): written
/// out here, not taken from rkubelet, so that the test checks it.
fn kubelet_cpu_weight(shares: u64) -> u64 {
    if shares >= 262_144 {
        10_000
    } else {
        1 + (shares - 2) * 9_999 / 262_142
    }
}

/// The kubelet's shares for a CPU request in millicores (`MilliCPUToShares`).
fn kubelet_shares(milli: u64) -> u64 {
    (milli * 1024 / 1000).max(2)
}

/// Where a pod's cgroup is, under /sys/fs/cgroup: systemd's slices, or cgroupfs' path.
fn pod_cgroup(driver: &str, p: &Pod) -> String {
    let uid = uid(p);
    let class = match qos(p).as_str() {
        "Guaranteed" => "",
        "Burstable" => "burstable",
        "BestEffort" => "besteffort",
        other => panic!("QoS class {other}"),
    };
    match (driver, class) {
        ("systemd", "") => format!("kubepods.slice/kubepods-pod{}.slice", uid.replace('-', "_")),
        ("systemd", c) => format!(
            "kubepods.slice/kubepods-{c}.slice/kubepods-{c}-pod{}.slice",
            uid.replace('-', "_")
        ),
        (_, "") => format!("kubepods/pod{uid}"),
        (_, c) => format!("kubepods/{c}/pod{uid}"),
    }
}

/// The controllers the kubelet needs in every cgroup of its own on v2.
const KUBELET_CONTROLLERS: [&str; 5] = ["cpu", "cpuset", "memory", "hugetlb", "pids"];

fn has_controllers(list: &str) -> bool {
    let list: Vec<&str> = list.split_whitespace().collect();
    KUBELET_CONTROLLERS.iter().all(|c| list.contains(c))
}

/// Each QoS pod's cgroup holds the kubelet's v2 values (`ResourceConfigForPod`), with its
/// controllers passed down to it, and its container inside.
async fn check_pod_cgroups(driver: &str, running: &BTreeMap<String, Pod>) {
    let files = [
        "cpu.weight",
        "cpu.max",
        "memory.max",
        "pids.max",
        "hugetlb.2MB.max",
        "cgroup.controllers",
    ];
    for p in running.values() {
        let dir = pod_cgroup(driver, p);
        let got = cgroup_files(&dir, &files).await;
        let (weight, max, memory, hugetlb) = match qos(p).as_str() {
            // requests 100m/16Mi, limits 250m/64Mi
            "Burstable" => (
                kubelet_cpu_weight(kubelet_shares(100)),
                "25000 100000",
                "67108864",
                "0",
            ),
            // 100m/32Mi, 4Mi of 2 MiB huge pages
            "Guaranteed" => (
                kubelet_cpu_weight(kubelet_shares(100)),
                "10000 100000",
                "33554432",
                "4194304",
            ),
            _ => (kubelet_cpu_weight(2), "max 100000", "max", "0"),
        };
        let want: BTreeMap<String, String> = [
            ("cpu.weight", weight.to_string()),
            ("cpu.max", max.to_owned()),
            ("memory.max", memory.to_owned()),
            ("pids.max", "max".to_owned()),
            ("hugetlb.2MB.max", hugetlb.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let values: BTreeMap<String, String> = got
            .iter()
            .filter(|(k, _)| *k != "cgroup.controllers")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(values, want, "{driver} driver, {dir}");
        assert!(
            has_controllers(got.get("cgroup.controllers").map_or("", String::as_str)),
            "{dir}: controllers {got:?}"
        );
        // runc put the container in the pod's cgroup.
        let id = container_id(p);
        let scope = if driver == "systemd" {
            format!("{dir}/cri-containerd-{id}.scope")
        } else {
            format!("{dir}/{id}")
        };
        in_vm(&format!("test -d /sys/fs/cgroup/{scope}")).await;
    }
}

/// The QoS cgroups: `kubepods` sized to the node (its CPUs' shares, its memory, PIDs and
/// huge pages), `burstable` with the shares of its pods' requests, `besteffort` with the
/// fewest; the kubelet's controllers enabled down to every pod.
async fn check_qos_cgroups(driver: &str, node: &Node, burstable_milli: u64) {
    let (kubepods, burstable, besteffort) = if driver == "systemd" {
        (
            "kubepods.slice",
            "kubepods.slice/kubepods-burstable.slice",
            "kubepods.slice/kubepods-besteffort.slice",
        )
    } else {
        ("kubepods", "kubepods/burstable", "kubepods/besteffort")
    };
    let capacity = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .expect("capacity");
    let cpus: u64 = capacity["cpu"].0.parse().expect("whole CPUs");
    let memory_kib: u64 = capacity["memory"]
        .0
        .strip_suffix("Ki")
        .and_then(|m| m.parse().ok())
        .expect("memory in Ki");
    assert_eq!(
        capacity["hugepages-2Mi"].0, "32Mi",
        "16 pages reserved at boot"
    );
    let pid_max = in_vm("cat /proc/sys/kernel/pid_max").await;
    let files = [
        "cpu.weight",
        "memory.max",
        "pids.max",
        "hugetlb.2MB.max",
        "cgroup.subtree_control",
    ];
    let top = cgroup_files(kubepods, &files).await;
    assert_eq!(
        top["cpu.weight"],
        kubelet_cpu_weight(kubelet_shares(cpus * 1000)).to_string()
    );
    assert_eq!(top["memory.max"], (memory_kib * 1024).to_string());
    assert_eq!(top["pids.max"], pid_max.trim());
    assert_eq!(top["hugetlb.2MB.max"], (32u64 << 20).to_string());
    assert!(has_controllers(&top["cgroup.subtree_control"]), "{top:?}");
    let b = cgroup_files(burstable, &files).await;
    assert_eq!(
        b["cpu.weight"],
        kubelet_cpu_weight(kubelet_shares(burstable_milli)).to_string()
    );
    assert_eq!(b["memory.max"], "max");
    assert_eq!(b["hugetlb.2MB.max"], (1u64 << 62).to_string());
    assert!(has_controllers(&b["cgroup.subtree_control"]), "{b:?}");
    let e = cgroup_files(besteffort, &files).await;
    assert_eq!(e["cpu.weight"], kubelet_cpu_weight(2).to_string());
    assert!(has_controllers(&e["cgroup.subtree_control"]), "{e:?}");
    // The root passes them down too (the kubelet enables them from the root).
    let root = in_vm("cat /sys/fs/cgroup/cgroup.subtree_control").await;
    assert!(has_controllers(&root), "root: {root}");
}

/// A figure of one series in Prometheus text: the value of the first line of `metric`
/// whose labels include every one of `labels`.
fn series(text: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit_once('}'))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
}

/// `value` within 5 % of the span `[low, high]` the files showed before and after.
fn within_5_percent(what: &str, value: f64, low: f64, high: f64) {
    assert!(
        value >= low * 0.95 && value <= high * 1.05,
        "{what}: {value} not within 5 % of the files' {low}..{high}"
    );
}

/// One of the VM node's kubelet endpoints, through the API server's node proxy.
async fn node_endpoint(endpoint: &str) -> String {
    let path = format!("/api/v1/nodes/{NODE}/proxy/{endpoint}");
    kubectl(&["get", "--raw", &path]).await
}

/// A container's figures as its v2 files give them: memory.current, the working set
/// (less `inactive_file`), CPU time in seconds (`usage_usec`).
#[derive(Debug, Clone, Copy)]
struct Files {
    usage: f64,
    working_set: f64,
    cpu_seconds: f64,
}

async fn container_files(scopes: &[String]) -> Vec<Files> {
    let script = scopes
        .iter()
        .map(|s| {
            format!(
                "cd /sys/fs/cgroup/{s} && echo $(cat memory.current) $(awk '$1==\"inactive_file\"{{print $2}}' memory.stat) $(awk '$1==\"usage_usec\"{{print $2}}' cpu.stat)"
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    in_vm(&script)
        .await
        .lines()
        .map(|l| {
            let n: Vec<f64> = l
                .split_whitespace()
                .map(|v| v.parse().expect("a number"))
                .collect();
            Files {
                usage: n[0],
                working_set: n[0] - n[1],
                cpu_seconds: n[2] / 1e6,
            }
        })
        .collect()
}

/// The node's stats endpoints through the API server against the v2 files: each
/// container's memory (usage, working set) and CPU time in `/stats/summary`,
/// `/metrics/cadvisor` and `/metrics/resource` within 5 % of what its cgroup's files
/// said just before and just after; and the node's `memory.available`, the eviction
/// signal, within 5 % of `MemFree` + the root's `inactive_file` (capacity less the
/// working set, as the kubelet computes it) at the same time.
async fn check_stats_against_files(running: &BTreeMap<String, Pod>) {
    let pods: Vec<&Pod> = running.values().collect();
    let scopes: Vec<String> = pods
        .iter()
        .map(|p| {
            format!(
                "{}/cri-containerd-{}.scope",
                pod_cgroup("systemd", p),
                container_id(p)
            )
        })
        .collect();
    // The stats come from a housekeeping every 10 s, as the kubelet's cAdvisor: the files
    // are read, then the endpoints once the summary holds a pass made after that read
    // (every pod's container in it, sampled later), then the files again. A counter's
    // figure lies between the two reads; a level's (memory) between them too, give or take.
    let node_files = "date -u +%Y-%m-%dT%H:%M:%S.%NZ; awk '/^MemFree:/{print $2 * 1024}' /proc/meminfo; awk '$1==\"inactive_file\"{print $2}' /sys/fs/cgroup/memory.stat";
    let before = container_files(&scopes).await;
    let node_before = in_vm(node_files).await;
    let read_at: Timestamp = node_before
        .lines()
        .next()
        .and_then(|t| t.parse().ok())
        .expect("the VM's time");
    let summary = eventually(
        "a /stats/summary pass with every pod's container, after the files were read",
        Duration::from_secs(90),
        || async {
            let summary: serde_json::Value =
                serde_json::from_str(&node_endpoint("stats/summary").await).ok()?;
            let sampled_after = |c: &serde_json::Value| {
                c["cpu"]["time"]
                    .as_str()
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .is_some_and(|t| t > read_at)
            };
            pods.iter()
                .all(|p| {
                    summary["pods"].as_array().is_some_and(|all| {
                        all.iter().any(|s| {
                            s["podRef"]["name"] == p.metadata.name.as_deref().unwrap_or_default()
                                && s["containers"].as_array().is_some_and(|cs| {
                                    cs.iter().any(|c| c["name"] == "main" && sampled_after(c))
                                })
                        })
                    })
                })
                .then_some(summary)
        },
    )
    .await;
    let (cadvisor, resource) = tokio::join!(
        node_endpoint("metrics/cadvisor"),
        node_endpoint("metrics/resource"),
    );
    let after = container_files(&scopes).await;
    let node_after = in_vm(node_files).await;
    for ((p, b), a) in pods.iter().zip(&before).zip(&after) {
        let name = p.metadata.name.as_deref().expect("a name");
        let id = container_id(p);
        let span = |f: fn(&Files) -> f64| (f(b).min(f(a)), f(b).max(f(a)));
        let (ws_low, ws_high) = span(|f| f.working_set);
        let (use_low, use_high) = span(|f| f.usage);
        let (cpu_low, cpu_high) = span(|f| f.cpu_seconds);
        let c = summary["pods"]
            .as_array()
            .expect("pods")
            .iter()
            .find(|s| s["podRef"]["name"] == name)
            .and_then(|s| {
                s["containers"]
                    .as_array()?
                    .iter()
                    .find(|c| c["name"] == "main")
            })
            .unwrap_or_else(|| panic!("{name} in the summary"));
        let field = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| panic!("{name}: {c}"));
        within_5_percent(
            &format!("{name}: summary workingSetBytes"),
            field(&c["memory"]["workingSetBytes"]),
            ws_low,
            ws_high,
        );
        within_5_percent(
            &format!("{name}: summary usageBytes"),
            field(&c["memory"]["usageBytes"]),
            use_low,
            use_high,
        );
        within_5_percent(
            &format!("{name}: summary usageCoreNanoSeconds"),
            field(&c["cpu"]["usageCoreNanoSeconds"]) / 1e9,
            cpu_low,
            cpu_high,
        );
        let labels = [("pod", name), ("container", "main")];
        for (metric, low, high) in [
            ("container_memory_working_set_bytes", ws_low, ws_high),
            ("container_cpu_usage_seconds_total", cpu_low, cpu_high),
        ] {
            let value = series(&resource, metric, &labels)
                .unwrap_or_else(|| panic!("{metric} of {name} in /metrics/resource"));
            within_5_percent(
                &format!("{name}: /metrics/resource {metric}"),
                value,
                low,
                high,
            );
        }
        let scope = format!("cri-containerd-{id}.scope");
        let cadvisor_id = scopes
            .iter()
            .find(|s| s.ends_with(&scope))
            .map(|s| format!("/{s}"))
            .expect("the scope");
        for (metric, low, high) in [
            ("container_memory_usage_bytes", use_low, use_high),
            ("container_memory_working_set_bytes", ws_low, ws_high),
            ("container_cpu_usage_seconds_total", cpu_low, cpu_high),
        ] {
            let value = series(&cadvisor, metric, &[("id", &cadvisor_id)])
                .unwrap_or_else(|| panic!("{metric} of {cadvisor_id} in /metrics/cadvisor"));
            within_5_percent(
                &format!("{name}: /metrics/cadvisor {metric}"),
                value,
                low,
                high,
            );
        }
    }
    // memory.available: MemFree + the root's inactive file pages.
    let available = |text: &str| -> f64 {
        text.lines()
            .skip(1)
            .map(|v| v.trim().parse::<f64>().expect("a number"))
            .sum()
    };
    let (a, b) = (available(&node_before), available(&node_after));
    within_5_percent(
        "the node's memory.available (summary availableBytes)",
        summary["node"]["memory"]["availableBytes"]
            .as_f64()
            .expect("node availableBytes"),
        a.min(b),
        a.max(b),
    );
}

/// A container that allocates past its 16 MiB limit is reported `OOMKilled` (exit code
/// 137), as the runtime reports it from v2's `memory.events`; then its pod goes.
///
/// containerd 1.6 handles the task's exit and its OOM event in the order they reach it: a
/// status read between the two says `Error` (the kubelet reads it at the same moment and
/// reports the same). On a busy node that happens to some kills, so the container runs
/// again (`OnFailure`) until one kill is reported `OOMKilled`, every kill exiting 137 as
/// `OOMKilled` or `Error`.
async fn check_oom_killed(pods: &Api<Pod>, name: &str) {
    let mut seen: BTreeMap<String, (Option<String>, i32)> = BTreeMap::new();
    let deadline = Instant::now() + POD_TIMEOUT;
    while !seen
        .values()
        .any(|(reason, _)| reason.as_deref() == Some("OOMKilled"))
    {
        assert!(
            Instant::now() < deadline,
            "no kill of the memory hog reported OOMKilled in {POD_TIMEOUT:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Ok(Some(p)) = pods.get_opt(name).await else {
            continue;
        };
        let status = p
            .status
            .and_then(|s| s.container_statuses?.into_iter().next());
        for state in status
            .into_iter()
            .flat_map(|s| [s.state, s.last_state])
            .flatten()
        {
            if let Some(t) = state.terminated {
                seen.insert(
                    t.container_id.clone().unwrap_or_default(),
                    (t.reason, t.exit_code),
                );
            }
        }
    }
    for (id, (reason, code)) in &seen {
        assert!(
            *code == 137 && matches!(reason.as_deref(), Some("OOMKilled" | "Error")),
            "{id}: {reason:?}, exit {code}"
        );
    }
    tell(&format!("memory hog kills seen: {seen:?}"));
    delete_all(pods, &[name.to_owned()]).await;
}

/// `kubectl logs`, `exec` and `port-forward` reach the Burstable web server in the VM.
async fn check_kubectl_reaches(name: &str) {
    let logs = kubectl(&["logs", name]).await;
    assert_eq!(logs.trim(), format!("started {name}"));
    let exec = kubectl(&["exec", name, "--", "cat", "/www/index.html"]).await;
    assert_eq!(exec.trim(), "hello from the vm");
    let answer = common::PortForward::start(name, 80).await.get().await;
    assert!(
        answer.starts_with("HTTP/1.") && answer.contains(" 200 "),
        "{answer}"
    );
    assert!(answer.contains("hello from the vm"), "{answer}");
}

/// The sandboxes and containers containerd holds in the VM (`crictl`-like, from `ctr`).
/// The memory hog's are left out: it is deleted once its kills are seen, and the agent
/// removes its dead sandbox and containers whenever its clean-up comes, restart or not
/// (one removed between the listing and its `info` is one of them, and left out too).
async fn runtime_ids() -> Vec<String> {
    let mut ids: Vec<String> = in_vm(
        "for c in $(ctr -n k8s.io containers ls -q); do \
           info=$(ctr -n k8s.io containers info \"$c\" 2>/dev/null) || continue; \
           printf '%s' \"$info\" | grep -q '\"io.kubernetes.pod.name\": \"vm-oom\"' || echo \"$c\"; \
         done",
    )
    .await
        .lines()
        .map(str::to_owned)
        .collect();
    ids.sort();
    ids
}

/// The cgroup directories left for pods in the VM, with either driver.
async fn pod_cgroups_left() -> String {
    in_vm(
        "find /sys/fs/cgroup/kubepods.slice /sys/fs/cgroup/kubepods -type d \\( -name '*-pod*.slice' -o -name 'pod[0-9a-f]*' \\) 2>/dev/null; true",
    )
        .await
}

/// Switches the node to another cgroup driver as an operator does on a drained node:
/// containerd's `SystemdCgroup` and the KubeletConfiguration's `cgroupDriver`, both
/// restarted; waits until the Node is Ready again.
async fn switch_driver(nodes: &Api<Node>, driver: &str) {
    let systemd = driver == "systemd";
    let restarted = Timestamp::now();
    in_vm(&format!(
        "set -e
         sed -i 's/^\\([[:space:]]*SystemdCgroup = \\).*/\\1{systemd}/' /etc/containerd/config.toml
         sed -i 's/^cgroupDriver: .*/cgroupDriver: {driver}/' /var/lib/kubelet/config.yaml
         systemctl restart containerd
         systemctl restart kubelet"
    ))
    .await;
    ready_again(nodes, restarted, "the kubelet with the other driver").await;
}

/// Waits until the Node is Ready with a heartbeat after `since` (an agent restarted then).
async fn ready_again(nodes: &Api<Node>, since: Timestamp, who: &str) {
    eventually(
        &format!("the node Ready, heartbeat by {who}"),
        POD_TIMEOUT,
        || async {
            let n = nodes.get(NODE).await.ok()?;
            let ready = n
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "True" && ready.last_heartbeat_time?.0 > since).then_some(())
        },
    )
    .await;
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn boot_id(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_vm_node_on_cgroup_v2_joins_runs_pods_and_lives_as_a_node() {
    let mut phases = Phases::new();
    let admin = kube_client("admin.kubeconfig").await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let vm = VmNode::add().await;
    phases.mark("add-vm-node: image (cached), boot, join to Ready");

    // Joined by TLS bootstrap from the token; the machine is on cgroup v2 alone, systemd
    // its PID 1, rkubelet its kubelet.service.
    let node = nodes.get(NODE).await.expect("the VM's Node");
    assert!(node_ready(&node), "{node:?}");
    common::assert_joined_by_bootstrap_token(&admin).await;
    let facts = in_vm(
        "stat -fc %T /sys/fs/cgroup; cat /proc/1/comm; systemctl is-active kubelet containerd; \
         readlink -f /proc/$(systemctl show -p MainPID --value kubelet)/exe; \
         grep -c client-certificate /etc/kubernetes/kubelet.conf",
    )
    .await;
    assert_eq!(
        facts.lines().collect::<Vec<_>>(),
        [
            "cgroup2fs",
            "systemd",
            "active",
            "active",
            "/usr/bin/rkubelet",
            "1"
        ],
        "{facts}"
    );

    // The pods, all at once: the QoS trio and a memory hog.
    let trio = qos_pods("");
    let hog = pod(
        "vm-oom",
        // The shim watches the container's memory.events once it has started it: a
        // process killed before that is reported as `Error` by containerd 1.6 (on v1 and
        // v2 alike); a workload that grows past its limit later is reported `OOMKilled`.
        "sleep 5; exec tail /dev/zero",
        serde_json::json!({ "limits": { "memory": "16Mi" } }),
        "OnFailure",
    );
    create(&pods, &trio).await;
    create(&pods, std::slice::from_ref(&hog)).await;
    let trio_names = names(&trio);
    let running = all_running(&pods, &trio_names, "the QoS pods Running and Ready").await;
    phases.mark("4 pods (systemd driver): create to Running");

    // Read-only checks side by side: the cgroup values, the stats against the files, the
    // OOM kill, kubectl's reach into the VM.
    tokio::join!(
        async {
            check_pod_cgroups("systemd", &running).await;
            // kubepods-burstable: the Burstable pod's 100m (the hog asks for no CPU).
            check_qos_cgroups("systemd", &nodes.get(NODE).await.expect("Node"), 100).await;
        },
        check_stats_against_files(&running),
        check_oom_killed(&pods, "vm-oom"),
        check_kubectl_reaches("vm-burstable"),
    );
    phases.mark("cgroup values, stats against the files, OOMKilled, logs/exec/port-forward");

    // `systemctl restart kubelet`: every pod as it was.
    let ids_before = runtime_ids().await;
    let journal_cursor =
        in_vm("journalctl -u kubelet -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p'")
            .await;
    let restarted = Timestamp::now();
    in_vm("systemctl restart kubelet").await;
    ready_again(&nodes, restarted, "the restarted kubelet").await;
    // A relist and a sync of every pod by the new agent change nothing.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let again = all_running(&pods, &trio_names, "the pods after the restart").await;
    for (name, p) in &again {
        assert_eq!(container_id(p), container_id(&running[name]), "{name}");
        assert_eq!(restart_count(p), 0, "{name}");
    }
    assert_eq!(
        runtime_ids().await,
        ids_before,
        "the sandboxes and containers"
    );
    // rkubelet's log is the kubelet journal: the new start is in it.
    let journal = in_vm(&format!(
        "journalctl -u kubelet --no-pager -o cat --after-cursor='{}'",
        journal_cursor.trim()
    ))
    .await;
    assert!(journal.contains("rkubelet running"), "{journal}");
    assert!(
        journal.contains("pod networking owned by the runtime"),
        "{journal}"
    );
    phases.mark("systemctl restart kubelet: pods kept");

    // `systemctl reboot`: the node comes back Ready, on a new boot, and its pods run again
    // in new sandboxes, each container started once more (its restart count up by one).
    let boot_before = boot_id(&nodes.get(NODE).await.expect("Node"));
    let _ = in_vm_output("systemctl reboot").await;
    eventually("the node Ready on a new boot", POD_TIMEOUT, || async {
        let n = nodes.get(NODE).await.ok()?;
        (node_ready(&n) && boot_id(&n) != boot_before && !boot_id(&n).is_empty()).then_some(())
    })
    .await;
    let rebooted = eventually(
        "the pods running again after the reboot",
        POD_TIMEOUT,
        || async {
            let now = running_now(&pods, &trio_names).await?;
            now.iter()
                .all(|(name, p)| container_id(p) != container_id(&running[name]))
                .then_some(now)
        },
    )
    .await;
    for (name, p) in &rebooted {
        assert_eq!(
            restart_count(p),
            1,
            "{name}: one more start after the reboot"
        );
    }
    check_pod_cgroups("systemd", &rebooted).await;
    phases.mark("systemctl reboot: node Ready, pods running again");

    // Deleted, their slices go.
    delete_all(&pods, &trio_names).await;
    eventually("the pod slices removed", POD_TIMEOUT, || async {
        pod_cgroups_left().await.trim().is_empty().then_some(())
    })
    .await;
    phases.mark("pods deleted, their slices removed");

    // The cgroupfs driver on v2: the same node switched, the same values in
    // /sys/fs/cgroup/kubepods/...
    switch_driver(&nodes, "cgroupfs").await;
    let trio = qos_pods("-fs");
    create(&pods, &trio).await;
    let trio_names = names(&trio);
    let running = all_running(&pods, &trio_names, "the QoS pods (cgroupfs) Running").await;
    check_pod_cgroups("cgroupfs", &running).await;
    check_qos_cgroups("cgroupfs", &nodes.get(NODE).await.expect("Node"), 100).await;
    delete_all(&pods, &trio_names).await;
    eventually(
        "the pod cgroups (cgroupfs) removed",
        POD_TIMEOUT,
        || async { pod_cgroups_left().await.trim().is_empty().then_some(()) },
    )
    .await;
    phases.mark("cgroupfs driver: 3 pods, values, removal");

    // Gone, and nothing of it on the host.
    let ip = common::internal_ip(&node);
    drop(vm);
    phases.mark("remove-vm-node");
    assert_nothing_left(&ip);
    phases.report();
}

/// No qemu or SSH process of the VM node, no tap device, no state left on the host.
fn assert_nothing_left(ip: &str) {
    let mut left = Vec::new();
    let dir = state_dir().join("vm").join(NODE);
    let dir_s = dir.display().to_string();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&dir_s) {
            left.push(format!("process {:?}: {cmdline}", entry.file_name()));
        }
    }
    let tap = format!("rkv-{}", ip.rsplit('.').next().expect("an octet"));
    let links = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link show");
    if String::from_utf8_lossy(&links.stdout).contains(&format!(" {tap}:")) {
        left.push(format!("tap {tap}"));
    }
    if dir.exists() {
        left.push(format!("state {dir_s}"));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    left.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&dir_s))
            .map(|l| format!("mount {l}")),
    );
    assert!(
        left.is_empty(),
        "the VM node left behind:\n  {}",
        left.join("\n  ")
    );
}
