//! Local storage capacity isolation, the kubelet's `localStorageEviction` (feature
//! `LocalStorageCapacityIsolation`, on in v1.20): which pod is over which of its local
//! storage limits, and the eviction message. Pure: the usage comes from the stats provider
//! through the manager's [`super::StatsSource`].
//!
//! The checks run in the kubelet's order, the first one met deciding:
//! 1. an emptyDir volume (any medium) using more than its `sizeLimit`:
//!    `Usage of EmptyDir volume "<name>" exceeds the limit "<sizeLimit>". `;
//! 2. the pod's local ephemeral storage above the pod's limit — the sum of its containers'
//!    `limits.ephemeral-storage` (those that set one), at least any init container's, plus
//!    the overhead (`PodRequestsAndLimits`): the writable layers (unless the images have a
//!    filesystem of their own), the logs, the disk-backed emptyDir, configMap and
//!    downwardAPI volumes (`IsLocalEphemeralVolume`) and the managed `/etc/hosts` file:
//!    `Pod ephemeral local storage usage exceeds the total limit of containers <limit>. `;
//! 3. a container's writable layer (same condition) and logs above its own limit:
//!    `Container <name> exceeded its local ephemeral storage limit "<limit>". `.
//!
//! Quantities are printed in the API's canonical form, keeping the format of the
//! quantity they come from (binary `Mi`, or decimal `M`), as Go's `Quantity.String`.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::rank::{ContainerUsage, format_bytes};
use crate::resources::Quantity;

/// The resource the limits are of.
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// What a running pod holds on the node's local storage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodStorage {
    /// Its running containers: writable layer and logs.
    pub containers: Vec<ContainerUsage>,
    /// Bytes used by each volume the stats provider measures, by the volume's name.
    pub volumes: BTreeMap<String, u64>,
    /// The size of its managed hosts file, if it has one.
    pub etc_hosts_bytes: Option<u64>,
}

/// The local storage of the running pods, by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalStorage {
    /// Whether the runtime's images are on a filesystem of their own (the kubelet's
    /// `HasDedicatedImageFs`): the writable layers then do not count.
    pub dedicated_image_fs: bool,
    /// Each running pod's storage, by UID.
    pub pods: HashMap<String, PodStorage>,
}

/// Which limit a pod went over: the kubelet's eviction signals of local storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSignal {
    /// An emptyDir's `sizeLimit`.
    EmptyDirFs,
    /// The pod's total limit.
    EphemeralPodFs,
    /// A container's limit.
    EphemeralContainerFs,
}

impl LimitSignal {
    /// The kubelet's name of the signal (its `kubelet_evictions` label).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::EmptyDirFs => "emptydirfs.limit",
            Self::EphemeralPodFs => "ephemeralpodfs.limit",
            Self::EphemeralContainerFs => "ephemeralcontainerfs.limit",
        }
    }
}

/// A limit a pod went over, and the eviction message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// Which limit.
    pub signal: LimitSignal,
    /// The pod status's message and the event's.
    pub message: String,
}

/// An amount of bytes with the format of the quantity it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Amount {
    bytes: u64,
    binary: bool,
}

impl Amount {
    /// A quantity of the API: binary when written with a binary suffix.
    fn of(q: &ApiQuantity) -> Option<Self> {
        let value = Quantity::parse(&q.0).ok()?.value();
        Some(Self {
            bytes: u64::try_from(value).unwrap_or(u64::MAX),
            binary: q.0.trim_end().ends_with('i'),
        })
    }

    /// `Quantity.Add`: a zero amount takes the other's format.
    fn add(self, other: Self) -> Self {
        Self {
            bytes: self.bytes.saturating_add(other.bytes),
            binary: if self.bytes == 0 {
                other.binary
            } else {
                self.binary
            },
        }
    }
}

impl std::fmt::Display for Amount {
    /// `Quantity.String`: binary amounts of at least 1Ki with the largest whole binary
    /// suffix, the others in decimal (`10Mi`, `1536`, `20M`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.binary && self.bytes >= 1024 {
            f.write_str(&format_bytes(self.bytes))
        } else {
            f.write_str(&crate::node::decimal_quantity(self.bytes).0)
        }
    }
}

fn limit_of(container: &Container) -> Option<Amount> {
    let limits = container.resources.as_ref()?.limits.as_ref()?;
    Amount::of(limits.get(EPHEMERAL_STORAGE)?)
}

