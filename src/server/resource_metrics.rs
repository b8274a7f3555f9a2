//! `/metrics/resource`: the kubelet's resource metrics (its
//! `metrics/collectors/resource_metrics.go`), which metrics-server reads for `kubectl top`
//! and the HorizontalPodAutoscaler. The kubelet v1.20.2's exact set: cumulative CPU time
//! in core-seconds (counters) and the memory working set in bytes (gauges) of the node,
//! of each running container (`container`, `pod`, `namespace`) and of each pod (`pod`,
//! `namespace`), each sample with the explicit timestamp of its reading, and
//! `scrape_error` (1 when the figures could not be read). `container_start_time_seconds`,
//! added by later kubelets, is not in 1.20.2's set and is left out.
//!
//! The figures are the `/stats/summary` ones ([`super::stats`]), rendered as the
//! kubelet's Prometheus registry writes them: families sorted by name, a family with no
//! sample left out, label names sorted. Written with the [`crate::metrics`] helpers
//! rather than `prometheus-client`, whose text encoder writes no sample timestamps.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use super::stats::{CpuStats, MemoryStats, Summary};
use super::text_format::{header, sample_at};

/// One sample: its labels (name order), value and timestamp in milliseconds.
type Sample = (Vec<(&'static str, String)>, f64, Option<i64>);

/// A family's name, type and help.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
}

const NODE_CPU: Family = Family {
    name: "node_cpu_usage_seconds_total",
    kind: "counter",
    help: "[ALPHA] Cumulative cpu time consumed by the node in core-seconds",
};
const NODE_MEMORY: Family = Family {
    name: "node_memory_working_set_bytes",
    kind: "gauge",
    help: "[ALPHA] Current working set of the node in bytes",
};
const CONTAINER_CPU: Family = Family {
    name: "container_cpu_usage_seconds_total",
    kind: "counter",
    help: "[ALPHA] Cumulative cpu time consumed by the container in core-seconds",
};
const CONTAINER_MEMORY: Family = Family {
    name: "container_memory_working_set_bytes",
    kind: "gauge",
    help: "[ALPHA] Current working set of the container in bytes",
};
const POD_CPU: Family = Family {
    name: "pod_cpu_usage_seconds_total",
    kind: "counter",
    help: "[ALPHA] Cumulative cpu time consumed by the pod in core-seconds",
};
const POD_MEMORY: Family = Family {
    name: "pod_memory_working_set_bytes",
    kind: "gauge",
    help: "[ALPHA] Current working set of the pod in bytes",
};
const SCRAPE_ERROR: Family = Family {
    name: "scrape_error",
    kind: "gauge",
    help: "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
};

/// Milliseconds since the epoch of an RFC 3339 time of the summary.
fn millis(time: &str) -> Option<i64> {
    time.parse::<Timestamp>().ok().map(|t| t.as_millisecond())
}

fn cpu_sample(labels: Vec<(&'static str, String)>, cpu: Option<&CpuStats>) -> Option<Sample> {
    let cpu = cpu?;
    let ns = cpu.usage_core_nano_seconds?;
    #[allow(clippy::cast_precision_loss)] // as the kubelet's float64 conversion
    let seconds = ns as f64 / 1e9;
    Some((labels, seconds, millis(&cpu.time)))
}

fn memory_sample(
    labels: Vec<(&'static str, String)>,
    memory: Option<&MemoryStats>,
) -> Option<Sample> {
    let memory = memory?;
    #[allow(clippy::cast_precision_loss)] // as the kubelet's float64 conversion
    let bytes = memory.working_set_bytes? as f64;
    Some((labels, bytes, millis(&memory.time)))
}

/// The text exposition of `summary`; `None` (the figures could not be read) is
/// `scrape_error 1` alone, as on the kubelet.
#[must_use]
pub fn render(summary: Option<&Summary>) -> String {
    let mut families: BTreeMap<&'static str, (Family, Vec<Sample>)> = BTreeMap::new();
    let mut add = |family: Family, sample: Option<Sample>| {
        let entry = families
            .entry(family.name)
            .or_insert_with(|| (family, Vec::new()));
        entry.1.extend(sample);
    };
    let scrape_error = match summary {
        None => 1.0,
        Some(summary) => {
            add(NODE_CPU, cpu_sample(Vec::new(), summary.node.cpu.as_ref()));
            add(
                NODE_MEMORY,
                memory_sample(Vec::new(), summary.node.memory.as_ref()),
            );
            for pod in &summary.pods {
                let (name, namespace) = (&pod.pod_ref.name, &pod.pod_ref.namespace);
                for c in &pod.containers {
                    let labels = vec![
                        ("container", c.name.clone()),
                        ("namespace", namespace.clone()),
                        ("pod", name.clone()),
                    ];
                    add(CONTAINER_CPU, cpu_sample(labels.clone(), c.cpu.as_ref()));
                    add(CONTAINER_MEMORY, memory_sample(labels, c.memory.as_ref()));
                }
                let labels = vec![("namespace", namespace.clone()), ("pod", name.clone())];
                add(POD_CPU, cpu_sample(labels.clone(), pod.cpu.as_ref()));
                add(POD_MEMORY, memory_sample(labels, pod.memory.as_ref()));
            }
            0.0
        }
    };
    add(SCRAPE_ERROR, Some((Vec::new(), scrape_error, None)));

    let mut out = String::with_capacity(256 + 512 * summary.map_or(0, |s| s.pods.len()));
    for (family, mut samples) in families.into_values() {
        if samples.is_empty() {
            continue;
        }
        samples.sort_by(|a, b| a.0.cmp(&b.0));
        header(&mut out, family.name, family.kind, family.help);
        for (labels, value, timestamp) in &samples {
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            sample_at(&mut out, family.name, &labels, value, *timestamp);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::stats::{ContainerStats, NodeStats, PodReference, PodStats};

    fn cpu(ns: u64) -> Option<CpuStats> {
        Some(CpuStats {
            time: "2026-11-26T12:00:00.25Z".into(),
            usage_nano_cores: None,
            usage_core_nano_seconds: Some(ns),
        })
    }

    fn memory(bytes: u64) -> Option<MemoryStats> {
        Some(MemoryStats {
            time: "2026-11-26T12:00:01Z".into(),
            available_bytes: None,
            usage_bytes: None,
            working_set_bytes: Some(bytes),
            ..Default::default()
        })
    }

    fn container(name: &str, ns: u64, bytes: u64) -> ContainerStats {
        ContainerStats {
            name: name.into(),
            start_time: String::new(),
            cpu: cpu(ns),
            memory: memory(bytes),
            ..Default::default()
        }
    }

    fn summary() -> Summary {
        Summary {
            node: NodeStats {
                node_name: "n1".into(),
                start_time: None,
                cpu: cpu(1_500_000_000_000),
                memory: memory(2 << 30),
                ..Default::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "web".into(),
                    namespace: "default".into(),
                    uid: "u1".into(),
                },
                start_time: String::new(),
                containers: vec![
                    container("side", 500_000_000, 1024),
                    container("app", 2_250_000_000, 64 << 20),
                ],
                cpu: cpu(2_750_000_000),
                memory: memory((64 << 20) + 1024),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn the_kubelets_families_sorted_with_timestamps() {
        let text = render(Some(&summary()));
        let cpu_ts = 1_795_694_400_250_i64;
        let memory_ts = cpu_ts + 750;
        let expected = format!(
            "# HELP container_cpu_usage_seconds_total [ALPHA] Cumulative cpu time consumed by the container in core-seconds\n\
             # TYPE container_cpu_usage_seconds_total counter\n\
             container_cpu_usage_seconds_total{{container=\"app\",namespace=\"default\",pod=\"web\"}} 2.25 {cpu_ts}\n\
             container_cpu_usage_seconds_total{{container=\"side\",namespace=\"default\",pod=\"web\"}} 0.5 {cpu_ts}\n\
             # HELP container_memory_working_set_bytes [ALPHA] Current working set of the container in bytes\n\
             # TYPE container_memory_working_set_bytes gauge\n\
             container_memory_working_set_bytes{{container=\"app\",namespace=\"default\",pod=\"web\"}} 67108864 {memory_ts}\n\
             container_memory_working_set_bytes{{container=\"side\",namespace=\"default\",pod=\"web\"}} 1024 {memory_ts}\n\
             # HELP node_cpu_usage_seconds_total [ALPHA] Cumulative cpu time consumed by the node in core-seconds\n\
             # TYPE node_cpu_usage_seconds_total counter\n\
             node_cpu_usage_seconds_total 1500 {cpu_ts}\n\
             # HELP node_memory_working_set_bytes [ALPHA] Current working set of the node in bytes\n\
             # TYPE node_memory_working_set_bytes gauge\n\
             node_memory_working_set_bytes 2147483648 {memory_ts}\n\
             # HELP pod_cpu_usage_seconds_total [ALPHA] Cumulative cpu time consumed by the pod in core-seconds\n\
             # TYPE pod_cpu_usage_seconds_total counter\n\
             pod_cpu_usage_seconds_total{{namespace=\"default\",pod=\"web\"}} 2.75 {cpu_ts}\n\
             # HELP pod_memory_working_set_bytes [ALPHA] Current working set of the pod in bytes\n\
             # TYPE pod_memory_working_set_bytes gauge\n\
             pod_memory_working_set_bytes{{namespace=\"default\",pod=\"web\"}} 67109888 {memory_ts}\n\
             # HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n\
             # TYPE scrape_error gauge\n\
             scrape_error 0\n"
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn a_prometheus_parser_reads_types_and_timestamps() {
        let text = render(Some(&summary()));
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .expect("Prometheus text");
        assert_eq!(scrape.samples.len(), 9);
        let app = scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == "container_cpu_usage_seconds_total"
                    && s.labels.get("container") == Some("app")
            })
            .expect("the app container's CPU");
        assert!(
            matches!(app.value, prometheus_parse::Value::Counter(v) if (v - 2.25).abs() < 1e-9)
        );
        assert_eq!(app.timestamp.timestamp_millis(), 1_795_694_400_250);
        assert_eq!(
            scrape.docs["scrape_error"],
            "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise"
        );
    }

    #[test]
    fn a_failed_reading_is_a_scrape_error_alone() {
        assert_eq!(
            render(None),
            "# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n\
             # TYPE scrape_error gauge\n\
             scrape_error 1\n"
        );
    }

    #[test]
    fn figures_not_read_leave_their_family_out() {
        let mut s = summary();
        s.pods.clear();
        s.node.memory = None;
        let text = render(Some(&s));
        assert!(
            !text.contains("container_") && !text.contains("pod_"),
            "{text}"
        );
        assert!(!text.contains("node_memory_working_set_bytes"), "{text}");
        assert!(
            text.contains("node_cpu_usage_seconds_total 1500 "),
            "{text}"
        );
    }
}
