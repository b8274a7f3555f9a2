//! The device manager's state and its services (the kubelet's `manager.go`): plugins
//! registered through the `Registration` service, their devices' health from
//! `ListAndWatch`, devices chosen for pods, capacity for the node status, the checkpoint.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::api::{self, registration_server};
use super::checkpoint::{self, CHECKPOINT_FILE, CheckpointData};
use super::endpoint::PluginClient;
use super::pod_devices::{Allocation, DeviceRunOptions, DeviceSet, PodDevices};
use super::{DeviceError, HEALTHY, KUBELET_SOCKET, check_registration, is_extended_resource_name};
use crate::lock::lock;

/// How long a stopped plugin's resource is kept (capacity, no allocatable) before it is
/// dropped: the kubelet's `endpointStopGracePeriod`.
pub const ENDPOINT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);

/// What the node status reports for the device plugins' resources (the kubelet's
/// `GetCapacity`): every device in capacity, healthy ones in allocatable, and the
/// resources dropped since the last call (their capacity goes to 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceCapacity {
    /// Devices per resource.
    pub capacity: BTreeMap<String, u64>,
    /// Healthy devices per resource.
    pub allocatable: BTreeMap<String, u64>,
    /// Resources whose plugin is gone for good.
    pub removed: Vec<String>,
}

/// A registered plugin; `client` is `None` for one known only from the checkpoint.
#[derive(Debug)]
struct Endpoint {
    id: u64,
    client: Option<PluginClient>,
    options: api::DevicePluginOptions,
    stopped_at: Option<Instant>,
}

impl Endpoint {
    fn grace_expired(&self, now: Instant) -> bool {
        self.stopped_at
            .is_some_and(|at| now.saturating_duration_since(at) > ENDPOINT_STOP_GRACE_PERIOD)
    }
}

#[derive(Debug, Default)]
struct State {
    endpoints: HashMap<String, Endpoint>,
    healthy: BTreeMap<String, DeviceSet>,
    unhealthy: BTreeMap<String, DeviceSet>,
    /// Devices held by pods, by resource (recomputed from `pods` when they change).
    allocated: BTreeMap<String, DeviceSet>,
    pods: PodDevices,
    /// The pod being admitted and its init containers' devices, reusable by the next.
    reuse: Option<(String, BTreeMap<String, DeviceSet>)>,
    next_id: u64,
}

impl State {
    /// Whether `resource` is the device manager's: registered, or held by a pod.
    fn is_device_resource(&self, resource: &str) -> bool {
        self.healthy.contains_key(resource) || self.allocated.contains_key(resource)
    }

    fn checkpoint(&self) -> CheckpointData {
        let entries = self.pods.to_entries();
        CheckpointData {
            pod_device_entries: (!entries.is_empty()).then_some(entries),
            registered_devices: Some(
                self.healthy
                    .iter()
                    .map(|(r, d)| (r.clone(), d.iter().cloned().collect()))
                    .collect(),
            ),
        }
    }

    /// The kubelet's `UpdateAllocatedDevices`: forgets the pods `keep` refuses.
    fn free(&mut self, keep: &dyn Fn(&str) -> bool) -> bool {
        let gone: Vec<String> = self.pods.pods().into_iter().filter(|u| !keep(u)).collect();
        if gone.is_empty() {
            return false;
        }
        tracing::info!(pods = ?gone, "freeing the devices of pods no longer active");
        self.pods.delete(&gone);
        self.allocated = self.pods.devices();
        true
    }

