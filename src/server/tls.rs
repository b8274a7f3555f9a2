//! TLS of the kubelet API: the serving certificate (from files, self-signed, or rotated
//! through the certificates API, swapped in place without a restart), and client
//! certificates verified against `--client-ca-file` when a client presents one. A client
//! without a certificate still connects: it may authenticate with a bearer token, or is
//! refused with 401 by the server.

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::tls::{ServingCertificate, TlsError, provider};

/// The serving certificate in use, replaced in place on rotation. Until one is set, TLS
/// handshakes fail (as the kubelet's do while it waits for its first certificate).
#[derive(Debug, Default)]
pub struct CertStore {
    current: RwLock<Option<ServingCertificate>>,
    without_sni: RwLock<Option<ServingCertificate>>,
}

impl CertStore {
    /// Serves `cert` from the next handshake on.
    pub fn set(&self, cert: ServingCertificate) {
        *crate::lock::write(&self.current) = Some(cert);
    }

    /// Serves `cert` to clients that send no server name (connect by IP), as Go's TLS
    /// serves its static certificate beside a `GetCertificate` callback.
    pub fn set_without_sni(&self, cert: ServingCertificate) {
        *crate::lock::write(&self.without_sni) = Some(cert);
    }

    /// The certificate for a client that sent no server name, if one is set apart.
    fn for_no_sni(&self) -> Option<ServingCertificate> {
        crate::lock::read(&self.without_sni).clone()
    }

    /// The certificate served now.
    #[must_use]
    pub fn current(&self) -> Option<ServingCertificate> {
        crate::lock::read(&self.current).clone()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = hello
            .server_name()
            .is_none()
            .then(|| self.for_no_sni())
            .flatten()
            .or_else(|| self.current())
            .map(|c| c.key);
        if current.is_none() {
            tracing::debug!("TLS handshake refused: no serving certificate yet");
        }
        current
    }
}

/// The server's TLS configuration: certificates from `store`, client certificates verified
/// against `client_ca` when given (and optional: token clients have none).
///
/// # Errors
/// An unreadable or empty client CA bundle.
pub fn server_config(
    store: Arc<CertStore>,
    client_ca: Option<&Path>,
) -> Result<rustls::ServerConfig, TlsError> {
    let provider = provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(path) => {
            let ca_err = |reason: String| TlsError::ClientCa {
                path: path.to_owned(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|e| ca_err(e.to_string()))?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                roots
                    .add(cert.map_err(|e| ca_err(e.to_string()))?)
                    .map_err(|e| ca_err(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(ca_err("no CERTIFICATE block".into()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| ca_err(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Ok(builder.with_cert_resolver(store))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{serving_certificate, testing};

    #[test]
    fn reads_a_chain_and_key_and_serves_it_once_set() {
        let (ca, cert, key) = testing::ca_and_leaf("n1", &["system:nodes"]);
        let serving = serving_certificate(cert.as_bytes(), key.as_bytes(), Path::new("x")).unwrap();
        assert_eq!(serving.info.common_name.as_deref(), Some("n1"));
        let store = Arc::new(CertStore::default());
        assert!(store.current().is_none());
        store.set(serving);
        assert!(store.current().is_some());

        let dir = std::env::temp_dir().join(format!("rkubelet-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, ca).unwrap();
        assert!(server_config(store.clone(), Some(&ca_path)).is_ok());
        assert!(server_config(store, None).is_ok());
        std::fs::write(&ca_path, "nothing").unwrap();
        let empty = server_config(Arc::new(CertStore::default()), Some(&ca_path));
        assert!(matches!(empty, Err(TlsError::ClientCa { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `--rotate-server-certificates` with `--tls-cert-file`, as Go's TLS serves the
    /// kubelet: a client that names the server (SNI) gets the rotated certificate, one that
    /// connects by IP (no SNI) the file's.
    #[test]
    fn clients_by_ip_get_the_files_certificate_and_clients_by_name_the_rotated_one() {
        let (file_ca, file_cert, file_key) = testing::ca_and_leaf("from-file", &[]);
        let (rotated_ca, rotated_cert, rotated_key) = testing::ca_and_leaf("rotated", &[]);
        let parse = |cert: &str, key: &str| {
            serving_certificate(cert.as_bytes(), key.as_bytes(), Path::new("x")).unwrap()
        };
        let store = Arc::new(CertStore::default());
        store.set_without_sni(parse(&file_cert, &file_key));
        store.set(parse(&rotated_cert, &rotated_key));
        let server = Arc::new(server_config(store, None).unwrap());
        let mut roots = rustls::RootCertStore::empty();
        for ca in [&file_ca, &rotated_ca] {
            roots
                .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
                .unwrap();
        }
        let client = Arc::new(
            rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        let served = |name: &str| {
            let name = rustls_pki_types::ServerName::try_from(name.to_owned()).unwrap();
            let mut c = rustls::ClientConnection::new(client.clone(), name).unwrap();
            let mut s = rustls::ServerConnection::new(server.clone()).unwrap();
            for _ in 0..10 {
                if !c.is_handshaking() && !s.is_handshaking() {
                    break;
                }
                let mut bytes = Vec::new();
                c.write_tls(&mut bytes).unwrap();
                s.read_tls(&mut bytes.as_slice()).unwrap();
                s.process_new_packets().unwrap();
                bytes.clear();
                s.write_tls(&mut bytes).unwrap();
                c.read_tls(&mut bytes.as_slice()).unwrap();
                c.process_new_packets().unwrap();
            }
            c.peer_certificates().unwrap()[0].clone()
        };
        let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert_eq!(served("127.0.0.1"), der(&file_cert), "by IP: the file's");
        assert_eq!(
            served("localhost"),
            der(&rotated_cert),
            "by name: the rotated one"
        );
    }

    #[test]
    fn a_pem_without_a_key_is_refused_with_its_path() {
        let (_, cert, _) = testing::ca_and_leaf("n1", &[]);
        let err =
            serving_certificate(cert.as_bytes(), cert.as_bytes(), Path::new("/x.pem")).unwrap_err();
        assert!(err.to_string().starts_with("/x.pem"), "{err}");
    }
}
