//! The kubelet API on :10250 end to end, against the local cluster: `kubectl logs`,
//! `exec`, `attach` and `port-forward` through the real kube-apiserver's kubelet proxy,
//! authentication and authorization (401, 403, the apiserver's own certificate), metrics,
//! stats and `/debug/timeline` through the node proxy, and a serving certificate requested
//! from the certificates API.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::agent::{AgentProcess, NODE_IP, Owner};
use common::pods::TestPods;
use common::{eventually, kube_client, meminfo, node_name, send_until_answered, state_dir, unique};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// The tests share one node and its port: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NS: &str = "default";

fn root_dir() -> PathBuf {
    state_dir().join("test-agents").join(node_name())
}

fn pki(file: &str) -> PathBuf {
    state_dir().join("pki").join(file)
}

async fn pods_api() -> Api<Pod> {
    Api::namespaced(kube_client("admin.kubeconfig").await, NS)
}

/// `kubectl` as the admin, with the version skew warning left out of stderr.
fn kubectl(args: &[&str]) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(pki("admin.kubeconfig"))
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn run(mut cmd: Command) -> Output {
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("command within 60 s")
        .expect("command runs");
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn kubectl_ok(args: &[&str]) -> String {
    let out = run(kubectl(args)).await;
    assert_eq!(out.code, Some(0), "kubectl {args:?}: {}", out.stderr);
    out.stdout
}

/// The test's pods: bound to the node (no scheduler), deleted when the test ends (also
/// when it fails), and checked for leaks once gone.
fn test_pods(label: &str) -> TestPods {
    TestPods::new(label, root_dir())
}

/// A pod of `pods` named `name`, from the JSON of its spec.
async fn create_pod(pods: &TestPods, name: &str, spec: serde_json::Value) {
    let mut spec = spec;
    spec["terminationGracePeriodSeconds"] = 1.into();
    let manifest = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NS },
        "spec": spec,
    });
    pods.create(&node_name(), manifest).await;
}

fn busybox(name: &str, script: &str) -> serde_json::Value {
    serde_json::json!({
        "containers": [{
            "name": name,
            "image": "busybox",
            "command": ["sh", "-c", script],
        }]
    })
}

async fn running(name: &str, timeout: Duration) -> Pod {
    eventually(&format!("pod {name} running"), timeout, || async {
        let pod = common::case::get(name).await?;
        let status = pod.status.as_ref()?;
        let all_running = status
            .container_statuses
            .as_ref()?
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        (status.phase.as_deref() == Some("Running") && all_running).then_some(pod)
    })
    .await
}

fn start_agent() -> AgentProcess {
    AgentProcess::start(Owner::Agent, &node_name(), root_dir())
}

/// curl against the kubelet API on the node IP; returns (HTTP code, body).
async fn curl(path: &str, args: &[&str]) -> (String, String) {
    let out = run({
        let mut c = Command::new("curl");
        c.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
            .args(args)
            .arg(format!("https://{NODE_IP}:10250{path}"))
            .kill_on_drop(true);
        c
    })
    .await;
    let (body, code) = out
        .stdout
        .rsplit_once('\n')
        .map(|(b, c)| (b.to_owned(), c.to_owned()))
        .unwrap_or_default();
    (code, body)
}

