//! The pod source: a kube-rs watcher on the Pods bound to this node
//! (`spec.nodeName=<node>`), reflected into a store, each change handed to the pod
//! workers. The store is the agent's view of which pods should exist; after the first
//! full list (`InitDone`) it is authoritative, and pods the runtime holds that are not in it
//! are orphans.

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
use super::workers::{PodSyncer, PodWork, PodWorkers};

/// The reflector's store, and whether its first full list has completed.
#[derive(Clone)]
pub struct PodStore {
    /// The pods bound to this node, as last seen.
    pub store: Store<Pod>,
    /// True once the first full list is in the store.
    pub synced: watch::Receiver<bool>,
}

/// Starts the watch; returns the store, and the task that feeds the workers until the
/// process ends. Watch errors are retried with the watcher's default back-off.
pub fn start<S: PodSyncer>(
    client: kube::Client,
    node_name: &str,
    workers: PodWorkers<S>,
) -> (PodStore, impl Future<Output = ()> + Send + use<S>) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let (store, writer) = reflector::store();
    let (synced_tx, synced) = watch::channel(false);
    let stream = watcher::watcher(api, config)
        .default_backoff()
        .modify(|pod| {
            pod.managed_fields_mut().clear();
        })
        .reflect(writer);
    let shared = store.clone();
    let feed = async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(event)) => handle(event, &shared, &workers, &synced_tx),
                Ok(None) => break,
                Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
            }
        }
        tracing::error!("pod watch ended");
    };
    (PodStore { store, synced }, feed)
}

fn handle<S: PodSyncer>(
    event: Event<Pod>,
    store: &Store<Pod>,
    workers: &PodWorkers<S>,
    synced: &watch::Sender<bool>,
) {
    match event {
        Event::Apply(pod) | Event::InitApply(pod) => {
            let Some(uid) = pod.metadata.uid.clone() else {
                return;
            };
            // The worker shares the store's copy of the pod, once the store has this
            // version (during the first list it has not yet).
            let shared = store
                .get(&ObjectRef::from_obj(&pod))
                .filter(|s| s.metadata.resource_version == pod.metadata.resource_version)
                .unwrap_or_else(|| Arc::new(pod));
            workers.update(&uid, PodWork::Sync(shared));
        }
        Event::Delete(pod) => {
            if let Some(id) = PodId::of(&pod) {
                tracing::info!(pod = %id, "pod removed from the API");
                workers.update(&id.uid.clone(), PodWork::Remove(id));
            }
        }
        Event::Init => {}
        Event::InitDone => {
            synced.send_replace(true);
        }
    }
}
