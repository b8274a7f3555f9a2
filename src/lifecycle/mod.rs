//! Pod lifecycle handlers, the kubelet's `pkg/kubelet/lifecycle`: whether a pod may run on
//! this node at all (admission) and when a running pod must end (its active deadline).

pub mod active_deadline;
pub mod admission;
