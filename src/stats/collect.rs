//! One reading of everything the node's stats come from, shared by `/stats/summary` and
//! `/metrics/cadvisor`: the runtime's view (CRI `ListPodSandbox`, `ListContainers`,
//! `ListContainerStats`, `ImageFsInfo`), each sandbox's and container's cgroups (found
//! once per container from its first process, `/proc/<pid>/cgroup`, whichever the cgroup
//! driver), the pods' cgroups above them, the root cgroup, the network counters of each
//! pod's network namespace and of the host, and the machine.
//!
//! The runtime is asked on the async runtime; every file is read in one blocking task.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use super::StatsError;
use super::cgroup::{CgroupPaths, CgroupReader, CgroupStats};
use super::fs::{self, DiskUsage, FilesystemFigures, FsInfo, Partition};
use super::network::{self, InterfaceCounters};
use super::process::{self, LoadAverages, ProcessFigures};
use super::volume::{SpecVolume, VolumeUsage, read_in_tree};
use crate::cm::{CgroupLayout, LinuxCgroupFs};
use crate::cri::{Cri, VerboseInfo, api};
use crate::node::{MachineInfo, Memory, PidUsage};
use crate::pod::PodId;

/// Where the provider reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsConfig {
    /// `--root-dir`: the node filesystem, and the pods' volumes under `pods/`.
    pub root_dir: PathBuf,
    /// The cgroup all pods are under (`/kubepods` with `--cgroups-per-qos`, else `/`):
    /// the `pods` system container.
    pub pods_cgroup: Option<String>,
    /// The proc file system.
    pub proc: PathBuf,
}

impl Default for StatsConfig {
    fn default() -> Self {
        Self {
            root_dir: PathBuf::from(crate::node::DEFAULT_ROOT_DIR),
            pods_cgroup: Some("/".to_owned()),
            proc: PathBuf::from("/proc"),
        }
    }
}

/// What a cgroup is to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupKind {
    /// The root cgroup: the whole machine.
    #[default]
    Root,
    /// A system container of the node: the cgroup all pods are under (`/kubepods`).
    System,
    /// A pod's cgroup (`pod<uid>`), holding its sandbox and containers.
    Pod,
    /// A pod's sandbox (the pause process): where its network is reported.
    Sandbox,
    /// A container of a pod.
    Container,
}

/// One cgroup with the labels cAdvisor and the kubelet give it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CgroupInfo {
    /// Its path (cAdvisor's container name, the `id` label).
    pub id: String,
    /// What it is.
    pub kind: CgroupKind,
    /// The pod it belongs to.
    pub pod: Option<PodId>,
    /// The container's name in the pod spec; empty for the others.
    pub container: String,
    /// The runtime's ID of the sandbox or container; empty for the others.
    pub runtime_id: String,
    /// The image: the container's, or the sandbox's pause image.
    pub image: String,
    /// When it was created, ns since the epoch.
    pub created_ns: Option<i64>,
    /// Its figures.
    pub stats: CgroupStats,
    /// The interfaces of its network namespace (the root's and sandboxes' only).
    pub network: Vec<InterfaceCounters>,
    /// Bytes it holds on a filesystem, and that filesystem's device.
    pub fs_usage: Option<(String, u64)>,
    /// Its processes, their files and threads.
    pub processes: Option<ProcessFigures>,
    /// The machine's filesystems (the root's only, as cAdvisor reports them).
    pub filesystems: Vec<FilesystemFigures>,
}

/// The machine's figures.
#[derive(Debug, Clone, Default)]
pub struct MachineFigures {
    /// Online logical CPUs.
    pub num_cpus: Option<u32>,
    /// Capacity and the root cgroup's use.
    pub memory: Option<Memory>,
    /// PIDs.
    pub pids: Option<PidUsage>,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// DMI product UUID.
    pub system_uuid: String,
    /// This boot's ID.
    pub boot_id: String,
    /// Physical cores and sockets.
    pub topology: Option<crate::node::CpuTopology>,
    /// The kernel release and the OS's name (`cadvisor_version_info`).
    pub kernel_version: String,
    /// The OS's `PRETTY_NAME`.
    pub os_image: String,
}

