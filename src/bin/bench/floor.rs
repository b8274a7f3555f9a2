//! The `floor` scenario: N sandboxes with one container each set up and torn down
//! straight over CRI, no agent and no API server — the physical limit the agents are
//! compared with. It knows no API server, no `/proc` and no other scenario.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rkubelet::cri::{Cri, CriClient, api};
use serde_json::{Value, json};

use crate::results::{run_id, seconds};

#[derive(Debug, clap::Args)]
pub struct FloorArgs {
    /// The CRI endpoint.
    #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
    endpoint: String,
    /// How many sandboxes.
    #[arg(long)]
    count: usize,
    /// How many sandboxes are set up at once.
    #[arg(long)]
    concurrency: usize,
    /// The container image (present in the runtime).
    #[arg(long, default_value = "127.0.0.1:5000/rkubelet/busybox:1.35")]
    image: String,
    /// Where sandbox logs go.
    #[arg(long, default_value = "/tmp/rkubelet-bench-floor")]
    log_dir: PathBuf,
}

fn floor_sandbox(i: usize, run: &str, log_dir: &Path) -> api::PodSandboxConfig {
    let name = format!("{run}-{i}");
    let uid = format!("{run}-uid-{i}");
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: "bench".into(),
            attempt: 0,
        }),
        hostname: name.clone(),
        log_directory: log_dir.join(&name).to_string_lossy().into_owned(),
        labels: [("bench".to_owned(), run.to_owned())].into(),
        linux: Some(api::LinuxPodSandboxConfig::default()),
        ..Default::default()
    }
}

/// One sandbox and its container, up and running; returns the sandbox id.
async fn floor_up(
    cri: &CriClient,
    config: api::PodSandboxConfig,
    image: &str,
) -> anyhow::Result<String> {
    std::fs::create_dir_all(&config.log_directory)?;
    let sandbox = cri
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .pod_sandbox_id;
    let container = cri
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "c".into(),
                    attempt: 0,
                }),
                image: Some(api::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    "trap 'exit 0' TERM; sleep 3600 & wait".into(),
                ],
                log_path: "c.log".into(),
                linux: Some(api::LinuxContainerConfig::default()),
                ..Default::default()
            }),
            sandbox_config: Some(config),
        })
        .await?
        .container_id;
    cri.start_container(api::StartContainerRequest {
        container_id: container,
    })
    .await?;
    Ok(sandbox)
}

/// Stops the sandbox's containers (with a grace period, as an agent does) and removes it.
async fn floor_down(cri: &CriClient, sandbox: String) -> anyhow::Result<()> {
    let containers = cri
        .list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                pod_sandbox_id: sandbox.clone(),
                ..Default::default()
            }),
        })
        .await?
        .containers;
    for c in containers {
        cri.stop_container(api::StopContainerRequest {
            container_id: c.id,
            timeout: 30,
        })
        .await?;
    }
    cri.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: sandbox.clone(),
    })
    .await?;
    cri.remove_pod_sandbox(api::RemovePodSandboxRequest {
        pod_sandbox_id: sandbox,
    })
    .await?;
    Ok(())
}

pub async fn floor(args: FloorArgs) -> anyhow::Result<Value> {
    let endpoint = args.endpoint.parse()?;
    let cri = CriClient::new(endpoint, Duration::from_secs(120), None);
    let run = run_id();
    let started = Instant::now();
    // Each pod's time counts from the start of the batch, as a burst's pods count from
    // their create: a sandbox that waits for its turn waits as a pod waits for the agent.
    let ups = (0..args.count).map(|i| {
        let cri = &cri;
        let config = floor_sandbox(i, &run, &args.log_dir);
        let image = args.image.as_str();
        async move {
            floor_up(cri, config, image)
                .await
                .map(|id| (id, seconds(started.elapsed())))
        }
    });
    let results: Vec<_> = futures::stream::iter(ups)
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let up_wall = seconds(started.elapsed());
    let mut sandboxes = Vec::new();
    let mut each = Vec::new();
    for r in results {
        let (id, secs) = r?;
        sandboxes.push(id);
        each.push(secs);
    }
    let tearing = Instant::now();
    let downs = sandboxes.into_iter().map(|id| floor_down(&cri, id));
    let results: Vec<_> = futures::stream::iter(downs)
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    for r in results {
        r?;
    }
    let _ = std::fs::remove_dir_all(&args.log_dir);
    Ok(json!({
        "kind": "floor", "agent": "CRI floor", "count": args.count, "concurrency": args.concurrency,
        "ready": each, "all_ready": up_wall, "all_gone": seconds(tearing.elapsed()),
    }))
}
