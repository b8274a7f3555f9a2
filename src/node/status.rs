//! Node status, computed like the kubelet's `nodestatus` setters: each setter writes the
//! fields it owns onto the status last seen on the API server, so fields owned by others
//! (volumes attached, conditions set by controllers) are kept, a condition's
//! `lastTransitionTime` moves only when its status changes, and "has the status changed?"
//! can ignore heartbeat times.
//!
//! Everything here is pure: the agent gathers an [`Observation`] of the machine and the
//! runtime, and these functions turn it into a `NodeStatus` and a patch.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::config::{EvictionHard, NodeConfig, go_arch};
use super::machine::{FsStats, HugePages, PidUsage};
use super::quantity;
use super::signals::{Observations, Signal, thresholds_met};
use crate::cm::devicemanager::is_extended_resource_name;
use crate::cri::{self, RuntimeHealth};

/// The Node condition types this agent owns.
pub(crate) const MEMORY_PRESSURE: &str = "MemoryPressure";
pub(crate) const DISK_PRESSURE: &str = "DiskPressure";
pub(crate) const PID_PRESSURE: &str = "PIDPressure";
pub(crate) const READY: &str = "Ready";
const OWN_CONDITIONS: [&str; 4] = [MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE, READY];

/// At most this many names (digests, then tags) per image, like the kubelet.
const MAX_NAMES_PER_IMAGE: usize = 5;

/// What the machine offers, read once per status computation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Capacity {
    pub cpus: u32,
    pub memory_bytes: u64,
    pub hugepages: Vec<HugePages>,
    /// `None` when the root directory's filesystem could not be read.
    pub ephemeral_storage_bytes: Option<u64>,
}

/// The identifiers and versions in `nodeInfo`; `None` keeps what the server has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SystemFacts {
    pub machine_id: Option<String>,
    pub system_uuid: Option<String>,
    pub boot_id: Option<String>,
    pub kernel_version: Option<String>,
    pub os_image: Option<String>,
    /// `containerd://1.6.20~ds1`.
    pub runtime_version: Option<String>,
}

/// One look at the machine and the runtime. A fact that could not be read is `None`
/// (and was logged where it was read).
#[derive(Debug, Clone)]
pub(crate) struct Observation {
    pub capacity: Option<Capacity>,
    pub memory_available_bytes: Option<u64>,
    pub nodefs: Option<FsStats>,
    /// The filesystem holding the runtime's images (CRI `ImageFsInfo`).
    pub imagefs: Option<FsStats>,
    pub pids: Option<PidUsage>,
    pub system: SystemFacts,
    /// `None` when the runtime did not answer `Status` (it is down).
    pub runtime_health: Option<RuntimeHealth>,
    /// `"<name> is not healthy: <error>"` for each failing readiness check.
    pub failed_checks: Vec<String>,
    /// `None` when the image list could not be read: the reported list is kept.
    pub images: Option<Vec<ContainerImage>>,
    /// The device plugins' resources.
    pub extended: ExtendedResources,
}

/// The device plugins' resources in the node status (the kubelet's
/// `GetDevicePluginResourceCapacity`): devices per resource in capacity, healthy ones in
/// allocatable, and resources whose plugin is gone for good, whose capacity turns 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtendedResources {
    /// Devices per resource.
    pub capacity: BTreeMap<String, u64>,
    /// Healthy devices per resource.
    pub allocatable: BTreeMap<String, u64>,
    /// Resources no longer served.
    pub removed: Vec<String>,
}

/// Which pressure conditions hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    /// MemoryPressure: `memory.available` below its threshold.
    pub memory: bool,
    /// DiskPressure: a `nodefs.*` or `imagefs.*` signal below its threshold.
    pub disk: bool,
    /// PIDPressure: `pid.available` below its threshold.
    pub pid: bool,
}

impl Pressure {
    /// The hard eviction thresholds met by `obs`, as the eviction manager decides them
    /// ([`thresholds_met`]): `memory.available` (capacity less the root
    /// memory cgroup's working set) below its threshold; `nodefs.*` or `imagefs.*` below their percentages; PIDs available below their percentage of `pid_max`. A figure that
    /// could not be read meets nothing.
    pub(crate) fn observed(obs: &Observation, hard: &EvictionHard) -> Self {
        let signals = Observations {
            memory_available_bytes: obs.memory_available_bytes,
            nodefs: obs.nodefs,
            imagefs: obs.imagefs,
            pids: obs.pids,
        };
        Self::of_signals(&thresholds_met(&signals, hard))
    }

    /// The conditions of the signals `met` (the kubelet's `nodeConditions`).
    #[must_use]
    pub fn of_signals(met: &[Signal]) -> Self {
        let holds = |condition: &str| met.iter().any(|s| s.condition() == condition);
        Self {
            memory: holds(MEMORY_PRESSURE),
            disk: holds(DISK_PRESSURE),
            pid: holds(PID_PRESSURE),
        }
    }

    /// The names of the conditions that hold, in the order the kubelet lists them.
    #[must_use]
    pub fn conditions(self) -> Vec<&'static str> {
        [
            (self.memory, MEMORY_PRESSURE),
            (self.disk, DISK_PRESSURE),
            (self.pid, PID_PRESSURE),
        ]
        .into_iter()
        .filter_map(|(holds, name)| holds.then_some(name))
        .collect()
    }
}

