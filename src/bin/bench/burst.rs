//! The `burst` scenario: N pods bound to the node (to each node) at once, and with
//! `--pid`, each node agent's CPU seconds and resident memory meanwhile (`AgentUsage`);
//! until all are Ready, the machine's busy CPU time and, with `--control-plane-pid`, the
//! control plane's share of it. It uses the shared pod, `/proc` and result helpers and
//! knows no other scenario.

use std::time::Duration;

use rkubelet::lock::lock;
use serde_json::{Value, json};

use crate::pods::{ApiArgs, bound_pods, container, timings_json};
use crate::procfs::{MachineCpu, ProcessesCpu, hundredths, sample};
use crate::results::merge_into;

#[derive(Debug, clap::Args)]
pub struct BurstArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The node agents' processes (one per `--node`, in the same order): their CPU
    /// seconds and resident memory from the first create until all pods are gone.
    #[arg(long)]
    pid: Vec<u32>,
    /// The control plane's processes (API server, etcd, scheduler, controller manager):
    /// their CPU seconds until all pods are Ready, the share of the machine's busy time
    /// that the CRI floor does not have.
    #[arg(long)]
    control_plane_pid: Vec<u32>,
}

pub async fn burst(args: BurstArgs) -> anyhow::Result<Value> {
    let BurstArgs {
        api,
        pid,
        control_plane_pid,
    } = args;
    if !pid.is_empty() && pid.len() != api.node.len() {
        anyhow::bail!("one --pid per --node: {pid:?} for {:?}", api.node);
    }
    let usage = AgentUsage::start(&pid)?;
    let machine = MachineCpu::start()?;
    let control_plane = ProcessesCpu::start(&control_plane_pid)?;
    // The start-up's share: the agents' CPU seconds once all pods are Ready, the machine's
    // busy time and the control plane's.
    let hold = async {
        let mut machine = machine.since_start()?;
        let agents = usage.cpu.seconds()?;
        if !agents.is_empty() {
            machine["agents_busy_seconds"] = json!(hundredths(agents.iter().sum()));
        }
        if !control_plane_pid.is_empty() {
            let cpu: f64 = control_plane.seconds()?.iter().sum();
            machine["control_plane_busy_seconds"] = json!(hundredths(cpu));
        }
        Ok(json!({ "machine": machine, "agents": agents }))
    };
    let t = bound_pods(
        &api,
        |_| json!({ "containers": [container(&api.image)] }),
        hold,
    )
    .await?;
    let kind = if api.node.len() > 1 { "nodes" } else { "burst" };
    let mut result = timings_json(kind, &api, &t);
    merge_into(&mut result, &t.held["machine"]);
    if !pid.is_empty() {
        merge_into(&mut result, &usage.finish(&api.node, &t.held["agents"])?);
    }
    Ok(result)
}

/// The CPU seconds and resident memory of some processes (the node agents) from `start`
/// on, their memory sampled every 250 ms by a background task.
struct AgentUsage {
    cpu: ProcessesCpu,
    /// Per process: the largest and the sum of the resident sizes sampled (kB), and how
    /// many samples.
    rss: std::sync::Arc<std::sync::Mutex<Vec<(u64, u64, u64)>>>,
    sampler: tokio::task::JoinHandle<()>,
}

impl AgentUsage {
    fn start(pids: &[u32]) -> anyhow::Result<Self> {
        let cpu = ProcessesCpu::start(pids)?;
        let rss = std::sync::Arc::new(std::sync::Mutex::new(vec![(0, 0, 0); pids.len()]));
        let sampler = tokio::spawn({
            let (pids, rss) = (pids.to_vec(), rss.clone());
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(250));
                loop {
                    tick.tick().await;
                    let now: Vec<Option<u64>> = pids
                        .iter()
                        .map(|pid| sample(*pid).ok().map(|s| s.0))
                        .collect();
                    let mut rss = lock(&rss);
                    for (agg, kb) in rss.iter_mut().zip(now) {
                        if let Some(kb) = kb {
                            *agg = (agg.0.max(kb), agg.1 + kb, agg.2 + 1);
                        }
                    }
                }
            }
        });
        Ok(Self { cpu, rss, sampler })
    }

    /// Per node (`nodes[i]` runs `pids[i]`): CPU seconds until all pods were Ready
    /// (`startup`, from `cpu`) and until now, resident memory max and mean
    /// (MB); and their sums (CPU), max and mean (memory) over the nodes.
    fn finish(self, nodes: &[String], startup: &Value) -> anyhow::Result<Value> {
        let cpu = self.cpu.seconds()?;
        self.sampler.abort();
        let rss = lock(&self.rss).clone();
        let agents: Vec<Value> = nodes
            .iter()
            .zip(cpu)
            .zip(rss)
            .enumerate()
            .map(|(i, ((node, cpu), (max, sum, n)))| {
                json!({
                    "node": node, "cpu_startup_seconds": startup[i], "cpu_seconds": cpu,
                    "rss_max_mb": max / 1024, "rss_mean_mb": sum / n.max(1) / 1024,
                })
            })
            .collect();
        let of =
            |key: &str| -> Vec<f64> { agents.iter().filter_map(|a| a[key].as_f64()).collect() };
        let rss_means = of("rss_mean_mb");
        #[allow(clippy::cast_precision_loss)]
        let rss_mean = rss_means.iter().sum::<f64>() / rss_means.len().max(1) as f64;
        Ok(json!({
            "cpu_startup_seconds": hundredths(of("cpu_startup_seconds").iter().sum()),
            "cpu_seconds": hundredths(of("cpu_seconds").iter().sum()),
            "rss_max_mb": of("rss_max_mb").into_iter().reduce(f64::max),
            "rss_mean_mb": hundredths(rss_mean),
            "agents": agents,
        }))
    }
}