/// The pod's ephemeral-storage limit (`PodRequestsAndLimits`), if any of its containers
/// sets one: the app containers' sum, at least any init container's, plus the overhead
/// when not zero.
fn pod_limit(pod: &Pod) -> Option<Amount> {
    let spec = pod.spec.as_ref()?;
    let mut limit: Option<Amount> = None;
    for container in &spec.containers {
        if let Some(l) = limit_of(container) {
            limit = Some(limit.map_or(l, |sum| sum.add(l)));
        }
    }
    for init in spec.init_containers.iter().flatten() {
        if let Some(l) = limit_of(init)
            && limit.is_none_or(|sum| l.bytes > sum.bytes)
        {
            limit = Some(l);
        }
    }
    let overhead = spec
        .overhead
        .as_ref()
        .and_then(|o| o.get(EPHEMERAL_STORAGE))
        .and_then(Amount::of);
    match (limit, overhead) {
        (Some(l), Some(o)) if l.bytes > 0 => Some(l.add(o)),
        (l, _) => l,
    }
}

/// A volume on the node's local storage (`IsLocalEphemeralVolume`): a disk-backed
/// emptyDir, a configMap, downwardAPI or gitRepo volume.
fn is_local_ephemeral(volume: &Volume) -> bool {
    volume.git_repo.is_some()
        || volume.config_map.is_some()
        || volume.downward_api.is_some()
        || volume
            .empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref() != Some("Memory"))
}

/// What a container's usage counts: its logs, and its writable layer unless the images
/// have a filesystem of their own.
fn container_bytes(c: &ContainerUsage, dedicated_image_fs: bool) -> u64 {
    let layer = if dedicated_image_fs {
        0
    } else {
        c.rootfs_bytes.unwrap_or(0)
    };
    layer.saturating_add(c.logs_bytes.unwrap_or(0))
}

/// `emptyDirLimitEviction`: the first emptyDir (in the spec's order) using more than its
/// positive `sizeLimit`.
fn empty_dir_over(pod: &Pod, storage: &PodStorage) -> Option<Exceeded> {
    let spec = pod.spec.as_ref()?;
    spec.volumes.iter().flatten().find_map(|volume| {
        let size = Amount::of(volume.empty_dir.as_ref()?.size_limit.as_ref()?)?;
        let used = *storage.volumes.get(&volume.name)?;
        (size.bytes > 0 && used > size.bytes).then(|| Exceeded {
            signal: LimitSignal::EmptyDirFs,
            message: format!(
                "Usage of EmptyDir volume {:?} exceeds the limit \"{size}\". ",
                volume.name
            ),
        })
    })
}

/// `podEphemeralStorageLimitEviction`: the pod's local ephemeral storage above its limit.
fn pod_over(pod: &Pod, storage: &PodStorage, dedicated_image_fs: bool) -> Option<Exceeded> {
    let limit = pod_limit(pod)?;
    let containers = storage
        .containers
        .iter()
        .map(|c| container_bytes(c, dedicated_image_fs));
    let volumes = pod
        .spec
        .as_ref()?
        .volumes
        .iter()
        .flatten()
        .filter(|v| is_local_ephemeral(v))
        .filter_map(|v| storage.volumes.get(&v.name).copied());
    let used = containers
        .chain(volumes)
        .chain(storage.etc_hosts_bytes)
        .fold(0u64, u64::saturating_add);
    (used > limit.bytes).then(|| Exceeded {
        signal: LimitSignal::EphemeralPodFs,
        message: format!(
            "Pod ephemeral local storage usage exceeds the total limit of containers {limit}. "
        ),
    })
}

/// `containerEphemeralStorageLimitEviction`: the first running container above its own
/// non-zero limit.
fn container_over(pod: &Pod, storage: &PodStorage, dedicated_image_fs: bool) -> Option<Exceeded> {
    let spec = pod.spec.as_ref()?;
    storage.containers.iter().find_map(|usage| {
        let container = spec.containers.iter().find(|c| c.name == usage.name)?;
        let limit = limit_of(container).filter(|l| l.bytes > 0)?;
        (container_bytes(usage, dedicated_image_fs) > limit.bytes).then(|| Exceeded {
            signal: LimitSignal::EphemeralContainerFs,
            message: format!(
                "Container {} exceeded its local ephemeral storage limit \"{limit}\". ",
                usage.name
            ),
        })
    })
}

