//! `bench`: the measurements behind `scripts/bench.sh`, which runs rkubelet and the
//! real kubelet one after the other on the same node set-up. Each subcommand measures one
//! thing and prints one JSON object; `report` turns a directory of them into a Markdown
//! table and gnuplot data. It is a benchmark, not a test: it asserts nothing.
//!
//! - `burst`: N pods created at once, bound to the node; create → Running and create → Ready
//!   per pod as seen through a watch, then the time until all are deleted and gone. With
//!   several nodes, N pods on each, all at once, and each node agent's CPU seconds and
//!   resident memory meanwhile.
//! - `deployment`: the same through a Deployment, the scheduler and the controllers.
//! - `floor`: sandbox + network + create + start straight over CRI, no agent, no API server,
//!   and the teardown likewise — the physical limit the agents are compared with.
//! - `footprint`: resident memory and CPU seconds of a process over a window.
//! - `probes`: N pods bound to the node, each with a readiness and a liveness probe every
//!   second (exec, httpGet and tcpSocket, evenly spread), timed until all are Ready; then
//!   the agent's footprint over a window while the probes run, then deletion.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use rkubelet::cri::{Cri, CriClient, api};
use rkubelet::timeline::{PodTimeline, Step};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(name = "rkubelet-bench", about = "Measurements for scripts/bench.sh")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N pods bound to the node (to each node) at once: start-up latencies, then deletion.
    Burst(BurstArgs),
    /// A Deployment of N replicas through the scheduler: start-up latencies, then deletion.
    Deployment(ApiArgs),
    /// The CRI floor: N sandboxes with one container each, straight over CRI.
    Floor(FloorArgs),
    /// Resident memory and CPU seconds of a process over a window.
    Footprint(FootprintArgs),
    /// N pods with probes every second: start-up, the agent's footprint while they run,
    /// then deletion.
    Probes(ProbesArgs),
    /// N pods using one Secret and one ConfigMap in env and volumes: start-up, deletion,
    /// and the agent's reads of them from the API server's audit log.
    Sources(SourcesArgs),
    /// Waits until the machine's CPUs are quiet again after a scenario.
    Settle(SettleArgs),
    /// A Markdown table and plot data from a directory of results.
    Report(ReportArgs),
}

#[derive(Debug, clap::Args)]
struct ApiArgs {
    /// Admin kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The node the pods are for. A burst takes several (`--node a --node b`): `count`
    /// pods on each.
    #[arg(long, required = true)]
    node: Vec<String>,
    /// How many pods (on each node).
    #[arg(long, default_value_t = 100)]
    count: usize,
    /// The agent under test, for the report.
    #[arg(long)]
    agent: String,
    /// The container image (present on the node: pulls are not measured).
    #[arg(long, default_value = "127.0.0.1:5000/rkubelet/busybox:1.35")]
    image: String,
    /// How long to wait for all pods, in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// The agent's `--root-dir`, for an rkubelet agent: its pods' start-up timelines
    /// (from its debug socket) give the start-up breakdown per step.
    #[arg(long)]
    agent_root_dir: Option<PathBuf>,
}

impl ApiArgs {
    /// The node of a scenario that runs on one.
    fn single_node(&self) -> anyhow::Result<&str> {
        match self.node.as_slice() {
            [node] => Ok(node),
            nodes => anyhow::bail!("this scenario runs on one node, not {nodes:?}"),
        }
    }
}

#[derive(Debug, clap::Args)]
struct BurstArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The node agents' processes (one per `--node`, in the same order): their CPU
    /// seconds and resident memory from the first create until all pods are gone.
    #[arg(long)]
    pid: Vec<u32>,
}

#[derive(Debug, clap::Args)]
struct FloorArgs {
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

#[derive(Debug, clap::Args)]
struct FootprintArgs {
    /// The process.
    #[arg(long)]
    pid: u32,
    /// The window, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The agent, for the report.
    #[arg(long)]
    agent: String,
    /// What the agent was doing (`idle`, `100 pods`).
    #[arg(long)]
    state: String,
}

#[derive(Debug, clap::Args)]
struct ProbesArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The agent's process, measured while the probes run.
    #[arg(long)]
    pid: u32,
    /// The window, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
}

#[derive(Debug, clap::Args)]
struct SourcesArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The API server's audit log.
    #[arg(long)]
    audit_log: PathBuf,
}

#[derive(Debug, clap::Args)]
struct SettleArgs {
    /// Quiet means at most this share of all CPU time busy over one second.
    #[arg(long, default_value_t = 0.25)]
    busy: f64,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
}

#[derive(Debug, clap::Args)]
struct ReportArgs {
    /// The directory of `*.json` results; the report is written there.
    dir: PathBuf,
    /// A line on the machine and date, for the table's heading.
    #[arg(long, default_value = "")]
    machine: String,
}

fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

fn print(v: &Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}")?;
    Ok(())
}

async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    Ok(rkubelet::app::kube_client(kubeconfig).await?)
}

/// The bench pods' container: exits at once on SIGTERM, so deletion measures the agents,
/// not a grace period.
fn container(image: &str) -> Value {
    json!({
        "name": "c",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    })
}

/// The port the probed pods' HTTP server listens on; the tcp probes connect to it too.
const PROBED_PORT: u16 = 8080;

/// A probe every second, of kind `kind % 3`: exec, httpGet or tcpSocket. The kinds
/// rotate so that pods with consecutive indices use each kind once.
fn probe(kind: usize) -> Value {
    let mut probe = match kind % 3 {
        0 => json!({ "exec": { "command": ["true"] } }),
        1 => json!({ "httpGet": { "path": "/hostname", "port": PROBED_PORT } }),
        _ => json!({ "tcpSocket": { "port": PROBED_PORT } }),
    };
    probe["periodSeconds"] = json!(1);
    probe
}

