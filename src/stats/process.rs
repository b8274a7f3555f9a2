//! A cgroup's processes as cAdvisor counts them for its process series
//! (`container_processes`, `_file_descriptors`, `_sockets`, `_threads`, `_threads_max`,
//! `_ulimits_soft`): the processes of the cgroup itself (its `cgroup.procs`, not its
//! children's), their open file descriptors and the sockets among them (`/proc/<pid>/fd`),
//! the threads and their limit (the pids controller's `pids.current` and `pids.max`, read
//! by [`super::cgroup::CgroupReader::threads`]), and the soft limit of open files of a
//! container's first process (`/proc/<pid>/limits`). Also its tasks by state
//! (`container_tasks_state`), as the kernel's cgroupstats counts the cgroup's own tasks for
//! cAdvisor's load reader: running (`R`), sleeping (`S`), uninterruptible (`D`), stopped
//! (`T`), from each task's `/proc/<tid>/stat`; and the load average over 10 s that reader
//! keeps from them ([`LoadAverages`]). Parsing is pure; [`read`] reads.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

/// The load average's time constant (`container_cpu_load_average_10s`).
const LOAD_WINDOW_S: f64 = 10.0;

/// A cgroup's process figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessFigures {
    /// Processes in the cgroup itself.
    pub processes: u64,
    /// Their open file descriptors.
    pub fds: u64,
    /// The sockets among them.
    pub sockets: u64,
    /// Threads in the cgroup and below (`pids.current`; 0 where it is not read).
    pub threads: u64,
    /// The limit of threads (`pids.max`; 0 for none, as cAdvisor writes it).
    pub threads_max: u64,
    /// The soft limit of open files of the container's first process (-1: unlimited), for
    /// a sandbox or container.
    pub max_open_files: Option<i64>,
    /// Its own tasks by state.
    pub tasks: TaskStates,
    /// Its load average over 10 s in thousandths of a task, as cAdvisor writes it
    /// ([`LoadAverages`]).
    pub load_average_milli: i64,
}

/// Tasks (threads) by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskStates {
    /// Running or runnable (`R`).
    pub running: u64,
    /// Sleeping, interruptibly (`S`).
    pub sleeping: u64,
    /// Stopped (`T`).
    pub stopped: u64,
    /// In uninterruptible sleep (`D`).
    pub uninterruptible: u64,
    /// Waiting for I/O: the kernel's `in_iowait` of a task in none of those states, which
    /// no `/proc` file shows; 0.
    pub io_wait: u64,
}

impl TaskStates {
    /// Counts a task whose `/proc/<tid>/stat` is `stat`.
    pub fn count(&mut self, stat: &str) {
        // The state follows the command's closing parenthesis.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        match state {
            Some("R") => self.running += 1,
            Some("S") => self.sleeping += 1,
            Some("D") => self.uninterruptible += 1,
            Some("T") => self.stopped += 1,
            _ => {}
        }
    }
}

/// Each cgroup's load average, kept across readings as cAdvisor's load reader keeps it:
/// the running and uninterruptible tasks of each reading, decayed exponentially over 10 s
/// by the time since the one before (the first reading's count as it is).
#[derive(Debug, Default)]
pub struct LoadAverages(Mutex<HashMap<String, (f64, i64)>>);

impl LoadAverages {
    /// Sets the load average of each of `figures` (by cgroup ID) read at `at_ns`; cgroups
    /// not among them are forgotten.
    pub fn update<'a>(
        &self,
        figures: impl Iterator<Item = (&'a str, &'a mut ProcessFigures)>,
        at_ns: i64,
    ) {
        let mut loads = crate::lock::lock(&self.0);
        let mut seen = HashMap::with_capacity(loads.len());
        for (id, p) in figures {
            let now = (p.tasks.running + p.tasks.uninterruptible) as f64;
            let average = match loads.get(id) {
                Some((before, then)) => {
                    #[allow(clippy::cast_precision_loss)] // ns between two readings
                    let elapsed_s = (at_ns - then).max(0) as f64 / 1e9;
                    let decay = (-elapsed_s / LOAD_WINDOW_S).exp();
                    before * decay + now * (1.0 - decay)
                }
                None => now,
            };
            #[allow(clippy::cast_possible_truncation)] // thousandths of a few tasks
            {
                p.load_average_milli = (average * 1000.0) as i64;
            }
            seen.insert(id.to_owned(), (average, at_ns));
        }
        *loads = seen;
    }
}

/// The PIDs of a `cgroup.procs` file.
#[must_use]
pub fn parse_procs(text: &str) -> Vec<u32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// A `pids.max` file: its number, 0 for `max` (no limit), as cAdvisor reports it.
#[must_use]
pub fn parse_pids_max(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => Some(0),
        n => n.parse().ok(),
    }
}

/// The soft `Max open files` of a `/proc/<pid>/limits` file: -1 for `unlimited`.
#[must_use]
pub fn parse_max_open_files(limits: &str) -> Option<i64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    if soft == "unlimited" {
        Some(-1)
    } else {
        soft.parse().ok()
    }
}

