//! The agent's connections to the API server: a dialer as the kubelet's (a 30 s connect
//! timeout and 30 s TCP keepalives, so a half-open connection is found and dropped), the
//! kubelet's heartbeat timeout on the lease and node status client (the node status update
//! frequency, below the lease duration), and — rkubelet's own choice, the kubelet's main
//! client has none — a 60 s deadline on every other request that is not a watch (on its
//! response and its body, as Go's `http.Client.Timeout`), so a stalled connection cannot
//! hold a status patch forever. A kubeconfig `proxy-url` is refused (the client dials the
//! server directly).
//! Knows no API object, watch or module that uses the client (its retry is `backoff`'s).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};

use crate::tls::transport::{ClientIdentity, ClosingConnector};

/// The dialer's connect timeout and TCP keepalive period (the kubelet's `net.Dialer`).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle time before the first keepalive probe, and time between probes.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(30);
/// Deadline of a request of the main client that is not a watch.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline of a heartbeat request: the node status update frequency (10 s), which is
/// below the lease duration (40 s).
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// A request that ran past its client's deadline.
#[derive(Debug, thiserror::Error)]
#[error("API request timed out after {0:?}")]
pub struct RequestTimedOut(pub Duration);

/// A client for `config` whose requests other than watches end after `deadline`.
///
/// # Errors
/// The configuration's TLS or authentication settings cannot be used, or it names a
/// proxy.
pub fn build(config: &kube::Config, deadline: Duration) -> Result<kube::Client, kube::Error> {
    build_with_identity(config, deadline, None)
}

/// As [`build`]; with `identity`, the client presents that rotating client certificate
/// (instead of the kubeconfig's) and its connections close when it changes, as the
/// kubelet's transport does on rotation. TLS sessions are not resumed, so each new
/// connection authenticates with the certificate current then.
///
/// # Errors
/// See [`build`].
pub fn build_with_identity(
    config: &kube::Config,
    deadline: Duration,
    identity: Option<Arc<ClientIdentity>>,
) -> Result<kube::Client, kube::Error> {
    if let Some(proxy) = &config.proxy_url {
        return Err(kube::Error::Service(
            format!("the kubeconfig's proxy-url {proxy} is not supported: the agent dials the API server directly").into(),
        ));
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(config.connect_timeout.unwrap_or(DIAL_TIMEOUT)));
    http.set_keepalive(Some(TCP_KEEPALIVE));
    http.set_keepalive_interval(Some(TCP_KEEPALIVE));
    let https = match identity {
        None => config.rustls_https_connector_with_connector(ClosingConnector::new(http, None))?,
        Some(identity) => {
            let mut without_identity = config.clone();
            let user = &mut without_identity.auth_info;
            user.client_certificate = None;
            user.client_certificate_data = None;
            user.client_key = None;
            user.client_key_data = None;
            let mut tls = without_identity.rustls_client_config()?;
            tls.client_auth_cert_resolver = identity.clone();
            tls.resumption = rustls::client::Resumption::disabled();
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_or_http()
                .enable_http1()
                .wrap_connector(ClosingConnector::new(http, Some(identity)))
        }
    };
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(DeadlineLayer(deadline))
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(RestClientMetricsLayer)
        .service(hyper.map_err(BoxError::from));
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// Whether a request streams for as long as the server keeps it open (a watch, or an
/// upgraded connection): those are bounded by the watcher's own idle timeout and the
/// keepalives, not by a request deadline.
fn is_stream<B>(req: &hyper::Request<B>) -> bool {
    let watch = req.uri().query().is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "watch" && (v == "true" || v == "1"))
    });
    watch || req.headers().contains_key(hyper::header::UPGRADE)
}

/// Records each request to the API server as client-go's `rest_client_*` metrics: by
/// status code (`<error>` without an answer), host and method, and its latency to the
/// response by verb and URL template ([`url_template`]).
#[derive(Debug, Clone, Copy)]
struct RestClientMetricsLayer;

