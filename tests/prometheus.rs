//! What a monitoring stack shows of an rkubelet node, with the real client: Debian's
//! Prometheus scrapes the agent's four metrics endpoints (static targets, a service
//! account's bearer token through the node's authentication and authorization, the
//! kubernetes-mixin's recording rules loaded), and every kubernetes-mixin Kubelet-dashboard
//! query, kubelet, storage, resource and system alert expression and recording rule
//! (`tests/data/kubernetes-mixin/queries.json`), and each metric selector they read, is
//! evaluated through Prometheus' HTTP API. Each one that returns series for the kubelet
//! v1.20.2 on this machine (`tests/data/kubelet-v1.20.2/mixin.json`, made by
//! `scripts/kubelet-reference.sh` with the same workload and set-up) must return series for
//! rkubelet, with at least the kubelet's label names, but for the stated exceptions
//! ([`EXCEPTIONS`]). Prometheus listens on loopback only; its data dir is removed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::agent::NODE_IP;
use common::case::Case;
use common::{kubectl, node_name, state_dir};
use serde_json::Value;

/// Families of the kubelet's `/metrics` and `/metrics/cadvisor` on this machine
/// (`tests/data/kubelet-v1.20.2/`) that rkubelet does not serve, and why (docs/support.md
/// holds the same list). Go's runtime series (`go_*`) are left out as a whole.
const FAMILIES_LEFT_OUT: &[(&str, &str)] = &[
    (
        "apiserver_audit_event_total",
        "the API server library's audit log: a kubelet audits nothing (always 0 there)",
    ),
    (
        "apiserver_audit_requests_rejected_total",
        "the API server library's audit log: a kubelet audits nothing (always 0 there)",
    ),
    (
        "apiserver_envelope_encryption_dek_cache_fill_percent",
        "the API server's encryption of stored objects: a kubelet stores none (always 0 there)",
    ),
    (
        "apiserver_storage_data_key_generation_duration_seconds",
        "the API server's encryption of stored objects: a kubelet stores none (no sample there)",
    ),
    (
        "apiserver_storage_data_key_generation_failures_total",
        "the API server's encryption of stored objects: a kubelet stores none (always 0 there)",
    ),
    (
        "apiserver_storage_envelope_transformation_cache_misses_total",
        "the API server's encryption of stored objects: a kubelet stores none (always 0 there)",
    ),
    (
        "get_token_count",
        "the GCE cloud provider's token source, linked into the kubelet: rkubelet has no cloud provider (always 0 there)",
    ),
    (
        "get_token_fail_count",
        "the GCE cloud provider's token source, linked into the kubelet: rkubelet has no cloud provider (always 0 there)",
    ),
    (
        "rest_client_exec_plugin_certificate_rotation_age",
        "client-go's exec credential plugins: the node's credentials are certificate files (no sample there)",
    ),
    (
        "rest_client_exec_plugin_ttl_seconds",
        "client-go's exec credential plugins: the node's credentials are certificate files (+Inf there: none)",
    ),
    (
        "workqueue_adds_total",
        "the work queue of the kubelet's --client-ca-file reloader: rkubelet reads that file once, at start",
    ),
    (
        "workqueue_depth",
        "the work queue of the kubelet's --client-ca-file reloader: rkubelet reads that file once, at start",
    ),
    (
        "workqueue_longest_running_processor_seconds",
        "the work queue of the kubelet's --client-ca-file reloader: rkubelet reads that file once, at start",
    ),
    (
        "workqueue_queue_duration_seconds",
        "the work queue of the kubelet's --client-ca-file reloader: rkubelet reads that file once, at start",
    ),
    (
        "workqueue_retries_total",
        "the work queue of the kubelet's --client-ca-file reloader: rkubelet reads that file once, at start",
    ),
    (
        "workqueue_unfinished_work_seconds",
        "the work queue of the kubelet's --client-ca-file reloader: rkubelet reads that file once, at start",
    ),
    (
        "workqueue_work_duration_seconds",
        "the work queue of the kubelet's --client-ca-file reloader: rkubelet reads that file once, at start",
    ),
    (
        "machine_nvm_avg_power_budget_watts",
        "cAdvisor's Intel Optane figures (libipmctl), which the kubelet's build lacks (always 0 there)",
    ),
    (
        "machine_nvm_capacity",
        "cAdvisor's Intel Optane figures (libipmctl), which the kubelet's build lacks (always 0 there)",
    ),
];

