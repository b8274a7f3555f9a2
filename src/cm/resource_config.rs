//! Cgroup settings from resources, as the kubelet's `cm/helpers_linux.go` computes them:
//! a pod's requests and limits (app containers summed, init containers as a floor,
//! overhead added), `ResourceConfigForPod`, and the shares and quota conversions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::resources::{QosClass, Quantity, qos_class};

/// The CFS period, in µs.
pub const QUOTA_PERIOD: u64 = 100_000;
/// The smallest CFS quota, in µs.
const MIN_QUOTA: i64 = 1000;
/// The fewest CPU shares (BestEffort).
pub const MIN_SHARES: u64 = 2;
/// The most CPU shares.
const MAX_SHARES: u64 = 262_144;

/// What a cgroup is set to; `None` leaves the setting alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// `cpu.shares`.
    pub cpu_shares: Option<u64>,
    /// `cpu.cfs_quota_us`.
    pub cpu_quota: Option<i64>,
    /// `cpu.cfs_period_us`.
    pub cpu_period: Option<u64>,
    /// `memory.limit_in_bytes`.
    pub memory: Option<i64>,
    /// `pids.max`.
    pub pids_limit: Option<i64>,
    /// Huge page limits by page size in bytes (`hugetlb.<size>.limit_in_bytes`); the
    /// sizes the machine has and this map lacks are limited to 0, as the kubelet does.
    pub hugepage_limits: BTreeMap<u64, i64>,
}

/// The huge page amounts of a resource list (`hugepages-2Mi: 4Mi`), by page size in
/// bytes (`HugePageLimits`).
#[must_use]
pub fn hugepage_limits(list: Option<&BTreeMap<String, ApiQuantity>>) -> BTreeMap<u64, i64> {
    let mut out = BTreeMap::new();
    for (name, amount) in list.into_iter().flatten() {
        let Some(size) = name.strip_prefix("hugepages-") else {
            continue;
        };
        let (Ok(size), Ok(amount)) = (Quantity::parse(size), Quantity::parse(&amount.0)) else {
            continue;
        };
        let size = u64::try_from(size.value()).unwrap_or(u64::MAX);
        let amount = i64::try_from(amount.value()).unwrap_or(i64::MAX);
        let total: &mut i64 = out.entry(size).or_default();
        *total = total.saturating_add(amount);
    }
    out
}

/// A page size as cgroup file names spell it: `2MB`, `1GB` (`HugePageUnitSizeFromByteSize`).
#[must_use]
pub fn hugepage_unit(mut size: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut unit = 0;
    while size.is_multiple_of(1024) && size > 0 && unit < UNITS.len() - 1 {
        size /= 1024;
        unit += 1;
    }
    format!("{size}{}", UNITS[unit])
}

/// CPU shares for millicores, between 2 and 262144 (`MilliCPUToShares`).
#[must_use]
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    let shares = u64::try_from(milli_cpu.saturating_mul(1024) / 1000).unwrap_or(0);
    shares.clamp(MIN_SHARES, MAX_SHARES)
}

/// CFS quota for millicores within `period`, at least 1 ms; 0 without a limit
/// (`MilliCPUToQuota`).
#[must_use]
pub fn milli_cpu_to_quota(milli_cpu: i64, period: u64) -> i64 {
    if milli_cpu == 0 {
        return 0;
    }
    (milli_cpu.saturating_mul(i64::try_from(period).unwrap_or(i64::MAX)) / 1000).max(MIN_QUOTA)
}

/// CPU (millicores) and memory (bytes) amounts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    /// CPU, in millicores.
    pub cpu: Option<i64>,
    /// Memory, in bytes.
    pub memory: Option<i64>,
}

fn amounts(list: Option<&BTreeMap<String, ApiQuantity>>) -> Amounts {
    let get = |name: &str, milli: bool| {
        let q = Quantity::parse(&list?.get(name)?.0).ok()?;
        let v = if milli { q.milli_value() } else { q.value() };
        Some(i64::try_from(v).unwrap_or(i64::MAX))
    };
    Amounts {
        cpu: get("cpu", true),
        memory: get("memory", false),
    }
}