/// The probes scenario's container: an HTTP server (serving `/etc`, so `/hostname`
/// answers 200), with pod `i`'s readiness probe of kind `i` and liveness probe of kind
/// `i + 1`. Like [`container`], it exits at once on SIGTERM.
fn probed_container(image: &str, i: usize) -> Value {
    let mut c = container(image);
    c["command"] = json!([
        "sh",
        "-c",
        format!("trap 'exit 0' TERM; httpd -f -p {PROBED_PORT} -h /etc & wait")
    ]);
    c["ports"] = json!([{ "containerPort": PROBED_PORT }]);
    c["readinessProbe"] = probe(i);
    c["livenessProbe"] = probe(i + 1);
    c
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
struct Timings {
    running: Vec<f64>,
    ready: Vec<f64>,
    all_ready: f64,
    all_gone: f64,
    held: Value,
    /// Wall-clock bounds of the start-up and of the deletion, for `report`'s breakdown.
    windows: Value,
    /// From the agent's timelines of the run's pods: each step's durations, and each
    /// pod's seen → Ready acknowledged (seconds).
    startup: Value,
}

async fn time_pods<F, Fut>(
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

fn timings_json(kind: &str, args: &ApiArgs, t: &Timings) -> Value {
    json!({
        "kind": kind, "agent": args.agent, "count": args.count, "nodes": args.node,
        "running": t.running, "ready": t.ready,
        "all_ready": t.all_ready, "all_gone": t.all_gone, "windows": t.windows,
        "startup": t.startup,
    })
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("b{:x}", nanos % 0xffff_ffff)
}

/// N pods bound to each node at once (pod `i` to node `i % nodes`), pod `i` with the spec
/// `spec(i)`; `hold` runs once all are Ready (see [`time_pods`]).
async fn bound_pods(
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

async fn burst(args: BurstArgs) -> anyhow::Result<Value> {
    let BurstArgs { api, pid } = args;
    if !pid.is_empty() && pid.len() != api.node.len() {
        anyhow::bail!("one --pid per --node: {pid:?} for {:?}", api.node);
    }
    let usage = AgentUsage::start(&pid)?;
    // The start-up's share: the agents' CPU seconds once all pods are Ready.
    let hold = async { Ok(json!(usage.cpu_seconds()?)) };
    let t = bound_pods(
        &api,
        |_| json!({ "containers": [container(&api.image)] }),
        hold,
    )
    .await?;
    let kind = if api.node.len() > 1 { "nodes" } else { "burst" };
    let mut result = timings_json(kind, &api, &t);
    if !pid.is_empty() {
        merge_into(&mut result, &usage.finish(&api.node, &t.held)?);
    }
    Ok(result)
}

/// The CPU seconds and resident memory of some processes (the node agents) from `start`
/// on, their memory sampled every 250 ms by a background task.
struct AgentUsage {
    pids: Vec<u32>,
    cpu_from: Vec<f64>,
    /// Per process: the largest and the sum of the resident sizes sampled (kB), and how
    /// many samples.
    rss: std::sync::Arc<std::sync::Mutex<Vec<(u64, u64, u64)>>>,
    sampler: tokio::task::JoinHandle<()>,
}

impl AgentUsage {
    fn start(pids: &[u32]) -> anyhow::Result<Self> {
        let cpu_from = pids
            .iter()
            .map(|pid| Ok(sample(*pid)?.1))
            .collect::<anyhow::Result<Vec<f64>>>()?;
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
                    let mut rss = rss
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    for (agg, kb) in rss.iter_mut().zip(now) {
                        if let Some(kb) = kb {
                            *agg = (agg.0.max(kb), agg.1 + kb, agg.2 + 1);
                        }
                    }
                }
            }
        });
        Ok(Self {
            pids: pids.to_vec(),
            cpu_from,
            rss,
            sampler,
        })
    }

    /// Each process's CPU seconds since `start`, in hundredths.
    fn cpu_seconds(&self) -> anyhow::Result<Vec<f64>> {
        self.pids
            .iter()
            .zip(&self.cpu_from)
            .map(|(pid, from)| Ok(((sample(*pid)?.1 - from) * 100.0).round() / 100.0))
            .collect()
    }

    /// Per node (`nodes[i]` runs `pids[i]`): CPU seconds until all pods were Ready
    /// (`startup`, from [`Self::cpu_seconds`]) and until now, resident memory max and mean
    /// (MB); and their sums (CPU), max and mean (memory) over the nodes.
    fn finish(self, nodes: &[String], startup: &Value) -> anyhow::Result<Value> {
        let cpu = self.cpu_seconds()?;
        self.sampler.abort();
        let rss = self
            .rss
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
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
        let hundredths = |x: f64| (x * 100.0).round() / 100.0;
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

/// The sources scenario: N pods that all use one Secret and one ConfigMap, in their
/// environment (`secretKeyRef`, `configMapKeyRef`, `envFrom`) and as volumes; timed like a
/// burst, and the agent's reads of Secrets and ConfigMaps counted from the API server's
/// audit log, from the first create until all pods are gone.
async fn sources(args: SourcesArgs) -> anyhow::Result<Value> {
    let SourcesArgs { api, audit_log } = args;
    let client = client(&api.kubeconfig).await?;
    let name = format!("{}-src", run_id());
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "default");
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client, "default");
    let pp = PostParams::default();
    secrets
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": name }, "stringData": { "password": "p", "user": "u" }
            }))?,
        )
        .await?;
    config_maps
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": name }, "data": { "color": "blue", "size": "L" }
            }))?,
        )
        .await?;
    let spec = |_| {
        let mut c = container(&api.image);
        c["env"] = json!([
            { "name": "PASSWORD", "valueFrom": { "secretKeyRef": { "name": name, "key": "password" } } },
            { "name": "COLOR", "valueFrom": { "configMapKeyRef": { "name": name, "key": "color" } } },
        ]);
        c["envFrom"] = json!([{ "configMapRef": { "name": name } }]);
        c["volumeMounts"] = json!([
            { "name": "secret", "mountPath": "/secret" },
            { "name": "config", "mountPath": "/config" },
        ]);
        json!({
            "containers": [c],
            "volumes": [
                { "name": "secret", "secret": { "secretName": name } },
                { "name": "config", "configMap": { "name": name } },
            ],
        })
    };
    let from = Timestamp::now();
    let hold = std::future::ready(Ok(Value::Null));
    let t = bound_pods(&api, spec, hold).await?;
    let reads = audited_reads(
        &audit_log,
        &format!("system:node:{}", api.single_node()?),
        from,
    )?;
    secrets.delete(&name, &DeleteParams::default()).await?;
    config_maps.delete(&name, &DeleteParams::default()).await?;
    let mut result = timings_json("sources", &api, &t);
    #[allow(clippy::cast_precision_loss)]
    let per_pod = reads.values().sum::<u64>() as f64 / api.count.max(1) as f64;
    result["reads"] = json!(reads);
    result["reads_per_pod"] = json!((per_pod * 100.0).round() / 100.0);
    Ok(result)
}

