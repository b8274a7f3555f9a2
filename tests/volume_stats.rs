//! Volume statistics in `/stats/summary`, through the API server's node proxy, against
//! what the kubelet's metrics providers measure on the host: a pod writes 10 MiB into an
//! emptyDir and 1 MiB into a `medium: Memory` one and mounts a ConfigMap; each volume's
//! `usedBytes` is within 5 % of `du -x -s -B 1` of its directory, its `inodesUsed` is
//! `find -xdev`'s count, and its capacity, available bytes and inodes are its
//! filesystem's (`statvfs`, tmpfs for the Memory one); the same for a Secret, a projected
//! (ConfigMap and downward API) and a downwardAPI volume. Only the emptyDir on disk and the
//! ConfigMap count in the pod's ephemeral storage; no volume has a `pvcRef`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::case::{Case, root_dir, running};
use common::pods::{exec_in, sleeper};
use common::{cleanup_blocking, eventually, kube_client, kubectl, node_name, unique};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use serde_json::json;

const MIB: u64 = 1 << 20;

/// A ConfigMap and a Secret of one name in `default`, deleted when dropped.
struct TestConfigMap(String);

impl TestConfigMap {
    async fn create(name: &str) -> Self {
        let client = kube_client("admin.kubeconfig").await;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name},
            "data": {"big": "x".repeat(20_000), "small": "hello"},
        }))
        .expect("a ConfigMap");
        api.create(&PostParams::default(), &cm)
            .await
            .expect("create the ConfigMap");
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name},
            "stringData": {"password": "y".repeat(9_000), "user": "admin"},
        }))
        .expect("a Secret");
        Api::<Secret>::namespaced(client, "default")
            .create(&PostParams::default(), &secret)
            .await
            .expect("create the Secret");
        Self(name.to_owned())
    }
}

impl Drop for TestConfigMap {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.0);
        cleanup_blocking(move || async move {
            let client = kube_client("admin.kubeconfig").await;
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
            let _ = api.delete(&name, &Default::default()).await;
            let api: Api<Secret> = Api::namespaced(client, "default");
            let _ = api.delete(&name, &Default::default()).await;
        });
    }
}

/// `du -x -s -B 1 path`, as the kubelet's `metricsDu` runs it.
async fn du(path: &Path) -> u64 {
    let out = tokio::process::Command::new("du")
        .args(["-x", "-s", "-B", "1"])
        .arg(path)
        .output()
        .await
        .expect("du runs");
    assert!(out.status.success(), "du {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du's figure")
}

/// `find path -xdev | wc -l`, the kubelet's inode count.
async fn find(path: &Path) -> u64 {
    let out = tokio::process::Command::new("find")
        .arg(path)
        .arg("-xdev")
        .output()
        .await
        .expect("find runs");
    assert!(out.status.success(), "find {}", path.display());
    out.stdout.iter().filter(|b| **b == b'\n').count() as u64
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a number: {v}"))
}

fn within_5_percent(what: &str, got: u64, want: u64) {
    #[allow(clippy::cast_precision_loss)]
    let (g, w) = (got as f64, want as f64);
    assert!(
        (g - w).abs() <= w * 0.05,
        "{what}: {got} served, {want} measured"
    );
}