    /// The kubelet's `devicesToAllocate`: the devices `container` gets for `needed` of
    /// `resource`, taken from `reusable` first, then from the healthy devices no pod
    /// holds (in ID order). Records them, without the plugin's answer yet.
    fn choose(
        &mut self,
        uid: &str,
        container: &str,
        (resource, needed): (&str, usize),
        reusable: Option<&DeviceSet>,
    ) -> Result<(), DeviceError> {
        if let Some(held) = self.pods.get(uid, container, resource) {
            let held = held.ids().len();
            if held != needed {
                return Err(DeviceError::Allocation(format!(
                    "pod {uid:?} container {container:?} changed request for resource {resource:?} from {held} to {needed}"
                )));
            }
            return Ok(());
        }
        if needed == 0 {
            return Ok(());
        }
        let Some(healthy) = self.healthy.get(resource) else {
            return Err(DeviceError::Allocation(format!(
                "can't allocate unregistered device {resource}"
            )));
        };
        let mut chosen: Vec<String> = reusable
            .into_iter()
            .flatten()
            .take(needed)
            .cloned()
            .collect();
        let remaining = needed - chosen.len();
        if remaining > 0 {
            let in_use = self.allocated.get(resource);
            let available: Vec<&String> = healthy
                .iter()
                .filter(|d| !in_use.is_some_and(|u| u.contains(*d)) && !chosen.contains(d))
                .collect();
            if available.len() < remaining {
                return Err(DeviceError::Allocation(format!(
                    "requested number of devices unavailable for {resource}. Requested: {remaining}, Available: {}",
                    available.len()
                )));
            }
            chosen.extend(available.into_iter().take(remaining).cloned());
        }
        self.allocated
            .entry(resource.to_owned())
            .or_default()
            .extend(chosen.iter().cloned());
        let allocation = Allocation {
            devices: BTreeMap::from([(0, chosen)]),
            answer: None,
        };
        self.pods.insert(uid, container, resource, allocation);
        Ok(())
    }

    /// Chooses devices for each device resource in the container's limits.
    fn choose_for_container(
        &mut self,
        uid: &str,
        container: &Container,
        reusable: &BTreeMap<String, DeviceSet>,
    ) -> Result<(), DeviceError> {
        for (resource, needed) in device_limits(container) {
            if self.is_device_resource(&resource) {
                let reuse = reusable.get(&resource);
                self.choose(uid, &container.name, (&resource, needed), reuse)?;
            }
        }
        Ok(())
    }

    /// A new device list from a plugin: its healthy and unhealthy devices.
    fn update_devices(&mut self, resource: &str, devices: &[api::Device]) {
        let (healthy, unhealthy): (Vec<_>, Vec<_>) =
            devices.iter().partition(|d| d.health == HEALTHY);
        let ids = |list: Vec<&api::Device>| list.into_iter().map(|d| d.id.clone()).collect();
        self.healthy.insert(resource.to_owned(), ids(healthy));
        self.unhealthy.insert(resource.to_owned(), ids(unhealthy));
    }

    /// A plugin went: all its devices turn unhealthy (the kubelet's
    /// `markResourceUnhealthy`).
    fn mark_unhealthy(&mut self, resource: &str) {
        let healthy = self.healthy.insert(resource.to_owned(), DeviceSet::new());
        self.unhealthy
            .entry(resource.to_owned())
            .or_default()
            .extend(healthy.into_iter().flatten());
    }

    /// The kubelet's `GetCapacity`; true in the second place when a resource was dropped.
    fn capacity(&mut self, now: Instant) -> (DeviceCapacity, bool) {
        let mut out = DeviceCapacity::default();
        let resources: BTreeSet<String> = (self.healthy.keys())
            .chain(self.unhealthy.keys())
            .cloned()
            .collect();
        for resource in resources {
            let live = self
                .endpoints
                .get(&resource)
                .is_some_and(|e| !e.grace_expired(now));
            if !live {
                self.endpoints.remove(&resource);
                self.healthy.remove(&resource);
                self.unhealthy.remove(&resource);
                out.removed.push(resource);
                continue;
            }
            let count =
                |m: &BTreeMap<String, DeviceSet>| m.get(&resource).map_or(0, |d| d.len() as u64);
            let healthy = count(&self.healthy);
            if self.healthy.contains_key(&resource) {
                out.allocatable.insert(resource.clone(), healthy);
            }
            out.capacity
                .insert(resource.clone(), healthy + count(&self.unhealthy));
        }
        let removed = !out.removed.is_empty();
        (out, removed)
    }
}