/// The reads of Secrets and ConfigMaps by `user` since `from` in the API server's audit
/// log (one line per request, see scripts/cluster.sh), by `<verb> <resource>`.
fn audited_reads(log: &Path, user: &str, from: Timestamp) -> anyhow::Result<BTreeMap<String, u64>> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let mut reads = BTreeMap::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let at = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok());
        if event["user"]["username"] != user || at.is_none_or(|at| at < from) {
            continue;
        }
        let key = format!(
            "{} {}",
            event["verb"].as_str().unwrap_or_default(),
            event["objectRef"]["resource"].as_str().unwrap_or_default()
        );
        *reads.entry(key).or_default() += 1;
    }
    Ok(reads)
}

/// The probes scenario: the start-up and deletion timings of the pods with probes, and
/// the agent's footprint while their probes run.
async fn probes(args: ProbesArgs) -> anyhow::Result<Value> {
    let ProbesArgs { api, pid, seconds } = args;
    let hold = footprint_over(pid, seconds);
    let spec = |i| json!({ "containers": [probed_container(&api.image, i)] });
    let t = bound_pods(&api, spec, hold).await?;
    let mut result = timings_json("probes", &api, &t);
    result["period_seconds"] = json!(1);
    merge_into(&mut result, &t.held);
    Ok(result)
}

/// Copies the fields of the object `from` into the object `into`.
fn merge_into(into: &mut Value, from: &Value) {
    if let (Some(into), Some(from)) = (into.as_object_mut(), from.as_object()) {
        into.extend(from.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}

async fn deployment(args: ApiArgs) -> anyhow::Result<Value> {
    let node = args.single_node()?;
    let client = client(&args.kubeconfig).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client, "default");
    let run = run_id();
    let create = || async {
        let d: Deployment = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": run },
            "spec": {
                "replicas": args.count,
                "selector": { "matchLabels": { "bench": run } },
                "template": {
                    "metadata": { "labels": { "bench": run } },
                    "spec": {
                        "nodeSelector": { "kubernetes.io/hostname": node },
                        "containers": [container(&args.image)]
                    }
                }
            }
        }))?;
        let started = Instant::now();
        deployments.create(&PostParams::default(), &d).await?;
        Ok(started)
    };
    let delete = async {
        deployments
            .delete(&run, &DeleteParams::foreground())
            .await?;
        Ok(())
    };
    let t = time_pods(
        pods,
        &run,
        args.count,
        Duration::from_secs(args.timeout),
        create,
        std::future::ready(Ok(Value::Null)),
        delete,
    )
    .await?;
    Ok(timings_json("deployment", &args, &t))
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

async fn floor(args: FloorArgs) -> anyhow::Result<Value> {
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

/// Resident set size (kB) and CPU seconds (user + system) of a process.
fn sample(pid: u32) -> anyhow::Result<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11)
        .zip(fields.get(12))
        .and_then(|(u, s)| Some(u.parse::<u64>().ok()? + s.parse::<u64>().ok()?))
        .context("utime/stime")?;
    // The kernel's USER_HZ is 100 on Linux.
    #[allow(clippy::cast_precision_loss)]
    Ok((rss, ticks as f64 / 100.0))
}

/// Resident memory (max and mean, in whole MB rounded down) and CPU seconds (user +
/// system) of a process over a window of `seconds`, sampled every second.
async fn footprint_over(pid: u32, seconds: u64) -> anyhow::Result<Value> {
    let (_, cpu_start) = sample(pid)?;
    let mut rss_max = 0;
    let mut rss_sum = 0;
    let mut n = 0;
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        let (rss, _) = sample(pid)?;
        rss_max = rss_max.max(rss);
        rss_sum += rss;
        n += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (_, cpu_end) = sample(pid)?;
    Ok(json!({
        "seconds": seconds,
        "rss_max_mb": rss_max / 1024, "rss_mean_mb": rss_sum / n.max(1) / 1024,
        "cpu_seconds": ((cpu_end - cpu_start) * 100.0).round() / 100.0,
    }))
}

async fn footprint(args: FootprintArgs) -> anyhow::Result<Value> {
    let mut result = json!({ "kind": "footprint", "agent": args.agent, "state": args.state });
    merge_into(&mut result, &footprint_over(args.pid, args.seconds).await?);
    Ok(result)
}

/// Busy and total jiffies of all CPUs, from the first line of /proc/stat.
fn cpu_jiffies() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .context("/proc/stat: no cpu line")?
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...: idle and iowait are not busy.
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Ok((total - idle, total))
}

