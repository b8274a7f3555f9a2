//! The CSI volume plugin, node side (the kubelet's `pkg/volume/csi`), for drivers that need
//! no attach (`attachRequired: false`): drivers register through the plugin manager
//! ([`RegistrationHandler`]: `NodeGetInfo`, then the CSINode and the Node's annotation,
//! [`nodeinfo`]); a pod's volume is staged where the driver has `STAGE_UNSTAGE_VOLUME`
//! (persistent volumes only, at `plugins/kubernetes.io/csi/pv/<pv>/globalmount`) and
//! published at `pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`, with `vol_data.json`
//! beside it ([`paths`]). Inline volumes (`csi:` in the pod spec) need a CSIDriver that
//! lists the `Ephemeral` lifecycle mode; `podInfoOnMount` adds the pod's attributes.
//!
//! A target already mounted is not published again (after an agent restart the mount
//! table tells what is published), and its re-set-up at every pod sync asks nothing of
//! the API and writes nothing; a pod's volumes are unpublished (and unstaged when no
//! other pod uses them) only when it is torn down, from its `vol_data.json` files, and
//! only through the driver: without it registered, nothing is unmounted and the teardown
//! fails, to be retried. The set-up and tear-down of one volume (by the kubelet's unique
//! volume name, `kubernetes.io/csi/<driver>^<handle>`) run one at a time, as the
//! kubelet's operation executor runs them: a pod's set-up never publishes from a staging
//! mount that another pod's tear-down is unstaging. `NodeGetVolumeStats` answers
//! [`CsiPlugin::volume_stats`].
//!
//! Knows no pod worker, runtime or stats provider: the volume manager calls it.

#[allow(missing_docs, clippy::all, clippy::pedantic, unused_qualifications)]
/// Messages, clients and servers generated from the vendored CSI spec `csi.proto` (v1.2.0).
pub mod api {
    tonic::include_proto!("csi.v1");
}

mod client;
pub(super) mod error;
pub mod nodeinfo;
pub mod paths;
pub(crate) mod registration;
#[cfg(test)]
mod testing;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{CSIVolumeSource, PersistentVolume, Pod, Secret};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::Api;
use tracing::Instrument;

#[cfg(any(test, fuzzing))]
pub(crate) use client::capability_types;
pub use client::{Connector, GrpcConnector, NodeClient, Reply};
pub use error::CsiError;
pub use nodeinfo::{KubeNodeInfo, NodeInfoError, NodeInfoUpdater};
pub use registration::{Drivers, RegistrationHandler};

use super::mounter::Mounter;
use super::ownership::{self, FsGroup};
use api::node_service_capability::rpc::Type as Capability;
use api::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use paths::{EPHEMERAL, PERSISTENT, VolumeData};

/// The API objects the plugin reads: CSIDriver objects and the secrets volumes name.
pub trait CsiObjects: Send + Sync + 'static {
    /// The CSIDriver `name`; `None` when there is none.
    fn csi_driver<'a>(&'a self, name: &'a str) -> BoxFuture<'a, kube::Result<Option<CSIDriver>>>;
    /// The Secret `namespace/name`; `None` when there is none.
    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, kube::Result<Option<Secret>>>;
}

/// [`CsiObjects`] read from the API server.
#[derive(Clone)]
pub struct KubeCsiObjects(pub kube::Client);

impl CsiObjects for KubeCsiObjects {
    fn csi_driver<'a>(&'a self, name: &'a str) -> BoxFuture<'a, kube::Result<Option<CSIDriver>>> {
        Box::pin(async move { Api::<CSIDriver>::all(self.0.clone()).get_opt(name).await })
    }

    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, kube::Result<Option<Secret>>> {
        Box::pin(async move {
            Api::<Secret>::namespaced(self.0.clone(), namespace)
                .get_opt(name)
                .await
        })
    }
}