/// The device resources in a container's limits and how many devices each asks
/// (extended resources are not overcommitted: requests equal limits).
fn device_limits(container: &Container) -> Vec<(String, usize)> {
    let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
    limits
        .into_iter()
        .flatten()
        .filter(|(name, _)| is_extended_resource_name(name))
        .map(|(name, q)| {
            let value = crate::resources::Quantity::parse(&q.0).map_or(0, |q| q.value());
            (name.clone(), usize::try_from(value).unwrap_or(usize::MAX))
        })
        .collect()
}

/// The device manager.
pub struct DeviceManager {
    dir: PathBuf,
    state: Mutex<State>,
    /// Serializes checkpoint writes, each of the state as it is when it gets its turn.
    writes: tokio::sync::Mutex<()>,
    /// Told when capacity may have changed (the node status is reported again).
    changed: Box<dyn Fn() + Send + Sync>,
    /// Asks the checkpoint writer for a write (freed devices, dropped resources).
    dirty: tokio::sync::Notify,
    /// Ends the plugins' streams when the manager stops.
    stop: CancellationToken,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The registration socket, bound, and the manager it serves.
#[derive(Debug)]
pub struct Serving {
    manager: Arc<DeviceManager>,
    listener: UnixListener,
}

impl DeviceManager {
    /// The manager of `dir` (`<root-dir>/device-plugins`), without a socket: for tests
    /// and for the state read from the checkpoint.
    fn new(dir: &Path, changed: Box<dyn Fn() + Send + Sync>) -> Self {
        Self {
            dir: dir.to_path_buf(),
            state: Mutex::default(),
            writes: tokio::sync::Mutex::new(()),
            changed,
            dirty: tokio::sync::Notify::new(),
            stop: CancellationToken::new(),
        }
    }

    /// The kubelet's `Start`: reads the checkpoint (its resources are known with no device
    /// until their plugins register again; its allocations are kept), makes `dir` (mode
    /// 0750), removes the files in it but the checkpoint (stale sockets: plugins watch for
    /// that to register again), and binds the registration socket. `changed` is called
    /// when the capacity may have changed.
    ///
    /// # Errors
    /// The directory or the socket cannot be made. An unreadable checkpoint is logged.
    pub fn start(
        dir: &Path,
        changed: Box<dyn Fn() + Send + Sync>,
    ) -> Result<(Arc<Self>, Serving), DeviceError> {
        let manager = Self::new(dir, changed);
        match checkpoint::read(dir) {
            Ok(Some(data)) => manager.restore(&data),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error,
                "continuing after failing to read the checkpoint: device allocations may not be up to date"),
        }
        let socket_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DeviceError::Socket { path, source }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(socket_error(dir))?;
        remove_stale_files(dir);
        let socket = dir.join(KUBELET_SOCKET);
        let listener = UnixListener::bind(&socket).map_err(socket_error(&socket))?;
        tracing::info!(socket = %socket.display(), "serving device plugin registration");
        let manager = Arc::new(manager);
        let serving = Serving {
            manager: manager.clone(),
            listener,
        };
        Ok((manager, serving))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Loads the checkpoint's allocations, and its resources as stopped plugins.
    fn restore(&self, data: &CheckpointData) {
        let mut state = self.state();
        state
            .pods
            .load(data.pod_device_entries.as_deref().unwrap_or_default());
        state.allocated = state.pods.devices();
        let now = Instant::now();
        for resource in data.registered_devices.iter().flat_map(BTreeMap::keys) {
            state.healthy.insert(resource.clone(), DeviceSet::new());
            state.unhealthy.insert(resource.clone(), DeviceSet::new());
            let id = state.next_id;
            state.next_id += 1;
            let endpoint = Endpoint {
                id,
                client: None,
                options: api::DevicePluginOptions::default(),
                stopped_at: Some(now),
            };
            state.endpoints.insert(resource.clone(), endpoint);
        }
        tracing::info!(
            pods = state.pods.pods().len(),
            "device allocations read from the checkpoint"
        );
    }

    /// Writes the checkpoint as the state is now.
    async fn save(&self) {
        let _turn = self.writes.lock().await;
        let data = self.state().checkpoint();
        if let Err(error) = checkpoint::write(&self.dir, &data).await {
            tracing::warn!(%error, "writing the device manager checkpoint failed");
        }
    }

