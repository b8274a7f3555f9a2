//! Registration, like the kubelet's `registerWithAPIServer`: create the Node with its
//! labels and a first status, or adopt the Node of the same name that already exists
//! (`tryRegisterWithAPIServer` + `reconcileExistingNode`), retrying with exponential
//! back-off until the API server accepts it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use super::status::{self, set_node_status};
use super::{NodeAgent, NodeConfig, NodeError, go_arch, sleep_or_cancel};

/// First and longest pause between registration attempts.
const REGISTER_BACKOFF_INITIAL: Duration = Duration::from_millis(200);
const REGISTER_BACKOFF_MAX: Duration = Duration::from_secs(7);

/// The Node's labels: the kubelet's defaults (hostname, OS and architecture, stable and
/// beta), then the configured extra labels.
pub(crate) fn node_labels(config: &NodeConfig) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", config.hostname.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", go_arch()),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", go_arch()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (key, value) in &config.labels {
        if let Some(default) = labels.insert(key.clone(), value.clone())
            && default != *value
        {
            tracing::warn!(label = %key, value, default, "a node label overrides a default label");
        }
    }
    labels
}

impl NodeAgent {
    /// Registers the node: creates its Node, with labels and a first full status, or
    /// adopts the existing Node of that name, bringing its labels and status up to date.
    /// Retries every failure with exponential back-off (200 ms doubling to 7 s) until it
    /// succeeds or `cancel` fires. Returns the Node as the API server holds it.
    ///
    /// # Errors
    /// Only [`NodeError::Cancelled`]: every other failure is logged and retried.
    #[tracing::instrument(skip_all, fields(node = %self.config.name))]
    pub async fn register(&self, cancel: &CancellationToken) -> Result<Node, NodeError> {
        let started = Instant::now();
        let mut delay = REGISTER_BACKOFF_INITIAL;
        loop {
            tracing::info!("attempting to register node");
            let attempt = tokio::select! {
                () = cancel.cancelled() => None,
                result = self.try_register() => Some(result),
            };
            let Some(attempt) = attempt else {
                return Err(self.cancelled("register Node"));
            };
            match attempt {
                Ok(node) => {
                    tracing::info!(
                        uid = node.metadata.uid.as_deref(),
                        elapsed_ms = started.elapsed().as_millis(),
                        "successfully registered node"
                    );
                    return Ok(node);
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    retry_in = ?delay,
                    "unable to register node with the API server"
                ),
            }
            if !sleep_or_cancel(cancel, delay).await {
                return Err(self.cancelled("register Node"));
            }
            delay = (delay * 2).min(REGISTER_BACKOFF_MAX);
        }
    }

    async fn try_register(&self) -> Result<Node, NodeError> {
        let mut state = self.state.lock().await;
        let (obs, pressure) = self.observe(&mut state).await;
        let mut node_status = NodeStatus::default();
        set_node_status(
            &mut node_status,
            &self.config,
            &obs,
            pressure,
            &status::now(),
        );
        let node = Node {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                labels: Some(node_labels(&self.config)),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: self.config.provider_id.clone(),
                taints: Some(self.config.register_with_taints.clone())
                    .filter(|taints| !taints.is_empty()),
                ..NodeSpec::default()
            }),
            status: Some(node_status),
        };
        // A Node may be created with its status, which saves a round trip.
        match self.nodes.create(&PostParams::default(), &node).await {
            Ok(created) => {
                state.last_report = Some(Instant::now());
                return Ok(created);
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(source) => return Err(self.api_error("create Node", source)),
        }
        tracing::info!("node was previously registered, adopting it");
        let existing = self
            .nodes
            .get(&self.config.name)
            .await
            .map_err(|e| self.api_error("get existing Node", e))?;
        let existing = self.reconcile_labels(existing).await?;
        let (status, _) = self.compute_status(&existing, &obs, pressure);
        self.send_status(existing.status.as_ref(), &status, &mut state)
            .await
    }

    /// Sets the labels this agent owns where the existing Node's differ. Other labels
    /// (set by administrators) are left alone.
    async fn reconcile_labels(&self, existing: Node) -> Result<Node, NodeError> {
        let current = existing.metadata.labels.clone().unwrap_or_default();
        let changed: BTreeMap<String, String> = node_labels(&self.config)
            .into_iter()
            .filter(|(k, v)| current.get(k) != Some(v))
            .collect();
        if changed.is_empty() {
            return Ok(existing);
        }
        tracing::info!(labels = ?changed.keys().collect::<Vec<_>>(), "reconciling the existing node's labels");
        let patch = serde_json::json!({ "metadata": { "labels": changed } });
        self.nodes
            .patch(
                &self.config.name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await
            .map_err(|e| self.api_error("patch Node labels", e))
    }

    fn cancelled(&self, operation: &'static str) -> NodeError {
        NodeError::Cancelled {
            operation,
            node: self.config.name.clone(),
        }
    }

    fn api_error(&self, operation: &'static str, source: kube::Error) -> NodeError {
        NodeError::Api {
            operation,
            node: self.config.name.clone(),
            source,
        }
    }
}

