//! The container garbage collector (the kubelet's `kuberuntime_gc.go`), run every minute:
//! dead containers older than `--minimum-container-ttl-duration` beyond the newest
//! `--maximum-dead-containers-per-container` of each (pod, container name), then beyond
//! `--maximum-dead-containers` on the node, oldest first; and sandboxes that are neither
//! ready nor hold a container, except the newest of each pod. A removed container's log
//! files (rotated ones included) go with it, through the container log manager.
//!
//! The containers and sandboxes of a pod deleted from the API are not its business: the
//! housekeeping gives such a pod a worker that removes all of it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::labels;
use crate::cri::{Cri, CriError, api, ok_if_not_found};
use crate::images::gc::run_periodically;
use crate::logs::ContainerLogManager;

/// How often the collector runs (the kubelet's `ContainerGCPeriod`).
pub const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);

/// What may be kept (the kubelet's `kubecontainer.GCPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerGcPolicy {
    /// A dead container younger than this is kept.
    pub min_age: Duration,
    /// Dead containers kept per (pod, container name); `None`: no limit.
    pub max_per_pod_container: Option<usize>,
    /// Dead containers kept on the node; `None`: no limit.
    pub max_containers: Option<usize>,
}

impl ContainerGcPolicy {
    /// The policy from the kubelet's flags, where a negative count means no limit.
    #[must_use]
    pub fn new(min_age: Duration, max_per_pod_container: i32, max_containers: i32) -> Self {
        Self {
            min_age,
            max_per_pod_container: usize::try_from(max_per_pod_container).ok(),
            max_containers: usize::try_from(max_containers).ok(),
        }
    }
}

impl Default for ContainerGcPolicy {
    /// The kubelet's defaults: no minimum age, one dead container per container name,
    /// no node-wide limit.
    fn default() -> Self {
        Self::new(Duration::ZERO, 1, -1)
    }
}

/// A dead container the collector may remove.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dead {
    id: String,
    created_at: i64,
    /// In the runtime's unknown state: it may still run, so it is stopped first.
    unknown: bool,
}

/// Dead containers by (pod UID, container name), newest first.
type EvictUnits = BTreeMap<(String, String), Vec<Dead>>;

/// The containers that are not running and were created more than `min_age` before
/// `now`, by evict unit. Containers without the kubelet's labels are not ours.
fn evictable(containers: &[api::Container], min_age: Duration, now: SystemTime) -> EvictUnits {
    let newest = now
        .checked_sub(min_age)
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let mut units = EvictUnits::new();
    for c in containers {
        if c.state == api::ContainerState::ContainerRunning as i32 || c.created_at > newest {
            continue;
        }
        let (Some(uid), Some(name)) = (
            c.labels.get(labels::POD_UID),
            c.labels.get(labels::CONTAINER_NAME),
        ) else {
            continue;
        };
        units
            .entry((uid.clone(), name.clone()))
            .or_default()
            .push(Dead {
                id: c.id.clone(),
                created_at: c.created_at,
                unknown: c.state == api::ContainerState::ContainerUnknown as i32,
            });
    }
    for unit in units.values_mut() {
        unit.sort_by_key(|d| std::cmp::Reverse(d.created_at));
    }
    units
}

/// Keeps the newest `keep` of each unit; the others go to `removed`.
fn keep_newest(units: &mut EvictUnits, keep: usize, removed: &mut Vec<Dead>) {
    for unit in units.values_mut() {
        if unit.len() > keep {
            removed.extend(unit.drain(keep..).rev());
        }
    }
}

/// The dead containers the policy removes (`evictContainers`): beyond the per-unit limit,
/// then beyond the node-wide one, first evenly across units (at least one each), then
/// the oldest first.
fn select_containers(policy: &ContainerGcPolicy, mut units: EvictUnits) -> Vec<Dead> {
    let mut removed = Vec::new();
    if let Some(keep) = policy.max_per_pod_container {
        keep_newest(&mut units, keep, &mut removed);
    }
    let count = |units: &EvictUnits| units.values().map(Vec::len).sum::<usize>();
    if let Some(max) = policy.max_containers
        && count(&units) > max
    {
        let per_unit = (max / units.values().filter(|u| !u.is_empty()).count()).max(1);
        keep_newest(&mut units, per_unit, &mut removed);
        let left = count(&units);
        if left > max {
            let mut all: Vec<Dead> = units.into_values().flatten().collect();
            all.sort_by_key(|d| d.created_at);
            removed.extend(all.into_iter().take(left - max));
        }
    }
    removed
}

