//! The certificates API flow, as client-go's `util/certificate/csr` and the kubelet's
//! certificate manager: a new ECDSA P-256 key and a CSR for a signer, created through a
//! [`CsrApi`], waited on until issued (or denied, failed, timed out), and renewed at a
//! jittered 70–90 % of the certificate's lifetime.

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams, WatchEvent, WatchParams};
use tokio_util::sync::CancellationToken;

use super::CertificateError;
use super::store::PemStore;
use crate::backoff::random_fraction;
use crate::tls::ServingCertificate;

/// The shortest time between two watches of a CSR that waits for its certificate.
const POLL: Duration = Duration::from_secs(1);
/// Retry delay after a failed renewal.
const RETRY: Duration = Duration::from_secs(10);

/// Why no certificate came from a CSR.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// Creating the CSR failed: what client-go's certificate manager judges the API
    /// server's health by.
    #[error("certificates API: creating the CSR: {0}")]
    Create(kube::Error),
    /// Reading the CSR back failed.
    #[error("certificates API: {0}")]
    Api(#[from] kube::Error),
    /// The CSR was denied.
    #[error("certificate signing request {name} is denied, reason: {reason}, message: {message}")]
    Denied {
        /// The CSR's name.
        name: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The signer failed to sign it.
    #[error("certificate signing request {name} failed, reason: {reason}, message: {message}")]
    Failed {
        /// The CSR's name.
        name: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The CSR of the same name asks for something else than this request.
    #[error("certificate signing request {name} exists and is not compatible: {reason}")]
    Incompatible {
        /// The CSR's name.
        name: String,
        /// What differs.
        reason: String,
    },
    /// The CSR was deleted while it was waited for.
    #[error("certificate signing request {name} was deleted")]
    Deleted {
        /// The CSR's name.
        name: String,
    },
    /// Another CSR took the name of the one waited for.
    #[error("certificate signing request {name} changed UIDs")]
    Replaced {
        /// The CSR's name.
        name: String,
    },
    /// Nobody approved or signed the CSR in time.
    #[error("certificate signing request {name} was not signed within {waited:?}")]
    NotIssued {
        /// The CSR's name.
        name: String,
        /// How long it was waited for.
        waited: Duration,
    },
}

/// The certificates API, behind a trait so the flow is tested without a server.
pub trait CsrApi: Send + Sync {
    /// Creates `csr`; returns it as stored (with its name).
    fn create(
        &self,
        csr: &CertificateSigningRequest,
    ) -> impl Future<Output = Result<CertificateSigningRequest, kube::Error>> + Send;
    /// Reads the CSR `name`.
    fn get(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<CertificateSigningRequest, kube::Error>> + Send;
    /// Watches the CSR `name` from `resource_version`, until the server ends the watch.
    fn watch(
        &self,
        name: &str,
        resource_version: &str,
    ) -> impl Future<Output = Result<CsrEvents, kube::Error>> + Send;
}

/// The events of a watched CSR.
pub type CsrEvents = BoxStream<'static, Result<WatchEvent<CertificateSigningRequest>, kube::Error>>;

impl CsrApi for Api<CertificateSigningRequest> {
    async fn create(
        &self,
        csr: &CertificateSigningRequest,
    ) -> Result<CertificateSigningRequest, kube::Error> {
        Api::create(self, &PostParams::default(), csr).await
    }

    async fn get(&self, name: &str) -> Result<CertificateSigningRequest, kube::Error> {
        Api::get(self, name).await
    }

    async fn watch(&self, name: &str, resource_version: &str) -> Result<CsrEvents, kube::Error> {
        use futures::StreamExt;
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(WATCH_TIMEOUT_SECS);
        Ok(Api::watch(self, &params, resource_version).await?.boxed())
    }
}

/// What to request from a signer.
#[derive(Debug, Clone)]
pub struct CsrTemplate {
    /// The signer (`spec.signerName`).
    pub signer: &'static str,
    /// Key usages, as the kubelet sends them (a v1.20 signer wants exactly these).
    pub usages: &'static [&'static str],
    /// Subject and SANs.
    pub params: rcgen::CertificateParams,
}

/// A new ECDSA P-256 key, the kind the kubelet makes.
///
/// # Errors
/// Key generation failed.
pub fn new_key() -> Result<rcgen::KeyPair, rcgen::Error> {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
}

/// The signer of kubelet client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Usages of a kubelet client certificate.
pub const CLIENT_USAGES: &[&str] = &["digital signature", "key encipherment", "client auth"];

/// Subject `O=system:nodes, CN=system:node:<name>`, the node authorizer's identity.
#[must_use]
pub fn node_subject(node_name: &str) -> rcgen::DistinguishedName {
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    dn.push(
        rcgen::DnType::CommonName,
        format!("system:node:{node_name}"),
    );
    dn
}

impl CsrTemplate {
    /// The node's client certificate: no SANs, signer
    /// `kubernetes.io/kube-apiserver-client-kubelet`.
    #[must_use]
    pub fn node_client(node_name: &str) -> Self {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = node_subject(node_name);
        Self {
            signer: KUBELET_CLIENT_SIGNER,
            usages: CLIENT_USAGES,
            params,
        }
    }

    /// A new ECDSA P-256 key and a PEM CSR for it.
    ///
    /// # Errors
    /// Key generation or signing failed.
    pub fn generate(&self) -> Result<(String, rcgen::KeyPair), rcgen::Error> {
        let key = new_key()?;
        Ok((self.request(&key)?, key))
    }

    /// A PEM CSR for `key`.
    ///
    /// # Errors
    /// Signing failed.
    pub fn request(&self, key: &rcgen::KeyPair) -> Result<String, rcgen::Error> {
        self.params.serialize_request(key)?.pem()
    }

    /// The CSR object for `csr_pem`: named `name`, or `csr-<random>` when `None`.
    #[must_use]
    pub fn object(&self, name: Option<String>, csr_pem: String) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: ObjectMeta {
                generate_name: name.is_none().then(|| "csr-".into()),
                name,
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(csr_pem.into_bytes()),
                signer_name: self.signer.into(),
                usages: Some(self.usages.iter().map(|u| (*u).to_owned()).collect()),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        }
    }

    /// The bootstrap CSR's name, as the kubelet digests it: `node-csr-` and the unpadded
    /// URL-safe base64 of the SHA-512/256 of the public key, common name, organizations
    /// and usages, each base64-encoded and ended by `|`. The same key asks under the
    /// same name.
    #[must_use]
    pub fn digested_name(&self, key: &rcgen::KeyPair) -> String {
        use base64::Engine;
        let encode = |data: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data);
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA512_256);
        let mut write = |data: &[u8]| {
            ctx.update(encode(data).as_bytes());
            ctx.update(b"|");
        };
        write(&rcgen::PublicKeyData::subject_public_key_info(key));
        let dn = &self.params.distinguished_name;
        let text = |t: &rcgen::DnType| match dn.get(t) {
            Some(rcgen::DnValue::Utf8String(s)) => s.clone(),
            _ => String::new(),
        };
        write(text(&rcgen::DnType::CommonName).as_bytes());
        write(text(&rcgen::DnType::OrganizationName).as_bytes());
        for usage in self.usages {
            write(usage.as_bytes());
        }
        format!("node-csr-{}", encode(ctx.finish().as_ref()))
    }
}

