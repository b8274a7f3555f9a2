//! The summary (`/stats/summary`) from a [`Snapshot`], as the kubelet's CRI stats
//! provider and summary provider build it: containers' CPU and memory from their cgroups
//! (the runtime's `ListContainerStats` when a cgroup cannot be found), their writable
//! layer (`rootfs`) from the runtime and their `logs` from their log directory; a pod's
//! CPU and memory from its pod cgroup (else summed over its containers), its network
//! from its sandbox's namespace, its volumes ([`super::volume`], with `pvcRef` for claims)
//! and its ephemeral storage (writable layers + logs + ephemeral volumes); the node's from
//! the root cgroup, the host's interfaces, the root directory's and the image filesystem,
//! and the PID counters; and the `pods` system container. CPU rates (`usageNanoCores`)
//! are computed between two consecutive readings (cAdvisor's two samples), so the first
//! has none. Readings are taken by the housekeeping ([`super::housekeeping`]) only.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;

use super::StatsError;
use super::cgroup::CgroupStats;
use super::collect::{CgroupInfo, Collector, Snapshot, StatsConfig};
use super::fs::DiskUsage;
use super::fs::FsInfo;
use super::network::InterfaceCounters;
use super::summary::SYSTEM_CONTAINER_PODS;
use super::summary::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, NodeStats,
    PodReference, PodStats, PvcReference, RlimitStats, RuntimeStats, Summary, VolumeStats,
};
use super::volume::{PersistentVolumeMetrics, SpecVolume, persistent_usage, sort_volumes};
use crate::cri::{Cri, api};
use crate::node::MachineInfo;

/// The unit of `/proc/stat` times: `USER_HZ`, 100 on every Linux architecture.
const USER_HZ: u64 = 100;
/// The interface the kubelet puts at the top level of network stats.
const DEFAULT_INTERFACE: &str = "eth0";
/// A memory limit above this is none (cAdvisor's rule): no `availableBytes`.
const MAX_MEMORY: u64 = 1 << 62;

/// A CRI timestamp (ns since the epoch) in RFC 3339.
#[must_use]
pub fn rfc3339(ns: i64) -> String {
    Timestamp::from_nanosecond(i128::from(ns))
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

/// Cumulative CPU time (ns) and boot time (s since the epoch) from `/proc/stat`: user,
/// nice, system, irq, softirq and steal of the `cpu` line, at `ticks_per_second`.
#[must_use]
pub fn parse_proc_stat(text: &str, ticks_per_second: u64) -> (Option<u64>, Option<i64>) {
    let mut usage = None;
    let mut boot = None;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("cpu") => {
                let v: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
                if v.len() >= 8 && ticks_per_second > 0 {
                    // A sum past u64 is no reading the kernel could give: none.
                    usage = [v[0], v[1], v[2], v[5], v[6], v[7]]
                        .into_iter()
                        .try_fold(0u64, u64::checked_add)
                        .map(|ticks| ticks.saturating_mul(1_000_000_000 / ticks_per_second));
                }
            }
            Some("btime") => boot = fields.next().and_then(|f| f.parse().ok()),
            _ => {}
        }
    }
    (usage, boot)
}

/// One reading of the node: what `/metrics/cadvisor` renders, and the summary
/// (`/stats/summary`, `/metrics/resource`, the volume gauges, the eviction manager).
#[derive(Debug, Clone)]
pub struct Figures {
    /// The reading.
    pub snapshot: Snapshot,
    /// The summary built from it.
    pub summary: Summary,
}

/// The stats provider: reads snapshots and keeps the previous CPU sample of each
/// container, pod and the node, for rates.
#[derive(Debug, Default)]
pub struct StatsProvider {
    collector: Collector,
    previous: Mutex<HashMap<String, (i64, u64)>>,
}

impl StatsProvider {
    /// A provider reading where `config` says.
    #[must_use]
    pub fn new(config: StatsConfig) -> Self {
        Self {
            collector: Collector::new(config),
            previous: Mutex::default(),
        }
    }