    /// The capacity the node status reports (the kubelet's `GetCapacity`); a resource
    /// whose plugin has been gone for the grace period is dropped here.
    pub fn capacity(&self) -> DeviceCapacity {
        let (capacity, removed) = self.state().capacity(Instant::now());
        if removed {
            tracing::info!(resources = ?capacity.removed, "device plugin resources removed");
            self.dirty.notify_one();
        }
        capacity
    }

    /// The admission step (the kubelet's `resourceAllocator.Admit` → `Allocate` for each
    /// init then app container): first frees the pods `gone` names (finished or refused;
    /// the kubelet frees the pods not active once all its pod sources were read — pods not
    /// seen yet since a restart are kept here), then
    /// chooses devices for each container, init containers' devices reusable by the
    /// containers after them. The plugin's `Allocate` is called at the container's
    /// creation ([`run_options`](Self::run_options)).
    ///
    /// # Errors
    /// The first container whose devices cannot be chosen, with the kubelet's text
    /// (`requested number of devices unavailable for ...`).
    pub fn allocate(&self, pod: &Pod, gone: &dyn Fn(&str) -> bool) -> Result<(), DeviceError> {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return Ok(());
        };
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let mut state = self.state();
        if state.free(&|u| u == uid || !gone(u)) {
            self.dirty.notify_one();
        }
        let mut reusable = match state.reuse.take() {
            Some((pod, devices)) if pod == uid => devices,
            _ => BTreeMap::new(),
        };
        let result = (|| {
            for c in spec.init_containers.iter().flatten() {
                state.choose_for_container(uid, c, &reusable)?;
                state.pods.add_reusable(uid, &c.name, &mut reusable);
            }
            for c in &spec.containers {
                state.choose_for_container(uid, c, &reusable)?;
                state.pods.remove_reusable(uid, &c.name, &mut reusable);
            }
            Ok(())
        })();
        state.reuse = Some((uid.to_owned(), reusable));
        result
    }

    /// The kubelet's `sanitizeNodeAllocatable` (its `UpdatePluginResources`): for a pod
    /// that holds devices, the devices held by all pods, per resource, below which the
    /// admission's allocatable must not go — so pods admitted before can be admitted
    /// again after a restart, before their plugin registers again. Empty for other pods.
    pub fn allocatable_floor(&self, uid: &str) -> BTreeMap<String, u64> {
        let state = self.state();
        if !state.pods.contains(uid) {
            return BTreeMap::new();
        }
        (state.allocated.iter())
            .map(|(resource, held)| (resource.clone(), held.len() as u64))
            .collect()
    }

    /// Forgets the pods `keep` refuses (pods removed from the node, or finished), freeing
    /// their devices; the checkpoint follows.
    pub fn free(&self, keep: &dyn Fn(&str) -> bool) {
        if self.state().free(keep) {
            self.dirty.notify_one();
        }
    }

    /// What the container gets from its devices (the kubelet's
    /// `GetDeviceRunContainerOptions`): for each device resource it asks, the plugin's
    /// `Allocate` the first time (the answer checkpointed) and its `PreStartContainer`
    /// when its options ask; then the answers' devices, mounts, env and annotations.
    ///
    /// # Errors
    /// No devices are held for the container, or a plugin call failed.
    #[tracing::instrument(name = "device_run_options", skip_all, fields(container = %container.name))]
    pub async fn run_options(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<DeviceRunOptions, DeviceError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let mut answered = false;
        for (resource, needed) in device_limits(container) {
            let (client, pre_start, devices, answer) = {
                let mut state = self.state();
                if !state.is_device_resource(&resource) {
                    continue;
                }
                // Not chosen yet (a restart between admission and creation): choose now.
                state.choose(uid, &container.name, (&resource, needed), None)?;
                let endpoint = state.endpoints.get(&resource);
                let client = endpoint.filter(|e| e.stopped_at.is_none());
                let client = client.and_then(|e| e.client.clone());
                let pre_start = endpoint.is_some_and(|e| e.options.pre_start_required);
                let held = state.pods.get(uid, &container.name, &resource);
                let devices: Vec<String> = held
                    .map(|a| a.ids().into_iter().collect())
                    .unwrap_or_default();
                let answer = held.and_then(|a| a.answer.clone());
                (client, pre_start, devices, answer)
            };
            if devices.is_empty() {
                continue;
            }
            let stopped =
                || DeviceError::Allocation(format!("endpoint {resource} has been stopped"));
            if answer.is_none() {
                let client = client.clone().ok_or_else(stopped)?;
                let answer = client.allocate(devices.clone()).await?;
                tracing::info!(%resource, ?devices, "devices allocated by the plugin");
                if let Some(a) = self.state().pods.get_mut(uid, &container.name, &resource) {
                    a.answer = Some(answer);
                }
                answered = true;
            }
            if pre_start {
                client.ok_or_else(stopped)?.pre_start(devices).await?;
            }
        }
        if answered {
            self.save().await;
        }
        Ok(self.state().pods.run_options(uid, &container.name))
    }

