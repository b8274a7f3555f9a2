//! The OOM score policy of the kubelet's `pkg/kubelet/qos`: which containers the kernel's
//! OOM killer picks first. BestEffort first (1000), Guaranteed and critical pods last
//! (-997), Burstable in between by the share of the node's memory they request. The
//! runtime may raise a value it is not allowed to set (containerd's
//! `restrict_oom_score_adj`), never lower it.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::resource_config::container_amounts;
use crate::resources::{QosClass, qos_class};

/// Guaranteed and critical pods' containers.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// BestEffort pods' containers.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// Priorities from here on are system-critical (`scheduling.SystemCriticalPriority`).
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// A critical pod: a static pod or its mirror, or of system-critical priority
/// (`types.IsCriticalPod`).
#[must_use]
pub fn is_critical(pod: &Pod) -> bool {
    use crate::kubetypes::{is_mirror_pod, is_static_pod};
    let priority = pod.spec.as_ref().and_then(|s| s.priority);
    is_static_pod(pod)
        || is_mirror_pod(pod)
        || priority.is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// The container's `oom_score_adj` (`GetContainerOOMScoreAdjust`), with the node's memory
/// capacity in bytes.
#[must_use]
pub fn container_oom_score_adj(pod: &Pod, container: &Container, memory_capacity: u64) -> i64 {
    if is_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match pod.spec.as_ref().map(qos_class) {
        Some(QosClass::Guaranteed) => return GUARANTEED_OOM_SCORE_ADJ,
        Some(QosClass::BestEffort) | None => return BEST_EFFORT_OOM_SCORE_ADJ,
        Some(QosClass::Burstable) => {}
    }
    let request = i128::from(container_amounts(container).0.memory.unwrap_or(0));
    let capacity = i128::from(memory_capacity.max(1));
    let adj = i64::try_from(1000 - (1000 * request) / capacity).unwrap_or(i64::MIN);
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        1000 + GUARANTEED_OOM_SCORE_ADJ
    } else if adj == BEST_EFFORT_OOM_SCORE_ADJ {
        adj - 1
    } else {
        adj
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::resource_config::tests::container;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(containers: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const GI: u64 = 1 << 30;

    #[test]
    fn scores_by_qos_class() {
        let be = container("c", &[], &[]);
        assert_eq!(
            container_oom_score_adj(&pod(vec![be.clone()]), &be, 4 * GI),
            1000
        );
        let g = container("c", &[], &[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(
            container_oom_score_adj(&pod(vec![g.clone()]), &g, 4 * GI),
            -997
        );
        // A quarter of the node's memory: 1000 - 250.
        let b = container("c", &[("memory", "1Gi")], &[]);
        assert_eq!(
            container_oom_score_adj(&pod(vec![b.clone()]), &b, 4 * GI),
            750
        );
        // A tiny request rounds to 1000, which is BestEffort's: 999.
        let tiny = container("c", &[("memory", "1Ki")], &[]);
        assert_eq!(
            container_oom_score_adj(&pod(vec![tiny.clone()]), &tiny, 4 * GI),
            999
        );
        // More than the node: never below Guaranteed's + 1000.
        let huge = container("c", &[("memory", "8Gi")], &[]);
        assert_eq!(
            container_oom_score_adj(&pod(vec![huge.clone()]), &huge, 4 * GI),
            3
        );
        // A container without a request in a Burstable pod.
        let other = container("d", &[], &[]);
        assert_eq!(
            container_oom_score_adj(&pod(vec![b, other.clone()]), &other, 4 * GI),
            1000 - 1
        );
    }

    #[test]
    fn critical_pods_score_as_guaranteed() {
        let be = container("c", &[], &[]);
        let mut p = pod(vec![be.clone()]);
        p.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        assert_eq!(container_oom_score_adj(&p, &be, GI), -997);
    }
}