/// A container's requests (defaulting to its limits, as the API does) and limits.
#[must_use]
pub fn container_amounts(c: &Container) -> (Amounts, Amounts) {
    let r = c.resources.as_ref();
    let limits = amounts(r.and_then(|r| r.limits.as_ref()));
    let requests = amounts(r.and_then(|r| r.requests.as_ref()));
    (
        Amounts {
            cpu: requests.cpu.or(limits.cpu),
            memory: requests.memory.or(limits.memory),
        },
        limits,
    )
}

impl Amounts {
    /// Each amount combined with the other's by `f`; an amount only one side has is kept.
    fn zip(self, other: Self, f: fn(i64, i64) -> i64) -> Self {
        let one = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(f(a, b)),
            (a, b) => a.or(b),
        };
        Self {
            cpu: one(self.cpu, other.cpu),
            memory: one(self.memory, other.memory),
        }
    }
}

/// The pod's requests and limits (`PodRequestsAndLimits`): the app containers' sum, at
/// least any init container's, plus the pod overhead (on limits only where set).
#[must_use]
pub fn pod_requests_and_limits(spec: &PodSpec) -> (Amounts, Amounts) {
    let (mut reqs, mut limits) = (Amounts::default(), Amounts::default());
    for c in &spec.containers {
        let (r, l) = container_amounts(c);
        reqs = reqs.zip(r, i64::saturating_add);
        limits = limits.zip(l, i64::saturating_add);
    }
    for c in spec.init_containers.iter().flatten() {
        let (r, l) = container_amounts(c);
        reqs = reqs.zip(r, i64::max);
        limits = limits.zip(l, i64::max);
    }
    let overhead = amounts(spec.overhead.as_ref());
    reqs = reqs.zip(overhead, i64::saturating_add);
    // Overhead adds to the limits that are set, and only to them.
    let set_only = Amounts {
        cpu: limits.cpu.filter(|l| *l != 0).and(overhead.cpu),
        memory: limits.memory.filter(|l| *l != 0).and(overhead.memory),
    };
    limits = limits.zip(set_only, i64::saturating_add);
    (reqs, limits)
}

