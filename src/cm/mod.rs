//! The container manager ("cm", the kubelet's `pkg/kubelet/cm`) with the cgroupfs
//! driver: the node's QoS cgroup hierarchy (`kubepods` sized to the node,
//! `kubepods/burstable`, `kubepods/besteffort`), one cgroup per pod (`pod<uid>`, directly
//! under `kubepods` for Guaranteed pods) made before the pod's sandbox and given to it as
//! its cgroup parent, removed once the pod's containers are gone (processes left inside
//! killed first), also for pods found orphaned after an agent restart; and the OOM score
//! policy of containers. With `--cgroups-per-qos=false` none of this happens and sandboxes
//! get no cgroup parent.

mod cgroup_manager;
mod policy;
mod resource_config;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

pub use cgroup_manager::{
    CgroupFs, CgroupLayout, CgroupManager, CgroupName, Hierarchy, LinuxCgroupFs, cpu_weight,
};
pub use policy::{
    BEST_EFFORT_OOM_SCORE_ADJ, GUARANTEED_OOM_SCORE_ADJ, container_oom_score_adj, is_critical,
};
pub use resource_config::{
    MIN_SHARES, QUOTA_PERIOD, ResourceConfig, hugepage_limits, hugepage_unit, milli_cpu_to_quota,
    milli_cpu_to_shares, pod_requests_and_limits, resource_config_for_pod,
};

use crate::resources::{QosClass, qos_class};

/// What went wrong with cgroups.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// A cgroup file or directory could not be read, written or removed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// No cgroup file system is mounted.
    #[error("no cgroup hierarchy is mounted (/proc/self/mountinfo)")]
    NoCgroups,
    /// A cgroup driver other than cgroupfs.
    #[error(
        "--cgroup-driver={0} is not supported: rkubelet manages cgroups with the cgroupfs driver only (set the runtime's SystemdCgroup = false)"
    )]
    UnsupportedDriver(String),
    /// The blocking task doing the cgroup work failed.
    #[error("cgroup work did not finish: {0}")]
    Task(String),
}

/// The QoS cgroups (`QOSContainersInfo`): where each class's pod cgroups go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosContainers {
    /// `kubepods`: node allocatable, and the parent of Guaranteed pods.
    pub guaranteed: CgroupName,
    /// `kubepods/burstable`.
    pub burstable: CgroupName,
    /// `kubepods/besteffort`.
    pub best_effort: CgroupName,
}

/// The prefix of a pod cgroup's name.
const POD_PREFIX: &str = "pod";

