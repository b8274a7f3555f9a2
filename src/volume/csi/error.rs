//! The CSI plugin's errors, with the kubelet's texts where it has them.

use std::io;
use std::path::PathBuf;

/// A CSI volume that could not be set up, torn down or measured.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    /// The driver has not registered (or went).
    #[error("kubernetes.io/csi: driver name {0} not found in the list of registered CSI drivers")]
    DriverNotFound(String),
    /// The driver answered an RPC with an error.
    #[error("kubernetes.io/csi: {rpc} of volume {volume:?} failed: rpc error: code = {:?} desc = {}", .status.code(), .status.message())]
    Rpc {
        /// The RPC.
        rpc: &'static str,
        /// The volume handle.
        volume: String,
        /// The driver's status.
        status: tonic::Status,
    },
    /// The driver does not serve the volume's lifecycle mode, or needs an attach.
    #[error("{0}")]
    Refused(String),
    /// Reading a CSIDriver or Secret failed.
    #[error("{what}: {source}")]
    Api {
        /// The read.
        what: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// File system work failed.
    #[error("kubernetes.io/csi: {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A path is still mounted after the driver unpublished or unstaged it.
    #[error("kubernetes.io/csi: {} is still mounted after {rpc}", path.display())]
    StillMounted {
        /// The RPC that should have unmounted it.
        rpc: &'static str,
        /// The path.
        path: PathBuf,
    },
}
