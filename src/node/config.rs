//! What the node agent is told: [`NodeConfig`], the reservations subtracted from capacity,
//! the hard eviction thresholds, and the checks the kubelet applies to its node labels.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::NodeError;

/// The version this agent reports as `nodeInfo.kubeletVersion` and `kubeProxyVersion` unless
/// told otherwise.
///
/// It claims the v1.20.2 kubelet API it implements, with the agent's own version as semver
/// *build metadata* (`+rkubelet-…`), the way k3s reports `v1.20.2+k3s1`: build metadata does
/// not change ordering, so every component that compares kubelet versions (skew checks,
/// feature gating in controllers) sees exactly v1.20.2, while a pre-release suffix
/// (`-rkubelet`) would sort *before* v1.20.2. Against a newer control plane the version skew
/// policy still holds (a kubelet may be older than the kube-apiserver, never newer).
pub const DEFAULT_KUBELET_VERSION: &str = concat!("v1.20.2+rkubelet-", env!("CARGO_PKG_VERSION"));

/// The kubelet's `--root-dir` default: where kubeadm's `kubelet.conf`, device plugins and CSI
/// drivers look for the agent's state.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";

/// Resources set aside for system daemons or Kubernetes daemons (the kubelet's
/// `--kube-reserved` and `--system-reserved`). All default to zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservation {
    /// CPU, in millicores.
    pub cpu_millis: u64,
    /// Memory, in bytes.
    pub memory_bytes: u64,
    /// Local ephemeral storage on the root filesystem, in bytes.
    pub ephemeral_storage_bytes: u64,
}

/// A threshold on a filesystem or PID eviction signal, as the kubelet's `ThresholdValue`: a
/// percentage of the total (`nodefs.available<10%`) or an absolute amount, in bytes, inodes
/// or PIDs (`nodefs.available<1Gi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threshold {
    /// This percentage of the total; 0 is no threshold.
    Percent(u8),
    /// This many bytes, inodes or PIDs.
    Amount(u64),
}

impl Threshold {
    /// No threshold: never met.
    pub const NONE: Self = Self::Percent(0);

    /// What the threshold stands for out of `total` (the kubelet's `GetThresholdQuantity`).
    #[must_use]
    pub fn amount_of(self, total: u64) -> u64 {
        match self {
            Self::Percent(p) => {
                u64::try_from(u128::from(total) * u128::from(p) / 100).unwrap_or(u64::MAX)
            }
            Self::Amount(a) => a,
        }
    }

    /// Whether `available` of `total` is strictly below the threshold (a percentage is
    /// never met with an unknown total).
    #[must_use]
    pub fn met(self, available: u64, total: u64) -> bool {
        match self {
            Self::Percent(p) => {
                total > 0 && u128::from(available) * 100 < u128::from(total) * u128::from(p)
            }
            Self::Amount(a) => available < a,
        }
    }
}

/// The hard eviction thresholds (the kubelet's `--eviction-hard`). They decide the pressure
/// conditions and are also subtracted from allocatable, as the kubelet does for
/// `memory.available` and `nodefs.available`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictionHard {
    /// `memory.available` below this many bytes is memory pressure (kubelet default 100Mi).
    pub memory_available_bytes: u64,
    /// `nodefs.available` below this is disk pressure (kubelet default 10%).
    pub nodefs_available: Threshold,
    /// `nodefs.inodesFree` below this is disk pressure too (kubelet default 5%).
    pub nodefs_inodes_free: Threshold,
    /// `imagefs.available` below this (of the runtime's image filesystem) is disk pressure
    /// too (kubelet default 15%).
    pub imagefs_available: Threshold,
    /// `imagefs.inodesFree` below this (the kubelet sets none by default).
    pub imagefs_inodes_free: Threshold,
    /// `pid.available` below this (of `kernel.pid_max`) is PID pressure. The kubelet has no
    /// default PID threshold; rkubelet uses 10% so that the condition means something.
    pub pid_available: Threshold,
}

impl Default for EvictionHard {
    fn default() -> Self {
        Self {
            memory_available_bytes: 100 * 1024 * 1024,
            nodefs_available: Threshold::Percent(10),
            nodefs_inodes_free: Threshold::Percent(5),
            imagefs_available: Threshold::Percent(15),
            imagefs_inodes_free: Threshold::NONE,
            pid_available: Threshold::Percent(10),
        }
    }
}

