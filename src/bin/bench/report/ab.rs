//! The A/B table: when one run measured rkubelet builds side by side (`BENCH_BINS`,
//! `rkubelet-before`), each build's figures against the baseline's — the build labelled
//! `main` or `before` — scenario by scenario, from every run of each (an agent named more
//! than once, in an A B B A order, has its runs pooled). A difference counts only beyond
//! the run-to-run swing: when the two builds' ranges over their runs do not overlap.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{latencies, median, percentile};

/// The builds compared against: rkubelet from main, or the earlier build.
const BASELINES: [&str; 2] = ["rkubelet (main)", "rkubelet (before)"];

/// One build's runs of one scenario.
#[derive(Default)]
struct Runs<'a>(Vec<&'a Value>);

impl Runs<'_> {
    fn of(&self, key: &str) -> Vec<f64> {
        self.0.iter().filter_map(|r| r[key].as_f64()).collect()
    }

    /// The runs' median and range of `key`, if they measured it.
    fn spread(&self, key: &str) -> Option<(f64, f64, f64)> {
        let v = self.of(key);
        let lo = v.iter().copied().reduce(f64::min)?;
        let hi = v.iter().copied().reduce(f64::max)?;
        Some((median(&v), lo, hi))
    }

    /// The agent's own CPU seconds and the rest of the machine's (not the control plane's,
    /// not the agent's) until all were Ready, medians of the runs.
    fn cpu(&self) -> Option<(f64, f64)> {
        let agent = self.of("agents_busy_seconds");
        let rest: Vec<f64> = self
            .0
            .iter()
            .filter_map(|r| {
                let busy = r["machine_busy_seconds"].as_f64()?;
                let others = r["control_plane_busy_seconds"].as_f64().unwrap_or(0.0);
                Some(busy - others - r["agents_busy_seconds"].as_f64().unwrap_or(0.0))
            })
            .collect();
        (!agent.is_empty() && !rest.is_empty()).then(|| (median(&agent), median(&rest)))
    }

    /// The pods' create → Ready p50, pooled over the runs.
    fn p50(&self) -> f64 {
        let mut all: Vec<f64> = self.0.iter().flat_map(|r| latencies(r, "ready")).collect();
        all.sort_by(f64::total_cmp);
        percentile(&all, 50.0)
    }
}

fn cell(s: Option<(f64, f64, f64)>) -> String {
    match s {
        Some((m, lo, hi)) if lo < hi => format!("{m:.2} s ({lo:.2}–{hi:.2})"),
        Some((m, _, _)) => format!("{m:.2} s"),
        None => "—".into(),
    }
}

/// The difference of the medians, and whether the ranges leave no overlap.
fn versus(build: Option<(f64, f64, f64)>, base: Option<(f64, f64, f64)>) -> String {
    let (Some((m, lo, hi)), Some((bm, blo, bhi))) = (build, base) else {
        return "—".into();
    };
    let beyond = hi < blo || lo > bhi;
    format!(
        "{:+.2} s ({:+.0} %){}",
        m - bm,
        100.0 * (m - bm) / bm,
        if beyond {
            ", beyond the swing"
        } else {
            ", within the swing"
        }
    )
}

