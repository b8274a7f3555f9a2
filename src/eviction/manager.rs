//! The eviction manager's control loop (the kubelet's `managerImpl.synchronize`): every
//! monitoring interval, observe the signals; when a hard threshold is met, first try to
//! reclaim node-level resources (dead containers and unused images, through a
//! [`NodeReclaimer`]), then rank the active pods and evict one, with grace period 0;
//! after an eviction, wait for the pod to be cleaned up before the next pass. Before the
//! thresholds are acted on, every pod over one of its local storage limits is evicted
//! ([`super::local_storage`]), and then the pass ends there, as in the kubelet. Each pass
//! first updates the node conditions the manager holds ([`NodeConditions`]), which
//! admission reads.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use super::local_storage::{LocalStorage, exceeded, has_limits};
use super::rank::{Candidate, PodUsage, eviction_message, rank};
use super::{EvictionError, NodeConditions, is_critical_or_static};
use crate::node::EvictionHard;
use crate::node::{Observations, Pressure, PressureTracker, Signal, thresholds_met};

/// How often the signals are observed (the kubelet's `evictionMonitoringPeriod`).
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// How long an evicted pod is waited for (`podCleanupTimeout`).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often an evicted pod is checked while waiting (`podCleanupPollFreq`).
const CLEANUP_POLL: Duration = Duration::from_secs(1);
/// Hard thresholds evict at once: the pod's grace period is overridden to 0.
const HARD_EVICTION_GRACE_SECONDS: i64 = 0;
/// A pod over a local storage limit is evicted at once too (`evictPod(pod, 0, ...)`).
const LOCAL_STORAGE_GRACE_SECONDS: i64 = 0;
/// The kubelet's default `--eviction-pressure-transition-period`.
const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(5 * 60);

/// Where the manager's figures come from: the node's signals and the running pods' usage.
pub trait StatsSource: Send + Sync {
    /// The node's signals: the stats' last reading, or, with `update`, a reading made now
    /// (after node-level reclaim, as the kubelet's `Get(updateStats)`).
    fn observe(&self, update: bool) -> impl Future<Output = Observations> + Send;
    /// The usage of each running pod, by UID.
    fn pod_usage(
        &self,
    ) -> impl Future<Output = Result<HashMap<String, PodUsage>, EvictionError>> + Send;
    /// What each running pod holds on the node's local storage (the kubelet's summary:
    /// writable layers, logs, volumes), and whether the images have a filesystem of their
    /// own.
    fn local_storage(&self) -> impl Future<Output = Result<LocalStorage, EvictionError>> + Send;
}

/// The pods, and how one is evicted: the kubelet's `ActivePodsFunc`, `KillPodFunc` and
/// `PodCleanedUpFunc`.
pub trait PodEvictor: Send + Sync {
    /// The pods admitted to this node that have not finished; `None` while the pods are
    /// not yet known (the first list of the API's pods has not come).
    fn active_pods(&self) -> Option<Vec<Arc<Pod>>>;
    /// Ends `pod` Failed with reason `Evicted` and `message` (a Warning event with it),
    /// killing its containers within `grace` seconds.
    fn evict(&self, pod: &Pod, message: &str, grace: i64) -> impl Future<Output = ()> + Send;
    /// Whether nothing of the pod runs any more.
    fn cleaned_up(&self, uid: &str) -> impl Future<Output = bool> + Send;
}

/// Frees node-level resources before pods are evicted under disk pressure: the kubelet's
/// container GC `DeleteAllUnusedContainers` and image GC `DeleteUnusedImages`.
pub trait NodeReclaimer: Send + Sync {
    /// Reclaims what it can for `signal`; errors are logged by the reclaimer.
    fn reclaim(&self, signal: Signal) -> impl Future<Output = ()> + Send;
}

/// No node-level reclaim: pods are evicted at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReclaim;

impl NodeReclaimer for NoReclaim {
    async fn reclaim(&self, _signal: Signal) {}
}

