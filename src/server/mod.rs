//! The kubelet API: an HTTPS server on the node's port 10250 that the kube-apiserver's
//! kubelet proxy (and monitoring) talks to, and a plain-HTTP `/healthz` on
//! 127.0.0.1:10248.
//!
//! | path | what | authorized as |
//! |---|---|---|
//! | `/healthz` | `ok` | `nodes/proxy` |
//! | `/pods` | the pods bound to this node (`PodList`) | `nodes/proxy` |
//! | `/containerLogs/{ns}/{pod}/{container}` | container logs ([`logs`]) | `nodes/proxy` |
//! | `/exec/{ns}/{pod}[/{uid}]/{container}` | exec through CRI ([`streaming`]) | `nodes/proxy` |
//! | `/attach/{ns}/{pod}[/{uid}]/{container}` | attach through CRI | `nodes/proxy` |
//! | `/portForward/{ns}/{pod}[/{uid}]` | port-forward through CRI | `nodes/proxy` |
//! | `/configz` | the running KubeletConfiguration ([`configz`]) | `nodes/proxy` |
//! | `/metrics` | the kubelet's metrics, by `prometheus-client` ([`metrics`], volume gauges [`volume_metrics`]) | `nodes/metrics` |
//! | `/metrics/resource` | CPU and memory of node, pods, containers, timestamped text ([`resource_metrics`]) | `nodes/metrics` |
//! | `/metrics/probes` | probe results, by `prometheus-client` ([`probe_metrics`]) | `nodes/metrics` |
//! | `/metrics/cadvisor` | cAdvisor's container series, timestamped text ([`cadvisor`]) | `nodes/metrics` |
//! | `/stats/summary` | the node's and pods' stats summary ([`stats`]) | `nodes/stats` |
//! | `/debug/timeline[/{ns}/{pod}]` | pods' start-up timelines ([`debug`]) | `nodes/proxy` |
//! | `/logs/{path}` | the node's `/var/log` ([`syslogs`]) | `nodes/log` |
//!
//! Every request on 10250 is authenticated (client certificate, else bearer token, else
//! 401) and authorized with a `SubjectAccessReview` ([`auth`]); until a request on it has
//! authenticated, a connection holds only a small budget of its peer address
//! ([`connections`]). The serving certificate
//! comes from files, from the certificates API with rotation ([`certificate`]), or is
//! self-signed ([`tls`]).
//!
//! Knows no pod worker and decides nothing for a pod: it reads the pod store, the status
//! manager, the runtime, the registry of metrics and the stats housekeeping's last reading
//! ([`crate::stats::housekeeping`]; no stats are read for a request), and serves them.

pub mod auth;
pub mod cadvisor;
pub mod certificate;
pub mod configz;
pub mod connections;
pub mod debug;
pub mod logs;
pub mod metrics;
pub mod probe_metrics;
pub mod resource_metrics;
pub mod stats;
pub mod streaming;
pub mod syslogs;
pub mod text_format;
pub mod tls;
pub mod volume_metrics;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::cri::{Cri, CriClient, api};
use crate::pod::store::PodStore;
use crate::stats::housekeeping::LinuxHousekeeping;
use crate::status::StatusManager;
use crate::timeline::Timelines;
use crate::tls::{TlsError, x509};
use auth::{ApiReviews, Auth, UserInfo};
use certificate::{CertificateError, CertificateManager, NodeIdentity};
use connections::{Budget, Connection, Limits};
use logs::{LogError, LogOptions};
use streaming::{StreamOptions, StreamingError};
use tls::CertStore;

/// The body of every response.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// A complete body.
pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// An empty body.
#[must_use]
pub fn empty() -> Body {
    full(Bytes::new())
}

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request head may take to arrive (and a kept-alive connection may idle).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How many connections the healthz endpoint serves at once.
const MAX_HEALTHZ_CONNECTIONS: usize = 16;

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServingCertificateSource {
    /// `--tls-cert-file` and `--tls-private-key-file`.
    Files {
        /// The certificate chain.
        cert: PathBuf,
        /// Its key.
        key: PathBuf,
    },
    /// `--rotate-server-certificates`: from the certificates API, kept in `cert_dir`.
    Rotate {
        /// `--cert-dir`.
        cert_dir: PathBuf,
        /// `--tls-cert-file` and `--tls-private-key-file` given as well: as on the kubelet
        /// (Go's TLS with both `Certificates` and `GetCertificate`), clients that name a
        /// server (SNI) get the rotated certificate, clients that connect by IP get these.
        files: Option<(PathBuf, PathBuf)>,
    },
    /// Neither: self-signed, kept in `cert_dir`.
    SelfSigned {
        /// `--cert-dir`.
        cert_dir: PathBuf,
    },
}

