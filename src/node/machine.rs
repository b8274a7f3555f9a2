//! The machine the node runs on, as the kubelet learns it from cAdvisor: CPUs, memory
//! (capacity, and the root memory cgroup's usage and working set), huge pages, filesystem
//! and PID usage, and the identifiers in `nodeInfo`.
//!
//! [`MachineInfo`] is the boundary; [`LinuxMachine`] reads `/proc`, `/sys` and `/etc`, and
//! the tests use a fake. Every method is synchronous and cheap (a few small reads or one
//! `statvfs`); the agent calls them off the async runtime.

use std::path::{Path, PathBuf};

use super::MachineError;

/// The machine's memory: its capacity, and what the root memory cgroup uses of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `MemTotal`, in bytes: the node's memory capacity.
    pub total_bytes: u64,
    /// The root memory cgroup's usage (cAdvisor's root container stats); `None` when it
    /// cannot be read.
    pub usage: Option<MemoryUsage>,
}

/// The root memory cgroup's usage, as cAdvisor reports it for the root container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Memory in use, page cache included (v1 `memory.usage_in_bytes`; v2
    /// `memory.current`, or `MemTotal − MemFree` for the root cgroup, which has none).
    pub usage_bytes: u64,
    /// The working set: the usage less the inactive file pages (`total_inactive_file`
    /// in v1's `memory.stat`, `inactive_file` in v2's), which the kernel reclaims first.
    pub working_set_bytes: u64,
}

impl Memory {
    /// The kubelet's `memory.available`: capacity less the root cgroup's working set
    /// (the summary's node `availableBytes`; `MemAvailable` counts active page cache as
    /// available, the kubelet does not).
    #[must_use]
    pub fn available_bytes(&self) -> Option<u64> {
        self.usage
            .map(|u| self.total_bytes.saturating_sub(u.working_set_bytes))
    }
}

/// One huge page size and how many pages of it the kernel has reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePages {
    /// The page size, in bytes (2 MiB, 1 GiB on amd64).
    pub page_size_bytes: u64,
    /// `nr_hugepages` of that size.
    pub pages: u64,
}

/// Usage of the filesystem holding a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// Total size, in bytes.
    pub capacity_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// Total inodes (0 when the filesystem has no fixed inode table).
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
}

/// Process IDs in use and the most the kernel hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidUsage {
    /// Tasks (threads) that currently hold a PID.
    pub running: u64,
    /// `kernel.pid_max`.
    pub max: u64,
}

/// What the node agent needs to know about its machine.
pub trait MachineInfo: Send + Sync {
    /// Online logical CPUs.
    ///
    /// # Errors
    /// When the CPU list cannot be read.
    fn num_cpus(&self) -> Result<u32, MachineError>;
    /// The memory capacity, and the root memory cgroup's usage when it can be read.
    ///
    /// # Errors
    /// When the capacity cannot be read.
    fn memory(&self) -> Result<Memory, MachineError>;
    /// The huge page sizes the kernel supports, with their reserved pages.
    ///
    /// # Errors
    /// When huge page settings exist but cannot be read.
    fn hugepages(&self) -> Result<Vec<HugePages>, MachineError>;
    /// Usage of the filesystem holding `path`.
    ///
    /// # Errors
    /// When the filesystem cannot be queried.
    fn fs_stats(&self, path: &Path) -> Result<FsStats, MachineError>;
    /// PIDs in use and available.
    ///
    /// # Errors
    /// When the figures cannot be read.
    fn pid_usage(&self) -> Result<PidUsage, MachineError>;
    /// The machine ID (`/etc/machine-id`).
    ///
    /// # Errors
    /// When it cannot be read.
    fn machine_id(&self) -> Result<String, MachineError>;
    /// The hardware UUID from DMI, when the machine has one and it is readable.
    fn system_uuid(&self) -> Option<String>;
    /// The ID of the current boot, new at every reboot.
    ///
    /// # Errors
    /// When it cannot be read.
    fn boot_id(&self) -> Result<String, MachineError>;
    /// The kernel release (`uname -r`).
    ///
    /// # Errors
    /// When it cannot be read.
    fn kernel_version(&self) -> Result<String, MachineError>;
    /// The operating system's `PRETTY_NAME` from `os-release`.
    ///
    /// # Errors
    /// When it cannot be read.
    fn os_image(&self) -> Result<String, MachineError>;
    /// Physical cores and sockets (cAdvisor's `machine_cpu_physical_cores` and
    /// `machine_cpu_sockets`, from `/proc/cpuinfo`).
    ///
    /// # Errors
    /// When it cannot be read.
    fn cpu_topology(&self) -> Result<CpuTopology, MachineError>;
}

