//! `prober_probe_total{probe_type,result,container,pod,namespace,pod_uid}`, as the kubelet
//! 1.20 exports it (results `successful`, `failed`, `unknown`). Each worker counts on its
//! own atomics; the entries of a pod are dropped when the pod goes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use crate::pod::PodId;
use crate::probe::ProbeResult;
use crate::probe::results::ProbeKind;

/// The counts of one container's probe of one kind.
#[derive(Debug)]
pub struct Counters {
    pod: PodId,
    counts: [AtomicU64; 3],
}

impl Counters {
    /// Counts one probe by its result (a warning counts as successful, as the kubelet's).
    pub fn count(&self, result: ProbeResult) {
        let i = match result {
            ProbeResult::Success | ProbeResult::Warning => 0,
            ProbeResult::Failure => 1,
            ProbeResult::Unknown => 2,
        };
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }
}

type Key = (String, String, ProbeKind);

static REGISTRY: LazyLock<Mutex<BTreeMap<Key, Arc<Counters>>>> = LazyLock::new(Mutex::default);

fn registry() -> std::sync::MutexGuard<'static, BTreeMap<Key, Arc<Counters>>> {
    crate::lock::lock(&REGISTRY)
}

/// The counters of the pod's container's probe of `kind` (kept across restarts).
pub fn register(pod: &PodId, container: &str, kind: ProbeKind) -> Arc<Counters> {
    registry()
        .entry((pod.uid.clone(), container.to_owned(), kind))
        .or_insert_with(|| {
            Arc::new(Counters {
                pod: pod.clone(),
                counts: Default::default(),
            })
        })
        .clone()
}

/// Drops every entry of a pod that is gone.
pub fn forget_pod(uid: &str) {
    registry().retain(|(u, _, _), _| u != uid);
}

/// Whether any entry of the pod is kept.
#[must_use]
pub fn holds(uid: &str) -> bool {
    registry().keys().any(|(u, _, _)| u == uid)
}

/// Appends the metric's samples, as `(labels, value)`, for the exposition.
pub fn samples(mut emit: impl FnMut(&[(&'static str, &str)], u64)) {
    for ((_, container, kind), c) in registry().iter() {
        for (i, result) in ["successful", "failed", "unknown"].into_iter().enumerate() {
            let value = c.counts[i].load(Ordering::Relaxed);
            if value > 0 {
                emit(
                    &[
                        ("probe_type", kind.as_str()),
                        ("result", result),
                        ("container", container),
                        ("pod", &c.pod.name),
                        ("namespace", &c.pod.namespace),
                        ("pod_uid", &c.pod.uid),
                    ],
                    value,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uids_sampled() -> Vec<String> {
        let mut uids = Vec::new();
        samples(|labels, _| {
            let uid = labels
                .iter()
                .find(|(k, _)| *k == "pod_uid")
                .map(|(_, v)| *v);
            uids.extend(uid.map(str::to_owned));
        });
        uids
    }

    /// Each pod's label sets go with the pod: churning pods do not grow the metric.
    #[test]
    fn a_gone_pods_label_sets_are_dropped() {
        let pod = |uid: &str| PodId {
            uid: uid.into(),
            namespace: "default".into(),
            name: "web".into(),
        };
        for uid in ["metrics-gone", "metrics-kept"] {
            for kind in ProbeKind::ALL {
                register(&pod(uid), "c", kind).count(ProbeResult::Success);
            }
        }
        forget_pod("metrics-gone");
        let uids = uids_sampled();
        assert!(!uids.iter().any(|u| u == "metrics-gone"));
        assert_eq!(uids.iter().filter(|u| *u == "metrics-kept").count(), 3);
        forget_pod("metrics-kept");
        assert!(!registry().keys().any(|(u, _, _)| u.starts_with("metrics-")));
    }
}
