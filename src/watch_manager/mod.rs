//! The kubelet's watch-based Secret and ConfigMap managers (`pkg/kubelet/util/manager`,
//! `configMapAndSecretChangeDetectionStrategy: Watch`): every object a pod on this node
//! references gets one watch on `metadata.name=<name>` in its namespace, shared by all the
//! pods that reference it and stopped when the last of them is gone. Reads are served from
//! what the watch last delivered, so a burst of pods that use the same Secret makes one
//! LIST and one WATCH, not a GET per pod or per container start.
//!
//! - [`ObjectCache::register`] records a pod's references (from its spec), starting the
//!   watches of objects seen for the first time; [`ObjectCache::unregister`] drops them.
//! - [`ObjectCache::get`] waits (up to a second, as the kubelet) for the object's first
//!   list, then answers from it: the object, or not found.
//! - A change to a watched object wakes the pods that reference it, so their volumes are
//!   rewritten at once rather than at the next periodic sync.
//! - An object marked `immutable` is not watched further once read.
//!
//! Volumes and image pull credentials read these objects (and request service account
//! tokens) through one narrow trait, [`PodObjects`]. Knows no pod worker, prober, volume
//! or image: pods register what they reference, and hand in a [`Wake`] for changes.

mod objects;
#[cfg(test)]
pub(crate) mod testing;

use crate::lock::lock;
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{
    ConfigMap, EnvFromSource, EnvVarSource, Pod, Secret, Volume, VolumeProjection,
};
use kube::Resource;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::pod::state::{ForgetPod, Wake, WakeFor};

pub use objects::{KubePodObjects, PodObjects};

/// How long a read waits for an object's first list (the kubelet's one second).
const SYNC_WAIT: Duration = Duration::from_secs(1);

/// Why an object could not be read from the cache. The texts are the kubelet's.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CacheError {
    /// No pod registered a reference to the object.
    #[error("object {namespace:?}/{name:?} not registered")]
    NotRegistered {
        /// The object's namespace.
        namespace: String,
        /// The object's name.
        name: String,
    },
    /// The object's watch has not delivered its first list in time.
    #[error("failed to sync {resource} cache: timed out waiting for the condition")]
    NotSynced {
        /// `secret` or `configmap`.
        resource: &'static str,
    },
}

/// An object as its watch last saw it: `None` until the first list, then whether it
/// exists.
type Seen<K> = Option<Option<Arc<K>>>;

/// An object's key: namespace and name.
type Key = (String, String);

struct Item<K> {
    seen: watch::Receiver<Seen<K>>,
    task: tokio::task::AbortHandle,
}

/// A registered pod: its references, and how many changes to them were seen.
#[derive(Default)]
struct Refs {
    keys: HashSet<Key>,
    changes: u64,
}

struct State<K> {
    items: HashMap<Key, Item<K>>,
    /// The registered pods, by UID.
    pods: HashMap<String, Refs>,
}

/// A kind the cache holds: which of a pod's objects of the kind it references.
pub trait Referenced:
    Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug
{
    /// The resource name in the kubelet's not-found and sync messages.
    const RESOURCE: &'static str;
    /// The names of the objects of this kind that `pod` references.
    fn names(pod: &Pod) -> HashSet<String>;
    /// Whether the object is marked immutable.
    fn immutable(&self) -> bool;
}

/// The watch-based cache of one kind (Secrets or ConfigMaps).
pub struct ObjectCache<K: Referenced> {
    client: kube::Client,
    state: Arc<Mutex<State<K>>>,
    wake: Wake,
}

impl<K: Referenced> Debug for ObjectCache<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCache")
            .field("resource", &K::RESOURCE)
            .finish_non_exhaustive()
    }
}

