//! What monitoring reads from the node, through the API server's node proxy as
//! metrics-server and Prometheus do, every exposition parsed with a Prometheus text-format
//! parser (`prometheus-parse`): `/configz` gives back a `--config` file's values and a
//! flag's override over the kubelet's defaults; `/metrics/resource` gives a pod that holds
//! 64 MiB and burns CPU within 5 % of its container cgroup's own files; `/metrics/probes`
//! counts a pod's probe runs by result (and holds nothing else); and the kubelet API refuses all three without
//! credentials (401) or without the right (403), as it does its other endpoints.

mod common;

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::case::{Case, running};
use common::pods::{exec_in, sleeper};
use common::{eventually, kube_client, kubectl, node_name, state_dir, unique};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use prometheus_parse::{Sample, Scrape, Value};
use serde_json::json;

/// `path` of the node's kubelet API through the API server's node proxy, as the admin.
async fn proxied(path: &str) -> String {
    kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}/proxy{path}", node_name()),
    ])
    .await
}

/// Samples parsed without a timestamp get this one: a sample with its own is told apart.
fn no_timestamp() -> DateTime<Utc> {
    DateTime::<Utc>::UNIX_EPOCH
}

/// `path` parsed; every family declared with HELP and TYPE (an untyped sample is one
/// whose family has no TYPE line).
async fn scrape(path: &str) -> Scrape {
    let text = proxied(path).await;
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = Scrape::parse_at(lines, no_timestamp()).expect("Prometheus text");
    for s in &scrape.samples {
        assert!(
            !matches!(s.value, Value::Untyped(_)),
            "{} in {path} has no TYPE",
            s.metric
        );
        assert!(
            scrape.docs.contains_key(&s.metric),
            "{} in {path} has no HELP",
            s.metric
        );
    }
    scrape
}

/// The one sample of `metric` with exactly these labels.
fn sample<'a>(scrape: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    let mut found = scrape.samples.iter().filter(|s| {
        s.metric == metric
            && s.labels.len() == labels.len()
            && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
    });
    let first = found.next();
    assert!(found.next().is_none(), "{metric} {labels:?} twice");
    first
}