/// The scenarios before this one leave work behind (sandbox removal, the kernel's cgroup
/// clean-up, an agent's garbage collection): wait until the CPUs are quiet, so that every
/// agent and the floor start from the same idle machine.
async fn settle(args: &SettleArgs) -> anyhow::Result<Value> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout);
    let mut before = cpu_jiffies()?;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = cpu_jiffies()?;
        #[allow(clippy::cast_precision_loss)]
        let busy = (now.0 - before.0) as f64 / (now.1 - before.1).max(1) as f64;
        before = now;
        if busy <= args.busy || Instant::now() >= deadline {
            return Ok(json!({
                "kind": "settle", "waited": seconds(started.elapsed()), "busy": busy,
            }));
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn latencies(v: &Value, key: &str) -> Vec<f64> {
    let mut all: Vec<f64> = v[key]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    all.sort_by(f64::total_cmp);
    all
}

/// The median of some values (the mean of the middle two for an even count).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => f64::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}

/// Repeated runs of one scenario (same kind, agent, pod count and concurrency) as one
/// result: `all_ready` and `all_gone` are the medians of the runs, with their ranges;
/// the per-pod latencies of all runs are pooled; the windows are those of the run
/// closest to the median, for the per-step breakdown. The footprint of a scenario that
/// measured one (`probes`, a burst on several nodes) is the median of its runs', each
/// node agent's too. Footprints are kept as they are.
fn merge_runs(results: Vec<Value>) -> Vec<Value> {
    let mut groups: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut merged = Vec::new();
    for r in results {
        if r["kind"] == "footprint" {
            merged.push(r);
            continue;
        }
        let key = format!(
            "{}|{}|{}|{}",
            r["kind"], r["agent"], r["count"], r["concurrency"]
        );
        groups.entry(key).or_default().push(r);
    }
    for runs in groups.into_values() {
        let of = |key: &str| -> Vec<f64> { runs.iter().filter_map(|r| r[key].as_f64()).collect() };
        let pooled = |key: &str| -> Vec<Value> {
            runs.iter()
                .filter_map(|r| r[key].as_array())
                .flatten()
                .cloned()
                .collect()
        };
        let (ready, gone) = (of("all_ready"), of("all_gone"));
        let mid = median(&ready);
        let range = |v: &[f64]| {
            json!([
                v.iter().copied().reduce(f64::min),
                v.iter().copied().reduce(f64::max)
            ])
        };
        let Some(typical) = runs
            .iter()
            .min_by(|a, b| {
                let d = |r: &Value| (r["all_ready"].as_f64().unwrap_or(f64::NAN) - mid).abs();
                d(a).total_cmp(&d(b))
            })
            .cloned()
        else {
            continue;
        };
        let mut m = typical;
        m["runs"] = json!(runs.len());
        m["all_ready"] = json!(mid);
        m["all_gone"] = json!(median(&gone));
        m["all_ready_range"] = range(&ready);
        m["all_gone_range"] = range(&gone);
        m["ready"] = json!(pooled("ready"));
        m["running"] = json!(pooled("running"));
        let usage = [
            "cpu_startup_seconds",
            "cpu_seconds",
            "rss_max_mb",
            "rss_mean_mb",
        ];
        for key in usage {
            let values = of(key);
            if !values.is_empty() {
                m[key] = json!(median(&values));
            }
        }
        if let Some(agents) = m["agents"].as_array_mut() {
            for (i, agent) in agents.iter_mut().enumerate() {
                for key in usage {
                    let values: Vec<f64> = runs
                        .iter()
                        .filter_map(|r| r["agents"][i][key].as_f64())
                        .collect();
                    agent[key] = json!(median(&values));
                }
            }
        }
        merged.push(m);
    }
    merged
}

/// `12.34 s`, and the range of the runs when there were several.
fn wall(r: &Value, key: &str) -> String {
    let value = r[key].as_f64().unwrap_or(f64::NAN);
    let range = &r[format!("{key}_range")];
    match (range[0].as_f64(), range[1].as_f64()) {
        (Some(lo), Some(hi)) if r["runs"].as_u64().unwrap_or(1) > 1 => {
            format!("{value:.2} s ({lo:.2}–{hi:.2})")
        }
        _ => format!("{value:.2} s"),
    }
}

/// A closed span's wall time (busy + idle) from a `--log-span-timings` JSON line, in
/// seconds.
fn span_seconds(line: &Value) -> Option<f64> {
    let parse = |key: &str| -> Option<f64> {
        let v = line[key].as_str()?;
        let (number, scale) = [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)]
            .into_iter()
            .find_map(|(unit, scale)| v.strip_suffix(unit).map(|n| (n, scale)))?;
        Some(number.parse::<f64>().ok()? * scale)
    };
    Some(parse("time.busy")? + parse("time.idle")?)
}

/// The step a closed span stands for: its name, with the RPC or plugin and command.
fn step_name(line: &Value) -> Option<String> {
    let span = &line["span"];
    // A pod's root span lives as long as its worker, and waits are not work.
    let name = span["name"]
        .as_str()
        .filter(|n| ![rkubelet::timeline::POD_SPAN, rkubelet::timeline::WAIT_SPAN].contains(n))?;
    let detail: Vec<&str> = ["rpc", "plugin", "command"]
        .iter()
        .filter_map(|k| span[*k].as_str())
        .collect();
    Some(if detail.is_empty() {
        name.to_owned()
    } else {
        format!("{name} {}", detail.join(" "))
    })
}

/// The wall times of every step of an agent's log (JSON, `--log-span-timings`) whose span
/// closed within `window` (two RFC 3339 timestamps).
fn breakdown(log: &Path, window: &Value) -> anyhow::Result<BTreeMap<String, Vec<f64>>> {
    let bound = |i: usize| -> anyhow::Result<Timestamp> {
        Ok(window[i].as_str().context("window bound")?.parse()?)
    };
    let (from, to) = (bound(0)?, bound(1)?);
    let mut steps: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in std::fs::read_to_string(log)?.lines() {
        let Ok(line) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if line["message"] != "close" {
            continue;
        }
        let at: Option<Timestamp> = line["timestamp"].as_str().and_then(|t| t.parse().ok());
        if !at.is_some_and(|at| from <= at && at <= to) {
            continue;
        }
        if let (Some(step), Some(secs)) = (step_name(&line), span_seconds(&line)) {
            steps.entry(step).or_default().push(secs);
        }
    }
    for v in steps.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    Ok(steps)
}

/// The steps of a run's `startup.steps`, each one's durations sorted.
fn timeline_steps(steps: &serde_json::Map<String, Value>) -> BTreeMap<String, Vec<f64>> {
    steps
        .iter()
        .map(|(step, v)| {
            let mut d: Vec<f64> = v
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_f64)
                .collect();
            d.sort_by(f64::total_cmp);
            (step.clone(), d)
        })
        .collect()
}

