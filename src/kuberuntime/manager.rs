//! Carries out a pod's actions against the runtime, in the kubelet's order: sandbox (and
//! with it the pod's network), then for each container image, create, start. Also stops
//! pods. Dead containers and sandboxes are left to the garbage collector ([`super::gc`]).
//!
//! Pods are set up a bounded number at a time, through the start gate
//! ([`super::start_gate`]): past a handful of concurrent sandboxes the runtime only gets
//! slower on a small machine, and a pod that holds a turn finishes sooner than a hundred
//! that share the runtime. Each sandbox run, container create and start tells the gate how
//! long it took; a pod lends its turn during an image download and a postStart hook, and
//! the prober lends the gate one while each exec probe runs.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use tokio::sync::Semaphore;
use tracing::Instrument;

mod kill;

use super::actions::{PodActions, compute_pod_actions};
use super::container::container_config;
use super::context::{ConfigError, ContainerContext, EnvSources};
use super::crash_backoff::{self, CrashBackoff, SpecKey};
use super::env::{EnvSourceReader, environment};
use super::names;
use super::runtime_status::{PodRuntimeStatus, pod_ips, primary_ip};
use super::sandbox::{SandboxSettings, pod_log_dir, sandbox_config};
use super::security_context::{ImageUser, image_user};
use super::start_gate::{Priority, StartCall, StartGate, StartTurn};
use crate::cri::{Cri, api};
use crate::events::{EventRecorder, Involved};
use crate::images::ImageManager;
use crate::lifecycle::handlers::run_hook;
use crate::pod::PodId;
use crate::pod::state::ForgetPod;
use crate::probe::results::Results;
use crate::volume::PodVolumes;

/// The kubelet's minimum time between a container's stop signal and SIGKILL.
const MIN_GRACE_SECONDS: i64 = 2;

/// One container to stop, with what its preStop hook needs.
struct Stop<'a> {
    pod: &'a PodId,
    container_id: &'a str,
    name: &'a str,
    /// Its spec, when the pod is known: a container of a pod gone from the API runs no
    /// hook.
    spec: Option<&'a Container>,
    /// The pod's IP, the default host of an HTTP hook.
    pod_ip: &'a str,
}

/// Why a container is waiting, for its status (the kubelet's reason cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// `ErrImagePull`, `CrashLoopBackOff`, `CreateContainerConfigError`, ...
    pub reason: String,
    /// The details.
    pub message: String,
}

/// What one sync achieved and what is still wrong.
#[derive(Debug, Clone, Default)]
pub struct SyncOutcome {
    /// Containers that could not be started, by name.
    pub waiting: HashMap<String, Waiting>,
    /// The sandbox could not be made.
    pub sandbox_error: Option<String>,
    /// Sync again after this long (a back-off ends), if nothing else happens first.
    pub retry_after: Option<Duration>,
    /// The sync asked the runtime to change something (stop, create, start): the pod's
    /// runtime state must be read again for its status.
    pub acted: bool,
}

impl SyncOutcome {
    fn retry_in(&mut self, after: Duration) {
        self.retry_after = Some(self.retry_after.map_or(after, |r| r.min(after)));
    }
}

/// Host-side facts a pod's containers need.
#[derive(Debug)]
pub struct PodContext {
    /// `<root-dir>/pods/<uid>`.
    pub pod_dir: PathBuf,
    /// The node's name.
    pub node_name: String,
    /// The node's IP.
    pub host_ip: Option<IpAddr>,
    /// The pod's volumes, set up by the volume manager; each container's mounts are
    /// resolved from them when it is created.
    pub volumes: PodVolumes,
    /// The handler of the pod's RuntimeClass for a new sandbox; empty for the default.
    pub runtime_handler: String,
    /// The prober's results (liveness and startup failures restart containers).
    pub probes: Option<Arc<Results>>,
    /// Where the containers' Secrets, ConfigMaps and Services are read from.
    pub sources: EnvSourceReader,
    /// What was read from `sources`: once per sync, when the first container starts.
    pub env_sources: tokio::sync::OnceCell<Arc<EnvSources>>,
    /// The pod's image pull secrets that could be read.
    pub pull_secrets: Vec<Secret>,
    /// Where the node's `Localhost` seccomp profiles live (`<root-dir>/seccomp`).
    pub seccomp_profile_root: PathBuf,
    /// The node's memory capacity in bytes (containers' OOM scores).
    pub memory_capacity: u64,
}

/// The kubelet's `kubeGenericRuntimeManager`: pod-level operations over CRI.
#[derive(Debug)]
pub struct RuntimeManager<C> {
    cri: C,
    images: ImageManager,
    settings: SandboxSettings,
    events: EventRecorder,
    crash_backoff: Mutex<CrashBackoff>,
    start_gate: Arc<StartGate>,
    /// Sandbox stops (CNI DEL chains) in flight at once: as many as the start gate's first
    /// turns (half the ceiling).
    stop_slots: Semaphore,
    /// The sandboxes each pod (by UID) had stopped: a stopped sandbox never runs again,
    /// so a repeated kill (a termination started over) neither queues for a stop slot nor
    /// makes the runtime run its CNI `DEL` chain once more. Forgotten with the pod.
    stopped_sandboxes: Mutex<HashMap<String, HashSet<String>>>,
    /// The node's IP, which a pod on the host's network has (its hooks' default host).
    host_ip: Option<IpAddr>,
    /// Told of each container started, to watch its log from the start.
    log_starts: Option<crate::logs::StartedContainers>,
    /// The device manager: a container's devices, mounts, env and annotations.
    devices: Option<Arc<crate::cm::devicemanager::DeviceManager>>,
}