/// Keeps each pressure condition true for a transition period after it was last
/// observed, like the kubelet's `--eviction-pressure-transition-period`
/// (`nodeConditionsLastObservedAt`, then `nodeConditionsObservedSince`).
#[derive(Debug, Default)]
pub struct PressureTracker {
    memory: Option<Instant>,
    disk: Option<Instant>,
    pid: Option<Instant>,
}

impl PressureTracker {
    /// The conditions that hold at `now`: those `observed` now, and those last observed
    /// less than `period` ago.
    pub fn update(&mut self, observed: Pressure, now: Instant, period: Duration) -> Pressure {
        let hold = |seen: bool, last: &mut Option<Instant>| {
            if seen {
                *last = Some(now);
            }
            last.is_some_and(|at| now.saturating_duration_since(at) < period)
        };
        Pressure {
            memory: hold(observed.memory, &mut self.memory),
            disk: hold(observed.disk, &mut self.disk),
            pid: hold(observed.pid, &mut self.pid),
        }
    }
}

/// The current time, to the second: what the API server keeps of a `Time`.
pub(crate) fn now() -> Time {
    let now = Timestamp::now();
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Writes every field this agent owns onto `status` (the status last seen on the server,
/// or an empty one for a new Node): addresses, capacity and allocatable, nodeInfo,
/// daemon endpoints, images, and the four conditions.
pub(crate) fn set_node_status(
    status: &mut NodeStatus,
    config: &NodeConfig,
    obs: &Observation,
    pressure: Pressure,
    now: &Time,
) {
    set_addresses(status, config);
    set_machine_info(status, config, obs);
    set_node_info(status, config, &obs.system);
    status.daemon_endpoints = Some(NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: i32::from(config.daemon_port),
        }),
    });
    if let Some(images) = &obs.images {
        // An empty list is omitted by the server: keep it absent so it compares equal.
        status.images = (!images.is_empty()).then(|| images.clone());
    }
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    set_pressure_condition(
        conditions,
        MEMORY_PRESSURE,
        pressure.memory,
        (
            "KubeletHasInsufficientMemory",
            "kubelet has insufficient memory available",
        ),
        (
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        now,
    );
    set_pressure_condition(
        conditions,
        DISK_PRESSURE,
        pressure.disk,
        ("KubeletHasDiskPressure", "kubelet has disk pressure"),
        ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        now,
    );
    set_pressure_condition(
        conditions,
        PID_PRESSURE,
        pressure.pid,
        (
            "KubeletHasInsufficientPID",
            "kubelet has insufficient PID available",
        ),
        (
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        now,
    );
    let problems = not_ready_reasons(status.capacity.as_ref(), obs);
    set_ready_condition(
        status.conditions.get_or_insert_with(Vec::new),
        &problems,
        now,
    );
}

/// `InternalIP` (the node IP) then `Hostname`, replacing whatever was there.
fn set_addresses(status: &mut NodeStatus, config: &NodeConfig) {
    status.addresses = Some(vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: config.node_ip.to_string(),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: config.hostname.clone(),
        },
    ]);
}

