//! The `report` sub-command: a directory of the scenarios' JSON results (repeated runs
//! merged into medians) as one Markdown report with the goals checked, per-step breakdowns
//! from rkubelet's timelines or spans, and gnuplot data. It reads results as JSON only: it
//! knows no scenario's code, no API server, no CRI and no `/proc`.

mod ab;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The directory of `*.json` results; the report is written there.
    dir: PathBuf,
    /// A line on the machine and date, for the table's heading.
    #[arg(long, default_value = "")]
    machine: String,
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

/// The goal on an agent's resident memory, in the whole MB (rounded down) the results
/// hold: 19 is the last figure sure to be within 20 MB.
const RSS_GOAL_MB: f64 = 19.0;

/// One row of the goals table: met, or missed with the margin; `not measured` when the
/// run lacks the figure or what it is compared with.
fn goal_row(
    md: &mut String,
    goal: &str,
    agent: &str,
    measured: Option<f64>,
    bound: Option<f64>,
    how: &str,
) {
    let (Some(measured), Some(bound)) = (measured, bound) else {
        md.push_str(&format!("| {goal} | {agent} | — | — | not measured |\n"));
        return;
    };
    let verdict = if measured <= bound {
        format!("met by {:.2}", bound - measured)
    } else {
        format!("missed by {:.2}", measured - bound)
    };
    md.push_str(&format!(
        "| {goal} | {agent} | {measured:.2} | {bound:.2} ({how}) | {verdict} |\n"
    ));
}

/// `measured` over `of` as `1.23 × <name>`, or nothing when either is missing.
fn ratio(measured: Option<f64>, of: Option<f64>, name: &str) -> String {
    measured.zip(of).map_or(String::new(), |(m, o)| {
        format!("; measured {:.2} × {name}", m / o)
    })
}

/// The kind layout's agents (`BENCH_KIND=1`), as scripts/bench.sh names them.
const HOST_CGROUPFS: &str = "rkubelet, host node, cgroupfs driver";
const KIND_CGROUPFS: &str = "rkubelet, kind node, cgroupfs driver";
const KIND_SYSTEMD: &str = "rkubelet, kind node, systemd driver";

/// Markdown: issue 24's goal in the kind layout: a burst on the kind-style node with the
/// systemd driver all Ready within 1.1 × the same burst on the host node (cgroupfs), and,
/// to separate the driver from the node, against the kind node with the cgroupfs driver.
fn kind_goals_table(results: &[Value]) -> String {
    let mut md = String::from("\n| goal | agent | measured | bound | |\n|---|---|---|---|---|\n");
    let ready = |kind: &str, agent: &str, count: &Value| {
        find(results, kind, agent, ("count", count.clone())).and_then(|r| r["all_ready"].as_f64())
    };
    for r in results
        .iter()
        .filter(|r| r["kind"] == "burst" && r["agent"] == KIND_SYSTEMD)
    {
        let count = &r["count"];
        let measured = r["all_ready"].as_f64();
        for (other, name) in [
            (HOST_CGROUPFS, "the host node's, cgroupfs driver"),
            (KIND_CGROUPFS, "the kind node's, cgroupfs driver"),
        ] {
            let theirs = ready("burst", other, count);
            goal_row(
                &mut md,
                &format!("{count} pods, all Ready (s)"),
                KIND_SYSTEMD,
                measured,
                theirs.map(|t| t * 1.1),
                &format!("1.1 × {name}{}", ratio(measured, theirs, "it")),
            );
        }
        // The runtime alone with each driver, as measured inside the kind node.
        let floor = |driver: &str| {
            ready(
                "floor",
                &format!("CRI floor, kind node, {driver} driver"),
                count,
            )
        };
        if let (Some(systemd), Some(cgroupfs)) = (floor("systemd"), floor("cgroupfs")) {
            md.push_str(&format!(
                "\nThe runtime alone ({count} sandboxes, the CRI floor in the kind node): {systemd:.2} s \
                 with the systemd driver, {cgroupfs:.2} s with cgroupfs, {:.2} ×.\n",
                systemd / cgroupfs
            ));
        }
    }
    md
}

