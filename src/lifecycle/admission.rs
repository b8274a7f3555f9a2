//! Pod admission, the kubelet's admit handlers (`HandlePodAdditions` → `canAdmitPod`):
//! before a pod's first sync, it is checked against this node and the pods already
//! admitted, in the kubelet's order — the eviction manager's: under a pressure condition
//! the eviction manager holds ([`NodeConditions`], its own last observations, not the
//! reported Node: DiskPressure, PIDPressure, or MemoryPressure for BestEffort pods that
//! do not tolerate it), pods other than critical ones are rejected with reason
//! `Evicted`; then the sysctl whitelist (safe sysctls plus
//! `--allowed-unsafe-sysctls`, reason `SysctlForbidden`), then the scheduler's general
//! predicates the kubelet reuses: allocatable pods/cpu/memory/ephemeral-storage against
//! the requests of the admitted pods that have not finished (`OutOf<resource>`),
//! `nodeSelector` and required node affinity against the Node's labels (`NodeAffinity`),
//! `spec.nodeName` (`NodeName`) and host ports in use (`NodePorts`). Only the first
//! failure is reported, as by the kubelet. Between the sysctls and the predicates, as the
//! kubelet's resource allocator, the device manager chooses the devices of the pod's
//! extended resources (`UnexpectedAdmissionError`, `Allocate failed due to ...`). A
//! rejected pod ends `Failed` with `Pod <message>`; it is never admitted later.
//!
//! It also resolves a pod's `runtimeClassName` to its handler (the kubelet's RuntimeClass
//! manager): an unknown RuntimeClass is not an admission failure in v1.20 but fails the
//! sandbox creation, retried with back-off.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, PodStatus, Toleration,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kube::runtime::reflector::Store;

use crate::cm::devicemanager::DeviceManager;
use crate::eviction::NodeConditions;
use crate::node::Pressure;
use crate::pod::state::ForgetPod;
use crate::resources::{QosClass, Quantity, qos_class};

/// Why a pod may not run on this node: the kubelet's `PodAdmitResult` when not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The reason, e.g. `OutOfcpu`, `NodeAffinity`, `SysctlForbidden`.
    pub reason: Cow<'static, str>,
    /// The handler's message (the pod status gets it prefixed with `Pod `).
    pub message: String,
}

/// Errors of the admission configuration and of RuntimeClass look-ups.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// An `--allowed-unsafe-sysctls` entry is not a sysctl name or pattern.
    #[error(
        "sysctl {0:?} must have at most {SYSCTL_MAX_LENGTH} characters and match regex {SYSCTL_PATTERN_FMT}"
    )]
    InvalidSysctlPattern(String),
    /// An `--allowed-unsafe-sysctls` entry is not namespaced (it would change the host).
    #[error("the sysctls {0:?} are not known to be namespaced")]
    NotNamespaced(String),
    /// The pod's RuntimeClass does not exist (the lister's NotFound error).
    #[error("runtimeclass.node.k8s.io {0:?} not found")]
    RuntimeClassNotFound(String),
    /// The RuntimeClass could not be read.
    #[error("failed to lookup RuntimeClass {name}: {source}")]
    RuntimeClassLookup {
        /// The RuntimeClass.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

const SYSCTL_MAX_LENGTH: usize = 253;
const SYSCTL_PATTERN_FMT: &str =
    r"([a-z0-9]([-_a-z0-9]*[a-z0-9])?\.)*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]";

/// Sysctls every pod may set (the API's `SafeSysctlWhitelist` of v1.20).
const SAFE_SYSCTLS: [&str; 4] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
];

/// The kernel namespace a sysctl belongs to, which decides whether it is per pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SysctlNamespace {
    Ipc,
    Net,
}

impl SysctlNamespace {
    fn of(sysctl: &str) -> Option<Self> {
        if sysctl == "kernel.sem" {
            return Some(Self::Ipc);
        }
        if ["kernel.shm", "kernel.msg", "fs.mqueue."]
            .iter()
            .any(|p| sysctl.starts_with(p))
        {
            return Some(Self::Ipc);
        }
        sysctl.starts_with("net.").then_some(Self::Net)
    }

    fn name(self) -> &'static str {
        match self {
            Self::Ipc => "ipc",
            Self::Net => "net",
        }
    }
}

fn valid_sysctl_pattern(pattern: &str) -> bool {
    let segment = |s: &str, last: bool| {
        let bytes = s.as_bytes();
        let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_".contains(b);
        let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        match bytes {
            [] => false,
            [b'*'] => last,
            [first, middle @ .., end] => {
                edge(first) && middle.iter().all(inner) && (edge(end) || (last && *end == b'*'))
            }
            [one] => edge(one),
        }
    };
    let parts: Vec<&str> = pattern.split('.').collect();
    pattern.len() <= SYSCTL_MAX_LENGTH
        && parts
            .iter()
            .enumerate()
            .all(|(i, s)| segment(s, i + 1 == parts.len()))
}

/// The sysctls pods may set: the safe ones and `--allowed-unsafe-sysctls` (names, or
/// prefixes ending in `*`); the kubelet's sysctl `patternWhitelist`.
#[derive(Debug, Clone, Default)]
pub struct SysctlWhitelist {
    names: HashMap<String, SysctlNamespace>,
    prefixes: Vec<(String, SysctlNamespace)>,
}

impl SysctlWhitelist {
    /// The safe sysctls plus `allowed_unsafe`.
    ///
    /// # Errors
    /// An entry that is not a valid pattern or not namespaced.
    pub fn new(allowed_unsafe: &[String]) -> Result<Self, AdmissionError> {
        let mut whitelist = Self::default();
        let all = SAFE_SYSCTLS
            .iter()
            .map(|s| (*s).to_owned())
            .chain(allowed_unsafe.iter().cloned());
        for pattern in all {
            if !valid_sysctl_pattern(&pattern) {
                return Err(AdmissionError::InvalidSysctlPattern(pattern));
            }
            let name = pattern.strip_suffix('*').unwrap_or(&pattern);
            let Some(ns) = SysctlNamespace::of(name) else {
                return Err(AdmissionError::NotNamespaced(pattern));
            };
            if name.len() == pattern.len() {
                whitelist.names.insert(pattern, ns);
            } else {
                whitelist.prefixes.push((name.to_owned(), ns));
            }
        }
        Ok(whitelist)
    }