impl From<super::error::FsError> for CsiError {
    fn from(e: super::error::FsError) -> Self {
        Self::Io {
            action: e.action,
            path: e.path,
            source: e.source,
        }
    }
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CsiError {
    let path = path.to_path_buf();
    move |source| CsiError::Io {
        action,
        path,
        source,
    }
}

fn rpc_error(rpc: &'static str, volume: &str) -> impl FnOnce(tonic::Status) -> CsiError {
    let volume = volume.to_owned();
    move |status| CsiError::Rpc {
        rpc,
        volume,
        status,
    }
}

/// A volume's usage as the driver reports it (`NodeGetVolumeStats`); what the driver
/// leaves out is 0, as with the kubelet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeStats {
    /// Bytes in all.
    pub capacity_bytes: u64,
    /// Bytes free.
    pub available_bytes: u64,
    /// Bytes used.
    pub used_bytes: u64,
    /// Inodes in all.
    pub inodes: u64,
    /// Inodes free.
    pub inodes_free: u64,
    /// Inodes used.
    pub inodes_used: u64,
}

/// What a publish needs, from an inline source or a PV.
struct Publish {
    spec_name: String,
    driver: String,
    handle: String,
    mode: &'static str,
    read_only: bool,
    fs_type: String,
    attributes: HashMap<String, String>,
    publish_secret: Option<(String, String)>,
    stage_secret: Option<(String, String)>,
    access_mode: Mode,
    mount_flags: Vec<String>,
    /// The PV's access modes (for the fsGroup policy).
    access_modes: Vec<String>,
}

/// The CSI volume plugin.
pub struct CsiPlugin {
    root_dir: PathBuf,
    node_name: String,
    drivers: Drivers,
    connector: Arc<dyn Connector>,
    objects: Arc<dyn CsiObjects>,
    mounter: Arc<dyn Mounter>,
    /// Operations on one volume, one at a time, by unique volume name.
    operations: crate::lock::KeyedTurns<String>,
}

/// The kubelet's unique name of a CSI volume (`GetUniqueVolumeNameFromSpec`).
fn unique_volume_name(driver: &str, handle: &str) -> String {
    format!("{}/{driver}^{handle}", paths::PLUGIN_NAME)
}

impl CsiPlugin {
    /// The plugin of node `node_name` with volumes under `root_dir`, for the drivers in
    /// `drivers` (filled by the [`RegistrationHandler`]).
    #[must_use]
    pub fn new(
        root_dir: PathBuf,
        node_name: String,
        drivers: Drivers,
        connector: Arc<dyn Connector>,
        objects: Arc<dyn CsiObjects>,
        mounter: Arc<dyn Mounter>,
    ) -> Self {
        Self {
            root_dir,
            node_name,
            drivers,
            connector,
            objects,
            mounter,
            operations: crate::lock::KeyedTurns::default(),
        }
    }

