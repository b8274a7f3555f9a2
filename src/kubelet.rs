//! The kubelet: the pod sync that pod workers run — `syncPod` for a pod that should run,
//! `syncTerminatingPod` for one that must go — and the housekeeping that finds orphans.
//! Each step has its own tracing span, so a pod's start-up reads as a timeline:
//! `ensure_pod_cgroup → make_data_dirs → mount_volumes → run_pod_sandbox (CNI inside) →
//! pull/env_sources/create/start`.
//! Pods are admitted (or rejected, ending Failed) before their first sync, and a running
//! pod past its `activeDeadlineSeconds` ends Failed; both rules live in [`crate::lifecycle`].
//! Knows no server, node agent or start-up wiring (`app` builds it); keep it to the sync itself.

pub mod eviction_stats;
pub mod evictor;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::cm::ContainerManager;
use crate::credentialprovider::pod_pull_secrets;
use crate::cri::Cri;
use crate::kuberuntime::env::EnvSourceReader;
use crate::kuberuntime::sandbox::pod_log_dir;
use crate::kuberuntime::{
    PodContext, PodRuntimeStatus, RunState, RuntimeManager, Waiting, get_pod_status,
};
use crate::lifecycle::active_deadline;
use crate::lifecycle::admission::{PodAdmitter, rejected_status};
use crate::pod::state::{ForgetPod, PodMap, PodStates, Wake};
use crate::pod::store::PodAdmission;
use crate::pod::workers::{Next, PodSyncer, PodWork, PodWorkers};
use crate::pod::{PodId, store::PodStore};
use crate::prober::ProberManager;
use crate::status::manager::merge_pod_status;
use crate::status::{StatusInputs, StatusManager, generate_pod_status};
use crate::volume::{LinuxMounter, PodVolumes, SetUps, VolumeError, VolumeManager};
use crate::watch_manager::KubePodObjects;

/// How often a running pod is synced when nothing happens (the kubelet's
/// `--sync-frequency`). Changes in the runtime wake it at once through the PLEG.
const RESYNC: Duration = Duration::from_secs(60);
/// How long volumes set up for a pod are used before they are set up again: tokens are
/// refreshed then (changed Secrets and ConfigMaps come at once through their watches).
const VOLUME_RESYNC: Duration = Duration::from_secs(30);
/// A failed termination step is retried after this long.
const RETRY: Duration = Duration::from_secs(1);

/// Node facts the pod sync needs.
#[derive(Debug, Clone)]
pub struct SyncSettings {
    /// The node's name.
    pub node_name: String,
    /// The node's IP (`status.hostIP`).
    pub node_ip: IpAddr,
    /// `--root-dir`: pod directories live in `<root-dir>/pods/<uid>`.
    pub root_dir: PathBuf,
    /// Where pod log directories live.
    pub pod_logs_dir: PathBuf,
    /// The runtime's name for container ids (`containerd`).
    pub runtime_name: String,
    /// The node's memory capacity in bytes.
    pub memory_capacity: u64,
}

/// The pod-level logic of the agent. Every per-pod state of it and of its managers is
/// registered in [`Self::pod_states`], forgotten there when the pod's worker ends.
pub struct Kubelet<C> {
    settings: SyncSettings,
    runtime: Arc<RuntimeManager<C>>,
    volumes: Arc<VolumeManager<KubePodObjects, LinuxMounter>>,
    status: StatusManager,
    admission: Arc<PodAdmitter>,
    /// The owner of the per-pod state below and of the managers'.
    states: PodStates,
    /// Why containers wait, per pod UID (the kubelet's reason cache).
    reasons: Arc<PodMap<HashMap<String, Waiting>>>,
    /// The runtime state each pod's status was last generated from, per pod UID: a probe
    /// result the status shows refreshes the status from it, with no runtime call (the
    /// kubelet's probe manager sets readiness in its status manager, with no pod sync).
    seen: Arc<PodMap<PodRuntimeStatus>>,
    /// The runtime state, as the PLEG lists it, that each pod's last sync acted on all of:
    /// a relist showing the same wakes no sync ([`Kubelet::settle`]).
    settled: Arc<PodMap<crate::pleg::PodFingerprint>>,
    /// Back-off of failed sandbox creations and volume set-ups, per pod UID.
    backoff: Arc<PodMap<Backoff>>,
    /// Each pod's volumes, when they were last set up and the pod metadata they show.
    /// Syncs come with every runtime change; the volumes are set up again only when the
    /// pod's labels or annotations changed (downward API files), a Secret or ConfigMap the
    /// pod references changed, or the last set-up is [`VOLUME_RESYNC`] old.
    /// A set-up that fails once the volumes were set up leaves them in use.
    volumes_set_up: Arc<SetUps<VolumeKey>>,
    /// The Secrets, ConfigMaps and Services of the pods' environment and volumes.
    env: EnvSourceReader,
    /// The probe workers of the pods' containers.
    prober: Arc<ProberManager<C>>,
    /// The pod cgroups (none with `--cgroups-per-qos=false`).
    cm: Option<Arc<ContainerManager>>,
    /// The grace period evicted pods are killed within, instead of their own, per pod UID
    /// (the eviction manager's override).
    grace_overrides: Arc<PodMap<i64>>,
    /// The pods whose termination has stopped everything of them that ran: what is left
    /// (volumes, cgroup, final status, delete, removal) takes no grace period, so neither a
    /// second delete nor the pod leaving the API (after the agent's own final delete)
    /// starts it over.
    killed: Arc<PodMap<()>>,
    /// The PLEG, whose last relist says whether a pod's runtime state changed since its
    /// last sync read it.
    pleg: Option<Arc<crate::pleg::Pleg>>,
}

