//! The CNI chain with Debian's real plugins (loopback, bridge, host-local, portmap) in a
//! network namespace of the test's own: ADD, CHECK, DEL, DEL again, DEL after the netns is
//! gone, and an ADD that fails half-way and must leave nothing behind. Needs root, not the
//! cluster: it uses its own bridge (`rkt0`), subnet, IPAM dir and cache dir, and removes
//! every netns, link, iptables rule and sysctl change it made, also when it fails.

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rkubelet::cni::{
    Attachment, Cni, CniError, DEFAULT_BIN_DIRS, NetworkConfigList, POD_IFNAME, PodNetworkRef,
    PortMapping, ProcessExec, Protocol, load_conflist,
};
use serde_json::Value;

/// A subnet of the cluster range no node gets in the tests' clusters.
const SUBNET: &str = "10.244.251.0/24";
/// Not rkbr0 (containerd's template) nor rk0 (10-rkubelet.conflist).
const BRIDGE: &str = "rkt0";
/// The network name: host-local's dir under the data dir, portmap's iptables comments.
const NETWORK: &str = "rkubelet-cnitest";
const HOST_PORT: u16 = 18_080;

/// Runs a command to completion (test set-up only); stdout, or a panic naming it.
fn run(cmd: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Like [`run`], but a failure is only a `false`: for clean-up.
fn try_run(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn nat_rules() -> Vec<String> {
    run("iptables", &["-w", "5", "-t", "nat", "-S"])
        .lines()
        .map(str::to_owned)
        .collect()
}

fn cni_nat_rules() -> BTreeSet<String> {
    nat_rules()
        .into_iter()
        .filter(|l| l.to_ascii_lowercase().contains("cni"))
        .collect()
}

/// Everything the test makes, removed on drop (also when an assertion fails).
struct Scene {
    netns: Vec<String>,
    dir: PathBuf,
    nat_before: BTreeSet<String>,
    ip_forward_before: String,
}

impl Scene {
    fn new() -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root: run it as root or through scripts/test.sh"
        );
        let dir = std::env::temp_dir().join(common::unique("rkubelet-cnitest"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self {
            netns: Vec::new(),
            dir,
            nat_before: cni_nat_rules(),
            ip_forward_before: run("sysctl", &["-n", "net.ipv4.ip_forward"])
                .trim()
                .to_owned(),
        }
    }

    /// A new network namespace; its path.
    fn netns(&mut self, suffix: &str) -> PathBuf {
        let name = format!("rk-cnitest-{}-{suffix}", std::process::id());
        run("ip", &["netns", "add", &name]);
        self.netns.push(name.clone());
        PathBuf::from("/run/netns").join(name)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("ipam")
    }

    /// host-local's reservation files (one per address, named by it, holding the id).
    fn reservations(&self) -> BTreeSet<String> {
        let Ok(entries) = std::fs::read_dir(self.data_dir().join(NETWORK)) else {
            return BTreeSet::new();
        };
        entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<IpAddr>().is_ok())
            .collect()
    }

    /// The host ends of veths on the test bridge.
    fn bridge_ports(&self) -> Vec<String> {
        let out = std::process::Command::new("ip")
            .args(["-j", "link", "show", "master", BRIDGE])
            .output()
            .expect("ip link");
        let links: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        links
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
            .collect()
    }

    /// Removes what portmap left in the nat table for our network: its per-container
    /// chains if a failure skipped the DEL, and its shared top-level chains if they were
    /// not there before the test and nothing else uses them now.
    fn clean_iptables(&self) {
        let ours: Vec<String> = nat_rules()
            .into_iter()
            .filter(|l| l.starts_with("-A ") && l.contains(NETWORK))
            .collect();
        for rule in &ours {
            let delete = format!("iptables -w 5 -t nat -D {}", &rule[3..]);
            try_run("sh", &["-c", &delete]);
            if let Some(target) = rule.split(" -j ").nth(1) {
                let chain = target.split_whitespace().next().unwrap_or_default();
                if chain.starts_with("CNI-DN-") {
                    try_run("iptables", &["-w", "5", "-t", "nat", "-F", chain]);
                    try_run("iptables", &["-w", "5", "-t", "nat", "-X", chain]);
                }
            }
        }
        let top = [
            "CNI-HOSTPORT-DNAT",
            "CNI-HOSTPORT-SETMARK",
            "CNI-HOSTPORT-MASQ",
        ];
        let rules = nat_rules();
        let in_use = rules.iter().any(|l| l.starts_with("-A CNI-HOSTPORT-DNAT "));
        let was_there = |chain: &str| self.nat_before.contains(&format!("-N {chain}"));
        if in_use || top.iter().any(|c| was_there(c)) {
            return;
        }
        for jump in rules
            .iter()
            .filter(|l| l.starts_with("-A ") && top.iter().any(|c| l.ends_with(&format!("-j {c}"))))
        {
            if !top.iter().any(|c| jump.starts_with(&format!("-A {c} "))) {
                try_run(
                    "sh",
                    &["-c", &format!("iptables -w 5 -t nat -D {}", &jump[3..])],
                );
            }
        }
        for chain in top {
            try_run("iptables", &["-w", "5", "-t", "nat", "-F", chain]);
        }
        for chain in top {
            try_run("iptables", &["-w", "5", "-t", "nat", "-X", chain]);
        }
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        for ns in &self.netns {
            try_run("ip", &["netns", "del", ns]);
        }
        try_run("ip", &["link", "del", BRIDGE]);
        self.clean_iptables();
        // The bridge plugin turns forwarding on for a gateway. Turn it back off unless the
        // local cluster (its forward chain) came up meanwhile and wants it.
        let cluster_up = try_run("iptables", &["-w", "5", "-S", "RKUBELET-FWD"]);
        if self.ip_forward_before == "0" && !cluster_up {
            try_run("sysctl", &["-qw", "net.ipv4.ip_forward=0"]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `cni-config/10-rkubelet.conflist` with the test's network name, bridge and IPAM dir,
/// and `extra` plugins appended, loaded through `load_conflist` with the test subnet.
async fn test_conflist(scene: &Scene, name: &str, extra: &[Value]) -> NetworkConfigList {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("cni-config/10-rkubelet.conflist");
    let mut list: Value =
        serde_json::from_slice(&std::fs::read(&shipped).expect("shipped conflist")).expect("JSON");
    list["name"] = NETWORK.into();
    list["plugins"][0]["bridge"] = BRIDGE.into();
    list["plugins"][0]["ipam"]["dataDir"] = scene.data_dir().to_string_lossy().into_owned().into();
    let plugins = list["plugins"].as_array_mut().expect("plugins");
    plugins.extend(extra.iter().cloned());
    let dir = scene.dir.join(name);
    std::fs::create_dir_all(&dir).expect("conf dir");
    std::fs::write(dir.join("10-test.conflist"), list.to_string()).expect("write conflist");
    load_conflist(&dir, SUBNET).await.expect("load_conflist")
}

fn cni(scene: &Scene, list: NetworkConfigList) -> Cni {
    Cni::new(
        list,
        DEFAULT_BIN_DIRS.iter().map(PathBuf::from).collect(),
        scene.dir.join("cache"),
        ProcessExec::new(Duration::from_secs(60)),
    )
}

fn attachment(id: &str, netns: &Path) -> Attachment {
    Attachment {
        container_id: id.to_owned(),
        netns: netns.to_owned(),
        ifname: POD_IFNAME.to_owned(),
        pod: PodNetworkRef {
            namespace: "default".into(),
            name: id.to_owned(),
            uid: format!("uid-{id}"),
        },
        port_mappings: vec![PortMapping {
            host_port: HOST_PORT,
            container_port: 80,
            protocol: Protocol::Tcp,
            host_ip: String::new(),
        }],
    }
}

/// `ip -j addr` of one interface in a netns.
fn netns_link(netns: &Path, ifname: &str) -> Option<Value> {
    let name = netns.file_name()?.to_str()?;
    let out = std::process::Command::new("ip")
        .args(["-n", name, "-j", "addr", "show", "dev", ifname])
        .output()
        .ok()?;
    let links: Value = serde_json::from_slice(&out.stdout).ok()?;
    links.as_array()?.first().cloned()
}

fn cache_entries(scene: &Scene) -> Vec<String> {
    std::fs::read_dir(scene.dir.join("cache/results"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn real_plugins_add_check_del_and_roll_back_a_failed_add() {
    let mut scene = Scene::new();
    let cni = cni(&scene, test_conflist(&scene, "conf", &[]).await);
    cni.verify_plugins()
        .await
        .expect("plugins present and speaking 0.4.0");

    // ADD: eth0 with an address of the subnet, lo up, one reservation, a hostPort rule.
    let netns = scene.netns("a");
    let id = common::unique("cnitest");
    let att = attachment(&id, &netns);
    let result = cni.add(&att).await.expect("ADD");
    let ips = result.pod_ips();
    let Some(IpAddr::V4(ip)) = ips.first().copied() else {
        panic!("no IPv4 pod address in {result:?}");
    };
    assert_eq!(
        u32::from(ip) & 0xffff_ff00,
        u32::from(std::net::Ipv4Addr::new(10, 244, 251, 0))
    );
    let eth0 = netns_link(&netns, "eth0").expect("eth0 in the netns");
    let has_ip = eth0["addr_info"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|a| a["local"] == ip.to_string().as_str());
    assert!(has_ip, "{ip} not on eth0: {eth0}");
    let lo = netns_link(&netns, "lo").expect("lo in the netns");
    assert!(
        lo["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "UP")),
        "lo is not up: {lo}"
    );
    assert_eq!(scene.reservations(), BTreeSet::from([ip.to_string()]));
    let reservation = std::fs::read_to_string(scene.data_dir().join(NETWORK).join(ip.to_string()))
        .expect("reservation file");
    assert!(reservation.contains(&id), "{reservation}");
    let veths = scene.bridge_ports();
    assert_eq!(veths.len(), 1, "{veths:?}");
    let dnat = nat_rules()
        .into_iter()
        .filter(|l| l.contains(&id) && l.contains(&HOST_PORT.to_string()))
        .count();
    assert_eq!(dnat, 1, "one hostPort DNAT rule for the sandbox");
    assert_eq!(cache_entries(&scene), [format!("{NETWORK}-{id}-eth0")]);

    // CHECK: all is as ADD left it. Debian's portmap 1.1.1 fails CHECK of an IPv4-only
    // sandbox with host ports when ip6tables works (containernetworking/plugins#819): that
    // one failure is accepted here; CHECK without host ports must pass (sandbox b below).
    match cni.check(&att).await {
        Ok(()) => {}
        Err(CniError::Plugin { plugin, msg, .. })
            if plugin == "portmap" && msg.starts_with("could not check ipv6 dnat") =>
        {
            eprintln!("CHECK hit the known portmap 1.1.1 bug: {msg}");
        }
        Err(e) => panic!("CHECK: {e}"),
    }

    // DEL: reservation, veth, rule and cache entry gone; DEL again is fine.
    cni.del(&att).await.expect("DEL");
    assert!(
        scene.reservations().is_empty(),
        "{:?}",
        scene.reservations()
    );
    assert!(
        scene.bridge_ports().is_empty(),
        "{:?}",
        scene.bridge_ports()
    );
    assert!(
        !nat_rules().iter().any(|l| l.contains(&id)),
        "portmap rule left"
    );
    assert!(
        cache_entries(&scene).is_empty(),
        "{:?}",
        cache_entries(&scene)
    );
    cni.del(&att).await.expect("DEL again");

    // A sandbox without host ports: CHECK passes; DEL after its netns is gone (the
    // sandbox died first) still frees the address.
    let netns_b = scene.netns("b");
    let id_b = common::unique("cnitest-b");
    let mut att_b = attachment(&id_b, &netns_b);
    att_b.port_mappings.clear();
    cni.add(&att_b).await.expect("ADD b");
    assert_eq!(scene.reservations().len(), 1);
    cni.check(&att_b).await.expect("CHECK b");
    run(
        "ip",
        &[
            "netns",
            "del",
            netns_b.file_name().and_then(|n| n.to_str()).expect("name"),
        ],
    );
    cni.del(&att_b).await.expect("DEL without the netns");
    assert!(
        scene.reservations().is_empty(),
        "{:?}",
        scene.reservations()
    );
    assert!(
        !nat_rules().iter().any(|l| l.contains(&id_b)),
        "portmap rule left"
    );
    assert!(cache_entries(&scene).is_empty());

    // A chain whose last plugin is missing: ADD fails naming it, and rolls back.
    let broken = cni_with_missing_plugin(&scene).await;
    let netns_c = scene.netns("c");
    let id_c = common::unique("cnitest-c");
    let err = broken
        .add(&attachment(&id_c, &netns_c))
        .await
        .expect_err("ADD with a missing plugin");
    assert!(
        matches!(&err, CniError::PluginNotFound { plugin, .. } if plugin == "rkubelet-no-such-plugin"),
        "{err}"
    );
    assert!(
        scene.reservations().is_empty(),
        "address leaked: {:?}",
        scene.reservations()
    );
    assert!(
        scene.bridge_ports().is_empty(),
        "veth leaked: {:?}",
        scene.bridge_ports()
    );
    assert!(
        netns_link(&netns_c, "eth0").is_none(),
        "eth0 left in the netns"
    );
    assert!(
        !nat_rules().iter().any(|l| l.contains(&id_c)),
        "portmap rule left"
    );
    assert!(
        cache_entries(&scene).is_empty(),
        "{:?}",
        cache_entries(&scene)
    );

    // Leave the nat table as it was found.
    scene.clean_iptables();
    assert!(!nat_rules().iter().any(|l| l.contains(NETWORK)));
    let foreign_hostports = nat_rules()
        .iter()
        .any(|l| l.starts_with("-A CNI-HOSTPORT-DNAT "));
    if !foreign_hostports {
        assert_eq!(cni_nat_rules(), scene.nat_before, "CNI nat rules changed");
    }
}

async fn cni_with_missing_plugin(scene: &Scene) -> Cni {
    let missing = serde_json::json!({"type": "rkubelet-no-such-plugin"});
    cni(scene, test_conflist(scene, "broken", &[missing]).await)
}
