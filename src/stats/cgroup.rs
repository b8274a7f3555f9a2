//! One cgroup's figures as cAdvisor reads them for the kubelet: CPU time (total, user,
//! system), CFS throttling, memory (usage, working set, RSS, page cache, page faults) and
//! the limits the cgroup was given (CPU shares, quota, period; memory limit), from cgroup
//! v1 (one hierarchy per controller) or v2 (the unified tree). Also where a process's
//! cgroups are (`/proc/<pid>/cgroup`).
//!
//! The files are read through the container manager's [`CgroupFs`], so tests lay a tree
//! out in a temporary directory. Parsing is separate from reading and pure.

use std::path::{Path, PathBuf};

use crate::cm::{CgroupFs, CgroupLayout};

/// `/proc/stat` and `cpuacct.stat` count in `USER_HZ`, 100 on every Linux architecture.
const USER_HZ: u64 = 100;
/// cgroup v1's `memory.limit_in_bytes` above this is no limit (cAdvisor's rule).
const MAX_MEMORY: u64 = 1 << 62;

/// Where one cgroup is in each hierarchy: its path below the mount of the v1 `cpu`,
/// `cpuacct` and `memory` hierarchies, or in the unified tree.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupPaths {
    /// In the v1 `cpu` hierarchy.
    pub cpu: Option<String>,
    /// In the v1 `cpuacct` hierarchy.
    pub cpuacct: Option<String>,
    /// In the v1 `memory` hierarchy.
    pub memory: Option<String>,
    /// In the v1 `pids` hierarchy.
    pub pids: Option<String>,
    /// In the unified (v2) tree.
    pub unified: Option<String>,
}

impl CgroupPaths {
    /// The same path in every hierarchy (the kubelet's own cgroups: `/`, `/kubepods`,
    /// `/kubepods/besteffort/pod<uid>`).
    #[must_use]
    pub fn uniform(path: &str) -> Self {
        Self {
            cpu: Some(path.to_owned()),
            cpuacct: Some(path.to_owned()),
            memory: Some(path.to_owned()),
            pids: Some(path.to_owned()),
            unified: Some(path.to_owned()),
        }
    }

    /// The cgroups of a process from its `/proc/<pid>/cgroup`; none when it lists none of
    /// the hierarchies read here.
    #[must_use]
    pub fn parse_proc(text: &str) -> Option<Self> {
        let mut paths = Self::default();
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if controllers.is_empty() {
                paths.unified = Some(path.to_owned());
                continue;
            }
            for controller in controllers.split(',') {
                let slot = match controller {
                    "cpu" => &mut paths.cpu,
                    "cpuacct" => &mut paths.cpuacct,
                    "memory" => &mut paths.memory,
                    "pids" => &mut paths.pids,
                    _ => continue,
                };
                *slot = Some(path.to_owned());
            }
        }
        (paths != Self::default()).then_some(paths)
    }

    /// The name cAdvisor gives the cgroup (its `id` label): the path in the `cpu`
    /// hierarchy, else the unified one.
    #[must_use]
    pub fn name(&self) -> Option<&str> {
        self.cpu
            .as_deref()
            .or(self.memory.as_deref())
            .or(self.unified.as_deref())
    }
}

/// Cumulative CPU time, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuUsage {
    /// User and system.
    pub total_ns: u64,
    /// In user mode.
    pub user_ns: u64,
    /// In kernel mode.
    pub system_ns: u64,
}

/// CFS bandwidth control: enforcement periods and throttling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Throttling {
    /// Elapsed enforcement periods.
    pub periods: u64,
    /// Periods in which the cgroup was throttled.
    pub throttled_periods: u64,
    /// Time throttled, in nanoseconds.
    pub throttled_ns: u64,
}