/// Two reclaimers, one after the other (the kubelet's list of node reclaim functions:
/// dead containers first, so that the images they held can go).
impl<A: NodeReclaimer, B: NodeReclaimer> NodeReclaimer for (A, B) {
    async fn reclaim(&self, signal: Signal) {
        self.0.reclaim(signal).await;
        self.1.reclaim(signal).await;
    }
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pass {
    /// No hard threshold is met.
    NoPressure,
    /// A threshold was met and relieved without evicting (node-level reclaim).
    Reclaimed(Signal),
    /// A threshold is met but no pod could be evicted (none active, none evictable, or
    /// their stats could not be read).
    NothingEvicted(Signal),
    /// This pod (by UID) was evicted for this signal.
    Evicted(Signal, String),
    /// These pods (by UID) were evicted for going over their local storage limits.
    LocalStorage(Vec<String>),
}

/// The eviction manager.
#[derive(Debug)]
pub struct EvictionManager<S, E, R> {
    hard: EvictionHard,
    stats: S,
    evictor: E,
    reclaimer: R,
    /// The node conditions held, shared with admission.
    conditions: NodeConditions,
    /// When each condition was last met.
    observed_at: Mutex<PressureTracker>,
    /// How long a condition is held after it was last met.
    transition_period: Duration,
}

impl<S: StatsSource, E: PodEvictor, R: NodeReclaimer> EvictionManager<S, E, R> {
    /// A manager enforcing `hard`, observing through `stats`, evicting through `evictor`.
    pub fn new(hard: EvictionHard, stats: S, evictor: E, reclaimer: R) -> Self {
        Self {
            hard,
            stats,
            evictor,
            reclaimer,
            conditions: NodeConditions::default(),
            observed_at: Mutex::default(),
            transition_period: DEFAULT_PRESSURE_TRANSITION_PERIOD,
        }
    }

    /// The manager, holding its node conditions in `conditions` (shared with admission),
    /// each for `transition_period` after it was last met.
    #[must_use]
    pub fn with_conditions(
        mut self,
        conditions: NodeConditions,
        transition_period: Duration,
    ) -> Self {
        self.conditions = conditions;
        self.transition_period = transition_period;
        self
    }

    /// The kubelet's `nodeConditions`, `nodeConditionsLastObservedAt` and
    /// `nodeConditionsObservedSince`: the conditions of the thresholds `met` now, and
    /// those met less than the transition period ago, become the ones held. Only once the
    /// node's pods are known (the first list of the API's pods admitted): a restarted
    /// agent under pressure admits the pods it ran and evicts them, rather than refusing
    /// them at admission on its first pass (the kubelet's sync loop admits them as its
    /// eviction manager starts, and its first pass waits for the first stats).
    fn update_conditions(&self, met: &[Signal]) {
        if self.evictor.active_pods().is_none() {
            return;
        }
        let observed = Pressure::of_signals(met);
        let held = crate::lock::lock(&self.observed_at).update(
            observed,
            Instant::now(),
            self.transition_period,
        );
        if self.conditions.replace(held) != held {
            tracing::info!(
                conditions = ?held.conditions(),
                "eviction manager: node conditions changed"
            );
        }
    }