/// The VM layout's agent and floor (`BENCH_VM=1`), as scripts/bench.sh names them.
const VM_AGENT: &str = "rkubelet, VM node, systemd driver";
const VM_FLOOR: &str = "CRI floor, VM node";

/// Markdown: issue 44's row in the VM layout: a burst on the VM node against the CRI
/// floor inside the same VM (both under the same emulation: the ratio is what rkubelet
/// adds on a cgroup v2 node with the systemd driver; the absolute times only say how slow
/// emulation is), bounded as the host's 30-pod burst is (1.2 × its floor).
fn vm_goals_table(results: &[Value]) -> String {
    let mut md = String::from("\n| goal | agent | measured | bound | |\n|---|---|---|---|---|\n");
    for r in results
        .iter()
        .filter(|r| r["kind"] == "burst" && r["agent"] == VM_AGENT)
    {
        let count = &r["count"];
        let measured = r["all_ready"].as_f64();
        let floor = find(results, "floor", VM_FLOOR, ("count", count.clone()))
            .and_then(|f| f["all_ready"].as_f64());
        goal_row(
            &mut md,
            &format!("{count} pods on the VM node, all Ready (s)"),
            VM_AGENT,
            measured,
            floor.map(|f| f * 1.2),
            &format!(
                "1.2 × the CRI floor in the same VM{}",
                ratio(measured, floor, "floor")
            ),
        );
    }
    md
}

