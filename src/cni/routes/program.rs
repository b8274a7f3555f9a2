//! What the agent programs into the kernel (routes, neighbours, FDB entries, the VXLAN
//! device), the OS boundary that reads and changes it ([`RouteOps`]), and [`plan`]: the
//! changes that take what is programmed to what is wanted, touching nothing that is
//! already right.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::RoutesError;

/// An IPv4 prefix, `10.244.1.0/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr {
    /// The address.
    pub addr: Ipv4Addr,
    /// The prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// The prefix with its host bits cleared (`10.244.1.0/24` for `10.244.1.7/24`).
    #[must_use]
    pub fn network(self) -> Self {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0);
        Self {
            addr: Ipv4Addr::from(u32::from(self.addr) & mask),
            prefix: self.prefix,
        }
    }

    /// Whether the two prefixes share an address (one holds the other).
    #[must_use]
    pub fn overlaps(self, other: Self) -> bool {
        let shorter = Self {
            prefix: self.prefix.min(other.prefix),
            ..self
        };
        shorter.network()
            == Self {
                prefix: shorter.prefix,
                ..other
            }
            .network()
    }

    /// Whether the prefix holds `ip`.
    #[must_use]
    pub fn contains(self, ip: Ipv4Addr) -> bool {
        self.overlaps(Self {
            addr: ip,
            prefix: 32,
        })
    }

    /// The prefix's network address as a host address (`10.244.1.0/32`).
    #[must_use]
    pub fn host(self) -> Self {
        Self {
            addr: self.network().addr,
            prefix: 32,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;
    /// `a.b.c.d/n`, or `a.b.c.d` for `/32` (as `ip route` prints host routes).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not an IPv4 address/prefix");
        let (addr, prefix) = s.split_once('/').unwrap_or((s, "32"));
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        if prefix > 32 {
            return Err(bad());
        }
        Ok(Self {
            addr: addr.parse().map_err(|_| bad())?,
            prefix,
        })
    }
}

impl TryFrom<String> for Cidr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> Self {
        c.to_string()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A route of the agent's: `<dst> via <via> dev <dev> [onlink] proto 211`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Route {
    /// The destination: another node's pod CIDR.
    pub dst: Cidr,
    /// The next hop.
    pub via: Ipv4Addr,
    /// The outgoing interface.
    pub dev: String,
    /// The next hop is on the link even though no address of the link covers it.
    pub onlink: bool,
}

/// A permanent neighbour (ARP) entry: `<ip> lladdr <mac> dev <dev> nud permanent`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Neighbour {
    /// The IP.
    pub ip: Ipv4Addr,
    /// Its MAC, lower case.
    pub mac: String,
    /// The interface.
    pub dev: String,
}

/// A forwarding database entry of a VXLAN device: `<mac> dst <dst> dev <dev> self permanent`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FdbEntry {
    /// The remote VTEP's MAC, lower case.
    pub mac: String,
    /// The remote VTEP's IP.
    pub dst: Ipv4Addr,
    /// The VXLAN device.
    pub dev: String,
}

/// The agent's entries in the kernel's tables: routes carrying its protocol, and the
/// neighbours and FDB entries of its VXLAN device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Programmed {
    /// Routes.
    pub routes: BTreeSet<Route>,
    /// Neighbours.
    pub neighbours: BTreeSet<Neighbour>,
    /// FDB entries.
    pub fdb: BTreeSet<FdbEntry>,
}

/// The interface holding the node IP, which carries traffic to the other nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Underlay {
    /// Its name.
    pub name: String,
    /// Its MTU.
    pub mtu: u32,
    /// The networks of its IPv4 addresses (`198.18.0.0/24` for `198.18.0.1/24`): the
    /// nodes' own network, which no pod CIDR may take.
    pub subnets: Vec<Cidr>,
}

/// A link as it is now (read back to decide whether the VXLAN device can be kept).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkState {
    /// The link kind (`vxlan`), none for a physical device.
    pub kind: Option<String>,
    /// The VXLAN network identifier.
    pub vni: Option<u32>,
    /// The local VTEP address.
    pub local: Option<Ipv4Addr>,
    /// The UDP port.
    pub port: Option<u16>,
    /// The underlay interface.
    pub underlay: Option<String>,
    /// Whether it learns remote MACs from traffic.
    pub learning: bool,
    /// Its MTU.
    pub mtu: u32,
    /// Its MAC.
    pub mac: String,
    /// Administratively up.
    pub up: bool,
    /// Its IPv4 addresses.
    pub addresses: Vec<Cidr>,
}

