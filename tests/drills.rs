//! Fault drills for the runtime and the API server (issue 16): containerd SIGKILLed and
//! started again in the middle of a 30-pod burst and of a 30-pod delete, and
//! kube-apiserver stopped for 60 s under running pods. Each drill takes the component down
//! through `scripts/cluster.sh kill|stop` (by recorded PID) and always brings it back
//! (an [`Outage`] restarts it when dropped, also when the test fails), then checks that
//! the node converges with nothing duplicated or leaked, and prints its recovery times.
//!
//! The drills disrupt the whole node: [`Case`] runs them one at a time.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::case::{Case, get, phase};
use common::pods::{pods_api, running_containers_of, sandboxes_of};
use common::{cluster, cluster_sh, cri, eventually, kube_client, node_name, unique};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use rkubelet::cri::{Cri, api};

/// Pods of the burst and delete drills.
const BURST: usize = 30;
/// How long the API server stays down.
const API_OUTAGE: Duration = Duration::from_secs(60);
/// host-local's reservations of the agent's network (`cni-config/10-rkubelet.conflist`).
const AGENT_NETWORK_DIR: &str = "/var/lib/cni/networks/rkubelet";

// ---------------------------------------------------------------- the cluster's components

/// A component taken down by a drill. Dropped while still down (a failed test), it is
/// started again, so that the tests after it (and the pods' clean-up) find the cluster up.
struct Outage {
    component: &'static str,
    down: bool,
}

impl Outage {
    /// SIGKILLs the component.
    async fn kill(component: &'static str) -> Self {
        cluster(&["kill", component]).await;
        Self {
            component,
            down: true,
        }
    }

    /// Stops the component (SIGTERM).
    async fn stop(component: &'static str) -> Self {
        cluster(&["stop", component]).await;
        Self {
            component,
            down: true,
        }
    }

    /// Starts the component again; returns once it serves.
    async fn end(&mut self) {
        cluster(&["start", self.component]).await;
        self.down = false;
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        if !self.down {
            return;
        }
        let status = std::process::Command::new("bash")
            .arg(cluster_sh())
            .args(["start", self.component])
            .stdin(std::process::Stdio::null())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!(
                "DRILL: could not start {} again: the cluster needs `cluster.sh start {}`",
                self.component, self.component
            );
        }
    }
}

// ---------------------------------------------------------------- what the drills look at

/// A pod that runs until it is told to stop, and stops at once then.
fn sleeper() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "sleep",
                "image": "busybox",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
            }]
        }
    })
}

/// Creates `n` sleepers `<label>-<i>` at once; their names.
async fn create_sleepers(case: &Case, n: usize) -> Vec<String> {
    let suffixes: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let creates = suffixes.iter().map(|i| case.create(i, sleeper()));
    futures::future::join_all(creates).await
}

/// How many of the test's pods are Running.
async fn count_running(case: &Case) -> usize {
    let pods = case.pods.list().await;
    pods.iter().filter(|p| phase(p) == Some("Running")).count()
}

/// Waits until `n` of the test's pods are Running.
async fn all_running(case: &Case, n: usize, timeout: Duration) {
    eventually(&format!("{n} pods Running"), timeout, || async {
        (count_running(case).await == n).then_some(())
    })
    .await;
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().expect("uid")
}

/// The Node's Ready condition: status, reason, message.
async fn node_ready() -> Option<(String, String, String)> {
    let nodes = Api::<Node>::all(kube_client("admin.kubeconfig").await);
    let node = nodes.get_opt(&node_name()).await.ok().flatten()?;
    let ready = node
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")?;
    Some((
        ready.status,
        ready.reason.unwrap_or_default(),
        ready.message.unwrap_or_default(),
    ))
}

/// Waits until the Node's Ready condition is `status`; its message then.
async fn node_ready_is(status: &str, timeout: Duration) -> String {
    eventually(&format!("node Ready={status}"), timeout, || async {
        node_ready()
            .await
            .filter(|(s, _, _)| s == status)
            .map(|(_, _, message)| message)
    })
    .await
}

/// The node's Lease renew time, in microseconds since the epoch.
async fn lease_renewed() -> Option<i64> {
    let leases = Api::<Lease>::namespaced(kube_client("admin.kubeconfig").await, "kube-node-lease");
    let lease = leases.get_opt(&node_name()).await.ok().flatten()?;
    let at = lease.spec?.renew_time?;
    Some(at.0.as_microsecond())
}

