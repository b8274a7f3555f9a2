//! Node objects as last seen, through a watch reflected into a store (the kubelet's node
//! lister behind `getNodeAnyWay`): admission reads this node's labels and allocatable from
//! [`node_lister`], never with a GET per pod; the pod network routes follow every Node
//! through [`nodes_lister`].

use std::future::Future;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;

/// Starts the watch of this node's own Node object; returns the store and the task that
/// keeps it current until the process ends.
pub fn node_lister(
    client: kube::Client,
    node_name: &str,
) -> (Store<Node>, impl Future<Output = ()> + Send + use<>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    nodes_lister(client, config, || {})
}

/// Starts a watch of the Nodes `config` selects; returns the store and the task that keeps
/// it current until the process ends, calling `changed` after every event it reflected.
/// Watch errors are retried as the kubelet's reflector does
/// ([`crate::backoff::WatchRetry`]).
pub fn nodes_lister<F: Fn() + Send + 'static>(
    client: kube::Client,
    config: watcher::Config,
    changed: F,
) -> (Store<Node>, impl Future<Output = ()> + Send + use<F>) {
    let api: kube::Api<Node> = kube::Api::all(client);
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .modify(|node| {
            node.managed_fields_mut().clear();
        })
        .reflect(writer);
    let feed = async move {
        let mut stream = std::pin::pin!(stream);
        let mut retry = crate::backoff::WatchRetry::default();
        loop {
            match stream.try_next().await {
                Ok(Some(_)) => changed(),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "node watch failed; retrying");
                    retry.pause(&e).await;
                }
            }
        }
        tracing::error!("node watch ended");
    };
    (store, feed)
}
