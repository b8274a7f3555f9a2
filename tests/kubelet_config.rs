//! rkubelet started as kubeadm starts a kubelet on a kind worker: a KubeletConfiguration
//! file of the form kubeadm v1.20 writes (`/var/lib/kubelet/config.yaml`) and the flags of
//! kind's `kubeadm-flags.env`, without a subcommand. Without a cluster: the command line
//! reaches the start (and a bad file stops it with the kubelet's words). With the cluster:
//! the file's fields show in behaviour (the Node's `capacity.pods`, a pod's
//! `/etc/resolv.conf`), a flag overrides the file, and an ignored field is logged once.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::case::{Case, running};
use common::pods::exec_in;
use common::{eventually, kube_client, node_name, state_dir};
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

/// The kubelet configuration kubeadm v1.20 writes on a kind worker (zero durations as
/// kubeadm leaves them, kind's eviction thresholds), with the paths of this test node and
/// fields added so that they can be seen: `maxPods`, `containerLogMaxSize` (implemented:
/// quiet) and `topologyManagerPolicy` (which rkubelet does not implement).
fn kind_worker_config(ca: &Path, manifests: &Path) -> String {
    format!(
        "\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: cgroupfs
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerLogMaxSize: 50Mi
cpuManagerReconcilePeriod: 0s
evictionHard:
  imagefs.available: 0%
  nodefs.available: 0%
  nodefs.inodesFree: 0%
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageGCHighThresholdPercent: 100
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging: {{}}
maxPods: 17
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
staticPodPath: {manifests}
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
topologyManagerPolicy: best-effort
volumeStatsAggPeriod: 0s
",
        ca = ca.display(),
        manifests = manifests.display()
    )
}

/// kind's `KUBELET_KUBEADM_ARGS`, with a node IP that is not this host's: the agent parses
/// everything, logs, and stops at the node IP check, before any traffic.
const KIND_KUBEADM_ARGS: &str = "--container-runtime=remote \
     --container-runtime-endpoint=unix:///run/containerd/containerd.sock --fail-swap-on=false \
     --node-ip=203.0.113.77 --node-labels= --pod-infra-container-image=registry.k8s.io/pause:3.9 \
     --provider-id=kind://docker/kind/kind-worker --runtime-cgroups=/system.slice/containerd.service";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rk-kubelet-config-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs `rkubelet` with `args` (no subcommand); its stderr and whether it succeeded.
fn rkubelet(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rkubelet"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("rkubelet");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn lines_with<'a>(log: &'a str, words: &[&str]) -> Vec<&'a str> {
    log.lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .collect()
}

#[test]
fn kinds_flags_and_config_file_start_rkubelet_without_a_subcommand() {
    let dir = scratch("kind");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        kind_worker_config(
            Path::new("/etc/kubernetes/pki/ca.crt"),
            &dir.join("manifests"),
        ),
    )
    .expect("write config");
    let mut args = vec![
        "--config",
        config.to_str().expect("utf-8"),
        "--kubeconfig",
        "/nonexistent/kubelet.conf",
    ];
    args.extend(KIND_KUBEADM_ARGS.split_whitespace());
    let (ok, log) = rkubelet(&args);
    assert!(!ok, "the node IP is not this host's: {log}");
    assert!(
        log.contains("node IP: 203.0.113.77 not found in the host's network interfaces"),
        "the agent got as far as its node IP: {log}"
    );
    assert_eq!(
        lines_with(&log, &["kubelet config file loaded"]).len(),
        1,
        "{log}"
    );
    assert_eq!(
        lines_with(
            &log,
            &[
                "kubelet config field ignored",
                "field=topologyManagerPolicy"
            ]
        )
        .len(),
        1,
        "an ignored field is logged once: {log}"
    );
    assert_eq!(
        lines_with(
            &log,
            &["kubelet flag has no effect", "flag=--runtime-cgroups"]
        )
        .len(),
        1,
        "--runtime-cgroups is logged once: {log}"
    );
    // What rkubelet does anyway is not worth a warning.
    for quiet in [
        "--container-runtime ",
        "--fail-swap-on",
        // Image GC keeps it.
        "--pod-infra-container-image",
        "field=authentication",
        "field=logging",
        "field=containerLogMaxSize",
    ] {
        assert!(!log.contains(quiet), "{quiet}: {log}");
    }
    std::fs::remove_dir_all(dir).expect("clean up");
}

