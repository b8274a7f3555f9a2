//! Eviction signals and the hard thresholds on them (the kubelet's `evictionapi` and the
//! threshold half of its `helpers.go`): parsing `--eviction-hard`, deciding which
//! thresholds an observation meets, and what each signal means (its node condition, the
//! resource reclaimed).

use super::EvictionError;
use crate::node::{EvictionHard, FsStats, PidUsage};
use crate::resources::Quantity;

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

/// Whether `available` is below `percent` of `total` (never with an unknown total).
fn below_percent(available: u64, total: u64, percent: u8) -> bool {
    total > 0 && u128::from(available) * 100 < u128::from(total) * u128::from(percent)
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
            (Signal::NodeFsAvailable, hard.nodefs_available_percent),
            (Signal::NodeFsInodesFree, hard.nodefs_inodes_free_percent),
        ),
        (
            obs.imagefs,
            (Signal::ImageFsAvailable, hard.imagefs_available_percent),
            (Signal::ImageFsInodesFree, hard.imagefs_inodes_free_percent),
        ),
    ];
    for (fs, (bytes, bytes_percent), (inodes, inodes_percent)) in filesystems {
        let Some(fs) = fs else { continue };
        if below_percent(fs.available_bytes, fs.capacity_bytes, bytes_percent) {
            met.push(bytes);
        }
        if below_percent(fs.inodes_free, fs.inodes, inodes_percent) {
            met.push(inodes);
        }
    }
    if obs.pids.is_some_and(|p| {
        below_percent(
            p.max.saturating_sub(p.running),
            p.max,
            hard.pid_available_percent,
        )
    }) {
        met.push(Signal::PidAvailable);
    }
    met
}

/// What `--eviction-hard` set: the thresholds, and the statements rkubelet accepts but
/// does not act on (`allocatableMemory.available`: rkubelet enforces node allocatable
/// through the pods' cgroup, not by eviction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedThresholds {
    /// The thresholds; a signal not named has none (as the kubelet, which does not merge
    /// a given `--eviction-hard` with its defaults).
    pub hard: EvictionHard,
    /// `allocatableMemory.available<...`, to be logged as ignored.
    pub ignored: Vec<String>,
}

/// Parses `--eviction-hard` (`memory.available<100Mi,nodefs.available<10%,...`), the
/// kubelet's `ParseThresholdConfig` for hard thresholds: `memory.available` takes a
/// quantity, the filesystem and PID signals a percentage.
///
/// # Errors
/// [`EvictionError::InvalidThreshold`] for an unknown signal, a malformed or negative
/// value, or a form rkubelet does not support (a percentage of memory, a quantity of disk).
pub fn parse_eviction_hard(text: &str) -> Result<ParsedThresholds, EvictionError> {
    let mut hard = EvictionHard {
        memory_available_bytes: 0,
        nodefs_available_percent: 0,
        nodefs_inodes_free_percent: 0,
        imagefs_available_percent: 0,
        imagefs_inodes_free_percent: 0,
        pid_available_percent: 0,
    };
    let mut ignored = Vec::new();
    for statement in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let invalid = |why: &str| EvictionError::InvalidThreshold {
            statement: statement.to_owned(),
            why: why.to_owned(),
        };
        let (signal, value) = statement
            .split_once('<')
            .ok_or_else(|| invalid("expected <signal><<value>"))?;
        let (signal, value) = (signal.trim(), value.trim());
        let percent = || -> Result<u8, EvictionError> {
            // The kubelet drops `0%` and `100%` (the latter would always be met).
            if value == "0%" || value == "100%" {
                return Ok(0);
            }
            let number = value
                .strip_suffix('%')
                .ok_or_else(|| invalid("rkubelet takes this signal as a percentage"))?;
            let p: f64 = number.parse().map_err(|_| invalid("not a percentage"))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(invalid("percentage must be between 0% and 100%"));
            }
            // Whole percents: the threshold is met strictly below it.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Ok(p.ceil() as u8)
        };
        match signal {
            "memory.available" => {
                if value.ends_with('%') {
                    return Err(invalid("rkubelet takes memory.available as a quantity"));
                }
                let q = Quantity::parse(value).map_err(|e| invalid(&e))?;
                if q.value() == 0 {
                    return Err(invalid(&format!(
                        "eviction threshold memory.available must be positive: {value}"
                    )));
                }
                hard.memory_available_bytes = u64::try_from(q.value()).unwrap_or(u64::MAX);
            }
            "nodefs.available" => hard.nodefs_available_percent = percent()?,
            "nodefs.inodesFree" => hard.nodefs_inodes_free_percent = percent()?,
            "imagefs.available" => hard.imagefs_available_percent = percent()?,
            "imagefs.inodesFree" => hard.imagefs_inodes_free_percent = percent()?,
            "pid.available" => hard.pid_available_percent = percent()?,
            "allocatableMemory.available" => {
                ignored.push(statement.to_owned());
            }
            _ => return Err(invalid("unknown eviction signal")),
        }
    }
    Ok(ParsedThresholds { hard, ignored })
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
    fn zero_and_full_percentages_set_no_threshold_and_memory_must_be_positive() {
        let parsed =
            parse_eviction_hard("nodefs.available<100%,nodefs.inodesFree<0%,pid.available<5%")
                .unwrap();
        assert_eq!(parsed.hard.nodefs_available_percent, 0);
        assert_eq!(parsed.hard.nodefs_inodes_free_percent, 0);
        assert_eq!(parsed.hard.pid_available_percent, 5);
        let e = parse_eviction_hard("memory.available<0").unwrap_err();
        assert!(e.to_string().contains("must be positive"), "{e}");
        assert!(parse_eviction_hard("memory.available<-1Mi").is_err());
    }

    #[test]
    fn parses_the_kubelet_defaults_and_drops_unnamed_signals() {
        let parsed = parse_eviction_hard(
            "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%",
        )
        .unwrap();
        assert_eq!(
            parsed.hard,
            EvictionHard {
                pid_available_percent: 0,
                ..EvictionHard::default()
            }
        );
        assert!(parsed.ignored.is_empty());
        let kind = parse_eviction_hard("nodefs.available<0%,imagefs.inodesFree<3%").unwrap();
        assert_eq!(kind.hard.memory_available_bytes, 0);
        assert_eq!(kind.hard.nodefs_available_percent, 0);
        assert_eq!(kind.hard.imagefs_available_percent, 0);
        assert_eq!(kind.hard.imagefs_inodes_free_percent, 3);
        let allocatable = parse_eviction_hard("allocatableMemory.available<1Gi").unwrap();
        assert_eq!(allocatable.ignored, ["allocatableMemory.available<1Gi"]);
    }

    #[test]
    fn rejects_what_it_cannot_honour() {
        for bad in [
            "memory.available<10%",
            "nodefs.available<1Gi",
            "nodefs.available<150%",
            "memory.available=1Gi",
            "swap.available<1Gi",
            "memory.available<-1Gi",
        ] {
            let err = parse_eviction_hard(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
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
