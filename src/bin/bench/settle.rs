//! The `settle` sub-command: waits until the machine's CPUs are quiet again after a
//! scenario, so that every measured run starts from the same idle machine. It knows no
//! API server, no CRI and no scenario.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::procfs::cpu_jiffies;
use crate::results::seconds;

#[derive(Debug, clap::Args)]
pub struct SettleArgs {
    /// Quiet means at most this share of all CPU time busy over one second.
    #[arg(long, default_value_t = 0.25)]
    busy: f64,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
}

/// The scenarios before this one leave work behind (sandbox removal, the kernel's cgroup
/// clean-up, an agent's garbage collection): wait until the CPUs are quiet, so that every
/// agent and the floor start from the same idle machine.
pub async fn settle(args: &SettleArgs) -> anyhow::Result<Value> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout);
    let mut before = cpu_jiffies()?;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = cpu_jiffies()?;
        #[allow(clippy::cast_precision_loss)]
        let busy = (now.0 - before.0) as f64 / (now.1 - before.1).max(1) as f64;
        before = now;
        if busy <= args.busy || Instant::now() >= deadline {
            return Ok(json!({
                "kind": "settle", "waited": seconds(started.elapsed()), "busy": busy,
            }));
        }
    }
}