/// Capacity from the machine, and allocatable = capacity − kube-reserved −
/// system-reserved − the hard eviction thresholds (memory.available for memory,
/// nodefs.available for ephemeral-storage) − huge pages (for memory), never below zero:
/// the kubelet's `GetNodeAllocatableReservation`. Extended resources this agent does not
/// serve (patched into capacity by others, as an operator advertises a node's dongles) are
/// allocatable as they are in capacity, and leave allocatable when they leave capacity, as
/// the kubelet's `MachineInfo` setter copies them; other resources it does not know are
/// left alone.
fn set_machine_info(status: &mut NodeStatus, config: &NodeConfig, obs: &Observation) {
    let Some(cap) = &obs.capacity else {
        // Keep the last reported capacity; Ready lists what is missing if there is none.
        return;
    };
    let reserved = |pick: fn(&super::Reservation) -> u64| {
        pick(&config.kube_reserved).saturating_add(pick(&config.system_reserved))
    };
    let hugepages_bytes: u64 = cap
        .hugepages
        .iter()
        .map(|h| h.page_size_bytes.saturating_mul(h.pages))
        .sum();

    let mut capacity: Vec<(String, Quantity)> = vec![
        ("cpu".into(), quantity::count(u64::from(cap.cpus))),
        ("memory".into(), quantity::bytes(cap.memory_bytes)),
        ("pods".into(), quantity::count(u64::from(config.max_pods))),
    ];
    let mut allocatable: Vec<(String, Quantity)> = vec![
        (
            "cpu".into(),
            quantity::millis(
                (u64::from(cap.cpus) * 1000).saturating_sub(reserved(|r| r.cpu_millis)),
            ),
        ),
        (
            "memory".into(),
            quantity::bytes(
                cap.memory_bytes
                    .saturating_sub(reserved(|r| r.memory_bytes))
                    .saturating_sub(config.eviction_hard.memory_available_bytes)
                    .saturating_sub(hugepages_bytes),
            ),
        ),
        ("pods".into(), quantity::count(u64::from(config.max_pods))),
    ];
    if let Some(storage) = cap.ephemeral_storage_bytes {
        let eviction = config.eviction_hard.nodefs_available.amount_of(storage);
        capacity.push(("ephemeral-storage".into(), quantity::bytes(storage)));
        allocatable.push((
            "ephemeral-storage".into(),
            quantity::bytes(
                storage
                    .saturating_sub(reserved(|r| r.ephemeral_storage_bytes))
                    .saturating_sub(eviction),
            ),
        ));
    }
    for h in &cap.hugepages {
        let name = format!("hugepages-{}", quantity::bytes(h.page_size_bytes).0);
        let total = quantity::bytes(h.page_size_bytes.saturating_mul(h.pages));
        capacity.push((name.clone(), total.clone()));
        allocatable.push((name, total));
    }
    // Device plugin resources: allocatable as capacity, then the healthy devices; a
    // resource whose plugin is gone keeps its name with capacity 0 (so it is known to be
    // a device plugin's).
    let extended = &obs.extended;
    for (name, count) in &extended.capacity {
        capacity.push((name.clone(), quantity::count(*count)));
        let healthy = extended.allocatable.get(name).unwrap_or(count);
        allocatable.push((name.clone(), quantity::count(*healthy)));
    }
    for name in &extended.removed {
        capacity.push((name.clone(), quantity::count(0)));
        allocatable.push((name.clone(), quantity::count(0)));
    }
    let own: Vec<String> = allocatable.iter().map(|(name, _)| name.clone()).collect();
    let capacity_now = status.capacity.get_or_insert_with(BTreeMap::new);
    capacity_now.extend(capacity);
    let allocatable_now = status.allocatable.get_or_insert_with(BTreeMap::new);
    allocatable_now
        .retain(|name, _| capacity_now.contains_key(name) || !is_extended_resource_name(name));
    allocatable_now.extend(allocatable);
    for (name, amount) in capacity_now.iter() {
        if is_extended_resource_name(name) && !own.contains(name) {
            allocatable_now.insert(name.clone(), amount.clone());
        }
    }
}

/// IDs, versions, OS and architecture. A fact that could not be read keeps the value the
/// server has; a changed boot ID is logged as a reboot.
fn set_node_info(status: &mut NodeStatus, config: &NodeConfig, facts: &SystemFacts) {
    let info = status.node_info.get_or_insert_with(NodeSystemInfo::default);
    let keep_or_set = |field: &mut String, fact: &Option<String>| {
        if let Some(value) = fact {
            field.clone_from(value);
        }
    };
    if let Some(boot_id) = &facts.boot_id
        && !info.boot_id.is_empty()
        && info.boot_id != *boot_id
    {
        tracing::warn!(node = %config.name, boot_id, "node has been rebooted");
    }
    keep_or_set(&mut info.machine_id, &facts.machine_id);
    keep_or_set(&mut info.system_uuid, &facts.system_uuid);
    keep_or_set(&mut info.boot_id, &facts.boot_id);
    keep_or_set(&mut info.kernel_version, &facts.kernel_version);
    keep_or_set(&mut info.os_image, &facts.os_image);
    keep_or_set(&mut info.container_runtime_version, &facts.runtime_version);
    info.kubelet_version.clone_from(&config.kubelet_version);
    info.kube_proxy_version.clone_from(&config.kubelet_version);
    "linux".clone_into(&mut info.operating_system);
    go_arch().clone_into(&mut info.architecture);
}

/// Updates (or appends) a pressure condition. Its reason, message and transition time
/// change only when its status does; the heartbeat time always.
fn set_pressure_condition(
    conditions: &mut Vec<NodeCondition>,
    kind: &str,
    under_pressure: bool,
    (true_reason, true_message): (&str, &str),
    (false_reason, false_message): (&str, &str),
    now: &Time,
) {
    let index = conditions.iter().position(|c| c.type_ == kind);
    let condition = match index {
        Some(i) => &mut conditions[i],
        None => {
            conditions.push(NodeCondition {
                type_: kind.into(),
                status: "Unknown".into(),
                ..NodeCondition::default()
            });
            let last = conditions.len() - 1;
            &mut conditions[last]
        }
    };
    condition.last_heartbeat_time = Some(now.clone());
    let (status, reason, message) = if under_pressure {
        ("True", true_reason, true_message)
    } else {
        ("False", false_reason, false_message)
    };
    if condition.status != status {
        condition.status = status.into();
        condition.reason = Some(reason.into());
        condition.message = Some(message.into());
        condition.last_transition_time = Some(now.clone());
    }
}

