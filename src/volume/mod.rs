//! The volume manager: a pod's volumes on the host, set up before its containers are
//! created and torn down when it is gone (the kubelet's `volumemanager` and its in-tree
//! plugins, simplified).
//!
//! Layout, as the kubelet's: `<root_dir>/pods/<uid>/volumes/<plugin dir>/<volume name>`,
//! with plugin dirs `kubernetes.io~empty-dir`, `kubernetes.io~secret`,
//! `kubernetes.io~configmap`, `kubernetes.io~projected` and `kubernetes.io~downward-api`.
//! hostPath volumes are the host path itself.
//!
//! - emptyDir: a directory (mode 0777), or a tmpfs for `medium: Memory` (`sizeLimit` as
//!   its size).
//! - secret, downwardAPI, projected: a tmpfs, so secrets and tokens never reach the disk;
//!   configMap: a directory. Their files are written by the kubelet's atomic writer
//!   (`..<timestamp>` directory, `..data` symlink swapped by rename, user-visible names as
//!   symlinks into `..data`) with the items' modes (`defaultMode` 0644). A repeated
//!   [`VolumeManager::setup`] rewrites what changed and leaves the rest alone; the pod
//!   worker calls it on pod updates and within each sync period.
//! - projected service account tokens come from the TokenRequest API, bound to the pod, and
//!   are requested anew at 80 % of their lifetime (at most after 24 h).
//! - fsGroup: group ownership and setgid as the kubelet's `SetVolumeOwnership`.
//! - subPath and subPathExpr: resolved when a container is created
//!   ([`PodVolumes::container_mounts`]), made and bind-mounted without following symlinks
//!   out of the volume, under `<pod dir>/volume-subpaths/`.
//!
//! - persistentVolumeClaim: the claim followed to its PersistentVolume once Bound
//!   (`pvc.rs`, with the kubelet's texts while it is not), the volume's node affinity checked
//!   against the node's labels; `local` volumes bind-mounted at
//!   `kubernetes.io~local-volume/<pv name>` or, with volumeMode Block, linked from
//!   `<pod dir>/volumeDevices/kubernetes.io~local-volume/<pv name>` for the containers'
//!   `volumeDevices` (`local.rs`); `hostPath` volumes as the pod's own hostPath volumes.
//!   Teardown removes only their empty mount points, never what is in a volume.
//!   The stats read a local claim's figures with `statfs` of its mount and a CSI volume's
//!   with `NodeGetVolumeStats`, from the volumes last set up (`metrics.rs`, the stats'
//!   `PersistentVolumeMetrics`).
//!
//! Every other volume type (and a PersistentVolume of another source, CSI included) is
//! refused with [`VolumeError::Unsupported`].
//!
//! The two boundaries are traits: [`PodObjects`] (the API server, read through the node's
//! caches; [`KubePodObjects`]) and [`Mounter`] (tmpfs and bind mounts, the mount table;
//! [`LinuxMounter`]). File system work runs on blocking threads, never on the async runtime.
//!
//! Knows no runtime (`kuberuntime`), pod worker, prober or image.

mod atomic_writer;
pub mod csi;
mod downward_api;
mod error;
mod host_path;
mod local;
mod metrics;
pub(crate) mod mounter;
mod ownership;
mod payload;
pub mod pvc;
mod set_ups;
mod subpath;
mod teardown;
#[cfg(test)]
pub(crate) mod testing;
mod token;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EmptyDirVolumeSource, PersistentVolumeClaimVolumeSource, Pod,
    ProjectedVolumeSource, SecretVolumeSource, ServiceAccountTokenProjection, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use tracing::Instrument;

use crate::watch_manager::{KubePodObjects, PodObjects};
pub use error::{Result, VolumeError};
pub use metrics::MountedVolumeMetrics;
pub use mounter::{LinuxMounter, Mounter};
pub use set_ups::{Mounted, SetUps};

use crate::pod::state::ForgetPod;
use crate::watch_manager::CacheError;

use crate::resources::Quantity;
use error::FsError;
use ownership::FsGroup;
use payload::{FileProjection, KeyPayloadError, Payload};
use pvc::{PvSource, Usage};
use teardown::teardown_pod_dir;
use token::{DEFAULT_EXPIRATION_SECONDS, TokenKey, TokenManager};

/// The volume plugins, named by their directory under a pod's `volumes/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plugin {
    EmptyDir,
    Secret,
    ConfigMap,
    Projected,
    DownwardApi,
}

impl Plugin {
    fn dir(self) -> &'static str {
        match self {
            Self::EmptyDir => "kubernetes.io~empty-dir",
            Self::Secret => "kubernetes.io~secret",
            Self::ConfigMap => "kubernetes.io~configmap",
            Self::Projected => "kubernetes.io~projected",
            Self::DownwardApi => "kubernetes.io~downward-api",
        }
    }
}

/// A volume once set up: a mount for containers' volumeMounts, or a device for their
/// volumeDevices.
enum Claimed {
    Mount(HostMount),
    Device(PathBuf),
}

/// What serves a PersistentVolume on this node.
enum Backing {
    /// A hostPath PV: the path, with its `type`.
    HostPath(String, Option<String>),
    /// A local PV of volumeMode Filesystem: its directory.
    LocalDir(String),
    /// A local PV of volumeMode Block: its device.
    LocalDevice(String),
    /// A PV of a CSI driver: published through it.
    Csi,
}

/// The volume plugin of a pod's volume, as the kubelet names it in its metrics (a claim's
/// is its PersistentVolume's, known once the claim is followed).
fn plugin_name(volume: &Volume) -> &'static str {
    if volume.empty_dir.is_some() {
        "kubernetes.io/empty-dir"
    } else if volume.secret.is_some() {
        "kubernetes.io/secret"
    } else if volume.config_map.is_some() {
        "kubernetes.io/configmap"
    } else if volume.projected.is_some() {
        "kubernetes.io/projected"
    } else if volume.downward_api.is_some() {
        "kubernetes.io/downward-api"
    } else if volume.host_path.is_some() {
        "kubernetes.io/host-path"
    } else if volume.csi.is_some() {
        "kubernetes.io/csi"
    } else {
        "N/A"
    }
}