/// The apiserver's kubelet client certificate, and the cluster CA for the server's.
fn apiserver_identity() -> Vec<String> {
    vec![
        "--cacert".into(),
        pki("ca.crt").display().to_string(),
        "--cert".into(),
        pki("apiserver-kubelet-client.crt").display().to_string(),
        "--key".into(),
        pki("apiserver-kubelet-client.key").display().to_string(),
    ]
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn kubectl_logs_with_tail_limit_timestamps_follow_and_previous() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let _agent = start_agent();
    let counter = unique("logs");
    let crasher = unique("crash");
    let pods = test_pods(&counter);
    create_pod(
        &pods,
        &counter,
        busybox(
            "count",
            "i=1; while true; do echo line $i; i=$((i+1)); sleep 0.2; done",
        ),
    )
    .await;
    // Run 1 exits after its line; run 2 stays: --previous is run 1's log.
    let mut spec = busybox(
        "crash",
        "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; \
         echo run $n; if [ $n -lt 2 ]; then exit 1; fi; sleep 3600",
    );
    spec["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "data", "mountPath": "/data"}]);
    spec["volumes"] = serde_json::json!([{"name": "data", "emptyDir": {}}]);
    create_pod(&pods, &crasher, spec).await;
    running(&counter, Duration::from_secs(60)).await;

    // Enough lines for a tail.
    eventually("five lines", Duration::from_secs(20), || async {
        let out = run(kubectl(&["logs", &counter])).await;
        (out.stdout.lines().count() >= 5).then_some(())
    })
    .await;
    let started = Instant::now();
    let all = kubectl_ok(&["logs", &counter]).await;
    let latency = started.elapsed();
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines[0], "line 1", "{all}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(*l, format!("line {}", i + 1), "in order, joined: {all}");
    }
    let tail = kubectl_ok(&["logs", &counter, "--tail=2"]).await;
    let tail: Vec<&str> = tail.lines().collect();
    assert_eq!(tail.len(), 2, "{tail:?}");
    let n: u32 = tail[1].trim_start_matches("line ").parse().expect("number");
    assert_eq!(tail[0], format!("line {}", n - 1));
    assert_eq!(
        kubectl_ok(&["logs", &counter, "--limit-bytes=5"]).await,
        "line "
    );
    let stamped = kubectl_ok(&["logs", &counter, "--timestamps", "--tail=1"]).await;
    let (ts, text) = stamped
        .trim_end()
        .split_once(' ')
        .expect("timestamp and text");
    assert!(
        ts.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
        "{stamped}"
    );
    assert!(text.starts_with("line "), "{stamped}");
    let recent = kubectl_ok(&["logs", &counter, "--since=1s"]).await;
    assert!(!recent.contains("line 1\n"), "{recent}");

    // Follow: lines written after the request arrive while it is open.
    let mut follow = kubectl(&["logs", "-f", &counter, "--tail=1"]);
    follow.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = follow.spawn().expect("kubectl logs -f");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), out.next_line())
        .await
        .expect("a first line")
        .expect("read")
        .expect("a line");
    let first_n: u32 = first.trim_start_matches("line ").parse().expect("number");
    let mut last = first_n;
    while last < first_n + 5 {
        let line = tokio::time::timeout(Duration::from_secs(5), out.next_line())
            .await
            .expect("new lines keep coming")
            .expect("read")
            .expect("a line");
        let n: u32 = line.trim_start_matches("line ").parse().expect("number");
        assert_eq!(n, last + 1, "no line lost or repeated");
        last = n;
    }
    child.kill().await.expect("stop following");

    // Previous: after the restart, run 1's log; the current container's is run 2's.
    eventually(
        "the restarted container",
        Duration::from_secs(90),
        || async {
            let pod = pods_api().await.get_opt(&crasher).await.ok().flatten()?;
            let cs = pod.status?.container_statuses?.into_iter().next()?;
            (cs.restart_count >= 1 && cs.state?.running.is_some()).then_some(())
        },
    )
    .await;
    let current = eventually("run 2's log", Duration::from_secs(10), || async {
        let out = run(kubectl(&["logs", &crasher])).await;
        out.stdout.contains("run 2").then_some(out.stdout)
    })
    .await;
    assert_eq!(current, "run 2\n");
    assert_eq!(
        kubectl_ok(&["logs", &crasher, "--previous"]).await,
        "run 1\n"
    );
    let missing = run(kubectl(&["logs", &counter, "--previous"])).await;
    assert_ne!(missing.code, Some(0));
    assert!(
        missing.stderr.contains("previous terminated container"),
        "{}",
        missing.stderr
    );
    eprintln!("kubectl logs (whole log) through the apiserver took {latency:?}");
}

