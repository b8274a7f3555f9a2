//! TLS bootstrap of the node's client certificate, as the kubelet's
//! `certificate/bootstrap`: when `--kubeconfig` is missing or its client certificate has
//! expired, the bootstrap kubeconfig (a bootstrap token) asks for a certificate through a
//! CSR to `kubernetes.io/kube-apiserver-client-kubelet`, which kube-controller-manager
//! approves and signs; the certificate is stored under `--cert-dir` and `--kubeconfig`
//! written to point at it. Also the client identity rotation starts from.
//!
//! The request survives a restart, as the kubelet's: its key waits in
//! `<cert-dir>/kubelet-client.key.tmp` until the certificate arrives, and the CSR is named
//! after the key, so a restarted agent asks again under the same name and picks up the
//! CSR it made before (approved meanwhile or not) instead of leaving it orphaned. Neither
//! an API server that does not answer the creation nor one that goes away during the
//! wait ends the join: both are retried until the kubelet's hour is up.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::jiff::Timestamp;
use kube::config::{AuthInfo, Kubeconfig};
use secrecy::ExposeSecret;

use super::csr::{CsrApi, CsrError, CsrTemplate, new_key, request_certificate};
use super::store::{PemStore, write_private};
use super::{CertificateError, blocking, io_err};
use crate::tls::{self, ServingCertificate};

/// The prefix of the client certificate files in the cert dir.
pub const CLIENT_PREFIX: &str = "kubelet-client";
/// How long the bootstrap CSR is waited for, as the kubelet.
pub const BOOTSTRAP_WAIT: Duration = Duration::from_secs(3600);
/// The file in the cert dir that holds the bootstrap key until its certificate arrives
/// (the kubelet's `tmpPrivateKeyFile`).
pub const TMP_PRIVATE_KEY_FILE: &str = "kubelet-client.key.tmp";
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

/// The client certificate and key of a kubeconfig's current user, read as the agent
/// reads them (for the fuzz target).
#[cfg(any(test, fuzzing))]
pub(crate) fn fuzz_user_certificate(kubeconfig: &Kubeconfig) {
    if let Some((cert, key)) = current_user(kubeconfig).and_then(user_pems) {
        let _ = tls::serving_certificate(&cert, &key, Path::new("kubeconfig"));
    }
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
        let api = kube::Api::<CertificateSigningRequest>::all(client);
        let template = CsrTemplate::node_client(node_name);
        request_client_certificate(&api, &template, &store, &config.cert_dir, BOOTSTRAP_WAIT)
            .await?;
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

/// The bootstrap's request (the kubelet's `requestNodeCertificate`): the key waiting in
/// `cert_dir` (else a new one, written there before any CSR is made with it), a CSR named
/// after it, waited for up to `wait`; the certificate stored with the key, and the waiting
/// key removed (also when the CSR was denied or failed, so that the next try asks anew:
/// the kubelet keeps it, and would be refused again). A creation the API server does not answer (no connection, a timeout, a
/// 5xx or 429) is tried again after the reflector's back-off.
///
/// # Errors
/// The key cannot be read or written, the CSR was refused, denied or failed, or it was
/// not signed within `wait`.
pub async fn request_client_certificate<A: CsrApi>(
    api: &A,
    template: &CsrTemplate,
    store: &PemStore,
    cert_dir: &Path,
    wait: Duration,
) -> Result<ServingCertificate, CertificateError> {
    let key_path = cert_dir.join(TMP_PRIVATE_KEY_FILE);
    let key = {
        let (dir, path) = (cert_dir.to_owned(), key_path.clone());
        blocking(&key_path, move || load_or_generate_key(&dir, &path)).await?
    };
    let name = template.digested_name(&key);
    let request = template.object(Some(name.clone()), template.request(&key)?);
    tracing::info!(csr = %name, key = %key_path.display(), "waiting for the client certificate to be issued");
    let deadline = tokio::time::Instant::now() + wait;
    let mut retry = crate::backoff::WatchRetry::default();
    let issued = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match request_certificate(api, &request, &key, left).await {
            Err(CsrError::Create(e)) if unanswered(&e) && !left.is_zero() => {
                tracing::warn!(csr = %name, error = %e, "could not create the certificate signing request; retrying");
                tokio::select! {
                    () = retry.pause(&e) => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
            Err(e @ (CsrError::Denied { .. } | CsrError::Failed { .. })) => {
                // The same key would ask under the same name, and be refused again.
                remove_key(&key_path).await;
                return Err(e.into());
            }
            done => break done?,
        }
    };
    let cert = store.update(issued, &key.serialize_pem()).await?;
    remove_key(&key_path).await;
    Ok(cert)
}

/// Removes the waiting key at `path`, if it is there.
async fn remove_key(path: &Path) {
    if let Err(e) = tokio::fs::remove_file(path).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(key = %path.display(), error = %e, "failed cleaning up the private key file");
    }
}

/// Whether a failed request went unanswered (no connection, a timeout) or the server
/// could not serve it now (5xx, 429): worth trying again.
fn unanswered(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        _ => true,
    }
}