/// Everything the node agent needs to register its Node and keep it up to date.
///
/// Built with [`NodeConfig::new`], which fills in the kubelet's defaults, then adjusted
/// field by field; [`NodeConfig::validate`] is called by the agent before it talks to the
/// API server.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The Node's name, also the Lease's name and holder: the `<name>` of the client
    /// identity `system:node:<name>` (lowercase DNS subdomain).
    pub name: String,
    /// The `kubernetes.io/hostname` label and the `Hostname` address (the kubelet's
    /// `--hostname-override`). Defaults to `name`.
    pub hostname: String,
    /// The `InternalIP` address (the kubelet's `--node-ip`). Must not be loopback,
    /// link-local, multicast or unspecified.
    pub node_ip: IpAddr,
    /// The agent's state directory (the kubelet's `--root-dir`): its filesystem is the
    /// `nodefs` behind `ephemeral-storage` and DiskPressure.
    pub root_dir: PathBuf,
    /// The `pods` capacity (the kubelet's `--max-pods`, default 110).
    pub max_pods: u32,
    /// The port the agent's API listens on, published as
    /// `status.daemonEndpoints.kubeletEndpoint.Port` (default 10250).
    pub daemon_port: u16,
    /// `nodeInfo.kubeletVersion` and `nodeInfo.kubeProxyVersion`
    /// (default [`DEFAULT_KUBELET_VERSION`]).
    pub kubelet_version: String,
    /// Labels added to the default ones (the kubelet's `--node-labels`). Checked by
    /// [`NodeConfig::validate`] against what the NodeRestriction admission plugin lets a
    /// node set on itself.
    pub labels: BTreeMap<String, String>,
    /// `spec.providerID` of the Node it registers (the kubelet's `--provider-id`).
    pub provider_id: Option<String>,
    /// `spec.taints` of the Node it registers (the kubelet's `--register-with-taints`); an
    /// existing Node keeps its own.
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// `--kube-reserved`.
    pub kube_reserved: Reservation,
    /// `--system-reserved`.
    pub system_reserved: Reservation,
    /// `--eviction-hard`.
    pub eviction_hard: EvictionHard,
    /// How long a pressure condition stays true after the pressure is last seen (the
    /// kubelet's `--eviction-pressure-transition-period`, default 5 minutes), so that a
    /// condition does not flap around its threshold.
    pub eviction_pressure_transition_period: Duration,
    /// How often node status is computed (`nodeStatusUpdateFrequency`, default 10 s).
    pub node_status_update_frequency: Duration,
    /// How often node status is sent even when unchanged (`nodeStatusReportFrequency`,
    /// default 1 minute).
    pub node_status_report_frequency: Duration,
    /// The Lease's `leaseDurationSeconds` (`nodeLeaseDurationSeconds`, default 40); the
    /// lease is renewed every quarter of it.
    pub node_lease_duration_seconds: i32,
    /// At most this many images are reported in `status.images`, largest first
    /// (`nodeStatusMaxImages`, default 50).
    pub node_status_max_images: usize,
}

impl NodeConfig {
    /// A configuration with the kubelet's defaults for the node `name` at `node_ip`.
    #[must_use]
    pub fn new(name: impl Into<String>, node_ip: IpAddr) -> Self {
        let name = name.into();
        Self {
            hostname: name.clone(),
            name,
            node_ip,
            root_dir: PathBuf::from(DEFAULT_ROOT_DIR),
            max_pods: 110,
            daemon_port: 10250,
            kubelet_version: DEFAULT_KUBELET_VERSION.to_owned(),
            labels: BTreeMap::new(),
            provider_id: None,
            register_with_taints: Vec::new(),
            kube_reserved: Reservation::default(),
            system_reserved: Reservation::default(),
            eviction_hard: EvictionHard::default(),
            eviction_pressure_transition_period: Duration::from_secs(5 * 60),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(60),
            node_lease_duration_seconds: 40,
            node_status_max_images: 50,
        }
    }