/// Creates `request` (a CSR for `key`) and waits up to `timeout` for its certificate
/// (PEM), as client-go's `RequestCertificate` and `WaitForCertificate`: a named request
/// that exists already (a previous run made it with the same key) is reused if it asks for
/// the same thing, approved and signed meanwhile or not.
///
/// # Errors
/// The creation failed ([`CsrError::Create`]), the existing CSR asks for something else,
/// the CSR was denied, failed or deleted, or it was not signed in time.
pub async fn request_certificate<A: CsrApi>(
    api: &A,
    request: &CertificateSigningRequest,
    key: &rcgen::KeyPair,
    timeout: Duration,
) -> Result<Vec<u8>, CsrError> {
    let created = match api.create(request).await {
        Ok(created) => created,
        Err(kube::Error::Api(status)) if status.code == 409 && request.metadata.name.is_some() => {
            let name = request.metadata.name.clone().unwrap_or_default();
            tracing::info!(csr = %name, "csr for this node already exists, reusing");
            let existing = api.get(&name).await.map_err(CsrError::Create)?;
            compatible(&existing, request, key)
                .map_err(|reason| CsrError::Incompatible { name, reason })?;
            existing
        }
        Err(e) => return Err(CsrError::Create(e)),
    };
    let name = created.metadata.name.unwrap_or_default();
    let uid = created.metadata.uid;
    tracing::info!(csr = %name, signer = %request.spec.signer_name, "certificate signing request created; waiting for it to be approved and signed");
    tokio::time::timeout(timeout, wait_for_certificate(api, &name, uid.as_deref()))
        .await
        .map_err(|_| CsrError::NotIssued {
            name,
            waited: timeout,
        })?
}

/// Whether the CSR `existing` asks what `request` asks for `key` (client-go's
/// `ensureCompatible`): the same signer and usages, and a request for the same public key.
fn compatible(
    existing: &CertificateSigningRequest,
    request: &CertificateSigningRequest,
    key: &rcgen::KeyPair,
) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    if existing.spec.signer_name != request.spec.signer_name {
        return Err(format!(
            "mismatched signerName: {} != {}",
            existing.spec.signer_name, request.spec.signer_name
        ));
    }
    let usages = |csr: &CertificateSigningRequest| {
        csr.spec
            .usages
            .iter()
            .flatten()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
    };
    if usages(existing) != usages(request) {
        return Err(format!(
            "mismatched usages: {:?} != {:?}",
            usages(existing),
            usages(request)
        ));
    }
    let der =
        rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(&existing.spec.request.0)
            .map_err(|e| format!("unable to parse the request: {e}"))?;
    let spki = rcgen::PublicKeyData::subject_public_key_info(key);
    if !der
        .as_ref()
        .windows(spki.len())
        .any(|w| w == spki.as_slice())
    {
        return Err("the request is for another public key".into());
    }
    Ok(())
}