/// Why the node is not ready, in the kubelet's words and order: the runtime's errors
/// (down, failing health checks, RuntimeReady false), then the network's, then missing
/// capacities.
pub(crate) fn not_ready_reasons(
    capacity: Option<&BTreeMap<String, Quantity>>,
    obs: &Observation,
) -> Vec<String> {
    let mut problems = Vec::new();
    if obs.runtime_health.is_none() {
        problems.push("container runtime is down".to_owned());
    }
    problems.extend(obs.failed_checks.iter().cloned());
    if let Some(health) = &obs.runtime_health {
        if !health.runtime.ready {
            problems.push(format!(
                "container runtime not ready: {}",
                kubelet_condition(&health.runtime)
            ));
        }
        if !health.network.ready {
            problems.push(format!(
                "container runtime network not ready: {}",
                kubelet_condition(&health.network)
            ));
        }
    }
    let missing: Vec<&str> = ["cpu", "memory", "pods", "ephemeral-storage"]
        .into_iter()
        .filter(|r| capacity.is_none_or(|c| !c.contains_key(*r)))
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "Missing node capacity for resources: {}",
            missing.join(", ")
        ));
    }
    problems
}

/// A runtime condition as the kubelet prints one: `NetworkReady=false reason:X message:Y`.
fn kubelet_condition(c: &cri::Condition) -> String {
    format!(
        "{}={} reason:{} message:{}",
        c.kind, c.ready, c.reason, c.message
    )
}

/// Sets Ready: `KubeletReady` when nothing is wrong, else `KubeletNotReady` with the
/// problems as one message (a single problem as is, several as `[a, b]`, like Go's
/// aggregated errors). The transition time moves only when the status changes.
fn set_ready_condition(conditions: &mut Vec<NodeCondition>, problems: &[String], now: &Time) {
    let (status, reason, message) = match problems {
        [] => (
            "True",
            "KubeletReady",
            "kubelet is posting ready status".to_owned(),
        ),
        [one] => ("False", "KubeletNotReady", one.clone()),
        many => ("False", "KubeletNotReady", format!("[{}]", many.join(", "))),
    };
    let mut ready = NodeCondition {
        type_: READY.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    match conditions.iter_mut().find(|c| c.type_ == READY) {
        Some(existing) => {
            if existing.status == ready.status {
                ready.last_transition_time = existing.last_transition_time.clone();
            } else {
                tracing::info!(
                    status,
                    reason,
                    message = ready.message.as_deref(),
                    "node readiness changed"
                );
            }
            *existing = ready;
        }
        None => conditions.push(ready),
    }
}

/// The kubelet's `nodeStatusHasChanged`: any difference but heartbeat times, conditions
/// compared by type whatever their order.
pub(crate) fn status_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    fn comparable(status: &NodeStatus) -> NodeStatus {
        let mut s = status.clone();
        if let Some(conditions) = &mut s.conditions {
            for c in conditions.iter_mut() {
                c.last_heartbeat_time = None;
            }
            conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
        s
    }
    comparable(old) != comparable(new)
}

/// The strategic merge patch of `nodes/status` from `base` (as read) to `status` that sends
/// the fields this agent owns and nothing else, so that what others wrote between our read
/// and our patch survives; what left allocatable is deleted.
/// Conditions merge by type; the address list replaces the server's (a stale address must
/// go away, which merging by type cannot do).
pub(crate) fn status_patch(base: Option<&NodeStatus>, status: &NodeStatus) -> serde_json::Value {
    let own_conditions: Vec<&NodeCondition> = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| OWN_CONDITIONS.contains(&c.type_.as_str()))
        .collect();
    let mut addresses = vec![serde_json::json!({"$patch": "replace"})];
    addresses.extend(
        status
            .addresses
            .iter()
            .flatten()
            .map(|a| serde_json::json!({"type": a.type_, "address": a.address})),
    );
    let mut patch = serde_json::json!({
        "addresses": addresses,
        "capacity": status.capacity,
        "allocatable": merging(
            base.and_then(|b| b.allocatable.as_ref()),
            status.allocatable.as_ref(),
        ),
        "conditions": own_conditions,
        "daemonEndpoints": status.daemon_endpoints,
        "nodeInfo": status.node_info,
    });
    if let Some(images) = &status.images {
        patch["images"] = serde_json::json!(images);
    }
    // In a merge patch null deletes: send nothing rather than null for what is unknown.
    if let Some(fields) = patch.as_object_mut() {
        fields.retain(|_, value| !value.is_null());
    }
    serde_json::json!({ "status": patch })
}

/// The merge patch of a map from `base` (as read from the server) to `new`: its entries,
/// and null for each one that left it; null when `new` is unknown.
fn merging(
    base: Option<&BTreeMap<String, Quantity>>,
    new: Option<&BTreeMap<String, Quantity>>,
) -> serde_json::Value {
    let Some(new) = new else {
        return serde_json::Value::Null;
    };
    let mut patch = serde_json::Map::new();
    for name in base.into_iter().flatten().map(|(name, _)| name) {
        if !new.contains_key(name) {
            patch.insert(name.clone(), serde_json::Value::Null);
        }
    }
    for (name, amount) in new {
        patch.insert(name.clone(), serde_json::json!(amount));
    }
    serde_json::Value::Object(patch)
}

