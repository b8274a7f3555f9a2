//! What the bench reads from `/proc`: a process's resident memory and CPU seconds (one
//! sample, or over a window), some processes' CPU seconds since a start, and the machine's
//! busy and total CPU time. It knows no scenario, no API server and no CRI.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

/// Resident set size (kB) and CPU seconds (user + system) of a process.
pub fn sample(pid: u32) -> anyhow::Result<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    Ok((rss, cpu_seconds(&stat).context("stat: utime/stime")?))
}

/// CPU seconds (user + system) from a `stat` file of `/proc`.
fn cpu_seconds(stat: &str) -> Option<f64> {
    // Fields after the command name, which is in parentheses and may hold spaces.
    let (_, after) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // The kernel's USER_HZ is 100 on Linux.
    #[allow(clippy::cast_precision_loss)]
    Some(ticks as f64 / 100.0)
}

/// The agent's process and the window it is measured over, for the scenarios that
/// measure it while their pods run.
#[derive(Debug, clap::Args)]
pub struct AgentWindow {
    /// The agent's process.
    #[arg(long)]
    pub pid: u32,
    /// The window, in seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
}

/// Resident memory (max and mean, in whole MB rounded down) and CPU seconds (user +
/// system) of a process over a window of `seconds`, sampled every second.
pub async fn footprint_over(pid: u32, seconds: u64) -> anyhow::Result<Value> {
    let (_, cpu_start) = sample(pid)?;
    let mut rss_max = 0;
    let mut rss_sum = 0;
    let mut n = 0;
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        let (rss, _) = sample(pid)?;
        rss_max = rss_max.max(rss);
        rss_sum += rss;
        n += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (_, cpu_end) = sample(pid)?;
    Ok(json!({
        "seconds": seconds,
        "rss_max_mb": rss_max / 1024, "rss_mean_mb": rss_sum / n.max(1) / 1024,
        "cpu_seconds": hundredths(cpu_end - cpu_start),
    }))
}

/// Busy and total jiffies of all CPUs, from the first line of /proc/stat.
pub fn cpu_jiffies() -> anyhow::Result<(u64, u64)> {
    jiffies_of(&std::fs::read_to_string("/proc/stat")?)
}

/// Busy and total jiffies of all CPUs, from the text of /proc/stat.
fn jiffies_of(stat: &str) -> anyhow::Result<(u64, u64)> {
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .context("/proc/stat: no cpu line")?
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...: idle and iowait are not busy.
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Ok((total - idle, total))
}

/// CPU seconds (user + system) of some processes since [`ProcessesCpu::start`].
pub struct ProcessesCpu {
    pids: Vec<u32>,
    from: Vec<f64>,
}

impl ProcessesCpu {
    pub fn start(pids: &[u32]) -> anyhow::Result<Self> {
        let from = pids
            .iter()
            .map(|pid| Ok(sample(*pid)?.1))
            .collect::<anyhow::Result<Vec<f64>>>()?;
        Ok(Self {
            pids: pids.to_vec(),
            from,
        })
    }

    /// Each process's CPU seconds since the start, in hundredths.
    pub fn seconds(&self) -> anyhow::Result<Vec<f64>> {
        self.pids
            .iter()
            .zip(&self.from)
            .map(|(pid, from)| Ok(hundredths(sample(*pid)?.1 - from)))
            .collect()
    }
}

/// The whole machine's busy CPU time (all processes, the kernel's work for them included)
/// since [`MachineCpu::start`], and its capacity over that time: its CPUs × the wall time.
pub struct MachineCpu {
    busy_from: u64,
    started: Instant,
    cpus: usize,
}

impl MachineCpu {
    pub fn start() -> anyhow::Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let cpus = count_cpus(&stat);
        anyhow::ensure!(cpus > 0, "/proc/stat: no cpuN line");
        Ok(Self {
            busy_from: jiffies_of(&stat)?.0,
            started: Instant::now(),
            cpus,
        })
    }

    /// `machine_cpus`, `machine_window_seconds` (the wall time since the start) and
    /// `machine_busy_seconds` (CPU seconds the machine was busy meanwhile).
    pub fn since_start(&self) -> anyhow::Result<Value> {
        let busy = cpu_jiffies()?.0 - self.busy_from;
        // The kernel's USER_HZ is 100 on Linux.
        #[allow(clippy::cast_precision_loss)]
        Ok(json!({
            "machine_cpus": self.cpus,
            "machine_window_seconds": hundredths(self.started.elapsed().as_secs_f64()),
            "machine_busy_seconds": hundredths(busy as f64 / 100.0),
        }))
    }
}

/// How many CPUs `/proc/stat` counts (its `cpuN` lines).
fn count_cpus(stat: &str) -> usize {
    stat.lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count()
}

/// Seconds rounded to hundredths, as the results give them.
pub fn hundredths(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_are_the_numbered_cpu_lines() {
        let stat = "cpu  10 0 5 100 0 0 0 0 0 0\ncpu0 5 0 2 50 0 0 0 0 0 0\n\
                    cpu1 5 0 3 50 0 0 0 0 0 0\nintr 1 2\nctxt 7\ncpu_extra 1\n";
        assert_eq!(count_cpus(stat), 2);
    }

    /// Keeps this thread on a CPU for `seconds` of its own CPU time (by its `stat`).
    fn spin(seconds: f64) {
        let now =
            || cpu_seconds(&std::fs::read_to_string("/proc/thread-self/stat").unwrap()).unwrap();
        let from = now();
        while now() - from < seconds {
            std::hint::black_box(0);
        }
    }

    #[test]
    fn processes_cpu_counts_from_its_start() {
        let cpu = ProcessesCpu::start(&[std::process::id()]).unwrap();
        let wall = Instant::now();
        spin(0.3);
        let seconds = cpu.seconds().unwrap();
        assert_eq!(seconds.len(), 1);
        // This thread's 0.3 s (less a tick of rounding), and not what the process spent before
        // the start: at most what the machine's CPUs could do meanwhile.
        let cpus = std::thread::available_parallelism().unwrap().get();
        #[allow(clippy::cast_precision_loss)]
        let most = cpus as f64 * wall.elapsed().as_secs_f64() + 0.02;
        assert!(
            (0.29..=most).contains(&seconds[0]),
            "{seconds:?}, at most {most}"
        );
    }

    #[test]
    fn machine_busy_time_is_within_its_capacity() {
        let machine = MachineCpu::start().unwrap();
        spin(0.3);
        let v = machine.since_start().unwrap();
        let busy = v["machine_busy_seconds"].as_f64().unwrap();
        let window = v["machine_window_seconds"].as_f64().unwrap();
        let cpus = v["machine_cpus"].as_f64().unwrap();
        // At least this thread's own 0.3 s (the machine's jiffies and the thread's ticks
        // are counted apart: a tick's slack), at most what the CPUs could do meanwhile.
        assert!(window >= 0.3, "{v}");
        assert!((0.28..=cpus * window + 0.02).contains(&busy), "{v}");
    }
}