/// A page's families: name → (type, label names, bucket bounds).
type Families = BTreeMap<String, (String, BTreeSet<String>, BTreeSet<String>)>;

/// The families of a text-format page, each sample under its family (a histogram's
/// `_bucket`, `_sum` and `_count` under the histogram), with the label names its samples
/// have and, for a histogram, the bounds of its buckets.
fn families(text: &str) -> Families {
    let mut out = Families::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            out.entry(name.to_owned()).or_default().0 = kind.to_owned();
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).expect("a sample");
        let name = &line[..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                let f = name.strip_suffix(s)?;
                out.get(f)
                    .is_some_and(|(t, _, _)| t == "histogram" || t == "summary")
                    .then_some(f)
            })
            .unwrap_or(name);
        let entry = out.entry(family.to_owned()).or_default();
        if line[end..].starts_with('{') {
            let labels = &line[end + 1..line.rfind('}').expect("labels end")];
            // Label values are quoted: the names are what precedes `="` outside quotes.
            let mut rest = labels;
            while let Some(eq) = rest.find("=\"") {
                let label = rest[..eq].trim_start_matches(',');
                let mut value_end = eq + 2;
                let bytes = rest.as_bytes();
                while bytes[value_end] != b'"' {
                    value_end += if bytes[value_end] == b'\\' { 2 } else { 1 };
                }
                if label == "le" {
                    entry.2.insert(rest[eq + 2..value_end].to_owned());
                } else {
                    entry.1.insert(label.to_owned());
                }
                rest = &rest[value_end + 1..];
            }
        }
    }
    out
}

/// Where rkubelet's page falls short of the kubelet's: a family missing, or served with
/// another type, other label names or other buckets.
fn family_shortfalls(kubelet: &Families, rkubelet: &Families) -> Vec<String> {
    let mut out = Vec::new();
    for (name, (kind, labels, buckets)) in kubelet {
        if name.starts_with("go_") || FAMILIES_LEFT_OUT.iter().any(|(n, _)| n == name) {
            continue;
        }
        match rkubelet.get(name) {
            None => out.push(format!("{name}: missing")),
            Some((k, l, b)) => {
                if k != kind {
                    out.push(format!("{name}: type {k}, the kubelet's {kind}"));
                }
                if l != labels {
                    out.push(format!("{name}: labels {l:?}, the kubelet's {labels:?}"));
                }
                if !buckets.is_empty() && !b.is_empty() && b != buckets {
                    out.push(format!("{name}: buckets {b:?}, the kubelet's {buckets:?}"));
                }
            }
        }
    }
    out
}

/// Queries and selectors the kubelet answers and rkubelet does not, and why.
const EXCEPTIONS: &[(&str, &str)] = &[(
    "go_goroutines{cluster=\"\",job=\"kubelet\", metrics_path=\"/metrics\",instance=~\".*\"}",
    "a Go runtime series: rkubelet is no Go program (its tasks are tokio tasks, not counted)",
)];

/// Label names the kubelet's answers have and rkubelet's may lack, and why: the labels of
/// `kubernetes_build_info` that rkubelet writes empty (so Prometheus drops them). The mixin
/// reads only its `git_version` (the version-mismatch alert), which rkubelet sets.
const LABELS_LEFT_OUT: &[(&str, &str)] = &[
    (
        "build_date",
        "not stamped into the build (the kubelet's release scripts do)",
    ),
    (
        "git_commit",
        "not stamped into the build (the kubelet's release scripts do)",
    ),
    (
        "git_tree_state",
        "not stamped into the build (the kubelet's release scripts do)",
    ),
    (
        "go_version",
        "rkubelet is no Go program (its compiler is in the `compiler` label: rustc)",
    ),
];

fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(path)
}

fn read_json(path: &str) -> Value {
    let text = std::fs::read_to_string(data(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// What an answer gives: how many series and their label names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    series: usize,
    labels: BTreeSet<String>,
}

/// The kubelet's answers: each query or selector with series, and its label names.
fn kubelet_answers() -> BTreeMap<String, Answer> {
    let reference = read_json("kubelet-v1.20.2/mixin.json");
    let mut out = BTreeMap::new();
    for entry in reference.as_array().expect("a list") {
        let expr = entry["query"]
            .as_str()
            .or_else(|| entry["selector"].as_str())
            .expect("a query or a selector");
        let series = entry["answer"]["series"].as_u64().expect("series");
        if series == 0 {
            continue;
        }
        let labels = entry["answer"]["labels"]
            .as_array()
            .expect("labels")
            .iter()
            .map(|l| l.as_str().expect("a label name").to_owned())
            .collect();
        out.insert(
            expr.to_owned(),
            Answer {
                series: usize::try_from(series).expect("a count"),
                labels,
            },
        );
    }
    out
}

/// The workload and the identity, applied from `tests/data/monitoring/` (written into `dir`),
/// deleted with `dir` when dropped.
struct Applied {
    dir: PathBuf,
    pv_dir: PathBuf,
    files: Vec<PathBuf>,
}

impl Applied {
    async fn apply(dir: &Path, pv_dir: &Path) -> Self {
        let node = node_name();
        let mut files = Vec::new();
        for name in ["rbac.yaml", "workload.yaml"] {
            let text = std::fs::read_to_string(data(&format!("monitoring/{name}")))
                .expect("the manifest")
                .replace("NODE_NAME", &node)
                .replace("PV_DIR", &pv_dir.display().to_string());
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write the manifest");
            kubectl(&["apply", "-f", &path.display().to_string()]).await;
            files.push(path);
        }
        Self {
            dir: dir.to_owned(),
            pv_dir: pv_dir.to_owned(),
            files,
        }
    }
}

impl Drop for Applied {
    fn drop(&mut self) {
        let files = std::mem::take(&mut self.files);
        common::cleanup_blocking(move || async move {
            for f in files.iter().rev() {
                kubectl(&[
                    "delete",
                    "--ignore-not-found",
                    "--wait=true",
                    "--timeout=60s",
                    "-f",
                    &f.display().to_string(),
                ])
                .await;
            }
        });
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.pv_dir);
    }
}

/// Debian's Prometheus on a loopback port, stopped (by its PID) and its data dir removed
/// when dropped.
struct Prometheus {
    child: std::process::Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, token: &str) -> Self {
        std::fs::create_dir_all(dir).expect("Prometheus' dir");
        let token_file = dir.join("token");
        std::fs::write(&token_file, token.trim()).expect("the token");
        let config = std::fs::read_to_string(data("monitoring/prometheus.yml"))
            .expect("the config")
            .replace("TARGET", &format!("{NODE_IP}:10250"))
            .replace(
                "CA_FILE",
                &state_dir().join("pki/ca.crt").display().to_string(),
            )
            .replace("TOKEN_FILE", &token_file.display().to_string())
            .replace(
                "RULES_FILE",
                &data("kubernetes-mixin/rules.json").display().to_string(),
            );
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).expect("the config");
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .expect("a loopback port")
            .port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("the log");
        let child = std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("prometheus (scripts/setup.sh installs it)");
        Self {
            child,
            port,
            dir: dir.to_owned(),
        }
    }

    /// Waits until Prometheus answers `/-/ready` (it opens its TSDB and loads the rules
    /// first), for at most 60 s; panics with its log if it ended or never got ready.
    async fn ready(&mut self) {
        let url = format!("http://127.0.0.1:{}/-/ready", self.port);
        let started = std::time::Instant::now();
        loop {
            let log =
                || std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
            if let Some(status) = self.child.try_wait().expect("Prometheus' status") {
                panic!("Prometheus ended ({status}):\n{}", log());
            }
            let answered = tokio::process::Command::new("curl")
                .args(["-fsS", "--max-time", "2", "-o", "/dev/null", &url])
                .status()
                .await
                .expect("curl")
                .success();
            if answered {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "Prometheus not ready after 60 s:\n{}",
                log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let mut cmd = tokio::process::Command::new("curl");
        cmd.args(["-fsS", "--max-time", "10", "-G", &url]);
        for (k, v) in query {
            cmd.arg("--data-urlencode").arg(format!("{k}={v}"));
        }
        let out = common::run_ok(cmd, &format!("GET {path}")).await;
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{path}: {e}: {out}"))
    }

    async fn query(&self, expr: &str) -> Answer {
        let answer = self.get("/api/v1/query", &[("query", expr)]).await;
        assert_eq!(answer["status"], "success", "{expr}: {answer}");
        let result = answer["data"]["result"].as_array().expect("a vector");
        Answer {
            series: result.len(),
            labels: result
                .iter()
                .flat_map(|s| s["metric"].as_object().expect("labels").keys().cloned())
                .collect(),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where rkubelet's answer falls short of the kubelet's, per query or selector.
fn shortfalls(
    kubelet: &BTreeMap<String, Answer>,
    rkubelet: &BTreeMap<String, Answer>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (expr, k) in kubelet {
        if EXCEPTIONS.iter().any(|(e, _)| e == expr) {
            continue;
        }
        match rkubelet.get(expr) {
            Some(r) if r.series > 0 => {
                let missing: Vec<&String> = k
                    .labels
                    .difference(&r.labels)
                    .filter(|l| {
                        !(expr.contains("kubernetes_build_info")
                            && LABELS_LEFT_OUT.iter().any(|(n, _)| n == l))
                    })
                    .collect();
                if !missing.is_empty() {
                    out.insert(expr.clone(), format!("labels {missing:?} missing"));
                }
            }
            _ => {
                out.insert(expr.clone(), "no series".to_owned());
            }
        }
    }
    out
}

#[test]
fn families_are_read_by_name_type_labels_and_buckets() {
    let page = "# HELP h_seconds H\n# TYPE h_seconds histogram\n\
        h_seconds_bucket{a=\"x\\\"le=\\\"\",le=\"1\"} 1\nh_seconds_sum{a=\"x\"} 2\n\
        # TYPE c_total counter\nc_total 3\nx_count{b=\"1\"} 1\n";
    let f = families(page);
    assert_eq!(f["h_seconds"].0, "histogram");
    assert_eq!(f["h_seconds"].1, BTreeSet::from(["a".to_owned()]));
    assert_eq!(f["h_seconds"].2, BTreeSet::from(["1".to_owned()]));
    assert_eq!(f["c_total"].0, "counter");
    assert_eq!(f["x_count"].1, BTreeSet::from(["b".to_owned()]));
    let mut other = f.clone();
    other.remove("c_total");
    other.get_mut("h_seconds").expect("h").2 = BTreeSet::from(["1.0".to_owned()]);
    assert_eq!(
        family_shortfalls(&f, &other),
        [
            "c_total: missing",
            "h_seconds: buckets {\"1.0\"}, the kubelet's {\"1\"}"
        ]
    );
}

/// The kubelet's families on `page` (`metrics` or `cadvisor`), as recorded.
fn kubelet_families(page: &str) -> Families {
    let path = data(&format!("kubelet-v1.20.2/{page}.txt"));
    families(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}")))
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_mixins_kubelet_queries_have_series_for_rkubelet_as_for_the_kubelet() {
    let kubelet = kubelet_answers();
    assert!(
        kubelet.len() > 40,
        "the reference holds {} answered queries and selectors",
        kubelet.len()
    );
    let _case = Case::with_agent("prometheus", &[]).await;
    let dir = std::env::temp_dir().join(common::unique("rk-prometheus"));
    let pv_dir = state_dir().join("mon-pv");
    std::fs::create_dir_all(&pv_dir).expect("the local volume's dir");
    std::fs::create_dir_all(&dir).expect("a temp dir");
    // The manifests are written into `dir`, which goes with them (Prometheus' own dir first).
    let _applied = Applied::apply(&dir, &pv_dir).await;
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/mon-web",
        "--timeout=120s",
    ])
    .await;
    let token = kubectl(&["create", "token", "mon-prometheus", "--duration=1h"]).await;
    let mut prometheus = Prometheus::start(&dir.join("prometheus"), &token);
    prometheus.ready().await;

    let queries = read_json("kubernetes-mixin/queries.json");
    let mut exprs: Vec<String> = Vec::new();
    for q in queries.as_array().expect("a list") {
        exprs.push(q["query"].as_str().expect("query").to_owned());
        for s in q["selectors"].as_array().expect("selectors") {
            exprs.push(s.as_str().expect("a selector").to_owned());
        }
    }
    // Rates need two scrapes (every 5 s) and the recording rules a round after them: the
    // answers are read until they hold all the kubelet's, for at most two minutes.
    let started = std::time::Instant::now();
    let (rkubelet, missing) = loop {
        let mut answers = BTreeMap::new();
        for expr in &exprs {
            answers.insert(expr.clone(), prometheus.query(expr).await);
        }
        let missing = shortfalls(&kubelet, &answers);
        if missing.is_empty() || started.elapsed() > Duration::from_secs(120) {
            break (answers, missing);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    // The pages themselves, by family, beside the kubelet's.
    let mut short = Vec::new();
    for page in ["metrics", "cadvisor"] {
        let path = if page == "metrics" {
            "/metrics".to_owned()
        } else {
            format!("/metrics/{page}")
        };
        let text = kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy{path}", node_name()),
        ])
        .await;
        let (kubelet_page, ours) = (kubelet_families(page), families(&text));
        let theirs: Vec<&String> = kubelet_page
            .keys()
            .filter(|n| !n.starts_with("go_"))
            .collect();
        eprintln!(
            "{path}: rkubelet serves {} families, {} of the kubelet's {} (go_* aside) by name",
            ours.len(),
            theirs.iter().filter(|n| ours.contains_key(**n)).count(),
            theirs.len()
        );
        for s in family_shortfalls(&kubelet_page, &ours) {
            short.push(format!("{path}: {s}"));
        }
    }
    let targets = prometheus.get("/api/v1/targets", &[]).await;
    for t in targets["data"]["activeTargets"]
        .as_array()
        .expect("targets")
    {
        assert_eq!(
            t["health"], "up",
            "target {}: {}",
            t["scrapeUrl"], t["lastError"]
        );
    }
    let answered = |set: &BTreeMap<String, Answer>| -> Vec<String> {
        set.iter()
            .filter(|(_, a)| a.series > 0)
            .map(|(e, _)| e.clone())
            .collect()
    };
    eprintln!(
        "kubelet v1.20.2: {} queries and selectors with series:\n  {}",
        kubelet.len(),
        kubelet.keys().cloned().collect::<Vec<_>>().join("\n  ")
    );
    let ours = answered(&rkubelet);
    eprintln!(
        "rkubelet: {} with series:\n  {}",
        ours.len(),
        ours.join("\n  ")
    );
    for (expr, why) in EXCEPTIONS {
        eprintln!("exception: {expr}: {why}");
    }
    for (label, why) in LABELS_LEFT_OUT {
        eprintln!("kubernetes_build_info label left out: {label}: {why}");
    }
    for (name, why) in FAMILIES_LEFT_OUT {
        eprintln!("family left out: {name}: {why}");
    }
    assert!(
        short.is_empty(),
        "families the kubelet serves and rkubelet does not as it does:\n  {}",
        short.join("\n  ")
    );
    assert!(
        missing.is_empty(),
        "series the kubelet has and rkubelet has not:\n{}",
        missing
            .iter()
            .map(|(e, why)| format!("  {e}: {why}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