    /// Publishes the inline volume `volume_name` of `pod`; the target path.
    pub(super) async fn set_up_inline(
        &self,
        pod: &Pod,
        volume_name: &str,
        source: &CSIVolumeSource,
        fs_group: Option<FsGroup>,
    ) -> Result<PathBuf, CsiError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let publish = Publish {
            spec_name: volume_name.to_owned(),
            driver: source.driver.clone(),
            handle: paths::ephemeral_volume_handle(&uid, volume_name),
            mode: EPHEMERAL,
            read_only: source.read_only.unwrap_or(false),
            fs_type: source.fs_type.clone().unwrap_or_default(),
            attributes: source
                .volume_attributes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            publish_secret: source
                .node_publish_secret_ref
                .as_ref()
                .map(|r| (namespace, r.name.clone())),
            stage_secret: None,
            access_mode: Mode::SingleNodeWriter,
            mount_flags: Vec::new(),
            access_modes: Vec::new(),
        };
        self.set_up(pod, publish, fs_group).await
    }

    /// Publishes (after staging, where the driver stages) the PersistentVolume `pv`, whose
    /// source is `csi`, for `pod`; the target path. `read_only` from the claim or the pod.
    pub(super) async fn set_up_persistent(
        &self,
        pod: &Pod,
        pv: &PersistentVolume,
        read_only: bool,
        fs_group: Option<FsGroup>,
    ) -> Result<PathBuf, CsiError> {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let spec = pv.spec.clone().unwrap_or_default();
        let source = spec.csi.clone().ok_or_else(|| {
            CsiError::Refused(format!(
                "kubernetes.io/csi: persistent volume {pv_name:?} has no csi source"
            ))
        })?;
        let secret = |r: &Option<k8s_openapi::api::core::v1::SecretReference>| {
            r.as_ref().map(|r| {
                (
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone().unwrap_or_default(),
                )
            })
        };
        let access_modes = spec.access_modes.clone().unwrap_or_default();
        let publish = Publish {
            spec_name: pv_name,
            driver: source.driver.clone(),
            handle: source.volume_handle.clone(),
            mode: PERSISTENT,
            read_only: read_only || source.read_only.unwrap_or(false),
            fs_type: source.fs_type.clone().unwrap_or_default(),
            attributes: source
                .volume_attributes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            publish_secret: secret(&source.node_publish_secret_ref),
            stage_secret: secret(&source.node_stage_secret_ref),
            access_mode: access_mode(access_modes.first().map(String::as_str)),
            mount_flags: spec.mount_options.clone().unwrap_or_default(),
            access_modes,
        };
        self.set_up(pod, publish, fs_group).await
    }

    fn driver_client(&self, driver: &str) -> Result<Arc<dyn NodeClient>, CsiError> {
        let registered = self
            .drivers
            .get(driver)
            .ok_or_else(|| CsiError::DriverNotFound(driver.to_owned()))?;
        Ok(self.connector.connect(&registered.endpoint))
    }

    async fn set_up(
        &self,
        pod: &Pod,
        publish: Publish,
        fs_group: Option<FsGroup>,
    ) -> Result<PathBuf, CsiError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let span = tracing::info_span!("csi_set_up", driver = %publish.driver, volume = %publish.spec_name, handle = %publish.handle);
        async {
            let volume_dir = paths::pod_volume_dir(&self.root_dir, &uid, &publish.spec_name);
            let target = paths::target_path(&volume_dir);
            let _turn = self
                .operations
                .acquire(unique_volume_name(&publish.driver, &publish.handle))
                .await;
            let data_file = volume_dir.join(paths::VOL_DATA_FILE);
            if self.is_mounted(&target).await? && tokio::fs::try_exists(&data_file).await.unwrap_or(false) {
                tracing::trace!(target = %target.display(), "already published");
                return Ok(target);
            }
            let client = self.driver_client(&publish.driver)?;
            let csi_driver = self
                .objects
                .csi_driver(&publish.driver)
                .await
                .map_err(|e| CsiError::Api {
                    what: format!("getting CSIDriver {:?}", publish.driver),
                    source: Box::new(e),
                })?;
            check_driver(csi_driver.as_ref(), &publish.driver, publish.mode)?;
            let data = VolumeData {
                spec_vol_id: publish.spec_name.clone(),
                volume_handle: publish.handle.clone(),
                driver_name: publish.driver.clone(),
                node_name: self.node_name.clone(),
                attachment_id: paths::attachment_name(&publish.handle, &publish.driver, &self.node_name),
                volume_lifecycle_mode: publish.mode.to_owned(),
            };
            let saved_in = volume_dir.clone();
            super::blocking(move || paths::save(&saved_in, &data).map_err(io_error("saving volume data in", &saved_in)))
                .await?;
            if self.is_mounted(&target).await? {
                tracing::debug!(target = %target.display(), "already published");
                return Ok(target);
            }
            let staging = if publish.mode == PERSISTENT
                && client
                    .node_get_capabilities()
                    .await
                    .map_err(rpc_error("NodeGetCapabilities", &publish.handle))?
                    .contains(&Capability::StageUnstageVolume)
            {
                Some(self.stage(&*client, &publish).await?)
            } else {
                None
            };
            let mut context = publish.attributes.clone();
            if csi_driver.as_ref().and_then(|d| d.spec.pod_info_on_mount).unwrap_or(false) {
                context.extend(pod_attributes(pod, publish.mode == EPHEMERAL));
            }
            let secrets = self.secrets(publish.publish_secret.as_ref(), "NodePublishSecretRef").await?;
            let request = api::NodePublishVolumeRequest {
                volume_id: publish.handle.clone(),
                publish_context: HashMap::new(),
                staging_target_path: staging.map(|p| p.to_string_lossy().into_owned()).unwrap_or_default(),
                target_path: target.to_string_lossy().into_owned(),
                volume_capability: Some(capability(&publish)),
                readonly: publish.read_only,
                secrets,
                volume_context: context,
            };
            if let Err(status) = client.node_publish_volume(request).await {
                if !self.is_mounted(&target).await? {
                    let (dir, mount) = (volume_dir.clone(), target.clone());
                    let removed =
                        super::blocking(move || paths::remove_volume_dir(&dir, &mount).map_err(io_error("removing", &dir))).await;
                    if let Err(e) = removed {
                        tracing::warn!(error = %e, "removing the mount dir after a failed NodePublishVolume");
                    }
                }
                return Err(rpc_error("NodePublishVolume", &publish.handle)(status));
            }
            tracing::info!(target = %target.display(), "volume published");
            if let Some(group) = fs_group.filter(|_| applies_fs_group(csi_driver.as_ref(), &publish)) {
                let dir = target.clone();
                super::blocking(move || {
                    ownership::set_volume_ownership(&dir, group, false).map_err(CsiError::from)
                })
                .await?;
            }
            Ok(target)
        }
        .instrument(span)
        .await
    }

    /// `NodeStageVolume` of a PV unless its global mount is already mounted; the path.
    async fn stage(&self, client: &dyn NodeClient, publish: &Publish) -> Result<PathBuf, CsiError> {
        let device = paths::device_mount_path(&self.root_dir, &publish.spec_name);
        if self.is_mounted(&device).await? {
            return Ok(device);
        }
        let data = VolumeData {
            volume_handle: publish.handle.clone(),
            driver_name: publish.driver.clone(),
            ..VolumeData::default()
        };
        let path = device.clone();
        super::blocking(move || {
            let pv_dir = path.parent().unwrap_or(&path).to_path_buf();
            paths::save(&pv_dir, &data).map_err(io_error("saving volume data in", &pv_dir))?;
            std::fs::create_dir_all(&path).map_err(io_error("creating", &path))
        })
        .await?;
        let secrets = self
            .secrets(publish.stage_secret.as_ref(), "NodeStageSecretRef")
            .await?;
        let request = api::NodeStageVolumeRequest {
            volume_id: publish.handle.clone(),
            publish_context: HashMap::new(),
            staging_target_path: device.to_string_lossy().into_owned(),
            volume_capability: Some(capability(publish)),
            secrets,
            volume_context: publish.attributes.clone(),
        };
        client
            .node_stage_volume(request)
            .await
            .map_err(rpc_error("NodeStageVolume", &publish.handle))?;
        tracing::info!(path = %device.display(), "volume staged");
        Ok(device)
    }

    async fn secrets(
        &self,
        reference: Option<&(String, String)>,
        what: &str,
    ) -> Result<HashMap<String, String>, CsiError> {
        let Some((namespace, name)) = reference else {
            return Ok(HashMap::new());
        };
        let failed = |reason: String| {
            CsiError::Refused(format!(
                "fetching {what} {namespace}/{name} failed: {reason}"
            ))
        };
        let secret = self
            .objects
            .secret(namespace, name)
            .await
            .map_err(|e| failed(e.to_string()))?
            .ok_or_else(|| failed(format!("secrets {name:?} not found")))?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }

    async fn is_mounted(&self, path: &Path) -> Result<bool, CsiError> {
        let mounter = Arc::clone(&self.mounter);
        let path = path.to_path_buf();
        super::blocking(move || {
            let canonical = match std::fs::canonicalize(&path) {
                Ok(canonical) => canonical,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(io_error("resolving", &path)(e)),
            };
            let points = mounter
                .mount_points()
                .map_err(io_error("reading the mount table for", &path))?;
            Ok(points.contains(&canonical))
        })
        .await
    }

    /// [`CsiError::StillMounted`] if `path` is still mounted after `rpc`.
    async fn check_unmounted(&self, path: &Path, rpc: &'static str) -> Result<(), CsiError> {
        if self.is_mounted(path).await? {
            return Err(CsiError::StillMounted {
                rpc,
                path: path.to_path_buf(),
            });
        }
        Ok(())
    }

    /// Unpublishes every CSI volume of the pod `pod_uid` through its driver, removes its
    /// directory, and unstages a PV no other pod uses. Safe to call again.
    ///
    /// # Errors
    /// The first volume that could not be unpublished: its driver is not registered, the
    /// driver failed, or the target is still mounted. Nothing is unmounted by force.
    pub async fn tear_down_pod(&self, pod_uid: &str) -> Result<(), CsiError> {
        let plugin_dir = self
            .root_dir
            .join("pods")
            .join(pod_uid)
            .join("volumes")
            .join(paths::POD_VOLUMES_DIR);
        let listed = plugin_dir.clone();
        let volumes = super::blocking(move || list_dirs(&listed)).await?;
        for volume_dir in volumes {
            let span =
                tracing::info_span!("csi_tear_down", pod_uid, volume = %volume_dir.display());
            self.tear_down_volume(&volume_dir).instrument(span).await?;
        }
        Ok(())
    }

    async fn tear_down_volume(&self, volume_dir: &Path) -> Result<(), CsiError> {
        let target = paths::target_path(volume_dir);
        let dir = volume_dir.to_path_buf();
        let data = super::blocking(move || {
            paths::load(&dir).map_err(io_error("reading volume data in", &dir))
        })
        .await?;
        let remove = |dir: PathBuf, target: PathBuf| {
            super::blocking(move || {
                paths::remove_volume_dir(&dir, &target).map_err(io_error("removing", &dir))
            })
        };
        let Some(data) = data else {
            if self.is_mounted(&target).await? {
                return Err(CsiError::Io {
                    action: "finding the volume data (vol_data.json) of the mounted",
                    path: target,
                    source: io::ErrorKind::NotFound.into(),
                });
            }
            return remove(volume_dir.to_path_buf(), target).await;
        };
        let client = self.driver_client(&data.driver_name)?;
        let _turn = self
            .operations
            .acquire(unique_volume_name(&data.driver_name, &data.volume_handle))
            .await;
        client
            .node_unpublish_volume(api::NodeUnpublishVolumeRequest {
                volume_id: data.volume_handle.clone(),
                target_path: target.to_string_lossy().into_owned(),
            })
            .await
            .map_err(rpc_error("NodeUnpublishVolume", &data.volume_handle))?;
        self.check_unmounted(&target, "NodeUnpublishVolume").await?;
        remove(volume_dir.to_path_buf(), target).await?;
        tracing::info!(handle = %data.volume_handle, "volume unpublished");
        if data.volume_lifecycle_mode == PERSISTENT {
            self.unstage_if_unused(&*client, &data.spec_vol_id).await?;
        }
        Ok(())
    }

    /// `NodeUnstageVolume` of the PV `pv_name` once no pod directory holds it.
    async fn unstage_if_unused(
        &self,
        client: &dyn NodeClient,
        pv_name: &str,
    ) -> Result<(), CsiError> {
        let device = paths::device_mount_path(&self.root_dir, pv_name);
        let pv_dir = device.parent().unwrap_or(&device).to_path_buf();
        let (root, name, dir) = (self.root_dir.clone(), pv_name.to_owned(), pv_dir.clone());
        let (staged, in_use) = super::blocking(move || {
            let staged = paths::load(&dir).map_err(io_error("reading volume data in", &dir))?;
            let pods = root.join("pods");
            let in_use = list_dirs(&pods)?.iter().any(|pod| {
                pod.join("volumes")
                    .join(paths::POD_VOLUMES_DIR)
                    .join(&name)
                    .exists()
            });
            Ok::<_, CsiError>((staged, in_use))
        })
        .await?;
        let Some(staged) = staged.filter(|_| !in_use) else {
            return Ok(());
        };
        client
            .node_unstage_volume(api::NodeUnstageVolumeRequest {
                volume_id: staged.volume_handle.clone(),
                staging_target_path: device.to_string_lossy().into_owned(),
            })
            .await
            .map_err(rpc_error("NodeUnstageVolume", &staged.volume_handle))?;
        self.check_unmounted(&device, "NodeUnstageVolume").await?;
        super::blocking(move || {
            paths::remove_volume_dir(&pv_dir, &device).map_err(io_error("removing", &pv_dir))
        })
        .await?;
        tracing::info!(pv = pv_name, "volume unstaged");
        Ok(())
    }

    /// The usage of the CSI volume `volume_name` of the pod `pod_uid`, from its driver's
    /// `NodeGetVolumeStats`; `None` when the pod has no such published CSI volume or the
    /// driver lacks the `GET_VOLUME_STATS` capability (as the kubelet's `MetricsCsi`).
    ///
    /// # Errors
    /// The driver is not registered or failed.
    pub async fn volume_stats(
        &self,
        pod_uid: &str,
        volume_name: &str,
    ) -> Result<Option<VolumeStats>, CsiError> {
        let volume_dir = paths::pod_volume_dir(&self.root_dir, pod_uid, volume_name);
        let dir = volume_dir.clone();
        let data = super::blocking(move || {
            paths::load(&dir).map_err(io_error("reading volume data in", &dir))
        })
        .await?;
        let Some(data) = data else {
            return Ok(None);
        };
        let client = self.driver_client(&data.driver_name)?;
        let capabilities = client
            .node_get_capabilities()
            .await
            .map_err(rpc_error("NodeGetCapabilities", &data.volume_handle))?;
        if !capabilities.contains(&Capability::GetVolumeStats) {
            return Ok(None);
        }
        let staging = paths::device_mount_path(&self.root_dir, &data.spec_vol_id);
        let staged = data.volume_lifecycle_mode == PERSISTENT
            && capabilities.contains(&Capability::StageUnstageVolume);
        let reply = client
            .node_get_volume_stats(api::NodeGetVolumeStatsRequest {
                volume_id: data.volume_handle.clone(),
                volume_path: paths::target_path(&volume_dir)
                    .to_string_lossy()
                    .into_owned(),
                staging_target_path: if staged {
                    staging.to_string_lossy().into_owned()
                } else {
                    String::new()
                },
            })
            .await
            .map_err(rpc_error("NodeGetVolumeStats", &data.volume_handle))?;
        Ok(Some(usage_stats(&reply.usage)))
    }
}