/// The names of the volumes the pod's containers (init, app and ephemeral) use in
/// volumeMounts and in volumeDevices (the kubelet's `GetPodVolumeNames`).
fn used_volume_names(
    pod: &Pod,
) -> (
    std::collections::BTreeSet<&str>,
    std::collections::BTreeSet<&str>,
) {
    let mut mounts = std::collections::BTreeSet::new();
    let mut devices = std::collections::BTreeSet::new();
    let Some(spec) = pod.spec.as_ref() else {
        return (mounts, devices);
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for c in containers {
        mounts.extend(c.volume_mounts.iter().flatten().map(|m| m.name.as_str()));
        devices.extend(c.volume_devices.iter().flatten().map(|d| d.name.as_str()));
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        mounts.extend(c.volume_mounts.iter().flatten().map(|m| m.name.as_str()));
        devices.extend(c.volume_devices.iter().flatten().map(|d| d.name.as_str()));
    }
    (mounts, devices)
}

/// Mode of the pod, `volumes` and plugin directories.
const POD_DIR_MODE: u32 = 0o750;
/// Mode of disk-backed volume directories (the kubelet's emptyDir `0777`).
const VOLUME_DIR_MODE: u32 = 0o777;

/// A host path to bind-mount into containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMount {
    /// The path on the host.
    pub host_path: PathBuf,
    /// Mount it read-only. Secret, configMap, downwardAPI and projected volumes always are,
    /// as with the kubelet; other volumes when the volumeMount says so.
    pub read_only: bool,
}

/// A pod's volumes once set up: where each one is on the host, and how a container's
/// volumeMounts (with their subpaths) reach them.
#[derive(Clone)]
pub struct PodVolumes {
    /// The pod, `namespace/name`, for errors.
    pod: String,
    /// `<root_dir>/pods/<uid>`: subpath bind mounts go under it.
    pod_dir: PathBuf,
    volumes: BTreeMap<String, HostMount>,
    /// Block volumes: the host path of each one's device (a link to the device node).
    devices: BTreeMap<String, PathBuf>,
    mounter: Arc<dyn Mounter>,
}

impl Default for PodVolumes {
    /// No volumes.
    fn default() -> Self {
        Self {
            pod: String::new(),
            pod_dir: PathBuf::new(),
            volumes: BTreeMap::new(),
            devices: BTreeMap::new(),
            mounter: Arc::new(LinuxMounter),
        }
    }
}

impl std::fmt::Debug for PodVolumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodVolumes")
            .field("pod", &self.pod)
            .field("volumes", &self.volumes)
            .field("devices", &self.devices)
            .finish_non_exhaustive()
    }
}

/// A container's volumeMount resolved to the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerMount {
    /// Where the container sees it.
    pub container_path: String,
    /// What is bind-mounted there: the volume, or the bind mount of its subpath.
    pub host_path: PathBuf,
    /// Mount it read-only.
    pub read_only: bool,
}

/// A container's volumeDevice resolved to the host (a CRI device, `mrw` as the kubelet's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDevice {
    /// Where the container sees the device node (`devicePath`).
    pub container_path: String,
    /// The host path of the device (the kubelet's pod device map path, a link to it).
    pub host_path: PathBuf,
}

impl PodVolumes {
    /// The container's volumeDevices (the kubelet's `makeBlockVolumes`).
    ///
    /// # Errors
    /// [`VolumeError::UnknownDevice`] for a device naming no block volume of the pod.
    pub fn container_devices(&self, container: &Container) -> Result<Vec<ContainerDevice>> {
        container
            .volume_devices
            .iter()
            .flatten()
            .map(|device| {
                let host_path =
                    self.devices
                        .get(&device.name)
                        .ok_or_else(|| VolumeError::UnknownDevice {
                            pod: self.pod.clone(),
                            volume: device.name.clone(),
                            container: container.name.clone(),
                        })?;
                Ok(ContainerDevice {
                    container_path: device.device_path.clone(),
                    host_path: host_path.clone(),
                })
            })
            .collect()
    }

    /// The host directory (or, for hostPath, file) of the volume named `volume_name`.
    #[must_use]
    pub fn host_path(&self, volume_name: &str) -> Option<&Path> {
        self.volumes.get(volume_name).map(|v| v.host_path.as_path())
    }

    /// The volume named `volume_name`, with whether it is read-only by nature.
    #[must_use]
    pub fn get(&self, volume_name: &str) -> Option<&HostMount> {
        self.volumes.get(volume_name)
    }

