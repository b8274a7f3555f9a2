//! Several nodes on one machine (issue 14): `cluster.sh add-nodes 3` makes three "hosts",
//! each its own network namespace on the underlay bridge with its own containerd,
//! kube-proxy and rkubelet. With the agents' routes between nodes (`host-gw`, then
//! `vxlan`), a Deployment of 6 nginx replicas spreads over the nodes, a client pod on
//! each node reaches the nginx pods on each other node and a ClusterIP Service in front
//! of them; deleting a Node removes its routes on the others, and stopping one node's
//! agent leaves the other nodes' pods serving. The nodes go again at the end (also when
//! the test fails), with nothing of them left.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::agent::TEST_EVICTION_HARD;
use common::{cleanup_blocking, cluster, eventually, kubectl, kubectl_command, unique};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

const NODES: usize = 3;
const REPLICAS: usize = 6;
/// The label every node of `add-nodes` carries (`cluster.sh start-agents`).
const HOST_LABEL: &str = "rkubelet.io/host=true";
/// The label of this test's objects.
const TEST_LABEL: &str = "rk-test=multinode";
/// The VXLAN device of `--pod-network-routes vxlan`.
const VXLAN_DEVICE: &str = "rkvx.1";

fn host(i: usize) -> String {
    format!("rk-host{i}")
}

fn hosts() -> Vec<String> {
    (1..=NODES).map(host).collect()
}

/// The added nodes; dropped, they go with all they hold (and their Node objects).
struct Hosts;

impl Hosts {
    async fn add() -> Self {
        cluster(&["add-nodes", &NODES.to_string()]).await;
        Self
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_node_logs();
        }
        cleanup_blocking(|| async {
            let _ = kubectl_command(&["delete", "all", "-A", "-l", TEST_LABEL, "--wait=false"])
                .output()
                .await;
            cluster(&["remove-nodes"]).await;
            let _ = kubectl_command(&["delete", "nodes", "-l", HOST_LABEL])
                .output()
                .await;
        });
    }
}

/// The last lines of each node's agent, containerd and kube-proxy log, for a failed test.
fn print_node_logs() {
    for h in hosts() {
        for component in ["rkubelet", "containerd", "kube-proxy"] {
            let path = common::state_dir().join(format!("logs/{component}@{h}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| format!("({e})"));
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(25)..].join("\n");
            eprintln!("---- {} (last 25 lines)\n{tail}", path.display());
        }
    }
}

/// `ip -n NETNS ARGS` (JSON output asked by the caller's args).
async fn ip_in(netns: &str, args: &[&str]) -> String {
    output_of("ip", &[&["-n", netns], args].concat()).await
}

/// The IPv4 routes of a node's namespace: destination → (gateway, device).
async fn routes_of(netns: &str) -> BTreeMap<String, (Option<String>, String)> {
    let out = ip_in(netns, &["-j", "-4", "route", "show"]).await;
    let routes: Vec<serde_json::Value> = serde_json::from_str(&out).expect("ip -j route");
    routes
        .iter()
        .filter_map(|r| {
            Some((
                r["dst"].as_str()?.to_owned(),
                (
                    r["gateway"].as_str().map(str::to_owned),
                    r["dev"].as_str()?.to_owned(),
                ),
            ))
        })
        .collect()
}

async fn nodes_api() -> Api<Node> {
    Api::all(common::kube_client("admin.kubeconfig").await)
}

/// Each added node's pod CIDR and InternalIP, once it has both.
async fn node_networks() -> BTreeMap<String, (String, String)> {
    let api = nodes_api().await;
    let mut out = BTreeMap::new();
    for name in hosts() {
        let node = api.get(&name).await.expect("node");
        let cidr = node.spec.and_then(|s| s.pod_cidr).expect("pod CIDR");
        let ip = node
            .status
            .and_then(|s| s.addresses)
            .into_iter()
            .flatten()
            .find(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .expect("InternalIP");
        out.insert(name, (cidr, ip));
    }
    out
}

/// Waits until every node routes every other node's pod CIDR as `mode` does.
async fn routes_programmed(mode: &str, networks: &BTreeMap<String, (String, String)>) {
    for (name, _) in networks.iter() {
        eventually(
            &format!("{mode} routes on {name}"),
            Duration::from_secs(30),
            || async {
                let routes = routes_of(name).await;
                networks
                    .iter()
                    .filter(|(other, _)| *other != name)
                    .all(|(_, (cidr, ip))| match (mode, routes.get(cidr)) {
                        ("host-gw", Some((Some(gw), dev))) => gw == ip && dev == "eth0",
                        ("vxlan", Some((Some(_), dev))) => dev == VXLAN_DEVICE,
                        _ => false,
                    })
                    .then_some(())
            },
        )
        .await;
    }
}

fn pod_json(name: &str, node: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"rk-test": "multinode", "role": "client"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "client", "image": "127.0.0.1:5000/rkubelet/busybox:1.35",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
            }]
        }
    })
}

