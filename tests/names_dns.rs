//! A pod's names and resolver as its containers see them (`cat /etc/hosts`,
//! `cat /etc/resolv.conf`, `hostname`), compared with what the kubelet writes: the managed
//! hosts file with the pod's FQDN and `hostAliases`, none over a container's own
//! `/etc/hosts`, the node's hosts file with the aliases on the host's network, hostnames
//! cut to 63 characters or set to the FQDN, and each DNS policy with `dnsConfig` and the
//! resolver's limits (with the kubelet's `DNSConfigForming` and `MissingClusterDNS`
//! events), `ClusterFirstWithHostNet` against `ClusterFirst` on the host's network. The expected texts are what the real kubelet v1.20.2 wrote for the same pods
//! on this cluster.
//!
//! Every resolver a pod gets stays on this machine: `--cluster-dns` is the node's own
//! address and the agent runs without `--resolv-conf` (the kubelet then gives Default
//! pods `127.0.0.1`); the pods' own nameservers are loopback addresses.

mod common;

use std::time::Duration;

use common::agent::NODE_IP;
use common::case::{Case, running};
use common::pods::{events_of, exec_in};
use serde_json::json;

const CLUSTER_DNS: [&str; 4] = [
    "--cluster-dns",
    NODE_IP,
    "--cluster-domain",
    "cluster.local",
];

/// The managed hosts file's fixed part.
const MANAGED_HEAD: &str = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n";

/// A sleeping busybox container.
fn container(name: &str) -> serde_json::Value {
    json!({ "name": name, "image": "busybox", "command": ["sleep", "3600"] })
}

/// A pod of one sleeping container with these spec fields.
fn pod(spec: serde_json::Value) -> serde_json::Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": { "terminationGracePeriodSeconds": 1, "containers": [container("main")] }
    });
    if let (Some(all), Some(extra)) = (pod["spec"].as_object_mut(), spec.as_object()) {
        all.extend(extra.clone());
    }
    pod
}