/// The storage figures of `/stats/summary` (not read for `/metrics/cadvisor`).
#[derive(Debug, Clone, Default)]
pub struct Storage {
    /// The root directory's filesystem.
    pub root_fs: Option<FsInfo>,
    /// The image filesystem (CRI `ImageFsInfo`'s mount point).
    pub image_fs: Option<FsInfo>,
    /// `ImageFsInfo` itself.
    pub image_fs_usage: Option<api::FilesystemUsage>,
    /// Each container's log directory, by container ID.
    pub container_logs: HashMap<String, DiskUsage>,
    /// Files directly in each pod's log directory, by pod UID.
    pub pod_logs: HashMap<String, DiskUsage>,
    /// Each pod's volumes, by pod UID: the ephemeral ones first, each group by name.
    pub volumes: HashMap<String, Vec<VolumeUsage>>,
}

/// One reading of the node.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// When read, ns since the epoch.
    pub time_ns: i64,
    /// The ready sandboxes.
    pub sandboxes: Vec<api::PodSandbox>,
    /// The running containers.
    pub containers: Vec<api::Container>,
    /// The runtime's stats of the containers, by ID.
    pub container_stats: HashMap<String, api::ContainerStats>,
    /// Root, pod, sandbox and container cgroups, in that order (the root first).
    pub cgroups: Vec<CgroupInfo>,
    /// The `pods` system container's cgroup.
    pub pods_cgroup: Option<CgroupInfo>,
    /// The machine.
    pub machine: MachineFigures,
    /// Storage (summary only).
    pub storage: Storage,
}

impl Snapshot {
    /// The cgroup of a sandbox or container.
    #[must_use]
    pub fn cgroup_of(&self, runtime_id: &str) -> Option<&CgroupInfo> {
        self.cgroups.iter().find(|c| c.runtime_id == runtime_id)
    }

    /// The cgroup of a pod.
    #[must_use]
    pub fn pod_cgroup(&self, uid: &str) -> Option<&CgroupInfo> {
        self.cgroups
            .iter()
            .find(|c| c.kind == CgroupKind::Pod && c.pod.as_ref().is_some_and(|p| p.uid == uid))
    }

    /// The root cgroup.
    #[must_use]
    pub fn root(&self) -> Option<&CgroupInfo> {
        self.cgroups.iter().find(|c| c.kind == CgroupKind::Root)
    }
}

/// Where a sandbox or container runs, found once from the runtime's verbose status.
#[derive(Debug, Clone, Default)]
struct Located {
    pid: Option<u32>,
    image: String,
    cgroups: Option<CgroupPaths>,
    /// A container's log directory (its log file's, `<pod log dir>/<container>`).
    log_dir: Option<PathBuf>,
}

/// What the blocking part needs to know of one sandbox or container.
struct Target {
    runtime_id: String,
    kind: CgroupKind,
    pod: PodId,
    container: String,
    located: Located,
    created_ns: i64,
    writable_layer: Option<u64>,
}

/// Collects snapshots; keeps where each container's cgroup is between them.
#[derive(Debug, Default)]
pub struct Collector {
    config: StatsConfig,
    located: Mutex<HashMap<String, Located>>,
    layout: Arc<OnceLock<Option<CgroupLayout>>>,
    /// The machine's filesystems, listed once at the first reading as cAdvisor lists them
    /// at start (so the pods' own mounts are not among them).
    partitions: Arc<OnceLock<Vec<Partition>>>,
    /// Each cgroup's load average, across readings.
    loads: LoadAverages,
}