/// The result of `kind` for `agent` with `count` pods (`state`, for footprints), its runs
/// merged.
fn find<'a>(
    results: &'a [Value],
    kind: &str,
    agent: &str,
    key: (&str, Value),
) -> Option<&'a Value> {
    results
        .iter()
        .find(|r| r["kind"] == kind && r["agent"] == agent && r[key.0] == key.1)
}

/// Markdown: the benchmark's goals checked against this run (medians of repeated runs),
/// for every rkubelet agent. Deletion is bounded by the floor's teardown + 2 s: the goal
/// adds the pods' grace period, but the bench pods exit at once on SIGTERM, so their 30 s
/// would only hide the agent's own time.
fn goals_table(results: &[Value]) -> String {
    let mut agents: Vec<&str> = results
        .iter()
        .filter(|r| r["kind"] == "burst" || r["kind"] == "probes")
        .filter_map(|r| r["agent"].as_str())
        .filter(|a| a.starts_with("rkubelet"))
        .collect();
    agents.sort_unstable();
    agents.dedup();
    if agents.is_empty() {
        return String::new();
    }
    let kubelet_idle_cpu = results
        .iter()
        .filter(|r| r["kind"] == "footprint" && r["state"] == "idle")
        .filter(|r| {
            r["agent"]
                .as_str()
                .is_some_and(|a| a.starts_with("kubelet"))
        })
        .filter_map(|r| r["cpu_seconds"].as_f64())
        .reduce(f64::min);
    let floor = |count: u64, key: &str| {
        find(results, "floor", "CRI floor", ("count", json!(count))).and_then(|r| r[key].as_f64())
    };
    let mut md = String::from("\n| goal | agent | measured | bound | |\n|---|---|---|---|---|\n");
    let mut row =
        |goal: &str, agent: &str, measured: Option<f64>, bound: Option<f64>, how: String| {
            let (Some(measured), Some(bound)) = (measured, bound) else {
                md.push_str(&format!("| {goal} | {agent} | — | — | not measured |\n"));
                return;
            };
            let verdict = if measured <= bound {
                "met".to_owned()
            } else {
                format!("missed by {:.2}", measured - bound)
            };
            md.push_str(&format!(
                "| {goal} | {agent} | {measured:.2} | {bound:.2} ({how}) | {verdict} |\n"
            ));
        };
    for agent in agents {
        if let Some(probes) = results
            .iter()
            .find(|r| r["kind"] == "probes" && r["agent"] == agent)
        {
            let kubelet = kubelet_probes_cpu(results, probes);
            row(
                &format!(
                    "CPU seconds, {} pods with probes (period 1 s), {} s",
                    probes["count"], probes["seconds"]
                ),
                agent,
                probes["cpu_seconds"].as_f64(),
                kubelet.map(|c| c / 3.0),
                "1/3 of the kubelet's".into(),
            );
        }
        if !results
            .iter()
            .any(|r| r["kind"] == "burst" && r["agent"] == agent)
        {
            continue;
        }
        let burst = |count: u64, key: &str| {
            find(results, "burst", agent, ("count", json!(count))).and_then(|r| r[key].as_f64())
        };
        row(
            "1 pod, create → Ready (s)",
            agent,
            burst(1, "all_ready"),
            Some(0.5),
            "0.5 s".into(),
        );
        for (count, factor) in [(30, 1.5), (100, 1.3)] {
            let bound = floor(count, "all_ready").map(|f| f * factor);
            let ratio = burst(count, "all_ready")
                .zip(floor(count, "all_ready"))
                .map_or(String::new(), |(b, f)| format!("{:.2} × floor", b / f));
            row(
                &format!("{count} pods, all Ready (s)"),
                agent,
                burst(count, "all_ready"),
                bound,
                format!("{factor} × floor; measured {ratio}"),
            );
        }
        for count in [30, 100] {
            row(
                &format!("{count} pods deleted, all gone (s)"),
                agent,
                burst(count, "all_gone"),
                floor(count, "all_gone").map(|f| f + 2.0),
                "floor's teardown + 2 s".into(),
            );
        }
        let steady = find(results, "footprint", agent, ("state", json!("100 pods")));
        // The footprint's MB are whole and rounded down: 24 is the last one under 25.
        row(
            "resident memory with 100 pods, max (MB)",
            agent,
            steady.and_then(|r| r["rss_max_mb"].as_f64()),
            Some(24.0),
            "under 25 MB; whole MB, rounded down".into(),
        );
        let idle = find(results, "footprint", agent, ("state", json!("idle")));
        row(
            "CPU seconds idle, per 60 s",
            agent,
            idle.and_then(|r| r["cpu_seconds"].as_f64()),
            kubelet_idle_cpu.map(|c| c / 5.0),
            "1/5 of the kubelet's".into(),
        );
    }
    md
}

/// The kubelet's CPU seconds in the probes scenario of `probes` (same pod count and
/// window): the least of its variants, as for the idle footprint.
fn kubelet_probes_cpu(results: &[Value], probes: &Value) -> Option<f64> {
    results
        .iter()
        .filter(|r| r["kind"] == "probes" && r["count"] == probes["count"])
        .filter(|r| r["seconds"] == probes["seconds"])
        .filter(|r| {
            r["agent"]
                .as_str()
                .is_some_and(|a| a.starts_with("kubelet"))
        })
        .filter_map(|r| r["cpu_seconds"].as_f64())
        .reduce(f64::min)
}

