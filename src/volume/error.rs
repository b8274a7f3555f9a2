//! Errors of the volume manager: each names the pod (`namespace/name`, or its UID where only
//! that is known) and the volume, so the pod worker can turn it into a `FailedMount` event.

use crate::watch_manager::CacheError;
use std::io;
use std::path::PathBuf;

/// A volume that could not be set up or torn down.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The volume's type is not one this agent supports (persistentVolumeClaim, csi, nfs, ...).
    /// Retrying does not help: the pod spec is immutable.
    #[error("pod {pod}: volume {volume:?}: volume type {kind} is not supported by this node")]
    Unsupported {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume's name in the pod spec.
        volume: String,
        /// The volume source as the API names it (`persistentVolumeClaim`, `csi`, ...).
        kind: String,
    },
    /// A secret or config map the volume needs does not exist, and the volume does not
    /// mark it optional. The worker retries with back-off: it may be created later.
    #[error("pod {pod}: volume {volume:?}: {kind} {name:?} not found")]
    NotFound {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume's name in the pod spec.
        volume: String,
        /// `secret` or `configmap`.
        kind: &'static str,
        /// The object's name.
        name: String,
    },
    /// An item names a key the secret or config map does not have, and the source is not
    /// optional.
    #[error("pod {pod}: volume {volume:?}: {kind} {name:?} has no key {key:?}")]
    MissingKey {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume's name in the pod spec.
        volume: String,
        /// `secret` or `configmap`.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// The missing key.
        key: String,
    },
    /// Reading a secret or config map from the node's cache failed (other than "not
    /// found"): its watch has not listed it, e.g. while the Node authorizer does not (yet)
    /// see the pod on this node.
    #[error("pod {pod}: volume {volume:?}: getting {kind} {name:?}: {source}")]
    Api {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume's name in the pod spec.
        volume: String,
        /// `secret` or `configmap`.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// The cache's error.
        #[source]
        source: Box<CacheError>,
    },
    /// The TokenRequest for a projected service account token failed.
    #[error(
        "pod {pod}: volume {volume:?}: requesting a token for service account {service_account:?}: {source}"
    )]
    TokenRequest {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume's name in the pod spec.
        volume: String,
        /// The pod's service account.
        service_account: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The volume's spec cannot be carried out as written (a bad item path or mode, an
    /// unsupported downward API field, a missing secret name, ...).
    #[error("pod {pod}: volume {volume:?}: {reason}")]
    InvalidSpec {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume's name in the pod spec.
        volume: String,
        /// What is wrong.
        reason: String,
    },
    /// A hostPath volume's path is not of the `type` the spec demands.
    #[error(
        "pod {pod}: volume {volume:?}: hostPath type check failed: {} is not a {}: {reason}",
        path.display(),
        host_path_kind(expected)
    )]
    HostPathType {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume's name in the pod spec.
        volume: String,
        /// The host path.
        path: PathBuf,
        /// The hostPath `type`.
        expected: String,
        /// What was found instead.
        reason: String,
    },
    /// A volumeMount's subPath or subPathExpr cannot be used; the message is the
    /// kubelet's (the container waits with `CreateContainerConfigError`).
    #[error("{message}")]
    SubPath {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume the mount names.
        volume: String,
        /// The container.
        container: String,
        /// What is wrong, as the kubelet says it.
        message: String,
    },
    /// A `persistentVolumeClaim` volume cannot be followed to its PersistentVolume yet (the
    /// claim is not Bound, ...); the pod waits, and the set-up is retried.
    #[error("pod {pod}: volume {volume:?}: {source}")]
    Claim {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume's name in the pod spec.
        volume: String,
        /// The pod's volumes used by containers and not set up (sorted).
        unmounted: Vec<String>,
        /// The pod's volumes used by containers (the kubelet's list of those "unattached",
        /// which names them all).
        unattached: Vec<String>,
        /// Why, in the kubelet's words.
        #[source]
        source: Box<super::pvc::ClaimError>,
    },
    /// The node does not satisfy the PersistentVolume's node affinity: the volume is not
    /// mounted, and the pod waits (the kubelet does not reject it).
    #[error("pod {pod}: persistent volume {pv:?}: {operation}.NodeAffinity check failed: {reason}")]
    NodeAffinity {
        /// The pod, `namespace/name`.
        pod: String,
        /// The PersistentVolume's name.
        pv: String,
        /// `MountVolume` or `MapVolume` (block).
        operation: &'static str,
        /// Why, in the kubelet's words.
        reason: String,
    },
    /// A volumeDevice names a volume the pod does not have as a block volume.
    #[error("cannot find volume {volume:?} to pass into container {container:?}")]
    UnknownDevice {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume the device names.
        volume: String,
        /// The container.
        container: String,
    },
    /// A volumeMount names a volume the pod does not have.
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    UnknownVolume {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume the mount names.
        volume: String,
        /// The container.
        container: String,
    },
    /// The pod object cannot be used (no UID, or a UID that is not a plain path segment).
    #[error("pod {pod}: {reason}")]
    InvalidPod {
        /// The pod, `namespace/name` or its UID.
        pod: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A file system or mount operation failed while setting up a volume.
    #[error("pod {pod}: volume {volume:?}: {action} {path}: {source}")]
    Io {
        /// The pod, `namespace/name`.
        pod: String,
        /// The volume's name in the pod spec.
        volume: String,
        /// What was being done, e.g. `mounting tmpfs on`.
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The directory of pod directories could not be read while looking for orphans.
    #[error("reading the pods directory {path}: {source}")]
    ReadPodsDir {
        /// `<root_dir>/pods`.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A file system or mount operation failed while tearing down a pod's volumes.
    #[error("pod uid {pod_uid}: tearing down volumes: {action} {path}: {source}")]
    Teardown {
        /// The pod's UID.
        pod_uid: String,
        /// What was being done, e.g. `unmounting`.
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl VolumeError {
    /// The text of the `FailedMount` event for this error, as the kubelet's volume manager
    /// words it: `MountVolume.SetUp failed for volume "<name>" : <what>`.
    #[must_use]
    pub fn failed_mount_message(&self) -> String {
        let (volume, what) = match self {
            Self::NotFound {
                volume, kind, name, ..
            } => (volume, format!("{kind} {name:?} not found")),
            Self::HostPathType {
                volume,
                path,
                expected,
                ..
            } => (
                volume,
                format!(
                    "hostPath type check failed: {} is not a {}",
                    path.display(),
                    host_path_kind(expected)
                ),
            ),
            Self::Unsupported { volume, kind, .. } => (
                volume,
                format!("volume type {kind} is not supported by this node"),
            ),
            Self::MissingKey {
                volume, kind, key, ..
            } => (
                volume,
                if *kind == "secret" {
                    format!("references non-existent secret key: {key}")
                } else {
                    format!("configmap references non-existent config key: {key}")
                },
            ),
            Self::Api { volume, source, .. } => (volume, source.to_string()),
            Self::TokenRequest { volume, source, .. } => {
                (volume, format!("failed to fetch token: {source}"))
            }
            Self::InvalidSpec { volume, reason, .. } => (volume, reason.clone()),
            Self::Io {
                volume,
                action,
                path,
                source,
                ..
            } => (volume, format!("{action} {}: {source}", path.display())),
            Self::Claim {
                unmounted,
                unattached,
                source,
                ..
            } => {
                return format!(
                    "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[{}]: {source}",
                    unmounted.join(" "),
                    unattached.join(" ")
                );
            }
            Self::NodeAffinity {
                pv,
                operation,
                reason,
                ..
            } => {
                return format!(
                    "{operation}.NodeAffinity check failed for volume {pv:?} : {reason}"
                );
            }
            _ => return self.to_string(),
        };
        format!("MountVolume.SetUp failed for volume {volume:?} : {what}")
    }
}

/// How the kubelet names what a hostPath `type` demands.
fn host_path_kind(kind: &str) -> &str {
    match kind {
        "Directory" | "DirectoryOrCreate" => "directory",
        "File" | "FileOrCreate" => "file",
        "Socket" => "socket file",
        "CharDevice" => "character device",
        "BlockDevice" => "block device",
        other => other,
    }
}

/// Result of a volume operation.
pub type Result<T, E = VolumeError> = std::result::Result<T, E>;

/// A failed file system step, before the pod and volume are attached to it.
#[derive(Debug)]
pub(super) struct FsError {
    pub(super) action: &'static str,
    pub(super) path: PathBuf,
    pub(super) source: io::Error,
}

impl FsError {
    /// A closure for `map_err` that records `action` on `path`.
    pub(super) fn at(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self {
            action,
            path,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_pod_volume_and_object() {
        let err = VolumeError::Unsupported {
            pod: "default/db".into(),
            volume: "data".into(),
            kind: "persistentVolumeClaim".into(),
        };
        assert_eq!(
            err.to_string(),
            r#"pod default/db: volume "data": volume type persistentVolumeClaim is not supported by this node"#
        );
    }

    #[test]
    fn failed_mount_events_read_like_the_kubelets() {
        let err = VolumeError::NotFound {
            pod: "default/web".into(),
            volume: "certs".into(),
            kind: "secret",
            name: "tls".into(),
        };
        assert_eq!(
            err.to_string(),
            r#"pod default/web: volume "certs": secret "tls" not found"#
        );
        assert_eq!(
            err.failed_mount_message(),
            r#"MountVolume.SetUp failed for volume "certs" : secret "tls" not found"#
        );
        let err = VolumeError::HostPathType {
            pod: "default/web".into(),
            volume: "h".into(),
            path: "/var/run/x.sock".into(),
            expected: "Socket".into(),
            reason: "a directory".into(),
        };
        assert_eq!(
            err.failed_mount_message(),
            r#"MountVolume.SetUp failed for volume "h" : hostPath type check failed: /var/run/x.sock is not a socket file"#
        );
        let err = VolumeError::MissingKey {
            pod: "default/web".into(),
            volume: "cfg".into(),
            kind: "configmap",
            name: "settings".into(),
            key: "app.yaml".into(),
        };
        assert_eq!(
            err.failed_mount_message(),
            r#"MountVolume.SetUp failed for volume "cfg" : configmap references non-existent config key: app.yaml"#
        );
        let err = VolumeError::Claim {
            pod: "default/db-0".into(),
            volume: "data".into(),
            unmounted: vec!["data".into()],
            unattached: vec!["data".into(), "default-token-x".into()],
            source: Box::new(crate::volume::pvc::ClaimError::NotBound {
                namespace: "default".into(),
                claim: "data-db-0".into(),
            }),
        };
        assert_eq!(
            err.failed_mount_message(),
            "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[data default-token-x]: error processing PVC default/data-db-0: PVC is not bound"
        );
        let err = VolumeError::NodeAffinity {
            pod: "default/db-0".into(),
            pv: "local-pv".into(),
            operation: "MountVolume",
            reason: "no matching NodeSelectorTerms".into(),
        };
        assert_eq!(
            err.failed_mount_message(),
            r#"MountVolume.NodeAffinity check failed for volume "local-pv" : no matching NodeSelectorTerms"#
        );
        let err = VolumeError::UnknownVolume {
            pod: "default/web".into(),
            volume: "v".into(),
            container: "app".into(),
        };
        assert_eq!(
            err.failed_mount_message(),
            r#"cannot find volume "v" to mount into container "app""#
        );
    }
}