/// The volume's entry against its directory on the host.
async fn check_volume(entry: &serde_json::Value, dir: &Path, least: u64) {
    let name = entry["name"].as_str().expect("name");
    let used = u(&entry["usedBytes"]);
    assert!(used >= least, "{name}: {entry}");
    within_5_percent(&format!("{name} usedBytes"), used, du(dir).await);
    assert_eq!(u(&entry["inodesUsed"]), find(dir).await, "{name}: {entry}");
    let st = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    let fragment = st.fragment_size();
    assert_eq!(
        u(&entry["capacityBytes"]),
        st.blocks() * fragment,
        "{entry}"
    );
    assert_eq!(u(&entry["inodes"]), st.files(), "{entry}");
    within_5_percent(
        &format!("{name} availableBytes"),
        u(&entry["availableBytes"]),
        st.blocks_available() * fragment,
    );
    let inodes_free = u(&entry["inodesFree"]);
    assert!(inodes_free <= st.files(), "{entry}");
    assert!(entry.get("pvcRef").is_none(), "{entry}");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn summary_volume_stats_of_empty_dirs_config_maps_secrets_and_downward_api_match_du_and_statfs()
 {
    let case = Case::with_agent("volstats", &[]).await;
    let config = TestConfigMap::create(&unique("volstats")).await;
    let name = case
        .create(
            "writer",
            sleeper(json!({
                "volumes": [
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "ram", "emptyDir": {"medium": "Memory"}},
                    {"name": "conf", "configMap": {"name": config.0}},
                    {"name": "sec", "secret": {"secretName": config.0}},
                    {"name": "proj", "projected": {"sources": [
                        {"configMap": {"name": config.0, "items": [{"key": "big", "path": "big"}]}},
                        {"downwardAPI": {"items": [{"path": "name",
                            "fieldRef": {"fieldPath": "metadata.name"}}]}},
                    ]}},
                    {"name": "down", "downwardAPI": {"items": [
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}},
                    ]}},
                ],
                "containers": [{
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c",
                        "head -c 10485760 /dev/urandom > /scratch/blob && \
                         head -c 1048576 /dev/zero > /ram/blob && touch /scratch/done && \
                         exec sleep 3600"],
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/scratch"},
                        {"name": "ram", "mountPath": "/ram"},
                        {"name": "conf", "mountPath": "/conf"},
                        {"name": "sec", "mountPath": "/sec"},
                        {"name": "proj", "mountPath": "/proj"},
                        {"name": "down", "mountPath": "/down"},
                    ],
                }],
            })),
        )
        .await;
    let uid = running(&name).await.metadata.uid.expect("uid");
    eventually("10 MiB written", Duration::from_secs(60), || async {
        let out = exec_in(&uid, "main", vec!["ls".into(), "/scratch/done".into()]).await;
        (out.exit_code == 0).then_some(())
    })
    .await;
    let written = Utc::now();

    // The housekeeping's first reading after the writes (every 10 s).
    let path = format!("/api/v1/nodes/{}/proxy/stats/summary", node_name());
    let pod = eventually(
        "a summary read after the writes",
        Duration::from_secs(30),
        || async {
            let summary: serde_json::Value =
                serde_json::from_str(&kubectl(&["get", "--raw", &path]).await).expect("JSON");
            let pod = summary["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["uid"] == uid.as_str())?
                .clone();
            let time = pod["volume"][0]["time"].as_str()?;
            let read = DateTime::parse_from_rfc3339(time).ok()?;
            (read > written).then_some(pod)
        },
    )
    .await;
    let volumes = pod["volume"].as_array().expect("volume entries");
    let names: Vec<&str> = volumes.iter().filter_map(|v| v["name"].as_str()).collect();
    // The ephemeral ones (emptyDir on disk, ConfigMap) first, then the others; the
    // service account token's projected volume among them.
    assert_eq!(names[..2], ["conf", "scratch"], "{names:?}");
    assert!(names[2..].contains(&"ram"), "{names:?}");
    let volume = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {volumes:?}"))
    };
    let dir = |plugin: &str, volume: &str| -> PathBuf {
        root_dir()
            .join("pods")
            .join(&uid)
            .join("volumes")
            .join(plugin)
            .join(volume)
    };
    check_volume(
        volume("scratch"),
        &dir("kubernetes.io~empty-dir", "scratch"),
        10 * MIB,
    )
    .await;
    check_volume(volume("ram"), &dir("kubernetes.io~empty-dir", "ram"), MIB).await;
    check_volume(
        volume("conf"),
        &dir("kubernetes.io~configmap", "conf"),
        20_000,
    )
    .await;
    check_volume(volume("sec"), &dir("kubernetes.io~secret", "sec"), 9_000).await;
    check_volume(
        volume("proj"),
        &dir("kubernetes.io~projected", "proj"),
        20_000,
    )
    .await;
    check_volume(
        volume("down"),
        &dir("kubernetes.io~downward-api", "down"),
        7,
    )
    .await;
    // tmpfs, not the node's filesystem.
    assert_ne!(
        volume("ram")["capacityBytes"],
        volume("scratch")["capacityBytes"]
    );

    // Ephemeral storage: the containers' writable layers and logs, the emptyDir on disk
    // and the ConfigMap; not the Memory emptyDir.
    let containers: u64 = pod["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .map(|c| u(&c["rootfs"]["usedBytes"]) + u(&c["logs"]["usedBytes"]))
        .sum();
    let counted = containers + u(&volume("scratch")["usedBytes"]) + u(&volume("conf")["usedBytes"]);
    let ephemeral = u(&pod["ephemeral-storage"]["usedBytes"]);
    assert!(
        ephemeral >= counted && ephemeral < counted + MIB,
        "ephemeral {ephemeral}, counted {counted}: {pod}"
    );
}