    /// The volumeMounts of `container`, resolved as the kubelet's `makeMounts` does when it
    /// creates the container: a `subPathExpr` is expanded from `env` (the container's
    /// environment); a subPath must be relative without `..`, is created when missing
    /// (with the volume's mode) without leaving the volume, and is bind-mounted, opened
    /// without following symlinks, under `<pod dir>/volume-subpaths/`.
    ///
    /// # Errors
    /// With the kubelet's texts (the container waits with `CreateContainerConfigError`):
    /// [`VolumeError::UnknownVolume`] or [`VolumeError::SubPath`].
    pub async fn container_mounts(
        &self,
        container: &Container,
        env: &HashMap<String, String>,
    ) -> Result<Vec<ContainerMount>> {
        let mut mounts = Vec::new();
        for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
            mounts.push(
                self.resolve_mount(&container.name, index, mount, env)
                    .await?,
            );
        }
        Ok(mounts)
    }

    async fn resolve_mount(
        &self,
        container: &str,
        index: usize,
        mount: &VolumeMount,
        env: &HashMap<String, String>,
    ) -> Result<ContainerMount> {
        let volume = self
            .volumes
            .get(&mount.name)
            .ok_or_else(|| VolumeError::UnknownVolume {
                pod: self.pod.clone(),
                volume: mount.name.clone(),
                container: container.to_owned(),
            })?;
        let resolved = |host_path| ContainerMount {
            container_path: mount.mount_path.clone(),
            host_path,
            read_only: volume.read_only || mount.read_only.unwrap_or(false),
        };
        let sub_path_error = |message: String| VolumeError::SubPath {
            pod: self.pod.clone(),
            volume: mount.name.clone(),
            container: container.to_owned(),
            message,
        };
        let sub_path = match mount.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
            Some(expr) => subpath::expand(expr, env).map_err(sub_path_error)?,
            None => mount.sub_path.clone().unwrap_or_default(),
        };
        if sub_path.is_empty() {
            return Ok(resolved(volume.host_path.clone()));
        }
        subpath::check(&sub_path).map_err(sub_path_error)?;
        let failed = |what: &str, why: &subpath::SubPathFailure| {
            // The details stay in the log: they describe the host's file system.
            tracing::warn!(volume = %mount.name, container, error = %why, "{what}");
            sub_path_error(format!(
                "{what} for volumeMount {:?} of container {container:?}",
                mount.name
            ))
        };
        let root = volume.host_path.clone();
        let made = {
            let (root, sub_path) = (root.clone(), sub_path.clone());
            blocking(move || {
                let mode = fs::metadata(&root)
                    .map(|m| m.permissions().mode() & 0o7777)
                    .map_err(FsError::at("inspecting", &root))?;
                subpath::safe_make_dir(&root, &sub_path, mode)
            })
            .await
        };
        made.map_err(|e| failed("failed to create subPath directory", &e))?;
        let (mounter, pod_dir) = (Arc::clone(&self.mounter), self.pod_dir.clone());
        let (volume_name, container_name) = (mount.name.clone(), container.to_owned());
        let bound = blocking(move || {
            let target = subpath::BindTarget {
                pod_dir: &pod_dir,
                volume: &volume_name,
                container: &container_name,
                mount_index: index,
            };
            subpath::bind_sub_path(&*mounter, &root, &sub_path, &target)
        })
        .await;
        let host_path = bound.map_err(|e| failed("failed to prepare subPath", &e))?;
        Ok(resolved(host_path))
    }
}

/// Sets up and tears down the volumes of the pods of this node. Share one per node
/// (behind an `Arc`): it caches service account tokens across pods.
pub struct VolumeManager<A = KubePodObjects, M = LinuxMounter> {
    root_dir: PathBuf,
    api: A,
    mounter: Arc<M>,
    allocatable: BTreeMap<String, ApiQuantity>,
    tokens: TokenManager,
    csi: Option<Arc<csi::CsiPlugin>>,
}

/// The service account tokens of a pod, cached across its volume set-ups.
impl<A: Send + Sync, M: Send + Sync> ForgetPod for VolumeManager<A, M> {
    fn name(&self) -> &'static str {
        "service account tokens"
    }

    fn holds(&self, uid: &str) -> bool {
        self.tokens.holds_pod(uid)
    }

    fn forget(&self, uid: &str) {
        self.tokens.forget_pod(uid);
    }
}

#[cfg(test)]
impl<A, M> VolumeManager<A, M> {
    /// Caches a token of pod `id` through `api`, as the set-up of a projected service
    /// account token does (for tests whose manager reaches no API).
    pub(crate) async fn request_token(&self, api: &impl PodObjects, id: &crate::pod::PodId) {
        let key = TokenKey {
            namespace: id.namespace.clone(),
            service_account: "default".into(),
            audience: None,
            expiration_seconds: DEFAULT_EXPIRATION_SECONDS,
            pod_name: id.name.clone(),
            pod_uid: id.uid.clone(),
        };
        self.tokens.token(api, &key).await.expect("a token");
    }
}

impl<A, M> std::fmt::Debug for VolumeManager<A, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManager")
            .field("root_dir", &self.root_dir)
            .finish_non_exhaustive()
    }
}

/// One pod as the volume manager uses it.
struct PodRef<'a> {
    pod: &'a Pod,
    /// `namespace/name`.
    key: String,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
}

impl<'a> PodRef<'a> {
    fn new(pod: &'a Pod) -> Result<Self> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let key = format!("{namespace}/{name}");
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        check_uid(uid).map_err(|reason| VolumeError::InvalidPod {
            pod: key.clone(),
            reason,
        })?;
        Ok(Self {
            pod,
            key,
            namespace,
            name,
            uid,
        })
    }

    fn invalid(&self, volume: &str, reason: impl Into<String>) -> VolumeError {
        VolumeError::InvalidSpec {
            pod: self.key.clone(),
            volume: volume.to_owned(),
            reason: reason.into(),
        }
    }

    /// The pod's `securityContext.fsGroup` with its change policy.
    fn fs_group(&self) -> Option<FsGroup> {
        let context = self.pod.spec.as_ref()?.security_context.as_ref()?;
        Some(FsGroup {
            gid: u32::try_from(context.fs_group?).ok()?,
            on_root_mismatch: context.fs_group_change_policy.as_deref() == Some("OnRootMismatch"),
        })
    }

    /// The service account the pod runs as (`default` when unset).
    fn service_account(&self) -> &'a str {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| {
                s.service_account_name
                    .as_deref()
                    .or(s.service_account.as_deref())
            })
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
    }
}

/// A pod UID must be usable as one path element.
fn check_uid(uid: &str) -> Result<(), &'static str> {
    if uid.is_empty() {
        Err("the pod has no UID")
    } else if matches!(uid, "." | "..") || uid.contains(['/', '\0']) {
        Err("the pod UID is not a plain path element")
    } else {
        Ok(())
    }
}

/// Where a directory volume's data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Medium {
    Disk,
    Memory { size_bytes: Option<u64> },
}

/// A directory volume to make, once everything it needs from the API is known.
struct DirVolume {
    plugin: Plugin,
    medium: Medium,
    /// The files to write (secret, configMap, downwardAPI, projected).
    payload: Option<Payload>,
    /// The pod's fsGroup, if any.
    fs_group: Option<FsGroup>,
}

impl DirVolume {
    /// Volumes the agent writes are read-only to containers.
    fn read_only(&self) -> bool {
        self.plugin != Plugin::EmptyDir
    }
}

