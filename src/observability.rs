//! Logging set-up, in one place: human-readable text (coloured on a terminal only) or JSON
//! lines on stderr, filtered by `RUST_LOG` or the `--log-level`, and optionally one line per
//! closed span with its busy and idle time. The pods' start-up [`timeline`](crate::timeline) is recorded from the
//! same spans, whatever the log filter.
//!
//! Knows no subsystem: it installs the subscriber the timelines ride on.

use std::io::IsTerminal;
use std::sync::Arc;

use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::timeline::{TimelineLayer, Timelines};

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
/// with `span_timings`, every span that closes logs `time.busy` and `time.idle`. With
/// `timelines`, the spans of pods are recorded there (at info level, whatever the log
/// filter says).
///
/// # Errors
/// When a subscriber is already installed.
pub fn init(
    format: LogFormat,
    default_level: &str,
    span_timings: bool,
    timelines: Option<Arc<Timelines>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let spans = if span_timings {
        FmtSpan::CLOSE
    } else {
        FmtSpan::NONE
    };
    // Colours only for a terminal: a log file gets plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_span_events(spans)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    let timeline = timelines
        .map(|t| TimelineLayer::new(t).with_filter(tracing_subscriber::filter::LevelFilter::INFO));
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(timeline)
        .try_init()
        .map_err(Into::into)
}