    /// The lease renewal interval: a quarter of the lease duration, as the kubelet's.
    #[must_use]
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.node_lease_duration_seconds.unsigned_abs()) * 250)
    }

    /// Refuses a configuration the API server would refuse, or that would make the agent
    /// misbehave: a bad node name or address, labels a node may not set on itself, zero
    /// periods.
    ///
    /// # Errors
    /// [`NodeError::InvalidConfig`] naming the first problem found.
    pub fn validate(&self) -> Result<(), NodeError> {
        let invalid = |reason: String| NodeError::InvalidConfig {
            node: self.name.clone(),
            reason,
        };
        if !is_dns_subdomain(&self.name) {
            return Err(invalid(format!(
                "node name {:?} is not a lowercase DNS subdomain",
                self.name
            )));
        }
        if !is_label_value(&self.hostname) || self.hostname.is_empty() {
            return Err(invalid(format!(
                "hostname {:?} is not a valid label value",
                self.hostname
            )));
        }
        let ip = self.node_ip;
        let unusable = ip.is_loopback()
            || ip.is_unspecified()
            || ip.is_multicast()
            || match ip {
                IpAddr::V4(v4) => v4.is_link_local(),
                IpAddr::V6(v6) => v6.is_unicast_link_local(),
            };
        if unusable {
            return Err(invalid(format!(
                "node IP {ip} is loopback, link-local, multicast or unspecified"
            )));
        }
        for (key, value) in &self.labels {
            check_node_label(key, value).map_err(invalid)?;
        }
        if self.max_pods == 0 {
            return Err(invalid("max pods must be at least 1".into()));
        }
        if self.node_lease_duration_seconds <= 0 {
            return Err(invalid("the node lease duration must be positive".into()));
        }
        if self.node_status_update_frequency.is_zero()
            || self.node_status_report_frequency.is_zero()
        {
            return Err(invalid(
                "node status update and report frequencies must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// The Go name of the architecture this binary was built for (`GOARCH`), as the
/// `kubernetes.io/arch` label and `nodeInfo.architecture` expect it.
#[must_use]
pub fn go_arch() -> &'static str {
    go_arch_of(std::env::consts::ARCH, cfg!(target_endian = "little"))
}

/// Maps a Rust `target_arch` to Go's `GOARCH`.
fn go_arch_of(rust_arch: &'static str, little_endian: bool) -> &'static str {
    match (rust_arch, little_endian) {
        ("x86_64", _) => "amd64",
        ("x86", _) => "386",
        ("aarch64", _) => "arm64",
        ("powerpc64", true) => "ppc64le",
        ("powerpc64", false) => "ppc64",
        ("mips64", true) => "mips64le",
        ("mips", true) => "mipsle",
        ("loongarch64", _) => "loong64",
        // arm, s390x, riscv64, mips64 (big endian), mips: same name in Go.
        (other, _) => other,
    }
}

/// Labels the kubelet itself sets, which a node may set on its own Node object.
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// Label namespaces (and their subdomains) reserved for the kubelet's own use.
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

fn is_in_namespace(namespace: &str, domain: &str) -> bool {
    namespace == domain
        || namespace
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// Checks one `--node-labels` entry: a well-formed label, and one that a node may set on
/// itself. Labels in the `kubernetes.io` and `k8s.io` namespaces are refused unless the
/// kubelet owns them (as the kubelet's own flag validation does); this refuses
/// `node-role.kubernetes.io/*` and `node-restriction.kubernetes.io/*`, which the
/// NodeRestriction admission plugin reserves for administrators.
fn check_node_label(key: &str, value: &str) -> Result<(), String> {
    let (namespace, name) = key.rsplit_once('/').unwrap_or(("", key));
    if (!namespace.is_empty() && !is_dns_subdomain(namespace)) || !is_label_name(name) {
        return Err(format!("node label key {key:?} is not a qualified name"));
    }
    if !is_label_value(value) {
        return Err(format!("node label {key:?} has an invalid value {value:?}"));
    }
    let restricted = ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|domain| is_in_namespace(namespace, domain));
    let allowed = KUBELET_LABELS.contains(&key)
        || KUBELET_LABEL_NAMESPACES
            .iter()
            .any(|domain| is_in_namespace(namespace, domain));
    if restricted && !allowed {
        return Err(format!(
            "node label {key:?} is in a namespace a node may not set on itself (allowed: \
             {}, and the {} namespaces)",
            KUBELET_LABELS.join(", "),
            KUBELET_LABEL_NAMESPACES.join(", ")
        ));
    }
    Ok(())
}

/// A lowercase RFC 1123 subdomain of at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && !s.is_empty()
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The name part of a label key: 1 to 63 alphanumerics, `-`, `_` or `.`, starting and
/// ending with an alphanumeric.
fn is_label_name(s: &str) -> bool {
    !s.is_empty() && is_label_value(s)
}

/// A label value: empty, or up to 63 alphanumerics, `-`, `_` or `.`, starting and ending
/// with an alphanumeric.
fn is_label_value(s: &str) -> bool {
    let bytes = s.as_bytes();
    s.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_none_or(u8::is_ascii_alphanumeric)
        && bytes.last().is_none_or(u8::is_ascii_alphanumeric)
}

/// Parses a Go duration as the kubelet's flags take them: a sequence of decimal numbers
/// with units `h`, `m`, `s` or `ms` (`5m0s`, `1h`, `1.5s`, `250ms`), or `0`.
///
/// # Errors
/// Anything else, with what was given.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?} (examples: 5m0s, 30s, 250ms)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, tail) = rest.split_at(number_end);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let seconds = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return Err(bad()),
        };
        total += value * seconds;
        rest = tail;
    }
    if text.is_empty() {
        return Err(bad());
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        NodeConfig::new("rk-node1", "198.18.0.1".parse().unwrap())
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let c = config();
        assert_eq!(c.max_pods, 110);
        assert_eq!(c.daemon_port, 10250);
        assert_eq!(c.hostname, "rk-node1");
        assert_eq!(c.node_lease_duration_seconds, 40);
        assert_eq!(c.lease_renew_interval(), Duration::from_secs(10));
        assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(c.node_status_report_frequency, Duration::from_secs(60));
        assert_eq!(
            c.eviction_hard,
            EvictionHard {
                memory_available_bytes: 100 << 20,
                nodefs_available: Threshold::Percent(10),
                nodefs_inodes_free: Threshold::Percent(5),
                imagefs_available: Threshold::Percent(15),
                imagefs_inodes_free: Threshold::NONE,
                pid_available: Threshold::Percent(10),
            }
        );
        c.validate().unwrap();
    }

    #[test]
    fn the_default_version_is_v1_20_2_with_build_metadata() {
        assert!(DEFAULT_KUBELET_VERSION.starts_with("v1.20.2+rkubelet-"));
        // Semver build metadata: dot-separated [0-9A-Za-z-] identifiers.
        let (_, build) = DEFAULT_KUBELET_VERSION.split_once('+').unwrap();
        assert!(
            build
                .split('.')
                .all(|id| !id.is_empty()
                    && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        );
    }

    #[test]
    fn maps_rust_architectures_to_go_names() {
        assert_eq!(go_arch_of("x86_64", true), "amd64");
        assert_eq!(go_arch_of("aarch64", true), "arm64");
        assert_eq!(go_arch_of("x86", true), "386");
        assert_eq!(go_arch_of("powerpc64", true), "ppc64le");
        assert_eq!(go_arch_of("powerpc64", false), "ppc64");
        assert_eq!(go_arch_of("s390x", false), "s390x");
        assert_eq!(go_arch_of("riscv64", true), "riscv64");
        assert_eq!(go_arch_of("arm", true), "arm");
        #[cfg(target_arch = "x86_64")]
        assert_eq!(go_arch(), "amd64");
    }

    #[test]
    fn refuses_labels_that_node_restriction_reserves() {
        for key in [
            "node-role.kubernetes.io/master",
            "node-restriction.kubernetes.io/pool",
            "kubernetes.io/role",
            "example.k8s.io/x",
        ] {
            let mut c = config();
            c.labels.insert(key.into(), "true".into());
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("may not set on itself"), "{key}: {err}");
            assert!(err.contains("rk-node1"), "{err}");
        }
    }

    #[test]
    fn accepts_own_and_kubelet_namespaced_labels() {
        let mut c = config();
        for key in [
            "rkubelet.dev/pool",
            "tier",
            "node.kubernetes.io/instance-type",
            "kubelet.kubernetes.io/x",
            "team.node.kubernetes.io/y",
            "topology.kubernetes.io/zone",
        ] {
            c.labels.insert(key.into(), "a-1".into());
        }
        c.validate().unwrap();
    }

    #[test]
    fn refuses_malformed_labels_names_and_addresses() {
        let mut c = config();
        c.labels.insert("bad key".into(), "v".into());
        assert!(c.validate().is_err());
        let mut c = config();
        c.labels.insert("ok".into(), "-bad".into());
        assert!(c.validate().is_err());
        let mut c = config();
        c.name = "Node_1".into();
        assert!(c.validate().is_err());
        let mut c = config();
        c.node_ip = "127.0.0.1".parse().unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("loopback"));
        let mut c = config();
        c.node_lease_duration_seconds = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn go_durations_as_the_kubelets_flags_take_them() {
        let d = |t| parse_go_duration(t);
        assert_eq!(d("5m0s"), Ok(Duration::from_secs(300)));
        assert_eq!(d("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(d("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(d("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(d("0"), Ok(Duration::ZERO));
        for wrong in ["", "5", "5x", "m", "-1s", "1.2.3s"] {
            assert!(d(wrong).is_err(), "{wrong}");
        }
    }
}
