//! The labels and annotations the kubelet puts on CRI sandboxes and containers (its
//! `kuberuntime/labels.go`), so that `crictl` and other tools recognise the pods, and so
//! that this agent and the kubelet find each other's objects again after a restart or a
//! swap of node agents: the same keys, and values in the kubelet's form (numbers in
//! decimal, the hash in hex, hooks and ports as Go's JSON).

use std::collections::HashMap;

use crate::pod::PodId;

/// Pod name label on sandboxes and containers.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// Pod namespace label on sandboxes and containers.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Pod UID label on sandboxes and containers.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// Container name label on containers.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Annotation: hash of the container spec the container was made from.
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Annotation: the container's restart count when it was created.
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Annotation: where the container writes its termination message.
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// Annotation: `File` or `FallbackToLogsOnError`.
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
/// Annotation: the pod's termination grace period in seconds, when its spec sets one.
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Annotation: the grace period of the pod's deletion in seconds, when it was being
/// deleted as the container was made.
pub const POD_DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
/// Annotation: the container's preStop hook, as Go's JSON of a v1.20 `v1.Handler`.
pub const PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
/// Annotation: the container's ports, as Go's JSON of `[]v1.ContainerPort`.
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";

/// The pod a sandbox or container belongs to, if it carries the kubelet's labels.
#[must_use]
pub fn pod_of(labels: &HashMap<String, String>) -> Option<PodId> {
    Some(PodId {
        uid: labels.get(POD_UID)?.clone(),
        namespace: labels.get(POD_NAMESPACE)?.clone(),
        name: labels.get(POD_NAME)?.clone(),
    })
}

/// The labels that say which pod an object belongs to.
#[must_use]
pub fn pod_labels(pod: &PodId) -> HashMap<String, String> {
    HashMap::from([
        (POD_UID.to_owned(), pod.uid.clone()),
        (POD_NAMESPACE.to_owned(), pod.namespace.clone()),
        (POD_NAME.to_owned(), pod.name.clone()),
    ])
}

/// The label selector of a pod's containers of one name (all its restarts).
#[must_use]
pub fn container_selector(pod_uid: &str, container: &str) -> HashMap<String, String> {
    HashMap::from([
        (POD_UID.to_owned(), pod_uid.to_owned()),
        (CONTAINER_NAME.to_owned(), container.to_owned()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_labels_round_trip() {
        let pod = PodId {
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "p".into(),
        };
        assert_eq!(pod_of(&pod_labels(&pod)), Some(pod));
        assert_eq!(pod_of(&HashMap::new()), None);
    }
}
