//! The `logrotate` scenario: N chatty pods bound to the node, each logging numbered lines
//! at a fixed rate, while the agent (started with the same `--container-log-max-size` and
//! `--container-log-max-files` as the one it is compared with) rotates and compresses
//! their logs: the agent's CPU seconds and resident memory over the window, and the most
//! bytes the pods' logs held on disk at any sample (every 200 ms). It uses the shared
//! pod, `/proc` and result helpers and knows no other scenario.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::pods::{ApiArgs, bound_pods, container, timings_json};
use crate::procfs::{AgentWindow, footprint_over};
use crate::results::merge_into;

#[derive(Debug, clap::Args)]
pub struct LogRotateArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The agent, measured while the pods log.
    #[command(flatten)]
    window: AgentWindow,
    /// What each pod logs, in MiB per second (of text; the runtime adds its prefix).
    #[arg(long, default_value_t = 1)]
    mib_per_second: u32,
    /// The agent's pod logs directory (`/var/log/pods` for the kubelet).
    #[arg(long)]
    pod_logs_dir: PathBuf,
}

/// A chatty container: 1 MiB of 100-byte numbered lines, written `rate` times a second
/// (a 1 MiB block, then a pause). Like [`container`], it exits at once on SIGTERM.
fn chatty_container(image: &str, rate: u32) -> Value {
    let mut c = container(image);
    let pause = 1.0 / f64::from(rate.max(1));
    c["command"] = json!([
        "sh",
        "-c",
        format!(
            "trap 'exit 0' TERM; awk 'BEGIN {{ pad = sprintf(\"%90s\", \"\"); gsub(/ /, \"x\", pad); \
             for (i = 1; i <= 10486; i++) printf \"%08d %s\\n\", i, pad }}' > /tmp/block; \
             while true; do cat /tmp/block; sleep {pause:.3}; done & wait"
        )
    ]);
    c
}

/// The bytes under `dir` (the pods' log directories), and how many compressed rotated
/// logs there are.
fn usage(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut gz) = (0, 0);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => {
                let (b, g) = usage(&path);
                bytes += b;
                gz += g;
            }
            // A file may go between the listing and the stat: it is not on disk then.
            Ok(_) => {
                bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
                gz += u64::from(path.extension().is_some_and(|e| e == "gz"));
            }
            Err(_) => {}
        }
    }
    (bytes, gz)
}

/// The most bytes under `dir` at any sample (every 200 ms) for `seconds`, and the most
/// compressed logs seen at once.
async fn disk_over(dir: PathBuf, seconds: u64) -> (u64, u64) {
    let end = Instant::now() + Duration::from_secs(seconds);
    let (mut most, mut gz) = (0, 0);
    while Instant::now() < end {
        let dir = dir.clone();
        let (bytes, g) = tokio::task::spawn_blocking(move || usage(&dir))
            .await
            .unwrap_or_default();
        most = most.max(bytes);
        gz = gz.max(g);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (most, gz)
}

/// The logrotate scenario: the start-up and deletion timings of the chatty pods, the
/// agent's footprint while their logs are rotated, and the most their logs held on disk.
pub async fn logrotate(args: LogRotateArgs) -> anyhow::Result<Value> {
    let LogRotateArgs {
        api,
        window: AgentWindow { pid, seconds },
        mib_per_second,
        pod_logs_dir,
    } = args;
    let hold = async {
        let (footprint, (most, gz)) = tokio::join!(
            footprint_over(pid, seconds),
            disk_over(pod_logs_dir, seconds)
        );
        let mut held = footprint?;
        held["logs_on_disk_max_mb"] = json!(most / (1 << 20));
        held["compressed_logs_max"] = json!(gz);
        Ok(held)
    };
    let spec = |_| json!({ "containers": [chatty_container(&api.image, mib_per_second)] });
    let t = bound_pods(&api, spec, hold).await?;
    let mut result = timings_json("logrotate", &api, &t);
    result["mib_per_second"] = json!(mib_per_second);
    merge_into(&mut result, &t.held);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chatty_container_writes_a_mib_block_at_its_rate() {
        let c = chatty_container("busybox", 4);
        let script = c["command"][2].as_str().unwrap();
        // 10486 lines of 100 bytes: 1 MiB (to within a line).
        assert!(script.contains("i <= 10486"), "{script}");
        assert!(script.contains("sleep 0.250"), "{script}");
        assert!(script.starts_with("trap 'exit 0' TERM"), "{script}");
    }

    #[test]
    fn usage_counts_files_under_the_pods_log_dirs() {
        let dir = std::env::temp_dir().join(format!("bench-logrotate-{}", std::process::id()));
        let main = dir.join("default_p_uid").join("main");
        std::fs::create_dir_all(&main).unwrap();
        std::fs::write(main.join("0.log"), [0u8; 100]).unwrap();
        std::fs::write(main.join("0.log.20260101-000000.gz"), [0u8; 10]).unwrap();
        assert_eq!(usage(&dir), (110, 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
