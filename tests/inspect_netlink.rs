//! `inspect::netlink` against the kernel: a network namespace and a veth pair of the test's
//! own, read back through netlink and compared with what `ip -j` says. The namespace test
//! needs root (no cluster): `cargo test --test inspect_netlink -- --include-ignored`.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rkubelet::inspect::netlink::{self, Interfaces, Link, NetlinkError, Route};
use serde_json::Value;

/// Runs `ip` and returns its standard output; a failure fails the test.
fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ip {}: {stderr}", args.join(" "));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// `ip -j` output, parsed.
fn ip_json(args: &[&str]) -> Vec<Value> {
    let out = ip(&[&["-j"], args].concat());
    serde_json::from_str(out.trim()).expect("ip -j output")
}

/// A network namespace `rk-nl-test-<pid>` and a veth pair: `rknl<pid>a` stays in the test's
/// namespace, `rknl<pid>b` is moved into the new one with 198.18.250.1/30, MTU 1400, a route
/// and a default route through 198.18.250.2. Removed on drop, also when the test fails.
struct Fixture {
    netns: String,
    host: String,
    pod: String,
}

impl Fixture {
    fn new() -> Self {
        let pid = std::process::id();
        let fixture = Fixture {
            netns: format!("rk-nl-test-{pid}"),
            host: format!("rknl{pid}a"),
            pod: format!("rknl{pid}b"),
        };
        let (netns, host, pod) = (&fixture.netns, &fixture.host, &fixture.pod);
        ip(&["netns", "add", netns]);
        ip(&["link", "add", host, "type", "veth", "peer", "name", pod]);
        ip(&["link", "set", pod, "netns", netns]);
        ip(&["link", "set", host, "up"]);
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["link", "set", pod, "mtu", "1400", "up"],
            vec!["addr", "add", "198.18.250.1/30", "dev", pod],
            vec!["route", "add", "198.18.251.0/24", "via", "198.18.250.2"],
            vec!["route", "add", "default", "via", "198.18.250.2"],
        ] {
            ip(&[&["-n", netns], &args[..]].concat());
        }
        fixture
    }

    /// `ip -j` in the test's namespace.
    fn ip_json(&self, args: &[&str]) -> Vec<Value> {
        ip_json(&[&["-n", &self.netns], args].concat())
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Deleting the namespace deletes the pod end, and with it the host end.
        for args in [["netns", "del", &self.netns], ["link", "del", &self.host]] {
            let _ = Command::new("ip").args(args).output();
        }
    }
}

/// `ip route`'s way to write a destination.
fn destination(route: &Route) -> String {
    match route.destination {
        None => "default".to_owned(),
        Some((IpAddr::V4(ip), 32)) => ip.to_string(),
        Some((ip, len)) => format!("{ip}/{len}"),
    }
}

/// Checks a link against its `ip -j -d link` entry.
fn assert_same_link(link: &Link, json: &Value) {
    let name = &link.name;
    assert_eq!(json["ifindex"], link.index, "{name}: ifindex");
    assert_eq!(json["ifname"], link.name.as_str(), "{name}: ifname");
    assert_eq!(json["mtu"], link.mtu, "{name}: mtu");
    assert_eq!(
        json["address"].as_str(),
        link.mac.as_deref(),
        "{name}: address"
    );
    let state = json["operstate"].as_str().map(str::to_lowercase);
    assert_eq!(
        state.as_deref(),
        Some(link.oper_state.as_str()),
        "{name}: operstate"
    );
    let kind = json["linkinfo"]["info_kind"].as_str();
    assert_eq!(kind, link.kind.as_deref(), "{name}: info_kind");
    let flags = json["flags"].as_array().expect("flags");
    assert_eq!(flags.contains(&"UP".into()), link.up, "{name}: UP");
    assert_eq!(
        json["link_netnsid"].as_i64(),
        link.peer_netns_id.map(i64::from),
        "{name}"
    );
    assert_eq!(
        json["master"].is_string(),
        link.master.is_some(),
        "{name}: master"
    );
}

