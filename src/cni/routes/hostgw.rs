//! The `host-gw` backend (flannel's `backend/hostgw`): every other node is a gateway to its
//! own pod CIDR, reached directly on the shared link — `<pod CIDR> via <node IP> dev
//! <underlay>`. No encapsulation, so the pods keep the link's MTU; the nodes must be on one
//! layer-2 network.

use super::remote::RemoteNode;
use super::state::RemoteRoute;

/// The route to `node`'s pods through the interface `underlay`.
pub(super) fn remote_route(node: &RemoteNode, underlay: &str) -> RemoteRoute {
    RemoteRoute {
        node: node.name.clone(),
        node_ip: node.ip,
        pod_cidr: node.pod_cidr,
        via: node.ip,
        device: underlay.to_owned(),
        mac: None,
    }
}
