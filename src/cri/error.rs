//! Errors of the CRI client: each names the RPC (and where known, the endpoint).

use std::time::Duration;

/// A failed CRI call.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The endpoint string is not a form this client understands.
    #[error("invalid container runtime endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The runtime answered the RPC with a gRPC error.
    #[error("CRI {rpc} failed: {code:?}: {message}")]
    Rpc {
        /// The RPC, e.g. `RunPodSandbox`.
        rpc: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The runtime's message.
        message: String,
    },
    /// The RPC did not finish within its deadline.
    #[error("CRI {rpc} timed out after {after:?}")]
    Timeout {
        /// The RPC.
        rpc: &'static str,
        /// The deadline that passed.
        after: Duration,
    },
    /// The runtime answered with something this client cannot use.
    #[error("CRI {rpc} returned an unusable response: {reason}")]
    BadResponse {
        /// The RPC.
        rpc: &'static str,
        /// What was wrong.
        reason: String,
    },
}

impl CriError {
    /// The gRPC code of a runtime error, if the runtime answered at all.
    #[must_use]
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The error as the kubelet prints a CRI error (grpc-go's `err.Error()`):
    /// `rpc error: code = <code> desc = <message>`.
    #[must_use]
    pub fn grpc_error(&self) -> String {
        match self {
            Self::Rpc { code, message, .. } => {
                format!("rpc error: code = {code:?} desc = {message}")
            }
            other => other.to_string(),
        }
    }

    /// The runtime's own message, as the kubelet's container events and waiting messages
    /// carry it (grpc-go's `status.Message()`).
    #[must_use]
    pub fn grpc_message(&self) -> String {
        match self {
            Self::Rpc { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// True when the runtime says the object does not exist (a lost race, or already removed).
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }

    /// True when the runtime could not be reached (down, restarting, socket missing).
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(self.code(), Some(tonic::Code::Unavailable))
            || matches!(self, Self::Timeout { .. })
    }
}

/// Result of a CRI call.
pub type Result<T, E = CriError> = std::result::Result<T, E>;

/// A call whose object may already be gone: `NotFound` counts as done (stop and remove
/// are idempotent in the kubelet).
///
/// # Errors
/// Any other failure.
pub fn ok_if_not_found<T>(result: Result<T>) -> Result<()> {
    match result {
        Err(e) if !e.is_not_found() => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_errors_read_as_grpc_go_prints_them() {
        let e = CriError::Rpc {
            rpc: "StartContainer",
            code: tonic::Code::Unknown,
            message: "failed to create containerd task".into(),
        };
        assert_eq!(
            e.grpc_error(),
            "rpc error: code = Unknown desc = failed to create containerd task"
        );
        assert_eq!(e.grpc_message(), "failed to create containerd task");
        let timeout = CriError::Timeout {
            rpc: "PullImage",
            after: Duration::from_secs(2),
        };
        assert_eq!(timeout.grpc_message(), timeout.to_string());
    }

    #[test]
    fn rpc_error_names_the_call_and_code() {
        let err = CriError::Rpc {
            rpc: "RunPodSandbox",
            code: tonic::Code::Unknown,
            message: "failed to setup network".into(),
        };
        assert_eq!(
            err.to_string(),
            "CRI RunPodSandbox failed: Unknown: failed to setup network"
        );
        assert!(!err.is_not_found());
        assert!(!err.is_unavailable());
    }

    #[test]
    fn timeouts_and_unavailable_count_as_unreachable() {
        let timeout = CriError::Timeout {
            rpc: "Version",
            after: Duration::from_secs(2),
        };
        assert!(timeout.is_unavailable());
        let down = CriError::Rpc {
            rpc: "Status",
            code: tonic::Code::Unavailable,
            message: "connection refused".into(),
        };
        assert!(down.is_unavailable());
        let gone = CriError::Rpc {
            rpc: "ContainerStatus",
            code: tonic::Code::NotFound,
            message: "no such container".into(),
        };
        assert!(gone.is_not_found());
    }
}