/// Waits for the CSR `name` (with `uid`, when known) to be issued, as client-go's
/// `WaitForCertificate` with its informer: reads it, then watches it from what was read.
/// A failed read or watch (the API server restarting, a request timing out, a watch too
/// old) is retried after the reflector's back-off ([`crate::backoff::WatchRetry`]); it
/// never ends the wait.
///
/// # Errors
/// The CSR was denied, failed, deleted or replaced.
async fn wait_for_certificate<A: CsrApi>(
    api: &A,
    name: &str,
    uid: Option<&str>,
) -> Result<Vec<u8>, CsrError> {
    let mut retry = crate::backoff::WatchRetry::default();
    loop {
        let opened = tokio::time::Instant::now();
        match read_and_watch(api, name, uid).await {
            Ok(Some(cert)) => return Ok(cert),
            // The server ended the watch: watch again, no faster than once a `POLL`.
            Ok(None) => tokio::time::sleep_until(opened + POLL).await,
            Err(CsrError::Api(e)) => {
                tracing::warn!(csr = %name, error = %e, "waiting for the certificate signing request; retrying");
                retry.pause(&e).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long one watch of a waited-for CSR lasts before it is opened again.
const WATCH_TIMEOUT_SECS: u32 = 290;

/// One read and watch of the CSR `name`: its certificate once issued, `None` when the
/// watch ended first.
async fn read_and_watch<A: CsrApi>(
    api: &A,
    name: &str,
    uid: Option<&str>,
) -> Result<Option<Vec<u8>>, CsrError> {
    use futures::StreamExt;
    let csr = match api.get(name).await {
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(CsrError::Deleted { name: name.into() });
        }
        read => read?,
    };
    if let Some(cert) = issued(csr.clone(), uid)? {
        return Ok(Some(cert));
    }
    let version = csr.metadata.resource_version.unwrap_or_default();
    let mut events = api.watch(name, &version).await?;
    while let Some(event) = events.next().await {
        match event? {
            WatchEvent::Added(csr) | WatchEvent::Modified(csr) => {
                if let Some(cert) = issued(csr, uid)? {
                    return Ok(Some(cert));
                }
            }
            WatchEvent::Deleted(_) => return Err(CsrError::Deleted { name: name.into() }),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(status) => return Err(CsrError::Api(kube::Error::Api(status))),
        }
    }
    Ok(None)
}

/// The certificate of `csr` once approved and signed; an error once denied or failed, or
/// when it is another CSR than the one made (`uid`).
fn issued(csr: CertificateSigningRequest, uid: Option<&str>) -> Result<Option<Vec<u8>>, CsrError> {
    let name = csr.metadata.name.unwrap_or_default();
    if uid.is_some_and(|uid| csr.metadata.uid.as_deref() != Some(uid)) {
        return Err(CsrError::Replaced { name });
    }
    let status = csr.status.unwrap_or_default();
    for c in status.conditions.iter().flatten() {
        let reason = c.reason.clone().unwrap_or_default();
        let message = c.message.clone().unwrap_or_default();
        match c.type_.as_str() {
            "Denied" if c.status == "True" => {
                return Err(CsrError::Denied {
                    name,
                    reason,
                    message,
                });
            }
            "Failed" if c.status == "True" => {
                return Err(CsrError::Failed {
                    name,
                    reason,
                    message,
                });
            }
            _ => {}
        }
    }
    let cert = status.certificate.filter(|c| !c.0.is_empty());
    if cert.is_some() {
        tracing::info!(csr = %name, "certificate signing request is approved and signed");
    }
    Ok(cert.map(|c| c.0))
}

/// When a certificate valid from `not_before` to `not_after` is renewed: at
/// `70 % + jitter × 20 %` of its lifetime (`jitter` in `[0, 1)`), as the kubelet does.
#[must_use]
pub fn rotation_deadline(not_before: Timestamp, not_after: Timestamp, jitter: f64) -> Timestamp {
    let total = not_after.duration_since(not_before).as_secs_f64().max(0.0);
    let fraction = 0.7 + 0.2 * jitter.clamp(0.0, 1.0);
    not_before
        .checked_add(SignedDuration::from_secs_f64(total * fraction))
        .unwrap_or(not_after)
}

/// A certificate kept fresh through the certificates API: requested from `template`'s
/// signer, stored in `store`, handed to whoever uses it.
pub struct Rotation<A> {
    /// The certificates API.
    pub api: A,
    /// What to request.
    pub template: CsrTemplate,
    /// Where issued certificates are kept.
    pub store: PemStore,
    /// How long one CSR is waited for before a new one is made.
    pub wait: Duration,
    /// With `Some(after)`, [`Self::run`] ends with [`CertificateError::Expired`] once no
    /// valid certificate has been held for `after` and the API server answered the last
    /// CSR creation (the kubelet's exit for its client certificate, after
    /// [`EXIT_AFTER_EXPIRY`], so that a restart bootstraps again); `None` retries for ever
    /// (its serving certificate).
    pub end_when_expired: Option<Duration>,
}

/// How long the kubelet goes on without a valid client certificate before it exits
/// (`UpdateTransport`'s `exitAfter` in `cmd/kubelet/app/server.go`).
pub const EXIT_AFTER_EXPIRY: Duration = Duration::from_secs(300);

/// What a failed renewal says of the API server's health, as client-go's certificate
/// manager judges it (`updateServerError`), from the CSR creation only: a 401 (what an
/// expired client certificate gets), 403 or 404 is the server answering; a 5xx, another
/// status or no answer is not. `None`: the creation did not fail, the judgement stands.
fn server_health(error: &CertificateError) -> Option<bool> {
    match error {
        CertificateError::Csr(CsrError::Create(e)) => Some(matches!(
            e,
            kube::Error::Api(status) if matches!(status.code, 401 | 403 | 404)
        )),
        _ => None,
    }
}

impl<A: CsrApi> Rotation<A> {
    /// One request: a new key and CSR (`csr-<random>`), wait for the certificate, store
    /// both.
    ///
    /// # Errors
    /// See [`request_certificate`]; or the certificate cannot be used or stored.
    pub async fn renew(&self) -> Result<ServingCertificate, CertificateError> {
        let (csr, key) = self.template.generate()?;
        let request = self.template.object(None, csr);
        let issued = request_certificate(&self.api, &request, &key, self.wait).await?;
        self.store.update(issued, &key.serialize_pem()).await
    }

    /// Keeps the certificate fresh until `cancel` fires: renews `current` (or requests a
    /// first one) at its rotation deadline, hands each new one to `issued`, retries
    /// failures every 10 s.
    ///
    /// # Errors
    /// [`CertificateError::Expired`], only with [`Self::end_when_expired`].
    pub async fn run(
        self,
        mut current: Option<ServingCertificate>,
        issued: impl Fn(ServingCertificate) + Send,
        cancel: CancellationToken,
    ) -> Result<(), CertificateError> {
        // client-go starts out not knowing the server healthy.
        let mut server_healthy = false;
        let serving = self.template.signer != KUBELET_CLIENT_SIGNER;
        loop {
            if let Some(c) = &current {
                crate::metrics::certificate_in_use(serving, c.info.not_after.as_second());
            }
            let wait = current.as_ref().map_or(Duration::ZERO, |c| {
                let deadline =
                    rotation_deadline(c.info.not_before, c.info.not_after, random_fraction());
                let wait = Duration::try_from(deadline.duration_since(Timestamp::now()))
                    .unwrap_or_default();
                tracing::info!(signer = self.template.signer, expiration = %c.info.not_after, rotation_deadline = %deadline, waiting = ?wait, "certificate rotation scheduled");
                wait
            });
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                () = tokio::time::sleep(wait) => {}
            }
            tracing::info!(signer = self.template.signer, "rotating certificates");
            let renewed = tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                r = self.renew() => r,
            };
            match renewed {
                Ok(cert) => {
                    tracing::info!(signer = self.template.signer, not_after = %cert.info.not_after, "certificate issued and in use");
                    issued(cert.clone());
                    current = Some(cert);
                    server_healthy = true;
                }
                Err(e) => {
                    tracing::error!(signer = self.template.signer, error = %e, "could not rotate the certificate; retrying");
                    crate::metrics::count_certificate_renew_error(serving);
                    server_healthy = server_health(&e).unwrap_or(server_healthy);
                    self.expiry_check(current.as_ref(), server_healthy)?;
                    tokio::select! {
                        () = cancel.cancelled() => return Ok(()),
                        () = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }

    /// The kubelet's check on its client certificate (`addCertRotation`): once no valid
    /// certificate has been held for [`Self::end_when_expired`], end if the server is
    /// healthy, else say that a restart may be needed.
    fn expiry_check(
        &self,
        current: Option<&ServingCertificate>,
        server_healthy: bool,
    ) -> Result<(), CertificateError> {
        let (Some(after), Some(not_after)) =
            (self.end_when_expired, current.map(|c| c.info.not_after))
        else {
            return Ok(());
        };
        let now = Timestamp::now();
        let expired_for = Duration::try_from(now.duration_since(not_after));
        if not_after > now || expired_for.is_ok_and(|d| d < after) {
            return Ok(());
        }
        if server_healthy {
            return Err(CertificateError::Expired { after, not_after });
        }
        tracing::error!(signer = self.template.signer, %not_after, "It has been {after:?} since a valid client cert was found, but the server is not responsive. A restart may be necessary to retrieve new initial credentials.");
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A certificates API in memory, with a CA that signs what is approved.

    use std::sync::Mutex;

    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };

    use super::*;

    /// What the fake does with a CSR on its first read.
    #[derive(Debug, Clone, Copy)]
    pub enum Verdict {
        /// Approve and sign it for `lifetime`.
        Sign(Duration),
        /// Approve and sign it for `lifetime` once [`FakeCsrApi::approve`] is called; a
        /// watch sees it then.
        Manual(Duration),
        /// Deny it.
        Deny,
        /// Never answer.
        Ignore,
        /// Refuse the creation with this HTTP status (401 to an expired certificate).
        Refuse(u16),
    }

    /// The fake API: every created CSR, and a CA.
    pub struct FakeCsrApi {
        pub created: Mutex<Vec<CertificateSigningRequest>>,
        pub verdict: Verdict,
        pub ca: rcgen::Issuer<'static, rcgen::KeyPair>,
        /// How many of the next reads and watches fail as an API server going away does.
        pub failing: std::sync::atomic::AtomicUsize,
        /// Reads and watches made.
        pub calls: std::sync::atomic::AtomicUsize,
        approved: tokio::sync::watch::Sender<bool>,
    }

    impl FakeCsrApi {
        pub fn new(verdict: Verdict) -> Self {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            Self {
                created: Mutex::default(),
                verdict,
                ca: rcgen::Issuer::new(params, key),
                failing: 0.into(),
                calls: 0.into(),
                approved: tokio::sync::watch::Sender::new(false),
            }
        }

        /// Approves the CSRs of a [`Verdict::Manual`] fake.
        pub fn approve(&self) {
            self.approved.send_replace(true);
        }

        /// A failure, while [`Self::failing`] counts any down.
        fn failure(&self) -> Result<(), kube::Error> {
            use std::sync::atomic::Ordering::SeqCst;
            self.calls.fetch_add(1, SeqCst);
            let failing = self
                .failing
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if failing {
                return Err(kube::Error::Service(
                    std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
                ));
            }
            Ok(())
        }

        /// A certificate for `csr_pem` valid for `lifetime` from now.
        pub fn sign(&self, csr_pem: &str, lifetime: Duration) -> String {
            let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).unwrap();
            let now = std::time::SystemTime::now();
            csr.params.not_before = now.into();
            csr.params.not_after = (now + lifetime).into();
            csr.signed_by(&self.ca).unwrap().pem()
        }
    }

    impl CsrApi for FakeCsrApi {
        async fn create(
            &self,
            csr: &CertificateSigningRequest,
        ) -> Result<CertificateSigningRequest, kube::Error> {
            if let Verdict::Refuse(code) = self.verdict {
                return Err(kube::Error::Api(
                    kube::core::Status::failure("Unauthorized", "Unauthorized")
                        .with_code(code)
                        .boxed(),
                ));
            }
            let mut created = self.created.lock().unwrap();
            let mut csr = csr.clone();
            if created.iter().any(|c| c.metadata.name == csr.metadata.name) {
                return Err(kube::Error::Api(
                    kube::core::Status::failure("exists", "AlreadyExists")
                        .with_code(409)
                        .boxed(),
                ));
            }
            if csr.metadata.name.is_none() {
                csr.metadata.name = Some(format!("csr-{}", created.len()));
            }
            csr.metadata.uid = Some(format!("uid-{}", created.len()));
            csr.metadata.resource_version = Some("1".into());
            created.push(csr.clone());
            Ok(csr)
        }

        async fn get(&self, name: &str) -> Result<CertificateSigningRequest, kube::Error> {
            self.failure()?;
            Ok(self.read(name))
        }

        async fn watch(&self, name: &str, _: &str) -> Result<CsrEvents, kube::Error> {
            use futures::StreamExt;
            self.failure()?;
            let mut approved = self.approved.subscribe();
            let csr = self.read(name);
            let signed = self.verdict_on(csr, true);
            Ok(futures::stream::once(async move {
                let _ = approved.wait_for(|a| *a).await;
                Ok(WatchEvent::Modified(signed))
            })
            .boxed())
        }
    }

    impl FakeCsrApi {
        /// The stored CSR `name` with the verdict's status.
        fn read(&self, name: &str) -> CertificateSigningRequest {
            let csr = self
                .created
                .lock()
                .unwrap()
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
                .cloned()
                .unwrap();
            let approved = *self.approved.borrow();
            self.verdict_on(csr, approved)
        }

        /// `csr` with the status the verdict gives it (a manual one when `approved`).
        fn verdict_on(
            &self,
            mut csr: CertificateSigningRequest,
            approved: bool,
        ) -> CertificateSigningRequest {
            let condition = |type_: &str| CertificateSigningRequestCondition {
                type_: type_.into(),
                status: "True".into(),
                reason: Some(format!("Auto{type_}")),
                message: Some(format!("{type_} by the test")),
                ..CertificateSigningRequestCondition::default()
            };
            let lifetime = match self.verdict {
                Verdict::Sign(lifetime) => Some(lifetime),
                Verdict::Manual(lifetime) if approved => Some(lifetime),
                _ => None,
            };
            csr.status = Some(match (self.verdict, lifetime) {
                (_, Some(lifetime)) => CertificateSigningRequestStatus {
                    conditions: Some(vec![condition("Approved")]),
                    certificate: Some(ByteString(
                        self.sign(std::str::from_utf8(&csr.spec.request.0).unwrap(), lifetime)
                            .into_bytes(),
                    )),
                },
                (Verdict::Deny, _) => CertificateSigningRequestStatus {
                    conditions: Some(vec![condition("Denied")]),
                    certificate: None,
                },
                _ => CertificateSigningRequestStatus::default(),
            });
            csr
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{FakeCsrApi, Verdict};
    use super::*;
    use crate::atomic_file;

    #[test]
    fn renewal_is_between_70_and_90_percent_of_the_lifetime() {
        let start: Timestamp = "2024-01-01T00:00:00Z".parse().unwrap();
        let end: Timestamp = "2024-01-11T00:00:00Z".parse().unwrap();
        assert_eq!(
            rotation_deadline(start, end, 0.0).to_string(),
            "2024-01-08T00:00:00Z"
        );
        assert_eq!(
            rotation_deadline(start, end, 0.5).to_string(),
            "2024-01-09T00:00:00Z"
        );
        assert!(rotation_deadline(start, end, 0.999_999) < "2024-01-10T00:00:01Z".parse().unwrap());
        for _ in 0..100 {
            let j = random_fraction();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }

    fn der_of(csr_pem: &[u8]) -> Vec<u8> {
        rustls_pki_types::pem::PemObject::from_pem_slice(csr_pem)
            .map(|d: rustls_pki_types::CertificateSigningRequestDer<'_>| d.as_ref().to_vec())
            .unwrap()
    }

    #[test]
    fn the_client_csr_names_the_node_for_the_kubelet_client_signer() {
        let template = CsrTemplate::node_client("n1");
        let (pem, key) = template.generate().unwrap();
        let parsed = rcgen::CertificateSigningRequestParams::from_pem(&pem).unwrap();
        assert!(parsed.params.subject_alt_names.is_empty());
        let der = der_of(pem.as_bytes());
        let contains = |needle: &[u8]| der.windows(needle.len()).any(|w| w == needle);
        assert!(
            contains(key.public_key_raw()),
            "the CSR carries the key's public half"
        );
        assert!(contains(b"system:node:n1") && contains(b"system:nodes"));
        let object = template.object(None, pem);
        assert_eq!(object.metadata.generate_name.as_deref(), Some("csr-"));
        assert_eq!(
            object.spec.signer_name,
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
        assert_eq!(
            object.spec.usages.unwrap(),
            ["digital signature", "key encipherment", "client auth"]
        );
        let name = template.digested_name(&key);
        assert!(
            name.starts_with("node-csr-") && name.len() == 9 + 43,
            "{name}"
        );
        assert_eq!(name, template.digested_name(&key), "stable for one key");
        let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        assert_ne!(name, template.digested_name(&other));
        assert_ne!(name, CsrTemplate::node_client("n2").digested_name(&key));
    }

    /// A 2 s certificate is renewed between 1.4 s and 1.8 s into its life: a new CSR
    /// (`csr-…`), the new certificate stored and handed over; the loop then waits for the
    /// new one's deadline.
    #[tokio::test]
    async fn the_rotation_loop_renews_at_the_deadline_and_hands_the_certificate_over() {
        let dir = std::env::temp_dir().join(format!("rkubelet-rotation-{}", std::process::id()));
        let api = FakeCsrApi::new(Verdict::Sign(Duration::from_secs(3600)));
        let template = CsrTemplate::node_client("n1");
        let (csr, key) = template.generate().unwrap();
        let short = api.sign(&csr, Duration::from_secs(2));
        let store = PemStore::new(dir.clone(), "kubelet-client");
        let current = store
            .update(short.into_bytes(), &key.serialize_pem())
            .await
            .unwrap();
        let rotation = Rotation {
            api,
            template,
            store: store.clone(),
            wait: Duration::from_secs(5),
            end_when_expired: Some(EXIT_AFTER_EXPIRY),
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let started = std::time::Instant::now();
        let task = tokio::spawn(rotation.run(
            Some(current.clone()),
            move |cert| {
                let _ = tx.send(cert);
            },
            cancel.clone(),
        ));
        let renewed = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("renewed before the old one ended")
            .unwrap();
        let after = started.elapsed();
        assert!(after >= Duration::from_millis(300), "{after:?}");
        assert!(after < Duration::from_secs(4), "{after:?}");
        assert!(renewed.info.not_after > current.info.not_after);
        assert_eq!(store.load_current().await.unwrap().info, renewed.info);
        let silent = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await;
        assert!(
            silent.is_err(),
            "no second renewal for an hour-long certificate"
        );
        cancel.cancel();
        task.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn refused(code: u16) -> CertificateError {
        CertificateError::Csr(CsrError::Create(kube::Error::Api(
            kube::core::Status::failure("refused", "Refused")
                .with_code(code)
                .boxed(),
        )))
    }

    /// client-go's judgement of the server, from the CSR creation only.
    #[test]
    fn the_server_is_healthy_when_it_refuses_the_csr_creation_with_401_403_or_404() {
        for (code, healthy) in [
            (401, true),
            (403, true),
            (404, true),
            (500, false),
            (503, false),
        ] {
            assert_eq!(server_health(&refused(code)), Some(healthy), "{code}");
        }
        let not_issued = CertificateError::Csr(CsrError::NotIssued {
            name: "csr-0".into(),
            waited: Duration::ZERO,
        });
        assert_eq!(server_health(&not_issued), None, "the judgement stands");
    }

    /// The kubelet's exit on its client certificate: only once none has been valid for
    /// the grace period, only with a healthy server, never for the serving certificate.
    #[tokio::test]
    async fn an_expired_certificate_ends_the_rotation_after_the_grace_with_a_healthy_server() {
        let dir = std::env::temp_dir().join(format!("rkubelet-expired-{}", std::process::id()));
        let api = FakeCsrApi::new(Verdict::Refuse(401));
        let template = CsrTemplate::node_client("n1");
        let store = PemStore::new(dir.clone(), "kubelet-client");
        let issue = |lifetime| {
            let (csr, key) = template.generate().unwrap();
            (api.sign(&csr, lifetime), key.serialize_pem())
        };
        let (pem, key) = issue(Duration::from_secs(3600));
        let valid = store.update(pem.into_bytes(), &key).await.unwrap();
        let (pem, key) = issue(Duration::from_millis(500));
        let expired = store.update(pem.into_bytes(), &key).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let rotation = |end_when_expired| Rotation {
            api: FakeCsrApi::new(Verdict::Refuse(401)),
            template: template.clone(),
            store: store.clone(),
            wait: Duration::from_secs(5),
            end_when_expired,
        };
        let client = rotation(Some(Duration::ZERO));
        assert!(
            client.expiry_check(Some(&valid), true).is_ok(),
            "still valid"
        );
        assert!(
            client.expiry_check(Some(&expired), false).is_ok(),
            "no exit while the server does not answer"
        );
        assert!(matches!(
            client.expiry_check(Some(&expired), true),
            Err(CertificateError::Expired { .. })
        ));
        assert!(
            rotation(Some(EXIT_AFTER_EXPIRY))
                .expiry_check(Some(&expired), true)
                .is_ok(),
            "within the kubelet's five minutes"
        );
        assert!(rotation(None).expiry_check(Some(&expired), true).is_ok());

        // The loop: the refused renewal (401) of the expired certificate ends it.
        let ended = tokio::time::timeout(
            Duration::from_secs(5),
            client.run(Some(expired.clone()), |_| {}, CancellationToken::new()),
        )
        .await
        .expect("ends at the first refused renewal");
        match ended {
            Err(CertificateError::Expired { not_after, .. }) => {
                assert_eq!(not_after, expired.info.not_after);
            }
            other => panic!("{other:?}"),
        }
        // A 503 is no healthy server: the loop goes on retrying.
        let unanswered = Rotation {
            api: FakeCsrApi::new(Verdict::Refuse(503)),
            ..rotation(Some(Duration::ZERO))
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(unanswered.run(Some(expired), |_| {}, cancel.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !task.is_finished(),
            "retrying while the server does not answer"
        );
        cancel.cancel();
        task.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_denied_csr_says_so_and_an_unanswered_one_times_out() {
        let template = CsrTemplate::node_client("n1");
        let (pem, key) = template.generate().unwrap();
        let request = template.object(Some("node-csr-x".into()), pem);
        let denied = request_certificate(
            &FakeCsrApi::new(Verdict::Deny),
            &request,
            &key,
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
        assert_eq!(
            denied.to_string(),
            "certificate signing request node-csr-x is denied, reason: AutoDenied, message: Denied by the test"
        );
        let ignored = request_certificate(
            &FakeCsrApi::new(Verdict::Ignore),
            &request,
            &key,
            Duration::from_millis(10),
        )
        .await
        .unwrap_err();
        assert!(matches!(ignored, CsrError::NotIssued { .. }), "{ignored}");
    }

    /// A CSR of the same name is reused when it asks for the same key, signer and usages,
    /// and refused otherwise.
    #[tokio::test]
    async fn an_existing_csr_is_reused_only_for_the_same_request() {
        let api = FakeCsrApi::new(Verdict::Sign(Duration::from_secs(3600)));
        let template = CsrTemplate::node_client("n1");
        let (pem, key) = template.generate().unwrap();
        let request = template.object(Some(template.digested_name(&key)), pem);
        api.create(&request).await.unwrap();
        // A CSR signed again for the same key (ECDSA signatures differ each time).
        let again = template.object(
            request.metadata.name.clone(),
            template.request(&key).unwrap(),
        );
        let cert = request_certificate(&api, &again, &key, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!cert.is_empty());
        assert_eq!(api.created.lock().unwrap().len(), 1, "no second CSR");
        let other = new_key().unwrap();
        let err = request_certificate(&api, &again, &other, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CsrError::Incompatible { reason, .. } if reason.contains("public key")),
            "{err}"
        );
        let mut client_usage = again.clone();
        client_usage.spec.usages = Some(vec!["client auth".into()]);
        let err = request_certificate(&api, &client_usage, &key, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, CsrError::Incompatible { .. }), "{err}");
    }

    /// Reads and watches that fail (the API server going away) are retried; the watch
    /// brings the approval.
    #[tokio::test]
    async fn failed_reads_and_watches_do_not_end_the_wait() {
        use std::sync::atomic::Ordering::SeqCst;
        let api = std::sync::Arc::new(FakeCsrApi::new(Verdict::Manual(Duration::from_secs(3600))));
        api.failing.store(2, SeqCst);
        let template = CsrTemplate::node_client("n1");
        let (pem, key) = template.generate().unwrap();
        let request = template.object(None, pem);
        let waiting = {
            let api = api.clone();
            tokio::spawn(async move {
                request_certificate(&*api, &request, &key, Duration::from_secs(30)).await
            })
        };
        // Two failed reads, then a read and a watch that waits.
        tokio::time::timeout(Duration::from_secs(10), async {
            while api.calls.load(SeqCst) < 4 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("read and watched again after the failures");
        assert!(!waiting.is_finished(), "still waiting");
        api.approve();
        let cert = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the watch brings the certificate")
            .unwrap()
            .unwrap();
        assert!(!cert.is_empty());
        assert_eq!(api.calls.load(SeqCst), 4, "no read after the watch");
    }

    /// A deleted or replaced CSR ends the wait.
    #[test]
    fn a_replaced_csr_ends_the_wait() {
        let template = CsrTemplate::node_client("n1");
        let (pem, _) = template.generate().unwrap();
        let mut csr = template.object(Some("node-csr-x".into()), pem);
        csr.metadata.uid = Some("b".into());
        assert!(matches!(
            issued(csr.clone(), Some("a")),
            Err(CsrError::Replaced { .. })
        ));
        assert!(matches!(issued(csr, Some("b")), Ok(None)));
    }

    #[tokio::test]
    async fn an_update_writes_a_private_pem_and_points_current_at_it() {
        let dir = std::env::temp_dir().join(format!("rkubelet-pemstore-{}", std::process::id()));
        let store = PemStore::new(dir.clone(), "kubelet-client");
        assert!(store.load_current().await.is_none());
        let (csr, key) = CsrTemplate::node_client("n1").generate().unwrap();
        let ca = FakeCsrApi::new(Verdict::Ignore);
        let cert = ca.sign(&csr, Duration::from_secs(3600));
        let stored = store
            .update(cert.into_bytes(), &key.serialize_pem())
            .await
            .unwrap();
        assert_eq!(stored.info.common_name.as_deref(), Some("system:node:n1"));
        let target = std::fs::read_link(dir.join("kubelet-client-current.pem")).unwrap();
        let name = target.to_str().unwrap();
        assert!(
            name.starts_with("kubelet-client-2") && name.ends_with(".pem"),
            "{name}"
        );
        let mode = std::fs::metadata(dir.join(name)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| atomic_file::is_temp_name(&e.file_name().to_string_lossy()))
            .collect();
        assert!(leftovers.is_empty(), "written through a renamed temporary");
        let loaded = store.load_current().await.unwrap();
        assert_eq!(loaded.info, stored.info);
        // An expired certificate is not current.
        let (csr, key) = CsrTemplate::node_client("n1").generate().unwrap();
        let expired = ca.sign(&csr, Duration::ZERO);
        let _ = store
            .update(expired.into_bytes(), &key.serialize_pem())
            .await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(store.load_current().await.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
