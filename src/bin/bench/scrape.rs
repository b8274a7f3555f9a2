//! The `scrape` scenario: what monitoring costs the agent. N pods bound to the node; once
//! all are Ready, each endpoint that monitoring reads (`/metrics`, `/metrics/resource`,
//! `/metrics/probes`, `/metrics/cadvisor`, `/stats/summary`, `/configz`) is fetched
//! through the API server's node proxy, once to warm it up, then `scrapes` times in a
//! row: the wall time of each fetch, the body's size, and the agent's CPU seconds over
//! the fetches less its CPU at rest (measured over `idle_seconds` before), per fetch. An
//! endpoint the agent does not serve (404) is recorded as such. Then deletion. It uses
//! the shared pod, `/proc` and result helpers and knows no other scenario.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::pods::{ApiArgs, bound_pods, client, container, timings_json};
use crate::procfs::sample;
use crate::results::{merge_into, seconds};

/// What monitoring scrapes from a node, in the order they are measured.
const PATHS: [&str; 6] = [
    "/metrics",
    "/metrics/resource",
    "/metrics/probes",
    "/metrics/cadvisor",
    "/stats/summary",
    "/configz",
];

#[derive(Debug, clap::Args)]
pub struct ScrapeArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The agent's process, whose CPU time each endpoint costs.
    #[arg(long)]
    pid: u32,
    /// Fetches of each endpoint (after one to warm up).
    #[arg(long, default_value_t = 20)]
    scrapes: u32,
    /// The window over which the agent's CPU at rest is measured first, in seconds.
    #[arg(long, default_value_t = 10)]
    idle_seconds: u64,
    /// A directory to keep each endpoint's first answer in (`<agent>_<path>.txt`), to
    /// compare the agents' answers.
    #[arg(long)]
    bodies: Option<std::path::PathBuf>,
}

/// One fetch: its wall time in seconds and the body, or `None` for a 404.
async fn fetch(client: &kube::Client, url: &str) -> anyhow::Result<Option<(f64, String)>> {
    let request = hyper::Request::get(url).body(Vec::new())?;
    let started = Instant::now();
    match client.request_text(request).await {
        Ok(body) => Ok(Some((seconds(started.elapsed()), body))),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The middle of `values` (sorted here).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Each endpoint's cost, by path.
async fn scrape_all(args: &ScrapeArgs) -> anyhow::Result<Value> {
    let client = client(&args.api.kubeconfig).await?;
    let node = args.api.single_node()?;
    let (_, cpu_start) = sample(args.pid)?;
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let (_, cpu_idle_end) = sample(args.pid)?;
    #[allow(clippy::cast_precision_loss)]
    let rest_rate = (cpu_idle_end - cpu_start) / args.idle_seconds.max(1) as f64;
    let mut endpoints = serde_json::Map::new();
    for path in PATHS {
        let url = format!("/api/v1/nodes/{node}/proxy{path}");
        let Some((_, body)) = fetch(&client, &url).await? else {
            endpoints.insert(path.to_owned(), json!({ "served": false }));
            continue;
        };
        if let Some(dir) = &args.bodies {
            let name = format!("{}{path}", args.api.agent).replace(['/', ' '], "_");
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join(format!("{name}.txt")), &body)?;
        }
        let (_, cpu_before) = sample(args.pid)?;
        let window = Instant::now();
        let mut times = Vec::new();
        for _ in 0..args.scrapes {
            let (elapsed, _) = fetch(&client, &url)
                .await?
                .ok_or_else(|| anyhow::anyhow!("{path} answered 404 after it was served"))?;
            times.push(elapsed);
        }
        let (_, cpu_after) = sample(args.pid)?;
        let busy = (cpu_after - cpu_before) - rest_rate * seconds(window.elapsed());
        let n = f64::from(args.scrapes.max(1));
        let ms = |s: f64| (s * 1e5).round() / 100.0;
        endpoints.insert(
            path.to_owned(),
            json!({
                "served": true,
                "bytes": body.len(),
                "scrape_ms_median": ms(median(&mut times)),
                "scrape_ms_max": ms(times.iter().copied().fold(0.0, f64::max)),
                "agent_cpu_ms_per_scrape": ms(busy.max(0.0) / n),
            }),
        );
    }
    Ok(json!({
        "scrapes": args.scrapes,
        "agent_cpu_ms_per_second_at_rest": (rest_rate * 1e5).round() / 100.0,
        "endpoints": endpoints,
    }))
}

/// The scrape scenario: the start-up and deletion timings of the pods, and each
/// endpoint's cost while they run.
pub async fn scrape(args: ScrapeArgs) -> anyhow::Result<Value> {
    let spec = |_| json!({ "containers": [container(&args.api.image)] });
    let t = bound_pods(&args.api, spec, scrape_all(&args)).await?;
    let mut result = timings_json("scrape", &args.api, &t);
    merge_into(&mut result, &t.held);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_value() {
        assert!((median(&mut [3.0, 1.0, 2.0]) - 2.0).abs() < f64::EPSILON);
        assert!((median(&mut [4.0, 1.0, 3.0, 2.0]) - 3.0).abs() < f64::EPSILON);
        assert!(median(&mut []).abs() < f64::EPSILON);
    }
}
