//! Errors of the node agent: each names the operation and the node.

use std::path::PathBuf;
use std::time::Duration;

/// A failed node agent operation.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The [`NodeConfig`](super::NodeConfig) cannot be used.
    #[error("invalid configuration for node {node}: {reason}")]
    InvalidConfig {
        /// The node.
        node: String,
        /// What is wrong.
        reason: String,
    },
    /// A request to the API server failed.
    #[error("{operation} for node {node} failed: {source}")]
    Api {
        /// What was being done, e.g. `create Node` or `update Lease`.
        operation: &'static str,
        /// The node.
        node: String,
        /// The client's error (an API status, a transport failure, ...).
        #[source]
        source: kube::Error,
    },
    /// An operation was still retrying when the agent was told to stop.
    #[error("{operation} for node {node} was cancelled")]
    Cancelled {
        /// What was being done.
        operation: &'static str,
        /// The node.
        node: String,
    },
    /// Every attempt of a retried operation failed.
    #[error("{operation} for node {node} failed {attempts} times; last error: {last}")]
    RetriesExhausted {
        /// What was being done.
        operation: &'static str,
        /// The node.
        node: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last attempt's error.
        #[source]
        last: Box<NodeError>,
    },
    /// kube-controller-manager did not allocate a pod CIDR in time.
    #[error("node {node} got no spec.podCIDR within {after:?}")]
    PodCidrTimeout {
        /// The node.
        node: String,
        /// How long was waited.
        after: Duration,
    },
}

impl NodeError {
    /// The API status code, when the API server answered with an error.
    #[must_use]
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Self::Api {
                source: kube::Error::Api(status),
                ..
            } => Some(status.code),
            Self::RetriesExhausted { last, .. } => last.status_code(),
            _ => None,
        }
    }

    /// True for a 409 caused by a stale `resourceVersion` (not an AlreadyExists).
    #[must_use]
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Api { source: kube::Error::Api(status), .. }
            if status.is_conflict() && !status.is_already_exists())
    }
}

/// A machine fact that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A file could not be read.
    #[error("reading {what} from {path}: {source}", path = .path.display())]
    Read {
        /// Which fact, e.g. `memory`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file was read but its content was not understood.
    #[error("parsing {what} from {path}: {reason}", path = .path.display())]
    Parse {
        /// Which fact.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// `statvfs(2)` failed.
    #[error("statvfs of {path}: {source}", path = .path.display())]
    Statvfs {
        /// The path asked about.
        path: PathBuf,
        /// The system error.
        #[source]
        source: nix::errno::Errno,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str) -> NodeError {
        NodeError::Api {
            operation: "update Lease",
            node: "rk-node1".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("the object has been modified", reason)
                    .with_code(code)
                    .boxed(),
            ),
        }
    }

    #[test]
    fn api_errors_name_the_operation_and_node() {
        let err = api_error(409, "Conflict");
        assert!(
            err.to_string()
                .starts_with("update Lease for node rk-node1 failed: "),
            "{err}"
        );
        assert!(err.is_conflict());
        assert_eq!(err.status_code(), Some(409));
        assert!(!api_error(409, "AlreadyExists").is_conflict());
        let exhausted = NodeError::RetriesExhausted {
            operation: "update node status",
            node: "rk-node1".into(),
            attempts: 5,
            last: Box::new(api_error(500, "InternalError")),
        };
        assert_eq!(exhausted.status_code(), Some(500));
        assert!(exhausted.to_string().contains("failed 5 times"));
    }

    #[test]
    fn machine_errors_name_the_fact_and_file() {
        let err = MachineError::Parse {
            what: "memory",
            path: "/proc/meminfo".into(),
            reason: "no MemTotal line".into(),
        };
        assert_eq!(
            err.to_string(),
            "parsing memory from /proc/meminfo: no MemTotal line"
        );
    }
}
