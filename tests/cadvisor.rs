//! `/metrics/cadvisor` and `/stats/summary` through the real kube-apiserver's node proxy,
//! checked against the kernel's own counters: a pod holding 64 MiB and burning CPU
//! against its cgroup files, a pod downloading 10 MiB from another against the counters
//! of its network namespace (netlink, through `ip`), and the summary's filesystems, image
//! filesystem and PID figures against `statvfs`, CRI `ImageFsInfo` and `/proc`. The page
//! is parsed with a maintained Prometheus text parser.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::case::{Case, root_dir};
use common::pods::{TestPods, exec_in, running_containers_of};
use common::{cri, eventually, node_name, state_dir, unique};
use k8s_openapi::api::core::v1::Pod;
use prometheus_parse::{Sample, Scrape, Value};
use rkubelet::cri::{Cri, VerboseInfo, api};
use tokio::process::Command;

const MIB: f64 = 1_048_576.0;

/// `kubectl get --raw` as the admin.
async fn raw(path: &str) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(state_dir().join("pki/admin.kubeconfig"))
        .args(["get", "--raw", path])
        .kill_on_drop(true)
        .output()
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl get --raw {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

async fn create(pods: &TestPods, name: &str, container: &str, script: &str) -> Pod {
    let manifest = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": container,
                "image": "busybox",
                "command": ["sh", "-c", script],
            }],
        },
    });
    pods.create(&node_name(), manifest).await
}

async fn running(name: &str) -> Pod {
    eventually(
        &format!("pod {name} running"),
        Duration::from_secs(90),
        || async {
            let pod = common::case::get(name).await?;
            let status = pod.status.as_ref()?;
            (status.phase.as_deref() == Some("Running") && status.pod_ip.is_some()).then_some(pod)
        },
    )
    .await
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().expect("uid")
}

/// A number in a cgroup v1 file, or a key of a keyed file.
fn cgroup_number(hierarchy: &str, id: &str, file: &str, key: Option<&str>) -> u64 {
    let path = Path::new("/sys/fs/cgroup")
        .join(hierarchy)
        .join(id.trim_start_matches('/'))
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match key {
        None => text.trim().parse().ok(),
        Some(key) => text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok()),
    }
    .unwrap_or_else(|| panic!("{} {key:?}: {text}", path.display()))
}

fn working_set(id: &str) -> u64 {
    let usage = cgroup_number("memory", id, "memory.usage_in_bytes", None);
    usage.saturating_sub(cgroup_number(
        "memory",
        id,
        "memory.stat",
        Some("total_inactive_file"),
    ))
}

fn value(s: &Sample) -> f64 {
    match s.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
        ref other => panic!("{}: not a number: {other:?}", s.metric),
    }
}

fn label<'a>(s: &'a Sample, name: &str) -> &'a str {
    s.labels.get(name).unwrap_or("")
}

/// The samples of `metric` whose labels include `want`.
fn find<'a>(scrape: &'a Scrape, metric: &str, want: &[(&str, &str)]) -> Vec<&'a Sample> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && want.iter().all(|(k, v)| label(s, k) == *v))
        .collect()
}

fn one<'a>(scrape: &'a Scrape, metric: &str, want: &[(&str, &str)]) -> &'a Sample {
    let found = find(scrape, metric, want);
    assert_eq!(found.len(), 1, "{metric} {want:?}: {found:?}");
    found[0]
}

fn within(what: &str, got: f64, low: f64, high: f64, tolerance: f64) {
    assert!(
        got >= low * (1.0 - tolerance) && got <= high * (1.0 + tolerance),
        "{what}: {got} not within {tolerance} of [{low}, {high}]"
    );
}

async fn scrape() -> Scrape {
    let text = raw(&format!(
        "/api/v1/nodes/{}/proxy/metrics/cadvisor",
        node_name()
    ))
    .await;
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("the page parses")
}

