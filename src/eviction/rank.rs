//! The eviction order and message, pure (the ranking half of the kubelet's eviction
//! `helpers.go`). Under memory pressure pods are ranked by whether their working set
//! exceeds their memory request, then by priority (lowest first), then by how far their
//! usage is above their request (`rankMemoryPressure`); under disk pressure the same with
//! ephemeral storage (the containers' writable layers and logs, `rankDiskPressureFunc`
//! without a dedicated image filesystem); under PID or inode pressure by priority. A pod
//! with no stats goes first, as in the kubelet. So a BestEffort pod (no request: any
//! usage exceeds it) goes before a Burstable or Guaranteed pod within its request.

use std::cmp::Ordering;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::node::Signal;
use crate::resources::Quantity;

/// The kubelet's eviction reason, of the pod status and of the event.
pub const REASON: &str = "Evicted";

/// What one container uses, from the runtime's stats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerUsage {
    /// The container's name in the pod spec.
    pub name: String,
    /// Its memory working set, in bytes.
    pub working_set_bytes: Option<u64>,
    /// Its writable layer, in bytes.
    pub rootfs_bytes: Option<u64>,
    /// Its log files, in bytes.
    pub logs_bytes: Option<u64>,
}

impl ContainerUsage {
    /// Usage of `resource` (`memory` or `ephemeral-storage`) as the eviction message counts
    /// it: ephemeral storage only when both the writable layer and the logs are known.
    fn of(&self, resource: &str) -> Option<u64> {
        match resource {
            "memory" => self.working_set_bytes,
            "ephemeral-storage" => Some(self.rootfs_bytes? + self.logs_bytes?),
            _ => None,
        }
    }
}

/// What a running pod uses: its running containers'.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodUsage {
    /// One entry per running container.
    pub containers: Vec<ContainerUsage>,
}

impl PodUsage {
    fn memory(&self) -> u64 {
        self.containers
            .iter()
            .filter_map(|c| c.working_set_bytes)
            .sum()
    }

    fn disk(&self) -> u64 {
        let layers = self.containers.iter().filter_map(|c| c.rootfs_bytes);
        let logs = self.containers.iter().filter_map(|c| c.logs_bytes);
        layers.chain(logs).sum()
    }
}

/// A pod that may be evicted, with its usage (`None`: no stats were found).
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The pod.
    pub pod: Arc<Pod>,
    /// Its usage.
    pub usage: Option<PodUsage>,
}

/// A container's request of `resource`, in bytes (0 without one).
fn container_request(container: &Container, resource: &str) -> u64 {
    container
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .map_or(0, |q| u64::try_from(q.value()).unwrap_or(u64::MAX))
}

/// A pod's request of `resource` in bytes (`GetResourceRequestQuantity`): the app
/// containers' sum, at least any init container's, plus the pod overhead.
#[must_use]
pub fn pod_request(pod: &Pod, resource: &str) -> u64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let sum: u64 = spec
        .containers
        .iter()
        .map(|c| container_request(c, resource))
        .sum();
    let with_init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_request(c, resource))
        .fold(sum, u64::max);
    let overhead = spec
        .overhead
        .as_ref()
        .and_then(|o| o.get(resource))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .map_or(0, |q| u64::try_from(q.value()).unwrap_or(u64::MAX));
    with_init.saturating_add(overhead)
}

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// `true` first (the kubelet's `cmpBool`).
fn true_first(a: bool, b: bool) -> Ordering {
    b.cmp(&a)
}

/// Pods without stats first, then by `by` on the two usages.
fn with_stats(
    a: &Candidate,
    b: &Candidate,
    by: impl Fn(&Pod, &PodUsage, &Pod, &PodUsage) -> Ordering,
) -> Ordering {
    match (&a.usage, &b.usage) {
        (Some(ua), Some(ub)) => by(&a.pod, ua, &b.pod, ub),
        (ua, ub) => true_first(ua.is_none(), ub.is_none()),
    }
}

/// The usage of `resource` a signal ranks by, with the pod's request of it.
fn usage_and_request(signal: Signal, pod: &Pod, usage: &PodUsage) -> Option<(u64, u64)> {
    match signal {
        Signal::MemoryAvailable => Some((usage.memory(), pod_request(pod, "memory"))),
        // The image filesystem is not dedicated on the nodes rkubelet knows (containerd's
        // root shares the node's filesystem), so it ranks like nodefs: all of a pod's disk.
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => {
            Some((usage.disk(), pod_request(pod, "ephemeral-storage")))
        }
        // No per-pod inode or process counts: priority alone decides.
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree | Signal::PidAvailable => None,
    }
}