    /// A plugin's registration (the kubelet's `Register`): the version and the resource
    /// name checked, then, in the background, its socket dialled and its stream read.
    fn register(self: &Arc<Self>, request: api::RegisterRequest) -> Result<(), String> {
        let resource = request.resource_name.clone();
        tracing::info!(%resource, endpoint = %request.endpoint, "registration request from device plugin");
        if let Err(message) = check_registration(&request) {
            tracing::info!(%resource, %message, "bad registration request from device plugin");
            return Err(message);
        }
        let manager = self.clone();
        let span = tracing::info_span!("device_plugin", %resource);
        tokio::spawn(async move { manager.add_endpoint(request).await }.instrument(span));
        Ok(())
    }

    /// Dials the plugin, makes it the resource's endpoint (replacing an older one), and
    /// reads its devices until its stream ends; then its devices turn unhealthy.
    async fn add_endpoint(self: Arc<Self>, request: api::RegisterRequest) {
        let resource = request.resource_name;
        let socket = self.dir.join(&request.endpoint);
        let client = match PluginClient::dial(&socket).await {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(%error, "failed to dial the device plugin");
                return;
            }
        };
        let id = {
            let mut state = self.state();
            let id = state.next_id;
            state.next_id += 1;
            let endpoint = Endpoint {
                id,
                client: Some(client.clone()),
                options: request.options.unwrap_or_default(),
                stopped_at: None,
            };
            state.endpoints.insert(resource.clone(), endpoint);
            id
        };
        tracing::info!("registered device plugin endpoint");
        tokio::select! {
            () = self.stop.cancelled() => return,
            () = self.watch(&resource, &client) => {}
        }
        let mut state = self.state();
        let Some(endpoint) = state.endpoints.get_mut(&resource).filter(|e| e.id == id) else {
            return;
        };
        endpoint.stopped_at = Some(Instant::now());
        state.mark_unhealthy(&resource);
        drop(state);
        tracing::warn!("device plugin endpoint became unhealthy");
        (self.changed)();
    }

    /// Reads the plugin's `ListAndWatch` stream until it ends.
    async fn watch(&self, resource: &str, client: &PluginClient) {
        let mut stream = match client.list_and_watch().await {
            Ok(stream) => stream,
            Err(error) => {
                tracing::error!(%error, "listAndWatch ended unexpectedly for device plugin");
                return;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(answer)) => {
                    let healthy = answer
                        .devices
                        .iter()
                        .filter(|d| d.health == HEALTHY)
                        .count();
                    tracing::info!(
                        devices = answer.devices.len(),
                        healthy,
                        "state pushed by device plugin"
                    );
                    self.state().update_devices(resource, &answer.devices);
                    self.save().await;
                    (self.changed)();
                }
                Ok(None) => {
                    tracing::error!(
                        "listAndWatch ended unexpectedly for device plugin: end of stream"
                    );
                    return;
                }
                Err(error) => {
                    tracing::error!(%error, "listAndWatch ended unexpectedly for device plugin");
                    return;
                }
            }
        }
    }
}

/// Removes the files (not directories) in `dir` but the checkpoint: the kubelet's
/// `removeContents`, which plugins watch to register again.
fn remove_stale_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_dir = std::fs::metadata(&path).is_ok_and(|m| m.is_dir());
        if is_dir || entry.file_name() == CHECKPOINT_FILE {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed stale file in the device plugin directory")
            }
            Err(error) => tracing::error!(path = %path.display(), %error, "failed to remove file"),
        }
    }
}

