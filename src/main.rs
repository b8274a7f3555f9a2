//! The `rkubelet` command: the binary edge, where flags are parsed and errors become
//! exit codes. Everything else lives in the library.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rkubelet::cri::{self, CriClient, Endpoint, RuntimeHealth};
use rkubelet::observability::{self, LogFormat};

/// A kubelet-compatible node agent.
#[derive(Debug, Parser)]
#[command(name = "rkubelet", version, about)]
struct Cli {
    /// Log line format.
    #[arg(long, value_enum, default_value_t, global = true)]
    log_format: LogFormat,
    /// Log filter when RUST_LOG is unset (e.g. `info`, `rkubelet=debug`).
    #[arg(long, default_value = "info", global = true)]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Talk to the container runtime over CRI.
    Cri(CriArgs),
}

/// Flags shared by every command that talks to the container runtime.
#[derive(Debug, clap::Args)]
struct RuntimeFlags {
    /// The container runtime's CRI endpoint.
    #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
    container_runtime_endpoint: String,
    /// Deadline of each CRI call but image pulls, in seconds.
    #[arg(long, default_value_t = 120)]
    runtime_request_timeout: u64,
}

impl RuntimeFlags {
    fn client(&self) -> anyhow::Result<CriClient> {
        let endpoint: Endpoint = self.container_runtime_endpoint.parse()?;
        let timeout = Duration::from_secs(self.runtime_request_timeout);
        Ok(CriClient::new(endpoint, timeout, timeout))
    }
}

#[derive(Debug, clap::Args)]
struct CriArgs {
    #[command(flatten)]
    runtime: RuntimeFlags,
    #[command(subcommand)]
    command: CriCommand,
}

#[derive(Debug, Subcommand)]
enum CriCommand {
    /// Print the runtime's name and version and the CRI version it serves.
    Version,
    /// Print RuntimeReady and NetworkReady; exit 1 if either is false.
    Status,
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    observability::init(cli.log_format, &cli.log_level)
        .map_err(|e| anyhow::anyhow!("setting up logging: {e}"))?;
    match cli.command {
        Command::Cri(args) => cri_command(args).await,
    }
}

async fn cri_command(args: CriArgs) -> anyhow::Result<std::process::ExitCode> {
    let client = args.runtime.client()?;
    let mut out = std::io::stdout().lock();
    match args.command {
        CriCommand::Version => {
            let v = client
                .version()
                .await
                .with_context(|| format!("asking {} for its version", client.endpoint()))?;
            writeln!(out, "Version:           {}", v.version)?;
            writeln!(out, "RuntimeName:       {}", v.runtime_name)?;
            writeln!(out, "RuntimeVersion:    {}", v.runtime_version)?;
            writeln!(out, "RuntimeApiVersion: {}", v.runtime_api_version)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        CriCommand::Status => {
            let status = client
                .status(cri::api::StatusRequest { verbose: false })
                .await
                .with_context(|| format!("asking {} for its status", client.endpoint()))?;
            let health = RuntimeHealth::from(&status);
            writeln!(out, "{}", health.runtime)?;
            writeln!(out, "{}", health.network)?;
            Ok(if health.ready() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            })
        }
    }
}