/// Memory, in bytes, and page fault counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryFigures {
    /// Everything charged, page cache included.
    pub usage_bytes: u64,
    /// The usage less the inactive file pages (never below zero).
    pub working_set_bytes: u64,
    /// Anonymous memory and swap cache (`total_rss`; v2 `anon`).
    pub rss_bytes: u64,
    /// Page cache (`total_cache`; v2 `file`).
    pub cache_bytes: u64,
    /// Page faults of the cgroup's own tasks (`pgfault`).
    pub page_faults: u64,
    /// Major page faults of its own tasks (`pgmajfault`).
    pub major_page_faults: u64,
    /// Page faults in the cgroup and below (v1 `total_pgfault`; v2's `pgfault` counts so).
    pub hierarchy_page_faults: u64,
    /// Major page faults in the cgroup and below (v1 `total_pgmajfault`).
    pub hierarchy_major_page_faults: u64,
    /// Pages mapped into processes (`total_mapped_file`; v2 `file_mapped`).
    pub mapped_file_bytes: u64,
    /// Times the limit was hit (v1 `memory.failcnt`; v2 the `max` events).
    pub failcnt: u64,
    /// The most ever charged (v1 `memory.max_usage_in_bytes`; none in v2: 0, as cAdvisor).
    pub max_usage_bytes: u64,
    /// Swap in use (v1 `memory.memsw.usage_in_bytes` less the usage, 0 without swap
    /// accounting; v2 `memory.swap.current`).
    pub swap_bytes: u64,
}

/// The limits a cgroup was given, as cAdvisor's container spec has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupSpec {
    /// CPU shares (v1 `cpu.shares`; v2 `cpu.weight` converted back to shares).
    pub cpu_shares: Option<u64>,
    /// The CFS quota in microseconds per period; 0 when there is none.
    pub cpu_quota: u64,
    /// The CFS period in microseconds.
    pub cpu_period: Option<u64>,
    /// The memory limit; 0 when there is none (cAdvisor's `container_spec_memory_limit_bytes`).
    pub memory_limit: Option<u64>,
    /// The memory and swap limit (v1 `memory.memsw.limit_in_bytes`, v2
    /// `memory.swap.max`); 0 for none or where there is no such file, as cAdvisor reads it.
    pub memory_swap_limit: u64,
    /// The memory reservation (v1 `memory.soft_limit_in_bytes`, v2 `memory.high`); 0 for
    /// none.
    pub memory_reservation: u64,
}

/// What one cgroup's files say; a figure is `None` when its files cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupStats {
    /// CPU time.
    pub cpu: Option<CpuUsage>,
    /// CFS throttling.
    pub throttling: Option<Throttling>,
    /// Memory.
    pub memory: Option<MemoryFigures>,
    /// Limits.
    pub spec: CgroupSpec,
}

/// The value of `key` in a flat keyed file (`memory.stat`, `cpu.stat`, `cpuacct.stat`).
#[must_use]
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

fn number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// v1: `cpuacct.usage`, `cpuacct.stat` (user and system in `USER_HZ`).
#[must_use]
pub fn parse_cpu_v1(usage: &str, stat: &str) -> Option<CpuUsage> {
    let tick = 1_000_000_000 / USER_HZ;
    Some(CpuUsage {
        total_ns: number(usage)?,
        user_ns: keyed(stat, "user").unwrap_or(0).saturating_mul(tick),
        system_ns: keyed(stat, "system").unwrap_or(0).saturating_mul(tick),
    })
}

/// v2: `usage_usec`, `user_usec`, `system_usec` of `cpu.stat`.
#[must_use]
pub fn parse_cpu_v2(stat: &str) -> Option<CpuUsage> {
    Some(CpuUsage {
        total_ns: keyed(stat, "usage_usec")?.saturating_mul(1000),
        user_ns: keyed(stat, "user_usec").unwrap_or(0).saturating_mul(1000),
        system_ns: keyed(stat, "system_usec").unwrap_or(0).saturating_mul(1000),
    })
}

/// CFS throttling from `cpu.stat`: v1 counts throttled time in ns (`throttled_time`), v2
/// in µs (`throttled_usec`).
#[must_use]
pub fn parse_throttling(stat: &str) -> Option<Throttling> {
    let throttled_ns = keyed(stat, "throttled_time")
        .or_else(|| keyed(stat, "throttled_usec").map(|us| us.saturating_mul(1000)))?;
    Some(Throttling {
        periods: keyed(stat, "nr_periods")?,
        throttled_periods: keyed(stat, "nr_throttled")?,
        throttled_ns,
    })
}

