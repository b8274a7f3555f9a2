//! `exec`, `attach` and `portForward`: the kubelet's proxy mode of container streaming
//! (`--redirect-container-streaming=false`). The request is checked and its options sent
//! to the runtime's CRI `Exec`/`Attach`/`PortForward`, which answer with a one-time URL on
//! the runtime's own streaming server (containerd's, on 127.0.0.1). The client's request —
//! with its upgrade headers (SPDY/3.1 from kubectl and the kube-apiserver, or WebSocket) —
//! is then forwarded to that URL, the runtime's `101 Switching Protocols` relayed back, and
//! both connections spliced byte for byte until either side closes. The agent never reads
//! the streams: the protocol is between the client and the runtime.
//!
//! So a WebSocket client gets the subprotocols the runtime's streaming server speaks, as
//! from the kubelet: for exec and attach `v4.channel.k8s.io`, `v4.base64.channel.k8s.io`,
//! `channel.k8s.io`, `base64.channel.k8s.io` (stdin 0, stdout 1, stderr 2, error 3 — a
//! `Status` from v4 on —, resize 4), for port-forward the v4 pair of data and error
//! channels per port. `v5.channel.k8s.io` alone (what kubectl 1.30+ offers) is refused by
//! a runtime that predates it (containerd 1.6: 403), and the client falls back to SPDY.
//! Container logs are plain HTTP on the kubelet, also when a WebSocket is asked for
//! ([`super::logs`]): the kube-apiserver serves them as `binary.k8s.io` messages itself.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::connections::Connection;
use super::logs::parse_bool;
use super::{Body, Query};
use crate::cri::{Cri, CriError, api};
use crate::kuberuntime::labels;

/// How long connecting to the runtime's streaming server and reading its answer may take.
const BACKEND_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest response head accepted from the runtime.
const MAX_HEAD: usize = 64 * 1024;
/// The largest error body relayed from the runtime.
const MAX_ERROR_BODY: u64 = 64 * 1024;

/// Streaming failures.
#[derive(Debug, thiserror::Error)]
pub enum StreamingError {
    /// The request's options are invalid: 400.
    #[error("{0}")]
    BadRequest(String),
    /// The container or sandbox is not running: 404.
    #[error("{0}")]
    NotFound(String),
    /// The runtime refused the call: 500.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// The runtime's URL is not one this proxy can reach.
    #[error("unusable streaming URL {url:?}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        reason: &'static str,
    },
    /// The runtime's streaming server could not be reached or answered badly.
    #[error("streaming server {address}: {reason}")]
    Backend {
        /// `host:port`.
        address: String,
        /// What happened.
        reason: String,
    },
}

