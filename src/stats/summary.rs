//! The stats summary's types: the kubelet's `stats/v1alpha1` API
//! (`k8s.io/kubelet/pkg/apis/stats/v1alpha1`), with its JSON names. Figures the node
//! cannot give are left out (`omitempty`), as the kubelet leaves them.

use serde::Serialize;

/// The system container of the pods' cgroup (`statsapi.SystemContainerPods`).
pub const SYSTEM_CONTAINER_PODS: &str = "pods";

/// The summary.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// One entry per running pod.
    pub pods: Vec<PodStats>,
}

/// The node's stats.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// The node's name.
    pub node_name: String,
    /// The node's system containers (`kubelet`, `runtime`, `misc`, `pods`) that exist.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    /// Boot time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The host's network interfaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The filesystem of the agent's root directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// The container runtime's image filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// Process IDs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// The runtime's filesystems.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// Where the images (and containers' writable layers) are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
}

/// Process IDs of the node.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RlimitStats {
    /// When read.
    pub time: String,
    /// `kernel.pid_max`.
    #[serde(rename = "maxpid", skip_serializing_if = "Option::is_none")]
    pub max_pid: Option<i64>,
    /// Tasks (processes and threads) now.
    #[serde(rename = "curproc", skip_serializing_if = "Option::is_none")]
    pub running_processes: Option<i64>,
}

/// A pod's reference.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct PodReference {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
}

/// A pod's stats.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// Which pod.
    pub pod_ref: PodReference,
    /// When its sandbox was created.
    pub start_time: String,
    /// Its running containers.
    pub containers: Vec<ContainerStats>,
    /// The pod cgroup's, else the sum over the containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// The pod cgroup's, else the sum over the containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The interfaces of its network namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Its volumes (ephemeral first, then persistent).
    #[serde(rename = "volume", skip_serializing_if = "Vec::is_empty")]
    pub volume_stats: Vec<VolumeStats>,
    /// Writable layers, logs and emptyDir volumes together.
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
}

/// A container's stats.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// The container's name in the pod spec (or the system container's).
    pub name: String,
    /// When it was created.
    pub start_time: String,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Its writable layer on the image filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// Its log files on the root filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

/// CPU usage.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When sampled.
    pub time: String,
    /// Average use since the previous sample, in billionths of a core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative CPU time, in core-nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// Memory usage.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When sampled.
    pub time: String,
    /// The limit (or the node's capacity) less the working set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Memory in use, page cache included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// The working set: what the kubelet evicts and the scheduler counts by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Major page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

/// One network interface's counters.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// The interface's name.
    pub name: String,
    /// Bytes received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// Bytes sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Transmit errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// A network namespace's interfaces; the default one (`eth0`) also at the top level.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NetworkStats {
    /// When sampled.
    pub time: String,
    /// The default interface, inline.
    #[serde(flatten)]
    pub default: InterfaceStats,
    /// Every interface.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

/// A filesystem's (or a part of it's) size and use.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// When sampled.
    pub time: String,
    /// Bytes available on the filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// The filesystem's size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Bytes used (by the whole filesystem, or by what the entry is about).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Free inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// All inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Inodes used (by the whole filesystem, or by what the entry is about).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// A volume's use.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VolumeStats {
    /// The figures.
    #[serde(flatten)]
    pub fs: FsStats,
    /// The volume's name in the pod spec.
    pub name: String,
    /// The PersistentVolumeClaim it comes from.
    #[serde(rename = "pvcRef", skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
}

/// A PersistentVolumeClaim: its name and namespace (the pod's).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PvcReference {
    /// The claim's name.
    pub name: String,
    /// The claim's namespace.
    pub namespace: String,
}
