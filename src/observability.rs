//! Logging set-up, in one place: human-readable text or JSON lines on stderr, filtered by
//! `RUST_LOG` or the `--log-level`, and optionally one line per closed span with its busy
//! and idle time — the per-step timings `bench breakdown` reads.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

/// Installs the global subscriber. `default_level` applies when `RUST_LOG` is unset;
/// with `span_timings`, every span that closes logs `time.busy` and `time.idle`.
///
/// # Errors
/// When a subscriber is already installed.
pub fn init(
    format: LogFormat,
    default_level: &str,
    span_timings: bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let spans = if span_timings {
        FmtSpan::CLOSE
    } else {
        FmtSpan::NONE
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(spans)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
}
