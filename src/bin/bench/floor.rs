//! The `floor` scenario: N sandboxes with one container each set up and torn down
//! straight over CRI, no agent and no API server — the physical limit the agents are
//! compared with — and the machine's busy CPU time until all are up. It uses the `/proc`
//! and result helpers and knows no API server and no other scenario.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rkubelet::cri::{Cri, CriClient, api};
use serde_json::{Value, json};

use crate::procfs::MachineCpu;
use crate::results::{merge_into, run_id, seconds};

#[derive(Debug, clap::Args)]
pub struct FloorArgs {
    /// The CRI endpoint; given several times (one node's runtime each), every runtime
    /// sets up its sandboxes at the same time, as the nodes of a multi-node burst start
    /// their pods at once.
    #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
    endpoint: Vec<String>,
    /// How many sandboxes, on each endpoint.
    #[arg(long)]
    count: usize,
    /// How many sandboxes each endpoint sets up at once.
    #[arg(long)]
    concurrency: usize,
    /// The container image (present in the runtime).
    #[arg(long, default_value = "127.0.0.1:5000/rkubelet/busybox:1.35")]
    image: String,
    /// Where sandbox logs go.
    #[arg(long, default_value = "/tmp/rkubelet-bench-floor")]
    log_dir: PathBuf,
    /// The sandboxes' cgroup parent: none (the runtime's default) on a runtime with the
    /// cgroupfs driver; a slice (`system.slice`) on one whose runc uses systemd, which
    /// refuses a sandbox without.
    #[arg(long, default_value = "")]
    cgroup_parent: String,
    /// The floor's name in the report, when not the default (`CRI floor`,
    /// `CRI floor, N nodes`): e.g. the floor inside a kind-style node.
    #[arg(long)]
    agent: Option<String>,
}

fn floor_sandbox(
    i: usize,
    run: &str,
    log_dir: &Path,
    cgroup_parent: &str,
) -> api::PodSandboxConfig {
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
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_owned(),
            ..Default::default()
        }),
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

/// One runtime's sandboxes up (`concurrency` at a time), each one's seconds counted from
/// `started`; then, once `all_up` says every runtime's are, torn down. Returns the
/// seconds of each sandbox, and the teardown's wall time.
async fn floor_on(
    cri: CriClient,
    args: &FloorArgs,
    log_dir: PathBuf,
    started: Instant,
    all_up: &tokio::sync::Barrier,
) -> anyhow::Result<(Vec<f64>, f64)> {
    let run = run_id();
    // Each pod's time counts from the start of the batch, as a burst's pods count from
    // their create: a sandbox that waits for its turn waits as a pod waits for the agent.
    let ups = (0..args.count).map(|i| {
        let cri = &cri;
        let config = floor_sandbox(i, &run, &log_dir, &args.cgroup_parent);
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
    // The teardown starts when every runtime's sandboxes are up, failed or not.
    all_up.wait().await;
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
    let _ = std::fs::remove_dir_all(&log_dir);
    Ok((each, seconds(tearing.elapsed())))
}

pub async fn floor(args: FloorArgs) -> anyhow::Result<Value> {
    let nodes = args.endpoint.len();
    // Every runtime's run, and the machine's busy time sampled once all are up.
    let all_up = tokio::sync::Barrier::new(nodes + 1);
    let machine = MachineCpu::start()?;
    let started = Instant::now();
    let mut runs = Vec::new();
    for (i, endpoint) in args.endpoint.iter().enumerate() {
        let cri = CriClient::new(endpoint.parse()?, Duration::from_secs(120), None);
        let log_dir = args.log_dir.join(i.to_string());
        runs.push(floor_on(cri, &args, log_dir, started, &all_up));
    }
    let busy = async {
        all_up.wait().await;
        machine.since_start()
    };
    let (runs, busy) = futures::join!(futures::future::join_all(runs), busy);
    let mut each = Vec::new();
    let mut all_gone: f64 = 0.0;
    for r in runs {
        let (ready, gone) = r?;
        each.extend(ready);
        all_gone = all_gone.max(gone);
    }
    let _ = std::fs::remove_dir_all(&args.log_dir);
    let all_ready = each.iter().copied().fold(0.0, f64::max);
    let agent = args.agent.clone().unwrap_or_else(|| floor_agent(nodes));
    let mut result = json!({
        "kind": "floor", "agent": agent, "count": args.count, "nodes": nodes,
        "concurrency": args.concurrency, "ready": each, "all_ready": all_ready, "all_gone": all_gone,
    });
    merge_into(&mut result, &busy?);
    Ok(result)
}

/// The floor's name in the report: `CRI floor`, or `CRI floor, 3 nodes` when that many
/// runtimes ran it at once.
fn floor_agent(nodes: usize) -> String {
    if nodes > 1 {
        format!("CRI floor, {nodes} nodes")
    } else {
        "CRI floor".to_owned()
    }
}