    fn validate(&self, sysctl: &str, host_net: bool, host_ipc: bool) -> Result<(), String> {
        let ns = self.names.get(sysctl).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| sysctl.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        match ns {
            None => Err(format!("{sysctl:?} not whitelisted")),
            Some(ns @ SysctlNamespace::Ipc) if host_ipc => Err(format!(
                "{sysctl:?} not allowed with host {} enabled",
                ns.name()
            )),
            Some(ns @ SysctlNamespace::Net) if host_net => Err(format!(
                "{sysctl:?} not allowed with host {} enabled",
                ns.name()
            )),
            Some(_) => Ok(()),
        }
    }

    /// Admits a pod whose `securityContext.sysctls` are all allowed.
    ///
    /// # Errors
    /// The first forbidden sysctl, reason `SysctlForbidden`.
    pub fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.as_deref())
            .unwrap_or_default();
        let host_net = spec.host_network.unwrap_or(false);
        let host_ipc = spec.host_ipc.unwrap_or(false);
        for s in sysctls {
            self.validate(&s.name, host_net, host_ipc)
                .map_err(|e| Rejection {
                    reason: "SysctlForbidden".into(),
                    message: format!("forbidden sysctl: {e}"),
                })?;
        }
        Ok(())
    }
}

/// The resources the scheduler accounts a pod for: cpu, memory, ephemeral storage, and
/// the scalar ones (huge pages, extended and `*kubernetes.io/` resources) by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Resources {
    milli_cpu: i64,
    memory: i64,
    ephemeral_storage: i64,
    scalars: BTreeMap<String, i64>,
}

fn value_of(q: &ApiQuantity, milli: bool) -> Option<i64> {
    let q = Quantity::parse(&q.0).ok()?;
    let v = if milli { q.milli_value() } else { q.value() };
    Some(i64::try_from(v).unwrap_or(i64::MAX))
}

fn amount(list: Option<&BTreeMap<String, ApiQuantity>>, name: &str, milli: bool) -> i64 {
    list.and_then(|l| l.get(name))
        .and_then(|q| value_of(q, milli))
        .unwrap_or(0)
}

/// An extended resource (`IsExtendedResourceName`): a domain-prefixed name outside
/// `kubernetes.io`, not a quota's `requests.` name.
fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// A resource the scheduler counts by name (`IsScalarResourceName`).
fn is_scalar(name: &str) -> bool {
    is_extended(name)
        || name.starts_with("hugepages-")
        || name.contains("kubernetes.io/")
        || name.starts_with("attachable-volumes-")
}

impl Resources {
    fn of(list: Option<&BTreeMap<String, ApiQuantity>>) -> Self {
        let scalars = list
            .into_iter()
            .flatten()
            .filter(|(name, _)| is_scalar(name))
            .filter_map(|(name, q)| Some((name.clone(), value_of(q, false)?)))
            .collect();
        Self {
            milli_cpu: amount(list, "cpu", true),
            memory: amount(list, "memory", false),
            ephemeral_storage: amount(list, "ephemeral-storage", false),
            scalars,
        }
    }

    fn requests(c: &Container) -> Self {
        Self::of(c.resources.as_ref().and_then(|r| r.requests.as_ref()))
    }

    fn combine(mut self, o: Self, f: fn(i64, i64) -> i64) -> Self {
        self.milli_cpu = f(self.milli_cpu, o.milli_cpu);
        self.memory = f(self.memory, o.memory);
        self.ephemeral_storage = f(self.ephemeral_storage, o.ephemeral_storage);
        for (name, v) in o.scalars {
            let mine = self.scalars.entry(name).or_insert(0);
            *mine = f(*mine, v);
        }
        self
    }

    fn add(self, o: Self) -> Self {
        self.combine(o, i64::saturating_add)
    }

    fn max(self, o: Self) -> Self {
        self.combine(o, i64::max)
    }

    /// A pod's requests: the sum over its containers, at least any one init container's,
    /// plus the pod overhead (the scheduler's `computePodResourceRequest`).
    fn of_pod(spec: &PodSpec) -> Self {
        let running = spec
            .containers
            .iter()
            .map(Self::requests)
            .fold(Self::default(), Self::add);
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .map(Self::requests)
            .fold(running, Self::max);
        init.add(Self::of(spec.overhead.as_ref()))
    }
}

fn insufficient(resource: &str, requested: i64, used: i64, capacity: i64) -> Rejection {
    Rejection {
        reason: format!("OutOf{resource}").into(),
        message: format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// The scheduler's resource fit: the pod count first, then cpu, memory and
/// ephemeral-storage, each against allocatable minus the other pods' requests.
fn fits_resources(spec: &PodSpec, others: &[&PodSpec], node: &Node) -> Result<(), Rejection> {
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let allowed_pods = amount(allocatable, "pods", false);
    let pods = i64::try_from(others.len()).unwrap_or(i64::MAX);
    if pods + 1 > allowed_pods {
        return Err(insufficient("pods", 1, pods, allowed_pods));
    }
    let capacity = Resources::of(allocatable);
    let mut request = Resources::of_pod(spec);
    // The kubelet's `removeMissingExtendedResources`: extended resources the node does not
    // have are left to their device plugins' admission.
    request
        .scalars
        .retain(|name, _| !is_extended(name) || capacity.scalars.contains_key(name));
    if request == Resources::default() {
        return Ok(());
    }
    let used = others
        .iter()
        .map(|s| Resources::of_pod(s))
        .fold(Resources::default(), Resources::add);
    let scalar = |r: &Resources, name: &str| r.scalars.get(name).copied().unwrap_or(0);
    let checks = [
        ("cpu", request.milli_cpu, used.milli_cpu, capacity.milli_cpu),
        ("memory", request.memory, used.memory, capacity.memory),
        (
            "ephemeral-storage",
            request.ephemeral_storage,
            used.ephemeral_storage,
            capacity.ephemeral_storage,
        ),
    ]
    .into_iter()
    .chain(request.scalars.iter().map(|(name, req)| {
        (
            name.as_str(),
            *req,
            scalar(&used, name),
            scalar(&capacity, name),
        )
    }));
    match checks
        .into_iter()
        .find(|(_, req, used, cap)| *cap < req.saturating_add(*used))
    {
        Some((name, req, used, cap)) => Err(insufficient(name, req, used, cap)),
        None => Ok(()),
    }
}

/// One node selector requirement against a value looked up by key; `None` when the
/// requirement is invalid (then its term matches nothing).
fn requirement_matches(
    r: &NodeSelectorRequirement,
    value: impl Fn(&str) -> Option<String>,
) -> Option<bool> {
    let values = r.values.as_deref().unwrap_or_default();
    let current = value(&r.key);
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" if !values.is_empty() => Some(current.is_some_and(|v| values.contains(&v))),
        "NotIn" if !values.is_empty() => Some(current.is_none_or(|v| !values.contains(&v))),
        "Exists" if values.is_empty() => Some(current.is_some()),
        "DoesNotExist" if values.is_empty() => Some(current.is_none()),
        op @ ("Gt" | "Lt") if values.len() == 1 => {
            let bound = number(&values[0])?;
            Some(
                current
                    .as_deref()
                    .and_then(number)
                    .is_some_and(|v| if op == "Gt" { v > bound } else { v < bound }),
            )
        }
        _ => None,
    }
}

/// Whether any term matches the node (the API's `MatchNodeSelectorTerms`): an empty term
/// matches nothing; within a term every expression (on labels) and field (only
/// `metadata.name`, `In`/`NotIn` with one value) must match.
pub fn terms_match(terms: &[NodeSelectorTerm], node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.clone().unwrap_or_default();
    terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        let labels_ok = exprs
            .iter()
            .all(|r| requirement_matches(r, |k| labels.get(k).cloned()) == Some(true));
        let fields_ok = fields.iter().all(|r| {
            let single = r.values.as_ref().is_some_and(|v| v.len() == 1);
            let by_field = |k: &str| (k == "metadata.name").then(|| name.clone());
            single
                && matches!(r.operator.as_str(), "In" | "NotIn")
                && requirement_matches(r, by_field) == Some(true)
        });
        labels_ok && fields_ok
    })
}

