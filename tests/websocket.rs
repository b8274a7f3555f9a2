//! The kubelet API over WebSocket, as newer clients use it: exec and attach with the
//! `channel.k8s.io` subprotocols (binary and base64, v4 with its status on the error
//! channel) straight to :10250 and through the kube-apiserver's `pods/exec` and
//! `pods/attach`, and container logs (`binary.k8s.io`, `base64.binary.k8s.io`).

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::agent::NODE_IP;
use common::case::{Case, get, running};
use common::pods::sleeper;
use common::{eventually, state_dir};
use futures::{SinkExt, StreamExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

fn pki(file: &str) -> PathBuf {
    state_dir().join("pki").join(file)
}

/// Who a test connects to, and as whom.
struct Endpoint {
    address: &'static str,
    port: u16,
    cert: &'static str,
    key: &'static str,
}

/// The kubelet API, as the kube-apiserver calls it.
const KUBELET: Endpoint = Endpoint {
    address: NODE_IP,
    port: 10250,
    cert: "apiserver-kubelet-client.crt",
    key: "apiserver-kubelet-client.key",
};

/// The kube-apiserver, as the admin.
const APISERVER: Endpoint = Endpoint {
    address: "127.0.0.1",
    port: 6443,
    cert: "admin.crt",
    key: "admin.key",
};

type Socket = WebSocketStream<TlsStream<TcpStream>>;

impl Endpoint {
    async fn tls(&self) -> TlsStream<TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(pki("ca.crt")).expect("ca.crt") {
            roots.add(cert.expect("a CA certificate")).expect("CA");
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki(self.cert))
            .expect("client certificate")
            .collect::<Result<_, _>>()
            .expect("PEM");
        let key = PrivateKeyDer::from_pem_file(pki(self.key)).expect("client key");
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client identity");
        let ip: IpAddr = self.address.parse().expect("an IP");
        let tcp = TcpStream::connect((ip, self.port)).await.expect("connect");
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::from(ip), tcp)
            .await
            .expect("TLS handshake")
    }

    /// Opens a WebSocket on `path` offering `protocols`; the socket and the protocol the
    /// server chose, or the handshake's failure.
    async fn open(
        &self,
        path: &str,
        protocols: &[&str],
    ) -> Result<(Socket, Option<String>), tungstenite::Error> {
        let url = format!("wss://{}:{}{path}", self.address, self.port);
        let mut request = url.into_client_request().expect("a request");
        if !protocols.is_empty() {
            request.headers_mut().insert(
                "sec-websocket-protocol",
                protocols.join(", ").parse().expect("header"),
            );
        }
        let (socket, response) = tokio_tungstenite::client_async(request, self.tls().await).await?;
        let chosen = response
            .headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok())
            .map(ToOwned::to_owned);
        Ok((socket, chosen))
    }
}

/// What a session sent, by channel, until the server closed it.
#[derive(Debug, Default)]
struct Channels {
    data: BTreeMap<u8, Vec<u8>>,
    /// Frames were text (base64), binary.
    text: bool,
    binary: bool,
    /// The close frame's code.
    close: Option<u16>,
}

impl Channels {
    fn get(&self, channel: u8) -> String {
        String::from_utf8_lossy(self.data.get(&channel).map_or(&[][..], Vec::as_slice)).into_owned()
    }

    /// The error channel (3) as a `metav1.Status`.
    fn status(&self) -> serde_json::Value {
        let text = self.get(3);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("status {e}: {text:?} in {self:?}"))
    }

    /// Takes in one message; false once the server closed the session.
    fn add(&mut self, message: Message) -> bool {
        let (channel, data) = match message {
            Message::Binary(b) if !b.is_empty() => {
                self.binary = true;
                (b[0], b[1..].to_vec())
            }
            Message::Text(t) if !t.is_empty() => {
                self.text = true;
                let data = STANDARD.decode(&t.as_bytes()[1..]).expect("base64");
                (t.as_bytes()[0] - b'0', data)
            }
            Message::Close(frame) => {
                self.close = frame.map(|f| f.code.into());
                return false;
            }
            _ => return true,
        };
        self.data
            .entry(channel)
            .or_default()
            .extend_from_slice(&data);
        true
    }
}

