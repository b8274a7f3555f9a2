//! CRI against the real containerd of the local cluster: Version and Status, image pulls
//! through the local registry (docker.io resolves to it), and a full sandbox round trip
//! that must leave nothing behind.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{NEEDS_CLUSTER, cri, state_dir, unique};
use rkubelet::cri::{Cri, RuntimeHealth, api};

/// The pod CIDR the tests hand to containerd (runtime-owned networking renders its CNI
/// template with the first one it is given).
const TEST_POD_CIDR: &str = "10.244.250.0/24";

async fn configure_network() {
    cri()
        .update_runtime_config(api::UpdateRuntimeConfigRequest {
            runtime_config: Some(api::RuntimeConfig {
                network_config: Some(api::NetworkConfig {
                    pod_cidr: TEST_POD_CIDR.into(),
                }),
            }),
        })
        .await
        .expect("UpdateRuntimeConfig");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn version_names_containerd_and_cri_v1() {
    let v = cri()
        .version(rkubelet::cri::version_request())
        .await
        .expect("Version");
    assert_eq!(v.runtime_name, "containerd");
    assert_eq!(v.runtime_api_version, "v1");
    assert!(
        v.runtime_version.starts_with("1.6") || v.runtime_version.starts_with("v1."),
        "{v:?}"
    );
    let _ = NEEDS_CLUSTER;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn status_is_runtime_and_network_ready_once_the_pod_cidr_is_known() {
    configure_network().await;
    // containerd notices the rendered CNI config asynchronously (it watches conf_dir).
    let mut health = None;
    for _ in 0..50 {
        let status = cri()
            .status(api::StatusRequest { verbose: false })
            .await
            .expect("Status");
        let h = RuntimeHealth::from(&status);
        if h.ready() {
            health = Some(h);
            break;
        }
        health = Some(h);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let health = health.expect("at least one Status");
    assert!(health.runtime.ready, "{}", health.runtime);
    assert!(health.network.ready, "{}", health.network);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn pulls_busybox_through_the_local_registry_mirror() {
    let client = cri();
    let image = "docker.io/library/busybox:latest";
    let spec = || {
        Some(api::ImageSpec {
            image: image.into(),
            ..Default::default()
        })
    };
    // Start from an image store without it, so the pull really goes to the registry.
    let present = client
        .image_status(api::ImageStatusRequest {
            image: spec(),
            verbose: false,
        })
        .await
        .expect("ImageStatus");
    if present.image.is_some() {
        client
            .remove_image(api::RemoveImageRequest { image: spec() })
            .await
            .expect("RemoveImage");
    }
    let pulled = client
        .pull_image(api::PullImageRequest {
            image: spec(),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect("PullImage");
    assert!(pulled.image_ref.starts_with("sha256:"), "{pulled:?}");
    let status = client
        .image_status(api::ImageStatusRequest {
            image: spec(),
            verbose: false,
        })
        .await
        .expect("ImageStatus")
        .image
        .expect("the image is present after the pull");
    assert_eq!(status.id, pulled.image_ref);
    assert!(
        status.repo_tags.iter().any(|t| t == image),
        "{:?}",
        status.repo_tags
    );
}

/// What a sandbox leaves on the host while it exists: the things that must all be gone
/// after `StopPodSandbox` + `RemovePodSandbox`.
#[derive(Debug, Default, PartialEq, Eq)]
struct HostTraces {
    /// Mount points whose path or source names the sandbox.
    mounts: BTreeSet<String>,
    /// Processes whose command line names the sandbox (its shim).
    processes: BTreeSet<String>,
    /// host-local reservation files that hold the sandbox id.
    ip_reservations: BTreeSet<PathBuf>,
}

fn files_below(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_below(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn traces(sandbox_id: &str) -> HostTraces {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mounts = mountinfo
        .lines()
        .filter(|l| l.contains(sandbox_id))
        .map(str::to_owned)
        .collect();
    let processes = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(sandbox_id))
        .collect();
    let mut files = Vec::new();
    for dir in [
        state_dir().join("cni"),
        PathBuf::from("/var/lib/cni/networks"),
    ] {
        files_below(&dir, &mut files);
    }
    let ip_reservations = files
        .into_iter()
        .filter(|f| std::fs::read_to_string(f).is_ok_and(|c| c.contains(sandbox_id)))
        .collect();
    HostTraces {
        mounts,
        processes,
        ip_reservations,
    }
}

/// The network namespace path of a sandbox, from containerd's verbose status.
fn netns_path(status: &api::PodSandboxStatusResponse) -> Option<String> {
    let info: serde_json::Value = serde_json::from_str(status.info.get("info")?).ok()?;
    info.pointer("/runtimeSpec/linux/namespaces")?
        .as_array()?
        .iter()
        .find(|ns| ns["type"] == "network")?
        .get("path")?
        .as_str()
        .map(str::to_owned)
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn sandbox_round_trip_leaves_nothing_behind() {
    configure_network().await;
    let client = cri();
    let name = unique("it-sandbox");
    let uid = unique("uid");
    let log_dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&log_dir).expect("log dir");
    let config = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.clone(),
        log_directory: log_dir.to_string_lossy().into_owned(),
        labels: [
            ("io.kubernetes.pod.name".to_owned(), name.clone()),
            (
                "io.kubernetes.pod.namespace".to_owned(),
                "default".to_owned(),
            ),
            ("io.kubernetes.pod.uid".to_owned(), uid.clone()),
        ]
        .into(),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Pod.into(),
                    pid: api::NamespaceMode::Pod.into(),
                    ipc: api::NamespaceMode::Pod.into(),
                    target_id: String::new(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = client
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .pod_sandbox_id;

    let status = client
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: true,
        })
        .await
        .expect("PodSandboxStatus");
    let sandbox = status.status.clone().expect("a sandbox status");
    assert_eq!(sandbox.state(), api::PodSandboxState::SandboxReady);
    assert_eq!(
        sandbox.metadata.as_ref().map(|m| m.uid.as_str()),
        Some(uid.as_str())
    );
    let ip: std::net::Ipv4Addr = sandbox
        .network
        .as_ref()
        .expect("a network status")
        .ip
        .parse()
        .expect("an IPv4 pod address");
    // containerd renders its CNI template from the first pod CIDR it is given, which may
    // be an earlier test's or agent's: the address is in the cluster's range.
    let cluster = u32::from(std::net::Ipv4Addr::new(10, 244, 0, 0));
    assert_eq!(
        u32::from(ip) & 0xffff_0000,
        cluster,
        "{ip} outside 10.244.0.0/16"
    );
    let netns = netns_path(&status).expect("the sandbox's netns path in verbose info");
    assert!(Path::new(&netns).exists(), "{netns}");
    let live = traces(&id);
    assert!(!live.mounts.is_empty(), "a running sandbox has mounts");
    assert!(!live.processes.is_empty(), "a running sandbox has a shim");
    assert_eq!(live.ip_reservations.len(), 1, "one IP reserved: {live:?}");

    client
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .expect("StopPodSandbox");
    let stopped = client
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus after stop")
        .status
        .expect("status");
    assert_eq!(stopped.state(), api::PodSandboxState::SandboxNotready);
    client
        .remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .expect("RemovePodSandbox");

    let gone = client
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await
        .expect_err("the sandbox is gone");
    assert!(gone.is_not_found(), "{gone}");
    let listed = client
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox");
    assert!(listed.items.iter().all(|s| s.id != id));
    assert!(!Path::new(&netns).exists(), "netns {netns} left behind");
    // The shim exits asynchronously after RemovePodSandbox returns.
    let mut left = traces(&id);
    for _ in 0..50 {
        if left == HostTraces::default() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        left = traces(&id);
    }
    assert_eq!(left, HostTraces::default(), "left behind by sandbox {id}");
    std::fs::remove_dir_all(&log_dir).expect("remove log dir");
}
