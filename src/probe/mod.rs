//! Probe primitives, as the kubelet's `pkg/probe`: one check of a container by running a
//! command in it ([`exec`]), an HTTP GET against it ([`http`]) or a TCP connect to it
//! ([`tcp`]). Each answers a [`Outcome`]; the prober (and lifecycle hooks) decide what to
//! do with it. The latest result of each container's probes is kept in [`results`].
//!
//! Knows no prober worker, pod worker or status manager: one check, one outcome.

pub mod exec;
pub mod http;
pub mod results;
pub mod tcp;

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

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

/// The host a probe or hook connects to: the one it names, else the pod's IP.
#[must_use]
pub fn host_or(host: Option<&str>, pod_ip: &str) -> String {
    host.filter(|h| !h.is_empty()).unwrap_or(pod_ip).to_owned()
}

/// The port a probe or hook names: a number, or the name of one of the container's ports.
///
/// # Errors
/// A name the container has no port for, or a number out of range (the kubelet's message).
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| format!("couldn't find port: {name} in {}", container.name))?,
        },
    };
    u16::try_from(number)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("invalid port number: {number}"))
}

/// Keeps at most [`MAX_OUTPUT`] bytes of `bytes`, as (lossy) text.
fn capped_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_OUTPUT)]).into_owned()
}