/// `nodeSelector` and required node affinity against the node (the scheduler helper's
/// `PodMatchesNodeSelectorAndAffinityTerms`).
fn matches_node_selector_and_affinity(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok && required.is_none_or(|r| terms_match(&r.node_selector_terms, node))
}

/// A host port a pod's container asks for, with the defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostPort {
    ip: String,
    protocol: String,
    port: i32,
}

impl HostPort {
    fn of(spec: &PodSpec) -> Vec<Self> {
        spec.containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|h| h > 0))
            .map(|p| Self {
                ip: p
                    .host_ip
                    .clone()
                    .filter(|ip| !ip.is_empty())
                    .unwrap_or_else(|| "0.0.0.0".into()),
                protocol: p
                    .protocol
                    .clone()
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| "TCP".into()),
                port: p.host_port.unwrap_or_default(),
            })
            .collect()
    }

    /// The same port and protocol on the same address, or on all addresses.
    fn conflicts(&self, other: &Self) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == "0.0.0.0" || other.ip == "0.0.0.0")
    }
}

fn predicate_failure(name: &'static str) -> Rejection {
    Rejection {
        reason: name.into(),
        message: format!("Predicate {name} failed"),
    }
}

/// The scheduler's general predicates as the kubelet runs them at admission: resources,
/// node selector and affinity, node name, host ports; the first failure is reported.
///
/// # Errors
/// The first predicate that fails.
pub fn general_predicates(pod: &Pod, others: &[&Pod], node: &Node) -> Result<(), Rejection> {
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let other_specs: Vec<&PodSpec> = others.iter().filter_map(|p| p.spec.as_ref()).collect();
    fits_resources(spec, &other_specs, node)?;
    if !matches_node_selector_and_affinity(spec, node) {
        return Err(predicate_failure("NodeAffinity"));
    }
    let node_name = node.metadata.name.as_deref();
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && Some(n) != node_name)
    {
        return Err(predicate_failure("NodeName"));
    }
    let used: Vec<HostPort> = other_specs.iter().flat_map(|s| HostPort::of(s)).collect();
    let wanted = HostPort::of(spec);
    if wanted.iter().any(|w| used.iter().any(|u| w.conflicts(u))) {
        return Err(predicate_failure("NodePorts"));
    }
    Ok(())
}

/// The eviction manager's rejection reason.
const EVICTED: &str = "Evicted";

/// Whether `tolerations` tolerate the `NoSchedule` taint `key` (with no value), as
/// `TolerationsTolerateTaint` decides.
fn tolerates_no_schedule(tolerations: &[Toleration], key: &str) -> bool {
    tolerations.iter().any(|t| {
        let effect = t.effect.as_deref().unwrap_or("");
        let t_key = t.key.as_deref().unwrap_or("");
        let exists = t.operator.as_deref() == Some("Exists");
        (effect.is_empty() || effect == "NoSchedule")
            && (t_key.is_empty() && exists
                || t_key == key && (exists || t.value.as_deref().unwrap_or("").is_empty()))
    })
}

/// The eviction manager's admit handler (its `Admit`): under the pressure conditions
/// `pressure` the eviction manager holds, only critical pods are admitted, and under
/// MemoryPressure alone also pods that are not BestEffort or that tolerate the
/// memory-pressure taint.
///
/// # Errors
/// `Evicted`, with the kubelet's message naming the conditions.
pub fn pressure_admit(pod: &Pod, pressure: Pressure) -> Result<(), Rejection> {
    let held = pressure.conditions();
    if held.is_empty() || crate::cm::is_critical(pod) {
        return Ok(());
    }
    if held == ["MemoryPressure"] {
        let empty = PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&empty);
        if qos_class(spec) != QosClass::BestEffort
            || tolerates_no_schedule(
                spec.tolerations.as_deref().unwrap_or_default(),
                "node.kubernetes.io/memory-pressure",
            )
        {
            return Ok(());
        }
    }
    Err(Rejection {
        reason: EVICTED.into(),
        message: format!("The node had condition: [{}]. ", held.join(" ")),
    })
}

/// All admit handlers in the kubelet's order: node pressure (the conditions the eviction
/// manager holds, see [`pressure_admit`]), sysctls, then the general predicates.
///
/// # Errors
/// The first handler's rejection.
pub fn admit_pod(
    pod: &Pod,
    others: &[&Pod],
    node: &Node,
    sysctls: &SysctlWhitelist,
    pressure: Pressure,
) -> Result<(), Rejection> {
    admit_pod_with(pod, others, node, sysctls, pressure, |_| Ok(None))
}