/// The server's configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `--address`: where 10250 listens.
    pub address: IpAddr,
    /// `--port`.
    pub port: u16,
    /// `--healthz-bind-address`.
    pub healthz_address: IpAddr,
    /// `--healthz-port`; 0 disables it.
    pub healthz_port: u16,
    /// The serving certificate.
    pub serving_certificate: ServingCertificateSource,
    /// `--client-ca-file`: without it, client certificates are not accepted.
    pub client_ca_file: Option<PathBuf>,
    /// The node's name.
    pub node_name: String,
    /// The node's IP (a SAN of a requested certificate).
    pub node_ip: IpAddr,
    /// The running configuration, served on `/configz`.
    pub configuration: serde_json::Value,
}

/// Start-up failures of the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A port could not be bound.
    #[error("listening on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The serving certificate could not be made.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
}

/// A request's query: decoded pairs, repeated keys kept in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Decodes a URL query (`a=1&b=x%20y`).
    #[must_use]
    pub fn parse(query: Option<&str>) -> Self {
        Self::from_pairs(form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned())
    }

    /// A query from decoded pairs.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(pairs.into_iter().collect())
    }

    /// The first value of `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`.
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut body = body.into();
    if !body.ends_with('\n') {
        body.push('\n');
    }
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(full(body))
        .unwrap_or_else(|_| Response::new(empty()))
}

fn json(value: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => Response::builder()
            .header("content-type", "application/json")
            .body(full(bytes))
            .unwrap_or_else(|_| Response::new(empty())),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// A metrics page: the text format 0.0.4 ([`crate::metrics::CONTENT_TYPE`]), which the
/// kubelet v1.20 answers every client with (see [`crate::metrics`]).
fn exposition(body: String) -> Response<Body> {
    Response::builder()
        .header("content-type", crate::metrics::CONTENT_TYPE)
        .body(full(body))
        .unwrap_or_else(|_| Response::new(empty()))
}

/// A refusal closes its connection: a client that is not let in holds none of the
/// [`connections`] budget beyond its one answer.
fn refused(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    response
}

/// The route of a path, as a metrics label: the kubelet's bucket (`getMetricBucket`: the
/// first path element, or the first two under `metrics/`), `other` for any other path.
fn route(path: &str) -> &'static str {
    const BUCKETS: [&str; 21] = [
        "healthz",
        "pods",
        "stats",
        "metrics",
        "metrics/cadvisor",
        "metrics/probes",
        "metrics/resource",
        "spec",
        "run",
        "exec",
        "attach",
        "portForward",
        "containerLogs",
        "configz",
        "debug",
        "runningpods",
        "pprof",
        "logs",
        "checkpoint",
        "cri",
        "other",
    ];
    let mut parts = path.trim_start_matches('/').splitn(3, '/');
    let first = parts.next().unwrap_or("");
    let root = match (first, parts.next()) {
        ("metrics", Some(second)) => {
            &path.trim_start_matches('/')[..first.len() + 1 + second.len()]
        }
        _ => first,
    };
    BUCKETS
        .iter()
        .find(|b| **b == root)
        .copied()
        .unwrap_or("other")
}

/// Whether the kubelet counts requests on `route` as long-running (its
/// `longRunningRequestPathMap`, whose `portforward` never matches the `portForward` route).
fn long_running(route: &str) -> bool {
    matches!(route, "exec" | "attach" | "portforward" | "debug")
}

/// A request refused with a status and a message.
struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    fn not_found(message: String) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message,
        }
    }

    fn response(self) -> Response<Body> {
        text(self.status, self.message)
    }
}

/// A pod, its namespace and name, and the UID in the path if any.
struct PodPath<'a> {
    namespace: &'a str,
    name: &'a str,
    uid: Option<&'a str>,
}

