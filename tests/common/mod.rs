//! Shared helpers of the integration tests. They run against the real local cluster that
//! `scripts/cluster.sh up` starts (containerd, registry, kube-apiserver, ...), as root, and
//! are `#[ignore]`d so that a plain `cargo test` stays hermetic: `scripts/test.sh` runs them
//! with `--include-ignored` once the cluster is up.
#![allow(dead_code, missing_docs)]

pub mod agent;
pub mod case;
pub mod leaks;
pub mod pods;

use std::path::PathBuf;
use std::time::Duration;

use rkubelet::cri::{CriClient, Endpoint};

/// Why the integration tests are ignored by a plain `cargo test`.
pub const NEEDS_CLUSTER: &str = "needs root and the local cluster: run scripts/test.sh";

/// The cluster's state directory (`RKUBELET_STATE`, as in scripts/common.sh).
pub fn state_dir() -> PathBuf {
    std::env::var_os("RKUBELET_STATE")
        .map_or_else(|| "/var/lib/rkubelet-cluster".into(), PathBuf::from)
}

/// The node name the cluster minted credentials for (`RKUBELET_NODE`).
pub fn node_name() -> String {
    std::env::var("RKUBELET_NODE").unwrap_or_else(|_| "rk-node1".into())
}

/// The cluster's containerd (`CONTAINER_RUNTIME_ENDPOINT`).
pub fn runtime_endpoint() -> Endpoint {
    std::env::var("CONTAINER_RUNTIME_ENDPOINT")
        .unwrap_or_else(|_| "unix:///run/containerd/containerd.sock".into())
        .parse()
        .expect("valid endpoint")
}

/// A CRI client for the cluster's containerd.
pub fn cri() -> CriClient {
    cri_at(runtime_endpoint())
}

/// A CRI client for `endpoint`. Its connection is driven by the tokio runtime it is made
/// on: make it on the runtime that uses it.
pub fn cri_at(endpoint: Endpoint) -> CriClient {
    CriClient::new(
        endpoint,
        Duration::from_secs(30),
        Some(Duration::from_secs(120)),
    )
}

/// A Kubernetes client from a kubeconfig file under the cluster's pki directory.
pub async fn kube_client(kubeconfig: &str) -> kube::Client {
    let path = state_dir().join("pki").join(kubeconfig);
    rkubelet::app::kube_client(&path)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Whether the test node reports the condition `kind` (`DiskPressure`, `MemoryPressure`)
/// true; `None` when the node or the condition cannot be read.
pub async fn node_condition(kind: &str) -> Option<bool> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
        kube::Api::all(kube_client("admin.kubeconfig").await);
    let node = nodes.get(&node_name()).await.ok()?;
    let condition = node
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == kind)?;
    Some(condition.status == "True")
}

/// The node's allocatable `name`, in milli units for cpu, else in units; waited for (the
/// agent may not have registered the node yet).
pub async fn node_allocatable(name: &str) -> i64 {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
        kube::Api::all(kube_client("admin.kubeconfig").await);
    let q = eventually(
        &format!("the node's allocatable {name}"),
        Duration::from_secs(60),
        || async {
            let node = nodes.get_opt(&node_name()).await.ok()??;
            node.status?.allocatable?.get(name).cloned()
        },
    )
    .await;
    let q = rkubelet::resources::Quantity::parse(&q.0).expect("a quantity");
    let v = if name == "cpu" {
        q.milli_value()
    } else {
        q.value()
    };
    i64::try_from(v).expect("fits")
}

/// A `/proc/meminfo` figure, in bytes.
pub fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/meminfo"));
    kib * 1024
}

