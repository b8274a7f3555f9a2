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
//! the kubelet's defaults. Valid and refused tokens are cached apart, each bounded: a
//! flood of invented tokens fills only the refused cache, and never evicts the reviews of
//! the valid clients (metrics-server's, Prometheus's), which go on without a new review.
//! (The kubelet's cache has no bound at all.) At most [`MAX_REVIEWS_IN_FLIGHT`] token
//! reviews and as many access reviews are asked at once, and at most
//! [`MAX_REVIEWS_PER_PEER`] token reviews are asked or waited for per peer address: a
//! flood of new tokens costs the API server, and this agent's connections to it, no more
//! than that, a valid client's new token waits behind at most that many reviews of each
//! flooding address, and the access reviews of callers already authenticated are not
//! held up (the kubelet's client multiplexes its reviews over one HTTP/2 connection; this
//! one opens a connection per concurrent request). Each token lookup and review is
//! counted in the library's `authentication_token_cache_*` metrics
//! ([`crate::metrics::TokenCache`]).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::net::IpAddr;
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
/// Most entries each cache holds; beyond it, expired entries are dropped, then the one
/// that would expire first.
pub const CACHE_MAX: usize = 4096;
/// Most reviews of each kind (token, access) asked of the API server at once.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 8;
/// Most token reviews one peer address has asked or waits for at once.
pub const MAX_REVIEWS_PER_PEER: usize = 2;

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

