//! What the agent last programmed, written to `<root-dir>/pod-network-routes.json` for
//! `rkubelet inspect node`, which compares it with the live tables.

use std::net::Ipv4Addr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::program::{Cidr, FdbEntry, Neighbour, Programmed, Route};
use super::{Mode, RoutesError};

/// The way to one other node's pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteRoute {
    /// The node's name.
    pub node: String,
    /// Its InternalIP.
    pub node_ip: Ipv4Addr,
    /// Its pod CIDR.
    pub pod_cidr: Cidr,
    /// The next hop: its IP (host-gw) or its pod CIDR's network address (vxlan).
    pub via: Ipv4Addr,
    /// The outgoing interface.
    pub device: String,
    /// Its VTEP's MAC (vxlan).
    pub mac: Option<String>,
}

impl RemoteRoute {
    fn route(&self) -> Route {
        Route {
            dst: self.pod_cidr,
            via: self.via,
            dev: self.device.clone(),
            onlink: self.mac.is_some(),
        }
    }

    fn neighbour_and_fdb(&self) -> Option<(Neighbour, FdbEntry)> {
        let mac = self.mac.clone()?;
        Some((
            Neighbour {
                ip: self.via,
                mac: mac.clone(),
                dev: self.device.clone(),
            },
            FdbEntry {
                mac,
                dst: self.node_ip,
                dev: self.device.clone(),
            },
        ))
    }
}

/// The kernel entries that carry `remotes`.
#[must_use]
pub fn entries(remotes: &[RemoteRoute]) -> Programmed {
    let mut all = Programmed::default();
    for remote in remotes {
        all.routes.insert(remote.route());
        if let Some((neighbour, fdb)) = remote.neighbour_and_fdb() {
            all.neighbours.insert(neighbour);
            all.fdb.insert(fdb);
        }
    }
    all
}

/// What the agent programmed, as it writes it down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutesState {
    /// The mode.
    pub mode: Mode,
    /// The interface holding the node IP.
    pub underlay: String,
    /// The VXLAN device (vxlan).
    pub device: Option<String>,
    /// This node's VTEP MAC (vxlan).
    pub vtep_mac: Option<String>,
    /// The pods' MTU when the mode lowers it.
    pub pod_mtu: Option<u32>,
    /// The ways to the other nodes.
    pub remotes: Vec<RemoteRoute>,
}

impl RoutesState {
    /// Writes the state to `path` (through a temporary file, so a reader never sees half).
    ///
    /// # Errors
    /// [`RoutesError::File`].
    pub async fn write(&self, path: &Path) -> Result<(), RoutesError> {
        let text = serde_json::to_vec_pretty(self).unwrap_or_default();
        crate::atomic_file::write_async(path, text, 0o644)
            .await
            .map_err(|e| RoutesError::File {
                op: e.op,
                path: e.path,
                source: e.source,
            })
    }

    /// The state written at `path`; `None` when there is none.
    ///
    /// # Errors
    /// [`RoutesError::File`] when it cannot be read or parsed.
    pub async fn read(path: &Path) -> Result<Option<Self>, RoutesError> {
        let file = |source| RoutesError::File {
            op: "reading",
            path: path.to_owned(),
            source,
        };
        match tokio::fs::read(path).await {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| file(std::io::Error::other(e))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(file(e)),
        }
    }
}

/// For each remote of `state`, which of its entries (`route`, `neighbour`, `fdb`) the
/// live tables lack.
#[must_use]
pub fn live_check(state: &RoutesState, live: &Programmed) -> Vec<(RemoteRoute, Vec<&'static str>)> {
    state
        .remotes
        .iter()
        .map(|remote| {
            let mut missing = Vec::new();
            if !live.routes.contains(&remote.route()) {
                missing.push("route");
            }
            if let Some((neighbour, fdb)) = remote.neighbour_and_fdb() {
                if !live.neighbours.contains(&neighbour) {
                    missing.push("neighbour");
                }
                if !live.fdb.contains(&fdb) {
                    missing.push("fdb");
                }
            }
            (remote.clone(), missing)
        })
        .collect()
}
