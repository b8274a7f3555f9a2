//! Mirror pods: the API's copy of each static pod (the kubelet's `MirrorClient` and the
//! mirror part of `syncPod` and `HandlePodCleanups`). A mirror pod carries the static pod's
//! hash in `kubernetes.io/config.mirror` and a controller reference to the Node (what the
//! NodeRestriction admission plugin lets a node create); it is created for each static pod,
//! deleted and created again when it is being deleted or mirrors another version of the
//! pod, and deleted when its static pod is gone. Mirror pods are never run: the static pod
//! is; its status is written to the mirror pod by the status manager.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::PostParams;
use tokio_util::sync::CancellationToken;

use super::PodId;
use super::store::{PodStore, StaticPods};
use crate::kubetypes::{CONFIG_HASH, CONFIG_MIRROR, annotation, is_mirror_pod, mirrored_uid};

/// Mirror pods are checked again this often even when nothing was seen to change.
const RESYNC: Duration = Duration::from_secs(10);

/// Errors of the mirror pods' API calls.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The Node (the owner of mirror pods) could not be read.
    #[error("failed to get node UID of {node}: {reason}")]
    Node {
        /// The node's name.
        node: String,
        /// Why.
        reason: String,
    },
    /// The mirror pod could not be created.
    #[error("failed creating a mirror pod for {pod}: {reason}")]
    Create {
        /// The static pod.
        pod: String,
        /// The API's answer.
        reason: String,
    },
    /// The mirror pod could not be deleted.
    #[error("failed deleting mirror pod {pod}: {reason}")]
    Delete {
        /// The mirror pod.
        pod: PodId,
        /// The API's answer.
        reason: String,
    },
}

/// The API calls about mirror pods: the API server, or a fake in tests.
pub trait MirrorClient: Send + Sync + 'static {
    /// The UID of this node's Node object.
    fn node_uid(&self) -> impl Future<Output = Result<String, MirrorError>> + Send;
    /// Creates the mirror pod; `false` when one of its name already exists.
    fn create(&self, mirror: Pod) -> impl Future<Output = Result<bool, MirrorError>> + Send;
    /// Deletes the mirror pod now (grace 0, its UID as precondition); `false` when it was
    /// gone already.
    fn delete(&self, mirror: &PodId) -> impl Future<Output = Result<bool, MirrorError>> + Send;
}

/// The API server as [`MirrorClient`].
#[derive(Clone)]
pub struct KubeMirrorClient {
    client: kube::Client,
    node_name: String,
}

impl KubeMirrorClient {
    /// A client for the node `node_name`.
    #[must_use]
    pub fn new(client: kube::Client, node_name: String) -> Self {
        Self { client, node_name }
    }
}

impl MirrorClient for KubeMirrorClient {
    async fn node_uid(&self) -> Result<String, MirrorError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let error = |reason: String| MirrorError::Node {
            node: self.node_name.clone(),
            reason,
        };
        let node = api
            .get(&self.node_name)
            .await
            .map_err(|e| error(e.to_string()))?;
        node.metadata
            .uid
            .ok_or_else(|| error("UID unset".to_owned()))
    }

    async fn create(&self, mirror: Pod) -> Result<bool, MirrorError> {
        let namespace = mirror.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &mirror).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(MirrorError::Create {
                pod: format!("{namespace}/{}", mirror.metadata.name.unwrap_or_default()),
                reason: e.to_string(),
            }),
        }
    }

    async fn delete(&self, mirror: &PodId) -> Result<bool, MirrorError> {
        super::delete_now(&self.client, mirror)
            .await
            .map_err(|e| MirrorError::Delete {
                pod: mirror.clone(),
                reason: e.to_string(),
            })
    }
}

/// What must be done to bring the mirror pods in line with the static pods.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Delete this mirror pod.
    Delete(PodId),
    /// Create the mirror pod of this static pod.
    Create(Arc<Pod>),
}