/// The stats of a `NodeGetVolumeStats` reply: bytes and inodes by unit.
pub(crate) fn usage_stats(usage: &[api::VolumeUsage]) -> VolumeStats {
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    let mut stats = VolumeStats::default();
    for u in usage {
        match u.unit() {
            api::volume_usage::Unit::Bytes => {
                stats.available_bytes = n(u.available);
                stats.capacity_bytes = n(u.total);
                stats.used_bytes = n(u.used);
            }
            api::volume_usage::Unit::Inodes => {
                stats.inodes_free = n(u.available);
                stats.inodes = n(u.total);
                stats.inodes_used = n(u.used);
            }
            api::volume_usage::Unit::Unknown => {}
        }
    }
    stats
}

/// The directories in `dir`; none when it is missing.
fn list_dirs(dir: &Path) -> Result<Vec<PathBuf>, CsiError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("reading", dir)(e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error("reading", dir))?;
        if entry
            .file_type()
            .map_err(io_error("reading", dir))?
            .is_dir()
        {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// The CSI access mode of a PV's first access mode (the kubelet's mapping).
fn access_mode(mode: Option<&str>) -> Mode {
    match mode {
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
        _ => Mode::SingleNodeWriter,
    }
}

fn capability(publish: &Publish) -> api::VolumeCapability {
    api::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: publish.access_mode.into(),
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: publish.fs_type.clone(),
            mount_flags: publish.mount_flags.clone(),
        })),
    }
}

