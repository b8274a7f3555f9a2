//! Authentication and authorization of kubelet API requests, delegated to the cluster as
//! the kubelet does (`--authentication-token-webhook`, `--authorization-mode=Webhook`,
//! anonymous access off):
//!
//! - a client certificate verified against `--client-ca-file` names the user (common name)
//!   and groups (organizations);
//! - otherwise a bearer token is reviewed with a `TokenReview`;
//! - otherwise the request is refused with 401.
//!
//! The user is then authorized with a `SubjectAccessReview` on the node object:
//! `nodes/stats` for `/stats/…`, `nodes/metrics` for `/metrics…`, `nodes/log` for `/logs/…`,
//! and `nodes/proxy` for everything else (logs of containers, exec, attach,
//! port-forward, pods), with the verb of the HTTP method. Denial is 403. Reviews are
//! cached: tokens for 2 min (10 s when refused), decisions for 5 min (30 s when denied),
//! the kubelet's defaults. At most [`MAX_REVIEWS_IN_FLIGHT`] token reviews and as many
//! access reviews are asked at once: a flood of new tokens costs the API server, and this
//! agent's connections to it, no more than that, and does not hold up the access reviews
//! of callers already authenticated (the kubelet's client multiplexes its reviews over
//! one HTTP/2 connection; this one opens a connection per concurrent request).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

/// How long a successful token review is cached.
pub const TOKEN_TTL: Duration = Duration::from_secs(120);
/// How long a refused token is cached.
pub const TOKEN_REFUSED_TTL: Duration = Duration::from_secs(10);
/// How long an allow decision is cached.
pub const AUTHORIZED_TTL: Duration = Duration::from_secs(300);
/// How long a deny decision is cached.
pub const UNAUTHORIZED_TTL: Duration = Duration::from_secs(30);
/// Most entries each cache holds; beyond it, expired entries are dropped, then all.
const CACHE_MAX: usize = 4096;
/// Most reviews of each kind (token, access) asked of the API server at once.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 8;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    /// The user name.
    pub name: String,
    /// The user's UID, if the authenticator gives one.
    pub uid: String,
    /// The groups.
    pub groups: Vec<String>,
    /// Extra attributes (from a token review).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The user of a verified client certificate: common name and organizations, as the
    /// kube-apiserver reads them.
    #[must_use]
    pub fn from_certificate(info: &crate::tls::x509::CertificateInfo) -> Option<Self> {
        let name = info.common_name.clone().filter(|n| !n.is_empty())?;
        Some(Self {
            name,
            groups: info.organizations.clone(),
            ..Self::default()
        })
    }
}

/// What a request asks of the node, in the API's terms (resource `nodes`, version `v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `create`, `update`, `patch`, `delete`.
    pub verb: &'static str,
    /// `proxy`, `stats`, `metrics`, `log` or `spec`.
    pub subresource: &'static str,
    /// The node's name.
    pub node: String,
}

fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The kubelet's mapping of a request to attributes: the verb from the method, the
/// subresource from the path.
#[must_use]
pub fn attributes(method: &str, path: &str, node: &str) -> Attributes {
    let verb = match method {
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "get",
    };
    let subresource = if is_subpath(path, "/stats") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs") {
        "log"
    } else if is_subpath(path, "/spec") {
        "spec"
    } else {
        "proxy"
    };
    Attributes {
        verb,
        subresource,
        node: node.to_owned(),
    }
}

/// Why a request is refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No usable credentials: 401.
    #[error("Unauthorized")]
    Unauthorized,
    /// The user may not do this: 403, with the kubelet's message.
    #[error("Forbidden (user={user}, verb={verb}, resource=nodes, subresource={subresource})")]
    Forbidden {
        /// The user.
        user: String,
        /// The verb.
        verb: &'static str,
        /// The subresource.
        subresource: &'static str,
    },
    /// A review could not be made: 500 for authorization, 401 for authentication.
    #[error("{what} review failed: {source}")]
    Review {
        /// `token` or `access`.
        what: &'static str,
        /// The API error.
        source: kube::Error,
    },
}

