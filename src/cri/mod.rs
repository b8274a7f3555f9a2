//! The Container Runtime Interface: a gRPC client for the runtime's `RuntimeService` and
//! `ImageService` (CRI `runtime.v1`, served by containerd 1.6+ and CRI-O).
//!
//! This module only carries out calls: it builds no policy. Every call has a deadline and
//! every error names the RPC that failed, so the pod worker can turn it into a status,
//! an event and a back-off.
//!
//! Knows no pod, Kubernetes object or kubelet policy: it speaks CRI to the runtime.

mod client;
mod error;
mod health;
mod verbose;

pub use client::{Cri, CriClient, Endpoint};
pub use error::{CriError, Result, ok_if_not_found};
pub use health::{Condition, RuntimeHealth};
pub use verbose::VerboseInfo;

/// Messages and clients generated from the vendored `runtime.v1` api.proto.
#[allow(missing_docs, clippy::all, clippy::pedantic, unused_qualifications)]
pub mod api {
    tonic::include_proto!("runtime.v1");
}

/// The CRI API version this client speaks (the `version` field of `VersionRequest`).
pub const CRI_API_VERSION: &str = "v1";

/// The `Version` request of this client.
#[must_use]
pub fn version_request() -> api::VersionRequest {
    api::VersionRequest {
        version: CRI_API_VERSION.to_owned(),
    }
}

/// The `ListContainers` request of every running container.
#[must_use]
pub fn running_containers_request() -> api::ListContainersRequest {
    api::ListContainersRequest {
        filter: Some(api::ContainerFilter {
            state: Some(api::ContainerStateValue {
                state: api::ContainerState::ContainerRunning.into(),
            }),
            ..Default::default()
        }),
    }
}

/// The runtime condition type a runtime reports when it can run containers.
pub const RUNTIME_READY: &str = "RuntimeReady";
/// The runtime condition type a runtime reports when pod networking is set up.
pub const NETWORK_READY: &str = "NetworkReady";
