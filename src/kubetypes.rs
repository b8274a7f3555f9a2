//! The pod-source vocabulary, as the kubelet's `pkg/kubelet/types` (`pod_update.go`, which
//! its code imports as `kubetypes`): the `kubernetes.io/config.*` annotations, the sources
//! (`api`, `file`), the stamp every source puts on the pods it delivers
//! ([`stamp_source`]), and what it tells: a static pod ([`is_static_pod`]), a mirror pod
//! ([`is_mirror_pod`]). The pod sources, the container manager's critical-pod policy and
//! the status manager use it from above. And, from `pod_status.go`, the pod conditions the
//! kubelet owns ([`pod_condition_by_kubelet`]): the others (readiness gates) are set by
//! controllers through `pods/status`.
//!
//! Knows no other module of the agent: no source, store, cgroup or API client.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// The annotation of a mirror pod: the hash of the static pod it mirrors.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
/// The annotation of a static pod: its hash (its UID).
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// The annotation of a pod's source: `file` for a static pod, `api` for the others. The
/// agent writes it on every pod from the source that delivered it ([`stamp_source`]).
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// The source of the API server's pods (the kubelet's `ApiserverSource`).
pub const API_SOURCE: &str = "api";
/// The source of static pods read from manifest files (the kubelet's `FileSource`).
pub const FILE_SOURCE: &str = "file";
/// The annotation with the time the agent first saw a pod.
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";

pub(crate) fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The pod is a mirror pod (it has the `kubernetes.io/config.mirror` annotation).
#[must_use]
pub fn is_mirror_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR).is_some()
}

/// Marks the pod with the source that delivered it, as the kubelet's pod config does to
/// every pod before anything looks at it: a `config.source` the pod's author wrote is
/// overwritten, so an API pod can never pass for a static pod.
pub fn stamp_source(pod: &mut Pod, source: &str) {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_SOURCE.to_owned(), source.to_owned());
}

/// The pod comes from another source than the API (the kubelet's `IsStaticPod`): only
/// trustworthy on a pod its source has stamped ([`stamp_source`]).
#[must_use]
pub fn is_static_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE).is_some_and(|s| s != API_SOURCE)
}

/// The UID of the static pod a mirror pod mirrors: its hash is the static pod's UID.
#[must_use]
pub fn mirrored_uid(mirror: &Pod) -> Option<&str> {
    annotation(mirror, CONFIG_MIRROR)
}

/// The pod conditions the kubelet owns (the kubelet's `PodConditionsByKubelet`); the
/// others (readiness gates' conditions) belong to whoever sets them through `pods/status`.
pub const POD_CONDITIONS_BY_KUBELET: [&str; 4] =
    ["PodScheduled", "Ready", "Initialized", "ContainersReady"];

/// The condition type is the kubelet's own (the kubelet's `PodConditionByKubelet`).
#[must_use]
pub fn pod_condition_by_kubelet(condition_type: &str) -> bool {
    POD_CONDITIONS_BY_KUBELET.contains(&condition_type)
}
