//! TLS bootstrap of the node's client certificate, as the kubelet's
//! `certificate/bootstrap`: when `--kubeconfig` is missing or its client certificate has
//! expired, the bootstrap kubeconfig (a bootstrap token) asks for a certificate through a
//! CSR to `kubernetes.io/kube-apiserver-client-kubelet`, which kube-controller-manager
//! approves and signs; the certificate is stored under `--cert-dir` and `--kubeconfig`
//! written to point at it. Also the client identity rotation starts from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::jiff::Timestamp;
use kube::config::{AuthInfo, Kubeconfig};
use secrecy::ExposeSecret;

use super::csr::{CsrTemplate, Rotation};
use super::store::{PemStore, write_private};
use super::{CertificateError, blocking, io_err};
use crate::server::tls::{self, ServingCertificate};

/// The prefix of the client certificate files in the cert dir.
pub const CLIENT_PREFIX: &str = "kubelet-client";
/// How long the bootstrap CSR is waited for, as the kubelet.
pub const BOOTSTRAP_WAIT: Duration = Duration::from_secs(3600);
/// How long a renewal CSR is waited for before a new one is made.
pub const ROTATION_WAIT: Duration = Duration::from_secs(15 * 60);

/// How the client certificate is obtained and kept.
#[derive(Debug, Clone)]
pub struct ClientCertificateConfig {
    /// `--bootstrap-kubeconfig`.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `--cert-dir`.
    pub cert_dir: PathBuf,
    /// `--rotate-certificates`.
    pub rotate: bool,
}

impl ClientCertificateConfig {
    /// The store of client certificates.
    #[must_use]
    pub fn store(&self) -> PemStore {
        PemStore::new(self.cert_dir.clone(), CLIENT_PREFIX)
    }
}

fn kubeconfig_err(path: &Path, reason: impl ToString) -> CertificateError {
    CertificateError::Kubeconfig {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

/// The user of `kubeconfig`'s current context (else its only user).
fn current_user(kubeconfig: &Kubeconfig) -> Option<&AuthInfo> {
    let user = kubeconfig
        .current_context
        .as_ref()
        .and_then(|name| kubeconfig.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone());
    kubeconfig
        .auth_infos
        .iter()
        .find(|a| user.as_ref().is_none_or(|u| &a.name == u))
        .and_then(|a| a.auth_info.as_ref())
}

/// The client certificate and key (PEM) of a kubeconfig user, from data or files.
fn user_pems(user: &AuthInfo) -> Option<(Vec<u8>, Vec<u8>)> {
    use base64::Engine;
    let decode = |b64: &str| base64::engine::general_purpose::STANDARD.decode(b64).ok();
    let cert = match (&user.client_certificate_data, &user.client_certificate) {
        (Some(data), _) => decode(data)?,
        (None, Some(file)) => std::fs::read(file).ok()?,
        (None, None) => return None,
    };
    let key = match (&user.client_key_data, &user.client_key) {
        (Some(data), _) => decode(data.expose_secret())?,
        (None, Some(file)) => std::fs::read(file).ok()?,
        (None, None) => return None,
    };
    Some((cert, key))
}

/// The client certificate of the kubeconfig at `path`.
fn kubeconfig_certificate(path: &Path) -> Result<ServingCertificate, CertificateError> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| kubeconfig_err(path, e))?;
    let (cert, key) = current_user(&kubeconfig)
        .and_then(user_pems)
        .ok_or_else(|| kubeconfig_err(path, "no client certificate and key"))?;
    Ok(tls::serving_certificate(&cert, &key, path)?)
}

/// Whether `--kubeconfig` exists and holds a client certificate that has not expired.
fn client_config_still_valid(path: &Path, now: Timestamp) -> bool {
    if !path.exists() {
        return false;
    }
    match kubeconfig_certificate(path) {
        Ok(cert) if cert.info.not_after > now => true,
        Ok(cert) => {
            tracing::warn!(kubeconfig = %path.display(), not_after = %cert.info.not_after, "part of the existing bootstrap client certificate is expired");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "unable to load the existing client config");
            false
        }
    }
}

