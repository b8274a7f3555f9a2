//! The kubelet's Prometheus metrics, served on `/metrics` in the text exposition format
//! (version 0.0.4), with the kubelet's names where the meaning is the same:
//!
//! - `kubelet_pod_start_duration_seconds`: from the pod's acknowledgement by the agent
//!   (its `status.startTime`) until the status first reports it `Running`;
//! - `kubelet_runtime_operations_total`, `kubelet_runtime_operations_errors_total`,
//!   `kubelet_runtime_operations_duration_seconds`: every CRI call, by `operation_type`
//!   (`run_podsandbox`, `create_container`, ...);
//! - `kubelet_pod_worker_duration_seconds`: one pod worker sync, by `operation_type`
//!   (`create`, `sync`, `kill`);
//! - `kubelet_running_pods`, `kubelet_running_containers`: read from the runtime at scrape
//!   time;
//! - `kubelet_http_requests_total`: requests to this server, by method and path.
//!
//! The recorders are process-wide (like the kubelet's registry), so that the CRI client and
//! the pod workers record with one call and no plumbing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Buckets of `kubelet_pod_start_duration_seconds`, as in the kubelet.
const POD_START_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];
/// Buckets of `kubelet_runtime_operations_duration_seconds`: exponential from 5 ms by 2.5,
/// 14 buckets, as in the kubelet.
const RUNTIME_BUCKETS: &[f64] = &[
    0.005,
    0.0125,
    0.03125,
    0.078125,
    0.1953125,
    0.48828125,
    1.220703125,
    3.0517578125,
    7.62939453125,
    19.073486328125,
    47.6837158203125,
    119.20928955078125,
    298.0232238769531,
    745.0580596923828,
];
/// Prometheus' default buckets, used by the kubelet for pod worker durations.
const DEFAULT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A histogram with fixed upper bounds; counts are per bucket, made cumulative when
/// rendered.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (ascending; `+Inf` is implied).
    #[must_use]
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one value.
    pub fn observe(&mut self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.counts[i] += 1;
        }
        self.sum += value;
        self.count += 1;
    }

    /// How many values were recorded.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, labels: &[(&str, &str)]) {
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n;
            let le = format_float(*bound);
            sample(
                out,
                &format!("{name}_bucket"),
                &with(labels, "le", &le),
                cumulative,
            );
        }
        sample(
            out,
            &format!("{name}_bucket"),
            &with(labels, "le", "+Inf"),
            self.count,
        );
        sample(out, &format!("{name}_sum"), labels, format_float(self.sum));
        sample(out, &format!("{name}_count"), labels, self.count);
    }
}

fn with<'a>(labels: &[(&'a str, &'a str)], k: &'a str, v: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut all = labels.to_vec();
    all.push((k, v));
    all
}

/// Go's `%g`-like formatting Prometheus parses: integers without a fraction.
pub(crate) fn format_float(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

/// The `method` label of a request: one of the standard HTTP methods, else `other`.
#[must_use]
pub fn method_label(method: &hyper::Method) -> &'static str {
    use hyper::Method;
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::PATCH, "PATCH"),
        (Method::DELETE, "DELETE"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::CONNECT, "CONNECT"),
        (Method::TRACE, "TRACE"),
    ];
    KNOWN
        .iter()
        .find(|(m, _)| m == method)
        .map_or("other", |(_, label)| label)
}

/// Escapes a label value: backslash, double quote and line feed.
#[must_use]
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape_label_value(v));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The kubelet's `operation_type` of a CRI RPC: `RunPodSandbox` → `run_podsandbox`,
/// `ListContainerStats` → `list_container_stats`.
#[must_use]
pub fn operation_type(rpc: &str) -> String {
    let mut out = String::with_capacity(rpc.len() + 4);
    for (i, c) in rpc.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out.replace("pod_sandbox", "podsandbox")
}

#[derive(Debug)]
struct RuntimeOperation {
    duration: Histogram,
    errors: u64,
}

/// What the runtime runs, counted at scrape time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeCounts {
    /// Pods with a ready sandbox.
    pub running_pods: u64,
    /// Containers by state (`running`, `exited`, `created`, `unknown`).
    pub containers: BTreeMap<&'static str, u64>,
}