fn deployment_json(name: &str) -> serde_json::Value {
    let labels = serde_json::json!({"app": name, "rk-test": "multinode"});
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"rkubelet.io/host": "true"},
                    "terminationGracePeriodSeconds": 1,
                    "topologySpreadConstraints": [{
                        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": name}}
                    }],
                    "containers": [{"name": "nginx", "image": "nginx", "ports": [{"containerPort": 80}]}]
                }
            }
        }
    })
}

async fn apply(manifest: &serde_json::Value) {
    let file = std::env::temp_dir().join(format!("{}.json", unique("multinode")));
    std::fs::write(&file, manifest.to_string()).expect("manifest");
    kubectl(&["apply", "-f", file.to_str().expect("utf-8")]).await;
    let _ = std::fs::remove_file(file);
}

/// Running and Ready pods with `selector`, once there are `count`.
async fn ready_pods(selector: &str, count: usize) -> Vec<Pod> {
    let api: Api<Pod> = Api::default_namespaced(common::kube_client("admin.kubeconfig").await);
    eventually(
        &format!("{count} ready pods {selector}"),
        Duration::from_secs(180),
        || async {
            let pods = api
                .list(&ListParams::default().labels(selector))
                .await
                .ok()?;
            let ready: Vec<Pod> = pods
                .items
                .into_iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                })
                .collect();
            (ready.len() == count).then_some(ready)
        },
    )
    .await
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("bound")
}

fn ip_of(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP")
}