/// Turns an API error reading `kind/name` for a volume into a [`VolumeError::Api`].
fn api_error<'a>(
    p: &'a PodRef<'_>,
    volume: &'a str,
    kind: &'static str,
    name: &'a str,
) -> impl FnOnce(CacheError) -> VolumeError + 'a {
    move |source| VolumeError::Api {
        pod: p.key.clone(),
        volume: volume.to_owned(),
        kind,
        name: name.to_owned(),
        source: Box::new(source),
    }
}

impl<A: PodObjects, M: Mounter> VolumeManager<A, M> {
    /// A manager keeping pod directories under `root_dir` (the kubelet's `--root-dir`).
    #[must_use]
    pub fn new(root_dir: impl Into<PathBuf>, api: A, mounter: M) -> Self {
        Self {
            root_dir: root_dir.into(),
            api,
            mounter: Arc::new(mounter),
            allocatable: BTreeMap::new(),
            tokens: TokenManager::default(),
            csi: None,
        }
    }

    /// Serves `csi:` volumes (and, for the claims, PVs with a `csi` source) through `csi`;
    /// without it they are refused as unsupported.
    #[must_use]
    pub fn with_csi(mut self, csi: Arc<csi::CsiPlugin>) -> Self {
        self.csi = Some(csi);
        self
    }

    /// The CSI plugin, when CSI volumes are served.
    #[must_use]
    pub fn csi(&self) -> Option<Arc<csi::CsiPlugin>> {
        self.csi.clone()
    }

    /// The node's allocatable resources (`Node.status.allocatable`): downward API volumes
    /// report them for `limits.cpu`, `limits.memory` and `limits.ephemeral-storage` of a
    /// container that sets no such limit, as the kubelet does. Without them, such a file is
    /// an error.
    #[must_use]
    pub fn with_node_allocatable(mut self, allocatable: BTreeMap<String, ApiQuantity>) -> Self {
        self.allocatable = allocatable;
        self
    }

    /// The API the manager reads secrets and configMaps through (image pull secrets
    /// are read through it too).
    pub fn api(&self) -> &A {
        &self.api
    }

    /// Reads the time for token refreshes from `clock` (Unix seconds).
    #[cfg(test)]
    fn with_token_clock(mut self, clock: token::Clock) -> Self {
        self.tokens = TokenManager::with_clock(clock);
        self
    }

    /// `<root_dir>/pods/<pod_uid>`: the pod's directory.
    #[must_use]
    pub fn pod_dir(&self, pod_uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(pod_uid)
    }

    fn volume_dir(&self, pod_uid: &str, plugin: Plugin, volume: &str) -> PathBuf {
        self.pod_dir(pod_uid)
            .join("volumes")
            .join(plugin.dir())
            .join(volume)
    }