/// What a pod's volumes show: its labels and annotations (downward API files) and the
/// changes seen to its Secrets and ConfigMaps.
type VolumeKey = (PodMetadata, u64);

/// What of a pod's metadata its volumes show (downward API files).
type PodMetadata = (
    Option<std::collections::BTreeMap<String, String>>,
    Option<std::collections::BTreeMap<String, String>>,
);

fn volume_metadata(pod: &Pod) -> PodMetadata {
    (
        pod.metadata.labels.clone(),
        pod.metadata.annotations.clone(),
    )
}

impl<C: Cri + Clone> Kubelet<C> {
    /// The kubelet over its managers (runtime, volumes, status, admission, environment
    /// sources, cgroups: one argument each, as the kubelet's own fields); probe results and
    /// Secret/ConfigMap changes wake pod workers through `wake`. The per-pod state of each
    /// is registered in [`Self::pod_states`], here in one place.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: SyncSettings,
        runtime: RuntimeManager<C>,
        volumes: VolumeManager<KubePodObjects, LinuxMounter>,
        status: StatusManager,
        admission: PodAdmitter,
        wake: Wake,
        env: EnvSourceReader,
        cm: Option<Arc<ContainerManager>>,
    ) -> Self {
        let states = PodStates::default();
        let prober = ProberManager::new(
            runtime.cri().clone(),
            runtime.events().clone(),
            wake,
            runtime.host_ip(),
            runtime.start_gate().clone(),
        );
        states.register(Arc::new(runtime.events().clone()));
        states.register(Arc::new(status.clone()));
        states.register(Arc::new(env.caches().clone()));
        Self {
            prober: states.register(Arc::new(prober)),
            settings,
            runtime: states.register(Arc::new(runtime)),
            volumes: states.register(Arc::new(volumes)),
            status,
            admission: states.register(Arc::new(admission)),
            reasons: states.map("container waiting reasons"),
            seen: states.map("runtime states seen"),
            settled: states.map("runtime states settled"),
            backoff: states.map("sync back-offs"),
            volumes_set_up: states.register(Arc::new(SetUps::new(VOLUME_RESYNC))),
            env,
            cm,
            grace_overrides: states.map("eviction grace overrides"),
            killed: states.map("terminations past their kill"),
            states,
            pleg: None,
        }
    }

    /// The kubelet whose pod workers, woken by `pleg` for a pod's changed runtime state,
    /// sync only when the pod's last sync did not read that state already.
    #[must_use]
    pub fn with_pleg(mut self, pleg: Arc<crate::pleg::Pleg>) -> Self {
        self.pleg = Some(pleg);
        self
    }

    /// The pods' volumes as last set up, whose persistent volumes' figures the stats read.
    #[must_use]
    pub fn mounted_volumes(&self) -> Arc<dyn crate::stats::PersistentVolumeMetrics> {
        Arc::new(crate::volume::MountedVolumeMetrics::new(
            self.volumes_set_up.clone(),
            self.volumes.csi(),
        ))
    }

    /// The per-pod state of the kubelet and its managers: the pod workers forget a pod in
    /// it when the pod's worker ends.
    #[must_use]
    pub fn pod_states(&self) -> &PodStates {
        &self.states
    }

    /// The pod cgroup, the sandbox's cgroup parent, made before the sandbox (`syncPod`);
    /// `Some` when the sync must stop here. A pod found running without its cgroup (it
    /// was started with `--cgroups-per-qos=false`) is killed first, to come back in it.
    async fn ensure_pod_cgroup(
        &self,
        pod: &Pod,
        id: &PodId,
        runtime: &PodRuntimeStatus,
    ) -> Option<Next> {
        let cm = self.cm.as_ref()?;
        let running = runtime
            .containers
            .iter()
            .any(|c| c.state == RunState::Running);
        if running && !cm.pod_exists(pod).await.unwrap_or(true) {
            tracing::info!("pod runs outside its pod cgroup: killing it to restart it inside");
            let grace = crate::pod::termination_grace_period(pod);
            if let Err(e) = self.runtime.kill_pod((id, Some(pod)), runtime, grace).await {
                tracing::warn!(error = %e, "could not kill the pod");
                return Some(Next::ResyncAfter(RETRY));
            }
            return Some(Next::ResyncAfter(Duration::ZERO));
        }
        let message = format!(
            "unable to ensure pod container exists: {}",
            cm.ensure_pod(pod).await.err()?
        );
        Some(self.retry_failed(id, "FailedCreatePodContainer", message))
    }

    /// Removes the pod's cgroup once nothing of it runs.
    async fn destroy_pod_cgroup(&self, uid: &str) -> Result<(), crate::cm::CmError> {
        match &self.cm {
            Some(cm) => {
                cm.destroy_pod(uid)
                    .instrument(tracing::info_span!("destroy_pod_cgroup"))
                    .await
            }
            None => Ok(()),
        }
    }

    /// Whether the pod has finished: by the status this agent last generated, else by the
    /// API's (a pod that finished before this agent started).
    fn is_terminal(&self, pod: &Pod, id: &PodId) -> bool {
        let ours = self.status.get(&id.uid);
        let status = ours.as_ref().or(pod.status.as_ref());
        matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
    }

    /// Records the state the pod's sync settled: `state` if the sync acted on all of it
    /// (what it read and left as it was, or what it left that shows only its own doing,
    /// [`crate::pleg::only_sync_changes`]); `None` if it may not have, and then the next
    /// relist wakes the worker.
    fn settle(&self, id: &PodId, state: Option<&PodRuntimeStatus>) {
        let mut settled = self.settled.lock();
        match state {
            Some(state) => {
                settled.insert(id.uid.clone(), crate::pleg::fingerprint_of(state));
            }
            None => {
                settled.remove(&id.uid);
            }
        }
    }

    fn publish_status(&self, pod: &Pod, id: &PodId, runtime: Option<&PodRuntimeStatus>) {
        if let Some(runtime) = runtime {
            self.seen.lock().insert(id.uid.clone(), runtime.clone());
        }
        let reasons = self
            .reasons
            .lock()
            .get(&id.uid)
            .cloned()
            .unwrap_or_default();
        // Start from what the API last saw, with our last status on top of it, so that
        // transition times and the start time are kept; the conditions others own
        // (readiness gates') are the API's.
        let mut base = pod.clone();
        if let Some(ours) = self.status.get(&id.uid) {
            base.status = Some(merge_pod_status(pod.status.as_ref(), ours));
        }
        let inputs = StatusInputs {
            runtime,
            waiting: Some(&reasons),
            host_ip: Some(self.settings.node_ip),
            runtime_name: &self.settings.runtime_name,
            now: Timestamp::now(),
            probes: Some(self.prober.results()),
        };
        let status = generate_pod_status(&base, &inputs);
        // The pod start latency: from acknowledgement (startTime) to the first Running.
        let was_running = base.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if !was_running
            && status.phase.as_deref() == Some("Running")
            && let Some(start) = &status.start_time
        {
            let elapsed = Timestamp::now().duration_since(start.0);
            crate::metrics::observe_pod_start(elapsed.try_into().unwrap_or_default());
        }
        self.status.set_pod_status(id, status);
    }

    /// Waits out a pod's back-off, if any: `Some(remaining)` while waiting.
    fn backing_off(&self, uid: &str) -> Option<Duration> {
        let now = Instant::now();
        self.backoff
            .lock()
            .get(uid)
            .filter(|b| b.waiting(now))
            .and_then(Backoff::until)
            .map(|u| u - now)
    }

    /// How long the pod may still be active (`activeDeadlineSeconds`), counted from the
    /// start time this agent recorded, else the API's.
    fn active_deadline_remaining(&self, pod: &Pod, id: &PodId) -> Option<Duration> {
        pod.spec.as_ref()?.active_deadline_seconds?;
        let start = self
            .status
            .get(&id.uid)
            .and_then(|s| s.start_time)
            .or_else(|| pod.status.as_ref()?.start_time.clone());
        active_deadline::remaining(pod, start.map(|t| t.0), Timestamp::now())
    }

    /// A pod past its active deadline ends Failed (the kubelet's `ShouldEvict` in
    /// `generateAPIPodStatus`); the next sync, seeing it terminal, kills what runs of it.
    fn fail_past_deadline(&self, pod: &Pod, id: &PodId, runtime: &PodRuntimeStatus) {
        tracing::info!(pod = %id, "pod exceeded its active deadline");
        self.runtime.events().normal(
            id,
            None,
            active_deadline::REASON,
            active_deadline::MESSAGE.to_owned(),
        );
        self.fail(
            pod,
            id,
            Some(runtime),
            active_deadline::REASON,
            active_deadline::MESSAGE,
        );
    }

    /// Ends a pod Failed with `reason` and `message`, on top of its current status.
    fn fail(
        &self,
        pod: &Pod,
        id: &PodId,
        runtime: Option<&PodRuntimeStatus>,
        reason: &str,
        message: &str,
    ) {
        self.publish_status(pod, id, runtime);
        if let Some(mut status) = self.status.get(&id.uid) {
            status.phase = Some("Failed".into());
            status.reason = Some(reason.into());
            status.message = Some(message.into());
            self.status.set_pod_status(id, status);
        }
    }

    /// Evicts a pod (the eviction manager's `killPodFunc`): a Warning `Evicted` event,
    /// the pod ends Failed with reason `Evicted` and `message`, and its next sync, seeing
    /// it terminal, kills its containers within `grace` seconds instead of its own grace
    /// period. The caller wakes the pod's worker.
    pub async fn evict(&self, pod: &Pod, message: &str, grace: i64) {
        let Some(id) = PodId::of(pod) else { return };
        self.runtime
            .events()
            .warning(&id, None, crate::eviction::REASON, message.to_owned());
        self.grace_overrides.lock().insert(id.uid.clone(), grace);
        let runtime = get_pod_status(self.runtime.cri(), &id.uid).await.ok();
        self.fail(pod, &id, runtime.as_ref(), crate::eviction::REASON, message);
    }

    /// Whether nothing of the pod runs: no running container, no ready sandbox.
    pub async fn pod_stopped(&self, uid: &str) -> bool {
        get_pod_status(self.runtime.cri(), uid)
            .await
            .is_ok_and(|r| {
                r.ready_sandbox().is_none()
                    && !r.containers.iter().any(|c| c.state == RunState::Running)
            })
    }

    /// Whether the pod's worker is done with it (the kubelet's `podIsTerminated`, by the
    /// status this agent generated, else the API's): finished, or deleted with no container
    /// running. The others are the active pods of admission and eviction.
    pub fn finished(&self, pod: &Pod) -> bool {
        PodId::of(pod).is_some_and(|id| {
            crate::pod::is_worker_terminal(pod, self.status.get(&id.uid).as_ref())
        })
    }

    /// A failed step of the pod sync: a Warning event, then a retry after the back-off.
    fn retry_failed(&self, id: &PodId, reason: &'static str, message: String) -> Next {
        self.runtime.events().warning(id, None, reason, message);
        Next::ResyncAfter(self.failed(&id.uid))
    }

    fn failed(&self, uid: &str) -> Duration {
        self.backoff
            .lock()
            .entry(uid.to_owned())
            .or_insert_with(|| Backoff::new(Duration::from_secs(1), Duration::from_secs(60)))
            .failed(Instant::now())
    }

    /// The pod's volumes: set up again when its labels or annotations changed, a Secret or
    /// ConfigMap it references changed, or the last set-up is [`VOLUME_RESYNC`] old (tokens
    /// are refreshed then), else as last set up; when setting them up again fails, those of
    /// the last set-up stay in use (with a `FailedMount` event).
    async fn pod_volumes(&self, pod: &Pod, id: &PodId) -> Result<PodVolumes, VolumeError> {
        let metadata = volume_metadata(pod);
        self.env.caches().register(&id.uid, pod);
        let changes = self.env.caches().changes(&id.uid);
        let mounted = self
            .volumes_set_up
            .get_or_set_up(&id.uid, (metadata, changes), self.volumes.setup(pod))
            .await?;
        if let Some(e) = &mounted.refresh_error {
            // As the kubelet: volumes once mounted stay mounted while a remount fails, and
            // the containers are still synced (restarted) meanwhile.
            tracing::warn!(error = %e, "could not set up the pod's volumes again; using them as they are");
            self.runtime
                .events()
                .warning(id, None, "FailedMount", e.failed_mount_message());
        }
        Ok(mounted.volumes)
    }

    /// Nothing of a pod this agent never synced is in the runtime when the PLEG's last relist
    /// (one at least since the agent started) had nothing of it: only the pod's own worker
    /// makes sandboxes for it, and its first sync reads this before it makes any (the
    /// kubelet's pod workers likewise start from the PLEG's cache, empty for a new pod).
    fn known_empty(&self, uid: &str) -> bool {
        let Some(pleg) = &self.pleg else {
            return false;
        };
        pleg.healthy().is_ok() && !pleg.holds(uid) && !self.seen.lock().contains_key(uid)
    }

    /// `syncPod`: one step of bringing a pod that should run to its spec.
    async fn sync_pod(&self, pod: &Pod, id: &PodId) -> Next {
        let terminal = self.is_terminal(pod, id);
        let read = async {
            if self.known_empty(&id.uid) {
                return Ok(PodRuntimeStatus::default());
            }
            get_pod_status(self.runtime.cri(), &id.uid).await
        };
        let runtime = match read.instrument(tracing::info_span!("runtime_status")).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the pod's runtime state");
                return Next::ResyncAfter(RETRY);
            }
        };
        // Probe workers follow the running containers (none once the pod has finished).
        self.prober.update_pod(pod, id, &runtime);
        if terminal {
            // A finished pod keeps its status; whatever still runs of it is stopped, and
            // its cgroup goes (the kubelet's housekeeping removes those of terminated pods).
            if runtime.ready_sandbox().is_some() {
                let grace = self
                    .grace_overrides
                    .lock()
                    .get(&id.uid)
                    .copied()
                    .unwrap_or_else(|| crate::pod::termination_grace_period(pod));
                if self
                    .runtime
                    .kill_pod((id, Some(pod)), &runtime, grace)
                    .await
                    .is_err()
                {
                    return Next::ResyncAfter(RETRY);
                }
            }
            if let Err(e) = self.destroy_pod_cgroup(&id.uid).await {
                tracing::warn!(error = %e, "could not remove the pod cgroup");
                return Next::ResyncAfter(RETRY);
            }
            return Next::ResyncAfter(RESYNC);
        }
        if self.active_deadline_remaining(pod, id) == Some(Duration::ZERO) {
            self.fail_past_deadline(pod, id, &runtime);
            return Next::ResyncAfter(Duration::ZERO);
        }
        // Pending (or whatever the runtime shows) at once, before a slow pull or sandbox.
        self.publish_status(pod, id, Some(&runtime));
        if let Some(wait) = self.backing_off(&id.uid) {
            return Next::ResyncAfter(wait);
        }
        // As the kubelet's syncPod: the pod cgroup first, then data dirs and volumes.
        if let Some(next) = Box::pin(
            self.ensure_pod_cgroup(pod, id, &runtime)
                .instrument(tracing::info_span!("ensure_pod_cgroup")),
        )
        .await
        {
            return next;
        }
        // The pod's log directory is the sandbox's to make (`createPodSandbox`): a name
        // too long for it fails there, with the kubelet's event.
        let pod_dir = self.volumes.pod_dir(&id.uid);
        let dirs = tokio::fs::create_dir_all(pod_dir.join("containers"));
        if let Err(e) = dirs.instrument(tracing::info_span!("make_data_dirs")).await {
            let message = format!("Error making pod data directories: {e}");
            return self.retry_failed(id, "Failed", message);
        }
        let prepared = Box::pin(
            self.pod_volumes(pod, id)
                .instrument(tracing::info_span!("mount_volumes")),
        )
        .await;
        let volumes = match prepared {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "could not set up the pod's volumes");
                self.runtime
                    .events()
                    .warning(id, None, "FailedMount", e.failed_mount_message());
                self.publish_status(pod, id, Some(&runtime));
                return Next::ResyncAfter(self.failed(&id.uid));
            }
        };
        // A new sandbox runs with the handler of the pod's RuntimeClass; the kubelet fails
        // the sandbox creation of a pod whose RuntimeClass is unknown.
        let runtime_handler = if runtime.ready_sandbox().is_none() {
            match self.admission.runtime_handler(pod).await {
                Ok(handler) => handler,
                Err(e) => {
                    let message = format!("Failed to create pod sandbox: {e}");
                    return self.retry_failed(id, "FailedCreatePodSandBox", message);
                }
            }
        } else {
            String::new()
        };
        let ctx = PodContext {
            pod_dir,
            node_name: self.settings.node_name.clone(),
            host_ip: Some(self.settings.node_ip),
            volumes,
            runtime_handler,
            probes: Some(self.prober.results().clone()),
            sources: self.env.clone(),
            env_sources: tokio::sync::OnceCell::new(),
            pull_secrets: pod_pull_secrets(self.volumes.api(), pod).await,
            seccomp_profile_root: self.settings.root_dir.join("seccomp"),
            memory_capacity: self.settings.memory_capacity,
        };
        // Boxed, as the steps before it: a sync waiting for its start turn holds only the
        // runtime's part.
        let outcome = Box::pin(self.runtime.sync_pod(pod, id, &runtime, &ctx)).await;
        self.reasons
            .lock()
            .insert(id.uid.clone(), outcome.waiting.clone());
        let next = if outcome.sandbox_error.is_some() {
            self.failed(&id.uid)
        } else {
            self.backoff.lock().remove(&id.uid);
            outcome.retry_after.unwrap_or(RESYNC)
        };
        if outcome.acted {
            let fresh = get_pod_status(self.runtime.cri(), &id.uid)
                .instrument(tracing::info_span!("runtime_status"))
                .await;
            match fresh {
                Ok(after) => {
                    // Containers started just now are probed now, not after the next
                    // relist has seen them run (up to a PLEG period later).
                    self.prober.update_pod(pod, id, &after);
                    let settled = crate::pleg::only_sync_changes(&runtime, &after);
                    self.settle(id, settled.then_some(&after));
                    self.publish_status(pod, id, Some(&after));
                }
                Err(e) => {
                    self.settle(id, None);
                    tracing::warn!(error = %e, "could not read the pod's runtime state after sync")
                }
            }
        } else {
            // Nothing changed in the runtime: the state read at the start still holds, and
            // only the reasons containers wait for may be new.
            self.settle(id, Some(&runtime));
            self.publish_status(pod, id, Some(&runtime));
        }
        if self.is_terminal(pod, id) {
            // Finished just now: the next sync stops what is left of it (its sandbox).
            return Next::ResyncAfter(Duration::ZERO);
        }
        Next::ResyncAfter(next)
    }

    /// `syncTerminatingPod` and the clean-up after it, in the kubelet's order: stop the
    /// containers within the grace period and stop the sandboxes (their networks go with
    /// them), tear the volumes down; once nothing of the pod runs or is mounted (the
    /// kubelet's `podResourcesAreReclaimed`), send its final status and delete it from the
    /// API. Only then are the stopped sandboxes and containers removed and the pod
    /// directories deleted — work the kubelet leaves to its garbage collector, off the path
    /// of a deletion. Every step is idempotent: a failed one is retried from the start, and
    /// a pod whose API object is already gone comes back through housekeeping as an orphan.
    async fn terminate(&self, id: &PodId, pod: Option<&Pod>, grace: i64) -> Next {
        let runtime = match get_pod_status(self.runtime.cri(), &id.uid).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the pod's runtime state");
                return Next::ResyncAfter(RETRY);
            }
        };
        let stopped = if runtime.is_empty() {
            runtime
        } else {
            // Every sandbox must be stopped, its network torn down, before the pod may
            // leave the API: a failed stop keeps the pod Terminating and is retried.
            let killed = self
                .runtime
                .kill_pod((id, pod), &runtime, grace)
                .instrument(tracing::info_span!("kill_pod", grace))
                .await;
            if killed.is_err() {
                return Next::ResyncAfter(RETRY);
            }
            match get_pod_status(self.runtime.cri(), &id.uid).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the pod's runtime state");
                    return Next::ResyncAfter(RETRY);
                }
            }
        };
        // Nothing of the pod runs any more: a shorter grace period changes nothing now.
        self.killed.lock().insert(id.uid.clone(), ());
        if let Err(e) = self.volumes.teardown(&id.uid).await {
            tracing::warn!(error = %e, "could not tear down the pod's volumes");
            return Next::ResyncAfter(RETRY);
        }
        // Resources are reclaimed only once the pod cgroup is gone too.
        if let Err(e) = self.destroy_pod_cgroup(&id.uid).await {
            tracing::warn!(error = %e, "could not remove the pod cgroup");
            return Next::ResyncAfter(RETRY);
        }
        if let Some(pod) = pod {
            if !stopped.is_empty() {
                self.publish_status(pod, id, Some(&stopped));
            }
            let flushed = self
                .status
                .flush(id)
                .instrument(tracing::info_span!("final_status"))
                .await;
            if let Err(e) = flushed {
                tracing::warn!(error = %e, "could not send the final status");
                return Next::ResyncAfter(RETRY);
            }
            crate::fault::point(crate::fault::BEFORE_POD_DELETE);
            let deleted = self
                .status
                .delete_pod(id)
                .instrument(tracing::info_span!("delete_from_api"))
                .await;
            if let Err(e) = deleted {
                tracing::warn!(error = %e, "could not delete the pod");
                return Next::ResyncAfter(RETRY);
            }
        }
        if !stopped.is_empty() {
            let removed = self
                .runtime
                .remove_pod(&stopped)
                .instrument(tracing::info_span!("remove_pod"))
                .await;
            if let Err(e) = removed {
                tracing::warn!(error = %e, "could not remove the pod's sandboxes");
                return Next::ResyncAfter(RETRY);
            }
        }
        for dir in [
            self.volumes.pod_dir(&id.uid),
            pod_log_dir(&self.settings.pod_logs_dir, id),
        ] {
            match tokio::fs::remove_dir_all(&dir).await {
                // A name too long for the filesystem was never made (the pod's sandbox
                // failed on it): nothing to remove, nothing to retry.
                Err(e)
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidFilename
                    ) =>
                {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove pod directory");
                    return Next::ResyncAfter(RETRY);
                }
                _ => {}
            }
        }
        // What this agent remembers of the pod is forgotten as its worker ends.
        tracing::info!("pod terminated and cleaned up");
        Next::Done
    }
}