/// The sandboxes to remove (`evictSandboxes`): of each pod, every sandbox but the newest
/// that is not ready and holds no container.
fn select_sandboxes(sandboxes: &[api::PodSandbox], containers: &[api::Container]) -> Vec<String> {
    let holding: HashSet<&str> = containers
        .iter()
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();
    let mut by_pod: BTreeMap<&str, Vec<&api::PodSandbox>> = BTreeMap::new();
    for s in sandboxes {
        if let Some(uid) = s.metadata.as_ref().map(|m| m.uid.as_str()) {
            by_pod.entry(uid).or_default().push(s);
        }
    }
    let mut removed = Vec::new();
    for mut pod in by_pod.into_values() {
        pod.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        removed.extend(
            pod.into_iter()
                .skip(1)
                .filter(|s| {
                    s.state != api::PodSandboxState::SandboxReady as i32
                        && !holding.contains(s.id.as_str())
                })
                .map(|s| s.id.clone()),
        );
    }
    removed
}

/// The collector, over the runtime.
pub struct ContainerGc<C> {
    cri: Arc<C>,
    policy: ContainerGcPolicy,
    /// Removes a container's log files (rotated ones included) before the container.
    logs: Arc<ContainerLogManager<C>>,
}

impl<C: Cri> ContainerGc<C> {
    /// A collector applying `policy`.
    pub fn new(cri: Arc<C>, policy: ContainerGcPolicy, logs: Arc<ContainerLogManager<C>>) -> Self {
        Self { cri, policy, logs }
    }

    async fn containers(&self) -> Result<Vec<api::Container>, CriError> {
        let req = api::ListContainersRequest { filter: None };
        Ok(self.cri.list_containers(req).await?.containers)
    }

    /// One collection (`GarbageCollect`): dead containers, then sandboxes. A container
    /// or sandbox that cannot be removed is logged and left for the next run.
    ///
    /// # Errors
    /// A listing failed.
    pub async fn garbage_collect(&self) -> Result<(), CriError> {
        let units = evictable(
            &self.containers().await?,
            self.policy.min_age,
            SystemTime::now(),
        );
        for dead in select_containers(&self.policy, units) {
            self.remove_container(&dead).await;
        }
        let containers = self.containers().await?;
        let sandboxes = self
            .cri
            .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
            .await?
            .items;
        for id in select_sandboxes(&sandboxes, &containers) {
            let req = api::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            };
            match ok_if_not_found(self.cri.remove_pod_sandbox(req).await) {
                Ok(()) => tracing::debug!(sandbox = %id, "removed dead sandbox"),
                Err(e) => tracing::error!(sandbox = %id, error = %e, "Failed to remove sandbox"),
            }
        }
        Ok(())
    }

    async fn remove_container(&self, dead: &Dead) {
        if dead.unknown {
            let req = api::StopContainerRequest {
                container_id: dead.id.clone(),
                timeout: 0,
            };
            if let Err(e) = ok_if_not_found(self.cri.stop_container(req).await) {
                tracing::error!(container = %dead.id, error = %e, "Failed to stop container in unknown state");
                return;
            }
        }
        // As the kubelet's `removeContainer`: the logs first, and the container only once
        // they are gone (a runtime that no longer knows it has nothing to remove).
        match self.logs.clean(&dead.id).await {
            Err(e) if !e.is_not_found() => {
                tracing::error!(container = %dead.id, error = %e, "Failed to remove container log");
                return;
            }
            _ => {}
        }
        let req = api::RemoveContainerRequest {
            container_id: dead.id.clone(),
        };
        match ok_if_not_found(self.cri.remove_container(req).await) {
            Ok(()) => tracing::debug!(container = %dead.id, "removed dead container"),
            Err(e) => {
                tracing::error!(container = %dead.id, error = %e, "Failed to remove container")
            }
        }
    }

    /// Collects now and every [`CONTAINER_GC_PERIOD`] until `cancel`.
    pub async fn run(self: Arc<Self>, cancel: tokio_util::sync::CancellationToken) {
        run_periodically(
            "Container",
            CONTAINER_GC_PERIOD,
            &cancel,
            |_| "",
            || self.garbage_collect(),
        )
        .await;
    }
}