/// Physical cores and sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTopology {
    /// Distinct (socket, core) pairs.
    pub physical_cores: u32,
    /// Distinct sockets.
    pub sockets: u32,
}

/// The topology in `/proc/cpuinfo` text, as cAdvisor counts it: distinct `physical id`s
/// are sockets, distinct (`physical id`, `core id`) pairs cores; a processor without them
/// (some virtual machines) counts as its own core on socket 0.
#[must_use]
pub fn parse_cpu_topology(cpuinfo: &str) -> Option<CpuTopology> {
    let mut cores = std::collections::BTreeSet::new();
    let mut sockets = std::collections::BTreeSet::new();
    for block in cpuinfo.split("\n\n").filter(|b| b.contains("processor")) {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_owned())
            })
        };
        let socket = field("physical id").unwrap_or_else(|| "0".into());
        let core = field("core id").or_else(|| field("processor"))?;
        sockets.insert(socket.clone());
        cores.insert((socket, core));
    }
    Some(CpuTopology {
        physical_cores: u32::try_from(cores.len()).ok().filter(|n| *n > 0)?,
        sockets: u32::try_from(sockets.len()).ok()?,
    })
}

/// [`MachineInfo`] read from a Linux host's `/proc`, `/sys` and `/etc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxMachine;

const CPU_ONLINE: &str = "/sys/devices/system/cpu/online";
const MEMINFO: &str = "/proc/meminfo";
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const HUGEPAGES_DIR: &str = "/sys/kernel/mm/hugepages";
const PID_MAX: &str = "/proc/sys/kernel/pid_max";
const LOADAVG: &str = "/proc/loadavg";
const MACHINE_IDS: &[&str] = &["/etc/machine-id", "/var/lib/dbus/machine-id"];
const PRODUCT_UUID: &str = "/sys/class/dmi/id/product_uuid";
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
const OSRELEASE: &str = "/proc/sys/kernel/osrelease";
const CPUINFO: &str = "/proc/cpuinfo";
const OS_RELEASE_FILES: &[&str] = &["/etc/os-release", "/usr/lib/os-release"];

fn read(what: &'static str, path: &str) -> Result<String, MachineError> {
    crate::procfs::read_pseudo_file(Path::new(path)).map_err(|source| MachineError::Read {
        what,
        path: path.into(),
        source,
    })
}

fn parse_error(what: &'static str, path: &str, reason: impl Into<String>) -> MachineError {
    MachineError::Parse {
        what,
        path: path.into(),
        reason: reason.into(),
    }
}