/// [`admit_pod`] with the resource allocator's step, `allocate`, between the sysctls and
/// the general predicates, where the kubelet's `resourceAllocator` stands; it may give
/// the node the predicates see (the kubelet's `UpdatePluginResources`).
fn admit_pod_with(
    pod: &Pod,
    others: &[&Pod],
    node: &Node,
    sysctls: &SysctlWhitelist,
    pressure: Pressure,
    allocate: impl FnOnce(&Pod) -> Result<Option<Node>, Rejection>,
) -> Result<(), Rejection> {
    pressure_admit(pod, pressure)?;
    sysctls.admit(pod)?;
    let sanitized = allocate(pod)?;
    general_predicates(pod, others, sanitized.as_ref().unwrap_or(node))
}

/// The kubelet's `resourceAllocator.Admit`: devices for the pod's extended resources,
/// among the devices the pods not `gone` (finished or refused) hold. Then its `UpdatePluginResources`:
/// for a pod holding devices, the node with allocatable raised to the devices held, so a
/// pod admitted before a restart is admitted again before its plugin registers.
fn allocate_devices(
    devices: &DeviceManager,
    pod: &Pod,
    node: &Node,
    gone: &HashSet<&str>,
) -> Result<Option<Node>, Rejection> {
    devices
        .allocate(pod, &|uid| gone.contains(uid))
        .map_err(|e| Rejection {
            reason: "UnexpectedAdmissionError".into(),
            message: format!("Allocate failed due to {e}, which is unexpected"),
        })?;
    let floor = devices.allocatable_floor(pod.metadata.uid.as_deref().unwrap_or_default());
    Ok(raise_allocatable(node, &floor))
}

/// `node` with each allocatable in `floor` raised to it, if one was lower.
fn raise_allocatable(node: &Node, floor: &BTreeMap<String, u64>) -> Option<Node> {
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let below = |(name, min): (&String, &u64)| {
        let has = allocatable
            .and_then(|a| a.get(name))
            .and_then(|q| Quantity::parse(&q.0).ok())
            .map_or(0, Quantity::value);
        (has < u128::from(*min)).then(|| (name.clone(), ApiQuantity(min.to_string())))
    };
    let raised: Vec<(String, ApiQuantity)> = floor.iter().filter_map(below).collect();
    if raised.is_empty() {
        return None;
    }
    let mut node = node.clone();
    let status = node.status.get_or_insert_with(Default::default);
    status
        .allocatable
        .get_or_insert_with(BTreeMap::new)
        .extend(raised);
    Some(node)
}

/// The status of a rejected pod (the kubelet's `rejectPod`): Failed, the reason, and the
/// message prefixed with `Pod `; a start time it already had is kept.
#[must_use]
pub fn rejected_status(pod: &Pod, rejection: &Rejection) -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some(rejection.reason.to_string()),
        message: Some(format!("Pod {}", rejection.message)),
        start_time: pod.status.as_ref().and_then(|s| s.start_time.clone()),
        ..Default::default()
    }
}

#[derive(Debug, Default)]
struct Admitted {
    /// Admitted pods, newest copy, by UID.
    pods: HashMap<String, Arc<Pod>>,
    /// Pods decided without admission: rejected, or finished before first seen.
    decided: HashSet<String>,
}

/// The admission state of the node: the Node as last seen, the eviction manager's node
/// conditions, the sysctl whitelist, and the pods admitted so far.
pub struct PodAdmitter {
    node: Store<Node>,
    /// The Node as registered, while the watch has not delivered it (`getNodeAnyWay`).
    initial_node: Arc<Node>,
    sysctls: SysctlWhitelist,
    runtime_classes: kube::Api<RuntimeClass>,
    admitted: Mutex<Admitted>,
    /// The pressure conditions the eviction manager holds.
    conditions: NodeConditions,
    /// The device manager, which chooses devices for admitted pods.
    devices: Option<Arc<DeviceManager>>,
}

impl std::fmt::Debug for PodAdmitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodAdmitter")
            .field("sysctls", &self.sysctls)
            .finish_non_exhaustive()
    }
}

impl PodAdmitter {
    /// An admitter reading the node from `node` (a reflector on this agent's Node), else
    /// `initial_node` (as registered), and RuntimeClasses through `client`.
    #[must_use]
    pub fn new(
        node: Store<Node>,
        initial_node: Node,
        sysctls: SysctlWhitelist,
        client: kube::Client,
    ) -> Self {
        Self {
            node,
            initial_node: Arc::new(initial_node),
            sysctls,
            runtime_classes: kube::Api::all(client),
            admitted: Mutex::default(),
            conditions: NodeConditions::default(),
            devices: None,
        }
    }

    /// The admitter, refusing pods under the pressure conditions the eviction manager
    /// holds in `conditions` (without, it holds none).
    #[must_use]
    pub fn with_conditions(mut self, conditions: NodeConditions) -> Self {
        self.conditions = conditions;
        self
    }

    /// The admitter, with `devices` choosing devices for the pods it admits and freeing
    /// them when the pods are forgotten.
    #[must_use]
    pub fn with_devices(mut self, devices: Arc<DeviceManager>) -> Self {
        self.devices = Some(devices);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Admitted> {
        crate::lock::lock(&self.admitted)
    }

    /// Decides a pod at its first sighting, against the admitted pods that have not
    /// finished (`finished` tells, by the status this agent set, else the API's); later
    /// sightings only refresh the admitted copy, so a rejected pod is never admitted
    /// later. A pod already finished is not checked. Returns the rejection, if any.
    pub fn admit(&self, pod: &Arc<Pod>, finished: impl Fn(&Pod) -> bool) -> Option<Rejection> {
        let uid = pod.metadata.uid.clone()?;
        let mut state = self.lock();
        if let Some(known) = state.pods.get_mut(&uid) {
            *known = pod.clone();
            return None;
        }
        if state.decided.contains(&uid) {
            return None;
        }
        if finished(pod) {
            state.decided.insert(uid);
            return None;
        }
        let node =
            (self.node.state().into_iter().next()).unwrap_or_else(|| self.initial_node.clone());
        let others: Vec<&Pod> = state
            .pods
            .values()
            .map(AsRef::as_ref)
            .filter(|p| !finished(p))
            .collect();
        // Pods not seen yet since a restart keep their devices.
        let finished_pods = state.pods.iter().filter(|(_, p)| finished(p));
        let gone: HashSet<&str> = (finished_pods.map(|(uid, _)| uid.as_str()))
            .chain(state.decided.iter().map(String::as_str))
            .collect();
        let allocate = |pod: &Pod| match &self.devices {
            Some(devices) => allocate_devices(devices, pod, &node, &gone),
            None => Ok(None),
        };
        let pressure = self.conditions.held();
        match admit_pod_with(pod, &others, &node, &self.sysctls, pressure, allocate) {
            Ok(()) => {
                state.pods.insert(uid, pod.clone());
                None
            }
            Err(rejection) => {
                state.decided.insert(uid);
                Some(rejection)
            }
        }
    }

    /// Forgets every pod not in `listed` (a full list of the node's pods).
    pub fn retain(&self, listed: &HashSet<String>) {
        let mut state = self.lock();
        state.pods.retain(|uid, _| listed.contains(uid));
        state.decided.retain(|uid| listed.contains(uid));
        if let Some(devices) = &self.devices {
            devices.free(&|uid| listed.contains(uid));
        }
    }

    /// The runtime handler of the pod's RuntimeClass, `""` without one (the kubelet's
    /// `LookupRuntimeHandler`).
    ///
    /// # Errors
    /// The RuntimeClass does not exist or cannot be read.
    pub async fn runtime_handler(&self, pod: &Pod) -> Result<String, AdmissionError> {
        let Some(name) = pod
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.clone())
            .filter(|n| !n.is_empty())
        else {
            return Ok(String::new());
        };
        let found = self.runtime_classes.get(&name).await;
        handler_of(name, found)
    }
}

