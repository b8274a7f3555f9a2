//! Pod cgroups end to end, against the local cluster (cgroup v1, cgroupfs driver), as the
//! kubelet v1.20 with `--cgroups-per-qos` lays them out: each pod in `pod<uid>` under its
//! QoS cgroup (`kubepods` for Guaranteed, `kubepods/burstable`, `kubepods/besteffort`),
//! as the container itself sees it in `/proc/self/cgroup`; the pod and container cgroup
//! settings and `oom_score_adj` the kubelet's formulas give; a container over its
//! memory limit reported `OOMKilled`; and no pod cgroup left once a pod ends, is
//! deleted, or is found orphaned by a restarted agent (its processes killed first).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::case::{Case, delete_and_wait, get, running};
use common::eventually;
use common::pods::sandboxes_of;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// The v1 hierarchies the kubelet's settings go to.
const CGROUP: &str = "/sys/fs/cgroup";
const MI: i64 = 1 << 20;

/// A container that prints its cgroups and OOM score, then sleeps.
fn container(name: &str, resources: serde_json::Value) -> serde_json::Value {
    json!({
        "name": name,
        "image": "busybox",
        "command": ["sh", "-c", "cat /proc/self/cgroup; echo oom_score_adj=$(cat /proc/self/oom_score_adj); sleep 3600"],
        "resources": resources,
    })
}

fn pod(restart_policy: &str, containers: Vec<serde_json::Value>) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 1,
            "containers": containers,
        },
    })
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn read_i64(path: &Path) -> i64 {
    read(path)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{} unreadable", path.display()))
}

/// Every mounted cgroup hierarchy (v1 controllers and the hybrid v2 tree).
fn hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir(CGROUP)
        .expect("/sys/fs/cgroup")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().expect("uid")
}

/// The runtime's ID of the pod's container `name`.
fn container_id(p: &Pod, name: &str) -> String {
    let statuses = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    let cs = statuses
        .into_iter()
        .flatten()
        .find(|c| c.name == name)
        .expect("container status");
    let id = cs.container_id.as_deref().expect("container id");
    id.trim_start_matches("containerd://").to_owned()
}

/// What the container printed, once it printed its OOM score.
async fn output(case: &Case, p: &Pod, container: &str) -> String {
    let path = case.log_of(
        p.metadata.name.as_deref().unwrap_or_default(),
        &uid(p),
        container,
    );
    eventually(
        &format!("{} output", path.display()),
        Duration::from_secs(30),
        || async {
            let text = std::fs::read_to_string(&path).ok()?;
            // CRI log lines: `<time> <stream> <tag> <text>`.
            let lines: Vec<String> = text
                .lines()
                .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
                .collect();
            lines
                .iter()
                .any(|l| l.starts_with("oom_score_adj="))
                .then(|| lines.join("\n"))
        },
    )
    .await
}

fn oom_score_adj(output: &str) -> i64 {
    output
        .lines()
        .find_map(|l| l.strip_prefix("oom_score_adj="))
        .and_then(|v| v.parse().ok())
        .expect("oom_score_adj printed")
}

/// The container's cgroup path in the `memory` hierarchy, as it sees it.
fn memory_cgroup(output: &str) -> String {
    output
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, path)| path.to_owned()))
        .expect("memory line in /proc/self/cgroup")
}

/// The node's memory (`MemTotal`), the kubelet's memory capacity.
fn mem_total() -> i64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kb: i64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    kb * 1024
}

/// The node's CPU capacity, as registered.
async fn node_cpus() -> i64 {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
        kube::Api::all(common::kube_client("admin.kubeconfig").await);
    let node = nodes.get(&common::node_name()).await.expect("the node");
    let capacity = node.status.and_then(|s| s.capacity).expect("capacity");
    capacity["cpu"].0.parse().expect("whole CPUs")
}

/// The lowest `oom_score_adj` containerd lets containers have: its own
/// (`restrict_oom_score_adj`).
fn runtime_oom_floor() -> i64 {
    let pid = read(&common::state_dir().join("pids/containerd.pid")).expect("containerd pid");
    read_i64(&Path::new("/proc").join(pid).join("oom_score_adj"))
}

/// The kubelet's `MilliCPUToShares`.
fn shares(milli: i64) -> i64 {
    (milli * 1024 / 1000).max(2)
}

/// The kubelet's Burstable OOM score: `1000 - 1000 * request / capacity`, within 3..=999.
fn burstable_oom(request: i64) -> i64 {
    (1000 - 1000 * request / mem_total()).clamp(3, 999)
}

