//! The node agent: registration (in `registration.rs`), then two heartbeats, the lease
//! and the node status, the latter like the kubelet's `syncNodeStatus`: computed every
//! `nodeStatusUpdateFrequency`, patched when it changed or every
//! `nodeStatusReportFrequency`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::api::{Api, GetParams, Patch, PatchParams};
use tokio::sync::{Mutex, Notify};
use tokio_util::sync::CancellationToken;

use super::machine::MachineInfo;
use super::runtime::{ContainerRuntime, ReadinessCheck};
use super::status::{
    self, Capacity, ExtendedResources, Observation, Pressure, PressureTracker, SystemFacts,
    set_node_status, status_changed, status_patch,
};
use super::{LeaseController, NodeConfig, NodeError};
use crate::cri::RuntimeHealth;

/// Attempts of one node status update (the kubelet's `nodeStatusUpdateRetry`).
const NODE_STATUS_UPDATE_RETRY: u32 = 5;
/// Deadline of each runtime call made for node status, so that a hung runtime delays a
/// status report by seconds, not by the CRI client's own (long) timeout.
const RUNTIME_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// A runtime that did not answer `Status` for this long is reported down (the kubelet's
/// `baseRuntimeSyncThreshold`); a shorter outage reuses the last answer.
const RUNTIME_DOWN_THRESHOLD: Duration = Duration::from_secs(30);

/// What one node status update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusUpdate {
    /// The status was sent to the API server.
    Patched,
    /// Nothing changed but heartbeat times, and the last report is recent: nothing sent.
    Unchanged,
}

/// State kept between node status computations.
#[derive(Debug, Default)]
pub(super) struct StatusState {
    /// The last runtime version read (`containerd://1.6.20~ds1`).
    runtime_version: Option<String>,
    /// The last `Status` answer, and when it came.
    runtime_health: Option<(Instant, RuntimeHealth)>,
    pressure: PressureTracker,
    /// When the status was last sent.
    pub(super) last_report: Option<Instant>,
}

/// The node agent: owns the Node object of this node, its Lease, and their heartbeats.
///
/// Typical use: [`NodeAgent::new`], [`register`](NodeAgent::register) (retries until the
/// API server accepts the Node), [`wait_for_pod_cidr`](super::wait_for_pod_cidr) if the pod
/// network needs it, then run the heartbeats: the [`lease`](NodeAgent::lease) and the
/// [status loop](NodeAgent::run_status_loop).
pub struct NodeAgent {
    client: kube::Client,
    pub(super) nodes: Api<Node>,
    pub(super) config: NodeConfig,
    machine: Arc<dyn MachineInfo>,
    runtime: Arc<dyn ContainerRuntime>,
    checks: Vec<Arc<dyn ReadinessCheck>>,
    /// The device plugins' resources, read at each status computation.
    extended: Option<Box<dyn Fn() -> ExtendedResources + Send + Sync>>,
    /// Held for a whole status computation and report, so two never interleave.
    pub(super) state: Mutex<StatusState>,
}

