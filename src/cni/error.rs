//! Errors of the CNI module: each names the plugin, the CNI command and the container, or
//! the file, it concerns. [`CniError::code`] maps them to CNI error codes for the thin
//! plugin's answer to containerd.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Command;

/// A failed CNI operation.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// A plugin answered with a CNI error result, or exited non-zero.
    #[error(
        "CNI plugin {plugin} {command}{} failed (code {code}): {msg}{}",
        for_container(container_id),
        with_details(details)
    )]
    Plugin {
        /// The plugin type, e.g. `bridge`.
        plugin: String,
        /// The command it was running.
        command: Command,
        /// The container (sandbox) id; empty for `VERSION`.
        container_id: String,
        /// The CNI error code (0 when the plugin gave no error result).
        code: u32,
        /// The plugin's message, or what is known of the failure.
        msg: String,
        /// The plugin's details, often empty.
        details: String,
    },
    /// The agent's bridge carries an address from another pod CIDR (the Node was
    /// re-created and got a new one) while pods are still attached to it.
    #[error(
        "bridge {bridge} has address {address} outside the node's pod CIDR {pod_cidr} and {ports} pod(s) still attached; remove those pods or the bridge"
    )]
    StaleBridge {
        /// The bridge.
        bridge: String,
        /// Its address.
        address: String,
        /// The node's pod CIDR now.
        pod_cidr: String,
        /// How many interfaces are attached.
        ports: usize,
    },
    /// No executable file named like the plugin type in any bin dir.
    #[error("CNI plugin {plugin:?} not found in {}", paths(searched))]
    PluginNotFound {
        /// The plugin type.
        plugin: String,
        /// The bin dirs searched, in order.
        searched: Vec<PathBuf>,
    },
    /// The plugin could not be run, or did not finish in time.
    #[error("running CNI plugin {} {command}: {source}", plugin.display())]
    Exec {
        /// The plugin binary.
        plugin: PathBuf,
        /// The command.
        command: Command,
        /// What went wrong (spawn failure, `TimedOut`).
        #[source]
        source: std::io::Error,
    },
    /// The plugin succeeded but its output is not a result this module understands.
    #[error("CNI plugin {plugin} {command} returned an unusable result: {reason}")]
    BadResult {
        /// The plugin type.
        plugin: String,
        /// The command.
        command: Command,
        /// What was wrong.
        reason: String,
    },
    /// A plugin does not support the network config's CNI version.
    #[error("CNI plugin {plugin} supports CNI versions {supported:?}, not {wanted}")]
    IncompatibleVersion {
        /// The plugin type.
        plugin: String,
        /// The version of the network config.
        wanted: String,
        /// The versions the plugin reported.
        supported: Vec<String>,
    },
    /// The CNI config dir holds no `*.conflist` file.
    #[error("no *.conflist file in CNI config dir {}", dir.display())]
    NoConfig {
        /// The directory searched.
        dir: PathBuf,
    },
    /// A network config list is not valid.
    #[error("invalid CNI network config {config}: {reason}")]
    InvalidConfig {
        /// Where the config came from (a path, or a built-in name).
        config: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The attachment cannot be handed to plugins (bad container id or interface name).
    #[error("invalid CNI attachment of container {container_id:?}: {reason}")]
    InvalidAttachment {
        /// The container id as given.
        container_id: String,
        /// What is wrong.
        reason: String,
    },
    /// `CHECK` of an attachment that has no cached `ADD` result.
    #[error("container {container_id} is not attached to CNI network {network} as {ifname}")]
    NotAttached {
        /// The container id.
        container_id: String,
        /// The network name.
        network: String,
        /// The interface name.
        ifname: String,
    },
    /// A cached result exists but cannot be read back.
    #[error("CNI result cache entry {}: {reason}", path.display())]
    InvalidCache {
        /// The cache file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file system operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. `reading CNI config dir`.
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The shim socket cannot be bound.
    #[error(transparent)]
    Socket(#[from] crate::unix_socket::BindError),
    /// The thin plugin sent a request the agent cannot serve.
    #[error("bad request from the rkubelet-cni plugin: {reason}")]
    ShimRequest {
        /// The CNI error code to answer with (4: bad environment, 6: undecodable).
        code: u32,
        /// What is wrong.
        reason: String,
    },
}

fn for_container(id: &str) -> String {
    if id.is_empty() {
        String::new()
    } else {
        format!(" for container {id}")
    }
}

fn with_details(details: &str) -> String {
    if details.is_empty() {
        String::new()
    } else {
        format!(" ({details})")
    }
}

fn paths(dirs: &[PathBuf]) -> String {
    let list: Vec<_> = dirs.iter().map(|d| d.display().to_string()).collect();
    format!("[{}]", list.join(", "))
}

/// CNI error code 1: incompatible CNI version.
pub(crate) const CODE_INCOMPATIBLE_VERSION: u32 = 1;
/// CNI error code 3: container unknown or does not exist.
pub(crate) const CODE_UNKNOWN_CONTAINER: u32 = 3;
/// CNI error code 4: invalid necessary environment variables.
pub(crate) const CODE_INVALID_ENV: u32 = 4;
/// CNI error code 5: I/O failure.
pub(crate) const CODE_IO: u32 = 5;
/// CNI error code 6: failed to decode content.
pub(crate) const CODE_DECODE: u32 = 6;
/// CNI error code 7: invalid network config.
pub(crate) const CODE_INVALID_CONFIG: u32 = 7;
/// Plugin-specific code (100+ range, as the spec allows) of every failure of the rkubelet
/// side that has no CNI code of its own: agent unreachable, plugin missing or crashed.
pub(crate) const CODE_RKUBELET: u32 = 999;

impl CniError {
    /// The CNI error code the thin plugin reports to its caller for this error: the
    /// plugin's own code for [`CniError::Plugin`], the matching well-known code (1, 3, 4,
    /// 5, 6, 7) where there is one, else 999.
    #[must_use]
    pub fn code(&self) -> u32 {
        match self {
            Self::Plugin { code, .. } => *code,
            Self::IncompatibleVersion { .. } => CODE_INCOMPATIBLE_VERSION,
            Self::NotAttached { .. } => CODE_UNKNOWN_CONTAINER,
            Self::InvalidAttachment { .. } => CODE_INVALID_ENV,
            Self::Io { .. } | Self::Socket(_) => CODE_IO,
            Self::InvalidConfig { .. } | Self::NoConfig { .. } => CODE_INVALID_CONFIG,
            Self::ShimRequest { code, .. } => *code,
            Self::PluginNotFound { .. }
            | Self::Exec { .. }
            | Self::BadResult { .. }
            | Self::InvalidCache { .. }
            | Self::StaleBridge { .. } => CODE_RKUBELET,
        }
    }
}

/// A CNI error result as plugins print it (`{"code":N,"msg":..,"details":..}`), and as the
/// thin plugin prints it on behalf of the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ErrorResult {
    pub code: u32,
    #[serde(default)]
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl From<&CniError> for ErrorResult {
    fn from(err: &CniError) -> Self {
        Self {
            code: err.code(),
            msg: err.to_string(),
            details: match err {
                CniError::Plugin { details, .. } => details.clone(),
                _ => String::new(),
            },
        }
    }
}

impl From<crate::atomic_file::FileError> for CniError {
    fn from(e: crate::atomic_file::FileError) -> Self {
        Self::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_error_names_plugin_command_container_and_details() {
        let err = CniError::Plugin {
            plugin: "bridge".into(),
            command: Command::Add,
            container_id: "abc".into(),
            code: 7,
            msg: "bad config".into(),
            details: "no bridge name".into(),
        };
        assert_eq!(
            err.to_string(),
            "CNI plugin bridge ADD for container abc failed (code 7): bad config (no bridge name)"
        );
        assert_eq!(err.code(), 7);
        let wire = ErrorResult::from(&err);
        assert_eq!(wire.details, "no bridge name");
        assert_eq!(wire.msg, err.to_string());
    }

    #[test]
    fn version_errors_have_no_container() {
        let err = CniError::Plugin {
            plugin: "portmap".into(),
            command: Command::Version,
            container_id: String::new(),
            code: 0,
            msg: "exit status 2".into(),
            details: String::new(),
        };
        assert_eq!(
            err.to_string(),
            "CNI plugin portmap VERSION failed (code 0): exit status 2"
        );
    }

    #[test]
    fn not_found_lists_the_dirs_searched_and_maps_to_999() {
        let err = CniError::PluginNotFound {
            plugin: "macvlan2".into(),
            searched: vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()],
        };
        assert_eq!(
            err.to_string(),
            "CNI plugin \"macvlan2\" not found in [/opt/cni/bin, /usr/lib/cni]"
        );
        assert_eq!(err.code(), 999);
    }

    #[test]
    fn error_results_round_trip_with_optional_details() {
        let parsed: ErrorResult =
            serde_json::from_str(r#"{"cniVersion":"0.4.0","code":11,"msg":"busy"}"#).unwrap();
        assert_eq!(
            parsed,
            ErrorResult {
                code: 11,
                msg: "busy".into(),
                details: String::new()
            }
        );
        assert_eq!(
            serde_json::to_string(&parsed).unwrap(),
            r#"{"code":11,"msg":"busy"}"#
        );
    }
}