/// `wget` from a client pod (through `kubectl exec`, the node's kubelet API), 10 s at most
/// (`timeout`: busybox 1.35's own `wget -T` crashes); its answer.
async fn http_from(client: &str, url: &str) -> Result<String, String> {
    let out = kubectl_command(&["exec", client, "--", "timeout", "10", "wget", "-qO-", url])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

async fn assert_serves(client: &str, url: &str) {
    let answer = http_from(client, url)
        .await
        .unwrap_or_else(|e| panic!("{client} → {url}: {e}"));
    assert!(answer.contains("nginx"), "{client} → {url}: {answer}");
}

/// TX packets of the VXLAN device in a node's namespace.
async fn vxlan_tx_packets(netns: &str) -> u64 {
    let out = ip_in(netns, &["-j", "-s", "link", "show", VXLAN_DEVICE]).await;
    let links: Vec<serde_json::Value> = serde_json::from_str(&out).expect("ip -j link");
    links[0]["stats64"]["tx"]["packets"]
        .as_u64()
        .expect("tx packets")
}

/// One round: agents with `mode`, the Deployment, a client per node, HTTP from each node
/// to the pods of each other node and to the Service. Leaves it all running.
async fn round(mode: &str) -> (BTreeMap<String, String>, Vec<Pod>) {
    cluster(&[
        "start-agents",
        "--pod-network-routes",
        mode,
        "--",
        "--eviction-hard",
        TEST_EVICTION_HARD,
    ])
    .await;
    let api = nodes_api().await;
    eventually("the nodes Ready", Duration::from_secs(90), || async {
        let nodes = api
            .list(&ListParams::default().labels(HOST_LABEL))
            .await
            .ok()?;
        let ready = nodes.items.iter().filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        (ready.count() == NODES).then_some(())
    })
    .await;
    let networks = node_networks().await;
    let cidrs: BTreeSet<&String> = networks.values().map(|(c, _)| c).collect();
    assert_eq!(cidrs.len(), NODES, "a pod CIDR per node: {networks:?}");
    let started = Instant::now();
    routes_programmed(mode, &networks).await;
    eprintln!(
        "{mode}: routes to every other node within {:?}",
        started.elapsed()
    );

    let clients: BTreeMap<String, String> = hosts()
        .into_iter()
        .map(|h| (h.clone(), format!("client-{h}")))
        .collect();
    for (node, name) in &clients {
        apply(&pod_json(name, node)).await;
    }
    apply(&deployment_json("nginx")).await;
    let _ = ready_pods("role=client", NODES).await;
    let nginx = ready_pods("app=nginx", REPLICAS).await;
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in &nginx {
        *per_node.entry(node_of(p)).or_default() += 1;
    }
    assert_eq!(
        per_node.values().copied().collect::<Vec<_>>(),
        vec![REPLICAS / NODES; NODES],
        "spread over the nodes: {per_node:?}"
    );

    let before: BTreeMap<String, u64> = if mode == "vxlan" {
        let mut m = BTreeMap::new();
        for h in hosts() {
            m.insert(h.clone(), vxlan_tx_packets(&h).await);
        }
        m
    } else {
        BTreeMap::new()
    };
    let mut checked = 0;
    for (node, client) in &clients {
        for p in nginx.iter().filter(|p| node_of(p) != *node) {
            assert_serves(client, &format!("http://{}/", ip_of(p))).await;
            checked += 1;
        }
    }
    eprintln!("{mode}: {checked} cross-node HTTP requests answered");
    // The pods' MTU: the underlay's, less the 50 bytes of VXLAN encapsulation in vxlan mode.
    let eth0 = ip_in(&host(1), &["-j", "link", "show", "eth0"]).await;
    let eth0: Vec<serde_json::Value> = serde_json::from_str(&eth0).expect("ip -j link");
    let underlay = eth0[0]["mtu"].as_u64().expect("eth0 MTU");
    let want = if mode == "vxlan" {
        underlay - 50
    } else {
        underlay
    };
    for client in clients.values() {
        let mtu = kubectl(&["exec", client, "--", "cat", "/sys/class/net/eth0/mtu"]).await;
        assert_eq!(
            mtu.trim(),
            want.to_string(),
            "{client}'s eth0 MTU in {mode} mode"
        );
    }
    if mode == "vxlan" {
        for h in hosts() {
            let after = vxlan_tx_packets(&h).await;
            assert!(
                after > before[&h],
                "{h}: {VXLAN_DEVICE} sent nothing ({} → {after})",
                before[&h]
            );
            eprintln!(
                "{mode}: {h} {VXLAN_DEVICE} tx packets {} → {after}",
                before[&h]
            );
        }
    }

    // A ClusterIP Service in front of the Deployment, from every node (kube-proxy's DNAT).
    kubectl(&["expose", "deployment", "nginx", "--port=80"]).await;
    kubectl(&["label", "service", "nginx", "rk-test=multinode"]).await;
    let cluster_ip = kubectl(&[
        "get",
        "service",
        "nginx",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
    .await;
    for client in clients.values() {
        let url = format!("http://{cluster_ip}/");
        eventually(
            &format!("{client} → Service {url}"),
            Duration::from_secs(30),
            || async {
                http_from(client, &url)
                    .await
                    .ok()
                    .filter(|a| a.contains("nginx"))
            },
        )
        .await;
    }
    eprintln!("{mode}: Service {cluster_ip} answered from a pod on every node");
    (clients, nginx)
}

/// Removes the round's objects and stops the agents.
async fn end_round() {
    kubectl(&[
        "delete",
        "deployment,service,pod",
        "-l",
        TEST_LABEL,
        "--wait=true",
    ])
    .await;
    for h in hosts() {
        cluster(&["stop-agent", &h]).await;
    }
}

/// `PROGRAM ARGS`' standard output; panics if it fails.
async fn output_of(program: &str, args: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args);
    common::run_ok(cmd, &format!("{program} {args:?}")).await
}

/// Whatever of the added nodes survived their removal.
async fn host_leaks() -> Vec<String> {
    let mut leaks = Vec::new();
    let netns = output_of("ip", &["netns", "list"]).await;
    leaks.extend(
        netns
            .lines()
            .filter(|l| l.starts_with("rk-host"))
            .map(|l| format!("netns {l}")),
    );
    let links = output_of("ip", &["-o", "link", "show"]).await;
    leaks.extend(
        links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .filter(|l| l.starts_with("rk-host"))
            .map(|l| format!("link {l}")),
    );
    let nat = output_of("iptables-save", &["-t", "nat"]).await;
    leaks.extend(
        nat.lines()
            .filter(|l| l.contains("RKUBELET-HOSTS"))
            .map(|l| format!("iptables {l}")),
    );
    for h in hosts() {
        for dir in [
            format!("/sys/fs/cgroup/{h}"),
            format!("/sys/fs/cgroup/cpu/{h}"),
        ] {
            if std::path::Path::new(&dir).exists() {
                leaks.push(format!("cgroup {dir}"));
            }
        }
    }
    let hosts_dir = common::state_dir().join("hosts");
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(hosts_dir.to_str().expect("utf-8")) && !cmdline.starts_with("bash ")
            {
                leaks.push(format!(
                    "process {}: {cmdline}",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
    }
    leaks
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn three_nodes_route_pods_to_each_other_and_serve_a_cluster_ip_in_host_gw_and_vxlan_mode() {
    let hosts_guard = Hosts::add().await;

    round("host-gw").await;
    end_round().await;

    let (clients, nginx) = round("vxlan").await;
    let networks = node_networks().await;

    // Stopping one node's agent leaves the other nodes' pods serving, each other and the
    // stopped node's pods too (its routes and containers stay).
    let stopped = host(2);
    cluster(&["stop-agent", &stopped]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut checked = 0;
    for (node, client) in clients.iter().filter(|(n, _)| **n != stopped) {
        for p in nginx.iter().filter(|p| node_of(p) != *node) {
            assert_serves(client, &format!("http://{}/", ip_of(p))).await;
            checked += 1;
        }
    }
    let api: Api<Pod> = Api::default_namespaced(common::kube_client("admin.kubeconfig").await);
    for p in nginx.iter().filter(|p| node_of(p) != stopped) {
        let name = p.metadata.name.as_deref().expect("name");
        let now = api.get(name).await.expect("still there");
        let restarts: i32 = now
            .status
            .and_then(|s| s.container_statuses)
            .into_iter()
            .flatten()
            .map(|c| c.restart_count)
            .sum();
        assert_eq!(restarts, 0, "{name} restarted");
    }
    eprintln!("vxlan: {stopped}'s agent stopped: {checked} cross-node requests still answered");
    cluster(&[
        "start-agents",
        "--pod-network-routes",
        "vxlan",
        "--",
        "--eviction-hard",
        TEST_EVICTION_HARD,
    ])
    .await;

    // Deleting a Node (its agent stopped first, so that it does not register again)
    // removes its routes on the other nodes.
    let gone = host(NODES);
    let (gone_cidr, _) = networks[&gone].clone();
    cluster(&["stop-agent", &gone]).await;
    kubectl(&["delete", "node", &gone, "--wait=true"]).await;
    let started = Instant::now();
    for h in hosts().into_iter().filter(|h| *h != gone) {
        eventually(
            &format!("{h} forgets {gone}'s route {gone_cidr}"),
            Duration::from_secs(30),
            || async { (!routes_of(&h).await.contains_key(&gone_cidr)).then_some(()) },
        )
        .await;
    }
    eprintln!(
        "vxlan: {gone}'s routes removed on the others within {:?}",
        started.elapsed()
    );

    drop(hosts_guard);
    let leaks = host_leaks().await;
    assert!(leaks.is_empty(), "left behind by remove-nodes: {leaks:#?}");
}