/// v1 memory: `memory.usage_in_bytes` and the hierarchical (`total_`) figures of
/// `memory.stat`.
#[must_use]
pub fn parse_memory_v1(usage: &str, stat: &str) -> Option<MemoryFigures> {
    let usage_bytes = number(usage)?;
    let inactive = keyed(stat, "total_inactive_file").unwrap_or(0);
    Some(MemoryFigures {
        usage_bytes,
        working_set_bytes: usage_bytes.saturating_sub(inactive),
        rss_bytes: keyed(stat, "total_rss").unwrap_or(0),
        cache_bytes: keyed(stat, "total_cache").unwrap_or(0),
        page_faults: keyed(stat, "pgfault").unwrap_or(0),
        major_page_faults: keyed(stat, "pgmajfault").unwrap_or(0),
        hierarchy_page_faults: keyed(stat, "total_pgfault").unwrap_or(0),
        hierarchy_major_page_faults: keyed(stat, "total_pgmajfault").unwrap_or(0),
        mapped_file_bytes: keyed(stat, "total_mapped_file").unwrap_or(0),
        ..MemoryFigures::default()
    })
}

/// v2 memory: `memory.current` and `memory.stat`.
#[must_use]
pub fn parse_memory_v2(current: &str, stat: &str) -> Option<MemoryFigures> {
    let usage_bytes = number(current)?;
    let inactive = keyed(stat, "inactive_file").unwrap_or(0);
    Some(MemoryFigures {
        usage_bytes,
        working_set_bytes: usage_bytes.saturating_sub(inactive),
        rss_bytes: keyed(stat, "anon").unwrap_or(0),
        cache_bytes: keyed(stat, "file").unwrap_or(0),
        page_faults: keyed(stat, "pgfault").unwrap_or(0),
        major_page_faults: keyed(stat, "pgmajfault").unwrap_or(0),
        hierarchy_page_faults: keyed(stat, "pgfault").unwrap_or(0),
        hierarchy_major_page_faults: keyed(stat, "pgmajfault").unwrap_or(0),
        mapped_file_bytes: keyed(stat, "file_mapped").unwrap_or(0),
        ..MemoryFigures::default()
    })
}

/// A memory figure of a cgroup's spec as cAdvisor reports it: `max`, an unreadable
/// number or one above 2^62 is none, 0.
#[must_use]
pub fn spec_memory(text: &str) -> u64 {
    number(text).filter(|v| *v <= MAX_MEMORY).unwrap_or(0)
}

/// A v1 memory limit: above 2^62 is none (0, as cAdvisor reports it).
#[must_use]
pub fn parse_memory_limit_v1(text: &str) -> Option<u64> {
    number(text).map(|v| if v > MAX_MEMORY { 0 } else { v })
}

/// A v2 memory limit (`memory.max`): `max` is none (0).
#[must_use]
pub fn parse_memory_limit_v2(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => Some(0),
        v => v.parse().ok(),
    }
}

/// v1 quota (`cpu.cfs_quota_us`): -1 is none (0).
#[must_use]
pub fn parse_quota_v1(text: &str) -> u64 {
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|q| u64::try_from(q).ok())
        .unwrap_or(0)
}

/// v2 `cpu.max` (`"max 100000"`, `"50000 100000"`): the quota (0 for none) and period.
#[must_use]
pub fn parse_cpu_max(text: &str) -> (u64, Option<u64>) {
    let mut parts = text.split_whitespace();
    let quota = parts.next().and_then(|q| q.parse().ok()).unwrap_or(0);
    (quota, parts.next().and_then(|p| p.parse().ok()))
}

/// v2 `cpu.weight` as the shares it was made from (runc's conversion reversed, as
/// cAdvisor does).
#[must_use]
pub fn weight_to_shares(weight: u64) -> u64 {
    if weight == 0 {
        return 0;
    }
    // The kernel keeps `cpu.weight` within 1..=10000; a file saying more is read as the
    // most (an overflow before: found by fuzzing).
    2 + (weight.min(10_000) - 1) * 262_142 / 9_999
}

/// Reads cgroups in the host's hierarchies.
#[derive(Debug, Clone)]
pub struct CgroupReader<F> {
    fs: F,
    layout: CgroupLayout,
}

impl<F: CgroupFs> CgroupReader<F> {
    /// A reader of the hierarchies of `layout` through `fs`.
    pub fn new(fs: F, layout: CgroupLayout) -> Self {
        Self { fs, layout }
    }

    fn dir(&self, controller: &str, path: Option<&str>) -> Option<PathBuf> {
        let mount = self.layout.mount_of(controller)?;
        Some(mount.join(path?.trim_start_matches('/')))
    }

    fn read(&self, dir: &Path, file: &str) -> Option<String> {
        self.fs.read(&dir.join(file)).ok()
    }

