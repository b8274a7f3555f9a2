//! The certificate files under `--cert-dir`, as the kubelet's file store: each issued
//! certificate with its key in `<prefix>-<time>.pem` (mode 0600), and the
//! `<prefix>-current.pem` symlink naming the one in use (replaced atomically).

use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;

use super::{CertificateError, blocking, io_err};
use crate::atomic_file;
use crate::tls::{self, ServingCertificate};

/// The store of one kind of certificate (`kubelet-client`, `kubelet-server`).
#[derive(Debug, Clone)]
pub struct PemStore {
    dir: PathBuf,
    prefix: &'static str,
}

impl PemStore {
    /// The store of `prefix` certificates in `dir`.
    #[must_use]
    pub fn new(dir: PathBuf, prefix: &'static str) -> Self {
        Self { dir, prefix }
    }

    /// `<dir>/<prefix>-current.pem`.
    #[must_use]
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    /// The current certificate, if there is one and it has not expired. The store's
    /// temporaries that a crash left are removed first.
    pub async fn load_current(&self) -> Option<ServingCertificate> {
        let (dir, prefix) = (self.dir.clone(), self.prefix);
        if let Err(e) = blocking(&self.dir, move || sweep(&dir, prefix)).await {
            tracing::warn!(error = %e, "could not remove the certificate store's temporaries");
        }
        let path = self.current_path();
        let pem = tokio::fs::read(&path).await.ok()?;
        match tls::serving_certificate(&pem, &pem, &path) {
            Ok(cert) if cert.info.not_after > Timestamp::now() => {
                tracing::info!(cert = %path.display(), not_after = %cert.info.not_after, "certificate loaded");
                Some(cert)
            }
            Ok(cert) => {
                tracing::info!(cert = %path.display(), not_after = %cert.info.not_after, "stored certificate expired");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "stored certificate unusable");
                None
            }
        }
    }

    /// Stores `cert_pem` with `key_pem` as the current certificate.
    ///
    /// # Errors
    /// The pair is unusable, or the files cannot be written.
    pub async fn update(
        &self,
        cert_pem: Vec<u8>,
        key_pem: &str,
    ) -> Result<ServingCertificate, CertificateError> {
        let mut pem = cert_pem;
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        pem.extend_from_slice(key_pem.as_bytes());
        let link = self.current_path();
        let cert = tls::serving_certificate(&pem, &pem, &link)?;
        let (dir, prefix) = (self.dir.clone(), self.prefix);
        let stamp = Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
        let file = format!("{}-{stamp}.pem", self.prefix);
        blocking(&self.dir, move || {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            sweep(&dir, prefix)?;
            write_private(&dir.join(&file), &pem)?;
            Ok(atomic_file::symlink(Path::new(&file), &link)?)
        })
        .await?;
        Ok(cert)
    }
}

/// Writes `data` to `path`, readable by the owner only, atomically (through a temporary
/// file beside it, synced and renamed over `path`, then the directory synced), so a crash
/// or a reader never sees half a key or kubeconfig; the next write of `path` removes a
/// temporary a crash left. (The kubelet writes these files in place; rkubelet is
/// stricter.)
///
/// # Errors
/// The file cannot be written; the temporary file is removed then.
pub fn write_private(path: &Path, data: &[u8]) -> Result<(), CertificateError> {
    Ok(atomic_file::write(path, data, 0o600)?)
}

/// Removes the temporaries of `prefix` files in `dir` that a crash left.
fn sweep(dir: &Path, prefix: &str) -> Result<(), CertificateError> {
    atomic_file::sweep(dir, prefix)?;
    Ok(())
}