    /// Sets up every volume of `pod` and tells where each one is on the host. Idempotent:
    /// a volume already set up is reused (its files rewritten if their source changed), so
    /// the worker may call it on every sync and after an agent restart.
    ///
    /// # Errors
    /// The first volume that cannot be set up: [`VolumeError::Unsupported`] for a volume
    /// type this node does not support, [`VolumeError::NotFound`] for a missing, non-optional
    /// secret or config map (retry with back-off), and others naming pod and volume.
    pub async fn setup(&self, pod: &Pod) -> Result<PodVolumes> {
        let p = PodRef::new(pod)?;
        let span = tracing::info_span!("volumes_setup", pod = %p.key, pod_uid = %p.uid);
        async {
            let mut volumes = BTreeMap::new();
            let mut devices = BTreeMap::new();
            let (mounts_used, devices_used) = used_volume_names(pod);
            // The volume manager's world, as its metrics count it: the plugins of the
            // volumes wanted (desired) and of those set up (actual).
            let (mut desired, mut actual) = (Vec::new(), Vec::new());
            for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
                let started = std::time::Instant::now();
                let mut plugin = plugin_name(volume);
                let set_up = match &volume.persistent_volume_claim {
                    // As the kubelet's populator: a claim no container uses is not followed.
                    Some(_)
                        if !mounts_used.contains(volume.name.as_str())
                            && !devices_used.contains(volume.name.as_str()) =>
                    {
                        tracing::debug!(volume = %volume.name, "skipping an unused claim");
                        continue;
                    }
                    Some(source) => {
                        let usage = if devices_used.contains(volume.name.as_str()) {
                            Usage::Devices
                        } else {
                            Usage::Mounts
                        };
                        self.setup_claim(&p, &volume.name, source, usage, &mut plugin)
                            .await
                    }
                    None => self.setup_volume(&p, volume).await.map(Claimed::Mount),
                };
                desired.push(plugin);
                crate::metrics::global().observe_storage_operation(
                    plugin,
                    "volume_mount",
                    started.elapsed(),
                    set_up.is_err(),
                );
                if set_up.is_ok() {
                    actual.push(plugin);
                }
                crate::metrics::global()
                    .volumes
                    .set_pod(p.uid, desired.clone(), actual.clone());
                let set_up = set_up.map_err(|mut e| {
                    if let VolumeError::Claim {
                        unmounted,
                        unattached,
                        ..
                    } = &mut e
                    {
                        let used = mounts_used.union(&devices_used);
                        *unattached = used.clone().map(|v| (*v).to_owned()).collect();
                        *unmounted = used
                            .filter(|v| !volumes.contains_key(**v) && !devices.contains_key(**v))
                            .map(|v| (*v).to_owned())
                            .collect();
                    }
                    e
                })?;
                match set_up {
                    Claimed::Mount(mount) => {
                        tracing::debug!(volume = %volume.name, path = %mount.host_path.display(), "volume set up");
                        volumes.insert(volume.name.clone(), mount);
                    }
                    Claimed::Device(path) => {
                        tracing::debug!(volume = %volume.name, path = %path.display(), "block volume mapped");
                        devices.insert(volume.name.clone(), path);
                    }
                }
            }
            Ok(PodVolumes {
                pod: p.key.clone(),
                pod_dir: self.pod_dir(p.uid),
                volumes,
                devices,
                mounter: Arc::clone(&self.mounter) as Arc<dyn Mounter>,
            })
        }
        .instrument(span)
        .await
    }

    async fn setup_volume(&self, p: &PodRef<'_>, volume: &Volume) -> Result<HostMount> {
        let name = volume.name.as_str();
        if check_uid(name).is_err() || name.starts_with("..") {
            return Err(p.invalid(name, "the volume name is not a plain path element"));
        }
        if let Some(source) = &volume.host_path {
            return self
                .setup_host_path(p, name, &source.path, source.type_.clone())
                .await;
        }
        if let (Some(source), Some(csi)) = (&volume.csi, &self.csi) {
            let host_path = csi
                .set_up_inline(p.pod, name, source, p.fs_group())
                .await
                .map_err(|e| VolumeError::Csi {
                    pod: p.key.clone(),
                    volume: name.to_owned(),
                    source: Box::new(e),
                })?;
            return Ok(HostMount {
                host_path,
                read_only: source.read_only.unwrap_or(false),
            });
        }
        let mut plan = if let Some(source) = &volume.empty_dir {
            empty_dir(p, name, source)?
        } else if let Some(source) = &volume.secret {
            self.secret_volume(p, name, source).await?
        } else if let Some(source) = &volume.config_map {
            self.config_map_volume(p, name, source).await?
        } else if let Some(source) = &volume.downward_api {
            let mode =
                payload::default_mode(source.default_mode).map_err(|e| p.invalid(name, e))?;
            let items = source.items.as_deref().unwrap_or_default();
            let files = downward_api::render(p.pod, items, mode, &self.allocatable)
                .map_err(|e| p.invalid(name, e))?;
            DirVolume {
                plugin: Plugin::DownwardApi,
                medium: Medium::Memory { size_bytes: None },
                payload: Some(files),
                fs_group: None,
            }
        } else if let Some(source) = &volume.projected {
            self.projected_volume(p, name, source).await?
        } else {
            return Err(VolumeError::Unsupported {
                pod: p.key.clone(),
                volume: name.to_owned(),
                kind: volume_kind(volume),
            });
        };
        plan.fs_group = p.fs_group();
        if plan.fs_group.is_some()
            && let Some(files) = &mut plan.payload
        {
            // Written with the group's bits at once, so that an unchanged payload compares
            // equal to what is on disk once the ownership is set.
            let mask = ownership::file_mask(true);
            files.values_mut().for_each(|f| f.mode |= mask);
        }
        let dir = self.volume_dir(p.uid, plan.plugin, name);
        let read_only = plan.read_only();
        let mounter = Arc::clone(&self.mounter);
        let host_path = blocking(move || make_dir_volume(&*mounter, &dir, &plan).map(|()| dir))
            .await
            .map_err(|e| VolumeError::Io {
                pod: p.key.clone(),
                volume: name.to_owned(),
                action: e.action,
                path: e.path,
                source: e.source,
            })?;
        Ok(HostMount {
            host_path,
            read_only,
        })
    }

    /// A `persistentVolumeClaim` volume: the claim followed to its volume, the volume's
    /// node affinity checked, then the plugin of its source. This is the dispatch point of
    /// PersistentVolume sources (a `csi` one goes to a CSI mounter once there is one).
    async fn setup_claim(
        &self,
        p: &PodRef<'_>,
        name: &str,
        source: &PersistentVolumeClaimVolumeSource,
        usage: Usage,
        plugin_out: &mut &'static str,
    ) -> Result<Claimed> {
        let bound = pvc::resolve(&self.api, p.namespace, name, source, usage)
            .await
            .map_err(|source| VolumeError::Claim {
                pod: p.key.clone(),
                volume: name.to_owned(),
                unmounted: Vec::new(),
                unattached: Vec::new(),
                source: Box::new(source),
            })?;
        let pv_name = bound.name().to_owned();
        if check_uid(&pv_name).is_err() || pv_name.starts_with("..") {
            return Err(p.invalid(
                name,
                format!("PersistentVolume name {pv_name:?} is not a plain path element"),
            ));
        }
        let plugin = PvSource::of(&bound.pv);
        *plugin_out = plugin.metrics_name();
        let unsupported = |kind: String| VolumeError::Unsupported {
            pod: p.key.clone(),
            volume: name.to_owned(),
            kind,
        };
        let unique_name = pvc::unique_volume_name(&plugin, &pv_name, p.uid);
        let backing = match plugin {
            PvSource::Local { path } if bound.block => Backing::LocalDevice(path),
            PvSource::Local { path } => Backing::LocalDir(path),
            PvSource::HostPath { path, type_ } if !bound.block => Backing::HostPath(path, type_),
            PvSource::HostPath { .. } => {
                return Err(unsupported(
                    "hostPath PersistentVolume with volumeMode Block".into(),
                ));
            }
            PvSource::Csi { .. } if self.csi.is_some() && !bound.block => Backing::Csi,
            // Without the CSI plugin, and raw block CSI volumes: refused.
            PvSource::Csi { driver } => {
                return Err(unsupported(format!(
                    "csi (PersistentVolume {pv_name}, driver {driver})"
                )));
            }
            PvSource::Other(kind) => {
                return Err(unsupported(format!("{kind} (PersistentVolume {pv_name})")));
            }
        };
        let operation = if bound.block {
            "MapVolume"
        } else {
            "MountVolume"
        };
        let affinity_error = |reason: String| VolumeError::NodeAffinity {
            pod: p.key.clone(),
            pv: pv_name.clone(),
            operation,
            reason,
        };
        let labels = self
            .api
            .node_labels()
            .ok_or_else(|| affinity_error("error retrieving node: node not found".into()))?;
        pvc::check_node_affinity(&bound.pv, &labels).map_err(|r| affinity_error(r.into()))?;
        let span =
            tracing::info_span!("persistent_volume", volume = %name, unique_name = %unique_name);
        let io_error = |e: FsError| VolumeError::Io {
            pod: p.key.clone(),
            volume: pv_name.clone(),
            action: e.action,
            path: e.path,
            source: e.source,
        };
        match backing {
            Backing::Csi => {
                let csi = self.csi.as_ref().ok_or_else(|| unsupported("csi".into()))?;
                let host_path = csi
                    .set_up_persistent(p.pod, &bound.pv, bound.read_only, p.fs_group())
                    .instrument(span)
                    .await
                    .map_err(|e| VolumeError::Csi {
                        pod: p.key.clone(),
                        volume: name.to_owned(),
                        source: Box::new(e),
                    })?;
                Ok(Claimed::Mount(HostMount {
                    host_path,
                    read_only: bound.read_only,
                }))
            }
            Backing::HostPath(path, type_) => {
                let mount = self
                    .setup_host_path(p, &pv_name, &path, type_)
                    .instrument(span)
                    .await?;
                Ok(Claimed::Mount(HostMount {
                    read_only: bound.read_only,
                    ..mount
                }))
            }
            Backing::LocalDevice(path) => {
                let link = self
                    .pod_dir(p.uid)
                    .join(local::DEVICES_DIR)
                    .join(local::PLUGIN_DIR)
                    .join(&pv_name);
                let made = link.clone();
                blocking(move || local::map_device(Path::new(&path), &made))
                    .instrument(span)
                    .await
                    .map_err(io_error)?;
                Ok(Claimed::Device(link))
            }
            Backing::LocalDir(path) => {
                let dir = self
                    .pod_dir(p.uid)
                    .join("volumes")
                    .join(local::PLUGIN_DIR)
                    .join(&pv_name);
                let (mounter, target) = (Arc::clone(&self.mounter), dir.clone());
                let (read_only, fs_group) = (bound.read_only, p.fs_group());
                blocking(move || {
                    let fresh = local::mount_dir(&*mounter, Path::new(&path), &target, read_only)?;
                    // As the kubelet's local plugin: ownership on a new, writable mount.
                    match fs_group {
                        Some(group) if fresh && !read_only => {
                            ownership::set_volume_ownership(&target, group, false)
                        }
                        _ => Ok(()),
                    }
                })
                .instrument(span)
                .await
                .map_err(io_error)?;
                Ok(Claimed::Mount(HostMount {
                    host_path: dir,
                    read_only,
                }))
            }
        }
    }

    async fn setup_host_path(
        &self,
        p: &PodRef<'_>,
        name: &str,
        path: &str,
        kind: Option<String>,
    ) -> Result<HostMount> {
        let host_path = PathBuf::from(path);
        if !host_path.is_absolute() {
            return Err(p.invalid(name, format!("hostPath {path:?} is not absolute")));
        }
        let checked = host_path.clone();
        let expected = kind.clone().unwrap_or_default();
        let outcome =
            blocking(move || Ok::<_, FsError>(host_path::check_type(&checked, kind.as_deref())))
                .await
                .map_err(|e| VolumeError::Io {
                    pod: p.key.clone(),
                    volume: name.to_owned(),
                    action: e.action,
                    path: e.path,
                    source: e.source,
                })?;
        outcome.map_err(|e| match e {
            host_path::TypeError::UnknownType => {
                p.invalid(name, format!("{expected} is an invalid volume type"))
            }
            host_path::TypeError::Create(action, source) => VolumeError::Io {
                pod: p.key.clone(),
                volume: name.to_owned(),
                action,
                path: host_path.clone(),
                source,
            },
            host_path::TypeError::Mismatch(reason) => VolumeError::HostPathType {
                pod: p.key.clone(),
                volume: name.to_owned(),
                path: host_path.clone(),
                expected,
                reason,
            },
        })?;
        Ok(HostMount {
            host_path,
            read_only: false,
        })
    }

    async fn secret_volume(
        &self,
        p: &PodRef<'_>,
        volume: &str,
        source: &SecretVolumeSource,
    ) -> Result<DirVolume> {
        let name = source
            .secret_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| p.invalid(volume, "secret volume without secretName"))?;
        let mode = payload::default_mode(source.default_mode).map_err(|e| p.invalid(volume, e))?;
        let files = self
            .secret_files(
                p,
                volume,
                name,
                source.items.as_deref().unwrap_or_default(),
                mode,
                source.optional.unwrap_or(false),
            )
            .await?;
        Ok(DirVolume {
            plugin: Plugin::Secret,
            medium: Medium::Memory { size_bytes: None },
            payload: Some(files),
            fs_group: None,
        })
    }

    async fn config_map_volume(
        &self,
        p: &PodRef<'_>,
        volume: &str,
        source: &ConfigMapVolumeSource,
    ) -> Result<DirVolume> {
        let mode = payload::default_mode(source.default_mode).map_err(|e| p.invalid(volume, e))?;
        let files = self
            .config_map_files(
                p,
                volume,
                &source.name,
                source.items.as_deref().unwrap_or_default(),
                mode,
                source.optional.unwrap_or(false),
            )
            .await?;
        Ok(DirVolume {
            plugin: Plugin::ConfigMap,
            medium: Medium::Disk,
            payload: Some(files),
            fs_group: None,
        })
    }

    async fn projected_volume(
        &self,
        p: &PodRef<'_>,
        volume: &str,
        source: &ProjectedVolumeSource,
    ) -> Result<DirVolume> {
        let mode = payload::default_mode(source.default_mode).map_err(|e| p.invalid(volume, e))?;
        let mut files = Payload::new();
        for projection in source.sources.iter().flatten() {
            // Later sources win on a path clash, as in the kubelet.
            if let Some(s) = &projection.secret {
                let items = s.items.as_deref().unwrap_or_default();
                let optional = s.optional.unwrap_or(false);
                files.extend(
                    self.secret_files(p, volume, &s.name, items, mode, optional)
                        .await?,
                );
            } else if let Some(c) = &projection.config_map {
                let items = c.items.as_deref().unwrap_or_default();
                let optional = c.optional.unwrap_or(false);
                files.extend(
                    self.config_map_files(p, volume, &c.name, items, mode, optional)
                        .await?,
                );
            } else if let Some(d) = &projection.downward_api {
                let items = d.items.as_deref().unwrap_or_default();
                files.extend(
                    downward_api::render(p.pod, items, mode, &self.allocatable)
                        .map_err(|e| p.invalid(volume, e))?,
                );
            } else if let Some(t) = &projection.service_account_token {
                let (path, file) = self.token_file(p, volume, t, mode).await?;
                files.insert(path, file);
            } else {
                let kind = if projection.cluster_trust_bundle.is_some() {
                    "projected clusterTrustBundle"
                } else {
                    "projected source of an unknown kind"
                };
                return Err(VolumeError::Unsupported {
                    pod: p.key.clone(),
                    volume: volume.to_owned(),
                    kind: kind.into(),
                });
            }
        }
        Ok(DirVolume {
            plugin: Plugin::Projected,
            medium: Medium::Memory { size_bytes: None },
            payload: Some(files),
            fs_group: None,
        })
    }

    async fn token_file(
        &self,
        p: &PodRef<'_>,
        volume: &str,
        projection: &ServiceAccountTokenProjection,
        mode: u32,
    ) -> Result<(String, FileProjection)> {
        payload::validate_path(&projection.path).map_err(|e| p.invalid(volume, e))?;
        let key = TokenKey {
            namespace: p.namespace.to_owned(),
            service_account: p.service_account().to_owned(),
            audience: projection.audience.clone().filter(|a| !a.is_empty()),
            expiration_seconds: projection
                .expiration_seconds
                .unwrap_or(DEFAULT_EXPIRATION_SECONDS),
            pod_name: p.name.to_owned(),
            pod_uid: p.uid.to_owned(),
        };
        let token = self.tokens.token(&self.api, &key).await.map_err(|source| {
            VolumeError::TokenRequest {
                pod: p.key.clone(),
                volume: volume.to_owned(),
                service_account: key.service_account.clone(),
                source: Box::new(source),
            }
        })?;
        Ok((
            projection.path.clone(),
            FileProjection {
                data: token.into_bytes(),
                mode,
            },
        ))
    }

    async fn secret_files(
        &self,
        p: &PodRef<'_>,
        volume: &str,
        name: &str,
        items: &[k8s_openapi::api::core::v1::KeyToPath],
        mode: u32,
        optional: bool,
    ) -> Result<Payload> {
        const KIND: &str = "secret";
        let secret = self
            .api
            .get_secret(p.namespace, name)
            .await
            .map_err(api_error(p, volume, KIND, name))?;
        let Some(secret) = secret else {
            return missing(p, volume, KIND, name, optional);
        };
        let data = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_slice()))
            .collect();
        key_files(p, volume, KIND, name, &data, items, mode, optional)
    }

    async fn config_map_files(
        &self,
        p: &PodRef<'_>,
        volume: &str,
        name: &str,
        items: &[k8s_openapi::api::core::v1::KeyToPath],
        mode: u32,
        optional: bool,
    ) -> Result<Payload> {
        const KIND: &str = "configmap";
        let config_map = self
            .api
            .get_config_map(p.namespace, name)
            .await
            .map_err(api_error(p, volume, KIND, name))?;
        let Some(config_map) = config_map else {
            return missing(p, volume, KIND, name, optional);
        };
        let text = config_map
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_bytes()));
        let binary = config_map
            .binary_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_slice()));
        let data = text.chain(binary).collect();
        key_files(p, volume, KIND, name, &data, items, mode, optional)
    }

    /// Unmounts every mount under the pod's directory (also those an earlier agent run left),
    /// then removes its `volumes` directory, and the pod directory when nothing else is in
    /// it. Nothing is removed while anything under the pod directory is still mounted, and
    /// removal never crosses into another file system. Safe to call again.
    ///
    /// # Errors
    /// [`VolumeError::Teardown`] naming the step; the worker retries.
    pub async fn teardown(&self, pod_uid: &str) -> Result<()> {
        let started = std::time::Instant::now();
        let result = self.teardown_dir(pod_uid, false).await;
        let metrics = crate::metrics::global();
        // One teardown of the pod's volumes, counted for each plugin it held.
        let held = metrics.volumes.plugins_of(pod_uid);
        for plugin in held {
            metrics.observe_storage_operation(
                plugin,
                "volume_unmount",
                started.elapsed(),
                result.is_err(),
            );
        }
        if result.is_ok() {
            metrics.volumes.forget_pod(pod_uid);
        }
        result
    }

    /// Tears down, like [`teardown`](Self::teardown), every pod directory under
    /// `<root_dir>/pods/` whose UID is not in `known_uids`, and removes the whole pod
    /// directory. Call it once the pods of this node are known (after the first full list),
    /// with the UIDs of all pods the agent still has. Returns the UIDs cleaned up.
    ///
    /// # Errors
    /// [`VolumeError::ReadPodsDir`], or the first pod whose teardown failed (the others are
    /// still attempted, and logged).
    pub async fn cleanup_orphans(&self, known_uids: &HashSet<String>) -> Result<Vec<String>> {
        let pods_dir = self.root_dir.join("pods");
        let read_error = |source| VolumeError::ReadPodsDir {
            path: pods_dir.clone(),
            source,
        };
        let mut entries = match tokio::fs::read_dir(&pods_dir).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(read_error(e)),
        };
        let mut orphans = Vec::new();
        while let Some(entry) = entries.next_entry().await.map_err(read_error)? {
            let is_dir = entry.file_type().await.map_err(read_error)?.is_dir();
            match entry.file_name().into_string() {
                Ok(uid) if is_dir && check_uid(&uid).is_ok() && !known_uids.contains(&uid) => {
                    orphans.push(uid);
                }
                _ => {}
            }
        }
        let mut removed = Vec::new();
        let mut first_error = None;
        for uid in orphans {
            match self.teardown_dir(&uid, true).await {
                Ok(()) => removed.push(uid),
                Err(e) => {
                    tracing::warn!(pod_uid = %uid, error = %e, "cleaning up an orphaned pod directory");
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(removed), Err)
    }

    async fn teardown_dir(&self, pod_uid: &str, whole: bool) -> Result<()> {
        check_uid(pod_uid).map_err(|reason| VolumeError::InvalidPod {
            pod: pod_uid.to_owned(),
            reason,
        })?;
        if let Some(csi) = &self.csi {
            // Through the drivers first: the generic unmount below would leave them
            // believing the volume published.
            csi.tear_down_pod(pod_uid)
                .await
                .map_err(|e| VolumeError::CsiTeardown {
                    pod_uid: pod_uid.to_owned(),
                    source: Box::new(e),
                })?;
        }
        let pod_dir = self.pod_dir(pod_uid);
        let mounter = Arc::clone(&self.mounter);
        let span = tracing::info_span!("volumes_teardown", pod_uid = %pod_uid);
        blocking(move || teardown_pod_dir(&*mounter, &pod_dir, whole))
            .instrument(span)
            .await
            .map_err(|e| VolumeError::Teardown {
                pod_uid: pod_uid.to_owned(),
                action: e.action,
                path: e.path,
                source: e.source,
            })
    }
}

