//! The pod network routes against the kernel, no cluster needed (root only): network
//! namespaces of the test's own stand in for nodes A and B, their `eth0`s on a bridge in
//! a third namespace (198.18.1.0/24), each with an address of its pod CIDR on `lo`. The
//! real programmer (iproute2, aimed at a namespace with `ip -n`) programs A and B from
//! fake Node objects; the test reads back what `ip` and `bridge` show and pings from A's
//! pod address to B's, in host-gw and in vxlan mode.
//! One test needs the local cluster as well: a real agent (`--pod-network-routes host-gw`)
//! given Nodes whose pod CIDRs would capture its own traffic refuses them, with one Warning
//! event on each.
//! `cargo test --test pod_network_routes -- --include-ignored`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node};
use rkubelet::cni::routes::{
    IpRoute2, Mode, POD_CIDR_REFUSED, Programmer, RouteOps, Settings, live_check, vxlan,
};
use serde_json::{Value, json};

/// Runs `program args`, answering its standard output; a failure fails the test.
async fn run(program: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .expect("run iproute2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{program} {}: {stderr}",
        args.join(" ")
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// `<program> -n <netns> -json <args>`, parsed.
async fn json_in(netns: &str, program: &str, args: &[&str]) -> Vec<Value> {
    let out = run(program, &[&["-n", netns, "-json"], args].concat()).await;
    if out.trim().is_empty() {
        return Vec::new();
    }
    serde_json::from_str(out.trim()).expect("iproute2 JSON")
}

/// Namespaces `rkrt-<pid>-<n>-{br,a,b}`: a bridge in `br`, and in `a` and `b` an `eth0`
/// on it (198.18.1.11 and .12/24) and a pod address on `lo` (10.244.1.1 and 10.244.2.1).
/// Deleted on drop, also when the test fails.
struct Nodes {
    prefix: String,
}

impl Nodes {
    async fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let prefix = format!(
            "rkrt-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let nodes = Nodes { prefix };
        let br = nodes.ns("br");
        for ns in ["br", "a", "b"] {
            run("ip", &["netns", "add", &nodes.ns(ns)]).await;
        }
        run("ip", &["-n", &br, "link", "add", "br0", "type", "bridge"]).await;
        run("ip", &["-n", &br, "link", "set", "br0", "up"]).await;
        for (ns, n) in [("a", 1), ("b", 2)] {
            let netns = nodes.ns(ns);
            let port = format!("p{ns}");
            run(
                "ip",
                &[
                    "-n", &br, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                    "netns", &netns,
                ],
            )
            .await;
            run(
                "ip",
                &["-n", &br, "link", "set", &port, "master", "br0", "up"],
            )
            .await;
            let node_ip = format!("198.18.1.1{n}/24");
            let pod_ip = format!("10.244.{n}.1/32");
            for args in [
                vec!["link", "set", "lo", "up"],
                vec!["link", "set", "eth0", "up"],
                vec!["addr", "add", &node_ip, "dev", "eth0"],
                vec!["addr", "add", &pod_ip, "dev", "lo"],
            ] {
                run("ip", &[&["-n", &netns], &args[..]].concat()).await;
            }
        }
        nodes
    }

    fn ns(&self, which: &str) -> String {
        format!("{}-{which}", self.prefix)
    }

    /// The programmer of node `which` (`a` or `b`).
    async fn programmer(&self, which: &str, mode: Mode) -> Programmer<IpRoute2> {
        let n = if which == "a" { 1 } else { 2 };
        let settings = Settings {
            mode,
            node_name: which.to_owned(),
            node_ip: format!("198.18.1.1{n}").parse().expect("an IP"),
            pod_cidr: format!("10.244.{n}.0/24"),
            api_server: Vec::new(),
        };
        Programmer::start(IpRoute2::in_netns(&self.ns(which)), &settings)
            .await
            .unwrap_or_else(|e| panic!("starting node {which}'s routes: {e}"))
    }

    /// Pings B's pod address from A's, `count` times (busybox's ping: this machine has no
    /// other); whether all were answered.
    async fn ping_a_to_b(&self, count: u32) -> bool {
        let count = count.to_string();
        let a = self.ns("a");
        let args = [
            "netns", "exec", &a, "busybox", "ping", "-q", "-c", &count, "-W", "2",
        ];
        tokio::process::Command::new("ip")
            .args(args)
            .args(["-I", "10.244.1.1", "10.244.2.1"])
            .output()
            .await
            .is_ok_and(|o| o.status.success())
    }

    /// The routes of node `which` with the agent's protocol, as `ip route` words.
    async fn own_routes(&self, which: &str) -> Vec<String> {
        let mut routes: Vec<String> =
            json_in(&self.ns(which), "ip", &["route", "show", "proto", "211"])
                .await
                .iter()
                .map(|r| {
                    let onlink = r["flags"]
                        .as_array()
                        .is_some_and(|f| f.contains(&json!("onlink")));
                    format!(
                        "{} via {} dev {}{}",
                        r["dst"].as_str().expect("dst"),
                        r["gateway"].as_str().expect("gateway"),
                        r["dev"].as_str().expect("dev"),
                        if onlink { " onlink" } else { "" }
                    )
                })
                .collect();
        routes.sort();
        routes
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        // Deleting a namespace deletes its links; the veth pairs go with either end.
        for ns in ["a", "b", "br"] {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.ns(ns)])
                .output();
        }
    }
}

