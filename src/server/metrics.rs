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
//! The recorders live below, in the registry ([`crate::metrics`]), which the CRI client and
//! the pod workers write; this file only renders it ([`Exposition`]) with what the runtime
//! runs at scrape time. `prober_probe_total` is on `/metrics/probes`, as in the kubelet.

use std::collections::BTreeMap;

use crate::lock::lock;
use crate::metrics::{Metrics, header, sample};

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

/// What the runtime runs, counted at scrape time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeCounts {
    /// Pods with a ready sandbox.
    pub running_pods: u64,
    /// Containers by state (`running`, `exited`, `created`, `unknown`).
    pub containers: BTreeMap<&'static str, u64>,
}

/// The text exposition of the registry, as `/metrics` serves it.
pub trait Exposition {
    /// The text exposition of every metric.
    #[must_use]
    fn render(&self, node_name: &str, runtime: Option<&RuntimeCounts>) -> String;
}

impl Exposition for Metrics {
    fn render(&self, node_name: &str, runtime: Option<&RuntimeCounts>) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
