//! The certificate files under `--cert-dir`, as the kubelet's file store: each issued
//! certificate with its key in `<prefix>-<time>.pem` (mode 0600), and the
//! `<prefix>-current.pem` symlink naming the one in use (replaced atomically).

use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;

use super::{CertificateError, blocking, io_err};
use crate::server::tls::{self, ServingCertificate};

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

    /// The current certificate, if there is one and it has not expired.
    pub async fn load_current(&self) -> Option<ServingCertificate> {
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
        let dir = self.dir.clone();
        let stamp = Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
        let file = format!("{}-{stamp}.pem", self.prefix);
        blocking(&self.dir, move || {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            write_private(&dir.join(&file), &pem)?;
            let tmp = dir.join(format!(".{file}.link"));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&file, &tmp).map_err(io_err(&tmp))?;
            std::fs::rename(&tmp, &link).map_err(io_err(&link))
        })
        .await?;
        Ok(cert)
    }
}

/// Writes `data` to `path`, readable by the owner only, atomically: a new temporary file
/// beside it is written, synced and renamed over `path`, then the directory is synced, so
/// a crash or a reader never sees half a key or kubeconfig. (The kubelet writes these
/// files in place; rkubelet is stricter.)
///
/// # Errors
/// The file cannot be written; the temporary file is removed then.
pub fn write_private(path: &Path, data: &[u8]) -> Result<(), CertificateError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    // A temporary file left by an earlier process of the same PID (PID 1 in a container)
    // is not reused: `create_new` never follows or opens what is there.
    if let Err(e) = std::fs::remove_file(&tmp)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(io_err(&tmp)(e));
    }
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(data)?;
            f.sync_all()
        })
        .map_err(io_err(&tmp))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(io_err(path)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    dir.map_or(Ok(()), |dir| {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(dir))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificate::csr::CsrTemplate;
    use crate::certificate::csr::testing::{FakeCsrApi, Verdict};
    use std::time::Duration;

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
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
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
