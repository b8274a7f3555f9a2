//! The pod source: a kube-rs watcher on the Pods bound to this node
//! (`spec.nodeName=<node>`), reflected into a store, each change handed to the pod
//! workers. The store is the agent's view of which pods should exist; after the first
//! full list (`InitDone`) it is authoritative, and pods the runtime holds that are not in it
//! are orphans. Each pod passes [`PodAdmission`] before its worker sees it: new pods one
//! by one as they come, the pods of a full list together in creation order (the
//! kubelet's `HandlePodAdditions`). Mirror pods (the API's copies of static pods) are
//! not run: they go to [`PodAdmission::mirror`] and wake the mirror pods' reconciliation.
//! Every pod is stamped `kubernetes.io/config.source: api` on arrival: a pod that claims
//! another source in its own annotations is still an API pod, never a static one.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::ResourceExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

use super::PodId;
use super::store::{PodAdmission, PodStore, StaticPods};
use super::workers::{PodSyncer, PodWork, PodWorkers};
use crate::kubetypes::{API_SOURCE, is_mirror_pod, stamp_source};

/// Starts the watch; returns the store, and the task that feeds the workers until the
/// process ends. Watch errors are retried with the watcher's default back-off.
pub fn start<S: PodSyncer, A: PodAdmission>(
    client: kube::Client,
    node_name: &str,
    workers: PodWorkers<S>,
    admission: Arc<A>,
    statics: StaticPods,
) -> (PodStore, impl Future<Output = ()> + Send + use<S, A>) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let (store, writer) = reflector::store();
    let (synced_tx, synced) = watch::channel(false);
    // No back-off on the stream: the feed waits as the kubelet's reflector does.
    let stream = watcher::watcher(api, config)
        .modify(received)
        .reflect(writer);
    let mut feeder = Feeder {
        store: store.clone(),
        workers,
        admission,
        synced: synced_tx,
        listed: Vec::new(),
        statics: statics.clone(),
    };
    let feed = async move {
        let mut stream = std::pin::pin!(stream);
        let mut retry = crate::backoff::WatchRetry::default();
        loop {
            match stream.try_next().await {
                Ok(Some(event)) => feeder.handle(event),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "pod watch failed; retrying");
                    retry.pause(&e).await;
                }
            }
        }
        tracing::error!("pod watch ended");
    };
    (
        PodStore {
            store,
            synced,
            statics,
        },
        feed,
    )
}

/// What is done to each pod the watch delivers, before the store or anyone else sees it:
/// its managed fields go, and it is stamped with the source that delivered it (the
/// kubelet's pod config), so a `kubernetes.io/config.source` its author wrote is not
/// believed.
fn received(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    stamp_source(pod, API_SOURCE);
}

/// Hands watch events to admission and the workers.
struct Feeder<S, A> {
    store: Store<Pod>,
    workers: PodWorkers<S>,
    admission: Arc<A>,
    synced: watch::Sender<bool>,
    /// The pods of a full list under way, dispatched together at its end.
    listed: Vec<Pod>,
    /// The static pods: their workers are not the API's to end.
    statics: StaticPods,
}

impl<S: PodSyncer, A: PodAdmission> Feeder<S, A> {
    fn dispatch(&self, pod: Pod) {
        if is_mirror_pod(&pod) {
            self.admission.mirror(&pod, true);
            self.statics.notify();
            return;
        }
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        // The worker shares the store's copy of the pod when the store holds this version.
        let shared = self
            .store
            .get(&ObjectRef::from_obj(&pod))
            .filter(|s| s.metadata.resource_version == pod.metadata.resource_version)
            .unwrap_or_else(|| Arc::new(pod));
        self.admission.admit(&shared);
        self.admission.observed(&shared);
        self.workers.update(&uid, PodWork::Sync(shared));
    }

