//! Eviction signals and the hard thresholds on them (the kubelet's `evictionapi` and the
//! threshold half of its `helpers.go`): deciding which thresholds an observation meets,
//! and what each signal means (its node condition, the resource reclaimed). Vocabulary of
//! the node's pressure conditions and of the eviction manager above: it knows neither.

use super::config::EvictionHard;
#[cfg(test)]
use super::config::Threshold;
use super::machine::{FsStats, PidUsage};

/// An eviction signal rkubelet observes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// `memory.available`: the memory capacity less the root memory cgroup's working set
    /// (the kubelet's, from cAdvisor's root container).
    MemoryAvailable,
    /// `nodefs.available`: bytes available on the filesystem of `--root-dir`.
    NodeFsAvailable,
    /// `nodefs.inodesFree`.
    NodeFsInodesFree,
    /// `imagefs.available`: bytes available on the filesystem holding the runtime's images
    /// (CRI `ImageFsInfo`).
    ImageFsAvailable,
    /// `imagefs.inodesFree`.
    ImageFsInodesFree,
    /// `pid.available`: `kernel.pid_max` minus the tasks running.
    PidAvailable,
}

impl Signal {
    /// The signal's name in `--eviction-hard`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    /// The resource eviction reclaims for this signal (`signalToResource`), as named in
    /// the eviction message.
    #[must_use]
    pub fn resource(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory",
            Self::NodeFsAvailable | Self::ImageFsAvailable => "ephemeral-storage",
            Self::NodeFsInodesFree | Self::ImageFsInodesFree => "inodes",
            Self::PidAvailable => "pids",
        }
    }

    /// The node condition a met threshold on this signal turns on (`signalToNodeCondition`).
    #[must_use]
    pub fn condition(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "MemoryPressure",
            Self::NodeFsAvailable
            | Self::NodeFsInodesFree
            | Self::ImageFsAvailable
            | Self::ImageFsInodesFree => "DiskPressure",
            Self::PidAvailable => "PIDPressure",
        }
    }

    /// Whether freeing node-level resources (dead containers, unused images) may relieve
    /// this signal before pods are evicted (`buildSignalToNodeReclaimFuncs`): every disk
    /// signal.
    #[must_use]
    pub fn node_reclaimable(self) -> bool {
        self.condition() == "DiskPressure"
    }
}

/// One look at the node's figures behind the signals; `None` when unreadable (a signal
/// with no observation meets no threshold, as in the kubelet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Observations {
    /// `memory.available`, in bytes ([`crate::node::Memory::available_bytes`]).
    pub memory_available_bytes: Option<u64>,
    /// The filesystem of `--root-dir`.
    pub nodefs: Option<FsStats>,
    /// The filesystem holding the runtime's images.
    pub imagefs: Option<FsStats>,
    /// PIDs in use and `pid_max`.
    pub pids: Option<PidUsage>,
}

/// The hard thresholds `obs` meets (`thresholdsMet`), in the order the kubelet reclaims
/// them (`byEvictionPriority`: memory first).
#[must_use]
pub fn thresholds_met(obs: &Observations, hard: &EvictionHard) -> Vec<Signal> {
    let mut met = Vec::new();
    if obs
        .memory_available_bytes
        .is_some_and(|available| available < hard.memory_available_bytes)
    {
        met.push(Signal::MemoryAvailable);
    }
    let filesystems = [
        (
            obs.nodefs,
            (Signal::NodeFsAvailable, hard.nodefs_available),
            (Signal::NodeFsInodesFree, hard.nodefs_inodes_free),
        ),
        (
            obs.imagefs,
            (Signal::ImageFsAvailable, hard.imagefs_available),
            (Signal::ImageFsInodesFree, hard.imagefs_inodes_free),
        ),
    ];
    for (fs, (bytes, bytes_threshold), (inodes, inodes_threshold)) in filesystems {
        let Some(fs) = fs else { continue };
        if bytes_threshold.met(fs.available_bytes, fs.capacity_bytes) {
            met.push(bytes);
        }
        if inodes_threshold.met(fs.inodes_free, fs.inodes) {
            met.push(inodes);
        }
    }
    if obs.pids.is_some_and(|p| {
        hard.pid_available
            .met(p.max.saturating_sub(p.running), p.max)
    }) {
        met.push(Signal::PidAvailable);
    }
    met
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn fs(available: u64, inodes_free: u64) -> FsStats {
        FsStats {
            capacity_bytes: 100 * GIB,
            available_bytes: available,
            inodes: 1000,
            inodes_free,
        }
    }

    #[test]
    fn thresholds_met_memory_first_and_only_strictly_below() {
        let hard = EvictionHard::default();
        let obs = Observations {
            memory_available_bytes: Some(50 << 20),
            nodefs: Some(fs(5 * GIB, 10)),
            imagefs: Some(fs(14 * GIB, 0)),
            pids: Some(PidUsage {
                running: 100,
                max: 1000,
            }),
        };
        assert_eq!(
            thresholds_met(&obs, &hard),
            [
                Signal::MemoryAvailable,
                Signal::NodeFsAvailable,
                Signal::NodeFsInodesFree,
                Signal::ImageFsAvailable
            ]
        );
        let at_threshold = Observations {
            memory_available_bytes: Some(100 << 20),
            nodefs: Some(fs(10 * GIB, 50)),
            imagefs: Some(fs(15 * GIB, 0)),
            pids: None,
        };
        assert!(thresholds_met(&at_threshold, &hard).is_empty());
        assert!(thresholds_met(&Observations::default(), &hard).is_empty());
    }

    #[test]
    fn absolute_thresholds_are_met_below_their_amount_whatever_the_total() {
        let hard = EvictionHard {
            nodefs_available: Threshold::Amount(2 * GIB),
            nodefs_inodes_free: Threshold::Amount(20),
            imagefs_available: Threshold::NONE,
            ..EvictionHard::default()
        };
        let obs = |available, inodes_free| Observations {
            nodefs: Some(fs(available, inodes_free)),
            imagefs: Some(fs(available, inodes_free)),
            ..Observations::default()
        };
        // 1.9 GiB of 100 (1.9 %: far from 10 %, but below the 2 GiB given).
        assert_eq!(
            thresholds_met(&obs(2 * GIB - 1, 100), &hard),
            [Signal::NodeFsAvailable]
        );
        assert_eq!(
            thresholds_met(&obs(2 * GIB, 19), &hard),
            [Signal::NodeFsInodesFree]
        );
        assert!(thresholds_met(&obs(2 * GIB, 20), &hard).is_empty());
        assert_eq!(Threshold::Amount(5).amount_of(1000), 5);
        assert_eq!(Threshold::Percent(10).amount_of(1000), 100);
    }

    #[test]
    fn signals_map_to_conditions_and_resources() {
        assert_eq!(Signal::MemoryAvailable.condition(), "MemoryPressure");
        assert_eq!(Signal::NodeFsInodesFree.condition(), "DiskPressure");
        assert_eq!(Signal::NodeFsAvailable.resource(), "ephemeral-storage");
        assert!(Signal::NodeFsAvailable.node_reclaimable());
        assert!(Signal::ImageFsInodesFree.node_reclaimable());
        assert_eq!(Signal::ImageFsAvailable.condition(), "DiskPressure");
        assert_eq!(Signal::ImageFsAvailable.resource(), "ephemeral-storage");
        assert!(!Signal::MemoryAvailable.node_reclaimable());
    }
}