fn number(s: &Sample) -> f64 {
    match s.value {
        Value::Counter(v) | Value::Gauge(v) => v,
        ref other => panic!("{} is {other:?}", s.metric),
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn configz_gives_back_the_file_and_a_flags_override_over_the_defaults() {
    let dir = state_dir().join("test-agents").join("configz");
    std::fs::create_dir_all(&dir).expect("config dir");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         maxPods: 23\nimageGCLowThresholdPercent: 70\nevictionPressureTransitionPeriod: 45s\n\
         clusterDomain: file.test\nclusterDNS: [10.96.0.10]\n",
    )
    .expect("config");
    let _case = Case::with_agent(
        "configz",
        &["--config", config.to_str().expect("utf-8"), "--max-pods=31"],
    )
    .await;
    // The running value, in behaviour: the Node's capacity.
    let nodes: Api<Node> = Api::all(kube_client("admin.kubeconfig").await);
    eventually("capacity.pods 31", Duration::from_secs(60), || async {
        let capacity = nodes.get(&node_name()).await.ok()?.status?.capacity?;
        (capacity.get("pods")?.0 == "31").then_some(())
    })
    .await;

    let configz: serde_json::Value =
        serde_json::from_str(&proxied("/configz").await).expect("JSON");
    let config = &configz["kubeletconfig"];
    assert_eq!(config["maxPods"], 31, "the flag over the file: {configz}");
    assert_eq!(config["imageGCLowThresholdPercent"], 70);
    // The test agents' own `--image-gc-high-threshold` (image GC off).
    assert_eq!(config["imageGCHighThresholdPercent"], 100);
    assert_eq!(config["evictionPressureTransitionPeriod"], "45s");
    assert_eq!(config["clusterDomain"], "file.test");
    assert_eq!(config["clusterDNS"], json!(["10.96.0.10"]));
    // The test agent's own flags, and the kubelet's defaults for the rest.
    let ca = state_dir().join("pki").join("ca.crt");
    assert_eq!(
        config["authentication"]["x509"]["clientCAFile"],
        ca.display().to_string()
    );
    assert_eq!(config["address"], common::agent::NODE_IP);
    assert_eq!(config["port"], 10250);
    assert_eq!(config["nodeLeaseDurationSeconds"], 40);
    assert_eq!(config["authorization"]["mode"], "Webhook");
    assert!(
        config.get("resolvConf").is_none(),
        "--resolv-conf \"\": left out as the kubelet leaves an empty string"
    );
    // As the kubelet v1.20.2: no type meta.
    assert!(config.get("kind").is_none() && config.get("apiVersion").is_none());
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// A figure of the container's cgroup (cgroup v1) named in `/proc/self/cgroup` as seen
/// in the container.
struct ContainerCgroup {
    memory: String,
    cpuacct: String,
}

impl ContainerCgroup {
    async fn of(uid: &str, container: &str) -> Self {
        let out = exec_in(
            uid,
            container,
            vec!["cat".into(), "/proc/self/cgroup".into()],
        )
        .await;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let path_of = |controller: &str| {
            text.lines()
                .find_map(|l| {
                    let (_, rest) = l.split_once(':')?;
                    let (controllers, path) = rest.split_once(':')?;
                    controllers
                        .split(',')
                        .any(|c| c == controller)
                        .then(|| (controllers.to_owned(), path.to_owned()))
                })
                .map(|(controllers, path)| format!("/sys/fs/cgroup/{controllers}{path}"))
                .unwrap_or_else(|| panic!("no {controller} cgroup in {text}"))
        };
        Self {
            memory: path_of("memory"),
            cpuacct: path_of("cpuacct"),
        }
    }

    fn read(dir: &str, file: &str) -> String {
        let path = Path::new(dir).join(file);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The working set as the kubelet (cAdvisor) computes it: usage less inactive file.
    fn working_set(&self) -> f64 {
        let usage: u64 = Self::read(&self.memory, "memory.usage_in_bytes")
            .trim()
            .parse()
            .expect("usage");
        let stat = Self::read(&self.memory, "memory.stat");
        let inactive: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("total_inactive_file ")?.parse().ok())
            .expect("total_inactive_file");
        #[allow(clippy::cast_precision_loss)]
        let ws = usage.saturating_sub(inactive) as f64;
        ws
    }

    /// Cumulative CPU time in seconds.
    fn cpu_seconds(&self) -> f64 {
        let ns: u64 = Self::read(&self.cpuacct, "cpuacct.usage")
            .trim()
            .parse()
            .expect("cpuacct.usage");
        #[allow(clippy::cast_precision_loss)]
        let s = ns as f64 / 1e9;
        s
    }
}

/// `value` lies within 5 % of the range the cgroup read around it.
fn within_5_percent(what: &str, value: f64, before: f64, after: f64) {
    let (low, high) = (before.min(after) * 0.95, before.max(after) * 1.05);
    eprintln!("{what}: {value} served, the cgroup's {before}..{after}");
    assert!(
        (low..=high).contains(&value),
        "{what}: {value} not within 5 % of the cgroup's {before}..{after}"
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn resource_metrics_of_a_pod_holding_64_mib_and_burning_cpu_match_its_cgroup() {
    let case = Case::with_agent("resmetrics", &[]).await;
    let name = case
        .create(
            "burn",
            sleeper(json!({
                "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory"}}],
                "containers": [{
                    "name": "burn",
                    "image": "busybox",
                    "command": ["sh", "-c",
                        "dd if=/dev/zero of=/mem/fill bs=1M count=64 && touch /mem/held && while :; do :; done"],
                    "volumeMounts": [{"name": "mem", "mountPath": "/mem"}],
                }],
            })),
        )
        .await;
    let uid = running(&name).await.metadata.uid.expect("uid");
    eventually("64 MiB held", Duration::from_secs(30), || async {
        let out = exec_in(&uid, "burn", vec!["ls".into(), "/mem/held".into()]).await;
        (out.exit_code == 0).then_some(())
    })
    .await;
    let cgroup = ContainerCgroup::of(&uid, "burn").await;
    // Some seconds of CPU, so that 5 % is more than the scrape's own time.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let (ws_before, cpu_before) = (cgroup.working_set(), cgroup.cpu_seconds());
    let started = Utc::now();
    let container = [
        ("container", "burn"),
        ("namespace", "default"),
        ("pod", name.as_str()),
    ];
    // The agent serves its housekeeping's last reading (every 10 s, as the kubelet's
    // cAdvisor): the first one taken after the cgroup was read.
    let scrape = eventually(
        "a reading taken after the cgroup's",
        Duration::from_secs(30),
        || async {
            let scrape = scrape("/metrics/resource").await;
            let fresh = sample(&scrape, "container_cpu_usage_seconds_total", &container)
                .is_some_and(|s| s.timestamp > started);
            fresh.then_some(scrape)
        },
    )
    .await;
    let (ws_after, cpu_after) = (cgroup.working_set(), cgroup.cpu_seconds());
    assert!(
        ws_before > 64.0 * 1024.0 * 1024.0,
        "the container holds 64 MiB: {ws_before}"
    );

    let memory = sample(&scrape, "container_memory_working_set_bytes", &container)
        .expect("the container's working set");
    let cpu = sample(&scrape, "container_cpu_usage_seconds_total", &container)
        .expect("the container's CPU");
    assert!(matches!(memory.value, Value::Gauge(_)) && matches!(cpu.value, Value::Counter(_)));
    within_5_percent("container working set", number(memory), ws_before, ws_after);
    within_5_percent("container CPU seconds", number(cpu), cpu_before, cpu_after);
    // One container: the pod's figures are its.
    let pod = [("namespace", "default"), ("pod", name.as_str())];
    let pod_memory = sample(&scrape, "pod_memory_working_set_bytes", &pod).expect("pod memory");
    let pod_cpu = sample(&scrape, "pod_cpu_usage_seconds_total", &pod).expect("pod CPU");
    within_5_percent("pod working set", number(pod_memory), ws_before, ws_after);
    within_5_percent("pod CPU seconds", number(pod_cpu), cpu_before, cpu_after);
    // Every sample but scrape_error has its reading's time, at most a minute old.
    for s in &scrape.samples {
        if s.metric == "scrape_error" {
            assert_eq!(s.timestamp, no_timestamp());
            assert_eq!(number(s), 0.0);
            continue;
        }
        let age = started.signed_duration_since(s.timestamp);
        assert!(
            age < chrono::TimeDelta::seconds(60) && age > chrono::TimeDelta::seconds(-60),
            "{} {:?} at {}",
            s.metric,
            s.labels,
            s.timestamp
        );
    }
    let node_cpu = sample(&scrape, "node_cpu_usage_seconds_total", &[]).expect("node CPU");
    assert!(
        number(node_cpu) >= cpu_before,
        "the node's CPU holds the pod's"
    );
    let node_memory = sample(&scrape, "node_memory_working_set_bytes", &[]).expect("node memory");
    assert!(
        number(node_memory) >= ws_before,
        "the node's working set holds the pod's"
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn probe_metrics_count_a_pods_probe_runs_by_result() {
    let case = Case::with_agent("probemetrics", &[]).await;
    // Each probe run leaves a line in a file of its container.
    let container = |name: &str, exit: u8| {
        json!({
            "name": name,
            "image": "busybox",
            "command": ["sleep", "3600"],
            "readinessProbe": {
                "exec": {"command": ["sh", "-c", format!("echo run >> /tmp/runs; exit {exit}")]},
                "periodSeconds": 1,
            },
        })
    };
    let name = case
        .create(
            "probed",
            sleeper(json!({"containers": [container("ok", 0), container("failing", 1)]})),
        )
        .await;
    let uid = running(&name).await.metadata.uid.expect("uid");
    let runs = |container: &'static str| {
        let uid = uid.clone();
        async move {
            let out = exec_in(&uid, container, vec!["cat".into(), "/tmp/runs".into()]).await;
            #[allow(clippy::cast_precision_loss)]
            let n = String::from_utf8_lossy(&out.stdout).lines().count() as f64;
            n
        }
    };
    eventually("a few probe runs", Duration::from_secs(30), || async {
        (runs("failing").await >= 3.0).then_some(())
    })
    .await;
    let (ok_before, failing_before) = (runs("ok").await, runs("failing").await);
    let scrape = scrape("/metrics/probes").await;
    let (ok_after, failing_after) = (runs("ok").await, runs("failing").await);
    let labels = |container: &'static str, result: &'static str| {
        [
            ("container", container),
            ("namespace", "default"),
            ("pod", name.as_str()),
            ("pod_uid", uid.as_str()),
            ("probe_type", "Readiness"),
            ("result", result),
        ]
    };
    let count = |container, result| {
        sample(&scrape, "prober_probe_total", &labels(container, result)).map(number)
    };
    let ok = count("ok", "successful").expect("the ok container's successes");
    let failed = count("failing", "failed").expect("the failing container's failures");
    // A run is counted once its exec has returned, after it wrote its line: one run of
    // each container (its probes run one at a time) may have written and not yet been
    // counted when the lines were read before the scrape, however slow the machine; every
    // run counted had written its line before the lines were read after it.
    assert!(
        (ok_before - 1.0..=ok_after).contains(&ok),
        "{ok} runs counted, {ok_before}..{ok_after} seen"
    );
    assert!(
        (failing_before - 1.0..=failing_after).contains(&failed),
        "{failed} failures counted, {failing_before}..{failing_after} seen"
    );
    assert_eq!(
        count("ok", "failed"),
        None,
        "a result never seen has no series"
    );
    assert_eq!(count("failing", "successful"), None);
    assert!(
        scrape
            .samples
            .iter()
            .all(|s| s.metric == "prober_probe_total"),
        "nothing but the probe counts, as the kubelet v1.20.2"
    );
}

/// curl against the node's kubelet API directly; the HTTP code (`000` while nothing
/// listens) and the body.
async fn kubelet_api(path: &str, header: Option<&str>) -> (String, String) {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"]);
    if let Some(h) = header {
        cmd.args(["-H", h]);
    }
    cmd.arg(format!("https://{}:10250{path}", common::agent::NODE_IP));
    let out = cmd.output().await.expect("curl runs");
    let out = String::from_utf8_lossy(&out.stdout);
    let (body, code) = out.rsplit_once('\n').expect("a code after the body");
    (code.to_owned(), body.trim().to_owned())
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_monitoring_endpoints_refuse_anonymous_and_unauthorized_callers() {
    let _case = Case::with_agent("monauth", &[]).await;
    eventually("the kubelet API", Duration::from_secs(60), || async {
        (kubelet_api("/configz", None).await.0 == "401").then_some(())
    })
    .await;
    let client = kube_client("admin.kubeconfig").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
    let account = unique("monitor");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": account}})).expect("sa");
    accounts
        .create(&PostParams::default(), &sa)
        .await
        .expect("service account");
    let token = accounts
        .create_token_request(&account, &PostParams::default(), &TokenRequest::default())
        .await
        .expect("token")
        .status
        .expect("token status")
        .token;
    let bearer = format!("Authorization: Bearer {token}");
    for (path, subresource) in [
        ("/configz", "proxy"),
        ("/metrics/resource", "metrics"),
        ("/metrics/probes", "metrics"),
    ] {
        assert_eq!(
            kubelet_api(path, None).await,
            ("401".to_owned(), "Unauthorized".to_owned()),
            "{path}"
        );
        assert_eq!(
            kubelet_api(path, Some(&bearer)).await,
            (
                "403".to_owned(),
                format!(
                    "Forbidden (user=system:serviceaccount:default:{account}, verb=get, \
                     resource=nodes, subresource={subresource})"
                )
            ),
            "{path}"
        );
    }
    let _ = accounts.delete(&account, &DeleteParams::default()).await;
}
