//! The kubelet API under load and attack, against the real agent on the node IP: a
//! thousand concurrent clients (authorized, unauthenticated, with invented tokens) leave
//! the agent's memory and file descriptors at their baseline while a pod still syncs; a
//! pod holding 300 idle connections and 300 stalled TLS handshakes to it, with 72 more
//! addresses holding more than all the pending slots with silent connections, locks no one out of `kubectl logs`, `kubectl exec`
//! and a metrics scrape through the API server; a flood of invented tokens leaves a valid
//! client's cached review and its latency alone;
//! oversized headers and bodies are refused and slow clients cut; log requests with path
//! tricks read nothing but the named container's log; and the node-local sockets (the
//! CNI shim's, the debug socket) refuse peers that are not root.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agent::NODE_IP;
use common::case::{Case, running};
use common::{eventually, state_dir};
use rkubelet::cri::{Cri, api};
use rkubelet::server::connections;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

fn pki(file: &str) -> PathBuf {
    state_dir().join("pki").join(file)
}

fn api_address() -> SocketAddr {
    SocketAddr::new(NODE_IP.parse().expect("node IP"), 10250)
}

/// A TLS client trusting the cluster CA; `authorized` presents the apiserver's kubelet
/// client certificate (system:masters).
fn client_config(authorized: bool) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki("ca.crt")).expect("ca.crt") {
        roots.add(cert.expect("CA certificate")).expect("CA added");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots);
    Arc::new(if authorized {
        let chain = CertificateDer::pem_file_iter(pki("apiserver-kubelet-client.crt"))
            .expect("client certificate")
            .collect::<Result<Vec<_>, _>>()
            .expect("certificates");
        let key = PrivateKeyDer::from_pem_file(pki("apiserver-kubelet-client.key")).expect("key");
        builder
            .with_client_auth_cert(chain, key)
            .expect("client auth")
    } else {
        builder.with_no_client_auth()
    })
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn connect(config: &Arc<rustls::ClientConfig>) -> std::io::Result<Tls> {
    connect_from(config, None).await
}

/// A TLS connection from the local address `source` (else the one the route picks).
async fn connect_from(
    config: &Arc<rustls::ClientConfig>,
    source: Option<IpAddr>,
) -> std::io::Result<Tls> {
    let tcp = match source {
        None => TcpStream::connect(api_address()).await?,
        Some(ip) => {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(ip, 0))?;
            socket.connect(api_address()).await?
        }
    };
    let ip: IpAddr = NODE_IP.parse().expect("node IP");
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(ServerName::IpAddress(ip.into()), tcp)
        .await
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// An HTTP answer: its status and body.
    Answer(u16, String),
    /// The connection closed (or was reset) without an answer.
    Closed(String),
}

impl Outcome {
    fn status(&self) -> Option<u16> {
        match self {
            Self::Answer(s, _) => Some(*s),
            Self::Closed(_) => None,
        }
    }
}

