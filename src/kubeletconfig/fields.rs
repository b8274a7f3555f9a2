//! The KubeletConfiguration fields and what rkubelet does with each, in one place: the
//! fields implemented through a flag (one line each: field, flag, value form), the fields
//! whose behaviour is fixed in rkubelet, the fields whose implementation is under way, and
//! every other v1beta1 field (known, so that only a typo is called unknown). [`plan`]
//! turns a decoded file into flag values and notes.

use std::path::Path;

use serde_json::{Map, Value};

use super::file::{ConfigError, ConfigFile};

/// How a field's value becomes a flag's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// A string; empty is unset.
    Text,
    /// A file path, relative to the file's directory (as the kubelet resolves them); empty
    /// is unset.
    Path,
    /// An integer that the kubelet defaults when zero.
    Count,
    /// An integer where zero is a value.
    Int,
    /// `true` or `false`.
    Bool,
    /// A Go duration (`5m0s`); zero is unset.
    Duration,
    /// A list of strings, comma-separated in the flag.
    List,
    /// A map, `key=value` comma-separated in the flag; empty is unset.
    Map,
    /// Eviction thresholds, `signal<quantity` comma-separated in the flag; empty is no
    /// thresholds (not the defaults), as the kubelet reads an empty map.
    Thresholds,
}

/// A field implemented through the flag of the same meaning.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Its path in the file (`authentication.x509.clientCAFile`).
    pub path: &'static str,
    /// The flag's long name.
    pub flag: &'static str,
    /// How its value is written as the flag's.
    pub form: Form,
}

const fn field(path: &'static str, flag: &'static str, form: Form) -> Field {
    Field { path, flag, form }
}

/// The fields rkubelet implements, each through its flag (one line per field).
#[rustfmt::skip]
pub const IMPLEMENTED: &[Field] = &[
    field("address", "address", Form::Text),
    field("port", "port", Form::Count),
    field("healthzBindAddress", "healthz-bind-address", Form::Text),
    field("healthzPort", "healthz-port", Form::Int),
    field("tlsCertFile", "tls-cert-file", Form::Path),
    field("tlsPrivateKeyFile", "tls-private-key-file", Form::Path),
    field("rotateCertificates", "rotate-certificates", Form::Bool),
    field("staticPodPath", "pod-manifest-path", Form::Path),
    field("fileCheckFrequency", "file-check-frequency", Form::Duration),
    field("imageGCHighThresholdPercent", "image-gc-high-threshold", Form::Int),
    field("imageGCLowThresholdPercent", "image-gc-low-threshold", Form::Int),
    field("imageMinimumGCAge", "minimum-image-ttl-duration", Form::Duration),
    field("serverTLSBootstrap", "rotate-server-certificates", Form::Bool),
    field("authentication.x509.clientCAFile", "client-ca-file", Form::Path),
    field("clusterDNS", "cluster-dns", Form::List),
    field("clusterDomain", "cluster-domain", Form::Text),
    field("resolvConf", "resolv-conf", Form::Path),
    field("maxPods", "max-pods", Form::Count),
    field("podCIDR", "pod-cidr", Form::Text),
    field("providerID", "provider-id", Form::Text),
    field("kubeReserved", "kube-reserved", Form::Map),
    field("systemReserved", "system-reserved", Form::Map),
    field("evictionHard", "eviction-hard", Form::Thresholds),
    field("evictionPressureTransitionPeriod", "eviction-pressure-transition-period", Form::Duration),
    field("allowedUnsafeSysctls", "allowed-unsafe-sysctls", Form::List),
    field("cgroupsPerQOS", "cgroups-per-qos", Form::Bool),
    field("cgroupRoot", "cgroup-root", Form::Text),
    field("cgroupDriver", "cgroup-driver", Form::Text),
    field("runtimeRequestTimeout", "runtime-request-timeout", Form::Duration),
    field("containerLogMaxSize", "container-log-max-size", Form::Text),
    field("containerLogMaxFiles", "container-log-max-files", Form::Int),
];