/// Markdown: each rkubelet build against the baseline, per scenario, from the raw runs
/// (before they are merged). Empty when the run had no baseline build.
pub(super) fn ab_table(raw: &[Value]) -> String {
    let mut by: BTreeMap<(String, u64), BTreeMap<String, Runs<'_>>> = BTreeMap::new();
    for r in raw {
        let kind = r["kind"].as_str().unwrap_or_default();
        let agent = r["agent"].as_str().unwrap_or_default();
        let kinds = [
            "burst",
            "deployment",
            "deployment with exec probes",
            "probes",
            "sources",
            "scrape",
        ];
        if !kinds.contains(&kind) || !agent.starts_with("rkubelet") {
            continue;
        }
        let key = (kind.to_owned(), r["count"].as_u64().unwrap_or(0));
        by.entry(key)
            .or_default()
            .entry(agent.to_owned())
            .or_default()
            .0
            .push(r);
    }
    let mut md = String::new();
    for ((kind, count), builds) in &by {
        let Some((base_name, base)) = builds.iter().find(|(a, _)| BASELINES.contains(&a.as_str()))
        else {
            continue;
        };
        for (name, runs) in builds.iter().filter(|(a, _)| *a != base_name) {
            if md.is_empty() {
                md.push_str(concat!(
                    "\n**A/B: each build against the baseline** (medians of each build's runs, their range ",
                    "in brackets; a difference is beyond the swing when the ranges do not overlap; CPU: ",
                    "the agent's own and the rest of the machine's beside the control plane, until all ",
                    "are Ready)\n\n",
                    "| scenario | pods | build | runs | all Ready | vs baseline | all gone | vs baseline | Ready p50 | CPU agent + rest | probes' CPU in the window |\n",
                    "|---|---|---|---|---|---|---|---|---|---|---|\n",
                ));
            }
            for (label, build) in [(base_name, base), (name, runs)] {
                let vs = |key: &str| {
                    if label == base_name {
                        "baseline".to_owned()
                    } else {
                        versus(build.spread(key), base.spread(key))
                    }
                };
                let cpu = build
                    .cpu()
                    .map_or("—".into(), |(a, r)| format!("{a:.2} + {r:.2} s"));
                let probes_cpu = build
                    .spread("cpu_seconds")
                    .map_or("—".into(), |(m, _, _)| format!("{m:.2} s"));
                md.push_str(&format!(
                    "| {kind} | {count} | {label} | {} | {} | {} | {} | {} | {:.2} s | {cpu} | {probes_cpu} |\n",
                    build.0.len(),
                    cell(build.spread("all_ready")),
                    vs("all_ready"),
                    cell(build.spread("all_gone")),
                    vs("all_gone"),
                    build.p50(),
                ));
            }
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(agent: &str, ready: f64, gone: f64) -> Value {
        json!({"kind": "probes", "agent": agent, "count": 100, "all_ready": ready,
               "all_gone": gone, "ready": [ready / 2.0, ready], "cpu_seconds": 2.5})
    }

    #[test]
    fn each_build_is_set_against_the_baseline_beyond_or_within_the_swing() {
        let raw = vec![
            run("rkubelet (main)", 44.0, 24.0),
            run("rkubelet", 20.0, 23.0),
            run("rkubelet", 22.0, 25.0),
            run("rkubelet (main)", 40.0, 22.0),
            run("kubelet QPS 50", 30.0, 30.0),
        ];
        let md = ab_table(&raw);
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| probes")).collect();
        assert_eq!(
            rows,
            [
                "| probes | 100 | rkubelet (main) | 2 | 42.00 s (40.00–44.00) | baseline | 23.00 s (22.00–24.00) | baseline | 22.00 s | — | 2.50 s |",
                "| probes | 100 | rkubelet | 2 | 21.00 s (20.00–22.00) | -21.00 s (-50 %), beyond the swing | 24.00 s (23.00–25.00) | +1.00 s (+4 %), within the swing | 11.00 s | — | 2.50 s |",
            ]
        );
    }

    #[test]
    fn a_bursts_cpu_is_the_agents_and_the_rest_beside_the_control_plane() {
        let burst = |agent: &str, agents: f64| {
            json!({"kind": "burst", "agent": agent, "count": 100, "all_ready": 15.0,
                   "all_gone": 14.0, "ready": [8.0], "machine_busy_seconds": 30.0,
                   "control_plane_busy_seconds": 4.5, "agents_busy_seconds": agents})
        };
        let md = ab_table(&[burst("rkubelet (before)", 1.5), burst("rkubelet", 1.0)]);
        assert!(md.contains("| burst | 100 | rkubelet (before) | 1 | 15.00 s | baseline | 14.00 s | baseline | 8.00 s | 1.50 + 24.00 s | — |"), "{md}");
        assert!(md.contains("| 1.00 + 24.50 s |"), "{md}");
        assert!(md.contains("+0.00 s (+0 %), within the swing"), "{md}");
    }

    #[test]
    fn no_baseline_build_no_table() {
        assert!(
            ab_table(&[
                run("rkubelet", 20.0, 23.0),
                run("rkubelet (agent CNI)", 21.0, 22.0)
            ])
            .is_empty()
        );
    }
}
