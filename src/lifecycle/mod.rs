//! Pod lifecycle handlers, the kubelet's `pkg/kubelet/lifecycle`: whether a pod may run on
//! this node at all (admission), when a running pod must end (its active deadline), and a
//! container's postStart and preStop hooks (handlers).
//! Knows no pod worker, runtime manager or status manager: each rule is asked, and answers.

pub mod active_deadline;
pub mod admission;
pub mod handlers;