/// The `Registration` service.
struct Registrar(Arc<DeviceManager>);

#[tonic::async_trait]
impl registration_server::Registration for Registrar {
    async fn register(
        &self,
        request: tonic::Request<api::RegisterRequest>,
    ) -> Result<tonic::Response<api::Empty>, tonic::Status> {
        self.0
            .register(request.into_inner())
            .map(|()| tonic::Response::new(api::Empty {}))
            .map_err(tonic::Status::unknown)
    }
}

impl Serving {
    /// Serves registrations and writes the checkpoint when asked, until `stop`; then
    /// ends the plugins' streams, makes a write still asked for, and removes the socket.
    ///
    /// # Errors
    /// The gRPC server failed.
    pub async fn run(self, stop: CancellationToken) -> Result<(), DeviceError> {
        let Self { manager, listener } = self;
        let socket = manager.dir.join(KUBELET_SOCKET);
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let server = tonic::transport::Server::builder().serve_with_incoming_shutdown(
            registration_server::RegistrationServer::new(Registrar(manager.clone())),
            incoming,
            stop.cancelled(),
        );
        let writer = async {
            loop {
                manager.dirty.notified().await;
                manager.save().await;
            }
        };
        let served = tokio::select! {
            served = server => served,
            () = writer => Ok(()),
        };
        manager.stop.cancel();
        // A write asked for and not yet made; with nothing changed no file is written, as
        // the kubelet writes its checkpoint on changes only.
        if futures::FutureExt::now_or_never(manager.dirty.notified()).is_some() {
            manager.save().await;
        }
        if let Err(error) = std::fs::remove_file(&socket) {
            tracing::warn!(%error, socket = %socket.display(), "removing the registration socket");
        }
        tracing::info!("device plugin registration stopped");
        Ok(served?)
    }
}

/// A plugin's `ListAndWatch` device list as the manager takes it, then the capacity it
/// reports (for the fuzz target).
#[cfg(any(test, fuzzing))]
pub(crate) fn fuzz_device_list(devices: &[api::Device]) {
    let manager = DeviceManager::new(Path::new("/nonexistent"), Box::new(|| {}));
    let resource = "example.com/dev";
    manager.restore(&CheckpointData {
        pod_device_entries: None,
        registered_devices: Some(BTreeMap::from([(resource.to_owned(), Vec::new())])),
    });
    let mut state = manager.state();
    state.update_devices(resource, devices);
    let _ = state.capacity(Instant::now());
    state.mark_unhealthy(resource);
}

/// A checkpoint as the manager restores it at start, then every container's run options
/// from the plugins' `Allocate` answers it holds, applied to a CRI container config (for
/// the fuzz target).
#[cfg(any(test, fuzzing))]
pub(crate) fn fuzz_checkpoint(data: &CheckpointData) {
    let manager = DeviceManager::new(Path::new("/nonexistent"), Box::new(|| {}));
    manager.restore(data);
    for entry in data.pod_device_entries.iter().flatten() {
        let options = manager
            .state()
            .pods
            .run_options(&entry.pod_uid, &entry.container_name);
        options.apply(&mut crate::cri::api::ContainerConfig::default());
    }
    let _ = manager.state().capacity(Instant::now());
}

#[cfg(test)]
mod tests {
    use super::super::VERSION;
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const DEV: &str = "example.com/dev";

    fn device(id: &str, healthy: bool) -> api::Device {
        api::Device {
            id: id.into(),
            health: if healthy {
                HEALTHY
            } else {
                super::super::UNHEALTHY
            }
            .into(),
            topology: None,
        }
    }