/// Waits until the kernel reports the pod end's carrier (the link watcher is asynchronous).
fn wait_oper_up(fixture: &Fixture) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let link = fixture.ip_json(&["link", "show", "dev", &fixture.pod]);
        if link[0]["operstate"] == "UP" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} is not up: {link:?}",
            fixture.pod
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs root"]
fn a_veth_pair_across_namespaces_reads_as_ip_shows_it() {
    let fixture = Fixture::new();
    wait_oper_up(&fixture);
    let path = format!("/var/run/netns/{}", fixture.netns);
    let inside: Interfaces = netlink::read(Some(Path::new(&path))).expect("read the test netns");
    let outside = netlink::read(None).expect("read the own netns");

    // Inside: lo and the pod end, as `ip -d link` shows them.
    let json_links = fixture.ip_json(&["-d", "link"]);
    let names: Vec<&str> = inside.links.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(inside.links.len(), json_links.len(), "{names:?}");
    for (link, json) in inside.links.iter().zip(&json_links) {
        assert_same_link(link, json);
    }
    let host_index: u32 =
        std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", fixture.host))
            .expect("host end ifindex")
            .trim()
            .parse()
            .expect("ifindex");
    let pod = inside.link_named(&fixture.pod).expect("pod end");
    assert_eq!(
        (pod.kind.as_deref(), pod.mtu, pod.up),
        (Some("veth"), 1400, true)
    );
    assert_eq!(pod.oper_state, "up");
    assert_eq!(
        pod.peer_index,
        Some(host_index),
        "the pod end's peer is the host end"
    );
    assert!(pod.peer_netns_id.is_some(), "{pod:?}");
    let v4: Vec<String> = (pod.addresses.iter())
        .filter(|a| a.address.is_ipv4())
        .map(|a| format!("{}/{} {}", a.address, a.prefix_len, a.scope))
        .collect();
    assert_eq!(v4, ["198.18.250.1/30 universe"]);
    let json_addrs = fixture.ip_json(&["addr", "show", "dev", &fixture.pod]);
    let json_addrs = json_addrs[0]["addr_info"].as_array().expect("addr_info");
    assert_eq!(
        json_addrs.len(),
        pod.addresses.len(),
        "{json_addrs:?} {pod:?}"
    );
    for (address, json) in pod.addresses.iter().zip(json_addrs) {
        assert_eq!(json["local"], address.address.to_string());
        assert_eq!(json["prefixlen"], address.prefix_len);
    }

    // Inside: the IPv4 routes of the main table, as `ip -d route` shows them.
    let routes: Vec<String> = (inside.routes.iter())
        .filter(|r| {
            r.destination.is_none_or(|(ip, _)| ip.is_ipv4())
                && r.gateway.is_none_or(|g| g.is_ipv4())
        })
        .map(|r| {
            let gateway = r.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
            let source = r.source.map(|s| format!(" src {s}")).unwrap_or_default();
            let dev = r.device_name.as_deref().unwrap_or("?");
            format!(
                "{}{gateway} dev {dev} proto {} scope {}{source}",
                destination(r),
                r.protocol,
                r.scope
            )
        })
        .collect();
    let json_routes: Vec<String> = (fixture.ip_json(&["-4", "-d", "route"]).iter())
        .map(|r| {
            let s = |key: &str| r[key].as_str().unwrap_or_default().to_owned();
            let gateway = r
                .get("gateway")
                .map(|_| format!(" via {}", s("gateway")))
                .unwrap_or_default();
            let source = r
                .get("prefsrc")
                .map(|_| format!(" src {}", s("prefsrc")))
                .unwrap_or_default();
            let scope = s("scope").replace("global", "universe");
            format!(
                "{}{gateway} dev {} proto {} scope {scope}{source}",
                s("dst"),
                s("dev"),
                s("protocol")
            )
        })
        .collect();
    let pod_name = &fixture.pod;
    assert_eq!(routes, json_routes);
    assert_eq!(
        routes,
        [
            format!("default via 198.18.250.2 dev {pod_name} proto boot scope universe"),
            format!("198.18.250.0/30 dev {pod_name} proto kernel scope link src 198.18.250.1"),
            format!("198.18.251.0/24 via 198.18.250.2 dev {pod_name} proto boot scope universe"),
        ]
    );
    assert!(inside.routes.iter().all(|r| r.table == 254));

    // Outside: the host end names the pod end, in the namespace `ip netns list` numbers.
    let host = outside.link_named(&fixture.host).expect("host end");
    assert_eq!(host.index, host_index);
    assert_eq!(
        host.peer_index,
        Some(pod.index),
        "the host end's peer is the pod end"
    );
    let nsid = (ip_json(&["netns", "list"]).iter())
        .find(|n| n["name"] == fixture.netns.as_str())
        .and_then(|n| n["id"].as_i64());
    assert_eq!(host.peer_netns_id.map(i64::from), nsid);
    assert_same_link(
        host,
        &ip_json(&["-d", "link", "show", "dev", &fixture.host])[0],
    );
}

#[test]
fn a_missing_namespace_is_an_error_naming_it() {
    let path = format!("/var/run/netns/rk-nl-missing-{}", std::process::id());
    let error = netlink::read(Some(Path::new(&path))).expect_err("no such netns");
    assert!(matches!(error, NetlinkError::OpenNetns { .. }), "{error:?}");
    assert!(error.to_string().contains(&path), "{error}");
}

#[test]
fn the_own_namespace_has_loopback_as_ip_shows_it() {
    let own = netlink::read(None).expect("read the own netns");
    let lo = own.link_named("lo").expect("lo");
    assert_eq!((lo.index, lo.kind.as_deref()), (1, None));
    assert_same_link(lo, &ip_json(&["-d", "link", "show", "dev", "lo"])[0]);
    let v4: Vec<String> = (lo.addresses.iter())
        .map(|a| format!("{}/{}", a.address, a.prefix_len))
        .collect();
    assert!(v4.contains(&"127.0.0.1/8".to_owned()), "{v4:?}");
}