impl<C: Cri + Clone> PodSyncer for Kubelet<C> {
    async fn sync(&self, work: &PodWork) -> Next {
        match work {
            PodWork::Sync(pod) => {
                let Some(id) = PodId::of(pod) else {
                    return Next::Done;
                };
                if crate::pod::is_terminating(pod) {
                    // An eviction of a pod being deleted shortens its grace period.
                    let grace = crate::pod::termination_grace_period(pod);
                    let grace = self
                        .grace_overrides
                        .lock()
                        .get(&id.uid)
                        .map_or(grace, |&o| o.min(grace));
                    self.terminate(&id, Some(pod), grace)
                        .instrument(tracing::info_span!("terminate_pod"))
                        .await
                } else {
                    let next = self.sync_pod(pod, &id).await;
                    // Wake up exactly at the active deadline, if it comes first.
                    match (next, self.active_deadline_remaining(pod, &id)) {
                        (Next::ResyncAfter(after), Some(left)) if !self.is_terminal(pod, &id) => {
                            Next::ResyncAfter(after.min(left))
                        }
                        _ => next,
                    }
                }
            }
            PodWork::Remove(id) => {
                self.terminate(id, None, crate::pod::ORPHAN_GRACE_SECONDS)
                    .await
            }
        }
    }

    /// A running pod's status, generated anew with the probe results of now from the
    /// runtime state its last sync read (a readiness result changed): no runtime call, no
    /// sync. Not for a pod being deleted or finished, nor one not yet synced.
    fn refresh(&self, work: &PodWork) -> bool {
        let PodWork::Sync(pod) = work else {
            return false;
        };
        let Some(id) = PodId::of(pod) else {
            return false;
        };
        if crate::pod::is_terminating(pod) || self.is_terminal(pod, &id) {
            return false;
        }
        let Some(runtime) = self.seen.lock().get(&id.uid).cloned() else {
            return false;
        };
        self.publish_status(pod, &id, Some(&runtime));
        true
    }