/// Fields whose implementation other work of issue 15 is adding, with the flag each will
/// have: ignored (and logged) until then. Move a line to [`IMPLEMENTED`] once its flag
/// exists.
#[rustfmt::skip]
pub const OWNED_ELSEWHERE: &[Field] = &[
    field("evictionMinimumReclaim", "eviction-minimum-reclaim", Form::Map),
];

/// What rkubelet always does for a field: a file asking for it (or leaving it at zero, the
/// kubelet's "default") is quiet, anything else is logged as without effect.
#[derive(Debug, Clone, Copy)]
pub struct Fixed {
    /// Its path in the file.
    pub path: &'static str,
    /// The value rkubelet behaves as.
    pub value: FixedValue,
    /// What rkubelet does instead.
    pub does: &'static str,
}

/// The value of a [`Fixed`] field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixedValue {
    /// A boolean.
    Bool(bool),
    /// A string.
    Text(&'static str),
    /// A Go duration.
    Duration(&'static str),
    /// An integer.
    Int(i64),
}

const fn fixed(path: &'static str, value: FixedValue, does: &'static str) -> Fixed {
    Fixed { path, value, does }
}

/// The fields whose behaviour rkubelet does not make configurable.
#[rustfmt::skip]
pub const FIXED: &[Fixed] = &[
    fixed("enableServer", FixedValue::Bool(true), "the kubelet API runs unless --port=0"),
    fixed("readOnlyPort", FixedValue::Int(0), "rkubelet serves no read-only port"),
    fixed("enableDebuggingHandlers", FixedValue::Bool(true), "logs, exec, attach and port-forward are always served"),
    fixed("authentication.anonymous.enabled", FixedValue::Bool(false), "anonymous requests are always refused"),
    fixed("authentication.webhook.enabled", FixedValue::Bool(true), "bearer tokens are always checked with a TokenReview"),
    fixed("authentication.webhook.cacheTTL", FixedValue::Duration("2m"), "TokenReview answers are cached for 2m"),
    fixed("authorization.mode", FixedValue::Text("Webhook"), "requests are always authorized with a SubjectAccessReview"),
    fixed("authorization.webhook.cacheAuthorizedTTL", FixedValue::Duration("5m"), "allowed reviews are cached for 5m"),
    fixed("authorization.webhook.cacheUnauthorizedTTL", FixedValue::Duration("30s"), "denied reviews are cached for 30s"),
    fixed("syncFrequency", FixedValue::Duration("1m"), "pods are synced again every 1m"),
    fixed("serializeImagePulls", FixedValue::Bool(false), "images are pulled in parallel, one pull per image at a time"),
    fixed("failSwapOn", FixedValue::Bool(false), "rkubelet does not check for swap"),
];

/// Every other field of the v1beta1 KubeletConfiguration (kubelet v1.20): known, not
/// implemented.
pub const KNOWN: &[&str] = &[
    "httpCheckFrequency",
    "staticPodURL",
    "staticPodURLHeader",
    "volumePluginDir",
    "tlsCipherSuites",
    "tlsMinVersion",
    "registryPullQPS",
    "registryBurst",
    "eventRecordQPS",
    "eventBurst",
    "enableContentionProfiling",
    "oomScoreAdj",
    "streamingConnectionIdleTimeout",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "volumeStatsAggPeriod",
    "kubeletCgroups",
    "systemCgroups",
    "cpuManagerPolicy",
    "cpuManagerReconcilePeriod",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "qosReserved",
    "hairpinMode",
    "podPidsLimit",
    "runOnce",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "nodeStatusMaxImages",
    "maxOpenFiles",
    "contentType",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMaxPodGracePeriod",
    "podsPerCore",
    "enableControllerAttachDetach",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "featureGates",
    "configMapAndSecretChangeDetectionStrategy",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "enforceNodeAllocatable",
    "reservedSystemCPUs",
    "showHiddenMetricsForVersion",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogHandler",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
];

/// Something to tell at start-up, once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A field of the file that rkubelet does not act on.
    IgnoredField {
        /// Its path.
        field: String,
        /// Why, or what rkubelet does instead.
        why: String,
    },
    /// A field that the v1beta1 KubeletConfiguration does not have (the kubelet v1.20
    /// drops it silently).
    UnknownField {
        /// Its path.
        field: String,
    },
    /// A kubelet flag given on the command line that has no effect here.
    NoEffectFlag {
        /// The flag's long name.
        flag: &'static str,
        /// Why.
        why: &'static str,
    },
    /// A field of the file that a flag given on the command line overrides.
    Overridden {
        /// The field's path.
        field: &'static str,
        /// The flag's long name.
        flag: &'static str,
    },
}