    fn handle(&mut self, event: Event<Pod>) {
        match event {
            Event::Apply(pod) => self.dispatch(pod),
            Event::InitApply(pod) => self.listed.push(pod),
            Event::Delete(pod) if is_mirror_pod(&pod) => {
                self.admission.mirror(&pod, false);
                self.statics.notify();
            }
            Event::Delete(pod) => {
                if let Some(id) = PodId::of(&pod) {
                    tracing::info!(pod = %id, "pod removed from the API");
                    self.admission.forget(&id.uid);
                    self.workers.update(&id.uid.clone(), PodWork::Remove(id));
                }
            }
            Event::Init => self.listed.clear(),
            Event::InitDone => {
                let mut listed = std::mem::take(&mut self.listed);
                let mut uids: HashSet<String> = listed
                    .iter()
                    .filter_map(|p| p.metadata.uid.clone())
                    .collect();
                uids.extend(self.statics.uids());
                self.admission.retain(&uids);
                // Pods deleted while the watch was down get no Delete event.
                self.workers.remove_unlisted(&uids);
                listed.sort_by(|a, b| {
                    a.metadata
                        .creation_timestamp
                        .cmp(&b.metadata.creation_timestamp)
                });
                for pod in listed {
                    self.dispatch(pod);
                }
                self.synced.send_replace(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::pod::state::PodStates;
    use crate::pod::testing::pod;
    use crate::pod::workers::Next;

    /// Records what admission was asked, in order.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Recorder {
        fn push(&self, what: String) {
            self.0.lock().unwrap().push(what);
        }

        fn take(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    impl PodAdmission for Recorder {
        fn admit(&self, pod: &Arc<Pod>) {
            self.push(format!(
                "admit {}",
                pod.metadata.name.clone().unwrap_or_default()
            ));
        }
        fn forget(&self, uid: &str) {
            self.push(format!("forget {uid}"));
        }
        fn retain(&self, listed: &HashSet<String>) {
            let mut uids: Vec<&String> = listed.iter().collect();
            uids.sort();
            self.push(format!("retain {uids:?}"));
        }
        fn observed(&self, pod: &Pod) {
            self.push(format!(
                "observed {}",
                pod.metadata.name.clone().unwrap_or_default()
            ));
        }
        fn mirror(&self, pod: &Pod, present: bool) {
            self.push(format!(
                "mirror {} {present}",
                pod.metadata.name.clone().unwrap_or_default()
            ));
        }
    }

    struct Idle;

    impl PodSyncer for Idle {
        async fn sync(&self, _: &PodWork) -> Next {
            Next::ResyncAfter(Duration::from_secs(3600))
        }
    }

    fn created(name: &str, second: i64) -> Pod {
        let mut p = pod(name, &[("c", "busybox")]);
        p.metadata.creation_timestamp = Some(Time(
            Timestamp::from_second(1_700_000_000 + second).unwrap(),
        ));
        p
    }

    /// Mirror pods are not run: admission hears of them as mirrors, no worker starts; a
    /// full list keeps the static pods' workers.
    #[tokio::test]
    async fn mirror_pods_are_not_run_and_static_pods_survive_a_full_list() {
        let (store, _writer) = reflector::store();
        let (synced, _rx) = watch::channel(false);
        let admission = Arc::new(Recorder::default());
        let workers = PodWorkers::new(Arc::new(Idle), PodStates::default());
        let mut feeder = Feeder {
            store,
            workers: workers.clone(),
            admission: admission.clone(),
            synced,
            listed: Vec::new(),
            statics: StaticPods::default(),
        };
        let mirror = Arc::new(created("web-n1", 1));
        let mut mirror = crate::pod::mirror::mirror_of(&mirror, "n1", "node-uid");
        mirror.metadata.uid = Some("mirror-uid".into());
        feeder.handle(Event::Apply(mirror.clone()));
        feeder.handle(Event::Delete(mirror.clone()));
        assert_eq!(
            admission.take(),
            ["mirror web-n1 true", "mirror web-n1 false"]
        );
        assert!(workers.uids().is_empty(), "no worker for a mirror pod");
        // A static pod's worker is not the API's to end.
        workers.update("static-uid", PodWork::Sync(Arc::new(created("web-n1", 1))));
        feeder
            .statics
            .pods
            .write()
            .unwrap()
            .insert("static-uid".into(), Arc::new(created("web-n1", 1)));
        feeder.handle(Event::Init);
        feeder.handle(Event::InitApply(mirror));
        feeder.handle(Event::InitDone);
        assert_eq!(
            admission.take(),
            [
                r#"retain ["mirror-uid", "static-uid"]"#,
                "mirror web-n1 true"
            ]
        );
        assert_eq!(workers.uids(), ["static-uid"]);
    }

    /// A pod that claims to come from a manifest file is stamped with the API as its
    /// source: not static, not critical, scored as the BestEffort pod it is.
    #[test]
    fn an_api_pod_claiming_a_file_source_is_an_api_pod() {
        let mut claimed = pod("claims", &[("c", "busybox")]);
        claimed.metadata.annotations = Some(
            [
                (
                    crate::kubetypes::CONFIG_SOURCE.to_owned(),
                    "file".to_owned(),
                ),
                (
                    crate::kubetypes::CONFIG_HASH.to_owned(),
                    "uid-claims".to_owned(),
                ),
            ]
            .into(),
        );
        assert!(crate::cm::is_critical(&claimed), "what it claims");
        received(&mut claimed);
        assert!(!crate::kubetypes::is_static_pod(&claimed));
        assert!(!crate::cm::is_critical(&claimed));
        let container = &claimed.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            crate::cm::container_oom_score_adj(&claimed, container, 1 << 30),
            crate::cm::BEST_EFFORT_OOM_SCORE_ADJ
        );
        // A pod that says nothing of its source is stamped too.
        let mut plain = pod("plain", &[("c", "busybox")]);
        received(&mut plain);
        assert_eq!(
            plain.metadata.annotations.unwrap()[crate::kubetypes::CONFIG_SOURCE],
            "api"
        );
    }

    #[tokio::test]
    async fn a_full_list_is_admitted_in_creation_order_after_it_ends() {
        let (store, _writer) = reflector::store();
        let (synced, _rx) = watch::channel(false);
        let admission = Arc::new(Recorder::default());
        let mut feeder = Feeder {
            store,
            workers: PodWorkers::new(Arc::new(Idle), PodStates::default()),
            admission: admission.clone(),
            synced,
            listed: Vec::new(),
            statics: StaticPods::default(),
        };
        feeder.handle(Event::Init);
        feeder.handle(Event::InitApply(created("newer", 20)));
        feeder.handle(Event::InitApply(created("older", 10)));
        assert!(admission.take().is_empty(), "nothing before the list ends");
        feeder.handle(Event::InitDone);
        assert_eq!(
            admission.take(),
            [
                r#"retain ["uid-newer", "uid-older"]"#,
                "admit older",
                "observed older",
                "admit newer",
                "observed newer"
            ]
        );
        assert!(*feeder.synced.borrow());
        // Afterwards, pods come one by one; a deleted one is forgotten.
        feeder.handle(Event::Apply(created("later", 30)));
        feeder.handle(Event::Delete(created("older", 10)));
        assert_eq!(
            admission.take(),
            ["admit later", "observed later", "forget uid-older"]
        );
        // A new status alone wakes no worker, but is observed.
        let mut later = created("later", 30);
        later.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        feeder.handle(Event::Apply(later));
        assert_eq!(admission.take(), ["admit later", "observed later"]);
    }
}
