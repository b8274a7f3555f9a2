//! The container manager ("cm", the kubelet's `pkg/kubelet/cm`): the node's QoS cgroup
//! hierarchy (`kubepods` sized to the node, `kubepods/burstable`, `kubepods/besteffort`),
//! one cgroup per pod (`pod<uid>`, directly under `kubepods` for Guaranteed pods) made
//! before the pod's sandbox and given to it as its cgroup parent, removed once the pod's
//! containers are gone (processes left inside killed first), also for pods found orphaned
//! after an agent restart; and the OOM score policy of containers. With
//! `--cgroups-per-qos=false` none of this happens and sandboxes get no cgroup parent.
//!
//! Cgroups are made by one of two drivers behind [`CgroupManager`] (`--cgroup-driver`):
//! cgroupfs ([`cgroupfs`], directories written directly) or systemd ([`systemd`], slice
//! units through systemd's D-Bus API); the rest of the agent sees only internal cgroup
//! names and the driver's form of a sandbox's cgroup parent. The driver must be the
//! container runtime's ([`check_runtime_driver`]).
//!
//! Knows no pod source, pod worker or runtime manager: it is asked for a pod's cgroup and
//! answers with the driver's form.

mod cgroup_manager;
pub mod cgroupfs;
pub mod devicemanager;
mod metrics;
mod policy;
mod resource_config;
mod runtime_driver;
pub mod systemd;

use crate::lock::lock;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

pub use cgroup_manager::{CgroupDriver, CgroupManager, CgroupName, CgroupPath, CmError};
pub use cgroupfs::{
    CgroupFs, CgroupLayout, CgroupfsManager, FsCgroups, Hierarchy, LinuxCgroupFs, cpu_weight,
};
pub use policy::{
    BEST_EFFORT_OOM_SCORE_ADJ, GUARANTEED_OOM_SCORE_ADJ, container_oom_score_adj, is_critical,
};
pub use resource_config::{
    MIN_SHARES, QUOTA_PERIOD, ResourceConfig, hugepage_limits, hugepage_unit, milli_cpu_to_quota,
    milli_cpu_to_shares, pod_requests_and_limits, resource_config_for_pod,
};
pub use runtime_driver::{RuntimeDriver, check_runtime_driver, runtime_cgroup_driver};
pub use systemd::{SystemdBus, SystemdError, SystemdManager, ZbusSystemd};

use crate::resources::{QosClass, qos_class};

/// The cgroup driver of `--cgroup-driver`, ready on this host: the systemd driver's
/// connection is made at start, so a host without systemd stops the start.
#[derive(Debug, Clone)]
pub enum HostDriver {
    /// The cgroupfs driver.
    Cgroupfs,
    /// The systemd driver, connected.
    Systemd(Arc<ZbusSystemd>),
}

impl HostDriver {
    /// Connects the driver: nothing to do for cgroupfs; systemd must run and answer.
    ///
    /// # Errors
    /// [`SystemdError::NotRunning`] on a host not booted with systemd, or no connection.
    pub async fn connect(driver: CgroupDriver) -> Result<Self, CmError> {
        match driver {
            CgroupDriver::Cgroupfs => Ok(Self::Cgroupfs),
            CgroupDriver::Systemd => Ok(Self::Systemd(Arc::new(ZbusSystemd::connect().await?))),
        }
    }

    /// Which driver.
    #[must_use]
    pub fn driver(&self) -> CgroupDriver {
        match self {
            Self::Cgroupfs => CgroupDriver::Cgroupfs,
            Self::Systemd(_) => CgroupDriver::Systemd,
        }
    }
}

/// The QoS cgroups (`QOSContainersInfo`): where each class's pod cgroups go, and the
/// driver that names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosContainers {
    /// `kubepods`: node allocatable, and the parent of Guaranteed pods.
    pub guaranteed: CgroupName,
    /// `kubepods/burstable`.
    pub burstable: CgroupName,
    /// `kubepods/besteffort`.
    pub best_effort: CgroupName,
    /// The driver whose form a cgroup parent takes.
    pub driver: CgroupDriver,
}