/// The VXLAN device wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanSpec {
    /// Its name.
    pub name: String,
    /// The VNI.
    pub vni: u32,
    /// The UDP port.
    pub port: u16,
    /// The local VTEP address: the node IP.
    pub local: Ipv4Addr,
    /// The underlay interface.
    pub underlay: String,
    /// Its MTU.
    pub mtu: u32,
    /// Its one address: this node's pod CIDR's network address, `/32`.
    pub address: Cidr,
}

/// One change to the kernel's tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `ip route add` (fails when anybody's route has the destination).
    AddRoute(Route),
    /// `ip route replace`, for a route of the agent's with the same destination.
    ReplaceRoute(Route),
    /// `ip route del ... proto 211`.
    DeleteRoute(Route),
    /// `ip neigh replace ... nud permanent`.
    SetNeighbour(Neighbour),
    /// `ip neigh del`.
    DeleteNeighbour(Neighbour),
    /// `bridge fdb replace ... self permanent`.
    SetFdb(FdbEntry),
    /// `bridge fdb del ... self`.
    DeleteFdb(FdbEntry),
    /// `ip link add ... type vxlan`.
    CreateVxlan(VxlanSpec),
    /// `ip link del`.
    DeleteLink(String),
    /// `ip link set mtu`.
    SetMtu {
        /// The link.
        dev: String,
        /// The MTU.
        mtu: u32,
    },
    /// `ip addr add`.
    AddAddress {
        /// The link.
        dev: String,
        /// The address.
        address: Cidr,
    },
    /// `ip addr del`.
    DeleteAddress {
        /// The link.
        dev: String,
        /// The address.
        address: Cidr,
    },
    /// `ip link set up`.
    SetUp(String),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let route = |f: &mut fmt::Formatter<'_>, what: &str, r: &Route| {
            let onlink = if r.onlink { " onlink" } else { "" };
            write!(f, "{what} {} via {} dev {}{onlink}", r.dst, r.via, r.dev)
        };
        match self {
            Self::AddRoute(r) => route(f, "add route", r),
            Self::ReplaceRoute(r) => route(f, "replace route", r),
            Self::DeleteRoute(r) => route(f, "delete route", r),
            Self::SetNeighbour(n) => {
                write!(f, "set neighbour {} lladdr {} dev {}", n.ip, n.mac, n.dev)
            }
            Self::DeleteNeighbour(n) => write!(f, "delete neighbour {} dev {}", n.ip, n.dev),
            Self::SetFdb(e) => write!(f, "set fdb {} dst {} dev {}", e.mac, e.dst, e.dev),
            Self::DeleteFdb(e) => write!(f, "delete fdb {} dst {} dev {}", e.mac, e.dst, e.dev),
            Self::CreateVxlan(s) => write!(
                f,
                "create vxlan {} id {} local {} dev {} dstport {}",
                s.name, s.vni, s.local, s.underlay, s.port
            ),
            Self::DeleteLink(name) => write!(f, "delete link {name}"),
            Self::SetMtu { dev, mtu } => write!(f, "set {dev} mtu {mtu}"),
            Self::AddAddress { dev, address } => write!(f, "add address {address} dev {dev}"),
            Self::DeleteAddress { dev, address } => write!(f, "delete address {address} dev {dev}"),
            Self::SetUp(dev) => write!(f, "set {dev} up"),
        }
    }
}

