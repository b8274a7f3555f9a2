//! `rkubelet inspect` against the real node: what it reports of a pod (namespaces, veth,
//! bridge, IP, host-local reservation, NAT rules) is checked against what the system
//! itself shows — the containers' own /proc entries, /sys/class/net, the Pod's status —
//! also with the agent stopped; the start-up timeline comes in the kubelet's order and
//! accounts for the pod's create → Ready time as a watch sees it; the pictures are
//! well-formed SVG with one element per pod and per step.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::case::{Case, get, running};
use common::pods::{exec_in, pods_api};
use common::{eventually, state_dir};
use futures::StreamExt;
use kube::runtime::watcher;
use serde_json::Value;

const HOST_PORT: i64 = 31_880;

/// Runs `rkubelet inspect <args>` with the test agent's flags; its stdout, or its stderr
/// as the error.
fn inspect(root_dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rkubelet"))
        .arg("inspect")
        .args(args)
        .arg("--root-dir")
        .arg(root_dir)
        .arg("--runtime-cni-conf-dir")
        .arg(state_dir().join("cni/net.d"))
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run rkubelet inspect");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn inspect_json(root_dir: &Path, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = inspect(root_dir, &all).unwrap_or_else(|e| panic!("inspect {args:?}: {e}"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("inspect {args:?} JSON: {e}\n{out}"))
}

/// A busybox pod with an init container and a container `c` with a host port and a
/// readiness probe that passes once the container has written /tmp/ready.
fn pod() -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{"name": "init", "image": "busybox", "command": ["true"]}],
            "containers": [{
                "name": "c",
                "image": "busybox",
                "command": ["sh", "-c", "touch /tmp/ready; exec sleep 3600"],
                "ports": [{"containerPort": 8080, "hostPort": HOST_PORT}],
                "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1},
            }],
        },
    })
}

/// The inode of a namespace as the container itself sees it (`/proc/self/ns/<kind>`).
async fn inode_inside(uid: &str, kind: &str) -> u64 {
    let out = exec_in(
        uid,
        "c",
        vec!["readlink".into(), format!("/proc/self/ns/{kind}")],
    )
    .await;
    let link = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    link.strip_prefix(&format!("{kind}:["))
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{kind} link inside the container: {link:?}"))
}