fn first_readable(
    what: &'static str,
    paths: &[&'static str],
) -> Result<(String, &'static str), MachineError> {
    let mut last = None;
    for &path in paths {
        match read(what, path) {
            Ok(text) => return Ok((text, path)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| parse_error(what, "", "no file to read")))
}

impl MachineInfo for LinuxMachine {
    fn num_cpus(&self) -> Result<u32, MachineError> {
        let text = read("online CPUs", CPU_ONLINE)?;
        parse_cpu_list(&text).ok_or_else(|| {
            parse_error(
                "online CPUs",
                CPU_ONLINE,
                format!("bad CPU list {:?}", text.trim()),
            )
        })
    }

    fn memory(&self) -> Result<Memory, MachineError> {
        let text = read("memory", MEMINFO)?;
        let info = parse_meminfo(&text).map_err(|reason| parse_error("memory", MEMINFO, reason))?;
        let usage = root_memory_usage(Path::new(CGROUP_ROOT), &info)
            .inspect_err(|e| tracing::warn!(error = %e, "root memory cgroup usage unavailable"))
            .ok();
        Ok(Memory {
            total_bytes: info.total_bytes,
            usage,
        })
    }

    fn hugepages(&self) -> Result<Vec<HugePages>, MachineError> {
        let entries = match std::fs::read_dir(HUGEPAGES_DIR) {
            Ok(entries) => entries,
            // A kernel without huge page support.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(MachineError::Read {
                    what: "huge pages",
                    path: HUGEPAGES_DIR.into(),
                    source,
                });
            }
        };
        let mut sizes = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(page_size_bytes) = name.to_str().and_then(parse_hugepage_dir) else {
                continue;
            };
            let path = entry.path().join("nr_hugepages");
            let text = std::fs::read_to_string(&path).map_err(|source| MachineError::Read {
                what: "huge pages",
                path: path.clone(),
                source,
            })?;
            let pages = text.trim().parse().map_err(|_| MachineError::Parse {
                what: "huge pages",
                path,
                reason: format!("bad page count {:?}", text.trim()),
            })?;
            sizes.push(HugePages {
                page_size_bytes,
                pages,
            });
        }
        sizes.sort_by_key(|h| h.page_size_bytes);
        Ok(sizes)
    }

    /// Stats of the filesystem holding `path`, or its nearest existing ancestor: the
    /// agent's root directory may not exist before the first pod.
    fn fs_stats(&self, path: &Path) -> Result<FsStats, MachineError> {
        let existing = path
            .ancestors()
            .find(|p| p.exists())
            .unwrap_or_else(|| Path::new("/"));
        let st = nix::sys::statvfs::statvfs(existing).map_err(|source| MachineError::Statvfs {
            path: PathBuf::from(existing),
            source,
        })?;
        let fragment = st.fragment_size();
        Ok(FsStats {
            capacity_bytes: st.blocks().saturating_mul(fragment),
            available_bytes: st.blocks_available().saturating_mul(fragment),
            inodes: st.files(),
            inodes_free: st.files_free(),
        })
    }

    fn pid_usage(&self) -> Result<PidUsage, MachineError> {
        let max_text = read("PID limit", PID_MAX)?;
        let max = max_text.trim().parse().map_err(|_| {
            parse_error(
                "PID limit",
                PID_MAX,
                format!("bad pid_max {:?}", max_text.trim()),
            )
        })?;
        let load = read("running tasks", LOADAVG)?;
        let running = parse_loadavg_tasks(&load).ok_or_else(|| {
            parse_error(
                "running tasks",
                LOADAVG,
                format!("bad loadavg {:?}", load.trim()),
            )
        })?;
        Ok(PidUsage { running, max })
    }

    fn machine_id(&self) -> Result<String, MachineError> {
        let (text, path) = first_readable("machine ID", MACHINE_IDS)?;
        non_empty("machine ID", path, &text)
    }

    fn system_uuid(&self) -> Option<String> {
        let text = std::fs::read_to_string(PRODUCT_UUID).ok()?;
        let uuid = text.trim();
        (!uuid.is_empty()).then(|| uuid.to_owned())
    }

    fn boot_id(&self) -> Result<String, MachineError> {
        non_empty("boot ID", BOOT_ID, &read("boot ID", BOOT_ID)?)
    }

    fn kernel_version(&self) -> Result<String, MachineError> {
        non_empty(
            "kernel version",
            OSRELEASE,
            &read("kernel version", OSRELEASE)?,
        )
    }

    fn os_image(&self) -> Result<String, MachineError> {
        let (text, path) = first_readable("OS image", OS_RELEASE_FILES)?;
        parse_os_release_pretty_name(&text)
            .ok_or_else(|| parse_error("OS image", path, "no PRETTY_NAME"))
    }

    fn cpu_topology(&self) -> Result<CpuTopology, MachineError> {
        let text = read("CPU topology", CPUINFO)?;
        parse_cpu_topology(&text)
            .ok_or_else(|| parse_error("CPU topology", CPUINFO, "no processor"))
    }
}

