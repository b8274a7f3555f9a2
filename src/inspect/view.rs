//! What `rkubelet inspect` reports: plain data, serialized as its `--output json`, shown
//! as tables and drawn as SVG.

use serde::{Deserialize, Serialize};

/// The node's pod network, as `rkubelet inspect node` reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// The node's name, when known (from the agent's CNI config or the host name).
    pub node_name: Option<String>,
    /// The node's pod CIDR, from the CNI config the agent rendered.
    pub pod_cidr: Option<String>,
    /// Who runs the CNI plugins: `agent` (the thin plugin is installed in the runtime's
    /// CNI config), `runtime` or `unknown`.
    pub network_owner: String,
    /// The pods' bridge.
    pub bridge: Option<BridgeView>,
    /// Each running pod sandbox that is not on the host network.
    pub pods: Vec<PodLink>,
    /// The host's main routing table, as `ip route` prints it.
    pub routes: Vec<String>,
    /// What could not be seen, and why.
    pub notes: Vec<String>,
}

/// The bridge the pods' veths are attached to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BridgeView {
    /// Its name (`cni0`).
    pub name: String,
    /// Its interface index.
    pub index: u32,
    /// Its MAC address.
    pub mac: Option<String>,
    /// Its MTU.
    pub mtu: u32,
    /// Its addresses with prefix length (`10.88.0.1/24`): the pods' gateway.
    pub addresses: Vec<String>,
    /// The names of the interfaces attached to it.
    pub ports: Vec<String>,
}

/// One pod's place on the node's network.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodLink {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The pause process's PID (in the host's PID namespace).
    pub pause_pid: Option<u32>,
    /// The path of the pod's network namespace.
    pub netns: Option<String>,
    /// The pod's IP on its `eth0`, with prefix length.
    pub ip: Option<String>,
    /// The host end of the pod's veth pair.
    pub host_veth: Option<String>,
    /// Its interface index on the host.
    pub host_veth_index: Option<u32>,
    /// The bridge it is attached to.
    pub bridge: Option<String>,
}