impl AuthError {
    /// The HTTP status of the refusal.
    #[must_use]
    pub fn status(&self) -> u16 {
        match self {
            Self::Unauthorized | Self::Review { what: "token", .. } => 401,
            Self::Forbidden { .. } => 403,
            Self::Review { .. } => 500,
        }
    }
}

/// The reviews the cluster makes for the server: implemented over the API, faked in tests.
pub trait Reviews: Send + Sync + 'static {
    /// The user a bearer token belongs to; `None` when the token is not valid.
    fn token_review(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Option<UserInfo>, kube::Error>> + Send;
    /// Whether the user may do what the attributes say.
    fn subject_access_review(
        &self,
        user: &UserInfo,
        attrs: &Attributes,
    ) -> impl Future<Output = Result<bool, kube::Error>> + Send;
}

/// [`Reviews`] through the kube-apiserver.
#[derive(Clone)]
pub struct ApiReviews(pub kube::Client);

impl Reviews for ApiReviews {
    async fn token_review(&self, token: &str) -> Result<Option<UserInfo>, kube::Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.0.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(None);
        }
        let user = status.user.unwrap_or_default();
        Ok(Some(UserInfo {
            name: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        }))
    }

    async fn subject_access_review(
        &self,
        user: &UserInfo,
        attrs: &Attributes,
    ) -> Result<bool, kube::Error> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attrs.verb.to_owned()),
                    group: Some(String::new()),
                    version: Some("v1".to_owned()),
                    resource: Some("nodes".to_owned()),
                    subresource: Some(attrs.subresource.to_owned()),
                    name: Some(attrs.node.clone()),
                    ..ResourceAttributes::default()
                }),
                non_resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.0.clone())
            .create(&PostParams::default(), &review)
            .await?;
        Ok(reviewed.status.is_some_and(|s| s.allowed))
    }
}

/// A small cache whose entries expire.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = crate::lock::lock(&self.entries);
        entries
            .get(key)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(v, _)| v.clone())
    }

    fn insert(&self, key: K, value: V, ttl: Duration) {
        let mut entries = crate::lock::lock(&self.entries);
        if entries.len() >= CACHE_MAX {
            let now = Instant::now();
            entries.retain(|_, (_, until)| now < *until);
            if entries.len() >= CACHE_MAX {
                entries.clear();
            }
        }
        entries.insert(key, (value, Instant::now() + ttl));
    }

    /// The cached value of `key`, else `review`'s, cached for `ttl` of it; a review
    /// waits for one of `permits` (and the cache is looked at again once it has one).
    async fn get_or_review<E, Fut>(
        &self,
        key: K,
        permits: &tokio::sync::Semaphore,
        review: impl FnOnce() -> Fut,
        ttl: impl Fn(&V) -> Duration,
    ) -> Result<V, E>
    where
        Fut: Future<Output = Result<V, E>>,
    {
        if let Some(cached) = self.get(&key) {
            return Ok(cached);
        }
        let _permit = permits.acquire().await.ok();
        if let Some(cached) = self.get(&key) {
            return Ok(cached);
        }
        let value = review().await?;
        self.insert(key, value.clone(), ttl(&value));
        Ok(value)
    }
}

/// The server's authenticator and authorizer, with their caches.
pub struct Auth<R> {
    reviews: R,
    node: String,
    /// By SHA-256 of the token: tokens themselves are not kept.
    tokens: TtlCache<[u8; 32], Option<UserInfo>>,
    decisions: TtlCache<String, bool>,
    /// Token reviews asked at once, at most [`MAX_REVIEWS_IN_FLIGHT`].
    token_reviews: tokio::sync::Semaphore,
    /// Access reviews asked at once, at most [`MAX_REVIEWS_IN_FLIGHT`].
    access_reviews: tokio::sync::Semaphore,
}

impl<R: Reviews> Auth<R> {
    /// Authentication and authorization for node `node` through `reviews`.
    pub fn new(reviews: R, node: String) -> Self {
        Self {
            reviews,
            node,
            tokens: TtlCache::new(),
            decisions: TtlCache::new(),
            token_reviews: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
            access_reviews: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
        }
    }