impl<K: Referenced + Send + Sync + 'static> ObjectCache<K> {
    /// A cache whose watches go through `client`; changes wake pods through `wake`.
    #[must_use]
    pub fn new(client: kube::Client, wake: Wake) -> Self {
        Self {
            client,
            state: Arc::new(Mutex::new(State {
                items: HashMap::new(),
                pods: HashMap::new(),
            })),
            wake,
        }
    }

    /// Records the references of `pod` (UID `uid`), in place of the ones recorded before:
    /// watches start for objects no pod referenced, and stop for objects no pod references
    /// any more.
    pub fn register(&self, uid: &str, pod: &Pod) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let keys: HashSet<Key> = K::names(pod)
            .into_iter()
            .map(|name| (namespace.clone(), name))
            .collect();
        let mut state = lock(&self.state);
        if state.pods.get(uid).map(|r| &r.keys) == Some(&keys) {
            return;
        }
        for key in &keys {
            if !state.items.contains_key(key) {
                let item = self.watch(key.clone());
                state.items.insert(key.clone(), item);
            }
        }
        let refs = state.pods.entry(uid.to_owned()).or_default();
        let old = std::mem::replace(&mut refs.keys, keys);
        Self::release(&mut state, old);
    }

    /// How many changes to the objects the pod `uid` references were seen: a volume set
    /// up before the number moved is out of date.
    #[must_use]
    pub fn changes(&self, uid: &str) -> u64 {
        lock(&self.state).pods.get(uid).map_or(0, |r| r.changes)
    }

    /// Whether references of the pod `uid` are recorded.
    #[must_use]
    pub fn holds(&self, uid: &str) -> bool {
        lock(&self.state).pods.contains_key(uid)
    }

    /// Drops the references of the pod `uid`.
    pub fn unregister(&self, uid: &str) {
        let mut state = lock(&self.state);
        let old = state.pods.remove(uid).unwrap_or_default();
        Self::release(&mut state, old.keys);
    }

    /// Stops the watches of `keys` that no registered pod references.
    fn release(state: &mut State<K>, keys: HashSet<Key>) {
        for key in keys {
            if !state.pods.values().any(|refs| refs.keys.contains(&key))
                && let Some(item) = state.items.remove(&key)
            {
                item.task.abort();
            }
        }
    }

    /// The object `namespace/name`: `None` when it does not exist.
    ///
    /// # Errors
    /// [`CacheError::NotRegistered`] when no pod references it, [`CacheError::NotSynced`]
    /// when its watch has not listed it within a second.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<Option<Arc<K>>, CacheError> {
        let key = (namespace.to_owned(), name.to_owned());
        let seen = lock(&self.state).items.get(&key).map(|i| i.seen.clone());
        let Some(mut seen) = seen else {
            return Err(CacheError::NotRegistered {
                namespace: key.0,
                name: key.1,
            });
        };
        let synced = tokio::time::timeout(SYNC_WAIT, seen.wait_for(Option::is_some)).await;
        match synced {
            Ok(Ok(value)) => Ok(value.clone().flatten()),
            _ => Err(CacheError::NotSynced {
                resource: K::RESOURCE,
            }),
        }
    }

    /// Counts a change of `key` for the pods that reference it; their UIDs.
    fn changed(state: &Mutex<State<K>>, key: &Key) -> Vec<String> {
        let mut state = lock(state);
        let referencing = state
            .pods
            .iter_mut()
            .filter(|(_, refs)| refs.keys.contains(key));
        referencing
            .map(|(uid, refs)| {
                refs.changes += 1;
                uid.clone()
            })
            .collect()
    }

    /// Starts the watch of one object.
    fn watch(&self, key: Key) -> Item<K> {
        let (tx, seen) = watch::channel(None);
        let api: kube::Api<K> = kube::Api::namespaced(self.client.clone(), &key.0);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", key.1));
        let state = Arc::downgrade(&self.state);
        let wake = self.wake.clone();
        let task = tokio::spawn(async move {
            let stream = watcher::watcher(api, config);
            let mut stream = std::pin::pin!(stream);
            let mut retry = crate::backoff::WatchRetry::default();
            // The objects of a (re)list, published when it is complete.
            let mut listing: Option<Arc<K>> = None;
            loop {
                let now = match stream.try_next().await {
                    Ok(Some(Event::Init)) => {
                        listing = None;
                        continue;
                    }
                    Ok(Some(Event::InitApply(object))) => {
                        listing = Some(Arc::new(object));
                        continue;
                    }
                    Ok(Some(Event::InitDone)) => listing.take(),
                    Ok(Some(Event::Apply(object))) => Some(Arc::new(object)),
                    Ok(Some(Event::Delete(_))) => None,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, resource = K::RESOURCE, namespace = %key.0, name = %key.1, "watch failed; retrying");
                        retry.pause(&e).await;
                        continue;
                    }
                };
                let immutable = now.as_ref().is_some_and(|o| o.immutable());
                if publish(&tx, now)
                    && let Some(state) = state.upgrade()
                {
                    for uid in Self::changed(&state, &key) {
                        wake(&uid, WakeFor::Sync);
                    }
                }
                if immutable {
                    tracing::debug!(resource = K::RESOURCE, namespace = %key.0, name = %key.1, "immutable; not watched further");
                    break;
                }
            }
        });
        Item {
            seen,
            task: task.abort_handle(),
        }
    }
}