    /// One pass (`synchronize`): at most one pod is evicted.
    pub async fn synchronize(&self) -> Pass {
        let observations = self.stats.observe(false).await;
        let met = thresholds_met(&observations, &self.hard);
        self.update_conditions(&met);
        let evicted = self.local_storage_eviction().await;
        if !evicted.is_empty() {
            return Pass::LocalStorage(evicted);
        }
        let Some(&signal) = met.first() else {
            tracing::trace!("no resources are starved");
            return Pass::NoPressure;
        };
        let resource = signal.resource();
        tracing::warn!(
            signal = signal.name(),
            resource,
            ?observations,
            "attempting to reclaim"
        );
        if signal.node_reclaimable() {
            self.reclaimer.reclaim(signal).await;
            let after = self.stats.observe(true).await;
            if thresholds_met(&after, &self.hard).is_empty() {
                tracing::info!(resource, "pressure relieved without evicting pods");
                return Pass::Reclaimed(signal);
            }
        }
        let Some(pods) = self.evictor.active_pods() else {
            tracing::debug!("pods not yet known; no eviction this pass");
            return Pass::NothingEvicted(signal);
        };
        if pods.is_empty() {
            tracing::error!("eviction thresholds have been met, but no pods are active to evict");
            return Pass::NothingEvicted(signal);
        }
        let mut usage = match self.stats.pod_usage().await {
            Ok(usage) => usage,
            Err(e) => {
                tracing::error!(error = %e, "failed to get pod stats");
                return Pass::NothingEvicted(signal);
            }
        };
        let mut candidates: Vec<Candidate> = pods
            .into_iter()
            .map(|pod| {
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                let usage = usage.remove(uid);
                Candidate { pod, usage }
            })
            .collect();
        rank(signal, &mut candidates);
        let ranked: Vec<&str> = candidates
            .iter()
            .filter_map(|c| c.pod.metadata.name.as_deref())
            .collect();
        tracing::info!(?ranked, "pods ranked for eviction");
        for candidate in &candidates {
            let pod = &candidate.pod;
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            if is_critical_or_static(pod) {
                tracing::error!(pod = name, "cannot evict a critical pod");
                continue;
            }
            let message = eviction_message(signal, pod, candidate.usage.as_ref());
            tracing::info!(pod = name, %message, "evicting pod");
            self.evictor
                .evict(pod, &message, HARD_EVICTION_GRACE_SECONDS)
                .await;
            crate::metrics::count_eviction(signal.name());
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            return Pass::Evicted(signal, uid);
        }
        tracing::info!("unable to evict any pods from the node");
        Pass::NothingEvicted(signal)
    }

    /// The kubelet's `localStorageEviction`: every active pod over one of its local storage
    /// limits is evicted, with grace period 0; their UIDs. The usage is read only while a
    /// pod sets such a limit.
    async fn local_storage_eviction(&self) -> Vec<String> {
        let Some(pods) = self.evictor.active_pods() else {
            return Vec::new();
        };
        let limited: Vec<Arc<Pod>> = pods.into_iter().filter(|p| has_limits(p)).collect();
        if limited.is_empty() {
            return Vec::new();
        }
        let storage = match self.stats.local_storage().await {
            Ok(storage) => storage,
            Err(e) => {
                tracing::error!(error = %e, "failed to get the pods' local storage stats");
                return Vec::new();
            }
        };
        tracing::debug!(pods = limited.len(), "local storage limits checked");
        let mut evicted = Vec::new();
        for pod in limited {
            let Some(uid) = pod.metadata.uid.as_deref() else {
                continue;
            };
            let Some(over) = storage
                .pods
                .get(uid)
                .and_then(|usage| exceeded(&pod, usage, storage.dedicated_image_fs))
            else {
                continue;
            };
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            if is_critical_or_static(&pod) {
                tracing::error!(pod = name, "cannot evict a critical pod");
                continue;
            }
            tracing::info!(
                pod = name,
                signal = over.signal.name(),
                message = %over.message,
                "evicting pod over its local storage limit"
            );
            self.evictor
                .evict(&pod, &over.message, LOCAL_STORAGE_GRACE_SECONDS)
                .await;
            crate::metrics::count_eviction(over.signal.name());
            evicted.push(uid.to_owned());
        }
        evicted
    }

    /// Runs passes every [`MONITORING_INTERVAL`] until `cancel` fires; after an eviction,
    /// the next pass waits until the evicted pods are cleaned up (at most 30 s) instead.
    pub async fn run(self, cancel: CancellationToken) {
        tracing::info!(hard = ?self.hard, "eviction manager started");
        loop {
            let pass = tokio::select! {
                () = cancel.cancelled() => return,
                pass = self.synchronize() => pass,
            };
            let wait = async {
                match &pass {
                    Pass::Evicted(_, uid) => self.wait_for_cleanup(std::slice::from_ref(uid)).await,
                    Pass::LocalStorage(uids) => self.wait_for_cleanup(uids).await,
                    _ => tokio::time::sleep(MONITORING_INTERVAL).await,
                }
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = wait => {}
            }
        }
    }