fn non_empty(what: &'static str, path: &str, text: &str) -> Result<String, MachineError> {
    let value = text.trim();
    if value.is_empty() {
        return Err(parse_error(what, path, "empty file"));
    }
    Ok(value.to_owned())
}

/// Counts the CPUs in a kernel CPU list such as `0-3,8,10-11`.
pub(crate) fn parse_cpu_list(text: &str) -> Option<u32> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut count = 0u32;
    for part in text.split(',') {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let cpu = part.parse::<u32>().ok()?;
                (cpu, cpu)
            }
        };
        count = count.checked_add(last.checked_sub(first)?.checked_add(1)?)?;
    }
    Some(count)
}

/// The figures of `/proc/meminfo` the memory readings use, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemInfo {
    /// `MemTotal`.
    total_bytes: u64,
    /// `MemFree`.
    free_bytes: u64,
}

/// `MemTotal` and `MemFree` from `/proc/meminfo`, in bytes.
pub(crate) fn parse_meminfo(text: &str) -> Result<MemInfo, String> {
    let field = |name: &str| -> Result<u64, String> {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .ok_or_else(|| format!("no {name} line"))?;
        let kib = line
            .trim()
            .strip_suffix("kB")
            .map(str::trim)
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| format!("bad {name} value {:?}", line.trim()))?;
        Ok(kib.saturating_mul(1024))
    };
    Ok(MemInfo {
        total_bytes: field("MemTotal")?,
        free_bytes: field("MemFree")?,
    })
}

/// The number a cgroup file holds.
fn read_cgroup_number(path: &Path) -> Result<u64, MachineError> {
    let text = crate::procfs::read_pseudo_file(path).map_err(|source| MachineError::Read {
        what: "memory cgroup",
        path: path.to_owned(),
        source,
    })?;
    text.trim().parse().map_err(|_| MachineError::Parse {
        what: "memory cgroup",
        path: path.to_owned(),
        reason: format!("bad number {:?}", text.trim()),
    })
}

/// The value of `key` in a `memory.stat` file.
fn read_memory_stat(path: &Path, key: &str) -> Result<u64, MachineError> {
    let text = crate::procfs::read_pseudo_file(path).map_err(|source| MachineError::Read {
        what: "memory cgroup",
        path: path.to_owned(),
        source,
    })?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .ok_or_else(|| MachineError::Parse {
            what: "memory cgroup",
            path: path.to_owned(),
            reason: format!("no {key} line"),
        })
}

/// The root memory cgroup's usage and working set under the cgroup mount `root`, as
/// cAdvisor computes them for its root container: the working set is the usage less the
/// inactive file pages (zero when those exceed it). Cgroup v1 (also the hybrid layout):
/// `memory/memory.usage_in_bytes` and `total_inactive_file`; v2: `memory.current` (the
/// root cgroup has none: `MemTotal − MemFree`, as runc reads the root) and
/// `inactive_file`.
fn root_memory_usage(root: &Path, meminfo: &MemInfo) -> Result<MemoryUsage, MachineError> {
    let v1 = root.join("memory");
    let (usage_bytes, inactive_file) = if v1.join("memory.usage_in_bytes").exists() {
        (
            read_cgroup_number(&v1.join("memory.usage_in_bytes"))?,
            read_memory_stat(&v1.join("memory.stat"), "total_inactive_file")?,
        )
    } else {
        let current = root.join("memory.current");
        let usage = if current.exists() {
            read_cgroup_number(&current)?
        } else {
            meminfo.total_bytes.saturating_sub(meminfo.free_bytes)
        };
        (
            usage,
            read_memory_stat(&root.join("memory.stat"), "inactive_file")?,
        )
    };
    Ok(MemoryUsage {
        usage_bytes,
        working_set_bytes: usage_bytes.saturating_sub(inactive_file),
    })
}