impl StreamingError {
    /// The HTTP status for the client.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Backend { .. } => StatusCode::BAD_GATEWAY,
            Self::Cri(_) | Self::Url { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// Which standard streams a session has, from the request's query (`input`, `output`,
/// `error`, `tty`, each `1` or `true`), as the kubelet reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    /// Stdin is streamed.
    pub stdin: bool,
    /// Stdout is streamed.
    pub stdout: bool,
    /// Stderr is streamed (never with a TTY).
    pub stderr: bool,
    /// The session has a terminal.
    pub tty: bool,
}

impl StreamOptions {
    /// The options of a request.
    ///
    /// # Errors
    /// None of stdin, stdout and stderr is asked for.
    pub fn from_query(query: &Query) -> Result<Self, StreamingError> {
        let flag = |k: &str| query.get(k).and_then(parse_bool).unwrap_or(false);
        let tty = flag("tty");
        let opts = Self {
            stdin: flag("input"),
            stdout: flag("output"),
            // A terminal merges stderr into stdout.
            stderr: flag("error") && !tty,
            tty,
        };
        if !opts.stdin && !opts.stdout && !opts.stderr {
            return Err(StreamingError::BadRequest(
                "you must specify at least 1 of stdin, stdout, stderr".into(),
            ));
        }
        Ok(opts)
    }
}

/// The command of an exec request (`command`, repeated).
///
/// # Errors
/// No command.
pub fn command(query: &Query) -> Result<Vec<String>, StreamingError> {
    let cmd: Vec<String> = query.all("command").map(ToOwned::to_owned).collect();
    if cmd.is_empty() {
        return Err(StreamingError::BadRequest(
            "you must specify at least one command for the container".into(),
        ));
    }
    Ok(cmd)
}

/// The ports of a port-forward request (`port`, repeated; SPDY clients name them later, in
/// their streams).
///
/// # Errors
/// A port that is not a number in 1–65535.
pub fn ports(query: &Query) -> Result<Vec<i32>, StreamingError> {
    query
        .all("port")
        .flat_map(|v| v.split(','))
        .map(|p| match p.trim().parse::<i32>() {
            Ok(n) if (1..=65535).contains(&n) => Ok(n),
            _ => Err(StreamingError::BadRequest(format!("invalid port {p:?}"))),
        })
        .collect()
}

/// The newest running container of a pod with this name.
///
/// # Errors
/// [`StreamingError::NotFound`] when none runs; a failed CRI call.
pub async fn running_container<C: Cri>(
    cri: &C,
    pod_uid: &str,
    container: &str,
) -> Result<String, StreamingError> {
    let mut found = cri
        .list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                state: Some(api::ContainerStateValue {
                    state: api::ContainerState::ContainerRunning.into(),
                }),
                label_selector: labels::container_selector(pod_uid, container),
                ..Default::default()
            }),
        })
        .await?
        .containers;
    found.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    found
        .into_iter()
        .next()
        .map(|c| c.id)
        .ok_or_else(|| StreamingError::NotFound(format!("container {container:?} is not running")))
}

/// The ready sandbox of a pod.
///
/// # Errors
/// [`StreamingError::NotFound`] when the pod has none; a failed CRI call.
pub async fn ready_sandbox<C: Cri>(cri: &C, pod_uid: &str) -> Result<String, StreamingError> {
    let mut found = cri
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                state: Some(api::PodSandboxStateValue {
                    state: api::PodSandboxState::SandboxReady.into(),
                }),
                label_selector: [(labels::POD_UID.to_owned(), pod_uid.to_owned())].into(),
                ..Default::default()
            }),
        })
        .await?
        .items;
    found.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    found
        .into_iter()
        .next()
        .map(|s| s.id)
        .ok_or_else(|| StreamingError::NotFound("the pod has no running sandbox".into()))
}

/// Where the runtime's streaming server serves one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// `host:port`.
    pub address: String,
    /// Path and query.
    pub target: String,
}

/// Reads the runtime's `http://host:port/path` URL.
///
/// # Errors
/// Another scheme (a TLS streaming server is not supported), or no host.
pub fn backend(url: &str) -> Result<Backend, StreamingError> {
    let bad = |reason| StreamingError::Url {
        url: url.to_owned(),
        reason,
    };
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("only http:// streaming servers are supported"))?;
    let (authority, target) = rest.find('/').map_or((rest, "/"), |i| rest.split_at(i));
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    let address = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    Ok(Backend {
        address,
        target: target.to_owned(),
    })
}

/// Headers not passed to the runtime: the runtime's own `Host`, and credentials meant for
/// this server.
fn forwarded(name: &HeaderName) -> bool {
    name != hyper::header::HOST && name != hyper::header::AUTHORIZATION
}

