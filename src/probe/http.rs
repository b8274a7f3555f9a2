//! The HTTP probe: one GET with the probe's timeout, as the kubelet's `pkg/probe/http`.
//!
//! A fresh connection per request (the kubelet disables keep-alives), HTTPS without
//! certificate verification, `User-Agent: kube-probe/1.20` and `Accept: */*` unless the
//! probe sets them, redirects followed only to the same host (at most 10; a redirect to
//! another host ends the probe with a warning), 2xx success, 3xx warning, anything else
//! failure with `HTTP probe failed with statuscode: N`. At most 10 KiB of the body is kept.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::tcp::{dial, join_host_port};
use super::{MAX_OUTPUT, Outcome, ProbeResult, capped_text};

/// The kubelet's probe user agent (`kube-probe/<major>.<minor>`).
pub const USER_AGENT: &str = "kube-probe/1.20";

/// Redirects the kubelet follows before giving up.
const MAX_REDIRECTS: usize = 10;

/// The most of a response head this client reads.
const MAX_HEAD: usize = 64 * 1024;

/// HTTP or HTTPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTPS, without certificate verification.
    Https,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// Where an HTTP probe (or hook) sends its GET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// HTTP or HTTPS.
    pub scheme: Scheme,
    /// The host to connect to (the pod IP unless the probe names one).
    pub host: String,
    /// The resolved port.
    pub port: u16,
    /// The request path, with its query; empty means `/`.
    pub path: String,
    /// The probe's headers, in order.
    pub headers: Vec<(String, String)>,
}

impl Target {
    /// The target of an `httpGet` action (a probe's or a hook's) whose port resolved to
    /// `port`; its host defaults to `pod_ip`.
    #[must_use]
    pub fn of_action(
        get: &k8s_openapi::api::core::v1::HTTPGetAction,
        port: u16,
        pod_ip: &str,
    ) -> Self {
        Self {
            scheme: if get.scheme.as_deref() == Some("HTTPS") {
                Scheme::Https
            } else {
                Scheme::Http
            },
            host: super::host_or(get.host.as_deref(), pod_ip),
            port,
            path: get.path.clone().unwrap_or_default(),
            headers: get
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        }
    }

    /// The URL, as the kubelet prints it in its messages.
    pub fn url(&self) -> String {
        Location::of(self).url()
    }
}

/// One request's scheme, host, port and path (changes on redirects; the headers do not).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    scheme: Scheme,
    host: String,
    port: u16,
    path: String,
}

impl Location {
    fn of(target: &Target) -> Self {
        let path = if target.path.starts_with('/') {
            target.path.clone()
        } else {
            format!("/{}", target.path)
        };
        Self {
            scheme: target.scheme,
            host: target.host.clone(),
            port: target.port,
            path,
        }
    }

    fn authority(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    fn url(&self) -> String {
        format!(
            "{}://{}{}",
            self.scheme.as_str(),
            self.authority(),
            self.path
        )
    }

    /// The location a `Location:` header points to, relative to this one.
    fn resolve(&self, location: &str) -> Self {
        let absolute = [Scheme::Http, Scheme::Https]
            .into_iter()
            .find_map(|scheme| {
                location
                    .strip_prefix(scheme.as_str())
                    .and_then(|rest| rest.strip_prefix("://"))
                    .map(|rest| (scheme, rest))
            });
        let (scheme, rest) = match (absolute, location.strip_prefix("//")) {
            (Some(found), _) => found,
            (None, Some(rest)) => (self.scheme, rest),
            (None, None) => {
                let path = if location.starts_with('/') {
                    location.to_owned()
                } else {
                    let base = self.path.split('?').next().unwrap_or("/");
                    let dir = &base[..base.rfind('/').map_or(0, |at| at + 1)];
                    format!("{dir}{location}")
                };
                return Self {
                    path,
                    ..self.clone()
                };
            }
        };
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        let (host, port) = split_authority(authority, scheme.default_port());
        Self {
            scheme,
            host,
            port,
            path: if path.starts_with('/') {
                path.to_owned()
            } else {
                format!("/{path}")
            },
        }
    }
}

/// Splits `host[:port]` (IPv6 hosts in brackets) into host and port.
fn split_authority(authority: &str, default_port: u16) -> (String, u16) {
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':')),
            None => (rest, None),
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = port.and_then(|p| p.parse().ok()).unwrap_or(default_port);
    (host.to_owned(), port)
}

/// A response: its status, where it redirects to, and the start of its body.
struct Response {
    status: u16,
    location: Option<String>,
    body: Vec<u8>,
}

/// Sends the GET (following same-host redirects) within `timeout` and judges the answer.
pub async fn get(target: &Target, timeout: Duration) -> Outcome {
    match tokio::time::timeout(timeout, get_unbounded(target)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::new(
            ProbeResult::Failure,
            format!(
                "Get {:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
                target.url()
            ),
        ),
    }
}

