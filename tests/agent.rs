//! The node agent end to end, against the local cluster: `rkubelet run` with only its node
//! identity, the seed's Deployment through the real scheduler and controllers, deletion
//! that leaves nothing behind, a crash in the middle of a rollout, a missing image, both
//! network owners, and the Node's readiness.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::agent::{AgentProcess, Owner};
use common::leaks::Recorder;
use common::pods::{is_ready as ready, pods_of_app as pods};
use common::{cri, eventually, kube_client, node_name, unique};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use rkubelet::cri::{Cri, api};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The tests share one node: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The agent's root dir for a node: one per node across tests, as on a real node, under
/// the cluster's state dir so that `scripts/cluster.sh down` removes whatever is left.
fn root_dir(node: &str) -> PathBuf {
    common::state_dir().join("test-agents").join(node)
}

async fn admin() -> kube::Client {
    kube_client("admin.kubeconfig").await
}

/// The second node identity (`scripts/test.sh` mints it): the same host as another node,
/// with a pod CIDR of its own, for runtime-owned networking next to the agent-owned one.
const SECOND_NODE: &str = "rk-node2";

async fn create_deployment(name: &str, image: &str, replicas: i32) {
    create_deployment_on(name, image, replicas, &node_name()).await;
}

async fn create_deployment_on(name: &str, image: &str, replicas: i32, node: &str) {
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name, "rk-test": name } },
                "spec": {
                    "nodeSelector": { "kubernetes.io/hostname": node },
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{ "name": "web", "image": image }]
                }
            }
        }
    }))
    .expect("deployment");
    Api::<Deployment>::namespaced(admin().await, "default")
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create deployment");
}

async fn all_ready(app: &str, n: usize, timeout: Duration) -> Vec<Pod> {
    eventually(&format!("{n} ready pods of {app}"), timeout, || async {
        let all = pods(app).await;
        (all.len() == n && all.iter().all(ready)).then_some(all)
    })
    .await
}

/// Deletes a test's Deployment when the test ends, also when it fails: gracefully, then by
/// force if its pods are not gone within 30 s (when no agent is left to stop them).
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let app = self.0.clone();
        common::cleanup_blocking(move || async move {
            delete_deployment(&app).await;
            let deadline = Instant::now() + Duration::from_secs(30);
            while !pods(&app).await.is_empty() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let api = Api::<Pod>::namespaced(admin().await, "default");
            let force = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            let _ = api
                .delete_collection(&force, &ListParams::default().labels(&format!("app={app}")))
                .await;
        });
    }
}

async fn delete_deployment(name: &str) {
    let _ = Api::<Deployment>::namespaced(admin().await, "default")
        .delete(name, &DeleteParams::foreground())
        .await;
}

async fn http_get(ip: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect((ip, 80))
        .await
        .expect("connect to pod");
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n")
        .await
        .expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("answer");
    answer
}

fn pod_cidr_contains(cidr: &str, ip: Ipv4Addr) -> bool {
    let (base, bits) = cidr.split_once('/').expect("a CIDR");
    let base: Ipv4Addr = base.parse().expect("IPv4 base");
    let bits: u32 = bits.parse().expect("prefix length");
    let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
    u32::from(base) & mask == u32::from(ip) & mask
}

/// The pod sandboxes of an app in the runtime (pod labels are copied onto sandboxes).
async fn sandboxes(app: &str, ready_only: bool) -> Vec<api::PodSandbox> {
    let state = ready_only.then(|| api::PodSandboxStateValue {
        state: api::PodSandboxState::SandboxReady.into(),
    });
    cri()
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: [("app".to_owned(), app.to_owned())].into(),
                state,
                ..Default::default()
            }),
        })
        .await
        .expect("ListPodSandbox")
        .items
}

