//! The node module against the local cluster, with only the node identity
//! `system:node:rk-node1`: registration (labels, addresses, capacity, conditions, nodeInfo),
//! the pod CIDR, the Lease and its renewals, adoption of an existing Node, and what the
//! Node authorizer and NodeRestriction forbid.
//!
//! Every test starts and ends with no Node and no Lease of the node's name (deleted with
//! the admin identity, also when the test fails), since later tests register it too.

mod common;

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agent::TEST_EVICTION_HARD;
use common::{cri, kube_client, node_name};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rkubelet::cri::{CriClient, Endpoint, RuntimeHealth};
use rkubelet::node::{
    DEFAULT_KUBELET_VERSION, LinuxMachine, MachineInfo, NODE_LEASE_NAMESPACE, NodeAgent,
    NodeConfig, ReadinessCheck, StatusTrigger, StatusUpdate, wait_for_pod_cidr,
};
use tokio_util::sync::CancellationToken;

/// The tests share one node name: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The node's address (`NODE_IP` of scripts/common.sh).
fn node_ip() -> IpAddr {
    std::env::var("RKUBELET_NODE_IP")
        .unwrap_or_else(|_| "198.18.0.1".into())
        .parse()
        .expect("a valid node IP")
}

/// Another node's name, for what the node identity may not do.
fn other_node() -> String {
    format!("{}-other", node_name())
}

async fn node_client() -> kube::Client {
    kube_client(&format!("node-{}.kubeconfig", node_name())).await
}

fn agent(client: kube::Client, config: NodeConfig) -> NodeAgent {
    agent_with(client, config, Arc::new(cri()), Vec::new())
}

fn agent_with(
    client: kube::Client,
    config: NodeConfig,
    runtime: Arc<CriClient>,
    checks: Vec<Arc<dyn ReadinessCheck>>,
) -> NodeAgent {
    NodeAgent::new(client, config, Arc::new(LinuxMachine), runtime, checks)
        .expect("a valid configuration")
}

/// The kubelet's defaults, with the test agents' eviction thresholds: the shared disk is
/// often below the default `nodefs.available<10%` (DiskPressure); the defaults themselves
/// are unit tests' (`node::config`).
fn config() -> NodeConfig {
    let mut config = NodeConfig::new(node_name(), node_ip());
    config.eviction_hard = rkubelet::eviction::parse_eviction_hard(TEST_EVICTION_HARD)
        .expect("the test thresholds")
        .hard;
    config
}

async fn delete_if_present<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("deleting {name}: {e}"),
    }
}

/// Deletes our Node and Lease, and the other node some tests create.
async fn clean(admin: &kube::Client) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NODE_LEASE_NAMESPACE);
    for name in [node_name(), other_node()] {
        delete_if_present(&nodes, &name).await;
        delete_if_present(&leases, &name).await;
    }
}

/// Waits until no agent renews the node's lease (an agent left running by another test
/// would fight with these): at most two minutes.
async fn wait_for_no_live_agent(admin: &kube::Client) {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NODE_LEASE_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let lease = leases.get_opt(&node_name()).await.expect("get the lease");
        let live = lease.and_then(|l| l.spec).is_some_and(|spec| {
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(40));
            spec.renew_time.is_some_and(|renewed| {
                Timestamp::now().as_second() - renewed.0.as_second() <= duration + 5
            })
        });
        if !live {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "another agent keeps renewing the lease of {}: stop it first",
            node_name()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Runs `body` with a clean slate and cleans up after it, also when it panics. The token
/// given to `body` is cancelled before the clean-up, so heartbeats it started stop first.
async fn with_clean_node<F, Fut>(body: F)
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let _one = ONE_AT_A_TIME.lock().await;
    let admin = kube_client("admin.kubeconfig").await;
    wait_for_no_live_agent(&admin).await;
    clean(&admin).await;
    let cancel = CancellationToken::new();
    let outcome = tokio::spawn(body(cancel.clone())).await;
    cancel.cancel();
    // A renewal already sent may still land: let it, then delete.
    tokio::time::sleep(Duration::from_millis(500)).await;
    clean(&admin).await;
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("test task failed: {e}"),
        }
    }
}

async fn admin_get_node() -> Node {
    let admin = kube_client("admin.kubeconfig").await;
    Api::<Node>::all(admin)
        .get(&node_name())
        .await
        .expect("the Node exists")
}

fn status(node: &Node) -> &NodeStatus {
    node.status.as_ref().expect("the Node has a status")
}

