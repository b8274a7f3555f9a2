//! The serving certificate when no `--tls-cert-file` is given, like the kubelet's:
//!
//! - with `--rotate-server-certificates`, requested from the cluster through the
//!   certificates API (signer `kubernetes.io/kubelet-serving`, subject
//!   `system:node:<name>` in `system:nodes`, the node's name and IP as SANs). Someone
//!   approves it (an admin, or an approver controller); the issued certificate is kept in
//!   `<cert-dir>/kubelet-server-current.pem` (certificate and key) and renewed at a
//!   jittered 70–90 % of its lifetime, swapped into the running server;
//! - otherwise a self-signed certificate in `<cert-dir>/kubelet.crt` and `kubelet.key`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

use super::tls::{self, CertStore, ServingCertificate, TlsError};
use crate::backoff::random_fraction;

/// The signer of kubelet serving certificates.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The file holding the current rotated certificate and key.
pub const CURRENT_PEM: &str = "kubelet-server-current.pem";
/// How often the CSR is polled for its certificate.
const POLL: Duration = Duration::from_secs(1);
/// How long one CSR is waited for before a new one is made.
const WAIT_FOR_APPROVAL: Duration = Duration::from_secs(15 * 60);
/// Retry delay after a failed request.
const RETRY: Duration = Duration::from_secs(10);

/// Certificate failures.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// The key or CSR could not be made.
    #[error("making the key or CSR: {0}")]
    Generate(#[from] rcgen::Error),
    /// A certificates API call failed.
    #[error("certificates API: {0}")]
    Api(#[from] kube::Error),
    /// The CSR was denied or failed.
    #[error("certificate signing request {name} {condition}: {message}")]
    Refused {
        /// The CSR's name.
        name: String,
        /// `Denied` or `Failed`.
        condition: String,
        /// Its message.
        message: String,
    },
    /// Nobody approved the CSR in time.
    #[error("certificate signing request {0} was not issued within {WAIT_FOR_APPROVAL:?}")]
    NotIssued(String),
    /// The issued or stored certificate is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A file under the cert dir could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CertificateError + '_ {
    move |source| CertificateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The node a serving certificate is for.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    /// The node's name: the subject `system:node:<name>` and a DNS SAN.
    pub name: String,
    /// The node's IPs: IP SANs.
    pub ips: Vec<IpAddr>,
}

impl NodeIdentity {
    fn params(&self) -> Result<rcgen::CertificateParams, rcgen::Error> {
        let sans: Vec<String> = std::iter::once(self.name.clone())
            .chain(self.ips.iter().map(ToString::to_string))
            .collect();
        let mut params = rcgen::CertificateParams::new(sans)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("system:node:{}", self.name),
        );
        Ok(params)
    }

    /// A new ECDSA P-256 key and a PEM CSR for it.
    ///
    /// # Errors
    /// Key generation or signing failed.
    pub fn csr(&self) -> Result<(String, rcgen::KeyPair), rcgen::Error> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let csr = self.params()?.serialize_request(&key)?.pem()?;
        Ok((csr, key))
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

/// The self-signed serving certificate in `cert_dir` (`kubelet.crt`, `kubelet.key`), made
/// on first use.
///
/// # Errors
/// Files that cannot be read or written, or an unusable certificate.
pub fn self_signed(
    cert_dir: &Path,
    node: &NodeIdentity,
) -> Result<ServingCertificate, CertificateError> {
    let cert_path = cert_dir.join("kubelet.crt");
    let key_path = cert_dir.join("kubelet.key");
    if cert_path.exists() && key_path.exists() {
        return Ok(tls::load_files(&cert_path, &key_path)?);
    }
    std::fs::create_dir_all(cert_dir).map_err(io_err(cert_dir))?;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = node.params()?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("{}@{}", node.name, Timestamp::now().as_second()),
    );
    let now = rcgen::date_time_ymd(2000, 1, 1);
    params.not_before = now;
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    let cert = params.self_signed(&key)?;
    write_private(&key_path, key.serialize_pem().as_bytes())?;
    std::fs::write(&cert_path, cert.pem()).map_err(io_err(&cert_path))?;
    tracing::info!(cert = %cert_path.display(), "made a self-signed serving certificate");
    Ok(tls::load_files(&cert_path, &key_path)?)
}

fn write_private(path: &Path, data: &[u8]) -> Result<(), CertificateError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(data).map_err(io_err(path))
}

/// Requests, stores and renews the serving certificate through the certificates API.
#[derive(Clone)]
pub struct CertificateManager {
    api: Api<CertificateSigningRequest>,
    node: NodeIdentity,
    cert_dir: PathBuf,
    store: Arc<CertStore>,
}

impl CertificateManager {
    /// A manager that keeps `store` served with a certificate for `node`.
    #[must_use]
    pub fn new(
        client: kube::Client,
        node: NodeIdentity,
        cert_dir: PathBuf,
        store: Arc<CertStore>,
    ) -> Self {
        Self {
            api: Api::all(client),
            node,
            cert_dir,
            store,
        }
    }

