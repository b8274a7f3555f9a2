//! `/metrics`: the kubelet's own metrics, as the kubelet v1.20.2 serves them where they
//! describe something rkubelet does (names, types, buckets, labels; see docs/support.md for
//! what is left out and why):
//!
//! - pod sync: `kubelet_pod_start_duration_seconds` (from the pod's acknowledgement by the
//!   agent, its `status.startTime`, until the status first reports it `Running`),
//!   `kubelet_pod_worker_duration_seconds{operation_type}` (`create`, `sync`, `kill`),
//!   `kubelet_pod_worker_start_duration_seconds`, `kubelet_containers_per_pod_count`;
//! - the runtime: `kubelet_runtime_operations_total`, `_errors_total`,
//!   `_duration_seconds{operation_type}` (every CRI call), `kubelet_run_podsandbox_*`,
//!   `kubelet_running_pods` and `kubelet_running_containers{container_state}` (read from
//!   the runtime at scrape time), the PLEG's `kubelet_pleg_relist_duration_seconds`,
//!   `_interval_seconds`, `kubelet_pleg_last_seen_seconds`, `kubelet_pleg_discard_events`;
//! - the node: `kubelet_node_name{node}`, `kubelet_node_config_error`,
//!   `kubelet_cgroup_manager_duration_seconds{operation_type}`,
//!   `kubelet_evictions{eviction_signal}`, the certificate managers' TTLs and renewal
//!   errors;
//! - volumes: `volume_manager_total_volumes{plugin_name,state}`,
//!   `storage_operation_duration_seconds`, `_errors_total`, `_status_count`, and the volume
//!   gauges of the claims ([`super::volume_metrics`]);
//! - this server: `kubelet_http_requests_total`, `_duration_seconds`,
//!   `kubelet_http_inflight_requests`; the API client: `rest_client_requests_total`,
//!   `rest_client_request_duration_seconds`;
//! - the process: `kubernetes_build_info` and the standard `process_*` series (from
//!   `/proc/self`, as client_golang's process collector reads them).
//!
//! The recorders live below, in the registry ([`crate::metrics`]), which the modules that
//! do the work write; this file puts them on one page with what is read at scrape time.
//! `prober_probe_total` is on `/metrics/probes`, as in the kubelet.

use std::collections::BTreeMap;

use prometheus_client::metrics::gauge::ConstGauge;

use crate::metrics::{Labels, Metrics, Page, Samples, Value, labels};
use crate::stats::Summary;

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

/// What a scrape reads besides the registry.
#[derive(Debug, Default)]
pub struct ScrapeTime<'a> {
    /// The node's name.
    pub node_name: &'a str,
    /// What the runtime runs (none when it did not answer).
    pub runtime: Option<&'a RuntimeCounts>,
    /// The housekeeping's last summary (for the claims' volume gauges).
    pub summary: Option<&'a Summary>,
    /// Now, in seconds since the epoch (for the certificates' TTLs).
    pub now_s: i64,
}

/// The kubelet's `/metrics` page.
#[must_use]
pub fn render(metrics: &Metrics, at: &ScrapeTime<'_>) -> String {
    let mut page = Page::default();
    process::add(&mut page);
    add_build_info(&mut page);
    add_node(&mut page, metrics, at);
    add_pods(&mut page, metrics, at.runtime);
    add_volumes(&mut page, metrics);
    add_server_and_client(&mut page, metrics);
    add_authentication(&mut page, metrics);
    super::volume_metrics::add(&mut page, at.summary);
    add_container_logs(&mut page, at.summary);
    page.render()
}