/// A channel frame: binary `[channel, data…]`, or base64 text `"<digit><base64>"`.
fn frame(base64: bool, channel: u8, data: &[u8]) -> Message {
    if base64 {
        Message::text(format!("{channel}{}", STANDARD.encode(data)))
    } else {
        let mut bytes = vec![channel];
        bytes.extend_from_slice(data);
        Message::binary(bytes)
    }
}

/// Reads a channel session until the server closes it (30 s at most).
async fn collect(socket: &mut Socket) -> Channels {
    let mut got = Channels::default();
    let read = async {
        while let Some(message) = socket.next().await {
            if !got.add(message.expect("a message")) {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .unwrap_or_else(|_| panic!("the session ends within 30 s: {got:?}"));
    got
}

/// Reads until `channel` has `needle` (30 s at most); what came.
async fn read_until(socket: &mut Socket, channel: u8, needle: &str) -> Channels {
    let mut got = Channels::default();
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    if !read_into_until(socket, &mut got, channel, needle, until).await {
        panic!("{needle:?} on channel {channel} within 30 s: {got:?}");
    }
    got
}

/// Adds the messages that come on `socket` to `got` until `channel` shows `needle`
/// (true) or `until` passes (false).
async fn read_into_until(
    socket: &mut Socket,
    got: &mut Channels,
    channel: u8,
    needle: &str,
    until: tokio::time::Instant,
) -> bool {
    while !got.get(channel).contains(needle) {
        let Ok(message) = tokio::time::timeout_at(until, socket.next()).await else {
            return false;
        };
        let message = message.expect("open").expect("a message");
        assert!(got.add(message), "closed before {needle:?}: {got:?}");
    }
    true
}

/// Sends `word` as a line on stdin until the container's `got:` echo of it comes back
/// on stdout, as a user presses enter again: the runtime (containerd 1.6) starts copying a
/// new attach's input before it adds its output, so the answer to a line sent at once
/// may reach the container's log only.
async fn echo_through_attach(socket: &mut Socket, base64: bool, word: &str) -> Channels {
    let needle = format!("got:{word}");
    let mut got = Channels::default();
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        socket
            .send(frame(base64, 0, format!("{word}\n").as_bytes()))
            .await
            .expect("send");
        let resend = (tokio::time::Instant::now() + Duration::from_secs(2)).min(until);
        if read_into_until(socket, &mut got, 1, &needle, resend).await {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{needle:?} on stdout within 30 s: {got:?}"
        );
    }
}

/// Where a session goes: straight to the kubelet API, or through the kube-apiserver's
/// pod subresources (which pass the upgrade on to the kubelet).
#[derive(Debug, Clone, Copy)]
enum Via {
    Kubelet,
    Apiserver,
}

/// The standard streams a session asks for (stdout always, stderr unless a TTY).
#[derive(Debug, Clone, Copy, Default)]
struct Streams {
    stdin: bool,
    tty: bool,
}

impl Via {
    fn endpoint(self) -> &'static Endpoint {
        match self {
            Self::Kubelet => &KUBELET,
            Self::Apiserver => &APISERVER,
        }
    }

    /// The path of `subresource` (`exec`, `attach`) of the pod's container `main`, with
    /// the query each server names its own way.
    fn session(self, subresource: &str, pod: &str, command: &[&str], s: Streams) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for c in command {
            q.append_pair("command", c);
        }
        let on = |v: bool| if v { "1" } else { "0" };
        match self {
            Self::Kubelet => {
                q.append_pair("input", on(s.stdin))
                    .append_pair("output", "1")
                    .append_pair("error", on(!s.tty))
                    .append_pair("tty", on(s.tty));
                format!("/{subresource}/default/{pod}/main?{}", q.finish())
            }
            Self::Apiserver => {
                q.append_pair("container", "main")
                    .append_pair("stdin", &s.stdin.to_string())
                    .append_pair("stdout", "true")
                    .append_pair("stderr", &(!s.tty).to_string())
                    .append_pair("tty", &s.tty.to_string());
                format!(
                    "/api/v1/namespaces/default/pods/{pod}/{subresource}?{}",
                    q.finish()
                )
            }
        }
    }

    fn port_forward(self, pod: &str, port: u16) -> String {
        match self {
            Self::Kubelet => format!("/portForward/default/{pod}?port={port}"),
            Self::Apiserver => {
                format!("/api/v1/namespaces/default/pods/{pod}/portforward?ports={port}")
            }
        }
    }

    /// Opens `path` with `protocols`, sends `send`, and reads until the server closes;
    /// the chosen protocol and what came.
    async fn run(self, path: &str, protocols: &[&str], send: Vec<Message>) -> (String, Channels) {
        let (mut socket, chosen) = self
            .endpoint()
            .open(path, protocols)
            .await
            .unwrap_or_else(|e| panic!("{self:?} {path} {protocols:?}: {e}"));
        for m in send {
            socket.send(m).await.expect("send");
        }
        let got = collect(&mut socket).await;
        (chosen.unwrap_or_default(), got)
    }
}