impl<S> Layer<S> for RestClientMetricsLayer {
    type Service = RestClientMetrics<S>;
    fn layer(&self, inner: S) -> RestClientMetrics<S> {
        RestClientMetrics(inner)
    }
}

/// See [`RestClientMetricsLayer`].
#[derive(Debug, Clone)]
struct RestClientMetrics<S>(S);

impl<S, B, RB> Service<hyper::Request<B>> for RestClientMetrics<S>
where
    S: Service<hyper::Request<B>, Response = hyper::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: hyper::Request<B>) -> Self::Future {
        let method = req.method().as_str().to_owned();
        let host = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        let url = url_template(req.uri());
        let started = std::time::Instant::now();
        let response = self.0.call(req);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            crate::metrics::global().observe_rest_request(
                &method,
                &host,
                &url,
                &code,
                started.elapsed(),
            );
            result
        })
    }
}

/// A request's URL as client-go labels its latency: scheme, host and path, with the
/// namespace and the object's name replaced by `{namespace}` and `{name}` (written
/// URL-escaped, as Go's `url.URL` writes them), and no query.
fn url_template(uri: &hyper::Uri) -> String {
    let mut segments: Vec<&str> = uri.path().split('/').collect();
    // `/api/v1/...` or `/apis/<group>/<version>/...`: where the resource path starts.
    let start = match segments.get(1) {
        Some(&"api") => 3,
        Some(&"apis") => 4,
        _ => segments.len(),
    };
    let mut i = start;
    if segments.get(i) == Some(&"namespaces") && segments.len() > i + 2 {
        segments[i + 1] = "%7Bnamespace%7D";
        i += 2;
    }
    // <resource>/<name>[/<subresource>]
    if segments.len() > i + 1 {
        segments[i + 1] = "%7Bname%7D";
    }
    let scheme = uri.scheme_str().unwrap_or("https");
    let host = uri.authority().map_or("", |a| a.as_str());
    format!("{scheme}://{host}{}", segments.join("/"))
}

/// Bounds the time to a response of requests that are not streams.
#[derive(Debug, Clone, Copy)]
struct DeadlineLayer(Duration);

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;
    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            limit: self.0,
        }
    }
}

/// See [`DeadlineLayer`].
#[derive(Debug, Clone)]
struct Deadline<S> {
    inner: S,
    limit: Duration,
}

impl<S, B, RB> Service<hyper::Request<B>> for Deadline<S>
where
    S: Service<hyper::Request<B>, Response = hyper::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = hyper::Response<TimedBody<RB>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: hyper::Request<B>) -> Self::Future {
        let limit = (!is_stream(&req)).then_some(self.limit);
        let response = self.inner.call(req);
        Box::pin(async move {
            let Some(limit) = limit else {
                let response = response.await.map_err(Into::into)?;
                return Ok(response.map(|body| TimedBody::new(body, None)));
            };
            // One deadline for the response and its body, as Go's `http.Client.Timeout`.
            let deadline = tokio::time::Instant::now() + limit;
            let response = tokio::time::timeout_at(deadline, response)
                .await
                .map_err(|_| BoxError::from(RequestTimedOut(limit)))?
                .map_err(Into::into)?;
            Ok(response.map(|body| TimedBody::new(body, Some((deadline, limit)))))
        })
    }
}

/// A response body that fails once its request's deadline (if any) passes.
pub struct TimedBody<B> {
    inner: Pin<Box<B>>,
    deadline: Option<(Pin<Box<tokio::time::Sleep>>, Duration)>,
}

impl<B> TimedBody<B> {
    fn new(inner: B, deadline: Option<(tokio::time::Instant, Duration)>) -> Self {
        Self {
            inner: Box::pin(inner),
            deadline: deadline.map(|(at, limit)| (Box::pin(tokio::time::sleep_until(at)), limit)),
        }
    }
}