/// A pod's turn to be set up in the runtime: held from the sandbox to its last container
/// start, given back during a long image pull and a postStart hook.
struct StartSlot {
    gate: Arc<StartGate>,
    turn: Option<StartTurn>,
    /// Whether the pod had a turn in this sync or has a sandbox: it then goes first.
    begun: bool,
}

impl StartSlot {
    /// Waits for a turn, unless this pod holds one.
    async fn hold(&mut self) {
        if self.turn.is_none() {
            let priority = if self.begun {
                Priority::Begun
            } else {
                Priority::New
            };
            self.turn = Some(
                self.gate
                    .enter(priority)
                    .instrument(tracing::info_span!("wait_start_slot"))
                    .await,
            );
            self.begun = true;
        }
    }

    fn release(&mut self) {
        self.turn = None;
    }

    /// Runs `work` (an image pull), keeping the turn if it is done before `quick` ends (a
    /// timer), else giving it to another pod until it is done; then holds a turn again,
    /// first in line.
    async fn across<F: Future>(&mut self, quick: impl Future<Output = ()>, work: F) -> F::Output {
        tokio::pin!(work);
        let done = tokio::select! {
            biased;
            done = &mut work => done,
            () = quick => {
                self.release();
                work.await
            }
        };
        self.hold().await;
        done
    }
}

/// An image pull this quick (a re-check of a present `Always` image) keeps the pod's turn;
/// a longer one gives it back until the image is there.
const QUICK_PULL: Duration = Duration::from_millis(300);

fn mount(container_path: &str, host_path: &Path, readonly: bool) -> api::Mount {
    api::Mount {
        container_path: container_path.into(),
        host_path: host_path.to_string_lossy().into_owned(),
        readonly,
        ..Default::default()
    }
}

impl<C: Cri> RuntimeManager<C> {
    /// A manager over `cri` on the node whose IP is `host_ip`, that sets up at most
    /// `parallel_starts` pods at a time (as the start gate adapts), and stops half as many
    /// sandboxes (tearing their networks down) at a time.
    pub fn new(
        cri: C,
        settings: SandboxSettings,
        host_ip: Option<IpAddr>,
        events: EventRecorder,
        parallel_starts: usize,
    ) -> Self {
        Self {
            cri,
            images: ImageManager::default(),
            settings,
            events,
            crash_backoff: Mutex::default(),
            start_gate: StartGate::new(parallel_starts),
            stop_slots: Semaphore::new(parallel_starts.div_ceil(2).max(1)),
            stopped_sandboxes: Mutex::default(),
            host_ip,
            log_starts: None,
            devices: None,
        }
    }

    /// The manager, giving containers what the device manager holds for them.
    #[must_use]
    pub fn with_devices(mut self, devices: Arc<crate::cm::devicemanager::DeviceManager>) -> Self {
        self.devices = Some(devices);
        self
    }

    /// The manager, telling the container log manager of each container it starts.
    #[must_use]
    pub fn with_log_starts(mut self, starts: crate::logs::StartedContainers) -> Self {
        self.log_starts = Some(starts);
        self
    }

    /// The node's IP.
    pub fn host_ip(&self) -> Option<IpAddr> {
        self.host_ip
    }

    /// The primary IP of the pod, the default host of its HTTP hooks.
    fn pod_ip(&self, pod: &Pod, status: &PodRuntimeStatus) -> String {
        primary_ip(&status.pod_ips(pod, self.host_ip))
    }

    /// The runtime client.
    pub fn cri(&self) -> &C {
        &self.cri
    }

    /// The start gate, which the agent's other runtime work lends turns to.
    pub fn start_gate(&self) -> &Arc<StartGate> {
        &self.start_gate
    }

    /// The event recorder.
    pub fn events(&self) -> &EventRecorder {
        &self.events
    }