/// Open file descriptors of `pids` and the sockets among them, read under `proc`; a
/// process gone meanwhile counts none, as in cAdvisor.
#[must_use]
pub fn count_fds(proc: &Path, pids: &[u32]) -> (u64, u64) {
    let (mut fds, mut sockets) = (0, 0);
    for pid in pids {
        let Ok(entries) = std::fs::read_dir(proc.join(pid.to_string()).join("fd")) else {
            continue;
        };
        for entry in entries.flatten() {
            fds += 1;
            if std::fs::read_link(entry.path()).is_ok_and(|target| {
                target
                    .as_os_str()
                    .as_encoded_bytes()
                    .starts_with(b"socket:")
            }) {
                sockets += 1;
            }
        }
    }
    (fds, sockets)
}

/// The states of the tasks `tids`, read under `proc`; a task gone meanwhile is not counted.
#[must_use]
pub fn task_states(proc: &Path, tids: &[u32]) -> TaskStates {
    let mut states = TaskStates::default();
    for tid in tids {
        if let Ok(stat) = crate::procfs::read_pseudo_file(&proc.join(tid.to_string()).join("stat"))
        {
            states.count(&stat);
        }
    }
    states
}

/// The figures of the processes `procs` (a `cgroup.procs` file's text) read under `proc`,
/// with the open-files limit of `root_pid` where given.
#[must_use]
pub fn read(proc: &Path, procs: &str, root_pid: Option<u32>) -> ProcessFigures {
    let pids = parse_procs(procs);
    let (fds, sockets) = count_fds(proc, &pids);
    let max_open_files = root_pid.and_then(|pid| {
        crate::procfs::read_pseudo_file(&proc.join(pid.to_string()).join("limits"))
            .ok()
            .and_then(|l| parse_max_open_files(&l))
    });
    ProcessFigures {
        processes: pids.len() as u64,
        fds,
        sockets,
        max_open_files,
        ..ProcessFigures::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procs_limits_and_pids_max() {
        assert_eq!(parse_procs("22\n1223\n"), [22, 1223]);
        assert_eq!(parse_procs(""), Vec::<u32>::new());
        assert_eq!(parse_pids_max("max\n"), Some(0));
        assert_eq!(parse_pids_max("4096\n"), Some(4096));
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
            Max cpu time              unlimited            unlimited            seconds   \n\
            Max open files            1048576              1048576              files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1_048_576));
        assert_eq!(
            parse_max_open_files(&limits.replace("1048576 ", "unlimited")),
            Some(-1)
        );
        assert_eq!(parse_max_open_files("Max cpu time 1 1 seconds\n"), None);
    }

    #[test]
    fn task_states_as_cgroupstats_counts_them() {
        let mut states = TaskStates::default();
        for stat in [
            "1 (sh) S 0 1",
            "2 (a) b) R 1 2",
            "3 (x) D 1",
            "4 (y) T 1",
            "5 (z) I 2",
            "6 (w) t 1",
        ] {
            states.count(stat);
        }
        assert_eq!(
            states,
            TaskStates {
                running: 1,
                sleeping: 1,
                stopped: 1,
                uninterruptible: 1,
                io_wait: 0
            }
        );
        let me = task_states(Path::new("/proc"), &[std::process::id()]);
        assert_eq!(me.running + me.sleeping, 1, "{me:?}");
    }

    #[test]
    fn load_averages_decay_over_10_s_as_cadvisors() {
        let loads = LoadAverages::default();
        let busy = |running| ProcessFigures {
            tasks: TaskStates {
                running,
                uninterruptible: 1,
                ..TaskStates::default()
            },
            ..ProcessFigures::default()
        };
        let (mut a, mut b) = (busy(1), busy(0));
        loads.update([("/a", &mut a), ("/b", &mut b)].into_iter(), 0);
        assert_eq!((a.load_average_milli, b.load_average_milli), (2000, 1000));
        // 10 s later with no task left: 2 × e^-1.
        let mut idle = ProcessFigures::default();
        loads.update([("/a", &mut idle)].into_iter(), 10_000_000_000);
        assert_eq!(idle.load_average_milli, 735);
        // "/b" was forgotten: it starts again from its count.
        let mut again = busy(2);
        loads.update([("/b", &mut again)].into_iter(), 20_000_000_000);
        assert_eq!(again.load_average_milli, 3000);
    }

    #[test]
    fn this_process_fds_and_sockets() {
        let me = std::process::id();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (fds, sockets) = count_fds(Path::new("/proc"), &[me]);
        assert!(sockets >= 1, "{sockets} sockets");
        assert!(fds > sockets, "{fds} fds, {sockets} sockets");
        drop(listener);
        let figures = read(Path::new("/proc"), &format!("{me}\n0\n"), Some(me));
        assert_eq!(figures.processes, 2);
        assert!(figures.fds >= fds - 1, "{figures:?}");
        assert!(figures.max_open_files.is_some(), "{figures:?}");
    }
}