/// A Node as the API would give it: its pod CIDR, InternalIP and VTEP MAC annotation.
fn node(name: &str, pod_cidr: &str, ip: &str, mac: Option<&str>) -> Arc<Node> {
    let annotations = mac.map(|m| json!({vxlan::VTEP_MAC_ANNOTATION: m}));
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"podCIDR": pod_cidr},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
        }))
        .expect("a Node"),
    )
}

fn cluster(mac_a: Option<&str>, mac_b: Option<&str>) -> Vec<Arc<Node>> {
    vec![
        node("a", "10.244.1.0/24", "198.18.1.11", mac_a),
        node("b", "10.244.2.0/24", "198.18.1.12", mac_b),
        // A node with no namespace behind it: its routes are programmed all the same.
        node(
            "c",
            "10.244.3.0/24",
            "198.18.1.13",
            Some("0a:00:00:00:00:0c"),
        ),
    ]
}

#[tokio::test]
#[ignore = "needs root: creates network namespaces (no cluster)"]
async fn host_gw_routes_carry_pod_traffic_and_survive_a_restart() {
    let nodes = Nodes::new().await;
    let a_ns = nodes.ns("a");
    assert!(
        !nodes.ping_a_to_b(1).await,
        "no route yet, yet B's pod answered"
    );
    run(
        "ip",
        &[
            "-n",
            &a_ns,
            "route",
            "add",
            "10.99.0.0/24",
            "via",
            "198.18.1.12",
        ],
    )
    .await;
    let all = cluster(None, None);
    let mut a = nodes.programmer("a", Mode::HostGw).await;
    let report = a.sync(&all).await.unwrap();
    assert_eq!((report.changes, report.failed), (2, 0));
    assert_eq!(
        nodes.own_routes("a").await,
        [
            "10.244.2.0/24 via 198.18.1.12 dev eth0",
            "10.244.3.0/24 via 198.18.1.13 dev eth0"
        ]
    );
    let mut b = nodes.programmer("b", Mode::HostGw).await;
    b.sync(&all).await.unwrap();
    assert!(nodes.ping_a_to_b(3).await, "A's pod cannot reach B's");

    // A restarted agent finds its routes right and changes nothing.
    let mut again = nodes.programmer("a", Mode::HostGw).await;
    assert_eq!(again.sync(&all).await.unwrap().changes, 0);
    // Node c is deleted: its route goes; the route the agent did not add stays.
    again.sync(&all[..2]).await.unwrap();
    assert_eq!(
        nodes.own_routes("a").await,
        ["10.244.2.0/24 via 198.18.1.12 dev eth0"]
    );
    let routes = run("ip", &["-n", &a_ns, "route", "show", "10.99.0.0/24"]).await;
    assert!(
        routes.contains("via 198.18.1.12"),
        "the foreign route is gone: {routes:?}"
    );
    assert!(nodes.ping_a_to_b(1).await);
}