impl<K: Referenced> Drop for ObjectCache<K> {
    fn drop(&mut self) {
        for item in lock(&self.state).items.values() {
            item.task.abort();
        }
    }
}

/// Publishes what the watch sees now; true when an object seen before changed (not on
/// the first list, nor when a relist brings the same version).
fn publish<K: Resource>(tx: &watch::Sender<Seen<K>>, now: Option<Arc<K>>) -> bool {
    let version = |o: &Option<Arc<K>>| o.as_ref().map(|o| o.meta().resource_version.clone());
    let mut changed = false;
    tx.send_modify(|seen| {
        changed = seen
            .as_ref()
            .is_some_and(|before| version(before) != version(&now));
        *seen = Some(now);
    });
    changed
}

/// Where a pod names objects of one kind: in volumes, projections, `envFrom` and
/// `valueFrom` key references.
struct Places {
    volume: fn(&Volume) -> Option<&str>,
    projection: fn(&VolumeProjection) -> Option<&str>,
    env_from: fn(&EnvFromSource) -> Option<&str>,
    value_from: fn(&EnvVarSource) -> Option<&str>,
}

/// The names a pod gives in these places, without empty ones.
fn names_in(pod: &Pod, places: &Places) -> HashSet<String> {
    let mut names = HashSet::new();
    let Some(spec) = &pod.spec else {
        return names;
    };
    for volume in spec.volumes.iter().flatten() {
        names.extend((places.volume)(volume).map(str::to_owned));
        let projected = volume.projected.as_ref().and_then(|p| p.sources.as_ref());
        let sources = projected.into_iter().flatten();
        names.extend(sources.filter_map(|s| (places.projection)(s).map(str::to_owned)));
    }
    // Every container's environment, ephemeral ones' too (the kubelet visits them all).
    let app = crate::pod::containers(pod).map(|c| (&c.env_from, &c.env));
    let ephemeral = crate::pod::ephemeral_containers(pod).map(|c| (&c.env_from, &c.env));
    for (env_from, env) in app.chain(ephemeral) {
        let from = env_from.iter().flatten();
        names.extend(from.filter_map(|e| (places.env_from)(e).map(str::to_owned)));
        let values = env.iter().flatten().filter_map(|e| e.value_from.as_ref());
        names.extend(values.filter_map(|v| (places.value_from)(v).map(str::to_owned)));
    }
    names.remove("");
    names
}

impl Referenced for Secret {
    const RESOURCE: &'static str = "secret";

    fn names(pod: &Pod) -> HashSet<String> {
        let mut names = names_in(
            pod,
            &Places {
                volume: |v| v.secret.as_ref()?.secret_name.as_deref(),
                projection: |p| Some(p.secret.as_ref()?.name.as_str()),
                env_from: |e| Some(e.secret_ref.as_ref()?.name.as_str()),
                value_from: |v| Some(v.secret_key_ref.as_ref()?.name.as_str()),
            },
        );
        let pull = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten());
        names.extend(pull.map(|s| s.name.clone()).filter(|n| !n.is_empty()));
        names
    }

    fn immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

impl Referenced for ConfigMap {
    const RESOURCE: &'static str = "configmap";

    fn names(pod: &Pod) -> HashSet<String> {
        names_in(
            pod,
            &Places {
                volume: |v| Some(v.config_map.as_ref()?.name.as_str()),
                projection: |p| Some(p.config_map.as_ref()?.name.as_str()),
                env_from: |e| Some(e.config_map_ref.as_ref()?.name.as_str()),
                value_from: |v| Some(v.config_map_key_ref.as_ref()?.name.as_str()),
            },
        )
    }

    fn immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

/// The Secret and ConfigMap caches of the node, as one handle.
#[derive(Debug, Clone)]
pub struct SourceCaches {
    /// Secrets referenced by the node's pods.
    pub secrets: Arc<ObjectCache<Secret>>,
    /// ConfigMaps referenced by the node's pods.
    pub config_maps: Arc<ObjectCache<ConfigMap>>,
}

impl SourceCaches {
    /// Both caches over `client`; object changes wake pods through `wake`.
    #[must_use]
    pub fn new(client: &kube::Client, wake: &Wake) -> Self {
        Self {
            secrets: Arc::new(ObjectCache::new(client.clone(), wake.clone())),
            config_maps: Arc::new(ObjectCache::new(client.clone(), wake.clone())),
        }
    }

