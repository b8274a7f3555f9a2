//! `/stats/summary`: the kubelet's stats summary (API `stats/v1alpha1`), with CPU and
//! memory of the node and of each running pod and its containers.
//!
//! Pods and containers come from CRI: `ListPodSandbox` (ready sandboxes: one entry per
//! running pod), `ListContainers` (running containers) and `ListContainerStats` (their
//! cumulative CPU time and working set). The node comes from `/proc/stat` and
//! `/proc/meminfo`. CPU rates (`usageNanoCores`) are computed between two summaries, as the
//! kubelet's CRI stats provider does, so the first summary has none.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::cri::{Cri, CriError, api};
use crate::kuberuntime::labels;
use crate::node::MachineInfo;

/// The unit of `/proc/stat` times: `USER_HZ`, 100 on every Linux architecture.
const USER_HZ: u64 = 100;

/// The summary.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// One entry per running pod.
    pub pods: Vec<PodStats>,
}

/// The node's stats.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// The node's name.
    pub node_name: String,
    /// Boot time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

/// A pod's reference.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PodReference {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
}

/// A pod's stats: its containers' summed.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// Which pod.
    pub pod_ref: PodReference,
    /// When its sandbox was created.
    pub start_time: String,
    /// Its running containers.
    pub containers: Vec<ContainerStats>,
    /// Sum over the containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Sum over the containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

/// A container's stats.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// The container's name in the pod spec.
    pub name: String,
    /// When it was created.
    pub start_time: String,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

/// CPU usage.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When sampled.
    pub time: String,
    /// Average use since the previous sample, in billionths of a core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative CPU time, in core-nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// Memory usage.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When sampled.
    pub time: String,
    /// Memory available (node only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Memory in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// The working set: what the kubelet evicts and the scheduler counts by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
}

/// A CRI timestamp (ns since the epoch) in RFC 3339.
pub(crate) fn rfc3339(ns: i64) -> String {
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
                    let ticks = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
                    usage = Some(ticks.saturating_mul(1_000_000_000 / ticks_per_second));
                }
            }
            Some("btime") => boot = fields.next().and_then(|f| f.parse().ok()),
            _ => {}
        }
    }
    (usage, boot)
}

/// The previous CPU sample of each container (and of the node), for rates.
#[derive(Debug, Default)]
pub struct StatsProvider {
    previous: Mutex<HashMap<String, (i64, u64)>>,
}

impl StatsProvider {
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