/// Markdown: issue 30's goals checked against this run (medians of repeated runs), for
/// every rkubelet agent (one per networking owner): all Ready within a factor of the CRI
/// floor at the same count, deletion within the floor's teardown + 1 s, the p50 and the
/// probes against the kubelet QPS 50, resident memory at maxPods (110), and the probes'
/// CPU against the kubelet's. Several nodes at once (`nodes` results) are checked against
/// the floor run on every node's runtime at once (`CRI floor, N nodes`): the machine's
/// CPUs are shared by the nodes, so one node's floor alone would be the wrong bound.
/// Deletion is bounded by the teardown alone: the bench pods exit at once on SIGTERM, so
/// their grace period would only hide the agent's own time.
fn goals_table(results: &[Value]) -> String {
    if results.iter().any(|r| r["agent"] == KIND_SYSTEMD) {
        return kind_goals_table(results);
    }
    if results.iter().any(|r| r["agent"] == VM_AGENT) {
        return vm_goals_table(results);
    }
    let mut agents: Vec<&str> = results
        .iter()
        .filter(|r| ["burst", "probes", "nodes"].contains(&r["kind"].as_str().unwrap_or_default()))
        .filter_map(|r| r["agent"].as_str())
        .filter(|a| a.starts_with("rkubelet"))
        .collect();
    agents.sort_unstable();
    agents.dedup();
    if agents.is_empty() {
        return String::new();
    }
    let of = |kind: &str, agent: &str, key: (&str, Value), field: &str| {
        find(results, kind, agent, key).and_then(|r| r[field].as_f64())
    };
    let floor = |count: u64, field: &str| of("floor", "CRI floor", ("count", json!(count)), field);
    let kubelet = "kubelet QPS 50";
    let mut md = String::from("\n| goal | agent | measured | bound | |\n|---|---|---|---|---|\n");
    for agent in agents {
        if let Some(probes) = results
            .iter()
            .find(|r| r["kind"] == "probes" && r["agent"] == agent)
        {
            let ready = probes["all_ready"].as_f64();
            let count = probes["count"].as_u64().unwrap_or(0);
            let goal = format!("{count} pods with probes, all Ready (s)");
            let bound = floor(count, "all_ready").map(|f| f * 1.25);
            let how = format!(
                "1.25 × floor{}",
                ratio(ready, floor(count, "all_ready"), "floor")
            );
            goal_row(&mut md, &goal, agent, ready, bound, &how);
            let theirs = of("probes", kubelet, ("count", json!(count)), "all_ready");
            goal_row(&mut md, &goal, agent, ready, theirs, "the kubelet QPS 50's");
            goal_row(
                &mut md,
                &format!(
                    "CPU seconds, {count} pods with probes (period 1 s), {} s",
                    probes["seconds"]
                ),
                agent,
                probes["cpu_seconds"].as_f64(),
                kubelet_probes_cpu(results, probes).map(|c| c / 3.0),
                "1/3 of the kubelet's",
            );
        }
        let burst = |count: u64, field: &str| of("burst", agent, ("count", json!(count)), field);
        if results
            .iter()
            .any(|r| r["kind"] == "burst" && r["agent"] == agent)
        {
            for (count, factor) in [(30, 1.2), (100, 1.15), (110, 1.2)] {
                let ready = burst(count, "all_ready");
                goal_row(
                    &mut md,
                    &format!("{count} pods, all Ready (s)"),
                    agent,
                    ready,
                    floor(count, "all_ready").map(|f| f * factor),
                    &format!(
                        "{factor} × floor{}",
                        ratio(ready, floor(count, "all_ready"), "floor")
                    ),
                );
            }
            let p50 = |agent: &str| {
                find(results, "burst", agent, ("count", json!(100)))
                    .map(|r| percentile(&latencies(r, "ready"), 50.0))
            };
            goal_row(
                &mut md,
                "100 pods, p50 create → Ready (s)",
                agent,
                p50(agent),
                p50(kubelet).map(|p| p * 0.6),
                &format!(
                    "0.6 × the kubelet QPS 50's{}",
                    ratio(p50(agent), p50(kubelet), "its")
                ),
            );
            for count in [30, 100] {
                goal_row(
                    &mut md,
                    &format!("{count} pods deleted, all gone (s)"),
                    agent,
                    burst(count, "all_gone"),
                    floor(count, "all_gone").map(|f| f + 1.0),
                    "floor's teardown + 1 s",
                );
            }
            goal_row(
                &mut md,
                "110 pods, resident memory through start and delete, max (MB)",
                agent,
                burst(110, "rss_max_mb"),
                Some(RSS_GOAL_MB),
                "≤ 20 MB; whole MB, rounded down",
            );
        }
        for r in results
            .iter()
            .filter(|r| r["kind"] == "nodes" && r["agent"] == agent)
        {
            let nodes = r["nodes"].as_array().map_or(0, Vec::len);
            let count = r["count"].as_u64().unwrap_or(0);
            let scenario = format!("{nodes} × {count} pods at once");
            let floor = of(
                "floor",
                &format!("CRI floor, {nodes} nodes"),
                ("count", json!(count)),
                "all_ready",
            );
            let ready = r["all_ready"].as_f64();
            goal_row(
                &mut md,
                &format!("{scenario}, all Ready (s)"),
                agent,
                ready,
                floor.map(|f| f * 1.2),
                &format!(
                    "1.2 × the floor on the {nodes} nodes at once{}",
                    ratio(ready, floor, "floor")
                ),
            );
            goal_row(
                &mut md,
                &format!("{scenario}, resident memory per node, max (MB)"),
                agent,
                r["rss_max_mb"].as_f64(),
                Some(RSS_GOAL_MB),
                "≤ 20 MB on every node; whole MB, rounded down",
            );
        }
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

/// Markdown: each agent's CPU seconds and resident memory while it rotated its chatty
/// pods' logs, and the most the logs held on disk.
fn logrotate_table(results: &[Value]) -> String {
    let rows: Vec<&Value> = results
        .iter()
        .filter(|r| r["kind"] == "logrotate")
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n| scenario | agent | CPU seconds | resident memory (max / mean) | logs on disk (max) |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        md.push_str(&format!(
            "| {} pods logging {} MiB/s each, {} s | {} | {:.2} s | {} / {} MB | {} MB |\n",
            r["count"],
            r["mib_per_second"],
            r["seconds"],
            r["agent"].as_str().unwrap_or_default(),
            r["cpu_seconds"].as_f64().unwrap_or(f64::NAN),
            r["rss_max_mb"],
            r["rss_mean_mb"],
            r["logs_on_disk_max_mb"],
        ));
    }
    md
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

/// Markdown: where the machine's CPU time went from the first create until all were Ready,
/// for the bursts of 30 and more pods and their floors (the fastest concurrency), each from
/// the run closest to the median: the machine's busy time against its capacity, the control
/// plane's and the node agents' own, and the rest (the runtime, the pods, the bench).
fn machine_cpu_table(results: &[Value]) -> String {
    let mut rows: Vec<&Value> = results
        .iter()
        .filter(|r| r["machine_busy_seconds"].is_f64() && r["count"].as_u64() >= Some(30))
        .collect();
    // Of a floor run at several concurrencies, the fastest.
    rows.retain(|r| {
        r["kind"] != "floor"
            || !results.iter().any(|o| {
                o["kind"] == "floor"
                    && o["agent"] == r["agent"]
                    && o["count"] == r["count"]
                    && o["machine_busy_seconds"].is_f64()
                    && o["all_ready"].as_f64() < r["all_ready"].as_f64()
            })
    });
    if rows.is_empty() {
        return String::new();
    }
    rows.sort_by_key(|r| {
        (
            r["count"].as_u64(),
            r["kind"] != "floor",
            r["agent"].as_str().unwrap_or_default().to_owned(),
        )
    });
    let mut md = String::from(concat!(
        "\n**Where the machine's CPU goes until all are Ready** (the run closest to the median; ",
        "CPU seconds: the whole machine busy, against its CPUs × the time from the first create; ",
        "the control plane (API server, etcd, scheduler, controller manager) and the node agent ",
        "by their own; the rest is the runtime (containerd, shims, runc, CNI plugins), the pods' ",
        "processes and the bench client)\n\n",
        "| pods | agent | time | machine busy (of capacity) | control plane | node agent | runtime, pods and the rest |\n",
        "|---|---|---|---|---|---|---|\n",
    ));
    for r in rows {
        let number = |key: &str| r[key].as_f64();
        let busy = number("machine_busy_seconds").unwrap_or(f64::NAN);
        let window = number("machine_window_seconds").unwrap_or(f64::NAN);
        let cpus = number("machine_cpus").unwrap_or(f64::NAN);
        let (control_plane, agents) = (
            number("control_plane_busy_seconds"),
            number("agents_busy_seconds"),
        );
        let cell = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.2}"));
        let rest = busy - control_plane.unwrap_or(0.0) - agents.unwrap_or(0.0);
        // A burst on several nodes names them (the floor counts them).
        let nodes = r["nodes"]
            .as_array()
            .map(|n| n.len() as u64)
            .or(r["nodes"].as_u64())
            .unwrap_or(1);
        let pods = if nodes > 1 {
            format!("{nodes} × {}", r["count"])
        } else {
            r["count"].to_string()
        };
        md.push_str(&format!(
            "| {pods} | {} | {window:.2} s | {busy:.2} ({:.0} % of {cpus} CPUs) | {} | {} | {rest:.2} |\n",
            r["agent"].as_str().unwrap_or_default(),
            100.0 * busy / (cpus * window),
            cell(control_plane),
            cell(agents),
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

/// Markdown: what each endpoint monitoring reads costs each agent with its pods running:
/// the median and longest scrape through the node proxy, and the agent's CPU per scrape.
fn scrape_table(results: &[Value]) -> String {
    let rows: Vec<&Value> = results.iter().filter(|r| r["kind"] == "scrape").collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n| endpoint (pods running) | agent | scrape p50 / max | agent CPU per scrape | body |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        let Some(endpoints) = r["endpoints"].as_object() else {
            continue;
        };
        for (path, e) in endpoints {
            let agent = r["agent"].as_str().unwrap_or_default();
            if e["served"] != true {
                md.push_str(&format!(
                    "| `{path}` ({}) | {agent} | not served | — | — |\n",
                    r["count"]
                ));
                continue;
            }
            let ms = |key: &str| e[key].as_f64().unwrap_or(f64::NAN);
            #[allow(clippy::cast_precision_loss)]
            let kib = e["bytes"].as_u64().unwrap_or(0) as f64 / 1024.0;
            md.push_str(&format!(
                "| `{path}` ({}) | {agent} | {:.1} / {:.1} ms | {:.1} ms | {kib:.1} KiB |\n",
                r["count"],
                ms("scrape_ms_median"),
                ms("scrape_ms_max"),
                ms("agent_cpu_ms_per_scrape"),
            ));
        }
    }
    md
}

/// Markdown: where an rkubelet burst's time went, per step, from the agent's own spans;
/// and the start-up of the pods with probes (their deletion is a burst's).
fn breakdown_tables(dir: &Path, rows: &[&Value]) -> anyhow::Result<String> {
    let mut md = String::new();
    let largest = rows
        .iter()
        .filter(|r| r["kind"] == "burst")
        .filter_map(|r| r["count"].as_u64())
        .max();
    for r in rows.iter().filter(|r| {
        (r["kind"] == "burst" && r["count"].as_u64() == largest) || r["kind"] == "probes"
    }) {
        let agent = r["agent"].as_str().unwrap_or_default();
        let log = dir.join(format!("{agent}.log"));
        let Some(windows) = r["windows"].as_object() else {
            continue;
        };
        let probed = r["kind"] == "probes";
        for (phase, window) in windows {
            if probed && phase != "start-up" {
                continue;
            }
            // The start-up from the agent's timelines of the run's pods, when it has them;
            // otherwise (and the deletion) from the spans in its log, when the run kept it
            // (not an agent in a kind node).
            let timelines = r["startup"]["steps"]
                .as_object()
                .filter(|_| phase == "start-up");
            let (steps, source) = match timelines {
                Some(steps) => (timeline_steps(steps), "its pods' timelines"),
                None if log.exists() => (breakdown(&log, window)?, "its spans"),
                None => continue,
            };
            if steps.is_empty() {
                continue;
            }
            md.push_str(&format!(
                "\n**{agent}, {} pods{}, {phase}: per step, from {source}** (seconds; a step's calls overlap across pods)\n\n",
                r["count"],
                if probed { " with probes" } else { "" }
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

pub fn report(args: &ReportArgs) -> anyhow::Result<Value> {
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
    let ab = ab::ab_table(&results);
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
        if r["count"]
            .as_u64()
            .is_some_and(|n| [30, 100, 110].contains(&n))
        {
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
    md.push_str(&logrotate_table(&results));
    md.push_str(&nodes_table(&results));
    md.push_str(&sources_table(&results));
    md.push_str(&scrape_table(&results));
    md.push_str(&goals_table(&results));
    md.push_str(&ab);
    md.push_str(&machine_cpu_table(&results));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::merge_into;

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
        // Without the floor on the nodes at once, the start-up goal cannot be checked.
        let goals = goals_table(&merged);
        assert!(
            goals.contains(
                "| 2 × 2 pods at once, all Ready (s) | rkubelet | — | — | not measured |"
            ),
            "{goals}"
        );
        assert!(goals.contains("| 2 × 2 pods at once, resident memory per node, max (MB) | rkubelet | 30.00 | 19.00"), "{goals}");
        assert!(!goals.contains("1 pod"));
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
    fn scrape_table_has_a_row_per_endpoint_and_agent() {
        let r = json!({"kind": "scrape", "agent": "rkubelet", "count": 100, "endpoints": {
            "/configz": {"served": true, "bytes": 2048, "scrape_ms_median": 4.25,
                         "scrape_ms_max": 9.0, "agent_cpu_ms_per_scrape": 0.5},
            "/metrics/cadvisor": {"served": false},
        }});
        assert_eq!(
            scrape_table(&[r]),
            "\n| endpoint (pods running) | agent | scrape p50 / max | agent CPU per scrape | body |\n|---|---|---|---|---|\n\
             | `/configz` (100) | rkubelet | 4.2 / 9.0 ms | 0.5 ms | 2.0 KiB |\n\
             | `/metrics/cadvisor` (100) | rkubelet | not served | — | — |\n"
        );
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
        assert!(
            goals_table(&within).contains("| 3.90 | 4.00 (1/3 of the kubelet's) | met by 0.10 |")
        );
        // Without a kubelet run of the same size, there is nothing to compare with.
        let alone = merge_runs(vec![probes_run("rkubelet", 3.9, 20)]);
        assert!(goals_table(&alone).contains("| rkubelet | — | — | not measured |"));
        assert!(probes_table(&[]).is_empty());
    }

    fn burst(agent: &str, count: u64, ready: f64, gone: f64, pods: &[f64], rss: u64) -> Value {
        json!({"kind": "burst", "agent": agent, "count": count, "concurrency": null,
               "all_ready": ready, "all_gone": gone, "ready": pods, "running": pods,
               "rss_max_mb": rss})
    }

    /// An agent in a kind node: its pods' timelines in the results, no log of it in the
    /// directory.
    #[test]
    fn the_start_up_breakdown_comes_from_timelines_without_the_agents_log() {
        let dir = std::env::temp_dir().join(format!("rk-bench-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = json!({"kind": "burst", "agent": "rkubelet, kind node, systemd driver",
            "count": 30, "all_ready": 3.6, "all_gone": 2.5,
            "windows": {"start-up": ["a", "b"], "deletion": ["c", "d"]},
            "startup": {"seen_to_ready": [1.0, 2.0],
                        "steps": {"cri RunPodSandbox": [0.5, 0.7], "ensure_pod_cgroup": [0.01]}}});
        let md = breakdown_tables(&dir, &[&run]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            md.contains("**rkubelet, kind node, systemd driver, 30 pods, start-up: per step, from its pods' timelines**"),
            "{md}"
        );
        assert!(md.contains("| cri RunPodSandbox | 2 | "), "{md}");
        // The deletion's spans are in the agent's log only.
        assert!(!md.contains("deletion"), "{md}");
    }

    #[test]
    fn the_pods_with_probes_get_their_start_up_breakdown_beside_the_largest_burst() {
        let dir = std::env::temp_dir().join(format!("rk-bench-probes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = |kind: &str, count: u64| {
            json!({"kind": kind, "agent": "rkubelet", "count": count,
                "windows": {"start-up": ["a", "b"], "deletion": ["c", "d"]},
                "startup": {"seen_to_ready": [1.0, 2.0],
                            "steps": {"wait_start_slot": [0.5, 0.7]}}})
        };
        let (small, large, probes) = (row("burst", 30), row("burst", 100), row("probes", 100));
        let md = breakdown_tables(&dir, &[&small, &large, &probes]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            md.contains("**rkubelet, 100 pods, start-up: per step"),
            "{md}"
        );
        assert!(
            md.contains("**rkubelet, 100 pods with probes, start-up: per step"),
            "{md}"
        );
        assert!(!md.contains("30 pods"), "{md}");
        assert!(!md.contains("with probes, deletion"), "{md}");
    }

    #[test]
    fn the_machine_cpu_table_splits_the_busy_time_and_keeps_the_fastest_floor() {
        let machine = |mut r: Value, busy: f64, window: f64| {
            merge_into(
                &mut r,
                &json!({"machine_cpus": 2, "machine_busy_seconds": busy,
                        "machine_window_seconds": window}),
            );
            r
        };
        let mut agent = machine(burst("rkubelet", 100, 10.0, 9.0, &[10.0], 27), 18.0, 10.0);
        merge_into(
            &mut agent,
            &json!({"control_plane_busy_seconds": 2.5, "agents_busy_seconds": 0.75}),
        );
        let mut slow_floor = machine(floor("CRI floor", 100, 9.0, 7.0), 15.0, 9.0);
        slow_floor["concurrency"] = json!(20);
        let mut nodes = machine(burst("rkubelet", 110, 30.0, 20.0, &[30.0], 18), 55.0, 30.0);
        nodes["kind"] = json!("nodes");
        nodes["nodes"] = json!(["n1", "n2", "n3"]);
        let results = merge_runs(vec![
            agent,
            nodes,
            machine(floor("CRI floor", 100, 7.5, 7.0), 14.0, 7.5),
            slow_floor,
            machine(burst("rkubelet", 10, 1.0, 1.0, &[1.0], 27), 1.5, 1.0),
        ]);
        let md = machine_cpu_table(&results);
        assert!(
            md.contains(
                "| 100 | rkubelet | 10.00 s | 18.00 (90 % of 2 CPUs) | 2.50 | 0.75 | 14.75 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| 100 | CRI floor | 7.50 s | 14.00 (93 % of 2 CPUs) | — | — | 14.00 |"),
            "{md}"
        );
        // The floor first, the slower floor and the small burst left out.
        assert!(md.find("CRI floor").unwrap() < md.find("| rkubelet |").unwrap());
        assert!(!md.contains("9.00 s") && !md.contains("| 10 |"), "{md}");
        assert!(
            md.contains(
                "| 3 × 110 | rkubelet | 30.00 s | 55.00 (92 % of 2 CPUs) | — | — | 55.00 |"
            ),
            "{md}"
        );
        assert!(machine_cpu_table(&[]).is_empty());
    }

    fn floor(agent: &str, count: u64, ready: f64, gone: f64) -> Value {
        json!({"kind": "floor", "agent": agent, "count": count, "concurrency": 5,
               "all_ready": ready, "all_gone": gone, "ready": [ready], "running": []})
    }

    #[test]
    fn goals_bound_each_burst_by_its_floor_the_kubelet_and_20_mb() {
        let results = merge_runs(vec![
            floor("CRI floor", 30, 10.0, 4.0),
            floor("CRI floor", 100, 20.0, 10.0),
            floor("CRI floor", 110, 25.0, 12.0),
            floor("CRI floor, 3 nodes", 110, 50.0, 30.0),
            burst("rkubelet", 30, 11.5, 5.5, &[1.0], 15),
            burst("rkubelet", 100, 24.0, 10.5, &[2.0, 4.0, 6.0], 18),
            burst("rkubelet", 110, 30.0, 12.0, &[1.0], 20),
            burst("kubelet QPS 50", 100, 40.0, 60.0, &[5.0, 10.0, 15.0], 120),
            json!({"kind": "nodes", "agent": "rkubelet", "count": 110, "all_ready": 55.0,
                   "all_gone": 20.0, "ready": [1.0], "running": [1.0],
                   "nodes": ["a", "b", "c"], "rss_max_mb": 19, "agents": []}),
        ]);
        let goals = goals_table(&results);
        for row in [
            "| 30 pods, all Ready (s) | rkubelet | 11.50 | 12.00 (1.2 × floor; measured 1.15 × floor) | met by 0.50 |",
            "| 100 pods, all Ready (s) | rkubelet | 24.00 | 23.00 (1.15 × floor; measured 1.20 × floor) | missed by 1.00 |",
            "| 110 pods, all Ready (s) | rkubelet | 30.00 | 30.00 (1.2 × floor; measured 1.20 × floor) | met by 0.00 |",
            // p50 of 2, 4, 6 s against 0.6 × the kubelet's 10 s.
            "| 100 pods, p50 create → Ready (s) | rkubelet | 4.00 | 6.00 (0.6 × the kubelet QPS 50's; measured 0.40 × its) | met by 2.00 |",
            "| 30 pods deleted, all gone (s) | rkubelet | 5.50 | 5.00 (floor's teardown + 1 s) | missed by 0.50 |",
            "| 100 pods deleted, all gone (s) | rkubelet | 10.50 | 11.00 (floor's teardown + 1 s) | met by 0.50 |",
            "| 110 pods, resident memory through start and delete, max (MB) | rkubelet | 20.00 | 19.00 (≤ 20 MB; whole MB, rounded down) | missed by 1.00 |",
            "| 3 × 110 pods at once, all Ready (s) | rkubelet | 55.00 | 60.00 (1.2 × the floor on the 3 nodes at once; measured 1.10 × floor) | met by 5.00 |",
            "| 3 × 110 pods at once, resident memory per node, max (MB) | rkubelet | 19.00 | 19.00 (≤ 20 MB on every node; whole MB, rounded down) | met by 0.00 |",
        ] {
            assert!(goals.contains(row), "{row}\nnot in\n{goals}");
        }
        // The kubelet is compared with, not checked; no probes ran.
        assert!(!goals.contains("| kubelet QPS 50 |"));
        assert!(!goals.contains("probes"));
    }

    #[test]
    fn the_kind_layout_checks_the_systemd_driver_against_both_cgroupfs_nodes_only() {
        let results = merge_runs(vec![
            burst(HOST_CGROUPFS, 30, 3.0, 2.5, &[1.0], 15),
            burst(KIND_CGROUPFS, 30, 3.2, 2.4, &[1.0], 15),
            burst(KIND_SYSTEMD, 30, 3.4, 2.4, &[1.0], 15),
        ]);
        let goals = goals_table(&results);
        for row in [
            "| 30 pods, all Ready (s) | rkubelet, kind node, systemd driver | 3.40 | 3.30 (1.1 × the host node's, cgroupfs driver; measured 1.13 × it) | missed by 0.10 |",
            "| 30 pods, all Ready (s) | rkubelet, kind node, systemd driver | 3.40 | 3.52 (1.1 × the kind node's, cgroupfs driver; measured 1.06 × it) | met by 0.12 |",
        ] {
            assert!(goals.contains(row), "{row}\nnot in\n{goals}");
        }
        // Issue 30's goals, bounded by the host's floor, are left out.
        assert!(!goals.contains("× floor"), "{goals}");
        // The runtime alone, with each driver, when the floor ran in the kind node.
        let mut with_floors = results.clone();
        with_floors.extend(merge_runs(vec![
            floor("CRI floor, kind node, cgroupfs driver", 30, 2.0, 1.0),
            floor("CRI floor, kind node, systemd driver", 30, 2.6, 1.0),
        ]));
        assert!(
            goals_table(&with_floors).contains(
                "The runtime alone (30 sandboxes, the CRI floor in the kind node): 2.60 s with \
                 the systemd driver, 2.00 s with cgroupfs, 1.30 ×."
            ),
            "{}",
            goals_table(&with_floors)
        );
        assert_eq!(goals.lines().filter(|l| l.starts_with("| 30")).count(), 2);
    }

    #[test]
    fn the_vm_layout_bounds_its_burst_by_the_floor_in_the_same_vm() {
        let results = merge_runs(vec![
            burst(VM_AGENT, 10, 40.0, 30.0, &[1.0], 15),
            floor(VM_FLOOR, 10, 36.0, 5.0),
            floor("CRI floor", 10, 2.0, 1.0),
        ]);
        let goals = goals_table(&results);
        let row = "| 10 pods on the VM node, all Ready (s) | rkubelet, VM node, systemd driver | 40.00 | 43.20 (1.2 × the CRI floor in the same VM; measured 1.11 × floor) | met by 3.20 |";
        assert!(goals.contains(row), "{row}\nnot in\n{goals}");
        assert_eq!(
            goals.lines().filter(|l| l.starts_with("| ")).count(),
            2,
            "{goals}"
        );
    }

    #[test]
    fn probes_goals_bound_all_ready_by_the_floor_and_the_kubelet() {
        let mut ours = probes_run("rkubelet", 3.0, 20);
        ours["all_ready"] = json!(26.0);
        let mut theirs = probes_run("kubelet QPS 50", 12.0, 88);
        theirs["all_ready"] = json!(36.8);
        let results = merge_runs(vec![ours, theirs, floor("CRI floor", 100, 20.0, 10.0)]);
        let goals = goals_table(&results);
        assert!(goals.contains(
            "| 100 pods with probes, all Ready (s) | rkubelet | 26.00 | 25.00 (1.25 × floor; measured 1.30 × floor) | missed by 1.00 |"
        ), "{goals}");
        assert!(goals.contains(
            "| 100 pods with probes, all Ready (s) | rkubelet | 26.00 | 36.80 (the kubelet QPS 50's) | met by 10.80 |"
        ), "{goals}");
    }
}