fn addresses(node: &Node) -> Vec<(String, String)> {
    status(node)
        .addresses
        .iter()
        .flatten()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect()
}

fn quantity<'a>(node: &'a Node, list: &str, name: &str) -> &'a str {
    let s = status(node);
    let list = if list == "capacity" {
        &s.capacity
    } else {
        &s.allocatable
    };
    &list.as_ref().expect("resources")[name].0
}

/// The bytes of a quantity as the server writes memory (`24684092Ki`, `100Mi`, `512`).
fn bytes_of(quantity: &str) -> u64 {
    let (number, shift) = [("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40)]
        .iter()
        .find_map(|(suffix, shift)| Some((quantity.strip_suffix(suffix)?, *shift)))
        .unwrap_or((quantity, 0));
    number.parse::<u64>().expect("an integer quantity") << shift
}

fn is_forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    match result {
        Err(kube::Error::Api(s)) => s.code == 403,
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn registers_the_node_with_labels_addresses_capacity_conditions_and_node_info() {
    with_clean_node(|cancel| async move {
        let mut config = config();
        config.node_status_report_frequency = Duration::from_secs(2);
        let agent = agent(node_client().await, config);
        let started = Instant::now();
        let registered = agent.register(&cancel).await.expect("registration");
        let registration = started.elapsed();
        let started = Instant::now();
        let update = agent.update_node_status().await.expect("status update");
        let first_update = started.elapsed();
        eprintln!(
            "registration (create with full status): {} ms; next status update: {} ms",
            registration.as_millis(),
            first_update.as_millis()
        );
        // The server gives back exactly what was computed: nothing to send...
        assert_eq!(update, StatusUpdate::Unchanged);
        let heartbeat = |node: &Node| {
            status(node)
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Ready")
                .and_then(|c| c.last_heartbeat_time.clone())
        };
        let reported = heartbeat(&admin_get_node().await).expect("a heartbeat time");
        // ... until the report frequency has passed: then the same status is sent again.
        tokio::time::sleep(Duration::from_millis(2100)).await;
        assert_eq!(
            agent.update_node_status().await.expect("status update"),
            StatusUpdate::Patched
        );
        let node = admin_get_node().await;
        assert!(heartbeat(&node).expect("a heartbeat time") > reported);
        let ready = status(&node)
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready");
        assert!(
            ready.and_then(|c| c.last_transition_time.clone()) <= Some(reported),
            "the transition time did not move: {ready:?}"
        );

        assert_eq!(node.metadata.uid, registered.metadata.uid);
        let labels = node.metadata.labels.clone().unwrap_or_default();
        for (key, value) in [
            ("kubernetes.io/hostname", node_name().as_str()),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", "amd64"),
        ] {
            assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
        }
        assert_eq!(
            addresses(&node),
            [
                ("InternalIP".to_owned(), node_ip().to_string()),
                ("Hostname".to_owned(), node_name())
            ]
        );

        let machine = LinuxMachine;
        assert_eq!(
            quantity(&node, "capacity", "cpu"),
            machine.num_cpus().unwrap().to_string()
        );
        let memory = machine.memory().unwrap().total_bytes;
        assert_eq!(bytes_of(quantity(&node, "capacity", "memory")), memory);
        assert_eq!(quantity(&node, "capacity", "pods"), "110");
        assert_eq!(quantity(&node, "allocatable", "pods"), "110");
        assert!(!quantity(&node, "capacity", "ephemeral-storage").is_empty());
        assert_eq!(quantity(&node, "capacity", "hugepages-2Mi"), "0");
        assert_eq!(
            bytes_of(quantity(&node, "allocatable", "memory")),
            memory - (100 << 20),
            "allocatable memory is capacity minus the 100Mi eviction threshold"
        );

        let conditions = status(&node).conditions.clone().unwrap_or_default();
        let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        );
        for c in &conditions[..3] {
            assert_eq!(c.status, "False", "{c:?}");
        }
        let health = RuntimeHealth::from(
            &rkubelet::cri::Cri::status(
                &cri(),
                rkubelet::cri::api::StatusRequest { verbose: false },
            )
            .await
            .expect("CRI Status"),
        );
        let ready = &conditions[3];
        if health.ready() {
            assert_eq!(ready.status, "True", "{ready:?}");
            assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
        } else {
            assert_eq!(ready.status, "False", "{ready:?}");
            assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
            assert!(
                ready
                    .message
                    .as_deref()
                    .is_some_and(|m| m.contains("not ready: ")),
                "{ready:?}"
            );
        }

        let info = status(&node).node_info.clone().expect("nodeInfo");
        assert!(
            info.container_runtime_version.starts_with("containerd://"),
            "{info:?}"
        );
        assert_eq!(info.kubelet_version, DEFAULT_KUBELET_VERSION);
        assert_eq!(info.kube_proxy_version, DEFAULT_KUBELET_VERSION);
        assert_eq!(info.operating_system, "linux");
        assert_eq!(info.architecture, "amd64");
        assert_eq!(info.boot_id, machine.boot_id().unwrap());
        assert_eq!(info.machine_id, machine.machine_id().unwrap());
        assert_eq!(info.kernel_version, machine.kernel_version().unwrap());
        assert_eq!(info.os_image, machine.os_image().unwrap());
        let port = status(&node)
            .daemon_endpoints
            .as_ref()
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .map(|e| e.port);
        assert_eq!(port, Some(10250));
    })
    .await;
}

/// The runtime is unreachable and a readiness check fails: the Node still registers,
/// NotReady, with both reasons in the kubelet's words.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_node_whose_runtime_is_down_registers_not_ready() {
    struct Pleg;
    impl ReadinessCheck for Pleg {
        fn name(&self) -> &str {
            "PLEG"
        }
        fn check(&self) -> Result<(), String> {
            Err("pleg has yet to be successful".into())
        }
    }
    with_clean_node(|cancel| async move {
        let endpoint: Endpoint = "unix:///run/rkubelet-test/no-runtime.sock".parse().unwrap();
        let runtime = Arc::new(CriClient::new(
            endpoint,
            Duration::from_secs(2),
            Some(Duration::from_secs(2)),
        ));
        let agent = agent_with(node_client().await, config(), runtime, vec![Arc::new(Pleg)]);
        agent.register(&cancel).await.expect("registration");
        let node = admin_get_node().await;
        let ready = status(&node)
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .cloned()
            .expect("a Ready condition");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("[container runtime is down, PLEG is not healthy: pleg has yet to be successful]")
        );
    })
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn kube_controller_manager_allocates_a_pod_cidr() {
    with_clean_node(|cancel| async move {
        let client = node_client().await;
        agent(client.clone(), config())
            .register(&cancel)
            .await
            .expect("registration");
        let started = Instant::now();
        let cidr = wait_for_pod_cidr(&client, &node_name(), Duration::from_secs(60))
            .await
            .expect("a pod CIDR");
        eprintln!("pod CIDR {cidr} after {} ms", started.elapsed().as_millis());
        assert!(
            cidr.starts_with("10.244.") && cidr.ends_with("/24"),
            "{cidr}"
        );
        let node = admin_get_node().await;
        assert_eq!(node.spec.and_then(|s| s.pod_cidr), Some(cidr));
    })
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_lease_is_held_owned_by_the_node_and_renewed() {
    with_clean_node(|cancel| async move {
        let client = node_client().await;
        let mut config = config();
        // Renew every second rather than every ten.
        config.node_lease_duration_seconds = 4;
        let agent = Arc::new(agent(client.clone(), config));
        let node = agent.register(&cancel).await.expect("registration");
        let trigger = StatusTrigger::default();
        let lease = tokio::spawn(agent.lease().run(cancel.clone()));
        let status =
            tokio::spawn(Arc::clone(&agent).run_status_loop(cancel.clone(), trigger.clone()));
        trigger.update_now();

        let leases: Api<Lease> = Api::namespaced(client, NODE_LEASE_NAMESPACE);
        let renewed_at = |lease: &Lease| {
            lease
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.clone())
                .expect("a renew time")
                .0
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let first = loop {
            if let Some(lease) = leases.get_opt(&node_name()).await.expect("get the lease") {
                break lease;
            }
            assert!(Instant::now() < deadline, "no lease after 10 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let spec = first.spec.clone().expect("a lease spec");
        assert_eq!(spec.holder_identity.as_deref(), Some(node_name().as_str()));
        assert_eq!(spec.lease_duration_seconds, Some(4));
        let owners = first.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(owners[0].kind, "Node");
        assert_eq!(owners[0].name, node_name());
        assert_eq!(Some(&owners[0].uid), node.metadata.uid.as_ref());

        tokio::time::sleep(Duration::from_millis(2500)).await;
        let later = leases.get(&node_name()).await.expect("get the lease");
        assert!(
            renewed_at(&later) > renewed_at(&first),
            "renewTime did not advance: {:?} then {:?}",
            renewed_at(&first),
            renewed_at(&later)
        );

        cancel.cancel();
        let heartbeats = async {
            lease.await.expect("the lease heartbeat");
            status.await.expect("the node status heartbeat");
        };
        tokio::time::timeout(Duration::from_secs(5), heartbeats)
            .await
            .expect("the heartbeats stop when cancelled");
    })
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn registering_again_adopts_the_node() {
    with_clean_node(|cancel| async move {
        let first = agent(node_client().await, config())
            .register(&cancel)
            .await
            .expect("first registration");
        let again = agent(node_client().await, config())
            .register(&cancel)
            .await
            .expect("second registration");
        assert!(first.metadata.uid.is_some());
        assert_eq!(again.metadata.uid, first.metadata.uid);
    })
    .await;
}

/// A Node left by someone else, with a stale hostname label, stale addresses and an
/// administrator's label: adoption fixes ours and keeps theirs.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn adoption_reconciles_labels_and_addresses_of_an_existing_node() {
    with_clean_node(|cancel| async move {
        let admin = kube_client("admin.kubeconfig").await;
        let address = |type_: &str, address: &str| NodeAddress {
            type_: type_.into(),
            address: address.into(),
        };
        let stale = Node {
            metadata: ObjectMeta {
                name: Some(node_name()),
                labels: Some(
                    [
                        ("kubernetes.io/hostname", "stale-host"),
                        ("example.com/team", "blue"),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                addresses: Some(vec![
                    address("InternalIP", "198.18.0.99"),
                    address("ExternalIP", "203.0.113.7"),
                    address("Hostname", "stale-host"),
                ]),
                ..NodeStatus::default()
            }),
        };
        let created = Api::<Node>::all(admin)
            .create(&PostParams::default(), &stale)
            .await
            .expect("the admin creates the stale Node");

        let adopted = agent(node_client().await, config())
            .register(&cancel)
            .await
            .expect("adoption");
        assert_eq!(adopted.metadata.uid, created.metadata.uid);
        let node = admin_get_node().await;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["kubernetes.io/hostname"], node_name());
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["example.com/team"], "blue");
        assert_eq!(
            addresses(&node),
            [
                ("InternalIP".to_owned(), node_ip().to_string()),
                ("Hostname".to_owned(), node_name())
            ]
        );
    })
    .await;
}

/// The Node authorizer and NodeRestriction: the node may not create, change or delete
/// another Node, nor hold another node's Lease, nor give itself a role label.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_node_identity_cannot_modify_another_node() {
    with_clean_node(|cancel| async move {
        let client = node_client().await;
        let admin = kube_client("admin.kubeconfig").await;
        let nodes: Api<Node> = Api::all(client.clone());
        let other = Node {
            metadata: ObjectMeta {
                name: Some(other_node()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        assert!(is_forbidden(
            nodes.create(&PostParams::default(), &other).await
        ));

        // The admin creates it (the clean-up deletes it); the node may still not touch it.
        Api::<Node>::all(admin)
            .create(&PostParams::default(), &other)
            .await
            .expect("the admin creates another Node");
        let label = serde_json::json!({"metadata": {"labels": {"stolen": "yes"}}});
        assert!(is_forbidden(
            nodes
                .patch(
                    &other_node(),
                    &PatchParams::default(),
                    &Patch::Strategic(label)
                )
                .await
        ));
        let ready =
            serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        assert!(is_forbidden(
            nodes
                .patch_status(
                    &other_node(),
                    &PatchParams::default(),
                    &Patch::Strategic(ready)
                )
                .await
        ));
        assert!(is_forbidden(
            nodes.delete(&other_node(), &DeleteParams::default()).await
        ));

        let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(other_node()),
                namespace: Some(NODE_LEASE_NAMESPACE.into()),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        assert!(is_forbidden(
            leases.create(&PostParams::default(), &lease).await
        ));

        // Its own Node, yes; a role label on it, no.
        agent(client, config())
            .register(&cancel)
            .await
            .expect("registration");
        let role =
            serde_json::json!({"metadata": {"labels": {"node-role.kubernetes.io/master": ""}}});
        assert!(is_forbidden(
            nodes
                .patch(
                    &node_name(),
                    &PatchParams::default(),
                    &Patch::Strategic(role)
                )
                .await
        ));
    })
    .await;
}