/// Orders `pods` for eviction under `signal`, the first to evict first. The sort is
/// stable: pods equal in every respect keep their order.
pub fn rank(signal: Signal, pods: &mut [Candidate]) {
    let exceeds = |a: &Candidate, b: &Candidate| {
        with_stats(a, b, |pa, ua, pb, ub| {
            let over = |p, u| usage_and_request(signal, p, u).is_some_and(|(u, r)| u > r);
            true_first(over(pa, ua), over(pb, ub))
        })
    };
    let above_request = |a: &Candidate, b: &Candidate| {
        with_stats(a, b, |pa, ua, pb, ub| {
            let above = |p, u| {
                usage_and_request(signal, p, u).map_or(0, |(u, r)| i128::from(u) - i128::from(r))
            };
            above(pb, ub).cmp(&above(pa, ua))
        })
    };
    pods.sort_by(|a, b| {
        exceeds(a, b)
            .then_with(|| priority(&a.pod).cmp(&priority(&b.pod)))
            .then_with(|| above_request(a, b))
    });
}

/// A byte count as the kubelet prints a `BinarySI` quantity: in decimal below 1024 (`512`,
/// `1k`), plain when not a whole multiple of 1024, else with the largest whole binary
/// suffix (`5268Ki`, `64Mi`).
#[must_use]
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return crate::node::decimal_quantity(bytes).0;
    }
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    format!("{value}{suffix}")
}

/// The eviction message (`evictionMessage`): `The node was low on resource: <resource>. `,
/// then for each container using more than its request
/// `Container <name> was using <usage>, which exceeds its request of <request>. `.
#[must_use]
pub fn eviction_message(signal: Signal, pod: &Pod, usage: Option<&PodUsage>) -> String {
    let resource = signal.resource();
    let mut message = format!("The node was low on resource: {resource}. ");
    let (Some(usage), Some(spec)) = (usage, pod.spec.as_ref()) else {
        return message;
    };
    for stats in &usage.containers {
        let Some(container) = spec.containers.iter().find(|c| c.name == stats.name) else {
            continue;
        };
        let Some(used) = stats.of(resource) else {
            continue;
        };
        if used > container_request(container, resource) {
            let request = container
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource))
                .map_or_else(|| "0".to_owned(), |q| q.0.clone());
            message.push_str(&format!(
                "Container {} was using {}, which exceeds its request of {request}. ",
                container.name,
                format_bytes(used)
            ));
        }
    }
    message
}