/// `kubelet_container_log_filesystem_used_bytes{uid,namespace,pod,container}`: the bytes
/// of each container's logs, as the summary has them (the kubelet's log metrics collector).
fn add_container_logs(page: &mut Page, summary: Option<&Summary>) {
    let mut samples = Samples::default();
    for pod in summary.iter().flat_map(|s| &s.pods) {
        for c in &pod.containers {
            if let Some(used) = c.logs.as_ref().and_then(|l| l.used_bytes) {
                #[allow(clippy::cast_precision_loss)] // bytes of logs
                samples.push(
                    labels([
                        ("uid", &pod.pod_ref.uid),
                        ("namespace", &pod.pod_ref.namespace),
                        ("pod", &pod.pod_ref.name),
                        ("container", &c.name),
                    ]),
                    gauge_of(used as f64),
                );
            }
        }
    }
    page.add_samples(
        "kubelet_container_log_filesystem_used_bytes",
        "[ALPHA] Bytes used by the container's logs on the filesystem.",
        samples,
    );
}

/// The authentication of the kubelet API: its client certificates' remaining lifetimes and
/// its token cache ([`crate::metrics::TokenCache`]).
fn add_authentication(page: &mut Page, metrics: &Metrics) {
    page.add(
        "apiserver_client_certificate_expiration_seconds",
        "[ALPHA] Distribution of the remaining lifetime on the certificate used to authenticate a request.",
        metrics.client_certificate_expiration.clone(),
    );
    let cache = &metrics.token_cache;
    page.add(
        "authentication_token_cache_active_fetch_count",
        "[ALPHA] ",
        cache.active_fetches.clone(),
    );
    page.add(
        "authentication_token_cache_fetch_total",
        "[ALPHA] ",
        cache.fetches.clone(),
    );
    page.add(
        "authentication_token_cache_request_duration_seconds",
        "[ALPHA] ",
        cache.request_duration.clone(),
    );
    page.add(
        "authentication_token_cache_request_total",
        "[ALPHA] ",
        cache.requests.clone(),
    );
}

fn gauge_of(value: impl Into<f64>) -> ConstGauge<f64> {
    ConstGauge::new(value.into())
}

fn one(labels: Labels, value: impl Into<f64>) -> Samples<ConstGauge<f64>> {
    Samples(vec![(labels, gauge_of(value))])
}

/// `kubernetes_build_info`: this build's version in the kubelet's labels.
fn add_build_info(page: &mut Page) {
    let version = env!("CARGO_PKG_VERSION");
    let mut parts = version.split('.');
    let major = parts.next().unwrap_or("0");
    let minor = parts.next().unwrap_or("0");
    page.add_samples(
        "kubernetes_build_info",
        "[ALPHA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
        one(
            labels([
                ("build_date", ""),
                ("compiler", "rustc"),
                ("git_commit", ""),
                ("git_tree_state", ""),
                ("git_version", &format!("v{version}")),
                ("go_version", ""),
                ("major", major),
                ("minor", minor),
                ("platform", &format!("{}/{}", std::env::consts::OS, arch())),
            ]),
            1.0,
        ),
    );
}

