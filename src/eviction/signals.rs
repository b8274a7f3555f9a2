//! Parsing `--eviction-hard` (the kubelet's `ParseThresholdConfig`). The signals and
//! which thresholds an observation meets are the node's vocabulary
//! ([`crate::node::thresholds_met`]), shared with the node's pressure conditions.

use super::EvictionError;
use crate::node::{EvictionHard, Threshold};
use crate::resources::Quantity;

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
/// quantity, the filesystem and PID signals a percentage or a quantity (bytes, inodes,
/// PIDs: `nodefs.available<1Gi`).
///
/// # Errors
/// [`EvictionError::InvalidThreshold`] for an unknown signal, a malformed or negative
/// value, or a form rkubelet does not support (a percentage of memory).
pub fn parse_eviction_hard(text: &str) -> Result<ParsedThresholds, EvictionError> {
    let mut hard = EvictionHard {
        memory_available_bytes: 0,
        nodefs_available: Threshold::NONE,
        nodefs_inodes_free: Threshold::NONE,
        imagefs_available: Threshold::NONE,
        imagefs_inodes_free: Threshold::NONE,
        pid_available: Threshold::NONE,
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
        // A percentage of the total, or an amount (the kubelet's `parseThresholdStatement`).
        let threshold = || -> Result<Threshold, EvictionError> {
            let Some(number) = value.strip_suffix('%') else {
                let q = Quantity::parse(value).map_err(|e| invalid(&e))?;
                return u64::try_from(q.value())
                    .map(Threshold::Amount)
                    .map_err(|_| invalid("eviction threshold must be non-negative"));
            };
            // The kubelet drops `0%` and `100%` (the latter would always be met).
            if value == "0%" || value == "100%" {
                return Ok(Threshold::NONE);
            }
            let p: f64 = number.parse().map_err(|_| invalid("not a percentage"))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(invalid("percentage must be between 0% and 100%"));
            }
            // Whole percents: the threshold is met strictly below it.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Ok(Threshold::Percent(p.ceil() as u8))
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
            "nodefs.available" => hard.nodefs_available = threshold()?,
            "nodefs.inodesFree" => hard.nodefs_inodes_free = threshold()?,
            "imagefs.available" => hard.imagefs_available = threshold()?,
            "imagefs.inodesFree" => hard.imagefs_inodes_free = threshold()?,
            "pid.available" => hard.pid_available = threshold()?,
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

    #[test]
    fn zero_and_full_percentages_set_no_threshold_and_memory_must_be_positive() {
        let parsed =
            parse_eviction_hard("nodefs.available<100%,nodefs.inodesFree<0%,pid.available<5%")
                .unwrap();
        assert_eq!(parsed.hard.nodefs_available, Threshold::NONE);
        assert_eq!(parsed.hard.nodefs_inodes_free, Threshold::NONE);
        assert_eq!(parsed.hard.pid_available, Threshold::Percent(5));
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
                pid_available: Threshold::NONE,
                ..EvictionHard::default()
            }
        );
        assert!(parsed.ignored.is_empty());
        let kind = parse_eviction_hard("nodefs.available<0%,imagefs.inodesFree<3%").unwrap();
        assert_eq!(kind.hard.memory_available_bytes, 0);
        assert_eq!(kind.hard.nodefs_available, Threshold::NONE);
        assert_eq!(kind.hard.imagefs_available, Threshold::NONE);
        assert_eq!(kind.hard.imagefs_inodes_free, Threshold::Percent(3));
        let allocatable = parse_eviction_hard("allocatableMemory.available<1Gi").unwrap();
        assert_eq!(allocatable.ignored, ["allocatableMemory.available<1Gi"]);
    }

    #[test]
    fn disk_inode_and_pid_signals_take_amounts_as_the_kubelet() {
        let parsed = parse_eviction_hard(
            "nodefs.available<1Gi,imagefs.available<2Gi,nodefs.inodesFree<10k,pid.available<1000",
        )
        .unwrap();
        assert_eq!(parsed.hard.nodefs_available, Threshold::Amount(1 << 30));
        assert_eq!(parsed.hard.imagefs_available, Threshold::Amount(2 << 30));
        assert_eq!(parsed.hard.nodefs_inodes_free, Threshold::Amount(10_000));
        assert_eq!(parsed.hard.pid_available, Threshold::Amount(1000));
    }

    #[test]
    fn rejects_what_it_cannot_honour() {
        for bad in [
            "memory.available<10%",
            "nodefs.available<-1Gi",
            "nodefs.available<150%",
            "memory.available=1Gi",
            "swap.available<1Gi",
            "memory.available<-1Gi",
        ] {
            let err = parse_eviction_hard(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }
}
