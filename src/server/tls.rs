//! TLS of the kubelet API: the serving certificate (from files, self-signed, or rotated
//! through the certificates API, swapped in place without a restart), and client
//! certificates verified against `--client-ca-file` when a client presents one. A client
//! without a certificate still connects: it may authenticate with a bearer token, or is
//! refused with 401 by the server.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::x509::{self, CertificateInfo};

/// TLS set-up failures.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key cannot sign with any algorithm rustls knows.
    #[error("private key: {0}")]
    Key(rustls::Error),
    /// The certificate cannot be read.
    #[error(transparent)]
    Certificate(#[from] x509::X509Error),
    /// The client CA bundle is unusable.
    #[error("client CA {path}: {reason}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The crypto provider of the server (ring, as for the API client).
#[must_use]
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain with its key, and what the server needs to know of the leaf.
#[derive(Debug, Clone)]
pub struct ServingCertificate {
    /// The chain and signing key, as rustls serves it.
    pub key: Arc<CertifiedKey>,
    /// The leaf's subject and validity.
    pub info: CertificateInfo,
}

/// Reads a certificate chain and its private key from PEM text (the same text may hold
/// both, as the kubelet's `kubelet-server-current.pem` does).
///
/// # Errors
/// No certificate, no key, or a key rustls cannot use.
pub fn serving_certificate(
    cert_pem: &[u8],
    key_pem: &[u8],
    origin: &Path,
) -> Result<ServingCertificate, TlsError> {
    let pem_err = |reason: String| TlsError::Pem {
        path: origin.to_owned(),
        reason,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| pem_err(e.to_string()))?;
    let leaf = chain
        .first()
        .ok_or_else(|| pem_err("no CERTIFICATE block".into()))?;
    let info = x509::parse(leaf)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| pem_err(e.to_string()))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(TlsError::Key)?;
    Ok(ServingCertificate {
        key: Arc::new(CertifiedKey::new(chain, signer)),
        info,
    })
}

/// Reads `--tls-cert-file` and `--tls-private-key-file`.
///
/// # Errors
/// Unreadable files, or see [`serving_certificate`].
pub fn load_files(cert: &Path, key: &Path) -> Result<ServingCertificate, TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|e| TlsError::Pem {
            path: p.to_owned(),
            reason: e.to_string(),
        })
    };
    serving_certificate(&read(cert)?, &read(key)?, cert)
}

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
pub(crate) mod testing {
    //! Certificates for unit tests.

    /// A CA, and a leaf signed by it: `(ca_pem, leaf_cert_pem, leaf_key_pem)`.
    pub fn ca_and_leaf(cn: &str, orgs: &[&str]) -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "test-ca");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut leaf =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap();
        leaf.distinguished_name = rcgen::DistinguishedName::new();
        for o in orgs {
            leaf.distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        leaf.distinguished_name.push(rcgen::DnType::CommonName, cn);
        leaf.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        (ca_cert.pem(), cert.pem(), key.serialize_pem())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