#[test]
fn a_config_file_of_another_kind_stops_the_start_with_the_kubelets_words() {
    let dir = scratch("bad");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n",
    )
    .expect("write config");
    let (ok, log) = rkubelet(&[
        "--config",
        config.to_str().expect("utf-8"),
        "--kubeconfig",
        "/nonexistent/kubelet.conf",
    ]);
    assert!(!ok);
    assert!(
        log.contains(&format!(
            "failed to load Kubelet config file {}, error failed to decode, error: no kind \
             \"KubeProxyConfiguration\" is registered for version \"kubeproxy.config.k8s.io/v1alpha1\"",
            config.display()
        )),
        "{log}"
    );
    std::fs::remove_dir_all(dir).expect("clean up");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_kind_worker_config_file_shows_in_the_node_and_the_pods() {
    let dir = state_dir().join("test-agents").join("kubelet-config");
    std::fs::create_dir_all(dir.join("manifests")).expect("config dir");
    let config = dir.join("config.yaml");
    let ca = state_dir().join("pki").join("ca.crt");
    std::fs::write(&config, kind_worker_config(&ca, &dir.join("manifests"))).expect("config");
    // The file's clusterDomain (cluster.local) is overridden on the command line.
    let case = Case::with_agent(
        "kcfg",
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "--cluster-domain=rk.test",
        ],
    )
    .await;

    let admin = kube_client("admin.kubeconfig").await;
    let nodes: kube::Api<Node> = kube::Api::all(admin);
    eventually(
        "capacity.pods 17 from maxPods",
        Duration::from_secs(60),
        || async {
            let node = nodes.get(&node_name()).await.ok()?;
            let capacity = node.status?.capacity?;
            (capacity.get("pods")?.0 == "17").then_some(())
        },
    )
    .await;

    let name = case
        .create(
            "dns",
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{ "name": "main", "image": "busybox", "command": ["sleep", "3600"] }],
                },
            }),
        )
        .await;
    let uid = running(&name).await.metadata.uid.expect("uid");
    let out = exec_in(&uid, "main", vec!["cat".into(), "/etc/resolv.conf".into()]).await;
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    // clusterDNS from the file, the domain from the flag; no host resolver (the test agent
    // runs with --resolv-conf "").
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "search default.svc.rk.test svc.rk.test rk.test\nnameserver 10.96.0.10\noptions ndots:5\n"
    );

    let log = case.agent().this_runs_log().expect("agent log");
    let started = log
        .rfind(&format!("file={}", config.display()))
        .map_or(log.as_str(), |at| &log[at..]);
    assert_eq!(
        lines_with(
            started,
            &[
                "kubelet config field ignored",
                "field=topologyManagerPolicy"
            ]
        )
        .len(),
        1,
        "logged once: {}",
        case.agent().log_tail()
    );
    assert_eq!(
        lines_with(
            started,
            &[
                "overridden by the command line",
                "field=clusterDomain",
                "flag=--cluster-domain"
            ]
        )
        .len(),
        1
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// Deletes the test node's Node and Lease, so that the next agent registers it anew.
async fn delete_node(admin: &kube::Client) {
    use k8s_openapi::api::coordination::v1::Lease;
    let nodes: kube::Api<Node> = kube::Api::all(admin.clone());
    let leases: kube::Api<Lease> = kube::Api::namespaced(admin.clone(), "kube-node-lease");
    let dp = kube::api::DeleteParams::default();
    let _ = nodes.delete(&node_name(), &dp).await;
    let _ = leases.delete(&node_name(), &dp).await;
    eventually("the Node gone", Duration::from_secs(30), || async {
        nodes
            .get_opt(&node_name())
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_new_node_is_registered_with_the_provider_id_and_taints() {
    let mut case = Case::new("ktaint").await;
    let admin = kube_client("admin.kubeconfig").await;
    delete_node(&admin).await;
    let dir = scratch("provider");
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "providerID": "kind://docker/kind/rk-node1"}"#,
    )
    .expect("config");
    case.start_agent(&[
        "--config",
        config.to_str().expect("utf-8"),
        "--register-with-taints=rkubelet.test/config=yes:NoSchedule,rkubelet.test/bare:PreferNoSchedule",
    ]);
    let nodes: kube::Api<Node> = kube::Api::all(admin.clone());
    let spec = eventually("the Node registered", Duration::from_secs(60), || async {
        nodes.get_opt(&node_name()).await.ok()??.spec
    })
    .await;
    case.stop_agent();
    delete_node(&admin).await;
    std::fs::remove_dir_all(dir).expect("clean up");
    assert_eq!(
        spec.provider_id.as_deref(),
        Some("kind://docker/kind/rk-node1")
    );
    let taints: Vec<(String, Option<String>, String)> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        // The node lifecycle controller adds its own (not-ready, …).
        .filter(|t| t.key.starts_with("rkubelet.test/"))
        .map(|t| (t.key, t.value, t.effect))
        .collect();
    assert_eq!(
        taints,
        [
            (
                "rkubelet.test/config".into(),
                Some("yes".into()),
                "NoSchedule".into()
            ),
            ("rkubelet.test/bare".into(), None, "PreferNoSchedule".into()),
        ]
    );
}