impl std::fmt::Debug for NodeAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAgent")
            .field("config", &self.config)
            .field(
                "checks",
                &self.checks.iter().map(|c| c.name()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl NodeAgent {
    /// An agent for the node `config.name`, talking to the API server as `client` (the
    /// node's own identity, `system:node:<name>`), reading `machine` and `runtime`. The
    /// Ready condition also requires every check in `checks` to pass.
    ///
    /// # Errors
    /// [`NodeError::InvalidConfig`] when `config` does not validate.
    pub fn new(
        client: kube::Client,
        config: NodeConfig,
        machine: Arc<dyn MachineInfo>,
        runtime: Arc<dyn ContainerRuntime>,
        checks: Vec<Arc<dyn ReadinessCheck>>,
    ) -> Result<Self, NodeError> {
        config.validate()?;
        Ok(Self {
            nodes: Api::all(client.clone()),
            client,
            config,
            machine,
            runtime,
            checks,
            extended: None,
            state: Mutex::new(StatusState::default()),
        })
    }

    /// The agent, reporting the device plugins' resources `extended` gives.
    #[must_use]
    pub fn with_extended_resources(
        mut self,
        extended: Box<dyn Fn() -> ExtendedResources + Send + Sync>,
    ) -> Self {
        self.extended = Some(extended);
        self
    }

    /// The agent's configuration.
    #[must_use]
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The lease heartbeat: a controller that renews the node's lease until cancelled.
    #[must_use]
    pub fn lease(&self) -> LeaseController {
        LeaseController::new(self.client.clone(), &self.config)
    }

    /// The node status heartbeat: updates the status every period, and at once when
    /// `trigger` asks, until `cancel` fires.
    #[tracing::instrument(name = "node_status", skip_all, fields(node = %self.config.name))]
    pub async fn run_status_loop(
        self: Arc<Self>,
        cancel: CancellationToken,
        trigger: StatusTrigger,
    ) {
        let period = self.config.node_status_update_frequency;
        tracing::info!(?period, "updating node status");
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                outcome = self.update_node_status() => match outcome {
                    Ok(StatusUpdate::Patched) => tracing::debug!("node status reported"),
                    Ok(StatusUpdate::Unchanged) => tracing::trace!("node status unchanged"),
                    Err(e) => tracing::warn!(error = %e, "unable to update node status"),
                },
            }
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(period) => {}
                () = trigger.0.notified() => tracing::debug!("node status update requested"),
            }
        }
        tracing::info!("stopped updating node status");
    }

    /// Computes the node status once and sends it if it changed or is due, retrying the
    /// read and the patch up to five times (the kubelet's `updateNodeStatus`).
    ///
    /// # Errors
    /// [`NodeError::RetriesExhausted`] with the last attempt's error.
    #[tracing::instrument(skip_all, fields(node = %self.config.name))]
    pub async fn update_node_status(&self) -> Result<StatusUpdate, NodeError> {
        let mut state = self.state.lock().await;
        let (obs, pressure) = self.observe(&mut state).await;
        let mut last = None;
        for attempt in 0..NODE_STATUS_UPDATE_RETRY {
            // The first read may come from the API server's cache, as the kubelet's does;
            // retries read from etcd.
            let params = if attempt == 0 {
                GetParams::any()
            } else {
                GetParams::default()
            };
            let result = match self.nodes.get_with(&self.config.name, &params).await {
                Ok(node) => {
                    let (status, changed) = self.compute_status(&node, &obs, pressure);
                    let due = state
                        .last_report
                        .is_none_or(|at| at.elapsed() >= self.config.node_status_report_frequency);
                    if changed || due {
                        self.send_status(node.status.as_ref(), &status, &mut state)
                            .await
                            .map(|_| StatusUpdate::Patched)
                    } else {
                        Ok(StatusUpdate::Unchanged)
                    }
                }
                Err(source) => Err(NodeError::Api {
                    operation: "get Node",
                    node: self.config.name.clone(),
                    source,
                }),
            };
            match result {
                Ok(update) => return Ok(update),
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "error updating node status, will retry");
                    last = Some(e);
                }
            }
        }
        Err(NodeError::RetriesExhausted {
            operation: "update node status",
            node: self.config.name.clone(),
            attempts: NODE_STATUS_UPDATE_RETRY,
            last: Box::new(last.unwrap_or_else(|| NodeError::Cancelled {
                operation: "update node status",
                node: self.config.name.clone(),
            })),
        })
    }

    /// Applies the status setters onto `node`'s status. Returns the new status and whether
    /// it differs from the node's by more than heartbeat times.
    pub(super) fn compute_status(
        &self,
        node: &Node,
        obs: &Observation,
        pressure: Pressure,
    ) -> (NodeStatus, bool) {
        let base = node.status.clone().unwrap_or_default();
        let mut status = base.clone();
        set_node_status(&mut status, &self.config, obs, pressure, &status::now());
        let changed = status_changed(&base, &status);
        (status, changed)
    }

    /// Patches `nodes/status` with the fields of `status` this agent owns (from `base`, the
    /// status it was computed from).
    pub(super) async fn send_status(
        &self,
        base: Option<&NodeStatus>,
        status: &NodeStatus,
        state: &mut StatusState,
    ) -> Result<Node, NodeError> {
        let patched = self
            .nodes
            .patch_status(
                &self.config.name,
                &PatchParams::default(),
                &Patch::Strategic(status_patch(base, status)),
            )
            .await
            .map_err(|source| NodeError::Api {
                operation: "patch Node status",
                node: self.config.name.clone(),
                source,
            })?;
        state.last_report = Some(Instant::now());
        Ok(patched)
    }

    /// Looks at the machine (off the async runtime), the runtime (with a short deadline)
    /// and the readiness checks, and decides which pressure conditions hold.
    pub(super) async fn observe(&self, state: &mut StatusState) -> (Observation, Pressure) {
        let machine = Arc::clone(&self.machine);
        let root_dir = self.config.root_dir.clone();
        let runtime = Arc::clone(&self.runtime);
        // All at once: a hung runtime costs one deadline, not four.
        let (readings, health, version, images) = tokio::join!(
            async move {
                let imagefs = super::image_fs_mountpoint(&*runtime).await;
                tokio::task::spawn_blocking(move || {
                    read_machine(&*machine, &root_dir, imagefs.as_deref())
                })
                .await
            },
            tokio::time::timeout(RUNTIME_CALL_TIMEOUT, self.runtime.runtime_health()),
            tokio::time::timeout(RUNTIME_CALL_TIMEOUT, self.runtime.runtime_version()),
            tokio::time::timeout(RUNTIME_CALL_TIMEOUT, self.runtime.image_list()),
        );
        let readings = readings.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the machine's figures failed");
            MachineReadings::default()
        });

        let now = Instant::now();
        match health {
            Ok(Ok(health)) => state.runtime_health = Some((now, health)),
            Ok(Err(e)) => tracing::warn!(error = %e, "container runtime status check failed"),
            Err(_) => tracing::warn!(
                timeout = ?RUNTIME_CALL_TIMEOUT,
                "container runtime status check timed out"
            ),
        }
        let runtime_health = state
            .runtime_health
            .as_ref()
            .filter(|(at, _)| now.saturating_duration_since(*at) < RUNTIME_DOWN_THRESHOLD)
            .map(|(_, health)| health.clone());
        match version {
            Ok(Ok(version)) => state.runtime_version = Some(version.to_string()),
            Ok(Err(e)) => tracing::debug!(error = %e, "container runtime version unavailable"),
            Err(_) => tracing::debug!("container runtime version timed out"),
        }
        let images = match images {
            Ok(Ok(images)) => Some(status::node_images(
                images,
                self.config.node_status_max_images,
            )),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "container runtime image list unavailable");
                None
            }
            Err(_) => None,
        };
        let failed_checks = self
            .checks
            .iter()
            .filter_map(|c| {
                c.check()
                    .err()
                    .map(|e| format!("{} is not healthy: {e}", c.name()))
            })
            .collect();

        let obs = Observation {
            capacity: readings.capacity,
            memory_available_bytes: readings.memory_available_bytes,
            nodefs: readings.nodefs,
            imagefs: readings.imagefs,
            pids: readings.pids,
            system: SystemFacts {
                runtime_version: state.runtime_version.clone(),
                ..readings.system
            },
            runtime_health,
            failed_checks,
            images,
            extended: self
                .extended
                .as_ref()
                .map(|read| read())
                .unwrap_or_default(),
        };
        let observed = Pressure::observed(&obs, &self.config.eviction_hard);
        if observed != Pressure::default() {
            tracing::warn!(?observed, "hard eviction thresholds met");
        }
        let pressure = state.pressure.update(
            observed,
            now,
            self.config.eviction_pressure_transition_period,
        );
        (obs, pressure)
    }
}

