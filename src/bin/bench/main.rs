//! `bench`: the measurements behind `scripts/bench.sh`, which runs rkubelet and the
//! real kubelet one after the other on the same node set-up. Each subcommand measures one
//! thing and prints one JSON object; `report` turns a directory of them into a Markdown
//! table and gnuplot data. It is a benchmark, not a test: it asserts nothing.
//!
//! - `burst`: N pods created at once, bound to the node; create → Running and create → Ready
//!   per pod as seen through a watch, then the time until all are deleted and gone. With
//!   several nodes, N pods on each, all at once, and each node agent's CPU seconds and
//!   resident memory meanwhile; until all are Ready, the machine's busy CPU time and the
//!   control plane's share of it.
//! - `deployment`: the same through a Deployment, the scheduler and the controllers; with
//!   `--exec-probes`, each replica probed by exec every second (readiness and liveness).
//! - `floor`: sandbox + network + create + start straight over CRI, no agent, no API server,
//!   and the teardown likewise — the physical limit the agents are compared with — and the
//!   machine's busy CPU time until all are up.
//! - `footprint`: resident memory and CPU seconds of a process over a window.
//! - `probes`: N pods bound to the node, each with a readiness and a liveness probe every
//!   second (exec, httpGet and tcpSocket, evenly spread), timed until all are Ready; then
//!   the agent's footprint over a window while the probes run, then deletion.
//! - `scrape`: N pods bound to the node; each endpoint monitoring reads (`/metrics`,
//!   `/metrics/resource`, `/metrics/probes`, `/metrics/cadvisor`, `/stats/summary`,
//!   `/configz`) fetched repeatedly through the node proxy: time per fetch and the agent's
//!   CPU per fetch.
//! - `logrotate`: N chatty pods logging at a fixed rate while the agent rotates their logs:
//!   the agent's footprint over a window and the most their logs held on disk.
//!
//! This file is the command line only: the sub-commands' declarations and their dispatch,
//! and the printing of the one JSON object each returns. Each scenario lives in its own
//! file and imports only the shared helpers (`pods` for the API server, `procfs` for
//! `/proc`, `results` for the JSON results' vocabulary), never another scenario; nothing
//! here knows how a scenario measures.

mod burst;
mod deployment;
mod floor;
mod footprint;
mod logrotate;
mod pods;
mod probes;
mod procfs;
mod report;
mod results;
mod scrape;
mod settle;
mod sources;

use std::io::Write;

use clap::{Parser, Subcommand};
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(name = "rkubelet-bench", about = "Measurements for scripts/bench.sh")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N pods bound to the node (to each node) at once: start-up latencies, then deletion.
    Burst(burst::BurstArgs),
    /// A Deployment of N replicas through the scheduler: start-up latencies, then deletion.
    Deployment(deployment::DeploymentArgs),
    /// The CRI floor: N sandboxes with one container each, straight over CRI.
    Floor(floor::FloorArgs),
    /// Resident memory and CPU seconds of a process over a window.
    Footprint(footprint::FootprintArgs),
    /// N pods with probes every second: start-up, the agent's footprint while they run,
    /// then deletion.
    Probes(probes::ProbesArgs),
    /// N chatty pods whose logs the agent rotates: its footprint meanwhile, and the most
    /// their logs held on disk.
    Logrotate(logrotate::LogRotateArgs),
    /// N pods using one Secret and one ConfigMap in env and volumes: start-up, deletion,
    /// and the agent's reads of them from the API server's audit log.
    Sources(sources::SourcesArgs),
    /// N pods, then each monitoring endpoint scraped repeatedly: time and agent CPU per
    /// scrape.
    Scrape(scrape::ScrapeArgs),
    /// Waits until the machine's CPUs are quiet again after a scenario.
    Settle(settle::SettleArgs),
    /// A Markdown table and plot data from a directory of results.
    Report(report::ReportArgs),
}

fn print(v: &Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}")?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Burst(a) => burst::burst(a).await?,
        Command::Deployment(a) => deployment::deployment(a).await?,
        Command::Floor(a) => floor::floor(a).await?,
        Command::Footprint(a) => footprint::footprint(a).await?,
        Command::Probes(a) => probes::probes(a).await?,
        Command::Logrotate(a) => logrotate::logrotate(a).await?,
        Command::Sources(a) => sources::sources(a).await?,
        Command::Scrape(a) => scrape::scrape(a).await?,
        Command::Settle(a) => settle::settle(&a).await?,
        Command::Report(a) => report::report(&a)?,
    };
    print(&result)
}