    /// The cgroup's figures now.
    #[must_use]
    pub fn stats(&self, paths: &CgroupPaths) -> CgroupStats {
        match &self.layout {
            CgroupLayout::V2(_) => self.stats_v2(paths),
            CgroupLayout::V1(_) => self.stats_v1(paths),
        }
    }

    fn stats_v1(&self, paths: &CgroupPaths) -> CgroupStats {
        let mut stats = CgroupStats::default();
        if let Some(dir) = self.dir("cpuacct", paths.cpuacct.as_deref()) {
            stats.cpu = self.read(&dir, "cpuacct.usage").and_then(|usage| {
                parse_cpu_v1(&usage, &self.read(&dir, "cpuacct.stat").unwrap_or_default())
            });
        }
        if let Some(dir) = self.dir("cpu", paths.cpu.as_deref()) {
            stats.throttling = self
                .read(&dir, "cpu.stat")
                .and_then(|s| parse_throttling(&s));
            stats.spec.cpu_shares = self.read(&dir, "cpu.shares").and_then(|s| number(&s));
            stats.spec.cpu_quota = self
                .read(&dir, "cpu.cfs_quota_us")
                .map_or(0, |q| parse_quota_v1(&q));
            stats.spec.cpu_period = self
                .read(&dir, "cpu.cfs_period_us")
                .and_then(|s| number(&s));
        }
        if let Some(dir) = self.dir("memory", paths.memory.as_deref()) {
            stats.memory = self.read(&dir, "memory.usage_in_bytes").and_then(|usage| {
                parse_memory_v1(&usage, &self.read(&dir, "memory.stat").unwrap_or_default())
            });
            if let Some(memory) = &mut stats.memory {
                self.memory_limit_figures_v1(&dir, memory);
            }
            stats.spec.memory_limit = self
                .read(&dir, "memory.limit_in_bytes")
                .and_then(|s| parse_memory_limit_v1(&s));
            let limit = |file| self.read(&dir, file).map_or(0, |s| spec_memory(&s));
            stats.spec.memory_swap_limit = limit("memory.memsw.limit_in_bytes");
            stats.spec.memory_reservation = limit("memory.soft_limit_in_bytes");
        }
        stats
    }

    fn stats_v2(&self, paths: &CgroupPaths) -> CgroupStats {
        let mut stats = CgroupStats::default();
        let Some(dir) = self.dir("", paths.unified.as_deref()) else {
            return stats;
        };
        if let Some(stat) = self.read(&dir, "cpu.stat") {
            stats.cpu = parse_cpu_v2(&stat);
            stats.throttling = parse_throttling(&stat);
        }
        stats.spec.cpu_shares = self
            .read(&dir, "cpu.weight")
            .and_then(|w| number(&w))
            .map(weight_to_shares);
        if let Some(max) = self.read(&dir, "cpu.max") {
            (stats.spec.cpu_quota, stats.spec.cpu_period) = parse_cpu_max(&max);
        }
        let memory_stat = self.read(&dir, "memory.stat");
        stats.memory = self
            .read(&dir, "memory.current")
            .zip(memory_stat)
            .and_then(|(current, stat)| parse_memory_v2(&current, &stat));
        if let Some(memory) = &mut stats.memory {
            self.memory_limit_figures_v2(&dir, memory);
        }
        stats.spec.memory_limit = self
            .read(&dir, "memory.max")
            .and_then(|m| parse_memory_limit_v2(&m));
        let limit = |file| self.read(&dir, file).map_or(0, |s| spec_memory(&s));
        stats.spec.memory_swap_limit = limit("memory.swap.max");
        stats.spec.memory_reservation = limit("memory.high");
        stats
    }

    /// v1: cAdvisor's failures, peak and swap (`memory.failcnt`,
    /// `memory.max_usage_in_bytes`, `memory.memsw.usage_in_bytes` less the usage).
    fn memory_limit_figures_v1(&self, dir: &Path, memory: &mut MemoryFigures) {
        let file = |name| self.read(dir, name).and_then(|s| number(&s));
        memory.failcnt = file("memory.failcnt").unwrap_or(0);
        memory.max_usage_bytes = file("memory.max_usage_in_bytes").unwrap_or(0);
        memory.swap_bytes = file("memory.memsw.usage_in_bytes")
            .map_or(0, |memsw| memsw.saturating_sub(memory.usage_bytes));
    }