/// Under disk pressure the eviction manager removes dead containers before images and pods
/// (the kubelet's `DeleteAllUnusedContainers` as a node-level reclaim function: one
/// collection under the same policy).
impl<C: Cri> crate::eviction::NodeReclaimer for Arc<ContainerGc<C>> {
    async fn reclaim(&self, signal: crate::eviction::Signal) {
        match self.garbage_collect().await {
            Ok(()) => tracing::info!(signal = signal.name(), "container GC ran to free disk"),
            Err(e) => {
                tracing::warn!(error = %e, signal = signal.name(), "container GC could not free disk");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;

    const SECOND: i64 = 1_000_000_000;

    fn at(secs: i64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    }

    fn container(
        id: &str,
        pod: &str,
        name: &str,
        state: api::ContainerState,
        created: i64,
    ) -> api::Container {
        api::Container {
            id: id.into(),
            pod_sandbox_id: format!("sb-{pod}"),
            state: state as i32,
            created_at: created * SECOND,
            labels: HashMap::from([
                (labels::POD_UID.to_owned(), pod.to_owned()),
                (labels::CONTAINER_NAME.to_owned(), name.to_owned()),
            ]),
            ..Default::default()
        }
    }

    fn exited(id: &str, pod: &str, name: &str, created: i64) -> api::Container {
        container(id, pod, name, api::ContainerState::ContainerExited, created)
    }

    fn removed(policy: ContainerGcPolicy, containers: &[api::Container], now: i64) -> Vec<String> {
        let mut ids: Vec<String> =
            select_containers(&policy, evictable(containers, policy.min_age, at(now)))
                .into_iter()
                .map(|d| d.id)
                .collect();
        ids.sort();
        ids
    }

    #[test]
    fn the_default_keeps_the_newest_dead_container_of_each_name_and_every_running_one() {
        let containers = [
            exited("a1", "p", "a", 1),
            exited("a2", "p", "a", 2),
            exited("a3", "p", "a", 3),
            container("a4", "p", "a", api::ContainerState::ContainerRunning, 4),
            exited("b1", "p", "b", 1),
            exited("q1", "q", "a", 1),
            container("r", "q", "r", api::ContainerState::ContainerRunning, 0),
        ];
        assert_eq!(
            removed(ContainerGcPolicy::default(), &containers, 10),
            ["a1", "a2"]
        );
    }

    #[test]
    fn zero_per_container_removes_every_dead_one_and_no_limit_removes_none() {
        let containers = [exited("a1", "p", "a", 1), exited("a2", "p", "a", 2)];
        let zero = ContainerGcPolicy::new(Duration::ZERO, 0, -1);
        assert_eq!(removed(zero, &containers, 10), ["a1", "a2"]);
        let unlimited = ContainerGcPolicy::new(Duration::ZERO, -1, -1);
        assert!(removed(unlimited, &containers, 10).is_empty());
    }

    #[test]
    fn containers_younger_than_the_minimum_age_are_kept() {
        let containers = [
            exited("a1", "p", "a", 1),
            exited("a2", "p", "a", 2),
            exited("a3", "p", "a", 3),
        ];
        let policy = ContainerGcPolicy::new(Duration::from_secs(8), 0, -1);
        assert_eq!(removed(policy, &containers, 10), ["a1", "a2"]);
    }

    #[test]
    fn the_node_limit_spreads_across_units_then_removes_the_oldest() {
        // Three units of three: a limit of 6 keeps two per unit.
        let mut containers = Vec::new();
        for (pod, base) in [("p", 0), ("q", 10), ("r", 20)] {
            for i in 1..=3 {
                containers.push(exited(&format!("{pod}{i}"), pod, "c", base + i));
            }
        }
        let six = ContainerGcPolicy::new(Duration::ZERO, -1, 6);
        assert_eq!(removed(six, &containers, 100), ["p1", "q1", "r1"]);
        // A limit of 2 for three units: one per unit (the minimum), then the oldest goes.
        let two = ContainerGcPolicy::new(Duration::ZERO, -1, 2);
        assert_eq!(
            removed(two, &containers, 100),
            ["p1", "p2", "p3", "q1", "q2", "r1", "r2"]
        );
    }

    fn sandbox(id: &str, pod: &str, ready: bool, created: i64) -> api::PodSandbox {
        api::PodSandbox {
            id: id.into(),
            metadata: Some(api::PodSandboxMetadata {
                uid: pod.into(),
                ..Default::default()
            }),
            state: if ready {
                api::PodSandboxState::SandboxReady
            } else {
                api::PodSandboxState::SandboxNotready
            } as i32,
            created_at: created,
            ..Default::default()
        }
    }

    #[test]
    fn sandboxes_go_when_not_the_newest_not_ready_and_empty() {
        let sandboxes = [
            sandbox("p1", "p", false, 1),
            sandbox("p2", "p", false, 2),
            sandbox("p3", "p", false, 3),
            sandbox("p4", "p", true, 4),
            sandbox("q1", "q", false, 1),
            sandbox("q2", "q", false, 2),
        ];
        let mut holder = exited("c", "p", "a", 1);
        holder.pod_sandbox_id = "p2".into();
        let mut gone = select_sandboxes(&sandboxes, &[holder]);
        gone.sort();
        // p2 holds a container; q2 is q's newest, though not ready.
        assert_eq!(gone, ["p1", "p3", "q1"]);
    }

    /// A runtime with containers and sandboxes that records removals; each container's
    /// log is `<id>.log` in `log_dir`.
    #[derive(Default)]
    struct Runtime {
        containers: Mutex<Vec<api::Container>>,
        sandboxes: Vec<api::PodSandbox>,
        calls: Mutex<Vec<String>>,
        log_dir: std::path::PathBuf,
    }

    impl Cri for Runtime {
        async fn container_status(
            &self,
            req: api::ContainerStatusRequest,
        ) -> crate::cri::Result<api::ContainerStatusResponse> {
            let log_path = self.log_dir.join(format!("{}.log", req.container_id));
            Ok(api::ContainerStatusResponse {
                status: Some(api::ContainerStatus {
                    log_path: log_path.display().to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            })
        }
        async fn list_containers(
            &self,
            _: api::ListContainersRequest,
        ) -> crate::cri::Result<api::ListContainersResponse> {
            Ok(api::ListContainersResponse {
                containers: self.containers.lock().unwrap().clone(),
            })
        }
        async fn list_pod_sandbox(
            &self,
            _: api::ListPodSandboxRequest,
        ) -> crate::cri::Result<api::ListPodSandboxResponse> {
            Ok(api::ListPodSandboxResponse {
                items: self.sandboxes.clone(),
            })
        }
        async fn stop_container(
            &self,
            req: api::StopContainerRequest,
        ) -> crate::cri::Result<api::StopContainerResponse> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("stop {}", req.container_id));
            Ok(api::StopContainerResponse {})
        }
        async fn remove_container(
            &self,
            req: api::RemoveContainerRequest,
        ) -> crate::cri::Result<api::RemoveContainerResponse> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("remove {}", req.container_id));
            self.containers
                .lock()
                .unwrap()
                .retain(|c| c.id != req.container_id);
            Ok(api::RemoveContainerResponse {})
        }
        async fn remove_pod_sandbox(
            &self,
            req: api::RemovePodSandboxRequest,
        ) -> crate::cri::Result<api::RemovePodSandboxResponse> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("remove sandbox {}", req.pod_sandbox_id));
            Ok(api::RemovePodSandboxResponse {})
        }
    }

    #[tokio::test]
    async fn a_run_stops_unknown_containers_first_and_frees_sandboxes_it_emptied() {
        let mut old = exited("a1", "p", "a", 1);
        old.pod_sandbox_id = "p1".into();
        let mut unknown = container("a2", "p", "a", api::ContainerState::ContainerUnknown, 2);
        unknown.pod_sandbox_id = "p1".into();
        let log_dir = std::env::temp_dir().join(format!("rk-gc-logs-{}", std::process::id()));
        std::fs::create_dir_all(&log_dir).unwrap();
        let logs = [
            "a1.log",
            "a1.log.20260101-000000.gz",
            "a1.log.20260101-000010",
            "a2.log",
            "a3.log",
            "a3.log.20260101-000000.gz",
        ];
        for name in logs {
            std::fs::write(log_dir.join(name), "line\n").unwrap();
        }
        let runtime = Arc::new(Runtime {
            containers: Mutex::new(vec![old, unknown, exited("a3", "p", "a", 3)]),
            sandboxes: vec![sandbox("p1", "p", false, 1), sandbox("p2", "p", true, 2)],
            log_dir: log_dir.clone(),
            ..Default::default()
        });
        let log_manager = Arc::new(ContainerLogManager::new(
            runtime.clone(),
            crate::logs::LogRotatePolicy::default(),
        ));
        let gc = ContainerGc::new(runtime.clone(), ContainerGcPolicy::default(), log_manager);
        gc.garbage_collect().await.unwrap();
        let calls = runtime.calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            ["remove a1", "stop a2", "remove a2", "remove sandbox p1"]
        );
        // The removed containers' logs went with them, rotated ones included; the kept
        // container's stayed.
        let mut left: Vec<String> = std::fs::read_dir(&log_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["a3.log", "a3.log.20260101-000000.gz"]);
        std::fs::remove_dir_all(&log_dir).unwrap();
    }
}
