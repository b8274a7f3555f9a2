//! The reconciler: the sockets found against the plugins registered, every second, as the
//! kubelet's `pluginmanager/reconciler` with its operation executor's register and
//! unregister steps.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::api::registration_client::RegistrationClient;
use super::api::{InfoRequest, PluginInfo, RegistrationStatus};
use super::watcher::{self, Stamp};
use super::{PluginHandler, unix_channel};

/// The handlers, by plugin type.
pub type Handlers = BTreeMap<String, Arc<dyn PluginHandler>>;

/// How often the directory is looked at (the kubelet's reconciler loop period).
const LOOP_PERIOD: Duration = Duration::from_secs(1);
/// The dial timeout and the `GetInfo`/`NotifyRegistrationStatus` deadline, as the kubelet's.
const RPC_TIMEOUT: Duration = Duration::from_secs(1);

/// A failure of the plugin manager itself.
#[derive(Debug, thiserror::Error)]
pub enum PluginManagerError {
    /// The registration directory could not be made or read.
    #[error("{action} the plugin registration directory {}: {source}", path.display())]
    Dir {
        /// What was being done.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The plugin side of registration: `GetInfo` and `NotifyRegistrationStatus` on a plugin's
/// registration socket. Behind a trait so the registration flow is tested without sockets.
pub trait Registration: Send + Sync + 'static {
    /// `GetInfo` on the plugin at `socket`.
    fn get_info<'a>(&'a self, socket: &'a Path)
    -> BoxFuture<'a, Result<PluginInfo, tonic::Status>>;

    /// `NotifyRegistrationStatus` to the plugin at `socket`.
    fn notify<'a>(
        &'a self,
        socket: &'a Path,
        status: RegistrationStatus,
    ) -> BoxFuture<'a, Result<(), tonic::Status>>;
}

/// [`Registration`] over gRPC on the plugin's Unix socket.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcRegistration;

fn client(socket: &Path) -> RegistrationClient<tonic::transport::Channel> {
    RegistrationClient::new(unix_channel(&socket.to_string_lossy(), RPC_TIMEOUT))
}

fn deadline<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(RPC_TIMEOUT);
    request
}

impl Registration for GrpcRegistration {
    fn get_info<'a>(
        &'a self,
        socket: &'a Path,
    ) -> BoxFuture<'a, Result<PluginInfo, tonic::Status>> {
        Box::pin(async move {
            let reply = client(socket).get_info(deadline(InfoRequest {})).await?;
            Ok(reply.into_inner())
        })
    }

    fn notify<'a>(
        &'a self,
        socket: &'a Path,
        status: RegistrationStatus,
    ) -> BoxFuture<'a, Result<(), tonic::Status>> {
        Box::pin(async move {
            client(socket)
                .notify_registration_status(deadline(status))
                .await?;
            Ok(())
        })
    }
}

/// A plugin the manager registered (or whose handler failed it after validation).
struct Registered {
    stamp: Stamp,
    name: String,
    handler: Arc<dyn PluginHandler>,
}

/// The plugin manager: the registration directory, the handlers, the registered plugins.
pub struct PluginManager<R: Registration = GrpcRegistration> {
    dir: PathBuf,
    handlers: Handlers,
    registration: R,
    registered: BTreeMap<PathBuf, Registered>,
    /// Sockets whose registration failed, with the stamp it failed for (logged once).
    failed: BTreeMap<PathBuf, Stamp>,
}

impl PluginManager {
    /// A manager of `dir` (`<root-dir>/plugins_registry`) with `handlers` by plugin type.
    #[must_use]
    pub fn new(dir: PathBuf, handlers: Handlers) -> Self {
        Self::with_registration(dir, handlers, GrpcRegistration)
    }
}

impl<R: Registration> PluginManager<R> {
    /// A manager that speaks to plugins through `registration`.
    #[must_use]
    pub fn with_registration(dir: PathBuf, handlers: Handlers, registration: R) -> Self {
        Self {
            dir,
            handlers,
            registration,
            registered: BTreeMap::new(),
            failed: BTreeMap::new(),
        }
    }

