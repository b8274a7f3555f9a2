//! The local cluster's kube-apiserver: an admin request, and what the node identity may
//! and may not do under Node authorization.

mod common;

use common::{kube_client, node_name};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{Api, ListParams};

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn admin_sees_the_v1_20_server_and_its_namespaces() {
    let client = kube_client("admin.kubeconfig").await;
    let version = client.apiserver_version().await.expect("GET /version");
    assert_eq!(version.git_version, "v1.20.2");
    let namespaces = Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .expect("list namespaces");
    let names: Vec<_> = namespaces
        .items
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    for expected in ["default", "kube-system", "kube-node-lease"] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn node_identity_lists_its_pods_but_not_secrets() {
    let client = kube_client(&format!("node-{}.kubeconfig", node_name())).await;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", node_name())))
        .await;
    assert!(pods.is_ok(), "a node may list its own pods: {pods:?}");
    let secrets = Api::<Secret>::all(client)
        .list(&ListParams::default())
        .await;
    match secrets {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("a node must not list all secrets, got {other:?}"),
    }
}