/// Packets sent (`tx`) or received (`rx`) by `rkvx.1` in `netns`.
async fn vxlan_packets(netns: &str, direction: &str) -> u64 {
    let link = json_in(netns, "ip", &["-s", "link", "show", "dev", vxlan::DEVICE]).await;
    link[0]["stats64"][direction]["packets"]
        .as_u64()
        .expect("packet counter")
}

#[tokio::test]
#[ignore = "needs root: creates network namespaces (no cluster)"]
async fn vxlan_overlay_carries_pod_traffic_and_keeps_its_device_on_restart() {
    let nodes = Nodes::new().await;
    let (a_ns, b_ns) = (nodes.ns("a"), nodes.ns("b"));
    let mut a = nodes.programmer("a", Mode::Vxlan).await;
    let mut b = nodes.programmer("b", Mode::Vxlan).await;
    assert_eq!(a.pod_mtu(), Some(1450));
    let mac_a = a.vtep_mac().unwrap().to_owned();
    let mac_b = b.vtep_mac().unwrap().to_owned();
    let all = cluster(Some(&mac_a), Some(&mac_b));
    let report = a.sync(&all).await.unwrap();
    assert_eq!(
        (report.changes, report.failed),
        (6, 0),
        "route, neighbour, fdb for b and c"
    );
    b.sync(&all).await.unwrap();

    let link = &json_in(&a_ns, "ip", &["-d", "addr", "show", "dev", vxlan::DEVICE]).await[0];
    let data = &link["linkinfo"]["info_data"];
    assert_eq!(link["linkinfo"]["info_kind"], "vxlan");
    assert_eq!(
        (data["id"].as_u64(), data["port"].as_u64()),
        (Some(1), Some(8472))
    );
    assert_eq!(
        (data["local"].as_str(), data["link"].as_str()),
        (Some("198.18.1.11"), Some("eth0"))
    );
    assert_eq!(data["learning"], false);
    assert_eq!(link["mtu"], 1450);
    assert_eq!(link["address"], mac_a.as_str());
    assert_eq!(link["addr_info"][0]["local"], "10.244.1.0");
    assert_eq!(link["addr_info"][0]["prefixlen"], 32);
    assert_eq!(
        nodes.own_routes("a").await,
        [
            "10.244.2.0/24 via 10.244.2.0 dev rkvx.1 onlink",
            "10.244.3.0/24 via 10.244.3.0 dev rkvx.1 onlink"
        ]
    );
    let neigh = json_in(
        &a_ns,
        "ip",
        &["neigh", "show", "dev", vxlan::DEVICE, "nud", "permanent"],
    )
    .await;
    assert!(
        neigh
            .iter()
            .any(|n| n["dst"] == "10.244.2.0" && n["lladdr"] == mac_b.as_str()),
        "{neigh:?}"
    );
    let fdb = json_in(&a_ns, "bridge", &["fdb", "show", "dev", vxlan::DEVICE]).await;
    assert!(
        fdb.iter()
            .any(|e| e["mac"] == mac_b.as_str() && e["dst"] == "198.18.1.12"),
        "{fdb:?}"
    );

    let (sent, received) = (
        vxlan_packets(&a_ns, "tx").await,
        vxlan_packets(&b_ns, "rx").await,
    );
    assert!(
        nodes.ping_a_to_b(3).await,
        "A's pod cannot reach B's through the overlay"
    );
    assert!(
        vxlan_packets(&a_ns, "tx").await >= sent + 3,
        "A's rkvx.1 sent nothing"
    );
    assert!(
        vxlan_packets(&b_ns, "rx").await >= received + 3,
        "B's rkvx.1 received nothing"
    );

    // What `inspect node` shows: all live; then somebody removes b's FDB entry, inspect
    // sees it missing, and the next sync (the periodic resync) puts it back, alone.
    let state = report.state;
    let live = |netns: String| async move {
        IpRoute2::in_netns(&netns)
            .programmed(Some(vxlan::DEVICE))
            .await
            .expect("the live tables")
    };
    let checked = live_check(&state, &live(a_ns.clone()).await);
    assert!(
        checked.iter().all(|(_, missing)| missing.is_empty()),
        "{checked:?}"
    );
    run(
        "bridge",
        &[
            "-n",
            &a_ns,
            "fdb",
            "del",
            &mac_b,
            "dev",
            vxlan::DEVICE,
            "dst",
            "198.18.1.12",
            "self",
        ],
    )
    .await;
    let checked = live_check(&state, &live(a_ns.clone()).await);
    assert_eq!(checked[0].0.node, "b");
    assert_eq!(checked[0].1, ["fdb"]);
    assert!(
        !nodes.ping_a_to_b(1).await,
        "B reached without its FDB entry"
    );
    assert_eq!(a.sync(&all).await.unwrap().changes, 1);
    assert!(
        nodes.ping_a_to_b(1).await,
        "the repaired FDB entry does not carry traffic"
    );

    // A restarted agent keeps the device and its MAC, and changes nothing.
    let mut again = nodes.programmer("a", Mode::Vxlan).await;
    assert_eq!(again.vtep_mac(), Some(mac_a.as_str()));
    assert_eq!(again.sync(&all).await.unwrap().changes, 0);
    // B's VTEP changes (its agent re-created the device): A follows.
    run("ip", &["-n", &b_ns, "link", "del", vxlan::DEVICE]).await;
    b.sync(&all).await.unwrap();
    let new_mac_b = b.vtep_mac().unwrap().to_owned();
    assert_ne!(new_mac_b, mac_b);
    let all = cluster(Some(&mac_a), Some(&new_mac_b));
    b.sync(&all).await.unwrap();
    assert_eq!(
        again.sync(&all).await.unwrap().changes,
        3,
        "fdb out, fdb in, neighbour"
    );
    assert!(
        nodes.ping_a_to_b(2).await,
        "no way to B after its VTEP changed"
    );
}

