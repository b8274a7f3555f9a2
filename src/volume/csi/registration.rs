//! The CSI plugin's registration handler (`csi_plugin.go`'s `RegistrationHandler`): the
//! registered drivers by name with their endpoint and highest CSI version, `NodeGetInfo`
//! on registration and the node's CSINode and annotation updated through
//! [`NodeInfoUpdater`].

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use futures::future::BoxFuture;

use super::client::{Connector, NodeClient};
use super::nodeinfo::NodeInfoUpdater;
use crate::lock;
use crate::pluginmanager::{HandlerError, PluginHandler};

/// The kubelet's prefix of the CSI plugin's messages.
pub(super) fn log(message: &str) -> String {
    format!("kubernetes.io/csi: {message}")
}

/// A CSI version as the kubelet's `ParseGeneric` reads it: `[v]major.minor[.patch...]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version(Vec<u64>);

impl Version {
    fn parse_generic(text: &str) -> Result<Self, String> {
        let trimmed = text.trim();
        let trimmed = trimmed.strip_prefix('v').unwrap_or(trimmed);
        let numeric: String = trimmed
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let components = numeric
            .trim_end_matches('.')
            .split('.')
            .map(str::parse::<u64>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| format!("could not parse {text:?} as version"))?;
        if components.len() < 2 {
            return Err(format!("illegal version string {text:?}"));
        }
        Ok(Self(components))
    }

    fn major(&self) -> u64 {
        self.0[0]
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// The highest 1.x version of `versions` (the kubelet's `highestSupportedVersion`).
pub(crate) fn highest_supported_version(versions: &[String]) -> Result<Version, String> {
    if versions.is_empty() {
        return Err(log(
            "CSI driver reporting empty array for supported versions",
        ));
    }
    let mut highest: Option<Version> = None;
    let mut last_error = None;
    for text in versions.iter().rev() {
        match Version::parse_generic(text) {
            // Only 0.x and 1.x exist; 2.x need not be compatible.
            Ok(v) if v.major() > 1 => {}
            Ok(v) if highest.as_ref().is_none_or(|h| *h < v) => highest = Some(v),
            Ok(_) => {}
            Err(e) => last_error = Some(e),
        }
    }
    let Some(highest) = highest else {
        return Err(format!(
            "could not find a highest supported version from versions ({}) reported by this driver: {}",
            go_list(versions),
            last_error.unwrap_or_else(|| "<nil>".into())
        ));
    };
    if highest.major() != 1 {
        return Err(format!(
            "highest supported version reported by driver is {highest}, must be v1.x"
        ));
    }
    Ok(highest)
}

/// A list as Go's `%v` prints it: `[a b]`.
fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// A registered driver.
#[derive(Debug, Clone)]
pub(super) struct Driver {
    pub(super) endpoint: String,
    highest_version: Version,
}

/// The registered CSI drivers by name (the kubelet's `csiDrivers` store), shared by the
/// registration handler and the volume plugin.
#[derive(Debug, Clone, Default)]
pub struct Drivers(Arc<RwLock<BTreeMap<String, Driver>>>);

impl Drivers {
    pub(super) fn get(&self, name: &str) -> Option<Driver> {
        lock::read(&self.0).get(name).cloned()
    }

    fn set(&self, name: &str, driver: Driver) {
        lock::write(&self.0).insert(name.to_owned(), driver);
    }

    /// Registers `name` at `endpoint` as a v1.2.0 driver, as a registration would.
    #[cfg(test)]
    pub(super) fn insert_for_test(&self, name: &str, endpoint: &str) {
        self.set(
            name,
            Driver {
                endpoint: endpoint.to_owned(),
                highest_version: Version(vec![1, 2, 0]),
            },
        );
    }

    fn remove(&self, name: &str) {
        lock::write(&self.0).remove(name);
    }

    /// The names of the registered drivers.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        lock::read(&self.0).keys().cloned().collect()
    }
}

/// The `CSIPlugin` handler of the plugin manager.
pub struct RegistrationHandler {
    drivers: Drivers,
    connector: Arc<dyn Connector>,
    node_info: Arc<dyn NodeInfoUpdater>,
}

impl RegistrationHandler {
    /// A handler filling `drivers`, asking drivers through `connector` and recording them
    /// on the node through `node_info`.
    #[must_use]
    pub fn new(
        drivers: Drivers,
        connector: Arc<dyn Connector>,
        node_info: Arc<dyn NodeInfoUpdater>,
    ) -> Self {
        Self {
            drivers,
            connector,
            node_info,
        }
    }

    fn validate_versions(
        &self,
        caller: &str,
        name: &str,
        versions: &[String],
    ) -> Result<Version, String> {
        if versions.is_empty() {
            return Err(log(&format!(
                "{caller} for CSI driver {name:?} failed. Plugin returned an empty list for supported versions"
            )));
        }
        let highest = highest_supported_version(versions).map_err(|e| {
            log(&format!(
                "{caller} for CSI driver {name:?} failed. None of the versions specified {:?} are supported. err={e}",
                go_list(versions)
            ))
        })?;
        if let Some(existing) = self.drivers.get(name)
            && existing.highest_version >= highest
        {
            return Err(log(&format!(
                "{caller} for CSI driver {name:?} failed. Another driver with the same name is already registered with a higher supported version: {:?}",
                existing.highest_version.to_string()
            )));
        }
        Ok(highest)
    }

    async fn register(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        tracing::info!(
            driver = name,
            endpoint,
            "{}",
            log(&format!(
                "Register new plugin with name: {name} at endpoint: {endpoint}"
            ))
        );
        let highest_version = self.validate_versions("RegisterPlugin", name, versions)?;
        self.drivers.set(
            name,
            Driver {
                endpoint: endpoint.to_owned(),
                highest_version,
            },
        );
        let client: Arc<dyn NodeClient> = self.connector.connect(endpoint);
        let installed = async {
            let info = client
                .node_get_info()
                .await
                .map_err(|s| format!("rpc error: code = {:?} desc = {}", s.code(), s.message()))?;
            let topology = info
                .accessible_topology
                .map(|t| t.segments)
                .unwrap_or_default();
            self.node_info
                .install_driver(name, &info.node_id, info.max_volumes_per_node, topology)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        if let Err(e) = installed {
            self.drivers.remove(name);
            return Err(e.into());
        }
        Ok(())
    }
}

impl PluginHandler for RegistrationHandler {
    fn validate_plugin(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        tracing::info!(
            driver = name,
            endpoint,
            "{}",
            log(&format!(
                "Trying to validate a new CSI Driver with name: {name} endpoint: {endpoint} versions: {}",
                versions.join(",")
            ))
        );
        self.validate_versions("ValidatePlugin", name, versions)
            .map(drop)
            .map_err(|e| {
                format!("validation failed for CSI Driver {name} at endpoint {endpoint}: {e}")
                    .into()
            })
    }

    fn register_plugin<'a>(
        &'a self,
        name: &'a str,
        endpoint: &'a str,
        versions: &'a [String],
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(self.register(name, endpoint, versions))
    }

    fn deregister_plugin<'a>(&'a self, name: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            tracing::info!(
                driver = name,
                "{}",
                log(&format!(
                    "registrationHandler.DeRegisterPlugin request for plugin {name}"
                ))
            );
            self.drivers.remove(name);
            if let Err(e) = self.node_info.uninstall_driver(name).await {
                tracing::error!(driver = name, error = %e, "{}", log("registrationHandler.DeRegisterPlugin failed"));
            }
        })
    }
}

#[cfg(test)]
mod tests;