/// Sends the GET with no deadline of its own and judges the answer: a lifecycle hook's,
/// which the kubelet sends with a client that has no timeout (its caller bounds it).
pub async fn get_unbounded(target: &Target) -> Outcome {
    match follow(target).await {
        Ok(response) => judge(&response),
        Err(message) => Outcome::new(ProbeResult::Failure, message),
    }
}

/// 2xx is success, 3xx (a redirect not followed) a warning, anything else failure.
fn judge(response: &Response) -> Outcome {
    match response.status {
        200..=299 => Outcome::new(ProbeResult::Success, capped_text(&response.body)),
        300..=399 => Outcome::new(ProbeResult::Warning, capped_text(&response.body)),
        status => Outcome::new(
            ProbeResult::Failure,
            format!("HTTP probe failed with statuscode: {status}"),
        ),
    }
}

/// Requests `target`, following redirects to the same host; errors are Go's client
/// messages (`Get "url": ...`).
async fn follow(target: &Target) -> Result<Response, String> {
    let mut location = Location::of(target);
    let mut redirects = 0;
    loop {
        let response = fetch(&location, &target.headers)
            .await
            .map_err(|e| format!("Get {:?}: {e}", location.url()))?;
        let next = match (&response.location, response.status) {
            (Some(to), 301 | 302 | 303 | 307 | 308) => location.resolve(to),
            _ => return Ok(response),
        };
        if next.host != target.host {
            return Ok(response);
        }
        redirects += 1;
        if redirects >= MAX_REDIRECTS {
            return Err(format!(
                "Get {:?}: stopped after {MAX_REDIRECTS} redirects",
                next.url()
            ));
        }
        location = next;
    }
}

/// One request over a new connection.
async fn fetch(location: &Location, headers: &[(String, String)]) -> Result<Response, String> {
    let stream = dial(&location.authority(), Duration::MAX).await?;
    let request = request_head(location, headers);
    match location.scheme {
        Scheme::Http => exchange(stream, &request).await,
        Scheme::Https => {
            let name = ServerName::try_from(location.host.clone())
                .map_err(|e| format!("invalid server name {:?}: {e}", location.host))?;
            let tls = tokio_rustls::TlsConnector::from(tls_config())
                .connect(name, stream)
                .await
                .map_err(|e| format!("remote error: tls: {e}"))?;
            exchange(tls, &request).await
        }
    }
}

/// The request head: the probe's headers, the kubelet's defaults, `Connection: close`.
fn request_head(location: &Location, headers: &[(String, String)]) -> Vec<u8> {
    let has = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let host = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("host"))
        .map_or_else(|| location.authority(), |(_, v)| v.clone());
    let mut head = format!("GET {} HTTP/1.1\r\nHost: {host}\r\n", location.path);
    if !has("user-agent") {
        head.push_str("User-Agent: ");
        head.push_str(USER_AGENT);
        head.push_str("\r\n");
    }
    if !has("accept") {
        head.push_str("Accept: */*\r\n");
    }
    for (name, value) in headers {
        let skip = name.eq_ignore_ascii_case("host")
            || (name.eq_ignore_ascii_case("accept") && value.is_empty());
        if !skip {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    head.into_bytes()
}

/// Writes the request and reads the response head and up to [`MAX_OUTPUT`] of its body.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &[u8],
) -> Result<Response, String> {
    stream
        .write_all(request)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::with_capacity(4096);
    let (status, location, head_len, length, chunked) = loop {
        if stream
            .read_buf(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?
            == 0
        {
            return Err("EOF".to_owned());
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let value = |name: &str| {
                    parsed
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).into_owned())
                };
                let length = value("content-length").and_then(|v| v.trim().parse::<usize>().ok());
                let chunked = value("transfer-encoding")
                    .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
                break (
                    parsed.code.unwrap_or(0),
                    value("location"),
                    len,
                    length,
                    chunked,
                );
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => return Err("response head too large".to_owned()),
            Err(e) => return Err(format!("malformed HTTP response: {e}")),
        }
    };
    let mut raw = buf.split_off(head_len);
    // Chunk framing costs a few bytes per chunk: read a little more than the cap.
    let wanted = length.map_or(2 * MAX_OUTPUT, |l| l.min(MAX_OUTPUT));
    while raw.len() < wanted && !(chunked && raw.ends_with(b"0\r\n\r\n")) {
        match stream.read_buf(&mut raw).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let mut body = if chunked { dechunk(&raw) } else { raw };
    body.truncate(MAX_OUTPUT);
    Ok(Response {
        status,
        location,
        body,
    })
}

/// Decodes as much of a chunked body as `raw` holds.
fn dechunk(raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    let mut rest = raw;
    while let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size_hex = size_text.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_hex, 16) else {
            break;
        };
        if size == 0 {
            break;
        }
        rest = &rest[line_end + 2..];
        let take = size.min(rest.len());
        body.extend_from_slice(&rest[..take]);
        rest = rest.get(take + 2..).unwrap_or(&[]);
    }
    body
}