impl Collector {
    /// A collector reading where `config` says.
    #[must_use]
    pub fn new(config: StatsConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Where it reads.
    #[must_use]
    pub fn config(&self) -> &StatsConfig {
        &self.config
    }

    /// Reads the node now: cgroups, network, the filesystems, logs, and the in-tree volumes
    /// of each pod's spec (`volumes`, by pod UID).
    ///
    /// # Errors
    /// A failed CRI list call, or the blocking reads did not finish.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn snapshot<C: Cri, M: MachineInfo + Clone + 'static>(
        &self,
        cri: &C,
        machine: &M,
        volumes: HashMap<String, Vec<SpecVolume>>,
    ) -> Result<Snapshot, StatsError> {
        let sandboxes: Vec<api::PodSandbox> = cri
            .list_pod_sandbox(api::ListPodSandboxRequest {
                filter: Some(api::PodSandboxFilter {
                    state: Some(api::PodSandboxStateValue {
                        state: api::PodSandboxState::SandboxReady.into(),
                    }),
                    ..Default::default()
                }),
            })
            .await?
            .items;
        let containers = cri
            .list_containers(crate::cri::running_containers_request())
            .await?
            .containers;
        let container_stats: HashMap<String, api::ContainerStats> = cri
            .list_container_stats(api::ListContainerStatsRequest { filter: None })
            .await?
            .stats
            .into_iter()
            .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s)))
            .collect();
        let image_fs_usage = cri
            .image_fs_info(api::ImageFsInfoRequest {})
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "ImageFsInfo failed"))
            .ok()
            .and_then(|r| r.image_filesystems.into_iter().next());

        let located = self.locate(cri, &sandboxes, &containers).await;
        let mut targets = Vec::new();
        for s in &sandboxes {
            let Some(pod) = pod_of(s) else {
                continue;
            };
            targets.push(Target {
                runtime_id: s.id.clone(),
                kind: CgroupKind::Sandbox,
                pod,
                container: String::new(),
                located: located.get(&s.id).cloned().unwrap_or_default(),
                created_ns: s.created_at,
                writable_layer: None,
            });
        }
        for c in &containers {
            // The pod is its sandbox's (the kubelet's CRI stats provider pairs them so).
            let (Some(pod), Some(name)) = (
                sandboxes
                    .iter()
                    .find(|s| s.id == c.pod_sandbox_id)
                    .and_then(pod_of),
                c.metadata.as_ref().map(|m| m.name.clone()),
            ) else {
                continue;
            };
            targets.push(Target {
                runtime_id: c.id.clone(),
                kind: CgroupKind::Container,
                pod,
                container: name,
                located: located.get(&c.id).cloned().unwrap_or_default(),
                created_ns: c.created_at,
                writable_layer: container_stats
                    .get(&c.id)
                    .and_then(|s| s.writable_layer.as_ref()?.used_bytes.as_ref())
                    .map(|v| v.value),
            });
        }

        let config = self.config.clone();
        let layout = Arc::clone(&self.layout);
        let machine = machine.clone();
        let image_mount = image_fs_usage
            .as_ref()
            .and_then(|u| u.fs_id.as_ref())
            .map(|id| PathBuf::from(&id.mountpoint));
        let time_ns = now_ns();
        let partitions = Arc::clone(&self.partitions);
        let read = tokio::task::spawn_blocking(move || {
            let mountinfo = || {
                crate::procfs::read_pseudo_file(&config.proc.join("self/mountinfo"))
                    .unwrap_or_default()
            };
            let layout = layout.get_or_init(|| CgroupLayout::from_mountinfo(&mountinfo()));
            let partitions = partitions.get_or_init(|| fs::partitions(&mountinfo()));
            read_files(
                &config,
                layout.as_ref(),
                &machine,
                targets,
                &volumes,
                image_mount,
                partitions,
            )
        })
        .await
        .map_err(|e| StatsError::Task(e.to_string()))?;
        let (mut cgroups, mut pods_cgroup, machine_figures, mut storage_figures, found) = read;
        self.loads.update(
            cgroups
                .iter_mut()
                .chain(pods_cgroup.as_mut())
                .filter_map(|c| Some((c.id.as_str(), c.processes.as_mut()?))),
            time_ns,
        );
        {
            let mut cache = crate::lock::lock(&self.located);
            for (id, paths) in found {
                if let Some(l) = cache.get_mut(&id) {
                    l.cgroups = Some(paths);
                }
            }
        }
        storage_figures.image_fs_usage = image_fs_usage;
        Ok(Snapshot {
            time_ns,
            sandboxes,
            containers,
            container_stats,
            cgroups,
            pods_cgroup,
            machine: machine_figures,
            storage: storage_figures,
        })
    }

    /// The PID and image of each sandbox and container, asked of the runtime once per ID;
    /// IDs no longer listed are forgotten.
    async fn locate<C: Cri>(
        &self,
        cri: &C,
        sandboxes: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> HashMap<String, Located> {
        let known: Vec<String> = crate::lock::lock(&self.located).keys().cloned().collect();
        let lookups = sandboxes
            .iter()
            .map(|s| (s.id.as_str(), true))
            .chain(containers.iter().map(|c| (c.id.as_str(), false)))
            .filter(|(id, _)| !known.iter().any(|k| k == id))
            .map(|(id, sandbox)| async move {
                let located = if sandbox {
                    locate_sandbox(cri, id).await
                } else {
                    locate_container(cri, id).await
                };
                Some((id.to_owned(), located?))
            });
        let found = futures::future::join_all(lookups).await;
        let mut cache = crate::lock::lock(&self.located);
        cache.extend(
            found
                .into_iter()
                .flatten()
                // A container whose PID the runtime did not give is asked again next time.
                .filter(|(_, l)| l.pid.is_some()),
        );
        let listed: std::collections::HashSet<&str> = sandboxes
            .iter()
            .map(|s| s.id.as_str())
            .chain(containers.iter().map(|c| c.id.as_str()))
            .collect();
        cache.retain(|id, _| listed.contains(id.as_str()));
        cache.clone()
    }
}