    /// v2: the `max` events as failures, `memory.swap.current`; no peak (cAdvisor v0.38
    /// reads none there).
    fn memory_limit_figures_v2(&self, dir: &Path, memory: &mut MemoryFigures) {
        memory.failcnt = self
            .read(dir, "memory.events")
            .and_then(|e| keyed(&e, "max"))
            .unwrap_or(0);
        memory.swap_bytes = self
            .read(dir, "memory.swap.current")
            .and_then(|s| number(&s))
            .unwrap_or(0);
    }

    /// The cgroup's own `cgroup.procs` (v1: in the `cpu` hierarchy, where cAdvisor reads
    /// it).
    #[must_use]
    pub fn procs(&self, paths: &CgroupPaths) -> Option<String> {
        let dir = match &self.layout {
            CgroupLayout::V2(_) => self.dir("", paths.unified.as_deref()),
            CgroupLayout::V1(_) => self.dir("cpu", paths.cpu.as_deref()),
        }?;
        self.read(&dir, "cgroup.procs")
    }

    /// The cgroup's own tasks (threads): v1 `tasks` in the `cpu` hierarchy, v2
    /// `cgroup.threads`.
    #[must_use]
    pub fn tasks(&self, paths: &CgroupPaths) -> Option<String> {
        match &self.layout {
            CgroupLayout::V2(_) => {
                let dir = self.dir("", paths.unified.as_deref())?;
                self.read(&dir, "cgroup.threads")
            }
            CgroupLayout::V1(_) => {
                let dir = self.dir("cpu", paths.cpu.as_deref())?;
                self.read(&dir, "tasks")
            }
        }
    }

    /// Threads in the cgroup and their limit (`pids.current`, `pids.max`; 0 for no limit),
    /// where the pids controller has them (not in the root cgroup).
    #[must_use]
    pub fn threads(&self, paths: &CgroupPaths) -> Option<(u64, u64)> {
        let dir = match &self.layout {
            CgroupLayout::V2(_) => self.dir("", paths.unified.as_deref()),
            CgroupLayout::V1(_) => self.dir("pids", paths.pids.as_deref()),
        }?;
        let current = self.read(&dir, "pids.current").and_then(|s| number(&s))?;
        let max = self
            .read(&dir, "pids.max")
            .and_then(|s| super::process::parse_pids_max(&s))?;
        Some((current, max))
    }