/// The pod cgroup's settings (`ResourceConfigForPod`, CFS quota enforced): shares from
/// the requests; the quota only when every app container has a CPU limit, the memory
/// limit only when every one has a memory limit (always for Guaranteed); BestEffort
/// pods get the fewest shares.
#[must_use]
pub fn resource_config_for_pod(spec: &PodSpec) -> ResourceConfig {
    let (reqs, limits) = pod_requests_and_limits(spec);
    let shares = milli_cpu_to_shares(reqs.cpu.unwrap_or(0));
    let quota = milli_cpu_to_quota(limits.cpu.unwrap_or(0), QUOTA_PERIOD);
    let memory = limits.memory.unwrap_or(0);
    let mut hugepages = BTreeMap::new();
    for c in &spec.containers {
        // Requests default to the limits, as the API defaults them.
        let r = c.resources.as_ref();
        let mut requests = r.and_then(|r| r.limits.clone()).unwrap_or_default();
        requests.extend(r.and_then(|r| r.requests.clone()).unwrap_or_default());
        for (size, amount) in hugepage_limits(Some(&requests)) {
            let total: &mut i64 = hugepages.entry(size).or_default();
            *total = total.saturating_add(amount);
        }
    }
    let declared = |pick: fn(&Amounts) -> Option<i64>| {
        spec.containers
            .iter()
            .all(|c| pick(&container_amounts(c).1).unwrap_or(0) != 0)
    };
    match qos_class(spec) {
        QosClass::Guaranteed => ResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: Some(quota),
            cpu_period: Some(QUOTA_PERIOD),
            memory: Some(memory),
            pids_limit: None,
            hugepage_limits: hugepages,
        },
        QosClass::Burstable => {
            let cpu_limited = declared(|a| a.cpu);
            ResourceConfig {
                cpu_shares: Some(shares),
                cpu_quota: cpu_limited.then_some(quota),
                cpu_period: cpu_limited.then_some(QUOTA_PERIOD),
                memory: declared(|a| a.memory).then_some(memory),
                pids_limit: None,
                hugepage_limits: hugepages,
            }
        }
        QosClass::BestEffort => ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            hugepage_limits: hugepages,
            ..Default::default()
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    /// A container with `requests` and `limits` as (resource, quantity) pairs.
    pub fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let map = |l: &[(&str, &str)]| {
            (!l.is_empty()).then(|| {
                l.iter()
                    .map(|(k, v)| ((*k).to_owned(), ApiQuantity((*v).to_owned())))
                    .collect()
            })
        };
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: map(requests),
                limits: map(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn spec(containers: Vec<Container>, init: Vec<Container>) -> PodSpec {
        PodSpec {
            containers,
            init_containers: (!init.is_empty()).then_some(init),
            ..Default::default()
        }
    }

    #[test]
    fn shares_and_quota_match_the_kubelet() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(250), 256);
        assert_eq!(milli_cpu_to_shares(300_000), 262_144);
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD), 0);
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD), 1000);
        assert_eq!(milli_cpu_to_quota(250, QUOTA_PERIOD), 25_000);
        assert_eq!(milli_cpu_to_quota(500, QUOTA_PERIOD), 50_000);
        assert_eq!(milli_cpu_to_quota(1, QUOTA_PERIOD), 1000);
    }

    #[test]
    fn guaranteed_pods_get_shares_quota_and_memory() {
        let g = [("cpu", "500m"), ("memory", "64Mi")];
        let s = spec(
            vec![container("a", &[], &g), container("b", &[], &g)],
            vec![],
        );
        assert_eq!(
            resource_config_for_pod(&s),
            ResourceConfig {
                cpu_shares: Some(1024),
                cpu_quota: Some(100_000),
                cpu_period: Some(100_000),
                memory: Some(128 << 20),
                ..Default::default()
            }
        );
    }

    #[test]
    fn burstable_pods_get_limits_only_when_every_container_has_them() {
        let limited = container(
            "a",
            &[("cpu", "100m")],
            &[("cpu", "200m"), ("memory", "32Mi")],
        );
        let unlimited = container("b", &[("memory", "16Mi")], &[]);
        let only = spec(vec![limited.clone()], vec![]);
        assert_eq!(
            resource_config_for_pod(&only),
            ResourceConfig {
                cpu_shares: Some(102),
                cpu_quota: Some(20_000),
                cpu_period: Some(100_000),
                memory: Some(32 << 20),
                ..Default::default()
            }
        );
        let mixed = spec(vec![limited, unlimited], vec![]);
        assert_eq!(
            resource_config_for_pod(&mixed),
            ResourceConfig {
                cpu_shares: Some(102),
                ..Default::default()
            }
        );
    }

    #[test]
    fn init_containers_set_a_floor_and_overhead_adds() {
        let mut s = spec(
            vec![container(
                "a",
                &[("cpu", "100m")],
                &[("cpu", "100m"), ("memory", "10Mi")],
            )],
            vec![container(
                "i",
                &[("cpu", "1")],
                &[("cpu", "1"), ("memory", "5Mi")],
            )],
        );
        let (reqs, limits) = pod_requests_and_limits(&s);
        assert_eq!(
            (reqs.cpu, limits.cpu, limits.memory),
            (Some(1000), Some(1000), Some(10 << 20))
        );
        s.overhead = Some([("cpu".to_owned(), ApiQuantity("50m".into()))].into());
        let (reqs, limits) = pod_requests_and_limits(&s);
        assert_eq!((reqs.cpu, limits.cpu), (Some(1050), Some(1050)));
    }

    #[test]
    fn huge_pages_are_the_containers_requests_by_page_size() {
        let g = |n| {
            container(
                n,
                &[],
                &[
                    ("cpu", "1"),
                    ("memory", "64Mi"),
                    ("hugepages-2Mi", "4Mi"),
                    ("hugepages-1Gi", "1Gi"),
                ],
            )
        };
        let config = resource_config_for_pod(&spec(vec![g("a"), g("b")], vec![]));
        assert_eq!(
            config.hugepage_limits,
            BTreeMap::from([(2 << 20, 8 << 20), (1 << 30, 2 << 30)])
        );
        assert_eq!(hugepage_unit(2 << 20), "2MB");
        assert_eq!(hugepage_unit(1 << 30), "1GB");
        assert_eq!(hugepage_unit(64 << 10), "64KB");
    }

    #[test]
    fn best_effort_pods_get_the_fewest_shares() {
        assert_eq!(
            resource_config_for_pod(&spec(vec![container("a", &[], &[])], vec![])),
            ResourceConfig {
                cpu_shares: Some(2),
                ..Default::default()
            }
        );
    }
}