fn pod_gone_everywhere(qos_dir: &str, uid: &str) -> bool {
    hierarchies()
        .iter()
        .all(|h| !h.join(qos_dir).join(format!("pod{uid}")).exists())
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn pods_of_each_qos_class_get_the_kubelets_cgroups_and_oom_scores() {
    let case = Case::with_agent("cgroups", &[]).await;
    let guaranteed = case
        .create(
            "g",
            pod(
                "Always",
                vec![container(
                    "main",
                    json!({ "limits": { "cpu": "200m", "memory": "64Mi" } }),
                )],
            ),
        )
        .await;
    let burstable = case
        .create(
            "b",
            pod(
                "Always",
                vec![
                    container(
                        "a",
                        json!({ "requests": { "cpu": "100m", "memory": "32Mi" },
                            "limits": { "cpu": "300m", "memory": "64Mi" } }),
                    ),
                    container(
                        "b",
                        json!({ "requests": { "cpu": "50m", "memory": "16Mi" },
                            "limits": { "cpu": "100m", "memory": "32Mi" } }),
                    ),
                ],
            ),
        )
        .await;
    let partly = case
        .create(
            "p",
            pod(
                "Always",
                vec![
                    container("a", json!({ "requests": { "cpu": "250m" } })),
                    // A large request (never used) gives an OOM score well below 999.
                    container(
                        "b",
                        json!({ "requests": { "memory": "2Gi" }, "limits": { "memory": "3Gi" } }),
                    ),
                ],
            ),
        )
        .await;
    let best_effort = case
        .create("e", pod("Always", vec![container("main", json!({}))]))
        .await;

    // Guaranteed: directly under kubepods, with the pod's limits.
    let g = running(&guaranteed).await;
    let out = output(&case, &g, "main").await;
    let dir = format!("kubepods/pod{}", uid(&g));
    let cid = container_id(&g, "main");
    assert_eq!(memory_cgroup(&out), format!("/{dir}/{cid}"));
    let cpu = Path::new(CGROUP).join("cpu").join(&dir);
    let memory = Path::new(CGROUP).join("memory").join(&dir);
    assert_eq!(read_i64(&cpu.join("cpu.shares")), shares(200));
    assert_eq!(read_i64(&cpu.join("cpu.cfs_period_us")), 100_000);
    assert_eq!(
        read_i64(&cpu.join("cpu.cfs_quota_us")),
        200 * 100_000 / 1000
    );
    assert_eq!(read_i64(&memory.join("memory.limit_in_bytes")), 64 * MI);
    assert_eq!(read_i64(&cpu.join(&cid).join("cpu.shares")), shares(200));
    assert_eq!(read_i64(&cpu.join(&cid).join("cpu.cfs_quota_us")), 20_000);
    assert_eq!(
        read_i64(&memory.join(&cid).join("memory.limit_in_bytes")),
        64 * MI
    );
    // -997, or the least the runtime allows (containerd's restrict_oom_score_adj).
    assert_eq!(oom_score_adj(&out), (-997).max(runtime_oom_floor()));
    // The sandbox (pause) runs in the pod cgroup too, at the runtime's -998.
    let sandbox = sandboxes_of(&uid(&g)).await;
    let procs = read(&memory.join(&sandbox[0].id).join("cgroup.procs")).expect("sandbox cgroup");
    let pause = procs.lines().next().expect("the pause process");
    assert_eq!(
        read_i64(&Path::new("/proc").join(pause).join("oom_score_adj")),
        (-998).max(runtime_oom_floor())
    );

    // Burstable, every container limited: the pod gets the sums.
    let b = running(&burstable).await;
    let dir = format!("kubepods/burstable/pod{}", uid(&b));
    let cpu = Path::new(CGROUP).join("cpu").join(&dir);
    let memory = Path::new(CGROUP).join("memory").join(&dir);
    assert_eq!(read_i64(&cpu.join("cpu.shares")), shares(100 + 50));
    assert_eq!(
        read_i64(&cpu.join("cpu.cfs_quota_us")),
        (300 + 100) * 100_000 / 1000
    );
    assert_eq!(read_i64(&memory.join("memory.limit_in_bytes")), 96 * MI);
    for (name, request, cpu_limit, memory_limit) in [("a", 100, 300, 64), ("b", 50, 100, 32)] {
        let out = output(&case, &b, name).await;
        let cid = container_id(&b, name);
        assert_eq!(memory_cgroup(&out), format!("/{dir}/{cid}"));
        assert_eq!(
            read_i64(&cpu.join(&cid).join("cpu.shares")),
            shares(request)
        );
        assert_eq!(
            read_i64(&cpu.join(&cid).join("cpu.cfs_quota_us")),
            cpu_limit * 100
        );
        assert_eq!(
            read_i64(&memory.join(&cid).join("memory.limit_in_bytes")),
            memory_limit * MI
        );
        let request_bytes = if name == "a" { 32 * MI } else { 16 * MI };
        assert_eq!(oom_score_adj(&out), burstable_oom(request_bytes));
    }

    // Burstable, limits on some containers only: neither quota nor memory limit on the pod.
    let p = running(&partly).await;
    let dir = format!("kubepods/burstable/pod{}", uid(&p));
    let cpu = Path::new(CGROUP).join("cpu").join(&dir);
    assert_eq!(read_i64(&cpu.join("cpu.shares")), shares(250));
    assert_eq!(read_i64(&cpu.join("cpu.cfs_quota_us")), -1);
    let unlimited = read_i64(
        &Path::new(CGROUP)
            .join("memory")
            .join(&dir)
            .join("memory.limit_in_bytes"),
    );
    assert!(unlimited > 1 << 50, "no pod memory limit: {unlimited}");
    let out = output(&case, &p, "b").await;
    let adj = oom_score_adj(&out);
    assert_eq!(adj, burstable_oom(2048 * MI));
    assert!(adj < 999, "{adj}");

    // BestEffort: the fewest shares, the first to be OOM-killed.
    let e = running(&best_effort).await;
    let out = output(&case, &e, "main").await;
    let dir = format!("kubepods/besteffort/pod{}", uid(&e));
    assert_eq!(
        memory_cgroup(&out),
        format!("/{dir}/{}", container_id(&e, "main"))
    );
    assert_eq!(
        read_i64(&Path::new(CGROUP).join("cpu").join(&dir).join("cpu.shares")),
        2
    );
    assert_eq!(oom_score_adj(&out), 1000);

    // The QoS cgroups: kubepods sized to the node, burstable from its pods' requests.
    let kubepods = Path::new(CGROUP).join("cpu/kubepods");
    assert_eq!(
        read_i64(&kubepods.join("cpu.shares")),
        node_cpus().await * 1024
    );
    assert_eq!(
        read_i64(&Path::new(CGROUP).join("memory/kubepods/memory.limit_in_bytes")),
        mem_total() / 4096 * 4096
    );
    assert_eq!(read_i64(&kubepods.join("besteffort/cpu.shares")), 2);
    assert_eq!(
        read_i64(&kubepods.join("burstable/cpu.shares")),
        shares(100 + 50 + 250)
    );
    for h in hierarchies() {
        assert!(h.join("kubepods/burstable").is_dir(), "{}", h.display());
        assert!(h.join("kubepods/besteffort").is_dir(), "{}", h.display());
    }

    // Deleted: no pod cgroup left in any hierarchy.
    for (name, p, qos) in [
        (&guaranteed, &g, "kubepods"),
        (&burstable, &b, "kubepods/burstable"),
        (&partly, &p, "kubepods/burstable"),
        (&best_effort, &e, "kubepods/besteffort"),
    ] {
        delete_and_wait(name).await;
        assert!(pod_gone_everywhere(qos, &uid(p)), "{name}: pod cgroup left");
    }
    assert_eq!(read_i64(&kubepods.join("burstable/cpu.shares")), 2);
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_container_over_its_memory_limit_is_oom_killed_and_its_pod_cgroup_goes() {
    let case = Case::with_agent("cgroups-oom", &[]).await;
    let name = case
        .create(
            "oom",
            pod(
                "Never",
                vec![json!({
                    "name": "hog",
                    "image": "busybox",
                    // tail keeps the one endless line of /dev/zero in memory.
                    "command": ["tail", "/dev/zero"],
                    "resources": { "limits": { "memory": "16Mi" } },
                })],
            ),
        )
        .await;
    let failed = eventually("OOMKilled", Duration::from_secs(60), || async {
        let p = get(&name).await?;
        let state = p.status.as_ref()?.container_statuses.as_ref()?[0]
            .state
            .clone()?;
        let t = state.terminated?;
        Some((p, t))
    })
    .await;
    let (p, terminated) = failed;
    assert_eq!(
        terminated.reason.as_deref(),
        Some("OOMKilled"),
        "{terminated:?}"
    );
    assert_eq!(terminated.exit_code, 137);
    // A finished pod's cgroup goes while the pod stays in the API.
    let uid = uid(&p);
    eventually(
        "the pod cgroup removed",
        Duration::from_secs(30),
        || async { pod_gone_everywhere("kubepods/burstable", &uid).then_some(()) },
    )
    .await;
    assert!(get(&name).await.is_some());
    delete_and_wait(&name).await;
    drop(case);
}

/// A process of ours in a cgroup of ours: both removed at the end, also when the test
/// fails.
struct Leftover {
    child: std::process::Child,
    dirs: Vec<PathBuf>,
}

impl Drop for Leftover {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_orphaned_pod_cgroup_found_at_start_is_emptied_and_removed() {
    let mut case = Case::new("cgroups-orphan").await;
    // A pod cgroup no pod owns, as a crashed agent may leave, with a process in it.
    let orphan = format!("kubepods/besteffort/pod{}", common::unique("orphan"));
    let dirs: Vec<PathBuf> = ["cpu", "memory", "pids"]
        .iter()
        .map(|h| Path::new(CGROUP).join(h).join(&orphan))
        .collect();
    for d in &dirs {
        std::fs::create_dir_all(d).expect("orphan cgroup");
    }
    let mut leftover = Leftover {
        child: std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep"),
        dirs,
    };
    std::fs::write(
        leftover.dirs[0].join("cgroup.procs"),
        leftover.child.id().to_string(),
    )
    .expect("join the orphan cgroup");
    case.start_agent(&[]);
    eventually("orphan removed", Duration::from_secs(30), || async {
        leftover.dirs.iter().all(|d| !d.exists()).then_some(())
    })
    .await;
    let status = leftover.child.wait().expect("reaped");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the process left inside was killed: {status:?}"
    );
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn without_cgroups_per_qos_pods_get_no_pod_cgroup_and_are_moved_in_once_on() {
    let mut case = Case::with_agent("cgroups-off", &["--cgroups-per-qos=false"]).await;
    let name = case
        .create(
            "p",
            pod(
                "Always",
                vec![container("main", json!({ "requests": { "cpu": "100m" } }))],
            ),
        )
        .await;
    let p = running(&name).await;
    let out = output(&case, &p, "main").await;
    let cgroup = memory_cgroup(&out);
    assert!(!cgroup.contains("kubepods"), "{cgroup}");
    assert!(cgroup.ends_with(&container_id(&p, "main")), "{cgroup}");
    assert!(pod_gone_everywhere("kubepods/burstable", &uid(&p)));

    // With the QoS hierarchy again, the pod is restarted inside its pod cgroup.
    case.start_agent(&[]);
    let dir = Path::new(CGROUP)
        .join("memory/kubepods/burstable")
        .join(format!("pod{}", uid(&p)));
    eventually(
        "the container in its pod cgroup",
        Duration::from_secs(60),
        || async {
            let now = get(&name).await?;
            let id = container_id(&now, "main");
            let running = now.status.as_ref()?.container_statuses.as_ref()?[0]
                .state
                .as_ref()?
                .running
                .is_some();
            (running && dir.join(id).is_dir()).then_some(())
        },
    )
    .await;
    delete_and_wait(&name).await;
    assert!(pod_gone_everywhere("kubepods/burstable", &uid(&p)));
    drop(case);
}

/// rkubelet run with these flags on no cluster: its exit status and what it printed.
fn run_without_cluster(flags: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rkubelet"))
        .args([
            "run",
            "--kubeconfig",
            "/nonexistent",
            // A node named by an address needs no --node-ip (and no cluster).
            "--hostname-override",
            "192.0.2.1",
        ])
        .args(flags)
        .output()
        .expect("rkubelet");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_systemd_driver_needs_systemd_and_other_drivers_are_refused() {
    let (ok, stderr) = run_without_cluster(&["--cgroup-driver", "systemd"]);
    assert!(!ok);
    if Path::new("/run/systemd/system").is_dir() {
        // systemd answers: the start goes on to the (missing) kubeconfig.
        assert!(stderr.contains("/nonexistent"), "{stderr}");
    } else {
        assert!(
            stderr.contains("--cgroup-driver=systemd but systemd is not running"),
            "{stderr}"
        );
    }
    let (ok, stderr) = run_without_cluster(&["--cgroup-driver", "openrc"]);
    assert!(!ok);
    assert!(
        stderr.contains("--cgroup-driver=openrc is not supported"),
        "{stderr}"
    );
}