impl<'a> PodPath<'a> {
    /// `{namespace}/{pod}/{container}` or `{namespace}/{pod}/{uid}/{container}`, as the
    /// kubelet routes `/exec` and `/attach`.
    fn with_container(
        namespace: &'a str,
        name: &'a str,
        rest: &[&'a str],
    ) -> Option<(Self, &'a str)> {
        let (uid, container) = match rest {
            [container] => (None, *container),
            [uid, container] => (Some(*uid), *container),
            _ => return None,
        };
        Some((
            Self {
                namespace,
                name,
                uid,
            },
            container,
        ))
    }
}

/// What the request handlers share.
struct Server {
    node_name: String,
    cri: CriClient,
    pods: PodStore,
    auth: Auth<ApiReviews>,
    stats: Arc<LinuxHousekeeping>,
    timelines: Arc<Timelines>,
    statuses: StatusManager,
    configz: configz::Configz,
}

impl Server {
    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        certificate_user: Option<UserInfo>,
    ) -> Response<Body> {
        let method = req.method().as_str().to_owned();
        let path = req.uri().path().to_owned();
        let route = route(&path);
        let _counted = crate::metrics::global().http_request(
            metrics::method_label(req.method()),
            route,
            long_running(route),
        );
        let authorization = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let peer = req.extensions().get::<Arc<Connection>>().map(|c| c.peer());
        let user = match self
            .auth
            .authenticate(certificate_user, authorization, peer)
            .await
        {
            Ok(user) => user,
            Err(e) => {
                tracing::debug!(%path, error = %e, "request not authenticated");
                return refused(text(StatusCode::UNAUTHORIZED, "Unauthorized"));
            }
        };
        if let Some(connection) = req.extensions().get::<Arc<Connection>>()
            && let Err(busy) = connection.authenticated()
        {
            tracing::debug!(%path, user = %user.name, "authenticated connections at their limit");
            let mut response = refused(text(StatusCode::TOO_MANY_REQUESTS, busy.to_string()));
            response.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from_static("1"),
            );
            return response;
        }
        if let Err(e) = self.auth.authorize(&user, &method, &path).await {
            tracing::debug!(%path, user = %user.name, error = %e, "request not authorized");
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::FORBIDDEN);
            return refused(text(status, e.to_string()));
        }
        tracing::debug!(%method, %path, user = %user.name, "request");
        self.route(req).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(path = %req.uri().path()))]
    async fn route(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let query = Query::parse(req.uri().query());
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let get = matches!(*req.method(), hyper::Method::GET | hyper::Method::HEAD);
        let stream = get || *req.method() == hyper::Method::POST;
        match segments.as_slice() {
            ["healthz"] if get => text(StatusCode::OK, "ok"),
            ["configz"] if get => self.configz.serve(),
            ["pods"] | ["pods", ""] if get => self.pods_list(),
            ["metrics"] if get => self.metrics().await,
            ["metrics", "resource"] if get => self.resource_metrics().await,
            ["metrics", "probes"] if get => exposition(probe_metrics::render()),
            ["metrics", "cadvisor"] if get => self.cadvisor().await,
            ["stats", "summary"] if get => self.summary().await,
            ["containerLogs", ns, pod, container] if get => {
                self.container_logs(ns, pod, container, &query).await
            }
            ["exec", ns, pod, rest @ ..] if stream => {
                match PodPath::with_container(ns, pod, rest) {
                    Some((p, container)) => self.exec(req, &p, container, &query).await,
                    None => text(StatusCode::NOT_FOUND, "404 page not found"),
                }
            }
            ["attach", ns, pod, rest @ ..] if stream => {
                match PodPath::with_container(ns, pod, rest) {
                    Some((p, container)) => self.attach(req, &p, container, &query).await,
                    None => text(StatusCode::NOT_FOUND, "404 page not found"),
                }
            }
            ["logs", ..] if get => syslogs::serve(Path::new(syslogs::ROOT), &path).await,
            ["debug", rest @ ..] if get => debug::route(&self.timelines, rest)
                .unwrap_or_else(|| text(StatusCode::NOT_FOUND, "404 page not found")),
            ["portForward", ns, pod, rest @ ..] if stream && rest.len() <= 1 => {
                let p = PodPath {
                    namespace: ns,
                    name: pod,
                    uid: rest.first().copied(),
                };
                self.port_forward(req, &p, &query).await
            }
            _ => text(StatusCode::NOT_FOUND, "404 page not found"),
        }
    }

    fn pod(&self, p: &PodPath<'_>) -> Result<Arc<Pod>, Refusal> {
        // A static pod's name finds the static pod, not its mirror pod.
        self.pods
            .get(p.namespace, p.name)
            .filter(|pod| p.uid.is_none() || pod.metadata.uid.as_deref() == p.uid)
            .ok_or_else(|| {
                Refusal::not_found(format!("pod {}/{} does not exist", p.namespace, p.name))
            })
    }

    fn pods_list(&self) -> Response<Body> {
        // The pods that run here: static pods, not their mirror pods.
        let mut pods: Vec<Arc<Pod>> = self
            .pods
            .store
            .state()
            .into_iter()
            .filter(|p| !crate::kubetypes::is_mirror_pod(p))
            .chain(self.pods.statics.pods())
            .collect();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        json(&serde_json::json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": pods.iter().map(|p| p.as_ref()).collect::<Vec<&Pod>>(),
        }))
    }

    async fn metrics(&self) -> Response<Body> {
        let counts = runtime_counts(&self.cri).await;
        if counts.is_none() {
            tracing::warn!(
                "metrics without running pods and containers: the runtime did not answer"
            );
        }
        // The volume gauges from the housekeeping's last reading (none before the first).
        let reading = self.stats.current();
        let figures = reading.as_deref().and_then(|r| r.as_ref().ok());
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        exposition(metrics::render(
            crate::metrics::global(),
            &metrics::ScrapeTime {
                node_name: &self.node_name,
                runtime: counts.as_ref(),
                summary: figures.map(|f| &f.summary),
                now_s,
            },
        ))
    }

    /// The housekeeping's last reading, or why there is none (the figures are never read
    /// for a request).
    async fn figures(&self, what: &str) -> Option<crate::stats::Reading> {
        let reading = self.stats.latest().await;
        match reading.as_deref() {
            None => tracing::warn!(what, "no stats reading yet"),
            Some(Err(e)) => tracing::warn!(what, error = %e, "the last stats reading failed"),
            Some(Ok(_)) => {}
        }
        reading
    }

    async fn resource_metrics(&self) -> Response<Body> {
        let reading = self.figures("resource metrics").await;
        let figures = reading.as_deref().and_then(|r| r.as_ref().ok());
        exposition(resource_metrics::render(figures.map(|f| &f.summary)))
    }

    async fn cadvisor(&self) -> Response<Body> {
        let reading = self.figures("container metrics").await;
        let figures = reading.as_deref().and_then(|r| r.as_ref().ok());
        exposition(cadvisor::render(figures.map(|f| &f.snapshot)))
    }

    async fn summary(&self) -> Response<Body> {
        match self.figures("summary").await.as_deref() {
            Some(Ok(figures)) => json(&figures.summary),
            Some(Err(e)) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Error: {e}"),
            ),
            None => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal Error: no stats reading yet",
            ),
        }
    }

    async fn container_logs(
        &self,
        ns: &str,
        name: &str,
        container: &str,
        query: &Query,
    ) -> Response<Body> {
        let opts = match LogOptions::from_query(query, Timestamp::now()) {
            Ok(o) => o,
            Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
        };
        let pod = match self.pod(&PodPath {
            namespace: ns,
            name,
            uid: None,
        }) {
            Ok(p) => p,
            Err(refusal) => return refusal.response(),
        };
        if !has_container(&pod, container) {
            return text(
                StatusCode::NOT_FOUND,
                format!("container {container:?} not found in pod {name:?}"),
            );
        }
        // The status being sent, else the API's (an agent that just started), as the kubelet.
        let status = pod
            .metadata
            .uid
            .as_deref()
            .and_then(|uid| self.statuses.get(uid))
            .or_else(|| pod.status.clone())
            .unwrap_or_default();
        let found = match logs::container_for_logs(&status, name, container, opts.previous) {
            Ok(id) => logs::log_source(&self.cri, id, container, name).await,
            Err(e) => Err(e),
        };
        let source = match found {
            Ok(s) => s,
            Err(e @ LogError::NoContainer(_)) => {
                return text(StatusCode::BAD_REQUEST, e.to_string());
            }
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        let cri = self.cri.clone();
        let log = source.path.clone();
        tokio::spawn(async move {
            if let Err(e) = logs::stream(cri, source, opts, tx).await {
                tracing::warn!(log = %log.display(), error = %e, "log stream failed");
            }
        });
        Response::builder()
            .header("content-type", "text/plain")
            .body(BodyExt::boxed(logs::LogBody::new(rx)))
            .unwrap_or_else(|_| Response::new(empty()))
    }

    fn streaming_pod(
        &self,
        p: &PodPath<'_>,
        container: Option<&str>,
    ) -> Result<(Arc<Pod>, String), Refusal> {
        let pod = self.pod(p)?;
        if let Some(c) = container
            && !has_container(&pod, c)
        {
            return Err(Refusal::not_found(format!(
                "container {c:?} not found in pod {:?}",
                p.name
            )));
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        Ok((pod, uid))
    }

    async fn exec(
        &self,
        req: Request<Incoming>,
        p: &PodPath<'_>,
        container: &str,
        query: &Query,
    ) -> Response<Body> {
        let (_, uid) = match self.streaming_pod(p, Some(container)) {
            Ok(v) => v,
            Err(refusal) => return refusal.response(),
        };
        self.container_session(req, &uid, container, query, |cri, id, opts| async move {
            let cmd = streaming::command(query)?;
            let req = api::ExecRequest {
                container_id: id,
                cmd,
                tty: opts.tty,
                stdin: opts.stdin,
                stdout: opts.stdout,
                stderr: opts.stderr,
            };
            Ok(cri.exec(req).await?.url)
        })
        .await
    }

    async fn attach(
        &self,
        req: Request<Incoming>,
        p: &PodPath<'_>,
        container: &str,
        query: &Query,
    ) -> Response<Body> {
        let (pod, uid) = match self.streaming_pod(p, Some(container)) {
            Ok(v) => v,
            Err(refusal) => return refusal.response(),
        };
        // The terminal setting is the container's own (an app or ephemeral container's):
        // it cannot change after start.
        let tty = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .find(|c| c.name == container)
            .map(|c| c.tty)
            .or_else(|| {
                crate::pod::ephemeral_containers(&pod)
                    .find(|c| c.name == container)
                    .map(|c| c.tty)
            })
            .flatten()
            .unwrap_or(false);
        self.container_session(req, &uid, container, query, |cri, id, opts| async move {
            let req = api::AttachRequest {
                container_id: id,
                stdin: opts.stdin,
                tty,
                stdout: opts.stdout,
                stderr: opts.stderr && !tty,
            };
            Ok(cri.attach(req).await?.url)
        })
        .await
    }

    /// A streaming session with a running container: `open` asks the runtime for the
    /// streaming URL of the container with the request's options, and the client's
    /// upgraded connection is then proxied to it.
    async fn container_session<'s, F, Fut>(
        &'s self,
        req: Request<Incoming>,
        uid: &str,
        container: &str,
        query: &'s Query,
        open: F,
    ) -> Response<Body>
    where
        F: FnOnce(&'s CriClient, String, StreamOptions) -> Fut,
        Fut: Future<Output = Result<String, StreamingError>>,
    {
        let session = async {
            let opts = StreamOptions::from_query(query)?;
            let id = streaming::running_container(&self.cri, uid, container).await?;
            let url = open(&self.cri, id, opts).await?;
            streaming::proxy(req, &url).await
        };
        session.await.unwrap_or_else(streaming_error)
    }

    async fn port_forward(
        &self,
        req: Request<Incoming>,
        p: &PodPath<'_>,
        query: &Query,
    ) -> Response<Body> {
        let (_, uid) = match self.streaming_pod(p, None) {
            Ok(v) => v,
            Err(refusal) => return refusal.response(),
        };
        let session = async {
            let port = streaming::ports(query)?;
            let sandbox = streaming::ready_sandbox(&self.cri, &uid).await?;
            let url = self
                .cri
                .port_forward(api::PortForwardRequest {
                    pod_sandbox_id: sandbox,
                    port,
                })
                .await?
                .url;
            streaming::proxy(req, &url).await
        };
        session.await.unwrap_or_else(streaming_error)
    }
}

fn streaming_error(e: StreamingError) -> Response<Body> {
    tracing::info!(error = %e, "streaming request failed");
    text(e.status(), e.to_string())
}

/// A stream over an mpsc receiver.
fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + Sync {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn has_container(pod: &Pod, name: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == name)
            || s.ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == name)
    })
}