impl QosContainers {
    /// The hierarchy under `--cgroup-root` (`/` by default).
    #[must_use]
    pub fn under(cgroup_root: &str) -> Self {
        let kubepods = CgroupName::from_cgroupfs(cgroup_root).child("kubepods");
        Self {
            burstable: kubepods.child("burstable"),
            best_effort: kubepods.child("besteffort"),
            guaranteed: kubepods,
        }
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

/// The sandbox's `CgroupParent` (`GetPodCgroupParent`): the pod cgroup in cgroupfs form,
/// empty without the QoS hierarchy.
#[must_use]
pub fn cgroup_parent(qos: Option<&QosContainers>, pod: &Pod) -> String {
    qos.map(|q| q.pod_cgroup(pod).to_cgroupfs())
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

/// The container manager over a cgroup file system.
pub struct ContainerManager<F = LinuxCgroupFs> {
    qos: QosContainers,
    capacity: NodeCapacity,
    cgroups: Arc<CgroupManager<F>>,
    /// The pods this agent made or found a cgroup for, by UID, with their CPU request
    /// when Burstable (0 otherwise): the kubelet's active pods, for the `burstable`
    /// cgroup's shares. Never orphans.
    pods: Mutex<HashMap<String, i64>>,
}

impl<F> std::fmt::Debug for ContainerManager<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerManager")
            .field("qos", &self.qos)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Checks `--cgroup-driver`: only `cgroupfs` is supported.
///
/// # Errors
/// [`CmError::UnsupportedDriver`] for any other (`systemd`).
pub fn check_driver(driver: &str) -> Result<(), CmError> {
    if driver == "cgroupfs" {
        Ok(())
    } else {
        Err(CmError::UnsupportedDriver(driver.to_owned()))
    }
}

impl ContainerManager<LinuxCgroupFs> {
    /// The manager of the host's cgroups (as `/proc/self/mountinfo` shows them) with the
    /// QoS hierarchy under `--cgroup-root`. Reads a file: call it off the async runtime.
    ///
    /// # Errors
    /// No cgroup file system mounted.
    pub fn linux(cgroup_root: &str, capacity: NodeCapacity) -> Result<Self, CmError> {
        let path = PathBuf::from("/proc/self/mountinfo");
        let mountinfo = std::fs::read_to_string(&path).map_err(|source| CmError::Io {
            what: "reading",
            path,
            source,
        })?;
        let layout = CgroupLayout::from_mountinfo(&mountinfo).ok_or(CmError::NoCgroups)?;
        Ok(Self::new(
            CgroupManager::new(LinuxCgroupFs, layout),
            cgroup_root,
            capacity,
        ))
    }
}

impl<F: CgroupFs> ContainerManager<F> {
    /// The manager over `cgroups`, with the QoS hierarchy under `cgroup_root`.
    pub fn new(cgroups: CgroupManager<F>, cgroup_root: &str, capacity: NodeCapacity) -> Self {
        let sizes = capacity.hugepages.keys().copied().collect();
        Self {
            qos: QosContainers::under(cgroup_root),
            capacity,
            cgroups: Arc::new(cgroups.with_hugepage_sizes(sizes)),
            pods: Mutex::default(),
        }
    }

    /// The QoS cgroups.
    pub fn qos_containers(&self) -> &QosContainers {
        &self.qos
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&CgroupManager<F>) -> Result<T, CmError> + Send + 'static,
    ) -> Result<T, CmError> {
        let cgroups = self.cgroups.clone();
        tokio::task::spawn_blocking(move || work(&cgroups))
            .await
            .map_err(|e| CmError::Task(e.to_string()))?
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
            (self.qos.guaranteed.clone(), node),
            (self.qos.burstable.clone(), self.qos_config(None)),
            (
                self.qos.best_effort.clone(),
                self.qos_config(Some(MIN_SHARES)),
            ),
        ];
        self.blocking(move |cg| {
            for (name, config) in &classes {
                if cg.exists(name) {
                    cg.update(name, config)?;
                } else {
                    cg.create(name, config)?;
                }
            }
            Ok(())
        })
        .await?;
        tracing::info!(root = %self.qos.guaranteed.to_cgroupfs(), "QoS cgroups ready");
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
        let requests: i64 = lock(&self.pods).values().sum();
        let updates = [
            (
                self.qos.burstable.clone(),
                self.qos_config(Some(milli_cpu_to_shares(requests))),
            ),
            (
                self.qos.best_effort.clone(),
                self.qos_config(Some(MIN_SHARES)),
            ),
        ];
        self.blocking(move |cg| {
            for (name, config) in &updates {
                cg.update(name, config)?;
            }
            Ok(())
        })
        .await
    }

    /// Whether the pod's cgroup exists.
    ///
    /// # Errors
    /// The check could not run.
    pub async fn pod_exists(&self, pod: &Pod) -> Result<bool, CmError> {
        let name = self.qos.pod_cgroup(pod);
        self.blocking(move |cg| Ok(cg.exists(&name))).await
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
        tracing::info!(cgroup = %name.to_cgroupfs(), ?config, "creating the pod cgroup");
        self.blocking(move |cg| cg.create(&name, &config)).await
    }

    /// The pod cgroups found under the QoS cgroups, by pod UID
    /// (`GetAllPodsFromCgroups`).
    ///
    /// # Errors
    /// A QoS cgroup that cannot be listed.
    async fn pod_cgroups(&self) -> Result<HashMap<String, CgroupName>, CmError> {
        let parents = [
            self.qos.guaranteed.clone(),
            self.qos.burstable.clone(),
            self.qos.best_effort.clone(),
        ];
        self.blocking(move |cg| {
            let mut found = HashMap::new();
            for parent in &parents {
                for child in cg.children(parent)? {
                    if let Some(uid) = child.strip_prefix(POD_PREFIX) {
                        found.insert(uid.to_owned(), parent.child(&child));
                    }
                }
            }
            Ok(found)
        })
        .await
    }

    /// Removes the pod's cgroup, whatever its QoS class, killing processes left inside
    /// first (`Destroy`); then the QoS cgroups follow.
    ///
    /// # Errors
    /// The cgroup cannot be emptied or removed.
    pub async fn destroy_pod(&self, uid: &str) -> Result<(), CmError> {
        let found = self.pod_cgroups().await?;
        if let Some(name) = found.get(uid).cloned() {
            tracing::info!(cgroup = %name.to_cgroupfs(), "removing the pod cgroup");
            self.blocking(move |cg| cg.destroy(&name)).await?;
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
    use super::cgroup_manager::testing::FakeCgroupFs;
    use super::resource_config::tests::container;
    use super::*;
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

    fn manager() -> (FakeCgroupFs, ContainerManager<FakeCgroupFs>) {
        let fs = FakeCgroupFs::default();
        for h in ["cpu", "memory", "pids", "hugetlb"] {
            fs.create_dir_all(&Path::new("/cg").join(h)).unwrap();
        }
        let layout = CgroupLayout::V1(
            ["cpu", "memory", "pids", "hugetlb"]
                .iter()
                .map(|c| Hierarchy {
                    mount: Path::new("/cg").join(c),
                    controllers: vec![(*c).to_owned()],
                })
                .collect(),
        );
        let capacity = NodeCapacity {
            cpu_millis: 2000,
            memory_bytes: 4 << 30,
            pids: 32768,
            hugepages: [(2 << 20, 0)].into(),
        };
        (
            fs.clone(),
            ContainerManager::new(CgroupManager::new(fs, layout), "/", capacity),
        )
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
    fn only_the_cgroupfs_driver_is_accepted() {
        check_driver("cgroupfs").unwrap();
        let err = check_driver("systemd").unwrap_err();
        assert!(
            err.to_string()
                .contains("--cgroup-driver=systemd is not supported")
        );
    }
}