/// The architecture as Go names it.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn add_node(page: &mut Page, metrics: &Metrics, at: &ScrapeTime<'_>) {
    page.add_samples(
        "kubelet_node_name",
        "[ALPHA] The node's name. The count is always 1.",
        one(labels([("node", at.node_name)]), 1.0),
    );
    page.add_samples(
        "kubelet_node_config_error",
        "[ALPHA] This metric is true (1) if the node is experiencing a configuration-related error, false (0) otherwise.",
        // The configuration is read once at start-up: an error there stops the agent.
        one(Labels::new(), 0.0),
    );
    page.add(
        "kubelet_cgroup_manager_duration_seconds",
        "[ALPHA] Duration in seconds for cgroup manager operations. Broken down by method.",
        metrics.cgroup_manager.clone(),
    );
    page.add(
        "kubelet_evictions",
        "[ALPHA] Cumulative number of pod evictions by eviction signal",
        metrics.evictions.clone(),
    );
    let (client, server) = metrics.certificates.get();
    // Only for a certificate in use: the kubelet's +Inf otherwise is left out.
    #[allow(clippy::cast_precision_loss)] // seconds of a certificate's lifetime
    let ttl = |not_after: Option<i64>| {
        not_after.map_or_else(Samples::default, |t| {
            one(Labels::new(), (t - at.now_s) as f64)
        })
    };
    page.add_samples(
        "kubelet_certificate_manager_client_ttl_seconds",
        "[ALPHA] Gauge of the TTL (time-to-live) of the Kubelet's client certificate. The value is in seconds until certificate expiry (negative if already expired). If client certificate is invalid or unused, the value will be +INF.",
        ttl(client),
    );
    page.add(
        "kubelet_certificate_manager_client_expiration_renew_errors",
        "[ALPHA] Counter of certificate renewal errors.",
        metrics.client_renew_errors.clone(),
    );
    page.add_samples(
        "kubelet_certificate_manager_server_ttl_seconds",
        "[ALPHA] Gauge of the shortest TTL (time-to-live) of the Kubelet's serving certificate. The value is in seconds until certificate expiry (negative if already expired). If serving certificate is invalid or unused, the value will be +INF.",
        ttl(server),
    );
    page.add(
        "kubelet_server_expiration_renew_errors",
        "[ALPHA] Counter of certificate renewal errors.",
        metrics.server_renew_errors.clone(),
    );
}

fn add_pods(page: &mut Page, metrics: &Metrics, runtime: Option<&RuntimeCounts>) {
    page.add(
        "kubelet_pod_start_duration_seconds",
        "[ALPHA] Duration in seconds for a single pod to go from pending to running.",
        metrics.pod_start.clone(),
    );
    page.add(
        "kubelet_pod_worker_duration_seconds",
        "[ALPHA] Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
        metrics.pod_worker.clone(),
    );
    page.add(
        "kubelet_pod_worker_start_duration_seconds",
        "[ALPHA] Duration in seconds from seeing a pod to starting a worker.",
        metrics.pod_worker_start.clone(),
    );
    page.add(
        "kubelet_containers_per_pod_count",
        "[ALPHA] The number of containers per pod.",
        metrics.containers_per_pod.clone(),
    );
    page.add(
        "kubelet_runtime_operations_total",
        "[ALPHA] Cumulative number of runtime operations by operation type.",
        metrics.runtime_operations.clone(),
    );
    page.add(
        "kubelet_runtime_operations_errors_total",
        "[ALPHA] Cumulative number of runtime operation errors by operation type.",
        metrics.runtime_errors.clone(),
    );
    page.add(
        "kubelet_runtime_operations_duration_seconds",
        "[ALPHA] Duration in seconds of runtime operations. Broken down by operation type.",
        metrics.runtime_duration.clone(),
    );
    page.add(
        "kubelet_run_podsandbox_duration_seconds",
        "[ALPHA] Duration in seconds of the run_podsandbox operations. Broken down by RuntimeClass.Handler.",
        metrics.run_podsandbox_duration.clone(),
    );
    page.add(
        "kubelet_run_podsandbox_errors_total",
        "[ALPHA] Cumulative number of the run_podsandbox operation errors by RuntimeClass.Handler.",
        metrics.run_podsandbox_errors.clone(),
    );
    page.add(
        "kubelet_pleg_relist_duration_seconds",
        "[ALPHA] Duration in seconds for relisting pods in PLEG.",
        metrics.pleg_relist_duration.clone(),
    );
    page.add(
        "kubelet_pleg_relist_interval_seconds",
        "[ALPHA] Interval in seconds between relisting in PLEG.",
        metrics.pleg_relist_interval.clone(),
    );
    page.add(
        "kubelet_pleg_last_seen_seconds",
        "[ALPHA] Timestamp in seconds when PLEG was last seen active.",
        metrics.pleg_last_seen.clone(),
    );
    page.add(
        "kubelet_pleg_discard_events",
        "[ALPHA] The number of discard events in PLEG.",
        metrics.pleg_discard_events.clone(),
    );
    if let Some(counts) = runtime {
        #[allow(clippy::cast_precision_loss)] // counts of pods and containers
        let running = counts.running_pods as f64;
        page.add_samples(
            "kubelet_running_pods",
            "[ALPHA] Number of pods currently running",
            one(Labels::new(), running),
        );
        let mut containers = Samples::default();
        for (state, n) in &counts.containers {
            #[allow(clippy::cast_precision_loss)]
            containers.push(labels([("container_state", state)]), gauge_of(*n as f64));
        }
        page.add_samples(
            "kubelet_running_containers",
            "[ALPHA] Number of containers currently running",
            containers,
        );
    }
}