fn key(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The actions that make `api` (the pods bound to this node) hold exactly one up-to-date
/// mirror pod per static pod: a missing one is created; one being deleted, or mirroring
/// another version of the pod, is deleted and created again; one whose static pod is gone
/// is deleted. An API pod that is not a mirror pod is left alone (creating the mirror pod
/// over it fails, as with the kubelet).
#[must_use]
pub fn plan(statics: &[Arc<Pod>], api: &[Arc<Pod>]) -> Vec<Action> {
    let api: HashMap<(String, String), &Arc<Pod>> = api.iter().map(|p| (key(p), p)).collect();
    let statics: BTreeMap<(String, String), &Arc<Pod>> =
        statics.iter().map(|p| (key(p), p)).collect();
    let mut actions = Vec::new();
    for (name, pod) in &statics {
        match api.get(name) {
            None => actions.push(Action::Create(Arc::clone(pod))),
            Some(mirror) if !is_mirror_pod(mirror) => {
                tracing::debug!(pod = ?name, "an API pod that is no mirror pod has the static pod's name");
            }
            Some(mirror) => {
                let stale = mirror.metadata.deletion_timestamp.is_some()
                    || mirrored_uid(mirror) != annotation(pod, CONFIG_HASH);
                if let (true, Some(id)) = (stale, PodId::of(mirror)) {
                    actions.push(Action::Delete(id));
                    actions.push(Action::Create(Arc::clone(pod)));
                }
            }
        }
    }
    let mut orphans: Vec<PodId> = api
        .iter()
        .filter(|(name, pod)| is_mirror_pod(pod) && !statics.contains_key(*name))
        .filter_map(|(_, pod)| PodId::of(pod))
        .collect();
    orphans.sort();
    actions.extend(orphans.into_iter().map(Action::Delete));
    actions
}

/// The mirror pod of a static pod: the pod with the mirror annotation and the Node as its
/// controller.
#[must_use]
pub fn mirror_of(pod: &Pod, node_name: &str, node_uid: &str) -> Pod {
    let mut mirror = pod.clone();
    let hash = annotation(pod, CONFIG_HASH).unwrap_or_default().to_owned();
    let meta = &mut mirror.metadata;
    meta.uid = None;
    meta.resource_version = None;
    meta.self_link = None;
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_MIRROR.to_owned(), hash);
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node_name.to_owned(),
        uid: node_uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    mirror.status = None;
    mirror
}

/// Carries out [`plan`]; failures are logged, and retried at the next round.
pub async fn reconcile<M: MirrorClient>(
    client: &M,
    node_name: &str,
    statics: &[Arc<Pod>],
    api: &[Arc<Pod>],
) {
    let mut node_uid: Option<String> = None;
    for action in plan(statics, api) {
        match action {
            Action::Delete(id) => match client.delete(&id).await {
                Ok(true) => tracing::info!(pod = %id, "deleted mirror pod"),
                Ok(false) => tracing::debug!(pod = %id, "mirror pod gone already"),
                Err(e) => tracing::warn!(error = %e, "could not delete mirror pod"),
            },
            Action::Create(pod) => {
                let uid = match node_uid.clone() {
                    Some(uid) => uid,
                    None => match client.node_uid().await {
                        Ok(uid) => node_uid.insert(uid).clone(),
                        Err(e) => {
                            tracing::warn!(error = %e, "could not create mirror pod");
                            continue;
                        }
                    },
                };
                let (namespace, name) = key(&pod);
                let name = format!("{namespace}/{name}");
                match client.create(mirror_of(&pod, node_name, &uid)).await {
                    Ok(true) => tracing::info!(pod = name, "created mirror pod"),
                    Ok(false) => tracing::debug!(pod = name, "mirror pod exists already"),
                    Err(e) => tracing::warn!(error = %e, "could not create mirror pod"),
                }
            }
        }
    }
}