/// The bearer token of an `Authorization` header (`Bearer <token>`, the scheme in any
/// case); `None` for any other header or an empty token.
#[must_use]
pub fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    authorization
        .and_then(|h| {
            let (scheme, token) = h.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty())
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

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
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
        if entries.len() >= CACHE_MAX && !entries.contains_key(&key) {
            let now = Instant::now();
            entries.retain(|_, (_, until)| now < *until);
            if entries.len() >= CACHE_MAX {
                let first = entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(k, _)| k.clone());
                if let Some(first) = first {
                    entries.remove(&first);
                }
            }
        }
        entries.insert(key, (value, Instant::now() + ttl));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        crate::lock::lock(&self.entries).len()
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
    /// Valid tokens' users, by SHA-256 of the token: tokens themselves are not kept.
    tokens: TtlCache<[u8; 32], UserInfo>,
    /// Refused tokens, by SHA-256.
    refused: TtlCache<[u8; 32], ()>,
    decisions: TtlCache<String, bool>,
    /// Token reviews asked at once, at most [`MAX_REVIEWS_IN_FLIGHT`].
    token_reviews: tokio::sync::Semaphore,
    /// Token reviews per peer address, at most [`MAX_REVIEWS_PER_PEER`].
    peer_reviews: crate::lock::KeyedTurns<IpAddr>,
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
            refused: TtlCache::new(),
            decisions: TtlCache::new(),
            token_reviews: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
            peer_reviews: crate::lock::KeyedTurns::new(MAX_REVIEWS_PER_PEER),
            access_reviews: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
        }
    }

    /// The user of a request from `peer`: its verified client certificate's, else its
    /// bearer token's (the `Authorization` header's value).
    ///
    /// # Errors
    /// [`AuthError::Unauthorized`] without valid credentials; a failed review.
    pub async fn authenticate(
        &self,
        certificate_user: Option<UserInfo>,
        authorization: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<UserInfo, AuthError> {
        if let Some(user) = certificate_user {
            return Ok(user);
        }
        let token = bearer_token(authorization).ok_or(AuthError::Unauthorized)?;
        let mut key = [0u8; 32];
        key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
        let user = self
            .review_token(key, token, peer)
            .await
            .map_err(|source| AuthError::Review {
                what: "token",
                source,
            })?;
        user.ok_or(AuthError::Unauthorized)
    }

    /// The cached review of the token whose digest is `key`, else the API server's: asked
    /// in `peer`'s turn, then in one of the global ones, the caches looked at again then.
    async fn review_token(
        &self,
        key: [u8; 32],
        token: &str,
        peer: Option<IpAddr>,
    ) -> Result<Option<UserInfo>, kube::Error> {
        let cached = || {
            if let Some(user) = self.tokens.get(&key) {
                return Some(Some(user));
            }
            self.refused.get(&key).map(|()| None)
        };
        let metrics = &crate::metrics::global().token_cache;
        let started = Instant::now();
        if let Some(known) = cached() {
            metrics.observe_request(true, started.elapsed());
            return Ok(known);
        }
        let blocked = metrics.active(false);
        let _peer_turn = match peer {
            Some(ip) => Some(self.peer_reviews.acquire(ip).await),
            None => None,
        };
        let _permit = self.token_reviews.acquire().await.ok();
        drop(blocked);
        if let Some(known) = cached() {
            metrics.observe_request(false, started.elapsed());
            return Ok(known);
        }
        let in_flight = metrics.active(true);
        let reviewed = self.reviews.token_review(token).await;
        drop(in_flight);
        metrics.count_fetch(reviewed.is_ok());
        metrics.observe_request(false, started.elapsed());
        let reviewed = reviewed?;
        match &reviewed {
            Some(user) => {
                tracing::debug!(user = %user.name, ?peer, "token reviewed: valid");
                self.tokens.insert(key, user.clone(), TOKEN_TTL);
            }
            None => {
                tracing::debug!(?peer, "token reviewed: refused");
                self.refused.insert(key, (), TOKEN_REFUSED_TTL);
            }
        }
        Ok(reviewed)
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

/// Authentication and authorization of fuzzed credentials (for the fuzz target): `data`
/// is an `Authorization` header value, a newline, a path, a NUL byte and a DER client
/// certificate; a fake review API accepts tokens that start with `good`.
#[cfg(any(test, fuzzing))]
pub(crate) async fn fuzz_authentication(data: &[u8]) {
    struct Fuzzed;
    impl Reviews for Fuzzed {
        async fn token_review(&self, token: &str) -> Result<Option<UserInfo>, kube::Error> {
            Ok(token.starts_with("good").then(|| UserInfo {
                name: token.to_owned(),
                groups: token.split(':').map(str::to_owned).collect(),
                ..UserInfo::default()
            }))
        }
        async fn subject_access_review(
            &self,
            user: &UserInfo,
            attrs: &Attributes,
        ) -> Result<bool, kube::Error> {
            Ok(user.name.len().is_multiple_of(2) || attrs.subresource == "stats")
        }
    }
    let (head, der) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let head = String::from_utf8_lossy(head);
    let (header, path) = head.split_once('\n').unwrap_or((&head, "/pods"));
    let certificate_user = crate::tls::x509::parse(der)
        .ok()
        .and_then(|info| UserInfo::from_certificate(&info));
    let auth = Auth::new(Fuzzed, "n1".into());
    let peer = Some(IpAddr::from([10, 0, 0, 1]));
    if let Ok(user) = auth
        .authenticate(certificate_user, Some(header), peer)
        .await
    {
        let _ = auth.authorize(&user, "GET", path).await;
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
        good_reviews: AtomicUsize,
        access_reviews: AtomicUsize,
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
        /// How long a token review takes beyond 5 ms.
        slow_ms: u64,
    }

    impl Reviews for Fake {
        async fn token_review(&self, token: &str) -> Result<Option<UserInfo>, kube::Error> {
            self.token_reviews.fetch_add(1, Ordering::SeqCst);
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5 + self.slow_ms)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            if token == "good" {
                self.good_reviews.fetch_add(1, Ordering::SeqCst);
            }
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
            .authenticate(Some(admin()), Some("Bearer bad"), None)
            .await
            .unwrap();
        assert_eq!(user, admin(), "a certificate wins over a token");
        assert_eq!(auth.reviews.token_reviews.load(Ordering::SeqCst), 0);
        for _ in 0..3 {
            let user = auth
                .authenticate(None, Some("Bearer good"), None)
                .await
                .unwrap();
            assert_eq!(user.name, "system:serviceaccount:ns:sa");
        }
        assert_eq!(
            auth.reviews.token_reviews.load(Ordering::SeqCst),
            1,
            "cached"
        );
        for header in [None, Some("Basic abc"), Some("Bearer "), Some("Bearer bad")] {
            let err = auth.authenticate(None, header, None).await.unwrap_err();
            assert_eq!(err.status(), 401, "{header:?}");
        }
        auth.authenticate(None, Some("bearer bad"), None)
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
            tasks.spawn(async move { auth.authenticate(None, Some(&header), None).await.is_ok() });
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

    /// More invented tokens than the cache holds, all within the refused tokens' 10 s: the
    /// valid client's review stays cached (it was flushed with them before).
    #[tokio::test]
    async fn refused_tokens_never_evict_a_valid_review() {
        let auth = Auth::new(Fake::default(), "n1".into());
        auth.authenticate(None, Some("Bearer good"), None)
            .await
            .expect("valid");
        for i in 0..CACHE_MAX + 100 {
            let header = format!("Bearer junk-{i}");
            let refused = auth.authenticate(None, Some(&header), None).await;
            assert!(refused.is_err());
            if i % 1000 == 0 {
                auth.authenticate(None, Some("Bearer good"), None)
                    .await
                    .expect("still valid");
            }
        }
        auth.authenticate(None, Some("Bearer good"), None)
            .await
            .expect("still valid");
        assert_eq!(
            auth.reviews.good_reviews.load(Ordering::SeqCst),
            1,
            "the valid token was reviewed again"
        );
        assert!(auth.refused.len() <= CACHE_MAX);
    }

    /// One address asking for reviews of many new tokens at once has at most two asked or
    /// waiting; another address's new token is reviewed beside them at once.
    #[tokio::test]
    async fn token_reviews_are_bounded_per_peer() {
        let auth = std::sync::Arc::new(Auth::new(
            Fake {
                slow_ms: 45,
                ..Fake::default()
            },
            "n1".into(),
        ));
        let flooding = IpAddr::from([10, 0, 0, 1]);
        let mut flood = tokio::task::JoinSet::new();
        for i in 0..40 {
            let auth = auth.clone();
            flood.spawn(async move {
                let header = format!("Bearer junk-{i}");
                auth.authenticate(None, Some(&header), Some(flooding))
                    .await
                    .is_err()
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            auth.reviews.in_flight.load(Ordering::SeqCst),
            MAX_REVIEWS_PER_PEER,
            "one peer's reviews at once"
        );
        let started = Instant::now();
        auth.authenticate(None, Some("Bearer good"), Some(IpAddr::from([10, 0, 0, 2])))
            .await
            .expect("valid");
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_millis(400),
            "the other peer's review waited {waited:?}"
        );
        while let Some(refused) = flood.join_next().await {
            assert!(refused.unwrap());
        }
        assert_eq!(auth.peer_reviews.len(), 0, "peers are forgotten");
        assert!(auth.reviews.most_in_flight.load(Ordering::SeqCst) <= MAX_REVIEWS_PER_PEER + 1);
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
        let sa = auth
            .authenticate(None, Some("Bearer good"), None)
            .await
            .unwrap();
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