/// What the agent reads of, and does to, the kernel's network tables.
pub trait RouteOps: Send + Sync {
    /// The interface that holds `ip`.
    fn underlay(&self, ip: Ipv4Addr) -> impl Future<Output = Result<Underlay, RoutesError>> + Send;
    /// The link named `name`, if there is one.
    fn link(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<LinkState>, RoutesError>> + Send;
    /// The agent's routes (those with [`super::ROUTE_PROTOCOL`]) and, with `device`, the
    /// permanent neighbours and the FDB entries of that device.
    fn programmed(
        &self,
        device: Option<&str>,
    ) -> impl Future<Output = Result<Programmed, RoutesError>> + Send;
    /// Makes one change.
    fn apply(&self, change: &Change) -> impl Future<Output = Result<(), RoutesError>> + Send;
}

/// The changes that turn `current` into `desired`, in an order that never leaves a route
/// pointing at a missing neighbour: stale routes, neighbours and FDB entries go first,
/// then the FDB entries, the neighbours and the routes that are missing or differ are
/// set. An entry that is already right is not touched; a route whose destination the
/// agent already routes elsewhere is replaced in place, not deleted and added.
#[must_use]
pub fn plan(current: &Programmed, desired: &Programmed) -> Vec<Change> {
    let mut changes = Vec::new();
    let wanted_dst: BTreeSet<Cidr> = desired.routes.iter().map(|r| r.dst).collect();
    let current_dst: BTreeSet<Cidr> = current.routes.iter().map(|r| r.dst).collect();
    let wanted_neighbour: BTreeSet<(&str, Ipv4Addr)> = desired
        .neighbours
        .iter()
        .map(|n| (n.dev.as_str(), n.ip))
        .collect();
    changes.extend(
        current
            .routes
            .difference(&desired.routes)
            .filter(|r| !wanted_dst.contains(&r.dst))
            .cloned()
            .map(Change::DeleteRoute),
    );
    changes.extend(
        current
            .neighbours
            .difference(&desired.neighbours)
            .filter(|n| !wanted_neighbour.contains(&(n.dev.as_str(), n.ip)))
            .cloned()
            .map(Change::DeleteNeighbour),
    );
    changes.extend(
        current
            .fdb
            .difference(&desired.fdb)
            .cloned()
            .map(Change::DeleteFdb),
    );
    changes.extend(
        desired
            .fdb
            .difference(&current.fdb)
            .cloned()
            .map(Change::SetFdb),
    );
    changes.extend(
        desired
            .neighbours
            .difference(&current.neighbours)
            .cloned()
            .map(Change::SetNeighbour),
    );
    changes.extend(desired.routes.difference(&current.routes).map(|r| {
        if current_dst.contains(&r.dst) {
            Change::ReplaceRoute(r.clone())
        } else {
            Change::AddRoute(r.clone())
        }
    }));
    changes
}

/// The changes that make the link `existing` (if any) the VXLAN device `spec` describes.
/// A device that differs in what cannot be changed in place (VNI, local address, port,
/// underlay, learning, kind) is deleted and created again, as flannel does; one that
/// matches is kept with its MAC.
#[must_use]
pub fn device_plan(existing: Option<&LinkState>, spec: &VxlanSpec) -> Vec<Change> {
    let fresh = || {
        vec![
            Change::CreateVxlan(spec.clone()),
            Change::SetMtu {
                dev: spec.name.clone(),
                mtu: spec.mtu,
            },
            Change::AddAddress {
                dev: spec.name.clone(),
                address: spec.address,
            },
            Change::SetUp(spec.name.clone()),
        ]
    };
    let Some(link) = existing else {
        return fresh();
    };
    if let Some(why) = incompatible(link, spec) {
        tracing::warn!(device = %spec.name, why, "the VXLAN device differs from what is wanted; creating it again");
        let mut changes = vec![Change::DeleteLink(spec.name.clone())];
        changes.extend(fresh());
        return changes;
    }
    let mut changes = Vec::new();
    if link.mtu != spec.mtu {
        changes.push(Change::SetMtu {
            dev: spec.name.clone(),
            mtu: spec.mtu,
        });
    }
    changes.extend(
        link.addresses
            .iter()
            .filter(|a| **a != spec.address)
            .map(|a| Change::DeleteAddress {
                dev: spec.name.clone(),
                address: *a,
            }),
    );
    if !link.addresses.contains(&spec.address) {
        changes.push(Change::AddAddress {
            dev: spec.name.clone(),
            address: spec.address,
        });
    }
    if !link.up {
        changes.push(Change::SetUp(spec.name.clone()));
    }
    changes
}

fn incompatible(link: &LinkState, spec: &VxlanSpec) -> Option<String> {
    if link.kind.as_deref() != Some("vxlan") {
        return Some(format!("kind {:?}", link.kind));
    }
    if link.vni != Some(spec.vni) {
        return Some(format!("vni {:?}", link.vni));
    }
    if link.local.is_some_and(|l| l != spec.local) {
        return Some(format!("local {:?}", link.local));
    }
    if link.port.is_some_and(|p| p != spec.port) {
        return Some(format!("port {:?}", link.port));
    }
    if link.underlay.as_ref().is_some_and(|u| *u != spec.underlay) {
        return Some(format!("dev {:?}", link.underlay));
    }
    if link.learning {
        return Some("learning on".into());
    }
    None
}
