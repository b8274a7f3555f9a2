//! Shared helpers of the integration tests. They run against the real local cluster that
//! `scripts/cluster.sh up` starts (containerd, registry, kube-apiserver, ...), as root, and
//! are `#[ignore]`d so that a plain `cargo test` stays hermetic: `scripts/test.sh` runs them
//! with `--include-ignored` once the cluster is up.
#![allow(dead_code, missing_docs)]

pub mod agent;

use std::path::PathBuf;
use std::time::Duration;

use rkubelet::cri::{CriClient, Endpoint};

/// Why the integration tests are ignored by a plain `cargo test`.
pub const NEEDS_CLUSTER: &str = "needs root and the local cluster: run scripts/test.sh";

/// The cluster's state directory (`RKUBELET_STATE`, as in scripts/common.sh).
pub fn state_dir() -> PathBuf {
    std::env::var_os("RKUBELET_STATE")
        .map_or_else(|| "/var/lib/rkubelet-cluster".into(), PathBuf::from)
}

/// The node name the cluster minted credentials for (`RKUBELET_NODE`).
pub fn node_name() -> String {
    std::env::var("RKUBELET_NODE").unwrap_or_else(|_| "rk-node1".into())
}

/// A CRI client for the cluster's containerd.
pub fn cri() -> CriClient {
    let endpoint: Endpoint = std::env::var("CONTAINER_RUNTIME_ENDPOINT")
        .unwrap_or_else(|_| "unix:///run/containerd/containerd.sock".into())
        .parse()
        .expect("valid endpoint");
    CriClient::new(endpoint, Duration::from_secs(30), Duration::from_secs(120))
}

/// A Kubernetes client from a kubeconfig file under the cluster's pki directory.
pub async fn kube_client(kubeconfig: &str) -> kube::Client {
    let path = state_dir().join("pki").join(kubeconfig);
    let kc = kube::config::Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kubeconfig to client config");
    kube::Client::try_from(config).expect("kube client")
}

/// A name unique to this test run, for sandboxes and other objects tests create.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}