/// A sandbox's pause PID and image, from its verbose status.
async fn locate_sandbox<C: Cri>(cri: &C, id: &str) -> Option<Located> {
    let r = cri
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: true,
        })
        .await
        .inspect_err(|e| tracing::debug!(%id, error = %e, "sandbox status"))
        .ok()?;
    let info = VerboseInfo::parse(&r.info);
    Some(Located {
        pid: info.pid,
        image: info.image.unwrap_or_default(),
        ..Located::default()
    })
}

/// A container's PID, image and log directory, from its verbose status.
async fn locate_container<C: Cri>(cri: &C, id: &str) -> Option<Located> {
    let r = cri
        .container_status(api::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: true,
        })
        .await
        .inspect_err(|e| tracing::debug!(%id, error = %e, "container status"))
        .ok()?;
    let info = VerboseInfo::parse(&r.info);
    let status = r.status.unwrap_or_default();
    // The log file's directory: `<pod log dir>/<container>`.
    let log_dir = Path::new(&status.log_path)
        .parent()
        .filter(|d| d.is_absolute())
        .map(Path::to_owned);
    Some(Located {
        pid: info.pid,
        image: status.image.map(|i| i.image).unwrap_or_default(),
        cgroups: None,
        log_dir,
    })
}

fn now_ns() -> i64 {
    i64::try_from(k8s_openapi::jiff::Timestamp::now().as_nanosecond()).unwrap_or(i64::MAX)
}

/// The pod of a sandbox, from its CRI metadata.
fn pod_of(sandbox: &api::PodSandbox) -> Option<PodId> {
    let m = sandbox.metadata.as_ref()?;
    Some(PodId {
        uid: m.uid.clone(),
        namespace: m.namespace.clone(),
        name: m.name.clone(),
    })
}

/// Whether `dir` (a cgroup name's last component) is the cgroup of pod `uid`, with either
/// driver (`pod<uid>`, `kubepods-besteffort-pod<uid_with_underscores>.slice`).
fn is_pod_cgroup(dir: &str, uid: &str) -> bool {
    dir.contains(&format!("pod{uid}")) || dir.contains(&format!("pod{}", uid.replace('-', "_")))
}