fn sys_net(name: &str, file: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/net/{name}/{file}"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn inspect_pod_matches_what_the_system_shows_also_with_the_agent_stopped() {
    let mut case = Case::with_agent("inspect", &[]).await;
    let name = case.create("pod", pod()).await;
    let created = running(&name).await;
    let uid = created.metadata.uid.clone().expect("uid");
    let pod_ip = eventually("the pod's IP", Duration::from_secs(30), || async {
        get(&name).await?.status?.pod_ip
    })
    .await;
    let root = case.agent().root_dir.clone();
    let view = inspect_json(&root, &["pod", &format!("default/{name}")]);
    assert_eq!(view["uid"], uid.as_str());
    let sandbox_id = view["sandbox"]["id"]
        .as_str()
        .expect("sandbox id")
        .to_owned();
    assert_eq!(view["sandbox"]["state"], "SANDBOX_READY");
    assert!(view["sandbox"]["pausePid"].as_u64().is_some(), "{view:#}");

    // Namespaces: for each kind, the container's own /proc says the same inode as the
    // pause process's exactly when inspect says it is shared.
    let container = view["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == "c" && c["state"] == "CONTAINER_RUNNING")
        .expect("container c")
        .clone();
    let shared: Vec<&str> = container["sharedNamespaces"]
        .as_array()
        .expect("shared")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for kind in ["net", "ipc", "uts", "pid", "mnt"] {
        let pause_inode = view["sandbox"]["namespaces"]
            .as_array()
            .expect("namespaces")
            .iter()
            .find(|n| n["kind"] == kind)
            .and_then(|n| n["inode"].as_u64())
            .unwrap_or_else(|| panic!("pause {kind}: {view:#}"));
        let inside = inode_inside(&uid, kind).await;
        assert_eq!(
            inside == pause_inode,
            shared.contains(&kind),
            "{kind}: inside {inside}, pause {pause_inode}, shared {shared:?}"
        );
    }
    assert!(shared.contains(&"net") && !shared.contains(&"pid") && !shared.contains(&"mnt"));
    assert!(
        container["cgroup"]
            .as_str()
            .is_some_and(|c| c.contains(&uid)),
        "{container:#}"
    );
    assert!(
        container["mounts"]
            .as_array()
            .is_some_and(|m| !m.is_empty())
    );

    // The veth's host end really is attached to the bridge, with that ifindex.
    let net = &view["network"];
    let veth = net["hostVeth"]["name"]
        .as_str()
        .expect("host veth")
        .to_owned();
    let bridge = net["hostVeth"]["bridge"]
        .as_str()
        .expect("bridge")
        .to_owned();
    let master = std::fs::read_link(format!("/sys/class/net/{veth}/master")).expect("master");
    assert_eq!(
        master.file_name().and_then(|n| n.to_str()),
        Some(bridge.as_str())
    );
    assert_eq!(
        sys_net(&veth, "ifindex"),
        net["hostVeth"]["index"].to_string()
    );
    // The pod's eth0 has the Pod status's IP, and its peer is that veth.
    let eth0 = net["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .find(|l| l["name"] == "eth0")
        .expect("eth0")
        .clone();
    assert!(
        eth0["addresses"]
            .as_array()
            .expect("addresses")
            .iter()
            .any(|a| a["address"] == pod_ip.as_str()),
        "{eth0:#} vs {pod_ip}"
    );
    assert_eq!(eth0["peerIndex"], net["hostVeth"]["index"]);
    assert_eq!(sys_net(&veth, "iflink"), eth0["index"].to_string());
    // host-local's reservation of that IP is the sandbox's.
    let reservation = net["reservation"]["path"]
        .as_str()
        .expect("reservation")
        .to_owned();
    assert!(
        reservation.ends_with(&format!("/{pod_ip}")),
        "{reservation}"
    );
    let holder = std::fs::read_to_string(&reservation).expect("reservation file");
    assert!(holder.starts_with(&sandbox_id), "{holder:?}");
    // The host port's DNAT rule.
    let rules = net["portRules"].as_array().expect("rules");
    assert!(
        rules.iter().any(|r| r
            .as_str()
            .is_some_and(|r| r.contains(&format!("{pod_ip}:8080")))),
        "{rules:#?}"
    );
    assert_eq!(net["portMappings"][0]["hostPort"], HOST_PORT);

    // The node's view has the pod, with the same IP and veth, and the bridge's port.
    let node = inspect_json(&root, &["node"]);
    let link = node["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .find(|p| p["name"] == name.as_str())
        .expect("the pod on the node")
        .clone();
    assert_eq!(
        link["ip"].as_str().and_then(|ip| ip.split('/').next()),
        Some(pod_ip.as_str())
    );
    assert_eq!(link["hostVeth"], veth.as_str());
    assert_eq!(node["networkOwner"], "agent");
    assert!(
        node["bridge"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .any(|p| p == veth.as_str())
    );
    let svg = inspect(&root, &["node", "--output", "svg"]).expect("node svg");
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let pods_drawn = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("pod"))
        .count();
    assert_eq!(pods_drawn, node["pods"].as_array().expect("pods").len());

    // With the agent stopped, the system still tells the same; the timeline, kept by the
    // agent, is said to be out of reach.
    case.stop_agent();
    let stopped = inspect_json(&root, &["pod", &format!("default/{name}")]);
    assert_eq!(stopped["sandbox"]["id"], sandbox_id.as_str());
    assert_eq!(stopped["network"]["hostVeth"]["name"], veth.as_str());
    let err = inspect(&root, &["timeline", &format!("default/{name}")]).expect_err("no agent");
    assert!(
        err.contains("is rkubelet running with this --root-dir?"),
        "{err}"
    );
    case.start_agent(&[]);
}

/// When (wall clock) the watch saw the pod Ready.
async fn watch_until_ready(
    label: String,
    created: tokio::sync::oneshot::Receiver<()>,
) -> SystemTime {
    let api = pods_api().await;
    let stream = watcher(
        api,
        watcher::Config::default().labels(&format!("rk-test={label}")),
    );
    let mut stream = std::pin::pin!(stream);
    let mut created = Some(created);
    while let Some(event) = stream.next().await {
        if let Some(rx) = created.take() {
            // The watch is established: let the test create the pod.
            drop(rx);
        }
        let pods: Vec<_> = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => vec![p],
            _ => continue,
        };
        for p in pods {
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                return SystemTime::now();
            }
        }
    }
    panic!("the watch ended");
}

fn first(steps: &[Value], what: impl Fn(&Value) -> bool, name: &str) -> Value {
    steps
        .iter()
        .find(|s| what(s))
        .cloned()
        .unwrap_or_else(|| panic!("no step {name} in {steps:#?}"))
}

fn start(s: &Value) -> f64 {
    s["startMs"].as_f64().expect("startMs")
}

fn end(s: &Value) -> f64 {
    start(s) + s["durationMs"].as_f64().expect("durationMs")
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_timeline_comes_in_the_kubelets_order_and_accounts_for_create_to_ready() {
    let case = Case::with_agent("timeline", &[]).await;
    // Wait for the node to be Ready before timing anything.
    eventually("agent up", Duration::from_secs(60), || async {
        case.agent()
            .root_dir
            .join(rkubelet::server::debug::SOCKET_NAME)
            .exists()
            .then_some(())
    })
    .await;
    let (mut tx, rx) = tokio::sync::oneshot::channel::<()>();
    let watch = tokio::spawn(watch_until_ready(case.pods.label.clone(), rx));
    let _ = tx.closed().await;
    let creating = SystemTime::now();
    let name = case.create("pod", pod()).await;
    let ready_seen = tokio::time::timeout(Duration::from_secs(90), watch)
        .await
        .expect("Ready within 90 s")
        .expect("watch task");
    let root = case.agent().root_dir.clone();
    // The agent records the Ready patch once the API answered it.
    let t = eventually("the timeline's end", Duration::from_secs(10), || {
        let root = root.clone();
        let name = name.clone();
        async move {
            let t = inspect_json(&root, &["timeline", &format!("default/{name}")]);
            t["readyMs"].as_f64().is_some().then_some(t)
        }
    })
    .await;
    let steps = t["steps"].as_array().expect("steps").clone();
    let named = |n: &'static str| move |s: &Value| s["name"] == n;
    let with = |n: &'static str, k: &'static str, v: &'static str| {
        move |s: &Value| s["name"] == n && s["fields"][k] == v
    };
    let pending = first(
        &steps,
        with("status_patch", "phase", "Pending"),
        "Pending status",
    );
    let dirs = first(&steps, named("make_data_dirs"), "dirs");
    let volumes = first(&steps, named("mount_volumes"), "volumes");
    let sandbox = first(&steps, named("run_pod_sandbox"), "sandbox");
    let bridge_add = first(&steps, with("cni_plugin", "plugin", "bridge"), "bridge ADD");
    let init = first(
        &steps,
        with("start_container", "container", "init"),
        "init container",
    );
    let app = first(
        &steps,
        with("start_container", "container", "c"),
        "app container",
    );
    let probe = first(&steps, named("probe"), "readiness probe");
    let ready = first(
        &steps,
        with("status_patch", "ready", "true"),
        "Ready status",
    );
    // The kubelet's order: status, dirs, volumes, sandbox (CNI inside it), init then app
    // containers (each created then started), the probe, Ready.
    let order = [&dirs, &volumes, &sandbox, &init, &app, &probe, &ready];
    for pair in order.windows(2) {
        assert!(
            end(pair[0]) <= start(pair[1]) + 1.0,
            "{:#} before {:#}",
            pair[0],
            pair[1]
        );
    }
    assert!(start(&pending) <= start(&sandbox), "{pending:#}");
    assert!(start(&bridge_add) >= start(&sandbox) && end(&bridge_add) <= end(&sandbox));
    for container in [&init, &app] {
        let within = |rpc: &'static str| {
            first(
                &steps,
                move |s| {
                    s["name"] == "cri"
                        && s["fields"]["rpc"] == rpc
                        && start(s) >= start(container)
                        && end(s) <= end(container)
                },
                rpc,
            )
        };
        assert!(end(&within("CreateContainer")) <= start(&within("StartContainer")));
    }
    // They account for the pod's create → Ready time seen from outside, in causal order on
    // one clock (no ratio of two measurements, which a loaded machine skews): the agent saw
    // the pod after it was created, and sent the Ready status before a watch saw it.
    let ready_ms = t["readyMs"].as_f64().expect("readyMs");
    let seen: SystemTime = t["seen"]
        .as_str()
        .expect("seen")
        .parse::<k8s_openapi::jiff::Timestamp>()
        .expect("seen is RFC 3339")
        .into();
    let ms_between = |a: SystemTime, b: SystemTime| match b.duration_since(a) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -e.duration().as_secs_f64() * 1000.0,
    };
    let seen_after_create_ms = ms_between(creating, seen);
    let ready_sent_ms = start(&ready);
    let watched_ms = ms_between(creating, ready_seen);
    assert!(
        seen_after_create_ms >= 0.0,
        "the agent saw the pod {seen_after_create_ms:.0} ms after its creation began"
    );
    assert!(
        seen_after_create_ms + ready_sent_ms <= watched_ms,
        "the Ready status was sent {:.0} ms after the creation began, seen by a watch at {watched_ms:.0} ms",
        seen_after_create_ms + ready_sent_ms
    );
    assert!(
        ready_sent_ms <= ready_ms,
        "sent at {ready_sent_ms:.0} ms, acknowledged at {ready_ms:.0} ms"
    );
    // What the timeline does not see, from the creation to the agent's first sight, is the
    // API server's delivery: short, also on a loaded machine.
    assert!(
        seen_after_create_ms < 5000.0,
        "the agent saw the pod {seen_after_create_ms:.0} ms after its creation began"
    );
    let mut top: Vec<(f64, f64)> = steps
        .iter()
        .filter(|s| s["depth"] == 0 && start(s) <= ready_ms)
        .map(|s| (start(s), end(s).min(ready_ms)))
        .collect();
    top.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut covered, mut reach) = (0.0, 0.0_f64);
    for (s, e) in top {
        let s = s.max(reach);
        if e > s {
            covered += e - s;
            reach = e;
        }
    }
    let table = inspect(&root, &["timeline", &format!("default/{name}")]).expect("table");
    eprintln!(
        "timeline: seen {seen_after_create_ms:.0} ms after the create began, Ready acknowledged at {ready_ms:.0} ms, watch saw Ready {watched_ms:.0} ms after the create began, top-level steps cover {covered:.0} ms"
    );
    assert!(
        covered >= 0.9 * ready_ms,
        "top-level steps cover {covered:.0} of {ready_ms:.0} ms:\n{table}"
    );
    // The picture: one element per step. A step still under way when Ready was
    // acknowledged may close between two reads: compare with the same timeline.
    let pod = format!("default/{name}");
    eventually(
        "the picture of a settled timeline",
        Duration::from_secs(10),
        || {
            let (root, pod) = (root.clone(), pod.clone());
            async move {
                let before = inspect_json(&root, &["timeline", &pod])["steps"]
                    .as_array()?
                    .len();
                let svg = inspect(&root, &["timeline", &pod, "--output", "svg"]).expect("svg");
                let after = inspect_json(&root, &["timeline", &pod])["steps"]
                    .as_array()?
                    .len();
                let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
                let drawn = doc
                    .descendants()
                    .filter(|n| n.attribute("class") == Some("step"))
                    .count();
                (before == after).then(|| assert_eq!(drawn, after))
            }
        },
    )
    .await;
    // The table shows the same steps.
    assert!(
        table.contains("run_pod_sandbox") && table.contains("Ready acknowledged"),
        "{table}"
    );
}