    /// Brings the pod's runtime state to its spec (the kubelet's `SyncPod`).
    pub async fn sync_pod(
        &self,
        pod: &Pod,
        id: &PodId,
        status: &PodRuntimeStatus,
        ctx: &PodContext,
    ) -> SyncOutcome {
        let mut outcome = SyncOutcome::default();
        let actions = compute_pod_actions(pod, status, ctx.probes.as_deref());
        tracing::debug!(?actions, "computed pod actions");
        let starts = actions.next_init.is_some()
            || !actions.start.is_empty()
            || !actions.ephemeral.is_empty();
        outcome.acted = actions.kill_pod
            || !actions.kill.is_empty()
            || actions.create_sandbox.is_some()
            || starts;
        if actions.kill_pod {
            if !status.sandboxes.is_empty() {
                self.events.normal(
                    id,
                    None,
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.".into(),
                );
            }
            let grace = crate::pod::termination_grace_period(pod);
            if let Err(e) = Box::pin(self.kill_pod((id, Some(pod)), status, grace)).await {
                // As the kubelet: no new sandbox while the old one still holds its network.
                let message = format!("error killing pod: {e}");
                self.events
                    .warning(id, None, "FailedKillPod", message.clone());
                outcome.sandbox_error = Some(message);
                return outcome;
            }
            if actions.create_sandbox.is_some() {
                // The new sandbox runs every init container again (the kubelet's
                // `purgeInitContainers`): their runs in the old one go.
                self.purge_init_containers(pod, status).await;
            }
        }
        Box::pin(self.kill_containers(
            (id, pod),
            status,
            &actions,
            crate::pod::termination_grace_period(pod),
        ))
        .await;
        let mut slot = StartSlot {
            gate: self.start_gate.clone(),
            turn: None,
            // A pod with a sandbox is past its first step: it goes before new pods.
            begun: actions.create_sandbox.is_none(),
        };
        if actions.create_sandbox.is_some() || starts {
            slot.hold().await;
        }
        let (sandbox_id, sandbox_ips) =
            match Box::pin(self.ensure_sandbox(pod, id, status, &actions, &ctx.runtime_handler))
                .await
            {
                Ok(s) => s,
                Err(message) => {
                    outcome.sandbox_error = Some(message);
                    return outcome;
                }
            };
        let Some(sandbox_id) = sandbox_id else {
            return outcome;
        };
        // The kubelet takes the pod's IPs from its API status: the runtime reports none for
        // a pod on the host's network, which has the node's.
        let sandbox_ips = pod_ips(pod, &sandbox_ips, self.host_ip);
        let Some(spec) = pod.spec.as_ref() else {
            return outcome;
        };
        let init = spec.init_containers.as_deref().unwrap_or_default();
        let app = spec.containers.as_slice();
        let sandbox_conf = match sandbox_config(pod, id, 0, &self.settings) {
            Ok(config) => config,
            Err(e) => {
                outcome.sandbox_error = Some(format!("GeneratePodSandboxConfig failed: {e}"));
                return outcome;
            }
        };
        // Ephemeral containers first (the kubelet starts them before the init container, so
        // that they run while a pod fails to initialize), each with the container whose PID
        // namespace it joins.
        let ephemeral: Vec<(Container, Option<&str>)> = actions
            .ephemeral
            .iter()
            .filter_map(|&i| spec.ephemeral_containers.as_ref()?.get(i))
            .map(|ec| {
                let target = ec
                    .target_container_name
                    .as_deref()
                    .filter(|t| !t.is_empty());
                (crate::pod::ephemeral_container(ec), target)
            })
            .collect();
        let mut to_start: Vec<(&Container, u32, Involved<'_>, Option<&str>)> = ephemeral
            .iter()
            .map(|(c, target)| (c, 0, Involved::EphemeralContainer(&c.name), *target))
            .collect();
        // The next init container, else the app containers: never both in one sync.
        if let Some((i, restarts)) = actions.next_init
            && let Some(c) = init.get(i)
        {
            to_start.push((c, restarts, Involved::InitContainer(&c.name), None));
        }
        for &(i, restarts) in &actions.start {
            if let Some(c) = app.get(i) {
                to_start.push((c, restarts, Involved::Container(&c.name), None));
            }
        }
        for (container, restart_count, involved, target) in to_start {
            // The kubelet's `getTargetID`: the target's latest container, whatever its state.
            let pid_target = match target.map(|t| (t, status.latest(t))) {
                None => None,
                Some((_, Some(c))) => Some(c.id.clone()),
                Some((t, None)) => {
                    let e = format!("unable to find target container {t}");
                    let waiting = self.config_error(id, involved, &e);
                    outcome.waiting.insert(container.name.clone(), waiting);
                    continue;
                }
            };
            // The kubelet's `doBackOff`: the newest instance that exited, even under a newer
            // one that never ran.
            if let Some(previous) = status.latest_exited(&container.name)
                && let Err(wait) = self.crash_backoff_wait(id, container, previous.finished_at)
            {
                let message = format!(
                    "back-off {} restarting failed container={} pod={}_{}({})",
                    crate::kubeletconfig::running::go_duration(wait.backoff),
                    container.name,
                    id.name,
                    id.namespace,
                    id.uid
                );
                self.events.warning(
                    id,
                    involved,
                    "BackOff",
                    "Back-off restarting failed container".into(),
                );
                outcome.waiting.insert(
                    container.name.clone(),
                    Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message,
                    },
                );
                outcome.retry_in(wait.remaining);
                continue;
            }
            // Boxed, as the sandbox's creation: a pod waiting for its turn keeps only what
            // the wait needs (each sync of a burst waits, and would hold the largest step's
            // state, tens of KB, while it waits).
            let started = Box::pin(
                self.start_container(
                    pod,
                    id,
                    (container, involved),
                    (restart_count, pid_target),
                    &sandbox_id,
                    &sandbox_conf,
                    &sandbox_ips,
                    ctx,
                    &mut slot,
                )
                .instrument(tracing::info_span!("start_container", container = %container.name)),
            )
            .await;
            if let Err(waiting) = started {
                if waiting.reason == "ImagePullBackOff" || waiting.reason == "ErrImagePull" {
                    outcome.retry_in(crate::images::IMAGE_BACKOFF.0);
                }
                outcome.waiting.insert(container.name.clone(), waiting);
            }
        }
        outcome
    }

    /// Runs one runtime call of a start, and tells the start gate how long it took when
    /// it succeeded.
    async fn timed<T, E>(
        &self,
        call: StartCall,
        rpc: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let asked = Instant::now();
        let answer = rpc.await;
        if answer.is_ok() {
            self.start_gate.observe(call, asked.elapsed());
        }
        answer
    }

    /// The kubelet's `doBackOff` for a container whose last instance exited at
    /// `finished_at` (ns since the epoch).
    fn crash_backoff_wait(
        &self,
        id: &PodId,
        container: &Container,
        finished_at: i64,
    ) -> Result<(), crash_backoff::InBackoff> {
        let key = SpecKey::new(&id.uid, container);
        crate::lock::lock(&self.crash_backoff).check(key, finished_at, crash_backoff::now_ns())
    }