/// Every sandbox the runtime holds, by id.
async fn all_sandboxes() -> BTreeSet<String> {
    cri()
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .items
        .into_iter()
        .map(|s| s.id)
        .collect()
}

/// The agent network's host-local reservations: IP to the sandbox id holding it.
fn reservations() -> BTreeMap<String, String> {
    let dir = Path::new(AGENT_NETWORK_DIR);
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let ip = e.file_name().to_string_lossy().into_owned();
            ip.parse::<std::net::IpAddr>().ok()?;
            let text = std::fs::read_to_string(e.path()).ok()?;
            let holder = text.lines().next()?.trim().to_owned();
            Some((ip, holder))
        })
        .collect()
}

/// Waits until every reservation of the agent's network made since `before` was taken is
/// held by a sandbox the runtime still has: an IP leaked by a sandbox creation that the
/// runtime's death cut short would stay held by a sandbox nobody knows (until the agent's
/// network garbage collection, every 30 s, has seen it unlisted for 30 s).
async fn no_leaked_ip(before: &BTreeMap<String, String>, timeout: Duration) {
    let mut left = BTreeMap::new();
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let live = all_sandboxes().await;
        left = reservations();
        left.retain(|ip, holder| !live.contains(holder) && before.get(ip) != Some(holder));
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("IPs held by sandboxes the runtime does not have: {left:?}");
}

/// Waits until each pod has exactly one sandbox in the runtime, and it is ready.
async fn one_sandbox_each(pods: &[Pod], timeout: Duration) {
    for pod in pods {
        let uid = uid(pod);
        eventually(&format!("one ready sandbox for {uid}"), timeout, || async {
            let sandboxes = sandboxes_of(&uid).await;
            let ready = api::PodSandboxState::SandboxReady as i32;
            (sandboxes.len() == 1 && sandboxes[0].state == ready).then_some(())
        })
        .await;
    }
}

/// The agent process is still alive: it did not panic or exit.
fn assert_agent_alive(case: &Case) {
    let proc = Path::new("/proc").join(case.agent().pid().to_string());
    assert!(
        proc.join("stat").exists(),
        "the agent died: {}",
        case.agent().log_tail()
    );
}

/// Seconds with millisecond precision, for the printed figures.
fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