/// A flag value that comes from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The field's path.
    pub field: &'static str,
    /// The flag's long name.
    pub flag: &'static str,
    /// The value, as the flag takes it.
    pub value: String,
}

/// What a file asks for: flag values and notes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The implemented fields the file sets, as flag values.
    pub settings: Vec<Setting>,
    /// The fields without effect.
    pub notes: Vec<Note>,
}

/// Classifies every field of `file`.
///
/// # Errors
/// A field of the wrong type, with the kubelet's "failed to decode" wording.
pub fn plan(file: &ConfigFile) -> Result<Plan, ConfigError> {
    let mut plan = Plan::default();
    let fields = file
        .fields
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "apiVersion" | "kind"));
    walk(&mut plan, file, "", fields)?;
    Ok(plan)
}

fn find(table: &[Field], path: &str) -> Option<Field> {
    table.iter().copied().find(|f| f.path == path)
}

/// Whether the table has a field under `path` (an object to look into).
fn is_parent(path: &str) -> bool {
    let under = |p: &str| {
        p.strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('.'))
    };
    IMPLEMENTED.iter().map(|f| f.path).any(under) || FIXED.iter().map(|f| f.path).any(under)
}

fn walk<'a>(
    plan: &mut Plan,
    file: &ConfigFile,
    prefix: &str,
    fields: impl Iterator<Item = (&'a String, &'a Value)>,
) -> Result<(), ConfigError> {
    for (name, value) in fields {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let ignored = |why: &str| Note::IgnoredField {
            field: path.clone(),
            why: why.to_owned(),
        };
        if let Some(f) = find(IMPLEMENTED, &path) {
            let flag_value = flag_value(f.form, value, file.dir()).map_err(|e| ConfigError {
                path: file.path.clone(),
                reason: format!("failed to decode, error: {path}: {e}"),
            })?;
            if let Some(value) = flag_value {
                plan.settings.push(Setting {
                    field: f.path,
                    flag: f.flag,
                    value,
                });
            }
        } else if let Some(fixed) = FIXED.iter().find(|f| f.path == path) {
            if !is_zero(value) && !fixed.value.matches(value) {
                plan.notes
                    .push(ignored(&format!("has no effect: {}", fixed.does)));
            }
        } else if find(OWNED_ELSEWHERE, &path).is_some() {
            if !is_zero(value) {
                plan.notes.push(ignored("not implemented by rkubelet yet"));
            }
        } else if let (Value::Object(children), true) = (value, is_parent(&path)) {
            walk(plan, file, &path, children.iter())?;
        } else if KNOWN.contains(&path.as_str()) || is_parent(&path) {
            if !is_zero(value) {
                plan.notes.push(ignored("not implemented by rkubelet"));
            }
        } else {
            plan.notes.push(Note::UnknownField { field: path });
        }
    }
    Ok(())
}

/// Whether `value` is the zero value the kubelet's defaulting replaces.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => {
            s.is_empty() || crate::node::parse_go_duration(s) == Ok(Default::default())
        }
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Bool(_) => false,
    }
}

impl FixedValue {
    fn matches(self, value: &Value) -> bool {
        match self {
            Self::Bool(b) => value.as_bool() == Some(b),
            Self::Text(t) => value.as_str() == Some(t),
            Self::Int(i) => value.as_i64() == Some(i),
            Self::Duration(d) => {
                let parse = crate::node::parse_go_duration;
                value.as_str().map(parse).is_some_and(|v| v == parse(d))
            }
        }
    }
}

/// A scalar as a flag value.
fn scalar(value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("expected a string or a number, got {other}")),
    }
}

fn entries(value: &Value, separator: char) -> Result<String, String> {
    let Value::Object(map) = value else {
        return Err(format!("expected a map, got {value}"));
    };
    map_entries(map, separator)
}

