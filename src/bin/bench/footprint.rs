//! The `footprint` scenario: resident memory and CPU seconds of one process (an agent)
//! over a window. It knows no API server, no CRI and no other scenario.

use serde_json::{Value, json};

use crate::procfs::footprint_over;
use crate::results::merge_into;

#[derive(Debug, clap::Args)]
pub struct FootprintArgs {
    /// The process.
    #[arg(long)]
    pid: u32,
    /// The window, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The agent, for the report.
    #[arg(long)]
    agent: String,
    /// What the agent was doing (`idle`, `100 pods`).
    #[arg(long)]
    state: String,
}

pub async fn footprint(args: FootprintArgs) -> anyhow::Result<Value> {
    let mut result = json!({ "kind": "footprint", "agent": args.agent, "state": args.state });
    merge_into(&mut result, &footprint_over(args.pid, args.seconds).await?);
    Ok(result)
}