    fn stopping(&self, uid: &str) -> bool {
        !self.killed.lock().contains_key(uid)
    }

    /// The PLEG's last relist of a running pod shows the state its last sync settled: the
    /// sync that started its containers read them running, and the relist that sees them
    /// start after it has nothing new (a pod being deleted is synced at every change).
    fn saw_runtime(&self, work: &PodWork) -> bool {
        let (Some(pleg), PodWork::Sync(pod)) = (&self.pleg, work) else {
            return false;
        };
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return false;
        };
        if crate::pod::is_terminating(pod) {
            return false;
        }
        let Some(relisted) = pleg.fingerprint(uid) else {
            return false;
        };
        self.settled.lock().get(uid) == Some(&relisted)
    }
}

impl<C: Cri + Clone> PodAdmission for Kubelet<C> {
    /// `HandlePodAdditions`: a pod that may not run here ends Failed with the admit
    /// handler's reason (a Warning event too) and never reaches the runtime.
    fn admit(&self, pod: &Arc<Pod>) {
        let Some(id) = PodId::of(pod) else { return };
        if crate::kubetypes::is_static_pod(pod) {
            // Its status goes to its mirror pod.
            self.status.track_static(&id);
        }
        let finished = |p: &Pod| self.finished(p);
        if let Some(rejection) = self.admission.admit(pod, finished) {
            tracing::warn!(pod = %id, reason = %rejection.reason, message = %rejection.message, "pod rejected at admission");
            self.status
                .set_pod_status(&id, rejected_status(pod, &rejection));
            self.runtime
                .events()
                .warning(&id, None, rejection.reason, rejection.message);
        }
    }

