//! The node lease: the cheap heartbeat. Like the kubelet's `nodelease` controller, it
//! keeps `kube-node-lease/<node>` held by the node, renewing `renewTime` every quarter of
//! the lease duration, so that the node lifecycle controller sees the node alive between
//! the (rarer) node status reports.
//!
//! Renewal updates the last lease written, without reading it first; a 409 Conflict means
//! someone else wrote it, so the lease is read again. A missing lease is created, owned by
//! the Node so that it is garbage-collected with it. Every failure is logged and retried:
//! five quick attempts, then the next interval. Nothing here panics.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

use super::{NodeConfig, NodeError, sleep_or_cancel};

/// The namespace of node leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Attempts of one renewal before waiting for the next interval (the kubelet's
/// `maxUpdateRetries`).
const MAX_UPDATE_RETRIES: u32 = 5;
/// Pause between those attempts.
const UPDATE_RETRY_DELAY: Duration = Duration::from_millis(200);
/// First and longest pause while the lease cannot be read or created.
const ENSURE_BACKOFF_INITIAL: Duration = Duration::from_millis(200);
const ENSURE_BACKOFF_MAX: Duration = Duration::from_secs(7);

/// Creates and renews the node's Lease.
#[derive(Debug)]
pub struct LeaseController {
    leases: Api<Lease>,
    nodes: Api<Node>,
    node: String,
    duration_seconds: i32,
    renew_interval: Duration,
    /// The lease as last written by us: the base of the next renewal.
    latest: Option<Lease>,
}

impl LeaseController {
    /// A controller for the lease of `config.name`, lasting
    /// `config.node_lease_duration_seconds`.
    #[must_use]
    pub fn new(client: kube::Client, config: &NodeConfig) -> Self {
        Self {
            leases: Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
            nodes: Api::all(client),
            node: config.name.clone(),
            duration_seconds: config.node_lease_duration_seconds,
            renew_interval: config.lease_renew_interval(),
            latest: None,
        }
    }

    /// Renews the lease every renewal interval until `cancel` fires.
    #[tracing::instrument(name = "node_lease", skip_all, fields(node = %self.node))]
    pub async fn run(mut self, cancel: CancellationToken) {
        tracing::info!(interval = ?self.renew_interval, "renewing the node lease");
        loop {
            let outcome = tokio::select! {
                () = cancel.cancelled() => break,
                outcome = self.sync(&cancel) => outcome,
            };
            match outcome {
                Ok(lease) => tracing::debug!(
                    resource_version = lease.metadata.resource_version.as_deref(),
                    "node lease renewed"
                ),
                Err(NodeError::Cancelled { .. }) => break,
                Err(e) => tracing::warn!(
                    error = %e,
                    retry_in = ?self.renew_interval,
                    "failed to renew the node lease"
                ),
            }
            if !sleep_or_cancel(&cancel, self.renew_interval).await {
                break;
            }
        }
        tracing::info!("stopped renewing the node lease");
    }

    /// One renewal, the kubelet's `sync`: update the last written lease; failing that,
    /// make sure the lease exists (creating it if needed) and update it. Returns the lease
    /// as written.
    ///
    /// # Errors
    /// [`NodeError::Cancelled`] if `cancel` fired, or [`NodeError::RetriesExhausted`] when
    /// every update attempt failed.
    pub async fn sync(&mut self, cancel: &CancellationToken) -> Result<Lease, NodeError> {
        if let Some(latest) = self.latest.take() {
            match self.retry_update(latest, cancel).await {
                Ok(lease) => return Ok(lease),
                Err(e @ NodeError::Cancelled { .. }) => return Err(e),
                Err(e) => tracing::info!(
                    error = %e,
                    "failed to update the lease from the last one written, reading it again"
                ),
            }
        }
        let (lease, created) = self.backoff_ensure(cancel).await?;
        if created {
            self.latest = Some(lease.clone());
            return Ok(lease);
        }
        self.retry_update(lease, cancel).await
    }