fn missing(
    p: &PodRef<'_>,
    volume: &str,
    kind: &'static str,
    name: &str,
    optional: bool,
) -> Result<Payload> {
    if optional {
        return Ok(Payload::new());
    }
    Err(VolumeError::NotFound {
        pod: p.key.clone(),
        volume: volume.to_owned(),
        kind,
        name: name.to_owned(),
    })
}

#[allow(clippy::too_many_arguments)]
fn key_files(
    p: &PodRef<'_>,
    volume: &str,
    kind: &'static str,
    name: &str,
    data: &BTreeMap<&str, &[u8]>,
    items: &[k8s_openapi::api::core::v1::KeyToPath],
    mode: u32,
    optional: bool,
) -> Result<Payload> {
    payload::key_payload(data, items, mode, optional).map_err(|e| match e {
        KeyPayloadError::MissingKey(key) => VolumeError::MissingKey {
            pod: p.key.clone(),
            volume: volume.to_owned(),
            kind,
            name: name.to_owned(),
            key,
        },
        KeyPayloadError::Invalid(reason) => p.invalid(volume, format!("{kind} {name:?}: {reason}")),
    })
}

fn empty_dir(p: &PodRef<'_>, volume: &str, source: &EmptyDirVolumeSource) -> Result<DirVolume> {
    let medium = match source.medium.as_deref().unwrap_or_default() {
        "" => Medium::Disk,
        "Memory" => {
            let size_bytes = source
                .size_limit
                .as_ref()
                .map(|q| Quantity::parse(&q.0).map(Quantity::value))
                .transpose()
                .map_err(|e| p.invalid(volume, format!("sizeLimit: {e}")))?
                // A zero limit means none: tmpfs reads size=0 as unlimited anyway.
                .filter(|size| *size > 0)
                .map(|size| u64::try_from(size).unwrap_or(u64::MAX));
            Medium::Memory { size_bytes }
        }
        other => {
            return Err(VolumeError::Unsupported {
                pod: p.key.clone(),
                volume: volume.to_owned(),
                kind: format!("emptyDir with medium {other:?}"),
            });
        }
    };
    Ok(DirVolume {
        plugin: Plugin::EmptyDir,
        medium,
        payload: None,
        fs_group: None,
    })
}

