//! The kubelet's token manager, simplified: service account tokens for projected volumes,
//! requested with the TokenRequest API bound to the pod, and reused until 80 % of their
//! lifetime (at most 24 h) has passed, so that repeated `setup` calls do not mint a token
//! each; the first `setup` after that gets a new token and rewrites the file.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};

use crate::watch_manager::PodObjects;

/// Token lifetime when the projection sets none (the API's default).
pub(super) const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// A token is refreshed once it is older than this, whatever its lifetime (kubelet `maxTTL`).
const MAX_TOKEN_AGE_SECONDS: i64 = 24 * 3600;

/// What identifies a token: the same request for the same pod gets the cached token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct TokenKey {
    pub(super) namespace: String,
    pub(super) service_account: String,
    pub(super) audience: Option<String>,
    pub(super) expiration_seconds: i64,
    pub(super) pod_name: String,
    pub(super) pod_uid: String,
}

impl TokenKey {
    /// The TokenRequest the kubelet sends: the audience (or the API server's when none),
    /// the lifetime, and a bound object reference to the pod, so the token dies with it.
    fn request(&self) -> TokenRequest {
        TokenRequest {
            spec: TokenRequestSpec {
                audiences: self.audience.iter().cloned().collect(),
                expiration_seconds: Some(self.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(self.pod_name.clone()),
                    uid: Some(self.pod_uid.clone()),
                }),
            },
            ..TokenRequest::default()
        }
    }
}

#[derive(Debug)]
struct CachedToken {
    token: String,
    /// Unix time after which the token is requested anew.
    refresh_at: i64,
}

/// The current Unix time, in seconds.
pub(super) type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Tokens by request, shared by all pods of the node.
pub(super) struct TokenManager {
    cache: Mutex<HashMap<TokenKey, CachedToken>>,
    clock: Clock,
}

impl Default for TokenManager {
    fn default() -> Self {
        Self::with_clock(Arc::new(unix_now))
    }
}

impl TokenManager {
    /// A manager that reads the time from `clock`.
    pub(super) fn with_clock(clock: Clock) -> Self {
        Self {
            cache: Mutex::default(),
            clock,
        }
    }

    /// The token for `key`: the cached one while fresh, else a new one from the API.
    pub(super) async fn token<A: PodObjects>(
        &self,
        api: &A,
        key: &TokenKey,
    ) -> kube::Result<String> {
        let now = (self.clock)();
        if let Some(cached) = self.lock().get(key)
            && now < cached.refresh_at
        {
            return Ok(cached.token.clone());
        }
        let response = api
            .create_token(&key.namespace, &key.service_account, &key.request())
            .await?;
        let Some(status) = response.status else {
            return Err(kube::Error::Api(
                kube::core::Status::failure(
                    "TokenRequest answered without a status",
                    "InternalError",
                )
                .with_code(500)
                .boxed(),
            ));
        };
        let ttl = response
            .spec
            .expiration_seconds
            .unwrap_or(key.expiration_seconds);
        let refresh_at = refresh_at(status.expiration_timestamp.0.as_second(), ttl);
        tracing::debug!(
            pod_uid = %key.pod_uid,
            service_account = %key.service_account,
            ttl,
            "requested a service account token"
        );
        self.lock().insert(
            key.clone(),
            CachedToken {
                token: status.token.clone(),
                refresh_at,
            },
        );
        Ok(status.token)
    }

    /// Drops the tokens of a pod that is gone.
    pub(super) fn forget_pod(&self, pod_uid: &str) {
        self.lock().retain(|key, _| key.pod_uid != pod_uid);
    }

    /// Whether a token of the pod is cached.
    pub(super) fn holds_pod(&self, pod_uid: &str) -> bool {
        self.lock().keys().any(|key| key.pod_uid == pod_uid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TokenKey, CachedToken>> {
        crate::lock::lock(&self.cache)
    }
}

/// When a token expiring at `expires` (Unix seconds) with lifetime `ttl` is refreshed: at
/// 80 % of its lifetime, or 24 h after it was issued, whichever comes first.
fn refresh_at(expires: i64, ttl: i64) -> i64 {
    let issued = expires.saturating_sub(ttl);
    expires
        .saturating_sub(ttl / 5)
        .min(issued.saturating_add(MAX_TOKEN_AGE_SECONDS))
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch_manager::testing::FakeApi;

    fn key(uid: &str) -> TokenKey {
        TokenKey {
            namespace: "ns".into(),
            service_account: "default".into(),
            audience: Some("vault".into()),
            expiration_seconds: 3600,
            pod_name: "web".into(),
            pod_uid: uid.into(),
        }
    }

    #[test]
    fn the_request_is_bound_to_the_pod() {
        let request = key("u1").request();
        assert_eq!(request.spec.audiences, ["vault"]);
        assert_eq!(request.spec.expiration_seconds, Some(3600));
        let bound = request.spec.bound_object_ref.expect("bound");
        assert_eq!(bound.kind.as_deref(), Some("Pod"));
        assert_eq!(bound.api_version.as_deref(), Some("v1"));
        assert_eq!(bound.name.as_deref(), Some("web"));
        assert_eq!(bound.uid.as_deref(), Some("u1"));
        let mut no_audience = key("u1");
        no_audience.audience = None;
        assert!(no_audience.request().spec.audiences.is_empty());
    }

    #[test]
    fn tokens_refresh_at_80_percent_or_after_a_day() {
        assert_eq!(refresh_at(10_000, 1000), 9_800);
        let year = 365 * 24 * 3600;
        assert_eq!(refresh_at(year + 5, year), 5 + MAX_TOKEN_AGE_SECONDS);
    }

    #[tokio::test]
    async fn tokens_are_cached_per_pod_until_forgotten() {
        let api = FakeApi::default();
        let tokens = TokenManager::default();
        let first = tokens.token(&api, &key("u1")).await.expect("token");
        let again = tokens.token(&api, &key("u1")).await.expect("token");
        assert_eq!(first, again);
        assert_eq!(api.token_requests().len(), 1);
        let other = tokens.token(&api, &key("u2")).await.expect("token");
        assert_ne!(first, other);
        tokens.forget_pod("u1");
        let fresh = tokens.token(&api, &key("u1")).await.expect("token");
        assert_ne!(first, fresh);
        assert_eq!(api.token_requests().len(), 3);
    }
}