const V4: &str = "v4.channel.k8s.io";
const V4_BASE64: &str = "v4.base64.channel.k8s.io";

fn exit_3() -> [&'static str; 3] {
    ["sh", "-c", "echo oops >&2; exit 3"]
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn exec_over_websocket_on_the_kubelet_and_through_the_apiserver() {
    let case = Case::with_agent("wsexec", &[]).await;
    let pod = case.create("exec", sleeper(serde_json::json!({}))).await;
    running(&pod).await;
    for via in [Via::Kubelet, Via::Apiserver] {
        let exec = |command: &[&str], s| via.session("exec", &pod, command, s);
        let plain = Streams::default();

        // v4: stdout, then a Success status on the error channel, then a normal close.
        let started = std::time::Instant::now();
        let (chosen, got) = via.run(&exec(&["echo", "hi"], plain), &[V4], vec![]).await;
        eprintln!(
            "exec echo over WebSocket via {via:?}: {:?} from connect to close",
            started.elapsed()
        );
        assert_eq!(chosen, V4);
        assert_eq!(got.get(1), "hi\n", "{via:?}");
        assert_eq!(got.status()["status"], "Success", "{via:?} {got:?}");
        assert!(got.binary && !got.text, "{got:?}");
        assert_eq!(got.close, Some(1000), "{via:?}");

        // A failing command: its stderr, and NonZeroExitCode with the exit code as cause.
        let (_, got) = via.run(&exec(&exit_3(), plain), &[V4], vec![]).await;
        assert_eq!(got.get(2), "oops\n", "{via:?}");
        let status = got.status();
        assert_eq!(status["status"], "Failure", "{status}");
        assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
        assert_eq!(
            status["details"]["causes"],
            serde_json::json!([{"reason": "ExitCode", "message": "3"}]),
            "{status}"
        );
        assert!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains("exit code 3")),
            "{status}"
        );

        // Before v4 the error channel carries the message alone, and nothing on success.
        let (chosen, got) = via
            .run(&exec(&exit_3(), plain), &["channel.k8s.io"], vec![])
            .await;
        assert_eq!(chosen, "channel.k8s.io");
        assert!(got.get(3).contains("exit code 3"), "{got:?}");
        assert!(!got.get(3).starts_with('{'), "{got:?}");
        let (chosen, got) = via
            .run(
                &exec(&["echo", "hi"], plain),
                &["base64.channel.k8s.io"],
                vec![],
            )
            .await;
        assert_eq!(chosen, "base64.channel.k8s.io");
        assert_eq!(got.get(1), "hi\n");
        assert!(got.text && !got.binary, "{got:?}");
        assert_eq!(got.get(3), "", "{got:?}");

        // Stdin round trip, binary and base64.
        for protocol in [V4, V4_BASE64] {
            let stdin = Streams {
                stdin: true,
                ..plain
            };
            let line = frame(protocol == V4_BASE64, 0, b"hello\n");
            let (chosen, got) = via
                .run(&exec(&["head", "-n", "1"], stdin), &[protocol], vec![line])
                .await;
            assert_eq!(chosen, protocol);
            assert_eq!(got.get(1), "hello\n", "{via:?} {protocol}");
            assert_eq!(got.status()["status"], "Success");
        }

        // A terminal sized through the resize channel (4).
        let tty = Streams {
            stdin: true,
            tty: true,
        };
        let resize = frame(false, 4, br#"{"Width":123,"Height":45}"#);
        let (_, got) = via
            .run(
                &exec(&["sh", "-c", "sleep 1; stty size"], tty),
                &[V4],
                vec![resize],
            )
            .await;
        assert!(got.get(1).contains("45 123"), "{via:?} {got:?}");
        assert_eq!(got.get(2), "");

        // v5 (kubectl 1.30+ offers it alone) is the runtime's to refuse: a client falls
        // back to SPDY. Offered with v4, v4 is chosen.
        match via
            .endpoint()
            .open(&exec(&["true"], plain), &["v5.channel.k8s.io"])
            .await
        {
            Err(tungstenite::Error::Http(r)) => assert_eq!(r.status(), 403, "{via:?}"),
            other => panic!("{via:?}: v5 alone accepted: {:?}", other.map(|(_, p)| p)),
        }
        let (chosen, got) = via
            .run(&exec(&["true"], plain), &["v5.channel.k8s.io", V4], vec![])
            .await;
        assert_eq!(chosen, V4);
        assert_eq!(got.status()["status"], "Success");
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn attach_and_port_forward_over_websocket() {
    let case = Case::with_agent("wsattach", &[]).await;
    let echo = case
        .create(
            "cat",
            sleeper(serde_json::json!({"containers": [{
                "name": "main", "image": "busybox", "stdin": true,
                "command": ["sh", "-c", "while read l; do echo got:$l; done"],
            }]})),
        )
        .await;
    let web = case
        .create(
            "web",
            sleeper(serde_json::json!({"containers": [{"name": "main", "image": "nginx"}]})),
        )
        .await;
    running(&echo).await;
    running(&web).await;
    for (via, protocol) in [(Via::Kubelet, V4), (Via::Apiserver, V4_BASE64)] {
        let base64 = protocol == V4_BASE64;
        let path = via.session(
            "attach",
            &echo,
            &[],
            Streams {
                stdin: true,
                tty: false,
            },
        );
        let (mut socket, chosen) = via
            .endpoint()
            .open(&path, &[protocol])
            .await
            .expect("attach");
        assert_eq!(chosen.as_deref(), Some(protocol));
        let got = echo_through_attach(&mut socket, base64, &format!("{via:?}")).await;
        assert_eq!(got.text, base64, "{got:?}");
        socket.close(None).await.expect("detach");

        // Port 80 of the pod: data on channel 0, errors on 1; each starts with the port.
        let (mut socket, chosen) = via
            .endpoint()
            .open(&via.port_forward(&web, 80), &[protocol])
            .await
            .expect("port-forward");
        assert_eq!(chosen.as_deref(), Some(protocol));
        socket
            .send(frame(base64, 0, b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n"))
            .await
            .expect("send");
        let got = read_until(&mut socket, 0, "Welcome to nginx!").await;
        let data = got.data[&0].as_slice();
        assert_eq!(&data[..2], &80u16.to_le_bytes(), "the port first: {got:?}");
        assert!(got.get(0)[2..].starts_with("HTTP/1.1 200"), "{got:?}");
        assert_eq!(
            got.data.get(&1).map(Vec::as_slice),
            Some(&80u16.to_le_bytes()[..]),
            "no error: {got:?}"
        );
        socket.close(None).await.expect("close");
    }
}

/// The pod's log as the kubelet API answers a request that asks for a WebSocket.
async fn kubelet_log_upgraded(pod: &str) -> String {
    let mut tls = KUBELET.tls().await;
    let request = format!(
        "GET /containerLogs/default/{pod}/main HTTP/1.1\r\nHost: {NODE_IP}\r\n\
         Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: binary.k8s.io\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.expect("request");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !String::from_utf8_lossy(&got).contains("line 1\n") {
            let n = tls.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the log within 10 s");
    String::from_utf8_lossy(&got).into_owned()
}

/// The greatest `line N` in `text`.
fn last_line(text: &str) -> Option<u32> {
    text.lines()
        .filter_map(|l| l.strip_prefix("line ")?.parse().ok())
        .max()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn container_logs_over_websocket_through_the_apiserver() {
    let case = Case::with_agent("wslogs", &[]).await;
    let pod = case
        .create(
            "count",
            sleeper(serde_json::json!({"containers": [{
                "name": "main", "image": "busybox",
                "command": ["sh", "-c", "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.5; done"],
            }]})),
        )
        .await;
    running(&pod).await;
    let log = format!("/api/v1/namespaces/default/pods/{pod}/log?container=main&follow=true");
    for protocol in ["binary.k8s.io", "base64.binary.k8s.io"] {
        let (mut socket, chosen) = APISERVER.open(&log, &[protocol]).await.expect("log");
        assert_eq!(chosen.as_deref(), Some(protocol));
        let base64 = protocol.starts_with("base64");
        let mut text = String::new();
        let mut first = None;
        // Followed: lines written after the request come on the same socket.
        let follow = async {
            loop {
                let data = match socket.next().await.expect("open").expect("a message") {
                    Message::Binary(b) if !base64 => b.to_vec(),
                    Message::Text(t) if base64 => STANDARD.decode(t.as_bytes()).expect("base64"),
                    other => panic!("{protocol}: {other:?}"),
                };
                text.push_str(&String::from_utf8_lossy(&data));
                let last = last_line(&text);
                if first.is_none() {
                    first = last;
                }
                if let (Some(f), Some(l)) = (first, last)
                    && l >= f + 3
                {
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), follow)
            .await
            .unwrap_or_else(|_| panic!("{protocol}: followed lines within 20 s: {text:?}"));
        assert!(text.starts_with("line 0\n"), "{text:?}");
        socket.close(None).await.expect("close");
    }
    // The kubelet serves logs over plain HTTP only (the kube-apiserver does the
    // WebSocket): an upgrade asked of it is answered with the log itself.
    let answer = kubelet_log_upgraded(&pod).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains("line 0\nline 1\n"), "{answer}");
}

/// Every message of a log read over WebSocket until the server ends the session (30 s at
/// most), decoded per the protocol.
async fn whole_log(socket: &mut Socket, base64: bool) -> String {
    let mut text = String::new();
    let read = async {
        while let Some(message) = socket.next().await {
            let data = match message {
                Ok(Message::Binary(b)) if !base64 => b.to_vec(),
                Ok(Message::Text(t)) if base64 => STANDARD.decode(t.as_bytes()).expect("base64"),
                // The server ends the session: with a close frame, or by closing.
                Ok(Message::Close(_))
                | Err(
                    tungstenite::Error::ConnectionClosed
                    | tungstenite::Error::Protocol(
                        tungstenite::error::ProtocolError::ResetWithoutClosingHandshake,
                    ),
                ) => break,
                other => panic!("base64 {base64}: {other:?} after {text:?}"),
            };
            text.push_str(&String::from_utf8_lossy(&data));
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .unwrap_or_else(|_| panic!("the log session ends within 30 s: {text:?}"));
    text
}

/// The upstream conformance test "Pods should support retrieving logs from the container
/// over websockets" and the same for a container that has finished: a log read without
/// `follow` comes whole over WebSocket through the kube-apiserver, which copies the
/// kubelet's chunked answer into messages and drops any data read together with its end.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn short_logs_over_websocket_through_the_apiserver_without_follow() {
    let case = Case::with_agent("wsshort", &[]).await;
    let pod = case
        .create(
            "short",
            sleeper(serde_json::json!({
                "restartPolicy": "Never",
                "containers": [
                    {"name": "main", "image": "busybox",
                     "command": ["sh", "-c", "echo container is alive; sleep 10000"]},
                    {"name": "done", "image": "busybox",
                     "command": ["sh", "-c", "echo container is done"]},
                ],
            })),
        )
        .await;
    running(&pod).await;
    eventually(
        "container done finished",
        Duration::from_secs(60),
        || async {
            let status = get(&pod).await?.status?;
            status
                .container_statuses?
                .iter()
                .any(|c| {
                    c.name == "done" && c.state.as_ref().is_some_and(|s| s.terminated.is_some())
                })
                .then_some(())
        },
    )
    .await;
    let mut wrong = Vec::new();
    for (container, expected) in [
        ("main", "container is alive\n"),
        ("done", "container is done\n"),
    ] {
        for protocol in ["binary.k8s.io", "base64.binary.k8s.io"] {
            let log = format!("/api/v1/namespaces/default/pods/{pod}/log?container={container}");
            let (mut socket, chosen) = APISERVER.open(&log, &[protocol]).await.expect("log");
            assert_eq!(chosen.as_deref(), Some(protocol));
            let text = whole_log(&mut socket, protocol.starts_with("base64")).await;
            eprintln!("{container} over {protocol}: {text:?}");
            if text != expected {
                wrong.push(format!("{container} over {protocol}: {text:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "logs over WebSocket: {wrong:?}");
}
