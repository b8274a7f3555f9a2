//! The API boundary of the volume manager: the Secrets and ConfigMaps it reads (from the
//! node's watch-based caches) and the tokens it requests, behind a trait so the volume
//! logic is tested without a cluster.
//!
//! With the node's own identity the Node authorizer allows exactly these calls for objects
//! that pods bound to this node reference; everything else is `403 Forbidden`.

use std::future::Future;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::api::{Api, PostParams};

use crate::watch_manager::{CacheError, SourceCaches};

/// The reads and the one write the volume manager needs from the API server.
pub trait VolumeApi: Send + Sync + 'static {
    /// `GET secrets/<name>` in `namespace`; `None` when it does not exist.
    fn get_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = kube::Result<Option<Secret>>> + Send;

    /// `GET configmaps/<name>` in `namespace`; `None` when it does not exist.
    fn get_config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = kube::Result<Option<ConfigMap>>> + Send;

    /// `POST serviceaccounts/<service_account>/token` in `namespace`: a TokenRequest,
    /// answered with the token in its status.
    fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> impl Future<Output = kube::Result<TokenRequest>> + Send;
}

/// [`VolumeApi`] over the node's watch-based Secret and ConfigMap caches, and a
/// [`kube::Client`] (normally with the node's identity) for tokens.
#[derive(Clone)]
pub struct KubeVolumeApi {
    client: kube::Client,
    caches: SourceCaches,
}

impl KubeVolumeApi {
    /// Secrets and ConfigMaps come from `caches`, tokens through `client`.
    #[must_use]
    pub fn new(client: kube::Client, caches: SourceCaches) -> Self {
        Self { client, caches }
    }
}

/// A cache error as the API error the volume manager reports.
fn cache_error(e: &CacheError) -> kube::Error {
    kube::Error::Api(Box::new(kube::core::Status::failure(
        &e.to_string(),
        "CacheNotReady",
    )))
}

impl std::fmt::Debug for KubeVolumeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeVolumeApi").finish_non_exhaustive()
    }
}

impl VolumeApi for KubeVolumeApi {
    async fn get_secret(&self, namespace: &str, name: &str) -> kube::Result<Option<Secret>> {
        let got = self.caches.secrets.get(namespace, name).await;
        got.map(|s| s.as_deref().cloned())
            .map_err(|e| cache_error(&e))
    }

    async fn get_config_map(&self, namespace: &str, name: &str) -> kube::Result<Option<ConfigMap>> {
        let got = self.caches.config_maps.get(namespace, name).await;
        got.map(|c| c.as_deref().cloned())
            .map_err(|e| cache_error(&e))
    }

    async fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> kube::Result<TokenRequest> {
        Api::<ServiceAccount>::namespaced(self.client.clone(), namespace)
            .create_token_request(service_account, &PostParams::default(), request)
            .await
    }
}
