//! The kubelet's metrics registry (the recording side of the kubelet's `pkg/kubelet/metrics`
//! and of the metrics its other packages register: the PLEG, the pod workers, the cgroup
//! manager, the volume manager and its operations, the eviction manager, the certificate
//! managers, the HTTP server and the API client), process-wide so that each of those
//! records with one call and no plumbing; and the exposition the `/metrics` and
//! `/metrics/probes` pages are written with, by `prometheus-client` (the Prometheus
//! project's Rust client). The kubelet's names, types, buckets and labels. It must not know
//! who serves it: the kubelet API server renders its pages ([`crate::server`]).
//!
//! The wire format is the kubelet v1.20's: the text format 0.0.4 ([`CONTENT_TYPE`]) to every
//! client, whatever it asks for. Its `promhttp` handler is built without OpenMetrics, so it
//! negotiates only between that text and protobuf (which no scraper asks for unless told
//! to, and rkubelet does not offer); Prometheus, which asks for OpenMetrics first, gets the
//! text from the kubelet too, and so the same series (`le="1"`, not OpenMetrics' `1.0`).
//! `prometheus-client` writes OpenMetrics; three things make its text the kubelet's:
//! - a counter is registered under its full name (`kubelet_runtime_operations_total`,
//!   `kubelet_evictions`) as a [`PlainCounter`] or [`PlainConstCounter`], typed `counter`
//!   and written under that name, where the library would name the family without
//!   `_total` and append it to the samples;
//! - the page is encoded without OpenMetrics' `# EOF`;
//! - a bucket's `le` is written as Go writes a float (`1`, not `1.0`).
//!
//! Help texts are written as given ([`Page`] encodes its families itself, where the
//! library's registry would end them with a full stop). What it cannot do: give a sample
//! its own timestamp (so `/metrics/cadvisor` and `/metrics/resource`, whose samples carry
//! the time of their reading as the kubelet's do, are written by hand by the server).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
    MetricEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

use crate::lock::lock;

/// The content type of every page: the text format 0.0.4, as client_golang's `FmtText`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Prometheus' default buckets (client_golang's `DefBuckets`), which most kubelet
/// histograms use.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Buckets of `storage_operation_duration_seconds` (the kubelet's volume util).
const STORAGE_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];
/// Buckets of `rest_client_request_duration_seconds` (client-go's, exponential from 1 ms
/// by 2, 10 buckets).
const REST_CLIENT_BUCKETS: [f64; 10] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512,
];
/// Buckets of `apiserver_client_certificate_expiration_seconds` (the API server library's
/// x509 authenticator: 0, 30 min, 1 h, 2 h, 6 h, 12 h, 1, 2, 4, 7, 30, 90, 180, 360 days).
const CERTIFICATE_EXPIRATION_BUCKETS: [f64; 14] = [
    0.0,
    1800.0,
    3600.0,
    7200.0,
    21600.0,
    43200.0,
    86400.0,
    172_800.0,
    345_600.0,
    604_800.0,
    2_592_000.0,
    7_776_000.0,
    15_552_000.0,
    31_104_000.0,
];

/// A label value. Cheap to clone: the same value is in many samples of a page.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(Arc<str>);

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Self(v.into())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Self(v.into())
    }
}

impl EncodeLabelValue for Value {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        // The text encoder escapes what it is given (backslash, double quote, line feed).
        encoder.write_str(&self.0)
    }
}

/// A sample's labels, in the order they are written.
pub type Labels = Vec<(&'static str, Value)>;

/// Labels from pairs of names and values.
#[must_use]
pub fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs
        .into_iter()
        .map(|(k, v)| (k, Value::from(v)))
        .collect()
}

/// A counter written under the name it is registered with, the kubelet's full name
/// (`kubelet_runtime_operations_total`, `kubelet_evictions`), typed `counter`.
#[derive(Debug, Clone, Default)]
pub struct PlainCounter(Counter);

impl PlainCounter {
    /// Counts one.
    pub fn inc(&self) {
        self.0.inc();
    }

    /// The count.
    #[must_use]
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

impl TypedMetric for PlainCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for PlainCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // As a gauge is written: the name as registered, no suffix.
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A counter's value read at scrape time (`process_cpu_seconds_total`, a probe's count),
/// written as a [`PlainCounter`] is.
#[derive(Debug, Clone, Copy)]
pub struct PlainConstCounter<N = f64>(pub N);

