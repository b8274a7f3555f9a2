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
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use super::tls::CertStore;
pub use crate::certificate::CertificateError;
use crate::certificate::csr::{CsrTemplate, Rotation, node_subject};
use crate::certificate::io_err;
use crate::certificate::store::{PemStore, write_private};
use crate::tls::{self, ServingCertificate};

/// The signer of kubelet serving certificates.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The prefix of the rotated serving certificate files.
const PREFIX: &str = "kubelet-server";
/// How long one CSR is waited for before a new one is made.
const WAIT_FOR_APPROVAL: Duration = Duration::from_secs(15 * 60);

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
        params.distinguished_name = node_subject(&self.name);
        Ok(params)
    }

    /// What the serving certificate is requested as: subject `system:node:<name>` in
    /// `system:nodes`, the node's name and IPs as SANs.
    ///
    /// # Errors
    /// A name that is no valid SAN.
    pub fn template(&self) -> Result<CsrTemplate, rcgen::Error> {
        Ok(CsrTemplate {
            signer: KUBELET_SERVING_SIGNER,
            usages: &["digital signature", "key encipherment", "server auth"],
            params: self.params()?,
        })
    }
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
    crate::atomic_file::write(&cert_path, cert.pem().as_bytes(), 0o644)?;
    tracing::info!(cert = %cert_path.display(), "made a self-signed serving certificate");
    Ok(tls::load_files(&cert_path, &key_path)?)
}

/// Requests, stores and renews the serving certificate through the certificates API.
pub struct CertificateManager {
    rotation: Rotation<Api<CertificateSigningRequest>>,
    store: Arc<CertStore>,
}

impl CertificateManager {
    /// A manager that keeps `store` served with a certificate for `node`.
    ///
    /// # Errors
    /// The node's name or IPs make no valid certificate request.
    pub fn new(
        client: kube::Client,
        node: &NodeIdentity,
        cert_dir: std::path::PathBuf,
        store: Arc<CertStore>,
    ) -> Result<Self, CertificateError> {
        Ok(Self {
            rotation: Rotation {
                api: Api::all(client),
                template: node.template()?,
                store: PemStore::new(cert_dir, PREFIX),
                wait: WAIT_FOR_APPROVAL,
                end_when_expired: None,
            },
            store,
        })
    }

    /// Keeps the certificate fresh until `cancel` fires: serves the stored one if still
    /// valid, renews at the rotation deadline, retries failures.
    pub async fn run(self, cancel: CancellationToken) {
        let current = self.rotation.store.load_current().await;
        if let Some(cert) = &current {
            self.store.set(cert.clone());
        }
        let store = self.store;
        if let Err(e) = self
            .rotation
            .run(current, move |cert| store.set(cert), cancel)
            .await
        {
            tracing::error!(error = %e, "serving certificate rotation ended");
        }
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
    fn the_serving_csr_names_the_node_and_its_addresses() {
        let template = node().template().unwrap();
        let (csr, _key) = template.generate().unwrap();
        // The subject and SANs are inside the DER verbatim.
        let der: Vec<u8> = rustls_pki_types::pem::PemObject::from_pem_slice(csr.as_bytes())
            .map(|d: rustls_pki_types::CertificateSigningRequestDer<'_>| d.as_ref().to_vec())
            .unwrap();
        let contains = |needle: &[u8]| der.windows(needle.len()).any(|w| w == needle);
        assert!(contains(b"system:node:n1"));
        assert!(contains(b"system:nodes"));
        assert!(contains(&[198, 18, 0, 1]), "the IP SAN");
        let object = template.object(None, csr);
        assert_eq!(object.spec.signer_name, KUBELET_SERVING_SIGNER);
        assert_eq!(
            object.spec.usages.unwrap(),
            ["digital signature", "key encipherment", "server auth"]
        );
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