    /// Records the pod's references in both caches (see [`ObjectCache::register`]).
    pub fn register(&self, uid: &str, pod: &Pod) {
        self.secrets.register(uid, pod);
        self.config_maps.register(uid, pod);
    }

    /// Changes seen to the pod's Secrets and ConfigMaps (see [`ObjectCache::changes`]).
    #[must_use]
    pub fn changes(&self, uid: &str) -> u64 {
        self.secrets.changes(uid) + self.config_maps.changes(uid)
    }
}

/// The pod's references: watches no pod needs any more stop.
impl ForgetPod for SourceCaches {
    fn name(&self) -> &'static str {
        "secret and configmap references"
    }

    fn holds(&self, uid: &str) -> bool {
        self.secrets.holds(uid) || self.config_maps.holds(uid)
    }

    fn forget(&self, uid: &str) {
        self.secrets.unregister(uid);
        self.config_maps.unregister(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_with(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn sorted(set: HashSet<String>) -> Vec<String> {
        let mut v: Vec<_> = set.into_iter().collect();
        v.sort();
        v
    }

    #[test]
    fn references_come_from_volumes_env_env_from_and_pull_secrets() {
        let pod = pod_with(serde_json::json!({
            "imagePullSecrets": [{"name": "pull"}],
            "volumes": [
                {"name": "a", "secret": {"secretName": "vol-secret"}},
                {"name": "b", "configMap": {"name": "vol-cm"}},
                {"name": "c", "projected": {"sources": [
                    {"secret": {"name": "proj-secret"}},
                    {"configMap": {"name": "proj-cm"}},
                    {"serviceAccountToken": {"path": "token"}}
                ]}}
            ],
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-secret"}}]}],
            "containers": [{"name": "c", "env": [
                {"name": "A", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}},
                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}},
                {"name": "C", "value": "plain"}
            ], "envFrom": [{"configMapRef": {"name": "from-cm"}}]}],
            "ephemeralContainers": [{"name": "debugger", "env": [
                {"name": "D", "valueFrom": {"secretKeyRef": {"name": "debug-secret", "key": "k"}}}
            ]}]
        }));
        assert_eq!(
            sorted(Secret::names(&pod)),
            [
                "debug-secret",
                "env-secret",
                "init-secret",
                "proj-secret",
                "pull",
                "vol-secret"
            ]
        );
        assert_eq!(
            sorted(ConfigMap::names(&pod)),
            ["env-cm", "from-cm", "proj-cm", "vol-cm"]
        );
    }

    fn secret(version: &str) -> Option<Arc<Secret>> {
        let mut s = Secret::default();
        s.metadata.resource_version = Some(version.into());
        Some(Arc::new(s))
    }

    #[tokio::test]
    async fn watches_are_shared_by_pods_and_stop_with_the_last() {
        // A server that is not there: the watches never list.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let cache: ObjectCache<Secret> = ObjectCache::new(client, Arc::new(|_: &str, _| {}));
        let volume = |name: &str| {
            pod_with(
                serde_json::json!({"volumes": [{"name": "v", "secret": {"secretName": name}}]}),
            )
        };
        cache.register("a", &volume("shared"));
        cache.register("b", &volume("shared"));
        cache.register("b", &volume("shared"));
        let watched = || {
            let state = lock(&cache.state);
            let mut keys: Vec<_> = state.items.keys().map(|k| k.1.clone()).collect();
            keys.sort();
            keys
        };
        assert_eq!(watched(), ["shared"]);
        cache.register("b", &volume("other"));
        assert_eq!(watched(), ["other", "shared"]);
        cache.unregister("a");
        assert_eq!(watched(), ["other"]);
        assert_eq!(
            cache.get("ns", "shared").await,
            Err(CacheError::NotRegistered {
                namespace: "ns".into(),
                name: "shared".into()
            })
        );
        assert_eq!(
            cache.get("ns", "other").await.unwrap_err().to_string(),
            "failed to sync secret cache: timed out waiting for the condition"
        );
        cache.unregister("b");
        assert!(watched().is_empty());
        assert_eq!(cache.changes("b"), 0);
    }

    #[test]
    fn only_changes_after_the_first_list_count() {
        let (tx, rx) = watch::channel(None);
        assert!(!publish(&tx, secret("1")), "the first list is no change");
        assert!(!publish(&tx, secret("1")), "a relist of the same version");
        assert!(publish(&tx, secret("2")));
        assert!(publish(&tx, None), "a deletion");
        assert!(!publish(&tx, None));
        assert_eq!(*rx.borrow(), Some(None));
    }
}
