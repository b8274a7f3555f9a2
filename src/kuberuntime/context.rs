//! What a container's config and environment are made from besides its spec: the
//! [`ContainerContext`] (facts known once the sandbox runs, host paths prepared by the
//! worker, the prefetched [`EnvSources`]) and the [`ConfigError`] making either may end in
//! (the kubelet's `CreateContainerConfigError`). Shared by `container` and `env`, which
//! import it and not each other.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::security_context::{ImageUser, NonRootError};
use crate::cri::api;

/// Why a container config could not be made (the kubelet's `CreateContainerConfigError`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A field the agent does not support yet.
    #[error("container {container}: {what} is not supported by rkubelet yet")]
    Unsupported {
        /// The container.
        container: String,
        /// The field.
        what: String,
    },
    /// A field reference that cannot be resolved.
    #[error("container {container}: env {var}: {reason}")]
    BadEnv {
        /// The container.
        container: String,
        /// The variable.
        var: String,
        /// What is wrong.
        reason: String,
    },
    /// A Secret, ConfigMap or the Services could not be read, or lack a key; the text is
    /// the kubelet's.
    #[error("{0}")]
    Source(String),
    /// `runAsNonRoot` cannot be honoured.
    #[error(transparent)]
    NonRoot(#[from] NonRootError),
    /// The runtime could not say which user the image runs as.
    #[error("{0}")]
    ImageUser(String),
    /// A resource quantity that does not parse.
    #[error("container {container}: {reason}")]
    BadResource {
        /// The container.
        container: String,
        /// What is wrong.
        reason: String,
    },
}

/// What a container's config depends on besides its spec: facts known once the sandbox
/// runs, and host paths prepared by the worker.
#[derive(Debug, Clone, Default)]
pub struct ContainerContext {
    /// The pod's IPs, first the primary one.
    pub pod_ips: Vec<IpAddr>,
    /// The node's IP (`status.hostIP`).
    pub host_ip: Option<IpAddr>,
    /// The node's name (`spec.nodeName`).
    pub node_name: String,
    /// The container's mounts: volume mounts resolved to host paths, plus the kubelet's
    /// own files (`/etc/hosts`, `/dev/termination-log`).
    pub mounts: Vec<api::Mount>,
    /// How many times the container was restarted: its `attempt` and log file name.
    pub restart_count: u32,
    /// The image reference the runtime resolved (`PullImage`/`ImageStatus`).
    pub image_ref: String,
    /// The Secrets, ConfigMaps and Services the environment is made from.
    pub sources: Arc<EnvSources>,
    /// The user the image runs as (`ImageStatus`).
    pub image_user: ImageUser,
    /// Where the node's `Localhost` seccomp profiles live (`<root-dir>/seccomp`).
    pub seccomp_profile_root: PathBuf,
    /// The node's memory capacity in bytes, for the container's OOM score.
    pub memory_capacity: u64,
    /// The runtime's id of the container whose PID namespace an ephemeral container
    /// joins (its `targetContainerName`): the kubelet's namespace target.
    pub pid_target: Option<String>,
}

/// What a lookup in a cache gave: the object, not found (`None`), or why it failed.
pub(super) type Lookup<K> = Result<Option<Arc<K>>, String>;

/// The objects a pod's environment is made from, read before its containers start.
#[derive(Debug)]
pub struct EnvSources {
    /// The Secrets the pod's containers reference, by name.
    pub secrets: HashMap<String, Lookup<Secret>>,
    /// The ConfigMaps the pod's containers reference, by name.
    pub config_maps: HashMap<String, Lookup<ConfigMap>>,
    /// The service variables of the pod, or why they are not known.
    pub services: Result<BTreeMap<String, String>, String>,
    /// The node's allocatable resources: the values of unset limits.
    pub allocatable: BTreeMap<String, ApiQuantity>,
}

impl Default for EnvSources {
    /// No objects, and no services (known to be none).
    fn default() -> Self {
        Self {
            secrets: HashMap::new(),
            config_maps: HashMap::new(),
            services: Ok(BTreeMap::new()),
            allocatable: BTreeMap::new(),
        }
    }
}