fn map_entries(map: &Map<String, Value>, separator: char) -> Result<String, String> {
    let pairs = map
        .iter()
        .map(|(k, v)| scalar(v).map(|v| format!("{k}{separator}{v}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(pairs.join(","))
}

/// `value` of a field of `form` as its flag's value; `None` when unset.
fn flag_value(form: Form, value: &Value, dir: &Path) -> Result<Option<String>, String> {
    if value.is_null() {
        return Ok(None);
    }
    let text = || {
        value
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("expected a string, got {value}"))
    };
    let integer = || {
        value
            .as_i64()
            .ok_or_else(|| format!("expected an integer, got {value}"))
    };
    let set = |s: String| (!s.is_empty()).then_some(s);
    Ok(match form {
        Form::Text => set(text()?),
        Form::Path => set(text()?).map(|p| dir.join(p).display().to_string()),
        Form::Count => Some(integer()?).filter(|n| *n != 0).map(|n| n.to_string()),
        Form::Int => Some(integer()?.to_string()),
        Form::Bool => Some(
            value
                .as_bool()
                .ok_or_else(|| format!("expected true or false, got {value}"))?
                .to_string(),
        ),
        Form::Duration => {
            let d = text()?;
            (crate::node::parse_go_duration(&d) != Ok(Default::default())).then_some(d)
        }
        Form::List => {
            let Value::Array(items) = value else {
                return Err(format!("expected a list, got {value}"));
            };
            let items = items.iter().map(scalar).collect::<Result<Vec<_>, _>>()?;
            if let Some(bad) = items.iter().find(|i| i.contains(',')) {
                return Err(format!("a list item may not contain a comma: {bad:?}"));
            }
            set(items.join(","))
        }
        Form::Map => set(entries(value, '=')?),
        Form::Thresholds => Some(entries(value, '<')?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The form of `/var/lib/kubelet/config.yaml` that kubeadm v1.20 writes on a kind
    /// worker (kind's patches included): defaulted zero durations, kind's eviction
    /// thresholds, the static pod path and certificate rotation.
    pub(crate) const KIND_WORKER: &str = "\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: cgroupfs
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
cpuManagerReconcilePeriod: 0s
evictionHard:
  imagefs.available: 0%
  nodefs.available: 0%
  nodefs.inodesFree: 0%
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageGCHighThresholdPercent: 100
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
";

    fn plan_of(yaml: &str) -> Result<Plan, String> {
        let file = ConfigFile::decode(Path::new("/etc/kubelet/config.yaml"), yaml)
            .map_err(|e| e.to_string())?;
        plan(&file).map_err(|e| e.to_string())
    }

    fn settings(plan: &Plan) -> Vec<(&str, &str)> {
        plan.settings
            .iter()
            .map(|s| (s.flag, s.value.as_str()))
            .collect()
    }

    fn ignored(field: &str, why: &str) -> Note {
        Note::IgnoredField {
            field: field.into(),
            why: why.into(),
        }
    }

    #[test]
    fn the_kind_worker_file_sets_its_fields_and_names_what_is_ignored() {
        let plan = plan_of(KIND_WORKER).unwrap();
        assert_eq!(
            settings(&plan),
            [
                ("client-ca-file", "/etc/kubernetes/pki/ca.crt"),
                ("cgroup-driver", "cgroupfs"),
                ("cluster-dns", "10.96.0.10"),
                ("cluster-domain", "cluster.local"),
                (
                    "eviction-hard",
                    "imagefs.available<0%,nodefs.available<0%,nodefs.inodesFree<0%"
                ),
                ("healthz-bind-address", "127.0.0.1"),
                ("healthz-port", "10248"),
                ("image-gc-high-threshold", "100"),
                ("rotate-certificates", "true"),
                ("pod-manifest-path", "/etc/kubernetes/manifests"),
            ]
        );
        // Zero durations and `logging: {}` are the kubelet's defaults: not worth a word.
        assert!(plan.notes.is_empty(), "{:?}", plan.notes);
    }

    #[test]
    fn kinds_systemd_cgroups_become_flags() {
        // kind with the systemd driver: kubepods under kubelet.slice.
        let plan = plan_of(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cgroupDriver: systemd\ncgroupRoot: /kubelet\n",
        )
        .unwrap();
        assert_eq!(
            settings(&plan),
            [("cgroup-driver", "systemd"), ("cgroup-root", "/kubelet")]
        );
        assert!(plan.notes.is_empty(), "{:?}", plan.notes);
    }

    #[test]
    fn forms_become_flag_values() {
        let plan = plan_of(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             port: 0\nmaxPods: 12\nclusterDNS: [10.0.0.10, 10.0.0.11]\ncgroupsPerQOS: false\n\
             tlsCertFile: pki/kubelet.crt\nresolvConf: /run/resolv.conf\n\
             kubeReserved: {cpu: 100m, memory: 1Gi}\nsystemReserved: {}\n\
             evictionPressureTransitionPeriod: 30s\nruntimeRequestTimeout: 0s\nclusterDomain: ''\n",
        )
        .unwrap();
        assert_eq!(
            settings(&plan),
            [
                ("cgroups-per-qos", "false"),
                ("cluster-dns", "10.0.0.10,10.0.0.11"),
                ("eviction-pressure-transition-period", "30s"),
                ("kube-reserved", "cpu=100m,memory=1Gi"),
                ("max-pods", "12"),
                ("resolv-conf", "/run/resolv.conf"),
                ("tls-cert-file", "/etc/kubelet/pki/kubelet.crt"),
            ]
        );
        assert!(plan.notes.is_empty(), "{:?}", plan.notes);
    }

    #[test]
    fn fixed_behaviour_is_quiet_when_asked_for_and_noted_otherwise() {
        let plan = plan_of(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             authentication: {anonymous: {enabled: true}, webhook: {enabled: true, cacheTTL: 2m0s}}\n\
             authorization: {mode: AlwaysAllow, webhook: {cacheAuthorizedTTL: 300s}}\n\
             syncFrequency: 10s\nreadOnlyPort: 10255\nfailSwapOn: false\n",
        )
        .unwrap();
        assert_eq!(
            plan.notes,
            [
                ignored(
                    "authentication.anonymous.enabled",
                    "has no effect: anonymous requests are always refused"
                ),
                ignored(
                    "authorization.mode",
                    "has no effect: requests are always authorized with a SubjectAccessReview"
                ),
                ignored(
                    "readOnlyPort",
                    "has no effect: rkubelet serves no read-only port"
                ),
                ignored(
                    "syncFrequency",
                    "has no effect: pods are synced again every 1m"
                ),
            ]
        );
    }

    #[test]
    fn other_fields_are_ignored_or_unknown_never_refused() {
        let plan = plan_of(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cpuManagerPolicy: static\nfeatureGates: {}\nmaxPod: 3\n\
             authentication: {x509: {clientCAFile: ca.crt, extra: 1}}\n",
        )
        .unwrap();
        assert_eq!(
            plan.notes,
            [
                Note::UnknownField {
                    field: "authentication.x509.extra".into()
                },
                ignored("cpuManagerPolicy", "not implemented by rkubelet"),
                Note::UnknownField {
                    field: "maxPod".into()
                },
            ]
        );
        assert_eq!(settings(&plan), [("client-ca-file", "/etc/kubelet/ca.crt")]);
    }

    #[test]
    fn a_value_of_the_wrong_type_is_a_decode_error() {
        let err = plan_of(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: many\n",
        )
        .unwrap_err();
        assert_eq!(
            err,
            "failed to load Kubelet config file /etc/kubelet/config.yaml, error failed to \
             decode, error: maxPods: expected an integer, got \"many\""
        );
        let err = plan_of(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nclusterDNS: 10.0.0.1\n",
        )
        .unwrap_err();
        assert!(
            err.ends_with("clusterDNS: expected a list, got \"10.0.0.1\""),
            "{err}"
        );
    }

    #[test]
    fn every_field_is_classified_once() {
        let mut all: Vec<&str> = IMPLEMENTED
            .iter()
            .chain(OWNED_ELSEWHERE)
            .map(|f| f.path)
            .chain(FIXED.iter().map(|f| f.path))
            .chain(KNOWN.iter().copied())
            .collect();
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "a field is in two lists");
    }
}