    async fn ensure_sandbox(
        &self,
        pod: &Pod,
        id: &PodId,
        status: &PodRuntimeStatus,
        actions: &PodActions,
        runtime_handler: &str,
    ) -> Result<(Option<String>, Vec<IpAddr>), String> {
        let Some(attempt) = actions.create_sandbox else {
            let ips = status
                .ready_sandbox()
                .map(|s| s.ips.clone())
                .unwrap_or_default();
            return Ok((actions.sandbox_id.clone(), ips));
        };
        let config = match sandbox_config(pod, id, attempt, &self.settings) {
            Ok(config) => config,
            Err(e) => {
                let message = format!("Failed to create pod sandbox: {e}");
                self.events
                    .warning(id, None, "FailedCreatePodSandBox", message.clone());
                return Err(message);
            }
        };
        for event in self.settings.dns.pod_dns(pod, id).events {
            self.events.warning(id, None, event.reason, event.message);
        }
        let log_dir = pod_log_dir(&self.settings.pod_logs_dir, id);
        if let Err(e) = tokio::fs::create_dir_all(&log_dir).await {
            // The kubelet's event carries Go's `MkdirAll` error (`mkdir <dir>: <errno>`).
            let message = format!(
                "Failed to create pod sandbox: mkdir {}: {}",
                log_dir.display(),
                crate::errno::go_text(&e)
            );
            self.events
                .warning(id, None, "FailedCreatePodSandBox", message.clone());
            return Err(message);
        }
        let created = self
            .timed(
                StartCall::RunPodSandbox,
                self.cri.run_pod_sandbox(api::RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: runtime_handler.to_owned(),
                }),
            )
            .instrument(tracing::info_span!("run_pod_sandbox", attempt))
            .await;
        let sandbox_id = match created {
            Ok(resp) => {
                crate::fault::point(crate::fault::AFTER_RUN_POD_SANDBOX);
                resp.pod_sandbox_id
            }
            Err(e) => {
                let message = format!("Failed to create pod sandbox: {}", e.grpc_error());
                self.events
                    .warning(id, None, "FailedCreatePodSandBox", message.clone());
                return Err(message);
            }
        };
        let ips = match self
            .cri
            .pod_sandbox_status(api::PodSandboxStatusRequest {
                pod_sandbox_id: sandbox_id.clone(),
                verbose: false,
            })
            .await
        {
            Ok(resp) => resp
                .status
                .and_then(|s| s.network)
                .map(|n| {
                    std::iter::once(n.ip)
                        .chain(n.additional_ips.into_iter().map(|i| i.ip))
                        .filter_map(|ip| ip.parse().ok())
                        .collect()
                })
                .unwrap_or_default(),
            Err(e) => {
                let message = format!("Unable to get pod sandbox status: {}", e.grpc_error());
                self.events
                    .warning(id, None, "FailedStatusPodSandBox", message.clone());
                return Err(message);
            }
        };
        tracing::info!(sandbox = %sandbox_id, ?ips, "pod sandbox running");
        Ok((Some(sandbox_id), ips))
    }

    /// The kubelet's own mounts of a container: `/etc/hosts` (see [`names`]) and the
    /// termination log.
    async fn kubelet_mounts(
        &self,
        pod: &Pod,
        id: &PodId,
        container: &Container,
        restart_count: u32,
        ips: &[IpAddr],
        ctx: &PodContext,
    ) -> std::io::Result<Vec<api::Mount>> {
        let mut mounts = Vec::new();
        if names::manages_etc_hosts(container, ips) {
            let aliases = pod
                .spec
                .as_ref()
                .and_then(|s| s.host_aliases.as_deref())
                .unwrap_or_default();
            let content = if crate::pod::host_network(pod) {
                let node = tokio::fs::read_to_string(names::ETC_HOSTS).await?;
                names::node_hosts_file(&node, aliases)
            } else {
                let cluster_domain = &self.settings.dns.cluster_domain;
                let (hostname, domain) = names::hostname_and_domain(pod, id, cluster_domain);
                names::managed_hosts_file(ips, &hostname, &domain, aliases)
            };
            let hosts = names::etc_hosts_path(&ctx.pod_dir);
            tokio::fs::write(&hosts, content).await?;
            mounts.push(mount(names::ETC_HOSTS, &hosts, false));
        }
        let dir = ctx.pod_dir.join("containers").join(&container.name);
        tokio::fs::create_dir_all(&dir).await?;
        let log = dir.join(format!("termination-log-{restart_count}"));
        tokio::fs::write(&log, b"").await?;
        // Whatever user the container runs as may write its message (as the kubelet).
        tokio::fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .await?;
        let path = container
            .termination_message_path
            .as_deref()
            .unwrap_or("/dev/termination-log");
        mounts.push(mount(path, &log, false));
        Ok(mounts)
    }

    /// A container config that cannot be made: a `Failed` event, and the container waits
    /// with `CreateContainerConfigError`.
    fn config_error(&self, id: &PodId, name: Involved<'_>, e: &dyn std::fmt::Display) -> Waiting {
        self.events
            .warning(id, name, "Failed", format!("Error: {e}"));
        Waiting {
            reason: "CreateContainerConfigError".into(),
            message: e.to_string(),
        }
    }

    /// The container's volume mounts (the kubelet's `makeMounts`): subPathExpr expanded
    /// from its environment `envs`, subpaths made and bound. A failure is the container's
    /// `CreateContainerConfigError`.
    async fn volume_mounts(
        &self,
        id: &PodId,
        (container, name): (&Container, Involved<'_>),
        envs: &[api::KeyValue],
        volumes: &PodVolumes,
    ) -> Result<Vec<api::Mount>, Waiting> {
        let env: HashMap<String, String> = envs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        let mounts = volumes
            .container_mounts(container, &env)
            .await
            .map_err(|e| self.config_error(id, name, &e))?;
        Ok(mounts
            .iter()
            .map(|m| mount(&m.container_path, &m.host_path, m.read_only))
            .collect())
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_container(
        &self,
        pod: &Pod,
        id: &PodId,
        (container, name): (&Container, Involved<'_>),
        (restart_count, pid_target): (u32, Option<String>),
        sandbox_id: &str,
        sandbox_conf: &api::PodSandboxConfig,
        ips: &[IpAddr],
        ctx: &PodContext,
        slot: &mut StartSlot,
    ) -> Result<(), Waiting> {
        // As the kubelet's startContainer: a container whose image is not there gets a
        // `Failed` event naming the waiting reason.
        let image_waiting = |e: crate::images::ImageError| {
            self.events
                .warning(id, name, "Failed", format!("Error: {}", e.reason()));
            Waiting {
                reason: e.reason().into(),
                message: e.to_string(),
            }
        };
        // Back from a postStart hook of the container before, or from an image pull.
        slot.hold().await;
        let present = self
            .images
            .present(&self.cri, id, (container, name), &self.events)
            .instrument(tracing::info_span!("image_status"))
            .await
            .map_err(image_waiting)?;
        let (image_ref, present) = match present {
            Some(image) => (image.id.clone(), Some(image)),
            None => {
                let pull = self
                    .images
                    .pull(
                        &self.cri,
                        id,
                        (container, name),
                        &ctx.pull_secrets,
                        &self.events,
                    )
                    .instrument(tracing::info_span!("pull_image"));
                // A quick re-check keeps the turn; a download gives it to another pod,
                // and this one comes back first in line.
                let pulled = slot.across(tokio::time::sleep(QUICK_PULL), pull).await;
                (pulled.map_err(image_waiting)?, None)
            }
        };
        // As the kubelet's generateContainerConfig: the environment (with its warnings),
        // then the mounts, then the image's user (the container's when the pod names none,
        // and what runAsNonRoot is checked against).
        let sources = ctx
            .env_sources
            .get_or_init(|| async {
                let read = ctx.sources.read(pod);
                Arc::new(read.instrument(tracing::info_span!("env_sources")).await)
            })
            .await;
        let mut cctx = ContainerContext {
            pod_ips: ips.to_vec(),
            host_ip: ctx.host_ip,
            node_name: ctx.node_name.clone(),
            mounts: Vec::new(),
            restart_count,
            image_ref,
            image_user: ImageUser::default(),
            seccomp_profile_root: ctx.seccomp_profile_root.clone(),
            sources: sources.clone(),
            memory_capacity: ctx.memory_capacity,
            pid_target,
        };
        let env =
            environment(pod, container, &cctx).map_err(|e| self.config_error(id, name, &e))?;
        for message in env.skipped {
            self.events
                .warning(id, None, "InvalidEnvironmentVariableNames", message);
        }
        let mut mounts = self
            .volume_mounts(id, (container, name), &env.vars, &ctx.volumes)
            .await?;
        let own = self
            .kubelet_mounts(pod, id, container, restart_count, ips, ctx)
            .await
            .map_err(|e| Waiting {
                reason: "CreateContainerConfigError".into(),
                message: format!("preparing the kubelet's mounts: {e}"),
            })?;
        mounts.extend(own);
        cctx.mounts = mounts;
        cctx.image_user = image_user(&self.cri, present.as_ref(), &cctx.image_ref)
            .await
            .map_err(|e| self.config_error(id, name, &ConfigError::ImageUser(e.to_string())))?;
        let mut config = container_config(pod, id, container, &cctx, env.vars)
            .map_err(|e| self.config_error(id, name, &e))?;
        // The kubelet's GetResources: the devices' options (the plugin's Allocate the first
        // time) before the container's own.
        if let Some(devices) = &self.devices {
            let options = devices.run_options(pod, container).await;
            options
                .map_err(|e| self.config_error(id, name, &e))?
                .apply(&mut config);
        }
        // Block volumes (the kubelet's `makeDevices`): each volumeDevice as a CRI device.
        let devices = ctx
            .volumes
            .container_devices(container)
            .map_err(|e| self.config_error(id, name, &e))?;
        config
            .devices
            .extend(devices.into_iter().map(|d| api::Device {
                container_path: d.container_path,
                host_path: d.host_path.to_string_lossy().into_owned(),
                permissions: "mrw".into(),
            }));
        let log = Path::new(&sandbox_conf.log_directory).join(&config.log_path);
        // As the kubelet: the runtime's own message (the gRPC status's), in the event and
        // in the waiting message.
        let failed = |e: crate::cri::CriError, reason: &str| {
            let message = e.grpc_message();
            self.events
                .warning(id, name, "Failed", format!("Error: {message}"));
            Waiting {
                reason: reason.into(),
                message,
            }
        };
        let created = self
            .timed(
                StartCall::CreateContainer,
                self.cri.create_container(api::CreateContainerRequest {
                    pod_sandbox_id: sandbox_id.into(),
                    config: Some(config),
                    sandbox_config: Some(sandbox_conf.clone()),
                }),
            )
            .await
            .map_err(|e| failed(e, "CreateContainerError"))?;
        crate::fault::point(crate::fault::AFTER_CREATE_CONTAINER);
        self.events.normal(
            id,
            name,
            "Created",
            format!("Created container {}", container.name),
        );
        self.timed(
            StartCall::StartContainer,
            self.cri.start_container(api::StartContainerRequest {
                container_id: created.container_id.clone(),
            }),
        )
        .await
        .map_err(|e| failed(e, "RunContainerError"))?;
        if let Some(starts) = &self.log_starts {
            starts.started(&created.container_id, log);
        }
        self.events.normal(
            id,
            name,
            "Started",
            format!("Started container {}", container.name),
        );
        let Some(hook) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        else {
            return Ok(());
        };
        // The postStart hook runs before the start counts as done; when it fails, the
        // container is killed and its start failed (the kubelet's `PostStartHookError`).
        // It is the container's work, not the runtime's: the turn goes to another pod
        // meanwhile, and this one comes back first in line for its next container.
        slot.release();
        let pod_ip = primary_ip(ips);
        let ran = run_hook(
            &self.cri,
            id,
            (container, &created.container_id),
            &pod_ip,
            hook,
        )
        .instrument(tracing::info_span!("post_start_hook"))
        .await;
        let Err(message) = ran else {
            return Ok(());
        };
        self.events
            .warning(id, name, "FailedPostStartHook", message.clone());
        let target = Stop {
            pod: id,
            container_id: &created.container_id,
            name: &container.name,
            spec: Some(container),
            pod_ip: &pod_ip,
        };
        self.stop_container(
            &target,
            crate::pod::termination_grace_period(pod),
            "FailedPostStartHook".into(),
        )
        .await;
        Err(Waiting {
            reason: "PostStartHookError".into(),
            message,
        })
    }
}

/// The back-offs (image pulls, crashed containers) and the stopped sandboxes of a pod that
/// is gone, whether or not anything of it was left in the runtime to remove.
impl<C: Cri> ForgetPod for RuntimeManager<C> {
    fn name(&self) -> &'static str {
        "runtime back-offs"
    }

    fn holds(&self, uid: &str) -> bool {
        self.images.holds_pod(uid)
            || crate::lock::lock(&self.crash_backoff).holds(uid)
            || crate::lock::lock(&self.stopped_sandboxes).contains_key(uid)
    }

    fn forget(&self, uid: &str) {
        self.images.forget_pod(uid);
        crate::lock::lock(&self.crash_backoff).forget(uid);
        crate::lock::lock(&self.stopped_sandboxes).remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::runtime_status::RunState;
    use crate::kuberuntime::runtime_status::testing::{container, sandbox};

    /// Records stop and remove calls; stopping sandbox `bad` fails as a broken CNI DEL does.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<String>>,
    }

    impl Recorder {
        fn record(&self, call: String) {
            self.calls.lock().unwrap().push(call);
        }
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Cri for Recorder {
        async fn exec_sync(
            &self,
            req: api::ExecSyncRequest,
        ) -> crate::cri::Result<api::ExecSyncResponse> {
            let cmd = req.cmd.join(" ");
            self.record(format!("ExecSync {} {cmd}", req.container_id));
            if cmd == "slow" {
                tokio::time::sleep(Duration::from_millis(1200)).await;
            }
            Ok(api::ExecSyncResponse {
                exit_code: i32::from(cmd == "fail"),
                ..Default::default()
            })
        }
        async fn stop_container(
            &self,
            req: api::StopContainerRequest,
        ) -> crate::cri::Result<api::StopContainerResponse> {
            self.record(format!(
                "StopContainer {} {}",
                req.container_id, req.timeout
            ));
            Ok(api::StopContainerResponse {})
        }
        async fn stop_pod_sandbox(
            &self,
            req: api::StopPodSandboxRequest,
        ) -> crate::cri::Result<api::StopPodSandboxResponse> {
            self.record(format!("StopPodSandbox {}", req.pod_sandbox_id));
            if req.pod_sandbox_id == "bad" {
                return Err(crate::cri::CriError::Rpc {
                    rpc: "StopPodSandbox",
                    code: tonic::Code::Unknown,
                    message: "failed to destroy network for sandbox".into(),
                });
            }
            Ok(api::StopPodSandboxResponse {})
        }
        async fn remove_container(
            &self,
            req: api::RemoveContainerRequest,
        ) -> crate::cri::Result<api::RemoveContainerResponse> {
            self.record(format!("RemoveContainer {}", req.container_id));
            Ok(api::RemoveContainerResponse {})
        }
        async fn remove_pod_sandbox(
            &self,
            req: api::RemovePodSandboxRequest,
        ) -> crate::cri::Result<api::RemovePodSandboxResponse> {
            self.record(format!("RemovePodSandbox {}", req.pod_sandbox_id));
            Ok(api::RemovePodSandboxResponse {})
        }
    }

    /// A pod's slot on a gate of `turns` turns, and `turns - 1` other pods holding theirs.
    async fn one_turn_left(turns: usize) -> (Arc<StartGate>, StartSlot, Vec<StartTurn>) {
        let gate = StartGate::new(turns * 2);
        let others = futures::future::join_all((1..turns).map(|_| gate.enter(Priority::New))).await;
        let mut slot = StartSlot {
            gate: gate.clone(),
            turn: None,
            begun: false,
        };
        slot.hold().await;
        assert_eq!(gate.turns(), (turns, turns));
        (gate, slot, others)
    }

    /// A timer that ends when told.
    fn timer() -> (tokio::sync::oneshot::Sender<()>, impl Future<Output = ()>) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        (tx, async move {
            // Told, or its sender dropped: the time is up either way.
            let _ = rx.await;
        })
    }

    #[tokio::test]
    async fn a_quick_pull_keeps_the_pods_turn() {
        let (gate, mut slot, _others) = one_turn_left(2).await;
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.enter(Priority::New).await }
        });
        let (_time_up, quick) = timer();
        let pulled = slot.across(quick, async { "pulled" }).await;
        assert_eq!(pulled, "pulled");
        assert!(slot.turn.is_some());
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "no other pod took the turn meanwhile"
        );
        assert_eq!(gate.turns(), (2, 2));
    }

    #[tokio::test]
    async fn a_long_pull_lends_the_turn_and_comes_back_before_new_pods() {
        let (gate, mut slot, others) = one_turn_left(2).await;
        let (time_up, quick) = timer();
        let (pulled_tx, pulled_rx) = tokio::sync::oneshot::channel::<()>();
        let back = tokio::spawn(async move {
            slot.across(quick, async {
                let _ = pulled_rx.await;
            })
            .await;
            slot
        });
        time_up.send(()).unwrap();
        // The turn, lent during the pull, goes to a pod that has not begun.
        let lent = gate.enter(Priority::New).await;
        assert_eq!(gate.turns(), (2, 2));
        // Another new pod queues; then the pull ends and the pod waits for a turn.
        let new = tokio::spawn({
            let gate = gate.clone();
            async move { gate.enter(Priority::New).await }
        });
        tokio::task::yield_now().await;
        pulled_tx.send(()).unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!back.is_finished() && !new.is_finished(), "no turn free");
        drop(lent);
        let slot = back.await.unwrap();
        assert!(slot.turn.is_some(), "the pod back from its pull goes first");
        assert!(!new.is_finished(), "the new pod waits behind it");
        drop(slot);
        drop(others);
        assert!(new.await.is_ok());
    }

    fn manager() -> RuntimeManager<Recorder> {
        manager_and_events().0
    }

    fn manager_and_events() -> (RuntimeManager<Recorder>, crate::events::EventReceiver) {
        let (events, rx) = EventRecorder::channel();
        let m = RuntimeManager::new(
            Recorder::default(),
            SandboxSettings::default(),
            None,
            events,
            1,
        );
        (m, rx)
    }

    /// A pod whose container `web` has an exec preStop hook running `cmd`.
    fn with_pre_stop(cmd: &str) -> Pod {
        let mut p = crate::pod::testing::pod("web", &[("web", "nginx")]);
        p.spec.as_mut().unwrap().containers[0].lifecycle =
            Some(k8s_openapi::api::core::v1::Lifecycle {
                pre_stop: Some(k8s_openapi::api::core::v1::LifecycleHandler {
                    exec: Some(k8s_openapi::api::core::v1::ExecAction {
                        command: Some(vec![cmd.into()]),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        p
    }

    #[tokio::test]
    async fn pre_stop_hooks_run_first_and_their_time_counts_against_the_grace_period() {
        let running = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container("c1", "web", "s1", 0, RunState::Running)],
        };
        // The hook takes 1.2 s of a 4 s grace period: 3 s are left for the stop.
        let (m, _events) = manager_and_events();
        let pod = with_pre_stop("slow");
        m.kill_pod((&pod_id(), Some(&pod)), &running, 4)
            .await
            .unwrap();
        assert_eq!(
            m.cri().calls(),
            [
                "ExecSync c1 slow",
                "StopContainer c1 3",
                "StopPodSandbox s1"
            ]
        );
        // A failing hook is reported; the stop still comes, never under 2 s.
        let (m, mut events) = manager_and_events();
        let pod = with_pre_stop("fail");
        m.kill_pod((&pod_id(), Some(&pod)), &running, 1)
            .await
            .unwrap();
        assert_eq!(
            m.cri().calls(),
            [
                "ExecSync c1 fail",
                "StopContainer c1 2",
                "StopPodSandbox s1"
            ]
        );
        let reasons: Vec<String> = std::iter::from_fn(|| events.try_recv().ok())
            .map(|e| e.reason.into_owned())
            .collect();
        assert_eq!(reasons, ["Killing", "FailedPreStopHook"]);
        // Without the pod's spec (gone from the API), no hook runs.
        let m = manager();
        m.kill_pod((&pod_id(), None), &running, 4).await.unwrap();
        assert_eq!(m.cri().calls(), ["StopContainer c1 4", "StopPodSandbox s1"]);
    }

    #[tokio::test]
    async fn a_log_directory_name_too_long_fails_the_sandbox_with_gos_mkdir_error() {
        let logs = std::env::temp_dir().join(format!("rk-logdir-{}", std::process::id()));
        let settings = SandboxSettings {
            pod_logs_dir: logs.clone(),
            ..SandboxSettings::default()
        };
        let (events, mut rx) = EventRecorder::channel();
        let m = RuntimeManager::new(Recorder::default(), settings, None, events, 1);
        // 253 characters, as the API allows: `default_<name>_<uid>` is over NAME_MAX.
        let name = "n".repeat(253);
        let pod = crate::pod::testing::pod(&name, &[("c", "busybox")]);
        let id = PodId::of(&pod).unwrap();
        let actions = PodActions {
            create_sandbox: Some(0),
            ..PodActions::default()
        };
        let got = m
            .ensure_sandbox(&pod, &id, &PodRuntimeStatus::default(), &actions, "")
            .await;
        let dir = logs.join(format!("default_{name}_{}", id.uid));
        let want = format!(
            "Failed to create pod sandbox: mkdir {}: file name too long",
            dir.display()
        );
        assert_eq!(got, Err(want.clone()));
        let event = std::iter::from_fn(|| rx.try_recv().ok())
            .find(|e| e.reason == "FailedCreatePodSandBox")
            .expect("a FailedCreatePodSandBox event");
        assert_eq!(event.message, want);
        assert!(m.cri().calls().is_empty());
        let _ = std::fs::remove_dir_all(&logs);
    }

    fn pod_id() -> PodId {
        PodId {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "web".into(),
        }
    }

    #[tokio::test]
    async fn kill_pod_stops_running_containers_then_every_sandbox_and_reports_a_failed_stop() {
        let m = manager();
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("bad", 0, false), sandbox("s1", 0, false)],
            containers: vec![
                container("c1", "c1", "bad", 0, RunState::Running),
                container("c0", "c0", "s1", 0, RunState::Exited),
            ],
        };
        let err = m
            .kill_pod((&pod_id(), None), &status, 30)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("StopPodSandbox"), "{err}");
        // The failure does not stop the other sandbox from being stopped.
        assert_eq!(
            m.cri().calls(),
            [
                "StopContainer c1 30",
                "StopPodSandbox bad",
                "StopPodSandbox s1"
            ]
        );
        let ok = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: Vec::new(),
        };
        assert!(m.kill_pod((&pod_id(), None), &ok, 30).await.is_ok());
    }

    #[tokio::test]
    async fn a_sandbox_stopped_once_is_not_stopped_again_until_the_pod_is_forgotten() {
        let m = manager();
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("bad", 0, false), sandbox("s1", 0, false)],
            containers: Vec::new(),
        };
        assert!(m.kill_pod((&pod_id(), None), &status, 30).await.is_err());
        // A termination started over: only the stop that failed is tried again.
        assert!(m.kill_pod((&pod_id(), None), &status, 30).await.is_err());
        let only_s1 = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: Vec::new(),
        };
        assert!(m.kill_pod((&pod_id(), None), &only_s1, 30).await.is_ok());
        assert_eq!(
            m.cri().calls(),
            [
                "StopPodSandbox bad",
                "StopPodSandbox s1",
                "StopPodSandbox bad"
            ]
        );
        assert!(m.holds(&pod_id().uid));
        m.forget(&pod_id().uid);
        assert!(!m.holds(&pod_id().uid));
        assert!(m.kill_pod((&pod_id(), None), &only_s1, 30).await.is_ok());
        assert_eq!(m.cri().calls().last().unwrap(), "StopPodSandbox s1");
    }

    /// A runtime whose sandbox stops (their CNI DEL chains) take a while; it records how
    /// many ran at once.
    #[derive(Default)]
    struct SlowStops {
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    impl Cri for SlowStops {
        async fn stop_pod_sandbox(
            &self,
            _: api::StopPodSandboxRequest,
        ) -> crate::cri::Result<api::StopPodSandboxResponse> {
            use std::sync::atomic::Ordering;
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            Ok(api::StopPodSandboxResponse {})
        }
    }

    /// The manager's `ForgetPod` drops a gone pod's back-offs, even when nothing of it was
    /// left in the runtime to remove.
    #[test]
    fn forget_pod_drops_the_crash_back_offs() {
        let m = manager();
        let id = pod_id();
        let other = PodId {
            uid: "other".into(),
            ..pod_id()
        };
        let c = Container {
            name: "c".into(),
            ..Container::default()
        };
        let now = crash_backoff::now_ns();
        assert!(
            m.crash_backoff_wait(&id, &c, now).is_ok(),
            "the first restart"
        );
        assert!(
            m.crash_backoff_wait(&id, &c, now).is_err(),
            "then a back-off"
        );
        assert!(m.crash_backoff_wait(&other, &c, now).is_ok());
        m.forget(&id.uid);
        assert!(!m.holds(&id.uid) && m.holds("other"));
        m.forget("other");
        assert!(!m.holds("other"));
    }

    #[tokio::test]
    async fn sandbox_stops_are_bounded_like_pod_starts() {
        let (events, _rx) = EventRecorder::channel();
        let m = RuntimeManager::new(
            SlowStops::default(),
            SandboxSettings::default(),
            None,
            events,
            4,
        );
        let statuses: Vec<PodRuntimeStatus> = (0..6)
            .map(|i| PodRuntimeStatus {
                sandboxes: vec![sandbox(&format!("s{i}"), 0, true)],
                containers: Vec::new(),
            })
            .collect();
        let id = pod_id();
        let kills = statuses.iter().map(|s| m.kill_pod((&id, None), s, 30));
        for result in futures::future::join_all(kills).await {
            assert!(result.is_ok());
        }
        let most = m.cri().most.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            most, 2,
            "at most half --parallel-pod-starts sandbox stops at once"
        );
    }

    #[tokio::test]
    async fn remove_pod_leaves_a_sandboxs_containers_to_the_sandbox_removal() {
        let m = manager();
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("s2", 0, false), sandbox("s1", 0, false)],
            containers: vec![
                container("c2", "c2", "s2", 0, RunState::Exited),
                container("c1", "c1", "s1", 0, RunState::Exited),
                container("stray", "stray", "gone", 0, RunState::Exited),
            ],
        };
        m.remove_pod(&status).await.unwrap();
        assert_eq!(
            m.cri().calls(),
            [
                "RemoveContainer stray",
                "RemovePodSandbox s2",
                "RemovePodSandbox s1"
            ]
        );
    }
}