    /// When the cgroup was made, as well as the file system tells (its directory's
    /// modification time, which its control files do not change), in ns since the epoch.
    #[must_use]
    pub fn created_ns(&self, paths: &CgroupPaths) -> Option<i64> {
        let dir = match &self.layout {
            CgroupLayout::V2(_) => self.dir("", paths.unified.as_deref()),
            CgroupLayout::V1(_) => self.dir("cpu", paths.cpu.as_deref()),
        }?;
        let modified = std::fs::metadata(dir).ok()?.modified().ok()?;
        let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
        i64::try_from(since.as_nanos()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::LinuxCgroupFs;

    const V1_MEMORY_STAT: &str = "cache 4096\nrss 8192\npgfault 12\npgmajfault 1\n\
        inactive_file 100\ntotal_cache 70000\ntotal_rss 67108864\n\
        total_pgfault 40\ntotal_pgmajfault 3\n\
        total_inactive_file 20000\ntotal_mapped_file 4096\n";

    #[test]
    fn a_process_cgroups_in_hybrid_and_unified_layouts() {
        let hybrid = "12:pids:/kubepods/besteffort/podu1/abc\n\
            4:cpu,cpuacct:/kubepods/besteffort/podu1/abc\n\
            9:memory:/kubepods/besteffort/podu1/abc\n\
            0::/system.slice/containerd.service\n";
        let paths = CgroupPaths::parse_proc(hybrid).unwrap();
        assert_eq!(paths.cpu.as_deref(), Some("/kubepods/besteffort/podu1/abc"));
        assert_eq!(paths.cpuacct, paths.cpu);
        assert_eq!(paths.memory, paths.cpu);
        assert_eq!(
            paths.unified.as_deref(),
            Some("/system.slice/containerd.service")
        );
        assert_eq!(paths.name(), Some("/kubepods/besteffort/podu1/abc"));
        let v2 = CgroupPaths::parse_proc("0::/kubepods.slice/x.scope\n").unwrap();
        assert_eq!(v2.name(), Some("/kubepods.slice/x.scope"));
        assert_eq!(CgroupPaths::parse_proc("1:name=systemd:/a\n"), None);
    }

    #[test]
    fn v1_cpu_and_memory_figures() {
        let cpu = parse_cpu_v1("123456789\n", "user 150\nsystem 50\n").unwrap();
        assert_eq!(
            cpu,
            CpuUsage {
                total_ns: 123_456_789,
                user_ns: 1_500_000_000,
                system_ns: 500_000_000
            }
        );
        let memory = parse_memory_v1("67200000\n", V1_MEMORY_STAT).unwrap();
        assert_eq!(memory.usage_bytes, 67_200_000);
        assert_eq!(memory.working_set_bytes, 67_180_000);
        assert_eq!(memory.rss_bytes, 67_108_864);
        assert_eq!(memory.cache_bytes, 70_000);
        assert_eq!((memory.page_faults, memory.major_page_faults), (12, 1));
        assert_eq!(
            (
                memory.hierarchy_page_faults,
                memory.hierarchy_major_page_faults
            ),
            (40, 3)
        );
        assert_eq!(spec_memory("9223372036854771712\n"), 0);
        assert_eq!(spec_memory("max\n"), 0);
        assert_eq!(spec_memory("67108864\n"), 67_108_864);
        // More inactive file pages than usage: a working set of zero, not an underflow.
        let small = parse_memory_v1("10", "total_inactive_file 20\n").unwrap();
        assert_eq!(small.working_set_bytes, 0);
        assert_eq!(parse_memory_v1("", V1_MEMORY_STAT), None);
    }

    #[test]
    fn v2_cpu_memory_and_limits() {
        let stat = "usage_usec 2000\nuser_usec 1500\nsystem_usec 500\nnr_periods 10\n\
            nr_throttled 3\nthrottled_usec 7\n";
        assert_eq!(
            parse_cpu_v2(stat),
            Some(CpuUsage {
                total_ns: 2_000_000,
                user_ns: 1_500_000,
                system_ns: 500_000
            })
        );
        assert_eq!(
            parse_throttling(stat),
            Some(Throttling {
                periods: 10,
                throttled_periods: 3,
                throttled_ns: 7000
            })
        );
        let memory =
            parse_memory_v2("5000\n", "anon 3000\nfile 1500\ninactive_file 1000\n").unwrap();
        assert_eq!(
            (
                memory.working_set_bytes,
                memory.rss_bytes,
                memory.cache_bytes
            ),
            (4000, 3000, 1500)
        );
        assert_eq!(parse_memory_limit_v2("max\n"), Some(0));
        assert_eq!(parse_memory_limit_v2("1048576\n"), Some(1_048_576));
        assert_eq!(parse_cpu_max("max 100000\n"), (0, Some(100_000)));
        assert_eq!(parse_cpu_max("50000 100000\n"), (50_000, Some(100_000)));
        // runc writes weight 1 + ((shares - 2) * 9999) / 262142: 1024 shares gave 39,
        // which reads back as 998 (the conversion loses precision both ways).
        assert_eq!(weight_to_shares(39), 998);
        assert_eq!(weight_to_shares(1), 2);
    }

    #[test]
    fn v1_limits_without_a_limit_are_zero() {
        assert_eq!(parse_memory_limit_v1("9223372036854771712\n"), Some(0));
        assert_eq!(parse_memory_limit_v1("134217728\n"), Some(134_217_728));
        assert_eq!(parse_quota_v1("-1\n"), 0);
        assert_eq!(parse_quota_v1("50000\n"), 50_000);
        assert_eq!(
            parse_throttling("nr_periods 5\nnr_throttled 2\nthrottled_time 900\n"),
            Some(Throttling {
                periods: 5,
                throttled_periods: 2,
                throttled_ns: 900
            })
        );
    }

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    #[test]
    fn reads_a_v1_tree_with_cpu_and_cpuacct_in_one_hierarchy() {
        let root = tempfile_dir("v1");
        let cpu = root.join("cpu,cpuacct/kubepods/podu1/c1");
        write(
            &cpu,
            &[
                ("cpuacct.usage", "5000000000\n"),
                ("cpuacct.stat", "user 400\nsystem 100\n"),
                (
                    "cpu.stat",
                    "nr_periods 4\nnr_throttled 1\nthrottled_time 250\n",
                ),
                ("cpu.shares", "512\n"),
                ("cpu.cfs_quota_us", "50000\n"),
                ("cpu.cfs_period_us", "100000\n"),
            ],
        );
        let memory = root.join("memory/kubepods/podu1/c1");
        write(
            &memory,
            &[
                ("memory.usage_in_bytes", "67200000\n"),
                ("memory.stat", V1_MEMORY_STAT),
                ("memory.limit_in_bytes", "134217728\n"),
                ("memory.failcnt", "3\n"),
                ("memory.max_usage_in_bytes", "70000000\n"),
                ("memory.memsw.usage_in_bytes", "67300000\n"),
                ("memory.memsw.limit_in_bytes", "268435456\n"),
                ("memory.soft_limit_in_bytes", "9223372036854771712\n"),
            ],
        );
        let layout = CgroupLayout::V1(vec![
            crate::cm::Hierarchy {
                mount: root.join("cpu,cpuacct"),
                controllers: vec!["cpu".into(), "cpuacct".into()],
            },
            crate::cm::Hierarchy {
                mount: root.join("memory"),
                controllers: vec!["memory".into()],
            },
        ]);
        let reader = CgroupReader::new(LinuxCgroupFs, layout);
        let stats = reader.stats(&CgroupPaths::uniform("/kubepods/podu1/c1"));
        assert_eq!(stats.cpu.unwrap().total_ns, 5_000_000_000);
        assert_eq!(stats.cpu.unwrap().user_ns, 4_000_000_000);
        assert_eq!(stats.throttling.unwrap().throttled_periods, 1);
        assert_eq!(
            stats.spec,
            CgroupSpec {
                cpu_shares: Some(512),
                cpu_quota: 50_000,
                cpu_period: Some(100_000),
                memory_limit: Some(134_217_728),
                memory_swap_limit: 268_435_456,
                memory_reservation: 0,
            }
        );
        let figures = stats.memory.unwrap();
        assert_eq!(figures.working_set_bytes, 67_180_000);
        assert_eq!(
            (
                figures.failcnt,
                figures.max_usage_bytes,
                figures.swap_bytes,
                figures.mapped_file_bytes
            ),
            (3, 70_000_000, 100_000, 4096)
        );
        assert!(
            reader
                .created_ns(&CgroupPaths::uniform("/kubepods/podu1/c1"))
                .is_some()
        );
        // A cgroup that is gone reads as nothing, not as zeros.
        let gone = reader.stats(&CgroupPaths::uniform("/kubepods/podu2"));
        assert_eq!((gone.cpu, gone.memory), (None, None));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn reads_a_v2_tree() {
        let root = tempfile_dir("v2");
        write(
            &root.join("kubepods.slice/pod.slice"),
            &[
                (
                    "cpu.stat",
                    "usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
                ),
                ("cpu.weight", "100\n"),
                ("cpu.max", "max 100000\n"),
                ("memory.current", "1048576\n"),
                (
                    "memory.stat",
                    "anon 524288\nfile 262144\ninactive_file 131072\nfile_mapped 8192\n",
                ),
                ("memory.max", "max\n"),
                ("memory.events", "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n"),
                ("memory.swap.current", "4096\n"),
            ],
        );
        let reader = CgroupReader::new(LinuxCgroupFs, CgroupLayout::V2(root.clone()));
        let stats = reader.stats(&CgroupPaths::uniform("/kubepods.slice/pod.slice"));
        assert_eq!(stats.cpu.unwrap().total_ns, 3_000_000_000);
        let figures = stats.memory.unwrap();
        assert_eq!(figures.working_set_bytes, 1_048_576 - 131_072);
        assert_eq!(
            (
                figures.failcnt,
                figures.max_usage_bytes,
                figures.swap_bytes,
                figures.mapped_file_bytes
            ),
            (7, 0, 4096, 8192)
        );
        assert_eq!(stats.spec.cpu_quota, 0);
        assert_eq!(stats.spec.cpu_period, Some(100_000));
        assert_eq!(stats.spec.memory_limit, Some(0));
        assert_eq!(stats.spec.cpu_shares, Some(weight_to_shares(100)));
        std::fs::remove_dir_all(root).unwrap();
    }

    fn tempfile_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "rkubelet-stats-cgroup-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }
}