/// What `cmd` prints in the container of the running pod `name`.
async fn exec(name: &str, container: &str, cmd: &[&str]) -> String {
    let pod = running(name).await;
    let uid = pod.metadata.uid.expect("uid");
    let argv = cmd.iter().map(|s| (*s).to_owned()).collect();
    let out = exec_in(&uid, container, argv).await;
    assert_eq!(
        out.exit_code,
        0,
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The container's hosts file, resolv.conf and hostname.
async fn names(name: &str, container: &str) -> (String, String, String) {
    (
        exec(name, container, &["cat", "/etc/hosts"]).await,
        exec(name, container, &["cat", "/etc/resolv.conf"]).await,
        exec(name, container, &["hostname"])
            .await
            .trim_end()
            .to_owned(),
    )
}

/// The pod's IP once it runs.
async fn pod_ip(name: &str) -> String {
    running(name)
        .await
        .status
        .and_then(|s| s.pod_ip)
        .expect("pod IP")
}

/// The messages of the pod's events with this reason, once there is one.
async fn event_messages(name: &str, reason: &str) -> Vec<String> {
    common::eventually(
        &format!("{name}: {reason} events"),
        Duration::from_secs(20),
        || async {
            let messages: Vec<String> = events_of(name)
                .await
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter_map(|e| e.message)
                .collect();
            (!messages.is_empty()).then_some(messages)
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn cluster_first_pods_get_their_names_aliases_and_limited_dns() {
    let case = Case::with_agent("names", &CLUSTER_DNS).await;
    let mut own_hosts = container("own");
    own_hosts["volumeMounts"] =
        json!([{ "name": "hosts", "mountPath": "/etc/hosts", "readOnly": true }]);
    let named = case
        .create(
            "named",
            pod(json!({
                "hostname": "db",
                "subdomain": "backend",
                "hostAliases": [
                    { "ip": "127.0.0.2", "hostnames": ["foo.local", "bar.local"] },
                    { "ip": "10.1.2.3", "hostnames": ["baz"] },
                ],
                "dnsConfig": {
                    "nameservers": ["127.0.0.2", "127.0.0.3", "127.0.0.4"],
                    "searches": ["a.test", "b.test", "c.test", "d.test"],
                    "options": [{ "name": "ndots", "value": "2" }, { "name": "edns0" }],
                },
                "containers": [container("main"), own_hosts],
                "volumes": [{ "name": "hosts", "hostPath": { "path": "/etc/hosts", "type": "File" } }],
            })),
        )
        .await;
    let long = case.create(&"x".repeat(60), pod(json!({}))).await;
    let fqdn = case
        .create(
            "fqdn",
            pod(json!({ "hostname": "web", "subdomain": "sub", "setHostnameAsFQDN": true })),
        )
        .await;

    let ip = pod_ip(&named).await;
    let (hosts, resolv, hostname) = names(&named, "main").await;
    assert_eq!(
        hosts,
        format!(
            "{MANAGED_HEAD}{ip}\tdb.backend.default.svc.cluster.local\tdb\n\n# Entries added by HostAliases.\n\
             127.0.0.2\tfoo.local\tbar.local\n10.1.2.3\tbaz\n"
        )
    );
    assert_eq!(hostname, "db");
    assert_eq!(
        resolv,
        format!(
            "search default.svc.cluster.local svc.cluster.local cluster.local a.test b.test c.test\n\
             nameserver {NODE_IP}\nnameserver 127.0.0.2\nnameserver 127.0.0.3\noptions ndots:2 edns0\n"
        )
    );
    let node_hosts = std::fs::read_to_string("/etc/hosts").expect("node hosts file");
    let (own, _, _) = names(&named, "own").await;
    assert_eq!(
        own, node_hosts,
        "a container's own /etc/hosts is left alone"
    );
    let forming = event_messages(&named, "DNSConfigForming").await;
    for expected in [
        format!(
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {NODE_IP} 127.0.0.2 127.0.0.3"
        ),
        "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: default.svc.cluster.local svc.cluster.local cluster.local a.test b.test c.test".to_owned(),
    ] {
        assert!(forming.contains(&expected), "{forming:?}");
    }

    let cut: String = long.chars().take(63).collect();
    let cut = cut.trim_end_matches(['-', '.']);
    assert!(long.len() > 63 && cut.len() <= 63);
    let ip = pod_ip(&long).await;
    let (hosts, resolv, hostname) = names(&long, "main").await;
    assert_eq!(hostname, cut);
    assert_eq!(hosts, format!("{MANAGED_HEAD}{ip}\t{cut}\n"));
    assert_eq!(
        resolv,
        format!(
            "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver {NODE_IP}\noptions ndots:5\n"
        )
    );

    let ip = pod_ip(&fqdn).await;
    let (hosts, _, hostname) = names(&fqdn, "main").await;
    assert_eq!(hostname, "web.sub.default.svc.cluster.local");
    assert_eq!(
        hosts,
        format!("{MANAGED_HEAD}{ip}\tweb.sub.default.svc.cluster.local\tweb\n")
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn host_network_default_and_none_policies_without_cluster_dns() {
    let case = Case::with_agent("dns-pol", &[]).await;
    let aliases = json!([{ "ip": "127.0.0.2", "hostnames": ["foo.local"] }]);
    let host = case
        .create(
            "host",
            pod(json!({ "hostNetwork": true, "dnsPolicy": "Default", "hostAliases": aliases })),
        )
        .await;
    let fallback = case.create("fallback", pod(json!({}))).await;
    let none = case
        .create(
            "none",
            pod(json!({
                "dnsPolicy": "None",
                "dnsConfig": {
                    "nameservers": ["127.0.0.9"],
                    "searches": ["x.test"],
                    "options": [{ "name": "ndots", "value": "1" }],
                },
            })),
        )
        .await;

    let node_hosts = std::fs::read_to_string("/etc/hosts").expect("node hosts file");
    let node_name = nix::unistd::gethostname()
        .expect("hostname")
        .into_string()
        .expect("UTF-8");
    let (hosts, resolv, hostname) = names(&host, "main").await;
    assert_eq!(
        hosts,
        format!(
            "# Kubernetes-managed hosts file (host network).\n{node_hosts}\n# Entries added by HostAliases.\n127.0.0.2\tfoo.local\n"
        ),
        "the node's hosts file with the aliases (as the real kubelet v1.20.2 writes it here)"
    );
    assert_eq!(hostname, node_name);
    assert_eq!(resolv, "search .\nnameserver 127.0.0.1\n");

    let (_, resolv, _) = names(&fallback, "main").await;
    assert_eq!(resolv, "search .\nnameserver 127.0.0.1\n");
    let missing = event_messages(&fallback, "MissingClusterDNS").await;
    let uid = running(&fallback).await.metadata.uid.expect("uid");
    assert!(
        missing.contains(&format!(
            "pod: \"{fallback}_default({uid})\". kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy."
        )),
        "{missing:?}"
    );

    let (_, resolv, _) = names(&none, "main").await;
    assert_eq!(
        resolv,
        "search x.test\nnameserver 127.0.0.9\noptions ndots:1\n"
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_host_network_pod_gets_cluster_dns_only_with_cluster_first_with_host_net() {
    let case = Case::with_agent("dns-hostnet", &CLUSTER_DNS).await;
    let with = case
        .create(
            "with",
            pod(json!({ "hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet" })),
        )
        .await;
    let without = case
        .create(
            "without",
            pod(json!({ "hostNetwork": true, "dnsPolicy": "ClusterFirst" })),
        )
        .await;
    let (_, resolv, _) = names(&with, "main").await;
    assert_eq!(
        resolv,
        format!(
            "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver {NODE_IP}\noptions ndots:5\n"
        )
    );
    // ClusterFirst on the host's network is Default: the node's resolver (none given to
    // the agent here, so 127.0.0.1 as the kubelet writes it).
    let (_, resolv, _) = names(&without, "main").await;
    assert_eq!(resolv, "search .\nnameserver 127.0.0.1\n");
}