/// host-local's reservations for the agent's network: one file per IP.
fn reserved_ips() -> BTreeSet<String> {
    let dir = Path::new("/var/lib/cni/networks/rkubelet");
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Ports of the agent's bridge: one veth per pod.
fn bridge_ports() -> usize {
    std::fs::read_dir("/sys/class/net/rk0/brif")
        .map(|d| d.count())
        .unwrap_or(0)
}

async fn node_pod_cidr() -> String {
    eventually("the node's pod CIDR", Duration::from_secs(30), || async {
        let node = Api::<Node>::all(admin().await)
            .get_opt(&node_name())
            .await
            .ok()
            .flatten()?;
        node.spec?.pod_cidr
    })
    .await
}

/// A pod's events by reason: how often each was seen (events count their repeats) and
/// the events themselves. `None` if the API could not be read.
async fn pod_events(pod: &str) -> Option<BTreeMap<String, (i32, Vec<Event>)>> {
    let all = Api::<Event>::namespaced(admin().await, "default")
        .list(&ListParams::default())
        .await
        .ok()?;
    let mut by_reason: BTreeMap<String, (i32, Vec<Event>)> = BTreeMap::new();
    for e in all.items {
        if e.involved_object.name.as_deref() != Some(pod) {
            continue;
        }
        let entry = by_reason
            .entry(e.reason.clone().unwrap_or_default())
            .or_default();
        entry.0 += e.count.unwrap_or(1);
        entry.1.push(e);
    }
    Some(by_reason)
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn seed_deployment_runs_serves_http_and_is_removed_without_leaks() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let agent = AgentProcess::start(Owner::Agent, &node_name(), root_dir(&node_name()));
    let app = unique("nginx");
    let leaks = Recorder::start(&app, &agent.root_dir);
    create_deployment(&app, "nginx", 3).await;
    let _cleanup = Cleanup(app.clone());
    let running = all_ready(&app, 3, Duration::from_secs(60)).await;
    let cidr = node_pod_cidr().await;
    let mut ips = BTreeSet::new();
    for p in &running {
        let status = p.status.as_ref().expect("status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.host_ip.as_deref(), Some(common::agent::NODE_IP));
        let ip: Ipv4Addr = status
            .pod_ip
            .as_deref()
            .expect("a pod IP")
            .parse()
            .expect("IPv4");
        assert!(
            pod_cidr_contains(&cidr, ip),
            "{ip} outside the node's pod CIDR {cidr}"
        );
        ips.insert(ip);
        let cs = &status
            .container_statuses
            .as_ref()
            .expect("container statuses")[0];
        assert!(
            cs.container_id
                .as_deref()
                .is_some_and(|id| id.starts_with("containerd://")),
            "{cs:?}"
        );
        assert!(cs.image_id.contains("sha256:"), "{cs:?}");
        let answer = http_get(&ip.to_string()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("Welcome to nginx!"), "{answer}");
    }
    assert_eq!(ips.len(), 3, "three distinct pod IPs: {ips:?}");
    assert_eq!(sandboxes(&app, true).await.len(), 3);
    assert_eq!(
        reserved_ips().len(),
        3,
        "one reservation per pod: {:?}",
        reserved_ips()
    );
    assert_eq!(bridge_ports(), 3, "one veth per pod");
    let pod_name = running[0].metadata.name.clone().expect("name");
    let reasons: BTreeSet<String> = pod_events(&pod_name)
        .await
        .expect("events")
        .into_keys()
        .collect();
    for reason in ["Pulling", "Pulled", "Created", "Started"] {
        assert!(
            reasons.contains(reason),
            "event {reason} missing: {reasons:?}"
        );
    }

    let started = Instant::now();
    delete_deployment(&app).await;
    // The pod directories go last, after the API delete and the sandbox removal.
    let pod_dirs_left = || {
        agent
            .root_dir
            .join("pods")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some())
    };
    eventually(
        "every pod, sandbox, veth, reservation and pod dir gone",
        Duration::from_secs(35),
        || async {
            let gone = pods(&app).await.is_empty()
                && sandboxes(&app, false).await.is_empty()
                && reserved_ips().is_empty()
                && bridge_ports() == 0
                && !pod_dirs_left();
            gone.then_some(())
        },
    )
    .await;
    let elapsed = started.elapsed();
    eprintln!("3 pods removed with everything they had in {elapsed:?}");
    leaks.assert_nothing_left(&agent.root_dir).await;
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_crash_mid_rollout_then_restart_adopts_instead_of_duplicating() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let root = root_dir(&node_name());
    let agent = AgentProcess::start(Owner::Agent, &node_name(), root.clone());
    // Let the node register first, so the rollout is really under way at the crash.
    node_pod_cidr().await;
    let app = unique("rollout");
    let leaks = Recorder::start(&app, &root);
    create_deployment(&app, "nginx", 10).await;
    let _cleanup = Cleanup(app.clone());
    eventually(
        "some sandboxes of the rollout",
        Duration::from_secs(30),
        || async { (!sandboxes(&app, false).await.is_empty()).then_some(()) },
    )
    .await;
    agent.crash();
    let agent = AgentProcess::start(Owner::Agent, &node_name(), root.clone());
    let running = all_ready(&app, 10, Duration::from_secs(90)).await;
    let ips: BTreeSet<_> = running
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    assert_eq!(ips.len(), 10, "ten distinct IPs: {ips:?}");
    // IPs reserved by an ADD the crash cut short are released by the agent's network
    // garbage collection (at start-up, or within two 30 s periods).
    eventually(
        "exactly ten sandboxes and ten reservations",
        Duration::from_secs(75),
        || async {
            let all = sandboxes(&app, false).await;
            (all.len() == 10 && reserved_ips().len() == 10).then_some(())
        },
    )
    .await;
    let reserved = reserved_ips();
    assert_eq!(reserved, ips, "every reservation belongs to a running pod");
    delete_deployment(&app).await;
    eventually("rollout removed", Duration::from_secs(40), || async {
        pods(&app).await.is_empty().then_some(())
    })
    .await;
    // A pod leaves the API only once its sandboxes are stopped: networks torn down, IPs
    // released. The stopped sandboxes are removed right after, as the kubelet's GC does.
    assert!(
        reserved_ips().is_empty(),
        "IPs still reserved after the pods left the API: {:?}",
        reserved_ips()
    );
    let removed = tokio::time::timeout(Duration::from_secs(10), async {
        while !sandboxes(&app, false).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    if removed.await.is_err() {
        panic!("sandboxes left:\n{}", agent.log_tail());
    }
    leaks.assert_nothing_left(&root).await;
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_missing_image_reports_err_image_pull_then_back_off() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let agent = AgentProcess::start(Owner::Agent, &node_name(), root_dir(&node_name()));
    let app = unique("badimage");
    let leaks = Recorder::start(&app, &agent.root_dir);
    create_deployment(&app, "docker.io/library/does-not-exist:1", 1).await;
    let _cleanup = Cleanup(app.clone());
    let reasons = eventually("ImagePullBackOff", Duration::from_secs(60), || async {
        let p = pods(&app).await.into_iter().next()?;
        let status = p.status?.container_statuses?.into_iter().next()?;
        let reason = status.state?.waiting?.reason?;
        (reason == "ImagePullBackOff").then_some(p.metadata.name)
    })
    .await;
    let name = reasons.expect("pod name");
    let events = eventually(
        "Failed and BackOff events",
        Duration::from_secs(20),
        || async {
            let mine: BTreeSet<String> = pod_events(&name).await?.into_keys().collect();
            (mine.contains("Failed") && mine.contains("BackOff")).then_some(mine)
        },
    )
    .await;
    assert!(events.contains("Pulling"), "{events:?}");
    delete_deployment(&app).await;
    eventually(
        "pod and its sandboxes removed",
        Duration::from_secs(40),
        || async {
            (pods(&app).await.is_empty() && sandboxes(&app, false).await.is_empty()).then_some(())
        },
    )
    .await;
    leaks.assert_nothing_left(&agent.root_dir).await;
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_failing_cni_plugin_reports_failed_create_pod_sandbox_and_retries_without_leaks() {
    let _turn = ONE_AT_A_TIME.lock().await;
    // host-local refuses a rangeStart outside the subnet: every ADD fails after the bridge
    // plugin made its veth, so the agent must roll the chain back each time.
    let conf_dir = root_dir("broken-cni");
    std::fs::create_dir_all(&conf_dir).expect("conf dir");
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/cni-config/10-rkubelet.conflist"
    ))
    .expect("conflist");
    let broken = shipped.replace(
        r#"{"subnet": "{{.PodCIDR}}"}"#,
        r#"{"subnet": "{{.PodCIDR}}", "rangeStart": "10.255.255.5"}"#,
    );
    assert_ne!(shipped, broken, "the conflist has the expected range");
    std::fs::write(conf_dir.join("10-broken.conflist"), broken).expect("write conflist");
    let agent = AgentProcess::start_with_cni_conf(
        Owner::Agent,
        &node_name(),
        root_dir(&node_name()),
        &conf_dir,
    );
    let app = unique("badcni");
    let leaks = Recorder::start(&app, &root_dir(&node_name()));
    create_deployment(&app, "nginx", 1).await;
    let _cleanup = Cleanup(app.clone());
    let pod = eventually("a pod", Duration::from_secs(30), || async {
        pods(&app).await.into_iter().next()
    })
    .await;
    let name = pod.metadata.name.clone().expect("name");
    // The failed sandbox stays in containerd, NotReady, its network half made; as broken
    // DEL cannot stop it, the agent does not make another (as the kubelet's SyncPod, which
    // returns when killing the old sandbox fails) but retries the stop with back-off.
    let events = eventually(
        "FailedCreatePodSandBox, then FailedKillPod retried",
        Duration::from_secs(60),
        || async {
            let by_reason = pod_events(&name).await?;
            let kills = by_reason.get("FailedKillPod").map_or(0, |k| k.0);
            (by_reason.contains_key("FailedCreatePodSandBox") && kills >= 2).then_some(by_reason)
        },
    )
    .await;
    let failures = &events["FailedCreatePodSandBox"].1;
    assert_eq!(
        sandboxes(&app, false).await.len(),
        1,
        "no new sandbox while the failed one holds its network"
    );
    let kill = events["FailedKillPod"].1[0]
        .message
        .clone()
        .unwrap_or_default();
    assert!(kill.contains("StopPodSandbox"), "{kill}");
    let message = failures[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("RangeStart 10.255.255.5"),
        "the plugin's own error reaches the event: {message}"
    );
    let status = pods(&app)
        .await
        .into_iter()
        .next()
        .and_then(|p| p.status)
        .expect("status");
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let waiting = status
        .container_statuses
        .and_then(|c| c.into_iter().next()?.state?.waiting?.reason);
    assert_eq!(waiting.as_deref(), Some("ContainerCreating"));
    assert!(sandboxes(&app, true).await.is_empty(), "no sandbox runs");
    assert!(
        reserved_ips().is_empty(),
        "no IP is kept: {:?}",
        reserved_ips()
    );
    assert_eq!(bridge_ports(), 0, "no veth is kept");

    // The broken config breaks DEL too, so the failed sandbox cannot be stopped and the
    // pod stays Terminating, as with the kubelet. Fixing the config (an agent restart with
    // the good one) lets everything go.
    delete_deployment(&app).await;
    agent.stop();
    let agent = AgentProcess::start(Owner::Agent, &node_name(), root_dir(&node_name()));
    eventually(
        "pod and every sandbox removed after the fix",
        Duration::from_secs(60),
        || async {
            (pods(&app).await.is_empty() && sandboxes(&app, false).await.is_empty()).then_some(())
        },
    )
    .await;
    assert!(reserved_ips().is_empty() && bridge_ports() == 0);
    leaks.assert_nothing_left(&agent.root_dir).await;
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn runtime_owned_networking_takes_the_ip_from_the_sandbox_status() {
    let _turn = ONE_AT_A_TIME.lock().await;
    // Two network owners cannot share one node's pod CIDR on one host (their bridges would
    // route the same subnet): the runtime-owned agent is a second node with its own CIDR.
    let agent = AgentProcess::start(Owner::Runtime, SECOND_NODE, root_dir(SECOND_NODE));
    let app = unique("rtnet");
    let leaks = Recorder::start(&app, &agent.root_dir);
    create_deployment_on(&app, "nginx", 1, SECOND_NODE).await;
    let _cleanup = Cleanup(app.clone());
    let running = all_ready(&app, 1, Duration::from_secs(60)).await;
    let ip = running[0]
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    assert!(http_get(&ip).await.starts_with("HTTP/1.1 200"));
    assert!(
        reserved_ips().is_empty(),
        "the agent's own network is not used"
    );
    delete_deployment(&app).await;
    eventually("pod removed", Duration::from_secs(40), || async {
        pods(&app).await.is_empty().then_some(())
    })
    .await;
    leaks.assert_nothing_left(&agent.root_dir).await;
    agent.stop();
    // The second node is this test's alone.
    let _ = Api::<Node>::all(admin().await)
        .delete(SECOND_NODE, &DeleteParams::default())
        .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_node_is_ready_and_turns_not_ready_once_its_lease_expires() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let agent = AgentProcess::start(Owner::Agent, &node_name(), root_dir(&node_name()));
    let nodes = Api::<Node>::all(admin().await);
    let condition = |n: &Node| {
        n.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status.clone())
    };
    let heartbeat = |n: &Node| {
        let ready = n
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready")?;
        ready.last_heartbeat_time.clone()
    };
    let started = k8s_openapi::jiff::Timestamp::now();
    // Ready, as posted by this agent (a heartbeat newer than its start).
    eventually("node Ready", Duration::from_secs(30), || async {
        let n = nodes.get_opt(&node_name()).await.ok().flatten()?;
        let fresh = heartbeat(&n).is_some_and(|t| t.0 >= started - Duration::from_secs(1));
        (fresh && condition(&n).as_deref() == Some("True")).then_some(())
    })
    .await;
    agent.stop();
    let stopped = Instant::now();
    // kube-controller-manager sees the lease expire (40 s) and marks Ready Unknown.
    eventually("node Ready=Unknown", Duration::from_secs(90), || async {
        let n = nodes.get_opt(&node_name()).await.ok().flatten()?;
        (condition(&n).as_deref() == Some("Unknown")).then_some(())
    })
    .await;
    eprintln!(
        "node NotReady (Unknown) {:?} after the agent stopped",
        stopped.elapsed()
    );
}
