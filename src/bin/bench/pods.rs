//! The bench pods through the API server, shared by the scenarios that create pods
//! (`burst`, `deployment`, `probes`, `sources`): their common flags, the client, the
//! container every bench pod runs, and the timing of a run's start-up and deletion through
//! a watch (with the agent's own start-up breakdown from its timelines). It knows no
//! single scenario's pod spec or output fields, no CRI and no `/proc`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use rkubelet::timeline::{PodTimeline, Step};
use serde_json::{Value, json};

use crate::results::{run_id, seconds};

#[derive(Debug, clap::Args)]
pub struct ApiArgs {
    /// Admin kubeconfig.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The node the pods are for. A burst takes several (`--node a --node b`): `count`
    /// pods on each.
    #[arg(long, required = true)]
    pub node: Vec<String>,
    /// How many pods (on each node).
    #[arg(long, default_value_t = 100)]
    pub count: usize,
    /// The agent under test, for the report.
    #[arg(long)]
    pub agent: String,
    /// The container image (present on the node: pulls are not measured).
    #[arg(long, default_value = "127.0.0.1:5000/rkubelet/busybox:1.35")]
    pub image: String,
    /// How long to wait for all pods, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// The agent's `--root-dir`, for an rkubelet agent: its pods' start-up timelines
    /// (from its debug socket) give the start-up breakdown per step.
    #[arg(long)]
    pub agent_root_dir: Option<PathBuf>,
}

impl ApiArgs {
    /// The node of a scenario that runs on one.
    pub fn single_node(&self) -> anyhow::Result<&str> {
        match self.node.as_slice() {
            [node] => Ok(node),
            nodes => anyhow::bail!("this scenario runs on one node, not {nodes:?}"),
        }
    }
}

pub async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    Ok(rkubelet::app::kube_client(kubeconfig).await?)
}

/// The bench pods' container: exits at once on SIGTERM, so deletion measures the agents,
/// not a grace period.
pub fn container(image: &str) -> Value {
    json!({
        "name": "c",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    })
}

/// An exec probe running `true` in the container every second.
pub fn exec_probe() -> Value {
    json!({ "exec": { "command": ["true"] }, "periodSeconds": 1 })
}