/// Running pods and containers by state, as the runtime reports them now.
async fn runtime_counts(cri: &CriClient) -> Option<metrics::RuntimeCounts> {
    let sandboxes = cri
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
        .await
        .ok()?
        .items;
    let containers = cri
        .list_containers(api::ListContainersRequest { filter: None })
        .await
        .ok()?
        .containers;
    let mut counts = metrics::RuntimeCounts::default();
    let mut pods = std::collections::HashSet::new();
    for s in &sandboxes {
        if s.state() == api::PodSandboxState::SandboxReady
            && let Some(id) = crate::kuberuntime::labels::pod_of(&s.labels)
        {
            pods.insert(id.uid);
        }
    }
    counts.running_pods = pods.len() as u64;
    for c in &containers {
        let state = match c.state() {
            api::ContainerState::ContainerRunning => "running",
            api::ContainerState::ContainerExited => "exited",
            api::ContainerState::ContainerCreated => "created",
            api::ContainerState::ContainerUnknown => "unknown",
        };
        *counts.containers.entry(state).or_default() += 1;
    }
    Some(counts)
}

/// The serving certificate store, filled per the configured source. A rotating source
/// gets its manager started (it fills the store once the certificate is issued).
async fn serving_certificates(
    config: &ServerConfig,
    client: &kube::Client,
) -> Result<(Arc<CertStore>, Option<CertificateManager>), ServerError> {
    let store = Arc::new(CertStore::default());
    let node = NodeIdentity {
        name: config.node_name.clone(),
        ips: vec![config.node_ip],
    };
    let manager = match &config.serving_certificate {
        ServingCertificateSource::Files { cert, key } => {
            store.set(crate::tls::load_files(cert, key)?);
            None
        }
        ServingCertificateSource::SelfSigned { cert_dir } => {
            store.set(certificate::self_signed(cert_dir, &node)?);
            None
        }
        ServingCertificateSource::Rotate { cert_dir, files } => {
            if let Some((cert, key)) = files {
                store.set_without_sni(crate::tls::load_files(cert, key)?);
            }
            Some(CertificateManager::new(
                client.clone(),
                &node,
                cert_dir.clone(),
                store.clone(),
            )?)
        }
    };
    Ok((store, manager))
}