/// The TLS client configuration: no certificate verification, as the kubelet's probes.
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = crate::tls::provider();
            let verifier = Arc::new(AnyCertificate(provider.clone()));
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("the ring provider supports the default TLS versions")
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// Accepts any server certificate (signatures are still checked).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// Serves each connection the next canned response, and answers the request heads seen.
    async fn serve(responses: Vec<String>) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            for response in responses {
                let (mut conn, _) = listener.accept().await.expect("accept");
                let mut buf = vec![0; 4096];
                let n = conn.read(&mut buf).await.expect("read");
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                conn.write_all(response.as_bytes()).await.expect("write");
            }
            seen
        });
        (port, task)
    }

    fn target(port: u16, path: &str) -> Target {
        Target {
            scheme: Scheme::Http,
            host: "127.0.0.1".to_owned(),
            port,
            path: path.to_owned(),
            headers: vec![("X-Probe".to_owned(), "yes".to_owned())],
        }
    }

    #[tokio::test]
    async fn a_200_is_success_with_the_kubelet_headers() {
        let (port, server) = serve(vec![
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_owned(),
        ])
        .await;
        let outcome = get(&target(port, "/healthz"), Duration::from_secs(2)).await;
        assert_eq!(outcome, Outcome::new(ProbeResult::Success, "ok"));
        let seen = server.await.expect("server");
        assert!(
            seen[0].starts_with("GET /healthz HTTP/1.1\r\n"),
            "{}",
            seen[0]
        );
        assert!(seen[0].contains(&format!("Host: 127.0.0.1:{port}\r\n")));
        assert!(seen[0].contains("User-Agent: kube-probe/1.20\r\n"));
        assert!(seen[0].contains("Accept: */*\r\n"));
        assert!(seen[0].contains("X-Probe: yes\r\n"));
    }

    #[tokio::test]
    async fn a_500_fails_with_the_kubelet_message() {
        let (port, _server) = serve(vec![
            "HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n".to_owned(),
        ])
        .await;
        let outcome = get(&target(port, ""), Duration::from_secs(2)).await;
        assert_eq!(
            outcome,
            Outcome::new(
                ProbeResult::Failure,
                "HTTP probe failed with statuscode: 500"
            )
        );
    }

    #[tokio::test]
    async fn same_host_redirects_are_followed_and_other_hosts_end_with_a_warning() {
        let (port, server) = serve(vec![
            "HTTP/1.1 302 Found\r\nLocation: /next\r\nContent-Length: 0\r\n\r\n".to_owned(),
            "HTTP/1.1 302 Found\r\nLocation: http://elsewhere.invalid/\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nmoved\r\n0\r\n\r\n"
                .to_owned(),
        ])
        .await;
        let outcome = get(&target(port, "/start"), Duration::from_secs(2)).await;
        assert_eq!(outcome, Outcome::new(ProbeResult::Warning, "moved"));
        let seen = server.await.expect("server");
        assert!(seen[1].starts_with("GET /next HTTP/1.1"), "{}", seen[1]);
    }

    #[tokio::test]
    async fn endless_redirects_stop_after_ten() {
        let redirect = "HTTP/1.1 301 Moved\r\nLocation: /again\r\nContent-Length: 0\r\n\r\n";
        let (port, _server) = serve(vec![redirect.to_owned(); MAX_REDIRECTS]).await;
        let outcome = get(&target(port, "/"), Duration::from_secs(2)).await;
        assert_eq!(outcome.result, ProbeResult::Failure);
        assert!(
            outcome.output.ends_with("stopped after 10 redirects"),
            "{}",
            outcome.output
        );
    }

    #[tokio::test]
    async fn a_closed_port_and_a_silent_server_fail_with_go_messages() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let silent = get(&target(port, "/"), Duration::from_millis(200)).await;
        assert_eq!(silent.result, ProbeResult::Failure);
        assert!(
            silent.output.contains("Client.Timeout exceeded"),
            "{}",
            silent.output
        );
        drop(listener);
        let refused = get(&target(port, "/"), Duration::from_secs(1)).await;
        assert_eq!(
            refused.output,
            format!(
                "Get \"http://127.0.0.1:{port}/\": dial tcp 127.0.0.1:{port}: connect: connection refused"
            )
        );
    }

    #[test]
    fn locations_resolve_like_urls() {
        let base = Location::of(&target(8080, "/a/b?x=1"));
        assert_eq!(base.resolve("c").path, "/a/c");
        assert_eq!(base.resolve("/d").url(), "http://127.0.0.1:8080/d");
        assert_eq!(base.resolve("https://h:9/e").url(), "https://h:9/e");
        assert_eq!(base.resolve("//h").url(), "http://h:80/");
        assert_eq!(base.resolve("http://[::1]:81/f").url(), "http://[::1]:81/f");
    }
}
