//! The node conditions the eviction manager holds (the kubelet's
//! `managerImpl.nodeConditions`): the pressure conditions of the thresholds its passes
//! met, each held for `--eviction-pressure-transition-period` after it was last met.
//! Pod admission reads them, as the kubelet's `Admit`, `IsUnderMemoryPressure` and
//! `IsUnderPIDPressure` read the manager's own observations, never the reported Node.

use std::sync::{Arc, RwLock};

use crate::node::Pressure;

/// The eviction manager's node conditions, shared with those who read them. Cheap to
/// clone; a new one holds none (as the kubelet's manager before its first pass).
#[derive(Debug, Clone, Default)]
pub struct NodeConditions(Arc<RwLock<Pressure>>);

impl NodeConditions {
    /// The conditions held now.
    #[must_use]
    pub fn held(&self) -> Pressure {
        *crate::lock::read(&self.0)
    }

    /// Holds `held` from now on; returns the conditions held before.
    pub(crate) fn replace(&self, held: Pressure) -> Pressure {
        std::mem::replace(&mut *crate::lock::write(&self.0), held)
    }
}