// ---------------------------------------------------------------- the drills

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn containerd_killed_during_a_30_pod_burst_every_pod_runs_once_the_runtime_is_back() {
    let case = Case::with_agent("drill-ctrd-burst", &[]).await;
    let ips_before = reservations();
    node_ready_is("True", Duration::from_secs(60)).await;

    let created = Instant::now();
    let names = create_sleepers(&case, BURST).await;
    // In the middle of the burst: some pods have their sandbox, most do not run yet.
    eventually("the burst under way", Duration::from_secs(60), || async {
        let mut with_sandbox = 0;
        for pod in case.pods.list().await {
            if !sandboxes_of(&uid(&pod)).await.is_empty() {
                with_sandbox += 1;
            }
        }
        (with_sandbox >= 3).then_some(())
    })
    .await;
    let running_at_kill = count_running(&case).await;
    let mut outage = Outage::kill("containerd").await;
    let killed = Instant::now();
    eprintln!(
        "DRILL containerd/burst: killed {} after the burst began, {running_at_kill}/{BURST} pods Running",
        secs(killed - created)
    );

    // The Node reports the outage (the kubelet's 30 s runtime threshold, then the next
    // status update).
    let message = node_ready_is("False", Duration::from_secs(75)).await;
    let noticed = killed.elapsed();
    assert!(
        message.contains("container runtime is down"),
        "Ready=False says {message:?}"
    );
    assert_agent_alive(&case);
    outage.end().await;
    let back = Instant::now();
    eprintln!(
        "DRILL containerd/burst: Node Ready=False ({message:?}) {} after the kill; runtime down for {}",
        secs(noticed),
        secs(back - killed)
    );

    all_running(&case, BURST, Duration::from_secs(180)).await;
    let all_up = back.elapsed();
    let ready_message = node_ready_is("True", Duration::from_secs(60)).await;
    let node_back = back.elapsed();
    let pods = case.pods.list().await;
    assert_eq!(pods.len(), BURST, "{names:?}");
    one_sandbox_each(&pods, Duration::from_secs(30)).await;
    no_leaked_ip(&ips_before, Duration::from_secs(100)).await;
    let record = case.pods.record();
    let most = pods
        .iter()
        .map(|p| {
            let u = uid(p);
            record.sandboxes.values().filter(|s| s.uid == u).count()
        })
        .max()
        .unwrap_or_default();
    eprintln!(
        "DRILL containerd/burst: runtime back -> all {BURST} pods Running in {}, Node Ready ({ready_message:?}) in {}; at most {most} sandboxes made for one pod, one left each",
        secs(all_up),
        secs(node_back)
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn containerd_killed_during_a_30_pod_delete_every_pod_is_removed_without_leaks() {
    let case = Case::with_agent("drill-ctrd-delete", &[]).await;
    let ips_before = reservations();
    node_ready_is("True", Duration::from_secs(60)).await;
    create_sleepers(&case, BURST).await;
    all_running(&case, BURST, Duration::from_secs(180)).await;
    let pods = case.pods.list().await;
    let uids: Vec<String> = pods.iter().map(uid).collect();

    let selector = ListParams::default().labels(&format!("rk-test={}", case.pods.label));
    let deleted = Instant::now();
    pods_api()
        .await
        .delete_collection(&DeleteParams::default(), &selector)
        .await
        .expect("delete the pods");
    // In the middle of the teardown: some containers are stopped, most pods are not gone.
    eventually(
        "the teardown under way",
        Duration::from_secs(30),
        || async {
            let mut stopped = 0;
            for uid in &uids {
                if running_containers_of(uid).await.is_empty() {
                    stopped += 1;
                }
            }
            (stopped >= 3).then_some(())
        },
    )
    .await;
    let left_at_kill = case.pods.list().await.len();
    let mut outage = Outage::kill("containerd").await;
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_agent_alive(&case);
    outage.end().await;
    let back = Instant::now();
    eprintln!(
        "DRILL containerd/delete: killed {} after the delete, {left_at_kill}/{BURST} pods still in the API; runtime down for {}",
        secs(killed - deleted),
        secs(back - killed)
    );

    eventually("every pod gone", Duration::from_secs(180), || async {
        case.pods.list().await.is_empty().then_some(())
    })
    .await;
    let gone = back.elapsed();
    for uid in &uids {
        eventually(
            &format!("nothing of {uid} in the runtime"),
            Duration::from_secs(30),
            || async { sandboxes_of(uid).await.is_empty().then_some(()) },
        )
        .await;
    }
    let clean = back.elapsed();
    no_leaked_ip(&ips_before, Duration::from_secs(100)).await;
    eprintln!(
        "DRILL containerd/delete: runtime back -> all {BURST} pods gone from the API in {}, from the runtime in {}",
        secs(gone),
        secs(clean)
    );
}

/// What a running pod is made of, to tell that nothing was restarted.
#[derive(Debug, PartialEq, Eq)]
struct Incarnation {
    sandbox: String,
    containers: BTreeSet<String>,
    restarts: i32,
}

async fn incarnation(pod: &Pod) -> Incarnation {
    let uid = uid(pod);
    let sandboxes = sandboxes_of(&uid).await;
    let ready = api::PodSandboxState::SandboxReady as i32;
    let sandbox = sandboxes
        .iter()
        .find(|s| s.state == ready)
        .map(|s| s.id.clone())
        .unwrap_or_default();
    let containers = running_containers_of(&uid)
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    let restarts = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or_default();
    Incarnation {
        sandbox,
        containers,
        restarts,
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn kube_apiserver_down_for_60_s_pods_keep_running_and_the_agent_resumes() {
    let case = Case::with_agent("drill-api", &[]).await;
    node_ready_is("True", Duration::from_secs(60)).await;
    let names = create_sleepers(&case, 4).await;
    all_running(&case, 4, Duration::from_secs(90)).await;
    let mut before: BTreeMap<String, (String, Incarnation)> = BTreeMap::new();
    for pod in case.pods.list().await {
        let name = pod.metadata.name.clone().expect("name");
        before.insert(name, (uid(&pod), incarnation(&pod).await));
    }
    assert!(
        before
            .values()
            .all(|(_, i)| !i.sandbox.is_empty() && i.containers.len() == 1),
        "{before:#?}"
    );
    // A write after the pods' last one: the restarted API server's watch cache starts
    // past the agent's last resource version, so its watch is answered 410 Gone.
    let configmaps = Api::<ConfigMap>::namespaced(kube_client("admin.kubeconfig").await, "default");
    let marker = unique("drill-rv");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": marker }, "data": { "why": "advance the resource version" }
    }))
    .expect("configmap");
    configmaps
        .create(&PostParams::default(), &cm)
        .await
        .expect("create configmap");
    configmaps
        .delete(&marker, &DeleteParams::default())
        .await
        .expect("delete configmap");
    let renewed_before = lease_renewed().await.expect("the node's lease");
    let log_before = std::fs::metadata(&case.agent().log).map_or(0, |m| m.len());

    let mut outage = Outage::stop("kube-apiserver").await;
    let stopped = Instant::now();
    // The pods keep running meanwhile: the same containers, looked at through the runtime.
    while stopped.elapsed() < API_OUTAGE {
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_agent_alive(&case);
        for (name, (uid, was)) in &before {
            let running: BTreeSet<String> = running_containers_of(uid)
                .await
                .into_iter()
                .map(|c| c.id)
                .collect();
            assert_eq!(
                running, was.containers,
                "{name}'s containers during the outage"
            );
        }
    }
    let starting = now_us();
    outage.end().await;
    let ready = Instant::now();
    let ready_after = since_us(starting, now_us());
    eprintln!(
        "DRILL apiserver: down for {} (stop to /readyz ok); /readyz {} after the start",
        secs(ready - stopped),
        secs(ready_after)
    );

    // The lease: renewed as soon as the API server answers (the renew time is the
    // agent's clock, which is this one).
    let lease_back = tokio::spawn(async move {
        eventually("the lease renewed", Duration::from_secs(30), || async {
            lease_renewed().await.filter(|t| *t > renewed_before)
        })
        .await
    });
    // The watch resumes: a pod created now runs, a pod deleted now is torn down. It comes
    // back after client-go's back-off, as the kubelet's: by the end of a 60 s outage the
    // waits between attempts are 25.6 s and up to twice that with jitter.
    const RESUME: Duration = Duration::from_secs(120);
    let created = case.create("after", sleeper()).await;
    let victim = names[0].clone();
    pods_api()
        .await
        .delete(&victim, &DeleteParams::default())
        .await
        .expect("delete a pod");
    let (lease_after, new_running, victim_gone) = tokio::join!(
        lease_back,
        async {
            eventually(&format!("{created} Running"), RESUME, || async {
                get(&created).await.filter(|p| phase(p) == Some("Running"))
            })
            .await;
            ready.elapsed()
        },
        async {
            eventually(&format!("{victim} gone"), RESUME, || async {
                get(&victim).await.is_none().then_some(())
            })
            .await;
            ready.elapsed()
        },
    );
    let lease_after = since_us(starting, lease_after.expect("lease task"));

    // Status converges: every pod Ready in the API, nothing restarted for the outage.
    eventually("every pod Ready in the API", RESUME, || async {
        let pods = case.pods.list().await;
        (pods.len() == 4 && pods.iter().all(pod_ready)).then_some(())
    })
    .await;
    let converged = ready.elapsed();
    for pod in case.pods.list().await {
        let name = pod.metadata.name.clone().expect("name");
        if let Some((_, was)) = before.get(&name) {
            assert_eq!(&incarnation(&pod).await, was, "{name} after the outage");
        }
    }
    let node = node_ready_is("True", Duration::from_secs(30)).await;

    // The agent's watch was answered 410 Gone and listed again.
    let log = std::fs::read(&case.agent().log).unwrap_or_default();
    let log = String::from_utf8_lossy(log.get(log_before as usize..).unwrap_or_default());
    let gone = log
        .lines()
        .map(strip_ansi)
        .find(|l| l.contains("pod watch failed") && l.contains("too old resource version"));
    let Some(gone) = gone else {
        panic!(
            "the pod watch got no 410 Gone after the outage:\n{}",
            case.agent().log_tail()
        );
    };
    let gone_at = gone
        .split_whitespace()
        .next()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| since_us(starting, t.as_microsecond()));
    eprintln!(
        "DRILL apiserver: after its start: /readyz {}, lease renewed {}, pod watch 410 Gone {} (then listed again); after /readyz: a new pod Running in {}, a deleted pod gone in {}, all pods Ready in the API in {}; Node {node:?}",
        secs(ready_after),
        secs(lease_after),
        gone_at.map_or_else(|| "?".to_owned(), secs),
        secs(new_running),
        secs(victim_gone),
        secs(converged),
    );
}

/// Now, in microseconds since the epoch.
fn now_us() -> i64 {
    Timestamp::now().as_microsecond()
}

/// The time from `from` to `to` (microseconds since the epoch); zero if `to` is earlier.
fn since_us(from: i64, to: i64) -> Duration {
    Duration::from_micros(u64::try_from(to - from).unwrap_or_default())
}

/// A log line without its colours.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