/// Markdown: each agent's CPU seconds and resident memory while its pods' probes ran.
fn probes_table(results: &[Value]) -> String {
    let mut rows: Vec<&Value> = results.iter().filter(|r| r["kind"] == "probes").collect();
    if rows.is_empty() {
        return String::new();
    }
    rows.sort_by_key(|r| (r["count"].as_u64(), r["agent"].as_str()));
    let mut md = String::from(
        "\n| scenario | agent | runs | CPU seconds | resident memory (max / mean) |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        // Medians of whole MB may end in .5; a whole number prints without a fraction.
        let mb = |key: &str| r[key].as_f64().unwrap_or(f64::NAN);
        md.push_str(&format!(
            "| {} pods with probes (period 1 s), {} s | {} | {} | {:.2} s | {} / {} MB |\n",
            r["count"],
            r["seconds"],
            r["agent"].as_str().unwrap_or_default(),
            r["runs"],
            mb("cpu_seconds"),
            mb("rss_max_mb"),
            mb("rss_mean_mb"),
        ));
    }
    md
}

/// Markdown: bursts on several nodes at once, each node with its own agent: the pods'
/// start-up, and the agents' CPU seconds (their sum, and each node's) and resident memory.
fn nodes_table(results: &[Value]) -> String {
    let mut rows: Vec<&Value> = results.iter().filter(|r| r["kind"] == "nodes").collect();
    if rows.is_empty() {
        return String::new();
    }
    rows.sort_by_key(|r| (r["count"].as_u64(), r["agent"].as_str()));
    let mut md = String::from(concat!(
        "\n| scenario | agent | runs | Ready p50 | p90 | max | all Ready | all gone after delete ",
        "| agent CPU s, create → all Ready: sum (per node) | agent CPU s, create → all gone: sum ",
        "| agent resident memory, max / mean (per node max) |\n",
        "|---|---|---|---|---|---|---|---|---|---|---|\n",
    ));
    for r in rows {
        let ready = latencies(r, "ready");
        let agents = r["agents"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let each = |key: &str, digits: usize| {
            agents
                .iter()
                .map(|a| format!("{:.digits$}", a[key].as_f64().unwrap_or(f64::NAN)))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let number = |key: &str| r[key].as_f64().unwrap_or(f64::NAN);
        md.push_str(&format!(
            "| {} × {} pods at once | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {:.2} ({}) | {:.2} | {:.0} / {:.0} MB ({}) |\n",
            r["nodes"].as_array().map_or(0, Vec::len),
            r["count"],
            r["agent"].as_str().unwrap_or_default(),
            r["runs"],
            percentile(&ready, 50.0),
            percentile(&ready, 90.0),
            percentile(&ready, 100.0),
            wall(r, "all_ready"),
            wall(r, "all_gone"),
            number("cpu_startup_seconds"),
            each("cpu_startup_seconds", 2),
            number("cpu_seconds"),
            number("rss_max_mb"),
            number("rss_mean_mb"),
            each("rss_max_mb", 0),
        ));
    }
    md
}

/// Markdown: the agents' reads of Secrets and ConfigMaps in the sources scenario.
fn sources_table(results: &[Value]) -> String {
    let rows: Vec<&Value> = results.iter().filter(|r| r["kind"] == "sources").collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n| scenario | agent | reads of Secrets and ConfigMaps (audit log) | per pod |\n|---|---|---|---|\n",
    );
    for r in rows {
        let reads = r["reads"].as_object().map(|m| {
            m.iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        md.push_str(&format!(
            "| {} pods using one Secret and one ConfigMap (env and volumes) | {} | {} | {} |\n",
            r["count"],
            r["agent"].as_str().unwrap_or_default(),
            reads
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "none".into()),
            r["reads_per_pod"],
        ));
    }
    md
}

/// Markdown: where an rkubelet burst's time went, per step, from the agent's own spans.
fn breakdown_tables(dir: &Path, rows: &[&Value]) -> anyhow::Result<String> {
    let mut md = String::new();
    let largest = rows
        .iter()
        .filter(|r| r["kind"] == "burst")
        .filter_map(|r| r["count"].as_u64())
        .max();
    for r in rows
        .iter()
        .filter(|r| r["kind"] == "burst" && r["count"].as_u64() == largest)
    {
        let agent = r["agent"].as_str().unwrap_or_default();
        let log = dir.join(format!("{agent}.log"));
        let Some(windows) = r["windows"].as_object().filter(|_| log.exists()) else {
            continue;
        };
        for (phase, window) in windows {
            // The start-up from the agent's timelines of the run's pods, when it has them;
            // otherwise (and the deletion) from the spans in its log.
            let timelines = r["startup"]["steps"]
                .as_object()
                .filter(|_| phase == "start-up");
            let (steps, source) = match timelines {
                Some(steps) => (timeline_steps(steps), "its pods' timelines"),
                None => (breakdown(&log, window)?, "its spans"),
            };
            if steps.is_empty() {
                continue;
            }
            md.push_str(&format!(
                "\n**{agent}, {} pods, {phase}: per step, from {source}** (seconds; a step's calls overlap across pods)\n\n",
                r["count"]
            ));
            if let Some(ready) = r["startup"]["seen_to_ready"]
                .as_array()
                .filter(|_| timelines.is_some())
            {
                let mut ready: Vec<f64> = ready.iter().filter_map(Value::as_f64).collect();
                ready.sort_by(f64::total_cmp);
                md.push_str(&format!(
                    "Each pod from seen by the agent to Ready acknowledged by the API: p50 {:.3} s, p90 {:.3} s, max {:.3} s ({} pods).\n\n",
                    percentile(&ready, 50.0),
                    percentile(&ready, 90.0),
                    percentile(&ready, 100.0),
                    ready.len()
                ));
            }
            md.push_str("| step | calls | p50 | p90 | max | sum |\n|---|---|---|---|---|---|\n");
            let mut by_sum: Vec<(&String, &Vec<f64>)> = steps.iter().collect();
            by_sum.sort_by(|a, b| b.1.iter().sum::<f64>().total_cmp(&a.1.iter().sum::<f64>()));
            for (step, v) in by_sum {
                md.push_str(&format!(
                    "| {step} | {} | {:.3} | {:.3} | {:.3} | {:.1} |\n",
                    v.len(),
                    percentile(v, 50.0),
                    percentile(v, 90.0),
                    percentile(v, 100.0),
                    v.iter().sum::<f64>(),
                ));
            }
        }
    }
    Ok(md)
}

fn report(args: &ReportArgs) -> anyhow::Result<Value> {
    let mut results = Vec::new();
    for entry in std::fs::read_dir(&args.dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            for line in std::fs::read_to_string(&path)?
                .lines()
                .filter(|l| !l.trim().is_empty())
            {
                results.push(
                    serde_json::from_str::<Value>(line)
                        .with_context(|| format!("{}", path.display()))?,
                );
            }
        }
    }
    let results = merge_runs(results);
    let mut md = String::new();
    md.push_str(&format!("### Benchmark {}\n\n", args.machine));
    md.push_str("Where a scenario ran several times, `all Ready` and `all gone` are the medians of the runs (their range in brackets) and the percentiles pool the pods of all runs.\n\n");
    let mut rows: Vec<&Value> = results
        .iter()
        .filter(|r| r["kind"] != "footprint" && r["kind"] != "nodes")
        .collect();
    rows.sort_by_key(|r| {
        (
            r["kind"].as_str().unwrap_or_default().to_owned(),
            r["count"].as_u64().unwrap_or(0),
            r["agent"].as_str().unwrap_or_default().to_owned(),
        )
    });
    if !rows.is_empty() {
        md.push_str("| scenario | agent | pods | runs | Ready p50 | p90 | p99 | max | Running p50 | all Ready | all gone after delete |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    }
    let mut plot: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in results.iter().filter(|r| r["kind"] == "nodes") {
        let nodes = r["nodes"].as_array().map_or(0, Vec::len);
        let agent = r["agent"].as_str().unwrap_or_default();
        plot.insert(
            format!("{nodes} nodes {agent} x{}", r["count"]),
            latencies(r, "ready"),
        );
    }
    for r in &rows {
        let ready = latencies(r, "ready");
        let running = latencies(r, "running");
        let scenario = match r["kind"].as_str() {
            Some("floor") => format!("CRI floor (concurrency {})", r["concurrency"]),
            Some(kind) => kind.to_owned(),
            None => String::new(),
        };
        md.push_str(&format!(
            "| {scenario} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} |\n",
            r["agent"].as_str().unwrap_or_default(),
            r["count"],
            r["runs"],
            percentile(&ready, 50.0),
            percentile(&ready, 90.0),
            percentile(&ready, 99.0),
            percentile(&ready, 100.0),
            if running.is_empty() {
                "—".to_owned()
            } else {
                format!("{:.2}", percentile(&running, 50.0))
            },
            wall(r, "all_ready"),
            wall(r, "all_gone"),
        ));
        if r["count"].as_u64() == Some(100) || r["count"].as_u64() == Some(30) {
            plot.insert(
                format!(
                    "{} {} x{}",
                    scenario,
                    r["agent"].as_str().unwrap_or_default(),
                    r["count"]
                ),
                ready,
            );
        }
    }
    if results.iter().any(|r| r["kind"] == "footprint") {
        md.push_str("\n| agent | state | resident memory (max / mean) | CPU seconds over the window |\n|---|---|---|---|\n");
    }
    for r in results.iter().filter(|r| r["kind"] == "footprint") {
        md.push_str(&format!(
            "| {} | {} | {} / {} MB | {:.2} s in {} s |\n",
            r["agent"].as_str().unwrap_or_default(),
            r["state"].as_str().unwrap_or_default(),
            r["rss_max_mb"],
            r["rss_mean_mb"],
            r["cpu_seconds"].as_f64().unwrap_or(f64::NAN),
            r["seconds"],
        ));
    }
    md.push_str(&probes_table(&results));
    md.push_str(&nodes_table(&results));
    md.push_str(&sources_table(&results));
    md.push_str(&goals_table(&results));
    md.push_str(&breakdown_tables(&args.dir, &rows)?);
    std::fs::write(args.dir.join("report.md"), &md)?;
    // Plot data: one column pair (rank fraction, seconds) per series, for gnuplot.
    let mut data = String::new();
    for (name, values) in &plot {
        data.push_str(&format!("\"{name}\"\n"));
        for (i, v) in values.iter().enumerate() {
            #[allow(clippy::cast_precision_loss)]
            let fraction = (i + 1) as f64 / values.len() as f64;
            data.push_str(&format!("{v} {fraction}\n"));
        }
        data.push_str("\n\n");
    }
    std::fs::write(args.dir.join("latency.dat"), data)?;
    Ok(json!({ "kind": "report", "rows": rows.len(), "series": plot.len() }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Burst(a) => burst(a).await?,
        Command::Deployment(a) => deployment(a).await?,
        Command::Floor(a) => floor(a).await?,
        Command::Footprint(a) => footprint(a).await?,
        Command::Probes(a) => probes(a).await?,
        Command::Sources(a) => sources(a).await?,
        Command::Settle(a) => settle(&a).await?,
        Command::Report(a) => report(&a)?,
    };
    print(&result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn repeated_runs_merge_into_medians_with_pooled_latencies() {
        let run = |ready: f64, gone: f64, pods: &[f64]| {
            json!({"kind": "burst", "agent": "rkubelet", "count": 2, "all_ready": ready,
                   "all_gone": gone, "ready": pods, "running": pods, "windows": {"w": ready}})
        };
        let footprint = json!({"kind": "footprint", "agent": "rkubelet", "state": "idle"});
        let merged = merge_runs(vec![
            run(3.0, 2.0, &[1.0, 3.0]),
            footprint.clone(),
            run(1.0, 5.0, &[0.5, 1.0]),
            run(2.0, 4.0, &[1.5, 2.0]),
        ]);
        assert_eq!(merged.len(), 2);
        assert!(merged.contains(&footprint));
        let burst = merged.iter().find(|r| r["kind"] == "burst").unwrap();
        assert_eq!(burst["runs"], 3);
        assert_eq!(burst["all_ready"], 2.0);
        assert_eq!(burst["all_gone"], 4.0);
        assert_eq!(burst["all_ready_range"], json!([1.0, 3.0]));
        assert_eq!(burst["ready"].as_array().unwrap().len(), 6);
        // The breakdown reads the windows of the run closest to the median.
        assert_eq!(burst["windows"]["w"], 2.0);
        assert_eq!(wall(burst, "all_ready"), "2.00 s (1.00–3.00)");
    }

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

    #[test]
    fn probes_use_each_kind_evenly_with_different_readiness_and_liveness() {
        let kind = |p: &Value| {
            ["exec", "httpGet", "tcpSocket"]
                .into_iter()
                .find(|k| p.get(*k).is_some())
                .unwrap()
        };
        let mut count: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for i in 0..6 {
            let c = probed_container("busybox", i);
            let (readiness, liveness) = (&c["readinessProbe"], &c["livenessProbe"]);
            assert_eq!(readiness["periodSeconds"], 1);
            assert_eq!(liveness["periodSeconds"], 1);
            assert_ne!(kind(readiness), kind(liveness));
            *count.entry(("readiness", kind(readiness))).or_default() += 1;
            *count.entry(("liveness", kind(liveness))).or_default() += 1;
        }
        // Six pods: each kind twice as readiness and twice as liveness probe.
        assert_eq!(count.len(), 6);
        assert!(count.values().all(|n| *n == 2));
    }

    fn probes_run(agent: &str, cpu: f64, rss: u64) -> Value {
        json!({"kind": "probes", "agent": agent, "count": 100, "seconds": 60,
               "all_ready": 10.0, "all_gone": 5.0, "ready": [1.0], "running": [0.5],
               "cpu_seconds": cpu, "rss_max_mb": rss, "rss_mean_mb": rss})
    }

    #[test]
    fn bursts_on_several_nodes_merge_each_agents_usage_into_medians() {
        let run = |ready: f64, cpu: [f64; 2], rss: [u64; 2]| {
            let agent = |i: usize| {
                json!({"node": format!("n{i}"), "cpu_startup_seconds": cpu[i] / 2.0,
                       "cpu_seconds": cpu[i], "rss_max_mb": rss[i], "rss_mean_mb": rss[i] - 1})
            };
            json!({"kind": "nodes", "agent": "rkubelet", "count": 2, "nodes": ["n0", "n1"],
                   "all_ready": ready, "all_gone": 1.0, "ready": [ready], "running": [ready],
                   "cpu_startup_seconds": (cpu[0] + cpu[1]) / 2.0, "cpu_seconds": cpu[0] + cpu[1],
                   "rss_max_mb": rss[0].max(rss[1]), "rss_mean_mb": 1.0,
                   "agents": [agent(0), agent(1)]})
        };
        let merged = merge_runs(vec![
            run(3.0, [1.0, 4.0], [20, 30]),
            run(1.0, [2.0, 2.0], [22, 31]),
            run(2.0, [3.0, 6.0], [21, 29]),
        ]);
        assert_eq!(merged.len(), 1);
        let m = &merged[0];
        assert_eq!(m["cpu_seconds"], 5.0);
        assert_eq!(m["agents"][0]["cpu_seconds"], 2.0);
        assert_eq!(m["agents"][1]["cpu_seconds"], 4.0);
        assert_eq!(m["agents"][1]["rss_max_mb"], 30.0);
        assert_eq!(m["agents"][0]["node"], "n0");
        let table = nodes_table(&merged);
        assert!(
            table.contains(
                "| 2 × 2 pods at once | rkubelet | 3 | 2.00 | 3.00 | 3.00 | 2.00 s (1.00–3.00) | 1.00 s (1.00–1.00) \
                 | 2.50 (1.00 / 2.00) | 5.00 | 30 / 1 MB (21 / 30) |"
            ),
            "{table}"
        );
        assert!(nodes_table(&[]).is_empty());
        // The goals are single-node ones: none for a multi-node burst.
        assert!(goals_table(&merged).is_empty());
    }

    #[test]
    fn probes_runs_merge_into_median_footprints() {
        let merged = merge_runs(vec![
            probes_run("rkubelet", 3.0, 20),
            probes_run("rkubelet", 1.0, 21),
            probes_run("rkubelet", 2.0, 30),
        ]);
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0]["runs"], 3);
        assert_eq!(merged[0]["cpu_seconds"], 2.0);
        assert_eq!(merged[0]["rss_max_mb"], 21.0);
    }

    #[test]
    fn probes_table_and_goal_compare_with_the_kubelets_least_cpu() {
        let results = merge_runs(vec![
            probes_run("rkubelet", 4.5, 20),
            probes_run("kubelet QPS 5", 15.0, 90),
            probes_run("kubelet QPS 50", 12.0, 88),
        ]);
        let table = probes_table(&results);
        assert!(table.contains(
            "| 100 pods with probes (period 1 s), 60 s | rkubelet | 1 | 4.50 s | 20 / 20 MB |"
        ));
        assert!(table.contains("| kubelet QPS 50 | 1 | 12.00 s | 88 / 88 MB |"));
        let goals = goals_table(&results);
        // Only the probe goal: no burst ran, and the kubelets are not rkubelet agents.
        assert_eq!(goals.lines().filter(|l| l.starts_with("| CPU")).count(), 1);
        assert!(goals.contains(
            "| CPU seconds, 100 pods with probes (period 1 s), 60 s | rkubelet | 4.50 | 4.00 (1/3 of the kubelet's) | missed by 0.50 |"
        ));
        assert!(!goals.contains("create → Ready"));
        let within = merge_runs(vec![
            probes_run("rkubelet", 3.9, 20),
            probes_run("kubelet QPS 50", 12.0, 88),
        ]);
        assert!(goals_table(&within).contains("| 3.90 | 4.00 (1/3 of the kubelet's) | met |"));
        // Without a kubelet run of the same size, there is nothing to compare with.
        let alone = merge_runs(vec![probes_run("rkubelet", 3.9, 20)]);
        assert!(goals_table(&alone).contains("| rkubelet | — | — | not measured |"));
        assert!(probes_table(&[]).is_empty());
    }
}