/// Keeps the mirror pods in line with the static pods until `cancel` fires: once the API
/// pods are listed, at each change of the static pods or of a mirror pod, and every
/// [`RESYNC`].
pub async fn run<M: MirrorClient>(
    client: M,
    node_name: String,
    statics: StaticPods,
    store: PodStore,
    cancel: CancellationToken,
) {
    let mut synced = store.synced.clone();
    if synced.wait_for(|s| *s).await.is_err() {
        return;
    }
    // A mirror pod whose manifest was not read yet is no orphan.
    statics.listed().await;
    loop {
        reconcile(&client, &node_name, &statics.pods(), &store.store.state()).await;
        tokio::select! {
            () = cancel.cancelled() => return,
            () = statics.changed() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::kubetypes::{CONFIG_SOURCE, is_static_pod};
    use crate::pod::testing::pod;

    fn static_pod(name: &str, hash: &str) -> Arc<Pod> {
        let mut p = pod(name, &[("c", "busybox")]);
        p.metadata.uid = Some(hash.into());
        p.metadata.annotations = Some(
            [
                (CONFIG_HASH.to_owned(), hash.to_owned()),
                (CONFIG_SOURCE.to_owned(), "file".to_owned()),
            ]
            .into(),
        );
        Arc::new(p)
    }

    fn mirror_pod(name: &str, hash: &str, uid: &str) -> Arc<Pod> {
        let mut p = mirror_of(&static_pod(name, hash), "n1", "node-uid");
        p.metadata.uid = Some(uid.into());
        Arc::new(p)
    }

    fn id(name: &str, uid: &str) -> PodId {
        PodId {
            uid: uid.into(),
            namespace: "default".into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_mirror_pod_carries_the_hash_and_the_node_as_controller() {
        let m = mirror_of(&static_pod("web-n1", "h1"), "n1", "node-uid");
        assert!(is_mirror_pod(&m));
        assert!(is_static_pod(&m), "the source annotation is kept");
        assert_eq!(mirrored_uid(&m), Some("h1"));
        assert_eq!(m.metadata.uid, None, "the API gives it its own UID");
        let owner = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str(),
                owner.controller
            ),
            ("v1", "Node", "n1", "node-uid", Some(true))
        );
        assert!(crate::cm::is_critical(&static_pod("web-n1", "h1")));
        assert!(crate::cm::is_critical(&m));
        assert!(!is_mirror_pod(&pod("api", &[])));
        assert!(!is_static_pod(&pod("api", &[])));
    }

    #[test]
    fn missing_stale_deleting_and_orphaned_mirror_pods() {
        let statics = [
            static_pod("a", "ha"),
            static_pod("b", "hb2"),
            static_pod("c", "hc"),
            static_pod("d", "hd"),
            static_pod("e", "he"),
        ];
        let mut deleting = (*mirror_pod("c", "hc", "mc")).clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let api = [
            // a: none. b: mirrors an older version. c: being deleted. d: up to date.
            mirror_pod("b", "hb1", "mb"),
            Arc::new(deleting),
            mirror_pod("d", "hd", "md"),
            // e: a pod of the API, not a mirror pod: left alone.
            Arc::new(pod("e", &[("c", "nginx")])),
            // An orphan, and another API pod.
            mirror_pod("gone", "hg", "mg"),
            Arc::new(pod("other", &[("c", "nginx")])),
        ];
        assert_eq!(
            plan(&statics, &api),
            [
                Action::Create(statics[0].clone()),
                Action::Delete(id("b", "mb")),
                Action::Create(statics[1].clone()),
                Action::Delete(id("c", "mc")),
                Action::Create(statics[2].clone()),
                Action::Delete(id("gone", "mg")),
            ]
        );
        assert!(plan(&[], &[Arc::new(pod("other", &[]))]).is_empty());
    }

    /// Records the calls; fails node look-ups when asked.
    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<String>>,
        no_node: bool,
    }

    impl MirrorClient for Fake {
        async fn node_uid(&self) -> Result<String, MirrorError> {
            self.calls.lock().unwrap().push("node".into());
            if self.no_node {
                return Err(MirrorError::Node {
                    node: "n1".into(),
                    reason: "not found".into(),
                });
            }
            Ok("node-uid".into())
        }
        async fn create(&self, mirror: Pod) -> Result<bool, MirrorError> {
            let owner = &mirror.metadata.owner_references.as_ref().unwrap()[0].uid;
            self.calls.lock().unwrap().push(format!(
                "create {} {} {owner}",
                mirror.metadata.name.unwrap(),
                mirrored_uid_owned(&mirror.metadata.annotations)
            ));
            Ok(true)
        }
        async fn delete(&self, mirror: &PodId) -> Result<bool, MirrorError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("delete {} {}", mirror.name, mirror.uid));
            Ok(true)
        }
    }

    fn mirrored_uid_owned(a: &Option<BTreeMap<String, String>>) -> String {
        a.as_ref().unwrap()[CONFIG_MIRROR].clone()
    }

    #[tokio::test]
    async fn reconcile_deletes_before_it_creates_and_reads_the_node_once() {
        let fake = Fake::default();
        let statics = [static_pod("a", "ha"), static_pod("b", "hb2")];
        let api = [mirror_pod("b", "hb1", "mb"), mirror_pod("gone", "hg", "mg")];
        reconcile(&fake, "n1", &statics, &api).await;
        assert_eq!(
            *fake.calls.lock().unwrap(),
            [
                "node",
                "create a ha node-uid",
                "delete b mb",
                "create b hb2 node-uid",
                "delete gone mg"
            ]
        );
        // Without the Node, nothing is created; orphans still go.
        let fake = Fake {
            no_node: true,
            ..Fake::default()
        };
        reconcile(&fake, "n1", &statics, &api).await;
        assert_eq!(
            *fake.calls.lock().unwrap(),
            ["node", "delete b mb", "node", "delete gone mg"]
        );
    }
}