fn add_volumes(page: &mut Page, metrics: &Metrics) {
    let mut totals = Samples::default();
    for (plugin, state, n) in metrics.volumes.totals() {
        #[allow(clippy::cast_precision_loss)] // counts of volumes
        totals.push(
            vec![
                ("plugin_name", Value::from(plugin)),
                ("state", Value::from(state)),
            ],
            gauge_of(n as f64),
        );
    }
    page.add_samples(
        "volume_manager_total_volumes",
        "[ALPHA] Number of volumes in Volume Manager",
        totals,
    );
    page.add(
        "storage_operation_duration_seconds",
        "[ALPHA] Storage operation duration",
        metrics.storage_duration.clone(),
    );
    page.add(
        "storage_operation_errors_total",
        "[ALPHA] Storage operation errors",
        metrics.storage_errors.clone(),
    );
    page.add(
        "storage_operation_status_count",
        "[ALPHA] Storage operation return statuses count",
        metrics.storage_status.clone(),
    );
}

fn add_server_and_client(page: &mut Page, metrics: &Metrics) {
    page.add(
        "kubelet_http_requests_total",
        "[ALPHA] Number of the http requests received since the server started",
        metrics.http_requests.clone(),
    );
    page.add(
        "kubelet_http_requests_duration_seconds",
        "[ALPHA] Duration in seconds to serve http requests",
        metrics.http_duration.clone(),
    );
    page.add(
        "kubelet_http_inflight_requests",
        "[ALPHA] Number of the inflight http requests",
        metrics.http_inflight.clone(),
    );
    page.add(
        "rest_client_requests_total",
        "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
        metrics.rest_requests.clone(),
    );
    page.add(
        "rest_client_request_duration_seconds",
        "[ALPHA] Request latency in seconds. Broken down by verb and URL.",
        metrics.rest_duration.clone(),
    );
}

/// The standard process series, read from `/proc/self` as client_golang's process
/// collector reads them.
mod process {
    use super::{Labels, Page, Samples, gauge_of, one};
    use crate::metrics::PlainConstCounter;

    /// Clock ticks per second (`getconf CLK_TCK`, 100 on Linux).
    const TICKS: f64 = 100.0;

