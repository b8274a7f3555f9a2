//! Routes between nodes: how a pod reaches a pod on another node. The agent owns them, as
//! flannel's backends do for flannel: a watch on every Node gives each other node's pod
//! CIDR and InternalIP, and the agent keeps the kernel's tables in step with them.
//!
//! - [`Mode::HostGw`] (flannel's `host-gw`): a route `<their pod CIDR> via <their IP>` on
//!   the interface holding this node's IP; the nodes must share a layer-2 network.
//! - [`Mode::Vxlan`] (flannel's `vxlan`): one VXLAN device ([`vxlan::DEVICE`], VNI 1, UDP
//!   port 8472) whose MAC this node publishes in the [`vxlan::VTEP_MAC_ANNOTATION`] of its
//!   Node; per other node a permanent neighbour, an FDB entry and an on-link route through
//!   the device. The pods' MTU is lowered by the 50 bytes of encapsulation.
//!
//! Every route the agent adds carries the route protocol [`ROUTE_PROTOCOL`], so that a
//! restarted agent finds its own routes, changes only those that differ, and never touches
//! a route somebody else added. A periodic resync repairs drift. [`sysctl`] turns on the
//! forwarding the kubelet's network plugins need. What was programmed is written to
//! [`STATE_FILE`] for `rkubelet inspect node`.
//!
//! The OS boundary is [`RouteOps`]: [`IpRoute2`] runs iproute2 (`ip`, `bridge`), the unit
//! tests use an in-memory fake.

mod hostgw;
mod iproute2;
mod program;
mod programmer;
mod remote;
mod state;
pub mod sysctl;
pub mod vxlan;

use std::net::Ipv4Addr;
use std::path::PathBuf;

pub use iproute2::{IpRoute2, run as run_tool};
pub use program::{
    Change, Cidr, FdbEntry, LinkState, Neighbour, Programmed, Route, RouteOps, Underlay, VxlanSpec,
    plan,
};
pub use programmer::{
    POD_CIDR_REFUSED, Programmer, Refused, Settings, SyncReport, Wanted, api_server_addresses,
    remote_nodes, run,
};
pub use remote::RemoteNode;
pub use state::{RemoteRoute, RoutesState, live_check};

/// The route protocol number marking the agent's routes (`ip route ... proto 211`).
pub const ROUTE_PROTOCOL: u8 = 211;

/// Where, under the agent's root dir, the programmed state is written.
pub const STATE_FILE: &str = "pod-network-routes.json";

/// How pod traffic reaches other nodes (`--pod-network-routes`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The agent programs no routes between nodes (another component, or a single node).
    None,
    /// A route to each other node's pod CIDR through its InternalIP (nodes on one link).
    HostGw,
    /// A VXLAN overlay (device rkvx.1, VNI 1, UDP 8472); pods get the MTU less 50.
    Vxlan,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::HostGw => "host-gw",
            Self::Vxlan => "vxlan",
        })
    }
}

/// A failure to read or program the routes.
#[derive(Debug, thiserror::Error)]
pub enum RoutesError {
    /// A tool could not be started.
    #[error("running {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// A tool failed.
    #[error("{command}: {message}")]
    Failed {
        /// The command line.
        command: String,
        /// Its standard error.
        message: String,
    },
    /// A tool's output was not what iproute2 prints.
    #[error("{command}: unreadable output: {reason}")]
    Output {
        /// The command line.
        command: String,
        /// What was wrong.
        reason: String,
    },
    /// No interface carries the node IP.
    #[error("no interface holds the node IP {ip}: the routes have no underlay")]
    NoUnderlay {
        /// The node IP.
        ip: Ipv4Addr,
    },
    /// Pod network routes are IPv4 only.
    #[error("pod network routes need an IPv4 {what}, not {value:?}")]
    NotIpv4 {
        /// What it is (`node IP`, `pod CIDR`).
        what: &'static str,
        /// The value given.
        value: String,
    },
    /// The VXLAN device could not be set up.
    #[error("VXLAN device {device}: {reason}")]
    Device {
        /// The device.
        device: String,
        /// What is wrong.
        reason: String,
    },
    /// The VTEP MAC could not be published on the Node.
    #[error("publishing the VTEP MAC on node {node}: {source}")]
    Annotate {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// A file (state file, sysctl) could not be read or written.
    #[error("{op} {}: {source}", path.display())]
    File {
        /// What was done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
}
