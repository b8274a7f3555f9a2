//! `/metrics/cadvisor`: the container series Prometheus scrapes from the kubelet's
//! embedded cAdvisor (v0.38, as the kubelet v1.20 registers it), rendered from one
//! reading of the stats provider ([`crate::stats::Snapshot`]).
//!
//! Every series carries the kubelet's base labels `container`, `id`, `image`, `name`,
//! `namespace`, `pod` (empty where they do not apply) and cAdvisor's conventions: `id` is
//! the cgroup path; `/` is the machine; a pod's cgroup has `pod` and `namespace` only; a
//! container's `name` is its runtime ID; the sandbox (pause) has an empty `container` and
//! carries the pod's network series, which no other container of the pod repeats; the
//! CFS series appear only for a cgroup with a quota. Memory as cAdvisor reads it: usage,
//! working set, RSS, cache, mapped files, swap, the peak and the limit's failure count
//! (v1 and v2 files, [`crate::stats::cgroup`]). Families are sorted by name and
//! samples by labels, as client_golang gathers them; container samples carry the
//! reading's timestamp.
//!
//! The text (exposition format 0.0.4) is written here rather than by `prometheus-client`,
//! whose OpenMetrics encoder renames counters (`container_cpu_usage_seconds` +
//! `_total`) and writes no sample timestamps: the family names and HELP lines must be
//! cAdvisor's for the dashboards and recording rules written against them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::text_format::{format_float, sample};
use crate::stats::fs::FilesystemFigures;
use crate::stats::process::ProcessFigures;
use crate::stats::{CgroupInfo, Snapshot};

/// `counter` or `gauge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
        }
    }
}