    fn container(name: &str, devices: u32) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([
                    (DEV.to_owned(), Quantity(devices.to_string())),
                    ("cpu".to_owned(), Quantity("1".into())),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(uid: &str, init: Vec<Container>, app: Vec<Container>) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.spec = Some(PodSpec {
            init_containers: Some(init),
            containers: app,
            ..Default::default()
        });
        p
    }

    /// A manager with a plugin of four healthy devices registered.
    fn manager() -> DeviceManager {
        let m = DeviceManager::new(Path::new("/nonexistent"), Box::new(|| {}));
        {
            let mut state = m.state();
            state.endpoints.insert(
                DEV.into(),
                Endpoint {
                    id: 0,
                    client: None,
                    options: api::DevicePluginOptions::default(),
                    stopped_at: None,
                },
            );
            let devices: Vec<_> = (0..4).map(|i| device(&format!("dev-{i}"), true)).collect();
            state.update_devices(DEV, &devices);
        }
        m
    }

    fn held(m: &DeviceManager, uid: &str, c: &str) -> Vec<String> {
        let state = m.state();
        state
            .pods
            .get(uid, c, DEV)
            .map(|a| a.ids().into_iter().collect())
            .unwrap_or_default()
    }

    #[test]
    fn admission_arithmetic_refuses_the_pod_that_does_not_fit() {
        let m = manager();
        let all = |_: &str| false;
        m.allocate(&pod("a", vec![], vec![container("c", 2)]), &all)
            .unwrap();
        m.allocate(&pod("b", vec![], vec![container("c", 2)]), &all)
            .unwrap();
        assert_eq!(held(&m, "a", "c"), ["dev-0", "dev-1"]);
        assert_eq!(held(&m, "b", "c"), ["dev-2", "dev-3"]);
        let err = m
            .allocate(&pod("c", vec![], vec![container("c", 2)]), &all)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "requested number of devices unavailable for example.com/dev. Requested: 2, Available: 0"
        );
        // Admitting again keeps what was chosen.
        m.allocate(&pod("a", vec![], vec![container("c", 2)]), &all)
            .unwrap();
        assert_eq!(held(&m, "a", "c"), ["dev-0", "dev-1"]);
        // A changed request is refused as by the kubelet.
        let err = m
            .allocate(&pod("a", vec![], vec![container("c", 1)]), &all)
            .unwrap_err();
        assert!(
            err.to_string().contains("changed request for resource"),
            "{err}"
        );
        // When a pod is no longer active its devices are free again.
        m.allocate(&pod("c", vec![], vec![container("c", 2)]), &|u| u == "a")
            .unwrap();
        assert_eq!(held(&m, "c", "c"), ["dev-0", "dev-1"]);
        assert!(held(&m, "a", "c").is_empty());
    }