/// The node's images for `status.images`: largest first, at most `max`, each with at most
/// five names (digests, then tags); images without a name are left out.
pub(crate) fn node_images(mut images: Vec<cri::api::Image>, max: usize) -> Vec<ContainerImage> {
    images.sort_by_key(|image| std::cmp::Reverse(image.size));
    images
        .into_iter()
        .filter_map(|image| {
            let names: Vec<String> = image
                .repo_digests
                .into_iter()
                .chain(image.repo_tags)
                .take(MAX_NAMES_PER_IMAGE)
                .collect();
            (!names.is_empty()).then(|| ContainerImage {
                names: Some(names),
                size_bytes: i64::try_from(image.size).ok(),
            })
        })
        .take(max)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{Condition, NETWORK_READY, RUNTIME_READY};
    use crate::node::Reservation;
    use crate::node::machine::fake::{GIB, MIB};

    fn config() -> NodeConfig {
        NodeConfig::new("rk-node1", "198.18.0.1".parse().unwrap())
    }

    fn healthy() -> RuntimeHealth {
        let ok = |kind| Condition {
            kind,
            ready: true,
            reason: String::new(),
            message: String::new(),
        };
        RuntimeHealth {
            runtime: ok(RUNTIME_READY),
            network: ok(NETWORK_READY),
        }
    }

    /// A 100 GiB filesystem with `available_gib` free and `inodes_free` of `inodes`.
    fn disk(available_gib: u64, inodes: u64, inodes_free: u64) -> Option<FsStats> {
        Some(FsStats {
            capacity_bytes: 100 * GIB,
            available_bytes: available_gib * GIB,
            inodes,
            inodes_free,
        })
    }

    fn observation() -> Observation {
        Observation {
            capacity: Some(Capacity {
                cpus: 2,
                memory_bytes: 24 * GIB,
                hugepages: vec![
                    HugePages {
                        page_size_bytes: 2 * MIB,
                        pages: 0,
                    },
                    HugePages {
                        page_size_bytes: GIB,
                        pages: 0,
                    },
                ],
                ephemeral_storage_bytes: Some(100 * GIB),
            }),
            memory_available_bytes: Some(20 * GIB),
            nodefs: disk(60, 1000, 900),
            imagefs: disk(60, 1000, 900),
            pids: Some(PidUsage {
                running: 150,
                max: 32768,
            }),
            system: SystemFacts {
                machine_id: Some("m".into()),
                system_uuid: None,
                boot_id: Some("b".into()),
                kernel_version: Some("6.1".into()),
                os_image: Some("Debian GNU/Linux 12 (bookworm)".into()),
                runtime_version: Some("containerd://1.6.20~ds1".into()),
            },
            runtime_health: Some(healthy()),
            failed_checks: Vec::new(),
            images: None,
            extended: ExtendedResources::default(),
        }
    }

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(1_700_000_000 + second).unwrap())
    }

    fn computed(base: &NodeStatus, config: &NodeConfig, obs: &Observation, t: i64) -> NodeStatus {
        let mut status = base.clone();
        let pressure = Pressure::observed(obs, &config.eviction_hard);
        set_node_status(&mut status, config, obs, pressure, &at(t));
        status
    }

    fn condition<'a>(status: &'a NodeStatus, kind: &str) -> &'a NodeCondition {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == kind)
            .unwrap_or_else(|| panic!("no {kind} condition"))
    }

    fn quantity<'a>(list: &'a Option<BTreeMap<String, Quantity>>, name: &str) -> &'a str {
        &list.as_ref().unwrap()[name].0
    }

    #[test]
    fn capacity_comes_from_the_machine_and_allocatable_subtracts_reservations() {
        let mut config = config();
        config.kube_reserved = Reservation {
            cpu_millis: 100,
            memory_bytes: 256 * MIB,
            ephemeral_storage_bytes: GIB,
        };
        config.system_reserved = Reservation {
            cpu_millis: 100,
            memory_bytes: 0,
            ephemeral_storage_bytes: 0,
        };
        let mut obs = observation();
        if let Some(cap) = obs.capacity.as_mut() {
            cap.hugepages[0].pages = 512; // 1 GiB of 2 MiB pages
        }
        let s = computed(&NodeStatus::default(), &config, &obs, 0);
        assert_eq!(quantity(&s.capacity, "cpu"), "2");
        assert_eq!(quantity(&s.capacity, "memory"), "24Gi");
        assert_eq!(quantity(&s.capacity, "pods"), "110");
        assert_eq!(quantity(&s.capacity, "ephemeral-storage"), "100Gi");
        assert_eq!(quantity(&s.capacity, "hugepages-2Mi"), "1Gi");
        assert_eq!(quantity(&s.capacity, "hugepages-1Gi"), "0");
        assert_eq!(quantity(&s.allocatable, "cpu"), "1800m");
        // 24Gi − 256Mi reserved − 100Mi eviction − 1Gi huge pages = 23196Mi.
        assert_eq!(quantity(&s.allocatable, "memory"), "23196Mi");
        assert_eq!(quantity(&s.allocatable, "pods"), "110");
        // 100Gi − 1Gi reserved − 10% (10Gi) eviction = 89Gi.
        assert_eq!(quantity(&s.allocatable, "ephemeral-storage"), "89Gi");
        assert_eq!(quantity(&s.allocatable, "hugepages-2Mi"), "1Gi");
    }

    #[test]
    fn defaults_subtract_only_the_memory_eviction_threshold_and_never_go_negative() {
        let s = computed(&NodeStatus::default(), &config(), &observation(), 0);
        assert_eq!(quantity(&s.allocatable, "cpu"), "2");
        assert_eq!(quantity(&s.allocatable, "memory"), "24476Mi");
        assert_eq!(quantity(&s.allocatable, "ephemeral-storage"), "90Gi");
        let mut config = config();
        config.kube_reserved.cpu_millis = 5000;
        config.kube_reserved.memory_bytes = 100 * GIB;
        let s = computed(&NodeStatus::default(), &config, &observation(), 0);
        assert_eq!(quantity(&s.allocatable, "cpu"), "0");
        assert_eq!(quantity(&s.allocatable, "memory"), "0");
    }

    #[test]
    fn foreign_resources_and_conditions_are_kept() {
        let base = NodeStatus {
            capacity: Some(BTreeMap::from([(
                "example.com/gpu".to_owned(),
                Quantity("1".into()),
            )])),
            conditions: Some(vec![NodeCondition {
                type_: "NetworkUnavailable".into(),
                status: "False".into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        };
        let s = computed(&base, &config(), &observation(), 0);
        assert_eq!(quantity(&s.capacity, "example.com/gpu"), "1");
        let types: Vec<_> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            [
                "NetworkUnavailable",
                MEMORY_PRESSURE,
                DISK_PRESSURE,
                PID_PRESSURE,
                READY
            ]
        );
        // Only our own conditions are patched.
        let patch = status_patch(None, &s);
        let patched: Vec<_> = patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(patched, OWN_CONDITIONS);
    }

    #[test]
    fn device_plugin_resources_report_healthy_devices_and_zero_when_removed() {
        let mut obs = observation();
        obs.extended.capacity.insert("example.com/dev".into(), 4);
        obs.extended.allocatable.insert("example.com/dev".into(), 3);
        let s = computed(&NodeStatus::default(), &config(), &obs, 0);
        assert_eq!(quantity(&s.capacity, "example.com/dev"), "4");
        assert_eq!(quantity(&s.allocatable, "example.com/dev"), "3");
        obs.extended = ExtendedResources {
            removed: vec!["example.com/dev".into()],
            ..Default::default()
        };
        let s = computed(&s, &config(), &obs, 1);
        assert_eq!(quantity(&s.capacity, "example.com/dev"), "0");
        assert_eq!(quantity(&s.allocatable, "example.com/dev"), "0");
    }

    /// The suite's scheduler preemption tests patch `scheduling.k8s.io/foo: 3` into a
    /// node's capacity and wait for the agent to make it allocatable; then take it out of
    /// capacity, and allocatable follows (the kubelet's `MachineInfo` setter).
    #[test]
    fn extended_resources_patched_into_capacity_become_allocatable() {
        let foo = "scheduling.k8s.io/foo";
        let mut base = computed(&NodeStatus::default(), &config(), &observation(), 0);
        base.capacity
            .as_mut()
            .unwrap()
            .insert(foo.into(), Quantity("3".into()));
        let s = computed(&base, &config(), &observation(), 1);
        assert_eq!(quantity(&s.allocatable, foo), "3");
        assert_eq!(quantity(&s.allocatable, "cpu"), "2", "its own are computed");
        let patch = status_patch(Some(&base), &s);
        assert_eq!(patch["status"]["allocatable"][foo], "3", "{patch}");

        let mut gone = s.clone();
        gone.capacity.as_mut().unwrap().remove(foo);
        let s = computed(&gone, &config(), &observation(), 2);
        assert!(!s.allocatable.as_ref().unwrap().contains_key(foo));
        let patch = status_patch(Some(&gone), &s);
        assert!(patch["status"]["allocatable"][foo].is_null(), "{patch}");
        assert!(
            patch["status"]["allocatable"]
                .as_object()
                .unwrap()
                .contains_key(foo),
            "deleted, not left out: {patch}"
        );
        // Only extended resources: a foreign native one stays as it was.
        let mut other = s.clone();
        other
            .allocatable
            .as_mut()
            .unwrap()
            .insert("attachable-volumes-x".into(), Quantity("7".into()));
        let s = computed(&other, &config(), &observation(), 3);
        assert_eq!(quantity(&s.allocatable, "attachable-volumes-x"), "7");
    }

    #[test]
    fn addresses_node_info_and_endpoints() {
        let s = computed(&NodeStatus::default(), &config(), &observation(), 0);
        let addresses: Vec<_> = s
            .addresses
            .iter()
            .flatten()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect();
        assert_eq!(
            addresses,
            [("InternalIP", "198.18.0.1"), ("Hostname", "rk-node1")]
        );
        let info = s.node_info.as_ref().unwrap();
        assert_eq!(info.container_runtime_version, "containerd://1.6.20~ds1");
        assert_eq!(info.kubelet_version, crate::node::DEFAULT_KUBELET_VERSION);
        assert_eq!(info.kube_proxy_version, info.kubelet_version);
        assert_eq!(info.operating_system, "linux");
        assert_eq!(info.architecture, go_arch());
        assert_eq!(info.os_image, "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(info.system_uuid, "");
        assert_eq!(
            s.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port,
            10250
        );
        let new = computed(&NodeStatus::default(), &config(), &observation(), 0);
        let patch = status_patch(None, &new);
        assert_eq!(
            patch["status"]["addresses"][0],
            serde_json::json!({"$patch": "replace"})
        );
        assert_eq!(patch["status"]["addresses"][1]["address"], "198.18.0.1");
        assert!(patch["status"].get("images").is_none());
    }

    #[test]
    fn unknown_capacity_is_left_out_of_the_patch() {
        let mut obs = observation();
        obs.capacity = None;
        let new = computed(&NodeStatus::default(), &config(), &obs, 0);
        let patch = status_patch(None, &new);
        assert!(patch["status"].get("capacity").is_none(), "{patch}");
        assert!(patch["status"].get("allocatable").is_none(), "{patch}");
        assert!(patch["status"].get("nodeInfo").is_some(), "{patch}");
    }

    #[test]
    fn unreadable_facts_keep_the_reported_values() {
        let first = computed(&NodeStatus::default(), &config(), &observation(), 0);
        let mut obs = observation();
        obs.system = SystemFacts::default();
        obs.capacity = None;
        let second = computed(&first, &config(), &obs, 10);
        assert_eq!(second.node_info, first.node_info);
        assert_eq!(second.capacity, first.capacity);
        assert!(!status_changed(&first, &second));
    }

    #[test]
    fn a_healthy_node_is_ready_without_pressure() {
        let s = computed(&NodeStatus::default(), &config(), &observation(), 0);
        for (kind, reason) in [
            (MEMORY_PRESSURE, "KubeletHasSufficientMemory"),
            (DISK_PRESSURE, "KubeletHasNoDiskPressure"),
            (PID_PRESSURE, "KubeletHasSufficientPID"),
        ] {
            let c = condition(&s, kind);
            assert_eq!(
                (c.status.as_str(), c.reason.as_deref()),
                ("False", Some(reason))
            );
        }
        let ready = condition(&s, READY);
        assert_eq!(ready.status, "True");
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("kubelet is posting ready status")
        );
        assert_eq!(s.conditions.as_ref().unwrap().last().unwrap().type_, READY);
    }

    #[test]
    fn memory_pressure_below_100mi_available() {
        let mut obs = observation();
        obs.memory_available_bytes = Some(99 * MIB);
        let s = computed(&NodeStatus::default(), &config(), &obs, 0);
        let c = condition(&s, MEMORY_PRESSURE);
        assert_eq!(c.status, "True");
        assert_eq!(c.reason.as_deref(), Some("KubeletHasInsufficientMemory"));
        assert_eq!(
            c.message.as_deref(),
            Some("kubelet has insufficient memory available")
        );
        obs.memory_available_bytes = Some(100 * MIB);
        assert!(!Pressure::observed(&obs, &EvictionHard::default()).memory);
    }

    #[test]
    fn disk_pressure_below_10_percent_space_or_5_percent_inodes() {
        let mut obs = observation();
        obs.nodefs = disk(9, 1000, 900);
        let s = computed(&NodeStatus::default(), &config(), &obs, 0);
        let c = condition(&s, DISK_PRESSURE);
        assert_eq!(c.status, "True");
        assert_eq!(c.reason.as_deref(), Some("KubeletHasDiskPressure"));
        obs.nodefs = disk(50, 1000, 49);
        assert!(Pressure::observed(&obs, &EvictionHard::default()).disk);
        // A filesystem without an inode table (inodes = 0) has no inode pressure.
        obs.nodefs = disk(50, 0, 0);
        assert!(!Pressure::observed(&obs, &EvictionHard::default()).disk);
        // The image filesystem below imagefs.available (15%) is disk pressure too.
        obs.imagefs = disk(14, 1000, 900);
        assert!(Pressure::observed(&obs, &EvictionHard::default()).disk);
    }

    #[test]
    fn pid_pressure_when_less_than_10_percent_of_pid_max_is_free() {
        let mut obs = observation();
        obs.pids = Some(PidUsage {
            running: 29_500,
            max: 32_768,
        });
        let s = computed(&NodeStatus::default(), &config(), &obs, 0);
        let c = condition(&s, PID_PRESSURE);
        assert_eq!(c.status, "True");
        assert_eq!(c.reason.as_deref(), Some("KubeletHasInsufficientPID"));
        assert_eq!(
            c.message.as_deref(),
            Some("kubelet has insufficient PID available")
        );
    }

    #[test]
    fn unreadable_figures_are_no_pressure() {
        let mut obs = observation();
        obs.memory_available_bytes = None;
        obs.nodefs = None;
        obs.imagefs = None;
        obs.pids = None;
        assert_eq!(
            Pressure::observed(&obs, &EvictionHard::default()),
            Pressure::default()
        );
    }

    #[test]
    fn pressure_holds_for_the_transition_period() {
        let mut tracker = PressureTracker::default();
        let t0 = Instant::now();
        let period = Duration::from_secs(300);
        let seen = Pressure {
            memory: true,
            ..Pressure::default()
        };
        assert!(tracker.update(seen, t0, period).memory);
        let later = tracker.update(Pressure::default(), t0 + Duration::from_secs(299), period);
        assert!(later.memory && !later.disk);
        assert!(
            !tracker
                .update(Pressure::default(), t0 + period, period)
                .memory
        );
    }

    #[test]
    fn not_ready_when_the_runtime_is_down() {
        let mut obs = observation();
        obs.runtime_health = None;
        let s = computed(&NodeStatus::default(), &config(), &obs, 0);
        let ready = condition(&s, READY);
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(ready.message.as_deref(), Some("container runtime is down"));
    }

    #[test]
    fn not_ready_with_the_kubelets_wording_when_the_network_is_not_ready() {
        let mut obs = observation();
        let mut health = healthy();
        health.network.ready = false;
        health.network.reason = "NetworkPluginNotReady".into();
        health.network.message = "Network plugin returns error: cni plugin not initialized".into();
        obs.runtime_health = Some(health);
        let s = computed(&NodeStatus::default(), &config(), &obs, 0);
        assert_eq!(
            condition(&s, READY).message.as_deref(),
            Some(
                "container runtime network not ready: NetworkReady=false \
                 reason:NetworkPluginNotReady message:Network plugin returns error: cni \
                 plugin not initialized"
            )
        );
    }

    #[test]
    fn a_failing_readiness_check_and_missing_capacity_are_listed_together() {
        let mut obs = observation();
        obs.failed_checks = vec![
            "PLEG is not healthy: pleg was last seen active 3m0s ago; threshold is 3m0s".into(),
        ];
        obs.capacity = None;
        let s = computed(&NodeStatus::default(), &config(), &obs, 0);
        assert_eq!(
            condition(&s, READY).message.as_deref(),
            Some(
                "[PLEG is not healthy: pleg was last seen active 3m0s ago; threshold is \
                 3m0s, Missing node capacity for resources: cpu, memory, pods, \
                 ephemeral-storage]"
            )
        );
    }

    #[test]
    fn transition_time_moves_only_when_a_status_changes() {
        let first = computed(&NodeStatus::default(), &config(), &observation(), 0);
        assert_eq!(condition(&first, READY).last_transition_time, Some(at(0)));
        let second = computed(&first, &config(), &observation(), 10);
        let ready = condition(&second, READY);
        assert_eq!(ready.last_transition_time, Some(at(0)));
        assert_eq!(ready.last_heartbeat_time, Some(at(10)));
        assert_eq!(
            condition(&second, MEMORY_PRESSURE).last_transition_time,
            Some(at(0))
        );
        let mut down = observation();
        down.runtime_health = None;
        let third = computed(&second, &config(), &down, 20);
        assert_eq!(condition(&third, READY).last_transition_time, Some(at(20)));
        // A new message with the same status keeps the transition time.
        let mut network = observation();
        let mut health = healthy();
        health.runtime.ready = false;
        network.runtime_health = Some(health);
        let fourth = computed(&third, &config(), &network, 30);
        assert_eq!(condition(&fourth, READY).last_transition_time, Some(at(20)));
        assert!(status_changed(&third, &fourth));
    }

    #[test]
    fn changes_ignore_heartbeat_times_and_condition_order() {
        let first = computed(&NodeStatus::default(), &config(), &observation(), 0);
        let second = computed(&first, &config(), &observation(), 10);
        assert_ne!(first, second);
        assert!(!status_changed(&first, &second));
        let mut reordered = second.clone();
        reordered.conditions.as_mut().unwrap().reverse();
        assert!(!status_changed(&first, &reordered));
        let mut obs = observation();
        obs.memory_available_bytes = Some(MIB);
        assert!(status_changed(
            &first,
            &computed(&first, &config(), &obs, 10)
        ));
        let mut obs = observation();
        obs.system.boot_id = Some("rebooted".into());
        assert!(status_changed(
            &first,
            &computed(&first, &config(), &obs, 10)
        ));
    }

    #[test]
    fn images_are_largest_first_bounded_and_named_by_digest_then_tag() {
        let image = |id: &str, size, digests: &[&str], tags: &[&str]| cri::api::Image {
            id: id.into(),
            size,
            repo_digests: digests.iter().map(|s| (*s).into()).collect(),
            repo_tags: tags.iter().map(|s| (*s).into()).collect(),
            ..Default::default()
        };
        let images = vec![
            image("a", 10, &["a@sha256:1"], &["a:1"]),
            image(
                "b",
                30,
                &["b@sha256:2"],
                &["b:1", "b:2", "b:3", "b:4", "b:5"],
            ),
            image("c", 20, &[], &[]),
            image("d", 5, &[], &["d:1"]),
        ];
        let listed = node_images(images, 2);
        assert_eq!(listed.len(), 2);
        assert_eq!(
            listed[0].names.as_deref().unwrap(),
            ["b@sha256:2", "b:1", "b:2", "b:3", "b:4"]
        );
        assert_eq!(listed[0].size_bytes, Some(30));
        assert_eq!(listed[1].names.as_deref().unwrap(), ["a@sha256:1", "a:1"]);
        let mut obs = observation();
        obs.images = Some(Vec::new());
        let s = computed(&NodeStatus::default(), &config(), &obs, 0);
        assert!(s.images.is_none());
    }
}