impl<N> TypedMetric for PlainConstCounter<N> {
    const TYPE: MetricType = MetricType::Counter;
}

impl<N: EncodeGaugeValue + std::fmt::Debug + Send + Sync> EncodeMetric for PlainConstCounter<N> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// Samples read at scrape time: a family of constant metrics.
#[derive(Debug)]
pub struct Samples<M>(pub Vec<(Labels, M)>);

impl<M> Default for Samples<M> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<M> Samples<M> {
    /// Adds one sample.
    pub fn push(&mut self, labels: Labels, metric: M) {
        self.0.push((labels, metric));
    }
}

impl<M: EncodeMetric + TypedMetric> EncodeMetric for Samples<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // One sample without labels is written without `{}` after its name.
        if let [(labels, metric)] = self.0.as_slice()
            && labels.is_empty()
        {
            return metric.encode(encoder);
        }
        for (labels, metric) in &self.0 {
            metric.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

/// One page: families in the order they are added, each written with its name and help as
/// given; a family of [`Samples`] with none is left out, as client_golang leaves it.
#[derive(Debug, Default)]
pub struct Page(Vec<(&'static str, &'static str, Box<dyn Metric>)>);

impl Page {
    /// Adds a family.
    pub fn add(&mut self, name: &'static str, help: &'static str, metric: impl Metric) {
        self.0.push((name, help, Box::new(metric)));
    }

    /// Adds a family of samples read now, unless there is none.
    pub fn add_samples<M>(&mut self, name: &'static str, help: &'static str, samples: Samples<M>)
    where
        Samples<M>: Metric,
    {
        if !samples.0.is_empty() {
            self.add(name, help, samples);
        }
    }

    /// The page in the text format 0.0.4.
    #[must_use]
    pub fn render(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::with_capacity(16 * 1024);
        // Writing to a String does not fail; a metric's encoder could only fail on it.
        if prometheus_client::encoding::text::encode_registry(&mut out, &registry).is_err() {
            out.clear();
        }
        go_bucket_bounds(&out)
    }
}

/// `text` with each bucket's `le` as Go writes a float ([`go_float`]: `1`, `2.592e+06`)
/// where `prometheus-client` writes OpenMetrics' canonical form (`1.0`, `2592000.0`), so
/// that both agents' buckets are the same series. The library writes `le` as a bucket's
/// first label: `name_bucket{le="1.0",...} 3`.
fn go_bucket_bounds(text: &str) -> String {
    const LE: &str = "_bucket{le=\"";
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let bound = line.split_once(LE).and_then(|(name, rest)| {
            let start = name.len() + LE.len();
            let end = start + rest.find('"')?;
            let value: f64 = line[start..end].parse().ok()?;
            (!name.contains(['{', ' ', '#'])).then_some((start, end, value))
        });
        match bound {
            Some((start, end, value)) => {
                out.push_str(&line[..start]);
                out.push_str(&go_float(value));
                out.push_str(&line[end..]);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// `v` as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it, as client_golang writes a
/// bucket's bound: the shortest digits that read back as `v`, in exponent form (at least
/// two digits) when the exponent is below -4 or at least 6.
#[must_use]
pub fn go_float(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    if v == 0.0 || v.is_nan() {
        return if v.is_nan() { "NaN" } else { "0" }.to_owned();
    }
    // Rust's `{:e}` gives the same shortest digits: `2.592e6`, `-5e-3`.
    let scientific = format!("{v:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits = mantissa.replace('.', "");
    if !(-4..6).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let point = if rest.is_empty() { "" } else { "." };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{first}{point}{rest}e{exp_sign}{:02}", exponent.abs());
    }
    let nd = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    let point = exponent + 1;
    let fixed = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point >= nd {
        format!(
            "{digits}{}",
            "0".repeat((point - nd).unsigned_abs() as usize)
        )
    } else {
        let (int, frac) = digits.split_at(point.unsigned_abs() as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{fixed}")
}

impl Collector for Page {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, metric) in &self.0 {
            let metric_encoder =
                encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(metric_encoder)?;
        }
        Ok(())
    }
}

/// A family of histograms with fixed buckets.
pub type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

fn runtime_histogram() -> Histogram {
    // Exponential from 5 ms by 2.5, 14 buckets, as the kubelet's.
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

fn storage_histogram() -> Histogram {
    Histogram::new(STORAGE_BUCKETS)
}

fn rest_client_histogram() -> Histogram {
    Histogram::new(REST_CLIENT_BUCKETS)
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

/// The volumes of the pods the volume manager holds, by plugin: those it should have
/// (desired) and those it set up (actual), per pod UID.
#[derive(Debug, Default)]
pub struct VolumeCounts(Mutex<HashMap<String, PodVolumePlugins>>);

/// A pod's volume plugins: (desired, actual).
type PodVolumePlugins = (Vec<&'static str>, Vec<&'static str>);

impl VolumeCounts {
    /// The plugins of `uid`'s volumes: the ones wanted, and the ones set up.
    pub fn set_pod(&self, uid: &str, desired: Vec<&'static str>, actual: Vec<&'static str>) {
        lock(&self.0).insert(uid.to_owned(), (desired, actual));
    }

    /// The plugins of the volumes set up for `uid`.
    #[must_use]
    pub fn plugins_of(&self, uid: &str) -> Vec<&'static str> {
        lock(&self.0)
            .get(uid)
            .map(|(_, actual)| actual.clone())
            .unwrap_or_default()
    }

    /// `uid`'s volumes are gone.
    pub fn forget_pod(&self, uid: &str) {
        lock(&self.0).remove(uid);
    }

    /// `volume_manager_total_volumes`: counts by plugin and state, sorted.
    #[must_use]
    pub fn totals(&self) -> Vec<(&'static str, &'static str, u64)> {
        let mut counts: std::collections::BTreeMap<(&'static str, &'static str), u64> =
            std::collections::BTreeMap::new();
        for (desired, actual) in lock(&self.0).values() {
            for plugin in desired {
                *counts
                    .entry((*plugin, "desired_state_of_world"))
                    .or_default() += 1;
            }
            for plugin in actual {
                *counts
                    .entry((*plugin, "actual_state_of_world"))
                    .or_default() += 1;
            }
        }
        counts
            .into_iter()
            .map(|((plugin, state), n)| (plugin, state, n))
            .collect()
    }
}

/// When the certificates in use expire (seconds since the epoch), for the TTL gauges.
#[derive(Debug, Default)]
pub struct CertificateExpiry {
    client: Mutex<Option<i64>>,
    server: Mutex<Option<i64>>,
}

impl CertificateExpiry {
    /// The client certificate now in use expires at `not_after`.
    pub fn set_client(&self, not_after: i64) {
        *lock(&self.client) = Some(not_after);
    }

    /// The serving certificate now in use expires at `not_after`.
    pub fn set_server(&self, not_after: i64) {
        *lock(&self.server) = Some(not_after);
    }

    /// (client, server) expiry, where known.
    #[must_use]
    pub fn get(&self) -> (Option<i64>, Option<i64>) {
        (*lock(&self.client), *lock(&self.server))
    }
}

/// The agent's metrics: live instruments, written to by the code that does the work.
#[derive(Debug)]
pub struct Metrics {
    /// `kubelet_pod_start_duration_seconds`.
    pub pod_start: Histogram,
    /// `kubelet_pod_worker_duration_seconds{operation_type}`.
    pub pod_worker: HistogramFamily,
    /// `kubelet_pod_worker_start_duration_seconds`.
    pub pod_worker_start: Histogram,
    /// `kubelet_containers_per_pod_count`.
    pub containers_per_pod: Histogram,
    /// `kubelet_runtime_operations_total{operation_type}`.
    pub runtime_operations: Family<Labels, PlainCounter>,
    /// `kubelet_runtime_operations_errors_total{operation_type}`.
    pub runtime_errors: Family<Labels, PlainCounter>,
    /// `kubelet_runtime_operations_duration_seconds{operation_type}`.
    pub runtime_duration: HistogramFamily,
    /// `kubelet_run_podsandbox_duration_seconds{runtime_handler}`.
    pub run_podsandbox_duration: HistogramFamily,
    /// `kubelet_run_podsandbox_errors_total{runtime_handler}`.
    pub run_podsandbox_errors: Family<Labels, PlainCounter>,
    /// `kubelet_cgroup_manager_duration_seconds{operation_type}`.
    pub cgroup_manager: HistogramFamily,
    /// `kubelet_pleg_relist_duration_seconds`.
    pub pleg_relist_duration: Histogram,
    /// `kubelet_pleg_relist_interval_seconds`.
    pub pleg_relist_interval: Histogram,
    /// `kubelet_pleg_last_seen_seconds`.
    pub pleg_last_seen: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `kubelet_pleg_discard_events`.
    pub pleg_discard_events: PlainCounter,
    /// `kubelet_evictions{eviction_signal}`.
    pub evictions: Family<Labels, PlainCounter>,
    /// `kubelet_http_requests_total{method,path,server_type,long_running}`.
    pub http_requests: Family<Labels, PlainCounter>,
    /// `kubelet_http_requests_duration_seconds{method,path,server_type,long_running}`.
    pub http_duration: HistogramFamily,
    /// `kubelet_http_inflight_requests{method,path,server_type,long_running}`.
    pub http_inflight: Family<Labels, Gauge>,
    /// `storage_operation_duration_seconds{volume_plugin,operation_name}`.
    pub storage_duration: HistogramFamily,
    /// `storage_operation_errors_total{volume_plugin,operation_name}`.
    pub storage_errors: Family<Labels, PlainCounter>,
    /// `storage_operation_status_count{volume_plugin,operation_name,status}`.
    pub storage_status: Family<Labels, PlainCounter>,
    /// `volume_manager_total_volumes{plugin_name,state}`, counted at scrape time.
    pub volumes: VolumeCounts,
    /// `rest_client_requests_total{code,host,method}`.
    pub rest_requests: Family<Labels, PlainCounter>,
    /// `rest_client_request_duration_seconds{url,verb}`.
    pub rest_duration: HistogramFamily,
    /// `kubelet_certificate_manager_client_expiration_renew_errors`.
    pub client_renew_errors: PlainCounter,
    /// `kubelet_server_expiration_renew_errors`.
    pub server_renew_errors: PlainCounter,
    /// The certificates' expiry, for `kubelet_certificate_manager_{client,server}_ttl_seconds`.
    pub certificates: CertificateExpiry,
    /// `apiserver_client_certificate_expiration_seconds`: the remaining lifetime of each
    /// request's client certificate.
    pub client_certificate_expiration: Histogram,
    /// The bearer token cache of the kubelet API's authentication.
    pub token_cache: TokenCache,
}

/// The API server library's token cache metrics, which the kubelet's webhook token
/// authentication registers: `authentication_token_cache_request_total{status}` and
/// `_request_duration_seconds{status}` (each token looked up: `hit` or `miss`),
/// `_fetch_total{status}` (each review: `ok`, even when it refuses the token, or `error`),
/// `_active_fetch_count{status}` (reviews `in_flight`, and lookups `blocked` waiting for
/// one's turn).
#[derive(Debug)]
pub struct TokenCache {
    /// `authentication_token_cache_request_total{status}`.
    pub requests: Family<Labels, PlainCounter>,
    /// `authentication_token_cache_request_duration_seconds{status}`.
    pub request_duration: HistogramFamily,
    /// `authentication_token_cache_fetch_total{status}`.
    pub fetches: Family<Labels, PlainCounter>,
    /// `authentication_token_cache_active_fetch_count{status}`.
    pub active_fetches: Family<Labels, Gauge>,
}

impl Default for TokenCache {
    fn default() -> Self {
        let active_fetches: Family<Labels, Gauge> = Family::default();
        // Both series exist from the start, as the library's gauges do.
        for status in ["blocked", "in_flight"] {
            drop(active_fetches.get_or_create(&labels([("status", status)])));
        }
        Self {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(default_histogram),
            fetches: Family::default(),
            active_fetches,
        }
    }
}

/// One of the token cache's active fetch gauges, held up while it is alive.
#[derive(Debug)]
pub struct ActiveFetch(Gauge);

impl Drop for ActiveFetch {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl TokenCache {
    /// Counts one lookup, a hit or a miss, that took `elapsed` (in whole milliseconds, as
    /// the library records it).
    pub fn observe_request(&self, hit: bool, elapsed: Duration) {
        let status = labels([("status", if hit { "hit" } else { "miss" })]);
        self.requests.get_or_create(&status).inc();
        #[allow(clippy::cast_precision_loss)] // milliseconds of a lookup
        self.request_duration
            .get_or_create(&status)
            .observe(elapsed.as_millis() as f64 / 1000.0);
    }

    /// Counts one review of a token by the API server, answered or failed.
    pub fn count_fetch(&self, answered: bool) {
        let status = labels([("status", if answered { "ok" } else { "error" })]);
        self.fetches.get_or_create(&status).inc();
    }

    /// A lookup waiting for its turn to review (`blocked`) or a review under way
    /// (`in_flight`), counted until dropped.
    #[must_use]
    pub fn active(&self, in_flight: bool) -> ActiveFetch {
        let status = labels([("status", if in_flight { "in_flight" } else { "blocked" })]);
        let gauge = self.active_fetches.get_or_create(&status).clone();
        gauge.inc();
        ActiveFetch(gauge)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            pod_start: default_histogram(),
            pod_worker: Family::new_with_constructor(default_histogram),
            pod_worker_start: default_histogram(),
            containers_per_pod: default_histogram(),
            runtime_operations: Family::default(),
            runtime_errors: Family::default(),
            runtime_duration: Family::new_with_constructor(runtime_histogram),
            run_podsandbox_duration: Family::new_with_constructor(default_histogram),
            run_podsandbox_errors: Family::default(),
            cgroup_manager: Family::new_with_constructor(default_histogram),
            pleg_relist_duration: default_histogram(),
            pleg_relist_interval: default_histogram(),
            pleg_last_seen: Gauge::default(),
            pleg_discard_events: PlainCounter::default(),
            evictions: Family::default(),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(default_histogram),
            http_inflight: Family::default(),
            storage_duration: Family::new_with_constructor(storage_histogram),
            storage_errors: Family::default(),
            storage_status: Family::default(),
            volumes: VolumeCounts::default(),
            rest_requests: Family::default(),
            rest_duration: Family::new_with_constructor(rest_client_histogram),
            client_renew_errors: PlainCounter::default(),
            server_renew_errors: PlainCounter::default(),
            certificates: CertificateExpiry::default(),
            client_certificate_expiration: Histogram::new(CERTIFICATE_EXPIRATION_BUCKETS),
            token_cache: TokenCache::default(),
        }
    }
}

/// The labels of an HTTP request to the kubelet API.
fn http_labels(method: &'static str, path: &'static str, long_running: bool) -> Labels {
    labels([
        ("method", method),
        ("path", path),
        ("server_type", "readwrite"),
        ("long_running", if long_running { "true" } else { "false" }),
    ])
}

/// A request to the kubelet API being served: in flight until dropped, then counted with
/// its duration.
#[derive(Debug)]
pub struct HttpRequest {
    labels: Labels,
    started: std::time::Instant,
    metrics: &'static Metrics,
}

impl Drop for HttpRequest {
    fn drop(&mut self) {
        self.metrics.http_inflight.get_or_create(&self.labels).dec();
        self.metrics
            .http_duration
            .get_or_create(&self.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Metrics {
    /// Records one CRI call.
    pub fn observe_runtime_operation(&self, rpc: &str, elapsed: Duration, failed: bool) {
        let labels = vec![("operation_type", Value::from(operation_type(rpc)))];
        self.runtime_operations.get_or_create(&labels).inc();
        self.runtime_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if failed {
            self.runtime_errors.get_or_create(&labels).inc();
        }
        if rpc == "RunPodSandbox" {
            // The default runtime handler: rkubelet asks for no RuntimeClass's.
            let handler = labels_of_handler();
            self.run_podsandbox_duration
                .get_or_create(&handler)
                .observe(elapsed.as_secs_f64());
            if failed {
                self.run_podsandbox_errors.get_or_create(&handler).inc();
            }
        }
    }

    /// Counts one request to the kubelet API, by method and route, in flight until the
    /// answer is dropped. Both labels come from fixed sets (see the server's
    /// `method_label`): requests are counted before they are authenticated, so nothing a
    /// caller invents may become a new series.
    #[must_use]
    pub fn http_request(
        &'static self,
        method: &'static str,
        path: &'static str,
        long_running: bool,
    ) -> HttpRequest {
        let labels = http_labels(method, path, long_running);
        self.http_requests.get_or_create(&labels).inc();
        self.http_inflight.get_or_create(&labels).inc();
        HttpRequest {
            labels,
            started: std::time::Instant::now(),
            metrics: self,
        }
    }

    /// Records one storage operation (`volume_mount`, `volume_unmount`, ...) of a volume
    /// plugin (`kubernetes.io/secret`, ...).
    pub fn observe_storage_operation(
        &self,
        plugin: &'static str,
        operation: &'static str,
        elapsed: Duration,
        failed: bool,
    ) {
        let operation_labels = labels([("volume_plugin", plugin), ("operation_name", operation)]);
        if failed {
            self.storage_errors.get_or_create(&operation_labels).inc();
        } else {
            self.storage_duration
                .get_or_create(&operation_labels)
                .observe(elapsed.as_secs_f64());
        }
        let status = labels([
            ("volume_plugin", plugin),
            ("operation_name", operation),
            ("status", if failed { "fail-unknown" } else { "success" }),
        ]);
        self.storage_status.get_or_create(&status).inc();
    }

    /// Records one request of the API client.
    pub fn observe_rest_request(
        &self,
        method: &str,
        host: &str,
        url: &str,
        code: &str,
        elapsed: Duration,
    ) {
        self.rest_requests
            .get_or_create(&labels([
                ("code", code),
                ("host", host),
                ("method", method),
            ]))
            .inc();
        self.rest_duration
            .get_or_create(&labels([("url", url), ("verb", method)]))
            .observe(elapsed.as_secs_f64());
    }
}

fn labels_of_handler() -> Labels {
    labels([("runtime_handler", "")])
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
    METRICS.pod_start.observe(elapsed.as_secs_f64());
}

/// Records one pod worker sync in the process's metrics (called by the pod workers).
pub fn observe_pod_worker(operation: &'static str, elapsed: Duration) {
    METRICS
        .pod_worker
        .get_or_create(&labels([("operation_type", operation)]))
        .observe(elapsed.as_secs_f64());
}

/// Records how long a new pod waited for its worker to start (called by the pod workers).
pub fn observe_pod_worker_start(elapsed: Duration) {
    METRICS.pod_worker_start.observe(elapsed.as_secs_f64());
}

/// Records the number of containers of a new pod (called by the pod workers).
pub fn observe_containers_per_pod(containers: usize) {
    #[allow(clippy::cast_precision_loss)] // a pod's containers
    METRICS.containers_per_pod.observe(containers as f64);
}

/// Records one eviction by its signal (`memory.available`, ...) (called by the eviction
/// manager).
pub fn count_eviction(signal: &str) {
    METRICS
        .evictions
        .get_or_create(&labels([("eviction_signal", signal)]))
        .inc();
}

/// Records the duration of one cgroup manager operation (`create`, `update`, `destroy`).
pub fn observe_cgroup_manager(operation: &'static str, elapsed: Duration) {
    METRICS
        .cgroup_manager
        .get_or_create(&labels([("operation_type", operation)]))
        .observe(elapsed.as_secs_f64());
}

/// Records one PLEG relist: how long it took, the interval since the one before (if any),
/// and when it ended (seconds since the epoch).
pub fn observe_pleg_relist(duration: Duration, interval: Option<Duration>, at_epoch_s: f64) {
    METRICS.pleg_relist_duration.observe(duration.as_secs_f64());
    if let Some(interval) = interval {
        METRICS.pleg_relist_interval.observe(interval.as_secs_f64());
    }
    METRICS.pleg_last_seen.set(at_epoch_s);
}

/// The client certificate (`serving` false) or the serving one now in use expires at
/// `not_after_s` (seconds since the epoch) (called by the certificate managers).
pub fn certificate_in_use(serving: bool, not_after_s: i64) {
    if serving {
        METRICS.certificates.set_server(not_after_s);
    } else {
        METRICS.certificates.set_client(not_after_s);
    }
}

/// Records the remaining lifetime of a request's verified client certificate, which
/// expires at `not_after_s` (seconds since the epoch) (called by the kubelet API server).
pub fn observe_client_certificate(not_after_s: i64) {
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    #[allow(clippy::cast_precision_loss)] // seconds of a certificate's lifetime
    METRICS
        .client_certificate_expiration
        .observe((not_after_s - now_s) as f64);
}

/// Counts one failed renewal of the client (`serving` false) or serving certificate.
pub fn count_certificate_renew_error(serving: bool) {
    if serving {
        METRICS.server_renew_errors.inc();
    } else {
        METRICS.client_renew_errors.inc();
    }
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
    fn a_page_is_the_text_format_with_names_helps_types_and_escaped_labels_as_given() {
        let counter = PlainCounter::default();
        counter.inc();
        let histogram = Histogram::new([0.1, 1.0, 2.5]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            histogram.observe(v);
        }
        let mut gauges = Samples::default();
        gauges.push(
            labels([("a", "x\"y\\z\nw,le=\"1.0\"}")]),
            prometheus_client::metrics::gauge::ConstGauge::new(2.5),
        );
        let family: HistogramFamily = Family::new_with_constructor(default_histogram);
        family
            .get_or_create(&labels([("url", "/le=\"1.0\"}")]))
            .observe(0.2);
        let mut page = Page::default();
        page.add("kubelet_evictions", "[ALPHA] Evictions", counter);
        page.add("h_seconds", "A histogram", histogram);
        page.add_samples("g", "A gauge", gauges);
        page.add_samples(
            "empty",
            "No samples",
            Samples::<prometheus_client::metrics::gauge::ConstGauge>::default(),
        );
        page.add("f_seconds", "A family", family);
        let text = page.render();
        assert!(
            text.starts_with(
                "# HELP kubelet_evictions [ALPHA] Evictions\n\
                 # TYPE kubelet_evictions counter\n\
                 kubelet_evictions 1\n\
                 # HELP h_seconds A histogram\n\
                 # TYPE h_seconds histogram\n\
                 h_seconds_sum 4.25\n\
                 h_seconds_count 4\n\
                 h_seconds_bucket{le=\"0.1\"} 1\n\
                 h_seconds_bucket{le=\"1\"} 3\n\
                 h_seconds_bucket{le=\"2.5\"} 3\n\
                 h_seconds_bucket{le=\"+Inf\"} 4\n\
                 # HELP g A gauge\n\
                 # TYPE g gauge\n\
                 g{a=\"x\\\"y\\\\z\\nw,le=\\\"1.0\\\"}\"} 2.5\n\
                 # HELP f_seconds A family\n\
                 # TYPE f_seconds histogram\n"
            ),
            "{text}"
        );
        // A label value that looks like a bound is left alone; the bound is rewritten.
        assert!(
            text.contains("f_seconds_bucket{le=\"1\",url=\"/le=\\\"1.0\\\"}\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn floats_as_go_writes_them() {
        for (v, go) in [
            (1.0, "1"),
            (0.005, "0.005"),
            (2.5, "2.5"),
            (1800.0, "1800"),
            (604_800.0, "604800"),
            (2_592_000.0, "2.592e+06"),
            (124_416_000.0, "1.24416e+08"),
            (1e-5, "1e-05"),
            (9.999_999_999_999_999e-6, "9.999999999999999e-06"),
            (0.0001, "0.0001"),
            (745.058_059_692_382_8, "745.0580596923828"),
            (100_000.0, "100000"),
            (0.0, "0"),
            (-0.25, "-0.25"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(go_float(v), go, "{v}");
        }
    }

    #[test]
    fn counters_are_written_under_their_full_names() {
        let family: Family<Labels, PlainCounter> = Family::default();
        family
            .get_or_create(&labels([("operation_type", "version")]))
            .inc();
        let mut page = Page::default();
        page.add("kubelet_runtime_operations_total", "[ALPHA] Ops", family);
        page.add(
            "process_cpu_seconds_total",
            "CPU",
            Samples(vec![(Labels::new(), PlainConstCounter(1.5))]),
        );
        assert_eq!(
            page.render(),
            "# HELP kubelet_runtime_operations_total [ALPHA] Ops\n\
             # TYPE kubelet_runtime_operations_total counter\n\
             kubelet_runtime_operations_total{operation_type=\"version\"} 1\n\
             # HELP process_cpu_seconds_total CPU\n\
             # TYPE process_cpu_seconds_total counter\n\
             process_cpu_seconds_total 1.5\n"
        );
    }

    #[test]
    fn volume_totals_count_by_plugin_and_state() {
        let v = VolumeCounts::default();
        v.set_pod(
            "u1",
            vec!["kubernetes.io/secret", "kubernetes.io/empty-dir"],
            vec!["kubernetes.io/secret"],
        );
        v.set_pod(
            "u2",
            vec!["kubernetes.io/secret"],
            vec!["kubernetes.io/secret"],
        );
        assert_eq!(
            v.totals(),
            [
                ("kubernetes.io/empty-dir", "desired_state_of_world", 1),
                ("kubernetes.io/secret", "actual_state_of_world", 2),
                ("kubernetes.io/secret", "desired_state_of_world", 2),
            ]
        );
        v.forget_pod("u1");
        v.forget_pod("u2");
        assert!(v.totals().is_empty());
    }
}