    #[test]
    fn init_container_devices_are_reused_by_app_containers() {
        let m = manager();
        let all = |_: &str| false;
        let p = pod(
            "p",
            vec![container("init", 3)],
            vec![container("one", 2), container("two", 2)],
        );
        m.allocate(&p, &all).unwrap();
        assert_eq!(held(&m, "p", "init"), ["dev-0", "dev-1", "dev-2"]);
        assert_eq!(held(&m, "p", "one"), ["dev-0", "dev-1"], "reused from init");
        assert_eq!(
            held(&m, "p", "two"),
            ["dev-2", "dev-3"],
            "one reused, one new"
        );
        // Unregistered resources are not the device manager's.
        let mut other = container("x", 0);
        other.resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "other.com/x".to_owned(),
                Quantity("1".into()),
            )])),
            ..Default::default()
        });
        m.allocate(&pod("q", vec![], vec![other]), &all).unwrap();
    }

    #[test]
    fn registrations_with_another_version_or_a_bad_resource_name_are_refused() {
        let m = Arc::new(manager());
        let request = |version: &str, resource: &str| api::RegisterRequest {
            version: version.into(),
            endpoint: "plugin.sock".into(),
            resource_name: resource.into(),
            options: None,
        };
        assert_eq!(
            m.register(request("v1alpha", DEV)).unwrap_err(),
            r#"requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]"#
        );
        assert_eq!(
            m.register(request(VERSION, "cpu")).unwrap_err(),
            r#"the ResourceName "cpu" is invalid"#
        );
    }

    /// An endpoint naming anything but a file of the plugin directory is refused before
    /// anything is dialled (the kubelet v1.20 would dial `/run/containerd/containerd.sock`).
    #[test]
    fn an_endpoint_outside_the_plugin_directory_is_refused() {
        let m = Arc::new(manager());
        for endpoint in [
            "/run/containerd/containerd.sock",
            "../kubelet.sock",
            "..",
            ".",
            "",
            "sub/plugin.sock",
            "a\0b",
        ] {
            let refused = m
                .register(api::RegisterRequest {
                    version: VERSION.into(),
                    endpoint: endpoint.into(),
                    resource_name: DEV.into(),
                    options: None,
                })
                .unwrap_err();
            assert_eq!(
                refused,
                format!(
                    "invalid name of device plugin socket: endpoint {endpoint:?} must be a file name in the device plugin directory"
                )
            );
        }
        assert!(
            check_registration(&api::RegisterRequest {
                version: VERSION.into(),
                endpoint: "vendor..plugin.sock".into(),
                resource_name: DEV.into(),
                options: None,
            })
            .is_ok(),
            "dots inside a file name are a file name"
        );
    }

    #[test]
    fn capacity_follows_health_and_a_stopped_plugin() {
        let m = manager();
        let now = Instant::now();
        let (cap, _) = m.state().capacity(now);
        assert_eq!(cap.capacity[DEV], 4);
        assert_eq!(cap.allocatable[DEV], 4);
        let devices: Vec<_> = (0..4)
            .map(|i| device(&format!("dev-{i}"), i != 2))
            .collect();
        m.state().update_devices(DEV, &devices);
        let (cap, _) = m.state().capacity(now);
        assert_eq!((cap.capacity[DEV], cap.allocatable[DEV]), (4, 3));
        // The plugin goes: nothing allocatable, capacity kept for the grace period.
        {
            let mut state = m.state();
            state.endpoints.get_mut(DEV).unwrap().stopped_at = Some(now);
            state.mark_unhealthy(DEV);
        }
        let (cap, removed) = m.state().capacity(now);
        assert_eq!(
            (cap.capacity[DEV], cap.allocatable[DEV], removed),
            (4, 0, false)
        );
        let later = now + ENDPOINT_STOP_GRACE_PERIOD + Duration::from_secs(1);
        let (cap, removed) = m.state().capacity(later);
        assert!(removed);
        assert_eq!(cap.removed, [DEV]);
        assert!(cap.capacity.is_empty());
        // Unhealthy devices are never chosen.
        let m = manager();
        m.state().update_devices(DEV, &devices);
        let err = m
            .allocate(&pod("a", vec![], vec![container("c", 4)]), &|_| false)
            .unwrap_err();
        assert!(
            err.to_string().ends_with("Requested: 4, Available: 3"),
            "{err}"
        );
    }

    #[test]
    fn the_checkpoint_restores_allocations_and_resources_without_devices() {
        let m = manager();
        m.allocate(&pod("a", vec![], vec![container("c", 2)]), &|_| false)
            .unwrap();
        m.state().pods.get_mut("a", "c", DEV).unwrap().answer =
            Some(api::ContainerAllocateResponse::default());
        let data = m.state().checkpoint();
        assert_eq!(data.registered_devices.as_ref().unwrap()[DEV].len(), 4);
        let restored = DeviceManager::new(Path::new("/nonexistent"), Box::new(|| {}));
        restored.restore(&data);
        assert_eq!(held(&restored, "a", "c"), ["dev-0", "dev-1"]);
        // Admitting the pod again counts on its devices, not on the (zero) capacity.
        assert_eq!(
            restored.allocatable_floor("a"),
            BTreeMap::from([(DEV.to_owned(), 2)])
        );
        assert!(restored.allocatable_floor("b").is_empty());
        let cap = restored.capacity();
        assert_eq!((cap.capacity[DEV], cap.allocatable[DEV]), (0, 0));
        // Its devices stay held when the plugin comes back.
        {
            let mut state = restored.state();
            let devices: Vec<_> = (0..4).map(|i| device(&format!("dev-{i}"), true)).collect();
            state.update_devices(DEV, &devices);
        }
        restored
            .allocate(&pod("b", vec![], vec![container("c", 2)]), &|_| false)
            .unwrap();
        assert_eq!(held(&restored, "b", "c"), ["dev-2", "dev-3"]);
    }
}