    fn forget(&self, uid: &str) {
        self.admission.forget(uid);
    }

    fn retain(&self, listed: &HashSet<String>) {
        self.admission.retain(listed);
    }

    /// Someone else may have changed the status of a running pod in the API since we last
    /// sent it (a pod being deleted gets its final status anyway).
    fn observed(&self, pod: &Pod) {
        if pod.metadata.deletion_timestamp.is_none() {
            self.status.reconcile(pod);
        }
    }

    fn mirror(&self, pod: &Pod, present: bool) {
        self.status.mirror(pod, present);
    }
}

/// Housekeeping, every two seconds once the pod store is synced and the static pod
/// manifests were read (the kubelet's `HandlePodCleanups`): pods the runtime holds that
/// the API does not know get a worker that removes them, and pod directories with no pod
/// are cleaned up.
pub async fn housekeeping<C: Cri + Clone>(
    store: PodStore,
    workers: PodWorkers<Kubelet<C>>,
    pleg: Arc<crate::pleg::Pleg>,
    kubelet: Arc<Kubelet<C>>,
    cancel: tokio_util::sync::CancellationToken,
) {
    let mut synced = store.synced.clone();
    if synced.wait_for(|s| *s).await.is_err() {
        return;
    }
    // Nor are the runtime's pods of static pods before their manifests were read.
    store.statics.listed().await;
    let mut ticker = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let known = store.uids();
        let working: HashSet<String> = workers.uids().into_iter().collect();
        for (uid, id) in pleg.pods() {
            if !known.contains(&uid) && !working.contains(&uid) {
                tracing::info!(pod = %id, "orphaned pod in the runtime; removing it");
                workers.update(&uid, PodWork::Remove(id));
            }
        }
        let keep: HashSet<String> = known.union(&working).cloned().collect();
        if let Err(e) = kubelet.volumes.cleanup_orphans(&keep).await {
            tracing::warn!(error = %e, "could not clean up orphaned pod directories");
        }
        if let Some(cm) = &kubelet.cm {
            cm.cleanup_orphans(&keep).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Probe, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;
    use crate::cni::testutil::TempDir;
    use crate::events::EventRecorder;
    use crate::kuberuntime::runtime_status::testing::{container, sandbox};
    use crate::kuberuntime::sandbox::SandboxSettings;
    use crate::watch_manager::KubePodObjects;
    use crate::watch_manager::SourceCaches;

    /// A runtime that answers every call `Unimplemented`.
    #[derive(Clone)]
    struct NoRuntime;

    impl Cri for NoRuntime {}

    /// The kubelet over managers whose API server and runtime answer nothing.
    fn kubelet(root: &TempDir) -> Kubelet<NoRuntime> {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let wake: Wake = Arc::new(|_: &str, _| {});
        let caches = SourceCaches::new(&client, &wake);
        let (services, _feed) = crate::envvars::ServiceLister::start(client.clone());
        let (events, _rx) = EventRecorder::channel();
        let (node_store, _writer) = kube::runtime::reflector::store();
        Kubelet::new(
            SyncSettings {
                node_name: "n1".into(),
                node_ip: "198.18.0.1".parse().unwrap(),
                root_dir: root.path().to_owned(),
                pod_logs_dir: root.path().join("logs"),
                runtime_name: "containerd".into(),
                memory_capacity: 1 << 30,
            },
            RuntimeManager::new(NoRuntime, SandboxSettings::default(), None, events, 1),
            VolumeManager::new(
                root.path().to_owned(),
                KubePodObjects::new(client.clone(), caches.clone()),
                LinuxMounter,
            ),
            StatusManager::new(client.clone()),
            PodAdmitter::new(
                node_store,
                k8s_openapi::api::core::v1::Node::default(),
                crate::lifecycle::admission::SysctlWhitelist::default(),
                client,
            ),
            wake,
            EnvSourceReader::new(caches, services, Default::default()),
            None,
        )
    }

    /// A pod whose container `c` has a readiness probe.
    fn probed_pod(name: &str) -> Pod {
        let mut pod = crate::pod::testing::pod(name, &[("c", "busybox")]);
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers[0].readiness_probe = Some(Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::Int(1),
                    ..Default::default()
                }),
                initial_delay_seconds: Some(3600),
                ..Default::default()
            });
        }
        pod
    }

    /// Puts the pod's state into every module, through the calls of a sync.
    async fn sync_state(kubelet: &Kubelet<NoRuntime>, root: &TempDir, pod: &Arc<Pod>) {
        let id = PodId::of(pod).unwrap();
        kubelet.admit(pod);
        let volumes = kubelet.pod_volumes(pod, &id).await.unwrap();
        // A projected token would need a mount: the token alone is requested.
        let api = crate::watch_manager::testing::FakeApi::default();
        kubelet.volumes.request_token(&api, &id).await;
        let running = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container("c1", "c", "s1", 0, RunState::Running)],
        };
        kubelet.prober.update_pod(pod, &id, &running);
        kubelet.settle(&id, Some(&running));
        kubelet.publish_status(pod, &id, Some(&running));
        // The container exited: its restart counts a crash back-off, its image pull fails.
        let exited = PodRuntimeStatus {
            sandboxes: running.sandboxes.clone(),
            containers: vec![container("c1", "c", "s1", 0, RunState::Exited)],
        };
        let ctx = PodContext {
            pod_dir: root.path().join("pods").join(&id.uid),
            node_name: "n1".into(),
            host_ip: None,
            volumes,
            runtime_handler: String::new(),
            probes: Some(kubelet.prober.results().clone()),
            sources: kubelet.env.clone(),
            env_sources: tokio::sync::OnceCell::new(),
            pull_secrets: Vec::new(),
            seccomp_profile_root: root.path().join("seccomp"),
            memory_capacity: 1 << 30,
        };
        let outcome = kubelet.runtime.sync_pod(pod, &id, &exited, &ctx).await;
        kubelet
            .reasons
            .lock()
            .insert(id.uid.clone(), outcome.waiting);
        kubelet.failed(&id.uid);
        kubelet
            .evict(pod, "The node was low on resource: memory.", 0)
            .await;
        // What a termination past its kill records (its runtime here answers nothing).
        kubelet.killed.lock().insert(id.uid.clone(), ());
        assert!(!kubelet.stopping(&id.uid));
    }

    #[tokio::test]
    async fn a_readiness_result_refreshes_the_status_from_the_last_state_seen() {
        let root = TempDir::new("refresh");
        let kubelet = kubelet(&root);
        let pod = Arc::new(probed_pod("web"));
        let work = PodWork::Sync(pod.clone());
        assert!(!kubelet.refresh(&work), "never synced: the worker syncs");
        let id = PodId::of(&pod).unwrap();
        let running = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container("c1", "c", "s1", 0, RunState::Running)],
        };
        kubelet.publish_status(&pod, &id, Some(&running));
        let ready = |kubelet: &Kubelet<NoRuntime>| {
            let status = kubelet.status.get(&id.uid).unwrap();
            let container = status.container_statuses.unwrap()[0].ready;
            let condition = status
                .conditions
                .unwrap()
                .into_iter()
                .find(|c| c.type_ == "Ready")
                .unwrap()
                .status;
            (container, condition)
        };
        assert_eq!(ready(&kubelet), (false, "False".to_owned()));
        kubelet.prober.results().set(
            "c1",
            crate::probe::results::ProbeKind::Readiness,
            crate::probe::ProbeResult::Success,
        );
        // The runtime answers nothing here: the status comes from the state seen.
        assert!(kubelet.refresh(&work));
        assert_eq!(ready(&kubelet), (true, "True".to_owned()));
        let mut deleted = (*pod).clone();
        deleted.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        );
        assert!(
            !kubelet.refresh(&PodWork::Sync(Arc::new(deleted))),
            "a pod being deleted is synced"
        );
    }

    #[tokio::test]
    async fn a_relist_of_the_state_the_last_sync_settled_needs_no_sync() {
        let root = TempDir::new("sawruntime");
        let pleg = Arc::new(crate::pleg::Pleg::default());
        let kubelet = kubelet(&root).with_pleg(pleg.clone());
        let pod = Arc::new(probed_pod("web"));
        let id = PodId::of(&pod).unwrap();
        let work = PodWork::Sync(pod.clone());
        let running = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container("c1", "c", "s1", 0, RunState::Running)],
        };
        let relist = |state: &PodRuntimeStatus| {
            let mut r = crate::pleg::Relist::default();
            r.pods.insert(
                id.uid.clone(),
                (id.clone(), crate::pleg::fingerprint_of(state)),
            );
            r
        };
        assert!(!kubelet.known_empty(&id.uid), "no relist yet");
        pleg.set_last(crate::pleg::Relist::default());
        assert!(kubelet.known_empty(&id.uid), "a new pod: nothing to read");
        pleg.set_last(relist(&running));
        assert!(!kubelet.known_empty(&id.uid), "found by the relist");
        assert!(!kubelet.saw_runtime(&work), "never synced");
        kubelet.publish_status(&pod, &id, Some(&running));
        assert!(
            !kubelet.saw_runtime(&work),
            "a status, but no sync settled it"
        );
        kubelet.settle(&id, Some(&running));
        assert!(kubelet.saw_runtime(&work));
        // The container exited after the sync read it.
        let exited = PodRuntimeStatus {
            containers: vec![container("c1", "c", "s1", 0, RunState::Exited)],
            ..running.clone()
        };
        pleg.set_last(relist(&exited));
        assert!(!kubelet.saw_runtime(&work));
        // A sync read it exited after starting it, and did not act on that: the relist
        // that shows it wakes the worker.
        kubelet.settle(&id, None);
        kubelet.publish_status(&pod, &id, Some(&exited));
        assert!(!kubelet.saw_runtime(&work));
        pleg.set_last(crate::pleg::Relist::default());
        assert!(!kubelet.saw_runtime(&work), "gone from the runtime");
        assert!(!kubelet.known_empty(&id.uid), "synced before: read again");
    }

    /// Once the pod is gone, nothing of it is left in any module that keeps per-pod state:
    /// the modules are those registered with the owner, each of which must have held the
    /// pod before (a module registered later fails this test until the sync above fills it).
    #[tokio::test]
    async fn a_gone_pod_is_forgotten_by_every_module() {
        let root = TempDir::new("podstate");
        let kubelet = kubelet(&root);
        let gone = Arc::new(probed_pod("gone"));
        let stays = Arc::new(probed_pod("stays"));
        sync_state(&kubelet, &root, &gone).await;
        sync_state(&kubelet, &root, &stays).await;
        let states = kubelet.pod_states();
        assert!(states.names().len() >= 10, "{states:?}");
        assert_eq!(
            states.holding("uid-gone"),
            states.names(),
            "every module holds the pod"
        );
        states.forget("uid-gone");
        assert_eq!(states.holding("uid-gone"), Vec::<&str>::new());
        assert_eq!(
            states.holding("uid-stays"),
            states.names(),
            "others are kept"
        );
    }
}