    /// The user of a request: its verified client certificate's, else its bearer token's.
    ///
    /// # Errors
    /// [`AuthError::Unauthorized`] without valid credentials; a failed review.
    pub async fn authenticate(
        &self,
        certificate_user: Option<UserInfo>,
        authorization: Option<&str>,
    ) -> Result<UserInfo, AuthError> {
        if let Some(user) = certificate_user {
            return Ok(user);
        }
        let token = authorization
            .and_then(|h| {
                let (scheme, token) = h.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(AuthError::Unauthorized)?;
        let mut key = [0u8; 32];
        key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
        let user = self
            .tokens
            .get_or_review(
                key,
                &self.token_reviews,
                || self.reviews.token_review(token),
                |reviewed| {
                    if reviewed.is_some() {
                        TOKEN_TTL
                    } else {
                        TOKEN_REFUSED_TTL
                    }
                },
            )
            .await
            .map_err(|source| AuthError::Review {
                what: "token",
                source,
            })?;
        user.ok_or(AuthError::Unauthorized)
    }

    /// Whether `user` may make this request.
    ///
    /// # Errors
    /// [`AuthError::Forbidden`] when denied; a failed review.
    pub async fn authorize(
        &self,
        user: &UserInfo,
        method: &str,
        path: &str,
    ) -> Result<(), AuthError> {
        let attrs = attributes(method, path, &self.node);
        let mut groups = user.groups.clone();
        groups.sort();
        let key = format!(
            "{}\0{}\0{}\0{:?}\0{}\0{}",
            user.name,
            user.uid,
            groups.join("\0"),
            user.extra,
            attrs.verb,
            attrs.subresource
        );
        let allowed = self
            .decisions
            .get_or_review(
                key,
                &self.access_reviews,
                || self.reviews.subject_access_review(user, &attrs),
                |allowed| {
                    if *allowed {
                        AUTHORIZED_TTL
                    } else {
                        UNAUTHORIZED_TTL
                    }
                },
            )
            .await
            .map_err(|source| AuthError::Review {
                what: "access",
                source,
            })?;
        if allowed {
            Ok(())
        } else {
            Err(AuthError::Forbidden {
                user: user.name.clone(),
                verb: attrs.verb,
                subresource: attrs.subresource,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_kubelets_mapping_of_paths_and_methods() {
        let a = |m, p| {
            let a = attributes(m, p, "n1");
            (a.verb, a.subresource)
        };
        assert_eq!(a("GET", "/stats/summary"), ("get", "stats"));
        assert_eq!(a("GET", "/stats"), ("get", "stats"));
        assert_eq!(a("GET", "/statsfoo"), ("get", "proxy"));
        assert_eq!(a("GET", "/metrics"), ("get", "metrics"));
        assert_eq!(a("GET", "/metrics/cadvisor"), ("get", "metrics"));
        assert_eq!(a("GET", "/logs/syslog"), ("get", "log"));
        assert_eq!(a("GET", "/spec/"), ("get", "spec"));
        assert_eq!(a("GET", "/containerLogs/ns/p/c"), ("get", "proxy"));
        assert_eq!(a("POST", "/exec/ns/p/c"), ("create", "proxy"));
        assert_eq!(a("GET", "/exec/ns/p/c"), ("get", "proxy"));
        assert_eq!(a("POST", "/portForward/ns/p"), ("create", "proxy"));
        assert_eq!(a("GET", "/pods"), ("get", "proxy"));
        assert_eq!(a("HEAD", "/healthz"), ("get", "proxy"));
        assert_eq!(a("PUT", "/x"), ("update", "proxy"));
        assert_eq!(a("PATCH", "/x"), ("patch", "proxy"));
        assert_eq!(a("DELETE", "/x"), ("delete", "proxy"));
    }

    #[derive(Default)]
    struct Fake {
        token_reviews: AtomicUsize,
        access_reviews: AtomicUsize,
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
    }

    impl Reviews for Fake {
        async fn token_review(&self, token: &str) -> Result<Option<UserInfo>, kube::Error> {
            self.token_reviews.fetch_add(1, Ordering::SeqCst);
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok((token == "good").then(|| UserInfo {
                name: "system:serviceaccount:ns:sa".into(),
                groups: vec!["system:serviceaccounts".into()],
                ..UserInfo::default()
            }))
        }
        async fn subject_access_review(
            &self,
            user: &UserInfo,
            attrs: &Attributes,
        ) -> Result<bool, kube::Error> {
            self.access_reviews.fetch_add(1, Ordering::SeqCst);
            Ok(user.groups.iter().any(|g| g == "system:masters") || attrs.subresource == "stats")
        }
    }

    fn admin() -> UserInfo {
        UserInfo {
            name: "kube-apiserver-kubelet-client".into(),
            groups: vec!["system:masters".into()],
            ..UserInfo::default()
        }
    }

    #[tokio::test]
    async fn certificates_first_then_tokens_reviewed_once_else_401() {
        let auth = Auth::new(Fake::default(), "n1".into());
        let user = auth
            .authenticate(Some(admin()), Some("Bearer bad"))
            .await
            .unwrap();
        assert_eq!(user, admin(), "a certificate wins over a token");
        assert_eq!(auth.reviews.token_reviews.load(Ordering::SeqCst), 0);
        for _ in 0..3 {
            let user = auth.authenticate(None, Some("Bearer good")).await.unwrap();
            assert_eq!(user.name, "system:serviceaccount:ns:sa");
        }
        assert_eq!(
            auth.reviews.token_reviews.load(Ordering::SeqCst),
            1,
            "cached"
        );
        for header in [None, Some("Basic abc"), Some("Bearer "), Some("Bearer bad")] {
            let err = auth.authenticate(None, header).await.unwrap_err();
            assert_eq!(err.status(), 401, "{header:?}");
        }
        auth.authenticate(None, Some("bearer bad"))
            .await
            .unwrap_err();
        assert_eq!(
            auth.reviews.token_reviews.load(Ordering::SeqCst),
            2,
            "the refused token is cached too"
        );
    }

    /// A flood of invented tokens: every one is reviewed (and refused), never more than
    /// the limit at once; a token many ask for at once is reviewed by few of them.
    #[tokio::test]
    async fn reviews_in_flight_are_bounded() {
        let auth = std::sync::Arc::new(Auth::new(Fake::default(), "n1".into()));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..100 {
            let auth = auth.clone();
            let header = if i % 2 == 0 {
                format!("Bearer invented-{i}")
            } else {
                "Bearer good".to_owned()
            };
            tasks.spawn(async move { auth.authenticate(None, Some(&header)).await.is_ok() });
        }
        let mut good = 0;
        while let Some(ok) = tasks.join_next().await {
            good += usize::from(ok.unwrap());
        }
        assert_eq!(good, 50);
        let most = auth.reviews.most_in_flight.load(Ordering::SeqCst);
        assert!(
            (1..=MAX_REVIEWS_IN_FLIGHT).contains(&most),
            "{most} at once"
        );
        let reviews = auth.reviews.token_reviews.load(Ordering::SeqCst);
        assert!(
            reviews <= 50 + MAX_REVIEWS_IN_FLIGHT,
            "{reviews} reviews: the good token's waiters found it cached"
        );
    }

    #[tokio::test]
    async fn decisions_are_cached_and_denials_are_403_with_the_kubelets_message() {
        let auth = Auth::new(Fake::default(), "n1".into());
        for _ in 0..3 {
            auth.authorize(&admin(), "POST", "/exec/ns/p/c")
                .await
                .unwrap();
        }
        assert_eq!(auth.reviews.access_reviews.load(Ordering::SeqCst), 1);
        let sa = auth.authenticate(None, Some("Bearer good")).await.unwrap();
        auth.authorize(&sa, "GET", "/stats/summary").await.unwrap();
        let err = auth.authorize(&sa, "GET", "/pods").await.unwrap_err();
        assert_eq!(err.status(), 403);
        assert_eq!(
            err.to_string(),
            "Forbidden (user=system:serviceaccount:ns:sa, verb=get, resource=nodes, subresource=proxy)"
        );
        auth.authorize(&sa, "GET", "/pods").await.unwrap_err();
        assert_eq!(auth.reviews.access_reviews.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_certificate_without_a_common_name_names_nobody() {
        let info = crate::tls::x509::CertificateInfo {
            common_name: None,
            organizations: vec!["g".into()],
            not_before: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            not_after: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        };
        assert!(UserInfo::from_certificate(&info).is_none());
    }
}