/// The prefix of a pod cgroup's name.
const POD_PREFIX: &str = "pod";

impl QosContainers {
    /// The hierarchy under `--cgroup-root` (`/` by default, a cgroupfs path whatever the
    /// driver, as the kubelet reads it), named by `driver`.
    #[must_use]
    pub fn new(cgroup_root: &str, driver: CgroupDriver) -> Self {
        let kubepods = CgroupName::from_cgroupfs(cgroup_root).child("kubepods");
        Self {
            burstable: kubepods.child("burstable"),
            best_effort: kubepods.child("besteffort"),
            guaranteed: kubepods,
            driver,
        }
    }

    /// The hierarchy under `--cgroup-root` with the cgroupfs driver.
    #[must_use]
    pub fn under(cgroup_root: &str) -> Self {
        Self::new(cgroup_root, CgroupDriver::Cgroupfs)
    }

    fn parent(&self, class: QosClass) -> &CgroupName {
        match class {
            QosClass::Guaranteed => &self.guaranteed,
            QosClass::Burstable => &self.burstable,
            QosClass::BestEffort => &self.best_effort,
        }
    }

    /// The pod's cgroup (`GetPodContainerName`).
    #[must_use]
    pub fn pod_cgroup(&self, pod: &Pod) -> CgroupName {
        let class = pod.spec.as_ref().map_or(QosClass::BestEffort, qos_class);
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.parent(class).child(&format!("{POD_PREFIX}{uid}"))
    }
}