    /// Loads the stored certificate into the store if it is still valid.
    pub async fn load_current(&self) -> Option<ServingCertificate> {
        let path = self.cert_dir.join(CURRENT_PEM);
        let pem = tokio::fs::read(&path).await.ok()?;
        match tls::serving_certificate(&pem, &pem, &path) {
            Ok(cert) if cert.info.not_after > Timestamp::now() => {
                self.store.set(cert.clone());
                tracing::info!(cert = %path.display(), not_after = %cert.info.not_after, "serving certificate loaded");
                Some(cert)
            }
            Ok(_) => {
                tracing::info!(cert = %path.display(), "stored serving certificate expired");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "stored serving certificate unusable");
                None
            }
        }
    }

    /// Keeps the certificate fresh until `cancel` fires: renews at the rotation deadline,
    /// retries failures.
    pub async fn run(self, cancel: CancellationToken) {
        let mut current = self.load_current().await;
        loop {
            let wait = current.as_ref().map_or(Duration::ZERO, |c| {
                let deadline =
                    rotation_deadline(c.info.not_before, c.info.not_after, random_fraction());
                Duration::try_from(deadline.duration_since(Timestamp::now())).unwrap_or_default()
            });
            if !wait.is_zero() {
                tracing::info!(renew_in = ?wait, "serving certificate rotation scheduled");
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let renewed = tokio::select! {
                () = cancel.cancelled() => return,
                r = self.renew() => r,
            };
            match renewed {
                Ok(cert) => {
                    tracing::info!(not_after = %cert.info.not_after, "serving certificate issued and in use");
                    self.store.set(cert.clone());
                    current = Some(cert);
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not renew the serving certificate; retrying");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }

    /// One request: a new key and CSR, wait for the certificate, store both.
    async fn renew(&self) -> Result<ServingCertificate, CertificateError> {
        let (csr, key) = self.node.csr()?;
        let request = CertificateSigningRequest {
            metadata: ObjectMeta {
                generate_name: Some("csr-".into()),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(csr.into_bytes()),
                signer_name: KUBELET_SERVING_SIGNER.into(),
                // All three, as the kubelet sends them: a v1.20 signer wants exactly these.
                usages: Some(vec![
                    "digital signature".into(),
                    "key encipherment".into(),
                    "server auth".into(),
                ]),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        };
        let created = self.api.create(&PostParams::default(), &request).await?;
        let name = created.metadata.name.unwrap_or_default();
        tracing::info!(csr = %name, signer = KUBELET_SERVING_SIGNER, "serving certificate requested; waiting for approval");
        let issued = self.wait_for_certificate(&name).await?;
        let mut pem = issued;
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        pem.extend_from_slice(key.serialize_pem().as_bytes());
        let path = self.cert_dir.join(CURRENT_PEM);
        let cert = tls::serving_certificate(&pem, &pem, &path)?;
        self.store_pem(&pem).await?;
        Ok(cert)
    }

    async fn wait_for_certificate(&self, name: &str) -> Result<Vec<u8>, CertificateError> {
        let deadline = tokio::time::Instant::now() + WAIT_FOR_APPROVAL;
        loop {
            let csr = self.api.get(name).await?;
            let status = csr.status.unwrap_or_default();
            if let Some(refused) = status
                .conditions
                .iter()
                .flatten()
                .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
            {
                return Err(CertificateError::Refused {
                    name: name.to_owned(),
                    condition: refused.type_.clone(),
                    message: refused.message.clone().unwrap_or_default(),
                });
            }
            if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                return Ok(cert.0);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(CertificateError::NotIssued(name.to_owned()));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Writes `kubelet-server-<time>.pem` and points `kubelet-server-current.pem` at it.
    async fn store_pem(&self, pem: &[u8]) -> Result<(), CertificateError> {
        let dir = self.cert_dir.clone();
        let pem = pem.to_vec();
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            let stamp = Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
            let file = format!("kubelet-server-{stamp}.pem");
            let path = dir.join(&file);
            write_private(&path, &pem)?;
            let link = dir.join(CURRENT_PEM);
            let tmp = dir.join(format!(".{CURRENT_PEM}.tmp"));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&file, &tmp).map_err(io_err(&tmp))?;
            std::fs::rename(&tmp, &link).map_err(io_err(&link))
        })
        .await
        .map_err(|e| CertificateError::Io {
            path: self.cert_dir.clone(),
            source: std::io::Error::other(e),
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeIdentity {
        NodeIdentity {
            name: "n1".into(),
            ips: vec!["198.18.0.1".parse().unwrap()],
        }
    }

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

    #[test]
    fn the_csr_names_the_node_in_system_nodes() {
        let (csr, _key) = node().csr().unwrap();
        assert!(
            csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"),
            "{csr}"
        );
        // The subject is inside the DER: both strings appear verbatim.
        let der: Vec<u8> = rustls_pki_types::pem::PemObject::from_pem_slice(csr.as_bytes())
            .map(|d: rustls_pki_types::CertificateSigningRequestDer<'_>| d.as_ref().to_vec())
            .unwrap();
        let contains = |needle: &[u8]| der.windows(needle.len()).any(|w| w == needle);
        assert!(contains(b"system:node:n1"));
        assert!(contains(b"system:nodes"));
        assert!(contains(&[198, 18, 0, 1]), "the IP SAN");
    }

    #[test]
    fn a_self_signed_certificate_is_made_once_and_reused() {
        let dir = std::env::temp_dir().join(format!("rkubelet-selfsigned-{}", std::process::id()));
        let first = self_signed(&dir, &node()).unwrap();
        let second = self_signed(&dir, &node()).unwrap();
        assert_eq!(first.info, second.info);
        assert!(first.info.common_name.unwrap().starts_with("n1@"));
        let mode = std::fs::metadata(dir.join("kubelet.key")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