    /// Makes the registration directory, then reconciles every second until `stop`.
    ///
    /// # Errors
    /// [`PluginManagerError::Dir`] when the directory cannot be made or read.
    pub async fn run(mut self, stop: CancellationToken) -> Result<(), PluginManagerError> {
        let dir = self.dir.clone();
        let made = tokio::task::spawn_blocking(move || watcher::create_dir(&dir)).await;
        made.map_err(std::io::Error::other)
            .and_then(|made| made)
            .map_err(|source| PluginManagerError::Dir {
                action: "creating",
                path: self.dir.clone(),
                source,
            })?;
        tracing::info!(dir = %self.dir.display(), "plugin manager watching for registration sockets");
        loop {
            self.reconcile().await?;
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(LOOP_PERIOD) => {}
            }
        }
    }

    /// One pass: plugins whose socket went (or was made anew) are deregistered, new
    /// sockets registered.
    ///
    /// # Errors
    /// [`PluginManagerError::Dir`] when the directory cannot be read.
    pub async fn reconcile(&mut self) -> Result<(), PluginManagerError> {
        let dir = self.dir.clone();
        let found = tokio::task::spawn_blocking(move || watcher::sockets(&dir))
            .await
            .map_err(std::io::Error::other)
            .and_then(|found| found)
            .map_err(|source| PluginManagerError::Dir {
                action: "reading",
                path: self.dir.clone(),
                source,
            })?;
        let gone: Vec<PathBuf> = self
            .registered
            .iter()
            .filter(|(socket, plugin)| found.get(*socket) != Some(&plugin.stamp))
            .map(|(socket, _)| socket.clone())
            .collect();
        for socket in gone {
            if let Some(plugin) = self.registered.remove(&socket) {
                let span = tracing::info_span!("plugin_deregister", plugin = %plugin.name, socket = %socket.display());
                plugin
                    .handler
                    .deregister_plugin(&plugin.name)
                    .instrument(span)
                    .await;
                tracing::info!(plugin = %plugin.name, socket = %socket.display(), "plugin deregistered");
            }
        }
        self.failed
            .retain(|socket, stamp| found.get(socket) == Some(stamp));
        for (socket, stamp) in found {
            if self.registered.contains_key(&socket) {
                continue;
            }
            let span = tracing::info_span!("plugin_register", socket = %socket.display());
            match self.register(&socket, stamp).instrument(span).await {
                Ok(()) => {
                    self.failed.remove(&socket);
                }
                Err(e) if self.failed.insert(socket.clone(), stamp) != Some(stamp) => {
                    tracing::warn!(socket = %socket.display(), error = %e, "plugin registration failed; retrying");
                }
                Err(e) => {
                    tracing::debug!(socket = %socket.display(), error = %e, "plugin registration failed")
                }
            }
        }
        Ok(())
    }

    /// The kubelet's `RegisterPlugin` operation, with its messages.
    async fn register(&mut self, socket: &Path, stamp: Stamp) -> Result<(), String> {
        let shown = socket.display();
        let info = self.registration.get_info(socket).await.map_err(|e| {
            format!("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {shown}, err: {}", e.message())
        })?;
        let Some(handler) = self.handlers.get(&info.r#type).cloned() else {
            let message = format!(
                "RegisterPlugin error -- no handler registered for plugin type: {} at socket {shown}",
                info.r#type
            );
            self.notify(socket, Some(message.clone())).await?;
            return Err(message);
        };
        let endpoint = if info.endpoint.is_empty() {
            socket.to_string_lossy().into_owned()
        } else {
            info.endpoint.clone()
        };
        let versions = &info.supported_versions;
        if let Err(e) = handler.validate_plugin(&info.name, &endpoint, versions) {
            let message = format!("RegisterPlugin error -- plugin validation failed with err: {e}");
            self.notify(socket, Some(message)).await?;
            return Err("RegisterPlugin error -- pluginHandler.ValidatePluginFunc failed".into());
        }
        // Known before the handler runs, so that the socket's removal during the
        // registration deregisters it.
        self.registered.insert(
            socket.to_path_buf(),
            Registered {
                stamp,
                name: info.name.clone(),
                handler: Arc::clone(&handler),
            },
        );
        if let Err(e) = handler
            .register_plugin(&info.name, &endpoint, versions)
            .await
        {
            let message =
                format!("RegisterPlugin error -- plugin registration failed with err: {e}");
            tracing::warn!(plugin = %info.name, error = %e, "plugin registration failed");
            return self.notify(socket, Some(message)).await;
        }
        self.notify(socket, None).await?;
        tracing::info!(plugin = %info.name, r#type = %info.r#type, %endpoint, "plugin registered");
        Ok(())
    }

    async fn notify(&self, socket: &Path, error: Option<String>) -> Result<(), String> {
        let status = RegistrationStatus {
            plugin_registered: error.is_none(),
            error: error.unwrap_or_default(),
        };
        self.registration.notify(socket, status).await.map_err(|e| {
            format!(
                "RegisterPlugin error -- failed to send registration status at socket {}, err: {}",
                socket.display(),
                e.message()
            )
        })
    }

    /// The names of the registered plugins, by socket.
    #[cfg(test)]
    fn registered(&self) -> BTreeMap<PathBuf, String> {
        self.registered
            .iter()
            .map(|(socket, plugin)| (socket.clone(), plugin.name.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests;
