//! Probe primitives, as the kubelet's `pkg/probe`: one check of a container by running a
//! command in it ([`exec`]), an HTTP GET against it ([`http`]) or a TCP connect to it
//! ([`tcp`]). Each answers a [`Outcome`]; the prober (and lifecycle hooks) decide what to
//! do with it.

pub mod exec;
pub mod http;
pub mod tcp;

/// The kubelet caps what it keeps of a probe's output (exec output, HTTP body) at 10 KiB.
pub const MAX_OUTPUT: usize = 10 * 1024;

/// The result of one probe, named like the kubelet's `probe.Result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    /// The check passed.
    Success,
    /// The check passed with a warning (e.g. an HTTP redirect that was not followed).
    Warning,
    /// The check failed.
    Failure,
    /// The check could not be made (e.g. the runtime call failed).
    Unknown,
}

impl ProbeResult {
    /// The kubelet's spelling: `success`, `warning`, `failure`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Warning => "warning",
            Self::Failure => "failure",
            Self::Unknown => "unknown",
        }
    }
}

/// A probe's result and its output (command output, response body, or error message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The result.
    pub result: ProbeResult,
    /// What the kubelet would show in its events for this result.
    pub output: String,
}

impl Outcome {
    /// An outcome with its output.
    pub fn new(result: ProbeResult, output: impl Into<String>) -> Self {
        Self {
            result,
            output: output.into(),
        }
    }
}

/// Keeps at most [`MAX_OUTPUT`] bytes of `bytes`, as (lossy) text.
fn capped_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_OUTPUT)]).into_owned()
}