async fn bind(address: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| ServerError::Bind { address, source })
}

/// Binds the kubelet API on `--address:--port` and `/healthz` on
/// `--healthz-bind-address:--healthz-port`, ready to serve with [`Serving::run`].
///
/// # Errors
/// A port cannot be bound, or TLS cannot be set up.
pub async fn start(
    config: ServerConfig,
    client: kube::Client,
    cri: CriClient,
    pods: PodStore,
    timelines: Arc<Timelines>,
    statuses: StatusManager,
    stats: Arc<LinuxHousekeeping>,
) -> Result<Serving, ServerError> {
    let (store, certificates) = serving_certificates(&config, &client).await?;
    let tls = tls::server_config(store, config.client_ca_file.as_deref())?;
    if config.client_ca_file.is_none() {
        tracing::warn!("no --client-ca-file: client certificates are not accepted");
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let address = SocketAddr::new(config.address, config.port);
    let listener = bind(address).await?;
    let healthz = if config.healthz_port == 0 {
        None
    } else {
        Some(bind(SocketAddr::new(config.healthz_address, config.healthz_port)).await?)
    };
    let server = Arc::new(Server {
        node_name: config.node_name.clone(),
        cri,
        pods,
        auth: Auth::new(ApiReviews(client), config.node_name.clone()),
        stats,
        timelines,
        statuses,
        configz: configz::Configz::new(config.configuration),
    });
    tracing::info!(%address, "kubelet API serving");
    if let Some(listener) = &healthz {
        tracing::info!(address = %listener.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()), "healthz serving");
    }
    Ok(Serving {
        listener,
        acceptor,
        server,
        healthz,
        certificates,
    })
}