/// The first page whose `metric` sample of container `id` was read after `since`: the
/// agent serves what its housekeeping read last (every 10 s), as the kubelet's cAdvisor.
async fn scrape_read_after(metric: &str, id: &str, since: DateTime<Utc>) -> Scrape {
    eventually(
        "a reading taken after the kernel's counters were read",
        Duration::from_secs(30),
        || async {
            let page = scrape().await;
            let fresh = find(&page, metric, &[("name", id)])
                .first()
                .is_some_and(|s| s.timestamp > since);
            fresh.then_some(page)
        },
    )
    .await
}

/// The pod's sandbox pause PID, from the runtime's verbose status.
async fn sandbox_pid(uid: &str) -> u32 {
    let sandbox = common::pods::sandboxes_of(uid)
        .await
        .into_iter()
        .find(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        .expect("a ready sandbox");
    let status = cri()
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox.id,
            verbose: true,
        })
        .await
        .expect("PodSandboxStatus");
    VerboseInfo::parse(&status.info).pid.expect("the pause PID")
}

/// `eth0`'s received bytes in a process's network namespace, read by `ip` over netlink.
async fn rx_bytes_in_netns(pid: u32) -> f64 {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["ip", "-s", "-j", "link", "show", "eth0"])
        .output()
        .await
        .expect("nsenter runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    links[0]["stats64"]["rx"]["bytes"]
        .as_f64()
        .unwrap_or_else(|| panic!("no rx bytes in {links}"))
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn cadvisor_metrics_and_summary_agree_with_the_kernel() {
    // The tests share the node: one at a time, the pods removed before the agent stops.
    let case = Case::with_agent("cadvisor", &[]).await;
    let pods = &case.pods;
    let burn_name = unique("burn");
    let (server_name, client_name) = (unique("httpd"), unique("wget"));
    create(
        pods,
        &burn_name,
        "burn",
        "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo held; while :; do :; done",
    )
    .await;
    create(
        pods,
        &server_name,
        "httpd",
        "mkdir -p /www && head -c 10485760 /dev/urandom > /www/blob && exec httpd -f -p 8080 -h /www",
    )
    .await;
    create(pods, &client_name, "wget", "exec sleep 3600").await;
    let burn = running(&burn_name).await;
    let server = running(&server_name).await;
    let client = running(&client_name).await;

    // The burner holds its 64 MiB.
    let burn_id = running_containers_of(&uid(&burn)).await[0].id.clone();
    // The container is on the page from the first housekeeping after it started.
    let first = eventually(
        "the burner on the page",
        Duration::from_secs(30),
        || async {
            let page = scrape().await;
            let found = !find(
                &page,
                "container_memory_working_set_bytes",
                &[("name", &burn_id)],
            )
            .is_empty();
            found.then_some(page)
        },
    )
    .await;
    let burn_cgroup = one(
        &first,
        "container_memory_working_set_bytes",
        &[("name", &burn_id)],
    );
    let cgroup = label(burn_cgroup, "id").to_owned();
    assert!(
        cgroup.contains(&burn_id),
        "the container's cgroup: {cgroup}"
    );
    eventually(
        "the burner holds 64 MiB and burned 2 s of CPU",
        Duration::from_secs(60),
        || async {
            let burned = cgroup_number("cpuacct", &cgroup, "cpuacct.usage", None) >= 2_000_000_000;
            (burned && working_set(&cgroup) as f64 >= 64.0 * MIB).then_some(())
        },
    )
    .await;

    // The client downloads 10 MiB from the server.
    let server_ip = server
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    let fetched = exec_in(
        &uid(&client),
        "wget",
        vec![
            "sh".into(),
            "-c".into(),
            format!("wget -q -O /tmp/blob http://{server_ip}:8080/blob && wc -c < /tmp/blob"),
        ],
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&fetched.stdout).trim(),
        "10485760",
        "{}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    let client_pid = sandbox_pid(&uid(&client)).await;

    // A reading taken after the kernel's counters were read, and them read again.
    let cpu_before = cgroup_number("cpuacct", &cgroup, "cpuacct.usage", None) as f64 / 1e9;
    let rx_before = rx_bytes_in_netns(client_pid).await;
    let since = Utc::now();
    let page = scrape_read_after("container_cpu_usage_seconds_total", &burn_id, since).await;
    let started = Instant::now();
    scrape().await;
    let scrape_time = started.elapsed();
    let cpu_after = cgroup_number("cpuacct", &cgroup, "cpuacct.usage", None) as f64 / 1e9;
    let rx_after = rx_bytes_in_netns(client_pid).await;
    let ws_now = working_set(&cgroup) as f64;

    let burn_labels = [
        ("pod", burn_name.as_str()),
        ("namespace", "default"),
        ("container", "burn"),
        ("name", burn_id.as_str()),
        ("id", cgroup.as_str()),
    ];
    let ws = value(one(
        &page,
        "container_memory_working_set_bytes",
        &burn_labels,
    ));
    assert!(ws >= 64.0 * MIB, "working set {ws}");
    within("working set", ws, ws_now, ws_now, 0.05);
    let cpu_sample = one(&page, "container_cpu_usage_seconds_total", &burn_labels);
    assert_eq!(label(cpu_sample, "cpu"), "total");
    within(
        "CPU seconds",
        value(cpu_sample),
        cpu_before,
        cpu_after,
        0.05,
    );
    assert!(value(cpu_sample) >= 2.0, "a busy loop for seconds");
    assert!(
        label(cpu_sample, "image").contains("busybox"),
        "{cpu_sample:?}"
    );
    for metric in [
        "container_cpu_user_seconds_total",
        "container_cpu_system_seconds_total",
        "container_memory_usage_bytes",
        "container_memory_rss",
        "container_memory_cache",
        "container_spec_cpu_shares",
        "container_spec_cpu_period",
        "container_spec_memory_limit_bytes",
        "container_last_seen",
        "container_start_time_seconds",
    ] {
        one(&page, metric, &burn_labels);
    }
    let rss = value(one(&page, "container_memory_rss", &burn_labels));
    within(
        "RSS",
        rss,
        cgroup_number("memory", &cgroup, "memory.stat", Some("total_rss")) as f64,
        cgroup_number("memory", &cgroup, "memory.stat", Some("total_rss")) as f64,
        0.05,
    );
    // No quota: no CFS series for the burner.
    assert!(find(&page, "container_cpu_cfs_periods_total", &burn_labels).is_empty());

    // The client's network is on its sandbox's series only, at least the 10 MiB.
    let rx = find(
        &page,
        "container_network_receive_bytes_total",
        &[("pod", client_name.as_str()), ("interface", "eth0")],
    );
    assert_eq!(rx.len(), 1, "only the sandbox carries the network: {rx:?}");
    assert_eq!(label(rx[0], "container"), "");
    let rx = value(rx[0]);
    assert!(rx >= 10.0 * MIB, "received {rx}");
    within("received bytes", rx, rx_before, rx_after, 0.05);
    for metric in [
        "container_network_transmit_bytes_total",
        "container_network_receive_packets_total",
        "container_network_receive_errors_total",
        "container_network_transmit_errors_total",
    ] {
        one(
            &page,
            metric,
            &[("pod", client_name.as_str()), ("interface", "eth0")],
        );
    }
    // The machine and the root cgroup.
    one(&page, "container_cpu_usage_seconds_total", &[("id", "/")]);
    let cores = value(one(&page, "machine_cpu_cores", &[]));
    assert_eq!(
        cores as usize,
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    let memory = value(one(&page, "machine_memory_bytes", &[]));
    within(
        "machine memory",
        memory,
        common::meminfo("MemTotal") as f64,
        common::meminfo("MemTotal") as f64,
        0.0,
    );
    assert_eq!(value(one(&page, "container_scrape_error", &[])), 0.0);

    // The summary.
    let started = Instant::now();
    let summary: serde_json::Value = serde_json::from_str(
        &raw(&format!(
            "/api/v1/nodes/{}/proxy/stats/summary",
            node_name()
        ))
        .await,
    )
    .expect("JSON");
    let summary_time = started.elapsed();
    check_summary(&summary, &burn_name, &client_name, client_pid).await;
    eprintln!(
        "scrape times: /metrics/cadvisor {scrape_time:?}, /stats/summary {summary_time:?} \
         (through the apiserver's node proxy, {} pods)",
        summary["pods"].as_array().map_or(0, Vec::len)
    );
}

async fn check_summary(summary: &serde_json::Value, burn: &str, client: &str, client_pid: u32) {
    let node = &summary["node"];
    let u = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("a number: {v}"));

    // The root directory's filesystem, as statvfs has it.
    let st = nix::sys::statvfs::statvfs(&root_dir()).expect("statvfs");
    let fs = &node["fs"];
    assert_eq!(u(&fs["capacityBytes"]), st.blocks() * st.fragment_size());
    assert_eq!(u(&fs["inodes"]), st.files());
    let used = (st.blocks() - st.blocks_free()) * st.fragment_size();
    within(
        "node fs used",
        u(&fs["usedBytes"]) as f64,
        used as f64,
        used as f64,
        0.01,
    );
    within(
        "node fs available",
        u(&fs["availableBytes"]) as f64,
        (st.blocks_available() * st.fragment_size()) as f64,
        (st.blocks_available() * st.fragment_size()) as f64,
        0.01,
    );
    assert_eq!(
        u(&fs["inodesUsed"]) + u(&fs["inodesFree"]),
        u(&fs["inodes"]),
        "{fs}"
    );

    // The image filesystem, as the runtime reports it.
    let image_fs = cri()
        .image_fs_info(api::ImageFsInfoRequest {})
        .await
        .expect("ImageFsInfo")
        .image_filesystems
        .remove(0);
    let used = image_fs.used_bytes.expect("used").value as f64;
    let reported = &node["runtime"]["imageFs"];
    within(
        "image fs used",
        u(&reported["usedBytes"]) as f64,
        used,
        used,
        0.05,
    );
    let mount = image_fs.fs_id.expect("fs id").mountpoint;
    let st = nix::sys::statvfs::statvfs(Path::new(&mount)).expect("statvfs");
    assert_eq!(
        u(&reported["capacityBytes"]),
        st.blocks() * st.fragment_size()
    );

    // PIDs.
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("a number");
    assert_eq!(u(&node["rlimit"]["maxpid"]), pid_max);
    let tasks: f64 = std::fs::read_to_string("/proc/loadavg")
        .expect("loadavg")
        .split_whitespace()
        .nth(3)
        .and_then(|t| t.split_once('/'))
        .and_then(|(_, n)| n.parse().ok())
        .expect("tasks");
    within(
        "curproc",
        u(&node["rlimit"]["curproc"]) as f64,
        tasks,
        tasks,
        0.2,
    );

    // The host's network and the pods' system container.
    assert!(
        node["network"]["interfaces"]
            .as_array()
            .is_some_and(|i| !i.is_empty()),
        "{node}"
    );
    let system: HashMap<&str, &serde_json::Value> = node["systemContainers"]
        .as_array()
        .expect("system containers")
        .iter()
        .map(|c| (c["name"].as_str().expect("name"), c))
        .collect();
    assert!(u(&system["pods"]["memory"]["workingSetBytes"]) as f64 >= 64.0 * MIB);

    let pods = summary["pods"].as_array().expect("pods");
    let pod = |name: &str| {
        pods.iter()
            .find(|p| p["podRef"]["name"] == name)
            .unwrap_or_else(|| panic!("{name} in the summary"))
    };
    // The client's network: its namespace's counters, eth0 at the top level.
    let net = &pod(client)["network"];
    assert_eq!(net["name"], "eth0");
    let rx = u(&net["rxBytes"]) as f64;
    let now = rx_bytes_in_netns(client_pid).await;
    assert!(rx >= 10.0 * MIB, "{net}");
    within("pod rx bytes", rx, now, now, 0.05);
    assert!(
        net["interfaces"]
            .as_array()
            .is_some_and(|i| i.iter().any(|i| i["name"] == "eth0"))
    );

    // The burner: memory, its writable layer and logs, and the pod's ephemeral storage.
    let burner = pod(burn);
    let container = &burner["containers"][0];
    assert_eq!(container["name"], "burn");
    assert!(
        u(&container["memory"]["workingSetBytes"]) as f64 >= 64.0 * MIB,
        "{container}"
    );
    assert!(
        u(&container["memory"]["rssBytes"]) as f64 >= 60.0 * MIB,
        "{container}"
    );
    // A busy loop: its rate from two consecutive readings, as cAdvisor's two samples.
    let nano_cores = u(&container["cpu"]["usageNanoCores"]) as f64;
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    assert!(
        nano_cores > 0.2e9 && nano_cores <= cores * 1.05e9,
        "{container}"
    );
    assert!(container["rootfs"]["usedBytes"].is_u64(), "{container}");
    let logs = u(&container["logs"]["usedBytes"]);
    assert!(logs > 0, "the log holds a line: {container}");
    let ephemeral = &burner["ephemeral-storage"];
    assert!(
        u(&ephemeral["usedBytes"]) >= u(&container["rootfs"]["usedBytes"]) + logs,
        "{burner}"
    );
    assert_eq!(ephemeral["capacityBytes"], node["fs"]["capacityBytes"]);
}

/// The wall times (busy and idle) of the spans whose close lines in an agent's log (run
/// with `--log-span-timings`) contain `marker`.
fn span_times(log: &str, marker: &str) -> Vec<Duration> {
    let duration = |text: &str| -> Option<Duration> {
        let split = text.find(|c: char| c.is_ascii_alphabetic() || c == 'µ')?;
        let (number, unit) = text.split_at(split);
        let n: f64 = number.parse().ok()?;
        let scale = match unit {
            "s" => 1.0,
            "ms" => 1e-3,
            "µs" | "us" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        Some(Duration::from_secs_f64(n * scale))
    };
    log.lines()
        .filter(|l| l.contains(marker) && l.contains("close"))
        .filter_map(|l| {
            let field = |name: &str| {
                let rest = l.split(&format!("{name}=")).nth(1)?;
                duration(rest.split_whitespace().next()?)
            };
            Some(field("time.busy")? + field("time.idle")?)
        })
        .collect()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Scrape time (through the apiserver's node proxy) and the agent's CPU per scrape of
/// `/metrics/cadvisor`, `/metrics/resource` and `/stats/summary` with 30 pods; every pod
/// is on each. The pages are the housekeeping's last reading: a scrape reads nothing, so
/// it costs less CPU than one housekeeping pass, which is measured too (the agent idle
/// for three periods).
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn scrape_cost_with_30_pods() {
    const PODS: usize = 30;
    const SCRAPES: u32 = 10;
    // Every span's time in the agent's log: the housekeeping's passes and each request.
    let case = Case::with_agent("scrape", &["--log-span-timings"]).await;
    let (agent, pods) = (case.agent(), &case.pods);
    let label = unique("scrape");
    let names: Vec<String> = (0..PODS).map(|i| format!("{label}-{i}")).collect();
    for name in &names {
        let mut manifest = common::pods::sleeper(serde_json::json!({}));
        manifest["metadata"] = serde_json::json!({"name": name, "namespace": "default"});
        pods.create(&node_name(), manifest).await;
    }
    for name in &names {
        running(name).await;
    }
    let node = node_name();
    // Every pod is on the pages from the first housekeeping after it started.
    let cadvisor = format!("/api/v1/nodes/{node}/proxy/metrics/cadvisor");
    eventually("every pod read", Duration::from_secs(30), || async {
        let page = raw(&cadvisor).await;
        names
            .iter()
            .all(|name| page.contains(name.as_str()))
            .then_some(())
    })
    .await;
    // The background cost: the agent with nothing to do but its housekeeping.
    const IDLE: Duration = Duration::from_secs(30);
    let cpu_before = agent.cpu_seconds();
    tokio::time::sleep(IDLE).await;
    let idle_per_period = (agent.cpu_seconds() - cpu_before) / 3.0;
    eprintln!(
        "agent idle with {PODS} pods: {:.1} ms CPU per 10 s (one housekeeping pass and the rest)",
        idle_per_period * 1000.0
    );
    // `/healthz` through the same proxy: what kubectl and the proxy cost by themselves.
    let mut handler_p50 = Vec::new();
    for (path, what) in [
        (
            format!("/api/v1/nodes/{node}/proxy/healthz"),
            "healthz (baseline)",
        ),
        (
            format!("/api/v1/nodes/{node}/proxy/metrics/cadvisor"),
            "cadvisor",
        ),
        (
            format!("/api/v1/nodes/{node}/proxy/metrics/resource"),
            "resource",
        ),
        (
            format!("/api/v1/nodes/{node}/proxy/stats/summary"),
            "summary",
        ),
    ] {
        let first = raw(&path).await;
        let baseline = first.trim() == "ok";
        for name in names.iter().filter(|_| !baseline) {
            assert!(first.contains(name.as_str()), "{name} missing from {path}");
        }
        let cpu_before = agent.cpu_seconds();
        let mut times = Vec::new();
        for _ in 0..SCRAPES {
            let started = Instant::now();
            let body = raw(&path).await;
            times.push(started.elapsed());
            assert!(baseline || body.len() > 1000);
        }
        let cpu = (agent.cpu_seconds() - cpu_before) / f64::from(SCRAPES);
        times.sort();
        eprintln!(
            "{what} with {PODS} pods: scrape p50 {:?}, max {:?}; agent CPU per scrape {:.1} ms; {} bytes",
            times[times.len() / 2],
            times[times.len() - 1],
            cpu * 1000.0,
            first.len()
        );
        assert!(times[times.len() / 2] < Duration::from_secs(2), "{times:?}");
        let endpoint = path.split("/proxy").nth(1).expect("the endpoint");
        let log = agent.this_runs_log().expect("the agent's log");
        let handled = span_times(
            &log,
            &format!("route{{path={endpoint}}}: rkubelet::server:"),
        );
        assert!(handled.len() > SCRAPES as usize, "{what}: {handled:?}");
        handler_p50.push((what, median(handled)));
        assert!(
            cpu < idle_per_period.max(0.01),
            "{what}: a scrape ({cpu} s of CPU) costs more than a housekeeping period ({idle_per_period} s)"
        );
    }
    // A request is served from the last reading: it takes less than one housekeeping
    // pass, which is what every scrape cost when each read the node.
    let log = agent.this_runs_log().expect("the agent's log");
    let passes = span_times(&log, "read: rkubelet::stats::housekeeping:");
    assert!(
        passes.len() >= 3,
        "housekeeping passes in the log: {passes:?}"
    );
    let pass = median(passes);
    eprintln!("housekeeping pass with {PODS} pods (one reading of the node): p50 {pass:?}");
    for (what, handled) in handler_p50 {
        eprintln!("{what}: handler p50 {handled:?}");
        assert!(
            what.starts_with("healthz") || handled < pass,
            "{what}: {handled:?} per request, a pass {pass:?}"
        );
    }
}