    /// CPU stats with a rate against the previous sample of `key`.
    fn cpu(
        &self,
        seen: &mut HashMap<String, (i64, u64)>,
        key: &str,
        at: i64,
        usage: u64,
    ) -> CpuStats {
        let previous = crate::lock::lock(&self.previous).get(key).copied();
        seen.insert(key.to_owned(), (at, usage));
        let rate = previous.and_then(|(t0, u0)| {
            let dt = u64::try_from(at - t0).ok().filter(|dt| *dt > 0)?;
            let du = usage.checked_sub(u0)?;
            Some(u64::try_from(u128::from(du) * 1_000_000_000 / u128::from(dt)).unwrap_or(u64::MAX))
        });
        CpuStats {
            time: rfc3339(at),
            usage_nano_cores: rate,
            usage_core_nano_seconds: Some(usage),
        }
    }

    /// One reading of the node and the summary built from it, with CPU rates against the
    /// previous reading (the first has none); `volumes` are the volumes of each pod's spec,
    /// by pod UID, and `persistent` gives the figures of its claims and CSI volumes.
    ///
    /// # Errors
    /// A failed CRI call, or the file reads did not finish.
    #[tracing::instrument(level = "debug", skip_all, fields(node = node_name))]
    pub async fn read<C: Cri, M: MachineInfo + Clone + 'static>(
        &self,
        node_name: &str,
        cri: &C,
        machine: &M,
        volumes: HashMap<String, Vec<SpecVolume>>,
        persistent: &dyn PersistentVolumeMetrics,
    ) -> Result<Figures, StatsError> {
        let mut others = Vec::new();
        for (uid, spec) in &volumes {
            for v in spec
                .iter()
                .filter(|v| !matches!(v, SpecVolume::InTree { .. }))
            {
                if let Some(figures) = persistent.metrics(uid, v).await {
                    others.push((uid.clone(), persistent_usage(v, figures)));
                }
            }
        }
        let mut snapshot = self.collector.snapshot(cri, machine, volumes).await?;
        for (uid, usage) in others {
            let list = snapshot.storage.volumes.entry(uid).or_default();
            list.push(usage);
            sort_volumes(list);
        }
        let proc_stat = tokio::fs::read_to_string(self.collector.config().proc.join("stat"))
            .await
            .unwrap_or_default();
        let boot = parse_proc_stat(&proc_stat, USER_HZ).1;
        let mut seen = HashMap::new();
        let pods = self.pods(&snapshot, &mut seen);
        let node = self.node(node_name, &snapshot, &proc_stat, boot, &mut seen);
        *crate::lock::lock(&self.previous) = seen;
        Ok(Figures {
            summary: Summary { node, pods },
            snapshot,
        })
    }

    fn container(
        &self,
        snapshot: &Snapshot,
        c: &api::Container,
        name: String,
        seen: &mut HashMap<String, (i64, u64)>,
    ) -> ContainerStats {
        let cri = snapshot.container_stats.get(&c.id);
        let cgroup = snapshot.cgroup_of(&c.id);
        let (cpu, memory) = match cgroup {
            Some(cg) if cg.stats.cpu.is_some() || cg.stats.memory.is_some() => {
                self.cgroup_cpu_memory(cg, &c.id, snapshot.time_ns, None, seen)
            }
            _ => {
                let cpu = cri.and_then(|s| s.cpu.as_ref()).and_then(|cpu| {
                    let usage = cpu.usage_core_nano_seconds.as_ref()?.value;
                    Some(self.cpu(seen, &c.id, cpu.timestamp, usage))
                });
                let memory = cri.and_then(|s| s.memory.as_ref()).and_then(|m| {
                    Some(MemoryStats {
                        time: rfc3339(m.timestamp),
                        working_set_bytes: Some(m.working_set_bytes.as_ref()?.value),
                        ..MemoryStats::default()
                    })
                });
                (cpu, memory)
            }
        };
        let storage = &snapshot.storage;
        let rootfs = cri.and_then(|s| s.writable_layer.as_ref()).map(|w| {
            let mut fs = fs_stats(rfc3339(w.timestamp), storage.image_fs.as_ref());
            fs.used_bytes = w.used_bytes.as_ref().map(|v| v.value);
            fs.inodes_used = w.inodes_used.as_ref().map(|v| v.value);
            fs
        });
        let logs = storage
            .container_logs
            .get(&c.id)
            .map(|usage| used_on(rfc3339(snapshot.time_ns), storage.root_fs.as_ref(), *usage));
        ContainerStats {
            name,
            start_time: rfc3339(c.created_at),
            cpu,
            memory,
            rootfs,
            logs,
        }
    }

    /// CPU (with a rate keyed by `key`) and memory of a cgroup; `capacity` stands for the
    /// limit where the cgroup has none (the node's memory for the root).
    fn cgroup_cpu_memory(
        &self,
        cgroup: &CgroupInfo,
        key: &str,
        at: i64,
        capacity: Option<u64>,
        seen: &mut HashMap<String, (i64, u64)>,
    ) -> (Option<CpuStats>, Option<MemoryStats>) {
        let cpu = cgroup
            .stats
            .cpu
            .map(|cpu| self.cpu(seen, key, at, cpu.total_ns));
        (cpu, memory_stats(&cgroup.stats, at, capacity))
    }

    fn pods(&self, snapshot: &Snapshot, seen: &mut HashMap<String, (i64, u64)>) -> Vec<PodStats> {
        // Containers by sandbox, as the kubelet's CRI stats provider pairs them.
        let mut by_sandbox: BTreeMap<String, Vec<ContainerStats>> = BTreeMap::new();
        for c in &snapshot.containers {
            let name = c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            let stats = self.container(snapshot, c, name, seen);
            by_sandbox
                .entry(c.pod_sandbox_id.clone())
                .or_default()
                .push(stats);
        }
        let now = snapshot.time_ns;
        let mut pods: BTreeMap<String, PodStats> = BTreeMap::new();
        for s in &snapshot.sandboxes {
            let Some(id) = s.metadata.as_ref() else {
                continue;
            };
            let mut containers = by_sandbox.remove(&s.id).unwrap_or_default();
            containers.sort_by(|a, b| a.name.cmp(&b.name));
            let (cpu, memory) = match snapshot.pod_cgroup(&id.uid) {
                Some(cg) => {
                    self.cgroup_cpu_memory(cg, &format!("pod\0{}", id.uid), now, None, seen)
                }
                None => (sum_cpu(&containers, now), sum_memory(&containers, now)),
            };
            let network = snapshot
                .cgroup_of(&s.id)
                .and_then(|cg| network_stats(&cg.network, now));
            let storage = &snapshot.storage;
            let volumes: Vec<(bool, VolumeStats)> = storage
                .volumes
                .get(&id.uid)
                .map(|volumes| {
                    volumes
                        .iter()
                        .map(|v| {
                            let stats = VolumeStats {
                                fs: used_on(rfc3339(now), v.fs.as_ref(), v.usage),
                                name: v.name.clone(),
                                pvc_ref: v.claim.as_ref().map(|claim| PvcReference {
                                    name: claim.clone(),
                                    namespace: id.namespace.clone(),
                                }),
                            };
                            (v.ephemeral, stats)
                        })
                        .collect()
                })
                .unwrap_or_default();
            let ephemeral_volumes: Vec<&VolumeStats> = volumes
                .iter()
                .filter_map(|(ephemeral, v)| ephemeral.then_some(v))
                .collect();
            let ephemeral_storage = storage.root_fs.as_ref().map(|root| {
                ephemeral(
                    rfc3339(now),
                    root,
                    &containers,
                    &ephemeral_volumes,
                    storage.pod_logs.get(&id.uid).copied(),
                )
            });
            pods.entry(id.uid.clone()).or_insert(PodStats {
                pod_ref: PodReference {
                    name: id.name.clone(),
                    namespace: id.namespace.clone(),
                    uid: id.uid.clone(),
                },
                start_time: rfc3339(s.created_at),
                containers,
                cpu,
                memory,
                network,
                volume_stats: volumes.into_iter().map(|(_, v)| v).collect(),
                ephemeral_storage,
            });
        }
        pods.into_values().collect()
    }

    fn node(
        &self,
        node_name: &str,
        snapshot: &Snapshot,
        proc_stat: &str,
        boot: Option<i64>,
        seen: &mut HashMap<String, (i64, u64)>,
    ) -> NodeStats {
        let now = snapshot.time_ns;
        let time = rfc3339(now);
        let root = snapshot.root();
        let cpu = root
            .and_then(|r| r.stats.cpu)
            .map(|c| c.total_ns)
            .or_else(|| parse_proc_stat(proc_stat, USER_HZ).0)
            .map(|usage| self.cpu(seen, "\0node", now, usage));
        // The root cgroup's figures, as cAdvisor's root container gives them the kubelet;
        // available is the capacity less the working set.
        let machine_memory = snapshot.machine.memory;
        let memory = machine_memory.and_then(|m| {
            let usage = m.usage?;
            let figures = root.and_then(|r| memory_stats(&r.stats, now, None));
            Some(MemoryStats {
                time: time.clone(),
                available_bytes: m.available_bytes(),
                usage_bytes: Some(usage.usage_bytes),
                working_set_bytes: Some(usage.working_set_bytes),
                rss_bytes: figures.as_ref().and_then(|f| f.rss_bytes),
                page_faults: figures.as_ref().and_then(|f| f.page_faults),
                major_page_faults: figures.as_ref().and_then(|f| f.major_page_faults),
            })
        });
        let storage = &snapshot.storage;
        let fs = storage.root_fs.as_ref().map(|f| FsStats {
            used_bytes: Some(f.used_bytes),
            inodes_used: Some(f.inodes_used()),
            ..fs_stats(time.clone(), Some(f))
        });
        let image_fs = storage.image_fs_usage.as_ref().map(|u| FsStats {
            used_bytes: u.used_bytes.as_ref().map(|v| v.value),
            inodes_used: u.inodes_used.as_ref().map(|v| v.value),
            ..fs_stats(rfc3339(u.timestamp), storage.image_fs.as_ref())
        });
        let rlimit = snapshot.machine.pids.map(|p| RlimitStats {
            time: time.clone(),
            max_pid: i64::try_from(p.max).ok(),
            running_processes: i64::try_from(p.running).ok(),
        });
        let system_containers = snapshot
            .pods_cgroup
            .iter()
            .map(|cg| {
                let capacity = machine_memory.map(|m| m.total_bytes);
                let (cpu, memory) = self.cgroup_cpu_memory(cg, "\0pods", now, capacity, seen);
                ContainerStats {
                    name: SYSTEM_CONTAINER_PODS.to_owned(),
                    start_time: rfc3339(cg.created_ns.unwrap_or(now)),
                    cpu,
                    memory,
                    rootfs: None,
                    logs: None,
                }
            })
            .collect();
        NodeStats {
            node_name: node_name.to_owned(),
            system_containers,
            start_time: boot.map(|b| rfc3339(b.saturating_mul(1_000_000_000))),
            cpu,
            memory,
            network: root.and_then(|r| network_stats(&r.network, now)),
            fs,
            runtime: image_fs.map(|fs| RuntimeStats { image_fs: Some(fs) }),
            rlimit,
        }
    }
}