/// The page size in bytes of a `/sys/kernel/mm/hugepages` entry such as `hugepages-2048kB`.
pub(crate) fn parse_hugepage_dir(name: &str) -> Option<u64> {
    let kib: u64 = name
        .strip_prefix("hugepages-")?
        .strip_suffix("kB")?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The total task count of `/proc/loadavg` (`0.54 2.52 2.19 2/144 22898` gives 144).
pub(crate) fn parse_loadavg_tasks(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// `PRETTY_NAME` of an os-release file, unquoted.
pub(crate) fn parse_os_release_pretty_name(text: &str) -> Option<String> {
    let value = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("PRETTY_NAME="))?
        .trim();
    let unquoted = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
        .unwrap_or(value);
    Some(unquoted.replace("\\\"", "\"")).filter(|s| !s.is_empty())
}

#[cfg(test)]
pub(crate) mod fake {
    //! A [`MachineInfo`] whose every figure the test sets.

    use std::path::Path;
    use std::sync::Mutex;

    use super::*;

    /// The figures [`FakeMachine`] reports; `None` makes the method fail.
    #[derive(Debug, Clone)]
    pub struct Figures {
        pub cpus: Option<u32>,
        pub memory: Option<Memory>,
        pub hugepages: Vec<HugePages>,
        pub fs: Option<FsStats>,
        pub pids: Option<PidUsage>,
        pub boot_id: String,
    }

    /// A machine of 2 CPUs, 24 GiB, a 100 GiB root filesystem, no pressure at all.
    #[derive(Debug)]
    pub struct FakeMachine(pub Mutex<Figures>);

    pub const GIB: u64 = 1 << 30;
    pub const MIB: u64 = 1 << 20;

    impl Default for FakeMachine {
        fn default() -> Self {
            Self(Mutex::new(Figures {
                cpus: Some(2),
                memory: Some(memory(24 * GIB, 20 * GIB)),
                hugepages: vec![
                    HugePages {
                        page_size_bytes: 2 * MIB,
                        pages: 0,
                    },
                    HugePages {
                        page_size_bytes: GIB,
                        pages: 0,
                    },
                ],
                fs: Some(FsStats {
                    capacity_bytes: 100 * GIB,
                    available_bytes: 60 * GIB,
                    inodes: 1_000_000,
                    inodes_free: 900_000,
                }),
                pids: Some(PidUsage {
                    running: 150,
                    max: 32768,
                }),
                boot_id: "boot-1".into(),
            }))
        }
    }

    /// `total` bytes of memory of which `available` are available (the working set is the
    /// rest; 2 GiB of inactive page cache on top of it).
    pub fn memory(total: u64, available: u64) -> Memory {
        let working_set_bytes = total - available;
        Memory {
            total_bytes: total,
            usage: Some(MemoryUsage {
                usage_bytes: working_set_bytes + 2 * GIB,
                working_set_bytes,
            }),
        }
    }

    impl FakeMachine {
        pub fn set(&self, change: impl FnOnce(&mut Figures)) {
            change(&mut self.0.lock().unwrap());
        }

        fn get<T>(&self, pick: impl FnOnce(&Figures) -> Option<T>) -> Result<T, MachineError> {
            pick(&self.0.lock().unwrap()).ok_or_else(|| MachineError::Parse {
                what: "fake",
                path: "/fake".into(),
                reason: "unavailable".into(),
            })
        }
    }

    impl MachineInfo for FakeMachine {
        fn num_cpus(&self) -> Result<u32, MachineError> {
            self.get(|f| f.cpus)
        }
        fn memory(&self) -> Result<Memory, MachineError> {
            self.get(|f| f.memory)
        }
        fn hugepages(&self) -> Result<Vec<HugePages>, MachineError> {
            self.get(|f| Some(f.hugepages.clone()))
        }
        fn fs_stats(&self, _path: &Path) -> Result<FsStats, MachineError> {
            self.get(|f| f.fs)
        }
        fn pid_usage(&self) -> Result<PidUsage, MachineError> {
            self.get(|f| f.pids)
        }
        fn machine_id(&self) -> Result<String, MachineError> {
            Ok("machine-1".into())
        }
        fn system_uuid(&self) -> Option<String> {
            None
        }
        fn boot_id(&self) -> Result<String, MachineError> {
            self.get(|f| Some(f.boot_id.clone()))
        }
        fn kernel_version(&self) -> Result<String, MachineError> {
            Ok("6.1.0-test".into())
        }
        fn os_image(&self) -> Result<String, MachineError> {
            Ok("Debian GNU/Linux 12 (bookworm)".into())
        }
        fn cpu_topology(&self) -> Result<CpuTopology, MachineError> {
            Ok(CpuTopology {
                physical_cores: 1,
                sockets: 1,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_topology_counts_sockets_and_cores_as_cadvisor() {
        let two_threads_per_core = "processor\t: 0\nphysical id\t: 0\ncore id\t: 0\n\n\
            processor\t: 1\nphysical id\t: 0\ncore id\t: 0\n\n\
            processor\t: 2\nphysical id\t: 1\ncore id\t: 0\n\n\
            processor\t: 3\nphysical id\t: 1\ncore id\t: 1\n";
        assert_eq!(
            parse_cpu_topology(two_threads_per_core),
            Some(CpuTopology {
                physical_cores: 3,
                sockets: 2
            })
        );
        // No topology lines: each processor a core of socket 0.
        assert_eq!(
            parse_cpu_topology("processor\t: 0\n\nprocessor\t: 1\n"),
            Some(CpuTopology {
                physical_cores: 2,
                sockets: 1
            })
        );
        assert_eq!(parse_cpu_topology(""), None);
    }

    use super::*;

    #[test]
    fn counts_cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn reads_meminfo_in_bytes() {
        let text = "MemTotal:       24684092 kB\nMemFree:        21419108 kB\n\
                    MemAvailable:   23856852 kB\n";
        let m = parse_meminfo(text).unwrap();
        assert_eq!(m.total_bytes, 24_684_092 * 1024);
        assert_eq!(m.free_bytes, 21_419_108 * 1024);
        assert!(
            parse_meminfo("MemTotal: 1 kB\n")
                .unwrap_err()
                .contains("MemFree")
        );
    }

    const GIB: u64 = 1 << 30;

    /// A cgroup mount made of `files` (path, content) under a fresh directory.
    fn cgroup_mount(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("rk-memcg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, content) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        root
    }

    /// 24 GiB, 10 GiB of them free.
    const MEMINFO: MemInfo = MemInfo {
        total_bytes: 24 * GIB,
        free_bytes: 10 * GIB,
    };

    #[test]
    fn memory_available_is_capacity_less_the_root_cgroup_working_set_in_v1() {
        // 9 GiB in use, 6 GiB of it inactive page cache: 3 GiB working set.
        let root = cgroup_mount(
            "v1",
            &[
                ("memory/memory.usage_in_bytes", &format!("{}\n", 9 * GIB)),
                (
                    "memory/memory.stat",
                    &format!(
                        "cache 40960\ninactive_file 4096\ntotal_cache {}\ntotal_inactive_file {}\n",
                        7 * GIB,
                        6 * GIB
                    ),
                ),
                // v2 files of a hybrid layout are not the memory controller's.
                ("memory.stat", "inactive_file 1\n"),
            ],
        );
        let usage = root_memory_usage(&root, &MEMINFO).unwrap();
        assert_eq!(
            usage,
            MemoryUsage {
                usage_bytes: 9 * GIB,
                working_set_bytes: 3 * GIB
            }
        );
        let memory = Memory {
            total_bytes: MEMINFO.total_bytes,
            usage: Some(usage),
        };
        assert_eq!(memory.available_bytes(), Some(21 * GIB));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn memory_available_in_v2_and_for_a_root_without_memory_current() {
        let stat = format!(
            "anon {}\nfile {}\ninactive_file {}\n",
            GIB,
            8 * GIB,
            5 * GIB
        );
        let root = cgroup_mount(
            "v2",
            &[
                ("memory.stat", &stat),
                ("memory.current", &format!("{}\n", 12 * GIB)),
            ],
        );
        let usage = root_memory_usage(&root, &MEMINFO).unwrap();
        assert_eq!(usage.working_set_bytes, 7 * GIB);
        std::fs::remove_file(root.join("memory.current")).unwrap();
        // The root cgroup of a v2 host: MemTotal − MemFree = 14 GiB in use.
        let usage = root_memory_usage(&root, &MEMINFO).unwrap();
        assert_eq!(
            usage,
            MemoryUsage {
                usage_bytes: 14 * GIB,
                working_set_bytes: 9 * GIB
            }
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn unreadable_or_odd_memory_cgroups_give_no_usage_and_never_a_negative_working_set() {
        let root = cgroup_mount(
            "odd",
            &[
                ("memory/memory.usage_in_bytes", "100\n"),
                ("memory/memory.stat", "total_inactive_file 400\n"),
            ],
        );
        assert_eq!(
            root_memory_usage(&root, &MEMINFO)
                .unwrap()
                .working_set_bytes,
            0
        );
        std::fs::write(root.join("memory/memory.stat"), "cache 1\n").unwrap();
        let err = root_memory_usage(&root, &MEMINFO).unwrap_err();
        assert!(err.to_string().contains("total_inactive_file"), "{err}");
        std::fs::write(root.join("memory/memory.usage_in_bytes"), "max\n").unwrap();
        assert!(root_memory_usage(&root, &MEMINFO).is_err());
        // No memory controller at all.
        let empty = cgroup_mount("none", &[("cgroup.procs", "1\n")]);
        assert!(root_memory_usage(&empty, &MEMINFO).is_err());
        assert_eq!(
            Memory {
                total_bytes: 1,
                usage: None
            }
            .available_bytes(),
            None
        );
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::remove_dir_all(&empty).unwrap();
    }

    #[test]
    fn reads_hugepage_sizes_tasks_and_os_names() {
        assert_eq!(parse_hugepage_dir("hugepages-2048kB"), Some(2 << 20));
        assert_eq!(parse_hugepage_dir("hugepages-1048576kB"), Some(1 << 30));
        assert_eq!(parse_hugepage_dir("other"), None);
        assert_eq!(
            parse_loadavg_tasks("0.54 2.52 2.19 2/144 22898\n"),
            Some(144)
        );
        assert_eq!(parse_loadavg_tasks("0.54"), None);
        let os = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n";
        assert_eq!(
            parse_os_release_pretty_name(os).as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(
            parse_os_release_pretty_name("PRETTY_NAME=Alpine").as_deref(),
            Some("Alpine")
        );
        assert_eq!(parse_os_release_pretty_name("NAME=x"), None);
    }

    /// Reads this machine (Linux, no root needed): every fact is present and sane.
    #[test]
    fn reads_this_linux_machine() {
        let m = LinuxMachine;
        assert!(m.num_cpus().unwrap() >= 1);
        let mem = m.memory().unwrap();
        let available = mem
            .available_bytes()
            .expect("the root memory cgroup is readable");
        assert!(mem.total_bytes >= available && mem.total_bytes > 0);
        let fs = m.fs_stats(Path::new("/no/such/dir/below/root")).unwrap();
        assert!(fs.capacity_bytes >= fs.available_bytes && fs.capacity_bytes > 0);
        let pids = m.pid_usage().unwrap();
        assert!(pids.max >= pids.running && pids.running > 0);
        assert_eq!(m.boot_id().unwrap().len(), 36);
        assert!(!m.kernel_version().unwrap().is_empty());
        m.hugepages().unwrap();
    }
}