/// The request head sent to the runtime: the client's method and headers, the runtime's
/// path and host.
#[must_use]
pub fn request_head(
    method: &hyper::Method,
    backend: &Backend,
    headers: &hyper::HeaderMap,
) -> Vec<u8> {
    let mut head = format!(
        "{method} {} HTTP/1.1\r\nHost: {}\r\n",
        backend.target, backend.address
    )
    .into_bytes();
    for (name, value) in headers.iter().filter(|(n, _)| forwarded(n)) {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// The runtime's response head, and whatever it sent after it.
#[derive(Debug)]
pub struct BackendResponse {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Bytes read past the head (the start of the stream or of the body).
    pub rest: Vec<u8>,
}

/// Parses a response head from `buf`; `None` while it is incomplete.
///
/// # Errors
/// A malformed head.
pub fn parse_response_head(buf: &[u8]) -> Result<Option<BackendResponse>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => Ok(Some(BackendResponse {
            status: response.code.unwrap_or(500),
            headers: response
                .headers
                .iter()
                .map(|h| (h.name.to_owned(), h.value.to_vec()))
                .collect(),
            rest: buf[len..].to_vec(),
        })),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

async fn read_head(
    stream: &mut TcpStream,
    address: &str,
) -> Result<BackendResponse, StreamingError> {
    let backend_err = |reason: String| StreamingError::Backend {
        address: address.to_owned(),
        reason,
    };
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| backend_err(e.to_string()))?;
        if n == 0 {
            return Err(backend_err("closed before answering".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(head) = parse_response_head(&buf).map_err(backend_err)? {
            return Ok(head);
        }
        if buf.len() > MAX_HEAD {
            return Err(backend_err("response head too large".into()));
        }
    }
}

/// Forwards `req` to the runtime's streaming `url` and, once the runtime switches
/// protocols, splices the client's upgraded connection with the runtime's.
///
/// # Errors
/// The runtime's server cannot be reached or answers with no HTTP.
pub async fn proxy(
    mut req: Request<Incoming>,
    url: &str,
) -> Result<Response<Body>, StreamingError> {
    let backend = backend(url)?;
    let backend_err = |reason: String| StreamingError::Backend {
        address: backend.address.clone(),
        reason,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    // The connection's hold on the authenticated budget goes with the stream.
    let hold = req.extensions_mut().remove::<Arc<Connection>>();
    let head = request_head(req.method(), &backend, req.headers());
    let (mut upstream, answer) = tokio::time::timeout(BACKEND_TIMEOUT, async {
        let mut upstream = TcpStream::connect(&backend.address)
            .await
            .map_err(|e| backend_err(e.to_string()))?;
        upstream
            .write_all(&head)
            .await
            .map_err(|e| backend_err(e.to_string()))?;
        let answer = read_head(&mut upstream, &backend.address).await?;
        Ok::<_, StreamingError>((upstream, answer))
    })
    .await
    .map_err(|_| backend_err(format!("no answer within {BACKEND_TIMEOUT:?}")))??;

    let mut response = Response::builder().status(answer.status);
    for (name, value) in &answer.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            response = response.header(n, v);
        }
    }
    if answer.status != 101 {
        // An error from the runtime (expired token, bad protocol): relay it with its body.
        let length = answer
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok())
            .unwrap_or(MAX_ERROR_BODY)
            .min(MAX_ERROR_BODY);
        let mut body = answer.rest;
        let want = usize::try_from(length).unwrap_or(usize::MAX);
        if body.len() < want {
            let mut more = Vec::new();
            let mut limited = (&mut upstream).take(length - u64::try_from(body.len()).unwrap_or(0));
            let read = limited.read_to_end(&mut more);
            if tokio::time::timeout(Duration::from_secs(5), read)
                .await
                .is_ok()
            {
                body.extend_from_slice(&more);
            }
        }
        body.truncate(want);
        tracing::debug!(
            status = answer.status,
            "runtime streaming server refused the session"
        );
        return response
            .body(super::full(body))
            .map_err(|e| backend_err(e.to_string()));
    }

    let early = answer.rest;
    tokio::spawn(async move {
        let _hold = hold;
        let started = std::time::Instant::now();
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %e, "client connection was not upgraded");
                return;
            }
        };
        let mut client = TokioIo::new(upgraded);
        if !early.is_empty() && client.write_all(&early).await.is_err() {
            return;
        }
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((to_runtime, to_client)) => tracing::debug!(
                to_runtime,
                to_client,
                elapsed = ?started.elapsed(),
                "streaming session ended"
            ),
            Err(e) => {
                tracing::debug!(error = %e, elapsed = ?started.elapsed(), "streaming session broken")
            }
        }
    });
    response
        .body(super::empty())
        .map_err(|e| backend_err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(s: &str) -> Query {
        Query::parse(Some(s))
    }

    #[test]
    fn stream_options_as_the_apiserver_encodes_them() {
        let o =
            StreamOptions::from_query(&query("command=sh&input=1&output=1&tty=1&error=1")).unwrap();
        assert_eq!(
            o,
            StreamOptions {
                stdin: true,
                stdout: true,
                stderr: false,
                tty: true
            }
        );
        let o = StreamOptions::from_query(&query("output=true&error=true")).unwrap();
        assert!(o.stdout && o.stderr && !o.stdin && !o.tty);
        assert!(StreamOptions::from_query(&query("tty=1")).is_err());
        assert_eq!(
            command(&query("command=sh&command=-c&command=echo%20hi")).unwrap(),
            ["sh", "-c", "echo hi"]
        );
        assert!(command(&query("input=1")).is_err());
    }

    #[test]
    fn ports_are_numbers_in_range() {
        assert_eq!(
            ports(&query("port=80&port=8080,9090")).unwrap(),
            [80, 8080, 9090]
        );
        assert!(ports(&query("")).unwrap().is_empty());
        assert!(ports(&query("port=0")).is_err());
        assert!(ports(&query("port=http")).is_err());
    }

    #[test]
    fn the_runtime_url_and_the_forwarded_head() {
        let b = backend("http://127.0.0.1:35000/exec/AbCd").unwrap();
        assert_eq!(
            b,
            Backend {
                address: "127.0.0.1:35000".into(),
                target: "/exec/AbCd".into()
            }
        );
        assert_eq!(backend("http://[::1]:1/x").unwrap().address, "[::1]:1");
        assert_eq!(
            backend("http://localhost/x").unwrap().address,
            "localhost:80"
        );
        assert!(backend("https://127.0.0.1:1/x").is_err());
        let mut headers = hyper::HeaderMap::new();
        headers.insert("host", "198.18.0.1:10250".parse().unwrap());
        headers.insert("authorization", "Bearer secret".parse().unwrap());
        headers.insert("connection", "Upgrade".parse().unwrap());
        headers.insert("upgrade", "SPDY/3.1".parse().unwrap());
        headers.append(
            "x-stream-protocol-version",
            "v4.channel.k8s.io".parse().unwrap(),
        );
        headers.append(
            "x-stream-protocol-version",
            "v3.channel.k8s.io".parse().unwrap(),
        );
        let head = String::from_utf8(request_head(&hyper::Method::POST, &b, &headers)).unwrap();
        assert!(head.starts_with("POST /exec/AbCd HTTP/1.1\r\nHost: 127.0.0.1:35000\r\n"));
        assert!(head.contains("connection: Upgrade\r\n"));
        assert!(head.contains("upgrade: SPDY/3.1\r\n"));
        assert!(head.contains("x-stream-protocol-version: v4.channel.k8s.io\r\n"));
        assert!(head.contains("x-stream-protocol-version: v3.channel.k8s.io\r\n"));
        assert!(!head.contains("secret"), "credentials stay here");
        assert!(!head.contains("198.18.0.1"));
        assert!(head.ends_with("\r\n\r\n"));
    }

    #[test]
    fn response_heads_keep_what_follows_them() {
        assert!(
            parse_response_head(b"HTTP/1.1 101 Switching")
                .unwrap()
                .is_none()
        );
        let r = parse_response_head(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n\x80\x03",
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.status, 101);
        assert_eq!(r.headers.len(), 2);
        assert_eq!(r.rest, b"\x80\x03");
        assert!(parse_response_head(b"garbage\r\n\r\n").is_err());
    }

    /// The agent's side: a hyper server for one connection whose handler proxies to the
    /// runtime's `url`; its address.
    async fn agent_proxying_to(url: String) -> std::net::SocketAddr {
        let agent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let agent_addr = agent.local_addr().unwrap();
        tokio::spawn(async move {
            let (s, _) = agent.accept().await.unwrap();
            let service = hyper::service::service_fn(move |req| {
                let url = url.clone();
                async move { Ok::<_, std::convert::Infallible>(proxy(req, &url).await.unwrap()) }
            });
            hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(s), service)
                .with_upgrades()
                .await
                .unwrap();
        });
        agent_addr
    }

    /// A WebSocket client (as kubectl's and the apiserver's) through the proxy to a
    /// WebSocket runtime server (as containerd's): the handshake's key, version and offered
    /// subprotocols reach the runtime, its accept key and chosen subprotocol reach the
    /// client (which checks the key), then channel frames flow both ways.
    #[tokio::test]
    async fn websocket_sessions_pass_through_to_the_runtime() {
        use futures::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::handshake::server::{
            ErrorResponse, Request as WsRequest, Response as WsResponse,
        };

        let runtime = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let runtime_addr = runtime.local_addr().unwrap();
        tokio::spawn(async move {
            let (s, _) = runtime.accept().await.unwrap();
            // The callback's signature is tungstenite's.
            #[allow(clippy::result_large_err)]
            let choose = |req: &WsRequest, mut resp: WsResponse| {
                assert_eq!(req.uri().path(), "/exec/token");
                assert!(req.headers().get("authorization").is_none());
                let offered = req.headers()["sec-websocket-protocol"].to_str().unwrap();
                assert_eq!(offered, "v5.channel.k8s.io, v4.channel.k8s.io");
                resp.headers_mut().insert(
                    "sec-websocket-protocol",
                    "v4.channel.k8s.io".parse().unwrap(),
                );
                Ok::<_, ErrorResponse>(resp)
            };
            let mut ws = tokio_tungstenite::accept_hdr_async(s, choose)
                .await
                .unwrap();
            // Stdin (channel 0) comes back on stdout (1), then a status on error (3).
            let Some(Ok(Message::Binary(stdin))) = ws.next().await else {
                panic!("no stdin frame");
            };
            assert_eq!(stdin[0], 0);
            let mut stdout = stdin.to_vec();
            stdout[0] = 1;
            ws.send(Message::binary(stdout)).await.unwrap();
            ws.send(Message::binary(&b"\x03{\"status\":\"Success\"}"[..]))
                .await
                .unwrap();
            ws.close(None).await.unwrap();
        });
        let agent_addr = agent_proxying_to(format!("http://{runtime_addr}/exec/token")).await;
        let mut request = format!("ws://{agent_addr}/exec/ns/p/c?command=cat&input=1&output=1")
            .into_client_request()
            .unwrap();
        let headers = request.headers_mut();
        headers.insert(
            "sec-websocket-protocol",
            "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap(),
        );
        headers.insert("authorization", "Bearer secret".parse().unwrap());
        let client = TcpStream::connect(agent_addr).await.unwrap();
        let (mut ws, response) = tokio_tungstenite::client_async(request, client)
            .await
            .unwrap();
        assert_eq!(
            response.headers()["sec-websocket-protocol"],
            "v4.channel.k8s.io"
        );
        ws.send(Message::binary(&b"\x00hello\n"[..])).await.unwrap();
        let mut frames = Vec::new();
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Binary(b) = m {
                frames.push(b.to_vec());
            }
        }
        assert_eq!(
            frames,
            [
                b"\x01hello\n".to_vec(),
                b"\x03{\"status\":\"Success\"}".to_vec()
            ]
        );
    }

    #[tokio::test]
    async fn splices_the_upgraded_connection_with_the_runtime() {
        use tokio::net::TcpListener;
        // A stand-in for the runtime's streaming server: answers 101, then echoes.
        let runtime = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let runtime_addr = runtime.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = runtime.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            let head = String::from_utf8(head).unwrap();
            assert!(head.starts_with("POST /exec/token HTTP/1.1\r\n"), "{head}");
            s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\nhello ")
                .await
                .unwrap();
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n]).await.unwrap();
            }
        });
        let agent_addr = agent_proxying_to(format!("http://{runtime_addr}/exec/token")).await;
        let mut client = TcpStream::connect(agent_addr).await.unwrap();
        client
            .write_all(b"POST /exec/ns/p/c?command=sh HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains("hello ") {
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got).to_string();
        assert!(
            text.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
            "{text}"
        );
        client.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        client.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
    }
}