/// The kubelet API with its ports bound (from [`start`]).
pub struct Serving {
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    server: Arc<Server>,
    healthz: Option<TcpListener>,
    certificates: Option<CertificateManager>,
}

impl Serving {
    /// Serves the kubelet API and `/healthz`, and keeps the serving certificate fresh when
    /// it rotates, until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        let healthz = async {
            if let Some(listener) = self.healthz {
                serve_healthz(listener, cancel.clone()).await;
            }
        };
        let certificates = async {
            if let Some(manager) = self.certificates {
                manager.run(cancel.clone()).await;
            }
        };
        tokio::join!(
            serve_tls(self.listener, self.acceptor, self.server, cancel.clone()),
            healthz,
            certificates
        );
    }
}

/// Accepts a connection on `listener` whenever one of `permits` is free, and serves it
/// with `serve`, which holds the permit as long as it wants; further clients wait in the
/// listen backlog until one is given back.
async fn accept_bounded<F, Fut>(
    listener: TcpListener,
    permits: Arc<tokio::sync::Semaphore>,
    cancel: CancellationToken,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, tokio::sync::OwnedSemaphorePermit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let permit = tokio::select! {
            () = cancel.cancelled() => return,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        tokio::spawn(serve(stream, peer, permit));
    }
}

async fn serve_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    server: Arc<Server>,
    cancel: CancellationToken,
) {
    let budget = Budget::new(Limits::default());
    accept_bounded(listener, budget.accept_slots(), cancel, move |stream, peer, slot| {
        let acceptor = acceptor.clone();
        let server = server.clone();
        let budget = budget.clone();
        async move {
            let Some(connection) = budget.admit(peer.ip(), slot, HANDSHAKE_TIMEOUT).await else {
                tracing::debug!(%peer, "too many unauthenticated connections from this address");
                return;
            };
            let connection = Arc::new(connection);
            let watch = connection.clone();
            tokio::select! {
                () = watch.cut() => {
                    tracing::debug!(%peer, "unauthenticated connection cut for another peer's");
                }
                () = serve_connection(stream, peer, &acceptor, server, connection) => {}
            }
        }
    })
    .await;
}

