//! The one narrow read boundary of the API objects pods reference: the Secrets and
//! ConfigMaps (from the node's watch-based caches) and the service account tokens that the
//! volume manager and the image pull credentials read, behind a trait so their logic is
//! tested without a cluster.
//!
//! With the node's own identity the Node authorizer allows these reads (a list and watch on
//! `metadata.name`) and token requests only for objects that pods bound to this node
//! reference; a refused watch never lists, and its reads fail as unsynced. The claims and
//! persistent volumes of the node's pods are read with a plain `get` (the only verb the
//! Node authorizer grants on them), as the kubelet's volume manager reads them; the node's
//! labels (for a volume's node affinity) come from the node's own watch.

use std::future::Future;

use k8s_openapi::api::authentication::v1::TokenRequest;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Secret, ServiceAccount,
};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};

use super::{CacheError, SourceCaches};

/// The reads and the one write (a token request) that volumes and image pulls need.
pub trait PodObjects: Send + Sync + 'static {
    /// The Secret `namespace/name` as its watch last saw it; `None` when it does not exist.
    fn get_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Secret>, CacheError>> + Send;

    /// The ConfigMap `namespace/name` as its watch last saw it; `None` when it does not
    /// exist.
    fn get_config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ConfigMap>, CacheError>> + Send;

    /// `POST serviceaccounts/<service_account>/token` in `namespace`: a TokenRequest,
    /// answered with the token in its status.
    fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> impl Future<Output = kube::Result<TokenRequest>> + Send;

    /// `GET persistentvolumeclaims/<name>` in `namespace`.
    fn get_persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = kube::Result<PersistentVolumeClaim>> + Send;

    /// `GET persistentvolumes/<name>`.
    fn get_persistent_volume(
        &self,
        name: &str,
    ) -> impl Future<Output = kube::Result<PersistentVolume>> + Send;

    /// The labels of this node as its watch last saw it (the kubelet's `GetNodeLabels`);
    /// `None` while the node is not known.
    fn node_labels(&self) -> Option<BTreeMap<String, String>>;
}

/// [`PodObjects`] over the node's watch-based Secret and ConfigMap caches, and a
/// [`kube::Client`] (normally with the node's identity) for tokens.
#[derive(Clone)]
pub struct KubePodObjects {
    client: kube::Client,
    caches: SourceCaches,
    node: Option<(Store<Node>, String)>,
}

impl KubePodObjects {
    /// Secrets and ConfigMaps come from `caches`, tokens through `client`.
    #[must_use]
    pub fn new(client: kube::Client, caches: SourceCaches) -> Self {
        Self {
            client,
            caches,
            node: None,
        }
    }

    /// Node labels come from `store`, the watch of the node `node_name`.
    #[must_use]
    pub fn with_node(mut self, store: Store<Node>, node_name: &str) -> Self {
        self.node = Some((store, node_name.to_owned()));
        self
    }
}

impl std::fmt::Debug for KubePodObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePodObjects").finish_non_exhaustive()
    }
}

impl PodObjects for KubePodObjects {
    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, CacheError> {
        let got = self.caches.secrets.get(namespace, name).await?;
        Ok(got.as_deref().cloned())
    }

    async fn get_config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, CacheError> {
        let got = self.caches.config_maps.get(namespace, name).await?;
        Ok(got.as_deref().cloned())
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

    async fn get_persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> kube::Result<PersistentVolumeClaim> {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
    }

    async fn get_persistent_volume(&self, name: &str) -> kube::Result<PersistentVolume> {
        Api::<PersistentVolume>::all(self.client.clone())
            .get(name)
            .await
    }

    fn node_labels(&self) -> Option<BTreeMap<String, String>> {
        let (store, name) = self.node.as_ref()?;
        let node = store.get(&ObjectRef::new(name))?;
        Some(node.metadata.labels.clone().unwrap_or_default())
    }
}