/// Waits until kube-controller-manager has allocated the node's pod CIDR
/// (`spec.podCIDR`), watching the Node, and returns it (e.g. `10.244.0.0/24`).
///
/// # Errors
/// [`NodeError::PodCidrTimeout`] when none is set within `timeout` (the controller
/// manager is down, or runs without `--allocate-node-cidrs`).
#[tracing::instrument(skip(client))]
pub async fn wait_for_pod_cidr(
    client: &kube::Client,
    name: &str,
    timeout: Duration,
) -> Result<String, NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(nodes, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let wait = async {
        while let Some(item) = stream.next().await {
            match item {
                Ok(node) => {
                    if let Some(cidr) = node.spec.and_then(|s| s.pod_cidr).filter(|c| !c.is_empty())
                    {
                        return Some(cidr);
                    }
                    tracing::debug!("node has no pod CIDR yet");
                }
                Err(e) => tracing::warn!(error = %e, "watching the node for its pod CIDR"),
            }
        }
        None
    };
    match tokio::time::timeout(timeout, wait).await {
        Ok(Some(cidr)) => {
            tracing::info!(pod_cidr = %cidr, "node has a pod CIDR");
            Ok(cidr)
        }
        Ok(None) | Err(_) => Err(NodeError::PodCidrTimeout {
            node: name.to_owned(),
            after: timeout,
        }),
    }
}

/// The pod CIDR to start with: the registered Node's, else `--pod-cidr` (the kubelet's
/// standalone CIDR); `None` means waiting for the controller manager's.
#[must_use]
pub fn pod_cidr_at_start(registered: &Node, configured: Option<&str>) -> Option<String> {
    let from_node = registered
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidr.clone())
        .filter(|c| !c.is_empty());
    from_node.or_else(|| {
        let configured = configured.filter(|c| !c.is_empty())?;
        tracing::info!(pod_cidr = %configured, "the node has no pod CIDR: using --pod-cidr");
        Some(configured.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_pod_cidr_wins_over_the_configured_one() {
        let with = |cidr: Option<&str>| Node {
            spec: Some(NodeSpec {
                pod_cidr: cidr.map(str::to_owned),
                ..NodeSpec::default()
            }),
            ..Node::default()
        };
        let node = with(Some("10.244.1.0/24"));
        assert_eq!(
            pod_cidr_at_start(&node, Some("10.9.0.0/24")).as_deref(),
            Some("10.244.1.0/24")
        );
        let bare = with(None);
        assert_eq!(
            pod_cidr_at_start(&bare, Some("10.9.0.0/24")).as_deref(),
            Some("10.9.0.0/24")
        );
        assert_eq!(pod_cidr_at_start(&bare, None), None);
        assert_eq!(pod_cidr_at_start(&with(Some("")), Some("")), None);
    }

    #[test]
    fn default_labels_then_extra_labels() {
        let mut config = NodeConfig::new("rk-node1", "198.18.0.1".parse().unwrap());
        config.hostname = "host-a".into();
        config
            .labels
            .insert("rkubelet.dev/pool".into(), "blue".into());
        let labels = node_labels(&config);
        let expected: BTreeMap<String, String> = [
            ("kubernetes.io/hostname", "host-a"),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", go_arch()),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", go_arch()),
            ("rkubelet.dev/pool", "blue"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(labels, expected);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
    }

    #[test]
    fn an_extra_label_may_override_a_default() {
        let mut config = NodeConfig::new("rk-node1", "198.18.0.1".parse().unwrap());
        config
            .labels
            .insert("kubernetes.io/hostname".into(), "other".into());
        assert_eq!(node_labels(&config)["kubernetes.io/hostname"], "other");
    }
}