    fn cancelled(&self) -> NodeError {
        NodeError::Cancelled {
            operation: "renew Lease",
            node: self.node.clone(),
        }
    }

    fn api_error(&self, operation: &'static str) -> impl FnOnce(kube::Error) -> NodeError + '_ {
        move |source| NodeError::Api {
            operation,
            node: self.node.clone(),
            source,
        }
    }

    /// Up to five updates of `base` with a new renew time; a conflict re-reads the lease.
    async fn retry_update(
        &mut self,
        mut base: Lease,
        cancel: &CancellationToken,
    ) -> Result<Lease, NodeError> {
        let mut last = None;
        for attempt in 1..=MAX_UPDATE_RETRIES {
            let desired = self.desired(Some(base.clone())).await;
            match self
                .leases
                .replace(&self.node, &PostParams::default(), &desired)
                .await
                .map_err(self.api_error("update Lease"))
            {
                Ok(lease) => {
                    self.latest = Some(lease.clone());
                    return Ok(lease);
                }
                Err(e) if e.is_conflict() => {
                    tracing::info!(
                        attempt,
                        "the node lease was modified by someone else, reading it again"
                    );
                    base = self.backoff_ensure(cancel).await?.0;
                    last = Some(e);
                }
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "failed to update the node lease");
                    last = Some(e);
                    if !sleep_or_cancel(cancel, UPDATE_RETRY_DELAY).await {
                        return Err(self.cancelled());
                    }
                }
            }
        }
        Err(NodeError::RetriesExhausted {
            operation: "update Lease",
            node: self.node.clone(),
            attempts: MAX_UPDATE_RETRIES,
            last: Box::new(last.unwrap_or_else(|| self.cancelled())),
        })
    }

    /// Reads the lease, creating it when missing, with exponential back-off (200 ms to
    /// 7 s) until it succeeds or `cancel` fires. Returns the lease and whether it was
    /// created by this call.
    async fn backoff_ensure(&self, cancel: &CancellationToken) -> Result<(Lease, bool), NodeError> {
        let mut delay = ENSURE_BACKOFF_INITIAL;
        loop {
            match self.ensure().await {
                Ok(found) => return Ok(found),
                Err(e) => tracing::warn!(
                    error = %e,
                    retry_in = ?delay,
                    "failed to ensure the node lease exists"
                ),
            }
            if !sleep_or_cancel(cancel, delay).await {
                return Err(self.cancelled());
            }
            delay = (delay * 2).min(ENSURE_BACKOFF_MAX);
        }
    }

    async fn ensure(&self) -> Result<(Lease, bool), NodeError> {
        if let Some(lease) = self
            .leases
            .get_opt(&self.node)
            .await
            .map_err(self.api_error("get Lease"))?
        {
            return Ok((lease, false));
        }
        let lease = self.desired(None).await;
        let created = self
            .leases
            .create(&PostParams::default(), &lease)
            .await
            .map_err(self.api_error("create Lease"))?;
        tracing::info!("created the node lease");
        Ok((created, true))
    }

    /// `base` (or a new lease) held by the node for the configured duration, renewed now,
    /// and owned by the Node when the Node can be read: the owner reference is retried at
    /// every renewal until it is set, as the kubelet does.
    async fn desired(&self, base: Option<Lease>) -> Lease {
        let mut lease = base.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.node.clone()),
                namespace: Some(NODE_LEASE_NAMESPACE.into()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.node.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        if lease
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(Vec::is_empty)
        {
            match self.nodes.get(&self.node).await {
                Ok(node) => {
                    lease.metadata.owner_references = node.metadata.uid.map(|uid| {
                        vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: self.node.clone(),
                            uid,
                            ..OwnerReference::default()
                        }]
                    });
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "failed to get the Node to set it as owner of its lease; will retry at the next renewal"
                ),
            }
        }
        lease
    }
}