#[cfg(test)]
pub(super) mod testing {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    /// A one-container pod `name` (container `c`, UID `uid-<name>`) with the given
    /// requests (and equal limits when `guaranteed`), at `priority`.
    pub fn pod(name: &str, requests: &[(&str, &str)], guaranteed: bool, priority: i32) -> Arc<Pod> {
        let list: std::collections::BTreeMap<String, Quantity> = requests
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect();
        let mut p = crate::pod::testing::pod(name, &[("c", "busybox")]);
        p.metadata.uid = Some(format!("uid-{name}"));
        let spec = p.spec.as_mut().unwrap();
        spec.priority = Some(priority);
        spec.containers[0].resources = Some(ResourceRequirements {
            limits: guaranteed.then(|| list.clone()),
            requests: Some(list),
            ..ResourceRequirements::default()
        });
        Arc::new(p)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::pod;
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

    const MIB: u64 = 1 << 20;

    fn using(pod: Arc<Pod>, memory: u64, disk: u64) -> Candidate {
        Candidate {
            pod,
            usage: Some(PodUsage {
                containers: vec![ContainerUsage {
                    name: "c".into(),
                    working_set_bytes: Some(memory),
                    rootfs_bytes: Some(disk),
                    logs_bytes: Some(0),
                }],
            }),
        }
    }

    fn names(pods: &[Candidate]) -> Vec<&str> {
        pods.iter()
            .map(|c| c.pod.metadata.name.as_deref().unwrap_or_default())
            .collect()
    }

    #[test]
    fn memory_pressure_evicts_best_effort_then_burstable_then_guaranteed() {
        let mut pods = vec![
            using(
                pod("guaranteed", &[("memory", "100Mi")], true, 0),
                2 * MIB,
                0,
            ),
            using(
                pod("burstable", &[("memory", "50Mi")], false, 0),
                2 * MIB,
                0,
            ),
            using(pod("besteffort", &[], false, 0), MIB, 0),
        ];
        rank(Signal::MemoryAvailable, &mut pods);
        assert_eq!(names(&pods), ["besteffort", "burstable", "guaranteed"]);
    }

    #[test]
    fn exceeding_requests_comes_before_priority_and_priority_before_usage() {
        let mut pods = vec![
            // Within its request, lowest priority.
            using(
                pod("within-low", &[("memory", "100Mi")], false, -10),
                MIB,
                0,
            ),
            // Over its request, high priority.
            using(
                pod("over-high", &[("memory", "1Mi")], false, 1000),
                5 * MIB,
                0,
            ),
            // Over its request, low priority, small usage.
            using(pod("over-low-small", &[], false, 0), MIB, 0),
            // Over its request, low priority, large usage.
            using(pod("over-low-large", &[], false, 0), 90 * MIB, 0),
        ];
        rank(Signal::MemoryAvailable, &mut pods);
        assert_eq!(
            names(&pods),
            [
                "over-low-large",
                "over-low-small",
                "over-high",
                "within-low"
            ]
        );
    }

    #[test]
    fn a_pod_without_stats_goes_first() {
        let mut pods = vec![
            using(pod("measured", &[], false, 0), 90 * MIB, 0),
            Candidate {
                pod: pod("unmeasured", &[("memory", "1Gi")], true, 0),
                usage: None,
            },
        ];
        rank(Signal::MemoryAvailable, &mut pods);
        assert_eq!(names(&pods), ["unmeasured", "measured"]);
    }

    #[test]
    fn disk_pressure_ranks_by_ephemeral_storage_over_request() {
        let mut pods = vec![
            using(pod("small", &[], false, 0), 500 * MIB, MIB),
            using(
                pod("within", &[("ephemeral-storage", "1Gi")], false, 0),
                0,
                100 * MIB,
            ),
            using(pod("large", &[], false, 0), 0, 50 * MIB),
        ];
        rank(Signal::NodeFsAvailable, &mut pods);
        assert_eq!(names(&pods), ["large", "small", "within"]);
        // PID pressure: priority alone.
        let mut pods = vec![
            using(pod("high", &[], false, 10), 0, 0),
            using(pod("low", &[], false, 1), 0, 0),
        ];
        rank(Signal::PidAvailable, &mut pods);
        assert_eq!(names(&pods), ["low", "high"]);
    }

    #[test]
    fn pod_request_sums_containers_with_init_and_overhead() {
        let mut p = (*pod("p", &[("memory", "64Mi")], false, 0)).clone();
        let spec = p.spec.as_mut().unwrap();
        let mut init = spec.containers[0].clone();
        init.resources.as_mut().unwrap().requests =
            Some([("memory".to_owned(), ApiQuantity("128Mi".into()))].into());
        spec.init_containers = Some(vec![init]);
        spec.overhead = Some([("memory".to_owned(), ApiQuantity("1Mi".into()))].into());
        assert_eq!(pod_request(&p, "memory"), 129 * MIB);
        assert_eq!(pod_request(&p, "ephemeral-storage"), 0);
    }

    #[test]
    fn formats_bytes_as_binary_si() {
        assert_eq!(format_bytes(0), "0");
        assert_eq!(format_bytes(1000), "1k");
        assert_eq!(format_bytes(512), "512");
        assert_eq!(format_bytes(1536), "1536");
        assert_eq!(format_bytes(5_394_432), "5268Ki");
        assert_eq!(format_bytes(64 * MIB), "64Mi");
        assert_eq!(format_bytes(3 << 30), "3Gi");
    }

    #[test]
    fn message_names_the_resource_and_the_containers_over_their_requests() {
        let best_effort = using(pod("be", &[], false, 0), 5_394_432, 0);
        assert_eq!(
            eviction_message(
                Signal::MemoryAvailable,
                &best_effort.pod,
                best_effort.usage.as_ref()
            ),
            "The node was low on resource: memory. Container c was using 5268Ki, which exceeds its request of 0. "
        );
        let within = using(pod("g", &[("memory", "64Mi")], true, 0), MIB, 0);
        assert_eq!(
            eviction_message(Signal::MemoryAvailable, &within.pod, within.usage.as_ref()),
            "The node was low on resource: memory. "
        );
        let disk = using(
            pod("d", &[("ephemeral-storage", "1Mi")], false, 0),
            0,
            2 * MIB,
        );
        assert_eq!(
            eviction_message(Signal::NodeFsAvailable, &disk.pod, disk.usage.as_ref()),
            "The node was low on resource: ephemeral-storage. Container c was using 2Mi, which exceeds its request of 1Mi. "
        );
        assert_eq!(
            eviction_message(Signal::PidAvailable, &disk.pod, None),
            "The node was low on resource: pids. "
        );
    }
}
