//! The eviction manager, the kubelet's `pkg/kubelet/eviction`: watches the hard eviction
//! thresholds (`--eviction-hard`: `memory.available`, `nodefs.available`,
//! `nodefs.inodesFree`, `imagefs.available`, `imagefs.inodesFree`, `pid.available`) every
//! 10 s and, while one is met, reclaims
//! node-level resources first (a [`NodeReclaimer`] hook for container and image garbage
//! collection), then evicts one pod per pass in the kubelet's order: the pod ends `Failed`
//! with reason `Evicted` and the message `The node was low on resource: <resource>. `
//! (plus the containers over their requests), a Warning `Evicted` event, and its
//! containers killed with grace period 0. Critical, mirror and static pods are never
//! evicted. Each pass also updates the node conditions the manager holds
//! ([`NodeConditions`]: the pressure conditions of the thresholds met, held for the
//! pressure transition period), which admission reads ([`crate::lifecycle::admission`]),
//! as the kubelet's eviction manager is its own admit handler; the Node's pressure
//! conditions are reported by the node agent ([`crate::node`]) from the same thresholds.
//!
//! - [`signals`]: parsing `--eviction-hard`; the signals and which thresholds an
//!   observation meets are the node's ([`crate::node::thresholds_met`]).
//! - [`rank`]: the eviction order and message (pure).
//! - [`local_storage`]: local storage capacity isolation (pure): a pod over an emptyDir's
//!   `sizeLimit`, its total or a container's `limits.ephemeral-storage` is evicted, before
//!   the thresholds are looked at, with the kubelet's messages.
//! - [`manager`]: the control loop, over the [`StatsSource`], [`PodEvictor`] and
//!   [`NodeReclaimer`] traits.
//! - The real stats, from the machine and CRI ([`crate::kubelet::eviction_stats`]), and the
//!   real pods, evicted through the kubelet and its pod workers
//!   ([`crate::kubelet::evictor`]), are the kubelet's: eviction takes them as traits.
//!
//! Knows no runtime, kubelet or pod worker: stats, pods and node-level reclaim come through
//! its three traits.

pub mod conditions;
pub mod local_storage;
pub mod manager;
pub mod rank;
pub mod signals;

use k8s_openapi::api::core::v1::Pod;

pub use crate::node::{Observations, Signal, thresholds_met};
pub use conditions::NodeConditions;
pub use local_storage::{LocalStorage, PodStorage};
pub use manager::{
    EvictionManager, MONITORING_INTERVAL, NoReclaim, NodeReclaimer, Pass, PodEvictor, StatsSource,
};
pub use rank::{ContainerUsage, PodUsage, REASON};
pub use signals::{ParsedThresholds, parse_eviction_hard};

/// What went wrong in the eviction manager.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    /// A `--eviction-hard` statement rkubelet cannot honour.
    #[error("invalid eviction threshold {statement:?}: {why}")]
    InvalidThreshold {
        /// The statement, e.g. `memory.available<10%`.
        statement: String,
        /// Why.
        why: String,
    },
    /// The pods' stats could not be read from the stats provider.
    #[error("reading the pods' stats from the stats provider: {0}")]
    Stats(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The kubelet's `IsCriticalPod` as eviction applies it: static pods (from a file or
/// URL), mirror pods and pods at system-critical priority are never evicted.
#[must_use]
pub fn is_critical_or_static(pod: &Pod) -> bool {
    crate::cm::is_critical(pod)
}