/// Memory stats of a cgroup; `availableBytes` is its limit (or `capacity` where it has
/// none) less its working set.
fn memory_stats(stats: &CgroupStats, at: i64, capacity: Option<u64>) -> Option<MemoryStats> {
    let m = stats.memory?;
    let limit = stats
        .spec
        .memory_limit
        .filter(|l| *l > 0 && *l <= MAX_MEMORY)
        .or(capacity);
    Some(MemoryStats {
        time: rfc3339(at),
        available_bytes: limit.map(|l| l.saturating_sub(m.working_set_bytes)),
        usage_bytes: Some(m.usage_bytes),
        working_set_bytes: Some(m.working_set_bytes),
        rss_bytes: Some(m.rss_bytes),
        page_faults: Some(m.page_faults),
        major_page_faults: Some(m.major_page_faults),
    })
}

/// A filesystem's size and free space, with nothing used yet.
fn fs_stats(time: String, fs: Option<&FsInfo>) -> FsStats {
    FsStats {
        time,
        available_bytes: fs.map(|f| f.available_bytes),
        capacity_bytes: fs.map(|f| f.capacity_bytes),
        used_bytes: None,
        inodes_free: fs.map(|f| f.inodes_free),
        inodes: fs.map(|f| f.inodes),
        inodes_used: None,
    }
}