/// The machine part of an [`Observation`].
#[derive(Debug, Default)]
struct MachineReadings {
    capacity: Option<Capacity>,
    memory_available_bytes: Option<u64>,
    nodefs: Option<super::FsStats>,
    imagefs: Option<super::FsStats>,
    pids: Option<super::PidUsage>,
    system: SystemFacts,
}

/// Reads every machine figure, logging (not failing on) the ones that cannot be read.
fn read_machine(
    machine: &dyn MachineInfo,
    root_dir: &Path,
    imagefs: Option<&Path>,
) -> MachineReadings {
    fn ok<T>(result: Result<T, super::MachineError>) -> Option<T> {
        result
            .inspect_err(|e| tracing::warn!(error = %e, "machine figure unavailable"))
            .ok()
    }
    let memory = ok(machine.memory());
    let nodefs = ok(machine.fs_stats(root_dir));
    let capacity = match (ok(machine.num_cpus()), memory) {
        (Some(cpus), Some(memory)) => Some(Capacity {
            cpus,
            memory_bytes: memory.total_bytes,
            hugepages: ok(machine.hugepages()).unwrap_or_default(),
            ephemeral_storage_bytes: nodefs.map(|fs| fs.capacity_bytes),
        }),
        _ => None,
    };
    MachineReadings {
        capacity,
        memory_available_bytes: memory.and_then(|m| m.available_bytes()),
        nodefs,
        imagefs: imagefs.and_then(|path| ok(machine.fs_stats(path))),
        pids: ok(machine.pid_usage()),
        system: SystemFacts {
            machine_id: ok(machine.machine_id()),
            system_uuid: Some(machine.system_uuid().unwrap_or_default()),
            boot_id: ok(machine.boot_id()),
            kernel_version: ok(machine.kernel_version()),
            os_image: ok(machine.os_image()),
            runtime_version: None,
        },
    }
}

/// Asks the node status heartbeat for an immediate update (for instance when the runtime's
/// health or a readiness check changed). Cheap to clone; requests made while an update is
/// running (or before the heartbeat starts) are not lost.
#[derive(Debug, Clone, Default)]
pub struct StatusTrigger(Arc<Notify>);