    async fn wait_for_cleanup(&self, uids: &[String]) {
        let waited = tokio::time::timeout(CLEANUP_TIMEOUT, async {
            for uid in uids {
                while !self.evictor.cleaned_up(uid).await {
                    tokio::time::sleep(CLEANUP_POLL).await;
                }
            }
        })
        .await;
        match waited {
            Ok(()) => tracing::info!(?uids, "evicted pods cleaned up"),
            Err(_) => tracing::warn!(
                ?uids,
                "timed out waiting for the evicted pods to be cleaned up"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

    use super::*;
    use crate::eviction::PodStorage;
    use crate::eviction::rank::{ContainerUsage, testing};
    use crate::node::FsStats;

    const MIB: u64 = 1 << 20;

    #[derive(Default)]
    struct Fake {
        /// Memory available, then after a reclaim.
        memory: Mutex<Vec<u64>>,
        /// Percent of the disk available, then after a reclaim.
        disk: Mutex<Vec<u64>>,
        pods: Option<Vec<Arc<Pod>>>,
        usage: HashMap<String, PodUsage>,
        evicted: Mutex<Vec<(String, String, i64)>>,
        reclaimed: Mutex<Vec<Signal>>,
        storage: LocalStorage,
        storage_reads: Mutex<usize>,
    }

    impl StatsSource for &Fake {
        async fn observe(&self, _update: bool) -> Observations {
            fn next(figures: &Mutex<Vec<u64>>) -> u64 {
                let mut figures = figures.lock().unwrap();
                if figures.len() > 1 {
                    figures.remove(0)
                } else {
                    figures[0]
                }
            }
            Observations {
                memory_available_bytes: Some(next(&self.memory)),
                nodefs: Some(FsStats {
                    capacity_bytes: 100,
                    available_bytes: next(&self.disk),
                    inodes: 100,
                    inodes_free: 100,
                }),
                imagefs: None,
                pids: None,
            }
        }
        async fn pod_usage(&self) -> Result<HashMap<String, PodUsage>, EvictionError> {
            Ok(self.usage.clone())
        }
        async fn local_storage(&self) -> Result<LocalStorage, EvictionError> {
            *self.storage_reads.lock().unwrap() += 1;
            Ok(self.storage.clone())
        }
    }

    impl PodEvictor for &Fake {
        fn active_pods(&self) -> Option<Vec<Arc<Pod>>> {
            self.pods.clone()
        }
        async fn evict(&self, pod: &Pod, message: &str, grace: i64) {
            self.evicted.lock().unwrap().push((
                pod.metadata.name.clone().unwrap_or_default(),
                message.to_owned(),
                grace,
            ));
        }
        async fn cleaned_up(&self, _uid: &str) -> bool {
            true
        }
    }

    impl NodeReclaimer for &Fake {
        async fn reclaim(&self, signal: Signal) {
            self.reclaimed.lock().unwrap().push(signal);
        }
    }

    /// A pod with `annotations` and, when given, a Guaranteed memory request.
    fn pod(name: &str, annotations: &[(&str, &str)], memory_request: Option<&str>) -> Arc<Pod> {
        let requests: Vec<(&str, &str)> =
            memory_request.map(|r| ("memory", r)).into_iter().collect();
        let mut p = (*testing::pod(name, &requests, true, 0)).clone();
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        Arc::new(p)
    }

    fn usage(memory: u64) -> PodUsage {
        PodUsage {
            containers: vec![ContainerUsage {
                name: "c".into(),
                working_set_bytes: Some(memory),
                ..ContainerUsage::default()
            }],
        }
    }

    type Manager<'a> = EvictionManager<&'a Fake, &'a Fake, &'a Fake>;

    fn manager(fake: &Fake) -> Manager<'_> {
        EvictionManager::new(EvictionHard::default(), fake, fake, fake)
    }

    #[tokio::test]
    async fn evicts_one_pod_per_pass_best_effort_first_never_a_static_pod() {
        let fake = Fake {
            memory: Mutex::new(vec![10 * MIB]),
            disk: Mutex::new(vec![50]),
            pods: Some(vec![
                pod("guaranteed", &[], Some("64Mi")),
                pod("static", &[("kubernetes.io/config.source", "file")], None),
                pod("besteffort", &[], None),
            ]),
            usage: [
                ("uid-guaranteed".into(), usage(MIB)),
                ("uid-static".into(), usage(500 * MIB)),
                ("uid-besteffort".into(), usage(2 * MIB)),
            ]
            .into(),
            ..Fake::default()
        };
        let pass = manager(&fake).synchronize().await;
        assert_eq!(
            pass,
            Pass::Evicted(Signal::MemoryAvailable, "uid-besteffort".into())
        );
        let evicted = fake.evicted.lock().unwrap().clone();
        assert_eq!(
            evicted,
            [(
                "besteffort".to_owned(),
                "The node was low on resource: memory. Container c was using 2Mi, which exceeds its request of 0. ".to_owned(),
                0
            )]
        );
        // Memory pressure is not relieved by garbage collection.
        assert!(fake.reclaimed.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn disk_pressure_reclaims_node_resources_first() {
        let fake = Fake {
            memory: Mutex::new(vec![10_000 * MIB]),
            disk: Mutex::new(vec![5]),
            pods: Some(vec![pod("besteffort", &[], None)]),
            ..Fake::default()
        };
        let pass = manager(&fake).synchronize().await;
        assert_eq!(
            pass,
            Pass::Evicted(Signal::NodeFsAvailable, "uid-besteffort".into())
        );
        assert_eq!(*fake.reclaimed.lock().unwrap(), [Signal::NodeFsAvailable]);
        assert!(
            fake.evicted.lock().unwrap()[0]
                .1
                .starts_with("The node was low on resource: ephemeral-storage. ")
        );
    }

    #[tokio::test]
    async fn a_reclaim_that_relieves_disk_pressure_evicts_nothing() {
        let fake = Fake {
            memory: Mutex::new(vec![10_000 * MIB]),
            disk: Mutex::new(vec![5, 50]),
            pods: Some(vec![pod("besteffort", &[], None)]),
            ..Fake::default()
        };
        let pass = manager(&fake).synchronize().await;
        assert_eq!(pass, Pass::Reclaimed(Signal::NodeFsAvailable));
        assert!(fake.evicted.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn no_pressure_no_pods_or_only_critical_pods_evict_nothing() {
        let mut fake = Fake {
            memory: Mutex::new(vec![10_000 * MIB]),
            disk: Mutex::new(vec![50]),
            pods: Some(vec![pod("besteffort", &[], None)]),
            ..Fake::default()
        };
        assert_eq!(manager(&fake).synchronize().await, Pass::NoPressure);
        // No pod sets a local storage limit: their storage is not read.
        assert_eq!(*fake.storage_reads.lock().unwrap(), 0);
        fake.memory = Mutex::new(vec![MIB]);
        fake.pods = None;
        assert_eq!(
            manager(&fake).synchronize().await,
            Pass::NothingEvicted(Signal::MemoryAvailable)
        );
        fake.pods = Some(vec![pod(
            "mirror",
            &[("kubernetes.io/config.mirror", "x")],
            None,
        )]);
        assert_eq!(
            manager(&fake).synchronize().await,
            Pass::NothingEvicted(Signal::MemoryAvailable)
        );
        assert!(fake.evicted.lock().unwrap().is_empty());
    }

    /// The conditions of the thresholds a pass met are held at once, before any eviction
    /// and also when nothing can be evicted, and for the transition period after the
    /// pressure is gone; none while the node's pods are not known.
    #[tokio::test]
    async fn a_pass_holds_the_conditions_it_met_for_the_transition_period() {
        fn held_for<'a>(fake: &'a Fake, c: &NodeConditions, period: Duration) -> Manager<'a> {
            manager(fake).with_conditions(c.clone(), period)
        }
        let mut fake = Fake {
            memory: Mutex::new(vec![MIB, 10_000 * MIB]),
            disk: Mutex::new(vec![50]),
            pods: None,
            ..Fake::default()
        };
        let conditions = NodeConditions::default();
        let held = |c: &NodeConditions| c.held().conditions();
        let hour = Duration::from_secs(3600);
        held_for(&fake, &conditions, hour).synchronize().await;
        assert!(held(&conditions).is_empty(), "pods not known yet");

        fake.memory = Mutex::new(vec![MIB, 10_000 * MIB]);
        fake.pods = Some(Vec::new());
        let held_long = held_for(&fake, &conditions, hour);
        assert_eq!(
            held_long.synchronize().await,
            Pass::NothingEvicted(Signal::MemoryAvailable)
        );
        assert_eq!(held(&conditions), ["MemoryPressure"]);
        assert_eq!(held_long.synchronize().await, Pass::NoPressure);
        assert_eq!(held(&conditions), ["MemoryPressure"], "within the period");

        fake.memory = Mutex::new(vec![MIB, 10_000 * MIB]);
        fake.disk = Mutex::new(vec![5]);
        fake.pods = Some(vec![pod("besteffort", &[], None)]);
        let period = Duration::from_millis(200);
        let held_short = held_for(&fake, &conditions, period);
        held_short.synchronize().await;
        assert_eq!(fake.evicted.lock().unwrap().len(), 1);
        assert_eq!(held(&conditions), ["MemoryPressure", "DiskPressure"]);
        tokio::time::sleep(period).await;
        *fake.disk.lock().unwrap() = vec![50];
        held_short.synchronize().await;
        assert!(held(&conditions).is_empty(), "held past the period");
    }

    /// A pod with a 10Mi ephemeral-storage limit, its container `c` using `used` bytes of
    /// writable layer.
    fn limited(name: &str, annotations: &[(&str, &str)], used: u64) -> (Arc<Pod>, PodStorage) {
        let mut p = (*pod(name, annotations, None)).clone();
        let limits = [("ephemeral-storage".to_owned(), ApiQuantity("10Mi".into()))].into();
        p.spec.as_mut().unwrap().containers[0]
            .resources
            .get_or_insert_default()
            .limits = Some(limits);
        let storage = PodStorage {
            containers: vec![ContainerUsage {
                name: "c".into(),
                rootfs_bytes: Some(used),
                logs_bytes: Some(0),
                ..ContainerUsage::default()
            }],
            ..PodStorage::default()
        };
        (Arc::new(p), storage)
    }

    #[tokio::test]
    async fn pods_over_their_local_storage_limits_are_evicted_at_once_before_pressure() {
        let (over, over_usage) = limited("over", &[], 20 * MIB);
        let (within, within_usage) = limited("within", &[], MIB);
        let (critical, critical_usage) = limited(
            "static",
            &[("kubernetes.io/config.source", "file")],
            20 * MIB,
        );
        let (second, second_usage) = limited("second", &[], 11 * MIB);
        let fake = Fake {
            // Memory pressure too: the local storage evictions end the pass.
            memory: Mutex::new(vec![MIB]),
            disk: Mutex::new(vec![50]),
            pods: Some(vec![over, within, critical, second]),
            storage: LocalStorage {
                dedicated_image_fs: false,
                pods: [
                    ("uid-over".into(), over_usage),
                    ("uid-within".into(), within_usage),
                    ("uid-static".into(), critical_usage),
                    ("uid-second".into(), second_usage),
                ]
                .into(),
            },
            ..Fake::default()
        };
        let pass = manager(&fake).synchronize().await;
        assert_eq!(
            pass,
            Pass::LocalStorage(vec!["uid-over".into(), "uid-second".into()])
        );
        let message =
            "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. ";
        assert_eq!(
            *fake.evicted.lock().unwrap(),
            [
                ("over".to_owned(), message.to_owned(), 0),
                ("second".to_owned(), message.to_owned(), 0)
            ]
        );
    }

    #[tokio::test]
    async fn a_pod_within_its_local_storage_limits_is_left_alone() {
        let (within, within_usage) = limited("within", &[], MIB);
        let fake = Fake {
            memory: Mutex::new(vec![10_000 * MIB]),
            disk: Mutex::new(vec![50]),
            pods: Some(vec![within]),
            storage: LocalStorage {
                dedicated_image_fs: false,
                pods: [("uid-within".into(), within_usage)].into(),
            },
            ..Fake::default()
        };
        assert_eq!(manager(&fake).synchronize().await, Pass::NoPressure);
        assert_eq!(*fake.storage_reads.lock().unwrap(), 1);
        assert!(fake.evicted.lock().unwrap().is_empty());
    }
}