type Read = (
    Vec<CgroupInfo>,
    Option<CgroupInfo>,
    MachineFigures,
    Storage,
    Vec<(String, CgroupPaths)>,
);

fn read_files<M: MachineInfo>(
    config: &StatsConfig,
    layout: Option<&CgroupLayout>,
    machine: &M,
    targets: Vec<Target>,
    volumes: &HashMap<String, Vec<SpecVolume>>,
    image_mount: Option<PathBuf>,
    partitions: &[Partition],
) -> Read {
    let reader = layout.map(|l| CgroupReader::new(LinuxCgroupFs, l.clone()));
    let stats_of = |paths: &CgroupPaths| {
        reader
            .as_ref()
            .map(|r| (r.stats(paths), r.created_ns(paths)))
    };
    // cAdvisor's process figures: a sandbox's or container's with its first process's
    // open-files limit.
    let processes_of = |paths: &CgroupPaths, root_pid: Option<u32>| {
        let reader = reader.as_ref()?;
        let mut figures = process::read(&config.proc, &reader.procs(paths)?, root_pid);
        (figures.threads, figures.threads_max) = reader.threads(paths).unwrap_or_default();
        if let Some(tasks) = reader.tasks(paths) {
            figures.tasks = process::task_states(&config.proc, &process::parse_procs(&tasks));
        }
        Some(figures)
    };
    let mountinfo =
        crate::procfs::read_pseudo_file(&config.proc.join("self/mountinfo")).unwrap_or_default();
    let image_device = image_mount
        .as_deref()
        .and_then(|m| fs::device_of(&mountinfo, m))
        .unwrap_or_default();
    let root_fs = fs::fs_info(&config.root_dir);

    let root_paths = CgroupPaths::uniform("/");
    let (root_stats, _) = stats_of(&root_paths).unwrap_or_default();
    let mut cgroups = vec![CgroupInfo {
        id: "/".to_owned(),
        kind: CgroupKind::Root,
        stats: root_stats,
        network: network::read(&config.proc, 1).unwrap_or_default(),
        processes: processes_of(&root_paths, Some(1)),
        filesystems: fs::filesystems(
            partitions,
            &fs::parse_diskstats(
                &crate::procfs::read_pseudo_file(&config.proc.join("diskstats"))
                    .unwrap_or_default(),
            ),
        ),
        ..CgroupInfo::default()
    }];
    let mut found = Vec::new();
    let mut pods: Vec<CgroupInfo> = Vec::new();
    let mut container_logs = HashMap::new();
    let mut pod_log_dirs: HashMap<String, PathBuf> = HashMap::new();
    let mut storage_pods = std::collections::BTreeSet::new();
    for target in targets {
        let paths = target.located.cgroups.clone().or_else(|| {
            let pid = target.located.pid?;
            let text =
                crate::procfs::read_pseudo_file(&config.proc.join(pid.to_string()).join("cgroup"))
                    .ok()?;
            let paths = CgroupPaths::parse_proc(&text)?;
            found.push((target.runtime_id.clone(), paths.clone()));
            Some(paths)
        });
        if let Some(dir) = &target.located.log_dir {
            let (bytes, inodes) = fs::disk_usage(dir);
            container_logs.insert(target.runtime_id.clone(), DiskUsage { bytes, inodes });
            if let Some(pod_dir) = dir.parent() {
                pod_log_dirs.insert(target.pod.uid.clone(), pod_dir.to_owned());
            }
        }
        storage_pods.insert(target.pod.uid.clone());
        let Some(paths) = paths else {
            continue;
        };
        let Some(id) = paths.name().map(str::to_owned) else {
            continue;
        };
        // The pod's cgroup, once, when the sandbox or container sits in one.
        if let Some((parent, last)) = id
            .rsplit_once('/')
            .map(|(p, _)| p)
            .and_then(|p| Some((p.to_owned(), p.rsplit('/').next()?.to_owned())))
            && is_pod_cgroup(&last, &target.pod.uid)
            && !pods.iter().any(|p| p.id == parent)
        {
            let pod_paths = CgroupPaths::uniform(&parent);
            let (stats, created_ns) = stats_of(&pod_paths).unwrap_or_default();
            pods.push(CgroupInfo {
                id: parent,
                kind: CgroupKind::Pod,
                pod: Some(target.pod.clone()),
                created_ns,
                stats,
                processes: processes_of(&pod_paths, None),
                ..CgroupInfo::default()
            });
        }
        let (stats, _) = stats_of(&paths).unwrap_or_default();
        let network = match (target.kind, target.located.pid) {
            (CgroupKind::Sandbox, Some(pid)) => {
                network::read(&config.proc, pid).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        cgroups.push(CgroupInfo {
            id,
            kind: target.kind,
            pod: Some(target.pod),
            container: target.container,
            runtime_id: target.runtime_id,
            image: target.located.image,
            created_ns: Some(target.created_ns),
            stats,
            network,
            fs_usage: target.writable_layer.map(|b| (image_device.clone(), b)),
            processes: processes_of(&paths, target.located.pid),
            filesystems: Vec::new(),
        });
    }
    let first_child = usize::from(!cgroups.is_empty());
    cgroups.splice(first_child..first_child, pods);

    let pods_cgroup = config.pods_cgroup.as_deref().and_then(|path| {
        let paths = CgroupPaths::uniform(path);
        let (stats, created_ns) = stats_of(&paths)?;
        Some(CgroupInfo {
            id: path.to_owned(),
            kind: CgroupKind::System,
            created_ns,
            stats,
            processes: processes_of(&paths, None),
            ..CgroupInfo::default()
        })
    });

    let machine_figures = MachineFigures {
        num_cpus: machine.num_cpus().ok(),
        memory: machine.memory().ok(),
        pids: machine.pid_usage().ok(),
        machine_id: machine.machine_id().unwrap_or_default(),
        system_uuid: machine.system_uuid().unwrap_or_default(),
        boot_id: machine.boot_id().unwrap_or_default(),
        topology: machine.cpu_topology().ok(),
        kernel_version: machine.kernel_version().unwrap_or_default(),
        os_image: machine.os_image().unwrap_or_default(),
    };
    let uids: Vec<String> = storage_pods.into_iter().collect();
    let storage_figures = read_storage(
        config,
        &uids,
        volumes,
        &pod_log_dirs,
        root_fs,
        image_mount.as_deref(),
        container_logs,
    );
    (
        cgroups,
        pods_cgroup,
        machine_figures,
        storage_figures,
        found,
    )
}

fn read_storage(
    config: &StatsConfig,
    uids: &[String],
    specs: &HashMap<String, Vec<SpecVolume>>,
    pod_log_dirs: &HashMap<String, PathBuf>,
    root_fs: Option<FsInfo>,
    image_mount: Option<&Path>,
    container_logs: HashMap<String, DiskUsage>,
) -> Storage {
    let mut pod_logs = HashMap::new();
    let mut volumes = HashMap::new();
    for uid in uids {
        if let Some(dir) = pod_log_dirs.get(uid) {
            // The files directly in the pod's log directory (not its containers').
            let files = std::fs::read_dir(dir).into_iter().flatten().flatten();
            let mut usage = DiskUsage::default();
            for f in files.filter(|f| f.file_type().is_ok_and(|t| !t.is_dir())) {
                let (bytes, inodes) = fs::disk_usage(&f.path());
                usage.bytes += bytes;
                usage.inodes += inodes;
            }
            pod_logs.insert(uid.clone(), usage);
        }
        let spec = specs.get(uid).map_or(&[][..], Vec::as_slice);
        volumes.insert(uid.clone(), read_in_tree(&config.root_dir, uid, spec));
    }
    Storage {
        root_fs,
        image_fs: image_mount.and_then(fs::fs_info),
        image_fs_usage: None,
        container_logs,
        pod_logs,
        volumes,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::stats::testing::Machine;

    /// One pod `web` (uid `u-1`): sandbox `s1` (PID 100) and container `c1` (PID 200), its
    /// log file under `logs`.
    struct Runtime {
        logs: PathBuf,
        status_calls: std::sync::atomic::AtomicUsize,
    }

    fn info(pid: u32) -> HashMap<String, String> {
        HashMap::from([(
            "info".to_owned(),
            serde_json::json!({"pid": pid, "image": "pause:3.6"}).to_string(),
        )])
    }

    impl Cri for Runtime {
        async fn list_pod_sandbox(
            &self,
            _: api::ListPodSandboxRequest,
        ) -> crate::cri::Result<api::ListPodSandboxResponse> {
            Ok(api::ListPodSandboxResponse {
                items: vec![api::PodSandbox {
                    id: "s1".into(),
                    metadata: Some(api::PodSandboxMetadata {
                        name: "web".into(),
                        uid: "u-1".into(),
                        namespace: "default".into(),
                        attempt: 0,
                    }),
                    ..Default::default()
                }],
            })
        }
        async fn list_containers(
            &self,
            _: api::ListContainersRequest,
        ) -> crate::cri::Result<api::ListContainersResponse> {
            Ok(api::ListContainersResponse {
                containers: vec![api::Container {
                    id: "c1".into(),
                    pod_sandbox_id: "s1".into(),
                    metadata: Some(api::ContainerMetadata {
                        name: "app".into(),
                        attempt: 0,
                    }),
                    ..Default::default()
                }],
            })
        }
        async fn list_container_stats(
            &self,
            _: api::ListContainerStatsRequest,
        ) -> crate::cri::Result<api::ListContainerStatsResponse> {
            Ok(api::ListContainerStatsResponse { stats: Vec::new() })
        }
        async fn pod_sandbox_status(
            &self,
            _: api::PodSandboxStatusRequest,
        ) -> crate::cri::Result<api::PodSandboxStatusResponse> {
            Ok(api::PodSandboxStatusResponse {
                info: info(100),
                ..Default::default()
            })
        }
        async fn container_status(
            &self,
            _: api::ContainerStatusRequest,
        ) -> crate::cri::Result<api::ContainerStatusResponse> {
            self.status_calls
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(api::ContainerStatusResponse {
                status: Some(api::ContainerStatus {
                    image: Some(api::ImageSpec {
                        image: "busybox:latest".into(),
                        ..Default::default()
                    }),
                    log_path: self
                        .logs
                        .join("default_web_u-1/app/0.log")
                        .display()
                        .to_string(),
                    ..Default::default()
                }),
                info: info(200),
            })
        }
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    const NET_DEV: &str = "Inter-| header\n face | header\n    lo: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n  eth0: 5000 10 0 0 0 0 0 0 700 7 0 0 0 0 0 0\n";

    #[tokio::test]
    async fn cgroups_network_logs_and_volumes_of_a_pod() {
        let dir = std::env::temp_dir().join(format!("rkubelet-collect-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (proc, cg, root, logs) = (
            dir.join("proc"),
            dir.join("cg"),
            dir.join("root"),
            dir.join("logs"),
        );
        let mountinfo = format!(
            "31 30 0:27 / {0}/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
             34 30 0:30 / {0}/memory rw - cgroup cgroup rw,memory\n",
            cg.display()
        );
        write(&proc.join("self/mountinfo"), &mountinfo);
        let pod = "/kubepods/besteffort/podu-1";
        write(
            &proc.join("100/cgroup"),
            &format!("4:cpu,cpuacct:{pod}/s1\n9:memory:{pod}/s1\n"),
        );
        write(
            &proc.join("200/cgroup"),
            &format!("4:cpu,cpuacct:{pod}/c1\n9:memory:{pod}/c1\n"),
        );
        write(&proc.join("100/net/dev"), NET_DEV);
        write(&proc.join("1/net/dev"), NET_DEV);
        for (cgroup, usage) in [("", 9000), (pod, 700), (&format!("{pod}/c1"), 500)] {
            let cpu = cg.join("cpu,cpuacct").join(cgroup.trim_start_matches('/'));
            write(&cpu.join("cpuacct.usage"), &format!("{usage}\n"));
            write(&cpu.join("cpuacct.stat"), "user 1\nsystem 1\n");
            let memory = cg.join("memory").join(cgroup.trim_start_matches('/'));
            write(&memory.join("memory.usage_in_bytes"), &format!("{usage}\n"));
            write(&memory.join("memory.stat"), "total_inactive_file 100\n");
        }
        write(&logs.join("default_web_u-1/app/0.log"), "a line\n");
        write(
            &root.join("pods/u-1/volumes/kubernetes.io~empty-dir/cache/f"),
            "x",
        );
        let collector = Collector::new(StatsConfig {
            root_dir: root,
            pods_cgroup: Some("/kubepods".into()),
            proc,
        });
        let runtime = Runtime {
            logs,
            status_calls: 0.into(),
        };
        let cache = SpecVolume::InTree {
            name: "cache".into(),
            plugin: crate::stats::volume::InTree::EmptyDir { memory: false },
        };
        let specs = HashMap::from([("u-1".to_owned(), vec![cache])]);
        let snapshot = collector.snapshot(&runtime, &Machine, specs).await.unwrap();

        let ids: Vec<(&str, CgroupKind)> = snapshot
            .cgroups
            .iter()
            .map(|c| (c.id.as_str(), c.kind))
            .collect();
        assert_eq!(
            ids,
            [
                ("/", CgroupKind::Root),
                (pod, CgroupKind::Pod),
                ("/kubepods/besteffort/podu-1/s1", CgroupKind::Sandbox),
                ("/kubepods/besteffort/podu-1/c1", CgroupKind::Container),
            ]
        );
        let container = snapshot.cgroup_of("c1").unwrap();
        assert_eq!(container.container, "app");
        assert_eq!(container.image, "busybox:latest");
        assert_eq!(container.stats.cpu.unwrap().total_ns, 500);
        assert_eq!(container.stats.memory.unwrap().working_set_bytes, 400);
        assert!(
            container.network.is_empty(),
            "the sandbox carries the network"
        );
        let sandbox = snapshot.cgroup_of("s1").unwrap();
        assert_eq!(sandbox.image, "pause:3.6");
        assert_eq!(sandbox.network[0].rx_bytes, 5000);
        assert_eq!(
            snapshot
                .pod_cgroup("u-1")
                .unwrap()
                .stats
                .cpu
                .unwrap()
                .total_ns,
            700
        );
        assert_eq!(snapshot.root().unwrap().network.len(), 1);
        // The pods' system container: its cgroup has no files here, so no figures.
        assert_eq!(snapshot.pods_cgroup.as_ref().unwrap().stats.cpu, None);
        // The container's log directory and the pod's emptyDir volume.
        assert!(snapshot.storage.container_logs["c1"].bytes > 0);
        assert_eq!(snapshot.storage.container_logs["c1"].inodes, 2);
        let volumes = &snapshot.storage.volumes["u-1"];
        assert_eq!(volumes[0].name, "cache");
        assert_eq!(volumes[0].usage.inodes, 2);
        // The PIDs are asked once: a second reading uses what the first found.
        let again = collector
            .snapshot(&runtime, &Machine, HashMap::new())
            .await
            .unwrap();
        assert_eq!(again.cgroups.len(), 4);
        assert_eq!(
            runtime
                .status_calls
                .load(std::sync::atomic::Ordering::SeqCst),
            1
        );
        assert!(
            again.storage.volumes["u-1"].is_empty(),
            "a volume is read only when the pod's spec has it"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn pod_cgroups_with_either_driver() {
        let uid = "0f1e2d3c-aaaa-bbbb";
        assert!(is_pod_cgroup(&format!("pod{uid}"), uid));
        assert!(is_pod_cgroup(
            "kubepods-besteffort-pod0f1e2d3c_aaaa_bbbb.slice",
            uid
        ));
        assert!(!is_pod_cgroup("k8s.io", uid));
        assert!(!is_pod_cgroup("podother", uid));
    }
}