/// Reads a whole answer (the server closes, or `Connection: close` was asked) of at most
/// 4 MiB.
async fn read_answer(stream: &mut (impl AsyncRead + Unpin)) -> Outcome {
    let mut buf = Vec::new();
    match stream.take(4 << 20).read_to_end(&mut buf).await {
        Ok(_) => {}
        Err(e) if buf.is_empty() => return Outcome::Closed(e.to_string()),
        Err(_) => {}
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Outcome::Closed(format!("no HTTP answer: {text:?}"));
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Outcome::Answer(status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            out.push_str(&rest[..n.min(rest.len())]);
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// One request with `Connection: close` and `extra` header lines; the whole exchange
/// within 60 s.
async fn request(
    config: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    extra: &str,
) -> Outcome {
    request_from(config, None, method, path, extra).await
}

/// [`request`] from the local address `source`.
async fn request_from(
    config: &Arc<rustls::ClientConfig>,
    source: Option<IpAddr>,
    method: &str,
    path: &str,
    extra: &str,
) -> Outcome {
    let exchange = async {
        let mut tls = match connect_from(config, source).await {
            Ok(t) => t,
            Err(e) => return Outcome::Closed(format!("connect: {e}")),
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {NODE_IP}:10250\r\n{extra}Connection: close\r\n\r\n"
        );
        if let Err(e) = tls.write_all(head.as_bytes()).await {
            return Outcome::Closed(format!("write: {e}"));
        }
        read_answer(&mut tls).await
    };
    tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer nor close within 60 s"))
}

/// The agent's resident memory (KiB) and open file descriptors.
fn usage(pid: i32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .count();
    (rss, fds)
}

/// Samples the agent's usage every 20 ms until dropped; the peaks so far.
struct Sampler {
    peak: Arc<std::sync::Mutex<(u64, usize)>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(pid: i32) -> Self {
        let peak = Arc::new(std::sync::Mutex::new(usage(pid)));
        let shared = peak.clone();
        let task = tokio::spawn(async move {
            loop {
                let (rss, fds) = usage(pid);
                {
                    let mut p = shared.lock().expect("peak");
                    p.0 = p.0.max(rss);
                    p.1 = p.1.max(fds);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Self { peak, task }
    }

    fn peak(&self) -> (u64, usize) {
        *self.peak.lock().expect("peak")
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn agent_pid(case: &Case) -> i32 {
    case.agent().pid().as_raw()
}

async fn api_up(admin: &Arc<rustls::ClientConfig>) {
    eventually("the kubelet API", Duration::from_secs(60), || async {
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            request(admin, "GET", "/healthz", ""),
        )
        .await;
        (answer.ok()?.status() == Some(200)).then_some(())
    })
    .await;
}

/// Connections to the API server the agent may keep pooled (idle for up to 90 s) after a
/// flood: one per review in flight (token and access reviews, each bounded), and a few of
/// its own work during the flood (status patches, events, watch reconnections).
const POOLED: usize = 2 * rkubelet::server::auth::MAX_REVIEWS_IN_FLIGHT + 4;

/// Waits until the agent's fd count is back to `baseline` plus [`POOLED`]; the count seen.
async fn fds_settle(pid: i32, baseline: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, fds) = usage(pid);
        if fds <= baseline + POOLED || Instant::now() > deadline {
            return fds;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn sleeper() -> serde_json::Value {
    serde_json::json!({
        "metadata": {},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": "busybox",
                "command": ["sh", "-c", "echo ready; while true; do echo tick; sleep 1; done"],
            }]
        }
    })
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_thousand_concurrent_requests_leave_memory_and_fds_at_baseline() {
    let case = Case::with_agent("flood", &[]).await;
    let admin = client_config(true);
    let anonymous = client_config(false);
    api_up(&admin).await;
    let pid = agent_pid(&case);
    // Warm: the decision for the admin is cached, the TLS and HTTP paths have run.
    for _ in 0..3 {
        assert_eq!(
            request(&admin, "GET", "/pods", "").await.status(),
            Some(200)
        );
        assert_eq!(
            request(&anonymous, "GET", "/pods", "").await.status(),
            Some(401)
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = usage(pid);
    let sampler = Sampler::start(pid);

    // A pod created as the flood starts still syncs.
    let pod = case.create("sync", sleeper()).await;
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    // From 250 addresses (127.0.0.2 to 127.0.0.251), four clients each, as from a cluster's
    // many pods and monitors: one address alone holds only a few of the connections not
    // yet authenticated (`a_pod_filling_the_kubelet_api_locks_no_one_out`).
    for i in 0..1000u16 {
        let source = IpAddr::from([127, 0, 0, 2 + u8::try_from(i % 250).expect("a byte")]);
        let (config, extra, kind) = match i % 3 {
            0 => (admin.clone(), String::new(), "authorized"),
            1 => (anonymous.clone(), String::new(), "anonymous"),
            _ => (
                anonymous.clone(),
                format!("Authorization: Bearer invented-{i}\r\n"),
                "invented token",
            ),
        };
        clients.spawn(async move {
            let path = if i % 2 == 0 { "/pods" } else { "/healthz" };
            (
                kind,
                request_from(&config, Some(source), "GET", path, &extra).await,
            )
        });
    }
    let mut answered = std::collections::BTreeMap::<(&str, u16), usize>::new();
    let mut closed = Vec::new();
    while let Some(done) = clients.join_next().await {
        match done.expect("client task") {
            (kind, Outcome::Answer(status, _)) => *answered.entry((kind, status)).or_default() += 1,
            (kind, Outcome::Closed(why)) => closed.push(format!("{kind}: {why}")),
        }
    }
    let flood = started.elapsed();
    let peak = sampler.peak();
    drop(sampler);
    let settled_fds = fds_settle(pid, before.1).await;
    // The agent hands freed heap back to the kernel every 10 s: one round of it.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let after = usage(pid);
    eprintln!(
        "1000 concurrent requests in {flood:?}: {answered:?}, {} closed without answer; \
         RSS {} -> peak {} -> after {} KiB; fds {} -> peak {} -> after {} (settled at {settled_fds})",
        closed.len(),
        before.0,
        peak.0,
        after.0,
        before.1,
        peak.1,
        after.1
    );
    let total: usize = answered.values().sum::<usize>() + closed.len();
    assert_eq!(total, 1000, "every request ends");
    for ((kind, status), n) in &answered {
        let expected = if *kind == "authorized" { 200 } else { 401 };
        assert_eq!(*status, expected, "{n} {kind} requests answered {status}");
    }
    assert!(
        closed.len() <= 10,
        "at most a few connections closed unanswered: {closed:?}"
    );
    // Bounded while it lasts: the connection budgets (pending and authenticated) hold the
    // clients' fds and buffers, the review limit (8) the connections to the API server.
    assert!(
        peak.1 <= before.1 + connections::ACCEPTED + connections::AUTHENTICATED + POOLED + 12,
        "fds peak {} from {}",
        peak.1,
        before.1
    );
    assert!(
        peak.0 <= before.0 + 96 * 1024,
        "RSS peak {} KiB from {} KiB",
        peak.0,
        before.0
    );
    // And back: every client's fd closed, but for the pooled API connections; memory near
    // where it was.
    assert!(
        settled_fds <= before.1 + POOLED,
        "fds {} after, {} before",
        settled_fds,
        before.1
    );
    assert!(
        after.0 <= before.0 + 24 * 1024,
        "RSS {} KiB after, {} KiB before",
        after.0,
        before.0
    );

    // Still healthy and syncing.
    let healthz = Command::new("curl")
        .args(["-sS", "--max-time", "5", "http://127.0.0.1:10248/healthz"])
        .output()
        .await
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&healthz.stdout).trim(), "ok");
    assert_eq!(
        request(&admin, "GET", "/healthz", "").await,
        Outcome::Answer(200, "ok\n".into())
    );
    running(&pod).await;
    eprintln!(
        "the pod created with the flood ran {:?} after its creation",
        started.elapsed()
    );
}

/// Writes `head`, then up to `body` bytes in 64 KiB pieces (stopping at the first write
/// error: the server may close early), then reads the answer.
async fn send_large(
    config: &Arc<rustls::ClientConfig>,
    head: &str,
    body: usize,
    chunked: bool,
) -> Outcome {
    let exchange = async {
        let mut tls = connect(config).await.expect("connect");
        if tls.write_all(head.as_bytes()).await.is_err() {
            return read_answer(&mut tls).await;
        }
        let piece = vec![b'a'; 64 * 1024];
        let mut sent = 0;
        while sent < body {
            let write = if chunked {
                let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
                chunk.extend_from_slice(&piece);
                chunk.extend_from_slice(b"\r\n");
                tls.write_all(&chunk).await
            } else {
                tls.write_all(&piece).await
            };
            if write.is_err() {
                break;
            }
            sent += piece.len();
        }
        let _ = tls.flush().await;
        read_answer(&mut tls).await
    };
    tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .expect("answered or closed within 60 s")
}

/// A client that sends its request head one line every `every`, forever; how long the
/// server let it, and what it answered.
async fn slowloris(
    config: Option<Arc<rustls::ClientConfig>>,
    every: Duration,
) -> (Duration, Outcome) {
    let started = Instant::now();
    let mut tcp = TcpStream::connect(api_address()).await.expect("connect");
    let Some(config) = config else {
        // Not even a TLS handshake: the bytes of nothing.
        let outcome = read_answer(&mut tcp).await;
        return (started.elapsed(), outcome);
    };
    let ip: IpAddr = NODE_IP.parse().expect("node IP");
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::IpAddress(ip.into()), tcp)
        .await
        .expect("handshake");
    let mut line = 0u64;
    let mut head = format!("GET /pods HTTP/1.1\r\nHost: {NODE_IP}\r\n").into_bytes();
    loop {
        if tls.write_all(&head).await.is_err() || tls.flush().await.is_err() {
            break;
        }
        let mut byte = [0u8; 1];
        match tokio::time::timeout(every, tls.read(&mut byte)).await {
            Err(_) => {}
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(_)) => {
                // An answer began: read it.
                let mut rest = byte.to_vec();
                let _ = tls.read_to_end(&mut rest).await;
                let text = String::from_utf8_lossy(&rest).into_owned();
                let status = text
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                return (started.elapsed(), Outcome::Answer(status, text));
            }
        }
        line += 1;
        head = format!("X-Slow-{line}: a\r\n").into_bytes();
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "a slow client is never cut"
        );
    }
    (started.elapsed(), Outcome::Closed("closed".into()))
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn oversized_heads_and_bodies_are_refused_and_slow_clients_cut() {
    let case = Case::with_agent("oversize", &[]).await;
    let admin = client_config(true);
    let anonymous = client_config(false);
    api_up(&admin).await;
    let pid = agent_pid(&case);
    let before = usage(pid);

    // Slow clients first: they are cut while the rest runs.
    let no_handshake = tokio::spawn(slowloris(None, Duration::from_secs(1)));
    let dribbling = tokio::spawn(slowloris(Some(admin.clone()), Duration::from_secs(2)));
    let dribbling_anonymous =
        tokio::spawn(slowloris(Some(anonymous.clone()), Duration::from_secs(2)));

    let sampler = Sampler::start(pid);
    let refused_head = |o: &Outcome| matches!(o.status(), None | Some(431 | 400));
    // 1 MiB of headers, in one header and in many.
    let big = "a".repeat(1 << 20);
    let one = send_large(
        &admin,
        &format!("GET /pods HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n"),
        0,
        false,
    )
    .await;
    assert!(refused_head(&one), "1 MiB header: {one:?}");
    let many: String = (0..8192)
        .map(|i| format!("X-H{i}: {}\r\n", "b".repeat(120)))
        .collect();
    let many = send_large(
        &admin,
        &format!("GET /pods HTTP/1.1\r\nHost: x\r\n{many}\r\n"),
        0,
        false,
    )
    .await;
    assert!(refused_head(&many), "8192 headers: {many:?}");
    let anonymous_big = send_large(
        &anonymous,
        &format!("GET /pods HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n"),
        0,
        false,
    )
    .await;
    assert!(
        refused_head(&anonymous_big),
        "1 MiB header, anonymous: {anonymous_big:?}"
    );
    eprintln!(
        "1 MiB header: {:?}; 8192 headers: {:?}; 1 MiB header, anonymous: {:?}",
        one.status(),
        many.status(),
        anonymous_big.status()
    );

    // Huge bodies, announced and chunked, to paths that take POST and to those that do not.
    let refused_body = |o: &Outcome| !matches!(o.status(), Some(200..=299));
    for (config, path, chunked) in [
        (
            &admin,
            "/exec/default/nobody/c?command=true&stdout=1",
            false,
        ),
        (&admin, "/exec/default/nobody/c?command=true&stdout=1", true),
        (&admin, "/run/default/nobody/c?cmd=true", false),
        (&admin, "/pods", false),
        (&admin, "/portForward/default/nobody?port=80", true),
        (&anonymous, "/exec/default/nobody/c?command=true", false),
        (&anonymous, "/pods", true),
    ] {
        let length = if chunked {
            "Transfer-Encoding: chunked\r\n".to_owned()
        } else {
            format!("Content-Length: {}\r\n", 1u64 << 30)
        };
        let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\n{length}\r\n");
        let started = Instant::now();
        let outcome = send_large(config, &head, 64 << 20, chunked).await;
        eprintln!(
            "POST {path} with a 1 GiB body (chunked: {chunked}): {:?} in {:?}",
            outcome.status(),
            started.elapsed()
        );
        assert!(refused_body(&outcome), "POST {path}: {outcome:?}");
    }
    let peak = sampler.peak();
    drop(sampler);
    assert!(
        peak.0 <= before.0 + 32 * 1024,
        "RSS peak {} KiB from {} KiB with oversized requests",
        peak.0,
        before.0
    );

    let (handshake_cut, outcome) = no_handshake.await.expect("task");
    assert!(matches!(outcome, Outcome::Closed(_)), "{outcome:?}");
    let (cut, outcome) = dribbling.await.expect("task");
    assert_ne!(outcome.status(), Some(200), "{outcome:?}");
    let (anonymous_cut, anonymous_outcome) = dribbling_anonymous.await.expect("task");
    assert_ne!(
        anonymous_outcome.status(),
        Some(200),
        "{anonymous_outcome:?}"
    );
    let settled_fds = fds_settle(pid, before.1).await;
    let after = usage(pid);
    eprintln!(
        "slow clients cut: no handshake after {handshake_cut:?}, dribbled heads after {cut:?} \
         ({outcome:?}) and {anonymous_cut:?}; oversized requests: RSS {} -> peak {} -> after {} KiB, \
         fds {} -> peak {} -> after {settled_fds}",
        before.0, peak.0, after.0, before.1, peak.1
    );
    assert!(handshake_cut < Duration::from_secs(15), "{handshake_cut:?}");
    assert!(cut < Duration::from_secs(70) && anonymous_cut < Duration::from_secs(70));
    assert!(
        settled_fds <= before.1 + POOLED,
        "fds {settled_fds} after, {} before",
        before.1
    );
    assert_eq!(
        request(&admin, "GET", "/healthz", "").await.status(),
        Some(200)
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn log_requests_with_path_tricks_read_only_the_named_containers_log() {
    let case = Case::with_agent("logtricks", &[]).await;
    let admin = client_config(true);
    api_up(&admin).await;
    let pod = case.create("a", sleeper()).await;
    let running_pod = running(&pod).await;
    let uid = running_pod.metadata.uid.clone().expect("uid");
    let own = eventually("the pod's log", Duration::from_secs(20), || async {
        match request(
            &admin,
            "GET",
            &format!("/containerLogs/default/{pod}/c"),
            "",
        )
        .await
        {
            Outcome::Answer(200, body) if body.contains("ready") => Some(body),
            _ => None,
        }
    })
    .await;
    assert!(own.starts_with("ready\n"), "{own}");

    // Things a log request must never show.
    let passwd = std::fs::read_to_string("/etc/passwd").expect("passwd");
    let secret_line = passwd.lines().next().expect("a line").to_owned();
    let logs_dir = case.agent().root_dir.join("logs");
    let pod_logs = format!("default_{pod}_{uid}");
    for path in [
        format!("/containerLogs/default/{pod}/.."),
        format!("/containerLogs/default/{pod}/../../../../../../etc/passwd"),
        format!("/containerLogs/default/{pod}/..%2F..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd"),
        format!("/containerLogs/default/{pod}/%2e%2e"),
        format!("/containerLogs/default/{pod}/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd"),
        format!("/containerLogs/default/{pod}/c%2F..%2F..%2F..%2Fetc%2Fpasswd"),
        format!("/containerLogs/default/{pod}/c/../../../../etc/passwd"),
        format!("/containerLogs/default/{pod}/c%2F0.log"),
        format!("/containerLogs/default/{pod}/c/0.log"),
        format!("/containerLogs/default/{pod}/%2Fetc%2Fpasswd"),
        "/containerLogs/default/..%2F..%2F..%2Fetc/passwd".to_owned(),
        "/containerLogs/../../../etc/passwd".to_owned(),
        format!("/containerLogs/default%2F{pod}/c/x"),
        // The pod under another namespace, and another namespace's pod by a trick.
        format!("/containerLogs/kube-system/{pod}/c"),
        format!("/containerLogs/kube-system%2F..%2Fdefault/{pod}/c"),
        format!("/containerLogs/default/{pod_logs}/c"),
        format!("/containerLogs/default/{pod}/{pod_logs}%2Fc"),
        format!("/containerLogs/default/{pod}/c?previous=true"),
        // The kubelet's /logs/ file server: only ever /var/log, never beyond.
        "/logs/../../../etc/passwd".to_owned(),
        "/logs/..%2F..%2F..%2Fetc%2Fpasswd".to_owned(),
        "/logs/%2e%2e/%2e%2e/etc/passwd".to_owned(),
        format!(
            "/logs/{}",
            logs_dir.join(&pod_logs).join("c/0.log").display()
        ),
    ] {
        let outcome = request(&admin, "GET", &path, "").await;
        eprintln!("{path}: {:?}", outcome.status());
        if let Outcome::Answer(status, body) = &outcome {
            assert!(
                !body.contains(&secret_line),
                "{path} read /etc/passwd: {status}"
            );
            assert!(
                !body.contains("tick"),
                "{path} read a container log: {status} {body}"
            );
            assert!(
                !(200..300).contains(status) || path.starts_with("/logs/"),
                "{path}: {status} {body}"
            );
        }
    }
    // The node's /var/log is listed, as by the kubelet, to the authorized only.
    let names: Vec<String> = std::fs::read_dir("/var/log")
        .expect("/var/log")
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .take(5)
        .collect();
    match request(&admin, "GET", "/logs/", "").await {
        Outcome::Answer(200, body) => {
            assert!(body.starts_with("<pre>\n"), "{body}");
            for name in &names {
                assert!(body.contains(&format!(">{name}")), "{name} not in {body}");
            }
        }
        other => panic!("/logs/: {other:?}"),
    }
    let anonymous = client_config(false);
    assert_eq!(
        request(&anonymous, "GET", "/logs/", "").await.status(),
        Some(401)
    );
}

/// Connects to a Unix socket as `euid` (file access as root, so that only the peer
/// credentials differ), sends `request` and answers what came back, or why not.
async fn unix_exchange(
    socket: &Path,
    euid: Option<u32>,
    unprivileged_files: bool,
    request: &str,
) -> String {
    // Perl: the test process is threaded and may not change its credentials.
    let script = r#"
        use IO::Socket::UNIX;
        # A peer refused may be closed before the request is written: no SIGPIPE death.
        $SIG{PIPE} = 'IGNORE';
        my ($path, $euid, $files, $req) = @ARGV;
        if ($euid ne "") {
            $> = $euid; die "seteuid: $!" unless $> == $euid;
            # setfsuid(0) is allowed (0 is the real uid): files are still opened as root.
            syscall(122, 0) if $files eq "root";
        }
        my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $path)
            or do { print "connect: $!"; exit 0 };
        print $s $req;
        local $/;
        my $answer = <$s>;
        print "answer: ", ($answer // "");
    "#;
    let out = Command::new("perl")
        .args(["-e", script])
        .arg(socket)
        .arg(euid.map(|u| u.to_string()).unwrap_or_default())
        .arg(if unprivileged_files { "own" } else { "root" })
        .arg(request)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("within 20 s")
        .expect("perl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_cni_and_debug_sockets_refuse_peers_that_are_not_root() {
    let case = Case::with_agent("sockets", &[]).await;
    let root = case.agent().root_dir.clone();
    let debug = root.join("rkubelet.sock");
    let shim = root.join("cni.sock");
    eventually("both sockets", Duration::from_secs(30), || async {
        (debug.exists() && shim.exists()).then_some(())
    })
    .await;
    let http = "GET /debug/timeline HTTP/1.0\r\n\r\n";
    let cni = "{\"command\":\"VERSION\"}\n";
    for (socket, request) in [(&debug, http), (&shim, cni)] {
        // Root is served.
        let answer = unix_exchange(socket, None, false, request).await;
        assert!(
            answer.starts_with("answer: ") && answer.len() > "answer: ".len(),
            "{}: {answer}",
            socket.display()
        );
        // nobody cannot even open the socket file (mode 0600).
        let answer = unix_exchange(socket, Some(65534), true, request).await;
        assert!(
            answer.starts_with("connect: Permission denied"),
            "{}: {answer}",
            socket.display()
        );
        // nobody with root's file access connects, and the peer check refuses it.
        let answer = unix_exchange(socket, Some(65534), false, request).await;
        assert_eq!(
            answer,
            "answer: ",
            "{}: nobody was served",
            socket.display()
        );
    }
    let log = case.agent().this_runs_log().expect("agent log");
    assert!(
        log.contains("refusing a shim request from an unprivileged peer"),
        "{}",
        case.agent().log_tail()
    );
}

/// The network namespace of the pod with this UID, through its running container's PID.
async fn netns_of(uid: &str) -> std::fs::File {
    let container = common::pods::running_containers_of(uid)
        .await
        .into_iter()
        .next()
        .expect("a running container");
    let status = common::cri()
        .container_status(api::ContainerStatusRequest {
            container_id: container.id,
            verbose: true,
        })
        .await
        .expect("ContainerStatus");
    let info: serde_json::Value =
        serde_json::from_str(status.info.get("info").expect("verbose info")).expect("JSON");
    let pid = info["pid"].as_u64().expect("the container's PID");
    std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("its netns")
}

type Dialed = tokio::sync::oneshot::Sender<std::io::Result<std::net::TcpStream>>;

/// Opens TCP connections to the kubelet API from inside a network namespace: a thread of
/// its own enters it, and the sockets it makes stay there.
#[derive(Clone)]
struct PodDialer(std::sync::mpsc::Sender<Dialed>);

impl PodDialer {
    fn new(netns: std::fs::File) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<Dialed>();
        std::thread::spawn(move || {
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("entering the pod's netns");
            for reply in rx {
                let dialed =
                    std::net::TcpStream::connect_timeout(&api_address(), Duration::from_secs(5))
                        .and_then(|s| s.set_nonblocking(true).map(|()| s));
                let _ = reply.send(dialed);
            }
        });
        Self(tx)
    }

    async fn dial(&self) -> std::io::Result<TcpStream> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.0.send(tx).expect("the dialer thread");
        TcpStream::from_std(rx.await.expect("the dialer thread")?)
    }
}

/// The start of a TLS record announcing a 512-byte ClientHello, of which only its first
/// bytes come: a handshake that stalls.
const STALLED_HELLO: [u8; 11] = [
    0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
];

/// What the attacking clients saw.
#[derive(Debug, Default)]
struct Attack {
    /// Connections made.
    dialed: std::sync::atomic::AtomicUsize,
    /// Connections open now (not closed by the server).
    open: std::sync::atomic::AtomicUsize,
    /// Connections the server closed within a second.
    closed_at_once: std::sync::atomic::AtomicUsize,
}

/// Where attacking connections come from: a pod's network namespace, or a local address.
#[derive(Clone)]
enum Source {
    Pod(PodDialer),
    Address(IpAddr),
}

impl Source {
    async fn dial(&self) -> std::io::Result<TcpStream> {
        match self {
            Self::Pod(dialer) => dialer.dial().await,
            Self::Address(ip) => {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(SocketAddr::new(*ip, 0))?;
                socket.connect(api_address()).await
            }
        }
    }
}

/// What an attacking connection sends before it idles.
#[derive(Clone, Copy)]
enum Stall {
    /// Nothing.
    Idle,
    /// The start of a ClientHello.
    Hello,
    /// A whole TLS handshake (no client certificate), then no request.
    Handshake,
}

/// One attacking client: connects, sends what `stall` says, holds the connection until the
/// server closes it, and connects again a second later, until `stop`.
async fn attacker(
    source: Source,
    stall: Stall,
    attack: Arc<Attack>,
    stop: tokio_util::sync::CancellationToken,
) {
    use std::sync::atomic::Ordering::SeqCst;
    let anonymous = client_config(false);
    while !stop.is_cancelled() {
        let Ok(mut stream) = source.dial().await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        attack.dialed.fetch_add(1, SeqCst);
        attack.open.fetch_add(1, SeqCst);
        let opened = Instant::now();
        let held = async {
            let mut buf = [0u8; 1024];
            match stall {
                Stall::Idle => {}
                Stall::Hello => {
                    if stream.write_all(&STALLED_HELLO).await.is_err() {
                        return;
                    }
                }
                Stall::Handshake => {
                    let ip: IpAddr = NODE_IP.parse().expect("node IP");
                    let connector = tokio_rustls::TlsConnector::from(anonymous.clone());
                    if let Ok(mut tls) = connector
                        .connect(ServerName::IpAddress(ip.into()), &mut stream)
                        .await
                    {
                        while matches!(tls.read(&mut buf).await, Ok(n) if n > 0) {}
                    }
                    return;
                }
            }
            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
        };
        tokio::select! {
            () = held => {}
            () = stop.cancelled() => {}
        }
        attack.open.fetch_sub(1, SeqCst);
        if opened.elapsed() < Duration::from_secs(1) {
            attack.closed_at_once.fetch_add(1, SeqCst);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `kubectl ARGS` as the admin: its standard output (else what went wrong) and how long it
/// took (10 s at most).
async fn timed_kubectl(args: &[&str]) -> (String, Duration) {
    let started = Instant::now();
    let output = tokio::time::timeout(
        Duration::from_secs(10),
        common::kubectl_command(args).kill_on_drop(true).output(),
    )
    .await;
    let took = started.elapsed();
    match output {
        Ok(Ok(o)) if o.status.success() => (String::from_utf8_lossy(&o.stdout).into_owned(), took),
        Ok(Ok(o)) => (
            format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr)),
            took,
        ),
        Ok(Err(e)) => (format!("kubectl: {e}"), took),
        Err(_) => ("no answer within 10 s".into(), took),
    }
}

/// Addresses of the flood beside the pod's, as from as many pods: more than the 16 whose
/// share of pending connections (32 each) filled the 512 slots before issue 46, and
/// enough that [`PER_ADDRESS`] connections each hold more than all of them.
const FLOOD_ADDRESSES: u8 = 72;
/// Connections of each flooding address: as many as one address may have in its handshake
/// at once. Through the handshake and then silent, each holds its slot until the header
/// read timeout (60 s); none waits behind its own address's (a waiting one is closed after
/// the 10 s handshake timeout, which would free its slot for the API server's).
const PER_ADDRESS: usize = connections::PENDING_PER_PEER;

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn pods_filling_the_kubelet_api_from_many_addresses_lock_no_one_out() {
    use std::sync::atomic::Ordering::SeqCst;
    let case = Case::with_agent("lockout", &[]).await;
    let admin = client_config(true);
    api_up(&admin).await;
    let victim = case.create("victim", sleeper()).await;
    let attacker_pod = case.create("attacker", sleeper()).await;
    running(&victim).await;
    let uid = running(&attacker_pod).await.metadata.uid.expect("a UID");
    let dialer = PodDialer::new(netns_of(&uid).await);
    // Before: exec as a user runs it, through the API server (logs are first asked under
    // attack, so that the API server has no connection to the node to reuse).
    let (said, before) = timed_kubectl(&["exec", &victim, "--", "echo", "before"]).await;
    assert_eq!(said.trim(), "before", "exec before the attack");

    // From 72 addresses (127.0.0.2 and on, as from 72 pods): 8 connections each through
    // the handshake and then silent, held until the header read timeout: 576, more than
    // the 512 pending slots. Then from the pod: 300 idle connections and 300 stalled TLS
    // handshakes. All held as long as the server lets them, and made again when it closes
    // them. Before issue 46 nothing freed a slot for the API server's connections until
    // the first silent ones timed out, a minute on.
    let attack = Arc::new(Attack::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let mut attackers = tokio::task::JoinSet::new();
    for address in 0..FLOOD_ADDRESSES {
        let source = Source::Address(IpAddr::from([127, 0, 0, 2 + address]));
        for _ in 0..PER_ADDRESS {
            attackers.spawn(attacker(
                source.clone(),
                Stall::Handshake,
                attack.clone(),
                stop.clone(),
            ));
        }
    }
    let silent = PER_ADDRESS * usize::from(FLOOD_ADDRESSES);
    eventually(
        "the silent connections made",
        Duration::from_secs(60),
        || async { (attack.dialed.load(SeqCst) >= silent).then_some(()) },
    )
    .await;
    for i in 0..600 {
        let stall = if i % 2 == 1 {
            Stall::Hello
        } else {
            Stall::Idle
        };
        attackers.spawn(attacker(
            Source::Pod(dialer.clone()),
            stall,
            attack.clone(),
            stop.clone(),
        ));
    }
    let flood = silent + 600;
    eventually(
        "the attacking connections made",
        Duration::from_secs(60),
        || async { (attack.dialed.load(SeqCst) >= flood).then_some(()) },
    )
    .await;
    // The flood's connections are old enough to be cut for a newcomer's.
    tokio::time::sleep(connections::CUT_AFTER + Duration::from_secs(1)).await;
    let held = attack.open.load(SeqCst);

    let (logs, logs_took) = timed_kubectl(&["logs", &victim]).await;
    let (said, exec_took) = timed_kubectl(&["exec", &victim, "--", "echo", "during"]).await;
    let metrics_path = format!("/api/v1/nodes/{}/proxy/metrics", common::node_name());
    let (metrics, metrics_took) = timed_kubectl(&["get", "--raw", &metrics_path]).await;
    let held_after = attack.open.load(SeqCst);
    stop.cancel();
    while attackers.join_next().await.is_some() {}
    eprintln!(
        "under attack ({} connections made, {held}..{held_after} open, {} closed within 1 s): \
         kubectl logs in {logs_took:?}, kubectl exec in {exec_took:?}, metrics scrape in \
         {metrics_took:?} (exec before: {before:?})",
        attack.dialed.load(SeqCst),
        attack.closed_at_once.load(SeqCst),
    );
    // The attack was on: the server held the pending budget's worth of connections.
    assert!(
        held >= connections::PENDING - 64,
        "only {held} attacking connections open"
    );
    assert!(
        logs.starts_with("ready\n"),
        "kubectl logs under attack: {logs:?}"
    );
    assert_eq!(said.trim(), "during", "kubectl exec under attack");
    assert!(
        metrics.contains("kubelet_running_pods"),
        "metrics scrape under attack: {}",
        &metrics[..metrics.len().min(300)]
    );
    // The bound: a connection of the API server's takes the slot of the flood's oldest
    // (the flood's connections are older than `CUT_AFTER`) once the accept loop reaches it
    // behind the flood's re-made connections, is authenticated by its certificate within
    // its handshake, and is never cut. It is under the 10 s kubectl is given here; before
    // issue 46 the API server's connections waited for the silent ones' header read
    // timeout. On this 2-core
    // machine, with the flood's clients in the test's own process, the first run of the
    // earlier flood (20 addresses of 40 mixed connections) took 3.2 s for logs, 2.1 s for
    // exec, 0.1 s for the scrape.
    for (what, took) in [
        ("logs", logs_took),
        ("exec", exec_took),
        ("metrics", metrics_took),
    ] {
        assert!(
            took < Duration::from_secs(8),
            "under attack: {what} in {took:?}"
        );
    }
}

/// A ServiceAccount of the test's bound to the kubelet API's admin role (as
/// metrics-server's and Prometheus's are bound to theirs), and a token of it; both go when
/// dropped.
struct Scraper {
    name: String,
    token: String,
}

impl Scraper {
    async fn new() -> Self {
        let name = common::unique("scraper");
        common::kubectl(&["create", "serviceaccount", &name]).await;
        let subject = format!("--serviceaccount=default:{name}");
        common::kubectl(&[
            "create",
            "clusterrolebinding",
            &name,
            "--clusterrole=system:kubelet-api-admin",
            &subject,
        ])
        .await;
        let user = format!("system:serviceaccount:default:{name}");
        eventually("the binding in force", Duration::from_secs(30), || async {
            let allowed =
                common::kubectl(&["auth", "can-i", "get", "nodes/metrics", "--as", &user]).await;
            (allowed.trim() == "yes").then_some(())
        })
        .await;
        let token = common::kubectl(&["create", "token", &name, "--duration=1h"])
            .await
            .trim()
            .to_owned();
        Self { name, token }
    }

    fn user(&self) -> String {
        format!("system:serviceaccount:default:{}", self.name)
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        let name = self.name.clone();
        common::cleanup_blocking(move || async move {
            let _ = common::kubectl_command(&["delete", "clusterrolebinding", &name])
                .output()
                .await;
            let _ = common::kubectl_command(&["delete", "serviceaccount", &name])
                .output()
                .await;
        });
    }
}

/// How long the flood of invented tokens lasts: beyond the refused tokens' 10 s in the
/// cache.
const TOKEN_FLOOD: Duration = Duration::from_secs(15);

/// Invented bearer tokens from 20 addresses, as fast as 64 clients get them refused, while
/// a valid client scrapes every 100 ms with its token: the valid client's review stays
/// cached (no new TokenReview: the agent logs each review at debug), every scrape is
/// answered within a bound, and every invented token is refused. Before issue 46, more
/// than 4,096 refused tokens within 10 s flushed the valid reviews with them.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_flood_of_invented_tokens_evicts_no_valid_review_and_delays_no_valid_client() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let case = Case::with_agent("tokens", &[]).await;
    let admin = client_config(true);
    api_up(&admin).await;
    let scraper = Scraper::new().await;
    let anonymous = client_config(false);
    let valid = format!("Authorization: Bearer {}\r\n", scraper.token);
    let first = request(&anonymous, "GET", "/metrics/resource", &valid).await;
    assert_eq!(first.status(), Some(200), "the valid client: {first:?}");

    let stop = tokio_util::sync::CancellationToken::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let other = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut flood = tokio::task::JoinSet::new();
    for client in 0..64u32 {
        let (anonymous, stop, refused, other) = (
            anonymous.clone(),
            stop.clone(),
            refused.clone(),
            other.clone(),
        );
        let source = IpAddr::from([127, 0, 0, 2 + u8::try_from(client % 20).expect("a byte")]);
        flood.spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                n += 1;
                let junk = format!(
                    "Authorization: Bearer invented-{client}-{n}-{}\r\n",
                    std::process::id()
                );
                match request_from(&anonymous, Some(source), "GET", "/metrics", &junk).await {
                    Outcome::Answer(401, _) => {
                        refused.fetch_add(1, SeqCst);
                    }
                    other_outcome => other
                        .lock()
                        .expect("outcomes")
                        .push(format!("{other_outcome:?}")),
                }
            }
        });
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut answers = Vec::new();
    while started.elapsed() < TOKEN_FLOOD {
        let asked = Instant::now();
        let answer = request(&anonymous, "GET", "/metrics/resource", &valid).await;
        latencies.push(asked.elapsed());
        answers.push(answer.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    while flood.join_next().await.is_some() {}
    let flooded = started.elapsed();
    latencies.sort();
    let log = case.agent().this_runs_log().expect("the agent's log");
    let user = scraper.user();
    let valid_reviews = log
        .lines()
        .filter(|l| l.contains("token reviewed: valid") && l.contains(&user))
        .count();
    let refused_reviews = log.matches("token reviewed: refused").count();
    let refused = refused.load(SeqCst);
    eprintln!(
        "{refused} invented tokens refused in {flooded:?} ({:.0}/s, {refused_reviews} reviews); \
         valid client: {} scrapes, latency median {:?}, max {:?}; {valid_reviews} review(s) of its token",
        refused as f64 / flooded.as_secs_f64(),
        latencies.len(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
    );
    let other = other.lock().expect("outcomes").clone();
    assert!(
        other.len() <= refused / 100,
        "invented tokens not refused: {other:?}"
    );
    assert!(refused > 1000, "the flood was on: {refused} refused");
    assert!(
        answers.iter().all(|s| *s == Some(200)),
        "the valid client was refused: {answers:?}"
    );
    assert_eq!(valid_reviews, 1, "the valid token was reviewed again");
    let max = latencies[latencies.len() - 1];
    assert!(max < Duration::from_secs(1), "a valid scrape took {max:?}");
    drop(scraper);
}
