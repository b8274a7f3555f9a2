//! Another node as the routes see it ([`RemoteNode`]): the vocabulary the backends
//! (`hostgw`, `vxlan`) and the programmer share; it knows no backend.

use std::net::Ipv4Addr;

use super::program::Cidr;

/// Another node, as far as the routes care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteNode {
    /// Its name.
    pub name: String,
    /// Its pod CIDR (IPv4, host bits cleared).
    pub pod_cidr: Cidr,
    /// Its InternalIP (IPv4).
    pub ip: Ipv4Addr,
    /// Its published VTEP MAC.
    pub vtep_mac: Option<String>,
}
