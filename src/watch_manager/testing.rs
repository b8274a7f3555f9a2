//! A fake API server behind [`PodObjects`]: a few Secrets and ConfigMaps, names that
//! answer as refused watches, and token requests it records. Compiled for tests only; the
//! volume manager's, the credentials' and the pod worker's unit tests use it.

use crate::lock::lock;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::{CacheError, PodObjects};

/// An API server holding a few secrets and config maps; some names answer 403. Clones
/// share their state.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeApi {
    inner: Arc<FakeApiState>,
}

#[derive(Debug, Default)]
struct FakeApiState {
    secrets: Mutex<HashMap<(String, String), Secret>>,
    config_maps: Mutex<HashMap<(String, String), ConfigMap>>,
    forbidden: Mutex<HashSet<String>>,
    token_requests: Mutex<Vec<(String, String, TokenRequest)>>,
    claims: Mutex<HashMap<(String, String), PersistentVolumeClaim>>,
    volumes: Mutex<HashMap<String, PersistentVolume>>,
    node_labels: Mutex<Option<BTreeMap<String, String>>>,
}

/// The API's 404 for `kind` `name`.
fn not_found(kind: &str, name: &str) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(&format!("{kind} \"{name}\" not found"), "NotFound")
            .with_code(404)
            .boxed(),
    )
}

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

/// What the cache answers for an object whose watch is refused: it never syncs.
fn forbidden(resource: &'static str) -> CacheError {
    CacheError::NotSynced { resource }
}

impl FakeApi {
    pub(crate) fn with_secret(self, namespace: &str, name: &str, data: &[(&str, &str)]) -> Self {
        let data: BTreeMap<_, _> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect();
        lock(&self.inner.secrets).insert(
            (namespace.into(), name.into()),
            Secret {
                metadata: meta(namespace, name),
                data: Some(data),
                ..Secret::default()
            },
        );
        self
    }

    pub(crate) fn with_config_map(
        self,
        namespace: &str,
        name: &str,
        data: &[(&str, &str)],
        binary_data: &[(&str, &[u8])],
    ) -> Self {
        let data = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let binary_data = binary_data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
            .collect();
        lock(&self.inner.config_maps).insert(
            (namespace.into(), name.into()),
            ConfigMap {
                metadata: meta(namespace, name),
                data: Some(data),
                binary_data: Some(binary_data),
                ..ConfigMap::default()
            },
        );
        self
    }

    /// Every read of an object of this name fails as for a watch the API server refuses.
    /// Holds the claim (its namespace and name from its metadata).
    pub(crate) fn with_claim(self, claim: PersistentVolumeClaim) -> Self {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        lock(&self.inner.claims).insert(key, claim);
        self
    }

    /// Holds the persistent volume.
    pub(crate) fn with_persistent_volume(self, pv: PersistentVolume) -> Self {
        let name = pv.metadata.name.clone().unwrap_or_default();
        lock(&self.inner.volumes).insert(name, pv);
        self
    }

    /// The node is known, with `labels`.
    pub(crate) fn with_node_labels(self, labels: &[(&str, &str)]) -> Self {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        *lock(&self.inner.node_labels) = Some(labels);
        self
    }

    pub(crate) fn forbid(self, name: &str) -> Self {
        lock(&self.inner.forbidden).insert(name.into());
        self
    }

    /// The token requests made so far: namespace, service account, request.
    pub(crate) fn token_requests(&self) -> Vec<(String, String, TokenRequest)> {
        lock(&self.inner.token_requests).clone()
    }

    fn check(&self, name: &str, resource: &'static str) -> Result<(), CacheError> {
        if lock(&self.inner.forbidden).contains(name) {
            Err(forbidden(resource))
        } else {
            Ok(())
        }
    }
}

impl PodObjects for FakeApi {
    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, CacheError> {
        self.check(name, "secret")?;
        Ok(lock(&self.inner.secrets)
            .get(&(namespace.into(), name.into()))
            .cloned())
    }

    async fn get_config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, CacheError> {
        self.check(name, "configmap")?;
        Ok(lock(&self.inner.config_maps)
            .get(&(namespace.into(), name.into()))
            .cloned())
    }

    async fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> kube::Result<TokenRequest> {
        let mut requests = lock(&self.inner.token_requests);
        requests.push((namespace.into(), service_account.into(), request.clone()));
        let seconds = request.spec.expiration_seconds.unwrap_or(3600);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let expires = i64::try_from(now).unwrap_or(0).saturating_add(seconds);
        let mut response = request.clone();
        response.status = Some(TokenRequestStatus {
            token: format!("token-{}-{service_account}", requests.len()),
            expiration_timestamp: Time(Timestamp::from_second(expires).expect("in range")),
        });
        Ok(response)
    }

    async fn get_persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> kube::Result<PersistentVolumeClaim> {
        lock(&self.inner.claims)
            .get(&(namespace.into(), name.into()))
            .cloned()
            .ok_or_else(|| not_found("persistentvolumeclaims", name))
    }

    async fn get_persistent_volume(&self, name: &str) -> kube::Result<PersistentVolume> {
        lock(&self.inner.volumes)
            .get(name)
            .cloned()
            .ok_or_else(|| not_found("persistentvolumes", name))
    }

    fn node_labels(&self) -> Option<BTreeMap<String, String>> {
        lock(&self.inner.node_labels).clone()
    }
}