/// The CSIDriver's say on a volume: its lifecycle mode must be listed (inline volumes need
/// a CSIDriver; persistent ones do not), and a driver that needs attaching is refused (no
/// attach/detach controller flow here).
fn check_driver(csi_driver: Option<&CSIDriver>, driver: &str, mode: &str) -> Result<(), CsiError> {
    let Some(object) = csi_driver else {
        if mode == PERSISTENT {
            return Err(CsiError::Refused(format!(
                "kubernetes.io/csi: driver {driver} has no CSIDriver object: this node serves only drivers with attachRequired: false"
            )));
        }
        return Err(CsiError::Refused(format!(
            "volume mode {mode:?} not supported by driver {driver} (no CSIDriver object)"
        )));
    };
    let modes = object
        .spec
        .volume_lifecycle_modes
        .clone()
        .unwrap_or_else(|| vec![PERSISTENT.to_owned()]);
    if !modes.iter().any(|m| m == mode) {
        let quoted: Vec<String> = modes.iter().map(|m| format!("{m:?}")).collect();
        return Err(CsiError::Refused(format!(
            "volume mode {mode:?} not supported by driver {driver} (only supports [{}])",
            quoted.join(" ")
        )));
    }
    if mode == PERSISTENT && object.spec.attach_required.unwrap_or(true) {
        return Err(CsiError::Refused(format!(
            "kubernetes.io/csi: driver {driver} requires attaching (attachRequired): not supported by this node"
        )));
    }
    Ok(())
}