fn is_ready(p: &Pod) -> bool {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn is_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Start-up and deletion of the pods labelled `bench=<run>`, timed through a watch that is
/// open before the first create. `create` makes them; it returns the create time of each
/// pod by name prefix (a Deployment's pods share the Deployment's create time). `hold`
/// runs once all are Ready, before `delete`: its result is `held`.
pub struct Timings {
    running: Vec<f64>,
    ready: Vec<f64>,
    all_ready: f64,
    all_gone: f64,
    pub held: Value,
    /// Wall-clock bounds of the start-up and of the deletion, for `report`'s breakdown.
    windows: Value,
    /// From the agent's timelines of the run's pods: each step's durations, and each
    /// pod's seen → Ready acknowledged (seconds).
    startup: Value,
}

pub async fn time_pods<F, Fut>(
    pods: Api<Pod>,
    run: &str,
    count: usize,
    timeout: Duration,
    create: F,
    hold: impl Future<Output = anyhow::Result<Value>>,
    delete: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Timings>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<Instant>>,
{
    let selector = format!("bench={run}");
    let stream = watcher::watcher(pods.clone(), watcher::Config::default().labels(&selector));
    let mut stream = std::pin::pin!(stream);
    // The watch is established (its initial list is done) before anything is created.
    while let Some(event) = stream.try_next().await? {
        if matches!(event, Event::InitDone) {
            break;
        }
    }
    let created_at = Timestamp::now();
    let started = create().await?;
    let mut running: HashMap<String, f64> = HashMap::new();
    let mut ready: HashMap<String, f64> = HashMap::new();
    let deadline = started + timeout;
    while ready.len() < count {
        let event = tokio::time::timeout_at(deadline.into(), stream.try_next())
            .await
            .with_context(|| {
                format!("{} of {count} pods ready after {timeout:?}", ready.len())
            })??;
        let Some(Event::Apply(pod) | Event::InitApply(pod)) = event else {
            continue;
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        let at = seconds(started.elapsed());
        if is_running(&pod) {
            running.entry(name.clone()).or_insert(at);
        }
        if is_ready(&pod) {
            ready.entry(name).or_insert(at);
        }
    }
    let all_ready = seconds(started.elapsed());
    let ready_at = Timestamp::now();
    let held = hold.await?;
    let held_at = Timestamp::now();
    let deleting = Instant::now();
    delete.await?;
    let mut gone = 0;
    while gone < count {
        let event = tokio::time::timeout_at((deleting + timeout).into(), stream.try_next())
            .await
            .with_context(|| format!("{gone} of {count} pods gone after {timeout:?}"))??;
        if let Some(Event::Delete(_)) = event {
            gone += 1;
        }
    }
    Ok(Timings {
        running: running.into_values().collect(),
        ready: ready.into_values().collect(),
        all_ready,
        all_gone: seconds(deleting.elapsed()),
        held,
        windows: json!({
            "start-up": [created_at.to_string(), ready_at.to_string()],
            "deletion": [held_at.to_string(), Timestamp::now().to_string()],
        }),
        startup: Value::Null,
    })
}

/// The step a timeline step stands for across pods: its name, with the RPC, plugin,
/// command or probe kind (not the ids and names that differ from pod to pod).
fn timeline_step(step: &Step) -> String {
    ["rpc", "plugin", "command", "kind", "phase"]
        .iter()
        .filter_map(|k| step.fields.get(*k))
        .fold(step.name.clone(), |name, v| format!("{name} {v}"))
}

/// The start-up breakdown of the run's pods (named `<run>-…`) from the agent's timelines.
fn startup_breakdown(timelines: &[PodTimeline], run: &str) -> Value {
    let prefix = format!("{run}-");
    let mine: Vec<&PodTimeline> = timelines
        .iter()
        .filter(|t| t.namespace == "default" && t.name.starts_with(&prefix))
        .collect();
    let mut steps: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for step in mine.iter().flat_map(|t| &t.steps) {
        steps
            .entry(timeline_step(step))
            .or_default()
            .push(step.duration_ms / 1000.0);
    }
    let ready: Vec<f64> = mine
        .iter()
        .filter_map(|t| t.ready_ms)
        .map(|ms| ms / 1000.0)
        .collect();
    json!({ "pods": mine.len(), "steps": steps, "seen_to_ready": ready })
}

pub fn timings_json(kind: &str, args: &ApiArgs, t: &Timings) -> Value {
    json!({
        "kind": kind, "agent": args.agent, "count": args.count, "nodes": args.node,
        "running": t.running, "ready": t.ready,
        "all_ready": t.all_ready, "all_gone": t.all_gone, "windows": t.windows,
        "startup": t.startup,
    })
}

/// N pods bound to each node at once (pod `i` to node `i % nodes`), pod `i` with the spec
/// `spec(i)`; `hold` runs once all are Ready (see [`time_pods`]).
pub async fn bound_pods(
    args: &ApiArgs,
    spec: impl Fn(usize) -> Value,
    hold: impl Future<Output = anyhow::Result<Value>>,
) -> anyhow::Result<Timings> {
    let client = client(&args.kubeconfig).await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let run = run_id();
    let count = args.count * args.node.len();
    let create = || async {
        let started = Instant::now();
        let bodies = (0..count).map(|i| {
            let mut spec = spec(i);
            spec["nodeName"] = json!(args.node[i % args.node.len()]);
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": format!("{run}-{i}"), "labels": { "bench": run } },
                "spec": spec
            }))
            .expect("a valid pod");
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &pod).await }
        });
        // "At once": every create is in flight together (the API server's own limits apply).
        let results: Vec<_> = futures::stream::iter(bodies)
            .buffer_unordered(count.max(1))
            .collect()
            .await;
        for r in results {
            r?;
        }
        Ok(started)
    };
    let delete = async {
        pods.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("bench={run}")),
        )
        .await?;
        Ok(())
    };
    // Once all are Ready, and before they go (the agent keeps only a few gone pods'
    // timelines), the agent's timelines of the run's pods.
    let mut startup = Value::Null;
    let hold = async {
        let held = hold.await?;
        if let Some(root) = &args.agent_root_dir {
            let timelines: Vec<PodTimeline> =
                rkubelet::inspect::ask_agent(root, "/debug/timeline").await?;
            startup = startup_breakdown(&timelines, &run);
        }
        Ok(held)
    };
    let mut timings = time_pods(
        pods.clone(),
        &run,
        count,
        Duration::from_secs(args.timeout),
        create,
        hold,
        delete,
    )
    .await?;
    timings.startup = startup;
    Ok(timings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_up_breakdown_pools_the_runs_pods_steps_without_their_ids() {
        let step = |name: &str, fields: &[(&str, &str)], ms: f64| Step {
            name: name.into(),
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            start_ms: 0.0,
            duration_ms: ms,
            depth: 0,
        };
        let timeline = |name: &str, ready: Option<f64>| PodTimeline {
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            name: name.into(),
            seen: String::new(),
            steps: vec![
                step("cri", &[("rpc", "RunPodSandbox")], 500.0),
                step("cni_add", &[("container_id", name)], 100.0),
                step("start_container", &[("container", "c")], 250.0),
            ],
            ready_ms: ready,
            dropped_steps: 0,
        };
        let all = [
            timeline("b1-0", Some(900.0)),
            timeline("b1-1", Some(1100.0)),
            timeline("b0-0", Some(5.0)),
        ];
        let b = startup_breakdown(&all, "b1");
        assert_eq!(b["pods"], 2);
        assert_eq!(b["steps"]["cri RunPodSandbox"], json!([0.5, 0.5]));
        assert_eq!(b["steps"]["cni_add"], json!([0.1, 0.1]));
        assert_eq!(b["steps"]["start_container"], json!([0.25, 0.25]));
        assert_eq!(b["seen_to_ready"], json!([0.9, 1.1]));
    }
}