fn handler_of(
    name: String,
    found: Result<RuntimeClass, kube::Error>,
) -> Result<String, AdmissionError> {
    match found {
        Ok(rc) => Ok(rc.handler),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Err(AdmissionError::RuntimeClassNotFound(name))
        }
        Err(source) => Err(AdmissionError::RuntimeClassLookup { name, source }),
    }
}

/// The admitted and decided pods: forgotten when the pod is gone from the API (the
/// kubelet's pod manager; see [`crate::pod::store::PodAdmission::forget`]) and again when
/// its worker ends, in case it was seen again meanwhile.
impl ForgetPod for PodAdmitter {
    fn name(&self) -> &'static str {
        "admission"
    }

    fn holds(&self, uid: &str) -> bool {
        let state = self.lock();
        state.pods.contains_key(uid) || state.decided.contains(uid)
    }

    fn forget(&self, uid: &str) {
        let mut state = self.lock();
        state.pods.remove(uid);
        state.decided.remove(uid);
        if let Some(devices) = &self.devices {
            devices.free(&|held| held != uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::testing::pod;
    use k8s_openapi::api::core::v1::{
        Affinity, ContainerPort, NodeAffinity, NodeCondition, NodeSelector, NodeStatus,
        PodSecurityContext, ResourceRequirements, Sysctl,
    };
    use kube::api::ObjectMeta;
    use kube::runtime::{reflector, watcher};

    fn node(labels: &[(&str, &str)], allocatable: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            status: Some(NodeStatus {
                allocatable: Some(quantities(allocatable)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn quantities(list: &[(&str, &str)]) -> BTreeMap<String, ApiQuantity> {
        list.iter()
            .map(|(k, v)| ((*k).into(), ApiQuantity((*v).into())))
            .collect()
    }

    fn big_node() -> Node {
        node(
            &[
                ("kubernetes.io/hostname", "n1"),
                ("disk", "ssd"),
                ("cores", "8"),
            ],
            &[("cpu", "2"), ("memory", "1Gi"), ("pods", "3")],
        )
    }

    fn requesting(name: &str, requests: &[(&str, &str)]) -> Pod {
        let mut p = pod(name, &[("c", "busybox")]);
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].ports = None;
        spec.containers[0].resources = Some(ResourceRequirements {
            requests: Some(quantities(requests)),
            ..Default::default()
        });
        p
    }

    /// The eviction manager holding `conditions`.
    fn under(conditions: &[&str]) -> Pressure {
        Pressure {
            memory: conditions.contains(&"MemoryPressure"),
            disk: conditions.contains(&"DiskPressure"),
            pid: conditions.contains(&"PIDPressure"),
        }
    }

    /// A Node reporting `conditions` True (and Ready).
    fn reporting(conditions: &[&str]) -> Node {
        let mut n = big_node();
        n.status.as_mut().unwrap().conditions = Some(
            ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
                .into_iter()
                .map(|kind| NodeCondition {
                    type_: kind.into(),
                    status: if conditions.contains(&kind) || kind == "Ready" {
                        "True"
                    } else {
                        "False"
                    }
                    .into(),
                    ..Default::default()
                })
                .collect(),
        );
        n
    }

    /// The eviction manager's `Admit`: disk (and PID) pressure rejects every pod but a
    /// critical one, memory pressure only BestEffort pods that do not tolerate it.
    #[test]
    fn pressure_conditions_reject_as_the_eviction_manager_does() {
        let best_effort = pod("be", &[("c", "busybox")]);
        let burstable = requesting("bu", &[("memory", "10Mi")]);
        let mut critical = pod("crit", &[("c", "busybox")]);
        critical.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        let mut tolerant = pod("tol", &[("c", "busybox")]);
        tolerant.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("node.kubernetes.io/memory-pressure".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        let sysctls = SysctlWhitelist::new(&[]).unwrap();
        let admit = |p: &Pod, held: Pressure| admit_pod(p, &[], &big_node(), &sysctls, held).err();
        let disk = Some(Rejection {
            reason: "Evicted".into(),
            message: "The node had condition: [DiskPressure]. ".into(),
        });
        assert_eq!(admit(&best_effort, under(&["DiskPressure"])), disk);
        assert_eq!(admit(&burstable, under(&["DiskPressure"])), disk);
        assert_eq!(admit(&tolerant, under(&["DiskPressure"])), disk);
        assert_eq!(admit(&critical, under(&["DiskPressure"])), None);
        assert_eq!(
            admit(&burstable, under(&["MemoryPressure", "DiskPressure"])).map(|r| r.message),
            Some("The node had condition: [MemoryPressure DiskPressure]. ".into())
        );
        let memory = under(&["MemoryPressure"]);
        assert_eq!(
            admit(&best_effort, memory).map(|r| r.message),
            Some("The node had condition: [MemoryPressure]. ".into())
        );
        for admitted in [&burstable, &tolerant, &critical] {
            assert_eq!(admit(admitted, memory), None);
        }
        assert_eq!(admit(&best_effort, under(&[])), None);
        assert!(admit(&best_effort, under(&["PIDPressure"])).is_some());
    }

    /// The admitter refuses on the conditions the eviction manager holds as soon as it
    /// holds them, whatever the Node reports: a Node still reporting a previous
    /// process's pressure refuses nothing, and pressure not reported yet refuses.
    #[tokio::test]
    async fn the_admitter_reads_the_eviction_managers_conditions_not_the_nodes() {
        let conditions = NodeConditions::default();
        let node = reporting(&["DiskPressure"]);
        let a = admitter(node.clone(), Some(node)).with_conditions(conditions.clone());
        let best_effort = |name: &str| Arc::new(pod(name, &[("c", "busybox")]));
        assert_eq!(a.admit(&best_effort("a"), |_| false), None);
        conditions.replace(under(&["MemoryPressure"]));
        assert_eq!(
            a.admit(&best_effort("b"), |_| false),
            Some(Rejection {
                reason: "Evicted".into(),
                message: "The node had condition: [MemoryPressure]. ".into(),
            })
        );
        conditions.replace(Pressure::default());
        assert_eq!(a.admit(&best_effort("c"), |_| false), None);
    }

    fn rejected(pod: &Pod, others: &[&Pod], node: &Node) -> Option<Rejection> {
        general_predicates(pod, others, node).err()
    }

    #[test]
    fn cpu_memory_and_pods_against_allocatable_minus_admitted_requests() {
        let n = big_node();
        let a = requesting("a", &[("cpu", "1500m"), ("memory", "512Mi")]);
        assert_eq!(rejected(&a, &[], &n), None);
        let b = requesting("b", &[("cpu", "600m")]);
        assert_eq!(
            rejected(&b, &[&a], &n),
            Some(Rejection {
                reason: "OutOfcpu".into(),
                message: "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000".into()
            })
        );
        let c = requesting("c", &[("memory", "600Mi")]);
        assert_eq!(
            rejected(&c, &[&a], &n),
            Some(Rejection {
                reason: "OutOfmemory".into(),
                message: format!(
                    "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {}",
                    600 << 20,
                    512 << 20,
                    1 << 30
                )
            })
        );
        // The pod count comes first, and counts pods that request nothing.
        let none = requesting("none", &[]);
        assert_eq!(
            rejected(&c, &[&none, &none, &none], &n).map(|r| (r.reason, r.message)),
            Some((
                "OutOfpods".into(),
                "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3".into()
            ))
        );
        assert_eq!(rejected(&none, &[&a, &b], &n), None);
    }

    #[test]
    fn device_allocation_runs_before_the_predicates_and_may_raise_allocatable() {
        let mut n = big_node();
        let allocatable = n.status.as_mut().unwrap().allocatable.as_mut().unwrap();
        allocatable.insert("example.com/dev".into(), ApiQuantity("0".into()));
        let sysctls = SysctlWhitelist::new(&[]).unwrap();
        let dev = requesting("d", &[("example.com/dev", "2")]);
        // The allocator's refusal is reported, not the predicates' OutOf...
        let refusal = || {
            Err(Rejection {
                reason: "UnexpectedAdmissionError".into(),
                message: "Allocate failed".into(),
            })
        };
        let got = admit_pod_with(&dev, &[], &n, &sysctls, Pressure::default(), |_| refusal())
            .unwrap_err();
        assert_eq!(got.reason, "UnexpectedAdmissionError");
        // With no allocatable, the predicates refuse the pod...
        let got =
            admit_pod_with(&dev, &[], &n, &sysctls, Pressure::default(), |_| Ok(None)).unwrap_err();
        assert_eq!(got.reason, "OutOfexample.com/dev");
        // ...unless the pod holds devices: allocatable is raised to the devices held.
        let floor = BTreeMap::from([("example.com/dev".to_owned(), 2)]);
        let raised = raise_allocatable(&n, &floor);
        let quantity = |node: &Node| {
            node.status.as_ref().unwrap().allocatable.as_ref().unwrap()["example.com/dev"]
                .0
                .clone()
        };
        assert_eq!(raised.as_ref().map(quantity).as_deref(), Some("2"));
        assert_eq!(
            admit_pod_with(&dev, &[], &n, &sysctls, Pressure::default(), |_| Ok(raised)),
            Ok(())
        );
        let floor = BTreeMap::from([("example.com/dev".to_owned(), 0)]);
        assert!(raise_allocatable(&n, &floor).is_none(), "never lowered");
    }

    #[test]
    fn huge_pages_and_extended_resources_are_checked_by_name_and_missing_extended_ones_dropped() {
        let mut n = big_node();
        let allocatable = n.status.as_mut().unwrap().allocatable.as_mut().unwrap();
        allocatable.insert("hugepages-2Mi".into(), ApiQuantity("0".into()));
        allocatable.insert("example.com/gpu".into(), ApiQuantity("2".into()));
        let huge = requesting("h", &[("hugepages-2Mi", "4Mi"), ("memory", "8Mi")]);
        let got = rejected(&huge, &[], &n).unwrap();
        assert_eq!(got.reason, "OutOfhugepages-2Mi");
        assert_eq!(
            got.message,
            "Node didn't have enough resource: hugepages-2Mi, requested: 4194304, used: 0, capacity: 0"
        );
        // An extended resource the node lacks is left to its device plugin (admitted); one
        // it has is counted against the other pods' requests.
        let widget = requesting("w", &[("example.com/widget", "1")]);
        assert_eq!(rejected(&widget, &[], &n), None);
        let gpu = requesting("g", &[("example.com/gpu", "2")]);
        assert_eq!(rejected(&gpu, &[], &n), None);
        let got = rejected(&gpu, &[&gpu], &n).unwrap();
        assert_eq!(got.reason, "OutOfexample.com/gpu");
        assert_eq!(
            got.message,
            "Node didn't have enough resource: example.com/gpu, requested: 2, used: 2, capacity: 2"
        );
        // A `kubernetes.io/` resource is native: absent from the node, it has no room.
        let native = requesting("k", &[("kubernetes.io/thing", "1")]);
        assert_eq!(
            rejected(&native, &[], &n).map(|r| r.reason),
            Some("OutOfkubernetes.io/thing".into())
        );
    }

    #[test]
    fn ephemeral_storage_is_checked_when_requested() {
        let n = big_node();
        let p = requesting("p", &[("ephemeral-storage", "1Gi")]);
        assert_eq!(
            rejected(&p, &[], &n).map(|r| r.reason),
            Some("OutOfephemeral-storage".into())
        );
    }

    #[test]
    fn ephemeral_storage_requests_count_against_allocatable_minus_the_admitted_pods() {
        let mut n = big_node();
        let allocatable = n.status.as_mut().unwrap().allocatable.as_mut().unwrap();
        allocatable.insert("ephemeral-storage".into(), ApiQuantity("10Gi".into()));
        let first = requesting("first", &[("ephemeral-storage", "6Gi")]);
        assert_eq!(rejected(&first, &[], &n), None);
        let second = requesting("second", &[("ephemeral-storage", "5Gi")]);
        assert_eq!(
            rejected(&second, &[&first], &n),
            Some(Rejection {
                reason: "OutOfephemeral-storage".into(),
                message: "Node didn't have enough resource: ephemeral-storage, requested: 5368709120, used: 6442450944, capacity: 10737418240".into(),
            })
        );
        // What is left fits exactly.
        let rest = requesting("rest", &[("ephemeral-storage", "4Gi")]);
        assert_eq!(rejected(&rest, &[&first], &n), None);
    }

    #[test]
    fn init_containers_count_at_their_maximum_and_overhead_is_added() {
        let mut p = requesting("p", &[("cpu", "500m")]);
        let spec = p.spec.as_mut().unwrap();
        let mut init = spec.containers[0].clone();
        init.resources = Some(ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".into(), ApiQuantity("1".into()))])),
            ..Default::default()
        });
        spec.init_containers = Some(vec![init.clone(), init]);
        spec.overhead = Some(BTreeMap::from([("cpu".into(), ApiQuantity("100m".into()))]));
        assert_eq!(Resources::of_pod(p.spec.as_ref().unwrap()).milli_cpu, 1100);
    }

    #[test]
    fn node_selector_must_match_the_labels() {
        let n = big_node();
        let mut p = requesting("p", &[]);
        p.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("disk".into(), "ssd".into())]));
        assert_eq!(rejected(&p, &[], &n), None);
        p.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("disk".into(), "hdd".into())]));
        assert_eq!(
            rejected(&p, &[], &n),
            Some(Rejection {
                reason: "NodeAffinity".into(),
                message: "Predicate NodeAffinity failed".into()
            })
        );
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| (*v).into()).collect()),
        }
    }

    fn with_affinity(terms: Vec<NodeSelectorTerm>) -> Pod {
        let mut p = requesting("p", &[]);
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        p
    }

    fn exprs(reqs: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(reqs),
            match_fields: None,
        }
    }

    #[test]
    fn required_node_affinity_operators_and_terms() {
        let n = big_node();
        let fits =
            |terms: Vec<NodeSelectorTerm>| rejected(&with_affinity(terms), &[], &n).is_none();
        assert!(fits(vec![exprs(vec![req("disk", "In", &["hdd", "ssd"])])]));
        assert!(!fits(vec![exprs(vec![req("disk", "NotIn", &["ssd"])])]));
        assert!(fits(vec![exprs(vec![req("gpu", "NotIn", &["yes"])])]));
        assert!(fits(vec![exprs(vec![req("disk", "Exists", &[])])]));
        assert!(!fits(vec![exprs(vec![req("disk", "DoesNotExist", &[])])]));
        assert!(fits(vec![exprs(vec![req("cores", "Gt", &["4"])])]));
        assert!(!fits(vec![exprs(vec![req("cores", "Lt", &["4"])])]));
        assert!(!fits(vec![exprs(vec![req("disk", "Gt", &["4"])])]));
        // Invalid requirements match nothing; so does an empty term.
        assert!(!fits(vec![exprs(vec![req("disk", "In", &[])])]));
        assert!(!fits(vec![exprs(vec![req("disk", "Exists", &["ssd"])])]));
        assert!(!fits(vec![NodeSelectorTerm::default()]));
        assert!(!fits(vec![]));
        // Expressions of a term are ANDed, terms ORed.
        assert!(!fits(vec![exprs(vec![
            req("disk", "In", &["ssd"]),
            req("cores", "Lt", &["4"])
        ])]));
        assert!(fits(vec![
            exprs(vec![req("disk", "In", &["hdd"])]),
            exprs(vec![req("disk", "In", &["ssd"])])
        ]));
        // Fields: metadata.name only, In/NotIn with one value.
        let fields = |r| NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![r]),
        };
        assert!(fits(vec![fields(req("metadata.name", "In", &["n1"]))]));
        assert!(!fits(vec![fields(req("metadata.name", "NotIn", &["n1"]))]));
        assert!(!fits(vec![fields(req(
            "metadata.name",
            "In",
            &["n1", "n2"]
        ))]));
    }

    #[test]
    fn node_name_must_be_this_node() {
        let n = big_node();
        let mut p = requesting("p", &[]);
        p.spec.as_mut().unwrap().node_name = Some("other".into());
        assert_eq!(
            rejected(&p, &[], &n).map(|r| r.reason),
            Some("NodeName".into())
        );
    }

    fn with_host_port(name: &str, port: i32, ip: Option<&str>, protocol: Option<&str>) -> Pod {
        let mut p = requesting(name, &[]);
        p.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(port),
            host_ip: ip.map(Into::into),
            protocol: protocol.map(Into::into),
            ..Default::default()
        }]);
        p
    }

    #[test]
    fn host_ports_clash_on_the_same_address_or_any_address() {
        let n = big_node();
        let any = with_host_port("a", 8080, None, None);
        let clash = with_host_port("b", 8080, Some("10.0.0.1"), Some("TCP"));
        assert_eq!(
            rejected(&clash, &[&any], &n),
            Some(Rejection {
                reason: "NodePorts".into(),
                message: "Predicate NodePorts failed".into()
            })
        );
        let udp = with_host_port("c", 8080, None, Some("UDP"));
        assert_eq!(rejected(&udp, &[&any], &n), None);
        let other_ip = with_host_port("d", 8080, Some("10.0.0.2"), None);
        assert_eq!(rejected(&other_ip, &[&clash], &n), None);
        let other_port = with_host_port("e", 8081, None, None);
        assert_eq!(rejected(&other_port, &[&any], &n), None);
    }

    fn with_sysctls(names: &[&str], host_network: bool) -> Pod {
        let mut p = requesting("p", &[]);
        let spec = p.spec.as_mut().unwrap();
        spec.host_network = Some(host_network);
        spec.security_context = Some(PodSecurityContext {
            sysctls: Some(
                names
                    .iter()
                    .map(|n| Sysctl {
                        name: (*n).into(),
                        value: "1".into(),
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        p
    }

    fn forbidden(message: &str) -> Result<(), Rejection> {
        Err(Rejection {
            reason: "SysctlForbidden".into(),
            message: format!("forbidden sysctl: {message}"),
        })
    }

    #[test]
    fn safe_sysctls_pass_and_unsafe_ones_need_the_flag() {
        let safe = SysctlWhitelist::new(&[]).unwrap();
        let unsafe_ok =
            SysctlWhitelist::new(&["kernel.msg*".into(), "net.core.somaxconn".into()]).unwrap();
        let cases = [
            (&safe, "net.ipv4.tcp_syncookies", false, Ok(())),
            (
                &safe,
                "kernel.msgmax",
                false,
                forbidden("\"kernel.msgmax\" not whitelisted"),
            ),
            (&unsafe_ok, "kernel.msgmax", false, Ok(())),
            (&unsafe_ok, "kernel.msgmax", true, Ok(())),
            (
                &unsafe_ok,
                "net.core.somaxconn",
                true,
                forbidden("\"net.core.somaxconn\" not allowed with host net enabled"),
            ),
        ];
        for (whitelist, sysctl, host_network, want) in cases {
            assert_eq!(
                whitelist.admit(&with_sysctls(&[sysctl], host_network)),
                want,
                "{sysctl}"
            );
        }
    }

    #[test]
    fn the_flag_takes_only_namespaced_sysctl_patterns() {
        assert!(matches!(
            SysctlWhitelist::new(&["vm.swappiness".into()]),
            Err(AdmissionError::NotNamespaced(_))
        ));
        for bad in ["Kernel.msgmax", "net..core", "net.*.x", "-net.core", ""] {
            assert!(
                matches!(
                    SysctlWhitelist::new(&[bad.into()]),
                    Err(AdmissionError::InvalidSysctlPattern(_))
                ),
                "{bad}"
            );
        }
        assert!(SysctlWhitelist::new(&["net.*".into(), "fs.mqueue.*".into()]).is_ok());
    }

    #[test]
    fn sysctls_are_checked_before_the_predicates() {
        let mut p = with_sysctls(&["kernel.msgmax"], false);
        p.spec.as_mut().unwrap().node_name = Some("other".into());
        let sysctls = SysctlWhitelist::new(&[]).unwrap();
        assert_eq!(
            admit_pod(&p, &[], &big_node(), &sysctls, Pressure::default()).map_err(|r| r.reason),
            Err("SysctlForbidden".into())
        );
    }

    #[test]
    fn rejected_pods_fail_with_the_reason_and_a_pod_prefixed_message() {
        let status = rejected_status(
            &requesting("p", &[]),
            &Rejection {
                reason: "OutOfcpu".into(),
                message: "Node didn't have enough resource: cpu".into(),
            },
        );
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("OutOfcpu"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod Node didn't have enough resource: cpu")
        );
    }

    /// An admitter whose watch has delivered `watched`, if given.
    fn admitter(initial: Node, watched: Option<Node>) -> PodAdmitter {
        let (store, mut writer) = reflector::store();
        if let Some(n) = watched {
            writer.apply_watcher_event(&watcher::Event::Apply(n));
        }
        // Never reached by these tests: only RuntimeClass look-ups use the API.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        PodAdmitter::new(store, initial, SysctlWhitelist::new(&[]).unwrap(), client)
    }

    #[tokio::test]
    async fn admitted_pods_count_until_finished_or_gone_and_rejections_are_final() {
        let n = node(&[], &[("cpu", "1"), ("memory", "1Gi"), ("pods", "10")]);
        let a = admitter(big_node(), Some(n));
        let never = |_: &Pod| false;
        let first = Arc::new(requesting("first", &[("cpu", "800m")]));
        let second = Arc::new(requesting("second", &[("cpu", "800m")]));
        assert_eq!(a.admit(&first, never), None);
        assert_eq!(
            a.admit(&second, never).map(|r| r.reason),
            Some("OutOfcpu".into())
        );
        // Seen again (an update), even with room now, it stays rejected.
        let first_done = |p: &Pod| p.metadata.name.as_deref() == Some("first");
        assert_eq!(a.admit(&second, first_done), None);
        // A new pod is checked without the finished one.
        let third = Arc::new(requesting("third", &[("cpu", "800m")]));
        assert_eq!(a.admit(&third, first_done), None);
        // A pod gone from the API frees its requests.
        a.forget("uid-third");
        let fourth = Arc::new(requesting("fourth", &[("cpu", "800m")]));
        assert_eq!(a.admit(&fourth, first_done), None);
        // So does one missing from a new full list (its deletion was missed).
        a.retain(&HashSet::from(["uid-first".to_owned()]));
        let fifth = Arc::new(requesting("fifth", &[("cpu", "800m")]));
        assert_eq!(a.admit(&fifth, first_done), None);
    }

    #[tokio::test]
    async fn the_registered_node_serves_until_the_watch_delivers() {
        let mut p = requesting("p", &[]);
        p.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("disk".into(), "ssd".into())]));
        let p = Arc::new(p);
        let initial = admitter(big_node(), None);
        assert_eq!(initial.admit(&p, |_| false), None);
        let relabelled = admitter(big_node(), Some(node(&[], &[("pods", "10")])));
        assert_eq!(
            relabelled.admit(&p, |_| false).map(|r| r.reason),
            Some("NodeAffinity".into())
        );
    }

    #[test]
    fn runtime_class_look_up_errors_read_like_the_kubelet_lister() {
        let not_found = kube::Error::Api(
            kube::core::Status::failure("runtimeclasses.node.k8s.io \"x\" not found", "NotFound")
                .with_code(404)
                .boxed(),
        );
        let err = handler_of("x".into(), Err(not_found)).unwrap_err();
        assert_eq!(err.to_string(), "runtimeclass.node.k8s.io \"x\" not found");
        let rc = RuntimeClass {
            handler: "runc".into(),
            ..Default::default()
        };
        assert_eq!(handler_of("x".into(), Ok(rc)).unwrap(), "runc");
    }
}