/// Node objects made through the API for a test (their podCIDR and InternalIP as given):
/// removed on drop, with their events.
struct FakeNodes(Vec<String>);

impl FakeNodes {
    async fn create(nodes: &[(&str, &str, &str)]) -> Self {
        let api: kube::Api<Node> = kube::Api::all(common::kube_client("admin.kubeconfig").await);
        let made = Self(
            nodes
                .iter()
                .map(|(name, _, _)| (*name).to_owned())
                .collect(),
        );
        for (name, pod_cidr, ip) in nodes {
            let node = node(name, pod_cidr, ip, None);
            api.create(&kube::api::PostParams::default(), &node)
                .await
                .unwrap_or_else(|e| panic!("create node {name}: {e}"));
            let status = json!({"status": node.status});
            api.patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&status),
            )
            .await
            .unwrap_or_else(|e| panic!("node {name}'s address: {e}"));
        }
        made
    }
}

impl Drop for FakeNodes {
    fn drop(&mut self) {
        let names = self.0.clone();
        common::cleanup_blocking(move || async move {
            let client = common::kube_client("admin.kubeconfig").await;
            let nodes: kube::Api<Node> = kube::Api::all(client.clone());
            let events: kube::Api<Event> = kube::Api::namespaced(client, "default");
            for name in &names {
                let _ = nodes.delete(name, &Default::default()).await;
                let _ = events
                    .delete_collection(
                        &Default::default(),
                        &kube::api::ListParams::default()
                            .fields(&format!("involvedObject.name={name}")),
                    )
                    .await;
            }
        });
    }
}

/// The routes a test's agent made on this host (protocol 211: only it adds those here),
/// flushed on drop: made before the agent, dropped after it has stopped.
struct AgentRoutes;

impl Drop for AgentRoutes {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["-4", "route", "flush", "proto", "211"])
            .output();
    }
}

