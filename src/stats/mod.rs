//! The node's stats provider (the kubelet's `pkg/kubelet/stats` with the parts of
//! cAdvisor it uses): what the node, its pods and their containers use of CPU, memory,
//! network and storage, read from the cgroups, the pods' network namespaces, the file
//! systems and the runtime (CRI), with no second agent. It builds the `stats/v1alpha1`
//! summary ([`summary`]) with the pods' volumes ([`volume`]) and the readings
//! `/metrics/cadvisor` renders ([`Snapshot`]), read in the background by the
//! [`housekeeping`] task, whose last reading every reader shares.
//!
//! It knows nothing of HTTP or of the Prometheus text format: the server serves what it
//! gives.

pub mod cgroup;
mod collect;
pub mod fs;
pub mod housekeeping;
pub mod network;
pub mod process;
mod provider;
pub mod summary;
#[cfg(test)]
mod testing;
pub mod volume;

pub use collect::{
    CgroupInfo, CgroupKind, Collector, MachineFigures, Snapshot, StatsConfig, Storage,
};
pub use fs::DiskUsage;
pub use housekeeping::{Housekeeping, PodSpecs, Reading};
pub use provider::{Figures, StatsProvider, parse_proc_stat, rfc3339};
pub use summary::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, NodeStats,
    PodReference, PodStats, PvcReference, RlimitStats, RuntimeStats, Summary, VolumeStats,
};
pub use volume::{PersistentVolumeMetrics, SpecVolume, VolumeUsage};

/// Why the stats could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// A CRI list call failed.
    #[error("reading stats from the runtime: {0}")]
    Cri(#[from] crate::cri::CriError),
    /// The blocking task reading the files did not finish.
    #[error("reading stats files did not finish: {0}")]
    Task(String),
}
