//! What `rkubelet inspect` reports: plain data, serialized as its `--output json`, shown
//! as tables and drawn as SVG.

use serde::{Deserialize, Serialize};

pub use crate::procfs::NamespaceView;

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
    /// The routes to other nodes' pods the agent keeps (`--pod-network-routes`), when it
    /// keeps any.
    #[serde(default)]
    pub pod_network_routes: Option<RoutesView>,
    /// What could not be seen, and why.
    pub notes: Vec<String>,
}

/// The routes to other nodes' pods: what the agent last programmed, checked against the
/// live tables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutesView {
    /// What the agent wrote down.
    #[serde(flatten)]
    pub state: crate::cni::routes::RoutesState,
    /// Per other node, the entries (`route`, `neighbour`, `fdb`) missing from the live
    /// tables; none when they could not be read.
    pub missing: Option<Vec<Vec<String>>>,
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

/// One pod, as `rkubelet inspect pod` reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodView {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID, from the sandbox's labels.
    pub uid: Option<String>,
    /// The pod's newest sandbox.
    pub sandbox: SandboxView,
    /// Older sandboxes of the pod the runtime still has (`id state`).
    pub other_sandboxes: Vec<String>,
    /// The pod's network, when it has its own network namespace.
    pub network: Option<PodNetwork>,
    /// The sandbox's containers, newest attempt first per name.
    pub containers: Vec<ContainerView>,
    /// What could not be seen, and why.
    pub notes: Vec<String>,
}

/// The pod sandbox: the pause container holding the pod's namespaces.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxView {
    /// Its id.
    pub id: String,
    /// `SANDBOX_READY` or `SANDBOX_NOTREADY`.
    pub state: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// The runtime handler (`runc` when empty).
    pub runtime_handler: String,
    /// The pause process's PID on the host.
    pub pause_pid: Option<u32>,
    /// The pause container's image.
    pub pause_image: Option<String>,
    /// The path of the pod's network namespace (none on the host network).
    pub netns_path: Option<String>,
    /// The pause process's namespaces.
    pub namespaces: Vec<NamespaceView>,
}

/// The pod's network namespace, its veth pair and its IP.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodNetwork {
    /// The interfaces inside the pod's network namespace.
    pub interfaces: Vec<super::netlink::Link>,
    /// The routes inside it.
    pub routes: Vec<super::netlink::Route>,
    /// The host end of the pod's veth pair.
    pub host_veth: Option<HostVeth>,
    /// The host-local reservation of the pod's IP.
    pub reservation: Option<Reservation>,
    /// Where the CNI result was cached, and by whom (`agent` or `runtime`).
    pub cni_cache: Option<String>,
    /// The CNI result as the plugins returned it.
    pub cni_result: Option<serde_json::Value>,
    /// The port mappings given to the portmap plugin.
    pub port_mappings: Vec<serde_json::Value>,
    /// The NAT rules that carry them (`iptables-save -t nat` lines of the sandbox).
    pub port_rules: Vec<String>,
}

/// The host end of a pod's veth pair.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostVeth {
    /// Its name on the host.
    pub name: String,
    /// Its interface index on the host.
    pub index: u32,
    /// Its MAC address.
    pub mac: Option<String>,
    /// The bridge it is attached to.
    pub bridge: Option<String>,
    /// The bridge's addresses.
    pub bridge_addresses: Vec<String>,
}

/// A host-local IPAM reservation file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The file (`<dataDir>/<network>/<ip>`).
    pub path: String,
    /// Who holds it: the sandbox id and the interface, as the plugin wrote them.
    pub holder: String,
}

/// One container of the pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    /// Its name in the pod spec.
    pub name: String,
    /// Its id.
    pub id: String,
    /// Which attempt it is (the pod status's restartCount).
    pub attempt: u32,
    /// `CONTAINER_RUNNING`, `CONTAINER_EXITED`, ...
    pub state: String,
    /// Its process's PID on the host, while it runs.
    pub pid: Option<u32>,
    /// The image as the pod names it.
    pub image: String,
    /// The image's id (digest).
    pub image_id: String,
    /// Its log file.
    pub log_path: String,
    /// Its cgroup (from `/proc/<pid>/cgroup`, else the runtime spec's).
    pub cgroup: Option<String>,
    /// The namespaces it shares with the pause process.
    pub shared_namespaces: Vec<String>,
    /// The namespaces it has of its own.
    pub own_namespaces: Vec<String>,
    /// Its mounts.
    pub mounts: Vec<MountView>,
}

/// A mount of a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountView {
    /// On the host.
    pub source: String,
    /// In the container.
    pub destination: String,
    /// Whether it is read-only.
    pub read_only: bool,
}