    /// The summary now.
    ///
    /// # Errors
    /// A failed CRI call.
    pub async fn summary<C: Cri, M: MachineInfo>(
        &self,
        node_name: &str,
        cri: &C,
        machine: &M,
    ) -> Result<Summary, CriError> {
        let sandboxes = cri
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
        let stats: HashMap<String, api::ContainerStats> = cri
            .list_container_stats(api::ListContainerStatsRequest { filter: None })
            .await?
            .stats
            .into_iter()
            .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s)))
            .collect();

        let now = Timestamp::now().as_nanosecond();
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let mut seen = HashMap::new();
        let mut by_pod: BTreeMap<String, Vec<ContainerStats>> = BTreeMap::new();
        for c in &containers {
            let Some(uid) = c.labels.get(labels::POD_UID) else {
                continue;
            };
            let name = c
                .labels
                .get(labels::CONTAINER_NAME)
                .cloned()
                .unwrap_or_else(|| {
                    c.metadata
                        .as_ref()
                        .map(|m| m.name.clone())
                        .unwrap_or_default()
                });
            let s = stats.get(&c.id);
            let cpu = s.and_then(|s| s.cpu.as_ref()).and_then(|cpu| {
                let usage = cpu.usage_core_nano_seconds.as_ref()?.value;
                Some(self.cpu(&mut seen, &c.id, cpu.timestamp, usage))
            });
            let memory = s.and_then(|s| s.memory.as_ref()).and_then(|m| {
                let ws = m.working_set_bytes.as_ref()?.value;
                Some(MemoryStats {
                    time: rfc3339(m.timestamp),
                    available_bytes: None,
                    usage_bytes: None,
                    working_set_bytes: Some(ws),
                })
            });
            by_pod.entry(uid.clone()).or_default().push(ContainerStats {
                name,
                start_time: rfc3339(c.created_at),
                cpu,
                memory,
            });
        }

        let mut pods: BTreeMap<String, PodStats> = BTreeMap::new();
        for s in &sandboxes {
            let Some(id) = labels::pod_of(&s.labels) else {
                continue;
            };
            let mut containers = by_pod.remove(&id.uid).unwrap_or_default();
            containers.sort_by(|a, b| a.name.cmp(&b.name));
            let cpu = sum_cpu(&containers, now);
            let memory = sum_memory(&containers, now);
            pods.entry(id.uid.clone()).or_insert(PodStats {
                pod_ref: PodReference {
                    name: id.name,
                    namespace: id.namespace,
                    uid: id.uid,
                },
                start_time: rfc3339(s.created_at),
                containers,
                cpu,
                memory,
            });
        }

        let node = self.node_stats(node_name, machine, now, &mut seen).await;
        *crate::lock::lock(&self.previous) = seen;
        Ok(Summary {
            node,
            pods: pods.into_values().collect(),
        })
    }

    async fn node_stats<M: MachineInfo>(
        &self,
        node_name: &str,
        machine: &M,
        now: i64,
        seen: &mut HashMap<String, (i64, u64)>,
    ) -> NodeStats {
        let proc_stat = tokio::fs::read_to_string("/proc/stat")
            .await
            .unwrap_or_default();
        let (usage, boot) = parse_proc_stat(&proc_stat, USER_HZ);
        // The root cgroup's figures, as cAdvisor's root container gives them the kubelet.
        let memory = machine.memory().ok().and_then(|m| {
            let usage = m.usage?;
            Some(MemoryStats {
                time: rfc3339(now),
                available_bytes: m.available_bytes(),
                usage_bytes: Some(usage.usage_bytes),
                working_set_bytes: Some(usage.working_set_bytes),
            })
        });
        NodeStats {
            node_name: node_name.to_owned(),
            start_time: boot.map(|b| rfc3339(b.saturating_mul(1_000_000_000))),
            cpu: usage.map(|u| self.cpu(seen, "\0node", now, u)),
            memory,
        }
    }
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
        available_bytes: None,
        usage_bytes: None,
        working_set_bytes: mems.iter().map(|m| m.working_set_bytes).sum(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{FsStats, HugePages, MachineError, Memory, MemoryUsage, PidUsage};
    use crate::pod::PodId;

    #[test]
    fn node_cpu_time_and_boot_from_proc_stat() {
        let text = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nbtime 1700000000\n";
        let (usage, boot) = parse_proc_stat(text, 100);
        assert_eq!(usage, Some(161 * 10_000_000));
        assert_eq!(boot, Some(1_700_000_000));
        assert_eq!(parse_proc_stat("", 100), (None, None));
    }

    struct Machine;
    impl MachineInfo for Machine {
        fn num_cpus(&self) -> Result<u32, MachineError> {
            Ok(2)
        }
        fn memory(&self) -> Result<Memory, MachineError> {
            Ok(Memory {
                total_bytes: 1000,
                usage: Some(MemoryUsage {
                    usage_bytes: 900,
                    working_set_bytes: 600,
                }),
            })
        }
        fn hugepages(&self) -> Result<Vec<HugePages>, MachineError> {
            Ok(Vec::new())
        }
        fn fs_stats(&self, _: &std::path::Path) -> Result<FsStats, MachineError> {
            unimplemented!()
        }
        fn pid_usage(&self) -> Result<PidUsage, MachineError> {
            unimplemented!()
        }
        fn machine_id(&self) -> Result<String, MachineError> {
            Ok("m".into())
        }
        fn system_uuid(&self) -> Option<String> {
            None
        }
        fn boot_id(&self) -> Result<String, MachineError> {
            Ok("b".into())
        }
        fn kernel_version(&self) -> Result<String, MachineError> {
            Ok("6".into())
        }
        fn os_image(&self) -> Result<String, MachineError> {
            Ok("Debian".into())
        }
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

    fn container_labels(uid: &str, name: &str) -> HashMap<String, String> {
        let mut l = labels::pod_labels(&pod(uid));
        l.insert(labels::CONTAINER_NAME.into(), name.into());
        l
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
                        labels: labels::pod_labels(&pod(uid)),
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
                containers: vec![
                    api::Container {
                        id: "a".into(),
                        labels: container_labels("u1", "web"),
                        ..Default::default()
                    },
                    api::Container {
                        id: "b".into(),
                        labels: container_labels("u1", "side"),
                        ..Default::default()
                    },
                ],
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
                writable_layer: None,
            };
            Ok(api::ListContainerStatsResponse {
                stats: vec![stat("a"), stat("b")],
            })
        }
    }

    #[tokio::test]
    async fn one_entry_per_running_pod_with_summed_containers_and_rates() {
        let provider = StatsProvider::default();
        let first = provider
            .summary(
                "n1",
                &Runtime {
                    cpu: 1_000_000_000,
                    at: 1_000_000_000,
                },
                &Machine,
            )
            .await
            .unwrap();
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
        let second = provider
            .summary(
                "n1",
                &Runtime {
                    cpu: 2_000_000_000,
                    at: 3_000_000_000,
                },
                &Machine,
            )
            .await
            .unwrap();
        let cpu = second.pods[0].cpu.as_ref().unwrap();
        assert_eq!(cpu.usage_nano_cores, Some(1_000_000_000));
        let json = serde_json::to_value(&second).unwrap();
        assert_eq!(json["pods"][0]["podRef"]["name"], "p-u1");
        assert_eq!(json["node"]["nodeName"], "n1");
        assert!(json["pods"][0]["containers"][0]["cpu"]["usageCoreNanoSeconds"].is_u64());
    }
}