/// One sample: its label pairs (sorted when rendered), value and timestamp (ms).
type Sample = (Vec<(&'static str, String)>, f64, Option<i64>);

/// A metric family being filled.
#[derive(Debug)]
struct Family {
    help: &'static str,
    kind: Kind,
    samples: Vec<Sample>,
}

/// The families of one scrape, by name.
#[derive(Debug, Default)]
struct Families(BTreeMap<&'static str, Family>);

impl Families {
    fn add(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: Vec<(&'static str, String)>,
        value: f64,
        timestamp_ms: Option<i64>,
    ) {
        self.0
            .entry(name)
            .or_insert_with(|| Family {
                help,
                kind,
                samples: Vec::new(),
            })
            .samples
            .push((labels, value, timestamp_ms));
    }

    fn render(mut self) -> String {
        let mut out = String::new();
        for (name, family) in &mut self.0 {
            for (labels, _, _) in &mut family.samples {
                labels.sort_by(|a, b| a.0.cmp(b.0));
            }
            family.samples.sort_by(|a, b| a.0.cmp(&b.0));
            let _ = writeln!(out, "# HELP {name} {}", family.help);
            let _ = writeln!(out, "# TYPE {name} {}", family.kind.as_str());
            for (labels, value, timestamp) in &family.samples {
                let labels: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let value = match timestamp {
                    Some(ts) => format!("{} {ts}", format_float(*value)),
                    None => format_float(*value),
                };
                sample(&mut out, name, &labels, value);
            }
        }
        out
    }
}

/// The kubelet's base labels of a cgroup.
fn base_labels(c: &CgroupInfo) -> Vec<(&'static str, String)> {
    let (pod, namespace) = c
        .pod
        .as_ref()
        .map(|p| (p.name.clone(), p.namespace.clone()))
        .unwrap_or_default();
    vec![
        ("container", c.container.clone()),
        ("id", c.id.clone()),
        ("image", c.image.clone()),
        ("name", c.runtime_id.clone()),
        ("namespace", namespace),
        ("pod", pod),
    ]
}

fn with(
    base: &[(&'static str, String)],
    extra: &'static str,
    value: &str,
) -> Vec<(&'static str, String)> {
    let mut labels = base.to_vec();
    labels.push((extra, value.to_owned()));
    labels
}

/// Nanoseconds as seconds.
#[allow(clippy::cast_precision_loss)]
fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[allow(clippy::cast_precision_loss)]
fn float(v: u64) -> f64 {
    v as f64
}

/// The network families, per interface.
const NETWORK: &[(&str, &str)] = &[
    (
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received",
    ),
    (
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving",
    ),
    (
        "container_network_receive_packets_dropped_total",
        "Cumulative count of packets dropped while receiving",
    ),
    (
        "container_network_receive_packets_total",
        "Cumulative count of packets received",
    ),
    (
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted",
    ),
    (
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting",
    ),
    (
        "container_network_transmit_packets_dropped_total",
        "Cumulative count of packets dropped while transmitting",
    ),
    (
        "container_network_transmit_packets_total",
        "Cumulative count of packets transmitted",
    ),
];

fn add_cgroup(f: &mut Families, c: &CgroupInfo, now_s: f64, ts: Option<i64>) {
    use Kind::{Counter, Gauge};
    let base = base_labels(c);
    if let Some(created) = c.created_ns {
        #[allow(clippy::cast_precision_loss)]
        let start = (created / 1_000_000_000) as f64;
        f.add(
            "container_start_time_seconds",
            "Start time of the container since unix epoch in seconds.",
            Gauge,
            base.clone(),
            start,
            None,
        );
    }
    let spec = c.stats.spec;
    if let Some(period) = spec.cpu_period {
        f.add(
            "container_spec_cpu_period",
            "CPU period of the container.",
            Gauge,
            base.clone(),
            float(period),
            None,
        );
    }
    if spec.cpu_quota != 0 {
        f.add(
            "container_spec_cpu_quota",
            "CPU quota of the container.",
            Gauge,
            base.clone(),
            float(spec.cpu_quota),
            None,
        );
    }
    if let Some(shares) = spec.cpu_shares {
        f.add(
            "container_spec_cpu_shares",
            "CPU share of the container.",
            Gauge,
            base.clone(),
            float(shares),
            None,
        );
    }
    if let Some(limit) = spec.memory_limit {
        for (name, help, value) in [
            (
                "container_spec_memory_limit_bytes",
                "Memory limit for the container.",
                limit,
            ),
            (
                "container_spec_memory_swap_limit_bytes",
                "Memory swap limit for the container.",
                spec.memory_swap_limit,
            ),
            (
                "container_spec_memory_reservation_limit_bytes",
                "Memory reservation limit for the container.",
                spec.memory_reservation,
            ),
        ] {
            f.add(name, help, Gauge, base.clone(), float(value), None);
        }
    }
    f.add(
        "container_last_seen",
        "Last time a container was seen by the exporter",
        Gauge,
        base.clone(),
        now_s,
        ts,
    );
    if let Some(cpu) = c.stats.cpu {
        f.add(
            "container_cpu_usage_seconds_total",
            "Cumulative cpu time consumed in seconds.",
            Counter,
            with(&base, "cpu", "total"),
            seconds(cpu.total_ns),
            ts,
        );
        f.add(
            "container_cpu_user_seconds_total",
            "Cumulative user cpu time consumed in seconds.",
            Counter,
            base.clone(),
            seconds(cpu.user_ns),
            ts,
        );
        f.add(
            "container_cpu_system_seconds_total",
            "Cumulative system cpu time consumed in seconds.",
            Counter,
            base.clone(),
            seconds(cpu.system_ns),
            ts,
        );
    }
    if let Some(t) = c.stats.throttling.filter(|_| spec.cpu_quota != 0) {
        f.add(
            "container_cpu_cfs_periods_total",
            "Number of elapsed enforcement period intervals.",
            Counter,
            base.clone(),
            float(t.periods),
            ts,
        );
        f.add(
            "container_cpu_cfs_throttled_periods_total",
            "Number of throttled period intervals.",
            Counter,
            base.clone(),
            float(t.throttled_periods),
            ts,
        );
        f.add(
            "container_cpu_cfs_throttled_seconds_total",
            "Total time duration the container has been throttled.",
            Counter,
            base.clone(),
            seconds(t.throttled_ns),
            ts,
        );
    }
    if let Some(m) = c.stats.memory {
        f.add(
            "container_memory_cache",
            "Number of bytes of page cache memory.",
            Gauge,
            base.clone(),
            float(m.cache_bytes),
            ts,
        );
        f.add(
            "container_memory_rss",
            "Size of RSS in bytes.",
            Gauge,
            base.clone(),
            float(m.rss_bytes),
            ts,
        );
        f.add("container_memory_usage_bytes", "Current memory usage in bytes, including all memory regardless of when it was accessed", Gauge, base.clone(), float(m.usage_bytes), ts);
        f.add(
            "container_memory_failcnt",
            "Number of memory usage hits limits",
            Counter,
            base.clone(),
            float(m.failcnt),
            ts,
        );
        f.add(
            "container_memory_mapped_file",
            "Size of memory mapped files in bytes.",
            Gauge,
            base.clone(),
            float(m.mapped_file_bytes),
            ts,
        );
        f.add(
            "container_memory_max_usage_bytes",
            "Maximum memory usage recorded in bytes",
            Gauge,
            base.clone(),
            float(m.max_usage_bytes),
            ts,
        );
        f.add(
            "container_memory_swap",
            "Container swap usage in bytes.",
            Gauge,
            base.clone(),
            float(m.swap_bytes),
            ts,
        );
        f.add(
            "container_memory_working_set_bytes",
            "Current working set in bytes.",
            Gauge,
            base.clone(),
            float(m.working_set_bytes),
            ts,
        );
        for (failure, scope, value) in [
            ("pgfault", "container", m.page_faults),
            ("pgfault", "hierarchy", m.hierarchy_page_faults),
            ("pgmajfault", "container", m.major_page_faults),
            ("pgmajfault", "hierarchy", m.hierarchy_major_page_faults),
        ] {
            let mut labels = with(&base, "failure_type", failure);
            labels.push(("scope", scope.to_owned()));
            f.add(
                "container_memory_failures_total",
                "Cumulative count of memory allocation failures.",
                Counter,
                labels,
                float(value),
                ts,
            );
        }
    }
    if let Some((device, used)) = &c.fs_usage {
        f.add(
            "container_fs_usage_bytes",
            "Number of bytes that are consumed by the container on this filesystem.",
            Gauge,
            with(&base, "device", device),
            float(*used),
            ts,
        );
    }
    if let Some(p) = c.processes {
        add_processes(f, &base, p, ts);
    }
    for fs in &c.filesystems {
        add_filesystem(f, &base, fs, ts);
    }
    for i in &c.network {
        let values = [
            i.rx_bytes,
            i.rx_errors,
            i.rx_dropped,
            i.rx_packets,
            i.tx_bytes,
            i.tx_errors,
            i.tx_dropped,
            i.tx_packets,
        ];
        for ((name, help), value) in NETWORK.iter().zip(values) {
            f.add(
                name,
                help,
                Counter,
                with(&base, "interface", &i.name),
                float(value),
                ts,
            );
        }
    }
}

/// A family of one figure: its name, its help, and the figure.
type FigureFamily<T> = (&'static str, &'static str, fn(&T) -> u64);

/// cAdvisor's process families.
const PROCESSES: [FigureFamily<ProcessFigures>; 5] = [
    (
        "container_processes",
        "Number of processes running inside the container.",
        |p| p.processes,
    ),
    (
        "container_file_descriptors",
        "Number of open file descriptors for the container.",
        |p| p.fds,
    ),
    (
        "container_sockets",
        "Number of open sockets for the container.",
        |p| p.sockets,
    ),
    (
        "container_threads_max",
        "Maximum number of threads allowed inside the container, infinity if value is zero",
        |p| p.threads_max,
    ),
    (
        "container_threads",
        "Number of threads running inside the container",
        |p| p.threads,
    ),
];

fn add_processes(
    f: &mut Families,
    base: &[(&'static str, String)],
    p: ProcessFigures,
    ts: Option<i64>,
) {
    for (name, help, figure) in PROCESSES {
        f.add(
            name,
            help,
            Kind::Gauge,
            base.to_vec(),
            float(figure(&p)),
            ts,
        );
    }
    #[allow(clippy::cast_precision_loss)] // thousandths of a few tasks
    f.add(
        "container_cpu_load_average_10s",
        "Value of container cpu load average over the last 10 seconds.",
        Kind::Gauge,
        base.to_vec(),
        p.load_average_milli as f64,
        ts,
    );
    let tasks = p.tasks;
    for (state, n) in [
        ("iowaiting", tasks.io_wait),
        ("running", tasks.running),
        ("sleeping", tasks.sleeping),
        ("stopped", tasks.stopped),
        ("uninterruptible", tasks.uninterruptible),
    ] {
        f.add(
            "container_tasks_state",
            "Number of tasks in given state",
            Kind::Gauge,
            with(base, "state", state),
            float(n),
            ts,
        );
    }
    if let Some(soft) = p.max_open_files {
        #[allow(clippy::cast_precision_loss)] // a limit of open files
        f.add(
            "container_ulimits_soft",
            "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice",
            Kind::Gauge,
            with(base, "ulimit", "max_open_files"),
            soft as f64,
            ts,
        );
    }
}

/// A filesystem family: its name, help, type, and figure. Disk times are cAdvisor's: the
/// milliseconds of `/proc/diskstats` divided by 10^9 (it takes them for nanoseconds), so
/// that the series are those the kubelet serves.
type FsFamily = (
    &'static str,
    &'static str,
    Kind,
    fn(&FilesystemFigures) -> f64,
);

#[allow(clippy::cast_precision_loss)] // byte, inode and I/O counts
const FILESYSTEM: [FsFamily; 15] = [
    (
        "container_fs_inodes_free",
        "Number of available Inodes",
        Kind::Gauge,
        |f| f.info.inodes_free as f64,
    ),
    (
        "container_fs_inodes_total",
        "Number of Inodes",
        Kind::Gauge,
        |f| f.info.inodes as f64,
    ),
    (
        "container_fs_limit_bytes",
        "Number of bytes that can be consumed by the container on this filesystem.",
        Kind::Gauge,
        |f| f.info.capacity_bytes as f64,
    ),
    (
        "container_fs_usage_bytes",
        "Number of bytes that are consumed by the container on this filesystem.",
        Kind::Gauge,
        |f| f.info.used_bytes as f64,
    ),
    (
        "container_fs_reads_total",
        "Cumulative count of reads completed",
        Kind::Counter,
        |f| f.disk.reads as f64,
    ),
    (
        "container_fs_sector_reads_total",
        "Cumulative count of sector reads completed",
        Kind::Counter,
        |f| f.disk.sectors_read as f64,
    ),
    (
        "container_fs_reads_merged_total",
        "Cumulative count of reads merged",
        Kind::Counter,
        |f| f.disk.reads_merged as f64,
    ),
    (
        "container_fs_read_seconds_total",
        "Cumulative count of seconds spent reading",
        Kind::Counter,
        |f| f.disk.read_ms as f64 / 1e9,
    ),
    (
        "container_fs_writes_total",
        "Cumulative count of writes completed",
        Kind::Counter,
        |f| f.disk.writes as f64,
    ),
    (
        "container_fs_sector_writes_total",
        "Cumulative count of sector writes completed",
        Kind::Counter,
        |f| f.disk.sectors_written as f64,
    ),
    (
        "container_fs_writes_merged_total",
        "Cumulative count of writes merged",
        Kind::Counter,
        |f| f.disk.writes_merged as f64,
    ),
    (
        "container_fs_write_seconds_total",
        "Cumulative count of seconds spent writing",
        Kind::Counter,
        |f| f.disk.write_ms as f64 / 1e9,
    ),
    (
        "container_fs_io_current",
        "Number of I/Os currently in progress",
        Kind::Gauge,
        |f| f.disk.in_progress as f64,
    ),
    (
        "container_fs_io_time_seconds_total",
        "Cumulative count of seconds spent doing I/Os",
        Kind::Counter,
        |f| f.disk.io_ms as f64 / 1e9,
    ),
    (
        "container_fs_io_time_weighted_seconds_total",
        "Cumulative weighted I/O time in seconds",
        Kind::Counter,
        |f| f.disk.weighted_io_ms as f64 / 1e9,
    ),
];

fn add_filesystem(
    f: &mut Families,
    base: &[(&'static str, String)],
    fs: &FilesystemFigures,
    ts: Option<i64>,
) {
    for (name, help, kind, figure) in FILESYSTEM {
        f.add(
            name,
            help,
            kind,
            with(base, "device", &fs.device),
            figure(fs),
            ts,
        );
    }
}

/// The page: container series of `snapshot` (none, and `container_scrape_error 1`, when
/// the node could not be read) and the machine series.
#[must_use]
pub fn render(snapshot: Option<&Snapshot>) -> String {
    let mut f = Families::default();
    f.add(
        "container_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        Kind::Gauge,
        Vec::new(),
        if snapshot.is_some() { 0.0 } else { 1.0 },
        None,
    );
    if let Some(snapshot) = snapshot {
        let ts = snapshot.time_ns / 1_000_000;
        #[allow(clippy::cast_precision_loss)]
        let now_s = (snapshot.time_ns / 1_000_000_000) as f64;
        // The pods' cgroup (`/kubepods`) too, unless it is the root itself.
        let pods = snapshot.pods_cgroup.iter().filter(|c| c.id != "/");
        for c in snapshot.cgroups.iter().chain(pods) {
            add_cgroup(&mut f, c, now_s, Some(ts));
        }
        let m = &snapshot.machine;
        let labels = vec![
            ("boot_id", m.boot_id.clone()),
            ("machine_id", m.machine_id.clone()),
            ("system_uuid", m.system_uuid.clone()),
        ];
        if let Some(cpus) = m.num_cpus {
            f.add(
                "machine_cpu_cores",
                "Number of logical CPU cores.",
                Kind::Gauge,
                labels.clone(),
                f64::from(cpus),
                None,
            );
        }
        if let Some(t) = m.topology {
            f.add(
                "machine_cpu_physical_cores",
                "Number of physical CPU cores.",
                Kind::Gauge,
                labels.clone(),
                f64::from(t.physical_cores),
                None,
            );
            f.add(
                "machine_cpu_sockets",
                "Number of CPU sockets.",
                Kind::Gauge,
                labels.clone(),
                f64::from(t.sockets),
                None,
            );
        }
        // No cAdvisor runs: its version and revision are empty, as is Docker's.
        f.add(
            "cadvisor_version_info",
            "A metric with a constant '1' value labeled by kernel version, OS version, docker version, cadvisor version & cadvisor revision.",
            Kind::Gauge,
            vec![
                ("cadvisorRevision", String::new()),
                ("cadvisorVersion", String::new()),
                ("dockerVersion", String::new()),
                ("kernelVersion", m.kernel_version.clone()),
                ("osVersion", m.os_image.clone()),
            ],
            1.0,
            None,
        );
        if let Some(memory) = m.memory {
            f.add(
                "machine_memory_bytes",
                "Amount of memory installed on the machine.",
                Kind::Gauge,
                labels,
                float(memory.total_bytes),
                None,
            );
        }
        f.add(
            "machine_scrape_error",
            "1 if there was an error while getting machine metrics, 0 otherwise.",
            Kind::Gauge,
            Vec::new(),
            if m.num_cpus.is_some() && m.memory.is_some() {
                0.0
            } else {
                1.0
            },
            None,
        );
    }
    f.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodId;
    use crate::stats::CgroupKind;
    use crate::stats::MachineFigures;
    use crate::stats::cgroup::{CgroupSpec, CgroupStats, CpuUsage, MemoryFigures, Throttling};
    use crate::stats::network::InterfaceCounters;

    fn cgroup(kind: CgroupKind, id: &str, container: &str) -> CgroupInfo {
        CgroupInfo {
            id: id.into(),
            kind,
            pod: (!matches!(kind, CgroupKind::Root | CgroupKind::System)).then(|| PodId {
                uid: "u1".into(),
                namespace: "default".into(),
                name: "web".into(),
            }),
            container: container.into(),
            runtime_id: if matches!(kind, CgroupKind::Sandbox | CgroupKind::Container) {
                format!("{container}id")
            } else {
                String::new()
            },
            image: String::new(),
            created_ns: Some(1_700_000_000_000_000_000),
            stats: CgroupStats {
                cpu: Some(CpuUsage {
                    total_ns: 2_500_000_000,
                    user_ns: 2_000_000_000,
                    system_ns: 500_000_000,
                }),
                throttling: Some(Throttling {
                    periods: 10,
                    throttled_periods: 4,
                    throttled_ns: 300_000_000,
                }),
                memory: Some(MemoryFigures {
                    usage_bytes: 70_000_000,
                    working_set_bytes: 67_108_864,
                    rss_bytes: 67_000_000,
                    cache_bytes: 3_000_000,
                    page_faults: 1,
                    major_page_faults: 0,
                    failcnt: 2,
                    ..MemoryFigures::default()
                }),
                spec: CgroupSpec {
                    cpu_shares: Some(2),
                    cpu_quota: if container == "burn" { 50_000 } else { 0 },
                    cpu_period: Some(100_000),
                    memory_limit: Some(0),
                    memory_swap_limit: 0,
                    memory_reservation: 0,
                },
            },
            network: if kind == CgroupKind::Sandbox {
                vec![InterfaceCounters {
                    name: "eth0".into(),
                    rx_bytes: 10_485_760,
                    ..InterfaceCounters::default()
                }]
            } else {
                Vec::new()
            },
            fs_usage: (kind == CgroupKind::Container).then(|| ("/dev/sda1".into(), 4096)),
            filesystems: if kind == CgroupKind::Root {
                vec![FilesystemFigures {
                    device: "/dev/vda".into(),
                    info: crate::stats::fs::FsInfo {
                        capacity_bytes: 1000,
                        available_bytes: 500,
                        used_bytes: 400,
                        inodes: 10,
                        inodes_free: 4,
                    },
                    disk: crate::stats::fs::DiskStats {
                        read_ms: 2534,
                        ..Default::default()
                    },
                }]
            } else {
                Vec::new()
            },
            processes: Some(ProcessFigures {
                processes: 1,
                fds: 5,
                sockets: 2,
                threads: 3,
                threads_max: 0,
                max_open_files: (kind == CgroupKind::Container).then_some(1_048_576),
                tasks: crate::stats::process::TaskStates {
                    sleeping: 4,
                    ..Default::default()
                },
                load_average_milli: 1500,
            }),
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            time_ns: 1_800_000_000_123_000_000,
            cgroups: vec![
                cgroup(CgroupKind::Root, "/", ""),
                cgroup(CgroupKind::Pod, "/kubepods/podu1", ""),
                cgroup(CgroupKind::Sandbox, "/kubepods/podu1/sid", ""),
                cgroup(CgroupKind::Container, "/kubepods/podu1/burnid", "burn"),
            ],
            pods_cgroup: Some(cgroup(CgroupKind::System, "/kubepods", "")),
            machine: MachineFigures {
                num_cpus: Some(2),
                memory: Some(crate::node::Memory {
                    total_bytes: 25_000_000_000,
                    usage: None,
                }),
                machine_id: "m\"1".into(),
                topology: Some(crate::node::CpuTopology {
                    physical_cores: 2,
                    sockets: 1,
                }),
                kernel_version: "6.1".into(),
                os_image: "Debian".into(),
                ..MachineFigures::default()
            },
            ..Snapshot::default()
        }
    }

    #[test]
    fn cadvisor_names_help_types_and_sorted_labels() {
        let text = render(Some(&snapshot()));
        assert!(text.contains(
            "# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.\n\
             # TYPE container_cpu_usage_seconds_total counter\n"
        ));
        assert!(text.contains(
            "container_cpu_usage_seconds_total{container=\"burn\",cpu=\"total\",id=\"/kubepods/podu1/burnid\",image=\"\",name=\"burnid\",namespace=\"default\",pod=\"web\"} 2.5 1800000000123\n"
        ), "{text}");
        assert!(text.contains(
            "container_memory_working_set_bytes{container=\"\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 67108864 1800000000123\n"
        ));
        // Only the sandbox carries the pod's network.
        let rx: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("container_network_receive_bytes_total{"))
            .collect();
        assert_eq!(rx.len(), 1, "{rx:?}");
        assert!(
            rx[0].contains("id=\"/kubepods/podu1/sid\",image=\"\",interface=\"eth0\",name=\"id\"")
        );
        // CFS series only where there is a quota.
        let cfs: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("container_cpu_cfs_throttled_periods_total{"))
            .collect();
        assert_eq!(cfs.len(), 1);
        assert!(cfs[0].contains("container=\"burn\"") && cfs[0].contains("} 4 "));
        assert!(text.contains(
            "machine_cpu_cores{boot_id=\"\",machine_id=\"m\\\"1\",system_uuid=\"\"} 2\n"
        ));
        assert!(text.contains("container_scrape_error 0\n"));
        assert!(text.contains("# TYPE container_memory_failcnt counter\n"));
        assert!(
            text.contains(
                "machine_cpu_sockets{boot_id=\"\",machine_id=\"m\\\"1\",system_uuid=\"\"} 1\n"
            ),
            "{text}"
        );
        assert!(text.contains("cadvisor_version_info{cadvisorRevision=\"\",cadvisorVersion=\"\",dockerVersion=\"\",kernelVersion=\"6.1\",osVersion=\"Debian\"} 1\n"), "{text}");
        assert!(text.contains(
            "container_memory_failcnt{container=\"burn\",id=\"/kubepods/podu1/burnid\",image=\"\",name=\"burnid\",namespace=\"default\",pod=\"web\"} 2 "
        ), "{text}");
        for line in [
            "container_sockets{container=\"burn\",id=\"/kubepods/podu1/burnid\",image=\"\",name=\"burnid\",namespace=\"default\",pod=\"web\"} 2 ",
            "container_threads{container=\"\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 3 ",
            "container_tasks_state{container=\"\",id=\"/kubepods\",image=\"\",name=\"\",namespace=\"\",pod=\"\",state=\"sleeping\"} 4 ",
            "container_cpu_load_average_10s{container=\"\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 1500 ",
            "container_fs_limit_bytes{container=\"\",device=\"/dev/vda\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 1000 ",
            "container_fs_read_seconds_total{container=\"\",device=\"/dev/vda\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 0.000002534 ",
            "container_fs_inodes_free{container=\"\",device=\"/dev/vda\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 4 ",
            "container_memory_failures_total{container=\"\",failure_type=\"pgmajfault\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\",scope=\"container\"} 0 ",
            "container_spec_memory_swap_limit_bytes{container=\"\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 0\n",
            "container_ulimits_soft{container=\"burn\",id=\"/kubepods/podu1/burnid\",image=\"\",name=\"burnid\",namespace=\"default\",pod=\"web\",ulimit=\"max_open_files\"} 1048576 ",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert_eq!(text.matches("\ncontainer_ulimits_soft{").count(), 1);
        // The pods' cgroup has its own series, with no pod labels.
        assert!(text.contains(
            "container_memory_rss{container=\"\",id=\"/kubepods\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 67000000 "
        ));
        // Families sorted by name, each declared once.
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn an_unreadable_node_is_a_scrape_error() {
        let text = render(None);
        assert_eq!(
            text,
            "# HELP container_scrape_error 1 if there was an error while getting container metrics, 0 otherwise\n\
             # TYPE container_scrape_error gauge\ncontainer_scrape_error 1\n"
        );
    }
}
