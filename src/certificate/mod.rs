//! The node's certificates from the certificates API, as the kubelet's
//! `pkg/kubelet/certificate`: the CSR flow and the rotation deadline shared by the client
//! and serving certificates ([`csr`]), the certificate files under `--cert-dir`
//! ([`store`]), the TLS bootstrap of the client certificate with a bootstrap kubeconfig
//! ([`bootstrap`]), and its rotation with a client TLS identity that follows the current
//! certificate and closes the connections made with the old one
//! ([`crate::tls::transport`], below the API client).
//!
//! Knows no kubelet API server and no TLS handshake: it obtains and stores certificates;
//! [`crate::tls`] presents them and [`crate::server`] serves with them.

use std::path::{Path, PathBuf};

pub mod bootstrap;
pub mod csr;
pub mod store;

/// Certificate failures.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// The key or CSR could not be made.
    #[error("making the key or CSR: {0}")]
    Generate(#[from] rcgen::Error),
    /// The certificate could not be obtained through the certificates API.
    #[error(transparent)]
    Csr(#[from] csr::CsrError),
    /// A key, certificate or kubeconfig file cannot be written.
    #[error(transparent)]
    File(#[from] crate::atomic_file::FileError),
    /// The issued or stored certificate is unusable.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// A kubeconfig cannot be read, used or written.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The client certificate expired and the API server refuses it: the agent ends, as
    /// the kubelet does, so that a restart bootstraps a new one.
    #[error(
        "It has been {after:?} since a valid client cert was found and the server is responsive, exiting. (it expired at {not_after})"
    )]
    Expired {
        /// How long the agent went on without one.
        after: std::time::Duration,
        /// When it expired.
        not_after: k8s_openapi::jiff::Timestamp,
    },
    /// A file under the cert dir could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Maps an I/O error on `path` to [`CertificateError::Io`].
pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CertificateError + '_ {
    move |source| CertificateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Runs file-system work `f` on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &Path,
    f: impl FnOnce() -> Result<T, CertificateError> + Send + 'static,
) -> Result<T, CertificateError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CertificateError::Io {
            path: what.to_owned(),
            source: std::io::Error::other(e),
        })?
}
