//! The machine the node runs on, as the kubelet learns it from cAdvisor: CPUs, memory,
//! huge pages, filesystem and PID usage, and the identifiers in `nodeInfo`.
//!
//! [`MachineInfo`] is the boundary; [`LinuxMachine`] reads `/proc`, `/sys` and `/etc`, and
//! the tests use a fake. Every method is synchronous and cheap (a few small reads or one
//! `statvfs`); the agent calls them off the async runtime.

use std::path::{Path, PathBuf};

use super::MachineError;

/// Memory as `/proc/meminfo` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `MemTotal`, in bytes.
    pub total_bytes: u64,
    /// `MemAvailable`, in bytes: the kernel's estimate of memory usable without swapping.
    pub available_bytes: u64,
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
    /// Total and available memory.
    ///
    /// # Errors
    /// When the memory figures cannot be read.
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
}

/// [`MachineInfo`] read from a Linux host's `/proc`, `/sys` and `/etc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxMachine;

const CPU_ONLINE: &str = "/sys/devices/system/cpu/online";
const MEMINFO: &str = "/proc/meminfo";
const HUGEPAGES_DIR: &str = "/sys/kernel/mm/hugepages";
const PID_MAX: &str = "/proc/sys/kernel/pid_max";
const LOADAVG: &str = "/proc/loadavg";
const MACHINE_IDS: &[&str] = &["/etc/machine-id", "/var/lib/dbus/machine-id"];
const PRODUCT_UUID: &str = "/sys/class/dmi/id/product_uuid";
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
const OSRELEASE: &str = "/proc/sys/kernel/osrelease";
const OS_RELEASE_FILES: &[&str] = &["/etc/os-release", "/usr/lib/os-release"];

fn read(what: &'static str, path: &str) -> Result<String, MachineError> {
    std::fs::read_to_string(path).map_err(|source| MachineError::Read {
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
        parse_meminfo(&text).map_err(|reason| parse_error("memory", MEMINFO, reason))
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
}

fn non_empty(what: &'static str, path: &str, text: &str) -> Result<String, MachineError> {
    let value = text.trim();
    if value.is_empty() {
        return Err(parse_error(what, path, "empty file"));
    }
    Ok(value.to_owned())
}

/// Counts the CPUs in a kernel CPU list such as `0-3,8,10-11`.
fn parse_cpu_list(text: &str) -> Option<u32> {
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

/// `MemTotal` and `MemAvailable` from `/proc/meminfo`, in bytes.
fn parse_meminfo(text: &str) -> Result<Memory, String> {
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
    Ok(Memory {
        total_bytes: field("MemTotal")?,
        available_bytes: field("MemAvailable")?,
    })
}

/// The page size in bytes of a `/sys/kernel/mm/hugepages` entry such as `hugepages-2048kB`.
fn parse_hugepage_dir(name: &str) -> Option<u64> {
    let kib: u64 = name
        .strip_prefix("hugepages-")?
        .strip_suffix("kB")?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The total task count of `/proc/loadavg` (`0.54 2.52 2.19 2/144 22898` gives 144).
fn parse_loadavg_tasks(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// `PRETTY_NAME` of an os-release file, unquoted.
fn parse_os_release_pretty_name(text: &str) -> Option<String> {
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
                memory: Some(Memory {
                    total_bytes: 24 * GIB,
                    available_bytes: 20 * GIB,
                }),
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
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(m.available_bytes, 23_856_852 * 1024);
        assert!(
            parse_meminfo("MemTotal: 1 kB\n")
                .unwrap_err()
                .contains("MemAvailable")
        );
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
        assert!(mem.total_bytes >= mem.available_bytes && mem.total_bytes > 0);
        let fs = m.fs_stats(Path::new("/no/such/dir/below/root")).unwrap();
        assert!(fs.capacity_bytes >= fs.available_bytes && fs.capacity_bytes > 0);
        let pids = m.pid_usage().unwrap();
        assert!(pids.max >= pids.running && pids.running > 0);
        assert_eq!(m.boot_id().unwrap().len(), 36);
        assert!(!m.kernel_version().unwrap().is_empty());
        m.hugepages().unwrap();
    }
}