/// Whether the CSIDriver's fsGroupPolicy has the fsGroup applied (the kubelet's
/// `supportsFSGroup`): `File` always, `ReadWriteOnceWithFSType` (the default) for a volume
/// with an fsType that is mounted `ReadWriteOnce` (a persistent volume whose access modes
/// say so; an inline volume always is); never read-only. The kubelet v1.20 dereferences
/// the missing PersistentVolume of an inline volume there (kubernetes#102651: the mount
/// fails "recovered from panic" and the pod never starts); v1.22 skipped the fsGroup of
/// inline volumes, and v1.24 (kubernetes#108662) applies it, as here.
fn applies_fs_group(csi_driver: Option<&CSIDriver>, publish: &Publish) -> bool {
    let policy = csi_driver
        .and_then(|d| d.spec.fs_group_policy.clone())
        .unwrap_or_else(|| "ReadWriteOnceWithFSType".into());
    !publish.read_only
        && match policy.as_str() {
            "File" => true,
            "ReadWriteOnceWithFSType" => {
                !publish.fs_type.is_empty()
                    && (publish.mode == EPHEMERAL
                        || publish.access_modes.iter().any(|m| m == "ReadWriteOnce"))
            }
            _ => false,
        }
}

/// The pod's attributes for a driver with `podInfoOnMount`.
fn pod_attributes(pod: &Pod, ephemeral: bool) -> BTreeMap<String, String> {
    let meta = &pod.metadata;
    let service_account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    [
        (
            "csi.storage.k8s.io/pod.name",
            meta.name.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.namespace",
            meta.namespace.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.uid",
            meta.uid.clone().unwrap_or_default(),
        ),
        ("csi.storage.k8s.io/serviceAccount.name", service_account),
        ("csi.storage.k8s.io/ephemeral", ephemeral.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

#[cfg(test)]
mod tests;