/// Polls `probe` every 200 ms until it gives a value; panics naming `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes `line` to an attached process's stdin, again every 2 s, until `needle` shows in
/// what its stdout gave (kept in `seen`), for `within` at most: as a user presses enter
/// when no prompt shows, since the runtime (containerd 1.6) starts passing a new attach's
/// input on before its output, and what is printed in between reaches only the log. A
/// read error or the end of the output is an error, as is no answer in time.
pub async fn send_until_answered(
    stdin: &mut tokio::process::ChildStdin,
    stdout: &mut tokio::process::ChildStdout,
    line: &[u8],
    needle: &str,
    seen: &mut Vec<u8>,
    within: Duration,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(seen).contains(needle) {
        if tokio::time::Instant::now() >= deadline {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stdin.write_all(line).await?;
        let resend = (tokio::time::Instant::now() + Duration::from_secs(2)).min(deadline);
        while !String::from_utf8_lossy(seen).contains(needle) {
            let Ok(read) = tokio::time::timeout_at(resend, stdout.read(&mut buf)).await else {
                break; // no answer yet: send the line again
            };
            let read = read?;
            if read == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            seen.extend_from_slice(&buf[..read]);
        }
    }
    Ok(())
}

/// How long a read of the API rides over its errors (an API server restarting, a dropped
/// connection) before the test fails: an error is never taken for an answer.
pub const API_RETRY: Duration = Duration::from_secs(30);

/// Calls `read` every 200 ms until it answers (for `within` at most); then panics naming
/// `what` and the last error. For reads whose error must not pass for "nothing there".
pub async fn retrying<T, E, F, Fut>(what: &str, within: Duration, mut read: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        match read().await {
            Ok(v) => return v,
            Err(e) if std::time::Instant::now() >= deadline => {
                panic!("{what}: still failing after {within:?}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Runs async clean-up from a `Drop`: on a thread of its own with its own runtime, since
/// `Drop` may run inside a test's runtime. Its answer, or `None` if it panicked (the
/// panic is printed): a check run this way must take `None` for a failure.
pub fn cleanup_blocking<F, Fut, T>(work: F) -> Option<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    let run = move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(work())
    };
    std::thread::spawn(run).join().ok()
}

/// A name unique to this test run, for sandboxes and other objects tests create.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

/// `kubectl ARGS` as the admin, to run.
pub fn kubectl_command(args: &[&str]) -> tokio::process::Command {
    kubectl_command_of("kubectl".as_ref(), args)
}

/// A binary of the Kubernetes v1.20.2 that `scripts/setup.sh` builds into the cache
/// (`K8S_BIN` in scripts/common.sh, under `RKUBELET_CACHE`). Panics when it is missing.
pub fn k8s_1_20_binary(name: &str) -> PathBuf {
    let path = std::env::var_os("RKUBELET_CACHE")
        .map_or_else(|| "/var/cache/rkubelet".into(), PathBuf::from)
        .join("kubernetes-v1.20.2/bin")
        .join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup.sh, which builds the v1.20.2 {name}",
        path.display()
    );
    path
}

/// The kubectl v1.20.2 ([`k8s_1_20_binary`]): what a 1.20 cluster's user runs, for what
/// the machine's newer kubectl cannot do against a 1.20 server.
pub fn kubectl_1_20() -> PathBuf {
    k8s_1_20_binary("kubectl")
}

/// The mounts whose mount point starts with `prefix` in a mount table (`mountinfo`'s
/// text): mount point to mount id (a volume mounted again has a new id).
pub fn mounts_under(mountinfo: &str, prefix: &str) -> std::collections::BTreeMap<String, String> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let id = fields.next()?;
            let point = fields.nth(3)?;
            point
                .starts_with(prefix)
                .then(|| (point.to_owned(), id.to_owned()))
        })
        .collect()
}

/// `kubectl ARGS` as the admin with the v1.20.2 kubectl ([`kubectl_1_20`]), to run.
pub fn kubectl_1_20_command(args: &[&str]) -> tokio::process::Command {
    kubectl_command_of(&kubectl_1_20(), args)
}

fn kubectl_command_of(kubectl: &std::path::Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(kubectl);
    cmd.arg("--kubeconfig")
        .arg(state_dir().join("pki").join("admin.kubeconfig"))
        .args(args);
    cmd
}

/// `kubectl port-forward pod/POD :PORT` as the admin: a free local port on 127.0.0.1
/// forwarded through the API server to the pod's PORT; stopped when dropped.
pub struct PortForward {
    child: tokio::process::Child,
    /// kubectl's stdout, open while it runs: it prints a line for every connection, and
    /// a write to a closed pipe would end it.
    _stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    /// The local port.
    pub port: u16,
}

