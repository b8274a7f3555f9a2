//! The node's TLS vocabulary, below everything that speaks TLS: the crypto provider
//! (ring, for the server, the API client, probes and the image registry client), a
//! certificate chain with its key ([`ServingCertificate`], read from PEM), the few X.509
//! fields the agent reads ([`x509`]), and the API client's identity that follows the
//! current client certificate ([`transport`]). It must not know the certificates API, the
//! kubelet API server or any caller.

pub mod transport;
pub mod x509;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use x509::CertificateInfo;

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