    pub(super) fn add(page: &mut Page) {
        let Ok(stat) = crate::procfs::read_pseudo_file(std::path::Path::new("/proc/self/stat"))
        else {
            return;
        };
        // Fields after the command's closing parenthesis: state is field 3.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            page.add_samples(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                Samples(vec![(
                    Labels::new(),
                    PlainConstCounter((utime + stime) / TICKS),
                )]),
            );
        }
        let limits = crate::procfs::read_pseudo_file(std::path::Path::new("/proc/self/limits"))
            .unwrap_or_default();
        if let Some(max) = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|v| v.parse::<f64>().ok())
        {
            page.add_samples(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                one(Labels::new(), max),
            );
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            #[allow(clippy::cast_precision_loss)]
            let open = dir.count() as f64;
            page.add_samples(
                "process_open_fds",
                "Number of open file descriptors.",
                one(Labels::new(), open),
            );
        }
        // The resident set (`VmRSS`, in kB: field 24 of stat is in pages).
        let rss = crate::procfs::read_pseudo_file(std::path::Path::new("/proc/self/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            });
        if let Some(kib) = rss {
            page.add_samples(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                one(Labels::new(), kib * 1024.0),
            );
        }
        if let (Some(start_ticks), Some(boot)) = (field(22), boot_time()) {
            page.add_samples(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                one(Labels::new(), boot + start_ticks / TICKS),
            );
        }
        if let Some(vsize) = field(23) {
            page.add_samples(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                one(Labels::new(), vsize),
            );
        }
        let max_address_space = limits
            .lines()
            .find(|l| l.starts_with("Max address space"))
            .and_then(|l| l.split_whitespace().nth(3))
            .map(|v| v.parse::<f64>().unwrap_or(-1.0));
        if let Some(max) = max_address_space {
            page.add_samples(
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                Samples(vec![(Labels::new(), gauge_of(max))]),
            );
        }
    }

    /// The boot time, seconds since the epoch (`btime` of `/proc/stat`).
    fn boot_time() -> Option<f64> {
        crate::procfs::read_pseudo_file(std::path::Path::new("/proc/stat"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn invented_methods_share_one_series() {
        assert_eq!(method_label(&hyper::Method::GET), "GET");
        let invented = hyper::Method::from_bytes(b"FOO").unwrap();
        assert_eq!(method_label(&invented), "other");
    }

    #[test]
    fn the_kubelets_families_with_their_types_and_labels() {
        let m: &'static Metrics = Box::leak(Box::default());
        m.observe_runtime_operation("RunPodSandbox", Duration::from_millis(300), false);
        m.observe_runtime_operation("RunPodSandbox", Duration::from_millis(10), true);
        m.pod_start.observe(2.0);
        m.pod_worker
            .get_or_create(&labels([("operation_type", "sync")]))
            .observe(0.04);
        drop(m.http_request("GET", "/metrics", false));
        m.observe_storage_operation(
            "kubernetes.io/secret",
            "volume_mount",
            Duration::from_millis(5),
            false,
        );
        m.volumes.set_pod(
            "u1",
            vec!["kubernetes.io/secret"],
            vec!["kubernetes.io/secret"],
        );
        m.certificates.set_client(1_000_100);
        let counts = RuntimeCounts {
            running_pods: 2,
            containers: BTreeMap::from([("running", 3), ("exited", 1)]),
        };
        let text = render(
            m,
            &ScrapeTime {
                node_name: "n1",
                runtime: Some(&counts),
                summary: None,
                now_s: 1_000_000,
            },
        );
        for line in [
            "# TYPE kubelet_runtime_operations_total counter\n",
            "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 2\n",
            "kubelet_runtime_operations_errors_total{operation_type=\"run_podsandbox\"} 1\n",
            "kubelet_pod_start_duration_seconds_count 1\n",
            "kubelet_running_pods 2.0\n",
            "kubelet_running_containers{container_state=\"running\"} 3.0\n",
            "kubelet_node_name{node=\"n1\"} 1.0\n",
            "kubelet_http_requests_total{method=\"GET\",path=\"/metrics\",server_type=\"readwrite\",long_running=\"false\"} 1\n",
            "kubelet_http_inflight_requests{method=\"GET\",path=\"/metrics\",server_type=\"readwrite\",long_running=\"false\"} 0\n",
            "storage_operation_duration_seconds_count{volume_plugin=\"kubernetes.io/secret\",operation_name=\"volume_mount\"} 1\n",
            "storage_operation_status_count{volume_plugin=\"kubernetes.io/secret\",operation_name=\"volume_mount\",status=\"success\"} 1\n",
            "volume_manager_total_volumes{plugin_name=\"kubernetes.io/secret\",state=\"actual_state_of_world\"} 1.0\n",
            "kubelet_certificate_manager_client_ttl_seconds 100.0\n",
            "# TYPE kubelet_evictions counter\n",
            "# TYPE process_cpu_seconds_total counter\n",
            "# TYPE process_resident_memory_bytes gauge\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
    }
}