/// The kubeconfig the kubelet writes after bootstrap: the bootstrap kubeconfig's
/// cluster, and the certificate and key in `pem` (one file, the current symlink).
///
/// # Errors
/// The bootstrap kubeconfig has no cluster.
pub fn kubeconfig_from_bootstrap(
    bootstrap: &Kubeconfig,
    pem: &Path,
) -> Result<serde_json::Value, String> {
    let cluster_name = bootstrap
        .current_context
        .as_ref()
        .and_then(|name| bootstrap.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone());
    let cluster = bootstrap
        .clusters
        .iter()
        .find(|c| cluster_name.as_ref().is_none_or(|n| &c.name == n))
        .and_then(|c| c.cluster.as_ref())
        .ok_or("no cluster in the bootstrap kubeconfig")?;
    let cluster = serde_json::to_value(cluster).map_err(|e| e.to_string())?;
    let pem = pem.display().to_string();
    Ok(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": cluster}],
        "users": [{"name": "default-auth", "user": {"client-certificate": pem, "client-key": pem}}],
        "contexts": [{"name": "default-context", "context": {
            "cluster": "default-cluster", "user": "default-auth", "namespace": "default"}}],
        "current-context": "default-context",
    }))
}

/// Makes sure `kubeconfig` holds a valid client certificate, requesting one with the
/// bootstrap kubeconfig if not (as the kubelet's `LoadClientCert`): a valid certificate
/// already in the cert dir is reused, else a CSR is made and waited for.
///
/// # Errors
/// The bootstrap kubeconfig is unusable, the CSR was denied, failed or not signed in
/// time, or the files cannot be written.
pub async fn load_client_cert(
    kubeconfig: &Path,
    bootstrap: &Path,
    config: &ClientCertificateConfig,
    node_name: &str,
) -> Result<(), CertificateError> {
    let path = kubeconfig.to_owned();
    if blocking(kubeconfig, move || {
        Ok(client_config_still_valid(&path, Timestamp::now()))
    })
    .await?
    {
        tracing::info!(kubeconfig = %kubeconfig.display(), "kubeconfig exists and is valid, skipping bootstrap");
        return Ok(());
    }
    tracing::info!(bootstrap = %bootstrap.display(), "using the bootstrap kubeconfig to generate the TLS client certificate, key and kubeconfig file");
    let bootstrap_config =
        Kubeconfig::read_from(bootstrap).map_err(|e| kubeconfig_err(bootstrap, e))?;
    let store = config.store();
    if store.load_current().await.is_none() {
        let rest = kube::Config::from_custom_kubeconfig(
            bootstrap_config.clone(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| kubeconfig_err(bootstrap, e))?;
        let client = crate::kubeclient::build(&rest, crate::kubeclient::REQUEST_TIMEOUT)
            .map_err(|e| kubeconfig_err(bootstrap, e))?;
        let rotation = Rotation {
            api: kube::Api::<CertificateSigningRequest>::all(client),
            template: CsrTemplate::node_client(node_name),
            store: store.clone(),
            wait: BOOTSTRAP_WAIT,
            end_when_expired: None,
        };
        tracing::info!("waiting for the client certificate to be issued");
        rotation.renew_digested().await?;
    }
    let written = kubeconfig_from_bootstrap(&bootstrap_config, &store.current_path())
        .map_err(|e| kubeconfig_err(bootstrap, e))?;
    let text = serde_json::to_vec_pretty(&written).map_err(|e| kubeconfig_err(kubeconfig, e))?;
    let path = kubeconfig.to_owned();
    blocking(kubeconfig, move || {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        write_private(&path, &text)
    })
    .await?;
    tracing::info!(kubeconfig = %kubeconfig.display(), cert = %store.current_path().display(), "client certificate issued; kubeconfig written");
    Ok(())
}

/// The client certificate rotation starts from: the cert dir's current one if valid,
/// else the one `--kubeconfig` names.
///
/// # Errors
/// Neither is usable.
pub async fn current_client_certificate(
    kubeconfig: &Path,
    config: &ClientCertificateConfig,
) -> Result<ServingCertificate, CertificateError> {
    if let Some(cert) = config.store().load_current().await {
        return Ok(cert);
    }
    let path = kubeconfig.to_owned();
    blocking(kubeconfig, move || kubeconfig_certificate(&path)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificate::csr::testing::{FakeCsrApi, Verdict};

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rkubelet-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    const BOOTSTRAP: &str = r"
apiVersion: v1
kind: Config
clusters:
- name: other
  cluster:
    server: https://10.0.0.9:6443
- name: rk
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: Q0E=
users:
- name: tls-bootstrap-token-user
  user:
    token: abcdef.0123456789abcdef
contexts:
- name: boot
  context:
    cluster: rk
    user: tls-bootstrap-token-user
current-context: boot
";

    /// The written kubeconfig names the bootstrap's current cluster and the current pem
    /// as certificate and key; it is valid while the certificate is, and not after.
    #[tokio::test]
    async fn the_written_kubeconfig_points_at_the_current_pem() {
        let dir = temp_dir("bootstrap-kubeconfig");
        let config = ClientCertificateConfig {
            bootstrap_kubeconfig: None,
            cert_dir: dir.join("pki"),
            rotate: false,
        };
        let store = config.store();
        let ca = FakeCsrApi::new(Verdict::Ignore);
        let (csr, key) = CsrTemplate::node_client("n1").generate().unwrap();
        store
            .update(
                ca.sign(&csr, Duration::from_secs(3600)).into_bytes(),
                &key.serialize_pem(),
            )
            .await
            .unwrap();
        let bootstrap = Kubeconfig::from_yaml(BOOTSTRAP).unwrap();
        let written = kubeconfig_from_bootstrap(&bootstrap, &store.current_path()).unwrap();
        let pem = store.current_path().display().to_string();
        assert_eq!(
            written["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:6443"
        );
        assert_eq!(
            written["clusters"][0]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        assert_eq!(
            written["users"][0]["user"]["client-certificate"],
            pem.as_str()
        );
        assert_eq!(written["users"][0]["user"]["client-key"], pem.as_str());
        assert!(written["users"][0]["user"].get("token").is_none());
        let path = dir.join("kubelet.conf");
        std::fs::write(&path, serde_json::to_vec(&written).unwrap()).unwrap();
        assert!(client_config_still_valid(&path, Timestamp::now()));
        let cert = current_client_certificate(&path, &config).await.unwrap();
        assert_eq!(cert.info.common_name.as_deref(), Some("system:node:n1"));
        let later = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(2);
        assert!(!client_config_still_valid(&path, later), "expired");
        assert!(!client_config_still_valid(
            &dir.join("missing"),
            Timestamp::now()
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_bootstrap_csr_is_named_after_its_key() {
        let dir = temp_dir("bootstrap-csr");
        let rotation = Rotation {
            api: FakeCsrApi::new(Verdict::Sign(Duration::from_secs(3600))),
            template: CsrTemplate::node_client("n1"),
            store: PemStore::new(dir.clone(), CLIENT_PREFIX),
            wait: Duration::from_secs(5),
            end_when_expired: None,
        };
        let cert = rotation.renew_digested().await.unwrap();
        assert_eq!(cert.info.common_name.as_deref(), Some("system:node:n1"));
        let created = rotation.api.created.lock().unwrap().clone();
        assert_eq!(created.len(), 1);
        let name = created[0].metadata.name.clone().unwrap();
        assert!(name.starts_with("node-csr-"), "{name}");
        assert!(created[0].metadata.generate_name.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