/// The API's name of a volume's source (`persistentVolumeClaim`, `csi`, ...): the key of
/// its JSON form that is not `name`. Also names sources newer than this client's types do
/// not know only as `unknown`.
fn volume_kind(volume: &Volume) -> String {
    serde_json::to_value(volume)
        .ok()
        .and_then(|v| {
            v.as_object()?
                .keys()
                .find(|k| k.as_str() != "name")
                .cloned()
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Creates a directory volume: its directory, the tmpfs on it when memory-backed (unless
/// already mounted), and its files.
fn make_dir_volume<M: Mounter>(mounter: &M, dir: &Path, plan: &DirVolume) -> Result<(), FsError> {
    if let Some(parent) = dir.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(POD_DIR_MODE)
            .create(parent)
            .map_err(FsError::at("creating", parent))?;
    }
    let mut fresh = match fs::DirBuilder::new().mode(POD_DIR_MODE).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(FsError::at("creating", dir)(e));
        }
        created => created.is_ok(),
    };
    match plan.medium {
        Medium::Disk => {
            if fresh || plan.read_only() {
                fs::set_permissions(dir, fs::Permissions::from_mode(VOLUME_DIR_MODE))
                    .map_err(FsError::at("setting the mode of", dir))?;
            }
        }
        Medium::Memory { size_bytes } => {
            let canonical = fs::canonicalize(dir).map_err(FsError::at("resolving", dir))?;
            let mounted = mounter
                .is_mount_point(&canonical)
                .map_err(FsError::at("looking for a mount on", dir))?;
            if !mounted {
                mounter
                    .mount_tmpfs(dir, size_bytes)
                    .map_err(FsError::at("mounting tmpfs on", dir))?;
                fresh = true;
                tracing::debug!(path = %dir.display(), ?size_bytes, "mounted tmpfs");
            }
        }
    }
    if let Some(files) = &plan.payload
        && atomic_writer::write(dir, files)?
    {
        tracing::debug!(path = %dir.display(), files = files.len(), "wrote volume files");
    }
    // As the kubelet's plugins: an emptyDir gets its ownership when it is made, the
    // volumes the agent writes on every set-up, whatever the change policy (so that the
    // files of an update are owned too, while the root already matches).
    if let Some(group) = plan.fs_group {
        if plan.payload.is_some() {
            let always = FsGroup {
                on_root_mismatch: false,
                ..group
            };
            ownership::set_volume_ownership(dir, always, true)?;
        } else if fresh {
            ownership::set_volume_ownership(dir, group, plan.read_only())?;
        }
    }
    Ok(())
}

/// Runs file system work on a blocking thread.
async fn blocking<T, E>(work: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, E>
where
    T: Send + 'static,
    E: From<FsError> + Send + 'static,
{
    // Keep the caller's span (pod, pod_uid) on what the work logs.
    let span = tracing::Span::current();
    match tokio::task::spawn_blocking(move || span.in_scope(work)).await {
        Ok(outcome) => outcome,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(FsError::at("running file system work for", PathBuf::new())(
            io::Error::other(e),
        )
        .into()),
    }
}

#[cfg(test)]
mod tests;