impl StatusTrigger {
    /// Requests a node status update now rather than at the next period.
    pub fn update_now(&self) {
        self.0.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{NETWORK_READY, RUNTIME_READY};
    use crate::node::machine::fake::{self as machine_fake, FakeMachine, GIB, MIB};
    use crate::node::runtime::fake::{self, FakeRuntime};

    /// A client for an API server that is never contacted by these tests.
    fn offline_client() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    fn agent(
        machine: Arc<FakeMachine>,
        runtime: Arc<FakeRuntime>,
        checks: Vec<Arc<dyn ReadinessCheck>>,
    ) -> NodeAgent {
        let config = NodeConfig::new("rk-node1", "198.18.0.1".parse().unwrap());
        NodeAgent::new(offline_client(), config, machine, runtime, checks).unwrap()
    }

    #[tokio::test]
    async fn observes_the_machine_the_runtime_and_the_checks() {
        let machine = Arc::new(FakeMachine::default());
        let runtime = Arc::new(FakeRuntime::default());
        let failing: Arc<dyn ReadinessCheck> = Arc::new(fake::Failing("PLEG", "relist is stuck"));
        let agent = agent(machine.clone(), runtime.clone(), vec![failing]);
        let mut state = StatusState::default();
        let (obs, pressure) = agent.observe(&mut state).await;
        assert_eq!(obs.capacity.as_ref().unwrap().cpus, 2);
        assert_eq!(
            obs.system.runtime_version.as_deref(),
            Some("containerd://1.6.20~ds1")
        );
        assert_eq!(obs.system.system_uuid.as_deref(), Some(""));
        assert!(obs.runtime_health.as_ref().unwrap().ready());
        assert_eq!(obs.failed_checks, ["PLEG is not healthy: relist is stuck"]);
        assert_eq!(pressure, Pressure::default());

        // Memory pressure is seen, and held after it is gone.
        machine.set(|f| f.memory = Some(machine_fake::memory(24 * GIB, 50 * MIB)));
        let (_, pressure) = agent.observe(&mut state).await;
        assert!(pressure.memory);
        machine.set(|f| f.memory = Some(machine_fake::memory(24 * GIB, 10_000 * MIB)));
        let (_, pressure) = agent.observe(&mut state).await;
        assert!(pressure.memory);
    }

    #[tokio::test]
    async fn a_short_runtime_outage_reuses_the_last_status_then_reports_it_down() {
        let runtime = Arc::new(FakeRuntime::default());
        let agent = agent(Arc::default(), runtime.clone(), Vec::new());
        let mut state = StatusState::default();
        let (obs, _) = agent.observe(&mut state).await;
        assert!(obs.runtime_health.is_some());
        runtime.set_conditions(None);
        let (obs, _) = agent.observe(&mut state).await;
        assert!(obs.runtime_health.is_some(), "within the threshold");
        if let Some((at, _)) = state.runtime_health.as_mut() {
            *at -= RUNTIME_DOWN_THRESHOLD;
        }
        let (obs, _) = agent.observe(&mut state).await;
        assert!(obs.runtime_health.is_none());
        assert_eq!(
            status::not_ready_reasons(None, &obs)[0],
            "container runtime is down"
        );
        // Back, but the network is not ready.
        runtime.set_conditions(Some(vec![
            fake::condition(RUNTIME_READY, true, "", ""),
            fake::condition(
                NETWORK_READY,
                false,
                "NetworkPluginNotReady",
                "cni plugin not initialized",
            ),
        ]));
        let (obs, _) = agent.observe(&mut state).await;
        assert!(!obs.runtime_health.unwrap().network.ready);
    }

    #[tokio::test]
    async fn unreadable_machine_figures_leave_capacity_unknown() {
        let machine = Arc::new(FakeMachine::default());
        machine.set(|f| f.cpus = None);
        let agent = agent(machine, Arc::default(), Vec::new());
        let (obs, _) = agent.observe(&mut StatusState::default()).await;
        assert!(obs.capacity.is_none());
        assert!(obs.memory_available_bytes.is_some());
    }

    #[tokio::test]
    async fn refuses_an_invalid_configuration() {
        let mut config = NodeConfig::new("rk-node1", "198.18.0.1".parse().unwrap());
        config
            .labels
            .insert("node-role.kubernetes.io/master".into(), String::new());
        let err = NodeAgent::new(
            offline_client(),
            config,
            Arc::new(FakeMachine::default()),
            Arc::new(FakeRuntime::default()),
            Vec::new(),
        )
        .unwrap_err();
        assert!(matches!(err, NodeError::InvalidConfig { .. }), "{err}");
    }
}
