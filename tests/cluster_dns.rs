//! The cluster DNS add-on's records (`scripts/cluster-dns/zone.jq`, which the cluster-dns
//! pod runs on what the API lists): the names the Kubernetes DNS specification gives
//! Services, headless Services' endpoints, ExternalName Services and Pods, as the
//! conformance suite's DNS tests look them up. No cluster: `jq` on a list as
//! `kubectl get services,endpoints,pods -A -o json` prints it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn records(list: serde_json::Value) -> Vec<String> {
    let program = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster-dns/zone.jq");
    let mut child = Command::new("jq")
        .args(["-r", "--arg", "domain", "cluster.local", "-f"])
        .arg(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run jq (scripts/setup.sh installs it)");
    child
        .stdin
        .take()
        .expect("jq's stdin")
        .write_all(list.to_string().as_bytes())
        .expect("write the list to jq");
    let out = child.wait_with_output().expect("jq's output");
    assert!(
        out.status.success(),
        "zone.jq: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8(out.stdout)
        .expect("records are text")
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

fn service(name: &str, spec: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"kind": "Service", "metadata": {"name": name, "namespace": "dns-1"}, "spec": spec})
}

#[test]
fn a_cluster_ip_service_has_an_a_a_ptr_and_an_srv_record_per_named_port() {
    let got = records(
        serde_json::json!({"items": [service("web", serde_json::json!({
            "type": "ClusterIP", "clusterIP": "10.96.3.4",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"port": 81}],
        }))]}),
    );
    assert_eq!(
        got,
        [
            "4.3.96.10.in-addr.arpa. IN PTR web.dns-1.svc.cluster.local.",
            "_http._tcp.web.dns-1.svc.cluster.local. IN SRV 0 100 80 web.dns-1.svc.cluster.local.",
            "web.dns-1.svc.cluster.local. IN A 10.96.3.4",
        ]
    );
}

#[test]
fn a_headless_service_names_each_ready_endpoint_by_hostname_or_dashed_ip() {
    let got = records(serde_json::json!({"items": [
        service("dns-test-service", serde_json::json!({"clusterIP": "None"})),
        {"kind": "Endpoints", "metadata": {"name": "dns-test-service", "namespace": "dns-1"},
         "subsets": [{
            "addresses": [{"ip": "10.244.1.5", "hostname": "dns-querier-1"}, {"ip": "10.244.2.7"}],
            "notReadyAddresses": [{"ip": "10.244.3.9"}],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
         }]},
    ]}));
    let svc = "dns-test-service.dns-1.svc.cluster.local.";
    let mut want = vec![
        format!("{svc} IN A 10.244.1.5"),
        format!("{svc} IN A 10.244.2.7"),
        format!("dns-querier-1.{svc} IN A 10.244.1.5"),
        format!("10-244-2-7.{svc} IN A 10.244.2.7"),
        format!("5.1.244.10.in-addr.arpa. IN PTR dns-querier-1.{svc}"),
        format!("7.2.244.10.in-addr.arpa. IN PTR 10-244-2-7.{svc}"),
        format!("_http._tcp.{svc} IN SRV 0 100 80 dns-querier-1.{svc}"),
        format!("_http._tcp.{svc} IN SRV 0 100 80 10-244-2-7.{svc}"),
    ];
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn an_external_name_service_is_a_cname_and_pods_have_dashed_a_records() {
    let got = records(serde_json::json!({"items": [
        service("ext", serde_json::json!({"type": "ExternalName", "externalName": "foo.example.com"})),
        {"kind": "Pod", "metadata": {"name": "a", "namespace": "dns-1"}, "spec": {},
         "status": {"podIP": "10.244.1.5"}},
        // The host's address is not the pod's own; a pod without an IP has no record.
        {"kind": "Pod", "metadata": {"name": "b", "namespace": "dns-1"}, "spec": {"hostNetwork": true},
         "status": {"podIP": "198.18.0.11"}},
        {"kind": "Pod", "metadata": {"name": "c", "namespace": "dns-1"}, "spec": {}, "status": {}},
    ]}));
    assert_eq!(
        got,
        [
            "10-244-1-5.dns-1.pod.cluster.local. IN A 10.244.1.5",
            "ext.dns-1.svc.cluster.local. IN CNAME foo.example.com.",
        ]
    );
}