/// Runs `kubectl exec -it` under `script`, which gives it a pseudo-terminal.
fn interactive(args: &str) -> Command {
    let kubeconfig = pki("admin.kubeconfig");
    let mut cmd = Command::new("script");
    cmd.args(["-qfec"])
        .arg(format!(
            "kubectl --kubeconfig {} {args}",
            kubeconfig.display()
        ))
        .arg("/dev/null")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn read_until(
    out: &mut (impl tokio::io::AsyncRead + Unpin),
    seen: &mut String,
    want: &str,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 4096];
    while !seen.contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, out.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {want:?}; got {seen:?}"))
            .expect("read");
        assert!(n > 0, "closed before {want:?}; got {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn kubectl_exec_runs_commands_and_an_interactive_shell() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let _agent = start_agent();
    let name = unique("exec");
    let pods = test_pods(&name);
    create_pod(&pods, &name, busybox("shell", "sleep 3600")).await;
    running(&name, Duration::from_secs(60)).await;

    let started = Instant::now();
    let out = run(kubectl(&[
        "exec",
        &name,
        "--",
        "sh",
        "-c",
        "echo hello; echo oops >&2; exit 3",
    ]))
    .await;
    let round_trip = started.elapsed();
    assert_eq!(out.stdout, "hello\n");
    assert!(out.stderr.contains("oops"), "{}", out.stderr);
    assert_eq!(out.code, Some(3), "the command's exit code: {}", out.stderr);

    let mut with_stdin = kubectl(&["exec", "-i", &name, "--", "cat"]);
    with_stdin.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = with_stdin.spawn().expect("kubectl exec -i");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"through stdin\n").await.expect("write");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("cat ends at EOF")
        .expect("output");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through stdin\n");

    // An interactive shell on a terminal: a prompt, arithmetic, the terminal's name.
    let mut child = interactive(&format!("exec -it {name} -- sh"))
        .spawn()
        .expect("script");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut seen = String::new();
    let started = Instant::now();
    stdin
        .write_all(b"echo $((6*7)); tty\n")
        .await
        .expect("type");
    read_until(&mut stdout, &mut seen, "42", Duration::from_secs(30)).await;
    let interactive_round_trip = started.elapsed();
    read_until(&mut stdout, &mut seen, "/dev/pts/", Duration::from_secs(10)).await;
    stdin.write_all(b"exit 0\n").await.expect("type");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the shell ends")
        .expect("wait");
    assert!(status.success(), "{seen}");
    eprintln!(
        "exec round trip (kubectl exec, one command) {round_trip:?}; interactive command echo {interactive_round_trip:?}"
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn kubectl_attach_and_port_forward() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let _agent = start_agent();
    let echo = unique("attach");
    let web = unique("web");
    let pods = test_pods(&echo);
    let mut spec = busybox("echo", "while read l; do echo got:$l; done");
    spec["containers"][0]["stdin"] = true.into();
    create_pod(&pods, &echo, spec).await;
    create_pod(
        &pods,
        &web,
        serde_json::json!({"containers": [{"name": "web", "image": "nginx"}]}),
    )
    .await;
    running(&echo, Duration::from_secs(60)).await;

    let mut attach = kubectl(&["attach", "-i", &echo, "-c", "echo"]);
    attach
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = attach.spawn().expect("kubectl attach");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut seen = Vec::new();
    // The attach may not be wired yet when the first line is written: repeat it.
    let answered = send_until_answered(
        &mut stdin,
        &mut stdout,
        b"ping\n",
        "got:ping",
        &mut seen,
        Duration::from_secs(30),
    )
    .await;
    assert!(
        answered.is_ok(),
        "no echo through attach ({answered:?}): {:?}",
        String::from_utf8_lossy(&seen)
    );
    child.kill().await.expect("detach");

    running(&web, Duration::from_secs(60)).await;
    let mut forward = common::PortForward::start(&web, 80).await;
    for _ in 0..3 {
        let answer = forward.get().await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("Welcome to nginx!"), "{answer}");
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn no_credentials_401_an_unprivileged_token_403_the_apiserver_passes() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let _agent = start_agent();
    eventually("the kubelet API", Duration::from_secs(60), || async {
        let (code, _) = curl("/healthz", &["-k"]).await;
        (code == "401").then_some(())
    })
    .await;
    for path in [
        "/pods",
        "/metrics",
        "/stats/summary",
        "/containerLogs/default/x/y",
    ] {
        let (code, body) = curl(path, &["-k"]).await;
        assert_eq!(code, "401", "{path}: {body}");
        assert_eq!(body.trim(), "Unauthorized");
    }

    // A ServiceAccount with no RBAC rights: authenticated, then denied.
    let client = kube_client("admin.kubeconfig").await;
    let sa_name = unique("norights");
    let sas: Api<ServiceAccount> = Api::namespaced(client, NS);
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": sa_name}})).expect("sa");
    sas.create(&PostParams::default(), &sa)
        .await
        .expect("create sa");
    let token = sas
        .create_token_request(&sa_name, &PostParams::default(), &TokenRequest::default())
        .await
        .expect("token request")
        .status
        .expect("token")
        .token;
    let bearer = format!("Authorization: Bearer {token}");
    let (code, body) = curl("/pods", &["-k", "-H", &bearer]).await;
    assert_eq!(code, "403", "{body}");
    assert_eq!(
        body.trim(),
        format!(
            "Forbidden (user=system:serviceaccount:{NS}:{sa_name}, verb=get, resource=nodes, subresource=proxy)"
        )
    );
    let (code, _) = curl("/metrics", &["-k", "-H", &bearer]).await;
    assert_eq!(code, "403");
    let (code, _) = curl("/pods", &["-k", "-H", "Authorization: Bearer not-a-token"]).await;
    assert_eq!(code, "401");
    let _ = sas.delete(&sa_name, &DeleteParams::default()).await;

    // The apiserver's kubelet client certificate (system:masters), and the serving
    // certificate verified against the cluster CA with the node IP as its name.
    let identity = apiserver_identity();
    let args: Vec<&str> = identity.iter().map(String::as_str).collect();
    let (code, body) = curl("/pods", &args).await;
    assert_eq!(code, "200", "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).expect("a PodList");
    assert_eq!(list["kind"], "PodList");
    let (code, body) = curl("/healthz", &args).await;
    assert_eq!((code.as_str(), body.trim()), ("200", "ok"));
    let healthz = run({
        let mut c = Command::new("curl");
        c.args(["-sS", "--max-time", "5", "http://127.0.0.1:10248/healthz"]);
        c
    })
    .await;
    assert_eq!(healthz.stdout.trim(), "ok");
}

/// Checks the Prometheus text format line by line; returns the sample lines.
fn prometheus_samples(text: &str) -> Vec<(String, f64)> {
    let mut typed = BTreeSet::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let name = it.next().expect("name");
            let kind = it.next().expect("type");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            typed.insert(name.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment {line}");
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let name = series.split('{').next().expect("name");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
        if let Some(labels) = series.strip_prefix(name)
            && !labels.is_empty()
        {
            assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
            .unwrap_or(name);
        assert!(typed.contains(family), "{name} has no TYPE line");
        samples.push((series.to_owned(), value));
    }
    samples
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn metrics_and_stats_summary_through_the_apiserver() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let _agent = start_agent();
    let names = [unique("stats-a"), unique("stats-b")];
    let pods = test_pods(&names[0]);
    for name in &names {
        create_pod(&pods, name, busybox("spin", "while true; do :; done")).await;
    }
    for name in &names {
        running(name, Duration::from_secs(60)).await;
    }
    let node = node_name();
    // A pod worker's sync is recorded when it returns, which may be just after the status
    // it patched showed the pod running (as the kubelet records it after syncPod): the page
    // is read until both pods' first syncs ("create") are on it.
    let (metrics, samples) = eventually(
        "both pods' first syncs on /metrics",
        Duration::from_secs(30),
        || async {
            let metrics = kubectl_ok(&[
                "get",
                "--raw",
                &format!("/api/v1/nodes/{node}/proxy/metrics"),
            ])
            .await;
            let samples = prometheus_samples(&metrics);
            samples
                .iter()
                .any(|(s, v)| {
                    s == "kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"}"
                        && *v >= 2.0
                })
                .then_some((metrics, samples))
        },
    )
    .await;
    let value = |series: &str| {
        samples
            .iter()
            .find(|(s, _)| s == series)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{series} missing from\n{metrics}"))
    };
    assert!(value("kubelet_pod_start_duration_seconds_count") >= 2.0);
    assert!(value("kubelet_running_pods") >= 2.0);
    assert!(value("kubelet_running_containers{container_state=\"running\"}") >= 2.0);
    assert!(value("kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"}") >= 2.0);
    assert!(
        value(
            "kubelet_runtime_operations_duration_seconds_count{operation_type=\"create_container\"}"
        ) >= 2.0
    );
    // `kubelet_runtime_operations_errors_total` has a sample only once an operation failed,
    // as the kubelet's (none here: it is counted in src/server/metrics.rs's unit tests).
    // A bucket of the first syncs (label order is the writer's: the kubelet writes `le` last,
    // prometheus-client first).
    assert!(samples.iter().any(|(s, _)| {
        s.starts_with("kubelet_pod_worker_duration_seconds_bucket{")
            && s.contains("operation_type=\"create\"")
            && s.contains("le=\"")
    }));

    // One entry per running pod, from the housekeeping's first reading after it started
    // (every 10 s); CPU rates from its second reading on.
    let summary_path = format!("/api/v1/nodes/{node}/proxy/stats/summary");
    let running_on_node: BTreeSet<String> = pods_api()
        .await
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.metadata.uid)
        .collect();
    let summary: serde_json::Value = eventually(
        "every running pod in the summary, with CPU rates",
        Duration::from_secs(30),
        || async {
            let summary: serde_json::Value =
                serde_json::from_str(&kubectl_ok(&["get", "--raw", &summary_path]).await)
                    .expect("JSON");
            let entries = summary["pods"].as_array()?;
            let uids: BTreeSet<&str> = entries
                .iter()
                .filter(|p| p["cpu"]["usageNanoCores"].is_u64())
                .filter_map(|p| p["podRef"]["uid"].as_str())
                .collect();
            running_on_node
                .iter()
                .all(|uid| uids.contains(uid.as_str()))
                .then_some(summary)
        },
    )
    .await;
    let entries = summary["pods"].as_array().expect("pods");
    let uids: BTreeSet<String> = entries
        .iter()
        .map(|p| p["podRef"]["uid"].as_str().expect("uid").to_owned())
        .collect();
    assert_eq!(uids.len(), entries.len(), "one entry per pod");
    assert_eq!(uids, running_on_node);
    assert_eq!(summary["node"]["nodeName"], node);
    assert!(
        summary["node"]["memory"]["workingSetBytes"]
            .as_u64()
            .unwrap_or(0)
            > 0
    );
    for name in &names {
        let entry = entries
            .iter()
            .find(|p| p["podRef"]["name"] == name.as_str())
            .expect("the pod's entry");
        assert_eq!(entry["containers"][0]["name"], "spin");
        assert!(
            entry["memory"]["workingSetBytes"].as_u64().unwrap_or(0) > 0,
            "{entry}"
        );
        let cores = entry["cpu"]["usageNanoCores"].as_u64().unwrap_or(0);
        assert!(
            cores > 100_000_000,
            "a busy loop uses a good part of a core: {entry}"
        );
    }
}

/// A number in a file under `/sys/fs/cgroup/memory` or a `memory.stat` key there.
fn memory_cgroup(file: &str, key: Option<&str>) -> u64 {
    let path = format!("/sys/fs/cgroup/memory/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let value = match key {
        None => text.trim().parse().ok(),
        Some(key) => text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok()),
    };
    value.unwrap_or_else(|| panic!("{path} {key:?}: {text}"))
}

/// The kubelet's `memory.available` read here: capacity less the root memory cgroup's
/// working set (cgroup v1, as on this machine).
fn capacity_less_working_set() -> u64 {
    let usage = memory_cgroup("memory.usage_in_bytes", None);
    let inactive = memory_cgroup("memory.stat", Some("total_inactive_file"));
    meminfo("MemTotal").saturating_sub(usage.saturating_sub(inactive))
}

/// The node's `memory.available` in `/stats/summary` is the kubelet's — capacity less the
/// root cgroup's working set — not `MemAvailable`, which counts active page cache as
/// available: with 512Mi of a file read twice (active page cache), it is below
/// `MemAvailable` by more than that, and matches the cgroup's figures read around it.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_summary_reports_memory_available_as_the_kubelet_computes_it() {
    const MIB: u64 = 1 << 20;
    let _turn = ONE_AT_A_TIME.lock().await;
    let _agent = start_agent();
    // Page cache the kernel counts as active: a file read twice (removed however the
    // test ends).
    struct Removed(PathBuf);
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let cache = Removed(root_dir().with_extension("page-cache"));
    let touched = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "dd if=/dev/urandom of={0} bs=1M count=512 status=none && cat {0} >/dev/null && cat {0} >/dev/null",
            cache.0.display()
        ))
        .status()
        .await
        .expect("sh");
    assert!(touched.success(), "filling the page cache failed");
    let summary_path = format!("/api/v1/nodes/{}/proxy/stats/summary", node_name());
    let checked = eventually(
        "the summary's memory.available within 128Mi of the cgroup's, below MemAvailable",
        Duration::from_secs(60),
        || async {
            let before = capacity_less_working_set();
            let out = kubectl(&["get", "--raw", &summary_path]).output().await.ok()?;
            let after = capacity_less_working_set();
            let mem_available = meminfo("MemAvailable");
            let summary: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let reported = summary["node"]["memory"]["availableBytes"].as_u64()?;
            let working_set = summary["node"]["memory"]["workingSetBytes"].as_u64()?;
            let (low, high) = (before.min(after), before.max(after));
            eprintln!(
                "reported {reported}, capacity - working set {low}..{high}, MemAvailable {mem_available}, working set {working_set}"
            );
            (reported + 128 * MIB >= low
                && reported <= high + 128 * MIB
                && reported + 256 * MIB < mem_available
                && reported + working_set == meminfo("MemTotal"))
            .then_some((reported, mem_available))
        },
    )
    .await;
    eprintln!(
        "memory.available {} MiB, MemAvailable {} MiB",
        checked.0 / MIB,
        checked.1 / MIB
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_serving_certificate_is_requested_approved_and_served() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cert_dir = root_dir().with_extension("rotated-pki");
    let _ = std::fs::remove_dir_all(&cert_dir);
    let args: Vec<std::ffi::OsString> = vec![
        "--rotate-server-certificates".into(),
        "--cert-dir".into(),
        cert_dir.clone().into(),
    ];
    let csrs: Api<CertificateSigningRequest> = Api::all(kube_client("admin.kubeconfig").await);
    let user = format!("system:node:{}", node_name());
    // Requests left by an earlier run would be taken for this agent's.
    for old in csrs.list(&ListParams::default()).await.expect("csrs").items {
        if old.spec.username.as_deref() == Some(user.as_str())
            && let Some(name) = old.metadata.name
        {
            let _ = csrs.delete(&name, &DeleteParams::default()).await;
        }
    }
    let agent = AgentProcess::start_with_server_args(Owner::Agent, &node_name(), root_dir(), &args);
    let started = Instant::now();
    let names = eventually(
        "the node's serving CSR",
        Duration::from_secs(60),
        || async {
            let pending: Vec<String> = csrs
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|c| {
                    c.spec.signer_name == "kubernetes.io/kubelet-serving"
                        && c.spec.username.as_deref() == Some(user.as_str())
                        && c.status.as_ref().is_none_or(|s| s.conditions.is_none())
                })
                .filter_map(|c| c.metadata.name)
                .collect();
            (!pending.is_empty()).then_some(pending)
        },
    )
    .await;
    // Until approved, no handshake succeeds.
    let identity = apiserver_identity();
    let curl_args: Vec<&str> = identity.iter().map(String::as_str).collect();
    let (code, _) = curl("/healthz", &curl_args).await;
    assert_ne!(code, "200");
    for name in &names {
        kubectl_ok(&["certificate", "approve", name]).await;
    }
    eventually(
        "the issued certificate served",
        Duration::from_secs(30),
        || async {
            let (code, body) = curl("/healthz", &curl_args).await;
            (code == "200" && body.trim() == "ok").then_some(())
        },
    )
    .await;
    let issued_in = started.elapsed();
    assert!(cert_dir.join("kubelet-server-current.pem").exists());
    // The apiserver reaches the node with it too.
    let node = node_name();
    let pods = kubectl_ok(&["get", "--raw", &format!("/api/v1/nodes/{node}/proxy/pods")]).await;
    assert!(pods.contains("PodList"));
    agent.stop();

    // A restart serves the stored certificate at once, without a new request.
    let before = csrs
        .list(&ListParams::default())
        .await
        .expect("csrs")
        .items
        .len();
    let agent = AgentProcess::start_with_server_args(Owner::Agent, &node_name(), root_dir(), &args);
    eventually(
        "the stored certificate served",
        Duration::from_secs(60),
        || async {
            let (code, _) = curl("/healthz", &curl_args).await;
            (code == "200").then_some(())
        },
    )
    .await;
    let after = csrs
        .list(&ListParams::default())
        .await
        .expect("csrs")
        .items
        .len();
    assert_eq!(before, after, "no new CSR");
    for name in &names {
        let _ = csrs.delete(name, &DeleteParams::default()).await;
    }
    eprintln!("serving certificate requested, approved and served in {issued_in:?}");
    agent.stop();
    let _ = std::fs::remove_dir_all(&cert_dir);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_debug_timeline_through_the_node_proxy() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let _agent = start_agent();
    let name = unique("timeline");
    let pods = test_pods(&name);
    create_pod(&pods, &name, busybox("c", "sleep 3600")).await;
    let uid = running(&name, Duration::from_secs(60))
        .await
        .metadata
        .uid
        .expect("uid");
    let node = node_name();
    let all: serde_json::Value = serde_json::from_str(
        &kubectl_ok(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{node}/proxy/debug/timeline"),
        ])
        .await,
    )
    .expect("JSON");
    let listed = all
        .as_array()
        .expect("a list of timelines")
        .iter()
        .find(|t| t["uid"] == uid.as_str())
        .unwrap_or_else(|| panic!("no timeline of {uid} in {all:#}"));
    assert_eq!(listed["name"], name.as_str());
    let one: serde_json::Value = serde_json::from_str(
        &kubectl_ok(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{node}/proxy/debug/timeline/{NS}/{name}"),
        ])
        .await,
    )
    .expect("JSON");
    assert_eq!(one["uid"], uid.as_str());
    let steps: Vec<&str> = one["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    for step in ["run_pod_sandbox", "start_container"] {
        assert!(steps.contains(&step), "{step} in {steps:?}");
    }
    // A pod the node does not know: the kubelet's 404, through the proxy.
    let missing = run(kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{node}/proxy/debug/timeline/{NS}/no-such-pod"),
    ]))
    .await;
    assert_ne!(missing.code, Some(0));
    assert!(
        missing.stderr.contains("NotFound") || missing.stderr.contains("404"),
        "{}",
        missing.stderr
    );
}