/// The host's routes of the agent's protocol: destination → gateway.
async fn host_agent_routes() -> Vec<(String, String)> {
    let out = run("ip", &["-json", "-4", "route", "show", "proto", "211"]).await;
    let routes: Vec<Value> = serde_json::from_str(out.trim()).unwrap_or_default();
    routes
        .iter()
        .map(|r| {
            (
                r["dst"].as_str().unwrap_or_default().to_owned(),
                r["gateway"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The Warning events `PodCIDROverlap` on node `name`.
async fn refusals(name: &str) -> Vec<Event> {
    let client = common::kube_client("admin.kubeconfig").await;
    let events: kube::Api<Event> = kube::Api::namespaced(client, "default");
    events
        .list(&kube::api::ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(POD_CIDR_REFUSED))
        .collect()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_pod_cidr_that_would_capture_local_traffic_gets_a_warning_and_no_route() {
    use common::agent::{AgentProcess, Owner, TEST_EVICTION_HARD};
    let own = common::node_name();
    let root = common::state_dir()
        .join("test-agents")
        .join(common::unique("routes-refused"));
    let _routes = AgentRoutes;
    let agent = AgentProcess::start_with_args(
        Owner::Agent,
        &own,
        root.clone(),
        &[
            "--pod-network-routes",
            "host-gw",
            "--eviction-hard",
            TEST_EVICTION_HARD,
        ],
    );
    let nodes: kube::Api<Node> = kube::Api::all(common::kube_client("admin.kubeconfig").await);
    let own_cidr = common::eventually("this node's pod CIDR", Duration::from_secs(60), || async {
        nodes.get(&own).await.ok()?.spec?.pod_cidr
    })
    .await;
    // The upper half of this node's pod CIDR (a /24 or larger).
    let (net, _) = own_cidr.split_once('/').expect("a CIDR");
    let octets: Vec<&str> = net.split('.').collect();
    let overlap = format!("{}.{}.{}.128/25", octets[0], octets[1], octets[2]);
    let tag = std::process::id() % 1000;
    let (overlapping, underlay, apart) = (
        format!("rk-fake-overlap-{tag}"),
        format!("rk-fake-underlay-{tag}"),
        format!("rk-fake-apart-{tag}"),
    );
    let _fakes = FakeNodes::create(&[
        (&overlapping, &overlap, "198.18.0.250"),
        (&underlay, "198.18.0.240/28", "198.18.0.251"),
        (&apart, "10.250.0.0/24", "198.18.0.252"),
    ])
    .await;

    // The Node that takes nothing of this one's gets its route: the agent follows them.
    let what = format!("the route to {apart}; agent log:\n{}", agent.log_tail());
    common::eventually(&what, Duration::from_secs(60), || async {
        host_agent_routes()
            .await
            .contains(&("10.250.0.0/24".to_owned(), "198.18.0.252".to_owned()))
            .then_some(())
    })
    .await;
    for name in [&overlapping, &underlay] {
        let what = format!(
            "a {POD_CIDR_REFUSED} warning on {name}; agent log:\n{}",
            agent.log_tail()
        );
        common::eventually(&what, Duration::from_secs(30), || async {
            (!refusals(name).await.is_empty()).then_some(())
        })
        .await;
    }
    // Their Nodes change (heartbeat-like label updates): no second warning, still no route.
    for beat in 0..5 {
        for name in [&overlapping, &underlay] {
            let patch = json!({"metadata": {"labels": {"rk-beat": beat.to_string()}}});
            nodes
                .patch(
                    name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
                .expect("label the node");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let routes = host_agent_routes().await;
    for cidr in [overlap.as_str(), "198.18.0.240/28"] {
        assert!(
            !routes.iter().any(|(dst, _)| dst == cidr),
            "a route to {cidr}: {routes:?}"
        );
    }
    let overlap_events = refusals(&overlapping).await;
    assert_eq!(overlap_events.len(), 1, "{overlap_events:#?}");
    let event = &overlap_events[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.count, Some(1));
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(
        event.source.as_ref().and_then(|s| s.host.as_deref()),
        Some(own.as_str())
    );
    assert_eq!(
        event.message.as_deref(),
        Some(
            format!(
                "pod CIDR {overlap} of node {overlapping} overlaps the pod CIDR {own_cidr} of node {own}: no route is programmed to it"
            )
            .as_str()
        )
    );
    let underlay_events = refusals(&underlay).await;
    assert_eq!(underlay_events.len(), 1, "{underlay_events:#?}");
    assert!(
        underlay_events[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("overlaps the node network 198.18.0.0/24 on rk-node0")),
        "{underlay_events:#?}"
    );
    let log = std::fs::read_to_string(&agent.log).expect("agent log");
    for name in [&overlapping, &underlay] {
        let lines = log
            .lines()
            .filter(|l| l.contains(POD_CIDR_REFUSED) && l.contains(name.as_str()))
            .count();
        assert_eq!(lines, 1, "logged once for {name}:\n{}", agent.log_tail());
    }
    agent.stop();
    let _ = std::fs::remove_dir_all(root);
}
