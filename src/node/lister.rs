//! This agent's own Node object as last seen, through a watch on `metadata.name=<node>`
//! reflected into a store (the kubelet's node lister behind `getNodeAnyWay`): admission
//! reads the node's labels and allocatable from it, never with a GET per pod.

use std::future::Future;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;

/// Starts the watch; returns the store and the task that keeps it current until the
/// process ends. Watch errors are retried as the kubelet's reflector does
/// ([`crate::kubeclient::WatchRetry`]).
pub fn node_lister(
    client: kube::Client,
    node_name: &str,
) -> (Store<Node>, impl Future<Output = ()> + Send + use<>) {
    let api: kube::Api<Node> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .modify(|node| {
            node.managed_fields_mut().clear();
        })
        .reflect(writer);
    let feed = async move {
        let mut stream = std::pin::pin!(stream);
        let mut retry = crate::kubeclient::WatchRetry::default();
        loop {
            match stream.try_next().await {
                Ok(Some(_)) => {}
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