/// The key at `path` (in `dir`), or a new one written there (mode 0600, atomically). An
/// unreadable key is replaced, with a warning (the kubelet ends there instead). Blocking.
fn load_or_generate_key(dir: &Path, path: &Path) -> Result<rcgen::KeyPair, CertificateError> {
    match std::fs::read_to_string(path) {
        Ok(pem) => match rcgen::KeyPair::from_pem(&pem) {
            Ok(key) => {
                tracing::info!(key = %path.display(), "reusing the private key of the pending certificate request");
                return Ok(key);
            }
            Err(e) => {
                tracing::warn!(key = %path.display(), error = %e, "unusable private key; making a new one");
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(path)(e)),
    }
    let key = new_key()?;
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    write_private(path, key.serialize_pem().as_bytes())?;
    Ok(key)
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

    /// The bootstrap's key waits in the cert dir (0600) under a CSR named after it; a
    /// restarted bootstrap reuses both and picks up the CSR approved meanwhile, through
    /// failing reads; the key file goes once the certificate is stored.
    #[tokio::test]
    async fn a_restarted_bootstrap_reuses_its_key_and_csr() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = temp_dir("bootstrap-csr");
        let api = FakeCsrApi::new(Verdict::Manual(Duration::from_secs(3600)));
        let template = CsrTemplate::node_client("n1");
        let store = PemStore::new(dir.clone(), CLIENT_PREFIX);
        let key_file = dir.join(TMP_PRIVATE_KEY_FILE);
        let request =
            || request_client_certificate(&api, &template, &store, &dir, Duration::from_secs(60));
        let stopped = tokio::time::timeout(Duration::from_millis(300), request()).await;
        assert!(stopped.is_err(), "waits for the approval");
        let created = api.created.lock().unwrap().clone();
        assert_eq!(created.len(), 1);
        let name = created[0].metadata.name.clone().unwrap();
        assert!(created[0].metadata.generate_name.is_none());
        let key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(&key_file).unwrap()).unwrap();
        assert_eq!(
            name,
            template.digested_name(&key),
            "named after the kept key"
        );
        let mode = std::fs::metadata(&key_file).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );

        api.approve();
        api.failing.store(1, SeqCst);
        let cert = request().await.unwrap();
        assert_eq!(cert.info.common_name.as_deref(), Some("system:node:n1"));
        assert_eq!(api.created.lock().unwrap().len(), 1, "no second CSR");
        let pem = std::fs::read_to_string(store.current_path()).unwrap();
        assert!(
            pem.contains(&key.serialize_pem()),
            "stored with the kept key"
        );
        assert!(!key_file.exists(), "the waiting key is removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Only a creation that went unanswered is tried again.
    #[test]
    fn an_unanswered_creation_is_retried_a_refused_one_is_not() {
        let status = |code| {
            kube::Error::Api(
                kube::core::Status::failure("x", "X")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(unanswered(&status(500)) && unanswered(&status(503)) && unanswered(&status(429)));
        assert!(!unanswered(&status(401)) && !unanswered(&status(403)));
        assert!(unanswered(&kube::Error::Service(
            std::io::Error::from(std::io::ErrorKind::TimedOut).into()
        )));
    }

    /// A denied CSR ends the join and takes its key along, so the next start asks anew.
    #[tokio::test]
    async fn a_denied_request_drops_its_key() {
        let dir = temp_dir("bootstrap-denied");
        let api = FakeCsrApi::new(Verdict::Deny);
        let template = CsrTemplate::node_client("n1");
        let store = PemStore::new(dir.clone(), CLIENT_PREFIX);
        let err = request_client_certificate(&api, &template, &store, &dir, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("is denied"), "{err}");
        assert!(!dir.join(TMP_PRIVATE_KEY_FILE).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
