//! What the bench reads from `/proc`: a process's resident memory and CPU seconds (one
//! sample, or over a window) and the machine's busy and total CPU time. It knows no
//! scenario, no API server and no CRI.

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
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11)
        .zip(fields.get(12))
        .and_then(|(u, s)| Some(u.parse::<u64>().ok()? + s.parse::<u64>().ok()?))
        .context("utime/stime")?;
    // The kernel's USER_HZ is 100 on Linux.
    #[allow(clippy::cast_precision_loss)]
    Ok((rss, ticks as f64 / 100.0))
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
        "cpu_seconds": ((cpu_end - cpu_start) * 100.0).round() / 100.0,
    }))
}

/// Busy and total jiffies of all CPUs, from the first line of /proc/stat.
pub fn cpu_jiffies() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
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