/// Serves one accepted connection: its TLS handshake, then its requests.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: &tokio_rustls::TlsAcceptor,
    server: Arc<Server>,
    connection: Arc<Connection>,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let certificate = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| x509::parse(leaf).ok());
    let user = certificate.as_ref().and_then(UserInfo::from_certificate);
    // A verified client certificate's remaining lifetime is observed for each request, as
    // the kubelet's x509 authenticator observes it.
    let expires_s = certificate.map(|c| c.not_after.as_second());
    // A verified client certificate authenticates the connection at once: the API
    // server's connections leave the pending budget before their first request.
    if user.is_some() && connection.authenticated().is_err() {
        tracing::debug!(%peer, "authenticated connections at their limit");
    }
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let server = server.clone();
        let user = user.clone();
        // The request's handler moves the connection between budgets, and an
        // upgraded stream keeps its hold until it ends.
        req.extensions_mut().insert(connection.clone());
        if let Some(expires_s) = expires_s {
            crate::metrics::observe_client_certificate(expires_s);
        }
        async move { Ok::<_, Infallible>(server.handle(req, user).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(tls), service)
        .with_upgrades()
        .await
    {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// The kubelet API's parsing of requests, as [`serve_connection`] runs it: hyper's HTTP/1
/// parser configured the same way over `data`, then, for each request parsed, its route,
/// authorization attributes, bearer token, query and its options, `/logs/` target and pod
/// path through the functions the handlers call (for the fuzz target).
#[cfg(any(test, fuzzing))]
pub(crate) async fn serve_fuzzed_request_bytes(data: Vec<u8>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (client, server) = tokio::io::duplex(64 << 10);
    let (mut from_server, mut to_server) = tokio::io::split(client);
    let client = async move {
        let _ = to_server.write_all(&data).await;
        let _ = to_server.shutdown().await;
        let _ = tokio::io::copy(&mut from_server, &mut tokio::io::sink()).await;
        let _ = from_server.read(&mut [0u8; 1]).await;
    };
    let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
        parse_fuzzed_request(&req);
        Ok::<_, Infallible>(Response::new(empty()))
    });
    let serve = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(server), service)
        .with_upgrades();
    let _ = tokio::join!(client, serve);
}