/// The agent's metrics.
#[derive(Debug)]
pub struct Metrics {
    pod_start: Mutex<Histogram>,
    runtime: Mutex<BTreeMap<String, RuntimeOperation>>,
    pod_worker: Mutex<BTreeMap<&'static str, Histogram>>,
    http: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            pod_start: Mutex::new(Histogram::new(POD_START_BUCKETS)),
            runtime: Mutex::default(),
            pod_worker: Mutex::default(),
            http: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Metrics {
    /// Records one CRI call.
    pub fn observe_runtime_operation(&self, rpc: &str, elapsed: Duration, failed: bool) {
        let mut ops = lock(&self.runtime);
        let op = ops
            .entry(operation_type(rpc))
            .or_insert_with(|| RuntimeOperation {
                duration: Histogram::new(RUNTIME_BUCKETS),
                errors: 0,
            });
        op.duration.observe(elapsed.as_secs_f64());
        if failed {
            op.errors += 1;
        }
    }

    /// Records how long a pod took from acknowledgement to running.
    pub fn observe_pod_start(&self, elapsed: Duration) {
        lock(&self.pod_start).observe(elapsed.as_secs_f64());
    }

    /// Records one pod worker sync.
    pub fn observe_pod_worker(&self, operation: &'static str, elapsed: Duration) {
        lock(&self.pod_worker)
            .entry(operation)
            .or_insert_with(|| Histogram::new(DEFAULT_BUCKETS))
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one request to this server, by method and route. Both labels come from
    /// fixed sets (see [`method_label`]): requests are counted before they are
    /// authenticated, so nothing a caller invents may become a new series.
    pub fn count_http_request(&self, method: &'static str, path: &'static str) {
        *lock(&self.http).entry((method, path)).or_default() += 1;
    }

    /// The text exposition of every metric.
    #[must_use]
    pub fn render(&self, node_name: &str, runtime: Option<&RuntimeCounts>) -> String {
        let mut out = String::with_capacity(16 * 1024);
        header(
            &mut out,
            "kubelet_node_name",
            "gauge",
            "The node's name. The count is always 1.",
        );
        sample(&mut out, "kubelet_node_name", &[("node", node_name)], 1);

        let name = "kubelet_pod_start_duration_seconds";
        header(
            &mut out,
            name,
            "histogram",
            "Duration in seconds from the agent seeing a pod for the first time to the pod starting to run.",
        );
        lock(&self.pod_start).render(&mut out, name, &[]);

        let name = "prober_probe_total";
        header(
            &mut out,
            name,
            "counter",
            "[ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.",
        );
        crate::prober::metrics::samples(|labels, value| sample(&mut out, name, labels, value));

        let name = "kubelet_pod_worker_duration_seconds";
        header(
            &mut out,
            name,
            "histogram",
            "Duration in seconds to sync a single pod, by operation type: create, sync or kill.",
        );
        for (op, h) in lock(&self.pod_worker).iter() {
            h.render(&mut out, name, &[("operation_type", op)]);
        }

        let ops = lock(&self.runtime);
        let name = "kubelet_runtime_operations_total";
        header(
            &mut out,
            name,
            "counter",
            "Cumulative number of runtime operations by operation type.",
        );
        for (op, o) in ops.iter() {
            sample(
                &mut out,
                name,
                &[("operation_type", op)],
                o.duration.count(),
            );
        }
        let name = "kubelet_runtime_operations_errors_total";
        header(
            &mut out,
            name,
            "counter",
            "Cumulative number of runtime operation errors by operation type.",
        );
        for (op, o) in ops.iter() {
            sample(&mut out, name, &[("operation_type", op)], o.errors);
        }
        let name = "kubelet_runtime_operations_duration_seconds";
        header(
            &mut out,
            name,
            "histogram",
            "Duration in seconds of runtime operations, by operation type.",
        );
        for (op, o) in ops.iter() {
            o.duration.render(&mut out, name, &[("operation_type", op)]);
        }
        drop(ops);

        if let Some(counts) = runtime {
            let name = "kubelet_running_pods";
            header(
                &mut out,
                name,
                "gauge",
                "Number of pods that have a running pod sandbox.",
            );
            sample(&mut out, name, &[], counts.running_pods);
            let name = "kubelet_running_containers";
            header(
                &mut out,
                name,
                "gauge",
                "Number of containers currently running, by container state.",
            );
            for (state, n) in &counts.containers {
                sample(&mut out, name, &[("container_state", state)], n);
            }
        }

        let name = "kubelet_http_requests_total";
        header(
            &mut out,
            name,
            "counter",
            "Number of HTTP requests received since the server started, by method and path.",
        );
        for ((method, path), n) in lock(&self.http).iter() {
            sample(
                &mut out,
                name,
                &[
                    ("method", method),
                    ("path", path),
                    ("server_type", "readwrite"),
                ],
                n,
            );
        }
        out
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::default);

/// The process's metrics.
#[must_use]
pub fn global() -> &'static Metrics {
    &METRICS
}

/// Records one CRI call in the process's metrics (called by the CRI client).
pub fn observe_runtime_operation(rpc: &str, elapsed: Duration, failed: bool) {
    METRICS.observe_runtime_operation(rpc, elapsed, failed);
}

/// Records a pod's start latency in the process's metrics (called by the pod sync).
pub fn observe_pod_start(elapsed: Duration) {
    METRICS.observe_pod_start(elapsed);
}

/// Records one pod worker sync in the process's metrics (called by the pod workers).
pub fn observe_pod_worker(operation: &'static str, elapsed: Duration) {
    METRICS.observe_pod_worker(operation, elapsed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_types_are_the_kubelets() {
        assert_eq!(operation_type("RunPodSandbox"), "run_podsandbox");
        assert_eq!(operation_type("PodSandboxStatus"), "podsandbox_status");
        assert_eq!(operation_type("ListContainerStats"), "list_container_stats");
        assert_eq!(operation_type("Version"), "version");
        assert_eq!(operation_type("PortForward"), "port_forward");
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", &[("a", "b")]);
        assert_eq!(
            out,
            "x_bucket{a=\"b\",le=\"0.1\"} 1\n\
             x_bucket{a=\"b\",le=\"1\"} 3\n\
             x_bucket{a=\"b\",le=\"+Inf\"} 4\n\
             x_sum{a=\"b\"} 4.25\n\
             x_count{a=\"b\"} 4\n"
        );
    }

    #[test]
    fn invented_methods_share_one_series() {
        let m = Metrics::default();
        for raw in ["FOO", "BAR", "GET"] {
            let method = hyper::Method::from_bytes(raw.as_bytes()).unwrap();
            m.count_http_request(method_label(&method), "other");
        }
        let counted: Vec<_> = lock(&m.http).clone().into_iter().collect();
        assert_eq!(counted, [(("GET", "other"), 1), (("other", "other"), 2)]);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn every_family_has_help_and_type_and_parses() {
        let m = Metrics::default();
        m.observe_runtime_operation("RunPodSandbox", Duration::from_millis(300), false);
        m.observe_runtime_operation("RunPodSandbox", Duration::from_millis(10), true);
        m.observe_pod_start(Duration::from_secs(2));
        m.observe_pod_worker("sync", Duration::from_millis(40));
        m.count_http_request("GET", "/metrics");
        let counts = RuntimeCounts {
            running_pods: 2,
            containers: BTreeMap::from([("running", 3), ("exited", 1)]),
        };
        let text = m.render("n1", Some(&counts));
        assert!(
            text.contains(
                "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 2\n"
            )
        );
        assert!(text.contains(
            "kubelet_runtime_operations_errors_total{operation_type=\"run_podsandbox\"} 1\n"
        ));
        assert!(text.contains("kubelet_pod_start_duration_seconds_count 1\n"));
        assert!(text.contains("kubelet_running_pods 2\n"));
        assert!(text.contains("kubelet_running_containers{container_state=\"running\"} 3\n"));
        // Every sample belongs to a family declared by a TYPE line before it, and every
        // value is a number.
        let mut declared = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().unwrap().to_owned());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
            let name = series.split('{').next().unwrap();
            assert!(
                declared.iter().any(|d| name == d
                    || name
                        .strip_prefix(d.as_str())
                        .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))),
                "{line} has no TYPE"
            );
        }
    }
}
