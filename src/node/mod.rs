//! The node: this agent's Node object and its heartbeats, the kubelet's
//! `kubelet_node_status.go`, `nodestatus` setters and `nodelease` controller.
//!
//! - **Registration** ([`NodeAgent::register`]): create the Node `<name>` with the
//!   kubelet's default labels, extra labels, and a first full status; or adopt the existing
//!   Node of that name, reconciling its labels and status. Retried with back-off until it
//!   succeeds. kube-controller-manager then allocates `spec.podCIDR`
//!   ([`wait_for_pod_cidr`]).
//! - **Node status**: addresses, capacity and allocatable measured on the machine
//!   ([`MachineInfo`]), `nodeInfo`, the daemon endpoint, images, and the conditions
//!   MemoryPressure, DiskPressure, PIDPressure (from the hard eviction thresholds) and Ready
//!   (from the runtime's health, [`ContainerRuntime`], and injected [`ReadinessCheck`]s);
//!   the device plugins' resources as they are given ([`ExtendedResources`]).
//!   Computed every 10 s, patched onto `nodes/status` when it changed or once a minute.
//! - **Lease** ([`LeaseController`]): `kube-node-lease/<name>`, renewed every 10 s.
//! - **Lister** ([`node_lister`]): the Node as last seen through a watch, for admission.
//! - **Address** ([`node_ip`]): the InternalIP, `--node-ip` or found as the kubelet finds it.
//!
//! Allocatable is capacity minus kube-reserved, system-reserved and the hard eviction
//! thresholds that the kubelet reserves: `memory.available` (100Mi by default) from
//! memory, `nodefs.available` (10% by default) from ephemeral-storage; huge pages are
//! taken from memory too.
//!
//! The agent works with the identity `system:node:<name>` under the Node authorizer and
//! the NodeRestriction admission plugin, and sends only fields a v1.20 API server knows.
//!
//! Knows no pod, eviction manager or kubelet API: it reports the node, and the eviction
//! manager reads the node's signals ([`thresholds_met`]) from above.

mod address;
mod agent;
mod config;
mod error;
mod lease;
mod lister;
pub(crate) mod machine;
mod quantity;
mod registration;
mod runtime;
mod signals;
mod status;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use address::{AddressError, HostAddresses, LinuxHost, node_ip};
pub use agent::{NodeAgent, StatusTrigger, StatusUpdate};
pub use config::{
    DEFAULT_KUBELET_VERSION, DEFAULT_ROOT_DIR, EvictionHard, NodeConfig, Reservation, Threshold,
    go_arch, parse_go_duration,
};
pub use error::{MachineError, NodeError};
pub use lease::{LeaseController, NODE_LEASE_NAMESPACE};
pub use lister::{node_lister, nodes_lister};
pub use machine::{
    CpuTopology, FsStats, HugePages, LinuxMachine, MachineInfo, Memory, MemoryUsage, PidUsage,
};
/// A whole number in the API's canonical decimal form (`512`, `2k`, `20M`).
pub(crate) use quantity::count as decimal_quantity;
pub use registration::{pod_cidr_at_start, wait_for_pod_cidr};
pub use runtime::{ContainerRuntime, ReadinessCheck, RuntimeVersion, image_fs_mountpoint};
pub use signals::{Observations, Signal, thresholds_met};
pub use status::{ExtendedResources, Pressure, PressureTracker};

/// Sleeps for `duration` unless `cancel` fires first; false when cancelled.
async fn sleep_or_cancel(cancel: &CancellationToken, duration: Duration) -> bool {
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(duration) => true,
    }
}
