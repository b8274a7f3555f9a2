//! The certificates API flow, as client-go's `util/certificate/csr` and the kubelet's
//! certificate manager: a new ECDSA P-256 key and a CSR for a signer, created through a
//! [`CsrApi`], waited on until issued (or denied, failed, timed out), and renewed at a
//! jittered 70–90 % of the certificate's lifetime.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

use super::CertificateError;
use super::store::PemStore;
use crate::backoff::random_fraction;
use crate::server::tls::ServingCertificate;

/// How often a CSR is read again while it waits for its certificate.
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
}

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
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let csr = self.params.serialize_request(&key)?.pem()?;
        Ok((csr, key))
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

/// Creates `request` and waits up to `timeout` for its certificate (PEM).
///
/// # Errors
/// The API failed, the CSR was denied or failed, or it was not signed in time.
pub async fn request_certificate<A: CsrApi>(
    api: &A,
    request: &CertificateSigningRequest,
    timeout: Duration,
) -> Result<Vec<u8>, CsrError> {
    let created = api.create(request).await.map_err(CsrError::Create)?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, signer = %request.spec.signer_name, "certificate signing request created; waiting for it to be approved and signed");
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let csr = api.get(&name).await?;
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
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            tracing::info!(csr = %name, "certificate signing request is approved and signed");
            return Ok(cert.0);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CsrError::NotIssued {
                name,
                waited: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
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
        self.request(false).await
    }

    /// As [`Self::renew`], the CSR named after its key as the kubelet's bootstrap names
    /// it ([`CsrTemplate::digested_name`]).
    ///
    /// # Errors
    /// See [`Self::renew`].
    pub async fn renew_digested(&self) -> Result<ServingCertificate, CertificateError> {
        self.request(true).await
    }

    async fn request(&self, digested: bool) -> Result<ServingCertificate, CertificateError> {
        let (csr, key) = self.template.generate()?;
        let name = digested.then(|| self.template.digested_name(&key));
        let request = self.template.object(name, csr);
        let issued = request_certificate(&self.api, &request, self.wait).await?;
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
        loop {
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
            }
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
            if csr.metadata.name.is_none() {
                csr.metadata.name = Some(format!("csr-{}", created.len()));
            }
            created.push(csr.clone());
            Ok(csr)
        }

        async fn get(&self, name: &str) -> Result<CertificateSigningRequest, kube::Error> {
            let mut csr = self
                .created
                .lock()
                .unwrap()
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
                .cloned()
                .unwrap();
            let condition = |type_: &str| CertificateSigningRequestCondition {
                type_: type_.into(),
                status: "True".into(),
                reason: Some(format!("Auto{type_}")),
                message: Some(format!("{type_} by the test")),
                ..CertificateSigningRequestCondition::default()
            };
            csr.status = Some(match self.verdict {
                Verdict::Sign(lifetime) => CertificateSigningRequestStatus {
                    conditions: Some(vec![condition("Approved")]),
                    certificate: Some(ByteString(
                        self.sign(std::str::from_utf8(&csr.spec.request.0).unwrap(), lifetime)
                            .into_bytes(),
                    )),
                },
                Verdict::Deny => CertificateSigningRequestStatus {
                    conditions: Some(vec![condition("Denied")]),
                    certificate: None,
                },
                Verdict::Ignore | Verdict::Refuse(_) => CertificateSigningRequestStatus::default(),
            });
            Ok(csr)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{FakeCsrApi, Verdict};
    use super::*;

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
        let (pem, _) = template.generate().unwrap();
        let request = template.object(Some("node-csr-x".into()), pem);
        let denied = request_certificate(
            &FakeCsrApi::new(Verdict::Deny),
            &request,
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
            Duration::from_millis(10),
        )
        .await
        .unwrap_err();
        assert!(matches!(ignored, CsrError::NotIssued { .. }), "{ignored}");
    }
}