impl<B> hyper::body::Body for TimedBody<B>
where
    B: hyper::body::Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<B::Data>, BoxError>>> {
        if let Some((sleep, limit)) = &mut self.deadline
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Some(Err(RequestTimedOut(*limit).into())));
        }
        self.inner
            .as_mut()
            .poll_frame(cx)
            .map(|frame| frame.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::{WatchRetry, jittered};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::Api;
    use kube::api::WatchParams;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    #[test]
    fn urls_are_templated_as_client_gos() {
        let t = |u: &str| url_template(&u.parse().unwrap());
        assert_eq!(
            t("https://127.0.0.1:6443/api/v1/namespaces/default/pods/web/status?x=1"),
            "https://127.0.0.1:6443/api/v1/namespaces/%7Bnamespace%7D/pods/%7Bname%7D/status"
        );
        assert_eq!(
            t("https://127.0.0.1:6443/api/v1/nodes/n1"),
            "https://127.0.0.1:6443/api/v1/nodes/%7Bname%7D"
        );
        assert_eq!(
            t(
                "https://127.0.0.1:6443/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"
            ),
            "https://127.0.0.1:6443/apis/coordination.k8s.io/v1/namespaces/%7Bnamespace%7D/leases/%7Bname%7D"
        );
        assert_eq!(
            t("https://127.0.0.1:6443/api/v1/pods?fieldSelector=spec.nodeName%3Dn1"),
            "https://127.0.0.1:6443/api/v1/pods"
        );
    }

    /// An API server that accepts connections and reads requests but never answers: what a
    /// client sees through a half-open connection. Returns its address and a channel with
    /// each accepted client's port.
    async fn silent_server() -> (
        std::net::SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<u16>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut conn, peer)) = listener.accept().await {
                let _ = tx.send(peer.port());
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        (addr, rx)
    }

    fn client_for(addr: std::net::SocketAddr, deadline: Duration) -> kube::Client {
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        build(&config, deadline).unwrap()
    }

    #[tokio::test]
    async fn a_lease_renewal_on_a_silent_connection_ends_at_the_deadline() {
        let (addr, _) = silent_server().await;
        let leases: Api<Lease> = Api::namespaced(
            client_for(addr, Duration::from_millis(300)),
            "kube-node-lease",
        );
        let started = std::time::Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(10), leases.get("rk-node1"))
            .await
            .expect("the request ends by itself");
        let err = got.expect_err("nothing answered");
        assert!(err.to_string().contains("timed out"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// A server that answers with headers and the start of a body, then says nothing more.
    #[tokio::test]
    async fn a_response_whose_body_stalls_ends_at_the_deadline() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf).await;
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                content-length: 1000\r\n\r\n{\"kind\":";
                    let _ = conn.write_all(head.as_bytes()).await;
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        let leases: Api<Lease> = Api::namespaced(
            client_for(addr, Duration::from_millis(300)),
            "kube-node-lease",
        );
        let got = tokio::time::timeout(Duration::from_secs(10), leases.get("rk-node1"))
            .await
            .expect("the request ends by itself");
        let err = got.expect_err("the body never came");
        assert!(err.to_string().contains("timed out"), "{err:?}");
    }

    #[tokio::test]
    async fn a_watch_is_not_cut_by_the_request_deadline() {
        let (addr, _) = silent_server().await;
        let leases: Api<Lease> = Api::namespaced(
            client_for(addr, Duration::from_millis(100)),
            "kube-node-lease",
        );
        let params = WatchParams::default();
        let watch = leases.watch(&params, "0");
        let outcome = tokio::time::timeout(Duration::from_millis(800), watch).await;
        assert!(outcome.is_err(), "the watch still waits for the server");
    }

    #[test]
    fn streams_are_watches_and_upgrades() {
        let req = |uri: &str| hyper::Request::get(uri).body(()).unwrap();
        assert!(is_stream(&req("/api/v1/pods?watch=true&resourceVersion=1")));
        assert!(is_stream(&req("/api/v1/pods?watch=1")));
        assert!(!is_stream(&req("/api/v1/pods?watch=false")));
        assert!(!is_stream(&req("/api/v1/namespaces/a/pods/b/status")));
        let upgrade = hyper::Request::get("/exec")
            .header(hyper::header::UPGRADE, "websocket")
            .body(())
            .unwrap();
        assert!(is_stream(&upgrade));
    }

    /// The client's connections carry TCP keepalives: the kernel shows a keepalive timer
    /// (`tr` 2 in /proc/net/tcp) on the idle client socket.
    #[tokio::test]
    async fn connections_have_tcp_keepalive() {
        let (addr, mut ports) = silent_server().await;
        let leases: Api<Lease> =
            Api::namespaced(client_for(addr, Duration::from_secs(30)), "kube-node-lease");
        let request = tokio::spawn(async move { leases.get("rk-node1").await });
        let port = tokio::time::timeout(Duration::from_secs(5), ports.recv())
            .await
            .unwrap()
            .unwrap();
        // The request was sent and acknowledged: the socket is idle, its keepalive timer on.
        let mut timer = None;
        for _ in 0..50 {
            timer = keepalive_timer_of(port);
            if timer == Some(2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        request.abort();
        assert_eq!(
            timer,
            Some(2),
            "client socket on port {port} has no keepalive timer"
        );
    }

    /// A refused watch and other failures each back off from 800 ms to 30 s on their own,
    /// and start over after 2 min without a failure; waits are jittered by up to 100 %.
    #[tokio::test]
    async fn refused_watches_and_other_failures_back_off_each_on_their_own() {
        // A port nobody listens on: the client's own error, as the watcher sees it.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        let client = build(&config, Duration::from_secs(5)).unwrap();
        let refused = client.list_api_groups().await.expect_err("nothing listens");
        let mut retry = WatchRetry::default();
        let t = std::time::Instant::now();
        assert_eq!(
            retry.after(&refused, t),
            Duration::from_millis(800),
            "{refused:?}"
        );
        assert_eq!(retry.after(&refused, t), Duration::from_millis(1600));
        let gone = std::io::Error::other("410 Gone: too old resource version");
        assert_eq!(retry.after(&gone, t), Duration::from_millis(800));
        assert_eq!(retry.after(&gone, t), Duration::from_millis(1600));
        for _ in 0..10 {
            retry.after(&gone, t);
        }
        assert_eq!(retry.after(&gone, t), Duration::from_secs(30));
        assert_eq!(retry.after(&refused, t), Duration::from_millis(3200));
        let later = t + Duration::from_secs(121);
        assert_eq!(retry.after(&gone, later), Duration::from_millis(800));
        assert_eq!(retry.after(&refused, later), Duration::from_millis(800));
        // The Node authorizer's graph behind the pod's binding: tried again sooner.
        let lag = std::io::Error::other(
            "secrets \"default-token-7nxdf\" is forbidden: User \"system:node:rk-node2\" cannot list \
             resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship \
             found between node 'rk-node2' and this object: Forbidden",
        );
        assert_eq!(retry.after(&lag, later), Duration::from_millis(100));
        assert_eq!(retry.after(&lag, later), Duration::from_millis(200));
        assert_eq!(retry.after(&gone, later), Duration::from_millis(1600));
        let base = Duration::from_secs(2);
        assert_eq!(jittered(base, 0.0), base);
        assert_eq!(jittered(base, 0.5), Duration::from_secs(3));
    }

    /// The `tr` (timer) field of the loopback socket with local port `port`.
    fn keepalive_timer_of(port: u16) -> Option<u8> {
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        let local = format!("0100007F:{port:04X}");
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(1) == Some(&local.as_str()))
                .then(|| fields.get(5)?.split(':').next()?.parse().ok())
                .flatten()
        })
    }
}