/// Whether `pod` sets a local storage limit: an ephemeral-storage limit on a container, or
/// an emptyDir `sizeLimit`. Only such pods can go over one.
#[must_use]
pub fn has_limits(pod: &Pod) -> bool {
    pod_limit(pod).is_some()
        || pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .any(|v| v.empty_dir.as_ref().is_some_and(|e| e.size_limit.is_some()))
}

/// The first local storage limit `pod` is over, in the kubelet's order (emptyDir size
/// limits, the pod's limit, then its containers').
#[must_use]
pub fn exceeded(pod: &Pod, storage: &PodStorage, dedicated_image_fs: bool) -> Option<Exceeded> {
    empty_dir_over(pod, storage)
        .or_else(|| pod_over(pod, storage, dedicated_image_fs))
        .or_else(|| container_over(pod, storage, dedicated_image_fs))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, ResourceRequirements};

    use super::*;

    const MIB: u64 = 1 << 20;

    fn with_limit(mut c: Container, limit: Option<&str>) -> Container {
        c.resources = Some(ResourceRequirements {
            limits: limit.map(|l| [(EPHEMERAL_STORAGE.to_owned(), ApiQuantity(l.into()))].into()),
            ..ResourceRequirements::default()
        });
        c
    }

    /// A pod whose containers are named and limited as given.
    fn pod(limits: &[(&str, Option<&str>)]) -> Pod {
        let names: Vec<(&str, &str)> = limits.iter().map(|(n, _)| (*n, "busybox")).collect();
        let mut p = crate::pod::testing::pod("p", &names);
        let spec = p.spec.as_mut().unwrap();
        for (c, (_, limit)) in spec.containers.iter_mut().zip(limits) {
            *c = with_limit(c.clone(), *limit);
        }
        p
    }

    fn empty_dir(name: &str, medium: Option<&str>, size: Option<&str>) -> Volume {
        Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: medium.map(Into::into),
                size_limit: size.map(|s| ApiQuantity(s.into())),
            }),
            ..Volume::default()
        }
    }

    fn usage(name: &str, rootfs: u64, logs: u64) -> ContainerUsage {
        ContainerUsage {
            name: name.into(),
            rootfs_bytes: Some(rootfs),
            logs_bytes: Some(logs),
            ..ContainerUsage::default()
        }
    }

    fn storage(containers: Vec<ContainerUsage>, volumes: &[(&str, u64)]) -> PodStorage {
        PodStorage {
            containers,
            volumes: volumes.iter().map(|(n, b)| ((*n).into(), *b)).collect(),
            etc_hosts_bytes: Some(200),
        }
    }

    #[test]
    fn one_container_over_its_limit_is_over_the_pods_limit_first() {
        let p = pod(&[("main", Some("10Mi"))]);
        let s = storage(vec![usage("main", 20 * MIB, 4096)], &[]);
        assert_eq!(
            exceeded(&p, &s, false),
            Some(Exceeded {
                signal: LimitSignal::EphemeralPodFs,
                message:
                    "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. "
                        .into(),
            })
        );
        // Within it: nothing.
        let s = storage(vec![usage("main", 9 * MIB, 4096)], &[]);
        assert_eq!(exceeded(&p, &s, false), None);
        assert!(has_limits(&p));
        assert!(!has_limits(&pod(&[("main", None)])));
    }

    #[test]
    fn a_container_over_its_own_limit_within_the_pods() {
        let p = pod(&[("a", Some("10Mi")), ("b", Some("100Mi"))]);
        let s = storage(vec![usage("a", 20 * MIB, 0), usage("b", 0, 0)], &[]);
        assert_eq!(
            exceeded(&p, &s, false),
            Some(Exceeded {
                signal: LimitSignal::EphemeralContainerFs,
                message: "Container a exceeded its local ephemeral storage limit \"10Mi\". ".into(),
            })
        );
        // With the images on their own filesystem, only the logs count.
        assert_eq!(exceeded(&p, &s, true), None);
        let logs = storage(vec![usage("a", 0, 11 * MIB), usage("b", 0, 0)], &[]);
        assert_eq!(
            exceeded(&p, &logs, true).map(|e| e.signal),
            Some(LimitSignal::EphemeralContainerFs)
        );
    }

    #[test]
    fn the_pods_limit_sums_the_limits_set_and_counts_every_container_and_local_volume() {
        // Only `a` sets a limit: the pod's is 10Mi, against all of the pod's usage (v1.20).
        let mut p = pod(&[("a", Some("10Mi")), ("b", None)]);
        let s = storage(vec![usage("a", MIB, 0), usage("b", 10 * MIB, 0)], &[]);
        assert_eq!(
            exceeded(&p, &s, false).map(|e| e.signal),
            Some(LimitSignal::EphemeralPodFs)
        );
        // Disk-backed emptyDirs count, memory-backed ones and secrets do not.
        let spec = p.spec.as_mut().unwrap();
        spec.containers[1] = with_limit(spec.containers[1].clone(), Some("10Mi"));
        spec.volumes = Some(vec![
            empty_dir("disk", None, None),
            empty_dir("ram", Some("Memory"), None),
            Volume {
                name: "secret".into(),
                secret: Some(Default::default()),
                ..Volume::default()
            },
        ]);
        let within = storage(
            vec![usage("a", MIB, 0)],
            &[("ram", 50 * MIB), ("secret", MIB)],
        );
        assert_eq!(exceeded(&p, &within, false), None);
        let over = storage(vec![usage("a", MIB, 0)], &[("disk", 19 * MIB)]);
        assert_eq!(
            exceeded(&p, &over, false).map(|e| e.message),
            Some(
                "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. "
                    .into()
            )
        );
    }

    #[test]
    fn the_pods_limit_takes_init_containers_overhead_and_the_first_format() {
        let mut p = pod(&[("a", Some("10M")), ("b", Some("10Mi"))]);
        assert_eq!(
            pod_limit(&p),
            Some(Amount {
                bytes: 10_000_000 + 10 * MIB,
                binary: false
            })
        );
        assert_eq!(pod_limit(&p).unwrap().to_string(), "20485760");
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![with_limit(spec.containers[0].clone(), Some("1Gi"))]);
        spec.overhead = Some([(EPHEMERAL_STORAGE.to_owned(), ApiQuantity("1Mi".into()))].into());
        assert_eq!(pod_limit(&p).unwrap().to_string(), "1025Mi");
        assert_eq!(pod_limit(&pod(&[("a", None)])), None);
        // A zero limit takes the next one's format.
        let zero_first = pod(&[("a", Some("0")), ("b", Some("2Mi"))]);
        assert_eq!(pod_limit(&zero_first).unwrap().to_string(), "2Mi");
    }

    #[test]
    fn an_empty_dir_over_its_size_limit_goes_first_whatever_its_medium() {
        let mut p = pod(&[("a", Some("1Mi"))]);
        p.spec.as_mut().unwrap().volumes = Some(vec![
            empty_dir("unlimited", None, None),
            empty_dir("cache", None, Some("10Mi")),
            empty_dir("shm", Some("Memory"), Some("1Mi")),
        ]);
        let s = storage(
            vec![usage("a", 20 * MIB, 0)],
            &[
                ("unlimited", 100 * MIB),
                ("cache", 11 * MIB),
                ("shm", 2 * MIB),
            ],
        );
        assert_eq!(
            exceeded(&p, &s, false),
            Some(Exceeded {
                signal: LimitSignal::EmptyDirFs,
                message: "Usage of EmptyDir volume \"cache\" exceeds the limit \"10Mi\". ".into(),
            })
        );
        let s = storage(vec![], &[("cache", 10 * MIB), ("shm", 2 * MIB)]);
        assert_eq!(
            exceeded(&p, &s, false).map(|e| e.message),
            Some("Usage of EmptyDir volume \"shm\" exceeds the limit \"1Mi\". ".into())
        );
        // Without stats of the volume, no decision on it.
        let s = storage(vec![], &[]);
        assert_eq!(exceeded(&p, &s, false), None);
        let mut only_volume = pod(&[("a", None)]);
        only_volume.spec.as_mut().unwrap().volumes = Some(vec![empty_dir("c", None, Some("1Mi"))]);
        assert!(has_limits(&only_volume));
    }

    #[test]
    fn amounts_print_as_go_prints_quantities() {
        let a = |text: &str| Amount::of(&ApiQuantity(text.into())).unwrap().to_string();
        assert_eq!(a("10Mi"), "10Mi");
        assert_eq!(a("1024Mi"), "1Gi");
        assert_eq!(a("1536Ki"), "1536Ki");
        assert_eq!(a("20M"), "20M");
        assert_eq!(a("20000000"), "20M");
        assert_eq!(a("10485760"), "10485760");
        assert_eq!(a("0"), "0");
    }
}
