//! Start-up of `rkubelet run`, like the kubelet's `cmd/kubelet/app`: from the
//! configuration to running modules. It connects to the API server and the runtime,
//! registers the node, sets up pod networking for the chosen owner, and declares the
//! agent's long-running loops (heartbeats, status manager, event publisher, PLEG, pod
//! sources, pod workers' housekeeping, garbage collectors, eviction, the kubelet API) as
//! named tasks of a [`supervisor`]: what starts after what, which failure stops the agent
//! and which is restarted. It returns when asked to stop; pods keep running, as with the
//! kubelet, and are adopted by the next start. It wires modules together and owns none of
//! their decisions. Knows every module; no module knows it.

pub mod supervisor;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::certificate::csr::{CsrTemplate, EXIT_AFTER_EXPIRY, Rotation};
use crate::certificate::{CertificateError, bootstrap};
use crate::cm::devicemanager::DeviceManager;
use crate::cm::{ContainerManager, NodeCapacity};
use crate::cni::{self, Cni, ProcessExec};
use crate::cri::{Cri, CriClient, RuntimeHealth, api};
use crate::dns::{self, HostDns};
use crate::envvars::ServiceLister;
use crate::events::{self, EventRecorder};
use crate::eviction::NodeConditions;
use crate::images::gc::{ImageGc, RuntimeImageFs};
use crate::kubelet::{Kubelet, SyncSettings, housekeeping};
use crate::kuberuntime::RuntimeManager;
use crate::kuberuntime::env::EnvSourceReader;
use crate::kuberuntime::gc::ContainerGc;
use crate::kuberuntime::sandbox::SandboxSettings;
use crate::lifecycle::admission::{PodAdmitter, SysctlWhitelist};
use crate::logs::ContainerLogManager;
use crate::node::{
    LinuxMachine, MachineInfo, NodeAgent, NodeConfig, ReadinessCheck, StatusTrigger,
    wait_for_pod_cidr,
};
use crate::pleg::Pleg;
use crate::pod::file::FileConfig;
use crate::pod::mirror::{self, KubeMirrorClient};
use crate::pod::state::{Wake, WakeFor};
use crate::pod::store::StaticPods;
use crate::pod::workers::PodWorkers;
use crate::resources::Quantity;
use crate::status::StatusManager;
use crate::tls::ServingCertificate;
use crate::tls::transport::ClientIdentity;
use crate::volume::csi::{
    CsiPlugin, Drivers, GrpcConnector, KubeCsiObjects, KubeNodeInfo, RegistrationHandler,
};
use crate::volume::{LinuxMounter, VolumeManager};
use crate::watch_manager::{KubePodObjects, SourceCaches};
use supervisor::{DeclarationError, Failure, OnFailure, Run, Supervisor, Task};

/// Who runs the CNI plugins for pod sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkOwner {
    /// The agent: containerd's CNI call is handed to the agent by the thin plugin.
    Agent,
    /// The runtime: containerd's own CNI configuration (rendered from the pod CIDR the
    /// agent sends with `UpdateRuntimeConfig`).
    Runtime,
}

