//! The probe results cache (the kubelet's `prober/results`): the latest result of each
//! probe kind per container id. Readers (status, runtime manager) never wait on probes.
//! It lives beside the probe result, below the prober: the prober's workers write it, and
//! its readers know no prober.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::ProbeResult;

/// Liveness, readiness or startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    /// Restarts the container when it fails.
    Liveness,
    /// Gates the container's readiness.
    Readiness,
    /// Holds the other probes back until the container has started.
    Startup,
}

impl ProbeKind {
    /// Every kind.
    pub const ALL: [Self; 3] = [Self::Liveness, Self::Readiness, Self::Startup];

    /// The kubelet's name, as in events and the `probe_type` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
            Self::Startup => "Startup",
        }
    }

    /// The result before the first probe: not ready, alive, not known to have started.
    pub fn initial(self) -> ProbeResult {
        match self {
            Self::Liveness => ProbeResult::Success,
            Self::Readiness => ProbeResult::Failure,
            Self::Startup => ProbeResult::Unknown,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The latest result of each probe kind, by container id.
#[derive(Debug, Default)]
pub struct Results {
    by_container: Mutex<HashMap<String, [Option<ProbeResult>; 3]>>,
}

impl Results {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, [Option<ProbeResult>; 3]>> {
        crate::lock::lock(&self.by_container)
    }

    /// The latest result of the container's probe of `kind`, if it has one.
    pub fn get(&self, container_id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        self.lock().get(container_id).and_then(|r| r[kind.index()])
    }

    /// Records a result, unless its worker was stopped; answers whether it differs from
    /// the one before. `stopped` is read under the cache's lock, and a worker is marked
    /// stopped before its result is removed: a result that a worker aborted on another
    /// thread was about to record never comes back after the removal.
    pub fn record(
        &self,
        stopped: &AtomicBool,
        container_id: &str,
        kind: ProbeKind,
        result: ProbeResult,
    ) -> bool {
        let mut all = self.lock();
        if stopped.load(Ordering::Acquire) {
            return false;
        }
        let slot = match all.get_mut(container_id) {
            Some(slots) => &mut slots[kind.index()],
            None => &mut all.entry(container_id.to_owned()).or_default()[kind.index()],
        };
        slot.replace(result) != Some(result)
    }

    /// Records a result for a worker that runs (see [`Self::record`]).
    #[cfg(test)]
    pub fn set(&self, container_id: &str, kind: ProbeKind, result: ProbeResult) -> bool {
        self.record(&AtomicBool::new(false), container_id, kind, result)
    }

    /// Forgets the container's result of `kind` (its worker stopped).
    pub fn remove(&self, container_id: &str, kind: ProbeKind) {
        let mut all = self.lock();
        if let Some(slots) = all.get_mut(container_id) {
            slots[kind.index()] = None;
            if slots.iter().all(Option::is_none) {
                all.remove(container_id);
            }
        }
    }

    /// Why the runtime manager should restart the container, if a liveness or startup
    /// probe failed: the kubelet's `Container X failed liveness probe` message start.
    pub fn failed_probe(&self, container_id: &str) -> Option<ProbeKind> {
        let all = self.lock();
        let slots = all.get(container_id)?;
        [ProbeKind::Liveness, ProbeKind::Startup]
            .into_iter()
            .find(|k| slots[k.index()] == Some(ProbeResult::Failure))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_kept_per_container_and_kind() {
        let results = Results::default();
        let live = AtomicBool::new(false);
        assert!(results.record(&live, "c1", ProbeKind::Readiness, ProbeResult::Failure));
        assert!(!results.record(&live, "c1", ProbeKind::Readiness, ProbeResult::Failure));
        assert!(results.record(&live, "c1", ProbeKind::Liveness, ProbeResult::Success));
        assert_eq!(results.failed_probe("c1"), None);
        assert!(results.record(&live, "c1", ProbeKind::Liveness, ProbeResult::Failure));
        assert_eq!(results.failed_probe("c1"), Some(ProbeKind::Liveness));
        assert_eq!(results.get("c2", ProbeKind::Readiness), None);
        results.remove("c1", ProbeKind::Liveness);
        results.remove("c1", ProbeKind::Readiness);
        assert!(results.lock().is_empty());
    }

    /// A worker stopped (its result removed) while it was probing on another thread
    /// records nothing after that: no result outlives its container.
    #[test]
    fn a_stopped_workers_result_is_not_recorded() {
        let results = Results::default();
        let stopped = AtomicBool::new(false);
        assert!(results.record(&stopped, "c1", ProbeKind::Readiness, ProbeResult::Success));
        stopped.store(true, Ordering::Release);
        results.remove("c1", ProbeKind::Readiness);
        assert!(!results.record(&stopped, "c1", ProbeKind::Readiness, ProbeResult::Failure));
        assert!(results.lock().is_empty());
    }
}