/// What a directory tree uses of the filesystem `fs`.
fn used_on(time: String, fs: Option<&FsInfo>, usage: DiskUsage) -> FsStats {
    FsStats {
        used_bytes: Some(usage.bytes),
        inodes_used: Some(usage.inodes),
        ..fs_stats(time, fs)
    }
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

/// The kubelet's pod ephemeral storage: each container's writable layer and logs, the
/// ephemeral volumes (emptyDir on disk, configMap) and the files in the pod's log
/// directory, on the root filesystem.
fn ephemeral(
    time: String,
    root: &FsInfo,
    containers: &[ContainerStats],
    volumes: &[&VolumeStats],
    pod_logs: Option<DiskUsage>,
) -> FsStats {
    let mut total = fs_stats(time, Some(root));
    for c in containers {
        if let Some(rootfs) = &c.rootfs {
            total.used_bytes = add(total.used_bytes, rootfs.used_bytes);
            total.inodes_used = add(total.inodes_used, rootfs.inodes_used);
            if let Some(logs) = &c.logs {
                total.used_bytes = add(total.used_bytes, logs.used_bytes);
                total.inodes_used = add(total.inodes_used, logs.inodes_used);
            }
        }
    }
    for v in volumes {
        total.used_bytes = add(total.used_bytes, v.fs.used_bytes);
        total.inodes_used = add(total.inodes_used, v.fs.inodes_used);
    }
    if let Some(logs) = pod_logs {
        total.used_bytes = add(total.used_bytes, Some(logs.bytes));
        total.inodes_used = add(total.inodes_used, Some(logs.inodes));
    }
    total
}

/// Network stats of a namespace's interfaces, `eth0` at the top level.
fn network_stats(interfaces: &[InterfaceCounters], at: i64) -> Option<NetworkStats> {
    if interfaces.is_empty() {
        return None;
    }
    let all: Vec<InterfaceStats> = interfaces
        .iter()
        .map(|i| InterfaceStats {
            name: i.name.clone(),
            rx_bytes: Some(i.rx_bytes),
            rx_errors: Some(i.rx_errors),
            tx_bytes: Some(i.tx_bytes),
            tx_errors: Some(i.tx_errors),
        })
        .collect();
    Some(NetworkStats {
        time: rfc3339(at),
        default: all
            .iter()
            .find(|i| i.name == DEFAULT_INTERFACE)
            .cloned()
            .unwrap_or_default(),
        interfaces: all,
    })
}

fn sum_cpu(containers: &[ContainerStats], now: i64) -> Option<CpuStats> {
    let cpus: Vec<&CpuStats> = containers.iter().filter_map(|c| c.cpu.as_ref()).collect();
    if cpus.is_empty() {
        return None;
    }
    Some(CpuStats {
        time: rfc3339(now),
        usage_nano_cores: cpus.iter().map(|c| c.usage_nano_cores).sum(),
        usage_core_nano_seconds: cpus.iter().map(|c| c.usage_core_nano_seconds).sum(),
    })
}

fn sum_memory(containers: &[ContainerStats], now: i64) -> Option<MemoryStats> {
    let mems: Vec<&MemoryStats> = containers
        .iter()
        .filter_map(|c| c.memory.as_ref())
        .collect();
    if mems.is_empty() {
        return None;
    }
    Some(MemoryStats {
        time: rfc3339(now),
        working_set_bytes: mems.iter().map(|m| m.working_set_bytes).sum(),
        ..MemoryStats::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodId;
    use crate::stats::testing::Machine;
    use crate::stats::volume::NoPersistentVolumes;

    #[test]
    fn node_cpu_time_and_boot_from_proc_stat() {
        let text = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nbtime 1700000000\n";
        let (usage, boot) = parse_proc_stat(text, 100);
        assert_eq!(usage, Some(161 * 10_000_000));
        assert_eq!(boot, Some(1_700_000_000));
        assert_eq!(parse_proc_stat("", 100), (None, None));
        // Ticks whose sum passes u64 (the fuzzer's finding of 2026-11-29: an overflow
        // panic): no figure, the boot time still read.
        let max = u64::MAX;
        let text = format!("cpu  {max} 1 0 0 0 0 0 0\nbtime 5\n");
        assert_eq!(parse_proc_stat(&text, 100), (None, Some(5)));
    }

    struct Runtime {
        cpu: u64,
        at: i64,
    }

    fn pod(uid: &str) -> PodId {
        PodId {
            uid: uid.into(),
            namespace: "default".into(),
            name: format!("p-{uid}"),
        }
    }

    fn container(id: &str, uid: &str, name: &str) -> api::Container {
        api::Container {
            id: id.into(),
            pod_sandbox_id: format!("s-{uid}"),
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            ..Default::default()
        }
    }

    impl Cri for Runtime {
        async fn list_pod_sandbox(
            &self,
            _: api::ListPodSandboxRequest,
        ) -> crate::cri::Result<api::ListPodSandboxResponse> {
            Ok(api::ListPodSandboxResponse {
                items: ["u1", "u2"]
                    .iter()
                    .map(|uid| api::PodSandbox {
                        id: format!("s-{uid}"),
                        metadata: Some(api::PodSandboxMetadata {
                            name: pod(uid).name,
                            uid: (*uid).into(),
                            namespace: "default".into(),
                            attempt: 0,
                        }),
                        created_at: 1_700_000_000_000_000_000,
                        ..Default::default()
                    })
                    .collect(),
            })
        }
        async fn list_containers(
            &self,
            _: api::ListContainersRequest,
        ) -> crate::cri::Result<api::ListContainersResponse> {
            Ok(api::ListContainersResponse {
                containers: vec![container("a", "u1", "web"), container("b", "u1", "side")],
            })
        }
        async fn image_fs_info(
            &self,
            _: api::ImageFsInfoRequest,
        ) -> crate::cri::Result<api::ImageFsInfoResponse> {
            Ok(api::ImageFsInfoResponse {
                image_filesystems: vec![api::FilesystemUsage {
                    timestamp: self.at,
                    used_bytes: Some(api::UInt64Value { value: 1 << 30 }),
                    inodes_used: Some(api::UInt64Value { value: 500 }),
                    ..Default::default()
                }],
            })
        }
        async fn list_container_stats(
            &self,
            _: api::ListContainerStatsRequest,
        ) -> crate::cri::Result<api::ListContainerStatsResponse> {
            let stat = |id: &str| api::ContainerStats {
                attributes: Some(api::ContainerAttributes {
                    id: id.into(),
                    ..Default::default()
                }),
                cpu: Some(api::CpuUsage {
                    timestamp: self.at,
                    usage_core_nano_seconds: Some(api::UInt64Value { value: self.cpu }),
                }),
                memory: Some(api::MemoryUsage {
                    timestamp: self.at,
                    working_set_bytes: Some(api::UInt64Value { value: 1024 }),
                }),
                writable_layer: Some(api::FilesystemUsage {
                    timestamp: self.at,
                    used_bytes: Some(api::UInt64Value { value: 8192 }),
                    inodes_used: Some(api::UInt64Value { value: 3 }),
                    ..Default::default()
                }),
            };
            Ok(api::ListContainerStatsResponse {
                stats: vec![stat("a"), stat("b")],
            })
        }
    }

    #[tokio::test]
    async fn one_entry_per_running_pod_with_summed_containers_and_rates() {
        // Nothing read from this host: no proc, no cgroups.
        let provider = StatsProvider::new(StatsConfig {
            proc: "/nonexistent-proc".into(),
            root_dir: "/nonexistent-root".into(),
            pods_cgroup: None,
        });
        let read = |cpu: u64, at: i64| {
            let provider = &provider;
            async move {
                let runtime = Runtime { cpu, at };
                let no_volumes = HashMap::new();
                let read =
                    provider.read("n1", &runtime, &Machine, no_volumes, &NoPersistentVolumes);
                read.await.unwrap().summary
            }
        };
        let first = read(1_000_000_000, 1_000_000_000).await;
        assert_eq!(first.pods.len(), 2);
        let p1 = &first.pods[0];
        assert_eq!(p1.pod_ref.uid, "u1");
        assert_eq!(p1.containers.len(), 2);
        assert_eq!(p1.containers[0].name, "side");
        assert_eq!(p1.memory.as_ref().unwrap().working_set_bytes, Some(2048));
        assert_eq!(
            p1.cpu.as_ref().unwrap().usage_core_nano_seconds,
            Some(2_000_000_000)
        );
        assert_eq!(
            p1.cpu.as_ref().unwrap().usage_nano_cores,
            None,
            "no rate yet"
        );
        assert!(first.pods[1].containers.is_empty() && first.pods[1].cpu.is_none());
        // The kubelet's node figures: capacity less the working set is available.
        let node_memory = first.node.memory.as_ref().unwrap();
        assert_eq!(
            (
                node_memory.usage_bytes,
                node_memory.working_set_bytes,
                node_memory.available_bytes
            ),
            (Some(900), Some(600), Some(400))
        );

        // Half a core each over the next two seconds.
        let second = read(2_000_000_000, 3_000_000_000).await;
        let cpu = second.pods[0].cpu.as_ref().unwrap();
        assert_eq!(cpu.usage_nano_cores, Some(1_000_000_000));
        let json = serde_json::to_value(&second).unwrap();
        assert_eq!(json["pods"][0]["podRef"]["name"], "p-u1");
        assert_eq!(json["node"]["nodeName"], "n1");
        assert!(json["pods"][0]["containers"][0]["cpu"]["usageCoreNanoSeconds"].is_u64());
        // The writable layer from the runtime; the image filesystem from ImageFsInfo; PIDs.
        assert_eq!(
            json["pods"][0]["containers"][0]["rootfs"]["usedBytes"],
            8192
        );
        assert_eq!(json["pods"][0]["containers"][0]["rootfs"]["inodesUsed"], 3);
        assert_eq!(json["node"]["runtime"]["imageFs"]["usedBytes"], 1 << 30);
        assert_eq!(json["node"]["runtime"]["imageFs"]["inodesUsed"], 500);
        assert_eq!(json["node"]["rlimit"]["maxpid"], 4_194_304);
        assert_eq!(json["node"]["rlimit"]["curproc"], 120);
        // The rate is against the reading before, not the first.
        let third = read(3_000_000_000, 4_000_000_000).await;
        assert_eq!(
            third.pods[0].cpu.as_ref().unwrap().usage_nano_cores,
            Some(2_000_000_000)
        );
        // A root directory not made yet is on its nearest ancestor's filesystem; no
        // namespace to read: no network.
        assert!(json["node"]["fs"]["capacityBytes"].as_u64() > Some(0));
        assert!(json["node"].get("network").is_none());
    }

    /// A claim `data-0` mounted for pod `u1` as volume `data`, 4 KiB used on a filesystem
    /// of 1 MiB.
    struct OneClaim;
    impl PersistentVolumeMetrics for OneClaim {
        fn metrics<'a>(
            &'a self,
            uid: &'a str,
            volume: &'a SpecVolume,
        ) -> futures::future::BoxFuture<'a, Option<(DiskUsage, Option<FsInfo>)>> {
            let found = (uid == "u1" && volume.claim() == Some("data-0")).then(|| {
                let fs = FsInfo {
                    capacity_bytes: 1 << 20,
                    available_bytes: (1 << 20) - 4096,
                    used_bytes: 4096,
                    inodes: 100,
                    inodes_free: 90,
                };
                (
                    DiskUsage {
                        bytes: 4096,
                        inodes: 10,
                    },
                    Some(fs),
                )
            });
            Box::pin(async move { found })
        }
    }

    #[tokio::test]
    async fn a_claims_volume_has_its_pvc_ref_and_is_not_ephemeral() {
        let provider = StatsProvider::new(StatsConfig {
            proc: "/nonexistent-proc".into(),
            root_dir: "/nonexistent-root".into(),
            pods_cgroup: None,
        });
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p-u1", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}},
                {"name": "other", "persistentVolumeClaim": {"claimName": "not-mounted"}},
                {"name": "scratch", "emptyDir": {}},
            ]},
        }))
        .unwrap();
        let volumes = HashMap::from([("u1".to_owned(), SpecVolume::all_of(&pod))]);
        let runtime = Runtime { cpu: 1, at: 1 };
        let figures = provider
            .read("n1", &runtime, &Machine, volumes, &OneClaim)
            .await
            .unwrap();
        let json = serde_json::to_value(&figures.summary).unwrap();
        let pod = &json["pods"][0];
        // The emptyDir is not set up under this root: no entry; the unmounted claim none.
        assert_eq!(
            pod["volume"],
            serde_json::json!([{
                "time": pod["volume"][0]["time"],
                "availableBytes": 1_044_480,
                "capacityBytes": 1_048_576,
                "usedBytes": 4096,
                "inodesFree": 90,
                "inodes": 100,
                "inodesUsed": 10,
                "name": "data",
                "pvcRef": {"name": "data-0", "namespace": "default"},
            }])
        );
        // Not ephemeral: the pod's ephemeral storage is its containers' alone.
        let containers_used: u64 = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["rootfs"]["usedBytes"].as_u64().unwrap())
            .sum();
        assert_eq!(pod["ephemeral-storage"]["usedBytes"], containers_used);
    }
}