#[cfg(any(test, fuzzing))]
fn parse_fuzzed_request(req: &Request<Incoming>) {
    let path = req.uri().path();
    let _ = route(path);
    let query = Query::parse(req.uri().query());
    let _ = auth::attributes(req.method().as_str(), path, "n1");
    let _ = auth::bearer_token(
        req.headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    );
    let _ = LogOptions::from_query(&query, Timestamp::UNIX_EPOCH);
    let _ = StreamOptions::from_query(&query);
    let _ = streaming::command(&query);
    let _ = streaming::ports(&query);
    let _ = syslogs::target(path);
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if let [_, namespace, name, rest @ ..] = segments.as_slice() {
        let _ = PodPath::with_container(namespace, name, rest);
    }
}

async fn serve_healthz(listener: TcpListener, cancel: CancellationToken) {
    accept_bounded(
        listener,
        Arc::new(tokio::sync::Semaphore::new(MAX_HEALTHZ_CONNECTIONS)),
        cancel,
        |stream, _, permit| async move {
            let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                Ok::<_, Infallible>(if req.uri().path() == "/healthz" {
                    text(StatusCode::OK, "ok")
                } else {
                    text(StatusCode::NOT_FOUND, "404 page not found")
                })
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(permit);
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five clients of a server bounded to two connections: two are served, the others
    /// wait until a served one ends.
    #[tokio::test]
    async fn connections_beyond_the_limit_wait() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (served_tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        tokio::spawn(accept_bounded(
            listener,
            Arc::new(tokio::sync::Semaphore::new(2)),
            cancel.clone(),
            move |stream, _, permit| {
                let served_tx = served_tx.clone();
                async move {
                    let _permit = permit;
                    use tokio::io::AsyncReadExt;
                    let _ = served_tx.send(());
                    // Served until the client closes.
                    let mut stream = stream;
                    let _ = stream.read(&mut [0u8; 1]).await;
                }
            },
        ));
        let mut clients = Vec::new();
        for _ in 0..5 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let settle = || tokio::time::sleep(Duration::from_millis(200));
        settle().await;
        let mut count = 0;
        while served.try_recv().is_ok() {
            count += 1;
        }
        assert_eq!(count, 2, "only the limit is served");
        drop(clients.remove(0));
        settle().await;
        assert!(
            served.try_recv().is_ok(),
            "a waiting client is served once one ends"
        );
        assert!(served.try_recv().is_err());
        cancel.cancel();
    }

    #[test]
    fn queries_decode_and_keep_repeated_keys() {
        let q = Query::parse(Some(
            "command=sh&command=-c&command=echo+a%26b&tty=1&empty=",
        ));
        assert_eq!(
            q.all("command").collect::<Vec<_>>(),
            ["sh", "-c", "echo a&b"]
        );
        assert_eq!(q.get("tty"), Some("1"));
        assert_eq!(q.get("empty"), Some(""));
        assert_eq!(q.get("missing"), None);
        assert_eq!(Query::parse(None), Query::default());
    }

    #[test]
    fn routes_are_small_label_sets() {
        assert_eq!(route("/containerLogs/ns/p/c"), "containerLogs");
        assert_eq!(route("/stats/summary"), "stats");
        assert_eq!(route("/metrics"), "metrics");
        assert_eq!(route("/metrics/resource"), "metrics/resource");
        assert_eq!(route("/metrics/cadvisor"), "metrics/cadvisor");
        assert_eq!(route("/metrics/other"), "other");
        assert_eq!(route("/anything/else"), "other");
        assert!(long_running(route("/exec/ns/p/c")));
        assert!(!long_running(route("/portForward/ns/p")));
    }

    #[test]
    fn containers_of_every_kind_count() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "web"}],
                "initContainers": [{"name": "init"}],
                "ephemeralContainers": [{"name": "debug"}]
            }
        }))
        .unwrap();
        for name in ["web", "init", "debug"] {
            assert!(has_container(&pod, name), "{name}");
        }
        assert!(!has_container(&pod, "nope"));
    }
}
