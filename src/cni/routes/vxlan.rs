//! The `vxlan` backend (flannel's `backend/vxlan`): one VXLAN device per node, its MAC
//! (the VTEP's) published on the node's own Node object. For each other node whose VTEP is
//! known the agent keeps a permanent neighbour entry (their pod CIDR's network address is
//! their VTEP's MAC), an FDB entry (that MAC is behind their node IP) and an on-link route
//! of their pod CIDR through that address, so that the kernel encapsulates pod packets in
//! UDP to the right node without any learning or flooding.

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use super::program::{Cidr, Underlay, VxlanSpec};
use super::remote::RemoteNode;
use super::state::RemoteRoute;

/// The VXLAN device: `rkvx.<VNI>`, as flannel's `flannel.<VNI>`.
pub const DEVICE: &str = "rkvx.1";
/// The VXLAN network identifier (flannel's default).
pub const VNI: u32 = 1;
/// The UDP port (the Linux kernel's, which flannel uses on Linux).
pub const PORT: u16 = 8472;
/// The bytes the encapsulation takes from the underlay's MTU (IPv4, UDP, VXLAN and inner
/// Ethernet headers).
pub const OVERHEAD: u32 = 50;
/// The annotation on a Node carrying its VTEP's MAC.
pub const VTEP_MAC_ANNOTATION: &str = "rkubelet.io/vxlan-vtep-mac";

/// The MTU of the VXLAN device and of the pods behind it.
#[must_use]
pub fn mtu(underlay: &Underlay) -> u32 {
    underlay.mtu.saturating_sub(OVERHEAD)
}

/// The device this node needs: VNI 1 on port 8472 from the node IP over the underlay, its
/// address the network address of this node's pod CIDR.
pub(super) fn spec(node_ip: Ipv4Addr, underlay: &Underlay, pod_cidr: Cidr) -> VxlanSpec {
    VxlanSpec {
        name: DEVICE.to_owned(),
        vni: VNI,
        port: PORT,
        local: node_ip,
        underlay: underlay.name.clone(),
        mtu: mtu(underlay),
        address: pod_cidr.host(),
    }
}

/// The VTEP MAC a Node publishes, lower case, if it is a MAC.
pub(super) fn published_mac(node: &Node) -> Option<String> {
    let mac = node
        .metadata
        .annotations
        .as_ref()?
        .get(VTEP_MAC_ANNOTATION)?
        .to_ascii_lowercase();
    let parts: Vec<&str> = mac.split(':').collect();
    let valid = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()));
    valid.then_some(mac)
}

/// The merge patch that publishes `mac` on `node`, unless it is published already.
#[must_use]
pub fn annotation_patch(node: &Node, mac: &str) -> Option<Value> {
    (published_mac(node).as_deref() != Some(mac))
        .then(|| json!({"metadata": {"annotations": {VTEP_MAC_ANNOTATION: mac}}}))
}

/// The way to `node`'s pods through the VXLAN device, once its VTEP is known.
pub(super) fn remote_route(node: &RemoteNode) -> Option<RemoteRoute> {
    Some(RemoteRoute {
        node: node.name.clone(),
        node_ip: node.ip,
        pod_cidr: node.pod_cidr,
        via: node.pod_cidr.network().addr,
        device: DEVICE.to_owned(),
        mac: Some(node.vtep_mac.clone()?),
    })
}