impl PortForward {
    /// Starts the forward and waits (a minute at most) until kubectl says where it listens.
    pub async fn start(pod: &str, port: u16) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut forward = kubectl_command(&[
            "port-forward",
            "--address",
            "127.0.0.1",
            &format!("pod/{pod}"),
            &format!(":{port}"),
        ]);
        forward
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = forward.spawn().expect("kubectl port-forward");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("port-forward ready")
            .expect("read")
            .expect("a line");
        // "Forwarding from 127.0.0.1:40123 -> 80"
        let local: u16 = line
            .split_whitespace()
            .nth(2)
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("no local port in {line:?}"));
        Self {
            child,
            _stdout: lines,
            port: local,
        }
    }

    /// `GET /` over HTTP/1.0 through the forward: the whole answer (a minute at most).
    /// A failure names what kubectl said.
    pub async fn get(&mut self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let answer = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
            s.write_all(b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n").await?;
            let mut answer = String::new();
            tokio::time::timeout(Duration::from_secs(60), s.read_to_string(&mut answer))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            Ok::<_, std::io::Error>(answer)
        }
        .await;
        match answer {
            Ok(answer) if !answer.is_empty() => answer,
            Ok(_) => self.fail("no answer").await,
            Err(e) => self.fail(&e.to_string()).await,
        }
    }

    /// Stops kubectl and panics with `what` and all kubectl said.
    async fn fail(&mut self, what: &str) -> ! {
        use tokio::io::AsyncReadExt;
        let _ = self.child.kill().await;
        let mut said = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = stderr.read_to_string(&mut said).await;
        }
        panic!(
            "GET / through port {}: {what}; kubectl said: {said}",
            self.port
        )
    }
}

/// The Node's `InternalIP` address; panics when it has none.
pub fn internal_ip(node: &k8s_openapi::api::core::v1::Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .expect("an InternalIP")
}

/// A node joined by TLS bootstrap with the cluster's bootstrap token: a CSR made by the
/// token's user (`system:bootstrap:<token id>`).
pub async fn assert_joined_by_bootstrap_token(admin: &kube::Client) {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let token = std::fs::read_to_string(state_dir().join("pki/bootstrap-token"))
        .expect("the cluster's bootstrap token");
    let id = token.trim().split('.').next().expect("a token id");
    let user = format!("system:bootstrap:{id}");
    let csrs = kube::Api::<CertificateSigningRequest>::all(admin.clone())
        .list(&Default::default())
        .await
        .expect("CSRs");
    assert!(
        csrs.items
            .iter()
            .any(|c| c.spec.username.as_deref() == Some(user.as_str())),
        "a CSR by {user}"
    );
}

/// `kubectl` as the admin; answers stdout, panics on failure.
pub async fn kubectl(args: &[&str]) -> String {
    run_ok(kubectl_command(args), &format!("kubectl {args:?}")).await
}

/// A RuntimeClass a test made (a leftover of the name replaced), deleted when dropped.
pub struct TestRuntimeClass(String);

impl TestRuntimeClass {
    /// Creates the RuntimeClass `name` with `handler`.
    pub async fn create(name: &str, handler: &str) -> Self {
        use k8s_openapi::api::node::v1::RuntimeClass;
        let api: kube::Api<RuntimeClass> = kube::Api::all(kube_client("admin.kubeconfig").await);
        let class: RuntimeClass = serde_json::from_value(
            serde_json::json!({ "metadata": { "name": name }, "handler": handler }),
        )
        .expect("a RuntimeClass");
        let _ = api.delete(name, &Default::default()).await;
        api.create(&Default::default(), &class)
            .await
            .expect("create the RuntimeClass");
        Self(name.to_owned())
    }
}

impl Drop for TestRuntimeClass {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.0);
        cleanup_blocking(move || async move {
            use k8s_openapi::api::node::v1::RuntimeClass;
            let api: kube::Api<RuntimeClass> =
                kube::Api::all(kube_client("admin.kubeconfig").await);
            let _ = api.delete(&name, &Default::default()).await;
        });
    }
}

/// `scripts/cluster.sh ARGS`, waiting for it; answers its stdout, panics if it fails.
pub async fn cluster(args: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(cluster_sh()).args(args);
    run_ok(cmd, &format!("cluster.sh {args:?}")).await
}

/// The cluster script of this checkout.
pub fn cluster_sh() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh")
}

/// Runs `cmd` (named `what` in a failure) with no stdin, waiting for it; answers its
/// stdout, panics if it fails.
pub async fn run_ok(mut cmd: tokio::process::Command, what: &str) -> String {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