/// The sandbox's `CgroupParent` (`GetPodCgroupParent`): the pod cgroup in the driver's
/// form (`CgroupManager.Name`): `/kubepods/burstable/pod<uid>`, or with systemd
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice`
/// (containerd with `SystemdCgroup = true` takes the last slice); empty without the QoS
/// hierarchy.
#[must_use]
pub fn cgroup_parent(qos: Option<&QosContainers>, pod: &Pod) -> String {
    qos.map(|q| q.driver.name(&q.pod_cgroup(pod)))
        .unwrap_or_default()
}

/// Node facts the `kubepods` cgroup is sized from (node allocatable with nothing
/// reserved: the node's capacity).
#[derive(Debug, Clone, Default)]
pub struct NodeCapacity {
    /// CPUs, in millicores.
    pub cpu_millis: i64,
    /// Memory, in bytes.
    pub memory_bytes: i64,
    /// `kernel.pid_max`.
    pub pids: i64,
    /// Huge pages, in bytes, by page size in bytes: every size the machine has.
    pub hugepages: BTreeMap<u64, i64>,
}

/// No limit on huge pages (the QoS cgroups').
const HUGEPAGES_UNBOUNDED: i64 = 1 << 62;

/// The container manager, over either cgroup driver.
pub struct ContainerManager {
    qos: QosContainers,
    capacity: NodeCapacity,
    cgroups: Arc<dyn CgroupManager>,
    /// The pods this agent made or found a cgroup for, by UID, with their CPU request
    /// when Burstable (0 otherwise): the kubelet's active pods, for the `burstable`
    /// cgroup's shares. Never orphans.
    pods: Mutex<HashMap<String, i64>>,
    /// Held across a QoS update, from summing the requests to the last write, as the
    /// kubelet's `UpdateCgroups` holds its lock: two pod syncs updating at once would
    /// otherwise write their sums in either order, and the older sum could land last.
    qos_update: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ContainerManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerManager")
            .field("qos", &self.qos)
            .finish_non_exhaustive()
    }
}

impl ContainerManager {
    /// The manager of the host's cgroups (as `/proc/self/mountinfo` shows them) with the
    /// QoS hierarchy under `--cgroup-root`, made by `driver`.
    ///
    /// # Errors
    /// No cgroup file system mounted.
    pub async fn for_host(
        cgroup_root: &str,
        capacity: NodeCapacity,
        driver: &HostDriver,
    ) -> Result<Self, CmError> {
        let path = PathBuf::from("/proc/self/mountinfo");
        let mountinfo = tokio::fs::read_to_string(&path)
            .await
            .map_err(|source| CmError::Io {
                what: "reading",
                path,
                source,
            })?;
        let layout = CgroupLayout::from_mountinfo(&mountinfo).ok_or(CmError::NoCgroups)?;
        let sizes = capacity.hugepages.keys().copied().collect();
        let files = FsCgroups::new(LinuxCgroupFs, layout).with_hugepage_sizes(sizes);
        let driver: Arc<dyn CgroupManager> = match driver {
            HostDriver::Cgroupfs => Arc::new(CgroupfsManager::new(files)),
            HostDriver::Systemd(bus) => Arc::new(SystemdManager::new(files, bus.clone())),
        };
        let cgroups: Arc<dyn CgroupManager> = Arc::new(metrics::Instrumented(driver));
        Ok(Self::new(cgroups, cgroup_root, capacity))
    }

    /// The manager over `cgroups`, with the QoS hierarchy under `cgroup_root`.
    pub fn new(cgroups: Arc<dyn CgroupManager>, cgroup_root: &str, capacity: NodeCapacity) -> Self {
        Self {
            qos: QosContainers::new(cgroup_root, cgroups.driver()),
            capacity,
            cgroups,
            pods: Mutex::default(),
            qos_update: tokio::sync::Mutex::default(),
        }
    }

    /// The QoS cgroups.
    pub fn qos_containers(&self) -> &QosContainers {
        &self.qos
    }

    /// A cgroup in the driver's form, for logs.
    fn literal(&self, name: &CgroupName) -> String {
        self.cgroups.driver().name(name)
    }

    /// Makes the QoS hierarchy at agent start (`createNodeAllocatableCgroups` and the QoS
    /// container manager's `Start`): `kubepods` with the node's CPU shares, memory and
    /// PIDs, `burstable`, and `besteffort` with the fewest CPU shares.
    ///
    /// # Errors
    /// A cgroup that cannot be made or set.
    pub async fn start(&self) -> Result<(), CmError> {
        let node = ResourceConfig {
            cpu_shares: Some(milli_cpu_to_shares(self.capacity.cpu_millis)),
            memory: (self.capacity.memory_bytes > 0).then_some(self.capacity.memory_bytes),
            pids_limit: (self.capacity.pids > 0).then_some(self.capacity.pids),
            hugepage_limits: self.capacity.hugepages.clone(),
            ..Default::default()
        };
        let classes = [
            (&self.qos.guaranteed, node),
            (&self.qos.burstable, self.qos_config(None)),
            (&self.qos.best_effort, self.qos_config(Some(MIN_SHARES))),
        ];
        for (name, config) in &classes {
            if self.cgroups.exists(name).await? {
                self.cgroups.update(name, config).await?;
            } else {
                self.cgroups.create(name, config).await?;
            }
        }
        tracing::info!(
            root = %self.literal(&self.qos.guaranteed),
            driver = %self.cgroups.driver(),
            "QoS cgroups ready"
        );
        self.update_qos().await
    }

    /// A QoS cgroup's settings: these CPU shares and no limit on huge pages.
    fn qos_config(&self, cpu_shares: Option<u64>) -> ResourceConfig {
        ResourceConfig {
            cpu_shares,
            hugepage_limits: self
                .capacity
                .hugepages
                .keys()
                .map(|size| (*size, HUGEPAGES_UNBOUNDED))
                .collect(),
            ..Default::default()
        }
    }

    /// Sets the `burstable` cgroup's CPU shares from the Burstable pods' requests and
    /// `besteffort`'s to the fewest (`UpdateCgroups`).
    ///
    /// # Errors
    /// A cgroup that cannot be set.
    pub async fn update_qos(&self) -> Result<(), CmError> {
        let _one_at_a_time = self.qos_update.lock().await;
        let requests: i64 = lock(&self.pods).values().sum();
        let burstable = self.qos_config(Some(milli_cpu_to_shares(requests)));
        self.cgroups.update(&self.qos.burstable, &burstable).await?;
        let best_effort = self.qos_config(Some(MIN_SHARES));
        self.cgroups
            .update(&self.qos.best_effort, &best_effort)
            .await
    }

    /// Whether the pod's cgroup exists.
    ///
    /// # Errors
    /// The check could not run.
    pub async fn pod_exists(&self, pod: &Pod) -> Result<bool, CmError> {
        self.cgroups.exists(&self.qos.pod_cgroup(pod)).await
    }

    /// Makes the pod's cgroup with `ResourceConfigForPod` unless it exists
    /// (`EnsureExists`); the QoS cgroups are updated first for a new one.
    ///
    /// # Errors
    /// The pod cgroup cannot be made or set.
    pub async fn ensure_pod(&self, pod: &Pod) -> Result<(), CmError> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // A Burstable pod seen for the first time (also after an agent restart) changes
        // the burstable cgroup's shares.
        let cpu = if qos_class(spec) == QosClass::Burstable {
            pod_requests_and_limits(spec).0.cpu.unwrap_or(0)
        } else {
            0
        };
        let counted = lock(&self.pods).insert(uid, cpu) != Some(cpu);
        let exists = self.pod_exists(pod).await?;
        if (counted || !exists)
            && let Err(e) = self.update_qos().await
        {
            tracing::warn!(error = %e, "could not update the QoS cgroups");
        }
        if exists {
            return Ok(());
        }
        let name = self.qos.pod_cgroup(pod);
        let config = resource_config_for_pod(spec);
        tracing::info!(cgroup = %self.literal(&name), ?config, "creating the pod cgroup");
        self.cgroups.create(&name, &config).await
    }

    /// The pod cgroups found under the QoS cgroups, by pod UID
    /// (`GetAllPodsFromCgroups`).
    ///
    /// # Errors
    /// A QoS cgroup that cannot be listed.
    async fn pod_cgroups(&self) -> Result<HashMap<String, CgroupName>, CmError> {
        let mut found = HashMap::new();
        for parent in [
            &self.qos.guaranteed,
            &self.qos.burstable,
            &self.qos.best_effort,
        ] {
            for child in self.cgroups.children(parent).await? {
                if let Some(uid) = child.0.last().and_then(|c| c.strip_prefix(POD_PREFIX)) {
                    found.insert(uid.to_owned(), child.clone());
                }
            }
        }
        Ok(found)
    }

    /// Removes the pod's cgroup, whatever its QoS class, killing processes left inside
    /// first (`Destroy`); then the QoS cgroups follow.
    ///
    /// # Errors
    /// The cgroup cannot be emptied or removed.
    pub async fn destroy_pod(&self, uid: &str) -> Result<(), CmError> {
        let found = self.pod_cgroups().await?;
        if let Some(name) = found.get(uid) {
            tracing::info!(cgroup = %self.literal(name), "removing the pod cgroup");
            self.cgroups.destroy(name).await?;
        }
        if lock(&self.pods).remove(uid).is_some()
            && let Err(e) = self.update_qos().await
        {
            tracing::warn!(error = %e, "could not update the QoS cgroups");
        }
        Ok(())
    }

    /// Removes the cgroups of pods not in `keep` (`cleanupOrphanedPodCgroups`): pods
    /// that ended while the agent was down. The cgroups of pods this agent synced are
    /// left to their termination, so a pod that has just arrived is never taken for an
    /// orphan.
    pub async fn cleanup_orphans(&self, keep: &HashSet<String>) {
        let found = match self.pod_cgroups().await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "could not list pod cgroups");
                return;
            }
        };
        let ours: HashSet<String> = lock(&self.pods).keys().cloned().collect();
        for uid in found
            .keys()
            .filter(|uid| !keep.contains(*uid) && !ours.contains(*uid))
        {
            tracing::info!(uid, "orphaned pod cgroup; removing it");
            if let Err(e) = self.destroy_pod(uid).await {
                tracing::warn!(uid, error = %e, "could not remove an orphaned pod cgroup");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cgroupfs::testing::FakeCgroupFs;
    use super::resource_config::ResourceConfig;
    use super::resource_config::tests::container;
    use super::systemd::testing::{Call, FakeSystemd};
    use super::*;
    use futures::future::BoxFuture;
    use k8s_openapi::api::core::v1::PodSpec;
    use std::path::Path;

    fn pod(uid: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                containers: vec![container("c", requests, limits)],
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.uid = Some(uid.into());
        p
    }

    fn files() -> (FakeCgroupFs, FsCgroups<FakeCgroupFs>) {
        cgroupfs::testing::v1_files(&["cpu", "memory", "pids", "hugetlb"])
    }

    fn capacity() -> NodeCapacity {
        NodeCapacity {
            cpu_millis: 2000,
            memory_bytes: 4 << 30,
            pids: 32768,
            hugepages: [(2 << 20, 0)].into(),
        }
    }

    fn manager() -> (FakeCgroupFs, ContainerManager) {
        let (fs, files) = files();
        let driver = Arc::new(CgroupfsManager::new(files));
        (fs, ContainerManager::new(driver, "/", capacity()))
    }

    fn systemd_manager(root: &str) -> (FakeCgroupFs, Arc<FakeSystemd>, ContainerManager) {
        let (fs, files) = files();
        let bus = Arc::new(FakeSystemd {
            version: Some(252),
            fs: Some(fs.clone()),
            ..Default::default()
        });
        let driver = Arc::new(SystemdManager::new(files, bus.clone()));
        (fs, bus, ContainerManager::new(driver, root, capacity()))
    }

    #[test]
    fn pods_go_under_their_qos_class() {
        let q = QosContainers::under("/");
        let parent = |p: &Pod| cgroup_parent(Some(&q), p);
        assert_eq!(parent(&pod("u1", &[], &[])), "/kubepods/besteffort/podu1");
        assert_eq!(
            parent(&pod("u2", &[("cpu", "100m")], &[])),
            "/kubepods/burstable/podu2"
        );
        assert_eq!(
            parent(&pod("u3", &[], &[("cpu", "1"), ("memory", "1Gi")])),
            "/kubepods/podu3"
        );
        assert_eq!(cgroup_parent(None, &pod("u1", &[], &[])), "");
        assert_eq!(
            QosContainers::under("/custom/root").burstable.to_cgroupfs(),
            "/custom/root/kubepods/burstable"
        );
    }

    #[tokio::test]
    async fn start_sizes_kubepods_to_the_node_and_burstable_follows_its_pods() {
        let (fs, m) = manager();
        m.start().await.unwrap();
        assert_eq!(
            fs.file("/cg/cpu/kubepods/cpu.shares").as_deref(),
            Some("2048")
        );
        assert_eq!(
            fs.file("/cg/memory/kubepods/memory.limit_in_bytes")
                .as_deref(),
            Some("4294967296")
        );
        assert_eq!(
            fs.file("/cg/pids/kubepods/pids.max").as_deref(),
            Some("32768")
        );
        // Huge pages: the node's on kubepods, unbounded on the QoS classes.
        let hugetlb = |dir: &str| fs.file(&format!("/cg/hugetlb/{dir}/hugetlb.2MB.limit_in_bytes"));
        assert_eq!(hugetlb("kubepods").as_deref(), Some("0"));
        assert_eq!(
            hugetlb("kubepods/burstable").as_deref(),
            Some("4611686018427387904")
        );
        assert_eq!(
            fs.file("/cg/cpu/kubepods/besteffort/cpu.shares").as_deref(),
            Some("2")
        );
        assert_eq!(
            fs.file("/cg/cpu/kubepods/burstable/cpu.shares").as_deref(),
            Some("2")
        );

        let a = pod("a", &[("cpu", "250m")], &[]);
        let b = pod("b", &[("cpu", "500m")], &[("cpu", "1")]);
        m.ensure_pod(&a).await.unwrap();
        m.ensure_pod(&b).await.unwrap();
        assert_eq!(
            fs.file("/cg/cpu/kubepods/burstable/cpu.shares").as_deref(),
            Some("768")
        );
        assert_eq!(
            fs.file("/cg/cpu/kubepods/burstable/podb/cpu.cfs_quota_us")
                .as_deref(),
            Some("100000")
        );
        assert_eq!(
            fs.file("/cg/cpu/kubepods/burstable/poda/cpu.cfs_quota_us"),
            None
        );

        m.destroy_pod("a").await.unwrap();
        assert!(!fs.exists(Path::new("/cg/cpu/kubepods/burstable/poda")));
        assert_eq!(
            fs.file("/cg/cpu/kubepods/burstable/cpu.shares").as_deref(),
            Some("512")
        );
    }

    /// A driver whose first update of a cgroup named `slow` takes 50 ms: what a busy
    /// systemd or file system does to one of two pod syncs updating the QoS cgroups.
    struct SlowFirstUpdate {
        inner: Arc<dyn CgroupManager>,
        slow: &'static str,
        slowed: std::sync::atomic::AtomicBool,
        /// Told when the slow update has begun.
        began: tokio::sync::Notify,
    }

    impl CgroupManager for SlowFirstUpdate {
        fn driver(&self) -> CgroupDriver {
            self.inner.driver()
        }
        fn exists<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<bool, CmError>> {
            self.inner.exists(name)
        }
        fn create<'a>(
            &'a self,
            name: &'a CgroupName,
            config: &'a ResourceConfig,
        ) -> BoxFuture<'a, Result<(), CmError>> {
            self.inner.create(name, config)
        }
        fn update<'a>(
            &'a self,
            name: &'a CgroupName,
            config: &'a ResourceConfig,
        ) -> BoxFuture<'a, Result<(), CmError>> {
            use std::sync::atomic::Ordering;
            let delay =
                name.to_cgroupfs() == self.slow && !self.slowed.swap(true, Ordering::SeqCst);
            Box::pin(async move {
                if delay {
                    self.began.notify_one();
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                self.inner.update(name, config).await
            })
        }
        fn destroy<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<(), CmError>> {
            self.inner.destroy(name)
        }
        fn children<'a>(
            &'a self,
            name: &'a CgroupName,
        ) -> BoxFuture<'a, Result<Vec<CgroupName>, CmError>> {
            self.inner.children(name)
        }
    }

    #[tokio::test]
    async fn two_pods_synced_at_once_leave_burstable_with_both_requests() {
        let (fs, files) = files();
        let driver = Arc::new(SlowFirstUpdate {
            inner: Arc::new(CgroupfsManager::new(files)),
            slow: "/kubepods/burstable",
            // Not start's update: only the one armed below.
            slowed: std::sync::atomic::AtomicBool::new(true),
            began: tokio::sync::Notify::new(),
        });
        let m = ContainerManager::new(driver.clone(), "/", capacity());
        m.start().await.unwrap();
        // The next update of burstable is slow: pod a's, its sum made before pod b came.
        driver
            .slowed
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let a = pod("a", &[("cpu", "250m")], &[]);
        let b = pod("b", &[("cpu", "500m")], &[]);
        // Pod b arrives while pod a's update is under way.
        let b_during_a = async {
            driver.began.notified().await;
            m.ensure_pod(&b).await
        };
        let (ra, rb) = tokio::join!(m.ensure_pod(&a), b_during_a);
        ra.unwrap();
        rb.unwrap();
        assert_eq!(
            fs.file("/cg/cpu/kubepods/burstable/cpu.shares").as_deref(),
            Some("768"),
            "the burstable cgroup has both pods' requests, whichever sync wrote last"
        );
    }

    #[tokio::test]
    async fn orphaned_pod_cgroups_are_removed_and_kept_ones_stay() {
        let (fs, m) = manager();
        m.start().await.unwrap();
        let g = pod("g", &[], &[("cpu", "1"), ("memory", "64Mi")]);
        m.ensure_pod(&g).await.unwrap();
        // A pod synced by this agent is not an orphan, whatever `keep` says.
        m.cleanup_orphans(&HashSet::new()).await;
        assert!(fs.exists(Path::new("/cg/cpu/kubepods/podg")));
        assert_eq!(
            fs.file("/cg/memory/kubepods/podg/memory.limit_in_bytes")
                .as_deref(),
            Some("67108864")
        );
        // Found after a restart: a BestEffort pod's cgroup with a process left in it.
        fs.create_dir_all(Path::new("/cg/cpu/kubepods/besteffort/pode"))
            .unwrap();
        fs.put("/cg/cpu/kubepods/besteffort/pode/cgroup.procs", "77\n");
        m.cleanup_orphans(&HashSet::from(["g".to_owned()])).await;
        assert!(fs.exists(Path::new("/cg/cpu/kubepods/podg")));
        assert!(!fs.exists(Path::new("/cg/cpu/kubepods/besteffort/pode")));
        assert_eq!(fs.state().killed, [77]);
        // The QoS cgroups are not pods.
        assert!(fs.exists(Path::new("/cg/cpu/kubepods/burstable")));
    }

    #[test]
    fn systemd_cgroup_parents_are_the_kubelets_slices() {
        let uid = "8f3c1a2b-4d5e-4f60-8a7b-9c0d1e2f3a4b";
        let escaped = uid.replace('-', "_");
        let q = QosContainers::new("/", CgroupDriver::Systemd);
        assert_eq!(
            cgroup_parent(Some(&q), &pod(uid, &[("cpu", "100m")], &[])),
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{escaped}.slice"
            )
        );
        assert_eq!(
            cgroup_parent(Some(&q), &pod(uid, &[], &[("cpu", "1"), ("memory", "1Gi")])),
            format!("/kubepods.slice/kubepods-pod{escaped}.slice")
        );
        // kind: --cgroup-root=/kubelet.
        let kind = QosContainers::new("/kubelet", CgroupDriver::Systemd);
        assert_eq!(
            cgroup_parent(Some(&kind), &pod(uid, &[], &[])),
            format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{escaped}.slice"
            )
        );
        assert_eq!(cgroup_parent(None, &pod(uid, &[], &[])), "");
    }

    fn start_of<'a>(calls: &'a [Call], unit: &str) -> &'a [systemd::Property] {
        calls
            .iter()
            .find_map(|c| match c {
                Call::Start(u, props) if u == unit => Some(props.as_slice()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no start of {unit} in {calls:?}"))
    }

    fn value<'a>(props: &'a [systemd::Property], name: &str) -> Option<&'a systemd::PropertyValue> {
        props.iter().find(|p| p.name == name).map(|p| &p.value)
    }

    #[tokio::test]
    async fn the_systemd_driver_makes_the_qos_slices_and_pod_slices() {
        use systemd::PropertyValue::{Strs, U64};
        let (fs, bus, m) = systemd_manager("/kubelet");
        m.start().await.unwrap();
        let calls = bus.take_calls();
        let kubepods = start_of(&calls, "kubelet-kubepods.slice");
        assert_eq!(
            value(kubepods, "Wants"),
            Some(&Strs(vec!["kubelet.slice".into()]))
        );
        assert_eq!(value(kubepods, "CPUShares"), Some(&U64(2048)));
        assert_eq!(value(kubepods, "MemoryLimit"), Some(&U64(4 << 30)));
        assert_eq!(value(kubepods, "TasksMax"), Some(&U64(32768)));
        let burstable = start_of(&calls, "kubelet-kubepods-burstable.slice");
        assert_eq!(
            value(burstable, "Wants"),
            Some(&Strs(vec!["kubelet-kubepods.slice".into()]))
        );
        assert_eq!(value(burstable, "CPUShares"), None);
        let best_effort = start_of(&calls, "kubelet-kubepods-besteffort.slice");
        assert_eq!(value(best_effort, "CPUShares"), Some(&U64(2)));
        let qos = "/cg/cpu/kubelet.slice/kubelet-kubepods.slice";
        assert_eq!(
            fs.file(&format!("{qos}/cpu.shares")).as_deref(),
            Some("2048")
        );
        assert_eq!(
            fs.file(&format!(
                "{qos}/kubelet-kubepods-besteffort.slice/cpu.shares"
            ))
            .as_deref(),
            Some("2")
        );
        // Huge pages stay files: unbounded on the QoS slices.
        assert_eq!(
            fs.file("/cg/hugetlb/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/hugetlb.2MB.limit_in_bytes")
                .as_deref(),
            Some("4611686018427387904")
        );
        // The burstable slice's shares follow its pods, through systemd and the files.
        let a = pod("a-1", &[("cpu", "250m")], &[]);
        let b = pod("b-2", &[("cpu", "500m")], &[("cpu", "1")]);
        m.ensure_pod(&a).await.unwrap();
        m.ensure_pod(&b).await.unwrap();
        let calls = bus.take_calls();
        let last_set = calls
            .iter()
            .rev()
            .find_map(|c| match c {
                Call::Set(u, props) if u == "kubelet-kubepods-burstable.slice" => Some(props),
                _ => None,
            })
            .unwrap();
        assert_eq!(value(last_set, "CPUShares"), Some(&U64(768)));
        assert_eq!(
            fs.file(&format!(
                "{qos}/kubelet-kubepods-burstable.slice/cpu.shares"
            ))
            .as_deref(),
            Some("768")
        );
        let pod_b = start_of(&calls, "kubelet-kubepods-burstable-podb_2.slice");
        assert_eq!(value(pod_b, "CPUShares"), Some(&U64(512)));
        assert_eq!(value(pod_b, "CPUQuotaPerSecUSec"), Some(&U64(1_000_000)));
        assert_eq!(value(pod_b, "CPUQuotaPeriodUSec"), Some(&U64(100_000)));
        assert!(m.pod_exists(&b).await.unwrap());

        m.destroy_pod("a-1").await.unwrap();
        let calls = bus.take_calls();
        assert!(
            calls.contains(&Call::Stop(
                "kubelet-kubepods-burstable-poda_1.slice".into(),
                0
            )),
            "{calls:?}"
        );
        assert!(!fs.exists(Path::new(
            "/cg/cpu/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-poda_1.slice"
        )));
        assert_eq!(
            fs.file(&format!(
                "{qos}/kubelet-kubepods-burstable.slice/cpu.shares"
            ))
            .as_deref(),
            Some("512")
        );
    }

    #[tokio::test]
    async fn the_systemd_driver_finds_orphans_by_their_slices() {
        let (fs, bus, m) = systemd_manager("/");
        m.start().await.unwrap();
        // A BestEffort pod slice left by an earlier agent, a process in it.
        let dir =
            "/cg/cpu/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod77_aa.slice";
        fs.create_dir_all(Path::new(dir)).unwrap();
        fs.put(&format!("{dir}/cgroup.procs"), "77\n");
        bus.units
            .lock()
            .unwrap()
            .insert("kubepods-besteffort-pod77_aa.slice".into());
        bus.take_calls();
        m.cleanup_orphans(&HashSet::new()).await;
        assert!(!fs.exists(Path::new(dir)));
        assert_eq!(fs.state().killed, [77]);
        assert!(
            bus.calls()
                .contains(&Call::Stop("kubepods-besteffort-pod77_aa.slice".into(), 1))
        );
        // The QoS slices are not pods.
        assert!(fs.exists(Path::new("/cg/cpu/kubepods.slice/kubepods-burstable.slice")));
    }
}