/// Everything `rkubelet run` is configured with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The kubeconfig with the node's identity.
    pub kubeconfig: PathBuf,
    /// How the client certificate is bootstrapped and rotated.
    pub client_certificate: bootstrap::ClientCertificateConfig,
    /// The node's name.
    pub node_name: String,
    /// The node's IP.
    pub node_ip: IpAddr,
    /// The runtime's CRI client.
    pub cri: CriClient,
    /// Where the pods' start-up timelines are recorded (by the tracing layer) and read
    /// from (by the server and the debug socket).
    pub timelines: Arc<crate::timeline::Timelines>,
    /// `--root-dir`.
    pub root_dir: PathBuf,
    /// Pod log directories.
    pub pod_logs_dir: PathBuf,
    /// Who wires pod networks.
    pub network_owner: NetworkOwner,
    /// How pod traffic reaches the other nodes (`--pod-network-routes`).
    pub pod_network_routes: cni::routes::Mode,
    /// Where the agent finds CNI plugins.
    pub cni_bin_dirs: Vec<PathBuf>,
    /// Where the agent finds its conflist.
    pub cni_conf_dir: PathBuf,
    /// The runtime's CNI conf dir, where the agent installs its thin-plugin conflist.
    pub runtime_cni_conf_dir: PathBuf,
    /// The runtime's CNI bin dir, where the agent installs its thin plugin.
    pub runtime_cni_bin_dir: PathBuf,
    /// The cluster's DNS servers.
    pub cluster_dns: Vec<IpAddr>,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
    /// How many pods are set up in the runtime at once.
    pub parallel_pod_starts: usize,
    /// The host resolv.conf for `dnsPolicy: Default` pods; `None` gives them no resolver.
    pub resolv_conf: Option<PathBuf>,
    /// Node labels besides the defaults.
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// `--max-pods`.
    pub max_pods: u32,
    /// `--pod-cidr`: the pod CIDR when the registered Node has none (else the agent waits
    /// for the controller manager's).
    pub pod_cidr: Option<String>,
    /// `--provider-id`.
    pub provider_id: Option<String>,
    /// `--register-with-taints`.
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// `--kube-reserved`.
    pub kube_reserved: crate::node::Reservation,
    /// `--system-reserved`.
    pub system_reserved: crate::node::Reservation,
    /// `--eviction-pressure-transition-period`.
    pub eviction_pressure_transition_period: Duration,
    /// `--minimum-container-ttl-duration`, `--maximum-dead-containers[-per-container]`.
    pub container_gc: crate::kuberuntime::gc::ContainerGcPolicy,
    /// `--image-gc-high-threshold`, `--image-gc-low-threshold`, `--minimum-image-ttl-duration`.
    pub image_gc: crate::images::gc::ImageGcPolicy,
    /// `--pod-infra-container-image`: image GC never removes it (pods get the runtime's
    /// own sandbox image, which GC keeps too).
    pub pod_infra_container_image: String,
    /// `--eviction-hard`; `None` for the kubelet's defaults.
    pub eviction_hard: Option<crate::eviction::ParsedThresholds>,
    /// `--allowed-unsafe-sysctls`: sysctls (or `prefix*` patterns) pods may set besides
    /// the safe ones.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The kubelet API server; `None` when disabled (`--port 0`).
    pub server: Option<crate::server::ServerConfig>,
    /// `--cgroups-per-qos`: pod cgroups under the QoS hierarchy.
    pub cgroups_per_qos: bool,
    /// `--cgroup-root`: where the QoS hierarchy goes.
    pub cgroup_root: String,
    /// `--cgroup-driver`: `cgroupfs` or `systemd`, as the container runtime's.
    pub cgroup_driver: crate::cm::CgroupDriver,
    /// `--pod-manifest-path`: the static pods' manifests (a directory or one file).
    pub pod_manifest_path: Option<PathBuf>,
    /// `--file-check-frequency`: how often the manifests are read besides on changes.
    pub file_check_frequency: Duration,
    /// `--container-log-max-size`, `--container-log-max-files`.
    pub container_log_policy: crate::logs::LogRotatePolicy,
}

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The kubeconfig cannot be used.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The node could not be registered or configured.
    #[error(transparent)]
    Node(#[from] crate::node::NodeError),
    /// Pod networking could not be set up.
    #[error(transparent)]
    Cni(#[from] cni::CniError),
    /// The routes to other nodes' pods could not be set up.
    #[error(transparent)]
    Routes(#[from] cni::routes::RoutesError),
    /// The QoS cgroups could not be set up.
    #[error(transparent)]
    Cgroups(#[from] crate::cm::CmError),
    /// The device plugin registration could not be set up, or its server failed.
    #[error(transparent)]
    Devices(#[from] crate::cm::devicemanager::DeviceError),
    /// The admission configuration is invalid.
    #[error(transparent)]
    Admission(#[from] crate::lifecycle::admission::AdmissionError),
    /// A runtime call at start-up failed.
    #[error(transparent)]
    Cri(#[from] crate::cri::CriError),
    /// The kubelet API server could not start.
    #[error(transparent)]
    Server(#[from] crate::server::ServerError),
    /// The client certificate could not be bootstrapped or loaded.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    /// A task whose failure stops the agent failed.
    #[error(transparent)]
    Task(Box<Failure<AppError>>),
    /// The tasks were declared in an order the supervisor cannot follow.
    #[error(transparent)]
    Declaration(#[from] DeclarationError),
    /// The plugin manager's registration directory failed.
    #[error(transparent)]
    PluginManager(#[from] crate::pluginmanager::PluginManagerError),
    /// A file could not be read.
    #[error("{what}: {source}")]
    Io {
        /// What was being read.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

impl From<Failure<AppError>> for AppError {
    fn from(failure: Failure<AppError>) -> Self {
        Self::Task(Box::new(failure))
    }
}

/// Where the stats provider reads: the node's directories, and the cgroup all pods are
/// under (the kubelet's `GetPodCgroupRoot`: `kubepods` under `--cgroup-root` with
/// `--cgroups-per-qos`, else the cgroup root itself).
fn stats_config(config: &Config) -> crate::stats::StatsConfig {
    let root = crate::cm::CgroupName::from_cgroupfs(&config.cgroup_root);
    let pods = if config.cgroups_per_qos {
        root.child("kubepods")
    } else {
        root
    };
    crate::stats::StatsConfig {
        root_dir: config.root_dir.clone(),
        pods_cgroup: Some(config.cgroup_driver.path(&pods).to_string()),
        ..crate::stats::StatsConfig::default()
    }
}

/// The API server connection settings of a kubeconfig file.
///
/// # Errors
/// [`AppError::Kubeconfig`] when the file cannot be read or used.
pub async fn kube_config(path: &Path) -> Result<kube::Config, AppError> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| kubeconfig_error(path, e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| kubeconfig_error(path, e.to_string()))
}

fn kubeconfig_error(path: &Path, reason: String) -> AppError {
    AppError::Kubeconfig {
        path: path.to_owned(),
        reason,
    }
}

/// A client for `config` with a deadline on each request but watches (see
/// [`crate::kubeclient`]).
fn client_for(
    config: &kube::Config,
    path: &Path,
    deadline: Duration,
    identity: Option<&Arc<ClientIdentity>>,
) -> Result<kube::Client, AppError> {
    crate::kubeclient::build_with_identity(config, deadline, identity.cloned())
        .map_err(|e| kubeconfig_error(path, e.to_string()))
}

/// A Kubernetes client from a kubeconfig file, with the agent's dialer and request
/// deadline.
///
/// # Errors
/// [`AppError::Kubeconfig`] when the file cannot be read or used.
pub async fn kube_client(path: &Path) -> Result<kube::Client, AppError> {
    let config = kube_config(path).await?;
    client_for(&config, path, crate::kubeclient::REQUEST_TIMEOUT, None)
}

/// The client certificate as `--bootstrap-kubeconfig` and `--rotate-certificates` ask:
/// bootstrapped into `--kubeconfig` if that has none valid; with rotation, the identity
/// the clients present (renewed by a task started once the clients exist) and the
/// current certificate.
async fn client_certificate(
    config: &Config,
) -> Result<Option<(Arc<ClientIdentity>, ServingCertificate)>, AppError> {
    let certs = &config.client_certificate;
    if let Some(bootstrap) = &certs.bootstrap_kubeconfig {
        bootstrap::load_client_cert(&config.kubeconfig, bootstrap, certs, &config.node_name)
            .await?;
    }
    if !certs.rotate {
        return Ok(None);
    }
    let current = bootstrap::current_client_certificate(&config.kubeconfig, certs).await?;
    Ok(Some((ClientIdentity::new(&current), current)))
}

/// The agent's API clients: one with the request deadline, one with the kubelet's
/// heartbeat timeout for the lease and node status (so that a stalled connection cannot
/// outlast the lease), and the API server's address.
struct ApiClients {
    client: kube::Client,
    heartbeat: kube::Client,
    server: hyper::Uri,
}

async fn api_clients(
    config: &Config,
    identity: Option<&Arc<ClientIdentity>>,
) -> Result<ApiClients, AppError> {
    let kube_config = kube_config(&config.kubeconfig).await?;
    let client = |deadline| client_for(&kube_config, &config.kubeconfig, deadline, identity);
    Ok(ApiClients {
        client: client(crate::kubeclient::REQUEST_TIMEOUT)?,
        heartbeat: client(crate::kubeclient::HEARTBEAT_TIMEOUT)?,
        server: kube_config.cluster_url.clone(),
    })
}

/// The rotation of the client certificate, with `client` (authenticated by the current
/// one, so the CSR is auto-approved as the node's own renewal); it gives up, as the
/// kubelet exits, once the certificate has expired unrenewed.
fn client_rotation(
    config: &Config,
    client: kube::Client,
) -> Rotation<kube::Api<CertificateSigningRequest>> {
    Rotation {
        api: kube::Api::all(client),
        template: CsrTemplate::node_client(&config.node_name),
        store: config.client_certificate.store(),
        wait: bootstrap::ROTATION_WAIT,
        end_when_expired: Some(EXIT_AFTER_EXPIRY),
    }
}

/// Waits until the runtime answers `Version`; returns its name.
async fn wait_for_runtime(cri: &CriClient) -> String {
    let mut delay = Duration::from_millis(200);
    loop {
        match cri.version(crate::cri::version_request()).await {
            Ok(v) => {
                tracing::info!(runtime = %v.runtime_name, version = %v.runtime_version, api = %v.runtime_api_version, "container runtime is up");
                return v.runtime_name;
            }
            Err(e) => {
                tracing::warn!(endpoint = %cri.endpoint(), error = %e, "container runtime not answering; retrying")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(7));
    }
}

/// The PLEG's health, for the node's Ready condition.
struct PlegCheck(Arc<Pleg>);

impl ReadinessCheck for PlegCheck {
    fn name(&self) -> &str {
        "PLEG"
    }
    fn check(&self) -> Result<(), String> {
        self.0
            .healthy()
            .map_err(|e| format!("PLEG is not healthy: {e}"))
    }
}

/// The node agent for `config`, reporting the PLEG's health in its Ready condition and
/// the device plugins' resources.
fn node_agent(
    config: &Config,
    client: kube::Client,
    pleg: &Arc<Pleg>,
    devices: &Arc<DeviceManager>,
) -> Result<Arc<NodeAgent>, AppError> {
    let mut node_config = NodeConfig::new(config.node_name.clone(), config.node_ip);
    node_config.root_dir = config.root_dir.clone();
    node_config.max_pods = config.max_pods;
    node_config.eviction_pressure_transition_period = config.eviction_pressure_transition_period;
    if let Some(parsed) = &config.eviction_hard {
        node_config.eviction_hard = parsed.hard;
        for statement in &parsed.ignored {
            tracing::warn!(
                statement,
                "eviction threshold ignored: rkubelet enforces allocatable memory through the pods' cgroup, not by eviction"
            );
        }
    }
    node_config.labels = config.node_labels.clone();
    node_config.provider_id = config.provider_id.clone();
    node_config.register_with_taints = config.register_with_taints.clone();
    node_config.kube_reserved = config.kube_reserved;
    node_config.system_reserved = config.system_reserved;
    if let Some(server) = &config.server {
        node_config.daemon_port = server.port;
    }
    let checks: Vec<Arc<dyn ReadinessCheck>> = vec![Arc::new(PlegCheck(pleg.clone()))];
    let devices = devices.clone();
    let extended = Box::new(move || {
        let c = devices.capacity();
        crate::node::ExtendedResources {
            capacity: c.capacity,
            allocatable: c.allocatable,
            removed: c.removed,
        }
    });
    Ok(Arc::new(
        NodeAgent::new(
            client,
            node_config,
            Arc::new(LinuxMachine),
            Arc::new(config.cri.clone()),
            checks,
        )?
        .with_extended_resources(extended),
    ))
}

/// Waits up to `timeout` for the runtime to report NetworkReady (containerd notices a new
/// CNI config asynchronously).
async fn wait_for_network_ready(cri: &CriClient, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let ready = cri
            .status(api::StatusRequest { verbose: false })
            .await
            .is_ok_and(|s| RuntimeHealth::from(&s).network.ready);
        if ready || tokio::time::Instant::now() >= deadline {
            if !ready {
                tracing::warn!("the runtime does not report NetworkReady yet");
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How often, and after what age, leaked pod network attachments are released.
const NETWORK_GC: Duration = Duration::from_secs(30);
/// How often freed heap pages go back to the kernel.
const TRIM_PERIOD: Duration = Duration::from_secs(10);

async fn collect_network_garbage(cri: &CriClient, cni: &Cni, min_age: Duration) {
    // Read before the list: a RunPodSandbox under way now may return (its sandbox then
    // listed or not) while the list is taken, and its attachment must still count as
    // possibly being created.
    let creating_since = cri.sandbox_creations_since();
    let listed = cri
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
        .await;
    match listed {
        Ok(resp) => {
            let live = resp.items.into_iter().map(|s| s.id).collect();
            cni.garbage_collect(&live, min_age, creating_since).await;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot list sandboxes; network garbage collection skipped")
        }
    }
}

async fn network_gc_loop(cri: CriClient, cni: Arc<Cni>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(NETWORK_GC) => collect_network_garbage(&cri, &cni, NETWORK_GC).await,
        }
    }
}

/// The image collector the agent runs: the runtime's images on its image filesystem.
pub type RuntimeImageGc = ImageGc<CriClient, RuntimeImageFs<CriClient>>;

/// The container log manager and the container and image garbage collectors (the kubelet's
/// `containerLogManager.Start` and `StartGarbageCollection`). The collectors also reclaim
/// disk on demand (in this order, as the eviction manager's node reclaim functions); the
/// container collector removes a container's log files through the log manager.
fn garbage_collectors(
    config: &Config,
) -> (
    Arc<ContainerGc<CriClient>>,
    Arc<RuntimeImageGc>,
    Arc<ContainerLogManager<CriClient>>,
) {
    let cri = Arc::new(config.cri.clone());
    let logs = Arc::new(ContainerLogManager::new(
        cri.clone(),
        config.container_log_policy,
    ));
    let containers = Arc::new(ContainerGc::new(
        cri.clone(),
        config.container_gc,
        logs.clone(),
    ));
    let images = Arc::new(ImageGc::new(
        cri.clone(),
        RuntimeImageFs::new(cri),
        config.image_gc,
        config.pod_infra_container_image.clone(),
    ));
    (containers, images, logs)
}

/// Pod networking as set up: the routes to the other nodes' pods to keep programmed, and,
/// when the agent owns the network, its CNI with the thin plugin's socket to serve.
struct PodNetwork {
    routes: Option<cni::routes::Programmer<cni::routes::IpRoute2>>,
    agent: Option<(Arc<Cni>, cni::shim::ShimListener)>,
}

/// Sets up pod networking on `pod_cidr`: the routes first, then the network for the
/// MTU they need the pods to have.
async fn pod_network(
    config: &Config,
    pod_cidr: &str,
    api_server: &hyper::Uri,
) -> Result<PodNetwork, AppError> {
    let routes = start_routes(config, pod_cidr, api_server).await?;
    let pod_mtu = routes.as_ref().and_then(cni::routes::Programmer::pod_mtu);
    let agent = setup_network(config, pod_cidr, pod_mtu).await?;
    Ok(PodNetwork { routes, agent })
}

/// Turns on the forwarding pod networking needs (when the agent owns it or routes between
/// nodes) and sets up the routes to the other nodes' pods, when asked for.
async fn start_routes(
    config: &Config,
    pod_cidr: &str,
    api_server: &hyper::Uri,
) -> Result<Option<cni::routes::Programmer<cni::routes::IpRoute2>>, AppError> {
    use cni::routes::{IpRoute2, Mode, Programmer, Settings, sysctl};
    let mode = config.pod_network_routes;
    // As kubenet, a setting that cannot be made is a warning, not a failure to start.
    if (config.network_owner == NetworkOwner::Agent || mode != Mode::None)
        && let Err(e) = sysctl::enable_forwarding(Path::new("/proc/sys")).await
    {
        tracing::warn!(error = %e, "could not turn on forwarding for pod networking");
    }
    if mode == Mode::None {
        return Ok(None);
    }
    let settings = Settings {
        mode,
        node_name: config.node_name.clone(),
        node_ip: config.node_ip,
        pod_cidr: pod_cidr.to_owned(),
        api_server: cni::routes::api_server_addresses(api_server).await,
    };
    Ok(Some(
        Programmer::start(IpRoute2::default(), &settings).await?,
    ))
}

/// Sets up pod networking for the chosen owner; `pod_mtu` is the MTU the routes need the
/// pods to have. When the agent owns it, answers its CNI and the thin plugin's socket,
/// bound and installed in the runtime's CNI config (connections wait in the socket's
/// backlog until it is served).
async fn setup_network(
    config: &Config,
    pod_cidr: &str,
    pod_mtu: Option<u32>,
) -> Result<Option<(Arc<Cni>, cni::shim::ShimListener)>, AppError> {
    match config.network_owner {
        NetworkOwner::Runtime => {
            cni::shim::uninstall(&config.runtime_cni_conf_dir, &config.runtime_cni_bin_dir).await?;
            config
                .cri
                .update_runtime_config(api::UpdateRuntimeConfigRequest {
                    runtime_config: Some(api::RuntimeConfig {
                        network_config: Some(api::NetworkConfig {
                            pod_cidr: pod_cidr.to_owned(),
                        }),
                    }),
                })
                .await?;
            if let Some(mtu) = pod_mtu {
                tracing::warn!(
                    mtu,
                    "the runtime's CNI config must give the pods this MTU itself"
                );
            }
            tracing::info!(pod_cidr, "pod networking owned by the runtime");
            Ok(None)
        }
        NetworkOwner::Agent => {
            let mut network = cni::load_conflist(&config.cni_conf_dir, pod_cidr).await?;
            if let Some(mtu) = pod_mtu {
                network = network.with_bridge_mtu(mtu);
            }
            for bridge in network.bridges() {
                cni::reconcile_bridge(&cni::IpBridgeOps, bridge, pod_cidr).await?;
            }
            let cni = Arc::new(Cni::new(
                network,
                config.cni_bin_dirs.clone(),
                config.root_dir.join("cni"),
                ProcessExec::new(Duration::from_secs(60)),
            ));
            cni.verify_plugins().await?;
            // Before the socket serves, no ADD of ours is under way: every attachment whose
            // sandbox is gone leaked (an agent crash in the middle of an ADD), and so did
            // every temporary of the result cache.
            cni.sweep_cache().await?;
            collect_network_garbage(&config.cri, &cni, Duration::ZERO).await;
            let socket = config.root_dir.join("cni.sock");
            let listener = cni::shim::bind(&socket)?;
            let exe = std::env::current_exe().map_err(|source| AppError::Io {
                what: "finding the agent's own binary".into(),
                source,
            })?;
            cni::shim::install(
                &config.runtime_cni_conf_dir,
                &config.runtime_cni_bin_dir,
                &exe,
                &socket,
            )
            .await?;
            tracing::info!(pod_cidr, socket = %socket.display(), "pod networking owned by the agent");
            Ok(Some((cni, listener)))
        }
    }
}

/// Serves the thin plugin's socket until `stop` fires, then takes the thin plugin out of
/// the runtime's CNI config: without the agent, containerd must not be sent to a socket
/// nobody serves.
async fn serve_shim(
    listener: cni::shim::ShimListener,
    cni: Arc<Cni>,
    (conf_dir, bin_dir): (PathBuf, PathBuf),
    stop: CancellationToken,
) {
    tokio::select! {
        () = listener.serve(cni) => {}
        () = stop.cancelled() => {}
    }
    if let Err(e) = cni::shim::uninstall(&conf_dir, &bin_dir).await {
        tracing::warn!(error = %e, "could not remove the thin plugin from the runtime's CNI config");
    }
}

/// The node's capacity as registered (CPU, memory) and `kernel.pid_max`: what the
/// `kubepods` cgroup is sized to.
async fn node_capacity(node: &Node) -> NodeCapacity {
    let capacity = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .unwrap_or_default();
    let get = |name: &str, milli: bool| {
        capacity
            .get(name)
            .and_then(|q| Quantity::parse(&q.0).ok())
            .map(|q| if milli { q.milli_value() } else { q.value() })
            .and_then(|v| i64::try_from(v).ok())
            .unwrap_or(0)
    };
    let pids = tokio::task::spawn_blocking(|| LinuxMachine.pid_usage())
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|p| i64::try_from(p.max).ok())
        .unwrap_or(0);
    NodeCapacity {
        cpu_millis: get("cpu", true),
        memory_bytes: get("memory", false),
        pids,
        hugepages: crate::cm::hugepage_limits(Some(&capacity)),
    }
}

/// What the kubelet is made of besides the configuration, gathered while starting.
struct KubeletParts {
    client: kube::Client,
    registered: Node,
    runtime_name: String,
    events: EventRecorder,
    status: StatusManager,
    wake: Wake,
    node_store: kube::runtime::reflector::Store<Node>,
    services: ServiceLister,
    sysctls: SysctlWhitelist,
    cgroup_driver: crate::cm::HostDriver,
    log_starts: crate::logs::StartedContainers,
    csi: Arc<CsiPlugin>,
    devices: Arc<DeviceManager>,
    /// The eviction manager's node conditions, which admission reads.
    conditions: NodeConditions,
    pleg: Arc<Pleg>,
}

/// The kubelet: sandbox settings, Secrets and ConfigMaps from one watch per referenced
/// object (a changed one wakes the pods that use it), volumes, the QoS cgroups sized to
/// the registered capacity, and admission reading the node from `node_store` and the
/// pressure from the eviction manager's `conditions`.
async fn kubelet(
    config: &Config,
    parts: KubeletParts,
) -> Result<Arc<Kubelet<CriClient>>, AppError> {
    let KubeletParts {
        client,
        registered,
        runtime_name,
        events,
        status,
        wake,
        node_store,
        services,
        sysctls,
        cgroup_driver,
        log_starts,
        csi,
        devices,
        conditions,
        pleg,
    } = parts;
    let host_dns = match &config.resolv_conf {
        Some(path) => Some(HostDns::parse(
            &tokio::fs::read_to_string(path)
                .await
                .map_err(|source| AppError::Io {
                    what: format!("reading {}", path.display()),
                    source,
                })?,
        )),
        None => None,
    };
    let sandbox_settings = SandboxSettings {
        dns: dns::Configurer {
            cluster_dns: config.cluster_dns.clone(),
            cluster_domain: config.cluster_domain.clone(),
            host: host_dns,
            node_ips: vec![config.node_ip],
        },
        pod_logs_dir: config.pod_logs_dir.clone(),
        qos_containers: config
            .cgroups_per_qos
            .then(|| crate::cm::QosContainers::new(&config.cgroup_root, config.cgroup_driver)),
    };
    let allocatable = registered
        .status
        .as_ref()
        .and_then(|s| s.allocatable.clone())
        .unwrap_or_default();
    let caches = SourceCaches::new(&client, &wake);
    let env_sources = EnvSourceReader::new(caches.clone(), services, allocatable.clone());
    let volumes = VolumeManager::new(
        config.root_dir.clone(),
        KubePodObjects::new(client.clone(), caches)
            .with_node(node_store.clone(), &config.node_name),
        LinuxMounter,
    )
    .with_node_allocatable(allocatable)
    .with_csi(csi);
    let capacity = node_capacity(&registered).await;
    let memory_capacity = u64::try_from(capacity.memory_bytes).unwrap_or(0);
    let cm = if config.cgroups_per_qos {
        let cm = ContainerManager::for_host(&config.cgroup_root, capacity, &cgroup_driver).await?;
        cm.start().await?;
        Some(Arc::new(cm))
    } else {
        None
    };
    Ok(Arc::new(
        Kubelet::new(
            SyncSettings {
                node_name: config.node_name.clone(),
                node_ip: config.node_ip,
                root_dir: config.root_dir.clone(),
                pod_logs_dir: config.pod_logs_dir.clone(),
                runtime_name,
                memory_capacity,
            },
            RuntimeManager::new(
                config.cri.clone(),
                sandbox_settings,
                Some(config.node_ip),
                events,
                config.parallel_pod_starts,
            )
            .with_log_starts(log_starts)
            .with_devices(devices.clone()),
            volumes,
            status,
            PodAdmitter::new(node_store, registered, sysctls, client)
                .with_devices(devices)
                .with_conditions(conditions.clone()),
            wake,
            env_sources,
            cm,
        )
        .with_pleg(pleg),
    ))
}

/// Starts the plugin manager with the CSI plugin's registration handler (the node's CSINode
/// made first, as the kubelet does); the CSI volume plugin of the drivers it registers.
fn plugin_manager(
    config: &Config,
    tree: &mut Tree,
    client: &kube::Client,
) -> Result<Arc<CsiPlugin>, AppError> {
    use crate::pluginmanager::{CSI_PLUGIN, Handlers, PluginHandler, PluginManager};
    let drivers = Drivers::default();
    let node_info = Arc::new(KubeNodeInfo::new(client.clone(), config.node_name.clone()));
    let handler =
        RegistrationHandler::new(drivers.clone(), Arc::new(GrpcConnector), node_info.clone());
    let handlers: Handlers = [(
        CSI_PLUGIN.to_owned(),
        Arc::new(handler) as Arc<dyn PluginHandler>,
    )]
    .into();
    let dir = crate::pluginmanager::registry_dir(&config.root_dir);
    let run = Run::again(
        (dir, handlers, node_info),
        |(dir, handlers, node_info), stop| async move {
            if let Err(e) = node_info.initialize().await {
                tracing::warn!(error = %e, "creating the node's CSINode");
            }
            PluginManager::new(dir, handlers).run(stop).await
        },
    );
    tree.start("plugin-manager", run.dropped_on_stop())?;
    Ok(Arc::new(CsiPlugin::new(
        config.root_dir.clone(),
        config.node_name.clone(),
        drivers,
        Arc::new(GrpcConnector),
        Arc::new(KubeCsiObjects(client.clone())),
        Arc::new(LinuxMounter),
    )))
}

/// The pod workers' wake-up, usable before they exist: the PLEG and the caches wake
/// nothing until the workers are set in the returned cell.
fn wake_pod_workers() -> (Wake, Arc<OnceLock<PodWorkers<Kubelet<CriClient>>>>) {
    let cell: Arc<OnceLock<PodWorkers<Kubelet<CriClient>>>> = Arc::default();
    let workers = cell.clone();
    let wake: Wake = Arc::new(move |uid: &str, why| {
        if let Some(workers) = workers.get() {
            workers.wake(uid, why);
        }
    });
    (wake, cell)
}

/// How long the tasks have, in all, to stop by themselves once asked (SIGTERM must end
/// the agent within 10 s).
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// A task restarted after a failure, as the kubelet's loops under `wait.Until`: after
/// 1 s, doubling to 1 min while it keeps failing.
fn restarted() -> OnFailure {
    OnFailure::Restart(Backoff::new(
        Duration::from_secs(1),
        Duration::from_secs(60),
    ))
}

type Tree = Supervisor<AppError>;

/// Runs the agent until `cancel` fires: its tasks, declared here in start order (they
/// stop in reverse), are started by [`start`] between the start-up steps they need.
///
/// A task that owns what it runs with (a watch and its store, a bound socket) cannot be
/// made again: its failure stops the agent, as a crash stops the kubelet, and the service
/// manager restarts it. The kubelet's `wait.Until` loops are restarted with back-off.
/// Failures of best-effort tasks (events, the debug socket) are logged. When they stop,
/// the tasks with work to finish (the heartbeats, the rotation, the server, the routes,
/// the CNI shim taking the thin plugin out of the runtime's config) end by themselves;
/// the others are dropped where they wait.
///
/// # Errors
/// Start-up failures, and the failure of a task that stops the agent.
pub async fn run(config: Config, cancel: CancellationToken) -> Result<(), AppError> {
    use OnFailure::{Ignore, Stop};
    let tree = vec![
        // The kubelet exits once its client certificate expired unrenewed.
        Task::new("client-certificate", Stop),
        Task::new("events", Ignore),
        Task::new("status-manager", restarted()),
        // Before the node registers, so the first status it reports is Ready.
        Task::new("pleg", restarted()),
        // The kubelet's device manager owns its bound registration socket.
        Task::new("device-manager", Stop),
        Task::new("node-informer", Stop),
        Task::new("network-gc", restarted()),
        Task::new("cni-shim", Stop),
        Task::new("pod-network-routes", Stop),
        Task::new("node-lease", restarted()).after(&["pleg"]),
        Task::new("node-status", restarted()).after(&["pleg"]),
        Task::new("service-informer", Stop),
        // The kubelet's pluginManager.Run: registration sockets of CSI drivers.
        Task::new("plugin-manager", restarted()),
        Task::new("static-pods", Stop).after(&["pleg", "status-manager"]),
        Task::new("pod-source", Stop).after(&["pleg", "status-manager"]),
        Task::new("mirror-pods", restarted()).after(&["pod-source"]),
        // cAdvisor's housekeeping: the stats every reader shares, read in the background.
        Task::new("stats-housekeeping", restarted()).after(&["pod-source"]),
        // As the kubelet's ListenAndServe, a server that fails ends the agent.
        Task::new("server", Stop).after(&["pod-source", "status-manager"]),
        Task::new("debug-socket", Ignore),
        // The kubelet's containerLogManager.Start runs its rotation under wait.Until.
        Task::new("container-logs", restarted()),
        Task::new("container-gc", restarted()),
        Task::new("image-gc", restarted()),
        Task::new("eviction", Stop).after(&["pod-source", "container-gc", "image-gc"]),
        Task::new("housekeeping", restarted()).after(&["pod-source", "pleg"]),
        Task::new("heap-trim", restarted()),
    ];
    let mut tree = Tree::new(&cancel, STOP_WITHIN, tree);
    if !start(&config, &mut tree).await? {
        return Ok(tree.stop().await?);
    }
    tracing::info!(node = %config.node_name, "rkubelet running");
    let stopped = tree.run().await;
    tracing::info!("rkubelet stopped; pods keep running");
    Ok(stopped?)
}

/// The start-up steps, each task of `tree` started once what it needs is ready; `false`
/// when a stop came during a step that ends on stop.
async fn start(config: &Config, tree: &mut Tree) -> Result<bool, AppError> {
    let sysctls = SysctlWhitelist::new(&config.allowed_unsafe_sysctls)?;
    // The systemd driver connects now: a host without systemd stops here.
    let cgroup_driver = crate::cm::HostDriver::connect(config.cgroup_driver).await?;
    // The bootstrap waits (up to an hour) for its CSR; a stop ends the wait, and the key it
    // keeps under --cert-dir lets the next start ask again under the same CSR.
    let Some(rotating) = tree.step(client_certificate(config)).await.transpose()? else {
        tracing::info!("stopped while waiting for the client certificate");
        return Ok(false);
    };
    let api = api_clients(config, rotating.as_ref().map(|(identity, _)| identity)).await?;
    let client = api.client.clone();
    if let Some((identity, current)) = rotating {
        let rotation = client_rotation(config, client.clone());
        tree.start(
            "client-certificate",
            Run::once(move |stop| {
                rotation.run(Some(current), move |cert| identity.set(&cert), stop)
            }),
        )?;
    }
    let Some(runtime_name) = tree.step(wait_for_runtime(&config.cri)).await else {
        return Ok(false);
    };
    crate::cm::check_runtime_driver(config.cgroup_driver, &config.cri).await?;
    let (events, event_rx) = EventRecorder::channel();
    let publish = events::publish(client.clone(), config.node_name.clone(), event_rx);
    tree.start("events", Run::once(|_| publish).dropped_on_stop())?;
    let status = StatusManager::new(client.clone());
    let run_status = Run::again(status.clone(), |status, _| status.run());
    tree.start("status-manager", run_status.dropped_on_stop())?;
    let (pleg, cri) = (Arc::new(Pleg::default()), Arc::new(config.cri.clone()));
    // The PLEG's wake-ups reach the pod workers once they exist.
    let (wake, workers_cell) = wake_pod_workers();
    let relist = Run::again((pleg.clone(), cri, wake.clone()), |(pleg, cri, wake), _| {
        pleg.run(cri, move |uid| wake(uid, WakeFor::Runtime))
    });
    tree.start("pleg", relist.dropped_on_stop())?;
    pleg.wait_for_first_relist(Duration::from_secs(10)).await;
    // Before the node reports its capacity and pods are admitted: the checkpoint is read.
    let trigger = StatusTrigger::default();
    let changed = trigger.clone();
    let (devices, registration) = DeviceManager::start(
        &config
            .root_dir
            .join(crate::cm::devicemanager::DEVICE_PLUGIN_DIR),
        Box::new(move || changed.update_now()),
    )?;
    tree.start("device-manager", Run::once(|stop| registration.run(stop)))?;
    let node = node_agent(config, api.heartbeat, &pleg, &devices)?;
    let registered = node.register(tree.stopping()).await?;
    // Admission reads the node's labels and allocatable from a watch on it.
    let (node_store, node_feed) = crate::node::node_lister(client.clone(), &config.node_name);
    tree.start("node-informer", Run::once(|_| node_feed).dropped_on_stop())?;
    let pod_cidr = match crate::node::pod_cidr_at_start(&registered, config.pod_cidr.as_deref()) {
        Some(cidr) => cidr,
        None => wait_for_pod_cidr(&client, &config.node_name, Duration::from_secs(120)).await?,
    };
    let network = pod_network(config, &pod_cidr, &api.server).await?;
    if let Some((cni, listener)) = network.agent {
        let gc = (config.cri.clone(), cni.clone());
        let collect = Run::again(gc, |(cri, cni), stop| network_gc_loop(cri, cni, stop));
        tree.start("network-gc", collect.dropped_on_stop())?;
        let dirs = (
            config.runtime_cni_conf_dir.clone(),
            config.runtime_cni_bin_dir.clone(),
        );
        tree.start(
            "cni-shim",
            Run::once(|stop| serve_shim(listener, cni, dirs, stop)),
        )?;
    }
    if let Some(routes) = network.routes {
        let state = config.root_dir.join(cni::routes::STATE_FILE);
        let client = client.clone();
        let program = Run::once(|stop| cni::routes::run(routes, client, state, stop));
        tree.start("pod-network-routes", program)?;
    }
    wait_for_network_ready(&config.cri, Duration::from_secs(5)).await;
    tree.start(
        "node-lease",
        Run::again(node.clone(), |node, stop| node.lease().run(stop)),
    )?;
    let update = Run::again((node.clone(), trigger.clone()), |(node, trigger), stop| {
        node.run_status_loop(stop, trigger)
    });
    tree.start("node-status", update)?;
    // The network was set up after the first status: report it now, not in 10 s.
    trigger.update_now();
    let (services, services_feed) = ServiceLister::start(client.clone());
    tree.start(
        "service-informer",
        Run::once(|_| services_feed).dropped_on_stop(),
    )?;
    let (containers, images, logs) = garbage_collectors(config);
    let csi = plugin_manager(config, tree, &client)?;
    let conditions = NodeConditions::default();
    let parts = KubeletParts {
        client: client.clone(),
        registered,
        runtime_name,
        events,
        status: status.clone(),
        wake,
        node_store,
        services,
        sysctls,
        cgroup_driver,
        log_starts: logs.starts(),
        csi,
        devices,
        conditions: conditions.clone(),
        pleg: pleg.clone(),
    };
    let kubelet = kubelet(config, parts).await?;
    let workers = PodWorkers::new(kubelet.clone(), kubelet.pod_states().clone());
    let _ = workers_cell.set(workers.clone());
    let statics = match config.pod_manifest_path {
        Some(_) => StaticPods::unlisted(),
        None => StaticPods::default(),
    };
    if let Some(path) = &config.pod_manifest_path {
        let file = FileConfig {
            path: path.clone(),
            check_frequency: config.file_check_frequency,
            node_name: config.node_name.clone(),
        };
        let feed =
            crate::pod::file::start(file, workers.clone(), kubelet.clone(), statics.clone()).await;
        tree.start("static-pods", Run::once(|_| feed).dropped_on_stop())?;
    }
    let (store, feed) = crate::pod::source::start(
        client.clone(),
        &config.node_name,
        workers.clone(),
        kubelet.clone(),
        statics.clone(),
    );
    tree.start("pod-source", Run::once(|_| feed).dropped_on_stop())?;
    // Also without static pods: mirror pods left from an earlier configuration go.
    let mirror_client = KubeMirrorClient::new(client.clone(), config.node_name.clone());
    let mirrors = (
        mirror_client,
        config.node_name.clone(),
        statics,
        store.clone(),
    );
    let mirror = Run::again(mirrors, |(m, node, statics, store), stop| {
        mirror::run(m, node, statics, store, stop)
    });
    tree.start("mirror-pods", mirror.dropped_on_stop())?;
    let stats = Arc::new(crate::stats::Housekeeping::new(
        stats_config(config),
        config.node_name.clone(),
        (config.cri.clone(), LinuxMachine),
        Box::new(store.clone()),
        // Claims (and, once mounted here, CSI volumes) report their figures through it.
        Box::new(kubelet.mounted_volumes()),
    ));
    let housekeep = Run::again(stats.clone(), |stats, stop| stats.run(stop));
    tree.start("stats-housekeeping", housekeep.dropped_on_stop())?;
    if let Some(server) = config.server.clone() {
        let serving = crate::server::start(
            server,
            client,
            config.cri.clone(),
            store.clone(),
            config.timelines.clone(),
            status,
            stats.clone(),
        )
        .await?;
        tree.start("server", Run::once(|stop| serving.run(stop)))?;
    }
    // Without its debug socket the agent still runs; only `inspect timeline` cannot ask it.
    match crate::server::debug::bind(&config.root_dir) {
        Ok(socket) => {
            let timelines = config.timelines.clone();
            let serve = Run::once(|_| crate::server::debug::serve(socket, timelines));
            tree.start("debug-socket", serve.dropped_on_stop())?;
        }
        Err(e) => {
            tracing::warn!(error = %e, "no debug socket: `rkubelet inspect timeline` cannot reach this agent")
        }
    }
    let rotate = Run::again(logs, |logs, stop| {
        logs.run(crate::logs::LOG_MONITOR_PERIOD, stop)
    });
    tree.start("container-logs", rotate.dropped_on_stop())?;
    let collect = Run::again(containers.clone(), ContainerGc::run);
    tree.start("container-gc", collect.dropped_on_stop())?;
    let collect = Run::again(images.clone(), RuntimeImageGc::run);
    tree.start("image-gc", collect.dropped_on_stop())?;
    let stats = crate::kubelet::eviction_stats::NodeStats::new(stats, config.root_dir.clone());
    let pods =
        crate::kubelet::evictor::KubeletPods::new(store.clone(), workers.clone(), kubelet.clone());
    let hard = node.config().eviction_hard;
    let transition = node.config().eviction_pressure_transition_period;
    let eviction = crate::eviction::EvictionManager::new(hard, stats, pods, (containers, images))
        .with_conditions(conditions, transition);
    let evict = Run::once(|stop| eviction.run(stop));
    tree.start("eviction", evict.dropped_on_stop())?;
    let kept = (store, workers, pleg, kubelet);
    let housekeep = Run::again(kept, |(store, workers, pleg, kubelet), stop| {
        housekeeping(store, workers, pleg, kubelet, stop)
    });
    tree.start("housekeeping", housekeep.dropped_on_stop())?;
    let trim = Run::again((), |(), _| crate::allocator::trim_every(TRIM_PERIOD));
    tree.start("heap-trim", trim.dropped_on_stop())?;
    Ok(true)
}
