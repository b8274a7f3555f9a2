//! The kubelet's plugin manager (`pkg/kubelet/pluginmanager`): node plugins (CSI drivers,
//! device plugins) announce themselves with a registration socket under
//! `<root-dir>/plugins_registry`. For each new socket the manager asks the plugin
//! `GetInfo`, hands it to the handler of its type (`CSIPlugin`, `DevicePlugin`) to
//! validate and register, and tells the plugin the outcome with `NotifyRegistrationStatus`;
//! when the socket goes (or is made anew), the handler deregisters it.
//!
//! The kubelet watches the directory with fsnotify and reconciles every second; this
//! manager scans it every second ([`watcher`]), on a blocking thread, and reconciles the
//! same way ([`reconciler`]). A plugin whose handler failed stays registered until its
//! socket goes, as with the kubelet.
//!
//! Knows no CSI, device plugin or volume: handlers for each plugin type are given to it.

mod reconciler;
mod watcher;

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Uri};

pub use reconciler::{GrpcRegistration, Handlers, PluginManager, PluginManagerError, Registration};

/// Messages, client and server generated from the vendored `pluginregistration` v1 api.proto.
#[allow(missing_docs, clippy::all, clippy::pedantic, unused_qualifications)]
pub mod api {
    tonic::include_proto!("pluginregistration");
}

/// The plugin type of CSI drivers (`PluginInfo.type`).
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// The plugin type of device plugins (`PluginInfo.type`).
pub const DEVICE_PLUGIN: &str = "DevicePlugin";
/// The registration directory under the root dir, as the kubelet's `plugins_registry`.
pub const REGISTRY_DIR: &str = "plugins_registry";

/// What a handler says when it refuses or fails a plugin; sent to the plugin in
/// `NotifyRegistrationStatus.error`.
pub type HandlerError = Box<dyn Error + Send + Sync>;

/// The consumer of one plugin type, as the kubelet's `PluginHandler`.
pub trait PluginHandler: Send + Sync + 'static {
    /// Checks a plugin before it is registered: its name, endpoint and versions.
    ///
    /// # Errors
    /// Why the plugin is refused.
    fn validate_plugin(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError>;

    /// Registers a validated plugin.
    ///
    /// # Errors
    /// Why the registration failed.
    fn register_plugin<'a>(
        &'a self,
        name: &'a str,
        endpoint: &'a str,
        versions: &'a [String],
    ) -> BoxFuture<'a, Result<(), HandlerError>>;

    /// Deregisters a plugin whose socket went away.
    fn deregister_plugin<'a>(&'a self, name: &'a str) -> BoxFuture<'a, ()>;
}

/// A lazily connected gRPC channel to the Unix socket `path` (a bare path or a `unix://`
/// URL, as CSI endpoints are given), connecting within `connect_timeout`.
#[must_use]
pub fn unix_channel(path: &str, connect_timeout: Duration) -> Channel {
    let path = PathBuf::from(path.strip_prefix("unix://").unwrap_or(path));
    // The URI is required by tonic but unused: the connector dials the socket.
    tonic::transport::Endpoint::from_static("http://plugin.local")
        .connect_timeout(connect_timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
}

/// `<root_dir>/plugins_registry`.
#[must_use]
pub fn registry_dir(root_dir: &Path) -> PathBuf {
    root_dir.join(REGISTRY_DIR)
}
